"""The default solver: plain iteration, Anderson or Broyden, chosen per solve from the map's cost
and the batch's own convergence."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.extend
import jax.numpy as jnp

from deqlab import checks
from deqlab.solvers.anderson import Anderson
from deqlab.solvers.base import Solver, check_every_setting
from deqlab.solvers.broyden import Broyden, BroydenState
from deqlab.solvers.flatten import row_norm
from deqlab.solvers.loop import batched_hooks

__all__ = ["Adaptive", "AdaptiveState", "map_work", "chosen"]

# The phases of an adaptive solve (AdaptiveState.phase): plain steps that measure the plain rate,
# Anderson steps that measure the accelerated one, then plain or Anderson to the end.
WARM_UP, TRIAL, PLAIN, ACCELERATED = 0, 1, 2, 3
PHASE_NAMES = {WARM_UP: "plain warm-up", TRIAL: "anderson trial", PLAIN: "plain", ACCELERATED: "anderson"}

# Primitives that move or relabel numbers without computing them (XLA fuses or elides them):
# map_work leaves them out.
_MOVES = frozenset({
    "reshape", "squeeze", "expand_dims", "broadcast_in_dim", "convert_element_type", "copy", "copy_p",
    "transpose", "slice", "dynamic_slice", "concatenate", "iota", "stop_gradient", "pad", "rev", "select_n",
    "gather", "device_put", "sharding_constraint", "optimization_barrier",
})


def map_work(func, z) -> float:
    """How much a map computes per evaluation, in numbers written by its operations per number of
    ``z``.

    The sum, over the primitive operations of ``func``'s jaxpr that depend on ``z``, of the sizes
    of their outputs, divided by ``z``'s size: a static, backend-independent measure of what an
    evaluation of f costs next to a solver's own work per step, which is a few passes over
    ``z``-sized arrays (an Anderson or Broyden step writes and reads about 2 m numbers per number
    of ``z``). Work that does not depend on ``z`` (an input injection ``x U^T``) is left out: XLA
    computes it once, outside the solver's loop. So are operations that only move numbers
    (reshapes, broadcasts, transposes, slices, dtype conversions). A ``scan`` body counts
    ``length`` times, a ``cond`` its costliest branch, a ``while_loop`` body once (its trip count is
    unknown). A matrix product counts its output, not its multiply-adds: for the small layers of
    equilibrium models the number of distinct operations and their outputs, not the arithmetic,
    set the time on a CPU (``benchmarks/step_cost.py --problem set``: per number of z, a plain
    step of the 32-wide, length-8 transformer cell costs 3.5x one of the 384-wide tanh layer, 19
    against 5.5 ns, with about as many multiply-adds, some 450 against 384, and ten times the
    ``map_work``, 39 against 4).

    Args:
        func: a function of one array, ``func(z)``; it is traced (``jax.make_jaxpr``), not run,
            so it may close over traced values.
        z: an array (or a ``jax.ShapeDtypeStruct``) of ``func``'s input shape.

    Returns:
        The work per number of ``z``, a Python float (>= 0).

    Example:
        A tanh layer writes three numbers per number of z (the product, the sum, the tanh); its
        input's product ``x @ u`` does not depend on z:

        >>> import jax.numpy as jnp
        >>> from deqlab.solvers import map_work
        >>> w, u, x = jnp.eye(4), jnp.ones((3, 4)), jnp.ones((2, 3))
        >>> map_work(lambda z: jnp.tanh(z @ w + x @ u), jnp.zeros((2, 4)))
        3.0
    """
    size = math.prod(jnp.shape(z))
    if size == 0:
        return 0.0
    closed = jax.make_jaxpr(func)(z)
    return _written(closed.jaxpr, [True] * len(closed.jaxpr.invars)) / size


def _written(jaxpr, dependent) -> float:
    """Numbers written by the operations of ``jaxpr`` that depend on the inputs flagged in
    ``dependent`` (one flag per invar)."""
    depends = {var for var, flag in zip(jaxpr.invars, dependent) if flag}
    total = 0.0
    for eqn in jaxpr.eqns:
        flags = [not _is_literal(var) and var in depends for var in eqn.invars]
        if not any(flags):
            continue  # computed from constants and z-independent inputs only
        depends.update(eqn.outvars)
        name = eqn.primitive.name
        inner = [_written(sub, _inner_flags(eqn, sub, flags)) for sub in _sub_jaxprs(eqn.params)]
        if inner:
            if name == "cond":
                total += max(inner)
            elif name == "scan":
                total += eqn.params.get("length", 1) * sum(inner)
            else:
                total += sum(inner)
        elif name not in _MOVES:
            total += sum(math.prod(getattr(v.aval, "shape", ())) for v in eqn.outvars)
    return total


def _sub_jaxprs(params):
    for value in params.values():
        for item in (value if isinstance(value, (tuple, list)) else (value,)):
            if hasattr(item, "eqns"):  # a Jaxpr
                yield item
            elif hasattr(item, "jaxpr") and hasattr(item.jaxpr, "eqns"):  # a ClosedJaxpr
                yield item.jaxpr


def _is_literal(var) -> bool:
    return isinstance(var, jax.extend.core.Literal)  # a constant operand, written into the jaxpr


def _inner_flags(eqn, sub, flags):
    """Which inputs of a sub-jaxpr depend on z: aligned with the equation's operands where the
    counts match (a call, a scan; a cond's branches after its predicate; a while loop's body after
    the condition's constants), else all of them (a conservative count)."""
    count = len(sub.invars)
    if count == len(flags):
        return flags
    if count == len(flags) - 1:  # cond: (predicate, *operands)
        return flags[1:]
    skip = eqn.params.get("cond_nconsts")
    if skip is not None and count == len(flags) - skip:  # while: (cond consts, body consts, carry)
        return flags[skip:]
    return [any(flags)] * count


class Adaptive(Solver):
    """The default solver: plain iteration, Anderson or Broyden, whichever the map's cost and the
    batch's own steps say is cheapest.

    The rule, decided once per solve for the whole batch:

    1. **An expensive map: Broyden.** Where f's operations write at least ``broyden_above``
       numbers per number of z (:func:`map_work`: a 32-wide transformer cell, about 39 at
       length 8 and more at longer sequences, 129 at 128 tokens; a tanh or linear layer, 2 to 4), a solver step's own work (a few passes over m history vectors) is small
       next to f's, so the method with the fewest steps wins: Broyden (:class:`Broyden`, with
       this solver's stopping settings) runs from the start, and the rest of the rule is skipped.
       It is judged where the slowest sample is predicted to meet ``tol``
       (``broyden_check_every="auto"``, :mod:`deqlab.solvers`), not at every step: on a small
       expensive map a judged step's own reductions and selects are separate kernels that cost
       about 0.6 of a plain step (on the transformer problem below, 173 Broyden steps judged
       every step took 8.6-9.1 ms against 5.4-5.8 ms for 151 unjudged ones: some 14 us a judged
       step, against 23 us for a plain step), and the runs between judged steps skip them. On
       the transformer problem below, interleaved in one process, the default's solve took
       1.15-1.16x the Broyden oracle's time against 1.56-1.59x judged at every step (two runs;
       159 steps against 173; its returned value's error 6.8e-6 against 2.3e-5 in absolute
       terms).
       On ``benchmarks/default_solver.py``'s transformer problem the fewest steps that reach an
       error of 1e-5 are Broyden's 151, Anderson's 410 and plain iteration's 490, at 1.32x,
       1.26x and 1x the loop's plain step (``benchmarks/results/default_solver_quick.txt`` and
       ``step_cost_set_quick.txt``).
    2. **Otherwise, a plain warm-up.** ``warm_up`` evaluations of plain iteration z <- f(z)
       (f(z0) and ``warm_up - 1`` steps). Over their second half, the batch's largest residual (that of the sample furthest from convergence, which
       sets the batch's time) falls by ``d_plain`` decades per step.
    3. **An Anderson trial.** ``trial`` Anderson steps (:class:`Anderson` with ``m`` and
       ``ridge``, from an empty history, so that its first two steps, with no pair and with one,
       are plain ones). Over their second half, the batch's largest residual
       falls by ``d_anderson`` decades per step. The trial's steps are not wasted: they move
       towards z* too.
    4. **The verdict.** Anderson to the end if ``d_anderson > cost_ratio * d_plain`` (its decades
       per unit of work beat plain iteration's, an Anderson step costing ``cost_ratio`` plain
       steps), plain iteration to the end otherwise.

    The halves of the windows leave out plain iteration's first steps, where the fastest modes
    die out, and Anderson's first, taken with a short history. Acceleration pays where the plain
    rate is slow and a Krylov-type method can cut it (a spectrum near 1 on the real axis); it
    does not where the spectrum circles the origin (an orthogonal map: Anderson's steps cost more
    and gain little). ``cost_ratio`` 1.3 is an Anderson step (m = 5) against the loop's plain
    step on the three problems of ``benchmarks/default_solver.py`` as ``python -m
    benchmarks.step_cost --problem set`` measures it on a CPU: 1.25-1.40x over two runs
    (``benchmarks/results/step_cost_set_quick.txt``; 1.19-1.46x over two runs on a slower
    machine before Anderson's mixing became m multiply-adds).

    Measured by ``benchmarks/default_solver.py`` (2-core CPU, tol 1e-5, its stopping rule
    below): the rule keeps plain iteration on the cheap orthogonal tanh map (97 steps; the fewest
    plain steps that reach an error of 1e-5 are 94; 90-100 steps on five other draws of the
    problem), accelerates on the slowly contracting GOE map (62 steps; Anderson's fewest 77,
    plain iteration's 188) and runs Broyden on the transformer cell (159 steps for the slowest
    sample; unjudged Broyden steps bring every sample within 1e-5 absolute in 151); the returned
    values' errors are 3.6e-6, 7.9e-6 and 2.6e-6 in the measure below (6.8e-6 in absolute terms
    on the transformer, whose largest entries are about 3). Many samples stopped on the residual
    fallback described below, after the estimate had kept them iterating: on the tanh map every
    one (0 of 96 had a usable estimate at its stop), on GOE 47 of 96, on the transformer 1 of 8.

    The default stopping rule is ``stop="error"``: a sample stops when the estimated error of the
    value returned, ``safety * ||f(z) - z|| / (1 - q)`` with q the largest secant quotient of its
    steps (a lower estimate of f's contraction rate), is within ``tol`` relative to
    ``max(1, max|f(z)|)`` (:mod:`deqlab.solvers`): where the rate estimate is usable, ``tol``
    bounds the returned value's estimated error, not the last step's residual, which is smaller
    by up to 1 / (1 - q). Where it is not (a rate estimate q >= 0.999: an f that stretches
    some directions, or rates near 1 read through rounding), the residual rule decides, and
    ``Solution.stats.error_estimate`` is inf for that sample: on chapter 0's solver page a
    Gaussian W at scale 0.95 (||J||_2 about 1.7) leaves every sample to the residual rule and
    its error at 8x ``tol``. ``stop="residual"`` restores the residual rule everywhere.

    The plain and Anderson steps are ``lax.cond`` branches for the whole batch
    (:attr:`couples_samples`): a batch in plain iteration pays plain iteration's cost, and there
    the error rule reads each step's secant quotient from the two residual norms the loop already
    has instead of computing two more (:meth:`plain_step`: 200 plain-phase steps on
    ``benchmarks/step_cost.py``'s tanh map cost 1.33x a bare plain step against 1.67x in a
    paired run, the same steps to the same values; that script's row "deqlab default, plain
    phase" measures it, 1.31x in ``step_cost_quick.txt``). Under an outer ``jax.vmap`` (over
    seeds, say) the branches become selects and both are computed.
    The choice is in the returned state: :func:`chosen` names it.

    The implicit backward pass's linear fixed points (the adjoint u = g + J^T u, 003 Eq. 11, and
    the tangent v = b + J v, in :func:`deqlab.backward.adjoint_solve` too) skip the warm-up and
    the trial, for a smaller program: Broyden where f is expensive (step 1), else Anderson from
    the first step (:meth:`for_linear_map`). On a linear map Anderson acceleration is a Krylov
    method (without truncation, damping or ridge, in exact arithmetic and while GMRES does not
    stagnate, its iterates are GMRES's mapped once more: Walker & Ni 2011). In
    ``benchmarks/compile.py`` the default gradient is 1,188 HLO instructions against 1,363 with
    the rule run again on the adjoint (``compile_quick.txt``); in ``benchmarks/default_solver.py``
    the tanh map's gradient error is 3.2e-6 against 2.5e-6 before, and its training step took
    75.3 and 58.3 ms in two runs against 80.4 and 72.9 ms in the two before
    (``default_solver_quick.txt``; no speed difference is claimed from these, and whether Anderson
    beats plain iteration on that orthogonal map's adjoint was not established).

    Attributes:
        m, ridge: of the Anderson steps (:class:`Anderson`).
        warm_up: plain steps before the trial (>= 2).
        trial: Anderson steps of the trial (>= 2).
        cost_ratio: the cost of an Anderson step in plain steps (>= 1).
        broyden_above: the :func:`map_work` from which Broyden runs from the start (> 0; static:
            it is read when the solve is traced). ``math.inf``: never.
        broyden_check_every: the ``check_every`` of that Broyden solve (and of the backward
            pass's, :meth:`for_linear_map`): ``"auto"`` (default) or an integer >= 1 (1: every
            step). ``check_every`` applies to the plain and Anderson steps.
        tol, max_steps, divergence_factor, stop (default ``"error"``), safety, check_every: as
            for :class:`Picard`.

    Raises:
        ValueError: a setting outside its range (the message names it and the valid range).

    Example:
        A slowly contracting linear map with a real spectrum, where acceleration pays, and a
        rotation scaled by 0.8 (its spectrum circles the origin), where it does not:

        >>> import jax, jax.numpy as jnp, deqlab
        >>> from deqlab.solvers import Adaptive, chosen
        >>> f = lambda z, w, x: z @ w + x
        >>> real = jnp.diag(jnp.linspace(0.0, 0.97, 16))
        >>> rotation = 0.8 * jnp.linalg.qr(jax.random.normal(jax.random.key(0), (16, 16)))[0]
        >>> solver = Adaptive(tol=1e-5, max_steps=500)
        >>> slow = deqlab.solve(f, jnp.zeros((4, 16)), real, jnp.ones((4, 16)), solver=solver, batch_axis=0)
        >>> circle = deqlab.solve(f, jnp.zeros((4, 16)), rotation, jnp.ones((4, 16)), solver=solver, batch_axis=0)
        >>> chosen(slow.state), chosen(circle.state)
        ('anderson', 'plain')
        >>> bool(slow.converged.all() & circle.converged.all())
        True
    """

    m: int = 5
    ridge: float = 1e-4
    warm_up: int = 10
    trial: int = 16
    cost_ratio: float = 1.3
    broyden_above: float = dataclasses.field(default=32.0, metadata={"static": True})  # read when tracing
    broyden_check_every: int | str = "auto"
    stop: str = "error"
    name = "adaptive"
    couples_samples = True  # one decision for the batch, so that a batch in plain iteration pays plain cost
    init_is_first_record = True  # init is record into the zeroed state: the first warm-up step
    stays_at_fixed_points = True  # the warm-up's step is f(z)

    def _check_settings(self):  # run by the constructor, whatever a subclass's __post_init__ does
        where = "solvers.Adaptive"
        checks.positive_int(self.m, "m", where)
        checks.number(self.ridge, "ridge", where, lower=0.0, allow_traced=True)
        checks.integer(self.warm_up, "warm_up", where, minimum=2)
        checks.integer(self.trial, "trial", where, minimum=2)
        checks.number(self.cost_ratio, "cost_ratio", where, lower=1.0, allow_traced=True)
        if self.broyden_above != math.inf:  # inf: never Broyden
            checks.number(self.broyden_above, "broyden_above", where, lower=0.0, lower_open=True)
        check_every_setting(self.broyden_check_every, "broyden_check_every", where)

    def for_map(self, func, z) -> Solver:
        """Broyden with this solver's stopping settings where ``func`` is expensive
        (:func:`map_work` >= ``broyden_above``), else this solver (rule step 1)."""
        if map_work(func, z) < self.broyden_above:
            return self
        return Broyden(tol=self.tol, max_steps=self.max_steps, divergence_factor=self.divergence_factor,
                       stop=self.stop, safety=self.safety, check_every=self.broyden_check_every)

    def for_linear_map(self, func, z) -> Solver:
        """Broyden where ``func`` is expensive (as :meth:`for_map`), else Anderson from the first
        step (:meth:`_anderson`'s ``m`` and ``ridge``, this solver's ``tol``, ``max_steps`` and
        stopping settings): the solver of the linear fixed points of the implicit backward pass
        and of :func:`deqlab.backward.adjoint_solve` (the adjoint u = g + J^T u, 003 Eq. 11, and
        the tangent v = b + J v). ``warm_up``, ``trial`` and ``cost_ratio`` are not used there.

        The trial is skipped for a smaller gradient program; on a linear map Anderson is a Krylov
        method (the class docstring gives the conditions and what the change measured).

        Example:
            >>> import jax.numpy as jnp
            >>> from deqlab.solvers import Adaptive
            >>> solver = Adaptive(tol=1e-6)
            >>> type(solver.for_linear_map(lambda u: 0.5 * u + 1.0, jnp.zeros((2, 3)))).__name__
            'Anderson'
        """
        solver = self.for_map(func, z)
        if isinstance(solver, Broyden):  # an expensive map (rule step 1)
            return solver
        return self._anderson().replace(tol=self.tol, max_steps=self.max_steps,
                                        divergence_factor=self.divergence_factor, stop=self.stop,
                                        safety=self.safety, check_every=self.check_every)

    def plain_step(self, state):
        """True in the plain warm-up and after a plain verdict (:meth:`Solver.plain_step`): the
        loop then reads the secant quotient of ``stop="error"`` from the residuals it has."""
        return ~_accelerated(state.phase)

    def _anderson(self) -> Anderson:
        return Anderson(m=self.m, ridge=self.ridge)

    def init(self, z, fz):
        # init is the first warm-up step recorded into the zeroed state (init_is_first_record)
        empty = jax.tree_util.tree_map(jnp.zeros_like, batched_hooks(self._anderson())[0](z, fz))
        level = _log_residual(z, fz)
        zero = jnp.zeros((), jnp.int32)
        state = AdaptiveState(history=empty, phase=zero, count=zero, mark=jnp.zeros((), level.dtype),
                              plain_rate=jnp.zeros((), level.dtype))
        return self.record(z, fz, state)

    def propose(self, z, fz, state):
        propose = batched_hooks(self._anderson())[1]  # per sample, as the loop batches Anderson itself

        # Anderson's propose leaves its history as it is, so only the proposal leaves the branch
        # (no output the size of the (B, m, D) history for XLA to copy).
        def anderson_step(history):
            return propose(z, fz, history)[0]

        z_next = jax.lax.cond(_accelerated(state.phase), anderson_step, lambda history: fz, state.history)
        return z_next, state

    def record(self, z, fz, state):
        record = batched_hooks(self._anderson())[2]
        history = jax.lax.cond(_accelerated(state.phase), lambda h: record(z, fz, h),
                               lambda h: h, state.history)
        level = _log_residual(z, fz)
        count = state.count + 1
        window = jnp.where(state.phase == WARM_UP, self.warm_up, self.trial)
        # The batch's largest residual: its sample is still iterating (the loop stops samples as
        # they converge, and the rest of the batch waits for it), so its decay is the rate that
        # sets the batch's time. (A per-sample rate would also count samples the loop has stopped,
        # whose proposals the solver still sees: under Anderson their stale histories make those
        # proposals' residuals wander, which once made the rule keep plain iteration where
        # Anderson halved the slowest sample's steps.)
        worst = jnp.max(level)
        # the second half of the window starts: the largest residual now
        mark = jnp.where(count == window // 2, worst, state.mark)
        # the window ends: decades per step of the largest residual over the second half
        decay = (mark - worst) / (window - window // 2)
        ends = (count == window) & ((state.phase == WARM_UP) | (state.phase == TRIAL))
        plain_rate = jnp.where(ends & (state.phase == WARM_UP), decay, state.plain_rate)
        verdict = jnp.where(decay > self.cost_ratio * state.plain_rate, ACCELERATED, PLAIN)
        phase = jnp.where(ends, jnp.where(state.phase == WARM_UP, TRIAL, verdict), state.phase)
        return AdaptiveState(history=history, phase=phase.astype(jnp.int32),
                             count=jnp.where(ends, 0, count).astype(jnp.int32), mark=mark,
                             plain_rate=plain_rate.astype(state.plain_rate.dtype))


class AdaptiveState(NamedTuple):
    """The state of an :class:`Adaptive` solve.

    Attributes:
        history: the Anderson history (per sample, leading axis the batch; zeros until the trial).
        phase: 0 plain warm-up, 1 Anderson trial, 2 plain to the end, 3 Anderson to the end
            (shared by the batch).
        count: evaluations recorded in the current phase (the warm-up's include f(z0); it goes
            on counting after the verdict) (shared).
        mark: the batch's largest log10 relative residual at the middle of the current window
            (shared).
        plain_rate: the warm-up's plain rate, decades per step of the batch's largest residual
            (shared).

    Example:
        A linear map whose rates spread up to 0.97 on the real axis: over the warm-up the
        faster modes are still dying out (the absolute residual falls about 0.03 decades per
        step) and ||f(z)|| is still growing from z0 = 0 (another 0.03 off the relative
        residual), so the plain rate measured there, 0.06 decades per step, is above the slowest
        mode's log10(1 / 0.97) = 0.013; Anderson's trial beats it by more than ``cost_ratio``
        all the same:

        >>> import jax.numpy as jnp, deqlab
        >>> w = jnp.diag(jnp.linspace(0.0, 0.97, 16))
        >>> sol = deqlab.solve(lambda z: z @ w + 1.0, jnp.zeros((4, 16)), batch_axis=0)
        >>> history = sol.state.history
        >>> int(history.phase), round(float(history.plain_rate), 2)   # 3: Anderson to the end
        (3, 0.06)
    """

    history: Any
    phase: jax.Array
    count: jax.Array
    mark: jax.Array
    plain_rate: jax.Array


def chosen(state) -> str:
    """What an :class:`Adaptive` solve chose, from its returned state.

    Args:
        state: ``Solution.state`` of a solve with the default solver (a
            :class:`deqlab.solvers.SolverState`), or its ``history``.

    Returns:
        ``"broyden"`` (an expensive map), ``"anderson"`` or ``"plain"`` (the verdict), or
        ``"plain warm-up"`` / ``"anderson trial"`` (the solve ended before the verdict).

    Raises:
        ValueError: ``state`` is not the state of an adaptive solve (the message names its type),
            or its phase is traced (call this outside ``jit``).

    Example:
        >>> import jax.numpy as jnp, deqlab
        >>> from deqlab.solvers import chosen
        >>> sol = deqlab.solve(lambda z: 0.1 * z + 1.0, jnp.zeros(3))
        >>> chosen(sol.state), int(sol.stats.steps)   # converged within the warm-up
        ('plain warm-up', 6)
    """
    history = state if isinstance(state, AdaptiveState) else getattr(state, "history", state)
    if isinstance(history, AdaptiveState):
        try:
            return PHASE_NAMES[int(history.phase)]
        except jax.errors.ConcretizationTypeError:
            raise ValueError("chosen: `state` holds a traced phase; call chosen outside jit.") from None
    if isinstance(history, BroydenState):
        return "broyden"
    raise ValueError(f"chosen: `state` must be the state of a solve with the Adaptive solver (an AdaptiveState, "
                     f"or Broyden's state for an expensive map), got {type(history).__name__}.")


def _accelerated(phase):
    return (phase == TRIAL) | (phase == ACCELERATED)


def _log_residual(z, fz):
    """log10 of each sample's relative residual ||f(z) - z|| / ||f(z)|| (finite: floored).

    The norms are the loop's own expressions (``row_norm`` of the same differences), so that
    XLA computes them once for both (common subexpressions are merged): the measurement adds
    no pass over the batch."""
    g = row_norm(jax.lax.stop_gradient(fz - z))
    size = row_norm(jax.lax.stop_gradient(fz))
    return jnp.log10(jnp.maximum(g / jnp.maximum(size, 1e-30), 1e-30)).astype(jnp.float32)
