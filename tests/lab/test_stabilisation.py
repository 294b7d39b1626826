"""Fixed-point correction of deqlab.nn.DEQ and the remedies experiment
(deqlab.lab.experiments.nonlinear.stabilisation)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from deqlab.lab import data
from deqlab.lab.experiments.nonlinear import stabilisation as st
from deqlab.lab.experiments.nonlinear.training import ResidualTanhCell
from deqlab.nn import DEQ
from deqlab.solvers import get_solver, solve

TINY = dict(width=8, epochs=2, batch_size=32, max_steps=20, monitor_size=16, monitor_steps=20)


def _deq(**kw):
    cell = ResidualTanhCell(6, 4, ensemble="gaussian", scale=0.6, rngs=nnx.Rngs(0))
    return DEQ(cell, solver="anderson", tol=1e-12, max_steps=100, batch_axis=0, param_dtype=jnp.float64, **kw)


@pytest.mark.float64
@pytest.mark.slow
def test_correction_iterates_are_the_solvers_followed_by_one_step():
    with st.x64():
        deq = _deq(correction=3, correction_stride=2)
        x = jax.random.normal(jax.random.key(1), (5, 4), jnp.float64)

        @nnx.jit  # the whole comparison is one compiled program (eager it compiled ~130 small ones)
        def run(deq):
            z, iterates = deq(x, return_iterates=True)
            graphdef, state = nnx.split(deq.cell)

            def step(z, state):
                return nnx.merge(graphdef, state)(z, x)

            hats = [solve(step, jnp.zeros((5, 6)), state, solver=get_solver(deq.solver, max_steps=2 * k),
                          batch_axis=0).value for k in (1, 2, 3)]
            # gradient: one differentiable step from each (detached) solver iterate
            deq_graph, cell_state, rest = nnx.split(deq, nnx.PathContains("cell"), ...)

            def loss(cell_state):
                return jnp.sum(nnx.merge(deq_graph, cell_state, rest)(x, return_iterates=True)[1] ** 2)

            def expected(state):
                return sum(jnp.sum(step(jax.lax.stop_gradient(h), state) ** 2) for h in hats)

            stepped = [step(h, state) for h in hats]
            return z, iterates, deq(x), stepped, jax.grad(loss)(cell_state), jax.grad(expected)(state)

        z, iterates, plain, stepped, got, want = run(deq)
        assert iterates.shape == (3, 5, 6)
        np.testing.assert_array_equal(z, plain)  # the equilibrium is unchanged by the option
        for k in range(3):
            np.testing.assert_allclose(iterates[k], stepped[k], rtol=1e-10, atol=1e-12)
        # the iterates approach z*: the correction trains the early solver path
        distances = [float(np.linalg.norm(iterates[k] - z)) for k in range(3)]
        assert distances == sorted(distances, reverse=True) and distances[-1] < distances[0]
        assert len(jax.tree_util.tree_leaves(got)) == len(jax.tree_util.tree_leaves(want)) == 3
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_correction_arguments():
    with pytest.raises(ValueError, match="`return_iterates=True` needs a layer built with correction"):
        _deq()(jnp.ones((2, 4)), return_iterates=True)
    with pytest.raises(ValueError, match="`correction` must be"):
        _deq(correction=-1)
    with pytest.raises(ValueError, match="`correction_stride` must be"):
        _deq(correction=2, correction_stride=0)


@pytest.mark.float64
@pytest.mark.slow
def test_vmapped_seeds_equal_single_seeds_and_monitor_matches_eigvals():
    both = st.train_remedy("none", 1.2, [0, 1], train_size=128, **TINY)
    one = st.train_remedy("none", 1.2, [1], train_size=128, **TINY)
    np.testing.assert_allclose(both["loss_curve"][1], one["loss_curve"][0], rtol=2e-4)
    np.testing.assert_allclose(both["radius_curve"][1], one["radius_curve"][0], rtol=2e-3)
    assert np.all(np.isfinite(both["loss_curve"])) and both["loss_curve"][0][1] < both["loss_curve"][0][0] + 0.5

    # the initial monitor against numpy.linalg.eigvals of the Jacobian at each test image's z*
    x_test, _ = data.load_dataset("digits", split="test")
    model = st.StabilisedClassifier(64, remedy="none", ensemble="gaussian", scale=1.2,
                                    rngs=nnx.Rngs(jax.random.key(0)), **TINY)
    x = jnp.asarray(x_test[:16])
    _, sol, _ = model(x)
    f, args = model.equilibrium_map()
    jac = jax.vmap(jax.jacobian(lambda z, xi: f(z[None], args, xi[None])[0]))(sol.value, x)
    radii = np.abs(np.linalg.eigvals(np.asarray(jac, np.float64))).max(axis=1)
    # 20 power steps: the geometric-mean estimate's error is about log(kappa) / 10 (stability docstring)
    assert both["initial_radius"][0] == pytest.approx(np.median(radii), rel=0.1)
    assert both["predicted_radius"] > 0 and both["sigma_x2"] > 0


@pytest.mark.slow
def test_every_remedy_trains_and_spectral_norm_bounds_the_radius(tmp_path):
    rows = st.run_stabilisation_sweep(tmp_path, scales=[3.0], seeds=[0, 1],
                                      train_size=128, progress=False, **TINY)
    summary = {s["remedy"]: s for s in st.summarize(rows)}
    assert set(summary) == set(st.REMEDIES)
    for remedy, s in summary.items():
        assert s["diverged_fraction"] == 0, remedy
        assert s["mean_error"] < 0.9, remedy  # better than chance after two tiny epochs
    # ||W_eff|| = 0.9 bounds rho(df/dz) (|tanh'| <= 1), up to the power iterate's lag
    radius = np.asarray(rows[list(st.REMEDIES).index("spectral")]["result"]["radius_curve"])
    assert radius.max() <= 0.9 * 1.05
    # sqrt(V) = 3 is far past chapter 3's critical scale (predicted radius about 1.3; width 8 fluctuates)
    assert summary["none"]["radius_initial"] > 0.9 * 1.05 >= radius.max()


@pytest.mark.slow
def test_gradient_errors_order_the_methods():
    errors = st.gradient_errors(0.8, width=8, batch=16, max_steps=100)
    assert set(errors) == {"implicit", "unrolled", "jacobian_free", "phantom", "shine"}
    assert errors["implicit"]["error"] < 1e-2
    assert errors["phantom"]["error"] < errors["jacobian_free"]["error"]
    assert errors["unrolled"]["memory"] > errors["implicit"]["memory"]
    assert errors["implicit"]["backward_vjps"] > 2  # adjoint iterations + the parameter VJP
    # one count for every method: all VJPs with the layer, the parameter gradient's included
    assert errors["jacobian_free"]["backward_vjps"] == 1 and errors["shine"]["backward_vjps"] == 1
    assert errors["phantom"]["backward_vjps"] == 5 and errors["unrolled"]["backward_vjps"] == 100


def test_bad_arguments():
    with pytest.raises(ValueError, match="`remedy` must be one of"):
        st.train_remedy("magic", 1.0, [0])
    with pytest.raises(ValueError, match="unknown option"):
        st.train_remedy("none", 1.0, [0], colour="red")
    with pytest.raises(ValueError, match="`seeds` must be"):
        st.train_remedy("none", 1.0, [0, 0])
    with pytest.raises(ValueError, match="`target` must be"):
        st.train_remedy("spectral", 1.0, [0], target=-1.0)
    with pytest.raises(ValueError, match="`monitor_size` must be"):
        st.train_remedy("none", 1.0, [0], monitor_size=10**6)
