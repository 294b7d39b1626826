"""Graders of chapter 2 (free probability).

- page 1: :func:`check_stieltjes` (``my_stieltjes(eigenvalues, z)``), the empirical Stieltjes
  transform ``G_N(z) = (1/N) sum_i 1/(z - lambda_i)`` (002 Eq. 6-7).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from deqlab.lab.exercises._core import Check, Report, _array, _call, _require_callable, _time_limited

__all__ = ["check_stieltjes"]


@_time_limited
def check_stieltjes(my_stieltjes: Callable[..., Any]) -> Report:
    """Grade ``my_stieltjes(eigenvalues, z)``: the empirical Stieltjes transform
    ``G_N(z) = (1/N) sum_i (z - lambda_i)^{-1}`` at every point of ``z`` (chapter 2, page 1; 002 Eq. 6-7).

    Cases, against ``G_N`` computed by the grader in float64 (relative 1e-10 of the largest
    ``abs(G)``): the eigenvalues of a GOE matrix (N = 200, variance 1/2) at five points above the real
    axis, at points below it (``G(conj z) = conj G(z)``), on the real axis outside the spectrum (G
    real, returned complex), far away (``G ~ 1/z``), a scalar ``z`` (a scalar back) and a 2-D grid
    of ``z`` (the same shape back); and the semicircle of 002 Eq. 13: at N = 500 the empirical G
    at ``z = 1.5i`` is within ``10/N`` of ``Semicircle(0.5).stieltjes`` (linear statistics of GOE
    eigenvalues fluctuate on the scale 1/N). Known mistakes (the sign, the sum for the mean, the real
    part only) get their hints.

    Args:
        my_stieltjes: your function, called as ``my_stieltjes(eigenvalues, z)`` with ``eigenvalues`` a
            real NumPy array (N,) and ``z`` a complex scalar or array; it must return a complex
            scalar or array of ``z``'s shape.

    Returns:
        A :class:`Report` with one line per case.

    Raises:
        TypeError: ``my_stieltjes`` is not callable.

    Example:
        Grade your function; here one not written yet, as the student edition hands it out (every
        check fails, with the hint "not written yet"):

        >>> from deqlab.lab import exercises
        >>> def my_stieltjes(eigenvalues, z):
        ...     raise NotImplementedError("your code here")
        >>> report = exercises.check_stieltjes(my_stieltjes)
        >>> report.passed, len(report.failed) == len(report.checks)
        (False, True)
        >>> print(report.failed[0].hint)
        your code raised NotImplementedError: your code here. not written yet: ...

        Calling ``deqlab``'s own transform is not an answer: while the grader runs your code it
        blocks the references listed in ``exercises._forbid.FORBIDDEN["check_stieltjes"]``, and a
        call of one fails the check with "you were asked to write this yourself".
    """
    # imported here, not with the module: deqlab.theory.freeprob loads scipy's optimize, linalg and special
    # (0.5 s), which the other chapters' pages, importing every grader, do not need
    from deqlab.theory import freeprob

    _require_callable(my_stieltjes, "my_stieltjes", "check_stieltjes")
    usage = "my_stieltjes(eigenvalues, z) -> complex array of z's shape, G_N at every point of z"
    rng = np.random.default_rng(0)

    def goe_eigenvalues(n):
        g = rng.standard_normal((n, n))
        return np.linalg.eigvalsh((g + g.T) / (2 * math.sqrt(n)))  # off-diagonal variance 1/(2N): V = 1/2

    lam = goe_eigenvalues(200)
    above = np.array([0.5j, 1 + 0.2j, -1.2 + 0.1j, 0.3 + 2j, -3 + 1j])
    cases = [("five points above the real axis", above),
             ("points below the real axis", np.conj(above)),
             ("real points outside the spectrum [-1.41, 1.41]", np.array([2.0, -2.5, 10.0]) + 0j),
             ("far away, |z| = 1e6", np.array([1e6 + 1e6j])),
             ("a scalar z", np.complex128(0.7 + 0.3j)),
             ("a 2-D grid of z", (np.linspace(-2, 2, 3)[:, None] + 1j * np.linspace(0.1, 1, 4)[None, :]))]
    checks = []
    for label, z in cases:
        name = f"{label}: max |yours - G_N| / max |G_N|"
        value, failed = _call(my_stieltjes, (lam.copy(), z.copy()), name, usage)
        if failed is None:
            value, failed = _array(value, name, np.shape(z), "complex", usage)
        if failed is not None:
            if "dtype" in failed.note:
                failed = Check(failed.name, failed.error, failed.tolerance, note=failed.note,
                               hint="G(z) is complex off the real axis: keep the complex dtype (no .real, no "
                                    "float arrays); on the real axis outside the spectrum it is real-valued "
                                    "but still return it complex")
            checks.append(failed)
            continue
        exact = np.asarray(freeprob.samples(lam).stieltjes(z)).reshape(np.shape(z))
        scale = float(np.max(np.abs(exact)))
        error = float(np.max(np.abs(value - exact))) / scale
        if np.allclose(value, -exact, rtol=1e-8, atol=0):
            hint = "the sign: yours is -G_N(z) (002 Eq. 6); for Im z > 0, Im G_N(z) < 0"
        elif np.allclose(value, lam.size * exact, rtol=1e-8, atol=0):
            hint = "off by the factor N: yours is N G_N(z); G_N carries the factor 1/N (002 Eq. 7)"
        else:
            hint = ("yours differs from G_N(z) of 002 Eq. 6-7 at these points (the worst relative error is "
                    "above); compare point by point, each G_N(z) using all N eigenvalues")
        checks.append(Check(name, error, 1e-10, hint=hint))
    # the semicircle: the empirical transform of a large GOE sample converges to it, at rate 1/N.
    # N = 500: over 40 draws N |G_N(1.5i) - G(1.5i)| was at most 0.76 (mean 0.31), far inside the
    # tolerance's 10; the eigenvalues cost 27 ms here, against 0.72 s at N = 2000 (one BLAS thread).
    n = 500
    big, z = goe_eigenvalues(n), np.array([1.5j])
    name = f"semicircle limit, N = {n}, z = 1.5i: |yours - G_semicircle|"
    value, failed = _call(my_stieltjes, (big, z.copy()), name, usage)
    if failed is None:
        value, failed = _array(value, name, (1,), "complex", usage)
    if failed is not None:
        checks.append(failed)
    else:
        limit = complex(freeprob.Semicircle(0.5).stieltjes(z)[0])
        checks.append(Check(name, float(abs(value[0] - limit)), 10.0 / n,
                            hint="your transform of GOE eigenvalues does not approach the semicircle's "
                                 "G(z) = (z - sqrt(z^2 - 4V)) / 2V: see the cases above"))
    return Report("check_stieltjes(my_stieltjes)", tuple(checks))
