"""deqlab._draws.normal and randint give exactly jax.random.normal's and randint's numbers (drawn flat and
reshaped, which XLA:CPU compiles several times faster at rank >= 3, about twice as fast at rank 2), in both
of JAX's threefry modes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqlab import _draws as draws

SHAPE = (2, 3, 5, 4)  # rank 4, where the shaped draw compiles slowly; odd sizes catch a wrong reshape order


@pytest.mark.parametrize("partitionable", [True, False])
def test_flat_draws_equal_jax_random_bit_for_bit(partitionable):
    # the library swaps these in for jax.random's where a draw is a program's result (deqlab._draws' docstring
    # lists where): any difference would change a seeded result
    previous = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", partitionable)
    try:
        # also vmapped over a batch of keys, as deqlab.ensembles draws one matrix per seed; and integers as
        # data.copy_memory draws its symbols, over 10 values (not a power of two, so not a mere bit mask)
        ours, theirs, ours_batched, theirs_batched, ours_int, theirs_int = jax.jit(lambda key, keys: (
            draws.normal(key, SHAPE, jnp.float32), jax.random.normal(key, SHAPE, jnp.float32),
            jax.vmap(lambda k: draws.normal(k, SHAPE[2:], jnp.float32))(keys),
            jax.vmap(lambda k: jax.random.normal(k, SHAPE[2:], jnp.float32))(keys),
            draws.randint(key, SHAPE, 1, 11, jnp.int32), jax.random.randint(key, SHAPE, 1, 11, jnp.int32)))(
            jax.random.key(11), jax.random.split(jax.random.key(12), 3))
    finally:
        jax.config.update("jax_threefry_partitionable", previous)
    assert ours.shape == theirs.shape == SHAPE and ours.dtype == theirs.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    assert np.unique(np.asarray(ours)).size == ours.size  # not a constant or repeated draw
    assert ours_batched.shape == (3, *SHAPE[2:])
    np.testing.assert_array_equal(np.asarray(ours_batched), np.asarray(theirs_batched))
    assert np.unique(np.asarray(ours_batched)).size == ours_batched.size  # one draw per key
    assert ours_int.shape == SHAPE and ours_int.dtype == theirs_int.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(ours_int), np.asarray(theirs_int))
    assert set(np.unique(np.asarray(ours_int))) == set(range(1, 11))  # 120 draws cover the whole range
