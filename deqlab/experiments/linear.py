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
  from one decomposition per matrix (001 Fig. 1);
- :func:`spectral_radii`, :func:`divergence_probability`: finite-``N`` failure of the iteration;
- :func:`ntk_samples`: the finite-width NTK of ``f = v^T z*`` (001 App. B.1).

``V`` is always the variance (``scale = sqrt(V)`` in :mod:`deqlab.ensembles`); ensemble names are
those of :data:`deqlab.theory.linear.ENSEMBLES` (the registry :data:`deqlab.ensembles.ENSEMBLES`
less ``"antisymmetric"``). Summaries of the samples (means with standard errors, Richardson
extrapolation, power-law fits) are in :mod:`deqlab.stats`.
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


def trace_sweep(ensemble: str, w0: np.ndarray, Vs: Sequence[float]) -> np.ndarray:
    """``tr[((I - sqrt(V) W0)^T (I - sqrt(V) W0))^{-2}]`` for every ``V`` in ``Vs`` (001 Fig. 1).

    One decomposition of the single matrix ``w0`` serves the whole sweep:

    - ``"goe"``: ``W0 = Q diag(lambda) Q^T`` (``eigh``), so the trace is
      ``mean((1 - sqrt(V) lambda)^{-4})``;
    - ``"orthogonal"``: ``W0`` is normal with eigenvalues ``e^{i theta}``, so the singular values
      of ``I - sqrt(V) W0`` are ``|1 - sqrt(V) e^{i theta}|`` and the trace is their mean ``^-4``;
    - ``"gaussian"`` (not normal): complex Schur form ``W0 = Z T Z^*``; per ``V`` a triangular
      inverse ``R = (I - sqrt(V) T)^{-1}`` gives the trace as ``||R R^*||_F^2 / n``
      (a unitary change of basis keeps singular values), ``O(n^3/3)`` flops instead of an SVD.

    Values where ``I - sqrt(V) W0`` is singular are ``inf``. Returns an array of ``len(Vs)``.
    """
    where = "experiments.linear.trace_sweep"
    ensemble = _ensemble(ensemble, where)
    w0 = np.asarray(w0, dtype=np.float64)
    if w0.ndim != 2 or w0.shape[0] != w0.shape[1]:
        raise checks.fail("w0", "one square matrix", f"shape {w0.shape}", where)
    vs = np.asarray([checks.number(v, "Vs", where, lower=0.0) for v in Vs])
    sv = np.sqrt(vs)
    n = w0.shape[0]
    if ensemble == "goe":
        lam = np.linalg.eigvalsh(w0)
        with np.errstate(divide="ignore"):
            return np.mean(np.abs(1.0 - sv[:, None] * lam[None, :]) ** -4.0, axis=1)
    if ensemble == "orthogonal":
        lam = np.linalg.eigvals(w0)
        with np.errstate(divide="ignore"):
            return np.mean(np.abs(1.0 - sv[:, None] * lam[None, :]) ** -4.0, axis=1)
    t, _ = scipy.linalg.schur(w0, output="complex")
    eye = np.eye(n, dtype=complex)
    out = np.empty(len(vs))
    for i, s in enumerate(sv):
        b = eye - s * t
        if np.any(np.abs(np.diagonal(b)) == 0):
            out[i] = np.inf
            continue
        r = scipy.linalg.solve_triangular(b, eye, check_finite=False)
        c = r @ r.conj().T
        out[i] = np.sum(np.abs(c) ** 2) / n
    return out


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
