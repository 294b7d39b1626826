"""What every backward mode shares: the :class:`Problem` it differentiates, the :class:`Backward`
base class, and how failures of the solves behind a gradient are reported."""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import checks
from deqlab import precision as precision_module
from deqlab.failures import SolverWarning, signal
from deqlab.solvers import Solution, Solver, solve
from deqlab.solvers.base import _configuration_class, _frozen_delattr, _frozen_setattr

__all__ = ["BackwardWarning", "Problem", "Backward", "report", "zero_cotangent"]


class BackwardWarning(SolverWarning):
    """A solve behind a gradient (forward or adjoint) did not converge for some samples.

    Issued by :func:`fixed_point` and :func:`adjoint_solve` with ``on_failure="warn"``; a
    subclass of :class:`~deqlab.failures.SolverWarning`, so a filter on that catches both.

    Example:
        >>> import warnings, deqlab
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("error", deqlab.backward.BackwardWarning)   # make it an error
        >>> issubclass(deqlab.backward.BackwardWarning, deqlab.solvers.SolverWarning)
        True
    """



_SAME = object()  # Problem.forward: keep the problem's own init_state


@dataclasses.dataclass(frozen=True)
class Problem:
    """What a backward mode differentiates: the fixed point of ``f(z, *args)`` from ``z0``.

    Built by :func:`fixed_point` and handed to :meth:`Backward.solve`.

    Attributes:
        f: the map, returning z only (``has_aux`` is handled by :func:`fixed_point`); closes over
            nothing traced.
        z0, args: the initial guess and the arguments (a tuple of pytrees) to differentiate.
        solver: the forward :class:`deqlab.solvers.Solver`, its ``tol`` resolved.
        batch_axis, precision, init_state: as in :func:`deqlab.solvers.solve`.
        tol: the forward tolerance; dtype: the dtype of the solve.
        on_failure: the caller's policy (:mod:`deqlab.failures`); :func:`fixed_point` applies it
            to the forward result, a mode applies it to solves of its own (an adjoint solve).
        budget: the forward solve's :class:`deqlab.solvers.Budget` (traced iteration limit and
            tolerance), or None: the solver's settings.

    Example:
        A mode's ``solve`` reads it; this one backpropagates through the forward iterations (as
        :class:`Unrolled` does), and its gradient matches the implicit one of 003 Eq. 8:

        >>> import jax, jax.numpy as jnp, deqlab
        >>> class Reference(deqlab.backward.Backward):
        ...     def solve(self, problem):
        ...         return problem.forward(unrolled=True)   # the forward solve, differentiable
        >>> f = lambda z, w: jnp.tanh(w * z + 1.0)
        >>> solver = deqlab.Picard(tol=1e-5, max_steps=60)
        >>> def loss(w, mode):
        ...     return deqlab.fixed_point(f, jnp.zeros(2), w, solver=solver, backward=mode).value.sum()
        >>> reference = jax.grad(lambda w: loss(w, Reference()))(0.5)
        >>> implicit = jax.grad(lambda w: loss(w, "implicit"))(0.5)
        >>> bool(jnp.allclose(reference, implicit, rtol=1e-3))
        True
    """

    f: Callable[..., Any]
    z0: Any
    args: tuple
    solver: Solver
    batch_axis: int | None
    precision: Any
    init_state: Any
    tol: float
    dtype: Any
    on_failure: str = "warn"
    budget: Any = None

    @property
    def level(self):
        """The matmul precision of f's evaluations (``precision``, or what ``tol`` needs)."""
        return _matmul_level(self.precision, self.tol, self.dtype)

    def forward(self, z0: Any = None, args: tuple | None = None, *, init_state: Any = _SAME,
                budget: Any = _SAME, solver: Any = _SAME, **options) -> Solution:
        """:func:`deqlab.solvers.solve` of this problem, with the problem's solver and options.

        A mode that wraps the solve in ``jax.custom_vjp`` or ``jax.custom_jvp`` passes ``init_state``,
        ``budget`` and ``solver`` in as primal inputs (never through a closure: they may be traced;
        a solver's real-number settings are pytree leaves).

        Args:
            z0, args: replace the problem's where given.
            init_state: replaces the problem's where given (None: a cold start).
            budget: replaces the problem's where given (None: the solver's settings).
            solver: replaces the problem's solver where given.
            **options: further arguments of :func:`deqlab.solvers.solve`, e.g. ``unrolled=True``
                (``on_failure`` defaults to ``"ignore"``: :func:`fixed_point` reports the
                forward solve).

        Returns:
            The forward :class:`~deqlab.solvers.Solution`.
        """
        z0 = self.z0 if z0 is None else z0
        args = self.args if args is None else args
        init_state = self.init_state if init_state is _SAME else init_state
        budget = self.budget if budget is _SAME else budget
        solver = self.solver if solver is _SAME else solver
        options.setdefault("on_failure", "ignore")  # fixed_point reports the forward solve
        return solve(self.f, z0, *args, solver=solver, batch_axis=self.batch_axis,
                     precision=self.precision, init_state=init_state, budget=budget, **options)

    def jacobian_at(self, z_star: Any, level: Any = None) -> Callable[[Any], Any]:
        """The linear map ``v -> J_f(z*) v`` (Jacobian-vector products of f in z at ``args``).

        Each call is one ``jax.jvp`` of f (nothing of f is stored between calls).

        Args:
            z_star: the point, a pytree shaped like ``z0`` (usually ``Solution.value``).
            level: the matmul precision of the products (None: :attr:`level`).

        Returns:
            A function of a pytree ``v`` shaped like ``z_star``, returning ``J_f(z*) v``.

        Example:
            >>> import jax.numpy as jnp, deqlab
            >>> from deqlab.backward import Problem
            >>> problem = Problem(f=lambda z, w: w * z, z0=jnp.zeros(2), args=(3.0,),
            ...                   solver=deqlab.Picard(), batch_axis=None, precision=None,
            ...                   init_state=None, tol=1e-5, dtype=jnp.float32)
            >>> problem.jacobian_at(jnp.ones(2))(jnp.array([1.0, 2.0])).tolist()
            [3.0, 6.0]
        """
        f, args = self.f, self.args
        level = self.level if level is None else level

        def apply(v):
            with precision_module.matmul_precision(level):
                return jax.jvp(lambda z: f(z, *args), (z_star,), (v,))[1]

        return apply

    def jacobian_transpose_at(self, z_star: Any, level: Any = None) -> Callable[[Any], Any]:
        """The linear map ``u -> J_f(z*)^T u`` (vector-Jacobian products of f in z at ``args``).

        f is linearised once (``jax.vjp``) and each call is one transposed product.

        Args:
            z_star: the point, a pytree shaped like ``z0`` (usually ``Solution.value``).
            level: the matmul precision of the products (None: :attr:`level`).

        Returns:
            A function of a pytree ``u`` shaped like ``z_star``, returning ``J_f(z*)^T u``.

        Example:
            >>> import jax.numpy as jnp, deqlab
            >>> from deqlab.backward import Problem
            >>> problem = Problem(f=lambda z, m: m @ z, z0=jnp.zeros(2), args=(jnp.array([[0.0, 1.0], [0.0, 0.0]]),),
            ...                   solver=deqlab.Picard(), batch_axis=None, precision=None,
            ...                   init_state=None, tol=1e-5, dtype=jnp.float32)
            >>> problem.jacobian_transpose_at(jnp.ones(2))(jnp.array([1.0, 0.0])).tolist()
            [0.0, 1.0]
        """
        f, args = self.f, self.args
        level = self.level if level is None else level
        with precision_module.matmul_precision(level):
            _, vjp = jax.vjp(lambda z: f(z, *args), z_star)

        def apply(u):
            with precision_module.matmul_precision(level):
                return vjp(u)[0]

        return apply



class Backward(abc.ABC):
    """Base class of the backward modes of :func:`fixed_point` (how its gradient is computed).

    A subclass defines ``solve(problem) -> Solution``: the forward solve of ``problem`` (a
    :class:`Problem`) such that differentiating the returned ``Solution.value`` with respect to
    ``problem.args`` gives this mode's gradient (through ``jax.custom_vjp``, unrolling, or a
    differentiable step from the detached fixed point). :func:`fixed_point` then applies its
    ``on_failure`` policy to the forward result and adds ``aux``; a mode with solves of its own
    (an adjoint solve) applies ``problem.on_failure`` to them. Subclasses are made frozen,
    keyword-only dataclasses and pytrees whose ``float`` fields are leaves and other fields
    static, as solvers are (do not decorate them), so a backward object can be an argument of a
    ``jax.jit``-ed function.

    A mode that approximates the implicit derivative's linear solves subclasses
    :class:`ImplicitRule` instead and defines only ``adjoint`` (and ``tangent`` for forward mode
    where the default transpose does not apply): the custom-derivative rule is shared. A mode with
    a rule of its own (``jax.custom_vjp`` or ``jax.custom_jvp``) takes every traced value its rule
    uses as an input of the rule, never through a closure: ``problem.z0`` and ``problem.args``,
    and ``problem.init_state``, ``problem.budget`` and ``problem.solver`` where they matter (JAX
    otherwise fails with "No constant handler" or an UnexpectedTracerError), and returns
    :func:`zero_cotangent` for the inputs the gradient does not depend on.
    :func:`fixed_point` checks what ``solve`` returns: a TypeError names the method when it is not a
    ``Solution``, a ValueError when its value is not shaped like ``z0``.

    Attributes:
        name: the mode's short name (a class attribute, not a setting; the built-in modes are
            in :data:`BACKWARDS` under it). A subclass's settings are its annotated class
            attributes, keyword arguments of its constructor (validate them in a
            ``_check_settings(self)`` method: the constructor runs the one of every class of the
            hierarchy, whether or not a subclass calls ``super()``).

    Raises:
        ValueError: a setting outside its range, naming it and the valid range.
        TypeError: a subclass without ``solve`` is instantiated (the message names it), or an
            ``on_failure`` is given (it is an argument of :func:`fixed_point` and
            :class:`deqlab.nn.DEQ` since deqlab 0.6).

    Example:
        The Jacobian-free gradient written as a mode of one's own; it agrees with the built-in
        :class:`JacobianFree`:

        >>> import jax, jax.numpy as jnp, deqlab
        >>> class OneStep(deqlab.backward.Backward):
        ...     def solve(self, problem):
        ...         sol = problem.forward(jax.lax.stop_gradient(problem.z0),
        ...                               jax.lax.stop_gradient(problem.args))
        ...         z = jax.lax.stop_gradient(sol.value)
        ...         return sol._replace(value=problem.f(z, *problem.args))
        >>> f = lambda z, w, x: jnp.tanh(w * z + x)
        >>> def loss(w, mode):
        ...     return deqlab.fixed_point(f, jnp.zeros(3), w, jnp.ones(3), backward=mode).value.sum()
        >>> ours = jax.grad(lambda w: loss(w, OneStep()))(0.5)
        >>> builtin = jax.grad(lambda w: loss(w, deqlab.JacobianFree()))(0.5)
        >>> bool(jnp.allclose(ours, builtin))
        True
    """

    name: ClassVar[str] = "backward"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _configuration_class(cls)

    def __new__(cls, *args, **kwargs):
        base = "deqlab.backward.ImplicitRule" if "adjoint" in getattr(cls, "__abstractmethods__", ()) \
            else "deqlab.backward.Backward"
        error = checks.missing_methods(cls, base, {
            "solve": "solve(self, problem) -> Solution",
            "adjoint": "adjoint(self, problem, solution, g) -> u"})
        if error is not None:
            raise error
        if "on_failure" in kwargs:
            raise TypeError(
                f"backward.{cls.__name__}: `on_failure` is no longer a setting of the backward mode; "
                "pass it to the call: fixed_point(..., on_failure=...) or nn.DEQ(..., on_failure=...) "
                "(one policy for the forward and the adjoint solve, deqlab 0.6)."
            )
        return super().__new__(cls)

    def __post_init__(self):
        pass

    @abc.abstractmethod
    def solve(self, problem: Problem) -> Solution:
        """The forward solve of ``problem``, differentiable in this mode's way (required).

        Args:
            problem: the :class:`Problem` built by :func:`fixed_point`.

        Returns:
            The forward :class:`~deqlab.solvers.Solution`, whose ``value`` carries the gradient.
        """
        raise NotImplementedError


dataclasses.dataclass(frozen=True, kw_only=True)(Backward)
# one frozen __setattr__ for the family, inherited (not one per subclass: _configuration_class)
Backward.__setattr__, Backward.__delattr__ = _frozen_setattr, _frozen_delattr



_HINTS = {
    "forward": "their values and gradients are not the equilibrium's. Raise max_steps, loosen tol, or "
               "check that f contracts (Solution.result reports each sample)",
    "tangent": "their derivatives (jvp, jacfwd) are inaccurate. Raise the backward max_steps "
               "(deqlab.backward.Implicit(max_steps=...)), try Implicit(solver='gmres'), or check that "
               "the forward solve converged",
    "adjoint": "their gradients are inaccurate. Raise the backward max_steps "
               "(deqlab.backward.Implicit(max_steps=...)), try Implicit(solver='gmres'), or check that "
               "the forward solve converged",
}


def report(what: str, policy: str, result, residual) -> None:
    """Apply the caller's policy to a solve behind a gradient (:func:`deqlab.failures.signal`).

    A mode with solves of its own (an adjoint solve, as :class:`Implicit`) applies the caller's
    policy to them with ``report("adjoint", problem.on_failure, sol.result,
    sol.stats.best_residual)``; the message names :func:`fixed_point` and says what to try.
    Traced results (inside ``jit`` or a custom derivative rule) report from a host callback
    with ``"raise"`` and ``"callback"``, and not at all with ``"warn"`` (:func:`deqlab.failures.signal`).

    Args:
        what: ``"forward"``, ``"adjoint"`` or ``"tangent"`` (a solve inside :func:`fixed_point`), or
            ``"adjoint-alone"`` (the solve of :func:`adjoint_solve`, named in the message).
        policy: one of :data:`FAILURE_POLICIES`; ``"nan"`` and ``"ignore"`` do nothing here.
        result, residual: ``Solution.result`` and ``Solution.stats.best_residual`` of the solve.

    Raises:
        SolverError: with ``policy="raise"``, when some sample failed.

    Example:
        >>> import numpy as np
        >>> from deqlab.backward.base import report
        >>> from deqlab.failures import Result, SolverError
        >>> result = np.array([Result.SUCCESS, Result.MAX_STEPS_REACHED])
        >>> try:
        ...     report("adjoint", "raise", result, np.array([1e-6, 2e-2]))
        ... except SolverError as error:
        ...     print(error)
        fixed_point: the adjoint solve failed for 1/2 samples: sample 1: max_steps_reached (residual 2.000e-02).
    """
    caller = "adjoint_solve" if what == "adjoint-alone" else "fixed_point"
    what = "adjoint" if what == "adjoint-alone" else what
    signal(caller, what, policy, result, residual, category=BackwardWarning, hint=_HINTS[what])



def zero_cotangent(tree: Any) -> Any:
    """Zero cotangents shaped like ``tree`` (float0 for integer and boolean leaves).

    What the backward pass of a ``jax.custom_vjp`` mode returns for an input the gradient does
    not depend on, such as ``problem.init_state`` (a warm start, whose counters are integers).

    Args:
        tree: a pytree of arrays (or None).

    Returns:
        A pytree of the same structure: zeros of each floating leaf's shape and dtype, and
        ``float0`` zeros for integer and boolean leaves (JAX's cotangent type for them).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from deqlab.backward.base import zero_cotangent
        >>> zeros = zero_cotangent({"z": jnp.ones(3), "count": jnp.ones((), jnp.int32)})
        >>> zeros["z"].tolist(), zeros["count"].dtype == jax.dtypes.float0
        ([0.0, 0.0, 0.0], True)
    """
    def zero(leaf):
        if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
            return jnp.zeros_like(leaf)
        return np.zeros(jnp.shape(leaf), jax.dtypes.float0)

    return jax.tree_util.tree_map(zero, tree)


def _matmul_level(precision, tol, dtype):
    """``precision``, or the matmul precision ``tol`` needs in ``dtype`` (:mod:`deqlab.precision`)."""
    return precision_module.required_precision(tol, dtype) if precision is None else precision

