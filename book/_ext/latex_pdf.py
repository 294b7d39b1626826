"""Sphinx extension: what the PDF of the book (``make pdf``, Sphinx's LaTeX builder) needs.

- **The book's TeX macros in LaTeX too.** The pages use the macros that ``_config.yml`` defines
  for MathJax (``mathjax3_config.tex.macros``: ``\\R``, ``\\E``, ``\\tr``, ...). LaTeX does not read
  that setting, so on ``config-inited`` each macro is appended to ``latex_elements["preamble"]``
  as ``\\providecommand`` + ``\\renewcommand`` (a macro LaTeX already has, such as ``\\tr`` in some
  packages, takes the book's meaning, as on the site). One source, so the two cannot drift:
  :func:`latex_macros` is what tests/book/test_pdf.py checks.
- **A static fallback for the interactive explorers.** An explorer
  (:mod:`deqlab.lab.experiments.explorer`) is an HTML output: precomputed PNG frames behind a
  JavaScript slider. LaTeX cannot run it, and myst-nb would fall back to its plain-text summary.
  For the LaTeX builder, the first, middle and last frames are taken out of the HTML and shown
  side by side with that summary (which names every value and says where to use the slider).
- **Inline code that can break.** LaTeX never breaks inside ``\\sphinxcode`` (typewriter, no
  hyphenation), so a long name (``test_critical_variance_puts_the_sampled_spectral_radius_at_one``,
  ``deqlab.solve(..., solver=deqlab.Picard(damping=beta))``) ran into the margin or widened a table
  column off the page. A break is allowed after ``.``, ``_``, ``(``, ``,``, ``=`` and ``/``.
- **Long tables across pages.** A table with many rows of prose (the errata, the verification
  tables) cannot fit in Sphinx's ``tabulary``, which never breaks across pages: the page cut it off.
  Such tables become ``longtable`` with column widths in proportion to the square root of the mean
  length of each column's cells (a column of numbers stays narrow, a column of prose gets room).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.transforms.post_transforms import SphinxPostTransform

EXPLORER_CLASS = "deqlab-explorer"
"""Class of the ``<div>`` wrapping an explorer (``deqlab.lab.experiments.explorer.CSS_CLASS``)."""

# Matplotlib's HTMLWriter embeds frame i as  frames[i] = "data:image/png;base64,<data>"  with the
# base64 text broken into lines ended by a backslash (a JavaScript line continuation).
_FRAME = re.compile(r'frames\[(\d+)\]\s*=\s*"data:image/png;base64,(.*?)"', re.DOTALL)

_MACRO_NAME = re.compile(r"^[A-Za-z]+$")


def latex_macros(macros: dict[str, Any]) -> str:
    """LaTeX definitions of MathJax 3 ``tex.macros`` (``name: body`` or ``name: [body, nargs]``).

    Args:
        macros: The ``mathjax3_config["tex"]["macros"]`` mapping of the book's configuration.

    Returns:
        One ``\\providecommand{\\name}{}\\renewcommand{\\name}[nargs]{body}`` line per macro.

    Raises:
        ValueError: If a name is not a TeX control word (letters only) or a value is neither a
            string nor a ``[body, nargs]`` pair with a non-negative integer ``nargs`` up to 9.

    Example:
        >>> latex_macros({"R": "\\\\mathbb{R}"})
        '\\\\providecommand{\\\\R}{}\\\\renewcommand{\\\\R}{\\\\mathbb{R}}'
    """
    lines = []
    for name, value in macros.items():
        if not isinstance(name, str) or not _MACRO_NAME.match(name):
            raise ValueError(f"MathJax macro name must be letters only, got {name!r}")
        if isinstance(value, str):
            body, nargs = value, 0
        elif (isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[0], str)
              and isinstance(value[1], int) and 0 <= value[1] <= 9):
            body, nargs = value
        else:
            raise ValueError(f"MathJax macro {name!r} must be a string or [body, nargs 0..9], got {value!r}")
        args = f"[{nargs}]" if nargs else ""
        lines.append(f"\\providecommand{{\\{name}}}{{}}\\renewcommand{{\\{name}}}{args}{{{body}}}")
    return "\n".join(lines)


def _add_macros(app: Sphinx, config: Config) -> None:
    macros = (getattr(config, "mathjax3_config", None) or {}).get("tex", {}).get("macros", {})
    elements = dict(config.latex_elements or {})
    preamble = elements.get("preamble", "")
    elements["preamble"] = preamble + "\n% MathJax macros of _config.yml (book/_ext/latex_pdf.py)\n" + latex_macros(macros) + "\n"
    config.latex_elements = elements


def explorer_frames(html: str) -> list[bytes]:
    """The PNG frames embedded in an explorer's HTML, in frame order (empty if none)."""
    frames = {}
    for index, data in _FRAME.findall(html):
        frames[int(index)] = base64.b64decode(re.sub(r"\\\s*", "", data))
    return [frames[i] for i in sorted(frames)]


def _text_with_math(text: str) -> list[nodes.Node]:
    """``text`` as text nodes and inline maths (its ``$...$`` spans, e.g. a label ``$\\sqrt V$``)."""
    parts = text.split("$")
    if len(parts) % 2 == 0:  # an unpaired $: keep it all as text
        return [nodes.Text(text)]
    return [nodes.math(part, part) if i % 2 else nodes.Text(part) for i, part in enumerate(parts) if part]


class ExplorerFallback(SphinxPostTransform):
    """For LaTeX: replaces an explorer's HTML output by three of its frames and its summary.

    Runs before myst-nb's ``SelectMimeType`` (priority 4), which then picks the added
    ``image/png`` entry of the output's mime bundle (the LaTeX builder prefers PNG to text).
    """

    default_priority = 3
    builders = ("latex",)

    def run(self, **kwargs: Any) -> None:
        outdir = Path(self.app.outdir).parent / "jupyter_execute" / "explorer_frames"
        srcdir = Path(self.app.srcdir)
        for bundle in list(self.document.findall(nodes.container)):
            if bundle.get("nb_element") != "mime_bundle":
                continue
            by_type = {child.get("mime_type"): child for child in bundle.children}
            html = by_type.get("text/html")
            if html is None or EXPLORER_CLASS not in html.astext():
                continue
            frames = explorer_frames(html.astext())
            if not frames:
                continue
            shown = sorted({0, len(frames) // 2, len(frames) - 1})
            container = nodes.container(mime_type="image/png", nb_element="mime_png")
            para = nodes.paragraph()
            for i in shown:
                digest = hashlib.sha256(frames[i]).hexdigest()[:16]
                path = outdir / f"{digest}.png"
                if not path.exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(frames[i])
                uri = os.path.relpath(path, srcdir).replace(os.sep, "/")
                self.env.images.add_file(self.env.docname or "", uri)
                width = f"{0.98 / len(shown):.3f}\\linewidth"
                para += nodes.image(uri=uri, candidates={"image/png": uri}, width=width)
            container += para
            plain = by_type.get("text/plain")
            summary = plain.astext().strip("'\" \n") if plain is not None else "Interactive explorer."
            text = f"Frames {', '.join(str(i + 1) for i in shown)} of {len(frames)}. {summary}"
            container += nodes.paragraph("", "", *_text_with_math(text))
            bundle += container


_BREAK_AFTER = re.compile(r"([._(,=/])(?=[^\s._(,=/)\]])")
_LONG_WORD = re.compile(r"\S{25,}")


def _with_breaks(text: str) -> list[nodes.Node]:
    """``text`` as nodes with a LaTeX ``\\allowbreak`` after each of ``. _ ( , = /`` (not at the end)."""
    pieces = _BREAK_AFTER.split(text)
    out: list[nodes.Node] = []
    for i, piece in enumerate(pieces):
        if piece:
            out.append(nodes.Text(piece))
        if i % 2 == 1:  # a separator: a line may break after it
            out.append(nodes.raw("", "\\allowbreak{}", format="latex"))
    return out


class BreakableInlineCode(SphinxPostTransform):
    """For LaTeX: lines may break inside inline code and long dotted names (``\\allowbreak``).

    Inside inline code (``literal`` and its emphasis/strong forms) a break is allowed after every
    ``. _ ( , = /``; elsewhere only inside "words" of 25 characters or more, such as the qualified
    type names of the API reference (``deqlab.lab.experiments.nonlinear.statistics.Equilibrium...``).
    Titles, signatures, maths and code blocks are left alone.
    """

    default_priority = 400
    builders = ("latex",)
    _code = (nodes.literal, addnodes.literal_emphasis, addnodes.literal_strong)
    _skip = (nodes.title, nodes.raw, nodes.math, nodes.FixedTextElement, addnodes.desc_signature)

    def run(self, **kwargs: Any) -> None:
        skip = self._skip
        for text in list(self.document.findall(nodes.Text)):
            parent, in_code, skipped = text.parent, False, False
            node = parent
            while node is not None:
                if isinstance(node, skip) or node.get("language"):
                    skipped = True  # highlighted inline code is rendered from its text
                    break
                in_code = in_code or isinstance(node, self._code)
                node = node.parent
            if skipped or parent is None:
                continue
            value = text.astext()
            if in_code:
                new = _with_breaks(value)
            else:
                new = []
                last = 0
                for m in _LONG_WORD.finditer(value):
                    if m.start() > last:
                        new.append(nodes.Text(value[last:m.start()]))
                    new.extend(_with_breaks(m.group()))
                    last = m.end()
                if last < len(value):
                    new.append(nodes.Text(value[last:]))
            if not any(isinstance(n, nodes.raw) for n in new):
                continue
            parent.replace(text, new)


LONG_TABLE_ROWS = 8
"""Tables with at least this many body rows and ..."""
LONG_TABLE_CHARS = 1500
"""... this many characters of text are set as ``longtable`` (see the module docstring)."""


def column_widths(rows: list[list[str]]) -> list[int]:
    """Relative column widths (integers summing to about 100) from the cell texts of a table.

    Each column gets the square root of the mean length of its cells, at least 3 (room for a
    two-digit number beside the column padding), so that short columns (numbers, symbols) stay
    narrow and prose gets the room.
    """
    ncols = max(len(r) for r in rows)
    weights = []
    for j in range(ncols):
        cells = [len(r[j]) for r in rows if j < len(r)]
        weights.append(max(3.0, (sum(cells) / len(cells)) ** 0.5))
    total = sum(weights)
    return [max(1, round(100 * w / total)) for w in weights]


class LongTables(SphinxPostTransform):
    """For LaTeX: long tables of prose become ``longtable`` with widths from their content."""

    default_priority = 400
    builders = ("latex",)

    def run(self, **kwargs: Any) -> None:
        for table in list(self.document.findall(nodes.table)):
            groups = [g for g in table.children if isinstance(g, nodes.tgroup)]
            if len(groups) != 1:
                continue
            group = groups[0]
            body = [b for b in group.children if isinstance(b, nodes.tbody)]
            rows = [[entry.astext() for entry in row.children] for part in group.children
                    if isinstance(part, (nodes.thead, nodes.tbody)) for row in part.children]
            n_body = sum(len(b.children) for b in body)
            if n_body < LONG_TABLE_ROWS or sum(map(len, sum(rows, []))) < LONG_TABLE_CHARS:
                continue
            if any(entry.get("morecols") or entry.get("morerows") for entry in group.findall(nodes.entry)):
                continue  # merged cells: leave them to Sphinx
            specs = [c for c in group.children if isinstance(c, nodes.colspec)]
            widths = column_widths(rows)
            if len(specs) != len(widths):
                continue
            for spec, width in zip(specs, widths):
                spec["colwidth"] = width
            table["classes"] = [c for c in table["classes"] if c != "colwidths-auto"] + ["longtable", "colwidths-given"]


_SUMMARY = re.compile(r"<summary>(.*?)</summary>", re.S)


class SolutionLabels(SphinxPostTransform):
    """For LaTeX: a hidden solution's ``<details><summary>Solution</summary>`` becomes a bold
    "Solution." paragraph (the LaTeX writer drops raw HTML, which would print the answer straight
    after its exercise, unmarked); the closing ``</details>`` is dropped as before."""

    default_priority = 200
    builders = ("latex",)

    def run(self, **kwargs: Any) -> None:
        for raw in list(self.document.findall(nodes.raw)):
            if "html" not in raw.get("format", "").split():
                continue
            found = _SUMMARY.search(raw.astext())
            if found is None:
                continue
            label = re.sub(r"<[^>]+>", "", found.group(1)).strip() or "Solution"
            raw.replace_self(nodes.paragraph("", "", nodes.strong(text=label.rstrip(".") + ".")))


class UnfoldDropdowns(SphinxPostTransform):
    """For LaTeX: a ``dropdown`` admonition (a collapsed block on the site: verification, what a
    full run needs) is printed as its title in bold followed by its content, not as a box. A box
    cannot break inside a table, so a long table in one ran into the page's footer."""

    default_priority = 200
    builders = ("latex",)

    def run(self, **kwargs: Any) -> None:
        for box in list(self.document.findall(nodes.admonition)):
            if "dropdown" not in box.get("classes", []):
                continue
            titles = [child for child in box.children if isinstance(child, nodes.title)]
            body = [child for child in box.children if not isinstance(child, nodes.title)]
            heading = nodes.paragraph("", "", nodes.strong("", "", *titles[0].children)) if titles else None
            box.replace_self(([heading] if heading is not None else []) + body)


class AppendixPart(SphinxPostTransform):
    """For LaTeX: the chapters of the part named by ``deqlab_latex_appendix_part`` (the
    table of contents' unnumbered "Reference" part: notation, errata, API, ...) are appendices,
    lettered A, B, ... as a printed book's back matter, not chapters 6-12 after the five theory
    and experiment chapters. Runs after sphinx-jupyterbook-latex made the parts (priority 700)."""

    default_priority = 800
    builders = ("latex",)

    def run(self, **kwargs: Any) -> None:
        caption = self.app.config.deqlab_latex_appendix_part
        if not caption:
            return
        for part in self.document.findall(addnodes.start_of_file):
            if part.get("docname") != caption or not part.children:
                continue
            section = part.children[0]
            index = next((i for i, child in enumerate(section.children) if isinstance(child, nodes.title)), -1)
            section.insert(index + 1, nodes.raw("", "\\appendix\n", format="latex"))
            return


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("config-inited", _add_macros)
    app.add_post_transform(ExplorerFallback)
    app.add_post_transform(BreakableInlineCode)
    app.add_post_transform(LongTables)
    app.add_post_transform(SolutionLabels)
    app.add_post_transform(UnfoldDropdowns)
    app.add_config_value("deqlab_latex_appendix_part", "", "env", [str])
    app.add_post_transform(AppendixPart)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
