"""Where acceleration pays: the default solver against Picard and Anderson on maps of known
contraction rate, in one process (issue 43, "[25/25] A default that chooses itself", item 1).

Run: ``python -m benchmarks.known_rates [--size tiny|quick] [--repeats R]``.

Problems (float32, tolerance 1e-5, at most 2,000 steps): the linear DEQ z = W z + x with W from
the GOE at spectral radius q (``common.linear_case``; q = 0.5 ... 0.98, the map's contraction rate
is q exactly), and the tanh DEQ of ``benchmarks/stopping.py`` (W Haar orthogonal at scale 1.3,
the cheap map on which Anderson barely pays). quick: N = 384, batch 96; tiny: N = 32, batch 8.
Each solve is compiled once and timed in interleaved rounds (median).

Every solver stops on the same rule, ``stop="error"`` (the default solver's): equal delivered
accuracy, so that times compare. For each problem: the steps of the slowest sample and the time
of Picard, Anderson (m = 5) and the default (:class:`deqlab.solvers.Adaptive`: plain warm-up,
Anderson trial, the cheaper per decade), each over the faster of Picard and Anderson (issue 43
asks the default to be within 1.15x of the best of deqlab's solvers on every problem).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import jax

if not __package__:  # run as `python benchmarks/known_rates.py`: the repository root is not on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common

SIZES = {"tiny": dict(width=32, batch=8, repeats=2), "quick": dict(width=384, batch=96, repeats=9)}
RATES = (0.5, 0.8, 0.9, 0.95, 0.98)
TOL, MAX_STEPS = 1e-5, 2000


def cases(width, batch):
    out = [common.linear_case(f"linear q={q}", width=width, batch=batch, scale=q / 2) for q in RATES]
    out.append(common.tanh_case("tanh orthogonal 1.3", width=width, batch=batch, ensemble="orthogonal", scale=1.3,
                                reference=False))
    return out


def solvers():
    from deqlab import solvers as s

    same = dict(tol=TOL, max_steps=MAX_STEPS, stop="error")
    return {"picard": s.Picard(**same), "anderson": s.Anderson(**same), "default": s.get_solver("adaptive", **same)}


def main(argv=None) -> dict:
    import deqlab

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="quick")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    repeats = args.repeats or size["repeats"]
    common.header("known rates: where acceleration pays", args.size)
    worst = {name: 0.0 for name in solvers()}
    results = {}
    for case in cases(size["width"], size["batch"]):
        print(f"\n{case.name}: {case.note}")
        timed, steps = {}, {}
        for name, solver in solvers().items():
            def run(a, solver=solver):
                sol = deqlab.solve(case.f, case.z0, *a, solver=solver, batch_axis=0, on_failure="ignore")
                return sol.value, sol.stats.steps, sol.converged
            compiled = jax.jit(run).lower(case.args).compile()
            _, taken, converged = compiled(case.args)
            if not bool(converged.all()):
                print(f"  {name}: {int((~converged).sum())} samples did not converge")
            steps[name] = int(taken.max())
            timed[name] = (compiled, (case.args,))
        samples = common.interleaved_times(timed, repeats)
        ms = {name: 1e3 * statistics.median(t) for name, t in samples.items()}
        best = min(ms["picard"], ms["anderson"])
        print(f"  {'solver':16s} {'steps':>6s} {'ms':>9s} {'x best':>7s}")
        for name in timed:
            print(f"  {name:16s} {steps[name]:6d} {ms[name]:9.3f} {ms[name] / best:7.2f}")
            if name in worst:
                worst[name] = max(worst[name], ms[name] / best)
        results[case.name] = dict(steps=steps, ms=ms)
    print("\nworst ratio to the faster of the two: " + ", ".join(f"{name} {ratio:.2f}x" for name, ratio in worst.items()))
    print(f"HEADLINE known_rates: the default is within {worst['default']:.2f}x of the faster of Picard and Anderson "
          f"on every problem (Picard within {worst['picard']:.2f}x, Anderson within {worst['anderson']:.2f}x)")
    return dict(results=results, worst=worst)


if __name__ == "__main__":
    with common.jax_session():
        main()
