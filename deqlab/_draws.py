"""JAX's random draws, the same numbers compiled faster: each array is drawn flat and reshaped.

XLA's CPU backend compiles the threefry generator behind ``jax.random`` far more slowly for arrays
of rank 3 and more than for a flat array of the same size. Measured (jax 0.10.2, the 2-core
machine, cold): ``jax.random.normal`` of shape ``(64, 3, 16, 16)`` compiled in 2.2 s, of shape
``(4, 3, 3, 7, 7)`` in 3.2 s, and flat in 0.3 s; inside a jitted program a draw of shape
``(10, 8, 16, 16)`` added 2.2 s against 0.3 s, one of ``(32, 30, 36)`` 0.75 s against 0.33 s.

The numbers are exactly JAX's: the counter threefry hashes for an element is its row-major index
into the array, so a flat draw reshaped equals the shaped draw bit for bit, with
``jax_threefry_partitionable`` on (JAX's default since 0.5) or off (``tests/library/test_draws.py``).
A key gives the same array through these functions as through ``jax.random``. What is computed from
it inside a larger jitted program need not be: XLA fuses a reshaped draw with its consumers
differently, which can change the rounding downstream (Hutchinson probes drawn this way inside
chapter 3 page 6's training programs moved its radii in the eighth digit). The library therefore
uses these functions where the draw is a program's result, consumed outside it: the denoising
page's noise and random filters, the start of the convolutional power iteration, the directions
of :func:`deqlab.backward.check_gradients`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

__all__ = ["bernoulli", "normal", "rademacher"]  # private: the library's own draws (deqlab._draws)


def _flat(shape: Sequence[int]) -> tuple[tuple[int, ...], tuple[int]]:
    shape = tuple(int(n) for n in shape)
    return shape, (math.prod(shape),)


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
    shape, flat = _flat(shape)
    return jax.random.normal(key, flat, dtype).reshape(shape)


def rademacher(key: jax.Array, shape: Sequence[int], dtype=jnp.float32) -> jax.Array:
    """``jax.random.rademacher(key, shape, dtype)`` (entries -1 or +1), drawn flat and reshaped.

    Args:
        key: a JAX PRNG key.
        shape: the array's shape.
        dtype: the entries' dtype.

    Returns:
        An array of ``shape`` and ``dtype``, bit for bit ``jax.random.rademacher``'s.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from deqlab import _draws as draws
        >>> key = jax.random.key(1)
        >>> bool(jnp.array_equal(draws.rademacher(key, (2, 3, 4)), jax.random.rademacher(key, (2, 3, 4))))
        True
    """
    shape, flat = _flat(shape)
    return jax.random.rademacher(key, flat, dtype).reshape(shape)


def bernoulli(key: jax.Array, p, shape: Sequence[int]) -> jax.Array:
    """``jax.random.bernoulli(key, p, shape)`` for a scalar probability ``p``, drawn flat and reshaped.

    Args:
        key: a JAX PRNG key.
        p: the probability of True, a scalar (a Python float or a traced scalar).
        shape: the array's shape.

    Returns:
        A boolean array of ``shape``, bit for bit ``jax.random.bernoulli``'s.

    Raises:
        ValueError: ``p`` is not a scalar (broadcasting an array of probabilities needs the shaped draw).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from deqlab import _draws as draws
        >>> key = jax.random.key(2)
        >>> bool(jnp.array_equal(draws.bernoulli(key, 0.3, (2, 3, 4)), jax.random.bernoulli(key, 0.3, (2, 3, 4))))
        True
    """
    if jnp.ndim(p) != 0:
        raise ValueError(f"draws.bernoulli: `p` must be a scalar probability in [0, 1], got an array of shape "
                         f"{jnp.shape(p)}.")
    shape, flat = _flat(shape)
    return jax.random.bernoulli(key, p, flat).reshape(shape)
