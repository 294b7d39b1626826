"""The gradient-method menu of deqlab.backward: Jacobian-free (Fung et al. 2022) and SHINE (Ramzi
et al. 2022) beside the implicit, unrolled and phantom backward passes.

On a linear map f(z, b) = A z + b the gradient of L = <c, z*> with respect to b is the adjoint
u = (I - A^T)^{-1} c exactly, so each method's gradient has a closed form: Jacobian-free gives c,
a phantom with k undamped steps the truncated Neumann series sum_{i<k} (A^T)^i c, and SHINE -B^T c
with B the forward Broyden's inverse estimate.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqlab.backward import (
    BACKWARDS,
    SHINE,
    Implicit,
    JacobianFree,
    Phantom,
    fixed_point,
    get_backward,
)
from deqlab.solvers import Broyden, get_solver

# Each method is checked against its closed form to ~1e-10: float64 (tests/conftest.py).
pytestmark = pytest.mark.float64

N = 12


@pytest.fixture
def linear():
    a = jax.random.normal(jax.random.key(0), (N, N)) / np.sqrt(N)
    a = 0.6 * a / np.linalg.norm(a, 2)  # ||A|| = 0.6: every method's forward solve converges
    c = jax.random.normal(jax.random.key(1), (N,))
    b = jax.random.normal(jax.random.key(2), (N,))
    exact = np.linalg.solve(np.eye(N) - np.asarray(a).T, np.asarray(c))
    return a, b, c, exact


def _grad_b(a, b, c, backward, solver="anderson"):
    f = lambda z, b: a @ z + b  # noqa: E731
    return jax.grad(lambda b: jnp.vdot(c, fixed_point(f, jnp.zeros(N), b, solver=get_solver(solver, tol=1e-13, max_steps=300), backward=backward).value))(b)


def test_implicit_is_the_exact_adjoint(linear):
    a, b, c, exact = linear
    np.testing.assert_allclose(_grad_b(a, b, c, Implicit()), exact, rtol=1e-9)


def test_jacobian_free_is_the_cotangent(linear):
    a, b, c, exact = linear
    g = _grad_b(a, b, c, JacobianFree())
    np.testing.assert_allclose(g, c, rtol=1e-12)
    # and it is not the exact gradient: the dropped Neumann terms are of the order of ||A||
    error = np.linalg.norm(g - exact) / np.linalg.norm(exact)
    assert 0.1 < error < 0.6 / (1 - 0.6) * np.linalg.norm(c) / np.linalg.norm(exact) + 1e-12


@pytest.mark.parametrize("k", [1, 3, 8])
def test_phantom_is_the_truncated_neumann_series(linear, k):
    a, b, c, _ = linear
    expected = sum(np.linalg.matrix_power(np.asarray(a).T, i) @ np.asarray(c) for i in range(k))
    np.testing.assert_allclose(_grad_b(a, b, c, Phantom(steps=k, damping=1.0)), expected, rtol=1e-10, atol=1e-12)


def test_jacobian_free_equals_one_step_phantom(linear):
    a, b, c, _ = linear
    np.testing.assert_array_equal(_grad_b(a, b, c, JacobianFree()), _grad_b(a, b, c, Phantom(steps=1, damping=1.0)))


def test_shine_applies_the_forward_broyden_estimate(linear):
    """SHINE's gradient is -B^T c with B rebuilt from the forward solve's own history."""
    a, b, c, exact = linear
    f = lambda z, b: a @ z + b  # noqa: E731
    solver = Broyden(m=40)
    sol = fixed_point(f, jnp.zeros(N), b, solver=get_solver(solver, tol=1e-13, max_steps=300), backward="implicit")
    us, vs, count = sol.state.history[:3]
    used = (np.arange(solver.m) < int(count[0])).astype(float)
    b_matrix = -np.eye(N) + np.einsum("id,i,ie->de", np.asarray(us[0]), used, np.asarray(vs[0]))
    g = _grad_b(a, b, c, SHINE(), solver=solver)
    np.testing.assert_allclose(g, -b_matrix.T @ np.asarray(c), rtol=1e-9, atol=1e-12)
    # the estimate is informative: closer to the exact adjoint than the Jacobian-free one
    assert np.linalg.norm(g - exact) < np.linalg.norm(np.asarray(c) - exact)
    # forward mode through the shared rule: the tangent of z* along c is -B c (B, not B^T)
    tangent = jax.jvp(lambda b: fixed_point(f, jnp.zeros(N), b, solver=get_solver(solver, tol=1e-13, max_steps=300),
                                            backward=SHINE()).value, (b,), (c,))[1]
    np.testing.assert_allclose(tangent, -b_matrix @ np.asarray(c), rtol=1e-9, atol=1e-12)


def test_shine_refine_converges_to_the_exact_gradient(linear):
    a, b, c, exact = linear
    errors = [np.linalg.norm(_grad_b(a, b, c, SHINE(refine=k), solver="broyden") - exact) for k in (0, 5, 60)]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-10 * np.linalg.norm(exact)


def test_shine_is_exact_in_one_dimension():
    """For scalar equilibria (one per sample) Broyden's secant slope converges to g'(z*), so
    SHINE's adjoint -B c tends to the exact c / (1 - f'(z*)) as the forward solve converges."""
    a = jnp.linspace(0.2, 0.8, 5)[:, None]

    def loss(a, backward):
        f = lambda z, a: jnp.tanh(a * z + 0.3)  # noqa: E731
        # m >= max_steps: no restart of the history (a restart starts the estimate again from -I)
        return jnp.sum(fixed_point(f, jnp.zeros((5, 1)), a, solver=Broyden(m=100, tol=1e-12, max_steps=100),
                                   batch_axis=0, backward=backward).value ** 2)

    exact = jax.grad(loss)(a, Implicit())
    shine = jax.grad(loss)(a, SHINE())
    # the last secant is taken over the last step, |dz| ~ 1e-6 here: its slope is off by about that
    np.testing.assert_allclose(shine, exact, rtol=1e-4)
    assert not np.allclose(jax.grad(loss)(a, JacobianFree()), exact, rtol=1e-2)


def test_batched_and_jitted_methods_agree_with_per_sample(linear):
    a, _, c, _ = linear
    bs = jax.random.normal(jax.random.key(3), (4, N))
    f = lambda z, b: z @ a.T + b  # noqa: E731
    for backward in (JacobianFree(), SHINE(refine=2)):
        solver = "broyden" if isinstance(backward, SHINE) else "anderson"

        def loss(bs, backward=backward, solver=solver):
            # tol 1e-6, not 1e-13: near machine precision the last secants amplify rounding, which
            # differs between batch sizes (XLA's kernels); a sample mixing with another would show at O(1)
            return jnp.sum(fixed_point(f, jnp.zeros(bs.shape), bs, solver=get_solver(solver, tol=1e-6, max_steps=300),
                                       batch_axis=0, backward=backward).value @ c)

        batched = jax.jit(jax.grad(loss))(bs)
        # one sample at a time, same map: SHINE's estimate is each sample's own history, which a
        # batch keeps per sample (the pair counter is shared, the pairs are frozen at convergence)
        single = jnp.concatenate([jax.grad(loss)(bs[i:i + 1]) for i in range(4)])
        np.testing.assert_allclose(batched, single, rtol=1e-7, atol=1e-9)


def test_names_and_errors():
    assert isinstance(get_backward("jacobian_free"), JacobianFree)
    assert isinstance(get_backward("shine"), SHINE)
    assert set(BACKWARDS) == {"implicit", "unrolled", "phantom", "jacobian_free", "shine"}
    with pytest.raises(ValueError, match="`steps` and `damping` are fixed at 1"):
        JacobianFree(steps=2)
    with pytest.raises(ValueError, match="refine"):
        SHINE(refine=-1)
    with pytest.raises(TypeError, match="`on_failure` is no longer a setting of the backward mode"):
        SHINE(on_failure="nan")
    with pytest.raises(ValueError, match="`solver`.*broyden"):
        fixed_point(lambda z, b: 0.5 * z + b, jnp.zeros(3), jnp.ones(3), solver="anderson", backward="shine")
