"""Write tests/durations.json (file -> seconds, summed over its items) from a pytest JUnit XML.

tests/conftest.py orders the collected items by this table, longest file first, so that with
`pytest -n 2` the long notebooks start at once instead of last. The table is generated, never
edited: either run the suite with DEQLAB_STORE_DURATIONS=tests/durations.json (the conftest writes
it), or convert a JUnit report of a full run (`pytest ... --junitxml=report.xml`):

    python .ci/test_durations.py report.xml > tests/durations.json
"""

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def file_of(classname: str) -> str | None:
    """The repository file of a JUnit classname ("tests.test_x", "tests.test_x.TestY",
    "book.ch1_linear.01_page.ipynb"): the longest dotted prefix that names an existing file."""
    parts = classname.split(".")
    if parts[-1] == "ipynb":
        parts = parts[:-1]
        candidates = [("/".join(parts[:i]) + "/" + ".".join(parts[i:])) + ".ipynb" for i in range(len(parts))]
        return next((c.lstrip("/") for c in candidates if (ROOT / c.lstrip("/")).is_file()), None)
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (ROOT / path).is_file():
            return path
    return None


def main(report: str) -> None:
    seconds: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        path = file_of(case.get("classname", ""))
        if path is not None:
            seconds[path] = seconds.get(path, 0.0) + float(case.get("time", 0.0))
    table = {p: round(s, 1) for p, s in sorted(seconds.items(), key=lambda kv: -kv[1]) if s >= 0.05}
    json.dump(table, sys.stdout, indent=0)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
