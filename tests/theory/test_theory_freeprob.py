"""Tests of deqlab.theory.freeprob against closed forms and simulated random matrices.

Tolerances:
- Kolmogorov-Smirnov distances use the Dvoretzky-Kiefer-Wolfowitz bound for ``n`` samples at
  level ``alpha = 1e-6``, ``sqrt(log(2 / alpha) / (2 n))`` with ``n`` the number of sampled
  eigenvalues (eigenvalues of one matrix are more rigid than i.i.d. draws, so this is
  conservative for the fluctuation), plus ``1 / N`` for the finite-size bias of the empirical
  spectral distribution of an ``N x N`` matrix.
- Sampled means: 5 standard errors estimated from the per-matrix values, plus an ``O(1/N)``
  finite-size allowance where stated.
- Quadrature of densities on grids: the grid error, estimated by halving the grid.
"""

import math

import jax
import numpy as np
import pytest

from deqlab import nonlinearities
from deqlab.lab import stats
from deqlab.lab.experiments import freeprob as ex
from deqlab.theory import freeprob as fp

# Theory checks: closed forms and limits to ~1e-10, float64 by convention (tests/conftest.py).
pytestmark = pytest.mark.float64

ALPHA = 1e-6


def dkw(n_samples: int, n: int) -> float:
    return stats.spectral_ks_bound(n_samples, n, ALPHA)


def key(i):
    return jax.random.PRNGKey(i)


# ------------------------------------------------------------------------------- transforms


def spectra():
    return [
        fp.Semicircle(0.3),
        fp.MarchenkoPastur(1.7),
        fp.Bernoulli(0.4),
        fp.ScaledIdentity(2.0),
        fp.PointMasses([0.5, 1.0, 3.0], [0.2, 0.3, 0.5]),
        fp.FreeProduct(fp.Bernoulli(0.6), fp.MarchenkoPastur(1.5)),
        fp.DWSpectrum(fp.slope_spectrum("erf", 0.8, 64), 0.2),
        fp.BernoulliLimit(0.25),
        fp.SmoothLimit(0.25),
    ]


@pytest.mark.parametrize("spec", spectra(), ids=lambda s: type(s).__name__)
def test_stieltjes_asymptotics_and_branch(spec):
    # G(z) = 1/z + m1/z^2 + O(m2/|z|^3)  (002 Eq. 9) and Im G < 0 above the real axis (Eq. 8).
    m1, m2 = spec.moment(1), spec.moment(2)
    z = np.array([1e4j, 1e4 + 10j, -1e4 + 1j, 3e3 * np.exp(0.7j)])
    g = spec.stieltjes(z)
    assert np.all(np.abs(z * g - 1 - m1 / z) <= 2 * m2 / np.abs(z) ** 2 + 1e-12)
    xs = np.linspace(-3, 6, 13)
    for eps in (1e-3, 0.3, 5.0):
        assert np.all(spec.stieltjes(xs + 1j * eps).imag < 0)
    # conjugate symmetry G(conj z) = conj G(z)
    assert np.allclose(spec.stieltjes(np.conj(z)), np.conj(g), rtol=1e-10, atol=1e-14)


def test_s_transform_generic_matches_closed_forms():
    # Newton inversion of M (002 Eq. 11) against closed forms: Bernoulli (001 Eq. 114) and MP.
    w = np.array([0.05, 0.2, 0.5 + 0.1j, 0.3 - 0.2j])
    bern = fp.Bernoulli(0.3)
    generic = fp.PointMasses([0.0, 1.0], [0.7, 0.3])
    assert np.allclose(generic.s_transform(w), bern.s_transform(w), rtol=1e-10)
    mp = fp.MarchenkoPastur(0.8)
    assert np.allclose(fp.Spectrum.mgf_inverse(mp, w), mp.mgf_inverse(w), rtol=1e-10)
    assert np.allclose(fp.Spectrum.s_transform(mp, w), 1 / (0.8 * (1 + w)), rtol=1e-10)
    # M(M^{-1}(w)) = w
    assert np.allclose(mp.mgf(mp.mgf_inverse(w)), w, rtol=1e-12)


def test_semicircle_s_transform_branch():
    # m1 = 0: the generic Newton start does not exist; the closed form takes the principal branch.
    # M(M^{-1}(w)) = w holds on it for |w| < 1 (there |G| = sqrt(|w| / V) is the root of
    # V G^2 - z G + 1 = 0 that decays at infinity); S = (1 + w) / (w M^{-1}(w)) (002 Eq. 11).
    sc = fp.Semicircle(0.7)
    w = np.array([0.05, 0.2, 0.5 + 0.1j, 0.3 - 0.2j, -0.4 + 0.3j])
    z = sc.mgf_inverse(w)
    assert np.allclose(sc.mgf(z), w, rtol=1e-12)
    assert np.all(z[:2].real > 0)  # M^{-1}(w) -> +inf as w -> 0+
    assert np.allclose(sc.s_transform(w), (1 + w) / (w * z), rtol=1e-12)
    # The same branch from the empirical transform of a large GOE sample (Newton started there).
    n = 1500
    a = np.random.default_rng(0).normal(size=(n, n)) * np.sqrt(0.7 / n)
    empirical = fp.samples(np.linalg.eigvalsh((a + a.T) / np.sqrt(2)))
    z_emp = empirical.mgf_inverse(w[:2], z0=z[:2])
    # m2 of N = 1500 eigenvalues deviates by O(1/N) and fluctuates by O(1/N): 1e-3 seen over seeds.
    assert np.allclose(z_emp, z[:2], rtol=1e-2)


def test_semicircle_and_mp_against_samples():
    n, k = 200, 4
    goe = np.concatenate([np.linalg.eigvalsh(np.asarray(
        __import__("deqlab").ensembles.sample("goe", kk, n, math.sqrt(0.3)), np.float64))
        for kk in jax.random.split(key(0), k)])
    sc = fp.Semicircle(0.3)
    x = np.linspace(-sc.radius, sc.radius, 2001)
    assert stats.kolmogorov_distance(goe, x, sc.density(x)) < dkw(n * k, n)
    # the density from -Im G / pi at small eps matches the closed form in the bulk
    xb = np.linspace(-0.9, 0.9, 7) * sc.radius
    assert np.allclose(fp.Spectrum.density(sc, xb, 1e-9), sc.density(xb), atol=1e-6)
    mp = fp.MarchenkoPastur(1.5)
    wtw = ex.masked_wishart_eigs(key(1), 1.0, 1.5, n, k)
    x = np.linspace(0, 6, 4001)
    assert stats.kolmogorov_distance(wtw, x, mp.density(x)) < dkw(n * k, n)
    assert mp.moment(2) == pytest.approx(2 * 1.5**2)


def test_free_product_against_masked_wishart():
    # Bernoulli(p) ⊠ MP(s) (002 Eq. 12) against D W^T W D.
    p, s, n, k = 0.6, 1.5, 200, 4
    prod = fp.FreeProduct(fp.Bernoulli(p), fp.MarchenkoPastur(s))
    lam = np.linspace(1e-4, 4 * s * 1.6, 1500)
    rho = prod.continuous_density(lam, 1e-9)
    mass, m1, m2 = stats.mass_and_moments(lam, rho, prod.atoms)
    # free moments: m1 = p s, m2 = m2(a) m1(b)^2 + m1(a)^2 m2(b) - m1(a)^2 m1(b)^2
    assert mass == pytest.approx(1, abs=2e-3)  # grid error: sqrt edges on a 1500-point grid
    assert m1 == pytest.approx(p * s, rel=2e-3)
    assert m2 == pytest.approx(p * s**2 + p**2 * s**2, rel=2e-3)
    eigs = ex.masked_wishart_eigs(key(2), p, s, n, k)
    assert stats.kolmogorov_distance(eigs, lam, rho, prod.atoms, lower=1e-3) < dkw(n * k, n)


# -------------------------------------------------------------------- nonlinearities, moments


@pytest.mark.parametrize("nl", fp.NONLINEARITIES)
def test_slope_moments_against_samples(nl):
    q = 0.7
    mu = fp.slope_moments(nl, q, 2)
    d = ex.slope_samples(key(3), nl, q, 200_000)
    for k, m in enumerate(mu, start=1):
        x = d ** (2 * k)
        assert abs(x.mean() - m) <= 5 * x.std() / math.sqrt(x.size) + 1e-12


@pytest.mark.parametrize("nl", fp.NONLINEARITIES)
def test_critical_point_is_fixed_point(nl):
    # 002 Eq. 4-5: sigma_w2 mu_1 = 1 and q* = sigma_w2 E[phi^2] + sigma_b2 (checked by
    # Gauss-Hermite quadrature, independent of the adaptive quadrature used inside).
    q = 0.4
    sw2, sb2 = fp.critical_point(nl, q)
    assert sw2 * fp.slope_moments(nl, q, 1)[0] == pytest.approx(1, rel=1e-12)
    u, w = np.polynomial.hermite_e.hermegauss(150)
    w = w / w.sum()
    e_phi2 = np.sum(w * nonlinearities.get(nl).numpy(math.sqrt(q) * u) ** 2)
    assert sw2 * e_phi2 + sb2 == pytest.approx(q, rel=2e-3)  # GH error on kinks
    if nl in ("linear", "relu"):
        assert (sw2, sb2) == ({"linear": 1.0, "relu": 2.0}[nl], 0.0)


def test_table1_variances():
    # 002 Table 1 / Eq. 22 in closed form.
    L, q = 16, 0.3
    var = lambda nl, w: (lambda m: m[1] - m[0] ** 2)(fp.jacobian_moments(nl, w, L, q))
    assert var("linear", "orthogonal") == pytest.approx(0, abs=1e-12)
    assert var("linear", "gaussian") == pytest.approx(L)
    assert var("relu", "orthogonal") == pytest.approx(L)
    assert var("relu", "gaussian") == pytest.approx(2 * L)
    p = math.erf(1 / math.sqrt(2 * q))
    assert var("hard_tanh", "orthogonal") == pytest.approx(L * (1 / p - 1))
    assert var("hard_tanh", "gaussian") == pytest.approx(L / p)
    assert var("erf", "orthogonal") == pytest.approx(L * ((1 + math.pi * q) / math.sqrt(1 + 2 * math.pi * q) - 1))
    # off the critical line m1 = chi^L
    m1, _ = fp.jacobian_moments("relu", "gaussian", 5, 1.0, sigma_w2=2.2)
    assert m1 == pytest.approx(1.1**5)


# --------------------------------------------------------------------- master equation (Alg. 1)

CASES = [
    ("linear", "gaussian", 4, 1.0),
    ("relu", "orthogonal", 4, 1.0),
    ("relu", "gaussian", 2, 1.0),
    ("hard_tanh", "orthogonal", 8, 0.3),
    ("erf", "orthogonal", 4, 0.5),
]


def _grid(hi):
    return np.concatenate([np.geomspace(1e-10, 1.0, 250, endpoint=False), np.linspace(1.0, hi, 550)])


@pytest.mark.parametrize("nl,weights,L,q", CASES)
def test_master_equation_density(nl, weights, L, q):
    n, k = 200, 3
    m1, m2 = fp.jacobian_moments(nl, weights, L, q)
    hi = 1.0 + 12 * math.sqrt(m2)
    lam = _grid(hi)
    res = fp.jacobian_density(nl, weights, L, q, lam, n_nodes=64, ratio=1.25, eps=1e-9)
    assert np.all(res.density >= -1e-8)
    mass, mm1, mm2 = stats.mass_and_moments(lam, res.density, res.atoms)
    # the grid misses the mass below 1e-10 and the tail above `hi` (bounded by m2/hi^2 for
    # the mean); 2e-2 covers both for these depths (checked by the density's own moments).
    assert mass == pytest.approx(1, abs=2e-2)
    assert mm1 == pytest.approx(m1, abs=2e-2)
    assert mm2 == pytest.approx(m2, rel=3e-2)
    eigs, q_mean = ex.jacobian_eigs(key(4), nl, weights, [L], q, n, n_networks=k)
    assert stats.kolmogorov_distance(eigs[L], lam, res.density, res.atoms, lower=1e-8) < dkw(n * k, n)


def test_master_equation_linear_gaussian_one_layer_is_mp():
    lam = np.linspace(0.05, 3.9, 50)
    res = fp.jacobian_density("linear", "gaussian", 1, 1.0, lam, eps=1e-10)
    assert np.allclose(res.density, fp.MarchenkoPastur(1.0).density(lam), atol=1e-6)


def test_linear_orthogonal_is_an_atom():
    res = fp.jacobian_density("linear", "orthogonal", 7, 1.0, np.linspace(0.1, 2, 5), sigma_w2=1.1)
    assert res.atoms == ((1.1**7, 1.0),) or np.allclose(res.atoms, ((1.1**7, 1.0),))
    assert np.all(res.density == 0)


# ------------------------------------------------------------------------------ universality


def test_bernoulli_limit():
    s0 = 0.25
    lim = fp.BernoulliLimit(s0)
    assert lim.edge == pytest.approx(s0 * math.e)
    assert math.sqrt(lim.edge) == pytest.approx(0.82, abs=5e-3)  # 002 §5: sqrt(lambda_1)
    (loc, mass), = lim.atoms
    assert math.sqrt(loc) == pytest.approx(1.13, abs=5e-3)  # e^{1/8}
    # atom mass from the residue of G at lambda_2 (Eq. 34)
    d = 1e-7
    assert (1j * d * lim.stieltjes(loc + 1j * d)).real == pytest.approx(mass, rel=1e-5)
    # mass and moments: s = -log(lambda) grid plus the leading small-lambda tail
    # log grid for the 1/(lambda log^2 lambda) divergence at 0, linear grid for the sqrt edge
    x = np.concatenate([np.exp(-np.linspace(400, 5, 20000, endpoint=False)),
                        np.linspace(math.exp(-5), lim.edge, 20001)])
    rho = lim.density(x)
    tail = lim.small_lambda_mass(s0, x[0])
    tot, m1, m2 = stats.mass_and_moments(x, rho, lim.atoms)
    assert tot + tail == pytest.approx(1, abs=1e-4)
    assert m1 == pytest.approx(1, abs=1e-5)
    assert m2 == pytest.approx(1 + s0, abs=1e-5)
    assert np.all(lim.density(np.array([lim.edge * 1.001, 2.0])) == 0)
    assert lim.density(np.array([lim.edge * 0.99]))[0] > 0
    # the finite-L S-transform tends to the limit (Eq. 28-29)
    w = np.array([0.3, 1.0 + 0.5j])
    L = 10**6
    finite = (1 + s0 * w / (L * (1 + w))) ** (-L)
    assert np.allclose(finite, lim.s_transform(w), rtol=1e-6)


def test_smooth_limit_edges_and_moments():
    s0 = 0.25
    lim = fp.SmoothLimit(s0)
    lo, hi = lim.edges
    assert math.sqrt(lo) == pytest.approx(0.57, abs=5e-3)
    assert math.sqrt(hi) == pytest.approx(1.56, abs=5e-3)
    x = np.linspace(lo, hi, 1200)
    rho = lim.density(x, 1e-10)
    tot, m1, m2 = stats.mass_and_moments(x, rho)
    assert tot == pytest.approx(1, abs=2e-3)
    assert m1 == pytest.approx(1, abs=2e-3)
    assert m2 == pytest.approx(1 + s0, abs=3e-3)
    out = lim.density(np.array([lo * 0.95, hi * 1.05]), 1e-10)
    assert np.all(out < 1e-6)


@pytest.mark.parametrize("nl,limit", [("hard_tanh", fp.BernoulliLimit), ("shifted_relu", fp.BernoulliLimit),
                                      ("erf", fp.SmoothLimit)])
def test_finite_depth_converges_to_limit(nl, limit):
    s0 = 0.25
    lim = limit(s0)
    x = np.linspace(0.3, 1.6, 300)
    ref = lim.continuous_density(x, 1e-9)
    dist = []
    for L in (8, 64, 512):
        q = fp.double_scaling_q_star(nl, L, s0)
        m1, m2 = fp.jacobian_moments(nl, "orthogonal", L, q)
        assert m2 - m1**2 == pytest.approx(s0, rel=1e-9)
        res = fp.jacobian_density(nl, "orthogonal", L, q, x, n_nodes=96, ratio=1.25, eps=1e-9)
        dist.append(np.trapezoid(np.abs(res.density - ref), x) if hasattr(np, "trapezoid")
                    else np.trapz(np.abs(res.density - ref), x))
    assert dist[0] > dist[1] > dist[2]


def test_gaussian_weights_have_no_limit():
    # 002 §5: at the double-scaling q*(L) that holds orthogonal-weight spectra at variance
    # sigma0^2 = 1/4, Gaussian weights add the Marchenko-Pastur spread of every layer: the
    # predicted variance is L + 1/4 (m1 = 1), growing without limit. Checked on simulated width-200
    # networks: the spread of the per-network eigenvalue variance gives the standard error (8
    # networks; the heavy right tail at L = 16 makes it large), bound 4 standard errors plus 2% for
    # the O(L / N) finite-width bias.
    for weights, depth in (("gaussian", 4), ("gaussian", 16), ("orthogonal", 16)):
        q = fp.double_scaling_q_star("hard_tanh", depth, 0.25)
        m1, m2 = fp.jacobian_moments("hard_tanh", weights, depth, q)
        predicted = m2 - m1**2
        assert predicted == pytest.approx(depth + 0.25 if weights == "gaussian" else 0.25, rel=1e-9)
        eigs, _ = ex.double_scaling_eigs(jax.random.PRNGKey(depth), "hard_tanh", weights, [depth], 0.25, 200, 8)
        per_network = np.asarray(eigs[depth]).reshape(8, -1).var(axis=1)
        se = per_network.std(ddof=1) / np.sqrt(per_network.size)
        assert abs(per_network.mean() - predicted) <= 4 * se + 0.02 * predicted, (weights, depth)


# ----------------------------------------------------------------------------- 001 App. C


def test_dw_bernoulli_closed_form():
    # 001 Eq. 124: atom 1 - p at 0 plus a semicircle of radius 2 sqrt(V p).
    p, v = 0.7, 0.2
    dw = fp.DWSpectrum(fp.Bernoulli(p), v)
    z = np.array([1 + 0.3j, -0.5 + 0.01j, 0.1 + 0.001j, 3j])
    r = 2 * math.sqrt(v * p)
    ref = (1 - p) / z + (z - np.sqrt(z - r) * np.sqrt(z + r)) / (2 * v)
    assert np.allclose(dw.stieltjes(z), ref, rtol=1e-9)


def test_dw_erf_against_simulation():
    q, v, n, k = 0.8, 0.2, 200, 3
    dw = fp.DWSpectrum(fp.slope_spectrum("erf", q, 96), v)
    x = np.linspace(-1.6, 1.6, 1200)
    rho = dw.continuous_density(x, 1e-9)
    tot, m1, m2 = stats.mass_and_moments(x, rho)
    assert tot == pytest.approx(1, abs=3e-3)
    assert m1 == pytest.approx(0, abs=1e-6)  # symmetric spectrum
    assert m2 == pytest.approx(dw.moment(2), rel=5e-3)
    eigs = ex.dw_eigs(key(5), "erf", q, v, n, k)
    assert stats.kolmogorov_distance(eigs, x, rho) < dkw(n * k, n)


def test_pencil_goe_quadratic():
    v = 0.15
    z = np.array([3 + 1j, -2 + 0.5j, 10 + 0.1j, 0.5 + 2j])
    res = fp.pencil_cauchy(fp.goe_resolvent_pencil(v), z)
    assert np.all(res.converged)
    m = z * res.g[:, 0, 0] - 1
    assert np.allclose(m, fp.goe_resolvent_mgf(z, v), rtol=1e-10)
    assert np.allclose(v * z**2 * m**2 - (z - 1) * m + 1, 0, atol=1e-10)  # 001 Eq. 138


@pytest.mark.parametrize("ensemble,v", [("gaussian", 0.5), ("goe", 0.15)])
def test_length_pencil_moments(ensemble, v):
    pencil = fp.length_pencil(ensemble, v)
    z = np.array([40 + 1j, -3 + 2j, 5j])
    res = fp.pencil_cauchy(pencil, z)
    if ensemble == "gaussian":
        assert np.allclose(fp.ginibre_length_cubic(z * res.g[:, 0, 0] - 1, z, v), 0, atol=1e-10)
    m = fp.pencil_moments(pencil, 2, radius=80.0)
    m2_closed = fp.ginibre_length_m2(v) if ensemble == "gaussian" else fp.goe_length_m2(v)
    m1_closed = 1 / (1 - v) if ensemble == "gaussian" else _goe_m1(v)
    assert m[0] == pytest.approx(m1_closed, rel=1e-9)
    assert m[1] == pytest.approx(m2_closed, rel=1e-9)
    # simulation: 5 standard errors plus an O(1/N) finite-size allowance relative to m2
    n, k = 150, 6
    tr = ex.length_traces(key(6), ensemble, v, n, k)
    for name, pred in (("tr1", m[0]), ("tr2", m[1])):
        x = tr[name]
        assert abs(x.mean() - pred) <= 5 * x.std(ddof=1) / math.sqrt(k) + 10 * pred / n


def _goe_m1(v):
    # tr (I - W)^-2 = sum_k (k + 1) m_k(W), semicircle moments (001 App. C.2.1)
    return sum((2 * j + 1) * fp.Semicircle(v).moment(2 * j) for j in range(200))


def test_pencil_nonconvergence_is_reported():
    with pytest.raises(fp.ConvergenceError):
        fp.pencil_cauchy(fp.length_pencil("gaussian", 0.5), np.array([2 + 1j]), max_iter=2)
    res = fp.pencil_cauchy(fp.length_pencil("gaussian", 0.5), np.array([2 + 1j]), max_iter=2, check=False)
    assert not res.converged[0]


# ------------------------------------------------------------------------------ validation


def test_bad_inputs():
    with pytest.raises(ValueError, match="nonlinearity"):
        fp.jacobian_moments("tanh", "orthogonal", 3, 1.0)
    with pytest.raises(ValueError, match="weights"):
        fp.jacobian_moments("relu", "goe", 3, 1.0)
    with pytest.raises(ValueError, match="depth"):
        fp.jacobian_density("relu", "orthogonal", 2.5, 1.0, [1.0])
    with pytest.raises(ValueError, match="sigma_w2"):
        fp.jacobian_moments("relu", "orthogonal", 3, 1.0, sigma_w2=0.0)
    with pytest.raises(ValueError, match="sigma_w2"):
        fp.jacobian_density("relu", "orthogonal", 3, 1.0, [1.0], sigma_w2=-1.0)
    with pytest.raises(ValueError, match="q_star"):
        fp.critical_point("erf", -0.1)
    with pytest.raises(ValueError, match="eps"):
        fp.jacobian_density("relu", "orthogonal", 3, 1.0, [1.0], eps=0.0)
    with pytest.raises(ValueError, match="support"):
        fp.Semicircle(1.0).stieltjes(np.array([0.5 + 0j]))
    with pytest.raises(ValueError, match="real axis"):
        fp.SmoothLimit(0.25).stieltjes(np.array([1.0 + 0j]))
    with pytest.raises(ValueError, match="eps"):
        fp.SmoothLimit(0.25).density(np.array([1.0]), 0.0)
    with pytest.raises(ValueError, match="double-scaling"):
        fp.double_scaling_q_star("relu", 8, 0.25)
    # real z outside the support is fine
    assert np.isfinite(fp.Semicircle(1.0).stieltjes(np.array([3.0 + 0j]))).all()


def test_root_following_reports_failure():
    # an equation with no root: |x|^2 + 1 >= 1 never vanishes
    with pytest.raises(fp.ConvergenceError):
        fp.follow_roots(lambda x, z: x * np.conj(x) + 1, lambda z: 1 / z, np.array([1.0]), 1e-3, max_newton=5)


def test_root_following_skips_the_argument_checks_only_inside_and_changes_no_number(monkeypatch):
    # follow_roots evaluates transforms at its own iterates without the spectral-variable checks
    # (transforms._CHECKING); the densities must be those computed with every check run, bit for bit,
    # and the checks must be back on afterwards, also when f raises inside the walk
    from deqlab.theory.freeprob import spectra, transforms

    def densities():
        lam = np.geomspace(0.05, 4.0, 7)
        return [fp.jacobian_density("erf", "gaussian", depth=2, q_star=0.5, lam=lam).density,
                fp.jacobian_density("hard_tanh", "orthogonal", depth=3, q_star=1.0, lam=lam).density,
                fp.Bernoulli(0.4).stieltjes(np.array([0.3 + 1e-3j]))]

    skipped = densities()

    class AlwaysChecking:  # a stand-in for the context variable that keeps every check on
        def get(self):
            return True

        def set(self, value):
            return None

        def reset(self, token):
            pass

    with monkeypatch.context() as m:
        m.setattr(transforms, "_CHECKING", AlwaysChecking())
        m.setattr(spectra, "_CHECKING", AlwaysChecking())
        checked = densities()
    for a, b in zip(skipped, checked):
        np.testing.assert_array_equal(a, b)

    def raising(x, z):
        raise RuntimeError("inside the walk")

    with pytest.raises(RuntimeError, match="inside the walk"):
        fp.follow_roots(raising, lambda z: 1 / z, np.array([1.0]), 1e-3)
    assert transforms._CHECKING.get()
    with pytest.raises(ValueError, match="off the support"):
        fp.Semicircle(1.0).stieltjes(np.array([0.5 + 0j]))  # on the cut: refused again


# ------------------------------------------- 001 App. C, chapter 2 page 4 (equilibrium networks)


def test_dw_hard_tanh_atom_and_semicircle_against_simulation():
    # 001 Eq. 124: D = diag(phi'(h)) is Bernoulli(p) for hard tanh, p = P(|h| < 1); DW has an
    # atom 1 - p at 0 plus p times a semicircle of radius 2 sqrt(V p).
    q, v, n, k = 1.0, 0.3, 200, 3
    p = fp.bernoulli_p("hard_tanh", q)
    assert p == pytest.approx(math.erf(1 / math.sqrt(2)))
    dw = fp.DWSpectrum(fp.slope_spectrum("hard_tanh", q), v)
    assert dw.atoms == ((0.0, pytest.approx(1 - p)),)
    r = 2 * math.sqrt(v * p)
    x = np.linspace(-r, r, 2001)
    rho = dw.continuous_density(x, 1e-10)
    semicircle = p * fp.Semicircle(v * p).density(x)
    assert np.max(np.abs(rho - semicircle)) <= 1e-4 * np.max(semicircle)
    mass, m1, m2 = stats.mass_and_moments(x, rho, dw.atoms)
    assert mass == pytest.approx(1, abs=1e-4)  # sqrt edges on a 2001-point grid
    assert m1 == pytest.approx(0, abs=1e-9)
    assert m2 == pytest.approx(dw.moment(2), rel=1e-3)
    assert dw.moment(2) == pytest.approx(v * p**2)  # V m1(D)^2
    eigs = ex.dw_eigs(key(7), "hard_tanh", q, v, n, k)
    assert stats.kolmogorov_distance(eigs, x, rho, dw.atoms) < dkw(n * k, n)
    # the atom itself: the fraction of (numerically) zero eigenvalues is Binomial(n k, 1 - p)
    zero = np.mean(np.abs(eigs) < 1e-8)
    assert abs(zero - (1 - p)) <= 5 * math.sqrt(p * (1 - p) / (n * k))


@pytest.mark.parametrize("ensemble,v", [("goe", 0.15), ("gaussian", 0.5)])
def test_length_pencil_density_against_simulation(ensemble, v):
    # -Im G_11(x + i eps) / pi of the 3x3 pencil (001 Eq. 154-158) is the density of
    # A = (I - W)^-T (I - W)^-1: mass 1, moments tr M^T M and tr (M^T M)^2 of chapter 1, and the
    # eigenvalues 1 / s_i(I - W)^2 of sampled matrices. eps = 1e-4 x biases the moments by
    # about 1e-4 relative; the log grid of 300 points adds about 1e-3.
    from deqlab.theory import linear as tl

    lo, hi = fp.length_spectrum_edges(ensemble, v)
    lam = np.geomspace(lo, hi, 300)
    res = fp.pencil_cauchy(fp.length_pencil(ensemble, v), lam + 1e-4j * lam, tol=1e-10,
                           max_iter=5000, check=False)
    assert res.converged.mean() >= 0.98  # slow convergence only at the square-root edges
    rho = -res.g[:, 0, 0].imag / np.pi
    mass, m1, m2 = stats.mass_and_moments(lam, rho)
    assert mass == pytest.approx(1, abs=3e-3)
    assert m1 == pytest.approx(tl.gram_trace(ensemble, v, 1), rel=3e-3)
    assert m2 == pytest.approx(tl.gram_trace(ensemble, v, 2), rel=5e-3)
    # outside the edges the density vanishes (the pencil converges fast there)
    out = fp.pencil_cauchy(fp.length_pencil(ensemble, v), np.array([0.9 * lo, 1.1 * hi]) + 1e-6j)
    assert np.all(-out.g[:, 0, 0].imag / np.pi < 1e-4)
    if ensemble == "goe":  # change of variables from the semicircle: w = 1 - lam^(-1/2)
        ref = fp.Semicircle(v).density(1 - lam**-0.5) * 0.5 * lam**-1.5
        bulk = (lam > 1.05 * lo) & (lam < 0.95 * hi)
        assert np.max(np.abs(rho - ref)[bulk]) <= 2e-3 * np.max(ref)
    n, k = 200, 3
    eigs = []
    from deqlab import ensembles

    for kk in jax.random.split(key(8), k):
        w = np.asarray(ensembles.sample(ensemble, kk, n, math.sqrt(v)), np.float64)
        eigs.append(1 / np.linalg.svd(np.eye(n) - w, compute_uv=False) ** 2)
    assert stats.kolmogorov_distance(np.concatenate(eigs), lam, rho) < dkw(n * k, n)


@pytest.mark.parametrize("ensemble,vs", [("goe", (0.05, 0.2, 0.24)), ("gaussian", (0.1, 0.5, 0.95))])
def test_length_pencil_moments_match_chapter1(ensemble, vs):
    # The contour of pencil_moments must enclose the support: radius 3 hi. The moments equal
    # theory.linear.gram_trace (powers 1 and 2) up to the trapezoid and fixed-point errors.
    from deqlab.theory import linear as tl

    for v in vs:
        lo, hi = fp.length_spectrum_edges(ensemble, v)
        m = fp.pencil_moments(fp.length_pencil(ensemble, v), 2, radius=3 * hi, tol=1e-12)
        assert m[0] == pytest.approx(tl.gram_trace(ensemble, v, 1), rel=1e-8)
        assert m[1] == pytest.approx(tl.gram_trace(ensemble, v, 2), rel=1e-8)
        assert 2 * m[1] == pytest.approx(tl.length_variance(ensemble, v), rel=1e-8)
    # a contour that cuts the support gives wrong moments although every point converges
    v = vs[-1]
    lo, hi = fp.length_spectrum_edges(ensemble, v)
    m = fp.pencil_moments(fp.length_pencil(ensemble, v), 2, radius=0.5 * hi, tol=1e-12)
    assert abs(m[1] / tl.gram_trace(ensemble, v, 2) - 1) > 1e-2


def test_length_spectrum_edges():
    lo, hi = fp.length_spectrum_edges("goe", 0.16)
    assert (lo, hi) == (pytest.approx(1 / 1.8**2), pytest.approx(1 / 0.2**2))
    for v in (0.1, 0.5, 0.9):
        lo, hi = fp.length_spectrum_edges("gaussian", v)
        # the cubic (001 Eq. 188) has a double root M at both edges
        for e in (lo, hi):
            m = np.roots([v**2 * e**2, 2 * v * e, (v - 1) * e + 1, 1])
            gaps = np.abs(m[:, None] - m[None, :]) + np.eye(3)
            assert gaps.min() < 1e-5 * (1 + np.abs(m).max())
        assert 0 < lo < 1 / (1 - v) < hi
    # V -> 0: A -> I
    lo, hi = fp.length_spectrum_edges("gaussian", 1e-6)
    assert lo == pytest.approx(1, abs=1e-2) and hi == pytest.approx(1, abs=1e-2)
    for args in (("goe", 0.25), ("gaussian", 1.0), ("gaussian", 0.0), ("orthogonal", 0.5)):
        with pytest.raises(ValueError):
            fp.length_spectrum_edges(*args)


# ------------------------------------------------- domain errors: the argument and its valid range

DOMAIN_ERRORS = [
    # (id, call, regex: where, the argument in backticks, the valid range)
    ("lam-negative", lambda: fp.jacobian_density("erf", "orthogonal", 4, 0.25, [0.5, -1.0]),
     r"jacobian_density: `lam` must be finite real numbers > 0, got -1.0"),
    ("lam-zero", lambda: fp.jacobian_density("relu", "gaussian", 4, 1.0, [0.0]),
     r"`lam` must be finite real numbers > 0, got 0.0"),
    ("lam-nan", lambda: fp.jacobian_density("erf", "orthogonal", 4, 0.25, [np.nan]),
     r"`lam` must be finite real numbers > 0, got nan"),
    ("pencil-goe-above-vc", lambda: fp.length_pencil("goe", 0.3),
     r"length_pencil: `V` must be a finite real number in \(0, V_c\) = \(0, 0.25\) for the 'goe'"),
    ("pencil-ginibre-at-vc", lambda: fp.length_pencil("gaussian", 1.0),
     r"`V` must be .* = \(0, 1\) for the 'gaussian' ensemble"),
    ("pencil-antisymmetric-at-vc", lambda: fp.length_pencil("antisymmetric", 0.25),
     r"`V` must be .* = \(0, 0.25\) for the 'antisymmetric'"),
    ("pencil-zero-variance", lambda: fp.length_pencil("goe", 0.0), r"`V` must be .*\(0, V_c\)"),
    ("edges-above-vc", lambda: fp.length_spectrum_edges("goe", 0.25), r"length_spectrum_edges: `V` must be"),
    ("resolvent-above-vc", lambda: fp.goe_resolvent_mgf(np.array([1 + 1j]), 0.3),
     r"goe_resolvent_mgf: `V` must be .*\(0, 0.25\)"),
    ("m2-above-vc", lambda: fp.goe_length_m2(0.25), r"goe_length_m2: `V` must be"),
    ("kmax-zero", lambda: fp.pencil_moments(fp.length_pencil("goe", 0.1), 0, radius=10.0),
     r"pencil_moments: `kmax` must be an integer >= 1, got 0"),
    ("kmax-negative", lambda: fp.pencil_moments(fp.length_pencil("goe", 0.1), -2, radius=10.0), r"`kmax` must be an integer >= 1"),
    ("kmax-slopes", lambda: fp.slope_moments("silu", 0.5, kmax=0), r"slope_moments: `kmax` must be an integer >= 1"),
    ("n-points-too-few", lambda: fp.pencil_moments(fp.length_pencil("goe", 0.1), 4, radius=10.0, n_points=4),
     r"`n_points` must be an integer >= 5"),
    ("n-nodes-zero", lambda: fp.squared_slope_spectrum("erf", 0.5, n_nodes=0),
     r"squared_slope_spectrum: `n_nodes` must be an integer >= 1, got 0"),
    ("n-nodes-slopes", lambda: fp.slope_spectrum("silu", 0.5, n_nodes=0), r"slope_spectrum: `n_nodes` must be"),
    ("n-nodes-density", lambda: fp.jacobian_density("erf", "orthogonal", 4, 0.25, [1.0], n_nodes=0),
     r"jacobian_density: `n_nodes` must be an integer >= 1"),
    ("z-nan-semicircle", lambda: fp.Semicircle(0.5).stieltjes(np.nan),
     r"Semicircle.stieltjes: `z` must be finite complex numbers"),
    ("z-nan-mp", lambda: fp.MarchenkoPastur(0.5).stieltjes(complex(np.nan, 1.0)), r"`z` must be finite complex"),
    ("z-nan-smooth", lambda: fp.SmoothLimit(0.25).stieltjes(np.array([np.nan + 1j])), r"`z` must be finite"),
    ("z-inf-product", lambda: fp.FreeProduct(fp.Bernoulli(0.5), fp.MarchenkoPastur(1.0)).stieltjes(np.array([np.inf + 1j])),
     r"FreeProduct.stieltjes: `z` must be finite"),
    ("z-nan-pencil", lambda: fp.pencil_cauchy(fp.length_pencil("goe", 0.1), np.array([np.nan])), r"pencil_cauchy: `z` must be finite"),
    ("z-nan-resolvent", lambda: fp.goe_resolvent_mgf(np.array([np.nan + 1j]), 0.1), r"`z` must be finite"),
    ("x-nan-density", lambda: fp.Semicircle(0.5).density(np.array([0.1, np.nan])), r"Semicircle.density: `x` must be finite"),
    ("x-nan-generic-density", lambda: fp.DWSpectrum(fp.Bernoulli(0.5), 0.2).density(np.nan, 1e-3),
     r"DWSpectrum.density: `x` must be finite"),
    ("x-nan-limit", lambda: fp.BernoulliLimit(0.25).density(np.array([np.nan])), r"`x` must be finite real"),
    ("w-nan-s-transform", lambda: fp.samples([1.0, 2.0]).s_transform(np.nan), r"s_transform: `w` must be finite"),
    ("re-z-nan-roots", lambda: fp.follow_roots(lambda x, z: x, lambda z: 1 / z, [np.nan], 1e-3),
     r"follow_roots: `re_z` must be finite real numbers"),
    ("eps-zero-roots", lambda: fp.follow_roots(lambda x, z: x, lambda z: 1 / z, [1.0], 0.0),
     r"follow_roots: `eps` must be finite real numbers > 0"),
    ("locations-nan", lambda: fp.samples([1.0, np.nan]), r"`locations` must be finite real numbers"),
    ("bernoulli-p", lambda: fp.Bernoulli(0.0), r"Bernoulli.__init__: `p` must be a finite real number > 0 and <= 1"),
    ("weights-unknown", lambda: fp.weight_spectrum("goe", 1.0), r"weight_spectrum: `weights` must be one of"),
    ("not-piecewise", lambda: fp.bernoulli_p("erf", 1.0), r"bernoulli_p: `nonlinearity` must be piecewise linear"),
]


@pytest.mark.parametrize("call, pattern", [d[1:] for d in DOMAIN_ERRORS], ids=[d[0] for d in DOMAIN_ERRORS])
def test_domain_errors_name_the_argument_and_range(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()


def test_valid_neighbours_of_the_domain_errors_work():
    # The checks are not stricter than stated: just inside each range the call succeeds.
    assert np.isfinite(fp.length_pencil("goe", 0.2499).cov).all()
    assert np.isfinite(fp.goe_length_m2(0.2499))
    m = fp.pencil_moments(fp.length_pencil("goe", 0.1), 1, radius=10.0, n_points=2)
    assert m.shape == (1,)
    assert len(fp.slope_spectrum("erf", 0.5, n_nodes=1).atoms) == 1
    res = fp.jacobian_density("relu", "orthogonal", 2, 1.0, [1e-12, 1.0])
    assert np.all(np.isfinite(res.density))
    # a real z off the support is allowed, on it refused
    assert np.isfinite(fp.Semicircle(0.5).stieltjes(3.0))


@pytest.mark.parametrize("call", [
    lambda: ex.slope_samples(0, "erf", 1.0, 10),
    lambda: ex.jacobian_eigs(3, "erf", "orthogonal", [2], 1.0, 8),
    lambda: ex.masked_wishart_eigs(1, 0.5, 1.0, 8),
    lambda: ex.dw_eigs(2, "erf", 1.0, 0.2, 8),
    lambda: ex.length_traces(4, "goe", 0.1, 8, 2),
    lambda: ex.double_scaling_eigs(5, "erf", "orthogonal", [2], 0.25, 8),
], ids=["slope_samples", "jacobian_eigs", "masked_wishart_eigs", "dw_eigs", "length_traces",
        "double_scaling_eigs"])
def test_experiments_refuse_an_int_seed(call):
    with pytest.raises(ValueError, match=r"experiments\.freeprob\.\w+: `key` must be a JAX PRNG key .*not an int seed"):
        call()
