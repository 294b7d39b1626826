""":func:`check_gradients`: a backward mode's gradient against unrolled backprop and finite
differences."""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from deqlab import _draws, _eager, checks
from deqlab import precision as precision_module
from deqlab.backward.adjoint import adjoint_solve
from deqlab.backward.api import fixed_point
from deqlab.backward.linear import get_adjoint_solver
from deqlab.backward.registry import get_backward
from deqlab.backward.unrolled import Unrolled
from deqlab.solvers import get_solver, solve
from deqlab.solvers.flatten import Flattener

__all__ = ["check_gradients"]


def _sum_of_squares(z):
    """The default loss of :func:`check_gradients`, L = sum(z*^2) (one function, so that it keys
    the compiled programs the same way at every call)."""
    return sum(jnp.sum(leaf**2) for leaf in jax.tree_util.tree_leaves(z))


def _objective(args, z0, f, loss, backward, solver, batch_axis):
    # failures are reported in the result (the residuals), not by the policy
    return loss(fixed_point(f, z0, *args, solver=solver, backward=backward, batch_axis=batch_axis,
                            on_failure="ignore").value)


# `captured` keys what f and loss read besides their arguments (arrays in their closures and
# globals by identity, scalars by value: deqlab._eager._captured), so that rebinding a global W
# compiles again instead of reusing a stale program.
_STATIC = ("f", "loss", "solver", "batch_axis", "captured")


@functools.partial(jax.jit, static_argnames=_STATIC + ("backward",))
def _gradient(args, z0, *, f, loss, backward, solver, batch_axis, captured):
    return jax.grad(_objective)(args, z0, f, loss, backward, solver, batch_axis)


@functools.partial(jax.jit, static_argnames=_STATIC)
def _unrolled_value(args, z0, *, f, loss, solver, batch_axis, captured):
    return _objective(args, z0, f, loss, Unrolled(), solver, batch_axis)


@functools.partial(jax.jit, static_argnames=_STATIC + ("adjoint_solver",))
def _residuals(args, z0, *, f, loss, solver, adjoint_solver, batch_axis, captured):
    sol = solve(f, z0, *args, solver=solver, batch_axis=batch_axis, on_failure="ignore")
    cotangent = jax.grad(loss)(sol.value)
    adjoint = adjoint_solve(f, sol.value, args, cotangent, solver=adjoint_solver, batch_axis=batch_axis,
                            on_failure="ignore")
    return sol, adjoint


def _tree_dot(a, b):
    return sum(jnp.vdot(x, y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def _tree_norm(a):
    return jnp.sqrt(_tree_dot(a, a))


def _worst(a: float, b: float) -> float:
    """max that propagates NaN (Python's max(0.0, nan) is 0.0: a NaN error must not read as 0)."""
    return float("nan") if math.isnan(a) or math.isnan(b) else max(a, b)


def check_gradients(
    f: Callable[..., Any],
    z0: Any,
    *args: Any,
    loss: Callable[[Any], jax.Array] | None = None,
    solver: Any = "adaptive",
    tol: float | None = None,
    max_steps: int = 500,
    batch_axis: int | None = None,
    backward: Any = "implicit",
    eps: float = 1e-6,
    directions: int = 3,
    key: jax.Array | None = None,
) -> dict[str, float]:
    """Compare a backward mode's gradients with unrolled backprop and central finite differences.

    Uses ``loss(z*)`` (default: sum of squares of every leaf of z*), differentiated w.r.t. every
    argument in ``args``. Finite differences are directional: for ``directions`` random unit
    directions v in parameter space, (L(a + eps v) - L(a - eps v)) / (2 eps) is compared with
    <grad L, v>. Run it in float64 (``jax.config.update("jax_enable_x64", True)``): in float32 the
    finite differences alone have errors around 1e-3.

    Args:
        f, z0: the map and the initial guess, as for :func:`fixed_point`.
        args: the further arguments of ``f``; the gradient is taken with respect to every
            array in them.
        loss: a scalar function of z*; None: the sum of squares of every leaf.
        solver: the forward solver (and the adjoint one, unless the mode names its own), a name
            or an object.
        tol, max_steps: the settings the check runs the solver with, applied to it once with
            :func:`deqlab.solvers.get_solver` (tighter and longer than a solve's defaults, as a
            check needs); ``tol`` None: 1e-12 in float64, the dtype's default otherwise.
        batch_axis: as for :func:`fixed_point`.
        backward: the backward mode checked (name or object, as in :func:`fixed_point`).
        eps: the finite-difference step (> 0).
        directions: number of random directions (>= 1).
        key: PRNG key of the directions; None: ``jax.random.key(0)``.

    Returns:
        ``{"implicit_vs_unrolled", "implicit_vs_fd", "unrolled_vs_fd"}`` relative errors (the
        largest over directions for the finite-difference ones; "implicit" is the mode checked)
        and the forward and adjoint solves' worst residuals, ``"forward_residual"`` and
        ``"adjoint_residual"``. A gradient with a NaN gives a NaN error, never a small one.

    Compilation:
        Its programs (the two gradients, the unrolled loss, the residuals) are module-level
        ``jax.jit`` functions keyed on ``f``, ``loss``, what they read besides their arguments
        (as for :func:`deqlab.solvers.solve`'s cache: rebinding a global array compiles again)
        and the settings: a second check of the same ``f`` and ``loss`` at the same shapes
        compiles nothing. An ``f`` whose state the key cannot follow (a callable object)
        compiles at every call.

    Raises:
        ValueError: a bad ``eps``, ``directions``, ``key``, ``backward`` or ``solver``, or a
            malformed problem (as :func:`fixed_point`).

    Example:
        In float64 (finite differences in float32 are too coarse to compare with); the last
        line switches x64 off again:

        >>> import jax, jax.numpy as jnp
        >>> from deqlab.backward import check_gradients
        >>> jax.config.update("jax_enable_x64", True)
        >>> w = 0.15 * jax.random.normal(jax.random.key(0), (4, 4), jnp.float64)
        >>> errors = check_gradients(lambda z, w, x: jnp.tanh(w @ z + x), jnp.zeros(4), w, jnp.ones(4))
        >>> bool(errors["implicit_vs_unrolled"] < 1e-8), bool(errors["implicit_vs_fd"] < 1e-5)
        (True, True)
        >>> jax.config.update("jax_enable_x64", False)
    """
    loss = _sum_of_squares if loss is None else loss
    directions = checks.positive_int(directions, "directions", "check_gradients")
    eps = checks.positive_number(eps, "eps", "check_gradients")
    key = jax.random.key(0) if key is None else checks.prng_key(key, "key", "check_gradients")
    mode = get_backward(backward)
    dtype = Flattener(z0, batch_axis).dtype
    if tol is None:
        tol = 1e-12 if jnp.dtype(dtype) == jnp.float64 else precision_module.default_tol(dtype)
    # The solver objects are built here, once: check_gradients' own tol and max_steps are its
    # defaults for a diagnostic (tighter and longer than a solve's).
    config = get_solver(solver, tol=tol, max_steps=max_steps)
    mode_solver = getattr(mode, "solver", None)  # Implicit's adjoint solver, if any
    adjoint_solver = get_adjoint_solver(config if mode_solver is None else mode_solver, tol=tol, max_steps=max_steps)
    # Module-level jitted programs keyed on (f, loss, the configuration): a second check of the
    # same problem at the same shapes compiles nothing.
    try:
        captured = (_eager._captured(f), _eager._captured(loss))
        hash((f, loss, config, captured))
    except (TypeError, _eager._Uncacheable):
        # f or loss reads state the key cannot follow (a callable object, a list): a fresh key
        # each call, so the programs compile again and are never stale
        captured = object()
    static = dict(f=f, loss=loss, solver=config, batch_axis=batch_axis, captured=captured)
    grad_checked = _gradient(args, z0, backward=mode, **static)
    grad_unrolled = _gradient(args, z0, backward=Unrolled(), **static)

    difference = jax.tree_util.tree_map(jnp.subtract, grad_checked, grad_unrolled)
    errors = {
        "implicit_vs_unrolled": float(_tree_norm(difference) / _tree_norm(grad_unrolled)),
        "implicit_vs_fd": 0.0,
        "unrolled_vs_fd": 0.0,
    }
    leaves, treedef = jax.tree_util.tree_flatten(args)
    for k in jax.random.split(key, directions):
        keys = jax.random.split(k, len(leaves))
        v = jax.tree_util.tree_unflatten(
            treedef, [_draws.normal(kk, jnp.shape(x), jnp.result_type(x)) for kk, x in zip(keys, leaves)]
        )
        v = jax.tree_util.tree_map(lambda x: x / _tree_norm(v), v)
        plus = jax.tree_util.tree_map(lambda a, d: a + eps * d, args, v)
        minus = jax.tree_util.tree_map(lambda a, d: a - eps * d, args, v)
        fd = float((_unrolled_value(plus, z0, **static) - _unrolled_value(minus, z0, **static)) / (2 * eps))
        scale = max(abs(fd), 1e-300)
        errors["implicit_vs_fd"] = _worst(errors["implicit_vs_fd"], abs(float(_tree_dot(grad_checked, v)) - fd) / scale)
        errors["unrolled_vs_fd"] = _worst(errors["unrolled_vs_fd"], abs(float(_tree_dot(grad_unrolled, v)) - fd) / scale)

    sol, adjoint = _residuals(args, z0, adjoint_solver=adjoint_solver, **static)
    errors["forward_residual"] = float(jnp.max(sol.stats.best_residual))
    errors["adjoint_residual"] = float(jnp.max(adjoint.stats.best_residual))
    return errors
