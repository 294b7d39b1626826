"""Probe of the public API with bad inputs and faults: every one gives a clear error or a reported
failure, none is silent, none is unclear (issue "[5/13] deqlab core hardening").

Each row of :data:`PROBES` is one bad call and the outcome it must have:

- ``error``: a ``ValueError`` (``TypeError`` where Python itself is the natural signal) whose
  message names the offending argument (``arg``, a regex: the name in backticks, or the parameter
  name) and says what is valid (``valid``, a regex such as "must be", "one of", ">=").
  Any other exception, or a message that does not name the argument, is UNCLEAR; no exception
  at all is SILENT.
- ``reported``: the call does not raise an argument error but reports the failure: a warning of
  a named category (``warns``: :class:`deqlab.backward.BackwardWarning`,
  :class:`deqlab.precision.PrecisionWarning`), a failure exception (``raises``:
  :class:`deqlab.solvers.SolverError`, :class:`~deqlab.theory.freeprob.ConvergenceError`), or a
  returned object that carries it (``check``: a per-sample ``Solution.result`` that is not
  ``SUCCESS``, a NaN gradient with ``on_failure="nan"``, a NaN statistic).

A probe that shows a silent or unclear failure keeps its correct expectation and is marked
``xfail(strict=True)`` with the observed behaviour, until the owner of the module fixes it.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import deqlab
from deqlab import checks, ensembles, nonlinearities, precision, solvers
from deqlab.backward import (
    BackwardWarning,
    Implicit,
    Phantom,
    Unrolled,
    adjoint_solve,
    check_gradients,
    fixed_point,
)
from deqlab.lab import data, stats
from deqlab.lab.experiments import config
from deqlab.nn import DEQ, ResNetCell, TanhCell
from deqlab.precision import PrecisionWarning
from deqlab.solvers import Anderson, Broyden, Picard, Result, SolverError, solve
from deqlab.theory import freeprob as fp
from deqlab.theory import linear

MODULES = (
    "checks",
    "solvers",
    "implicit",
    "precision",
    "nn.deq",
    "nn.cells",
    "ensembles",
    "data",
    "stats",
    "nonlinearities",
    "theory.linear",
    "theory.freeprob",
    "experiments.config",
)

VALID = (
    r"must be|must have|must hold|must contain|must return|must map|one of|>=|<=|> 0|range|valid values|"
    r"required|at least|inputs must be"
)
"""Default regex for "the message says what is valid"."""

NAN = float("nan")
INF = float("inf")


@dataclasses.dataclass(frozen=True)
class Probe:
    name: str
    module: str
    call: Callable[[], Any]
    outcome: str  # "error" or "reported"
    arg: str | None = None  # error: regex that names the argument
    valid: str = VALID  # error: regex that says what is valid
    exc: type = ValueError  # error: the exception type expected
    warns: type | None = None  # reported: warning category
    raises: type | None = None  # reported: failure exception
    match: str | None = None  # reported: regex on the warning / failure message
    check: Callable[[Any], bool] | None = None  # reported: predicate on the returned object
    env: dict | None = None  # environment variables set (monkeypatch) around the call
    xfail: str | None = None  # observed silent / unclear behaviour, until the owner fixes it
    float64: bool = False  # run with x64 on (tests/conftest.py): the probe is about float64 itself


def E(name, module, call, arg, valid=VALID, exc=ValueError, xfail=None, env=None):
    """An ``error`` probe; ``arg`` is a bare argument name (matched in backticks) or ``re:...``."""
    pattern = arg[3:] if arg.startswith("re:") else "`" + re.escape(arg) + "`"
    return Probe(name, module, call, "error", arg=pattern, valid=valid, exc=exc, xfail=xfail, env=env)


def R(name, module, call, *, warns=None, raises=None, match=None, check=None, xfail=None, env=None,
      float64=False):
    """A ``reported`` probe."""
    assert warns or raises or check, name
    return Probe(name, module, call, "reported", warns=warns, raises=raises, match=match, check=check,
                 xfail=xfail, env=env, float64=float64)


# ---------------------------------------------------------------------------------------------
# Small problems shared by the probes (built inside the calls: collection stays cheap)

KEY = jax.random.key(0)


def _near_critical(n=4):
    """An orthogonal 0.99 linear DEQ: Picard cannot reach tol=1e-10 in 3 steps."""
    w = ensembles.sample("orthogonal", KEY, n, 0.99, jnp.float64)
    return (lambda z, w, x: w @ z + x), w, jnp.ones(n)


def _forward_failure(mode, policy):
    """Gradient through a fixed point whose forward solve fails (3 Picard steps, tol 1e-10)."""
    f, w, x = _near_critical()

    def loss(w):
        sol = fixed_point(f, jnp.zeros(4), w, x, solver=deqlab.Picard(tol=1e-10, max_steps=3),
                          backward=mode(), on_failure=policy)
        return jnp.sum(sol.value)

    return lambda: jax.block_until_ready(jax.grad(loss)(w))


def _forward_failure_solution(mode, policy="ignore"):
    """The forward solve of :func:`_forward_failure` on concrete values (no gradient)."""
    f, w, x = _near_critical()
    return lambda: fixed_point(f, jnp.zeros(4), w, x, solver=deqlab.Picard(tol=1e-10, max_steps=3),
                               backward=mode(), on_failure=policy)


def _phantom(**kw):
    return Phantom(steps=2, **kw)


_BACKWARDS = {"implicit": Implicit, "unrolled": Unrolled, "phantom": _phantom}


def _singular_adjoint_grad(backward, on_failure="warn"):
    """f(z) = z (J = I): the forward solve succeeds at z0, the adjoint (I - J^T) u = g is singular."""
    f = lambda z, x: z * 1.0 + 0.0 * jnp.tanh(x)  # noqa: E731
    loss = lambda x: jnp.sum(fixed_point(f, jnp.ones(3), x, solver=deqlab.Anderson(max_steps=10), backward=backward,  # noqa: E731
                                         on_failure=on_failure).value ** 2)
    return lambda: jax.block_until_ready(jax.grad(loss)(jnp.ones(3)))


def _starved_adjoint():
    """Contractive tanh map: the forward solve converges, the adjoint gets 1 step. The adjoint runs
    inside the gradient's program (an eager jax.grad traces fixed_point): "callback" reports it."""
    _, w, x = _near_critical()
    f = lambda z, w, x: jnp.tanh(0.5 * w @ z + x)  # noqa: E731
    backward = Implicit(max_steps=1)
    loss = lambda w: jnp.sum(fixed_point(f, jnp.zeros(4), w, x, solver="picard", backward=backward,  # noqa: E731
                                         on_failure="callback").value ** 2)
    return jax.block_until_ready(jax.grad(loss)(w))


def _nan_for_first_sample(z, a):
    """Sample 0 (a > 0) runs into NaN after 4 steps; sample 1 contracts to 0.2."""
    return jnp.where(a[:, None] > 0, jnp.where(z > 1.0, jnp.nan, z + 0.3), 0.5 * z + 0.1)


@functools.lru_cache(maxsize=None)
def _cell(width=8, in_features=3):
    """One cell per process (a DEQ never modifies its cell unless given param_dtype)."""
    return TanhCell(width, in_features, rngs=nnx.Rngs(0))


def _x(batch=2, features=3, dtype=jnp.float32):
    return jnp.ones((batch, features), dtype)


class _ZeroWidthCell(nnx.Module):
    def __init__(self):
        self.width = 0

    def __call__(self, z, x):
        return z


def _emulated_dot(precision_value):
    a = jnp.ones((2, 2), jnp.float32)
    with precision.emulate_accelerator_matmuls():
        return precision.dot_general(a, a, (((1,), (0,)), ((), ())), precision=precision_value)


def _enter(context):
    with context:
        return None


def _grid():
    lam = np.linspace(-2.0, 2.0, 401)
    return lam, fp.Semicircle(0.5).density(lam)


def _half(x):
    return 0.5 * x


def _is(result, *codes):
    return set(np.atleast_1d(np.asarray(result)).tolist()) <= {int(c) for c in codes}


def _all_nan(tree):
    return all(bool(jnp.all(jnp.isnan(leaf))) for leaf in jax.tree_util.tree_leaves(tree))


def _all_zero(tree):
    return all(bool(jnp.all(leaf == 0)) for leaf in jax.tree_util.tree_leaves(tree))


# ---------------------------------------------------------------------------------------------
# The table

PROBES: list[Probe] = [
    # ----------------------------------------------------------------------------- checks
    E("checks-integer-bool", "checks", lambda: checks.integer(True, "n", minimum=1), "n"),
    E("checks-integer-above-maximum", "checks", lambda: checks.integer(np.int64(5), "power", maximum=3), "power",
      valid=r"<= 3"),
    E("checks-number-nan", "checks", lambda: checks.number(NAN, "tol"), "tol", valid=r"must be a finite real"),
    E("checks-number-complex", "checks", lambda: checks.number(1 + 2j, "ridge"), "ridge", valid=r"real number"),
    E("checks-number-vector", "checks", lambda: checks.number(np.ones(2), "scale"), "scale"),
    E("checks-number-traced", "checks", lambda: jax.jit(lambda v: checks.number(v, "tol"))(1.0), "tol",
      valid=r"known outside jit"),
    E("checks-unit-interval-zero", "checks", lambda: checks.unit_interval(0.0, "damping"), "damping",
      valid=r"> 0 and <= 1"),
    E("checks-choice-none", "checks", lambda: checks.choice(None, "mode", ("a", "b")), "mode", valid=r"one of 'a', 'b'"),
    E("checks-dtype-complex", "checks", lambda: checks.floating_dtype(jnp.complex64), "dtype",
      valid=r"real floating-point"),
    E("checks-dtype-garbage", "checks", lambda: checks.floating_dtype("not-a-dtype", "param_dtype"), "param_dtype",
      valid=r"real floating-point"),
    E("checks-key-int32-pair", "checks", lambda: checks.prng_key(jnp.zeros(2, jnp.int32)), "key",
      valid=r"PRNG key"),
    E("checks-key-batch-of-keys", "checks", lambda: checks.prng_key(jax.random.split(KEY, 2)), "key",
      valid=r"single PRNG key"),
    # ----------------------------------------------------------------------------- solvers: configurations
    E("anderson-m-float", "solvers", lambda: Anderson(m=2.5), "m", valid=r"integer >= 1"),
    E("anderson-ridge-nan", "solvers", lambda: Anderson(ridge=NAN), "ridge", valid=r">= 0"),
    E("broyden-step-above-one", "solvers", lambda: Broyden(step=2.0), "step", valid=r"<= 1"),
    E("picard-tol-inf", "solvers", lambda: Picard(tol=INF), "tol", valid=r"finite real number > 0"),
    E("picard-divergence-factor-one", "solvers", lambda: Picard(divergence_factor=1.0), "divergence_factor",
      valid=r"> 1"),
    E("get-solver-override", "solvers", lambda: solvers.get_solver(Anderson(), max_steps=-1), "max_steps",
      valid=r">= 1"),
    # ----------------------------------------------------------------------------- solvers: solve arguments
    E("solve-solver-class-not-instance", "solvers", lambda: solve(_half, jnp.ones(3), solver=Anderson), "solver"),
    E("solve-tol-string", "solvers", lambda: solve(_half, jnp.ones(3), solver=deqlab.Anderson(tol="1e-3")), "tol"),
    E("solve-max-steps-bool", "solvers", lambda: solve(_half, jnp.ones(3), solver=deqlab.Anderson(max_steps=True)), "max_steps"),
    E("solve-batch-axis-bool", "solvers", lambda: solve(_half, jnp.ones((2, 3)), batch_axis=True), "batch_axis",
      valid=r"int or None"),
    E("solve-batch-axis-scalar-z0", "solvers", lambda: solve(_half, jnp.zeros(()), batch_axis=0), "batch_axis",
      valid=r"must index an axis"),
    E("solve-batch-axis-mixed-ranks", "solvers",
      lambda: solve(lambda z: z, {"a": jnp.zeros((2, 3)), "b": jnp.zeros(2)}, batch_axis=1), "batch_axis",
      valid=r"must index an axis"),
    E("solve-batch-sizes-disagree", "solvers",
      lambda: solve(lambda z: z, {"a": jnp.zeros((2, 3)), "b": jnp.zeros((3, 3))}, batch_axis=0), "z0",
      valid=r"disagree"),
    E("solve-has-aux-string", "solvers", lambda: solve(_half, jnp.ones(3), has_aux="yes"), "has_aux",
      valid=r"True or False"),
    E("solve-precision-int", "solvers", lambda: solve(_half, jnp.ones(3), precision=3), "precision"),
    E("solve-z0-none", "solvers", lambda: solve(lambda z: z, None), "z0", valid=r"at least one array"),
    E("solve-z0-empty-dict", "solvers", lambda: solve(lambda z: z, {}), "z0", valid=r"at least one array"),
    E("solve-z0-python-float", "solvers", lambda: solve(_half, 0.0), "z0", valid=r"array or a pytree of arrays"),
    E("solve-z0-complex", "solvers", lambda: solve(_half, jnp.ones(3, jnp.complex64)), "z0",
      valid=r"real floating-point"),
    E("solve-z0-int", "solvers", lambda: solve(_half, jnp.ones(3, jnp.int32)), "z0", valid=r"real floating-point"),
    E("solve-z0-inf", "solvers", lambda: solve(_half, jnp.array([0.0, INF])), "z0", valid=r"must be finite"),
    E("solve-z0-no-entries", "solvers", lambda: solve(_half, jnp.zeros(0)), "z0"),
    E("solve-args-nan-in-pytree", "solvers",
      lambda: solve(lambda z, p: 0.5 * z + p["b"], jnp.ones(2), {"b": jnp.array([1.0, NAN])}), "args[0]['b']",
      valid=r"must be finite"),
    E("solve-f-none", "solvers", lambda: solve(None, jnp.ones(3)), "f", valid=r"must be callable"),
    E("solve-f-wrong-arity", "solvers", lambda: solve(lambda z: z, jnp.ones(3), 1.0), "f",
      valid=r"could not be evaluated as f\(z0, \*args\)"),
    E("solve-f-raises-valueerror", "solvers",
      lambda: solve(lambda z: (_ for _ in ()).throw(ValueError("boom")), jnp.ones(3)), "f",
      valid=r"could not be evaluated.*boom"),
    E("solve-f-returns-dict", "solvers", lambda: solve(lambda z: {"z": z}, jnp.ones(2)), "f",
      valid=r"same pytree structure"),
    E("solve-f-returns-wrong-shape", "solvers", lambda: solve(lambda z: z[:, None], jnp.ones(2)), "f",
      valid=r"same shape"),
    E("solve-f-returns-complex", "solvers", lambda: solve(lambda z: 0.5 * z * (1 + 1j), jnp.ones(3), solver="picard"), "f",
      valid=r"real"),
    E("solve-init-state-other-shape", "solvers",
      lambda: solve(_half, jnp.ones(5), init_state=solve(_half, jnp.ones(4), solver="picard").state), "init_state"),
    E("solve-on-failure-unknown", "solvers", lambda: solve(_half, jnp.ones(3), on_failure=True), "on_failure",
      valid=r"one of 'warn', 'raise', 'nan', 'ignore'"),
    # ----------------------------------------------------------------------------- solvers: reported failures
    R("solve-max-steps-per-sample", "solvers",
      lambda: solve(lambda z, a: a * z + 1, jnp.zeros(2), jnp.array([0.5, 0.9999]), batch_axis=0, solver=deqlab.Picard(max_steps=50)).result,
      check=lambda r: r.tolist() == [Result.SUCCESS, Result.MAX_STEPS_REACHED]),
    R("solve-divergence", "solvers", lambda: solve(lambda z: 2 * z + 1, jnp.zeros(3), solver=deqlab.Picard(max_steps=40)).result,
      check=lambda r: int(r) == Result.DIVERGED),
    R("solve-nan-mid-solve", "solvers",
      lambda: solve(lambda z: jnp.where(z > 2.0, NAN, z + 0.5), jnp.zeros(2), solver=deqlab.Picard(max_steps=20)),
      check=lambda s: int(s.result) == Result.NONFINITE and bool(jnp.all(jnp.isfinite(s.value)))),
    R("solve-inf-at-z0", "solvers", lambda: solve(lambda z: z / 0.0, jnp.ones(2), solver=deqlab.Picard(max_steps=10)).result,
      check=lambda r: int(r) == Result.NONFINITE),
    R("solve-raise-lists-samples", "solvers",
      lambda: solve(lambda z: 2 * z + 1, jnp.zeros(3), solver=deqlab.Picard(max_steps=40), on_failure="raise"),
      raises=SolverError, match=r"failed for 1/1 samples: sample 0: diverged"),
    R("solve-unreachable-tol-float64", "solvers",
      lambda: solve(lambda z: 0.5 * z + 1, jnp.zeros(2), solver=deqlab.Picard(tol=1.7e-300, max_steps=10)).result,
      warns=PrecisionWarning, match=r"below what float64 can reach",
      check=lambda r: int(r) == Result.MAX_STEPS_REACHED, float64=True),
    R("solve-unreachable-tol-bfloat16", "solvers",
      lambda: solve(lambda z: 0.5 * z + 1, jnp.ones(4, jnp.bfloat16), solver=deqlab.Picard(tol=1.3e-6, max_steps=5)),
      warns=PrecisionWarning, match=r"below what bfloat16 can reach"),
    R("solve-unreachable-tol-float16", "solvers",
      lambda: solve(lambda z: 0.5 * z + 1, jnp.ones(2, jnp.float16), solver=deqlab.Picard(tol=1.9e-5, max_steps=5)),
      warns=PrecisionWarning, match=r"below what float16 can reach"),
    # f(z) = z + 1 has no fixed point. The tolerance is relative (module docstring of solvers): at
    # tol = 1e-2 an unbounded iterate meets it once |z| > 99, documented; at the default it fails.
    R("solve-fixed-point-free-map", "solvers",
      lambda: solve(lambda z: z + 1.0, jnp.zeros(1), solver=deqlab.Picard(max_steps=200)).result,
      check=lambda r: int(r) != Result.SUCCESS),
    # ----------------------------------------------------------------------------- implicit: arguments
    E("fixed-point-backward-class", "implicit", lambda: fixed_point(_half, jnp.ones(3), backward=Implicit),
      "backward"),
    E("fixed-point-backward-none", "implicit", lambda: fixed_point(_half, jnp.ones(3), backward=None), "backward"),
    E("implicit-solver-int", "implicit", lambda: Implicit(solver=3), "solver"),
    E("fixed-point-on-failure-case", "implicit", lambda: fixed_point(_half, jnp.ones(3), on_failure="NaN"),
      "on_failure", valid=r"one of 'warn', 'raise', 'nan', 'ignore'"),
    E("implicit-tol-nan", "implicit", lambda: Implicit(tol=NAN), "tol"),
    E("phantom-steps-float", "implicit", lambda: Phantom(steps=2.5), "steps", valid=r"integer >= 1"),
    E("phantom-damping-nan", "implicit", lambda: Phantom(damping=NAN), "damping"),
    E("deq-on-failure-bool", "implicit", lambda: DEQ(_cell(), on_failure=True), "on_failure"),
    E("fixed-point-f-not-callable", "implicit", lambda: fixed_point("f", jnp.ones(3)), "f",
      valid=r"must be callable"),
    E("fixed-point-z0-int", "implicit", lambda: fixed_point(_half, jnp.ones(3, jnp.int32)), "z0"),
    E("fixed-point-has-aux-triple", "implicit",
      lambda: fixed_point(lambda z: (z, 1.0, 2.0), jnp.ones(2), has_aux=True), "re:`has_aux(=True)?`",
      valid=r"must return a pair"),
    E("fixed-point-init-state-string", "implicit", lambda: fixed_point(_half, jnp.ones(2), init_state="x"),
      "init_state"),
    E("adjoint-args-list", "implicit",
      lambda: adjoint_solve(lambda z, a: 0.5 * z + a, jnp.ones(3), [jnp.ones(3)], jnp.ones(3)), "args",
      valid=r"must be a tuple"),
    E("adjoint-cotangent-structure", "implicit",
      lambda: adjoint_solve(lambda z, a: 0.5 * z + a, jnp.ones(3), (jnp.ones(3),), {"g": jnp.ones(3)}),
      "cotangent", valid=r"structure and shapes"),
    E("adjoint-solver-unknown", "implicit",
      lambda: adjoint_solve(lambda z, a: 0.5 * z + a, jnp.ones(3), (jnp.ones(3),), jnp.ones(3), solver="bicgstab"),
      "solver"),
    E("adjoint-gmres-max-steps-zero", "implicit",
      lambda: adjoint_solve(lambda z, a: 0.5 * z + a, jnp.ones(3), (jnp.ones(3),), jnp.ones(3), solver=deqlab.GMRES(max_steps=0)), "max_steps"),
    E("check-gradients-int-seed", "implicit",
      lambda: check_gradients(lambda z, a: 0.5 * z + a, jnp.zeros(3), jnp.ones(3), key=0, solver="picard",
                              max_steps=5), "key",
      valid=r"not an int seed"),
    E("check-gradients-eps-nan", "implicit",
      lambda: check_gradients(lambda z, a: 0.5 * z + a, jnp.zeros(3), jnp.ones(3), eps=NAN), "eps"),
    E("check-gradients-backward-unknown", "implicit",
      lambda: check_gradients(lambda z, a: 0.5 * z + a, jnp.zeros(3), jnp.ones(3), backward="adjoint"),
      "backward"),
    # ----------------------------------------------------------------------------- implicit: reported failures
    *[
        # an eager jax.grad traces fixed_point: "callback" is the policy that warns from there
        R(f"forward-failure-{mode}-callback", "implicit", _forward_failure(cls, "callback"), warns=BackwardWarning,
          match=r"forward solve did not converge")
        for mode, cls in _BACKWARDS.items()
    ],
    *[
        # the failed sample's value is NaN (the loss is NaN), and no gradient flows through it
        R(f"forward-failure-{mode}-nan", "implicit", _forward_failure(cls, "nan"), check=_all_zero)
        for mode, cls in _BACKWARDS.items()
    ],
    *[
        # Under grad the values are traced: the error comes back from a host callback, wrapped.
        R(f"forward-failure-{mode}-raise", "implicit", _forward_failure(cls, "raise"), raises=Exception,
          match=r"forward solve failed for 1/1 samples")
        for mode, cls in _BACKWARDS.items()
    ],
    *[
        R(f"forward-failure-{mode}-ignore", "implicit", _forward_failure_solution(cls),
          check=lambda s: int(s.result) == Result.MAX_STEPS_REACHED)
        for mode, cls in _BACKWARDS.items()
    ],
    R("forward-failure-raise-concrete", "implicit",
      lambda: _forward_failure_solution(Unrolled, "raise")(),
      raises=SolverError, match=r"forward solve failed for 1/1 samples: sample 0: max_steps_reached"),
    R("nan-mid-solve-only-failing-sample-nan", "implicit",
      lambda: fixed_point(_nan_for_first_sample, jnp.zeros((2, 3)), jnp.array([1.0, -1.0]), batch_axis=0,
                          solver=deqlab.Picard(max_steps=60), on_failure="nan").value,
      check=lambda v: bool(jnp.all(jnp.isnan(v[0]))) and bool(jnp.allclose(v[1], 0.2))),
    R("adjoint-starved-warns", "implicit", _starved_adjoint, warns=BackwardWarning,
      match=r"adjoint solve did not converge"),
    R("singular-adjoint-picard-nan", "implicit",
      _singular_adjoint_grad(Implicit(solver="picard"), "nan"), check=_all_nan),
    R("singular-adjoint-gmres-raise", "implicit",
      _singular_adjoint_grad(Implicit(solver="gmres"), "raise"), raises=Exception,
      match=r"adjoint solve failed for 1/1 samples"),
    R("adjoint-solve-nan-cotangent", "implicit",
      lambda: adjoint_solve(lambda z, a: 0.5 * z + a, jnp.ones(3), (jnp.ones(3),), jnp.full(3, NAN), solver="picard").result,
      check=lambda r: int(r) == Result.NONFINITE),
    R("adjoint-solve-singular-gmres", "implicit",
      lambda: adjoint_solve(lambda z, a: z + 0 * a, jnp.ones(3), (jnp.ones(3),), jnp.ones(3), solver="gmres").result,
      check=lambda r: int(r) != Result.SUCCESS),
    # ----------------------------------------------------------------------------- precision
    E("default-tol-int", "precision", lambda: precision.default_tol(jnp.int32), "dtype",
      valid=r"real floating-point"),
    E("default-tol-complex-name", "precision", lambda: precision.default_tol("complex64"), "dtype",
      valid=r"real floating-point"),
    E("attainable-tol-garbage", "precision", lambda: precision.attainable_tol("foo"), "dtype"),
    E("check-tol-int-dtype", "precision", lambda: precision.check_tol(1e-3, jnp.int32), "dtype"),
    E("check-precision-none", "precision", lambda: precision.check_precision(None), "precision",
      valid=r"one of 'default', 'high', 'highest'"),
    E("check-precision-unknown", "precision", lambda: precision.check_precision("float8"), "precision",
      valid=r"one of 'default', 'high', 'highest'"),
    E("matmul-precision-unknown", "precision", lambda: _enter(precision.matmul_precision("ultra")), "precision"),
    E("emulated-dot-general-unknown", "precision", lambda: _emulated_dot("bad"), "precision"),
    R("check-tol-below-float32", "precision", lambda: precision.check_tol(1.23e-11, jnp.float32),
      warns=PrecisionWarning, match=r"tol=1.23e-11 is below what float32 can reach"),
    E("required-precision-nan-tol", "precision", lambda: precision.required_precision(NAN, jnp.float32), "tol"),
    E("required-precision-int-dtype", "precision", lambda: precision.required_precision(1e-3, jnp.int32),
      "dtype"),
    E("check-tol-negative", "precision", lambda: precision.check_tol(-1.0, jnp.float32), "tol",
      valid=r"> 0"),
    E("deq-cell-zero-width", "nn.deq", lambda: DEQ(_ZeroWidthCell()), "cell.width", valid=r"integer >= 1"),
    E("deq-batch-axis-float", "nn.deq", lambda: DEQ(_cell(), batch_axis=1.5), "batch_axis"),
    E("deq-backward-class", "nn.deq", lambda: DEQ(_cell(), backward=Phantom), "backward"),
    E("deq-tol-negative", "nn.deq", lambda: DEQ(_cell(), tol=-1e-3), "tol"),
    E("deq-dtype-complex", "nn.deq", lambda: DEQ(_cell(), dtype=jnp.complex64), "dtype"),
    E("deq-param-dtype-int", "nn.deq", lambda: DEQ(_cell(), param_dtype=jnp.int8), "param_dtype"),
    E("deq-x-rank-1", "nn.deq", lambda: DEQ(_cell())(jnp.ones(3)), "x", valid=r"must have a batch axis"),
    E("deq-x-wrong-width", "nn.deq", lambda: DEQ(_cell())(_x(features=5)), "x", valid=r"must have 3 features"),
    E("deq-x-complex", "nn.deq", lambda: DEQ(_cell())(_x(dtype=jnp.complex64)), "x",
      valid=r"real floating-point"),
    E("deq-x-list", "nn.deq", lambda: DEQ(_cell())([[1.0, 2.0, 3.0]]), "x", valid=r"must be an array"),
    E("deq-x-batch-axis-is-feature-axis", "nn.deq", lambda: DEQ(_cell(), batch_axis=-1)(_x()), "x",
      valid=r"must have a batch axis"),
    E("deq-z0-wrong-shape", "nn.deq", lambda: DEQ(_cell())(_x(), jnp.zeros(8)), "z0",
      valid=r"must have shape \(2, 8\)"),
    E("deq-x-nan", "nn.deq", lambda: DEQ(_cell())(_x().at[0, 0].set(NAN)), "x", valid=r"finite"),
    R("deq-forward-failure-warns", "nn.deq", lambda: DEQ(_cell(), solver="picard", max_steps=1)(_x()), warns=BackwardWarning,
      match=r"forward solve did not converge"),
    R("deq-forward-failure-nan", "nn.deq",
      lambda: DEQ(_cell(), solver="picard", max_steps=1, on_failure="nan")(_x()), check=_all_nan),
    R("deq-forward-failure-in-solution", "nn.deq",
      lambda: DEQ(_cell(), solver="picard", max_steps=1, on_failure="ignore")(_x(), return_solution=True)[1],
      check=lambda s: _is(s.result, Result.MAX_STEPS_REACHED)),
    R("deq-unreachable-tol-float32", "nn.deq",
      lambda: DEQ(_cell(), solver="picard", tol=1.37e-9, max_steps=3, on_failure="ignore")(_x()),
      warns=PrecisionWarning, match=r"below what float32 can reach"),
    # ----------------------------------------------------------------------------- nn.cells
    E("tanh-cell-width-zero", "nn.cells", lambda: TanhCell(0, 3, rngs=nnx.Rngs(0)), "width"),
    E("tanh-cell-width-bool", "nn.cells", lambda: TanhCell(True, 3, rngs=nnx.Rngs(0)), "width"),
    E("tanh-cell-in-features-float", "nn.cells", lambda: TanhCell(4, 2.5, rngs=nnx.Rngs(0)), "in_features"),
    E("tanh-cell-dtype-int", "nn.cells", lambda: TanhCell(4, 3, dtype=jnp.int32, rngs=nnx.Rngs(0)), "dtype"),
    E("tanh-cell-param-dtype-complex", "nn.cells",
      lambda: TanhCell(4, 3, param_dtype=jnp.complex64, rngs=nnx.Rngs(0)), "param_dtype"),
    E("tanh-cell-scale-nan", "nn.cells", lambda: TanhCell(4, 3, scale=NAN, rngs=nnx.Rngs(0)), "scale"),
    E("resnet-cell-hidden-zero", "nn.cells", lambda: ResNetCell(4, 3, hidden=0, rngs=nnx.Rngs(0)), "hidden"),
    E("tanh-cell-ensemble-unknown", "nn.cells", lambda: TanhCell(4, 3, ensemble="cauchy", rngs=nnx.Rngs(0)),
      "ensemble"),
    E("resnet-cell-ensemble-not-rectangular", "nn.cells",
      lambda: ResNetCell(4, 3, ensemble="goe", hidden=8, rngs=nnx.Rngs(0)), "hidden",
      valid=r"equal to width \(4\) for the square"),
    E("tanh-cell-int-rngs", "nn.cells", lambda: TanhCell(4, 3, rngs=0), "rngs", valid=r"nnx.Rngs"),
    E("sample-name-case", "ensembles", lambda: ensembles.sample("GOE", KEY, 4), "name", valid=r"one of"),
    E("sample-int-seed", "ensembles", lambda: ensembles.sample("gaussian", 0, 4), "key", valid=r"not an int seed"),
    E("initializer-int-seed", "ensembles", lambda: ensembles.initializer("orthogonal")(3, (4, 4)), "key",
      valid=r"not an int seed"),
    E("sample-array-of-keys", "ensembles", lambda: ensembles.sample("goe", jax.random.split(KEY, 3), 4), "key",
      valid=r"single PRNG key"),
    E("sample-scale-complex", "ensembles", lambda: ensembles.sample("goe", KEY, 4, 1 + 1j), "scale",
      valid=r">= 0"),
    E("sample-n-numpy-float", "ensembles", lambda: ensembles.sample("gaussian", KEY, np.float64(4.0)), "n"),
    E("sample-key-float-array", "ensembles",
      lambda: ensembles.sample("gaussian", jax.random.PRNGKey(0).astype(jnp.float32), 4), "key"),
    E("spectral-radius-limit-nan", "ensembles", lambda: ensembles.spectral_radius_limit("goe", NAN), "scale"),
    E("critical-scale-none", "ensembles", lambda: ensembles.critical_scale(None), "name"),
    E("initializer-scale-inf", "ensembles", lambda: ensembles.initializer("orthogonal", INF), "scale"),
    E("initializer-dtype-complex", "ensembles",
      lambda: ensembles.initializer("gaussian")(KEY, (4, 4), jnp.complex64), "dtype"),
    # ----------------------------------------------------------------------------- data
    E("digits-test-fraction-nan", "data", lambda: data.load_digits(test_fraction=NAN), "test_fraction",
      valid=r"> 0 and < 1"),
    E("digits-test-fraction-zero", "data", lambda: data.load_digits(test_fraction=0.0), "test_fraction"),
    E("digits-test-fraction-bool", "data", lambda: data.load_digits(test_fraction=True), "test_fraction"),
    E("digits-seed-float", "data", lambda: data.load_digits(seed=1.5), "seed", valid=r"integer >= 0"),
    E("digits-seed-jax-key", "data", lambda: data.load_digits(seed=KEY), "seed", valid=r"integer >= 0"),
    E("digits-source-none", "data", lambda: data.load_digits(source=None), "source", valid=r"one of 'sklearn'"),
    E("dataset-unknown-name", "data", lambda: data.load_dataset("imagenet", split="train"), "name",
      valid=r"one of 'digits', 'mnist'"),
    E("dataset-split-missing", "data", lambda: data.load_dataset("digits"), "re:'split'", valid=r"required",
      exc=TypeError),
    # ----------------------------------------------------------------------------- stats
    E("mean-se-one-value", "stats", lambda: stats.mean_se([1.0]), "values", valid=r"at least 2"),
    E("mean-se-axis-out-of-range", "stats", lambda: stats.mean_se(np.ones((3, 4)), axis=2), "axis"),
    R("mean-se-nan-sample", "stats", lambda: stats.mean_se([1.0, NAN, 2.0]),
      check=lambda out: bool(np.isnan(out[0]) and np.isnan(out[1]))),
    E("fit-power-law-length-mismatch", "stats", lambda: stats.fit_power_law([1.0, 2.0, 3.0], [1.0, 2.0]),
      "re:`x`|`values`", valid=r"same length|shape"),
    E("richardson-ratio-nan", "stats", lambda: stats.richardson(1.0, 2.0, ratio=NAN), "ratio", valid=r"> 1"),
    E("richardson-order-string", "stats", lambda: stats.richardson_se(1.0, 2.0, order="1"), "order"),
    E("richardson-mean-one-sample", "stats", lambda: stats.richardson_mean([1.0], [1.0, 2.0]), "coarse_samples",
      valid=r"at least 2"),
    E("dkw-bound-zero-samples", "stats", lambda: stats.dkw_bound(0), "n_samples", valid=r"integer >= 1"),
    E("dkw-bound-huge-samples", "stats", lambda: stats.dkw_bound(10**400), "n_samples"),
    E("spectral-ks-bound-n-zero", "stats", lambda: stats.spectral_ks_bound(100, 0), "n"),
    E("kolmogorov-no-samples", "stats", lambda: stats.kolmogorov_distance([], *_grid()), "samples",
      valid=r"non-empty"),
    E("support-edges-nan-density", "stats", lambda: stats.support_edges(_grid()[0], np.full(401, NAN)),
      "density", valid=r"lower `floor`"),
    E("locate-atom-lo-nan", "stats", lambda: stats.locate_atom(fp.Semicircle(0.5), NAN, 1.0), "lo"),
    E("mass-and-moments-decreasing-grid", "stats",
      lambda: stats.mass_and_moments(_grid()[0][::-1], _grid()[1][::-1]), "lam", valid=r"increasing"),
    E("kolmogorov-decreasing-grid", "stats",
      lambda: stats.kolmogorov_distance([0.1, 0.2], _grid()[0][::-1], _grid()[1][::-1]), "lam",
      valid=r"increasing"),
    E("locate-atom-not-a-spectrum", "stats", lambda: stats.locate_atom(3, 0.0, 1.0), "spectrum",
      exc=(ValueError, TypeError), valid=r"Spectrum|stieltjes"),
    # ----------------------------------------------------------------------------- nonlinearities
    E("get-none", "nonlinearities", lambda: nonlinearities.get(None), "nonlinearity"),
    E("get-wrong-case", "nonlinearities", lambda: nonlinearities.get("ReLU"), "nonlinearity",
      valid=r"one of 'linear', 'relu'"),
    E("index-unknown", "nonlinearities", lambda: nonlinearities.index("gelu"), "nonlinearity"),
    E("apply-jax-code-out-of-range", "nonlinearities", lambda: nonlinearities.apply_jax(6, -jnp.ones(2)), "code",
      valid=r"0 <= code < 6|range|>= 0"),
    E("apply-jax-code-negative", "nonlinearities",
      lambda: nonlinearities.derivative_apply_jax(-1, -jnp.ones(2)), "code", valid=r"range|>= 0"),
    E("apply-jax-code-name", "nonlinearities", lambda: nonlinearities.apply_jax("relu", jnp.ones(2)), "code",
      exc=(ValueError, TypeError), valid=r"index\(|integer"),
    # ----------------------------------------------------------------------------- theory.linear
    E("second-moment-negative-variance", "theory.linear", lambda: linear.second_moment("gaussian", -0.1), "V",
      valid=r"0 <= V < V_c"),
    E("second-moment-at-critical", "theory.linear", lambda: linear.second_moment("gaussian", 1.0), "V",
      valid=r"V < V_c = 1"),
    E("second-moment-goe-beyond-critical", "theory.linear", lambda: linear.second_moment("goe", 0.3), "V",
      valid=r"V_c = 0.25"),
    E("first-moment-nan", "theory.linear", lambda: linear.first_moment("orthogonal", NAN), "V"),
    E("variance-one-bad-entry", "theory.linear", lambda: linear.variance("orthogonal", [0.1, 2.0]), "V"),
    E("second-moment-empty", "theory.linear", lambda: linear.second_moment("gaussian", []), "V"),
    E("second-moment-complex", "theory.linear", lambda: linear.second_moment("gaussian", 0.1 + 0.5j), "V",
      valid=r"real numbers"),
    E("gram-trace-power-three", "theory.linear", lambda: linear.gram_trace("gaussian", 0.5, power=3), "power",
      valid=r"<= 2"),
    E("ntk-tied-int", "theory.linear", lambda: linear.ntk("gaussian", 0.5, tied=1), "tied",
      valid=r"True or False"),
    E("critical-variance-antisymmetric", "theory.linear", lambda: linear.critical_variance("antisymmetric"),
      "ensemble", valid=r"one of 'gaussian', 'orthogonal', 'goe'"),
    E("divergence-quantity-unknown", "theory.linear", lambda: linear.divergence("gaussian", quantity="fourth"),
      "quantity"),
    E("power-series-zero-terms", "theory.linear", lambda: linear.power_series("goe", 0.1, terms=0), "terms"),
    E("asymptote-at-critical", "theory.linear", lambda: linear.asymptote("goe", 0.25), "V"),
    E("goe-integral-zero-nodes", "theory.linear", lambda: linear.goe_length_variance_integral(0.1, nodes=0),
      "nodes"),
    E("tracy-widom-nan", "theory.linear", lambda: linear.tracy_widom_cdf(NAN), "s", valid=r"not NaN"),
    E("tracy-widom-beta-four", "theory.linear", lambda: linear.tracy_widom_cdf(0.0, beta=4), "beta"),
    E("edge-scaling-orthogonal", "theory.linear", lambda: linear.edge_scaling("orthogonal", 100), "ensemble",
      valid=r"'gaussian' or 'goe'"),
    E("edge-scaling-depth-one", "theory.linear", lambda: linear.edge_scaling("goe", 1), "N", valid=r">= 2"),
    E("edge-scaling-ginibre-small-n", "theory.linear", lambda: linear.edge_scaling("gaussian", 5), "N",
      valid=rf">= {linear.GINIBRE_MIN_N}"),
    E("edge-failure-delta-zero", "theory.linear", lambda: linear.edge_failure_probability("goe", 100, 0.0),
      "delta", valid=r"\(0, 1\]"),
    E("reliable-delta-risk-one", "theory.linear", lambda: linear.reliable_delta("goe", 100, risk=1.0), "risk"),
    E("edge-scaling-huge-n", "theory.linear", lambda: linear.edge_scaling("goe", 10**400), "N"),
    E("edge-failure-huge-n", "theory.linear", lambda: linear.edge_failure_probability("gaussian", 10**400, 0.1),
      "N"),
    # ----------------------------------------------------------------------------- theory.freeprob
    E("semicircle-negative-variance", "theory.freeprob", lambda: fp.Semicircle(-1.0), "V", valid=r"> 0"),
    E("marchenko-pastur-zero", "theory.freeprob", lambda: fp.MarchenkoPastur(0.0), "V"),
    E("scaled-identity-nan", "theory.freeprob", lambda: fp.ScaledIdentity(NAN), "V"),
    E("bernoulli-p-above-one", "theory.freeprob", lambda: fp.Bernoulli(1.5), "p", valid=r"<= 1"),
    E("point-masses-weights-sum", "theory.freeprob", lambda: fp.PointMasses([1.0, 2.0], [0.5, 0.6]), "weights",
      valid=r"summing to 1"),
    E("samples-empty", "theory.freeprob", lambda: fp.samples([]), "locations", valid=r"non-empty"),
    E("free-product-ratio-one", "theory.freeprob",
      lambda: fp.FreeProduct(fp.Bernoulli(0.5), fp.MarchenkoPastur(1.0), ratio=1.0), "ratio", valid=r"> 1"),
    E("dw-spectrum-negative-variance", "theory.freeprob", lambda: fp.DWSpectrum(fp.Bernoulli(0.5), -0.1), "V"),
    E("length-pencil-orthogonal", "theory.freeprob", lambda: fp.length_pencil("orthogonal", 0.1), "ensemble"),
    E("length-pencil-beyond-critical", "theory.freeprob", lambda: fp.length_pencil("gaussian", 1.5), "V",
      valid=r"\(0, V_c\)"),
    E("goe-length-m2-nan", "theory.freeprob", lambda: fp.goe_length_m2(NAN), "V"),
    E("jacobian-moments-depth-zero", "theory.freeprob", lambda: fp.jacobian_moments("erf", "orthogonal", 0, 0.5),
      "depth", valid=r"integer >= 1"),
    E("jacobian-moments-sigma-w2-nan", "theory.freeprob",
      lambda: fp.jacobian_moments("erf", "orthogonal", 2, 0.5, sigma_w2=NAN), "sigma_w2"),
    E("jacobian-density-negative-lam", "theory.freeprob",
      lambda: fp.jacobian_density("erf", "orthogonal", 2, 0.5, [-1.0]), "lam", valid=r"> 0"),
    E("jacobian-density-eps-shape", "theory.freeprob",
      lambda: fp.jacobian_density("erf", "orthogonal", 2, 0.5, [1.0, 2.0], eps=np.ones(3)), "eps",
      valid=r"one value per point"),
    E("double-scaling-negative-sigma", "theory.freeprob", lambda: fp.double_scaling_q_star("erf", 2, -1.0),
      "sigma0_2"),
    E("bernoulli-limit-zero", "theory.freeprob", lambda: fp.BernoulliLimit(0.0), "sigma0_2"),
    E("small-lambda-mass-delta-too-big", "theory.freeprob",
      lambda: fp.BernoulliLimit.small_lambda_mass(0.5, 0.6), "delta", valid=r"< 0.5"),
    E("smooth-limit-ratio-below-one", "theory.freeprob", lambda: fp.SmoothLimit(0.25, ratio=0.5), "ratio"),
    E("follow-roots-ratio-one", "theory.freeprob",
      lambda: fp.follow_roots(lambda x, z: x, lambda z: 1 / z, [1.0], 1e-3, ratio=1.0), "ratio"),
    E("pencil-cauchy-damping-zero", "theory.freeprob",
      lambda: fp.pencil_cauchy(fp.length_pencil("goe", 0.1), 1j, damping=0.0), "damping"),
    E("pencil-moments-negative-radius", "theory.freeprob",
      lambda: fp.pencil_moments(fp.length_pencil("goe", 0.1), 2, radius=-1.0), "radius"),
    E("goe-resolvent-real-z", "theory.freeprob", lambda: fp.goe_resolvent_mgf(0.5, 0.1), "z",
      valid=r"off the real axis"),
    E("gaussian-expectation-negative-q", "theory.freeprob", lambda: fp.gaussian_expectation(np.tanh, -1.0), "q"),
    E("slope-moments-inf-q", "theory.freeprob", lambda: fp.slope_moments("silu", INF), "q_star"),
    E("activation-unknown", "theory.freeprob", lambda: fp.activation("tanh", 1.0), "nonlinearity"),
    E("weight-spectrum-zero-variance", "theory.freeprob", lambda: fp.weight_spectrum("orthogonal", 0.0),
      "sigma_w2"),
    R("pencil-cauchy-starved-raises", "theory.freeprob",
      lambda: fp.pencil_cauchy(fp.length_pencil("goe", 0.1), 1j, max_iter=1), raises=fp.ConvergenceError,
      match=r"not converged after 1 iterations"),
    R("pencil-cauchy-starved-reports", "theory.freeprob",
      lambda: fp.pencil_cauchy(fp.length_pencil("goe", 0.1), 1j, max_iter=1, check=False),
      check=lambda res: not bool(np.any(res.converged))),
    E("semicircle-mgf-inverse-nan", "theory.freeprob", lambda: fp.Semicircle(0.5).mgf_inverse(NAN), "w",
      valid=r"finite"),
    E("bernoulli-s-transform-nan", "theory.freeprob", lambda: fp.Bernoulli(0.5).s_transform(NAN), "w",
      valid=r"finite"),
    E("marchenko-pastur-mgf-inverse-zero", "theory.freeprob", lambda: fp.MarchenkoPastur(0.5).mgf_inverse(0.0),
      "w", valid=r"off|!= 0|support"),
    E("free-product-not-a-spectrum", "theory.freeprob",
      lambda: fp.FreeProduct("semicircle", fp.Bernoulli(0.5)), "a", exc=(ValueError, TypeError),
      valid=r"Spectrum"),
    # ----------------------------------------------------------------------------- experiments.config
    E("scale-unknown", "experiments.config", config.get_scale, "re:DEQLAB_SCALE", valid=r"valid values are",
      env={"DEQLAB_SCALE": "huge"}),
    E("scale-typo-through-pick", "experiments.config", lambda: config.pick(quick=1, full=2), "re:DEQLAB_SCALE",
      valid=r"valid values are 'quick', 'medium', 'full'", env={"DEQLAB_SCALE": "fulll"}),
    E("scale-number", "experiments.config", config.get_scale, "re:DEQLAB_SCALE", valid=r"valid values are",
      env={"DEQLAB_SCALE": "0"}),
    E("scale-both", "experiments.config", config.get_scale, "re:DEQLAB_SCALE", valid=r"valid values are",
      env={"DEQLAB_SCALE": "quick,full"}),
    E("pick-missing-full", "experiments.config", lambda: config.pick(quick=1), "re:'full'", valid=r"required",
      exc=TypeError),
]


def _params():
    params = []
    for probe in PROBES:
        marks = [pytest.mark.xfail(strict=True, reason=probe.xfail)] if probe.xfail else []
        marks += [pytest.mark.float64] if probe.float64 else []
        params.append(pytest.param(probe, id=probe.name, marks=marks))
    return params


def _run(probe: Probe) -> None:
    if probe.outcome == "error":
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = probe.call()
        except probe.exc as err:
            message = str(err)
        except Exception as err:  # noqa: BLE001 - any other exception is the finding
            pytest.fail(f"UNCLEAR: {type(err).__name__}: {err}")
        else:
            pytest.fail(f"SILENT: returned {out!r}")
        assert re.search(probe.arg, message), f"UNCLEAR (does not name {probe.arg}): {message}"
        assert re.search(probe.valid, message), f"UNCLEAR (does not say what is valid, {probe.valid}): {message}"
        return
    if probe.raises is not None:
        with pytest.raises(probe.raises, match=probe.match):
            probe.call()
        return
    if probe.warns is not None:
        # Warnings other than the expected one (e.g. the adjoint's after a failed forward) are
        # re-emitted by pytest.warns on exit; they are not what this probe is about.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.warns(probe.warns, match=probe.match):
                out = probe.call()
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = probe.call()
    if probe.check is not None:
        assert probe.check(out), f"SILENT: the failure is not reported by {out!r}"


@pytest.mark.parametrize("probe", _params())
def test_probe(probe, monkeypatch):
    for name, value in (probe.env or {}).items():
        monkeypatch.setenv(name, value)
    _run(probe)


def test_probe_table_covers_the_public_api():
    names = [p.name for p in PROBES]
    assert len(names) == len(set(names)), [n for n, c in collections.Counter(names).items() if c > 1]
    assert len(PROBES) >= 60
    by_outcome = collections.Counter(p.outcome for p in PROBES)
    assert set(by_outcome) == {"error", "reported"}, by_outcome
    by_module = collections.Counter(p.module for p in PROBES)
    assert set(by_module) == set(MODULES), set(by_module) ^ set(MODULES)
    thin = {m: c for m, c in by_module.items() if c < 3}
    assert not thin, thin
    for probe in PROBES:
        if probe.outcome == "error":
            assert probe.arg and probe.valid, probe.name
        else:
            assert probe.warns or probe.raises or probe.check, probe.name
    # the package's own top-level names are the objects probed here
    assert deqlab.solve is solve and deqlab.fixed_point is fixed_point and deqlab.Result is Result
