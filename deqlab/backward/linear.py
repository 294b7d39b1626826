"""Adjoint linear solvers (:class:`LinearSolver`, :class:`GMRES`) and :func:`get_adjoint_solver`."""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, ClassVar

import jax

from deqlab import checks
from deqlab import precision as precision_module
from deqlab.solvers import SOLVERS, Solver, get_solver
from deqlab.solvers.base import _configuration_class, _frozen_delattr, _frozen_setattr, _replace_settings

__all__ = ["LinearSolver", "GMRES", "LINEAR_SOLVERS", "get_adjoint_solver"]


class LinearSolver(abc.ABC):
    """Base class of the adjoint linear solvers: ``(I - J_f(z*)^T) u = g``, matrix-free (003 Eq. 11).

    The adjoint of :func:`adjoint_solve` can be found either as a fixed point (any
    :class:`deqlab.solvers.Solver`) or as the solution of this linear system by a Krylov method, a
    subclass of this class. A subclass defines ``solve(operator, b, *, tol, max_steps)`` and is
    made a frozen keyword-only dataclass and a pytree (``float`` fields leaves), as solvers are.
    Its ``solve`` sees one sample at a time (batched by ``jax.vmap``).

    Attributes:
        tol: relative residual of the linear system to reach per sample (> 0); None: the
            dtype's default (:func:`deqlab.precision.default_tol`). :class:`Implicit`'s own
            ``tol``, where given, takes its place (:meth:`Implicit.adjoint_solver`).
        max_steps: bound on the operator applications (>= 1); likewise.

    Raises:
        ValueError: a setting outside its range, naming it and the valid range.

    Example:
        Richardson iteration ``u <- u + (b - operator(u))``, i.e. the adjoint fixed-point
        iteration ``u <- g + J_f^T u``, as a linear solver of one's own:

        >>> import jax, jax.numpy as jnp, deqlab
        >>> from deqlab.backward import Implicit, LinearSolver
        >>> class Richardson(LinearSolver):
        ...     def solve(self, operator, b, *, tol, max_steps):
        ...         step = lambda _, u: jax.tree_util.tree_map(
        ...             lambda u, b, a: u + b - a, u, b, operator(u))
        ...         return jax.lax.fori_loop(0, max_steps, step, b)
        >>> f = lambda z, w, x: jnp.tanh(w * z + x)
        >>> def loss(w, backward):
        ...     return deqlab.fixed_point(f, jnp.zeros(3), w, jnp.ones(3), backward=backward).value.sum()
        >>> ours = jax.grad(lambda w: loss(w, Implicit(solver=Richardson(max_steps=50))))(0.5)
        >>> default = jax.grad(lambda w: loss(w, Implicit()))(0.5)
        >>> bool(jnp.allclose(ours, default, rtol=1e-4))
        True
    """

    tol: float | None = None
    max_steps: int = 100
    name: ClassVar[str] = "linear"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _configuration_class(cls)

    def __new__(cls, *args, **kwargs):
        error = checks.missing_methods(cls, "deqlab.backward.LinearSolver", {
            "solve": "solve(self, operator, b, *, tol, max_steps) -> u"})
        if error is not None:
            raise error
        return super().__new__(cls)

    def __post_init__(self):
        where = f"backward.{type(self).__name__}"
        if self.tol is not None:
            checks.positive_number(self.tol, "tol", where, allow_traced=True)
        checks.positive_int(self.max_steps, "max_steps", where)

    def replace(self, **changes: Any) -> LinearSolver:
        """A copy with some settings changed, validated like the constructor (as
        :meth:`deqlab.solvers.Solver.replace`).

        Args:
            **changes: new values of this solver's settings.

        Returns:
            A new solver of the same class.

        Raises:
            TypeError: a name that is not a setting (the message lists them).
            ValueError: a value outside its range.

        Example:
            >>> from deqlab.backward import GMRES
            >>> GMRES(restart=10).replace(max_steps=300)
            GMRES(tol=None, max_steps=300, restart=10)
        """
        return _replace_settings(self, changes)

    def resolved_tol(self, dtype) -> float:
        """``tol``, or the default of ``dtype``.

        Args:
            dtype: the dtype of the adjoint (:func:`deqlab.precision.default_tol` gives the
                default for it).

        Returns:
            ``tol`` as a float where it is set, else the default of ``dtype``.
        """
        if self.tol is None:
            return precision_module.default_tol(dtype)
        return self.tol if checks.is_traced(self.tol) else float(self.tol)

    @abc.abstractmethod
    def solve(self, operator: Callable[[Any], Any], b: Any, *, tol: float, max_steps: int) -> Any:
        """Solve ``operator(u) = b`` (required in a subclass).

        Called for one sample at a time (batched by ``jax.vmap``; the samples of a batch never
        share inner products or a stopping decision).

        Args:
            operator: the linear map ``u -> u - J_f^T u`` (or ``u - J_f u`` for a tangent) on one
                sample's flattened vector, shape ``(D,)``.
            b: that sample's right-hand side (the cotangent g, flattened), shape ``(D,)``.
            tol: relative residual to aim for (the result is checked per sample afterwards).
            max_steps: bound on the applications of ``operator``.

        Returns:
            ``u``, shaped like ``b``.
        """
        raise NotImplementedError


dataclasses.dataclass(frozen=True, kw_only=True)(LinearSolver)
# one frozen __setattr__ for the family, inherited (not one per subclass: _configuration_class)
LinearSolver.__setattr__, LinearSolver.__delattr__ = _frozen_setattr, _frozen_delattr


class GMRES(LinearSolver):
    """Restarted GMRES (Saad & Schultz 1986; ``jax.scipy.sparse.linalg.gmres``) for the adjoint.

    ``max_steps`` bounds the operator applications: ``ceil(max_steps / restart)`` restart cycles
    of ``min(restart, max_steps)`` products each. ``Implicit(solver="gmres")`` is this with its
    defaults. Each sample is solved on its own (its own Krylov space and stopping, batched by
    ``vmap``), so a sample's gradient does not depend on the other samples of its batch; each
    sample's residual is checked afterwards.

    Attributes:
        restart: Krylov subspace size between restarts (>= 1).
        tol, max_steps: as for :class:`LinearSolver`.

    Raises:
        ValueError: a setting outside its range (the message names it and the valid range).

    Example:
        >>> import jax, jax.numpy as jnp, deqlab
        >>> from deqlab.backward import GMRES, Implicit
        >>> f = lambda z, w, x: jnp.tanh(w * z + x)
        >>> def loss(w, backward):
        ...     return deqlab.fixed_point(f, jnp.zeros(3), w, jnp.ones(3), backward=backward).value.sum()
        >>> krylov = jax.grad(lambda w: loss(w, Implicit(solver=GMRES(restart=30), max_steps=300)))(0.5)
        >>> fixed = jax.grad(lambda w: loss(w, Implicit()))(0.5)   # the adjoint by Anderson
        >>> bool(jnp.allclose(krylov, fixed, rtol=1e-4))
        True
    """

    restart: int = 20
    name = "gmres"

    def __post_init__(self):
        super().__post_init__()
        checks.positive_int(self.restart, "restart", "backward.GMRES")

    def solve(self, operator, b, *, tol, max_steps):
        # jax's ``maxiter`` counts restart cycles of ``restart`` products each: divide, so that
        # ``max_steps`` bounds the operator applications as it does for the other solvers (a
        # float32 adjoint that cannot reach ``tol`` otherwise costs ``restart`` times the budget).
        restart = min(self.restart, max_steps)
        u, _ = jax.scipy.sparse.linalg.gmres(
            operator, b, tol=tol, atol=0.0, restart=restart, maxiter=-(-max_steps // restart),
        )
        return u


#: Adjoint linear solvers by name (each name is a shortcut for the object with its defaults).
#: This table is the one place where the name ``"gmres"`` is understood.
LINEAR_SOLVERS = {cls.name: cls for cls in (GMRES,)}


def get_adjoint_solver(solver: Any = "adaptive", *, name: str = "solver",
                       **settings: Any) -> Solver | LinearSolver:
    """The adjoint solver object for a name or an object (as :func:`deqlab.solvers.get_solver`).

    Args:
        solver: a forward solver name (:data:`deqlab.solvers.SOLVERS`), a linear solver name
            (:data:`LINEAR_SOLVERS`: ``"gmres"``), or a :class:`deqlab.solvers.Solver` or
            :class:`LinearSolver` object.
        name: the argument the user wrote, for error messages.
        **settings: settings (``tol``, ``max_steps``, ...): with a name, arguments of its
            constructor; with an object, its ``replace`` applies them. None values are left out.

    Returns:
        A :class:`deqlab.solvers.Solver` or :class:`LinearSolver`.

    Raises:
        ValueError: an unknown name or object (the message lists the valid ones), or a setting
            outside its range.
        TypeError: a setting the solver does not have.

    Example:
        >>> from deqlab.backward import GMRES, get_adjoint_solver
        >>> get_adjoint_solver("gmres", max_steps=300) == GMRES(max_steps=300)
        True
    """
    settings = {k: v for k, v in settings.items() if v is not None}
    if isinstance(solver, LinearSolver):
        return solver.replace(**settings)
    if isinstance(solver, str) and solver in LINEAR_SOLVERS:
        return LINEAR_SOLVERS[solver](**settings)
    if isinstance(solver, Solver) or (isinstance(solver, str) and solver in SOLVERS):
        return get_solver(solver, name=name, **settings)
    raise ValueError(
        f"`{name}` must be one of {sorted(SOLVERS) + sorted(LINEAR_SOLVERS)}, a deqlab.Solver "
        f"or a deqlab.backward.LinearSolver object such as GMRES(restart=20), got {solver!r}."
    )

