"""What every backward mode shares: the :class:`Problem` it differentiates, the :class:`Backward`
base class, and how failures of the solves behind a gradient are reported."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import precision as precision_module
from deqlab.failures import SolverWarning, signal
from deqlab.solvers import Solution, Solver, solve
from deqlab.solvers.base import configuration_class

__all__ = ["BackwardWarning", "Problem", "Backward", "report", "matmul_level", "zero_cotangent"]


class BackwardWarning(SolverWarning):
    """A solve behind a gradient (forward or adjoint) did not converge for some samples.

    Issued by :func:`fixed_point` and :func:`adjoint_solve` with ``on_failure="warn"``; a
    subclass of :class:`~deqlab.failures.SolverWarning`, so a filter on that catches both.

    Example:
        >>> warnings.simplefilter("error", deqlab.backward.BackwardWarning)   # make it an error
    """



_SAME = object()  # Problem.forward: keep the problem's own init_state


@dataclasses.dataclass(frozen=True)
class Problem:
    """What a backward mode differentiates: the fixed point of ``f(z, *args)`` from ``z0``.

    Built by :func:`fixed_point` and handed to :meth:`Backward.solve`.

    Attributes:
        f: the map, returning z only (``has_aux`` is handled by :func:`fixed_point`); closes over
            nothing traced.
        z0, args: the initial guess and the arguments (a tuple of pytrees) to differentiate.
        solver: the forward :class:`deqlab.solvers.Solver`, its ``tol`` resolved.
        batch_axis, precision, init_state: as in :func:`deqlab.solvers.solve`.
        tol: the forward tolerance; dtype: the dtype of the solve.
        on_failure: the caller's policy (:mod:`deqlab.failures`); :func:`fixed_point` applies it
            to the forward result, a mode applies it to solves of its own (an adjoint solve).
        budget: the forward solve's :class:`deqlab.solvers.Budget` (traced iteration limit and
            tolerance), or None: the solver's settings.

    Example:
        A mode's ``solve`` reads it::

            def solve(self, problem):
                sol = problem.forward(unrolled=True)   # the forward solve, differentiable
                return sol
    """

    f: Callable[..., Any]
    z0: Any
    args: tuple
    solver: Solver
    batch_axis: int | None
    precision: Any
    init_state: Any
    tol: float
    dtype: Any
    on_failure: str = "warn"
    budget: Any = None

    @property
    def level(self):
        """The matmul precision of f's evaluations (``precision``, or what ``tol`` needs)."""
        return matmul_level(self.precision, self.tol, self.dtype)

    def forward(self, z0: Any = None, args: tuple | None = None, *, init_state: Any = _SAME,
                budget: Any = _SAME, **options) -> Solution:
        """:func:`deqlab.solvers.solve` of this problem, with the problem's solver and options.

        A mode that wraps the solve in ``jax.custom_vjp`` passes ``init_state`` and ``budget`` in
        as primal inputs (never through a closure: they may be traced).

        Args:
            z0, args: replace the problem's where given.
            init_state: replaces the problem's where given (None: a cold start).
            budget: replaces the problem's where given (None: the solver's settings).
            **options: further arguments of :func:`deqlab.solvers.solve`, e.g. ``unrolled=True``
                (``on_failure`` defaults to ``"ignore"``: :func:`fixed_point` reports the
                forward solve).

        Returns:
            The forward :class:`~deqlab.solvers.Solution`.
        """
        z0 = self.z0 if z0 is None else z0
        args = self.args if args is None else args
        init_state = self.init_state if init_state is _SAME else init_state
        budget = self.budget if budget is _SAME else budget
        options.setdefault("on_failure", "ignore")  # fixed_point reports the forward solve
        return solve(self.f, z0, *args, solver=self.solver, batch_axis=self.batch_axis,
                     precision=self.precision, init_state=init_state, budget=budget, **options)



class Backward:
    """Base class of the backward modes of :func:`fixed_point` (how its gradient is computed).

    A subclass defines ``solve(problem) -> Solution``: the forward solve of ``problem`` (a
    :class:`Problem`) such that differentiating the returned ``Solution.value`` with respect to
    ``problem.args`` gives this mode's gradient (through ``jax.custom_vjp``, unrolling, or a
    differentiable step from the detached fixed point). :func:`fixed_point` then applies its
    ``on_failure`` policy to the forward result and adds ``aux``; a mode with solves of its own
    (an adjoint solve) applies ``problem.on_failure`` to them. Subclasses are made frozen,
    keyword-only dataclasses and pytrees with static fields (do not decorate them), so a
    backward object can be an argument of a ``jax.jit``-ed function.

    Raises:
        ValueError: a setting outside its range, naming it and the valid range.
        TypeError: a subclass without ``solve`` is instantiated (the message names it), or an
            ``on_failure`` is given (it is an argument of :func:`fixed_point` and
            :class:`deqlab.nn.DEQ` since deqlab 0.6).

    Example:
        The Jacobian-free gradient written as a mode of one's own::

            class OneStep(deqlab.backward.Backward):
                def solve(self, problem):
                    sol = problem.forward(jax.lax.stop_gradient(problem.z0),
                                          jax.lax.stop_gradient(problem.args))
                    z = jax.lax.stop_gradient(sol.value)
                    return sol._replace(value=problem.f(z, *problem.args))

            deqlab.fixed_point(f, z0, x, backward=OneStep())
    """

    name: ClassVar[str] = "backward"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        configuration_class(cls)

    def __new__(cls, *args, **kwargs):
        if cls.solve is Backward.solve:
            raise TypeError(
                f"{cls.__name__} cannot be instantiated: a deqlab.backward.Backward subclass must "
                f"define solve(self, problem) -> Solution; {cls.__name__} does not define `solve`."
            )
        if "on_failure" in kwargs:
            raise TypeError(
                f"backward.{cls.__name__}: `on_failure` is no longer a setting of the backward mode; "
                "pass it to the call: fixed_point(..., on_failure=...) or nn.DEQ(..., on_failure=...) "
                "(one policy for the forward and the adjoint solve, deqlab 0.6)."
            )
        return super().__new__(cls)

    def __post_init__(self):
        pass

    def solve(self, problem: Problem) -> Solution:
        """The forward solve of ``problem``, differentiable in this mode's way (required).

        Args:
            problem: the :class:`Problem` built by :func:`fixed_point`.

        Returns:
            The forward :class:`~deqlab.solvers.Solution`, whose ``value`` carries the gradient.
        """
        raise NotImplementedError


dataclasses.dataclass(frozen=True, kw_only=True)(Backward)



_HINTS = {
    "forward": "their values and gradients are not the equilibrium's. Raise max_steps, loosen tol, or "
               "check that f contracts (Solution.result reports each sample)",
    "adjoint": "their gradients are inaccurate. Raise the backward max_steps "
               "(deqlab.backward.Implicit(max_steps=...)), try Implicit(solver='gmres'), or check that "
               "the forward solve converged",
}


def report(what, policy, result, residual):
    """``"warn"`` / ``"raise"`` for a solve behind a gradient (:func:`deqlab.failures.signal`)."""
    caller = "adjoint_solve" if what == "adjoint-alone" else "fixed_point"
    what = "adjoint" if what == "adjoint-alone" else what
    signal(caller, what, policy, result, residual, category=BackwardWarning, hint=_HINTS[what])



def zero_cotangent(tree):
    """Zero cotangents shaped like ``tree`` (float0 for integer and boolean leaves)."""
    def zero(leaf):
        if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
            return jnp.zeros_like(leaf)
        return np.zeros(jnp.shape(leaf), jax.dtypes.float0)

    return jax.tree_util.tree_map(zero, tree)


def matmul_level(precision, tol, dtype):
    return precision_module.required_precision(tol, dtype) if precision is None else precision

