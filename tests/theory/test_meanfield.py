"""Tests for deqlab.theory.meanfield (001 §3, App. C.1) against simulation of nonlinear DEQs.

The simulated model is 001's own, ``z* = phi(W z*) + x`` (Eq. 21), solved by Picard iteration with
:func:`deqlab.solve` over a batch of inputs ``x`` with i.i.d. ``N(mean, 1)`` entries; ``h* = W z*``
(Eq. 22). ``W = sample(ensemble, key, N, sqrt(V))`` of :mod:`deqlab.ensembles`, float64 throughout.

Tolerances (all random tests use fixed keys, so they are deterministic):

* ``(1/N) h* . h*``: compared, input by input, with Eq. 25 at that input's own ``(1/N) x . x`` and
  ``(1/N) 1^T x`` (the theorem's quantities); the mean difference must vanish within ``Z = 5``
  standard errors (the larger of those over inputs and over matrices; fluctuations
  ``O(N^-1/2)``), plus ``q / N`` for the ``O(1/N)`` finite-width bias of a normalised trace (0.2%
  at ``N = 500``).
* Spectral radius, Ginibre and orthogonal ``W``: the largest ``|eigenvalue|`` of an ``N x N``
  R-diagonal matrix lies *outside* the limiting disc by the edge law of the real Ginibre
  ensemble (:func:`deqlab.theory.linear.edge_scaling`: centre ``1 + sqrt(gamma / 4N)``, Gumbel
  width ``1 / sqrt(4 N gamma)``; ``+1.2%`` and ``4.3%`` at ``N = 500``). The measured mean over
  matrices must lie between ``r (1 - Z se)`` and ``r (centre + 3 width) + Z se``.
* Spectral radius, GOE: real spectrum with a soft (square-root) edge; finite-``N`` offsets are
  of the Tracy-Widom order ``r N^-2/3`` (1.6% at ``N = 500``); allowed ``2 r N^-2/3 + Z se``.
* Pure identities (closed form = adaptive quadrature, a root solves its equation) use float64
  round-off bounds.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import brentq

import deqlab
from deqlab import ensembles
from deqlab.theory import freeprob as fp
from deqlab.theory import linear as lin
from deqlab.theory import meanfield as mf

# Theory checks: closed forms and limits to ~1e-10, float64 by convention (tests/conftest.py).
pytestmark = pytest.mark.float64

Z = 5.0
N_SIM = 500


# ---------------------------------------------------------------------------------------------
# Simulation helpers
# ---------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("phi", "tol", "max_steps"))
def _picard(phi, W, x, tol, max_steps):
    nl = mf.nonlinearity(phi)
    sol = deqlab.solve(lambda z, x, W: nl.jax(z @ W.T) + x, jnp.zeros_like(x), x, W, solver=deqlab.Picard(tol=tol, max_steps=max_steps), batch_axis=0)
    return sol.value, sol.result, sol.stats.steps, sol.stats.residual, sol.stats.residual_trace


def simulate(phi, ensemble, scale, seed, n=N_SIM, batch=4, mean_x=0.0, tol=1e-11, max_steps=2000):
    """One ``W`` and ``batch`` inputs: ``(W, x, h*, result, steps, residual, residual_trace)``."""
    k_w, k_x = jax.random.split(jax.random.PRNGKey(seed))
    W = ensembles.sample(ensemble, k_w, n, scale, jnp.float64)
    x = mean_x + jax.random.normal(k_x, (batch, n), jnp.float64)
    z, result, steps, residual, trace = _picard(phi, W, x, tol, max_steps)
    W, z = np.asarray(W), np.asarray(z)
    return W, np.asarray(x), z @ W.T, np.asarray(result), np.asarray(steps), np.asarray(residual), np.asarray(trace)


@functools.lru_cache(maxsize=None)
def measured(phi, ensemble, scale, n_matrices=6, n=N_SIM):
    """Per matrix and input: ``(1/N) h* . h*`` minus Eq. 25 evaluated at that input's own ``sigma_x2 = (1/N) x . x`` and ``mean_x = (1/N) 1^T x`` (001 Thm. 3.1 is stated for
    the empirical input averages; conditioning on them removes their ``sqrt(2/N)`` = 6%
    fluctuation), and the spectral radius of ``W diag(phi'(h*))`` at its first input (001 Eq. 29)."""
    excess, radius = [], []
    for seed in range(n_matrices):
        W, x, h, result, *_ = simulate(phi, ensemble, scale, 1000 + seed, n=n)
        assert np.all(result == deqlab.Result.SUCCESS), (phi, ensemble, scale, result)
        predicted = [mf.hidden_variance(phi, ensemble, scale * scale, xi @ xi / n, np.mean(xi)) for xi in x]
        excess.append(np.sum(h * h, axis=1) / n - predicted)
        d = mf.nonlinearity(phi).derivative_numpy(h[0])
        radius.append(np.max(np.abs(np.linalg.eigvals(W * d[None, :]))))
    return np.array(excess), np.array(radius)


def mean_se(values):
    return float(np.mean(values)), float(np.std(values, ddof=1) / math.sqrt(len(values)))


def ginibre_edge_window(n):
    """``(centre, width)`` of the Ginibre spectral-radius edge law at ``N`` (relative units)."""
    return lin.edge_scaling("gaussian", n)


def adaptive(f, q, kinks=()):
    """``E f(h)``, ``h ~ N(0, q)``, by adaptive quadrature split at the kinks (independent check)."""
    return fp.gaussian_expectation(f, q, kinks)


# ---------------------------------------------------------------------------------------------
# Gaussian averages and the self-consistent equation (001 Thm. 3.1, Eq. 25-26)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("phi", mf.PHIS)
@pytest.mark.parametrize("q", [1e-4, 0.3, 1.0, 4.0, 30.0])
def test_gaussian_moments_match_adaptive_quadrature(phi, q):
    nl = mf.nonlinearity(phi)
    e1, e2, ed2 = mf.gaussian_moments(phi, q)
    ref = (adaptive(nl.numpy, q, nl.kinks), adaptive(lambda h: nl.numpy(h) ** 2, q, nl.kinks),
           adaptive(lambda h: nl.derivative_numpy(h) ** 2, q, nl.kinks))
    # adaptive quadrature is asked for 1e-12 relative; the closed forms are exact in float64
    np.testing.assert_allclose((e1, e2, ed2), ref, rtol=1e-9, atol=1e-13)


def test_tanh_quadrature_converged_in_panel_width():
    # Halving the panels changes nothing beyond round-off: the composite rule has converged.
    q = np.array([1e-6, 0.01, 1.0, 10.0, 100.0])
    coarse, fine = mf._tanh_moments(q), mf._tanh_moments(q, panel=0.25)
    np.testing.assert_allclose(coarse, fine, rtol=1e-13, atol=1e-16)


@pytest.mark.parametrize("phi, V, sigma_x2, mean_x", [
    ("hard_tanh", 0.7, 1.0, 0.0), ("tanh", 2.0, 0.5, 0.3), ("erf", 1.5, 1.0, -0.8),
    ("relu", 1.2, 1.0, 0.7), ("relu", 1.2, 2.0, -1.0), ("linear", 0.6, 1.3, 0.2)])
def test_hidden_variance_solves_eq25(phi, V, sigma_x2, mean_x):
    nl = mf.nonlinearity(phi)
    q = mf.hidden_variance(phi, "gaussian", V, sigma_x2, mean_x)
    e1 = adaptive(nl.numpy, q, nl.kinks)
    e2 = adaptive(lambda h: nl.numpy(h) ** 2, q, nl.kinks)
    assert q == pytest.approx(V * (e2 + 2 * mean_x * e1 + sigma_x2), rel=1e-9)


@pytest.mark.parametrize("phi", ["hard_tanh", "tanh", "erf"])
def test_bounded_phi_with_input_has_exactly_one_stable_solution(phi):
    # With sigma_x2 > 0, G(q) = F(q) - q starts positive and ends negative; the scan finds one
    # crossing, stable (slope < 1), on a range of V, inputs and means (E phi = 0 for odd phi).
    for V in (0.05, 1.0, 5.0, 50.0):
        for s, m in ((1e-3, 0.0), (1.0, 0.0), (1.0, -0.9), (4.0, 1.5)):
            roots = mf.variance_fixed_points(phi, V, s, m)
            assert len(roots) == 1 and roots[0].stable, (phi, V, s, m, roots)
            assert roots[0].q == pytest.approx(float(mf._variance_map(phi, V, s, m, roots[0].q)), rel=1e-12)


def test_linear_hidden_variance_matches_chapter_1_and_the_goe_departs():
    # Linear phi: h* = z* - x with z* = (I - W)^{-1} x, so (1/N) h*.h* = m2 - 2 m1 + 1 from the
    # exact linear theory (001 §2, deqlab.theory.linear). Eq. 25 gives V / (1 - V): equal for
    # Ginibre and orthogonal W, not for the GOE (no free independence, 001 §3.1 and Fig. 2).
    for V in (0.05, 0.15, 0.2):
        eq25 = mf.hidden_variance("linear", "gaussian", V)
        assert eq25 == pytest.approx(V / (1 - V), rel=1e-14)
        for e in ("gaussian", "orthogonal"):
            exact = lin.second_moment(e, V) - 2 * lin.first_moment(e, V) + 1
            assert eq25 == pytest.approx(exact, rel=1e-12)
        goe = lin.second_moment("goe", V) - 2 * lin.first_moment("goe", V) + 1
        assert goe > 1.2 * eq25, (V, goe, eq25)


def test_relu_two_solutions_and_the_iteration_settles_on_the_stable_one():
    # ReLU, V = 2.5, x = -1 (sigma_x2 = 1, mean_x = -1): Eq. 25 is a quadratic in sqrt(q) with
    # two positive roots. The stable one (slope < 1) is what the statistics of h_{t+1} =
    # W (phi(h_t) + x) (001 Eq. 23) settle on from below the unstable one; from above they blow up.
    V, n = 2.5, 1000
    roots = mf.variance_fixed_points("relu", V, 1.0, -1.0)
    assert len(roots) == 2 and roots[0].stable and not roots[1].stable
    a, b, c = 1 - V / 2, 2 * V / math.sqrt(2 * math.pi), -V  # (1 - V/2) t^2 + (2 V / sqrt(2 pi)) t - V = 0
    t = np.sort(np.roots([a, b, c]).real)
    np.testing.assert_allclose([r.q for r in roots], t**2, rtol=1e-12)
    with pytest.raises(mf.MultipleFixedPointsError, match="2 solutions") as info:
        mf.hidden_variance("relu", "gaussian", V, 1.0, -1.0)
    assert info.value.roots == roots
    W = np.asarray(ensembles.sample("gaussian", jax.random.PRNGKey(1), n, math.sqrt(V), jnp.float64))
    x = -np.ones(n)
    rng = np.random.default_rng(0)
    for q0, settles in ((0.5, True), (0.5 * roots[1].q, True), (1.5 * roots[1].q, False)):
        h = rng.normal(size=n) * math.sqrt(q0)
        qs = []
        for _ in range(200):
            h = W @ (np.maximum(h, 0) + x)
            qs.append(h @ h / n)
        if settles:
            # the time average over the last 100 steps; its fluctuations are O(N^-1/2) per step
            late = np.array(qs[100:])
            assert abs(late.mean() - roots[0].q) <= Z * late.std() / math.sqrt(10) + roots[0].q / n, late.mean()
        else:
            assert qs[-1] > 1e6 * roots[1].q


def test_relu_above_criticality_has_no_solution_and_the_variance_grows():
    # ReLU with V > 2 and mean-zero input: F(q) - q = (V/2 - 1) q + V sigma_x2 > 0, no root; the
    # simulated (1/N) h_t . h_t grows geometrically by the factor V/2 (times the finite-N edge
    # excess of the Jacobian's radius squared, (centre + 3 width)^2 of the Ginibre edge law).
    V, n = 2.5, 1000
    assert mf.variance_fixed_points("relu", V) == ()
    with pytest.raises(mf.NoFixedPointError, match="`V` must be V < 2"):
        mf.hidden_variance("relu", "gaussian", V)
    with pytest.raises(mf.NoFixedPointError, match="`V` must be V < 1"):
        mf.hidden_variance("linear", "orthogonal", 1.2)
    W = np.asarray(ensembles.sample("gaussian", jax.random.PRNGKey(2), n, math.sqrt(V), jnp.float64))
    x = np.random.default_rng(1).normal(size=n)
    h, qs = np.zeros(n), []
    for _ in range(60):
        h = W @ (np.maximum(h, 0) + x)
        qs.append(h @ h / n)
    growth = qs[-1] / qs[-2]
    centre, width = ginibre_edge_window(n)
    assert V / 2 * (1 - 0.05) <= growth <= V / 2 * (centre + 3 * width) ** 2, growth


def test_tanh_without_input_has_the_trivial_and_a_nontrivial_solution():
    # sigma_x2 = 0, V = 2 > 1: q = 0 (unstable, slope V phi'(0)^2 = 2) and q > 0 (stable).
    roots = mf.variance_fixed_points("tanh", 2.0, 0.0, 0.0)
    assert [r.q for r in roots][0] == 0.0 and len(roots) == 2
    assert roots[0].slope == pytest.approx(2.0, rel=1e-6) and roots[1].stable
    q = roots[1].q
    assert q == pytest.approx(2.0 * adaptive(lambda h: np.tanh(h) ** 2, q), rel=1e-9)
    with pytest.raises(mf.MultipleFixedPointsError, match="0 \\(unstable\\)"):
        mf.hidden_variance("tanh", "gaussian", 2.0, 0.0, 0.0)
    # V < 1 without input: only q = 0
    assert [r.q for r in mf.variance_fixed_points("tanh", 0.5, 0.0, 0.0)] == [0.0]
    with pytest.raises(mf.MultipleFixedPointsError, match="every sigma_h2"):
        mf.hidden_variance("linear", "gaussian", 1.0, 0.0, 0.0)


def test_tangent_double_root_is_found():
    # ReLU with mean_x < 0 at the V where the two roots of Eq. 25 merge (zero discriminant of
    # (1 - V/2) t^2 - (2 V m / sqrt(2 pi)) t - V s = 0 with s = m^2 = 1): one double root.
    V = brentq(lambda V: (2 * V / math.sqrt(2 * math.pi)) ** 2 - 4 * (V / 2 - 1) * V, 2.1, 4.0, xtol=1e-15)
    roots = mf.variance_fixed_points("relu", V * (1 - 1e-9), 1.0, -1.0)
    assert len(roots) == 2 and roots[1].q / roots[0].q < 1.01
    assert mf.variance_fixed_points("relu", V * (1 + 1e-6), 1.0, -1.0) == ()



# ---------------------------------------------------------------------------------------------
# Spectral radius (001 Thm. 3.2, Eq. 30; GOE: §3.2 and App. C.1) and critical scale
# ---------------------------------------------------------------------------------------------


def test_radius_closed_forms():
    V = 0.3
    for e in ("gaussian", "orthogonal"):
        assert mf.spectral_radius("linear", e, V) == pytest.approx(math.sqrt(V))
        assert mf.spectral_radius("relu", e, V) == pytest.approx(math.sqrt(V / 2))
        q = mf.hidden_variance("hard_tanh", e, V)
        p = math.erf(1 / math.sqrt(2 * q))
        assert mf.spectral_radius("hard_tanh", e, V) == pytest.approx(math.sqrt(V * p), rel=1e-14)
        # "up to a factor of 2" (001 §3.2): the GOE hard-tanh radius at the same variance
        assert mf.spectral_radius("hard_tanh", "goe", V) == pytest.approx(2 * math.sqrt(V * p), rel=1e-14)
    assert mf.spectral_radius("linear", "goe", V) == pytest.approx(2 * math.sqrt(V))
    # ... but not for a smooth phi' (erf at q = 2: the C.1 edge is 3.6% above twice Eq. 30, independent of V)
    goe, ginibre = (mf.spectral_radius("erf", e, 0.2, sigma_h2=2.0) for e in ("goe", "gaussian"))
    assert goe > 1.02 * 2 * ginibre, (goe, ginibre)


@pytest.mark.parametrize("phi", ["hard_tanh", "erf"])
def test_goe_edge_matches_the_dw_spectrum_of_chapter_2(phi):
    # The edge found on the real axis is where the density of fp.DWSpectrum (the same
    # subordination equation, evaluated by root following at Im z = 1e-7) switches on: inside
    # it the density is O(1), outside O(eps) (plus the O(1/256) point-mass discretisation of D).
    V, q = 0.2, 2.0
    r = mf.spectral_radius(phi, "goe", V, sigma_h2=q)
    dw = fp.DWSpectrum(fp.slope_spectrum(phi, q, 256), V)
    inside, outside = dw.density(np.array([0.99 * r, 1.01 * r]), 1e-7)
    assert inside > 0.05 and outside < 1e-3 * inside, (inside, outside)


@pytest.mark.parametrize("phi", ["tanh", "erf", "hard_tanh"])
def test_goe_edge_matches_sampled_free_product(phi):
    # The free-probability setting itself: D^{1/2} W D^{1/2} with D = phi'(h) for i.i.d.
    # h ~ N(0, q), independent of a GOE W (N = 1000). Soft edge: offset O(r N^-2/3) (1%).
    V, q, n, reps = 0.2, 2.0, 1000, 3
    r = mf.spectral_radius(phi, "goe", V, sigma_h2=q)
    nl = mf.nonlinearity(phi)
    rng = np.random.default_rng(3)
    radii = []
    for seed in range(reps):
        W = np.asarray(ensembles.sample("goe", jax.random.PRNGKey(seed), n, math.sqrt(V), jnp.float64))
        s = np.sqrt(nl.derivative_numpy(math.sqrt(q) * rng.normal(size=n)))
        radii.append(np.max(np.abs(np.linalg.eigvalsh(s[:, None] * W * s[None, :]))))
    est, se = mean_se(radii)
    assert abs(est - r) <= 2 * r * n ** (-2 / 3) + Z * se, (est, se, r)


@pytest.mark.parametrize("ensemble", mf.ENSEMBLES)
def test_critical_scale_puts_radius_at_one_and_radius_grows(ensemble):
    # tanh with the ensembles chapter 3 page 3 uses (mf.scale_for_rate relies on the growth); its GOE edge is slow
    for phi in ("hard_tanh", "erf", "linear", "relu") + (("tanh",) if ensemble != "goe" else ()):
        sc = mf.critical_scale(phi, ensemble)
        assert mf.spectral_radius(phi, ensemble, sc * sc) == pytest.approx(1.0, abs=1e-10)
        radii = [mf.spectral_radius(phi, ensemble, (f * sc) ** 2) for f in np.linspace(0.1, 1.5, 8)]
        assert np.all(np.diff(radii) > 0), (phi, radii)
    assert mf.critical_scale("linear", ensemble) == (0.5 if ensemble == "goe" else 1.0)


def test_scale_for_rate_inverts_the_rate():
    # the rate at the returned scale is the target (Brent's tolerance 1e-12 in sqrt(V)): tanh at chapter 3 page 3's
    # budget threshold (300 Picard steps to 1e-8) for its two ensembles, once with another input; hard tanh's GOE at
    # 0.8, where P(phi' = 1) < 1 (at small rates it is 1 and the answer is the linear one); a rate far below the scan's
    # fixed start; rate 1 is critical_scale, the same computation; the closed forms of linear and ReLU
    budget = 1e-8 ** (1 / 300)
    for phi, ensemble, rate, inputs in (("tanh", "gaussian", budget, (1.0, 0.0)), ("tanh", "orthogonal", budget, (1.0, 0.0)),
                                        ("tanh", "gaussian", 0.7, (0.5, 0.3)), ("hard_tanh", "goe", 0.8, (1.0, 0.0)),
                                        ("erf", "orthogonal", 1e-7, (1.0, 0.0))):
        scale = mf.scale_for_rate(phi, ensemble, rate, *inputs)
        assert mf.picard_rate(phi, ensemble, scale * scale, *inputs) == pytest.approx(rate, rel=1e-9), (phi, ensemble)
    assert mf.scale_for_rate("hard_tanh", "goe", 1.0) == mf.critical_scale("hard_tanh", "goe")
    for phi in ("linear", "relu"):
        for ensemble in mf.ENSEMBLES:
            scale = mf.scale_for_rate(phi, ensemble, 0.5)
            assert mf.spectral_radius(phi, ensemble, scale * scale) == pytest.approx(0.5, rel=1e-12), (phi, ensemble)


# ---------------------------------------------------------------------------------------------
# Theory against simulated DEQs
# ---------------------------------------------------------------------------------------------


def check_variance(phi, ensemble, frac):
    """``(measured, se, Eq. 25)``: Eq. 25 at ``sigma_x2 = 1``, and the measured value as that plus
    the mean excess of ``(1/N) h* . h*`` over Eq. 25 at each input's own averages."""
    sc = frac * mf.critical_scale(phi, ensemble)
    q_theory = mf.hidden_variance(phi, ensemble, sc * sc)
    excess, _ = measured(phi, ensemble, sc)
    # Two sources of scatter: per input (e.g. (1/N) phi(h*) . x, O(N^-1/2) with mean zero) and per
    # matrix. The larger of the standard errors over all inputs and over the matrices' means covers
    # both (six matrices alone can underestimate the scatter by chance).
    est, se_matrices = mean_se(excess.mean(axis=1))
    se_inputs = mean_se(excess.ravel())[1]
    return q_theory + est, max(se_matrices, se_inputs), q_theory


def check_radius(phi, ensemble, frac):
    sc = frac * mf.critical_scale(phi, ensemble)
    r_theory = mf.spectral_radius(phi, ensemble, sc * sc)
    _, radius = measured(phi, ensemble, sc)
    est, se = mean_se(radius)
    return est, se, r_theory


def assert_variance_agrees(phi, ensemble, frac):
    est, se, q = check_variance(phi, ensemble, frac)
    assert abs(est - q) <= Z * se + q / N_SIM, f"{phi} {ensemble}: measured {est:.5g} +- {se:.2g}, Eq. 25 {q:.5g}"


def assert_rdiagonal_radius_agrees(phi, ensemble, frac):
    est, se, r = check_radius(phi, ensemble, frac)
    centre, width = ginibre_edge_window(N_SIM)
    assert r - Z * se <= est <= r * (centre + 3 * width) + Z * se, f"{phi} {ensemble}: {est:.5g} +- {se:.2g}, Eq. 30 {r:.5g}"


@pytest.mark.parametrize("ensemble", ["gaussian", "orthogonal"])
def test_hard_tanh_variance_and_radius_agree_with_simulation(ensemble):
    assert_variance_agrees("hard_tanh", ensemble, 0.5)
    assert_rdiagonal_radius_agrees("hard_tanh", ensemble, 0.5)


def test_hard_tanh_goe_variance_departs_radius_agrees_at_small_V():
    # 001 Fig. 2: for the GOE the measured variance is larger than Eq. 25 (tested as a departure
    # of more than Z se + q/N); 001 Fig. 3: the radius 2 sqrt(V p) is right at small V.
    est, se, q = check_variance("hard_tanh", "goe", 0.4)
    assert est > q + Z * se + q / N_SIM, (est, se, q)
    est, se, r = check_radius("hard_tanh", "goe", 0.4)
    assert abs(est - r) <= 2 * r * N_SIM ** (-2 / 3) + Z * se, (est, se, r)


@pytest.mark.slow
@pytest.mark.parametrize("phi", ["tanh", "erf", "relu", "hard_tanh"])
@pytest.mark.parametrize("ensemble", ["gaussian", "orthogonal"])
@pytest.mark.parametrize("frac", [0.4, 0.7])
def test_variance_and_radius_agree_with_simulation(phi, ensemble, frac):
    assert_variance_agrees(phi, ensemble, frac)
    assert_rdiagonal_radius_agrees(phi, ensemble, frac)


@pytest.mark.slow
@pytest.mark.parametrize("phi", ["tanh", "erf", "relu"])
def test_goe_variance_departs_and_radius_at_small_V(phi):
    est, se, q = check_variance(phi, "goe", 0.4)
    assert est > q + Z * se + q / N_SIM, (est, se, q)
    est, se, r = check_radius(phi, "goe", 0.4)
    assert abs(est - r) <= 2 * r * N_SIM ** (-2 / 3) + Z * se, (est, se, r)


@pytest.mark.slow
def test_goe_radius_departs_near_the_transition():
    # 001 Fig. 3: near the transition the GOE radius falls below the free-probability value
    # (h* is not free from a symmetric W). Measured below by more than the edge allowance.
    for phi in ("tanh", "hard_tanh"):
        est, se, r = check_radius(phi, "goe", 0.9)
        assert est < r - (2 * r * N_SIM ** (-2 / 3) + Z * se), (phi, est, se, r)


def test_critical_scale_brackets_the_picard_transition():
    # 001 Fig. 4: the residual of Picard iteration after many steps switches from ~0 to O(0.1)
    # as sqrt(V) crosses the critical scale. At 0.7 sc the predicted r is 0.85; the finite-N
    # radius exceeds it by at most centre + 3 width of the Ginibre edge law (+14% at N = 500),
    # 0.97 < 0.984 = tol^(1/max_steps): every sample converges. At 1.05 sc, r = 1.025 and the
    # finite-N radius only lies further out: none does.
    tol, steps = 1e-7, 1000
    for ensemble in ("gaussian", "orthogonal"):
        sc = mf.critical_scale("hard_tanh", ensemble)
        for frac, converge in ((0.7, True), (1.05, False)):
            *_, result, _, residual, _ = simulate("hard_tanh", ensemble, frac * sc, 7, batch=8, tol=tol,
                                                  max_steps=steps)
            if converge:
                assert np.all(result == deqlab.Result.SUCCESS), (ensemble, frac, residual)
            else:
                assert np.all(residual > 1e-3), (ensemble, frac, residual)


@pytest.mark.slow
@pytest.mark.parametrize("ensemble", ["gaussian", "orthogonal"])
def test_measured_picard_transition_matches_critical_scale(ensemble):
    # Where half of the samples converge within T = 1000 steps to tol = 1e-7. Picard converges
    # iff the finite-N radius r_N < tol^(1/T) = 0.984; the mean r_N is r (centre + 0.577 width)
    # (Gumbel mean of the Ginibre edge law, +3.6% at N = 500). So the predicted half-way scale
    # solves r(s) (centre + 0.577 width) = tol^(1/T) (0.90 sc for hard tanh). The transitions of
    # single samples spread by the Gumbel width (4.3% in r, ~9% in sqrt(V) since d log r / d log
    # sqrt(V) ~ 1/2 there); the median of 16 samples is within 0.06 sc of its mean at ~2.5 se.
    tol, steps, n = 1e-7, 1000, N_SIM
    sc = mf.critical_scale("hard_tanh", ensemble)
    centre, width = ginibre_edge_window(n)
    target = tol ** (1 / steps) / (centre + 0.5772 * width)
    predicted = brentq(lambda f: mf.spectral_radius("hard_tanh", ensemble, (f * sc) ** 2) - target, 0.5, 1.0)
    fracs = np.array([0.8, 0.85, 0.9, 0.95, 1.0])
    converged = []
    for frac in fracs:
        ok = [simulate("hard_tanh", ensemble, frac * sc, 300 + seed, batch=4, tol=tol, max_steps=steps)[3]
              == deqlab.Result.SUCCESS for seed in range(4)]
        converged.append(np.mean(ok))
    converged = np.array(converged)
    assert converged[0] > 0.5 > converged[-1], converged
    k = int(np.argmax(converged < 0.5))  # first grid point below one half
    half = fracs[k - 1] + (converged[k - 1] - 0.5) / (converged[k - 1] - converged[k]) * (fracs[k] - fracs[k - 1])
    assert abs(half - predicted) <= 0.06, (half, predicted, converged)


def test_goe_transition_is_later_than_predicted():
    # 001 Fig. 4: for the GOE the theory predicts the transition earlier than it happens: at
    # 1.2 times the predicted critical scale Picard iteration still converges.
    sc = mf.critical_scale("hard_tanh", "goe")
    assert mf.spectral_radius("hard_tanh", "goe", (1.2 * sc) ** 2) > 1.1
    *_, result, _, residual, _ = simulate("hard_tanh", "goe", 1.2 * sc, 7, batch=8, tol=1e-10, max_steps=1000)
    assert np.all(result == deqlab.Result.SUCCESS), residual


@pytest.mark.parametrize("phi, ensemble", [("hard_tanh", "gaussian"), ("erf", "orthogonal")])
def test_picard_nfe_forward_and_backward(phi, ensemble):
    # NFE ~ log(tol) / log(r). The finite-N rate exceeds r by up to eps = centre - 1 + 3 width
    # of the Ginibre edge law (7% at N = 1000), which shifts the NFE by NFE eps / |log r|; the
    # transient of the first steps adds a few (3). Backward: the adjoint iteration
    # u <- J^T u + g, J = diag(phi'(h*)) W at the forward solution (001 Eq. 93), has the same rate.
    n, tol = 1000, 1e-10
    sc = 0.4 * mf.critical_scale(phi, ensemble)
    V = sc * sc
    predicted = mf.picard_nfe(phi, ensemble, V, tol)
    assert predicted == mf.picard_nfe(phi, ensemble, V, tol, direction="backward")
    r = mf.picard_rate(phi, ensemble, V)
    centre, width = ginibre_edge_window(n)
    eps = centre - 1 + 3 * width
    allowed = predicted * eps / abs(math.log(r)) + 3
    W, _, h, result, steps, _, trace = simulate(phi, ensemble, sc, 3, n=n, batch=8, tol=tol, max_steps=1000)
    assert np.all(result == deqlab.Result.SUCCESS)
    assert abs(steps.mean() - predicted) <= allowed, (steps, predicted, allowed)
    # asymptotic rate from the second half of the residual trace
    k = int(steps.min())
    rate = math.exp(np.mean(np.log(trace[k]) - np.log(trace[k // 2])) / (k - k // 2))
    assert r * (1 - 0.02) <= rate <= r * (1 + eps), (rate, r)
    d = jnp.asarray(mf.nonlinearity(phi).derivative_numpy(h))
    g = jax.random.normal(jax.random.PRNGKey(99), h.shape, jnp.float64)
    back = deqlab.solve(lambda u, g, d, W: (u * d) @ W + g, jnp.zeros_like(g), g, d, jnp.asarray(W),
                        solver=deqlab.Picard(tol=tol, max_steps=1000), batch_axis=0)
    assert np.all(np.asarray(back.converged))
    assert abs(np.asarray(back.stats.steps).mean() - predicted) <= allowed, (back.stats.steps, predicted)


# ---------------------------------------------------------------------------------------------
# Argument validation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("call, match", [
    (lambda: mf.hidden_variance("softplus", "gaussian", 0.5), "`phi` must be one of 'linear'"),
    (lambda: mf.hidden_variance("tanh", "antisymmetric", 0.5), "`ensemble` must be one of 'gaussian'"),
    (lambda: mf.hidden_variance("tanh", "gaussian", 0.0), "`V` must be a finite real number > 0"),
    (lambda: mf.hidden_variance("tanh", "gaussian", float("nan")), "`V` must be"),
    (lambda: mf.hidden_variance("tanh", "gaussian", 0.5, -1.0), "`sigma_x2` must be a finite real number >= 0"),
    (lambda: mf.hidden_variance("tanh", "gaussian", 0.5, 1.0, 1.5), r"`mean_x` must be .* in \[-1, 1\]"),
    (lambda: mf.spectral_radius("tanh", "goe", 0.5, sigma_h2=0.0), "`sigma_h2` must be a finite real number > 0"),
    (lambda: mf.picard_nfe("tanh", "gaussian", 0.5, 1.5), r"`tol` must be a finite real number > 0 and < 1"),
    (lambda: mf.picard_nfe("tanh", "gaussian", 0.5, 1e-6, direction="up"), "`direction` must be one of"),
    (lambda: mf.picard_nfe("hard_tanh", "goe", 1.0, 1e-6), "`V` must be below the critical variance"),
    (lambda: mf.critical_scale("tanh", "gaussian", scale_max=1.0), "`scale_max` must be larger"),
    (lambda: mf.critical_scale("erf", "gaussian", sigma_x2=0.0), "`sigma_x2` must be > 0 for 'erf'"),
    (lambda: mf.scale_for_rate("tanh", "gaussian", 0.0), "`rate` must be a finite real number > 0"),
    (lambda: mf.scale_for_rate("tanh", "gaussian", 2.0, scale_max=5.0), "`scale_max` must be larger"),
    (lambda: mf.gaussian_moments("erf", -1.0), "`q` must be a finite real number >= 0"),
])
def test_bad_arguments_raise_naming_the_range(call, match):
    with pytest.raises(ValueError, match=match):
        call()
