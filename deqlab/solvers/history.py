"""Small building blocks of the solvers with a history (Anderson, Broyden): products at full
precision and per-sample ring buffers written in place.

They work on the flattened ``(B, D)`` rows a :class:`deqlab.solvers.Solver` sees (B samples of D
numbers) and are public for solvers of one's own that keep a history: a history is a ``(B, m, D)``
buffer whose slot index is a scalar shared by the batch (every active sample records every step).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from deqlab import precision as precision_module

__all__ = ["EXACT", "exact_einsum", "empty_history", "write_slot", "write_gram"]

EXACT = jax.lax.Precision.HIGHEST
"""The solvers' own small products (Gram matrices, mixing, secant updates) are never demoted to
bfloat16 passes on accelerators: they decide the step, and they are cheap next to f."""



def exact_einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """``jnp.einsum(spec, a, b)`` in at least float32 at full matmul precision.

    The solvers' own small products decide their steps, so half-precision iterates are promoted
    and accelerators do not demote them to bfloat16 passes (:data:`EXACT`).

    Args:
        spec: the einsum subscripts, e.g. ``"bid,bd->bi"``.
        a, b: the two operands (any floating dtypes).

    Returns:
        The product, in the working dtype of ``a`` and ``b`` (float32 for 16-bit inputs, else
        their common dtype; :func:`deqlab.precision.working_dtype`).

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.solvers.history import exact_einsum
        >>> a = jnp.ones((2, 3), jnp.bfloat16)
        >>> out = exact_einsum("bd,bd->b", a, a)
        >>> out.dtype, out.tolist()
        (dtype('float32'), [3.0, 3.0])
    """
    work = precision_module.working_dtype(jnp.result_type(a, b))
    return jnp.einsum(spec, a.astype(work), b.astype(work), precision=EXACT)


def empty_history(z: jax.Array, m: int) -> jax.Array:
    """A history buffer of ``m`` slots per sample: zeros that inherit the sharding of ``z``.

    Args:
        z: the iterates, shape ``(B, D)``.
        m: the number of slots (>= 1).

    Returns:
        Zeros of shape ``(B, m, D)`` and the dtype of ``z`` (computed from ``z``, so a batch
        split across devices stays split).

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.solvers.history import empty_history
        >>> empty_history(jnp.ones((4, 3)), 5).shape
        (4, 5, 3)
    """
    return jnp.repeat(jnp.zeros_like(z)[:, None, :], m, axis=1)


def write_slot(history: jax.Array, slot, value: jax.Array) -> jax.Array:
    """``history[:, slot] = value`` in place (``dynamic_update_slice``: O(B D), jit-safe).

    Args:
        history: the buffer, shape ``(B, m, D)``.
        slot: the slot to write, a scalar shared by the batch (an int or a traced int32).
        value: the new rows, shape ``(B, D)``.

    Returns:
        The updated buffer, shape ``(B, m, D)``.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.solvers.history import empty_history, write_slot
        >>> history = write_slot(empty_history(jnp.zeros((2, 3)), 4), 1, jnp.ones((2, 3)))
        >>> history.sum(axis=(0, 2)).tolist()   # only slot 1 holds the six ones
        [0.0, 6.0, 0.0, 0.0]
    """
    index = jnp.zeros((), jnp.int32)
    return jax.lax.dynamic_update_slice(history, value[:, None, :], (index, jnp.asarray(slot, jnp.int32), index))


def write_gram(gram: jax.Array, slot, dots: jax.Array) -> jax.Array:
    """Row and column ``slot`` of per-sample Gram matrices set to ``dots``, in place.

    When slot i of a history G (``(B, m, D)``) is overwritten, only row and column i of
    ``G G^T`` change: ``dots = G g_i`` (``exact_einsum("bid,bd->bi", G, g_i)``, computed after the
    write) updates it in O(B m D) instead of recomputing it in O(B m^2 D), as Anderson does.

    Args:
        gram: the Gram matrices, shape ``(B, m, m)``.
        slot: the row and column to write, a scalar shared by the batch.
        dots: the new row (and column), shape ``(B, m)``.

    Returns:
        The updated matrices, shape ``(B, m, m)``, symmetric when ``gram`` was.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.solvers.history import exact_einsum, write_gram, write_slot
        >>> history = jnp.arange(12.0).reshape(1, 3, 4)
        >>> gram = exact_einsum("bid,bjd->bij", history, history)
        >>> history = write_slot(history, 2, jnp.ones((1, 4)))
        >>> updated = write_gram(gram, 2, exact_einsum("bid,bd->bi", history, history[:, 2]))
        >>> bool(jnp.array_equal(updated, exact_einsum("bid,bjd->bij", history, history)))
        True
    """
    index = jnp.zeros((), jnp.int32)
    slot = jnp.asarray(slot, jnp.int32)
    gram = jax.lax.dynamic_update_slice(gram, dots[:, None, :], (index, slot, index))
    return jax.lax.dynamic_update_slice(gram, dots[:, :, None], (index, index, slot))

