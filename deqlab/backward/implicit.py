"""The implicit derivative (003 Theorem 1, Eq. 8 and 11) by iterative solves: the tangent solve
for forward mode and the adjoint solve for reverse mode, under the shared rule of
:class:`~deqlab.backward.ImplicitRule`."""

from __future__ import annotations

from typing import Any

from deqlab import checks
from deqlab.backward.adjoint import _adjoint_solve, _tangent_solve
from deqlab.backward.base import Problem, _matmul_level, report
from deqlab.backward.linear import LinearSolver, get_adjoint_solver
from deqlab.backward.rule import ImplicitRule
from deqlab.failures import nan_where_failed
from deqlab.solvers import Solver

__all__ = ["Implicit"]


class Implicit(ImplicitRule):
    """Implicit backward pass: solve the adjoint fixed point u = g + J_f(z*)^T u (003 Eq. 11).

    Attributes:
        solver: adjoint solver: a name of :data:`deqlab.solvers.SOLVERS`, a solver object, a
            :class:`LinearSolver` object such as :class:`GMRES`, or ``"gmres"`` (its defaults);
            None: the forward solver. A forward solver is resolved by its
            :meth:`~deqlab.solvers.Solver.for_linear_map`: :class:`~deqlab.solvers.Adaptive`
            (the default) runs Anderson from the first step, or Broyden for an expensive f, and
            its ``warm_up``, ``trial`` and ``cost_ratio`` are not used.
        tol, max_steps: of the adjoint solve; None: an adjoint solver object's own, else the
            forward solve's (:meth:`adjoint_solver` resolves them, in this one place).

    Raises:
        ValueError: an unknown adjoint solver, or a setting outside its range.

    Example:
        The adjoint by GMRES or by the forward solver (here Anderson) gives the same
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

    def _check_settings(self):  # run by the constructor at every level of a subclass
        where = "backward.Implicit"
        if self.solver is not None:
            get_adjoint_solver(self.solver, name="solver")
        if self.tol is not None:
            checks.positive_number(self.tol, "tol", where, allow_traced=True)
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

    def _matmul_level(self, problem):
        # the adjoint solve's tolerance, not the forward one's, sets the precision of the
        # products with f around it
        return _matmul_level(problem.precision, self.adjoint_solver(problem).tol, problem.dtype)

    def _options(self, problem):
        return dict(solver=self.adjoint_solver(problem), batch_axis=problem.batch_axis,
                    precision=problem.precision)

    def adjoint(self, problem, solution, g):
        """The adjoint solve u = g + J^T u (003 Eq. 11) with :meth:`adjoint_solver`; its failures
        follow the caller's ``on_failure``."""
        sol = _adjoint_solve(problem.f, solution.value, problem.args, g, **self._options(problem))
        return _apply_policy(problem, sol, "adjoint")

    def tangent(self, problem, solution, b):
        """The tangent solve v = b + J v (forward mode) with :meth:`adjoint_solver`; its failures
        follow the caller's ``on_failure``."""
        sol = _tangent_solve(problem.f, solution.value, problem.args, b, **self._options(problem))
        return _apply_policy(problem, sol, "tangent")


def _apply_policy(problem, sol, what):
    report(what, problem.on_failure, sol.result, sol.stats.best_residual)
    if problem.on_failure == "nan":
        return nan_where_failed(sol.value, sol.result, problem.batch_axis)
    return sol.value
