"""Per-call solver budgets as traced values: compilations and time of a budget sweep, against
static settings.

Run: ``python -m benchmarks.budget [--size tiny|quick|full] [--repeats R]``.

A DEQ's ``max_steps`` and ``tol`` used to be static: part of the solver object, so of every
``jax.jit`` cache key, and a sweep over them (accuracy against the inference budget, an
evaluation-time budget different from training's) compiled once per value.
``layer(x, max_steps=k, tol=t)`` passes them as traced values (``deqlab.solvers.Budget``; banax's
``step_budget`` and torchdeq's ``eval_factor`` serve the same purpose). Measured, in one process:

* **(A) chapter 0 classifier** (``practice.DigitsClassifier``, width 64, the stable recipe of
  ``book/ch0_practice/05_training``, trained two epochs; test set of 360 digits): a sweep over
  ``max_steps`` in {1, 2, 4, 8, 16, 32, 64, 100} and over ``tol`` in {1e-1, 1e-2, 1e-3, 1e-4},
  (a) with the traced budget (one jitted function, the budget an argument) against (b) static
  settings (``solver.replace(max_steps=k)``: a new trace and compilation per value). Wall time of
  the whole sweep, compilations included, and the number of compilations; test accuracy and mean
  steps at each budget (equal in (a) and (b), checked).
* **(B) steady state**: one call at the same settings, (a) against (b), both compiled, in
  interleaved rounds, ratio per round (``nn.DEQ`` carries a budget in both: in (b) its own
  settings, constants at compile time); and ``deqlab.fixed_point`` on the same cell with a traced
  ``Budget`` against ``budget=None`` (no per-step comparison with a limit): the cost of the
  budget itself.
* **(C) chapter 5 language model** (``deqlab.nn.LanguageModel`` over a ``TransformerCell``,
  width 32, 4 heads, Broyden, cap 40, untrained; 8 sequences of 128 tokens): the same sweep over
  ``max_steps`` in {2, 4, 8, 16, 32, 40}, (a) against (b).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

if not __package__:  # run as `python benchmarks/budget.py`: the repository root is not on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common

REPEATS = {"tiny": 3, "quick": 21, "full": 41}
STEPS = {"tiny": (2, 8, 100), "quick": (1, 2, 4, 8, 16, 32, 64, 100), "full": (1, 2, 4, 8, 16, 32, 64, 100)}
TOLS = {"tiny": (1e-2, 1e-3), "quick": (1e-1, 1e-2, 1e-3, 1e-4), "full": (1e-1, 1e-2, 1e-3, 1e-4)}
LM_STEPS = {"tiny": (2, 8), "quick": (2, 4, 8, 16, 32, 40), "full": (2, 4, 8, 16, 32, 40)}
LM_WIDTH = {"tiny": 16, "quick": 32, "full": 64}


def _sweep(traced, static, values, solver_of, set_solver, model, *inputs):
    """Run the sweep (a) traced and (b) static; returns rows and the two wall times / counts."""
    out = {}
    for name in ("traced", "static"):
        start = time.perf_counter()
        results = []
        for v in values:
            if name == "traced":
                results.append(jax.block_until_ready(traced(model, *inputs, v)))
            else:
                set_solver(model, solver_of(v))
                results.append(jax.block_until_ready(static(model, *inputs)))
        out[name] = (time.perf_counter() - start, [tuple(float(r) for r in res) for res in results])
    return out


def chapter0(size: str, repeats: int) -> dict:
    from flax import nnx

    import deqlab
    from deqlab.lab.experiments import practice
    from deqlab.lab.experiments.practice import _digits

    base = deqlab.Broyden(divergence_factor=1e8, tol=1e-3, max_steps=100)
    print("-- training the chapter 0 classifier (2 epochs, the page's stable recipe)")
    model, _ = practice.train_digits(epochs=1 if size == "tiny" else 2, width=64, scale=0.5, solver=base,
                                     tol=1e-3, max_steps=100, batch_size=32, learning_rate=3e-3,
                                     cosine_decay=True, clip_norm=1.0, progress=False)
    model.deq.on_failure = "ignore"  # small budgets stop short of the tolerance on purpose
    _, _, x_test, y_test = _digits()
    counts = {"traced": 0, "static": 0}

    def evaluate(model, x, y, **budget):
        z, sol = model.deq(x, return_solution=True, **budget)
        return jnp.mean(jnp.argmax(model.readout(z), -1) == y), jnp.mean(sol.stats.steps)

    def set_solver(model, solver):
        model.deq.solver = solver

    results = {}
    for setting, values, solver_of in (
            ("max_steps", STEPS[size], lambda k: base.replace(max_steps=k)),
            ("tol", TOLS[size], lambda t: base.replace(tol=t))):
        @nnx.jit
        def traced(model, x, y, value, setting=setting):
            counts["traced"] += 1
            return evaluate(model, x, y, **{setting: value})

        @nnx.jit
        def static(model, x, y):
            counts["static"] += 1
            return evaluate(model, x, y)

        counts.update(traced=0, static=0)
        sweep = _sweep(traced, static, values, solver_of, set_solver, model, x_test, y_test)
        set_solver(model, base)
        (t_traced, r_traced), (t_static, r_static) = sweep["traced"], sweep["static"]
        assert r_traced == r_static, (r_traced, r_static)  # the same accuracy and steps at every value
        rows = [{setting: v, "test accuracy": acc, "steps mean": steps} for v, (acc, steps) in zip(values, r_traced)]
        print(f"-- (A) sweep over {setting}: traced budget against static settings (test set, 360 digits)")
        print(common.table(rows))
        print(f"   traced: {counts['traced']} compilation(s), sweep {t_traced:.2f} s; static: "
              f"{counts['static']} compilations, sweep {t_static:.2f} s; time ratio {t_traced / t_static:.3f}")
        results[setting] = {"rows": rows, "traced_s": t_traced, "static_s": t_static,
                            "traced_compilations": counts["traced"], "static_compilations": counts["static"]}

    @nnx.jit
    def traced_call(model, x, y, k):
        return evaluate(model, x, y, max_steps=k)

    @nnx.jit
    def static_call(model, x, y):
        return evaluate(model, x, y)

    times = common.interleaved_times({"traced": (traced_call, (model, x_test, y_test, 100)),
                                      "static": (static_call, (model, x_test, y_test))}, repeats)
    ratios = np.array(times["traced"]) / np.array(times["static"])
    q1, med, q3 = np.quantile(ratios, [0.25, 0.5, 0.75])
    print(f"-- (B) steady state at max_steps 100: traced {1e3 * statistics.median(times['traced']):.2f} ms, "
          f"static {1e3 * statistics.median(times['static']):.2f} ms; ratio per round median {med:.3f} "
          f"(quartiles {q1:.3f} - {q3:.3f}), {repeats} rounds")
    results["steady"] = (float(med), float(q1), float(q3))

    # nn.DEQ always carries a budget (its own settings when none is given); against the solve
    # without one (budget=None: the limit a compile-time constant, no per-step comparison):
    graphdef, state = nnx.split(model.deq.cell)

    def cell_map(z, state, x):
        return nnx.merge(graphdef, state)(z, x)

    def solve(state, x, budget):
        z0 = jnp.zeros((x.shape[0], model.deq.cell.width), x.dtype)
        return deqlab.fixed_point(cell_map, z0, state, x, solver=base, batch_axis=0, on_failure="ignore",
                                  budget=budget).value

    without = jax.jit(lambda state, x: solve(state, x, None))
    with_budget = jax.jit(lambda state, x, k: solve(state, x, deqlab.solvers.Budget(k, jnp.float32(1e-3))))
    times = common.interleaved_times({"budget": (with_budget, (state, x_test, jnp.int32(100))),
                                      "none": (without, (state, x_test))}, repeats)
    ratios = np.array(times["budget"]) / np.array(times["none"])
    q1, med, q3 = np.quantile(ratios, [0.25, 0.5, 0.75])
    print(f"   fixed_point with a traced Budget {1e3 * statistics.median(times['budget']):.2f} ms, without "
          f"(budget=None) {1e3 * statistics.median(times['none']):.2f} ms; ratio per round median {med:.3f} "
          f"(quartiles {q1:.3f} - {q3:.3f})")
    results["overhead"] = (float(med), float(q1), float(q3))
    return results


def chapter5(size: str) -> dict:
    from flax import nnx

    from deqlab.lab.experiments.sequence import language_model as lm

    model = lm.make_model(512, width=LM_WIDTH[size], heads=4 if size != "tiny" else 2, seed=0, max_steps=40,
                          tol=1e-3)
    model.block.deq.on_failure = "ignore"
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 512, (8, 128)), jnp.int32)
    counts = {"traced": 0, "static": 0}
    base = model.block.deq.solver

    @nnx.jit
    def traced(model, tokens, k):
        counts["traced"] += 1
        return model(tokens, max_steps=k)[1]["steps_mean"]

    @nnx.jit
    def static(model, tokens):
        counts["static"] += 1
        return model(tokens)[1]["steps_mean"]

    def set_solver(model, solver):
        model.block.deq.solver = solver

    values = LM_STEPS[size]
    sweep = _sweep(lambda m, t, k: (traced(m, t, k),), lambda m, t: (static(m, t),), values,
                   lambda k: base.replace(max_steps=k), set_solver, model, tokens)
    set_solver(model, base)
    (t_traced, r_traced), (t_static, r_static) = sweep["traced"], sweep["static"]
    assert r_traced == r_static, (r_traced, r_static)
    print(f"-- (C) chapter 5 language model (width {LM_WIDTH[size]}, 8 x 128 tokens): sweep over max_steps {values}")
    print(f"   traced: {counts['traced']} compilation(s), sweep {t_traced:.2f} s; static: {counts['static']} "
          f"compilations, sweep {t_static:.2f} s; time ratio {t_traced / t_static:.3f}")
    return {"traced_s": t_traced, "static_s": t_static, "traced_compilations": counts["traced"],
            "static_compilations": counts["static"]}


def measure(args) -> dict:
    common.header("per-call solver budgets (traced max_steps / tol)", args.size)
    repeats = args.repeats or REPEATS[args.size]
    ch0 = chapter0(args.size, repeats)
    ch5 = chapter5(args.size)
    steps = ch0["max_steps"]
    print(f"HEADLINE budget: ch0 max_steps sweep of {len(STEPS[args.size])} values: "
          f"{steps['traced_compilations']} vs {steps['static_compilations']} compilations, sweep time "
          f"{steps['traced_s'] / steps['static_s']:.2f}x; tol sweep {ch0['tol']['traced_s'] / ch0['tol']['static_s']:.2f}x; "
          f"steady-state call {ch0['steady'][0]:.2f}x (fixed_point with / without a budget "
          f"{ch0['overhead'][0]:.2f}x); ch5 LM sweep {ch5['traced_s'] / ch5['static_s']:.2f}x "
          f"({ch5['traced_compilations']} vs {ch5['static_compilations']} compilations)")
    return {"ch0": ch0, "ch5": ch5}


def main(argv=None) -> dict:
    args = common.parse_args(__doc__.splitlines()[0], argv)
    # compilation time is part of what is measured: no persistent cache (JAX_COMPILATION_CACHE_DIR)
    # may serve the static sweep's compilations from an earlier run
    previous = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        with common.jax_session():
            return measure(args)
    finally:
        jax.config.update("jax_enable_compilation_cache", previous)


if __name__ == "__main__":
    main(sys.argv[1:])
