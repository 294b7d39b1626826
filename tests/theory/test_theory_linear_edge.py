"""Tests for the finite-``N`` edge laws of deqlab.theory.linear (Tracy-Widom, Gumbel; Chapter 1 p. 4).

Tolerances.

* Tracy-Widom moments are pure numerics (Painleve II integrated at relative tolerance 1e-13,
  moments by adaptive quadrature of the CDF): compared with the published values (Bornemann 2010,
  given here to 13 digits) to ``1e-7``.
* Sampled GOE extremes are compared with the limit laws in Kolmogorov distance. The sampling part
  of the bound is the Dvoretzky-Kiefer-Wolfowitz inequality,
  ``P(sup |F_S - F| > eps) <= 2 exp(-2 S eps^2)``, at ``alpha = 1e-6``. The law is an ``N -> inf``
  limit; the GOE edge converges at rate ``N^{-2/3}`` in the scaled variable, so the finite-``N``
  allowance is ``N^{-2/3}`` times the largest density of the limit law (``< 0.5``).
* Probabilities at fixed ``delta`` use ``Z = 5`` binomial standard errors plus the same allowance.
"""

import math

import jax
import numpy as np
import pytest
import scipy.integrate

from deqlab.lab.experiments import linear as ex
from deqlab.theory import linear as th

# Theory checks: closed forms and limits to ~1e-10, float64 by convention (tests/conftest.py).
pytestmark = pytest.mark.float64

ALPHA = 1e-6
Z = 5.0

# Bornemann, "On the numerical evaluation of distributions in random matrix theory" (2010).
TW_MOMENTS = {1: (-1.2065335745820, 1.607781034581), 2: (-1.7710868074116, 0.8131947928329)}


def dkw(samples: int) -> float:
    return math.sqrt(math.log(2.0 / ALPHA) / (2.0 * samples))


def ks_distance(values: np.ndarray, cdf) -> float:
    x = np.sort(values)
    f = cdf(x)
    k = np.arange(1, x.size + 1)
    return float(max(np.max(k / x.size - f), np.max(f - (k - 1) / x.size)))


@pytest.mark.parametrize("beta", [1, 2])
def test_tracy_widom_moments(beta):
    cdf = lambda s: th.tracy_widom_cdf(s, beta)
    quad = lambda f, a, b: scipy.integrate.quad(f, a, b, limit=200, epsabs=1e-12, epsrel=1e-12)[0]
    # E[X] and E[X^2] from the CDF alone (integration by parts on each half-line).
    mean = quad(lambda s: 1.0 - cdf(s), 0.0, 12.0) - quad(cdf, -12.0, 0.0)
    second = 2.0 * quad(lambda s: s * (1.0 - cdf(s)), 0.0, 12.0) - 2.0 * quad(
        lambda s: s * cdf(s), -12.0, 0.0)
    m, var = TW_MOMENTS[beta]
    assert abs(mean - m) < 1e-7
    assert abs(second - mean**2 - var) < 1e-7


def test_tracy_widom_limits_and_shape():
    s = np.linspace(-11.0, 11.0, 2001)
    for beta in (1, 2):
        f = th.tracy_widom_cdf(s, beta)
        assert np.all(np.diff(f) >= -1e-9)  # monotone, across the ODE / Airy junction at s = 8
        assert f[0] < 1e-20 and 1.0 - f[-1] < 1e-12
        assert th.tracy_widom_cdf(-40.0, beta) == 0.0 and th.tracy_widom_cdf(np.inf, beta) == 1.0
    # The beta = 1 law lies to the right of the beta = 2 law (means -1.21 and -1.77).
    assert th.tracy_widom_cdf(-1.2, 1) < th.tracy_widom_cdf(-1.2, 2)


@pytest.fixture(scope="module")
def goe_extremes():
    """Largest eigenvalue and spectral radius of ``S`` GOE draws at width ``N``."""
    n, samples, batch = 128, 2000, 250
    top, radius = [], []
    for k in jax.random.split(jax.random.key(4), samples // batch):
        lam = np.linalg.eigvalsh(ex.draw("goe", k, n, batch))
        top.append(lam[:, -1])
        radius.append(np.max(np.abs(lam), axis=-1))
    return n, np.concatenate(top), np.concatenate(radius)


@pytest.mark.slow  # the module fixture goe_extremes takes ~6 s
def test_goe_largest_eigenvalue_is_tracy_widom_1(goe_extremes):
    n, top, _ = goe_extremes
    centre, width = th.edge_scaling("goe", n)
    d = ks_distance((top - centre) / width, lambda x: th.tracy_widom_cdf(x, 1))
    bound = dkw(top.size) + 0.5 * n ** (-2.0 / 3.0)
    assert d < bound, (d, bound)
    # The same sample is far from the beta = 2 law: the test can tell the two apart.
    assert ks_distance((top - centre) / width, lambda x: th.tracy_widom_cdf(x, 2)) > bound


@pytest.mark.slow  # goe_extremes
def test_goe_radius_and_failure_probability(goe_extremes):
    n, _, radius = goe_extremes
    centre, width = th.edge_scaling("goe", n)
    d = ks_distance((radius - centre) / width, lambda x: th.tracy_widom_cdf(x, 1) ** 2)
    bound = dkw(radius.size) + 0.5 * n ** (-2.0 / 3.0)
    assert d < bound, (d, bound)
    deltas = np.array([0.005, 0.02, 0.05])
    p_sim, se = ex.divergence_probability(radius, "goe", deltas)
    p_th = th.edge_failure_probability("goe", n, deltas)
    assert np.all(p_th > 0.01) and np.all(p_th < 0.9)
    ok = np.abs(p_sim - p_th) <= Z * np.maximum(se, 1.0 / radius.size) + 0.5 * n ** (-2.0 / 3.0)
    assert np.all(ok), (p_sim, p_th, se)


@pytest.mark.parametrize("ensemble,n", [("goe", 64), ("goe", 5000), ("gaussian", 1000),
                                        ("gaussian", 10**6)])
def test_reliable_delta_inverts_failure_probability(ensemble, n):
    for risk in (0.01, 0.05, 0.2):
        d = th.reliable_delta(ensemble, n, risk)
        assert abs(th.edge_failure_probability(ensemble, n, d) - risk) < 1e-9


def test_reliable_delta_scaling():
    # GOE: delta_risk ~ x_risk N^{-2/3}; the local slope tends to -2/3 at large N.
    d1, d2 = th.reliable_delta("goe", 10**6), th.reliable_delta("goe", 8 * 10**6)
    assert abs(math.log(d2 / d1) / math.log(8.0) + 2.0 / 3.0) < 1e-2
    # Ginibre: delta = 1 - r^-2 ~ 2 (r - 1) with r - 1 = sqrt(g / 4N) (1 + t / g),
    # t = -log(-log(1 - risk)): of order sqrt(log N / N), up to relative O(delta).
    t = -math.log(-math.log(0.95))
    for n in (10**4, 10**6, 10**8):
        g = math.log(n / 2 / (2 * math.pi)) - 2 * math.log(math.log(n / 2))
        lead = 2 * math.sqrt(g / (4 * n)) * (1 + t / g)
        d = th.reliable_delta("gaussian", n)
        assert abs(d / lead - 1) < 2 * d
    assert th.reliable_delta("orthogonal", 10) == 0.0
    np.testing.assert_array_equal(th.edge_failure_probability("orthogonal", 10, [0.1, 0.5]), 0.0)
    assert th.edge_failure_probability("goe", 100, 1.0) == 0.0  # V = 0


def test_ginibre_min_n_is_first_positive_gamma():
    g = lambda n: math.log(n / 2 / (2 * math.pi)) - 2 * math.log(math.log(n / 2))
    assert g(th.GINIBRE_MIN_N) > 0 >= g(th.GINIBRE_MIN_N - 1)
    c, w = th.edge_scaling("gaussian", th.GINIBRE_MIN_N)
    assert c > 1 and w > 0


@pytest.mark.parametrize("call", [
    lambda: th.tracy_widom_cdf(0.0, beta=4),
    lambda: th.tracy_widom_cdf(0.0, beta=True),
    lambda: th.tracy_widom_cdf(np.nan),
    lambda: th.tracy_widom_cdf("x"),
    lambda: th.edge_scaling("orthogonal", 100),
    lambda: th.edge_scaling("gaussian", th.GINIBRE_MIN_N - 1),
    lambda: th.edge_scaling("goe", 1),
    lambda: th.edge_scaling("goe", 10.0),
    lambda: th.edge_scaling("cauchy", 10),
    lambda: th.edge_failure_probability("goe", 100, 0.0),
    lambda: th.edge_failure_probability("goe", 100, [0.1, 1.5]),
    lambda: th.reliable_delta("goe", 100, risk=1.0),
    lambda: th.reliable_delta("goe", 100, risk=0.0),
])
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()
