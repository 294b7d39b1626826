"""deqlab._draws.normal gives exactly jax.random.normal's numbers (drawn flat and reshaped, which XLA:CPU
compiles several times faster at rank >= 3), in both of JAX's threefry modes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqlab import _draws as draws

SHAPE = (2, 3, 5, 4)  # rank 4, where the shaped draw compiles slowly; odd sizes catch a wrong reshape order


@pytest.mark.parametrize("partitionable", [True, False])
def test_flat_normal_draws_equal_jax_random_bit_for_bit(partitionable):
    # the library swaps it in for jax.random.normal where a draw is a program's result (the denoising page's
    # noise and filters, check_gradients' directions, the convolutional power iteration's start): any
    # difference would change a seeded result
    previous = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", partitionable)
    try:
        ours, theirs = jax.jit(lambda key: (draws.normal(key, SHAPE, jnp.float32),
                                            jax.random.normal(key, SHAPE, jnp.float32)))(jax.random.key(11))
    finally:
        jax.config.update("jax_threefry_partitionable", previous)
    assert ours.shape == theirs.shape == SHAPE and ours.dtype == theirs.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    assert np.unique(np.asarray(ours)).size == ours.size  # not a constant or repeated draw
