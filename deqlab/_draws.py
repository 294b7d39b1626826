"""JAX's normal and integer draws, the same numbers compiled faster: each array is drawn flat and reshaped.

XLA's CPU backend compiles the threefry generator behind ``jax.random`` far more slowly for arrays
of rank 3 and more than for a flat array of the same size. Measured (jax 0.10.2, the 2-core
machine, cold): ``jax.random.normal`` of shape ``(64, 3, 16, 16)`` compiled in 2.2 s, of shape
``(4, 3, 3, 7, 7)`` in 3.2 s, and flat in 0.3 s; inside a jitted program a draw of shape
``(10, 8, 16, 16)`` added 2.2 s against 0.3 s, one of ``(32, 30, 36)`` 0.75 s against 0.33 s.

The numbers are exactly JAX's: the counter threefry hashes for an element is its row-major index
into the array, so a flat draw reshaped equals the shaped draw bit for bit, with
``jax_threefry_partitionable`` on (JAX's default since 0.5) or off (``tests/library/test_draws.py``).
A key gives the same array through :func:`normal` as through ``jax.random.normal``. What is computed from
it inside a larger jitted program need not be: XLA fuses a reshaped draw with its consumers
differently, which can change the rounding downstream (Hutchinson probes drawn this way inside
chapter 3 page 6's training programs moved its radii in the eighth digit), so the library uses it
only where that was checked to change nothing: the denoising page's noise (also inside its
training program, where it is only added and clipped) and random filters, the start of the
convolutional power iteration, the directions of :func:`deqlab.backward.check_gradients`, the
Gaussian draws of :mod:`deqlab.ensembles` (one matrix per seed under ``jax.vmap`` is a draw of rank
3: 0.65 s against 0.34 s for ten (64, 64) matrices) and the embedding of
:class:`deqlab.nn.LanguageModel` (:func:`normal_initializer`); every page that reaches them kept
all its glued values (the whole book run before and after, side by side). Integer draws
(:func:`randint`: the copy-memory task's symbols, :func:`deqlab.lab.data.copy_memory`) are exact
whatever XLA fuses them with; a rank-2 draw compiled in 0.45-0.79 s shaped and 0.21-0.33 s flat
(jax 0.10.2, 2-core machine, cold, shapes (4, 10) to (128, 10)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

__all__ = ["normal", "normal_initializer", "randint"]  # private: the library's own draws (deqlab._draws)


def normal(key: jax.Array, shape: Sequence[int], dtype=jnp.float32) -> jax.Array:
    """``jax.random.normal(key, shape, dtype)``, drawn flat and reshaped (module docstring).

    Args:
        key: a JAX PRNG key.
        shape: the array's shape (a sequence of non-negative ints).
        dtype: a float dtype.

    Returns:
        Standard normal draws of ``shape`` and ``dtype``, bit for bit ``jax.random.normal``'s.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from deqlab import _draws as draws
        >>> key = jax.random.key(0)
        >>> bool(jnp.array_equal(draws.normal(key, (2, 3, 4)), jax.random.normal(key, (2, 3, 4))))
        True
    """
    shape = tuple(int(n) for n in shape)
    return jax.random.normal(key, (math.prod(shape),), dtype).reshape(shape)


def normal_initializer(stddev: float):
    """``jax.nn.initializers.normal(stddev)``, its draw made by :func:`normal` (the same numbers).

    Args:
        stddev: the standard deviation (a positive float).

    Returns:
        An initializer ``init(key, shape, dtype=jnp.float32)``, as flax's layers call one: the draw of
        ``jax.nn.initializers.normal(stddev)`` bit for bit.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from deqlab import _draws as draws
        >>> key = jax.random.key(0)
        >>> mine, jaxs = draws.normal_initializer(0.5), jax.nn.initializers.normal(0.5)
        >>> bool(jnp.array_equal(mine(key, (3, 4, 5)), jaxs(key, (3, 4, 5), jnp.float32)))
        True
    """

    def init(key: jax.Array, shape: Sequence[int], dtype=jnp.float32) -> jax.Array:
        return normal(key, shape, dtype) * jnp.array(stddev, dtype)

    return init


def randint(key: jax.Array, shape: Sequence[int], minval, maxval, dtype=jnp.int32) -> jax.Array:
    """``jax.random.randint(key, shape, minval, maxval, dtype)``, drawn flat and reshaped (module docstring).

    Args:
        key: a JAX PRNG key.
        shape: the array's shape (a sequence of non-negative ints).
        minval, maxval: the range, ``minval`` included and ``maxval`` excluded (as ``jax.random.randint``).
        dtype: an integer dtype.

    Returns:
        Integers of ``shape`` and ``dtype`` in ``[minval, maxval)``, bit for bit ``jax.random.randint``'s.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from deqlab import _draws as draws
        >>> key = jax.random.key(0)
        >>> bool(jnp.array_equal(draws.randint(key, (3, 4), 1, 9), jax.random.randint(key, (3, 4), 1, 9)))
        True
    """
    shape = tuple(int(n) for n in shape)
    return jax.random.randint(key, (math.prod(shape),), minval, maxval, dtype).reshape(shape)
