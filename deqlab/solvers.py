"""Forward fixed-point solvers for equilibrium models: damped Picard, Anderson, Broyden.

A deep equilibrium model (003 §3.1, Eq. 4) outputs the fixed point z* = f(z*, x). This module
finds it. Every solver here works on a pytree ``z`` and returns a :class:`Solution` carrying the
value, a per-sample :class:`Result`, and statistics (steps, function evaluations, the residual
trace and the best residual).

Tolerance rule (one rule for every solver)
    A sample has converged when its *relative residual*

    .. math:: \\rho(z) = \\frac{\\lVert f(z) - z \\rVert_2}{\\lVert f(z) \\rVert_2 + \\epsilon\\sqrt{D}}

    satisfies ``rho <= tol``. Norms are taken per sample over all its entries (all leaves of the
    pytree, D numbers in total); ``epsilon`` is the machine epsilon of the iterate's dtype, so a
    fixed point at exactly zero is still reachable. With ``batch_axis=None`` the whole pytree is
    one sample.

Batches
    With ``batch_axis=k`` the k-th axis of every leaf indexes independent samples. Each sample is
    judged on its own (the batch is not judged by its worst member): a sample that has converged,
    diverged or produced a non-finite value is frozen, its statistics stop, and the loop ends when
    no sample is active or ``max_steps`` is reached. ``f`` is always evaluated on the whole batch,
    so it must act on samples independently (as any batched network layer does).

Failure is reported, never hidden
    ``Result.DIVERGED`` when the absolute residual grows by ``divergence_factor`` over the best one
    seen; ``Result.NONFINITE`` when ``f`` returns NaN or inf (the non-finite iterate is never
    accepted); ``Result.MAX_STEPS_REACHED`` otherwise. The returned value is the best iterate (the
    smallest relative residual seen), which is the last one whenever the residual decreased; for a
    converged sample, :class:`Picard` returns one step further, ``z + damping (f(z) - z)`` from
    that iterate: ``f(z)`` was evaluated to check convergence, and where the damped map contracts
    (which is when Picard converges) that step is closer to the fixed point at no cost. The
    statistics describe the iterate the step starts from.
    Inside ``jit`` nothing raises; outside, ``throw=True`` raises :class:`SolverError` listing the
    failing samples and their residuals.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "Result",
    "SolveStats",
    "Solution",
    "SolverError",
    "Picard",
    "Anderson",
    "Broyden",
    "SOLVERS",
    "get_solver",
    "solve",
    "relative_residual",
]


class Result(enum.IntEnum):
    """Outcome of a solve, one per sample."""

    SUCCESS = 0
    MAX_STEPS_REACHED = 1
    DIVERGED = 2
    NONFINITE = 3


class SolverError(RuntimeError):
    """Raised by ``solve(..., throw=True)`` when some sample did not converge."""


class SolveStats(NamedTuple):
    """Statistics of one solve.

    Attributes:
        steps: iterations taken by each sample (shape ``(B,)``, or ``()`` without a batch axis).
        nfe: number of evaluations of ``f`` on the batch (including the one at ``z0``).
        residual_trace: relative residual of each sample after each step, shape
            ``(max_steps + 1, B)`` (row 0 is at ``z0``); a frozen sample repeats its last value.
        best_residual: smallest relative residual of each sample (that of the returned value).
        residual: relative residual of the last accepted iterate of each sample.
    """

    steps: jax.Array
    nfe: jax.Array
    residual_trace: jax.Array
    best_residual: jax.Array
    residual: jax.Array


class Solution(NamedTuple):
    """Result of :func:`solve`: ``value`` (same pytree as ``z0``), ``result`` and ``stats``."""

    value: Any
    result: jax.Array
    stats: SolveStats

    @property
    def converged(self) -> jax.Array:
        """Boolean per sample: did it reach the tolerance?"""
        return self.result == Result.SUCCESS


# --------------------------------------------------------------------------------------------
# Solver configurations


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}.")


def _check_positive_float(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"`{name}` must be a positive finite number, got {value!r}.")
    if not math.isfinite(float(value)) or float(value) <= 0:
        raise ValueError(f"`{name}` must be a positive finite number, got {value!r}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _SolverConfig:
    tol: float = 1e-5
    max_steps: int = 100
    divergence_factor: float = 1e4

    name = "base"

    def __post_init__(self):
        _check_positive_float("tol", self.tol)
        _check_positive_int("max_steps", self.max_steps)
        _check_positive_float("divergence_factor", self.divergence_factor)
        if self.divergence_factor <= 1:
            raise ValueError(
                f"`divergence_factor` must be > 1, got {self.divergence_factor!r}."
            )

    # Each solver implements: init(z, fz) -> state and propose(z, fz, state) -> (z_next, state).
    # Arrays are (B, D); states are pytrees of arrays whose leading axis is the batch.
    def init(self, z, fz):
        raise NotImplementedError

    def propose(self, z, fz, state):
        raise NotImplementedError

    def record(self, z, fz, state):
        """Update the solver's history with an evaluated proposal (default: nothing to keep)."""
        return state

    # True when one more proposal from a converged iterate needs no new information: the step is
    # then taken on the returned value (plain and damped Picard; not Anderson or Broyden, whose
    # next step mixes a history that a frozen sample no longer updates).
    steps_past_convergence = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class Picard(_SolverConfig):
    """Damped Picard iteration z <- (1 - damping) z + damping f(z) (003 Eq. 5 for damping=1).

    Args:
        damping: step fraction in (0, 1]; 1 is plain fixed-point iteration.
        tol, max_steps, divergence_factor: see the module docstring.
    """

    damping: float = 1.0
    name = "picard"
    steps_past_convergence = True

    def __post_init__(self):
        super().__post_init__()
        _check_unit_interval("damping", self.damping)

    def init(self, z, fz):
        return ()

    def propose(self, z, fz, state):
        if self.damping == 1.0:
            return fz, state
        return z + self.damping * (fz - z), state


def _check_unit_interval(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
        raise ValueError(f"`{name}` must be a number in (0, 1], got {value!r}.")
    if not (0.0 < float(value) <= 1.0):
        raise ValueError(f"`{name}` must be in (0, 1], got {value!r}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Anderson(_SolverConfig):
    """Anderson acceleration (type II) with a history of ``m`` iterates (Anderson 1965;
    Walker & Ni 2011).

    Each step solves, per sample, the regularised least-squares problem
    min_alpha ||G alpha||^2 subject to sum(alpha) = 1, where the columns of G are the last ``m``
    residuals g_i = f(z_i) - z_i, then mixes
    z <- damping * sum_i alpha_i f(z_i) + (1 - damping) * sum_i alpha_i z_i.
    The solution alpha = H^-1 1 / (1^T H^-1 1), H = G^T G, is computed from the Jacobi-scaled
    matrix D^-1/2 H D^-1/2 + ridge I (D = diag H): the ridge acts on each residual relative to its
    own norm, so it stays scale free while the residuals shrink by orders of magnitude.
    H is kept up to date one row per step. Memory is fixed: 2 m vectors per sample (f(z_i) and
    g_i) and the m x m matrix H, whatever ``max_steps`` is.

    Args:
        m: history size (>= 1; m = 1 is damped Picard).
        ridge: Tikhonov regularisation of the scaled mixing problem (>= 0).
        damping: mixing parameter beta in (0, 1].
    """

    m: int = 5
    ridge: float = 1e-4
    damping: float = 1.0
    name = "anderson"

    def __post_init__(self):
        super().__post_init__()
        _check_positive_int("m", self.m)
        if isinstance(self.ridge, bool) or not isinstance(self.ridge, (int, float, np.floating)):
            raise ValueError(f"`ridge` must be a finite number >= 0, got {self.ridge!r}.")
        if not math.isfinite(float(self.ridge)) or self.ridge < 0:
            raise ValueError(f"`ridge` must be a finite number >= 0, got {self.ridge!r}.")
        _check_unit_interval("damping", self.damping)

    # History layout: f(z_i) and g_i = f(z_i) - z_i in (B, m, D) ring buffers, plus their Gram
    # matrix G^T G (B, m, m), updated one row and column per step (O(B m D) instead of O(B m^2 D)).
    # The slot counter is a scalar: every sample still iterating has recorded every step (a sample
    # whose proposal is rejected stops for good), so all active samples share it. Writes are
    # dynamic_update_slice along the history axis: O(B D) per step, batch sharding preserved.
    def init(self, z, fz):
        g = fz - z
        fs = _write_slot(_empty_history(z, self.m), 0, fz)
        gs = _write_slot(_empty_history(z, self.m), 0, g)
        gram = jnp.einsum("bid,bjd->bij", gs, gs)  # computed, not created: keeps the batch sharding
        return fs, gs, gram, jnp.ones((), jnp.int32)

    def propose(self, z, fz, state):
        fs, gs, gram, count = state
        m = self.m
        valid = jnp.arange(m) < jnp.minimum(count, m)  # (m,), the same for every sample
        # min a^T H a subject to sum(a) = 1 has a = H^-1 1 / (1^T H^-1 1) (H = G^T G, SPD). H is
        # solved in Jacobi-scaled form D^-1/2 H D^-1/2 + ridge I (D = diag H): the residuals of a
        # converging iteration span orders of magnitude, and a ridge relative to their mean norm
        # would swamp the newest (smallest) ones and stall the acceleration.
        diag = jnp.einsum("bii->bi", gram)
        inv_sqrt = jnp.where(valid[None, :], jax.lax.rsqrt(diag + jnp.finfo(z.dtype).tiny), 0.0)
        scaled = gram * inv_sqrt[:, :, None] * inv_sqrt[:, None, :]
        # Unused slots get a unit diagonal and a zero right-hand side, which makes their a_i = 0.
        reg = jnp.where(valid, self.ridge, 1.0)
        hessian = scaled + reg[None, :, None] * jnp.eye(m, dtype=z.dtype)
        y = inv_sqrt * jnp.linalg.solve(hessian, inv_sqrt[..., None])[..., 0]
        alpha = y / jnp.sum(y, axis=1, keepdims=True)
        mixed_f = jnp.einsum("bi,bid->bd", alpha, fs)
        if self.damping == 1.0:  # one pass over the history instead of two
            return mixed_f, state
        # damping * sum a_i f_i + (1 - damping) * sum a_i z_i, with z_i = f_i - g_i.
        return mixed_f - (1.0 - self.damping) * jnp.einsum("bi,bid->bd", alpha, gs), state

    def record(self, z, fz, state):
        fs, gs, gram, count = state
        slot = count % self.m
        g = fz - z
        fs = _write_slot(fs, slot, fz)
        gs = _write_slot(gs, slot, g)
        gram = _write_gram(gram, slot, jnp.einsum("bid,bd->bi", gs, g))
        return fs, gs, gram, count + 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class Broyden(_SolverConfig):
    """Limited-memory ("good") Broyden's method on g(z) = f(z) - z (003 Eq. 6 and 10).

    The inverse-Jacobian estimate starts at B_0 = -I and receives the rank-one update of 003
    Eq. 10, B <- B + (dz - B dg) dz^T B / (dz^T B dg), stored as B = -I + sum_i u_i v_i^T with at
    most ``m`` pairs; when the history is full it restarts from -I, so memory does not grow with
    ``max_steps`` (the complaint of locuslab/deq issue 28). Steps are z <- z - step * B g.
    The first step is a Picard step. Updates whose denominator is tiny are skipped (their slot
    holds a zero pair).

    Each step costs two products with the low-rank part (B g for the next step and B^T dz for the
    update): B dg is recovered as B g_new - B g_old, B g_old being the previous step's direction.

    Args:
        m: history size (number of rank-one pairs kept, >= 1).
        step: step length alpha of 003 Eq. 6, in (0, 1].
    """

    m: int = 8
    step: float = 1.0
    name = "broyden"

    def __post_init__(self):
        super().__post_init__()
        _check_positive_int("m", self.m)
        _check_unit_interval("step", self.step)

    # State: (us, vs, count, z, g, direction) with direction = B g at the current z. The pair
    # counter is a scalar for the reason given in Anderson (all active samples share it).
    def init(self, z, fz):
        history = _empty_history(z, self.m)
        g = fz - z
        return history, history, jnp.zeros((), jnp.int32), z, g, -g

    @staticmethod
    def _apply(us, vs, used, x):
        """B x with B = -I + sum_{i used} u_i v_i^T."""
        return -x + jnp.einsum("bid,bi->bd", us, jnp.einsum("bid,bd->bi", vs, x) * used)

    @staticmethod
    def _apply_transpose(us, vs, used, x):
        """B^T x."""
        return -x + jnp.einsum("bid,bi->bd", vs, jnp.einsum("bid,bd->bi", us, x) * used)

    def propose(self, z, fz, state):
        return z - self.step * state[5], state

    def record(self, z, fz, state):
        us, vs, count, z_prev, g_prev, direction = state
        # A full history restarts from B = -I: dropping only the oldest pair would leave the others
        # (each built on top of it) inconsistent, which diverges in practice.
        full = count >= self.m
        count = jnp.where(full, 0, count)
        used = (jnp.arange(self.m) < count).astype(z.dtype)
        g = fz - z
        dz = z - z_prev
        b_g = self._apply(us, vs, used, g)
        b_g_prev = jnp.where(full, -g_prev, direction)
        b_dg = b_g - b_g_prev
        denom = jnp.einsum("bd,bd->b", dz, b_dg)
        eps = jnp.finfo(z.dtype).eps
        size = jnp.linalg.norm(dz, axis=1) * jnp.linalg.norm(b_dg, axis=1)
        ok = (jnp.abs(denom) > eps * size) & (size > 0)
        safe = jnp.where(ok, denom, 1.0)
        u = jnp.where(ok[:, None], (dz - b_dg) / safe[:, None], 0.0)
        v = jnp.where(ok[:, None], self._apply_transpose(us, vs, used, dz), 0.0)
        us = _write_slot(us, count, u)
        vs = _write_slot(vs, count, v)
        direction = b_g + u * jnp.einsum("bd,bd->b", v, g)[:, None]
        return us, vs, count + 1, z, g, direction


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


SOLVERS = {cls.name: cls for cls in (Picard, Anderson, Broyden)}


def get_solver(solver: str | _SolverConfig = "anderson", **overrides) -> _SolverConfig:
    """Return a solver configuration from a name or a configured object.

    ``overrides`` whose value is None are ignored, so ``get_solver("picard", tol=None)`` keeps the
    default tolerance.
    """
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if isinstance(solver, _SolverConfig):
        return dataclasses.replace(solver, **overrides) if overrides else solver
    if isinstance(solver, str) and solver in SOLVERS:
        return SOLVERS[solver](**overrides)
    raise ValueError(
        f"`solver` must be one of {sorted(SOLVERS)} or a solver object such as "
        f"deqlab.solvers.Anderson(m=5), got {solver!r}."
    )


# --------------------------------------------------------------------------------------------
# Flattening a (possibly batched) pytree into a (B, D) matrix


class _Flattener:
    """Maps a pytree whose leaves share a batch axis to a (B, D) array and back."""

    def __init__(self, tree, batch_axis):
        leaves, self.treedef = jax.tree_util.tree_flatten(tree)
        if not leaves:
            raise ValueError("`z0` must contain at least one array.")
        for leaf in leaves:
            if not jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
                raise ValueError(
                    f"`z0` must hold floating-point arrays, got dtype {jnp.result_type(leaf)}."
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
                        f"`batch_axis` must index an axis of every leaf of z0 (ndim "
                        f"{len(shape)}), got {batch_axis}."
                    )
                sizes.add(shape[batch_axis])
            if len(sizes) != 1:
                raise ValueError(
                    f"`z0` leaves disagree on the size of batch axis {batch_axis}: {sorted(sizes)}."
                )
            self.batch = sizes.pop()
        moved = [self._moved_shape(s) for s in self.shapes]
        self.sizes = [int(np.prod(s[1:], dtype=np.int64)) for s in moved]
        self.dim = int(sum(self.sizes))

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
    """Relative residual of each row of (B, D) arrays (the tolerance rule of this module)."""
    eps = jnp.finfo(z.dtype).eps
    scale = jnp.linalg.norm(fz, axis=-1) + eps * math.sqrt(z.shape[-1])
    return jnp.linalg.norm(fz - z, axis=-1) / scale


def _is_concrete(tree) -> bool:
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(tree))


def _check_problem(f, z0, args, flattener):
    if not callable(f):
        raise ValueError(f"`f` must be callable as f(z, *args), got {type(f).__name__}.")
    try:
        out = jax.eval_shape(lambda z, a: f(z, *a), z0, args)
    except TypeError as err:
        raise ValueError(f"`f` could not be evaluated as f(z0, *args): {err}") from err
    in_struct = jax.tree_util.tree_structure(z0)
    out_struct = jax.tree_util.tree_structure(out)
    if in_struct != out_struct:
        raise ValueError(
            f"`f` must return the same pytree structure as `z0`: got {out_struct}, "
            f"expected {in_struct}."
        )
    for leaf_in, leaf_out in zip(jax.tree_util.tree_leaves(z0), jax.tree_util.tree_leaves(out)):
        if jnp.shape(leaf_in) != leaf_out.shape:
            raise ValueError(
                f"`f` must map `z0` to an array of the same shape: z0 has shape "
                f"{jnp.shape(leaf_in)}, f(z0) has shape {leaf_out.shape}."
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


def _run(config, func, z0_flat, unrolled):
    """The shared iteration loop on (B, D) arrays.

    ``unrolled=True`` uses ``lax.scan`` over exactly ``max_steps`` (frozen samples are masked), so
    reverse-mode differentiation through the iterations works; otherwise ``lax.while_loop``.
    """
    tol = config.tol
    fz0 = func(z0_flat)
    # Adopt the layout of f's output: z0 is often a fresh, replicated zeros array while the input
    # (and so f(z0)) is sharded over the batch.
    z0_flat = z0_flat + jnp.zeros_like(fz0)
    finite0 = jnp.all(jnp.isfinite(fz0), axis=1)
    res0 = jnp.where(finite0, relative_residual(fz0, z0_flat), jnp.inf)
    abs0 = jnp.linalg.norm(fz0 - z0_flat, axis=1)
    result0 = jnp.where(
        ~finite0, Result.NONFINITE, jnp.where(res0 <= tol, Result.SUCCESS, Result.MAX_STEPS_REACHED)
    ).astype(jnp.int32)
    active0 = result0 == Result.MAX_STEPS_REACHED
    # One row per step, written with dynamic_update_slice: O(B) per step, and the batch axis (the
    # second) keeps the sharding of the residuals when the batch is split across devices.
    trace0 = jnp.repeat(jnp.where(finite0, res0, jnp.finfo(z0_flat.dtype).max)[None, :], config.max_steps + 1, axis=0)
    fz0_safe = jnp.where(finite0[:, None], fz0, z0_flat)
    solver_state0 = config.init(z0_flat, fz0_safe)
    carry0 = dict(
        z=z0_flat,
        fz=fz0_safe,
        res=jnp.where(finite0, res0, jnp.finfo(z0_flat.dtype).max),
        best_z=z0_flat,
        best_res=jnp.where(finite0, res0, jnp.finfo(z0_flat.dtype).max),
        best_abs=jnp.where(finite0, abs0, jnp.finfo(z0_flat.dtype).max),
        active=active0,
        result=result0,
        steps=_per_sample_zeros(z0_flat),
        step=jnp.zeros((), jnp.int32),
        nfe=jnp.ones((), jnp.int32),
        trace=trace0,
        state=solver_state0,
    )

    residual_floor = jnp.finfo(z0_flat.dtype).eps * math.sqrt(z0_flat.shape[1])

    def body(carry):
        z_prop, state_prop = config.propose(carry["z"], carry["fz"], carry["state"])
        fz_prop = func(z_prop)
        # One pass for both norms: a NaN or inf anywhere in z_prop or f(z_prop) makes them
        # non-finite (as does a float overflow of the norm, which only a diverging iterate reaches).
        diff_norm = jnp.linalg.norm(fz_prop - z_prop, axis=1)
        f_norm = jnp.linalg.norm(fz_prop, axis=1)
        finite = jnp.isfinite(diff_norm) & jnp.isfinite(f_norm)
        active = carry["active"]
        accept = active & finite
        z = jnp.where(accept[:, None], z_prop, carry["z"])
        fz = jnp.where(accept[:, None], fz_prop, carry["fz"])
        res_prop = jnp.where(finite, diff_norm / (f_norm + residual_floor), jnp.inf)
        abs_prop = jnp.where(finite, diff_norm, jnp.inf)
        res = jnp.where(accept, res_prop, carry["res"])
        state = config.record(z_prop, fz_prop, state_prop)
        if unrolled:
            # Rejected and frozen samples never become active again, so their solver state is
            # irrelevant to the result; it is kept finite only when differentiating through the
            # loop (a NaN in an unselected branch would still poison the gradient).
            state = _where_batch(accept, state, carry["state"])
        improved = accept & (res_prop < carry["best_res"])
        best_z = jnp.where(improved[:, None], z_prop, carry["best_z"])
        best_res = jnp.where(improved, res_prop, carry["best_res"])
        best_abs = jnp.where(accept, jnp.minimum(carry["best_abs"], abs_prop), carry["best_abs"])
        converged = accept & (res_prop <= tol)
        diverged = accept & ~converged & (abs_prop > config.divergence_factor * carry["best_abs"])
        result = carry["result"]
        result = jnp.where(active & ~finite, Result.NONFINITE, result)
        result = jnp.where(converged, Result.SUCCESS, result)
        result = jnp.where(diverged, Result.DIVERGED, result).astype(jnp.int32)
        step = carry["step"] + 1
        steps = carry["steps"] + active.astype(jnp.int32)
        trace = jax.lax.dynamic_update_slice(carry["trace"], res[None, :], (step, jnp.zeros_like(step)))
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
            nfe=carry["nfe"] + 1,
            trace=trace,
            state=state,
        )

    if unrolled:
        final, _ = jax.lax.scan(lambda c, _: (body(c), None), carry0, None, length=config.max_steps)
    else:

        def cond(carry):
            return jnp.any(carry["active"]) & (carry["step"] < config.max_steps)

        final = jax.lax.while_loop(cond, body, carry0)

    # Rows after the last step repeat the final residual, so the trace is finite and plottable.
    rows = jnp.arange(config.max_steps + 1)[:, None]
    trace = jnp.where(rows <= final["step"], final["trace"], final["res"][None, :])
    # In unrolled mode the value must be differentiable through the iterations; the best iterate
    # selection is a where() and keeps that property.
    stats = dict(
        steps=final["steps"],
        nfe=final["nfe"],
        trace=trace,
        best_res=final["best_res"],
        res=final["res"],
    )
    value = final["best_z"]
    if config.steps_past_convergence:
        # A converged sample was frozen at the iterate that met tol, whose residual is below all
        # earlier ones (they were above tol): its best iterate is its last z, with f(z) in fz.
        stepped, _ = config.propose(final["z"], final["fz"], final["state"])
        value = jnp.where((final["result"] == Result.SUCCESS)[:, None], stepped, value)
    return value, final["result"], stats


def solve(
    f: Callable[..., Any],
    z0: Any,
    *args: Any,
    solver: str | _SolverConfig = "anderson",
    tol: float | None = None,
    max_steps: int | None = None,
    batch_axis: int | None = None,
    throw: bool = False,
    unrolled: bool = False,
) -> Solution:
    """Find ``z* = f(z*, *args)`` starting from ``z0`` (003 Eq. 4-6).

    Args:
        f: the map, called as ``f(z, *args)``; must return a pytree shaped like ``z``.
        z0: initial guess (any pytree of floating arrays).
        *args: further arguments of ``f`` (parameters, inputs), passed explicitly.
        solver: ``"picard"``, ``"anderson"``, ``"broyden"`` or a configured object such as
            ``Anderson(m=5, tol=1e-6)``.
        tol: relative-residual tolerance (overrides the solver's), see the module docstring.
        max_steps: iteration limit (overrides the solver's).
        batch_axis: axis of every leaf of ``z0`` that indexes independent samples, or None.
        throw: raise :class:`SolverError` if any sample fails (only outside ``jit``).
        unrolled: iterate with ``lax.scan`` for exactly ``max_steps`` (frozen samples masked) so
            that reverse-mode autodiff can go through the iterations.

    Returns:
        :class:`Solution` with per-sample ``result``, ``converged`` and ``stats``.
    """
    config = get_solver(solver, tol=tol, max_steps=max_steps)
    if batch_axis is not None and (isinstance(batch_axis, bool) or not isinstance(batch_axis, int)):
        raise ValueError(f"`batch_axis` must be an int or None, got {batch_axis!r}.")
    flattener = _Flattener(z0, batch_axis)
    _check_problem(f, z0, args, flattener)

    def func(z_flat):
        return flattener.flatten(f(flattener.unflatten(z_flat), *args))

    value, result, stats = _run(config, func, flattener.flatten(z0), unrolled)
    solution = Solution(
        value=flattener.unflatten(value),
        result=flattener.per_sample(result),
        stats=SolveStats(
            steps=flattener.per_sample(stats["steps"]),
            nfe=stats["nfe"],
            residual_trace=flattener.per_sample(stats["trace"]),
            best_residual=flattener.per_sample(stats["best_res"]),
            residual=flattener.per_sample(stats["res"]),
        ),
    )
    if throw:
        raise_if_failed(solution)
    return solution


def raise_if_failed(solution: Solution, what: str = "fixed-point solve") -> None:
    """Raise :class:`SolverError` naming the failing samples (outside ``jit`` only)."""
    if not _is_concrete(solution.result):
        raise ValueError("`throw=True` needs concrete values: it cannot be used inside jit.")
    result = np.atleast_1d(np.asarray(solution.result))
    residual = np.atleast_1d(np.asarray(solution.stats.best_residual))
    failed = np.flatnonzero(result != Result.SUCCESS)
    if failed.size:
        shown = ", ".join(
            f"sample {i}: {Result(int(result[i])).name.lower()} (residual {residual[i]:.3e})"
            for i in failed[:8]
        )
        more = f" and {failed.size - 8} more" if failed.size > 8 else ""
        raise SolverError(f"{what} failed for {failed.size}/{result.size} samples: {shown}{more}.")
