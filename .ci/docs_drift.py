"""Drift of the documentation toolchain: what moved since .ci/docs-constraints.txt, and does it build?

    python .ci/docs_drift.py [--python .venv-drift/bin/python] [--no-build]

Compares the versions installed in ``--python``'s environment with the pins of
.ci/docs-constraints.txt and prints one line per package (``same`` / ``moved a -> b`` / ``missing``);
then, unless ``--no-build``, builds the book there with execution off (a copy of ``_config.yml``
with ``execute_notebooks: "off"``; Sphinx with ``-W -n --keep-going``) into ``_build/drift``.
Exit code: 0 when the build passes (moved pins are information), 1 when it fails, 2 on bad usage.
The weekly workflow .github/workflows/docs-drift.yml runs it without the pins.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / ".ci" / "docs-constraints.txt"


def pins(path: Path = CONSTRAINTS) -> dict[str, str]:
    """``{normalised name: version}`` of the ``name==version`` lines of a constraints file."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if match is None:
            raise ValueError(f"{path}: not a `name==version` pin: {line!r}")
        found[normalise(match.group(1))] = match.group(2)
    return found


def normalise(name: str) -> str:
    """PEP 503 name normalisation (``Sphinx_Design`` -> ``sphinx-design``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(python: str) -> dict[str, str]:
    """``{normalised name: version}`` of every distribution in ``python``'s environment."""
    code = ("import importlib.metadata as m, json; print(json.dumps({d.metadata['Name']: d.version "
            "for d in m.distributions()}))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    return {normalise(name): version for name, version in json.loads(out).items()}


def drift(pinned: dict[str, str], present: dict[str, str]) -> list[tuple[str, str]]:
    """``[(name, "same" | "moved a -> b" | "missing")]`` for every pinned package, sorted."""
    report = []
    for name in sorted(pinned):
        if name not in present:
            report.append((name, "missing"))
        elif present[name] == pinned[name]:
            report.append((name, "same"))
        else:
            report.append((name, f"moved {pinned[name]} -> {present[name]}"))
    return report


def build(python: str) -> int:
    """The book with execution off, -W -n --keep-going, into _build/drift; Sphinx's exit code."""
    config = (ROOT / "_config.yml").read_text()
    config, count = re.subn(r"execute_notebooks:\s*\S+", 'execute_notebooks: "off"', config)
    if count != 1:
        raise SystemExit("docs_drift: _config.yml has no single `execute_notebooks:` line to switch off")
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "_config.yml"
        copy.write_text(config)
        jupyter_book = str(Path(python).parent / "jupyter-book")
        command = [jupyter_book, "build", str(ROOT), "-W", "-n", "--keep-going", "--config", str(copy),
                   "--path-output", str(ROOT / "_build" / "drift")]
        print("[drift] " + " ".join(command), flush=True)
        return subprocess.run(command).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the environment to inspect and build in")
    parser.add_argument("--no-build", action="store_true", help="only compare versions")
    args = parser.parse_args(argv)
    if not Path(args.python).exists():
        print(f"docs_drift: --python {args.python!r} does not exist", file=sys.stderr)
        return 2
    report = drift(pins(), installed(args.python))
    for name, status in report:
        print(f"[drift] {name:32s} {status}")
    moved = sum(status != "same" for _, status in report)
    print(f"[drift] {moved} of {len(report)} pinned packages differ from .ci/docs-constraints.txt")
    if args.no_build:
        return 0
    status = build(args.python)
    print(f"[drift] the unpinned build {'passed' if status == 0 else 'FAILED (exit %d)' % status}")
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
