#!/usr/bin/env python3
"""Write the student edition of the book's notebooks: solutions removed, the reader's code stubbed.

Usage: python3 .ci/student_edition.py [--out _build/student] [NOTEBOOK.ipynb ...]
(what `make student-edition` runs; with no notebooks, every notebook under book/).

For each notebook, a copy under ``--out`` (same relative path, e.g.
``_build/student/ch0_practice/01_what_is_a_deq.ipynb``) in which

1. every hidden solution of a Markdown cell, a ``<details>`` block whose ``<summary>`` names a
   solution or an answer (``<summary>Solution</summary>``, ``<summary>Solutions``,
   ``<summary><em>Solution</em>``, ``<summary>**Answer**``, ``<summary>Show the solution``: any
   case, any inline markup; book/contributing.md), is removed with the blank lines after it,
   nested ``<details>`` included; a Markdown cell left empty is dropped. A solution in another
   form (a MyST ``{admonition}``, ``{dropdown}`` or ``{toggle}`` titled Solution or Answer, a
   ``{solution}`` directive, a ``<summary>`` naming a solution outside ``<details>``) is an error,
   so that none slips through;
2. commented-out code, which may hold the answer, is removed: a code cell whose lines are all
   comments, one of them a line of Python (the "uncomment to check your answer" cells) keeps its
   prose comments and says ``# Student edition: the commented-out code that was here is removed``;
   a fenced Python block of a Markdown cell that is all comments, one of them code, becomes a
   one-line note. Commented-out lines inside a cell of live code are kept;
3. every cell tagged ``reader-code`` keeps the signatures, decorators and docstrings of its
   functions, and of the methods of its classes, but each body becomes
   ``raise NotImplementedError("your code here")``; its other statements (imports, the wiring of a
   ``custom_vjp``, a check written in the same cell) are kept. A ``reader-code`` cell with no
   function or class (a few assignments the reader writes) becomes a comment naming the variables
   it must define, and ``raise NotImplementedError("your code here")``;
4. every code cell that may fail because of (3) gets the tag ``raises-exception``: a cell that
   uses a stubbed name, or a variable that such a cell binds or changes (a def-use pass with
   ``ast`` over the top-level statements, in order). Binding is every form Python has (``=``,
   ``+=``, ``:=``, ``for`` and ``with`` targets, ``except ... as``, ``match`` captures, imports,
   ``def``/``class``, ``del``); changing is a subscript or attribute target (``curves[c] = ...``)
   or a mutating method (``rows.append(...)``): a loop that calls the reader's code and fills a
   dict stops half way, and a later figure that reads the dict fails (a ``KeyError``) unless it is
   tagged too. The pass is conservative (it may tag a cell that would not fail); it does not follow
   a function that changes its argument or a global. nbclient, nbmake, Jupyter Book, the classic
   notebook and JupyterLab then run the rest of the notebook past a tagged cell, so that the
   notebook executes top to bottom before the student has written anything (and with a wrong
   answer): the graders of ``deqlab.lab.exercises`` report the stub as a failed check (``your code
   raised NotImplementedError: your code here``) with a hint, the cells that need the reader's
   results wait for them (their error is shown, and the tag says why it is expected), and the
   page's other experiments, which call ``deqlab``'s own functions, run as in the book. A front
   end that ignores the tag stops at the first unfinished exercise. This design keeps every
   result on the page the student's own or ``deqlab``'s, never a silent substitute.

A cell that uses no stub but reads a variable that an earlier cell assigns only after a check of
the reader's code is a *cascade*: in the student edition it fails (a NameError) until the exercise
is done. The script lists them (and stores their indices in the notebook metadata,
``deqlab_student_edition.cascade_cells``); a page avoids them by putting the check of the reader's
code at the end of its cell.

Nothing else changes: the other cells, their order, the tags and the notebook metadata (to which
``deqlab_student_edition``, naming the source, is added); outputs are cleared. Only the standard
library is used, so it runs without the project's virtual environment. Exit status 1, with a
message, when a notebook cannot be converted; 2 on bad usage: an ``--out`` that is ``book/`` or
inside it (the edition never overwrites its inputs), a notebook that is not under ``book/``.
"""

from __future__ import annotations

import argparse
import ast
import html
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
STUB = 'raise NotImplementedError("your code here")'
READER_TAG = "reader-code"
RAISES_TAG = "raises-exception"

# a <details> block whose <summary> names a solution or an answer, whatever the inline markup
# (<b>, <em>, **...**, _..._) and the wording around it ("Solutions", "Show the solution", "Answer")
_DETAILS_SUMMARY = re.compile(r"<details\b[^>]*>\s*<summary\b[^>]*>(?P<summary>.*?)</summary\s*>",
                              re.IGNORECASE | re.DOTALL)
_SUMMARY = re.compile(r"<summary\b[^>]*>(?P<summary>.*?)(?:</summary\s*>|$)", re.IGNORECASE | re.DOTALL)
_SOLUTION_WORD = re.compile(r"\b(?:solutions?|answers?)\b", re.IGNORECASE)
_LINE_END_AND_BLANKS = re.compile(r"[ \t]*(?:\r?\n|$)(?:[ \t]*\r?\n)*")
_DETAILS_TAG = re.compile(r"<details\b[^>]*>|</details\s*>", re.IGNORECASE)
# solution forms the script does not remove: refuse them rather than leak a solution
_OTHER_SOLUTION_FORMS = re.compile(
    r"^\s*(?:```+|:::+)\s*\{(?:admonition|dropdown|toggle|card)\}(?P<title>[^\n]*)$|"
    r"^\s*(?:```+|:::+)\s*\{(?:solution|solution-start|answer)\}",
    re.IGNORECASE | re.MULTILINE,
)
# commented-out code: what the student edition writes in its place
CODE_NOTE = "# Student edition: the commented-out code that was here is removed (it may hold the answer)."
MARKDOWN_NOTE = "*(Student edition: a commented-out code block is removed here; it may hold the answer.)*"
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)$")
_CODE_INFO = {"", "python", "python3", "py", "ipython", "ipython3", "pycon"}


def summary_text(summary: str) -> str:
    """The words of a ``<summary>``: HTML tags, Markdown emphasis and code marks removed."""
    text = re.sub(r"<[^>]*>", " ", summary)
    return " ".join(re.sub(r"[*_`~]+", " ", html.unescape(text)).split())


def is_solution_summary(summary: str) -> bool:
    """Whether a ``<summary>`` (its inner HTML/Markdown) titles a solution or an answer."""
    return _SOLUTION_WORD.search(summary_text(summary)) is not None


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
    """(start, end) character spans of the solution blocks of ``text``: ``<details>`` blocks whose
    ``<summary>`` names a solution or an answer (:func:`is_solution_summary`), nested ``<details>``
    included, each end past the closing ``</details>`` and the blank lines after it. Raises
    ConversionError on a block that is never closed."""
    spans = []
    pos = 0
    while (match := _DETAILS_SUMMARY.search(text, pos)) is not None:
        if not is_solution_summary(match.group("summary")):
            pos = match.start() + 1  # a hint or a verification: look inside it too
            continue
        depth, end = 0, None
        for tag in _DETAILS_TAG.finditer(text, match.start()):
            depth += -1 if tag.group(0).startswith("</") else 1
            if depth == 0:
                end = tag.end()
                break
        if end is None:
            raise ConversionError(f"a solution block (<details><summary>{summary_text(match.group('summary'))}) "
                                  f"at character {match.start()} is never closed")
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


def _other_solution_form(text: str) -> str | None:
    """A solution left in a form this script does not remove, as written, or None."""
    for match in _OTHER_SOLUTION_FORMS.finditer(text):
        title = match.group("title")
        if title is None or _SOLUTION_WORD.search(summary_text(title)):
            return match.group(0).strip()
    for match in _SUMMARY.finditer(text):
        if is_solution_summary(match.group("summary")):
            return match.group(0).strip()[:80]
    return None


def remove_solutions(text: str) -> str:
    """``text`` without its solution blocks (see :func:`solution_spans`); raises ConversionError
    if a solution in another form remains (a MyST admonition or dropdown titled Solution or
    Answer, a ``{solution}`` directive, a ``<summary>`` naming a solution outside a ``<details>``)."""
    spans = solution_spans(text)
    out, pos = [], 0
    for start, end in spans:
        out.append(text[pos:start])
        pos = end
    out.append(text[pos:])
    result = "".join(out)
    if (form := _other_solution_form(result)) is not None:
        raise ConversionError(f"a solution in a form this script does not remove: {form!r}")
    if not spans:
        return text
    return result.rstrip() + ("\n" if text.endswith("\n") and result.strip() else "")


def _is_code(comment: str) -> bool:
    """Whether the text of a comment line (after its ``#``) is a line of Python rather than prose:
    it parses (alone, or as the header of a block), and is more than one bare word or number."""
    text = comment.strip()
    if not text:
        return False
    for candidate in (text, text + "\n    pass"):
        try:
            tree = ast.parse(candidate)
        except SyntaxError:
            continue
        body = tree.body
        bare = len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, (ast.Name, ast.Constant))
        return not bare
    return False


def _comment_body(line: str) -> str:
    body = line.lstrip()[1:]
    return body[1:] if body.startswith(" ") else body


def commented_code_start(lines: list[str]) -> int | None:
    """For lines that are all comments (or blank), the index of the first commented-out line of code
    (:func:`_is_code`); None when some line is not a comment or none is code."""
    if not any(line.strip() for line in lines) or any(line.strip() and not line.lstrip().startswith("#")
                                                        for line in lines):
        return None
    return next((i for i, line in enumerate(lines) if line.strip() and _is_code(_comment_body(line))), None)


def remove_commented_code_cell(source: str) -> str:
    """A code cell that is all comments and holds commented-out code ("uncomment to check your
    answer"): its prose comments before the first line of code (less those that say to uncomment
    it), then :data:`CODE_NOTE`. Any other cell is returned as it is."""
    lines = source.split("\n")
    start = commented_code_start(lines)
    if start is None:
        return source
    # the prose before the code, less its "uncomment to check" (there is nothing left to uncomment)
    kept = [line for line in lines[:start] if line.strip() and "uncomment" not in line.lower()]
    return "\n".join([*kept, CODE_NOTE])


def remove_commented_code_markdown(text: str) -> str:
    """Markdown with every fenced Python block that is all comments and holds commented-out code
    replaced by :data:`MARKDOWN_NOTE` (at the fence's indentation)."""
    lines = text.split("\n")
    out: list[str] = []
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if fence is None:
            out.append(lines[index])
            index += 1
            continue
        marker = fence.group("fence")
        close = re.compile(rf"^[ \t]*{re.escape(marker[0])}{{{len(marker)},}}[ \t]*$")
        end = next((j for j in range(index + 1, len(lines)) if close.match(lines[j])), None)
        if end is None:
            out.extend(lines[index:])
            break
        body = lines[index + 1:end]
        if fence.group("info").strip().lower() in _CODE_INFO and commented_code_start(body) is not None:
            out.append(fence.group("indent") + MARKDOWN_NOTE)
        else:
            out.extend(lines[index:end + 1])
        index = end + 1
    return "\n".join(out)


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


# methods that change the object they are called on: ``curves.append(x)`` changes ``curves``
_MUTATORS = frozenset({"append", "extend", "insert", "update", "setdefault", "pop", "popitem", "clear", "add",
                       "discard", "remove", "sort", "reverse", "__setitem__", "__delitem__"})


def _base_name(node: ast.AST) -> str | None:
    """The variable at the root of ``a.b[c].d``: ``a`` (None for ``f()[0]`` and the like)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


class _Names(ast.NodeVisitor):
    """Names read (``loads``), bound (``stores``) and changed in place (``mutates``) at the top level
    by a statement.

    Bound: every target of an assignment (``=``, ``+=``, annotated, ``:=``), a ``for`` or
    ``with ... as``, an ``except ... as``, a ``match`` capture, an import, a ``def`` or ``class``,
    a ``del``. Changed in place: the variable at the root of a subscript or attribute target
    (``curves[c] = ...``, ``obj.x += 1``, ``del d[k]``) and of a call of a mutating method
    (``rows.append(...)``, ``table.setdefault(...)``, :data:`_MUTATORS`); an augmented assignment
    also reads its target. Reads inside nested functions, lambdas and comprehensions count as reads,
    their local bindings do not, nor do a ``for`` body's reads of its loop variables. Not tracked: a
    function that changes its argument or a global (``fill(curves)``), a binding inside a function
    body (``global``)."""

    def __init__(self) -> None:
        self.loads: set[str] = set()
        self.stores: set[str] = set()
        self.mutates: set[str] = set()
        self.walrus: set[str] = set()  # the targets of := (bound in the enclosing scope)
        self._depth = 0

    def _bind(self, name: str | None) -> None:
        if name and self._depth == 0:
            self.stores.add(name)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.loads.add(node.id)
        else:
            self._bind(node.id)

    def _target(self, node: ast.Attribute | ast.Subscript) -> None:
        if not isinstance(node.ctx, ast.Load) and self._depth == 0 and (base := _base_name(node)) is not None:
            self.mutates.add(base)
        self.generic_visit(node)

    visit_Attribute = visit_Subscript = _target

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        """``x += 1`` reads ``x`` before it binds it."""
        if isinstance(node.target, ast.Name):
            self.loads.add(node.target.id)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _MUTATORS and self._depth == 0 \
                and (base := _base_name(func.value)) is not None:
            self.mutates.add(base)
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        """``(x := ...)`` binds ``x`` in the enclosing scope, even inside a comprehension."""
        self.visit(node.value)
        self.walrus.add(node.target.id)
        self._bind(node.target.id)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        self._bind(node.name)
        self.generic_visit(node)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        self._bind(node.name)
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        self._bind(node.name)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        self._bind(node.rest)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._bind(node.name)
        for expr in [*node.decorator_list, *node.args.defaults, *filter(None, node.args.kw_defaults)]:
            self.visit(expr)
        self._depth += 1
        for statement in node.body:
            self.visit(statement)
        self._depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._bind(node.name)
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
        for name in inner.walrus - bound:  # a := inside a comprehension binds in the enclosing scope
            self.walrus.add(name)
            self._bind(name)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        args = node.args
        for expr in [*args.defaults, *filter(None, args.kw_defaults)]:
            self.visit(expr)
        self._local(node.body, {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                                               *filter(None, [args.vararg, args.kwarg])]})

    def _comprehension(self, node: ast.AST) -> None:
        bound = set()
        for generator in node.generators:
            bound |= {n.id for n in ast.walk(generator.target) if isinstance(n, ast.Name)}
        self._local(node, bound)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._bind((alias.asname or alias.name).split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name != "*":
                self._bind(alias.asname or alias.name)

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
        self.mutates |= inner.mutates
        self.walrus.update(inner.walrus)

    visit_AsyncFor = visit_For


def _names(statement: ast.AST) -> _Names:
    """The names one statement reads and binds (see :class:`_Names`)."""
    names = _Names()
    names.visit(statement)
    return names


def _stores(statements: list[ast.stmt]) -> set[str]:
    """The names these statements bind or change in place."""
    stored: set[str] = set()
    for statement in statements:
        names = _names(statement)
        stored |= names.stores | names.mutates
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
        if failing:  # not run: what it would bind is missing, what it would change is stale
            tainted |= names.stores | names.mutates
            missing |= names.stores
        elif names.loads & tainted:
            definition = isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            derived = bool(names.loads & (tainted - stubs - missing)) or _uses_stub_itself(statement, stubs)
            failing = not definition and (derived or bool(names.loads & missing))
            cascade = failing and not derived
            # what it binds, and what it changes in place (``curves[c] = ...`` in a loop that stops
            # half way, ``rows.append(...)``), is computed from the stubs, or partly missing
            tainted |= names.stores | names.mutates
            missing -= names.stores
        else:  # a fresh binding is clean; a change in place leaves a tainted object tainted
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
                text = remove_commented_code_markdown(remove_solutions(_source(cell)))
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
        if READER_TAG not in tags and (uncommented := remove_commented_code_cell(source)) != source:
            cell["source"] = source = uncommented
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
        "note": "solutions and commented-out code removed; reader-code stubbed (raise NotImplementedError); "
                "cells that use the stubs, or what they compute, are tagged raises-exception",
        "cascade_cells": cascades,
    }
    return nb


def write_edition(notebooks: list[Path], out: Path, book: Path = BOOK) -> list[Path]:
    """Convert ``notebooks`` (paths under ``book``) into ``out``, keeping their paths relative to
    ``book``; returns the paths written."""
    check_paths(notebooks, out, book)
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


class UsageError(ValueError):
    """Arguments the script refuses: an output folder that holds its inputs, a notebook outside book/."""


def check_paths(notebooks: list[Path], out: Path, book: Path = BOOK) -> None:
    """Raise UsageError unless every notebook is an existing ``.ipynb`` file under ``book`` and
    ``out`` neither is ``book`` nor lies inside it (the edition must never overwrite its inputs)."""
    book, target = book.resolve(), out.resolve()
    if target == book or book in target.parents:
        raise UsageError(f"--out {out} is {'the book folder' if target == book else 'inside the book folder'} "
                         f"{book.name}/: the student edition would overwrite the notebooks it reads; "
                         "choose a folder outside it (default: _build/student)")
    for path in notebooks:
        resolved = path.resolve()
        if book not in resolved.parents:
            raise UsageError(f"{path}: not a notebook under {book.name}/ (expected a path like "
                             f"{book.name}/ch0_practice/01_what_is_a_deq.ipynb)")
        if resolved.suffix != ".ipynb" or not resolved.is_file():
            raise UsageError(f"{path}: no such notebook (expected an existing .ipynb file)")


def book_notebooks(book: Path = BOOK) -> list[Path]:
    """Every notebook of the book (not in hidden or ``_`` folders), sorted."""
    return sorted(p for p in book.rglob("*.ipynb")
                  if not any(part.startswith((".", "_")) for part in p.relative_to(book).parts))


def write_grading_manifest(written: list[Path], out: Path) -> Path:
    """Write ``out/grading_manifest.json``, the check cells of each written page (cell id, graders,
    hash of the source) that ``python -m deqlab.lab.exercises.grade`` checks submissions against.

    The format and the hash are those of ``deqlab/lab/exercises/_manifest.py``, loaded by path (it
    uses only the standard library, so this script still runs without the project's environment).
    Pages already in an existing manifest and not written now are kept."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_deqlab_grading_manifest",
                                                  ROOT / "deqlab" / "lab" / "exercises" / "_manifest.py")
    manifest_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(manifest_module)
    target = out / manifest_module.MANIFEST_NAME
    pages = {}
    if target.is_file():
        try:
            previous = json.loads(target.read_text(encoding="utf-8"))
            if previous.get("format") == manifest_module.FORMAT:
                pages = dict(previous.get("pages", {}))
        except ValueError:
            pages = {}
    fresh = manifest_module.build({path.resolve().relative_to(out.resolve()).as_posix():
                                   json.loads(path.read_text(encoding="utf-8")) for path in written})
    pages.update(fresh["pages"])
    target.write_text(json.dumps({"format": manifest_module.FORMAT, "pages": dict(sorted(pages.items()))},
                                 indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks under book/ (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "student",
                        help="output folder (default: _build/student)")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or book_notebooks()
    try:
        check_paths(notebooks, args.out)
    except UsageError as error:
        parser.error(str(error))  # exit status 2
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
    manifest = write_grading_manifest(written, args.out)
    print(f"wrote the student edition of {len(written)} notebook(s) into {args.out}")
    print(f"wrote the grading manifest {manifest} (python -m deqlab.lab.exercises.grade reads it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
