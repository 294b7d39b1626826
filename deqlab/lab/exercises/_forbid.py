"""The library references each grader blocks while it runs the reader's code.

An *implement* exercise asks the reader to write, by hand, a function that ``deqlab`` already has
(the empirical Stieltjes transform, Hutchinson's estimator, the copy-memory batch, ...). Calling
that function is not an answer: while a grader runs the reader's code, each reference listed for it
in :data:`FORBIDDEN` is replaced by one that raises :class:`ReferenceBlocked` ("you were asked to
write this yourself"), which the grader reports as a failed check. The grader's own comparisons run
after the reader's call, with the references restored.

How: a reference that is a plain Python function (every one listed) has its ``__code__`` swapped for
the duration of the call, so that every alias of it is blocked too (``from deqlab.theory.freeprob
import samples``, a bound method, a name in the notebook); anything else is replaced by name in the
``deqlab`` modules and the notebook's namespace (``__main__``) that hold it. This stops the shortcut
of calling the reference, not a determined attempt to get around the grader (copying ``deqlab``'s
source into the answer is not detected): graders run in the reader's own process.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from typing import Any, Iterator

__all__ = ["FORBIDDEN", "ReferenceBlocked", "blocked", "release"]


class ReferenceBlocked(RuntimeError):
    """Raised by a ``deqlab`` reference that a grader blocks while it runs the reader's code."""


FORBIDDEN: dict[str, tuple[str, ...]] = {
    # chapter 0
    "check_layer": ("deqlab.lab.experiments.practice:tanh_map",),
    "check_weight_tied": ("deqlab.lab.experiments.practice:weight_tied_depth",),
    "check_residual": ("deqlab.solvers.flatten:relative_residual",),
    "check_solver": ("deqlab.solvers.api:solve", "deqlab.backward.api:fixed_point"),
    "check_implicit_gradient": ("deqlab.backward.api:fixed_point", "deqlab.solvers.api:solve"),
    "check_classifier": ("deqlab.nn.deq:DEQ.__call__", "deqlab.lab.experiments.practice:DigitsClassifier.__call__"),
    "check_train_step": ("deqlab.lab.experiments.practice:train_digits",),
    # chapters 1-5
    "check_length_trace": ("deqlab.lab.experiments.linear:trace_sweep", "deqlab.lab.experiments.linear:tied_traces"),
    # (PointMasses.mgf too: G(z) = (1 + M(z)) / z, found by an instructor's dry run)
    "check_stieltjes": ("deqlab.theory.freeprob.spectra:samples", "deqlab.theory.freeprob.spectra:PointMasses.stieltjes",
                        "deqlab.theory.freeprob.spectra:PointMasses.mgf"),
    "check_mean_difference": ("deqlab.lab.stats:mean_se",),
    "check_jacobian_penalty": ("deqlab.stability:jacobian_penalty",),
    "check_linear_deq": ("deqlab.theory.kglm.models:deq_map", "deqlab.theory.kglm.models:deq_predict",
                         "deqlab.theory.kglm.models:kglm_predict"),
    "check_copy_memory": ("deqlab.lab.data:copy_memory",),
    "check_semi_orthogonal": ("deqlab.ensembles:_haar", "deqlab.ensembles:initializer", "deqlab.ensembles:sample"),
    "check_table1": ("deqlab.lab.experiments.sequence.ensemble_study:summarize",),
}
"""For each grader, the references (``"module:qualified.name"``) it blocks while the reader's code runs."""

_LOCK = threading.RLock()
_PATCHED: dict[str, tuple[int, Any]] = {}
"""Each blocked reference: (how many open blocks hold it, how to restore it)."""
_ACTIVE: dict[int, list[list[str]]] = {}
"""The targets of the blocks open in each thread (by thread id), for :func:`release`."""


def _resolve(target: str) -> tuple[Any, str, Any]:
    module_name, _, qualname = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    *path, attribute = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, attribute, getattr(owner, attribute)


def _raiser(target: str, grader: str):
    name = target.replace(":", ".")
    message = (f"your code called {name}: you were asked to write this yourself, so {grader} blocks "
               "deqlab's version while it runs your code; write the computation with NumPy/JAX")
    namespace: dict[str, Any] = {}
    # self-contained code (no globals, no closure): it can replace the code of a function of any module
    exec(  # noqa: S102 - a fixed template
        "def blocked(*args, **kwargs):\n"
        "    raise __import__('deqlab.lab.exercises._forbid', fromlist=['ReferenceBlocked'])"
        f".ReferenceBlocked({message!r})\n", {}, namespace)
    return namespace["blocked"]


def _block(target: str, grader: str) -> None:
    count, restore = _PATCHED.get(target, (0, None))
    if count == 0:
        owner, attribute, original = _resolve(target)
        raiser = _raiser(target, grader)
        code = getattr(original, "__code__", None)
        if code is not None and not code.co_freevars and hasattr(original, "__defaults__"):
            original.__code__ = raiser.__code__
            restore = ("code", original, code)
        else:
            holders = [(owner, attribute)]
            for name, module in list(sys.modules.items()):
                if module is None or not (name.startswith("deqlab") or name == "__main__"):
                    continue
                for key, value in list(vars(module).items()):
                    if value is original and (module, key) != (owner, attribute):
                        holders.append((module, key))
            for holder, key in holders:
                setattr(holder, key, raiser)
            restore = ("attr", holders, original)
    _PATCHED[target] = (count + 1, restore)


def _unblock(target: str) -> None:
    count, restore = _PATCHED[target]
    if count > 1:
        _PATCHED[target] = (count - 1, restore)
        return
    del _PATCHED[target]
    if restore[0] == "code":
        restore[1].__code__ = restore[2]
    else:
        for holder, key in restore[1]:
            setattr(holder, key, restore[2])


@contextlib.contextmanager
def blocked(grader: str) -> Iterator[None]:
    """Block the references of ``grader`` (see :data:`FORBIDDEN`) for the duration of the block."""
    targets: list[str] = []
    thread = threading.get_ident()
    with _LOCK:
        try:
            for target in FORBIDDEN.get(grader, ()):
                _block(target, grader)
                targets.append(target)
        except BaseException:
            for target in reversed(targets):
                _unblock(target)
            raise
        _ACTIVE.setdefault(thread, []).append(targets)
    try:
        yield
    finally:
        _close(targets, thread)


def _close(targets: list[str], thread: int) -> None:
    with _LOCK:
        stack = _ACTIVE.get(thread, [])
        if not any(entry is targets for entry in stack):
            return  # released already (see release)
        stack[:] = [entry for entry in stack if entry is not targets]
        if not stack:
            _ACTIVE.pop(thread, None)
        for target in reversed(targets):
            _unblock(target)


def release(thread_id: int) -> None:
    """Close every block opened by thread ``thread_id``: a grader calls it when the reader's code
    outlives its time limit, so that a call that never returns leaves no reference blocked."""
    with _LOCK:
        for targets in reversed(list(_ACTIVE.get(thread_id, []))):
            _close(targets, thread_id)
