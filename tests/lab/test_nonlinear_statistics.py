"""Tests for deqlab.lab.experiments.nonlinear.statistics (001 §3, Fig. 2-4) against deqlab.theory.meanfield.

Tolerances (fixed keys, so every test is deterministic):

* ``(1/N) h* . h*``: per sample minus Eq. 25 at that sample's own ``(1/N) x . x`` (conditioning
  removes the input's ``sqrt(2/N)`` fluctuation); the mean must vanish within ``Z = 5`` standard
  errors over the samples (per-sample scatter ``O(N^-1/2)``), plus ``q / N`` for the ``O(1/N)``
  finite-width bias of a normalised trace.
* Spectral radius, Ginibre / orthogonal: the largest ``|eigenvalue|`` at finite ``N`` lies outside
  the limiting disc by the real-Ginibre edge law (``theory.linear.edge_scaling``: centre
  ``1 + sqrt(gamma/4N)``, Gumbel width ``1/sqrt(4 N gamma)``); the measured mean must lie in
  ``[r - Z se, r (centre + 3 width) + Z se]`` (as in tests/theory/test_meanfield.py).
* Residual after ``T`` steps: at ``0.6`` of the critical scale the predicted ``r`` is ``0.79`` and
  the finite-``N`` radius exceeds it by at most ``centre + 3 width`` (+17% at ``N = 400``),
  ``0.93``, so ``T = 600`` steps shrink the residual by ``< 0.93^600 = 1e-19``: round-off. At 1.3 times the
  critical scale ``r = 1.07`` and the finite-``N`` radius lies further out: no sample converges and
  the residual stays of order one.
"""

import math

import jax
import numpy as np
import pytest

from deqlab.lab.experiments.nonlinear import statistics as nls
from deqlab.theory import linear as lin
from deqlab.theory import meanfield as mf

Z = 5.0
N = 400
KEY = jax.random.PRNGKey(3)


def mean_se(values):
    values = np.asarray(values).ravel()
    return float(np.mean(values)), float(np.std(values, ddof=1) / math.sqrt(values.size))


def test_shapes_and_types():
    st = nls.equilibrium_statistics("hard_tanh", "gaussian", KEY, 30, [0.5, 1.0, 1.5], 5, steps=50)
    assert st.scales.shape == (3,)
    for field in (st.variance, st.sigma_x2, st.residual, st.steps, st.converged, st.radius):
        assert field.shape == (3, 5)
    assert st.converged.dtype == bool and st.steps.dtype.kind == "i"
    assert np.all(st.steps <= 50) and np.all(st.steps >= 1)
    # common random numbers: the input is the same at every scale
    np.testing.assert_array_equal(st.sigma_x2[0], st.sigma_x2[2])
    assert nls.equilibrium_statistics("tanh", "goe", KEY, 10, 0.5, 2, radius=False).radius is None
    res = nls.residual_after("hard_tanh", "orthogonal", KEY, 20, [0.5], 3, 7)
    assert res.shape == (1, 3)


@pytest.mark.float64  # equal to 1e-12: only float64 is that exact across batch sizes
def test_batches_do_not_change_the_result():
    a = nls.equilibrium_statistics("erf", "orthogonal", KEY, 20, [0.7], 5, steps=40, radius=False)
    b = nls.equilibrium_statistics("erf", "orthogonal", KEY, 20, [0.7], 5, steps=40, radius=False, batch=2)
    np.testing.assert_allclose(a.variance, b.variance, rtol=1e-12)


@pytest.mark.float64
def test_converged_iterate_solves_eq22():
    W = np.asarray(jax.random.normal(KEY, (50, 50))) * 0.5 / math.sqrt(50)
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(9), (50,)))
    h, res, t = nls.picard_h("tanh", jax.numpy.asarray(W), jax.numpy.asarray(x), 500, 1e-13)
    h = np.asarray(h)
    np.testing.assert_allclose(h, W @ (np.tanh(h) + x), atol=1e-11)
    assert int(t) < 500 and float(res) <= 1e-13 * np.linalg.norm(h)


def test_jacobian_radius_of_a_diagonal():
    W = np.diag([0.5, -2.0, 1.0])
    h = np.array([0.0, 0.0, 3.0])  # hard tanh: slopes 1, 1, 0
    assert nls.jacobian_radius("hard_tanh", W, h) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="`W`"):
        nls.jacobian_radius("hard_tanh", np.ones((2, 3)), np.ones(2))
    with pytest.raises(ValueError, match="`h`"):
        nls.jacobian_radius("hard_tanh", np.eye(3), np.ones(2))


@pytest.mark.parametrize("kwargs, name", [
    (dict(phi="sigmoid"), "phi"), (dict(ensemble="antisymmetric"), "ensemble"), (dict(key=3), "key"),
    (dict(n=0), "n"), (dict(scales=[]), "scales"), (dict(scales=[0.5, -1.0]), "scales"),
    (dict(scales=[[0.5]]), "scales"), (dict(scales=[np.nan]), "scales"), (dict(samples=0), "samples"),
    (dict(steps=0), "steps"), (dict(tol=-1.0), "tol"), (dict(sigma_x2=-0.1), "sigma_x2"),
    (dict(radius="yes"), "radius"), (dict(batch=0), "batch"),
])
def test_argument_errors_name_the_argument(kwargs, name):
    args = dict(phi="hard_tanh", ensemble="gaussian", key=KEY, n=10, scales=[0.5], samples=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=f"`{name}`"):
        nls.equilibrium_statistics(**args)


def excess_over_eq25(st, ensemble):
    """Per sample: measured (1/N) h*.h* minus Eq. 25 at the sample's own (1/N) x.x (first scale)."""
    V = float(st.scales[0]) ** 2
    return np.array([v - mf.hidden_variance("hard_tanh", ensemble, V, s)
                     for v, s in zip(st.variance[0], st.sigma_x2[0])])


@pytest.mark.float64
@pytest.mark.parametrize("ensemble", ["gaussian", "orthogonal"])
def test_variance_and_radius_agree_with_theory(ensemble):
    sc = 0.5 * mf.critical_scale("hard_tanh", ensemble)
    st = nls.equilibrium_statistics("hard_tanh", ensemble, KEY, N, [sc], 12, steps=2000)
    assert np.all(st.converged)
    q = mf.hidden_variance("hard_tanh", ensemble, sc * sc)
    est, se = mean_se(excess_over_eq25(st, ensemble))
    assert abs(est) <= Z * se + q / N, (est, se, q)
    r = mf.spectral_radius("hard_tanh", ensemble, sc * sc)
    centre, width = lin.edge_scaling("gaussian", N)
    est, se = mean_se(st.radius)
    assert r - Z * se <= est <= r * (centre + 3 * width) + Z * se, (est, se, r)


@pytest.mark.float64
def test_goe_variance_departs_from_eq25():
    # 001 Fig. 2: for the GOE the measured variance exceeds Eq. 25 (here by more than Z se + q/N
    # and by more than 50%: at sqrt(V) = 0.4 it is about twice the prediction at N = 200-1000).
    sc = 0.4
    st = nls.equilibrium_statistics("hard_tanh", "goe", KEY, N, [sc], 8, steps=2000, radius=False)
    assert np.all(st.converged)
    q = mf.hidden_variance("hard_tanh", "goe", sc * sc)
    est, se = mean_se(excess_over_eq25(st, "goe"))
    assert est > Z * se + q / N and est > 0.5 * q, (est, se, q)


@pytest.mark.float64
@pytest.mark.parametrize("ensemble", ["gaussian", "orthogonal"])
def test_residual_collapses_below_the_critical_scale_only(ensemble):
    sc = mf.critical_scale("hard_tanh", ensemble)
    res = nls.residual_after("hard_tanh", ensemble, KEY, N, [0.6 * sc, 1.3 * sc], 6, 600)
    assert np.all(res[0] < 1e-8 * math.sqrt(N)), res[0]
    assert np.all(res[1] > 1e-2), res[1]
