"""Anderson acceleration (type II; Anderson 1965, Walker & Ni 2011)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import checks
from deqlab.solvers.base import Solver
from deqlab.solvers.history import empty_history, exact_einsum, weighted_rows, write_gram, write_slot

__all__ = ["Anderson"]


class Anderson(Solver):
    """Anderson acceleration (type II) with a history of ``m`` iterates (Anderson 1965;
    Walker & Ni 2011).

    Each step solves, per sample, the regularised least-squares problem
    min_alpha ||G alpha||^2 subject to sum(alpha) = 1, where the columns of G are the last ``m``
    residuals g_i = f(z_i) - z_i, then mixes
    z <- damping * sum_i alpha_i f(z_i) + (1 - damping) * sum_i alpha_i z_i.
    The solution alpha = y / (1^T y), y = (H + ridge D)^-1 1, H = G^T G (the residuals' Gram
    matrix; the code stores them as the rows of an (m, D) array, so it computes it as G G^T) and
    D = diag H, is the Jacobi-scaled problem's: (H + ridge D)^-1 = D^-1/2 (D^-1/2 H D^-1/2 +
    ridge I)^-1 D^-1/2, so the ridge acts on each residual relative to its own norm and stays
    scale free while the residuals shrink by orders of magnitude (the elimination that solves it,
    without pivoting on a positive definite matrix, is as accurate unscaled as scaled). H is kept
    up to date one row per step, in at least float32 (half-precision iterates work: the m x m
    system is never solved in 16 bits). Memory is fixed: 2 m vectors per sample
    (f(z_i) and g_i) and the m x m matrix H, whatever ``max_steps`` is. Each sample's mixing is its
    own (the loop applies the step to every sample with ``jax.vmap``).

    Attributes:
        m: history size (>= 1; m = 1 is damped Picard).
        ridge: Tikhonov regularisation of the mixing problem, relative to each residual's
            squared norm (>= 0).
        damping: mixing parameter beta in (0, 1].
        tol, max_steps, divergence_factor, stop, safety, check_every: as for :class:`Picard`.

    Raises:
        ValueError: a setting outside its range (the message names it and the valid range).

    Example:
        A slowly contracting map (rate 0.95 near z* = 0), where acceleration pays:

        >>> import jax.numpy as jnp, deqlab
        >>> from deqlab.solvers import Anderson, Picard
        >>> f = lambda z, x: 0.95 * jnp.tanh(z) + x
        >>> z0, x = jnp.zeros((4, 8)), jnp.full((4, 8), 0.01)
        >>> fast = deqlab.solve(f, z0, x, solver=Anderson(m=6, tol=1e-5, max_steps=300), batch_axis=0)
        >>> slow = deqlab.solve(f, z0, x, solver=Picard(tol=1e-5, max_steps=300), batch_axis=0)
        >>> bool(fast.converged.all()), bool(fast.stats.steps.max() < slow.stats.steps.min())
        (True, True)
    """

    m: int = 5
    ridge: float = 1e-4
    damping: float = 1.0
    name = "anderson"
    init_is_first_record = True  # init writes the first pair into an empty history, as record does
    stays_at_fixed_points = True  # an empty history or zero residuals: a plain step

    def _check_settings(self):  # run by the constructor, whatever a subclass's __post_init__ does
        checks.positive_int(self.m, "m", "solvers.Anderson")
        checks.number(self.ridge, "ridge", "solvers.Anderson", lower=0.0, allow_traced=True)
        checks.unit_interval(self.damping, "damping", "solvers.Anderson", allow_traced=True)

    # History layout, per sample: f(z_i) and g_i = f(z_i) - z_i in (m, D) ring buffers (dtype of
    # z), their Gram matrix G G^T (m, m, at least float32), updated one row and column per step
    # (O(m D) instead of O(m^2 D)), and the number of steps recorded. The loop batches it with
    # vmap: each sample's counter is its own.
    def init(self, z, fz):
        g = fz - z
        fs = write_slot(empty_history(z, self.m), 0, fz)
        gs = write_slot(empty_history(z, self.m), 0, g)
        gram = exact_einsum("id,jd->ij", gs, gs)
        return fs, gs, gram, jnp.ones((), jnp.int32)

    def propose(self, z, fz, state):
        fs, gs, gram, count = state
        m = self.m
        work = gram.dtype
        eye = np.eye(m, dtype=bool)  # a constant of the program (jnp.eye would compute it)
        # min a^T H a subject to sum(a) = 1 has a = y / sum(y), y = H^-1 1 (H the Gram matrix). The
        # ridge is relative to each residual's squared norm D = diag H (H + ridge D is the
        # Jacobi-scaled D^-1/2 H D^-1/2 + ridge I, unscaled): the residuals of a converging
        # iteration span orders of magnitude, and a ridge relative to their mean norm would swamp
        # the newest (smallest) ones and stall the acceleration. The diagonal is read with a mask
        # and a sum, not jnp.diagonal (a gather under the loop's vmap).
        diag = jnp.sum(jnp.where(eye, gram, 0.0), axis=1)
        # Columns with a zero residual (an exact fixed point) and the slots not written yet get a
        # unit diagonal and a zero right-hand side: their row and column of H are zero, so their
        # y_i = 0, and nothing is divided by their zero norm (no NaN gradients under unrolled
        # differentiation through a sample that has converged exactly).
        usable = diag > jnp.finfo(work).tiny
        hessian = jnp.where(eye, jnp.where(usable, diag * (1.0 + self.ridge), 1.0).astype(work), gram)
        y = _solve_positive_definite(hessian, usable.astype(work))
        total = jnp.sum(y)
        # All residuals zero (the sample sits on its fixed point, or the history is empty): the
        # step is a plain (damped) one from (z, fz), which leaves a fixed point where it is
        # (stays_at_fixed_points). Likewise when the solve gave inf or NaN (an exactly zero pivot:
        # ridge = 0 and exactly dependent residuals). A nearly singular system (ridge 0) gives
        # large finite weights instead, which is why the ridge is positive by default. (The
        # unselected weights are finite for a zero total, whose y is zero: the guarded divisor
        # keeps NaN out of the gradient.)
        has_weight = (total != 0) & jnp.isfinite(total)
        alpha = y / jnp.where(has_weight, total, 1.0)
        # m multiply-adds, not a dot: under the loop's vmap a dot is a batched matrix product with
        # one row per sample, which costs about half a plain step more on CPU (weighted_rows)
        mixed_f = weighted_rows(alpha, fs).astype(z.dtype)
        if isinstance(self.damping, (int, float)) and self.damping == 1.0:  # one pass over the history instead of two
            return jnp.where(has_weight, mixed_f, fz), state
        # damping * sum a_i f_i + (1 - damping) * sum a_i z_i, with z_i = f_i - g_i.
        mixed_g = weighted_rows(alpha, gs).astype(z.dtype)
        return jnp.where(has_weight, mixed_f - (1.0 - self.damping) * mixed_g, z + self.damping * (fz - z)), state

    def record(self, z, fz, state):
        fs, gs, gram, count = state
        slot = jax.lax.rem(count, jnp.asarray(self.m, count.dtype))  # count >= 0: no sign correction (jnp's % has one)
        g = fz - z
        fs = write_slot(fs, slot, fz)
        gs = write_slot(gs, slot, g)
        gram = write_gram(gram, slot, exact_einsum("id,d->i", gs, g))
        return fs, gs, gram, count + 1


def _solve_positive_definite(a, b):
    """``a^-1 b`` for one small symmetric positive definite ``a`` (m x m): Gauss-Jordan
    elimination without pivoting on ``[a | b]``, one column per iteration of a rolled loop.

    A Gram matrix plus a positive ridge on its diagonal is positive definite, so no pivoting is
    needed. Written in array operations rather than a LAPACK call (``jnp.linalg.solve``: LU with
    pivots and a permutation loop; ``cho_factor`` and ``cho_solve``: three calls), because the
    loop's ``vmap`` turns a LAPACK call into one call per sample on CPU: this form runs the whole
    batch at once, in a smaller program. Row and column j are read with dynamic slices at the
    loop's index (the same for every sample, so they stay slices under ``vmap``), and ``b`` rides
    along as the last column of one carried array. An exactly zero pivot gives inf or NaN, which
    :meth:`Anderson.propose` turns into a plain step.
    """
    m = a.shape[0]
    at = jnp.arange(m)

    def eliminate(j, ab):
        here = at == j
        row = jax.lax.dynamic_slice_in_dim(ab, j, 1, 0, allow_negative_indices=False)[0]
        row = row / jax.lax.dynamic_slice_in_dim(row, j, 1, 0, allow_negative_indices=False)[0]
        col = jnp.where(here, 0.0, jax.lax.dynamic_slice_in_dim(ab, j, 1, 1, allow_negative_indices=False)[:, 0])
        return jnp.where(here[:, None], row[None, :], ab - col[:, None] * row[None, :])

    return jax.lax.fori_loop(0, m, eliminate, jnp.concatenate([a, b[:, None]], axis=1))[:, m]
