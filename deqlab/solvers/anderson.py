"""Anderson acceleration (type II; Anderson 1965, Walker & Ni 2011)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from deqlab import checks
from deqlab.solvers.base import Solver
from deqlab.solvers.history import empty_history, exact_einsum, write_gram, write_slot

__all__ = ["Anderson"]


#: The largest history size whose mixing problem is solved by :func:`_solve_positive_definite`
#: (a rolled loop of m eliminations); larger ones use ``jnp.linalg.solve``. Measured on the tanh
#: problem of ``benchmarks/step_cost.py`` (N = 384, batch 96, ``benchmarks/results/step_cost_quick.txt``):
#: at m = 5 a step costs 1.54x a plain one with the elimination and 1.68x with LU; at m = 10, 2.74x
#: with the elimination (one run, not stored) and 2.06-2.08x with LU.
ELIMINATION_MAX_M = 6


class Anderson(Solver):
    """Anderson acceleration (type II) with a history of ``m`` iterates (Anderson 1965;
    Walker & Ni 2011).

    Each step solves, per sample, the regularised least-squares problem
    min_alpha ||G alpha||^2 subject to sum(alpha) = 1, where the columns of G are the last ``m``
    residuals g_i = f(z_i) - z_i, then mixes
    z <- damping * sum_i alpha_i f(z_i) + (1 - damping) * sum_i alpha_i z_i.
    The solution alpha = H^-1 1 / (1^T H^-1 1), H = G^T G (the residuals' Gram matrix; the code
    stores them as the rows of an (m, D) array, so it computes it as G G^T), is computed from the
    Jacobi-scaled matrix D^-1/2 H D^-1/2 + ridge I (D = diag H): the ridge acts on each residual
    relative to its own norm, so it stays scale free while the residuals shrink by orders of
    magnitude. H is kept up to date one row per step, in at least float32 (half-precision iterates
    work: the m x m system is never solved in 16 bits). Memory is fixed: 2 m vectors per sample
    (f(z_i) and g_i) and the m x m matrix H, whatever ``max_steps`` is. Each sample's mixing is its
    own (the loop applies the step to every sample with ``jax.vmap``).

    Attributes:
        m: history size (>= 1; m = 1 is damped Picard).
        ridge: Tikhonov regularisation of the scaled mixing problem (>= 0).
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
        # min a^T H a subject to sum(a) = 1 has a = H^-1 1 / (1^T H^-1 1) (H the Gram matrix). H is
        # solved in Jacobi-scaled form D^-1/2 H D^-1/2 + ridge I (D = diag H): the residuals of a
        # converging iteration span orders of magnitude, and a ridge relative to their mean norm
        # would swamp the newest (smallest) ones and stall the acceleration.
        diag = jnp.diagonal(gram)
        # Columns with a zero residual (an exact fixed point) get weight zero. The double where
        # keeps rsqrt away from 0, whose derivative is infinite: unrolled differentiation through
        # a sample that has converged exactly would otherwise return NaN gradients.
        usable = (jnp.arange(m) < jnp.minimum(count, m)) & (diag > jnp.finfo(work).tiny)
        inv_sqrt = jnp.where(usable, jax.lax.rsqrt(jnp.where(usable, diag, 1.0)), 0.0)
        scaled = gram * inv_sqrt[:, None] * inv_sqrt[None, :]
        # Unused slots get a unit diagonal and a zero right-hand side, which makes their a_i = 0.
        hessian = scaled + jnp.diag(jnp.where(usable, self.ridge, 1.0).astype(work))
        if m <= ELIMINATION_MAX_M:
            y = inv_sqrt * _solve_positive_definite(hessian, inv_sqrt)
        else:  # LAPACK's LU: its per-sample calls cost less than m rounds of the elimination loop
            y = inv_sqrt * jnp.linalg.solve(hessian, inv_sqrt[:, None])[:, 0]
        total = jnp.sum(y)
        # All residuals zero (the sample sits on its fixed point, or the history is empty): the
        # step is a plain (damped) one from (z, fz), which leaves a fixed point where it is
        # (stays_at_fixed_points). Likewise when the solve gave inf or NaN (an exactly zero pivot:
        # ridge = 0 and exactly dependent residuals). A nearly singular system (ridge 0) gives
        # large finite weights instead, which is why the ridge is positive by default.
        has_weight = (total != 0) & jnp.isfinite(total)
        alpha = jnp.where(has_weight, y / jnp.where(has_weight, total, 1.0), 0.0)
        mixed_f = exact_einsum("i,id->d", alpha, fs).astype(z.dtype)
        if isinstance(self.damping, (int, float)) and self.damping == 1.0:  # one pass over the history instead of two
            return jnp.where(has_weight, mixed_f, fz), state
        # damping * sum a_i f_i + (1 - damping) * sum a_i z_i, with z_i = f_i - g_i.
        mixed_g = exact_einsum("i,id->d", alpha, gs).astype(z.dtype)
        return jnp.where(has_weight, mixed_f - (1.0 - self.damping) * mixed_g, z + self.damping * (fz - z)), state

    def record(self, z, fz, state):
        fs, gs, gram, count = state
        slot = count % self.m
        g = fz - z
        fs = write_slot(fs, slot, fz)
        gs = write_slot(gs, slot, g)
        gram = write_gram(gram, slot, exact_einsum("id,d->i", gs, g))
        return fs, gs, gram, count + 1


def _solve_positive_definite(a, b):
    """``a^-1 b`` for one small symmetric positive definite ``a`` (m x m): Gauss-Jordan
    elimination without pivoting, one column per iteration of a rolled loop.

    The scaled Gram matrix plus a positive ridge is positive definite, so no pivoting is needed.
    Written in array operations rather than a LAPACK call (``jnp.linalg.solve``: LU with pivots
    and a permutation loop; ``cho_solve``: three calls), because the loop's ``vmap`` turns a LAPACK
    call into one call per sample on CPU: this form runs the whole batch at once, in a program
    smaller than LU's, but takes m rounds of a loop, so it is used up to
    :data:`ELIMINATION_MAX_M` only. An exactly zero pivot gives inf or NaN, which
    :meth:`Anderson.propose` turns into a plain step.
    """
    m = a.shape[0]
    at = jnp.arange(m)

    def eliminate(j, ab):
        a, b = ab
        here = at == j
        row = jnp.sum(jnp.where(here[:, None], a, 0.0), axis=0)
        pivot = jnp.sum(jnp.where(here, row, 0.0))
        row, rhs = row / pivot, jnp.sum(jnp.where(here, b, 0.0)) / pivot
        col = jnp.where(here, 0.0, jnp.sum(jnp.where(here[None, :], a, 0.0), axis=1))
        a = jnp.where(here[:, None], row[None, :], a - col[:, None] * row[None, :])
        b = jnp.where(here, rhs, b - col * rhs)
        return a, b

    return jax.lax.fori_loop(0, m, eliminate, (a, b))[1]
