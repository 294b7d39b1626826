"""Per-sample warm starts: :class:`FixedPointCache`, the last equilibrium of every sample of a data set.

A DEQ's forward solve starts from ``z0`` (zeros by default). When the same sample comes back (the
next epoch of training, repeated inference), its previous equilibrium is a far better start: the
parameters have moved a little, so the new fixed point is near the old one, and the solver needs
fewer steps to reach the tolerance. The implicit gradient does not depend on the start (003
Theorem 1: it is a function of ``z*`` alone), so the warm start changes the cost, not the result
(to the solver's tolerance).

The cache is a plain pytree of two arrays, updated functionally: pass it into a jitted step and
return the updated one (jit-safe; no Python state, no host round trip)::

    cache = FixedPointCache.create(num_samples, (width,))

    @nnx.jit
    def step(model, optimizer, cache, x, y, indices):
        def loss_fn(model):
            z = model.deq(x, cache.lookup(indices))
            return loss(model.head(z), y), z
        (loss_value, z), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        return loss_value, cache.update(indices, z)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from deqlab import checks

__all__ = ["FixedPointCache"]


@dataclasses.dataclass(frozen=True)
class FixedPointCache:
    """The last equilibrium of each sample of a data set, by sample index (a warm-start cache).

    Build it with :meth:`create`; read starts with :meth:`lookup`, store equilibria with
    :meth:`update` (which returns a new cache: the arrays are never changed in place). A pytree
    (its two arrays are its leaves), so it can be an argument and a result of ``jax.jit`` /
    ``nnx.jit`` functions. A sample never stored looks up as zeros, the cold start of
    :class:`deqlab.nn.DEQ`.

    Attributes:
        values: the stored states, shape ``(num_samples,) + state_shape`` (zeros where none is
            stored yet).
        filled: boolean ``(num_samples,)``: which samples have a stored state.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.nn import FixedPointCache
        >>> cache = FixedPointCache.create(10, (4,))
        >>> cache = cache.update(jnp.array([2, 7]), jnp.ones((2, 4)))
        >>> cache.lookup(jnp.array([7, 3])).sum(axis=1).tolist(), cache.hits(jnp.array([7, 3])).tolist()
        ([4.0, 0.0], [True, False])
    """

    values: jax.Array
    filled: jax.Array

    @classmethod
    def create(cls, num_samples: int, state_shape: Any, dtype: Any = jnp.float32) -> FixedPointCache:
        """An empty cache for ``num_samples`` samples whose state has shape ``state_shape``.

        Args:
            num_samples: the number of samples of the data set (>= 1): indices run over
                ``[0, num_samples)``.
            state_shape: the shape of one sample's state, e.g. ``(width,)`` for a
                :class:`deqlab.nn.DEQ` with a ``(batch, width)`` state, ``(T, width)`` for a
                sequence model.
            dtype: the floating dtype of the stored states.

        Returns:
            The cache, all zeros and nothing filled.

        Raises:
            ValueError: ``num_samples`` is not an integer >= 1, ``state_shape`` is not a tuple of
                integers >= 1, or ``dtype`` is not a floating dtype.

        Example:
            >>> from deqlab.nn import FixedPointCache
            >>> FixedPointCache.create(100, (8,)).values.shape
            (100, 8)
        """
        where = "nn.FixedPointCache.create"
        num_samples = checks.positive_int(num_samples, "num_samples", where)
        try:
            shape = tuple(state_shape)
        except TypeError:
            raise checks.fail("state_shape", "a tuple of integers >= 1", state_shape, where) from None
        shape = tuple(checks.positive_int(n, "state_shape", where) for n in shape)
        dtype = checks.floating_dtype(dtype, "dtype", where)
        return cls(jnp.zeros((num_samples,) + shape, dtype), jnp.zeros((num_samples,), bool))

    @property
    def num_samples(self) -> int:
        """The number of samples the cache holds a slot for."""
        return self.values.shape[0]

    @property
    def state_shape(self) -> tuple[int, ...]:
        """The shape of one sample's state."""
        return tuple(self.values.shape[1:])

    def _indices(self, indices, where):
        indices = jnp.asarray(indices)
        if indices.ndim != 1 or not jnp.issubdtype(indices.dtype, jnp.integer):
            raise checks.fail("indices", "a 1-D integer array of sample indices",
                              f"{indices.dtype} of shape {tuple(indices.shape)}", where)
        if not checks.is_traced(indices) and indices.size:
            lo, hi = int(jnp.min(indices)), int(jnp.max(indices))
            if lo < 0 or hi >= self.num_samples:
                raise checks.fail("indices", f"sample indices in [0, {self.num_samples})",
                                  f"an index {lo if lo < 0 else hi}", where)
        # Under jit a negative index would wrap around (JAX's .at[] reads index -1 as the last
        # sample, even with mode="fill"/"drop"): it is moved past the end, so that it reads zeros
        # and its update is dropped, like any other index out of range.
        return jnp.where(indices < 0, self.num_samples, indices)

    def lookup(self, indices: Any) -> jax.Array:
        """The stored states of the samples ``indices``: the warm starts of a batch.

        Args:
            indices: 1-D integer array of sample indices in ``[0, num_samples)`` (checked when
                concrete; under ``jit`` an index outside the range looks up as zeros, a cold start).

        Returns:
            ``(len(indices),) + state_shape``, zeros for samples with nothing stored; without
            gradient (``stop_gradient``).

        Raises:
            ValueError: ``indices`` is not a 1-D integer array, or a concrete index is out of range.

        Example:
            >>> import jax.numpy as jnp
            >>> from deqlab.nn import FixedPointCache
            >>> FixedPointCache.create(5, (2,)).lookup(jnp.array([0, 4])).shape
            (2, 2)
        """
        indices = self._indices(indices, "nn.FixedPointCache.lookup")
        return jax.lax.stop_gradient(self.values.at[indices].get(mode="fill", fill_value=0))

    def hits(self, indices: Any) -> jax.Array:
        """Which of the samples ``indices`` have a stored state.

        Args:
            indices: 1-D integer array of sample indices, as for :meth:`lookup`.

        Returns:
            Boolean ``(len(indices),)``.

        Raises:
            ValueError: as :meth:`lookup`.

        Example:
            >>> import jax.numpy as jnp
            >>> from deqlab.nn import FixedPointCache
            >>> FixedPointCache.create(5, (2,)).hits(jnp.array([1])).tolist()
            [False]
        """
        indices = self._indices(indices, "nn.FixedPointCache.hits")
        return self.filled.at[indices].get(mode="fill", fill_value=False)

    def update(self, indices: Any, states: Any) -> FixedPointCache:
        """A new cache with ``states`` stored for the samples ``indices`` (this one is unchanged).

        Args:
            indices: 1-D integer array of sample indices, as for :meth:`lookup` (under ``jit``
                an index outside the range is dropped); an index given twice keeps one of its
                states (which one is unspecified, as for ``.at[].set``).
            states: the equilibria, shape ``(len(indices),) + state_shape``; stored without
                gradient and cast to the cache's dtype.

        Returns:
            The updated :class:`FixedPointCache`.

        Raises:
            ValueError: ``indices`` as for :meth:`lookup`, or ``states`` of another shape.

        Example:
            >>> import jax.numpy as jnp
            >>> from deqlab.nn import FixedPointCache
            >>> cache = FixedPointCache.create(3, (2,)).update(jnp.array([1]), jnp.ones((1, 2)))
            >>> cache.filled.tolist()
            [False, True, False]
        """
        where = "nn.FixedPointCache.update"
        indices = self._indices(indices, where)
        expected = (indices.shape[0],) + self.state_shape
        if tuple(jnp.shape(states)) != expected:
            raise checks.fail("states", f"an array of shape {expected} (len(indices),) + state_shape",
                              f"shape {tuple(jnp.shape(states))}", where)
        states = jax.lax.stop_gradient(jnp.asarray(states)).astype(self.values.dtype)
        return FixedPointCache(self.values.at[indices].set(states, mode="drop"),
                               self.filled.at[indices].set(True, mode="drop"))


jax.tree_util.register_dataclass(FixedPointCache, data_fields=["values", "filled"], meta_fields=[])
