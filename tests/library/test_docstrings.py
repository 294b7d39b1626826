"""The library's docstrings are self-contained and their examples run.

Two checks over the public API of the modules in :data:`MODULES`:

(a) **Sections.** The public names of a module are its ``__all__`` (or, without one, the functions
    and classes defined in it whose names do not start with ``_``). Constants (tuples, dicts, ints)
    are documented by the comment or string next to them and are not checked. The rule:

    * every public function and class has a docstring with an ``Example:`` section of doctest lines
      (``>>>``); exceptions, warnings and enums are exempt from the example (they are raised or
      read, not called), but still need a docstring;
    * a function with parameters has ``Args:``; a function that returns something (any return
      annotation other than ``None``) has ``Returns:``; a function whose source raises or calls a
      :mod:`deqlab.checks` validator has ``Raises:``;
    * a class whose ``__init__`` takes parameters has ``Args:`` (a hand-written ``__init__``) or
      ``Attributes:`` (a dataclass or NamedTuple, whose fields are the parameters);
    * a public method (defined in the class body, ``__call__`` included) has a docstring, and
      ``Args:`` when it takes parameters besides ``self``; a method that overrides a documented
      method of a base class in the library shares its contract and inherits its docstring
      (``inspect.getdoc`` and Sphinx's autodoc do), so it needs none of its own.

(b) **Examples.** Every docstring's doctest runs (``doctest.DocTestFinder`` + ``DocTestRunner``)
    with empty globals, so each example imports what it uses (as a reader copying it would), in
    float32 (``jax_enable_x64`` off) on the CPU.

To cover a new module, add it to :data:`MODULES`.
"""

from __future__ import annotations

import doctest
import enum
import importlib
import inspect
import re
import typing

import jax
import pytest

#: Modules whose public API is checked and whose examples run (a package's submodules are listed
#: one by one: doctest finds an object only in the module that defines it).
MODULES = (
    "deqlab",
    "deqlab.precision",
    "deqlab.stability",
    "deqlab.ensembles",
    "deqlab.failures",
    "deqlab.checks",
    "deqlab._draws",
    "deqlab.nonlinearities",
    "deqlab.nn",
    "deqlab.nn.deq",
    "deqlab.nn.cache",
    "deqlab.solvers.budget",
    "deqlab.nn.cells",
    "deqlab.nn.lm",
    "deqlab.nn.transformer",
    "deqlab.nn.trellis",
    "deqlab.nn.dropout",
    "deqlab.nn.normalization",
    "deqlab.nn.baselines",
    "deqlab.theory.linear",
    "deqlab.theory.meanfield",
    "deqlab.theory.freeprob",
    "deqlab.theory.freeprob.transforms",
    "deqlab.theory.freeprob.spectra",
    "deqlab.theory.freeprob.products",
    "deqlab.theory.freeprob.jacobians",
    "deqlab.theory.freeprob.double_scaling",
    "deqlab.theory.freeprob.pencils",
    "deqlab.theory.kglm",
    "deqlab.theory.kglm.families",
    "deqlab.theory.kglm.models",
    "deqlab.theory.kglm.kernels",
    "deqlab.theory.kglm.examples",
    "deqlab.solvers",
    "deqlab.solvers.solution",
    "deqlab.solvers.base",
    "deqlab.solvers.picard",
    "deqlab.solvers.anderson",
    "deqlab.solvers.broyden",
    "deqlab.solvers.history",
    "deqlab.solvers.flatten",
    "deqlab.solvers.loop",
    "deqlab.solvers.registry",
    "deqlab.solvers.api",
    "deqlab.backward",
    "deqlab.backward.base",
    "deqlab.backward.linear",
    "deqlab.backward.adjoint",
    "deqlab.backward.implicit",
    "deqlab.backward.unrolled",
    "deqlab.backward.phantom",
    "deqlab.backward.shine",
    "deqlab.backward.registry",
    "deqlab.backward.api",
    "deqlab.backward.check",
    # the book's code (deqlab.lab), where a module's examples can run without training
    "deqlab.lab.experiments.kglm.denoising",
    # the graders: their examples show the call on a stub, never an answer
    "deqlab.lab.exercises._core",
    "deqlab.lab.exercises.ch0",
    "deqlab.lab.exercises.ch1",
    "deqlab.lab.exercises.ch2",
    "deqlab.lab.exercises.ch3",
    "deqlab.lab.exercises.ch4",
    "deqlab.lab.exercises.ch5",
)

#: Names re-exported by a module in MODULES but defined in a module not (yet) checked.
NOT_YET_CHECKED: tuple[str, ...] = ()


def _public(module) -> list[tuple[str, object]]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items() if not n.startswith("_")
                 and (inspect.isfunction(v) or inspect.isclass(v)) and v.__module__ == module.__name__]
    out = []
    for name in names:
        value = getattr(module, name)
        target = inspect.unwrap(value) if callable(value) and not inspect.isclass(value) else value
        if not (inspect.isfunction(target) or inspect.isclass(target)):
            continue  # constants and submodules
        if target.__module__.startswith(NOT_YET_CHECKED):
            continue
        out.append((f"{module.__name__}.{name}", target))
    return out


def _api() -> list[tuple[str, object]]:
    seen, items = set(), []
    for module_name in MODULES:
        for label, obj in _public(importlib.import_module(module_name)):
            key = (obj.__module__, obj.__qualname__)
            if key not in seen:
                seen.add(key)
                items.append((label, obj))
    return items


def _has(doc: str, section: str) -> bool:
    return re.search(rf"^\s*{section}:\s*$", doc, re.MULTILINE) is not None


def _parameters(func, skip_self: bool) -> list[str]:
    try:
        params = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return []
    return params[1:] if skip_self and params else params


def _returns_value(func) -> bool:
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # noqa: BLE001 - unresolvable annotations: read the raw one
        hints = {"return": func.__annotations__.get("return", "?")}
    ret = hints.get("return", "?")
    return ret not in (None, type(None), "None")


def _raises(func) -> bool:
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):
        return False
    body = source.split('"""', 2)[-1] if source.count('"""') >= 2 else source
    return re.search(r"\braise\b|\bchecks\.\w+\(", body) is not None


def _exempt_from_example(obj) -> bool:
    return inspect.isclass(obj) and issubclass(obj, (BaseException, enum.Enum))


def _defined_init(cls) -> bool:
    return "__init__" in vars(cls) and not hasattr(cls, "__dataclass_fields__") and not hasattr(cls, "_fields")


def _method_problems(cls) -> list[str]:
    problems = []
    for name, member in vars(cls).items():
        if name.startswith("_") and name != "__call__":
            continue
        func = member.fget if isinstance(member, property) else member
        func = func.__func__ if isinstance(func, (staticmethod, classmethod)) else func
        if not inspect.isfunction(func):
            continue
        overrides = any(name in vars(base) and (getattr(base, name).__doc__ or "")
                        for base in cls.__mro__[1:] if base.__module__.startswith("deqlab"))
        if overrides:
            continue  # the base's contract; inspect.getdoc and autodoc inherit its docstring
        doc = inspect.getdoc(func) or ""
        if not func.__doc__:
            problems.append(f"method {name}: no docstring")
            continue
        skip_self = not isinstance(member, staticmethod)
        if not isinstance(member, property) and _parameters(func, skip_self) and not _has(doc, "Args"):
            problems.append(f"method {name}: parameters but no Args:")
    return problems


def _problems(obj) -> list[str]:
    doc = inspect.getdoc(obj) or ""
    if not obj.__doc__ or not doc.strip():
        return ["no docstring"]
    problems = []
    if not _exempt_from_example(obj) and (not _has(doc, "Example") or ">>>" not in doc):
        problems.append("no Example: with >>> lines")
    if inspect.isclass(obj):
        if _defined_init(obj) and _parameters(obj.__init__, True) and not _has(doc, "Args"):
            problems.append("__init__ takes parameters but the class docstring has no Args:")
        if not _defined_init(obj) and (hasattr(obj, "__dataclass_fields__") or hasattr(obj, "_fields")) \
                and not _has(doc, "Attributes"):
            problems.append("fields but no Attributes:")
        problems += _method_problems(obj)
        return problems
    if _parameters(obj, False) and not _has(doc, "Args"):
        problems.append("parameters but no Args:")
    if _returns_value(obj) and not (_has(doc, "Returns") or _has(doc, "Yields")):
        problems.append("returns a value but no Returns:")
    if _raises(obj) and not _has(doc, "Raises"):
        problems.append("raises but no Raises:")
    return problems


API = _api()


def test_the_api_is_found():
    # The walk must see the library: a broken import or an empty __all__ would pass (a) vacuously.
    assert len(API) > 150, len(API)


@pytest.mark.parametrize("label, obj", API, ids=[label for label, _ in API])
def test_docstring_sections(label, obj):
    assert not _problems(obj), f"{label}: " + "; ".join(_problems(obj))


def test_the_rule_can_fail():
    def undocumented(x):
        return x

    def documented(x: int) -> int:
        """Twice ``x``.

        Args:
            x: a number.

        Returns:
            ``2 x``.

        Example:
            >>> documented(2)
            4
        """
        if x is None:
            raise ValueError("x")
        return 2 * x

    assert _problems(undocumented) == ["no docstring"]
    assert _problems(documented) == ["raises but no Raises:"]


def _doctests(module_name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    return [t for t in finder.find(module, module_name, globs={}) if t.examples]


@pytest.mark.parametrize("module_name", MODULES)
def test_examples_run(module_name):
    tests = _doctests(module_name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    x64 = jax.config.jax_enable_x64  # tests/conftest.py turns it on; a reader's session has it off
    jax.config.update("jax_enable_x64", False)
    try:
        for test in tests:
            runner.run(test)
    finally:
        jax.config.update("jax_enable_x64", x64)
    failed, attempted = runner.summarize(verbose=False)
    assert failed == 0, f"{module_name}: {failed} of {attempted} doctest examples failed (output above)"
