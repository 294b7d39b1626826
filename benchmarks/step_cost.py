"""The cost of one solver step against one plain step z <- f(z), in the same process.

Run: ``python -m benchmarks.step_cost [--size tiny|quick] [--repeats R] [--steps S] [--problem tanh|set]``.

``--problem set`` runs Picard, Anderson (m = 5) and Broyden on the three problems of
``benchmarks/default_solver.py`` instead, with each step's cost also over the loop's plain
(Picard) step: the measurement behind :class:`deqlab.solvers.Adaptive`'s ``cost_ratio``.

Problem: the tanh DEQ of ``benchmarks/stopping.py`` (W Haar orthogonal at scale 1.3, float32;
quick: N = 384, batch 96; tiny: N = 32, batch 8). Each configuration runs exactly ``--steps``
steps (a tolerance no solve reaches, ``on_failure="ignore"``), compiled once and timed in
interleaved rounds (median); the time per step is reported relative to plain iteration
(``lax.fori_loop`` over f, no checks), which is what a step of f itself costs. Rows: Picard
(the loop's judging: norms, selections, statistics), Anderson with m = 5 (its default) and
m = 10, Broyden, each judged at every step, Anderson judged every 8th step, and the default
solver (:class:`deqlab.solvers.Adaptive`, ``stop="error"``) in its plain phase.
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
        # the default's plain phase (a warm-up longer than the run): the loop with stop="error",
        # its secant quotients read from the residuals (Solver.plain_step)
        "deqlab default, plain phase": solvers.Adaptive(warm_up=10 * steps, **unreachable),
    }


def set_configs(steps):
    """The three solvers that the default chooses among, for ``--problem set``."""
    from deqlab import solvers

    unreachable = dict(tol=1e-30, max_steps=steps, divergence_factor=1e30)
    return {"deqlab picard": solvers.Picard(**unreachable), "deqlab anderson (m=5)": solvers.Anderson(**unreachable),
            "deqlab broyden": solvers.Broyden(**unreachable)}


def measure(case, solver_configs: dict, steps: int, repeats: int) -> list[dict]:
    """Each configuration's time per step against plain iteration on ``case``, interleaved."""
    import deqlab

    def plain(a):
        return jax.lax.fori_loop(0, steps, lambda _, z: case.f(z, *a), case.z0)

    timed, counted = {PLAIN: (jax.jit(plain).lower(case.args).compile(), (case.args,))}, {PLAIN: steps}
    for label, solver in solver_configs.items():
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
    picard = next((row["ms_per_step"] for row in rows if row["config"] == "deqlab picard"), None)
    print(f"{'config':34s} {'steps':>6s} {'ms/step':>9s} {'x plain':>8s} {'x picard':>9s}")
    for row in rows:
        row["x_picard"] = row["ms_per_step"] / picard if picard else float("nan")
        print(f"{row['config']:34s} {row['steps']:6d} {row['ms_per_step']:9.4f} {row['x_plain']:8.2f} "
              f"{row['x_picard']:9.2f}")
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="quick")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--problem", choices=["tanh", "set"], default="tanh",
                        help="tanh: the tanh DEQ and every configuration (default); set: the three problems of "
                             "benchmarks/default_solver.py and the three solvers the default chooses among, "
                             "the measurement behind Adaptive's cost_ratio")
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    repeats = args.repeats or size["repeats"]
    steps = args.steps or size["steps"]
    common.header(f"cost per step, {steps} steps", args.size)
    if args.problem == "set":
        from benchmarks import default_solver

        out = {}
        for name, make in default_solver.cases(default_solver.SIZES[args.size]).items():
            case = make()
            print(f"\n-- {name}: {case.note}, float32")
            out[name] = measure(case, set_configs(steps), steps, repeats)
        anderson = [next(r["x_picard"] for r in rows if r["config"].startswith("deqlab anderson")) for rows in out.values()]
        broyden = [next(r["x_picard"] for r in rows if r["config"] == "deqlab broyden") for rows in out.values()]
        print(f"HEADLINE step_cost set: an Anderson step (m = 5) costs {min(anderson):.2f}-{max(anderson):.2f}x the "
              f"loop's plain (Picard) step, a Broyden step {min(broyden):.2f}-{max(broyden):.2f}x")
        return dict(problems=out, steps=steps)
    case = common.tanh_case("tanh 1.3", width=size["width"], batch=size["batch"], ensemble="orthogonal",
                            scale=1.3, reference=False)
    print(f"   {case.note}, float32")
    rows = measure(case, configs(steps), steps, repeats)
    return dict(rows=rows, steps=steps)


if __name__ == "__main__":
    with common.jax_session():
        main()
