"""Tests for deqlab.nonlinearities: one registry, NumPy and JAX forms that agree, derivatives that
match finite differences, kinks where the derivative jumps, and the lax.switch dispatch.

Tolerances. The JAX forms run in float64 here (conftest enables x64); they and the NumPy forms
use different special-function implementations (XLA's erf against scipy's), so they agree to a
few ulps: rtol 1e-12. Central differences with step 1e-6 have truncation error
``|phi'''| h^2 / 6 < 1e-12`` and rounding error ``~1e-16 / 1e-6 = 1e-10``: atol 1e-8. Points within
1e-3 of a kink are left out of the finite-difference check (the difference straddles the jump).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate

from deqlab import nonlinearities

H = np.linspace(-4.0, 4.0, 8001)


def test_registry_holds_the_six_of_chapter_2():
    assert nonlinearities.NONLINEARITIES == ("linear", "relu", "hard_tanh", "erf", "shifted_relu", "silu")
    for name in nonlinearities.NONLINEARITIES:
        nl = nonlinearities.get(name)
        assert nl.name == name and nonlinearities.index(name) == nonlinearities.NONLINEARITIES.index(name)


@pytest.mark.float64
@pytest.mark.parametrize("name", nonlinearities.NONLINEARITIES)
def test_numpy_and_jax_forms_agree(name):
    nl = nonlinearities.get(name)
    for fun_np, fun_jax in ((nl.numpy, nl.jax), (nl.derivative_numpy, nl.derivative_jax)):
        a = fun_np(H)
        b = np.asarray(fun_jax(jnp.asarray(H)))
        assert a.dtype == np.float64 and b.dtype == np.float64
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
    # the JAX form keeps a float32 input in float32 and works under jit and vmap
    h32 = jnp.asarray(H[:16], jnp.float32)
    assert nl.jax(h32).dtype == jnp.float32 and nl.derivative_jax(h32).dtype == jnp.float32
    np.testing.assert_allclose(jax.jit(nl.jax)(h32), nl.numpy(np.asarray(h32)), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(jax.vmap(nl.derivative_jax)(h32), nl.derivative_numpy(np.asarray(h32)),
                               rtol=1e-6, atol=1e-7)


@pytest.mark.float64
@pytest.mark.parametrize("name", nonlinearities.NONLINEARITIES)
def test_derivative_matches_finite_differences(name):
    nl = nonlinearities.get(name)
    step = 1e-6
    away = np.all(np.abs(H[:, None] - np.asarray(nl.kinks or [np.inf])[None, :]) > 1e-3, axis=1)
    h = H[away]
    fd = (nl.numpy(h + step) - nl.numpy(h - step)) / (2 * step)
    np.testing.assert_allclose(nl.derivative_numpy(h), fd, atol=1e-8)
    # and JAX's own autodiff of the JAX form agrees with the JAX derivative
    auto = jax.vmap(jax.grad(nl.jax))(jnp.asarray(h))
    np.testing.assert_allclose(np.asarray(auto), np.asarray(nl.derivative_jax(jnp.asarray(h))), atol=1e-12)


@pytest.mark.parametrize("name", nonlinearities.NONLINEARITIES)
def test_kinks_are_exactly_where_the_derivative_jumps(name):
    nl = nonlinearities.get(name)
    d = nl.derivative_numpy(H)
    jumps = H[1:][np.abs(np.diff(d)) > 0.1]  # a smooth phi' moves < 0.01 per grid step of 1e-3
    assert len(jumps) == len(nl.kinks)
    np.testing.assert_allclose(np.sort(jumps), np.sort(nl.kinks), atol=2 * (H[1] - H[0]))


@pytest.mark.parametrize("name", nonlinearities.NONLINEARITIES)
def test_binary_slope_class(name):
    nl = nonlinearities.get(name)
    d = nl.derivative_numpy(H)
    assert nl.binary_slope == bool(np.all((d == 0) | (d == 1)))


def test_erf_has_unit_slope_at_zero_and_integrates_its_derivative():
    # 002 §5 scales erf so that phi'(0) = 1; phi(h) = int_0^h phi'.
    erf = nonlinearities.get("erf")
    assert erf.derivative_numpy(0.0) == 1.0
    for h in (0.3, 1.7, -2.5):
        value, _ = integrate.quad(erf.derivative_numpy, 0.0, h, epsabs=1e-14)
        assert value == pytest.approx(float(erf.numpy(h)), abs=1e-12)
    assert erf.numpy(10.0) == pytest.approx(1.0) and math.isclose(erf.numpy(-10.0), -1.0)


def test_switch_dispatch_matches_the_named_forms_under_jit():
    h = jnp.asarray(H[::400])
    phi = jax.jit(nonlinearities.apply_jax)
    dphi = jax.jit(nonlinearities.derivative_apply_jax)
    for name in nonlinearities.NONLINEARITIES:
        code = nonlinearities.index(name)
        nl = nonlinearities.get(name)
        # float32 (h is cast): jit may fuse (and so round) differently from eager mode, a few ulps of
        # eps = 1.2e-7; a wrong branch differs by O(1)
        np.testing.assert_allclose(np.asarray(phi(code, h)), np.asarray(nl.jax(h)), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(np.asarray(dphi(code, h)), np.asarray(nl.derivative_jax(h)), rtol=1e-6, atol=1e-7)
    # a different nonlinearity is told apart (the dispatch is not stuck on one branch)
    assert not np.allclose(np.asarray(phi(nonlinearities.index("relu"), h)), np.asarray(phi(nonlinearities.index("silu"), h)))


@pytest.mark.parametrize("bad", ["tanh", "ReLU", 3, None])
def test_unknown_name_is_a_clear_error(bad):
    with pytest.raises(ValueError, match=r"layer: `nonlinearity` must be one of 'linear', 'relu'.*got"):
        nonlinearities.get(bad, where="layer")
    with pytest.raises(ValueError, match=r"`nonlinearity` must be one of"):
        nonlinearities.index(bad)
