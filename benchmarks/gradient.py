"""Forward + gradient: implicit differentiation in deqlab against jaxopt and optimistix.

Run: ``python -m benchmarks.gradient [--size tiny|quick|full] [--no-peers] [--repeats R]``.

Problems: those of :mod:`benchmarks.forward` (same sizes, data, float64 reference fixed points and
iteration limits). The compiled function times one training-style step: the forward solve, then
the gradient of L = sum(z*^2) with respect to every argument of f (W, U, b, x for the tanh DEQ;
W, x for the linear one) by each library's implicit differentiation:

* deqlab: ``deqlab.fixed_point`` (backward ``"implicit"``): the adjoint fixed point
  u = g + J^T u solved by the forward solver ("same") or by GMRES, with the forward ``tol`` and
  iteration limit;
* jaxopt: its solvers' built-in implicit differentiation (``implicit_diff=True``), with
  ``implicit_diff_solve`` = ``linear_solve.solve_gmres`` or ``solve_normal_cg`` at the forward
  ``tol`` (relative to the 2-norm of the right-hand side over the whole batch);
* optimistix: ``ImplicitAdjoint(linear_solver=lineax.GMRES(rtol=tol, atol=tol))``. Its default
  ``ImplicitAdjoint()`` materialises the Jacobian of the whole batch, a (batch*N)^2 matrix, and
  LU-factorises it: at N=256, batch 128 that is a 32768^2 float32 matrix (4.3 GB before the
  factorisation), which ran for over 15 minutes here without finishing. It is timed in a separate
  table at small sizes, next to its GMRES configuration, to show how its cost grows.

References: the float64 fixed point of benchmarks.forward, and the float64 gradient from it by the
implicit function theorem with exact dense per-sample solves (common.tanh_gradient_reference,
common.linear_gradient_reference).

Tolerance matching: one tolerance per configuration, used by both its forward and its backward
solve (its meaning per library is that of benchmarks.forward), tuned to the *loosest* value of
half decades 1e-2 ... 1e-9 (bisected) whose forward result is within max-abs error 1e-5 of the
reference (the forward target) and whose gradients (W, U, x; b too) are each within relative
Frobenius error 1e-4 of the float64 gradient. Wall time: median over interleaved rounds of the
compiled step (after warm-up). NFE: f evaluations plus vector-Jacobian / Jacobian-vector / GMRES
matrix-vector products, forward and backward together, counted at run time in a separate run
(common.Counter); "fwd reported": the library's own count for the forward solve, where it has one.
"""

from __future__ import annotations

import os
import statistics
import sys
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

if not __package__:  # run as `python benchmarks/gradient.py`: the repository root is not on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common, forward

FORWARD_TARGET = forward.TARGET_ERROR
GRADIENT_TARGET = 1e-4


class GradientConfig(NamedTuple):
    """A forward configuration of benchmarks.forward and the backward (implicit differentiation)
    solve of its library; ``counting``: the wrapper of f that counts NFE in a gradient run
    (reverse-mode "reverse" counts each vector-Jacobian product; "forward" is for libraries that
    differentiate with Jacobian-vector products, whose GMRES products are counted instead)."""

    solve: forward.Config
    backward: str
    counting: str

    @property
    def label(self) -> str:
        return f"{self.solve.library} {self.solve.name} / bwd {self.backward}"


# (forward configuration of benchmarks.forward, backward solve). deqlab's "same": the adjoint is
# solved by the forward solver (Anderson, Broyden: Krylov-like on the affine adjoint map).
PAIRS = [
    ("deqlab picard", "same"),
    ("deqlab anderson", "same"), ("deqlab anderson", "gmres"),
    ("deqlab broyden", "same"),
    ("jaxopt FixedPointIteration", "gmres"),
    ("jaxopt AndersonAcceleration(m=5)", "gmres"), ("jaxopt AndersonAcceleration(m=5)", "normal_cg"),
    ("jaxopt Broyden(history 8, step 1, gamma -1)", "gmres"),
    ("optimistix FixedPointIteration", "gmres"),
    ("optimistix Newton+lineax.GMRES", "gmres"),
]
TINY_PAIRS = {
    "tanh 0.9": {("deqlab anderson", "same"), ("deqlab anderson", "gmres"),
                 ("jaxopt AndersonAcceleration(m=5)", "gmres"), ("optimistix FixedPointIteration", "gmres")},
    "linear GOE 0.48": {("deqlab anderson", "same")},
}
# Size quick: per problem the best-placed configuration of each library (on a loaded 2-core CPU
# each compilation of a forward + gradient step takes up to a minute); size full runs all PAIRS.
QUICK_PAIRS = {
    "tanh 0.9": {("deqlab anderson", "same"), ("jaxopt AndersonAcceleration(m=5)", "gmres"),
                 ("optimistix FixedPointIteration", "gmres")},
    "tanh 0.99": {("deqlab anderson", "same"), ("jaxopt AndersonAcceleration(m=5)", "gmres"),
                  ("optimistix FixedPointIteration", "gmres"), ("optimistix Newton+lineax.GMRES", "gmres")},
    "linear GOE 0.48": {("deqlab anderson", "same"), ("jaxopt AndersonAcceleration(m=5)", "gmres"),
                        ("optimistix FixedPointIteration", "gmres"), ("optimistix Newton+lineax.GMRES", "gmres")},
}
# Half decades 1e-2 ... 1e-9: one compilation of a forward + gradient step per tolerance tried
# (about 4 per configuration by bisection) is the cost of this benchmark on a loaded 2-core CPU.
HALF_DECADES = [float(f"{10 ** (-k / 2):.3g}") for k in range(4, 19)]
# Tiny: one tolerance, tight enough for every library at N=32, batch 8 (a correctness run).
TINY_GRID = [1e-6]
# Fixed tolerance of the dense-LU table (no tuning: at these sizes it meets both targets; the
# errors are printed).
LU_TOL = 1e-6
# (N, batch) of the dense-LU table: (batch*N)^2 Jacobians of 256^2, 1024^2, 2048^2 (quick).
LU_SIZES = {"tiny": [(16, 4)], "quick": [(32, 8), (64, 16), (128, 16)],
            "full": [(32, 8), (64, 16), (128, 16), (256, 16)]}


def gradient_configs(peers: common.Peers, max_steps: int) -> list[GradientConfig]:
    solves = {f"{c.library} {c.name}": c for c in forward.all_configs(peers, max_steps)}
    return [GradientConfig(solves[name], backward, "forward" if name.startswith("optimistix") else "reverse")
            for name, backward in PAIRS if name in solves]


def make_step(config: GradientConfig, case: common.Case, tol: float, f, counter=None):
    """``step(args) -> (z*, grads, forward nfe)``: the solve and the gradient of sum(z*^2)."""
    run = config.solve.make(case, tol, f, counter, backward=config.backward)

    def loss(args):
        z, nfe = run(args)
        return jnp.sum(z**2), (z, nfe)

    def step(args):
        (_, (z, nfe)), grads = jax.value_and_grad(loss, has_aux=True)(args)
        return z, grads, nfe

    return step


def evaluate(config: GradientConfig, case: common.Case, reference: dict[str, np.ndarray], tol: float):
    """Compile and run the step at ``tol``; its forward and gradient errors against the reference."""
    compiled, seconds = common.compile_fn(make_step(config, case, tol, case.f), case.args)
    try:
        z, grads, reported = jax.block_until_ready(compiled(case.args))
    except jax.errors.JaxRuntimeError as err:
        # A run-time failure at this tolerance (lineax's GMRES raises on stagnation even with
        # throw=False, when a tight float32 tolerance cannot be reached) fails this tolerance
        # only: the search goes on to looser ones, where the peer may succeed.
        return dict(tol=tol, error=float("inf"), grad_error=float("inf"), ok=False,
                    runtime_error=common.short_error(err))
    errors = common.relative_gradient_errors(grads, reference, common.gradient_names(case))
    error = common.max_abs_error(z, case.reference)
    grad_error = max(errors.values())
    return dict(tol=tol, compiled=compiled, error=error, grad_error=grad_error, grad_errors=errors,
                reported=int(reported), compile_s=seconds,
                ok=error <= FORWARD_TARGET and grad_error <= GRADIENT_TARGET)


def count_nfe(config: GradientConfig, case: common.Case, tol: float) -> int:
    """f evaluations plus derivative products of one step, forward and backward, counted in an
    un-timed run."""
    counter = common.Counter()
    f = counter.reverse(case.f) if config.counting == "reverse" else counter.forward(case.f)
    step = jax.jit(make_step(config, case, tol, f, counter))
    counter.reset()
    jax.block_until_ready(step(case.args))
    return sum(counter.read().values())


def run_case(case: common.Case, max_steps: int, peers: common.Peers, s: dict[str, Any], repeats: int):
    reference = common.gradient_reference(case)
    rows, timed = [], {}
    for config in gradient_configs(peers, max_steps):
        label = config.label
        if s["pairs"] is not None and (f"{config.solve.library} {config.solve.name}", config.backward) \
                not in s["pairs"].get(case.name, ()):
            continue
        runtime_errors = []

        def attempt(tol, config=config):
            out = evaluate(config, case, reference, tol)
            if "runtime_error" in out:
                runtime_errors.append(f"at tol {tol:g}: {out['runtime_error']}")
            return out

        try:
            tuned = common.loosest_passing(s["grid"], attempt, s["exhaustive"], s["refine"])
            if tuned["tol"] is None:
                failed = f"; run-time errors {len(runtime_errors)}, last {runtime_errors[-1]}" if runtime_errors else ""
                rows.append(dict(problem=case.name, config=label, error=tuned["error"],
                                 status=f"no tol in grid reaches {FORWARD_TARGET:g} / {GRADIENT_TARGET:g}{failed}"))
                continue
            nfe = count_nfe(config, case, tuned["tol"])
        except Exception as err:  # a peer that fails to trace or run is reported, not fatal
            if config.solve.library == "deqlab":
                raise
            rows.append(dict(problem=case.name, config=label, status="failed: " + common.short_error(err)))
            continue
        reported = tuned["reported"] if tuned["reported"] >= 0 else None
        rows.append(dict(problem=case.name, config=label, tol=tuned["tol"], NFE=nfe, **{"fwd reported": reported},
                         error=tuned["error"], **{"grad error": tuned["grad_error"]},
                         compile_s=tuned["compile_s"], status="ok"))
        timed[label] = (tuned["compiled"], (case.args,))
        print(f"   {label}: tol {tuned['tol']:g} ({tuned['tried']} tried), error {tuned['error']:.1e}, "
              f"gradient error {tuned['grad_error']:.1e}, NFE {nfe}", flush=True)
    times = common.interleaved_times(timed, repeats)
    for row in rows:
        if row["config"] in times:
            samples = times[row["config"]]
            row["ms"] = 1e3 * statistics.median(samples)
            row["min ms"] = 1e3 * min(samples)
    return rows


def dense_lu_table(peers: common.Peers, size: str, repeats: int) -> list[dict[str, Any]]:
    """optimistix FixedPointIteration with its default ImplicitAdjoint (dense LU of the
    (batch*N)^2 Jacobian) against the same with lineax.GMRES, on tanh 0.9 at small sizes: wall time
    and compiled temporary memory of the step grow with (batch*N)^3 and (batch*N)^2."""
    if peers.optimistix is None:
        return []
    rows = []
    for width, batch in LU_SIZES[size]:
        case = common.tanh_case("tanh 0.9", width=width, batch=batch, ensemble="orthogonal", scale=0.9)
        reference = common.gradient_reference(case)
        solves = {f"{c.library} {c.name}": c for c in forward.optimistix_configs(peers.optimistix, peers.lineax, 500)}
        timed = {}
        for backward in ("lu", "gmres"):
            config = GradientConfig(solves["optimistix FixedPointIteration"], backward, "forward")
            tuned = evaluate(config, case, reference, LU_TOL)
            row = dict(N=width, batch=batch, **{"batch*N": batch * width}, adjoint=backward)
            memory = tuned["compiled"].memory_analysis().temp_size_in_bytes
            rows.append(dict(row, tol=tuned["tol"], **{"temp MiB": memory / 2**20}, error=tuned["error"],
                             **{"grad error": tuned["grad_error"]}, compile_s=tuned["compile_s"],
                             status="ok" if tuned["ok"] else "misses a target"))
            timed[backward] = (tuned["compiled"], (case.args,))
        times = common.interleaved_times(timed, repeats)
        for row in rows:
            if row["N"] == width and row["batch"] == batch and row["adjoint"] in times:
                row["ms"] = 1e3 * statistics.median(times[row["adjoint"]])
        print(f"   dense LU table: N={width}, batch={batch} done", flush=True)
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return forward.summarise(rows)


COLUMNS = ["problem", "config", "tol", "ms", "min ms", "NFE", "fwd reported", "error", "grad error", "compile_s",
           "status"]
LU_COLUMNS = ["N", "batch", "batch*N", "adjoint", "tol", "ms", "temp MiB", "error", "grad error", "compile_s", "status"]


def sizes(size: str) -> dict[str, Any]:
    s = dict(forward.sizes(size))
    s["pairs"] = {"tiny": TINY_PAIRS, "quick": QUICK_PAIRS, "full": None}[size]
    s["grid"] = TINY_GRID if size == "tiny" else HALF_DECADES
    s["repeats"] = {"tiny": 2, "quick": 5, "full": 11}[size]
    return s


def main(argv=None) -> dict:
    options = common.parse_args(__doc__.splitlines()[0], argv)
    s = sizes(options.size)
    repeats = options.repeats or s["repeats"]
    with common.jax_session(), warnings.catch_warnings():
        # Loose trial tolerances of the tuning make deqlab warn that an adjoint solve did not
        # converge; the tuning judges them by their errors instead.
        warnings.simplefilter("ignore", category=RuntimeWarning)
        peers = common.load_peers(options.no_peers)
        common.header("forward + implicit gradient of sum(z*^2)", options.size)
        rows = []
        for case, max_steps in forward.cases(options.size, options.problem):
            print(f"-- {case.name}: {case.note}; iteration limit {max_steps} for every library", flush=True)
            rows += run_case(case, max_steps, peers, s, repeats)
        print("-- optimistix default ImplicitAdjoint (dense LU) against lineax.GMRES, tanh 0.9, small sizes",
              flush=True)
        lu_rows = dense_lu_table(peers, options.size, repeats)
    print()
    print(f"float32; a step = forward solve + gradient of sum(z*^2) w.r.t. all arguments of f; targets: forward "
          f"max-abs error {FORWARD_TARGET:g}, gradient relative error {GRADIENT_TARGET:g} (worst of W, U, b, x) vs "
          f"float64; ms = median of {repeats} interleaved rounds; NFE = counted f evaluations + derivative products, "
          "forward and backward")
    print(common.table(rows, COLUMNS))
    if lu_rows:
        print()
        print("optimistix FixedPointIteration, default ImplicitAdjoint() (dense LU of the (batch*N)^2 Jacobian) vs "
              "ImplicitAdjoint(lineax.GMRES); temp MiB = compiled temporary memory of the step")
        print(common.table(lu_rows, LU_COLUMNS))
        lu = [r for r in lu_rows if r["adjoint"] == "lu" and "ms" in r]
        if len(lu) >= 2:
            dims = np.log([r["batch*N"] for r in lu])
            time_exp = np.polyfit(dims, np.log([r["ms"] for r in lu]), 1)[0]
            mem_exp = np.polyfit(dims, np.log([r["temp MiB"] for r in lu]), 1)[0]
            big = 256 * 128
            print(f"dense LU: time ~ (batch*N)^{time_exp:.2f}, memory ~ (batch*N)^{mem_exp:.2f} over these sizes; "
                  f"at N=256, batch 128 the Jacobian alone is {big**2 * 4 / 2**30:.1f} GiB of float32")
    summary = summarise(rows)
    ratios = {}
    print()
    for problem, entry in summary.items():
        ours, peer = entry["deqlab"], entry["peer"]
        if ours is None:
            print(f"{problem}: no deqlab configuration reached the targets")
            continue
        if peer is None:
            print(f"{problem}: deqlab best {ours['config']} {ours['ms']:.2f} ms, NFE {ours['NFE']} (no peer row)")
            continue
        ratios[problem] = entry["ratio"]
        fewest = entry["fewest_peer_nfe"]
        print(f"{problem}: deqlab best {ours['config']} ({ours['ms']:.2f} ms, NFE {ours['NFE']}) vs best peer "
              f"{peer['config']} ({peer['ms']:.2f} ms, NFE {peer['NFE']}): {entry['ratio']:.2f}x wall time, "
              f"NFE {'no higher' if entry['nfe_ok'] else 'HIGHER'}; fewest peer NFE: {fewest['config']} "
              f"({fewest['NFE']})")
    if ratios:
        worst = max(ratios, key=ratios.get)
        met = all(v <= 0.7 and summary[k]["nfe_ok"] for k, v in ratios.items())
        per = ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
        print(f"HEADLINE gradient: deqlab best / peer best wall time = {ratios[worst]:.2f}x (worst problem, {worst}; "
              f"{per}); target <= 0.7x with NFE no higher: {'met' if met else 'NOT met'}")
    else:
        print("HEADLINE gradient: no peer configuration ran; deqlab rows only")
    return {"rows": rows, "lu_rows": lu_rows, "ratios": ratios, "summary": summary}


if __name__ == "__main__":
    main(sys.argv[1:])
