"""Forward solvers: fixed points of linear and tanh DEQs, per-sample convergence, failure modes."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqlab
from deqlab import ensembles, precision, solvers
from deqlab.solvers import (
    Anderson,
    Broyden,
    Picard,
    Result,
    SolverError,
    SolverState,
    get_solver,
    solve,
)

SOLVER_NAMES = ["picard", "anderson", "broyden"]


def linear_map(z, w, x):
    return w @ z + x


def batched_linear_map(z, w, x):
    return z @ w.T + x


def tanh_map(z, w, u, x):
    return jnp.tanh(z @ w.T + x @ u.T)


def tanh_case(seed, n, batch, scale):
    """Orthogonal W at ``scale``, U with unit row variance, a batch of standard normal inputs."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    w = ensembles.sample("orthogonal", keys[0], n, scale, jnp.float64)
    u = jax.random.normal(keys[1], (n, n)) / np.sqrt(n)
    x = jax.random.normal(keys[2], (batch, n))
    return w, u, x


@pytest.mark.float64
@pytest.mark.parametrize("name", SOLVER_NAMES)
@pytest.mark.parametrize("ensemble", ["gaussian", "orthogonal", "goe"])
def test_linear_deq_reaches_exact_fixed_point(name, ensemble):
    """Every solver reaches z* = (I - W)^-1 x of a linear DEQ at 0.8 of the critical scale, within
    the error bound its tolerance implies: |z - z*| <= ||(I-W)^-1|| * ||f(z) - z||. (One compiled
    solve per solver, shared by the ensembles; the references are NumPy, compiling nothing.)"""
    n = 48
    w = ensembles.sample(ensemble, jax.random.PRNGKey(1), n, 0.8 * ensembles.critical_scale(ensemble), jnp.float64)
    x = jax.random.normal(jax.random.PRNGKey(2), (n,))
    w_np, x_np = np.asarray(w, np.float64), np.asarray(x, np.float64)
    exact = np.linalg.solve(np.eye(n) - w_np, x_np)
    sol = solve(linear_map, jnp.zeros(n), w, x, solver=get_solver(name, tol=1e-12, max_steps=2000))
    assert int(sol.result) == Result.SUCCESS and bool(sol.converged)
    value = np.asarray(sol.value, np.float64)
    inverse_norm = np.linalg.norm(np.linalg.inv(np.eye(n) - w_np), 2)
    bound = inverse_norm * 1e-12 * np.linalg.norm(w_np @ value + x_np) * 1.01
    assert np.linalg.norm(value - exact) <= bound
    assert float(sol.stats.best_residual) <= 1e-12


@pytest.mark.float64
@pytest.mark.slow
def test_anderson_beats_picard_on_goe_near_criticality():
    # A symmetric W has a real spectrum, where Anderson (Krylov-like on linear maps) needs far fewer
    # steps than Picard, whose rate is the spectral radius 2 * 0.49 = 0.98 (~1400 steps to 1e-12).
    n = 200
    w = ensembles.sample("goe", jax.random.PRNGKey(3), n, 0.49, jnp.float64)
    x = jax.random.normal(jax.random.PRNGKey(4), (n,))
    picard = solve(linear_map, jnp.zeros(n), w, x, solver=deqlab.Picard(tol=1e-10, max_steps=5000))
    anderson = solve(linear_map, jnp.zeros(n), w, x, solver=Anderson(m=10, tol=1e-10, max_steps=5000))
    assert picard.converged and anderson.converged
    assert int(anderson.stats.steps) * 4 < int(picard.stats.steps)


@pytest.mark.float64
@pytest.mark.parametrize("name", SOLVER_NAMES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_batched_tanh_deq_and_jit(name, dtype):
    """A batched tanh DEQ under jit reaches the dtype's default tolerance (float32 1e-5, float64
    1e-10), against a float64 reference, and each sample alone gives the same fixed point.
    The distance to z* is bounded by tol * |f(z)| / (1 - L) with L <= 0.9 the Lipschitz constant
    of the map (tanh' <= 1, ||W|| = 0.9); per entry that is tol * 10 times an O(1) factor.
    (Checks in NumPy: they add no compiled program to the solves'.)"""
    n, batch = 32, 8
    w, u, x = tanh_case(0, n, batch, 0.9)
    # One float64 reference for the three solvers (Anderson to 1e-13): one compiled program, not three.
    reference = solve(tanh_map, jnp.zeros((batch, n)), w, u, x, solver=deqlab.Anderson(tol=1e-13, max_steps=500),
                      batch_axis=0)
    assert np.all(np.asarray(reference.converged))
    reference = np.asarray(reference.value, np.float64)
    args = [jnp.asarray(np.asarray(a).astype(dtype)) for a in (w, u, x)]
    run = jax.jit(lambda w, u, x: solve(tanh_map, jnp.zeros((batch, n), dtype), w, u, x, solver=get_solver(name, max_steps=500), batch_axis=0))
    sol = run(*args)
    tol = precision.default_tol(dtype)
    assert sol.value.dtype == dtype and float(sol.stats.tol) == pytest.approx(tol)
    assert sol.result.shape == (batch,) and sol.stats.steps.shape == (batch,)
    assert np.all(np.asarray(sol.converged)) and float(np.max(np.asarray(sol.stats.best_residual))) <= tol
    value = np.asarray(sol.value, np.float64)
    error = np.linalg.norm(value - reference, axis=1) / np.linalg.norm(reference, axis=1)
    assert float(np.max(error)) <= 10 * tol / (1 - 0.9)
    # Each sample alone gives the same fixed point: the batch solve treats samples independently.
    alone = solve(tanh_map, jnp.zeros(n, dtype), *args[:2], jnp.asarray(np.asarray(args[2])[3]),
                  solver=get_solver(name, max_steps=500))
    np.testing.assert_allclose(np.asarray(alone.value), np.asarray(sol.value)[3], atol=20 * tol)


@pytest.mark.float64
@pytest.mark.slow
def test_per_sample_convergence_mask_and_frozen_samples():
    # Per-sample scales a_b: samples with a < 1 converge at different speeds, a = 1.5 diverges.
    n = 16
    o = ensembles.sample("orthogonal", jax.random.PRNGKey(5), n, 1.0, jnp.float64)
    scales = jnp.array([0.2, 0.6, 0.95, 1.5])
    x = jax.random.normal(jax.random.PRNGKey(6), (4, n))

    def per_sample_map(z, a, x):
        return a[:, None] * (z @ o.T) + x

    sol = solve(per_sample_map, jnp.zeros((4, n)), scales, x, solver=deqlab.Picard(tol=1e-10, max_steps=1000), batch_axis=0)
    assert list(np.asarray(sol.converged)) == [True, True, True, False]
    assert int(sol.result[3]) in (Result.DIVERGED, Result.MAX_STEPS_REACHED)
    steps = np.asarray(sol.stats.steps)
    assert steps[0] < steps[1] < steps[2]  # the batch is not judged by its worst member
    o_np, x_np, value, traces = (np.asarray(a, np.float64) for a in (o, x, sol.value, sol.stats.residual_trace))
    for b in range(3):  # references in NumPy: no eager programs
        exact = np.linalg.solve(np.eye(n) - float(scales[b]) * o_np, x_np[b])
        np.testing.assert_allclose(value[b], exact, atol=1e-8)
        # Frozen after convergence: the residual trace stays constant after its own last step.
        trace = traces[:, b]
        assert np.all(trace[steps[b]:] == trace[steps[b]])
    assert np.all(np.isfinite(sol.stats.residual_trace))


def test_batch_axis_other_than_zero_and_pytree_state():
    """A batch on axis 1 of a pytree state: every sample converges to a fixed point of the map."""
    n = 10
    w = ensembles.sample("orthogonal", jax.random.PRNGKey(7), n, 0.7, jnp.float64)
    x = jax.random.normal(jax.random.PRNGKey(8), (n, 3))  # batch on axis 1

    def two_part_map(z, w, x):
        a, b = z["a"], z["b"]
        return {"a": jnp.tanh(w @ a + x), "b": 0.5 * b + jnp.sum(a, axis=0)}

    z0 = {"a": jnp.zeros((n, 3)), "b": jnp.zeros((2, 3))}
    tol = 1e-5  # float32's default tolerance (precision.default_tol)
    sol = solve(two_part_map, z0, w, x, solver=deqlab.Anderson(tol=tol), batch_axis=1)
    assert sol.result.shape == (3,) and np.all(np.asarray(sol.converged))
    out = jax.tree_util.tree_map(np.asarray, two_part_map(sol.value, w, x))
    # Per sample the residual |f(z) - z| is below tol * |f(z)| (norms over the 12 entries), so no
    # entry is off by more than tol * sqrt(12) * max|f(z)|: 10 * tol * max|f(z)| leaves room for
    # float32 rounding (eps ~ 1.2e-7, far below tol).
    for part in ("a", "b"):
        atol = 10 * tol * float(np.max(np.abs(out[part])))
        np.testing.assert_allclose(out[part], np.asarray(sol.value[part]), rtol=0, atol=atol)


@pytest.mark.parametrize("name", SOLVER_NAMES)
def test_divergent_problem_is_flagged_inside_jit(name):
    """A divergent problem under jit: flagged, finite, never worse than the start."""
    # Spectral radius 1.5: Picard diverges; no solver may hang, raise inside jit or return NaNs.
    n = 32
    w = ensembles.sample("orthogonal", jax.random.PRNGKey(9), n, 1.5, jnp.float64)
    x = jax.random.normal(jax.random.PRNGKey(10), (n,))
    sol = jax.jit(lambda w, x: solve(linear_map, jnp.zeros(n), w, x, solver=get_solver(name, max_steps=300)))(w, x)
    assert int(sol.result) in (Result.DIVERGED, Result.MAX_STEPS_REACHED)
    assert not bool(sol.converged)
    for leaf in jax.tree_util.tree_leaves(sol):  # checked in NumPy: no eager programs
        assert np.all(np.isfinite(np.asarray(leaf)))
    # The returned value is the best iterate, never worse than the start.
    assert float(sol.stats.best_residual) <= float(np.asarray(sol.stats.residual_trace)[0])


def test_on_failure_raise_reports_residual_eagerly_and_under_jit():
    n = 8
    w = 1.5 * jnp.eye(n)
    x = jnp.ones(n)
    with pytest.raises(SolverError, match=r"solve: the solve failed for 1/1 samples: sample 0: diverged \(residual"):
        solve(linear_map, jnp.zeros(n), w, x, solver="picard", on_failure="raise")
    # inside the caller's jit the results are not concrete: the error comes from a host callback,
    # wrapped in JAX's runtime error, with the same text
    with pytest.raises(Exception, match=r"solve failed for 1/1 samples: sample 0: diverged"):
        jax.block_until_ready(jax.jit(lambda w: solve(linear_map, jnp.zeros(n), w, x, solver="picard",
                                                      on_failure="raise").value)(w))


def test_on_failure_warn_names_the_callers_line_and_nan_poisons_only_failing_samples():
    """The warn policy names the caller's line; "nan" poisons only the failing sample; "ignore" is quiet."""
    n = 4
    x = jnp.ones((2, n))
    slope = jnp.array([0.5, 1.5])
    f = lambda z, a, x: a[:, None] * z + x  # noqa: E731
    with pytest.warns(deqlab.SolverWarning, match="did not converge for 1/2 samples") as record:
        solve(f, jnp.zeros((2, n)), slope, x, solver="picard", batch_axis=0)
    assert record[0].filename == __file__  # attributed to this line, not to deqlab's code
    poisoned = solve(f, jnp.zeros((2, n)), slope, x, solver="picard", batch_axis=0, on_failure="nan")
    poisoned_value = np.asarray(poisoned.value)  # checked in NumPy: no eager programs
    assert np.all(np.isnan(poisoned_value[1])) and np.all(np.isfinite(poisoned_value[0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = solve(f, jnp.zeros((2, n)), slope, x, solver="picard", batch_axis=0, on_failure="ignore")
    assert [int(r) for r in quiet.result] == [Result.SUCCESS, Result.DIVERGED]


def test_nonfinite_samples_are_reported_not_accepted():
    """A sample whose map turns NaN is reported NONFINITE with a finite value; the others converge."""
    # z = sqrt(c - z): c = 2 has the fixed point 1; c = -1 gives NaN at once.
    c = jnp.array([2.0, -1.0, 2.0])
    sol = solve(lambda z, c: jnp.sqrt(c - z), jnp.zeros(3), c, solver=deqlab.Anderson(tol=1e-12), batch_axis=0)
    assert list(np.asarray(sol.result)) == [Result.SUCCESS, Result.NONFINITE, Result.SUCCESS]
    value = np.asarray(sol.value)  # checked in NumPy: no eager programs
    np.testing.assert_allclose(value[[0, 2]], 1.0, atol=1e-10)
    assert np.all(np.isfinite(value))


def test_weighted_rows_is_the_mixing_product_in_the_working_dtype_and_names_a_shape_mismatch():
    """history.weighted_rows, Anderson's mixing sum_i alpha_i rows_i as m multiply-adds, is the
    einsum it replaced to float32 rounding (sums of 7 terms of size ~1: 1e-6), in float32 for
    bfloat16 rows, and a weight vector of the wrong length is named with both shapes."""
    from deqlab.solvers.history import exact_einsum, weighted_rows

    rng = np.random.default_rng(0)
    weights, rows = rng.normal(size=7).astype(np.float32), rng.normal(size=(7, 33)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(weighted_rows(jnp.asarray(weights), jnp.asarray(rows))),
                               np.asarray(exact_einsum("i,id->d", jnp.asarray(weights), jnp.asarray(rows))),
                               rtol=1e-6, atol=1e-6)
    assert weighted_rows(jnp.asarray(weights), jnp.asarray(rows, jnp.bfloat16)).dtype == jnp.float32
    with pytest.raises(ValueError, match=r"weighted_rows: `weights` must have shape \(m,\) .* got \(6,\) and \(7, 33\)"):
        weighted_rows(jnp.asarray(weights[:6]), jnp.asarray(rows))


@pytest.mark.parametrize("config", [Anderson(m=3), Broyden(m=4)], ids=["anderson", "broyden"])
def test_memory_of_history_is_fixed(config):
    """Anderson's and Broyden's compiled memory does not grow with max_steps beyond the trace."""
    # Anderson and Broyden keep m iterates whatever max_steps is (locuslab/deq issue 28): the
    # compiled memory of a solve with max_steps = 1000 exceeds that of max_steps = 10 by no more
    # than the residual trace, (max_steps + 1) x batch floats (plus alignment), while one more
    # history slot would cost batch x n floats per step.
    batch, n = 16, 64
    w = 0.5 * jnp.eye(n)
    x = jnp.ones((batch, n))

    def temp_bytes(max_steps):
        run = jax.jit(lambda w, x: solve(linear_map_rows, jnp.zeros((batch, n)), w, x, batch_axis=0,
                                         solver=dataclasses.replace(config, max_steps=max_steps)).value)
        return run.lower(w, x).compile().memory_analysis().temp_size_in_bytes

    growth = temp_bytes(1000) - temp_bytes(10)
    assert growth <= 2 * 990 * batch * 8
    # one sample's: m slots of n numbers, the largest leaf (shapes only: eval_shape compiles nothing)
    one = jax.ShapeDtypeStruct((n,), x.dtype)
    history = jax.eval_shape(config.init, one, one)
    assert max(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(history)) == config.m * n


def linear_map_rows(z, w, x):
    return z @ w.T + x


@pytest.mark.float64
@pytest.mark.slow
def test_configured_object_and_name_agree():
    n = 12
    w = ensembles.sample("orthogonal", jax.random.PRNGKey(11), n, 0.8, jnp.float64)
    x = jnp.ones(n)
    by_name = solve(linear_map, jnp.zeros(n), w, x, solver=get_solver("anderson", tol=1e-9))
    by_object = solve(linear_map, jnp.zeros(n), w, x, solver=Anderson(tol=1e-9))
    np.testing.assert_array_equal(by_name.value, by_object.value)
    assert solvers.get_solver(Picard(tol=1e-3), max_steps=7) == Picard(tol=1e-3, max_steps=7)


@pytest.mark.float64
@pytest.mark.slow
def test_vmap_over_problems():
    n = 16
    keys = jax.random.split(jax.random.PRNGKey(12), 5)
    ws = jax.vmap(lambda k: ensembles.sample("gaussian", k, n, 0.5, jnp.float64))(keys)
    x = jnp.ones(n)
    sols = jax.vmap(lambda w: solve(linear_map, jnp.zeros(n), w, x, solver=deqlab.Anderson(tol=1e-11)))(ws)
    exact = jax.vmap(lambda w: jnp.linalg.solve(jnp.eye(n) - w, x))(ws)
    assert bool(jnp.all(sols.converged))
    np.testing.assert_allclose(sols.value, exact, atol=1e-9)


def test_replace_changes_only_what_it_names_and_validates():
    solver = Anderson(m=3, tol=1e-6)
    stricter = solver.replace(tol=1e-9, max_steps=7)
    assert stricter == Anderson(m=3, tol=1e-9, max_steps=7) and solver == Anderson(m=3, tol=1e-6)
    assert solver.replace() is solver
    with pytest.raises(ValueError, match=r"max_steps"):
        solver.replace(max_steps=0)
    with pytest.raises(ValueError, match=r"stop"):
        Picard().replace(stop="never")
    with pytest.raises(TypeError, match=r"Picard\.replace: `m` is not a setting of Picard; its settings are tol, "):
        Picard().replace(m=3)
    gmres = deqlab.GMRES(restart=4)
    assert gmres.replace(max_steps=9) == deqlab.GMRES(restart=4, max_steps=9)
    with pytest.raises(ValueError, match=r"restart"):
        gmres.replace(restart=0)
    # get_solver applies settings through the same door: a name builds, an object is replaced.
    assert get_solver("picard", max_steps=7) == Picard(max_steps=7)
    assert get_solver(Broyden(m=2), tol=1e-4, max_steps=None) == Broyden(m=2, tol=1e-4)


def test_fixed_point_at_zero_is_reachable():
    # The relative rule has an epsilon floor, so z* = 0 converges instead of stalling.
    sol = solve(lambda z: 0.5 * z, jnp.ones(4), solver=deqlab.Picard(tol=1e-6, max_steps=2000))
    assert bool(sol.converged)


def _bad(**kwargs):
    n = 4
    base = dict(f=linear_map, z0=jnp.zeros(n), args=(jnp.eye(n) * 0.5, jnp.ones(n)))
    base.update(kwargs)
    options = dict(base.get("options", {}))
    settings = base.get("settings")
    if settings is None:
        return lambda: solve(base["f"], base["z0"], *base["args"], **options)
    # a solver setting is checked where the solver object is built (the one place it lives)
    return lambda: solve(base["f"], base["z0"], *base["args"], solver=get_solver("anderson", **settings), **options)


BAD_SOLVE_CALLS = [
    ("solver", dict(options=dict(solver="newton"))),
    ("solver", dict(options=dict(solver=3))),
    ("tol", dict(settings=dict(tol=-1e-3))),
    ("tol", dict(settings=dict(tol=0.0))),
    ("tol", dict(settings=dict(tol=float("nan")))),
    ("max_steps", dict(settings=dict(max_steps=0))),
    ("max_steps", dict(settings=dict(max_steps=2.5))),
    ("batch_axis", dict(options=dict(batch_axis=3))),
    ("batch_axis", dict(options=dict(batch_axis="0"))),
    ("f", dict(f=lambda z, w, x: jnp.concatenate([z, z]))),
    ("f", dict(f=lambda z, w, x: (z, z))),
    ("z0", dict(z0=jnp.array([0.0, jnp.nan, 0.0, 0.0]))),
    (r"args\[1\]", dict(args=(jnp.eye(4) * 0.5, jnp.array([1.0, jnp.inf, 0.0, 0.0])))),
    ("`z0` must be an array or a pytree of arrays", dict(z0=[0.0, 0.0, 0.0, 0.0])),
    ("`on_failure`", dict(options=dict(on_failure="yes"))),
    ("`precision`", dict(options=dict(precision="fast"))),
    ("`solver`", dict(options=dict(solver=None))),
]


@pytest.mark.parametrize("argument,case", BAD_SOLVE_CALLS)
def test_bad_solve_arguments_raise_value_error(argument, case):
    with pytest.raises(ValueError, match=argument):
        _bad(**case)()


@pytest.mark.parametrize(
    "argument,make",
    [
        ("m", lambda: Anderson(m=0)),
        ("ridge", lambda: Anderson(ridge=-1.0)),
        ("damping", lambda: Anderson(damping=0.0)),
        ("damping", lambda: Picard(damping=1.5)),
        ("step", lambda: Broyden(step=0.0)),
        ("m", lambda: Broyden(m=-2)),
        ("max_steps", lambda: Broyden(max_steps=-1)),
    ],
)
def test_bad_solver_configurations_raise_value_error(argument, make, compile_counter):
    """A bad solver setting raises a ValueError naming it where the solver is built, compiling nothing."""
    with compile_counter() as counted, pytest.raises(ValueError, match=argument):
        make()
    assert counted.programs == 0


@pytest.mark.float64
@pytest.mark.slow
@pytest.mark.parametrize("damping", [1.0, 0.6])
def test_picard_returns_the_step_past_its_converged_iterate(damping):
    # z <- (1 - d) z + d (a z + x) per sample, a = 0.5 and 0.95: the first sample converges, the
    # second runs out of steps. The converged one returns the iterate after the one whose residual
    # met tol (f of it was already evaluated), the other its best iterate; the statistics describe
    # the best iterate. An exact replay of the iteration fixes which iterate is which.
    a = jnp.array([0.5, 0.95])
    x = jnp.ones((2, 3))
    f = lambda z, a, x: a[:, None] * z + x  # noqa: E731
    sol = solve(f, jnp.zeros((2, 3)), a, x, solver=Picard(damping=damping, tol=1e-6, max_steps=40), batch_axis=0)
    assert [Result(int(r)) for r in sol.result] == [Result.SUCCESS, Result.MAX_STEPS_REACHED]
    a_np, x_np, value = np.asarray(a), np.asarray(x), np.asarray(sol.value)  # the replay in NumPy: no eager programs
    iterates = [np.zeros((2, 3))]
    for _ in range(41):
        z = iterates[-1]
        iterates.append(z + damping * (f(z, a_np, x_np) - z))
    steps = np.asarray(sol.stats.steps)
    np.testing.assert_allclose(value[0], iterates[steps[0] + 1][0], rtol=1e-14)
    np.testing.assert_allclose(value[1], iterates[steps[1]][1], rtol=1e-14)
    fixed = x_np / (1 - a_np[:, None])
    best = iterates[steps[0]][0]
    assert np.max(np.abs(value[0] - fixed[0])) < np.max(np.abs(best - fixed[0]))
    f_best = a_np[0] * best + x_np[0]
    residual = np.linalg.norm(f_best - best) / np.linalg.norm(f_best)
    np.testing.assert_allclose(np.asarray(sol.stats.residual)[0], residual, rtol=1e-10)


def test_diverged_sample_returns_its_least_diverged_finite_iterate():
    # f(z) = 2 z + 1 runs off from z0 = 0 under Picard (its fixed point -1 repels). The relative
    # residual |z + 1| / |2 z + 1| falls towards 1/2 as z grows, so "best by relative residual"
    # returned the most diverged iterate (16383); the start, absolute residual 1, is the closest
    # to convergence. (Anderson and Broyden solve this linear map exactly: they are secant methods.)
    sol = solve(lambda z: 2 * z + 1, jnp.zeros(3), solver=deqlab.Picard(max_steps=40))
    assert int(sol.result) == Result.DIVERGED
    np.testing.assert_array_equal(sol.value, jnp.zeros(3))


@pytest.mark.parametrize("name", SOLVER_NAMES)
def test_map_without_fixed_point_fails_with_a_finite_value(name):
    """With no fixed point every solver fails, returning a finite iterate no worse than the start."""
    # z + 1 + z^2 / 10 > z for every real z: no fixed point, every solver must fail, and return a
    # finite iterate no farther from convergence (in absolute residual) than the start.
    f = lambda z: z + 1 + 0.1 * z**2  # noqa: E731
    sol = solve(f, jnp.zeros(4), solver=get_solver(name, max_steps=200), on_failure="ignore")
    assert int(sol.result) != Result.SUCCESS
    value = np.asarray(sol.value)  # checked in NumPy (f is elementwise): no eager programs
    assert np.all(np.isfinite(value))
    assert float(np.linalg.norm(f(value) - value)) <= float(np.linalg.norm(f(np.zeros(4, value.dtype))))


@pytest.mark.parametrize("name", SOLVER_NAMES)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_iterates(name, dtype):
    """16-bit iterates reach the dtype's default tolerance and the fixed point to its accuracy."""
    # The mixing and secant systems are solved in float32 (LAPACK has no bfloat16), the iterate
    # stays 16-bit. Reached: the dtype's default tolerance, and the float64 fixed point to the
    # accuracy of the dtype (a few of its epsilons, relative, times 1 / (1 - 0.5)).
    n, batch = 32, 4
    w, u, x = tanh_case(20, n, batch, 0.5)
    # (The casts and the error in NumPy: no eager programs besides the solves.)
    reference = solve(tanh_map, jnp.zeros((batch, n)), w, u, x, solver=deqlab.Anderson(tol=1e-13), batch_axis=0).value
    reference = np.asarray(reference, np.float64)
    half = [jnp.asarray(np.asarray(a).astype(dtype)) for a in (w, u, x)]
    sol = solve(tanh_map, jnp.zeros((batch, n), dtype), *half, solver=name, batch_axis=0)
    assert sol.value.dtype == dtype and np.all(np.asarray(sol.converged)), sol.stats.best_residual
    error = np.linalg.norm(np.asarray(sol.value).astype(np.float64) - reference) / np.linalg.norm(reference)
    assert float(error) <= 2 * 8 * float(jnp.finfo(dtype).eps)


@pytest.mark.float64
@pytest.mark.slow
def test_default_tolerance_follows_the_dtype_and_unreachable_ones_warn_once(monkeypatch):
    f = lambda z: 0.5 * jnp.tanh(z) + 0.3  # noqa: E731
    assert float(solve(f, jnp.zeros(2)).stats.tol) == pytest.approx(1e-10)
    assert float(solve(f, jnp.zeros(2, jnp.float32)).stats.tol) == pytest.approx(1e-5)
    assert float(solve(f, jnp.zeros(2, jnp.float32), solver=Anderson(tol=1e-3)).stats.tol) == pytest.approx(1e-3)
    # A 256-wide tanh layer in float32: rounding f(z) leaves a relative residual near 1e-7.
    n = 256
    w = ensembles.sample("orthogonal", jax.random.PRNGKey(23), n, 0.5, jnp.float32)
    x = jax.random.normal(jax.random.PRNGKey(24), (n,), jnp.float32)
    # The warning comes once per (dtype, tol) and process: forget earlier tests' (and examples') warnings.
    monkeypatch.setattr(precision, "_warned_tols", set())
    with pytest.warns(precision.PrecisionWarning, match=r"tol=1e-09 is below what float32 can reach"):
        sol = solve(lambda z: jnp.tanh(w @ z + x), jnp.zeros(n, jnp.float32), solver=deqlab.Anderson(tol=1e-9, max_steps=200))
    assert not bool(sol.converged)  # and indeed it cannot
    assert float(sol.stats.best_residual) < 10 * precision.attainable_tol(jnp.float32)  # it gets near
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        solve(f, jnp.zeros(2, jnp.float32), solver=deqlab.Anderson(tol=1e-9, max_steps=30))  # once per (dtype, tol)
        assert float(solve(f, jnp.zeros(2, jnp.float32), solver=deqlab.Anderson(tol=1e-9)).stats.best_residual) <= 1e-9  # "in general"
        solve(f, jnp.zeros(2), solver=deqlab.Anderson(tol=1e-9, max_steps=30))  # float64 reaches it


@pytest.mark.parametrize("name", SOLVER_NAMES)
def test_warm_start_continues_the_same_iteration(name):
    """15 steps, then 15 more from Solution.state, equal one solve of 30 steps: the history of
    Anderson and Broyden travels in the state. Orthogonal W at 0.97 needs far more than 30. The
    step limits are traced budgets under one cap of 30, so the first and the whole solve share one
    compiled program (the resumed one, with an init_state, is the other)."""
    n = 24
    w = ensembles.sample("orthogonal", jax.random.PRNGKey(21), n, 0.97, jnp.float64)
    x = jax.random.normal(jax.random.PRNGKey(22), (n,))
    capped = get_solver(name, tol=1e-14, max_steps=30)

    def run(steps, init_state=None):
        budget = solvers.Budget(np.int32(steps), np.asarray(1e-14, x.dtype))
        return solve(linear_map, jnp.zeros(n), w, x, solver=capped, budget=budget, init_state=init_state,
                     on_failure="ignore")

    first = run(15)
    assert isinstance(first.state, SolverState) and not bool(first.converged)
    assert int(first.stats.steps) == 15
    resumed = run(15, first.state)
    whole = run(30)
    assert int(whole.stats.steps) == 30
    # Two programs (with and without init_state) in float32: equal up to rounding, which XLA may
    # do differently in each (fused multiply-adds or not: tests/conftest.py). 1e-5 is 100 eps.
    np.testing.assert_allclose(resumed.state.z, whole.state.z, rtol=1e-5, atol=1e-6)
    if name != "picard":  # Picard has no history: for it, starting again from z is continuing
        # ... and the tolerance tells the iteration apart from a restart that drops the history
        # (the same program as `first`, from its value: 0.03 and 0.026 away for Anderson and Broyden)
        restarted = solve(linear_map, first.value, w, x, solver=capped,
                          budget=solvers.Budget(np.int32(15), np.asarray(1e-14, x.dtype)), on_failure="ignore")
        assert float(jnp.max(jnp.abs(restarted.state.z - whole.state.z))) > 1e-3
    with pytest.raises(ValueError, match="init_state"):
        solve(linear_map, jnp.zeros(n), w, x, solver=name, init_state=(first.state.z,))
    other = "picard" if name != "picard" else "anderson"
    with pytest.raises(ValueError, match="init_state.*another solver"):
        solve(linear_map, jnp.zeros(n), w, x, solver=other, init_state=first.state)


def test_has_aux_returns_the_auxiliary_output_at_the_value():
    def f(z, x):
        nxt = 0.5 * jnp.tanh(z) + x
        return nxt, {"norm": jnp.linalg.norm(nxt)}

    sol = solve(f, jnp.zeros(3), jnp.ones(3), has_aux=True)
    assert bool(sol.converged)
    np.testing.assert_allclose(sol.aux["norm"], jnp.linalg.norm(f(sol.value, jnp.ones(3))[0]), rtol=1e-14)
    with pytest.raises(ValueError, match="has_aux=True"):
        solve(f, jnp.zeros(3), jnp.ones(3))
    with pytest.raises(ValueError, match="must return a pair"):
        solve(lambda z: 0.5 * z, jnp.zeros(3), has_aux=True)


# --------------------------------------------------------------------------------------------
# Error-controlled stopping (stop="error") and checks every k steps (check_every)


def _linear_maps(n, q, seed=0):
    """Three maps z -> A z + b of spectral norm exactly q: A = q Q (Q Haar orthogonal, a rotating
    spectrum), and two symmetric ones with eigenvalues spread over [-q, q] and over [0, q] with
    density rising towards q (the slowest mode dominates late: Picard's hardest case for a rate
    read off its residuals)."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    orthogonal = np.asarray(ensembles.sample("orthogonal", k1, n, 1.0, jnp.float64))
    g = np.asarray(jax.random.normal(k2, (n, n)))
    vectors = np.linalg.eigh((g + g.T) / 2)[1]
    return [q * orthogonal, vectors @ np.diag(np.linspace(-q, q, n)) @ vectors.T,
            vectors @ np.diag(q * np.linspace(0, 1, n) ** 0.5) @ vectors.T]


def per_sample_linear_map(z, a, b):
    return jnp.einsum("bij,bj->bi", a, z) + b


@pytest.mark.float64
@pytest.mark.parametrize("name", SOLVER_NAMES)
@pytest.mark.parametrize("tol,every", [(1e-4, 1), (1e-8, 1), (1e-8, "auto")])
def test_error_rule_delivers_tol_on_linear_maps_of_known_rate(name, tol, every):
    # One batch, one map per sample: spectral norms q = 0.5, 0.9, 0.99, 0.995, three spectra each,
    # inputs at scales 0.1 and 10. Every sample's max-abs error against the exact solution,
    # relative to max(1, max|z*|) (absolute below 1, relative above), is within tol, and the
    # estimate decided (finite), not the fallback residual rule.
    n = 32
    maps = [a for q in (0.5, 0.9, 0.99, 0.995) for a in _linear_maps(n, q)]
    a = np.stack(maps + maps)
    scales = np.repeat([0.1, 10.0], len(maps))[:, None]
    b = np.asarray(jax.random.normal(jax.random.PRNGKey(3), (len(a), n))) * scales
    exact = np.stack([np.linalg.solve(np.eye(n) - ai, bi) for ai, bi in zip(a, b)])
    sol = solve(per_sample_linear_map, jnp.zeros_like(b), a, b,
                solver=get_solver(name, tol=tol, stop="error", max_steps=8000, check_every=every), batch_axis=0)
    error = np.max(np.abs(np.asarray(sol.value) - exact), axis=1) / np.maximum(1.0, np.max(np.abs(exact), axis=1))
    assert bool(jnp.all(sol.converged))
    assert np.all(np.isfinite(np.asarray(sol.stats.error_estimate)))
    assert np.all(error <= tol), error.max() / tol
    # and it is not vacuous: the tightest sample used most of its budget of tol
    assert error.max() > 0.3 * tol


@pytest.mark.float64
@pytest.mark.parametrize("name", SOLVER_NAMES)
def test_error_rule_delivers_tol_on_a_tanh_map_where_the_residual_rule_does_not(name):
    # z = tanh(W z + U x), W orthogonal at 0.97 (Lipschitz <= 0.97). Reference: a float64 solve to
    # a relative residual of 1e-14 (error <= 1e-14 / (1 - 0.97) ~ 3e-13). At the same tol the
    # residual rule stops early: its error exceeds tol (by about 1 / (1 - q) where the spectrum's
    # slow modes lead), which is what the error rule exists to fix.
    w, u, x = tanh_case(seed=2, n=64, batch=8, scale=0.97)
    ref = solve(tanh_map, jnp.zeros_like(x), w, u, x, solver=deqlab.Anderson(tol=1e-14, max_steps=2000), batch_axis=0)
    assert bool(jnp.all(ref.converged))
    tol = 1e-6
    errors = {}
    for rule in ("error", "residual"):
        sol = solve(tanh_map, jnp.zeros_like(x), w, u, x, solver=get_solver(name, tol=tol, stop=rule, max_steps=4000),
                    batch_axis=0)
        assert bool(jnp.all(sol.converged))
        errors[rule] = np.max(np.abs(np.asarray(sol.value - ref.value)), axis=1)
    assert np.all(errors["error"] <= tol), errors["error"].max() / tol
    assert np.max(errors["residual"]) > tol


def test_error_rule_falls_back_to_the_residual_rule_where_the_rate_is_unreliable():
    """stop="error" falls back to the residual rule where the rate estimate is unreliable."""
    # Per sample a -> a z + x: rates 0.5 (estimate reliable), 0.9995 (above RATE_LIMIT: the
    # residual rule decides, error_estimate inf). Picard's first three steps have no estimate yet:
    # a sample whose start is already within tol by the residual rule stops there.
    a = jnp.array([0.5, 0.9995])
    x = jnp.ones((2, 3))
    f = lambda z, a, x: a[:, None] * z + x  # noqa: E731
    tol = 1e-3
    sol = solve(f, jnp.zeros((2, 3)), a, x, solver=Picard(stop="error", tol=tol, max_steps=20000), batch_axis=0)
    estimate = np.asarray(sol.stats.error_estimate)  # checks in NumPy: no eager programs
    assert np.all(np.asarray(sol.converged))
    assert np.isfinite(estimate[0]) and estimate[0] <= tol and np.isinf(estimate[1])
    assert float(np.asarray(sol.stats.residual)[1]) <= tol  # the residual rule's criterion, met
    # the fallback's error is the residual rule's: 1 / (1 - a) times the residual, far above tol
    assert float(np.max(np.abs(np.asarray(sol.value)[1] - 1 / (1 - float(a[1]))))) > tol
    assert solvers.RATE_LIMIT < 0.9995
    # A residual that grows gives a ratio above 1: unreliable, never "converged by estimate".
    grow = solve(lambda z: 1.5 * z + 1.0, jnp.zeros(3), solver=Picard(stop="error", tol=1e-6, max_steps=30))
    assert int(grow.result) == Result.DIVERGED and np.isinf(float(grow.stats.error_estimate))


@pytest.mark.parametrize("name", SOLVER_NAMES)
def test_error_rule_still_reports_failures_inside_jit(name):
    """stop="error" under jit reports too few steps, divergence and NaN per sample."""
    # Too few steps, a diverging sample and a NaN sample: each reported per sample, under jit.
    # Sample 0 contracts at 16 different rates (Anderson would solve a single rate in 2 steps);
    # sample 2 turns NaN once |z| > 1.2, i.e. at its second step.
    a = jnp.stack([jnp.linspace(0.5, 0.99, 16), jnp.full(16, 3.0), jnp.full(16, 0.5)])
    x = jnp.ones((3, 16))

    def f(z, a, x):
        out = a * z + x
        return out.at[2].set(jnp.where(jnp.max(jnp.abs(z[2])) > 1.2, jnp.nan, out[2]))

    sol = jax.jit(lambda a, x: solve(f, jnp.zeros((3, 16)), a, x, solver=get_solver(name, tol=1e-8, stop="error", max_steps=3), batch_axis=0))(a, x)
    result = [Result(int(r)) for r in sol.result]
    value = np.asarray(sol.value)  # checks in NumPy: no eager programs
    assert result[0] == Result.MAX_STEPS_REACHED
    # z -> 3 z + 1: Picard runs away (not converged within 3 steps, never SUCCESS); the root
    # finders head for its repelling fixed point -1/2, and either reach it or are still on the way.
    if name == "picard":
        assert result[1] != Result.SUCCESS
    else:
        assert result[1] != Result.SUCCESS or float(np.max(np.abs(value[1] + 0.5))) < 1e-6
    assert result[2] in (Result.NONFINITE, Result.SUCCESS)
    if result[2] == Result.NONFINITE:
        assert float(np.max(np.abs(value[2]))) <= 1.5
    assert np.all(np.isfinite(value))


@pytest.mark.float64
def test_error_rule_under_vmap_matches_the_batched_solve():
    """stop="error" per sample under vmap takes the batched solve's steps to the same values."""
    a = jnp.array([0.3, 0.8, 0.95])
    x = jnp.ones((3, 5))
    f = lambda z, a, x: a * z + x  # noqa: E731
    one = lambda a, x: solve(f, jnp.zeros(5), a, x, solver=deqlab.Picard(tol=1e-9, stop="error", max_steps=2000))  # noqa: E731
    mapped = jax.vmap(one)(a, x)
    batched = solve(lambda z, a, x: a[:, None] * z + x, jnp.zeros((3, 5)), a, x, solver=deqlab.Picard(tol=1e-9, stop="error", max_steps=2000), batch_axis=0)
    np.testing.assert_array_equal(np.asarray(mapped.stats.steps), np.asarray(batched.stats.steps))
    np.testing.assert_allclose(np.asarray(mapped.value), np.asarray(batched.value), rtol=1e-14)
    np.testing.assert_allclose(np.asarray(batched.value), np.asarray(x) / (1 - np.asarray(a)[:, None]), atol=1e-9)


def nan_map(z):
    """z -> z + 1 has no fixed point (its relative residual stays above 1/4 while |z| <= 3) and
    turns NaN past |z| = 3. Module-level: one function object, so eager solves of it with the same
    solver share one compiled program across tests and parameters."""
    return jnp.where(jnp.abs(z) > 3.0, jnp.nan, z + 1.0)


@pytest.mark.float64
@pytest.mark.parametrize("name", SOLVER_NAMES)
@pytest.mark.parametrize("every", [3])
def test_check_every_judges_every_kth_step_with_the_same_contract(name, every):
    """Steps and the trace advance in chunks of k (then single steps up to the step limit); a
    sample stops at most k - 1 steps after it would with k = 1; failures are still reported. The
    converging solve and the short one are one compiled program: their limits and tolerances are
    traced budgets under the same cap (max_steps=400)."""
    w, u, x = tanh_case(seed=1, n=32, batch=5, scale=0.9)
    base = solve(tanh_map, jnp.zeros_like(x), w, u, x, solver=get_solver(name, tol=1e-9, max_steps=400), batch_axis=0)
    config = get_solver(dataclasses.replace(solvers.get_solver(name), check_every=every), tol=1e-9, max_steps=400)

    def chunked(steps, tol):
        return solve(tanh_map, jnp.zeros_like(x), w, u, x, solver=config, batch_axis=0, on_failure="ignore",
                     budget=solvers.Budget(np.int32(steps), np.asarray(tol, x.dtype)))

    sol = chunked(400, 1e-9)
    steps, base_steps = np.asarray(sol.stats.steps), np.asarray(base.stats.steps)
    assert np.all(np.asarray(sol.converged)) and np.all(np.asarray(base.converged))
    assert np.all(steps % every == 0) and np.all(steps >= base_steps) and np.all(steps < base_steps + every)
    assert np.all(np.asarray(sol.stats.best_residual) <= 1e-9)
    assert int(sol.stats.nfe) == int(np.max(steps)) + 1
    short = chunked(every + 2, 1e-12)
    assert np.all(np.asarray(short.result) == Result.MAX_STEPS_REACHED)
    assert np.all(np.asarray(short.stats.steps) == every + 2)  # one chunk, then two single steps
    # nan_map has no fixed point and turns NaN inside a chunk: reported, never SUCCESS, the value finite.
    bad = solve(nan_map, jnp.zeros(2), solver=get_solver(config, tol=1e-8, max_steps=40), on_failure="ignore")
    bad_value = np.asarray(bad.value)
    assert int(bad.result) != Result.SUCCESS and np.all(np.isfinite(bad_value))
    assert float(np.max(np.abs(bad_value))) <= 3.0


@pytest.mark.float64
@pytest.mark.parametrize("name", SOLVER_NAMES)
@pytest.mark.parametrize("rule", list(solvers.STOPPING_RULES))
def test_check_every_auto_judges_where_the_slowest_sample_is_predicted_to_stop(name, rule):
    """The same iterates as check_every=1, judged at predicted steps: every sample converges, no
    later than AUTO_MAX_SPAN - 1 steps after it would at check_every=1 (runs are capped); Picard,
    whose residual falls monotonically on this contraction, stops no earlier either. The slowest
    sample sets the runs, so it stops within a few steps of its check_every=1 step. The step
    limit is never passed, and failures are still reported."""
    from deqlab.solvers.loop import AUTO_MAX_SPAN

    w, u, x = tanh_case(seed=1, n=32, batch=5, scale=0.9)
    settings = dict(tol=1e-9, max_steps=400, stop=rule)
    base = solve(tanh_map, jnp.zeros_like(x), w, u, x, solver=get_solver(name, **settings), batch_axis=0)
    sol = solve(tanh_map, jnp.zeros_like(x), w, u, x, solver=get_solver(name, check_every="auto", **settings),
                batch_axis=0)
    steps, base_steps = np.asarray(sol.stats.steps), np.asarray(base.stats.steps)
    assert np.all(np.asarray(sol.converged)) and np.all(np.asarray(base.converged))
    assert np.all(steps < base_steps + AUTO_MAX_SPAN), (steps, base_steps)
    if name == "picard":
        assert np.all(steps >= base_steps), (steps, base_steps)
    assert steps.max() <= base_steps.max() + 4, (steps, base_steps)
    assert int(sol.stats.nfe) == int(np.max(steps)) + 1
    if rule == "residual":
        assert np.all(np.asarray(sol.stats.best_residual) <= 1e-9)
    np.testing.assert_allclose(np.asarray(sol.value), np.asarray(base.value), atol=1e-7)
    # Limits as traced budgets under one cap: one program for the three (the loop's limit is the
    # same variable whether it comes from max_steps or a budget).
    capped = get_solver(name, tol=1e-14, max_steps=23, check_every="auto")
    for limit in (1, 7, 23):
        short = solve(tanh_map, jnp.zeros_like(x), w, u, x, solver=capped, batch_axis=0, on_failure="ignore",
                      budget=solvers.Budget(jnp.int32(limit), jnp.float64(1e-14)))
        assert np.all(np.asarray(short.result) == Result.MAX_STEPS_REACHED)
        assert np.all(np.asarray(short.stats.steps) == limit)
    # nan_map (module-level: one program for both rules' parameters)
    bad = solve(nan_map, jnp.zeros(2), solver=get_solver(name, tol=1e-8, max_steps=40, check_every="auto"),
                on_failure="ignore")
    bad_value = np.asarray(bad.value)
    assert int(bad.result) != Result.SUCCESS and np.all(np.isfinite(bad_value))
    assert float(np.max(np.abs(bad_value))) <= 3.0


def test_check_every_auto_keeps_a_stopped_samples_state():
    """check_every="auto" with a solver that freezes its state (Broyden: Solver.freeze_state, the state
    SHINE reuses): a sample that stopped keeps the state it had when it stopped while the rest of the batch
    runs on, so a longer limit for the slow sample leaves the fast one's state as it was. (The runs keep it
    step by step; two programs, one per limit.)"""
    n = 16
    w = np.asarray(ensembles.sample("orthogonal", jax.random.PRNGKey(5), n, 1.0, jnp.float32))
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(6), (2, n)))
    scales = np.asarray([0.2, 0.999], np.float32)
    # the fast sample stops at step 7, short of its fixed point (so further steps would still change its
    # state), and the slow one runs on
    states = []
    for limit in (30, 60):
        sol = solve(lambda z, a, x: a[:, None] * (z @ w.T) + x, np.zeros((2, n), np.float32), scales, x,
                    solver=deqlab.Broyden(tol=1e-3, max_steps=limit, check_every="auto"), batch_axis=0,
                    on_failure="ignore")
        assert np.asarray(sol.result).tolist() == [Result.SUCCESS, Result.MAX_STEPS_REACHED], sol.result
        assert np.asarray(sol.stats.steps).tolist() == [7, limit]
        states.append(jax.tree_util.tree_leaves(sol.state))
    assert all(np.array_equal(np.asarray(a)[0], np.asarray(b)[0]) for a, b in zip(*states))
    assert not all(np.array_equal(np.asarray(a)[1], np.asarray(b)[1]) for a, b in zip(*states))


@pytest.mark.float64
@pytest.mark.parametrize("name", SOLVER_NAMES)
def test_check_every_auto_under_jit_vmap_and_grad(name):
    # A traced run length inside while_loop: the solve composes with jit, vmap and the implicit
    # gradient, and agrees with check_every=1 to the tolerance.
    w, u, x = tanh_case(seed=4, n=16, batch=4, scale=0.8)
    solver = get_solver(name, tol=1e-6, max_steps=300)

    def loss(w, every):
        z = deqlab.fixed_point(tanh_map, jnp.zeros_like(x), w, u, x, solver=solver.replace(check_every=every),
                               batch_axis=0).value
        return jnp.sum(z ** 2)

    grad_auto = jax.jit(jax.grad(lambda w: loss(w, "auto")))(w)
    grad_one = jax.grad(lambda w: loss(w, 1))(w)
    np.testing.assert_allclose(np.asarray(grad_auto), np.asarray(grad_one), rtol=2e-3, atol=2e-4)
    mapped = jax.vmap(lambda xi: solve(tanh_map, jnp.zeros(16), w, u, xi,
                                       solver=solver.replace(check_every="auto")).value)(x)
    batched = solve(tanh_map, jnp.zeros_like(x), w, u, x, solver=solver.replace(check_every="auto"), batch_axis=0)
    assert bool(jnp.all(batched.converged))
    np.testing.assert_allclose(np.asarray(mapped), np.asarray(batched.value), atol=5e-5)


@pytest.mark.parametrize(
    "argument,make",
    [
        ("stop", lambda: Picard(stop="relative")),
        ("check_every", lambda: Picard(check_every="sometimes")),
        ("check_every", lambda: Anderson(check_every=2.5)),
        ("safety", lambda: Anderson(safety=0.5)),
        ("check_every", lambda: Broyden(check_every=0)),
        ("stop", lambda: solve(lambda z: 0.5 * z, jnp.zeros(2), solver=deqlab.Anderson(stop="bogus"))),
    ],
)
def test_bad_stopping_options_raise_value_error(argument, make):
    with pytest.raises(ValueError, match=argument):
        make()


@pytest.mark.float64
def test_real_number_settings_trace_sweep_and_differentiate():
    """Real-number settings are pytree leaves (issue 38, item 5): a damping, an Anderson ridge and
    a tolerance swept with vmap give, lane by lane, the solves with those settings as Python
    numbers (one compiled program for the sweep); a damping is differentiated (three unrolled
    Picard steps of a linear map, whose value is a polynomial in the damping: exact to rounding)."""
    a, b = 0.5, 1.0
    f = lambda z: a * z + b  # noqa: E731
    z0 = jnp.zeros(2)
    sweeps = {
        "damping": (jnp.array([0.3, 0.7, 1.0]), lambda d: Picard(damping=d, tol=1e-8, max_steps=200)),
        "ridge": (jnp.array([1e-6, 1e-2, 1.0]), lambda r: Anderson(ridge=r, tol=1e-8, max_steps=200)),
        "tol": (jnp.array([1e-3, 1e-6, 1e-9]), lambda t: Picard(tol=t, max_steps=200)),
    }
    for name, (values, make) in sweeps.items():
        swept = jax.vmap(lambda v: solve(f, z0, solver=make(v), on_failure="ignore").stats.steps)(values)
        alone = [int(solve(f, z0, solver=make(float(v)), on_failure="ignore").stats.steps) for v in values]
        assert swept.tolist() == alone, (name, swept, alone)
    assert alone[0] < alone[1] < alone[2]  # tighter tolerances take more steps

    def three_steps(d):
        solver = Picard(damping=d, tol=1e-30, max_steps=3)  # unreachable tol: exactly 3 steps
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", precision.PrecisionWarning)
            return solve(f, z0, solver=solver, unrolled=True, on_failure="ignore").value[0]

    def closed_form(d):  # z <- z + d (a z + b - z), three times from 0
        z = 0.0
        for _ in range(3):
            z = z + d * (a * z + b - z)
        return z

    d = 0.6
    np.testing.assert_allclose(jax.grad(three_steps)(d), jax.grad(closed_form)(d), rtol=1e-12)
    np.testing.assert_allclose(three_steps(d), closed_form(d), rtol=1e-12)


def test_settings_that_set_shapes_stay_static_and_validation_runs_at_every_level():
    # an array in a static setting is an error naming it (it would be compiled as a constant)
    with pytest.raises(ValueError, match="Anderson: `m` sets the shape"):
        Anderson(m=jnp.array(5))
    leaves = jax.tree_util.tree_leaves(Anderson(ridge=1e-3))
    assert 1e-3 in leaves and 5 not in leaves and len(leaves) == 4  # divergence, safety, ridge, damping

    class Lazy(deqlab.Solver):  # forgets super().__post_init__()
        def __post_init__(self):
            pass

        def init(self, z, fz):
            return ()

        def propose(self, z, fz, state):
            return fz, state

    with pytest.raises(ValueError, match="solvers.Lazy: `tol` must be a finite real number > 0"):
        Lazy(tol=-1.0)
    with pytest.raises(ValueError, match="`max_steps`"):
        Lazy().replace(max_steps=0)


def test_the_default_loop_evaluates_f_once_in_its_compiled_program():
    """issue 38: the judged-every-step loop (and check_every="auto"'s) evaluates f(z0) in its first iteration (Solver.init_is_first_record, or a
    stateless solver), so f appears once in the optimised program: one tanh for each of deqlab's solvers, where a
    stateful solver that does not declare it evaluates f(z0) before the loop as well. Anderson's and Broyden's
    init must then be their record into a zeroed state, or the folded first iteration would start them wrongly.
    (The hooks are checked inside one jit, where the loop runs them, and the inputs built in NumPy: a handful of
    compiled programs instead of one per eager operation.)"""
    import re

    f = lambda z, x: jnp.tanh(0.5 * z + x)  # noqa: E731
    x = jnp.asarray(np.linspace(-1.0, 1.0, 12).reshape(3, 4), jnp.float32)

    def tanh_count(solver):
        program = jax.jit(lambda x: deqlab.solve(f, jnp.zeros_like(x), x, solver=solver, batch_axis=0,
                                                 on_failure="ignore").value).lower(x).compile().as_text()
        return len(re.findall(r"\btanh\(", program))

    assert all(s.init_is_first_record for s in (deqlab.Anderson, deqlab.Broyden, deqlab.Adaptive))
    assert not deqlab.Solver.init_is_first_record
    assert [tanh_count(s) for s in (deqlab.Picard(), deqlab.Anderson(), deqlab.Broyden(), deqlab.Adaptive())] == [1] * 4
    # check_every="auto" too: its runs of bare steps end in the judged one (no judged step of its own), and its
    # first run is the folded evaluation of z0
    assert [tanh_count(s(check_every="auto")) for s in (deqlab.Picard, deqlab.Anderson, deqlab.Broyden)] == [1] * 3
    # ... and a solver that keeps a state and does not declare it evaluates f(z0) before the loop

    class Counting(deqlab.Solver):
        def init(self, z, fz):
            return jnp.zeros((), jnp.int32)

        def propose(self, z, fz, state):
            return fz, state + 1

    assert tanh_count(Counting()) == 2 and tanh_count(Counting(check_every="auto")) == 2
    anderson, broyden = deqlab.Anderson(m=3), deqlab.Broyden(m=3)
    half_step = deqlab.Broyden(m=3, step=0.5)
    zeros_like = lambda tree: jax.tree_util.tree_map(jnp.zeros_like, tree)  # noqa: E731

    @jax.jit
    def hooks(z, fz):
        # init and the record into the zeroed state, for each solver whose init is its first record
        records = [(solver.init(z, fz), solver.record(z, fz, zeros_like(solver.init(z, fz))))
                   for solver in (anderson, broyden)]
        # (the adaptive solver couples samples: its hooks see a batch, here of one)
        adaptive = deqlab.Adaptive(m=3)
        records.append((adaptive.init(z[None], fz[None]),
                        adaptive.record(z[None], fz[None], zeros_like(adaptive.init(z[None], fz[None])))))
        # Solver.stays_at_fixed_points: propose(z, z, zeroed state) is z exactly (damped too)
        zeroed = zeros_like(anderson.init(z, fz))
        proposals = [solver.propose(fz, fz, state)[0]
                     for solver, state in ((deqlab.Picard(damping=0.7), ()), (anderson, zeroed),
                                           (deqlab.Anderson(m=3, damping=0.6), zeroed),
                                           (half_step, zeros_like(half_step.init(z, fz))))]
        proposals.append(adaptive.propose(fz[None], fz[None], zeros_like(adaptive.init(z[None], fz[None])))[0][0])
        return records, proposals

    z_np = np.arange(4.0, dtype=np.float32)
    z, fz = jnp.asarray(z_np), jnp.asarray(z_np ** 2)
    records, proposals = hooks(z, fz)
    for initial, recorded in records:  # init is the record into the zeroed state, exactly
        assert len(initial) == len(recorded)
        for a, b in zip(initial, recorded):
            jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)
    # which lets the folded first iteration evaluate f at the proposal without selecting z0 over it
    assert all(s.stays_at_fixed_points for s in (deqlab.Picard(damping=0.7), anderson, deqlab.Anderson(m=3, damping=0.6),
                                                 deqlab.Adaptive()))
    for proposal in proposals:
        np.testing.assert_array_equal(proposal, z_np ** 2)
    assert not deqlab.Solver.stays_at_fixed_points
    # a sample converged at z0 takes no step and one evaluation, the others count theirs
    sol = deqlab.solve(f, jnp.zeros((2, 4)), jnp.asarray(np.stack([np.zeros(4), np.ones(4)]), jnp.float32),
                       solver=deqlab.Anderson(), batch_axis=0)
    assert sol.stats.steps.tolist()[0] == 0 and sol.stats.steps.tolist()[1] > 0
    assert int(sol.stats.nfe) == int(np.max(np.asarray(sol.stats.steps))) + 1
