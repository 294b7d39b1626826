"""Warm starts from a previous equilibrium: solver steps and time saved, against cold starts.

Run: ``python -m benchmarks.warm_start [--size tiny|quick|full] [--repeats R]``.

Three settings, each against a cold start (``z0 = 0``) run in the same process on the same data:

* **(A) chapter 0 training**: the digits classifier of ``book/ch0_practice/05_training``
  (``deqlab.lab.experiments.practice.DigitsClassifier``, width 64, the page's stable recipe:
  Broyden with ``divergence_factor=1e8``, ``tol`` 1e-3, 100 steps, Adam 3e-3, clipping at norm 1;
  offline digits data), two copies trained in lockstep from the same parameters on the same
  batches (``practice.warm_start_training``): the warm copy starts every sample at its
  equilibrium of the previous epoch (``deqlab.nn.FixedPointCache``, by sample index, inside the
  jitted step). Mean forward steps per sample and forward evaluations per epoch; the wall time of
  the training steps (forward + implicit backward), paired step by step (the two copies' steps
  alternate), from the second epoch on (the first has nothing cached).
* **(B) chapter 0 inference**: the test set (360 digits) evaluated after each epoch, the warm copy
  from its previous evaluation's equilibria (the parameters moved by an epoch); and repeated
  inference with unchanged parameters (the trained cold copy), warm from the previous output
  against cold, timed in interleaved rounds.
* **(C) chapter 5 language model at inference**: ``deqlab.nn.LanguageModel`` over a
  ``TransformerCell`` (width 32, 4 heads, Broyden, 12 steps as ``book/ch5_transformers/04``; in
  evaluation mode up to 40, ``eval_max_steps``), trained briefly on the offline Austen corpus (sentencepiece, 512 tokens, context 128), then run
  over consecutive batches of the validation stream (8 parallel streams): (i) cold; (ii) warm from
  the previous batch's equilibrium, positions aligned (consecutive windows, no overlap); (iii)
  sliding windows with stride T/2, warm from the previous window's equilibrium shifted by the
  stride (the new half cold), against (iv) the same sliding windows cold. Two tolerances, 1e-2
  (the chapter's) and 1e-3, from one compilation (the tolerance is a traced argument).

Times are medians; ratios are taken per pair (round or step) and summarised by their median and
quartiles. The load average is printed: timings on a loaded machine are noisy.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import jax.numpy as jnp
import numpy as np

if not __package__:  # run as `python benchmarks/warm_start.py`: the repository root is not on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common

EPOCHS = {"tiny": 2, "quick": 4, "full": 10}
REPEATS = {"tiny": 3, "quick": 21, "full": 41}
LM = {"tiny": dict(width=16, heads=2, train_steps=5, batches=3, streams=4),
      "quick": dict(width=32, heads=4, train_steps=80, batches=8, streams=8),
      "full": dict(width=64, heads=4, train_steps=400, batches=16, streams=8)}


def _ratio(a, b):
    ratios = np.asarray(a) / np.asarray(b)
    q1, med, q3 = np.quantile(ratios, [0.25, 0.5, 0.75])
    return float(med), float(q1), float(q3)


def chapter0(size: str, repeats: int) -> dict:
    import deqlab
    from deqlab.lab.experiments import practice

    recipe = dict(width=64, scale=0.5, tol=1e-3, max_steps=100, solver=deqlab.Broyden(divergence_factor=1e8))
    epochs = EPOCHS[size]
    print(f"-- (A) chapter 0 training, {epochs} epochs, batch 32, lockstep cold / warm (FixedPointCache)")
    start = time.perf_counter()
    run = practice.warm_start_training(epochs=epochs, timed=True, **recipe)
    elapsed = time.perf_counter() - start
    rows = []
    for e in range(epochs):
        rows.append({"epoch": e + 1,
                     "cold steps": run["train_steps"]["cold"][e], "warm steps": run["train_steps"]["warm"][e],
                     "cold NFE": run["train_nfe"]["cold"][e], "warm NFE": run["train_nfe"]["warm"][e],
                     "cold test acc": run["test_accuracy"]["cold"][e],
                     "warm test acc": run["test_accuracy"]["warm"][e],
                     "eval cold": run["eval_steps"]["cold"][e], "eval warm": run["eval_steps"]["warm"][e],
                     "eval repeat": run["eval_steps"]["repeat"][e]})
    print(common.table(rows))
    per_epoch = len(run["train_times"]["cold"]) // epochs
    cold_t = run["train_times"]["cold"][per_epoch:]
    warm_t = run["train_times"]["warm"][per_epoch:]
    nfe_ratio = sum(run["train_nfe"]["warm"][1:]) / max(1, sum(run["train_nfe"]["cold"][1:]))
    time_ratio = _ratio(warm_t, cold_t)
    print(f"   epochs 2-{epochs}: forward NFE warm / cold = {nfe_ratio:.3f}; training step time "
          f"{1e3 * statistics.median(warm_t):.2f} ms / {1e3 * statistics.median(cold_t):.2f} ms, ratio per "
          f"step median {time_ratio[0]:.3f} (quartiles {time_ratio[1]:.3f} - {time_ratio[2]:.3f}); "
          f"run {elapsed:.1f} s (both copies, compilation included)")

    print(f"-- (B) chapter 0 inference, repeated on the test set with unchanged parameters, {repeats} rounds")
    from flax import nnx

    from deqlab.lab.experiments.practice import _digits  # the page's split

    _, _, x_test, y_test = _digits()
    model = run["models"]["cold"]

    @nnx.jit
    def infer(model, x, z0):
        z, sol = model.deq(x, z0, return_solution=True)
        return model.readout(z), z, jnp.mean(sol.stats.steps), sol.stats.nfe

    zeros = jnp.zeros((len(x_test), 64), jnp.float32)
    _, z_prev, cold_steps, cold_nfe = infer(model, x_test, zeros)
    _, _, warm_steps, warm_nfe = infer(model, x_test, z_prev)
    times = common.interleaved_times({"cold": (infer, (model, x_test, zeros)),
                                      "warm": (infer, (model, x_test, z_prev))}, repeats)
    inference_ratio = _ratio(times["warm"], times["cold"])
    print(f"   (the trained cold copy) cold: {float(cold_steps):.2f} steps, NFE "
          f"{int(cold_nfe)}, {1e3 * statistics.median(times['cold']):.2f} ms; warm from the previous "
          f"output: {float(warm_steps):.2f} steps, NFE {int(warm_nfe)}, "
          f"{1e3 * statistics.median(times['warm']):.2f} ms; time ratio {inference_ratio[0]:.3f} "
          f"(quartiles {inference_ratio[1]:.3f} - {inference_ratio[2]:.3f})")
    later = slice(1, None)
    eval_ratio = (sum(run["eval_steps"]["warm"][later]) / max(1e-9, sum(run["eval_steps"]["cold"][later])))
    return {"run": run, "nfe_ratio": nfe_ratio, "time_ratio": time_ratio, "eval_steps_ratio": eval_ratio,
            "inference": {"cold_steps": float(cold_steps), "warm_steps": float(warm_steps),
                          "cold_nfe": int(cold_nfe), "warm_nfe": int(warm_nfe), "time_ratio": inference_ratio}}


def chapter5(size: str, repeats: int) -> dict:
    import optax
    from flax import nnx

    from deqlab import nn
    from deqlab.lab.experiments.sequence import language_model as lm

    shape = LM[size]
    corpus = lm.prepare_corpus("austen", tokenizer="sentencepiece", vocab_size=512)
    context = corpus["train"].shape[1] - 1
    model = lm.make_model(512, width=shape["width"], heads=shape["heads"], seed=0, max_steps=12, tol=1e-2)
    model.block.deq.on_failure = "ignore"  # failures are counted (converged fraction), not warned
    # trained with the chapter's 12 steps; evaluated (model.eval()) with up to 40, so that the
    # steps a solve needs to reach the tolerance show, rather than the limit
    model.block.deq.eval_max_steps = 40
    optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(shape["train_steps"]):
        batch = corpus["train"][rng.choice(len(corpus["train"]), 8, replace=False)]
        nn.train_step(model, optimizer, batch[:, :-1], batch[:, 1:])
    print(f"-- (C) chapter 5 language model: width {shape['width']}, {shape['heads']} heads, context {context}, "
          f"trained {shape['train_steps']} steps ({time.perf_counter() - start:.1f} s); inference over "
          f"{shape['batches']} consecutive batches of {shape['streams']} streams")
    model.eval()
    stream = corpus["validation"][:, :-1].ravel()
    streams = shape["streams"]
    per_stream = len(stream) // streams
    segments = stream[:streams * per_stream].reshape(streams, per_stream)
    width = model.block.cell.width

    traces = []

    @nnx.jit
    def infer(model, tokens, z0, tol):
        traces.append(1)  # once per compilation
        _, stats, z = model(tokens, z0=z0, tol=tol, return_state=True)
        return z, stats["steps_mean"], stats["converged_fraction"]

    def windows(stride):
        return [segments[:, i * stride:i * stride + context] for i in range(shape["batches"])]

    def run(batches, warm, stride):
        zeros = jnp.zeros((streams, context, width), jnp.float32)
        z, steps, conv, z_starts = zeros, [], [], []
        for tokens in batches:
            if not warm:
                z0 = zeros
            elif stride == context:
                z0 = z
            else:  # the previous window's equilibrium, shifted by the stride; the new positions cold
                z0 = jnp.concatenate([z[:, stride:], zeros[:, :stride]], axis=1)
            z_starts.append(z0)
            z, s, c = infer(model, jnp.asarray(tokens), z0, tol)
            steps.append(float(s))
            conv.append(float(c))
        return steps, conv, z_starts

    rows, result = [], {}
    half = context // 2
    for tol in (1e-2, 1e-3):
        configs = {"(i) consecutive, cold": (windows(context), False, context),
                   "(ii) consecutive, warm": (windows(context), True, context),
                   "(iv) sliding T/2, cold": (windows(half), False, half),
                   "(iii) sliding T/2, warm": (windows(half), True, half)}
        measured = {name: run(*config) for name, config in configs.items()}
        for name, (steps, conv, _) in measured.items():
            # batch 1 of a warm run starts cold (nothing before it): batches 2.. compare
            rows.append({"tol": tol, "config": name, "steps mean (batches 2..)": float(np.mean(steps[1:])),
                         "converged": float(np.mean(conv[1:]))})
        batches, _, stride = configs["(iii) sliding T/2, warm"]
        z_starts = measured["(iii) sliding T/2, warm"][2]
        calls = {"cold": (infer, (model, jnp.asarray(batches[-1]), jnp.zeros_like(z_starts[-1]), tol)),
                 "warm": (infer, (model, jnp.asarray(batches[-1]), z_starts[-1], tol))}
        times = common.interleaved_times(calls, repeats)
        result[tol] = {name: float(np.mean(m[0][1:])) for name, m in measured.items()}
        result[tol]["time_ratio"] = _ratio(times["warm"], times["cold"])
        result[tol]["ms"] = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    print(common.table(rows))
    for tol, r in result.items():
        med, q1, q3 = r["time_ratio"]
        print(f"   tol {tol:g}: sliding-window batch, warm / cold time per call {r['ms']['warm']:.2f} ms / "
              f"{r['ms']['cold']:.2f} ms, ratio median {med:.3f} (quartiles {q1:.3f} - {q3:.3f})")
    print(f"   compilations of the inference call (both tolerances, cold and warm): {len(traces)}")
    return result


def measure(args) -> dict:
    common.header("warm starts from a previous equilibrium", args.size)
    repeats = args.repeats or REPEATS[args.size]
    ch0 = chapter0(args.size, repeats)
    ch5 = chapter5(args.size, repeats)
    s = ch5[1e-2]
    t = ch5[1e-3]
    print(f"HEADLINE warm_start: ch0 training forward NFE warm/cold {ch0['nfe_ratio']:.2f} (step time "
          f"{ch0['time_ratio'][0]:.2f}x), test-set evaluation after an epoch {ch0['eval_steps_ratio']:.2f}x "
          f"steps, repeated inference {ch0['inference']['warm_steps']:.1f} vs {ch0['inference']['cold_steps']:.1f} "
          f"steps ({ch0['inference']['time_ratio'][0]:.2f}x time); ch5 LM sliding windows warm/cold steps "
          f"{s['(iii) sliding T/2, warm'] / s['(iv) sliding T/2, cold']:.2f} at tol 1e-2, "
          f"{t['(iii) sliding T/2, warm'] / t['(iv) sliding T/2, cold']:.2f} at tol 1e-3; consecutive "
          f"windows {s['(ii) consecutive, warm'] / s['(i) consecutive, cold']:.2f} / "
          f"{t['(ii) consecutive, warm'] / t['(i) consecutive, cold']:.2f}")
    return {"ch0": ch0, "ch5": ch5}


def main(argv=None) -> dict:
    args = common.parse_args(__doc__.splitlines()[0], argv)
    with common.jax_session():
        return measure(args)


if __name__ == "__main__":
    main(sys.argv[1:])
