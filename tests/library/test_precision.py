"""deqlab.precision: dtype-following tolerances, and TPU matmul precision emulated on the CPU."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from deqlab import precision
from deqlab.nn import DEQ, TanhCell


def test_default_and_attainable_tolerances():
    assert precision.default_tol(jnp.float64) == 1e-10
    assert precision.default_tol(jnp.float32) == 1e-5
    assert precision.default_tol(jnp.float16) == 1e-2 and precision.default_tol(jnp.bfloat16) == 5e-2
    for dtype in (jnp.float64, jnp.float32, jnp.float16, jnp.bfloat16):
        # Every default sits above what its dtype can reach, so a default solve can converge.
        assert precision.default_tol(dtype) > precision.attainable_tol(dtype)
    # Bad arguments: tests/library/test_probe.py (default-tol-int, check-precision-unknown).


def test_required_precision_follows_the_tolerance():
    assert precision.required_precision(1e-2, jnp.float32) == "default"
    assert precision.required_precision(1e-5, jnp.float32) == "high"
    assert precision.required_precision(1e-6, jnp.float32) == "highest"
    assert precision.required_precision(1e-2, jnp.float64) == "highest"  # never demoted


def test_emulated_products_have_the_error_of_their_precision():
    # Relative error of a (64 x 256) @ (256 x 256) product against the exact one: bfloat16 operands
    # give ~2^-9 * sqrt(2) ~ 3e-3, the 3-pass split ~2^-17 ~ 1e-5, "highest" is exact. Outside the
    # emulation every precision is exact on a CPU (what hides the TPU behaviour from CPU tests).
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(k1, (64, 256), jnp.float32)
    b = jax.random.normal(k2, (256, 256), jnp.float32) / 16
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    dims = (((1,), (0,)), ((), ()))

    def error(level, emulate):
        with precision.emulate_accelerator_matmuls(emulate):
            out = precision.dot_general(a, b, dims, precision=level)
        return float(np.linalg.norm(np.asarray(out, np.float64) - exact) / np.linalg.norm(exact))

    assert 1e-3 < error("default", True) < 1e-2
    assert 1e-7 < error("high", True) < 3e-5
    assert error("highest", True) < 1e-6
    assert max(error(level, False) for level in precision.PRECISIONS) < 1e-6
    with precision.emulate_accelerator_matmuls(), jax.default_matmul_precision("high"):
        assert precision.emulating()
        context = precision.dot_general(a, b, dims)  # no explicit precision: the context's
    with precision.emulate_accelerator_matmuls():
        explicit = precision.dot_general(a, b, dims, precision="high")
    np.testing.assert_array_equal(context, explicit)
    assert not precision.emulating()


def test_emulated_tpu_stalls_a_float32_solve_and_the_tolerance_driven_precision_fixes_it():
    # On a TPU a float32 matmul defaults to bfloat16 operands; a DEQ solve to 1e-5 then stalls near
    # a relative residual of 1e-4 to 3e-4 (most samples run to max_steps). precision=None picks
    # "high" for tol = 1e-5, and the solve converges in as many steps as in exact arithmetic.
    cell = TanhCell(128, 16, scale=0.9, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 16), jnp.float32)

    def run(precision_level, emulate):
        with precision.emulate_accelerator_matmuls(emulate):
            layer = DEQ(cell, tol=1e-5, max_steps=150, precision=precision_level)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return jax.jit(lambda x: layer(x, return_solution=True)[1])(x)

    exact = run(None, emulate=False)
    stalled = run("default", emulate=True)
    fixed = run(None, emulate=True)
    assert bool(jnp.all(exact.converged)) and bool(jnp.all(fixed.converged))
    assert float(jnp.mean(stalled.converged)) < 0.5
    assert float(jnp.median(stalled.stats.best_residual)) > 5e-5  # 5 tol: stalled, not slow
    assert abs(float(jnp.mean(fixed.stats.steps)) - float(jnp.mean(exact.stats.steps))) <= 2
