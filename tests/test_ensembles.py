"""Tests for deqlab.ensembles (001 §2.1.2, App. A.1).

Statistical tolerances. All random tests use fixed keys, so they are deterministic; the
tolerances are chosen so that a *correct* sampler would fail with negligible probability for a
random key, while the bugs they guard against (wrong normalisation, missing symmetrisation,
missing QR sign correction) move the statistic by many standard errors:

* Moments of N i.i.d. Gaussian entries of variance v: the sample mean has standard error
  sqrt(v / N); the mean of squares (known mean 0) has standard error sqrt(2 / N) * v, because
  Var(x^2) = 2 v^2. We assert within Z = 6 standard errors (two-sided p ~ 2e-9).
* Distributional checks use Kolmogorov-Smirnov against an *exact* law, rejecting at p < 1e-3.
* Spectral radii: see test_spectral_radius_tends_to_limit.
"""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402
from scipy import stats  # noqa: E402

from deqlab import ensembles  # noqa: E402

Z = 6.0  # number of standard errors allowed in moment checks
P_MIN = 1e-3  # KS rejection threshold


def _batch(name, n, count, scale=1.0, dtype=jnp.float64, seed=0):
    keys = jax.random.split(jax.random.key(seed), count)
    return np.asarray(jax.vmap(lambda k: ensembles.sample(name, k, n, scale, dtype))(keys))


def _check_mean_var(x, var):
    """Mean 0 and variance ``var`` of i.i.d. N(0, var) samples ``x``, to Z standard errors."""
    x = np.ravel(x)
    count = x.size
    assert abs(x.mean()) < Z * np.sqrt(var / count), (x.mean(), var, count)
    assert abs(np.mean(x**2) - var) < Z * np.sqrt(2.0 / count) * var, (np.mean(x**2), var)


# ---------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------


def test_ensemble_names_and_critical_values():
    assert ensembles.ENSEMBLES == ("gaussian", "orthogonal", "goe", "antisymmetric")
    expected = {"gaussian": 1.0, "orthogonal": 1.0, "goe": 0.5, "antisymmetric": 0.5}
    for name, s_c in expected.items():
        assert ensembles.critical_scale(name) == s_c
        assert ensembles.critical_variance(name) == s_c**2
        # At the critical scale the limiting spectral radius is exactly 1 (001 §2.1.2).
        assert ensembles.spectral_radius_limit(name, s_c) == pytest.approx(1.0)
        assert ensembles.spectral_radius_limit(name, 0.3) == pytest.approx(0.3 / s_c)


# ---------------------------------------------------------------------------------------------
# Entry moments
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [1.0, 0.7])
def test_gaussian_entry_moments(scale):
    n = 256  # one matrix: n^2 = 65536 i.i.d. entries, relative SE of the variance 0.55%
    w = np.asarray(ensembles.sample("gaussian", jax.random.key(1), n, scale, jnp.float64))
    _check_mean_var(w, scale**2 / n)


def test_goe_entry_moments_and_symmetry():
    n, count = 128, 32
    w = _batch("goe", n, count, seed=2)
    # Exact symmetry (not just approximately: W = (G + G^T) / sqrt(2n)).
    np.testing.assert_array_equal(w, np.swapaxes(w, -1, -2))
    iu = np.triu_indices(n, 1)
    # Diagonal: count * n = 4096 entries, relative SE sqrt(2/4096) = 2.2%; 6 SE = 13%, so the
    # diagonal variance 2/n is clearly separated from the off-diagonal 1/n.
    _check_mean_var(np.diagonal(w, axis1=-2, axis2=-1), 2.0 / n)
    # Off-diagonal (upper triangle only: the lower one is a copy): ~260k entries.
    _check_mean_var(w[:, iu[0], iu[1]], 1.0 / n)


def test_antisymmetric_entry_moments_and_antisymmetry():
    n, count = 128, 32
    w = _batch("antisymmetric", n, count, seed=3)
    np.testing.assert_array_equal(w, -np.swapaxes(w, -1, -2))
    np.testing.assert_array_equal(np.diagonal(w, axis1=-2, axis2=-1), 0.0)
    iu = np.triu_indices(n, 1)
    _check_mean_var(w[:, iu[0], iu[1]], 1.0 / n)


def test_moment_check_has_power():
    # The moment check is not vacuous: a matrix with the wrong variance (GOE normalised by
    # sqrt(n) instead of sqrt(2n), i.e. off-diagonal variance 2/n) is rejected.
    n = 128
    g = np.asarray(jax.random.normal(jax.random.key(4), (n, n), jnp.float64))
    wrong = (g + g.T) / np.sqrt(n)
    iu = np.triu_indices(n, 1)
    with pytest.raises(AssertionError):
        _check_mean_var(wrong[iu], 1.0 / n)


# ---------------------------------------------------------------------------------------------
# Orthogonal ensemble: orthogonality and Haar measure
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [1.0, 0.9])
def test_orthogonal_is_orthogonal(scale):
    n = 64
    w = np.asarray(ensembles.sample("orthogonal", jax.random.key(5), n, scale, jnp.float64))
    eye = np.eye(n)
    np.testing.assert_allclose(w.T @ w, scale**2 * eye, atol=1e-12)
    np.testing.assert_allclose(w @ w.T, scale**2 * eye, atol=1e-12)
    # Each column is a unit vector, so the mean of squares is exactly scale^2 / n.
    assert np.mean(w**2) == pytest.approx(scale**2 / n, rel=1e-12)


def _entry_law(n):
    # A column of a Haar O(n) matrix is uniform on the sphere S^{n-1}, so any entry u
    # satisfies (u + 1) / 2 ~ Beta((n-1)/2, (n-1)/2) exactly (sqrt(n) u -> N(0, 1) as n -> inf).
    a = (n - 1) / 2
    return lambda u: stats.beta(a, a).cdf((np.asarray(u) + 1) / 2)


def _uncorrected_qr_batch(n, count, seed):
    g = np.random.default_rng(seed).standard_normal((count, n, n))
    return np.linalg.qr(g)[0]  # Householder Q *without* the sign(diag R) correction


def test_orthogonal_entries_follow_haar_law():
    n, count = 6, 2000
    o = _batch("orthogonal", n, count, seed=6)
    cdf = _entry_law(n)
    for i, j in [(0, 0), (n - 1, n - 1), (0, 1), (2, 4)]:
        assert stats.kstest(o[:, i, j], cdf).pvalue > P_MIN, (i, j)
    # Diagonal entries have mean 0 (SE sqrt(1 / (n * count)) per entry, n*count pooled).
    diag = np.diagonal(o, axis1=-2, axis2=-1)
    assert abs(diag.mean()) < Z * np.sqrt(1.0 / (n * diag.size))
    # det = +1 and -1 each with probability 1/2: binomial SE sqrt(0.25 / count).
    frac_neg = np.mean(np.linalg.det(o) < 0)
    assert abs(frac_neg - 0.5) < Z * np.sqrt(0.25 / count)


def test_haar_checks_catch_uncorrected_qr():
    # The same checks reject a plain Householder QR, whose Q is not Haar (LAPACK makes
    # Q[0, 0] = -|g_11| / |g_1| < 0 always, and det(Q) is deterministic).
    n, count = 6, 2000
    q = _uncorrected_qr_batch(n, count, seed=7)
    assert stats.kstest(q[:, 0, 0], _entry_law(n)).pvalue < P_MIN
    diag = np.diagonal(q, axis1=-2, axis2=-1)
    assert abs(diag.mean()) > Z * np.sqrt(1.0 / (n * diag.size))
    assert abs(np.mean(np.linalg.det(q) < 0) - 0.5) > Z * np.sqrt(0.25 / count)


def test_orthogonal_eigenphases_are_uniform():
    # Eigenvalue phases of Haar O(n) are asymptotically uniform on [-pi, pi]. The finite-n
    # one-point density deviates by O(1/n) (noticeable at n ~ 8), so use n = 50. Phases from
    # one matrix are strongly repelling (rigid), so pooling them makes the KS test
    # conservative; 40 matrices give 2000 phases.
    n, count = 50, 40
    o = _batch("orthogonal", n, count, seed=8)
    eig = np.linalg.eigvals(o)
    np.testing.assert_allclose(np.abs(eig), 1.0, atol=1e-10)
    phases = np.angle(eig).ravel()
    assert stats.kstest(phases, stats.uniform(-np.pi, 2 * np.pi).cdf).pvalue > P_MIN


# ---------------------------------------------------------------------------------------------
# Spectral radius -> its large-n limit (001 App. A.1)
# ---------------------------------------------------------------------------------------------


def _spectral_radius(name, w):
    if name == "goe":
        return np.abs(np.linalg.eigvalsh(w)).max(axis=-1)
    if name == "antisymmetric":
        # W is normal with eigenvalues +-i s_k, so rho(W)^2 = lambda_max(W^T W) = lambda_max(-W^2).
        return np.sqrt(np.linalg.eigvalsh(-w @ w).max(axis=-1))
    return np.abs(np.linalg.eigvals(w)).max(axis=-1)


def test_orthogonal_spectral_radius_is_exact():
    w = np.asarray(ensembles.sample("orthogonal", jax.random.key(9), 200, 0.8, jnp.float64))
    np.testing.assert_allclose(np.abs(np.linalg.eigvals(w)), 0.8, atol=1e-10)
    assert ensembles.spectral_radius_limit("orthogonal", 0.8) == pytest.approx(0.8)


@pytest.mark.parametrize(
    "name, exponent, counts",
    [
        ("gaussian", 1 / 2, (64, 16, 2)),
        ("goe", 2 / 3, (64, 16, 4)),
        ("antisymmetric", 2 / 3, (64, 16, 4)),
    ],
)
def test_spectral_radius_tends_to_limit(name, exponent, counts):
    # Finite-n corrections to the relative error |rho / limit - 1|:
    # * Ginibre: rho = 1 + sqrt(g_n / 4n) + Gumbel / sqrt(4 n g_n), g_n = log(n / 2 pi) -
    #   2 log log n (Rider 2003), i.e. O(n^{-1/2}) up to sqrt(log n) for n <= 1600.
    #   Simulated sqrt(n) * error: mean ~0.7, sd ~0.3, max 2.1 over 400 draws.
    # * GOE / antisymmetric: edge fluctuations are Tracy-Widom on scale n^{-2/3}; simulated
    #   n^{2/3} * error has max ~2.3 over 400 draws.
    # C = 5 is > 10 sd away for each family. A wrong normalisation (e.g. sqrt(n) instead of
    # sqrt(2n)) gives an O(1) relative error and fails at every n.
    c = 5.0
    scale = 0.6
    limit = ensembles.spectral_radius_limit(name, scale)
    sizes = (100, 400, 1600)
    errors = []
    for n, count in zip(sizes, counts):
        w = _batch(name, n, count, scale, seed=10 + n)
        err = np.abs(_spectral_radius(name, w) / limit - 1.0)
        assert err.max() < c * n ** (-exponent), (n, err)
        errors.append(err.mean())
    # The mean error shrinks between n = 100 and n = 1600 (factor 16 in n). Simulated mean
    # errors and their SEs with these counts (Ginibre, the noisiest): 0.050 +- 0.005 vs
    # 0.018 +- 0.006, a gap of > 4 combined SEs.
    assert errors[-1] < errors[0], errors


# ---------------------------------------------------------------------------------------------
# jit / vmap / dtype
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ensembles.ENSEMBLES)
def test_vmap_matches_loop_and_jit(name):
    n, count = 12, 5
    keys = jax.random.split(jax.random.key(11), count)
    scales = jnp.linspace(0.2, 1.4, count)
    fn = lambda k, s: ensembles.sample(name, k, n, s, jnp.float64)  # noqa: E731
    batched = jax.vmap(fn)(keys, scales)  # traced scale too
    looped = jnp.stack([ensembles.sample(name, k, n, float(s), jnp.float64) for k, s in zip(keys, scales)])
    np.testing.assert_allclose(batched, looped, rtol=1e-12, atol=1e-12)
    jitted = jax.jit(fn)
    np.testing.assert_allclose(jitted(keys[0], scales[0]), looped[0], rtol=1e-12, atol=1e-12)
    # Same key -> same matrix; different keys -> different matrices.
    np.testing.assert_array_equal(fn(keys[0], 1.0), fn(keys[0], 1.0))
    assert not np.allclose(fn(keys[0], 1.0), fn(keys[1], 1.0))


def test_raw_uint32_keys_work():
    w = ensembles.sample("goe", jax.random.PRNGKey(0), 5)
    assert w.shape == (5, 5)


@pytest.mark.parametrize("name", ensembles.ENSEMBLES)
def test_dtype_respected(name):
    key = jax.random.key(12)
    # Default is float32 even when x64 is enabled.
    assert ensembles.sample(name, key, 7).dtype == jnp.float32
    assert ensembles.sample(name, key, 7, 0.5, jnp.float64).dtype == jnp.float64
    half = ensembles.sample(name, key, 7, 0.5, jnp.bfloat16)
    assert half.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(half, np.float32),
        np.asarray(ensembles.sample(name, key, 7, 0.5, jnp.float32)),
        atol=2e-2,
    )
    assert ensembles.initializer(name)(key, (6, 6), jnp.float64).dtype == jnp.float64


def test_scale_zero_gives_zero_matrix():
    for name in ensembles.ENSEMBLES:
        np.testing.assert_array_equal(ensembles.sample(name, jax.random.key(0), 4, 0.0), 0.0)


# ---------------------------------------------------------------------------------------------
# Initializer
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ensembles.ENSEMBLES)
def test_initializer_square_equals_sample(name):
    key = jax.random.key(13)
    init = ensembles.initializer(name, 0.8)
    np.testing.assert_array_equal(
        init(key, (9, 9), jnp.float64), ensembles.sample(name, key, 9, 0.8, jnp.float64)
    )
    # scale=None means the critical scale.
    default = ensembles.initializer(name)(key, (9, 9))
    expected = ensembles.sample(name, key, 9, ensembles.critical_scale(name))
    np.testing.assert_array_equal(default, expected)


@pytest.mark.parametrize("shape", [(40, 15), (15, 40)])
def test_initializer_rectangular_orthogonal(shape):
    scale = 0.9
    k = np.asarray(ensembles.initializer("orthogonal", scale)(jax.random.key(14), shape, jnp.float64))
    assert k.shape == shape
    gram = k.T @ k if shape[0] >= shape[1] else k @ k.T  # orthonormal columns / rows
    np.testing.assert_allclose(gram, scale**2 * np.eye(min(shape)), atol=1e-12)


def test_initializer_rectangular_gaussian_variance():
    # fan_in = shape[0]: entries i.i.d. N(0, scale^2 / fan_in); 60000 entries.
    shape, scale = (200, 300), 1.3
    k = np.asarray(ensembles.initializer("gaussian", scale)(jax.random.key(15), shape, jnp.float64))
    assert k.shape == shape
    _check_mean_var(k, scale**2 / shape[0])


@pytest.mark.parametrize("name", ["orthogonal", "goe"])
def test_initializer_as_flax_nnx_kernel_init(name):
    layer = nnx.Linear(8, 8, kernel_init=ensembles.initializer(name, 0.9), rngs=nnx.Rngs(0))
    kernel = np.asarray(layer.kernel[...])
    assert kernel.shape == (8, 8) and kernel.dtype == np.float32
    if name == "orthogonal":
        np.testing.assert_allclose(kernel.T @ kernel, 0.81 * np.eye(8), atol=1e-5)
    else:
        np.testing.assert_array_equal(kernel, kernel.T)
    layer64 = nnx.Linear(
        8, 5, kernel_init=ensembles.initializer("orthogonal"), param_dtype=jnp.float64,
        rngs=nnx.Rngs(1),
    )
    k64 = np.asarray(layer64.kernel[...])
    assert k64.dtype == np.float64
    np.testing.assert_allclose(k64.T @ k64, np.eye(5), atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------

_KEY = jax.random.key(0)

BAD_INPUTS = [
    # (id, callable, regex on the message)
    ("unknown-name", lambda: ensembles.sample("ginibre", _KEY, 4), r"name must be one of .*gaussian"),
    ("name-not-str", lambda: ensembles.sample(3, _KEY, 4), r"name must be one of"),
    ("n-zero", lambda: ensembles.sample("gaussian", _KEY, 0), r"n must be a positive integer"),
    ("n-negative", lambda: ensembles.sample("goe", _KEY, -3), r"n must be a positive integer"),
    ("n-float", lambda: ensembles.sample("gaussian", _KEY, 2.5), r"n must be a positive integer"),
    ("n-bool", lambda: ensembles.sample("gaussian", _KEY, True), r"n must be a positive integer"),
    ("scale-negative", lambda: ensembles.sample("gaussian", _KEY, 4, -1.0), r"scale must be .*>= 0"),
    ("scale-nan", lambda: ensembles.sample("orthogonal", _KEY, 4, float("nan")), r"scale must be .*finite"),
    ("scale-inf", lambda: ensembles.sample("goe", _KEY, 4, np.inf), r"scale must be .*finite"),
    ("scale-negative-array", lambda: ensembles.sample("goe", _KEY, 4, jnp.array(-0.5)), r"scale must be"),
    ("scale-vector", lambda: ensembles.sample("gaussian", _KEY, 4, np.ones(2)), r"scale must be a scalar"),
    ("scale-string", lambda: ensembles.sample("gaussian", _KEY, 4, "big"), r"scale must be"),
    ("dtype-int", lambda: ensembles.sample("gaussian", _KEY, 4, 1.0, jnp.int32), r"dtype must be"),
    ("dtype-complex", lambda: ensembles.sample("gaussian", _KEY, 4, 1.0, jnp.complex64), r"dtype must be"),
    ("dtype-garbage", lambda: ensembles.sample("gaussian", _KEY, 4, 1.0, "not-a-dtype"), r"dtype must be"),
    ("critical-unknown", lambda: ensembles.critical_scale("wigner"), r"name must be one of"),
    ("critical-var-unknown", lambda: ensembles.critical_variance("x"), r"name must be one of"),
    ("limit-negative-scale", lambda: ensembles.spectral_radius_limit("goe", -1.0), r"scale must be"),
    ("init-unknown", lambda: ensembles.initializer("haar"), r"name must be one of"),
    ("init-negative-scale", lambda: ensembles.initializer("gaussian", -0.5), r"scale must be"),
    ("init-1d", lambda: ensembles.initializer("gaussian")(_KEY, (3,)), r"shape must be 2-D"),
    ("init-3d", lambda: ensembles.initializer("orthogonal")(_KEY, (2, 3, 4)), r"shape must be 2-D"),
    ("init-zero-dim", lambda: ensembles.initializer("gaussian")(_KEY, (0, 4)), r"shape must have positive"),
    ("init-float-dim", lambda: ensembles.initializer("gaussian")(_KEY, (2.0, 4)), r"shape must be"),
    ("init-goe-rect", lambda: ensembles.initializer("goe")(_KEY, (3, 4)), r"shape must be square"),
    ("init-antisym-rect", lambda: ensembles.initializer("antisymmetric")(_KEY, (4, 3)), r"shape must be square"),
    ("init-dtype-int", lambda: ensembles.initializer("gaussian")(_KEY, (3, 3), jnp.int8), r"dtype must be"),
]


@pytest.mark.parametrize("fn, pattern", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_bad_inputs_raise_value_error(fn, pattern):
    with pytest.raises(ValueError, match=pattern):
        fn()


def test_traced_scale_is_not_validated_but_works_under_jit():
    # A traced scale cannot be inspected without breaking jit; it is passed through.
    out = jax.jit(lambda s: ensembles.sample("gaussian", _KEY, 3, s))(-1.0)
    np.testing.assert_allclose(out, -ensembles.sample("gaussian", _KEY, 3, 1.0), rtol=1e-6)
    with pytest.raises(ValueError, match="scale must be a scalar"):
        jax.jit(lambda s: ensembles.sample("gaussian", _KEY, 3, s))(jnp.ones(2))
