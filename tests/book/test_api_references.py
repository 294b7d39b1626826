"""Cross-references in the rendered API reference resolve (``jupyter-book build -n`` would fail).

``make book`` builds with ``-W -n``: a ``:func:`deqlab.x``` in a docstring that book/api.md renders
whose target is not a documented object is a warning, and the warning fails CI's book phase, 40
minutes into a run (0.9.0's ``UncachedCallWarning`` named ``deqlab.solve``, which autodoc documents
as ``deqlab.solvers.solve``). This test reads the same docstrings without building the book and
resolves their fully qualified ``deqlab.`` references the way autodoc documents objects: a
module given to ``automodule`` with ``:members:`` documents the names of its ``__all__`` (each
also under the path where it is defined, autodoc's ``:canonical:``), and their attributes. Relative references (``:func:`solve``` inside ``deqlab.solvers``) are left to
Sphinx, which resolves them in the current module.
"""

from __future__ import annotations

import importlib
import inspect
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPHINX_MISSING = ("the book's Sphinx toolchain is not installed (pip install -e '.[book]'); the floor "
                  "environment of .ci/run, like Colab, has none, and CI's main test phase runs these checks")
ROLE = re.compile(r":(?:py:)?(func|class|meth|mod|data|exc|attr|obj):`~?(deqlab(?:\.\w+)+)`")


def documented_modules() -> dict[str, bool]:
    """Each module of book/api.md's ``automodule`` directives -> whether it has ``:members:``."""
    api = (ROOT / "book" / "api.md").read_text(encoding="utf-8")
    found = re.finditer(r"\.\. automodule:: ([\w.]+)\n((?:   :[\w-]+:.*\n)*)", api)
    return {m.group(1): ":members:" in m.group(2) for m in found}


def public_names(module) -> list[str]:
    """What ``automodule`` with ``:members:`` documents: ``__all__``, or without one the public
    functions and classes defined in the module and its public data (its constants)."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [name for name, obj in vars(module).items()
            if not name.startswith("_") and not inspect.ismodule(obj)
            and getattr(obj, "__module__", module.__name__) == module.__name__]


def documented_objects(modules: dict[str, bool]) -> dict[str, object]:
    """Every name a reference may use -> its object: the documented path (module.name) and,
    as autodoc records it with ``:canonical:``, the path where the object is defined."""
    names: dict[str, object] = {}
    for module_name, members in modules.items():
        if not members:
            continue
        module = importlib.import_module(module_name)
        for name in public_names(module):
            obj = getattr(module, name)
            names[f"{module_name}.{name}"] = obj
            defined = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
            if all(isinstance(part, str) for part in defined):
                names[".".join(defined)] = obj
    return names


def resolves(kind: str, target: str, modules: dict[str, bool]) -> bool:
    """Whether autodoc documents ``target`` (see the module docstring): a documented module, a
    documented object, or an attribute of one (a method, a field)."""
    if kind == "mod":
        return target in modules
    objects = documented_objects(modules)
    parts = target.split(".")
    for cut in range(len(parts), 1, -1):
        obj = objects.get(".".join(parts[:cut]))
        if obj is None:
            continue
        for name in parts[cut:]:
            if hasattr(obj, name):
                obj = getattr(obj, name)
            elif name in getattr(obj, "__annotations__", {}):
                obj = None
            else:
                return False
        return True
    return False


def rendered_docstrings(modules: dict[str, bool]):
    """(where, docstring) of what api.md renders: module docstrings, the ``__all__`` members of
    the modules with ``:members:`` (:func:`public_names`) and those members' own public attributes."""
    for module_name, members in modules.items():
        module = importlib.import_module(module_name)
        yield module_name, module.__doc__ or ""
        if not members:
            continue
        for name in public_names(module):
            obj = getattr(module, name)
            yield f"{module_name}.{name}", inspect.getdoc(obj) or ""
            if inspect.isclass(obj):
                for attribute, value in vars(obj).items():
                    if not attribute.startswith("_") and getattr(value, "__doc__", None):
                        yield f"{module_name}.{name}.{attribute}", inspect.getdoc(value) or ""


def unresolved(modules: dict[str, bool]) -> list[str]:
    return [f"{where}: {match.group(0)}"
            for where, doc in rendered_docstrings(modules)
            for match in ROLE.finditer(doc)
            if not resolves(match.group(1), match.group(2), modules)]


def test_rendered_references_resolve():
    modules = documented_modules()
    assert "deqlab.solvers" in modules and modules["deqlab.solvers"], "api.md no longer parsed"
    assert unresolved(modules) == []


def leaked_backticks(modules: dict[str, bool]) -> list[str]:
    """Rendered docstrings in which a backtick survives outside code: reST that did not parse
    (a literal inside ``**bold**``, an unclosed role), which the site check of CI's ``site`` phase
    reports as leaked Markdown. Each docstring is converted as the build converts it (napoleon's
    Google style, then docutils), with the Sphinx roles written as literals."""
    pytest.importorskip("sphinx", reason=SPHINX_MISSING)
    import docutils.core
    from sphinx.ext.napoleon import Config
    from sphinx.ext.napoleon.docstring import GoogleDocstring

    config = Config(napoleon_use_param=True, napoleon_use_rtype=False, napoleon_use_ivar=True)
    leaked = []
    for where, doc in rendered_docstrings(modules):
        text = re.sub(r":[\w:]+:`~?([^`]*)`", r"``\1``", str(GoogleDocstring(doc, config)))
        html = docutils.core.publish_parts(text, writer_name="html",
                                           settings_overrides={"report_level": 5, "halt_level": 5})["body"]
        if "`" in re.sub(r"<(code|tt|pre)\b.*?</\1>", "", html, flags=re.DOTALL):
            leaked.append(where)
    return leaked


def test_rendered_docstrings_leak_no_backticks():
    assert leaked_backticks(documented_modules()) == []


def test_the_check_can_fail():
    """The reference that broke 0.9.0's build, and others of each kind, are caught."""
    modules = documented_modules()
    assert resolves("func", "deqlab.solvers.solve", modules)
    assert resolves("class", "deqlab.solvers.Picard", modules)
    assert resolves("meth", "deqlab.solvers.Broyden.inverse_jacobian", modules)
    assert resolves("mod", "deqlab.failures", modules)
    for kind, target in [("func", "deqlab.solve"), ("class", "deqlab.solvers.NoSuchSolver"),
                         ("meth", "deqlab.solvers.Broyden.no_such_method"), ("mod", "deqlab.solvers.loop")]:
        assert not resolves(kind, target, modules), target


def test_the_backtick_check_can_fail():
    """deqlab.backward's docstring before the site check caught it: a literal inside bold."""
    broken = "**The adjoint solve always runs inside a gradient, so with ``\"warn\"`` it is lost**."
    import deqlab.backward
    original = deqlab.backward.__doc__
    try:
        deqlab.backward.__doc__ = broken
        assert "deqlab.backward" in leaked_backticks({"deqlab.backward": False})
    finally:
        deqlab.backward.__doc__ = original


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
