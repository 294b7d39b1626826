#!/usr/bin/env python3
"""Write the student edition of the book's notebooks: solutions removed, the reader's code stubbed.

Usage: python3 .ci/student_edition.py [--out _build/student] [NOTEBOOK.ipynb ...]
(what `make student-edition` runs; with no notebooks, every notebook under book/).

For each notebook, a copy under ``--out`` (same relative path, e.g.
``_build/student/ch0_practice/01_what_is_a_deq.ipynb``) in which

1. every hidden solution of a Markdown cell, ``<details><summary>Solution...</summary> ...
   </details>`` (the one form the pages use, book/contributing.md), is removed with the blank lines
   after it; a Markdown cell left empty is dropped. A solution in another form (a MyST
   ``{admonition}`` or ``{dropdown}`` titled Solution) is an error, so that none slips through;
2. every cell tagged ``reader-code`` keeps the signatures, decorators and docstrings of its
   functions, and of the methods of its classes, but each body becomes
   ``raise NotImplementedError("your code here")``; its other statements (imports, the wiring of a
   ``custom_vjp``, a check written in the same cell) are kept. A ``reader-code`` cell with no
   function or class (a few assignments the reader writes) becomes a comment naming the variables
   it must define, and ``raise NotImplementedError("your code here")``;
3. every code cell that may fail because of (2) gets the tag ``raises-exception``: a cell that
   uses a stubbed name, or a variable that such a cell assigns (a def-use pass over the top-level
   statements, in order; conservative: it may tag a cell that would not fail). nbclient, nbmake,
   Jupyter Book, the classic notebook and JupyterLab then run the rest of the notebook past it, so
   that the notebook executes top to bottom before the student has written anything: the graders
   of ``deqlab.lab.exercises`` report the stub as a failed check (``your code raised
   NotImplementedError: your code here``) with a hint, and the page's experiments, which call
   ``deqlab``'s own functions, run as in the book. A front end that ignores the tag stops at the
   first unfinished exercise.

A cell that uses no stub but reads a variable that an earlier cell assigns only after a check of
the reader's code is a *cascade*: in the student edition it fails (a NameError) until the exercise
is done. The script lists them (and stores their indices in the notebook metadata,
``deqlab_student_edition.cascade_cells``); a page avoids them by putting the check of the reader's
code at the end of its cell.

Nothing else changes: the other cells, their order, the tags and the notebook metadata (to which
``deqlab_student_edition``, naming the source, is added); outputs are cleared. Only the standard
library is used, so it runs without the project's virtual environment. Exit status 1, with a
message, when a notebook cannot be converted.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
STUB = 'raise NotImplementedError("your code here")'
READER_TAG = "reader-code"
RAISES_TAG = "raises-exception"

_SOLUTION_OPEN = re.compile(r"<details[^>]*>\s*<summary[^>]*>\s*(?:<b>|<strong>)?\s*Solution\b", re.IGNORECASE)
_LINE_END_AND_BLANKS = re.compile(r"[ \t]*(?:\r?\n|$)(?:[ \t]*\r?\n)*")
_DETAILS_TAG = re.compile(r"<details\b[^>]*>|</details\s*>", re.IGNORECASE)
# solution forms the script does not remove: refuse them rather than leak a solution
_OTHER_SOLUTION_FORMS = re.compile(
    r"^\s*(?:```+|:::+)\s*\{(?:admonition|dropdown|toggle|solution)\}\s*Solution\b|"
    r"^\s*(?:```+|:::+)\s*\{solution\}|<summary[^>]*>\s*(?:<b>|<strong>)?\s*Solution\b",
    re.IGNORECASE | re.MULTILINE,
)


class ConversionError(ValueError):
    """A notebook the student edition cannot be made from (names the notebook and cell)."""


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _tags(cell: dict) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


# ------------------------------------------------------------------------------------------------
# 1. Markdown: solutions


def solution_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the ``<details><summary>Solution`` blocks of ``text``,
    nested ``<details>`` included, each end past the closing ``</details>`` and the blank lines
    after it. Raises ConversionError on a block that is never closed."""
    spans = []
    pos = 0
    while (match := _SOLUTION_OPEN.search(text, pos)) is not None:
        depth, end = 0, None
        for tag in _DETAILS_TAG.finditer(text, match.start()):
            depth += -1 if tag.group(0).startswith("</") else 1
            if depth == 0:
                end = tag.end()
                break
        if end is None:
            raise ConversionError(f"a <details><summary>Solution block at character {match.start()} is never closed")
        # the rest of the line of </details>, and the blank lines after it
        if (rest := _LINE_END_AND_BLANKS.match(text, end)) is not None:
            end = rest.end()
        start = match.start()
        # the block starts a line: remove from the line's start (its indentation)
        line_start = text.rfind("\n", 0, start) + 1
        if text[line_start:start].strip() == "":
            start = line_start
        spans.append((start, end))
        pos = end
    return spans


def remove_solutions(text: str) -> str:
    """``text`` without its solution blocks (see :func:`solution_spans`); raises ConversionError
    if a solution in another form remains."""
    spans = solution_spans(text)
    out, pos = [], 0
    for start, end in spans:
        out.append(text[pos:start])
        pos = end
    out.append(text[pos:])
    result = "".join(out)
    if (match := _OTHER_SOLUTION_FORMS.search(result)) is not None:
        raise ConversionError(f"a solution in a form this script does not remove: {match.group(0).strip()!r}")
    if not spans:
        return text
    return result.rstrip() + ("\n" if text.endswith("\n") and result.strip() else "")


# ------------------------------------------------------------------------------------------------
# 2. Code: the reader's functions


def _parseable(source: str) -> str:
    """The cell's source with IPython magics and shell lines blanked (same line numbers)."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n"))


def _docstring_node(node: ast.AST) -> ast.AST | None:
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[0]
    return None


def _function_body_edits(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> list[tuple[int, int, str]]:
    """(first line, last line, replacement) 1-based inclusive, replacing the body after the docstring."""
    doc = _docstring_node(node)
    rest = node.body[1:] if doc is not None else node.body
    if not rest:
        return []
    first = rest[0]
    if first.lineno == node.lineno or (doc is not None and doc.lineno == node.lineno):
        raise ConversionError(f"function {node.name!r} has its body on the line of its `def`: write it on its own lines")
    indent = " " * first.col_offset
    # from the line after the docstring (or the first statement, and the comments just above it:
    # they belong to the body) to the end of the function
    if doc is not None:
        start = doc.end_lineno + 1
    else:
        start = first.lineno
        while start - 1 > node.lineno and lines[start - 2].strip().startswith("#"):
            start -= 1
    last = node.end_lineno
    return [(start, last, indent + STUB)]


def _edits(tree: ast.Module, lines: list[str]) -> tuple[list[tuple[int, int, str]], list[str]]:
    """Body replacements for the top-level functions and the methods of top-level classes, and
    the names they define."""
    edits, names = [], []

    def visit_class(cls: ast.ClassDef) -> None:
        for item in cls.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                edits.extend(_function_body_edits(item, lines))
            elif isinstance(item, ast.ClassDef):
                visit_class(item)

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            edits.extend(_function_body_edits(node, lines))
            names.append(node.name)
        elif isinstance(node, ast.ClassDef):
            visit_class(node)
            names.append(node.name)
    return edits, names


def stub_reader_code(source: str, later_loads: set[str] | None = None) -> tuple[str, set[str], bool]:
    """Stub one ``reader-code`` cell.

    Returns ``(new source, stubbed names, raises)``: the names of its functions and classes (or,
    for a cell without any, the variables it assigns), and whether the new cell raises by itself
    (a cell without functions does). ``later_loads``, the names the notebook's later cells read,
    picks the variables the comment of such a cell names.
    """
    tree = ast.parse(_parseable(source))
    lines = source.split("\n")
    edits, names = _edits(tree, lines)
    if names:
        for start, end, replacement in sorted(edits, reverse=True):
            lines[start - 1:end] = [replacement]
        return "\n".join(lines), set(names), False
    assigned = _stores(tree.body)
    wanted = sorted(assigned & later_loads) if later_loads is not None else sorted(assigned)
    wanted = wanted or sorted(assigned)
    comment = ("# Your code here: define " + ", ".join(wanted) + " (used below)." if wanted
               else "# Your code here.")
    return comment + "\n" + STUB, assigned, True


# ------------------------------------------------------------------------------------------------
# 3. Which cells may fail


class _Names(ast.NodeVisitor):
    """Names read (``loads``) and bound at the top level (``stores``) by a statement; reads inside
    nested functions, lambdas and comprehensions count as reads, their local bindings do not, nor
    do a ``for`` body's reads of its loop variables."""

    def __init__(self) -> None:
        self.loads: set[str] = set()
        self.stores: set[str] = set()
        self._depth = 0

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.loads.add(node.id)
        elif self._depth == 0:
            self.stores.add(node.id)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if self._depth == 0:
            self.stores.add(node.name)
        for decorator in node.decorator_list:
            self.visit(decorator)
        self._depth += 1
        for statement in node.body:
            self.visit(statement)
        self._depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if self._depth == 0:
            self.stores.add(node.name)
        for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.visit(expr)
        self._depth += 1
        for statement in node.body:
            self.visit(statement)
        self._depth -= 1

    def _local(self, node: ast.AST, bound: set[str]) -> None:
        """Visit ``node``, a scope binding ``bound`` (a lambda's arguments, a comprehension's
        variables): its reads of those are not reads of the enclosing scope's names."""
        inner = _Names()
        inner._depth = 1
        inner.generic_visit(node)
        self.loads |= inner.loads - bound

    def visit_Lambda(self, node: ast.Lambda) -> None:
        args = node.args
        self._local(node, {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                                          *filter(None, [args.vararg, args.kwarg])]})

    def _comprehension(self, node: ast.AST) -> None:
        bound = set()
        for generator in node.generators:
            bound |= {n.id for n in ast.walk(generator.target) if isinstance(n, ast.Name)}
        self._local(node, bound)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Import(self, node: ast.Import) -> None:
        if self._depth == 0:
            self.stores.update((a.asname or a.name).split(".")[0] for a in node.names)

    visit_ImportFrom = visit_Import

    def visit_For(self, node: ast.For) -> None:
        """The loop variables are bound before the body reads them."""
        self.visit(node.iter)
        self.visit(node.target)
        bound = {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        inner = _Names()
        inner._depth = self._depth
        for statement in [*node.body, *node.orelse]:
            inner.visit(statement)
        self.loads |= inner.loads - bound
        self.stores |= inner.stores

    visit_AsyncFor = visit_For


def _names(statement: ast.AST) -> _Names:
    """The names one statement reads and binds (see :class:`_Names`)."""
    names = _Names()
    names.visit(statement)
    return names


def _stores(statements: list[ast.stmt]) -> set[str]:
    stored: set[str] = set()
    for statement in statements:
        stored |= _names(statement).stores
    return stored


def _loads(source: str) -> set[str]:
    try:
        tree = ast.parse(_parseable(source))
    except SyntaxError:
        return set()
    loads: set[str] = set()
    for statement in tree.body:
        loads |= _names(statement).loads
    return loads


def _uses_stub_itself(statement: ast.stmt, stubs: frozenset[str]) -> bool:
    """Whether ``statement`` reads a stub other than as the object of an attribute (calling it,
    passing it on): ``my_fixed_point.defvjp(fwd, bwd)`` runs no stubbed body."""
    attribute_bases = {id(n.value) for n in ast.walk(statement) if isinstance(n, ast.Attribute)}
    return any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in stubs
               and id(n) not in attribute_bases for n in ast.walk(statement))


def may_fail(statements: list[ast.stmt], tainted: set[str], stubs: frozenset[str] = frozenset(),
             missing: set[str] | None = None) -> tuple[bool, bool, set[str], set[str]]:
    """Whether a cell of these top-level statements may raise because of the stubs.

    ``tainted``: the stubs (functions and classes whose bodies raise), the values computed from
    them, and ``missing``, the variables that may be missing or stale because a cell stopped early.
    A statement may raise when it reads a tainted variable or uses a stub (other than through an
    attribute, see :func:`_uses_stub_itself`); what it binds is tainted, and what every statement
    after it in the cell binds is missing (the cell may stop there). A statement that reads a stub
    without using it (``my_fixed_point.defvjp(...)``, or passing it to a grader) does not raise,
    but what it binds is tainted. A statement that runs before binds its names afresh (untainted).
    A ``def``/``class`` whose body reads a tainted name does not raise when defined, but its name
    becomes tainted. ``stubs`` stay tainted although their (stubbed) definitions read nothing
    tainted.

    Returns ``(fails, cascade, tainted, missing)``: ``cascade`` when the cell may fail only because
    it reads a missing variable (not the reader's code, nor a value computed from it).
    """
    tainted, missing = set(tainted), set(missing or ())
    failing, cascade = False, False
    for statement in statements:
        names = _names(statement)
        if failing:
            tainted |= names.stores
            missing |= names.stores
        elif names.loads & tainted:
            definition = isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            derived = bool(names.loads & (tainted - stubs - missing)) or _uses_stub_itself(statement, stubs)
            failing = not definition and (derived or bool(names.loads & missing))
            cascade = failing and not derived
            tainted |= names.stores
            missing -= names.stores
        else:
            tainted -= names.stores - stubs
            missing -= names.stores
    return failing, cascade, tainted, missing


# ------------------------------------------------------------------------------------------------
# The notebook


def convert(nb: dict, source_name: str = "") -> dict:
    """The student edition of notebook ``nb`` (a dict in nbformat 4 layout; not modified)."""
    nb = json.loads(json.dumps(nb))
    cells = nb.get("cells", [])
    out = []
    tainted: set[str] = set()
    missing: set[str] = set()
    stubs: frozenset[str] = frozenset()
    cascades: list[int] = []  # cells that may fail only because an earlier one stopped early
    for index, cell in enumerate(cells):
        where = f"{source_name} cell {index}"
        kind = cell.get("cell_type")
        if kind == "markdown":
            try:
                text = remove_solutions(_source(cell))
            except ConversionError as error:
                raise ConversionError(f"{where}: {error}") from None
            if not text.strip():
                continue
            cell["source"] = text
            out.append(cell)
            continue
        if kind != "code":
            out.append(cell)
            continue
        cell["outputs"], cell["execution_count"] = [], None
        for key in ("execution", "collapsed", "scrolled", "ExecuteTime"):
            cell.get("metadata", {}).pop(key, None)
        source = _source(cell)
        tags = _tags(cell)
        fails = False
        if READER_TAG in tags:
            later = set().union(*(_loads(_source(c)) for c in cells[index + 1:] if c.get("cell_type") == "code"))
            try:
                new_source, stubbed, raises_itself = stub_reader_code(source, later)
            except (SyntaxError, ConversionError) as error:
                raise ConversionError(f"{where}: cannot stub the reader's code: {error}") from None
            tainted |= stubbed
            stubs |= stubbed
            cell["source"] = new_source
            fails = raises_itself
            if not raises_itself:  # its other statements (a check in the same cell) may use the stubs
                fails, _, tainted, missing = may_fail(ast.parse(_parseable(new_source)).body, tainted, stubs, missing)
        elif tainted:
            try:
                statements = ast.parse(_parseable(source)).body
            except SyntaxError as error:
                raise ConversionError(f"{where}: {error}") from None
            fails, cascade, tainted, missing = may_fail(statements, tainted, stubs, missing)
            if cascade:
                cascades.append(len(out))
        if fails and RAISES_TAG not in tags:
            cell.setdefault("metadata", {})["tags"] = [*tags, RAISES_TAG]
        out.append(cell)
    nb["cells"] = out
    meta = nb.setdefault("metadata", {})
    meta.get("language_info", {}).pop("version", None)
    meta["deqlab_student_edition"] = {
        "source": source_name,
        "note": "solutions removed; reader-code stubbed (raise NotImplementedError); cells that use the "
                "stubs are tagged raises-exception",
        "cascade_cells": cascades,
    }
    return nb


def write_edition(notebooks: list[Path], out: Path, book: Path = BOOK) -> list[Path]:
    """Convert ``notebooks`` (paths under ``book``) into ``out``, keeping their paths relative to
    ``book``; returns the paths written."""
    written = []
    for path in notebooks:
        path = path.resolve()
        relative = path.relative_to(book.resolve())
        nb = json.loads(path.read_text(encoding="utf-8"))
        student = convert(nb, source_name=f"book/{relative.as_posix()}")
        target = out / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(student, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(target)
    return written


def book_notebooks(book: Path = BOOK) -> list[Path]:
    """Every notebook of the book (not in hidden or ``_`` folders), sorted."""
    return sorted(p for p in book.rglob("*.ipynb")
                  if not any(part.startswith((".", "_")) for part in p.relative_to(book).parts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks under book/ (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "student",
                        help="output folder (default: _build/student)")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or book_notebooks()
    try:
        written = write_edition(notebooks, args.out)
    except (ConversionError, ValueError) as error:
        print(f"student_edition: {error}", file=sys.stderr)
        return 1
    for target in written:
        cascades = json.loads(target.read_text(encoding="utf-8"))["metadata"]["deqlab_student_edition"]["cascade_cells"]
        if cascades:
            print(f"note: {target}: cells {cascades} use no stub but may fail because an earlier cell stops at a "
                  "check of the reader's code before assigning what they read (move that check to the end of "
                  "its cell to avoid this)")
    print(f"wrote the student edition of {len(written)} notebook(s) into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
