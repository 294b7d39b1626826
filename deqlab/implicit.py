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
``"implicit"``, ``"unrolled"``, ``"phantom"`` are shortcuts for their defaults):

- :class:`Implicit` ``(solver, tol, max_steps, on_failure)``: the above, through
  ``jax.custom_vjp``. Memory does not depend on the number of forward iterations.
- :class:`Unrolled` ``(on_failure)``: reverse-mode differentiation through ``max_steps`` forward
  iterations (``lax.scan``; memory grows linearly with ``max_steps``). The reference the others
  are checked against.
- :class:`Phantom` ``(steps, damping, on_failure)``: solve without gradient, then take ``steps``
  damped steps z <- (1 - d) z + d f(z, a) from z* with gradient (Geng et al. 2021), an inexpensive
  approximation.
- :class:`JacobianFree` ``(on_failure)``: one undamped step ``f(z*, a)`` from the detached z*, i.e.
  the implicit gradient with ``(I - J^T)^{-1}`` replaced by the identity (Fung et al. 2022,
  "JFB: Jacobian-free backpropagation for implicit networks"); the phantom gradient with no
  Neumann terms. One vector-Jacobian product; Fung et al. prove it a descent direction when f is
  a contraction.
- :class:`SHINE` ``(refine, on_failure)``: the adjoint solve replaced by the forward Broyden
  solve's own inverse-Jacobian estimate, ``u = -B^T g`` with ``B ~ (J_f - I)^{-1}`` (Ramzi et al.
  2022, "SHINE: SHaring the INverse Estimate from the forward pass for bi-level optimization and
  implicit models"), optionally followed by ``refine`` fixed-point steps of the adjoint
  iteration from there (their "refine" variant). Needs ``solver="broyden"``.

Failures are never silent. ``on_failure`` is one policy for both solves behind a gradient: a
sample whose forward solve failed (its value, hence its gradient, is not the equilibrium's) and a
sample whose adjoint solve failed (its gradient is inexact). ``"warn"`` (default) issues a
:class:`BackwardWarning`; ``"nan"`` makes the failing samples' values and gradients NaN, so a
loss that uses them is NaN; ``"raise"`` raises :class:`~deqlab.solvers.SolverError` (directly
when the values are concrete; inside ``jit`` the error surfaces from a host callback, wrapped in
JAX's runtime error); ``"ignore"`` leaves the per-sample ``Solution.result`` as the only record.
Compare a backward linear solve that returns zeros when it fails (google/jaxopt issue 466).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import _eager, checks
from deqlab import precision as precision_module
from deqlab.solvers import (
    Broyden,
    Flattener,
    Result,
    Solution,
    SolverError,
    SolveStats,
    check_problem,
    get_solver,
    relative_residual,
    solve,
)

__all__ = [
    "fixed_point",
    "adjoint_solve",
    "check_gradients",
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

#: What a failed solve does to a gradient (see the module docstring).
FAILURE_POLICIES = ("warn", "nan", "raise", "ignore")

_GMRES_RESTART = 20
"""Krylov subspace size between GMRES restarts in the adjoint solve."""


class BackwardWarning(RuntimeWarning):
    """A solve behind a gradient (forward or adjoint) did not converge for some samples."""


def _check_policy(value, where):
    return checks.choice(value, "on_failure", FAILURE_POLICIES, where)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Implicit:
    """Implicit backward pass: solve the adjoint fixed point u = g + J_f(z*)^T u (003 Eq. 11).

    Args:
        solver: adjoint solver: a name of :data:`deqlab.solvers.SOLVERS`, a solver object, or
            ``"gmres"``; None: the forward solver.
        tol, max_steps: of the adjoint solve; None: the forward ones.
        on_failure: ``"warn"``, ``"nan"``, ``"raise"`` or ``"ignore"`` (module docstring).
    """

    solver: Any = None
    tol: float | None = None
    max_steps: int | None = None
    on_failure: str = "warn"
    name = "implicit"

    def __post_init__(self):
        where = "implicit.Implicit"
        if self.solver is not None and self.solver != "gmres":
            get_solver(self.solver, name="solver")
        if self.tol is not None:
            checks.positive_number(self.tol, "tol", where)
        if self.max_steps is not None:
            checks.positive_int(self.max_steps, "max_steps", where)
        _check_policy(self.on_failure, where)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Unrolled:
    """Backpropagation through ``max_steps`` forward iterations (``lax.scan``).

    Args:
        on_failure: policy for samples whose forward solve failed (module docstring).
    """

    on_failure: str = "warn"
    name = "unrolled"

    def __post_init__(self):
        _check_policy(self.on_failure, "implicit.Unrolled")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Phantom:
    """Phantom gradient (Geng et al. 2021): ``steps`` damped steps from z*, differentiated.

    Args:
        steps: number of steps k (>= 1).
        damping: step fraction in (0, 1].
        on_failure: policy for samples whose forward solve failed (module docstring).
    """

    steps: int = 5
    damping: float = 0.5
    on_failure: str = "warn"
    name = "phantom"

    def __post_init__(self):
        checks.positive_int(self.steps, "steps", "implicit.Phantom")
        checks.unit_interval(self.damping, "damping", "implicit.Phantom")
        _check_policy(self.on_failure, "implicit.Phantom")


@dataclasses.dataclass(frozen=True, kw_only=True)
class JacobianFree(Phantom):
    """Jacobian-free backpropagation (Fung et al. 2022): ``dL/da ~ g^T df/da (z*, a)``.

    The phantom gradient with one undamped step (``steps=1``, ``damping=1``, fixed): the inverse
    ``(I - J_f^T)^{-1}`` of the implicit gradient (003 Eq. 11) is replaced by the identity. Its
    error against the implicit gradient is of the order of ``||J_f||`` (the first Neumann term
    dropped); Fung et al. show it is still a descent direction when f is a contraction.

    Args:
        on_failure: policy for samples whose forward solve failed (module docstring).
    """

    steps: int = 1
    damping: float = 1.0
    on_failure: str = "warn"
    name = "jacobian_free"

    def __post_init__(self):
        if self.steps != 1 or self.damping != 1.0:
            raise ValueError("implicit.JacobianFree: `steps` and `damping` are fixed at 1 (use "
                             f"deqlab.implicit.Phantom for other values), got steps={self.steps!r}, "
                             f"damping={self.damping!r}.")
        _check_policy(self.on_failure, "implicit.JacobianFree")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SHINE:
    """SHINE (Ramzi et al. 2022): the adjoint from the forward Broyden estimate.

    The forward solve must be :class:`deqlab.solvers.Broyden`; its final inverse-Jacobian estimate
    ``B ~ (J_f - I)^{-1}`` (of g = f - z, 003 Eq. 10) is kept, and the adjoint of 003 Eq. 11,
    ``u = (I - J_f^T)^{-1} g``, is approximated by ``-B^T g``: no adjoint solve. ``refine`` > 0
    then takes that many steps ``u <- g + J_f^T u`` from this estimate (one vector-Jacobian product
    each; SHINE's "refine" variant, which uses the estimate as the adjoint solve's start). The
    estimate is only as good as Broyden's secant updates along the forward path: Ramzi et al. add
    extra "outer-problem" updates (OPA) to improve it in the direction of ``g``; we do not.

    Args:
        refine: adjoint fixed-point steps after the estimate (>= 0).
        on_failure: policy for samples whose forward solve failed (module docstring).
    """

    refine: int = 0
    on_failure: str = "warn"
    name = "shine"

    def __post_init__(self):
        checks.integer(self.refine, "refine", "implicit.SHINE", minimum=0)
        _check_policy(self.on_failure, "implicit.SHINE")


#: The backward modes by name (each name is a shortcut for the object with its defaults).
BACKWARDS = {cls.name: cls for cls in (Implicit, Unrolled, Phantom, JacobianFree, SHINE)}


def get_backward(backward: Any) -> Implicit | Unrolled | Phantom | SHINE:
    """A backward object from a name (its defaults) or an object (unchanged)."""
    if isinstance(backward, (Implicit, Unrolled, Phantom, SHINE)):
        return backward
    if isinstance(backward, str) and backward in BACKWARDS:
        return BACKWARDS[backward]()
    raise ValueError(
        f"`backward` must be one of {list(BACKWARDS)} or an object such as "
        f"deqlab.implicit.Implicit(solver='gmres'), got {backward!r}."
    )


# --------------------------------------------------------------------------------------------
# Reporting failures


def _magnitude(residual: np.ndarray) -> str:
    """Order of magnitude of the worst residual, rounded so that a warning repeated every training
    step shows once under Python's default filter."""
    finite = residual[np.isfinite(residual)]
    if finite.size < residual.size or finite.size == 0:
        return "non-finite"
    return f"below 1e{int(math.ceil(math.log10(max(float(finite.max()), 1e-300))))}"


def _report(what, policy, result, residual):
    """Host side of a failure report: warn, or raise :class:`SolverError`."""
    result = np.atleast_1d(np.asarray(result))
    residual = np.atleast_1d(np.asarray(residual, dtype=np.float64))
    failed = np.flatnonzero(result != Result.SUCCESS)
    if failed.size == 0:  # under vmap, lax.cond runs both branches
        return
    if policy == "raise":
        shown = ", ".join(
            f"sample {i}: {Result(int(result[i])).name.lower()} (residual {residual[i]:.3e})" for i in failed[:8]
        )
        more = f" and {failed.size - 8} more" if failed.size > 8 else ""
        raise SolverError(
            f"fixed_point: the {what} solve failed for {failed.size}/{result.size} samples: {shown}{more}."
        )
    hint = (
        "their values and gradients are not the equilibrium's. Raise max_steps, loosen tol, or check "
        "that f contracts (Solution.result reports each sample)"
        if what == "forward"
        else "their gradients are inaccurate. Raise the backward max_steps "
        "(deqlab.implicit.Implicit(max_steps=...)), try Implicit(solver='gmres'), or check that the "
        "forward solve converged"
    )
    warnings.warn(
        f"fixed_point: the {what} solve did not converge for some samples (worst relative residual "
        f"{_magnitude(residual[failed])}); {hint}.",
        BackwardWarning,
        stacklevel=2,
    )


def _signal(what, policy, result, residual):
    """Apply ``policy`` to the per-sample results of a solve: warn or raise (NaN is the caller's)."""
    if policy in ("ignore", "nan"):
        return
    if not checks.is_traced((result, residual)):
        _report(what, policy, result, residual)
        return
    jax.lax.cond(
        jnp.any(result != Result.SUCCESS),
        lambda: jax.debug.callback(lambda r, s: _report(what, policy, r, s), result, residual),
        lambda: None,
    )


def _nan_where_failed(tree, result, batch_axis, name):
    """NaN in every entry of the failing samples of ``tree``.

    Multiplied, not selected: a ``where`` would cut the gradient of the failing samples (the NaN
    branch is a constant), and even an added NaN leaves the derivative at 1; times NaN, both the
    value and every gradient through it are NaN, whatever the loss.
    """
    flattener = Flattener(tree, batch_axis, name)
    flat = flattener.flatten(tree)
    failed = jnp.reshape(result != Result.SUCCESS, (-1,))
    return flattener.unflatten(flat * jnp.where(failed[:, None], jnp.nan, 1.0).astype(flat.dtype))


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
) -> Solution:
    """Solve the adjoint fixed point u = g + J_f(z*)^T u matrix-free (003 Eq. 11).

    Args:
        f, z_star, args: the map and its fixed point, ``z_star = f(z_star, *args)``.
        cotangent: g = dL/dz*, shaped like ``z_star``.
        solver: a forward solver name or object (the adjoint map is affine, so Anderson and
            Broyden are Krylov-like here), or ``"gmres"`` for ``jax.scipy.sparse.linalg.gmres``.
        tol, max_steps, batch_axis: as in :func:`deqlab.solvers.solve` (``tol`` None: the
            dtype's default); for GMRES ``tol`` is the relative residual of the linear system per
            sample, checked after the solve, and ``max_steps`` bounds the operator applications
            (restart cycles of 20 products).
        precision: matmul precision of the vector-Jacobian products; None: what ``tol`` needs
            (:func:`deqlab.precision.required_precision`).

    Returns:
        A :class:`~deqlab.solvers.Solution` whose ``value`` is u, with per-sample convergence.
    """
    if not isinstance(args, tuple):
        raise checks.fail("args", "a tuple of the arguments of f", type(args).__name__, "adjoint_solve")
    _check_cotangent(cotangent, z_star)
    flattener = Flattener(z_star, batch_axis, "z_star")
    if solver == "gmres":
        config = get_solver("anderson", tol=tol, max_steps=max_steps)  # validates tol / max_steps
    else:
        config = get_solver(solver, tol=tol, max_steps=max_steps)
    resolved_tol = config.resolved_tol(flattener.dtype)
    level = precision_module.required_precision(resolved_tol, flattener.dtype) if precision is None else precision
    with precision_module.matmul_precision(level):
        _, vjp_z = jax.vjp(lambda z: f(z, *args), z_star)

    def adjoint_map(u):
        return jax.tree_util.tree_map(jnp.add, cotangent, vjp_z(u)[0])

    if solver != "gmres":
        # A sample whose cotangent is NaN (a loss that is NaN there, e.g. on_failure="nan") keeps
        # NaN and is reported NONFINITE; the others are solved as usual.
        g_flat = flattener.flatten(cotangent)
        finite_rows = jnp.all(jnp.isfinite(g_flat), axis=1)
        clean = flattener.unflatten(jnp.where(finite_rows[:, None], g_flat, 0.0))
        sol = solve(adjoint_map, clean, solver=config, tol=resolved_tol, batch_axis=batch_axis)
        u_flat = flattener.flatten(sol.value) + jnp.where(finite_rows[:, None], 0.0, jnp.nan).astype(g_flat.dtype)
        result = jnp.where(flattener.per_sample(finite_rows), sol.result, Result.NONFINITE).astype(jnp.int32)
        return sol._replace(value=flattener.unflatten(u_flat), result=result)

    precision_module.check_tol(resolved_tol, flattener.dtype, "adjoint_solve")

    def operator(u):
        return jax.tree_util.tree_map(jnp.subtract, u, vjp_z(u)[0])

    # jax's ``maxiter`` counts restart cycles of ``restart`` products each: divide, so that
    # ``max_steps`` bounds the operator applications as it does for the other solvers (a float32
    # adjoint that cannot reach ``tol`` otherwise costs ``restart`` times the budget).
    restart = min(_GMRES_RESTART, config.max_steps)
    u, _ = jax.scipy.sparse.linalg.gmres(
        operator, cotangent, tol=resolved_tol, atol=0.0, restart=restart,
        maxiter=-(-config.max_steps // restart),
    )
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
    has_aux: bool = False,
    precision: Any = None,
    init_state: Any = None,
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
            :class:`JacobianFree`, :class:`SHINE` (needs ``solver="broyden"``), or one of their
            names for the defaults. Its ``on_failure`` decides what failed solves do.
        has_aux: ``f`` returns ``(z_next, aux)``; ``Solution.aux`` is ``aux`` at the returned
            value, differentiable (through z* implicitly).

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
        jit too). A new ``f`` object each call compiles again; arrays ``f`` reads from globals
        or mutable objects are frozen at compilation (pass them in ``args``). ``init_state`` (a
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
    if not callable(f):
        raise ValueError(f"`f` must be callable as f(z, *args), got {type(f).__name__}.")
    # Validate the problem up front, so that errors name the user's arguments (the checks that
    # trace f run in _fixed_point_traced, once per compilation).
    probe = Flattener(z0, batch_axis)
    config = dataclasses.replace(config, tol=config.resolved_tol(probe.dtype))
    if isinstance(mode, SHINE) and not isinstance(config, Broyden):
        raise checks.fail("solver", "'broyden' or a deqlab.solvers.Broyden (SHINE reuses its "
                          "inverse-Jacobian estimate)", type(config).__name__, "fixed_point")
    _eager.check_finite([("z0", z0)] + [(f"args[{i}]", a) for i, a in enumerate(args)])
    # Called eagerly, failures are reported from the concrete results after the cached computation
    # returns (a warning or SolverError raised here, as without the cache); under an outer
    # transformation, from a host callback inside it (_signal).
    inside = _eager.is_traced((z0, args, init_state))
    sol = _eager.cached_call(
        _fixed_point_traced, f, (z0, args, init_state),
        dict(mode=mode, config=config, batch_axis=batch_axis, has_aux=has_aux, precision=precision,
             signal=inside),
    )
    if not inside:
        _signal("forward", mode.on_failure, sol.result, sol.stats.best_residual)
    return sol


def _fixed_point_traced(f, z0, args, init_state, *, mode, config, batch_axis, has_aux, precision, signal):
    """The computation of :func:`fixed_point` (run under its cached jit, see :mod:`deqlab._eager`);
    ``signal``: report forward failures here (under an outer transformation)."""
    probe = Flattener(z0, batch_axis)
    resolved_tol = config.tol
    forward = dict(solver=config, batch_axis=batch_axis, precision=precision)
    check_problem(f, z0, args, has_aux)
    f, args = _close_over_nothing(f, z0, args, _level(precision, resolved_tol, probe.dtype))

    def step_map(z, *a):
        out = f(z, *a)
        return out[0] if has_aux else out

    if isinstance(mode, Unrolled):
        sol = solve(step_map, z0, *args, unrolled=True, init_state=init_state, **forward)
    elif isinstance(mode, Phantom):
        sol = solve(
            step_map, jax.lax.stop_gradient(z0), *jax.lax.stop_gradient(args),
            init_state=jax.lax.stop_gradient(init_state), **forward
        )
        z = jax.lax.stop_gradient(sol.value)
        d = mode.damping
        with precision_module.matmul_precision(_level(precision, resolved_tol, probe.dtype)):
            for _ in range(mode.steps):
                z = jax.tree_util.tree_map(lambda a, b: (1 - d) * a + d * b, z, step_map(z, *args))
        sol = sol._replace(value=z)
    elif isinstance(mode, SHINE):
        sol = _shine(step_map, z0, args, mode, forward, resolved_tol, probe.dtype, batch_axis, init_state)
    else:
        sol = _implicit(step_map, z0, args, mode, forward, resolved_tol, probe.dtype, batch_axis, init_state)

    if signal:
        _signal("forward", mode.on_failure, sol.result, sol.stats.best_residual)
    if mode.on_failure == "nan":
        sol = sol._replace(value=_nan_where_failed(sol.value, sol.result, batch_axis, "z0"))
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


def _implicit(f, z0, args, mode, forward, tol, dtype, batch_axis, init_state):
    """The forward solve under ``jax.custom_vjp``, with the adjoint solve as its backward pass."""
    backward_solver = forward["solver"] if mode.solver is None else mode.solver
    if backward_solver != "gmres":
        backward_solver = get_solver(backward_solver, name="solver")
    backward_options = dict(
        solver=backward_solver,
        tol=tol if mode.tol is None else mode.tol,
        max_steps=forward["solver"].max_steps if mode.max_steps is None else mode.max_steps,
        batch_axis=batch_axis,
        precision=forward["precision"],
    )

    @jax.custom_vjp
    def equilibrium(z0, args, init_state):
        return solve(f, z0, *args, init_state=init_state, **forward)

    def equilibrium_fwd(z0, args, init_state):
        sol = solve(f, z0, *args, init_state=init_state, **forward)
        return sol, (sol.value, z0, args, init_state)

    def equilibrium_bwd(residuals, cotangent):
        z_star, z0, args, init_state = residuals
        adjoint = adjoint_solve(f, z_star, args, cotangent.value, **backward_options)
        _signal("adjoint", mode.on_failure, adjoint.result, adjoint.stats.best_residual)
        u = adjoint.value
        if mode.on_failure == "nan":
            u = _nan_where_failed(u, adjoint.result, batch_axis, "cotangent")
        with precision_module.matmul_precision(_level(forward["precision"], backward_options["tol"], dtype)):
            _, vjp_args = jax.vjp(lambda a: f(z_star, *a), args)
        (args_bar,) = vjp_args(u)
        return jax.tree_util.tree_map(jnp.zeros_like, z0), args_bar, _zero_cotangent(init_state)

    equilibrium.defvjp(equilibrium_fwd, equilibrium_bwd)
    return equilibrium(z0, args, init_state)


def _shine(f, z0, args, mode, forward, tol, dtype, batch_axis, init_state):
    """The forward Broyden solve under ``jax.custom_vjp``; the backward pass applies ``-B^T`` of its
    final history (``SolverState.history`` = (us, vs, count, ...), B = -I + sum u_i v_i^T) to the
    cotangent, then ``mode.refine`` adjoint steps."""
    config = forward["solver"]
    level = _level(forward["precision"], tol, dtype)

    @jax.custom_vjp
    def equilibrium(z0, args, init_state):
        return solve(f, z0, *args, init_state=init_state, **forward)

    def equilibrium_fwd(z0, args, init_state):
        sol = solve(f, z0, *args, init_state=init_state, **forward)
        us, vs = sol.state.history[:2]
        # The pair counter is shared by the batch (solvers.Broyden), but a sample's history stops
        # with it: after s recorded steps its current cycle holds ((s - 1) mod m) + 1 pairs.
        # A warm start continues the history of init_state, whose (batch-shared) counter held c0
        # pairs: after s more steps the cycle holds ((c0 + s - 1) mod m) + 1 (c0 for s = 0).
        steps = jnp.reshape(sol.stats.steps, (-1,))  # () without a batch axis: one row
        start = jnp.zeros((), jnp.int32) if init_state is None else jnp.asarray(init_state.history[2], jnp.int32)
        count = jnp.where(steps > 0, (start + steps - 1) % config.m + 1, start)
        return sol, (sol.value, z0, args, init_state, us, vs, count)

    def equilibrium_bwd(residuals, cotangent):
        z_star, z0, args, init_state, us, vs, count = residuals
        flattener = Flattener(z_star, batch_axis)
        work = precision_module.working_dtype(flattener.dtype)
        used = (jnp.arange(config.m)[None, :] < count[:, None]).astype(work)
        g_flat = flattener.flatten(cotangent.value)
        u = flattener.unflatten(-Broyden._apply_transpose(us, vs, used, g_flat))
        with precision_module.matmul_precision(level):
            _, vjp_z = jax.vjp(lambda z: f(z, *args), z_star)
            for _ in range(mode.refine):
                u = jax.tree_util.tree_map(jnp.add, cotangent.value, vjp_z(u)[0])
            _, vjp_args = jax.vjp(lambda a: f(z_star, *a), args)
        (args_bar,) = vjp_args(u)
        return jax.tree_util.tree_map(jnp.zeros_like, z0), args_bar, _zero_cotangent(init_state)

    equilibrium.defvjp(equilibrium_fwd, equilibrium_bwd)
    return equilibrium(z0, args, init_state)


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
    quiet = dataclasses.replace(mode, on_failure="ignore")  # failures are reported in the result

    def objective(args, backward):
        return loss(fixed_point(f, z0, *args, backward=backward, **options).value)

    grad_checked = jax.jit(jax.grad(lambda a: objective(a, quiet)))(args)
    grad_unrolled = jax.jit(jax.grad(lambda a: objective(a, Unrolled(on_failure="ignore"))))(args)
    value = jax.jit(lambda a: objective(a, Unrolled(on_failure="ignore")))

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
        sol = solve(f, z0, *args, **options)
        cotangent = jax.grad(loss)(sol.value)
        adjoint_solver = solver if not isinstance(mode, Implicit) or mode.solver is None else mode.solver
        adjoint = adjoint_solve(f, sol.value, args, cotangent, solver=adjoint_solver, tol=tol,
                                max_steps=max_steps, batch_axis=batch_axis)
        return sol, adjoint

    sol, adjoint = residuals(args)
    errors["forward_residual"] = float(jnp.max(sol.stats.best_residual))
    errors["adjoint_residual"] = float(jnp.max(adjoint.stats.best_residual))
    return errors
