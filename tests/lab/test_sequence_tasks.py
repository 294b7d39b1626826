"""Experiments of chapter 5 pages 2 and 4: copy memory (003 §5.1) and the resumable language model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqlab.lab import data
from deqlab.lab.experiments.sequence import copy_memory as cm
from deqlab.lab.experiments.sequence import language_model as lm
from deqlab.nn import baselines


@pytest.mark.parametrize("kind", cm.MODELS)
@pytest.mark.parametrize("delay", [10, 400])
def test_models_meet_the_budget(kind, delay):
    model = cm.make_model(kind, parameters=14_000, delay=delay)
    count = baselines.parameter_count(model)
    # widths move in steps: within 12% of 14K (the DEQ's width moves in steps of its 4 heads)
    assert abs(count - 14_000) < 0.12 * 14_000, (kind, delay, count)


@pytest.mark.slow  # training (and its compilation) on a 2-core CPU
def test_tcn_learns_copy_memory_and_sweep_reads_back(tmp_path):
    # a TCN that sees the whole sequence recalls the symbols: its loss falls far below the
    # memoryless baseline; an LSTM trained as briefly stays at it (003 Table 1's contrast, small T)
    common = dict(delay=5, steps=160, batch_size=32, learning_rate=1e-2, budget=3000, seed=0, test_size=128)
    rows = cm.run_copy_memory(tmp_path, ["tcn", "lstm"], **common)
    tcn, lstm = rows
    assert tcn["baseline"] == pytest.approx(data.copy_memory_baseline(5))
    assert tcn["test_loss"] < 0.3 * tcn["baseline"] and tcn["recall_accuracy"] > 0.9, tcn
    assert lstm["test_loss"] > 0.8 * lstm["baseline"], lstm
    assert len(tcn["train_loss"]) == len(tcn["loss_steps"]) == 20 and tcn["loss_steps"][-1] == 160
    again = cm.run_copy_memory(tmp_path, ["tcn", "lstm"], **common)
    assert again == rows  # read back, not retrained


@pytest.mark.slow  # training (and its compilation) on a 2-core CPU
def test_deq_transformer_reports_solver_stats():
    r = cm.train_copy_memory(dict(model="deq-transformer", delay=3, steps=4, batch_size=4, learning_rate=1e-3,
                                  budget=3000, seed=0, test_size=8, max_steps=4, log_every=2))
    assert len(r["solver_steps"]) == len(r["converged_fraction"]) == 2
    assert all(1 <= s <= 4 for s in r["solver_steps"]) and 0 <= r["test_converged_fraction"] <= 1
    assert np.isfinite(r["test_loss"])


def test_copy_memory_bad_config():
    with pytest.raises(ValueError, match="config"):
        cm.train_copy_memory(dict(model="lstm"))
    with pytest.raises(ValueError, match="kind"):
        cm.make_model("rnn", parameters=1000, delay=5)
    with pytest.raises(ValueError, match="models"):
        cm.run_copy_memory("/tmp/unused", ["lstm", "transformer"], delay=5)
    tiny = dict(model="deq-transformer", delay=3, steps=4, batch_size=4, learning_rate=1e-3, budget=3000, seed=0,
                test_size=8)
    # raised before anything is built or compiled
    with pytest.raises(ValueError, match=r"config\['pretrain_steps'\]"):
        cm.train_copy_memory(dict(tiny, pretrain_steps=4))  # no step would be left for the DEQ
    with pytest.raises(ValueError, match=r"config\['pretrain_depth'\]"):
        cm.train_copy_memory(dict(tiny, pretrain_steps=1, pretrain_depth=0))
    with pytest.raises(ValueError, match=r"config\['reference_max_steps'\]"):
        cm.train_copy_memory(dict(tiny, reference_max_steps=10))  # without reference_tol
    with pytest.raises(ValueError, match="backward_max_steps"):
        cm.make_model("deq-transformer", parameters=3000, delay=3, backward_max_steps=0)
    with pytest.raises(ValueError, match="eval_tol"):
        cm.make_model("deq-transformer", parameters=3000, delay=3, eval_tol=-1.0)
    with pytest.raises(ValueError, match="weight_norm"):
        cm.make_model("deq-transformer", parameters=3000, delay=3, weight_norm="yes")


def test_copy_memory_deq_solver_settings():
    # 003's code: f_thres forward, b_thres for the adjoint solve; the reference solve is the evaluation mode's
    model = cm.make_model("deq-transformer", parameters=3000, delay=3, max_steps=30, tol=1e-2,
                          backward_max_steps=40, eval_max_steps=200, eval_tol=1e-6)
    deq = model.block.deq
    assert deq.solver.max_steps == 30 and deq.solver.tol == pytest.approx(1e-2)
    assert deq.backward.max_steps == 40
    assert deq.eval_solver.max_steps == 200 and deq.eval_solver.tol == pytest.approx(1e-6)
    plain = cm.make_model("deq-transformer", parameters=3000, delay=3, max_steps=30)
    assert plain.block.deq.backward.name == "implicit" and getattr(plain.block.deq.backward, "max_steps", None) is None


def test_copy_memory_deq_weight_norm():
    # 003's wnorm: the cell's attention and feed-forward layers are weight-normalised; each starts as the
    # layer it wraps, so at the same width and seed the model computes the same logits; the gains count
    from deqlab.nn.normalization import WeightNorm

    x, _ = data.copy_memory(jax.random.key(1), batch_size=2, delay=3)
    plain = cm._deq_transformer(8, 23, 0, 20, 1e-4)
    normed = cm._deq_transformer(8, 23, 0, 20, 1e-4, weight_norm=True)
    cell = normed.block.cell
    assert all(isinstance(getattr(cell, n), WeightNorm) for n in ("query", "key", "value", "out", "expand", "contract"))
    assert not isinstance(cell.inject, WeightNorm)  # 003's input injection lies outside its cell
    # float32: the normalised kernels are the originals to a few ulps; the solve to 1e-4 amplifies that
    # by about 1 / (1 - radius), a few tens at this near-critical initialisation (the floor's JAX rounds
    # differently: 1.03e-4 there, 3e-5 on the newest), and stops at tolerance 1e-4 itself
    np.testing.assert_allclose(np.asarray(normed(x)[0]), np.asarray(plain(x)[0]), atol=3e-4)
    gains = 4 * 8 + 2 * 8 + 8  # query, key, value, out and contract: 8 outputs each; expand: 2 x 8
    assert baselines.parameter_count(normed) == baselines.parameter_count(plain) + gains


@pytest.mark.slow  # two small trainings (and their compilation) on a 2-core CPU
def test_copy_memory_deq_pretraining_then_reference_solve(monkeypatch):
    # the first `pretrain_steps` steps run the weight-tied network unrolled `pretrain_depth` layers (their
    # windows have no solve), the rest the DEQ; the reference solve runs in evaluation mode with its own budget
    from deqlab.nn import lm

    depths = []
    call = lm.LanguageModel.__call__

    def recording(self, tokens, **kwargs):  # traced once per compiled step: the modes the training uses
        depths.append(kwargs.get("depth"))
        return call(self, tokens, **kwargs)

    monkeypatch.setattr(lm.LanguageModel, "__call__", recording)
    r = cm.train_copy_memory(dict(model="deq-transformer", delay=3, steps=6, batch_size=4, learning_rate=1e-3,
                                  budget=3000, seed=0, test_size=8, max_steps=5, tol=1e-2, backward_max_steps=7,
                                  pretrain_steps=2, pretrain_depth=3, log_every=2, reference_max_steps=40,
                                  reference_tol=1e-4))
    assert set(depths) == {3, None}
    assert r["solver_steps"][0] is None and r["converged_fraction"][0] is None and r["residual_max"][0] is None
    assert all(1 <= s <= 5 for s in r["solver_steps"][1:]) and all(0 <= c <= 1 for c in r["converged_fraction"][1:])
    assert len(r["train_loss"]) == 3 and np.all(np.isfinite(r["train_loss"]))
    # the reference solve: up to 40 steps at 1e-4; a sequence that converged has its residual below 1e-4
    assert 1 <= r["reference_solver_steps"] <= 40
    assert r["reference_converged_fraction"] < 1 or r["reference_residual_max"] < 1e-4
    assert np.isfinite(r["reference_test_loss"]) and 0 <= r["reference_recall_accuracy"] <= 1
    # the baselines ignore the DEQ's settings
    lstm = cm.train_copy_memory(dict(model="lstm", delay=3, steps=2, batch_size=4, learning_rate=1e-3, budget=1000,
                                     seed=0, test_size=8, pretrain_steps=1, reference_max_steps=10, reference_tol=1e-3))
    assert "solver_steps" not in lstm and "reference_test_loss" not in lstm


TINY = dict(corpus="austen", tokenizer="char", vocab_size=16, context=16, width=8, heads=2, steps=6, batch_size=4,
            learning_rate=3e-3, seed=0, max_steps=4, eval_batches=2, checkpoint_every=2)


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
    return lm.prepare_corpus("austen", tokenizer="char", context=16, cache_dir=tmp_path_factory.mktemp("tok"))


def test_prepare_corpus(tiny_corpus):
    assert tiny_corpus["train"].shape[1] == 17
    for split in data.TEXT_SPLITS:
        assert len(tiny_corpus[split]) == (tiny_corpus["tokens"][split] - 1) // 16
    assert tiny_corpus["train"].max() < tiny_corpus["tokenizer"].vocab_size


@pytest.mark.slow  # training (and its compilation) on a 2-core CPU
def test_language_model_resumes_exactly(tmp_path, tiny_corpus, compile_counter):
    config = {**TINY, "eval_every": 2}
    whole = lm.train_language_model(config, tmp_path / "a", corpus=tiny_corpus)
    assert whole["resumed_from"] == 0 and len(whole["loss"]) == 6 and np.all(np.isfinite(whole["loss"]))
    assert whole["validation_perplexity"] == pytest.approx(np.exp(whole["validation_loss"]))
    assert all(1 <= s <= 4 for s in whole["steps_mean"])
    # interrupted after 3 steps (a checkpoint at 3), then resumed: the same run
    assert lm.train_language_model(config, tmp_path / "b", corpus=tiny_corpus, stop_after=3) is None
    with compile_counter() as counted:
        resumed = lm.train_language_model(config, tmp_path / "b", corpus=tiny_corpus)
    # the same schedule, the same optimiser transformation: every program of the first run is reused
    # (a fresh optax chain per run made train_step's cache key new: traced and compiled again)
    assert counted.programs == 0, counted.programs
    assert resumed["resumed_from"] == 3
    np.testing.assert_allclose(resumed["loss"], whole["loss"], rtol=1e-5)
    assert resumed["validation_loss"] == pytest.approx(whole["validation_loss"], rel=1e-5)
    # the evaluations (before training, after steps 2, 4, 6) survive the interruption: those at steps
    # 0 and 2 were made before it and restored from the checkpoint
    assert whole["evaluations"]["step"] == [0, 2, 4, 6]
    for k in lm.EVALUATED:
        assert np.all(np.isfinite(whole["evaluations"][k])), k
        np.testing.assert_allclose(resumed["evaluations"][k], whole["evaluations"][k], rtol=1e-5)
    # the last evaluation is the final one (same model, same batches)
    assert whole["evaluations"]["loss"][-1] == pytest.approx(whole["validation_loss"], rel=1e-6)


def test_language_model_bad_config(tiny_corpus):
    with pytest.raises(ValueError, match="config"):
        lm.train_language_model({"corpus": "austen"})
    with pytest.raises(ValueError, match="batch_size"):
        lm.train_language_model({**TINY, "batch_size": 10**6}, corpus=tiny_corpus)
    with pytest.raises(ValueError, match="eval_every"):
        lm.train_language_model({**TINY, "eval_every": -1}, corpus=tiny_corpus)
    with pytest.raises(ValueError, match="embedding_std"):
        lm.train_language_model({**TINY, "embedding_std": 0.0}, corpus=tiny_corpus)
    with pytest.raises(ValueError, match="radius_max_steps"):  # the re-solve's budget and tolerance go together
        lm.train_language_model({**TINY, "radius_tol": 1e-5}, corpus=tiny_corpus)
    with pytest.raises(ValueError, match="radius_tol"):
        lm.train_language_model({**TINY, "radius_max_steps": 300, "radius_tol": 0.0}, corpus=tiny_corpus)


@pytest.mark.slow  # training (and its compilation) on a 2-core CPU
def test_language_model_sweep_rows(tmp_path, monkeypatch, tiny_corpus):
    # the sweep passes its checkpoint directory and stores the result next to the configuration
    monkeypatch.setattr(lm, "prepare_corpus", lambda *a, **k: tiny_corpus)
    config = {**TINY, "steps": 2}
    (row,) = lm.run_language_model(tmp_path, [config])
    assert row["vocabulary"] == tiny_corpus["tokenizer"].vocab_size and len(row["loss"]) == 2
    assert {k: row[k] for k in config} == config


def test_language_model_schedule_warmup_then_cosine():
    """001 App. D: lr 1e-3, linear warm-up over 2e3 steps, then cosine decay over 5e4 steps."""
    from deqlab.lab.experiments.sequence import language_model as lm
    f = lm.learning_rate_schedule(1e-3, 52_000, 2_000)
    assert float(f(0)) == 0.0
    np.testing.assert_allclose(float(f(1_000)), 5e-4, rtol=1e-6)
    np.testing.assert_allclose(float(f(2_000)), 1e-3, rtol=1e-6)
    np.testing.assert_allclose(float(f(27_000)), 5e-4, rtol=1e-4)  # half way through the decay
    assert float(f(52_000)) < 1e-9
    g = lm.learning_rate_schedule(3e-3, 100)  # no warm-up: the plain cosine decay
    np.testing.assert_allclose(float(g(0)), 3e-3, rtol=1e-6)
    assert float(g(100)) < 1e-9


def test_copy_memory_deq_embedding_std():
    # 10 symbols x width entries (a few hundred): the sample standard deviation's relative standard
    # error is about 1/sqrt(2 * entries) < 5%, so 25% is over five standard errors
    model = cm.make_model("deq-transformer", parameters=14_000, delay=10, embedding_std=1.0)
    table = model.embed.embedding[...]
    assert table.size >= 200
    assert float(np.std(table)) == pytest.approx(1.0, rel=0.25)
    default = cm.make_model("deq-transformer", parameters=14_000, delay=10)
    assert float(np.std(default.embed.embedding[...])) == pytest.approx(table.shape[1] ** -0.5, rel=0.25)


def test_copy_memory_jacobian_penalty_is_bai_et_als_term():
    # the penalised objective is the loss plus gamma ||J_f(z*)||_F^2 / (T d), the same Hutchinson estimate
    # (same probe key) as deqlab.stability.jacobian_penalty at the model's own equilibrium
    from flax import nnx

    from deqlab.stability import jacobian_penalty

    model = cm.make_model("deq-transformer", parameters=3000, delay=3, max_steps=20, tol=1e-4)
    x, y = data.copy_memory(jax.random.key(1), batch_size=4, delay=3)
    key, gamma = jax.random.key(2), 3.0

    @nnx.jit  # one program (run eagerly, the model's operations compile ~170 single-operation programs)
    def terms(model):
        objective, (loss, _) = cm._penalised_loss(model, x, y, key, gamma)
        plain, _ = cm._loss(model, x, y)
        _, _, z = model(x, return_state=True)
        graph, state = nnx.split(model.block.cell)
        penalty = jacobian_penalty(lambda z, s, e: nnx.merge(graph, s)(z, e), z, state, model.embed(x), key=key,
                                   batch_axis=0)
        return objective, loss, plain, z, penalty

    objective, loss, plain, z, penalty = terms(model)
    assert float(loss) == pytest.approx(float(plain), rel=1e-6)
    assert z.shape[-2] == 3 + 20  # the divisor is the size of z*: the whole sequence (T + 20) times the width
    expected = gamma * float(jnp.mean(penalty)) / (z.shape[-2] * z.shape[-1])
    assert expected > 1e-3 * float(plain)  # the term is not negligible, so the comparison tests it
    assert float(objective - loss) == pytest.approx(expected, rel=1e-4)
    # training with it runs and reports the loss without the penalty
    r = cm.train_copy_memory(dict(model="deq-transformer", delay=3, steps=2, batch_size=4, learning_rate=1e-3,
                                  budget=3000, seed=0, test_size=8, max_steps=4, log_every=1, jacobian_gamma=gamma))
    assert np.all(np.isfinite(r["train_loss"]))
    with pytest.raises(ValueError, match="jacobian_gamma"):
        cm.train_copy_memory(dict(model="lstm", delay=3, steps=2, batch_size=4, learning_rate=1e-3, budget=3000,
                                  seed=0, test_size=8, jacobian_gamma=1.0))
    with pytest.raises(ValueError, match="jacobian_gamma"):
        cm.train_copy_memory(dict(model="deq-transformer", delay=3, steps=2, batch_size=4, learning_rate=1e-3,
                                  budget=3000, seed=0, test_size=8, jacobian_gamma=-1.0))


def test_copy_memory_jacobian_penalty_stops_the_gradient_at_z_star():
    # Bai et al. penalise the map at its equilibrium, not the equilibrium itself: the penalty's gradient
    # with respect to the parameters is the gradient at a constant z*, and differs from the gradient that
    # also flows through z* (so the comparison can fail).
    from flax import nnx

    from deqlab.stability import jacobian_penalty

    model = cm.make_model("deq-transformer", parameters=3000, delay=3, max_steps=30, tol=1e-5)
    x, y = data.copy_memory(jax.random.key(1), batch_size=4, delay=3)
    key, gamma = jax.random.key(2), 3.0
    _, _, z_star = nnx.jit(lambda m: m(x, return_state=True))(model)

    def penalty_term(m):
        objective, (loss, _) = cm._penalised_loss(m, x, y, key, gamma)
        return objective - loss

    def penalty_at(m, z):
        graph, state = nnx.split(m.block.cell)
        p = jacobian_penalty(lambda z, s, e: nnx.merge(graph, s)(z, e), z, state, m.embed(x), key=key, batch_axis=0)
        return gamma * jnp.mean(p) / (z.shape[-2] * z.shape[-1])

    def penalty_through_z(m):
        return penalty_at(m, m(x, return_state=True)[2])

    @nnx.jit  # the three gradients in one program (run eagerly they compile ~280 single-operation programs)
    def gradients(m, z_star):
        return (nnx.grad(penalty_term)(m), nnx.grad(lambda m: penalty_at(m, z_star))(m),
                nnx.grad(penalty_through_z)(m))

    leaves = lambda g: jax.tree_util.tree_leaves(nnx.state(g, nnx.Param) if not isinstance(g, nnx.State) else g)  # noqa: E731
    got, fixed, through = map(leaves, gradients(model, z_star))
    scale = max(float(jnp.max(jnp.abs(a))) for a in fixed)
    for a, b in zip(got, fixed):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4 * scale)  # float32, z* to 1e-5
    # measured (jax 0.10.2): the gradient through z* differs from the one at a constant z* by 3.9 times
    # the gradient's scale at this initialisation, and the two stopped versions agree exactly; 1e-2
    # leaves a wide margin on both sides
    assert max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(through, fixed)) > 1e-2 * scale


@pytest.mark.parametrize("attention_residual", [True, False])
def test_diagonal_blocks_are_the_dense_jacobians(attention_residual):
    """`language_model.diagonal_blocks` (width JVPs per sequence, only each position's own key and value
    free) gives every diagonal block of the dense causal Jacobian (T * width JVPs), for 003's code's layer
    and its printed one, as does `initialisation.causal_diagonal_blocks` (any causal map; given the cell itself,
    by the diagonal path), and so the exact spectral radius: `initialisation.block_radius` of the blocks equals
    the dense Jacobian's."""
    from flax import nnx

    from deqlab import nn
    from deqlab.lab.experiments.sequence import initialisation, weight_tied

    cell = nn.TransformerCell(8, 8, heads=2, attention_residual=attention_residual, rngs=nnx.Rngs(3))
    z, x = jax.random.normal(jax.random.key(4), (2, 2, 5, 8))
    # the cell's output and both builders below in one compiled program (run eagerly they compile ~280
    # single-operation programs)
    direct, generic, from_cell = nnx.jit(lambda cell, z, x: (
        cell(z, x),
        initialisation.causal_diagonal_blocks(lambda z, x: cell(z, x), z, x),
        initialisation.causal_diagonal_blocks(cell, z, x)))(cell, z, x)
    f, blocks = lm.diagonal_blocks(cell, z, x)
    np.testing.assert_allclose(f, direct, atol=1e-6)
    dense = np.asarray(weight_tied.jacobian(cell, z, x)).reshape(2, 5, 8, 5, 8)
    for t in range(5):
        np.testing.assert_allclose(blocks[:, t], dense[:, t, :, t, :], atol=1e-5)
    dense_radius = np.abs(np.linalg.eigvals(dense.reshape(2, 40, 40).astype(np.float64))).max(axis=1)
    np.testing.assert_allclose(initialisation.block_radius(blocks), dense_radius, rtol=1e-4)
    # the generic builder for any causal map (T * width JVPs) gives the same blocks; given the cell itself
    # (chapter 5 pages 5 and 6) it takes the diagonal path (width JVPs), checked here against the dense blocks
    np.testing.assert_allclose(generic, blocks, atol=1e-5)
    for t in range(5):
        np.testing.assert_allclose(from_cell[:, t], dense[:, t, :, t, :], atol=1e-5)


def test_equilibrium_statistics_reports_each_sequences_convergence(compile_counter):
    """`language_model.equilibrium_statistics` returns, per sequence, whether its solve met the tolerance
    (chapter 5 page 4 quotes radii only there); its mean is the reported converged fraction, and a budget of
    one step converges for none, a generous one for every sequence of a small contracting model. A budget of
    the call's own (max_steps, tol) reuses the model's compiled program and gives, on a CPU (the matmul
    precision follows the model's own tolerance), exactly what a model built with those settings gives
    (chapter 5 page 4 solves one model at three budgets); one above the model's own limit is refused, named."""
    tokens = jnp.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
    model = lm.make_model(16, width=8, heads=2, seed=0, max_steps=200, tol=1e-4, embedding_std=1.0)
    generous = lm.equilibrium_statistics(model, tokens)
    with compile_counter() as counted:
        one_step = lm.equilibrium_statistics(model, tokens, max_steps=1)
    assert counted.programs == 0, counted
    for out, expected in ((one_step, False), (generous, True)):
        assert out["converged"].dtype == bool and out["converged"].shape == (3,)
        assert np.all(out["converged"] == expected), out
        assert out["converged_fraction"] == pytest.approx(float(np.mean(out["converged"])))
        # the relative residual at the returned iterate: within the tolerance where the solve converged
        assert out["residual"].shape == (3,) and np.all(out["residual"][out["converged"]] <= 1e-4 * (1 + 1e-3)), out
    # 15 steps: the looser per-call tolerance stops one sequence (at the model's own 1e-4 none converges)
    built = lm.equilibrium_statistics(lm.make_model(16, width=8, heads=2, seed=0, max_steps=15, tol=1e-2,
                                                    embedding_std=1.0), tokens)
    per_call = lm.equilibrium_statistics(model, tokens, max_steps=15, tol=1e-2)
    own_tol = lm.equilibrium_statistics(model, tokens, max_steps=15)
    assert per_call["converged"].any() and not own_tol["converged"].any(), (per_call, own_tol)
    for key in built:
        np.testing.assert_array_equal(per_call[key], built[key], err_msg=key)
    with pytest.raises(ValueError, match=r"max_steps.*\[1, 200\]"):
        lm.equilibrium_statistics(model, tokens, max_steps=201)


def test_evaluate_resolves_the_radius_sequences():
    """`language_model.evaluate` with `radius_max_steps` and `radius_tol` takes the radius at the radius
    sequences solved again from zero with that budget (chapter 5 page 4: its radii after step 0 are radii at
    equilibria to 1e-5): the same radii and convergence as a model built with those solver settings; without
    them, at the model's own (here one-step, unconverged) solve."""
    windows = (np.arange(3 * 9).reshape(3, 9) * 5) % 16
    model = lm.make_model(16, width=8, heads=2, seed=0, max_steps=1, tol=1e-4, embedding_std=1.0)
    tight = lm.make_model(16, width=8, heads=2, seed=0, max_steps=200, tol=1e-4, embedding_std=1.0)
    reference = lm.equilibrium_statistics(tight, windows[:, :-1])
    assert reference["converged"].all(), reference
    out = lm.evaluate(model, windows, 3, 1, radius_max_steps=200, radius_tol=1e-4)
    assert out["radius_converged"] == 1.0
    assert out["radius"] == pytest.approx(float(np.median(reference["radius"])), rel=1e-5)
    own = lm.evaluate(model, windows, 3, 1)
    assert own["radius_converged"] == 0.0 and np.isfinite(own["radius"])  # one step: the last iterate's radius
    # the model itself keeps its own solver settings
    assert model.block.deq.solver.max_steps == 1
    with pytest.raises(ValueError, match="radius_tol"):
        lm.evaluate(model, windows, 3, 1, radius_max_steps=200)
    with pytest.raises(ValueError, match="radius_max_steps"):
        lm.evaluate(model, windows, 3, 1, radius_tol=1e-4)
