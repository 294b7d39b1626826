"""Forward solve, time to accuracy: deqlab against jaxopt and optimistix.

Run: ``python -m benchmarks.forward [--size tiny|quick|full]``.

Problems (float32; ``full`` is N = 256, batch 128 as in issue 3): a tanh DEQ z = tanh(W z + U x)
with orthogonal W at scale 0.9; the same at scale 0.99 with a small input, where plain iteration
needs hundreds of steps; a linear DEQ z = W z + x with GOE W at 0.49 (critical: 0.5). The
reference fixed point is a float64 Anderson solve to relative residual 1e-13.

Each library measures convergence differently, so each configuration's tolerance is tuned: from
a grid 1e-2 ... 1e-9 we take the loosest tolerance whose result is within max-abs error 1e-5 of
the reference, then report the median wall time of the jit-compiled solve (after warm-up), its
NFE and its error. What the tolerance means in each library:

- deqlab: per-sample relative residual ||f(z) - z|| / ||f(z)|| <= tol; samples stop on their own.
- jaxopt: 2-norm of f(z) - z over the *whole batch* <= tol (one sample's residual hides in the
  batch norm; the batch stops together).
- optimistix: per-element |y_{k+1} - y_k| <= atol + rtol |y| (we set atol = rtol = tol) under its
  default max norm, over the whole batch; ``throw=False`` so a failure does not raise.

NFE is the number of evaluations of f on the batch (optimistix Newton counts steps; each also
costs Jacobian-vector products inside GMRES, listed separately where known).
"""

from __future__ import annotations

import sys

import jax


import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import deqlab  # noqa: E402
from benchmarks.common import median_time, optional, parse_args, table  # noqa: E402
from deqlab import ensembles  # noqa: E402
from deqlab.experiments import practice  # noqa: E402

TOLERANCES = [1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 3e-6, 1e-6, 3e-7, 1e-7, 1e-8, 1e-9]
TARGET_ERROR = 1e-5
MAX_STEPS = 2000


def linear_map(z, w, x):
    return z @ w.T + x


def problems(size):
    width, batch = {"tiny": (32, 8), "quick": (128, 64), "full": (256, 128)}[size]
    key = jax.random.PRNGKey(0)
    out = {}
    for name, scale, input_scale in [("tanh orthogonal 0.9", 0.9, 1.0), ("tanh orthogonal 0.99", 0.99, 0.1)]:
        p = practice.tanh_problem(key, width=width, batch=batch, scale=scale, input_scale=input_scale,
                                  dtype=jnp.float32)
        out[name] = (p.f, p.z0, p.args)
    w = ensembles.sample("goe", key, width, 0.49, jnp.float32)
    x = jax.random.normal(jax.random.PRNGKey(1), (batch, width), jnp.float32)
    out["linear GOE 0.49"] = (linear_map, jnp.zeros((batch, width), jnp.float32), (w, x))
    return out, width, batch


def reference(f, z0, args):
    """Float64 fixed point as a NumPy array. x64 is switched on for this solve only: jaxopt's
    Anderson fails to trace float32 problems while x64 is on (its cond branches disagree)."""
    jax.config.update("jax_enable_x64", True)
    try:
        args64 = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), args)
        sol = deqlab.solve(f, jnp.asarray(z0, jnp.float64), *args64, solver=deqlab.solvers.Anderson(m=20),
                           tol=1e-13, max_steps=20000, batch_axis=0)
        assert bool(sol.converged.all()), "reference solve did not converge"
        return np.asarray(sol.value, np.float64)
    finally:
        jax.config.update("jax_enable_x64", False)


def deqlab_runner(name):
    def make(f, z0, args, tol):
        def run(args):
            sol = deqlab.solve(f, z0, *args, solver=name, tol=tol, max_steps=MAX_STEPS, batch_axis=0)
            return sol.value, sol.stats.nfe
        return jax.jit(run)
    return make


def jaxopt_runner(jaxopt, kind):
    def make(f, z0, args, tol):
        if kind == "FixedPointIteration":
            solver = jaxopt.FixedPointIteration(fixed_point_fun=f, tol=tol, maxiter=MAX_STEPS, implicit_diff=False)
        elif kind == "AndersonAcceleration":
            solver = jaxopt.AndersonAcceleration(fixed_point_fun=f, tol=tol, maxiter=MAX_STEPS, history_size=5,
                                                 ridge=1e-4, implicit_diff=False)
        else:
            solver = jaxopt.Broyden(lambda z, *a: f(z, *a) - z, tol=tol, maxiter=MAX_STEPS, history_size=8,
                                    implicit_diff=False)

        def run(args):
            params, state = solver.run(z0, *args)
            return params, state.iter_num + 1
        return jax.jit(run)
    return make


def optimistix_runner(optx, lineax, kind):
    def make(f, z0, args, tol):
        if kind == "FixedPointIteration":
            solver = optx.FixedPointIteration(rtol=tol, atol=tol)
        else:
            solver = optx.Newton(rtol=tol, atol=tol, linear_solver=lineax.GMRES(rtol=tol, atol=tol, restart=20))

        def run(args):
            sol = optx.fixed_point(lambda y, a: f(y, *a), solver, z0, args, throw=False, max_steps=MAX_STEPS)
            return sol.value, sol.stats["num_steps"] + 1
        return jax.jit(run)
    return make


def tune(make, f, z0, args, ref):
    """Loosest tolerance reaching max-abs error <= TARGET_ERROR, or None."""
    for tol in TOLERANCES:
        run = make(f, z0, args, tol)
        value, nfe = run(args)
        error = float(np.max(np.abs(np.asarray(value, np.float64) - ref)))
        if np.isfinite(error) and error <= TARGET_ERROR:
            return tol, run, int(nfe), error
    return None


def main(argv=None) -> dict:
    options = parse_args(__doc__.splitlines()[0], argv)
    configs = {f"deqlab {n}": deqlab_runner(n) for n in ("picard", "anderson", "broyden")}
    jaxopt = optional("jaxopt")
    if jaxopt is not None:
        for kind in ("FixedPointIteration", "AndersonAcceleration", "Broyden"):
            configs[f"jaxopt {kind}"] = jaxopt_runner(jaxopt, kind)
    optx, lineax = optional("optimistix"), optional("lineax")
    if optx is not None and lineax is not None:
        for kind in ("FixedPointIteration", "Newton+GMRES"):
            configs[f"optimistix {kind}"] = optimistix_runner(optx, lineax, kind)

    cases, width, batch = problems(options.size)
    repeats = 3 if options.size == "tiny" else 7
    rows, ratios = [], {}
    for case, (f, z0, args) in cases.items():
        ref = reference(f, z0, args)
        best = {}
        for config, make in configs.items():
            tuned = tune(make, f, z0, args, ref)
            if tuned is None:
                rows.append({"problem": case, "config": config, "tol": "none reaches 1e-5"})
                continue
            tol, run, nfe, error = tuned
            seconds = median_time(lambda: run(args), repeats=repeats)
            rows.append({"problem": case, "config": config, "tol": tol, "NFE": nfe, "max error": error,
                         "ms": 1e3 * seconds})
            library = config.split()[0]
            if library not in best or seconds < best[library][0]:
                best[library] = (seconds, config, nfe)
        peers = [v for k, v in best.items() if k != "deqlab"]
        if peers and "deqlab" in best:
            peer = min(peers)
            ratios[case] = (best["deqlab"][0] / peer[0], best["deqlab"], peer)
    print(f"size={options.size}: N={width}, batch={batch}, float32, target max-abs error {TARGET_ERROR}")
    print(table(rows, ["problem", "config", "tol", "NFE", "max error", "ms"]))
    for case, (ratio, ours, peer) in ratios.items():
        print(f"{case}: deqlab best {ours[1]} ({1e3 * ours[0]:.2f} ms, NFE {ours[2]}) vs best peer "
              f"{peer[1]} ({1e3 * peer[0]:.2f} ms, NFE {peer[2]}): {ratio:.2f}x")
    if ratios:
        worst = max(r[0] for r in ratios.values())
        print(f"HEADLINE forward: deqlab best / best peer wall time, worst problem = {worst:.2f}x (target <= 0.7x)")
    else:
        print("HEADLINE forward: no peer installed, deqlab rows only")
    return {"rows": rows, "ratios": {k: v[0] for k, v in ratios.items()}}


if __name__ == "__main__":
    main(sys.argv[1:])
