"""The default failure policy compiles to programs without a host callback (issue 38, item 3).

Host callbacks (`jax.debug.callback`) have failed on some TPU set-ups ("Unknown send channel"),
multiply the per-call time of a small jitted solve by 3.5-5.5, and keep a program out of JAX's persistent
compilation cache. Inside `jit`, `on_failure="warn"` (the default), `"nan"` and `"ignore"` add no
callback; only `"raise"` and `"callback"` do. These tests read the lowered program of the forward
solve and of its gradient (what XLA compiles), for every backward mode and for the `nn.DEQ` layer;
the `"callback"` and `"raise"` programs, lowered the same way, contain one (so the search would find
a callback if one were there). They also check that the default program is written to the persistent cache, that
`deqlab.failures.check` raises under `checkify` with its message intact, and that `"nan"` lets a
masked loss train.
"""

from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import deqlab
from deqlab.backward import SHINE, Implicit, JacobianFree, Phantom, Unrolled
from deqlab.nn import DEQ
from deqlab.nn.cells import TanhCell

# The custom calls JAX lowers host callbacks to (the targets differ between jaxlib versions and
# backends: "xla_python_cpu_callback", "xla_ffi_python_cpu_callback", "xla_python_gpu_callback",
# ...), as the lowered StableHLO writes them (`stablehlo.custom_call @target(`, or the generic
# form's `call_target_name = "target"`) and as compiled HLO does (`custom_call_target="target"`).
# Only custom-call targets are searched: file names in the program's metadata may say "callback" too.
CALLBACK_CALL = re.compile(r'custom_call @[\w.]*callback|call_target_name = "[^"]*callback|'
                           r'custom_call_target="[^"]*callback')

N, B = 6, 3


def _has_callback(fn, *args) -> bool:
    """Whether ``jit(fn)``'s lowered program calls back to the host. The lowered program is read, not
    the compiled one: XLA builds the compiled program from it and adds no host call of its own (a
    host callback is a custom call JAX emits), so a callback absent here is absent there; and
    lowering skips the compilation, about a second per gradient program here (issue 39)."""
    text = jax.jit(fn).lower(*args).as_text()
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


# "ignore" compiles the same solve as "warn" (checked on the forward program below), so the
# gradients are read for the two policies that differ.
@pytest.mark.parametrize("policy", ["warn", "nan"])
@pytest.mark.parametrize("name", sorted(BACKWARDS))
def test_no_host_callback_in_forward_or_gradient(name, policy):
    fn, args = _value_and_grad(name, policy)
    assert not _has_callback(fn, *args), f"{name} with on_failure={policy!r} compiles a host callback"


def test_default_solve_compiles_the_ignore_program():
    """The default policy's jitted solve is the "ignore" one, instruction for instruction."""
    f, z0, w, x = _problem()

    def text(**policy):
        run = lambda w, x: deqlab.solve(f, z0, w, x, batch_axis=0, **policy).value  # noqa: E731
        return jax.jit(run).lower(w, x).as_text()

    default = text()
    assert CALLBACK_CALL.search(default) is None
    assert default == text(on_failure="ignore")
    assert default == text(on_failure="warn")


@pytest.mark.parametrize(("name", "policy"), [("implicit", "callback"), ("shine", "raise")])
def test_opted_in_policies_compile_a_callback(name, policy):
    """Positive control: the search finds the callback of the two policies that ask for one."""
    fn, args = _value_and_grad(name, policy)
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


@pytest.mark.parametrize(("policy", "expected"), [("warn", False), ("callback", True)])
def test_deq_layer_training_step(policy, expected):
    cell = TanhCell(N, N, rngs=nnx.Rngs(0))
    layer = DEQ(cell, on_failure=policy)
    graphdef, params = nnx.split(layer)
    _, _, w, x = _problem()

    def loss(params, x):
        return jnp.sum(nnx.merge(graphdef, params)(x) ** 2)

    assert _has_callback(jax.value_and_grad(loss), params, x) is expected


def test_nan_policy_masked_loss_trains_on_the_converged_samples():
    """Item 4: one failing sample does not poison the shared parameters. With on_failure="nan" and
    a loss computed from the value masked by `converged` (then a readout layer V, a parameter
    acting on the value), the gradients of W and V are finite and equal those of the converged
    samples solved alone (up to float32 rounding: the per-sample solves are the same)."""
    f, z0, w, x = _problem()
    scale = jnp.array([1.0, 40.0, 1.0], jnp.float32)[:, None]  # sample 1 cannot converge (above)
    g = lambda z, w, x, s: jnp.tanh(s * (z @ w.T) + x)
    solver = deqlab.Picard(max_steps=60)
    readout = jax.random.normal(jax.random.key(3), (N, 2), jnp.float32)

    def masked_loss(params, x, s):
        w, v = params
        sol = deqlab.fixed_point(g, jnp.zeros_like(x), w, x, s, solver=solver, on_failure="nan", batch_axis=0)
        z = jnp.where(sol.converged[:, None], sol.value, 0.0)  # mask the value before anything uses it
        return jnp.sum((z @ v) ** 2), sol.converged

    grad = jax.jit(jax.grad(masked_loss, has_aux=True))
    (g_all, converged) = grad((w, readout), x, scale)
    assert converged.tolist() == [True, False, True]
    keep = jnp.array([0, 2])
    g_kept, converged_kept = grad((w, readout), x[keep], scale[keep])
    assert bool(jnp.all(converged_kept))
    for got, want in zip(g_all, g_kept):
        assert bool(jnp.all(jnp.isfinite(got)))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    # the unmasked loss is NaN: the failure is not hidden
    sol = deqlab.fixed_point(g, jnp.zeros_like(x), w, x, scale, solver=solver, on_failure="nan", batch_axis=0)
    assert bool(jnp.isnan(jnp.sum(sol.value)))


def test_check_raises_under_checkify_with_its_message_and_eagerly():
    """deqlab.failures.check: the opt-in raise inside jit, with no host callback in the program."""
    from jax.experimental import checkify

    f, z0, w, x = _problem()
    solver = deqlab.Picard(max_steps=2)  # too few steps: every sample fails

    def step(w, x):
        sol = deqlab.solve(f, z0, w, x, solver=solver, batch_axis=0)
        deqlab.failures.check(sol, "step")
        return sol.value

    checked = jax.jit(checkify.checkify(step))
    assert not _has_callback(checkify.checkify(step), w, x)
    err, _ = checked(w, x)
    assert err.get().startswith(f"step: the solve failed for {B}/{B} samples (first: sample 0, result code 1;")
    with pytest.raises(checkify.JaxRuntimeError, match="step: the solve failed"):
        err.throw()
    err, _ = jax.jit(checkify.checkify(lambda w, x: deqlab.solve(f, z0, w, x, batch_axis=0).value))(w, x)
    assert err.get() is None  # nothing checked unless asked
    sol = deqlab.solve(f, z0, w, x, solver=solver, batch_axis=0, on_failure="ignore")
    with pytest.raises(deqlab.SolverError, match=f"solve: the solve failed for {B}/{B} samples"):
        deqlab.failures.check(sol)


_PERSIST = """
import os, sys, jax, jax.numpy as jnp
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
import deqlab
f = lambda z, x: jnp.tanh(0.5 * z + x)
policy = sys.argv[2]
options = {} if policy == "default" else {"on_failure": policy}
def solve_program(x):
    return deqlab.solve(f, jnp.zeros(4), x, solver="picard", **options).value
jax.block_until_ready(jax.jit(solve_program)(jnp.ones(4)))
print(sum(name.startswith("jit_solve_program") for name in os.listdir(sys.argv[1])))
"""


@pytest.mark.parametrize(("policy", "persisted"), [("default", True), ("callback", False)])
def test_default_program_is_written_to_the_persistent_cache(tmp_path, policy, persisted):
    """A fresh process with an empty cache directory writes the default jitted solve to it; the
    "callback" program (positive control) is refused by JAX ("uses host callbacks")."""
    import subprocess
    import sys

    cache = tmp_path / "cache"
    cache.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT"))}
    out = subprocess.run([sys.executable, "-c", _PERSIST, str(cache), policy], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    entries = int(out.stdout.split()[-1])
    assert (entries > 0) is persisted, (policy, entries, out.stderr[-1000:])
