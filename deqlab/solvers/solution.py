"""What a solve returns: :class:`Solution` (value, per-sample result, statistics, state), and
:func:`raise_if_failed`."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from deqlab import checks
from deqlab.failures import Result, signal

__all__ = ["SolveStats", "SolverState", "Solution", "raise_if_failed"]


class SolveStats(NamedTuple):
    """Statistics of one solve.

    Attributes:
        steps: iterations taken by each sample (shape ``(B,)``, or ``()`` without a batch axis).
        nfe: number of evaluations of ``f`` on the batch (including the one at ``z0``).
        residual_trace: relative residual of each sample after each step, shape
            ``(max_steps + 1, B)`` (row 0 is at ``z0``); a frozen sample repeats its last value.
        best_residual: relative residual of each sample's returned value (for a converged sample
            the iterate that met ``tol``; otherwise the finite iterate with the smallest absolute
            residual, see :mod:`deqlab.solvers`).
        residual: relative residual of the last accepted iterate of each sample.
        tol: the tolerance the solve used (the dtype's default when none was given).
        error_estimate: with ``stop="error"``, the estimated max-abs error of each sample's
            returned value relative to ``max(1, max|f(z)|)`` at its last judged step (inf where
            the rate estimate was unreliable and the residual rule decided); None otherwise.

    Example:
        >>> sol = deqlab.solve(f, z0, x, solver=deqlab.Anderson(tol=1e-6), batch_axis=0)
        >>> sol.stats.steps, sol.stats.best_residual   # per sample
        >>> sol.stats.residual_trace.mean(axis=1)      # the batch's mean residual after each step
    """

    steps: jax.Array
    nfe: jax.Array
    residual_trace: jax.Array
    best_residual: jax.Array
    residual: jax.Array
    tol: Any = None
    error_estimate: Any = None


class SolverState(NamedTuple):
    """Where a solve stopped, to continue it (a warm start).

    Pass it back as ``solve(..., init_state=sol.state)`` to continue the same iteration (for
    example with a larger ``max_steps``); the history of Anderson and Broyden is kept, so the
    continuation is the same iteration as one longer solve.

    Attributes:
        z: the last accepted iterate of each sample, flattened to ``(B, D)`` rows.
        history: the solver's state (:meth:`Solver.init`), e.g. a :class:`BroydenState`.

    Example:
        >>> first = deqlab.solve(f, z0, x, solver=deqlab.Anderson(max_steps=10), on_failure="ignore")
        >>> more = deqlab.solve(f, z0, x, solver=deqlab.Anderson(max_steps=90), init_state=first.state)
    """

    z: jax.Array
    history: Any


class Solution(NamedTuple):
    """What :func:`solve` and :func:`deqlab.backward.fixed_point` return.

    Attributes:
        value: the fixed point, the same pytree as ``z0``.
        result: a :class:`~deqlab.failures.Result` code per sample (``()`` without a batch axis).
        stats: :class:`SolveStats` of the solve.
        state: the final :class:`SolverState`, to continue the solve (``init_state``).
        aux: with ``has_aux=True``, the auxiliary output of ``f`` at ``value``; else None.

    Example:
        >>> sol = deqlab.solve(lambda z, x: 0.5 * jnp.tanh(z) + x, jnp.zeros(3), jnp.ones(3))
        >>> sol.value, bool(sol.converged), int(sol.stats.steps)
    """

    value: Any
    result: jax.Array
    stats: SolveStats
    state: SolverState | None = None
    aux: Any = None

    @property
    def converged(self) -> jax.Array:
        """Boolean per sample: did it reach the tolerance?"""
        return self.result == Result.SUCCESS


def raise_if_failed(solution: Solution, what: str = "solve") -> None:
    """Raise :class:`~deqlab.failures.SolverError` naming the failing samples of ``solution`` (concrete values only).

    Args:
        solution: a :class:`Solution` returned outside ``jit``.
        what: the name the message starts with.

    Raises:
        SolverError: some sample did not converge.
        ValueError: ``solution`` holds tracers (inside ``jit``: use ``on_failure="raise"``).

    Example:
        >>> sol = deqlab.solve(f, z0, x, on_failure="ignore")
        >>> raise_if_failed(sol)   # SolverError naming the samples that did not converge, if any
    """
    if checks.is_traced(solution.result):
        raise ValueError("raise_if_failed needs concrete values: inside jit, pass on_failure='raise' "
                         "to the solve instead.")
    signal(what, "", "raise", solution.result, solution.stats.best_residual)
