"""Forward solve, time to accuracy: deqlab against jaxopt and optimistix.

Run: ``python -m benchmarks.forward [--size tiny|quick|full] [--no-peers] [--repeats R]``.

Problems (float32, N = 256 and batch 128 at sizes quick and full, as in the issue):

* ``tanh 0.9``: z = tanh(W z + U x), W Haar orthogonal at scale 0.9, unit input scale (easy);
* ``tanh 0.99``: the same at scale 0.99 with input scale 0.1 (tanh stays nearly linear, so plain
  iteration contracts at ~0.99 per step and needs about a thousand steps);
* ``linear GOE 0.48``: z = W z + x with W from the GOE at scale 0.48 (critical scale 0.5, so
  V = 0.92 V_c; realised spectral radius 0.978 at N = 256, cond(I - W) ~ 46), x rescaled so that
  max |z*| = 1. Why not closer to critical: at scale 0.49 the sampled N = 256 matrix has spectral
  radius 0.9988 (finite-N edge fluctuations, chapter 1), cond(I - W) ~ 830, and a max-abs error of
  1e-5 then needs residuals below float32 resolution: every fixed-point iteration (deqlab, jaxopt,
  optimistix alike) stalls at an error of 1.4e-4, and what passes does so by luck.

Reference fixed points are float64 NumPy solves (common.tanh_reference: NumPy Anderson to a
relative residual of 1e-12, then dense Newton steps; linear case: a dense solve).

Tolerance matching. Each library measures convergence differently, so each configuration's
tolerance is tuned separately: on a grid of quarter decades from 1e-2 to 1e-9, bisected, we take
the *loosest* tolerance whose result is within max-abs error 1e-5 of the reference (over all
samples), then time that configuration. What ``tol`` means:

* deqlab: per-sample relative residual ||f(z) - z||_2 / (||f(z)||_2 + eps sqrt(D)) <= tol; each
  sample stops on its own (the loop ends when all have).
* jaxopt: FixedPointIteration and AndersonAcceleration stop when the 2-norm of f(z) - z over the
  *whole batch* (one flattened vector) is <= tol; Broyden (a root finder on g(z) = f(z) - z) when
  ||g(z)||_2 over the whole batch <= tol. The batch stops together. "[vmap]" rows vmap the solver
  over samples instead (per-sample tolerance; the vmapped loop runs until the slowest sample stops).
* optimistix: per element |y_{k+1} - y_k| < atol + rtol |y_{k+1}| under its default max norm over the
  whole batch, with atol = rtol = tol (Newton also asks |g(y)| < atol + rtol |g(y)|, its Cauchy
  termination); its GMRES uses rtol = atol = tol too; ``throw=False`` so non-convergence returns
  instead of raising.

Every configuration gets the same iteration limit per problem. Wall time: median over interleaved
rounds of the compiled solve (after warm-up; see common.py). NFE: evaluations of f on the batch plus
Jacobian-vector / vector-Jacobian / GMRES matrix-vector products, counted at run time in a separate
run (common.Counter); "reported" is the library's own count where it has one.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

if not __package__:  # run as `python benchmarks/forward.py`: the repository root is not on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common

TARGET_ERROR = 1e-5
DECADES = [1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9]
# Quarter decades 1e-2 ... 1e-9: near the float32 floor the iteration count jumps steeply between
# neighbouring tolerances (a factor 3 can separate 400 steps from the iteration limit), so the
# grid must be fine there for the tuned tolerance to be the loosest that works, not a grid artefact.
QUARTER_DECADES = [float(f"{10 ** (-k / 4):.3g}") for k in range(8, 37)]


class Config(NamedTuple):
    """A solver configuration: ``make(case, tol, f, counter, backward=None)`` returns
    ``run(args) -> (z, nfe)`` (nfe: the library's own count of the forward solve, or -1).
    ``backward`` (used by benchmarks.gradient) names the library's implicit-differentiation linear
    solve; None keeps the library's default. ``counting``: which wrapper of f counts its NFE."""

    library: str
    name: str
    make: Callable[..., Callable[..., Any]]
    counting: str = "forward"


def _batched_last(fn_one, z0, args):
    """vmap a per-sample solve over the batch axis of z0 and of the last argument (the input)."""
    in_axes = (0,) + (None,) * (len(args) - 1) + (0,)
    return jax.vmap(fn_one, in_axes=in_axes)(z0, *args)


def deqlab_configs(max_steps: int) -> list[Config]:
    import deqlab

    def make_for(solver):
        def make(case, tol, f, counter=None, backward=None):
            options = dict(solver=deqlab.solvers.get_solver(solver, tol=tol, max_steps=max_steps), batch_axis=0)
            if backward is not None:
                # Implicit backward (deqlab's default path); "same": the adjoint is solved by the
                # forward solver, with the forward tolerance and iteration limit. Failures are
                # measured by the harness (gradient error), not warned about.
                options["backward"] = deqlab.backward.Implicit(solver=None if backward == "same" else backward)
            options["on_failure"] = "ignore"

            def run(args):
                solve = deqlab.solve if backward is None else deqlab.fixed_point
                sol = solve(f, case.z0, *args, **options)
                return sol.value, sol.stats.nfe

            return run

        return make

    from deqlab import solvers

    # "[error]": error-controlled stopping (tol bounds the estimated max-abs error of z*);
    # "[check 4]": convergence judged every fourth step (deqlab.solvers, check_every): measured
    # on tanh 0.9, checking every step costs 1.20x the bare iteration per step, every second 1.11x,
    # every fourth 1.07x (at most 3 steps too many in exchange).
    named = {"picard": "picard", "anderson": "anderson", "anderson(m=10)": solvers.Anderson(m=10),
             "broyden": "broyden",
             "picard [error]": solvers.Picard(stop="error"),
             "anderson [error]": solvers.Anderson(stop="error"),
             "broyden [error]": solvers.Broyden(stop="error"),
             "picard [check 4]": solvers.Picard(check_every=4),
             "picard [error, check 4]": solvers.Picard(stop="error", check_every=4)}
    return [Config("deqlab", name, make_for(solver)) for name, solver in named.items()]


def jaxopt_backward(jaxopt, backward: str | None, tol: float, max_steps: int) -> dict[str, Any]:
    """jaxopt's implicit differentiation: the linear solve of its adjoint system (A^T u = v with A
    the Jacobian of the optimality function f(z) - z, by vector-Jacobian products), with the
    forward tolerance; ``None``: jaxopt's default (normal CG, tolerance 1e-5)."""
    if backward is None:
        return {}
    solvers = {"gmres": jaxopt.linear_solve.solve_gmres, "normal_cg": jaxopt.linear_solve.solve_normal_cg}
    if backward not in solvers:
        raise ValueError(f"jaxopt backward must be one of {sorted(solvers)}, got {backward!r}")
    # jax.scipy's GMRES counts maxiter in restart cycles (of 20 products), CG in products: divide
    # for GMRES so that every library's backward gets the same budget of products, max_steps (as
    # deqlab.backward.adjoint_solve does; max_steps cycles let jaxopt spend 20x the budget).
    maxiter = -(-max_steps // 20) if backward == "gmres" else max_steps
    return dict(implicit_diff_solve=functools.partial(solvers[backward], tol=tol, maxiter=maxiter))


def jaxopt_configs(jaxopt, max_steps: int) -> list[Config]:
    def fpi(case, tol, f, counter=None, backward=None):
        solver = jaxopt.FixedPointIteration(fixed_point_fun=f, tol=tol, maxiter=max_steps,
                                            **jaxopt_backward(jaxopt, backward, tol, max_steps))

        def run(args):
            params, state = solver.run(case.z0, *args)
            return params, state.num_fun_eval

        return run

    def anderson(history):
        def make(case, tol, f, counter=None, backward=None):
            solver = jaxopt.AndersonAcceleration(fixed_point_fun=f, tol=tol, maxiter=max_steps,
                                                 history_size=history,
                                                 **jaxopt_backward(jaxopt, backward, tol, max_steps))

            def run(args):
                params, state = solver.run(case.z0, *args)
                return params, state.num_fun_eval

            return run

        return make

    def anderson_vmap(case, tol, f, counter=None, backward=None):
        solver = jaxopt.AndersonAcceleration(fixed_point_fun=f, tol=tol, maxiter=max_steps, history_size=5,
                                             **jaxopt_backward(jaxopt, backward, tol, max_steps))

        def run(args):
            params, state = _batched_last(lambda z, *a: solver.run(z, *a), case.z0, args)
            return params, jnp.max(state.num_fun_eval)

        return run

    def broyden(line_search):
        def make(case, tol, f, counter=None, backward=None):
            options = dict(history_size=8, **jaxopt_backward(jaxopt, backward, tol, max_steps))
            if not line_search:
                # B0 = -I is the right initial inverse Jacobian of g = f - z; jaxopt's default
                # gamma = +1 points the first step the wrong way (its line search has to recover).
                options.update(stepsize=1.0, gamma=-1.0)
            solver = jaxopt.Broyden(fun=lambda z, *a: f(z, *a) - z, tol=tol, maxiter=max_steps, **options)

            def run(args):
                params, state = solver.run(case.z0, *args)
                return params, state.num_fun_eval

            return run

        return make

    return [
        Config("jaxopt", "FixedPointIteration", fpi),
        Config("jaxopt", "AndersonAcceleration(m=5)", anderson(5)),
        Config("jaxopt", "AndersonAcceleration(m=10)", anderson(10)),
        Config("jaxopt", "AndersonAcceleration(m=5) [vmap]", anderson_vmap),
        Config("jaxopt", "Broyden(history 8, line search)", broyden(True), counting="reverse"),
        Config("jaxopt", "Broyden(history 8, step 1, gamma -1)", broyden(False)),
    ]


def optimistix_adjoint(optx, lineax, backward: str | None, tol: float, max_steps: int, counter=None):
    """optimistix's implicit differentiation. ``"gmres"``: ``ImplicitAdjoint`` with a matrix-free
    ``lineax.GMRES`` at the forward tolerance; ``"lu"`` (and ``None``): its default
    ``ImplicitAdjoint()``, whose automatic linear solver materialises the (batch*N)^2 Jacobian of
    the whole batch and factorises it (LU)."""
    if backward in (None, "lu"):
        return dict(adjoint=optx.ImplicitAdjoint()) if backward else {}
    if backward != "gmres":
        raise ValueError(f"optimistix backward must be 'gmres' or 'lu', got {backward!r}")
    gmres = dict(rtol=tol, atol=tol, restart=20, max_steps=max_steps)
    linear = counter.gmres(lineax, **gmres) if counter is not None else lineax.GMRES(**gmres)
    return dict(adjoint=optx.ImplicitAdjoint(linear_solver=linear))


def optimistix_configs(optx, lineax, max_steps: int) -> list[Config]:
    def fpi(case, tol, f, counter=None, backward=None):
        solver = optx.FixedPointIteration(rtol=tol, atol=tol)
        adjoint = optimistix_adjoint(optx, lineax, backward, tol, max_steps, counter)

        def run(args):
            sol = optx.fixed_point(lambda y, a: f(y, *a), solver, case.z0, args, max_steps=max_steps, throw=False,
                                   **adjoint)
            return sol.value, sol.stats["num_steps"]

        return run

    def fpi_vmap(case, tol, f, counter=None, backward=None):
        solver = optx.FixedPointIteration(rtol=tol, atol=tol)
        adjoint = optimistix_adjoint(optx, lineax, backward, tol, max_steps, counter)

        def one(z0, *args):
            sol = optx.fixed_point(lambda y, a: f(y, *a), solver, z0, args, max_steps=max_steps, throw=False,
                                   **adjoint)
            return sol.value, sol.stats["num_steps"]

        def run(args):
            value, steps = _batched_last(one, case.z0, args)
            return value, jnp.max(steps)

        return run

    def newton_like(cls):
        def make(case, tol, f, counter=None, backward=None):
            gmres = dict(rtol=tol, atol=tol, restart=20, max_steps=max_steps)
            linear = counter.gmres(lineax, **gmres) if counter is not None else lineax.GMRES(**gmres)
            solver = cls(rtol=tol, atol=tol, linear_solver=linear)
            adjoint = optimistix_adjoint(optx, lineax, backward, tol, max_steps, counter)

            def run(args):
                sol = optx.fixed_point(lambda y, a: f(y, *a), solver, case.z0, args, max_steps=max_steps, throw=False,
                                       **adjoint)
                return sol.value, -1  # optimistix reports Newton steps, not f evaluations

            return run

        return make

    return [
        Config("optimistix", "FixedPointIteration", fpi),
        Config("optimistix", "FixedPointIteration [vmap]", fpi_vmap),
        Config("optimistix", "Newton+lineax.GMRES", newton_like(optx.Newton)),
        Config("optimistix", "Chord+lineax.GMRES", newton_like(optx.Chord)),
    ]


def all_configs(peers: common.Peers, max_steps: int) -> list[Config]:
    configs = deqlab_configs(max_steps)
    if peers.jaxopt is not None:
        configs += jaxopt_configs(peers.jaxopt, max_steps)
    if peers.optimistix is not None:
        configs += optimistix_configs(peers.optimistix, peers.lineax, max_steps)
    return configs


def count_nfe(config: Config, case: common.Case, tol: float) -> int:
    """Batched evaluations of f plus derivative products, counted in an un-timed run."""
    counter = common.Counter()
    f = counter.reverse(case.f) if config.counting == "reverse" else counter.forward(case.f)
    run = jax.jit(config.make(case, tol, f, counter))
    counter.reset()
    jax.block_until_ready(run(case.args))
    return sum(counter.read().values())


def tune(config: Config, case: common.Case, grid: list[float], exhaustive: bool, refine: int = 0) -> dict[str, Any]:
    """The loosest tolerance of ``grid`` (loose to tight) whose result is within TARGET_ERROR
    (:func:`benchmarks.common.loosest_passing`), with the compiled solve at that tolerance."""

    def attempt(tol):
        compiled, seconds = common.compile_fn(config.make(case, tol, case.f), case.args)
        value, reported = compiled(case.args)
        error = common.max_abs_error(value, case.reference)
        return dict(tol=tol, compiled=compiled, error=error, reported=int(reported), compile_s=seconds,
                    ok=error <= TARGET_ERROR)

    return common.loosest_passing(grid, attempt, exhaustive, refine)


# Configurations run at each size (None: all). vmap rows are slow (a vmapped loop runs until the
# slowest sample stops, and jaxopt's cond becomes a select); they run at size full only.
TINY_CONFIGS = {
    "tanh 0.9": {"deqlab picard", "deqlab anderson", "deqlab broyden", "jaxopt AndersonAcceleration(m=5)",
                 "optimistix FixedPointIteration"},
    "linear GOE 0.48": {"deqlab anderson"},
}
TINY_GRID = [1e-3, 1e-5, 1e-7]


def sizes(size: str) -> dict[str, Any]:
    if size == "tiny":
        return dict(width=32, batch=8, grid=TINY_GRID, exhaustive=False, refine=0, repeats=2, steps=(200, 2000, 2000),
                    problems=tuple(TINY_CONFIGS), configs=TINY_CONFIGS, vmap=False, count="needed", limit=False)
    if size == "quick":
        return dict(width=256, batch=128, grid=QUARTER_DECADES, exhaustive=False, refine=3, repeats=7, steps=(500, 3000, 3000),
                    problems=None, configs=None, vmap=False, count="all", limit=True)
    return dict(width=256, batch=128, grid=QUARTER_DECADES, exhaustive=False, refine=3, repeats=15, steps=(500, 3000, 3000),
                problems=None, configs=None, vmap=True, count="all", limit=True)


#: Problems with no float64 gradient reference: benchmarks.forward runs them, benchmarks.gradient
#: (which calls :func:`cases` with its default ``forward_only=False``) does not.
FORWARD_ONLY = ("transformer",)


def cases(size: str, problems: list[str] | None = None,
          forward_only: bool = False) -> list[tuple[common.Case, int]]:
    """The problems of ``size`` (all, or those named in ``problems``) with their iteration limits;
    ``forward_only`` adds the problems of :data:`FORWARD_ONLY`."""
    s = sizes(size)
    width, batch = s["width"], s["batch"]
    easy, hard, linear = s["steps"]
    builders = {
        "tanh 0.9": lambda: (common.tanh_case("tanh 0.9", width=width, batch=batch, ensemble="orthogonal",
                                              scale=0.9), easy),
        "tanh 0.99": lambda: (common.tanh_case("tanh 0.99", width=width, batch=batch, ensemble="orthogonal",
                                               scale=0.99, input_scale=0.1), hard),
        "linear GOE 0.48": lambda: (common.linear_case("linear GOE 0.48", width=width, batch=batch, scale=0.48),
                                    linear),
        # The chapter 5 cell (003 §4) at initialisation: small, since its f is ~20 matrix products.
        "transformer": lambda: (common.transformer_case("transformer", width=32, length=16, batch=16), easy),
    }
    if not forward_only:
        builders = {k: v for k, v in builders.items() if k not in FORWARD_ONLY}
    available = [name for name in builders if s["problems"] is None or name in s["problems"]]
    unknown = sorted(set(problems or ()) - set(available))
    if unknown:
        raise ValueError(f"--problem must name problems of size {size!r} ({', '.join(available)}), got {unknown}")
    return [builders[name]() for name in available if problems is None or name in problems]


def run_case(case: common.Case, max_steps: int, peers: common.Peers, s: dict[str, Any], repeats: int):
    rows, timed = [], {}
    for config in all_configs(peers, max_steps):
        label = f"{config.library} {config.name}"
        if s["configs"] is not None and label not in s["configs"][case.name]:
            continue
        if "[vmap]" in label and not s["vmap"]:
            continue
        try:
            tuned = tune(config, case, s["grid"], s["exhaustive"], s["refine"])
            if tuned["tol"] is None:
                rows.append(dict(problem=case.name, config=label, error=tuned["error"],
                                 status=f"no tol in grid reaches {TARGET_ERROR:g}"))
                continue
            reported = tuned["reported"] if tuned["reported"] >= 0 else None
            needed = reported is None or config.counting == "reverse"
            nfe = count_nfe(config, case, tuned["tol"]) if s["count"] == "all" or needed else reported
        except Exception as err:  # a peer that fails to trace or run is reported, not fatal
            if config.library == "deqlab":
                raise
            rows.append(dict(problem=case.name, config=label, status="failed: " + common.short_error(err)))
            continue
        rows.append(dict(problem=case.name, config=label, tol=tuned["tol"], NFE=nfe, reported=reported,
                         error=tuned["error"], compile_s=tuned["compile_s"], status="ok"))
        timed[label] = (tuned["compiled"], (case.args,))
        print(f"   {label}: tol {tuned['tol']:g} ({tuned['tried']} tried), error {tuned['error']:.1e}, NFE {nfe}",
              flush=True)
    # The limit: plain iteration for the fewest steps that reach the target, no checks at all.
    steps, error = common.limit_steps(case, max_steps, TARGET_ERROR) if s["limit"] else (0, float("inf"))
    if not s["limit"]:
        pass
    elif error <= TARGET_ERROR:
        compiled, seconds = common.compile_fn(common.limit_fn(case, steps), case.args)
        rows.append(dict(problem=case.name, config=LIMIT, NFE=steps, error=error, compile_s=seconds, status="ok"))
        timed[LIMIT] = (compiled, (case.args,))
        print(f"   {LIMIT}: {steps} steps, error {error:.1e}", flush=True)
    else:
        rows.append(dict(problem=case.name, config=LIMIT, error=error,
                         status=f"plain iteration does not reach {TARGET_ERROR:g} in {max_steps} steps"))
    times = common.interleaved_times(timed, repeats)
    for row in rows:
        if row["config"] in times:
            samples = times[row["config"]]
            row["ms"] = 1e3 * statistics.median(samples)
            row["min ms"] = 1e3 * min(samples)
    if LIMIT in times:
        limit_ms = 1e3 * statistics.median(times[LIMIT])
        for row in rows:
            if "ms" in row:
                row["x limit"] = row["ms"] / limit_ms
    return rows


LIMIT = "limit (plain iteration, fewest steps)"


def summarise(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per problem: the fastest deqlab and the fastest peer configuration reaching the target (and
    the limit row, when there is one)."""
    out = {}
    for problem in dict.fromkeys(r["problem"] for r in rows):
        ok = [r for r in rows if r["problem"] == problem and "ms" in r]
        ours = [r for r in ok if r["config"].startswith("deqlab")]
        theirs = [r for r in ok if not r["config"].startswith("deqlab") and r["config"] != LIMIT]
        limit = [r for r in ok if r["config"] == LIMIT]
        entry = dict(deqlab=min(ours, key=lambda r: r["ms"]) if ours else None,
                     peer=min(theirs, key=lambda r: r["ms"]) if theirs else None,
                     limit=limit[0] if limit else None)
        if entry["deqlab"] and entry["limit"]:
            entry["limit_ratio"] = entry["deqlab"]["ms"] / entry["limit"]["ms"]
        if entry["deqlab"] and entry["peer"]:
            entry["ratio"] = entry["deqlab"]["ms"] / entry["peer"]["ms"]
            entry["nfe_ok"] = entry["deqlab"]["NFE"] <= entry["peer"]["NFE"]
            entry["fewest_peer_nfe"] = min(theirs, key=lambda r: r["NFE"])
        out[problem] = entry
    return out


COLUMNS = ["problem", "config", "tol", "ms", "min ms", "x limit", "NFE", "reported", "error", "compile_s", "status"]


def main(argv=None) -> dict:
    options = common.parse_args(__doc__.splitlines()[0], argv)
    s = sizes(options.size)
    repeats = options.repeats or s["repeats"]
    with common.jax_session():
        peers = common.load_peers(options.no_peers)
        common.header("forward: time to max-abs error <= 1e-5", options.size)
        rows = []
        for case, max_steps in cases(options.size, options.problem, forward_only=True):
            print(f"-- {case.name}: {case.note}; iteration limit {max_steps} for every library", flush=True)
            rows += run_case(case, max_steps, peers, s, repeats)
        print()
        print(f"float32, target max-abs error {TARGET_ERROR:g} vs float64 reference; ms = median of {repeats} "
              "interleaved rounds; NFE = counted batched f evaluations + derivative products")
        print(common.table(rows, COLUMNS))
        summary = summarise(rows)
        ratios = {}
        print()
        for problem, entry in summary.items():
            ours, peer = entry["deqlab"], entry["peer"]
            if ours is None:
                print(f"{problem}: no deqlab configuration reached the target")
                continue
            if peer is None:
                print(f"{problem}: deqlab best {ours['config']} {ours['ms']:.2f} ms, NFE {ours['NFE']} (no peer row)")
                continue
            ratios[problem] = entry["ratio"]
            fewest = entry["fewest_peer_nfe"]
            limit = entry["limit"]
            against_limit = (f"; limit {limit['ms']:.2f} ms, {limit['NFE']} steps: deqlab "
                             f"{entry['limit_ratio']:.2f}x, peer {peer['ms'] / limit['ms']:.2f}x" if limit else "")
            print(f"{problem}: deqlab best {ours['config']} ({ours['ms']:.2f} ms, NFE {ours['NFE']}) vs best peer "
                  f"{peer['config']} ({peer['ms']:.2f} ms, NFE {peer['NFE']}): {entry['ratio']:.2f}x wall time, "
                  f"NFE {'no higher' if entry['nfe_ok'] else 'HIGHER'}; fewest peer NFE: {fewest['config']} "
                  f"({fewest['NFE']}){against_limit}")
        if ratios:
            worst = max(ratios, key=ratios.get)
            met = all(v <= 0.9 for v in ratios.values())
            per = ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
            limits = {k: e["limit_ratio"] for k, e in summary.items() if "limit_ratio" in e}
            within = all(v <= 1.1 for v in limits.values())
            per_limit = ", ".join(f"{k} {v:.2f}x" for k, v in limits.items())
            print(f"HEADLINE forward: deqlab best / peer best wall time = {ratios[worst]:.2f}x (worst problem, "
                  f"{worst}; {per}); target <= 0.9x: {'met' if met else 'NOT met'}; deqlab best / limit: "
                  f"{per_limit}; target <= 1.1x: {'met' if within else 'NOT met'}")
        else:
            print("HEADLINE forward: no peer configuration ran; deqlab rows only")
    return {"rows": rows, "ratios": ratios, "summary": summary}


if __name__ == "__main__":
    main(sys.argv[1:])
