"""Chapter 1, "Linear DEQs and random matrix ensembles": the simulations behind its pages.

Every function draws its weights with :mod:`deqlab.ensembles` (``W = sqrt(V) W0``, same ``V`` as
:mod:`deqlab.theory.linear`) and does the linear algebra in float64 NumPy/SciPy:

- :func:`draw`: a batch of ``W0`` matrices as float64 arrays;
- :func:`tied_traces` / :func:`untied_traces`: per-matrix normalised traces ``tr[M]``,
  ``tr[M^T M]`` and ``tr[(M^T M)^2]`` of the tied resolvent ``M = (I - W)^{-1}`` or of the
  untied series ``M = sum_k W_1 ... W_k`` (001 Eq. 4, 6);
- :func:`length_variance_sample`: ``Var_x[z . z] / N`` by sampling inputs, for 001 Lemma 2.2;
- :func:`fixed_points`: ``z* = (I - W)^{-1} x`` for one input and many ``W`` (001 Theorem A.2);
- :func:`iterate`: the tied (001 Eq. 3) and untied (001 Eq. 6) iterations side by side;
- :func:`trace_sweep`: ``tr[((I - sqrt(V) W0)^T (I - sqrt(V) W0))^{-2}]`` over a sweep of ``V``
  from one decomposition per matrix (001 Fig. 1), exact or by Hutch++ with a standard error;
- :func:`draw_reduced`: one ``W0`` in a reduced form (Hessenberg, tridiagonal, pentadiagonal)
  whose sweep has the law of a :func:`draw`'s, in ``O(n^2)`` (001 Fig. 1 at ``N = 5000``);
- :func:`spectral_radii`, :func:`divergence_probability`: finite-``N`` failure of the iteration;
- :func:`ntk_samples`: the finite-width NTK of ``f = v^T z*`` (001 App. B.1).

``V`` is always the variance (``scale = sqrt(V)`` in :mod:`deqlab.ensembles`); ensemble names are
those of :data:`deqlab.theory.linear.ENSEMBLES` (the registry :data:`deqlab.ensembles.ENSEMBLES`
less ``"antisymmetric"``). Summaries of the samples (means with standard errors, Richardson
extrapolation, power-law fits) are in :mod:`deqlab.lab.stats`.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

from deqlab import checks, ensembles
from deqlab.theory import linear as theory

__all__ = [
    "draw",
    "tied_traces",
    "untied_traces",
    "length_variance_sample",
    "fixed_points",
    "iterate",
    "trace_sweep",
    "draw_reduced",
    "SWEEP_METHODS",
    "spectral_radii",
    "divergence_probability",
    "quantile_interval",
    "ntk_samples",
]


def _ensemble(ensemble, where: str) -> str:
    checks.choice(ensemble, "ensemble", ensembles.ENSEMBLES, where)
    return checks.choice(ensemble, "ensemble", theory.ENSEMBLES, where)


def _variance(V, where: str) -> float:
    return checks.number(V, "V", where, lower=0.0)


def _block(n: int) -> int:
    # Matrices per compiled sampler call: about 16 MiB of float64, at most 64.
    return int(min(64, max(1, 2**21 // (n * n))))


@functools.partial(jax.jit, static_argnums=(0, 2, 3))
def _draw_block(ensemble, key, n, dtype):
    # A fixed block size makes one XLA compilation per (ensemble, n, dtype), whatever the number
    # of samples asked for: compiling the vmapped sampler costs far more than a block of draws.
    keys = jax.random.split(key, _block(n))
    return jax.vmap(lambda k: ensembles.sample(ensemble, k, n, 1.0, dtype))(keys)


def draw(ensemble: str, key: jax.Array, n: int, samples: int = 1) -> np.ndarray:
    """``samples`` independent ``n x n`` matrices ``W0`` (``V = 1``) as a float64 array.

    Sampled with :func:`deqlab.ensembles.sample` under ``jax.vmap``, in jitted blocks of a size
    that depends on ``n`` only (one compilation per ensemble and ``n``), in float64 when JAX's x64
    mode is on and in float32 otherwise; float32 Haar samples are re-orthonormalised in float64
    (a QR whose ``R`` is the identity up to ``1e-7``), so that ``W0^T W0 = I`` to float64
    precision and the orthogonal ensemble's guaranteed spectral radius 1 holds exactly.
    """
    where = "experiments.linear.draw"
    ensemble = _ensemble(ensemble, where)
    key = checks.prng_key(key, "key", where)
    n = checks.positive_int(n, "n", where)
    samples = checks.positive_int(samples, "samples", where)
    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    blocks = [_draw_block(ensemble, k, n, dtype)
              for k in jax.random.split(key, math.ceil(samples / _block(n)))]
    w = np.concatenate([np.asarray(b, dtype=np.float64) for b in blocks])[:samples]
    if ensemble == "orthogonal" and dtype == jnp.float32:
        q, r = np.linalg.qr(w)
        w = q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :]
    return w


def _traces(m: np.ndarray) -> dict[str, np.ndarray]:
    n = m.shape[-1]
    gram = np.swapaxes(m, -1, -2) @ m
    return {
        "first": np.trace(m, axis1=-2, axis2=-1) / n,
        "second": np.trace(gram, axis1=-2, axis2=-1) / n,
        "fourth": np.sum(gram * gram, axis=(-2, -1)) / n,  # tr[G^2] = ||G||_F^2, G symmetric
    }


def tied_traces(w0: np.ndarray, V: float) -> dict[str, np.ndarray]:
    """Normalised traces of ``M = (I - sqrt(V) W0)^{-1}`` for each matrix of a batch ``w0``.

    Returns ``{"first": tr[M], "second": tr[M^T M], "fourth": tr[(M^T M)^2]}`` (arrays of the
    batch shape), whose ``N -> inf`` means are :func:`deqlab.theory.linear.first_moment`,
    ``second_moment`` and ``gram_trace(power=2)``.
    """
    v = _variance(V, "experiments.linear.tied_traces")
    w0 = np.asarray(w0, dtype=np.float64)
    eye = np.eye(w0.shape[-1])
    m = np.linalg.solve(eye - math.sqrt(v) * w0, np.broadcast_to(eye, w0.shape))
    return _traces(m)


def untied_traces(ensemble: str, key: jax.Array, n: int, V: float, samples: int,
                  depth: int | None = None) -> dict[str, np.ndarray]:
    """Traces of the untied series ``M_t = I + W_{t-1} M_{t-1}`` (001 Eq. 6 with ``z = M x``).

    A fresh ``W = sqrt(V) W0`` is drawn for every step and sample. ``depth`` defaults to the
    number of steps after which ``V^t < 1e-12`` (the neglected tail of ``tr[M^T M]`` is of
    order ``V^t / (1 - V)``). Same keys as :func:`tied_traces`.
    """
    where = "experiments.linear.untied_traces"
    ensemble = _ensemble(ensemble, where)
    key = checks.prng_key(key, "key", where)
    n = checks.positive_int(n, "n", where)
    samples = checks.positive_int(samples, "samples", where)
    v = checks.number(V, "V", where, lower=0.0, upper=1.0, upper_open=True)  # untied V_c = 1
    if depth is None:
        depth = 1 if v == 0 else max(1, math.ceil(math.log(1e-12) / math.log(v)))
    depth = checks.positive_int(depth, "depth", where)
    eye = np.eye(n)
    m = np.broadcast_to(eye, (samples, n, n)).copy()
    for w in _weight_stream(ensemble, key, n, samples, depth):
        m = eye + math.sqrt(v) * (w @ m)
    return _traces(m)


def _weight_stream(ensemble, key, n, samples, steps, budget=2**24):
    """Yield ``steps`` independent batches ``(samples, n, n)`` of ``W0``.

    They are drawn in chunks of at most 16 steps (and at most ``budget`` bytes), so that the
    per-call overhead of :func:`draw` is paid once per chunk rather than once per step; the
    unused tail of the last chunk is discarded."""
    per_step = samples * n * n * 8
    chunk = int(max(1, min(16, budget // max(per_step, 1))))
    done = 0
    for chunk_key in jax.random.split(key, math.ceil(steps / chunk)):
        w = draw(ensemble, chunk_key, n, samples * chunk).reshape(chunk, samples, n, n)
        size = min(chunk, steps - done)
        yield from w[:size]
        done += size


def length_variance_sample(m: np.ndarray, key: jax.Array, draws: int) -> tuple[float, float, float]:
    """Sample ``Var_x[z . z] / N`` for ``z = M x``, ``x`` i.i.d. ``N(0, 1)`` (001 Definition 2.1).

    Returns ``(estimate, standard_error, exact)`` where ``exact = 2 tr[(M^T M)^2]`` is 001 Lemma
    2.2. The standard error of the sample variance ``s^2`` of ``draws`` values is
    ``sqrt((m4 - s^4) / draws)`` with ``m4`` the sample fourth central moment.
    """
    where = "experiments.linear.length_variance_sample"
    key = checks.prng_key(key, "key", where)
    draws = checks.integer(draws, "draws", where, minimum=2)  # a sample variance needs 2
    m = np.asarray(m, dtype=np.float64)
    n = m.shape[-1]
    x = np.asarray(jax.random.normal(key, (draws, n)), dtype=np.float64)
    z = x @ m.T
    lengths = np.sum(z * z, axis=-1)
    centred = lengths - lengths.mean()
    s2 = np.mean(centred**2) * draws / (draws - 1)
    m4 = np.mean(centred**4)
    se = math.sqrt(max(m4 - s2**2, 0.0) / draws)
    gram = m.T @ m
    exact = 2.0 * np.sum(gram * gram) / n
    return s2 / n, se / n, float(exact)


def fixed_points(w0: np.ndarray, V: float, x: np.ndarray) -> np.ndarray:
    """``z* = (I - sqrt(V) W0)^{-1} x`` for one input ``x`` and each matrix of the batch ``w0``."""
    v = _variance(V, "experiments.linear.fixed_points")
    w0 = np.asarray(w0, dtype=np.float64)
    eye = np.eye(w0.shape[-1])
    rhs = np.broadcast_to(np.asarray(x, dtype=np.float64)[:, None], w0.shape[:-1] + (1,))
    return np.linalg.solve(eye - math.sqrt(v) * w0, rhs)[..., 0]


def iterate(ensemble: str, key: jax.Array, n: int, V: float, steps: int, samples: int = 1,
            tied: bool = True) -> dict[str, np.ndarray]:
    """Run ``z_{t+1} = W z_t + x`` (tied, 001 Eq. 3) or ``W_t z_t + x`` (untied, Eq. 6) from 0.

    One input ``x`` (i.i.d. ``N(0, 1)``) per sample. Returns ``{"length": (steps+1, samples)}``
    with ``z_t . z_t / N`` and, for tied weights, ``"error"``: ``||z_t - z*|| / ||z*||`` with
    ``z* = (I - W)^{-1} x``. Untied weights have no fixed point (001 §2.1), only a limiting
    distribution of ``z_t``.
    """
    where = "experiments.linear.iterate"
    ensemble = _ensemble(ensemble, where)
    key = checks.prng_key(key, "key", where)
    n = checks.positive_int(n, "n", where)
    v = _variance(V, where)
    steps = checks.positive_int(steps, "steps", where)
    samples = checks.positive_int(samples, "samples", where)
    kx, kw = jax.random.split(key)
    x = np.asarray(jax.random.normal(kx, (samples, n)), dtype=np.float64)
    z = np.zeros_like(x)
    lengths = [np.sum(z * z, -1) / n]
    errors = []
    if tied:
        w = math.sqrt(v) * draw(ensemble, kw, n, samples)
        zstar = np.linalg.solve(np.eye(n) - w, x[..., None])[..., 0]
        norm = np.linalg.norm(zstar, axis=-1)
        errors.append(np.linalg.norm(z - zstar, axis=-1) / norm)
        for _ in range(steps):
            z = np.einsum("sij,sj->si", w, z) + x
            lengths.append(np.sum(z * z, -1) / n)
            errors.append(np.linalg.norm(z - zstar, axis=-1) / norm)
        return {"length": np.array(lengths), "error": np.array(errors)}
    for w0 in _weight_stream(ensemble, kw, n, samples, steps):
        z = math.sqrt(v) * np.einsum("sij,sj->si", w0, z) + x
        lengths.append(np.sum(z * z, -1) / n)
    return {"length": np.array(lengths)}


def _chi(key, dof, n):
    """``chi_dof / sqrt(n)`` for an array of degrees of freedom ``dof >= 1`` (float64 NumPy)."""
    gamma = jax.random.gamma(key, jnp.asarray(dof, jnp.float32) / 2.0)
    return np.sqrt(2.0 * np.asarray(gamma, dtype=np.float64) / n)


def draw_reduced(ensemble: str, key: jax.Array, n: int) -> np.ndarray:
    """One ``n x n`` matrix whose :func:`trace_sweep` has the law of a :func:`draw` (001 Fig. 1).

    The sweep ``tr[((I - sqrt(V) W0)^T (I - sqrt(V) W0))^{-2}]`` depends on ``W0`` only through
    its orthogonal similarity class, so a sparse matrix ``T = Q^T W0 Q`` with the law of the
    Householder reduction of a draw gives the same sweep law, jointly in ``V``, in ``O(n^2)``
    time (a dense draw and its reduction cost ``O(n^3)``, most of Fig. 1 at ``N = 5000``):

    - ``"gaussian"``: upper Hessenberg, entries on and above the diagonal i.i.d. ``N(0, 1/n)``,
      subdiagonal ``chi_{n-k} / sqrt(n)``, ``k = 1 .. n-1`` (each Householder step maps a column
      of i.i.d. Gaussians to its norm and leaves the rest i.i.d., by orthogonal invariance);
    - ``"goe"``: symmetric tridiagonal, diagonal ``N(0, 2/n)``, off-diagonal ``chi_{n-k} /
      sqrt(n)`` (the same argument; Dumitriu & Edelman's beta = 1 model);
    - ``"orthogonal"``: the Haar matrix is orthogonally similar to ``G_1 ... G_{n-1} D`` with
      ``G_k`` a rotation by ``arccos c_k`` in the plane ``(k-1, k)``, ``c_k`` the first
      coordinate of a uniform unit vector of ``R^{n-k+1}``, all independent, and
      ``D = diag(1, ..., 1, +-1)``; reordered as (odd ``G_k``) (even ``G_k``) ``D``, which is
      similar again, it is pentadiagonal (a CMV matrix), still exactly orthogonal.

    Returned dense, float64, so that every function taking ``w0`` accepts it.
    """
    where = "experiments.linear.draw_reduced"
    ensemble = _ensemble(ensemble, where)
    key = checks.prng_key(key, "key", where)
    n = checks.positive_int(n, "n", where)
    kg, kc, ks = jax.random.split(key, 3)
    dof = np.arange(n - 1, 0, -1)  # n-1, ..., 1
    if ensemble == "gaussian":
        w = np.triu(np.asarray(jax.random.normal(kg, (n, n), jnp.float32), np.float64)) / math.sqrt(n)
        idx = np.arange(n - 1)
        w[idx + 1, idx] = _chi(kc, dof, n)
        return w
    if ensemble == "goe":
        w = np.zeros((n, n))
        idx = np.arange(n)
        w[idx, idx] = np.asarray(jax.random.normal(kg, (n,), jnp.float32), np.float64) * math.sqrt(2.0 / n)
        off = _chi(kc, dof, n)
        w[idx[:-1], idx[:-1] + 1] = off
        w[idx[:-1] + 1, idx[:-1]] = off
        return w
    # c_k = x / sqrt(x^2 + chi^2_{m-1}) is the first coordinate of a uniform unit vector of R^m,
    # m = n - k + 1 = dof + 1.
    x = np.asarray(jax.random.normal(kg, (n - 1,), jnp.float32), np.float64)
    y2 = 2.0 * np.asarray(jax.random.gamma(kc, jnp.asarray(dof, jnp.float32) / 2.0), np.float64)
    c = x / np.sqrt(x * x + y2)
    s = np.sqrt(np.maximum(1.0 - c * c, 0.0))
    sign = 1.0 if bool(jax.random.bernoulli(ks)) else -1.0

    def product(ks_):
        g = np.eye(n)
        for k in ks_:  # G_k on coordinates (k-1, k): disjoint blocks, so the order is immaterial
            g[k - 1:k + 1, k - 1:k + 1] = [[c[k - 1], -s[k - 1]], [s[k - 1], c[k - 1]]]
        return g

    odd, even = product(range(1, n, 2)), product(range(2, n, 2))
    even[:, -1] *= sign
    return _banded_product(odd, even)


def _banded_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # a @ b for two block-diagonal matrices with 2 x 2 blocks: only the pentadiagonal band of the
    # product is non-zero, so sum the five diagonals instead of an O(n^3) matrix product.
    n = a.shape[0]
    out = np.zeros((n, n))
    for d in range(-2, 3):
        for m in range(-1, 2):
            # out[i, i+d] += a[i, i+m] b[i+m, i+d]
            i = np.arange(max(0, -m, -d), min(n, n - m, n - d))
            if i.size:
                out[i, i + d] += a[i, i + m] * b[i + m, i + d]
    return out


def _bandwidth(a: np.ndarray, widest: int = 7) -> int:
    """Largest ``|i - j| <= widest`` with ``a[i, j] != 0``, or ``n`` if a non-zero lies further out."""
    n = a.shape[0]
    if n > widest + 1 and (np.any(np.triu(a, widest + 1)) or np.any(np.tril(a, -widest - 1))):
        return n
    for d in range(min(widest, n - 1), 0, -1):
        if np.any(np.diagonal(a, d)) or np.any(np.diagonal(a, -d)):
            return d
    return 0


def _symmetric_eigvals(s: np.ndarray) -> np.ndarray:
    """Eigenvalues of a symmetric matrix: ``O(n^2)`` for a band (tridiagonal, pentadiagonal),
    LAPACK's dense ``eigvalsh`` otherwise."""
    b = _bandwidth(s)
    if b == 0:
        return np.sort(np.diagonal(s).copy())
    if b == 1:
        return scipy.linalg.eigvalsh_tridiagonal(np.diagonal(s).copy(), np.diagonal(s, 1).copy())
    if b <= 7:
        bands = np.zeros((b + 1, s.shape[0]))
        for d in range(b + 1):
            bands[d, : s.shape[0] - d] = np.diagonal(s, -d)
        return scipy.linalg.eig_banded(bands, lower=True, eigvals_only=True)
    return np.linalg.eigvalsh(s)


def _hessenberg_r(h: np.ndarray, s: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``R`` of ``I - s_j H = Q_j R_j`` for upper Hessenberg ``H`` and a few ``s_j`` at once.

    ``n - 1`` Givens rotations per ``s_j``, ``O(n^2)``: rotation ``k`` mixes rows ``k`` and
    ``k + 1`` of the columns ``k ..``, after which row ``k`` is final, so only one row is carried.
    The ``s_j`` share the Python loop (its overhead, not the arithmetic, dominates at
    ``n = 5000``). ``out`` (shape ``(len(s), n, n)``, zero below the diagonal) receives the ``R_j``.
    """
    n = h.shape[0]
    s = np.asarray(s, dtype=np.float64)[:, None]
    row = -s * h[0][None, :]
    row[:, 0] += 1.0
    for k in range(n - 1):
        nxt = -s * h[k + 1, k:][None, :]
        nxt[:, 1] += 1.0
        a, b = row[:, 0], nxt[:, 0]
        r = np.hypot(a, b)
        zero = r == 0.0
        r[zero] = 1.0
        c = np.where(zero, 1.0, a / r)[:, None]
        sn = np.where(zero, 0.0, b / r)[:, None]
        out[:, k, k:] = c * row + sn * nxt
        row = (c * nxt[:, 1:]) - (sn * row[:, 1:])
    out[:, n - 1, n - 1] = row[:, 0]
    return out


def _exact_from_r(r: np.ndarray) -> float:
    # tr[(R^T R)^{-2}] = ||R^{-1} R^{-T}||_F^2 / n: a triangular inverse and a symmetric rank-n
    # update (upper triangle only, so off-diagonal entries count twice).
    n = r.shape[0]
    rinv, info = scipy.linalg.lapack.dtrtri(r, lower=0)
    if info > 0:
        return math.inf
    c = scipy.linalg.blas.dsyrk(1.0, rinv)
    upper = np.triu(c)
    return float((2.0 * np.sum(upper * upper) - np.sum(np.diagonal(c) ** 2)) / n)


def _stochastic_from_r(r: np.ndarray, omega: np.ndarray, probes: np.ndarray) -> tuple[float, float]:
    """Hutch++ (Meyer, Musco, Musco & Woodruff 2021) for ``tr[B^2]``, ``B = R^{-1} R^{-T}``.

    ``Q = orth(B^2 Omega)`` captures the few largest eigenvalues of ``B`` (the smallest singular
    values of ``I - sqrt(V) W0``, which dominate near ``V_c``); ``||B Q||_F^2`` counts them
    exactly and Hutchinson's ``||B (I - Q Q^T) g||^2`` the rest. The standard error is that of
    the mean over the Gaussian probes ``g`` (given ``Q``, an unbiased mean of independent terms).
    Three block solves with ``B``: ``[Omega, g]``, ``B Omega`` and ``Q``; ``B (I - Q Q^T) g =
    B g - (B Q)(Q^T g)`` needs no fourth.
    """
    n = r.shape[0]
    if np.any(np.diagonal(r) == 0.0):
        return math.inf, 0.0
    lower = r.T  # Fortran-ordered view: LAPACK's trsm takes it without a copy of R

    def apply(x):
        y = scipy.linalg.solve_triangular(lower, x, lower=True, check_finite=False)
        return scipy.linalg.solve_triangular(lower, y, lower=True, trans="T", check_finite=False)

    m = omega.shape[1]
    first = apply(np.concatenate([omega, probes], axis=1))
    q, _ = np.linalg.qr(apply(first[:, :m]))
    bq = apply(q)
    rest = np.sum((first[:, m:] - bq @ (q.T @ probes)) ** 2, axis=0)
    top = float(np.sum(bq * bq))
    return (top + float(np.mean(rest))) / n, float(np.std(rest, ddof=1) / math.sqrt(rest.size)) / n


SWEEP_METHODS = ("exact", "stochastic")
"""Methods of :func:`trace_sweep` for the (non-normal) Gaussian ensemble."""


def trace_sweep(ensemble: str, w0: np.ndarray, Vs: Sequence[float], method: str = "exact",
                key: jax.Array | None = None, probes: int = 48, sketch: int = 24,
                return_se: bool = False):
    """``tr[((I - sqrt(V) W0)^T (I - sqrt(V) W0))^{-2}]`` for every ``V`` in ``Vs`` (001 Fig. 1).

    The quantity plotted in 001 Figure 1: half the length variance of 001 Definition 2.1 by 001
    Lemma 2.2 (``2 tr[(M^T M)^2]`` with ``M = (I - W)^{-1}``), for one matrix ``w0`` (a
    :func:`draw`, or a :func:`draw_reduced` with the same law of the sweep). One decomposition
    serves the whole sweep; with ``sigma_i`` the singular values of ``I - sqrt(V) W0`` the trace
    is ``mean(sigma_i^{-4})``:

    - ``"goe"``: ``W0`` symmetric with eigenvalues ``lambda``: ``mean((1 - sqrt(V) lambda)^{-4})``;
    - ``"orthogonal"``: ``W0`` normal with eigenvalues ``e^{i theta}``, so ``sigma^2 = |1 -
      sqrt(V) e^{i theta}|^2 = 1 - 2 sqrt(V) cos(theta) + V``; the ``cos(theta)`` are the
      eigenvalues of the symmetric part ``(W0 + W0^T) / 2`` (normal: same eigenvectors), one
      symmetric eigenvalue problem instead of a general one;
    - ``"gaussian"`` (not normal): one Hessenberg reduction ``W0 = Q H Q^T`` (skipped when ``w0``
      is upper Hessenberg already), then per ``V`` the QR factorisation ``I - sqrt(V) H = Q' R``
      by ``n - 1`` Givens rotations (``O(n^2)``), and ``tr[(R^T R)^{-2}]`` from ``R`` alone:
      ``method="exact"`` forms ``R^{-1} R^{-T}`` (``O(n^3)`` per ``V``, about ``2n^3/3`` flops
      against ``O(12 n^3)`` for an SVD); ``method="stochastic"`` estimates it with Hutch++
      (``sketch`` columns, ``probes`` Gaussian probes, drawn from ``key`` once for all ``V``;
      ``O(n^2 (3 sketch + probes))`` per ``V``) and its standard error.

    Symmetric eigenvalue problems of banded matrices (the tridiagonal and pentadiagonal forms of
    :func:`draw_reduced`) are solved in ``O(n^2)``. For ``"goe"`` and ``"orthogonal"`` both methods
    are exact (standard error 0). Values where ``I - sqrt(V) W0`` is singular are ``inf``.

    Returns an array of ``len(Vs)`` values, or ``(values, standard_errors)`` if ``return_se``.
    """
    where = "experiments.linear.trace_sweep"
    ensemble = _ensemble(ensemble, where)
    method = checks.choice(method, "method", SWEEP_METHODS, where)
    w0 = np.asarray(w0, dtype=np.float64)
    if w0.ndim != 2 or w0.shape[0] != w0.shape[1]:
        raise checks.fail("w0", "one square matrix", f"shape {w0.shape}", where)
    vs = np.asarray([checks.number(v, "Vs", where, lower=0.0) for v in Vs])
    n = w0.shape[0]
    stochastic = method == "stochastic" and ensemble == "gaussian"
    if stochastic:
        if key is None:
            raise checks.fail("key", "a JAX PRNG key for method='stochastic'", key, where)
        key = checks.prng_key(key, "key", where)
        probes = checks.integer(probes, "probes", where, minimum=2)  # a standard error needs 2
        sketch = checks.integer(sketch, "sketch", where, minimum=1)
        if sketch + probes > n:
            raise checks.fail("probes", f"with sketch at most n = {n} columns in all (else use "
                              "method='exact')", f"probes={probes}, sketch={sketch}", where)
    sv = np.sqrt(vs)
    se = np.zeros(len(vs))
    if ensemble in ("goe", "orthogonal"):
        if ensemble == "goe":
            lam = _symmetric_eigvals(w0)
            sq = (1.0 - sv[:, None] * lam[None, :]) ** 2
        else:
            cos = np.clip(_symmetric_eigvals(0.5 * (w0 + w0.T)), -1.0, 1.0)
            sq = 1.0 - 2.0 * sv[:, None] * cos[None, :] + vs[:, None]
        with np.errstate(divide="ignore"):
            out = np.mean(np.abs(sq) ** -2.0, axis=1)
        return (out, se) if return_se else out
    h = w0 if not np.any(np.tril(w0, -2)) else scipy.linalg.hessenberg(w0, check_finite=False)
    chunk = 4  # V values sharing one Givens loop: 4 R's of n^2 float64 (800 MB at n = 5000)
    r = np.zeros((min(chunk, len(vs)), n, n))
    out = np.empty(len(vs))
    if stochastic:
        ko, kp = jax.random.split(key)
        omega = np.asarray(jax.random.normal(ko, (n, sketch), jnp.float32), np.float64)
        g = np.asarray(jax.random.normal(kp, (n, probes), jnp.float32), np.float64)
    for start in range(0, len(vs), chunk):
        part = sv[start:start + chunk]
        _hessenberg_r(h, part, r[: part.size])
        for j in range(part.size):
            if stochastic:
                out[start + j], se[start + j] = _stochastic_from_r(r[j], omega, g)
            else:
                out[start + j] = _exact_from_r(r[j])
    return (out, se) if return_se else out


def spectral_radii(ensemble: str, key: jax.Array, n: int, samples: int,
                   batch: int = 64) -> np.ndarray:
    """Spectral radius ``rho(W0)`` of ``samples`` draws (``V = 1``), in batches of ``batch``.

    The tied iteration at variance ``V`` diverges iff ``sqrt(V) rho(W0) >= 1`` (001 Eq. 5), so
    one eigenvalue computation per matrix answers the question for every ``V``.
    """
    where = "experiments.linear.spectral_radii"
    ensemble = _ensemble(ensemble, where)
    key = checks.prng_key(key, "key", where)
    n = checks.positive_int(n, "n", where)
    samples = checks.positive_int(samples, "samples", where)
    batch = checks.positive_int(batch, "batch", where)
    out = []
    for i, k in enumerate(jax.random.split(key, math.ceil(samples / batch))):
        size = min(batch, samples - i * batch)
        w0 = draw(ensemble, k, n, size)
        if ensemble == "goe":
            lam = np.linalg.eigvalsh(w0)
        else:
            lam = np.linalg.eigvals(w0)
        out.append(np.max(np.abs(lam), axis=-1))
    return np.concatenate(out)


def divergence_probability(radii: np.ndarray, ensemble: str,
                           deltas: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Fraction of draws whose tied iteration diverges at ``V = V_c (1 - delta)``, with its SE.

    Diverges iff ``sqrt(V) rho(W0) >= 1``; ``radii`` from :func:`spectral_radii`. The standard
    error is the binomial ``sqrt(p (1 - p) / S)``.
    """
    where = "experiments.linear.divergence_probability"
    ensemble = _ensemble(ensemble, where)
    radii = np.asarray(radii, dtype=np.float64)
    vc = theory.critical_variance(ensemble)
    d = np.asarray(deltas, dtype=np.float64)
    if d.size == 0 or np.any(~(d > 0)) or np.any(d > 1):
        raise checks.fail("deltas", "numbers in (0, 1] (V = V_c (1 - delta))", deltas, where)
    v = vc * (1.0 - d)
    p = np.mean(np.sqrt(v)[:, None] * radii[None, :] >= 1.0, axis=1)
    return p, np.sqrt(p * (1 - p) / radii.size)


def quantile_interval(values: np.ndarray, q: float,
                      confidence: float = 0.95) -> tuple[float, float, float]:
    """Sample ``q``-quantile of ``values`` with a distribution-free interval from order statistics.

    The number of samples below the true quantile is binomial ``(S, q)``; the interval runs
    between the order statistics at ``S q -+ z sqrt(S q (1 - q))`` (normal approximation of that
    binomial, ``z`` the two-sided normal quantile of ``confidence``), clipped to the sample.
    Returns ``(quantile, lo, hi)``. Used for ``delta_risk(N)`` on the finite-``N`` page.
    """
    where = "experiments.linear.quantile_interval"
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    if x.size < 2 or not np.all(np.isfinite(x)):
        raise checks.fail("values", "at least 2 finite numbers", values, where)
    q = checks.number(q, "q", where, lower=0.0, upper=1.0, lower_open=True, upper_open=True)
    confidence = checks.number(confidence, "confidence", where, lower=0.0, upper=1.0,
                               lower_open=True, upper_open=True)
    import scipy.special

    z = float(scipy.special.ndtri(0.5 + confidence / 2))
    s = x.size
    half = z * math.sqrt(s * q * (1 - q))
    lo_k = int(max(0, math.floor(s * q - half)))
    hi_k = int(min(s - 1, math.ceil(s * q + half)))
    return float(np.quantile(x, q)), float(x[lo_k]), float(x[hi_k])


def ntk_samples(ensemble: str, key: jax.Array, n: int, V: float, samples: int,
                cosine: float = 0.5) -> dict[str, np.ndarray]:
    """Finite-width NTK of ``f(x) = v^T z*(x)`` with respect to ``W`` (001 App. B.1, linear).

    ``df/dW = (I - W)^{-T} v z*^T`` (001 Eq. 93 with ``phi`` the identity), so
    ``Theta(x, x') = (v^T M M^T v) (z*(x) . z*(x'))`` with ``M = (I - W)^{-1}``. For each sample a
    fresh ``W``, readout ``v ~ N(0, I/n)`` and inputs ``x, x'`` with i.i.d. ``N(0, 1)`` entries and
    correlation ``cosine`` are drawn. Returns ``{"diag": Theta(x, x) / x.x,
    "off": Theta(x, x') / x.x'}`` per sample; both tend to
    :func:`deqlab.theory.linear.ntk` as ``n -> inf``.
    """
    where = "experiments.linear.ntk_samples"
    ensemble = _ensemble(ensemble, where)
    key = checks.prng_key(key, "key", where)
    n = checks.positive_int(n, "n", where)
    samples = checks.positive_int(samples, "samples", where)
    v = _variance(V, where)
    cosine = checks.number(cosine, "cosine", where, lower=-1.0, upper=1.0)
    kw, kv, kx, ky = jax.random.split(key, 4)
    w0 = draw(ensemble, kw, n, samples)
    eye = np.eye(n)
    m = np.linalg.solve(eye - math.sqrt(v) * w0, np.broadcast_to(eye, w0.shape))
    read = np.asarray(jax.random.normal(kv, (samples, n)), dtype=np.float64) / math.sqrt(n)
    x = np.asarray(jax.random.normal(kx, (samples, n)), dtype=np.float64)
    y = np.asarray(jax.random.normal(ky, (samples, n)), dtype=np.float64)
    xp = cosine * x + math.sqrt(1.0 - cosine**2) * y
    jac = np.einsum("sji,sj->si", m, read)  # M^T v
    zx = np.einsum("sij,sj->si", m, x)
    zy = np.einsum("sij,sj->si", m, xp)
    a = np.sum(jac * jac, -1)
    return {
        "diag": a * np.sum(zx * zx, -1) / np.sum(x * x, -1),
        "off": a * np.sum(zx * zy, -1) / np.sum(x * xp, -1),
    }
