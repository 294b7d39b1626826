"""The student edition (.ci/student_edition.py, `make student-edition`) on the book's own notebooks:
no solution is left (in any spelling, nor commented out), every reader-code function is a stub,
nothing else changed, no untagged cell reads what only a tagged cell defines, the notebooks are
valid, and converted pages of chapters 0, 2 and 4 still run top to bottom, blank, with their
graders reporting the stubs."""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"


def _load_script():
    spec = importlib.util.spec_from_file_location("student_edition", ROOT / ".ci" / "student_edition.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


se = _load_script()
NOTEBOOKS = se.book_notebooks(BOOK)
STUB = 'raise NotImplementedError("your code here")'


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _read(path: Path) -> dict:
    """The notebook as git's index has it (what the next commit holds), else the working file.

    `make test` runs these checks in the same pytest session in which nbmake executes the book's
    notebooks with --overwrite: a working file may be mid-rewrite or carry a kernel's outputs and
    timing metadata, so the committed (stripped) version is the one to compare against."""
    try:
        blob = subprocess.run(["git", "show", f":{path.relative_to(ROOT).as_posix()}"], cwd=ROOT,
                              capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return json.loads(path.read_text(encoding="utf-8"))
    return json.loads(blob)


@pytest.fixture(scope="module")
def editions() -> dict[Path, tuple[dict, dict]]:
    """(original, student edition) of every notebook of the book."""
    return {path: (_read(path), se.convert(_read(path), str(path.relative_to(ROOT)))) for path in NOTEBOOKS}


def test_the_book_has_what_the_edition_removes():
    # the checks below must be able to fail: the book has solutions and reader-code cells
    assert len(NOTEBOOKS) == 31
    with_solutions = [p for p in NOTEBOOKS if "<summary>Solution</summary>" in p.read_text()]
    with_reader = [p for p in NOTEBOOKS if '"reader-code"' in p.read_text()]
    assert len(with_solutions) == 31 and len(with_reader) >= 20, (len(with_solutions), len(with_reader))


# any <summary> whose words (markup aside) name a solution or an answer
SOLUTION_SUMMARY = re.compile(r"<summary\b[^>]*>(?:(?!</summary).)*?\b(?:solutions?|answers?)\b",
                              re.IGNORECASE | re.DOTALL)


def _all_commented_code(lines: list[str]) -> bool:
    """Lines that are all comments, one of which reads like code (a call or an assignment)."""
    lines = [line for line in lines if line.strip()]
    return bool(lines) and all(line.lstrip().startswith("#") for line in lines) and any(
        re.search(r"\w\(|[\w\]\)]\s*=[^=]|^#\s*(?:import|from|for|with)\b", line.strip()) for line in lines)


def _fenced_blocks(text: str) -> list[list[str]]:
    return [m.group(2).split("\n") for m in re.finditer(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n(.*?)\n[ \t]*\1[ \t]*$",
                                                       text, re.MULTILINE | re.DOTALL)]


def test_no_solution_remains(editions):
    for path, (original, student) in editions.items():
        before = sum(_source(c).count("<summary>Solution") for c in original["cells"] if c["cell_type"] == "markdown")
        assert before > 0, path
        for index, cell in enumerate(student["cells"]):
            text = _source(cell)
            assert not SOLUTION_SUMMARY.search(text), f"{path} cell {index}"
            if cell["cell_type"] == "markdown":
                assert text.count("<details") == text.count("</details>"), f"{path} cell {index}: broken <details>"
                assert not any(_all_commented_code(b) for b in _fenced_blocks(text)), f"{path} cell {index}"
            elif "reader-code" not in _tags(cell):
                assert not _all_commented_code(text.split("\n")[:-1] if se.CODE_NOTE in text else text.split("\n")), \
                    f"{path} cell {index}: commented-out code left"


def test_commented_out_checks_are_removed(editions):
    # the nine "uncomment to check" code cells of the book (some hold the answer: chapter 5 page 1's
    # is the whole power iteration) and the commented code blocks of exercises in the prose
    cells = [c for _, student in editions.values() for c in student["cells"]]
    assert sum(se.CODE_NOTE in _source(c) for c in cells if c["cell_type"] == "code") == 9
    assert sum(_source(c).count(se.MARKDOWN_NOTE) for c in cells if c["cell_type"] == "markdown") >= 7
    [power] = [c for c in editions[BOOK / "ch5_transformers" / "01_weight_tied.ipynb"][1]["cells"]
               if se.CODE_NOTE in _source(c)]
    assert "jax.jvp" not in _source(power) and _source(power) == se.CODE_NOTE


def _without_solutions_by_lines(text: str) -> str:
    """The test's own removal, line by line: from a line opening <details><summary>Solution to the
    line closing it (counting nested <details>), and fenced blocks of commented-out code (replaced by
    the script's note), then runs of blank lines collapsed."""
    out, depth = [], 0
    for block in _fenced_blocks(text):
        if _all_commented_code(block):
            fence = re.search(r"^([ \t]*)(`{3,}|~{3,})[^\n]*\n" + re.escape("\n".join(block)) + r"\n[ \t]*\2[ \t]*$",
                              text, re.MULTILINE)
            text = text[:fence.start()] + fence.group(1) + se.MARKDOWN_NOTE + text[fence.end():]
    for line in text.split("\n"):
        if depth == 0 and line.lstrip().startswith("<details><summary>Solution"):
            depth = 0
            depth += line.count("<details") - line.count("</details>")
            continue
        if depth > 0:
            depth += line.count("<details") - line.count("</details>")
            continue
        out.append(line)
    return _collapse("\n".join(out))


def _collapse(text: str) -> str:
    return re.sub(r"\n\s*\n(\s*\n)+", "\n\n", text).strip()


def test_nothing_else_changes(editions):
    for path, (original, student) in editions.items():
        old_code = [c for c in original["cells"] if c["cell_type"] == "code"]
        new_code = [c for c in student["cells"] if c["cell_type"] == "code"]
        assert len(old_code) == len(new_code), path
        for index, (old, new) in enumerate(zip(old_code, new_code)):
            where = f"{path} code cell {index}"
            added = [t for t in _tags(new) if t not in _tags(old)]
            assert added in ([], ["raises-exception"]), where
            assert [t for t in _tags(new) if t != "raises-exception"] == [t for t in _tags(old) if t != "raises-exception"]
            assert new["outputs"] == [] and new["execution_count"] is None, where
            if "reader-code" not in _tags(old) and _all_commented_code(_source(old).split("\n")):
                # an "uncomment to check" cell: its prose, less "uncomment", then the note
                prose = [line for line in _source(old).split("\n") if line.strip() and not _all_commented_code([line])
                         and "uncomment" not in line.lower()]
                assert _source(new) == "\n".join([*prose, se.CODE_NOTE]), where
            elif "reader-code" not in _tags(old):
                assert _source(new) == _source(old), where
            # the edition drops tags it adds and a kernel's run metadata (timings), nothing else
            run_keys = {"tags", "execution", "collapsed", "scrolled", "ExecuteTime"}
            assert {k: v for k, v in new["metadata"].items() if k not in run_keys} == \
                   {k: v for k, v in old["metadata"].items() if k not in run_keys}, where
        for old, new in zip((c for c in original["cells"] if c["cell_type"] == "markdown"),
                            (c for c in student["cells"] if c["cell_type"] == "markdown")):
            if "<details><summary>Solution" not in _source(old) and \
                    not any(_all_commented_code(b) for b in _fenced_blocks(_source(old))):
                assert _source(new) == _source(old), path  # untouched, byte for byte
        old_md = [_without_solutions_by_lines(_source(c)) for c in original["cells"] if c["cell_type"] == "markdown"]
        new_md = [_collapse(_source(c)) for c in student["cells"] if c["cell_type"] == "markdown"]
        assert [m for m in old_md if m] == new_md, path
        # the cells keep their order: code and markdown interleave as before (empty markdown dropped)
        kinds = [c["cell_type"] for c in original["cells"]
                 if c["cell_type"] != "markdown" or _without_solutions_by_lines(_source(c))]
        assert kinds == [c["cell_type"] for c in student["cells"]], path
        meta = {k: v for k, v in student["metadata"].items() if k != "deqlab_student_edition"}
        assert meta == original["metadata"], path


def _functions(tree: ast.Module):
    """(qualified name, node) of the top-level functions and the methods of top-level classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item


def _signature(node) -> str:
    return ast.dump(ast.Module(body=[ast.FunctionDef(name=node.name, args=node.args, body=[ast.Pass()],
                                                     decorator_list=node.decorator_list, returns=node.returns,
                                                     type_params=[])], type_ignores=[]))


def test_every_reader_function_is_stubbed(editions):
    stubbed = 0
    for path, (original, student) in editions.items():
        old_code = [c for c in original["cells"] if c["cell_type"] == "code"]
        new_code = [c for c in student["cells"] if c["cell_type"] == "code"]
        for index, (old, new) in enumerate(zip(old_code, new_code)):
            if "reader-code" not in _tags(old):
                continue
            where = f"{path} code cell {index}"
            old_tree, new_tree = ast.parse(se._parseable(_source(old))), ast.parse(se._parseable(_source(new)))
            old_functions, new_functions = dict(_functions(old_tree)), dict(_functions(new_tree))
            if not old_functions and not any(isinstance(n, ast.ClassDef) for n in old_tree.body):
                # a cell of assignments: it raises, and says what to define
                assert _source(new).rstrip().endswith(STUB) and _source(new).startswith("# Your code here"), where
                assert "raises-exception" in _tags(new), where
                continue
            assert old_functions.keys() == new_functions.keys(), where
            for name, node in new_functions.items():
                before = old_functions[name]
                assert _signature(node) == _signature(before), f"{where}: {name}'s signature changed"
                assert ast.get_docstring(node) == ast.get_docstring(before), f"{where}: {name}'s docstring"
                body = node.body[1:] if ast.get_docstring(node) is not None else node.body
                assert len(body) == 1 and ast.dump(body[0]) == ast.dump(ast.parse(STUB).body[0]), f"{where}: {name} is not a stub"
                stubbed += 1
            # the cell's other top-level statements (imports, wiring, checks) are kept as they were
            kept = [ast.dump(n) for n in old_tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and not isinstance(n, ast.ClassDef)]
            assert kept == [ast.dump(n) for n in new_tree.body if not isinstance(
                n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))], where
    assert stubbed >= 30, stubbed


def test_output_notebooks_are_valid(editions):
    nbformat = pytest.importorskip("nbformat")
    for path, (_, student) in editions.items():
        nbformat.validate(nbformat.from_dict(copy.deepcopy(student)))


def test_graded_pages_have_no_cascades(editions):
    # on the pages with graders (chapter 0), every cell tagged raises-exception uses the reader's
    # code itself: no cell of the page's own experiments is lost in the student edition
    for path, (_, student) in editions.items():
        if path.parent.name == "ch0_practice":
            assert student["metadata"]["deqlab_student_edition"]["cascade_cells"] == [], path


# --- the pieces, on constructed input ------------------------------------------------------------


def test_remove_solutions_nested_and_refused_forms():
    text = ("1. Do it.\n\n<details><summary>Solution</summary>\n\nA <details><summary>hint</summary>\n\nx\n\n"
            "</details> and more.\n\n</details>\n\n2. Next.\n\n<details><summary>Verification: kept</summary>\n\n"
            "y\n\n</details>")
    assert se.remove_solutions(text) == ("1. Do it.\n\n2. Next.\n\n<details><summary>Verification: kept</summary>\n\n"
                                         "y\n\n</details>")
    with pytest.raises(se.ConversionError, match="never closed"):
        se.remove_solutions("<details><summary>Solution</summary>\n\nopen")
    with pytest.raises(se.ConversionError, match="does not remove"):
        se.remove_solutions(":::{admonition} Solution\n:class: dropdown\n\nx\n:::")


def _cell(source: str, kind: str = "code", tags: list[str] | None = None) -> dict:
    cell = {"cell_type": kind, "metadata": {"tags": tags} if tags else {}, "source": source}
    if kind == "code":
        cell.update(outputs=[], execution_count=None)
    return cell


def test_which_cells_are_tagged():
    nb = {"cells": [
        _cell("import numpy as np\nw = np.ones(3)"),
        _cell('def my_f(x):\n    """Doc."""\n    # a comment of the solution\n    return 2 * x\n\n\nmy_f.note = 1',
              tags=["reader-code"]),
        _cell("a = np.ones(2)\nreport = grade(my_f)\nb = 3"),      # passes the stub on: b may be missing
        _cell("assert report.passed, report"),                    # reads a tainted variable
        _cell("print(b)"),                                        # a cascade: b assigned after the check
        _cell("print(a, w)"),                                     # a was assigned before the check: runs
        _cell("b = 4\nprint(b)"),                                 # b bound afresh: runs
        _cell("for b in range(2):\n    print(b)"),                # loop variable, not a read: runs
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    student = se.convert(nb, "constructed")
    cells = student["cells"]
    assert _source(cells[1]).split("\n")[:3] == ["def my_f(x):", '    """Doc."""', "    " + STUB]
    assert "my_f.note = 1" in _source(cells[1])
    tagged = [i for i, c in enumerate(cells) if "raises-exception" in _tags(c)]
    assert tagged == [2, 3, 4], tagged
    assert student["metadata"]["deqlab_student_edition"]["cascade_cells"] == [4]


def test_make_target_writes_every_notebook(tmp_path):
    recipe = (ROOT / "Makefile").read_text()
    assert re.search(r"^student-edition:\n(\t.*\n)*\t\$\(PYTHON\) \.ci/student_edition\.py --out \$\(STUDENT\)",
                     recipe, re.MULTILINE)
    out = tmp_path / "student"
    run = subprocess.run([sys.executable, str(ROOT / ".ci" / "student_edition.py"), "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    written = sorted(p.relative_to(out) for p in out.rglob("*.ipynb"))
    assert written == sorted(p.relative_to(BOOK) for p in NOTEBOOKS)


# --- the graders in the student edition ----------------------------------------------------------


def test_graders_report_a_stub_with_a_hint():
    exercises = pytest.importorskip("deqlab.lab.exercises")

    def my_layer(z, W, U, b, x):
        raise NotImplementedError("your code here")

    def my_residual(fz, z):
        raise NotImplementedError("your code here")

    for report in (exercises.check_layer(my_layer), exercises.check_residual(my_residual)):
        assert not report.passed
        assert "NotImplementedError: your code here" in str(report)
        assert "hint: your code raised" in str(report) and "not written yet" in str(report)


@pytest.mark.slow
def test_a_student_page_runs_and_its_grader_reports_the_stub(tmp_path):
    """Chapter 0 page 3 (one grader, check_implicit_gradient), converted and executed with nbclient:
    the notebook runs to the end (errors only in cells tagged raises-exception), and the grader
    cell's error is the grader's report, a failed check with a hint, not a crash inside it."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    source = BOOK / "ch0_practice" / "03_implicit_gradients.ipynb"
    [target] = se.write_edition([source], tmp_path, BOOK)
    nb = nbformat.read(target, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on an error in an untagged cell
    errors = {i: o for i, c in enumerate(nb.cells) if c.cell_type == "code"
              for o in c.outputs if o.output_type == "error"}
    assert errors, "the stubbed page raised nowhere: the stubs are not used"
    for index in errors:
        assert "raises-exception" in nb.cells[index].metadata.get("tags", []), index
    [grader] = [i for i, c in enumerate(nb.cells)
                if c.cell_type == "code" and "check_implicit_gradient(my_fixed_point)" in c.source]
    error = errors[grader]
    assert error.ename == "AssertionError", error.ename  # the page's `assert report.passed, report`
    assert "check_implicit_gradient(my_fixed_point): FAILED" in error.evalue
    assert "hint: your code raised NotImplementedError: your code here" in error.evalue
    # the cells after the grader, deqlab's own experiments, ran
    later = [c for c in nb.cells[grader + 1:] if c.cell_type == "code"]
    assert later and all(c.execution_count is not None and not any(o.output_type == "error" for o in c.outputs)
                         for c in later)


# --- solutions in every spelling, commented-out code ---------------------------------------------


@pytest.mark.parametrize("summary", [
    "Solution", "Solutions", "solution", "SOLUTION", "<em>Solution</em>", "<b>Solution</b>", "<strong>Solutions</strong>",
    "**Solution**", "_Solution_", "*Answer*", "Answers", "Show the solution", "Show the answer", "Solution to 2",
    " <i>Solution (exercise 3)</i> ", "`solution`", "Hint and solution",
])
def test_every_spelling_of_a_solution_is_removed(summary):
    text = (f"1. Do it.\n\n<details>\n<summary>{summary}</summary>\n\nThe answer is 42.\n\n</details>\n\n"
            "2. Next.\n\n<details><summary>Hint</summary>\n\nLook up.\n\n</details>\n")
    assert se.remove_solutions(text) == "1. Do it.\n\n2. Next.\n\n<details><summary>Hint</summary>\n\nLook up.\n\n</details>\n"
    # with attributes on the tags, indented in a list item, inside a hint
    nested = f'- a\n\n  <details open><summary class="x">{summary}</summary>\n\n  42\n\n  </details>\n\n- b\n'
    assert se.remove_solutions(nested) == "- a\n\n- b\n"
    hint = f"<details><summary>Hint</summary>\n\nUp.\n\n<details><summary>{summary}</summary>\n\n42\n\n</details>\n\n</details>"
    assert "42" not in se.remove_solutions(hint) and "Up." in se.remove_solutions(hint)


@pytest.mark.parametrize("form", [
    ":::{admonition} Solution\n:class: dropdown\n\nx\n:::",
    "```{admonition} **Answer** to 1\n:class: dropdown\nx\n```",
    ":::{dropdown} Solutions\nx\n:::",
    "```{toggle} Show the answer\nx\n```",
    "```{solution} ex-1\nx\n```",
    "<summary>Solution</summary> with no details",
])
def test_solutions_in_other_forms_are_refused(form):
    with pytest.raises(se.ConversionError, match="does not remove"):
        se.remove_solutions(form)
    # titles that are not solutions are kept
    assert se.remove_solutions(":::{admonition} On a TPU\nx\n:::") == ":::{admonition} On a TPU\nx\n:::"


def test_commented_out_code_is_removed():
    check = ("# Exercise 3: uncomment to check your answer against deqlab.\n# my_s = ...   # your value\n"
             "# np.testing.assert_allclose(my_s, fp.s_transform(0.2), rtol=1e-8)")
    assert se.remove_commented_code_cell(check) == se.CODE_NOTE
    whole = "# f_one = lambda z: g(z)\n# for _ in range(120):\n#     v = step(v)\n# assert v > 0"
    assert se.remove_commented_code_cell(whole) == se.CODE_NOTE
    kept = "# A cell of prose comments only.\n# Nothing to run here."
    assert se.remove_commented_code_cell(kept) == kept
    live = "x = 1  # live code\n# y = 2"
    assert se.remove_commented_code_cell(live) == live
    markdown = ("2. *(implement)* Measure it.\n\n   ```python\n   # q = float(jnp.mean(a ** 2))\n"
                "   # np.testing.assert_allclose(q, 0.3)\n   ```\n\nMore.\n\n```python\nx = 1  # live\n```\n\n"
                "```text\n# not python\n```")
    assert se.remove_commented_code_markdown(markdown) == (
        f"2. *(implement)* Measure it.\n\n   {se.MARKDOWN_NOTE}\n\nMore.\n\n```python\nx = 1  # live\n```\n\n"
        "```text\n# not python\n```")
    nb = {"cells": [_cell(check), _cell("print(1)")], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    assert [_source(c) for c in se.convert(nb, "constructed")["cells"]] == [se.CODE_NOTE, "print(1)"]


# --- which cells are tagged: every way a cell binds or changes a name ---------------------------


@pytest.mark.parametrize(("later", "reads"), [
    ("curves = {}\nfor c in (2.0, 1.25):\n    curves[c] = my_f(c)", "curves[2.0]"),   # subscript target
    ("rows = []\nfor c in (1, 2):\n    rows.append(my_f(c))", "rows[0]"),             # a mutating method
    ("total = 0\ntotal += my_f(1)", "total"),                                         # augmented assignment
    ("class B:\n    pass\nbox = B()\nbox.value = my_f(1)", "box.value"),              # attribute target
    ("for r in [my_f(1)]:\n    pass", "r"),                                           # loop variable
    ("import contextlib\nwith contextlib.nullcontext(my_f(1)) as v:\n    pass", "v"),   # with ... as
    ("try:\n    my_f(1)\nexcept NotImplementedError as err:\n    saved = err\n", "saved"),  # except body
    ("ok = [(w := my_f(i)) for i in range(2)]", "w"),                                 # := in a comprehension
    ("table = {1: 2}\ntable.setdefault(3, []).append(my_f(1))", "table[3]"),          # chained method
    ("d = {'k': 1}\ndel d['k']\nd['k'] = my_f(1)", "d['k']"),
])
def test_every_way_to_bind_or_change_a_name_is_followed(later, reads):
    nb = {"cells": [
        _cell("def my_f(x):\n    return 2 * x", tags=["reader-code"]),
        _cell(later),
        _cell(f"print({reads})"),
        _cell("print('independent')"),
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    cells = se.convert(nb, "constructed")["cells"]
    assert [("raises-exception" in _tags(c)) for c in cells] == [False, True, True, False], later


def test_a_fresh_binding_clears_but_a_change_in_place_keeps_the_taint():
    nb = {"cells": [
        _cell("def my_f(x):\n    return 2 * x", tags=["reader-code"]),
        _cell("curves = {1: my_f(1)}"),
        _cell("curves[2] = 3"),          # still holds the stub's value
        _cell("print(curves)"),
        _cell("curves = {}"),            # bound afresh
        _cell("print(curves)"),
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    cells = se.convert(nb, "constructed")["cells"]
    assert ["raises-exception" in _tags(c) for c in cells] == [False, True, True, True, False, False]


# --- the book: no untagged cell reads what only a tagged cell defines -----------------------------

MUTATORS = {"append", "extend", "insert", "update", "setdefault", "pop", "popitem", "clear", "add", "discard",
            "remove", "sort", "reverse"}
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
          ast.DictComp, ast.GeneratorExp)


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _top_level_nodes(statement):
    """The nodes of a statement in its own scope (not inside a def, class, lambda or comprehension)."""
    todo = [statement]
    while todo:
        node = todo.pop()
        yield node
        if node is statement or not isinstance(node, SCOPES):
            todo.extend(ast.iter_child_nodes(node))


def _binds(statement) -> tuple[set[str], set[str]]:
    """(names bound, names changed in place) by a statement, found independently of the script."""
    bound, changed = set(), set()
    for node in _top_level_nodes(statement):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, (ast.Subscript, ast.Attribute)) and not isinstance(node.ctx, ast.Load):
            changed.add(_root(node))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            changed.add(_root(node.func.value))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.NamedExpr):
            bound.add(node.target.id)
    if isinstance(statement, SCOPES):  # a comprehension's := leaks
        bound |= {n.target.id for n in ast.walk(statement) if isinstance(n, ast.NamedExpr)}
    return bound, changed - {None}


def _reads(statement) -> set[str]:
    """Names a statement reads from the notebook's scope (over-approximated: every Name it loads,
    less the names bound inside it by a loop, a comprehension, a lambda or a def's parameters)."""
    local = set()
    for node in ast.walk(statement):
        if isinstance(node, (ast.For, ast.comprehension)):
            local |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            local |= {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                                      *filter(None, [args.vararg, args.kwarg])]}
            if not isinstance(node, ast.Lambda):
                local |= {n.id for b in node.body for n in ast.walk(b) if isinstance(n, ast.Name)
                          and isinstance(n.ctx, ast.Store)}
    loads = {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    if isinstance(statement, ast.AugAssign) and isinstance(statement.target, ast.Name):
        loads.add(statement.target.id)
    return loads - local


def _calls_stub(statement, stubs: set[str]) -> bool:
    bases = {id(n.value) for n in ast.walk(statement) if isinstance(n, ast.Attribute)}
    return any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in stubs and id(n) not in bases
               for n in ast.walk(statement))


def _parse(source: str) -> ast.Module:
    """A cell's source with IPython magics and shell lines as `pass` (an `if` around `%pip` parses)."""
    return ast.parse("\n".join(line[: len(line) - len(line.lstrip())] + "pass" if line.lstrip().startswith(("%", "!"))
                               else line for line in source.split("\n")))


def unsafe_reads(original: dict, student: dict) -> list[str]:
    """Cells of the student edition, not tagged raises-exception, that read a name which only a
    tagged cell (stubbed, removed or raising) binds or last changed, or that call a stub."""
    problems = []
    stubs: set[str] = set()
    bad: set[str] = set()  # names whose value comes from a cell that may not have run (or ran on stubs)
    old_code = [c for c in original["cells"] if c["cell_type"] == "code"]
    new_code = [c for c in student["cells"] if c["cell_type"] == "code"]
    for index, (old, new) in enumerate(zip(old_code, new_code)):
        tree = _parse(_source(new))
        if "reader-code" in _tags(old):
            defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
            stubs |= defined
            if not defined:  # a cell of assignments, replaced by a raise: nothing it binds exists
                for statement in _parse(_source(old)).body:
                    bad |= set().union(*_binds(statement))
                continue
        tagged = "raises-exception" in _tags(new)
        stopped = False
        for statement in tree.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and statement.name in stubs:
                continue
            bound, changed = _binds(statement)
            reads = _reads(statement)
            risky = bool(reads & bad) or _calls_stub(statement, stubs)
            if not tagged and risky and not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                problems.append(f"code cell {index} reads {sorted(reads & bad) or 'a stub'}: "
                                f"{ast.unparse(statement)[:80]!r}")
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                (bad.update if risky else bad.difference_update)(bound)
            elif tagged and (risky or stopped):
                stopped = True
                bad |= bound | changed
            else:
                bad -= bound
    return problems


def test_no_untagged_cell_reads_what_only_a_tagged_cell_defines(editions):
    # static and fast: the student edition of every page runs top to bottom, blank, only if no cell
    # left untagged reads a name that a stubbed, removed or raising cell defines (chapter 4 page 2's
    # figure read `curves[2.0]`, filled by the loop that calls the reader's code: KeyError: 2.0)
    problems = {path.relative_to(BOOK).as_posix(): p for path, (original, student) in editions.items()
                if (p := unsafe_reads(original, student))}
    assert problems == {}


def test_the_check_finds_the_missed_dependency():
    # the check above, on chapter 4 page 2 as the old analysis tagged it: the figure cell is flagged
    path = BOOK / "ch4_kglm" / "02_kglm_as_deq.ipynb"
    original = _read(path)
    student = se.convert(original, "book/ch4_kglm/02_kglm_as_deq.ipynb")
    code = [c for c in student["cells"] if c["cell_type"] == "code"]
    [figure] = [c for c in code if "ax.semilogy(R, curves[c]" in _source(c)]
    assert "raises-exception" in _tags(figure)
    figure["metadata"]["tags"] = [t for t in _tags(figure) if t != "raises-exception"]
    assert any("'curves'" in p for p in unsafe_reads(original, student))


# --- outputs: never over the inputs, no absolute paths --------------------------------------------


@pytest.mark.parametrize("out", ["book", "book/student", "book/ch0_practice"])
def test_the_edition_never_overwrites_the_book(out):
    before = {p: p.stat().st_mtime_ns for p in NOTEBOOKS}
    run = subprocess.run([sys.executable, str(ROOT / ".ci" / "student_edition.py"), "--out", str(ROOT / out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert re.search(r"error: --out .* is (the book folder|inside the book folder) book/: the student edition "
                     r"would overwrite the notebooks it reads", run.stderr), run.stderr
    assert {p: p.stat().st_mtime_ns for p in NOTEBOOKS} == before
    assert not (ROOT / "book" / "student").exists()


def test_a_notebook_outside_the_book_is_a_usage_error(tmp_path):
    stray = tmp_path / "x.ipynb"
    stray.write_text("{}")
    run = subprocess.run([sys.executable, str(ROOT / ".ci" / "student_edition.py"), "--out", str(tmp_path / "o"),
                          str(stray)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "x.ipynb: not a notebook under book/" in run.stderr


def test_no_absolute_path_in_the_edition(tmp_path):
    written = se.write_edition(NOTEBOOKS[:3], tmp_path / "student", BOOK)
    for path in written:
        text = path.read_text()
        assert str(ROOT) not in text and str(tmp_path) not in text, path
        assert json.loads(text)["metadata"]["deqlab_student_edition"]["source"].startswith("book/")


# --- blank student pages run top to bottom --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("page", ["ch4_kglm/02_kglm_as_deq.ipynb", "ch2_freeprob/01_transforms.ipynb"])
def test_a_blank_student_page_runs_top_to_bottom(tmp_path, monkeypatch, page):
    """The student edition of chapter 4 page 2 (a loop over the reader's function fills the dict a
    later figure reads) and of chapter 2 page 1, blank, executed with nbclient at the quick scale:
    no error outside the cells tagged raises-exception, and the cells after the exercise ran."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("DEQLAB_SCALE", "quick")
    [target] = se.write_edition([BOOK / page], tmp_path, BOOK)
    nb = nbformat.read(target, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(target.parent)}})
    client.execute()  # raises CellExecutionError on an error in an untagged cell
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [c for c in code if any(o.output_type == "error" for o in c.outputs)]
    assert errors and all("raises-exception" in c.metadata.get("tags", []) for c in errors)
    assert any("NotImplementedError" in o.get("ename", "") or "your code here" in o.get("evalue", "")
               for c in errors for o in c.outputs if o.output_type == "error")
    assert all(c.execution_count is not None for c in code)  # every cell ran, none was skipped
    first = code.index(errors[0])
    later = [c for c in code[first + 1:] if "raises-exception" not in c.metadata.get("tags", [])]
    assert later  # and the page's own experiments after the exercise ran without error
