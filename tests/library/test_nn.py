"""The Flax NNX DEQ layer: equilibrium, gradients, stats, training step, sharded batch."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from deqlab.backward import BackwardWarning
from deqlab.nn import DEQ, ResNetCell, TanhCell, capture_solver_stats
from deqlab.solvers import Anderson, Broyden


@pytest.mark.parametrize("cell_type", [TanhCell, ResNetCell])
def test_layer_returns_the_cells_fixed_point(cell_type):
    cell = cell_type(16, 4, rngs=nnx.Rngs(0))  # float32, as the layer is used
    tol = 1e-5  # float32's default tolerance (precision.default_tol)
    layer = DEQ(cell, tol=tol, max_steps=200)
    x = jax.random.normal(jax.random.PRNGKey(1), (5, 4))
    (z, sol), stats = capture_solver_stats(lambda m, x: m(x, return_solution=True))(layer, x)
    assert z.shape == (5, 16) and z.dtype == jnp.float32
    # Per sample |f(z) - z| <= tol * |f(z)| (norms over 16 entries), so each entry is within
    # 4 * tol * max|f(z)|; 10x leaves room for float32 rounding (eps ~ 1.2e-7, far below tol).
    fz = cell(z, x)
    np.testing.assert_allclose(fz, z, rtol=0, atol=10 * tol * float(jnp.max(jnp.abs(fz))))
    (stats,) = stats[""]
    assert float(stats["converged_fraction"]) == 1.0
    assert float(stats["steps_max"]) == float(jnp.max(sol.stats.steps))
    assert float(stats["residual_max"]) <= tol


@pytest.mark.float64
@pytest.mark.slow
def test_layer_gradient_matches_unrolled():
    x = jax.random.normal(jax.random.PRNGKey(2), (3, 4))

    def grads(backward):
        cell = TanhCell(12, 4, ensemble="goe", scale=0.3, param_dtype=jnp.float64, rngs=nnx.Rngs(3))
        layer = DEQ(cell, tol=1e-12, max_steps=120, backward=backward)
        return nnx.grad(lambda m: jnp.sum(m(x) ** 2))(layer)

    # The derivative of the unrolled iterates converges more slowly than the iterates themselves
    # (and Anderson's mixing weights are differentiated too), so at a 1e-12 forward residual the
    # two gradients agree to ~1e-8, well inside the 1e-6 required of gradient checks.
    implicit, unrolled = grads("implicit"), grads("unrolled")
    for a, b in zip(jax.tree_util.tree_leaves(implicit), jax.tree_util.tree_leaves(unrolled)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-12)


@pytest.mark.slow
def test_training_step_reduces_loss_in_float32():
    # Training runs in float32 even though the test session enables x64: parameters, inputs and the
    # solver state all stay float32.
    layer = DEQ(TanhCell(16, 4, rngs=nnx.Rngs(0)), tol=1e-4)
    head = nnx.Linear(16, 1, rngs=nnx.Rngs(1))
    x = jax.random.normal(jax.random.PRNGKey(2), (32, 4), jnp.float32)
    y = jnp.sin(x[:, :1])

    class Model(nnx.Module):
        def __init__(self):
            self.layer, self.head = layer, head

        def __call__(self, x):
            return self.head(self.layer(x))

    model = Model()
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    loss_and_stats = capture_solver_stats(lambda m: jnp.mean((m(x) - y) ** 2))

    @nnx.jit
    def step(model, optimizer):
        (loss, stats), grads = nnx.value_and_grad(loss_and_stats, has_aux=True)(model)
        optimizer.update(model, grads)
        return loss, stats["layer"][0]["converged_fraction"]

    losses, converged = [], []
    for _ in range(30):
        loss, fraction = step(model, optimizer)
        losses.append(loss)
        converged.append(float(fraction))
    assert losses[0].dtype == jnp.float32
    assert float(losses[-1]) < 0.5 * float(losses[0])
    assert model.layer.cell.recurrent.kernel[...].dtype == jnp.float32
    assert converged == [1.0] * 30


@pytest.mark.parametrize(
    "argument,make",
    [
        ("in_features", lambda: TanhCell(4, -1, rngs=nnx.Rngs(0))),
        ("cell", lambda: DEQ(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))),
        ("cell", lambda: DEQ(lambda z, x: z)),
        ("solver", lambda: DEQ(TanhCell(4, 4, rngs=nnx.Rngs(0)), solver="lbfgs")),
        ("backward", lambda: DEQ(TanhCell(4, 4, rngs=nnx.Rngs(0)), backward="adjoint")),
        ("batch_axis", lambda: DEQ(TanhCell(4, 4, rngs=nnx.Rngs(0)), batch_axis="0")),
        ("precision", lambda: DEQ(TanhCell(4, 4, rngs=nnx.Rngs(0)), precision="float8")),
        ("precision", lambda: TanhCell(4, 4, precision="low", rngs=nnx.Rngs(0))),
        ("dtype", lambda: DEQ(TanhCell(4, 4, rngs=nnx.Rngs(0)), dtype=jnp.int32)),
        ("param_dtype", lambda: TanhCell(4, 4, param_dtype="int8", rngs=nnx.Rngs(0))),
        ("tol", lambda: DEQ(TanhCell(4, 4, rngs=nnx.Rngs(0)), tol=0.0)),
        ("max_steps", lambda: DEQ(TanhCell(4, 4, rngs=nnx.Rngs(0)), max_steps=0)),
    ],
)
def test_bad_layer_arguments(argument, make):
    with pytest.raises(ValueError, match=argument):
        make()


SHARDED_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from flax import nnx
    from deqlab.nn import DEQ, TanhCell
    assert jax.device_count() == 8, jax.devices()
    mesh = jax.make_mesh((8,), ("batch",))
    layer = DEQ(TanhCell(16, 4, rngs=nnx.Rngs(0)), tol=1e-5)
    x = jax.random.normal(jax.random.PRNGKey(0), (32, 4))
    expected = layer(x)
    loss = lambda m, x: jnp.sum(m(x) ** 2)
    grads = nnx.grad(loss)(layer, x)  # on one device, before the layer meets the mesh
    sharded_x = jax.device_put(x, NamedSharding(mesh, P("batch")))
    z = nnx.jit(lambda m, x: m(x))(layer, sharded_x)
    np.testing.assert_allclose(np.asarray(z), np.asarray(expected), atol=1e-5)
    sharded_grads = nnx.jit(nnx.grad(loss))(layer, sharded_x)
    for a, b in zip(jax.tree_util.tree_leaves(sharded_grads), jax.tree_util.tree_leaves(grads)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    # The solvers' per-sample hooks (vmap) and the error rule's carry under the explicit mesh:
    # every state and rate leaf split over the batch like the iterates.
    import deqlab
    f = lambda z, x: 0.5 * jnp.tanh(z) + x
    for solver in (deqlab.Picard(stop="error"), deqlab.Anderson(stop="error"), deqlab.Broyden(stop="error")):
        sol = jax.jit(lambda x, s=solver: deqlab.solve(f, jnp.zeros_like(x), x, solver=s, batch_axis=0))(sharded_x)
        assert bool(sol.converged.all()), type(solver).__name__
        assert len(sol.value.sharding.device_set) == 8
    print("OK", len(z.sharding.device_set))
    """
)


@pytest.mark.slow
def test_sharded_batch_on_eight_simulated_devices():
    # the unit tests' compile flags (tests/conftest.py) kept, the simulated devices added
    env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", SHARDED_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK 8" in out.stdout


@pytest.mark.float64
@pytest.mark.slow
def test_configured_solver_keeps_its_settings():
    # A layer given a configured solver runs it as configured (the layer has no defaults of its own
    # that would override it); tol / max_steps given to the layer override only what they name.
    cell = TanhCell(8, 3, rngs=nnx.Rngs(0))
    assert DEQ(cell, solver=Anderson(tol=1e-8, max_steps=500)).solver == Anderson(tol=1e-8, max_steps=500)
    assert DEQ(cell, solver=Broyden(m=3, tol=1e-6), max_steps=7).solver == Broyden(m=3, tol=1e-6, max_steps=7)
    x = jax.random.normal(jax.random.PRNGKey(0), (4, 3), jnp.float32)
    _, sol = DEQ(cell, solver=Anderson(tol=1e-6, max_steps=500))(x, return_solution=True)
    assert float(sol.stats.tol) == pytest.approx(1e-6) and float(jnp.max(sol.stats.best_residual)) <= 1e-6
    # No tolerance anywhere: the dtype's default (float32 1e-5, float64 1e-10).
    _, sol = DEQ(cell)(x, return_solution=True)
    assert float(sol.stats.tol) == pytest.approx(1e-5)
    _, sol = DEQ(cell, dtype=jnp.float64, param_dtype=jnp.float64)(x, return_solution=True)
    assert sol.value.dtype == jnp.float64 and float(sol.stats.tol) == pytest.approx(1e-10)


@pytest.mark.parametrize(
    "shape,dtype,message",
    [
        ((3,), jnp.float32, "batch axis"),  # one unbatched sample: each coordinate is not a sample
        ((5, 2), jnp.float32, "3 features"),
        ((5, 3), jnp.int32, "floating-point"),
    ],
)
def test_bad_inputs_are_named(shape, dtype, message):
    layer = DEQ(TanhCell(8, 3, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match=f"`x`.*{message}"):
        layer(jnp.ones(shape, dtype))
    with pytest.raises(ValueError, match="`z0` must have shape"):
        layer(jnp.ones((5, 3)), jnp.zeros((5, 7)))


@pytest.mark.float64  # its fixed point is checked to 1e-10
def test_unbatched_layer_solves_one_sample():
    cell = TanhCell(8, 3, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (3,))
    z = DEQ(cell, batch_axis=None, tol=1e-12)(x)
    np.testing.assert_allclose(cell(z, x), z, atol=1e-10)


def test_shared_layer_records_every_call():
    # Two calls of one layer in one forward pass: both solves are recorded, neither overwritten.
    layer = DEQ(TanhCell(8, 3, rngs=nnx.Rngs(0)))
    x = jax.random.normal(jax.random.PRNGKey(2), (4, 3), jnp.float32)

    class Twice(nnx.Module):
        def __init__(self):
            self.layer = layer

        def __call__(self, x):
            return self.layer(x) + self.layer(0.1 * x)

    model = Twice()
    run = nnx.jit(capture_solver_stats(lambda m, x: m(x)))
    for _ in range(2):  # the model's state does not grow between calls
        _, stats = run(model, x)
        calls = stats["layer"]
        # 0.1 x keeps tanh in its linear regime, where the Jacobian is the whole of W (radius 0.9):
        # the second call needs more steps, so the two records are told apart.
        assert len(calls) == 2 and calls[0]["steps_mean"] < calls[1]["steps_mean"]
    assert nnx.state(model, nnx.Intermediate) == nnx.State({})
    assert layer(x).shape == (4, 8)  # outside a capture nothing is recorded


@pytest.mark.slow  # the probe table covers forward failures quickly
def test_failed_forward_solve_is_signalled_in_training():
    # max_steps = 2 cannot reach 1e-5. Under nnx.grad (a trace) "callback" warns from inside the
    # program; "nan" makes the loss NaN while the gradient, which no converged sample feeds here,
    # stays finite (zero): a failed sample's value is replaced, not multiplied, by NaN.
    x = jax.random.normal(jax.random.PRNGKey(3), (4, 3), jnp.float32)
    layer = DEQ(TanhCell(8, 3, rngs=nnx.Rngs(0)), max_steps=2, on_failure="callback")
    with pytest.warns(BackwardWarning, match="forward solve did not converge"):
        grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(layer)
        jax.effects_barrier()
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grads))
    strict = DEQ(TanhCell(8, 3, rngs=nnx.Rngs(0)), max_steps=2, on_failure="nan")
    loss, grads = nnx.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(strict)
    assert bool(jnp.isnan(loss))
    assert all(bool(jnp.all(g == 0)) for g in jax.tree_util.tree_leaves(grads))


def test_non_finite_parameter_is_named_by_its_path():
    layer = DEQ(TanhCell(8, 3, rngs=nnx.Rngs(0)))
    layer.cell.recurrent.kernel[...] = layer.cell.recurrent.kernel[...].at[0, 0].set(jnp.nan)
    with pytest.raises(ValueError, match=r"nn.DEQ: `cell\['recurrent'\]\['kernel'\]` contains NaN or inf"):
        layer(jnp.ones((2, 3)))
