"""The Colab edition (.ci/colab_edition.py, `make colab-edition`): on a small synthetic executed book
every MyST role and directive becomes the Markdown the site shows, code cells stay identical, and
bad input is an error naming notebook, cell and role; on the book's own notebooks every role is
resolved, or, where no executed build is there, exactly the missing glue values are reported."""

from __future__ import annotations

import base64
import copy
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_script():
    spec = importlib.util.spec_from_file_location("colab_edition", ROOT / ".ci" / "colab_edition.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["colab_edition"] = module  # dataclasses resolve their module
    spec.loader.exec_module(module)
    return module


pytest.importorskip("pybtex", reason="the book's Sphinx toolchain (pybtex) is not installed (pip install -e '.[book]'); the floor environment of .ci/run, like Colab, has none, and CI's main test phase runs these checks")
ce = _load_script()
BASE = "https://example.org/book/"
PNG = base64.b64encode(b"\x89PNG fake").decode()


def _md(text: str) -> dict:
    return {"cell_type": "markdown", "id": f"m{abs(hash(text)) % 10**8}", "metadata": {},
            "source": text.splitlines(keepends=True)}


def _code(source: str, outputs: list, metadata: dict | None = None) -> dict:
    return {"cell_type": "code", "id": f"c{abs(hash(source)) % 10**8}", "metadata": metadata or {},
            "execution_count": 1, "outputs": outputs, "source": source.splitlines(keepends=True)}


def _glue(name: str, text: str, hidden: bool = True) -> dict:
    prefix = "application/papermill.record/" if hidden else ""
    return {"output_type": "display_data", "metadata": {"scrapbook": {"name": name, "mime_prefix": prefix}},
            "data": {prefix + "text/plain": text}}


def _notebook(cells: list) -> dict:
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                        "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}


BIB = """@article{bai2019deep, author = {Bai, Shaojie and Kolter, J. Zico and Koltun, Vladlen},
  title = {Deep Equilibrium Models}, journal = {NeurIPS}, year = {2019}}
@article{solo2020x, author = {Solo, Han}, title = {Alone}, journal = {J}, year = {2020}}
@article{duo2021y, author = {First, Ann and Second, Bob}, title = {Two}, journal = {J}, year = {2021}}
"""

PAGE_A = [
    _md("# Page A\n\nGoals.\n\n(sec-a)=\n## A section\n"),
    _code("glue('err', 3.14159e-5)\nglue('n', 12)\nglue('name', 'tanh')", [
        _glue("err", "3.14159e-05"), _glue("n", "12"), _glue("name", "'tanh'"),
        {"output_type": "stream", "name": "stdout", "text": "hello\n"}]),
    _md("All agree to {glue:text}`err:.0e`, n = {glue:text}`n`, {glue}`name`, "
        "{glue:text}`b::other:.1f` from B.\n\nSee {doc}`b`, {doc}`the other page <b>`, {ref}`sec-b`, "
        "{ref}`there <sec-a>`, {numref}`fig-a`, {numref}`fig-b`, {numref}`Figure %s <fig-b>`.\n\n"
        "As {cite:t}`bai2019deep` and {cite:p}`solo2020x,duo2021y` show; {math}`x^2`; {eq}`eq-one`;"
        " {func}`deqlab.solve`.\n\n$$ z = f(z) $$ (eq-one)\n\n`{glue:text}`literal`` stays code.\n"),
    _code("plot()", [{"output_type": "display_data", "metadata": {}, "data": {"image/png": PNG, "text/plain": "<F>"}}],
          {"mystnb": {"figure": {"name": "fig-a", "caption": "The first figure."}}}),
    _md(":::{admonition} On a TPU\n:class: tip\nUse {glue:text}`n` passes.\n:::\n\n```{note}\nA note.\n```\n\n"
        "```python\n{glue:text}`not_a_role` in code\n```\n\n% a comment\nEnd.\n"),
]
PAGE_B = [
    _md("# Page B\n\n(sec-b)=\n## B's section\n"),
    _code("glue('other', 2.25)", [_glue("other", "2.25")]),
    _code("plot()", [{"output_type": "display_data", "metadata": {}, "data": {"image/png": PNG, "text/plain": "<F>"}}],
          {"mystnb": {"figure": {"name": "fig-b", "caption": "The second figure."}}}),
]


def make_book(tmp_path: Path, page_a: list | None = None) -> Path:
    root = tmp_path / "site"
    (root / "book" / "ch1").mkdir(parents=True)
    (root / "_config.yml").write_text(
        "title: T\nbibtex_bibfiles:\n  - book/references.bib\nhtml:\n  baseurl: https://example.org/book\n")
    (root / "_toc.yml").write_text(
        "format: jb-book\nroot: book/intro\nparts:\n  - caption: P\n    numbered: false\n    chapters:\n"
        "      - file: book/ch1/b\n  - caption: Q\n    numbered: true\n    chapters:\n      - file: book/ch1/index\n"
        "        sections:\n          - file: book/ch1/a\n")
    (root / "book" / "intro.md").write_text("# Intro\n")
    (root / "book" / "ch1" / "index.md").write_text("# Chapter one\n")
    (root / "book" / "references.bib").write_text(BIB)
    (root / "book" / "ch1" / "a.ipynb").write_text(json.dumps(_notebook(page_a or PAGE_A)))
    (root / "book" / "ch1" / "b.ipynb").write_text(json.dumps(_notebook(PAGE_B)))
    return root


def _code_cells(notebook: dict) -> list[dict]:
    """The code cells of a Colab edition, less the one it adds to quiet glue()'s echo."""
    return [c for c in notebook["cells"] if c["cell_type"] == "code" and c.get("id") != ce.QUIET_GLUE_ID]


def _markdown(notebook: dict) -> list[str]:
    return ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown"]


def convert(root: Path, docname: str = "book/ch1/a", **kwargs):
    book = ce.load_book(root, root / "_build", base_url=BASE)
    return ce.convert_notebook(book, docname, root / "_build", **kwargs)


def test_synthetic_page_renders_as_the_site_does(tmp_path):
    root = make_book(tmp_path)
    notebook, stats = convert(root)
    text = "\n".join(_markdown(notebook))
    assert "All agree to 3e-05, n = 12, tanh, 2.2 from B." in text  # format(2.25, ".1f") == "2.2"
    assert f"See [Page B]({BASE}book/ch1/b.html), [the other page]({BASE}book/ch1/b.html)" in text
    assert f"[B's section]({BASE}book/ch1/b.html#sec-b), [there]({BASE}book/ch1/a.html#sec-a)" in text
    # B is unnumbered (its counter is shared by unnumbered pages), A is in chapter 1
    assert f"[Fig. 1.1]({BASE}book/ch1/a.html#fig-a), [Fig. 1]({BASE}book/ch1/b.html#fig-b)" in text
    assert f"[Figure 1]({BASE}book/ch1/b.html#fig-b)" in text
    assert "As Bai et al. (2019) and (Solo 2020; First and Second 2021) show; $x^2$; Eq. (1);" in text
    assert f"[`deqlab.solve()`]({BASE}book/api.html#deqlab.solve)" in text
    assert "$$ z = f(z) $$\n" in text and "(eq-one)" not in text
    assert "`{glue:text}`literal`` stays code." in text
    assert "> **On a TPU**\n>\n> Use 12 passes." in text and "> **Note**\n>\n> A note." in text
    assert "```python\n{glue:text}`not_a_role` in code\n```" in text
    assert "% a comment" not in text and "(sec-a)=" not in text
    references = _markdown(notebook)[-1]
    assert references.startswith("## References")
    assert "Bai, S. and Kolter, J. Z. and Koltun, V. (2019). Deep Equilibrium Models. *NeurIPS*." in references \
        or "Bai, S., Kolter, J. Z. and Koltun, V. (2019). Deep Equilibrium Models. *NeurIPS*." in references
    assert references.count("\n- ") == 3
    assert stats["roles"]["glue:text"] == 4 and stats["roles"]["cite:p"] == 1 and stats["citations"] == 3
    assert not any(ce.find_leftover_myst(m) for m in _markdown(notebook))


def test_code_cells_and_metadata_are_unchanged(tmp_path):
    root = make_book(tmp_path)
    notebook, _ = convert(root)
    original = json.loads((root / "book/ch1/a.ipynb").read_text())
    code = [c for c in original["cells"] if c["cell_type"] == "code"]
    assert _code_cells(notebook) == code
    ids = [c["id"] for c in notebook["cells"] if c["id"] != ce.QUIET_GLUE_ID]
    assert ids[: len(original["cells"])] == [c["id"] for c in original["cells"]]
    assert notebook["metadata"]["kernelspec"] == original["metadata"]["kernelspec"]
    assert notebook["metadata"]["deqlab_colab_edition"]["source"] == "book/ch1/a.ipynb"


def test_executed_build_and_its_glue_json_are_preferred(tmp_path):
    root = make_book(tmp_path)
    executed = root / "_build" / "jupyter_execute" / "book" / "ch1"
    executed.mkdir(parents=True)
    notebook = json.loads((root / "book/ch1/a.ipynb").read_text())
    for cell in notebook["cells"]:  # myst-nb removes hidden glue outputs and writes them aside
        if cell["cell_type"] == "code":
            cell["outputs"] = [o for o in cell["outputs"] if "scrapbook" not in o.get("metadata", {})]
    (executed / "a.ipynb").write_text(json.dumps(notebook))
    (executed / "a.glue.json").write_text(json.dumps({
        "err": {"data": {"text/plain": "0.5"}}, "n": {"data": {"text/plain": "7"}},
        "name": {"data": {"text/plain": "'relu'"}}}))
    converted, _ = convert(root)
    text = "\n".join(_markdown(converted))
    assert "All agree to 5e-01, n = 7, relu, 2.2 from B." in text
    assert converted["metadata"]["deqlab_colab_edition"]["executed"].endswith("jupyter_execute/book/ch1/a.ipynb")


def test_figure_numbers_come_from_the_built_site_when_there(tmp_path):
    root = make_book(tmp_path)
    page = root / "_build" / "html" / "book" / "ch1" / "a.html"
    page.parent.mkdir(parents=True)
    page.write_text('<figure class="align-default" id="fig-a"><img/><figcaption><p>'
                    '<span class="caption-number">Fig. 4.7 </span><span class="caption-text">x</span>')
    text = "\n".join(_markdown(convert(root)[0]))
    assert f"[Fig. 4.7]({BASE}book/ch1/a.html#fig-a)" in text


def test_missing_glue_values_are_all_reported_with_notebook_cell_and_role(tmp_path):
    page = copy.deepcopy(PAGE_A)
    page[1]["outputs"] = page[1]["outputs"][1:]  # "err" was never stored
    page.append(_md("Again {glue:text}`err:.2f` and {glue:text}`absent`."))
    root = make_book(tmp_path, page)
    with pytest.raises(ce.MissingGlueError) as info:
        convert(root)
    assert info.value.missing == [(2, "{glue:text}`err:.0e`"), (5, "{glue:text}`err:.2f`"),
                                  (5, "{glue:text}`absent`")]
    message = str(info.value)
    assert "book/ch1/a.ipynb" in message and "cell 5: {glue:text}`absent`" in message
    # "keep" leaves exactly those roles, for inspection
    notebook, _ = convert(root, missing_glue="keep")
    left = [x for m in _markdown(notebook) for x in ce.find_leftover_myst(m)]
    assert left == ["{glue:text}`", "{glue:text}`", "{glue:text}`"]


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("Use {unknownrole}`x` here.", r"cell 5: \{unknownrole\}`x`: unknown role"),
        ("See {ref}`no-such-label`.", r"cell 5: \{ref\}`no-such-label`: no label 'no-such-label'"),
        ("See {numref}`fig-zzz`.", r"cell 5: \{numref\}`fig-zzz`: no numbered figure named 'fig-zzz'"),
        ("As {cite:p}`nobody2000`.", r"cell 5: \{cite:p\}`nobody2000`: no entry 'nobody2000'"),
        ("See {doc}`missing_page`.", r"cell 5: \{doc\}`missing_page`: no page 'book/ch1/missing_page'"),
        ("```{mermaid}\ngraph\n```", r"cell 5: ```\{mermaid\}: unknown directive"),
        (":::{note}\nnever closed", r"cell 5: :::\{note\}: a directive that is never closed"),
    ],
)
def test_bad_input_names_notebook_cell_and_role(tmp_path, markdown, expected):
    root = make_book(tmp_path, [*PAGE_A, _md(markdown)])
    with pytest.raises(ce.ConversionError, match=r"book/ch1/a\.ipynb: " + expected):
        convert(root)


def test_command_line_writes_every_notebook_at_its_path_and_fails_loudly(tmp_path):
    root = make_book(tmp_path)
    out = tmp_path / "colab"
    command = [sys.executable, str(ROOT / ".ci" / "colab_edition.py"), "--root", str(root), "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.ipynb")) == ["book/ch1/a.ipynb", "book/ch1/b.ipynb"]
    assert "[colab] 2 notebooks" in result.stdout
    # the default base URL: html.baseurl plus the version folder
    text = (out / "book/ch1/a.ipynb").read_text()
    assert "https://example.org/book/dev/book/ch1/b.html" in text
    bad = copy.deepcopy(PAGE_A)
    bad[1]["outputs"] = []
    (root / "book/ch1/a.ipynb").write_text(json.dumps(_notebook(bad)))
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 1
    assert "book/ch1/a.ipynb: 4 glue value(s) missing" in result.stderr
    assert "cell 2: {glue:text}`err:.0e`" in result.stderr


def test_format_plain_text_matches_myst_nb():
    myst_nb = pytest.importorskip("myst_nb.core.variables")
    for text, spec in [("3.14159e-05", ".0e"), ("12", ""), ("12", "s"), ("0.25", ".1%"), ("'tanh'", "s"),
                       ("12", "d"), ("2.5", "+.1f"), ("array([1, 2])", "s"), ("7", ".2f")]:
        assert ce.format_plain_text(text, spec) == myst_nb.format_plain_text(text, spec)


# ------------------------------------------------------------------------------------------------
# the book's own notebooks

GLUE_ROLE = re.compile(r"\{glue(?::\w*)?\}`[^`]+`")


@pytest.fixture(scope="module")
def real_book():
    return ce.load_book(ROOT, ROOT / "_build")


def test_every_page_of_the_toc_is_converted(real_book):
    pages = ce.notebook_pages(real_book)
    assert len(pages) == 31
    # every figure the prose cites has a number
    cited = {m.group(1) for p in pages for m in re.finditer(r"\{numref\}`(?:[^`<]*<)?([^`>]+)>?`",
                                                             (ROOT / f"{p}.ipynb").read_text())}
    assert cited and cited <= set(real_book.figures)


@pytest.mark.parametrize("docname", ce.notebook_pages(ce.load_book(ROOT, ROOT / "_build")))
def test_real_notebook_converts_completely_or_reports_exactly_the_missing_glue(real_book, docname):
    build = ROOT / "_build"
    source = ce.load_source(ROOT, docname, build)
    try:
        notebook, stats = ce.convert_notebook(real_book, docname, build, source=source)
        left_allowed: set[str] = set()
    except ce.MissingGlueError as exc:
        # not executed here: the report lists every glue role of the prose, and nothing else
        expected = [(i, m.group(0)) for i, c in enumerate(source.notebook["cells"]) if c["cell_type"] == "markdown"
                    for m in GLUE_ROLE.finditer("".join(c["source"])) if m.group(0).split("`")[1].split(":")[0]
                    not in source.glue]
        assert exc.missing == expected and exc.missing
        notebook, stats = ce.convert_notebook(real_book, docname, build, source=source, missing_glue="keep")
        left_allowed = {"{glue:text}`", "{glue}`"}
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            left = set(ce.find_leftover_myst("".join(cell["source"])))
            assert left <= left_allowed, (docname, left)
    original = source.notebook["cells"]
    assert _code_cells(notebook) == [c for c in original if c["cell_type"] == "code"]
    assert sum(stats["roles"].values()) > 0
    # no absolute path of the machine that built it
    assert str(ROOT) not in json.dumps(notebook["metadata"]), notebook["metadata"]["deqlab_colab_edition"]


# ------------------------------------------------------------------------------------------------
# malformed input, outputs over inputs, absolute paths, glue's echo


def _write_notebook(root: Path, text: str) -> None:
    (root / "book/ch1/a.ipynb").write_text(text)


def _with_cell(root: Path, cell: dict) -> None:
    notebook = json.loads((root / "book/ch1/a.ipynb").read_text())
    notebook["cells"].append(cell)
    _write_notebook(root, json.dumps(notebook))


def _null_source(root: Path) -> None:
    notebook = json.loads((root / "book/ch1/a.ipynb").read_text())
    notebook["cells"][2]["source"] = None
    _write_notebook(root, json.dumps(notebook))


MALFORMED = {
    "no cells": (lambda root: _write_notebook(root, json.dumps({"metadata": {}, "nbformat": 4})),
                 r'book/ch1/a\.ipynb: no "cells" list; expected an nbformat 4 notebook'),
    "bad JSON": (lambda root: _write_notebook(root, '{"cells": [}'),
                 r"book/ch1/a\.ipynb: not valid JSON \(line 1, column 12: .*\); expected an nbformat 4 notebook"),
    "toc without root": (lambda root: (root / "_toc.yml").write_text(
        (root / "_toc.yml").read_text().replace("root: book/intro\n", "")),
        r"_toc\.yml: no `root` entry; expected the first page, e.g. `root: book/intro`"),
    "null source": (_null_source,
                    r'book/ch1/a\.ipynb: cell 2: "source" is null; expected a string or a list of strings'),
    "empty cite:t": (lambda root: _with_cell(root, _md("As {cite:t}`` showed.")),
                     r"book/ch1/a\.ipynb: cell 5: \{cite:t\}`: a role with no content; expected"),
    "blank cite:t": (lambda root: _with_cell(root, _md("As {cite:t}` ` showed.")),
                     r"book/ch1/a\.ipynb: cell 5: \{cite:t\}` `: an empty citation; expected one or more"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_input_is_a_one_line_error_with_status_2(tmp_path, case):
    root = make_book(tmp_path)
    spoil, expected = MALFORMED[case]
    spoil(root)
    command = [sys.executable, str(ROOT / ".ci" / "colab_edition.py"), "--root", str(root), "--out", str(tmp_path / "o")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("colab edition: error: ")]
    assert len(errors) == 1 and re.search(expected, errors[0]), result.stderr


def test_a_notebook_outside_the_root_is_a_usage_error(tmp_path):
    root = make_book(tmp_path)
    outside = tmp_path / "elsewhere.ipynb"
    outside.write_text(json.dumps(_notebook([_md("# x")])))
    result = subprocess.run([sys.executable, str(ROOT / ".ci" / "colab_edition.py"), "--root", str(root), "--out",
                             str(tmp_path / "o"), str(outside)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert re.fullmatch(r"colab edition: error: .*elsewhere\.ipynb: not under the book's root .*; expected a notebook"
                        r" of its _toc\.yml\n", result.stderr), result.stderr


@pytest.mark.parametrize("out", ["book", "book/ch1", ".", "_build/jupyter_execute"])
def test_the_edition_never_overwrites_its_inputs(tmp_path, out):
    root = make_book(tmp_path)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    result = subprocess.run([sys.executable, str(ROOT / ".ci" / "colab_edition.py"), "--root", str(root), "--out",
                             str(root / out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert re.search(r"colab edition: error: --out .*: .*; choose a folder outside the book", result.stderr)
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_no_absolute_path_in_the_edition(tmp_path):
    root = make_book(tmp_path)
    executed = root / "_build" / "jupyter_execute" / "book" / "ch1"
    executed.mkdir(parents=True)
    (executed / "a.ipynb").write_text((root / "book/ch1/a.ipynb").read_text())
    out = tmp_path / "colab"
    result = subprocess.run([sys.executable, str(ROOT / ".ci" / "colab_edition.py"), "--root", str(root), "--out",
                             str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for path in out.rglob("*.ipynb"):
        text = path.read_text()
        assert str(tmp_path) not in text and str(ROOT) not in text, path
    meta = json.loads((out / "book/ch1/a.ipynb").read_text())["metadata"]["deqlab_colab_edition"]
    assert meta["executed"] == "_build/jupyter_execute/book/ch1/a.ipynb"
    meta = json.loads((out / "book/ch1/b.ipynb").read_text())["metadata"]["deqlab_colab_edition"]
    assert meta["executed"] == "book/ch1/b.ipynb (no executed build)"


def test_glue_echo_is_hidden(tmp_path, monkeypatch, capsys):
    echo = {"output_type": "stream", "name": "stdout", "text": ["err = 3.14159e-05\n", "hello\n", "n = 12\n"]}
    page = copy.deepcopy(PAGE_A)
    page[1]["outputs"].append(echo)
    root = make_book(tmp_path, page)
    notebook, _ = convert(root)
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    # a cell that switches the echo off, just before the first cell that calls glue()
    assert code[0]["id"] == ce.QUIET_GLUE_ID and "glue('err'" in "".join(code[1]["source"])
    streams = [o for o in code[1]["outputs"] if o["output_type"] == "stream"]
    assert ["".join(o["text"]) for o in streams] == ["hello\n", "hello\n"]  # the echo lines are gone
    # and it does switch deqlab's echo off
    config = pytest.importorskip("deqlab.lab.experiments.config")
    monkeypatch.setenv(config.BOOK_BUILD_ENV, "")  # recorded: the cell's setting is undone after the test
    config.glue("ch0_probe", 1.5)
    assert capsys.readouterr().out == "ch0_probe = 1.5\n"
    exec("".join(code[0]["source"]), {})
    config.glue("ch0_probe", 1.5)
    assert capsys.readouterr().out == ""
