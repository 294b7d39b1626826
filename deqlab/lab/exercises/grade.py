"""Grade student-edition notebooks: ``python -m deqlab.lab.exercises.grade SUBMISSION.ipynb ...``.

Usage::

    python -m deqlab.lab.exercises.grade alice.ipynb bob.ipynb --manifest _build/student/grading_manifest.json \\
        --out results.csv --time-limit 1200

For each submission (a notebook of the student edition, ``make student-edition``):

1. **Which page.** ``--page`` (a path relative to ``book/``, e.g. ``ch2_freeprob/01_transforms.ipynb``),
   else the page the notebook's metadata names (``deqlab_student_edition.source``, which the
   student edition writes and Jupyter keeps). The page must be in the manifest.
2. **Its check cells.** The manifest (``deqlab.lab.exercises._manifest``, written by
   ``.ci/student_edition.py`` as ``grading_manifest.json`` next to the edition's notebooks) lists
   each page's check cells, their graders and the hash of their source. A check cell found by its
   id with the same hash (or, if ids changed, any cell with that hash) is kept; one that is missing
   counts as a failure "deleted", one whose source differs as "edited", for every grader it calls.
3. **Execution.** A copy of the notebook, outputs cleared, runs top to bottom in a fresh kernel
   (nbclient; ``--kernel``, default ``python3``; the notebook's folder as working directory), every
   cell even when one raises (a cell tagged ``raises-exception`` or not), within ``--time-limit``
   seconds for the whole notebook. A first cell, injected, runs :func:`._capture.install`: every
   grader call then leaves in its cell's outputs a machine-readable record of its verdict (MIME type
   ``application/vnd.deqlab.grade+json``).
4. **Scores.** For each grader call of each check cell, the record that call left: passed or not,
   and the grader's message (the failed checks and their hints). A check cell that stopped before
   its grader ran (the student's code raised first, ``NotImplementedError`` when it is not written)
   fails with the cell's exception; one that did not run before the time limit fails saying so.

It prints one table per submission (exercise, points, passed, message) and the totals, writes
``--out`` (``.csv`` or ``.json``: one row per submission and exercise, for a class roster), and
``--executed DIR`` keeps each executed notebook (the students' feedback). Exit status: 0 when every
exercise of every submission passed, 1 when one failed, 2 on bad arguments (a missing file, a file
that is not a notebook, an unknown page, a bad time limit, a manifest that is not one, an ``--out``
or ``--executed`` path that cannot be written, an unknown ``--kernel``), with a message naming the
argument; these are checked before any notebook runs.

What it is not: a sandbox. The graders run in the student's kernel, so code written to fool them
(replacing ``deqlab``'s internals, forging a record) is not detected; deleting or editing a check
cell, calling the library's own function where the exercise asks for one's own (each grader blocks
its references, :data:`._forbid.FORBIDDEN`), and replacing a grader are.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import math
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from deqlab.lab.exercises import _manifest
from deqlab.lab.exercises._capture import MIME

DEFAULT_MANIFEST = Path("_build") / "student" / _manifest.MANIFEST_NAME
DEFAULT_TIME_LIMIT = 1800.0
HOOK_ID = "deqlab-grade-hook"
HOOK_SOURCE = ("import deqlab.lab.exercises._capture as _deqlab_grade_capture\n"
               "_deqlab_grade_capture.install()\n"
               "del _deqlab_grade_capture")
FIELDS = ["submission", "page", "exercise", "grader", "cell_id", "points", "max_points", "passed", "message"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deqlab.lab.exercises.grade",
        description="Execute student-edition notebooks and score their check cells against the grading manifest.")
    parser.add_argument("submissions", nargs="+", metavar="SUBMISSION", help="submitted notebooks (.ipynb)")
    parser.add_argument("--manifest", type=Path, default=None,
                        help=f"grading manifest written by the student edition (default: $DEQLAB_GRADING_MANIFEST "
                             f"or {DEFAULT_MANIFEST})")
    parser.add_argument("--page", default=None,
                        help="the page every submission is, relative to book/ (default: read from each notebook)")
    parser.add_argument("--out", type=Path, default=None, help="write the results to this .csv or .json file")
    parser.add_argument("--time-limit", default=str(DEFAULT_TIME_LIMIT), metavar="SECONDS",
                        help=f"time limit per notebook, seconds > 0 (default {DEFAULT_TIME_LIMIT:g})")
    parser.add_argument("--kernel", default="python3", help="Jupyter kernel to run the notebooks (default python3)")
    parser.add_argument("--executed", type=Path, default=None, metavar="DIR",
                        help="also write each executed notebook into DIR")
    return parser


# ------------------------------------------------------------------------------------------------
# Arguments


def _time_limit(text: str, parser: argparse.ArgumentParser) -> float:
    try:
        value = float(text)
    except ValueError:
        parser.error(f"argument --time-limit: expected a number of seconds > 0, got {text!r}")
    if not math.isfinite(value) or value <= 0:
        parser.error(f"argument --time-limit: expected a finite number of seconds > 0, got {text!r}")
    return value


def _non_directory_ancestor(path: Path) -> Path | None:
    """The nearest existing one of ``path`` and its ancestors when it is not a directory, else None."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None


def _check_kernel(name: str, parser: argparse.ArgumentParser) -> None:
    """``--kernel`` must name an installed Jupyter kernel (else every notebook would fail to run)."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager

        specs = KernelSpecManager().find_kernel_specs()  # with ipykernel's own python3
    except Exception:  # noqa: BLE001 - no jupyter_client, an unreadable kernel folder: execution reports it
        return
    if name not in specs:
        parser.error(f"argument --kernel: no Jupyter kernel named {name!r}; installed: {sorted(specs) or 'none'}")


def _load_manifest(path: Path, parser: argparse.ArgumentParser) -> dict:
    if not path.is_file():
        parser.error(f"argument --manifest: {path} not found (write it with `make student-edition`)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        parser.error(f"argument --manifest: {path} is not a JSON file: {error}")
    if not isinstance(manifest, dict) or manifest.get("format") != _manifest.FORMAT \
            or not isinstance(manifest.get("pages"), dict):
        parser.error(f"argument --manifest: {path} is not a grading manifest (format {_manifest.FORMAT!r})")
    for page, entry in manifest["pages"].items():
        problem = _manifest_problem(entry)
        if problem:
            parser.error(f"argument --manifest: {path} is not a valid grading manifest: page {page!r} {problem} "
                         "(write it again with `make student-edition`)")
    return manifest


def _manifest_problem(entry: Any) -> str | None:
    """What is wrong with one page of a manifest (``_manifest.build``'s layout), or None."""
    if not isinstance(entry, dict) or not isinstance(entry.get("checks"), list):
        return "has no list of check cells ('checks')"
    for i, check in enumerate(entry["checks"]):
        if not isinstance(check, dict):
            return f"has a check entry {i} that is not a dict"
        graders = check.get("graders")
        if not isinstance(graders, list) or not graders or not all(isinstance(g, str) for g in graders):
            return f"has a check entry {i} whose 'graders' is not a list of grader names"
        points = check.get("points", [1] * len(graders))
        if not isinstance(points, list) or len(points) != len(graders) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 for x in points):
            return f"has a check entry {i} whose 'points' are not one number >= 0 per grader"
        if not all(isinstance(check.get(key), str) for key in ("sha256", "scope")) or "cell_id" not in check:
            return f"has a check entry {i} without its 'cell_id', 'scope' and 'sha256'"
    return None


def _page_key(page: str) -> str:
    page = page.replace("\\", "/").strip()
    return page[len("book/"):] if page.startswith("book/") else page


def _read_notebook(path: Path, parser: argparse.ArgumentParser):
    import nbformat

    if path.is_dir():
        parser.error(f"argument SUBMISSION: {path} is a directory, not a notebook file (.ipynb)")
    if not path.is_file():
        parser.error(f"argument SUBMISSION: {path} not found")
    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception as error:  # noqa: BLE001 - any read or parse failure: not a notebook
        parser.error(f"argument SUBMISSION: {path} is not a notebook ({type(error).__name__}: "
                     f"{str(error).splitlines()[0] if str(error) else ''})")
    if not isinstance(nb.get("cells"), list):
        parser.error(f"argument SUBMISSION: {path} is not a notebook (no cells)")
    return nb


def _resolve_page(nb, path: Path, page: str | None, manifest: dict, manifest_path: Path,
                  parser: argparse.ArgumentParser) -> str:
    known = sorted(manifest["pages"])
    if page is not None:
        key = _page_key(page)
        if key not in manifest["pages"]:
            parser.error(f"argument --page: unknown page {page!r}: {manifest_path} lists {len(known)} pages, e.g. "
                         f"{', '.join(known[:3])}")
        return key
    source = nb.get("metadata", {}).get("deqlab_student_edition", {}).get("source")
    if not source:
        parser.error(f"argument SUBMISSION: {path} does not say which page it is (no deqlab_student_edition "
                     "metadata): pass --page")
    key = _page_key(str(source))
    if key not in manifest["pages"]:
        parser.error(f"argument SUBMISSION: {path} is page {source!r}, unknown to {manifest_path}")
    return key


# ------------------------------------------------------------------------------------------------
# Check cells


def _locate(nb, checks: list[dict]) -> list[tuple[int | None, str | None]]:
    """For each manifest entry: (index of its cell in ``nb``, None) or (None, why it fails)."""
    cells = nb["cells"]
    hashes = {}
    by_id = {cell.get("id"): i for i, cell in enumerate(cells)}
    used: set[int] = set()
    found: list[tuple[int | None, str | None]] = []

    def digest(i: int, kind: str) -> str | None:
        if cells[i].get("cell_type") != "code":
            return None
        if (i, kind) not in hashes:
            hashes[i, kind] = _manifest.check_hash(_manifest._source(cells[i]), kind)
        return hashes[i, kind]

    for entry in checks:
        i = by_id.get(entry["cell_id"])
        calls = ", ".join(entry["graders"])
        if i is not None and i not in used and digest(i, entry["scope"]) == entry["sha256"]:
            used.add(i)
            found.append((i, None))
            continue
        moved = next((j for j in range(len(cells)) if j not in used and digest(j, entry["scope"]) == entry["sha256"]),
                     None)
        if moved is not None:  # the same check cell under another id (an old front end renumbered them)
            used.add(moved)
            found.append((moved, None))
        elif i is not None:
            found.append((None, f"the check cell (id {entry['cell_id']}, calling {calls}) was edited: its source "
                                "differs from the student edition's. Restore it from the student edition (write "
                                "your code in the reader-code cell or a new cell) and run it again."))
        else:
            found.append((None, f"the check cell (id {entry['cell_id']}, calling {calls}) was deleted. Restore it "
                                "from the student edition and run it again."))
    return found


def _execute(nb, path: Path, kernel: str, limit: float) -> tuple[Any, str | None, int | None]:
    """Run a copy of ``nb`` with the capture hook first: (executed copy, error, index of the cell running
    at the time limit). Indices of the copy are those of ``nb`` plus one (the hook)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    run = copy.deepcopy(nb)
    for cell in run["cells"]:
        if cell.get("cell_type") == "code":  # never read a result the submission brought with it
            cell["outputs"], cell["execution_count"] = [], None
    hook = nbformat.v4.new_code_cell(HOOK_SOURCE)
    hook["id"] = HOOK_ID
    run["cells"].insert(0, hook)
    deadline = time.monotonic() + limit
    running: dict[str, int] = {}

    def on_start(cell=None, cell_index=None, **_):
        running["index"] = cell_index

    client = NotebookClient(run, kernel_name=kernel, allow_errors=True, record_timing=False,
                            timeout_func=lambda cell: max(1, math.ceil(deadline - time.monotonic())),
                            resources={"metadata": {"path": str(path.parent.resolve())}},
                            on_cell_start=on_start)
    error, stopped = None, None
    try:
        client.execute()
    except CellTimeoutError:
        error, stopped = f"the notebook did not finish within its time limit of {limit:g} s", running.get("index")
    except DeadKernelError as exc:
        error, stopped = f"the kernel died ({exc})", running.get("index")
    except Exception as exc:  # noqa: BLE001 - a kernel that does not start, a broken notebook
        error, stopped = f"the notebook could not be executed: {type(exc).__name__}: {exc}", running.get("index")
    hook_errors = [o for o in run["cells"][0].get("outputs", []) if o.get("output_type") == "error"]
    if hook_errors:
        error = (f"the grading hook failed in the kernel ({hook_errors[0].get('ename')}: "
                 f"{hook_errors[0].get('evalue')}): is deqlab installed in kernel {kernel!r}?")
    return run, error, stopped


def _records(cell) -> list[dict]:
    out = []
    for output in cell.get("outputs", []):
        data = output.get("data", {}) if output.get("output_type") in ("display_data", "execute_result") else {}
        if MIME in data:
            value = data[MIME]
            out.append(json.loads(value) if isinstance(value, str) else dict(value))
    return out


def _cell_error(cell) -> str | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            text = f"{output.get('ename')}: {output.get('evalue')}"
            if output.get("ename") == "NotImplementedError":
                text += " (not written yet)"
            return text[:400]
    return None


def grade_notebook(nb, path: Path, page: str, manifest: dict, *, kernel: str = "python3",
                   time_limit: float = DEFAULT_TIME_LIMIT, executed_dir: Path | None = None) -> list[dict]:
    """The result rows of one submission (see :data:`FIELDS`); executes it when a check cell is intact."""
    checks = manifest["pages"][page]["checks"]
    located = _locate(nb, checks)
    names = Counter(g for entry in checks for g in entry["graders"])
    run = error = stopped = None
    if any(i is not None for i, _ in located):
        run, error, stopped = _execute(nb, path, kernel, time_limit)
        if executed_dir is not None:
            import nbformat

            executed_dir.mkdir(parents=True, exist_ok=True)
            nbformat.write(run, str(executed_dir / path.name))
    rows = []
    for entry, (index, problem) in zip(checks, located):
        seen: Counter = Counter()
        cell = run["cells"][index + 1] if run is not None and index is not None else None
        records = _records(cell) if cell is not None else []
        for grader, points in zip(entry["graders"], entry.get("points", [1] * len(entry["graders"]))):
            occurrence = seen[grader]
            seen[grader] += 1
            label = grader if names[grader] == 1 else f"{grader} [cell {entry['cell_id']}]"
            if names[grader] > 1 and entry["graders"].count(grader) > 1:
                label += f" #{occurrence + 1}"
            mine = [r for r in records if r.get("grader") == grader]
            passed, message = False, problem
            if problem is None:
                if occurrence < len(mine):
                    passed, message = bool(mine[occurrence].get("passed")), str(mine[occurrence].get("message", ""))
                elif error is not None and (stopped is None or index + 1 >= stopped):
                    message = f"not graded: {error}"
                elif cell is not None and (why := _cell_error(cell)) is not None:
                    message = f"the check cell stopped before {grader} ran: {why}"
                elif error is not None:
                    message = f"not graded: {error}"
                else:
                    message = (f"{grader} did not run in its check cell (was exercises.{grader} replaced, or the "
                               "call skipped?)")
            rows.append({"submission": str(path), "page": page, "exercise": label, "grader": grader,
                         "cell_id": entry["cell_id"], "points": points if passed else 0, "max_points": points,
                         "passed": passed, "message": message})
    return rows


# ------------------------------------------------------------------------------------------------
# Output


def _table(rows: list[dict]) -> str:
    width = max([len("exercise")] + [len(r["exercise"]) for r in rows])
    lines = [f"{'exercise':<{width}}  points  passed  message"]
    for r in rows:
        message = r["message"].replace("\n", " ")
        if len(message) > 110:
            message = message[:107] + "..."
        lines.append(f"{r['exercise']:<{width}}  {r['points']:>2}/{r['max_points']:<3}  "
                     f"{'yes' if r['passed'] else 'NO':<6}  {message}")
    return "\n".join(lines)


def write_results(rows: list[dict], out: Path) -> None:
    """Write ``rows`` to ``out``: CSV (one row per submission and exercise) or JSON."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".json":
        totals: dict[str, dict[str, Any]] = {}
        for r in rows:
            t = totals.setdefault(r["submission"], {"page": r["page"], "points": 0, "max_points": 0})
            t["points"] += r["points"]
            t["max_points"] += r["max_points"]
        out.write_text(json.dumps({"results": rows, "totals": totals}, indent=1) + "\n", encoding="utf-8")
        return
    with out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    limit = _time_limit(args.time_limit, parser)
    if args.out is not None and args.out.suffix.lower() not in (".csv", ".json"):
        parser.error(f"argument --out: {args.out} must end in .csv or .json")
    # checked before any notebook runs: a bad path must not end a class's grading after the work is done
    if args.out is not None and args.out.is_dir():
        parser.error(f"argument --out: {args.out} is a directory; it must be a .csv or .json file")
    if args.out is not None and (blocked := _non_directory_ancestor(args.out.parent)) is not None:
        parser.error(f"argument --out: {args.out} cannot be written: {blocked} is a file, not a directory")
    if args.executed is not None and (blocked := _non_directory_ancestor(args.executed)) is not None:
        parser.error(f"argument --executed: {args.executed} must be a directory (or a new one's path): {blocked} "
                     "is a file")
    _check_kernel(args.kernel, parser)
    manifest_path = args.manifest or Path(os.environ.get("DEQLAB_GRADING_MANIFEST", DEFAULT_MANIFEST))
    manifest = _load_manifest(manifest_path, parser)
    submissions = []
    for name in args.submissions:  # every argument is checked before anything runs
        path = Path(name)
        nb = _read_notebook(path, parser)
        submissions.append((path, nb, _resolve_page(nb, path, args.page, manifest, manifest_path, parser)))
    rows: list[dict] = []
    for path, nb, page in submissions:
        mine = grade_notebook(nb, path, page, manifest, kernel=args.kernel, time_limit=limit,
                              executed_dir=args.executed)
        rows += mine
        score, total = sum(r["points"] for r in mine), sum(r["max_points"] for r in mine)
        print(f"\n{path} ({page}): {score}/{total} points")
        if mine:
            print(_table(mine))
        else:
            print("(this page has no check cells)")
    if args.out is not None:
        write_results(rows, args.out)
        print(f"\nwrote {len(rows)} rows to {args.out}")
    failed = sum(not r["passed"] for r in rows)
    print(f"\n{len(submissions)} submission(s), {len(rows)} exercise(s), {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
