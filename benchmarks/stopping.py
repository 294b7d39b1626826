"""Stopping rules at the accuracy a user asks for: delivered error and time against plain iteration.

Run: ``python -m benchmarks.stopping [--size tiny|quick] [--repeats R] [--no-peers]``.

Problem (issue 18/19, item 5): z = tanh(W z + U x + b), W Haar orthogonal at scale 1.3 (the
map contracts only through tanh's saturation), N = 384, batch 96 (``tiny``: N = 32, batch 8),
float32, reference fixed point in float64. A user passes ``tol=1e-5`` and nothing else. Each
configuration is compiled once and timed in interleaved rounds in the same process (median), and
reported with

* the delivered error: max-abs error against the reference, worst sample of the batch;
* the steps of the slowest sample (the batch is evaluated until it stops);
* the time relative to the *limit*: plain iteration z <- f(z) for exactly the fewest steps at
  which every sample is within 1e-5, with no check at all (what an oracle that knew the step
  count would pay);
* optimistix's ``FixedPointIteration(rtol=tol, atol=tol)`` at its default settings (``throw``
  on), the fastest peer of ``benchmarks.forward``, where optimistix is installed;
* for ``stop="error"``, how many samples the residual fallback decided (an unreliable rate
  estimate where they stopped) and how many ended over tol with a finite error estimate.

The configurations: each solver with its defaults (the residual rule, judged at every step), with
``stop="error"`` (the error the user asked for), and each of those with ``check_every="auto"``
(judged where the slowest sample is predicted to stop).

Each solver's *oracle* rows: the fewest steps after which every sample's value (the iterate, or
for Picard, which returns one step further, that step) is within tol, found by running the
solver's own steps (``init``, then ``propose``, f and ``record``) for each step count in turn (the
count traced: one compilation). No stopping rule of that solver can return every sample within
tol in fewer steps. (With deqlab's per-sample stopping, the bound is the largest of the samples'
first steps within tol; the script raises if that differs from the batch's, which a sample whose
error leaves tol again could cause.) They are timed twice: deqlab's loop run to that step by a
per-call budget (:class:`deqlab.solvers.Budget`) with an unreachable tolerance, judged at every
step (the cost of the default ``check_every=1``); and the solver's steps alone in a
``fori_loop`` with one residual check at the end (what an ideal rule that judges almost never
would pay). Picard's loop row evaluates f once more, for its step from the iterate (about 1 % of
the time).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

if not __package__:  # run as `python benchmarks/stopping.py`: the repository root is not on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common

SIZES = {"tiny": dict(width=32, batch=8, repeats=2), "quick": dict(width=384, batch=96, repeats=15)}
TOL = 1e-5
MAX_STEPS = 1000
LIMIT = "limit (plain iteration, fewest steps)"
ORACLE_EVERY = " [oracle, judged every step]"
ORACLE_ONCE = " [oracle, judged once]"
ORACLE_SOLVERS = ("picard", "anderson", "broyden")


def configs():
    from deqlab import solvers

    out = {}
    for name, cls in (("picard", solvers.Picard), ("anderson", solvers.Anderson), ("broyden", solvers.Broyden)):
        for stop in ("residual", "error"):
            for every in (1, "auto"):
                label = f"deqlab {name}" + ("" if stop == "residual" else " [error]") + (
                    "" if every == 1 else " [check auto]")
                out[label] = cls(tol=TOL, max_steps=MAX_STEPS, stop=stop, check_every=every)
    return out


def oracle(case, name, tol=TOL, max_steps=MAX_STEPS):
    """The fewest steps after which every sample's value is within ``tol`` (max-abs against
    ``case.reference``), and two functions of (args, steps) that run the solver for exactly that
    many steps: deqlab's loop (judged at every step) and the solver's own steps alone (init, then
    propose, f, record on the flattened ``(B, D)`` rows; one check at the end).

    The step count is found in one compiled scan of ``max_steps`` steps that records each sample's
    error after every step (the value the solver would return there)."""
    import deqlab
    from deqlab import solvers
    from deqlab.solvers import batched_hooks

    solver = solvers.get_solver(name, tol=tol, max_steps=max_steps)
    init, propose, record = batched_hooks(solver)  # the solver's one-sample steps on the batch
    shape = case.z0.shape
    rows = (shape[0], math.prod(shape[1:]))

    def flat_f(z, a):
        return case.f(z.reshape(shape), *a).reshape(rows)

    def returned(z, fz, history):
        if solver.steps_past_convergence:  # Picard returns one step further: z + damping (f(z) - z)
            return propose(z, fz, history)[0]
        return z

    def in_loop(a, k):
        sol = deqlab.solve(case.f, case.z0, *a, solver=solver, batch_axis=0, on_failure="ignore",
                           budget=solvers.Budget(k, jnp.float32(0.0)))
        z = sol.state.z.reshape(rows)  # the last iterate (a failed solve's value is its best)
        return returned(z, flat_f(z, a), sol.state.history).reshape(shape)

    def step(a):
        def one(carry):
            z, fz, history = carry
            z, history = propose(z, fz, history)
            fz = flat_f(z, a)
            return z, fz, record(z, fz, history)
        return one

    def start(a):
        z0 = case.z0.reshape(rows)
        fz0 = flat_f(z0, a)
        return z0, fz0, init(z0, fz0)

    def steps_alone(a, k):
        z, fz, history = jax.lax.fori_loop(0, k, lambda _, c: step(a)(c), start(a))
        # the one check an ideal rule makes: each sample's residual norm
        norms = jnp.linalg.norm(fz - z, axis=1)
        return returned(z, fz, history).reshape(shape), norms

    reference = jnp.asarray(np.asarray(case.reference, np.float64).reshape(rows), case.z0.dtype)

    @jax.jit
    def errors(a):
        def scan_step(carry, _):
            carry = step(a)(carry)
            return carry, jnp.max(jnp.abs(returned(*carry) - reference), axis=1)

        return jax.lax.scan(scan_step, start(a), None, length=max_steps)[1]  # (max_steps, B)

    within = np.asarray(errors(case.args)) <= tol  # float32 against the reference rounded to float32
    every = np.flatnonzero(np.all(within, axis=1))
    if every.size == 0:
        raise RuntimeError(f"{name}: not every sample within {tol:g} after {max_steps} steps")
    k = int(every[0]) + 1
    first = np.argmax(within, axis=0) + 1
    if np.max(first) != k:
        raise RuntimeError(f"{name}: the slowest sample's first step within tol ({np.max(first)}) is not the "
                           f"batch's ({k})")
    return k, in_loop, steps_alone


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="quick")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--no-peers", action="store_true", help="skip optimistix even where installed")
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    repeats = args.repeats or size["repeats"]
    import deqlab

    peers = common.load_peers(disabled=args.no_peers)
    case = common.tanh_case("tanh 1.3", width=size["width"], batch=size["batch"], ensemble="orthogonal", scale=1.3)
    common.header(f"stopping rules at tol={TOL:g}", args.size)
    print(f"   {case.note}, float32; iteration limit {MAX_STEPS}")
    reference = np.asarray(case.reference, np.float64)
    rows, timed = [], {}

    def record(label, fn, steps_of):
        compiled = jax.jit(fn).lower(case.args).compile()
        value, stats = compiled(case.args)
        errors = np.max(np.abs(np.asarray(value, np.float64) - reference), axis=1)
        rows.append(dict(config=label, error=float(np.max(errors)), **steps_of(stats, errors)))
        timed[label] = (compiled, (case.args,))

    def deqlab_steps(stats, errors):
        steps, result, estimate = (np.asarray(a) for a in stats)
        out = dict(steps=int(np.max(steps)), converged=float(np.mean(result == 0)))
        if estimate.ndim:  # stop="error": which samples the residual fallback decided (estimate inf),
            # and how many over tol had a finite estimate (the error rule's own misses)
            out.update(fallback=int(np.sum(np.isinf(estimate))),
                       missed=int(np.sum((errors > TOL) & np.isfinite(estimate))))
        return out

    steps, limit_error = common.limit_steps(case, MAX_STEPS, TOL)
    if limit_error > TOL:
        raise RuntimeError(f"plain iteration does not reach {TOL:g} in {MAX_STEPS} steps")
    record(LIMIT, lambda a: (common.limit_fn(case, steps)(a), None), lambda *_: dict(steps=steps, converged=1.0))
    for label, solver in configs().items():
        def run(a, solver=solver):
            sol = deqlab.solve(case.f, case.z0, *a, solver=solver, batch_axis=0, on_failure="ignore")
            estimate = sol.stats.error_estimate if solver.stop == "error" else jnp.zeros(())
            return sol.value, (sol.stats.steps, sol.result, estimate)

        record(label, run, deqlab_steps)
    for name in ORACLE_SOLVERS:
        steps_needed, in_loop, steps_alone = oracle(case, name)
        for label, run in ((ORACLE_EVERY, in_loop), (ORACLE_ONCE, lambda a, k, f=steps_alone: f(a, k)[0])):
            def run_oracle(a, run=run, k=steps_needed):
                return run(a, jnp.int32(k)), k

            record(f"deqlab {name}{label}", run_oracle,
                   lambda k, _: dict(steps=int(k), converged=float("nan")))  # none "converged": run to the step
    if peers.optimistix is not None:
        optx = peers.optimistix

        def run_optx(a):
            sol = optx.fixed_point(lambda y, a: case.f(y, *a), optx.FixedPointIteration(rtol=TOL, atol=TOL),
                                   case.z0, a, max_steps=MAX_STEPS)
            return sol.value, sol.stats["num_steps"]

        record("optimistix FixedPointIteration", run_optx, lambda s, _: dict(steps=int(s), converged=1.0))
    samples = common.interleaved_times(timed, repeats)
    limit_ms = 1e3 * statistics.median(samples[LIMIT])
    for row in rows:
        row["ms"] = 1e3 * statistics.median(samples[row["config"]])
        row["x limit"] = row["ms"] / limit_ms
        row["within tol"] = row["error"] <= TOL
    peer = next((row for row in rows if row["config"].startswith("optimistix")), None)
    for row in rows:
        row["x optimistix"] = row["ms"] / peer["ms"] if peer else float("nan")
    print(f"{'config':42s} {'error':>9s} {'<=tol':>6s} {'steps':>6s} {'conv':>5s} {'ms':>8s} {'x limit':>8s} "
          f"{'x optx':>7s} {'fallback':>8s} {'missed':>6s}")
    for row in rows:
        extra = (f" {row['fallback']:8d} {row['missed']:6d}" if "fallback" in row else f" {'':8s} {'':6s}")
        print(f"{row['config']:42s} {row['error']:9.2e} {str(row['within tol']):>6s} {row['steps']:6d} "
              f"{row['converged']:5.2f} {row['ms']:8.2f} {row['x limit']:8.2f} {row['x optimistix']:7.2f}{extra}")
    print(f"   fallback: samples of {size['batch']} whose error estimate was unreliable where they stopped (the "
          "residual rule decided; stats.error_estimate inf); missed: samples over tol with a finite estimate")
    print("   oracle: each solver run for exactly the fewest steps after which every sample's value is within tol "
          "(no stopping rule of that solver returns them all within tol sooner): deqlab's loop judged every step, or "
          "the solver's steps alone, checked once at the end")
    return dict(rows=rows, limit_steps=steps)


if __name__ == "__main__":
    with common.jax_session():
        main()
