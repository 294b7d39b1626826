"""Per-call solver budgets (traced max_steps / tol, no recompilation), evaluation-mode settings,
and per-sample warm starts (z0, init_state, FixedPointCache) of nn.DEQ and the language model."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import deqlab
from deqlab import nn
from deqlab.nn import DEQ, FixedPointCache, TanhCell
from deqlab.solvers import Budget, make_budget

CAP = 40
TOL = 1e-6


def _layer(**kw):
    # A cell whose samples need 8 to 40 Anderson steps at tol 1e-6: limits of 10 and 20 bind for
    # some samples and not others (checked below), so a wrong limit shows in the step counts.
    # Anderson by name: these tests are about budgets and caches, calibrated on its step counts.
    settings = dict(solver="anderson", max_steps=CAP, tol=TOL, on_failure="ignore")
    settings.update(kw)
    return DEQ(TanhCell(8, 3, rngs=nnx.Rngs(0)), **settings)


def _x(batch=6, seed=1):
    return jax.random.normal(jax.random.key(seed), (batch, 3))


def test_budget_per_call_compiles_once_and_equals_a_layer_built_with_it():
    layer, x = _layer(), _x()
    traces = []

    @nnx.jit
    def forward(model, x, max_steps, tol):
        traces.append(1)  # runs once per trace (compilation)
        z, sol = model(x, max_steps=max_steps, tol=tol, return_solution=True)
        return z, sol.stats.steps, sol.stats.nfe, sol.result

    for k in (10, 20, 40):
        z, steps, nfe, result = forward(layer, x, k, TOL)
        built = _layer(max_steps=k)
        z_ref, sol_ref = nnx.jit(lambda m, x: m(x, return_solution=True))(built, x)
        np.testing.assert_array_equal(steps, sol_ref.stats.steps)
        np.testing.assert_array_equal(result, sol_ref.result)
        assert int(nfe) == int(sol_ref.stats.nfe)
        # the same iterations in the same order: equal up to XLA's fusion choices (a few ulps)
        np.testing.assert_allclose(z, z_ref, rtol=0, atol=1e-6)
        if k < CAP:
            assert int(steps.max()) == k  # the limit binds for some sample ...
        assert int(steps.min()) < 10  # ... and not for others
    assert len(traces) == 1


def test_tolerance_per_call_matches_a_layer_built_with_it_without_recompiling():
    layer, x = _layer(), _x()
    traces = []

    @nnx.jit
    def forward(model, x, tol):
        traces.append(1)
        z, sol = model(x, tol=tol, return_solution=True)
        return sol.stats.steps

    for tol in (1e-2, 1e-4, 1e-6):
        steps = forward(layer, x, tol)
        _, sol_ref = _layer(tol=tol)(x, return_solution=True)
        np.testing.assert_array_equal(steps, sol_ref.stats.steps)
    assert len(traces) == 1


def test_a_call_without_budget_shares_the_compilation_with_one_with_budget():
    layer, x = _layer(), _x()
    traces = []

    @nnx.jit
    def forward(model, x, max_steps=None):
        traces.append(1)
        return model(x, max_steps=max_steps)

    a = forward(layer, x)
    b = forward(layer, x, jnp.int32(CAP))
    np.testing.assert_array_equal(a, b)
    # None and an array are different pytrees (two traces), but the DEQ's own computation is
    # the same: both equal the eager call
    np.testing.assert_allclose(a, layer(x), atol=1e-6)
    assert len(traces) == 2


def test_traced_budget_outside_the_range_is_clipped_to_the_cap():
    layer, x = _layer(), _x()
    forward = nnx.jit(lambda m, x, k: m(x, max_steps=k, return_solution=True)[1].stats.steps)
    np.testing.assert_array_equal(forward(layer, x, 10_000), forward(layer, x, CAP))
    assert int(forward(layer, x, 0).max()) == 1


@pytest.mark.parametrize("bad, needle", [
    (dict(max_steps=0), "`max_steps` must be an integer in [1, 40]"),
    (dict(max_steps=41), "`max_steps` must be an integer in [1, 40]"),
    (dict(max_steps=2.5), "`max_steps` must be an integer in [1, 40]"),
    (dict(max_steps=True), "`max_steps` must be an integer in [1, 40]"),
    (dict(max_steps=jnp.float32(3.0)), "`max_steps` must be an integer in [1, 40]"),
    (dict(max_steps=jnp.array([3, 4])), "`max_steps` must be an integer in [1, 40]"),
    (dict(tol=0.0), "`tol` must be a finite real number > 0"),
    (dict(tol=float("nan")), "`tol` must be a finite real number > 0"),
    (dict(tol=jnp.int32(1)), "`tol` must be a finite number > 0 or a floating scalar array"),
    (dict(init_state=jnp.zeros(3)), "`init_state` must be the `state`"),
])
def test_bad_budget_values_name_the_argument_and_range(bad, needle):
    with pytest.raises(ValueError) as info:
        _layer()(_x(), **bad)
    assert needle in str(info.value) and "nn.DEQ" in str(info.value)


def test_constructor_checks_evaluation_settings():
    with pytest.raises(ValueError, match="`eval_max_steps` must be an integer >= 1"):
        _layer(eval_max_steps=0)
    with pytest.raises(ValueError, match="`eval_tol` must be a finite real number > 0"):
        _layer(eval_tol=-1.0)
    with pytest.raises(ValueError, match="`deterministic` must be True or False"):
        _layer(deterministic=1)


def test_evaluation_mode_uses_its_own_settings_and_cap():
    x = _x()
    layer = _layer(max_steps=10, eval_max_steps=CAP, eval_tol=1e-3)
    train_steps = layer(x, return_solution=True)[1].stats.steps
    model = nnx.Sequential(layer)  # model.eval() reaches nested layers, as for dropout
    model.eval()
    assert layer.deterministic
    _, sol = layer(x, return_solution=True)
    _, ref = _layer(max_steps=CAP, tol=1e-3)(x, return_solution=True)
    np.testing.assert_array_equal(sol.stats.steps, ref.stats.steps)
    assert float(sol.stats.tol) == pytest.approx(1e-3)
    # in evaluation mode the cap is eval_max_steps: a call may ask for more than max_steps
    assert int(layer(x, max_steps=CAP, tol=TOL, return_solution=True)[1].stats.steps.max()) > 10
    model.train()
    np.testing.assert_array_equal(layer(x, return_solution=True)[1].stats.steps, train_steps)
    assert int(train_steps.max()) == 10


def test_solve_budget_continues_an_unrolled_scan_masked_past_the_limit():
    f = lambda z, w, x: jnp.tanh(w * z + x)  # noqa: E731
    x = _x()
    solver = deqlab.Anderson(max_steps=CAP, tol=TOL)
    for k in (5, CAP):
        budget = make_budget(solver, x.dtype, max_steps=k)
        a = deqlab.solve(f, jnp.zeros_like(x), 0.9, x, solver=solver, batch_axis=0, unrolled=True,
                         on_failure="ignore", budget=budget)
        b = deqlab.solve(f, jnp.zeros_like(x), 0.9, x, solver=solver.replace(max_steps=k), batch_axis=0,
                         unrolled=True, on_failure="ignore")
        np.testing.assert_array_equal(a.stats.steps, b.stats.steps)
        np.testing.assert_allclose(a.value, b.value, atol=1e-6)
    with pytest.raises(ValueError, match="`budget` must be a deqlab.solvers.Budget"):
        deqlab.solve(f, jnp.zeros_like(x), 0.9, x, budget=(5, 1e-3))


def _grads(layer, x, **kw):
    loss = lambda m, x: jnp.sum(jnp.sin(m(x, **kw)))  # noqa: E731
    return jax.tree_util.tree_leaves(nnx.state(nnx.jit(nnx.grad(loss))(layer, x), nnx.Param))


@pytest.mark.parametrize("backward", ["implicit", "unrolled", "phantom"])
def test_gradients_with_a_warm_start_agree_with_a_cold_start(backward):
    """The implicit gradient is a function of z* alone (003 Theorem 1): starting at an earlier
    equilibrium changes the cost, not the gradient. Unrolled and phantom gradients differ from it
    by their own truncation only (the warm start is a constant: no gradient into the previous
    step)."""
    layer, x = _layer(max_steps=200, tol=1e-6, backward=backward), _x()
    cold = _grads(layer, x)
    z_prev, sol_prev = layer(x + 0.05, return_solution=True)  # a nearby earlier equilibrium
    warm = _grads(layer, x, z0=z_prev)
    continued = _grads(layer, x, init_state=sol_prev.state)
    scale = max(float(jnp.abs(g).max()) for g in cold)
    # tol 1e-6 on the forward and adjoint solves bounds each gradient's error by ~1e-6 x the
    # conditioning of (I - J) (below 10 here); 1e-4 relative leaves float32 room
    for a, b, c in zip(cold, warm, continued):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * scale)
        np.testing.assert_allclose(a, c, rtol=0, atol=1e-4 * scale)
    # and the warm start did save steps
    _, warm_sol = layer(x, z_prev, return_solution=True)
    _, cold_sol = layer(x, return_solution=True)
    assert int(warm_sol.stats.steps.sum()) < int(cold_sol.stats.steps.sum())


def test_warm_start_receives_no_gradient():
    layer, x = _layer(backward="unrolled"), _x()
    z_prev = layer(x)
    g = jax.grad(lambda z0: jnp.sum(layer(x, z0)))(z_prev)
    np.testing.assert_array_equal(g, jnp.zeros_like(z_prev))


def test_fixed_point_with_init_state_under_jit_and_grad():
    """Regression: a warm start from an earlier solve's state under jax.grad once raised an
    UnexpectedTracerError (the state closed over by the custom VJP)."""
    f = lambda z, w, x: jnp.tanh(w * z + x)  # noqa: E731
    x = _x()
    solver = deqlab.Anderson(max_steps=100, tol=1e-6)
    first = deqlab.solve(f, jnp.zeros_like(x), 0.7, x, solver=solver, batch_axis=0)

    def loss(w, state, budget):
        sol = deqlab.fixed_point(f, jnp.zeros_like(x), w, x, solver=solver, batch_axis=0,
                                 init_state=state, budget=budget)
        return jnp.sum(sol.value ** 2)

    budget = Budget(jnp.int32(100), jnp.float32(1e-6))
    cold = jax.jit(jax.grad(loss))(0.7, None, budget)
    warm = jax.jit(jax.grad(loss))(0.7, first.state, budget)
    np.testing.assert_allclose(warm, cold, rtol=1e-4)


def test_cache_lookup_update_is_functional_and_checks_its_input():
    cache = FixedPointCache.create(6, (2,))
    assert cache.num_samples == 6 and cache.state_shape == (2,)
    new = cache.update(jnp.array([1, 4]), jnp.array([[1.0, 2.0], [3.0, 4.0]]))
    assert not bool(cache.filled.any())  # unchanged
    np.testing.assert_array_equal(new.lookup(jnp.array([4, 0, 1])), [[3, 4], [0, 0], [1, 2]])
    np.testing.assert_array_equal(new.hits(jnp.array([4, 0])), [True, False])
    with pytest.raises(ValueError, match=r"`indices` must be sample indices in \[0, 6\)"):
        new.lookup(jnp.array([6]))
    with pytest.raises(ValueError, match="`indices` must be a 1-D integer array"):
        new.lookup(jnp.array([[1]]))
    with pytest.raises(ValueError, match=r"`states` must be an array of shape \(2, 2\)"):
        new.update(jnp.array([1, 2]), jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="`num_samples` must be an integer >= 1"):
        FixedPointCache.create(0, (2,))
    # under jit: traced indices, out-of-range ones look up as zeros and are dropped on update
    jitted = jax.jit(lambda c, i, z: (c.lookup(i), c.update(i, z)))
    z0, after = jitted(new, jnp.array([4, 9]), jnp.ones((2, 2)))
    np.testing.assert_array_equal(z0, [[3, 4], [0, 0]])
    np.testing.assert_array_equal(after.filled, [False, True, False, False, True, False])


class _LayerAndHead(nnx.Module):
    def __init__(self, layer, head):
        self.layer, self.head = layer, head


def test_cached_warm_starts_in_a_jitted_training_loop_save_steps():
    """A training loop that looks its batch's starts up by sample index and stores the new
    equilibria: from the second epoch on, each sample starts at its last equilibrium."""
    n, batch = 12, 4
    x_all = _x(n, seed=3)
    y_all = jnp.sin(x_all[:, :1])
    layer = _layer(max_steps=100, tol=1e-5)
    head = nnx.Linear(8, 1, rngs=nnx.Rngs(2))
    model = _LayerAndHead(layer, head)  # a plain module: nnx.List is newer than the floor's flax
    optimizer = nnx.Optimizer(model, optax.sgd(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, cache, indices):
        x, y = x_all[indices], y_all[indices]

        def loss_fn(model):
            z, sol = model.layer(x, cache.lookup(indices), return_solution=True)
            return jnp.mean((model.head(z) - y) ** 2), (z, sol.stats.steps)

        (loss, (z, steps)), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        return loss, steps, cache.update(indices, z)

    cache = FixedPointCache.create(n, (8,))
    epoch_steps = []
    for _ in range(3):
        total = 0
        for start in range(0, n, batch):
            _, steps, cache = step(model, optimizer, cache, jnp.arange(start, start + batch))
            total += int(steps.sum())
        epoch_steps.append(total)
    assert bool(cache.filled.all())
    assert epoch_steps[1] < 0.8 * epoch_steps[0] and epoch_steps[2] < 0.8 * epoch_steps[0], epoch_steps


def _lm(**kw):
    cell = nn.TrellisCell(8, 6, rngs=nnx.Rngs(0))
    return nn.LanguageModel(11, cell, solver="broyden", tol=1e-5, max_steps=30, on_failure="ignore",
                             rngs=nnx.Rngs(1), **kw)


def test_language_model_budget_state_and_warm_start():
    model = _lm(eval_max_steps=5)
    tokens = jax.random.randint(jax.random.key(0), (2, 7), 0, 11)
    traces = []

    @nnx.jit
    def forward(model, tokens, k, z0):
        traces.append(1)
        return model(tokens, max_steps=k, z0=z0, return_state=True)

    zeros = jnp.zeros((2, 7, model.block.cell.width))
    logits, stats, z = forward(model, tokens, 3, zeros)
    assert float(stats["steps_max"]) == 3.0 and z.shape == zeros.shape
    logits, stats, z = forward(model, tokens, 30, zeros)
    assert len(traces) == 1
    np.testing.assert_allclose(logits, model(tokens)[0], atol=1e-5)
    _, warm_stats, _ = forward(model, tokens, 30, z)
    assert float(warm_stats["steps_mean"]) < float(stats["steps_mean"])
    model.eval()
    assert float(model(tokens)[1]["steps_max"]) <= 5.0
    with pytest.raises(ValueError, match="`max_steps` and `tol` are the solver's budget"):
        model(tokens, depth=2, max_steps=3)
