"""book/_ext/executed_notebooks.py: stored outputs are rendered only when made from current sources."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ext():
    spec = importlib.util.spec_from_file_location("executed_notebooks", ROOT / "book/_ext/executed_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _notebook(code=("x = 1", "print(x)"), executed=True, error=False):
    cells = [{"cell_type": "markdown", "metadata": {}, "source": "# Title"}]
    for i, src in enumerate(code):
        outputs = [{"output_type": "stream", "name": "stdout", "text": "1\n"}] if executed else []
        if error and i == len(code) - 1:
            outputs = [{"output_type": "error", "ename": "AssertionError", "evalue": "", "traceback": []}]
        cells.append({"cell_type": "code", "metadata": {}, "source": src, "outputs": outputs,
                      "execution_count": i + 1 if executed else None})
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.delenv("DEQLAB_SCALE", raising=False)
    (tmp_path / "deqlab").mkdir()
    (tmp_path / "deqlab" / "core.py").write_text("A = 1\n")
    (tmp_path / "book").mkdir()
    return tmp_path


def _write(repo, nb, name="page.ipynb"):
    path = repo / "book" / name
    path.write_text(json.dumps(nb))
    return path, f"book/{name}"


def test_committed_notebook_without_outputs_is_left_to_auto(ext, repo):
    nb = _notebook(executed=False)
    assert ext.execution_mode(nb, "book/page.ipynb", repo) is None


def test_stamped_notebook_is_rendered_from_its_outputs(ext, repo):
    nb = _notebook()
    path, key = _write(repo, nb)
    assert ext.stamp([path], repo) == [key]
    assert ext.execution_mode(nb, key, repo) == "off"


def test_executed_but_never_stamped_notebook_is_executed_again(ext, repo):
    nb = _notebook()
    assert ext.execution_mode(nb, "book/page.ipynb", repo) == "force"


def test_edited_code_after_the_run_forces_execution(ext, repo):
    nb = _notebook()
    path, key = _write(repo, nb)
    ext.stamp([path], repo)
    nb["cells"][1]["source"] = "x = 2"
    assert ext.execution_mode(nb, key, repo) == "force"


def test_markdown_edits_do_not_invalidate_outputs(ext, repo):
    nb = _notebook()
    path, key = _write(repo, nb)
    ext.stamp([path], repo)
    nb["cells"][0]["source"] = "# Another title"
    assert ext.execution_mode(nb, key, repo) == "off"


def test_changed_deqlab_source_forces_execution(ext, repo):
    nb = _notebook()
    path, key = _write(repo, nb)
    ext.stamp([path], repo)
    (repo / "deqlab" / "core.py").write_text("A = 2\n")
    assert ext.execution_mode(nb, key, repo) == "force"


def test_a_new_stored_table_that_pages_read_forces_execution(ext, repo):
    # chapter 5 page 6 glues numbers read from book/_data/dry_runs.json: a new table must not leave
    # the old numbers on the page while the box beside them includes the new table
    nb = _notebook()
    path, key = _write(repo, nb)
    ext.stamp([path], repo)  # the table absent
    (repo / "book" / "_data").mkdir()
    for name in ext.DATA_READ:
        (repo / name).write_text('{"experiments": {}}\n')
        assert ext.execution_mode(nb, key, repo) == "force", name
        ext.stamp([path], repo)
        assert ext.execution_mode(nb, key, repo) == "off", name


def test_other_scale_forces_execution(ext, repo, monkeypatch):
    nb = _notebook()
    path, key = _write(repo, nb)
    ext.stamp([path], repo)
    monkeypatch.setenv("DEQLAB_SCALE", "full")
    assert ext.execution_mode(nb, key, repo) == "force"


def test_failed_or_partial_runs_are_not_stamped_and_lose_their_stamp(ext, repo):
    good = _notebook()
    path, key = _write(repo, good)
    ext.stamp([path], repo)
    failed = _notebook(error=True)
    path.write_text(json.dumps(failed))
    assert ext.stamp([path], repo) == []
    assert key not in ext.read_stamps(repo)
    partial = _notebook()
    partial["cells"][2]["execution_count"] = None
    assert ext.execution_mode(partial, key, repo) == "force"
