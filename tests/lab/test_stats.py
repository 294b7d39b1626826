"""Tests for deqlab.lab.stats: Monte Carlo summaries, Richardson extrapolation, the DKW band and the
statistics of spectra on grids, checked against exact values and against scipy.

Tolerances. Grid statistics are deterministic: their tolerance is the discretisation error of the
grid (trapezoid rule, ``O(h^2)`` for smooth densities; one grid step at a jump). Coverage of the
DKW band is a binomial count over independent simulated samples: the tolerance is 5 binomial
standard errors of the counted fraction.
"""

import math
import warnings

import numpy as np
import pytest
import scipy.stats

from deqlab.lab import stats
from deqlab.theory import freeprob as fp

RNG_SEED = 20261124


# ---------------------------------------------------------------------------------------------
# Monte Carlo summaries
# ---------------------------------------------------------------------------------------------


def test_mean_se_matches_definition():
    x = np.random.default_rng(0).normal(3.0, 2.0, size=(400, 3))
    mean, se = stats.mean_se(x)
    np.testing.assert_allclose(mean, x.mean(0))
    np.testing.assert_allclose(se, x.std(0, ddof=1) / math.sqrt(400))
    assert stats.mean_se(x[:, 0])[1] == pytest.approx(scipy.stats.sem(x[:, 0]))


def test_fit_power_law_recovers_exponent():
    d = np.logspace(-3, -1, 7)
    p, a = stats.fit_power_law(d, 3.0 * d**-2.5)
    assert p == pytest.approx(2.5) and a == pytest.approx(3.0)
    # non-finite and non-positive points are dropped, not fitted
    values = 3.0 * d**-2.5
    values[[0, 3]] = [np.inf, -1.0]
    assert stats.fit_power_law(d, values) == pytest.approx((2.5, 3.0))
    with pytest.raises(ValueError, match=r"fit_power_law: `values` must be finite and > 0"):
        stats.fit_power_law([1.0, 2.0], [1.0, np.nan])


# ---------------------------------------------------------------------------------------------
# Richardson extrapolation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("a, b", [(1.7, 4.0), (-0.3, -25.0), (2.0, 0.0)])
def test_richardson_recovers_the_limit_of_a_plus_b_over_n(a, b):
    # f(N) = a + b / N: two widths N/2 and N give a exactly (up to rounding), whatever b.
    f = lambda n: a + b / n
    for n in (8, 64, 1000):
        assert stats.richardson(f(n // 2), f(n)) == pytest.approx(a, abs=1e-12 * (1 + abs(b)))
    # a second-order error needs order=2 (and first order leaves a residue of order b / N^2)
    g = lambda n: a + b / n**2
    assert stats.richardson(g(50), g(100), order=2) == pytest.approx(a, abs=1e-12 * (1 + abs(b)))
    # ratio 3: f(N/3), f(N)
    assert stats.richardson(f(30), f(90), ratio=3) == pytest.approx(a, abs=1e-12 * (1 + abs(b)))


def test_richardson_leaves_a_second_order_residue_when_the_model_is_first_order():
    # f(N) = a + b/N + c/N^2: first-order Richardson leaves -2c / N^2 (widths N/2, N); the test
    # fails if the combination were, e.g., the plain fine value (residue b / N).
    a, b, c, n = 1.0, 5.0, 7.0, 100
    f = lambda m: a + b / m + c / m**2
    assert stats.richardson(f(n // 2), f(n)) - a == pytest.approx(-2 * c / n**2, rel=1e-9)


def test_richardson_is_vectorised_and_its_se_propagates_independent_errors():
    coarse, fine = np.array([1.0, 2.0]), np.array([1.5, 2.5])
    np.testing.assert_allclose(stats.richardson(coarse, fine), [2.0, 3.0])
    # se of 2 fine - coarse for independent estimates: sqrt(4 s_f^2 + s_c^2)
    assert stats.richardson_se(0.3, 0.4) == pytest.approx(math.sqrt(4 * 0.16 + 0.09))
    with pytest.raises(ValueError, match=r"richardson: `ratio` must be a finite real number > 1"):
        stats.richardson(1.0, 1.0, ratio=1.0)
    with pytest.raises(ValueError, match=r"`order` must be a finite real number > 0"):
        stats.richardson_se(1.0, 1.0, order=0)


def test_richardson_mean_standard_error_has_its_stated_coverage():
    # Samples of a + b/N + noise at widths N/2 and N: over many repetitions, |estimate - a| <=
    # 1.96 se about 95% of the time (Student-t with 99 degrees of freedom: 94.7%). 2000
    # repetitions: binomial SE 0.5%, tolerance 5 SE.
    rng = np.random.default_rng(RNG_SEED)
    a, b, n, count, reps = 2.0, 3.0, 40, 100, 2000
    hits = 0
    for _ in range(reps):
        coarse = a + b / (n // 2) + rng.normal(0.0, 0.5, count)
        fine = a + b / n + rng.normal(0.0, 0.3, count)
        est, se = stats.richardson_mean(coarse, fine)
        hits += abs(est - a) <= 1.96 * se
    expected = 2 * scipy.stats.t.cdf(1.96, count - 1) - 1
    assert abs(hits / reps - expected) <= 5 * math.sqrt(expected * (1 - expected) / reps)


# ---------------------------------------------------------------------------------------------
# DKW band
# ---------------------------------------------------------------------------------------------


def _ks_uniform(u: np.ndarray) -> np.ndarray:
    """Exact Kolmogorov statistic of each row of ``u`` against Uniform(0, 1)."""
    u = np.sort(u, axis=-1)
    n = u.shape[-1]
    i = np.arange(1, n + 1)
    return np.maximum(np.max(i / n - u, axis=-1), np.max(u - (i - 1) / n, axis=-1))


@pytest.mark.parametrize("n, alpha", [(20, 0.2), (200, 0.05)])
def test_dkw_bound_has_its_stated_coverage(n, alpha):
    # P(sup |F_n - F| > bound) <= alpha for every n (Massart); the exceedance frequency over
    # simulated samples matches the exact Kolmogorov law (scipy's kstwo) and stays below alpha.
    rng = np.random.default_rng(RNG_SEED + n)
    reps = 20000
    bound = stats.dkw_bound(n, alpha)
    assert bound == pytest.approx(math.sqrt(math.log(2 / alpha) / (2 * n)))
    exceed = np.mean(_ks_uniform(rng.uniform(size=(reps, n))) > bound)
    exact = scipy.stats.kstwo.sf(bound, n)
    tol = 5 * math.sqrt(exact * (1 - exact) / reps)
    assert abs(exceed - exact) <= tol
    assert exceed <= alpha + tol
    # and it is not vacuous: the band is tight to a factor 2 for these alpha
    assert exact > alpha / 2


def test_spectral_ks_bound_adds_the_finite_size_allowance():
    assert stats.spectral_ks_bound(600, 200, 1e-6) == pytest.approx(stats.dkw_bound(600, 1e-6) + 1 / 200)
    # n = 0: tests/library/test_probe.py (spectral-ks-bound-n-zero)
    with pytest.raises(ValueError, match=r"`n_samples` must be an integer >= 1"):
        stats.spectral_ks_bound(0, 10)
    with pytest.raises(ValueError, match=r"dkw_bound: `alpha` must be a finite real number > 0 and < 1"):
        stats.dkw_bound(10, 1.0)


# ---------------------------------------------------------------------------------------------
# Spectra on grids
# ---------------------------------------------------------------------------------------------


def test_kolmogorov_distance_matches_scipy_kstest():
    # Standard normal density on a fine grid (h = 1e-3, trapezoid CDF error ~1e-8): the
    # distance equals scipy's exact two-sided statistic against the normal CDF.
    rng = np.random.default_rng(RNG_SEED)
    lam = np.linspace(-9.0, 9.0, 18001)
    density = scipy.stats.norm.pdf(lam)
    for size in (10, 300, 5000):
        x = rng.normal(size=size)
        ks = stats.kolmogorov_distance(x, lam, density)
        assert ks == pytest.approx(scipy.stats.kstest(x, "norm").statistic, abs=1e-7)
    # a wrong law is far: samples of N(0.5, 1) against N(0, 1)
    x = rng.normal(0.5, 1.0, 5000)
    assert stats.kolmogorov_distance(x, lam, density) > 0.15


def test_kolmogorov_distance_with_an_atom_matches_the_mixture_cdf():
    # 0.3 delta(0) + 0.7 Exp(1): the CDF jumps at 0; compare with a brute-force sup over both
    # sides of every sample of the exact mixture CDF.
    rng = np.random.default_rng(RNG_SEED + 1)
    size = 2000
    x = np.where(rng.uniform(size=size) < 0.3, 0.0, rng.exponential(size=size))
    lam = np.linspace(0.0, 40.0, 400001)
    ks = stats.kolmogorov_distance(x, lam, 0.7 * np.exp(-lam), atoms=((0.0, 0.3),))
    cdf = lambda t: np.where(t < 0, 0.0, 0.3 + 0.7 * (1 - np.exp(-t)))
    s = np.sort(x)
    # at a tie (the atom) the empirical CDF jumps once, to the last copy's index
    right = np.searchsorted(s, s, side="right") / size
    left = np.searchsorted(s, s, side="left") / size
    exact = max(np.max(np.abs(right - cdf(s))), np.max(np.abs(left - (cdf(s) - 0.3 * (s == 0)))))
    assert ks == pytest.approx(exact, abs=1e-6)


def test_wasserstein_distance_matches_scipy_and_closed_forms():
    lam = np.linspace(-12.0, 14.0, 26001)
    h = lam[1] - lam[0]
    a = scipy.stats.norm.pdf(lam)
    # a shift by 0.7: W1 = 0.7 exactly
    assert stats.wasserstein_distance(lam, a, scipy.stats.norm.pdf(lam, 0.7)) == pytest.approx(0.7, abs=10 * h)
    # a scale change: scipy's W1 between the two grid distributions (weights density * h)
    b = scipy.stats.norm.pdf(lam, 0.0, 2.0)
    reference = scipy.stats.wasserstein_distance(lam, lam, a * h, b * h)
    assert stats.wasserstein_distance(lam, a, b) == pytest.approx(reference, abs=10 * h)
    # with atoms: scipy with the atoms as extra weighted values
    grid = np.linspace(0.0, 3.0, 3001)
    step = grid[1] - grid[0]
    rho = np.where((grid >= 1.0) & (grid <= 2.0), 0.5, 0.0)
    atoms_a, atoms_b = ((0.5, 0.5),), ((2.5, 0.5),)
    ours = stats.wasserstein_distance(grid, rho, rho, atoms_a, atoms_b)
    ref = scipy.stats.wasserstein_distance(np.r_[grid, 0.5], np.r_[grid, 2.5],
                                           np.r_[rho * step, 0.5], np.r_[rho * step, 0.5])
    assert ours == pytest.approx(ref, abs=2 * step) and ours == pytest.approx(1.0, abs=2 * step)


def test_mass_above_and_mass_and_moments():
    lam = np.linspace(0.0, 30.0, 30001)
    rho = np.exp(-lam)  # Exp(1): mass 1, m1 = 1, m2 = 2
    mass, m1, m2 = stats.mass_and_moments(lam, rho, atoms=((5.0, 0.25),))
    assert (mass, m1, m2) == pytest.approx((1.25, 1 + 0.25 * 5, 2 + 0.25 * 25), abs=1e-6)
    t = np.array([0.5, 4.999, 5.0, 7.0])
    expected = np.exp(-t) + 0.25 * (t < 5.0)
    np.testing.assert_allclose(stats.mass_above(lam, rho, t, ((5.0, 0.25),)), expected, atol=1e-7)


def test_support_edges_and_locate_atom():
    sc = fp.Semicircle(0.5)
    x = np.linspace(-2, 2, 4001)
    lo, hi = stats.support_edges(x, sc.density(x), floor=0.0)
    assert (lo, hi) == pytest.approx((-sc.radius, sc.radius), abs=x[1] - x[0])
    # point masses: W1 between delta(1) and delta(1.2) is 0.2; between a density and itself 0
    grid = np.linspace(0.5, 2, 1501)
    zero = np.zeros_like(grid)
    assert stats.wasserstein_distance(grid, zero, zero, ((1.0, 1.0),), ((1.2, 1.0),)) == pytest.approx(0.2, abs=1e-12)
    mp = fp.MarchenkoPastur(0.3)
    assert stats.wasserstein_distance(grid, mp.density(grid), mp.density(grid)) == 0
    # a shifted uniform density: W1 = shift (trapezoid error at the jumps: one grid step)
    step = grid[1] - grid[0]
    box = lambda a: ((grid >= a) & (grid <= a + 0.5)) / 0.5
    assert stats.wasserstein_distance(grid, box(0.7), box(0.9)) == pytest.approx(0.2, abs=2 * step)
    # the atom of a point mass is found where it is
    loc, mass = stats.locate_atom(fp.PointMasses([0.3, 1.7], [0.4, 0.6]), 1.0, 2.0, eps=1e-5)
    assert (loc, mass) == pytest.approx((1.7, 0.6), rel=1e-6)


BAD_GRID_INPUTS = [
    ("floor-negative", lambda x, d: stats.support_edges(x, d, floor=-1.0), r"support_edges: `floor` must be a finite real number >= 0"),
    ("never-exceeds", lambda x, d: stats.support_edges(x, np.zeros_like(x)), r"never exceeds"),
    ("atom-empty-interval", lambda x, d: stats.locate_atom(fp.Semicircle(0.5), 1.0, 1.0), r"locate_atom: `hi` must be > lo = 1.0"),
    ("atom-eps", lambda x, d: stats.locate_atom(fp.Semicircle(0.5), 1.0, 2.0, eps=0.0), r"`eps` must be a finite real number > 0"),
    ("atom-n-grid", lambda x, d: stats.locate_atom(fp.Semicircle(0.5), 1.0, 2.0, n_grid=2), r"`n_grid` must be an integer >= 3"),
    ("w1-length", lambda x, d: stats.wasserstein_distance(x, d[:-1], d), r"`density_a` must be a 1-d array of the same length as `lam`"),
    ("ks-length", lambda x, d: stats.kolmogorov_distance([0.1], x, d[:-1]), r"`density` must be a 1-d array"),
    ("ks-nan-sample", lambda x, d: stats.kolmogorov_distance([np.nan], x, d), r"`samples` must be a non-empty array of finite"),
    ("moments-grid", lambda x, d: stats.mass_and_moments([1.0], [1.0]), r"`lam` must be a 1-d grid of at least 2 points"),
]


@pytest.mark.parametrize("call, pattern", [b[1:] for b in BAD_GRID_INPUTS], ids=[b[0] for b in BAD_GRID_INPUTS])
def test_bad_grid_inputs_name_the_argument(call, pattern):
    x = np.linspace(-2, 2, 401)
    with pytest.raises(ValueError, match=pattern):
        call(x, fp.Semicircle(0.5).density(x))


# --- bootstrap and Wilson intervals (chapter 1) ---------------------------------------------


def test_bootstrap_interval_covers_the_mean_and_is_deterministic():
    # 200 simulated exponential samples of size 60: the 95% percentile interval of the mean
    # covers the true mean 1 in a fraction within 5 binomial SE of 0.95 (percentile intervals
    # undercover a little for skewed data: allowance 0.05 below).
    rng = np.random.default_rng(RNG_SEED)
    hits = 0
    reps = 200
    for i in range(reps):
        lo, hi = stats.bootstrap_interval(rng.exponential(size=60), key_or_seed=i, resamples=400)
        hits += lo <= 1.0 <= hi
    frac = hits / reps
    assert abs(frac - 0.95) <= 0.05 + 5 * math.sqrt(0.95 * 0.05 / reps)
    x = rng.lognormal(sigma=2.0, size=50)
    a = stats.bootstrap_interval(x, np.median, 0.9, key_or_seed=3)
    assert a == stats.bootstrap_interval(x, np.median, 0.9, key_or_seed=3)
    assert a[0] < np.median(x) < a[1]
    assert a[0] > 0   # heavy tail: the interval stays positive where mean - SE would not


def test_wilson_interval_against_the_score_formula_and_bounds():
    lo, hi = stats.wilson_interval(0, 50)
    assert abs(lo) < 1e-15 and 0 < hi < 0.1
    lo, hi = stats.wilson_interval([10, 40], 50)
    z = scipy.stats.norm.ppf(0.975)
    p = 0.2
    centre = (p + z * z / 100) / (1 + z * z / 50)
    np.testing.assert_allclose((lo[0] + hi[0]) / 2, centre, rtol=1e-12)
    np.testing.assert_allclose(lo[1], 1 - hi[0], rtol=1e-12)


@pytest.mark.parametrize("call, pattern", [
    (lambda: stats.bootstrap_interval([1.0]), r"`values` must be a 1-d array"),
    (lambda: stats.bootstrap_interval([1.0, np.nan]), r"`values` must be"),
    (lambda: stats.bootstrap_interval([1.0, 2.0], confidence=1.0), r"`confidence`"),
    (lambda: stats.bootstrap_interval([1.0, 2.0], key_or_seed="a"), r"`key_or_seed`"),
    (lambda: stats.wilson_interval(3, 2), r"`successes`"),
    (lambda: stats.wilson_interval(1, 0), r"`trials`"),
])
def test_interval_inputs_name_the_argument(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()


# --- paired comparisons over seeds (chapter 5) -----------------------------------------------


def test_clopper_pearson_matches_scipy_exact_interval():
    for n in (1, 5, 10, 30):
        for k in range(n + 1):
            ref = scipy.stats.binomtest(k, n).proportion_ci(0.95, method="exact")
            np.testing.assert_allclose(stats.clopper_pearson(k, n), (ref.low, ref.high), rtol=1e-9, atol=1e-12)
    assert stats.clopper_pearson(10, 10)[0] == pytest.approx(0.025 ** 0.1)


def test_sign_test_interval_and_p_value_agree_at_ten_units():
    # m = 10 non-tied units: the exact interval excludes 0 exactly when the two-sided exact test
    # rejects at 5% (9 or more of one sign); ties are set aside
    for k in range(11):
        r = stats.sign_test([1.0] * k + [-2.0] * (10 - k) + [0.0] * 3)
        assert (r["positive"], r["negative"], r["ties"]) == (k, 10 - k, 3)
        assert r["estimate"] == pytest.approx((2 * k - 10) / 10)
        assert (r["lo"] > 0 or r["hi"] < 0) == (r["p_value"] < 0.05) == (k <= 1 or k >= 9)
    assert stats.sign_test([0.0, 0.0]) == {"positive": 0, "negative": 0, "ties": 2, "estimate": 0.0,
                                           "lo": -1.0, "hi": 1.0, "p_value": 1.0}


def test_paired_bootstrap_vector_statistic_and_missing_values():
    rng = np.random.default_rng(RNG_SEED)
    table = rng.normal(size=(12, 3))
    table[0, 2] = np.nan  # a missing run: nan-aware statistics skip it
    r = stats.paired_bootstrap(table, lambda x: np.stack([np.nanmean(x[..., 2], -1), np.nanmin(x[..., 0], -1)], -1),
                               resamples=500, key_or_seed=5)
    assert r["estimate"].shape == (2,) and np.all(r["lo"] <= r["hi"]) and np.all(r["resamples"] == 500)
    assert r["estimate"][0] == pytest.approx(np.nanmean(table[:, 2]))
    assert r["lo"][1] >= table[:, 0].min()  # a resample's minimum is never below the sample's


@pytest.mark.parametrize("call, pattern", [
    (lambda: stats.clopper_pearson(3, 2), r"`successes`"),
    (lambda: stats.clopper_pearson(1, 0), r"`trials`"),
    (lambda: stats.sign_test([]), r"`differences`"),
    (lambda: stats.sign_test([1.0, np.inf]), r"`differences`"),
    (lambda: stats.paired_bootstrap(np.ones(5), np.mean), r"`table`"),
    (lambda: stats.paired_bootstrap(np.ones((5, 2)), "mean"), r"`statistic`"),
    (lambda: stats.paired_bootstrap(np.ones((5, 2)), lambda x: x, resamples=10), r"`statistic`"),
    (lambda: stats.paired_bootstrap(np.ones((5, 2)), lambda x: x.mean((-1, -2)), resamples=5), r"`resamples`"),
])
def test_paired_inputs_name_the_argument(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()


# ---------------------------------------------------------------------------------------------
# Claims tables (issue 40): Holm, the paired permutation test, BCa, verdicts
# ---------------------------------------------------------------------------------------------


def _mean_difference(x):
    return x[..., 1].mean(-1) - x[..., 0].mean(-1)


def test_holm_matches_its_definition_and_controls_the_family_wise_error():
    """Adjusted p-values against the definition (a brute-force loop), and the family-wise error
    under the global null of 5 independent uniform p-values: 4,000 families, the rate of any
    rejection at 0.05 is at most 0.05 + 3 binomial SE (0.0034): 0.060."""
    rng = np.random.default_rng(RNG_SEED)
    p = rng.uniform(size=7)
    m = p.size
    order = np.argsort(p)
    expected = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        expected[i] = running
    np.testing.assert_allclose(stats.holm(p), expected, rtol=1e-15)
    families = rng.uniform(size=(4000, 5))
    any_rejected = np.array([np.any(stats.holm(f) <= 0.05) for f in families])
    assert any_rejected.mean() <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 4000)
    # less conservative than Bonferroni, never more
    assert np.all(stats.holm(p) <= np.minimum(1, m * p) + 1e-15)


def test_paired_permutation_test_size_and_power():
    """Under the sharp null (seed effects shared by both conditions, no condition effect) the
    one-sided p-value is uniform: over 300 tables of 10 units the rejection rate at 0.05 is at
    most 0.05 + 3 SE (0.0126) = 0.088. A shift of 1 (against noise 0.3 within a seed, seed effects
    of sd 5 that pairing removes) is found in every one of 20 tables. The test is valid for a
    statistic built from minima as well (the same size check on 'the minimum of condition 0 minus
    that of condition 1')."""
    rng = np.random.default_rng(RNG_SEED + 1)
    minimum_gap = lambda x: np.nanmin(x[..., 0], -1) - np.nanmin(x[..., 1], -1)  # noqa: E731
    null_p, null_p_min = [], []
    for i in range(300):
        t = rng.normal(0, 5, (10, 1)) + rng.normal(0, 0.3, (10, 2))
        null_p.append(stats.paired_permutation_test(t, _mean_difference, resamples=199, key_or_seed=i)["p_greater"])
        null_p_min.append(stats.paired_permutation_test(t, minimum_gap, resamples=199, key_or_seed=i)["p_less"])
    bound = 0.05 + 3 * math.sqrt(0.05 * 0.95 / 300)
    assert np.mean(np.array(null_p) <= 0.05) <= bound
    assert np.mean(np.array(null_p_min) <= 0.05) <= bound
    for i in range(20):
        t = rng.normal(0, 5, (10, 1)) + rng.normal(0, 0.3, (10, 2)) + np.array([0.0, 1.0])
        r = stats.paired_permutation_test(t, _mean_difference, resamples=199, key_or_seed=i)
        assert r["p_greater"] <= 0.05 and r["p_less"] > 0.5
        assert r["estimate"] == pytest.approx(_mean_difference(t[None])[0])


def test_one_null_distribution_gives_scipys_p_values_on_both_sides():
    """paired_permutation_test draws its relabellings once and reads both one-sided p-values off
    that null distribution: they are exactly what scipy.stats.permutation_test gives with the same
    stream, one call per side. Cases: exact enumerations (2^6, 2^5 and 2^3 relabellings, and 2^7 at
    resamples = 128, the boundary where scipy still enumerates) and Monte Carlo ones (3!^3 = 216 and
    2^12, above 199); tied values (integers), and ties that differ by rounding only (the 2^7 table:
    its tie tolerance changes the counts, 98 against 102 relabellings at or below the estimate); a
    ratio whose null holds +inf (the 2^3 table); relabellings whose statistic is NaN (the table's
    NaN moved out of the column that skips it: counted as extreme, the NaN mapped to +inf for
    'greater' and -inf for 'less' in scipy's calls)."""
    from scipy import stats as scipy_stats

    rng = np.random.default_rng(RNG_SEED + 7)
    with_nan = rng.normal(size=(5, 2))
    with_nan[0, 0] = np.nan
    rounding_ties = np.array([[1.1, 0.7], [0.3, 0.2], [0.2, 0.1], [0.1, 0.1], [0.1, 1.1], [0.7, 1.1], [0.3, 0.7]])
    cases = [(rng.integers(0, 3, (6, 2)).astype(float), 199), (rng.normal(size=(3, 3)), 199),
             (rng.normal(size=(12, 2)), 199), (rng.integers(0, 2, (12, 2)).astype(float), 199), (with_nan, 199),
             (rounding_ties, 128), (np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 0.0]]), 199)]
    ratio = lambda x: x[..., 1].mean(-1) / x[..., 0].mean(-1)  # noqa: E731
    skips_nan_in_0 = lambda x: x[..., 1].mean(-1) - np.nanmean(x[..., 0], -1)  # noqa: E731
    for i, (t, resamples) in enumerate(cases):
        for statistic in (_mean_difference, ratio, skips_nan_in_0):
            r = stats.paired_permutation_test(t, statistic, resamples=resamples, key_or_seed=i)
            if t is with_nan and statistic is not skips_nan_in_0:  # NaN on the table itself: nothing to test
                assert math.isnan(r["estimate"]) and r["p_greater"] == r["p_less"] == 1.0
                continue
            seed = int(np.random.default_rng(i).integers(2**63))  # the stream paired_permutation_test hands to scipy
            for side, nan_as in (("greater", np.inf), ("less", -np.inf)):
                counted = (lambda *cols, axis=-1, nan_as=nan_as:
                           np.nan_to_num(statistic(np.stack(cols, -1)), nan=nan_as, posinf=np.inf, neginf=-np.inf))
                with np.errstate(all="ignore"):
                    expected = scipy_stats.permutation_test(
                        tuple(t.T), counted, permutation_type="samples", vectorized=True, n_resamples=resamples,
                        alternative=side, **stats._scipy_rng(np.random.default_rng(seed))).pvalue
                assert r[f"p_{side}"] == pytest.approx(float(expected), abs=1e-12), (i, side)


def test_grouped_permutation_agrees_with_scipy_and_keeps_other_columns():
    """One group holding every column is the same test as scipy's: on 40 tables the p-values
    agree within 4 Monte Carlo SE of a p-value near 0.5 (sqrt(0.25 / 2000) = 0.011 each: 0.063).
    With two groups, a large difference *between* the groups (a scale effect) is not evidence
    against the within-group null: p stays uniform-ish (above 0.01 on a table with no within-group
    effect), where one group over all columns would reject."""
    rng = np.random.default_rng(RNG_SEED + 3)
    for i in range(40):
        t = rng.normal(0, 2, (8, 1)) + rng.normal(0, 1, (8, 3))
        within = lambda x: x[..., 2].mean(-1) - x[..., 0].mean(-1)  # noqa: E731
        a = stats.paired_permutation_test(t, within, resamples=1999, key_or_seed=i)
        b = stats.paired_permutation_test(t, within, groups=[[0, 1, 2]], resamples=1999, key_or_seed=i)
        assert abs(a["p_greater"] - b["p_greater"]) < 0.063 and abs(a["p_less"] - b["p_less"]) < 0.063
    t = rng.normal(0, 1, (10, 4)) + np.array([0.0, 0.0, 10.0, 10.0])  # columns 2-3: another scale
    gap = lambda x: x[..., 2:].mean((-1, -2)) - x[..., :2].mean((-1, -2))  # noqa: E731
    assert stats.paired_permutation_test(t, gap, groups=[[0, 1], [2, 3]], resamples=499)["p_greater"] > 0.01
    assert stats.paired_permutation_test(t, gap, resamples=499)["p_greater"] < 0.01


def test_permutations_with_an_undefined_statistic_count_as_extreme():
    """A relabelling whose statistic is NaN (here: unit 0's missing value moved into the column the
    statistic averages without skipping NaN) counts as at least as extreme on both sides, so the
    p-value is never below the one with those relabellings left out. The exact enumeration (2^3
    relabellings, scipy's path) and the grouped Monte Carlo path both give the brute-force count."""
    t = np.array([[np.nan, 1.0], [0.0, 2.0], [0.5, 0.7]])
    statistic = lambda x: x[..., 1].mean(-1) - np.nanmean(x[..., 0], -1)  # noqa: E731
    flips = np.array(np.meshgrid(*[[0, 1]] * 3, indexing="ij")).reshape(3, -1).T
    null = statistic(np.stack([np.where(f[:, None], t[:, ::-1], t) for f in flips]))
    estimate = statistic(t[None])[0]
    assert np.isnan(null).sum() == 4 and np.isfinite(estimate)
    exact_greater = np.mean((null >= estimate) | np.isnan(null))
    exact_less = np.mean((null <= estimate) | np.isnan(null))
    r = stats.paired_permutation_test(t, statistic, resamples=99)
    assert (r["p_greater"], r["p_less"]) == pytest.approx((exact_greater, exact_less))
    assert (r["p_greater"], r["p_less"]) == pytest.approx((5 / 8, 1.0))  # NaN ones left out: 1/4 and 1
    g = stats.paired_permutation_test(t, statistic, groups=[[0, 1]], resamples=1999, key_or_seed=3)
    assert abs(g["p_greater"] - exact_greater) < 4 * math.sqrt(0.25 / 2000)
    assert abs(g["p_less"] - exact_less) < 4 * math.sqrt(0.25 / 2000)


def test_studentized_interval_covers_at_its_level():
    """Coverage of the bootstrap-t 95 % interval of a paired mean difference at 10 units (the
    seeds of a quick study), skewed noise (exponential, shared seed effects of sd 3): 300 simulated
    tables, the coverage is within 3 binomial SE (0.038) of 0.95 (the interval's O(1/n) error is
    inside that band; BCa covers about 0.89 here, outside it). A degenerate table has no interval."""
    rng = np.random.default_rng(RNG_SEED + 2)
    covered = 0
    for i in range(300):
        t = rng.normal(0, 3, (10, 1)) + rng.exponential(1.0, (10, 2)) + np.array([0.0, 0.5])
        lo, hi = stats.studentized_interval(t, _mean_difference, resamples=499, key_or_seed=i)
        covered += lo <= 0.5 <= hi
    assert abs(covered / 300 - 0.95) <= 3 * math.sqrt(0.95 * 0.05 / 300)
    assert all(math.isnan(v) for v in stats.studentized_interval(np.ones((5, 2)), _mean_difference, resamples=99))


def test_claims_verdicts_directions_family_and_fixed_verdicts():
    table = stats.claims_verdicts([
        {"claim": "for", "p_for": 0.001, "p_against": 0.999},
        {"claim": "against", "p_for": 0.999, "p_against": 0.002},
        {"claim": "weak", "p_for": 0.03, "p_against": 0.97},  # 0.06 two-sided: resolved by none
        {"claim": "minimum", "testable": False, "reason": "a minimum over seeds"},
        {"claim": "universal", "verdict": "contradicted"},
    ])
    assert [c["verdict"] for c in table] == ["holds", "contradicted", "not resolved",
                                             "not testable at this scale", "contradicted"]
    assert [c["family_size"] for c in table] == [3] * 5
    assert table[2]["p_adjusted"] == pytest.approx(0.06)  # the largest of three: factor 1
    assert math.isnan(table[3]["p_adjusted"]) and math.isnan(table[4]["p_adjusted"])
    # a claim at 0.02 two-sided holds alone and not in a family of 3 others at the same level
    assert stats.claims_verdicts([{"p_for": 0.01, "p_against": 0.99}])[0]["verdict"] == "holds"
    family = stats.claims_verdicts([{"p_for": 0.01, "p_against": 0.99}] * 4)
    assert all(c["verdict"] == "not resolved" for c in family)  # Holm: 4 x 0.02 = 0.08 > 0.05



@pytest.mark.parametrize("call, pattern", [
    (lambda: stats.holm([0.1, 1.2]), "p_values"),
    (lambda: stats.holm([[0.1]]), "p_values"),
    (lambda: stats.paired_permutation_test(np.ones((1, 2)), _mean_difference), "table"),
    (lambda: stats.paired_permutation_test(np.ones((4, 2)), "mean"), "statistic"),
    (lambda: stats.paired_permutation_test(np.ones((4, 2)), _mean_difference, resamples=5), "resamples"),
    (lambda: stats.paired_permutation_test(np.ones((4, 3)), _mean_difference, groups=[[0, 1], [1, 2]]), "groups"),
    (lambda: stats.paired_permutation_test(np.ones((4, 3)), _mean_difference, groups=[[0, 3]]), "groups"),
    (lambda: stats.studentized_interval(np.ones((4, 2)), _mean_difference, confidence=1.0), "confidence"),
    (lambda: stats.studentized_interval(np.ones((2, 2)), _mean_difference), "table"),
    (lambda: stats.claims_verdicts([{"claim": "no test"}]), "claims"),
    (lambda: stats.claims_verdicts([{"p_for": 2.0, "p_against": 0.1}]), "claims"),
    (lambda: stats.claims_verdicts([{"verdict": "probably"}]), "claims"),
    (lambda: stats.claims_verdicts([], alpha=0.0), "alpha"),
])
def test_claims_inputs_name_the_argument(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()


def test_studentized_interval_with_a_closed_form_error_matches_the_jackknife_for_a_mean():
    """For a mean of per-unit differences the jackknife error is exactly std(d, ddof=1) / sqrt(n),
    so the closed-form option gives the same interval (to rounding) at O(resamples n) work."""
    rng = np.random.default_rng(RNG_SEED + 4)
    t = rng.normal(0, 3, (15, 1)) + rng.exponential(1.0, (15, 2))
    error = lambda x: (x[..., 1] - x[..., 0]).std(-1, ddof=1) / math.sqrt(15)  # noqa: E731
    jack = stats.studentized_interval(t, _mean_difference, resamples=499, key_or_seed=1)
    closed = stats.studentized_interval(t, _mean_difference, resamples=499, key_or_seed=1, standard_error=error)
    np.testing.assert_allclose(closed, jack, rtol=1e-9)
    with pytest.raises(ValueError, match="standard_error"):
        stats.studentized_interval(t, _mean_difference, standard_error=1.0)


def test_the_jackknife_of_means_is_the_generic_jackknife_for_a_statistic_of_means():
    """The O(units) jackknife (leave-one-out means) gives the generic jackknife's errors, and so its
    interval, for a non-linear statistic of means (a minimum of two means minus a third, as ch5 p6's
    "GOE has the best mean") with missing values, including a condition whose only finite value is
    left out (NaN, as nanmean)."""
    rng = np.random.default_rng(RNG_SEED + 5)
    t = rng.normal(0, 1, (12, 3)) + np.array([0.0, 0.3, 0.5])
    t[[2, 7], 1] = np.nan
    margin = lambda x: np.minimum(np.nanmean(x[..., 1], -1), np.nanmean(x[..., 2], -1)) - np.nanmean(x[..., 0], -1)  # noqa: E731
    boot = t[rng.integers(0, 12, (40, 12))]
    fast = stats.jackknife_se_of_means(margin)
    np.testing.assert_allclose(fast(boot), stats._jackknife_se(margin, boot), rtol=1e-10)
    lonely = np.full((1, 4, 2), np.nan)
    lonely[0, :, 0], lonely[0, 0, 1] = [1.0, 2.0, 3.0, 5.0], 4.0
    difference = lambda x: np.nanmean(x[..., 1], -1) - np.nanmean(x[..., 0], -1)  # noqa: E731
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # nanmean of the empty column: NaN, left out of the error
        np.testing.assert_allclose(stats.jackknife_se_of_means(difference)(lonely),
                                   stats._jackknife_se(difference, lonely), rtol=1e-10)
    generic = stats.studentized_interval(t, margin, resamples=299, key_or_seed=2)
    np.testing.assert_allclose(stats.studentized_interval(t, margin, resamples=299, key_or_seed=2, standard_error=fast),
                               generic, rtol=1e-9)
    with pytest.raises(ValueError, match="statistic"):
        stats.jackknife_se_of_means(1.0)


def test_equivalence_test_has_its_level_at_the_margin_and_matches_its_interval():
    # TOST: at a true mean on the margin the rejection rate is alpha (4,000 simulated studies of 30 units: the
    # standard error of a rate near 0.05 is 0.0034, so 3 of them bound it); the test rejects exactly when the
    # 1 - 2 alpha t-interval lies inside the margin; far from the margin it has power
    rng = np.random.default_rng(0)
    at_margin = [stats.equivalence_test(rng.normal(1.0, 1.0, 30), 1.0) for _ in range(4000)]
    rate = np.mean([r["equivalent"] for r in at_margin])
    assert abs(rate - 0.05) < 3 * np.sqrt(0.05 * 0.95 / 4000), rate
    assert all(r["equivalent"] == (-1.0 < r["lo"] and r["hi"] < 1.0) for r in at_margin)
    assert stats.equivalence_test(rng.normal(0.0, 1.0, 200), 0.5)["equivalent"]
    for bad, name in (([1.0], "differences"), ([1.0, 1.0], "differences"), ([1.0, np.nan], "differences")):
        with pytest.raises(ValueError, match=name):
            stats.equivalence_test(bad, 1.0)
    with pytest.raises(ValueError, match="margin"):
        stats.equivalence_test([0.0, 1.0], 0.0)
    with pytest.raises(ValueError, match="alpha"):
        stats.equivalence_test([0.0, 1.0], 1.0, alpha=0.5)
