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
- :func:`picard_rate`: the per-layer contraction factor read off a residual trace;
- :func:`jacobian` and :func:`linearisation`: the dense Jacobian J_f(z*) of each sequence and what
  the solvers see in it: the spectral radius, the distance of the spectrum from 1, the smallest
  singular value of I - J (which sets how well conditioned the root-finding problem g(z) =
  f(z) - z = 0 is; for a non-normal J it can be far smaller than that distance) and ``||J||_2``.

The functions compile one program per cell structure and shape (the parameters are an argument),
so that cells that differ only in their parameters (another seed, another ``attention_scale``)
reuse it.
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from deqlab import checks, stability
from deqlab.nn.lm import unroll
from deqlab.solvers import Solver, get_solver, solve

__all__ = ["convergence", "evaluations_needed", "equilibrium", "jacobian_radius", "picard_rate", "distance_to_equilibrium",
           "jacobian", "linearisation"]


def convergence(cell: nnx.Module, x: jax.Array, *, evaluations: int = 60,
                solvers: Sequence[str | Solver] = ("broyden", "anderson"), tol: float | None = None
                ) -> dict[str, np.ndarray]:
    """Relative residual after each evaluation of f, per method and sequence.

    Args:
        cell: a sequence cell ``f(z, x)`` (z starts at 0, as in 003).
        x: inputs ``(B, T, in_features)``.
        evaluations: the budget of evaluations of f (the deep network's depth), an integer >= 1.
        solvers: forward solvers of :mod:`deqlab.solvers` to compare with the deep network: names
            (the solver with its defaults) or solver objects (their ``max_steps`` is replaced by
            the budget, their ``tol`` by ``tol`` when given). A name is its key in the result; an
            object's key is its ``name`` (``"broyden"``), with ``"-m<m>"`` appended when its
            history size differs from the default (``"broyden-m30"``).
        tol: the solvers' tolerance (None: each solver's own, which for a name is the dtype's
            default); a sequence that meets it stops, and its residual stays at its final value in
            the returned trace.

    Returns:
        ``{"unrolled": r, solver: r, ...}`` with r of shape ``(evaluations, B)``: row k is the
        relative residual ``||f(z) - z|| / ||f(z)||`` of the iterate whose test took k + 1
        evaluations (for the deep network, layer k, whose residual needs f(z[k]) = z[k+1]).

    Raises:
        ValueError: ``evaluations`` is not an integer >= 1, or a solver is unknown; TypeError:
            a solver object lacks a setting.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab import nn
        >>> from deqlab.lab.experiments.sequence import weight_tied
        >>> cell = nn.TransformerCell(8, 8, heads=2, attention_residual=False, rngs=nnx.Rngs(0))
        >>> r = weight_tied.convergence(cell, jax.random.normal(jax.random.key(0), (2, 5, 8)), evaluations=40)
        >>> sorted(r), r["broyden"].shape
        (['anderson', 'broyden', 'unrolled'], (40, 2))
    """
    where = "weight_tied.convergence"
    checks.positive_int(evaluations, "evaluations", where)
    configs = {}
    for solver in solvers:
        config = get_solver(solver, name="solvers", tol=tol, max_steps=max(evaluations - 1, 1))
        configs[solver if isinstance(solver, str) else _solver_key(solver)] = config
    graphdef, state = nnx.split(cell)
    traces = _convergence(graphdef, state, x, evaluations, tuple(configs.items()))
    return {k: np.asarray(v) for k, v in traces.items()}


def _solver_key(solver: Solver) -> str:
    default = type(solver)()
    m = getattr(solver, "m", None)
    return solver.name if m is None or m == getattr(default, "m", None) else f"{solver.name}-m{m}"


@partial(jax.jit, static_argnums=(0, 3, 4))
def _convergence(graphdef, state, x, evaluations, configs):
    z0 = jnp.zeros(x.shape[:-1] + (nnx.merge(graphdef, state).width,), x.dtype)

    def f(z, x):
        return nnx.merge(graphdef, state)(z, x)

    traces = {"unrolled": unroll(nnx.merge(graphdef, state), x, evaluations)[1]}
    for key, config in configs:
        trace = solve(f, z0, x, solver=config, batch_axis=0, on_failure="ignore").stats.residual_trace
        if evaluations == 1:  # a solver's first test needs one evaluation; it reports max(budget - 1, 1) + 1
            trace = trace[:1]
        traces[key] = trace
    return traces


def evaluations_needed(trace: np.ndarray, tol: float) -> np.ndarray:
    """Evaluations of f each sequence needed to bring its residual to ``tol``; ``inf`` if it never did.

    A sequence that does not reach the tolerance within the trace is *censored*: all that is known
    is that it needs more evaluations than the budget. ``inf`` keeps that honest downstream:
    ``np.median`` of such counts is finite only when more than half the sequences reached the
    tolerance (for an even count, when the two middle ones both did), and a difference of two
    counts is known in sign, not in size, when one is censored (``inf - 80 = inf``; both censored
    gives ``nan``: unknown).

    Args:
        trace: residuals ``(evaluations, B)`` from :func:`convergence`; row k took k + 1 evaluations.
        tol: the tolerance, a number > 0.

    Returns:
        Float array ``(B,)``: the first k + 1 with ``trace[k] <= tol``, or ``inf``.

    Raises:
        ValueError: ``trace`` is not 2-d, or ``tol`` is not a number > 0.

    Example:
        >>> import numpy as np
        >>> from deqlab.lab.experiments.sequence import weight_tied
        >>> trace = np.array([[1.0, 1.0], [1e-3, 0.5], [1e-6, 0.2]])
        >>> weight_tied.evaluations_needed(trace, 1e-5).tolist()
        [3.0, inf]
    """
    where = "weight_tied.evaluations_needed"
    checks.number(tol, "tol", where, lower=0.0, lower_open=True)
    trace = np.asarray(trace)
    if trace.ndim != 2:
        raise ValueError(f"{where}: `trace` must be 2-d (evaluations, B), got shape {trace.shape}.")
    reached = trace <= tol
    return np.where(reached.any(axis=0), reached.argmax(axis=0) + 1.0, np.inf)


def equilibrium(cell: nnx.Module, x: jax.Array, solver: Solver) -> tuple[jax.Array, np.ndarray, np.ndarray]:
    """Solve ``z* = f(z*; x)`` from z = 0 with a configured solver, one program per cell structure.

    The solver object is passed to the compiled program as a pytree, so its real-number settings
    (``tol``, ...) are arguments: solves that differ in them, or in the cell's parameters, reuse
    the program; ``max_steps`` and the history size recompile.

    Args:
        cell: a sequence cell ``f(z, x)``.
        x: the inputs ``(B, T, in_features)``.
        solver: a solver object of :mod:`deqlab.solvers` (``Broyden(m=30, tol=1e-6, max_steps=500)``).

    Returns:
        ``(z, residual, evaluations)``: the value ``(B, T, width)``, each sequence's relative
        residual (of the returned value) and the evaluations of f it used (its steps plus the
        evaluation at z = 0: the count :func:`evaluations_needed` reads off a trace). A sequence
        that did not converge returns its best iterate; compare ``residual`` with ``solver.tol``.

    Raises:
        ValueError: ``solver`` is not a solver object.

    Example:
        >>> import jax
        >>> from flax import nnx
        >>> from deqlab import Broyden, nn
        >>> from deqlab.lab.experiments.sequence import weight_tied
        >>> cell = nn.TransformerCell(8, 8, heads=2, attention_residual=False, rngs=nnx.Rngs(0))
        >>> x = jax.random.normal(jax.random.key(0), (2, 5, 8))
        >>> z, residual, evaluations = weight_tied.equilibrium(cell, x, Broyden(tol=1e-5, max_steps=50))
        >>> z.shape, bool((residual <= 1e-5).all())
        ((2, 5, 8), True)
    """
    if not isinstance(solver, Solver):
        raise ValueError(f"weight_tied.equilibrium: `solver` must be a solver object (deqlab.Broyden(...), ...), "
                         f"got {type(solver).__name__}.")
    graphdef, state = nnx.split(cell)
    z, residual, steps = _equilibrium(graphdef, state, x, solver)
    return z, np.asarray(residual), np.asarray(steps) + 1


@partial(jax.jit, static_argnums=0)
def _equilibrium(graphdef, state, x, solver):
    z0 = jnp.zeros(x.shape[:-1] + (nnx.merge(graphdef, state).width,), x.dtype)

    def f(z, x):
        return nnx.merge(graphdef, state)(z, x)

    sol = solve(f, z0, x, solver=solver, batch_axis=0, on_failure="ignore")
    return sol.value, sol.stats.best_residual, sol.stats.steps


def jacobian_radius(cell: nnx.Module, z_star: jax.Array, x: jax.Array, *, iterations: int = 200,
                    key: jax.Array | None = None) -> np.ndarray:
    """Spectral radius of J_f(z*) for each sequence: :func:`deqlab.stability.spectral_radius` (power
    iteration with JVPs, the mean log growth over the second half of the iterations, right for a
    dominant complex pair too) applied to the cell at its equilibrium, one estimate per sequence.

    Args:
        cell: a sequence cell ``f(z, x)``.
        z_star: where the Jacobian is taken, ``(B, T, width)``, usually the equilibrium.
        x: the inputs ``(B, T, in_features)``.
        iterations: power-iteration steps, an integer >= 2.
        key: PRNG key of the start vectors (None: ``jax.random.key(0)``).

    Returns:
        ``rho`` of shape ``(B,)``.

    Raises:
        ValueError: ``iterations`` is not an integer >= 2, or ``key`` is not a PRNG key.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab import nn
        >>> from deqlab.lab.experiments.sequence import weight_tied
        >>> cell = nn.TransformerCell(8, 8, heads=2, rngs=nnx.Rngs(0))
        >>> x = jax.random.normal(jax.random.key(0), (2, 5, 8))
        >>> weight_tied.jacobian_radius(cell, jnp.zeros((2, 5, 8)) + 0.1, x).shape
        (2,)
    """
    where = "weight_tied.jacobian_radius"
    checks.integer(iterations, "iterations", where, minimum=2)
    key = jax.random.key(0) if key is None else checks.prng_key(key, "key", where)
    graphdef, state = nnx.split(cell)
    return np.asarray(_jacobian_radius(graphdef, state, z_star, x, key, iterations))


@partial(jax.jit, static_argnums=(0, 5))
def _jacobian_radius(graphdef, state, z_star, x, key, iterations):
    def f(z, state, x):
        return nnx.merge(graphdef, state)(z, x)
    return stability.spectral_radius(f, z_star, state, x, key=key, steps=iterations, batch_axis=0)


def picard_rate(trace: np.ndarray, *, floor: float = 1e-5) -> np.ndarray:
    """Per-layer contraction factor of a residual trace ``(layers, B)``: the geometric mean ratio
    r[k+1] / r[k] over the layers whose residual is between the last tenth of the trace's first
    value and ``floor`` (above the dtype's rounding floor, past the transient).

    Args:
        trace: residuals ``(layers, B)``, e.g. :func:`convergence`'s ``"unrolled"`` entry.
        floor: the smallest residual used (keep it above the dtype's rounding floor).

    Returns:
        The factor per sequence, shape ``(B,)``. Where fewer than 3 layers lie in the window, the
        second half of the trace is used instead.

    Example:
        >>> import numpy as np
        >>> from deqlab.lab.experiments.sequence import weight_tied
        >>> trace = 0.8 ** np.arange(40.0)[:, None] * np.ones((1, 2))
        >>> np.round(weight_tied.picard_rate(trace), 6).tolist()
        [0.8, 0.8]
    """
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
    """Relative distance ``||z[L] - z*|| / ||z*||`` of the deep network at each depth L, per sequence.

    Args:
        cell: a sequence cell ``f(z, x)``; the deep network starts from z[0] = 0.
        x: the inputs ``(B, T, in_features)``.
        z_star: the equilibrium ``(B, T, width)`` to measure against.
        depths: the depths L, integers >= 1 (one program runs to the largest).

    Returns:
        An array ``(len(depths), B)``; row i is depth ``depths[i]``.

    Raises:
        ValueError: a depth is not an integer >= 1.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab import nn
        >>> from deqlab.lab.experiments.sequence import weight_tied
        >>> cell = nn.TransformerCell(8, 8, heads=2, rngs=nnx.Rngs(0))
        >>> x = jax.random.normal(jax.random.key(0), (2, 5, 8))
        >>> weight_tied.distance_to_equilibrium(cell, x, jnp.ones((2, 5, 8)), [1, 3]).shape
        (2, 2)
    """
    depths = [checks.positive_int(d, "depths", "weight_tied.distance_to_equilibrium") for d in depths]
    graphdef, state = nnx.split(cell)
    distances = np.asarray(_distances(graphdef, state, x, z_star, max(depths)))
    return distances[np.asarray(depths) - 1]


@partial(jax.jit, static_argnums=(0, 4))
def _distances(graphdef, state, x, z_star, depth):
    def layer(z, _):
        z = nnx.merge(graphdef, state)(z, x)
        return z, jnp.sqrt(jnp.sum((z - z_star) ** 2, axis=tuple(range(1, z.ndim)))
                           / jnp.sum(z_star**2, axis=tuple(range(1, z.ndim))))

    return jax.lax.scan(layer, jnp.zeros_like(z_star), None, length=depth)[1]


def jacobian(cell: nnx.Module, z: jax.Array, x: jax.Array) -> np.ndarray:
    """The dense Jacobian ``J_f(z)`` of each sequence, as a ``(T d) x (T d)`` matrix.

    Row block t, column block s is ``d f(z)_t / d z_s`` (positions in order, the width inside). A
    causal cell has no blocks above the diagonal (s > t): J is block lower triangular, and its
    eigenvalues are those of the T diagonal blocks. Built with ``jax.jacfwd`` (T d JVPs per
    sequence, one sequence at a time) in the cell's dtype and returned in float64; meant for the
    small sizes where a dense matrix is cheap (T d up to a few thousand).

    Args:
        cell: a sequence cell ``f(z, x)``.
        z: where the Jacobian is taken, ``(B, T, width)``.
        x: the inputs ``(B, T, in_features)``.

    Returns:
        An array ``(B, T * width, T * width)``, float64.

    Raises:
        ValueError: ``z`` is not of shape ``(B, T, width)``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab import nn
        >>> from deqlab.lab.experiments.sequence import weight_tied
        >>> cell = nn.TransformerCell(4, 4, heads=2, rngs=nnx.Rngs(0))
        >>> x = jax.random.normal(jax.random.key(0), (1, 3, 4))
        >>> j = weight_tied.jacobian(cell, jnp.ones((1, 3, 4)), x)
        >>> j.shape, bool((j[0, :4, 4:] == 0).all())  # position 0 sees no later position
        ((1, 12, 12), True)
    """
    width = getattr(cell, "width", None)
    if getattr(z, "ndim", None) != 3 or z.shape[-1] != width:
        raise ValueError(f"weight_tied.jacobian: `z` must have shape (B, T, {width}), got "
                         f"{getattr(z, 'shape', type(z).__name__)}.")
    graphdef, state = nnx.split(cell)
    return np.asarray(_jacobian(graphdef, state, z, x), dtype=np.float64)


@partial(jax.jit, static_argnums=0)
def _jacobian(graphdef, state, z, x):
    def one(z, x):
        def f(flat):
            return nnx.merge(graphdef, state)(flat.reshape(z.shape)[None], x[None])[0].ravel()
        return jax.jacfwd(f)(z.ravel())

    return jax.lax.map(lambda zx: one(*zx), (z, x))  # one sequence at a time: T d tangents each


def linearisation(cell: nnx.Module, z: jax.Array, x: jax.Array, *, iterations: int = 40,
                  singular_values: bool = True) -> dict[str, np.ndarray]:
    """What the linearisation of f at z says about the fixed-point problem, per sequence.

    Near an equilibrium the plain iteration's error obeys ``e <- J e`` (it contracts iff the
    spectral radius is below 1), and a root finder for ``g(z) = f(z) - z`` works with
    ``J_g = J - I``: the residual bounds the error only up to ``1 / sigma_min(I - J)``. For a normal
    J, ``sigma_min(I - J)`` is the distance from 1 to the spectrum; for a non-normal J it can be
    much smaller (``sigma_min(I - J) = min{||E||_2 : 1 is an eigenvalue of J + E}``: the distance
    from 1 to the spectrum of the nearest perturbed matrix, the pseudospectrum). It is never larger
    than the distance to the spectrum.

    The spectrum of a causal cell (block lower-triangular J, :func:`jacobian`) is taken from its
    diagonal blocks, which is exact and better conditioned than an eigensolver on the whole
    non-normal matrix; otherwise from the whole matrix. The two singular values come from subspace
    iteration with 8 vectors and a Rayleigh-Ritz step (on the inverse of I - J for the smallest):
    ``iterations`` steps, where a dense SVD would cost ten times more at the page's sizes. Ritz values approach ``||J||_2`` from below and ``sigma_min`` from above; at 40 steps
    they agree with a dense SVD to 1e-6 relative on chapter 5's cells (tested against it).

    Args:
        cell: a sequence cell ``f(z, x)``.
        z: where the Jacobian is taken, ``(B, T, width)``, usually the equilibrium.
        x: the inputs ``(B, T, in_features)``.
        iterations: subspace-iteration steps for the singular values, an integer >= 1.
        singular_values: False: skip ``"sigma_min"`` and ``"norm"`` (returned as nan), for a
            spectrum alone.

    Returns:
        A dict of arrays of shape ``(B,)`` (``"eigenvalues"``: ``(B, T * width)``, complex):
        ``"radius"`` (``max |lambda|``), ``"gap"`` (``min |1 - lambda|``), ``"sigma_min"`` (the smallest
        singular value of I - J), ``"norm"`` (``||J||_2``), ``"causal"`` (True where no block lies
        above the diagonal) and ``"eigenvalues"``.

    Raises:
        ValueError: ``z`` is not of shape ``(B, T, width)``, ``iterations`` is not an integer
            >= 1, or ``singular_values`` is not a bool.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab import nn
        >>> from deqlab.lab.experiments.sequence import weight_tied
        >>> cell = nn.TransformerCell(4, 4, heads=2, rngs=nnx.Rngs(0))
        >>> x = jax.random.normal(jax.random.key(0), (2, 3, 4))
        >>> lin = weight_tied.linearisation(cell, jnp.ones((2, 3, 4)), x)
        >>> bool(lin["causal"].all()), bool((lin["sigma_min"] <= lin["gap"] + 1e-9).all())
        (True, True)
    """
    checks.positive_int(iterations, "iterations", "weight_tied.linearisation")
    if not isinstance(singular_values, bool):
        raise checks.fail("singular_values", "True or False", singular_values, "weight_tied.linearisation")
    jacobians = jacobian(cell, z, x)
    with _one_blas_thread():
        return _linearise(jacobians, z.shape[1], z.shape[2], iterations, singular_values)


def _one_blas_thread():
    """Single-threaded BLAS for the dense algebra: at these sizes (T d up to a few thousand) one
    thread is as fast, and several oversubscribe the cores that JAX's own threads (or other
    processes) use: 4.5 times slower on the book's 2-core machine under load. threadpoolctl
    comes with scikit-learn (deqlab's lab extra); without it, nothing changes."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _linearise(jacobians, length, width, iterations, singular_values):
    above = np.triu(np.ones((length, length), bool), 1)[:, None, :, None]
    out = {k: [] for k in ("radius", "gap", "sigma_min", "norm", "causal", "eigenvalues")}
    for j in jacobians:
        blocks = j.reshape(length, width, length, width)
        causal = not np.any(above & (blocks != 0))
        if causal:
            lam = np.concatenate([np.linalg.eigvals(blocks[t, :, t, :]) for t in range(length)])
        else:
            lam = np.linalg.eigvals(j)
        sigma_min = norm = np.nan
        if singular_values:
            inverse = np.linalg.inv(np.eye(j.shape[0]) - j)
            sigma_min = 1.0 / _largest_singular_value(lambda v: inverse @ v, lambda v: inverse.T @ v, j.shape[0],
                                                      iterations)
            norm = _largest_singular_value(lambda v: j @ v, lambda v: j.T @ v, j.shape[0], iterations)
        out["radius"].append(np.abs(lam).max())
        out["gap"].append(np.abs(1.0 - lam).min())
        out["sigma_min"].append(sigma_min)
        out["norm"].append(norm)
        out["causal"].append(causal)
        out["eigenvalues"].append(lam)
    return {k: np.asarray(v) for k, v in out.items()}


def _largest_singular_value(apply, apply_transpose, n, iterations, k=8):
    """``||A||_2`` by subspace iteration on A^T A (k vectors, Rayleigh-Ritz at the end): a lower bound
    that converges like (sigma_{k+1} / sigma_1)^(2 iterations)."""
    k = min(k, n)
    basis = np.linalg.qr(np.random.default_rng(0).standard_normal((n, k)))[0]
    for _ in range(iterations):
        basis = np.linalg.qr(apply_transpose(apply(basis)))[0]
    return float(np.linalg.svd(apply(basis), compute_uv=False)[0])
