"""001 Figure 1 at the paper's N: 3 ensembles x 20 values of V, drawing included (issue 17, part 3).

Times ``deqlab.lab.experiments.linear.draw_reduced`` + ``trace_sweep`` (Gaussian: Hutch++, the
book's full-scale method) at N (5000 at ``--size full``), part by part, and the previous method
(``draw`` + the old ``trace_sweep``: ``eigvals`` for the orthogonal matrix, a complex Schur form
and a triangular inverse per V for the Gaussian one, copied below) in the same process at a
smaller ``--base-n``, extrapolated to N by ``n^3`` (every step of the old method is ``O(n^3)``).
The new method is timed at ``--base-n`` too (a ratio at equal N) and the Gaussian estimate is
checked against the exact sweep there (z-scores and relative errors). Target: N = 5000 in at most
2 minutes on the 2-core CI machine.

    python -m benchmarks.fig1_sweep [--size tiny|quick|full] [--base-n 1000] [--probes 48]
"""

from __future__ import annotations

import os
import sys
import time

if __package__ in (None, ""):  # `python benchmarks/fig1_sweep.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import numpy as np
import scipy.linalg

from benchmarks import common
from deqlab.lab.experiments import linear as ex
from deqlab.theory import linear as th

SIZES = {"tiny": (200, 100), "quick": (2000, 600), "full": (5000, 1000)}  # (N, base N)
ENSEMBLES = ("gaussian", "orthogonal", "goe")


def old_trace_sweep(ensemble, w0, vs):
    """The method before issue 17 (deqlab 7b09d8e^^), kept here as the baseline."""
    sv = np.sqrt(np.asarray(vs, dtype=np.float64))
    n = w0.shape[0]
    if ensemble == "goe":
        lam = np.linalg.eigvalsh(w0)
        return np.mean(np.abs(1.0 - sv[:, None] * lam[None, :]) ** -4.0, axis=1)
    if ensemble == "orthogonal":
        lam = np.linalg.eigvals(w0)
        return np.mean(np.abs(1.0 - sv[:, None] * lam[None, :]) ** -4.0, axis=1)
    t, _ = scipy.linalg.schur(w0, output="complex")
    eye = np.eye(n, dtype=complex)
    out = np.empty(len(sv))
    for i, s in enumerate(sv):
        r = scipy.linalg.solve_triangular(eye - s * t, eye, check_finite=False)
        c = r @ r.conj().T
        out[i] = np.sum(np.abs(c) ** 2) / n
    return out


def variances(ensemble, count):
    # the book's grid: delta = 1 - V / V_c log-spaced on [1e-3, 1)
    deltas = np.logspace(-3, 0, count + 1)[:-1]
    return th.critical_variance(ensemble) * (1.0 - deltas)


def run_new(n, count, probes, sketch, seed=0):
    times, values = {}, {}
    for i, e in enumerate(ENSEMBLES):
        t0 = time.perf_counter()
        w0 = ex.draw_reduced(e, jax.random.PRNGKey(seed + i), n)
        t1 = time.perf_counter()
        values[e] = ex.trace_sweep(e, w0, variances(e, count), method="stochastic",
                                   key=jax.random.PRNGKey(100 + seed + i), probes=probes,
                                   sketch=sketch, return_se=True)
        t2 = time.perf_counter()
        times[e] = (t1 - t0, t2 - t1)
    return times, values


def run_old(n, count, seed=0):
    times = {}
    for i, e in enumerate(ENSEMBLES):
        t0 = time.perf_counter()
        w0 = ex.draw(e, jax.random.PRNGKey(seed + i), n, 1)[0]
        t1 = time.perf_counter()
        old_trace_sweep(e, w0, variances(e, count))
        t2 = time.perf_counter()
        times[e] = (t1 - t0, t2 - t1)
    return times


def accuracy(n, count, probes, sketch):
    """Hutch++ against the exact sweep of the same Gaussian matrix at N = n."""
    w0 = ex.draw_reduced("gaussian", jax.random.PRNGKey(7), n)
    vs = variances("gaussian", count)
    exact = ex.trace_sweep("gaussian", w0, vs)
    est, se = ex.trace_sweep("gaussian", w0, vs, method="stochastic", key=jax.random.PRNGKey(8),
                             probes=probes, sketch=sketch, return_se=True)
    return exact, est, se


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=lambda p: (
        p.add_argument("--base-n", type=int, default=None, help="N of the old method's run"),
        p.add_argument("--count", type=int, default=20, help="values of V per ensemble"),
        p.add_argument("--probes", type=int, default=48),
        p.add_argument("--sketch", type=int, default=24)))
    n, base = SIZES[args.size]
    base = args.base_n or base
    previous = bool(jax.config.jax_enable_x64)
    common.header("fig1_sweep: 001 Figure 1, 3 ensembles x %d V" % args.count, args.size)
    print(f"   OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset (all cores)')}")
    try:
        new_base, _ = run_new(base, args.count, args.probes, args.sketch, seed=1)
        old_base = run_old(base, args.count, seed=1)
        t0 = time.perf_counter()
        new_full, values = run_new(n, args.count, args.probes, args.sketch)
        total = time.perf_counter() - t0
        exact, est, se = accuracy(base, args.count, args.probes, args.sketch)
    finally:
        jax.config.update("jax_enable_x64", previous)
    scale = (n / base) ** 3
    rows = []
    for e in ENSEMBLES:
        rows.append({"ensemble": e, f"new draw s (N={n})": new_full[e][0],
                     f"new sweep s (N={n})": new_full[e][1],
                     f"new total s (N={base})": sum(new_base[e]),
                     f"old draw s (N={base})": old_base[e][0], f"old sweep s (N={base})": old_base[e][1],
                     f"old total s, n^3 to N={n}": scale * sum(old_base[e]),
                     "max rel SE": float(np.max(values[e][1] / values[e][0]))})
    print(common.table(rows))
    old_total = scale * sum(sum(t) for t in old_base.values())
    new_base_total = sum(sum(t) for t in new_base.values())
    old_base_total = sum(sum(t) for t in old_base.values())
    z = (est - exact) / se
    print(f"at N = {base}: old method {old_base_total:.2f} s, new {new_base_total:.2f} s "
          f"(ratio new/old {new_base_total / old_base_total:.3f})")
    print(f"Hutch++ ({args.probes} probes, sketch {args.sketch}) against exact, Gaussian, N = {base}, "
          f"{args.count} V: max |z| = {np.max(np.abs(z)):.2f}, RMS z = {np.sqrt(np.mean(z ** 2)):.2f}, "
          f"max relative error {np.max(np.abs(est / exact - 1)):.2e}, max relative SE {np.max(se / exact):.2e}")
    try:
        load = "load average %.1f %.1f %.1f" % os.getloadavg()
    except OSError:  # pragma: no cover
        load = "load average n/a"
    print(f"   end: {load}")
    print(f"HEADLINE fig1_sweep: N = {n}, 3 ensembles x {args.count} V, drawing included: {total:.1f} s "
          f"(target <= 120 s: {'met' if total <= 120 else 'not met'}); old method extrapolated by "
          f"n^3 from N = {base}: {old_total:.0f} s, ratio new/old {total / old_total:.4f}")


if __name__ == "__main__":
    main()
