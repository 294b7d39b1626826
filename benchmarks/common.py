"""Shared pieces of the benchmarks: sizes, problems, float64 references, timing, NFE counting,
compiled memory, tables and the optional peers.

Conventions (see benchmarks/README.md):

* Everything measured is float32 and jit-compiled; the problem data are arguments of the compiled
  function (never closed-over constants that XLA could fold).
* Reference fixed points are computed in float64 with NumPy (dense solves or a NumPy Anderson),
  independently of every library benchmarked, and without switching JAX's x64 mode on.
* :func:`jax_session` switches x64 *off* for the duration of a benchmark (and restores it):
  jaxopt's AndersonAcceleration fails to trace float32 problems while x64 is on (its
  ``lax.cond`` branches disagree, float64 against float32), and the test suite runs with x64 on.
* Wall times: each compiled function is warmed up once, then the configurations of one problem are
  timed in interleaved rounds (round r times every configuration once), so a burst of load from
  other processes hits all of them alike; the median over rounds is reported.
* NFE: evaluations of f on the whole batch, counted at run time by a wrapper around f (a host
  callback, used only in a separate counting run, never in the timed one); Jacobian-vector and
  vector-Jacobian products and GMRES matrix-vector products each count as one evaluation too (they
  cost about as much as f: one matrix product with W).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import importlib.metadata
import math
import os
import re
import statistics
import sys
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

SIZES = ("tiny", "quick", "full")
PEERS = ("jaxopt", "optimistix", "lineax")

# --------------------------------------------------------------------------------------------
# Command line and session


def parse_args(description: str, argv: Sequence[str] | None = None,
               extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """``--size tiny|quick|full``: tiny is a seconds-long correctness run (the CI smoke test),
    quick the default (a few minutes on 2 CPU cores), full the sizes named in the issue.
    ``--no-peers`` runs the deqlab rows only; ``--repeats`` overrides the timing rounds;
    ``--problem NAME`` (repeatable) restricts the benchmarks that have several problems."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--size", choices=SIZES, default="quick")
    parser.add_argument("--no-peers", action="store_true", help="run the deqlab rows only")
    parser.add_argument("--repeats", type=int, default=None, help="timing rounds (default by size)")
    parser.add_argument("--problem", action="append", default=None, metavar="NAME",
                        help="run only this problem (repeatable; default: all problems of the size)")
    if extra is not None:
        extra(parser)
    return parser.parse_args(argv)


@contextlib.contextmanager
def jax_session():
    """Run a benchmark with x64 off (float32 by default), restoring the caller's setting."""
    previous = bool(jax.config.jax_enable_x64)
    jax.config.update("jax_enable_x64", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


def header(title: str, size: str) -> None:
    """Print what runs where: versions, devices and the load of the machine (timings on a loaded
    machine are noisy; the load average says how much)."""
    versions = {"jax": jax.__version__}
    for name in ("deqlab",) + PEERS:
        module = sys.modules.get(name)
        if module is None:
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
        # the module's own __version__ first: an editable install's metadata keeps the version it
        # was installed at (benchmark headers printed "deqlab 0.3.0" for 0.5.0)
        version = getattr(module, "__version__", None)
        if version is None:
            try:
                version = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                version = "?"
        versions[name] = version
    try:
        load = "load average %.1f %.1f %.1f" % os.getloadavg()
    except OSError:  # pragma: no cover - not on every platform
        load = "load average n/a"
    cores = os.cpu_count()
    print(f"== {title} (size={size})")
    print("   " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print(f"   devices: {jax.devices()}, {cores} CPU cores, {load}")


class Peers(NamedTuple):
    """The optional peer libraries (None when not installed or disabled)."""

    jaxopt: Any
    optimistix: Any
    lineax: Any


def load_peers(disabled: bool = False) -> Peers:
    """Import jaxopt, optimistix and lineax if installed; print a note for each one skipped.

    optimistix needs lineax (its linear solvers); without lineax its rows are skipped too."""
    found = {}
    for name in PEERS:
        if disabled:
            found[name] = None
            continue
        try:
            found[name] = importlib.import_module(name)
        except ImportError:
            print(f"note: {name} is not installed; its configurations are skipped "
                  f"(pip install jaxopt optimistix lineax, or pip install -e '.[peers]')")
            found[name] = None
    if disabled:
        print("note: --no-peers: peer configurations are skipped")
    if found["optimistix"] is not None and found["lineax"] is None:
        print("note: optimistix needs lineax for its matrix-free solvers; optimistix skipped")
        found["optimistix"] = None
    return Peers(found["jaxopt"], found["optimistix"], found["lineax"])


# --------------------------------------------------------------------------------------------
# Problems


def tanh_map(z, w, u, b, x):
    """f(z; W, U, b, x) = tanh(z W^T + x U^T + b) (deqlab.lab.experiments.practice.tanh_map)."""
    return jnp.tanh(z @ w.T + x @ u.T + b)


def linear_map(z, w, x):
    """The linear DEQ f(z; W, x) = W z + x on a batch of rows."""
    return z @ w.T + x


class Case(NamedTuple):
    """A benchmark problem: f(z, *args) with float32 data and its float64 reference fixed point."""

    name: str
    f: Callable[..., Any]
    z0: jax.Array
    args: tuple
    reference: np.ndarray
    note: str


def tanh_case(name: str, *, width: int, batch: int, ensemble: str, scale: float,
              input_scale: float = 1.0, in_features: int = 64, seed: int = 0,
              reference: bool = True) -> Case:
    """The tanh DEQ of :func:`deqlab.lab.experiments.practice.tanh_problem` (float32)."""
    from deqlab.lab.experiments import practice

    problem = practice.tanh_problem(jax.random.PRNGKey(seed), width=width, batch=batch,
                                    in_features=in_features, ensemble=ensemble, scale=scale,
                                    input_scale=input_scale, dtype=jnp.float32)
    args = tuple(jnp.asarray(a, jnp.float32) for a in problem.args)
    ref = tanh_reference(*args) if reference else None
    w64 = np.asarray(args[0], np.float64)
    radius = float(np.max(np.abs(np.linalg.eigvals(w64)))) if width <= 1024 else float("nan")
    note = (f"tanh DEQ, W {ensemble} scale {scale} (spectral radius {radius:.4f}), input scale "
            f"{input_scale}, N={width}, batch={batch}")
    return Case(name, tanh_map, jnp.zeros((batch, width), jnp.float32), args, ref, note)


def linear_case(name: str, *, width: int, batch: int, scale: float = 0.49, ensemble: str = "goe",
                seed: int = 0) -> Case:
    """The linear DEQ z = W z + x, W from ``ensemble`` at ``scale`` (GOE: critical scale 0.5).

    x is standard normal, then rescaled so that max |z*| = 1: the target max-abs error is then a
    relative one, and float32 can reach it (the condition number of I - W is ~1 / (1 - rho)).
    """
    from deqlab import ensembles

    k_w, k_x = jax.random.split(jax.random.PRNGKey(seed))
    w = jnp.asarray(ensembles.sample(ensemble, k_w, width, scale, jnp.float32), jnp.float32)
    x = np.asarray(jax.random.normal(k_x, (batch, width), jnp.float32), np.float64)
    w64 = np.asarray(w, np.float64)
    radius = float(np.max(np.abs(np.linalg.eigvalsh(w64)))) if ensemble == "goe" else float(
        np.max(np.abs(np.linalg.eigvals(w64))))
    if radius >= 1:
        raise ValueError(f"linear case: spectral radius {radius:.4f} >= 1, no fixed-point iteration converges")
    z = np.linalg.solve(np.eye(width) - w64, x.T).T
    x32 = jnp.asarray(x / np.max(np.abs(z)), jnp.float32)
    ref = np.linalg.solve(np.eye(width) - w64, np.asarray(x32, np.float64).T).T
    note = (f"linear DEQ z = W z + x, W {ensemble} scale {scale} (critical 0.5; spectral radius "
            f"{radius:.4f}), x rescaled to max|z*| = 1, N={width}, batch={batch}")
    return Case(name, linear_map, jnp.zeros((batch, width), jnp.float32), (w, x32), ref, note)


def transformer_case(name: str, *, width: int, length: int, batch: int, heads: int = 4,
                     in_features: int = 16, seed: int = 0, reference: bool = True) -> Case:
    """The chapter 5 DEQ transformer cell (:class:`deqlab.nn.TransformerCell`, 003 §4) at its
    initialisation, z of shape (batch, length, width), float32.

    The cell's parameters are an argument of f (an ``nnx.State`` pytree), so nothing is folded
    into the compiled solve. Reference: the same cell in float64 (x64 switched on for the call
    only), iterated plainly (no solver of any library) until the update is below 1e-13, polished by
    :func:`numpy_anderson` where 5000 steps do not get there. The cell
    has the attention residual of 003's released code (its default), which puts the Jacobian's
    spectral radius at the equilibrium just below 1 (0.94 and 0.98 for the first two sequences at
    width 32, length 16, seed 0; book chapter 5 page 1): plain iteration converges slowly, where
    at all, and the map is expensive, the case where a solver's steps matter most."""
    from flax import nnx

    from deqlab import nn

    cell = nn.TransformerCell(width, in_features, heads=heads, rngs=nnx.Rngs(seed))
    graphdef, params = nnx.split(cell)
    x = jax.random.normal(jax.random.PRNGKey(seed + 1), (batch, length, in_features), jnp.float32)
    params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), params)

    def cell_map(z, state, inputs):
        return nnx.merge(graphdef, state)(z, inputs)

    ref = None
    if reference:
        previous = bool(jax.config.jax_enable_x64)
        jax.config.update("jax_enable_x64", True)
        try:
            p64 = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), params)
            x64 = jnp.asarray(x, jnp.float64)
            step = jax.jit(lambda z: cell_map(z, p64, x64))
            # Plain iteration first: the cell can have more than one equilibrium (a float64 Anderson
            # from z = 0 found one 0.6 away, max-abs, from the one the iteration and every float32
            # solver reach, width 32, length 8, batch 8), and the benchmark's reference is the
            # equilibrium the iteration is drawn to. Where it crawls (radius near 1) after 5000
            # steps, a float64 NumPy Anderson polishes that iterate to a relative residual of 1e-13.
            z = jnp.zeros((batch, length, width), jnp.float64)
            for _ in range(5000):
                z_next = step(z)
                done = float(jnp.max(jnp.abs(z_next - z))) < 1e-13
                z = z_next
                if done:
                    break
            else:
                shape = (batch, length, width)
                z = numpy_anderson(lambda rows: np.asarray(step(jnp.asarray(rows.reshape(shape))), np.float64).reshape(
                    batch, -1), np.asarray(z, np.float64).reshape(batch, -1), tol=1e-13).reshape(shape)
            ref = np.asarray(z, np.float64)
        finally:
            jax.config.update("jax_enable_x64", previous)
    note = (f"DEQ transformer cell (deqlab.nn.TransformerCell at initialisation), width {width}, "
            f"{heads} heads, hidden {4 * width}, length {length}, batch={batch}")
    return Case(name, cell_map, jnp.zeros((batch, length, width), jnp.float32), (params, x), ref, note)


def limit_steps(case: Case, max_steps: int, target: float) -> tuple[int, float]:
    """The fewest steps of plain iteration z <- f(z) from ``case.z0`` whose iterate is within
    ``target`` (max-abs) of the reference, found by iterating once and checking after every step
    (float32, the reference rounded to float32: 6e-8 at most, far below the target); returns
    (steps, error at that step), or (max_steps, smallest error) when none reaches it."""
    ref = jnp.asarray(case.reference, case.z0.dtype)

    @jax.jit
    def errors(args):
        def step(z, _):
            z = case.f(z, *args)
            return z, jnp.max(jnp.abs(z - ref))

        return jax.lax.scan(step, case.z0, None, length=max_steps)[1]

    errs = np.asarray(errors(case.args), np.float64)
    hits = np.flatnonzero(errs <= target)
    if hits.size == 0:
        return max_steps, float(np.min(errs))
    return int(hits[0]) + 1, float(errs[hits[0]])


def limit_fn(case: Case, steps: int) -> Callable[..., Any]:
    """Plain iteration of f for exactly ``steps`` steps, no checks: the limit of any solver that
    iterates f (what it costs to take the fewest steps that reach the accuracy)."""

    def run(args):
        return jax.lax.fori_loop(0, steps, lambda i, z: case.f(z, *args), case.z0)

    return run


def numpy_anderson(fn: Callable[[np.ndarray], np.ndarray], z0: np.ndarray, *, m: int = 10,
                   tol: float = 1e-13, max_steps: int = 20000) -> np.ndarray:
    """Float64 Anderson acceleration in NumPy, per sample (rows of z0), to relative residual tol.

    Independent of every library benchmarked; raises if it does not converge."""
    z = np.array(z0, np.float64)
    batch, dim = z.shape
    zs = np.zeros((batch, m, dim))
    gs = np.zeros((batch, m, dim))
    fz = fn(z)
    for k in range(max_steps):
        g = fz - z
        res = np.linalg.norm(g, axis=1) / (np.linalg.norm(fz, axis=1) + 1e-300)
        if np.all(res <= tol):
            return fz
        slot = k % m
        zs[:, slot], gs[:, slot] = z, g
        n = min(k + 1, m)
        G = gs[:, :n]
        H = np.einsum("bid,bjd->bij", G, G)
        H += 1e-14 * np.einsum("bii->b", H)[:, None, None] / n * np.eye(n)
        alpha = np.linalg.solve(H, np.ones((batch, n, 1)))[..., 0]
        alpha /= alpha.sum(axis=1, keepdims=True)
        z = np.einsum("bi,bid->bd", alpha, zs[:, :n] + G)
        fz = fn(z)
    raise RuntimeError(f"numpy_anderson: no convergence in {max_steps} steps (residual {res.max():.2e})")


def tanh_reference(w, u, b, x) -> np.ndarray:
    """Float64 fixed point of z = tanh(z W^T + x U^T + b): NumPy Anderson, then Newton steps with
    the dense per-sample Jacobian for N <= 512 (quadratic convergence makes it exact to rounding)."""
    w, u, b, x = (np.asarray(a, np.float64) for a in (w, u, b, x))
    c = x @ u.T + b
    fn = lambda z: np.tanh(z @ w.T + c)  # noqa: E731
    z = numpy_anderson(fn, np.zeros_like(c), tol=1e-12)
    if w.shape[0] <= 512:
        eye = np.eye(w.shape[0])
        for _ in range(3):
            fz = fn(z)
            jac = (1 - fz**2)[:, :, None] * w[None]
            z = z - np.linalg.solve(eye[None] - jac, (z - fz)[..., None])[..., 0]
    residual = np.max(np.abs(fn(z) - z))
    if not residual < 1e-12:
        raise RuntimeError(f"tanh_reference: residual {residual:.2e}")
    return z


def tanh_gradient_reference(z, w, u, b, x) -> dict[str, np.ndarray]:
    """Float64 gradient of L = sum(z*^2) for the tanh DEQ z* = tanh(z* W^T + x U^T + b), from the
    float64 fixed point ``z`` by the implicit function theorem with exact (dense, per-sample) linear
    solves: u = g + J^T u with g = 2 z*, J = diag(s) W, s = 1 - z*^2 (003 Eq. 8, 11); then with
    v = s * u: dL/dW = v^T z*, dL/dU = v^T x, dL/dx = v U, dL/db = sum_batch v."""
    z, w, u, b, x = (np.asarray(a, np.float64) for a in (z, w, u, b, x))
    s = 1 - z**2
    system = np.eye(w.shape[0])[None] - w.T[None] * s[:, None, :]  # I - W^T diag(s_b)
    adjoint = np.linalg.solve(system, (2 * z)[..., None])[..., 0]
    v = s * adjoint
    return {"W": v.T @ z, "U": v.T @ x, "b": v.sum(axis=0), "x": v @ u}


def linear_gradient_reference(z, w, x) -> dict[str, np.ndarray]:
    """Float64 gradient of L = sum(z*^2) for z* = W z* + x: u = (I - W^T)^{-1} 2 z* per sample,
    dL/dW = u^T z*, dL/dx = u."""
    z, w = np.asarray(z, np.float64), np.asarray(w, np.float64)
    adjoint = np.linalg.solve(np.eye(w.shape[0]) - w.T, 2 * z.T).T
    return {"W": adjoint.T @ z, "x": adjoint}


def gradient_reference(case: "Case") -> dict[str, np.ndarray]:
    """The float64 reference gradient of sum(z*^2) for a tanh or linear :class:`Case`."""
    if case.f is tanh_map:
        return tanh_gradient_reference(case.reference, *case.args)
    if case.f is linear_map:
        return linear_gradient_reference(case.reference, *case.args)
    raise ValueError(f"gradient_reference: no reference for the map of case {case.name!r}")


def gradient_names(case: "Case") -> tuple[str, ...]:
    """Names of the arguments of ``case.f`` in order (W, U, b, x or W, x)."""
    return ("W", "U", "b", "x") if case.f is tanh_map else ("W", "x")


def relative_gradient_errors(grads: Sequence[Any], reference: dict[str, np.ndarray],
                             names: Sequence[str]) -> dict[str, float]:
    """||G - G_ref||_F / ||G_ref||_F for each named gradient that has a reference."""
    errors = {}
    for name, grad in zip(names, grads):
        if name in reference:
            ref = reference[name]
            error = float(np.linalg.norm(np.asarray(grad, np.float64) - ref) / np.linalg.norm(ref))
            errors[name] = error if math.isfinite(error) else float("inf")
    return errors


# --------------------------------------------------------------------------------------------
# Tolerance matching


def loosest_passing(grid: Sequence[float], attempt: Callable[[float], dict[str, Any]],
                    exhaustive: bool = False, refine: int = 0) -> dict[str, Any]:
    """The loosest tolerance of ``grid`` (ordered loose to tight) for which ``attempt(tol)["ok"]``.

    ``exhaustive``: walk the grid from loose to tight and stop at the first that passes.
    Otherwise a bisection over the grid, assuming accuracy improves as the tolerance tightens: the
    tolerance returned passes and its looser neighbour in the grid was tried and failed (or it is
    the loosest of the grid), in about log2(len(grid)) attempts instead of up to len(grid).

    ``refine``: then bisect ``refine`` more times, geometrically, between the passing tolerance and
    its failing looser neighbour, so that the tolerance found is the loosest that passes to within
    a factor ``ratio ** (1 / 2**refine)`` of the grid's ratio, not wherever the grid happens to
    fall (a quarter-decade step is 6 Picard iterations at contraction 0.9).

    Returns the passing attempt's dict with ``tried`` (attempts made) added, or, when none passes,
    ``dict(tol=None, error=<smallest "error" seen>, tried=...)``.
    """
    trials: dict[int, dict[str, Any]] = {}

    def run(i):
        if i not in trials:
            trials[i] = attempt(grid[i])
        return trials[i]

    if exhaustive:
        for i in range(len(grid)):
            if run(i)["ok"]:
                return dict(trials[i], tried=len(trials))
    else:
        lo, hi = 0, len(grid)  # every index < lo fails, every index >= hi (< len) passes
        while lo < hi:
            mid = (lo + hi) // 2
            if run(mid)["ok"]:
                hi = mid
            else:
                lo = mid + 1
        if hi < len(grid):
            passing = trials[hi]
            if hi > 0 and refine > 0:
                loose, tight = grid[hi - 1], grid[hi]
                for _ in range(refine):
                    middle = math.sqrt(loose * tight)
                    trial = attempt(middle)
                    if trial["ok"]:
                        passing, tight = trial, middle
                    else:
                        loose = middle
                return dict(passing, tried=len(trials) + refine)
            return dict(passing, tried=len(trials))
    best = min(t["error"] for t in trials.values())
    return dict(tol=None, error=best, tried=len(trials))


# --------------------------------------------------------------------------------------------
# Errors, timing, memory


def max_abs_error(value: Any, reference: np.ndarray) -> float:
    error = float(np.max(np.abs(np.asarray(value, np.float64) - reference)))
    return error if math.isfinite(error) else float("inf")


def compile_fn(fn: Callable[..., Any], *args: Any):
    """``jax.jit(fn)`` lowered and compiled for ``args``; returns (compiled, seconds)."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - start


def interleaved_times(calls: dict[str, tuple[Callable[..., Any], tuple]], repeats: int) -> dict[str, list[float]]:
    """Wall times (seconds) of each compiled call, one warm-up each, then ``repeats`` rounds in
    which every call runs once (so load bursts from other processes hit all of them alike)."""
    for fn, args in calls.values():
        jax.block_until_ready(fn(*args))
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, (fn, args) in calls.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - start)
    return times


def median_time(fn: Callable[[], Any], *, repeats: int = 5) -> float:
    """Median wall time in seconds of ``fn()`` (one warm-up call first)."""
    return statistics.median(interleaved_times({"fn": (fn, ())}, repeats)["fn"])


def temp_bytes(fn: Callable[..., Any], *args: Any) -> int:
    """Temporary memory XLA allocates for ``jit(fn)(*args)``, from the compiled program."""
    return int(jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes)


def largest_array(fn: Callable[..., Any], *args: Any) -> tuple[int, str]:
    """Largest array (number of elements, shape text) in the optimised HLO of ``jit(fn)``: a
    materialised per-sample Jacobian would show up as a (batch, N, N) array."""
    import re

    text = jax.jit(fn).lower(*args).compile().as_text()
    best = (0, "")
    for dtype, dims in re.findall(r"\b(f16|bf16|f32|f64|s32|s64|u32|pred)\[([0-9,]*)\]", text):
        size = int(np.prod([int(d) for d in dims.split(",") if d], dtype=np.int64)) if dims else 1
        if size > best[0]:
            best = (size, f"{dtype}[{dims}]")
    return best


# --------------------------------------------------------------------------------------------
# Counting evaluations of f (separate, un-timed runs)


class Counter:
    """Counts, at run time, evaluations of f and products with its derivatives."""

    def __init__(self):
        self.counts = collections.Counter()

    def reset(self):
        jax.effects_barrier()
        self.counts.clear()

    def read(self) -> dict[str, int]:
        jax.effects_barrier()
        return dict(self.counts)

    def _bump(self, kind):
        def callback(*_):
            self.counts[kind] += 1

        return callback

    def forward(self, f: Callable[..., Any]) -> Callable[..., Any]:
        """f with its evaluations counted; differentiable in forward mode (JVPs are counted by
        :meth:`gmres`, the only place the forward-mode peers use them)."""
        bump = self._bump("f")

        @jax.custom_jvp
        def counted(z, *args):
            jax.debug.callback(bump)
            return f(z, *args)

        @counted.defjvp
        def counted_jvp(primals, tangents):
            jax.debug.callback(bump)
            return jax.jvp(f, primals, tangents)

        return counted

    def reverse(self, f: Callable[..., Any]) -> Callable[..., Any]:
        """f with its evaluations and its vector-Jacobian products counted (reverse mode)."""
        bump_f, bump_vjp = self._bump("f"), self._bump("vjp")

        @jax.custom_vjp
        def counted(z, *args):
            jax.debug.callback(bump_f)
            return f(z, *args)

        def fwd(z, *args):
            jax.debug.callback(bump_f)
            return jax.vjp(f, z, *args)

        def bwd(vjp, cotangent):
            jax.debug.callback(bump_vjp)
            return vjp(cotangent)

        counted.defvjp(fwd, bwd)
        return counted

    def gmres(self, lineax, **options):
        """A ``lineax.GMRES`` whose operator's matrix-vector products are counted (for
        optimistix Newton / Chord, whose Jacobian-vector products happen inside GMRES)."""
        bump = self._bump("matvec")

        class CountingGMRES(lineax.GMRES):
            def compute(self, state, vector, opts):
                operator = state

                def mv(v):
                    jax.debug.callback(bump, jax.tree_util.tree_leaves(v)[0][..., :1])
                    return operator.mv(v)

                wrapped = lineax.FunctionLinearOperator(mv, operator.in_structure())
                return super().compute(wrapped, vector, opts)

        return CountingGMRES(**options)


# --------------------------------------------------------------------------------------------
# Output


def table(rows: list[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A plain-text table with one line per row."""
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
    widths = [max([len(c)] + [len(_fmt(r.get(c))) for r in rows]) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1e4 or abs(value) < 1e-2:
            return f"{value:.2e}"
        return f"{value:.3g}"
    return "" if value is None else str(value)


def short_error(err: BaseException, limit: int = 160) -> str:
    """The first line of an exception, with its type, cut to ``limit`` characters (for tables)."""
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0] if lines else ''}"
    # An error raised inside a host callback (equinox's runtime checks in lineax/optimistix) arrives
    # wrapped, its own message on the last "...Error: " line of the embedded traceback.
    inner = [line.strip() for line in lines[1:] if re.match(r"\s*[\w.]+(Error|Exception): ", line)]
    if inner:
        text = f"{type(err).__name__} from {inner[-1]}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
