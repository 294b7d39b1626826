"""The hook that :mod:`deqlab.lab.exercises.grade` runs first in a submission's kernel.

:func:`install` wraps every grader of :mod:`deqlab.lab.exercises` (the package's attributes and the
chapter modules', so ``exercises.check_x`` and ``from deqlab.lab.exercises import check_x`` both get
the wrapper): each call then displays, in the cell that made it, one output of MIME type
:data:`MIME` holding a JSON record of the verdict::

    {"grader": "check_stieltjes", "passed": false, "checks": 7, "failed": 7,
     "message": "failed 7 of 7 checks: ...", "error": null}

``error`` names the exception when the grader itself raised (``GraderTimeout``, a ``TypeError`` for
what was passed); the exception is re-raised. Front ends do not render this MIME type; the grading
command reads it from the executed notebook, cell by cell.
"""

from __future__ import annotations

import functools
import importlib
import json
from typing import Any, Callable

MIME = "application/vnd.deqlab.grade+json"
_MESSAGE_CHARS = 600


def record(grader: str, report: Any = None, error: BaseException | None = None) -> dict[str, Any]:
    """The JSON record of one grader call (see the module docstring)."""
    if error is not None:
        text = f"{type(error).__name__}: {error}"
        return {"grader": grader, "passed": False, "checks": 0, "failed": 0, "message": text[:_MESSAGE_CHARS],
                "error": text[:_MESSAGE_CHARS]}
    checks = tuple(getattr(report, "checks", ()))
    failed = tuple(getattr(report, "failed", ()))
    passed = bool(getattr(report, "passed", False)) and bool(checks)
    if passed:
        message = f"passed {len(checks)} checks"
    elif not checks:
        message = f"{grader} returned no checks"
    elif all("not written yet" in c.hint for c in failed):
        message = (f"failed {len(failed)} of {len(checks)} checks: not written yet (your code raised "
                   "NotImplementedError: replace the stub with your code)")
    else:
        lines = "; ".join(c.line().replace("\n      ", " ") for c in failed)
        message = f"failed {len(failed)} of {len(checks)} checks: {lines}"
    if len(message) > _MESSAGE_CHARS:
        message = message[:_MESSAGE_CHARS - 3] + "..."
    return {"grader": grader, "passed": passed, "checks": len(checks), "failed": len(failed), "message": message,
            "error": None}


def _emit(data: dict[str, Any]) -> None:
    try:
        from IPython.display import display
    except ImportError:  # not in a kernel: a line on stdout
        print(f"{MIME} {json.dumps(data)}")
        return
    display({MIME: data}, raw=True)


def _wrap(name: str, grader: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(grader)
    def captured(*args: Any, **kwargs: Any) -> Any:
        try:
            report = grader(*args, **kwargs)
        except BaseException as error:
            _emit(record(name, error=error))
            raise
        _emit(record(name, report))
        return report

    captured.__deqlab_captured__ = True
    return captured


def install() -> list[str]:
    """Wrap every grader (idempotent); returns their names."""
    package = importlib.import_module("deqlab.lab.exercises")
    modules = [package] + [importlib.import_module(f"deqlab.lab.exercises.ch{i}") for i in range(6)]
    names = [n for n in package.__all__ if n.startswith("check_")]
    for name in names:
        original = getattr(package, name)
        if getattr(original, "__deqlab_captured__", False):
            continue
        wrapper = _wrap(name, original)
        for module in modules:
            if getattr(module, name, None) is original:
                setattr(module, name, wrapper)
    return names
