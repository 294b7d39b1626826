"""Experiment 2 of 004 (§4, Fig. 6): the denoising DEQ, its two initialisations, noise, training."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from deqlab.lab.experiments.kglm import denoising as dn
from deqlab.theory.kglm import kernels

SMALL = dict(train_size=32, test_size=16, image_size=8, batch_size=16, max_steps=10)


@pytest.mark.parametrize("C", [0.05, 1.0, 7.5])
def test_kglm_layer_spectral_norm_is_C(C):
    """004 §4: lam = ||K|| / C makes each kGLM layer's spectral norm exactly C."""
    h, w = 8, 9
    weights = dn.init_weights("kglm", C, jax.random.key(3), (h, w))
    for name in dn.LAYERS:
        fft_norm = float(kernels.conv_spectral_norm(weights[name].astype(np.float64), (h, w)))
        dense = np.asarray(kernels.conv_matrix(weights[name].astype(np.float64), (3, h, w), padding="circular"))
        svd_norm = np.linalg.svd(dense, compute_uv=False)[0]
        # float32 weights: relative rounding ~ 6e-8 per entry, far below 1e-5
        assert fft_norm == pytest.approx(C, rel=1e-5)
        assert svd_norm == pytest.approx(C, rel=1e-5)
    norms = dn.layer_norms(weights, (h, w))
    assert norms["mean"] == pytest.approx(C, rel=1e-5)


def test_kglm_layers_are_the_scaled_periodic_kernel_matrix():
    """Cor. 11: W2 = K / lam, W1 = -K / lam, with K the (periodic) Gram matrix of App. F's kernel."""
    h = w = 8
    key = jax.random.key(5)
    weights = dn.init_weights("kglm", 0.7, key, (h, w))
    ell = dn.sample_length_scales(key)
    assert np.allclose(ell, ell.T) and np.all((ell > 0) & (ell <= 2.0))  # squared length scales in (0, 4]
    K = np.asarray(kernels.image_kernel(dn.RADIUS, length_scale=ell, channels=3).matrix(h, w, padding="circular"))
    expected = 0.7 * K / np.linalg.norm(K, 2)
    W2 = np.asarray(kernels.conv_matrix(weights["W2"].astype(np.float64), (3, h, w), padding="circular"))
    W1 = np.asarray(kernels.conv_matrix(weights["W1"].astype(np.float64), (3, h, w), padding="circular"))
    np.testing.assert_allclose(W2, expected, atol=1e-7)
    np.testing.assert_allclose(W1, -expected, atol=1e-7)
    np.testing.assert_array_equal(weights["V1"], weights["W1"])
    np.testing.assert_array_equal(weights["V2"], weights["W2"])


@pytest.mark.float64
def test_random_init_variance_and_common_draw():
    a = dn.init_weights("random", 0.01, jax.random.key(1))
    b = dn.init_weights("random", 0.04, jax.random.key(1))
    for name in dn.LAYERS:
        np.testing.assert_allclose(b[name], 2.0 * a[name], rtol=1e-6)  # one draw, times sqrt(Var)
    entries = np.concatenate([a[n].ravel() for n in dn.LAYERS])  # 4 * 3 * 3 * 49 = 1764 entries
    # sample variance of n = 1764 normals: relative standard error sqrt(2 / n) = 3.4 %; 5 SE
    assert np.var(entries) == pytest.approx(0.01, rel=5 * math.sqrt(2 / entries.size))
    assert abs(np.mean(entries)) < 5 * 0.1 / math.sqrt(entries.size)


@pytest.mark.float64
def test_circular_conv_matches_kernels_conv2d():
    key1, key2 = jax.random.split(jax.random.key(0))
    weights = jax.random.normal(key1, (3, 3, 7, 7))
    images = jax.random.uniform(key2, (2, 3, 8, 10))
    out = dn.circular_conv(weights, images)
    for i in range(2):
        np.testing.assert_allclose(out[i], kernels.conv2d(weights, images[i], padding="circular"), atol=1e-10)
    with pytest.raises(ValueError, match=r"circular_conv: `images` must be an array of shape \(\.\.\., c_in=3"):
        dn.circular_conv(weights, images[:, :2])


def test_noise_model_statistics():
    """clip(x + e, 0, 1), e ~ N(0, 0.2) with 0.2 the standard deviation (the authors' code): the
    default corrupt() has the clipping fractions and moments of that clipped normal."""
    sigma = 0.2
    n = 10**6
    x = jnp.full((n,), 0.3)
    y = np.asarray(dn.corrupt(jax.random.key(7), x), np.float64)
    assert y.min() == 0.0 and y.max() == 1.0  # P(clip at 1) = 2.3e-4: about 230 of 1e6
    p0, p1 = stats.norm.cdf(-0.3 / sigma), stats.norm.sf(0.7 / sigma)
    clipped = integrate.quad(lambda t: t * stats.norm.pdf(t, 0.3, sigma), 0, 1)[0]
    mean = clipped + p1
    second = integrate.quad(lambda t: t * t * stats.norm.pdf(t, 0.3, sigma), 0, 1)[0] + p1
    var = second - mean**2
    for observed, p in ((np.mean(y == 0.0), p0), (np.mean(y == 1.0), p1)):
        assert abs(observed - p) < 5 * math.sqrt(p * (1 - p) / n)
    assert abs(y.mean() - mean) < 5 * math.sqrt(var / n)
    # variance of the sample variance ~ (m4 - var^2) / n; m4 <= 1 for values in [0, 1]
    assert abs(y.var() - var) < 5 * math.sqrt(1.0 / n)
    # the other reading (variance 0.2) would clip a fraction Phi(-0.3 / sqrt(0.2)) = 0.25 at 0
    assert abs(np.mean(y == 0.0) - stats.norm.cdf(-0.3 / math.sqrt(0.2))) > 0.1
    # independent across pixels: neighbouring noise values are uncorrelated (SE 1/sqrt(n))
    assert abs(np.corrcoef(y[:-1], y[1:])[0, 1]) < 5 / math.sqrt(n)


def test_conv_eigenvalues_match_the_dense_layer():
    h = w = 8
    weights = dn.init_weights("kglm", 0.7, jax.random.key(3), (h, w))
    W2 = np.asarray(kernels.conv_matrix(weights["W2"].astype(np.float64), (3, h, w), padding="circular"))
    np.testing.assert_allclose(dn.conv_eigenvalues(weights["W2"], (h, w)), np.linalg.eigvalsh(W2), atol=1e-6)
    with pytest.raises(ValueError, match="symmetric"):
        dn.conv_eigenvalues(np.arange(3 * 3 * 7 * 7, dtype=float).reshape(3, 3, 7, 7), (h, w))


def _multichannel_gram(ell, h, w):
    """App. F's squared exponential with one length scale per channel pair, untruncated and
    non-periodic, on an h x w grid: (c h w, c h w)."""
    i, j = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    pixels = np.stack([i.ravel(), j.ravel()], 1).astype(float)
    d2 = ((pixels[:, None] - pixels[None]) ** 2).sum(-1)
    c = ell.shape[0]
    return np.block([[np.exp(-d2 / (2 * ell[a, b] ** 2)) for b in range(c)] for a in range(c)])


def test_multichannel_kglm_kernel_is_indefinite_erratum():
    """Erratum 20: with App. F's own length scale per channel pair the kernel is indefinite even
    before truncation, and the triangular taper does not repair it; the layers of
    init_weights("kglm", ...) are not kernel ridge regression. Over 20 keys on 8 x 8 images:
    lambda_min / ||K|| from -68% to -5% (median -27%) for the box, every draw indefinite."""
    h = w = 8
    box, tri, full = [], [], []
    for s in range(20):
        key = jax.random.key(s)
        ev = dn.conv_eigenvalues(dn.init_weights("kglm", 1.0, key, (h, w))["W2"], (h, w))
        box.append(ev[0] / np.abs(ev).max())
        ell = dn.sample_length_scales(key)
        taper = kernels.image_kernel(dn.RADIUS, length_scale=ell, channels=3, truncation="triangular").filter()
        ev = dn.conv_eigenvalues(taper, (h, w))
        tri.append(ev[0] / np.abs(ev).max())
        ev = np.linalg.eigvalsh(_multichannel_gram(ell, h, w))
        full.append(ev[0] / np.abs(ev).max())
    box, tri, full = map(np.array, (box, tri, full))
    assert np.all(box < -0.04) and np.all(tri < -0.01) and np.all(full < -0.02)
    assert -0.70 < box.min() < -0.60 and -0.30 < np.median(box) < -0.22
    assert np.median(tri) < -0.15 and np.median(full) < -0.15
    # one channel (a single length scale): the taper is PSD, the box only slightly indefinite
    one = np.array([[2.0]])
    ev = dn.conv_eigenvalues(kernels.image_kernel(dn.RADIUS, length_scale=one, channels=1,
                                                  truncation="triangular").filter(), (h, w))
    assert ev[0] > -1e-10 * ev[-1]
    ev = dn.conv_eigenvalues(kernels.image_kernel(dn.RADIUS, length_scale=one, channels=1).filter(), (h, w))
    assert -0.05 < ev[0] / ev[-1] < 0


@pytest.mark.float64
def test_untrained_kglm_deq_is_kernel_ridge_smoothing():
    """004 Thm. 3 / Cor. 11 with X~ = X: where the fixed point is positive, ReLU acts as the
    identity and the kGLM-initialised DEQ outputs K (K + lam I)^-1 y (kernel ridge regression)."""
    h = w = 8
    weights = dn.init_weights("kglm", 0.8, jax.random.key(2), (h, w))
    y = 0.4 + 0.2 * jax.random.uniform(jax.random.key(9), (1, 3, h, w), jnp.float64)
    w64 = {k: jnp.asarray(v, jnp.float64) for k, v in weights.items()}
    out, sol = dn.denoise(w64, y, tol=1e-12, max_steps=200)
    assert bool(sol.converged.all()) and float(sol.value.min()) > 0.0
    A = np.asarray(kernels.conv_matrix(w64["W2"], (3, h, w), padding="circular"))  # K / lam
    expected = A @ np.linalg.solve(np.eye(A.shape[0]) + A, np.asarray(y).ravel())
    np.testing.assert_allclose(np.asarray(out).ravel(), expected, atol=1e-9)


def test_vmapped_seeds_equal_one_at_a_time():
    together = dn.train_seeds("kglm", 0.5, [0, 4], epochs=2, validation_size=16, **SMALL)
    for i, seed in enumerate([0, 4]):
        alone = dn.train_seeds("kglm", 0.5, [seed], epochs=2, validation_size=16, **SMALL)
        for curve in ("test_mse_curve", "validation_mse_curve"):
            np.testing.assert_allclose(together[curve][i], alone[curve][0], rtol=2e-5)
        assert together["norms"][i] == alone["norms"][0]
    curves = np.asarray(together["test_mse_curve"])
    assert curves.shape == (2, 3) and np.all(np.isfinite(curves))
    validation = np.asarray(together["validation_mse_curve"])
    assert validation.shape == (2, 3) and np.all(np.isfinite(validation))
    assert not np.allclose(validation, curves)  # other images, other noise
    # without validation images there is no validation curve, and the test curve is unchanged
    plain = dn.train_seeds("kglm", 0.5, [0, 4], epochs=2, **SMALL)
    assert "validation_mse_curve" not in plain
    np.testing.assert_allclose(plain["test_mse_curve"], together["test_mse_curve"], rtol=2e-5)
    assert not np.allclose(curves[0], curves[1])  # different seeds, different kernels
    assert np.all(curves[:, -1] < curves[:, 0])  # training lowers the test error from C = 0.5


def test_validation_images_are_held_out_training_images():
    x_train, x_val, x_test = dn.load_images(train_size=40, validation_size=24, test_size=16, image_size=8)
    every_train, none, _ = dn.load_images(image_size=8)
    assert x_train.shape == (40, 3, 8, 8) and x_val.shape == (24, 3, 8, 8) and x_test.shape == (16, 3, 8, 8)
    assert len(none) == 0
    np.testing.assert_array_equal(x_val, every_train[-24:])  # the end of the training split ...
    np.testing.assert_array_equal(x_train, every_train[:40])  # ... never among the training images
    # with train_size None the training images stop where the validation images begin
    rest, x_val2, _ = dn.load_images(validation_size=24, image_size=8)
    assert len(rest) == len(every_train) - 24 and np.array_equal(x_val2, x_val)


def test_validation_curve_is_the_mse_on_the_validation_images_with_their_own_noise():
    """Epoch 0 of ``validation_mse_curve`` recomputed by hand: the untrained model on the held-out
    images, corrupted with fold_in(key(test_seed), 2), a key no training or test draw uses."""
    result = dn.train_seeds("kglm", 0.5, [3], epochs=0, validation_size=16, test_seed=5, **SMALL)
    _, x_val, x_test = dn.load_images(train_size=32, validation_size=16, test_size=16, image_size=8)
    weights = dn.init_weights("kglm", 0.5, jax.random.fold_in(jax.random.key(3), 0), (8, 8))
    for x, key, curve in ((x_val, jax.random.fold_in(jax.random.key(5), 2), "validation_mse_curve"),
                          (x_test, jax.random.key(5), "test_mse_curve")):
        noisy = dn.corrupt(key, jnp.asarray(x), dn.NOISE_STD)
        out, _ = dn.denoise(weights, noisy, tol=1e-3, max_steps=10, anderson_m=5)
        np.testing.assert_allclose(result[curve][0][0], float(jnp.mean((out - x) ** 2)), rtol=1e-5)
    assert result["validation_mse_curve"][0][0] != result["test_mse_curve"][0][0]


def test_checkpoint_resume_with_validation_equals_uninterrupted(tmp_path, monkeypatch):
    kwargs = dict(epochs=3, validation_size=16, **SMALL)
    reference = dn.train_seeds("kglm", 0.5, [0, 1], **kwargs)
    program = dn._program

    def interrupted(*args):
        tx, run_epoch, run_eval = program(*args)
        calls = []

        def run(*a):
            if len(calls) == 2:
                raise KeyboardInterrupt  # killed during the third epoch
            calls.append(1)
            return run_epoch(*a)

        return tx, run, run_eval

    monkeypatch.setattr(dn, "_program", interrupted)
    with pytest.raises(KeyboardInterrupt):
        dn.train_seeds("kglm", 0.5, [0, 1], checkpoint_dir=tmp_path, **kwargs)
    monkeypatch.setattr(dn, "_program", program)
    with pytest.raises(ValueError, match=r"train_seeds: `checkpoint_dir` must be a directory of runs with "
                                         r"validation_size = 0, test_size = 16 and test_seed = 0"):
        dn.train_seeds("kglm", 0.5, [0, 1], checkpoint_dir=tmp_path, **{**kwargs, "validation_size": 0})
    resumed = dn.train_seeds("kglm", 0.5, [0, 1], checkpoint_dir=tmp_path, **kwargs)
    for curve in ("test_mse_curve", "validation_mse_curve", "train_loss_curve"):
        np.testing.assert_allclose(resumed[curve], reference[curve], rtol=1e-6)


def test_sweep_resumes_and_summaries(tmp_path, monkeypatch):
    kwargs = dict(variances=[1e-3], cs=[0.3, 1.0], seeds=[0, 1], epochs=1, progress=False, validation_size=16,
                  **SMALL)
    rows = dn.run_denoising_sweep(tmp_path, **kwargs)
    assert len(rows) == 6 and {r["scheme"] for r in rows} == {"random", "kglm"}

    def fail(*args, **kwargs):
        raise AssertionError("a finished unit was run again")

    monkeypatch.setattr(dn, "train_seeds", fail)
    again = dn.run_denoising_sweep(tmp_path, **kwargs)
    assert [r["test_mse_curve"] for r in again] == [r["test_mse_curve"] for r in rows]
    with pytest.raises(AssertionError, match="run again"):  # a new grid point is run
        dn.run_denoising_sweep(tmp_path, **{**kwargs, "cs": [0.3, 2.0]})

    assert all(len(r["validation_mse_curve"]) == 2 for r in rows)
    table = dn.summarize(rows)
    assert len(table) == 3 * 2  # 3 grid points x epochs 0, 1
    for select_on, key in (("validation", "validation_median"), ("test", "median")):
        best = dn.best_by_epoch(rows, select_on)
        assert [(b["scheme"], b["epoch"]) for b in best] == [("random", 0), ("random", 1), ("kglm", 0), ("kglm", 1)]
        k1 = min((r for r in table if r["scheme"] == "kglm" and r["epoch"] == 1), key=lambda r: r[key])
        assert best[3]["scale"] == k1["scale"] and best[3]["median"] == k1["median"]  # the test MSE there
        assert best[3]["selected_on"] == select_on


def test_cross_fitting_judges_each_seed_at_the_other_seeds_choice():
    """kGLM's validation MSEs at scale 0.1 are (0.1, 0.2, 0.9) for seeds 0, 1, 2 and 0.5 at 1.0.
    Leaving seed 0 out, the others' median at 0.1 is 0.55 > 0.5: seed 0 is judged at 1.0; leaving
    out seed 1 gives a tie (0.5, the smaller scale wins) and seed 2 0.15: both judged at 0.1. All
    three together choose 0.1, seed 0's own lucky validation MSE deciding it."""
    rows = (_rows("kglm", 0.1, [1.0, 2.0, 3.0], validation=[0.1, 0.2, 0.9])
            + _rows("kglm", 1.0, [10.0, 20.0, 30.0], validation=[0.5, 0.5, 0.5])
            + _rows("random", 0.1, [7.0] * 3, validation=[0.5] * 3) + _rows("random", 1.0, [8.0] * 3, validation=[0.6] * 3))
    c = dn.compare_schemes(rows, 0)
    assert c["seeds"] == [0, 1, 2] and c["n_seeds"] == 3 and c["cross_fit"] and c["select_on"] == "validation"
    assert c["kglm_scale_per_seed"] == [1.0, 0.1, 0.1] and c["kglm_mse"] == [10.0, 2.0, 3.0]
    assert c["random_scale_per_seed"] == [0.1] * 3 and c["random_mse"] == [7.0] * 3
    assert c["kglm_scale"] == 0.1  # the choice of all the seeds, reported beside
    plain = dn.compare_schemes(rows, 0, cross_fit=False)
    assert plain["kglm_scale_per_seed"] == [0.1] * 3 and plain["kglm_mse"] == [1.0, 2.0, 3.0]
    # a seed with no run at the grid point it is judged at is left out
    partial = [r for r in rows if not (r["scheme"] == "kglm" and r["scale"] == 1.0 and r["seed"] == 0)]
    c = dn.compare_schemes(partial, 0)
    assert c["seeds"] == [1, 2] and c["kglm_scale_per_seed"] == [0.1, 0.1]
    with pytest.raises(ValueError, match=r"compare_schemes: `rows` must be runs of both schemes with at least "
                                         r"two common seeds \(for cross_fit\)"):
        dn.compare_schemes([r for r in rows if r["seed"] == 0], 0)


def _rows(scheme, scale, values, validation=None):
    rows = [{"scheme": scheme, "scale": scale, "seed": i, "norm": scale, "test_mse_curve": [v]}
            for i, v in enumerate(values)]
    if validation is not None:
        for row, v in zip(rows, validation):
            row["validation_mse_curve"] = [v]
    return rows


def test_grid_points_are_chosen_on_the_validation_images():
    """The validation MSEs choose the grid point, the test MSEs are reported there: here the
    test-best point of each scheme is not the validation-best one, and only ``select_on="test"``
    picks it."""
    rows = (_rows("random", 0.1, [1.0, 1.1, 1.2], validation=[0.5, 0.6, 0.7])
            + _rows("random", 1.0, [0.8, 0.9, 1.0], validation=[0.9, 1.0, 1.1])
            + _rows("kglm", 0.1, [0.2, 0.3, 0.4], validation=[0.3, 0.4, 0.5])
            + _rows("kglm", 1.0, [0.5, 0.6, 0.7], validation=[0.1, 0.2, 0.3]))
    best = {b["scheme"]: b for b in dn.best_by_epoch(rows)}
    assert best["random"]["scale"] == 0.1 and best["random"]["median"] == pytest.approx(1.1)
    assert best["random"]["validation_median"] == pytest.approx(0.6) and best["random"]["selected_on"] == "validation"
    assert best["kglm"]["scale"] == 1.0 and best["kglm"]["median"] == pytest.approx(0.6)
    on_test = {b["scheme"]: b for b in dn.best_by_epoch(rows, "test")}
    assert on_test["random"]["scale"] == 1.0 and on_test["kglm"]["scale"] == 0.1
    c = dn.compare_schemes(rows, 0, cross_fit=False)
    assert (c["random_scale"], c["kglm_scale"]) == (0.1, 1.0) and c["ratio"] == pytest.approx(1.1 / 0.6)
    c = dn.compare_schemes(rows, 0, select_on="test", cross_fit=False)
    assert (c["random_scale"], c["kglm_scale"]) == (1.0, 0.1) and c["ratio"] == pytest.approx(0.9 / 0.3)
    with pytest.raises(ValueError, match=r"compare_schemes: `cross_fit` must be True or False, got 1"):
        dn.compare_schemes(rows, 0, cross_fit=1)
    with pytest.raises(ValueError, match=r"best_by_epoch: `select_on` must be 'test' for rows without "
                                         r"validation_mse_curve"):
        dn.compare_schemes(_rows("random", 0.1, [1.0]) + _rows("kglm", 0.1, [1.0]), 0)
    with pytest.raises(ValueError, match=r"best_by_epoch: `select_on` must be one of 'validation', 'test'"):
        dn.best_by_epoch(rows, "train")


def test_summaries_count_failures_and_compare():
    rows = (_rows("random", 0.1, [0.5, 0.6, np.nan, 0.7]) + _rows("random", 1.0, [np.inf, 2.0, 3.0, 4.0])
            + _rows("kglm", 0.1, [0.1, 0.2, 0.3, 0.4]) + _rows("kglm", 1.0, [0.9, 0.8, 0.7, 0.6]))
    table = {(r["scheme"], r["scale"]): r for r in dn.summarize(rows)}
    assert table["random", 0.1]["failed"] == 1 and table["random", 0.1]["median"] == pytest.approx(0.65)
    assert table["random", 0.1]["q75"] == np.inf and table["random", 0.1]["q25"] == 0.5
    best = {b["scheme"]: b for b in dn.best_by_epoch(rows, "test")}
    assert best["random"]["scale"] == 0.1 and best["random"]["failed"] == 2
    assert best["kglm"]["scale"] == 0.1 and best["kglm"]["median"] == pytest.approx(0.25)
    c = dn.compare_schemes(rows, 0, "test", cross_fit=False)
    # paired by seed: 4 seeds, kGLM lower on all of them (one pair against a failed random run)
    assert c["n_seeds"] == 4
    assert c["kglm_wins"] == 1.0 and c["p_value"] == pytest.approx(c["p_floor"]) == pytest.approx(1 / 16)
    assert c["ratio"] == pytest.approx(0.65 / 0.25)
    swapped = [{**r, "scheme": {"random": "kglm", "kglm": "random"}[r["scheme"]]} for r in rows]
    assert c["p_value_reverse"] == pytest.approx(1.0)
    reverse = dn.compare_schemes(swapped, 0, "test", cross_fit=False)
    assert reverse["p_value"] > 0.9 and reverse["p_value_reverse"] == pytest.approx(1 / 16)
    with pytest.raises(ValueError, match=r"compare_schemes: `epoch` must be an epoch evaluated for both"):
        dn.compare_schemes(rows, 3, "test", cross_fit=False)


def test_compare_schemes_pairs_seeds():
    """The comparison is paired by seed (a seed fixes batch order and training noise for both
    schemes). Seeds that vary a lot among themselves, kGLM lower by 0.1 on every one: the paired
    signed-rank test gives its floor 2^-6, an unpaired rank test of the same 12 numbers would not
    be significant (Mann-Whitney p ~ 0.41)."""
    base = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    rows = _rows("random", 0.1, base) + _rows("kglm", 0.5, base - 0.1)
    c = dn.compare_schemes(rows, 0, "test", cross_fit=False)
    assert c["n_seeds"] == 6 and c["kglm_wins"] == 1.0
    assert c["p_value"] == pytest.approx(2.0**-6) and c["p_value_reverse"] == pytest.approx(1.0)
    assert stats.mannwhitneyu(base - 0.1, base, alternative="less").pvalue > 0.3
    # the exact signed-rank p-value against scipy's exact test on a case without ties or failures
    d_kglm = base + np.array([-0.5, 0.2, -0.9, -0.3, 0.05, -1.1])
    c = dn.compare_schemes(_rows("random", 0.1, base) + _rows("kglm", 0.5, d_kglm), 0, "test", cross_fit=False)
    expected = stats.wilcoxon(d_kglm - base, alternative="less", method="exact").pvalue
    assert c["p_value"] == pytest.approx(expected) and c["kglm_wins"] == pytest.approx(4 / 6)
    # seeds are matched by their number, not by position; unmatched seeds are left out
    shuffled = _rows("random", 0.1, base)[::-1] + _rows("kglm", 0.5, base - 0.1) + [
        {"scheme": "kglm", "scale": 0.5, "seed": 99, "norm": 0.5, "test_mse_curve": [100.0]}]
    c = dn.compare_schemes(shuffled, 0, "test", cross_fit=False)
    assert c["n_seeds"] == 6 and c["p_value"] == pytest.approx(2.0**-6)
    # both runs of a seed failed: a tie, dropped; kGLM failed alone: its worst difference
    failing = _rows("random", 0.1, [np.nan, 1.0, 2.0, 3.0]) + _rows("kglm", 0.5, [np.inf, np.nan, 1.5, 2.7])
    c = dn.compare_schemes(failing, 0, "test", cross_fit=False)
    assert c["n_seeds"] == 4 and c["kglm_wins"] == pytest.approx((0.5 + 0 + 1 + 1) / 4)
    # |d| ranks: 3 (kGLM failed, +), 2 (-0.5), 1 (-0.3); W+ = 3, and 5 of the 8 sign patterns give W+ <= 3
    assert c["p_value"] == pytest.approx(5 / 8)
    with pytest.raises(ValueError, match=r"compare_schemes: `rows` must be runs of both schemes"):
        dn.compare_schemes(_rows("random", 0.1, [1.0]) + [
            {"scheme": "kglm", "scale": 0.5, "seed": 7, "norm": 0.5, "test_mse_curve": [1.0]}], 0, "test",
            cross_fit=False)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: dn.train_seeds("xavier", 1.0, [0]), r"train_seeds: `scheme` must be one of 'random', 'kglm'"),
    (lambda: dn.train_seeds("kglm", 0.0, [0]), r"train_seeds: `scale` must be a finite real number > 0, got 0.0"),
    (lambda: dn.train_seeds("kglm", 1.0, []), r"`seeds` must be a non-empty list of distinct integers >= 0"),
    (lambda: dn.train_seeds("kglm", 1.0, [1, 1]), r"`seeds` must be a non-empty list of distinct"),
    (lambda: dn.train_seeds("kglm", 1.0, 3), r"`seeds` must be a non-empty list"),
    (lambda: dn.train_seeds("kglm", 1.0, [0], lr=1), r"unknown option\(s\) \['lr'\]; valid options are"),
    (lambda: dn.train_seeds("kglm", 1.0, [0], epochs=-1), r"`epochs` must be an integer >= 0, got -1"),
    (lambda: dn.train_seeds("kglm", 1.0, [0], noise_std=-0.1), r"`noise_std` must be a finite real number >= 0"),
    (lambda: dn.train_seeds("kglm", 1.0, [0], **{**SMALL, "batch_size": 64}),
     r"`batch_size` must be at most the number of training images \(32\), got 64"),
    (lambda: dn.train_seeds("kglm", 1.0, [0], **{**SMALL, "test_size": 20}),
     r"`test_size` must be a multiple of batch_size = 16"),
    (lambda: dn.load_images("mnist"), r"load_images: `dataset` must be one of 'image_patches', 'cifar10'"),
    (lambda: dn.load_images("cifar10", image_size=16), r"`image_size` must be None or 32 for 'cifar10'"),
    (lambda: dn.load_images(image_size=6), r"`image_size` must be an integer >= 7"),
    (lambda: dn.load_images(train_size=10**6), r"`train_size` must be an integer >= 1 and <= 416"),
    (lambda: dn.load_images(train_size=400, validation_size=32), r"`train_size` must be an integer >= 1 and <= 384"),
    (lambda: dn.load_images(validation_size=-1), r"load_images: `validation_size` must be an integer >= 0"),
    (lambda: dn.load_images(validation_size=416), r"`validation_size` must be an integer >= 0 and <= 415"),
    (lambda: dn.train_seeds("kglm", 1.0, [0], **{**SMALL, "validation_size": 8}),
     r"train_seeds: `validation_size` must be a multiple of batch_size = 16"),
    (lambda: dn.init_weights("kglm", 1.0, jax.random.key(0), (6, 32)), r"`image_shape` must be an integer >= 7"),
    (lambda: dn.init_weights("kglm", 1.0, 0), r"init_weights: `key`"),
    (lambda: dn.corrupt(jax.random.key(0), jnp.zeros(3), noise_std=-1.0), r"corrupt: `noise_std` must be"),
    (lambda: dn.run_denoising_sweep("/tmp/x", variances=0.1), r"run_denoising_sweep: `variances` must be a list"),
    (lambda: dn.run_denoising_sweep("/tmp/x", cs=[1.0, -1.0]), r"`cs` must be a finite real number > 0"),
])
def test_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_cifar10_missing_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="CIFAR-10 batch 'data_batch_1' not found"):
        dn.load_images("cifar10", data_path=tmp_path)
