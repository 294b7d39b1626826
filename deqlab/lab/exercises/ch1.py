"""Graders of chapter 1 (linear DEQs).

- page 3: :func:`check_length_trace` (``my_length_trace(w0, V)``), the normalised trace
  ``tr[(M^T M)^2]``, ``M = (I - sqrt(V) W0)^{-1}``, behind the length variance (001 Lemma 2.2).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from deqlab.lab.exercises._core import (
    Check,
    Report,
    _array,
    _call,
    _close_to,
    _require_callable,
    _time_limited,
)

__all__ = ["check_length_trace"]


def _trace(w0: np.ndarray, V: float, power: int = 2, weight: float | None = None, normalised: bool = True) -> float:
    """``tr[(M^T M)^power]`` with ``M = (I - weight W0)^{-1}`` (weight = sqrt(V) unless given), from the
    singular values of ``I - weight W0``: ``mean(sigma^(-2 power))`` (``sum`` when not normalised)."""
    weight = math.sqrt(V) if weight is None else weight
    sigma = np.linalg.svd(np.eye(len(w0)) - weight * w0, compute_uv=False)
    values = sigma ** (-2.0 * power)
    return float(np.mean(values) if normalised else np.sum(values))


def _draw(ensemble: str, n: int, seed: int) -> np.ndarray:
    """W0 of chapter 1's ensembles (variance 1/N per entry, 001 §2), drawn with NumPy from ``seed``."""
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((n, n))
    if ensemble == "gaussian":
        return g / math.sqrt(n)
    if ensemble == "goe":
        return (g + g.T) / math.sqrt(2 * n)
    q, r = np.linalg.qr(g)
    return q * np.sign(np.diag(r))


@_time_limited
def check_length_trace(my_length_trace: Callable[..., Any]) -> Report:
    """Grade ``my_length_trace(w0, V)``: the normalised trace ``tr[(M^T M)^2] = (1/N) Tr[(M^T M)^2]``
    with ``M = (I - sqrt(V) W0)^{-1}``, one float (chapter 1, page 3; 001 Lemma 2.2 and Definition 2.1:
    the length variance of a tied linear DEQ is twice its average over W0).

    Cases, each against the exact trace computed by the grader in float64 (relative 1e-8): a GOE ``W0`` (N = 64, V = 0.2, symmetric: its eigenvalues
    suffice), a GOE close to its critical point (V = 0.24, V_c = 1/4), a Haar-orthogonal one (N = 64,
    V = 0.6, normal), a Ginibre one (N = 48, V = 0.3, *not* normal: eigenvalues alone give a wrong
    answer), and V = 0 (M = I, trace 1). A wrong answer that is a known mistake (the unnormalised
    trace, V for sqrt(V), tr[M^T M], the eigenvalue shortcut on a non-normal W0) gets its hint.

    Args:
        my_length_trace: your function, called as ``my_length_trace(w0, V)`` with ``w0`` a float64
            NumPy array (N, N) and ``V`` a float; it must return one real number.

    Returns:
        A :class:`Report` with one line per case.

    Raises:
        TypeError: ``my_length_trace`` is not callable.

    Example:
        Grade your function; here one not written yet, as the student edition hands it out (every
        check fails, with the hint "not written yet"):

        >>> from deqlab.lab import exercises
        >>> def my_length_trace(w0, V):
        ...     raise NotImplementedError("your code here")
        >>> report = exercises.check_length_trace(my_length_trace)
        >>> report.passed, len(report.failed) == len(report.checks)
        (False, True)
        >>> print(report.failed[0].hint)
        your code raised NotImplementedError: your code here. not written yet: ...
    """
    _require_callable(my_length_trace, "my_length_trace", "check_length_trace")
    usage = "my_length_trace(w0, V) -> one float, the normalised trace tr[(M^T M)^2]"
    cases = [("GOE, N = 64, V = 0.2", "goe", 64, 0.2, 0), ("GOE near V_c = 1/4, N = 64, V = 0.24", "goe", 64, 0.24, 1),
             ("orthogonal, N = 64, V = 0.6", "orthogonal", 64, 0.6, 2),
             ("Ginibre (not normal), N = 48, V = 0.3", "gaussian", 48, 0.3, 3),
             ("V = 0 (M = I)", "gaussian", 16, 0.0, 4)]
    checks = []
    for label, ensemble, n, V, seed in cases:
        w0 = _draw(ensemble, n, seed)
        name = f"{label}: |yours - tr[(M^T M)^2]| / tr"
        value, failed = _call(my_length_trace, (w0.copy(), V), name, usage)
        if failed is None:
            value, failed = _array(value, name, (), "real", usage)
        if failed is not None:
            checks.append(failed)
            continue
        mine, exact = float(value), _trace(w0, V)
        eigenvalues = np.linalg.eigvals(w0)
        known = [
            (_trace(w0, V, normalised=False), "yours is N times too large, the unnormalised trace Tr: the length "
                                              "variance uses the normalised trace tr = Tr / N (001 Definition 2.1)"),
            (_trace(w0, V, weight=V), "yours is the trace for M = (I - V W0)^-1: the weight is W = sqrt(V) W0, "
                                      "not V W0 (V is the variance of W's entries times N)"),
            (_trace(w0, V, power=1), "that is tr[M^T M], the second moment: the length variance needs the "
                                     "fourth, tr[(M^T M)^2] (001 Lemma 2.2)"),
            (float(np.mean(np.abs(1 - math.sqrt(V) * eigenvalues) ** -4.0)),
             "yours matches the eigenvalue shortcut, right only for a normal W0 (symmetric or orthogonal): "
             "this Ginibre W0 is not normal, and the moduli of its eigenvalues are not singular values"),
        ]
        hint = next((h for target, h in known if not _close_to(exact, target, 1e-6) and _close_to(mine, target, 1e-6)),
                    f"yours is {mine:.6g}, the normalised trace tr[(M^T M)^2] with M = (I - sqrt(V) W0)^-1 is "
                    f"{exact:.6g} here (001 Lemma 2.2)")
        checks.append(Check(name, abs(mine - exact) / exact, 1e-8, hint=hint))
    return Report("check_length_trace(my_length_trace)", tuple(checks))
