"""Jupyter Book 2 dry run: what would break if the book moved from Jupyter Book 1 to 2 (mystmd)?

    python .ci/jb2_dry_run.py [--jupyter-book PATH] [--out DIR] [--timeout S] [--keep]

Not part of the build or of CI (CI installs Jupyter Book 1; the book keeps the v1 layout,
``_config.yml`` + ``_toc.yml``). Jupyter Book 2 is a different, Node-based tool (mystmd); install
it in a separate environment, never in the book's::

    python -m venv /tmp/jb2-venv && /tmp/jb2-venv/bin/pip install "jupyter-book>=2"
    python .ci/jb2_dry_run.py --jupyter-book /tmp/jb2-venv/bin/jupyter-book

What it does, in a temporary folder (the repository is only read):

1. copies what the build reads: ``_config.yml``, ``_toc.yml`` and ``book/``;
2. runs the upgrade, ``jupyter-book init --project`` answered "yes" (Jupyter Book 2 has no
   ``upgrade`` command: ``init`` in a folder with a ``_config.yml`` and no ``myst.yml`` converts
   ``_config.yml`` + ``_toc.yml`` into ``myst.yml`` and renames the old files ``._config.yml.bak``,
   ``._toc.yml.bak``);
3. builds the site content, ``jupyter-book build --site --ci`` (parses every page, resolves
   references and citations, writes the pages' syntax trees under ``_build/site/content``; needs
   no theme), then the HTML, ``jupyter-book build --html --ci`` (needs the site theme, which
   mystmd downloads at build time);
4. classifies every error and warning of the logs, counts the constructs of the sources that a
   move would touch (the "census": "glue: 1105 roles in 27 pages"), counts what the built syntax
   trees still hold unresolved, and writes ``report.md`` with the logs and the upgraded
   ``myst.yml`` into ``--out`` (default ``_build/jb2-dry-run``).

Notebooks are rendered as committed (no outputs) and not executed: Jupyter Book 2 executes only
with ``--execute``, which would run every notebook of the book.

With no Jupyter Book 2 found (``--jupyter-book``, else ``$JB2_JUPYTER_BOOK``, else
``jupyter-book`` on ``PATH`` if it is 2.x), the script says so, writes the census-only report and
exits 0. Exit codes: 0 the dry run ran (what breaks is its finding, not a failure) or no Jupyter
Book 2 is installed; 1 the upgrade itself failed (no ``myst.yml``); 2 bad usage (a folder that is
not the book's root, an explicit ``--jupyter-book`` that is missing or not 2.x, a bad option).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ENV_EXECUTABLE = "JB2_JUPYTER_BOOK"

#: The categories of the report, in its order: (key, title, what happens in Jupyter Book 2, what a
#: move would need). The texts are what the dry run of 2.1.7 (mystmd 1.11) showed; the numbers
#: and the error messages of a run are computed.
CATEGORIES = [
    ("autodoc", "autodoc API page (`book/api.md`)",
     "mystmd has no autodoc: every ```` ```{eval-rst} ```` block (`.. automodule::`) is an unknown "
     "directive and renders nothing, so the API page is empty.",
     "generate the API reference outside mystmd (e.g. Sphinx or pdoc into a separate folder) and link "
     "to it, or generate MyST pages from the docstrings before the build."),
    ("py-roles", "Python roles (`{mod}`, `{func}`, ...)",
     "unknown roles: rendered as literal text, with no link (there is no Python domain).",
     "plain links to the API reference, or inline code."),
    ("local-extensions", "local Sphinx extensions (`book/_ext/`)",
     "mystmd does not load Sphinx extensions: `_config.yml`'s `sphinx:` section is dropped by the "
     "upgrade, the `{execution-report}` directive is unknown (the execution page renders no table); "
     "`executed_notebooks` has no hook to attach to (mystmd renders stored outputs and executes only "
     "with `--execute`); `page_assets` (MathJax on every page, de-duplicated scripts) is moot (mystmd "
     "typesets maths with KaTeX at build time).",
     "a mystmd plugin (JavaScript, or an executable that prints the syntax tree) for "
     "`{execution-report}`, or a generated Markdown page; the provenance check of "
     "`executed_notebooks` would move into `make test` / CI."),
    ("glue", "myst-nb `glue` roles",
     "unknown role `glue:text`: every glued number renders as literal text (`{glue:text}` and the "
     "key), in the main text and in hidden blocks.",
     "mystmd's inline expressions (`{eval}` roles) are evaluated when mystmd executes the notebook "
     "(`build --execute`); there is no drop-in for myst-nb's glue: every glued page would be rewritten."),
    ("numref", "`{numref}` and `{ref}` roles",
     "the roles are supported; what fails is their targets when those are figures made with "
     "`mystnb: figure:` metadata (see the next row): 'Cross reference target was not found', "
     "then an empty link text.",
     "nothing for the roles themselves; the targets must exist (next row)."),
    ("figures", "figure metadata (`mystnb: figure:`)",
     "ignored: mystmd reads `#| label:` / `#| caption:` comment options (or `label`/`caption` cell "
     "metadata), not `mystnb.figure`, so no figure gets its name, number or caption.",
     "move each figure's name and caption into `#| label:` / `#| caption:` cell options (myst-nb 1 "
     "does not read those: the two layouts cannot share one notebook without a converter)."),
    ("cite", "`{cite}` roles and the bibliography",
     "supported: `{cite:p}`, `{cite:t}` and `{cite}` resolve against `project.bibliography` (the "
     "upgrade carries `bibtex_bibfiles` over), and `{bibliography}` renders.",
     "nothing found; the citation style (author-year) was not compared with the rendered site."),
    ("doc", "`{doc}` roles",
     "supported, with a warning for every use: 'Usage of the {doc} role is not recommended, use a "
     "markdown link to the file instead'.",
     "optional: rewrite as Markdown links `[](path)`."),
    ("math", "maths: MathJax macros and KaTeX",
     "the MathJax macros of `_config.yml` are dropped by the upgrade (they would go into "
     "`project.math`); mystmd typesets with KaTeX, which rejects `\\lambda_\\max` (an operator as a "
     "subscript without braces) where MathJax accepts it.",
     "`project.math` for the macros; braces in `_{\\max}` (valid in both)."),
    ("details", "`<details>` blocks (solutions, verification)",
     "rendered as collapsed blocks, but the Markdown inside goes through an HTML round trip: its "
     "maths becomes a `span.math-inline` holding raw TeX (not a math node, so the build's KaTeX does "
     "not typeset it) and its roles (glue, numref, doc) become `span.role unhandled`.",
     "`:::{dropdown}` directives (then they show as literal text on Colab, which is why the book "
     "uses HTML), or a theme that typesets the TeX left in the HTML."),
    ("admonitions", "admonitions",
     "the `{admonition}` directives work; the HTML `<div class=\"admonition ...\">` blocks (kept "
     "for Colab) get the same HTML round trip as `<details>`: raw TeX and unhandled roles inside, "
     "and the Sphinx theme's admonition classes mean nothing to the mystmd theme.",
     "`{admonition}` / `{warning}` directives."),
    ("cell-tags", "cell tags",
     "`reader-code` is the book's own tag (checked by `tests/test_notebooks_clean.py`), meaningless "
     "to both tools; mystmd knows `hide-input`, `remove-cell` and the like, as v1 does.",
     "nothing."),
    ("cell-ids", "notebook cell ids",
     "mystmd makes every cell id a project-wide label; ids repeated across notebooks (`cell-00`, "
     "...) give 'Duplicate identifier in project' warnings.",
     "unique cell ids (e.g. prefixed by the page, as most notebooks already are)."),
    ("config", "configuration (`_config.yml` -> `myst.yml`)",
     "the upgrade writes `myst.yml` but drops what has no counterpart (see the table below) and "
     "writes values the validator then rejects (an empty Binder URL).",
     "hand-edit `myst.yml` after the upgrade."),
    ("theme", "the site theme (network)",
     "`build --html` first downloads the `book-theme` template from api.mystmd.org / GitHub; "
     "on a machine that reaches only PyPI and npm (ours, CI's) the HTML build stops there. The "
     "theme is not published on npm or PyPI.",
     "a copy of the theme committed or cached, and `site.template` pointed at that folder."),
    ("other", "other messages", "", ""),
]
CATEGORY_KEYS = [key for key, *_ in CATEGORIES]

PY_ROLES = ("mod", "func", "class", "meth", "attr", "data", "obj", "exc")
AUTODOC_DIRECTIVES = ("automodule", "autoclass", "autofunction", "automethod", "autodata",
                      "autoexception", "autosummary")
ADMONITIONS = ("admonition", "attention", "caution", "danger", "error", "hint", "important", "note",
               "seealso", "tip", "warning", "dropdown")
#: ``_config.yml`` settings and where Jupyter Book 2 would want them in ``myst.yml`` (None: no
#: counterpart). The report says, for each one the book sets, whether the upgrade carried it.
CONFIG_MAP = [
    ("repository.url", "project.github", "repository link"),
    ("bibtex_bibfiles", "project.bibliography", "bibliography files"),
    ("latex.latex_documents", "project.exports", "PDF export"),
    ("exclude_patterns", "project.exclude", "excluded files"),
    ("sphinx.config.mathjax3_config.tex.macros", "project.math", "MathJax macros"),
    ("html.use_multitoc_numbering", "project.numbering", "chapter numbering across parts"),
    ("sphinx.config.html_css_files", "site.options.style", "the book's CSS (a theme option, unverified)"),
    ("execute.timeout", None, "per-cell execution timeout (900 s)"),
    ("execute.execute_notebooks", None, "execution mode `auto` (JB2: `build --execute` or not)"),
    ("launch_buttons.colab_url", None, "Colab launch buttons"),
    ("sphinx.local_extensions", None, "local Sphinx extensions"),
    ("sphinx.extra_extensions", None, "autodoc, napoleon, mathjax"),
    ("sphinx.config.mathjax_path", None, "vendored MathJax (mystmd uses KaTeX)"),
    ("sphinx.config.nitpick_ignore_regex", None, "nitpicky reference checks"),
]
#: Nodes of the built syntax trees (``ast_census``) that show a category broken with no message.
SILENT_BREAKS = {
    "details": ("raw TeX in <details>", "unhandled roles in <details>"),
    "admonitions": ("raw TeX in <div>", "unhandled roles in <div>"),
}
#: What a Jupyter Book 2 log line starts with.
ERROR_MARK, WARNING_MARK = "\u26d4", "\u26a0"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LOCATION = re.compile(r"^(?P<file>[^\s:]+\.(?:md|ipynb|yml|bib))(?::(?P<line>\d+)(?::(?P<col>\d+))?)?\s+"
                      r"(?P<message>.*)$")


class UsageError(Exception):
    """Bad usage: exit code 2."""


# --------------------------------------------------------------------------------------------
# The census of the sources


@dataclass
class Census:
    """Occurrences per category in the book's sources: ``counts[category][page] = n``.

    ``items[category]`` holds the sub-counts the report spells out (which roles, which tags...),
    ``notes[category]`` facts that are not occurrences (glue() calls in code, macros defined),
    ``figure_names`` the names given by ``mystnb: figure:`` metadata (to recognise their missing
    targets in the log), ``extensions`` the local extensions, ``directives`` the directives they
    register and ``macros`` the MathJax macros.
    """

    counts: dict[str, Counter] = field(default_factory=lambda: {key: Counter() for key in CATEGORY_KEYS})
    items: dict[str, Counter] = field(default_factory=lambda: {key: Counter() for key in CATEGORY_KEYS})
    notes: dict[str, list[str]] = field(default_factory=lambda: {key: [] for key in CATEGORY_KEYS})
    figure_names: set[str] = field(default_factory=set)
    extensions: list[str] = field(default_factory=list)
    directives: list[str] = field(default_factory=list)
    macros: list[str] = field(default_factory=list)
    pages: int = 0

    def add(self, category: str, page: str, item: str, n: int = 1) -> None:
        if n:
            self.counts[category][page] += n
            self.items[category][item] += n

    def total(self, category: str) -> int:
        return sum(self.counts[category].values())

    def n_pages(self, category: str) -> int:
        return sum(1 for n in self.counts[category].values() if n)


def _prose(markdown: str) -> str:
    """``markdown`` without literal code: fenced blocks that are not directives, ``\u0060\u0060..\u0060\u0060`` spans.

    A role is written ``{name}\u0060...\u0060``, so single-backtick spans are kept; the contributor notes
    show roles inside double-backtick spans and plain code fences, which are not uses.
    """
    kept, code_fence, directive_fences = [], None, []
    for line in markdown.splitlines():
        match = re.match(r"^\s*(`{3,}|~{3,}|:{3,})(.*)$", line)
        if code_fence is not None:  # inside a code block: drop, up to a closing fence as long
            if match and match.group(1)[0] == code_fence[0] and len(match.group(1)) >= len(code_fence) \
                    and not match.group(2).strip():
                code_fence = None
            continue
        if match:
            marker, info = match.group(1), match.group(2).strip()
            if directive_fences and marker[0] == directive_fences[-1][0] \
                    and len(marker) >= len(directive_fences[-1]) and not info:
                directive_fences.pop()  # the end of a directive
            elif info.startswith("{"):
                directive_fences.append(marker)
            elif marker[0] != ":":
                code_fence = marker
                continue
        kept.append(line)
    return re.sub(r"``.+?``", "", "\n".join(kept))


def _notebook_parts(path: Path) -> tuple[list[str], list[dict]]:
    notebook = json.loads(path.read_text())
    markdown = ["".join(cell.get("source", [])) for cell in notebook.get("cells", [])
                if cell.get("cell_type") == "markdown"]
    return markdown, notebook.get("cells", [])


def extension_directives(ext_dir: Path) -> dict[str, list[str]]:
    """``{extension module: [directive names it registers]}`` for the ``*.py`` files of ``ext_dir``."""
    found = {}
    for path in sorted(ext_dir.glob("*.py")):
        text = path.read_text()
        if "def setup(" in text:
            found[path.stem] = re.findall(r"add_directive\(\s*[\"']([\w-]+)[\"']", text)
    return found


def census(repo: Path, config: dict | None = None) -> Census:
    """Count, page by page, the constructs of ``repo``'s book that a Jupyter Book 2 move touches.

    Args:
        repo: the book's root (``_config.yml``, ``book/``).
        config: the parsed ``_config.yml`` (read from ``repo`` when None).

    Returns:
        The :class:`Census`; pages are paths relative to ``repo``.
    """
    config = _read_config(repo) if config is None else config
    result = Census()
    ext_dir = repo / "book" / "_ext"
    directives_of = extension_directives(ext_dir) if ext_dir.is_dir() else {}
    result.extensions = sorted(directives_of)
    ext_directives = {name for names in directives_of.values() for name in names}
    result.directives = sorted(ext_directives)
    macros = (((config.get("sphinx") or {}).get("config") or {}).get("mathjax3_config") or {})
    result.macros = sorted(((macros.get("tex") or {}).get("macros") or {}))
    for extension in result.extensions:
        result.add("local-extensions", "book/_ext/" + extension + ".py", "extension `" + extension + "`")

    glue_calls = 0
    cell_ids: dict[str, set[str]] = {}
    sources = sorted(p for p in (repo / "book").rglob("*")
                     if p.suffix in (".md", ".ipynb") and "_build" not in p.parts
                     and ".ipynb_checkpoints" not in p.parts and "_ext" not in p.parts)
    for path in sources:
        page = path.relative_to(repo).as_posix()
        result.pages += 1
        if path.suffix == ".ipynb":
            markdown, cells = _notebook_parts(path)
            for cell in cells:
                metadata = cell.get("metadata", {})
                for tag in metadata.get("tags", []):
                    result.add("cell-tags", page, tag)
                figure = (metadata.get("mystnb") or {}).get("figure")
                if figure is not None:
                    result.add("figures", page, "mystnb.figure")
                    if figure.get("name"):
                        result.figure_names.add(figure["name"])
                if cell.get("cell_type") == "code":
                    source = "".join(cell.get("source", []))
                    glue_calls += len(re.findall(r"(?<![\w.])glue\(", source))
                if cell.get("id"):
                    cell_ids.setdefault(cell["id"], set()).add(page)
        else:
            markdown = [path.read_text()]
        for text in map(_prose, markdown):
            _count_markdown(result, page, text, ext_directives)
    for cell_id, pages in cell_ids.items():
        if len(pages) > 1:
            for page in pages:
                result.add("cell-ids", page, "cells whose id another notebook also uses")
    if glue_calls:
        result.notes["glue"].append(f"{glue_calls} `glue(...)` calls in code cells")
    if result.macros:
        used = sum(n for item, n in result.items["math"].items() if item.startswith("macro "))
        result.notes["math"].append(f"{len(result.macros)} MathJax macros defined in _config.yml "
                                    f"({', '.join(chr(92) + m for m in result.macros)}), {used} uses")
    return result


def _count_markdown(result: Census, page: str, text: str, ext_directives: set[str]) -> None:
    for name in re.findall(r"\{([\w:.-]+)\}`", text):
        if name.startswith("glue"):
            result.add("glue", page, "`{" + name + "}` roles")
        elif name in ("numref", "ref"):
            result.add("numref", page, "`{" + name + "}`")
        elif name.startswith("cite"):
            result.add("cite", page, "`{" + name + "}`")
        elif name == "doc":
            result.add("doc", page, "`{doc}`")
        elif name.removeprefix("py:") in PY_ROLES:
            result.add("py-roles", page, "`{" + name + "}`")
    for name in re.findall(r"^\s*(?:`{3,}|:{3,})\s*\{([\w:.-]+)\}", text, re.M):
        if name in ext_directives:
            result.add("local-extensions", page, "`{" + name + "}` directive")
        elif name.lower() in ADMONITIONS:
            result.add("admonitions", page, "`{" + name + "}` directive")
        elif name == "bibliography":
            result.add("cite", page, "`{bibliography}` directive")
    for name in re.findall(r"^\s*\.\.\s+(auto\w+)::", text, re.M):
        if name in AUTODOC_DIRECTIVES:
            result.add("autodoc", page, "`.. " + name + "::`")
    result.add("details", page, "`<details>` blocks", len(re.findall(r"<details\b", text)))
    result.add("admonitions", page, "HTML `<div class=\"admonition\">`",
               len(re.findall(r"<div\s+class=\"admonition\b", text)))
    for macro in result.macros:
        result.add("math", page, "macro `\\" + macro + "`", len(re.findall(r"\\" + re.escape(macro) + r"(?![A-Za-z])", text)))
    result.add("math", page, "operator subscript without braces (`\\lambda_\\max`)",
               len(re.findall(r"[_^]\\(?:max|min|sup|inf|lim|det|log|exp)(?![A-Za-z])", text)))


# --------------------------------------------------------------------------------------------
# The logs of Jupyter Book 2


@dataclass
class Message:
    """One error or warning of a Jupyter Book 2 log."""

    severity: str  # "error" | "warning"
    text: str
    file: str | None = None
    line: int | None = None
    column: int | None = None
    category: str = "other"


def parse_log(log: str) -> list[Message]:
    """The errors and warnings of a Jupyter Book 2 log, each with its continuation lines.

    A message starts with the no-entry sign (error) or the warning sign; indented lines that
    follow belong to it. An unmarked line saying that something failed (the theme download's
    "request to ... failed") is an error too.
    """
    messages: list[Message] = []
    current = None
    for raw in ANSI.sub("", log).splitlines():
        line = raw.rstrip()
        stripped = line.lstrip()
        if stripped.startswith((ERROR_MARK, WARNING_MARK)):
            severity = "error" if stripped.startswith(ERROR_MARK) else "warning"
            body = stripped[1:].lstrip("\ufe0f").strip()
            current = Message(severity, body)
            match = LOCATION.match(body)
            if match:
                current.file, current.text = match.group("file"), match.group("message")
                current.line = int(match.group("line")) if match.group("line") else None
                current.column = int(match.group("col")) if match.group("col") else None
            messages.append(current)
        elif current is not None and line.startswith((" ", "\t")) and stripped:
            current.text += "\n" + stripped
        elif re.search(r"\b(failed|ENOTFOUND|Error:)", line):
            current = Message("error", stripped)
            messages.append(current)
        else:
            current = None
    return messages


#: (category, pattern on the message text), first match wins; local-extension directives and
#: figure targets are recognised from the census.
RULES = [
    ("theme", r"api\.mystmd\.org|ENOTFOUND|getaddrinfo|template"),
    ("config", r"myst\.yml|\bconfig\b"),
    ("glue", r"unknown role: glue"),
    ("autodoc", r"unknown directive: (eval-rst|auto\w+)"),
    ("py-roles", r"unknown role: (py:)?(" + "|".join(PY_ROLES) + r")\b"),
    ("doc", r"\{doc\} role"),
    ("numref", r"Cross reference"),
    ("cite", r"citation|cite|bibliograph|\.bib\b"),
    ("math", r"KaTeX|Got function|Undefined control sequence|[Mm]ath"),
    ("cell-ids", r"Duplicate identifier"),
    ("details", r"details|summary"),
    ("admonitions", r"admonition"),
    ("cell-tags", r"\btags?\b"),
]


def classify(messages: list[Message], census_: Census | None = None,
             ext_directives: set[str] | None = None) -> list[Message]:
    """Set each message's ``category`` (one of ``CATEGORY_KEYS``); returns the same list."""
    if ext_directives is None:
        ext_directives = set(census_.directives) if census_ else set()
    figures = census_.figure_names if census_ else set()
    for message in messages:
        text = message.text
        match = re.search(r"unknown directive: ([\w:.-]+)", text)
        target = re.search(r"Cross reference target was not found: (\S+)", text)
        if match and match.group(1) in ext_directives:
            message.category = "local-extensions"
        elif target and target.group(1) in figures:
            message.category = "figures"
        else:
            message.category = next((category for category, pattern in RULES
                                     if re.search(pattern, text)), "other")
    return messages


# --------------------------------------------------------------------------------------------
# The built syntax trees


def ast_census(content_dir: Path) -> Counter:
    """What the built pages (``_build/site/content/*.json``) still hold unresolved, and where.

    Keys: ``role <name>`` / ``directive <name>`` (unknown roles and directives left as raw nodes),
    ``details``, ``cite``, ``math error``, and, inside ``<details>`` / HTML ``<div>`` blocks,
    ``raw TeX in <details>`` / ``unhandled roles in <details>`` (and ``<div>``).
    """
    found: Counter = Counter()

    def walk(node, inside):
        if isinstance(node, list):
            for child in node:
                walk(child, inside)
            return
        if not isinstance(node, dict):
            return
        kind = node.get("type")
        if kind in ("details", "div"):
            found[kind] += 1
            inside = "<details>" if kind == "details" else "<div>"
        elif kind == "mystRole":
            found["role " + str(node.get("name"))] += 1
        elif kind == "mystDirective":
            found["directive " + str(node.get("name"))] += 1
        elif kind == "cite":
            found["cite"] += 1
        elif kind in ("math", "inlineMath") and node.get("error"):
            found["math error"] += 1
        elif kind == "span" and inside:
            css = str(node.get("class", ""))
            if css.startswith("math-"):
                found["raw TeX in " + inside] += 1
            elif "role unhandled" in css:
                found["unhandled roles in " + inside] += 1
        for key, value in node.items():
            if key != "position":
                walk(value, inside)

    for path in sorted(content_dir.glob("*.json")):
        walk(json.loads(path.read_text()).get("mdast"), None)
    return found


# --------------------------------------------------------------------------------------------
# Configuration


def _read_config(repo: Path) -> dict:
    return yaml.safe_load((repo / "_config.yml").read_text()) or {}


def _lookup(data: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def config_fate(v1: dict, myst: dict | None, toc_numbered: bool = False) -> list[tuple[str, str, str]]:
    """For each ``CONFIG_MAP`` setting that ``v1`` sets: (setting, what it is, its fate).

    The fate is ``carried to `X` `` when the upgraded ``myst`` has a value at ``X``, else ``dropped``.
    ``toc_numbered``: ``_toc.yml`` numbers parts (numbering is then a setting even when
    ``html.use_multitoc_numbering`` is not set).
    """
    rows = []
    for setting, target, what in CONFIG_MAP:
        value = _lookup(v1, setting)
        if value in (None, "", [], {}) and not (setting == "html.use_multitoc_numbering" and toc_numbered):
            continue
        if target is None:
            fate = "no counterpart: dropped"
        elif myst is not None and _lookup(myst, target) not in (None, "", [], {}):
            fate = f"carried to `{target}`"
        else:
            fate = f"dropped (would be `{target}`)"
        rows.append((setting, what, fate))
    return rows


# --------------------------------------------------------------------------------------------
# Running Jupyter Book 2


def find_jupyter_book(explicit: str | None) -> tuple[str | None, str]:
    """(path, version) of Jupyter Book 2, or (None, why not).

    Raises:
        UsageError: ``explicit`` is given but missing or not Jupyter Book 2.
    """
    candidates = [("--jupyter-book", explicit)] if explicit else []
    if not explicit and os.environ.get(ENV_EXECUTABLE):
        candidates.append(("$" + ENV_EXECUTABLE, os.environ[ENV_EXECUTABLE]))
    if not candidates:
        candidates.append(("PATH", shutil.which("jupyter-book")))
    origin, path = candidates[0]
    if path is None:
        return None, "no `jupyter-book` on PATH"
    resolved = shutil.which(path) or (path if Path(path).is_file() else None)
    if resolved is None:
        if origin == "PATH":
            return None, "no `jupyter-book` on PATH"
        raise UsageError(f"{origin}: {path} does not exist or is not executable")
    try:
        out = subprocess.run([resolved, "--version"], capture_output=True, text=True, timeout=300,
                             stdin=subprocess.DEVNULL, env=_tool_env()).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        raise UsageError(f"{origin}: {resolved} --version failed: {error}") from error
    version = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
    if version is None or int(version.group(1)) < 2:
        found = version.group(0) if version else "an unknown version"
        why = f"{resolved} is Jupyter Book {found}, not 2.x"
        if origin != "PATH":
            raise UsageError(f"{origin}: {why}")
        return None, why
    return resolved, version.group(0)


def _tool_env() -> dict:
    # Never let the Python wrapper of Jupyter Book 2 ask to install Node.js (it would wait for stdin).
    return {**os.environ, "JB_ALLOW_NODEENV": "no"}


def copy_book(repo: Path, dest: Path) -> list[str]:
    """Copy what the build reads (``_config.yml``, ``_toc.yml``, ``book/``) from ``repo`` to ``dest``.

    Raises:
        UsageError: ``repo`` is not the book's root.
    """
    missing = [name for name in ("_config.yml", "_toc.yml", "book") if not (repo / name).exists()]
    if missing:
        raise UsageError(f"--repo {repo}: not the book's root (missing {', '.join(missing)})")
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(repo / name, dest / name)
    shutil.copytree(repo / "book", dest / "book",
                    ignore=shutil.ignore_patterns("_build", ".ipynb_checkpoints", "__pycache__"))
    return ["_config.yml", "_toc.yml", "book/"]


@dataclass
class Step:
    """One command of the dry run."""

    name: str
    command: list[str]
    returncode: int | None = None
    seconds: float = 0.0
    log: str = ""


def run_step(step: Step, cwd: Path, timeout: float, stdin: str | None = None) -> Step:
    start = time.perf_counter()
    try:
        done = subprocess.run(step.command, cwd=cwd, input=stdin if stdin is not None else "",
                              capture_output=True, text=True, timeout=timeout, env=_tool_env())
        step.returncode, step.log = done.returncode, ANSI.sub("", done.stdout + done.stderr)
    except subprocess.TimeoutExpired as error:
        out = error.stdout.decode() if isinstance(error.stdout, bytes) else (error.stdout or "")
        step.returncode, step.log = None, ANSI.sub("", out) + f"\n(timed out after {timeout:.0f} s)"
    step.seconds = time.perf_counter() - start
    return step


def node_version() -> str:
    node = shutil.which("node")
    if node is None:
        return "not found"
    return subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()


# --------------------------------------------------------------------------------------------
# The report


def _examples(messages: list[Message], n: int = 3) -> list[str]:
    seen, shown = set(), []
    for message in messages:
        head = message.text.splitlines()[0]
        key = re.sub(r"\d+", "N", head)
        if key in seen:
            continue
        seen.add(key)
        where = f"{message.file}:{message.line}: " if message.file and message.line else (
            f"{message.file}: " if message.file else "")
        shown.append(f"{message.severity}: {where}{head}")
        if len(shown) == n:
            break
    return shown


def render_report(census_: Census, config_rows, messages: list[Message] | None, steps: list[Step],
                  ast: Counter | None, tool: tuple[str | None, str], elapsed: float) -> str:
    """The Markdown report of a dry run (``messages`` None: Jupyter Book 2 was not run)."""
    path, version = tool
    lines = ["# Jupyter Book 2 dry run", ""]
    if path is None:
        lines += [f"Jupyter Book 2 was not run: {version}. Install it in a separate environment "
                  "(`python -m venv /tmp/jb2-venv && /tmp/jb2-venv/bin/pip install \"jupyter-book>=2\"`) "
                  "and pass `--jupyter-book /tmp/jb2-venv/bin/jupyter-book`. Only the census of the "
                  "sources follows.", ""]
    else:
        mystmd = next((m.group(1) for step in steps for m in [re.search(r"^\s*-\s*myst\s+(\S+)", step.log, re.M)] if m),
                      "unknown")
        lines += [f"Jupyter Book {version} (`{path}`, mystmd {mystmd}), Node.js {node_version()}; "
                  f"{census_.pages} pages; {elapsed:.0f} s in all.", ""]
        lines += ["| step | command | exit | seconds | errors | warnings |", "|---|---|---|---|---|---|"]
        for step in steps:
            step_messages = parse_log(step.log)
            lines.append(f"| {step.name} | `{' '.join(Path(step.command[0]).name if i == 0 else a for i, a in enumerate(step.command))}` "
                         f"| {step.returncode if step.returncode is not None else 'timeout'} | {step.seconds:.1f} "
                         f"| {sum(m.severity == 'error' for m in step_messages)} "
                         f"| {sum(m.severity == 'warning' for m in step_messages)} |")
        lines.append("")
    lines += ["## What breaks, by category", "",
              "| category | in the sources | build errors / warnings | verdict |", "|---|---|---|---|"]
    by_category = {key: [m for m in (messages or []) if m.category == key] for key in CATEGORY_KEYS}
    for key, title, _, _ in CATEGORIES:
        total, pages = census_.total(key), census_.n_pages(key)
        found = by_category[key]
        if not total and not found and not census_.notes[key]:
            continue
        errors = sum(m.severity == "error" for m in found)
        warnings = len(found) - errors
        silent = sum((ast or {}).get(node, 0) for node in SILENT_BREAKS.get(key, ()))
        if messages is None:
            verdict = "not run"
        elif errors:
            verdict = "breaks"
        elif silent:
            verdict = f"breaks silently ({silent} nodes)"
        else:
            verdict = "warnings" if warnings else "no message"
        details = "; ".join([f"{item}: {n}" for item, n in census_.items[key].most_common()] + census_.notes[key])
        where = f"{pages} file" + ("s" if pages != 1 else "")
        source = f"{total} in {where} ({details})" if total else (details or "-")
        lines.append(f"| {title} | {source} | {errors} / {warnings} | {verdict} |")
    lines.append("")
    for key, title, happens, remedy in CATEGORIES:
        found = by_category[key]
        if not census_.total(key) and not found and not census_.notes[key]:
            continue
        lines += [f"### {title}", ""]
        if happens:
            lines += [f"- What happens: {happens}", f"- A move would need: {remedy}"]
        for example in _examples(found):
            lines.append(f"- `{example}`")
        lines.append("")
    if ast:
        lines += ["## What the built pages hold (syntax trees of `build --site`)", "",
                  "| node | count |", "|---|---|"]
        lines += [f"| `{key}` | {n} |" for key, n in sorted(ast.items())]
        lines.append("")
    if config_rows:
        lines += ["## `_config.yml` settings after the upgrade", "", "| setting | what | fate |", "|---|---|---|"]
        lines += [f"| `{setting}` | {what} | {fate} |" for setting, what, fate in config_rows]
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------


def dry_run(repo: Path, out: Path, executable: str | None, timeout: float, keep: bool) -> int:
    start = time.perf_counter()
    v1 = _read_config(repo) if (repo / "_config.yml").is_file() else None
    if v1 is None or not (repo / "_toc.yml").is_file() or not (repo / "book").is_dir():
        raise UsageError(f"--repo {repo}: not the book's root (needs _config.yml, _toc.yml and book/)")
    toc = yaml.safe_load((repo / "_toc.yml").read_text()) or {}
    toc_numbered = any(part.get("numbered") for part in toc.get("parts", []))
    census_ = census(repo, v1)
    tool = find_jupyter_book(executable)
    out.mkdir(parents=True, exist_ok=True)
    if tool[0] is None:
        report = render_report(census_, [], None, [], None, tool, time.perf_counter() - start)
        (out / "report.md").write_text(report + "\n")
        print(f"Jupyter Book 2 is not installed here ({tool[1]}): nothing was upgraded or built.\n"
              f"Install it in a separate environment and pass --jupyter-book, e.g.\n"
              f"  python -m venv /tmp/jb2-venv && /tmp/jb2-venv/bin/pip install \"jupyter-book>=2\"\n"
              f"  python .ci/jb2_dry_run.py --jupyter-book /tmp/jb2-venv/bin/jupyter-book\n"
              f"The census of the sources is in {out / 'report.md'}.")
        return 0
    jb = tool[0]
    work = Path(tempfile.mkdtemp(prefix="jb2-dry-run-"))
    try:
        copy_book(repo, work)
        upgrade = run_step(Step("upgrade", [jb, "init", "--project"]), work, timeout, stdin="y\n")
        steps = [upgrade]
        myst_path = work / "myst.yml"
        (out / "upgrade.log").write_text(upgrade.log)
        if not myst_path.is_file():
            print(f"the upgrade wrote no myst.yml (exit {upgrade.returncode}); its log: {out / 'upgrade.log'}",
                  file=sys.stderr)
            return 1
        shutil.copy2(myst_path, out / "myst.yml")
        myst = yaml.safe_load(myst_path.read_text()) or {}
        for name, flag in (("site content", "--site"), ("HTML", "--html")):
            step = run_step(Step(name, [jb, "build", flag, "--ci"]), work, timeout)
            steps.append(step)
            (out / f"build-{flag.lstrip('-')}.log").write_text(step.log)
        content = work / "_build" / "site" / "content"
        ast = ast_census(content) if content.is_dir() else Counter()
        # The HTML build repeats the site-content messages: classify each distinct message once.
        messages, seen = [], set()
        for step in steps:
            for message in parse_log(step.log):
                key = (message.severity, message.file, message.line, message.column, message.text)
                if key not in seen:
                    seen.add(key)
                    messages.append(message)
        classify(messages, census_)
        report = render_report(census_, config_fate(v1, myst, toc_numbered), messages,
                               steps, ast, tool, time.perf_counter() - start)
        (out / "report.md").write_text(report + "\n")
        errors = sum(m.severity == "error" for m in messages)
        print(f"Jupyter Book {tool[1]}: {errors} errors, {len(messages) - errors} warnings; "
              f"{time.perf_counter() - start:.0f} s. Report: {out / 'report.md'}")
        if keep:
            print(f"the upgraded copy is kept in {work}")
        return 0
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=ROOT, help="the book's root (default: this checkout)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for report.md, the logs and myst.yml (default: REPO/_build/jb2-dry-run)")
    parser.add_argument("--jupyter-book", dest="jupyter_book", default=None,
                        help=f"the Jupyter Book 2 executable (default: ${ENV_EXECUTABLE}, else jupyter-book on PATH)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per step, > 0 (default 600)")
    parser.add_argument("--keep", action="store_true", help="keep the upgraded temporary copy")
    args = parser.parse_args(argv)
    if not args.timeout > 0:
        parser.error(f"--timeout must be > 0 seconds, got {args.timeout}")
    repo = args.repo.resolve()
    try:
        return dry_run(repo, (args.out or repo / "_build" / "jb2-dry-run").resolve(), args.jupyter_book,
                       args.timeout, args.keep)
    except UsageError as error:
        print(f"jb2_dry_run.py: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
