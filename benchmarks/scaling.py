"""Scaling: wall time and NFE of deqlab's forward solve against the width N and the batch size.

Run: ``python -m benchmarks.scaling [--size tiny|quick|full] [--solver anderson] [--tol 1e-6]``.

Problem: the ``tanh 0.9`` DEQ of benchmarks.forward (W Haar orthogonal at scale 0.9, unit input
scale, float32), solved by ``deqlab.solve`` with one solver and one per-sample relative-residual
tolerance at every size (default Anderson, the fastest deqlab solver of the forward benchmark on
this problem, at tol 1e-6). Two sweeps:

* width N at batch 128: 128, 256, 512, 1024 (quick; full adds 2048 and 4096);
* batch B at N = 256: 16, 32, 64, 128, 256 (quick; full adds 512 and 1024).

For each point: median wall time of the compiled solve over interleaved rounds (after warm-up),
NFE (deqlab's own count of batched f evaluations), the largest per-sample step count, and the
max-abs error against the float64 reference fixed point (computed for N <= 512 only, where
common.tanh_reference can polish it to a residual of 1e-12 with dense Newton steps). Growth
exponents are least-squares fits of log(time) against log(N) and log(B): time ~ N^a, ~ B^b. One f evaluation is a (B, N) x (N, N)
matrix product, so once the product dominates, a -> 2 and b -> 1 with NFE flat; exponents below
those say fixed overheads (loop control, small kernels) still weigh at the small sizes.
"""

from __future__ import annotations

import os
import statistics
import sys

import numpy as np

if not __package__:  # run as `python benchmarks/scaling.py`: the repository root is not on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common

# common.tanh_reference polishes with dense Newton steps up to N = 512 only (beyond, its
# residual check can fail at 1e-12 and a dense polish would cost more than the benchmark).
REFERENCE_MAX_WIDTH = 512
MAX_STEPS = 500
SWEEPS = {
    "tiny": dict(widths=[16, 32], width_batch=8, batches=[8, 16], batch_width=32, repeats=2),
    "quick": dict(widths=[128, 256, 512, 1024], width_batch=128, batches=[16, 32, 64, 128, 256], batch_width=256,
                  repeats=5),
    "full": dict(widths=[128, 256, 512, 1024, 2048, 4096], width_batch=128,
                 batches=[16, 32, 64, 128, 256, 512, 1024], batch_width=256, repeats=9),
}


def extra_options(parser) -> None:
    parser.add_argument("--solver", default="anderson", choices=["picard", "anderson", "broyden"],
                        help="deqlab solver (default anderson)")
    parser.add_argument("--tol", type=float, default=1e-6, help="per-sample relative residual tolerance")


def growth_exponent(sizes: list[int], values: list[float]) -> float:
    """Least-squares slope of log(value) against log(size): value ~ size^slope."""
    if len(sizes) < 2:
        raise ValueError(f"growth_exponent: needs at least 2 sizes, got {len(sizes)}")
    return float(np.polyfit(np.log(sizes), np.log(values), 1)[0])


def measure(points: list[tuple[int, int]], solver: str, tol: float, repeats: int) -> dict[tuple[int, int], dict]:
    """One row per distinct (N, batch): compile, check against the reference, then time all points
    in interleaved rounds."""
    import deqlab

    rows, timed = {}, {}
    for width, batch in dict.fromkeys(points):
        case = common.tanh_case("tanh 0.9", width=width, batch=batch, ensemble="orthogonal", scale=0.9,
                                reference=width <= REFERENCE_MAX_WIDTH)

        def run(args, case=case):
            sol = deqlab.solve(case.f, case.z0, *args, solver=deqlab.solvers.get_solver(solver, tol=tol, max_steps=MAX_STEPS),
                               batch_axis=0)
            return sol.value, sol.stats.nfe, sol.stats.steps, sol.converged

        compiled, seconds = common.compile_fn(run, case.args)
        value, nfe, steps, converged = compiled(case.args)
        error = common.max_abs_error(value, case.reference) if case.reference is not None else None
        rows[width, batch] = dict(N=width, batch=batch, NFE=int(nfe), **{"max steps": int(np.max(steps))},
                                  converged=bool(np.all(converged)), error=error, compile_s=seconds)
        timed[width, batch] = (compiled, (case.args,))
        print(f"   N={width} B={batch}: NFE {int(nfe)}, error {'n/a' if error is None else f'{error:.1e}'}",
              flush=True)
    times = common.interleaved_times(timed, repeats)
    for key, row in rows.items():
        row["ms"] = 1e3 * statistics.median(times[key])
        row["min ms"] = 1e3 * min(times[key])
        row["ms / NFE"] = row["ms"] / row["NFE"]
    return rows


COLUMNS = ["sweep", "N", "batch", "ms", "min ms", "NFE", "max steps", "ms / NFE", "converged", "error", "compile_s"]


def main(argv=None) -> dict:
    options = common.parse_args(__doc__.splitlines()[0], argv, extra=extra_options)
    s = SWEEPS[options.size]
    repeats = options.repeats or s["repeats"]
    with common.jax_session():
        common.header(f"scaling of deqlab {options.solver} (tol {options.tol:g}) on tanh 0.9", options.size)
        width_points = [(n, s["width_batch"]) for n in s["widths"]]
        batch_points = [(s["batch_width"], b) for b in s["batches"]]
        print(f"-- width sweep at batch {s['width_batch']}, batch sweep at N={s['batch_width']}", flush=True)
        measured = measure(width_points + batch_points, options.solver, options.tol, repeats)
    widths = [dict(sweep="width", **measured[p]) for p in width_points]
    batches = [dict(sweep="batch", **measured[p]) for p in batch_points]
    rows = widths + batches
    print()
    print(f"float32, deqlab {options.solver}, per-sample relative residual tol {options.tol:g}, iteration limit "
          f"{MAX_STEPS}; ms = median of {repeats} interleaved rounds; NFE = batched f evaluations (deqlab's count); "
          f"error = max-abs error vs float64 reference (N <= {REFERENCE_MAX_WIDTH})")
    print(common.table(rows, COLUMNS))
    exponents = {
        "time_N": growth_exponent([r["N"] for r in widths], [r["ms"] for r in widths]),
        "nfe_N": growth_exponent([r["N"] for r in widths], [r["NFE"] for r in widths]),
        "time_B": growth_exponent([r["batch"] for r in batches], [r["ms"] for r in batches]),
        "nfe_B": growth_exponent([r["batch"] for r in batches], [r["NFE"] for r in batches]),
    }
    # The largest sizes show the asymptotic rate once fixed overheads no longer weigh.
    tail = {
        "time_N": growth_exponent([r["N"] for r in widths[-2:]], [r["ms"] for r in widths[-2:]]),
        "time_B": growth_exponent([r["batch"] for r in batches[-2:]], [r["ms"] for r in batches[-2:]]),
    }
    print()
    print(f"fits over all points: time ~ N^{exponents['time_N']:.2f}, NFE ~ N^{exponents['nfe_N']:.2f} "
          f"(batch {s['width_batch']}); time ~ B^{exponents['time_B']:.2f}, NFE ~ B^{exponents['nfe_B']:.2f} "
          f"(N={s['batch_width']})")
    print(f"between the two largest sizes: time ~ N^{tail['time_N']:.2f}, ~ B^{tail['time_B']:.2f} "
          "(a matrix-product-bound solve: N^2, B^1)")
    largest = widths[-1]
    print(f"HEADLINE scaling: deqlab {options.solver} time ~ N^{exponents['time_N']:.2f} "
          f"(N {widths[0]['N']}..{largest['N']}), ~ B^{exponents['time_B']:.2f} "
          f"(B {batches[0]['batch']}..{batches[-1]['batch']}), NFE ~ N^{exponents['nfe_N']:.2f}, "
          f"B^{exponents['nfe_B']:.2f}; N={largest['N']}, B={largest['batch']}: {largest['ms']:.1f} ms, "
          f"NFE {largest['NFE']}")
    return {"rows": rows, "exponents": exponents, "tail": tail}


if __name__ == "__main__":
    main(sys.argv[1:])
