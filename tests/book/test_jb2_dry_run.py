"""The Jupyter Book 2 dry run (.ci/jb2_dry_run.py, issue 28): census, log classification, orchestration.

Jupyter Book 2 is not part of CI's install (the book stays on Jupyter Book 1): everything here runs
without it (a fake ``jupyter-book`` stands in for the orchestration), except
``test_dry_run_of_this_book_with_jupyter_book_2``, which runs the real thing when
``$JB2_JUPYTER_BOOK`` (or ``jupyter-book`` on PATH) is Jupyter Book 2 and is skipped otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "jb2_dry_run.py"
sys.path.insert(0, str(ROOT / ".ci"))
import jb2_dry_run as dry  # noqa: E402

CONFIG = {
    "title": "T",
    "bibtex_bibfiles": ["book/references.bib"],
    "execute": {"timeout": 900},
    "launch_buttons": {"colab_url": "https://colab.research.google.com"},
    "sphinx": {"local_extensions": {"ext": "book/_ext"},
               "config": {"mathjax3_config": {"tex": {"macros": {"R": "\\mathbb{R}", "tr": "x"}}}}},
}

PAGE_MD = textwrap.dedent(r"""
    # Page

    See {doc}`nb` and {numref}`fig-a`, as {cite:p}`key1` and {cite:t}`key2` show; {mod}`deqlab.x`.
    The value is {glue:text}`p_a:.3f` and {glue:text}`p_b`; $x \in \R^n$, $\tr A$, $\trace$, $\lambda_\max$.

    Written ``{glue:text}`not_a_use` `` in code, and in a fence:

    ```python
    {glue:text}`not_a_use_either`
    ```

    ````md
    ```{eval-rst}
    .. automodule:: not.counted
    ```
    ````

    ```{eval-rst}
    .. automodule:: pkg
       :members:
    ```

    ```{my-report}
    ```

    :::{note}
    A note with {glue:text}`p_c`.
    :::

    <details><summary>Solution</summary>

    Text.

    </details>

    <div class="admonition warning">
    Erratum.
    </div>
""")


def _notebook(cells):
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _md(source, cell_id):
    return {"cell_type": "markdown", "id": cell_id, "metadata": {}, "source": source.splitlines(True)}


def _code(source, cell_id, **metadata):
    return {"cell_type": "code", "id": cell_id, "metadata": metadata, "source": source.splitlines(True),
            "outputs": [], "execution_count": None}


@pytest.fixture
def small_book(tmp_path):
    """A book root with one Markdown page, two notebooks and one local extension."""
    repo = tmp_path / "repo"
    (repo / "book" / "_ext").mkdir(parents=True)
    (repo / "_config.yml").write_text(yaml.safe_dump(CONFIG))
    (repo / "_toc.yml").write_text("format: jb-book\nroot: book/page\nparts:\n  - numbered: true\n"
                                   "    chapters:\n      - file: book/nb\n")
    (repo / "book" / "page.md").write_text(PAGE_MD)
    (repo / "book" / "_ext" / "ext.py").write_text(
        "def setup(app):\n    app.add_directive('my-report', object)\n    app.connect('x', None)\n")
    (repo / "book" / "_ext" / "helper.py").write_text("X = 1\n")  # not an extension: no setup()
    nb = _notebook([
        _md("Glued {glue:text}`n_a` <details><summary>S</summary>\n\n{glue:text}`n_b`\n\n</details>", "cell-00"),
        _code("def f():\n    pass\nglue('n_a', 1, display=False)\nglue('n_b', 2)\nmy.glue('x')", "cell-01",
              tags=["reader-code", "hide-input"]),
        _code("plot()", "nb-02", mystnb={"figure": {"name": "fig-a", "caption": "c"}}, tags=["hide-input"]),
    ])
    (repo / "book" / "nb.ipynb").write_text(json.dumps(nb))
    other = _notebook([_md("{func}`deqlab.f`", "cell-00"), _code("1", "other-01")])
    (repo / "book" / "other.ipynb").write_text(json.dumps(other))
    (repo / "book" / ".ipynb_checkpoints").mkdir()
    (repo / "book" / ".ipynb_checkpoints" / "nb-checkpoint.ipynb").write_text(json.dumps(nb))
    return repo


def test_prose_drops_code_but_keeps_directives():
    text = "a {doc}`x`\n```python\n{doc}`y`\n```\n```{eval-rst}\n.. automodule:: m\n```\nb ``{doc}`z` `` c"
    prose = dry._prose(text)
    assert "{doc}`x`" in prose and ".. automodule:: m" in prose and "```{eval-rst}" in prose
    assert "{doc}`y`" not in prose and "{doc}`z`" not in prose
    # A longer fence holds shorter ones: nothing inside it counts, and the text after it does.
    assert dry._prose("````md\n```{note}\n{doc}`q`\n```\n````\n{doc}`r`") == "{doc}`r`"


def test_census_counts_each_construct_page_by_page(small_book):
    census = dry.census(small_book)
    assert census.pages == 3  # the checkpoint copy and book/_ext are not pages
    total = {key: census.total(key) for key in dry.CATEGORY_KEYS if census.total(key)}
    assert total == {"autodoc": 1, "py-roles": 2, "local-extensions": 2, "glue": 5, "numref": 1,
                     "figures": 1, "cite": 2, "doc": 1, "math": 3, "details": 2, "admonitions": 2,
                     "cell-tags": 3, "cell-ids": 2}
    assert census.counts["glue"] == Counter({"book/page.md": 3, "book/nb.ipynb": 2})
    assert census.items["cell-tags"] == Counter({"hide-input": 2, "reader-code": 1})
    assert census.items["math"] == Counter({"macro `\\R`": 1, "macro `\\tr`": 1,
                                            "operator subscript without braces (`\\lambda_\\max`)": 1})
    assert census.counts["cell-ids"] == Counter({"book/nb.ipynb": 1, "book/other.ipynb": 1})
    assert census.extensions == ["ext"] and census.directives == ["my-report"]
    assert census.figure_names == {"fig-a"}
    assert census.macros == ["R", "tr"]
    assert "2 `glue(...)` calls in code cells" in census.notes["glue"]  # not my.glue(...)
    assert census.n_pages("glue") == 2


#: Lines of the log of `jupyter-book build --site --ci` (2.1.7) on this book, with its colours.
SAMPLE_LOG = "\n".join([
    "building myst-cli session with API URL: https://api.mystmd.org",
    "\x1b[31m\u26d4\ufe0f myst.yml 'thebe' 'url' must be valid URL:  (at myst.yml#config.project.thebe.binder)\x1b[39m",
    "\u26a0\ufe0f  book/intro.md:31:14 Usage of the {doc} role is not recommended, use a markdown link to the file instead.",
    "   For {doc}`ch0_practice/index` use [](ch0_practice/index)",
    "\u26d4\ufe0f book/ch2_freeprob/index.md:27:34 unknown role: mod",
    "\u26d4\ufe0f book/execution.md:14 unknown directive: execution-report",
    "\u26d4\ufe0f book/api.md:8 unknown directive: eval-rst",
    "\u26d4\ufe0f book/ch0_practice/02_solvers.ipynb:1:29 unknown role: glue:text",
    "\U0001f4d6 Built book/api.md in 114 ms.",
    "\u26d4\ufe0f book/ch1_linear/04_finite_n.ipynb:16:17 Got function '\\max' with no arguments as subscript",
    "   N^{2/3}(\\lambda_\\max - 2) \\to F_1",
    "\u26a0\ufe0f  book/ch1_linear/01_ensembles.ipynb Duplicate identifier in project \"cell-00\"",
    "   In files: book/ch1_linear/01_ensembles.ipynb, book/ch1_linear/02_moments.ipynb",
    "\u26a0\ufe0f  book/ch0_practice/01_what_is_a_deq.ipynb Cross reference target was not found: fig-ch0-depth",
    "\u26a0\ufe0f  book/ch0_practice/01_what_is_a_deq.ipynb Cross reference target was not found: eq-other",
    "\u26a0\ufe0f  book/x.md Something new",
    "\U0001f50d Querying template metadata from https://api.mystmd.org/templates/site/myst/book-theme",
    "request to https://api.mystmd.org/templates/site/myst/book-theme failed, reason: getaddrinfo ENOTFOUND api.mystmd.org",
    "",
    "To list valid templates, try the command \"myst templates list\"",
])


def test_log_is_parsed_into_messages_with_locations_and_continuations():
    messages = dry.parse_log(SAMPLE_LOG)
    assert [m.severity for m in messages].count("error") == 7
    assert [m.severity for m in messages].count("warning") == 5
    doc = messages[1]
    assert (doc.file, doc.line, doc.column) == ("book/intro.md", 31, 14)
    assert doc.text.endswith("use [](ch0_practice/index)") and doc.text.count("\n") == 1
    assert messages[0].file == "myst.yml" and "\x1b" not in messages[0].text
    api = next(m for m in messages if m.file == "book/api.md")
    assert (api.line, api.column) == (8, None)
    assert messages[-1].text.startswith("request to https://api.mystmd.org")  # an unmarked failure
    # Informational lines (built pages, queries, hints) are not messages, nor part of one.
    assert not any("Built" in m.text or "myst templates list" in m.text for m in messages)


def test_messages_are_classified_by_category(small_book):
    census = dry.census(small_book)
    census.figure_names = {"fig-ch0-depth"}
    messages = dry.classify(dry.parse_log(SAMPLE_LOG), census, ext_directives={"execution-report"})
    assert [m.category for m in messages] == [
        "config", "doc", "py-roles", "local-extensions", "autodoc", "glue", "math", "cell-ids",
        "figures", "numref", "other", "theme"]
    # Without the census, a directive of a local extension is just an unknown directive.
    plain = dry.classify(dry.parse_log(SAMPLE_LOG))
    assert [m.category for m in plain][3] == "other" and [m.category for m in plain][8] == "numref"
    # The extension directives default to those the census found in book/_ext.
    mine = dry.classify(dry.parse_log("\u26d4\ufe0f book/a.md:3 unknown directive: my-report"), census)
    assert mine[0].category == "local-extensions"


def test_config_fate_says_what_the_upgrade_carried_and_dropped():
    myst = {"project": {"bibliography": ["book/references.bib"], "github": ""}}
    rows = {setting: fate for setting, _, fate in dry.config_fate(CONFIG, myst, toc_numbered=True)}
    assert rows == {
        "bibtex_bibfiles": "carried to `project.bibliography`",
        "sphinx.config.mathjax3_config.tex.macros": "dropped (would be `project.math`)",
        "html.use_multitoc_numbering": "dropped (would be `project.numbering`)",
        "execute.timeout": "no counterpart: dropped",
        "launch_buttons.colab_url": "no counterpart: dropped",
        "sphinx.local_extensions": "no counterpart: dropped",
    }
    assert "html.use_multitoc_numbering" not in {s for s, _, _ in dry.config_fate(CONFIG, myst)}


def test_ast_census_counts_unresolved_nodes_and_html_round_trips(tmp_path):
    page = {"mdast": {"type": "root", "children": [
        {"type": "mystRole", "name": "glue:text", "value": "k"},
        {"type": "mystDirective", "name": "eval-rst", "value": ".. automodule:: m"},
        {"type": "cite", "label": "a"},
        {"type": "inlineMath", "value": "\\lambda_\\max", "error": True},
        {"type": "inlineMath", "value": "x"},
        {"type": "details", "children": [
            {"type": "span", "class": "math-inline", "children": [{"type": "text", "value": "x"}]},
            {"type": "span", "class": "role unhandled"},
            {"type": "span", "class": "other"}]},
        {"type": "div", "class": "admonition warning", "children": [
            {"type": "span", "class": "math-display"}]},
        {"type": "span", "class": "math-inline"},  # outside any HTML block: not a round trip
    ]}}
    (tmp_path / "page.json").write_text(json.dumps(page))
    (tmp_path / "other.json").write_text(json.dumps({"mdast": {"type": "root", "children": [
        {"type": "mystRole", "name": "glue:text"}]}}))
    assert dry.ast_census(tmp_path) == Counter({
        "role glue:text": 2, "directive eval-rst": 1, "cite": 1, "math error": 1, "details": 1, "div": 1,
        "raw TeX in <details>": 1, "unhandled roles in <details>": 1, "raw TeX in <div>": 1})


def _run(args, env_path: str, **env):
    environ = {k: v for k, v in os.environ.items() if k != dry.ENV_EXECUTABLE}
    environ.update(PATH=env_path, **env)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=environ, timeout=300)


def _fake_tool(folder: Path, version: str, body: str = "") -> Path:
    """An executable ``jupyter-book`` that prints ``version`` for ``--version``, then runs ``body``."""
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / "jupyter-book"
    tool.write_text(f"#!{sys.executable}\nimport sys, os, json, pathlib\n"
                    f"if sys.argv[1:] == ['--version']:\n    print({version!r}); sys.exit(0)\n" + body)
    tool.chmod(0o755)
    return tool


def test_without_jupyter_book_2_it_says_so_and_exits_0(small_book, tmp_path):
    out = tmp_path / "out"
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    run = _run(["--repo", str(small_book), "--out", str(out)], str(empty))
    assert run.returncode == 0, run.stderr
    assert "Jupyter Book 2 is not installed here (no `jupyter-book` on PATH)" in run.stdout
    report = (out / "report.md").read_text()
    assert "Jupyter Book 2 was not run" in report and "| myst-nb `glue` roles | 5 in 2 files" in report
    # A Jupyter Book 1 on PATH is not Jupyter Book 2 either.
    v1 = _fake_tool(tmp_path / "v1-bin", "Jupyter Book      : 1.0.4\nExternal ToC      : 1.0.1")
    run = _run(["--repo", str(small_book), "--out", str(out)], str(v1.parent))
    assert run.returncode == 0 and "is Jupyter Book 1.0.4, not 2.x" in run.stdout
    assert not (small_book / "myst.yml").exists()


def test_bad_usage_exits_2(small_book, tmp_path):
    empty = str(tmp_path)
    not_a_book = tmp_path / "nothing"
    not_a_book.mkdir()
    run = _run(["--repo", str(not_a_book)], empty)
    assert run.returncode == 2 and "not the book's root" in run.stderr
    run = _run(["--repo", str(small_book), "--timeout", "0"], empty)
    assert run.returncode == 2 and "--timeout must be > 0" in run.stderr
    run = _run(["--repo", str(small_book), "--jupyter-book", str(tmp_path / "missing")], empty)
    assert run.returncode == 2 and "does not exist" in run.stderr
    v1 = _fake_tool(tmp_path / "v1-bin", "Jupyter Book      : 1.0.4")
    run = _run(["--repo", str(small_book), "--jupyter-book", str(v1)], empty)
    assert run.returncode == 2 and "not 2.x" in run.stderr
    run = _run(["--repo", str(small_book), "--no-such-option"], empty)
    assert run.returncode == 2


#: A stand-in for Jupyter Book 2: `init` upgrades (needs "y" on stdin), `build --site` prints part
#: of the sample log and writes one page's syntax tree, `build --html` fails on the theme.
FAKE_BODY = textwrap.dedent("""
    args = sys.argv[1:]
    here = pathlib.Path.cwd()
    if args[0] == "init":
        assert sys.stdin.read().startswith("y"), "the upgrade prompt was not answered"
        assert (here / "_config.yml").is_file() and (here / "book").is_dir()
        (here / "myst.yml").write_text("version: 1\\nproject:\\n  bibliography: [book/references.bib]\\n")
        (here / "_config.yml").rename(here / "._config.yml.bak")
        print("Migrating Jupyter Book configuration to myst.yml")
    elif args[:2] == ["build", "--site"]:
        print(os.environ["FAKE_LOG"])
        print("\\n - myst                         1.11.0")
        content = here / "_build" / "site" / "content"
        content.mkdir(parents=True)
        details = {"type": "details", "children": [{"type": "span", "class": "math-inline"},
                                                   {"type": "span", "class": "role unhandled"}]}
        tree = {"mdast": {"type": "root", "children": [{"type": "mystRole", "name": "glue:text"}, details]}}
        (content / "page.json").write_text(json.dumps(tree))
        sys.exit(1)
    elif args[:2] == ["build", "--html"]:
        print(os.environ["FAKE_LOG"].splitlines()[-1])
        sys.exit(1)
""")


def test_dry_run_orchestration_with_a_stand_in(small_book, tmp_path):
    tool = _fake_tool(tmp_path / "bin", "v2.9.9", FAKE_BODY)
    out = tmp_path / "out"
    before = (small_book / "_config.yml").read_text()
    log = "\n".join(line for line in SAMPLE_LOG.splitlines() if "template" in line or "mod" in line
                    or "glue" in line)
    run = _run(["--repo", str(small_book), "--out", str(out)], str(tmp_path / "empty"),
               JB2_JUPYTER_BOOK=str(tool), FAKE_LOG=log)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("Jupyter Book 2.9.9: 3 errors, 0 warnings")
    assert sorted(p.name for p in out.iterdir()) == ["build-html.log", "build-site.log", "myst.yml",
                                                      "report.md", "upgrade.log"]
    report = (out / "report.md").read_text()
    assert "mystmd 1.11.0" in report
    assert "| upgrade | `jupyter-book init --project` | 0 |" in report
    assert "| myst-nb `glue` roles | 5 in 2 files" in report and "| 1 / 0 | breaks |" in report
    assert "| the site theme (network) | - | 1 / 0 | breaks |" in report
    assert "| `role glue:text` | 1 |" in report
    # No message, but the syntax tree shows the HTML round trip of the <details> block.
    assert "(`<details>` blocks: 2) | 0 / 0 | breaks silently (2 nodes) |" in report
    assert "| `bibtex_bibfiles` | bibliography files | carried to `project.bibliography` |" in report
    # The repository is only read; the temporary copy is removed.
    assert (small_book / "_config.yml").read_text() == before and not (small_book / "myst.yml").exists()
    # An upgrade that writes no myst.yml stops the dry run with exit 1.
    broken = _fake_tool(tmp_path / "broken", "v2.9.9", "sys.exit(0)\n")
    run = _run(["--repo", str(small_book), "--out", str(out), "--jupyter-book", str(broken)],
               str(tmp_path / "empty"))
    assert run.returncode == 1 and "wrote no myst.yml" in run.stderr


@pytest.mark.slow
def test_dry_run_of_this_book_with_jupyter_book_2(tmp_path):
    # Looked up here, not at collection: asking a `jupyter-book` for its version takes seconds.
    try:
        path, why = dry.find_jupyter_book(None)
    except dry.UsageError as error:
        path, why = None, str(error)
    if path is None:
        pytest.skip(f"Jupyter Book 2 is not installed ({why}); it is not part of CI's install. Set "
                    "JB2_JUPYTER_BOOK to the jupyter-book of a separate `pip install \"jupyter-book>=2\"` "
                    "environment to run this test")
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True,
                         timeout=1800)
    assert run.returncode == 0, run.stdout + run.stderr
    report = (out / "report.md").read_text()
    census = dry.census(ROOT)
    glue = census.total("glue")
    assert f"| myst-nb `glue` roles | {glue} in {census.n_pages('glue')} files" in report
    # What the dry run found with 2.1.7: glue roles and autodoc are errors of the build.
    for title in ("myst-nb `glue` roles", "autodoc API page (`book/api.md`)"):
        row = next(line for line in report.splitlines() if line.startswith(f"| {title} |"))
        assert row.endswith("| breaks |"), row
    myst = yaml.safe_load((out / "myst.yml").read_text())
    assert myst["project"]["toc"], "the upgrade carried the table of contents over"
    assert not (ROOT / "myst.yml").exists()
