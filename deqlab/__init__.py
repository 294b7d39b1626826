"""deqlab: deep equilibrium models, their solvers, implicit gradients and random-matrix theory.

Companion package of the book *Equilibrium*. The library (solvers, backward modes, precision,
stability, ensembles, :mod:`deqlab.nn`, :mod:`deqlab.theory`) needs jax, flax, optax, numpy and
scipy; the book's own code, :mod:`deqlab.lab` (experiments, graders, datasets, statistics), needs
the ``lab`` extra (``pip install "deqlab[lab]"``) and is not imported by ``import deqlab``. Paper references in docstrings use the numbering of
the book's sources: 001 (Agarwala & Schoenholz 2022), 002 (Pennington, Schoenholz & Ganguli 2018),
003 (Bai, Kolter & Koltun 2019), 004 (Tsuchida et al. 2022).

The core in five lines::

    sol = deqlab.solve(f, z0, *args, solver=Anderson(m=5), batch_axis=0)   # value, result, stats, state
    sol = deqlab.fixed_point(f, z0, *args, backward=Implicit(solver="gmres"), on_failure="nan")
    jax.grad / jax.jvp / jax.jacfwd / jax.hessian through fixed_point (one implicit rule, both modes)
    deqlab.failures.check(sol)   # raise on failure: eagerly, or inside jit under checkify.checkify
    jax.vmap(lambda d: deqlab.solve(f, z0, x, solver=Picard(damping=d)))(dampings)   # settings trace
    backward = "implicit" | Implicit(...) | Unrolled() | Phantom(steps=5, damping=0.5) | JacobianFree() | SHINE()
    deqlab.stability.spectral_radius(f, z_star, *args, key=key)   # monitor rho(df/dz) at z*
    tol=None follows z0's dtype (float32 1e-5, float64 1e-10); precision=None follows tol (TPUs)
    layer = deqlab.nn.DEQ(TanhCell(64, 16, rngs=rngs), solver="broyden", backward=Implicit())
    class Mine(deqlab.Solver): init(z, fz) -> state; propose(z, fz, state) -> (z_next, state)
"""

from deqlab import (
    backward,
    checks,
    ensembles,
    failures,
    precision,
    solvers,
    stability,
)
from deqlab.backward import (
    GMRES,
    SHINE,
    Backward,
    Implicit,
    JacobianFree,
    Phantom,
    Unrolled,
    check_gradients,
    fixed_point,
)
from deqlab.failures import SolverWarning
from deqlab.solvers import Adaptive, Anderson, Broyden, Picard, Result, Solution, Solver, SolverError, solve

__version__ = "0.9.0"


def __getattr__(name):
    """``deqlab.nn``, ``deqlab.theory`` and ``deqlab.lab`` load on first access (PEP 562): ``import
    deqlab`` stays light, and ``deqlab.lab`` (the book's code, the ``lab`` extra) is loaded only
    by a program that asks for it."""
    if name in ("nn", "theory", "lab"):
        import importlib

        return importlib.import_module(f"deqlab.{name}")
    raise AttributeError(f"module 'deqlab' has no attribute {name!r}")

__all__ = [
    "backward",
    "checks",
    "ensembles",
    "failures",
    "precision",
    "solvers",
    "stability",
    "solve",
    "fixed_point",
    "check_gradients",
    "Solver",
    "Adaptive",
    "Picard",
    "Anderson",
    "Broyden",
    "Backward",
    "GMRES",
    "Implicit",
    "Unrolled",
    "Phantom",
    "JacobianFree",
    "SHINE",
    "Result",
    "Solution",
    "SolverError",
    "SolverWarning",
]
