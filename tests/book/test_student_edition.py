"""The student edition (.ci/student_edition.py, `make student-edition`) on the book's own notebooks:
no solution is left, every reader-code function is a stub, nothing else changed, the notebooks are
valid, and a converted chapter-0 page still runs with its graders reporting the stubs."""

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


def test_no_solution_remains(editions):
    for path, (original, student) in editions.items():
        before = sum(_source(c).count("<summary>Solution") for c in original["cells"] if c["cell_type"] == "markdown")
        assert before > 0, path
        for index, cell in enumerate(student["cells"]):
            text = _source(cell)
            assert not re.search(r"<summary>\s*Solution", text, re.IGNORECASE), f"{path} cell {index}"
            if cell["cell_type"] == "markdown":
                assert text.count("<details") == text.count("</details>"), f"{path} cell {index}: broken <details>"


def _without_solutions_by_lines(text: str) -> str:
    """The test's own removal, line by line: from a line opening <details><summary>Solution to the
    line closing it (counting nested <details>), then runs of blank lines collapsed."""
    out, depth = [], 0
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
            if "reader-code" not in _tags(old):
                assert _source(new) == _source(old), where
            # the edition drops tags it adds and a kernel's run metadata (timings), nothing else
            run_keys = {"tags", "execution", "collapsed", "scrolled", "ExecuteTime"}
            assert {k: v for k, v in new["metadata"].items() if k not in run_keys} == \
                   {k: v for k, v in old["metadata"].items() if k not in run_keys}, where
        for old, new in zip((c for c in original["cells"] if c["cell_type"] == "markdown"),
                            (c for c in student["cells"] if c["cell_type"] == "markdown")):
            if "<details><summary>Solution" not in _source(old):
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
