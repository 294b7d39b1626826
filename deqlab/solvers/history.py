"""Small building blocks of the solvers with a history (Anderson, Broyden): products at full
precision and per-sample ring buffers written in place.

They work on the one sample a :class:`deqlab.solvers.Solver` sees (a flattened ``(D,)`` row) and
are public for solvers of one's own that keep a history: a history is an ``(m, D)`` buffer of m
slots with a slot counter in the solver's state (the loop batches both with ``jax.vmap``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from deqlab import precision as precision_module

__all__ = ["EXACT", "exact_einsum", "weighted_rows", "empty_history", "write_slot", "write_gram"]

EXACT = jax.lax.Precision.HIGHEST
"""The solvers' own small products (Gram matrices, mixing, secant updates) are never demoted to
bfloat16 passes on accelerators: they decide the step, and they are cheap next to f."""



def exact_einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """``jnp.einsum(spec, a, b)`` in at least float32 at full matmul precision.

    The solvers' own small products decide their steps, so half-precision iterates are promoted
    and accelerators do not demote them to bfloat16 passes (:data:`EXACT`).

    Args:
        spec: the einsum subscripts, e.g. ``"id,d->i"``.
        a, b: the two operands (any floating dtypes).

    Returns:
        The product, in the working dtype of ``a`` and ``b`` (float32 for 16-bit inputs, else
        their common dtype; :func:`deqlab.precision.working_dtype`).

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.solvers.history import exact_einsum
        >>> a = jnp.ones((2, 3), jnp.bfloat16)
        >>> out = exact_einsum("id,d->i", a, a[0])
        >>> out.dtype, out.tolist()
        (dtype('float32'), [3.0, 3.0])
    """
    work = precision_module.working_dtype(jnp.result_type(a, b))
    return jnp.einsum(spec, a.astype(work), b.astype(work), precision=EXACT)


def weighted_rows(weights: jax.Array, rows: jax.Array) -> jax.Array:
    """``sum_i weights[i] * rows[i]`` for one sample's history, in at least float32, as ``m``
    multiply-adds (unrolled over the rows).

    The same number as ``exact_einsum("i,id->d", weights, rows)`` up to rounding, in a form that
    is faster under the loop's ``vmap``: there the product is a ``(B, 1, m)`` by ``(B, m, D)``
    batched matrix product with one row per sample, which XLA runs slowly on CPU, while ``m``
    multiply-adds fuse into one pass over the history (Anderson's mixing: on
    ``benchmarks/step_cost.py``'s tanh map its step at m = 5 fell from 1.81x a plain step to
    1.26-1.48x over four runs, median 1.31x; Broyden's products, measured the same way, gained nothing and
    keep ``exact_einsum``).
    Elementwise, so never demoted to bfloat16 passes on an accelerator.

    Args:
        weights: shape ``(m,)``, any floating dtype.
        rows: the history, shape ``(m, D)``, any floating dtype.

    Returns:
        Shape ``(D,)``, in the working dtype of both (float32 for 16-bit inputs, else their
        common dtype; :func:`deqlab.precision.working_dtype`).

    Raises:
        ValueError: ``weights`` is not one weight per row of ``rows``, or there are no rows.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.solvers.history import weighted_rows
        >>> rows = jnp.arange(6.0, dtype=jnp.bfloat16).reshape(3, 2)
        >>> out = weighted_rows(jnp.array([1.0, 0.0, 0.5]), rows)
        >>> out.dtype, out.tolist()
        (dtype('float32'), [2.0, 3.5])
    """
    if (jnp.ndim(weights) != 1 or jnp.ndim(rows) != 2 or jnp.shape(weights)[0] != jnp.shape(rows)[0]
            or jnp.shape(rows)[0] == 0):
        raise ValueError(f"weighted_rows: `weights` must have shape (m,) for `rows` of shape (m, D), m >= 1, got "
                         f"{jnp.shape(weights)} and {jnp.shape(rows)}.")
    work = precision_module.working_dtype(jnp.result_type(weights, rows))
    weights, rows = weights.astype(work), rows.astype(work)
    total = weights[0] * rows[0]
    for i in range(1, rows.shape[0]):
        total = total + weights[i] * rows[i]
    return total


def empty_history(z: jax.Array, m: int) -> jax.Array:
    """A history buffer of ``m`` slots for one sample.

    Args:
        z: the sample's iterate, shape ``(D,)``.
        m: the number of slots (>= 1).

    Returns:
        Zeros of shape ``(m, D)`` and the dtype of ``z`` (computed from ``z``, so that under the
        loop's ``vmap`` a batch split across devices stays split).

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.solvers.history import empty_history
        >>> empty_history(jnp.ones(3), 5).shape
        (5, 3)
    """
    return jnp.repeat(jnp.zeros_like(z)[None, :], m, axis=0)


def write_slot(history: jax.Array, slot, value: jax.Array) -> jax.Array:
    """``history[slot] = value`` (jit- and vmap-safe).

    Args:
        history: the buffer, shape ``(m, D)``.
        slot: the slot to write, a scalar (an int or a traced int32) in ``[0, m)``.
        value: the new row, shape ``(D,)``.

    Returns:
        The updated buffer, shape ``(m, D)``.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.solvers.history import empty_history, write_slot
        >>> history = write_slot(empty_history(jnp.zeros(3), 4), 1, jnp.ones(3))
        >>> history.sum(axis=1).tolist()   # only slot 1 holds the three ones
        [0.0, 3.0, 0.0, 0.0]
    """
    # A select, not dynamic_update_slice: under the loop's vmap each sample has its own slot,
    # and a batched dynamic_update_slice becomes a scatter (larger programs, slower on CPU);
    # the select fuses with the pass that reads the history anyway.
    return jnp.where((jnp.arange(history.shape[0]) == slot)[:, None], value[None, :], history)


def write_gram(gram: jax.Array, slot, dots: jax.Array) -> jax.Array:
    """Row and column ``slot`` of one sample's Gram matrix set to ``dots``.

    When slot i of a history G (``(m, D)``) is overwritten, only row and column i of ``G G^T``
    change: ``dots = G g_i`` (``exact_einsum("id,d->i", G, g_i)``, computed after the write)
    updates it in O(m D) instead of recomputing it in O(m^2 D), as Anderson does.

    Args:
        gram: the Gram matrix, shape ``(m, m)``.
        slot: the row and column to write, a scalar in ``[0, m)``.
        dots: the new row (and column), shape ``(m,)``.

    Returns:
        The updated matrix, shape ``(m, m)``, symmetric when ``gram`` was.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.solvers.history import exact_einsum, write_gram, write_slot
        >>> history = jnp.arange(12.0).reshape(3, 4)
        >>> gram = exact_einsum("id,jd->ij", history, history)
        >>> history = write_slot(history, 2, jnp.ones(4))
        >>> updated = write_gram(gram, 2, exact_einsum("id,d->i", history, history[2]))
        >>> bool(jnp.array_equal(updated, exact_einsum("id,jd->ij", history, history)))
        True
    """
    at = jnp.arange(gram.shape[0]) == slot  # a select, as in write_slot
    return jnp.where(at[:, None], dots[None, :], jnp.where(at[None, :], dots[:, None], gram))

