""":func:`solve`, the entry point of the forward solvers, and the checks of a problem."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from deqlab import _eager, checks
from deqlab import precision as precision_module
from deqlab.failures import check_policy, nan_where_failed, signal
from deqlab.solvers.base import Solver
from deqlab.solvers.budget import Budget, check_budget, limits
from deqlab.solvers.flatten import Flattener
from deqlab.solvers.loop import _run, batched_hooks, check_checkpoint
from deqlab.solvers.registry import get_solver
from deqlab.solvers.solution import Solution, SolverState, SolveStats

__all__ = ["solve", "check_problem"]


def solve(
    f: Callable[..., Any],
    z0: Any,
    *args: Any,
    solver: str | Solver = "adaptive",
    batch_axis: int | None = None,
    on_failure: str = "warn",
    unrolled: bool = False,
    checkpoint: int | str | None = None,
    has_aux: bool = False,
    precision: Any = None,
    init_state: SolverState | None = None,
    budget: Budget | None = None,
) -> Solution:
    """Find ``z* = f(z*, *args)`` starting from ``z0`` (003 Eq. 4-6).

    Args:
        f: the map, called as ``f(z, *args)``; must return a pytree shaped like ``z`` (or a pair
            ``(z_next, aux)`` with ``has_aux=True``).
        z0: initial guess (an array or a pytree of real floating arrays).
        *args: further arguments of ``f`` (parameters, inputs), passed explicitly.
        solver: ``"adaptive"`` (the default: plain iteration, Anderson or Broyden, chosen per
            solve by :class:`Adaptive`'s written rule), ``"picard"``, ``"anderson"``,
            ``"broyden"`` (the solver with its defaults) or a
            configured object such as ``Anderson(m=5, tol=1e-6, max_steps=200)``, or an instance
            of your own :class:`Solver` subclass. The object holds every setting of the solve:
            ``tol`` (None: the default of z0's dtype, :func:`deqlab.precision.default_tol`,
            float64 1e-10, float32 1e-5, 16-bit 1e-2 / 5e-2; a tolerance the dtype cannot reach
            warns once, :class:`deqlab.precision.PrecisionWarning`), ``max_steps`` and ``stop``
            (the stopping rule, see :mod:`deqlab.solvers`); change them with
            :meth:`Solver.replace`.
        batch_axis: axis of every leaf of ``z0`` that indexes independent samples, or None.
        on_failure: what a sample that did not converge does: ``"warn"`` (default; called
            eagerly, a :class:`~deqlab.failures.SolverWarning` attributed to your line; inside
            your ``jit``, nothing is added to the program and ``Solution.result`` is the record,
            see :func:`deqlab.failures.check`), ``"raise"``
            (:class:`~deqlab.failures.SolverError`), ``"nan"`` (its value becomes NaN),
            ``"ignore"`` (``Solution.result`` is the only record) or ``"callback"`` (warn from a
            host callback inside compiled programs); the same policy as
            :func:`deqlab.backward.fixed_point` and :class:`deqlab.nn.DEQ`
            (:mod:`deqlab.failures`). Only ``"raise"`` and ``"callback"`` put a host callback in
            a compiled program.
        unrolled: iterate with ``lax.scan`` for exactly ``max_steps`` (frozen samples masked) so
            that reverse-mode autodiff can go through the iterations.
        checkpoint: with ``unrolled=True``, rematerialise the scan in blocks (``jax.checkpoint``)
            so that reverse mode stores a carry per block and one block's iterations at a time:
            None (default, every iteration stored), ``"sqrt"`` (blocks of ceil(sqrt(max_steps))
            steps, memory O(sqrt(max_steps))) or an integer >= 1 (the block size, capped at
            ``max_steps``). The same iterations run: values and results are those of the plain
            unrolled loop; the backward pass recomputes the forward once more.
        has_aux: ``f`` returns ``(z_next, aux)``; ``Solution.aux`` is ``aux`` at the returned
            value (one more evaluation of f, counted in ``nfe``).
        precision: matmul precision of f's evaluations (``"default"``, ``"high"``,
            ``"highest"``); None: what ``tol`` needs (:func:`deqlab.precision.required_precision`;
            it matters on TPUs and TF32 GPUs only, see :mod:`deqlab.precision`).
        init_state: ``Solution.state`` of an earlier solve of the same problem, to continue it
            (its iterate replaces ``z0``'s values; ``z0`` still gives the structure).
        budget: a :class:`~deqlab.solvers.Budget`: this call's iteration limit (at most
            the solver's ``max_steps``, the cap) and tolerance as traced values, so that changing
            them does not compile again (:class:`deqlab.solvers.Budget`); None: the solver's.
    Returns:
        :class:`Solution` with per-sample ``result``, ``converged``, ``stats`` and ``state``.

    Raises:
        ValueError: on a malformed problem (f's output structure, shapes or dtypes, NaN or inf
            in concrete inputs, a bad ``init_state`` or option).
        SolverError: with ``on_failure="raise"``, when some sample failed (eagerly, raised
            after the computation returns; inside your ``jit``, from a host callback, wrapped in
            JAX's runtime error; :func:`deqlab.failures.check` under ``checkify`` raises with the
            message intact and no callback).

    Caching:
        The computation runs under an internal ``jax.jit`` whose cache key is the function
        object ``f`` (by identity), the static configuration (the solver object with its
        ``tol`` / ``max_steps`` / ``stop``, ``batch_axis``, ``unrolled``, ``checkpoint``, ``has_aux``,
        ``precision``) and the non-array leaves of ``args`` (Python numbers stay Python numbers
        and are part of the key); the array leaves of ``z0``, ``args`` and ``init_state`` are
        traced. A second eager call with the same ``f`` and shapes costs the jit dispatch
        (milliseconds instead of a compilation); ``jax.jit``, ``jax.vmap`` and ``jax.grad`` from
        outside compose with it. A new ``f`` object each call (a ``lambda`` written in the call)
        compiles again. What ``f`` reads besides its arguments is part of the key: arrays from its
        closure or globals by identity (rebinding ``W`` compiles again), scalars by value, the
        functions it calls followed likewise; an ``f`` that reads state the key cannot follow (a
        callable object such as an ``nnx.Module``, a list) runs uncached, so it is never stale, and
        says so once per function (:class:`~deqlab.solvers.UncachedCallWarning`, with the reason).
        NumPy arrays changed in place are not seen: pass changing arrays in ``args``. Checks on
        concrete values and the failure policy run outside the jit (see ``deqlab._eager``).

    Example:
        >>> import jax.numpy as jnp, deqlab
        >>> f = lambda z, x: 0.5 * jnp.tanh(z) + x
        >>> sol = deqlab.solve(f, jnp.zeros(3), jnp.ones(3))
        >>> bool(sol.converged)
        True
    """
    check_policy(on_failure, "solve")
    if not isinstance(has_aux, bool):
        raise checks.fail("has_aux", "True or False", has_aux, "solve")
    if not isinstance(unrolled, bool):
        raise checks.fail("unrolled", "True or False", unrolled, "solve")
    checkpoint = check_checkpoint(checkpoint, "solve")
    if checkpoint is not None and not unrolled:
        raise checks.fail("checkpoint", "None unless unrolled=True (it checkpoints the unrolled scan)",
                          checkpoint, "solve")
    _check_init_state(init_state, "solve")
    budget = check_budget(budget, "solve")
    config = get_solver(solver)
    if batch_axis is not None and (isinstance(batch_axis, bool) or not isinstance(batch_axis, int)):
        raise ValueError(f"`batch_axis` must be an int or None, got {batch_axis!r}.")
    if not callable(f):
        raise ValueError(f"`f` must be callable as f(z, *args), got {type(f).__name__}.")
    flattener = Flattener(z0, batch_axis)
    precision_module.check_tol(config.resolved_tol(flattener.dtype), flattener.dtype, "solve")
    # Checks on concrete values run here, eagerly; the structural checks (check_problem) run where
    # f is traced, in _solve_traced, once per compilation.
    _eager.check_finite([("z0", z0)] + [(f"args[{i}]", a) for i, a in enumerate(args)])
    # The solver is an input, not a key: its real-number settings are pytree leaves (traced where
    # they are arrays or tracers, part of the key by value where they are Python numbers).
    solution = _eager.cached_call(
        _solve_traced, f, (z0, args, init_state, budget, config),
        dict(batch_axis=batch_axis, unrolled=unrolled, checkpoint=checkpoint, has_aux=has_aux,
             precision=precision),
    )
    signal("solve", "", on_failure, solution.result, solution.stats.best_residual)
    if on_failure == "nan":
        solution = solution._replace(value=nan_where_failed(solution.value, solution.result, batch_axis))
    return solution


def _check_init_state(init_state, where):
    """``init_state`` must be None or a :class:`SolverState` (a hint for a whole ``Solution``)."""
    if init_state is None or isinstance(init_state, SolverState):
        return
    hint = " (pass its .state)" if isinstance(init_state, Solution) else ""
    raise ValueError(f"{where}: `init_state` must be the `state` of an earlier Solution of this problem "
                     f"(a deqlab.solvers.SolverState) or None, got {type(init_state).__name__}{hint}.")


def _solve_traced(f, z0, args, init_state, budget, config, *, batch_axis, unrolled, has_aux, precision,
                  checkpoint=None):
    """The computation of :func:`solve` (run under its cached jit, see ``deqlab._eager``)."""
    flattener = Flattener(z0, batch_axis)
    check_problem(f, z0, args, has_aux)
    resolved_tol = config.resolved_tol(flattener.dtype)
    level = precision_module.required_precision(resolved_tol, flattener.dtype) if precision is None else precision

    def func(z_flat):
        with precision_module.matmul_precision(level):
            out = f(flattener.unflatten(z_flat), *args)
        return flattener.flatten(out[0] if has_aux else out)

    z0_flat = flattener.flatten(z0)
    config = config.for_map(func, z0_flat)  # e.g. Adaptive: Broyden for an expensive map
    history = None
    if init_state is not None:
        if not isinstance(init_state, SolverState) or jnp.shape(init_state.z) != z0_flat.shape:
            raise ValueError(
                f"`init_state` must be the `state` of an earlier Solution of this problem "
                f"(a SolverState with z of shape {z0_flat.shape}), got {type(init_state).__name__}."
            )
        expected = jax.eval_shape(batched_hooks(config)[0], z0_flat, z0_flat)
        if jax.tree_util.tree_structure(init_state.history) != jax.tree_util.tree_structure(expected):
            raise ValueError(
                f"`init_state` holds the history of another solver than {type(config).__name__}."
            )
        for (path, leaf), want in zip(jax.tree_util.tree_leaves_with_path(init_state.history),
                                      jax.tree_util.tree_leaves(expected)):
            if jnp.shape(leaf) != want.shape or jnp.result_type(leaf) != want.dtype:
                raise ValueError(
                    f"`init_state.history{jax.tree_util.keystr(path)}` has shape {jnp.shape(leaf)} and dtype "
                    f"{jnp.result_type(leaf)}, but {type(config).__name__} with these settings keeps shape "
                    f"{want.shape} and dtype {want.dtype} (another history size `m`, batch or dtype, or a "
                    "state saved by deqlab < 0.9, whose solvers shared counters across the batch)."
                )
        z0_flat, history = init_state.z.astype(z0_flat.dtype), init_state.history
    step_limit, tol = limits(budget, config, resolved_tol, flattener.dtype)
    value, result, stats, state = _run(config, tol, func, z0_flat, unrolled, history, checkpoint, step_limit)
    aux = None
    nfe = stats["nfe"]
    if has_aux:
        with precision_module.matmul_precision(level):
            aux = f(flattener.unflatten(value), *args)[1]
        nfe = nfe + 1
    solution = Solution(
        value=flattener.unflatten(value),
        result=flattener.per_sample(result),
        stats=SolveStats(
            steps=flattener.per_sample(stats["steps"]),
            nfe=nfe,
            residual_trace=flattener.per_sample(stats["trace"]),
            best_residual=flattener.per_sample(stats["best_res"]),
            residual=flattener.per_sample(stats["res"]),
            tol=jnp.asarray(tol, precision_module.working_dtype(flattener.dtype)),
            error_estimate=None if stats["err"] is None else flattener.per_sample(stats["err"]),
        ),
        state=state,
        aux=aux,
    )
    return solution



def check_problem(f: Callable[..., Any], z0: Any, args: tuple, has_aux: bool = False) -> None:
    """Check that ``f(z0, *args)`` returns what a solve needs, and name what is wrong if not.

    f is evaluated abstractly (``jax.eval_shape``, no computation); concrete inputs are also
    checked for NaN and inf.

    Args:
        f: the map of :func:`solve`.
        z0: the initial guess.
        args: the further arguments of ``f``, a tuple.
        has_aux: ``f`` returns ``(z_next, aux)``.

    Raises:
        ValueError: ``f`` is not callable or cannot be evaluated, returns another structure,
            shape or a non-floating dtype than ``z0``, or a concrete input holds NaN or inf.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.solvers import check_problem
        >>> check_problem(lambda z, x: jnp.tanh(z + x), jnp.zeros(3), (jnp.ones(3),))   # passes
        >>> try:
        ...     check_problem(lambda z, x: jnp.tanh(z + x), jnp.zeros(3), (jnp.ones(4),))
        ... except ValueError as error:   # z + x: shapes (3,) and (4,) do not broadcast
        ...     print(str(error).split(":")[0])
        `f` could not be evaluated as f(z0, *args)
    """
    if not callable(f):
        raise ValueError(f"`f` must be callable as f(z, *args), got {type(f).__name__}.")
    try:
        out = jax.eval_shape(lambda z, a: f(z, *a), z0, args)
    except (TypeError, ValueError) as err:
        raise ValueError(f"`f` could not be evaluated as f(z0, *args): {err}") from err
    if has_aux:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ValueError("with `has_aux=True`, `f` must return a pair (z_next, aux).")
        out = out[0]
    in_struct = jax.tree_util.tree_structure(z0)
    out_struct = jax.tree_util.tree_structure(out)
    if in_struct != out_struct:
        hint = " (if f returns (z, aux), pass has_aux=True)" if isinstance(out, tuple) else ""
        raise ValueError(
            f"`f` must return the same pytree structure as `z0`: got {out_struct}, "
            f"expected {in_struct}{hint}."
        )
    for leaf_in, leaf_out in zip(jax.tree_util.tree_leaves(z0), jax.tree_util.tree_leaves(out)):
        if jnp.shape(leaf_in) != leaf_out.shape:
            raise ValueError(
                f"`f` must map `z0` to an array of the same shape: z0 has shape "
                f"{jnp.shape(leaf_in)}, f(z0) has shape {leaf_out.shape}."
            )
        if not jnp.issubdtype(leaf_out.dtype, jnp.floating):
            raise ValueError(
                f"`f` must return real floating-point arrays like `z0` ({jnp.result_type(leaf_in)}), "
                f"got dtype {leaf_out.dtype}; a complex f(z) would lose its imaginary part."
            )
    # NaN inputs are rejected where they can be seen (outside jit); inside jit they surface as
    # Result.NONFINITE for the samples they touch.
    named = [("z0", z0)] + [(f"args[{i}]", a) for i, a in enumerate(args)]
    with jax.ensure_compile_time_eval():
        for name, tree in named:
            for leaf in jax.tree_util.tree_leaves(tree):
                if isinstance(leaf, jax.core.Tracer) or not hasattr(leaf, "dtype"):
                    continue
                if jnp.issubdtype(leaf.dtype, jnp.inexact) and not bool(jnp.all(jnp.isfinite(leaf))):
                    raise ValueError(f"`{name}` contains NaN or inf; inputs must be finite.")

