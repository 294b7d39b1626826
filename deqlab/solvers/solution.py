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
        >>> import jax.numpy as jnp, deqlab
        >>> f = lambda z, x: 0.5 * jnp.tanh(z) + x
        >>> x = jnp.array([[0.0], [1.0], [2.0]])   # three samples of one number each
        >>> sol = deqlab.solve(f, jnp.zeros((3, 1)), x, solver=deqlab.Anderson(tol=1e-5, max_steps=50),
        ...                    batch_axis=0)
        >>> sol.stats.steps.shape, sol.stats.residual_trace.shape   # per sample; one row per step
        ((3,), (51, 3))
        >>> bool(jnp.all(sol.stats.best_residual <= sol.stats.tol))
        True
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
        history: the solver's state (:meth:`Solver.init`, e.g. a :class:`BroydenState`): each
            sample's state, stacked along a leading batch axis B (B = 1 without ``batch_axis``).

    Example:
        >>> import jax.numpy as jnp, deqlab
        >>> f = lambda z, x: 0.9 * jnp.tanh(z) + x
        >>> z0, x = jnp.zeros(4), jnp.linspace(-1.0, 1.0, 4)
        >>> first = deqlab.solve(f, z0, x, solver=deqlab.Picard(max_steps=3), on_failure="ignore")
        >>> bool(first.converged)
        False
        >>> more = deqlab.solve(f, z0, x, solver=deqlab.Picard(max_steps=300), init_state=first.state)
        >>> bool(more.converged)
        True
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
        >>> import jax.numpy as jnp, deqlab
        >>> sol = deqlab.solve(lambda z, x: 0.5 * jnp.tanh(z) + x, jnp.zeros(3), jnp.ones(3))
        >>> bool(sol.converged), int(sol.stats.nfe) <= 20
        (True, True)
        >>> print(" ".join(f"{v:.2f}" for v in sol.value.tolist()))   # z* = 0.5 tanh(z*) + 1
        1.45 1.45 1.45
    """

    value: Any
    result: jax.Array
    stats: SolveStats
    state: SolverState | None = None
    aux: Any = None

    @property
    def converged(self) -> jax.Array:
        """Boolean per sample: did it reach the tolerance? (``result == Result.SUCCESS``)"""
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
        >>> import jax.numpy as jnp, deqlab
        >>> from deqlab.solvers import SolverError, raise_if_failed
        >>> f = lambda z, x: 0.9 * jnp.tanh(z) + x
        >>> sol = deqlab.solve(f, jnp.zeros(2), jnp.ones(2), solver=deqlab.Picard(max_steps=2),
        ...                    on_failure="ignore")
        >>> try:
        ...     raise_if_failed(sol)
        ... except SolverError:
        ...     print("not converged after", int(sol.stats.steps), "steps")
        not converged after 2 steps
    """
    if checks.is_traced(solution.result):
        raise ValueError("raise_if_failed needs concrete values: inside jit, call deqlab.failures.check(solution) "
                         "under jax.experimental.checkify instead.")
    signal(what, "", "raise", solution.result, solution.stats.best_residual)
