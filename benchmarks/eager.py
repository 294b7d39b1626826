"""Eager calls: the cost of calling ``deqlab.solve``, ``deqlab.fixed_point`` and an ``nn.DEQ`` layer outside ``jit``.

Run: ``python -m benchmarks.eager [--size tiny|quick|full] [--repeats R]``.

Problem: z = tanh(W z + x), W a Haar orthogonal matrix at scale 0.5, N = 8 and batch 4 (the 4x8
problem of issue 15, item 4; ``full``: N = 64, batch 32), float32. For each call, timed in the
same process:

* ``first``: the first eager call (tracing and compiling included);
* ``second``: the median of later eager calls with the same function and shapes;
* ``jitted``: the median of calls of the same computation wrapped in one ``jax.jit`` by the
  caller, compiled once beforehand;

for ``solve`` (Anderson), ``fixed_point`` (implicit backward) and ``jax.grad`` of
L = sum(z*^2) through ``fixed_point`` with respect to W; and for a ``deqlab.nn.DEQ`` layer of a
``TanhCell(N, N)`` (its call, and ``nnx.grad`` of the same loss with respect to its parameters;
jitted: ``nnx.jit`` with the layer as an argument). Every result is blocked on. Before the
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
    # A Flax NNX layer, as a reader calls it in a notebook cell: nn.DEQ hands the solver one
    # module-level map of its cell, so its eager calls hit the same cache.
    from flax import nnx

    layer = deqlab.nn.DEQ(deqlab.nn.TanhCell(width, width, rngs=nnx.Rngs(0)))

    def run_layer(w, x):
        return layer(x)

    def layer_loss(model, x):
        return jnp.sum(model(x) ** 2)

    def run_layer_grad(w, x):
        return nnx.grad(layer_loss)(layer, x)

    # The jitted baseline of a layer call passes the layer as an argument of nnx.jit (a module
    # closed over by jax.jit cannot be differentiated by nnx.grad inside it).
    jitted_layer = nnx.jit(lambda model, x: model(x))
    jitted_layer_grad = nnx.jit(lambda model, x: nnx.grad(layer_loss)(model, x))
    calls = {"solve": (run_solve, jax.jit(run_solve)), "fixed_point": (run_fixed_point, jax.jit(run_fixed_point)),
             "grad fixed_point": (run_grad, jax.jit(run_grad)),
             "nn.DEQ layer": (run_layer, lambda w, x: jitted_layer(layer, x)),
             "nnx.grad nn.DEQ": (run_layer_grad, lambda w, x: jitted_layer_grad(layer, x))}
    print(f"   problem: z = tanh(W z + x), batch {batch}, N {width}, float32, anderson; "
          f"{repeats} timed repeats")
    print(f"   {'call':<18} {'first ms':>10} {'second ms':>10} {'jitted ms':>10} "
          f"{'second/jitted':>14} {'first/second':>13}")
    rows = []
    for name, (fn, jitted_fn) in calls.items():
        first = _timed(lambda: fn(w, x))
        second = statistics.median(_timed(lambda: fn(w, x)) for _ in range(repeats))
        jax.block_until_ready(jitted_fn(w, x))
        jitted = statistics.median(_timed(lambda: jitted_fn(w, x)) for _ in range(repeats))
        rows.append({"call": name, "first": first, "second": second, "jitted": jitted})
        print(f"   {name:<18} {1e3 * first:10.2f} {1e3 * second:10.2f} {1e3 * jitted:10.3f} "
              f"{second / jitted:14.1f} {first / second:13.1f}")
    worst = max(row["second"] for row in rows)
    grad_second = next(row["second"] for row in rows if row["call"] == "grad fixed_point")
    print(f"HEADLINE eager: second eager call <= {1e3 * worst:.1f} ms (grad through fixed_point "
          f"{1e3 * grad_second:.1f} ms, target < 20 ms) on a {batch}x{width} problem")
    return {"rows": rows, "size": (batch, width)}


def main(argv=None) -> dict:
    args = common.parse_args(__doc__.splitlines()[0], argv)
    with common.jax_session():
        return measure(args)


if __name__ == "__main__":
    main(sys.argv[1:])
