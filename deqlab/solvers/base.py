"""The :class:`Solver` base class: a frozen configuration plus ``init`` and ``propose``, with the
hooks through which the shared loop (:mod:`deqlab.solvers.loop`) treats every solver alike."""

from __future__ import annotations

import abc
import dataclasses
import inspect
import re
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import checks
from deqlab import precision as precision_module

__all__ = ["Solver", "STOPPING_RULES", "RATE_LIMIT", "RATE_WINDOW", "RATE_ESTIMATES"]



#: Stopping rules: ``"residual"`` (relative residual <= tol) and ``"error"`` (estimated error of
#: the returned value <= tol, see :mod:`deqlab.solvers`).
STOPPING_RULES = ("residual", "error")
#: Contraction-rate estimates at or above this are unreliable (a rate this close to 1 multiplies
#: the error bound by 1 / (1 - q) >= 1000, and rounding noise makes ratios near 1 meaningless): the
#: error rule falls back to the residual rule there.
RATE_LIMIT = 0.999
#: Number of successive rate estimates whose maximum is the rate used by the error rule.
RATE_WINDOW = 3


#: How the error rule estimates the contraction rate q (see :attr:`Solver.rate_estimate`).
RATE_ESTIMATES = ("residual_ratio", "secant")


class Solver(abc.ABC):
    """Base class of the forward fixed-point solvers: subclass it to write your own.

    A solver is a frozen configuration (tolerances, history sizes, step lengths) plus two methods
    written for **one sample**, a flattened ``(D,)`` row (:func:`solve` flattens any pytree):

    - ``init(z, fz) -> state``: the solver's state (history) at the first iterate ``z`` with
      ``fz = f(z)``; a pytree of arrays (``()`` for a solver without memory).
    - ``propose(z, fz, state) -> (z_next, state)``: the next iterate from the accepted iterate
      ``z`` and ``fz = f(z)``.

    and nothing else: the shared loop of :func:`solve` evaluates f on the whole batch, applies
    the methods to every sample with ``jax.vmap`` (no sample's step depends on another's), judges
    every sample on its own (:meth:`terminate`: ``stop="residual"`` or ``"error"``; divergence and
    non-finite checks, :mod:`deqlab.solvers`), freezes samples that stopped, keeps the statistics
    and returns a :class:`SolverState` for warm starts (``init_state``), whose history has a
    leading batch axis (the per-sample states, stacked). Subclasses are made frozen, keyword-only
    dataclasses and pytrees automatically (do not decorate them with ``@dataclasses.dataclass``):
    their annotated class attributes are configuration fields. A field annotated ``float`` (or
    ``float | None``) is a pytree leaf, which may be a traced scalar (a ``vmap`` over a damping,
    a ``grad`` with respect to it; its range is then not checked); any other field (``int``,
    ``str``) is static and must be a plain Python value (an array there is an error naming it).
    ``dataclasses.field(metadata={"static": True})`` makes a ``float`` field static. The
    constructor runs the validation of every class of the hierarchy, even where a subclass's
    ``__post_init__`` does not call ``super().__post_init__()``.

    Optional hooks (class attributes and methods a subclass may override; the defaults suit a
    solver that returns its last accepted iterate and keeps no per-sample history):

    - ``record(z, fz, state) -> state``: update the state with an evaluated proposal (default:
      unchanged). Called after every proposal, with ``z`` the proposal and ``fz = f(z)``.
    - :meth:`terminate`: the convergence test of a judged iterate (default: the ``stop`` rule).
    - :meth:`for_map`: the solver that solves a given map (default: itself), resolved when
      the solve is traced.
    - :meth:`for_linear_map`: the solver of the linear fixed points of the implicit adjoint and
      tangent solves (default: itself), resolved before :meth:`for_map`.
    - :attr:`rate_estimate`: how ``stop="error"`` estimates the contraction rate q.
    - :meth:`error_bound_factor`: the factor c(q) of the error bound of the returned value.
    - :meth:`plain_step`: whether the next proposal is the plain step f(z) for the whole batch,
      which lets ``stop="error"`` read the step's secant quotient from the residuals (default:
      None, unknown).
    - :attr:`steps_past_convergence`: whether the returned value of a converged sample is one
      more proposal from the iterate that met ``tol``.
    - :attr:`freeze_state`: whether a sample's state stops changing when the sample stops.
    - :attr:`couples_samples`: True for a solver whose methods must see the whole ``(B, D)``
      batch (a step that couples samples on purpose); False (default): one sample.
    - :attr:`init_is_first_record`: True when ``init(z, fz)`` is ``record`` into the zeroed state,
      which lets the loop evaluate f(z0) inside itself (f once in the compiled program).
    - :attr:`stays_at_fixed_points`: True when ``propose(z, z, zeros)`` returns ``z`` (a smaller
      first iteration in that loop).
    - ``__post_init__``: validate the subclass's own fields (call ``super().__post_init__()``).

    The settings below are the dataclass fields, so the constructor's keyword arguments (a
    subclass adds its own); the hooks above are class attributes, not settings.

    Attributes:
        tol: tolerance of the stopping rule (> 0); None: the default of the iterate's dtype
            (:func:`deqlab.precision.default_tol`).
        max_steps: iteration limit (>= 1).
        divergence_factor: a sample whose absolute residual grows by more than this (> 1) over
            the best one seen is reported ``Result.DIVERGED``.
        stop: ``"residual"`` (relative residual <= tol) or ``"error"`` (estimated error of the
            returned value <= tol), see :mod:`deqlab.solvers`.
        safety: factor (>= 1) on the error estimate of ``stop="error"``.
        check_every: judge convergence every this many steps (>= 1), or ``"auto"``: at the step
            where the slowest sample is predicted to meet ``tol`` (:mod:`deqlab.solvers`).

    Raises:
        ValueError: a setting outside its range (the message names it and the valid range), or a
            hook attribute with an invalid value.
        TypeError: a subclass that does not define ``init`` or ``propose`` is instantiated (the
            message names the class and the missing methods).

    Example:
        A damped fixed-point iteration (003 Eq. 5 with a step of one half) in a few lines:

        >>> import jax.numpy as jnp, deqlab
        >>> class Damped(deqlab.Solver):
        ...     def init(self, z, fz):
        ...         return ()
        ...     def propose(self, z, fz, state):
        ...         return 0.5 * z + 0.5 * fz, state
        >>> f = lambda z, x: 0.5 * jnp.tanh(z) + x
        >>> sol = deqlab.solve(f, jnp.zeros((2, 3)), jnp.ones((2, 3)),
        ...                    solver=Damped(tol=1e-5, max_steps=500), batch_axis=0)
        >>> sol.converged.tolist()   # per-sample codes and step counts, as for Picard
        [True, True]
        >>> sol.stats.steps.tolist()
        [20, 20]
        >>> bool(jnp.allclose(sol.value, f(sol.value, 1.0), atol=1e-4))
        True

        A subclass with settings declares them as annotated class attributes, validated in
        ``__post_init__``:

        >>> class Relaxed(deqlab.Solver):
        ...     beta: float = 0.5
        ...     def __post_init__(self):
        ...         super().__post_init__()
        ...         deqlab.checks.unit_interval(self.beta, "beta", "Relaxed", allow_traced=True)
        ...     def init(self, z, fz):
        ...         return ()
        ...     def propose(self, z, fz, state):
        ...         return z + self.beta * (fz - z), state
        >>> Relaxed(beta=0.8, tol=1e-4).beta
        0.8
        >>> try:
        ...     Relaxed(beta=2.0)
        ... except ValueError:
        ...     print("beta outside (0, 1]")
        beta outside (0, 1]
    """

    tol: float | None = None
    max_steps: int = 100
    divergence_factor: float = 1e4
    stop: str = "residual"
    safety: float = 1.5
    check_every: int | str = 1

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
    #: estimate at each sample's own equilibrium, which :class:`deqlab.backward.SHINE` reuses.
    #: False (default): a stopped sample's state may go on changing (it no longer matters, and the
    #: loop skips a per-sample select). Unrolled solves always freeze it.
    freeze_state: ClassVar[bool] = False

    #: False (default): ``init``, ``propose`` and ``record`` see one sample, a ``(D,)`` row and
    #: that sample's state, and the loop batches them with ``jax.vmap``. True: they see the whole
    #: batch, ``(B, D)`` rows and a state whose per-sample leaves have a leading axis B, for a
    #: solver that couples samples on purpose (a step size shared by the batch, say); the loop
    #: still judges each sample on its own. Such a solver's 0-d state leaves are shared by the
    #: batch and never frozen (:attr:`freeze_state` and unrolled solves freeze the per-sample
    #: leaves only), so they keep counting while any sample iterates.
    couples_samples: ClassVar[bool] = False

    #: False (default): ``init(z, fz)`` starts the state. True: ``init(z, fz)`` equals
    #: ``record(z, fz, zeros)``, ``zeros`` being ``init``'s state with every leaf zeroed (an
    #: Anderson history: the first pair written into an empty one). The shared loop then
    #: evaluates f(z0) in its first iteration instead of before the loop, so f appears once in
    #: the compiled program, not twice (a stateless solver, such as :class:`Picard`, always
    #: qualifies). Checked by ``tests/library/test_solvers.py`` for deqlab's solvers.
    init_is_first_record: ClassVar[bool] = False

    #: False (default). True: ``propose(z, z, zeros)`` returns ``z`` exactly, ``zeros`` being
    #: ``init``'s state with every leaf zeroed (``()`` for a stateless solver): a point that f
    #: leaves in place stays in place, as it does for every fixed-point method whose step is a
    #: multiple of the residual f(z) - z. The loop that evaluates f(z0) in its first iteration
    #: (above) then evaluates f at that proposal directly, instead of selecting z0 over it: a
    #: smaller program (and, for :class:`Picard`, whose converged value is f(z), one iterate
    #: fewer in the loop's carry). Checked by ``tests/library/test_solvers.py`` for deqlab's
    #: solvers.
    stays_at_fixed_points: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        where = f"solvers.{cls.__name__}"
        if cls.rate_estimate not in RATE_ESTIMATES:
            raise checks.fail("rate_estimate", f"one of {list(RATE_ESTIMATES)}", cls.rate_estimate, where)
        for flag in ("steps_past_convergence", "freeze_state", "couples_samples", "init_is_first_record",
                     "stays_at_fixed_points"):
            if not isinstance(getattr(cls, flag), bool):
                raise checks.fail(flag, "True or False", getattr(cls, flag), where)
        _configuration_class(cls)

    def __new__(cls, *args, **kwargs):
        error = checks.missing_methods(cls, "deqlab.Solver", {
            "init": "init(self, z, fz) -> state", "propose": "propose(self, z, fz, state) -> (z_next, state)"})
        if error is not None:
            raise error
        return super().__new__(cls)

    def __post_init__(self):
        """A subclass's own validation goes here (the shared settings are checked by the
        constructor whether or not it calls ``super().__post_init__()``)."""

    def _check_settings(self):
        """Validate the shared settings (run by the constructor of every subclass, and by
        :meth:`replace`). Real-number settings may be traced scalars: their range is then not
        checked (it cannot be read inside ``jit``)."""
        where = f"solvers.{type(self).__name__}"
        if self.tol is not None:
            checks.positive_number(self.tol, "tol", where, allow_traced=True)
        checks.positive_int(self.max_steps, "max_steps", where)
        checks.number(self.divergence_factor, "divergence_factor", where, lower=1.0, lower_open=True,
                      allow_traced=True)
        if self.stop not in STOPPING_RULES:
            raise checks.fail("stop", f"one of {list(STOPPING_RULES)}", self.stop, where)
        checks.number(self.safety, "safety", where, lower=1.0, allow_traced=True)
        check_every_setting(self.check_every, "check_every", where)

    def replace(self, **changes: Any) -> Solver:
        """A copy of this solver with some settings changed, validated like the constructor.

        The solver object is the one place where a solve's settings live (``tol``,
        ``max_steps``, ``stop``, ...): to solve with other settings, pass
        ``solver.replace(tol=...)`` rather than overriding them in the call.

        Args:
            **changes: new values of this solver's settings (its dataclass fields).

        Returns:
            A new solver of the same class; ``self`` is unchanged (solvers are frozen).

        Raises:
            TypeError: a name that is not a setting of this solver (the message lists them).
            ValueError: a value outside its range, as the constructor raises it.

        Example:
            >>> import deqlab
            >>> strict = deqlab.Anderson(m=5).replace(tol=1e-8, max_steps=500)
            >>> strict.m, strict.tol, strict.max_steps
            (5, 1e-08, 500)
        """
        return _replace_settings(self, changes)

    def resolved_tol(self, dtype) -> float:
        """The tolerance of a solve in ``dtype``: ``tol``, or the dtype's default.

        Args:
            dtype: the dtype of the iterate (:func:`deqlab.precision.default_tol` gives the
                default for it).

        Returns:
            ``tol`` as a float where it is set, else the default of ``dtype``.

        Example:
            >>> import jax.numpy as jnp, deqlab
            >>> deqlab.Anderson().resolved_tol(jnp.float32), deqlab.Anderson(tol=1e-3).resolved_tol(jnp.float32)
            (1e-05, 0.001)
        """
        if self.tol is None:
            return precision_module.default_tol(dtype)
        return self.tol if checks.is_traced(self.tol) else float(self.tol)

    @abc.abstractmethod
    def init(self, z: jax.Array, fz: jax.Array) -> Any:
        """The solver's state at the first iterate (required in a subclass).

        Args:
            z: one sample's first iterate, shape ``(D,)`` (``z0`` flattened; ``(B, D)`` for a
                solver with :attr:`couples_samples`).
            fz: ``f(z)``, same shape (where it is not finite, ``fz = z``).

        Returns:
            A pytree of arrays (``()`` when the solver keeps nothing). Its structure and shapes
            must not depend on the values (it is a ``lax.while_loop`` carry).
        """
        raise NotImplementedError

    @abc.abstractmethod
    def propose(self, z: jax.Array, fz: jax.Array, state: Any) -> tuple[jax.Array, Any]:
        """The next iterate (required in a subclass).

        Args:
            z: one sample's current accepted iterate, shape ``(D,)`` (``(B, D)`` for a solver
                with :attr:`couples_samples`).
            fz: ``f(z)``, same shape.
            state: the sample's state (from :meth:`init` or :meth:`record`).

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
            z: the proposal :meth:`propose` returned, shape ``(D,)`` (one sample).
            fz: ``f(z)`` (possibly non-finite for samples the loop then rejects).
            state: the state :meth:`propose` returned.

        Returns:
            The new state, same structure as ``state``.
        """
        return state

    def for_map(self, func: Any, z: jax.Array) -> Solver:
        """The solver that solves this map (optional hook; default: ``self``).

        Called once per traced solve, before anything else, with the map on the flattened batch:
        a solver whose settings or method depend on what f costs resolves them here, statically
        (:class:`Adaptive` returns :class:`Broyden` for an expensive map). The returned solver
        runs the solve, and its state is the one returned.

        Args:
            func: the map on flattened rows, ``func(z) -> f(z)``, shape ``(B, D)`` to
                ``(B, D)``; trace it (``jax.make_jaxpr``, ``jax.eval_shape``), do not rely on
                running it.
            z: the flattened initial iterates, shape ``(B, D)``.

        Returns:
            A :class:`Solver` (``self`` unless the solver resolves itself).
        """
        return self

    def for_linear_map(self, func: Any, z: jax.Array) -> Solver:
        """The solver that solves a linear fixed point u = b + A u (optional hook; default:
        ``self``).

        Called by the implicit backward pass and by :func:`deqlab.backward.adjoint_solve`, whose
        adjoint solve u = g + J^T u (003 Eq. 11) and tangent solve v = b + J v are linear in the
        unknown, before the solve; the solve then calls :meth:`for_map` on the solver returned,
        as for any solve. A solver that chooses its method from the map's behaviour
        (:class:`Adaptive`) can skip what it would measure: on a linear map Anderson acceleration
        is a Krylov method (Walker & Ni 2011). When it is called, ``tol`` is resolved (the
        precision of the products around the solve was chosen for it): the solver returned must
        keep this solver's ``tol`` and ``max_steps``.

        Args:
            func: the affine map on flattened rows, ``func(u) -> b + A u``, shape ``(B, D)`` to
                ``(B, D)``; trace it, do not rely on running it.
            z: the flattened starting point of the solve, shape ``(B, D)``.

        Returns:
            A :class:`Solver` (not a linear solver such as GMRES).

        Example:
            >>> import jax.numpy as jnp
            >>> from deqlab.solvers import Picard
            >>> solver = Picard(tol=1e-6)
            >>> solver.for_linear_map(lambda u: 0.5 * u + 1.0, jnp.zeros((2, 3))) is solver
            True
        """
        return self

    def error_bound_factor(self, q: jax.Array) -> jax.Array:
        """The factor c(q) of Banach's a-posteriori bound used by ``stop="error"`` (optional hook).

        The returned value of a sample is within ``c(q) ||f(z) - z||`` of z* (max-abs norms, z the
        last accepted iterate) when f contracts at rate q. The default, ``1 / (1 - q)``, is the
        bound for returning z itself; a solver with :attr:`steps_past_convergence` bounds its
        stepped value instead (Picard: ``damping q / (1 - q)``).

        Args:
            q: rate estimates in [0, 0.999), one per sample (an array).

        Returns:
            c(q), elementwise, the shape of ``q``.
        """
        return 1.0 / (1.0 - q)

    def plain_step(self, state: Any) -> jax.Array | None:
        """Whether the next proposal is the plain step ``z_next = f(z)`` for every sample
        (optional hook; the default, None, says nothing).

        With ``stop="error"`` and the ``"secant"`` :attr:`rate_estimate`, the loop measures the
        secant quotient ``||f(z') - f(z)|| / ||z' - z||`` of every step: two more norms over the
        batch. After a plain step (z' = f(z)) it equals the ratio of the two absolute residuals,
        ``||f(z') - z'|| / ||f(z) - z||``, which the loop has already computed, so where this
        method returns a traced True the loop takes that ratio instead (one ``lax.cond`` for the
        batch: the same value without the two passes; under an outer ``jax.vmap`` that batches
        the flag, both are computed and selected). :class:`Adaptive` uses it in its plain phases,
        where the norms cost about a third of a plain step on ``benchmarks/step_cost.py``'s tanh
        problem (its row "deqlab default, plain phase"). It is consulted only where it can serve:
        ``stop="error"`` with the ``"secant"`` rate estimate, at steps judged right after the
        previous one (not after a run of unjudged steps, ``check_every`` > 1 or ``"auto"``).

        Args:
            state: the solver's state from which the step is proposed, as the loop holds it (for
                a solver that does not couple samples, every leaf has a leading batch axis).

        Returns:
            None, or a boolean scalar (a traced one, or a Python or NumPy bool), True only when
            ``propose`` returns exactly ``f(z)`` for every sample of the batch.

        Raises:
            TypeError: raised by the solve when the method returns anything else (per-sample
                flags, say); the message names the method.

        Example:
            Anderson cannot say (its first step is plain only for an empty history, per sample);
            Picard's ``stop="error"`` reads residual ratios and never asks:

            >>> from deqlab.solvers import Anderson
            >>> Anderson().plain_step(()) is None
            True
        """
        return None

    def terminate(self, tol: Any, residual: jax.Array, error: jax.Array) -> jax.Array:
        """Whether one sample's judged iterate has converged: the loop's convergence test
        (optional hook; the default is the ``stop`` rule of :mod:`deqlab.solvers`).

        Called at the start (for ``z0``) and at every judged step, per sample under ``jax.vmap``,
        for every sample of the batch: the loop uses the answer only for samples still iterating
        whose iterate is finite (a non-finite one arrives with the largest float as its residual).
        A sample that terminates stops with ``Result.SUCCESS`` and returns that iterate (one more
        proposal from it with :attr:`steps_past_convergence`). The loop still applies the
        divergence, non-finite and step-limit checks. ``check_every="auto"`` predicts its next
        judged step from the ``stop`` rule's measure, not from this method: a solver overriding
        it may be judged later than it could have stopped (its steps are counted).

        Args:
            tol: the solve's tolerance (a Python float or a traced scalar).
            residual: the iterate's relative residual ``||f(z) - z|| / (||f(z)|| + eps sqrt(D))``,
                a scalar in at least float32.
            error: with ``stop="error"``, the estimated error of the value the sample would
                return (:meth:`error_bound_factor`), ``inf`` while no reliable rate estimate
                exists; always ``inf`` with ``stop="residual"``.

        Returns:
            A boolean scalar, computed with ``jnp`` operations (no Python ``if`` on the
            arguments: they are traced).

        Raises:
            TypeError: raised by the solve when the method returns anything but one boolean per
                sample, or branches in Python on its arguments (the message names the method).

        Example:
            A solver that stops on the residual alone whatever ``stop`` says:

            >>> import jax.numpy as jnp, deqlab
            >>> class ResidualPicard(deqlab.Picard):
            ...     def terminate(self, tol, residual, error):
            ...         return residual <= tol
            >>> sol = deqlab.solve(lambda z, x: 0.5 * jnp.tanh(z) + x, jnp.zeros(3), jnp.ones(3),
            ...                    solver=ResidualPicard(tol=1e-4, stop="error"))
            >>> bool(sol.converged), bool(sol.stats.residual <= 1e-4)
            (True, True)
        """
        if self.stop == "error":
            return jnp.where(jnp.isfinite(error), error <= tol, residual <= tol)
        return residual <= tol




def _replace_settings(config: Any, changes: dict) -> Any:
    """``dataclasses.replace(config, **changes)`` with a TypeError naming an unknown setting and the
    valid ones (the constructor's validation runs on the copy)."""
    fields = [field.name for field in dataclasses.fields(config)]
    unknown = sorted(set(changes) - set(fields))
    if unknown:
        raise TypeError(f"{type(config).__name__}.replace: {', '.join(f'`{name}`' for name in unknown)} "
                        f"{'is not a setting' if len(unknown) == 1 else 'are not settings'} of "
                        f"{type(config).__name__}; its settings are {', '.join(fields)}.")
    return dataclasses.replace(config, **changes) if changes else config


def check_every_setting(value, name: str, where: str) -> None:
    """Validate a ``check_every``-like setting: ``"auto"`` or an integer >= 1.

    Args:
        value: the setting.
        name: its name, for the message.
        where: the class the user constructed, for the message.

    Raises:
        ValueError: anything else, naming ``name`` and the valid values.

    Example:
        >>> from deqlab.solvers.base import check_every_setting
        >>> check_every_setting("auto", "check_every", "solvers.Picard")
        >>> try:
        ...     check_every_setting("often", "check_every", "solvers.Picard")
        ... except ValueError as err:
        ...     print("rejected")
        rejected
    """
    if isinstance(value, str) and value == "auto":
        return
    if isinstance(value, str):
        raise checks.fail(name, "'auto' or an integer >= 1", value, where)
    checks.positive_int(value, name, where)


def _is_static_setting(field: dataclasses.Field) -> bool:
    """A setting is static (pytree metadata, part of a compiled program's identity) unless it is a
    real number that sets no shape: annotated ``float`` (``float | None`` too). Integers (history
    sizes, step limits) and strings (rules) set shapes or the program's structure. An explicit
    ``dataclasses.field(metadata={"static": ...})`` decides otherwise."""
    if "static" in field.metadata:
        return bool(field.metadata["static"])
    annotation = field.type
    if not isinstance(annotation, str):  # a class (float) or an evaluated typing form (Optional[float])
        annotation = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    words = set(re.findall(r"\w+", annotation))
    return not ("float" in words and not words & {"int", "str", "bool", "Any"})


def _configuration_class(cls):
    """Make ``cls`` a frozen keyword-only dataclass and a pytree: its real-number settings
    (``tol``, ``damping``, ...) are leaves, so they can be traced (swept with ``vmap``,
    differentiated, changed without compiling again); the others are static metadata. Unflattening
    bypasses the constructor (JAX rebuilds pytrees with placeholders and tracers). The constructor
    checks that no static setting holds an array, and runs every class's validation even where a
    subclass's ``__post_init__`` forgets ``super().__post_init__()``."""
    dataclasses.dataclass(frozen=True, kw_only=True)(cls)
    # The frozen __setattr__ / __delattr__ the decorator writes into each class would make a user's
    # own @dataclasses.dataclass on a subclass fail with "Cannot overwrite attribute __setattr__";
    # every configuration class inherits its family root's (which refuses every assignment)
    # instead. Such a decorator then keeps deqlab's constructor (it never overwrites an __init__
    # the class defines), so the settings are still validated.
    inherited = any(base.__dict__.get("__setattr__") is _frozen_setattr for base in cls.__mro__[1:])
    for name, frozen in (("__setattr__", _frozen_setattr), ("__delattr__", _frozen_delattr)):
        if not inherited:
            type.__setattr__(cls, name, frozen)
        elif name in cls.__dict__:
            type.__delattr__(cls, name)
    fields = dataclasses.fields(cls)
    static = tuple(field.name for field in fields if _is_static_setting(field))
    leaves = tuple(field.name for field in fields if field.name not in static)
    cls._static_settings = static

    def flatten_with_keys(config):
        children = [(jax.tree_util.GetAttrKey(name), getattr(config, name)) for name in leaves]
        return children, tuple(getattr(config, name) for name in static)

    def unflatten(meta, children):
        config = object.__new__(cls)
        for name, value in zip(static, meta):
            object.__setattr__(config, name, value)
        for name, value in zip(leaves, children):
            object.__setattr__(config, name, value)
        return config

    def flatten(config):  # the fast path (every eager call flattens its solver): no key objects
        return [getattr(config, name) for name in leaves], tuple(getattr(config, name) for name in static)

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
    constructor = cls.__init__

    def __init__(self, *args, **kwargs):
        constructor(self, *args, **kwargs)
        for name in leaves:  # a NumPy scalar is a number, not an array to trace (it keys programs
            value = getattr(self, name)  # by value and chooses a precision, as a Python float does)
            if isinstance(value, np.generic):
                object.__setattr__(self, name, value.item())
        _check_static_settings(self)
        for klass in type(self).__mro__:  # every level's checks, whatever the subclass calls
            check = klass.__dict__.get("_check_settings")
            if check is not None:
                check(self)

    __init__.__doc__ = constructor.__doc__
    __init__.__signature__ = inspect.signature(constructor)
    cls.__init__ = __init__
    return cls


def _frozen_setattr(self, name, value):
    raise dataclasses.FrozenInstanceError(f"{type(self).__name__} is frozen: cannot assign to {name!r}; make a "
                                          f"changed copy with .replace({name}=...)")


def _frozen_delattr(self, name):
    raise dataclasses.FrozenInstanceError(f"{type(self).__name__} is frozen: cannot delete {name!r}")


def _check_static_settings(config) -> None:
    """An array in a static setting would be hashed by identity and compiled as a constant: an
    error naming the setting (real-number settings are leaves and may hold arrays)."""
    for name in type(config)._static_settings:
        value = getattr(config, name)
        if isinstance(value, (jax.Array, np.ndarray)) or isinstance(value, jax.core.Tracer):
            raise ValueError(
                f"{type(config).__name__}: `{name}` sets the shape or structure of the compiled "
                f"program and must be a plain Python value, got an array ({type(value).__name__}). "
                f"Traceable settings are the real-number ones: "
                f"{', '.join(f.name for f in dataclasses.fields(config) if f.name not in type(config)._static_settings) or 'none'}."
            )


_configuration_class(Solver)
