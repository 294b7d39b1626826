"""Weight-tied dropout in a DEQ-Transformer cell: does the solve still converge, and what does it cost?

Run: ``python -m benchmarks.dropout [--size tiny|quick|full] [--rate P] [--repeats R]``.

Problem: the chapter 5 cell ``deqlab.nn.TransformerCell`` (003's printed layer, ``attention_residual=False``: it contracts fast, so the masks alone decide) at initialisation (width 32, 4 heads,
hidden 128, sequence length 16, batch 16 at ``quick``; 64 / 32 / 32 at ``full``), input
x ~ N(0, 1), float32, dropout rate p (default 0.1) at the cell's three places (attention output,
feed-forward hidden layer and output; ``deqlab.nn.dropout``). Three ways to run the equilibrium:

* **(a) weight-tied**: masks drawn once per forward call and passed into the map (what
  ``deqlab.nn.DEQ`` does with ``dropout=p``); the map is fixed, so the solver sees one function;
* **(b) per-iteration**: ordinary dropout, a new mask at every evaluation of the map. In the
  solver run, each evaluation takes its mask from a key folded with the bits of ``sum(z)``, so
  every new iterate gets an independent mask, as a framework's ordinary dropout layer would give
  (the map is then no longer a function the solver can converge on);
* **(c) none**: the same cell without dropout.

Measured: (1) plain iteration, K steps, per-sample relative residual ``||f(z) - z|| / ||f(z)||``
against the map that step used (``deqlab.nn.dropout.iterate_with_dropout``), at steps 10, 30 and
K, and the first step at which every sample is below ``tol``; (2) the layer's solver (Broyden,
``tol`` 1e-4, 100 steps, as ``deqlab.nn.LanguageModel``'s defaults but a looser tol): steps,
fraction of sequences converged, worst final residual, averaged over 8 forward calls (8 mask
draws); (3) the wall time of a jitted training step (forward solve plus implicit backward of a
mean-square loss) with (a) against (c), medians over interleaved rounds, and the median and
quartiles of their ratio taken round by round (paired: a load burst slows both calls of a round).
The training step includes drawing the masks (three Bernoulli draws per step) and any change in
the solver's step count that the masks cause (reported beside it).

The peer that has this feature is torchdeq (PyTorch: ``torchdeq.dropout.VariationalDropout``,
"applied consistently across all solver steps"); it cannot run in this JAX process, so there
is no side-by-side row; jaxopt and optimistix have no dropout.
"""

from __future__ import annotations

import os
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

if not __package__:  # run as `python benchmarks/dropout.py`: the repository root is not on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common

SIZES = {"tiny": dict(width=16, length=8, batch=4, heads=2),
         "quick": dict(width=32, length=16, batch=16, heads=4),
         "full": dict(width=64, length=32, batch=32, heads=4)}
REPEATS = {"tiny": 3, "quick": 41, "full": 41}
ITERATIONS = {"tiny": 40, "quick": 100, "full": 100}
IN_FEATURES = 16
TOL = 1e-4
MAX_STEPS = 100
DRAWS = 8


def _extra(parser):
    parser.add_argument("--rate", type=float, default=0.1, help="dropout rate p (default 0.1)")


def _cells(size: str, rate: float):
    from flax import nnx

    from deqlab import nn

    shape = SIZES[size]
    # 003's printed layer (no attention residual): a map that contracts fast, so that the comparison
    # is about the masks alone; the default layer (003's code) sits near a spectral radius of 1
    common_args = dict(heads=shape["heads"], attention_residual=False, rngs=nnx.Rngs(0))
    tied = nn.TransformerCell(shape["width"], IN_FEATURES, dropout=rate, **common_args)
    plain = nn.TransformerCell(shape["width"], IN_FEATURES, **common_args)
    x = jax.random.normal(jax.random.key(1), (shape["batch"], shape["length"], IN_FEATURES), jnp.float32)
    return tied, plain, x


def _first_below(residuals, tol):
    """First step (1-based) at which every sample's residual is below tol, or None."""
    worst = np.asarray(residuals).max(axis=1)
    hits = np.nonzero(worst < tol)[0]
    return int(hits[0]) + 1 if hits.size else None


def plain_iteration(tied, plain, x, steps: int) -> list[dict]:
    from flax import nnx

    from deqlab.nn.dropout import iterate_with_dropout

    rows = []
    for name, cell, redraw in (("(a) weight-tied", tied, False), ("(b) per-iteration", tied, True),
                               ("(c) none", plain, None)):
        if redraw is None:
            graphdef, state = nnx.split(cell)

            def step(z, _):
                fz = nnx.merge(graphdef, state)(z, x)
                diff = jnp.linalg.norm((fz - z).reshape(z.shape[0], -1), axis=-1)
                return fz, diff / jnp.linalg.norm(fz.reshape(z.shape[0], -1), axis=-1)

            _, residuals = jax.lax.scan(step, jnp.zeros(x.shape[:-1] + (cell.width,)), None, length=steps)
        else:
            _, residuals = iterate_with_dropout(cell, x, steps, redraw=redraw)
        residuals = np.asarray(residuals)
        rows.append({"config": name, "res@10 (max)": float(residuals[9].max()),
                     "res@30 (max)": float(residuals[29].max()),
                     f"res@{steps} (max)": float(residuals[-1].max()),
                     f"res@{steps} (min)": float(residuals[-1].min()),
                     f"steps to {TOL:g}": _first_below(residuals, TOL) or f"> {steps}"})
    return rows


def solver_runs(tied, plain, x) -> list[dict]:
    from flax import nnx

    import deqlab

    solver = deqlab.Broyden(tol=TOL, max_steps=MAX_STEPS)
    z_shape = x.shape[:-1] + (tied.width,)
    z0 = jnp.zeros(z_shape, jnp.float32)
    graphdef, state = nnx.split(tied)

    def tied_map(z, state, x, masks):
        return nnx.merge(graphdef, state)(z, x, masks)

    base = jax.random.key(11)

    def fresh_map(z, state, x, key):
        # ordinary dropout: every evaluation at a new z draws an independent mask
        bits = jax.lax.bitcast_convert_type(jnp.sum(z).astype(jnp.float32), jnp.uint32)
        cell = nnx.merge(graphdef, state)
        keys = jax.random.split(jax.random.fold_in(key, bits), 3)
        keep = 1.0 - cell.dropout.rate
        masks = {}
        for k, (name, width) in zip(keys, (("attention", cell.width), ("hidden", cell.hidden),
                                           ("feed_forward", cell.width))):
            kept = jax.random.bernoulli(k, keep, z.shape[:-2] + (1, width))
            masks[name] = jnp.where(kept, 1.0 / keep, 0.0).astype(z.dtype)
        return cell(z, x, masks)

    plain_graphdef, plain_state = nnx.split(plain)

    def plain_map(z, state, x):
        return nnx.merge(plain_graphdef, state)(z, x)

    runs = {"(a) weight-tied": [], "(b) per-iteration": [], "(c) none": []}
    tied_solve = jax.jit(lambda s, x, m: deqlab.solve(tied_map, z0, s, x, m, solver=solver, batch_axis=0,
                                                      on_failure="ignore"))
    fresh_solve = jax.jit(lambda s, x, k: deqlab.solve(fresh_map, z0, s, x, k, solver=solver, batch_axis=0,
                                                       on_failure="ignore"))
    plain_solve = jax.jit(lambda s, x: deqlab.solve(plain_map, z0, s, x, solver=solver, batch_axis=0,
                                                    on_failure="ignore"))
    for draw in range(DRAWS):
        masks = tied.dropout_masks(z_shape, jnp.float32)
        runs["(a) weight-tied"].append(tied_solve(state, x, masks))
        runs["(b) per-iteration"].append(fresh_solve(state, x, jax.random.fold_in(base, draw)))
    runs["(c) none"].append(plain_solve(plain_state, x))
    rows = []
    for name, sols in runs.items():
        steps = np.concatenate([np.asarray(s.stats.steps) for s in sols])
        converged = np.concatenate([np.asarray(s.result == deqlab.Result.SUCCESS) for s in sols])
        residual = max(float(np.max(s.stats.best_residual)) for s in sols)
        rows.append({"config": name, "solves": len(sols), "steps mean": float(steps.mean()),
                     "steps max": int(steps.max()), "converged": float(converged.mean()),
                     "residual max": residual})
    return rows


def training_overhead(tied, plain, x, repeats: int) -> dict:
    from flax import nnx

    from deqlab import nn

    steps = {}
    calls = {}
    for name, cell in (("(a) weight-tied", tied), ("(c) none", plain)):
        layer = nn.DEQ(cell, solver="broyden", tol=TOL, max_steps=MAX_STEPS)
        graphdef, state = nnx.split(layer)

        def train_step(state, x, graphdef=graphdef):
            model = nnx.merge(graphdef, state)
            target = jnp.zeros(x.shape[:-1] + (model.cell.width,), x.dtype)

            def loss(m):
                z, sol = m(x, return_solution=True)
                return jnp.mean((z - target) ** 2), sol.stats.steps

            (value, used), grads = nnx.value_and_grad(loss, has_aux=True)(model)
            return value, used, grads, nnx.state(model, nnx.RngState)

        jitted = jax.jit(train_step)
        # untimed: solver steps over several training steps (new masks each), state carried on
        used = []
        current = state
        for _ in range(DRAWS):
            _, s, _, streams = jitted(current, x)
            nnx.update(layer, streams)  # the next step draws new masks
            current = nnx.state(layer)
            used.append(np.asarray(s))
        steps[name] = float(np.mean(used))
        calls[name] = (jitted, (state, x))
    times = common.interleaved_times(calls, repeats)
    medians = {name: statistics.median(t) for name, t in times.items()}
    # paired by round: a load burst from other processes slows both calls of a round alike
    ratios = np.array(times["(a) weight-tied"]) / np.array(times["(c) none"])
    quartiles = np.quantile(ratios, [0.25, 0.75])
    return {"ms": {k: 1e3 * v for k, v in medians.items()}, "steps": steps,
            "ratio": float(np.median(ratios)), "ratio_quartiles": tuple(float(q) for q in quartiles)}


def measure(args) -> dict:
    rate = args.rate
    if not 0.0 < rate < 1.0:
        raise SystemExit(f"--rate must be in (0, 1), got {rate}")
    common.header("weight-tied dropout in the DEQ transformer cell", args.size)
    shape = SIZES[args.size]
    repeats = args.repeats or REPEATS[args.size]
    tied, plain, x = _cells(args.size, rate)
    print(f"   cell: TransformerCell width {shape['width']}, {shape['heads']} heads, hidden {tied.hidden}, "
          f"length {shape['length']}, batch {shape['batch']}, in_features {IN_FEATURES}, float32, "
          f"dropout p = {rate}")
    steps = ITERATIONS[args.size]
    print(f"-- plain iteration, {steps} steps, per-sample relative residual against the step's own map")
    iteration = plain_iteration(tied, plain, x, steps)
    print(common.table(iteration))
    print(f"-- solver: Broyden, tol {TOL:g}, max_steps {MAX_STEPS}; {DRAWS} mask draws (c: one solve)")
    solves = solver_runs(tied, plain, x)
    print(common.table(solves))
    print(f"-- jitted training step (solve + implicit backward of a mean-square loss), {repeats} "
          "interleaved rounds; ratio (a)/(c) per round, median and quartiles")
    overhead = training_overhead(tied, plain, x, repeats)
    for name in overhead["ms"]:
        print(f"   {name:<18} {overhead['ms'][name]:8.2f} ms   solver steps (mean over {DRAWS} steps) "
              f"{overhead['steps'][name]:.1f}")
    low, high = overhead["ratio_quartiles"]
    print(f"   (a)/(c) per round: median {overhead['ratio']:.2f}, quartiles {low:.2f} - {high:.2f}")
    by_name = {row["config"]: row for row in solves}
    print(f"HEADLINE dropout: p = {rate}: weight-tied solves converge "
          f"{by_name['(a) weight-tied']['converged']:.0%} in {by_name['(a) weight-tied']['steps mean']:.1f} "
          f"steps (none: {by_name['(c) none']['converged']:.0%}, {by_name['(c) none']['steps mean']:.1f}); "
          f"per-iteration dropout {by_name['(b) per-iteration']['converged']:.0%} (residual "
          f"{by_name['(b) per-iteration']['residual max']:.2g}); training step (a)/(c) = "
          f"{overhead['ratio']:.2f}x (quartiles {overhead['ratio_quartiles'][0]:.2f} - "
          f"{overhead['ratio_quartiles'][1]:.2f})")
    return {"iteration": iteration, "solves": solves, "overhead": overhead}


def main(argv=None) -> dict:
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=_extra)
    with common.jax_session():
        return measure(args)


if __name__ == "__main__":
    main(sys.argv[1:])
