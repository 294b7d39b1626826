"""Tests for deqlab.theory.kglm (004: kGLMs are DEQs; Thm. 3, Eq. 5, 7, 8; Prop. 4; §4).

Everything is float64 (conftest enables x64). Tolerances:

* DEQ vs kGLM predictions, 1e-8 absolute: Newton stops at ``||g|| <= 1e-12 max(1, ||T||)`` and the
  DEQ solve at relative residual 1e-12; predictions are O(1-10) and the maps here have Lipschitz
  constants (and ``||k(X~, X)|| / lam``) below ~100, so both sides carry errors <= ~1e-9; measured
  differences are ~1e-12.
* Identities of the parameters (``W1 = -K/lam`` etc.) are exact up to one rounding: 1e-15 relative.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import deqlab
from deqlab.nn import TanhCell
from deqlab.theory import kglm
from deqlab.theory.kglm import kernels

# Theory checks: closed forms and limits to ~1e-10, float64 by convention (tests/conftest.py).
pytestmark = pytest.mark.float64

EQUIV_TOL = 1e-8


squared_exponential = kernels.squared_exponential


def linear_plus_noise(A, B):
    # A tiny test-local Gram builder: x.x' + 1 (rank d + 1) plus white noise on coinciding points: PSD.
    A, B = np.asarray(A), np.asarray(B)
    same = np.all(A[:, None, :] == B[None, :, :], axis=-1)
    return A @ B.T + 1.0 + 0.1 * same


def observations(name, rng, n):
    return {
        "gaussian": lambda: rng.normal(size=n),
        "bernoulli": lambda: rng.integers(0, 2, n),
        "binomial": lambda: rng.integers(0, 6, n),
        "poisson": lambda: rng.poisson(2.0, n),
        "spin": lambda: rng.choice([-1.0, 1.0], n),
    }[name]()


FAMILIES = {
    "gaussian": kglm.gaussian(),
    "bernoulli": kglm.bernoulli(),
    "binomial": kglm.binomial(5),
    "poisson": kglm.poisson(),
    "spin": kglm.spin(),
}


def _check_equivalence(family_name, family, kernel, lam, seed, n=10, m=6, d=2):
    rng = np.random.default_rng(seed)
    X, X_test = rng.normal(size=(n, d)), rng.normal(size=(m, d))
    Y = observations(family_name, rng, n)
    direct = kglm.kglm_predict(X, Y, X_test, kernel, lam, family)
    at_X = np.asarray(kernel(X, X)) @ direct.alpha  # the MAP's f*(X) = K alpha*
    deq = kglm.deq_predict(X, Y, X_test, kernel, lam, family)
    assert bool(deq.solution.converged)
    # Eq. 8 at new points, and sigma^{-1}(z*) = K alpha* at X (no inverse of K, 004 §3.2).
    err_test = float(np.max(np.abs(np.asarray(deq.prediction) - direct.prediction)))
    err_train = float(np.max(np.abs(np.asarray(deq.fitted) - at_X)))
    assert err_test < EQUIV_TOL, (family_name, err_test)
    assert err_train < EQUIV_TOL, (family_name, err_train)
    # Thm. 3: z* = A'(K alpha*).
    np.testing.assert_allclose(np.asarray(deq.z), np.asarray(family.mean(at_X)), atol=EQUIV_TOL)
    return err_test, err_train


@pytest.mark.parametrize("family_name", list(FAMILIES))
def test_deq_equals_kglm_every_family(family_name):
    # lam = 3 lets Anderson converge for every family with this kernel (Poisson included).
    _check_equivalence(family_name, FAMILIES[family_name], squared_exponential(1.0), 3.0, seed=1)


def test_deq_equals_kglm_with_log_concave_prior():
    # q(f) ∝ exp(-c f^2 / 2) on top of the GP prior: rho = c (A')^{-1} is not zero (004 Eq. 4-5).
    family = kglm.bernoulli().with_prior(lambda u: 0.25 * u**2)
    _check_equivalence("bernoulli", family, squared_exponential(0.7), 1.0, seed=2)
    z = jnp.array([0.2, 0.5, 0.9])
    np.testing.assert_allclose(family.rho(z), 0.5 * np.log(z / (1 - z)), rtol=1e-14)


@pytest.mark.slow
@pytest.mark.parametrize("family_name", list(FAMILIES))
def test_deq_equals_kglm_several_kernels_and_data(family_name):
    # lam relative to ||K||_2 (the linear kernel's Gram matrix is ~10x larger than the others', k_true's 10x smaller).
    # For Poisson, A'' = e^u is unbounded; 3 ||K|| keeps the DEQ's Jacobian at the fixed point small
    # enough for Anderson (at 0.5 ||K|| it diverges and deq_predict raises, as it must).
    grams = [squared_exponential(0.5), squared_exponential(2.0), kernels.k_true(),
             kernels.periodic(period=3.0, length_scale=1.5), linear_plus_noise]
    rng = np.random.default_rng(9)
    for kernel in grams:
        for seed in (3, 4):
            X = np.random.default_rng(seed).normal(size=(10, 2))
            norm = np.linalg.norm(kernel(X, X), 2)
            lam = (3.0 if family_name == "poisson" else rng.uniform(0.3, 2.0)) * norm
            _check_equivalence(family_name, FAMILIES[family_name], kernel, lam, seed=seed)


def test_kernel_ridge_regression_closed_form_matches_newton():
    # The Gaussian family's closed form vs Newton on the same objective (a prior Q = 0 forces Newton).
    rng = np.random.default_rng(5)
    X, Y = rng.normal(size=(9, 1)), rng.normal(size=9)
    k = squared_exponential(1.0)
    closed = kglm.kglm_predict(X, Y, None, k, 0.7, "gaussian")
    newton = kglm.kglm_predict(X, Y, None, k, 0.7, kglm.gaussian().with_prior(lambda u: 0.0 * u))
    assert newton.steps >= 1
    np.testing.assert_allclose(newton.alpha, closed.alpha, atol=1e-10)
    np.testing.assert_allclose(closed.alpha, np.linalg.solve(k(X, X) + 0.7 * np.eye(9), Y), rtol=1e-12)


@pytest.mark.slow
def test_singular_gram_needs_no_assumption_1():
    # Repeated inputs make K singular (Assumption 1 fails); Eq. 8 still equals the MAP because
    # k(X~, X) v = 0 for every v in the null space of a PSD kernel's K (models.py, note 1).
    rng = np.random.default_rng(6)
    X = rng.normal(size=(5, 1))
    X = np.concatenate([X, X[:3]])
    K = squared_exponential(1.0)(X, X)
    assert np.linalg.matrix_rank(K) < K.shape[0]
    Y = rng.choice([-1.0, 1.0], X.shape[0])
    X_test = rng.normal(size=(4, 1))
    direct = kglm.kglm_predict(X, Y, X_test, squared_exponential(1.0), 2.0, "spin")
    deq = kglm.deq_predict(X, Y, X_test, squared_exponential(1.0), 2.0, "spin")
    assert float(np.max(np.abs(np.asarray(deq.prediction) - direct.prediction))) < EQUIV_TOL


def test_deq_parameters_are_theorem_3():
    rng = np.random.default_rng(7)
    X, Xt = rng.normal(size=(6, 2)), rng.normal(size=(3, 2))
    k = squared_exponential(1.3)
    K, Kt, lam = k(X, X), k(Xt, X), 0.8
    p = kglm.deq_parameters(K, Kt, lam)
    np.testing.assert_allclose(p.W1, -K / lam, rtol=1e-15)
    np.testing.assert_allclose(p.W3, -K / lam, rtol=1e-15)
    np.testing.assert_allclose(p.W2, K / lam, rtol=1e-15)
    np.testing.assert_allclose(p.V1, -Kt / lam, rtol=1e-15)
    np.testing.assert_allclose(p.V2, Kt / lam, rtol=1e-15)
    assert kglm.deq_parameters(K, None, lam).V1 is None


def test_assumption2_values_and_contraction():
    X = np.linspace(-2, 2, 8)[:, None]
    K = squared_exponential(1.0)(X, X)
    norm = np.linalg.norm(K, 2)
    # Bernoulli: sup A'' = 1/4, so lam = norm / 2 gives exactly 1/2 (004 §3.2).
    a2 = kglm.assumption2(K, norm / 2, "bernoulli")
    assert a2.holds and abs(a2.quantity - 0.5) < 1e-12
    assert kglm.assumption2(K, norm / 2, kglm.binomial(8)).quantity == pytest.approx(2 * 8 / 4, rel=1e-12)
    assert not kglm.assumption2(K, 100.0, "poisson").holds  # A'' = e^u is unbounded
    assert kglm.assumption2(K, 100.0, "poisson", curvature_bound=1.0).holds
    assert kglm.lam_for_spectral_norm(K, 0.5) == pytest.approx(2 * norm, rel=1e-14)
    with pytest.raises(ValueError, match="rho_derivative_bound"):
        kglm.assumption2(K, 1.0, kglm.gaussian().with_prior(lambda u: u**2))



@pytest.mark.slow
def test_under_assumption2_plain_iteration_converges():
    # Prop. 4: the quantity is 0.8 < 1, so plain (Picard) iteration of Eq. 14 converges.
    X = np.linspace(-2, 2, 8)[:, None]
    K = squared_exponential(1.0)(X, X)
    norm = np.linalg.norm(K, 2)
    Y = np.where(np.sin(3 * X[:, 0]) > 0, 1.0, -1.0)
    lam = 1.25 * norm  # quantity 0.8 for spin
    assert kglm.assumption2(K, lam, "spin").quantity == pytest.approx(0.8, rel=1e-12)
    deq = kglm.deq_predict(X, Y, None, squared_exponential(1.0), lam, "spin", solver="picard")
    direct = kglm.kglm_predict(X, Y, None, squared_exponential(1.0), lam, "spin")
    assert float(np.max(np.abs(np.asarray(deq.prediction) - direct.prediction))) < EQUIV_TOL


def test_assumption2_failure_picard_fails():
    # Gaussian family, ||K/lam|| = 4: H(z) = -K z / lam + K Y / lam is linear with an eigenvalue
    # -4 of its Jacobian, so Picard iteration diverges from any start off the fixed point.
    X = np.linspace(-2, 2, 8)[:, None]
    k = squared_exponential(1.0)
    K = k(X, X)
    lam = np.linalg.norm(K, 2) / 4
    a2 = kglm.assumption2(K, lam, "gaussian")
    assert not a2.holds and a2.quantity == pytest.approx(4.0, rel=1e-12)
    Y = np.sin(2 * X[:, 0])
    with pytest.raises(deqlab.SolverError):
        kglm.deq_predict(X, Y, None, k, lam, "gaussian", solver="picard", max_steps=200)
    failed = kglm.deq_predict(X, Y, None, k, lam, "gaussian", solver="picard", max_steps=200, on_failure="ignore")
    assert not bool(failed.solution.converged)
    # Newton (here the closed form) still finds the MAP, which is a fixed point of Eq. 7 (Thm. 3).
    direct = kglm.kglm_predict(X, Y, None, k, lam, "gaussian")
    params = kglm.deq_parameters(K, None, lam)
    z_map = K @ direct.alpha  # sigma = identity
    assert float(jnp.max(jnp.abs(kglm.deq_map(z_map, params, jnp.asarray(Y), kglm.gaussian()) - z_map))) < 1e-10


@pytest.mark.slow
def test_assumption2_failure_fixed_point_still_unique():
    # Anderson finds the same fixed point from different starts where Picard fails (models.py,
    # note 2: uniqueness does not need Assumption 2).
    X = np.linspace(-2, 2, 8)[:, None]
    k = squared_exponential(1.0)
    lam = np.linalg.norm(k(X, X), 2) / 4
    Y = np.sin(2 * X[:, 0])
    direct = kglm.kglm_predict(X, Y, None, k, lam, "gaussian")
    rng = np.random.default_rng(8)
    for z0 in (None, 5 * rng.normal(size=8)):
        deq = kglm.deq_predict(X, Y, None, k, lam, "gaussian", z0=z0)
        assert float(np.max(np.abs(np.asarray(deq.prediction) - direct.prediction))) < EQUIV_TOL


@pytest.mark.slow
def test_assumption2_failure_tanh_layer():
    # Spin family (tanh DEQ, 004 Eq. 14) with ||K/lam|| = 10: the fixed point exists (Thm. 3) and
    # Newton finds it, but plain iteration does not converge.
    X = np.linspace(-2, 2, 8)[:, None]
    k = squared_exponential(1.0)
    K = k(X, X)
    lam = np.linalg.norm(K, 2) / 10
    Y = np.where(np.sin(3 * X[:, 0]) > 0, 1.0, -1.0)
    direct = kglm.kglm_predict(X, Y, None, k, lam, "spin")
    params = kglm.deq_parameters(K, None, lam)
    z_map = jnp.tanh(K @ direct.alpha)
    fixed_point_residual = float(jnp.max(jnp.abs(kglm.deq_map(z_map, params, jnp.asarray(Y), kglm.spin()) - z_map)))
    assert fixed_point_residual < 1e-10  # Thm. 3 holds without Assumption 2
    picard = kglm.deq_predict(X, Y, None, k, lam, "spin", solver="picard", max_steps=300, on_failure="ignore")
    assert not bool(picard.solution.converged)


def test_initializers():
    X = kglm.naive_coordinates(6)
    assert X.shape == (6, 1) and X[0, 0] == pytest.approx(-2 * np.pi) and X[-1, 0] == pytest.approx(2 * np.pi)
    K = squared_exponential(1.0)(X, X)
    lam = kglm.lam_for_spectral_norm(K, 0.9)
    naive = kglm.initializer("naive", K, lam)
    assert naive.V1 is None and naive.V2 is None
    assert float(jnp.linalg.norm(naive.W1, 2)) == pytest.approx(0.9, rel=1e-12)
    Xt = np.linspace(-8, 4, 4)[:, None]
    informed = kglm.initializer("informed", K, lam, squared_exponential(1.0)(Xt, X))
    assert informed.V1.shape == (4, 6)
    np.testing.assert_allclose(informed.V2, squared_exponential(1.0)(Xt, X) / lam, rtol=1e-15)


@pytest.mark.slow
def test_informed_initializer_makes_a_tanh_cell_the_spin_deq_map():
    X = kglm.naive_coordinates(6)
    K = squared_exponential(1.0)(X, X)
    informed = kglm.initializer("informed", K, kglm.lam_for_spectral_norm(K, 0.9))
    # The tanh cell tanh(W z + U x + b) with W = W1, U = W2, b = 0 is the spin DEQ map (004 Eq. 14).
    cell = TanhCell(6, 6, ensemble="gaussian", param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    cell.recurrent.kernel[...] = kglm.as_linear_kernel(informed.W1, jnp.float64)
    cell.inject.kernel[...] = kglm.as_linear_kernel(informed.W2, jnp.float64)
    cell.inject.bias[...] = jnp.zeros(6)
    z, y = jnp.linspace(-0.5, 0.5, 6), jnp.array([1.0, -1, 1, 1, -1, -1])
    expected = kglm.deq_map(z, informed, y, kglm.spin())
    np.testing.assert_allclose(cell(z[None], y[None])[0], expected, rtol=1e-13, atol=1e-15)


def test_families_mean_maps_and_inverses():
    # A' and A'' against central differences: step h = 1e-4 gives a truncation error of
    # h^2 |third derivative| / 6 <~ 1e-8 (it is <= e^3 here) and round-off ~1e-16 |A| / h <~ 1e-10,
    # so 1e-7 relative (1e-9 absolute near zeros) is safe and still catches any wrong formula.
    eta = np.linspace(-3, 3, 13)
    h = 1e-4
    for family in [*FAMILIES.values(), kglm.gaussian(2.5)]:
        slope = (np.asarray(family.log_partition(eta + h)) - np.asarray(family.log_partition(eta - h))) / (2 * h)
        np.testing.assert_allclose(family.mean(eta), slope, rtol=1e-7, atol=1e-9)
        slope = (np.asarray(family.mean(eta + h)) - np.asarray(family.mean(eta - h))) / (2 * h)
        np.testing.assert_allclose(family.curvature(eta), slope, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(family.mean_inverse(family.mean(eta)), eta, atol=1e-12)
        assert float(jnp.max(family.curvature(eta))) <= family.curvature_bound * (1 + 1e-15)
    np.testing.assert_allclose(kglm.spin().mean(eta), np.tanh(eta), rtol=1e-15)


def test_bad_input_raises_value_error_naming_argument():
    X, k = np.zeros((3, 1)) + np.arange(3)[:, None], squared_exponential(1.0)
    with pytest.raises(ValueError, match="`lam`"):
        kglm.kglm_predict(X, [0, 1, 0], None, k, 0.0, "bernoulli")
    with pytest.raises(ValueError, match="`Y`"):
        kglm.kglm_predict(X, [0, 2, 0], None, k, 1.0, "bernoulli")
    with pytest.raises(ValueError, match="`Y`"):
        kglm.deq_predict(X, [0.5, 1, -1], None, k, 1.0, "spin")
    with pytest.raises(ValueError, match="`family`"):
        kglm.kglm_predict(X, [0, 1, 0], None, k, 1.0, "gamma")
    with pytest.raises(ValueError, match="`K`"):
        kglm.deq_parameters(np.array([[1.0, 0.5], [0.0, 1.0]]), None, 1.0)
    with pytest.raises(ValueError, match="`scheme`"):
        kglm.initializer("random", np.eye(2), 1.0)
    with pytest.raises(ValueError, match="`trials`"):
        kglm.binomial(0)
    with pytest.raises(ValueError, match="`tol`"):
        kglm.deq_predict(X, [0, 1, 0], None, k, 1.0, "bernoulli", tol=0.0)
    with pytest.raises(ValueError, match="`z0`"):
        kglm.deq_predict(X, [0, 1, 0], None, k, 1.0, "bernoulli", z0=[0.5, 1.5, 0.5])


@pytest.mark.slow
def test_poisson_non_convergence_is_reported_not_returned():
    # Poisson's A'' = e^u is unbounded (Assumption 2 never holds on the whole line); at lam = ||K||/10
    # the DEQ solve diverges here. deq_predict must raise, and with on_failure="ignore" say so in `result`.
    rng = np.random.default_rng(1)
    X, Y = rng.normal(size=(10, 2)), rng.poisson(2.0, 10)
    k = squared_exponential(1.0)
    lam = np.linalg.norm(k(X, X), 2) / 10
    with pytest.raises(deqlab.SolverError, match="poisson"):
        kglm.deq_predict(X, Y, None, k, lam, "poisson")
    fit = kglm.deq_predict(X, Y, None, k, lam, "poisson", on_failure="ignore")
    assert not bool(fit.solution.converged)
    kglm.kglm_predict(X, Y, None, k, lam, "poisson")  # Newton with line search still converges


@pytest.mark.slow
@pytest.mark.parametrize("family_name", ["gaussian", "bernoulli", "spin"])
def test_inpainting_with_the_image_kernel(family_name):
    # 004 §1 / App. E: X the observed pixels of a 5 x 5 image, X~ the missing ones; with the image
    # kernel K is a convolution (Cor. 11). The triangular taper keeps kappa PSD (Assumption 1 is
    # not needed either way, but Eq. 5's minimiser must exist: K PSD).
    coords = kernels.image_coordinates(5, 5)
    rng = np.random.default_rng(11)
    observed = rng.permutation(25)[:17]
    missing = np.setdiff1d(np.arange(25), observed)
    kernel = kernels.image_kernel(1, length_scale=1.0, truncation="triangular")
    X, X_test = coords[observed], coords[missing]
    Y = observations(family_name, rng, X.shape[0])
    lam = np.linalg.norm(kernel(X, X), 2)
    direct = kglm.kglm_predict(X, Y, X_test, kernel, lam, family_name)
    deq = kglm.deq_predict(X, Y, X_test, kernel, lam, family_name)
    assert float(np.max(np.abs(np.asarray(deq.prediction) - direct.prediction))) < EQUIV_TOL


def test_log_cosh_prior_derivatives_and_deq_equivalence():
    Q = kglm.log_cosh_prior(0.5)
    u = jnp.linspace(-30.0, 30.0, 121)
    fam = kglm.bernoulli().with_prior(Q)
    np.testing.assert_allclose(fam.prior_gradient(u), 0.5 * np.tanh(u), atol=1e-14)
    assert np.all(np.asarray(fam.prior_curvature(u)) <= 0.5 + 1e-15)
    np.testing.assert_allclose(Q(jnp.asarray([0.0, 40.0])), [0.0, 0.5 * (40.0 - np.log(2.0))], atol=1e-12)
    X = np.linspace(-2.0, 2.0, 15)
    Y = (np.sin(2 * X) > 0).astype(float)
    k = kglm.squared_exponential(0.7)
    direct = kglm.kglm_predict(X, Y, X + 0.1, k, 2.0, fam)
    deq = kglm.deq_predict(X, Y, X + 0.1, k, 2.0, fam)
    np.testing.assert_allclose(np.asarray(deq.prediction), direct.prediction, atol=1e-10)
    with pytest.raises(ValueError, match="scale"):
        kglm.log_cosh_prior(0.0)


def test_builtin_families_share_one_compiled_solve_and_match_the_generic_path():
    import dataclasses

    from deqlab.theory.kglm import models

    X = np.linspace(-2.0, 2.0, 11)
    k = kglm.squared_exponential(0.8)
    cases = [(kglm.gaussian(), np.sin(X)), (kglm.gaussian(2.0), np.cos(X)), (kglm.bernoulli(), (X > 0) * 1.0),
             (kglm.binomial(3), np.round(1.5 + 1.4 * np.sin(X))), (kglm.poisson(), np.round(2 + np.sin(X))),
             (kglm.spin(), np.where(X > 0.3, 1.0, -1.0))]
    for fam, Y in cases:
        assert models._builtin_code(fam) is not None, fam.name
        fast = kglm.deq_predict(X, Y, X + 0.05, k, 3.0, fam)
        # an equal family built by hand is not recognised and takes the per-family compiled path
        twin = dataclasses.replace(fam)
        assert models._builtin_code(twin) is None
        slow = kglm.deq_predict(X, Y, X + 0.05, k, 3.0, twin)
        np.testing.assert_allclose(np.asarray(fast.prediction), np.asarray(slow.prediction), rtol=0, atol=1e-11)
    assert models._builtin_code(kglm.spin().with_prior(kglm.log_cosh_prior(1.0))) is None


def test_layer_jacobian_is_diag_sigma_prime_times_weights():
    """Erratum to 004 App. D (proof of Prop. 4): DH = diag sigma'(u) (W1 + W3 diag rho'(z)) with u the
    full pre-activation; the printed order (columns scaled by sigma' at W1 z + W2 T) is a different matrix."""
    rng = np.random.default_rng(5)
    X = np.linspace(-2.0, 2.0, 12)
    K = np.asarray(kglm.squared_exponential(0.6)(X))
    params = kglm.deq_parameters(K, None, 0.7)
    fam = kglm.bernoulli().with_prior(kglm.log_cosh_prior(2.0))
    T = jnp.asarray((rng.random(12) < 0.5) * 1.0)
    z = jnp.asarray(rng.uniform(0.05, 0.95, 12))

    @jax.jit  # one compiled program (eager, ~70 small ones)
    def jacobians(z, T):
        u = params.W1 @ z + params.W2 @ T + params.W3 @ fam.rho(z)
        inner = params.W1 + params.W3 * fam.rho_derivative(z)[None, :]
        return (jax.jacobian(kglm.deq_map)(z, params, T, fam), fam.curvature(u)[:, None] * inner,
                inner * fam.curvature(params.W1 @ z + params.W2 @ T)[None, :])

    J, proved, printed = map(np.asarray, jacobians(z, T))
    np.testing.assert_allclose(proved, J, rtol=0, atol=1e-13 * np.abs(J).max())
    assert np.abs(printed - J).max() > 0.05 * np.abs(J).max()


def test_real_spin_is_the_tanh_deq_on_real_observations():
    X = np.linspace(-2.0, 2.0, 13)
    Y = 0.8 * np.sin(2 * X)
    k = kglm.squared_exponential(0.7)
    fam = kglm.real_spin()
    with pytest.raises(ValueError, match="Y"):
        kglm.kglm_predict(X, Y, None, k, 1.0, "spin")  # spin takes +-1 only
    direct = kglm.kglm_predict(X, Y, X + 0.1, k, 1.0, fam)
    deq = kglm.deq_predict(X, Y, X + 0.1, k, 1.0, fam)
    np.testing.assert_allclose(np.asarray(deq.prediction), direct.prediction, atol=1e-10)
    np.testing.assert_allclose(np.asarray(deq.z), np.tanh(np.asarray(deq.fitted)), atol=1e-13)
