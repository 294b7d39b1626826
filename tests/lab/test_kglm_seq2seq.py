"""Tests of deqlab.lab.experiments.kglm.seq2seq (004 §4, Experiment 1, Fig. 5)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from deqlab.lab.experiments.kglm import seq2seq as s2s
from deqlab.theory.kglm import (
    deq_predict,
    initializer,
    k_true,
    kglm_predict,
    lam_for_spectral_norm,
    naive_coordinates,
    squared_exponential,
)

# Training tests share one size, so that they share the compiled programs.
TINY = dict(epochs=2, train_size=48, test_size=16, max_steps=30)


@pytest.mark.float64
def test_grids_and_kernel_are_the_papers():
    X, Xt = s2s.grids()
    assert X.shape == Xt.shape == (100,)
    np.testing.assert_allclose([X[0], X[-1], Xt[0], Xt[-1]],
                               [-2 * math.pi, 2 * math.pi, -2 * math.pi - 2, 2 * math.pi - 2], rtol=1e-15)
    np.testing.assert_allclose(np.diff(X), np.full(99, 4 * math.pi / 99), rtol=1e-12)
    # 004 §4 written out, independently of deqlab.theory.kglm.kernels
    both = np.concatenate([X, Xt])
    r = np.abs(both[:, None] - both[None, :])
    expected = 0.1 * np.exp(-r**2 / 2) * np.exp(-np.sin(r) ** 2)
    np.testing.assert_allclose(s2s.joint_covariance(), expected, rtol=1e-12, atol=1e-15)
    x = np.linspace(-12, 8, 41)
    np.testing.assert_allclose(np.asarray(s2s.mean_function(x)),
                               np.exp(-x**2 / 10) * np.sin(x) + np.exp(-(x + 9) ** 2), rtol=1e-12, atol=1e-15)


@pytest.mark.float64
def test_sample_covariance_matches_k_true():
    """Sample mean and covariance of M joint draws against h and k_true (004 §4).

    The sample covariance S_ij of M Gaussian draws has standard error sqrt((Sigma_ii Sigma_jj +
    Sigma_ij^2) / M); the mean's is sqrt(Sigma_ii / M). Over the 20100 distinct covariance entries
    and the 200 means, a two-sided Bonferroni bound at a family-wise level of 1e-4 is
    |z| < norm.isf(1e-4 / (2 * 20300)) = 5.85 (5.3 would be a family-wise level of 2.4e-3): a
    wrong kernel (e.g. k_true without its periodic factor, which changes entries by up to 30 % of
    the variance) is ~40 standard errors off.
    """
    M = 20000
    z_crit = stats.norm.isf(1e-4 / (2 * (20100 + 200)))
    assert 5.8 < z_crit < 5.9
    Y, Yt = s2s.sample_sequences(jax.random.key(3), M, dtype=jnp.float64)
    assert Y.dtype == jnp.float64 and Y.shape == Yt.shape == (M, 100)
    draws = np.concatenate([np.asarray(Y), np.asarray(Yt)], axis=1)
    Sigma = s2s.joint_covariance()
    X, Xt = s2s.grids()
    mean = np.concatenate([np.asarray(s2s.mean_function(X)), np.asarray(s2s.mean_function(Xt))])
    z_mean = (draws.mean(0) - mean) / np.sqrt(np.diag(Sigma) / M)
    assert np.max(np.abs(z_mean)) < z_crit, np.max(np.abs(z_mean))
    S = np.cov(draws, rowvar=False)
    d = np.diag(Sigma)
    se = np.sqrt((np.outer(d, d) + Sigma**2) / M)
    z = (S - Sigma) / se
    assert np.max(np.abs(z)) < z_crit, np.max(np.abs(z))
    # the same test rejects the kernel without its periodic factor
    wrong = 0.1 * np.exp(-np.subtract.outer(np.r_[X, Xt], np.r_[X, Xt]) ** 2 / 2)
    assert np.max(np.abs((S - wrong) / se)) > 20


def test_seed_data_is_normalised_by_training_inputs():
    Y, Yt, Y_test, Yt_test = s2s.seed_data(5, train_size=200, test_size=50)
    assert Y.shape == Yt.shape == (200, 100) and Y_test.shape == (50, 100)
    np.testing.assert_allclose([float(jnp.mean(Y)), float(jnp.std(Y))], [0.0, 1.0], atol=1e-5)
    raw = s2s.seed_data(5, train_size=200, test_size=50, normalise=False)
    mu, sd = jnp.mean(raw[0]), jnp.std(raw[0])
    for a, b in zip(raw, (Y, Yt, Y_test, Yt_test)):
        np.testing.assert_allclose(np.asarray((a - mu) / sd), np.asarray(b), rtol=1e-5, atol=1e-5)


@pytest.mark.float64
def test_informed_model_at_epoch_0_is_the_kglm():
    """004 Cor. 6: with the informed weights the untrained DEQ is the kGLM of the tanh family,
    fitted to each sequence and evaluated at X~ (float64, solves to 1e-12)."""
    C = 0.5
    model = s2s.init_model("informed", C, seed=0, param_dtype=jnp.float64, tol=1e-12, max_steps=300)
    Y = np.asarray(s2s.seed_data(0, train_size=200, test_size=50)[2], np.float64)[:6]
    out = np.asarray(model(jnp.asarray(Y)))
    X, Xt = s2s.grids()
    K = np.asarray(k_true()(X, X))
    lam = lam_for_spectral_norm(K, C)
    weights, lam_s2s = s2s.kglm_weights("informed", C)
    assert lam_s2s == pytest.approx(lam, rel=1e-12)
    for i, y in enumerate(Y):
        fit = kglm_predict(X, y, Xt, k_true(), lam, s2s.TANH_FAMILY)
        np.testing.assert_allclose(out[i], fit.prediction, rtol=1e-9, atol=1e-10)
        deq = deq_predict(X, y, Xt, k_true(), lam, s2s.TANH_FAMILY)
        np.testing.assert_allclose(out[i], np.asarray(deq.prediction), rtol=1e-9, atol=1e-10)
    # the weights are exactly deqlab's informed initialiser, in nnx.Linear's layout
    ref = initializer("informed", K, lam, np.asarray(k_true()(Xt, X)))
    np.testing.assert_allclose(np.asarray(model.deq.cell.hidden.kernel[...]), np.asarray(ref.W1).T, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(model.deq.cell.inject.kernel[...]), np.asarray(ref.W2).T, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(model.readout.kernel[...]), np.asarray(ref.V1).T, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(model.skip.kernel[...]), np.asarray(ref.V2).T, rtol=1e-12)
    assert np.linalg.norm(np.asarray(ref.W1), 2) == pytest.approx(C, rel=1e-10)


@pytest.mark.float64
def test_naive_and_random_weights():
    C = 0.3
    naive = s2s.init_model("naive", C, seed=1)
    grid = naive_coordinates(100)
    K = np.asarray(squared_exponential(1.0)(grid, grid))
    ref = initializer("naive", K, lam_for_spectral_norm(K, C))
    np.testing.assert_allclose(np.asarray(naive.deq.cell.hidden.kernel[...]), np.asarray(ref.W1).T, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(naive.deq.cell.inject.kernel[...]), np.asarray(ref.W2).T, rtol=1e-6)
    random = s2s.init_model("random", 1.0, seed=1)
    # V1, V2 of the naive scheme follow the random scheme's law (004 §4): the same draws
    np.testing.assert_array_equal(np.asarray(naive.readout.kernel[...]), np.asarray(random.readout.kernel[...]))
    np.testing.assert_array_equal(np.asarray(naive.skip.kernel[...]), np.asarray(random.skip.kernel[...]))
    # PyTorch's default law: U(-1/sqrt(100), 1/sqrt(100)), variance 1/300
    w = np.concatenate([np.asarray(random.deq.cell.hidden.kernel[...]).ravel(),
                        np.asarray(random.readout.kernel[...]).ravel()])
    assert np.max(np.abs(w)) <= 0.1 and np.max(np.abs(w)) > 0.099
    # sample variance of 20000 uniforms: relative standard error sqrt(0.8 / 20000) = 0.6 %
    assert np.var(w) == pytest.approx(1 / 300, rel=0.04)
    for b in (random.deq.cell.inject.bias, random.readout.bias):
        assert np.all(np.asarray(b[...]) == 0.0)
    doubled = s2s.init_model("random", 2.0, seed=1)
    np.testing.assert_allclose(np.asarray(doubled.readout.kernel[...]), 2 * np.asarray(random.readout.kernel[...]),
                               rtol=1e-6)


def test_vmapped_seeds_equal_seeds_one_by_one():
    together = s2s.train_seeds("naive", 0.5, [0, 1], freeze_epochs=1, **TINY)
    for i, seed in enumerate([0, 1]):
        alone = s2s.train_seeds("naive", 0.5, [seed], freeze_epochs=1, **TINY)
        # epoch 0 involves no training: only the stopping step of the vmapped solve differs
        np.testing.assert_allclose(together["test_error_curve"][i][0], alone["test_error_curve"][0][0], rtol=1e-4)
        # a vmapped while loop runs until every seed has converged: the same to ~tol = 1e-3
        np.testing.assert_allclose(together["test_error_curve"][i], alone["test_error_curve"][0], rtol=5e-3)
        np.testing.assert_allclose(together["train_loss_curve"][i], alone["train_loss_curve"][0], rtol=5e-3)
    assert together["seeds"] == [0, 1]
    curves = np.array(together["test_error_curve"])
    assert curves.shape == (2, TINY["epochs"] + 1) and np.all(np.isfinite(curves))
    assert np.all(np.array(together["converged_curve"]) == 1.0)
    # different seeds draw different data and weights
    assert abs(curves[0, 0] - curves[1, 0]) > 1e-3


def test_training_lowers_the_error_and_the_freeze_is_applied():
    free = s2s.train_seeds("naive", 0.5, [0, 1], freeze_epochs=0, **TINY)
    frozen = s2s.train_seeds("naive", 0.5, [0, 1], freeze_epochs=1, **TINY)
    # the same start; the first update differs only in whether W1, W2, b move
    np.testing.assert_allclose(np.array(free["test_error_curve"])[:, 0], np.array(frozen["test_error_curve"])[:, 0],
                               rtol=1e-6)
    assert np.all(np.abs(np.array(free["test_error_curve"])[:, 1] - np.array(frozen["test_error_curve"])[:, 1]) > 0)
    for r in (free, frozen):
        c = np.array(r["test_error_curve"])
        assert np.all(c[:, -1] < c[:, 0]), c
    # the freeze is ignored by the other schemes
    a = s2s.train_seeds("random", 1.0, [0, 1], freeze_epochs=0, **TINY)
    b = s2s.train_seeds("random", 1.0, [0, 1], freeze_epochs=1, **TINY)
    np.testing.assert_array_equal(a["test_error_curve"], b["test_error_curve"])
    initial = s2s.initial_test_error("random", 1.0, [0, 1], **TINY)
    np.testing.assert_allclose(initial["test_error"], np.array(a["test_error_curve"])[:, 0], rtol=1e-6)
    assert initial["converged"] == [1.0, 1.0]


def test_sweep_resumes_summary_and_compare(tmp_path, monkeypatch):
    units = [("random", 1.0), ("informed", 0.5)]
    rows = s2s.run_seq2seq_sweep(tmp_path, units, seeds=[0, 1], chunk=1, progress=False, **TINY)
    assert [(r["scheme"], r["seed"]) for r in rows] == [("random", 0), ("random", 1), ("informed", 0), ("informed", 1)]
    assert len(list(tmp_path.glob("*.json"))) == 4  # one stored result per unit and chunk

    def no_training(*args, **kwargs):
        raise AssertionError("a finished unit was run again")

    monkeypatch.setattr(s2s, "train_seeds", no_training)
    again = s2s.run_seq2seq_sweep(tmp_path, units, seeds=[0, 1], chunk=1, progress=False, **TINY)
    assert again == rows

    summary = s2s.summarize(rows)
    assert [(u["scheme"], u["scale"], u["n"]) for u in summary] == [("random", 1.0, 2), ("informed", 0.5, 2)]
    curves = np.array([r["test_error_curve"] for r in rows[:2]])
    np.testing.assert_allclose(summary[0]["median"], np.median(curves, 0))
    np.testing.assert_allclose(summary[0]["min"], curves.min(0))
    assert summary[0]["final_median"] == pytest.approx(np.median(curves[:, -1]))
    result = s2s.compare(rows, ("informed", 0.5), ("random", 1.0), epoch=0)
    a = np.array([r["test_error_curve"][0] for r in rows[2:]])
    b = curves[:, 0]
    assert result["n"] == 2 and result["wins"] == int(np.sum(a < b))
    assert result["median_ratio"] == pytest.approx(np.median(a / b))


def test_compare_p_value_is_wilcoxon():
    rng = np.random.default_rng(0)
    rows = []
    for seed in range(12):
        base = rng.uniform(1, 2)
        rows.append({"scheme": "random", "scale": 1.0, "seed": seed, "test_error_curve": [base, base]})
        rows.append({"scheme": "informed", "scale": 0.5, "seed": seed, "test_error_curve": [base, base * 0.9]})
    r = s2s.compare(rows, ("informed", 0.5), ("random", 1.0))
    assert r["wins"] == 12 and r["median_ratio"] == pytest.approx(0.9)
    assert r["p_value"] == pytest.approx(2.0**-12, rel=1e-6)  # exact one-sided test, all 12 signs agree


@pytest.mark.parametrize("call, name", [
    (lambda: s2s.Seq2SeqDEQ("kernel", 1.0, rngs=None), "scheme"),
    (lambda: s2s.init_model("informed", 0.0, 0), "scale"),
    (lambda: s2s.init_model("random", -1.0, 0), "scale"),
    (lambda: s2s.init_model("random", 1.0, -1), "seed"),
    (lambda: s2s.train_seeds("random", 1.0, [], **TINY), "seeds"),
    (lambda: s2s.train_seeds("random", 1.0, [1, 1], **TINY), "seeds"),
    (lambda: s2s.train_seeds("random", 1.0, 3, **TINY), "seeds"),
    (lambda: s2s.train_seeds("random", 1.0, [0], epochs=0), "epochs"),
    (lambda: s2s.train_seeds("random", 1.0, [0], train_size=10, batch_size=11), "batch_size"),
    (lambda: s2s.train_seeds("random", 1.0, [0], learning_rate=0.0), "learning_rate"),
    (lambda: s2s.train_seeds("random", 1.0, [0], freeze_epochs=-1), "freeze_epochs"),
    (lambda: s2s.train_seeds("random", 1.0, [0], normalise="yes"), "normalise"),
    (lambda: s2s.sample_sequences(0, 10), "key"),
    (lambda: s2s.sample_sequences(jax.random.key(0), 0), "count"),
    (lambda: s2s.grids(1), "n"),
    (lambda: s2s.kglm_weights("random", 0.5), "scheme"),
    (lambda: s2s.run_seq2seq_sweep("/nonexistent", [("informed",)], seeds=[0]), "units"),
    (lambda: s2s.run_seq2seq_sweep("/nonexistent", [("random", 1.0)], seeds=[0], chunk=0), "chunk"),
    (lambda: s2s.summarize([]), "rows"),
    (lambda: s2s.compare([{"scheme": "random", "scale": 1.0, "seed": 0, "test_error_curve": [1.0]}],
                         ("informed", 0.5), ("random", 1.0)), "better"),
])
def test_argument_errors(call, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        call()


def test_unknown_option_is_named():
    with pytest.raises(ValueError, match="unknown option.*epoch"):
        s2s.train_seeds("random", 1.0, [0], epoch=3)
