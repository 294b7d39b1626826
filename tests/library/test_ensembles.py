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

Speed. Compiling a threefry ``normal`` costs ~0.5 s of CPU per (batch, shape, dtype), so the
tests draw batches with eager ``jax.vmap`` (whose compiled kernels are cached by shape and
shared between ensembles) and reuse a few sizes: ``N_SMALL`` for API tests, (128, 16) for
moments, (50, 40) for orthogonality/Haar phases, and shared sizes in the spectral test.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from deqlab import ensembles

try:  # Optional: multithreaded BLAS thrashes on a loaded 2-core box (eigvals up to 10x slower).
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover
    import contextlib

    def threadpool_limits(limits=None):
        return contextlib.nullcontext()


Z = 6.0  # number of standard errors allowed in moment checks
P_MIN = 1e-3  # KS rejection threshold
N_SMALL = 8  # matrix size of the (non-statistical) API tests


def _batch(name, n, count, scale=1.0, dtype=jnp.float32, seed=0):
    """``count`` independent samples: eager ``vmap(sample)`` over split keys, as numpy."""
    keys = jax.random.split(jax.random.key(seed), count)
    return np.asarray(jax.vmap(lambda k: ensembles.sample(name, k, n, scale, dtype))(keys))


def _check_mean_var(x, var):
    """Mean 0 and variance ``var`` of i.i.d. N(0, var) samples ``x``, to Z standard errors."""
    x = np.ravel(x)
    count = x.size
    assert abs(x.mean()) < Z * np.sqrt(var / count), (x.mean(), var, count)
    assert abs(np.mean(x**2) - var) < Z * np.sqrt(2.0 / count) * var, (np.mean(x**2), var)


def _transpose(w):
    return np.swapaxes(w, -1, -2)


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
# Entry moments: batches of 16 matrices of size 128
# ---------------------------------------------------------------------------------------------

N_MOM, COUNT_MOM = 128, 16


@pytest.mark.parametrize("scale", [1.0, 0.7])
def test_gaussian_entry_moments(scale):
    # 16 * 128^2 = 262144 i.i.d. entries: relative SE of the variance 0.28%.
    w = _batch("gaussian", N_MOM, COUNT_MOM, scale, seed=1)
    _check_mean_var(w, scale**2 / N_MOM)


def test_goe_entry_moments_and_symmetry():
    n = N_MOM
    w = _batch("goe", n, COUNT_MOM, seed=2)
    np.testing.assert_array_equal(w, _transpose(w))  # bitwise symmetric
    # Diagonal: 16 * 128 = 2048 entries, relative SE sqrt(2/2048) = 3.1%; 6 SE = 19%, so the
    # diagonal variance 2/n is clearly separated from the off-diagonal 1/n.
    _check_mean_var(np.diagonal(w, axis1=-2, axis2=-1), 2.0 / n)
    iu = np.triu_indices(n, 1)  # upper triangle only: the lower one is a copy (~130k entries)
    _check_mean_var(w[:, iu[0], iu[1]], 1.0 / n)


def test_antisymmetric_entry_moments_and_antisymmetry():
    n = N_MOM
    w = _batch("antisymmetric", n, COUNT_MOM, seed=3)
    np.testing.assert_array_equal(w, -_transpose(w))  # bitwise antisymmetric
    np.testing.assert_array_equal(np.diagonal(w, axis1=-2, axis2=-1), 0.0)
    iu = np.triu_indices(n, 1)
    _check_mean_var(w[:, iu[0], iu[1]], 1.0 / n)


def test_moment_check_has_power():
    # The moment check is not vacuous: a GOE normalised by sqrt(n) instead of sqrt(2n)
    # (off-diagonal variance 2/n instead of 1/n) is rejected.
    n = N_MOM
    g = np.random.default_rng(4).standard_normal((n, n))
    wrong = (g + g.T) / np.sqrt(n)
    iu = np.triu_indices(n, 1)
    with pytest.raises(AssertionError):
        _check_mean_var(wrong[iu], 1.0 / n)


# ---------------------------------------------------------------------------------------------
# Orthogonal ensemble: orthogonality and Haar measure
# ---------------------------------------------------------------------------------------------

N_ORTH, COUNT_ORTH = 50, 40


@pytest.mark.float64
@pytest.mark.parametrize("scale", [1.0, 0.8])
def test_orthogonal_is_orthogonal_with_exact_spectral_radius(scale):
    # float64: orthogonality and rho(W) = scale checked to 1e-12, exactness below float32 resolution.
    w = _batch("orthogonal", N_ORTH, COUNT_ORTH, scale, jnp.float64, seed=5)
    eye = np.eye(N_ORTH)
    np.testing.assert_allclose(_transpose(w) @ w - scale**2 * eye, 0.0, atol=1e-12)
    np.testing.assert_allclose(w @ _transpose(w) - scale**2 * eye, 0.0, atol=1e-12)
    # Each column is a unit vector, so the mean of squares is exactly scale^2 / n.
    assert np.mean(w**2) == pytest.approx(scale**2 / N_ORTH, rel=1e-12)
    # rho(W) = scale exactly, at every n (001 App. A.1).
    with threadpool_limits(limits=1):
        eig = np.linalg.eigvals(w)
    np.testing.assert_allclose(np.abs(eig), scale, atol=1e-10)


def _entry_law(n):
    # A column of a Haar O(n) matrix is uniform on the sphere S^{n-1}, so any entry u
    # satisfies (u + 1) / 2 ~ Beta((n-1)/2, (n-1)/2) exactly (sqrt(n) u -> N(0, 1) as n -> inf).
    a = (n - 1) / 2
    return lambda u: stats.beta(a, a).cdf((np.asarray(u) + 1) / 2)


N_HAAR, COUNT_HAAR = 6, 2000


def test_orthogonal_entries_follow_haar_law():
    n, count = N_HAAR, COUNT_HAAR
    o = _batch("orthogonal", n, count, seed=6)
    cdf = _entry_law(n)
    for i, j in [(0, 0), (n - 1, n - 1), (0, 1), (2, 4)]:
        assert stats.kstest(o[:, i, j], cdf).pvalue > P_MIN, (i, j)
    # Diagonal entries have mean 0 and variance 1/n: SE of the pooled mean sqrt(1/(n N)).
    diag = np.diagonal(o, axis1=-2, axis2=-1)
    assert abs(diag.mean()) < Z * np.sqrt(1.0 / (n * diag.size))
    # det = +1 and -1 each with probability 1/2: binomial SE sqrt(0.25 / count).
    frac_neg = np.mean(np.linalg.det(o) < 0)
    assert abs(frac_neg - 0.5) < Z * np.sqrt(0.25 / count)


def test_haar_checks_catch_uncorrected_qr():
    # The same checks reject a plain Householder QR, whose Q is not Haar: LAPACK makes
    # Q[0, 0] = -|g_11| / |g_1| < 0 always, and det(Q) is deterministic.
    n, count = N_HAAR, COUNT_HAAR
    g = np.random.default_rng(7).standard_normal((count, n, n))
    q = np.linalg.qr(g)[0]  # no sign(diag R) correction
    assert stats.kstest(q[:, 0, 0], _entry_law(n)).pvalue < P_MIN
    diag = np.diagonal(q, axis1=-2, axis2=-1)
    assert abs(diag.mean()) > Z * np.sqrt(1.0 / (n * diag.size))
    assert abs(np.mean(np.linalg.det(q) < 0) - 0.5) > Z * np.sqrt(0.25 / count)
    # ... while the sign-corrected QR of the same matrices passes them.
    q_ok, r = np.linalg.qr(g)
    q_ok = q_ok * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[:, None, :]
    assert stats.kstest(q_ok[:, 0, 0], _entry_law(n)).pvalue > P_MIN


def test_orthogonal_eigenphases_are_uniform():
    # Eigenvalue phases of Haar O(n) are asymptotically uniform on [-pi, pi]. The finite-n
    # one-point density deviates by O(1/n) (the KS test notices it at n ~ 8), so use n = 50.
    # Phases of one matrix repel (they are rigid), which makes a KS test on phases pooled over
    # 40 matrices (2000 phases) conservative.
    o = _batch("orthogonal", N_ORTH, COUNT_ORTH, seed=8)
    with threadpool_limits(limits=1):
        eig = np.linalg.eigvals(o)
    phases = np.angle(eig).ravel()
    assert stats.kstest(phases, stats.uniform(-np.pi, 2 * np.pi).cdf).pvalue > P_MIN


# ---------------------------------------------------------------------------------------------
# Spectral radius -> its large-n limit (001 App. A.1)
# ---------------------------------------------------------------------------------------------


def _spectral_radius(name, w):
    with threadpool_limits(limits=1):
        if name == "goe":
            return np.abs(np.linalg.eigvalsh(w)).max(axis=-1)
        if name == "antisymmetric":
            # W is normal with eigenvalues +-i s_k: rho(W)^2 = lambda_max(W^T W) = lambda_max(-W^2).
            return np.sqrt(np.linalg.eigvalsh(-w @ w).max(axis=-1))
        return np.abs(np.linalg.eigvals(w)).max(axis=-1)


@pytest.mark.parametrize(
    "name, exponent, sizes, counts",
    [
        # Non-symmetric eigvals cost ~5-10x eigvalsh, so Ginibre stops at n = 400.
        # (Sizes/counts are shared where possible so that compiled samplers are reused.)
        pytest.param("gaussian", 1 / 2, (25, 100, 400), (256, 64, 4), marks=pytest.mark.slow),
        ("goe", 2 / 3, (100, 400, 1600), (64, 4, 1)),
        ("antisymmetric", 2 / 3, (100, 400, 1600), (64, 4, 1)),
    ],
)
def test_spectral_radius_tends_to_limit(name, exponent, sizes, counts):
    # Finite-n corrections to the relative error |rho / limit - 1|:
    # * Ginibre: rho = 1 + sqrt(g_n / 4n) + Gumbel / sqrt(4 n g_n), g_n = log(n / 2 pi) -
    #   2 log log n (Rider 2003), i.e. O(n^{-1/2}) up to sqrt(log n). Simulated sqrt(n) *
    #   error for n in {25, 100, 400}: mean 0.4-0.7, sd 0.33-0.37, 99.9% quantile 2.3, max 2.6
    #   over 4000 draws.
    # * GOE / antisymmetric: edge fluctuations are Tracy-Widom on the scale n^{-2/3};
    #   simulated n^{2/3} * error has max ~2.3 over 400 draws at each n in {100, 400, 1600}.
    # C = 5 is > 10 sd away for each family. A wrong normalisation (e.g. sqrt(n) instead of
    # sqrt(2n)) gives an O(1) relative error and fails at every n.
    c = 5.0
    scale = 0.6
    limit = ensembles.spectral_radius_limit(name, scale)
    errors = []
    for n, count in zip(sizes, counts):
        w = _batch(name, n, count, scale, seed=10 + n)
        err = np.abs(_spectral_radius(name, w) / limit - 1.0)
        assert err.max() < c * n ** (-exponent), (n, err)
        errors.append(err.mean())
    # The mean error shrinks from the smallest to the largest n (factor 16). Simulated mean
    # errors and their SEs with these counts: Ginibre n = 25: 0.084 +- 0.005 vs n = 400:
    # 0.036 +- 0.008 (5 combined SEs); GOE n = 100: 0.025 +- 0.003 vs n = 1600: 0.004 +- 0.004;
    # antisymmetric 0.045 +- 0.003 vs 0.007 +- 0.003.
    assert errors[-1] < errors[0], errors


# ---------------------------------------------------------------------------------------------
# jit / vmap / dtype
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ensembles.ENSEMBLES)
def test_vmap_matches_loop(name):
    count = 4
    keys = jax.random.split(jax.random.key(11), count)
    scales = jnp.linspace(0.2, 1.4, count)
    fn = lambda k, s: ensembles.sample(name, k, N_SMALL, s, jnp.float64)  # noqa: E731
    batched = jax.vmap(fn)(keys, scales)  # vmap over keys and a traced scale
    looped = jnp.stack([fn(k, float(s)) for k, s in zip(keys, scales)])
    np.testing.assert_allclose(batched, looped, rtol=1e-12, atol=1e-12)
    # Same key -> same matrix; different keys -> different matrices.
    np.testing.assert_array_equal(fn(keys[0], 1.0), fn(keys[0], 1.0))
    assert not np.allclose(fn(keys[0], 1.0), fn(keys[1], 1.0))


def test_jit_matches_eager_and_keeps_symmetry():
    # One compiled function for all four ensembles, with a traced scale.
    def draw_all(k, s):
        return [ensembles.sample(nm, k, N_SMALL, s) for nm in ensembles.ENSEMBLES]

    draw_all = jax.jit(draw_all)
    key = jax.random.key(12)
    for name, w in zip(ensembles.ENSEMBLES, draw_all(key, 0.7)):
        eager = ensembles.sample(name, key, N_SMALL, 0.7)
        # float32: the compiled draw may fuse and round differently from the eager one (a few ulps
        # of eps = 1.2e-7, more through the orthogonal QR); a different draw differs by O(1).
        np.testing.assert_allclose(w, eager, rtol=1e-5, atol=1e-6)
    _, _, w_goe, w_anti = (np.asarray(w) for w in draw_all(key, 0.7))
    np.testing.assert_array_equal(w_goe, w_goe.T)
    np.testing.assert_array_equal(w_anti, -w_anti.T)


def test_raw_uint32_keys_work():
    w = ensembles.sample("goe", jax.random.PRNGKey(0), N_SMALL)
    assert w.shape == (N_SMALL, N_SMALL)


@pytest.mark.float64
@pytest.mark.parametrize("name", ensembles.ENSEMBLES)
def test_dtype_respected(name):
    key = jax.random.key(13)
    n = N_SMALL
    # Default is float32 even when x64 is enabled.
    w32 = ensembles.sample(name, key, n, 0.5)
    assert w32.dtype == jnp.float32
    assert ensembles.sample(name, key, n, 0.5, jnp.float64).dtype == jnp.float64
    half = ensembles.sample(name, key, n, 0.5, jnp.bfloat16)
    assert half.dtype == jnp.bfloat16
    # bfloat16 has an 8-bit mantissa: relative rounding error <= 2^-8.
    np.testing.assert_allclose(np.asarray(half, np.float32), w32, rtol=2**-8, atol=1e-6)
    assert ensembles.initializer(name)(key, (n, n), jnp.float64).dtype == jnp.float64


def test_scale_zero_gives_zero_matrix():
    for name in ensembles.ENSEMBLES:
        w = ensembles.sample(name, jax.random.key(0), N_SMALL, 0.0)
        np.testing.assert_array_equal(w, 0.0)


# ---------------------------------------------------------------------------------------------
# Initializer
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ensembles.ENSEMBLES)
def test_initializer_square_equals_sample(name):
    key = jax.random.key(14)
    n = N_SMALL
    init = ensembles.initializer(name, 0.8)
    np.testing.assert_array_equal(
        init(key, (n, n), jnp.float64), ensembles.sample(name, key, n, 0.8, jnp.float64)
    )
    # scale=None means the critical scale; the default dtype is float32.
    default = ensembles.initializer(name)(key, (n, n))
    assert default.dtype == jnp.float32
    expected = ensembles.sample(name, key, n, ensembles.critical_scale(name))
    np.testing.assert_array_equal(default, expected)


@pytest.mark.float64
@pytest.mark.parametrize("shape", [(40, 15), (15, 40)])
def test_initializer_rectangular_orthogonal(shape):
    scale = 0.9
    init = ensembles.initializer("orthogonal", scale)
    k = np.asarray(init(jax.random.key(15), shape, jnp.float64))
    assert k.shape == shape
    gram = k.T @ k if shape[0] >= shape[1] else k @ k.T  # orthonormal columns / rows
    np.testing.assert_allclose(gram, scale**2 * np.eye(min(shape)), atol=1e-12)


def test_initializer_rectangular_gaussian_variance():
    # fan_in = shape[0]: entries i.i.d. N(0, scale^2 / fan_in); 60000 entries.
    shape, scale = (200, 300), 1.3
    init = ensembles.initializer("gaussian", scale)
    k = np.asarray(init(jax.random.key(16), shape, jnp.float64))
    assert k.shape == shape
    _check_mean_var(k, scale**2 / shape[0])


@pytest.mark.float64
def test_initializer_as_flax_nnx_kernel_init():
    n = N_SMALL
    init = ensembles.initializer("orthogonal", 0.9)
    ortho = nnx.Linear(n, n, kernel_init=init, rngs=nnx.Rngs(0))
    kernel = np.asarray(ortho.kernel[...])
    assert kernel.shape == (n, n) and kernel.dtype == np.float32
    np.testing.assert_allclose(kernel.T @ kernel, 0.81 * np.eye(n), atol=1e-5)

    goe = nnx.Linear(n, n, kernel_init=ensembles.initializer("goe"), rngs=nnx.Rngs(1))
    kernel = np.asarray(goe.kernel[...])
    np.testing.assert_array_equal(kernel, kernel.T)

    rect = nnx.Linear(
        n, 5, kernel_init=ensembles.initializer("orthogonal"), param_dtype=jnp.float64,
        rngs=nnx.Rngs(2),
    )
    k64 = np.asarray(rect.kernel[...])
    assert k64.shape == (n, 5) and k64.dtype == np.float64
    np.testing.assert_allclose(k64.T @ k64, np.eye(5), atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------

_KEY = jax.random.key(0)
_S = ensembles.sample
_I = ensembles.initializer

BAD_INPUTS = [
    # (id, callable, regex on the message: the argument in backticks, then its valid range)
    ("unknown-name", lambda: _S("ginibre", _KEY, 4), r"sample: `name` must be one of .*'gaussian'.*got 'ginibre'"),
    ("name-not-str", lambda: _S(3, _KEY, 4), r"`name` must be one of"),
    ("n-zero", lambda: _S("gaussian", _KEY, 0), r"`n` must be an integer >= 1, got 0"),
    ("n-negative", lambda: _S("goe", _KEY, -3), r"`n` must be an integer >= 1"),
    ("n-float", lambda: _S("gaussian", _KEY, 2.5), r"`n` must be an integer >= 1 \(a static"),
    ("n-bool", lambda: _S("gaussian", _KEY, True), r"`n` must be an integer >= 1"),
    ("n-absurd", lambda: _S("gaussian", _KEY, 10**9), r"`n` must be .*n \* n <= 2\*\*31"),
    ("n-just-too-big", lambda: _S("goe", _KEY, 46341), r"`n` must be .*n <= 46340"),
    ("key-float", lambda: _S("gaussian", 0.5, 4), r"`key` must be a JAX PRNG key"),
    ("key-wrong-shape", lambda: _S("gaussian", jnp.zeros(3, jnp.uint32), 4), r"`key` must be a JAX PRNG key"),
    ("scale-negative", lambda: _S("gaussian", _KEY, 4, -1.0), r"`scale` must be .*>= 0, got -1.0"),
    ("scale-nan", lambda: _S("orthogonal", _KEY, 4, float("nan")), r"`scale` must be a finite"),
    ("scale-inf", lambda: _S("goe", _KEY, 4, np.inf), r"`scale` must be a finite"),
    ("scale-negative-array", lambda: _S("goe", _KEY, 4, jnp.array(-0.5)), r"`scale` must be"),
    ("scale-vector", lambda: _S("gaussian", _KEY, 4, np.ones(2)), r"`scale` must be a real scalar.*shape \(2,\)"),
    ("scale-string", lambda: _S("gaussian", _KEY, 4, "big"), r"`scale` must be"),
    ("dtype-int", lambda: _S("gaussian", _KEY, 4, 1.0, jnp.int32), r"`dtype` must be a real floating"),
    ("dtype-complex", lambda: _S("gaussian", _KEY, 4, 1.0, jnp.complex64), r"`dtype` must be a real floating"),
    ("dtype-garbage", lambda: _S("gaussian", _KEY, 4, 1.0, "not-a-dtype"), r"`dtype` must be"),
    ("critical-unknown", lambda: ensembles.critical_scale("wigner"), r"critical_scale: `name` must be one of"),
    ("critical-var-unknown", lambda: ensembles.critical_variance("x"), r"critical_variance: `name` must be one of"),
    ("limit-negative", lambda: ensembles.spectral_radius_limit("goe", -1.0), r"`scale` must be"),
    ("init-unknown", lambda: _I("haar"), r"initializer: `name` must be one of"),
    ("init-negative-scale", lambda: _I("gaussian", -0.5), r"`scale` must be"),
    ("init-1d", lambda: _I("gaussian")(_KEY, (3,)), r"`shape` must be a 2-D tuple"),
    ("init-3d", lambda: _I("orthogonal")(_KEY, (2, 3, 4)), r"`shape` must be a 2-D tuple"),
    ("init-zero-dim", lambda: _I("gaussian")(_KEY, (0, 4)), r"`shape` must be .*integers >= 1, got \(0, 4\)"),
    ("init-float-dim", lambda: _I("gaussian")(_KEY, (2.0, 4)), r"`shape` must be"),
    ("init-absurd", lambda: _I("gaussian")(_KEY, (10**5, 10**5)), r"`shape` must be .*2\*\*31"),
    ("init-goe-rect", lambda: _I("goe")(_KEY, (3, 4)), r"`shape` must be square"),
    ("init-antisym-rect", lambda: _I("antisymmetric")(_KEY, (4, 3)), r"`shape` must be square"),
    ("init-dtype-int", lambda: _I("gaussian")(_KEY, (3, 3), jnp.int8), r"`dtype` must be"),
]


@pytest.mark.parametrize(
    "fn, pattern", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_inputs_raise_value_error(fn, pattern):
    with pytest.raises(ValueError, match=pattern):
        fn()


def test_traced_scale_is_not_validated_but_works_under_jit():
    # A traced scale cannot be inspected without breaking jit; it is passed through.
    draw = jax.jit(lambda s: ensembles.sample("gaussian", _KEY, N_SMALL, s))
    expected = -ensembles.sample("gaussian", _KEY, N_SMALL, 1.0)
    np.testing.assert_allclose(draw(-1.0), expected, rtol=1e-6)
    with pytest.raises(ValueError, match="`scale` must be a real scalar.*traced array of shape"):
        draw(jnp.ones(2))


def test_size_limit_admits_the_largest_matrix_without_drawing_it():
    # The limit refuses n * n > 2**31 before XLA is reached; the largest admitted n traces fine
    # (eval_shape allocates nothing), so the check is not stricter than stated.
    n_max = math.isqrt(ensembles.MAX_ELEMENTS)
    out = jax.eval_shape(lambda k: ensembles.sample("gaussian", k, n_max), _KEY)
    assert out.shape == (n_max, n_max)
    with pytest.raises(ValueError, match=f"n <= {n_max}"):
        ensembles.sample("gaussian", _KEY, n_max + 1)


def test_typed_and_raw_keys_both_accepted_also_under_vmap():
    raw, typed = jax.random.PRNGKey(3), jax.random.key(3)
    assert ensembles.sample("goe", raw, 4).shape == (4, 4)
    assert ensembles.sample("goe", typed, 4).shape == (4, 4)
    batch = jax.vmap(lambda k: ensembles.sample("orthogonal", k, 3))(jax.random.split(typed, 5))
    assert batch.shape == (5, 3, 3)
