"""The implicit backward pass (003 Theorem 1, Eq. 8 and 11): the forward solve under
``jax.custom_vjp``, the adjoint solve as its backward pass."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from deqlab import checks
from deqlab import precision as precision_module
from deqlab.backward.adjoint import adjoint_solve
from deqlab.backward.base import Backward, Problem, _matmul_level, report, zero_cotangent
from deqlab.backward.linear import LinearSolver, get_adjoint_solver
from deqlab.failures import nan_where_failed
from deqlab.solvers import Solver

__all__ = ["Implicit"]


class Implicit(Backward):
    """Implicit backward pass: solve the adjoint fixed point u = g + J_f(z*)^T u (003 Eq. 11).

    Attributes:
        solver: adjoint solver: a name of :data:`deqlab.solvers.SOLVERS`, a solver object, a
            :class:`LinearSolver` object such as :class:`GMRES`, or ``"gmres"`` (its defaults);
            None: the forward solver.
        tol, max_steps: of the adjoint solve; None: an adjoint solver object's own, else the
            forward solve's (:meth:`adjoint_solver` resolves them, in this one place).

    Raises:
        ValueError: an unknown adjoint solver, or a setting outside its range.

    Example:
        The adjoint by GMRES or by the forward solver (Anderson, the default) gives the same
        gradient:

        >>> import jax, jax.numpy as jnp, deqlab
        >>> f = lambda z, w, x: jnp.tanh(w * z + x)
        >>> def grad(backward, solver=deqlab.Anderson()):
        ...     loss = lambda w: deqlab.fixed_point(f, jnp.zeros(3), w, jnp.ones(3), solver=solver,
        ...                                         backward=backward).value.sum()
        ...     return jax.grad(loss)(0.5)
        >>> from deqlab.backward import GMRES, Implicit
        >>> krylov = grad(Implicit(solver=GMRES(restart=10), max_steps=300))
        >>> bool(jnp.allclose(krylov, grad(Implicit()), rtol=1e-3))
        True
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

    def adjoint_solver(self, problem: Problem) -> Solver | LinearSolver:
        """The adjoint solver object of ``problem``, its settings resolved in this one place.

        ``tol`` and ``max_steps`` are, in order of precedence: this mode's own (when given), an
        adjoint solver object's own (``solver=GMRES(max_steps=300)``; ``tol`` only where it
        is not None), then the forward solve's.

        Args:
            problem: the :class:`Problem` being differentiated.

        Returns:
            A :class:`deqlab.solvers.Solver` or :class:`LinearSolver` with ``tol`` and
            ``max_steps`` set.
        """
        solver = problem.solver if self.solver is None else get_adjoint_solver(self.solver, name="solver")
        own = self.solver is not None and not isinstance(self.solver, str)  # an object keeps its settings
        tol = self.tol if self.tol is not None else (
            solver.tol if own and solver.tol is not None else problem.tol)
        max_steps = self.max_steps if self.max_steps is not None else (
            solver.max_steps if own else problem.solver.max_steps)
        return solver.replace(tol=tol, max_steps=max_steps)

    def solve(self, problem):
        return _implicit(problem, self)



def _implicit(problem, mode):
    """The forward solve under ``jax.custom_vjp``, with the adjoint solve as its backward pass."""
    adjoint_solver = mode.adjoint_solver(problem)
    backward_options = dict(solver=adjoint_solver, batch_axis=problem.batch_axis, precision=problem.precision)
    f = problem.f

    @jax.custom_vjp
    def equilibrium(z0, args, init_state, budget):
        return problem.forward(z0, args, init_state=init_state, budget=budget)

    def equilibrium_fwd(z0, args, init_state, budget):
        sol = problem.forward(z0, args, init_state=init_state, budget=budget)
        return sol, (sol.value, z0, args, init_state, budget)

    def equilibrium_bwd(residuals, cotangent):
        z_star, z0, args, init_state, budget = residuals
        adjoint = adjoint_solve(f, z_star, args, cotangent.value, on_failure="ignore", **backward_options)
        report("adjoint", problem.on_failure, adjoint.result, adjoint.stats.best_residual)
        u = adjoint.value
        if problem.on_failure == "nan":
            u = nan_where_failed(u, adjoint.result, problem.batch_axis)
        level = _matmul_level(problem.precision, adjoint_solver.tol, problem.dtype)
        with precision_module.matmul_precision(level):
            _, vjp_args = jax.vjp(lambda a: f(z_star, *a), args)
        (args_bar,) = vjp_args(u)
        return jax.tree_util.tree_map(jnp.zeros_like, z0), args_bar, zero_cotangent(init_state), zero_cotangent(budget)

    equilibrium.defvjp(equilibrium_fwd, equilibrium_bwd)
    return equilibrium(problem.z0, problem.args, problem.init_state, problem.budget)


