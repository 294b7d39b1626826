"""deqlab.lab.experiments.sequence.weight_tied and .costs: the measurements behind chapter 5's pages 1
and 3, checked on problems whose answers are known."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from deqlab.lab.experiments.sequence import costs, weight_tied


class _LinearCell(nnx.Module):
    """f(z, x) = z A + x: a cell whose Jacobian A is known exactly."""

    def __init__(self, a):
        self.a = nnx.Param(a)
        self.width = a.shape[0]
        self.in_features = a.shape[0]

    def readout(self, z):
        return z

    def __call__(self, z, x):
        return z @ self.a[...] + x


def _rotation_cell(radius, n=6):
    # block-diagonal 2x2 rotations scaled by radius: every eigenvalue has modulus `radius`, complex
    angles = np.linspace(0.3, 1.2, n // 2)
    a = np.zeros((n, n))
    for i, t in enumerate(angles):
        a[2 * i:2 * i + 2, 2 * i:2 * i + 2] = radius * np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]])
    return _LinearCell(jnp.asarray(a))


@pytest.mark.float64
def test_jacobian_radius_and_picard_rate_on_a_known_linear_map():
    """On f(z) = zA + x with spectral radius 0.7 (complex pairs) both estimates give 0.7."""
    cell = _rotation_cell(0.7)
    x = jax.random.normal(jax.random.key(0), (3, 4, 6))
    z_star = jnp.linalg.solve((jnp.eye(6) - cell.a[...]).T, x.reshape(-1, 6).T).T.reshape(x.shape)
    np.testing.assert_allclose(cell(z_star, x), z_star, atol=1e-12)
    np.testing.assert_allclose(weight_tied.jacobian_radius(cell, z_star, x, iterations=100), 0.7, rtol=1e-6)
    traces = weight_tied.convergence(cell, x, evaluations=60, tol=1e-12)
    # the residual of a normal linear map falls by exactly rho per layer
    np.testing.assert_allclose(weight_tied.picard_rate(traces["unrolled"], floor=1e-12), 0.7, rtol=1e-2)
    assert np.all(traces["broyden"][-1] < 1e-11)  # a linear problem: Broyden converges, faster
    assert np.all(traces["broyden"][-1] < traces["unrolled"][-1])
    distance = weight_tied.distance_to_equilibrium(cell, x, z_star, [1, 5, 10])
    np.testing.assert_allclose(distance[2] / distance[1], 0.7**5, rtol=1e-6)  # error shrinks by rho^5


def test_jacobian_radius_above_one():
    cell = _rotation_cell(1.3)
    x = jnp.zeros((2, 3, 6))
    np.testing.assert_allclose(weight_tied.jacobian_radius(cell, x, x, iterations=80), 1.3, rtol=1e-6)


def test_markov_corpus_entropy_rate():
    """The empirical conditional entropy of the next token given two tokens matches the computed
    entropy rate: 512 x 64 transitions over 16 contexts, a plug-in estimate biased low by about
    (#cells) / (2 n) = 64 / 65536 nats, with a standard error of ~0.005 nats."""
    tokens, rate = costs.markov_corpus(jax.random.key(1), vocab=4, sequences=512, length=64, concentration=0.5)
    assert tokens.shape == (512, 65) and tokens.dtype == np.int32
    assert tokens.min() >= 0 and tokens.max() < 4
    counts = np.zeros((4, 4, 4))
    np.add.at(counts, (tokens[:, :-2], tokens[:, 1:-1], tokens[:, 2:]), 1)
    p_context = counts.sum(-1) / counts.sum()
    law = counts / np.maximum(counts.sum(-1, keepdims=True), 1)
    plug_in = -np.sum(p_context[..., None] * np.where(law > 0, law * np.log(np.where(law > 0, law, 1)), 0))
    assert 0 < rate < np.log(4)
    assert abs(plug_in - rate) < 0.03, (plug_in, rate)


def test_make_lm_and_bad_arguments():
    model = costs.make_lm("trellis", vocab=5, width=8)
    assert model.block.cell.width == 8
    with pytest.raises(ValueError, match="kind"):
        costs.make_lm("lstm", vocab=5, width=8)
    with pytest.raises(ValueError, match="width"):
        costs.make_lm("trellis", vocab=5, width=7)
    with pytest.raises(ValueError, match="vocab"):
        costs.markov_corpus(jax.random.key(0), vocab=0)
    with pytest.raises(ValueError, match="evaluations"):
        weight_tied.convergence(_rotation_cell(0.5), jnp.zeros((1, 2, 6)), evaluations=0)


@pytest.mark.slow
def test_memory_of_the_deep_network_grows_and_the_deq_does_not():
    out = costs.training_memory("trellis", [2, 8], deq_depths=[2, 8], vocab=8, width=16, length=16, batch=4)
    assert out["unrolled"][1] > out["unrolled"][0]
    assert out["deq"][0] == out["deq"][1]


@pytest.mark.slow
def test_equilibrium_tradeoff_matches_the_model():
    """The loss at the tightest tolerance is the model's own loss (the same Broyden iterates)."""
    model = costs.make_lm("trellis", vocab=6, width=8, tol=1e-5, max_steps=40, param_dtype=jnp.float32)
    tokens, _ = costs.markov_corpus(jax.random.key(2), vocab=6, sequences=8, length=12)
    out = costs.equilibrium_tradeoff(model, tokens[:, :-1], tokens[:, 1:], max_steps=40, tolerances=(1e-1, 1e-5))
    assert abs(out["loss_at_tol"][-1] - out["converged_loss"]) < 1e-4
    assert out["steps_at_tol"][0] <= out["steps_at_tol"][1]


def test_median_interval_order_statistics_and_coverage():
    """n = 15: P(Binomial(15, 1/2) <= 3) = 576 / 32768, so the interval is [x_(4), x_(12)] with coverage
    1 - 2 * 576 / 32768 = 0.96484375; over 4000 samples of 15 exponential draws the interval holds the
    median ln 2 in a fraction whose binomial standard error is 0.003, so 0.95 is 5 standard errors below."""
    out = costs.median_interval(np.arange(15.0, 0.0, -1.0))
    assert (out["median"], out["low"], out["high"]) == (8.0, 4.0, 12.0)
    assert out["coverage"] == pytest.approx(1 - 2 * 576 / 32768, abs=1e-12)
    rng = np.random.default_rng(0)
    draws = np.sort(rng.exponential(size=(4000, 15)), axis=1)
    held = (draws[:, 3] <= np.log(2)) & (np.log(2) <= draws[:, 11])
    assert held.mean() > 0.95, held.mean()
    assert np.isnan(costs.median_interval([1.0, 2.0, 3.0])["low"])  # too few for 95%
    with pytest.raises(ValueError, match="samples"):
        costs.median_interval([])
    with pytest.raises(ValueError, match="confidence"):
        costs.median_interval([1.0] * 10, confidence=1.0)


def test_interval_text_precision():
    assert costs.interval_text({"median": 3.1212, "low": 2.5568, "high": 3.5643}) == "3.1 (2.6 to 3.6)"
    assert costs.interval_text({"median": 0.0518, "low": 0.0318, "high": 0.0678}, scale=1e3) == "52 (32 to 68)"
    assert costs.interval_text({"median": 1.234, "low": 1.231, "high": 1.236}) == "1.234 (1.231 to 1.236)"
    assert costs.interval_text({"median": 2.0, "low": 2.0, "high": 2.0}) == "2"
    assert costs.interval_text({"median": 1.1, "low": -0.2, "high": 2.3}) == "1 (0 to 2)"  # no "-0"
    with pytest.raises(ValueError, match="summary"):
        costs.interval_text({"median": 1.0})


@pytest.mark.slow  # five compiled programs
def test_profile_times_one_set_of_rounds():
    """The per-round quantities are the documented functions of the same runs: the decomposition of the
    inference times and the factor between the training and the inference ratio hold exactly."""
    model = costs.make_lm("trellis", vocab=6, width=8, tol=1e-4, max_steps=20)
    tokens, _ = costs.markov_corpus(jax.random.key(3), vocab=6, sequences=4, length=12)
    p = costs.profile(model, tokens[:, :-1], tokens[:, 1:], depth=3, repeats=6)
    t, r = p["times"], p["rounds"]
    assert set(t) == set(costs.PROGRAMS) and all(v.shape == (6,) and np.all(v > 0) for v in t.values())
    assert 1 <= p["nfe"] <= 21 and p["mem_ratio"] == p["mem_deq"] / p["mem_unrolled"]
    np.testing.assert_allclose(t["infer_deq"], t["infer_one"] + p["nfe"] * r["iteration"], rtol=1e-12)
    np.testing.assert_allclose(t["infer_unrolled"], t["infer_one"] + 2 * r["layer"], rtol=1e-12)
    np.testing.assert_allclose(r["train_ratio"] / r["infer_ratio"],
                               (1 + r["backward_deq"]) / (1 + r["backward_unrolled"]), rtol=1e-12)
    assert p["summary"]["infer_ratio"]["median"] == pytest.approx(np.median(r["infer_ratio"]))
    with pytest.raises(ValueError, match="depth"):
        costs.profile(model, tokens[:, :-1], tokens[:, 1:], depth=1)
    with pytest.raises(ValueError, match="repeats"):
        costs.profile(model, tokens[:, :-1], tokens[:, 1:], depth=3, repeats=5)


@pytest.mark.slow  # training and counting compile several programs
def test_train_counting_counts_fixed_sequences():
    """The counts are those of the model's own solve (solver_counts agrees with the model's statistics),
    taken before training and every `every` steps."""
    import optax
    from flax import nnx

    tokens, _ = costs.markov_corpus(jax.random.key(4), vocab=6, sequences=10, length=8)
    model = costs.make_lm("trellis", vocab=6, width=8, tol=1e-4, max_steps=20)
    counts = costs.solver_counts(model, tokens[:, :-1], radius_steps=10)
    stats = model(tokens[:, :-1])[1]
    assert float(stats["steps_mean"]) == pytest.approx(counts["steps"].mean())
    assert float(stats["converged_fraction"]) == pytest.approx(counts["converged"].mean())
    assert counts["radius"].shape == (10,) and np.all(counts["radius"] > 0)
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    out = costs.train_counting(model, optimizer, tokens[:8], tokens[8:], batch=2, steps=4, every=2)
    assert out["at"].tolist() == [0, 2, 4] and out["steps"].shape == out["converged"].shape == (3, 2)
    assert len(out["log"]["loss"]) == 4 and "radius" not in out
    with pytest.raises(ValueError, match="every"):
        costs.train_counting(model, optimizer, tokens[:8], tokens[8:], batch=2, steps=4, every=3)
    with pytest.raises(ValueError, match="radius_steps"):
        costs.solver_counts(model, tokens[:, :-1], radius_steps=1)
    with pytest.raises(ValueError, match="model"):
        costs.solver_counts(costs.make_lm("trellis", vocab=6, width=8, depth=2), tokens[:, :-1])


def test_exact_radius_and_snapshots():
    """`solver_counts(exact_radius=True)` is the exact spectral radius at the solve's last iterate
    (eigenvalues of the causal Jacobian's diagonal blocks): a long power iteration (200 steps, the
    mean log growth over the last 100) agrees with it to 2 %; `train_counting(snapshots=True)`
    keeps a copy of the model at each count: the first is the untrained model, later ones differ."""
    import optax
    from flax import nnx

    tokens, _ = costs.markov_corpus(jax.random.key(4), vocab=6, sequences=10, length=8)
    model = costs.make_lm("transformer", vocab=6, width=8, tol=1e-4, max_steps=20)
    counts = costs.solver_counts(model, tokens[:, :-1], radius_steps=200, exact_radius=True)
    np.testing.assert_allclose(counts["radius"], counts["radius_exact"], rtol=2e-2)
    before = [np.array(a) for a in jax.tree.leaves(nnx.state(model, nnx.Param))]  # copies: training updates in place
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    out = costs.train_counting(model, optimizer, tokens[:8], tokens[8:], batch=2, steps=2, every=2, snapshots=True)
    assert len(out["models"]) == len(out["at"]) == 2
    first, last = (jax.tree.leaves(nnx.state(m, nnx.Param)) for m in out["models"])
    assert all(np.array_equal(a, b) for a, b in zip(first, before))
    assert not all(np.array_equal(a, b) for a, b in zip(first, last))
    with pytest.raises(ValueError, match="exact_radius"):
        costs.solver_counts(model, tokens[:, :-1], exact_radius="yes")
    with pytest.raises(ValueError, match="snapshots"):
        costs.train_counting(model, optimizer, tokens[:8], tokens[8:], batch=2, steps=2, every=2, snapshots=1)
