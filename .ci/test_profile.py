"""Print where the unit tests' compile work goes, from the per-test lines that
``tests/compile_counter.py`` appends to ``DEQLAB_COMPILE_REPORT`` (``make test-profile``).

Run: ``python .ci/test_profile.py REPORT.jsonl [--top N]``.

Prints the totals (tests, programs compiled, persistent-cache hits, compile seconds, test
seconds: worker-seconds, summed over the xdist workers), the top N tests by programs compiled and
by compile seconds, and the top N files by compile seconds. Exits 2 with a message when the report
is missing or holds no test line.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys


def load(path: str) -> list[dict]:
    """The report's test lines (lines that are not JSON objects with a ``nodeid`` are skipped)."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("nodeid"), str):
                rows.append(row)
    return rows


def summary(rows: list[dict], top: int) -> str:
    """The printed profile (see the module docstring)."""
    total = lambda key: sum(float(r.get(key, 0)) for r in rows)  # noqa: E731
    lines = [f"{len(rows)} tests: {int(total('compiles'))} programs compiled "
             f"({int(total('cache_hits'))} of them persistent-cache hits), "
             f"{total('compile_seconds'):.0f} s compiling, {total('seconds'):.0f} worker-seconds in all"]
    for key, label in (("compiles", "programs"), ("compile_seconds", "compile s")):
        lines += ["", f"top {top} tests by {label}:"]
        for r in sorted(rows, key=lambda r: -float(r.get(key, 0)))[:top]:
            lines.append(f"  {r.get('compiles', 0):5d} programs {float(r.get('compile_seconds', 0)):7.1f} s "
                         f"compiling {float(r.get('seconds', 0)):7.1f} s  {r['nodeid']}")
    files = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for r in rows:
        entry = files[r["nodeid"].split("::", 1)[0]]
        entry[0] += int(r.get("compiles", 0))
        entry[1] += float(r.get("compile_seconds", 0))
        entry[2] += float(r.get("seconds", 0))
    lines += ["", f"top {top} files by compile seconds:"]
    for name, (programs, compiling, seconds) in sorted(files.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"  {programs:5d} programs {compiling:7.1f} s compiling {seconds:7.1f} s  {name}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report")
    parser.add_argument("--top", type=int, default=20)
    options = parser.parse_args(argv)
    if options.top < 1:
        parser.error(f"--top must be an integer >= 1, got {options.top}")
    try:
        rows = load(options.report)
    except OSError as error:
        print(f"test_profile: cannot read {options.report}: {error.strerror}", file=sys.stderr)
        return 2
    if not rows:
        print(f"test_profile: {options.report} holds no test line (was DEQLAB_COMPILE_REPORT set?)",
              file=sys.stderr)
        return 2
    print(summary(rows, options.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
