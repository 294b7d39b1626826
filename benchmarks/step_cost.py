"""The cost of one solver step against one plain step z <- f(z), in the same process.

Run: ``python -m benchmarks.step_cost [--size tiny|quick] [--repeats R] [--steps S]``.

Problem: the tanh DEQ of ``benchmarks/stopping.py`` (W Haar orthogonal at scale 1.3, float32;
quick: N = 384, batch 96; tiny: N = 32, batch 8). Each configuration runs exactly ``--steps``
steps (a tolerance no solve reaches, ``on_failure="ignore"``), compiled once and timed in
interleaved rounds (median); the time per step is reported relative to plain iteration
(``lax.fori_loop`` over f, no checks), which is what a step of f itself costs. Rows: Picard
(the loop's judging: norms, selections, statistics), Anderson with m = 5 (the default) and
m = 10, Broyden, each judged at every step, and Anderson judged every 8th step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import warnings

import jax

if not __package__:  # run as `python benchmarks/step_cost.py`: the repository root is not on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common

SIZES = {"tiny": dict(width=32, batch=8, repeats=2, steps=20),
         "quick": dict(width=384, batch=96, repeats=15, steps=200)}
PLAIN = "plain iteration"


def configs(steps):
    from deqlab import solvers

    unreachable = dict(tol=1e-30, max_steps=steps)
    return {
        "deqlab picard": solvers.Picard(**unreachable),
        "deqlab anderson (m=5)": solvers.Anderson(**unreachable),
        "deqlab anderson (m=10)": solvers.Anderson(m=10, **unreachable),
        "deqlab anderson (m=5) [check 8]": solvers.Anderson(check_every=8, **unreachable),
        "deqlab broyden": solvers.Broyden(**unreachable),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="quick")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    repeats = args.repeats or size["repeats"]
    steps = args.steps or size["steps"]
    import deqlab

    case = common.tanh_case("tanh 1.3", width=size["width"], batch=size["batch"], ensemble="orthogonal",
                            scale=1.3, reference=False)
    common.header(f"cost per step, {steps} steps", args.size)
    print(f"   {case.note}, float32")

    def plain(a):
        return jax.lax.fori_loop(0, steps, lambda _, z: case.f(z, *a), case.z0)

    timed, counted = {PLAIN: (jax.jit(plain).lower(case.args).compile(), (case.args,))}, {PLAIN: steps}
    for label, solver in configs(steps).items():
        def run(a, solver=solver):
            sol = deqlab.solve(case.f, case.z0, *a, solver=solver, batch_axis=0, on_failure="ignore")
            return sol.value, sol.stats.nfe

        with warnings.catch_warnings():  # the unreachable tolerance is the point
            warnings.simplefilter("ignore", deqlab.precision.PrecisionWarning)
            compiled = jax.jit(run).lower(case.args).compile()
        counted[label] = int(compiled(case.args)[1]) - 1  # evaluations after f(z0): one per step
        timed[label] = (compiled, (case.args,))
    samples = common.interleaved_times(timed, repeats)
    plain_ms = 1e3 * statistics.median(samples[PLAIN]) / steps
    rows = []
    for label in timed:
        ms = 1e3 * statistics.median(samples[label]) / counted[label]
        rows.append(dict(config=label, steps=counted[label], ms_per_step=ms, x_plain=ms / plain_ms))
    print(f"{'config':34s} {'steps':>6s} {'ms/step':>9s} {'x plain':>8s}")
    for row in rows:
        print(f"{row['config']:34s} {row['steps']:6d} {row['ms_per_step']:9.4f} {row['x_plain']:8.2f}")
    return dict(rows=rows, steps=steps)


if __name__ == "__main__":
    with common.jax_session():
        main()
