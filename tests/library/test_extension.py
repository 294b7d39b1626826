"""The extension points: a user-written deqlab.Solver and deqlab.backward.Backward, accepted by
solve, fixed_point and nn.DEQ, and solver objects as jit arguments (issue 15, item 3)."""

import dataclasses
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import deqlab
from deqlab.backward import (
    GMRES,
    Backward,
    Implicit,
    ImplicitRule,
    JacobianFree,
    Phantom,
    Unrolled,
    adjoint_solve,
)
from deqlab.nn import DEQ, TanhCell
from deqlab.solvers import Result, SolverState


class Damped(deqlab.Solver):
    def init(self, z, fz):
        return ()

    def propose(self, z, fz, state):
        return 0.5 * z + 0.5 * fz, state


class Counting(deqlab.Solver):
    """A solver with a field and a per-sample state, to check both travel through the loop."""

    beta: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        deqlab.checks.unit_interval(self.beta, "beta", "Counting")

    def init(self, z, fz):
        return jnp.zeros((), jnp.int32)  # one sample's counter (the loop stacks them)

    def propose(self, z, fz, state):
        return z + self.beta * (fz - z), state + 1


N = 6
W = (jax.random.normal(jax.random.key(0), (N, N)) * 0.5 / np.sqrt(N)).astype(jnp.float32)


def tanh_map(z, x):
    return jnp.tanh(z @ W.T + x)


def test_damped_solves_a_batch_in_float32():
    """A user's damped solver solves a float32 batch to a fixed point, with Picard(damping=0.5)'s steps.
    (The fixed-point check is NumPy: no eager programs besides the solves.)"""
    assert W.dtype == jnp.float32
    x = jax.random.normal(jax.random.key(1), (4, N), jnp.float32)
    z0 = jnp.zeros((4, N), jnp.float32)
    sol = deqlab.solve(tanh_map, z0, x, solver=Damped(tol=1e-6, max_steps=500), batch_axis=0)
    assert sol.value.dtype == jnp.float32
    np.testing.assert_array_equal(sol.result, Result.SUCCESS)
    assert np.all(np.asarray(sol.stats.best_residual) <= 1e-6)
    value = np.asarray(sol.value)
    np.testing.assert_allclose(np.tanh(value @ np.asarray(W).T + np.asarray(x)), value, atol=1e-5)
    # Damped returns its last accepted iterate (steps_past_convergence is False by default)
    assert sol.stats.steps.shape == (4,) and int(sol.stats.nfe) == int(np.max(np.asarray(sol.stats.steps))) + 1
    # it is a half-damped Picard: the same iterates as Picard(damping=0.5), one step behind
    picard = deqlab.solve(tanh_map, z0, x, solver=deqlab.Picard(damping=0.5, tol=1e-6, max_steps=500), batch_axis=0)
    np.testing.assert_array_equal(sol.stats.steps, picard.stats.steps)


class ShapeRecording(deqlab.Solver):
    """Damped Picard that records the shapes its hooks are traced with."""

    seen: typing.ClassVar[list] = []

    def init(self, z, fz):
        self.seen.append(("init", z.shape))
        return jnp.zeros((), jnp.int32)

    def propose(self, z, fz, state):
        self.seen.append(("propose", z.shape, jnp.shape(state)))
        return 0.5 * z + 0.5 * fz, state + 1


class BatchRecording(ShapeRecording):
    couples_samples = True

    def init(self, z, fz):
        self.seen.append(("init", z.shape))
        return jnp.zeros(z.shape[:1], jnp.int32)


def test_hooks_see_one_sample_unless_the_solver_couples_samples():
    """The loop applies init/propose to each (D,) row with vmap; couples_samples=True hands the
    solver the (B, D) batch instead. Both give each sample its own state and statistics."""
    x = jax.random.normal(jax.random.key(3), (4, N), jnp.float32)
    for solver, row in ((ShapeRecording(tol=1e-5), (N,)), (BatchRecording(tol=1e-5), (4, N))):
        solver.seen.clear()
        sol = deqlab.solve(tanh_map, jnp.zeros((4, N)), x, solver=solver, batch_axis=0)
        assert solver.seen[0] == ("init", row) and solver.seen[1][1] == row, solver.seen[:2]
        assert sol.state.history.shape == (4,)  # one counter per sample, stacked
        assert bool(sol.converged.all())


class Strict(deqlab.Picard):
    """Converged only at a hundredth of tol."""

    def terminate(self, tol, residual, error):
        return residual <= tol / 100


class ReturnsResidual(deqlab.Picard):
    def terminate(self, tol, residual, error):
        return residual


class BranchesInPython(deqlab.Picard):
    def terminate(self, tol, residual, error):
        return bool(residual <= tol)


class BatchWritten(deqlab.Solver):
    """A solver written for (B, D) rows, as before deqlab 0.9."""

    def init(self, z, fz):
        return ()

    def propose(self, z, fz, state):
        return fz / jnp.linalg.norm(fz, axis=1, keepdims=True), state


def test_terminate_decides_from_the_start_and_its_mistakes_are_named():
    """A custom terminate is the test at z0 too (a start within tol but not within tol / 100 takes
    a step); a terminate returning floats or branching in Python, a warm start from another
    history size and a solver written for (B, D) rows get messages naming the culprit."""
    x = jnp.ones((2, 3))
    f = lambda z, x: 0.5 * jnp.tanh(z) + x  # noqa: E731
    near = deqlab.solve(f, jnp.zeros((2, 3)), x, solver=deqlab.Picard(tol=1e-5), batch_axis=0)
    start = jnp.asarray(np.asarray(near.value) * np.float32(1 + 1e-6))  # relative residual ~1e-7..1e-6: within tol, not tol / 100
    assert int(np.max(np.asarray(deqlab.solve(f, start, x, solver=deqlab.Picard(tol=1e-5), batch_axis=0).stats.steps))) == 0
    strict = deqlab.solve(f, start, x, solver=Strict(tol=1e-5), batch_axis=0, on_failure="ignore")
    assert np.all(np.asarray(strict.stats.steps) >= 1)
    with pytest.raises(TypeError, match=r"ReturnsResidual.terminate.*one boolean scalar per sample.*float32"):
        deqlab.solve(f, jnp.zeros((2, 3)), x, solver=ReturnsResidual(), batch_axis=0)
    with pytest.raises(TypeError, match=r"BranchesInPython.terminate.*not Python `if`"):
        deqlab.solve(f, jnp.zeros((2, 3)), x, solver=BranchesInPython(), batch_axis=0)
    small = deqlab.solve(f, jnp.zeros((2, 3)), x, solver=deqlab.Anderson(m=3), batch_axis=0)
    with pytest.raises(ValueError, match=r"`init_state.history\[0\]` has shape \(2, 3, 3\).*\(2, 5, 3\)"):
        deqlab.solve(f, jnp.zeros((2, 3)), x, solver=deqlab.Anderson(m=5), batch_axis=0, init_state=small.state)
    with pytest.raises(ValueError) as raised:
        deqlab.solve(f, jnp.zeros((2, 3)), x, solver=BatchWritten(), batch_axis=0)
    assert "couples_samples = True" in "".join(getattr(raised.value, "__notes__", []))


def test_a_hard_neighbour_changes_nothing_for_a_sample():
    """Anderson's mixing is each sample's own: sample 0 takes the same steps to the same value
    alone and beside a slowly contracting sample (elementwise f: no batched product's rounding)."""
    solver = deqlab.Anderson(m=5, tol=1e-6, max_steps=500)

    def f(z, rate, x):
        return rate[:, None] * jnp.tanh(z) + x

    x = jax.random.normal(jax.random.key(4), (2, N), jnp.float32)
    # (inputs sliced and results compared in NumPy: no eager programs besides the two solves)
    alone = deqlab.solve(f, jnp.zeros((1, N)), np.array([0.5], np.float32), np.asarray(x)[:1], solver=solver,
                         batch_axis=0)
    paired = deqlab.solve(f, jnp.zeros((2, N)), np.array([0.5, 0.995], np.float32), x, solver=solver, batch_axis=0)
    paired_steps, alone_steps = np.asarray(paired.stats.steps), np.asarray(alone.stats.steps)
    assert paired_steps[1] > paired_steps[0]  # the loop runs on past sample 0
    assert alone_steps[0] == paired_steps[0]
    np.testing.assert_allclose(np.asarray(paired.value)[0], np.asarray(alone.value)[0], rtol=1e-6, atol=1e-7)


def test_per_sample_result_codes_and_statistics():
    """Per-sample result codes and step counts of a user's solver; the raise policy names the sample."""
    # sample 1 is z -> 2 z + 1 (no attracting fixed point for the damped map: 1.5 z + 0.5 grows)
    slope = jnp.array([0.5, 2.0, 0.3], jnp.float32)[:, None]

    def f(z, slope):
        return slope * z + 1.0

    sol = deqlab.solve(f, jnp.zeros((3, 2), jnp.float32), slope,
                       solver=Damped(tol=1e-5, max_steps=40, divergence_factor=1e30), batch_axis=0)
    assert list(np.asarray(sol.result)) == [Result.SUCCESS, Result.MAX_STEPS_REACHED, Result.SUCCESS]
    steps, value = np.asarray(sol.stats.steps), np.asarray(sol.value)
    assert steps[1] == 40 and steps[0] < 40 and steps[2] < steps[0]  # faster contraction, fewer steps
    np.testing.assert_allclose(value[0], 2.0, rtol=1e-4)
    np.testing.assert_allclose(value[2], 1 / 0.7, rtol=1e-4)
    with pytest.raises(deqlab.SolverError, match="sample 1: max_steps_reached"):
        deqlab.solve(f, jnp.zeros((3, 2), jnp.float32), slope, solver=Damped(tol=1e-5, max_steps=40,
                     divergence_factor=1e30), batch_axis=0, on_failure="raise")
    # the default divergence test catches it instead
    diverged = deqlab.solve(f, jnp.zeros((3, 2), jnp.float32), slope, solver=Damped(max_steps=100), batch_axis=0)
    assert int(diverged.result[1]) == Result.DIVERGED


@pytest.mark.filterwarnings("ignore::deqlab.precision.PrecisionWarning")
def test_custom_state_fields_and_warm_start():
    """A user's solver state counts its proposals and carries a warm start: 10 + 10 steps equal 20.
    The step limits are traced budgets under one cap (max_steps=20): the first and the whole solve
    share one compiled program."""
    x = jax.random.normal(jax.random.key(2), (3, N), jnp.float32)
    z0 = jnp.zeros((3, N), jnp.float32)
    solver = Counting(beta=0.7, tol=1e-30, max_steps=20)  # tol never met: exactly the budget's steps

    def run(steps, init_state=None):
        return deqlab.solve(tanh_map, z0, x, solver=solver, batch_axis=0, init_state=init_state, on_failure="ignore",
                            budget=deqlab.solvers.Budget(np.int32(steps), np.float32(1e-30)))

    first = run(10)
    assert isinstance(first.state, SolverState)
    np.testing.assert_array_equal(first.state.history, 10)  # the state counted the proposals
    np.testing.assert_array_equal(first.stats.steps, 10)
    second = run(10, first.state)
    whole = run(20)
    np.testing.assert_array_equal(second.state.history, 20)
    np.testing.assert_allclose(second.state.z, whole.state.z, rtol=1e-6)
    with pytest.raises(ValueError, match="`beta`.*<= 1"):
        Counting(beta=1.5)
    with pytest.raises(ValueError, match="`init_state`"):
        deqlab.solve(tanh_map, z0, x, solver=Damped(), batch_axis=0, init_state=first.state)


def test_stop_error_with_a_custom_solver():
    """stop="error" bounds the max-abs error of the value: check it against the exact z*."""
    a = jnp.float32(0.9)

    def f(z, b):
        return a * z + b

    b = jnp.array([[1.0, -2.0], [0.5, 3.0]], jnp.float32)
    exact = np.asarray(b) / (1 - np.float32(0.9))
    # The tolerances are arrays (traced leaves of the solver): one program per rule for both.
    for tol in (1e-2, 1e-4):
        sol = deqlab.solve(f, jnp.zeros((2, 2), jnp.float32), b,
                           solver=Damped(tol=jnp.float32(tol), max_steps=2000, stop="error"), batch_axis=0)
        np.testing.assert_array_equal(sol.result, Result.SUCCESS)
        assert sol.stats.error_estimate is not None and np.all(np.isfinite(sol.stats.error_estimate))
        error = np.max(np.abs(np.asarray(sol.value) - exact), axis=1) / np.maximum(1, np.max(np.abs(exact), 1))
        assert np.all(error <= tol), (tol, error)
        # the residual rule with the same tol would stop far from z* (|z*| = 30, rate 0.95)
        loose = deqlab.solve(f, jnp.zeros((2, 2), jnp.float32), b, solver=Damped(tol=jnp.float32(tol), max_steps=2000),
                             batch_axis=0)
        assert np.all(np.asarray(sol.stats.steps) > np.asarray(loose.stats.steps))


class MyPicard(deqlab.Solver):
    """Picard(damping=0.5) written from the outside, its behaviour declared by the hooks only."""

    rate_estimate = "residual_ratio"
    steps_past_convergence = True

    def init(self, z, fz):
        return ()

    def propose(self, z, fz, state):
        return z + 0.5 * (fz - z), state

    def error_bound_factor(self, q):
        return q * 0.5 / (1.0 - q)


@pytest.mark.parametrize("stop", ["residual", "error"])
def test_the_loop_has_no_special_case_for_picard(stop):
    """A user's copy of Picard with the same hooks gives bit-identical solves: the loop treats the
    built-in solver through the hooks only."""
    x = jax.random.normal(jax.random.key(12), (4, N), jnp.float32)
    z0 = jnp.zeros((4, N), jnp.float32)
    mine = deqlab.solve(tanh_map, z0, x, solver=MyPicard(tol=1e-5, stop=stop, max_steps=300), batch_axis=0)
    builtin = deqlab.solve(tanh_map, z0, x, solver=deqlab.Picard(damping=0.5, tol=1e-5, stop=stop, max_steps=300),
                           batch_axis=0)
    for a, b in zip(jax.tree_util.tree_leaves(mine), jax.tree_util.tree_leaves(builtin)):
        np.testing.assert_array_equal(a, b)
    # without the hooks (Damped: secant rate, returns the iterate) the same iteration stops and
    # returns differently
    plain = deqlab.solve(tanh_map, z0, x, solver=Damped(tol=1e-5, stop=stop, max_steps=300), batch_axis=0)
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(plain),
                                                         jax.tree_util.tree_leaves(builtin)))
    if stop == "error":  # the rate estimates differ, hence the error estimates
        assert not np.array_equal(plain.stats.error_estimate, builtin.stats.error_estimate)
    else:  # the returned values differ by Picard's step past convergence
        assert not np.array_equal(plain.value, builtin.value)


def test_fixed_point_gradients_of_a_custom_solver():
    """Implicit gradient of a linear map against the analytic one, d/db sum(c z*) = (I - A)^-T c."""
    a = (jax.random.normal(jax.random.key(3), (N, N)) * 0.4 / np.sqrt(N)).astype(jnp.float32)
    c = jax.random.normal(jax.random.key(4), (N,), jnp.float32)
    b = jax.random.normal(jax.random.key(5), (N,), jnp.float32)
    exact = np.linalg.solve(np.eye(N) - np.asarray(a, np.float64).T, np.asarray(c, np.float64))
    solver = Damped(tol=1e-6, max_steps=500)

    def loss(b, backward):
        return jnp.dot(deqlab.fixed_point(lambda z, b: a @ z + b, jnp.zeros(N, jnp.float32), b, solver=solver,
                                          backward=backward).value, c)

    for backward in ("implicit", Implicit(solver="gmres"), Implicit(solver=GMRES(restart=4)), Unrolled(),
                     Implicit(solver=Damped(max_steps=300))):
        g = jax.grad(loss)(b, backward)
        assert g.dtype == jnp.float32
        np.testing.assert_allclose(g, exact, rtol=1e-4, atol=1e-5, err_msg=str(backward))
    for backward in (Phantom(steps=3), JacobianFree()):
        assert np.all(np.isfinite(jax.grad(loss)(b, backward)))
    with pytest.raises(ValueError, match="`solver`.*broyden"):
        jax.grad(loss)(b, "shine")


@pytest.mark.float64
def test_fixed_point_gradient_on_a_tanh_map_matches_finite_differences():
    x = jax.random.normal(jax.random.key(6), (N,), jnp.float64)
    w = W.astype(jnp.float64)
    v = jax.random.normal(jax.random.key(7), (N,), jnp.float64)

    def loss(x):
        f = lambda z, x: jnp.tanh(w @ z + x)  # noqa: E731
        return jnp.sum(deqlab.fixed_point(f, jnp.zeros(N), x, solver=Damped(tol=1e-12, max_steps=2000)).value ** 2)

    eps = 1e-6
    fd = (loss(x + eps * v) - loss(x - eps * v)) / (2 * eps)
    np.testing.assert_allclose(jnp.dot(jax.grad(loss)(x), v), fd, rtol=1e-6)


def test_nn_deq_with_a_custom_solver():
    """nn.DEQ with a user's solver: a fixed point, Anderson's value, finite gradients, and nnx.jit."""
    cell = TanhCell(8, 3, rngs=nnx.Rngs(0))
    layer = DEQ(cell, solver=Damped(tol=1e-5, max_steps=300))
    x = jax.random.normal(jax.random.key(8), (5, 3), jnp.float32)
    z, sol = layer(x, return_solution=True)
    assert z.dtype == jnp.float32
    np.testing.assert_array_equal(sol.result, Result.SUCCESS)
    np.testing.assert_allclose(cell(z, x), z, atol=1e-4)
    reference = DEQ(cell, solver=deqlab.Anderson(tol=1e-6, max_steps=300))(x)
    np.testing.assert_allclose(z, reference, atol=1e-4)
    grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(layer)
    leaves = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(nnx.state(grads, nnx.Param))]  # checked in NumPy
    assert leaves and all(np.all(np.isfinite(leaf)) for leaf in leaves)
    assert any(np.any(leaf != 0) for leaf in leaves)
    # the layer goes through nnx.jit with the solver as part of its (static) graph
    jitted = nnx.jit(lambda m, x: m(x))(layer, x)
    np.testing.assert_allclose(jitted, z, atol=1e-6)


def test_solver_and_backward_objects_are_jit_arguments():
    x = jax.random.normal(jax.random.key(9), (4, N), jnp.float32)
    # real-number settings are leaves (traced as jit arguments), the others static
    assert jax.tree_util.tree_leaves(Damped(tol=1e-6)) == [1e-6, 1e4, 1.5]
    assert jax.tree_util.tree_leaves(Implicit(solver=GMRES())) == []
    assert hash(Damped(tol=1e-6)) == hash(Damped(tol=1e-6)) and Damped(tol=1e-6) != Damped(tol=1e-5)
    traces = []

    @jax.jit
    def run(solver, x):
        traces.append(solver)
        return deqlab.solve(tanh_map, jnp.zeros_like(x), x, solver=solver, batch_axis=0).stats.steps

    fast, slow = run(Damped(tol=1e-3), x), run(Damped(tol=1e-6), x)
    assert np.all(np.asarray(fast) < np.asarray(slow))
    run(Damped(tol=1e-4), x)  # another tolerance: the same program (tol is traced)
    assert len(traces) == 1
    run(Damped(tol=1e-4, max_steps=50), x)  # another static setting: a new program
    assert len(traces) == 2
    np.testing.assert_array_equal(run(deqlab.Anderson(m=3, tol=1e-6), x),
                                  deqlab.solve(tanh_map, jnp.zeros_like(x), x, solver=deqlab.Anderson(m=3, tol=1e-6),
                                               batch_axis=0).stats.steps)

    @jax.jit
    def grad(backward, solver, x):
        return jax.grad(lambda x: jnp.sum(deqlab.fixed_point(tanh_map, jnp.zeros_like(x), x, solver=solver,
                                                             batch_axis=0, backward=backward).value))(x)

    np.testing.assert_allclose(grad(Implicit(solver=GMRES()), Damped(tol=1e-6, max_steps=300), x),
                               grad(Implicit(), deqlab.Anderson(tol=1e-6), x), rtol=1e-4, atol=1e-5)


def test_incomplete_subclasses_are_named():
    class NoPropose(deqlab.Solver):
        def init(self, z, fz):
            return ()

    class Nothing(deqlab.Solver):
        pass

    with pytest.raises(TypeError, match=r"NoPropose.*does not define `propose`"):
        NoPropose()
    with pytest.raises(TypeError, match=r"Nothing.*`init` or `propose`"):
        Nothing(tol=1e-3)

    class NoSolve(Backward):
        pass

    with pytest.raises(TypeError, match=r"NoSolve.*`solve`"):
        NoSolve()
    with pytest.raises(ValueError, match="`rate_estimate`.*'residual_ratio', 'secant'"):
        class Wrong(deqlab.Solver):  # noqa: F841
            rate_estimate = "guess"
    with pytest.raises(ValueError, match="`max_steps`.*>= 1|`max_steps`.*positive"):
        Damped(max_steps=0)
    with pytest.raises(ValueError, match="`stop`.*'residual', 'error'"):
        Damped(stop="sometimes")
    with pytest.raises(ValueError, match="`restart`"):
        GMRES(restart=0)
    with pytest.raises(ValueError, match="`solver`.*gmres"):
        adjoint_solve(tanh_map, jnp.zeros(N), (jnp.zeros(N),), jnp.ones(N), solver="bicgstab")


def test_a_custom_backward_mode():
    class OneStep(Backward):
        def solve(self, problem):
            sol = problem.forward(jax.lax.stop_gradient(problem.z0), jax.lax.stop_gradient(problem.args))
            z = jax.lax.stop_gradient(sol.value)
            return sol._replace(value=problem.f(z, *problem.args))

    x = jax.random.normal(jax.random.key(10), (N,), jnp.float64)

    def loss(x, backward):
        return jnp.sum(deqlab.fixed_point(tanh_map, jnp.zeros(N), x, solver=Damped(tol=1e-10, max_steps=1000),
                                          backward=backward).value ** 2)

    np.testing.assert_allclose(jax.grad(loss)(x, OneStep()), jax.grad(loss)(x, JacobianFree()), rtol=1e-12)
    with pytest.raises(TypeError, match="pass it to the call"):  # a policy belongs to the call
        OneStep(on_failure="nan")
    with pytest.raises(ValueError, match="`on_failure`"):
        deqlab.fixed_point(tanh_map, jnp.zeros(N), x, backward=OneStep(), on_failure="sometimes")


@pytest.mark.float64
def test_broyden_public_inverse_jacobian():
    """Broyden's estimate applied through its public methods: B^T is the transpose of B, which is
    the low-rank sum its named state holds."""
    a = jax.random.normal(jax.random.key(11), (N, N), jnp.float64) * 0.3 / np.sqrt(N)
    b = jnp.ones((1, N))
    solver = deqlab.Broyden(m=40, tol=1e-12, max_steps=100)
    sol = deqlab.solve(lambda z, b: z @ a.T + b, jnp.zeros((1, N)), b, solver=solver, batch_axis=0)
    history = sol.state.history
    eye = jnp.eye(N)
    dense = jnp.stack([solver.inverse_jacobian(history, eye[i:i + 1])[0] for i in range(N)], axis=1)
    dense_t = jnp.stack([solver.inverse_jacobian_transpose(history, eye[i:i + 1])[0] for i in range(N)], axis=1)
    np.testing.assert_allclose(dense_t, dense.T, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="Broyden.inverse_jacobian_transpose: `state`"):
        solver.inverse_jacobian_transpose(history, eye[0])  # one row without its batch axis
    # B = -I + sum_i u_i v_i^T over the pairs in use (003 Eq. 10), and not the bare -I
    used = (np.arange(solver.m) < int(history.count[0])).astype(float)
    explicit = -np.eye(N) + np.einsum("id,i,ie->de", np.asarray(history.us[0]), used, np.asarray(history.vs[0]))
    np.testing.assert_allclose(dense, explicit, rtol=1e-12, atol=1e-14)
    assert int(history.count[0]) > 0 and not np.allclose(dense, -np.eye(N))


class Neumann(ImplicitRule):
    """A user's backward mode in 8 lines: the adjoint u = g + J^T u approximated by the first
    ``terms`` terms of its Neumann series (which Phantom(steps=terms, damping=1) also computes, by
    differentiating ``terms`` steps of f from the equilibrium). The shared rule gives it forward
    mode too (its tangent is the transpose of this adjoint)."""

    terms: int = 4

    def adjoint(self, problem, solution, g):
        jt = problem.jacobian_transpose_at(solution.value)
        u = g
        for _ in range(self.terms - 1):
            u = g + jt(u)
        return u


def test_a_users_backward_mode_works_under_jit_vmap_and_grad():
    """A user's ImplicitRule (a Neumann series) matches Phantom's gradient under jit, vmap, grad and jvp."""
    xs = jax.random.normal(jax.random.key(11), (3, N), jnp.float32)
    solver = deqlab.Anderson(tol=1e-6, max_steps=200)

    def loss(x, backward):
        return jnp.sum(deqlab.fixed_point(tanh_map, jnp.zeros(N), x, solver=solver, backward=backward).value ** 2)

    ours = np.asarray(jax.jit(jax.vmap(jax.grad(lambda x: loss(x, Neumann(terms=4)))))(xs))
    phantom = np.asarray(jax.vmap(jax.grad(lambda x: loss(x, Phantom(steps=4, damping=1.0))))(xs))
    np.testing.assert_allclose(ours, phantom, rtol=1e-4, atol=1e-6)
    exact = np.asarray(jax.vmap(jax.grad(lambda x: loss(x, "implicit")))(xs))
    # four terms of a series contracting at about 0.5 (W's scale): close to, not equal to, exact
    # (compared in NumPy: no eager programs besides the derivatives)
    assert 0 < float(np.max(np.abs(ours - exact))) < 0.1 * float(np.max(np.abs(exact)))
    # forward mode through the same rule: the tangent is the transposed series, which
    # differentiating Phantom's four steps in forward mode also gives
    direction = np.ones(N, np.float32)
    tangent = jax.jvp(lambda x: loss(x, Neumann(terms=4)), (jnp.asarray(np.asarray(xs)[0]),), (jnp.asarray(direction),))[1]
    np.testing.assert_allclose(tangent, phantom[0] @ direction, rtol=1e-4)


def test_the_implicit_rule_names_a_modes_mistakes():
    """A mode of the shared rule: no adjoint, an adjoint of the wrong shape or type, and a
    settings check that runs though the subclass skipped super().__post_init__()."""

    class NoAdjoint(ImplicitRule):
        pass

    class Truncates(ImplicitRule):
        def adjoint(self, problem, solution, g):
            return g[:1]

    class Forgets(ImplicitRule):
        def adjoint(self, problem, solution, g):
            pass

    class Quiet(Phantom):
        def __post_init__(self):  # no super(): Phantom's checks still run
            pass

    with pytest.raises(TypeError, match=r"NoAdjoint cannot be instantiated.*adjoint\(self, problem, solution, g\)"):
        NoAdjoint()
    grad = jax.grad(lambda x, mode: deqlab.fixed_point(tanh_map, jnp.zeros(N), x, backward=mode).value.sum())
    with pytest.raises(ValueError, match=r"Truncates.adjoint\(problem, solution, g\) must return arrays shaped.*\(1,\)"):
        grad(jnp.ones(N), Truncates())
    with pytest.raises(TypeError, match=r"Forgets.adjoint\(problem, solution, g\) must return a pytree.*NoneType"):
        grad(jnp.ones(N), Forgets())
    with pytest.raises(ValueError, match="`steps`"):
        Quiet(steps=0)


def test_mistakes_in_a_backward_mode_are_named():
    class ReturnsArray(Backward):
        def solve(self, problem):
            return problem.forward().value

    class ReturnsHalf(Backward):
        def solve(self, problem):
            sol = problem.forward()
            return sol._replace(value=sol.value[:1])

    with pytest.raises(TypeError, match=r"ReturnsArray.solve must return a deqlab.solvers.Solution"):
        deqlab.fixed_point(tanh_map, jnp.zeros(N), jnp.ones(N), backward=ReturnsArray())
    with pytest.raises(ValueError, match=r"ReturnsHalf.solve returned a value of .*shapes \[\(1,\)\].*z0's"):
        deqlab.fixed_point(tanh_map, jnp.zeros(N), jnp.ones(N), backward=ReturnsHalf())


def test_a_dataclass_decorator_on_a_subclass_is_harmless():
    """Issue 42: `@dataclass(frozen=True)` on a Solver or Backward subclass failed with Python's
    "Cannot overwrite attribute __setattr__". It now keeps deqlab's constructor (the settings are
    still validated), the instance stays frozen with a message that says how to change it, and the
    class solves and differentiates like any other; a non-frozen decorator is refused by Python."""

    @dataclasses.dataclass(frozen=True)
    class Damped(deqlab.Picard):
        extra: float = 0.5

    @dataclasses.dataclass(frozen=True)
    class MyImplicit(deqlab.Implicit):
        pass

    with pytest.raises(ValueError, match="max_steps"):
        Damped(max_steps=0)
    solver = Damped()
    with pytest.raises(dataclasses.FrozenInstanceError):
        solver.extra = 2.0
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"replace\(tol=...\)"):
        deqlab.Picard().tol = 1.0  # the family's own message
    assert solver.replace(extra=0.7).extra == 0.7
    f = lambda z, x: 0.5 * z + x  # noqa: E731
    grad = jax.grad(lambda x: deqlab.fixed_point(f, jnp.zeros(3), x, solver=solver, backward=MyImplicit(),
                                                 on_failure="ignore").value.sum())(jnp.ones(3))
    np.testing.assert_allclose(grad, 2.0, rtol=1e-5)
    with pytest.raises(TypeError, match="frozen"):
        @dataclasses.dataclass
        class Mutable(deqlab.Picard):
            pass
