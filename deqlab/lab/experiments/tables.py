"""Tables for the book's notebooks: one object that renders on the site and in plain Jupyter.

A notebook cell that ends with ``table(...)`` shows a real HTML ``<table>`` on the built site and
in JupyterLab / Colab (``_repr_html_``), and a valid Markdown pipe table wherever only Markdown is
rendered (``_repr_markdown_``)::

    from deqlab.lab.experiments import table

    table([("relu", 0.5, 1e-3), ("erf", 0.25, 2e-4)],
          columns=["$\\phi$", "$\\chi$", "error"],
          formats=[None, ".3f", ".1e"],
          caption="Slopes and errors.")

Cells may hold ``$...$`` mathematics. In the HTML form the table carries the class
``mathjax_process`` (one of the classes that MyST tells MathJax to typeset,
``myst_mathjax_classes``) and inline ``$...$`` is rewritten as ``\\(...\\)``, the only inline
delimiter that MathJax 3 reads by default; everything else is HTML-escaped.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["Table", "table"]

Format = str | Callable[[Any], str] | None

_MATH = re.compile(r"(?<!\\)\$(.+?)(?<!\\)\$")


def _format_cell(value: Any, fmt: Format) -> str:
    if fmt is None:
        return str(value)
    if callable(fmt):
        return str(fmt(value))
    if isinstance(value, str):
        return value  # text cells (labels, blanks) are never number-formatted
    return format(value, fmt)


def _html_cell(text: str) -> str:
    """HTML-escape ``text``, turning ``$...$`` into MathJax's ``\\(...\\)``."""
    out, last = [], 0
    for m in _MATH.finditer(text):
        out.append(html.escape(text[last : m.start()]))
        out.append(r"\(" + html.escape(m.group(1)) + r"\)")
        last = m.end()
    out.append(html.escape(text[last:]))
    return "".join(out)


def _md_cell(text: str) -> str:
    # A pipe table unescapes ``\|`` before the maths is parsed, so TeX's norm bars ``\|`` become
    # ``\Vert`` first; every remaining ``|`` is escaped so that it does not split the cell.
    return text.replace("\n", " ").replace("\\|", "\\Vert ").replace("|", r"\|")


class Table:
    """A formatted table (see :func:`table`); displayed through its ``_repr_*_`` methods.

    Attributes:
        columns: Column headers (text, may hold ``$...$``).
        cells: The formatted cells, one tuple of strings per row.
        caption: Optional caption shown above the table.
    """

    def __init__(self, columns: Sequence[str], cells: Sequence[Sequence[str]], caption: str | None):
        self.columns = tuple(str(c) for c in columns)
        self.cells = tuple(tuple(row) for row in cells)
        self.caption = caption

    def _repr_html_(self) -> str:
        parts = ['<table class="mathjax_process deqlab-table">']
        if self.caption:
            parts.append(f"<caption>{_html_cell(self.caption)}</caption>")
        parts.append("<thead><tr>" + "".join(f"<th>{_html_cell(c)}</th>" for c in self.columns) + "</tr></thead>")
        parts.append("<tbody>")
        for row in self.cells:
            parts.append("<tr>" + "".join(f"<td>{_html_cell(c)}</td>" for c in row) + "</tr>")
        parts.append("</tbody></table>")
        return "\n".join(parts)

    def _repr_markdown_(self) -> str:
        lines = []
        if self.caption:
            lines += [_md_cell(self.caption), ""]
        lines.append("| " + " | ".join(_md_cell(c) for c in self.columns) + " |")
        lines.append("|" + "---|" * len(self.columns))
        lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in self.cells]
        return "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        return self._repr_markdown_()


def table(
    rows: Sequence[Sequence[Any]],
    columns: Sequence[str],
    formats: Sequence[Format] | Mapping[str, Format] | Format = None,
    caption: str | None = None,
) -> Table:
    """Build a table that renders as HTML on the site and as a Markdown pipe table elsewhere.

    Args:
        rows: The rows; each holds one value per column.
        columns: The column headers (may hold ``$...$`` mathematics).
        formats: How to format the values: ``None`` (``str``), one format spec for every column
            (``".3f"``), one spec or callable per column (a sequence as long as ``columns``, with
            ``None`` for ``str``), or a mapping from column header to spec. String values are
            shown as they are whatever the format.
        caption: Optional caption (may hold ``$...$``).

    Returns:
        A :class:`Table`; make it the last expression of a cell to display it.

    Raises:
        ValueError: If a row, or a sequence of formats, does not have one entry per column, or a
            mapping of formats names a column that does not exist.
    """
    columns = [str(c) for c in columns]
    n = len(columns)
    if n == 0:
        raise ValueError("columns: a table needs at least one column")
    if formats is None or isinstance(formats, str) or callable(formats):
        fmts: list[Format] = [formats] * n
    elif isinstance(formats, Mapping):
        unknown = set(formats) - set(columns)
        if unknown:
            raise ValueError(f"formats: no column named {sorted(unknown)!r}; columns are {columns!r}")
        fmts = [formats.get(c) for c in columns]
    else:
        fmts = list(formats)
        if len(fmts) != n:
            raise ValueError(f"formats: {len(fmts)} formats given for {n} columns")
    cells = []
    for i, row in enumerate(rows):
        row = list(row)
        if len(row) != n:
            raise ValueError(f"rows[{i}]: {len(row)} values for {n} columns")
        cells.append(tuple(_format_cell(v, f) for v, f in zip(row, fmts)))
    return Table(columns, cells, caption)
