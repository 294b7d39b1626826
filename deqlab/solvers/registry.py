"""The built-in solvers by name, and :func:`get_solver`."""

from __future__ import annotations

import dataclasses

from deqlab.solvers.anderson import Anderson
from deqlab.solvers.base import Solver
from deqlab.solvers.broyden import Broyden
from deqlab.solvers.picard import Picard

__all__ = ["SOLVERS", "get_solver"]

#: The forward solvers by name: ``"picard"``, ``"anderson"``, ``"broyden"``.
SOLVERS = {cls.name: cls for cls in (Picard, Anderson, Broyden)}


def get_solver(solver: str | Solver = "anderson", *, name: str = "solver", **overrides) -> Solver:
    """Return a solver configuration from a name or a configured object.

    ``overrides`` whose value is None are ignored: a configured object keeps its own settings
    unless a value is given (``get_solver(Anderson(tol=1e-8), tol=None)`` keeps 1e-8). ``name`` is
    the argument the user wrote, used in error messages.
    """
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if isinstance(solver, Solver):
        return dataclasses.replace(solver, **overrides) if overrides else solver
    if isinstance(solver, str) and solver in SOLVERS:
        return SOLVERS[solver](**overrides)
    raise ValueError(
        f"`{name}` must be one of {sorted(SOLVERS)} or a solver object such as "
        f"deqlab.solvers.Anderson(m=5) (an instance of a deqlab.Solver subclass), got {solver!r}."
    )

