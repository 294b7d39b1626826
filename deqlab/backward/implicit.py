"""The implicit backward pass (003 Theorem 1, Eq. 8 and 11): the forward solve under
``jax.custom_vjp``, the adjoint solve as its backward pass."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from deqlab import checks
from deqlab import precision as precision_module
from deqlab.backward.adjoint import adjoint_solve
from deqlab.backward.base import Backward, matmul_level, report, zero_cotangent
from deqlab.backward.linear import get_adjoint_solver
from deqlab.failures import nan_where_failed

__all__ = ["Implicit"]


class Implicit(Backward):
    """Implicit backward pass: solve the adjoint fixed point u = g + J_f(z*)^T u (003 Eq. 11).

    Args:
        solver: adjoint solver: a name of :data:`deqlab.solvers.SOLVERS`, a solver object, a
            :class:`LinearSolver` object such as :class:`GMRES`, or ``"gmres"`` (its defaults);
            None: the forward solver.
        tol, max_steps: of the adjoint solve; None: the forward ones.
    """

    solver: Any = None
    tol: float | None = None
    max_steps: int | None = None
    name = "implicit"

    def __post_init__(self):
        where = "backward.Implicit"
        if self.solver is not None:
            get_adjoint_solver(self.solver, name="solver")
        if self.tol is not None:
            checks.positive_number(self.tol, "tol", where)
        if self.max_steps is not None:
            checks.positive_int(self.max_steps, "max_steps", where)

    def solve(self, problem):
        return _implicit(problem, self)



def _implicit(problem, mode):
    """The forward solve under ``jax.custom_vjp``, with the adjoint solve as its backward pass."""
    backward_options = dict(
        solver=problem.solver if mode.solver is None else mode.solver,
        tol=problem.tol if mode.tol is None else mode.tol,
        max_steps=problem.solver.max_steps if mode.max_steps is None else mode.max_steps,
        batch_axis=problem.batch_axis,
        precision=problem.precision,
    )
    f = problem.f

    @jax.custom_vjp
    def equilibrium(z0, args, init_state):
        return problem.forward(z0, args, init_state=init_state)

    def equilibrium_fwd(z0, args, init_state):
        sol = problem.forward(z0, args, init_state=init_state)
        return sol, (sol.value, z0, args, init_state)

    def equilibrium_bwd(residuals, cotangent):
        z_star, z0, args, init_state = residuals
        adjoint = adjoint_solve(f, z_star, args, cotangent.value, on_failure="ignore", **backward_options)
        report("adjoint", problem.on_failure, adjoint.result, adjoint.stats.best_residual)
        u = adjoint.value
        if problem.on_failure == "nan":
            u = nan_where_failed(u, adjoint.result, problem.batch_axis)
        with precision_module.matmul_precision(matmul_level(problem.precision, backward_options["tol"], problem.dtype)):
            _, vjp_args = jax.vjp(lambda a: f(z_star, *a), args)
        (args_bar,) = vjp_args(u)
        return jax.tree_util.tree_map(jnp.zeros_like, z0), args_bar, zero_cotangent(init_state)

    equilibrium.defvjp(equilibrium_fwd, equilibrium_bwd)
    return equilibrium(problem.z0, problem.args, problem.init_state)


