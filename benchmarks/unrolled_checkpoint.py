"""Checkpointed unrolled backprop: compiled memory and time against plain unrolling and implicit.

Run: ``python -m benchmarks.unrolled_checkpoint [--size tiny|quick|full] [--repeats R]``.

Problem: the tanh DEQ z = tanh(W z + U x + b) (W Haar orthogonal at scale 0.9; quick and full:
N = 256, batch 64; tiny: N = 32, batch 8), float32. One compiled training-style step: the forward
solve run for exactly L Picard steps (tol 1e-30, never met) and the gradient of sum(z*^2) w.r.t.
(W, U, b), by

* plain ``Unrolled()``: backprop through the L stored iterations (memory linear in L);
* ``Unrolled(checkpoint="sqrt")``: blocks of k = ceil(sqrt(L)) steps under ``jax.checkpoint``
  (memory ~ L/k + k steps' worth, one more forward pass of f);
* ``Implicit()``: the adjoint fixed point by Picard with the forward settings (so L adjoint steps).

Memory: ``jax.jit(fn).lower(...).compile().memory_analysis().temp_size_in_bytes``. Time: median of
interleaved rounds after a warm-up (benchmarks/common.py). Ratios are against plain unrolling at
the same L, measured in the same process. The checkpointed gradient is also compared with the
plain one (max relative difference), which must be at float32 rounding level.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import warnings

import jax
import jax.numpy as jnp

if not __package__:  # run as `python benchmarks/unrolled_checkpoint.py`: the root is not on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import header, interleaved_times, jax_session, parse_args, table
from deqlab.backward import Implicit, Unrolled, fixed_point
from deqlab.lab.experiments import practice
from deqlab.precision import PrecisionWarning
from deqlab.solvers import Picard

SIZES = {"tiny": (32, 8, (25, 100)), "quick": (256, 64, (25, 100, 400)), "full": (256, 64, (25, 100, 400, 1600))}
MODES = {"plain": Unrolled(), "checkpoint sqrt": Unrolled(checkpoint="sqrt"), "implicit": Implicit()}


def main(argv=None) -> dict:
    args = parse_args(__doc__.splitlines()[0], argv)
    with jax_session():
        return measure(args)


def gradient_step(problem, mode, steps):
    """jit-compiled gradient of sum(z*^2) w.r.t. (W, U, b) with exactly ``steps`` forward steps."""
    f, z0, _ = problem
    solver = Picard(tol=1e-30, max_steps=steps)

    def loss(params, x):
        z = fixed_point(f, z0, *params, x, solver=solver, backward=mode, batch_axis=0,
                        on_failure="ignore").value
        return jnp.sum(z**2)

    return jax.grad(loss)


def measure(args) -> dict:
    width, batch, lengths = SIZES[args.size]
    repeats = args.repeats or {"tiny": 2, "quick": 7, "full": 7}[args.size]
    header("checkpointed unrolled backprop: memory and time", args.size)
    problem = practice.tanh_problem(jax.random.PRNGKey(0), width=width, batch=batch, scale=0.9,
                                    dtype=jnp.float32)
    params, x = tuple(problem.args[:3]), problem.args[3]
    print(f"tanh DEQ, width {width}, batch {batch}, float32, Picard forward for exactly L steps; "
          f"{repeats} timing rounds")
    rows, out = [], {}
    for steps in lengths:
        compiled, memory = {}, {}
        for name, mode in MODES.items():
            with warnings.catch_warnings():  # tol 1e-30 is unreachable on purpose
                warnings.simplefilter("ignore", PrecisionWarning)
                compiled[name] = jax.jit(gradient_step(problem, mode, steps)).lower(params, x).compile()
            memory[name] = int(compiled[name].memory_analysis().temp_size_in_bytes)
        times = interleaved_times({name: (fn, (params, x)) for name, fn in compiled.items()}, repeats)
        seconds = {name: statistics.median(t) for name, t in times.items()}
        plain_grad, checked_grad = compiled["plain"](params, x), compiled["checkpoint sqrt"](params, x)
        difference = max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
                         for a, b in zip(jax.tree_util.tree_leaves(checked_grad), jax.tree_util.tree_leaves(plain_grad)))
        block = math.isqrt(steps - 1) + 1
        rows.append({
            "L": steps,
            "k": block,
            "plain MiB": memory["plain"] / 2**20,
            "ckpt MiB": memory["checkpoint sqrt"] / 2**20,
            "implicit MiB": memory["implicit"] / 2**20,
            "ckpt/plain mem": memory["checkpoint sqrt"] / memory["plain"],
            "implicit/plain mem": memory["implicit"] / memory["plain"],
            "plain ms": 1e3 * seconds["plain"],
            "ckpt ms": 1e3 * seconds["checkpoint sqrt"],
            "implicit ms": 1e3 * seconds["implicit"],
            "ckpt/plain time": seconds["checkpoint sqrt"] / seconds["plain"],
            "implicit/plain time": seconds["implicit"] / seconds["plain"],
            "grad rel diff": difference,
        })
        out[steps] = rows[-1]
    print(table(rows, list(rows[0])))
    last = rows[-1]
    print(f"HEADLINE unrolled_checkpoint: at L={last['L']} checkpointed backprop (k={last['k']}) uses "
          f"{last['ckpt/plain mem']:.3f} of plain unrolling's temp memory at {last['ckpt/plain time']:.2f}x "
          f"its time (implicit: {last['implicit/plain mem']:.3f} of the memory, "
          f"{last['implicit/plain time']:.2f}x the time); gradient difference {last['grad rel diff']:.1e}")
    return {"rows": rows, "by_steps": out}


if __name__ == "__main__":
    main(sys.argv[1:])
