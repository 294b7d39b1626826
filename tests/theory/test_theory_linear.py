"""Tests for deqlab.theory.linear (001 §2, App. A, B.1) against simulation (deqlab.lab.experiments.linear).

Tolerances. All random tests use fixed keys (deterministic), with bounds of ``Z = 5`` standard
errors computed in the test from the sample itself (two-sided p ~ 6e-7 for a correct formula):

* The closed forms are ``N -> inf`` limits; normalised traces at finite ``N`` carry a bias of
  order ``1/N`` (e.g. ``E tr[O^{2k}] = 1/N`` for Haar orthogonal ``O``), which would dominate the
  standard error. Each limit is therefore estimated by Richardson extrapolation in ``N`` from two
  widths, ``2 m(2N) - m(N)``, which cancels the ``1/N`` term; its standard error is
  ``sqrt(4 se(2N)^2 + se(N)^2)``. The remaining ``O(N^-2)`` term is neglected; it is a further
  factor ``~1/N`` smaller than the bias removed.
* ``V`` is kept at half of ``V_c`` in the moment tests, where the probability that a finite-``N``
  matrix has an eigenvalue near 1 (which makes the finite-``N`` expectation infinite, 001 §2.2.2)
  is astronomically small.
* Lemma 2.2 is exact at every ``N``: the sample variance of ``z . z`` over inputs is compared with
  ``2 Tr[(M^T M)^2]`` with the standard error of a sample variance.
* Identities that are pure mathematics (integral = closed form, series -> closed form,
  asymptote ratio -> 1, decomposition sweep = direct inverse) use float64 round-off bounds.
"""

import math

import jax
import numpy as np
import pytest

from deqlab import ensembles
from deqlab.lab import stats
from deqlab.lab.experiments import linear as ex
from deqlab.theory import linear as th

# Theory checks: closed forms and limits to ~1e-10, float64 by convention (tests/conftest.py).
pytestmark = pytest.mark.float64

Z = 5.0
ENS = th.ENSEMBLES


def richardson(per_width):
    """Limit estimate and SE from ``{N: samples}`` at two widths ``N`` and ``2N``."""
    (n1, a1), (n2, a2) = sorted(per_width.items())
    assert n2 == 2 * n1
    return stats.richardson_mean(a1, a2)


def within(est, se, predicted):
    return abs(est - predicted) <= Z * se, f"estimate {est:.6g} +- {se:.2g}, predicted {predicted:.6g}"


# ---------------------------------------------------------------------------------------------
# Argument validation
# ---------------------------------------------------------------------------------------------


def test_critical_variance_matches_ensembles():
    for e in ENS:
        assert th.critical_variance(e) == ensembles.critical_variance(e)
        assert th.critical_variance(e, tied=False) == 1.0
    assert th.critical_variance("goe") == 0.25


def test_critical_variance_puts_the_sampled_spectral_radius_at_one():
    # At V = V_c a sampled W has spectral radius 1 up to its finite-N edge correction: none for
    # orthogonal, O(N^-2/3) = 0.02 for the GOE, sqrt(log N / 4N) = 0.06 outward for Ginibre at N = 500
    # (page 4 of chapter 1). 0.1 covers these; a wrong V_c (e.g. 1 instead of 1/4 for the GOE) is off
    # by a factor of 2 or more.
    n = 500
    for i, e in enumerate(ENS):
        w = np.asarray(ensembles.sample(e, jax.random.PRNGKey(40 + i), n, math.sqrt(th.critical_variance(e)), np.float64))
        radius = np.max(np.abs(np.linalg.eigvals(w)))
        assert abs(radius - 1.0) <= 0.1, (e, radius)


@pytest.mark.parametrize("bad", [-0.1, 0.25, 0.3, float("nan"), float("inf"), True, "x", [0.1, 0.3]])
def test_out_of_range_V_raises_with_range(bad):
    with pytest.raises(ValueError, match="V"):
        th.second_moment("goe", bad)


@pytest.mark.parametrize(
    "fn",
    [th.first_moment, th.second_moment, th.variance, th.gram_trace, th.length_variance, th.ntk,
     th.delta],
)
def test_every_function_validates(fn):
    with pytest.raises(ValueError, match="ensemble"):
        fn("antisymmetric", 0.1)
    with pytest.raises(ValueError, match="0 <= V < V_c = 1"):
        fn("gaussian", 1.0)
    with pytest.raises(ValueError, match="tied"):
        fn("gaussian", 0.1, tied="yes")


def test_other_validation():
    # power=3, an unknown quantity, terms=0, nodes=0: tests/library/test_probe.py (theory.linear rows)
    with pytest.raises(ValueError, match="scalar"):
        th.power_series("goe", [0.1, 0.2])
    with pytest.raises(ValueError, match="V_c = 0.25"):
        th.goe_length_variance_integral(0.25)
    # untied GOE converges up to V = 1, tied only up to 1/4
    assert th.second_moment("goe", 0.5, tied=False) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="0 <= V < V_c = 1"):
        th.length_variance("goe", 1.0, tied=False)
    with pytest.raises(ValueError, match="n"):
        ex.draw("goe", jax.random.PRNGKey(0), 0)
    with pytest.raises(ValueError, match=r"untied_traces: `V` must be a finite real number >= 0 and < 1"):
        ex.untied_traces("gaussian", jax.random.PRNGKey(0), 4, 1.0, 2)


def test_vectorised_V():
    v = np.array([0.0, 0.1, 0.2])
    out = th.length_variance("goe", v)
    assert out.shape == (3,)
    assert out[0] == pytest.approx(2.0)  # V = 0: z = x, Var[x . x] / N = 2
    np.testing.assert_allclose(out, [th.length_variance("goe", float(x)) for x in v], rtol=1e-14)


# ---------------------------------------------------------------------------------------------
# Lemma 2.2 (exact at finite N)
# ---------------------------------------------------------------------------------------------


def test_lemma_2_2_length_variance_identity():
    w0 = ex.draw("gaussian", jax.random.PRNGKey(1), 40, 1)[0]
    m = np.linalg.inv(np.eye(40) - math.sqrt(0.5) * w0)
    est, se, exact = ex.length_variance_sample(m, jax.random.PRNGKey(2), 40_000)
    ok, msg = within(est, se, exact)
    assert ok, msg


# ---------------------------------------------------------------------------------------------
# Tied moments: first, second, variance, fourth (length variance), against simulation
# ---------------------------------------------------------------------------------------------

WIDTHS = {"gaussian": (48, 96), "orthogonal": (48, 96), "goe": (48, 96)}
SAMPLES = 48


@pytest.fixture(scope="module")
def tied_sims():
    out = {}
    for i, e in enumerate(ENS):
        V = 0.5 * th.critical_variance(e)
        per = {}
        for j, n in enumerate(WIDTHS[e]):
            w0 = ex.draw(e, jax.random.PRNGKey(100 + 10 * i + j), n, SAMPLES)
            per[n] = ex.tied_traces(w0, V)
        out[e] = (V, per)
    return out


@pytest.mark.slow  # the module fixture tied_sims takes ~9 s
@pytest.mark.parametrize("e", ENS)
@pytest.mark.parametrize("key,fn", [
    ("first", lambda e, V: th.first_moment(e, V)),
    ("second", lambda e, V: th.second_moment(e, V)),
    ("variance", lambda e, V: th.variance(e, V)),
    ("fourth", lambda e, V: th.gram_trace(e, V, 2)),
    ("length", lambda e, V: th.length_variance(e, V)),
    ("ntk-proxy", lambda e, V: th.ntk(e, V)),
])
def test_tied_closed_forms_against_simulation(tied_sims, e, key, fn):
    V, per = tied_sims[e]
    if key == "variance":
        data = {n: t["second"] - t["first"] ** 2 for n, t in per.items()}
    elif key == "length":
        data = {n: 2 * t["fourth"] for n, t in per.items()}
    elif key == "ntk-proxy":  # tr[M M^T] tr[M^T M] = second^2, the concentrated NTK
        data = {n: t["second"] ** 2 for n, t in per.items()}
    else:
        data = {n: t[key] for n, t in per.items()}
    est, se = richardson(data)
    ok, msg = within(est, se, fn(e, V))
    assert ok, f"{e} {key}: {msg}"


@pytest.mark.slow  # tied_sims
def test_goe_erratum_eq66_is_rejected(tied_sims):
    """001 Eq. 66 as printed (1/sqrt(1-4V) - f_c) is far outside the error bars."""
    V, per = tied_sims["goe"]
    est, se = richardson({n: t["second"] for n, t in per.items()})
    s = math.sqrt(1 - 4 * V)
    printed = 1 / s - (1 - s) / (2 * V)
    assert abs(est - printed) > 20 * se
    # and the mean of z* is f_c(V) x, not x (001 App. A.3)
    est1, se1 = richardson({n: t["first"] for n, t in per.items()})
    assert abs(est1 - 1.0) > 20 * se1


# ---------------------------------------------------------------------------------------------
# Untied weights
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("e", ENS)
def test_untied_closed_forms_against_simulation(e):
    V = 0.5
    per = {n: ex.untied_traces(e, jax.random.PRNGKey(200 + n), n, V, 24, depth=36)
           for n in (40, 80)}
    # depth 36: neglected tail of order V^36 ~ 1e-11.
    for key, predicted in [("first", th.first_moment(e, V, tied=False)),
                           ("second", th.second_moment(e, V, tied=False)),
                           ("fourth", th.gram_trace(e, V, 2, tied=False))]:
        est, se = richardson({n: t[key] for n, t in per.items()})
        ok, msg = within(est, se, predicted)
        assert ok, f"untied {e} {key}: {msg}"
    est, se = richardson({n: 2 * t["fourth"] for n, t in per.items()})
    assert within(est, se, th.length_variance(e, V, tied=False))[0]
    assert th.variance(e, V, tied=False) == pytest.approx(V / (1 - V))


def test_untied_eq76_as_printed_is_rejected():
    """At V = 0.8 the corrected untied Gaussian value (91.7) and 001 Eq. 76 (52.2) differ by far
    more than the error bars; single width N = 64 (bias O(1/N) is a few percent)."""
    V = 0.8
    t = ex.untied_traces("gaussian", jax.random.PRNGKey(11), 64, V, 12, depth=130)
    est, se = stats.mean_se(t["fourth"])
    printed = 1 / (1 - V**2) ** 2 + 2 / (1 - V) ** 2 - 2 / (1 - V**2)
    ours = th.gram_trace("gaussian", V, 2, tied=False)
    assert abs(est - printed) > Z * se
    assert abs(est - ours) < abs(est - printed) / 4


def test_untied_iteration_length_is_exact_in_expectation():
    """E[z_t . z_t / N] = (1 - V^{t+1}) / (1 - V) exactly for Ginibre (001 Eq. 56), any N."""
    V, steps = 0.6, 30
    out = ex.iterate("gaussian", jax.random.PRNGKey(3), 30, V, steps, samples=200, tied=False)
    est, se = stats.mean_se(out["length"][-1])
    ok, msg = within(est, se, (1 - V ** (steps + 1)) / (1 - V))
    assert ok, msg
    assert (1 - V ** (steps + 1)) / (1 - V) == pytest.approx(th.second_moment("gaussian", V, False), rel=1e-6)


def test_tied_iteration_orthogonal_error_contracts_exactly():
    """z_t - z* = W^t (z_0 - z*); for W = sqrt(V) O the error shrinks by exactly sqrt(V)."""
    V = 0.64
    out = ex.iterate("orthogonal", jax.random.PRNGKey(4), 20, V, 15, samples=3)
    expected = 0.8 ** np.arange(16)
    np.testing.assert_allclose(out["error"], np.broadcast_to(expected[:, None], (16, 3)), rtol=1e-9)


# ---------------------------------------------------------------------------------------------
# Gaussian limit of z*_i (001 Theorem A.2)
# ---------------------------------------------------------------------------------------------


def test_fixed_point_entries_are_gaussian_with_predicted_variance():
    """001 Theorem A.2: z*_i - x_i -> N(0, V/(1-V) x.x/N). One entry per independent W (so the
    samples are independent), fixed input x; Kolmogorov-Smirnov against the *predicted* normal
    law (variance from theory, not fitted), rejecting at p < 1e-3. Moment-based checks are
    avoided here: at finite N rare near-singular I - W give heavy tails that make the sample
    variance and kurtosis unstable, while the law itself is already close to Gaussian."""
    from scipy import stats

    n, S, V = 96, 1000, 0.5
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(n), (n,)), dtype=np.float64)
    z = ex.fixed_points(ex.draw("gaussian", jax.random.PRNGKey(6 + n), n, S), V, x)
    r = (z[:, 0] - x[0]) / math.sqrt(x @ x / n)
    sd = math.sqrt(th.variance("gaussian", V))
    assert stats.kstest(r, stats.norm(0, sd).cdf).pvalue > 1e-3
    # a wrong variance (the untied t = 1 value V instead of V/(1-V)) is rejected
    assert stats.kstest(r, stats.norm(0, math.sqrt(V)).cdf).pvalue < 1e-3


# ---------------------------------------------------------------------------------------------
# GOE integral (Eq. 81), series, asymptotes, divergence exponents
# ---------------------------------------------------------------------------------------------


def test_goe_integral_equals_closed_form():
    v = np.array([1e-4, 0.05, 0.15, 0.24, 0.2499])
    np.testing.assert_allclose(th.goe_length_variance_integral(v), th.gram_trace("goe", v, 2),
                               rtol=1e-10)


@pytest.mark.parametrize("e", ENS)
@pytest.mark.parametrize("quantity,power", [("second", 1), ("fourth", 2)])
def test_power_series_converge_to_closed_forms(e, quantity, power):
    V = 0.6 * th.critical_variance(e)
    s = th.power_series(e, V, quantity, terms=400)
    assert s[-1] == pytest.approx(th.gram_trace(e, V, power), rel=1e-10)
    assert np.all(np.diff(s) >= 0) and s[1] > s[0]


def _truncated_series_traces(w, degree):
    """Per matrix: the parts of tr[M^T M] and tr[(M^T M)^2], M = sum_k W^k, of total degree
    <= ``degree`` in W, i.e. sums of tr[(W^T)^j W^k] over j + k <= degree and of
    tr[(W^T)^j W^k (W^T)^l W^m] over j + k + l + m <= degree (normalised trace)."""
    n = w.shape[-1]
    powers = [np.broadcast_to(np.eye(n), w.shape)]
    for _ in range(degree):
        powers.append(powers[-1] @ w)
    tr = lambda a: np.trace(a, axis1=-2, axis2=-1) / n  # noqa: E731
    pairs = {(j, k): np.swapaxes(powers[j], -1, -2) @ powers[k]
             for j in range(degree + 1) for k in range(degree + 1 - j)}
    second = sum(tr(p) for p in pairs.values())
    fourth = sum(tr(pairs[j, k] @ pairs[jj, kk]) for (j, k) in pairs for (jj, kk) in pairs
                 if j + k + jj + kk <= degree)
    return second, fourth


@pytest.mark.slow
@pytest.mark.parametrize("e", ENS)
def test_power_series_terms_against_simulation(e):
    # The partial sum S_i of 001 Eq. 60, 63, 79, 80 (powers V^0 ... V^i) is E tr of the part of the
    # matrix series of degree <= 2i in W = sqrt(V) W0 (odd degrees vanish as N -> inf). The first
    # four partial sums, every coefficient up to V^3, are checked on sampled matrices: Richardson in
    # N from N = 48, 96 with 48 matrices each, 5 standard errors.
    V, terms = 0.5 * th.critical_variance(e), 4
    per = {}
    for j, n in enumerate(WIDTHS[e]):
        w = math.sqrt(V) * ex.draw(e, jax.random.PRNGKey(500 + j), n, SAMPLES)
        per[n] = [_truncated_series_traces(w, 2 * i) for i in range(terms)]
    for i in range(terms):
        for q, quantity in enumerate(("second", "fourth")):
            est, se = richardson({n: per[n][i][q] for n in per})
            ok, msg = within(est, se, th.power_series(e, V, quantity, terms=i + 1)[-1])
            assert ok, f"{e} {quantity} S_{i}: {msg}"


def test_power_series_first_terms():
    V = 0.1
    # orthogonal fourth: sum (i+1)^2 V^i; GOE second: 1, 3 C_1 V, 5 C_2 V^2 (Eq. 63)
    np.testing.assert_allclose(th.power_series("orthogonal", V, "fourth", 3), [1, 1 + 4 * V, 1 + 4 * V + 9 * V**2])
    np.testing.assert_allclose(th.power_series("goe", V, "second", 3), [1, 1 + 3 * V, 1 + 3 * V + 10 * V**2])


@pytest.mark.parametrize("e", ENS)
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("quantity", ["second", "length"])
def test_divergence_and_asymptote(e, tied, quantity):
    A, p = th.divergence(e, quantity, tied)
    vc = th.critical_variance(e, tied)
    f = th.second_moment if quantity == "second" else th.length_variance
    ds = np.array([1e-4, 1e-6, 1e-8])
    vals = np.array([f(e, vc * (1 - d), tied=tied) for d in ds])
    slope, amp = stats.fit_power_law(ds, vals)
    assert slope == pytest.approx(p, abs=1e-2)
    ratio = vals / th.asymptote(e, vc * (1 - ds), quantity, tied)
    assert abs(ratio[-1] - 1) < 1e-3 and abs(ratio[-1] - 1) < abs(ratio[0] - 1) + 1e-15
    assert th.delta(e, vc * 0.75, tied) == pytest.approx(0.25)


def test_goe_eq86_constant_is_one_over_32():
    """In 001's variable sqrt(V) = 1/2 - d, tr[(I-W)^-4] ~ d^{-5/2} / 32 (001 Eq. 86 prints 1/8)."""
    d = 1e-6
    v = (0.5 - d) ** 2
    assert th.goe_length_variance_integral(v) * d**2.5 == pytest.approx(1 / 32, rel=1e-5)


# ---------------------------------------------------------------------------------------------
# Figure 1 sweep, spectral radii, NTK
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("e", ENS)
def test_trace_sweep_matches_direct_inverse(e):
    n = 30
    w0 = ex.draw(e, jax.random.PRNGKey(7), n, 1)[0]
    vs = np.array([0.1, 0.5, 0.9]) * th.critical_variance(e)
    sweep = ex.trace_sweep(e, w0, vs)
    direct = np.array([ex.tied_traces(w0, v)["fourth"] for v in vs])
    np.testing.assert_allclose(sweep, direct, rtol=1e-8)


def test_trace_sweep_orthogonal_self_averages_near_theory():
    """Orthogonal W: tr[...] is a smooth linear statistic of rigid eigenangles (fluctuation and
    bias O(1/N)); Richardson over N = 96, 192 with six matrices each."""
    vs = np.array([0.5])
    per = {n: np.array([ex.trace_sweep("orthogonal", w, vs)[0]
                        for w in ex.draw("orthogonal", jax.random.PRNGKey(8 + n), n, 6)])
           for n in (96, 192)}
    est, se = richardson(per)
    assert within(est, se, th.gram_trace("orthogonal", 0.5))[0]


def test_spectral_radii_and_divergence_probability():
    r_orth = ex.spectral_radii("orthogonal", jax.random.PRNGKey(9), 20, 10)
    np.testing.assert_allclose(r_orth, 1.0, atol=1e-10)
    p, se = ex.divergence_probability(r_orth, "orthogonal", [1e-6, 0.5])
    assert np.all(p == 0)
    # GOE edge: rho(W0) = 2 + O(N^{-2/3}) (Tracy-Widom); deep inside, no divergence.
    n = 48
    r_goe = ex.spectral_radii("goe", jax.random.PRNGKey(10), n, 48, batch=48)
    assert np.all(np.abs(r_goe - 2.0) < 8 * n ** (-2 / 3))
    p, _ = ex.divergence_probability(r_goe, "goe", [0.5])
    assert p[0] == 0
    # definition: divergent iff sqrt(V) rho >= 1, V = V_c (1 - delta); binomial SE
    d = 1e-3
    p, se = ex.divergence_probability(r_goe, "goe", [d])
    frac = np.mean(np.sqrt(0.25 * (1 - d)) * r_goe >= 1)
    assert p[0] == frac and se[0] == pytest.approx(math.sqrt(frac * (1 - frac) / r_goe.size))


@pytest.mark.parametrize("e", ENS)
def test_ntk_against_finite_width(e):
    V = 0.5 * th.critical_variance(e)
    per = {n: ex.ntk_samples(e, jax.random.PRNGKey(300 + n), n, V, 40) for n in (48, 96)}
    for key in ("diag", "off"):
        est, se = richardson({n: t[key] for n, t in per.items()})
        ok, msg = within(est, se, th.ntk(e, V))
        assert ok, f"ntk {e} {key}: {msg}"


@pytest.mark.slow
@pytest.mark.parametrize("e", ["orthogonal", "goe"])
def test_ntk_fluctuation_against_finite_width(e):
    # N Var/E^2 of the NTK diagonal from 100 groups of 80 matrices at N and 2N; the SE of the
    # extrapolated value comes from the spread across groups (about 0.35 here, so Z * SE is
    # below 2, the size of the -2 term: a formula without it fails). Ginibre is left out: its finite-N
    # estimates are dominated by rare near-singular I - W (heavy tails, see chapter 1 page 4).
    V = 0.4 * th.critical_variance(e)
    groups, per_group = 100, 80
    per = {}
    for n in (32, 64):
        d = ex.ntk_samples(e, jax.random.PRNGKey(400 + n), n, V, groups * per_group)["diag"]
        d = d.reshape(groups, per_group)
        per[n] = n * d.var(axis=1, ddof=1) / d.mean(axis=1) ** 2
    est, se = richardson(per)
    ok, msg = within(est, se, th.ntk_fluctuation(e, V))
    assert ok, f"ntk fluctuation {e}: {msg}"
    assert th.ntk_fluctuation(e, 0.0) == pytest.approx(2.0, abs=1e-12)  # N Var[v . v] = 2


def test_ensemble_names_come_from_the_registry():
    # theory.linear covers the registry's ensembles except the antisymmetric one (not in 001);
    # unknown and uncovered names are refused with the list of valid ones.
    assert set(th.ENSEMBLES) == set(ensembles.ENSEMBLES) - {"antisymmetric"}
    with pytest.raises(ValueError, match=r"second_moment: `ensemble` must be one of 'gaussian', 'orthogonal', 'goe', 'antisymmetric', got 'cauchy'"):
        th.second_moment("cauchy", 0.1)
    for call in (lambda: ex.draw("antisymmetric", jax.random.key(0), 4),
                 lambda: ex.spectral_radii("ginibre", jax.random.key(0), 4, 2),
                 lambda: ex.trace_sweep("unitary", np.eye(3), [0.1])):
        with pytest.raises(ValueError, match=r"experiments\.linear\.\w+: `ensemble` must be one of"):
            call()


@pytest.mark.parametrize("call", [
    lambda: ex.draw("goe", 0, 4),
    lambda: ex.untied_traces("goe", 1, 4, 0.1, 2),
    lambda: ex.length_variance_sample(np.eye(3), 2, 10),
    lambda: ex.iterate("goe", 3, 4, 0.1, 2),
    lambda: ex.spectral_radii("goe", 4, 4, 2),
    lambda: ex.ntk_samples("goe", 5, 4, 0.1, 2),
], ids=["draw", "untied_traces", "length_variance_sample", "iterate", "spectral_radii", "ntk_samples"])
def test_experiments_refuse_an_int_seed(call):
    with pytest.raises(ValueError, match=r"experiments\.linear\.\w+: `key` must be a JAX PRNG key .*not an int seed"):
        call()
