"""Tests for deqlab.lab.experiments.linear helpers that the chapter 1 pages call."""

import math

import jax
import numpy as np
import pytest
import scipy.stats

from deqlab.lab.experiments import linear as ex
from deqlab.theory import linear as th


def test_quantile_interval_matches_the_order_statistics_and_covers():
    x = np.arange(1000.0)
    q, lo, hi = ex.quantile_interval(x, 0.95)
    assert q == np.quantile(x, 0.95)
    # S q = 950, z sqrt(S q (1 - q)) = 1.96 * 6.89 = 13.5: order statistics 936 and 964
    assert (lo, hi) == (936.0, 964.0)
    # coverage of the true 0.9 quantile of U(0, 1) over 400 samples of size 200
    rng = np.random.default_rng(5)
    hits = sum(lo <= 0.9 <= hi for _, lo, hi in (ex.quantile_interval(rng.random(200), 0.9) for _ in range(400)))
    assert abs(hits / 400 - 0.95) < 0.05


@pytest.mark.parametrize("args, pattern", [
    (([1.0], 0.5), "`values`"),
    (([1.0, np.nan], 0.5), "`values`"),
    (([1.0, 2.0], 1.0), "`q`"),
    (([1.0, 2.0], 0.5, 0.0), "`confidence`"),
])
def test_quantile_interval_bad_inputs_name_the_argument(args, pattern):
    with pytest.raises(ValueError, match=pattern):
        ex.quantile_interval(*args)


# ---------------------------------------------------------------------------------------------
# Figure 1 sweep (001 Fig. 1): the fast methods against the direct ones
# ---------------------------------------------------------------------------------------------

def svd_trace(w0, V):
    """tr[((I - sqrt(V) W0)^T (I - sqrt(V) W0))^{-2}] = mean sigma^-4, from an SVD."""
    sigma = np.linalg.svd(np.eye(w0.shape[0]) - math.sqrt(V) * w0, compute_uv=False)
    return np.mean(sigma**-4.0)



def test_orthogonal_sweep_from_symmetric_part_equals_general_eigenvalues():
    """W0 normal: eig((W0 + W0^T)/2) = Re(e^{i theta}), so |1 - s e^{i theta}|^2 = 1 - 2s cos + s^2;
    the previous method (np.linalg.eigvals of W0) agrees to round-off, near V_c included."""
    w0 = ex.draw("orthogonal", jax.random.PRNGKey(21), 64, 1)[0]
    lam = np.linalg.eigvals(w0)
    cos = np.linalg.eigvalsh(0.5 * (w0 + w0.T))
    np.testing.assert_allclose(cos, np.sort(lam.real), atol=1e-12)
    vs = np.array([0.1, 0.5, 0.9, 0.999])
    old = np.mean(np.abs(1.0 - np.sqrt(vs)[:, None] * lam[None, :]) ** -4.0, axis=1)
    # both methods see each eigenvalue to ~1e-15 absolute, and sigma^2 >= (1 - sqrt(V))^2, so a
    # relative error of sigma^-4 up to ~2 * 1e-15 / (1 - sqrt(V))^2 (4e-9 at V = 0.999) is round-off
    rtol = 1e-14 / (1 - np.sqrt(vs)) ** 2
    new = ex.trace_sweep("orthogonal", w0, vs)
    svd = np.array([svd_trace(w0, v) for v in vs])
    assert np.all(np.abs(new / old - 1) < rtol) and np.all(np.abs(new / svd - 1) < rtol), (new / old - 1, new / svd - 1)


@pytest.mark.parametrize("reduced", [False, True], ids=["dense", "hessenberg"])
def test_gaussian_exact_sweep_matches_svd(reduced):
    """Hessenberg + Givens QR + R^{-1} R^{-T}: exact to round-off against an SVD per V, for a dense
    draw (reduced here) and for a Hessenberg input (used as is), V up to beyond the pole region."""
    n = 120
    w0 = (ex.draw_reduced("gaussian", jax.random.PRNGKey(22), n) if reduced
          else ex.draw("gaussian", jax.random.PRNGKey(22), n, 1)[0])
    vs = [0.2, 0.8, 0.95, 0.99, 1.0]
    exact = [svd_trace(w0, v) for v in vs]
    np.testing.assert_allclose(ex.trace_sweep("gaussian", w0, vs), exact, rtol=1e-8)


def test_stochastic_sweep_error_bar_is_honest():
    """Hutch++ against the exact value at N = 1000, for 40 probe seeds and 4 values of delta down to
    the pole region of this draw (its spectral radius exceeds 1 by O(sqrt(log N / N))).

    Each z = (estimate - exact) / se is a mean of 48 independent terms over its own standard error:
    close to a t variable with 47 degrees of freedom, so over 40 seeds the RMS of z lies within
    about 3 x 1/sqrt(80) = 0.34 of 1, and |z| < 2 in 95% of seeds (binomial SE 3.4% of 40). The
    RMS band [0.7, 1.4] rejects an error bar too wide or too narrow by a factor 1.4; the relative
    error bars themselves are asserted small (the estimator is useful, not merely honest)."""
    n = 1000
    w0 = ex.draw_reduced("gaussian", jax.random.PRNGKey(23), n)
    deltas = np.array([0.5, 0.1, 0.02, 0.005])
    vs = 1.0 - deltas
    exact = ex.trace_sweep("gaussian", w0, vs)
    np.testing.assert_allclose(exact[:2], [svd_trace(w0, v) for v in vs[:2]], rtol=1e-8)
    z, rel = [], []
    for seed in range(40):
        est, se = ex.trace_sweep("gaussian", w0, vs, method="stochastic",
                                 key=jax.random.PRNGKey(1000 + seed), return_se=True)
        z.append((est - exact) / se)
        rel.append(se / exact)
    z, rel = np.array(z), np.array(rel)
    rms = np.sqrt(np.mean(z**2, axis=0))
    assert np.all((rms > 0.7) & (rms < 1.4)), rms
    assert np.all(np.mean(np.abs(z) < 2, axis=0) > 0.95 - 3 * 0.034), np.mean(np.abs(z) < 2, axis=0)
    assert np.max(rel) < 0.05, np.max(rel, axis=0)


def test_stochastic_sweep_is_exact_for_normal_ensembles_and_deterministic_per_key():
    w0 = ex.draw("goe", jax.random.PRNGKey(24), 50, 1)[0]
    vals, se = ex.trace_sweep("goe", w0, [0.1, 0.2], method="stochastic", key=jax.random.PRNGKey(0),
                              return_se=True)
    np.testing.assert_array_equal(se, 0.0)
    np.testing.assert_allclose(vals, ex.trace_sweep("goe", w0, [0.1, 0.2]), rtol=0)
    g = ex.draw_reduced("gaussian", jax.random.PRNGKey(25), 200)
    a = ex.trace_sweep("gaussian", g, [0.5], method="stochastic", key=jax.random.PRNGKey(1))
    b = ex.trace_sweep("gaussian", g, [0.5], method="stochastic", key=jax.random.PRNGKey(1))
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("e", th.ENSEMBLES)
def test_draw_reduced_has_the_sweep_law_of_a_draw(e):
    """The Householder reduction of a draw has the law of draw_reduced (orthogonal invariance), so
    the sweep's law is the same: two-sample KS test of log tr at two V over 600 + 600 matrices at
    N = 10 (p > 1e-3). A wrong model (Gaussian subdiagonal instead of chi: |N(0,1/n)| ~ 0.25
    against chi_{n-k}/sqrt(n) ~ 0.9) is rejected by the same test."""
    n, samples = 10, 600
    vs = np.array([0.3, 0.7]) * th.critical_variance(e)
    dense = ex.draw(e, jax.random.PRNGKey(26), n, samples)
    keys = jax.random.split(jax.random.PRNGKey(27), samples)
    reduced = [ex.draw_reduced(e, k, n) for k in keys]
    band = {"gaussian": None, "goe": 1, "orthogonal": 2}[e]
    if band is None:
        assert not np.any(np.tril(reduced[0], -2)) and np.all(np.diagonal(reduced[0], -1) > 0)
    else:
        assert ex._bandwidth(reduced[0]) == band
    if e == "orthogonal":
        np.testing.assert_allclose(reduced[0].T @ reduced[0], np.eye(n), atol=1e-14)
    a = np.log([ex.trace_sweep(e, w, vs) for w in dense])
    b = np.log([ex.trace_sweep(e, w, vs) for w in reduced])
    for j in range(len(vs)):
        assert scipy.stats.ks_2samp(a[:, j], b[:, j]).pvalue > 1e-3, (e, vs[j])
    if e == "gaussian":
        wrong = []
        for w in reduced:
            w = w.copy()
            idx = np.arange(n - 1)
            w[idx + 1, idx] = np.random.default_rng(int(1e6 * w[0, 0]) % 2**32).normal(size=n - 1) / math.sqrt(n)
            wrong.append(ex.trace_sweep(e, w, vs))
        assert scipy.stats.ks_2samp(a[:, 1], np.log(wrong)[:, 1]).pvalue < 1e-3


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(method="svd"), "`method` must be one of 'exact', 'stochastic'"),
    (dict(method="stochastic"), "`key` must be a JAX PRNG key for method='stochastic'"),
    (dict(method="stochastic", key=jax.random.PRNGKey(0), probes=1), "`probes`"),
    (dict(method="stochastic", key=jax.random.PRNGKey(0), probes=20), "`probes` must be with sketch at most n = 30"),
    (dict(method="stochastic", key=0), "`key` must be a JAX PRNG key"),
])
def test_trace_sweep_bad_inputs_name_the_argument(kwargs, pattern):
    w0 = np.eye(30)
    with pytest.raises(ValueError, match=pattern):
        ex.trace_sweep("gaussian", w0, [0.1], **kwargs)
    with pytest.raises(ValueError, match="`Vs`"):
        ex.trace_sweep("gaussian", w0, [-0.1])
    with pytest.raises(ValueError, match="`w0` must be one square matrix"):
        ex.trace_sweep("gaussian", np.ones((3, 4)), [0.1])
