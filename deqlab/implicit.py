"""Differentiable fixed points: implicit, unrolled and phantom backward passes.

The implicit function theorem gives the gradient of a loss through an equilibrium z* = f(z*, a)
without storing the forward iterations (003 Theorem 1, Eq. 8): with g = dL/dz*,

.. math:: \\frac{dL}{da} = u^\\top \\frac{\\partial f}{\\partial a}(z^*, a),
          \\qquad u = g + J_f(z^*)^\\top u ,

the adjoint fixed point u being the solution of the linear system of 003 Eq. 11 written for f
instead of g_theta = f - z. We solve it matrix-free, with vector-Jacobian products only: either by
the same fixed-point solvers as the forward pass or by GMRES (Saad & Schultz 1986). No Jacobian is
ever formed.

Backward modes of :func:`fixed_point`:

- ``"implicit"``: the above, through ``jax.custom_vjp``. Memory does not depend on the number of
  forward iterations.
- ``"unrolled"``: reverse-mode differentiation through ``max_steps`` forward iterations
  (``lax.scan``; memory grows linearly with ``max_steps``). The reference the others are checked
  against.
- ``"phantom"``: solve without gradient, then take ``phantom_steps`` damped steps
  z <- (1 - d) z + d f(z, a) from z* with gradient (Geng et al. 2021), an inexpensive approximation.

The adjoint solve reports its own convergence: :func:`adjoint_solve` returns a full
:class:`~deqlab.solvers.Solution`, and inside the backward pass a failure is never silent (a
warning, or NaN gradients for the failing samples with ``backward_failure="nan"``) — unlike a
backward linear solve that returns zeros when it fails (google/jaxopt issue 466).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from deqlab.solvers import (
    Result,
    Solution,
    SolveStats,
    Flattener,
    get_solver,
    relative_residual,
    solve,
)

__all__ = ["fixed_point", "adjoint_solve", "check_gradients", "BACKWARDS", "BackwardWarning"]

BACKWARDS = ("implicit", "unrolled", "phantom")
_BACKWARD_FAILURES = ("warn", "nan", "ignore")

_GMRES_RESTART = 20
"""Krylov subspace size between GMRES restarts in the adjoint solve."""


class BackwardWarning(RuntimeWarning):
    """The adjoint (backward) solve of an implicit gradient did not converge."""


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
) -> Solution:
    """Solve the adjoint fixed point u = g + J_f(z*)^T u matrix-free (003 Eq. 11).

    Args:
        f, z_star, args: the map and its fixed point, ``z_star = f(z_star, *args)``.
        cotangent: g = dL/dz*, shaped like ``z_star``.
        solver: a forward solver name or object (the adjoint map is affine, so Anderson and
            Broyden are Krylov-like here), or ``"gmres"`` for ``jax.scipy.sparse.linalg.gmres``.
        tol, max_steps, batch_axis: as in :func:`deqlab.solvers.solve`; for GMRES ``tol`` is the
            relative residual of the linear system per sample, checked after the solve, and
            ``max_steps`` bounds the operator applications (restart cycles of 20 products).

    Returns:
        A :class:`~deqlab.solvers.Solution` whose ``value`` is u, with per-sample convergence.
    """
    _, vjp_z = jax.vjp(lambda z: f(z, *args), z_star)

    def adjoint_map(u):
        return jax.tree_util.tree_map(jnp.add, cotangent, vjp_z(u)[0])

    if solver != "gmres":
        return solve(
            adjoint_map, cotangent, solver=solver, tol=tol, max_steps=max_steps, batch_axis=batch_axis
        )

    config = get_solver("anderson", tol=tol, max_steps=max_steps)  # validates tol / max_steps

    def operator(u):
        return jax.tree_util.tree_map(jnp.subtract, u, vjp_z(u)[0])

    # jax's ``maxiter`` counts restart cycles of ``restart`` products each: divide, so that
    # ``max_steps`` bounds the operator applications as it does for the other solvers (a float32
    # adjoint that cannot reach ``tol`` otherwise costs ``restart`` times the budget).
    restart = min(_GMRES_RESTART, config.max_steps)
    u, _ = jax.scipy.sparse.linalg.gmres(
        operator, cotangent, tol=config.tol, atol=0.0, restart=restart,
        maxiter=-(-config.max_steps // restart),
    )
    flattener = Flattener(z_star, batch_axis)
    u_flat = flattener.flatten(u)
    residual = relative_residual(flattener.flatten(adjoint_map(u)), u_flat)
    finite = jnp.all(jnp.isfinite(u_flat), axis=1)
    result = jnp.where(
        ~finite,
        Result.NONFINITE,
        jnp.where(residual <= config.tol, Result.SUCCESS, Result.MAX_STEPS_REACHED),
    ).astype(jnp.int32)
    per_sample = flattener.per_sample
    stats = SolveStats(
        steps=per_sample(jnp.full(result.shape, -1, jnp.int32)),  # GMRES does not report them
        nfe=jnp.asarray(-1, jnp.int32),
        residual_trace=per_sample(residual[None, :]),
        best_residual=per_sample(residual),
        residual=per_sample(residual),
    )
    return Solution(u, per_sample(result), stats)


def _warn_backward(result, residual):
    result = np.atleast_1d(np.asarray(result))
    residual = np.atleast_1d(np.asarray(residual))
    failed = np.flatnonzero(result != Result.SUCCESS)
    if failed.size == 0:  # under vmap, lax.cond runs both branches
        return
    # The residual is rounded to its order of magnitude so that Python's warning filter shows a
    # repeated failure once instead of once per training step.
    exponent = int(np.ceil(np.log10(max(float(residual[failed].max()), 1e-300))))
    warnings.warn(
        f"implicit backward: the adjoint solve did not converge for some samples (worst relative "
        f"residual below 1e{exponent}); their gradients are inaccurate. Raise backward_max_steps, "
        "change backward_solver, or check that the forward solve converged. "
        "deqlab.implicit.adjoint_solve reports per-sample results.",
        BackwardWarning,
        stacklevel=2,
    )


def _validate_backward(backward, backward_failure, phantom_steps, phantom_damping):
    if backward not in BACKWARDS:
        raise ValueError(f"`backward` must be one of {list(BACKWARDS)}, got {backward!r}.")
    if backward_failure not in _BACKWARD_FAILURES:
        raise ValueError(
            f"`backward_failure` must be one of {list(_BACKWARD_FAILURES)}, got {backward_failure!r}."
        )
    if isinstance(phantom_steps, bool) or not isinstance(phantom_steps, (int, np.integer)) or phantom_steps < 1:
        raise ValueError(f"`phantom_steps` must be an integer >= 1, got {phantom_steps!r}.")
    if not isinstance(phantom_damping, (int, float)) or not 0 < phantom_damping <= 1:
        raise ValueError(f"`phantom_damping` must be in (0, 1], got {phantom_damping!r}.")


def fixed_point(
    f: Callable[..., Any],
    z0: Any,
    *args: Any,
    solver: Any = "anderson",
    tol: float | None = None,
    max_steps: int | None = None,
    batch_axis: int | None = None,
    backward: str = "implicit",
    backward_solver: Any = None,
    backward_tol: float | None = None,
    backward_max_steps: int | None = None,
    backward_failure: str = "warn",
    phantom_steps: int = 5,
    phantom_damping: float = 0.5,
) -> Solution:
    """Differentiable fixed point ``z* = f(z*, *args)`` (003 Theorem 1, Eq. 8 and 11).

    Gradients flow to every pytree in ``args``; parameters must be passed there, never closed over
    by ``f`` (``jax.custom_vjp`` rejects closed-over tracers). ``z0`` receives a zero gradient
    in the implicit mode: the equilibrium does not depend on the initial guess.

    Args:
        f: the map ``f(z, *args)``.
        z0: initial guess (pytree).
        *args: parameters and inputs (pytrees), differentiated.
        solver, tol, max_steps, batch_axis: forward solve, as in :func:`deqlab.solvers.solve`.
        backward: ``"implicit"`` (default), ``"unrolled"`` or ``"phantom"``.
        backward_solver: solver of the adjoint fixed point (name, object or ``"gmres"``); default
            the forward solver.
        backward_tol, backward_max_steps: default the forward ones.
        backward_failure: what a non-converged adjoint solve does: ``"warn"`` (a
            :class:`BackwardWarning`), ``"nan"`` (NaN gradients for the failing samples) or
            ``"ignore"``.
        phantom_steps, phantom_damping: the k steps and damping of the phantom gradient.

    Returns:
        The forward :class:`~deqlab.solvers.Solution`; differentiate through ``.value``.
    """
    _validate_backward(backward, backward_failure, phantom_steps, phantom_damping)
    config = get_solver(solver, tol=tol, max_steps=max_steps)
    forward = dict(solver=config, batch_axis=batch_axis)

    if backward == "unrolled":
        return solve(f, z0, *args, unrolled=True, **forward)

    if backward == "phantom":
        sol = solve(
            f, jax.lax.stop_gradient(z0), *jax.lax.stop_gradient(args), **forward
        )
        z = jax.lax.stop_gradient(sol.value)
        for _ in range(phantom_steps):
            fz = f(z, *args)
            z = jax.tree_util.tree_map(lambda a, b: (1 - phantom_damping) * a + phantom_damping * b, z, fz)
        return sol._replace(value=z)

    if backward_solver is None:
        backward_solver = config
    if backward_solver != "gmres":
        backward_solver = get_solver(backward_solver)
    backward_options = dict(
        solver=backward_solver,
        tol=config.tol if backward_tol is None else backward_tol,
        max_steps=config.max_steps if backward_max_steps is None else backward_max_steps,
        batch_axis=batch_axis,
    )
    if backward_solver != "gmres":
        get_solver(backward_solver, tol=backward_options["tol"], max_steps=backward_options["max_steps"])

    @jax.custom_vjp
    def equilibrium(z0, args):
        return solve(f, z0, *args, **forward)

    def equilibrium_fwd(z0, args):
        sol = solve(f, z0, *args, **forward)
        return sol, (sol.value, z0, args)

    def equilibrium_bwd(residuals, cotangent):
        z_star, z0, args = residuals
        adjoint = adjoint_solve(f, z_star, args, cotangent.value, **backward_options)
        u = adjoint.value
        failed = adjoint.result != Result.SUCCESS
        if backward_failure == "nan":
            flattener = Flattener(z_star, batch_axis)
            u_flat = flattener.flatten(u)
            mask = jnp.reshape(failed, (-1,))
            u = flattener.unflatten(jnp.where(mask[:, None], jnp.nan, u_flat))
        elif backward_failure == "warn":
            jax.lax.cond(
                jnp.any(failed),
                lambda: jax.debug.callback(_warn_backward, adjoint.result, adjoint.stats.best_residual),
                lambda: None,
            )
        _, vjp_args = jax.vjp(lambda a: f(z_star, *a), args)
        (args_bar,) = vjp_args(u)
        return jax.tree_util.tree_map(jnp.zeros_like, z0), args_bar

    equilibrium.defvjp(equilibrium_fwd, equilibrium_bwd)
    return equilibrium(z0, args)


def _tree_dot(a, b):
    return sum(jnp.vdot(x, y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def _tree_norm(a):
    return jnp.sqrt(_tree_dot(a, a))


def check_gradients(
    f: Callable[..., Any],
    z0: Any,
    *args: Any,
    loss: Callable[[Any], jax.Array] | None = None,
    solver: Any = "anderson",
    tol: float = 1e-12,
    max_steps: int = 500,
    batch_axis: int | None = None,
    backward_solver: Any = None,
    eps: float = 1e-6,
    directions: int = 3,
    key: jax.Array | None = None,
) -> dict[str, float]:
    """Compare implicit gradients with unrolled backprop and central finite differences.

    Uses ``loss(z*)`` (default: sum of squares of every leaf of z*), differentiated w.r.t. every
    argument in ``args``. Finite differences are directional: for ``directions`` random unit
    directions v in parameter space, (L(a + eps v) - L(a - eps v)) / (2 eps) is compared with
    <grad L, v>. Run it in float64 (``jax.config.update("jax_enable_x64", True)``): in float32 the
    finite differences alone have errors around 1e-3.

    Returns:
        ``{"implicit_vs_unrolled", "implicit_vs_fd", "unrolled_vs_fd"}`` relative errors (the
        largest over directions for the finite-difference ones) and the forward and adjoint
        solves' worst residuals, ``"forward_residual"`` and ``"adjoint_residual"``.
    """
    if loss is None:
        loss = lambda z: sum(jnp.sum(leaf**2) for leaf in jax.tree_util.tree_leaves(z))  # noqa: E731
    if isinstance(directions, bool) or not isinstance(directions, int) or directions < 1:
        raise ValueError(f"`directions` must be an integer >= 1, got {directions!r}.")
    if not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"`eps` must be a positive number, got {eps!r}.")
    options = dict(solver=solver, tol=tol, max_steps=max_steps, batch_axis=batch_axis)

    def objective(args, backward):
        return loss(fixed_point(f, z0, *args, backward=backward, backward_solver=backward_solver, **options).value)

    grad_implicit = jax.jit(jax.grad(lambda a: objective(a, "implicit")))(args)
    grad_unrolled = jax.jit(jax.grad(lambda a: objective(a, "unrolled")))(args)
    value = jax.jit(lambda a: objective(a, "implicit"))

    difference = jax.tree_util.tree_map(jnp.subtract, grad_implicit, grad_unrolled)
    errors = {
        "implicit_vs_unrolled": float(_tree_norm(difference) / _tree_norm(grad_unrolled)),
        "implicit_vs_fd": 0.0,
        "unrolled_vs_fd": 0.0,
    }
    key = jax.random.PRNGKey(0) if key is None else key
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
        errors["implicit_vs_fd"] = max(errors["implicit_vs_fd"], abs(float(_tree_dot(grad_implicit, v)) - fd) / scale)
        errors["unrolled_vs_fd"] = max(errors["unrolled_vs_fd"], abs(float(_tree_dot(grad_unrolled, v)) - fd) / scale)

    @jax.jit
    def residuals(args):
        sol = solve(f, z0, *args, **options)
        cotangent = jax.grad(loss)(sol.value)
        adjoint = adjoint_solve(
            f, sol.value, args, cotangent, solver=solver if backward_solver is None else backward_solver,
            tol=tol, max_steps=max_steps, batch_axis=batch_axis,
        )
        return sol, adjoint

    sol, adjoint = residuals(args)
    errors["forward_residual"] = float(jnp.max(sol.stats.best_residual))
    errors["adjoint_residual"] = float(jnp.max(adjoint.stats.best_residual))
    return errors
