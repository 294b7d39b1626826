"""The execution report (book/_ext/execution_report.py) reads what `make test` records."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("execution_report", ROOT / "book" / "_ext" / "execution_report.py")
report = importlib.util.module_from_spec(_spec)
sys.modules["execution_report"] = report  # dataclasses look their module up there
_spec.loader.exec_module(report)

# As pytest (xunit2) writes it for nbmake items and a unit test; times and outcomes vary.
JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest"
 errors="1" failures="1" skipped="1" tests="5" time="99.0" timestamp="2026-11-25T19:19:01+00:00" hostname="vm">
<testcase classname="book.ch0_practice.01_what_is_a_deq.ipynb" name="01_what_is_a_deq.ipynb" time="41.250" />
<testcase classname="book.ch5_transformers.02_copy.memory.ipynb" name="02_copy.memory.ipynb" time="75.5">
  <failure message="cell 3 raised">Traceback</failure></testcase>
<testcase classname="book.ch1_linear.01_ensembles.ipynb" name="01_ensembles.ipynb" time="3.0">
  <error message="kernel died" /></testcase>
<testcase classname="book.ch2_freeprob.01_transforms.ipynb" name="01_transforms.ipynb" time="0.0">
  <skipped message="no" /></testcase>
<testcase classname="tests.test_solvers" name="test_picard_converges" time="0.2" />
</testsuite></testsuites>
"""


def test_notebook_runs_from_junit(tmp_path):
    junit = tmp_path / "tests.xml"
    junit.write_text(JUNIT)
    runs = report.notebook_runs(junit)
    assert [(r.path, r.status, r.seconds) for r in runs] == [
        ("book/ch0_practice/01_what_is_a_deq.ipynb", "passed", 41.25),
        ("book/ch5_transformers/02_copy.memory.ipynb", "failed", 75.5),
        ("book/ch1_linear/01_ensembles.ipynb", "error", 3.0),
        ("book/ch2_freeprob/01_transforms.ipynb", "skipped", 0.0),
    ]  # the unit test is not a notebook


def test_read_report_with_run_info_and_without_a_run(tmp_path):
    assert report.read_report(tmp_path) is None  # no make test: the page says so, no numbers
    (tmp_path / "tests.xml").write_text(JUNIT)
    (tmp_path / "run.json").write_text(json.dumps({"scale": "quick", "workers": 2}))
    runs, info = report.read_report(tmp_path)
    assert len(runs) == 4 and info == {"scale": "quick", "workers": 2}


def test_bad_files_are_refused_with_the_path(tmp_path):
    junit = tmp_path / "tests.xml"
    junit.write_text("<testsuites><testcase")
    with pytest.raises(ValueError, match="not a JUnit XML file"):
        report.notebook_runs(junit)
    junit.write_text('<testsuites><testcase classname="book.a.ipynb" name="a.ipynb" time="x"/></testsuites>')
    with pytest.raises(ValueError, match="book/a.ipynb has no numeric time"):
        report.notebook_runs(junit)


@pytest.mark.parametrize(("seconds", "text"), [(0.04, "0.0 s"), (42.0, "42.0 s"), (60.0, "1 min 00 s"),
                                               (75.2, "1 min 15 s"), (3599.6, "60 min 00 s")])
def test_format_seconds(seconds, text):
    assert report.format_seconds(seconds) == text


@pytest.mark.parametrize(("info", "text"), [
    ({}, "was not recorded"),
    ({"compilation_cache_entries": 0}, "was empty at the start: every page compiled its programs"),
    ({"compilation_cache_entries": 5475}, "held 5,475 programs at the start"),
])
def test_the_report_says_what_the_compilation_cache_held(info, text):
    # a warm cache loads a page's programs instead of compiling them: its times are not a fresh runtime's
    assert text in report.cache_sentence(info)


def test_make_test_writes_the_report_files():
    makefile = (ROOT / "Makefile").read_text()
    assert "--junitxml=$(REPORTS)/tests.xml" in makefile
    assert "$(REPORTS)/run.json" in makefile and '"compilation_cache_entries": %s' in makefile
    assert "execution_report: book/_ext" in (ROOT / "_config.yml").read_text()
    assert "```{execution-report}" in (ROOT / "book" / "execution.md").read_text()


def test_backticked_spans_become_inline_code_not_literal_backticks():
    nodes = pytest.importorskip("docutils.nodes", reason="the book's Sphinx toolchain (docutils) is not installed (pip install -e '.[book]'); the floor environment of .ci/run, like Colab, has none, and CI's main test phase runs these checks")

    parts = report._with_code("From the `make test` run (into `_build/reports/`).", nodes)
    assert [type(p).__name__ for p in parts] == ["Text", "literal", "Text", "literal", "Text"]
    assert [p.astext() for p in parts] == ["From the ", "make test", " run (into ", "_build/reports/", ")."]
    assert "`" not in "".join(p.astext() for p in parts)
    with pytest.raises(ValueError, match="unbalanced"):
        report._with_code("a `b", nodes)
