"""Eager calls: the cost of calling ``deqlab.solve`` and ``deqlab.fixed_point`` outside ``jit``.

Run: ``python -m benchmarks.eager [--size tiny|quick|full] [--repeats R]``.

Problem: z = tanh(W z + x), W a Haar orthogonal matrix at scale 0.5, N = 8 and batch 4 (the 4x8
problem of issue 15, item 4; ``full``: N = 64, batch 32), float32. For each call, timed in the
same process:

* ``first``: the first eager call (tracing and compiling included);
* ``second``: the median of later eager calls with the same function and shapes;
* ``jitted``: the median of calls of the same computation wrapped in one ``jax.jit`` by the
  caller, compiled once beforehand;

for ``solve`` (Anderson), ``fixed_point`` (implicit backward) and ``jax.grad`` of
L = sum(z*^2) through ``fixed_point`` with respect to W. Every result is blocked on. Before the
eager cache (deqlab 0.5.0) every eager call traced and compiled the solver loop again, so
``second`` was close to ``first``; with it, ``second`` is the jit dispatch plus deqlab's Python
checks.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

if not __package__:  # run as `python benchmarks/eager.py`: the repository root is not on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common

SIZES = {"tiny": (4, 8), "quick": (4, 8), "full": (32, 64)}
REPEATS = {"tiny": 3, "quick": 20, "full": 20}


def _tanh_map(z, w, x):
    return jnp.tanh(z @ w.T + x)


def _problem(batch: int, width: int):
    rng = np.random.default_rng(0)
    q, r = np.linalg.qr(rng.standard_normal((width, width)))
    w = jnp.asarray(0.5 * q * np.sign(np.diag(r)), jnp.float32)
    x = jnp.asarray(rng.standard_normal((batch, width)), jnp.float32)
    return jnp.zeros((batch, width), jnp.float32), w, x


def _timed(fn) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def measure(args) -> dict:
    import deqlab

    common.header("eager calls of solve and fixed_point", args.size)
    batch, width = SIZES[args.size]
    repeats = args.repeats or REPEATS[args.size]
    z0, w, x = _problem(batch, width)
    options = dict(solver="anderson", batch_axis=0)

    def run_solve(w, x):
        return deqlab.solve(_tanh_map, z0, w, x, **options).value

    def run_fixed_point(w, x):
        return deqlab.fixed_point(_tanh_map, z0, w, x, **options).value

    def loss(w, x):
        return jnp.sum(deqlab.fixed_point(_tanh_map, z0, w, x, **options).value ** 2)

    run_grad = jax.grad(loss)
    calls = {"solve": run_solve, "fixed_point": run_fixed_point, "grad fixed_point": run_grad}
    print(f"   problem: z = tanh(W z + x), batch {batch}, N {width}, float32, anderson; "
          f"{repeats} timed repeats")
    print(f"   {'call':<18} {'first ms':>10} {'second ms':>10} {'jitted ms':>10} "
          f"{'second/jitted':>14} {'first/second':>13}")
    rows = []
    for name, fn in calls.items():
        first = _timed(lambda: fn(w, x))
        second = statistics.median(_timed(lambda: fn(w, x)) for _ in range(repeats))
        jitted_fn = jax.jit(fn)
        jax.block_until_ready(jitted_fn(w, x))
        jitted = statistics.median(_timed(lambda: jitted_fn(w, x)) for _ in range(repeats))
        rows.append({"call": name, "first": first, "second": second, "jitted": jitted})
        print(f"   {name:<18} {1e3 * first:10.2f} {1e3 * second:10.2f} {1e3 * jitted:10.3f} "
              f"{second / jitted:14.1f} {first / second:13.1f}")
    worst = max(row["second"] for row in rows)
    grad_second = rows[-1]["second"]
    print(f"HEADLINE eager: second eager call <= {1e3 * worst:.1f} ms (grad through fixed_point "
          f"{1e3 * grad_second:.1f} ms, target < 20 ms) on a {batch}x{width} problem")
    return {"rows": rows, "size": (batch, width)}


def main(argv=None) -> dict:
    args = common.parse_args(__doc__.splitlines()[0], argv)
    with common.jax_session():
        return measure(args)


if __name__ == "__main__":
    main(sys.argv[1:])
