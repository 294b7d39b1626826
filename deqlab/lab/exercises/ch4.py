"""Graders of chapter 4 (kernel GLMs as DEQs).

- page 2: :func:`check_linear_deq` (``my_linear_deq(K, Y, lam, depth)``), the weight-tied linear
  network ``z_{r+1} = K (Y - z_r) / lam`` whose fixed point is kernel ridge regression (004 Eq. 5
  with the Gaussian family; Thm. 3).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from deqlab.lab.exercises._core import Check, Report, _array, _call, _require_callable, _time_limited

__all__ = ["check_linear_deq"]


def _path(K: np.ndarray, Y: np.ndarray, lam: float, depth: int, sign: float = -1.0) -> np.ndarray:
    z, path = np.zeros_like(Y), [np.zeros_like(Y)]
    for _ in range(depth):
        z = K @ (Y + sign * z) / lam
        path.append(z)
    return np.stack(path)


@_time_limited
def check_linear_deq(my_linear_deq: Callable[..., Any]) -> Report:
    """Grade ``my_linear_deq(K, Y, lam, depth)``: the states ``z_0 = 0, z_1, ..., z_depth`` of the tied
    linear layer ``z_{r+1} = K (Y - z_r) / lam`` (``W_1 = -K/lam``, ``W_2 = K/lam``), stacked on a new
    first axis (chapter 4, page 2; 004 Thm. 3 with the Gaussian family).

    Cases (a squared-exponential kernel on n points of [-3, 3], float64): ``lam = 2 ||K||`` (C = 1/2)
    at depth 5, the whole path against the recursion (relative 1e-10 of its largest entry); depth 0
    (the path is the single row z_0 = 0); ``Y`` with three columns (three outputs at once, shape
    (depth + 1, n, 3)); and, at depth 120 and C = 1/2, the last state against kernel ridge regression's
    fitted values ``K (K + lam I)^{-1} Y`` (the fixed point; the truncation error is C^120 < 1e-36,
    so relative 1e-9); and C = 1.5 (no contraction) at depth 20, where the path must grow as the
    recursion does, not be clipped or stopped. Known mistakes (``Y + z``, ``K * lam``, a missing row 0)
    get their hints.

    Args:
        my_linear_deq: your function, called as ``my_linear_deq(K, Y, lam, depth)`` with ``K`` (n, n) and
            ``Y`` (n,) or (n, k) float64 NumPy arrays, ``lam`` > 0 and ``depth`` >= 0; it must return an
            array of shape ``(depth + 1,) + Y.shape``.

    Returns:
        A :class:`Report` with one line per case.

    Raises:
        TypeError: ``my_linear_deq`` is not callable.

    Example:
        Grade your function; here one not written yet, as the student edition hands it out (every
        check fails, with the hint "not written yet"):

        >>> from deqlab.lab import exercises
        >>> def my_linear_deq(K, Y, lam, depth):
        ...     raise NotImplementedError("your code here")
        >>> report = exercises.check_linear_deq(my_linear_deq)
        >>> report.passed, len(report.failed) == len(report.checks)
        (False, True)
        >>> print(report.failed[0].hint)
        your code raised NotImplementedError: your code here. not written yet: ...
    """
    _require_callable(my_linear_deq, "my_linear_deq", "check_linear_deq")
    usage = "my_linear_deq(K, Y, lam, depth) -> array (depth + 1,) + Y.shape, row r = z_r, row 0 = z_0 = 0"
    rng = np.random.default_rng(4)
    n = 24
    x = np.linspace(-3.0, 3.0, n)
    K = np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2)
    norm = float(np.linalg.norm(K, 2))
    y = np.sin(x) + 0.3 * rng.standard_normal(n)
    cases = [("C = 1/2, depth 5", y, 2 * norm, 5), ("depth 0", y, 2 * norm, 0),
             ("three outputs, Y of shape (n, 3), depth 4", np.c_[y, np.cos(x), x / 3], 2 * norm, 4),
             ("C = 1.5 (not a contraction), depth 20", y, norm / 1.5, 20)]
    checks = []
    for label, Y, lam, depth in cases:
        name = f"{label}: max |yours - z_r| / max |z_r| over the path"
        value, failed = _call(my_linear_deq, (K.copy(), Y.copy(), lam, depth), name, usage)
        if failed is None:
            value, failed = _array(value, name, (depth + 1,) + Y.shape, "real", usage)
        if failed is not None:
            if failed.note.startswith("shape") and depth > 0:
                failed = Check(failed.name, failed.error, failed.tolerance, note=failed.note,
                               hint=f"return depth + 1 = {depth + 1} rows, z_0 = 0 first: {usage}")
            checks.append(failed)
            continue
        exact = _path(K, Y, lam, depth)
        scale = max(float(np.max(np.abs(exact))), 1.0 if depth == 0 else 0.0)
        error = float(np.max(np.abs(value - exact))) / scale
        if depth and np.allclose(value, _path(K, Y, lam, depth, sign=1.0), rtol=1e-10, atol=0):
            hint = ("the sign: yours is the path of z = K (Y + z) / lam; the layer of page 2 has W_1 = -K/lam "
                    "(004 Thm. 3 with the Gaussian family)")
        elif depth and np.allclose(value, _path(K, Y, 1 / lam, depth), rtol=1e-10, atol=0):
            hint = "divide by lam, do not multiply: yours matches lam K where the layer's weights are K / lam"
        else:
            hint = ("your rows differ from the states z_r of the recursion z_{r+1} = K (Y - z_r) / lam from "
                    "z_0 = 0 (page 2; 004 Thm. 3): compare them row by row, the first wrong row shows the slip")
        wrong_rows = np.nonzero(np.max(np.abs(value - exact).reshape(depth + 1, -1), axis=1) > 1e-10 * scale)[0]
        note = f"first wrong row: r = {wrong_rows[0]}" if error > 1e-10 and wrong_rows.size else ""
        checks.append(Check(name, error, 1e-10, hint=hint, note=note))
    # the fixed point is kernel ridge regression
    depth, lam = 120, 2 * norm
    name = f"C = 1/2, depth {depth}: last state vs K (K + lam I)^-1 Y (kernel ridge regression)"
    value, failed = _call(my_linear_deq, (K.copy(), y.copy(), lam, depth), name, usage)
    if failed is None:
        value, failed = _array(value, name, (depth + 1, n), "real", usage)
    if failed is not None:
        checks.append(failed)
    else:
        krr = K @ np.linalg.solve(K + lam * np.eye(n), y)
        checks.append(Check(name, float(np.max(np.abs(value[-1] - krr)) / np.max(np.abs(krr))), 1e-9,
                            note=f"C^{depth} = {0.5**depth:.0e}",
                            hint="the fixed point of z = K (Y - z) / lam is K (K + lam I)^-1 Y: see the cases above"))
    return Report("check_linear_deq(my_linear_deq)", tuple(checks))
