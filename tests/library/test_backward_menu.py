"""The gradient-method menu of deqlab.backward: Jacobian-free (Fung et al. 2022) and SHINE (Ramzi
et al. 2022) beside the implicit, unrolled and phantom backward passes.

On a linear map f(z, b) = A z + b the gradient of L = <c, z*> with respect to b is the adjoint
u = (I - A^T)^{-1} c exactly, so each method's gradient has a closed form: Jacobian-free gives c,
a phantom with k undamped steps the truncated Neumann series sum_{i<k} (A^T)^i c, and SHINE -B^T c
with B the forward Broyden's inverse estimate.
"""

import functools

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
from deqlab.solvers import Broyden, Result, get_solver

# Each method is checked against its closed form to ~1e-10: float64 (tests/conftest.py).
pytestmark = pytest.mark.float64

N = 12


def _linear_map(z, a, b):
    return a @ z + b


@jax.jit
def _draw():
    a = jax.random.normal(jax.random.key(0), (N, N)) / np.sqrt(N)
    c = jax.random.normal(jax.random.key(1), (N,))
    b = jax.random.normal(jax.random.key(2), (N,))
    return a, b, c


@pytest.fixture(scope="module")
def linear():
    """A, b, c and the exact adjoint (I - A^T)^{-1} c, in float64 (module-scoped: built once, with
    x64 on, since every test of this module is float64)."""
    a, b, c = (np.asarray(v) for v in _draw())  # one program for the three draws
    a = 0.6 * a / np.linalg.norm(a, 2)  # ||A|| = 0.6: every method's forward solve converges
    exact = np.linalg.solve(np.eye(N) - np.asarray(a).T, np.asarray(c))
    return a, b, c, exact


def _forward_solver(solver):
    return get_solver(solver, tol=1e-13, max_steps=300)


# One compiled program per (backward modes, forward solver), shared by every test that uses it; A,
# b and c are traced arguments. The forward solve's failure policy is "ignore" and its result is
# returned, so that each caller asserts it converged (the closed forms hold at the fixed point).
@functools.partial(jax.jit, static_argnames=("backwards", "solver"))
def _grads_b(a, b, c, backwards, solver="anderson"):
    """dL/db of L = <c, z*> under each mode of ``backwards``, and each forward solve's result."""
    def loss(b, backward):
        sol = fixed_point(_linear_map, jnp.zeros(N), a, b, solver=_forward_solver(solver), backward=backward,
                          on_failure="ignore")
        return jnp.vdot(c, sol.value), sol.result

    grads, results = zip(*(jax.grad(loss, has_aux=True)(b, backward) for backward in backwards))
    return jnp.stack(grads), jnp.stack(results)


def _grad_b(a, b, c, backward, solver="anderson"):
    return _grads_of(a, b, c, (backward,), solver)[0]


def _grads_of(a, b, c, backwards, solver="anderson"):
    grads, results = _grads_b(a, b, c, tuple(backwards), solver)
    assert np.all(np.asarray(results) == Result.SUCCESS), results
    return np.asarray(grads)


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


@jax.jit
def _shine_pieces(a, b, c):
    """The forward Broyden solve's history and result, and SHINE's tangent of z* along c, in one
    program (Broyden(m=40), as in the gradient of the test below)."""
    solver = _forward_solver(Broyden(m=40))
    sol = fixed_point(_linear_map, jnp.zeros(N), a, b, solver=solver, backward="implicit", on_failure="ignore")
    us, vs, count = sol.state.history[:3]
    tangent = jax.jvp(lambda b: fixed_point(_linear_map, jnp.zeros(N), a, b, solver=solver, backward=SHINE(),
                                            on_failure="ignore").value, (b,), (c,))[1]
    return us, vs, count, sol.result, tangent


def test_shine_applies_the_forward_broyden_estimate(linear):
    """SHINE's gradient is -B^T c with B rebuilt from the forward solve's own history, and its
    tangent (forward mode, through the shared rule) is -B c."""
    a, b, c, exact = linear
    solver = Broyden(m=40)
    us, vs, count, result, tangent = _shine_pieces(a, b, c)
    assert int(result) == Result.SUCCESS
    us, vs, count = np.asarray(us), np.asarray(vs), np.asarray(count)  # indexed on the host: no programs
    used = (np.arange(solver.m) < int(count[0])).astype(float)
    b_matrix = -np.eye(N) + np.einsum("id,i,ie->de", us[0], used, vs[0])
    g = _grad_b(a, b, c, SHINE(), solver=solver)
    np.testing.assert_allclose(g, -b_matrix.T @ np.asarray(c), rtol=1e-9, atol=1e-12)
    # the estimate is informative: closer to the exact adjoint than the Jacobian-free one
    assert np.linalg.norm(g - exact) < np.linalg.norm(np.asarray(c) - exact)
    # forward mode through the shared rule: the tangent of z* along c is -B c (B, not B^T)
    np.testing.assert_allclose(tangent, -b_matrix @ np.asarray(c), rtol=1e-9, atol=1e-12)


def test_shine_refine_converges_to_the_exact_gradient(linear):
    """SHINE's refine steps take its gradient to the exact one (the three refinements are one program)."""
    a, b, c, exact = linear
    grads = _grads_of(a, b, c, [SHINE(refine=k) for k in (0, 5, 60)], solver="broyden")
    errors = [np.linalg.norm(g - exact) for g in grads]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-10 * np.linalg.norm(exact)


def _scalar_map(z, a):
    return jnp.tanh(a * z + 0.3)


@jax.jit
def _scalar_grads(a):
    """The gradient of sum(z*^2) for the implicit, SHINE and Jacobian-free modes (one program), and
    each forward solve's result."""
    def loss(a, backward):
        # m >= max_steps: no restart of the history (a restart starts the estimate again from -I)
        sol = fixed_point(_scalar_map, jnp.zeros((5, 1)), a, solver=Broyden(m=100, tol=1e-12, max_steps=100),
                          batch_axis=0, backward=backward, on_failure="ignore")
        return jnp.sum(sol.value ** 2), sol.result

    return [jax.grad(loss, has_aux=True)(a, backward) for backward in (Implicit(), SHINE(), JacobianFree())]


def test_shine_is_exact_in_one_dimension():
    """For scalar equilibria (one per sample) Broyden's secant slope converges to g'(z*), so
    SHINE's adjoint -B c tends to the exact c / (1 - f'(z*)) as the forward solve converges."""
    a = np.linspace(0.2, 0.8, 5)[:, None]
    (exact, r_exact), (shine, r_shine), (jacobian_free, r_free) = _scalar_grads(a)
    for result in (r_exact, r_shine, r_free):
        assert np.all(np.asarray(result) == Result.SUCCESS), result
    # the last secant is taken over the last step, |dz| ~ 1e-6 here: its slope is off by about that
    np.testing.assert_allclose(shine, exact, rtol=1e-4)
    assert not np.allclose(jacobian_free, exact, rtol=1e-2)


def _batched_map(z, a, b):
    return z @ a.T + b


@functools.partial(jax.jit, static_argnames=("backward", "solver"))
def _batched_grad(a, bs, c, backward, solver):
    def loss(bs):
        # tol 1e-6, not 1e-13: near machine precision the last secants amplify rounding, which
        # differs between batch sizes (XLA's kernels); a sample mixing with another would show at O(1)
        sol = fixed_point(_batched_map, jnp.zeros(bs.shape), a, bs,
                          solver=get_solver(solver, tol=1e-6, max_steps=300),
                          batch_axis=0, backward=backward, on_failure="ignore")
        return jnp.sum(sol.value @ c), sol.result

    return jax.grad(loss, has_aux=True)(bs)


def test_batched_and_jitted_methods_agree_with_per_sample(linear):
    """Under jit, a batch's Jacobian-free and SHINE gradients are each sample's own, computed
    alone (one program per mode and batch size, the four samples reuse the size-1 one)."""
    a, _, c, _ = linear
    bs = np.asarray(jax.random.normal(jax.random.key(3), (4, N)))
    for backward in (JacobianFree(), SHINE(refine=2)):
        solver = "broyden" if isinstance(backward, SHINE) else "anderson"
        batched, result = _batched_grad(a, bs, c, backward, solver)
        assert np.all(np.asarray(result) == Result.SUCCESS), result
        # one sample at a time, same map: SHINE's estimate is each sample's own history, which a
        # batch keeps per sample (the pair counter is shared, the pairs are frozen at convergence)
        singles = [_batched_grad(a, bs[i:i + 1], c, backward, solver) for i in range(4)]
        assert all(np.all(np.asarray(r) == Result.SUCCESS) for _, r in singles)
        single = np.concatenate([np.asarray(g) for g, _ in singles])
        np.testing.assert_allclose(batched, single, rtol=1e-7, atol=1e-9)


def test_names_and_errors(compile_counter):
    """The menu's names map to the modes, and bad settings raise before anything is compiled."""
    assert isinstance(get_backward("jacobian_free"), JacobianFree)
    assert isinstance(get_backward("shine"), SHINE)
    assert set(BACKWARDS) == {"implicit", "unrolled", "phantom", "jacobian_free", "shine"}
    with pytest.raises(ValueError, match="`steps` and `damping` are fixed at 1"):
        JacobianFree(steps=2)
    with pytest.raises(ValueError, match="refine"):
        SHINE(refine=-1)
    with pytest.raises(TypeError, match="`on_failure` is no longer a setting of the backward mode"):
        SHINE(on_failure="nan")
    with compile_counter() as counted, pytest.raises(ValueError, match="`solver`.*broyden"):
        fixed_point(lambda z, b: 0.5 * z + b, np.zeros(3), np.ones(3), solver="anderson", backward="shine")
    assert counted.programs == 0
