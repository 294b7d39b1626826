"""Graders of chapter 0 (practice): the tanh layer, the weight-tied network, the residual, the
forward solvers, the implicit gradient, the classifier and its training step.

By page (calling conventions as in the pages' ``reader-code`` cells):

- page 1: :func:`check_layer` (``my_layer(z, W, U, b, x)``), :func:`check_weight_tied`
  (``my_weight_tied(f, z0, args, depth)``), :func:`check_residual` (``my_residual(fz, z)``),
  :func:`check_solver` (``my_picard(f, z0, args, tol=..., max_steps=...)``);
- page 2: :func:`check_solver` with ``reference="anderson"``;
- page 3: :func:`check_implicit_gradient` (``my_fixed_point(f, params, x)``, a ``jax.custom_vjp``);
- page 5: :func:`check_classifier` (an ``nnx.Module`` with ``cell(z, x)`` and ``readout``) and
  :func:`check_train_step` (``my_train_step(model, optimizer, x, y)``).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from deqlab.backward import fixed_point
from deqlab.lab.exercises._core import (
    Check,
    Report,
    _crashed,
    _reference,
    _relative,
    _require_callable,
    _student_code,
    _time_limited,
)
from deqlab.solvers import Anderson, get_solver, relative_residual, solve

__all__ = ["check_layer", "check_weight_tied", "check_residual", "check_solver", "check_implicit_gradient",
           "check_classifier", "check_train_step"]


def _tanh_map(z, w, u, b, x):
    """The layer of page 1, tanh(z W^T + x U^T + b) (001 Eq. 21 with phi = tanh)."""
    return jnp.tanh(z @ w.T + x @ u.T + b)


def _tanh_problem(seed: int, *, width: int = 16, batch: int = 4, scale: float, ensemble: str = "orthogonal",
                  input_scale: float = 0.5, in_features: int = 8, dtype=jnp.float32):
    """The tanh layer's problem of page 1 (``practice.tanh_problem``'s layout), drawn with NumPy
    from ``seed`` (no compilation): W = scale O with O Haar orthogonal, or W = scale G / rho(G)
    with G Gaussian, so that its spectral radius is exactly ``scale``; U Gaussian with variance
    input_scale^2 / in_features, b = 0, x standard normal, z0 = 0."""
    from deqlab.lab.experiments.practice import Problem

    rng = np.random.default_rng(seed)
    g = rng.standard_normal((width, width))
    if ensemble == "orthogonal":
        q, r = np.linalg.qr(g)
        w = scale * q * np.sign(np.diag(r))
    else:
        w = scale * g / np.max(np.abs(np.linalg.eigvals(g)))
    u = input_scale * rng.standard_normal((width, in_features)) / math.sqrt(in_features)
    x = rng.standard_normal((batch, in_features))
    args = tuple(jnp.asarray(a, dtype) for a in (w, u, np.zeros(width), x))
    return Problem(_tanh_map, jnp.zeros((batch, width), dtype), args)


# --------------------------------------------------------------------------------------------
# Page 1: the layer, the weight-tied network, the residual


@_time_limited
def check_layer(my_layer: Callable[..., Any]) -> Report:
    """Grade ``my_layer(z, W, U, b, x)``, the tanh DEQ layer f(z; x) = tanh(W z + U x + b) of page 1
    (001 Eq. 21 with phi = tanh, 003 Eq. 4) applied to a batch of samples stored as rows, against
    ``deqlab``'s layer (entrywise, to 1e-5 in float32 and 1e-12 in float64).

    Problems: a float32 batch near the linear regime of tanh, and a float64 one with a large
    input (saturated tanh), a non-zero state, a non-zero bias and more inputs than hidden units
    (the float64 one runs only with ``jax_enable_x64``).

    Args:
        my_layer: your function, called as ``my_layer(z, W, U, b, x)`` on a batch of rows.

    Returns:
        A :class:`Report` with one line per problem.

    Raises:
        TypeError: ``my_layer`` is not callable.

    Example:
        Grade your function; here one not written yet, as the student edition hands it out (every
        check fails, with the hint "not written yet"):

        >>> from deqlab.lab import exercises
        >>> def my_layer(z, W, U, b, x):
        ...     raise NotImplementedError("your code here")
        >>> report = exercises.check_layer(my_layer)
        >>> report.passed, len(report.failed) == len(report.checks)
        (False, True)
        >>> print(report.failed[0].hint)
        your code raised NotImplementedError: your code here. not written yet: ...
    """
    _require_callable(my_layer, "my_layer", "check_layer")
    checks = []
    cases = [("float32, small input", 0, 16, 8, 0.5, jnp.float32, 1e-5),
             ("float64, saturated, non-zero z and b", 1, 16, 20, 4.0, jnp.float64, 1e-12)]
    for label, seed, width, in_features, input_scale, dtype, tol in cases:
        if dtype == jnp.float64 and not jax.config.jax_enable_x64:
            continue  # float64 arrays are float32 without x64: the float32 case covers the formula
        p = _tanh_problem(seed, width=width, scale=0.9, in_features=in_features,
                          input_scale=input_scale, dtype=dtype)
        w, u, _, x = p.args
        rng = np.random.default_rng(seed + 100)
        z = jnp.asarray(rng.standard_normal(p.z0.shape), dtype) if seed else p.z0
        b = jnp.asarray(0.5 * rng.standard_normal(width), dtype) if seed else p.args[2]
        name = f"layer, {label}: max |yours - deqlab's|"
        try:
            with _student_code():
                mine = jnp.asarray(my_layer(z, w, u, b, x))
        except Exception as error:  # noqa: BLE001 - reported as a failed check
            checks.append(_crashed(name, error, "call it as my_layer(z, W, U, b, x) on a batch of rows."))
            continue
        theirs = _tanh_map(z, w, u, b, x)
        transposed = jnp.tanh(z @ w + x @ u.T + b)
        if mine.shape == theirs.shape and float(jnp.max(jnp.abs(mine - transposed))) < 10 * tol:
            hint = ("your output is the layer with W transposed (you used W, not W.T): each row z must be "
                    "mapped as the column W z of page 1's formula is")
        else:
            hint = ("your rows differ from f(z; x) = tanh(W z + U x + b) of page 1 (001 Eq. 21) applied to each "
                    "row; this case has " + ("a non-zero z and b, a saturated tanh and more inputs than hidden "
                                             "units" if seed else "z = 0 and b = 0"))
        error = math.inf if mine.shape != theirs.shape else float(jnp.max(jnp.abs(mine - theirs)))
        note = "" if mine.shape == theirs.shape else f"shape {mine.shape}, expected {theirs.shape}"
        checks.append(Check(name, error, tol, hint=hint, note=note))
    return Report("check_layer(my_layer)", tuple(checks))


@_time_limited
def check_weight_tied(my_weight_tied: Callable[..., Any]) -> Report:
    """Grade ``my_weight_tied(f, z0, args, depth)``, the states z^[0..depth] of the weight-tied
    network z^[i+1] = f(z^[i]) (page 1; 003 Eq. 3), stacked on a new first axis, against the
    grader's own iteration of the layer (scale 0.5 at depth 10, scale 0.95 at depth 40; 1e-5).

    Args:
        my_weight_tied: your function, called as ``my_weight_tied(f, z0, args, depth)``.

    Returns:
        A :class:`Report` with one line per problem.

    Raises:
        TypeError: ``my_weight_tied`` is not callable.

    Example:
        Grade your function; here one not written yet, as the student edition hands it out (every
        check fails, with the hint "not written yet"):

        >>> from deqlab.lab import exercises
        >>> def my_weight_tied(f, z0, args, depth):
        ...     raise NotImplementedError("your code here")
        >>> report = exercises.check_weight_tied(my_weight_tied)
        >>> report.passed, len(report.failed) == len(report.checks)
        (False, True)
        >>> print(report.failed[0].hint)
        your code raised NotImplementedError: your code here. not written yet: ...
    """
    _require_callable(my_weight_tied, "my_weight_tied", "check_weight_tied")
    checks = []
    for label, seed, scale, depth in (("scale 0.5, depth 10", 0, 0.5, 10), ("scale 0.95, depth 40", 1, 0.95, 40)):
        p = _tanh_problem(seed, scale=scale)
        name = f"weight-tied, {label}: max |yours - deqlab's| over all depths"
        try:
            with _student_code():
                mine = jnp.asarray(my_weight_tied(p.f, p.z0, p.args, depth))
        except Exception as error:  # noqa: BLE001
            checks.append(_crashed(name, error, "call it as my_weight_tied(f, z0, args, depth)."))
            continue

        def layer(z, _, p=p):
            return p.f(z, *p.args), z

        last, states = jax.lax.scan(layer, p.z0, None, length=depth)
        theirs = jnp.concatenate([states, last[None]], axis=0)
        ok_shape = mine.shape == theirs.shape
        checks.append(Check(name, float(jnp.max(jnp.abs(mine - theirs))) if ok_shape else math.inf, 1e-5,
                            hint="expected the depth + 1 states z^[0] = z0, ..., z^[depth] of 003 Eq. 3 in that "
                                 "order, on a new first axis (shape (depth + 1,) + z0.shape)",
                            note="" if ok_shape else f"shape {mine.shape}, expected {theirs.shape}"))
    return Report("check_weight_tied(my_weight_tied)", tuple(checks))


@_time_limited
def check_residual(my_residual: Callable[..., Any]) -> Report:
    """Grade ``my_residual(fz, z)``, the per-row relative residual rho(z) of page 1 ("A root-finding
    problem", the stopping rule of every ``deqlab`` solver), against ``deqlab``'s (relative 1e-5 per
    row), on random rows, a row at the fixed point 0, and rows of very different sizes.

    Args:
        my_residual: your function, called as ``my_residual(fz, z)`` with float32 arrays (B, D); it
            must return one number per row.

    Returns:
        A :class:`Report` with one line.

    Raises:
        TypeError: ``my_residual`` is not callable.

    Example:
        Grade your function; here one not written yet, as the student edition hands it out (every
        check fails, with the hint "not written yet"):

        >>> from deqlab.lab import exercises
        >>> def my_residual(fz, z):
        ...     raise NotImplementedError("your code here")
        >>> report = exercises.check_residual(my_residual)
        >>> report.passed, len(report.failed) == len(report.checks)
        (False, True)
        >>> print(report.failed[0].hint)
        your code raised NotImplementedError: your code here. not written yet: ...
    """
    _require_callable(my_residual, "my_residual", "check_residual")
    rng = np.random.default_rng(7)
    z = rng.standard_normal((6, 20)) * np.array([1, 1e-3, 1e3, 1, 1, 0])[:, None]
    fz = z + 1e-2 * rng.standard_normal(z.shape) * np.array([1, 1e-3, 1e3, 10, 1e-4, 0])[:, None]
    z, fz = jnp.asarray(z, jnp.float32), jnp.asarray(fz, jnp.float32)
    name = "relative residual per row: max relative difference"
    try:
        # compared in NumPy float64: jnp.float64 would warn (and truncate) without jax_enable_x64
        with _student_code():
            mine = np.asarray(my_residual(fz, z), np.float64)
    except Exception as error:  # noqa: BLE001
        return Report("check_residual(my_residual)", (_crashed(name, error, "call it as my_residual(fz, z)."),))
    theirs = np.asarray(relative_residual(fz, z), np.float64)
    hint = ("compare yours with rho(z) of page 1 row by row: the rows' sizes range over 1e-3 to 1e3, so a "
            "residual that is not relative to f(z), or mixes rows, fails (the worst row is in the error)")
    if mine.shape != theirs.shape:
        error, note = math.inf, f"shape {mine.shape}, expected {theirs.shape} (one number per row)"
        hint = "rho is one number per sample: return one per row of z"
    else:
        error, note = float(np.max(np.abs(mine - theirs) / np.maximum(theirs, 1e-30))), ""
        if not bool(np.isfinite(mine[-1])):
            error, note = math.inf, "the row with f(z) = z = 0 gave a non-finite residual"
            hint = ("at the fixed point z = f(z) = 0 rho must be 0, not 0/0: see the eps sqrt(D) term of rho's "
                    "definition on page 1")
    return Report("check_residual(my_residual)", (Check(name, error, 1e-5, note=note, hint=hint),))


# --------------------------------------------------------------------------------------------
# Page 1 and 2: forward solvers


@_time_limited
def check_solver(my_solve: Callable[..., Any], reference: Any = "picard", *, tol: float = 1e-5,
                 **options: Any) -> Report:
    """Grade a forward solver written as on pages 1 and 2: ``my_solve(f, z0, args, tol=...,
    max_steps=..., **options)`` returns ``(z, steps)`` for a batch of rows and raises when it does
    not converge in ``max_steps``.

    It is run on three tanh DEQ problems (float32, :func:`deqlab.lab.experiments.practice.tanh_problem`):
    a contractive orthogonal W at scale 0.5, a hard non-normal Gaussian W at scale 0.95 (spectral
    radius 0.95, ||W|| about 1.9), and an expanding one at scale 1.5 with ``max_steps=30``. Checks:

    - the returned rows meet the tolerance: the worst relative residual rho(z) = ||f(z) - z|| /
      (||f(z)|| + eps sqrt(D)) is at most 2 tol (your loop checks rho at the iterate before the
      one it returns);
    - the returned rows are the fixed point: relative distance to the equilibrium (``deqlab``'s
      solve to 1e-6) at most 20 tol / (1 - scale), the distance a residual tol leaves at that
      contraction;
    - it is as fast as ``deqlab``'s ``reference`` solver on the same problem: steps at most 1.25
      times its slowest sample's plus 2 (an "Anderson" that is plain iteration fails this on the
      hard problem);
    - on the expanding problem it raises, or returns rows that meet the tolerance: it never
      returns an unconverged answer silently.

    Args:
        my_solve: your solver.
        reference: ``deqlab``'s solver to compare with: ``"picard"``, ``"anderson"``, ``"broyden"``
            or a configured object such as ``deqlab.Picard(damping=0.7)``.
        tol: the tolerance passed to both, in [1e-6, 1e-2] (float32 problems).
        time_limit: seconds before the grader gives up with :class:`GraderTimeout` (every grader
            takes it; default :data:`TIME_LIMIT`); it is not passed to your solver.
        **options: passed to your solver as keyword arguments (e.g. ``beta=0.7`` for a damped
            Picard, ``m=5``).

    Returns:
        A :class:`Report` with one line per check.

    Raises:
        TypeError: ``my_solve`` is not callable.
        ValueError: ``tol`` is out of range or ``reference`` names no solver.

    Example:
        Grade your function; here one not written yet, as the student edition hands it out (every
        check fails, with the hint "not written yet"):

        >>> from deqlab.lab import exercises
        >>> def my_picard(f, z0, args, tol=1e-5, max_steps=500):
        ...     raise NotImplementedError("your code here")
        >>> report = exercises.check_solver(my_picard, reference="picard")
        >>> report.passed, len(report.failed) == len(report.checks)
        (False, True)
        >>> print(report.failed[0].hint)
        your code raised NotImplementedError: your code here. not written yet: ...
    """
    _require_callable(my_solve, "my_solve", "check_solver")
    if not isinstance(tol, (int, float)) or isinstance(tol, bool) or not 1e-6 <= tol <= 1e-2:
        raise ValueError(f"exercises.check_solver: `tol` must be a number in [1e-6, 1e-2] (the problems are "
                         f"float32), got {tol!r}.")
    config = get_solver(reference, name="reference")
    name = config.name
    checks = []
    problems = (("contractive (orthogonal W, scale 0.5)", 0, "orthogonal", 0.5, 500),
                ("hard (non-normal Gaussian W, scale 0.95)", 1, "gaussian", 0.95, 2000))
    for label, seed, ensemble, scale, max_steps in problems:
        p = _tanh_problem(seed, scale=scale, ensemble=ensemble)
        try:
            with _student_code():
                out = my_solve(p.f, p.z0, p.args, tol=tol, max_steps=max_steps, **options)
            z, steps = out
            z = jnp.asarray(z)
            steps = int(steps)
            if z.shape != p.z0.shape:
                raise ValueError(f"z has shape {z.shape}, expected {p.z0.shape}")
        except Exception as error:  # noqa: BLE001
            checks.append(_crashed(f"{label}: runs and returns (z, steps)", error,
                                   "call it as my_solve(f, z0, args, tol=..., max_steps=...) -> (z, steps)."))
            continue
        fz = p.f(z, *p.args)
        residual = float(jnp.max(relative_residual(fz, z)))
        checks.append(Check(f"{label}: worst relative residual of your z", residual, 2 * tol,
                            hint="some returned rows have rho > 2 tol: the solver stopped before every "
                                 "row met the tolerance, or returned another iterate than the one it tested"))
        exact = _reference(("solve", seed), lambda p=p: jax.jit(lambda args: solve(
            p.f, p.z0, *args, solver=Anderson(tol=1e-6, max_steps=1000), batch_axis=0).value)(p.args))
        distance = float(jnp.max(jnp.linalg.norm(z - exact, axis=-1) / jnp.linalg.norm(exact, axis=-1)))
        checks.append(Check(f"{label}: relative distance to the fixed point", distance, 20 * tol / (1 - scale),
                            hint="your z is not the equilibrium: check the update and what you return"))
        ref_steps = int(_reference(("steps", seed, config, tol, max_steps), lambda p=p, m=max_steps: jax.jit(
            lambda args: solve(p.f, p.z0, *args, solver=get_solver(config, tol=tol, max_steps=m),
                               batch_axis=0).stats.steps.max()
        )(p.args)))
        bound = 1.25 * ref_steps + 2
        checks.append(Check(f"{label}: your steps vs deqlab {name}'s slowest sample ({ref_steps})", steps, bound,
                            hint=f"more steps than deqlab's {name} on this problem: compare your update with "
                                 "the method's definition (page 2 for Anderson) and count steps from 0"))
    p = _tanh_problem(2, scale=1.5)
    label = "expanding (scale 1.5, max_steps=30): raises or converges"
    try:
        with _student_code():
            z, _ = my_solve(p.f, p.z0, p.args, tol=tol, max_steps=30, **options)
        residual = float(jnp.max(relative_residual(p.f(jnp.asarray(z), *p.args), jnp.asarray(z))))
        checks.append(Check(label, residual, 2 * tol, note="returned without raising",
                            hint="when max_steps is reached without convergence, raise (e.g. RuntimeError) "
                                 "instead of returning the last iterate"))
    except Exception as error:  # noqa: BLE001 - raising is the expected behaviour here
        ran = all(not c.name.endswith("runs and returns (z, steps)") for c in checks)
        checks.append(Check(label, 0.0 if ran else math.inf, 2 * tol, note=f"raised {type(error).__name__}",
                            hint="it raised, but it also failed to run on the convergent problems above"))
    return Report(f"check_solver({getattr(my_solve, '__name__', 'my_solve')}, reference={name!r})", tuple(checks))


# --------------------------------------------------------------------------------------------
# Page 3: the implicit gradient


@_time_limited
def check_implicit_gradient(my_fixed_point: Callable[..., Any]) -> Report:
    """Grade ``my_fixed_point(f, params, x)`` of page 3: the equilibrium ``z* = f(z*, *params, x)`` of
    a batch of rows (z0 = 0, width ``params[0].shape[0]``), differentiable with respect to ``params``
    and ``x`` by the implicit function theorem (003 Theorem 1: Eq. 8, with the adjoint system of
    Eq. 11; page 3).

    Needs float64 (``jax.config.update("jax_enable_x64", True)``). For the loss
    ``sum(c * z*) + sum(z*^2)`` (c fixed and random, so that no entry of g vanishes), on a tanh DEQ with
    orthogonal W at scale 0.5 and a non-normal Gaussian W at scale 0.9, checks:

    - the value z* against ``deqlab.solve`` (relative 1e-8);
    - the gradient w.r.t. (W, U, b) and x against ``jax.grad`` through ``deqlab.fixed_point`` with
      the implicit backward (relative 1e-6 of the largest entry);
    - the directional derivative along two random directions against central finite differences of
      the loss (relative 1e-5).

    A gradient that skips the adjoint solve of 003 Eq. 11 fails the last two.

    Args:
        my_fixed_point: your function, called as ``my_fixed_point(f, params, x)`` with ``params =
            (W, U, b)``; a ``jax.custom_vjp`` with ``f`` as its non-differentiable argument.

    Returns:
        A :class:`Report` with three lines per problem.

    Raises:
        TypeError: ``my_fixed_point`` is not callable.
        RuntimeError: float64 is off (``jax_enable_x64``).

    Example:
        Grade your ``custom_vjp`` in a float64 session (in float32 the grader says so):

        >>> from deqlab.lab import exercises
        >>> def my_fixed_point(f, params, x):
        ...     raise NotImplementedError("your code here")
        >>> exercises.check_implicit_gradient(my_fixed_point)
        Traceback (most recent call last):
        ...
        RuntimeError: exercises.check_implicit_gradient needs float64: run jax.config.update('jax_enable_x64', True) first (before creating arrays).
    """
    _require_callable(my_fixed_point, "my_fixed_point", "check_implicit_gradient")
    if not jax.config.jax_enable_x64:
        raise RuntimeError("exercises.check_implicit_gradient needs float64: run "
                           "jax.config.update('jax_enable_x64', True) first (before creating arrays).")
    checks = []
    for label, seed, ensemble, scale in (("orthogonal W, scale 0.5", 0, "orthogonal", 0.5),
                                         ("Gaussian W, scale 0.9", 1, "gaussian", 0.9)):
        p = _tanh_problem(seed, scale=scale, ensemble=ensemble, input_scale=0.8, dtype=jnp.float64)
        params, x = p.args[:3], p.args[3]
        rng = np.random.default_rng(seed + 50)
        params = (params[0], params[1], jnp.asarray(0.1 * rng.standard_normal(params[2].shape)))
        c = jnp.asarray(rng.standard_normal(p.z0.shape))

        def their_value(params, x, p=p):
            return fixed_point(p.f, p.z0, *params, x, solver=Anderson(tol=1e-12, max_steps=1000), batch_axis=0).value

        def loss_of(value_fn, c=c):
            return lambda params, x: jnp.sum(c * value_fn(params, x)) + jnp.sum(value_fn(params, x) ** 2)

        def my_value(params, x, p=p):
            with _student_code():
                return my_fixed_point(p.f, params, x)

        def reference(params=params, x=x, their_value=their_value, loss_of=loss_of, rng=rng):
            """deqlab's z*, gradient, and central differences of the loss along two random directions."""
            grads = jax.jit(jax.grad(loss_of(their_value), argnums=(0, 1)))(params, x)
            loss = jax.jit(loss_of(their_value))
            leaves, directions, differences = (*params, x), [], []
            for _ in range(2):
                v = [rng.standard_normal(leaf.shape) for leaf in leaves]
                norm = math.sqrt(sum(float(np.sum(a**2)) for a in v))
                v = [a / norm for a in v]
                eps = 1e-5
                plus = [leaf + eps * d for leaf, d in zip(leaves, v)]
                minus = [leaf - eps * d for leaf, d in zip(leaves, v)]
                directions.append(v)
                differences.append(float(loss(tuple(plus[:3]), plus[3]) - loss(tuple(minus[:3]), minus[3])) / (2 * eps))
            return jax.jit(their_value)(params, x), grads, directions, differences

        exact, their_grads, directions, differences = _reference(("gradient", seed), reference)
        try:
            mine = jnp.asarray(my_value(params, x))
            value_error = _relative(mine, exact)
        except Exception as error:  # noqa: BLE001
            checks.append(_crashed(f"{label}: value", error, "call it as my_fixed_point(f, params, x)."))
            continue
        checks.append(Check(f"{label}: z* vs deqlab.solve", value_error, 1e-8,
                            hint="the forward solve stops too early or starts from the wrong z0"))
        try:
            my_grads = jax.jit(jax.grad(loss_of(my_value), argnums=(0, 1)))(params, x)
        except Exception as error:  # noqa: BLE001
            checks.append(_crashed(f"{label}: gradient", error,
                                   "jax.grad of the loss must run through my_fixed_point: it is a "
                                   "jax.custom_vjp with a forward and a backward rule (page 3)."))
            continue
        checks.append(Check(f"{label}: gradient (W, U, b, x) vs deqlab.fixed_point", _relative(my_grads, their_grads),
                            1e-6, hint="your gradient differs from the implicit gradient of z* (003 Theorem 1, "
                                       "Eq. 8, with the adjoint system of Eq. 11); a backward pass that skips the "
                                       "adjoint solve gives the gradient of one layer, not of z*"))
        mine_flat = (*my_grads[0], my_grads[1])
        worst = max(abs(sum(float(jnp.vdot(g, d)) for g, d in zip(mine_flat, v)) - fd) / max(abs(fd), 1e-300)
                    for v, fd in zip(directions, differences))
        checks.append(Check(f"{label}: directional derivative vs central finite differences", worst, 1e-5,
                            hint="your gradient is not the derivative of the loss along these directions "
                                 "(central finite differences): see 003 Eq. 8 and 11, taken at z*, with "
                                 "respect to both params and x"))
    return Report("check_implicit_gradient(my_fixed_point)", tuple(checks))


# --------------------------------------------------------------------------------------------
# Page 5: the NNX model and the training step


def _digits_batch(n: int, seed: int = 0):
    from deqlab.lab import data

    x, y = data.load_dataset("digits", split="train")
    idx = np.random.default_rng(seed).choice(len(x), n, replace=False)
    return jnp.asarray(x[idx]), jnp.asarray(y[idx])


@_time_limited
def check_classifier(model: Any, *, x: Any = None, y: Any = None) -> Report:
    """Grade the DEQ classifier of page 5: an ``nnx.Module`` whose ``model(x)`` returns the logits
    ``model.readout(z*)`` at the equilibrium z* = ``model.cell(z*, x)`` (z0 = 0), differentiated
    implicitly (003 Theorem 1).

    The reference is built from *your* cell and readout: z* by ``deqlab.solve`` to 1e-6 and the
    gradient of the mean cross-entropy by ``deqlab.fixed_point``'s implicit backward, so any
    parameter layout works. Your model may use a looser forward tolerance (page 5 trains at 1e-3),
    hence the tolerances of 2e-2. Checks: the logits (relative to their largest entry), and the
    gradient of every parameter (relative to the largest entry of each).

    Args:
        model: your model instance, with attributes ``cell`` (called as ``cell(z, x)``) and
            ``readout``.
        x, y: a batch of inputs (B, features) and integer labels (B,); default: 32 training digits.

    Returns:
        A :class:`Report` with one line per check.

    Raises:
        TypeError: ``model`` is not an ``nnx.Module`` with ``cell`` and ``readout``.

    Example:
        Grade your model instance, ``exercises.check_classifier(MyDEQClassifier(...))``; anything
        else is refused:

        >>> from deqlab.lab import exercises
        >>> exercises.check_classifier("my model")
        Traceback (most recent call last):
        ...
        TypeError: exercises.check_classifier: `model` must be an nnx.Module instance called as model(x), got str.
    """
    import optax
    from flax import nnx

    if not isinstance(model, nnx.Module) or not callable(model):
        raise TypeError(f"exercises.check_classifier: `model` must be an nnx.Module instance called as "
                        f"model(x), got {type(model).__name__}.")
    for attribute in ("cell", "readout"):
        if not hasattr(model, attribute):
            raise TypeError(f"exercises.check_classifier: `model` must have a `{attribute}` attribute "
                            "(the cell called as cell(z, x), and the readout layer).")
    if x is None or y is None:
        x, y = _digits_batch(32)
    checks = []
    x = jnp.asarray(x)
    graphdef, state = nnx.split(model)

    def reference_logits(state):
        m = nnx.merge(graphdef, state)
        cell_graph, cell_state = nnx.split(m.cell)

        def f(z, cell_state, x):
            return nnx.merge(cell_graph, cell_state)(z, x)

        z0 = jnp.zeros((x.shape[0], _cell_width(m.cell, x)), x.dtype)
        z_star = fixed_point(f, z0, cell_state, x, solver=Anderson(tol=1e-5, max_steps=300), batch_axis=0).value
        return m.readout(z_star)

    def loss(logits):
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    theirs = jax.jit(reference_logits)(state)
    try:
        with _student_code():
            mine = jnp.asarray(model(x))
    except Exception as error:  # noqa: BLE001
        return Report("check_classifier(model)", (_crashed("logits", error, "model(x) must return logits (B, 10)."),))
    checks.append(Check("logits vs readout(z*) at deqlab's equilibrium of your cell", _relative(mine, theirs), 2e-2,
                        hint="model(x) must be readout(z*) with z* = cell(z*, x), solved from z0 = 0",
                        note="" if mine.shape == theirs.shape else f"shape {mine.shape}, expected {theirs.shape}"))

    def my_loss(state):
        with _student_code():
            return loss(nnx.merge(graphdef, state)(x))

    try:
        my_grads = jax.jit(jax.grad(my_loss))(state)
    except Exception as error:  # noqa: BLE001
        checks.append(_crashed("gradient", error, "the forward pass must be differentiable (deqlab.fixed_point)."))
        return Report("check_classifier(model)", tuple(checks))
    their_grads = jax.jit(jax.grad(lambda s: loss(reference_logits(s))))(state)
    mine_by_path = dict(jax.tree_util.tree_leaves_with_path(my_grads))
    worst_name, worst = "", 0.0
    for path, g in jax.tree_util.tree_leaves_with_path(their_grads):
        if not jnp.issubdtype(jnp.asarray(g).dtype, jnp.floating):
            continue
        error = _relative(mine_by_path.get(path, jnp.zeros_like(g)), g)
        if error >= worst:
            worst_name, worst = jax.tree_util.keystr(path), error
    checks.append(Check("gradient of the cross-entropy, worst parameter", worst, 2e-2, note=worst_name,
                        hint="the cell's parameters do not get the implicit gradient of z* (003 Theorem 1): "
                             "z* must depend on them through the implicit solve, as page 5 builds it (the "
                             "parameters passed to the solve, not closed over), with no stop_gradient"))
    return Report("check_classifier(model)", tuple(checks))


def _cell_width(cell, x) -> int:
    width = getattr(cell, "width", None)
    if width is None and hasattr(cell, "recurrent"):
        width = cell.recurrent.in_features
    if width is None:
        raise TypeError("exercises.check_classifier: `model.cell` must have a `width` attribute or a "
                        "`recurrent` nnx.Linear, to size z0.")
    return int(width)


@_time_limited
def check_train_step(my_train_step: Callable[..., Any], model: Any, *, learning_rate: float = 0.1,
                     steps: int = 5, x: Any = None, y: Any = None) -> Report:
    """Grade ``my_train_step(model, optimizer, x, y)`` of page 5: one optimizer step on the mean
    softmax cross-entropy of ``model(x)``, updating ``model`` in place and returning the loss
    *before* the update.

    Two copies of ``model`` (``nnx.clone``; yours is not touched) take ``steps`` steps on the same
    batch, one with your step and one with the grader's reference step, each with
    ``nnx.Optimizer(copy, optax.sgd(learning_rate), wrt=nnx.Param)``: plain gradient descent,
    so that the update is the gradient itself (Adam's first steps are the gradient's signs, blind
    to its size). Checks: the first returned loss equals the loss before any step; the parameter
    update of the first step and the parameters after the last agree with the reference's
    (relative 1e-3); the loss fell over the steps.

    Args:
        my_train_step: your function, called as ``my_train_step(model, optimizer, x, y)``.
        model: an ``nnx.Module`` classifier to train (cloned, not modified).
        learning_rate: the SGD learning rate, in (0, 1].
        steps: the number of steps, 2 to 50.
        x, y: a batch of inputs and integer labels; default: 32 training digits.

    Returns:
        A :class:`Report` with four lines.

    Raises:
        TypeError: ``my_train_step`` is not callable or ``model`` is not an ``nnx.Module``.
        ValueError: ``learning_rate`` or ``steps`` is out of range.

    Example:
        Grade your step on your model, ``exercises.check_train_step(my_train_step, model)``:

        >>> from deqlab.lab import exercises
        >>> def my_train_step(model, optimizer, x, y):
        ...     raise NotImplementedError("your code here")
        >>> exercises.check_train_step(my_train_step, "my model")
        Traceback (most recent call last):
        ...
        TypeError: exercises.check_train_step: `model` must be an nnx.Module instance, got str.
    """
    import optax
    from flax import nnx

    _require_callable(my_train_step, "my_train_step", "check_train_step")
    if not isinstance(model, nnx.Module):
        raise TypeError(f"exercises.check_train_step: `model` must be an nnx.Module instance, got "
                        f"{type(model).__name__}.")
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)) or not 0 < learning_rate <= 1:
        raise ValueError(f"exercises.check_train_step: `learning_rate` must be a number in (0, 1], got "
                         f"{learning_rate!r}.")
    if not isinstance(steps, int) or isinstance(steps, bool) or not 2 <= steps <= 50:
        raise ValueError(f"exercises.check_train_step: `steps` must be an integer in [2, 50], got {steps!r}.")
    if x is None or y is None:
        x, y = _digits_batch(32, seed=1)
    x, y = jnp.asarray(x), jnp.asarray(y)

    def loss_fn(m):
        return optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()

    @nnx.jit
    def reference_step(m, optimizer):
        loss, grads = nnx.value_and_grad(loss_fn)(m)
        optimizer.update(m, grads)
        return loss

    mine, theirs = nnx.clone(model), nnx.clone(model)
    before = jax.tree_util.tree_map(jnp.array, nnx.state(theirs, nnx.Param))
    initial_loss = float(loss_fn(theirs))
    my_opt = nnx.Optimizer(mine, optax.sgd(learning_rate), wrt=nnx.Param)
    their_opt = nnx.Optimizer(theirs, optax.sgd(learning_rate), wrt=nnx.Param)
    my_losses = []
    try:
        for i in range(steps):
            with _student_code():
                my_losses.append(float(my_train_step(mine, my_opt, x, y)))
            reference_step(theirs, their_opt)
            if i == 0:
                first = _worst_param_error(mine, theirs, before)
    except Exception as error:  # noqa: BLE001
        return Report("check_train_step(my_train_step)", (_crashed(
            "runs", error, "call it as my_train_step(model, optimizer, x, y) and return the loss"),))
    last = _worst_param_error(mine, theirs)
    checks = (
        Check("returned loss of the first step vs the loss before it", abs(my_losses[0] - initial_loss),
              1e-4 * max(1.0, initial_loss),
              hint="the returned loss is not the mean cross-entropy of model(x) before the step: return "
                   "the loss at the parameters the step starts from"),
        Check("parameter update of one step vs the reference step", first[1], 1e-3, note=first[0],
              hint="the first step's parameter change (worst parameter in the note) is not one step of "
                   "the optimizer on the gradient of the mean softmax cross-entropy of model(x) with "
                   "respect to the model's nnx.Param"),
        Check(f"parameters after {steps} steps vs the reference", last[1], 1e-3, note=last[0],
              hint="each call must take exactly one optimizer step"),
        Check(f"loss after {steps} steps / first loss", my_losses[-1] / my_losses[0], 0.999,
              hint="the loss must fall when the same batch is repeated: check the sign of the "
                   "update and that the model is updated in place"),
    )
    return Report("check_train_step(my_train_step)", checks)


def _worst_param_error(mine, theirs, before=None) -> tuple[str, float]:
    """Worst relative difference, over parameters, of ``mine`` and ``theirs`` (their differences
    from ``before`` when it is given: the updates), relative to the largest entry of each of
    theirs."""
    from flax import nnx

    def by_path(state):
        return dict(jax.tree_util.tree_leaves_with_path(state))

    mine_p, theirs_p = by_path(nnx.state(mine, nnx.Param)), by_path(nnx.state(theirs, nnx.Param))
    before_p = by_path(before) if before is not None else {}
    worst_name, worst = "", 0.0
    for path, p in theirs_p.items():
        m = mine_p.get(path, jnp.full_like(p, jnp.nan))
        if before is not None:
            m, p = m - before_p[path], p - before_p[path]
        error = _relative(m, p)
        error = math.inf if not np.isfinite(error) else error
        if error >= worst:
            worst_name, worst = jax.tree_util.keystr(path), error
    return worst_name, worst
