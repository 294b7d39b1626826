"""Write tests/slow.json from the JUnit reports of a `make test TIER=all` (every unit test).

``tests/slow.json`` holds the node ids of the unit tests that took at least ``SLOW_SECONDS`` in a
cold report (or ``WARM_SLOW_SECONDS`` in a warm `make unit`, below): tests/conftest.py marks them
``slow``, so that `make unit`, the quick inner loop, leaves them out, as does `make test` (`make test TIER=all`, `make unit-all` and CI run them). A test can also be marked slow in its
file (``@pytest.mark.slow``, with the reason), which holds whatever was measured. (The script also
wrote tests/durations.json, a test order by measured file time; pytest-xdist's `--dist worksteal`
with the notebooks first replaced it: see tests/conftest.py.)

It is generated, never edited. After a `make test TIER=all` (which writes both passes' reports; a
plain `make test` leaves the slow tests out, and a table made from its reports would drop them), from the
repository root:

    python .ci/test_durations.py               # slow.json from _build/reports/tests{,-float64}.xml

and, after it, from the reports of a cold `make unit` run with ``--junitxml`` (both passes), the
quick tests that took 3 s or more there are added (``--add``): without the slow tests, the first
quick test to use a shared fixture or compiled program pays for it alone (issue 39: the dry-run
table's fixture, 19 s, and the ensemble study's tiny training, 13 s, were paid by slow tests in
the full run and by quick ones in `make unit`)::

    python .ci/test_durations.py --add unit.xml unit-float64.xml

and last, from the reports of a warm `make unit` (the same two passes run again on the cache the cold
run filled, with ``--junitxml``), the quick tests that took ``WARM_SLOW_SECONDS`` or more there
(``--add --warm``): the inner loop's budget is one minute warm (issue 39), and a warm test's time is
its own work, no longer its compiling, so it needs its own, lower bar::

    python .ci/test_durations.py --add --warm unit-warm.xml unit-warm-float64.xml

The times must be those of `make test TIER=all` on the 2-core machine from a cold compilation cache: two
workers, the notebooks running beside the unit tests, every program compiled (compilation is most
of a small test's time, and the first test of a file pays for the programs the next ones reuse).
A fresh clone is cold (`.ci/run` there with ``DEQLAB_CI_COLD=1``, or `make test TIER=all` with
JAX_COMPILATION_CACHE_DIR pointing at an empty folder); the GitHub workflow restores `.jax_cache`,
so its reports are warm: do not use them, since on a warm cache tests that compile a lot look fast.
"""

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: A unit test that took at least this long in `make test TIER=all` (two workers beside the notebooks,
#: cold cache) is slow. Measured on the 2-core machine (issue 24; counts at the time): with it,
#: `make unit` ran 2,056 of 2,382 unit tests in 311 s from a cold cache (125 s warm), against 668 s
#: for the 2,204 of the previous `make unit` (marks in the files only, one pass).
SLOW_SECONDS = 3.0

#: A quick test that took at least this long in a warm `make unit` (``--add --warm``) is slow too.
#: Measured on the 2-core machine (issue 39, 2026-12-02, bytecode cached): the warm `make unit` ran
#: 2,006 + 493 tests whose own times summed to 88.1 + 54.9 s, on top of 13 s of start-up and
#: collection for the two passes; the 89 tests (3.6 %) of at least 0.4 s held 67.4 s of the 143.0.
WARM_SLOW_SECONDS = 0.4


def file_of(classname: str) -> tuple[str, list[str]] | None:
    """The repository file of a JUnit classname ("tests.test_x", "tests.book.test_x.TestY",
    "book.ch1_linear.01_page.ipynb") and the classes after it, or None: for a test module, the
    longest dotted prefix that names an existing file; for a notebook (whose name has dots), the
    first existing path with the fewest folders."""
    parts = classname.split(".")
    if parts[-1] == "ipynb":
        parts = parts[:-1]
        candidates = [("/".join(parts[:i]) + "/" + ".".join(parts[i:])) + ".ipynb" for i in range(len(parts))]
        found = next((c.lstrip("/") for c in candidates if (ROOT / c.lstrip("/")).is_file()), None)
        return None if found is None else (found, [])
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (ROOT / path).is_file():
            return path, parts[end:]
    return None


def tables(reports: list[str], slow_seconds: float = SLOW_SECONDS) -> tuple[dict[str, float], list[str]]:
    """(file -> seconds summed over every report, files under 0.05 s left out: the summary the
    script prints; the sorted node ids of the unit tests that took at least ``slow_seconds``) from
    JUnit XML reports.

    Raises:
        ValueError: a report that is not JUnit XML, holds no test case (a run that stopped at
            collection), gives a test time that is not a number, or whose test cases map to no file
            of the repository (a report of another checkout or layout: its tables would be empty).
    """
    seconds: dict[str, float] = {}
    slow: set[str] = set()
    for report in reports:
        try:
            cases = list(ET.parse(report).getroot().iter("testcase"))
        except ET.ParseError as error:
            raise ValueError(f"`{report}` is not a JUnit XML report: {error}") from error
        if not cases:
            raise ValueError(f"`{report}` holds no test case: not the report of a run")
        mapped = 0
        for case in cases:
            found = file_of(case.get("classname", ""))
            if found is None:
                continue
            mapped += 1
            path, classes = found
            try:
                took = float(case.get("time", 0.0))
            except ValueError as error:
                raise ValueError(f"`{report}`: test time {case.get('time')!r} is not a number") from error
            seconds[path] = seconds.get(path, 0.0) + took
            if path.endswith(".py") and took >= slow_seconds:
                slow.add("::".join([path, *classes, case.get("name", "")]))
        if not mapped:
            raise ValueError(f"`{report}`: none of its {len(cases)} test cases names a file under {ROOT} (first "
                             f"classname {cases[0].get('classname', '')!r}): the report of another checkout or "
                             "layout; its tables would be empty")
    table = {p: round(s, 1) for p, s in sorted(seconds.items(), key=lambda kv: -kv[1]) if s >= 0.05}
    return table, sorted(slow)


def _write(path: Path, value) -> None:
    # whole or not at all: an interrupted write never leaves a truncated table
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=0) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="*", default=[str(ROOT / "_build" / "reports" / name) for name in
                                                           ("tests.xml", "tests-float64.xml")],
                        help="JUnit XML reports of one `make test TIER=all`, both passes (default: the two "
                             "that `make test` writes into _build/reports)")
    parser.add_argument("--out", default=str(ROOT / "tests"), help="folder of slow.json")
    parser.add_argument("--add", action="store_true",
                        help="add the tests of at least 3 s in these reports to the stored slow.json instead of "
                             "replacing it: for the reports of a cold `make unit`, where a quick test pays alone "
                             "for a shared fixture or program that a slow test paid for in the full run")
    parser.add_argument("--warm", action="store_true",
                        help=f"with --add: the reports are of a warm `make unit`, and the tests of at least "
                             f"{WARM_SLOW_SECONDS:g} s in them are added")
    args = parser.parse_args(argv)
    if args.warm and not args.add:
        parser.error("--warm adds to the stored table: give --add with it (a warm run's tests are only "
                     "the quick ones, so its table must never replace the full run's)")
    threshold = WARM_SLOW_SECONDS if args.warm else SLOW_SECONDS
    missing = [r for r in args.reports if not Path(r).is_file()]
    if missing:
        parser.error(f"no such report: {', '.join(missing)} (run `make test TIER=all` first)")
    out = Path(args.out)
    if not out.is_dir():
        parser.error(f"--out: no such folder: {out}")
    own = [r for r in args.reports if Path(r).resolve() == (out / "slow.json").resolve()]
    if own:
        parser.error(f"{', '.join(own)} is this script's output: refusing to overwrite its own input")
    try:
        table, slow = tables(args.reports, threshold)
    except ValueError as error:
        parser.error(str(error))
    if not slow and not args.add:  # never [] over the stored table: every unit test would go back into `make unit`
        parser.error(f"no unit test took at least {SLOW_SECONDS:g} s in {', '.join(args.reports)}: not the reports "
                     "of a cold `make test TIER=all` (see the docstring); slow.json left as it was")
    if args.add:
        stored = json.loads((out / "slow.json").read_text()) if (out / "slow.json").is_file() else []
        slow = sorted(set(stored) | set(slow))
    _write(out / "slow.json", slow)
    print(f"{len(table)} files, {sum(table.values()):.0f} s; {len(slow)} tests marked slow (at least "
          f"{threshold:g} s in these reports{' or in those before' if args.add else ''})", file=sys.stderr)


if __name__ == "__main__":
    main()
