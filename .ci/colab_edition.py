#!/usr/bin/env python3
"""Write the Colab edition of the book's notebooks: the MyST of the prose rendered as plain Markdown.

Usage: python .ci/colab_edition.py [--build _build] [--out _build/colab] [--base-url URL]
[--version dev] [NOTEBOOK.ipynb ...]  (what ``make colab-edition`` runs, after ``make book``; with
no notebooks, every notebook of ``_toc.yml``).

Colab, Jupyter and JupyterLab render a notebook's Markdown cells as CommonMark: the MyST the site
understands (``{glue:text}`key:.2f```, ``{numref}``, ``{cite:p}``, ``:::{admonition}``) shows there
as literal text. This script writes, for every notebook of the table of contents, a copy under
``--out`` at the same path (``_build/colab/book/ch0_practice/01_what_is_a_deq.ipynb``) in which
the Markdown cells say what the site says:

- glue roles (``{glue}``, ``{glue:}``, ``{glue:any}``, ``{glue:text}``, ``{glue:md}``, also
  ``path::key`` into another notebook) become the value the build computed, formatted as myst-nb
  does (``myst_nb.core.variables.format_plain_text``: the ``text/plain`` output, literal-evaluated,
  then ``format(value, spec)`` with the spec's type character choosing ``int``/``float``/``str``;
  no spec means ``s``). The values are read from the executed build: myst-nb's
  ``_build/jupyter_execute/<page>.ipynb`` and ``<page>.glue.json`` (the hidden glue outputs it
  removed from that notebook), else the glue outputs (``metadata.scrapbook``) of the notebook
  itself when ``make test`` executed it in place. Glue directives (``{glue:figure}``,
  ``{glue:md}``, ``{glue:math}``, ``{glue}``) become the image (a ``data:`` URI), Markdown or
  ``$$`` maths;
- ``{doc}`` and ``{ref}`` become links to the published pages (``--base-url``, default the
  ``html.baseurl`` of ``_config.yml`` plus ``--version``'s folder, ``dev/``: see
  book/contributing.md), with the page's title or the label's heading / caption as text unless
  the role gives its own;
- ``{numref}`` becomes "Fig. 3.2", linked: the number the built site shows, read from the page in
  ``_build/html`` (its ``span.caption-number``); without a built site, the number Sphinx's numfig
  assigns is recomputed from ``_toc.yml`` (numbered parts, chapters continuing across parts as
  sphinx-multitoc-numbering does, ``numfig_secnum_depth`` 1, one counter per chapter and one
  shared by the unnumbered pages) and the captioned figures of each page (code cells with
  ``mystnb.figure`` metadata, ``{figure}`` directives);
- ``{cite:p}`` / ``{cite}`` become "(Bai et al. 2019; Geng et al. 2021)", ``{cite:t}`` "Bai et al.
  (2019)", as sphinxcontrib-bibtex's author-year style writes them; a last Markdown cell,
  "References", lists every work the notebook cites (from book/references.bib);
- ``{math}`` becomes ``$...$``; ``{eq}`` becomes "Eq. (n)" with n the equation's place among the
  labelled ``$$ ... $$ (label)`` equations of the page (whose labels are dropped);
- API roles (``{func}``, ``{class}``, ``{meth}``, ``{mod}``, ``{attr}``, ``{data}``, ``{exc}``,
  their ``py:`` forms) become code links into the API reference page;
- admonitions (```` ```{note} ````, ``:::{admonition} Title``, ``{warning}``, ``{tip}``, ...)
  become blockquotes with a bold title; ``{dropdown}`` / ``{toggle}`` a ``<details>`` block;
  ``{math}`` a ``$$`` block; ``{code-block}`` / ``{code-cell}``-free ``{code}`` a plain fence;
- MyST targets (``(label)=``) and comments (``% ...``) are dropped.

``glue()`` (``deqlab.lab.experiments.glue``) prints ``name = value`` under a cell outside the
site's build, for a reader who sees the literal role; in the Colab edition the prose shows the
values, so a cell (id ``colab-edition-quiet-glue``) placed before the first cell that calls
``glue(`` sets ``DEQLAB_BOOK_BUILD=1``, which switches that echo off as in the book's own build,
and echo lines of the glued names are dropped from the stored stdout.

Nothing else changes: code cells are copied as they are (source, outputs, metadata), as are the
cells' order, ids and metadata and the notebook's metadata (to which ``deqlab_colab_edition``,
naming the source and the executed notebook by paths relative to the book's root, never the
builder's absolute path, is added). Fenced code blocks and inline code in the prose are left alone.

A role or directive the script does not know, a glue key the build did not store, a label or
citation key that does not exist is an error naming the notebook, the cell and the role; all
missing glue values of a notebook are reported together (``MissingGlueError.missing``). Exit
status 1 with those messages. Malformed input (a notebook that is not valid JSON, has no
``cells`` or a cell whose ``source`` is not text, a ``_toc.yml`` without ``root``, a role with no
content such as an empty ``{cite:t}``) and bad usage (a notebook outside the book's root, an
``--out`` that would overwrite the inputs: ``book/`` or inside it, the root itself, myst-nb's
``jupyter_execute``) are one line, ``colab edition: error: FILE[: cell N]: ...; expected ...``,
and exit status 2.
"""

from __future__ import annotations

import argparse
import ast
import base64
import html
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------------------------
# errors


class ConversionError(ValueError):
    """A notebook the Colab edition cannot be made from (names the notebook, cell and role)."""


class MalformedInputError(ConversionError):
    """Input the script cannot read at all (not valid JSON, a notebook without cells, a cell whose
    source is not text, a table of contents without ``root``, a notebook outside the book): one
    line naming the file (and cell) and what was expected; exit status 2."""


def _display_path(path: Path, root: Path | None = None) -> str:
    """``path`` relative to ``root`` (or to the working folder) when inside it, else as given: what
    messages and the edition's metadata show (never the builder's absolute path in metadata)."""
    for base in filter(None, (root, Path.cwd())):
        try:
            return path.resolve().relative_to(base.resolve()).as_posix()
        except ValueError:
            continue
    return str(path)


def read_notebook(path: Path, root: Path | None = None) -> dict:
    """A notebook file as a dict, checked: valid JSON, an object with a ``cells`` list, each cell
    an object with a ``cell_type`` and a ``source`` that is a string or a list of strings.

    Raises:
        MalformedInputError: naming the file (and cell) and what was expected.
    """
    name = _display_path(path, root)
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise MalformedInputError(f"{name}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg});"
                                  " expected an nbformat 4 notebook") from None
    except UnicodeDecodeError:
        raise MalformedInputError(f"{name}: not UTF-8 text; expected an nbformat 4 notebook") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise MalformedInputError(f"{name}: no \"cells\" list; expected an nbformat 4 notebook"
                                  " ({\"cells\": [...], \"metadata\": {...}, \"nbformat\": 4})")
    for index, cell in enumerate(notebook["cells"]):
        if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str):
            raise MalformedInputError(f"{name}: cell {index}: not a cell; expected an object with a \"cell_type\"")
        source = cell.get("source", "")
        if not (isinstance(source, str) or (isinstance(source, list) and all(isinstance(x, str) for x in source))):
            raise MalformedInputError(f"{name}: cell {index}: \"source\" is {json.dumps(source)[:40]};"
                                      " expected a string or a list of strings")
    return notebook


class MissingGlueError(ConversionError):
    """Glue keys that the prose references and the build did not store.

    Attributes:
        notebook: the notebook's path.
        missing: (cell index, role text) of every unresolved glue role, in order.
    """

    def __init__(self, notebook: str, missing: list[tuple[int, str]], source: str):
        self.notebook = notebook
        self.missing = missing
        lines = "\n".join(f"  cell {cell}: {role}" for cell, role in missing)
        super().__init__(
            f"{notebook}: {len(missing)} glue value(s) missing from {source} (execute the notebook"
            f" first: make test, then make book):\n{lines}"
        )


# ------------------------------------------------------------------------------------------------
# the book: table of contents, titles, labels, figures, bibliography


def _cell_source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _read_yaml(path: Path) -> dict:
    import yaml  # PyYAML comes with jupyter-book (the book extra)

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise MalformedInputError(f"{path}: no such file; expected the book's root folder to hold it") from None
    except yaml.YAMLError as exc:
        raise MalformedInputError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None


@dataclass
class TocEntry:
    docname: str  # e.g. "book/ch0_practice/01_what_is_a_deq"
    secnum: tuple[int, ...]  # () for unnumbered pages; (chapter,) or (chapter, section)


def read_toc(root: Path) -> list[TocEntry]:
    """Every page of ``_toc.yml`` in the order Sphinx walks them, with its section number.

    Numbered parts number their chapters; chapter numbers continue from one numbered part to the
    next (sphinx-multitoc-numbering, on with ``html.use_multitoc_numbering``).
    """
    toc = _read_yaml(root / "_toc.yml")
    if not isinstance(toc, dict) or not isinstance(toc.get("root"), str) or not toc["root"].strip():
        raise MalformedInputError(f"{_display_path(root / '_toc.yml', root)}: no `root` entry; expected the"
                                  " first page, e.g. `root: book/intro`")
    entries = [TocEntry(toc["root"], ())]
    chapter = 0

    def walk(items: list, numbered: bool, prefix: tuple[int, ...]) -> None:
        nonlocal chapter
        for index, item in enumerate(items, start=1):
            if "file" not in item:
                continue
            if numbered and not prefix:
                chapter += 1
                number: tuple[int, ...] = (chapter,)
            elif numbered:
                number = (*prefix, index)
            else:
                number = ()
            entries.append(TocEntry(item["file"], number))
            for key in ("sections", "chapters"):
                if key in item:
                    walk(item[key], numbered, number if numbered else ())

    for part in toc.get("parts", []):
        walk(part.get("chapters", []), bool(part.get("numbered")), ())
    walk(toc.get("chapters", []), bool(toc.get("numbered")), ())
    return entries


def _doc_path(root: Path, docname: str) -> Path | None:
    for suffix in (".ipynb", ".md"):
        if (root / (docname + suffix)).exists():
            return root / (docname + suffix)
    return None


def _markdown_blocks(root: Path, docname: str) -> list[str]:
    """The Markdown of a page: its Markdown cells, or the whole .md file (front matter removed)."""
    path = _doc_path(root, docname)
    if path is None:
        return []
    if path.suffix == ".ipynb":
        notebook = read_notebook(path, root)
        return [_cell_source(c) for c in notebook["cells"] if c["cell_type"] == "markdown"]
    text = path.read_text(encoding="utf-8")
    if text.startswith("---\n"):
        end = text.find("\n---", 4)
        text = text[end + 4 :] if end > 0 else text
    return [text]


_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_TARGET = re.compile(r"^\s*\((?P<label>[^()\s]+)\)=\s*$")
_FENCE_OPEN = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,}|:{3,})\s*(?P<info>.*)$")


def _strip_inline_markdown(text: str) -> str:
    return re.sub(r"\*\*|__", "", text).strip()


@dataclass
class Book:
    """What the conversion needs to know about the whole book."""

    root: Path
    base_url: str
    toc: list[TocEntry]
    titles: dict[str, str] = field(default_factory=dict)
    labels: dict[str, tuple[str, str]] = field(default_factory=dict)  # label -> (docname, text)
    figures: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (docname, number)
    bibliography: dict[str, dict] = field(default_factory=dict)
    html_dir: Path | None = None
    numfig_format: str = "Fig. %s"

    def url(self, docname: str, anchor: str = "") -> str:
        return f"{self.base_url}{docname}.html" + (f"#{anchor}" if anchor else "")


def _figures_of_page(root: Path, docname: str) -> list[str]:
    """Names ('' when unnamed) of the captioned figures of a page, in order (what numfig counts)."""
    path = _doc_path(root, docname)
    if path is None:
        return []
    names = []
    cells: list[tuple[str, str, dict]]
    if path.suffix == ".ipynb":
        notebook = read_notebook(path, root)
        cells = [(c["cell_type"], _cell_source(c), c.get("metadata", {})) for c in notebook["cells"]]
    else:
        cells = [("markdown", text, {}) for text in _markdown_blocks(root, docname)]
    for kind, text, metadata in cells:
        if kind == "code":
            figure = metadata.get("mystnb", {}).get("figure") or metadata.get("myst", {}).get("figure")
            if figure and figure.get("caption"):
                names.append(figure.get("name", ""))
        elif kind == "markdown":
            for match in re.finditer(
                r"^\s*(`{3,}|:{3,})\s*\{(?:figure|glue:figure)\}[^\n]*\n((?:(?!\1).*\n?)*?)\s*\1\s*$",
                text,
                re.MULTILINE,
            ):
                body = match.group(2)
                name = re.search(r"^\s*:name:\s*(\S+)", body, re.MULTILINE)
                caption = [line for line in body.splitlines() if line.strip() and not line.strip().startswith(":")]
                if caption:
                    names.append(name.group(1) if name else "")
    return names


def number_figures(root: Path, toc: list[TocEntry], secnum_depth: int = 1) -> dict[str, tuple[str, str]]:
    """Figure name -> (docname, "3.2"), as Sphinx's ``assign_figure_numbers`` assigns them."""
    counters: dict[tuple[int, ...], int] = {}
    numbers: dict[str, tuple[str, str]] = {}
    for entry in toc:
        key = entry.secnum[:secnum_depth]
        for name in _figures_of_page(root, entry.docname):
            counters[key] = counters.get(key, 0) + 1
            if name:
                numbers[name] = (entry.docname, ".".join(str(n) for n in (*key, counters[key])))
    return numbers


def figure_numbers_from_html(html_dir: Path, docname: str) -> dict[str, str]:
    """Figure id -> caption number ("Fig. 3.2") of a built page; {} when the page is not there."""
    page = html_dir / f"{docname}.html"
    if not page.exists():
        return {}
    text = page.read_text(encoding="utf-8")
    numbers = {}
    for match in re.finditer(r"<figure\b[^>]*\bid=\"([^\"]+)\"", text):
        caption = re.search(r"<span class=\"caption-number\">(.*?)</span>", text[match.end() :], re.DOTALL)
        if caption:
            numbers[match.group(1)] = html.unescape(re.sub(r"<[^>]+>", "", caption.group(1))).strip()
    return numbers


def _bib_authors(persons: list) -> list[str]:
    return [" ".join(p.last_names).replace("{", "").replace("}", "") for p in persons]


def read_bibliography(path: Path) -> dict[str, dict]:
    """key -> {"authors": [surnames], "year", "text": the reference list entry in Markdown}."""
    from pybtex.database import parse_file  # comes with sphinxcontrib-bibtex (the book extra)

    entries = {}
    for key, entry in parse_file(str(path)).entries.items():
        persons = entry.persons.get("author") or entry.persons.get("editor") or []
        fields = {k.lower(): v.replace("{", "").replace("}", "") for k, v in entry.fields.items()}
        names = []
        for person in persons:
            first = " ".join(f"{n[0]}." for n in person.first_names + person.middle_names if n)
            last = " ".join(person.prelast_names + person.last_names).replace("{", "").replace("}", "")
            names.append(f"{last}, {first}".strip(", "))
        authors = ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1] if names else ""
        venue = fields.get("journal") or fields.get("booktitle") or fields.get("publisher") or ""
        if not venue and fields.get("eprint"):
            venue = f"arXiv:{fields['eprint']}"
        text = f"{authors} ({fields.get('year', 'n.d.')}). {fields.get('title', '')}."
        if venue:
            text += f" *{venue}*."
        if fields.get("doi"):
            text += f" <https://doi.org/{fields['doi']}>"
        elif fields.get("url"):
            text += f" <{fields['url']}>"
        elif fields.get("eprint"):
            text += f" <https://arxiv.org/abs/{fields['eprint']}>"
        entries[key] = {"authors": _bib_authors(persons), "year": fields.get("year", "n.d."), "text": text}
    return entries


def load_book(root: Path = ROOT, build: Path | None = None, base_url: str | None = None, version: str = "dev") -> Book:
    """Read _config.yml, _toc.yml, every page's titles, labels and figures, and the bibliography.

    Args:
        root: the repository root (holding _config.yml and _toc.yml).
        build: the build folder (``_build``); its ``html/`` supplies the figure numbers the site
            shows. None or absent: figure numbers are recomputed (see :func:`number_figures`).
        base_url: where the pages are published; default ``html.baseurl`` + ``version`` + "/".
        version: the site's version folder (``dev`` for main, ``v0.7.0`` for a tag).

    Returns:
        A :class:`Book`.

    Raises:
        ConversionError: if ``_config.yml`` has no ``html.baseurl`` and no ``base_url`` is given.
    """
    config = _read_yaml(root / "_config.yml")
    if base_url is None:
        baseurl = (config.get("html") or {}).get("baseurl")
        if not baseurl:
            raise ConversionError("_config.yml has no html.baseurl: pass --base-url")
        base_url = baseurl.rstrip("/") + "/" + (f"{version.strip('/')}/" if version else "")
    if not base_url.endswith("/"):
        base_url += "/"
    toc = read_toc(root)
    book = Book(root=root, base_url=base_url, toc=toc)
    sphinx_config = (config.get("sphinx") or {}).get("config") or {}
    book.numfig_format = (sphinx_config.get("numfig_format") or {}).get("figure", "Fig. %s")
    html_dir = build / "html" if build is not None else None
    book.html_dir = html_dir if html_dir is not None and html_dir.is_dir() else None
    for entry in toc:
        label = None
        for block in _markdown_blocks(root, entry.docname):
            in_fence = ""
            for line in block.splitlines():
                fence = _FENCE_OPEN.match(line)
                if fence and not in_fence and fence.group("fence")[0] in "`~":
                    in_fence = fence.group("fence")
                    continue
                if in_fence:
                    if line.strip().startswith(in_fence) and not line.strip().strip(in_fence[0]):
                        in_fence = ""
                    continue
                if target := _TARGET.match(line):
                    label = target.group("label")
                    continue
                if heading := _HEADING.match(line):
                    text = _strip_inline_markdown(heading.group(2))
                    book.titles.setdefault(entry.docname, text)
                    if label:
                        book.labels[label] = (entry.docname, text)
                if line.strip():
                    label = None
    computed = number_figures(root, toc)
    for name, (docname, number) in computed.items():
        book.figures[name] = (docname, book.numfig_format % number)
    if book.html_dir is not None:
        for entry in toc:
            for name, shown in figure_numbers_from_html(book.html_dir, entry.docname).items():
                book.figures[name] = (entry.docname, shown)
    for path in config.get("bibtex_bibfiles", []):
        book.bibliography.update(read_bibliography(root / path))
    return book


# ------------------------------------------------------------------------------------------------
# glue values


def format_plain_text(text: str, fmt_spec: str) -> str:
    """A glue value's ``text/plain`` formatted as myst-nb 1.x's ``{glue:text}`` does."""
    try:
        value = ast.literal_eval(text)
    except (SyntaxError, ValueError):
        value = text
    if fmt_spec == "":
        return str(value)
    type_char = fmt_spec[-1]
    if type_char == "s":
        value = str(value)
    elif type_char in ("b", "c", "d", "o", "x", "X"):
        value = int(value)
    elif type_char in ("e", "E", "f", "F", "g", "G", "n", "%"):
        value = float(value)
    return format(value, fmt_spec)


def glue_outputs(notebook: dict) -> dict[str, dict]:
    """key -> mime bundle of every glue output (``metadata.scrapbook``) in a notebook's code cells."""
    data = {}
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        for output in cell.get("outputs", []):
            scrapbook = output.get("metadata", {}).get("scrapbook")
            if not scrapbook:
                continue
            prefix = scrapbook.get("mime_prefix", "")
            data[scrapbook["name"]] = {k[len(prefix) :]: v for k, v in output.get("data", {}).items()}
    return data


@dataclass
class Source:
    """An executed notebook and the glue values the build stored for it."""

    path: Path
    notebook: dict
    glue: dict[str, dict]
    origin: str


def load_source(root: Path, docname: str, build: Path | None) -> Source:
    """The executed notebook of ``docname``: the build's (``jupyter_execute``), else the source."""
    if build is not None:
        executed = build / "jupyter_execute" / f"{docname}.ipynb"
        if executed.exists():
            notebook = read_notebook(executed, root)
            glue = glue_outputs(notebook)
            glue_json = executed.with_name(executed.name[: -len(".ipynb")] + ".glue.json")
            if glue_json.exists():
                try:
                    stored = json.loads(glue_json.read_text(encoding="utf-8"))
                except json.JSONDecodeError as exc:
                    raise MalformedInputError(f"{_display_path(glue_json, root)}: not valid JSON (line {exc.lineno},"
                                              f" column {exc.colno}: {exc.msg}); expected myst-nb's glue values")\
                        from None
                if not isinstance(stored, dict):
                    raise MalformedInputError(f"{_display_path(glue_json, root)}: expected an object of glue values")
                for key, output in stored.items():
                    glue[key] = output.get("data", output) if isinstance(output, dict) else {}
            return Source(executed, notebook, glue, _build_path(executed, root, build))
    path = root / f"{docname}.ipynb"
    notebook = read_notebook(path, root)
    return Source(path, notebook, glue_outputs(notebook),
                  f"{_display_path(path, root)} (no executed build)")


def _build_path(path: Path, root: Path, build: Path) -> str:
    """A path in the build folder as the edition records it: relative to the book's root, or, for a
    build folder elsewhere, starting at the build folder's name (never the builder's absolute path)."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return f"{build.name}/{path.resolve().relative_to(build.resolve()).as_posix()}"


# ------------------------------------------------------------------------------------------------
# the conversion of one Markdown cell

ADMONITIONS = {
    "note": "Note",
    "warning": "Warning",
    "tip": "Tip",
    "important": "Important",
    "caution": "Caution",
    "attention": "Attention",
    "danger": "Danger",
    "error": "Error",
    "hint": "Hint",
    "seealso": "See also",
    "admonition": "",
}
API_ROLES = {"func", "class", "meth", "mod", "attr", "data", "exc", "obj"}
_ROLE = re.compile(r"\{(?P<name>[A-Za-z][\w:+.-]*)\}(?P<ticks>`+)(?P<content>.+?)(?P=ticks)", re.DOTALL)
_CODE_SPAN = re.compile(r"(?<![`}])(?P<ticks>`+)(?!`).+?(?<!`)(?P=ticks)(?!`)", re.DOTALL)
_EXPLICIT = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$", re.DOTALL)
_EQUATION_LABEL = re.compile(r"(\$\$)\s*\((?P<label>[^()\s]+)\)\s*$", re.MULTILINE)
LEFTOVER_ROLE = re.compile(r"\{[A-Za-z][\w:+.-]*\}`")
LEFTOVER_DIRECTIVE = re.compile(r"^\s*(?:`{3,}|:{3,})\s*\{[^}]*\}", re.MULTILINE)


def find_leftover_myst(text: str) -> list[str]:
    """MyST roles and directive fences left in Markdown (outside plain code fences)."""
    found = []
    in_fence = ""
    for line in text.splitlines():
        fence = _FENCE_OPEN.match(line)
        if in_fence:
            if line.strip().startswith(in_fence) and not line.strip().strip(in_fence[0]):
                in_fence = ""
            continue
        if fence and fence.group("fence")[0] in "`~" and not fence.group("info").startswith("{"):
            in_fence = fence.group("fence")
            continue
        if LEFTOVER_DIRECTIVE.match(line) or _TARGET.match(line):
            found.append(line.strip())
        found.extend(m.group(0) for m in _roles_outside_code(line))
    return found


def _roles_outside_code(text: str) -> list[re.Match]:
    """The role starts (``{name}```) of ``text`` that are not inside an inline code span."""
    roles, pos = [], 0
    while pos < len(text):
        role = LEFTOVER_ROLE.search(text, pos)
        code = _CODE_SPAN.search(text, pos)
        if role is None:
            break
        if code is not None and code.start() < role.start():
            pos = code.end()
            continue
        roles.append(role)
        whole = _ROLE.match(text, role.start())
        pos = whole.end() if whole else role.end()
    return roles


@dataclass
class CellContext:
    """Where a role is (for messages) and what it may draw on."""

    book: Book
    notebook: str
    docname: str
    cell: int
    glue: dict[str, dict]
    equations: dict[str, int]
    citations: list[str]
    missing_glue: list[tuple[int, str]]
    sources: dict[str, Source]
    build: Path | None
    stats: dict = field(default_factory=lambda: {"roles": {}, "directives": {}, "citations": 0})

    def count(self, kind: str, name: str) -> None:
        self.stats[kind][name] = self.stats[kind].get(name, 0) + 1

    def error(self, role: str, why: str) -> ConversionError:
        return ConversionError(f"{self.notebook}: cell {self.cell}: {role}: {why}")


def _explicit(content: str) -> tuple[str | None, str]:
    match = _EXPLICIT.match(content.strip())
    if match and match.group("text"):
        return match.group("text"), match.group("target").strip()
    return None, content.strip()


def _resolve_doc(ctx: CellContext, target: str) -> str:
    if target.startswith("/"):
        return target.lstrip("/").removesuffix(".md").removesuffix(".ipynb")
    parts = [*ctx.docname.split("/")[:-1], *target.removesuffix(".md").removesuffix(".ipynb").split("/")]
    out: list[str] = []
    for part in parts:
        if part == "..":
            if out:
                out.pop()
        elif part not in ("", "."):
            out.append(part)
    return "/".join(out)


def _glue_bundle(ctx: CellContext, key: str, role: str) -> dict | None:
    if "::" in key:
        doc, key = key.split("::", 1)
        docname = _resolve_doc(ctx, doc)
        if docname not in ctx.sources:
            try:
                ctx.sources[docname] = load_source(ctx.book.root, docname, ctx.build)
            except FileNotFoundError as exc:
                raise ctx.error(role, f"no notebook {docname}.ipynb to glue from") from exc
        return ctx.sources[docname].glue.get(key)
    return ctx.glue.get(key)


def _mime_as_markdown(bundle: dict, inline: bool) -> str | None:
    if "text/markdown" in bundle:
        text = bundle["text/markdown"]
        return "".join(text) if isinstance(text, list) else text
    for mime in ("image/png", "image/jpeg", "image/svg+xml"):
        if mime in bundle and not inline:
            data = bundle[mime]
            data = "".join(data) if isinstance(data, list) else data
            if mime == "image/svg+xml":
                data = base64.b64encode(data.encode()).decode()
            return f"![](data:{mime};base64,{data.strip()})"
    if "text/latex" in bundle:
        text = bundle["text/latex"]
        return "".join(text) if isinstance(text, list) else text
    if "text/plain" in bundle:
        return format_plain_text(_joined(bundle["text/plain"]), "")
    return None


def _joined(value) -> str:
    return "".join(value) if isinstance(value, list) else value


def render_role(ctx: CellContext, name: str, content: str, whole: str) -> str:
    """The Markdown for one MyST role (``whole`` is the role as written, for messages)."""
    ctx.count("roles", name)
    if name in ("glue", "glue:", "glue:any", "glue:text", "glue:md"):
        # as myst-nb splits it: the text after the last ":" is the format spec
        key, fmt_spec = content, None
        if name == "glue:text" and ":" in content:
            key, fmt_spec = content.rsplit(":", 1)
        key = key.strip()
        bundle = _glue_bundle(ctx, key, whole)
        if bundle is None:
            ctx.missing_glue.append((ctx.cell, whole))
            return whole
        if name == "glue:text":
            if "text/plain" not in bundle:
                raise ctx.error(whole, f"the glued value of {key!r} has no text/plain")
            try:
                return format_plain_text(_joined(bundle["text/plain"]), "s" if fmt_spec is None else fmt_spec)
            except (ValueError, TypeError) as exc:
                raise ctx.error(whole, f"cannot format {_joined(bundle['text/plain'])!r}: {exc}") from exc
        text = _mime_as_markdown(bundle, inline=True)
        if text is None:
            raise ctx.error(whole, f"the glued value of {key!r} has no text form ({sorted(bundle)})")
        return text
    if name == "doc":
        text, target = _explicit(content)
        docname = _resolve_doc(ctx, target)
        if docname not in ctx.book.titles and _doc_path(ctx.book.root, docname) is None:
            raise ctx.error(whole, f"no page {docname!r} in the book")
        return f"[{text or ctx.book.titles.get(docname, docname)}]({ctx.book.url(docname)})"
    if name in ("ref", "numref"):
        text, label = _explicit(content)
        if name == "numref":
            if label not in ctx.book.figures:
                raise ctx.error(whole, f"no numbered figure named {label!r}")
            docname, shown = ctx.book.figures[label]
            if text:
                number = shown.split(" ", 1)[-1] if " " in shown else shown
                shown = text.replace("%s", number).replace("{number}", number)
            return f"[{shown}]({ctx.book.url(docname, label)})"
        if label in ctx.book.labels:
            docname, title = ctx.book.labels[label]
        elif label in ctx.book.figures:
            docname, title = ctx.book.figures[label][0], ctx.book.figures[label][1]
        else:
            raise ctx.error(whole, f"no label {label!r} in the book")
        return f"[{text or title}]({ctx.book.url(docname, label)})"
    if name in ("cite", "cite:p", "cite:t", "cite:ps", "cite:ts", "cite:year", "cite:author"):
        keys = [k.strip() for k in content.split(",") if k.strip()]
        if not keys:
            raise MalformedInputError(f"{ctx.notebook}: cell {ctx.cell}: {whole}: an empty citation; expected one"
                                      f" or more bibliography keys, e.g. {{{name}}}`bai2019deep`")
        parts = []
        for key in keys:
            if key not in ctx.book.bibliography:
                raise ctx.error(whole, f"no entry {key!r} in the bibliography")
            if key not in ctx.citations:
                ctx.citations.append(key)
            entry = ctx.book.bibliography[key]
            authors = entry["authors"]
            full = name.endswith("s")
            if len(authors) == 1:
                who = authors[0]
            elif len(authors) == 2 or (full and authors):
                who = ", ".join(authors[:-1]) + " and " + authors[-1]
            elif authors:
                who = f"{authors[0]} et al."
            else:
                who = key
            if name == "cite:year":
                parts.append(entry["year"])
            elif name == "cite:author":
                parts.append(who)
            elif name in ("cite:t", "cite:ts"):
                parts.append(f"{who} ({entry['year']})")
            else:
                parts.append(f"{who} {entry['year']}")
        if name in ("cite", "cite:p", "cite:ps"):
            return "(" + "; ".join(parts) + ")"
        return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]
    if name == "math":
        return f"${content}$"
    if name == "eq":
        text, label = _explicit(content)
        if label not in ctx.equations:
            raise ctx.error(whole, f"no labelled equation {label!r} on this page")
        return text.replace("%s", str(ctx.equations[label])) if text else f"Eq. ({ctx.equations[label]})"
    api = name.removeprefix("py:")
    if api in API_ROLES:
        text, target = _explicit(content)
        shown = target.lstrip("~").split(".")[-1] if target.startswith("~") else target.lstrip("~")
        target = target.lstrip("~")
        if api in ("func", "meth") and not (text or shown.endswith(")")):
            shown += "()"
        return f"[`{text or shown}`]({ctx.book.url('book/api', target)})"
    if name in ("sub", "sup"):
        return f"<{name}>{content}</{name}>"
    if name == "abbr":
        return content
    raise ctx.error(whole, "unknown role: the Colab edition cannot render it (add it to .ci/colab_edition.py)")


def _convert_inline(ctx: CellContext, text: str) -> str:
    """Roles replaced in a run of prose (inline code spans left alone)."""
    out, pos = [], 0
    while pos < len(text):
        role = _ROLE.search(text, pos)
        code = _CODE_SPAN.search(text, pos)
        if role is None and code is None:
            break
        if code is not None and (role is None or code.start() < role.start()):
            out.append(text[pos : code.end()])
            pos = code.end()
            continue
        out.append(text[pos : role.start()])
        out.append(render_role(ctx, role.group("name"), role.group("content"), role.group(0)))
        pos = role.end()
    out.append(text[pos:])
    return "".join(out)


def _blockquote(title: str, body: str) -> str:
    lines = [f"> **{title}**" if title else None, ">" if title and body.strip() else None]
    lines = [line for line in lines if line is not None]
    lines += [f"> {line}".rstrip() for line in body.strip("\n").splitlines()]
    return "\n".join(lines)


def _split_options(lines: list[str]) -> tuple[dict[str, str], list[str]]:
    options = {}
    index = 0
    if lines and lines[0].strip() == "---":  # YAML block of options
        end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
        if end is not None:
            for line in lines[1:end]:
                if ":" in line:
                    key, value = line.split(":", 1)
                    options[key.strip()] = value.strip()
            return options, lines[end + 1 :]
    while index < len(lines) and (match := re.match(r"^\s*:([\w-]+):\s*(.*)$", lines[index])):
        options[match.group(1)] = match.group(2)
        index += 1
    return options, lines[index:]


def render_directive(ctx: CellContext, name: str, argument: str, lines: list[str], whole: str) -> str:
    """The Markdown for one directive (its lines without the fences)."""
    ctx.count("directives", name)
    options, body_lines = _split_options(lines)
    body = "\n".join(body_lines)
    if name in ADMONITIONS:
        title = _convert_inline(ctx, argument.strip()) if argument.strip() else ADMONITIONS[name]
        return _blockquote(title, convert_markdown(ctx, body))
    if name in ("dropdown", "toggle"):
        title = _convert_inline(ctx, argument.strip()) or "Details"
        return f"<details>\n<summary>{title}</summary>\n\n{convert_markdown(ctx, body).strip()}\n\n</details>"
    if name == "math":
        label = options.get("label")
        text = body.strip()
        if label and label in ctx.equations:
            text += f" \\tag{{{ctx.equations[label]}}}"
        return f"$$\n{text}\n$$"
    if name in ("code-block", "code", "sourcecode"):
        return f"```{argument.strip()}\n{body}\n```"
    if name in ("glue", "glue:", "glue:any", "glue:figure", "glue:md", "glue:math"):
        key = argument.strip()
        bundle = _glue_bundle(ctx, key, whole.splitlines()[0])
        if bundle is None:
            ctx.missing_glue.append((ctx.cell, whole.splitlines()[0]))
            return whole
        if name == "glue:math":
            latex = _joined(bundle.get("text/latex", "")).strip().strip("$")
            if not latex:
                raise ctx.error(whole.splitlines()[0], f"the glued value of {key!r} has no text/latex")
            return f"$$\n{latex}\n$$"
        text = _mime_as_markdown(bundle, inline=False)
        if text is None:
            raise ctx.error(whole.splitlines()[0], f"the glued value of {key!r} has no displayable form")
        if name == "glue:figure":
            number = ctx.book.figures.get(options.get("name", ""), ("", ""))[1]
            caption = convert_markdown(ctx, body).strip()
            if caption:
                text += f"\n\n*{number + ': ' if number else ''}{caption}*"
        return text
    if name == "include":  # a generated Markdown file (book/_data/...), relative to the page
        path = (ctx.book.root / ctx.docname).parent / argument.strip()
        if not path.is_file():
            raise ctx.error(whole.splitlines()[0], f"the included file {path} does not exist")
        included = re.sub(r"<!--.*?-->\s*", "", path.read_text(), flags=re.S)  # "generated by" notes
        return convert_markdown(ctx, included).strip()
    if name in ("figure", "image"):
        raise ctx.error(whole.splitlines()[0], "a {figure}/{image} directive: its file is not in the notebook;"
                        " glue the figure from a code cell instead")
    raise ctx.error(whole.splitlines()[0], "unknown directive: the Colab edition cannot render it"
                    " (add it to .ci/colab_edition.py)")


def convert_markdown(ctx: CellContext, text: str) -> str:
    """A Markdown cell's MyST turned into CommonMark (see the module docstring)."""
    lines = text.split("\n")
    out: list[str] = []
    prose: list[str] = []

    def flush() -> None:
        if prose:
            out.append(_convert_inline(ctx, "\n".join(prose)))
            prose.clear()

    index = 0
    while index < len(lines):
        line = lines[index]
        fence = _FENCE_OPEN.match(line)
        if fence:
            marker = fence.group("fence")
            info = fence.group("info").strip()
            directive = re.match(r"^\{(?P<name>[^}]+)\}\s*(?P<argument>.*)$", info)
            # the closing fence: the same character, at least as long, nothing else
            close = re.compile(rf"^\s*{re.escape(marker[0])}{{{len(marker)},}}\s*$")
            end = next((j for j in range(index + 1, len(lines)) if close.match(lines[j])), None)
            if directive is None and marker[0] == ":":
                prose.append(line)
                index += 1
                continue
            flush()
            if end is None:
                if directive:
                    raise ctx.error(line.strip(), "a directive that is never closed")
                out.append("\n".join(lines[index:]))  # an unclosed code fence runs to the end
                break
            block = lines[index + 1 : end]
            if directive is None:  # a plain code fence: unchanged
                out.append("\n".join(lines[index : end + 1]))
            else:
                indent = fence.group("indent")
                body = [b[len(indent) :] if b.startswith(indent) else b for b in block]
                rendered = render_directive(
                    ctx, directive.group("name").strip(), directive.group("argument"), body,
                    "\n".join(lines[index : end + 1]),
                )
                out.append("\n".join(indent + r if r else r for r in rendered.split("\n")))
            index = end + 1
            continue
        if _TARGET.match(line) or re.match(r"^%(?!%)", line):
            flush()
            # drop the target / comment line; keep the paragraph structure
            index += 1
            continue
        prose.append(line)
        index += 1
    flush()
    result = "\n".join(out)
    return _EQUATION_LABEL.sub(lambda m: m.group(1), result)


# ------------------------------------------------------------------------------------------------
# a notebook


def _equation_numbers(notebook: dict) -> dict[str, int]:
    labels: dict[str, int] = {}
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "markdown":
            text = _cell_source(cell)
            for match in re.finditer(r"\$\$\s*\((?P<label>[^()\s]+)\)\s*$|^\s*:label:\s*(?P<opt>\S+)", text, re.M):
                labels.setdefault(match.group("label") or match.group("opt"), len(labels) + 1)
    return labels


def _as_source(text: str, like) -> list[str] | str:
    if isinstance(like, str):
        return text
    return text.splitlines(keepends=True)


def convert_notebook(
    book: Book,
    docname: str,
    build: Path | None,
    source: Source | None = None,
    missing_glue: str = "error",
) -> tuple[dict, dict]:
    """The Colab edition of one page and counts of what changed.

    Args:
        book: from :func:`load_book`.
        docname: the page, e.g. ``book/ch0_practice/01_what_is_a_deq``.
        build: the build folder holding ``jupyter_execute`` (None: the notebook as it is).
        source: the executed notebook, if already loaded (else :func:`load_source`).
        missing_glue: ``"error"`` raises :class:`MissingGlueError` listing every glue role the
            build has no value for; ``"keep"`` leaves those roles as they are (for tests of the
            rest of the conversion on notebooks that were not executed).

    Returns:
        (notebook, stats): the converted notebook (nbformat 4 JSON) and
        ``{"roles": {name: count}, "directives": {name: count}, "citations": n}``.

    Raises:
        ConversionError: on an unknown role or directive, a missing label, page or citation key,
            a value that cannot be formatted (the message names notebook, cell and role).
        MissingGlueError: if glue values are missing and ``missing_glue == "error"``.
    """
    if missing_glue not in ("error", "keep"):
        raise ValueError(f"missing_glue must be 'error' or 'keep', got {missing_glue!r}")
    source = source or load_source(book.root, docname, build)
    notebook = json.loads(json.dumps(source.notebook))
    equations = _equation_numbers(notebook)
    citations: list[str] = []
    missing: list[tuple[int, str]] = []
    stats: dict = {"roles": {}, "directives": {}, "citations": 0}
    sources = {docname: source}
    name = f"{docname}.ipynb"
    for index, cell in enumerate(notebook["cells"]):
        if cell.get("cell_type") != "markdown":
            continue
        text = _cell_source(cell)
        ctx = CellContext(book, name, docname, index, source.glue, equations, citations, missing, sources, build,
                          stats)
        converted = convert_markdown(ctx, text)
        # a role the patterns above could not take apart (``{cite:t}`` with nothing between its
        # backticks) is left as written: an error, not literal MyST in the edition
        unknown = [r for r in find_leftover_myst(converted) if not r.startswith("{glue") and r.endswith("`")]
        if unknown:
            raise MalformedInputError(f"{name}: cell {index}: {unknown[0]}: a role with no content; expected"
                                      f" {unknown[0]}content`")
        cell["source"] = _as_source(converted, cell.get("source", ""))
    if missing and missing_glue == "error":
        raise MissingGlueError(name, missing, source.origin)
    if citations:
        entries = "\n".join(f"- {book.bibliography[key]['text']}" for key in citations)
        notebook["cells"].append(
            {
                "cell_type": "markdown",
                "id": "colab-edition-references",
                "metadata": {},
                "source": _as_source(f"## References\n\n{entries}\n", []),
            }
        )
        stats["citations"] = len(citations)
    quiet_glue(notebook)
    notebook.setdefault("metadata", {})["deqlab_colab_edition"] = {
        "source": name,
        "site": book.url(docname),
        "executed": source.origin,
    }
    return notebook, stats


QUIET_GLUE_ID = "colab-edition-quiet-glue"
QUIET_GLUE_SOURCE = (
    "# Colab edition: the prose already shows every value the cells glue, so glue() need not print them\n"
    "# (deqlab.lab.experiments.glue echoes `name = value` unless DEQLAB_BOOK_BUILD is set).\n"
    "import os\n"
    "\n"
    'os.environ["DEQLAB_BOOK_BUILD"] = "1"\n'
)
_GLUE_CALL = re.compile(r"^\s*glue\(\s*(?:f?[\"'])", re.MULTILINE)
_GLUED_NAME = re.compile(r"\bglue\(\s*[\"']([^\"']+)[\"']")


def quiet_glue(notebook: dict) -> None:
    """Hide ``glue()``'s echo in the Colab edition (in place): before the first code cell that calls
    ``glue(``, a cell that sets ``DEQLAB_BOOK_BUILD`` (what switches the echo of
    :func:`deqlab.lab.experiments.glue` off, as in the book's own build), and the echo lines
    ``name = value`` of the names a cell glues dropped from its stored stdout."""
    cells = notebook["cells"]
    first = next((i for i, c in enumerate(cells) if c.get("cell_type") == "code"
                  and _GLUE_CALL.search(_cell_source(c))), None)
    if first is None:
        return
    for cell in cells:
        if cell.get("cell_type") != "code":
            continue
        names = set(_GLUED_NAME.findall(_cell_source(cell)))
        if not names:
            continue
        outputs = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stdout":
                lines = _joined(output.get("text", "")).splitlines(keepends=True)
                kept = [line for line in lines if line.split(" = ", 1)[0] not in names or " = " not in line]
                if not kept:
                    continue
                output = {**output, "text": kept if isinstance(output.get("text"), list) else "".join(kept)}
            outputs.append(output)
        cell["outputs"] = outputs
    quiet = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
             "source": _as_source(QUIET_GLUE_SOURCE, cells[first].get("source", ""))}
    if "id" in cells[first]:
        quiet = {"cell_type": "code", "execution_count": None, "id": QUIET_GLUE_ID, "metadata": {}, "outputs": [],
                 "source": quiet["source"]}
    cells.insert(first, quiet)


def overwrites_input(root: Path, build: Path, out: Path, pages: list[str]) -> str | None:
    """Why writing the edition into ``out`` would overwrite what it reads (the book's notebooks
    under ``root``, the executed ones under ``build/jupyter_execute``, ``_toc.yml``), or None."""
    root, build, out = root.resolve(), build.resolve(), out.resolve()
    book = root / "book"
    if out == book or book in out.parents:
        return "is the book folder or inside it" if out == book else "is inside the book folder"
    executed = build / "jupyter_execute"
    if out == executed or executed in out.parents:
        return "is myst-nb's executed notebooks folder (or inside it)"
    inputs = {root / f"{d}.ipynb" for d in pages} | {executed / f"{d}.ipynb" for d in pages}
    if any(out / f"{d}.ipynb" in inputs for d in pages):
        return "the edition's notebooks would replace the book's own (out is the book's root)"
    return None


def notebook_pages(book: Book) -> list[str]:
    """The pages of the table of contents that are notebooks."""
    return [e.docname for e in book.toc if (book.root / f"{e.docname}.ipynb").exists()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks (default: every notebook of _toc.yml)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the book's root (default: this repository)")
    parser.add_argument("--build", type=Path, default=None, help="the build folder (default: ROOT/_build)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: BUILD/colab)")
    parser.add_argument("--base-url", default=None, help="where the pages are published (default: html.baseurl + VERSION/)")
    parser.add_argument("--version", default=os.environ.get("DEQLAB_DOCS_VERSION", "dev"),
                        help="the site's version folder (default: $DEQLAB_DOCS_VERSION or dev)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    build = (args.build or root / "_build").resolve()
    out = (args.out or build / "colab").resolve()
    try:
        book = load_book(root, build, args.base_url, args.version)
    except (ConversionError, FileNotFoundError) as exc:
        print(f"colab edition: error: {exc}", file=sys.stderr)
        return 2
    pages = notebook_pages(book)
    if args.notebooks:
        wanted = []
        for path in args.notebooks:
            try:
                docname = path.resolve().relative_to(root).with_suffix("").as_posix()
            except ValueError:
                print(f"colab edition: error: {path}: not under the book's root {root}; expected a notebook of"
                      " its _toc.yml", file=sys.stderr)
                return 2
            if docname not in pages:
                print(f"colab edition: error: {path}: not a notebook of _toc.yml", file=sys.stderr)
                return 2
            wanted.append(docname)
        pages = wanted
    if (clash := overwrites_input(root, build, out, pages)) is not None:
        print(f"colab edition: error: --out {args.out or out}: {clash}; choose a folder outside the book"
              " (default: _build/colab)", file=sys.stderr)
        return 2
    if not (build / "jupyter_execute").is_dir():
        print(f"colab edition: no executed build in {build / 'jupyter_execute'}: using the notebooks"
              " under book/ (they must carry outputs: make test)", file=sys.stderr)
    failures, total_roles, total_directives, malformed = [], 0, 0, False
    for docname in pages:
        try:
            notebook, stats = convert_notebook(book, docname, build)
        except ConversionError as exc:
            failures.append(str(exc))
            malformed |= isinstance(exc, MalformedInputError)
            continue
        target = out / f"{docname}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        roles, directives = sum(stats["roles"].values()), sum(stats["directives"].values())
        total_roles += roles
        total_directives += directives
        print(f"[colab] {target.relative_to(out)}: {roles} roles, {directives} directives,"
              f" {stats['citations']} references")
    if failures:
        print("\n".join(f"colab edition: error: {f}" for f in failures), file=sys.stderr)
        print(f"colab edition: {len(failures)} of {len(pages)} notebooks failed", file=sys.stderr)
        return 2 if malformed else 1
    print(f"[colab] {len(pages)} notebooks into {out}: {total_roles} roles, {total_directives} directives replaced")
    return 0


if __name__ == "__main__":
    sys.exit(main())
