"""From a weight-tied transformer to a DEQ (003 §3, Eq. 3-6; Figure 2 right).

The deep weight-tied network z[i+1] = f(z[i]; x) and the DEQ share f and its parameters; they differ
in how they look for z* = f(z*; x): the deep network by the plain iteration (003 Eq. 5), the DEQ
by a quasi-Newton root finder (003 Eq. 6). This module measures both on the same cell:

- :func:`convergence`: the relative residual of each method against the number of evaluations of
  f (the x-axis of 003 Figure 2, right);
- :func:`jacobian_radius`: the spectral radius of J_f(z*), estimated by power iteration with
  Jacobian-vector products. The plain iteration converges locally iff it is below 1, and then its
  residual falls by that factor per layer; above 1 it cannot settle (it oscillates or wanders)
  while Broyden, which does not iterate f, still finds z*;
- :func:`picard_rate`: the per-layer contraction factor read off a residual trace.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from deqlab import checks, stability
from deqlab.nn.lm import unroll
from deqlab.solvers import get_solver, solve

__all__ = ["convergence", "jacobian_radius", "picard_rate", "distance_to_equilibrium"]


def convergence(cell: nnx.Module, x: jax.Array, *, evaluations: int = 60,
                solvers: Sequence[str] = ("broyden", "anderson"), tol: float | None = None
                ) -> dict[str, np.ndarray]:
    """Relative residual after each evaluation of f, per method and sequence.

    Args:
        cell: a sequence cell ``f(z, x)`` (z starts at 0, as in 003).
        x: inputs ``(B, T, in_features)``.
        evaluations: the budget of evaluations of f (the deep network's depth).
        solvers: forward solvers of :mod:`deqlab.solvers` to compare with the deep network.
        tol: the solvers' tolerance (None: the dtype's default); a sequence that meets it stops,
            and its residual stays at its final value in the returned trace.

    Returns:
        ``{"unrolled": r, solver: r, ...}`` with r of shape ``(evaluations, B)``: row k is the
        relative residual ``||f(z) - z|| / ||f(z)||`` of the iterate whose test took k + 1
        evaluations (for the deep network, layer k, whose residual needs f(z[k]) = z[k+1]).
    """
    checks.positive_int(evaluations, "evaluations", "weight_tied.convergence")
    z0 = jnp.zeros(x.shape[:-1] + (cell.width,), x.dtype)
    graphdef, state = nnx.split(cell)

    @jax.jit
    def run(state, x):
        f = lambda z, x: nnx.merge(graphdef, state)(z, x)  # noqa: E731
        traces = {"unrolled": unroll(nnx.merge(graphdef, state), x, evaluations)[1]}
        for name in solvers:
            config = get_solver(name, tol=tol, max_steps=evaluations - 1)
            traces[name] = solve(f, z0, x, solver=config, batch_axis=0, on_failure="ignore").stats.residual_trace
        return traces

    return {k: np.asarray(v) for k, v in run(state, x).items()}


def jacobian_radius(cell: nnx.Module, z_star: jax.Array, x: jax.Array, *, iterations: int = 200,
                    key: jax.Array | None = None) -> np.ndarray:
    """Spectral radius of J_f(z*) for each sequence: :func:`deqlab.stability.spectral_radius` (power
    iteration with JVPs, the mean log growth over the second half of the iterations, right for a
    dominant complex pair too) applied to the cell at its equilibrium, one estimate per sequence.

    Returns:
        ``rho`` of shape ``(B,)``.
    """
    where = "weight_tied.jacobian_radius"
    checks.integer(iterations, "iterations", where, minimum=2)
    key = jax.random.key(0) if key is None else checks.prng_key(key, "key", where)
    graphdef, state = nnx.split(cell)

    @jax.jit
    def run(state, z_star, x, key):
        def f(z, state, x):
            return nnx.merge(graphdef, state)(z, x)
        return stability.spectral_radius(f, z_star, state, x, key=key, steps=iterations, batch_axis=0)

    return np.asarray(run(state, z_star, x, key))


def picard_rate(trace: np.ndarray, *, floor: float = 1e-5) -> np.ndarray:
    """Per-layer contraction factor of a residual trace ``(layers, B)``: the geometric mean ratio
    r[k+1] / r[k] over the layers whose residual is between the last tenth of the trace's first
    value and ``floor`` (above the dtype's rounding floor, past the transient)."""
    trace = np.asarray(trace, dtype=np.float64)
    rates = []
    for r in trace.T:
        usable = np.flatnonzero((r > floor) & (r < 0.1 * r[0]))
        if usable.size < 3:
            usable = np.arange(trace.shape[0] // 2, trace.shape[0])
        first, last = usable[0], usable[-1]
        rates.append((r[last] / r[first]) ** (1.0 / max(last - first, 1)))
    return np.asarray(rates)


def distance_to_equilibrium(cell: nnx.Module, x: jax.Array, z_star: jax.Array, depths: Sequence[int]
                            ) -> np.ndarray:
    """Relative distance ``||z[L] - z*|| / ||z*||`` of the deep network at each depth L, per sequence
    (rows: depths)."""
    depths = [checks.positive_int(d, "depths", "weight_tied.distance_to_equilibrium") for d in depths]
    graphdef, state = nnx.split(cell)

    @jax.jit
    def run(state, x, z_star):
        def layer(z, _):
            z = nnx.merge(graphdef, state)(z, x)
            return z, jnp.sqrt(jnp.sum((z - z_star) ** 2, axis=tuple(range(1, z.ndim)))
                               / jnp.sum(z_star**2, axis=tuple(range(1, z.ndim))))

        return jax.lax.scan(layer, jnp.zeros_like(z_star), None, length=max(depths))[1]

    distances = np.asarray(run(state, x, z_star))
    return distances[np.asarray(depths) - 1]
