"""Per-call budgets of a solve: an iteration limit and a tolerance as traced values.

A solver object's ``max_steps`` and ``tol`` are static settings: they are part of the cache key of
every ``jax.jit`` that takes the solver, so changing them compiles again. A :class:`Budget` carries
the same two numbers as arrays, traced like any other input: a jitted training or inference step
that takes the budget as an argument compiles once for every value of it (banax's ``step_budget``
and torchdeq's ``eval_factor`` serve the same purpose).

What stays static: the solver's own ``max_steps`` sizes arrays (the residual trace of
:class:`~deqlab.solvers.SolveStats`, ``(max_steps + 1, B)``, and the ``lax.scan`` of an unrolled
solve), so it is the **cap** of a budget; the budget's ``max_steps`` is the effective limit, in
``[1, cap]``: the ``lax.while_loop`` of the solve stops at it, and an unrolled solve (the
:class:`deqlab.backward.Unrolled` backward mode) still runs ``cap`` masked steps, of which those
past the limit change nothing. The matmul precision of the solve is chosen from the solver's
static ``tol`` (:func:`deqlab.precision.required_precision`): a budget asking a tighter tolerance
than that on a TPU or a TF32 GPU needs ``precision="highest"`` as well.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import checks
from deqlab import precision as precision_module
from deqlab.solvers.base import Solver

__all__ = ["Budget", "make_budget"]


class Budget(NamedTuple):
    """The iteration limit and tolerance of one solve, as (traced) arrays.

    Pass it as ``solve(..., budget=...)`` or ``fixed_point(..., budget=...)``; it replaces the
    solver object's ``max_steps`` and ``tol`` for that call without changing the compiled
    computation (module docstring). Build it with :func:`make_budget`, which checks concrete
    values and fills what is not given from the solver.

    Attributes:
        max_steps: int32 scalar, the iteration limit of the call; values outside ``[1,
            solver.max_steps]`` are clipped into it (the solver's ``max_steps`` is the cap).
        tol: floating scalar, the tolerance of the stopping rule (relative residual, or the
            error estimate with ``stop="error"``).

    Example:
        >>> import jax.numpy as jnp, deqlab
        >>> from deqlab.solvers import Budget
        >>> f = lambda z, x: 0.9 * jnp.tanh(z) + x
        >>> solver = deqlab.Anderson(max_steps=50)
        >>> sol = deqlab.solve(f, jnp.zeros(3), jnp.ones(3), solver=solver, on_failure="ignore",
        ...                    budget=Budget(jnp.int32(2), jnp.float32(1e-5)))
        >>> int(sol.stats.steps)
        2
    """

    max_steps: Any
    tol: Any


def make_budget(solver: Solver, dtype: Any, *, max_steps: Any = None, tol: Any = None,
                where: str = "solve") -> Budget:
    """A :class:`Budget` for ``solver`` in ``dtype``, with concrete values checked.

    Args:
        solver: the solver object whose ``max_steps`` is the cap and whose settings fill what is
            not given.
        dtype: the dtype of the solve (the tolerance is held in its working dtype,
            :func:`deqlab.precision.working_dtype`).
        max_steps: the iteration limit: a Python / NumPy integer in ``[1, solver.max_steps]``, or
            an integer scalar array (traced values cannot be checked: they are clipped into the
            range by the solve). None: ``solver.max_steps``.
        tol: the tolerance: a finite number > 0, or a floating scalar array. None: the solver's
            (:meth:`Solver.resolved_tol`).
        where: the function named in error messages.

    Returns:
        The budget, an int32 ``max_steps`` and a ``tol`` of the working dtype.

    Raises:
        ValueError: ``max_steps`` is not an integer in ``[1, solver.max_steps]`` or not an integer
            scalar array, or ``tol`` is not a finite number > 0 or not a floating scalar array
            (the message names the argument and the valid range).

    Example:
        >>> import jax.numpy as jnp, deqlab
        >>> from deqlab.solvers import make_budget
        >>> b = make_budget(deqlab.Anderson(max_steps=40), jnp.float32, max_steps=10)
        >>> int(b.max_steps), float(b.tol)
        (10, 9.999999747378752e-06)
    """
    cap = solver.max_steps
    if max_steps is None:
        steps = jnp.asarray(cap, jnp.int32)
    else:
        scalar_array = hasattr(max_steps, "dtype") and hasattr(max_steps, "shape")
        if scalar_array and (jnp.shape(max_steps) != () or not jnp.issubdtype(max_steps.dtype, jnp.integer)):
            raise checks.fail("max_steps", f"an integer in [1, {cap}] (the solver's max_steps caps a "
                              "call's budget) or an integer scalar array",
                              f"{max_steps.dtype} of shape {tuple(jnp.shape(max_steps))}", where)
        if not checks.is_traced(max_steps):
            value = max_steps.item() if scalar_array else max_steps
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= cap:
                raise checks.fail("max_steps", f"an integer in [1, {cap}] (the solver's max_steps, {cap}, "
                                  "caps a call's budget: it sizes the residual trace; raise it to allow more)",
                                  value, where)
        steps = jnp.asarray(max_steps, jnp.int32)
    work = precision_module.working_dtype(dtype)
    if tol is None:
        tol_value = jnp.asarray(solver.resolved_tol(dtype), work)
    else:
        scalar_array = hasattr(tol, "dtype") and hasattr(tol, "shape")
        if scalar_array and (jnp.shape(tol) != () or not jnp.issubdtype(tol.dtype, jnp.floating)):
            raise checks.fail("tol", "a finite number > 0 or a floating scalar array",
                              f"{tol.dtype} of shape {tuple(jnp.shape(tol))}", where)
        if not checks.is_traced(tol):
            value = checks.positive_number(tol.item() if scalar_array else tol, "tol", where)
            precision_module.check_tol(value, dtype, where)
        tol_value = jnp.asarray(tol, work)
    return Budget(steps, tol_value)


def check_budget(budget: Any, where: str) -> Budget | None:
    """``budget`` must be None or a :class:`Budget` of scalars: an integer ``max_steps`` and a
    ``tol`` > 0. Returns it with a concrete ``max_steps`` clipped into int32's range (the solve
    clips it into ``[1, cap]``; cast first, 2**32 + 3 would wrap around to 3)."""
    if budget is None:
        return None
    if not isinstance(budget, Budget):
        raise checks.fail("budget", "a deqlab.solvers.Budget (make_budget) or None", type(budget).__name__, where)
    for name, value in zip(Budget._fields, budget):
        if value is None or isinstance(value, (bool, np.bool_)) or not (
                isinstance(value, (int, float, np.number)) or hasattr(value, "dtype")):
            fill = "max_steps=None" if name == "max_steps" else "tol=None"
            raise checks.fail(f"budget.{name}", "a number or a scalar array (make_budget(solver, dtype, "
                              f"{fill}) fills it from the solver)", value, where)
        if jnp.shape(value) != ():
            raise checks.fail(f"budget.{name}", "a scalar", f"shape {tuple(jnp.shape(value))}", where)
    steps, tol = budget
    if not (isinstance(steps, (int, np.integer)) or jnp.issubdtype(jnp.result_type(steps), jnp.integer)):
        # 2.7 steps would run 2: an iteration limit is a count
        raise checks.fail("budget.max_steps", "an integer (a Python or NumPy integer, or an integer scalar "
                          "array; values outside [1, the solver's max_steps] are clipped into it)", steps, where)
    if not jnp.issubdtype(jnp.result_type(tol), jnp.inexact) and not isinstance(tol, (int, np.integer)):
        raise checks.fail("budget.tol", "a number > 0 or a floating scalar array", tol, where)
    if not checks.is_traced(tol):
        value = float(np.asarray(tol))
        if not (np.isfinite(value) and value > 0):
            raise checks.fail("budget.tol", "a finite number > 0", value, where)
    if not checks.is_traced(steps):
        # clipped as a Python integer (any size, any NumPy integer type) before the int32 cast
        steps = np.int32(min(max(int(np.asarray(steps).item()), 1), np.iinfo(np.int32).max))
    return Budget(steps, tol)


def limits(budget: Budget | None, solver: Solver, tol: float, dtype: Any):
    """``(step_limit, tol)`` of a solve: the budget's (clipped into ``[1, cap]``), or None and the
    static ``tol`` without one."""
    if budget is None:
        return None, tol
    step_limit = jnp.clip(jnp.asarray(budget.max_steps, jnp.int32), 1, solver.max_steps)
    return step_limit, jax.lax.convert_element_type(budget.tol, precision_module.working_dtype(dtype))
