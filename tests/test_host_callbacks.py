"""`on_failure="nan"` (and `"ignore"`) compile to programs without a host callback.

Host callbacks (`jax.debug.callback`, which `on_failure="warn"` / `"raise"` use inside `jit`) have
failed on some TPU set-ups ("Unknown send channel"). The book's accelerator section
(book/intro.md) tells readers to choose `on_failure="nan"` there: failing samples come back as NaN
(value and gradient) and the per-sample `Solution.result` codes say why. These tests read the
compiled program of the forward solve and of its gradient, for every backward mode and for the
`nn.DEQ` layer, and find no callback in it; the `"warn"` programs, compiled the same way, contain
one (so the search would find a callback if one were there).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import deqlab
from deqlab.backward import SHINE, Implicit, JacobianFree, Phantom, Unrolled
from deqlab.nn import DEQ
from deqlab.nn.cells import TanhCell

# The custom calls JAX lowers host callbacks to (the targets differ between jaxlib versions and
# backends: "xla_python_cpu_callback", "xla_ffi_python_cpu_callback", "xla_python_gpu_callback",
# ...). Only custom-call targets are searched: file names in the program's metadata may say
# "callback" too.
CALLBACK_CALL = re.compile(r'custom_call_target="[^"]*callback[^"]*"')

N, B = 6, 3


def _has_callback(fn, *args) -> bool:
    text = jax.jit(fn).lower(*args).compile().as_text()
    return CALLBACK_CALL.search(text) is not None


def _problem():
    key_w, key_x = jax.random.split(jax.random.key(0))
    w = 0.5 * jax.random.normal(key_w, (N, N), jnp.float32) / jnp.sqrt(N)
    x = jax.random.normal(key_x, (B, N), jnp.float32)
    f = lambda z, w, x: jnp.tanh(z @ w.T + x)
    return f, jnp.zeros((B, N), jnp.float32), w, x


BACKWARDS = {
    "implicit": Implicit(),
    "implicit-gmres": Implicit(solver="gmres"),
    "unrolled": Unrolled(),
    "phantom": Phantom(steps=3),
    "jacobian-free": JacobianFree(),
    "shine": SHINE(),
}


def _value_and_grad(name, policy):
    f, z0, w, x = _problem()
    solver = "broyden" if name == "shine" else "anderson"
    backward = BACKWARDS[name]

    def loss(w, x):
        sol = deqlab.fixed_point(f, z0, w, x, solver=solver, backward=backward, batch_axis=0, on_failure=policy)
        return jnp.sum(sol.value ** 2), sol.result

    return jax.value_and_grad(loss, has_aux=True), (w, x)


@pytest.mark.parametrize("policy", ["nan", "ignore"])
@pytest.mark.parametrize("name", sorted(BACKWARDS))
def test_no_host_callback_in_forward_or_gradient(name, policy):
    fn, args = _value_and_grad(name, policy)
    assert not _has_callback(fn, *args), f"{name} with on_failure={policy!r} compiles a host callback"


@pytest.mark.parametrize("policy", ["nan", "ignore"])
def test_no_host_callback_in_solve(policy):
    f, z0, w, x = _problem()
    run = lambda w, x: deqlab.solve(f, z0, w, x, batch_axis=0, on_failure=policy).value  # noqa: E731
    assert not _has_callback(run, w, x)
    assert _has_callback(lambda w, x: deqlab.solve(f, z0, w, x, batch_axis=0).value, w, x)  # "warn"


@pytest.mark.parametrize("name", ["implicit", "shine"])
def test_warn_policy_compiles_a_callback(name):
    """Positive control: the search finds the callback that on_failure='warn' uses under jit."""
    fn, args = _value_and_grad(name, "warn")
    assert _has_callback(fn, *args)


def test_nan_policy_reports_failing_samples_without_a_callback():
    """What a TPU user gets instead of a warning: NaN for the failing sample, its result code."""
    f, z0, w, x = _problem()
    # Sample 1's map is scaled far past contraction (gain about 20): Picard cannot converge there
    # in 60 steps, while samples 0 and 2 (rate about 0.5) converge in about 20.
    scale = jnp.array([1.0, 40.0, 1.0], jnp.float32)[:, None]
    g = lambda z, w, x, s: jnp.tanh(s * (z @ w.T) + x)

    def run(w, x, s):
        sol = deqlab.fixed_point(g, z0, w, x, s, solver=deqlab.Picard(max_steps=60),
                                 on_failure="nan", batch_axis=0)
        return sol.value, sol.result

    assert not _has_callback(run, w, x, scale)
    value, result = jax.jit(run)(w, x, scale)
    failed = result != deqlab.Result.SUCCESS
    assert bool(failed[1]) and not bool(failed[0]) and not bool(failed[2])
    assert bool(jnp.all(jnp.isnan(value[1]))) and bool(jnp.all(jnp.isfinite(value[jnp.array([0, 2])])))


@pytest.mark.parametrize(("policy", "expected"), [("nan", False), ("warn", True)])
def test_deq_layer_training_step(policy, expected):
    cell = TanhCell(N, N, rngs=nnx.Rngs(0))
    layer = DEQ(cell, on_failure=policy)
    graphdef, params = nnx.split(layer)
    _, _, w, x = _problem()

    def loss(params, x):
        return jnp.sum(nnx.merge(graphdef, params)(x) ** 2)

    assert _has_callback(jax.value_and_grad(loss), params, x) is expected
