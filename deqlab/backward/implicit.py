"""The implicit derivative (003 Theorem 1, Eq. 8 and 11): the forward solve under
``jax.custom_jvp``, with a tangent solve for forward mode and its transpose, the adjoint solve,
for reverse mode."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from deqlab import _eager, checks
from deqlab import precision as precision_module
from deqlab.backward.adjoint import _adjoint_solve, _tangent_solve
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

    def solve(self, problem):
        return _implicit(problem, self)



def _implicit(problem, mode):
    """The forward solve under ``jax.custom_jvp``: its tangent solves (I - J) z_dot = (df/dargs)
    args_dot through ``lax.custom_linear_solve``, given the adjoint solve u = g + J^T u as its
    ``transpose_solve``, which reverse mode runs (003 Eq. 8 and 11). One rule serves ``jvp``,
    ``jacfwd``, ``grad`` and their compositions (``hessian``)."""
    f = problem.f

    def apply_policy(sol, what):
        report(what, problem.on_failure, sol.result, sol.stats.best_residual)
        if problem.on_failure == "nan":
            return nan_where_failed(sol.value, sol.result, problem.batch_axis)
        return sol.value

    # The solver's array settings (a traced damping or tol) are inputs of the rule, never a
    # closure; its Python numbers stay Python numbers (custom_jvp would turn every input into a
    # tracer, and a Python tol chooses the matmul precision and warns where it is unreachable).
    traced_settings, static_settings = _eager._partition(problem.solver)

    @jax.custom_jvp
    def equilibrium(z0, args, init_state, budget, settings):
        solver = _eager._combine(settings, static_settings)
        return problem.forward(z0, args, init_state=init_state, budget=budget, solver=solver)

    @equilibrium.defjvp
    def equilibrium_jvp(primals, tangents):
        z0, args, init_state, budget, settings = primals
        solver = _eager._combine(settings, static_settings)
        # z0, init_state, budget and the solver's settings: the equilibrium does not depend on them
        args_dot = tangents[1]
        # the custom rule again, not the bare solve: a derivative of this rule (a hessian) is
        # implicit too
        sol = equilibrium(z0, args, init_state, budget, settings)
        z_star = sol.value
        # settings read from the rule's own inputs, never from the enclosing trace: JAX may run
        # this rule after that trace has ended (linearising an outer jit)
        adjoint_solver = mode.adjoint_solver(dataclasses.replace(problem, solver=solver, tol=solver.tol))
        options = dict(solver=adjoint_solver, batch_axis=problem.batch_axis, precision=problem.precision)
        level = _matmul_level(problem.precision, adjoint_solver.tol, problem.dtype)
        with precision_module.matmul_precision(level):
            _, rhs = jax.jvp(lambda a: f(z_star, *a), (args,), (args_dot,))

        def identity_minus_jacobian(v):
            # (I - J) v, linear in v: custom_linear_solve traces it (for its transpose) but never
            # evaluates it here, where `tangent` and `adjoint` solve; a jvp rather than a stored
            # linearisation keeps nothing of f's from the forward pass
            with precision_module.matmul_precision(level):
                jv = jax.jvp(lambda z: f(z, *args), (z_star,), (v,))[1]
            return jax.tree_util.tree_map(jnp.subtract, v, jv)

        def tangent(_, b):
            return apply_policy(_tangent_solve(f, z_star, args, b, **options), "tangent")

        def adjoint(_, g):
            return apply_policy(_adjoint_solve(f, z_star, args, g, **options), "adjoint")

        z_dot = jax.lax.custom_linear_solve(identity_minus_jacobian, rhs, tangent, adjoint)
        return sol, zero_cotangent(sol)._replace(value=z_dot)

    return equilibrium(problem.z0, problem.args, problem.init_state, problem.budget, traced_settings)
