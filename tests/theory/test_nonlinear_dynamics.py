"""Tests of deqlab.lab.experiments.nonlinear.dynamics (001 Eq. 29, §5.3, App. B.1)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqlab import ensembles
from deqlab.lab.experiments.nonlinear import dynamics as nld
from deqlab.theory import meanfield as mf


@pytest.mark.float64
@pytest.mark.slow
def test_solver_statistics_shapes_and_picard_rate_matches_meanfield():
    # Gaussian W, N = 200, sqrt(V) = 0.4 sc: predicted r = 0.64. The finite-N radius exceeds r by
    # the Ginibre edge fluctuation (~ N^-1/2 = 7%), and the residual's transient is excluded by
    # contraction_rate's second-half window: 10% on the mean of 8 samples.
    sc = 0.4 * mf.critical_scale("tanh", "gaussian")
    st = nld.solver_statistics("tanh", "gaussian", jax.random.PRNGKey(0), 200, [sc], 8,
                               solvers=("picard", "anderson"), tol=1e-10, max_steps=200)
    assert st.steps.shape == st.converged.shape == st.rate.shape == (2, 2, 1, 8)
    assert st.fraction.shape == (2, 2, 1) and np.all(st.fraction == 1.0)
    r = mf.picard_rate("tanh", "gaussian", sc * sc)
    for d in range(2):  # forward and the adjoint: the same rate (001 Eq. 29)
        assert abs(np.mean(st.rate[0, d, 0]) / r - 1) < 0.10, (st.rate[0, d, 0], r)
    nfe = mf.picard_nfe("tanh", "gaussian", sc * sc, 1e-10)
    assert abs(st.mean_steps()[0, 0, 0] - nfe) <= 0.15 * nfe + 3, (st.mean_steps()[0, 0, 0], nfe)
    # Anderson is faster than Picard on the same problems
    assert np.all(st.mean_steps()[1] < st.mean_steps()[0])


def test_contraction_rate_of_a_geometric_trace():
    t = np.arange(51)[:, None] * np.ones((1, 3))
    trace = jnp.asarray(0.7 ** t * np.array([1.0, 2.0, 5.0]))
    rate = nld.contraction_rate(trace, jnp.array([50, 20, 1]))
    # float32 trace (eps ~ 1.2e-7): the rate, a root of a ratio of two entries, is good to a few eps.
    np.testing.assert_allclose(rate[:2], 0.7, rtol=1e-5)
    assert np.isnan(rate[2])


def test_half_point_interpolates():
    assert nld.half_point([1.0, 2.0, 3.0], [1.0, 0.75, 0.25]) == pytest.approx(2.5)
    assert math.isnan(nld.half_point([1.0, 2.0], [1.0, 0.9]))


@pytest.mark.float64
@pytest.mark.slow
def test_ntk_formula_matches_autodiff_and_paper_eq93_does_not():
    n, scale = 20, 1.5
    W = ensembles.sample("gaussian", jax.random.PRNGKey(1), n, scale, jnp.float64)
    X = nld.inputs_on_circle(jax.random.PRNGKey(2), n, [0.0, 1.0, 2.5])
    v = jax.random.normal(jax.random.PRNGKey(3), (n,), jnp.float64)

    @jax.jit  # the three kernels in one compiled program (eager, ~100 small ones)
    def kernels(W, X, v):
        formula = nld.empirical_ntk("tanh", W, X, v, scale)
        auto = nld.empirical_ntk("tanh", W, X, v, scale, method="autodiff")
        B, C = nld.paper_eq93_gradient("tanh", W, X, v)
        G = jnp.einsum("pi,pj->pij", B, C).reshape(3, -1)
        return formula, auto, scale**2 / n * G @ G.T

    formula, auto, paper = map(np.asarray, kernels(W, X, v))
    # both float64 with solves to 1e-12: agreement to 1e-9 relative
    np.testing.assert_allclose(formula, auto, rtol=1e-9, atol=1e-9 * np.max(np.abs(auto)))
    assert np.max(np.abs(paper - auto)) > 0.1 * np.max(np.abs(auto))
    X2 = nld.inputs_on_circle(jax.random.PRNGKey(2), n, [0.0, 1.0, 2.5], sigma_x2=2.0)
    np.testing.assert_allclose(X2 @ X2.T / n, 2 * np.cos(np.subtract.outer([0, 1, 2.5], [0, 1, 2.5])), atol=1e-12)


@pytest.mark.float64
@pytest.mark.slow
def test_ntk_draws_average_matches_mean_field_for_gaussian():
    # float64: under float32 the drawn NTKs came out all NaN (issue 24, item 7; open for
    # deqlab.lab.experiments.nonlinear.dynamics), not a tolerance matter.
    # N = 200, 12 draws: the v-averaged diagonal fluctuates by ~ 0.2 / sqrt(12) relative (measured
    # spread 0.16 at N = 100, 0.11 at N = 400); finite-N bias O(1/N): a 12% tolerance.
    n, scale = 200, 1.0
    X = nld.inputs_on_circle(jax.random.PRNGKey(4), n, [0.0, math.pi / 3])
    d = nld.ntk_draws("tanh", "gaussian", jax.random.PRNGKey(5), n, scale, X, 12)
    assert d.theta.shape == d.theta_v.shape == d.nngp.shape == (12, 2, 2)
    for (p, q), c in (((0, 0), 1.0), ((0, 1), 0.5)):
        pred = nld.ntk_mean_field("tanh", scale**2, 1.0, 1.0, c)
        assert abs(np.mean(d.theta_v[:, p, q]) / pred - 1) < 0.12, (np.mean(d.theta_v[:, p, q]), pred)


def test_mean_field_ntk_linear_closed_form():
    # linear phi: m11 = 1, q12 = V c / (1 - V): Theta = V c / (1 - V)^2
    V, c = 0.5, 0.3
    assert nld.ntk_mean_field("linear", V, 1.0, 1.0, c) == pytest.approx(V * c / (1 - V) ** 2, rel=1e-10)


@pytest.mark.parametrize("call, match", [
    (lambda: nld.solver_statistics("softplus", "gaussian", jax.random.PRNGKey(0), 4, [0.5], 2), "`phi`"),
    (lambda: nld.solver_statistics("tanh", "wishart", jax.random.PRNGKey(0), 4, [0.5], 2), "`ensemble`"),
    (lambda: nld.solver_statistics("tanh", "goe", jax.random.PRNGKey(0), 4, [], 2), "`scales`"),
    (lambda: nld.solver_statistics("tanh", "goe", jax.random.PRNGKey(0), 4, [-1.0], 2), "`scales`"),
    (lambda: nld.solver_statistics("tanh", "goe", jax.random.PRNGKey(0), 4, [0.5], 0), "`samples`"),
    (lambda: nld.solver_statistics("tanh", "goe", jax.random.PRNGKey(0), 4, [0.5], 2, solvers=("gmres",)),
     "`solvers`"),
    (lambda: nld.solver_statistics("tanh", "goe", jax.random.PRNGKey(0), 4, [0.5], 2, tol=2.0), "`tol`"),
    (lambda: nld.solver_statistics("tanh", "goe", 0, 4, [0.5], 2), "`key`"),
    (lambda: nld.empirical_ntk("tanh", jnp.eye(3), jnp.ones((2, 4)), jnp.ones(3), 1.0), "`X`"),
    (lambda: nld.empirical_ntk("tanh", jnp.eye(3), jnp.ones((2, 3)), jnp.ones(4), 1.0), "`v`"),
    (lambda: nld.empirical_ntk("tanh", jnp.eye(3), jnp.ones((2, 3)), jnp.ones(3), 1.0, method="fd"), "`method`"),
    (lambda: nld.ntk_mean_field("tanh", 9.0, 1.0, 1.0, 0.5), "`V` must be below"),
    (lambda: nld.ntk_mean_field("tanh", 0.5, 1.0, 1.0, 1.5), "`overlap`"),
    (lambda: nld.ntk_draws("tanh", "goe", jax.random.PRNGKey(0), 4, 0.5, jnp.ones((2, 3)), 2), "`X`"),
])
def test_bad_arguments_raise_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()
