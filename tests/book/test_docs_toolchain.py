"""The documentation toolchain is pinned, and the environment that builds the book uses the pins.

.ci/docs-constraints.txt pins the Sphinx stack (jupyter-book, sphinx, myst-nb, the themes and the
extensions); `make install` installs with it. .ci/docs_drift.py compares an environment with the pins.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / ".ci"))
import docs_drift  # noqa: E402

#: The packages whose release could change the build; each must be pinned.
TOOLCHAIN = ["jupyter-book", "sphinx", "myst-nb", "myst-parser", "sphinx-book-theme", "pydata-sphinx-theme",
             "sphinxcontrib-bibtex", "sphinx-external-toc", "docutils", "jupyter-cache", "sphinx-design",
             "sphinx-togglebutton", "sphinx-copybutton", "sphinx-multitoc-numbering"]


def test_every_toolchain_package_is_pinned_exactly():
    pinned = docs_drift.pins()
    assert sorted(set(map(docs_drift.normalise, TOOLCHAIN)) - set(pinned)) == []
    assert pinned["jupyter-book"].startswith("1."), "the book keeps the Jupyter Book 1 layout"


def test_makefile_installs_with_the_pins():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"DOCS_CONSTRAINTS := \.ci/docs-constraints\.txt", makefile)
    assert re.search(r'pip install -q -e "\.\[book,test\]" -c \$\(DOCS_CONSTRAINTS\)', makefile)


@pytest.mark.skipif(importlib.util.find_spec("jupyter_book") is None,
                    reason="jupyter-book is not installed here (the floor environment has no book stack)")
def test_this_environment_has_the_pinned_versions():
    report = docs_drift.drift(docs_drift.pins(), docs_drift.installed(sys.executable))
    assert [line for line in report if line[1] != "same"] == []


def test_drift_report_names_moved_and_missing_packages(tmp_path):
    constraints = tmp_path / "c.txt"
    constraints.write_text("# comment\nSphinx==7.4.7\nmyst_nb==1.4.0  # why\nsphinx-design==0.8.0\n")
    pinned = docs_drift.pins(constraints)
    assert pinned == {"sphinx": "7.4.7", "myst-nb": "1.4.0", "sphinx-design": "0.8.0"}
    report = dict(docs_drift.drift(pinned, {"sphinx": "8.0.0", "myst-nb": "1.4.0"}))
    assert report == {"sphinx": "moved 7.4.7 -> 8.0.0", "myst-nb": "same", "sphinx-design": "missing"}
    constraints.write_text("sphinx>=7\n")
    with pytest.raises(ValueError, match="not a `name==version` pin"):
        docs_drift.pins(constraints)


def test_drift_command_line_without_build():
    run = subprocess.run([sys.executable, str(ROOT / ".ci" / "docs_drift.py"), "--no-build"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "pinned packages differ from .ci/docs-constraints.txt" in run.stdout
    bad = subprocess.run([sys.executable, str(ROOT / ".ci" / "docs_drift.py"), "--python", "/no/such/python"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--python" in bad.stderr
