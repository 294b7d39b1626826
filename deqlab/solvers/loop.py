"""The shared iteration loop of every solver, on flattened ``(B, D)`` arrays: per-sample
stopping rules, result codes, statistics (the rules are in :mod:`deqlab.solvers`)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import checks
from deqlab import precision as precision_module
from deqlab.failures import Result
from deqlab.solvers.base import RATE_LIMIT, RATE_WINDOW
from deqlab.solvers.flatten import relative_residual, row_norm
from deqlab.solvers.solution import SolverState

__all__: list[str] = []  # the loop is internal: solve is its entry point

#: ``checkpoint="sqrt"``: blocks of ceil(sqrt(max_steps)) steps (the memory-optimal block size).
CHECKPOINT_SQRT = "sqrt"

#: ``check_every="auto"``: the longest run of steps between two judged ones (each run is also at
#: most twice the previous one), so a prediction that is too long costs at most AUTO_MAX_SPAN - 1
#: extra steps.
AUTO_MAX_SPAN = 16


def check_checkpoint(checkpoint, where):
    """Validate the ``checkpoint`` option of an unrolled loop (see :func:`checkpoint_block`).

    Args:
        checkpoint: None, ``"sqrt"`` or an integer >= 1 (a NumPy integer is accepted).
        where: the public function or class the user called, for the message.

    Returns:
        ``checkpoint`` normalised: None, ``"sqrt"`` or a Python ``int``.

    Raises:
        ValueError: anything else (a bool, a float, another string, an integer < 1), naming
            ``checkpoint`` and the valid values.

    Example:
        >>> from deqlab.solvers.loop import check_checkpoint
        >>> check_checkpoint("sqrt", "backward.Unrolled"), check_checkpoint(8, "backward.Unrolled")
        ('sqrt', 8)
    """
    if checkpoint is None or (isinstance(checkpoint, str) and checkpoint == CHECKPOINT_SQRT):
        return checkpoint
    if isinstance(checkpoint, (bool, np.bool_)) or not isinstance(checkpoint, (int, np.integer)) \
            or checkpoint < 1:
        raise checks.fail("checkpoint", "None (no checkpointing), 'sqrt' (blocks of ceil(sqrt(max_steps)) "
                          "steps) or an integer >= 1 (the block size in steps)", checkpoint, where)
    return int(checkpoint)


def checkpoint_block(checkpoint, max_steps):
    """The block size in steps of a checkpointed unrolled loop (the two-level scheme of Chen et al. 2016).

    With blocks of k steps, reverse mode stores max_steps / k block-boundary carries plus the k
    steps of the block being differentiated, minimal at k ~ sqrt(max_steps).

    Args:
        checkpoint: a value accepted by :func:`check_checkpoint`.
        max_steps: the number of unrolled steps (>= 1).

    Returns:
        None (not checkpointed), ceil(sqrt(max_steps)) for ``"sqrt"``, or the integer capped at
        ``max_steps``.

    Example:
        >>> from deqlab.solvers.loop import checkpoint_block
        >>> checkpoint_block("sqrt", 100), checkpoint_block("sqrt", 101), checkpoint_block(500, 100)
        (10, 11, 100)
    """
    if checkpoint is None:
        return None
    if checkpoint == CHECKPOINT_SQRT:
        return math.isqrt(max_steps - 1) + 1
    return min(int(checkpoint), max_steps)


class LoopCarry(NamedTuple):
    """The carry of the shared loop: one structure for every solver and every option (fields an
    option does not use stay as initialised, and XLA drops them from the compiled loop). Leaves
    have a leading batch axis B (flattened samples) unless said otherwise.

    Attributes:
        z, fz: the accepted iterate and f(z), ``(B, D)``.
        res: the relative residual of z, ``(B,)``.
        best_z, best_res, best_abs: the finite iterate of smallest absolute residual so far, with
            its relative and absolute residuals.
        result: per-sample :class:`~deqlab.failures.Result` codes (int32).
        steps: steps taken by each sample (int32).
        step: loop steps taken (a scalar: the batch's slowest sample).
        nfe: evaluations of f (a scalar, over the batch).
        trace: the relative residual after each step, ``(max_steps + 1, B)``.
        state: the solver's state, batched (its hooks see one sample; :func:`batched_hooks`).
        rates: ``stop="error"``: the rate estimates of the last ``RATE_WINDOW`` steps
            (``"residual_ratio"``) or their running maximum (``"secant"``, one column).
        abs: ``stop="error"``: the absolute residual of z.
        err: ``stop="error"``: the error estimate of the value each sample would return.
        measure: ``check_every="auto"``: what each sample compared with tol at its last judged step.
        span: ``check_every="auto"``: the length of the next run of steps (a scalar).
    """

    z: jax.Array
    fz: jax.Array
    res: jax.Array
    best_z: jax.Array
    best_res: jax.Array
    best_abs: jax.Array
    result: jax.Array
    steps: jax.Array
    step: jax.Array
    nfe: jax.Array
    trace: jax.Array
    state: Any
    rates: jax.Array
    abs: jax.Array
    err: jax.Array
    measure: jax.Array
    span: jax.Array


def batched_hooks(config):
    """The solver's ``init``, ``propose`` and ``record`` on a batch of flattened ``(B, D)`` rows.

    A solver's hooks see one sample (a ``(D,)`` row and that sample's state), and ``jax.vmap``
    applies them to every sample at once, so no sample's step depends on another's. A solver
    with :attr:`~deqlab.solvers.Solver.couples_samples` sees the whole batch instead. These are
    what the shared loop calls; use them to run a solver's steps outside it (as
    ``benchmarks/stopping.py`` does to time the steps alone).

    Args:
        config: a :class:`~deqlab.solvers.Solver`.

    Returns:
        ``(init, propose, record)`` on ``(B, D)`` arrays and batched states.

    Example:
        >>> import jax.numpy as jnp, deqlab
        >>> from deqlab.solvers import batched_hooks
        >>> init, propose, record = batched_hooks(deqlab.Anderson(m=3))
        >>> z = jnp.zeros((4, 2))
        >>> [leaf.shape for leaf in init(z, z + 1.0)]   # each sample's history, stacked
        [(4, 3, 2), (4, 3, 2), (4, 3, 3), (4,)]
    """
    if config.couples_samples:
        return config.init, config.propose, config.record
    return tuple(_per_sample(hook) for hook in (config.init, config.propose, config.record))


def _per_sample(hook):
    """``jax.vmap(hook)`` over the leading axis of every argument. Under a mesh with explicit
    axes, ``vmap`` requires every mapped axis to be sharded alike: a state leaf that a solver
    built from constants (a slot counter) is replicated while the iterates are split over the
    batch, so such leaves are first resharded like the first argument."""
    batched = jax.vmap(hook)

    def call(*args):
        try:
            return batched(*_batch_sharded_alike(args))
        except (TypeError, ValueError, IndexError) as err:
            err.add_note(f"deqlab: {getattr(hook, '__qualname__', hook)} ran on one sample's flattened (D,) row "
                         "under jax.vmap: since deqlab 0.9 a Solver's init/propose/record are written for one "
                         "sample (a solver written for (B, D) rows sets couples_samples = True).")
            raise

    return call


def _leading_spec(x):
    """The mesh axes of ``x``'s leading axis under explicit sharding, else None."""
    try:
        spec = jax.typeof(x).sharding.spec
    except (AttributeError, TypeError):  # no sharding in the type (no explicit mesh)
        return None
    return spec[0] if len(spec) else None


def _batch_sharded_alike(args):
    leaves, tree = jax.tree_util.tree_flatten(args)
    spec = _leading_spec(leaves[0]) if leaves else None
    if spec is None or all(_leading_spec(leaf) == spec for leaf in leaves):
        return args
    sharding, pspec = jax.typeof(leaves[0]).sharding, jax.sharding.PartitionSpec
    leaves = [leaf if _leading_spec(leaf) == spec
              else jax.sharding.reshard(leaf, sharding.update(spec=pspec(spec, *([None] * (jnp.ndim(leaf) - 1)))))
              for leaf in leaves]
    return jax.tree_util.tree_unflatten(tree, leaves)


def _checked_terminate(config, tol, residual, error):
    """``config.terminate`` applied to every sample (``vmap``), after checking once, abstractly,
    that it returns one boolean per sample: a mistake there is named, not left to a broadcasting
    error deep in the loop."""
    per_sample = jax.vmap(config.terminate, in_axes=(None, 0, 0))
    try:
        out = jax.eval_shape(per_sample, tol, residual, error)
    except jax.errors.ConcretizationTypeError as err:
        raise TypeError(f"{type(config).__name__}.terminate(tol, residual, error) must be written with "
                        "jnp operations on its (traced) arguments, not Python `if`/`bool()`: "
                        f"{type(err).__name__}") from err
    if not (hasattr(out, "shape") and out.shape == residual.shape and out.dtype == jnp.bool_):
        got = (f"dtype {out.dtype}, shape {out.shape[1:]}" if hasattr(out, "shape")
               else type(out).__name__)
        raise TypeError(f"{type(config).__name__}.terminate(tol, residual, error) must return one boolean "
                        f"scalar per sample (e.g. `residual <= tol`), got {got}.")
    return per_sample


def _checked_plain_step(config, state):
    """``config.plain_step(state)`` (Solver.plain_step), checked: None or one boolean scalar."""
    plain = config.plain_step(state)
    if isinstance(plain, (bool, np.bool_)):
        plain = jnp.asarray(plain)
    if plain is not None and not (hasattr(plain, "shape") and jnp.shape(plain) == () and jnp.result_type(plain) == jnp.bool_):
        got = f"shape {jnp.shape(plain)}, dtype {jnp.result_type(plain)}" if hasattr(plain, "shape") else type(plain).__name__
        raise TypeError(f"{type(config).__name__}.plain_step(state) must return None or one boolean scalar for the "
                        f"batch (True when every sample's next proposal is f(z)), got {got}.")
    return plain


def _iterating(result):
    """The samples still iterating: their code is MAX_STEPS_REACHED until they stop (a sample's
    code is the carry's only record of whether it is active, which keeps the program small)."""
    return result == Result.MAX_STEPS_REACHED


def _checked_hooks(config, init, propose, record, z, fz, init_history):
    """The first state (``init``'s, or ``init_history``), after checking once, abstractly
    (``jax.eval_shape``: nothing runs), that the hooks return what the loop carries: ``init`` a
    pytree of arrays, ``propose`` a pair ``(z_next, state)`` with ``z_next`` of z's shape and dtype,
    ``propose`` and ``record`` a state of the structure, shapes and dtypes they were given. A
    mistake is named with the hook, instead of a broadcasting or while-loop carry error."""
    name = type(config).__name__
    one = "" if config.couples_samples else " (for one sample: the (D,) row and that sample's state)"
    if init_history is None:
        try:
            state = init(z, fz)
        except TypeError as err:
            named = TypeError(f"{name}.init(z, fz) must return a pytree of arrays (the solver's state, `()` "
                              f"when it keeps none){one}: {err}")
            for note in getattr(err, "__notes__", []):
                named.add_note(note)
            raise named from err
    else:
        state = init_history
    leaves = jax.tree_util.tree_leaves(state)
    bad = [leaf for leaf in leaves if not isinstance(leaf, (jax.Array, np.ndarray, np.generic))]
    if bad:
        raise TypeError(f"{name}.init(z, fz) must return a pytree of arrays{one}, got a leaf of type "
                        f"{type(bad[0]).__name__}.")
    def row(shape):  # what the hooks see: one sample's shapes, unless the solver couples samples
        return tuple(shape) if config.couples_samples else tuple(shape)[1:]

    def described(tree):
        return [(row(x.shape), str(x.dtype)) for x in jax.tree_util.tree_leaves(tree)]

    want = (jax.tree_util.tree_structure(state), described(state))
    try:
        proposed = jax.eval_shape(propose, z, fz, state)
    except (TypeError, ValueError, IndexError) as err:
        err.add_note(f"deqlab: in {name}.propose(z, fz, state){one}.")
        raise
    if not (isinstance(proposed, tuple) and len(proposed) == 2):
        got = f"a tuple of {len(proposed)}" if isinstance(proposed, tuple) else type(proposed).__name__
        raise TypeError(f"{name}.propose(z, fz, state) must return a pair (z_next, state){one}, got {got}.")
    z_next, state_next = proposed
    if not hasattr(z_next, "shape") or (tuple(z_next.shape), z_next.dtype) != (tuple(z.shape), z.dtype):
        got = f"shape {row(z_next.shape)} and dtype {z_next.dtype}" if hasattr(z_next, "shape") else type(z_next).__name__
        raise TypeError(f"{name}.propose(z, fz, state) must return z_next of z's shape {row(z.shape)} and dtype "
                        f"{z.dtype}{one}, got {got}.")
    try:
        recorded = jax.eval_shape(record, z, fz, state_next)
    except (TypeError, ValueError, IndexError) as err:
        err.add_note(f"deqlab: in {name}.record(z, fz, state){one}.")
        raise
    for hook, out in (("propose", state_next), ("record", recorded)):
        if (jax.tree_util.tree_structure(out), described(out)) != want:
            raise TypeError(f"{name}.{hook} must return a state of the structure, shapes and dtypes it was given "
                            f"(the loop carries it from step to step){one}: expected {want[0]} with "
                            f"{want[1]}, got {jax.tree_util.tree_structure(out)} with {described(out)}.")
    return state


def _laid_out_like(z, like):
    """``z`` resharded like the abstract value ``like`` where ``like`` is split over a mesh axis
    (an explicit mesh) and ``z`` is not split alike; otherwise ``z`` itself."""
    sharding = getattr(like, "sharding", None)
    spec = getattr(sharding, "spec", None)
    if spec is None or all(axis is None for axis in spec):
        return z
    try:
        current = jax.typeof(z).sharding.spec
    except (AttributeError, TypeError):  # no sharding in the type (no explicit mesh)
        return z
    return z if tuple(current) == tuple(spec) else jax.sharding.reshard(z, sharding)


def _where_batch(mask, new, old):
    """Per-sample select on pytrees whose leaves have a leading batch axis."""

    def select(a, b):
        if jnp.ndim(a) == 0:
            return a
        shaped = mask.reshape(mask.shape + (1,) * (jnp.ndim(a) - 1))
        return jnp.where(shaped, a, b)

    return jax.tree_util.tree_map(select, new, old)


def _run(config, tol, func, z0_flat, unrolled, init_history=None, checkpoint=None, step_limit=None):
    """The shared iteration loop on (B, D) arrays.

    ``unrolled=True`` uses ``lax.scan`` over exactly ``max_steps`` (frozen samples are masked), so
    reverse-mode differentiation through the iterations works; otherwise ``lax.while_loop``.
    ``checkpoint`` (unrolled only; :func:`check_checkpoint`) splits that scan into blocks of
    :func:`checkpoint_block` steps, each under ``jax.checkpoint``: the backward pass keeps the
    carry at block boundaries and recomputes one block at a time, the same steps in the same order.
    ``init_history`` continues a solver history from an earlier solve (``SolverState.history``).
    With ``config.check_every = k > 1`` (and not unrolled) the loop takes k steps per check: the
    first k - 1 are bare solver steps, the k-th is judged (see :mod:`deqlab.solvers`).
    ``tol`` may be a traced scalar; ``step_limit`` (a traced int32 scalar in ``[1, max_steps]``,
    :mod:`deqlab.solvers.budget`) stops the iteration before ``config.max_steps``, which still sizes
    the trace and the scan of an unrolled solve (whose steps past the limit are masked).
    f is evaluated on the whole batch; the solver's hooks run per sample (:func:`batched_hooks`).
    """
    init, propose, record = batched_hooks(config)
    dtype = z0_flat.dtype
    work = precision_module.working_dtype(dtype)
    big = jnp.finfo(work).max
    error_rule = config.stop == "error"
    # Which rate estimate the error rule uses (Solver.rate_estimate): residual ratios over a
    # window of RATE_WINDOW steps, or the largest secant quotient of the solve.
    ratios = config.rate_estimate == "residual_ratio"
    every = 1 if unrolled else config.check_every
    auto = every == "auto"
    # The default loop (a while loop judging every step) and check_every="auto"'s (whose first
    # run is one step) evaluate f(z0) in their first iteration, so that f appears once in the
    # compiled program instead of twice (before the loop and in it): the carry starts "before
    # step 0" (step = -1), and that iteration judges z0 itself instead of a proposal and records
    # (z0, f(z0)) into the zeroed state, which is init's state for a solver that keeps none or
    # declares Solver.init_is_first_record. The other loops (unrolled, check_every > 1) and other
    # solvers evaluate f(z0) before the loop.
    # The hooks' contract checked first (a mistake is named with the hook), with z0 standing in for
    # f(z0): the shapes are what matter, and the fold needs to know whether the solver keeps a state.
    checked_state = _checked_hooks(config, init, propose, record, z0_flat, z0_flat, init_history)
    stateless = not jax.tree_util.tree_leaves(checked_state)
    folded = not unrolled and (every == 1 or auto) and (config.init_is_first_record or stateless)
    if folded:
        # Adopt the layout of f's output, without evaluating it: z0 is often a fresh, replicated
        # zeros array while the input (and so f(z0)) is sharded over the batch.
        z0_flat = _laid_out_like(z0_flat, jax.eval_shape(func, z0_flat))
        fz0 = z0_flat  # a placeholder, never judged: the first iteration evaluates f(z0)
        res0 = abs0 = jnp.full(z0_flat.shape[:1], big, work) + jnp.zeros_like(z0_flat[:, 0], dtype=work)
        finite0 = jnp.ones_like(res0, dtype=bool)
    else:
        fz0 = func(z0_flat)
        # Adopt the layout of f's output: z0 is often a fresh, replicated zeros array while the
        # input (and so f(z0)) is sharded over the batch.
        z0_flat = z0_flat + jnp.zeros_like(fz0)
        finite0 = jnp.all(jnp.isfinite(fz0), axis=1)
        res0 = jnp.where(finite0, relative_residual(fz0, z0_flat), big)
        abs0 = jnp.where(finite0, row_norm(jax.lax.stop_gradient(fz0 - z0_flat)), big)
    no_error = jnp.full_like(res0, jnp.inf, dtype=work)  # no error estimate before the first step
    terminate = _checked_terminate(config, tol, res0, no_error)
    if folded:
        result0 = jnp.full_like(res0, Result.MAX_STEPS_REACHED, dtype=jnp.int32)  # every sample "iterating"
    else:
        result0 = jnp.where(
            ~finite0, Result.NONFINITE, jnp.where(terminate(tol, res0, no_error), Result.SUCCESS,
                                                  Result.MAX_STEPS_REACHED)
        ).astype(jnp.int32)
    fz0_safe = jnp.where(finite0[:, None], fz0, z0_flat)
    if init_history is not None:
        state0 = init_history
    elif folded:
        # init's state with every leaf zeroed: the first iteration records (z0, f(z0)) into it,
        # which is init's state (Solver.init_is_first_record)
        state0 = jax.tree_util.tree_map(jnp.zeros_like, checked_state)
    else:
        state0 = init(z0_flat, fz0_safe)
    carry0 = LoopCarry(
        z=z0_flat,
        fz=fz0_safe,
        res=res0,
        best_z=z0_flat,
        best_res=res0,
        best_abs=abs0,
        result=result0,
        steps=jnp.zeros_like(result0),
        step=jnp.full((), -1 if folded else 0, jnp.int32),
        nfe=jnp.full((), 0 if folded else 1, jnp.int32),
        # One row per step, written with dynamic_update_slice: O(B) per step, and the batch axis
        # (the second) keeps the sharding of the residuals when the batch is split across devices.
        trace=jnp.repeat(res0[None, :], config.max_steps + 1, axis=0),
        state=state0,
        # stop="error": the last RATE_WINDOW rate estimates (inf: none yet, so the residual rule
        # decides) or their running maximum, the absolute residual of the accepted iterate
        # (Picard's rate is a ratio of two of them) and the error estimate of the value the
        # sample would return.
        # (Built from res0, not from constants, so that they are split over the batch like it
        # under an explicit mesh.)
        rates=(jnp.repeat(no_error[:, None], RATE_WINDOW, axis=1) if ratios else jnp.zeros_like(no_error)[:, None]),
        abs=abs0,
        err=no_error,
        # check_every="auto": what each sample compares with tol at its last judged step (the
        # error estimate where it is reliable, else the relative residual; negative for the
        # residual, so that a switch between the two is never read as a decay), and the length of
        # the next run.
        measure=-res0.astype(work),
        span=jnp.ones((), jnp.int32),
    )

    residual_floor = jnp.finfo(dtype).eps * math.sqrt(z0_flat.shape[1])
    def bare(z, fz, state):
        """One solver step without any check: what the limit of plain iteration costs."""
        z_prop, state = propose(z, fz, state)
        fz_prop = func(z_prop)
        return z_prop, fz_prop, record(z_prop, fz_prop, state)

    def rate_and_error(carry, z_in, fz_in, z_prop, fz_prop, diff, abs_prop, finite, accept, span, plain):
        """stop="error": the updated rate estimates and the error estimate of each proposal."""
        if ratios:
            # A stationary iteration (Picard): successive residuals shrink by the contraction rate
            # of the (damped) map, ||g_k|| / ||g_{k-1}||; over a span of k steps, its k-th root.
            ratio = abs_prop / carry.abs
            rate = ratio if isinstance(span, int) and span == 1 else ratio ** (1.0 / jnp.asarray(span, work))
        else:
            # Accelerated solvers (Anderson, Broyden): their residual ratios measure the
            # acceleration, not f. The secant quotient ||f(z') - f(z)|| / ||z' - z|| of the last
            # step measures how much f stretches along it, a lower estimate of f's Lipschitz
            # constant near z*.
            def secant():
                step_norm = row_norm(jax.lax.stop_gradient(z_prop - z_in))
                return row_norm(jax.lax.stop_gradient(fz_prop - fz_in)) / step_norm

            if plain is None:
                rate = secant()
            else:
                # After a plain step (z' = f(z): Solver.plain_step) the quotient is
                # ||f(z') - z'|| / ||f(z) - z||, two norms the loop already has (carry.abs holds
                # the accepted iterate's), so the batch skips two passes over (B, D) arrays.
                rate = jax.lax.cond(plain, lambda: abs_prop / carry.abs, secant)
        rate = jnp.where(finite & jnp.isfinite(rate), rate, jnp.inf).astype(work)
        if ratios:
            # Picard's ratios rise towards the rate of its slowest mode as the faster ones die
            # out: the last few (their maximum, against noise) estimate the rate now.
            rates = jnp.concatenate([carry.rates[:, 1:], rate[:, None]], axis=1)
        else:
            # An accelerated step moves mostly along directions f stretches little, so a single
            # quotient underestimates f's rate near z* (up to 6x in the error bound at rate
            # 0.995, measured): the maximum over every step of the solve is kept.
            rates = jnp.maximum(carry.rates, rate[:, None])
        rates = jnp.where(accept[:, None], rates, carry.rates)
        q = jnp.max(rates, axis=1)
        reliable = q < RATE_LIMIT
        # Banach's a-posteriori bounds (Solver.error_bound_factor): Picard returns
        # z + damping (f(z) - z), within q / (1 - q) of its step from z*; the others return z,
        # within ||f(z) - z|| / (1 - q).
        gain = config.error_bound_factor(jnp.where(reliable, q, 0.0))
        size = jnp.max(jnp.abs(diff), axis=1).astype(work)
        scale = jnp.maximum(jnp.max(jnp.abs(jax.lax.stop_gradient(fz_prop)), axis=1).astype(work), 1.0)
        return rates, jnp.where(reliable & finite, config.safety * gain * size / scale, jnp.inf)

    def judged(carry, z_in, fz_in, state_in, span):
        """One solver step from (z_in, fz_in, state_in), judged: ``span`` steps after the last
        judged one (z_in is the carry's iterate when span is 1). In the folded loop, the first
        iteration (step -1) judges z_in = z0 itself and starts the solver's state."""
        # Solver.plain_step: the secant quotient of a single plain step is a ratio of residuals the
        # loop has (after a run of bare steps, span > 1, the last step's input residual is not kept)
        plain = (_checked_plain_step(config, state_in)
                 if error_rule and not ratios and isinstance(span, int) and span == 1 else None)
        first = carry.step < 0 if folded else jnp.zeros((), bool)
        z_prop, fz_prop, state = stepped(z_in, fz_in, state_in, first)
        return assessed(carry, z_in, fz_in, z_prop, fz_prop, state, span, plain, first)

    def stepped(z_in, fz_in, state_in, first):
        """One solver step from (z_in, fz_in, state_in): the proposal, f of it, and the state that
        has recorded the pair. In the folded loop's first iteration (``first``) the step evaluates
        z_in = z0 itself and starts the solver's state."""
        z_prop, state_prop = propose(z_in, fz_in, state_in)
        if folded and (init_history is not None or not config.stays_at_fixed_points):
            # The carry's fz is a placeholder equal to z0, so a solver that stays at fixed points
            # proposes z0 itself (Solver.stays_at_fixed_points); any other needs the select.
            z_prop = jnp.where(first, z_in, z_prop)
        fz_prop = func(z_prop)
        if folded and init_history is not None:
            # a continued history already holds z0 (the last iterate of the solve it came from)
            state = jax.tree_util.tree_map(lambda a, b: jnp.where(first, a, b), state_in,
                                           record(z_prop, fz_prop, state_prop))
        elif folded:
            # the first iteration records (z0, f(z0)) into the zeroed state: init's state
            state = record(z_prop, fz_prop, jax.tree_util.tree_map(lambda a, b: jnp.where(first, a, b),
                                                                   state_in, state_prop))
        else:
            state = record(z_prop, fz_prop, state_prop)
        return z_prop, fz_prop, state

    def assessed(carry, z_in, fz_in, z_prop, fz_prop, state, span, plain, first, frozen=False):
        """The carry after the step from (z_in, fz_in) to the proposal (z_prop, fz_prop), whose
        pair the solver's state has recorded: ``span`` steps after the last judged one.
        ``frozen``: the run already kept the stopped samples' states (auto_chunk)."""
        # A NaN or inf anywhere in z_prop or f(z_prop) makes the norms non-finite (as does an
        # overflow of the norm, which only a diverging iterate reaches). The norms only decide and
        # report, so they are not differentiated (the norm of an exact zero has no derivative).
        diff = jax.lax.stop_gradient(fz_prop - z_prop)
        diff_norm = row_norm(diff)
        f_norm = row_norm(jax.lax.stop_gradient(fz_prop))
        # One test for both norms (a NaN or inf in either makes the sum non-finite): every
        # condition below is computed once per sample and XLA copies it into each fused consumer,
        # so the fewer there are, the smaller the program.
        finite = jnp.isfinite(diff_norm + f_norm)
        active = _iterating(carry.result)
        if step_limit is not None:
            # a budget below the cap: the steps past it change nothing (unrolled: masked)
            active = active & (carry.step + span <= step_limit)
        accept = active & finite
        z = jnp.where(accept[:, None], z_prop, carry.z)
        fz = jnp.where(accept[:, None], fz_prop, carry.fz)
        # Where not finite these are NaN or inf, and never used: the sample stops with NONFINITE
        # below whatever they hold, and every other use is selected by `accept`.
        res_prop = diff_norm / (f_norm + residual_floor)
        abs_prop = diff_norm
        res = jnp.where(accept, res_prop, carry.res)
        if unrolled or (config.freeze_state and not frozen):
            # Rejected and frozen samples never become active again, so their solver state is
            # irrelevant to the result; it is kept finite only when differentiating through the
            # loop (a NaN in an unselected branch would still poison the gradient). A solver with
            # freeze_state (Broyden) also keeps it as it was when the sample stopped: Broyden's is
            # the inverse-Jacobian estimate at that sample's equilibrium that SHINE reuses.
            state = _where_batch(accept, state, carry.state)
        # The best iterate is the one closest to convergence in absolute terms: a relative
        # residual also falls when an iterate runs off to infinity (for f = 2z + 1 it tends to
        # 1/2), so it cannot tell a diverging iterate from a converging one.
        improved = accept & (abs_prop < carry.best_abs)
        rates, err, abs_kept = carry.rates, carry.err, carry.abs
        error = jnp.full_like(res_prop, jnp.inf, dtype=work)
        if error_rule:
            rates, error = rate_and_error(carry, z_in, fz_in, z_prop, fz_prop, diff, abs_prop, finite,
                                          accept & ~first, span, plain)
            if folded:  # the first iteration evaluates z0: no step yet, so no rate and no estimate
                error = jnp.where(first, jnp.inf, error)
            abs_kept = jnp.where(accept, abs_prop, carry.abs)
            err = jnp.where(accept, error, carry.err)
        # The convergence test is the solver's (Solver.terminate), per sample; it sees big, not
        # NaN, for a non-finite proposal.
        meets = terminate(tol, jnp.where(finite, res_prop, big), error)
        # The sample's code after this step: NONFINITE, SUCCESS, DIVERGED (its residual grew past
        # divergence_factor times its best) or still MAX_STEPS_REACHED (iterating), in that order
        # of precedence; a sample that was not active keeps its code.
        code = jnp.where(~finite, Result.NONFINITE, jnp.where(
            meets, Result.SUCCESS, jnp.where(abs_prop > config.divergence_factor * carry.best_abs,
                                             Result.DIVERGED, Result.MAX_STEPS_REACHED)))
        result = jnp.where(active, code, carry.result).astype(jnp.int32)
        step = carry.step + span
        if isinstance(span, int):
            rows = res[None, :] if span == 1 else jnp.broadcast_to(res[None, :], (span,) + res.shape)
            trace = jax.lax.dynamic_update_slice(carry.trace, rows, (step - span + 1, jnp.zeros_like(step)))
        else:
            # A run of traced length: its rows are written by a mask over the trace (judged steps
            # are few under check_every="auto", so O(max_steps B) per judged step is cheap).
            index = jnp.arange(carry.trace.shape[0])[:, None]
            trace = jnp.where((index > step - span) & (index <= step), res[None, :], carry.trace)
        measure = carry.measure
        if auto:
            measure = jnp.where(jnp.isfinite(error), error, -res_prop).astype(work)
            measure = jnp.where(accept, measure, carry.measure)
        return LoopCarry(
            z=z,
            fz=fz,
            res=res,
            best_z=jnp.where(improved[:, None], z_prop, carry.best_z),
            best_res=jnp.where(improved, res_prop, carry.best_res),
            best_abs=jnp.where(improved, abs_prop, carry.best_abs),
            result=result,
            steps=carry.steps + span * (active & ~first).astype(jnp.int32),
            step=step,
            nfe=carry.nfe + span,
            trace=trace,
            state=state,
            rates=rates,
            abs=abs_kept,
            err=err,
            measure=measure,
            span=carry.span,
        )

    def body(carry):
        return judged(carry, carry.z, carry.fz, carry.state, 1)

    def next_span(before, after, span):
        """check_every="auto": the steps until the next judged one. Each active sample's measure
        (what it compares with tol) fell by a factor r per step over the last run; at that rate it
        meets tol after log(tol / measure) / log(r) more steps. f is evaluated on the whole batch
        until its slowest sample stops, so the run is the largest of these predictions: the
        slowest sample is judged when it is predicted to meet tol, and a faster one a few steps
        after it could have stopped (its steps are counted, its value is the judged iterate, which
        a contraction has only brought closer to z*). Samples without a prediction (a measure that
        did not fall, a switch between residual and error estimate) do not set the run. The run
        is at least 1, at most twice the last one and AUTO_MAX_SPAN, and never passes the limit."""
        prev, now = before.measure, after.measure
        level, level_before = jnp.abs(now), jnp.abs(prev)
        target = jnp.asarray(tol, work)
        decay = (level / level_before) ** (1.0 / span.astype(work))
        usable = (_iterating(after.result) & ((prev < 0) == (now < 0)) & jnp.isfinite(decay) & (decay > 0)
                  & (decay < 1) & (level > target))
        predicted = jnp.ceil(jnp.log(target / jnp.where(usable, level, 1.0))
                             / jnp.log(jnp.where(usable, decay, 0.5)))
        grow = jnp.minimum(2 * span, AUTO_MAX_SPAN).astype(work)
        run = jnp.minimum(jnp.max(jnp.where(usable, predicted, 0.0)), grow)
        return jnp.clip(run, 1, jnp.maximum(limit - after.step, 1)).astype(jnp.int32)

    def auto_chunk(carry):
        # span bare steps, then the last one judged: f appears once in the program (a judged step
        # of its own would trace it again). The step before the last is kept for the secant rate.
        # Folded, the first run is one step that evaluates z0 (its span is 1).
        span = carry.span
        first = carry.step < 0 if folded else jnp.zeros((), bool)
        # Samples stop only at judged steps, so those iterating are the same through the run.
        active = _iterating(carry.result)

        def step(_, pairs):
            _, _, z, fz, state = pairs
            z_prop, fz_prop, recorded = stepped(z, fz, state, first)
            if config.freeze_state:
                # A stopped sample's state stays as it was when it stopped (Solver.freeze_state),
                # kept step by step: keeping the run's first state for one select after the run
                # would copy the whole state at every run (a tenth of the transformer's solve
                # time with Broyden). A sample whose run ends in a non-finite step stops with the
                # states of that run.
                recorded = _where_batch(active, recorded, state)
            return z, fz, z_prop, fz_prop, recorded

        z_in, fz_in, z_prop, fz_prop, state = jax.lax.fori_loop(
            0, span, step, (carry.z, carry.fz, carry.z, carry.fz, carry.state))
        after = assessed(carry, z_in, fz_in, z_prop, fz_prop, state, span, None, first, frozen=True)
        return after._replace(span=next_span(carry, after, span))

    if not auto:
        every = min(every, config.max_steps)

    def chunk(carry):
        z, fz, state = carry.z, carry.fz, carry.state
        for _ in range(every - 1):
            z, fz, state = bare(z, fz, state)
        return judged(carry, z, fz, state, every)

    limit = config.max_steps if step_limit is None else step_limit
    block = checkpoint_block(checkpoint, config.max_steps) if unrolled else None
    if unrolled and block is None:
        final, _ = jax.lax.scan(lambda c, _: (body(c), None), carry0, None, length=config.max_steps)
    elif unrolled:
        # Two levels: an outer scan over blocks of `block` steps whose body is rematerialised, so
        # reverse mode stores max_steps / block carries plus one block's residuals at a time
        # (O(sqrt(max_steps)) for block = sqrt(max_steps)) at the cost of one more forward pass.
        # The steps are the same body() in the same order as the plain scan.
        def steps(length):
            def run_block(carry, _):
                carry, _ = jax.lax.scan(lambda c, _: (body(c), None), carry, None, length=length)
                return carry, None
            # prevent_cse=False: inside a scan, CSE cannot merge the recomputation away.
            return jax.checkpoint(run_block, prevent_cse=False)

        blocks, tail = divmod(config.max_steps, block)
        final, _ = jax.lax.scan(steps(block), carry0, None, length=blocks)
        if tail:
            final, _ = steps(tail)(final, None)
    else:
        final = carry0
        if auto:
            # the runs end at the limit (next_span), so no single steps follow
            final = jax.lax.while_loop(lambda c: jnp.any(_iterating(c.result)) & (c.step < limit), auto_chunk, final)
        else:
            if every > 1:
                # Whole chunks while they fit, then single judged steps up to max_steps.
                final = jax.lax.while_loop(lambda c: jnp.any(_iterating(c.result)) & (c.step + every <= limit), chunk,
                                           final)
            final = jax.lax.while_loop(lambda c: jnp.any(_iterating(c.result)) & (c.step < limit), body, final)

    # Rows after the last step repeat the final residual, so the trace is finite and plottable.
    rows = jnp.arange(config.max_steps + 1)[:, None]
    trace = jnp.where(rows <= final.step, final.trace, final.res[None, :])
    # A converged sample was frozen at the iterate that met tol: its value is that iterate (its
    # last z); any other sample returns its finite iterate of smallest absolute residual. In
    # unrolled mode both selections are where()s, so the value stays differentiable.
    success = final.result == Result.SUCCESS
    converged_value = final.z
    if config.steps_past_convergence:
        # f(z) of the converged iterate is in fz already: one more step costs nothing.
        converged_value, _ = propose(final.z, final.fz, final.state)
    # One select (XLA does not merge two selects on the same predicate): for Picard the
    # converged value is f(z), so z itself is then dead in the compiled program.
    value = jnp.where(success[:, None], converged_value, final.best_z)
    stats = dict(
        steps=final.steps,
        nfe=final.nfe,
        trace=trace,
        best_res=jnp.where(success, final.res, final.best_res),
        res=final.res,
        err=final.err if error_rule else None,
    )
    return value, final.result, stats, SolverState(final.z, final.state)
