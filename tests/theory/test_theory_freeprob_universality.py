"""Tests of the double-scaling universality limits of 002 §5 (chapter 2, page 3).

Covers :class:`deqlab.theory.freeprob.BernoulliLimit` and :class:`~deqlab.theory.freeprob.SmoothLimit`
beyond tests/theory/test_theory_freeprob.py: edges and atom measured on the computed densities against
002 Eq. 34-37, the finite-depth atoms and the rate at which finite-depth spectra approach the
limits, every density shown on page 3 against simulated networks, and the spreading with Gaussian
weights. Tolerances follow tests/theory/test_theory_freeprob.py: Kolmogorov-Smirnov distances use the
Dvoretzky-Kiefer-Wolfowitz bound at level 1e-6 plus 1/N; grid errors are stated per test.
"""

import math

import jax
import numpy as np
import pytest

from deqlab.lab import stats
from deqlab.lab.experiments import freeprob as ex
from deqlab.theory import freeprob as fp

# Theory checks: closed forms and limits to ~1e-10, float64 by convention (tests/conftest.py).
pytestmark = pytest.mark.float64

ALPHA = 1e-6
SIGMA0_2 = 0.25  # 002 Figure 4


def dkw(n_samples: int, n: int) -> float:
    return stats.spectral_ks_bound(n_samples, n, ALPHA)


def _grid(hi):
    # log grid for the small eigenvalues, linear grid for the bulk (as in test_theory_freeprob)
    return np.concatenate([np.geomspace(1e-10, 1.0, 250, endpoint=False), np.linspace(1.0, hi, 550)])



def test_limit_edges_and_atom_measured_on_the_densities():
    # 002 Eq. 34-35 (Bernoulli) and 37 (smooth), read off the computed densities with the same
    # two-stage grid as the book: coarse step h, then a fine grid of step 2h/200 around each
    # edge. A measured edge is off by at most one fine step (square-root edges: the 1e-6 floor
    # adds (1e-6 / c)^2, negligible).
    bern, smooth = fp.BernoulliLimit(SIGMA0_2), fp.SmoothLimit(SIGMA0_2)
    for limit, edges in ((bern, (None, bern.edge)), (smooth, smooth.edges)):
        rho = lambda x: limit.continuous_density(x, 1e-10)
        coarse = np.linspace(1e-3, 3.0, 300)
        lo, hi = stats.support_edges(coarse, rho(coarse))
        h = coarse[1] - coarse[0]
        fine_hi = np.linspace(hi - h, hi + h, 201)
        assert stats.support_edges(fine_hi, rho(fine_hi))[1] == pytest.approx(edges[1], abs=2 * h / 200)
        if edges[0] is not None:
            fine_lo = np.linspace(lo - h, lo + h, 201)
            assert stats.support_edges(fine_lo, rho(fine_lo))[0] == pytest.approx(edges[0], abs=2 * h / 200)
    # the paper's two-digit singular values
    assert math.sqrt(bern.edge) == pytest.approx(0.82, abs=5e-3)
    assert [math.sqrt(e) for e in smooth.edges] == pytest.approx([0.57, 1.56], abs=5e-3)
    # the atom: a Lorentzian of height m / (pi eps); the bulk, >= 0.6 away, shifts the measured
    # mass by O(eps) and the location by O(eps^2)
    eps = 1e-6
    loc, mass = stats.locate_atom(bern, bern.edge * 1.05, 3.0, eps=eps)
    assert loc == pytest.approx(math.exp(SIGMA0_2), abs=1e-7)
    assert math.sqrt(loc) == pytest.approx(1.13, abs=5e-3)  # e^{1/8}
    assert mass == pytest.approx(1 - SIGMA0_2, abs=10 * eps)


def test_finite_depth_atoms_approach_the_limit_atom():
    # Bernoulli class: the atom of the directions no mask cuts sits at sigma_w^(2L) = p^-L with
    # mass 1 - L (1 - p), p = L / (L + s0) (002 Eq. 26); L log(1 + s0/L) = s0 - s0^2 / (2L) + ...
    # puts it below exp(s0) by at most exp(s0) s0^2 / (2L); the mass is 1 - s0 + s0^2 / (L + s0).
    s0 = SIGMA0_2
    for nl in ("hard_tanh", "shifted_relu"):
        for L in (2, 8, 128, 8192):
            q = fp.double_scaling_q_star(nl, L, s0)
            (_, zero_mass), (loc, mass) = fp.jacobian_atoms(nl, "orthogonal", L, q)
            assert zero_mass == pytest.approx(s0 / (L + s0), rel=1e-9)
            assert 0 < math.exp(s0) - loc <= math.exp(s0) * s0**2 / (2 * L)
            assert mass == pytest.approx(1 - s0 + s0**2 / (L + s0), rel=1e-9)


@pytest.mark.parametrize("nl,exponent", [("hard_tanh", 1.0), ("shifted_relu", 1.0), ("silu", 1.0), ("erf", 0.5)])
def test_finite_depth_approaches_limit_at_its_rate(nl, exponent):
    # W1(finite L, limit) shrinks like L^-a: the finite-L S-transform differs from the limit by
    # O(1/L) and O(q*(L)) (higher cumulants of phi'^2), and q*(L) ~ 1/L except for erf, where
    # mu_2/mu_1^2 - 1 ~ q*^2 gives q*(L) ~ L^-1/2. Over a factor 16 in depth we demand at least
    # half the predicted exponent (pre-asymptotic corrections), which excludes any slower law.
    limit = fp.SmoothLimit(SIGMA0_2) if nl in ("erf", "silu") else fp.BernoulliLimit(SIGMA0_2)
    s = np.concatenate([np.geomspace(1e-4, 0.2, 80, endpoint=False), np.linspace(0.2, 1.9, 250)])
    lam = s**2
    ref = limit.continuous_density(lam, 1e-9)
    w1 = []
    for L in (128, 2048):
        q = fp.double_scaling_q_star(nl, L, SIGMA0_2)
        res = fp.jacobian_density(nl, "orthogonal", L, q, lam, eps=1e-7 * lam, n_nodes=64, ratio=1.25)
        w1.append(stats.wasserstein_distance(lam, res.density, ref, res.atoms, limit.atoms))
    assert w1[0] / w1[1] >= 16 ** (exponent / 2)


@pytest.mark.parametrize("nl,weights", [("hard_tanh", "orthogonal"), ("shifted_relu", "orthogonal"),
                                        ("erf", "orthogonal"), ("silu", "orthogonal"),
                                        ("hard_tanh", "gaussian"), ("erf", "gaussian")])
def test_double_scaling_density_against_simulation(nl, weights):
    # The densities of the book's page 3, at L = 8 and q* = q*(8): mass (atoms included), m1, m2
    # of 002 Eq. 21 (sigma^2 = s0 for orthogonal, s0 + L for Gaussian weights), and the KS
    # distance to simulated networks. Grid and tolerances as in test_master_equation_density.
    L, n, k = 8, 200, 1
    q = fp.double_scaling_q_star(nl, L, SIGMA0_2)
    m1, m2 = fp.jacobian_moments(nl, weights, L, q)
    assert m2 - m1**2 == pytest.approx(SIGMA0_2 + (L if weights == "gaussian" else 0), rel=1e-9)
    lam = _grid(1.0 + 12 * math.sqrt(m2))
    # eps relative to lambda: a fixed 1e-9 leaves -Im G / pi slightly negative at 1e-8
    res = fp.jacobian_density(nl, weights, L, q, lam, n_nodes=64, ratio=1.25, eps=1e-7 * lam)
    assert np.all(res.density >= -1e-8)
    mass, mm1, mm2 = stats.mass_and_moments(lam, res.density, res.atoms)
    if weights == "gaussian":
        # a product of L square Gaussian factors has density ~ lambda^(-L/(L+1)) near 0, so the
        # grid misses (L + 1) lam[0] rho(lam[0]) (7% here) below its first point
        slope = np.log(res.density[1] / res.density[0]) / np.log(lam[1] / lam[0])
        assert slope == pytest.approx(-L / (L + 1), abs=1e-2)
        mass += (L + 1) * lam[0] * res.density[0]
    assert mass == pytest.approx(1, abs=2e-2)
    assert mm1 == pytest.approx(m1, abs=2e-2)
    assert mm2 == pytest.approx(m2, rel=3e-2)
    eigs, q_ratio = ex.double_scaling_eigs(jax.random.PRNGKey(9), nl, weights, [L], SIGMA0_2, n, k)
    assert stats.kolmogorov_distance(eigs[L], lam, res.density, res.atoms, lower=1e-8) < dkw(n * k, n)


@pytest.mark.slow
def test_gaussian_weights_spread_with_depth():
    # 002 §5: at the double-scaling q*(L), Gaussian weights give sigma^2 = s0 + L and no limit:
    # the computed density puts a growing fraction of the spectrum below 1e-6 (nearly singular
    # directions), while with orthogonal weights that fraction stays 0 (the smooth limit lives
    # on [0.32, 2.42]). The mass above 1e-6 is summed from the top of the grid down.
    lam = np.concatenate([np.geomspace(1e-6, 0.1, 100, endpoint=False),
                          np.linspace(0.1, 10, 400, endpoint=False), np.geomspace(10, 1e4, 100)])
    below = {}
    for weights in ("gaussian", "orthogonal"):
        for L in (2, 8, 32):
            q = fp.double_scaling_q_star("erf", L, SIGMA0_2)
            res = fp.jacobian_density("erf", weights, L, q, lam, eps=1e-6 * lam, n_nodes=64, ratio=1.25)
            above, _, _ = stats.mass_and_moments(lam, res.density)
            below[weights, L] = 1 - above
    # orthogonal: only the quadrature error of the grid (square-root edges on a step of 0.025:
    # about 1e-3, and 1.3e-3 at half the step)
    grid_error = 3e-3
    assert max(abs(below["orthogonal", L]) for L in (2, 8, 32)) < grid_error
    assert below["gaussian", 2] < below["gaussian", 8] < below["gaussian", 32]
    assert below["gaussian", 32] > 10 * grid_error
