"""Sphinx extension: render stored notebook outputs only when they are known to be current.

myst-nb's ``execute_notebooks: auto`` executes a notebook unless *every* code cell has at least
one output. Two things go wrong with plain ``auto``:

- a code cell that prints nothing (the guarded Colab install cell, ``import jax``) has no output
  even after it ran, so every notebook that ``make test`` executed (``nbmake --overwrite``) would
  be executed a second time by ``make book``;
- a notebook that *does* carry outputs is rendered from them even when its code, or ``deqlab``,
  changed after they were made: a local ``make book`` after an edit would show stale numbers.

So outputs are trusted only with a provenance stamp. After ``make test`` executed the notebooks,
``python book/_ext/executed_notebooks.py stamp <notebooks>`` records, for each notebook whose
every code cell ran without error, a fingerprint of what made its outputs: the source of its code
cells, every ``deqlab/**/*.py`` file, the stored tables the pages' code reads (:data:`DATA_READ`) and
the experiment scale (``DEQLAB_SCALE``). At build time a
notebook is

- rendered from its stored outputs (``metadata.mystnb.execution_mode = "off"``, injected as
  Sphinx reads the source; the file on disk is not touched) when it is fully executed and its
  fingerprint equals the stamp;
- executed again (``"force"``) when it carries outputs but no matching stamp (edited since, a
  different ``deqlab``, a different scale, or saved from Jupyter by hand);
- left to ``auto`` otherwise (notebooks as committed have no outputs, so a build of a fresh clone
  executes every notebook exactly once).

Why not myst-nb's own ``execute_notebooks: cache`` (issue 39 item 7 asked): it does a different
job. Its store, jupyter-cache (1.0.1 with myst-nb 1.4.0), keys a notebook by its code cells and
metadata alone (``create_hashable_nb``), so an edit of ``deqlab`` or another ``DEQLAB_SCALE`` would
render stale outputs; and it executes into its own database, so it cannot take the outputs that
``make test`` (nbmake) has just produced: ``make book`` would execute all 31 notebooks a second
time (1,249 worker-seconds in the last cold ``make test``, about 10 minutes of CI on two cores).

Cells tagged ``skip-execution`` are ignored. A notebook that chose its own execution mode, or a
build with another mode than ``auto``, is left alone. The extension also sets
``DEQLAB_BOOK_BUILD=1`` (see :func:`deqlab.lab.experiments.config.glue`) for the kernels it starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAMPS = Path("_build") / ".executed-notebooks.json"
"""Stamp file, relative to the repository root (``make clean`` removes it with ``_build``)."""


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _code_cells(nb: dict) -> list[dict]:
    return [
        c
        for c in nb.get("cells", [])
        if c.get("cell_type") == "code"
        and _source(c).strip()
        and "skip-execution" not in c.get("metadata", {}).get("tags", [])
    ]


def is_executed(nb: dict) -> bool:
    """True when every non-empty, non-skipped code cell of ``nb`` has an execution count."""
    cells = _code_cells(nb)
    return bool(cells) and all(c.get("execution_count") is not None for c in cells)


def has_outputs(nb: dict) -> bool:
    """True when some code cell of ``nb`` carries an execution count or an output."""
    return any(c.get("execution_count") is not None or c.get("outputs") for c in _code_cells(nb))


def ran_without_error(nb: dict) -> bool:
    """True when ``nb`` is fully executed and no cell stored an error output."""
    return is_executed(nb) and not any(
        o.get("output_type") == "error" for c in _code_cells(nb) for o in c.get("outputs", [])
    )


def _scale() -> str:
    return os.environ.get("DEQLAB_SCALE", "").strip().lower() or "quick"


#: Stored tables that pages' code reads when it runs (not only includes): the dry-run table (chapter
#: 5 page 6 glues its numbers) and the power analysis (``deqlab.lab.experiments.medium``). A new
#: table of either changes what those pages print, so it forces their execution like a code edit.
DATA_READ = ("book/_data/dry_runs.json", "book/_data/power_analysis.json")


def fingerprint(nb: dict, root: Path = ROOT) -> str:
    """SHA-256 of what a notebook's outputs depend on: its code, ``deqlab``'s sources, the stored
    tables of :data:`DATA_READ` (absent ones count as absent), the scale."""
    digest = hashlib.sha256()
    digest.update(f"scale={_scale()}\0".encode())
    for cell in _code_cells(nb):
        digest.update(_source(cell).encode())
        digest.update(b"\0cell\0")
    for path in sorted((root / "deqlab").rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    for name in DATA_READ:
        path = root / name
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"<absent>") + b"\0")
    return digest.hexdigest()


def read_stamps(root: Path = ROOT) -> dict[str, str]:
    try:
        return json.loads((root / STAMPS).read_text())
    except (OSError, ValueError):
        return {}


def stamp(paths: list[Path], root: Path = ROOT) -> list[str]:
    """Record the fingerprints of the notebooks in ``paths`` that ran fully and without error.

    Notebooks that did not (a failed or interrupted run) lose any earlier stamp. Returns the
    repository-relative paths that were stamped.
    """
    stamps = read_stamps(root)
    stamped = []
    for path in paths:
        key = Path(path).resolve().relative_to(root).as_posix()
        nb = json.loads(Path(path).read_text())
        if ran_without_error(nb):
            stamps[key] = fingerprint(nb, root)
            stamped.append(key)
        else:
            stamps.pop(key, None)
    (root / STAMPS).parent.mkdir(parents=True, exist_ok=True)
    (root / STAMPS).write_text(json.dumps(stamps, indent=1, sort_keys=True) + "\n")
    return stamped


def execution_mode(nb: dict, key: str, root: Path = ROOT) -> str | None:
    """The execution mode to inject for the notebook stored at ``key``, or None to leave ``auto``."""
    if not has_outputs(nb):
        return None
    if is_executed(nb) and read_stamps(root).get(key) == fingerprint(nb, root):
        return "off"
    return "force"


def _on_source_read(app, docname: str, source: list[str]) -> None:
    from sphinx.util import logging

    logger = logging.getLogger(__name__)
    if getattr(app.config, "nb_execution_mode", None) != "auto":
        return
    path = Path(app.env.doc2path(docname))
    if path.suffix != ".ipynb":
        return
    try:
        nb = json.loads(source[0])
    except ValueError:
        return  # not JSON: leave it to myst-nb to report
    meta = nb.setdefault("metadata", {}).setdefault("mystnb", {})
    if "execution_mode" in meta:
        return  # the notebook chose its own mode
    root = Path(app.srcdir).resolve()
    mode = execution_mode(nb, path.resolve().relative_to(root).as_posix(), root)
    if mode is None:
        return
    meta["execution_mode"] = mode
    source[0] = json.dumps(nb)
    if mode == "off":
        logger.info("%s: outputs made from the current sources, rendering them", docname)
    else:
        logger.info("%s: stored outputs not made from the current sources, executing again", docname)


def setup(app):
    os.environ.setdefault("DEQLAB_BOOK_BUILD", "1")  # inherited by the kernels myst-nb starts
    app.connect("source-read", _on_source_read)
    return {"version": "2.0", "parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "stamp":
        sys.exit("usage: python book/_ext/executed_notebooks.py stamp NOTEBOOK.ipynb ...")
    for key in stamp([Path(p) for p in sys.argv[2:]]):
        print(f"stamped {key}")
