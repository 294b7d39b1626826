"""deqlab.nn.normalization: spectral normalisation (power iteration carried in the module's state,
or exact: SVD, and the FFT formula for circular convolutions) and weight normalisation.

The tests marked float64 check the normalisations against SVD / FFT references to 1e-10..1e-12,
with float64 parameters: far below float32's resolution (eps ~ 1.2e-7)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from deqlab.lab.experiments.nonlinear.training import ResidualTanhCell
from deqlab.nn import DEQ
from deqlab.nn.normalization import PowerIterate, SpectralNorm, WeightNorm, update_estimates


def _dense(n_in=20, n_out=14, seed=0, scale=3.0):
    layer = nnx.Linear(n_in, n_out, rngs=nnx.Rngs(seed), param_dtype=jnp.float64)
    layer.kernel[...] = scale * layer.kernel[...]
    return layer


@pytest.mark.float64
def test_exact_spectral_norm_of_dense_kernel():
    layer = SpectralNorm(_dense(), target=0.7, exact=True, rngs=nnx.Rngs(1))
    assert np.linalg.norm(np.asarray(layer.kernel()), 2) == pytest.approx(0.7, rel=1e-12)
    x = jax.random.normal(jax.random.key(2), (5, 20))
    np.testing.assert_allclose(layer(x), x @ layer.kernel() + layer.layer.bias[...], rtol=1e-12)


@pytest.mark.float64
def test_power_iteration_converges_and_never_overestimates():
    dense = _dense()
    exact = np.linalg.norm(np.asarray(dense.kernel[...]), 2)
    layer = SpectralNorm(dense, target=0.9, power_steps=1, rngs=nnx.Rngs(1))
    sigmas = []
    for _ in range(6):
        sigmas.append(float(layer.sigma()))
        layer.update(5)
    # v^T W u <= sigma_max for unit u, v; the power iteration increases it towards sigma_max
    assert all(s <= exact * (1 + 1e-12) for s in sigmas)
    assert sigmas[0] < 0.99 * exact
    assert sigmas == sorted(sigmas)
    layer.update(2000)  # the rate is (sigma_2 / sigma_1)^2 per step, close to 1 for a square-ish W
    assert float(layer.sigma()) == pytest.approx(exact, rel=1e-6)
    assert np.linalg.norm(np.asarray(layer.kernel()), 2) == pytest.approx(0.9, rel=1e-6)


def test_sigma_gradient_is_the_top_singular_pair():
    dense = _dense()
    layer = SpectralNorm(dense, power_steps=300, rngs=nnx.Rngs(1))
    graphdef, params, rest = nnx.split(layer, nnx.Param, ...)

    def sigma(params):
        return nnx.merge(graphdef, params, rest).sigma()

    grads = jax.grad(sigma)(params)
    exact = jax.grad(lambda k: jnp.linalg.norm(k, 2))(dense.kernel[...])
    np.testing.assert_allclose(grads["layer"]["kernel"][...], exact, atol=1e-6)
    # the power vector is state, not a parameter: it gets no gradient and is not trained
    assert isinstance(layer.u, PowerIterate) and not isinstance(layer.u, nnx.Param)


@pytest.mark.float64
def test_update_estimates_reaches_nested_layers_and_deq_contracts():
    """A residual tanh cell at sqrt(V) = 3 (far past chapter 3's critical scale) whose W is
    normalised to 0.9: the map is a contraction (||J|| <= ||W|| = 0.9), so Picard converges."""
    cell = ResidualTanhCell(16, 8, ensemble="gaussian", scale=3.0, rngs=nnx.Rngs(0))
    cell.recurrent = SpectralNorm(cell.recurrent, target=0.9, power_steps=1, rngs=nnx.Rngs(1))
    deq = DEQ(cell, solver="picard", tol=1e-8, max_steps=400, batch_axis=0)
    before = float(cell.recurrent.sigma())
    update_estimates(deq, 100)
    after = float(cell.recurrent.sigma())
    exact = np.linalg.norm(np.asarray(cell.recurrent.layer.kernel[...]), 2)
    assert before < after == pytest.approx(exact, rel=1e-6)
    x = jax.random.normal(jax.random.key(3), (4, 8))
    _, sol = deq(x, return_solution=True)
    assert bool(jnp.all(sol.converged))
    # Picard's rate is at most 0.9 per step: tol 1e-8 from a residual of order 1 within 200 steps
    assert int(jnp.max(sol.stats.steps)) < np.log(1e-8) / np.log(0.9) + 10


@pytest.mark.float64
def test_exact_spectral_norm_of_circular_convolution():
    """The FFT formula (deqlab.theory.kglm.kernels.conv_spectral_norm) against the norm of the
    convolution's matrix, built column by column from the layer itself."""
    conv = nnx.Conv(3, 4, kernel_size=(3, 3), padding="CIRCULAR", use_bias=False, rngs=nnx.Rngs(0),
                    param_dtype=jnp.float64)
    layer = SpectralNorm(conv, target=0.5, exact=True, input_shape=(6, 6), rngs=nnx.Rngs(1))
    basis = jnp.eye(6 * 6 * 3).reshape(-1, 6, 6, 3)
    matrix = np.asarray(layer(basis).reshape(basis.shape[0], -1))
    assert np.linalg.norm(matrix, 2) == pytest.approx(0.5, rel=1e-10)
    original = np.asarray(conv(basis).reshape(basis.shape[0], -1))
    assert np.linalg.norm(original, 2) != pytest.approx(0.5, rel=1e-2)


@pytest.mark.float64
def test_weight_norm_starts_as_the_layer_and_bounds_columns():
    dense = _dense()
    x = jax.random.normal(jax.random.key(2), (5, 20))
    before = dense(x)
    layer = WeightNorm(dense)
    np.testing.assert_allclose(layer(x), before, rtol=1e-12)
    layer.gain[...] = jnp.full(14, 0.3)
    kernel = np.asarray(layer.kernel())
    np.testing.assert_allclose(np.linalg.norm(kernel, axis=0), 0.3, rtol=1e-12)
    assert np.linalg.norm(kernel, 2) <= np.linalg.norm(np.full(14, 0.3)) + 1e-12


def test_bad_arguments():
    with pytest.raises(ValueError, match="`layer` must be an nnx.Module with a `kernel`"):
        SpectralNorm(nnx.Dropout(0.1), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="`target` must be"):
        SpectralNorm(_dense(), target=0.0, rngs=nnx.Rngs(0))
    conv = nnx.Conv(3, 4, kernel_size=(3, 3), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="`exact` must be True for a convolution"):
        SpectralNorm(conv, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="`input_shape` must be"):
        SpectralNorm(conv, exact=True, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="`steps` must be"):
        update_estimates(_dense(), -1)
    with pytest.raises(ValueError, match="`layer` must be"):
        WeightNorm("dense")


@pytest.mark.float64
@pytest.mark.parametrize("padding, strides", [("SAME", 1), ("VALID", 1), ("SAME", 2), ("CIRCULAR", 2)])
def test_exact_spectral_norm_of_zero_padded_and_strided_convolutions(padding, strides):
    """Not circular, stride 1: the FFT (circular) norm is not the operator's (it left 1.138 for a
    target of 1 with zero padding); the layer's own matrix is normalised to ``target``, and its
    gradient flows through the norm."""
    conv = nnx.Conv(3, 4, kernel_size=(3, 3), padding=padding, strides=strides, rngs=nnx.Rngs(0),
                    param_dtype=jnp.float64)
    layer = SpectralNorm(conv, target=1.0, exact=True, input_shape=(6, 6), rngs=nnx.Rngs(1))

    @nnx.jit  # the layer's matrix and its gradient in one compiled program (eager, ~50 small ones)
    def matrix_and_gradient(layer):
        basis = jnp.eye(6 * 6 * 3).reshape(-1, 6, 6, 3)
        matrix = (layer(basis) - layer(jnp.zeros((1, 6, 6, 3)))).reshape(basis.shape[0], -1)
        return matrix, nnx.grad(lambda m: jnp.sum(m(jnp.ones((1, 6, 6, 3))) ** 2))(layer)

    matrix, grads = matrix_and_gradient(layer)
    assert np.linalg.norm(np.asarray(matrix), 2) == pytest.approx(1.0, rel=1e-10)
    assert np.all(np.isfinite(np.asarray(grads["layer"]["kernel"][...])))


def test_zero_padded_convolution_too_large_for_its_dense_matrix_is_refused():
    from deqlab.nn.normalization import MAX_DENSE_CONV_INPUT

    conv = nnx.Conv(3, 4, kernel_size=(3, 3), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=rf"`layer` must be a convolution with padding='CIRCULAR'.*{MAX_DENSE_CONV_INPUT}"):
        SpectralNorm(conv, exact=True, input_shape=(32, 32), rngs=nnx.Rngs(0))
    circular = nnx.Conv(3, 4, kernel_size=(3, 3), padding="CIRCULAR", rngs=nnx.Rngs(0))
    SpectralNorm(circular, exact=True, input_shape=(32, 32), rngs=nnx.Rngs(0))  # the FFT norm: any size
