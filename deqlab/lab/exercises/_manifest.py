"""The grading manifest: which cells of each student-edition page are check cells, and their hashes.

Standard library only: ``.ci/student_edition.py`` loads this file by path (without importing
``deqlab``, which needs JAX) to write the manifest, and :mod:`deqlab.lab.exercises.grade` reads it
to grade submissions, so both hash the same way.

**Format** (JSON, ``grading_manifest.json`` next to the student edition's notebooks)::

    {"format": "deqlab-grading-manifest/1",
     "pages": {
       "ch2_freeprob/01_transforms.ipynb": {              # the page, relative to book/
         "source": "book/ch2_freeprob/01_transforms.ipynb",
         "checks": [
           {"cell_id": "28282f65",                      # nbformat cell id
            "index": 16,                                # its position in the student edition
            "graders": ["check_stieltjes"],             # the graders it calls, in order
            "points": [1],                              # one entry per grader (instructors may edit)
            "scope": "cell",                            # what the hash covers (below)
            "sha256": "..."}]}}}

A *check cell* is a code cell that calls a grader, ``exercises.check_*(...)`` or ``check_*(...)``.
Its hash (:func:`check_hash`) is the SHA-256 of its source with line endings normalised and
trailing white space removed (``scope: "cell"``); for a cell tagged ``reader-code`` that also
checks (the reader writes a function and the same cell grades it), only its top-level statements
other than ``def``/``class`` are hashed (``scope: "statements"``), so that writing the function
bodies does not count as editing the check. Every page of the edition is listed, with no checks
when it has none.
"""

from __future__ import annotations

import ast
import hashlib
from typing import Any

FORMAT = "deqlab-grading-manifest/1"
MANIFEST_NAME = "grading_manifest.json"
READER_TAG = "reader-code"


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _parseable(source: str) -> str:
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n"))


def _normalised(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")).strip()


def graders_called(source: str) -> list[str]:
    """The graders a cell's source calls (``exercises.check_x(...)`` or ``check_x(...)``), in order."""
    try:
        tree = ast.parse(_parseable(source))
    except SyntaxError:
        return []
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr.startswith("check_") and isinstance(func.value, ast.Name) \
                and func.value.id == "exercises":
            calls.append((node.lineno, node.col_offset, func.attr))
        elif isinstance(func, ast.Name) and func.id.startswith("check_"):
            calls.append((node.lineno, node.col_offset, func.id))
    return [name for *_, name in sorted(calls)]


def scope(cell: dict) -> str:
    """``"statements"`` for a ``reader-code`` cell, ``"cell"`` otherwise (see the module docstring)."""
    return "statements" if READER_TAG in cell.get("metadata", {}).get("tags", []) else "cell"


def check_hash(source: str, scope: str = "cell") -> str:
    """The SHA-256 (hex) of a check cell's source, as the manifest stores it (module docstring)."""
    if scope == "statements":
        try:
            tree = ast.parse(_parseable(source))
        except SyntaxError:
            return hashlib.sha256(b"unparseable\n" + _normalised(source).encode()).hexdigest()
        # the statements' own text (not ast.unparse, whose output varies between Python versions)
        parseable = _parseable(source)
        parts = [_normalised(ast.get_source_segment(parseable, node) or "") for node in tree.body
                 if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        text = "\n".join(parts)
    else:
        text = _normalised(source)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def page_checks(nb: dict) -> list[dict[str, Any]]:
    """The manifest entries of one student-edition notebook (a dict in nbformat 4 layout)."""
    entries = []
    for index, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        source = _source(cell)
        graders = graders_called(source)
        if not graders:
            continue
        kind = scope(cell)
        entries.append({"cell_id": cell.get("id"), "index": index, "graders": graders,
                        "points": [1] * len(graders), "scope": kind, "sha256": check_hash(source, kind)})
    return entries


def build(pages: dict[str, dict]) -> dict[str, Any]:
    """The manifest of ``pages``: {page path relative to book/ -> student-edition notebook dict}."""
    out = {}
    for page, nb in sorted(pages.items()):
        source = nb.get("metadata", {}).get("deqlab_student_edition", {}).get("source", f"book/{page}")
        out[page] = {"source": source, "checks": page_checks(nb)}
    return {"format": FORMAT, "pages": out}
