"""The PDF of the book (`make pdf`): its LaTeX configuration, its make target and CI phases, and a
small document compiled with the book's LaTeX set-up.

The static tests need nothing but Python: every MathJax macro of _config.yml is defined for LaTeX
(book/_ext/latex_pdf.py), the explorers' frames can be taken out of their HTML, `make pdf` and
`make tex-check` exist and name one list of OS packages, which .ci/run installs before the tests and
builds the PDF with after the book, and the workflow keeps the PDF.

`test_sample_document_compiles` builds a one-page book with the book's `_config.yml` (the same
extensions, preamble, macros, class and settings) through `jupyter-book build --builder pdflatex`
and XeLaTeX: maths with every macro, a mathtools environment, characters outside Latin-1 and a code
line longer than the page. It needs TeX (Debian: the Makefile's TEX_APT). Without TeX it is skipped
with a one-line reason, so that the README's `make test` passes on a machine with nothing but
Python and make; under CI (`CI=true`) or with `DEQLAB_REQUIRE_TEX=1` (set by .ci/run) a missing TeX
is an error, as for the browser test (tests/book/test_site_check.py).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
SPHINX_CONFIG = CONFIG["sphinx"]["config"]
MACROS = SPHINX_CONFIG["mathjax3_config"]["tex"]["macros"]

pytest.importorskip("sphinx", reason="the book's Sphinx toolchain is not installed (pip install -e '.[book]'); the floor environment of .ci/run, like Colab, has none, and CI's main test phase runs these checks")
_spec = importlib.util.spec_from_file_location("latex_pdf", ROOT / "book" / "_ext" / "latex_pdf.py")
latex_pdf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(latex_pdf)

#: What a newcomer without TeX reads in pytest's summary.
SKIP_REASON = "no TeX (xelatex, latexmk): the LaTeX build of a sample page is skipped; CI runs it"


def _makefile() -> str:
    return (ROOT / "Makefile").read_text()


def _recipe(name: str) -> str:
    m = re.search(rf"^{re.escape(name)}:[^\n]*\n((?:\t[^\n]*\n)+)", _makefile(), re.MULTILINE)
    assert m, f"Makefile has no rule {name}"
    return m.group(1)


def _tex_apt() -> list[str]:
    m = re.search(r"^TEX_APT := (.+)$", _makefile(), re.MULTILINE)
    assert m, "Makefile does not set TEX_APT"
    return m.group(1).split()


def _preamble() -> str:
    """The LaTeX preamble the book's configuration gives (as book/_ext/latex_pdf.py completes it)."""

    class Config:
        mathjax3_config = SPHINX_CONFIG["mathjax3_config"]
        latex_elements = dict(SPHINX_CONFIG["latex_elements"])

    config = Config()
    latex_pdf._add_macros(None, config)
    return config.latex_elements["preamble"]


# --- the LaTeX configuration -------------------------------------------------------------------


def test_every_mathjax_macro_is_defined_for_latex():
    assert MACROS, "_config.yml defines no MathJax macros: nothing to check"
    preamble = _preamble()
    for name, value in MACROS.items():
        body = value if isinstance(value, str) else value[0]
        assert f"\\renewcommand{{\\{name}}}" in preamble and body in preamble, f"\\{name} is not defined for LaTeX"
    # the configuration's own preamble is kept
    assert SPHINX_CONFIG["latex_elements"]["preamble"] in preamble
    assert CONFIG["sphinx"]["local_extensions"].get("latex_pdf") == "book/_ext", "latex_pdf is not loaded"


def test_latex_macros_translates_mathjax_forms():
    assert latex_pdf.latex_macros({"R": "\\mathbb{R}"}) == "\\providecommand{\\R}{}\\renewcommand{\\R}{\\mathbb{R}}"
    assert latex_pdf.latex_macros({"norm": ["\\lVert #1 \\rVert", 1]}) == (
        "\\providecommand{\\norm}{}\\renewcommand{\\norm}[1]{\\lVert #1 \\rVert}")
    assert latex_pdf.latex_macros({}) == ""


@pytest.mark.parametrize("macros, message", [
    ({"R2": "x"}, "letters only"),
    ({"": "x"}, "letters only"),
    ({"R": 3}, "string or \\[body, nargs"),
    ({"R": ["x", 10]}, "string or \\[body, nargs"),
    ({"R": ["x"]}, "string or \\[body, nargs"),
])
def test_latex_macros_rejects_what_latex_cannot_define(macros, message):
    with pytest.raises(ValueError, match=message):
        latex_pdf.latex_macros(macros)


def test_latex_settings_point_at_files_that_exist():
    assert CONFIG["latex"]["latex_documents"]["targetname"] == "equilibrium.tex"
    for path in SPHINX_CONFIG["latex_additional_files"]:
        assert (ROOT / path).is_file(), path
    assert SPHINX_CONFIG["latex_use_xindy"] is False  # makeindex: no xindy package in TEX_APT
    assert "verbatimforcewraps" in SPHINX_CONFIG["latex_elements"]["sphinxsetup"]


def test_explorer_frames_are_found_in_an_explorers_html():
    np = pytest.importorskip("numpy")
    from deqlab.lab.experiments import explorer

    grid = np.linspace(0, 1, 20)
    widget = explorer.slider(lambda fig, k: fig.subplots().plot(grid, grid**k), [1, 2, 3, 4, 5],
                             label="$k$", fmt="{:d}", figsize=(2, 1.5), dpi=40)
    frames = latex_pdf.explorer_frames(widget.html)
    assert len(frames) == widget.n_frames == 5
    assert all(f.startswith(b"\x89PNG\r\n\x1a\n") for f in frames)
    assert len(set(frames)) == 5  # five different pictures, in order (frame i shows k = i + 1)
    assert latex_pdf.explorer_frames("<div>no frames</div>") == []


def test_inline_code_may_break_after_separators_only():
    from docutils import nodes

    parts = latex_pdf._with_breaks("deqlab.solve(f, x0=z)")
    text = "".join(n.astext() if isinstance(n, nodes.Text) else "|" for n in parts)
    assert text == "deqlab.|solve(|f, x0=|z)"  # none before a space (a break already), a ")" or at the end
    assert latex_pdf._with_breaks("plain") == [nodes.Text("plain")]


def test_long_table_widths_follow_the_content():
    rows = [["#", "paper, location", "what is printed"]] + [["7", "001 Eq. 5 and App. A.3 (tied)", "x" * 400]] * 10
    widths = latex_pdf.column_widths(rows)
    assert widths[0] < widths[1] < widths[2] and 97 <= sum(widths) <= 103
    assert widths[0] >= 5  # even a column of single digits keeps room for "26" and its padding


# --- make pdf, .ci/run, the workflow -----------------------------------------------------------


def test_make_pdf_builds_with_the_latex_builder_and_copies_the_pdf():
    assert re.search(r"^pdf: tex-check install$", _makefile(), re.MULTILINE)
    pdf = _recipe("pdf")
    assert "jupyter-book build . --builder pdflatex -W -n --keep-going" in pdf
    assert "cp _build/latex/equilibrium.pdf _build/pdf/equilibrium.pdf" in pdf
    assert "DEQLAB_BOOK_BUILD=1" in pdf  # renders the notebooks make test executed, as make book does
    check = _recipe("tex-check")
    assert "apt-get install -y --no-install-recommends $(TEX_APT)" in check
    assert {"latexmk", "texlive-xetex", "fonts-freefont-otf"} <= set(_tex_apt())


def test_ci_installs_tex_before_the_tests_and_builds_the_pdf_after_the_book():
    ci = (ROOT / ".ci" / "run").read_text()
    phases = re.findall(r"^begin (\S+)", ci, re.MULTILINE)
    assert phases.index("tex") < phases.index("test") < phases.index("book") < phases.index("pdf")
    tex = ci[ci.index("begin tex"):ci.index("begin lint")]
    assert 'sed -n "s/^TEX_APT := //p" Makefile' in tex and "apt-get install" in tex
    assert "make -s tex-check" in tex
    assert re.search(r"^make pdf\b", ci, re.MULTILINE)
    assert re.search(r"^export DEQLAB_REQUIRE_TEX=1$", ci, re.MULTILINE)
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "book.yml").read_text())
    uploads = [step["with"]["path"] for step in workflow["jobs"]["build"]["steps"]
               if step.get("uses", "").startswith("actions/upload-artifact")]
    assert "_build/pdf/equilibrium.pdf" in uploads


@pytest.mark.skipif(shutil.which("make") is None, reason="no make: the README's commands need it")
def test_make_pdf_without_tex_names_the_apt_command(tmp_path):
    bare = tmp_path / "bin"  # sh, make and the shell tools tex-check uses; no TeX
    bare.mkdir()
    for tool in ("make", "sh", "grep", "head", "cat"):
        if shutil.which(tool):
            (bare / tool).symlink_to(shutil.which(tool))
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS")}
    env["PATH"] = str(bare)
    run = subprocess.run(["make", "-s", "pdf", "VENV=/nonexistent"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60, executable=str(bare / "make"))
    assert run.returncode != 0
    assert "make pdf needs TeX" in run.stdout and "missing: xelatex latexmk" in run.stdout, run.stdout + run.stderr
    assert "apt-get install -y --no-install-recommends " + " ".join(_tex_apt()) in run.stdout
    assert "Traceback" not in run.stdout + run.stderr


# --- a sample page through the book's LaTeX set-up ---------------------------------------------


def tex_required() -> bool:
    """CI, or a developer who asked for it, must not skip the LaTeX build."""
    truthy = ("1", "true", "yes")
    return (os.environ.get("CI", "").lower() in truthy
            or os.environ.get("DEQLAB_REQUIRE_TEX", "").lower() in truthy)


def require_tex() -> None:
    missing = [prog for prog in ("xelatex", "latexmk", "makeindex") if shutil.which(prog) is None]
    if missing and not tex_required():
        pytest.skip(SKIP_REASON)
    if missing:
        pytest.fail("the LaTeX build needs " + ", ".join(missing) + "; install TeX with: apt-get install -y "
                    "--no-install-recommends " + " ".join(_tex_apt())
                    + " (CI or DEQLAB_REQUIRE_TEX=1: a missing TeX is an error)", pytrace=False)


SAMPLE = r"""# Sample page

Every macro of the book: ${macros}$, and a mathtools matrix
$\begin{{psmallmatrix}}1&0\\0&1\end{{psmallmatrix}}$.

```{{math}}
:label: eq-sample
z^\star = \tanh(W z^\star + x), \qquad \lambda_{{\max}} \le 2 \sqrt V
```

Equation {{eq}}`eq-sample` again. Characters from outputs: ± ≈ √ ≥ ≫ δ × ─ │ █ ⊗ é §.

| n | error |
|---|-------|
| 1 | 0.5 ± 0.1 |

:::{{admonition}} Verification
:class: dropdown

| check | value |
|---|---|
| folded | no |
:::

An exercise.

<details><summary>Solution</summary>

The answer.

</details>

```python
result = {{"a_very_long_name_that_does_not_fit": [0.123456789, 0.223456789, 0.323456789, 0.423456789, 0.523456789, 0.623456789]}}
```
"""


def _write_explorer_page(path: Path) -> None:
    """A notebook page whose one output is an explorer, stored (the page is not executed)."""
    import nbformat
    import numpy as np

    from deqlab.lab.experiments import explorer

    grid = np.linspace(0, 1, 20)
    widget = explorer.slider(lambda fig, k: fig.subplots().plot(grid, grid**k), [1, 2, 3, 4, 5],
                             label="$k$", fmt="{:d}", figsize=(2, 1.5), dpi=40)
    cell = nbformat.v4.new_code_cell("explorer.slider(...)", execution_count=1, outputs=[
        nbformat.v4.new_output("execute_result", data={"text/html": widget.html, "text/plain": repr(widget)},
                               execution_count=1)])
    from deqlab.lab.experiments import table

    results = table([("Gaussian", 0.5), ("GOE", 0.25)], ["ensemble", r"$\|J\|_2$"], [None, ".2f"],
                    caption=r"Norms $\|J\|_2$ per ensemble.")
    table_cell = nbformat.v4.new_code_cell("results", execution_count=2, outputs=[
        nbformat.v4.new_output("execute_result", data={"text/html": results._repr_html_(),
                                                       "text/markdown": results._repr_markdown_(),
                                                       "text/plain": repr(results)}, execution_count=2)])
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Explorer page"), cell, table_cell])
    nb.metadata["mystnb"] = {"execution_mode": "off"}
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


@pytest.mark.slow  # a Sphinx build and three XeLaTeX runs: about a minute on 2 cores
def test_sample_document_compiles(tmp_path):
    require_tex()
    book = tmp_path / "sample"
    book.mkdir()
    config = dict(CONFIG)
    config["only_build_toc_files"] = True
    (book / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    (book / "_toc.yml").write_text(
        "format: jb-book\nroot: sample\nparts:\n  - caption: Main\n    chapters:\n      - file: explorer\n"
        f"  - caption: {CONFIG['sphinx']['config']['deqlab_latex_appendix_part']}\n"
        "    numbered: false\n    chapters:\n      - file: back\n")
    (book / "back.md").write_text("# Back matter\n\nNotation and errata would be here.\n")
    _write_explorer_page(book / "explorer.ipynb")
    (book / "book").symlink_to(ROOT / "book")  # _ext, _latex, references.bib, _static
    uses = " + ".join(f"\\{name}" + "{x}" * (0 if isinstance(v, str) else v[1]) for name, v in MACROS.items())
    (book / "sample.md").write_text(SAMPLE.format(macros=uses))
    env = dict(os.environ, LATEXOPTS="-interaction=nonstopmode -halt-on-error")
    jupyter_book = Path(sys.executable).with_name("jupyter-book")  # the script next to this interpreter
    run = subprocess.run(
        [str(jupyter_book), "build", str(book), "--builder", "pdflatex", "-W", "-n", "--keep-going"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    latex = book / "_build" / "latex"
    log = (latex / "equilibrium.log").read_text(errors="replace") if (latex / "equilibrium.log").exists() else ""
    errors = "\n".join(line for line in log.splitlines() if line.startswith("!"))
    assert run.returncode == 0, (errors or log[-3000:]) + "\n" + (run.stdout + run.stderr)[-4000:]
    assert (latex / "equilibrium.pdf").stat().st_size > 10_000
    # every character was set (XeLaTeX only warns about a glyph its font lacks)
    assert "Missing character" not in log, [line for line in log.splitlines() if "Missing character" in line]
    # nothing runs into the margin, the long code line included (it wraps)
    overfull = re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\)", log)
    assert all(float(width) < 1.0 for width in overfull), f"lines too wide by {overfull} pt"
    tex = (latex / "equilibrium.tex").read_text()
    for name in MACROS:
        assert f"\\renewcommand{{\\{name}}}" in tex
    # the explorer: its first, middle and last frames (of 5) and its summary, not the bare summary
    frames = re.findall(r"\\sphinxincludegraphics\[[^]]*\]\{\{([0-9a-f]{16})\}\.png\}", tex)
    assert len(set(frames)) == 3, frames
    assert "Frames 1, 3, 5 of 5. Interactive explorer: 5 precomputed frames" in tex
    # a hidden solution keeps its label; a deqlab table (its Markdown, parsed as MyST) is a table
    # with its maths, not a paragraph of pipes and dollars
    assert "\\sphinxstylestrong{Solution.}" in tex and "The answer." in tex
    # the unnumbered Reference part of the table of contents is the back matter: appendices
    assert re.search(r"\\part\{Reference\}\s*\\appendix\s*(\\sphinxstepscope\s*)?\\chapter\{Back matter\}", tex), \
        tex[tex.find("\\part{Reference}") - 200:][:600]
    # a dropdown (collapsed on the site) is printed unfolded: its title in bold, no box
    assert "\\sphinxstylestrong{Verification}" in tex and "folded" in tex
    assert "sphinxadmonition" not in tex.split("Verification")[0].rsplit("Sample page", 1)[-1]
    assert "| ensemble |" not in tex and "$\\|J" not in tex
    assert re.search(r"\\begin\{(longtable|tabulary|tabular)\}", tex.split("Explorer page")[-1])
    assert "\\(\\Vert J\\Vert _2\\)" in tex


def _run_sample_test_without_tex(tmp_path: Path, **extra_env: str) -> subprocess.CompletedProcess:
    bare = tmp_path / "bin"  # a PATH with nothing but a link to this interpreter: no TeX
    bare.mkdir(parents=True)
    (bare / "python").symlink_to(sys.executable)
    drop = ("CI", "DEQLAB_REQUIRE_TEX", "PYTEST_ADDOPTS")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PYTEST_XDIST")}
    env.update(PATH=str(bare), **extra_env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist",
         f"{Path(__file__).resolve()}::test_sample_document_compiles"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )


@pytest.mark.slow  # two pytest processes (about 5 s each)
def test_missing_tex_skips_for_a_newcomer_and_fails_under_ci(tmp_path):
    newcomer = _run_sample_test_without_tex(tmp_path / "newcomer")
    assert newcomer.returncode == 0, newcomer.stdout[-3000:]
    assert "1 skipped" in newcomer.stdout and SKIP_REASON in newcomer.stdout, newcomer.stdout[-3000:]
    ci = _run_sample_test_without_tex(tmp_path / "ci", CI="true")
    assert ci.returncode != 0 and "1 failed" in ci.stdout, ci.stdout[-3000:]
    assert "apt-get install -y --no-install-recommends " + " ".join(_tex_apt()) in ci.stdout
