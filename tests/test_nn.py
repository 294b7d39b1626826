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

jax.config.update("jax_enable_x64", True)

from deqlab.nn import DEQ, ResNetCell, TanhCell  # noqa: E402


@pytest.mark.parametrize("cell_type", [TanhCell, ResNetCell])
def test_layer_returns_the_cells_fixed_point(cell_type):
    cell = cell_type(16, 4, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    layer = DEQ(cell, tol=1e-10, max_steps=200)
    x = jax.random.normal(jax.random.PRNGKey(1), (5, 4))
    z, sol = layer(x, return_solution=True)
    assert z.shape == (5, 16)
    np.testing.assert_allclose(cell(z, x), z, atol=1e-8)
    assert float(layer.converged_fraction[...]) == 1.0
    assert float(layer.steps_max[...]) == float(jnp.max(sol.stats.steps))
    assert float(layer.residual_max[...]) <= 1e-10


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

    @nnx.jit
    def step(model, optimizer):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    losses = [step(model, optimizer) for _ in range(30)]
    assert losses[0].dtype == jnp.float32
    assert float(losses[-1]) < 0.5 * float(losses[0])
    assert model.layer.cell.recurrent.kernel[...].dtype == jnp.float32
    assert float(model.layer.converged_fraction[...]) == 1.0


@pytest.mark.parametrize(
    "argument,make",
    [
        ("width", lambda: TanhCell(0, 4, rngs=nnx.Rngs(0))),
        ("in_features", lambda: TanhCell(4, -1, rngs=nnx.Rngs(0))),
        ("hidden", lambda: ResNetCell(4, 4, hidden=0, rngs=nnx.Rngs(0))),
        ("cell", lambda: DEQ(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))),
        ("solver", lambda: DEQ(TanhCell(4, 4, rngs=nnx.Rngs(0)), solver="lbfgs")),
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
    sharded_x = jax.device_put(x, NamedSharding(mesh, P("batch")))
    z = nnx.jit(lambda m, x: m(x))(layer, sharded_x)
    np.testing.assert_allclose(np.asarray(z), np.asarray(expected), atol=1e-5)
    grads = nnx.jit(nnx.grad(lambda m, x: jnp.sum(m(x) ** 2)))(layer, sharded_x)
    print("OK", len(z.sharding.device_set))
    """
)


def test_sharded_batch_on_eight_simulated_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", SHARDED_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK 8" in out.stdout
