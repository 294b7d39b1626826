"""The built-in solvers by name, and :func:`get_solver`."""

from __future__ import annotations

from typing import Any

from deqlab.solvers.adaptive import Adaptive
from deqlab.solvers.anderson import Anderson
from deqlab.solvers.base import Solver
from deqlab.solvers.broyden import Broyden
from deqlab.solvers.picard import Picard

__all__ = ["SOLVERS", "get_solver"]

#: The forward solvers by name: ``"adaptive"`` (the default), ``"picard"``, ``"anderson"``, ``"broyden"``.
SOLVERS = {cls.name: cls for cls in (Adaptive, Picard, Anderson, Broyden)}


def get_solver(solver: str | Solver = "adaptive", *, name: str = "solver", **settings: Any) -> Solver:
    """The solver object for a name or an object: the one place where solver settings are applied.

    Args:
        solver: a name of :data:`SOLVERS` (``"picard"``, ``"anderson"``, ``"broyden"``) or a
            solver object (an instance of a :class:`Solver` subclass).
        name: the argument the user wrote, for error messages.
        **settings: settings of the solver (``tol``, ``max_steps``, ``m``, ...): with a name,
            arguments of its constructor; with an object, :meth:`Solver.replace` applies them.
            A setting given as None is left out, so that optional settings can be passed on
            (``get_solver(Anderson(tol=1e-8), tol=None)`` keeps 1e-8).

    Returns:
        A :class:`Solver`; the object itself when it is one and no setting is given.

    Raises:
        ValueError: an unknown name or a value that is not a solver (the message lists the
            names), or a setting outside its range.
        TypeError: a setting the solver does not have.

    Example:
        >>> import deqlab
        >>> from deqlab.solvers import get_solver
        >>> get_solver("broyden", tol=1e-6) == deqlab.Broyden(tol=1e-6)
        True
        >>> get_solver(deqlab.Broyden(m=4), max_steps=50) == deqlab.Broyden(m=4, max_steps=50)
        True
    """
    settings = {k: v for k, v in settings.items() if v is not None}
    if isinstance(solver, Solver):
        return solver.replace(**settings)
    if isinstance(solver, str) and solver in SOLVERS:
        return SOLVERS[solver](**settings)
    raise ValueError(
        f"`{name}` must be one of {sorted(SOLVERS)} or a solver object such as "
        f"deqlab.solvers.Anderson(m=5) (an instance of a deqlab.Solver subclass), got {solver!r}."
    )
