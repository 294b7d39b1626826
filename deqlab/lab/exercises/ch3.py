"""Graders of chapter 3 (nonlinear DEQs).

- page 5: :func:`check_mean_difference` (``my_mean_difference(a, b)``), the difference of two mean
  test errors over seeds and its standard error, behind the verdict on 001 §4.1 / Fig. 5;
- page 6: :func:`check_jacobian_penalty` (``my_jacobian_penalty(f, z, key, n_probes)``),
  Hutchinson's estimate of ``||J||_F^2`` with Rademacher probes (the Jacobian regulariser of Bai,
  Koltun & Kolter 2021, ``deqlab.stability.jacobian_penalty``).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from deqlab.lab.exercises._core import (
    Check,
    Report,
    _array,
    _call,
    _close_to,
    _require_callable,
    _student_code,
    _time_limited,
)
from deqlab.lab.exercises._forbid import ReferenceBlocked

__all__ = ["check_mean_difference", "check_jacobian_penalty"]


def _welch(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """mean(a) - mean(b) and sqrt(s_a^2 / n_a + s_b^2 / n_b), sample variances with ddof = 1."""
    return (float(a.mean() - b.mean()),
            math.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size))


@_time_limited
def check_mean_difference(my_mean_difference: Callable[..., Any]) -> Report:
    """Grade ``my_mean_difference(a, b)``: the difference ``mean(a) - mean(b)`` of the mean test errors
    of two groups of independent seeds and the standard error of that difference, estimated from the
    seeds' spread (chapter 3, page 5, exercise 2), where it decides whether the
    orthogonal ensemble's error is lower than the Gaussian's by more than two standard errors (the
    claim of 001 §4.1 / Fig. 5).

    Cases: two groups of 5 test errors (the page's quick scale), groups of 3 and 10 (unequal sizes:
    each group's own spread, not a pooled one), two constant groups (standard error 0), each
    against the grader's value (relative 1e-9); a group of one seed, whose spread is unknown: the function
    must raise (any exception) or return a NaN standard error; and a simulation: over 2000 pairs of
    normal samples (n = 5 and 8, standard deviations 1 and 2) the mean of your squared standard error
    must be within 5 of its own standard errors of the true variance of the difference, 1/5 + 4/8
    (an unbiased estimate passes; the tolerance is about 6%). Known mistakes (a biased variance, the
    two groups combined wrongly, the spread of one seed for that of a mean, the sign) get their
    hints.

    Args:
        my_mean_difference: your function, called as ``my_mean_difference(a, b)`` with ``a`` and ``b``
            float NumPy arrays (n_a,), (n_b,); it must return ``(difference, standard_error)``.

    Returns:
        A :class:`Report` with one line per case.

    Raises:
        TypeError: ``my_mean_difference`` is not callable.

    Example:
        Grade your function; here one not written yet, as the student edition hands it out (every
        check fails, with the hint "not written yet"):

        >>> from deqlab.lab import exercises
        >>> def my_mean_difference(a, b):
        ...     raise NotImplementedError("your code here")
        >>> report = exercises.check_mean_difference(my_mean_difference)
        >>> report.passed, len(report.failed) == len(report.checks)
        (False, True)
        >>> print(report.failed[0].hint)
        your code raised NotImplementedError: your code here. not written yet: ...
    """
    _require_callable(my_mean_difference, "my_mean_difference", "check_mean_difference")
    usage = "my_mean_difference(a, b) -> (mean(a) - mean(b), its standard error), two floats"
    rng = np.random.default_rng(5)
    cases = [("5 seeds each", 0.08 + 0.02 * rng.standard_normal(5), 0.11 + 0.04 * rng.standard_normal(5)),
             ("3 and 10 seeds", 0.2 + 0.05 * rng.standard_normal(3), 0.1 + 0.01 * rng.standard_normal(10)),
             ("constant groups", np.full(4, 0.25), np.full(6, 0.5))]
    checks = []

    def call(a, b, name):
        value, failed = _call(my_mean_difference, (a.copy(), b.copy()), name, usage)
        if failed is None:
            value, failed = _array(value, name, (2,), "real", usage)
        return (None, failed) if failed is not None else (value.astype(float), None)

    for label, a, b in cases:
        name = f"{label}: difference and standard error, worst relative error"
        value, failed = call(a, b, name)
        if failed is not None:
            checks.append(failed)
            continue
        diff, se = _welch(a, b)
        error = max(abs(value[0] - diff) / max(abs(diff), 1e-12), abs(value[1] - se) / max(se, 1e-12)
                    if se > 0 else abs(value[1]))
        se_a, se_b = a.std(ddof=1) / math.sqrt(a.size), b.std(ddof=1) / math.sqrt(b.size)
        known = [
            (math.sqrt(a.var() / a.size + b.var() / b.size), "yours uses the population variance (np.std and "
                                                              "np.var default to ddof=0): the seeds' sample "
                                                              "variance needs ddof=1"),
            (se_a + se_b, "yours is se_a + se_b: standard errors of independent means add in quadrature, not "
                          "linearly"),
            (math.sqrt(a.var(ddof=1) + b.var(ddof=1)), "yours uses each group's spread s: the standard error of a "
                                                       "mean is s / sqrt(n), not s"),
        ]
        if _close_to(value[0], -diff, 1e-9) and diff != 0:
            hint = "the sign: yours is mean(b) - mean(a); the difference is mean(a) - mean(b)"
        else:
            hint = next((h for target, h in known if se > 0 and not _close_to(se, target, 1e-6)
                         and _close_to(value[1], target, 1e-6)),
                        f"yours is ({value[0]:.6g}, {value[1]:.6g}), expected ({diff:.6g}, {se:.6g}): the difference "
                        "of the means and the standard error of a difference of two independent means (page 5)")
        checks.append(Check(name, error, 1e-9, hint=hint))
    # one seed: no spread estimate
    name = "a group of one seed: raises, or returns a NaN standard error"
    try:
        with warnings.catch_warnings():  # numpy warns on ddof=1 with one value: the NaN is the right answer
            warnings.simplefilter("ignore", RuntimeWarning)
            with _student_code():
                value = my_mean_difference(np.array([0.1]), np.array([0.2, 0.3, 0.25]))
            value = np.asarray(value, float).reshape(-1)
        undefined = value.size == 2 and not np.isfinite(value[1])
        note = "" if undefined else f"returned {value.tolist()}"
    except (NotImplementedError, ReferenceBlocked) as error:  # a stub, or deqlab's own function: not an answer
        undefined, note = False, f"raised {type(error).__name__}: {error}"[:300]
    except Exception as error:  # noqa: BLE001 - raising is a right answer here
        undefined, note = True, f"raised {type(error).__name__}"
    checks.append(Check(name, 0.0 if undefined else 1.0, 0.0, note=note,
                        hint="one seed has no sample variance (ddof=1 divides by n - 1 = 0): raise a ValueError "
                             "or return NaN, never a standard error of 0"))
    # simulation: the squared standard error is unbiased for the variance of the difference
    reps, na, nb = 2000, 5, 8
    sims = rng.standard_normal((reps, na)), 2.0 * rng.standard_normal((reps, nb))
    true_variance = 1.0 / na + 4.0 / nb
    name = f"simulation, {reps} pairs (n = {na}, {nb}): |mean(se^2) - Var(diff)| / its standard error"
    squares = []
    for a, b in zip(*sims):
        value, failed = call(a, b, name)
        if failed is not None:
            checks.append(failed)
            break
        squares.append(value[1] ** 2)
    else:
        squares = np.asarray(squares)
        z = abs(squares.mean() - true_variance) / (squares.std(ddof=1) / math.sqrt(reps))
        checks.append(Check(name, float(z), 5.0, note=f"mean se^2 {squares.mean():.4f}, Var(diff) {true_variance:.4f}",
                            hint="your squared standard error is biased for Var(mean(a) - mean(b)) (both in the "
                                 "note): it is unbiased only when built from unbiased variance estimates"))
    return Report("check_mean_difference(my_mean_difference)", tuple(checks))


def _penalty_problems():
    """A map with a diagonal Jacobian (N = 16) and one with a dense Jacobian (N = 12), float32, with
    the exact ||J||_F^2 and the off-diagonal sum 2 sum_{i != j} (J^T J)_ij^2 of the Rademacher variance."""
    rng = np.random.default_rng(11)
    d = jnp.asarray(rng.uniform(0.3, 1.5, 16), jnp.float32)
    a = jnp.asarray(rng.standard_normal((12, 12)) / math.sqrt(12), jnp.float32)
    c = jnp.asarray(0.3 * rng.standard_normal(12), jnp.float32)
    problems = []
    for label, f, z in (("diagonal Jacobian (elementwise tanh), N = 16", lambda z: jnp.tanh(d * z),
                         jnp.asarray(rng.standard_normal(16), jnp.float32)),
                        ("dense Jacobian (tanh(A z + c)), N = 12", lambda z: jnp.tanh(a @ z + c),
                         jnp.asarray(rng.standard_normal(12), jnp.float32))):
        jac = np.asarray(jax.jacfwd(f)(z), np.float64)
        gram = jac.T @ jac
        off = 2.0 * (np.sum(gram**2) - np.sum(np.diag(gram) ** 2))
        problems.append((label, f, z, float(np.sum(jac**2)), off, float(np.sum(gram**2))))
    return problems


@_time_limited
def check_jacobian_penalty(my_jacobian_penalty: Callable[..., Any], *, repetitions: int = 100) -> Report:
    """Grade ``my_jacobian_penalty(f, z, key, n_probes)``: Hutchinson's estimate of ``||J||_F^2``,
    ``J = df/dz`` at one sample ``z``, as the mean of ``||J eps||^2`` over ``n_probes`` Rademacher probes
    ``eps`` (entries +-1) drawn from ``key``, each ``J eps`` one ``jax.jvp`` (chapter 3, page 6; Bai,
    Koltun & Kolter 2021 §3.2; ``deqlab.stability.jacobian_penalty``, not divided by N).

    Checks, against the exact ``||J||_F^2`` from ``jax.jacfwd``:

    - a map with a diagonal Jacobian: every Rademacher estimate is exact (``eps_i^2 = 1``), so each of
      three keys must give ``||J||_F^2`` to relative 1e-5 (Gaussian probes fail here);
    - a dense Jacobian, ``repetitions`` keys at ``n_probes = 1`` and at ``n_probes = 8``: the mean of
      the estimates within 5 standard errors of ``||J||_F^2`` (unbiased), and their standard
      deviation within a factor 1.4 of the Rademacher formula ``sqrt(2 sum_{i != j} (J^T J)_ij^2 /
      n_probes)`` (page 6, exercise 1). With 100 repetitions the sample standard deviation is off
      by about 7-10% (one standard error), so the window is about four of them; a function that
      ignores ``n_probes`` is off by sqrt(8) at ``n_probes = 8``, one that ignores ``key`` gives 0;
    - the result is one real number.

    Known mistakes (divided by N, not squared, probes not drawn from ``key``, ``n_probes`` ignored,
    Gaussian probes) get their hints.

    Args:
        my_jacobian_penalty: your function, called as ``my_jacobian_penalty(f, z, key, n_probes)``
            with ``f`` a function of ``z`` alone (float32 arrays (N,) to (N,)), ``key`` a JAX PRNG key and
            ``n_probes`` an int >= 1; it must return one real number.
        repetitions: keys per spread check, 20 to 1000 (fewer is faster and coarser).

    Returns:
        A :class:`Report` with one line per check.

    Raises:
        TypeError: ``my_jacobian_penalty`` is not callable.
        ValueError: ``repetitions`` is not an integer in [20, 1000].

    Example:
        Grade your function; here one not written yet, as the student edition hands it out (every
        check fails, with the hint "not written yet"):

        >>> from deqlab.lab import exercises
        >>> def my_jacobian_penalty(f, z, key, n_probes):
        ...     raise NotImplementedError("your code here")
        >>> report = exercises.check_jacobian_penalty(my_jacobian_penalty)
        >>> report.passed, len(report.failed) == len(report.checks)
        (False, True)
        >>> print(report.failed[0].hint)
        your code raised NotImplementedError: your code here. not written yet: ...
    """
    _require_callable(my_jacobian_penalty, "my_jacobian_penalty", "check_jacobian_penalty")
    if isinstance(repetitions, bool) or not isinstance(repetitions, int) or not 20 <= repetitions <= 1000:
        raise ValueError(f"exercises.check_jacobian_penalty: `repetitions` must be an integer in [20, 1000], "
                         f"got {repetitions!r}.")
    usage = "my_jacobian_penalty(f, z, key, n_probes) -> one float, the mean of ||J eps||^2 over the probes"
    (diag_label, f_diag, z_diag, frob_diag, _, _), (dense_label, f, z, frob, off, gram_sq) = _penalty_problems()
    n = z.shape[0]
    checks = []

    def estimate(f, z, key, n_probes, name):
        value, failed = _call(my_jacobian_penalty, (f, z, key, n_probes), name, usage)
        if failed is None:
            value, failed = _array(value, name, (), "real", usage)
        return (None, failed) if failed is not None else (float(value), None)

    def scale_hint(mean, exact, size):
        if _close_to(mean, exact / size, 0.2):
            return f"off by the factor N = {size}: the estimate is of ||J||_F^2 itself, not divided by N " \
                   "(Bai et al.'s loss divides by N; the penalty does not)"
        if _close_to(mean, math.sqrt(exact), 0.3):
            return "yours is close to ||J||_F, not its square: square the norm, ||J eps||^2 and not ||J eps||"
        return ""

    # 1. diagonal Jacobian: Rademacher estimates are exact
    name = f"{diag_label}: worst |estimate - ||J||_F^2| / ||J||_F^2 over 3 keys (Rademacher: exact)"
    values = []
    for k in range(3):
        value, failed = estimate(f_diag, z_diag, jax.random.key(100 + k), 1, name)
        if failed is not None:
            checks.append(failed)
            break
        values.append(value)
    else:
        worst = max(abs(v - frob_diag) / frob_diag for v in values)
        hint = scale_hint(float(np.mean(values)), frob_diag, z_diag.shape[0]) or (
            "on a diagonal J every estimate from probes with entries +-1 is exactly ||J||_F^2 (page 6, exercise "
            "1); yours are not: draw Rademacher probes, as the exercise asks (Gaussian ones vary with the key)")
        checks.append(Check(name, worst, 1e-5, hint=hint))
    if not values or len(values) < 3:
        return Report("check_jacobian_penalty(my_jacobian_penalty)", tuple(checks))
    # 2. dense Jacobian: unbiased, with the Rademacher spread at 1 and 8 probes
    for n_probes in (1, 8):
        name = f"{dense_label}, n_probes = {n_probes}"
        draws = []
        for k in range(repetitions):
            value, failed = estimate(f, z, jax.random.key(1000 * n_probes + k), n_probes, name)
            if failed is not None:
                checks.append(failed)
                break
            draws.append(value)
        else:
            draws = np.asarray(draws)
            mean, sd = float(draws.mean()), float(draws.std(ddof=1))
            formula = math.sqrt(off / n_probes)
            bias = abs(mean - frob) / max(sd / math.sqrt(repetitions), formula / math.sqrt(repetitions) / 10)
            checks.append(Check(f"{name}: |mean of {repetitions} estimates - ||J||_F^2| / standard error", bias, 5.0,
                                note=f"mean {mean:.4g}, ||J||_F^2 = {frob:.4g}",
                                hint=scale_hint(mean, frob, n) or "the estimate is biased: E ||J eps||^2 = ||J||_F^2 "
                                "needs probes with E[eps eps^T] = I (independent entries of mean 0, variance 1)"))
            ratio = sd / formula
            if sd == 0:
                hint = "every key gave the same estimate: draw the probes from `key`, the key you are given"
            elif n_probes > 1 and _close_to(ratio, math.sqrt(n_probes), 0.35):
                hint = f"the spread did not shrink by sqrt(n_probes): average ||J eps||^2 over all {n_probes} probes"
            elif _close_to(sd, math.sqrt(2 * gram_sq / n_probes), 0.2):
                hint = "the spread is that of Gaussian probes: the estimator's probes are Rademacher, entries +-1"
            else:
                hint = ("the spread differs from page 6's formula for the mean of n_probes independent Rademacher "
                        "probes drawn from `key` (the ratio is in the note)")
            checks.append(Check(f"{name}: |log(spread of the estimates / Rademacher formula)|",
                                abs(math.log(ratio)) if ratio > 0 else math.inf, math.log(1.4),
                                note=f"ratio {ratio:.2f}", hint=hint))
    return Report("check_jacobian_penalty(my_jacobian_penalty)", tuple(checks))
