"""Differentiable fixed points: implicit, unrolled and phantom backward passes.

The implicit function theorem gives the gradient of a loss through an equilibrium z* = f(z*, a)
without storing the forward iterations (003 Theorem 1, Eq. 8): with g = dL/dz*,

.. math:: \\frac{dL}{da} = u^\\top \\frac{\\partial f}{\\partial a}(z^*, a),
          \\qquad u = g + J_f(z^*)^\\top u ,

the adjoint fixed point u being the solution of the linear system of 003 Eq. 11 written for f
instead of g_theta = f - z. We solve it matrix-free, with vector-Jacobian products only: either by
the same fixed-point solvers as the forward pass or by GMRES (Saad & Schultz 1986). No Jacobian is
ever formed.

Backward modes of :func:`fixed_point` are objects, like the forward solvers (the strings
``"implicit"``, ``"unrolled"``, ``"phantom"`` are shortcuts for their defaults). Each is a
subclass of :class:`Backward` that defines ``solve(problem)``, and so can be a mode of your own;
the adjoint linear solver is an object too (:class:`GMRES`, a :class:`LinearSolver`; the string
``"gmres"`` is its alias). All are hashable pytrees with static fields:

- :class:`Implicit` ``(solver, tol, max_steps)``: the above, through
  ``jax.custom_vjp``. Memory does not depend on the number of forward iterations.
- :class:`Unrolled` ``()``: reverse-mode differentiation through ``max_steps`` forward
  iterations (``lax.scan``; memory grows linearly with ``max_steps``). The reference the others
  are checked against.
- :class:`Phantom` ``(steps, damping)``: solve without gradient, then take ``steps``
  damped steps z <- (1 - d) z + d f(z, a) from z* with gradient (Geng et al. 2021), an inexpensive
  approximation.
- :class:`JacobianFree` ``()``: one undamped step ``f(z*, a)`` from the detached z*, i.e.
  the implicit gradient with ``(I - J^T)^{-1}`` replaced by the identity (Fung et al. 2022,
  "JFB: Jacobian-free backpropagation for implicit networks"); the phantom gradient with no
  Neumann terms. One vector-Jacobian product; Fung et al. prove it a descent direction when f is
  a contraction.
- :class:`SHINE` ``(refine)``: the adjoint solve replaced by the forward Broyden
  solve's own inverse-Jacobian estimate, ``u = -B^T g`` with ``B ~ (J_f - I)^{-1}`` (Ramzi et al.
  2022, "SHINE: SHaring the INverse Estimate from the forward pass for bi-level optimization and
  implicit models"), optionally followed by ``refine`` fixed-point steps of the adjoint
  iteration from there (their "refine" variant). Needs ``solver="broyden"``.

Failures are never silent. ``fixed_point(..., on_failure=...)`` is one policy for both solves
behind a gradient, the same argument as :func:`deqlab.solvers.solve`'s and :class:`deqlab.nn.DEQ`'s
(:mod:`deqlab.failures`): a sample whose forward solve failed (its value, hence its gradient, is
not the equilibrium's) and a sample whose adjoint solve failed (its gradient is inexact).
``"warn"`` (default) issues a :class:`BackwardWarning`; ``"nan"`` makes the failing samples'
values and gradients NaN, so a loss that uses them is NaN (no host callback: the choice for
TPUs); ``"raise"`` raises :class:`~deqlab.failures.SolverError`; ``"ignore"`` leaves the
per-sample ``Solution.result`` as the only record. Compare a backward linear solve that returns
zeros when it fails (google/jaxopt issue 466).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import _eager, checks
from deqlab import precision as precision_module
from deqlab.failures import (
    FAILURE_POLICIES,
    NOT_GIVEN,
    SolverWarning,
    check_policy,
    nan_where_failed,
    removed_throw,
    signal,
)
from deqlab.solvers import (
    SOLVERS,
    Flattener,
    Result,
    Solution,
    Solver,
    SolveStats,
    _check_init_state,
    _configuration_class,
    check_problem,
    get_solver,
    relative_residual,
    solve,
)

__all__ = [
    "fixed_point",
    "adjoint_solve",
    "check_gradients",
    "Backward",
    "Problem",
    "LinearSolver",
    "GMRES",
    "LINEAR_SOLVERS",
    "get_adjoint_solver",
    "Implicit",
    "Unrolled",
    "Phantom",
    "JacobianFree",
    "SHINE",
    "get_backward",
    "BACKWARDS",
    "FAILURE_POLICIES",
    "BackwardWarning",
]

class BackwardWarning(SolverWarning):
    """A solve behind a gradient (forward or adjoint) did not converge for some samples."""


# --------------------------------------------------------------------------------------------
# Adjoint linear solvers


class LinearSolver:
    """Base class of the adjoint linear solvers: ``(I - J_f(z*)^T) u = g``, matrix-free (003 Eq. 11).

    The adjoint of :func:`adjoint_solve` can be found either as a fixed point (any
    :class:`deqlab.solvers.Solver`) or as the solution of this linear system by a Krylov method, a
    subclass of this class. A subclass defines ``solve(operator, b, *, tol, max_steps)`` and is
    made a frozen keyword-only dataclass and a pytree with static fields, as solvers are.

    Args:
        tol: relative residual of the linear system to reach per sample (> 0); None: the
            dtype's default (:func:`deqlab.precision.default_tol`). A ``tol`` given to
            :func:`adjoint_solve` or :class:`Implicit` overrides it.
        max_steps: bound on the operator applications (>= 1); overridden likewise.

    Raises:
        ValueError: a setting outside its range, naming it and the valid range.

    Example:
        >>> fixed_point(f, z0, x, backward=Implicit(solver=GMRES(restart=10)))
    """

    tol: float | None = None
    max_steps: int = 100
    name: ClassVar[str] = "linear"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _configuration_class(cls)

    def __new__(cls, *args, **kwargs):
        if cls.solve is LinearSolver.solve:
            raise TypeError(
                f"{cls.__name__} cannot be instantiated: a deqlab.implicit.LinearSolver subclass must "
                f"define solve(self, operator, b, *, tol, max_steps) -> u; {cls.__name__} does not "
                "define `solve`."
            )
        return super().__new__(cls)

    def __post_init__(self):
        where = f"implicit.{type(self).__name__}"
        if self.tol is not None:
            checks.positive_number(self.tol, "tol", where)
        checks.positive_int(self.max_steps, "max_steps", where)

    def resolved_tol(self, dtype) -> float:
        """``tol``, or the default of ``dtype``."""
        return precision_module.default_tol(dtype) if self.tol is None else float(self.tol)

    def solve(self, operator: Callable[[Any], Any], b: Any, *, tol: float, max_steps: int) -> Any:
        """Solve ``operator(u) = b`` (required in a subclass).

        Args:
            operator: the linear map ``u -> u - J_f^T u`` on pytrees shaped like ``b``.
            b: the right-hand side, the cotangent g.
            tol: relative residual to aim for (the result is checked per sample afterwards).
            max_steps: bound on the applications of ``operator``.

        Returns:
            ``u``, a pytree shaped like ``b``.
        """
        raise NotImplementedError


dataclasses.dataclass(frozen=True, kw_only=True)(LinearSolver)


class GMRES(LinearSolver):
    """Restarted GMRES (Saad & Schultz 1986; ``jax.scipy.sparse.linalg.gmres``) for the adjoint.

    ``max_steps`` bounds the operator applications: ``ceil(max_steps / restart)`` restart cycles
    of ``min(restart, max_steps)`` products each. ``Implicit(solver="gmres")`` is this with its
    defaults. The linear system is solved for the whole batch at once (its samples are coupled
    only through GMRES's inner products); each sample's residual is checked afterwards.

    Args:
        restart: Krylov subspace size between restarts (>= 1).
        tol, max_steps: as for :class:`LinearSolver`.

    Example:
        >>> fixed_point(f, z0, x, backward=Implicit(solver=GMRES(restart=30), max_steps=300))
    """

    restart: int = 20
    name = "gmres"

    def __post_init__(self):
        super().__post_init__()
        checks.positive_int(self.restart, "restart", "implicit.GMRES")

    def solve(self, operator, b, *, tol, max_steps):
        # jax's ``maxiter`` counts restart cycles of ``restart`` products each: divide, so that
        # ``max_steps`` bounds the operator applications as it does for the other solvers (a
        # float32 adjoint that cannot reach ``tol`` otherwise costs ``restart`` times the budget).
        restart = min(self.restart, max_steps)
        u, _ = jax.scipy.sparse.linalg.gmres(
            operator, b, tol=tol, atol=0.0, restart=restart, maxiter=-(-max_steps // restart),
        )
        return u


#: Adjoint linear solvers by name (each name is a shortcut for the object with its defaults).
#: This table is the one place where the name ``"gmres"`` is understood.
LINEAR_SOLVERS = {cls.name: cls for cls in (GMRES,)}


def get_adjoint_solver(solver: Any = "anderson", *, name: str = "solver", **overrides) -> Solver | LinearSolver:
    """An adjoint solver object from a name or an object.

    Args:
        solver: a forward solver name (:data:`deqlab.solvers.SOLVERS`), a linear solver name
            (:data:`LINEAR_SOLVERS`: ``"gmres"``), or a :class:`deqlab.solvers.Solver` or
            :class:`LinearSolver` object.
        name: the argument the user wrote, for error messages.
        **overrides: settings (``tol``, ``max_steps``) replacing the object's; None is ignored.

    Returns:
        A :class:`deqlab.solvers.Solver` or :class:`LinearSolver`.

    Raises:
        ValueError: an unknown name or object (the message lists the valid ones), or an invalid
            override.
    """
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if isinstance(solver, LinearSolver):
        return dataclasses.replace(solver, **overrides) if overrides else solver
    if isinstance(solver, str) and solver in LINEAR_SOLVERS:
        return LINEAR_SOLVERS[solver](**overrides)
    if isinstance(solver, Solver) or (isinstance(solver, str) and solver in SOLVERS):
        return get_solver(solver, name=name, **overrides)
    raise ValueError(
        f"`{name}` must be one of {sorted(SOLVERS) + sorted(LINEAR_SOLVERS)}, a deqlab.Solver "
        f"or a deqlab.implicit.LinearSolver object such as GMRES(restart=20), got {solver!r}."
    )


# --------------------------------------------------------------------------------------------
# Backward modes


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

    @property
    def level(self):
        """The matmul precision of f's evaluations (``precision``, or what ``tol`` needs)."""
        return _level(self.precision, self.tol, self.dtype)

    def forward(self, z0: Any = None, args: tuple | None = None, *, init_state: Any = _SAME,
                **options) -> Solution:
        """:func:`deqlab.solvers.solve` of this problem (``z0`` / ``args`` / ``init_state``
        replaced where given; ``options`` such as ``unrolled=True`` passed on). A mode that wraps
        the solve in ``jax.custom_vjp`` passes ``init_state`` in as a primal input (never through
        a closure: it may be traced)."""
        z0 = self.z0 if z0 is None else z0
        args = self.args if args is None else args
        init_state = self.init_state if init_state is _SAME else init_state
        options.setdefault("on_failure", "ignore")  # fixed_point reports the forward solve
        return solve(self.f, z0, *args, solver=self.solver, batch_axis=self.batch_axis,
                     precision=self.precision, init_state=init_state, **options)


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

            class OneStep(deqlab.implicit.Backward):
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
        _configuration_class(cls)

    def __new__(cls, *args, **kwargs):
        if cls.solve is Backward.solve:
            raise TypeError(
                f"{cls.__name__} cannot be instantiated: a deqlab.implicit.Backward subclass must "
                f"define solve(self, problem) -> Solution; {cls.__name__} does not define `solve`."
            )
        if "on_failure" in kwargs:
            raise TypeError(
                f"implicit.{cls.__name__}: `on_failure` is no longer a setting of the backward mode; "
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
        where = "implicit.Implicit"
        if self.solver is not None:
            get_adjoint_solver(self.solver, name="solver")
        if self.tol is not None:
            checks.positive_number(self.tol, "tol", where)
        if self.max_steps is not None:
            checks.positive_int(self.max_steps, "max_steps", where)

    def solve(self, problem):
        return _implicit(problem, self)


class Unrolled(Backward):
    """Backpropagation through ``max_steps`` forward iterations (``lax.scan``).

    Args:
    """

    name = "unrolled"

    def solve(self, problem):
        return problem.forward(unrolled=True)


class Phantom(Backward):
    """Phantom gradient (Geng et al. 2021): ``steps`` damped steps from z*, differentiated.

    Args:
        steps: number of steps k (>= 1).
        damping: step fraction in (0, 1].
    """

    steps: int = 5
    damping: float = 0.5
    name = "phantom"

    def __post_init__(self):
        checks.positive_int(self.steps, "steps", "implicit.Phantom")
        checks.unit_interval(self.damping, "damping", "implicit.Phantom")

    def solve(self, problem):
        sol = problem.forward(jax.lax.stop_gradient(problem.z0), jax.lax.stop_gradient(problem.args),
                              init_state=jax.lax.stop_gradient(problem.init_state))
        z = jax.lax.stop_gradient(sol.value)
        d = self.damping
        with precision_module.matmul_precision(problem.level):
            for _ in range(self.steps):
                z = jax.tree_util.tree_map(lambda a, b: (1 - d) * a + d * b, z, problem.f(z, *problem.args))
        return sol._replace(value=z)


class JacobianFree(Phantom):
    """Jacobian-free backpropagation (Fung et al. 2022): ``dL/da ~ g^T df/da (z*, a)``.

    The phantom gradient with one undamped step (``steps=1``, ``damping=1``, fixed): the inverse
    ``(I - J_f^T)^{-1}`` of the implicit gradient (003 Eq. 11) is replaced by the identity. Its
    error against the implicit gradient is of the order of ``||J_f||`` (the first Neumann term
    dropped); Fung et al. show it is still a descent direction when f is a contraction.

    Args:
    """

    steps: int = 1
    damping: float = 1.0
    name = "jacobian_free"

    def __post_init__(self):
        if self.steps != 1 or self.damping != 1.0:
            raise ValueError("implicit.JacobianFree: `steps` and `damping` are fixed at 1 (use "
                             f"deqlab.implicit.Phantom for other values), got steps={self.steps!r}, "
                             f"damping={self.damping!r}.")


class SHINE(Backward):
    """SHINE (Ramzi et al. 2022): the adjoint from the forward Broyden estimate.

    The forward solve must be :class:`deqlab.solvers.Broyden` (or any solver with an
    ``inverse_jacobian_transpose(state, x, steps)`` method, :meth:`Broyden.inverse_jacobian_transpose`);
    its final inverse-Jacobian estimate ``B ~ (J_f - I)^{-1}`` (of g = f - z, 003 Eq. 10) is
    kept, and the adjoint of 003 Eq. 11, ``u = (I - J_f^T)^{-1} g``, is approximated by
    ``-B^T g``: no adjoint solve. ``refine`` > 0 then takes that many steps ``u <- g + J_f^T u``
    from this estimate (one vector-Jacobian product each; SHINE's "refine" variant, which uses
    the estimate as the adjoint solve's start). The estimate is only as good as Broyden's secant
    updates along the forward path: Ramzi et al. add extra "outer-problem" updates (OPA) to
    improve it in the direction of ``g``; we do not.

    Args:
        refine: adjoint fixed-point steps after the estimate (>= 0).
    """

    refine: int = 0
    name = "shine"

    def __post_init__(self):
        checks.integer(self.refine, "refine", "implicit.SHINE", minimum=0)

    def solve(self, problem):
        if not callable(getattr(problem.solver, "inverse_jacobian_transpose", None)):
            raise checks.fail("solver", "'broyden' or a deqlab.solvers.Broyden (SHINE reuses its "
                              "inverse-Jacobian estimate; any solver with an "
                              "inverse_jacobian_transpose method works)", type(problem.solver).__name__,
                              "fixed_point")
        return _shine(problem, self)


#: The backward modes by name (each name is a shortcut for the object with its defaults).
BACKWARDS = {cls.name: cls for cls in (Implicit, Unrolled, Phantom, JacobianFree, SHINE)}


def get_backward(backward: Any) -> Backward:
    """A backward object from a name (its defaults) or an object (unchanged)."""
    if isinstance(backward, Backward):
        return backward
    if isinstance(backward, str) and backward in BACKWARDS:
        return BACKWARDS[backward]()
    raise ValueError(
        f"`backward` must be one of {list(BACKWARDS)} or an object such as "
        f"deqlab.implicit.Implicit(solver='gmres') (an instance of a deqlab.implicit.Backward "
        f"subclass), got {backward!r}."
    )


# --------------------------------------------------------------------------------------------
# Reporting failures


_HINTS = {
    "forward": "their values and gradients are not the equilibrium's. Raise max_steps, loosen tol, or "
               "check that f contracts (Solution.result reports each sample)",
    "adjoint": "their gradients are inaccurate. Raise the backward max_steps "
               "(deqlab.implicit.Implicit(max_steps=...)), try Implicit(solver='gmres'), or check that "
               "the forward solve converged",
}


def _signal(what, policy, result, residual):
    """``"warn"`` / ``"raise"`` for a solve behind a gradient (:func:`deqlab.failures.signal`)."""
    caller = "adjoint_solve" if what == "adjoint-alone" else "fixed_point"
    what = "adjoint" if what == "adjoint-alone" else what
    signal(caller, what, policy, result, residual, category=BackwardWarning, hint=_HINTS[what])


# --------------------------------------------------------------------------------------------
# The adjoint solve


def _check_cotangent(cotangent, z_star):
    got = jax.tree_util.tree_structure(cotangent)
    want = jax.tree_util.tree_structure(z_star)
    shapes = [jnp.shape(leaf) for leaf in jax.tree_util.tree_leaves(z_star)]
    if got != want or [jnp.shape(leaf) for leaf in jax.tree_util.tree_leaves(cotangent)] != shapes:
        given = [jnp.shape(leaf) for leaf in jax.tree_util.tree_leaves(cotangent)]
        raise ValueError(
            f"`cotangent` must have the structure and shapes of `z_star` ({want}, shapes {shapes}), "
            f"got {got} with shapes {given}."
        )


def adjoint_solve(
    f: Callable[..., Any],
    z_star: Any,
    args: tuple,
    cotangent: Any,
    *,
    solver: Any = "anderson",
    tol: float | None = None,
    max_steps: int | None = None,
    batch_axis: int | None = None,
    precision: Any = None,
    on_failure: str = "warn",
) -> Solution:
    """Solve the adjoint fixed point u = g + J_f(z*)^T u matrix-free (003 Eq. 11).

    Args:
        f, z_star, args: the map and its fixed point, ``z_star = f(z_star, *args)``.
        cotangent: g = dL/dz*, shaped like ``z_star``.
        solver: a forward solver name or object (the adjoint map is affine, so Anderson and
            Broyden are Krylov-like here), a :class:`LinearSolver` such as :class:`GMRES`, or
            ``"gmres"`` for ``GMRES()`` (:func:`get_adjoint_solver`).
        tol, max_steps, batch_axis: as in :func:`deqlab.solvers.solve` (``tol`` None: the
            solver's, else the dtype's default); for a linear solver ``tol`` is the relative
            residual of the linear system per sample, checked after the solve, and ``max_steps``
            bounds the operator applications (GMRES: restart cycles of ``restart`` products).
        precision: matmul precision of the vector-Jacobian products; None: what ``tol`` needs
            (:func:`deqlab.precision.required_precision`).
        on_failure: ``"warn"`` (default), ``"raise"``, ``"nan"`` or ``"ignore"``, as for
            :func:`fixed_point` (:mod:`deqlab.failures`).

    Returns:
        A :class:`~deqlab.solvers.Solution` whose ``value`` is u, with per-sample convergence.
    """
    check_policy(on_failure, "adjoint_solve")
    sol = _adjoint_solve(f, z_star, args, cotangent, solver, tol, max_steps, batch_axis, precision)
    _signal("adjoint-alone", on_failure, sol.result, sol.stats.best_residual)
    if on_failure == "nan":
        sol = sol._replace(value=nan_where_failed(sol.value, sol.result, batch_axis))
    return sol


def _adjoint_solve(f, z_star, args, cotangent, solver, tol, max_steps, batch_axis, precision):
    if not isinstance(args, tuple):
        raise checks.fail("args", "a tuple of the arguments of f", type(args).__name__, "adjoint_solve")
    _check_cotangent(cotangent, z_star)
    flattener = Flattener(z_star, batch_axis, "z_star")
    config = get_adjoint_solver(solver, tol=tol, max_steps=max_steps)
    resolved_tol = config.resolved_tol(flattener.dtype)
    level = precision_module.required_precision(resolved_tol, flattener.dtype) if precision is None else precision
    with precision_module.matmul_precision(level):
        _, vjp_z = jax.vjp(lambda z: f(z, *args), z_star)

    def adjoint_map(u):
        return jax.tree_util.tree_map(jnp.add, cotangent, vjp_z(u)[0])

    if isinstance(config, Solver):
        # A sample whose cotangent is NaN (a loss that is NaN there, e.g. on_failure="nan") keeps
        # NaN and is reported NONFINITE; the others are solved as usual.
        g_flat = flattener.flatten(cotangent)
        finite_rows = jnp.all(jnp.isfinite(g_flat), axis=1)
        clean = flattener.unflatten(jnp.where(finite_rows[:, None], g_flat, 0.0))
        sol = solve(adjoint_map, clean, solver=config, tol=resolved_tol, batch_axis=batch_axis,
                    on_failure="ignore")
        u_flat = flattener.flatten(sol.value) + jnp.where(finite_rows[:, None], 0.0, jnp.nan).astype(g_flat.dtype)
        result = jnp.where(flattener.per_sample(finite_rows), sol.result, Result.NONFINITE).astype(jnp.int32)
        return sol._replace(value=flattener.unflatten(u_flat), result=result)

    precision_module.check_tol(resolved_tol, flattener.dtype, "adjoint_solve")

    def operator(u):
        return jax.tree_util.tree_map(jnp.subtract, u, vjp_z(u)[0])

    u = config.solve(operator, cotangent, tol=resolved_tol, max_steps=config.max_steps)
    u_flat = flattener.flatten(u)
    residual = relative_residual(flattener.flatten(adjoint_map(u)), u_flat)
    finite = jnp.all(jnp.isfinite(u_flat), axis=1) & jnp.isfinite(residual)
    result = jnp.where(
        ~finite,
        Result.NONFINITE,
        jnp.where(residual <= resolved_tol, Result.SUCCESS, Result.MAX_STEPS_REACHED),
    ).astype(jnp.int32)
    per_sample = flattener.per_sample
    stats = SolveStats(
        steps=per_sample(jnp.full(result.shape, -1, jnp.int32)),  # GMRES does not report them
        nfe=jnp.asarray(-1, jnp.int32),
        residual_trace=per_sample(residual[None, :]),
        best_residual=per_sample(residual),
        residual=per_sample(residual),
        tol=jnp.asarray(resolved_tol, residual.dtype),
    )
    return Solution(u, per_sample(result), stats)


# --------------------------------------------------------------------------------------------
# fixed_point


def _close_over_nothing(f, z0, args, level):
    """``f`` with closed-over traced values hoisted into explicit arguments (``jax.closure_convert``).

    ``jax.custom_vjp`` cannot differentiate a value f closes over, so ``lambda z, x: w @ z + x``
    with ``w`` being differentiated would fail with an UnexpectedTracerError; after conversion
    ``w`` is one more argument, and its gradient is the implicit one. The converted f is traced
    once, here, at the matmul precision ``level`` of the solve; an f that closes over nothing
    traced is returned unchanged (and traced where it is used).
    """
    with precision_module.matmul_precision(level):
        closed, hoisted = jax.closure_convert(lambda z, *a: f(z, *a), z0, *args)
    if not hoisted:
        return f, args
    n_args = len(args)

    def converted(z, *all_args):
        return closed(z, *all_args[:n_args], *all_args[n_args:])

    return converted, tuple(args) + tuple(hoisted)


def fixed_point(
    f: Callable[..., Any],
    z0: Any,
    *args: Any,
    solver: Any = "anderson",
    tol: float | None = None,
    max_steps: int | None = None,
    batch_axis: int | None = None,
    backward: Any = "implicit",
    on_failure: str = "warn",
    has_aux: bool = False,
    precision: Any = None,
    init_state: Any = None,
    throw: Any = NOT_GIVEN,
) -> Solution:
    """Differentiable fixed point ``z* = f(z*, *args)`` (003 Theorem 1, Eq. 8 and 11).

    Gradients flow to every pytree in ``args`` and to any traced value ``f`` closes over (it is
    hoisted into an argument with ``jax.closure_convert``). ``z0`` receives a zero gradient in the
    implicit mode: the equilibrium does not depend on the initial guess.

    Args:
        f: the map ``f(z, *args)`` (or ``(z_next, aux)`` with ``has_aux=True``).
        z0: initial guess (pytree).
        *args: parameters and inputs (pytrees), differentiated.
        solver, tol, max_steps, batch_axis, precision, init_state: forward solve, as in
            :func:`deqlab.solvers.solve` (``tol`` None: the dtype's default; ``precision`` None:
            what ``tol`` needs, for the forward solve and the adjoint products alike).
        backward: :class:`Implicit` (default), :class:`Unrolled`, :class:`Phantom`,
            :class:`JacobianFree`, :class:`SHINE` (needs ``solver="broyden"``), one of their
            names for the defaults, or an instance of your own :class:`Backward` subclass.
        on_failure: what a sample whose forward or adjoint solve failed does: ``"warn"``
            (default, :class:`BackwardWarning` attributed to your line), ``"raise"``, ``"nan"``
            (its value and gradient NaN; no host callback) or ``"ignore"`` (module docstring,
            :mod:`deqlab.failures`).
        has_aux: ``f`` returns ``(z_next, aux)``; ``Solution.aux`` is ``aux`` at the returned
            value, differentiable (through z* implicitly).
        throw: removed in deqlab 0.6 (use ``on_failure``); given, it raises a TypeError that
            says so.

    Returns:
        The forward :class:`~deqlab.solvers.Solution`; differentiate through ``.value``.

    Raises:
        ValueError: on a malformed problem (as :func:`deqlab.solvers.solve`), or SHINE with a
            solver other than Broyden.
        SolverError: with ``on_failure="raise"``, when a solve failed: eagerly, raised directly
            after the computation returns; under ``jit`` / ``grad`` / ``vmap``, from a host
            callback (wrapped in JAX's runtime error). ``on_failure="warn"`` issues
            :class:`BackwardWarning` the same way.

    Caching and warm starts:
        The computation runs under an internal ``jax.jit`` keyed on the function object ``f``
        (by identity), the static configuration (solver object with its resolved ``tol`` and
        ``max_steps``, ``backward`` object, ``batch_axis``, ``has_aux``, ``precision``) and the
        non-array leaves of ``args``; the arrays of ``z0``, ``args`` and ``init_state`` are
        traced. A second eager call, or an eager ``jax.grad`` through it, with the same ``f``
        and shapes reuses the compiled computation (JAX caches the derivative of the internal
        jit too). A new ``f`` object each call compiles again; what ``f`` reads besides its
        arguments is part of the key, or the call runs uncached (as for
        :func:`deqlab.solvers.solve`). ``init_state`` (a
        previous ``Solution.state``) is an input of the differentiated computation, with a
        zero cotangent: warm starts work under ``grad``, ``jit`` and ``vmap``, and the implicit
        gradient does not depend on them (Unrolled differentiates through the iterations from
        the warm start, so its gradient misses the start's own dependence on ``args`` unless
        the start was computed differentiably, e.g. by an unrolled solve).

    Example:
        >>> import jax, jax.numpy as jnp, deqlab
        >>> def f(z, w, x):
        ...     return jnp.tanh(w * z + x)
        >>> loss = lambda w: jnp.sum(deqlab.fixed_point(f, jnp.zeros(3), w, jnp.ones(3)).value)
        >>> g = jax.grad(loss)(0.5)  # a second call reuses the compiled computation
    """
    mode = get_backward(backward)
    config = get_solver(solver, tol=tol, max_steps=max_steps)
    removed_throw(throw, "fixed_point")
    check_policy(on_failure, "fixed_point")
    if not isinstance(has_aux, bool):
        raise checks.fail("has_aux", "True or False", has_aux, "fixed_point")
    if not callable(f):
        raise ValueError(f"`f` must be callable as f(z, *args), got {type(f).__name__}.")
    # Validate the problem up front, so that errors name the user's arguments (the checks that
    # trace f run in _fixed_point_traced, once per compilation).
    probe = Flattener(z0, batch_axis)
    config = dataclasses.replace(config, tol=config.resolved_tol(probe.dtype))
    if isinstance(mode, SHINE) and not callable(getattr(config, "inverse_jacobian_transpose", None)):
        raise checks.fail("solver", "'broyden' or a deqlab.solvers.Broyden (SHINE reuses its "
                          "inverse-Jacobian estimate; any solver with an "
                          "inverse_jacobian_transpose method works)", type(config).__name__,
                          "fixed_point")
    _check_init_state(init_state, "fixed_point")
    _eager.check_finite([("z0", z0)] + [(f"args[{i}]", a) for i, a in enumerate(args)])
    # Called eagerly, failures are reported from the concrete results after the cached computation
    # returns (a warning or SolverError raised here, as without the cache); under an outer
    # transformation, from a host callback inside it (_signal).
    inside = _eager.is_traced((z0, args, init_state))
    sol = _eager.cached_call(
        _fixed_point_traced, f, (z0, args, init_state),
        dict(mode=mode, config=config, batch_axis=batch_axis, has_aux=has_aux, precision=precision,
             on_failure=on_failure, signal=inside),
    )
    if not inside:
        _signal("forward", on_failure, sol.result, sol.stats.best_residual)
    return sol


def _fixed_point_traced(f, z0, args, init_state, *, mode, config, batch_axis, has_aux, precision, on_failure,
                        signal):
    """The computation of :func:`fixed_point` (run under its cached jit, see ``deqlab._eager``);
    ``signal``: report forward failures here (under an outer transformation)."""
    probe = Flattener(z0, batch_axis)
    resolved_tol = config.tol
    check_problem(f, z0, args, has_aux)
    f, args = _close_over_nothing(f, z0, args, _level(precision, resolved_tol, probe.dtype))

    def step_map(z, *a):
        out = f(z, *a)
        return out[0] if has_aux else out

    problem = Problem(f=step_map, z0=z0, args=tuple(args), solver=config, batch_axis=batch_axis,
                      precision=precision, init_state=init_state, tol=resolved_tol, dtype=probe.dtype,
                      on_failure=on_failure)
    sol = mode.solve(problem)

    if signal:
        _signal("forward", on_failure, sol.result, sol.stats.best_residual)
    if on_failure == "nan":
        sol = sol._replace(value=nan_where_failed(sol.value, sol.result, batch_axis))
    if has_aux:
        with precision_module.matmul_precision(_level(precision, resolved_tol, probe.dtype)):
            aux = f(sol.value, *args)[1]
        sol = sol._replace(aux=aux, stats=sol.stats._replace(nfe=sol.stats.nfe + 1))
    return sol


def _zero_cotangent(tree):
    """Zero cotangents shaped like ``tree`` (float0 for integer and boolean leaves)."""
    def zero(leaf):
        if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
            return jnp.zeros_like(leaf)
        return np.zeros(jnp.shape(leaf), jax.dtypes.float0)

    return jax.tree_util.tree_map(zero, tree)


def _level(precision, tol, dtype):
    return precision_module.required_precision(tol, dtype) if precision is None else precision


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
        _signal("adjoint", problem.on_failure, adjoint.result, adjoint.stats.best_residual)
        u = adjoint.value
        if problem.on_failure == "nan":
            u = nan_where_failed(u, adjoint.result, problem.batch_axis)
        with precision_module.matmul_precision(_level(problem.precision, backward_options["tol"], problem.dtype)):
            _, vjp_args = jax.vjp(lambda a: f(z_star, *a), args)
        (args_bar,) = vjp_args(u)
        return jax.tree_util.tree_map(jnp.zeros_like, z0), args_bar, _zero_cotangent(init_state)

    equilibrium.defvjp(equilibrium_fwd, equilibrium_bwd)
    return equilibrium(problem.z0, problem.args, problem.init_state)


def _shine(problem, mode):
    """The forward Broyden solve under ``jax.custom_vjp``; the backward pass applies ``-B^T`` of its
    final inverse-Jacobian estimate (:meth:`deqlab.solvers.Broyden.inverse_jacobian_transpose`) to
    the cotangent, then ``mode.refine`` adjoint steps."""
    config = problem.solver
    f = problem.f

    @jax.custom_vjp
    def equilibrium(z0, args, init_state):
        return problem.forward(z0, args, init_state=init_state)

    def equilibrium_fwd(z0, args, init_state):
        sol = problem.forward(z0, args, init_state=init_state)
        # The solver's state is frozen per sample when it stops (Solver.freeze_state); its steps,
        # counted from the warm start's own pairs, tell how many of the shared buffer's pairs
        # belong to each sample's estimate.
        start = None if init_state is None else init_state.history
        return sol, (sol.value, z0, args, init_state, sol.state.history, sol.stats.steps, start)

    def equilibrium_bwd(residuals, cotangent):
        z_star, z0, args, init_state, history, steps, start = residuals
        flattener = Flattener(z_star, problem.batch_axis)
        g_flat = flattener.flatten(cotangent.value)
        u = flattener.unflatten(-config.inverse_jacobian_transpose(history, g_flat, steps=steps, start=start))
        with precision_module.matmul_precision(problem.level):
            _, vjp_z = jax.vjp(lambda z: f(z, *args), z_star)
            for _ in range(mode.refine):
                u = jax.tree_util.tree_map(jnp.add, cotangent.value, vjp_z(u)[0])
            _, vjp_args = jax.vjp(lambda a: f(z_star, *a), args)
        (args_bar,) = vjp_args(u)
        return jax.tree_util.tree_map(jnp.zeros_like, z0), args_bar, _zero_cotangent(init_state)

    equilibrium.defvjp(equilibrium_fwd, equilibrium_bwd)
    return equilibrium(problem.z0, problem.args, problem.init_state)


# --------------------------------------------------------------------------------------------
# Gradient check


def _tree_dot(a, b):
    return sum(jnp.vdot(x, y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def _tree_norm(a):
    return jnp.sqrt(_tree_dot(a, a))


def _worst(a: float, b: float) -> float:
    """max that propagates NaN (Python's max(0.0, nan) is 0.0: a NaN error must not read as 0)."""
    return float("nan") if math.isnan(a) or math.isnan(b) else max(a, b)


def check_gradients(
    f: Callable[..., Any],
    z0: Any,
    *args: Any,
    loss: Callable[[Any], jax.Array] | None = None,
    solver: Any = "anderson",
    tol: float | None = None,
    max_steps: int = 500,
    batch_axis: int | None = None,
    backward: Any = "implicit",
    eps: float = 1e-6,
    directions: int = 3,
    key: jax.Array | None = None,
) -> dict[str, float]:
    """Compare a backward mode's gradients with unrolled backprop and central finite differences.

    Uses ``loss(z*)`` (default: sum of squares of every leaf of z*), differentiated w.r.t. every
    argument in ``args``. Finite differences are directional: for ``directions`` random unit
    directions v in parameter space, (L(a + eps v) - L(a - eps v)) / (2 eps) is compared with
    <grad L, v>. Run it in float64 (``jax.config.update("jax_enable_x64", True)``): in float32 the
    finite differences alone have errors around 1e-3.

    Args:
        tol: forward (and adjoint) tolerance; None: 1e-12 in float64, the dtype's default otherwise.
        backward: the backward mode checked (name or object, as in :func:`fixed_point`).

    Returns:
        ``{"implicit_vs_unrolled", "implicit_vs_fd", "unrolled_vs_fd"}`` relative errors (the
        largest over directions for the finite-difference ones; "implicit" is the mode checked)
        and the forward and adjoint solves' worst residuals, ``"forward_residual"`` and
        ``"adjoint_residual"``. A gradient with a NaN gives a NaN error, never a small one.
    """
    if loss is None:
        loss = lambda z: sum(jnp.sum(leaf**2) for leaf in jax.tree_util.tree_leaves(z))  # noqa: E731
    directions = checks.positive_int(directions, "directions", "check_gradients")
    eps = checks.positive_number(eps, "eps", "check_gradients")
    key = jax.random.key(0) if key is None else checks.prng_key(key, "key", "check_gradients")
    mode = get_backward(backward)
    dtype = Flattener(z0, batch_axis).dtype
    if tol is None:
        tol = 1e-12 if jnp.dtype(dtype) == jnp.float64 else precision_module.default_tol(dtype)
    options = dict(solver=solver, tol=tol, max_steps=max_steps, batch_axis=batch_axis)

    def objective(args, backward):
        # failures are reported in the result (the residuals below)
        return loss(fixed_point(f, z0, *args, backward=backward, on_failure="ignore", **options).value)

    grad_checked = jax.jit(jax.grad(lambda a: objective(a, mode)))(args)
    grad_unrolled = jax.jit(jax.grad(lambda a: objective(a, Unrolled())))(args)
    value = jax.jit(lambda a: objective(a, Unrolled()))

    difference = jax.tree_util.tree_map(jnp.subtract, grad_checked, grad_unrolled)
    errors = {
        "implicit_vs_unrolled": float(_tree_norm(difference) / _tree_norm(grad_unrolled)),
        "implicit_vs_fd": 0.0,
        "unrolled_vs_fd": 0.0,
    }
    leaves, treedef = jax.tree_util.tree_flatten(args)
    for k in jax.random.split(key, directions):
        keys = jax.random.split(k, len(leaves))
        v = jax.tree_util.tree_unflatten(
            treedef, [jax.random.normal(kk, jnp.shape(x), jnp.result_type(x)) for kk, x in zip(keys, leaves)]
        )
        v = jax.tree_util.tree_map(lambda x: x / _tree_norm(v), v)
        plus = jax.tree_util.tree_map(lambda a, d: a + eps * d, args, v)
        minus = jax.tree_util.tree_map(lambda a, d: a - eps * d, args, v)
        fd = float((value(plus) - value(minus)) / (2 * eps))
        scale = max(abs(fd), 1e-300)
        errors["implicit_vs_fd"] = _worst(errors["implicit_vs_fd"], abs(float(_tree_dot(grad_checked, v)) - fd) / scale)
        errors["unrolled_vs_fd"] = _worst(errors["unrolled_vs_fd"], abs(float(_tree_dot(grad_unrolled, v)) - fd) / scale)

    @jax.jit
    def residuals(args):
        sol = solve(f, z0, *args, on_failure="ignore", **options)
        cotangent = jax.grad(loss)(sol.value)
        mode_solver = getattr(mode, "solver", None)  # Implicit's adjoint solver, if any
        adjoint_solver = solver if mode_solver is None else mode_solver
        adjoint = adjoint_solve(f, sol.value, args, cotangent, solver=adjoint_solver, tol=tol,
                                max_steps=max_steps, batch_axis=batch_axis, on_failure="ignore")
        return sol, adjoint

    sol, adjoint = residuals(args)
    errors["forward_residual"] = float(jnp.max(sol.stats.best_residual))
    errors["adjoint_residual"] = float(jnp.max(adjoint.stats.best_residual))
    return errors
