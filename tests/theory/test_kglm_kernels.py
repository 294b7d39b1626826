"""Tests for deqlab.theory.kglm.kernels (004 §4, App. E-G; Sedghi, Gupta & Long 2018).

Tolerances (float64, unit round-off ``u ~ 1.1e-16``):

* PSD: Gram eigenvalues ``>= -1e-10 * largest``. ``eigvalsh`` of a symmetric matrix is backward
  stable, so a PSD matrix shows eigenvalues no lower than ``~ n u ||K||`` (``n <= 150``: ``2e-14``
  relative); ``1e-10`` is far above that and far below the negative eigenvalues that an indefinite
  kernel shows here (``>= 1e-3`` relative).
* ``K y`` versus the convolution, and the FFT singular values versus a dense SVD: sums of at most
  ``c (2r+1)^2 <= 150`` products of numbers ``<= 1`` (or FFTs / SVDs of ``<= 108 x 108``
  matrices), round-off ``<= 1e-13``; we ask for ``1e-12`` (absolute on O(1) values) and
  ``1e-10`` relative for the singular values.
* Power iteration on ``M^T M``: iterated until the Rayleigh quotient changes by less than
  ``1e-15`` relative (the top singular value of a circular convolution has multiplicity 2,
  ``P(-k) = conj P(k)``, which does not slow the convergence of the eigen*value*); then compared to
  ``1e-10``.
"""

import math

import jax
import numpy as np
import pytest

from deqlab.theory.kglm import kernels

# Theory checks: closed forms and limits to ~1e-10, float64 by convention (tests/conftest.py).
pytestmark = pytest.mark.float64

PSD_TOL = 1e-10


def min_relative_eigenvalue(K):
    eig = np.linalg.eigvalsh(np.asarray(K))
    return eig.min() / eig.max()


def power_iteration_norm(M, seed=0, max_steps=20000):
    """Largest singular value of a dense ``M`` by power iteration on ``M^T M`` (test-side reference)."""
    M = np.asarray(M)
    v = np.random.default_rng(seed).standard_normal(M.shape[1])
    v /= np.linalg.norm(v)
    previous = 0.0
    for _ in range(max_steps):
        u = M.T @ (M @ v)
        estimate = float(v @ u)  # Rayleigh quotient of M^T M: sigma_max^2 from below
        v = u / np.linalg.norm(u)
        if abs(estimate - previous) <= 1e-15 * estimate:
            break
        previous = estimate
    else:
        raise AssertionError("power iteration did not converge")
    return math.sqrt(estimate)


# --------------------------------------------------------------------------------------------
# Kernels on points
# --------------------------------------------------------------------------------------------


def test_squared_exponential_values_and_psd():
    rng = np.random.default_rng(1)
    A, B = rng.normal(size=(7, 3)), rng.normal(size=(5, 3))
    k = kernels.squared_exponential(length_scale=0.7, variance=2.5)
    expected = 2.5 * np.exp(-((A[:, None] - B[None]) ** 2).sum(-1) / (2 * 0.49))
    np.testing.assert_allclose(k(A, B), expected, rtol=1e-14, atol=0)
    X = rng.uniform(-3, 3, size=(120, 2))
    assert min_relative_eigenvalue(k(X)) >= -PSD_TOL
    np.testing.assert_allclose(np.diag(k(X)), 2.5, rtol=1e-15)


def test_k_true_is_the_formula_of_004_section_4_and_psd():
    x = np.linspace(-2 * np.pi - 2, 2 * np.pi, 100)  # the task's X and X~ span this interval
    r = np.abs(x[:, None] - x[None, :])
    paper = 0.1 * np.exp(-r**2 / 2) * np.exp(-np.sin(r) ** 2)
    K = kernels.k_true()(x)
    np.testing.assert_allclose(K, paper, rtol=1e-13, atol=0)
    assert min_relative_eigenvalue(K) >= -PSD_TOL
    # and it is the product of the named factors with the parameters of K_TRUE
    p = kernels.K_TRUE
    product = (kernels.squared_exponential(p["se_length_scale"], p["variance"])
               * kernels.periodic(p["period"], p["periodic_length_scale"]))
    np.testing.assert_allclose(product(x), K, rtol=1e-15)


def test_periodic_is_periodic_and_psd_in_two_dimensions():
    rng = np.random.default_rng(2)
    k = kernels.periodic(period=1.7, length_scale=0.8, variance=1.3)
    A, B = rng.normal(size=(6, 2)), rng.normal(size=(4, 2))
    np.testing.assert_allclose(k(A, B + np.array([1.7, -3.4])), k(A, B), rtol=1e-12)
    X = rng.uniform(-3, 3, size=(150, 2))
    assert min_relative_eigenvalue(k(X)) >= -PSD_TOL
    # the coordinate-wise form is needed: sin^2 of the Euclidean distance is not PSD in 2-D
    R = np.sqrt(((X[:, None] - X[None]) ** 2).sum(-1))
    assert min_relative_eigenvalue(np.exp(-np.sin(R) ** 2)) < -1e-3


def test_white_noise_and_app_g_kernel_strictly_positive_definite():
    x = np.linspace(0, 1, 50)
    k = kernels.squared_exponential(1.0) * kernels.white_noise(1.0)
    np.testing.assert_allclose(k(x), np.eye(50), atol=0)
    K = np.asarray(kernels.squared_exponential(1.0)(x)) + np.asarray(kernels.white_noise(1e-8)(x))
    assert np.linalg.eigvalsh(K).min() > 0.5e-8  # App. G: the jitter makes K strictly PD


def test_kernels_trace_under_jit_and_vmap():
    k = kernels.k_true()
    x = np.linspace(0, 3, 9)
    np.testing.assert_allclose(jax.jit(k)(x, x), k(x, x), rtol=1e-15)
    rows = jax.vmap(lambda a: k(a[None, None], x)[0])(x)
    np.testing.assert_allclose(rows, k(x, x), rtol=1e-15)


@pytest.mark.parametrize("make, kwargs, name", [
    (kernels.squared_exponential, {"length_scale": 0.0}, "length_scale"),
    (kernels.squared_exponential, {"variance": -1.0}, "variance"),
    (kernels.squared_exponential, {"length_scale": float("nan")}, "length_scale"),
    (kernels.periodic, {"period": 0.0}, "period"),
    (kernels.white_noise, {"variance": 0.0}, "variance"),
    (kernels.image_kernel, {"radius": -1}, "radius"),
    (kernels.image_kernel, {"radius": 1, "length_scale": -2.0}, "length_scale"),
    (kernels.image_kernel, {"radius": 1, "channels": 2, "channel_covariance": [[1, 2], [0, 1]]},
     "channel_covariance"),
    (kernels.image_kernel, {"radius": 1, "truncation": "box"}, "truncation"),
])
def test_bad_parameters_raise(make, kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}` must be"):
        make(**kwargs)


def test_bad_points_raise():
    k = kernels.squared_exponential()
    with pytest.raises(ValueError, match="`B` must be points of the dimension of A"):
        k(np.zeros((3, 2)), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="`A` must be a real array of points"):
        k(np.zeros((2, 2, 2)))


# --------------------------------------------------------------------------------------------
# The image kernel of 004 App. E and Corollary 11
# --------------------------------------------------------------------------------------------

IMAGE_KERNELS = [
    dict(radius=(2, 1), length_scale=[[1.0, 1.5, 0.7], [1.5, 0.8, 1.2], [0.7, 1.2, 2.0]], channels=3,
         channel_covariance=[[1.0, 0.4, 0.1], [0.4, 2.0, 0.3], [0.1, 0.3, 1.5]]),
    pytest.param(dict(radius=1, length_scale=1.3, channels=1), marks=pytest.mark.slow),
    pytest.param(dict(radius=2, length_scale=1.1, channels=2, truncation="triangular"),
                 marks=pytest.mark.slow),
]


@pytest.mark.parametrize("spec", IMAGE_KERNELS)
@pytest.mark.parametrize("padding", ["zero", "circular"])
def test_image_kernel_matrix_is_the_convolution(spec, padding):
    """004 Corollary 11 / Fig. 4: kappa(X, X) y equals the convolution of y with the filter C."""
    kappa = kernels.image_kernel(**spec)
    c, (h, w) = kappa.channels, (6, 5)
    K = np.asarray(kappa.matrix(h, w, padding))
    y = np.random.default_rng(3).normal(size=(c, h, w))
    conv = np.asarray(kappa.apply(y, padding)).ravel()
    np.testing.assert_allclose(K @ y.ravel(), conv, rtol=0, atol=1e-12)
    np.testing.assert_allclose(K, np.asarray(kernels.conv_matrix(kappa.filter(), (c, h, w), padding)),
                               rtol=0, atol=1e-12)
    np.testing.assert_array_equal(K, K.T)
    # sparsity of Fig. 4: entries vanish beyond the radius (zero padding: no wrap-around)
    if padding == "zero":
        X = kernels.image_coordinates(h, w, c)
        near = ((np.abs(X[:, None, 0] - X[None, :, 0]) <= kappa.radius[0])
                & (np.abs(X[:, None, 1] - X[None, :, 1]) <= kappa.radius[1]))
        assert np.all(K[~near] == 0) and np.all(K[near] != 0)


def test_image_kernel_zero_padding_has_border_rows_and_nonzero_pattern():
    kappa = kernels.image_kernel(radius=1, length_scale=2.0)
    K = np.asarray(kappa.matrix(4, 4))
    nonzeros = (K != 0).sum(axis=1).reshape(4, 4)
    # interior pixels see a full 3 x 3 neighbourhood, edges 6, corners 4 (zero padding, Def. 9)
    np.testing.assert_array_equal(nonzeros, [[4, 6, 6, 4], [6, 9, 9, 6], [6, 9, 9, 6], [4, 6, 6, 4]])


def test_image_kernel_filter_is_centre_to_offset_kernel():
    kappa = kernels.image_kernel(radius=(1, 2), length_scale=0.8, channels=2,
                                 channel_covariance=[[1.0, 0.3], [0.3, 0.5]])
    C = np.asarray(kappa.filter())
    assert C.shape == (2, 2, 3, 5)
    centres = np.array([[5.0, 5.0, a] for a in range(2)])
    offsets = np.array([[5.0 + p - 1, 5.0 + q - 2, b] for b in range(2) for p in range(3) for q in range(5)])
    np.testing.assert_allclose(C, np.asarray(kappa(centres, offsets)).reshape(2, 2, 3, 5), rtol=1e-15)


def test_indicator_truncation_is_not_psd_erratum():
    """004 App. E: "these functions each define a PSD kernel" fails for the box truncation."""
    x = np.arange(3.0)
    box = (np.abs(x[:, None] - x[None]) <= 1).astype(float)
    np.testing.assert_allclose(np.linalg.eigvalsh(box).min(), 1 - math.sqrt(2), rtol=1e-14)
    # App. E's own example: exp(-|d|^2 / 20), |d|_inf <= 5, on a 12 x 12 image
    example = kernels.image_kernel(radius=5, length_scale=math.sqrt(10.0))
    assert min_relative_eigenvalue(example.matrix(12, 12)) < -1e-2
    # App. F: r = 3 with squared length scale 4 (upper end of its U(0, 4) draw)
    app_f = kernels.image_kernel(radius=3, length_scale=2.0)
    assert min_relative_eigenvalue(app_f.matrix(12, 12)) < -1e-2
    # the triangular taper keeps the support and is PSD (also with several channels)
    for kappa in (kernels.image_kernel(radius=5, length_scale=math.sqrt(10.0), truncation="triangular"),
                  kernels.image_kernel(radius=3, length_scale=2.0, channels=2, truncation="triangular",
                                       channel_covariance=[[1.0, 0.9], [0.9, 1.0]])):
        assert min_relative_eigenvalue(kappa.matrix(12, 12)) >= -PSD_TOL


def test_image_kernel_circular_needs_room():
    with pytest.raises(ValueError, match="`height` must be >= 2 r \\+ 1"):
        kernels.image_kernel(radius=3).matrix(5, 8, "circular")


# --------------------------------------------------------------------------------------------
# Spectral norm of convolutions (Sedghi et al. 2018)
# --------------------------------------------------------------------------------------------

CONV_SHAPES = [((2, 3, 3, 3), (6, 6)), ((1, 2, 7, 7), (4, 4)),  # filter larger than the image
               pytest.param((3, 2, 3, 3), (6, 6), marks=pytest.mark.slow),
               pytest.param((2, 2, 5, 3), (6, 5), marks=pytest.mark.slow),  # non-square, even width
               pytest.param((3, 3, 2, 4), (5, 6), marks=pytest.mark.slow)]  # even filter sizes


@pytest.mark.parametrize("weights_shape, spatial", CONV_SHAPES)
def test_fft_spectral_norm_matches_dense_svd_and_power_iteration(weights_shape, spatial):
    rng = np.random.default_rng(sum(weights_shape) + sum(spatial))
    W = rng.normal(size=weights_shape)
    c_out, c_in = weights_shape[:2]
    M = np.asarray(kernels.conv_matrix(W, (c_in, *spatial), "circular"))
    dense = np.linalg.svd(M, compute_uv=False)
    norm, all_sv = kernels.conv_spectral_norm(W, spatial, return_all=True)
    assert all_sv.shape == (*spatial, min(c_out, c_in))
    np.testing.assert_allclose(float(norm), dense[0], rtol=1e-10)
    np.testing.assert_allclose(np.sort(np.asarray(all_sv).ravel())[::-1], dense[:all_sv.size],
                               rtol=0, atol=1e-10 * dense[0])
    np.testing.assert_allclose(float(norm), power_iteration_norm(M), rtol=1e-10)


def test_spectral_norm_of_the_image_kernel_and_jit():
    """004 §4: lambda = ||K|| / C with ||K|| by the FFT; the circular K of App. E checked densely."""
    kappa = kernels.image_kernel(radius=2, length_scale=1.2, channels=3,
                                 channel_covariance=[[1.0, 0.2, 0.1], [0.2, 1.0, 0.3], [0.1, 0.3, 1.0]])
    K = np.asarray(kappa.matrix(6, 6, "circular"))
    fft_norm = jax.jit(kernels.conv_spectral_norm, static_argnums=(1,))(kappa.filter(), (6, 6))
    np.testing.assert_allclose(float(fft_norm), np.linalg.norm(K, 2), rtol=1e-10)
    np.testing.assert_allclose(float(fft_norm), power_iteration_norm(K), rtol=1e-10)


def laplacian_weights():
    """The separable 3 x 3 Laplacian-like filter [-1, 2, -1] x [-1, 2, -1], one channel."""
    d = np.array([-1.0, 2.0, -1.0])
    return np.outer(d, d)[None, None]


def test_zero_padding_fft_at_input_size_is_not_a_bound_either_way():
    """Docstring claim of conv_spectral_norm: for zero padding the FFT at the input size may be
    above (all-positive filter) or below (Laplacian, odd size) the true norm."""
    ones = np.ones((1, 1, 3, 3))
    true_ones = np.linalg.norm(np.asarray(kernels.conv_matrix(ones, (1, 5, 5), "zero")), 2)
    assert float(kernels.conv_spectral_norm(ones, (5, 5))) == pytest.approx(9.0, rel=1e-12)
    assert true_ones < 9.0 - 0.5
    lap = laplacian_weights()
    true_lap = np.linalg.norm(np.asarray(kernels.conv_matrix(lap, (1, 3, 3), "zero")), 2)
    # Dirichlet: (2 + sqrt 2)^2 versus circular on 3 points: 3^2
    np.testing.assert_allclose(true_lap, (2 + math.sqrt(2)) ** 2, rtol=1e-12)
    np.testing.assert_allclose(float(kernels.conv_spectral_norm(lap, (3, 3))), 9.0, rtol=1e-12)
    assert true_lap > 9.0 + 1.0


@pytest.mark.parametrize("weights_shape, spatial", CONV_SHAPES)
def test_zero_padded_bound_holds(weights_shape, spatial):
    rng = np.random.default_rng(7 + sum(weights_shape))
    W = rng.normal(size=weights_shape)
    true = np.linalg.norm(np.asarray(kernels.conv_matrix(W, (weights_shape[1], *spatial), "zero")), 2)
    bound = float(kernels.zero_padded_conv_norm_bound(W, spatial))
    assert true <= bound * (1 + 1e-12)
    # the Laplacian on 3 x 3, where the input-size FFT fails, is also below the bound
    lap_true = np.linalg.norm(np.asarray(kernels.conv_matrix(laplacian_weights(), (1, 3, 3), "zero")), 2)
    assert lap_true <= float(kernels.zero_padded_conv_norm_bound(laplacian_weights(), (3, 3))) * (1 + 1e-12)


def test_conv_argument_checks():
    W = np.ones((2, 3, 3, 3))
    with pytest.raises(ValueError, match="`input_shape\\[0\\]` must be the kernel's input channels"):
        kernels.conv_spectral_norm(W, (2, 6, 6))
    with pytest.raises(ValueError, match="`kernel_weights` must be"):
        kernels.conv_spectral_norm(np.ones((3, 3)), (6, 6))
    with pytest.raises(ValueError, match="`padding` must be"):
        kernels.conv2d(W, np.ones((3, 4, 4)), padding="reflect")
    with pytest.raises(ValueError, match="`image` must be"):
        kernels.conv2d(W, np.ones((2, 4, 4)))
    with pytest.raises(ValueError, match="`input_shape \\(height\\)` must be"):
        kernels.conv_matrix(W, (0, 4))


@pytest.mark.parametrize("padding", ["zero", "circular"])
def test_conv_power_iteration_is_a_lower_bound_that_reaches_the_dense_norm(padding):
    rng = np.random.default_rng(7)
    W = rng.normal(size=(2, 3, 3, 3))
    M = np.asarray(kernels.conv_matrix(W, (3, 5, 6), padding))
    dense = np.linalg.norm(M, 2)
    few = float(kernels.conv_power_iteration(W, (5, 6), padding, steps=2))
    many = float(kernels.conv_power_iteration(W, (3, 5, 6), padding, steps=400, key=jax.random.PRNGKey(3)))
    assert few <= dense * (1 + 1e-12)  # a Rayleigh quotient never exceeds the norm
    np.testing.assert_allclose(many, dense, rtol=1e-9)
    if padding == "zero":
        assert many <= float(kernels.zero_padded_conv_norm_bound(W, (5, 6))) * (1 + 1e-12)


def test_conv_power_iteration_argument_checks():
    W = np.ones((1, 1, 3, 3))
    with pytest.raises(ValueError, match="steps"):
        kernels.conv_power_iteration(W, (4, 4), steps=0)
    with pytest.raises(ValueError, match="padding"):
        kernels.conv_power_iteration(W, (4, 4), padding="reflect")
    with pytest.raises(ValueError, match="input_shape"):
        kernels.conv_power_iteration(W, (2, 4, 4))
