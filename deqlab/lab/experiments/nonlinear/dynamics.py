"""Solver dynamics near the threshold and the NTK of the nonlinear DEQ (001 §5.3, App. B.1).

The model is 001's ``z* = phi(W z*) + x`` (Eq. 21, 87), ``h* = W z*``, ``W = sqrt(V) W0`` with
``W0`` from :func:`deqlab.ensembles.sample` (the convention of :mod:`deqlab.theory.meanfield`).

**Solvers (001 §5.3).** :func:`solver_statistics` draws ``samples`` matrices and inputs per
``sqrt(V)`` and solves the forward fixed point and the adjoint system ``u = g + J^T u``,
``J = diag(phi'(h*)) W`` (the backward solve of the implicit gradient, 003 Eq. 11) with Picard,
Anderson and Broyden (:mod:`deqlab.solvers`), returning steps, convergence and the empirical
contraction rate (:func:`contraction_rate`) per sample. 001 analyses only Picard iteration, whose
rate is the spectral radius of ``J`` (001 Eq. 29, :func:`deqlab.theory.meanfield.picard_rate`);
§5.3 leaves the quasi-Newton solvers open: here they are measured.

**The NTK (001 App. B.1).** With the readout ``f(x) = v . z*(x) / sqrt(N)`` (001 Eq. 89 with
``v / sqrt(N)``, so that ``f = O(1)``), differentiating ``z* = phi(W z*) + x`` gives
``dz* = (I - D W)^{-1} D dW z*``, ``D = diag(phi'(h*))``, hence

    ``df / dW = a z*^T``,  ``a = D (I - W^T D)^{-1} v / sqrt(N)``                  (001 Eq. 93, corrected)

(001 Eq. 93 writes ``(I - phi'(z*) o W)^{-T} v (phi'(z*) o z*)^T``: ``phi'`` at ``z*`` instead of
``h*``, and the diagonal factor on ``z*`` instead of on the adjoint vector). In the NTK
parametrisation ``W = sqrt(V / N) omega`` the kernel with respect to ``omega`` is

    ``Theta(x, x') = (V / N) (a . a') (z* . z*')``                                   (001 Eq. 94)

and its average over ``v ~ N(0, I)`` is ``V T K`` with ``K = z* . z*' / N`` (001 Eq. 91) and
``T = (1/N) tr[(I - D W)^{-1} D D' (I - W^T D')^{-1}]`` (001 Eq. 95, corrected: both diagonal
factors inside the trace). For Ginibre ``W`` with ``D`` free from ``W`` (the mean-field
assumption of 001 §3.1) the trace sums the nested pairings ``T = m11 / (1 - V m11)``,
``m11 = E[phi'(h) phi'(h')]``, so ``Theta = q12 m11 / (1 - V m11)`` with ``q12`` the hidden
covariance, the fixed point of ``q12 = V (E[phi(h) phi(h')] + x . x' / N)`` (the two-input form of
001 Eq. 25): :func:`ntk_mean_field`. On the diagonal this is ``q m2 / (1 - r^2)``, ``r^2 = V m2``
(001 Eq. 30): the kernel diverges at the threshold.

Arguments out of range raise ``ValueError`` naming the argument (:mod:`deqlab.checks`).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import checks, ensembles, solvers
from deqlab.backward import adjoint_solve, fixed_point
from deqlab.theory import meanfield

__all__ = [
    "SOLVERS",
    "DIRECTIONS",
    "SolverStatistics",
    "contraction_rate",
    "sample_problems",
    "solver_statistics",
    "half_point",
    "equilibrium",
    "readout_gradient",
    "paper_eq93_gradient",
    "empirical_ntk",
    "NTKDraws",
    "ntk_draws",
    "ntk_mean_field",
    "inputs_on_circle",
]

SOLVERS: tuple[str, ...] = ("picard", "anderson", "broyden")
"""The solvers compared (names of :data:`deqlab.solvers.SOLVERS`)."""

DIRECTIONS: tuple[str, ...] = ("forward", "backward")
"""The forward fixed point and the adjoint solve of the implicit gradient (003 Eq. 11)."""


def _phi(phi: Any, where: str):
    return meanfield.nonlinearity(phi, where)


def _ensemble(ensemble: Any, where: str) -> str:
    return checks.choice(ensemble, "ensemble", meanfield.ENSEMBLES, where)


def _tol(tol: Any, where: str) -> float:
    return checks.number(tol, "tol", where, lower=0.0, upper=1.0, lower_open=True, upper_open=True)


# --------------------------------------------------------------------------------------------
# Contraction rates and solver statistics (001 Eq. 29, §5.3)
# --------------------------------------------------------------------------------------------


def contraction_rate(trace: Any, steps: Any) -> jax.Array:
    """Empirical linear rate of a converged iteration from its relative-residual trace:
    ``r = (rho_k / rho_{k//2})^{1 / (k - k//2)}``, ``k`` = the steps taken, i.e. the geometric mean
    contraction over the second half of the run (the first steps are a transient; 001 Eq. 29
    predicts ``rho_t ~ r^t`` for Picard).

    Args:
      trace: ``stats.residual_trace`` of :func:`deqlab.solvers.solve`, shape ``(T + 1, B)``.
      steps: ``stats.steps``, shape ``(B,)`` (each ``<= T``).
    Returns:
      ``(B,)`` rates; NaN where ``steps < 2``.
    """
    trace = jnp.asarray(trace)
    steps = jnp.asarray(steps)
    if trace.ndim != 2 or steps.shape != trace.shape[1:]:
        raise checks.fail("trace", f"a (T + 1, B) residual trace with steps of shape (B,), got trace "
                          f"{trace.shape} and steps {steps.shape}", trace.shape, "contraction_rate")
    cols = jnp.arange(trace.shape[1])
    k = jnp.clip(steps, 0, trace.shape[0] - 1)
    half = k // 2
    log_ratio = jnp.log(trace[k, cols]) - jnp.log(trace[half, cols])
    return jnp.where(k >= 2, jnp.exp(log_ratio / jnp.maximum(k - half, 1)), jnp.nan)


@functools.partial(jax.jit, static_argnames=("ensemble", "n", "samples"))
def _problems(ensemble, key, n, scale, samples, sigma_x):
    kw, kx, kg = jax.random.split(key, 3)
    W = jax.vmap(lambda k: ensembles.sample(ensemble, k, n, scale, jnp.float64))(jax.random.split(kw, samples))
    x = sigma_x * jax.random.normal(kx, (samples, n), jnp.float64)
    g = jax.random.normal(kg, (samples, n), jnp.float64)
    return W, x, g


def sample_problems(ensemble: str, key: Any, n: int, scale: float, samples: int, sigma_x2: float = 1.0):
    """``samples`` problems ``(W, x, g)``: ``W = scale W0`` from ``ensemble`` (shape
    ``(samples, n, n)``), inputs ``x`` with i.i.d. ``N(0, sigma_x2)`` entries and adjoint
    cotangents ``g`` with ``N(0, 1)`` entries, float64 (001 §3 setting)."""
    where = "experiments.nonlinear.dynamics.sample_problems"
    ensemble = _ensemble(ensemble, where)
    key = checks.prng_key(key, "key", where)
    n = checks.positive_int(n, "n", where)
    scale = checks.number(scale, "scale", where, lower=0.0)
    samples = checks.positive_int(samples, "samples", where)
    sigma_x2 = checks.number(sigma_x2, "sigma_x2", where, lower=0.0)
    return _problems(ensemble, key, n, scale, samples, math.sqrt(sigma_x2))


@functools.lru_cache(maxsize=None)
def _solver_fn(phi: str, solver: str, tol: float, max_steps: int):
    nl = meanfield.nonlinearity(phi)
    config = solvers.get_solver(solver, tol=tol, max_steps=max_steps)

    def f(z, W, x):
        return nl.jax(jnp.einsum("bij,bj->bi", W, z)) + x

    @jax.jit
    def run(W, x, g):
        # convergence is what this measures (returned per sample), not a failure to report
        fwd = solvers.solve(f, jnp.zeros_like(x), W, x, solver=config, batch_axis=0, on_failure="ignore")
        bwd = adjoint_solve(f, fwd.value, (W, x), g, solver=config, batch_axis=0, on_failure="ignore")
        out = []
        for sol in (fwd, bwd):
            st = sol.stats
            out.append((st.steps, sol.converged, contraction_rate(st.residual_trace, st.steps)))
        return out

    return run


class SolverStatistics(NamedTuple):
    """Output of :func:`solver_statistics`; arrays indexed ``[solver, direction, scale, sample]``
    (``direction`` 0 forward, 1 backward, :data:`DIRECTIONS`).

    Attributes:
      steps: iterations taken (NFE = steps + 1, the evaluation at ``z0 = 0`` included).
      converged: reached ``tol`` within ``max_steps`` (backward: and the forward solve did too).
      rate: :func:`contraction_rate` of converged samples (NaN otherwise).
    """

    scales: np.ndarray
    solvers: tuple[str, ...]
    steps: np.ndarray
    converged: np.ndarray
    rate: np.ndarray

    @property
    def fraction(self) -> np.ndarray:
        """Converged fraction per ``[solver, direction, scale]``."""
        return self.converged.mean(axis=-1)

    def mean_steps(self) -> np.ndarray:
        """Mean steps of the converged samples per ``[solver, direction, scale]`` (NaN if none)."""
        s = np.where(self.converged, self.steps, 0)
        count = self.converged.sum(axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, s.sum(axis=-1) / count, np.nan)


def solver_statistics(phi: str, ensemble: str, key: Any, n: int, scales: Sequence[float], samples: int,
                      solvers: Sequence[str] = SOLVERS, tol: float = 1e-8, max_steps: int = 300,
                      sigma_x2: float = 1.0) -> SolverStatistics:
    """Steps, convergence and empirical rates of forward and backward solves of the nonlinear DEQ
    ``z* = phi(W z*) + x`` (001 Eq. 21) per ``sqrt(V)`` in ``scales`` (001 §5.3: how quasi-Newton
    solvers fare near the threshold of 001 §3.2; Picard's rate is 001 Eq. 29).

    For each scale, ``samples`` independent ``(W, x, g)`` (:func:`sample_problems`, one key per
    scale folded from ``key``; the same keys for every solver, so solvers see the same problems).
    Forward: from ``z0 = 0`` to relative residual ``tol``; backward: the adjoint fixed point
    ``u = g + J^T u`` at the forward solution with the same solver (Anderson and Broyden act as
    Krylov methods on this affine map). One compiled program per solver; the batch of samples is
    solved together (each sample judged on its own).

    Args:
      phi: a name of :data:`deqlab.theory.meanfield.PHIS`. ensemble: of ``meanfield.ENSEMBLES``.
      key: a JAX PRNG key. n: width ``N >= 1``. scales: ``sqrt(V) >= 0`` values (non-empty).
      samples: problems per scale ``>= 1``. solvers: names from :data:`SOLVERS` (non-empty,
      distinct). tol: in (0, 1). max_steps: ``>= 2``. sigma_x2: input mean square ``>= 0``.
    """
    where = "experiments.nonlinear.dynamics.solver_statistics"
    nl = _phi(phi, where)
    ensemble = _ensemble(ensemble, where)
    key = checks.prng_key(key, "key", where)
    n = checks.positive_int(n, "n", where)
    scales_arr = np.atleast_1d(np.asarray(scales, dtype=np.float64))
    if scales_arr.ndim != 1 or scales_arr.size == 0 or not np.all(np.isfinite(scales_arr)) or np.any(scales_arr < 0):
        raise checks.fail("scales", "a non-empty 1-d sequence of finite numbers >= 0", scales, where)
    samples = checks.positive_int(samples, "samples", where)
    if isinstance(solvers, str) or len(solvers) == 0 or len(set(solvers)) != len(solvers):
        raise checks.fail("solvers", f"a non-empty sequence of distinct names from {SOLVERS}", solvers, where)
    names = tuple(checks.choice(s, "solvers", SOLVERS, where) for s in solvers)
    tol = _tol(tol, where)
    max_steps = checks.integer(max_steps, "max_steps", where, minimum=2)
    sigma_x2 = checks.number(sigma_x2, "sigma_x2", where, lower=0.0)
    shape = (len(names), 2, scales_arr.size, samples)
    steps = np.zeros(shape, np.int64)
    conv = np.zeros(shape, bool)
    rate = np.full(shape, np.nan)
    for j, s in enumerate(scales_arr):
        W, x, g = _problems(ensemble, jax.random.fold_in(key, j), n, float(s), samples, math.sqrt(sigma_x2))
        for i, name in enumerate(names):
            out = _solver_fn(nl.name, name, tol, max_steps)(W, x, g)
            fwd_ok = np.asarray(out[0][1])
            for d, (st, ok, r) in enumerate(out):
                ok = np.asarray(ok) & fwd_ok
                steps[i, d, j] = np.asarray(st)
                conv[i, d, j] = ok
                rate[i, d, j] = np.where(ok, np.asarray(r), np.nan)
    return SolverStatistics(scales_arr, names, steps, conv, rate)


def half_point(scales: Any, fraction: Any) -> float:
    """The scale where a converged ``fraction`` (decreasing along ``scales``) first drops below
    1/2, by linear interpolation between the grid points around the drop; NaN if it never does
    or starts below 1/2."""
    s = np.asarray(scales, dtype=np.float64)
    f = np.asarray(fraction, dtype=np.float64)
    if s.ndim != 1 or f.shape != s.shape or s.size < 2:
        raise checks.fail("fraction", "a 1-d array shaped like `scales` (>= 2 points)", f.shape, "half_point")
    below = np.flatnonzero(f < 0.5)
    if below.size == 0 or below[0] == 0:
        return float("nan")
    k = below[0]
    return float(s[k - 1] + (f[k - 1] - 0.5) / (f[k - 1] - f[k]) * (s[k] - s[k - 1]))


# --------------------------------------------------------------------------------------------
# The NTK (001 App. B.1)
# --------------------------------------------------------------------------------------------


def _matrix_input(W, X, where):
    W = jnp.asarray(W)
    X = jnp.asarray(X)
    if W.ndim != 2 or W.shape[0] != W.shape[1]:
        raise checks.fail("W", "a square (N, N) matrix", W.shape, where)
    if X.ndim != 2 or X.shape[1] != W.shape[0]:
        raise checks.fail("X", f"a (P, N) array of inputs with N = {W.shape[0]}", X.shape, where)
    return W, X


def _f_map(nl):
    return lambda z, W, x: nl.jax(z @ W.T) + x


def equilibrium(phi: str, W: Any, X: Any, tol: float = 1e-12, max_steps: int = 1000) -> jax.Array:
    """``z*`` for each row of ``X`` (shape ``(P, N)``): ``z* = phi(W z*) + x`` (001 Eq. 87) by
    Anderson acceleration to relative residual ``tol``; NaN rows where it fails."""
    where = "experiments.nonlinear.dynamics.equilibrium"
    nl = _phi(phi, where)
    W, X = _matrix_input(W, X, where)
    sol = solvers.solve(_f_map(nl), jnp.zeros_like(X), W, X, solver=solvers.Anderson(tol=_tol(tol, where),
                        max_steps=checks.positive_int(max_steps, "max_steps", where)), batch_axis=0,
                        on_failure="nan")  # NaN rows mark the inputs whose solve failed
    return sol.value


def _readout_problem(phi: str, W: Any, X: Any, v: Any, tol: float, where: str):
    """Checked ``(nonlinearity, W, v, Z)`` of a readout ``f(x) = v . z*(x) / sqrt(N)``, ``Z[p] = z*(x_p)``."""
    nl = _phi(phi, where)
    W, X = _matrix_input(W, X, where)
    v = jnp.asarray(v)
    if v.shape != (W.shape[0],):
        raise checks.fail("v", f"a readout vector of shape ({W.shape[0]},)", v.shape, where)
    return nl, W, v, equilibrium(nl.name, W, X, tol)


def readout_gradient(phi: str, W: Any, X: Any, v: Any, tol: float = 1e-12) -> tuple[jax.Array, jax.Array]:
    """``(A, Z)`` with ``df(x_p) / dW = A[p] Z[p]^T`` for ``f(x) = v . z*(x) / sqrt(N)``: ``Z[p] = z*(x_p)``
    and ``A[p] = D (I - W^T D)^{-1} v / sqrt(N)``, ``D = diag(phi'(W z*))`` (001 Eq. 93 corrected:
    ``phi'`` at ``h* = W z*``, the diagonal on the adjoint side)."""
    where = "experiments.nonlinear.dynamics.readout_gradient"
    nl, W, v, Z = _readout_problem(phi, W, X, v, tol, where)
    D = nl.derivative_jax(Z @ W.T)
    eye = jnp.eye(W.shape[0], dtype=W.dtype)
    u = jax.vmap(lambda d: jnp.linalg.solve(eye - W.T * d[None, :], v))(D)
    return D * u / math.sqrt(W.shape[0]), Z


def paper_eq93_gradient(phi: str, W: Any, X: Any, v: Any, tol: float = 1e-12) -> tuple[jax.Array, jax.Array]:
    """001 Eq. 93 as printed, ``df/dW = (I - phi'(z*) o W)^{-T} v (phi'(z*) o z*)^T / sqrt(N)``:
    ``(B, C)`` with ``df(x_p)/dW = B[p] C[p]^T``. Kept to show that it disagrees with autodiff
    (``phi'`` is evaluated at ``z*`` instead of ``h*``, and the diagonal sits on ``z*``)."""
    where = "experiments.nonlinear.dynamics.paper_eq93_gradient"
    nl, W, v, Z = _readout_problem(phi, W, X, v, tol, where)
    Dz = nl.derivative_jax(Z)
    eye = jnp.eye(W.shape[0], dtype=W.dtype)
    B = jax.vmap(lambda d: jnp.linalg.solve((eye - d[:, None] * W).T, v))(Dz)
    return B / math.sqrt(W.shape[0]), Dz * Z


def empirical_ntk(phi: str, W: Any, X: Any, v: Any, scale: float, method: str = "formula",
                  tol: float = 1e-12) -> jax.Array:
    """The finite-width NTK ``Theta[p, q] = (V / N) sum_ij df(x_p)/dW_ij df(x_q)/dW_ij`` of
    ``f(x) = v . z*(x) / sqrt(N)`` with respect to ``omega = sqrt(N / V) W`` (NTK
    parametrisation; 001 Eq. 94 for fixed ``v``), ``V = scale^2``.

    ``method="formula"``: from :func:`readout_gradient`, ``(V/N) (A A^T) * (Z Z^T)``.
    ``method="autodiff"``: ``jax.jacrev`` of ``f`` through :func:`deqlab.backward.fixed_point`'s implicit
    gradient (GMRES adjoint), the Gram matrix of the flattened gradients (``O(P N^2)`` memory).
    """
    where = "experiments.nonlinear.dynamics.empirical_ntk"
    nl = _phi(phi, where)
    W, X = _matrix_input(W, X, where)
    v = jnp.asarray(v)
    if v.shape != (W.shape[0],):
        raise checks.fail("v", f"a readout vector of shape ({W.shape[0]},)", v.shape, where)
    scale = checks.number(scale, "scale", where, lower=0.0, lower_open=True)
    method = checks.choice(method, "method", ("formula", "autodiff"), where)
    tol = _tol(tol, where)
    n = W.shape[0]
    if method == "formula":
        A, Z = readout_gradient(nl.name, W, X, v, tol)
        return scale**2 / n * (A @ A.T) * (Z @ Z.T)
    f_map = _f_map(nl)

    def readout(Wm, x):
        # "nan" makes a failed adjoint's gradient NaN; a failed forward solve (whose value is NaN
        # and passes no gradient) is marked NaN below, from its converged flag
        sol = fixed_point(f_map, jnp.zeros_like(x), Wm, x, solver=solvers.Anderson(tol=tol, max_steps=1000),
                          backward=_implicit_gmres(tol), on_failure="nan")
        return v @ sol.value / math.sqrt(n), sol.converged

    grad = jax.jit(jax.grad(readout, has_aux=True))

    def row(x):
        g, converged = grad(W, x)
        return jnp.where(converged, g.reshape(-1), jnp.nan)

    G = jnp.stack([row(x) for x in X])
    return scale**2 / n * G @ G.T


def _implicit_gmres(tol):
    from deqlab.backward import Implicit
    return Implicit(solver="gmres", tol=tol, max_steps=1000)


@functools.partial(jax.jit, static_argnames=("phi", "ensemble", "n", "draws"))
def _ntk_draws(phi, ensemble, key, n, scale, X, draws):
    nl = meanfield.nonlinearity(phi)
    eye = jnp.eye(n, dtype=jnp.float64)
    f_map = _f_map(nl)

    def one(k):
        kw, kv = jax.random.split(k)
        W = ensembles.sample(ensemble, kw, n, scale, jnp.float64)
        v = jax.random.normal(kv, (n,), jnp.float64)
        sol = solvers.solve(f_map, jnp.zeros_like(X), W, X, solver=solvers.Anderson(tol=1e-12, max_steps=1000),
                            batch_axis=0)
        Z = sol.value
        D = nl.derivative_jax(Z @ W.T)
        # R[p] = (I - W^T D_p)^{-1}: a = D R v / sqrt(N); E_v[a . a'] = tr(D R R'^T D') / N (Eq. 95)
        R = jax.vmap(lambda d: jnp.linalg.solve(eye - W.T * d[None, :], eye))(D)
        M = D[:, :, None] * R / math.sqrt(n)  # (P, N, N): a_p = M_p v
        A = M @ v
        K = Z @ Z.T / n
        T = jnp.einsum("pij,qij->pq", M, M)
        theta = scale**2 * (A @ A.T) * K
        ok = jnp.all(sol.converged)
        return (jnp.where(ok, theta, jnp.nan), jnp.where(ok, scale**2 * T * K, jnp.nan),
                jnp.where(ok, K, jnp.nan))

    return jax.lax.map(one, jax.random.split(key, draws))


class NTKDraws(NamedTuple):
    """Output of :func:`ntk_draws`, each ``(draws, P, P)``: ``theta`` the NTK for the drawn ``v``
    (001 Eq. 94), ``theta_v`` its average over ``v`` (``V T K``, 001 Eq. 95 corrected), ``nngp``
    ``K = z* . z*' / N`` (001 Eq. 91). NaN for a draw whose forward solve failed."""

    theta: np.ndarray
    theta_v: np.ndarray
    nngp: np.ndarray


def ntk_draws(phi: str, ensemble: str, key: Any, n: int, scale: float, X: Any, draws: int) -> NTKDraws:
    """The NTK of ``f(x) = v . z*(x) / sqrt(N)`` (001 App. B.1) over ``draws`` independent
    ``(W, v)``, ``W = scale W0`` from ``ensemble``, ``v ~ N(0, I)``, on the inputs ``X`` (``(P, n)``),
    by the corrected closed form of the gradient (:func:`readout_gradient`); float64."""
    where = "experiments.nonlinear.dynamics.ntk_draws"
    nl = _phi(phi, where)
    ensemble = _ensemble(ensemble, where)
    key = checks.prng_key(key, "key", where)
    n = checks.positive_int(n, "n", where)
    scale = checks.number(scale, "scale", where, lower=0.0, lower_open=True)
    X = jnp.asarray(X, jnp.float64)
    if X.ndim != 2 or X.shape[1] != n:
        raise checks.fail("X", f"a (P, n) array of inputs with n = {n}", X.shape, where)
    draws = checks.positive_int(draws, "draws", where)
    out = _ntk_draws(nl.name, ensemble, key, n, scale, X, draws)
    return NTKDraws(*(np.asarray(o) for o in out))


def _bivariate(nl, q1, q2, q12, nodes=80):
    """``(E phi(h) phi(h'), E phi'(h) phi'(h'))`` for centred Gaussians of variances ``q1, q2`` and
    covariance ``q12`` (probabilists' Gauss-Hermite, ``nodes^2`` points)."""
    u, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / w.sum()
    rho = q12 / math.sqrt(q1 * q2)
    rho = min(1.0, max(-1.0, rho))
    h1 = math.sqrt(q1) * u[:, None]
    h2 = math.sqrt(q2) * (rho * u[:, None] + math.sqrt(max(0.0, 1 - rho * rho)) * u[None, :])
    ww = w[:, None] * w[None, :]
    phi1, phi2 = nl.numpy(h1), nl.numpy(h2)
    d1, d2 = nl.derivative_numpy(h1), nl.derivative_numpy(h2)
    return float(np.sum(ww * phi1 * phi2)), float(np.sum(ww * d1 * d2))


def ntk_mean_field(phi: str, V: float, sigma_x2: float, sigma_x2_prime: float, overlap: float) -> float:
    """Mean-field NTK ``Theta(x, x')`` of 001 App. B.1 (Eq. 95 corrected, averaged over ``v``) for
    Ginibre ``W`` with ``D`` free from ``W``: ``q12 m11 / (1 - V m11)`` (module docstring), where
    ``q = hidden_variance`` for each input (001 Eq. 25), ``q12 = V (E[phi(h) phi(h')] + overlap)``
    solved by iteration and ``m11 = E[phi'(h) phi'(h')]``.

    Args:
      phi: one of ``meanfield.PHIS``. V: ``> 0``, below the critical variance.
      sigma_x2, sigma_x2_prime: ``x . x / N`` and ``x' . x' / N`` (``> 0``).
      overlap: ``x . x' / N``, ``overlap^2 <= sigma_x2 sigma_x2_prime``. Inputs of mean zero.
    """
    where = "experiments.nonlinear.dynamics.ntk_mean_field"
    nl = _phi(phi, where)
    V = checks.number(V, "V", where, lower=0.0, lower_open=True)
    s1 = checks.number(sigma_x2, "sigma_x2", where, lower=0.0, lower_open=True)
    s2 = checks.number(sigma_x2_prime, "sigma_x2_prime", where, lower=0.0, lower_open=True)
    bound = math.sqrt(s1 * s2)
    c = checks.number(overlap, "overlap", where)
    if abs(c) > bound * (1 + 1e-12):
        raise checks.fail("overlap", f"in [-{bound:g}, {bound:g}] (Cauchy-Schwarz)", overlap, where)
    r = meanfield.spectral_radius(nl.name, "gaussian", V, s1)
    if r >= 1 or meanfield.spectral_radius(nl.name, "gaussian", V, s2) >= 1:
        raise checks.fail("V", f"below the critical variance of {nl.name!r} (r = {r:.4g} >= 1)", V, where)
    q1 = meanfield.hidden_variance(nl.name, "gaussian", V, s1)
    q2 = meanfield.hidden_variance(nl.name, "gaussian", V, s2)
    q12 = V * c
    for _ in range(2000):  # contracts with slope V m11 <= r^2 < 1
        new = V * (_bivariate(nl, q1, q2, q12)[0] + c)
        if abs(new - q12) <= 1e-14 * max(1.0, abs(new)):
            q12 = new
            break
        q12 = new
    m11 = _bivariate(nl, q1, q2, q12)[1]
    return q12 * m11 / (1 - V * m11)


def inputs_on_circle(key: Any, n: int, angles: Any, sigma_x2: float = 1.0) -> jax.Array:
    """Inputs ``x_p = sqrt(N sigma_x2) (cos a_p e + sin a_p e')`` for two random orthonormal
    directions ``e, e'``: ``x_p . x_q / N = sigma_x2 cos(a_p - a_q)`` exactly (shape ``(P, n)``)."""
    where = "experiments.nonlinear.dynamics.inputs_on_circle"
    key = checks.prng_key(key, "key", where)
    n = checks.integer(n, "n", where, minimum=2)
    a = np.atleast_1d(np.asarray(angles, dtype=np.float64))
    if a.ndim != 1 or not np.all(np.isfinite(a)):
        raise checks.fail("angles", "a 1-d sequence of finite numbers", angles, where)
    sigma_x2 = checks.number(sigma_x2, "sigma_x2", where, lower=0.0)
    E, _ = jnp.linalg.qr(jax.random.normal(key, (n, 2), jnp.float64))
    return math.sqrt(n * sigma_x2) * (jnp.cos(a)[:, None] * E[:, 0] + jnp.sin(a)[:, None] * E[:, 1])
