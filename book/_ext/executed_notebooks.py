"""Sphinx extension: never execute a notebook twice in one `make test` + `make book` run.

myst-nb's ``execute_notebooks: auto`` executes a notebook unless *every* code cell has at least
one output. A code cell that prints nothing (the guarded Colab install cell, ``import jax``) has
no output even after it ran, so plain ``auto`` would execute every notebook again after
``make test`` had executed them with ``nbmake --overwrite``.

This extension refines ``auto``: a notebook whose every non-empty code cell carries an execution
count (as written by ``nbmake --overwrite``, or by running all cells in Jupyter and saving) is
rendered from its stored outputs, through myst-nb's per-notebook setting
``metadata.mystnb.execution_mode = "off"``, injected into the source as Sphinx reads it (the file
on disk is not touched). Notebooks as committed have no execution counts
(``tests/test_notebooks_clean.py``), so a build of a fresh clone executes every notebook once.
Cells tagged ``skip-execution`` are ignored. Other execution modes (``force``, ``cache``, ``off``)
are left alone.
"""

from __future__ import annotations

import json

from sphinx.util import logging

logger = logging.getLogger(__name__)


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def is_executed(nb: dict) -> bool:
    """True when every non-empty, non-skipped code cell of ``nb`` has an execution count."""
    cells = [
        c
        for c in nb.get("cells", [])
        if c.get("cell_type") == "code"
        and _source(c).strip()
        and "skip-execution" not in c.get("metadata", {}).get("tags", [])
    ]
    return bool(cells) and all(c.get("execution_count") is not None for c in cells)


def _on_source_read(app, docname: str, source: list[str]) -> None:
    if getattr(app.config, "nb_execution_mode", None) != "auto":
        return
    if not str(app.env.doc2path(docname)).endswith(".ipynb"):
        return
    try:
        nb = json.loads(source[0])
    except ValueError:
        return  # not JSON: leave it to myst-nb to report
    if not is_executed(nb):
        return
    meta = nb.setdefault("metadata", {}).setdefault("mystnb", {})
    if "execution_mode" in meta:
        return  # the notebook chose its own mode
    meta["execution_mode"] = "off"
    source[0] = json.dumps(nb)
    logger.info("%s: already executed, rendering stored outputs", docname)


def setup(app):
    app.connect("source-read", _on_source_read)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
