"""Small building blocks of the solvers with a history (Anderson, Broyden): products at full
precision and per-sample ring buffers written in place."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from deqlab import precision as precision_module

__all__ = ["EXACT", "exact_einsum", "empty_history", "write_slot", "write_gram"]

EXACT = jax.lax.Precision.HIGHEST
"""The solvers' own small products (Gram matrices, mixing, secant updates) are never demoted to
bfloat16 passes on accelerators: they decide the step, and they are cheap next to f."""



def exact_einsum(spec, a, b):
    """einsum in at least float32 at full precision (half-precision iterates, TPU matmuls)."""
    work = precision_module.working_dtype(jnp.result_type(a, b))
    return jnp.einsum(spec, a.astype(work), b.astype(work), precision=EXACT)


def empty_history(z, m):
    """Zeros of shape (B, m, D) that inherit the sharding of z (B, D)."""
    return jnp.repeat(jnp.zeros_like(z)[:, None, :], m, axis=1)


def write_slot(history, slot, value):
    """history[:, slot] = value, for a scalar slot shared by the batch."""
    index = jnp.zeros((), jnp.int32)
    return jax.lax.dynamic_update_slice(history, value[:, None, :], (index, jnp.asarray(slot, jnp.int32), index))


def write_gram(gram, slot, dots):
    """Row and column ``slot`` of the (B, m, m) Gram matrix set to ``dots`` (B, m)."""
    index = jnp.zeros((), jnp.int32)
    slot = jnp.asarray(slot, jnp.int32)
    gram = jax.lax.dynamic_update_slice(gram, dots[:, None, :], (index, slot, index))
    return jax.lax.dynamic_update_slice(gram, dots[:, :, None], (index, index, slot))

