""":func:`adjoint_solve`: the adjoint fixed point ``u = g + J_f(z*)^T u`` (003 Eq. 11), matrix-free."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from deqlab import _eager, checks
from deqlab import precision as precision_module
from deqlab.backward.base import report
from deqlab.backward.linear import get_adjoint_solver
from deqlab.failures import Result, check_policy, nan_where_failed
from deqlab.solvers import Solution, Solver, SolveStats, relative_residual, solve
from deqlab.solvers.flatten import Flattener

__all__ = ["adjoint_solve"]

_SAMPLES = "deqlab_samples"  # the vmap axis of a linear solver's per-sample solves


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
    solver: Any = "adaptive",
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
            ``"gmres"`` for ``GMRES()`` (:func:`get_adjoint_solver`). The object holds ``tol``
            (None: the dtype's default) and ``max_steps``; for a linear solver ``tol`` is the
            relative residual of the linear system per sample, checked after the solve, and
            ``max_steps`` bounds the operator applications (GMRES: restart cycles of
            ``restart`` products). A forward solver is resolved by its
            :meth:`~deqlab.solvers.Solver.for_linear_map`: the default ``"adaptive"`` runs
            Anderson from the first step (Broyden for an expensive f), so the returned
            ``Solution.state`` is theirs, not an ``AdaptiveState``.
        batch_axis: as in :func:`deqlab.solvers.solve`.
        precision: matmul precision of the vector-Jacobian products; None: what the solver's
            tolerance needs (:func:`deqlab.precision.required_precision`).
        on_failure: ``"warn"`` (default), ``"raise"``, ``"nan"``, ``"ignore"`` or ``"callback"``,
            as for :func:`fixed_point` (:mod:`deqlab.failures`).

    Returns:
        A :class:`~deqlab.solvers.Solution` whose ``value`` is u, with per-sample convergence.
        Called outside ``jit``, the computation is compiled once per ``f`` and configuration and
        reused, as :func:`deqlab.solvers.solve`'s is (the same cache and the same rules for what
        ``f`` reads).

    Raises:
        ValueError: ``args`` not a tuple, a ``cotangent`` of another structure or shape than
            ``z_star``, an unknown solver or ``on_failure``.
        SolverError: with ``on_failure="raise"``, when some sample's adjoint solve failed.

    Example:
        The gradient of L = sum(z*) with respect to w, assembled by hand from the adjoint (003
        Eq. 8 and 11), is the one :func:`fixed_point` computes:

        >>> import jax, jax.numpy as jnp, deqlab
        >>> from deqlab.backward import GMRES, adjoint_solve
        >>> f = lambda z, w, x: jnp.tanh(w * z + x)
        >>> w, x = 0.5, jnp.ones(3)
        >>> z_star = deqlab.solve(f, jnp.zeros(3), w, x).value
        >>> g = jnp.ones(3)   # dL/dz*
        >>> u = adjoint_solve(f, z_star, (w, x), g, solver=GMRES(tol=1e-5, max_steps=200)).value
        >>> grad_w = jax.vjp(lambda w: f(z_star, w, x), w)[1](u)[0]   # u^T df/dw (003 Eq. 8)
        >>> direct = jax.grad(lambda w: deqlab.fixed_point(f, jnp.zeros(3), w, x).value.sum())(w)
        >>> bool(jnp.allclose(grad_w, direct, rtol=1e-3))
        True
    """
    check_policy(on_failure, "adjoint_solve")
    if not isinstance(args, tuple):
        raise checks.fail("args", "a tuple of the arguments of f", type(args).__name__, "adjoint_solve")
    _check_cotangent(cotangent, z_star)
    Flattener(z_star, batch_axis, "z_star")  # z_star's and batch_axis's checks, before anything is traced
    # Under the eager cache, as solve is: called eagerly, the adjoint's own solve is then traced
    # once per problem (its map closes over f's VJP, which the cache could not key on).
    sol = _eager.cached_call(_adjoint_traced, f, (z_star, args, cotangent, get_adjoint_solver(solver)),
                             dict(batch_axis=batch_axis, precision=precision))
    report("adjoint-alone", on_failure, sol.result, sol.stats.best_residual)
    if on_failure == "nan":
        sol = sol._replace(value=nan_where_failed(sol.value, sol.result, batch_axis))
    return sol


def _adjoint_traced(f, z_star, args, cotangent, solver, *, batch_axis, precision):
    return _adjoint_solve(f, z_star, args, cotangent, solver, batch_axis, precision)


def _adjoint_solve(f, z_star, args, cotangent, solver, batch_axis, precision):
    # args and cotangent were checked by adjoint_solve (before anything is traced), or come from
    # the implicit rule (a tuple and f's own cotangent)
    def transposed_jacobian(level):
        with precision_module.matmul_precision(level):
            _, vjp_z = jax.vjp(lambda z: f(z, *args), z_star)
        return lambda u: vjp_z(u)[0]

    return _linear_fixed_point(transposed_jacobian, z_star, cotangent, solver, batch_axis, precision, "adjoint_solve")


def _tangent_solve(f, z_star, args, rhs, solver, batch_axis, precision):
    """The tangent fixed point v = rhs + J_f(z*) v, the forward-mode twin of :func:`adjoint_solve`
    (the derivative of z* along a tangent of the arguments, with rhs = (df/dargs) dargs)."""

    def jacobian(level):
        with precision_module.matmul_precision(level):
            _, jvp_z = jax.linearize(lambda z: f(z, *args), z_star)
        return jvp_z

    return _linear_fixed_point(jacobian, z_star, rhs, solver, batch_axis, precision, "fixed_point")


def _linear_fixed_point(make_product, z_star, rhs, solver, batch_axis, precision, where):
    """u = rhs + A u per sample, where ``make_product(level)`` returns u -> A u at matmul precision
    ``level``; A is J_f(z*)^T (adjoint) or J_f(z*) (tangent). A forward solver iterates the affine
    map; a :class:`LinearSolver` solves (I - A) u = rhs."""
    flattener = Flattener(z_star, batch_axis, "z_star")
    config = get_adjoint_solver(solver)
    resolved_tol = config.resolved_tol(flattener.dtype)
    level = precision_module.required_precision(resolved_tol, flattener.dtype) if precision is None else precision
    product = make_product(level)

    def affine_map(u):
        return jax.tree_util.tree_map(jnp.add, rhs, product(u))

    if isinstance(config, Solver):
        # A sample whose right-hand side is NaN (a loss that is NaN there) keeps NaN and is
        # reported NONFINITE; the others are solved as usual.
        g_flat = flattener.flatten(rhs)
        finite_rows = jnp.all(jnp.isfinite(g_flat), axis=1)
        clean = flattener.unflatten(jnp.where(finite_rows[:, None], g_flat, 0.0))

        def affine_rows(u_flat):  # the map on flattened rows, as Solver.for_map sees a forward one
            return flattener.flatten(affine_map(flattener.unflatten(u_flat)))

        # a linear fixed point: the default (Adaptive) runs Anderson without its trial
        linear = config.replace(tol=resolved_tol).for_linear_map(affine_rows, flattener.flatten(clean))
        sol = solve(affine_map, clean, solver=linear, batch_axis=batch_axis, on_failure="ignore")
        u_flat = flattener.flatten(sol.value) + jnp.where(finite_rows[:, None], 0.0, jnp.nan).astype(g_flat.dtype)
        result = jnp.where(flattener.per_sample(finite_rows), sol.result, Result.NONFINITE).astype(jnp.int32)
        return sol._replace(value=flattener.unflatten(u_flat), result=result)

    precision_module.check_tol(resolved_tol, flattener.dtype, where)

    def operator(u):
        return jax.tree_util.tree_map(jnp.subtract, u, product(u))

    # One sample at a time, batched by vmap: each sample has its own Krylov space, inner products
    # and stopping, so no sample's solve depends on its neighbours (a batched GMRES couples them
    # through its inner products). The operator is evaluated once for the whole batch: the lanes'
    # vectors are gathered into the (B, D) rows f acts on, and each lane takes back its own row.
    def operator_on_sample(v):
        rows = jax.lax.all_gather(v, _SAMPLES)
        return flattener.flatten(operator(flattener.unflatten(rows)))[jax.lax.axis_index(_SAMPLES)]

    def solve_sample(b):
        return config.solve(operator_on_sample, b, tol=resolved_tol, max_steps=config.max_steps)

    u_flat = jax.vmap(solve_sample, axis_name=_SAMPLES)(flattener.flatten(rhs))
    u = flattener.unflatten(u_flat)
    residual = relative_residual(flattener.flatten(affine_map(u)), u_flat)
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
