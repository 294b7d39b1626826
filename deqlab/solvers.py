"""Forward fixed-point solvers for equilibrium models: damped Picard, Anderson, Broyden.

A deep equilibrium model (003 §3.1, Eq. 4) outputs the fixed point z* = f(z*, x). This module
finds it. Every solver here works on a pytree ``z`` and returns a :class:`Solution` carrying the
value, a per-sample :class:`~deqlab.failures.Result`, and statistics (steps, function evaluations, the residual
trace and the best residual).

Writing a solver
    The built-in solvers (:class:`Picard`, :class:`Anderson`, :class:`Broyden`) are subclasses of
    :class:`Solver`, and so can be yours: define ``init(z, fz)`` and ``propose(z, fz, state)`` on
    flattened ``(B, D)`` arrays, and the shared loop gives it everything below (per-sample
    stopping, result codes, statistics, ``init_state`` warm starts, ``stop="error"``). The loop
    has no special case for any solver: what differs between them is declared by hooks on
    :class:`Solver` (``rate_estimate``, ``error_bound_factor``, ``steps_past_convergence``,
    ``freeze_state``). Solver objects are hashable pytrees with static fields, so they can be
    passed to ``jax.jit``-ed functions.

Tolerance rule (one rule for every solver)
    A sample has converged when its *relative residual*

    .. math:: \\rho(z) = \\frac{\\lVert f(z) - z \\rVert_2}{\\lVert f(z) \\rVert_2 + \\epsilon\\sqrt{D}}

    satisfies ``rho <= tol``. Norms are taken per sample over all its entries (all leaves of the
    pytree, D numbers in total), accumulated in at least float32; ``epsilon`` is the machine
    epsilon of the iterate's dtype, so a fixed point at exactly zero is still reachable. With
    ``batch_axis=None`` the whole pytree is one sample.

    The rule is relative, as every practical one must be: an iteration that runs off to infinity
    by constant steps, as for f(z) = z + 1 (no fixed point), meets ``tol = 1e-2`` once ``|z| > 99``,
    while its absolute residual, which the divergence test watches, stays 1. At tolerances near
    the dtype's default such a solve runs to ``max_steps`` instead; where f may have no fixed
    point, look at ``stats.residual_trace`` and the size of the value.

    The default ``tol`` follows the dtype of ``z0`` (:func:`deqlab.precision.default_tol`:
    float64 1e-10, float32 1e-5, float16 1e-2, bfloat16 5e-2), and a tolerance below what the
    dtype can reach warns once. f is evaluated at the matmul precision the tolerance needs, which
    matters on TPUs and TF32 GPUs (:mod:`deqlab.precision`).

Error-controlled stopping (``stop="error"``)
    Users want z* to an accuracy, not a residual. With ``stop="error"`` a sample stops when the
    estimated error of the value it would return is within ``tol``:

    .. math:: s \\, \\frac{c(q)\\, \\lVert f(z) - z \\rVert_\\infty}{\\max(1, \\lVert f(z) \\rVert_\\infty)} \\le \\mathrm{tol}

    (max-abs error, absolute for states of size at most 1 and relative above; ``s`` is ``safety``,
    default 1.5). These are Banach's a-posteriori bounds for a map contracting at rate q: Picard
    returns z + damping (f(z) - z), within c(q) = damping q / (1 - q) of its step from z*; Anderson
    and Broyden return z, within c(q) = 1 / (1 - q) of the residual
    (:meth:`Solver.error_bound_factor`). The rate is estimated per sample from the solve itself
    (:attr:`Solver.rate_estimate`): for Picard the largest of the last three residual ratios
    ``||g_k|| / ||g_{k-1}||`` (g = f(z) - z); for Anderson and Broyden, whose residual ratios
    measure the acceleration rather than f, the largest secant quotient
    ``||f(z') - f(z)|| / ||z' - z||`` over all steps so far. Where the estimate is unreliable (a rate at or above 0.999, which a residual that
    grew gives Picard; a non-finite ratio; Picard's first three steps) the residual rule above
    decides, with the same ``tol``; ``SolveStats.error_estimate`` is then inf. The bound assumes the rate seen so far is
    f's; measured on linear maps of known spectral norm (rates 0.5 ... 0.995, rotating and symmetric
    spectra) the delivered error was at most 1.25 times the unscaled estimate, hence ``safety`` 1.5;
    on rotating spectra it is conservative by up to 30x (the bound sums step lengths that cancel).

Checks every k steps (``check_every``)
    Judging a step (norms, selections, statistics) costs about a fifth of a 256-wide tanh layer on
    the batch. With ``check_every=k`` the loop takes k - 1 bare steps and judges the k-th: a sample
    stops at most k - 1 steps after it could have, and steps, trace rows and failures are counted
    at judged steps (a non-finite iterate inside a chunk is rejected at its end). ``unrolled``
    solves judge every step.

Batches
    With ``batch_axis=k`` the k-th axis of every leaf indexes independent samples. Each sample is
    judged on its own (the batch is not judged by its worst member): a sample that has converged,
    diverged or produced a non-finite value is frozen, its statistics stop, and the loop ends when
    no sample is active or ``max_steps`` is reached. ``f`` is always evaluated on the whole batch,
    so it must act on samples independently (as any batched network layer does).

Failure is reported, never hidden
    ``Result.DIVERGED`` when the absolute residual grows by ``divergence_factor`` over the best one
    seen; ``Result.NONFINITE`` when ``f`` returns NaN or inf (the non-finite iterate is never
    accepted); ``Result.MAX_STEPS_REACHED`` otherwise. A converged sample returns the iterate that
    met ``tol``; :class:`Picard` returns one step further, ``z + damping (f(z) - z)`` from that
    iterate: ``f(z)`` was evaluated to check convergence, and where the damped map contracts
    (which is when Picard converges) that step is closer to the fixed point at no cost. The
    statistics describe the iterate the step starts from. A sample that failed returns its finite
    iterate closest to convergence, the one with the smallest absolute residual
    ``||f(z) - z||`` (the relative residual would prefer a diverging iterate: for f = 2z + 1 it
    falls towards 1/2 as z runs off), with its result code.
    What a failed sample does beyond its result code is the call's ``on_failure`` policy
    (``"warn"``, ``"raise"``, ``"nan"`` or ``"ignore"``; :mod:`deqlab.failures`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import _eager, checks
from deqlab import precision as precision_module
from deqlab.failures import NOT_GIVEN, Result, check_policy, nan_where_failed, removed_throw, signal
from deqlab.failures import SolverError as SolverError  # importable from here too
from deqlab.failures import SolverWarning as SolverWarning

# Result, SolverError and SolverWarning live in deqlab.failures (documented there) and are
# importable from here too.
__all__ = [
    "SolveStats",
    "SolverState",
    "Solution",
    "Flattener",
    "check_problem",
    "raise_if_failed",
    "Solver",
    "RATE_ESTIMATES",
    "Picard",
    "Anderson",
    "Broyden",
    "BroydenState",
    "SOLVERS",
    "get_solver",
    "solve",
    "relative_residual",
]


class SolveStats(NamedTuple):
    """Statistics of one solve.

    Attributes:
        steps: iterations taken by each sample (shape ``(B,)``, or ``()`` without a batch axis).
        nfe: number of evaluations of ``f`` on the batch (including the one at ``z0``).
        residual_trace: relative residual of each sample after each step, shape
            ``(max_steps + 1, B)`` (row 0 is at ``z0``); a frozen sample repeats its last value.
        best_residual: relative residual of each sample's returned value (for a converged sample
            the iterate that met ``tol``; otherwise the finite iterate with the smallest absolute
            residual, see the module docstring).
        residual: relative residual of the last accepted iterate of each sample.
        tol: the tolerance the solve used (the dtype's default when none was given).
        error_estimate: with ``stop="error"``, the estimated max-abs error of each sample's
            returned value relative to ``max(1, max|f(z)|)`` at its last judged step (inf where
            the rate estimate was unreliable and the residual rule decided); None otherwise.
    """

    steps: jax.Array
    nfe: jax.Array
    residual_trace: jax.Array
    best_residual: jax.Array
    residual: jax.Array
    tol: Any = None
    error_estimate: Any = None


class SolverState(NamedTuple):
    """Where a solve stopped: its last iterate ``z`` and the solver's history, flattened to
    ``(B, D)`` rows. Pass it back as ``solve(..., init_state=sol.state)`` to continue the same
    iteration (for example with a larger ``max_steps``); the history of Anderson and Broyden is
    kept, so the continuation is the same iteration as one longer solve."""

    z: jax.Array
    history: Any


class Solution(NamedTuple):
    """Result of :func:`solve`: ``value`` (same pytree as ``z0``), per-sample ``result``,
    ``stats``, the final solver ``state`` (for a warm start) and, with ``has_aux=True``, the
    auxiliary output of ``f`` at ``value``."""

    value: Any
    result: jax.Array
    stats: SolveStats
    state: SolverState | None = None
    aux: Any = None

    @property
    def converged(self) -> jax.Array:
        """Boolean per sample: did it reach the tolerance?"""
        return self.result == Result.SUCCESS


# --------------------------------------------------------------------------------------------
# Solver configurations


#: Stopping rules: ``"residual"`` (relative residual <= tol) and ``"error"`` (estimated error of
#: the returned value <= tol, see the module docstring).
STOPPING_RULES = ("residual", "error")
#: Contraction-rate estimates at or above this are unreliable (a rate this close to 1 multiplies
#: the error bound by 1 / (1 - q) >= 1000, and rounding noise makes ratios near 1 meaningless): the
#: error rule falls back to the residual rule there.
RATE_LIMIT = 0.999
#: Number of successive rate estimates whose maximum is the rate used by the error rule.
RATE_WINDOW = 3


#: How the error rule estimates the contraction rate q (see :attr:`Solver.rate_estimate`).
RATE_ESTIMATES = ("residual_ratio", "secant")


class Solver:
    """Base class of the forward fixed-point solvers: subclass it to write your own.

    A solver is a frozen configuration (tolerances, history sizes, step lengths) plus two methods
    on flattened ``(B, D)`` arrays (B samples of D numbers each; :func:`solve` flattens any pytree):

    - ``init(z, fz) -> state``: the solver's state (history) at the first iterate ``z`` with
      ``fz = f(z)``. A pytree of arrays whose leading axis is the batch (scalars are shared by
      the batch); ``()`` for a solver without memory.
    - ``propose(z, fz, state) -> (z_next, state)``: the next iterate from the accepted iterate
      ``z`` and ``fz = f(z)``.

    and nothing else: the shared loop of :func:`solve` evaluates f, judges every sample on its own
    (the tolerance rule, ``stop="residual"`` or ``"error"``, divergence and non-finite checks, the
    module docstring), freezes samples that stopped, keeps the statistics and returns a
    :class:`SolverState` for warm starts (``init_state``). Subclasses are made frozen, keyword-only
    dataclasses and pytrees automatically (do not decorate them with ``@dataclasses.dataclass``):
    their annotated class attributes are configuration fields, static in the pytree (hashable,
    so a solver can be an argument of a ``jax.jit``-ed function and is part of its cache key).

    Optional hooks (class attributes and methods a subclass may override; the defaults suit a
    solver that returns its last accepted iterate and keeps no per-sample history):

    - ``record(z, fz, state) -> state``: update the state with an evaluated proposal (default:
      unchanged). Called after every proposal, with ``z`` the proposal and ``fz = f(z)``.
    - :attr:`rate_estimate`: how ``stop="error"`` estimates the contraction rate q.
    - :meth:`error_bound_factor`: the factor c(q) of the error bound of the returned value.
    - :attr:`steps_past_convergence`: whether the returned value of a converged sample is one
      more proposal from the iterate that met ``tol``.
    - :attr:`freeze_state`: whether a sample's state stops changing when the sample stops.
    - ``__post_init__``: validate the subclass's own fields (call ``super().__post_init__()``).

    Args:
        tol: tolerance of the stopping rule (> 0); None: the default of the iterate's dtype
            (:func:`deqlab.precision.default_tol`).
        max_steps: iteration limit (>= 1).
        divergence_factor: a sample whose absolute residual grows by more than this (> 1) over
            the best one seen is reported ``Result.DIVERGED``.
        stop: ``"residual"`` (relative residual <= tol) or ``"error"`` (estimated error of the
            returned value <= tol), see the module docstring.
        safety: factor (>= 1) on the error estimate of ``stop="error"``.
        check_every: judge convergence every this many steps (>= 1; module docstring).

    Raises:
        ValueError: a setting outside its range (the message names it and the valid range), or a
            hook attribute with an invalid value.
        TypeError: a subclass that does not define ``init`` or ``propose`` is instantiated (the
            message names the class and the missing methods).

    Example:
        A damped fixed-point iteration (003 Eq. 5 with a step of one half) in four lines::

            class Damped(deqlab.Solver):
                def init(self, z, fz):
                    return ()

                def propose(self, z, fz, state):
                    return 0.5 * z + 0.5 * fz, state

            sol = deqlab.solve(f, z0, *args, solver=Damped(tol=1e-6, max_steps=500), batch_axis=0)
            sol.result, sol.stats.steps   # per-sample codes and step counts, as for Picard

        A subclass with settings declares them as annotated class attributes, validated in
        ``__post_init__``::

            class Relaxed(deqlab.Solver):
                beta: float = 0.5

                def __post_init__(self):
                    super().__post_init__()
                    deqlab.checks.unit_interval(self.beta, "beta", "Relaxed")

                def init(self, z, fz):
                    return ()

                def propose(self, z, fz, state):
                    return z + self.beta * (fz - z), state
    """

    tol: float | None = None
    max_steps: int = 100
    divergence_factor: float = 1e4
    stop: str = "residual"
    safety: float = 1.5
    check_every: int = 1

    #: Short name of the solver (the built-ins are in :data:`SOLVERS` under it).
    name: ClassVar[str] = "solver"

    #: How ``stop="error"`` estimates the contraction rate q of f near z*, per sample:
    #:
    #: - ``"secant"`` (default): the largest secant quotient ``||f(z') - f(z)|| / ||z' - z||``
    #:   over every step so far, a lower estimate of f's Lipschitz constant along the path. Right
    #:   for any solver, and the only right one for accelerated solvers (Anderson, Broyden), whose
    #:   residual ratios measure the acceleration rather than f.
    #: - ``"residual_ratio"``: the largest of the last three residual ratios
    #:   ``||g_k|| / ||g_{k-1}||`` (g = f(z) - z; over a chunk of k steps, the k-th root). Right
    #:   for a stationary iteration z <- T(z) (Picard, damped or not), whose ratios converge to
    #:   T's rate; the first three steps have no estimate (the residual rule decides).
    rate_estimate: ClassVar[str] = "secant"

    #: True when the value returned for a converged sample is one more proposal,
    #: ``propose(z, f(z), state)``, from the iterate z that met ``tol``: f(z) was evaluated to
    #: judge z, so the step costs nothing, and it is closer to z* when the iteration contracts
    #: (Picard). Keep it False (the default) for solvers whose next step mixes a history that a
    #: stopped sample no longer updates (Anderson, Broyden). Override :meth:`error_bound_factor`
    #: with it: the error bound is then about the stepped value.
    steps_past_convergence: ClassVar[bool] = False

    #: True when a sample's state (every per-sample leaf of it) must stay what it was at the step
    #: the sample stopped, e.g. because it is used after the solve: Broyden's inverse-Jacobian
    #: estimate at each sample's own equilibrium, which :class:`deqlab.implicit.SHINE` reuses.
    #: False (default): a stopped sample's state may go on changing (it no longer matters, and the
    #: loop skips a per-sample select). Unrolled solves always freeze it.
    freeze_state: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        where = f"solvers.{cls.__name__}"
        if cls.rate_estimate not in RATE_ESTIMATES:
            raise checks.fail("rate_estimate", f"one of {list(RATE_ESTIMATES)}", cls.rate_estimate, where)
        for flag in ("steps_past_convergence", "freeze_state"):
            if not isinstance(getattr(cls, flag), bool):
                raise checks.fail(flag, "True or False", getattr(cls, flag), where)
        _configuration_class(cls)

    def __new__(cls, *args, **kwargs):
        missing = [m for m in ("init", "propose") if getattr(cls, m) is getattr(Solver, m)]
        if missing:
            signatures = {"init": "init(self, z, fz) -> state",
                          "propose": "propose(self, z, fz, state) -> (z_next, state)"}
            raise TypeError(
                f"{cls.__name__} cannot be instantiated: a deqlab.Solver subclass must define "
                + " and ".join(signatures[m] for m in missing) + f"; {cls.__name__} does not define "
                + " or ".join(f"`{m}`" for m in missing) + "."
            )
        return super().__new__(cls)

    def __post_init__(self):
        """Validate the shared settings; subclasses validate theirs and call this first."""
        where = f"solvers.{type(self).__name__}"
        if self.tol is not None:
            checks.positive_number(self.tol, "tol", where)
        checks.positive_int(self.max_steps, "max_steps", where)
        checks.number(self.divergence_factor, "divergence_factor", where, lower=1.0, lower_open=True)
        if self.stop not in STOPPING_RULES:
            raise checks.fail("stop", f"one of {list(STOPPING_RULES)}", self.stop, where)
        checks.number(self.safety, "safety", where, lower=1.0)
        checks.positive_int(self.check_every, "check_every", where)

    def resolved_tol(self, dtype) -> float:
        """The tolerance of a solve in ``dtype``: ``tol``, or the dtype's default."""
        return precision_module.default_tol(dtype) if self.tol is None else float(self.tol)

    def init(self, z: jax.Array, fz: jax.Array) -> Any:
        """The solver's state at the first iterate (required in a subclass).

        Args:
            z: the first iterate, shape ``(B, D)`` (``z0`` flattened).
            fz: ``f(z)``, shape ``(B, D)`` (a sample where it is not finite has ``fz = z``).

        Returns:
            A pytree of arrays, leading axis B for per-sample leaves (scalars are shared by the
            batch); ``()`` when the solver keeps nothing. Its structure must not depend on the
            values (it is a ``lax.while_loop`` carry).
        """
        raise NotImplementedError

    def propose(self, z: jax.Array, fz: jax.Array, state: Any) -> tuple[jax.Array, Any]:
        """The next iterate (required in a subclass).

        Args:
            z: the current accepted iterate, shape ``(B, D)``.
            fz: ``f(z)``, shape ``(B, D)``.
            state: the solver's state (from :meth:`init` or :meth:`record`).

        Returns:
            ``(z_next, state)``: the proposal, shape and dtype of ``z``, and the state (the loop
            passes it to :meth:`record` with ``f(z_next)``).

        Example:
            Picard's proposal (003 Eq. 5) is ``return fz, state``.
        """
        raise NotImplementedError

    def record(self, z: jax.Array, fz: jax.Array, state: Any) -> Any:
        """Update the state with an evaluated proposal (optional hook; default: unchanged).

        Args:
            z: the proposal :meth:`propose` returned, shape ``(B, D)``.
            fz: ``f(z)`` (possibly non-finite for samples the loop then rejects).
            state: the state :meth:`propose` returned.

        Returns:
            The new state, same structure as ``state``.
        """
        return state

    def error_bound_factor(self, q: jax.Array) -> jax.Array:
        """The factor c(q) of Banach's a-posteriori bound used by ``stop="error"`` (optional hook).

        The returned value of a sample is within ``c(q) ||f(z) - z||`` of z* (max-abs norms, z the
        last accepted iterate) when f contracts at rate q. The default, ``1 / (1 - q)``, is the
        bound for returning z itself; a solver with :attr:`steps_past_convergence` bounds its
        stepped value instead (Picard: ``damping q / (1 - q)``).

        Args:
            q: per-sample rate estimates in [0, 0.999), shape ``(B,)``.

        Returns:
            c(q), shape ``(B,)``.
        """
        return 1.0 / (1.0 - q)


dataclasses.dataclass(frozen=True, kw_only=True)(Solver)


def _configuration_class(cls):
    """Make ``cls`` a frozen keyword-only dataclass and a pytree whose fields are all static
    (metadata): it has no leaves, is hashable, and can be passed to ``jax.jit``-ed functions."""
    dataclasses.dataclass(frozen=True, kw_only=True)(cls)
    fields = [field.name for field in dataclasses.fields(cls)]
    jax.tree_util.register_dataclass(cls, data_fields=[], meta_fields=fields)
    return cls


class Picard(Solver):
    """Damped Picard iteration z <- (1 - damping) z + damping f(z) (003 Eq. 5 for damping=1).

    Args:
        damping: step fraction in (0, 1]; 1 is plain fixed-point iteration.
        tol, max_steps, divergence_factor: see the module docstring.
        stop: ``"residual"`` (default) or ``"error"``: what ``tol`` bounds (module docstring).
        safety: factor (>= 1) on the error estimate of ``stop="error"``.
        check_every: judge convergence every this many steps (module docstring).

    Hooks (see :class:`Solver`): ``rate_estimate = "residual_ratio"`` (a stationary iteration:
    its residual ratios tend to the damped map's rate), ``steps_past_convergence = True`` (a
    converged sample returns ``z + damping (f(z) - z)`` from the iterate that met ``tol``) and
    :meth:`error_bound_factor` ``damping q / (1 - q)`` for that stepped value.

    Example:
        >>> sol = deqlab.solve(lambda z, x: 0.5 * jnp.tanh(z) + x, jnp.zeros(3), jnp.ones(3),
        ...                    solver=Picard(damping=0.8, tol=1e-6))
    """

    damping: float = 1.0
    name = "picard"
    rate_estimate = "residual_ratio"
    steps_past_convergence = True

    def __post_init__(self):
        super().__post_init__()
        checks.unit_interval(self.damping, "damping", "solvers.Picard")

    def init(self, z, fz):
        return ()

    def propose(self, z, fz, state):
        if self.damping == 1.0:
            return fz, state
        return z + self.damping * (fz - z), state

    def error_bound_factor(self, q):
        """Banach's bound for the stepped value: within ``q / (1 - q)`` of its step
        ``damping ||f(z) - z||`` from z (the damped map contracting at rate q)."""
        return q * float(self.damping) / (1.0 - q)


_EXACT = jax.lax.Precision.HIGHEST
"""The solvers' own small products (Gram matrices, mixing, secant updates) are never demoted to
bfloat16 passes on accelerators: they decide the step, and they are cheap next to f."""


class Anderson(Solver):
    """Anderson acceleration (type II) with a history of ``m`` iterates (Anderson 1965;
    Walker & Ni 2011).

    Each step solves, per sample, the regularised least-squares problem
    min_alpha ||G alpha||^2 subject to sum(alpha) = 1, where the columns of G are the last ``m``
    residuals g_i = f(z_i) - z_i, then mixes
    z <- damping * sum_i alpha_i f(z_i) + (1 - damping) * sum_i alpha_i z_i.
    The solution alpha = H^-1 1 / (1^T H^-1 1), H = G^T G, is computed from the Jacobi-scaled
    matrix D^-1/2 H D^-1/2 + ridge I (D = diag H): the ridge acts on each residual relative to its
    own norm, so it stays scale free while the residuals shrink by orders of magnitude.
    H is kept up to date one row per step, in at least float32 (half-precision iterates work: the
    m x m system is never solved in 16 bits). Memory is fixed: 2 m vectors per sample (f(z_i) and
    g_i) and the m x m matrix H, whatever ``max_steps`` is.

    Args:
        m: history size (>= 1; m = 1 is damped Picard).
        ridge: Tikhonov regularisation of the scaled mixing problem (>= 0).
        damping: mixing parameter beta in (0, 1].
        tol, max_steps, divergence_factor, stop, safety, check_every: as for :class:`Picard`.
    """

    m: int = 5
    ridge: float = 1e-4
    damping: float = 1.0
    name = "anderson"

    def __post_init__(self):
        super().__post_init__()
        checks.positive_int(self.m, "m", "solvers.Anderson")
        checks.number(self.ridge, "ridge", "solvers.Anderson", lower=0.0)
        checks.unit_interval(self.damping, "damping", "solvers.Anderson")

    # History layout: f(z_i) and g_i = f(z_i) - z_i in (B, m, D) ring buffers (dtype of z), plus
    # their Gram matrix G^T G (B, m, m, at least float32), updated one row and column per step
    # (O(B m D) instead of O(B m^2 D)). The slot counter is a scalar: every sample still iterating
    # has recorded every step (a sample whose proposal is rejected stops for good), so all active
    # samples share it. Writes are dynamic_update_slice along the history axis: O(B D) per step,
    # batch sharding preserved.
    def init(self, z, fz):
        g = fz - z
        fs = _write_slot(_empty_history(z, self.m), 0, fz)
        gs = _write_slot(_empty_history(z, self.m), 0, g)
        gram = _dots("bid,bjd->bij", gs, gs)  # computed, not created: keeps the batch sharding
        return fs, gs, gram, jnp.ones((), jnp.int32)

    def propose(self, z, fz, state):
        fs, gs, gram, count = state
        m = self.m
        work = gram.dtype
        valid = jnp.arange(m) < jnp.minimum(count, m)  # (m,), the same for every sample
        # min a^T H a subject to sum(a) = 1 has a = H^-1 1 / (1^T H^-1 1) (H = G^T G, SPD). H is
        # solved in Jacobi-scaled form D^-1/2 H D^-1/2 + ridge I (D = diag H): the residuals of a
        # converging iteration span orders of magnitude, and a ridge relative to their mean norm
        # would swamp the newest (smallest) ones and stall the acceleration.
        diag = jnp.einsum("bii->bi", gram)
        # Columns with a zero residual (an exact fixed point) get weight zero. The double where
        # keeps rsqrt away from 0, whose derivative is infinite: unrolled differentiation through
        # a sample that has converged exactly would otherwise return NaN gradients.
        usable = valid[None, :] & (diag > jnp.finfo(work).tiny)
        inv_sqrt = jnp.where(usable, jax.lax.rsqrt(jnp.where(usable, diag, 1.0)), 0.0)
        scaled = gram * inv_sqrt[:, :, None] * inv_sqrt[:, None, :]
        # Unused slots get a unit diagonal and a zero right-hand side, which makes their a_i = 0.
        reg = jnp.where(usable, self.ridge, 1.0)
        hessian = scaled + reg[:, :, None] * jnp.eye(m, dtype=work)
        y = inv_sqrt * jnp.linalg.solve(hessian, inv_sqrt[..., None])[..., 0]
        total = jnp.sum(y, axis=1, keepdims=True)
        # All residuals zero: the sample sits on its fixed point; mix nothing but the newest f.
        newest = jax.nn.one_hot((count - 1) % m, m, dtype=work)[None, :]
        has_weight = total != 0
        alpha = jnp.where(has_weight, y / jnp.where(has_weight, total, 1.0), newest)
        mixed_f = _dots("bi,bid->bd", alpha, fs).astype(z.dtype)
        if self.damping == 1.0:  # one pass over the history instead of two
            return mixed_f, state
        # damping * sum a_i f_i + (1 - damping) * sum a_i z_i, with z_i = f_i - g_i.
        mixed_g = _dots("bi,bid->bd", alpha, gs).astype(z.dtype)
        return mixed_f - (1.0 - self.damping) * mixed_g, state

    def record(self, z, fz, state):
        fs, gs, gram, count = state
        slot = count % self.m
        g = fz - z
        fs = _write_slot(fs, slot, fz)
        gs = _write_slot(gs, slot, g)
        gram = _write_gram(gram, slot, _dots("bid,bd->bi", gs, g))
        return fs, gs, gram, count + 1


class BroydenState(NamedTuple):
    """The state of :class:`Broyden`: ``m`` rank-one pairs ``us``, ``vs`` (shape ``(B, m, D)``)
    of ``B = -I + sum_i u_i v_i^T``, the number ``count`` of pairs in the current cycle (a scalar
    shared by the batch), the last iterate ``z``, its residual ``g = f(z) - z`` and the next
    direction ``B g``."""

    us: jax.Array
    vs: jax.Array
    count: jax.Array
    z: jax.Array
    g: jax.Array
    direction: jax.Array


class Broyden(Solver):
    """Limited-memory ("good") Broyden's method on g(z) = f(z) - z (003 Eq. 6 and 10).

    The inverse-Jacobian estimate starts at B_0 = -I and receives the rank-one update of 003
    Eq. 10, B <- B + (dz - B dg) dz^T B / (dz^T B dg), stored as B = -I + sum_i u_i v_i^T with at
    most ``m`` pairs; when the history is full it restarts from -I, so memory does not grow with
    ``max_steps`` (the complaint of locuslab/deq issue 28). Steps are z <- z - step * B g.
    The first step is a Picard step. Updates whose denominator is tiny are skipped (their slot
    holds a zero pair). Inner products are accumulated in at least float32, so half-precision
    iterates work.

    Each step costs two products with the low-rank part (B g for the next step and B^T dz for the
    update): B dg is recovered as B g_new - B g_old, B g_old being the previous step's direction.

    Args:
        m: history size (number of rank-one pairs kept, >= 1).
        step: step length alpha of 003 Eq. 6, in (0, 1].
        tol, max_steps, divergence_factor, stop, safety, check_every: as for :class:`Picard`.

    The state (``SolverState.history``) is a :class:`BroydenState`; :meth:`inverse_jacobian`
    and :meth:`inverse_jacobian_transpose` apply its estimate B (what
    :class:`deqlab.implicit.SHINE` reuses). ``freeze_state = True``: a sample's pairs stop changing
    when it stops, so B is each sample's estimate at its own equilibrium.

    Example:
        >>> sol = deqlab.solve(f, z0, x, solver=Broyden(m=8, tol=1e-6), batch_axis=0)
        >>> Broyden(m=8).inverse_jacobian_transpose(sol.state.history, g, steps=sol.stats.steps)
    """

    m: int = 8
    step: float = 1.0
    name = "broyden"
    freeze_state = True

    def __post_init__(self):
        super().__post_init__()
        checks.positive_int(self.m, "m", "solvers.Broyden")
        checks.unit_interval(self.step, "step", "solvers.Broyden")

    # State: BroydenState(us, vs, count, z, g, direction) with direction = B g at the current z.
    # The pair counter is a scalar for the reason given in Anderson (all active samples share it).
    def init(self, z, fz):
        history = _empty_history(z, self.m)
        g = fz - z
        return BroydenState(history, history, jnp.zeros((), jnp.int32), z, g, -g)

    def pairs_in_use(self, state: BroydenState, steps: jax.Array | None = None,
                     start: BroydenState | None = None) -> jax.Array:
        """Weights (1 or 0) of the rank-one pairs of ``state`` that make up each sample's B.

        Args:
            state: the ``SolverState.history`` of a Broyden solve with this ``m``.
            steps: steps taken by each sample (``Solution.stats.steps``, shape ``(B,)`` or
                ``()``), which tell how many pairs of the shared buffer each sample's estimate
                holds (a sample that stopped early stopped adding pairs); None: the state's own
                counter, right when every sample took every step.
            start: the state a warm start continued (``init_state.history``), whose pairs the
                history still holds; None: a cold start.

        Returns:
            Shape ``(m,)`` with ``steps`` None, else ``(B, m)``, in at least float32.
        """
        work = precision_module.working_dtype(state.us.dtype)
        if steps is None:
            return (jnp.arange(self.m) < state.count).astype(work)
        steps = jnp.reshape(steps, (-1,))  # () without a batch axis: one row
        # After s recorded steps a sample's current cycle holds ((s - 1) mod m) + 1 pairs; a warm
        # start continues a cycle that held c0 pairs (its counter is shared by the batch):
        # ((c0 + s - 1) mod m) + 1, and c0 when the sample took no step.
        c0 = jnp.zeros((), jnp.int32) if start is None else jnp.asarray(start.count, jnp.int32)
        count = jnp.where(steps > 0, (c0 + steps - 1) % self.m + 1, c0)
        return (jnp.arange(self.m)[None, :] < count[:, None]).astype(work)

    def inverse_jacobian(self, state: BroydenState, x: jax.Array, steps: jax.Array | None = None) -> jax.Array:
        """``B x`` for the inverse-Jacobian estimate ``B ~ (J_f - I)^{-1}`` of g = f - z held in
        ``state`` (003 Eq. 10: ``B = -I + sum_i u_i v_i^T``), per sample.

        Args:
            state: ``SolverState.history`` of a Broyden solve (flattened rows).
            x: shape ``(B, D)``, as the solve's flattened iterates.
            steps: see :meth:`pairs_in_use`.

        Returns:
            ``B x``, shape and dtype of ``x``.
        """
        return self._apply(state.us, state.vs, self.pairs_in_use(state, steps), x)

    def inverse_jacobian_transpose(self, state: BroydenState, x: jax.Array,
                                   steps: jax.Array | None = None,
                                   start: BroydenState | None = None) -> jax.Array:
        """``B^T x`` for the estimate of :meth:`inverse_jacobian` (same arguments). With ``x`` a
        loss gradient g, ``-B^T g`` approximates the adjoint ``(I - J_f^T)^{-1} g`` of 003 Eq. 11
        (SHINE, Ramzi et al. 2022)."""
        return self._apply_transpose(state.us, state.vs, self.pairs_in_use(state, steps, start), x)

    @staticmethod
    def _apply(us, vs, used, x):
        """B x with B = -I + sum_{i used} u_i v_i^T."""
        coefficients = _dots("bid,bd->bi", vs, x) * used
        return -x + _dots("bid,bi->bd", us, coefficients).astype(x.dtype)

    @staticmethod
    def _apply_transpose(us, vs, used, x):
        """B^T x."""
        coefficients = _dots("bid,bd->bi", us, x) * used
        return -x + _dots("bid,bi->bd", vs, coefficients).astype(x.dtype)

    def propose(self, z, fz, state):
        return z - self.step * state.direction, state

    def record(self, z, fz, state):
        us, vs, count, z_prev, g_prev, direction = state
        # A full history restarts from B = -I: dropping only the oldest pair would leave the others
        # (each built on top of it) inconsistent, which diverges in practice.
        full = count >= self.m
        count = jnp.where(full, 0, count)
        work = precision_module.working_dtype(z.dtype)
        used = (jnp.arange(self.m) < count).astype(work)
        g = fz - z
        dz = z - z_prev
        b_g = self._apply(us, vs, used, g)
        b_g_prev = jnp.where(full, -g_prev, direction)
        b_dg = b_g - b_g_prev
        denom = _dots("bd,bd->b", dz, b_dg)
        # The skip test only decides; differentiating the norms of a zero step would give NaN.
        size = jax.lax.stop_gradient(_row_norm(dz) * _row_norm(b_dg))
        ok = (jnp.abs(jax.lax.stop_gradient(denom)) > jnp.finfo(z.dtype).eps * size) & (size > 0)
        safe = jnp.where(ok, denom, 1.0)
        u = jnp.where(ok[:, None], (dz - b_dg) / safe[:, None].astype(z.dtype), 0.0).astype(z.dtype)
        v = jnp.where(ok[:, None], self._apply_transpose(us, vs, used, dz), 0.0).astype(z.dtype)
        us = _write_slot(us, count, u)
        vs = _write_slot(vs, count, v)
        direction = b_g + u * _dots("bd,bd->b", v, g)[:, None].astype(z.dtype)
        return BroydenState(us, vs, count + 1, z, g, direction)


def _dots(spec, a, b):
    """einsum in at least float32 at full precision (half-precision iterates, TPU matmuls)."""
    work = precision_module.working_dtype(jnp.result_type(a, b))
    return jnp.einsum(spec, a.astype(work), b.astype(work), precision=_EXACT)


def _row_norm(x):
    """2-norm of each row of a (B, D) array, accumulated in at least float32."""
    work = precision_module.working_dtype(x.dtype)
    return jnp.sqrt(jnp.sum(jnp.square(x.astype(work)), axis=-1))


def _empty_history(z, m):
    """Zeros of shape (B, m, D) that inherit the sharding of z (B, D)."""
    return jnp.repeat(jnp.zeros_like(z)[:, None, :], m, axis=1)


def _per_sample_zeros(z):
    return jnp.zeros_like(z[:, 0], dtype=jnp.int32)


def _write_slot(history, slot, value):
    """history[:, slot] = value, for a scalar slot shared by the batch."""
    index = jnp.zeros((), jnp.int32)
    return jax.lax.dynamic_update_slice(history, value[:, None, :], (index, jnp.asarray(slot, jnp.int32), index))


def _write_gram(gram, slot, dots):
    """Row and column ``slot`` of the (B, m, m) Gram matrix set to ``dots`` (B, m)."""
    index = jnp.zeros((), jnp.int32)
    slot = jnp.asarray(slot, jnp.int32)
    gram = jax.lax.dynamic_update_slice(gram, dots[:, None, :], (index, slot, index))
    return jax.lax.dynamic_update_slice(gram, dots[:, :, None], (index, index, slot))


#: The forward solvers by name: ``"picard"``, ``"anderson"``, ``"broyden"``.
SOLVERS = {cls.name: cls for cls in (Picard, Anderson, Broyden)}


def get_solver(solver: str | Solver = "anderson", *, name: str = "solver", **overrides) -> Solver:
    """Return a solver configuration from a name or a configured object.

    ``overrides`` whose value is None are ignored: a configured object keeps its own settings
    unless a value is given (``get_solver(Anderson(tol=1e-8), tol=None)`` keeps 1e-8). ``name`` is
    the argument the user wrote, used in error messages.
    """
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if isinstance(solver, Solver):
        return dataclasses.replace(solver, **overrides) if overrides else solver
    if isinstance(solver, str) and solver in SOLVERS:
        return SOLVERS[solver](**overrides)
    raise ValueError(
        f"`{name}` must be one of {sorted(SOLVERS)} or a solver object such as "
        f"deqlab.solvers.Anderson(m=5) (an instance of a deqlab.Solver subclass), got {solver!r}."
    )


# --------------------------------------------------------------------------------------------
# Flattening a (possibly batched) pytree into a (B, D) matrix


class Flattener:
    """Maps a pytree whose leaves share a batch axis to a (B, D) array and back.

    ``name`` is the argument the pytree came from (for error messages).
    """

    def __init__(self, tree, batch_axis, name="z0"):
        leaves, self.treedef = jax.tree_util.tree_flatten(tree)
        if not leaves:
            raise ValueError(f"`{name}` must contain at least one array.")
        for leaf in leaves:
            if not hasattr(leaf, "dtype") or not hasattr(leaf, "shape"):
                raise ValueError(
                    f"`{name}` must be an array or a pytree of arrays, got a leaf of type "
                    f"{type(leaf).__name__} ({leaf!r}); convert it with jnp.asarray."
                )
            if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
                raise ValueError(
                    f"`{name}` must hold real floating-point arrays, got dtype {jnp.result_type(leaf)}."
                )
        self.dtype = jnp.result_type(*leaves)
        self.batch_axis = batch_axis
        self.shapes = [jnp.shape(leaf) for leaf in leaves]
        self.dtypes = [jnp.result_type(leaf) for leaf in leaves]
        if batch_axis is None:
            self.batch = 1
        else:
            sizes = set()
            for shape in self.shapes:
                if not -len(shape) <= batch_axis < len(shape):
                    raise ValueError(
                        f"`batch_axis` must index an axis of every leaf of {name} (ndim "
                        f"{len(shape)}, so -{len(shape)} <= batch_axis < {len(shape)}), got "
                        f"{batch_axis}."
                    )
                sizes.add(shape[batch_axis])
            if len(sizes) != 1:
                raise ValueError(
                    f"`{name}` leaves disagree on the size of batch axis {batch_axis}: {sorted(sizes)}."
                )
            self.batch = sizes.pop()
        moved = [self._moved_shape(s) for s in self.shapes]
        self.sizes = [int(np.prod(s[1:], dtype=np.int64)) for s in moved]
        self.dim = int(sum(self.sizes))
        if self.dim == 0 or self.batch == 0:
            raise ValueError(
                f"`{name}` must hold at least one number per sample, got leaves of shapes {self.shapes}"
                + ("" if batch_axis is None else f" with batch_axis={batch_axis}") + "."
            )

    def _moved_shape(self, shape):
        if self.batch_axis is None:
            return (1,) + tuple(shape)
        axis = self.batch_axis % len(shape)
        return (shape[axis],) + tuple(s for i, s in enumerate(shape) if i != axis)

    def flatten(self, tree):
        leaves = jax.tree_util.tree_leaves(tree)
        cols = []
        for leaf in leaves:
            leaf = jnp.asarray(leaf, self.dtype)
            if self.batch_axis is None:
                cols.append(leaf.reshape(1, -1))
            else:
                cols.append(jnp.moveaxis(leaf, self.batch_axis, 0).reshape(self.batch, -1))
        return jnp.concatenate(cols, axis=1)

    def unflatten(self, flat):
        leaves, start = [], 0
        for shape, size, dtype in zip(self.shapes, self.sizes, self.dtypes):
            block = flat[:, start : start + size]
            start += size
            moved = self._moved_shape(shape)
            block = block.reshape(moved)
            if self.batch_axis is None:
                leaf = block[0]
            else:
                leaf = jnp.moveaxis(block, 0, self.batch_axis % len(shape))
            leaves.append(leaf.astype(dtype))
        return jax.tree_util.tree_unflatten(self.treedef, leaves)

    def per_sample(self, x):
        """Drop the batch axis of per-sample statistics when the problem has none."""
        return x[..., 0] if self.batch_axis is None else x


def relative_residual(fz: jax.Array, z: jax.Array) -> jax.Array:
    """Relative residual of each row of (B, D) arrays (the tolerance rule of this module),
    accumulated in at least float32 and never differentiated (it only decides)."""
    fz, z = jax.lax.stop_gradient((fz, z))
    eps = jnp.finfo(z.dtype).eps
    scale = _row_norm(fz) + eps * math.sqrt(z.shape[-1])
    return _row_norm(fz - z) / scale


def check_problem(f, z0, args, has_aux=False):
    """Evaluate f's output structure once (abstractly) and name what is wrong, if anything."""
    if not callable(f):
        raise ValueError(f"`f` must be callable as f(z, *args), got {type(f).__name__}.")
    try:
        out = jax.eval_shape(lambda z, a: f(z, *a), z0, args)
    except (TypeError, ValueError) as err:
        raise ValueError(f"`f` could not be evaluated as f(z0, *args): {err}") from err
    if has_aux:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ValueError("with `has_aux=True`, `f` must return a pair (z_next, aux).")
        out = out[0]
    in_struct = jax.tree_util.tree_structure(z0)
    out_struct = jax.tree_util.tree_structure(out)
    if in_struct != out_struct:
        hint = " (if f returns (z, aux), pass has_aux=True)" if isinstance(out, tuple) else ""
        raise ValueError(
            f"`f` must return the same pytree structure as `z0`: got {out_struct}, "
            f"expected {in_struct}{hint}."
        )
    for leaf_in, leaf_out in zip(jax.tree_util.tree_leaves(z0), jax.tree_util.tree_leaves(out)):
        if jnp.shape(leaf_in) != leaf_out.shape:
            raise ValueError(
                f"`f` must map `z0` to an array of the same shape: z0 has shape "
                f"{jnp.shape(leaf_in)}, f(z0) has shape {leaf_out.shape}."
            )
        if not jnp.issubdtype(leaf_out.dtype, jnp.floating):
            raise ValueError(
                f"`f` must return real floating-point arrays like `z0` ({jnp.result_type(leaf_in)}), "
                f"got dtype {leaf_out.dtype}; a complex f(z) would lose its imaginary part."
            )
    # NaN inputs are rejected where they can be seen (outside jit); inside jit they surface as
    # Result.NONFINITE for the samples they touch.
    named = [("z0", z0)] + [(f"args[{i}]", a) for i, a in enumerate(args)]
    with jax.ensure_compile_time_eval():
        for name, tree in named:
            for leaf in jax.tree_util.tree_leaves(tree):
                if isinstance(leaf, jax.core.Tracer) or not hasattr(leaf, "dtype"):
                    continue
                if jnp.issubdtype(leaf.dtype, jnp.inexact) and not bool(jnp.all(jnp.isfinite(leaf))):
                    raise ValueError(f"`{name}` contains NaN or inf; inputs must be finite.")


def _where_batch(mask, new, old):
    """Per-sample select on pytrees whose leaves have a leading batch axis."""

    def select(a, b):
        if jnp.ndim(a) == 0:
            return a
        shaped = mask.reshape(mask.shape + (1,) * (jnp.ndim(a) - 1))
        return jnp.where(shaped, a, b)

    return jax.tree_util.tree_map(select, new, old)


def _run(config, tol, func, z0_flat, unrolled, init_history=None):
    """The shared iteration loop on (B, D) arrays.

    ``unrolled=True`` uses ``lax.scan`` over exactly ``max_steps`` (frozen samples are masked), so
    reverse-mode differentiation through the iterations works; otherwise ``lax.while_loop``.
    ``init_history`` continues a solver history from an earlier solve (``SolverState.history``).
    With ``config.check_every = k > 1`` (and not unrolled) the loop takes k steps per check: the
    first k - 1 are bare solver steps, the k-th is judged (see the module docstring).
    """
    dtype = z0_flat.dtype
    work = precision_module.working_dtype(dtype)
    big = jnp.finfo(work).max
    error_rule = config.stop == "error"
    # Which rate estimate the error rule uses (Solver.rate_estimate): residual ratios over a
    # window of RATE_WINDOW steps, or the largest secant quotient of the solve.
    ratios = config.rate_estimate == "residual_ratio"
    fz0 = func(z0_flat)
    # Adopt the layout of f's output: z0 is often a fresh, replicated zeros array while the input
    # (and so f(z0)) is sharded over the batch.
    z0_flat = z0_flat + jnp.zeros_like(fz0)
    finite0 = jnp.all(jnp.isfinite(fz0), axis=1)
    res0 = jnp.where(finite0, relative_residual(fz0, z0_flat), big)
    abs0 = jnp.where(finite0, _row_norm(jax.lax.stop_gradient(fz0 - z0_flat)), big)
    result0 = jnp.where(
        ~finite0, Result.NONFINITE, jnp.where(res0 <= tol, Result.SUCCESS, Result.MAX_STEPS_REACHED)
    ).astype(jnp.int32)
    active0 = result0 == Result.MAX_STEPS_REACHED
    # One row per step, written with dynamic_update_slice: O(B) per step, and the batch axis (the
    # second) keeps the sharding of the residuals when the batch is split across devices.
    trace0 = jnp.repeat(res0[None, :], config.max_steps + 1, axis=0)
    fz0_safe = jnp.where(finite0[:, None], fz0, z0_flat)
    history0 = config.init(z0_flat, fz0_safe) if init_history is None else init_history
    carry0 = dict(
        z=z0_flat,
        fz=fz0_safe,
        res=res0,
        best_z=z0_flat,
        best_res=res0,
        best_abs=abs0,
        active=active0,
        result=result0,
        steps=_per_sample_zeros(z0_flat),
        step=jnp.zeros((), jnp.int32),
        nfe=jnp.ones((), jnp.int32),
        trace=trace0,
        state=history0,
    )
    if error_rule:
        # The last RATE_WINDOW rate estimates (inf: none yet, so the residual rule decides), the
        # absolute residual of the accepted iterate (Picard's rate is a ratio of two of them) and
        # the error estimate of the value the sample would return.
        carry0["rates"] = (jnp.full(res0.shape + (RATE_WINDOW,), jnp.inf, work) if ratios
                           else jnp.zeros(res0.shape + (1,), work))
        carry0["abs"] = abs0
        carry0["err"] = jnp.full(res0.shape, jnp.inf, work)

    residual_floor = jnp.finfo(dtype).eps * math.sqrt(z0_flat.shape[1])
    def bare(z, fz, state):
        """One solver step without any check: what the limit of plain iteration costs."""
        z_prop, state = config.propose(z, fz, state)
        fz_prop = func(z_prop)
        return z_prop, fz_prop, config.record(z_prop, fz_prop, state)

    def judged(carry, z_in, fz_in, state_in, span):
        """One solver step from (z_in, fz_in, state_in), judged: ``span`` steps after the last
        judged one (z_in is the carry's iterate when span is 1)."""
        z_prop, state_prop = config.propose(z_in, fz_in, state_in)
        fz_prop = func(z_prop)
        # A NaN or inf anywhere in z_prop or f(z_prop) makes the norms non-finite (as does an
        # overflow of the norm, which only a diverging iterate reaches). The norms only decide and
        # report, so they are not differentiated (the norm of an exact zero has no derivative).
        diff = jax.lax.stop_gradient(fz_prop - z_prop)
        diff_norm = _row_norm(diff)
        f_norm = _row_norm(jax.lax.stop_gradient(fz_prop))
        finite = jnp.isfinite(diff_norm) & jnp.isfinite(f_norm)
        active = carry["active"]
        accept = active & finite
        z = jnp.where(accept[:, None], z_prop, carry["z"])
        fz = jnp.where(accept[:, None], fz_prop, carry["fz"])
        res_prop = jnp.where(finite, diff_norm / (f_norm + residual_floor), big)
        abs_prop = jnp.where(finite, diff_norm, big)
        res = jnp.where(accept, res_prop, carry["res"])
        state = config.record(z_prop, fz_prop, state_prop)
        if unrolled or config.freeze_state:
            # Rejected and frozen samples never become active again, so their solver state is
            # irrelevant to the result; it is kept finite only when differentiating through the
            # loop (a NaN in an unselected branch would still poison the gradient). A solver with
            # freeze_state (Broyden) also keeps it as it was when the sample stopped: Broyden's is
            # the inverse-Jacobian estimate at that sample's equilibrium that SHINE reuses.
            state = _where_batch(accept, state, carry["state"])
        # The best iterate is the one closest to convergence in absolute terms: a relative
        # residual also falls when an iterate runs off to infinity (for f = 2z + 1 it tends to
        # 1/2), so it cannot tell a diverging iterate from a converging one.
        improved = accept & (abs_prop < carry["best_abs"])
        best_z = jnp.where(improved[:, None], z_prop, carry["best_z"])
        best_res = jnp.where(improved, res_prop, carry["best_res"])
        best_abs = jnp.where(improved, abs_prop, carry["best_abs"])
        extra = {}
        if error_rule:
            if ratios:
                # A stationary iteration (Picard): successive residuals shrink by the contraction rate of the (damped) map,
                # ||g_k|| / ||g_{k-1}||; over a span of k steps, its k-th root.
                ratio = abs_prop / carry["abs"]
                rate = ratio if span == 1 else ratio ** (1.0 / span)
            else:
                # Accelerated solvers (Anderson, Broyden): their residual ratios measure the
                # acceleration, not f. The secant quotient ||f(z') - f(z)|| / ||z' - z|| of the last step measures how much
                # f stretches along it, a lower estimate of f's Lipschitz constant near z*.
                step_norm = _row_norm(jax.lax.stop_gradient(z_prop - z_in))
                rate = _row_norm(jax.lax.stop_gradient(fz_prop - fz_in)) / step_norm
            rate = jnp.where(finite & jnp.isfinite(rate), rate, jnp.inf).astype(work)
            if ratios:
                # Picard's ratios rise towards the rate of its slowest mode as the faster ones die
                # out: the last few (their maximum, against noise) estimate the rate now.
                rates = jnp.concatenate([carry["rates"][:, 1:], rate[:, None]], axis=1)
            else:
                # An accelerated step moves mostly along directions f stretches little, so a single
                # quotient underestimates f's rate near z* (up to 6x in the error bound at rate
                # 0.995, measured): the maximum over every step of the solve is kept.
                rates = jnp.maximum(carry["rates"], rate[:, None])
            rates = jnp.where(accept[:, None], rates, carry["rates"])
            q = jnp.max(rates, axis=1)
            reliable = q < RATE_LIMIT
            q_safe = jnp.where(reliable, q, 0.0)
            # Banach's a-posteriori bounds (Solver.error_bound_factor): Picard returns
            # z + damping (f(z) - z), within q / (1 - q) of its step from z*; the others return z,
            # within ||f(z) - z|| / (1 - q).
            gain = config.error_bound_factor(q_safe)
            size = jnp.max(jnp.abs(diff), axis=1).astype(work)
            scale = jnp.maximum(jnp.max(jnp.abs(jax.lax.stop_gradient(fz_prop)), axis=1).astype(work), 1.0)
            err_prop = jnp.where(reliable & finite, config.safety * gain * size / scale, jnp.inf)
            meets = jnp.where(reliable, err_prop <= tol, res_prop <= tol)
            extra = dict(rates=rates, abs=jnp.where(accept, abs_prop, carry["abs"]),
                         err=jnp.where(accept, err_prop, carry["err"]))
        else:
            meets = res_prop <= tol
        converged = accept & meets
        diverged = accept & ~converged & (abs_prop > config.divergence_factor * carry["best_abs"])
        result = carry["result"]
        result = jnp.where(active & ~finite, Result.NONFINITE, result)
        result = jnp.where(converged, Result.SUCCESS, result)
        result = jnp.where(diverged, Result.DIVERGED, result).astype(jnp.int32)
        step = carry["step"] + span
        steps = carry["steps"] + span * active.astype(jnp.int32)
        rows = res[None, :] if span == 1 else jnp.broadcast_to(res[None, :], (span,) + res.shape)
        trace = jax.lax.dynamic_update_slice(carry["trace"], rows, (step - span + 1, jnp.zeros_like(step)))
        return dict(
            z=z,
            fz=fz,
            res=res,
            best_z=best_z,
            best_res=best_res,
            best_abs=best_abs,
            active=active & finite & ~converged & ~diverged,
            result=result,
            steps=steps,
            step=step,
            nfe=carry["nfe"] + span,
            trace=trace,
            state=state,
            **extra,
        )

    def body(carry):
        return judged(carry, carry["z"], carry["fz"], carry["state"], 1)

    every = 1 if unrolled else min(config.check_every, config.max_steps)

    def chunk(carry):
        z, fz, state = carry["z"], carry["fz"], carry["state"]
        for _ in range(every - 1):
            z, fz, state = bare(z, fz, state)
        return judged(carry, z, fz, state, every)

    if unrolled:
        final, _ = jax.lax.scan(lambda c, _: (body(c), None), carry0, None, length=config.max_steps)
    else:
        final = carry0
        if every > 1:
            # Whole chunks while they fit, then single judged steps up to max_steps.
            final = jax.lax.while_loop(
                lambda c: jnp.any(c["active"]) & (c["step"] + every <= config.max_steps), chunk, final)

        def cond(carry):
            return jnp.any(carry["active"]) & (carry["step"] < config.max_steps)

        final = jax.lax.while_loop(cond, body, final)

    # Rows after the last step repeat the final residual, so the trace is finite and plottable.
    rows = jnp.arange(config.max_steps + 1)[:, None]
    trace = jnp.where(rows <= final["step"], final["trace"], final["res"][None, :])
    # A converged sample was frozen at the iterate that met tol: its value is that iterate (its
    # last z); any other sample returns its finite iterate of smallest absolute residual. In
    # unrolled mode both selections are where()s, so the value stays differentiable.
    success = final["result"] == Result.SUCCESS
    value = jnp.where(success[:, None], final["z"], final["best_z"])
    if config.steps_past_convergence:
        # f(z) of the converged iterate is in fz already: one more step costs nothing.
        stepped, _ = config.propose(final["z"], final["fz"], final["state"])
        value = jnp.where(success[:, None], stepped, value)
    stats = dict(
        steps=final["steps"],
        nfe=final["nfe"],
        trace=trace,
        best_res=jnp.where(success, final["res"], final["best_res"]),
        res=final["res"],
        err=final["err"] if error_rule else None,
    )
    return value, final["result"], stats, SolverState(final["z"], final["state"])


def solve(
    f: Callable[..., Any],
    z0: Any,
    *args: Any,
    solver: str | Solver = "anderson",
    tol: float | None = None,
    max_steps: int | None = None,
    batch_axis: int | None = None,
    on_failure: str = "warn",
    unrolled: bool = False,
    has_aux: bool = False,
    precision: Any = None,
    init_state: SolverState | None = None,
    stop: str | None = None,
    throw: Any = NOT_GIVEN,
) -> Solution:
    """Find ``z* = f(z*, *args)`` starting from ``z0`` (003 Eq. 4-6).

    Args:
        f: the map, called as ``f(z, *args)``; must return a pytree shaped like ``z`` (or a pair
            ``(z_next, aux)`` with ``has_aux=True``).
        z0: initial guess (an array or a pytree of real floating arrays).
        *args: further arguments of ``f`` (parameters, inputs), passed explicitly.
        solver: ``"picard"``, ``"anderson"``, ``"broyden"`` or a configured object such as
            ``Anderson(m=5, tol=1e-6)``, or an instance of your own :class:`Solver` subclass; its
            settings are kept unless ``tol`` / ``max_steps`` are given here.
        tol: relative-residual tolerance (overrides the solver's). None (and a solver object
            without one): the default of z0's dtype, :func:`deqlab.precision.default_tol`
            (float64 1e-10, float32 1e-5, 16-bit 1e-2 / 5e-2). A tolerance the dtype cannot
            reach warns once (:class:`deqlab.precision.PrecisionWarning`).
        max_steps: iteration limit (overrides the solver's).
        batch_axis: axis of every leaf of ``z0`` that indexes independent samples, or None.
        on_failure: what a sample that did not converge does: ``"warn"`` (default; a
            :class:`~deqlab.failures.SolverWarning` attributed to your line), ``"raise"``
            (:class:`~deqlab.failures.SolverError`), ``"nan"`` (its value becomes NaN; no host callback, the
            choice for TPUs) or ``"ignore"`` (``Solution.result`` is the only record); the same
            policy as :func:`deqlab.implicit.fixed_point` and :class:`deqlab.nn.DEQ`
            (:mod:`deqlab.failures`).
        unrolled: iterate with ``lax.scan`` for exactly ``max_steps`` (frozen samples masked) so
            that reverse-mode autodiff can go through the iterations.
        has_aux: ``f`` returns ``(z_next, aux)``; ``Solution.aux`` is ``aux`` at the returned
            value (one more evaluation of f, counted in ``nfe``).
        precision: matmul precision of f's evaluations (``"default"``, ``"high"``,
            ``"highest"``); None: what ``tol`` needs (:func:`deqlab.precision.required_precision`;
            it matters on TPUs and TF32 GPUs only, see :mod:`deqlab.precision`).
        init_state: ``Solution.state`` of an earlier solve of the same problem, to continue it
            (its iterate replaces ``z0``'s values; ``z0`` still gives the structure).
        stop: the stopping rule, ``"residual"`` or ``"error"`` (overrides the solver's; see the
            module docstring for what ``tol`` means under each).
        throw: removed in deqlab 0.6 (``on_failure="raise"`` / ``"ignore"``); given, it raises a
            TypeError that says so.

    Returns:
        :class:`Solution` with per-sample ``result``, ``converged``, ``stats`` and ``state``.

    Raises:
        ValueError: on a malformed problem (f's output structure, shapes or dtypes, NaN or inf
            in concrete inputs, a bad ``init_state`` or option).
        SolverError: with ``on_failure="raise"``, when some sample failed (eagerly, raised
            after the computation returns; inside your ``jit``, from a host callback, wrapped in
            JAX's runtime error).

    Caching:
        The computation runs under an internal ``jax.jit`` whose cache key is the function
        object ``f`` (by identity), the static configuration (the solver object with its
        ``tol`` / ``max_steps`` / ``stop``, ``batch_axis``, ``unrolled``, ``has_aux``,
        ``precision``) and the non-array leaves of ``args`` (Python numbers stay Python numbers
        and are part of the key); the array leaves of ``z0``, ``args`` and ``init_state`` are
        traced. A second eager call with the same ``f`` and shapes costs the jit dispatch
        (milliseconds instead of a compilation); ``jax.jit``, ``jax.vmap`` and ``jax.grad`` from
        outside compose with it. A new ``f`` object each call (a ``lambda`` written in the call)
        compiles again. What ``f`` reads besides its arguments is part of the key: arrays from its
        closure or globals by identity (rebinding ``W`` compiles again), scalars by value, the
        functions it calls followed likewise; an ``f`` that reads state the key cannot follow (a
        callable object such as an ``nnx.Module``, a list) runs uncached, so it is never stale.
        NumPy arrays changed in place are not seen: pass changing arrays in ``args``. Checks on
        concrete values and the failure policy run outside the jit (see ``deqlab._eager``).

    Example:
        >>> import jax.numpy as jnp, deqlab
        >>> f = lambda z, x: 0.5 * jnp.tanh(z) + x
        >>> sol = deqlab.solve(f, jnp.zeros(3), jnp.ones(3))
        >>> bool(sol.converged)
        True
    """
    removed_throw(throw, "solve")
    check_policy(on_failure, "solve")
    if not isinstance(has_aux, bool):
        raise checks.fail("has_aux", "True or False", has_aux, "solve")
    if not isinstance(unrolled, bool):
        raise checks.fail("unrolled", "True or False", unrolled, "solve")
    _check_init_state(init_state, "solve")
    config = get_solver(solver, tol=tol, max_steps=max_steps, stop=stop)
    if batch_axis is not None and (isinstance(batch_axis, bool) or not isinstance(batch_axis, int)):
        raise ValueError(f"`batch_axis` must be an int or None, got {batch_axis!r}.")
    if not callable(f):
        raise ValueError(f"`f` must be callable as f(z, *args), got {type(f).__name__}.")
    flattener = Flattener(z0, batch_axis)
    precision_module.check_tol(config.resolved_tol(flattener.dtype), flattener.dtype, "solve")
    # Checks on concrete values run here, eagerly; the structural checks (check_problem) run where
    # f is traced, in _solve_traced, once per compilation.
    _eager.check_finite([("z0", z0)] + [(f"args[{i}]", a) for i, a in enumerate(args)])
    solution = _eager.cached_call(
        _solve_traced, f, (z0, args, init_state),
        dict(config=config, batch_axis=batch_axis, unrolled=unrolled, has_aux=has_aux, precision=precision),
    )
    signal("solve", "", on_failure, solution.result, solution.stats.best_residual)
    if on_failure == "nan":
        solution = solution._replace(value=nan_where_failed(solution.value, solution.result, batch_axis))
    return solution


def _check_init_state(init_state, where):
    """``init_state`` must be None or a :class:`SolverState` (a hint for a whole ``Solution``)."""
    if init_state is None or isinstance(init_state, SolverState):
        return
    hint = " (pass its .state)" if isinstance(init_state, Solution) else ""
    raise ValueError(f"{where}: `init_state` must be the `state` of an earlier Solution of this problem "
                     f"(a deqlab.solvers.SolverState) or None, got {type(init_state).__name__}{hint}.")


def _solve_traced(f, z0, args, init_state, *, config, batch_axis, unrolled, has_aux, precision):
    """The computation of :func:`solve` (run under its cached jit, see ``deqlab._eager``)."""
    flattener = Flattener(z0, batch_axis)
    check_problem(f, z0, args, has_aux)
    resolved_tol = config.resolved_tol(flattener.dtype)
    level = precision_module.required_precision(resolved_tol, flattener.dtype) if precision is None else precision

    def func(z_flat):
        with precision_module.matmul_precision(level):
            out = f(flattener.unflatten(z_flat), *args)
        return flattener.flatten(out[0] if has_aux else out)

    z0_flat = flattener.flatten(z0)
    history = None
    if init_state is not None:
        if not isinstance(init_state, SolverState) or jnp.shape(init_state.z) != z0_flat.shape:
            raise ValueError(
                f"`init_state` must be the `state` of an earlier Solution of this problem "
                f"(a SolverState with z of shape {z0_flat.shape}), got {type(init_state).__name__}."
            )
        expected = jax.tree_util.tree_structure(jax.eval_shape(config.init, z0_flat, z0_flat))
        if jax.tree_util.tree_structure(init_state.history) != expected:
            raise ValueError(
                f"`init_state` holds the history of another solver than {type(config).__name__}."
            )
        z0_flat, history = init_state.z.astype(z0_flat.dtype), init_state.history
    value, result, stats, state = _run(config, resolved_tol, func, z0_flat, unrolled, history)
    aux = None
    nfe = stats["nfe"]
    if has_aux:
        with precision_module.matmul_precision(level):
            aux = f(flattener.unflatten(value), *args)[1]
        nfe = nfe + 1
    solution = Solution(
        value=flattener.unflatten(value),
        result=flattener.per_sample(result),
        stats=SolveStats(
            steps=flattener.per_sample(stats["steps"]),
            nfe=nfe,
            residual_trace=flattener.per_sample(stats["trace"]),
            best_residual=flattener.per_sample(stats["best_res"]),
            residual=flattener.per_sample(stats["res"]),
            tol=jnp.asarray(resolved_tol, precision_module.working_dtype(flattener.dtype)),
            error_estimate=None if stats["err"] is None else flattener.per_sample(stats["err"]),
        ),
        state=state,
        aux=aux,
    )
    return solution


def raise_if_failed(solution: Solution, what: str = "solve") -> None:
    """Raise :class:`~deqlab.failures.SolverError` naming the failing samples of ``solution`` (concrete values only).

    Args:
        solution: a :class:`Solution` returned outside ``jit``.
        what: the name the message starts with.

    Raises:
        SolverError: some sample did not converge.
        ValueError: ``solution`` holds tracers (inside ``jit``: use ``on_failure="raise"``).
    """
    if checks.is_traced(solution.result):
        raise ValueError("raise_if_failed needs concrete values: inside jit, pass on_failure='raise' "
                         "to the solve instead.")
    signal(what, "", "raise", solution.result, solution.stats.best_residual)
