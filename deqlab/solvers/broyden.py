"""Limited-memory ("good") Broyden's method (003 Eq. 6 and 10) and its inverse-Jacobian estimate."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from deqlab import checks
from deqlab import precision as precision_module
from deqlab.solvers.base import Solver
from deqlab.solvers.flatten import row_norm
from deqlab.solvers.history import empty_history, exact_einsum, write_slot

__all__ = ["Broyden", "BroydenState"]


class BroydenState(NamedTuple):
    """The state of :class:`Broyden` (``SolverState.history`` of a Broyden solve).

    Attributes:
        us, vs: the ``m`` rank-one pairs of ``B = -I + sum_i u_i v_i^T`` (003 Eq. 10), shape
            ``(B, m, D)``; unused slots hold zeros.
        count: the number of pairs in the current cycle (a scalar shared by the batch).
        z: the last iterate, shape ``(B, D)``.
        g: its residual ``f(z) - z``.
        direction: the next direction ``B g``.

    Example:
        >>> import jax.numpy as jnp, deqlab
        >>> from deqlab.solvers import Broyden
        >>> sol = deqlab.solve(lambda z, x: 0.5 * jnp.tanh(z) + x, jnp.zeros(3), jnp.ones(3),
        ...                    solver=Broyden(m=4))
        >>> sol.state.history.us.shape   # (1, m, D): one row without a batch axis
        (1, 4, 3)
    """

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
    ``max_steps``. Steps are z <- z - step * B g.
    The first step is a Picard step. Updates whose denominator is tiny are skipped (their slot
    holds a zero pair). Inner products are accumulated in at least float32, so half-precision
    iterates work.

    Each step costs two products with the low-rank part (B g for the next step and B^T dz for the
    update): B dg is recovered as B g_new - B g_old, B g_old being the previous step's direction.

    Attributes:
        m: history size (number of rank-one pairs kept, >= 1).
        step: step length alpha of 003 Eq. 6, in (0, 1].
        tol, max_steps, divergence_factor, stop, safety, check_every: as for :class:`Picard`.

    Raises:
        ValueError: a setting outside its range (the message names it and the valid range).

    The state (``SolverState.history``) is a :class:`BroydenState`; :meth:`inverse_jacobian`
    and :meth:`inverse_jacobian_transpose` apply its estimate B (what
    :class:`deqlab.backward.SHINE` reuses). ``freeze_state = True``: a sample's pairs stop changing
    when it stops, so B is each sample's estimate at its own equilibrium.

    Example:
        On the affine map f(z) = z / 2 + x the secant update of 003 Eq. 10 recovers
        ``(J_f - I)^{-1} = -2`` exactly after one step, and the second step lands on z* = 2 x:

        >>> import jax.numpy as jnp, deqlab
        >>> from deqlab.solvers import Broyden
        >>> broyden = Broyden(m=8, tol=1e-5)
        >>> sol = deqlab.solve(lambda z, x: 0.5 * z + x, jnp.zeros((2, 1)), jnp.ones((2, 1)),
        ...                    solver=broyden, batch_axis=0)
        >>> sol.stats.steps.tolist(), [f"{v:.3f}" for v in sol.value[:, 0].tolist()]
        ([2, 2], ['2.000', '2.000'])
        >>> estimate = broyden.inverse_jacobian(sol.state.history, jnp.ones((2, 1)), steps=sol.stats.steps)
        >>> [f"{v:.3f}" for v in estimate[:, 0].tolist()]
        ['-2.000', '-2.000']
    """

    m: int = 8
    step: float = 1.0
    name = "broyden"
    freeze_state = True

    def _check_settings(self):  # run by the constructor, whatever a subclass's __post_init__ does
        checks.positive_int(self.m, "m", "solvers.Broyden")
        checks.unit_interval(self.step, "step", "solvers.Broyden", allow_traced=True)

    # State: BroydenState(us, vs, count, z, g, direction) with direction = B g at the current z.
    # The pair counter is a scalar for the reason given in Anderson (all active samples share it).
    def init(self, z, fz):
        history = empty_history(z, self.m)
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
        """``B^T x`` for the estimate of :meth:`inverse_jacobian`. With ``x`` a loss gradient g,
        ``-B^T g`` approximates the adjoint ``(I - J_f^T)^{-1} g`` of 003 Eq. 11 (SHINE, Ramzi et
        al. 2022).

        Args:
            state: ``SolverState.history`` of a Broyden solve (flattened rows).
            x: shape ``(B, D)``, as the solve's flattened iterates.
            steps: see :meth:`pairs_in_use`.
            start: see :meth:`pairs_in_use`.

        Returns:
            ``B^T x``, shape and dtype of ``x``.
        """
        return self._apply_transpose(state.us, state.vs, self.pairs_in_use(state, steps, start), x)

    @staticmethod
    def _apply(us, vs, used, x):
        """B x with B = -I + sum_{i used} u_i v_i^T."""
        coefficients = exact_einsum("bid,bd->bi", vs, x) * used
        return -x + exact_einsum("bid,bi->bd", us, coefficients).astype(x.dtype)

    @staticmethod
    def _apply_transpose(us, vs, used, x):
        """B^T x."""
        coefficients = exact_einsum("bid,bd->bi", us, x) * used
        return -x + exact_einsum("bid,bi->bd", vs, coefficients).astype(x.dtype)

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
        denom = exact_einsum("bd,bd->b", dz, b_dg)
        # The skip test only decides; differentiating the norms of a zero step would give NaN.
        size = jax.lax.stop_gradient(row_norm(dz) * row_norm(b_dg))
        ok = (jnp.abs(jax.lax.stop_gradient(denom)) > jnp.finfo(z.dtype).eps * size) & (size > 0)
        safe = jnp.where(ok, denom, 1.0)
        u = jnp.where(ok[:, None], (dz - b_dg) / safe[:, None].astype(z.dtype), 0.0).astype(z.dtype)
        v = jnp.where(ok[:, None], self._apply_transpose(us, vs, used, dz), 0.0).astype(z.dtype)
        us = write_slot(us, count, u)
        vs = write_slot(vs, count, v)
        direction = b_g + u * exact_einsum("bd,bd->b", v, g)[:, None].astype(z.dtype)
        return BroydenState(us, vs, count + 1, z, g, direction)

