"""The Jupyter Book configuration is consistent with the files in book/ and with pyproject.toml."""

import tomllib
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"


def _config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def _toc() -> dict:
    return yaml.safe_load((ROOT / "_toc.yml").read_text())


def _toc_files() -> list[str]:
    toc = _toc()
    files = [toc["root"]]

    def walk(entries):
        for e in entries or []:
            if "file" in e:
                files.append(e["file"])
            walk(e.get("sections"))
            walk(e.get("chapters"))

    walk(toc.get("parts"))
    walk(toc.get("chapters"))
    return files


def _resolve(docname: str) -> Path:
    for suffix in (".md", ".ipynb"):
        p = ROOT / (docname + suffix)
        if p.exists():
            return p
    raise AssertionError(f"_toc.yml names {docname!r}, which is neither {docname}.md nor .ipynb")


def test_toc_entries_exist_once():
    files = _toc_files()
    assert len(files) == len(set(files)), "a page is listed twice in _toc.yml"
    for f in files:
        _resolve(f)


def test_every_book_page_is_in_the_toc():
    listed = {_resolve(f).relative_to(ROOT) for f in _toc_files()}
    pages = {
        p.relative_to(ROOT)
        for p in list(BOOK.rglob("*.md")) + list(BOOK.rglob("*.ipynb"))
        if not any(part.startswith((".", "_")) for part in p.relative_to(BOOK).parts)
    }
    missing = sorted(str(p) for p in pages - listed)
    assert not missing, f"pages not in _toc.yml (they would not be built or tested in the book): {missing}"


def test_repository_url_matches_pyproject():
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    repo = _config()["repository"]
    assert repo["url"] == urls["Repository"] == "https://github.com/deqlab/equilibrium"
    assert repo["branch"] == "main"


def test_execution_settings():
    cfg = _config()
    # `auto` + the local extension book/_ext/executed_notebooks.py: notebooks already executed by
    # `make test` (nbmake --overwrite) are not executed again by `make book`.
    assert cfg["execute"]["execute_notebooks"] == "auto"
    assert cfg["execute"]["timeout"] >= 900
    sphinx_cfg = cfg["sphinx"]["config"]
    assert sphinx_cfg["nb_execution_raise_on_error"] is True
    assert cfg["only_build_toc_files"] is True
    assert "executed_notebooks" in cfg["sphinx"]["local_extensions"]
    assert cfg["launch_buttons"]["colab_url"] == "https://colab.research.google.com"


def test_bibliography_file_configured():
    cfg = _config()
    for bib in cfg["bibtex_bibfiles"]:
        assert (ROOT / bib).is_file()


def _figure_cells():
    import json

    for path in sorted(BOOK.glob("*/*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "code" and "figure" in cell["metadata"].get("mystnb", {}):
                yield path.relative_to(ROOT), index, "".join(cell["source"])


def test_figure_cells_end_without_a_displayed_value():
    # myst-nb wraps every displayed output of a figure cell in the figure: a trailing expression
    # (an execute_result beside the plot) duplicates the figure's label and breaks -W builds.
    # glue(..., display=False) records are not displayed; plt.show() and tight_layout() return None.
    import ast

    cells = list(_figure_cells())
    assert cells, "no figure cells found"
    offending = []
    for path, index, source in cells:
        body = ast.parse("\n".join(line for line in source.splitlines() if not line.startswith(("%", "!")))).body
        last = body[-1]
        displays = isinstance(last, ast.Expr) and not (
            isinstance(last.value, ast.Call)
            and ast.unparse(last.value.func) in {"plt.show", "plt.tight_layout", "fig.tight_layout", "glue"}
        )
        if displays:
            offending.append(f"{path} cell {index}: {ast.unparse(last)}")
    assert not offending, "figure cells ending with a displayed value:\n" + "\n".join(offending)


def test_install_instructions_pin_the_current_release():
    import deqlab

    pinned = f"git+https://github.com/deqlab/equilibrium@v{deqlab.__version__}"
    for name in ("README.md", "book/intro.md"):
        text = (ROOT / name).read_text()
        assert pinned in text, f"{name} must show the install pinned to {pinned}"
        stale = [line for line in text.splitlines() if "github.com/deqlab/equilibrium@v" in line and pinned not in line]
        assert not stale, f"{name} pins another release: {stale}"
