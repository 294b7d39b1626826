"""Memory: compiled temporary memory of one training step, implicit against unrolled backward.

Run: ``python -m benchmarks.memory [--size tiny|quick|full]``.

1. A tanh DEQ layer, gradient of sum(z*^2) w.r.t. (W, U, b): implicit backward against backprop
   through L = 10, 25, 50, 100 forward iterations (the forward solve is forced to run exactly L
   Picard steps); the saving at L = 50, and the implicit memory at L = 10 against L = 100.
2. Solver history buffers: the implicit step with Anderson and Broyden must not grow with
   ``max_steps`` (locuslab/deq issue 28). For contrast, jaxopt's Broyden forward solve, which by
   default keeps ``maxiter`` history.

3. No Jacobian materialised: the largest array in the optimised HLO of the implicit gradient, for
   each backward solver, against the size of a per-sample Jacobian (batch, N, N).

Numbers come from ``jax.jit(fn).lower(...).compile().memory_analysis()`` and the compiled HLO text;
no timing.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp

if not __package__:  # run as `python benchmarks/memory.py`: the repository root is not on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import jax_session, largest_array, load_peers, parse_args, table, temp_bytes
from deqlab.backward import Implicit, fixed_point
from deqlab.lab.experiments import practice
from deqlab.solvers import get_solver


def main(argv=None) -> dict:
    args = parse_args(__doc__.splitlines()[0], argv)
    with jax_session():
        return measure(args)


def measure(args) -> dict:
    width, batch = {"tiny": (32, 8), "quick": (256, 128), "full": (1024, 256)}[args.size]
    steps = [10, 25, 50, 100]
    problem = practice.tanh_problem(jax.random.PRNGKey(0), width=width, batch=batch, scale=0.9,
                                    dtype=jnp.float32)
    curves = practice.memory_curve(problem, steps, backwards=("implicit", "unrolled"), solver="picard")
    history = {
        solver: practice.memory_curve(problem, steps, backwards=("implicit",), solver=solver)["implicit"]
        for solver in ("anderson", "broyden")
    }
    rows = []
    for i, length in enumerate(steps):
        rows.append({
            "L": length,
            "unrolled MiB": curves["unrolled"][i] / 2**20,
            "implicit MiB (picard)": curves["implicit"][i] / 2**20,
            "implicit MiB (anderson)": history["anderson"][i] / 2**20,
            "implicit MiB (broyden)": history["broyden"][i] / 2**20,
        })

    jaxopt = load_peers(args.no_peers).jaxopt
    if jaxopt is not None:
        f, z0, params = problem
        for i, length in enumerate(steps):
            solver = jaxopt.Broyden(lambda z, *a: f(z, *a) - z, maxiter=length, tol=1e-30)
            rows[i]["jaxopt Broyden fwd MiB"] = temp_bytes(lambda p: solver.run(z0, *p).params, params) / 2**20

    print(f"size={args.size}: tanh DEQ, width {width}, batch {batch}, float32")
    print(table(rows, list(rows[0])))
    at_50 = steps.index(50)
    saving = 1 - curves["implicit"][at_50] / curves["unrolled"][at_50]
    flatness = {name: values[-1] / values[0] for name, values in
                {"picard": curves["implicit"], **history}.items()}
    print("implicit memory ratio L=100 / L=10:", ", ".join(f"{k} {v:.3f}" for k, v in flatness.items()))
    # No Jacobian materialised: the largest array in the compiled gradient of each default path
    # (implicit backward with the forward solver's adjoint, and with GMRES) against a per-sample
    # Jacobian (batch, N, N).
    f, z0, params = problem
    jacobian_size = batch * width * width
    largest = {}
    for solver in ("picard", "anderson", "broyden", "gmres"):
        forward_solver = "anderson" if solver == "gmres" else solver

        def loss(p, forward_solver=forward_solver, solver=solver):
            z = fixed_point(f, z0, *p, solver=get_solver(forward_solver, max_steps=50), batch_axis=0,
                            backward=Implicit(solver=solver), on_failure="ignore").value
            return jnp.sum(z**2)

        largest[solver] = largest_array(jax.grad(loss), params)
    print(f"largest array in the compiled implicit gradient (a (batch, N, N) Jacobian would have "
          f"{jacobian_size} elements):")
    for solver, (size, shape) in largest.items():
        print(f"  backward {solver}: {shape} ({size} elements, {size / jacobian_size:.3f} of a Jacobian)")
    no_jacobian = all(size < jacobian_size for size, _ in largest.values())
    print(f"HEADLINE memory: implicit backward saves {100 * saving:.1f}% of unrolled at L=50 "
          f"(target >= 90%); flat in L: {max(flatness.values()):.3f} (target <= 1.05); no Jacobian "
          f"materialised: {'yes' if no_jacobian else 'NO'}")
    return {"saving_at_50": saving, "flatness": flatness, "rows": rows, "largest": largest,
            "jacobian_size": jacobian_size}


if __name__ == "__main__":
    main(sys.argv[1:])
