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
    """The state of :class:`Broyden` for one sample; ``SolverState.history`` of a Broyden solve
    holds every sample's, stacked along a leading batch axis B (shapes below gain it).

    Attributes:
        us, vs: the ``m`` rank-one pairs of ``B = -I + sum_i u_i v_i^T`` (003 Eq. 10), shape
            ``(m, D)``; unused slots hold zeros.
        count: the number of pairs in the current cycle (int32 scalar).
        z: the last iterate, shape ``(D,)``.
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
    when it stops, so B is each sample's estimate at its own equilibrium (each sample keeps its
    own pairs and counter).

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
        >>> estimate = broyden.inverse_jacobian(sol.state.history, jnp.ones((2, 1)))
        >>> [f"{v:.3f}" for v in estimate[:, 0].tolist()]
        ['-2.000', '-2.000']
    """

    m: int = 8
    step: float = 1.0
    name = "broyden"
    freeze_state = True
    init_is_first_record = True  # record into the zeroed state only starts it (see record)
    stays_at_fixed_points = True  # the zeroed state's direction is 0

    def _check_settings(self):  # run by the constructor, whatever a subclass's __post_init__ does
        checks.positive_int(self.m, "m", "solvers.Broyden")
        checks.unit_interval(self.step, "step", "solvers.Broyden", allow_traced=True)

    # State: BroydenState(us, vs, count, z, g, direction) for one sample, with direction = B g at
    # the current z.
    def init(self, z, fz):
        history = empty_history(z, self.m)
        g = fz - z
        return BroydenState(history, history, jnp.zeros((), jnp.int32), z, g, -g)

    def inverse_jacobian(self, state: BroydenState, x: jax.Array) -> jax.Array:
        """``B x`` for the inverse-Jacobian estimate ``B ~ (J_f - I)^{-1}`` of g = f - z held in
        ``state`` (003 Eq. 10: ``B = -I + sum_i u_i v_i^T``), per sample.

        Args:
            state: ``SolverState.history`` of a Broyden solve with this ``m`` (leading batch axis
                B; a solve without ``batch_axis`` has B = 1).
            x: shape ``(B, D)``, as the solve's flattened iterates.

        Returns:
            ``B x``, shape and dtype of ``x``.

        Raises:
            ValueError: ``state`` is not a batched :class:`BroydenState` of this ``m`` matching
                ``x``.
        """
        self._check_state(state, x, "inverse_jacobian")
        return jax.vmap(self._apply)(state.us, state.vs, self._used(state.count, x.dtype), x)

    def inverse_jacobian_transpose(self, state: BroydenState, x: jax.Array) -> jax.Array:
        """``B^T x`` for the estimate of :meth:`inverse_jacobian`. With ``x`` a loss gradient g,
        ``-B^T g`` approximates the adjoint ``(I - J_f^T)^{-1} g`` of 003 Eq. 11 (SHINE, Ramzi et
        al. 2022).

        Args:
            state: ``SolverState.history`` of a Broyden solve (see :meth:`inverse_jacobian`).
            x: shape ``(B, D)``, as the solve's flattened iterates.

        Returns:
            ``B^T x``, shape and dtype of ``x``.

        Raises:
            ValueError: as :meth:`inverse_jacobian`.
        """
        self._check_state(state, x, "inverse_jacobian_transpose")
        return jax.vmap(self._apply_transpose)(state.us, state.vs, self._used(state.count, x.dtype), x)

    def _check_state(self, state, x, where):
        if not isinstance(state, BroydenState) or jnp.ndim(x) != 2 or jnp.shape(state.us) != (
                jnp.shape(x)[0], self.m, jnp.shape(x)[1]):
            got = (f"a {type(state).__name__} with us of shape {jnp.shape(getattr(state, 'us', None))}"
                   f" and x of shape {jnp.shape(x)}")
            raise ValueError(f"Broyden.{where}: `state` must be the SolverState.history of a "
                             f"Broyden(m={self.m}) solve (us of shape (B, m, D)) and `x` of shape (B, D), "
                             f"got {got}.")

    def _used(self, count, dtype):
        """Weights (1 or 0) of each sample's pairs in its current cycle, shape ``(B, m)``."""
        work = precision_module.working_dtype(dtype)
        return (jnp.arange(self.m)[None, :] < jnp.reshape(count, (-1, 1))).astype(work)

    @staticmethod
    def _apply(us, vs, used, x):
        """B x with B = -I + sum_{i used} u_i v_i^T (one sample)."""
        coefficients = exact_einsum("id,d->i", vs, x) * used
        return -x + exact_einsum("id,i->d", us, coefficients).astype(x.dtype)

    @staticmethod
    def _apply_transpose(us, vs, used, x):
        """B^T x (one sample)."""
        coefficients = exact_einsum("id,d->i", us, x) * used
        return -x + exact_einsum("id,i->d", vs, coefficients).astype(x.dtype)

    def propose(self, z, fz, state):
        return z - self.step * state.direction, state

    def record(self, z, fz, state):
        us, vs, count, z_prev, g_prev, direction = state
        # The zeroed state (the loop evaluating f(z0) in its first iteration:
        # Solver.init_is_first_record) holds no previous iterate, so its record adds no pair and
        # only starts the state, exactly as init does. A started state has g_prev = direction = 0
        # only at an exact fixed point, where its sample has stopped.
        started = jnp.any(direction != 0) | jnp.any(g_prev != 0)
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
        denom = exact_einsum("d,d->", dz, b_dg)
        # The skip test only decides; differentiating the norms of a zero step would give NaN.
        size = jax.lax.stop_gradient(row_norm(dz) * row_norm(b_dg))
        ok = (jnp.abs(jax.lax.stop_gradient(denom)) > jnp.finfo(z.dtype).eps * size) & (size > 0) & started
        safe = jnp.where(ok, denom, 1.0)
        u = jnp.where(ok, (dz - b_dg) / safe.astype(z.dtype), 0.0).astype(z.dtype)
        v = jnp.where(ok, self._apply_transpose(us, vs, used, dz), 0.0).astype(z.dtype)
        us = write_slot(us, count, u)
        vs = write_slot(vs, count, v)
        direction = b_g + u * exact_einsum("d,d->", v, g).astype(z.dtype)
        return BroydenState(us, vs, jnp.where(started, count + 1, count), z, g, direction)
