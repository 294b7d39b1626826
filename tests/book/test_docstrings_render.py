"""Every docstring of deqlab renders without a docutils warning, as `make book`'s API pages need.

`jupyter-book build -W` turns any warning into a failed build, and a docstring's reST mistake (a
bullet list without a blank line after it, ``|x|`` read as a substitution) only shows there, after
the whole test suite has run (twice in a row it cost a CI landing). This test reads every public
module, class, function and method docstring of the package the way the API pages do (napoleon's
Google style with the book's settings, then docutils) in a few seconds, and names each one that
warns.
"""

from __future__ import annotations

import importlib
import inspect
import io
import pkgutil

import pytest

import deqlab

napoleon = pytest.importorskip(
    "sphinx.ext.napoleon",
    reason="the book's Sphinx toolchain is not installed (pip install -e '.[book]'); the floor environment of "
           ".ci/run, like Colab, has none, and CI's main test phase runs this check")
from docutils.core import publish_doctree  # noqa: E402  (docutils comes with sphinx)
from docutils.utils import Reporter  # noqa: E402
from sphinx.ext.napoleon.docstring import GoogleDocstring  # noqa: E402
from sphinx.util.docstrings import prepare_docstring  # noqa: E402

# the book's napoleon settings (_config.yml, sphinx: config:)
CONFIG = napoleon.Config(napoleon_google_docstring=True, napoleon_numpy_docstring=False,
                         napoleon_use_rtype=False, napoleon_use_ivar=True)
# Sphinx roles and directives docutils alone does not know: registered as no-ops, so that only reST
# structure (lists, indentation, substitutions, inline markup) is judged here; the build checks
# the references themselves (-n).
_SPHINX_ROLES = ("func", "class", "meth", "mod", "data", "attr", "obj", "exc", "doc", "ref", "numref", "cite",
                 "math", "py:func", "py:class", "py:meth", "py:data", "py:mod", "py:attr", "eq", "term", "any",
                 "cite:p", "cite:t", "glue:text")
_SPHINX_DIRECTIVES = ("math", "code-block", "testcode", "seealso", "versionadded", "versionchanged",
                      "deprecated", "rubric", "admonition", "note", "warning", "autosummary")


def _register_sphinx_markup():
    from docutils.parsers.rst import Directive, directives, roles

    def role(name, rawtext, text, lineno, inliner, options=None, content=None):
        from docutils import nodes
        return [nodes.literal(rawtext, text)], []

    class Passive(Directive):
        has_content = True
        optional_arguments = 10
        final_argument_whitespace = True
        option_spec = None

        def run(self):
            return []

    Passive.option_spec = _AnyOptions()
    for name in _SPHINX_ROLES:
        roles.register_local_role(name, role)
    for name in _SPHINX_DIRECTIVES:
        if name not in ("note", "warning", "admonition", "rubric"):  # docutils has these
            directives.register_directive(name, Passive)


class _AnyOptions(dict):
    def __contains__(self, key):
        return True

    def __getitem__(self, key):
        return lambda value: value


def _documented_objects():
    """(qualified name, napoleon's ``what``, docstring) of every public module, class, function and method of deqlab
    (objects defined in the module that names them, so that each is read once)."""
    seen = set()
    names = [deqlab.__name__] + [m.name for m in pkgutil.walk_packages(deqlab.__path__, "deqlab.")
                                 if not any(part.startswith("_") for part in m.name.split("."))]
    for module_name in names:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a module of the book's extras that this environment lacks
            continue
        if module.__doc__:
            yield module_name, "module", module.__doc__
        # attribute docstrings (a string literal after a module-level or class-level assignment), which
        # autodoc reads from the source: INIT_TOL's "|1 - lambda|" failed the book build this way
        from sphinx.pycode import ModuleAnalyzer

        try:
            attributes = ModuleAnalyzer.for_module(module_name).find_attr_docs()
        except Exception:  # noqa: BLE001 - no source to read (a compiled module)
            attributes = {}
        for (scope, name), lines in attributes.items():
            if not name.startswith("_") and not scope.startswith("_"):
                yield f"{module_name}.{scope + '.' if scope else ''}{name}", "attribute", "\n".join(lines)
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module_name or id(obj) in seen:
                continue
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            seen.add(id(obj))
            if obj.__doc__:
                yield f"{module_name}.{name}", "class" if inspect.isclass(obj) else "function", obj.__doc__
            if inspect.isclass(obj):
                for member_name, member in vars(obj).items():
                    if member_name.startswith("_"):
                        continue
                    func = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                    if inspect.isfunction(func) and func.__doc__ and id(func) not in seen:
                        seen.add(id(func))
                        yield f"{module_name}.{name}.{member_name}", "method", func.__doc__


def _warnings(docstring: str, what: str) -> list[str]:
    lines = prepare_docstring(docstring)
    rst = str(GoogleDocstring(lines, CONFIG, what=what))
    stream = io.StringIO()
    publish_doctree(rst, settings_overrides={"report_level": Reporter.WARNING_LEVEL, "warning_stream": stream,
                                             "halt_level": Reporter.SEVERE_LEVEL + 1})
    return [line for line in stream.getvalue().splitlines() if "(WARNING" in line or "(ERROR" in line
            or "(SEVERE" in line]


def test_every_docstring_renders_without_a_warning():
    _register_sphinx_markup()
    objects = list(_documented_objects())
    assert len(objects) > 300, len(objects)  # the walk found the package
    problems = {}
    for name, what, doc in objects:
        found = _warnings(doc, what)
        if found:
            problems[name] = found
    assert not problems, "\n".join(f"{name}: {found}" for name, found in problems.items())


def test_attribute_docstrings_are_read_and_a_bar_substitution_is_found():
    _register_sphinx_markup()
    attributes = {name for name, what, _ in _documented_objects() if what == "attribute"}
    assert "deqlab.lab.experiments.sequence.ensemble_study.INIT_TOL" in attributes
    assert _warnings("Near 1, at most min |1 - lambda| there.", "attribute")


def test_the_check_finds_a_list_without_a_blank_line():
    _register_sphinx_markup()
    broken = """Train.

    Args:
        config: a dict:

            - ``a``: one;
            - ``b``: two.
            Only one of them.
    """
    assert _warnings(broken, "function")
    assert _warnings("A norm |lambda| of the matrix.", "function")  # an undefined substitution
    assert not _warnings(broken.replace("two.\n", "two.\n\n"), "function")
