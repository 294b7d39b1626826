"""Implicit gradients (003 Theorem 1) against unrolled backprop and finite differences, float64."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deqlab import ensembles
from deqlab.backward import (
    GMRES,
    BackwardWarning,
    Implicit,
    Phantom,
    Unrolled,
    adjoint_solve,
    check_gradients,
    fixed_point,
)
from deqlab.solvers import Anderson, Picard, Result, SolverError

# Gradients against finite differences and closed forms to ~1e-10: float64 (tests/conftest.py).
# The float32 paths are tested with explicitly float32 arrays (x64 on still honours them).
pytestmark = pytest.mark.float64

# Tolerance of the gradient checks (the requirement). With solves to 1e-12 relative
# residual and central differences at eps = 1e-6 in float64, the finite-difference error is
# ~eps^2 * |L'''| + 1e-16 / eps ~ 1e-10 relative, far inside this bound; a wrong adjoint (e.g. J
# instead of J^T, or a missing term) gives O(1) errors.
GRADIENT_RTOL = 1e-6


def tanh_map(z, w, u, b, x):
    return jnp.tanh(z @ w.T + x @ u.T + b)


@jax.jit
def _random_contractive_problem(contraction, seed, n=7):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    a = jax.random.normal(keys[0], (n, n))
    w = contraction * a / jnp.linalg.norm(a, 2)
    u = jax.random.normal(keys[1], (n, 3)) / np.sqrt(3)
    b = 0.1 * jax.random.normal(keys[2], (n,))
    x = jax.random.normal(keys[3], (2, 3))
    return w, u, b, x


@pytest.mark.slow
@settings(deadline=None, max_examples=5, derandomize=True)
@given(
    contraction=st.floats(min_value=0.1, max_value=0.85),
    seed=st.integers(min_value=0, max_value=2**31 - 1),
)
def test_random_contractive_maps(contraction, seed):
    """Implicit, unrolled and finite-difference gradients agree on random contractive tanh maps."""
    # ||W||_2 = contraction < 1 and |tanh'| <= 1, so f is a contraction: a unique fixed point.
    # Hypothesis draws values, not shapes: every example runs the programs compiled for the
    # first (check_gradients compiles once per signature); sizes are covered elsewhere.
    # The problem is drawn by one jitted program whose inputs are the contraction and the seed.
    n = 7
    w, u, b, x = _random_contractive_problem(np.float64(contraction), np.uint32(seed))
    errors = check_gradients(tanh_map, np.zeros((2, n)), w, u, b, x, batch_axis=0, max_steps=400)
    assert errors["forward_residual"] <= 1e-12 and errors["adjoint_residual"] <= 1e-12
    assert errors["implicit_vs_unrolled"] <= GRADIENT_RTOL
    assert errors["implicit_vs_fd"] <= GRADIENT_RTOL
    assert errors["unrolled_vs_fd"] <= GRADIENT_RTOL


@pytest.mark.slow
@pytest.mark.parametrize("ensemble", list(ensembles.ENSEMBLES))
def test_tanh_deq_with_each_ensemble(ensemble):
    n, batch = 24, 3
    keys = jax.random.split(jax.random.PRNGKey(1), 4)
    w = ensembles.sample(ensemble, keys[0], n, 0.8 * ensembles.critical_scale(ensemble), jnp.float64)
    u = jax.random.normal(keys[1], (n, 5)) / np.sqrt(5)
    b = jnp.zeros(n)
    x = jax.random.normal(keys[2], (batch, 5))
    errors = check_gradients(tanh_map, jnp.zeros((batch, n)), w, u, b, x, batch_axis=0, max_steps=600)
    assert errors["implicit_vs_unrolled"] <= GRADIENT_RTOL, errors
    assert errors["implicit_vs_fd"] <= GRADIENT_RTOL, errors


@pytest.mark.slow
@pytest.mark.parametrize("backward_solver", ["picard", "broyden", "gmres"])
def test_backward_solvers_agree(backward_solver):
    n = 12
    keys = jax.random.split(jax.random.PRNGKey(2), 3)
    w = ensembles.sample("gaussian", keys[0], n, 0.6, jnp.float64)
    u = jnp.eye(n)
    b = jnp.zeros(n)
    x = jax.random.normal(keys[1], (n,))
    errors = check_gradients(tanh_map, jnp.zeros(n), w, u, b, x, backward=Implicit(solver=backward_solver))
    assert errors["implicit_vs_fd"] <= GRADIENT_RTOL, errors


@pytest.mark.slow
def test_linear_deq_gradient_matches_closed_form():
    """The implicit gradient of a linear DEQ equals its closed form."""
    # z* = (I - W)^-1 x, L = |z*|^2: dL/dx = 2 (I - W)^-T z*, dL/dW = 2 (I - W)^-T z* z*^T.
    n = 10
    w = ensembles.sample("orthogonal", jax.random.PRNGKey(3), n, 0.7, jnp.float64)
    x = jax.random.normal(jax.random.PRNGKey(4), (n,))

    def loss(w, x):
        sol = fixed_point(_linear_map, jnp.zeros(n), w, x, solver=Anderson(tol=1e-13, max_steps=500),
                          on_failure="ignore")
        return jnp.sum(sol.value**2), sol.result

    (gw, gx), result = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(w, x)  # one program
    assert int(result) == Result.SUCCESS
    w, x = np.asarray(w), np.asarray(x)  # the closed form by NumPy
    z = np.linalg.solve(np.eye(n) - w, x)
    adjoint = np.linalg.solve((np.eye(n) - w).T, 2 * z)
    np.testing.assert_allclose(gx, adjoint, rtol=1e-9)
    np.testing.assert_allclose(gw, np.outer(adjoint, z), rtol=1e-9)


@pytest.mark.slow
def test_phantom_gradient_approaches_implicit_with_more_steps():
    """Phantom gradients converge to the implicit one as their number of steps grows."""
    # Phantom gradients (k damped steps) converge to the implicit one as k grows.
    n = 16
    keys = jax.random.split(jax.random.PRNGKey(5), 2)
    w = ensembles.sample("orthogonal", keys[0], n, 0.5, jnp.float64)
    x = jax.random.normal(keys[1], (n,))
    f = lambda z, w, x: jnp.tanh(w @ z + x)  # noqa: E731

    def grad(w, backward):
        return jax.grad(lambda w: jnp.sum(fixed_point(f, jnp.zeros(n), w, x, solver=Anderson(tol=1e-12), backward=backward).value ** 2))(w)

    @jax.jit  # the implicit gradient and the three phantom ones: one program
    def grads(w):
        return grad(w, "implicit"), [grad(w, Phantom(steps=k, damping=1.0)) for k in (1, 5, 40)]

    exact, phantoms = grads(w)
    errors = [float(jnp.linalg.norm(g - exact) / jnp.linalg.norm(exact)) for g in phantoms]
    assert errors[0] > errors[1] > errors[2] and errors[2] < 1e-8


def _linear_map(z, w, x):
    # one function object for every test: fixed_point's compiled programs are keyed on it
    return w @ z + x


@functools.partial(jax.jit, static_argnums=0)
def _near_critical_arrays(n):
    w = ensembles.sample("orthogonal", jax.random.PRNGKey(6), n, 0.99, jnp.float64)
    x = jnp.ones(n)
    return w, x, jnp.linalg.solve(jnp.eye(n) - w, x)


def _near_critical_linear_deq(n=16):
    """z = W z + x with W orthogonal at 0.99: eigenvalues on a circle near 1, slow to solve (the
    arrays are built by one program)."""
    w, x, z_star = _near_critical_arrays(n)
    return n, w, x, _linear_map, z_star


# adjoint_solve by one compiled program per (solver, batch_axis); the failure policy is "ignore"
# (the tests read Solution.result), so nothing is reported from the program.
@functools.partial(jax.jit, static_argnames=("f", "solver"))
def _adjoint_solve_jit(z_star, args, cotangent, *, f, solver):
    return adjoint_solve(f, z_star, args, cotangent, solver=solver, on_failure="ignore")


@pytest.mark.slow
def test_adjoint_solve_reports_failure_and_backward_warns():
    """A starved adjoint solve reports its failure: in its result, by a callback warning, and as NaN."""
    # Near-critical linear map with a starved backward solve: the adjoint cannot converge in 3 steps.
    n, w, x, f, z_star = _near_critical_linear_deq()
    adjoint = _adjoint_solve_jit(z_star, (w, x), np.ones(n), f=f, solver=Picard(max_steps=3))
    assert int(adjoint.result) == Result.MAX_STEPS_REACHED and not bool(adjoint.converged)

    def loss(w, failure):
        sol = fixed_point(f, jnp.zeros(n), w, x, solver=Anderson(tol=1e-10, max_steps=3000),
                          backward=Implicit(solver="picard", max_steps=3), on_failure=failure)
        return jnp.sum(sol.value)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jax.block_until_ready(jax.jit(jax.grad(lambda w: loss(w, "callback")))(w))
    assert any(issubclass(c.category, BackwardWarning) for c in caught)
    assert bool(jnp.all(jnp.isnan(jax.jit(jax.grad(lambda w: loss(w, "nan")))(w))))


def test_gmres_adjoint_max_steps_bounds_operator_applications():
    """GMRES's max_steps bounds the operator applications of an adjoint solve."""
    # A 16-dimensional system with eigenvalues spread on a circle of radius 0.99: GMRES needs about
    # 16 Krylov vectors. With max_steps = 3 it may apply the operator at most 3 times (one restart
    # cycle of 3, not 3 cycles of 20 = 60 products, which would solve the system exactly).
    # (adjoint_solve under jit: one program per GMRES setting, max_steps being static.)
    n, w, x, f, z_star = _near_critical_linear_deq()
    starved = _adjoint_solve_jit(z_star, (w, x), np.ones(n), f=f, solver=GMRES(tol=1e-10, max_steps=3))
    assert int(starved.result) == Result.MAX_STEPS_REACHED
    enough = _adjoint_solve_jit(z_star, (w, x), np.ones(n), f=f, solver=GMRES(tol=1e-10, max_steps=40))
    assert int(enough.result) == Result.SUCCESS
    exact = np.linalg.solve((np.eye(n) - np.asarray(w)).T, np.ones(n))
    np.testing.assert_allclose(enough.value, exact, rtol=1e-8)


@pytest.mark.slow
def test_fixed_point_under_vmap_and_jit():
    """Gradients through fixed_point under jit(vmap(grad)) equal the per-sample eager ones."""
    n = 8
    keys = jax.random.split(jax.random.PRNGKey(7), 4)
    # the draws by one program, indexed on the host (no eager programs besides the gradients)
    ws = np.asarray(jax.jit(jax.vmap(lambda k: ensembles.sample("goe", k, n, 0.3, jnp.float64)))(keys))
    x = np.ones(n)

    def loss(w):
        return jnp.sum(fixed_point(lambda z, w, x: jnp.tanh(w @ z + x), jnp.zeros(n), w, x, solver=Anderson(tol=1e-12)).value ** 2)

    batched = jax.jit(jax.vmap(jax.grad(loss)))(ws)
    for i in range(4):
        np.testing.assert_allclose(batched[i], jax.grad(loss)(ws[i]), rtol=1e-10)


@pytest.mark.slow
def test_implicit_memory_is_flat_in_iterations_and_unrolled_grows():
    # Compiled temporary memory of a gradient: unrolled stores every iterate, implicit does not.
    n, batch = 64, 32
    w = ensembles.sample("orthogonal", jax.random.PRNGKey(8), n, 0.9, jnp.float64)
    x = jnp.ones((batch, n))
    f = lambda z, w, x: jnp.tanh(z @ w.T + x)  # noqa: E731

    def temp_bytes(backward, steps):
        grad = jax.grad(lambda w: jnp.sum(fixed_point(f, jnp.zeros((batch, n)), w, x, solver=Picard(max_steps=steps), backward=backward, batch_axis=0).value ** 2))
        return jax.jit(grad).lower(w).compile().memory_analysis().temp_size_in_bytes

    implicit_10, implicit_100 = temp_bytes("implicit", 10), temp_bytes("implicit", 100)
    unrolled_10, unrolled_100 = temp_bytes("unrolled", 10), temp_bytes("unrolled", 100)
    # The trace of residuals (max_steps x batch floats) is the only part that grows: 90 * 32 * 8 B.
    assert implicit_100 - implicit_10 <= 2 * 90 * batch * 8
    # Unrolled keeps at least one (batch x n) iterate per step.
    assert unrolled_100 - unrolled_10 >= 90 * batch * n * 8


@pytest.mark.parametrize(
    "argument,kwargs",
    [
        ("`backward`", lambda: dict(backward="adjoint")),
        ("Phantom: `steps`", lambda: dict(backward=Phantom(steps=0))),
        ("Phantom: `damping`", lambda: dict(backward=Phantom(damping=1.5))),
        ("`solver`", lambda: dict(backward=Implicit(solver="cg"))),
        ("Implicit: `tol`", lambda: dict(backward=Implicit(tol=-1.0))),
        ("Implicit: `max_steps`", lambda: dict(backward=Implicit(max_steps=0))),
        ("fixed_point: `on_failure`", lambda: dict(backward=Unrolled(), on_failure=None)),
    ],
)
def test_bad_fixed_point_arguments(argument, kwargs, compile_counter):
    # The message names the argument as the user wrote it (the object's field, not a flat keyword),
    # and the error comes before anything is traced or compiled.
    z0, a = np.zeros(3, np.float32), np.ones(3, np.float32)
    with compile_counter() as counted, pytest.raises(ValueError, match=argument):
        fixed_point(lambda z, a: 0.5 * z + a, z0, a, **kwargs())
    assert counted.programs == 0


@pytest.mark.parametrize("argument,kwargs", [("directions", dict(directions=0)), ("eps", dict(eps=-1.0))])
def test_bad_check_gradients_arguments(argument, kwargs, compile_counter):
    z0, a = np.zeros(3, np.float32), np.ones(3, np.float32)
    with compile_counter() as counted, pytest.raises(ValueError, match=argument):
        check_gradients(lambda z, a: 0.5 * z + a, z0, a, **kwargs)
    assert counted.programs == 0


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _contractive_arrays(dtype, n, batch, seed):
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    w = ensembles.sample("orthogonal", keys[0], n, 0.8, jnp.float64)
    u = jax.random.normal(keys[1], (n, n)) / np.sqrt(n)
    x = jax.random.normal(keys[2], (batch, n))
    return jnp.zeros((batch, n), dtype), tuple(a.astype(dtype) for a in (w, u, x))


def _contractive_map(z, w, u, x):
    return jnp.tanh(z @ w.T + x @ u.T)


def _contractive_tanh(dtype, n=16, batch=4, seed=30):
    return (_contractive_map, *_contractive_arrays(dtype, n, batch, seed))  # the arrays by one program


@functools.partial(jax.jit, static_argnums=0)
def _dense_reference_gradient(f, z0, args):
    """The implicit-function-theorem gradient of sum(z*^2) in w by dense linear algebra."""
    z_star = fixed_point(f, z0, *args, solver=Anderson(tol=1e-14, max_steps=1000), batch_axis=0).value
    w, u, x = args
    pre = z_star @ w.T + x @ u.T
    slope = 1 - jnp.tanh(pre) ** 2
    reference = jnp.zeros_like(w)
    for b in range(z_star.shape[0]):
        jac = slope[b][:, None] * w
        adjoint = jnp.linalg.solve(jnp.eye(w.shape[0]) - jac.T, 2 * z_star[b])
        reference = reference + jnp.outer(adjoint * slope[b], z_star[b])
    return reference


@pytest.mark.slow
@pytest.mark.parametrize("dtype,bound", [(jnp.float64, 1e-8), (jnp.float32, 1e-3)])
def test_gradient_at_default_settings_in_each_dtype(dtype, bound):
    """At default settings the implicit gradient is within its dtype's bound of the exact one."""
    # No tol anywhere: float64 solves to 1e-10 (implicit gradient within ~1e-8 of the exact one),
    # float32 to 1e-5. Reference: the implicit-function-theorem gradient by dense linear algebra
    # in float64, (I - J^T) u = dL/dz*. A float32 gradient is bounded by its solves: 1e-5 relative
    # residuals amplified by 1 / (1 - 0.8) and float32 rounding of a 16 x 16 problem, ~1e-4.
    # (The gradient and the reference are jitted: one program each.)
    f, z0, args = _contractive_tanh(dtype)
    grad = jax.jit(jax.grad(lambda w: jnp.sum(fixed_point(f, z0, w, *args[1:], batch_axis=0).value ** 2)))(args[0])
    f64, z64, a64 = _contractive_tanh(jnp.float64)
    reference = _dense_reference_gradient(f64, z64, a64)
    error = float(jnp.linalg.norm(grad.astype(jnp.float64) - reference) / jnp.linalg.norm(reference))
    assert error <= bound, error


@pytest.mark.slow
def test_unrolled_anderson_in_float32_has_finite_gradients_and_nan_is_never_small():
    """Unrolled and implicit float32 gradients through Anderson are finite and right at an exact
    fixed point, and check_gradients reports a NaN gradient as a NaN error, never a small one."""
    # 0.5 tanh(z) + x reaches f(z) = z exactly in float32; differentiating Anderson's mixing at a
    # zero residual used to give NaN, and check_gradients reported max(0.0, nan) = 0.0 for it.
    # (The two float32 gradients and the float64 reference are one jitted program.)
    f = lambda z, x: 0.5 * jnp.tanh(z) + x  # noqa: E731
    x = np.float32(0.3)

    @jax.jit
    def gradients_and_exact(x):
        grads = [jax.grad(lambda x: fixed_point(f, jnp.zeros((), jnp.float32), x, backward=backward,
                                                solver=Anderson(tol=1e-6, max_steps=200)).value)(x)
                 for backward in ("unrolled", "implicit")]
        z = fixed_point(f, jnp.zeros(()), jnp.float64(0.3), solver=Anderson(tol=1e-14)).value
        return grads, 1 / (1 - 0.5 * (1 - jnp.tanh(z) ** 2))  # dz*/dx = (1 - f_z)^-1

    grads, exact = gradients_and_exact(x)
    for g in grads:  # unrolled, implicit
        assert g.dtype == jnp.float32
        assert bool(jnp.isfinite(g)) and abs(float(g) - float(exact)) <= 1e-5
    errors = check_gradients(f, np.zeros((), np.float32), x)
    assert all(np.isfinite(v) for v in errors.values()), errors
    # A gradient that is NaN gives a NaN error: sqrt at 0 has an infinite derivative.
    errors = check_gradients(lambda z, a: 0.5 * z + jnp.sqrt(a), np.zeros(()), np.float64(0.0))
    assert np.isnan(errors["implicit_vs_fd"]) and np.isnan(errors["unrolled_vs_fd"])


@pytest.mark.slow  # the probe table covers each mode x policy quickly
@pytest.mark.parametrize("mode", [Implicit, Unrolled, lambda **k: Phantom(steps=3, **k)])
def test_forward_failure_is_signalled_by_every_backward(mode):
    # max_steps = 3 on an orthogonal 0.99 map cannot reach 1e-10: the forward solve fails, so the
    # value and its gradient are not the equilibrium's. Each policy says so its own way.
    n, w, x, f, _ = _near_critical_linear_deq()

    def loss(w, policy):
        return jnp.sum(fixed_point(f, jnp.zeros(n), w, x, solver=Picard(tol=1e-10, max_steps=3),
                                   backward=mode(), on_failure=policy).value)

    # called eagerly, "warn" warns from Python after the call
    with pytest.warns(BackwardWarning, match="forward solve did not converge"):
        fixed_point(f, jnp.zeros(n), w, x, solver=Picard(tol=1e-10, max_steps=3), backward=mode())
    for run in (jax.value_and_grad, lambda g: jax.jit(jax.value_and_grad(g))):
        # a gradient traces fixed_point: "callback" warns from inside the program
        with pytest.warns(BackwardWarning, match="forward solve did not converge"):
            jax.block_until_ready(run(lambda w: loss(w, "callback"))(w))
            jax.effects_barrier()
        # "nan": the loss is NaN, and no gradient flows through the failed sample's value
        value, grad = run(lambda w: loss(w, "nan"))(w)
        assert bool(jnp.isnan(value)) and bool(jnp.all(grad == 0))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for policy in ("ignore", "warn"):  # nothing inside the program for either
                assert bool(jnp.all(jnp.isfinite(run(lambda w: loss(w, policy))(w)[1])))
                jax.effects_barrier()
    with pytest.raises(SolverError, match="forward solve failed for 1/1 samples"):
        fixed_point(f, jnp.zeros(n), w, x, solver=Picard(tol=1e-10, max_steps=3), backward=mode(), on_failure="raise")
    # Inside jit the error comes back from the host callback, wrapped by JAX, with the same text
    # (the implicit mode's adjoint, starved by the same 3 steps, may be the one that reports).
    with pytest.raises(Exception, match=r"(forward|adjoint) solve failed for 1/1 samples"):
        jax.block_until_ready(jax.jit(jax.grad(lambda w: loss(w, "raise")))(w))


def test_singular_adjoint_with_gmres_warns_instead_of_crashing():
    """A singular adjoint system solved by GMRES warns from the callback instead of crashing."""
    # f(z) = z + tanh(x) has J = I: the adjoint system (I - J^T) u = g is singular. GMRES returns
    # NaN or garbage; the warning path used to crash on int(nan) in a host callback.
    # (The gradient is jitted: one program; "callback" warns from inside it as from an eager grad.)
    f = lambda z, x: z * 1.0 + 0.0 * jnp.tanh(x)  # noqa: E731
    with pytest.warns(BackwardWarning, match="adjoint solve did not converge"):
        g = jax.jit(jax.grad(lambda x: jnp.sum(fixed_point(f, jnp.ones(3), x, backward=Implicit(solver="gmres"),
                                                           on_failure="callback").value ** 2)))(np.ones(3))
        jax.block_until_ready(g)
        jax.effects_barrier()
    assert g.shape == (3,)


def test_closed_over_parameters_get_implicit_gradients():
    # f closes over w, which is being differentiated: jax.custom_vjp alone raises an
    # UnexpectedTracerError; fixed_point hoists w into an argument (jax.closure_convert).
    n, w, x, _, _ = _near_critical_linear_deq(8)
    w = 0.5 * w

    def closed(w):
        return jnp.sum(fixed_point(lambda z, x: w @ z + x, jnp.zeros(n), x, solver=Anderson(tol=1e-13)).value ** 2)

    def explicit(w):
        return jnp.sum(fixed_point(lambda z, w, x: w @ z + x, jnp.zeros(n), w, x, solver=Anderson(tol=1e-13)).value ** 2)

    np.testing.assert_allclose(jax.grad(closed)(w), jax.grad(explicit)(w), rtol=1e-10)
    np.testing.assert_allclose(jax.jit(jax.grad(closed))(w), jax.grad(explicit)(w), rtol=1e-10)


def test_aux_output_is_differentiable():
    # aux = sum(z_next) at z*: its gradient equals that of sum(z*), through z* implicitly.
    f = lambda z, a: (jnp.tanh(a * z) + 1.0, jnp.sum(jnp.tanh(a * z) + 1.0))  # noqa: E731
    g_aux = jax.grad(lambda a: fixed_point(f, jnp.zeros(4), a, has_aux=True, solver=Anderson(tol=1e-13)).aux)(0.5)
    g_val = jax.grad(lambda a: jnp.sum(fixed_point(lambda z, a: f(z, a)[0], jnp.zeros(4), a, solver=Anderson(tol=1e-13)).value))(0.5)
    np.testing.assert_allclose(g_aux, g_val, rtol=1e-9)


@pytest.mark.slow
def test_backward_names_are_shortcuts_for_the_objects():
    f = lambda z, a: jnp.tanh(a * z) + 1.0  # noqa: E731
    for name, obj in (("implicit", Implicit()), ("unrolled", Unrolled()), ("phantom", Phantom())):
        by_name = jax.grad(lambda a: jnp.sum(fixed_point(f, jnp.zeros(4), a, backward=name).value))(0.5)
        by_object = jax.grad(lambda a: jnp.sum(fixed_point(f, jnp.zeros(4), a, backward=obj).value))(0.5)
        assert float(by_name) == float(by_object)
    with pytest.raises(ValueError, match="`cotangent` must have the structure and shapes"):
        adjoint_solve(f, jnp.ones(4), (0.5,), jnp.ones(3))


def _tanh_of_affine(z, w, x):
    return jnp.tanh(w @ z + x)


FORWARD_MODE_EPS = 1e-5


@functools.partial(jax.jit, static_argnums=0)
def _forward_mode_inputs(n):
    w = 0.4 * jax.random.normal(jax.random.PRNGKey(0), (n, n)) / jnp.sqrt(n)
    x = jax.random.normal(jax.random.PRNGKey(1), (n,))
    direction = jax.random.normal(jax.random.PRNGKey(2), (n,))
    return w, x, direction


@jax.jit
def _forward_mode_derivatives(w, x, direction):
    """Every derivative the test below compares, in one program: central differences of z* along
    ``direction``, jvp tangents (implicit adjoint and GMRES), jacfwd, jacrev, the hessian of
    sum(z*^3) and its central differences of the gradient; and the results of the forward solves
    the finite differences use."""
    n, eps = x.shape[0], FORWARD_MODE_EPS
    solver = Anderson(tol=1e-12)

    def solution(x, backward="implicit"):
        return fixed_point(_tanh_of_affine, jnp.zeros(n), w, x, solver=solver, backward=backward,
                           on_failure="ignore")

    def z_star(x, backward="implicit"):
        return solution(x, backward).value

    plus, minus = solution(x + eps * direction), solution(x - eps * direction)
    central = (plus.value - minus.value) / (2 * eps)
    tangents = [jax.jvp(lambda x: z_star(x, backward), (x,), (direction,))[1]
                for backward in ("implicit", Implicit(solver="gmres"))]
    forward, reverse = jax.jacfwd(z_star)(x), jax.jacrev(z_star)(x)

    loss = lambda x: jnp.sum(z_star(x) ** 3)  # noqa: E731
    hessian = jax.hessian(loss)(x)
    grad = jax.vmap(jax.grad(loss))
    basis = jnp.eye(n)
    central_hessian = (grad(x + eps * basis) - grad(x - eps * basis)) / (2 * eps)
    return dict(central=central, tangents=tangents, forward=forward, reverse=reverse, hessian=hessian,
                central_hessian=central_hessian, results=jnp.stack([plus.result, minus.result]))


@jax.jit
def _starved_tangent(w, x):
    # the policy that warns from inside programs, here from the tangent solve of a jvp
    def z_star(x):
        return fixed_point(_linear_map, jnp.zeros_like(x), w, x, solver=Anderson(tol=1e-10, max_steps=3000),
                           backward=Implicit(solver="picard", max_steps=3), on_failure="callback").value

    return jax.jvp(z_star, (x,), (x,))


def test_forward_mode_through_the_implicit_rule():
    """jax.jvp, jax.jacfwd and jax.hessian go through fixed_point's implicit rule (one custom_jvp
    whose linear solve JAX transposes for reverse mode) and match central finite differences and
    reverse mode; the tangent solve's failures are reported like the adjoint's.

    Tolerances: solves to 1e-12 relative residual (Anderson, contraction about 0.4) and central
    differences at eps = 1e-5: truncation ~ eps^2 |z'''| ~ 1e-10, and each solve's error
    ~ 1e-12 / (1 - 0.4) divided by eps ~ 2e-7 at worst, hence atol 1e-6 against finite
    differences; forward and reverse mode solve the same linear systems to 1e-12 (rtol 1e-9).
    Every derivative is computed by one jitted program (the finite differences of the gradient
    vmapped over the basis directions), the starved tangent solve by a second."""
    w, x, direction = _forward_mode_inputs(5)
    out = _forward_mode_derivatives(w, x, direction)
    assert np.all(np.asarray(out["results"]) == Result.SUCCESS)
    central = out["central"]
    for tangent in out["tangents"]:  # the implicit adjoint solver, then GMRES
        np.testing.assert_allclose(tangent, central, atol=1e-6)
    forward = out["forward"]
    np.testing.assert_allclose(forward, out["reverse"], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(forward @ direction, central, atol=1e-6)

    hessian = out["hessian"]
    np.testing.assert_allclose(hessian, out["central_hessian"], atol=1e-6)
    np.testing.assert_allclose(hessian, hessian.T, atol=1e-9)

    # a starved tangent solve is reported, with the policy that warns from inside programs
    _, w_critical, x_critical, _, _ = _near_critical_linear_deq()
    with pytest.warns(BackwardWarning, match="tangent solve did not converge"):
        jax.block_until_ready(_starved_tangent(w_critical, x_critical))
        jax.effects_barrier()


@functools.partial(jax.jit, static_argnums=0)
def _orthogonal_and_inputs(n):
    q = jnp.linalg.qr(jax.random.normal(jax.random.PRNGKey(0), (n, n)))[0]
    return q, jax.random.normal(jax.random.PRNGKey(1), (3, n))


def test_gmres_adjoint_of_a_sample_does_not_depend_on_its_neighbours():
    """Each sample's linear solve is its own (vmap, not one Krylov space for the batch): with a
    budget too small for the hard sample, sample 0's gradient is the same, to rounding, whether its
    neighbour is easy or hard (a batched GMRES changed it by 3e-4 relative here)."""
    n = 16
    q, x = _orthogonal_and_inputs(n)
    f = lambda z, w, s, x: jnp.tanh(s[:, None] * (z @ w.T) + x)  # noqa: E731
    backward = Implicit(solver=GMRES(restart=4, max_steps=8, tol=1e-12))

    @jax.jit  # one program: the scales are its input
    def first_sample_gradient(scales):
        def loss(x):
            sol = fixed_point(f, jnp.zeros_like(x), q, scales, x, solver=Anderson(tol=1e-12, max_steps=500),
                              batch_axis=0, backward=backward, on_failure="ignore")
            return jnp.sum(sol.value ** 2)
        return jax.grad(loss)(x)[0]  # dL/dx_0 depends on sample 0's adjoint alone

    easy = first_sample_gradient(np.array([0.3, 0.3, 0.3]))
    hard = first_sample_gradient(np.array([0.3, 0.3, 0.995]))
    np.testing.assert_allclose(hard, easy, rtol=1e-12, atol=1e-15)


@functools.partial(jax.jit, static_argnums=0)
def _orthogonal_sample(n):
    return ensembles.sample("orthogonal", jax.random.PRNGKey(8), n, 1.0, jnp.float64)


def test_check_gradients_compiles_once_per_signature():
    """A second check of the same f at the same shapes (new values) compiles no program."""
    from deqlab.backward import check as check_module

    n = 4
    w = 0.5 * np.asarray(_orthogonal_sample(n))  # NumPy inputs: no eager programs around the checks
    programs = (check_module._gradient, check_module._unrolled_value, check_module._residuals)
    first = check_gradients(tanh_map, np.zeros(n), w, np.eye(n), np.zeros(n), np.ones(n), directions=1)
    sizes = [program._cache_size() for program in programs]
    second = check_gradients(tanh_map, np.zeros(n), 0.9 * w, np.eye(n), np.zeros(n), -np.ones(n), directions=1)
    assert [program._cache_size() for program in programs] == sizes
    assert first["implicit_vs_fd"] <= GRADIENT_RTOL and second["implicit_vs_fd"] <= GRADIENT_RTOL


SCALE = 0.3


def _global_scale_map(z, x):
    return jnp.tanh(SCALE * z + x)


def test_check_gradients_is_not_stale_after_a_global_it_reads_is_rebound(monkeypatch):
    """The compiled programs are keyed on what f reads: rebinding a global changes the result."""
    x = np.linspace(-1.0, 1.0, 3)  # NumPy inputs: no eager programs around the checks
    before = check_gradients(_global_scale_map, np.zeros(3), x, directions=1)
    monkeypatch.setitem(globals(), "SCALE", 0.9)
    after = check_gradients(_global_scale_map, np.zeros(3), x, directions=1)
    # the forward residual is that of the solve of the new map: the old program would solve the old
    # map and report the same numbers
    assert before != after
    assert after["implicit_vs_fd"] <= GRADIENT_RTOL
