"""What a solve that fails does: per-sample result codes and one failure policy for every entry point.

Every solve reports each sample's outcome as a :class:`Result` code (``Solution.result``). What
happens beyond that is the caller's ``on_failure`` policy, the same argument with the same meaning
for :func:`deqlab.solvers.solve`, :func:`deqlab.backward.fixed_point` (its forward and its adjoint solve alike) and
:class:`deqlab.nn.DEQ`:

``"warn"`` (the default everywhere)
    called eagerly, a :class:`SolverWarning` (:class:`deqlab.backward.BackwardWarning` for the
    solves behind a gradient) naming the number of failing samples and the worst residual,
    attributed to the caller's line. Inside a transformation of the caller's (``jit``, ``grad``,
    ``vmap``) it puts nothing in the compiled program: the result codes are returned, and
    :func:`check` turns them into an error where you choose (below);
``"raise"``
    :class:`SolverError` naming the failing samples and their result codes; inside a
    transformation, from a host callback when the program runs (the error then reaches the caller
    wrapped in JAX's runtime error, and the program is not written to JAX's persistent compilation
    cache);
``"nan"``
    the failing samples' values become NaN, and nothing else happens. The gradient does not flow
    through a failed sample's value (it is replaced, not multiplied), so a loss that leaves the
    failed samples out trains on the others: mask the *value* before anything else uses it,
    ``z = jnp.where(sol.converged[:, None], sol.value, 0.0)``, and the gradient is the converged
    samples' alone, finite. (Masking only the final loss is not enough where a parameter acts on
    the value afterwards, a readout ``z @ V``: the mask's zero cotangent times the NaN value is NaN
    in ``V``'s gradient.) A loss that uses a failed value is NaN. A sample whose *adjoint* solve
    failed makes the gradient of every parameter it touches NaN (the caller never sees that
    solve, so cannot mask it);
``"ignore"``
    the forward solve's result codes are the only record (a failed adjoint solve, which runs
    inside the gradient, is recorded nowhere: watch it with ``deqlab.backward.adjoint_solve`` or
    ``check_gradients``, or train with ``"nan"``);
``"callback"``
    ``"warn"`` from inside compiled programs: a host callback (``jax.debug.callback``) warns when
    the program runs, once per lane under ``vmap``. This was ``"warn"``'s behaviour under ``jit``
    up to deqlab 0.8. It costs about 0.08 ms per call of a small jitted solve (3.5-5.5x the
    solve, ``benchmarks/results/compile_quick.txt``), keeps the program
    out of JAX's persistent compilation cache, and fails on some TPU set-ups; choose it knowingly.

The default compiled program holds no host callback: ``"warn"``, ``"nan"`` and ``"ignore"`` add
none (``"warn"`` and ``"ignore"`` compile to the same program). Under ``jit`` there are two ways to act on a failure:

- return ``sol.result`` (or ``sol.converged``) from the jitted function and call :func:`check` on
  the concrete solution, or look at it yourself;
- call :func:`check` *inside* the jitted function and run it under
  ``jax.experimental.checkify.checkify``: ``err, out = checkify.checkify(step)(...)``, then
  ``err.throw()`` raises with :func:`check`'s message, intact (no host callback either).
"""

from __future__ import annotations

import enum
import math
import os
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import checks

__all__ = ["Result", "SolverError", "SolverWarning", "FAILURE_POLICIES", "check", "check_policy", "signal",
           "nan_where_failed", "user_stacklevel"]

#: The values of ``on_failure`` (module docstring).
FAILURE_POLICIES = ("warn", "raise", "nan", "ignore", "callback")


class Result(enum.IntEnum):
    """Outcome of a solve, one per sample (``Solution.result``).

    Attributes:
        SUCCESS: the relative residual reached ``tol``.
        MAX_STEPS_REACHED: ``max_steps`` ran out first.
        DIVERGED: the residual grew past the solver's divergence threshold.
        NONFINITE: the iterate or the residual became NaN or infinite.

    Example:
        >>> from deqlab.failures import Result
        >>> Result(1).name, int(Result.SUCCESS)
        ('MAX_STEPS_REACHED', 0)
    """

    SUCCESS = 0
    MAX_STEPS_REACHED = 1
    DIVERGED = 2
    NONFINITE = 3


class SolverError(RuntimeError):
    """Raised with ``on_failure="raise"`` when some sample of a solve did not converge."""


class SolverWarning(RuntimeWarning):
    """Issued with ``on_failure="warn"`` when some sample of a solve did not converge."""


def check_policy(value, where: str) -> str:
    """``value`` if it is one of :data:`FAILURE_POLICIES`, else an error naming ``on_failure``.

    Args:
        value: the ``on_failure`` argument received.
        where: the public function named in the error message.

    Returns:
        ``value``, one of ``"warn"``, ``"raise"``, ``"nan"``, ``"ignore"``, ``"callback"``.

    Raises:
        ValueError: ``value`` is not one of :data:`FAILURE_POLICIES`.

    Example:
        >>> from deqlab.failures import check_policy
        >>> check_policy("nan", "solve")
        'nan'
    """
    return checks.choice(value, "on_failure", FAILURE_POLICIES, where)


_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_JAX = os.path.dirname(os.path.abspath(jax.__file__))
# flax's transforms (nnx.jit, nnx.grad, ...) call the user's function from their own frames
_FLAX = os.path.join(os.path.dirname(_JAX), "flax")


def user_stacklevel() -> int:
    """The ``stacklevel`` that attributes a warning to the user's line.

    For ``warnings.warn`` called by this function's caller: the first frame outside deqlab, JAX
    and Flax.

    Returns:
        A positive int (1 when every frame is inside those packages).

    Example:
        >>> from deqlab.failures import user_stacklevel
        >>> user_stacklevel() >= 1
        True
    """
    frame = sys._getframe(1)
    level = 1
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith((_PACKAGE, _JAX, _FLAX)):
            return level
        frame = frame.f_back
        level += 1
    return 1


def _magnitude(residual: np.ndarray) -> str:
    """Order of magnitude of the worst residual, rounded so that a warning repeated every training
    step shows once under Python's default filter."""
    finite = residual[np.isfinite(residual)]
    if finite.size < residual.size or finite.size == 0:
        return "non-finite"
    # the smallest power of ten strictly above the worst residual: 1.0 is "below 1e1", 0.5 "below 1e0"
    return f"below 1e{int(math.floor(math.log10(max(float(finite.max()), 1e-300)))) + 1}"


def _report(caller, what, policy, result, residual, category, hint):
    """Host side of a failure report: warn, or raise :class:`SolverError`."""
    result = np.atleast_1d(np.asarray(result))
    residual = np.atleast_1d(np.asarray(residual, dtype=np.float64))
    failed = np.flatnonzero(result != Result.SUCCESS)
    if failed.size == 0:  # under vmap, lax.cond runs both branches
        return
    policy = "warn" if policy == "callback" else policy
    solve = f"the {what} solve" if what else "the solve"
    if policy == "raise":
        shown = ", ".join(
            f"sample {i}: {Result(int(result[i])).name.lower()} (residual {residual[i]:.3e})" for i in failed[:8]
        )
        more = f" and {failed.size - 8} more" if failed.size > 8 else ""
        raise SolverError(f"{caller}: {solve} failed for {failed.size}/{result.size} samples: {shown}{more}.")
    warnings.warn(
        f"{caller}: {solve} did not converge for {failed.size}/{result.size} samples (worst relative "
        f"residual {_magnitude(residual[failed])}); {hint}.",
        category,
        stacklevel=user_stacklevel(),
    )


def signal(caller: str, what: str, policy: str, result, residual, *, category=SolverWarning,
           hint: str = "raise max_steps, loosen tol, or check that f contracts (Solution.result "
                       "reports each sample)") -> None:
    """Apply the ``on_failure`` policy ``policy`` to the per-sample results of a solve.

    Concrete results (an eager call): ``"warn"`` and ``"callback"`` warn, ``"raise"`` raises,
    here. Traced results (inside the caller's ``jit``, ``grad`` or ``vmap``): ``"raise"`` and
    ``"callback"`` act from a host callback when the program runs; ``"warn"`` adds nothing to the
    program (the result codes are returned; see :func:`check`). ``"nan"`` and ``"ignore"`` never
    do anything here (NaN is the caller's, :func:`nan_where_failed`).

    Args:
        caller: the public function named in the message (``"solve"``, ``"fixed_point"``).
        what: which solve (``"forward"``, ``"adjoint"``, or ``""``).
        policy: one of :data:`FAILURE_POLICIES`.
        result, residual: ``Solution.result`` and ``Solution.stats.best_residual``.
        category: the warning class.
        hint: what to try, appended to the warning.

    Raises:
        SolverError: with ``policy="raise"`` and concrete results that hold a failure (traced
            results: raised from a host callback when the program runs).

    Example:
        >>> import numpy as np
        >>> from deqlab.failures import Result, SolverError, signal
        >>> result = np.array([Result.SUCCESS, Result.MAX_STEPS_REACHED])
        >>> try:
        ...     signal("solve", "", "raise", result, np.array([1e-6, 3e-2]))
        ... except SolverError as error:
        ...     print(error)
        solve: the solve failed for 1/2 samples: sample 1: max_steps_reached (residual 3.000e-02).
    """
    if policy in ("ignore", "nan"):
        return
    if not checks.is_traced((result, residual)):
        _report(caller, what, policy, result, residual, category, hint)
        return
    if policy == "warn":  # nothing in the compiled program: the result codes are the record
        return
    jax.lax.cond(
        jnp.any(result != Result.SUCCESS),
        lambda: jax.debug.callback(lambda r, s: _report(caller, what, policy, r, s, category, hint),
                                   result, residual),
        lambda: None,
    )


def check(solution, where: str = "solve") -> None:
    """Raise if some sample of ``solution`` failed: eagerly, or under ``jit`` through ``checkify``.

    The opt-in way to stop on a failure inside compiled code without a host callback. On concrete
    values it raises :class:`SolverError` at once, naming the failing samples. On traced values
    (inside ``jit``, ``vmap``, ``grad``) it adds a ``jax.experimental.checkify`` check: run the
    function under ``checkify.checkify`` and ``err.throw()`` raises with this message (count of
    failed samples, the first one's index and result code, the worst relative residual). A traced
    check that is
    not functionalised by ``checkify.checkify`` makes JAX refuse to compile the function, saying so.
    Batch with ``batch_axis`` inside the checked function, not with ``jax.vmap`` around
    ``checkify.checkify``: JAX's checkify does not support a vmapped ``while_loop`` (jax 0.10).

    Args:
        solution: a :class:`~deqlab.solvers.Solution` (anything with ``result`` and
            ``stats.best_residual``).
        where: the name the message starts with.

    Raises:
        SolverError: concrete values with some sample whose result is not ``SUCCESS``.
        jax.experimental.checkify.JaxRuntimeError: from ``err.throw()``, for traced values.

    Example:
        >>> import jax, jax.numpy as jnp, deqlab
        >>> from jax.experimental import checkify
        >>> f = lambda z, x: 0.9 * jnp.tanh(z) + x
        >>> def step(x):
        ...     sol = deqlab.solve(f, jnp.zeros(2), x, solver=deqlab.Picard(max_steps=2))
        ...     deqlab.failures.check(sol)
        ...     return sol.value
        >>> err, value = checkify.checkify(jax.jit(step))(jnp.ones(2))
        >>> print(err.get().split(" (first")[0])   # err.throw() raises with the whole message
        solve: the solve failed for 1/1 samples
    """
    result = solution.result
    residual = solution.stats.best_residual
    if not checks.is_traced((result, residual)):
        _report(where, "", "raise", result, residual, SolverWarning, "")
        return
    from jax.experimental import checkify  # imported here: not every program needs it

    flat = jnp.ravel(result)
    failed = flat != Result.SUCCESS
    first = jnp.argmax(failed)
    worst = jnp.max(jnp.where(failed, jnp.ravel(residual).astype(jnp.float32), -jnp.inf))
    codes = "; ".join(f"{int(r)} = {r.name.lower()}" for r in Result if r != Result.SUCCESS)
    checkify.check(
        ~jnp.any(failed),
        f"{where}: the solve failed for {{count}}/{flat.size} samples (first: sample {{first}}, "
        f"result code {{code}}; worst relative residual {{worst}}; codes: {codes})",
        count=jnp.sum(failed), first=first, code=flat[first], worst=worst,
    )


def nan_where_failed(tree, result, batch_axis: int | None):
    """``tree`` with every entry of the failing samples NaN: the ``"nan"`` failure policy.

    Replaced, not multiplied: no gradient flows through a failing sample's entries, so a loss
    computed from the masked value ``jnp.where(converged[:, None], value, 0.0)`` has a finite
    gradient, the converged samples' alone. (Multiplying by NaN, as deqlab up to 0.8 did, made that
    gradient NaN in every shared parameter.) A loss that uses a failed sample's value is NaN.

    Args:
        tree: a pytree of arrays (a solution, or anything computed per sample).
        result: the :class:`Result` codes, one per sample along ``batch_axis`` of every leaf, or a
            scalar for a single sample.
        batch_axis: the axis of every leaf that indexes the samples; None: one sample.

    Returns:
        ``tree`` with the entries of failing samples NaN and the others unchanged.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.failures import Result, nan_where_failed
        >>> z = jnp.ones((2, 3))
        >>> nan_where_failed(z, jnp.array([Result.SUCCESS, Result.DIVERGED]), batch_axis=0).tolist()
        [[1.0, 1.0, 1.0], [nan, nan, nan]]
    """
    failed = jnp.asarray(result) != Result.SUCCESS

    def poison(leaf):
        mask = failed
        if batch_axis is not None and jnp.ndim(mask) == 1:
            axis = batch_axis % jnp.ndim(leaf)
            mask = jnp.reshape(mask, (1,) * axis + (-1,) + (1,) * (jnp.ndim(leaf) - axis - 1))
        return jnp.where(mask, jnp.asarray(jnp.nan, jnp.result_type(leaf)), leaf)

    return jax.tree_util.tree_map(poison, tree)
