"""The generated test tables (.ci/test_durations.py -> tests/durations.json, tests/slow.json) and
how tests/conftest.py uses them: items ordered longest file first, measured slow tests marked
`slow` so that `make unit` leaves them out."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("test_durations_script", ROOT / ".ci" / "test_durations.py")
durations = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(durations)

# Two passes as `make test` writes them: a module-level test, a parametrised one, a test in a class,
# a notebook (classname as pytest's junitxml writes it), and an unknown file (ignored).
PASS_1 = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_solvers" name="test_quick" time="0.4"/>
<testcase classname="tests.test_solvers" name="test_cases[anderson-1e-05]" time="3.0"/>
<testcase classname="tests.test_solvers" name="test_cases[picard-1e-05]" time="2.99"/>
<testcase classname="tests.test_float_modes.TestModes" name="test_in_a_class" time="7.5"/>
<testcase classname="book.ch1_linear.01_ensembles.ipynb" name="01_ensembles.ipynb" time="40.0"/>
<testcase classname="tests.test_gone" name="test_renamed" time="9.0"/>
</testsuite></testsuites>"""
PASS_2 = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_solvers" name="test_in_float64" time="1.2"/>
</testsuite></testsuites>"""


def test_tables_sum_files_over_both_passes_and_list_tests_at_the_threshold(tmp_path):
    first, second = tmp_path / "tests.xml", tmp_path / "tests-float64.xml"
    first.write_text(PASS_1)
    second.write_text(PASS_2)
    table, slow = durations.tables([str(first), str(second)], slow_seconds=3.0)
    assert table == {"book/ch1_linear/01_ensembles.ipynb": 40.0, "tests/test_float_modes.py": 7.5,
                     "tests/test_solvers.py": 7.6}  # 0.4 + 3.0 + 2.99 + 1.2, rounded
    # at the threshold counts, just under does not; notebooks are never unit tests; classes kept
    assert slow == ["tests/test_float_modes.py::TestModes::test_in_a_class",
                    "tests/test_solvers.py::test_cases[anderson-1e-05]"]


def test_main_writes_both_tables_and_refuses_bad_reports(tmp_path, capsys):
    report = tmp_path / "tests.xml"
    report.write_text(PASS_1)
    durations.main([str(report), "--out", str(tmp_path)])
    assert json.loads((tmp_path / "durations.json").read_text())["tests/test_float_modes.py"] == 7.5
    assert len(json.loads((tmp_path / "slow.json").read_text())) == 2
    with pytest.raises(SystemExit) as exit_info:
        durations.main([str(tmp_path / "missing.xml"), "--out", str(tmp_path)])
    assert exit_info.value.code == 2 and "no such report" in capsys.readouterr().err
    (tmp_path / "broken.xml").write_text("<testsuites><testcase")
    with pytest.raises(ValueError, match="broken.xml` is not a JUnit XML report"):
        durations.tables([str(tmp_path / "broken.xml")])
    (tmp_path / "odd.xml").write_text('<testsuites><testcase classname="tests.test_solvers" name="t" time="x"/>'
                                      "</testsuites>")
    with pytest.raises(ValueError, match="test time 'x' is not a number"):
        durations.tables([str(tmp_path / "odd.xml")])


def test_stored_tables_name_existing_files():
    table = json.loads((ROOT / "tests" / "durations.json").read_text())
    slow = json.loads((ROOT / "tests" / "slow.json").read_text())
    assert table and all((ROOT / path).is_file() for path in table), "durations.json names a missing file"
    assert slow == sorted(set(slow)) and all("::test" in node for node in slow)
    assert all((ROOT / node.split("::")[0]).is_file() for node in slow), "slow.json names a missing file"


@pytest.mark.slow  # a second pytest process that imports jax (about 5 s)
def test_conftest_marks_the_measured_slow_tests_so_make_unit_leaves_them_out():
    slow = json.loads((ROOT / "tests" / "slow.json").read_text())
    # a measured test without a mark in its file: test_eager's warm-start matrix (27 s, issue 24)
    node = next(n for n in slow if n.startswith("tests/test_eager.py::test_warm_start_gradient_matches_cold_start["))
    source = (ROOT / "tests" / "test_eager.py").read_text()
    assert "@pytest.mark.slow" not in source.split("def test_warm_start_gradient_matches_cold_start")[0][-300:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS",)}
    listed = {}
    for selection in ("slow", "not slow"):
        res = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", selection,
             "tests/test_eager.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        listed[selection] = {line.strip() for line in res.stdout.splitlines() if "::" in line}
    assert node in listed["slow"] and node not in listed["not slow"]
    assert listed["not slow"], "every test of test_eager.py deselected"
