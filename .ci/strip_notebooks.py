#!/usr/bin/env python3
"""Remove outputs, execution counts, timings and the Python version from notebooks, in place.

Usage: python3 .ci/strip_notebooks.py NOTEBOOK.ipynb [...]   (what `make strip` runs)

Only the standard library is used, so it runs without the project's virtual environment. The file
is rewritten in nbformat's layout (1-space indent, sorted keys, trailing newline) and only if
something changed, so clean notebooks keep their modification time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def strip(nb: dict) -> dict:
    for cell in nb.get("cells", []):
        meta = cell.get("metadata", {})
        for key in ("execution", "collapsed", "scrolled", "ExecuteTime"):
            meta.pop(key, None)
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    meta = nb.get("metadata", {})
    meta.pop("widgets", None)
    meta.get("language_info", {}).pop("version", None)  # the executing Python's version: noise
    return nb


def main(paths: list[str]) -> int:
    changed = 0
    for name in paths:
        path = Path(name)
        if path.suffix != ".ipynb" or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        new = json.dumps(strip(json.loads(text)), indent=1, sort_keys=True, ensure_ascii=False) + "\n"
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed += 1
            print(f"stripped {path}")
    print(f"{changed} notebook(s) changed, {len(paths) - changed} already clean")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
