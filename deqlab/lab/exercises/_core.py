"""The machinery shared by every grader: :class:`Report` and :class:`Check`, the time limit, and the
helpers that turn your code's exceptions and wrong shapes into failed checks with hints.

The graders themselves are in one module per chapter (:mod:`.ch0` ... :mod:`.ch5`); import them
from :mod:`deqlab.lab.exercises`.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import html
import math
import os
import sys
import threading
from typing import Any, Callable

import jax
import numpy as np

__all__ = ["Check", "Report", "ExerciseFailed", "GraderTimeout", "TIME_LIMIT"]


class ExerciseFailed(AssertionError):
    """Raised by :meth:`Report.raise_if_failed` when some check of a grader failed."""


class GraderTimeout(TimeoutError):
    """Raised by a grader that did not finish within its time limit (see the module docstring)."""


TIME_LIMIT = 300.0
"""Default time limit of a grader, in seconds (overridden by ``DEQLAB_GRADER_TIME_LIMIT``, and per
call by ``time_limit=``)."""


class _Stop(BaseException):
    """Raised asynchronously in a grader's worker thread at its time limit (a BaseException: the
    graders' and your ``except Exception`` do not swallow it)."""


def _time_limit(value: Any, where: str) -> float:
    from deqlab import checks

    if value is None:
        env = os.environ.get("DEQLAB_GRADER_TIME_LIMIT")
        if env is None:
            # read through the package, so that `exercises.TIME_LIMIT = 60` applies to every grader
            default = getattr(sys.modules.get("deqlab.lab.exercises"), "TIME_LIMIT", TIME_LIMIT)
            return checks.positive_number(default, "exercises.TIME_LIMIT", where)
        try:
            value = float(env)
        except ValueError:
            raise checks.fail("DEQLAB_GRADER_TIME_LIMIT", "a number of seconds > 0 (or 'inf')", env, where) from None
        name = "DEQLAB_GRADER_TIME_LIMIT"
    else:
        name = "time_limit"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == math.inf:
        return math.inf
    return checks.number(value, name, where, lower=0.0, lower_open=True)


_RUNNING = threading.local()
"""``_RUNNING.grader``: the name of the grader running in this thread (see :func:`_student_code`)."""


def _as_current(name: str, grader: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    previous = getattr(_RUNNING, "grader", None)
    _RUNNING.grader = name
    try:
        return grader(*args, **kwargs)
    finally:
        _RUNNING.grader = previous


@contextlib.contextmanager
def _student_code():
    """Run the reader's code: the library references that the running grader forbids (listed in
    :data:`deqlab.lab.exercises._forbid.FORBIDDEN`) raise ``ReferenceBlocked`` inside the block."""
    from deqlab.lab.exercises._forbid import blocked

    with blocked(getattr(_RUNNING, "grader", None) or ""):
        yield


def _time_limited(grader: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``grader`` in a worker thread, at most ``time_limit`` seconds (the module docstring)."""
    where = f"exercises.{grader.__name__}"

    @functools.wraps(grader)
    def wrapper(*args: Any, time_limit: float | None = None, **kwargs: Any) -> Any:
        limit = _time_limit(time_limit, where)
        if limit == math.inf:
            return _as_current(grader.__name__, grader, args, kwargs)
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = _as_current(grader.__name__, grader, args, kwargs)
            except _Stop:
                pass
            except BaseException as error:  # noqa: BLE001 - re-raised in the calling thread
                box["error"] = error

        thread = threading.Thread(target=target, name=where, daemon=True)
        thread.start()
        thread.join(limit)
        if thread.is_alive():
            # interrupt a Python loop at its next bytecode; a compiled loop runs on in the background
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_Stop))
            thread.join(1.0)
            from deqlab.lab.exercises._forbid import release

            release(thread.ident)  # a call that runs on must not leave deqlab's references blocked
            raise GraderTimeout(
                f"{where} did not finish within its time limit of {limit:g} s: the code it grades probably "
                "never returns (a loop whose stopping test is never met?). Raise the limit with "
                f"{grader.__name__}(..., time_limit=seconds), for every grader with exercises.TIME_LIMIT or "
                "the environment variable DEQLAB_GRADER_TIME_LIMIT.")
        if "error" in box:
            raise box["error"]
        return box["value"]

    return wrapper


@dataclasses.dataclass(frozen=True)
class Check:
    """One line of a :class:`Report`: ``error`` is compared with ``tolerance`` (``error <= tolerance``
    passes; NaN never does). ``hint`` is shown when the check fails.

    Attributes:
        name: what is checked.
        error: the measured error.
        tolerance: the largest error that passes.
        hint: shown when the check fails.
        note: shown after the numbers.

    Example:
        >>> from deqlab.lab.exercises import Check
        >>> Check("max |yours - deqlab's|", 0.5, 1e-6, hint="check the sign").passed
        False
    """

    name: str
    error: float
    tolerance: float
    hint: str = ""
    note: str = ""

    @property
    def passed(self) -> bool:
        """True when ``error <= tolerance`` (a NaN or infinite error never passes)."""
        return bool(np.isfinite(self.error) and self.error <= self.tolerance)

    def line(self) -> str:
        """The check as one line of text (PASS/FAIL, the numbers, and the hint when it fails)."""
        mark = "PASS" if self.passed else "FAIL"
        text = f"{mark}  {self.name}: {_number(self.error)} (tolerance {_number(self.tolerance)})"
        if self.note:
            text += f"; {self.note}"
        if not self.passed and self.hint:
            text += f"\n      hint: {self.hint}"
        return text


def _number(value: float) -> str:
    if not np.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.1e}"


@dataclasses.dataclass(frozen=True)
class Report:
    """The verdict of a grader: ``title`` and its :class:`Check` lines.

    Attributes:
        title: the grader's call, e.g. ``check_stieltjes(my_stieltjes)``.
        checks: its checks, in order.

    Example:
        >>> from deqlab.lab.exercises import Check, Report
        >>> report = Report("check_x(my_x)", (Check("a", 0.0, 1e-6), Check("b", 1.0, 1e-6)))
        >>> report.passed, [c.name for c in report.failed]
        (False, ['b'])
    """

    title: str
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        """True when every check passed."""
        return all(c.passed for c in self.checks)

    @property
    def failed(self) -> tuple[Check, ...]:
        """The checks that failed."""
        return tuple(c for c in self.checks if not c.passed)

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        verdict = "passed" if self.passed else f"FAILED ({len(self.failed)} of {len(self.checks)} checks)"
        return "\n".join([f"{self.title}: {verdict}"] + ["  " + c.line() for c in self.checks])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        color = "#1a7f37" if self.passed else "#cf222e"
        verdict = "passed" if self.passed else f"FAILED ({len(self.failed)} of {len(self.checks)} checks)"
        rows = []
        for c in self.checks:
            mark = "&#10004;" if c.passed else "&#10008;"
            hint = "" if c.passed or not c.hint else f"<br><i>hint: {html.escape(c.hint)}</i>"
            note = f" ({html.escape(c.note)})" if c.note else ""
            rows.append(
                f"<tr><td style='color:{'#1a7f37' if c.passed else '#cf222e'}'>{mark}</td>"
                f"<td style='text-align:left'>{html.escape(c.name)}{note}{hint}</td>"
                f"<td>{_number(c.error)}</td><td>{_number(c.tolerance)}</td></tr>"
            )
        return (
            f"<div><b>{html.escape(self.title)}</b>: <span style='color:{color}'><b>{verdict}</b></span>"
            "<table><thead><tr><th></th><th style='text-align:left'>check</th><th>error</th>"
            f"<th>tolerance</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
        )

    def raise_if_failed(self) -> "Report":
        """Raise :class:`ExerciseFailed` (an ``AssertionError``) naming the failed checks; return
        the report otherwise (so that ``check_x(f).raise_if_failed()`` still displays it)."""
        if not self.passed:
            raise ExerciseFailed(str(self))
        return self


# --------------------------------------------------------------------------------------------
# Helpers


def _require_callable(value: Any, name: str, where: str) -> None:
    if not callable(value):
        raise TypeError(f"exercises.{where}: `{name}` must be a callable (your function), got "
                        f"{type(value).__name__}.")


def _crashed(name: str, error: BaseException, hint: str) -> Check:
    from deqlab.lab.exercises._forbid import ReferenceBlocked

    message = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    if isinstance(error, ReferenceBlocked):
        return Check(name, math.inf, 0.0, hint=f"{error}.")
    if isinstance(error, NotImplementedError):  # the student edition's stub (.ci/student_edition.py)
        hint = f"not written yet: replace `raise NotImplementedError` with your code. {hint}"
    return Check(name, math.inf, 0.0, hint=f"your code raised {message}. {hint}".strip())


def _relative(a, b) -> float:
    """max |a - b| / max |b| over every leaf (pytrees of equal structure); inf on a shape mismatch."""
    a_leaves, b_leaves = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    if len(a_leaves) != len(b_leaves) or any(np.shape(x) != np.shape(y) for x, y in zip(a_leaves, b_leaves)):
        return math.inf
    diff = max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) for x, y in
               zip(a_leaves, b_leaves))
    size = max(float(np.max(np.abs(np.asarray(y, np.float64)))) for y in b_leaves)
    return diff / max(size, 1e-300)


_REFERENCES: dict = {}
"""deqlab's answers on the graders' fixed problems, computed once per process: they do not depend
on the code being graded, and computing them (compiling the solves) is most of a grader's time."""


def _reference(key: tuple, compute: Callable[[], Any]) -> Any:
    if key not in _REFERENCES:
        _REFERENCES[key] = jax.tree_util.tree_map(np.asarray, compute())
    return _REFERENCES[key]


def _call(fn: Callable[..., Any], args: tuple, name: str, usage: str, kwargs: dict | None = None):
    """Call the reader's ``fn(*args, **kwargs)``: ``(value, None)``, or ``(None, failed Check)`` naming the
    exception (a ``TypeError`` from the call itself is reported as a wrong signature, with ``usage``)."""
    try:
        with _student_code():
            return fn(*args, **(kwargs or {})), None
    except TypeError as error:
        return None, _crashed(name, error, f"check the signature: call it as {usage}.")
    except (Exception, SystemExit) as error:  # noqa: BLE001 - reported as a failed check (sys.exit() included)
        return None, _crashed(name, error, f"it is called as {usage}.")


def _array(value: Any, name: str, shape: tuple, kind: str, usage: str):
    """``value`` as a NumPy array of ``shape`` and ``kind`` ("real", "complex" or "integer"):
    ``(array, None)``, or ``(None, failed Check)`` saying what was expected."""
    try:
        array = np.asarray(value)
    except Exception as error:  # noqa: BLE001
        return None, _crashed(name, error, f"return an array: {usage}.")
    if array.shape != tuple(shape) and not (shape == () and array.size == 1):
        return None, Check(name, math.inf, 0.0, note=f"shape {array.shape}, expected {tuple(shape)}",
                           hint=f"wrong shape: {usage}.")
    array = array.reshape(shape)
    dtype = array.dtype
    ok = {"real": np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer),
          "complex": np.issubdtype(dtype, np.complexfloating),
          "integer": np.issubdtype(dtype, np.integer)}[kind]
    if not ok:
        expected = {"real": "a real (float) dtype", "complex": "a complex dtype",
                    "integer": "an integer dtype"}[kind]
        return None, Check(name, math.inf, 0.0, note=f"dtype {dtype}, expected {expected}",
                           hint=f"wrong dtype: {usage}.")
    return array, None


def _close_to(value: float, target: float, rtol: float = 1e-6) -> bool:
    """True when ``value`` is within ``rtol`` (relative) of ``target``: used to recognise a typical
    wrong answer and give its hint."""
    return bool(np.isfinite(value) and abs(value - target) <= rtol * max(abs(target), 1e-300))
