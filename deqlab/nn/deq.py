"""The :class:`DEQ` layer: a cell solved to its equilibrium, with an implicit backward pass."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from deqlab.implicit import fixed_point
from deqlab.solvers import Solution, get_solver

__all__ = ["DEQ", "SolveSummary"]


class SolveSummary(nnx.Variable):
    """Statistics of the layer's last forward solve. Not a ``nnx.Param``: optimisers skip it."""


class DEQ(nnx.Module):
    """Deep equilibrium layer ``z* = cell(z*, x)``, differentiated implicitly (003 §3.1).

    The cell's parameters are split from its graph (``nnx.split``) and passed to
    :func:`deqlab.implicit.fixed_point` explicitly, so the custom VJP never closes over traced
    parameters.

    Args:
        cell: an ``nnx.Module`` mapping ``(z, x)`` to ``z'`` of the same shape as z, with a ``width``
            attribute (the size of z's last axis).
        solver, tol, max_steps: forward solver (name or object) and its settings.
        backward: ``"implicit"``, ``"unrolled"`` or ``"phantom"``.
        batch_axis: axis of x and z indexing independent samples (None for a single sample).
        **options: further keywords of :func:`deqlab.implicit.fixed_point` (``backward_solver``,
            ``backward_tol``, ``phantom_steps``, ...).

    After each call, ``layer.steps_mean``, ``steps_max``, ``converged_fraction``, ``residual_max``
    and ``nfe`` (:class:`SolveSummary` variables) describe the last forward solve; call with
    ``return_solution=True`` to get the whole :class:`~deqlab.solvers.Solution`.
    """

    def __init__(self, cell: nnx.Module, *, solver: Any = "anderson", tol: float = 1e-4,
                 max_steps: int = 50, backward: str = "implicit", batch_axis: int | None = 0,
                 **options: Any):
        if not hasattr(cell, "width"):
            raise ValueError("`cell` must have a `width` attribute (the size of the hidden state).")
        self.cell = cell
        self.solver = get_solver(solver, tol=tol, max_steps=max_steps)
        self.backward = backward
        self.batch_axis = batch_axis
        self.options = dict(options)
        zero = jnp.zeros((), jnp.float32)
        self.steps_mean = SolveSummary(zero)
        self.steps_max = SolveSummary(zero)
        self.converged_fraction = SolveSummary(zero)
        self.residual_max = SolveSummary(zero)
        self.nfe = SolveSummary(zero)

    def __call__(self, x: jax.Array, z0: jax.Array | None = None, *, return_solution: bool = False):
        if z0 is None:
            z0 = jnp.zeros(x.shape[:-1] + (self.cell.width,), x.dtype)
        graphdef, state = nnx.split(self.cell)

        def cell_map(z, state, x):
            return nnx.merge(graphdef, state)(z, x)

        sol: Solution = fixed_point(
            cell_map, z0, state, x, solver=self.solver, backward=self.backward,
            batch_axis=self.batch_axis, **self.options,
        )
        steps = jax.lax.stop_gradient(sol.stats.steps).astype(jnp.float32)
        self.steps_mean[...] = jnp.mean(steps)
        self.steps_max[...] = jnp.max(steps)
        self.converged_fraction[...] = jnp.mean(sol.converged.astype(jnp.float32))
        self.residual_max[...] = jnp.max(jax.lax.stop_gradient(sol.stats.best_residual)).astype(jnp.float32)
        self.nfe[...] = sol.stats.nfe.astype(jnp.float32)
        return (sol.value, sol) if return_solution else sol.value
