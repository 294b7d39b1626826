"""Damped Picard iteration (003 Eq. 5)."""

from __future__ import annotations

from deqlab import checks
from deqlab.solvers.base import Solver

__all__ = ["Picard"]


class Picard(Solver):
    """Damped Picard iteration z <- (1 - damping) z + damping f(z) (003 Eq. 5 for damping=1).

    Attributes:
        damping: step fraction in (0, 1]; 1 is plain fixed-point iteration.
        tol, max_steps, divergence_factor: see :mod:`deqlab.solvers`.
        stop: ``"residual"`` (default) or ``"error"``: what ``tol`` bounds (:mod:`deqlab.solvers`).
        safety: factor (>= 1) on the error estimate of ``stop="error"``.
        check_every: judge convergence every this many steps, or ``"auto"`` (:mod:`deqlab.solvers`).

    Hooks (see :class:`Solver`): ``rate_estimate = "residual_ratio"`` (a stationary iteration:
    its residual ratios tend to the damped map's rate), ``steps_past_convergence = True`` (a
    converged sample returns ``z + damping (f(z) - z)`` from the iterate that met ``tol``) and
    :meth:`error_bound_factor` ``damping q / (1 - q)`` for that stepped value.

    Raises:
        ValueError: a setting outside its range (the message names it and the valid range).

    Example:
        >>> import jax.numpy as jnp, deqlab
        >>> from deqlab.solvers import Picard
        >>> sol = deqlab.solve(lambda z, x: 0.5 * jnp.tanh(z) + x, jnp.zeros(3), jnp.ones(3),
        ...                    solver=Picard(damping=0.8, tol=1e-5))
        >>> bool(sol.converged), int(sol.stats.steps) < 30
        (True, True)
        >>> print(f"{float(sol.value[0]):.2f}")   # z* = 0.5 tanh(z*) + 1
        1.45
    """

    damping: float = 1.0
    name = "picard"
    rate_estimate = "residual_ratio"
    steps_past_convergence = True
    stays_at_fixed_points = True  # z + damping (z - z) = z

    def _check_settings(self):  # run by the constructor, whatever a subclass's __post_init__ does
        checks.unit_interval(self.damping, "damping", "solvers.Picard", allow_traced=True)

    def init(self, z, fz):
        return ()

    def propose(self, z, fz, state):
        if isinstance(self.damping, (int, float)) and self.damping == 1.0:  # a static 1: no arithmetic
            return fz, state
        return z + self.damping * (fz - z), state

    def error_bound_factor(self, q):
        """Banach's bound for the stepped value: within ``q / (1 - q)`` of its step
        ``damping ||f(z) - z||`` from z (the damped map contracting at rate q).

        Args:
            q: per-sample rate estimates in [0, 0.999), shape ``(B,)``.

        Returns:
            ``damping q / (1 - q)``, shape ``(B,)``.
        """
        return q * self.damping / (1.0 - q)

