""":func:`fixed_point`, the differentiable entry point: a forward solve whose gradient is the
chosen backward mode's."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from deqlab import _eager, checks
from deqlab import precision as precision_module
from deqlab.backward.base import Problem, _matmul_level, report
from deqlab.backward.registry import get_backward
from deqlab.backward.shine import SHINE
from deqlab.failures import check_policy, nan_where_failed
from deqlab.solvers import Solution, check_problem, get_solver
from deqlab.solvers.api import _check_init_state
from deqlab.solvers.budget import check_budget
from deqlab.solvers.flatten import Flattener

__all__ = ["fixed_point"]


def _close_over_nothing(f, z0, args, level):
    """``f`` with closed-over traced values hoisted into explicit arguments (``jax.closure_convert``).

    A custom derivative rule cannot differentiate a value f closes over, so ``lambda z, x: w @ z + x``
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
    solver: Any = "adaptive",
    batch_axis: int | None = None,
    backward: Any = "implicit",
    on_failure: str = "warn",
    has_aux: bool = False,
    precision: Any = None,
    init_state: Any = None,
    budget: Any = None,
) -> Solution:
    """Differentiable fixed point ``z* = f(z*, *args)`` (003 Theorem 1, Eq. 8 and 11).

    Gradients flow to every pytree in ``args`` and to any traced value ``f`` closes over (it is
    hoisted into an argument with ``jax.closure_convert``). ``z0`` receives a zero gradient in the
    implicit mode: the equilibrium does not depend on the initial guess.

    Args:
        f: the map ``f(z, *args)`` (or ``(z_next, aux)`` with ``has_aux=True``).
        z0: initial guess (pytree).
        *args: parameters and inputs (pytrees), differentiated.
        solver, batch_axis, precision, init_state: forward solve, as in
            :func:`deqlab.solvers.solve` (the solver object holds ``tol`` and ``max_steps``;
            ``precision`` None: what the solver's tolerance needs, for the forward solve and the
            adjoint products alike).
        budget: a :class:`deqlab.solvers.Budget`: the forward solve's iteration limit (at most the
            solver's ``max_steps``) and tolerance for this call, traced (changing them does not
            compile again, :class:`deqlab.solvers.Budget`); None: the solver's. The backward
            mode's own solves keep their static settings (an implicit adjoint solve: the
            solver's ``max_steps`` and ``tol``, or ``Implicit(max_steps=..., tol=...)``).
        backward: :class:`Implicit` (default), :class:`Unrolled`, :class:`Phantom`,
            :class:`JacobianFree`, :class:`SHINE` (needs ``solver="broyden"``), one of their
            names for the defaults, or an instance of your own :class:`Backward` subclass.
        on_failure: what a sample whose forward or adjoint solve failed does: ``"warn"``
            (default; called eagerly, :class:`BackwardWarning` for the forward solve, attributed
            to your line; inside a transformation nothing in the program: ``Solution.result``
            records the forward solve, and a failed adjoint solve, which always runs inside the
            gradient's program, is reported nowhere; use ``"callback"`` or ``"nan"`` to see it),
            ``"raise"``, ``"nan"`` (a failed forward sample's value NaN with no gradient through
            it, so a loss on the value masked by ``converged`` trains; a failed adjoint makes
            the gradient NaN; ``aux`` is computed at the value before the replacement, then NaN
            for the failed samples),
            ``"ignore"`` or ``"callback"`` (warn from a host callback inside compiled programs)
            (:mod:`deqlab.backward`, :mod:`deqlab.failures`).
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
            :class:`BackwardWarning` eagerly; ``"callback"`` issues it from inside programs.

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
        >>> print(f"{float(g):.3f}")
        0.592
    """
    mode = get_backward(backward)
    config = get_solver(solver)
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
    budget = check_budget(budget, "fixed_point")
    _eager.check_finite([("z0", z0)] + [(f"args[{i}]", a) for i, a in enumerate(args)])
    # Called eagerly, failures are reported from the concrete results after the cached computation
    # returns (a warning or SolverError raised here, as without the cache); under an outer
    # transformation, as deqlab.failures.signal says (nothing in the program for "warn").
    inside = _eager.is_traced((z0, args, init_state))
    sol = _eager.cached_call(
        _fixed_point_traced, f, (z0, args, init_state, budget, config),
        dict(mode=mode, batch_axis=batch_axis, has_aux=has_aux, precision=precision,
             on_failure=on_failure, signal=inside),
    )
    if not inside:
        report("forward", on_failure, sol.result, sol.stats.best_residual)
    return sol


def _checked_mode_output(mode, sol, z0):
    """A backward mode's ``solve`` must return a :class:`Solution` whose value is shaped like
    ``z0``: anything else is a mistake in the mode, named here rather than downstream."""
    where = f"{type(mode).__name__}.solve"
    if not isinstance(sol, Solution):
        raise TypeError(f"{where} must return a deqlab.solvers.Solution (problem.forward(...), or such a "
                        f"solution with its value replaced: sol._replace(value=...)), got {type(sol).__name__}.")
    got = [jnp.shape(leaf) for leaf in jax.tree_util.tree_leaves(sol.value)]
    want = [jnp.shape(leaf) for leaf in jax.tree_util.tree_leaves(z0)]
    same_tree = jax.tree_util.tree_structure(sol.value) == jax.tree_util.tree_structure(z0)
    if not same_tree or got != want:
        raise ValueError(f"{where} returned a value of structure {jax.tree_util.tree_structure(sol.value)} "
                         f"and shapes {got}; it must have z0's, {jax.tree_util.tree_structure(z0)} and {want}.")
    return sol


def _fixed_point_traced(f, z0, args, init_state, budget, config, *, mode, batch_axis, has_aux, precision, on_failure,
                        signal):
    """The computation of :func:`fixed_point` (run under its cached jit, see ``deqlab._eager``);
    ``signal``: report forward failures here (under an outer transformation)."""
    probe = Flattener(z0, batch_axis)
    resolved_tol = config.tol
    check_problem(f, z0, args, has_aux)
    f, args = _close_over_nothing(f, z0, args, _matmul_level(precision, resolved_tol, probe.dtype))

    def step_map(z, *a):
        out = f(z, *a)
        return out[0] if has_aux else out

    problem = Problem(f=step_map, z0=z0, args=tuple(args), solver=config, batch_axis=batch_axis,
                      precision=precision, init_state=init_state, tol=resolved_tol, dtype=probe.dtype,
                      on_failure=on_failure, budget=budget)
    sol = _checked_mode_output(mode, mode.solve(problem), z0)

    if signal:
        report("forward", on_failure, sol.result, sol.stats.best_residual)
    if has_aux:  # at the value itself, before "nan" replaces a failed sample's
        with precision_module.matmul_precision(_matmul_level(precision, resolved_tol, probe.dtype)):
            aux = f(sol.value, *args)[1]
        sol = sol._replace(aux=aux, stats=sol.stats._replace(nfe=sol.stats.nfe + 1))
    if on_failure == "nan":
        sol = sol._replace(value=nan_where_failed(sol.value, sol.result, batch_axis))
        if has_aux:
            sol = sol._replace(aux=_nan_where_failed_per_sample(sol.aux, sol.result, batch_axis, probe.batch))
    return sol


def _nan_where_failed_per_sample(aux, result, batch_axis, batch):
    """``"nan"`` for ``aux``: its leaves that carry the batch axis (size ``batch`` there) get NaN in
    the failed samples' entries; leaves without it (a batch statistic) are NaN if any sample
    failed; integer leaves are left as they are."""
    failed = jnp.any(result != 0)

    def poison(leaf):
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
            return leaf
        ndim = jnp.ndim(leaf)
        if batch_axis is not None and -ndim <= batch_axis < ndim and jnp.shape(leaf)[batch_axis] == batch:
            return nan_where_failed(leaf, result, batch_axis)
        return jnp.where(failed, jnp.asarray(jnp.nan, jnp.result_type(leaf)), leaf)

    return jax.tree_util.tree_map(poison, aux)


