"""Graders of chapter 5 (DEQ transformers).

- page 2: :func:`check_copy_memory` (``my_copy_memory(key, batch_size, delay, memory, symbols)``),
  the copy-memory task of 003 §5.1 / Table 1.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import numpy as np

from deqlab.lab import data
from deqlab.lab.exercises._core import Check, Report, _array, _call, _require_callable, _time_limited

__all__ = ["check_copy_memory"]


@_time_limited
def check_copy_memory(my_copy_memory: Callable[..., Any]) -> Report:
    """Grade ``my_copy_memory(key, batch_size, delay, memory, symbols)``: a batch ``(x, y)`` of the
    copy-memory task (chapter 5, page 2; 003 §5.1): ``x`` is ``memory`` symbols uniform on
    ``1..symbols``, ``delay - 1`` blanks (0) and ``memory + 1`` markers (9); ``y`` is blank for
    ``delay + memory`` steps, then the symbols. Both are integer arrays (batch_size, delay + 2 memory).

    Per configuration (T = 10, m = 10, s = 8, the page's; T = 1, no blanks; m = 3, s = 4): the layout
    (blanks, markers, the target's blanks and its copy of the symbols), and the same batch as
    ``deqlab.lab.data.copy_memory`` from the same key (``jax.random.randint(key, (B, m), 1, s + 1)``).
    The law: 4000 symbols from one call (T = 5, m = 10, s = 8) must all lie in 1..8 and each symbol's
    count must be within 5 binomial standard deviations of 500 (a right generator fails this with
    probability below 1e-5). A generator with another random stream but the right law passes every
    check but the same-key one.

    Args:
        my_copy_memory: your function, called as ``my_copy_memory(key, batch_size, delay, memory, symbols)``
            (positional) with a JAX PRNG key and ints; it must return ``(x, y)``.

    Returns:
        A :class:`Report` with one line per check.

    Raises:
        TypeError: ``my_copy_memory`` is not callable.

    Example:
        Grade your function; here one not written yet, as the student edition hands it out (every
        check fails, with the hint "not written yet"):

        >>> from deqlab.lab import exercises
        >>> def my_copy_memory(key, batch_size, delay, memory=10, symbols=8):
        ...     raise NotImplementedError("your code here")
        >>> report = exercises.check_copy_memory(my_copy_memory)
        >>> report.passed, len(report.failed) == len(report.checks)
        (False, True)
        >>> print(report.failed[0].hint)
        your code raised NotImplementedError: your code here. not written yet: ...
    """
    _require_callable(my_copy_memory, "my_copy_memory", "check_copy_memory")
    usage = ("my_copy_memory(key, batch_size, delay, memory, symbols) -> (x, y), integer arrays "
             "(batch_size, delay + 2 * memory)")
    checks = []

    def batch(key, b, t, m, s, name):
        value, failed = _call(my_copy_memory, (key, b, t, m, s), name, usage)
        if failed is None:
            try:
                x, y = value
            except (TypeError, ValueError):
                return None, Check(name, math.inf, 0.0, hint=f"return a pair (x, y): {usage}",
                                   note=f"got {type(value).__name__}")
            x, failed = _array(x, name, (b, t + 2 * m), "integer", usage)
            if failed is None:
                y, failed = _array(y, name, (b, t + 2 * m), "integer", usage)
        if failed is not None:
            if failed.note.startswith("shape"):
                failed = Check(failed.name, failed.error, failed.tolerance, note=failed.note,
                               hint=f"the length is delay + 2 * memory = {t} + {2 * m}: memory symbols, delay - 1 "
                                    "blanks, memory + 1 markers")
            return None, failed
        return (x, y), None

    for label, b, t, m, s, seed in (("T = 10, m = 10, s = 8", 4, 10, 10, 8, 7), ("T = 1 (no blanks)", 3, 1, 10, 8, 8),
                                    ("T = 6, m = 3, s = 4", 5, 6, 3, 4, 9)):
        key = jax.random.key(seed)
        name = f"{label}: layout, entries that break it"
        mine, failed = batch(key, b, t, m, s, name)
        if failed is not None:
            checks.append(failed)
            continue
        x, y = mine
        wrong = (int(np.sum(x[:, m:m + t - 1] != 0)) + int(np.sum(x[:, m + t - 1:] != 9))
                 + int(np.sum(y[:, :t + m] != 0)) + int(np.sum(y[:, t + m:] != x[:, :m]))
                 + int(np.sum((x[:, :m] < 1) | (x[:, :m] > s))))
        checks.append(Check(name, wrong, 0, hint=(
            "x = [m symbols in 1..s, delay - 1 blanks (0), memory + 1 markers (9)]; y = [delay + memory blanks, "
            "the m symbols of x]; symbols are 1..s, 0 is the blank: jax.random.randint's maxval is exclusive")))
        theirs = data.copy_memory(key, batch_size=b, delay=t, memory=m, symbols=s)
        differ = int(np.sum(x != np.asarray(theirs[0]))) + int(np.sum(y != np.asarray(theirs[1])))
        checks.append(Check(f"{label}: entries that differ from deqlab's batch from the same key", differ, 0,
                            hint="draw the symbols in one call from the key you are given: "
                                 "jax.random.randint(key, (batch_size, memory), 1, symbols + 1)"))
    name = "4000 symbols: the largest |count - 500| / binomial standard deviation over 1..8"
    mine, failed = batch(jax.random.key(3), 400, 5, 10, 8, name)
    if failed is not None:
        checks.append(failed)
    else:
        symbols = mine[0][:, :10].ravel()
        counts = np.array([np.sum(symbols == v) for v in range(1, 9)])
        outside = symbols.size - counts.sum()
        sd = math.sqrt(symbols.size * (1 / 8) * (7 / 8))
        worst = math.inf if outside else float(np.max(np.abs(counts - symbols.size / 8)) / sd)
        checks.append(Check(name, worst, 5.0, note=f"{outside} symbols outside 1..8" if outside else "",
                            hint="symbols uniform on 1..symbols: jax.random.randint(key, shape, 1, symbols + 1)"))
    return Report("check_copy_memory(my_copy_memory)", tuple(checks))
