"""The book's notebooks as committed: no outputs, no function definitions, a guarded Colab install.

`make test` runs the notebooks with ``nbmake --overwrite``, which writes outputs into the working
tree (so that `make book` need not execute them again). The output check therefore reads the
version of each notebook in the git index (what the next commit will contain), never the working
file; run `make strip` before `git add`. Notebooks that git does not track yet are checked for
structure from the working tree (their outputs are checked once they are added).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

import deqlab

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
REPO_URL = "https://github.com/deqlab/equilibrium"


def _git(*args: str) -> str | None:
    if shutil.which("git") is None:
        return None
    try:
        res = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None
    return res.stdout


def _in_git_work_tree() -> bool:
    out = _git("rev-parse", "--show-toplevel")
    return out is not None and Path(out.strip()).resolve() == ROOT


def _collect() -> list[tuple[str, str]]:
    """(path, source) pairs: 'index' for notebooks git tracks, 'worktree' otherwise."""
    if _in_git_work_tree():
        tracked = (_git("ls-files", "-z", "--", "*.ipynb") or "").split("\0")
        untracked = (_git("ls-files", "-z", "--others", "--exclude-standard", "--", "*.ipynb") or "")
        items = [(p, "index") for p in tracked if p]
        items += [(p, "worktree") for p in untracked.split("\0") if p]
        return sorted(items)
    return sorted(
        (p.relative_to(ROOT).as_posix(), "worktree")
        for p in ROOT.rglob("*.ipynb")
        if not any(part.startswith((".", "_build")) for part in p.relative_to(ROOT).parts)
    )


NOTEBOOKS = _collect()


def _load(path: str, where: str) -> dict:
    if where == "index":
        text = _git("show", f":{path}")  # the staged blob, not the (possibly executed) work file
        assert text is not None, f"could not read {path} from the git index"
    else:
        text = (ROOT / path).read_text(encoding="utf-8")
    return json.loads(text)


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _code_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c.get("cell_type") == "code"]


def test_there_are_notebooks():
    assert any(p.startswith("book/") for p, _ in NOTEBOOKS)


@pytest.fixture(params=NOTEBOOKS, ids=[p for p, _ in NOTEBOOKS])
def notebook(request):
    path, where = request.param
    return path, where, _load(path, where)


def test_format(notebook):
    path, _, nb = notebook
    assert nb.get("nbformat") == 4, path
    assert nb.get("metadata", {}).get("kernelspec", {}).get("name") == "python3", (
        f"{path}: kernelspec must be python3"
    )
    # nbformat 4.5 gives every cell an id: nbconvert warns on a missing one (a future hard error),
    # and the grading manifest and the student edition name cells by id
    missing = [i for i, c in enumerate(nb["cells"]) if not c.get("id")]
    assert not missing, f"{path}: cells {missing} have no id"
    ids = [c["id"] for c in nb["cells"]]
    assert len(set(ids)) == len(ids), f"{path}: duplicate cell ids"


def test_no_outputs_in_git(notebook):
    path, where, nb = notebook
    if where != "index":
        pytest.skip(f"{path} is not tracked by git yet; its committed outputs are checked once added")
    dirty = [
        i
        for i, c in enumerate(nb["cells"])
        if c.get("cell_type") == "code"
        and (c.get("outputs") or c.get("execution_count") is not None or "execution" in c.get("metadata", {}))
    ]
    assert not dirty, f"{path}: cells {dirty} have outputs/execution counts in git; run `make strip`"


DEF_AT_LINE_START = re.compile(r"^(async\s+)?def\s", re.MULTILINE)


READER_CODE = "reader-code"
"""Cell tag of the reader's own version of something deqlab provides (chapter 0 builds each piece
once before using deqlab's): the one place a notebook may define functions, each checked against
deqlab's version in a later cell."""


def test_no_function_definitions(notebook):
    path, _, nb = notebook
    bad = [
        i
        for i, c in enumerate(nb["cells"])
        if c.get("cell_type") == "code"
        and DEF_AT_LINE_START.search(_source(c))
        and READER_CODE not in c.get("metadata", {}).get("tags", [])
    ]
    assert not bad, (
        f"{path}: cells {bad} define functions; put them in the deqlab package (or, for the reader's "
        f"own version of a deqlab piece that a later cell checks against deqlab, tag the cell {READER_CODE!r})"
    )


COLAB_GUARD = re.compile(r'^if\s+["\']google\.colab["\']\s+in\s+sys\.modules\s*:\s*(#.*)?$')
PIP_LINE = re.compile(r"^\s*[%!]\s*pip\s+install\b")


def test_first_code_cell_is_guarded_colab_install(notebook):
    path, _, nb = notebook
    cells = _code_cells(nb)
    assert cells, f"{path} has no code cell"
    lines = [ln for ln in _source(cells[0]).splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert "import sys" in lines, f"{path}: first code cell must `import sys`"
    guards = [i for i, ln in enumerate(lines) if COLAB_GUARD.match(ln)]
    assert guards, f'{path}: first code cell must test `"google.colab" in sys.modules`'
    pips = [i for i, ln in enumerate(lines) if PIP_LINE.match(ln)]
    assert pips, f"{path}: first code cell must `%pip install` deqlab on Colab"
    for i in pips:
        # every pip line sits in the block of a preceding Colab guard (indented under it)
        g = max((j for j in guards if j < i), default=None)
        assert g is not None, f"{path}: `{lines[i].strip()}` runs outside the Colab guard"
        indent = len(lines[g]) - len(lines[g].lstrip())
        assert all(len(ln) - len(ln.lstrip()) > indent for ln in lines[g + 1 : i + 1]), (
            f"{path}: `{lines[i].strip()}` is not inside the `if \"google.colab\" in sys.modules:` block"
        )
        # Pinned to the release the page was written for (tag v<deqlab.__version__>), so that a page
        # keeps working when main moves on; and nothing else (glue() needs no myst-nb there).
        pinned = f"deqlab[lab] @ git+{REPO_URL}@v{deqlab.__version__}"
        assert shlex.split(lines[i].split("install", 1)[1]) == ["-q", pinned], (
            f"{path}: the Colab cell must install exactly {pinned} (got `{lines[i].strip()}`)"
        )


def test_no_unguarded_installs_elsewhere(notebook):
    path, _, nb = notebook
    bad = [
        i
        for i, c in enumerate(_code_cells(nb)[1:], start=1)
        if any(PIP_LINE.match(ln) for ln in _source(c).splitlines())
    ]
    assert not bad, f"{path}: code cells {bad} install packages; only the first (Colab) cell may"
