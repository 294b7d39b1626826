"""deqlab._draws gives exactly jax.random's numbers (drawn flat and reshaped, which XLA:CPU compiles
several times faster at rank >= 3), in both of JAX's threefry modes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqlab import _draws as draws

SHAPE = (2, 3, 5, 4)  # rank 4, where the shaped draw compiles slowly; odd sizes catch a wrong reshape order


def _both_ways(key):
    """Every sampler of deqlab._draws and jax.random's own draw of the same shape: one program."""
    k1, k2, k3 = jax.random.split(key, 3)
    return ((draws.normal(k1, SHAPE, jnp.float32), jax.random.normal(k1, SHAPE, jnp.float32)),
            (draws.rademacher(k2, SHAPE, jnp.float32), jax.random.rademacher(k2, SHAPE, jnp.float32)),
            (draws.bernoulli(k3, 0.3, SHAPE), jax.random.bernoulli(k3, 0.3, SHAPE)))


@pytest.mark.parametrize("partitionable", [True, False])
def test_flat_draws_equal_jax_random_bit_for_bit(partitionable):
    # the library swaps these in for jax.random where a draw is a program's result (the denoising page's noise
    # and filters, check_gradients' directions, the convolutional power iteration's start): any difference
    # would change a seeded result
    previous = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", partitionable)
    try:
        pairs = jax.jit(_both_ways)(jax.random.key(11))  # one compiled program per mode
    finally:
        jax.config.update("jax_threefry_partitionable", previous)
    for ours, theirs in pairs:
        assert ours.shape == theirs.shape == SHAPE and ours.dtype == theirs.dtype
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    normal, signs, kept = (np.asarray(ours) for ours, _ in pairs)
    assert np.unique(normal).size == normal.size  # not a constant or repeated draw
    assert set(np.unique(signs)) == {-1.0, 1.0} and 0 < kept.sum() < kept.size


def test_bernoulli_refuses_an_array_of_probabilities():
    with pytest.raises(ValueError, match=r"`p` must be a scalar probability"):
        draws.bernoulli(jax.random.key(0), jnp.full((2,), 0.5), (2,))
