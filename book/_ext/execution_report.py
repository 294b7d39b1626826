"""Sphinx extension: the execution report, generated from the last ``make test``.

``make test`` runs every notebook with nbmake and writes two files under ``_build/reports/``:

- ``tests.xml``: pytest's JUnit XML (``--junitxml``), one ``<testcase>`` per notebook (its
  ``time`` in seconds, a ``<failure>`` / ``<error>`` / ``<skipped>`` child when it did not pass);
- ``run.json``: what the XML does not say: the experiment scale (``DEQLAB_SCALE``), the start
  time, the number of pytest workers, the deqlab version and the number of programs in JAX's
  persistent compilation cache at the start (:func:`cache_sentence`).

The directive ``{execution-report}`` (used by ``book/execution.md``) renders them as a table: each
notebook of the table of contents with its status, its time and the scale, then the total. With
no report (a ``make book`` with no ``make test`` before it, as on a fresh clone) the directive says
so in the page and names the command; it never invents numbers. Run standalone, the module prints
the table: ``python book/_ext/execution_report.py _build/reports``.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPORTS = Path("_build") / "reports"
"""Folder of the report files, relative to the repository root."""


@dataclass(frozen=True)
class NotebookRun:
    """One notebook of a ``make test`` run."""

    path: str  # e.g. "book/ch0_practice/01_what_is_a_deq.ipynb"
    status: str  # "passed", "failed", "error" or "skipped"
    seconds: float


def notebook_runs(junit: Path) -> list[NotebookRun]:
    """The notebooks of a pytest JUnit XML file, in the order they appear.

    Raises:
        ValueError: the file is not JUnit XML, or a notebook's test case has no numeric ``time``.
    """
    try:
        root = ET.parse(junit).getroot()
    except ET.ParseError as error:
        raise ValueError(f"{junit}: not a JUnit XML file ({error})") from error
    runs = []
    for case in root.iter("testcase"):
        # nbmake's test case: name="01_x.ipynb", classname="book.ch0_practice.01_x.ipynb" (the
        # folders joined by dots, then the file name); older pytest also writes file="book/...".
        path = case.get("file") or ""
        if not path.endswith(".ipynb"):
            name, classname = case.get("name", ""), case.get("classname", "")
            if not name.endswith(".ipynb") or not classname.endswith("." + name):
                continue
            folders = classname.removesuffix("." + name)
            path = folders.replace(".", "/") + "/" + name
        try:
            seconds = float(case.get("time", ""))
        except ValueError as error:
            raise ValueError(f"{junit}: test case of {path} has no numeric time") from error
        status = "passed"
        for child, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            if case.find(child) is not None:
                status = name
                break
        runs.append(NotebookRun(path, status, seconds))
    return runs


def read_report(folder: Path) -> tuple[list[NotebookRun], dict] | None:
    """``(runs, run_info)`` from ``folder/tests.xml`` and ``folder/run.json``; None if absent."""
    junit, info = folder / "tests.xml", folder / "run.json"
    if not junit.is_file():
        return None
    run_info = json.loads(info.read_text()) if info.is_file() else {}
    return notebook_runs(junit), run_info


def cache_sentence(info: dict) -> str:
    """What JAX's persistent compilation cache held when the run started (``run.json``'s
    ``compilation_cache_entries``), and what that means for the times."""
    entries = info.get("compilation_cache_entries")
    if entries is None:
        return "The state of JAX's persistent compilation cache at the start was not recorded."
    if entries == 0:
        return "JAX's persistent compilation cache was empty at the start: every page compiled its programs."
    return (f"JAX's persistent compilation cache held {entries:,} programs at the start: a page whose programs "
            "an earlier run had compiled loaded them instead, so its time, and the times glued into it, "
            "leave those compilations out (a fresh Colab runtime compiles them).")


def format_seconds(seconds: float) -> str:
    """``75.2`` -> ``"1 min 15 s"``; under a minute, ``"42.0 s"``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


def setup(app):  # pragma: no cover - exercised by the book build
    from docutils import nodes
    from docutils.parsers.rst import Directive
    from sphinx import addnodes

    class ExecutionReport(Directive):
        has_content = False

        def run(self):
            env = self.state.document.settings.env
            root = Path(env.srcdir)
            found = read_report(root / REPORTS)
            env.note_dependency(str(root / REPORTS / "tests.xml"))
            if found is None:
                note = nodes.note()
                note += nodes.paragraph("", "", *_with_code(
                    "No test run is recorded in this build: the report is written by `make test` "
                    "(into `_build/reports/`), and this site was built without it. Run `make test` "
                    "and then `make book`.", nodes))
                return [note]
            runs, info = found
            by_path = {run.path: run for run in runs}
            order = [doc + ".ipynb" for doc in env.found_docs if (root / (doc + ".ipynb")).is_file()]
            ordered = [p for p in sorted(order, key=_toc_position(env)) if p in by_path]
            scale = info.get("scale", "unknown")
            table = nodes.table(classes=["deqlab-table", "execution-report"])
            group = nodes.tgroup(cols=4)
            table += group
            for width in (50, 12, 14, 10):
                group += nodes.colspec(colwidth=width)
            head = nodes.thead()
            group += head
            head += _row(["Page", "Status", "Time", "Scale"], nodes)
            body = nodes.tbody()
            group += body
            for path in ordered:
                run = by_path[path]
                doc = path.removesuffix(".ipynb")
                title = env.titles[doc].astext() if doc in env.titles else doc
                link = addnodes.pending_xref("", refdomain="std", reftype="doc", reftarget="/" + doc,
                                             refexplicit=True, refdoc=env.docname)
                link += nodes.inline(text=title)
                body += _row([link, run.status, format_seconds(run.seconds), scale], nodes)
            total = sum(by_path[p].seconds for p in ordered)
            passed = sum(by_path[p].status == "passed" for p in ordered)
            body += _row([nodes.strong(text=f"{len(ordered)} notebooks"), f"{passed} passed",
                          format_seconds(total), scale], nodes)
            started = info.get("started", "an unrecorded time")
            workers = info.get("workers", "?")
            version = info.get("deqlab", "?")
            summary = nodes.paragraph("", "", *_with_code(
                f"From the `make test` run started {started} (deqlab {version}, scale {scale}, "
                f"{workers} pytest workers; times are each notebook's own wall time, run "
                f"{workers} at a time beside the unit tests). {cache_sentence(info)}", nodes))
            return [summary, table]

    app.add_directive("execution-report", ExecutionReport)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}


def _with_code(text: str, nodes) -> list:
    """Docutils nodes for ``text`` whose `backticked` spans are inline code (a directive's
    paragraph is not parsed as Markdown, so the backticks would otherwise reach the page)."""
    parts = text.split("`")
    if len(parts) % 2 == 0:
        raise ValueError(f"unbalanced backticks in {text!r}")
    return [nodes.literal(text=part) if odd else nodes.Text(part)
            for odd, part in ((i % 2 == 1, p) for i, p in enumerate(parts)) if part]


def _toc_position(env):
    """Sort key: a document's position in the table of contents (unknown ones last, by name)."""
    order: dict[str, int] = {}
    toctree = getattr(env, "toctree_includes", {})
    queue = [env.config.root_doc]
    while queue:
        doc = queue.pop(0)
        if doc in order:
            continue
        order[doc] = len(order)
        queue = list(toctree.get(doc, [])) + queue
    return lambda path: (order.get(path.removesuffix(".ipynb"), len(order)), path)


def _row(cells, nodes):
    """A table row; a string becomes a paragraph, an inline node is wrapped in one."""
    row = nodes.row()
    for cell in cells:
        entry = nodes.entry()
        paragraph = nodes.paragraph()
        if isinstance(cell, str):
            paragraph += nodes.Text(cell)
        else:
            paragraph += cell
        entry += paragraph
        row += entry
    return row


if __name__ == "__main__":
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else REPORTS
    found = read_report(folder)
    if found is None:
        print(f"no report in {folder} (run make test)")
        sys.exit(1)
    runs, info = found
    for run in runs:
        print(f"{run.path:60s} {run.status:8s} {format_seconds(run.seconds):>12s}")
    print(f"{len(runs)} notebooks, {format_seconds(sum(r.seconds for r in runs))}, scale {info.get('scale', '?')}")
