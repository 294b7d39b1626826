"""The tests' precision convention (tests/conftest.py): float32 by default, float64 on request."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

_double = jax.jit(lambda x: x * 2.0)  # one jitted function, traced in both modes below


def test_default_precision_is_float32():
    # An unmarked test runs in JAX's default precision, the one users run.
    assert not jax.config.jax_enable_x64
    assert jnp.zeros(1).dtype == jnp.float32
    assert jnp.asarray(np.float64(0.1)).dtype == jnp.float32
    assert _double(jnp.ones(1)).dtype == jnp.float32


@pytest.mark.float64
def test_float64_marker_enables_x64():
    assert jax.config.jax_enable_x64
    assert jnp.zeros(1).dtype == jnp.float64
    # The same jitted function is traced again in x64: its cache is keyed on the mode.
    assert _double(jnp.ones(1)).dtype == jnp.float64


@pytest.fixture(scope="module")
def module_array():
    return jnp.ones(2)


@pytest.mark.float64
def test_float64_marker_covers_fixture_set_up(module_array):
    # Fixtures are built inside the marked test's protocol, so with x64 on.
    assert module_array.dtype == jnp.float64


def test_default_restored_after_a_float64_test():
    # Runs after the marked tests above (same module, file order): x64 is off again.
    assert not jax.config.jax_enable_x64 and jnp.ones(1).dtype == jnp.float32
    assert _double(jnp.ones(1)).dtype == jnp.float32
