"""What a solve that fails does: per-sample result codes and one failure policy for every entry point.

Every solve reports each sample's outcome as a :class:`Result` code (``Solution.result``). What
happens beyond that is the caller's ``on_failure`` policy, the same argument with the same meaning
for :func:`deqlab.solvers.solve`, :func:`deqlab.backward.fixed_point` (its forward and its adjoint solve alike) and
:class:`deqlab.nn.DEQ`:

``"warn"`` (the default everywhere)
    a :class:`SolverWarning` (:class:`deqlab.backward.BackwardWarning` for the solves behind a
    gradient) naming the number of failing samples and the worst residual, attributed to the
    caller's line;
``"raise"``
    :class:`SolverError` naming the failing samples and their result codes;
``"nan"``
    the failing samples' values (and so their gradients) become NaN, and nothing else happens: a
    loss that uses them is NaN. Its compiled program contains no host callback, so this is the
    policy to choose where host callbacks fail (some TPU set-ups);
``"ignore"``
    the result codes are the only record.

Called eagerly, ``"warn"`` and ``"raise"`` act on the concrete results after the computation
returns. Inside a transformation of the caller's (``jit``, ``grad``, ``vmap``) the results are
not concrete: they act from a host callback (``jax.debug.callback``) when the program runs, and
``"raise"`` then reaches the caller wrapped in JAX's runtime error, with this module's message in
it.
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

__all__ = ["Result", "SolverError", "SolverWarning", "FAILURE_POLICIES", "check_policy", "signal",
           "nan_where_failed", "user_stacklevel"]

#: The values of ``on_failure`` (module docstring).
FAILURE_POLICIES = ("warn", "raise", "nan", "ignore")


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


def removed_throw(throw, where: str) -> None:
    """A clear error for the ``throw`` argument that ``on_failure`` replaced in deqlab 0.6."""
    if throw is not _NOT_GIVEN:
        replacement = {True: '"raise"', False: '"ignore"'}.get(throw, '"raise" or "ignore"')
        raise TypeError(f"{where}: `throw` was replaced by `on_failure` in deqlab 0.6: pass "
                        f"on_failure={replacement} (one of {', '.join(map(repr, FAILURE_POLICIES))}).")


_NOT_GIVEN = object()
#: Default of the removed ``throw`` arguments (see :func:`removed_throw`).
NOT_GIVEN = _NOT_GIVEN


def check_policy(value, where: str) -> str:
    """``value`` if it is one of :data:`FAILURE_POLICIES`, else an error naming ``on_failure``.

    Args:
        value: the ``on_failure`` argument received.
        where: the public function named in the error message.

    Returns:
        ``value``, one of ``"warn"``, ``"raise"``, ``"nan"``, ``"ignore"``.

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
    return f"below 1e{int(math.ceil(math.log10(max(float(finite.max()), 1e-300))))}"


def _report(caller, what, policy, result, residual, category, hint):
    """Host side of a failure report: warn, or raise :class:`SolverError`."""
    result = np.atleast_1d(np.asarray(result))
    residual = np.atleast_1d(np.asarray(residual, dtype=np.float64))
    failed = np.flatnonzero(result != Result.SUCCESS)
    if failed.size == 0:  # under vmap, lax.cond runs both branches
        return
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
    """Apply a ``"warn"`` or ``"raise"`` policy to the per-sample results of a solve.

    Args:
        caller: the public function named in the message (``"solve"``, ``"fixed_point"``).
        what: which solve (``"forward"``, ``"adjoint"``, or ``""``).
        policy: one of :data:`FAILURE_POLICIES`; ``"nan"`` and ``"ignore"`` do nothing here (NaN
            is the caller's, :func:`nan_where_failed`).
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
    jax.lax.cond(
        jnp.any(result != Result.SUCCESS),
        lambda: jax.debug.callback(lambda r, s: _report(caller, what, policy, r, s, category, hint),
                                   result, residual),
        lambda: None,
    )


def nan_where_failed(tree, result, batch_axis: int | None):
    """``tree`` with every entry of the failing samples NaN: the ``"nan"`` failure policy.

    Multiplied, not selected: a ``where`` would cut the gradient of the failing samples (the NaN
    branch is a constant), and even an added NaN leaves the derivative at 1; times NaN, both the
    value and every gradient through it are NaN, whatever the loss.

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
        factor = jnp.where(failed, jnp.nan, 1.0)
        if batch_axis is not None and jnp.ndim(factor) == 1:
            axis = batch_axis % jnp.ndim(leaf)
            factor = jnp.reshape(factor, (1,) * axis + (-1,) + (1,) * (jnp.ndim(leaf) - axis - 1))
        return leaf * factor.astype(jnp.result_type(leaf))

    return jax.tree_util.tree_map(poison, tree)
