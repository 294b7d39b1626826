"""The generated table of slow tests (.ci/test_durations.py -> tests/slow.json) and how
tests/conftest.py uses it: measured slow tests marked `slow` so that `make unit` leaves them out;
the notebooks collected first, with no stored table of durations."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("test_durations_script", ROOT / ".ci" / "test_durations.py")
durations = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(durations)

# Two passes as `make test` writes them: a module-level test, a parametrised one, a test in a
# class, one in a nested class, one in a subfolder, a notebook (classname as pytest's junitxml
# writes it), and a file that does not exist (left out).
PASS_1 = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_quick" time="0.4"/>
<testcase classname="tests.test_a" name="test_cases[anderson-1e-05]" time="3.0"/>
<testcase classname="tests.test_a" name="test_cases[picard-1e-05]" time="2.99"/>
<testcase classname="tests.test_b.TestModes" name="test_in_a_class" time="7.5"/>
<testcase classname="tests.test_b.TestModes.TestInner" name="test_nested" time="4.0"/>
<testcase classname="tests.book.test_c" name="test_in_a_subfolder" time="3.5"/>
<testcase classname="book.ch1_linear.01_ensembles.ipynb" name="01_ensembles.ipynb" time="40.0"/>
<testcase classname="tests.test_gone" name="test_renamed" time="9.0"/>
</testsuite></testsuites>"""
PASS_2 = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_in_float64" time="1.2"/>
</testsuite></testsuites>"""


@pytest.fixture
def repository(tmp_path, monkeypatch):
    """A repository of the files the reports name (the script maps classnames to existing files)."""
    for path in ("tests/test_a.py", "tests/test_b.py", "tests/book/test_c.py", "book/ch1_linear/01_ensembles.ipynb"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    monkeypatch.setattr(durations, "ROOT", tmp_path)
    (tmp_path / "tests.xml").write_text(PASS_1)
    (tmp_path / "tests-float64.xml").write_text(PASS_2)
    return tmp_path


def test_tables_sum_files_over_both_passes_and_list_tests_at_the_threshold(repository):
    table, slow = durations.tables([str(repository / "tests.xml"), str(repository / "tests-float64.xml")],
                                   slow_seconds=3.0)
    assert table == {"book/ch1_linear/01_ensembles.ipynb": 40.0, "tests/test_b.py": 11.5,
                     "tests/test_a.py": 7.6,  # 0.4 + 3.0 + 2.99 + 1.2, rounded
                     "tests/book/test_c.py": 3.5}
    # at the threshold counts, just under does not; notebooks are never unit tests; classes kept
    assert slow == ["tests/book/test_c.py::test_in_a_subfolder",
                    "tests/test_a.py::test_cases[anderson-1e-05]",
                    "tests/test_b.py::TestModes::TestInner::test_nested",
                    "tests/test_b.py::TestModes::test_in_a_class"]


def test_main_writes_the_slow_table_and_refuses_bad_reports(repository, capsys):
    out = repository / "out"
    out.mkdir()
    durations.main([str(repository / "tests.xml"), str(repository / "tests-float64.xml"), "--out", str(out)])
    assert len(json.loads((out / "slow.json").read_text())) == 4
    assert sorted(p.name for p in out.iterdir()) == ["slow.json"]  # no test order is written any more
    assert "4 files, 63 s; 4 tests marked slow (at least 3 s in these reports)" in capsys.readouterr().err
    (repository / "broken.xml").write_text("<testsuites><testcase")
    (repository / "odd.xml").write_text('<testsuites><testcase classname="tests.test_a" name="t" time="x"/>'
                                        "</testsuites>")
    (repository / "empty.xml").write_text("<testsuites><testsuite/></testsuites>")
    for argv, message in (
        ([str(repository / "missing.xml")], "no such report: .*missing.xml .run `make test TIER=all` first"),
        ([str(repository / "tests.xml"), "--out", str(repository / "nowhere")], "--out: no such folder"),
        ([str(repository / "broken.xml")], "broken.xml` is not a JUnit XML report"),
        ([str(repository / "odd.xml")], "test time 'x' is not a number"),
        ([str(repository / "empty.xml")], "empty.xml` holds no test case"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            durations.main([*argv, "--out", str(out)] if "--out" not in argv else argv)
        assert exit_info.value.code == 2
        assert re.search(message, capsys.readouterr().err), message
    # with no report named, the two that `make test` writes into _build/reports
    with pytest.raises(SystemExit):
        durations.main(["--out", str(out)])
    assert "_build/reports/tests.xml" in capsys.readouterr().err


def test_add_keeps_the_stored_table_and_adds_the_quick_runs_slow_tests(repository):
    # --add: a cold `make unit` report, where a quick test paid for a fixture alone, adds to the full run's table
    out = repository / "out"
    out.mkdir()
    (out / "slow.json").write_text(json.dumps(["tests/test_b.py::test_only_in_the_full_run"]))
    durations.main([str(repository / "tests.xml"), "--add", "--out", str(out)])
    stored = json.loads((out / "slow.json").read_text())
    assert stored[0] == "tests/book/test_c.py::test_in_a_subfolder" and len(stored) == 5
    assert "tests/test_b.py::test_only_in_the_full_run" in stored
    durations.main([str(repository / "tests.xml"), "--out", str(out)])  # without it, replaced
    assert "tests/test_b.py::test_only_in_the_full_run" not in json.loads((out / "slow.json").read_text())
    # a quick run with no test of 3 s or more adds nothing and keeps the table
    (repository / "fast-unit.xml").write_text(PASS_2)
    durations.main([str(repository / "fast-unit.xml"), "--add", "--out", str(out)])
    assert len(json.loads((out / "slow.json").read_text())) == 4


def test_warm_adds_the_quick_tests_over_the_warm_bar_and_never_replaces(repository, capsys):
    # --add --warm: a warm `make unit` report adds its tests of at least WARM_SLOW_SECONDS (0.4 s), which the
    # cold bar (3 s) would keep in the quick tier; alone, --warm is refused (it would replace the full run's table)
    assert durations.WARM_SLOW_SECONDS == 0.4 < durations.SLOW_SECONDS
    out = repository / "out"
    out.mkdir()
    (out / "slow.json").write_text(json.dumps(["tests/test_b.py::test_only_in_the_full_run"]))
    (repository / "warm-unit.xml").write_text(PASS_1.replace('time="0.4"', 'time="0.39"') + "")
    (repository / "warm-unit-float64.xml").write_text(PASS_2)
    durations.main([str(repository / "warm-unit.xml"), str(repository / "warm-unit-float64.xml"), "--add", "--warm",
                    "--out", str(out)])
    stored = json.loads((out / "slow.json").read_text())
    assert "tests/test_a.py::test_in_float64" in stored  # 1.2 s warm: over the warm bar, under the cold one
    assert "tests/test_a.py::test_quick" not in stored  # 0.39 s: just under the warm bar
    assert "tests/test_b.py::test_only_in_the_full_run" in stored and len(stored) == 7
    assert "(at least 0.4 s in these reports or in those before)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        durations.main([str(repository / "warm-unit.xml"), "--warm", "--out", str(out)])
    assert exit_info.value.code == 2 and "give --add with it" in capsys.readouterr().err
    assert json.loads((out / "slow.json").read_text()) == stored


FOREIGN = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="elsewhere.test_x" name="test_long" time="30.0"/>
<testcase classname="tests.test_gone" name="test_renamed" time="9.0"/>
</testsuite></testsuites>"""
FAST = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_quick" time="0.4"/>
<testcase classname="book.ch1_linear.01_ensembles.ipynb" name="01_ensembles.ipynb" time="40.0"/>
</testsuite></testsuites>"""


def test_main_never_overwrites_the_tables_with_an_empty_one(repository, capsys):
    # a report whose test cases name no file of the repository (another checkout, another layout),
    # alone or beside a good one, and a report with no unit test at the threshold, would each write
    # slow.json = []: every measured slow test back into `make unit`. Refused, the tables kept.
    out = repository / "out"
    out.mkdir()
    (out / "slow.json").write_text('["tests/test_a.py::test_kept"]\n')
    kept = {"slow.json": (out / "slow.json").read_text()}
    (repository / "foreign.xml").write_text(FOREIGN)
    (repository / "fast.xml").write_text(FAST)
    for argv, message in (
        (["foreign.xml"], r"foreign.xml`: none of its 2 test cases names a file under .*'elsewhere.test_x'"),
        (["tests.xml", "foreign.xml"], r"foreign.xml`: none of its 2 test cases"),
        (["fast.xml"], r"no unit test took at least 3 s in .*fast.xml.*slow.json left as it was"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            durations.main([*(str(repository / a) for a in argv), "--out", str(out)])
        assert exit_info.value.code == 2
        assert re.search(message, capsys.readouterr().err), message
        assert {name: (out / name).read_text() for name in kept} == kept


def test_main_refuses_to_overwrite_its_own_input(repository, capsys):
    # even a valid report stored where the script writes (a mistyped --out or report path)
    out = repository / "out"
    out.mkdir()
    (out / "slow.json").write_text(PASS_1)
    for argv in ([str(out / "slow.json")], [str(repository / "tests.xml"), str(out / ".." / "out" / "slow.json")]):
        with pytest.raises(SystemExit) as exit_info:
            durations.main([*argv, "--out", str(out)])
        assert exit_info.value.code == 2
        assert "this script's output: refusing to overwrite its own input" in capsys.readouterr().err
        assert (out / "slow.json").read_text() == PASS_1
    # a report stored beside it is read like any other
    (out / "copy.xml").write_text(PASS_1)
    durations.main([str(out / "copy.xml"), "--out", str(out)])
    assert len(json.loads((out / "slow.json").read_text())) == 4


def test_script_exits_non_zero_on_a_report_of_no_file(tmp_path):
    # as `python .ci/test_durations.py` runs: argparse's exit status 2, the output folder untouched
    (tmp_path / "foreign.xml").write_text(FOREIGN)
    (tmp_path / "slow.json").write_text("[\"x\"]\n")
    res = subprocess.run([sys.executable, str(ROOT / ".ci" / "test_durations.py"), str(tmp_path / "foreign.xml"),
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "none of its 2 test cases names a file" in res.stderr, res.stderr
    assert (tmp_path / "slow.json").read_text() == "[\"x\"]\n" and sorted(p.name for p in tmp_path.iterdir()) == [
        "foreign.xml", "slow.json"]


def test_stored_table_names_existing_tests():
    slow = json.loads((ROOT / "tests" / "slow.json").read_text())
    assert not (ROOT / "tests" / "durations.json").exists(), "retired: the order is worksteal's, notebooks first"
    assert slow == sorted(set(slow)) and all("::test" in node for node in slow)
    for node in slow:  # a renamed test would silently go back into `make unit`: regenerate the tables
        path, *_, name = node.split("::")
        assert (ROOT / path).is_file(), f"slow.json names a missing file: {node}"
        assert f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), f"slow.json names a missing test: {node}"


@pytest.mark.slow  # a second pytest process that imports jax (about 5 s)
def test_conftest_marks_the_measured_slow_tests_so_make_unit_leaves_them_out():
    slow = json.loads((ROOT / "tests" / "slow.json").read_text())
    # a measured test without a mark in its file: test_eager's warm-start matrix (27 s, issue 24)
    node = next(n for n in slow if n.startswith("tests/library/test_eager.py::test_warm_start_gradient_matches_cold_start["))
    source = (ROOT / "tests" / "library" / "test_eager.py").read_text()
    assert "@pytest.mark.slow" not in source.split("def test_warm_start_gradient_matches_cold_start")[0][-300:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS",)}
    listed = {}
    for selection in ("slow", "not slow"):
        res = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", selection,
             "tests/library/test_eager.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        listed[selection] = {line.strip() for line in res.stdout.splitlines() if "::" in line}
    assert node in listed["slow"] and node not in listed["not slow"]
    assert listed["not slow"], "every test of test_eager.py deselected"


class Item:
    """What conftest's collection hook reads of a pytest item."""

    def __init__(self, nodeid, root=ROOT, float64=False):
        self.nodeid, self.path, self.marks = nodeid, root / nodeid.split("::")[0], []
        self.float64 = float64

    def add_marker(self, mark):
        self.marks.append(mark.name)

    def get_closest_marker(self, name):
        return pytest.mark.float64.mark if name == "float64" and self.float64 else None


def test_the_float64_pass_imports_only_files_with_float64_tests_and_the_premise_is_checked(tmp_path, monkeypatch):
    # the second pass (-m "float64 ...") skips a test file without the marker's text; the first pass,
    # which collects every file, records a float64 test in a file without it (set some other way)
    import conftest

    class Config:
        def __init__(self, markexpr):
            self.markexpr = markexpr

        def getoption(self, name):
            return self.markexpr

    marked, unmarked = tmp_path / "test_marked.py", tmp_path / "test_unmarked.py"
    marked.write_text("import pytest\n\n\n@pytest.mark.float64\ndef test_a():\n    pass\n")
    unmarked.write_text("import pytest\n\nF = getattr(pytest.mark, 'float' + '64')\n\n\n@F\ndef test_b():\n    pass\n")
    for markexpr, skips_unmarked in (("float64 and not slow", True), ("float64", True), (" float64", True),
                                     ("not slow and not float64", False), ("not float64", False), ("", False),
                                     ("float64x", False), ("float64 or slow", False), ("float64 and (slow or x)", False)):
        config = Config(markexpr)
        assert conftest.pytest_ignore_collect(marked, config) is None, markexpr
        assert conftest.pytest_ignore_collect(unmarked, config) is (True if skips_unmarked else None), markexpr
        assert conftest.pytest_ignore_collect(tmp_path / "helpers.py", config) is None, markexpr
    monkeypatch.setattr(conftest, "MISPLACED_FLOAT64", [])
    conftest.pytest_collection_modifyitems(None, None, [Item("test_marked.py::test_a", tmp_path, float64=True),
                                                        Item("test_unmarked.py::test_c", tmp_path)])
    assert conftest.MISPLACED_FLOAT64 == []
    conftest.pytest_collection_modifyitems(None, None, [Item("test_unmarked.py::test_b", tmp_path, float64=True)])
    assert conftest.MISPLACED_FLOAT64 == ["test_unmarked.py::test_b"]


def test_no_float64_test_is_in_a_file_the_float64_pass_skips():
    # what this session's collection recorded (tests/conftest.py): in the float32 pass, which collects
    # every file, each float64 test found in a file without the marker's text
    import conftest

    assert conftest.MISPLACED_FLOAT64 == [], (
        f"marked float64 in a file without the text {conftest.FLOAT64_TEXT!r}, so the float64 pass does not "
        f"collect them: {conftest.MISPLACED_FLOAT64}; mark them with pytest.mark.float64 as written")


def test_conftest_puts_the_notebooks_first_and_keeps_every_other_order(monkeypatch):
    # with --dist worksteal an idle worker takes the end of the other's queue: long notebooks at the
    # end of the collected order made the run end on one of them (the reason for the old table)
    import conftest

    slow_node = "tests/library/test_b.py::test_slow"
    monkeypatch.setattr(conftest, "_load", lambda name, default: [slow_node] if name == "slow.json" else default)
    collected = ["tests/library/test_a.py::test_1", slow_node, "tests/library/test_a.py::test_2",
                 "book/ch1/02_page.ipynb::", "tests/book/test_c.py::test_3", "book/ch0/01_page.ipynb::"]
    items = [Item(nodeid) for nodeid in collected]
    conftest.pytest_collection_modifyitems(None, None, items)
    assert [i.nodeid for i in items] == [collected[3], collected[5], collected[0], collected[1], collected[2],
                                         collected[4]]
    assert [i.nodeid for i in items if i.marks] == [slow_node] and items[3].marks == ["slow"]
    # every parallel run of the Makefile and of CI's floor phase shares the tests by worksteal
    for path in ("Makefile", ".ci/run"):
        runs = re.findall(r"pytest -n \S+( --dist worksteal)?", (ROOT / path).read_text())
        assert runs and all(runs), f"{path}: a `pytest -n` without `--dist worksteal`"


def test_unit_tests_compile_with_their_flags_and_notebooks_with_the_given_flags():
    # conftest appends the flags before JAX's backend starts (a flag set after `import jax` is still
    # read: the subprocess below fails on an unknown one); notebooks get the flags the run was given
    import conftest

    if os.environ.get("DEQLAB_TEST_XLA_DEFAULTS"):
        pytest.skip("DEQLAB_TEST_XLA_DEFAULTS=1 keeps XLA's defaults in the unit tests")
    assert os.environ["XLA_FLAGS"] == conftest.unit_test_xla_flags(conftest.GIVEN_XLA_FLAGS)
    unit_tests = os.environ["XLA_FLAGS"]
    with conftest.given_xla_flags():
        assert os.environ.get("XLA_FLAGS") == conftest.GIVEN_XLA_FLAGS
    assert os.environ.get("XLA_FLAGS") == unit_tests
    res = subprocess.run([sys.executable, "-c", "import os, jax; os.environ['XLA_FLAGS'] = "
                          "'--xla_no_such_flag_for_deqlab=1'; jax.devices()"],
                         capture_output=True, text=True, timeout=120, env={k: v for k, v in os.environ.items()
                                                                           if k != "XLA_FLAGS"})
    assert res.returncode != 0 and "xla_no_such_flag_for_deqlab" in res.stderr, res.stderr[-2000:]


def test_collecting_the_tests_leaves_the_environment_as_it_was():
    # the notebooks' kernels inherit the environment of the worker that runs them, after it has
    # imported every test module: a module that changes the environment on import changes the
    # notebooks' run (benchmarks/compile.py removed JAX_COMPILATION_CACHE_DIR, and no notebook of
    # `make test` or CI ever used JAX's persistent cache)
    import conftest

    assert conftest.ENVIRONMENT_CHANGED_BY_COLLECTION == []


def test_no_benchmark_module_changes_the_environment_when_imported(monkeypatch):
    # the check above sees a removed variable only in a run that sets it (make test and CI set the
    # cache folder; a plain `pytest` does not): each benchmark module is executed again here, under
    # a name of its own, with the variable set
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(ROOT / "_build" / "no-such-cache"))
    import conftest

    modules = sorted((ROOT / "benchmarks").glob("*.py"))
    assert len(modules) > 10
    for path in modules:
        before = dict(os.environ)
        spec = importlib.util.spec_from_file_location(f"_environment_probe_{path.stem}", path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        assert conftest.environment_changes(before, os.environ) == [], path.name


LEVEL_0, OLD_EMITTERS = "--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false"


@pytest.mark.parametrize("given, expected", [
    (None, f"{LEVEL_0} {OLD_EMITTERS}"),
    ("", f"{LEVEL_0} {OLD_EMITTERS}"),
    ("--xla_backend_optimization_level=2", f"--xla_backend_optimization_level=2 {OLD_EMITTERS}"),
    ("--xla_cpu_use_fusion_emitters=true", f"--xla_cpu_use_fusion_emitters=true {LEVEL_0}"),
    (f"{OLD_EMITTERS} --xla_backend_optimization_level=3", f"{OLD_EMITTERS} --xla_backend_optimization_level=3"),
    ("--xla_force_host_platform_device_count=8", f"--xla_force_host_platform_device_count=8 {LEVEL_0} {OLD_EMITTERS}"),
    # a flag is recognised by its whole name, not by a prefix or by text inside another flag's value
    ("--xla_backend_optimization_level_x=1 --xla_dump_hlo_pass_re=xla_cpu_use_fusion_emitters",
     f"--xla_backend_optimization_level_x=1 --xla_dump_hlo_pass_re=xla_cpu_use_fusion_emitters {LEVEL_0} "
     f"{OLD_EMITTERS}"),
])
def test_unit_test_flags_are_appended_unless_the_run_gives_its_own(given, expected):
    import conftest

    assert set(conftest.UNIT_TEST_XLA_FLAGS) == {LEVEL_0, OLD_EMITTERS}
    assert conftest.unit_test_xla_flags(given) == expected


@pytest.mark.slow  # a pytest run on two workers that starts a notebook kernel (about 10 s)
def test_a_notebook_kernel_starts_without_the_unit_tests_flag_and_with_the_compilation_cache(tmp_path):
    # the notebooks are collected from book/, outside tests/, where this folder's conftest hooks do
    # not reach: the restore is a plugin (a first version was a conftest hook, and CI's notebooks
    # ran at level 0). The probe notebook fails if its kernel sees either of the unit tests' flags,
    # or not the run's compilation cache folder: the run also collects the benchmarks' smoke tests,
    # whose modules once removed it on import (no notebook of make test or CI used the cache).
    pytest.importorskip("nbmake")
    cache = str(tmp_path / "jax-cache")
    probe = tmp_path / "probe.ipynb"
    probe.write_text(json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "id": "probe", "metadata": {}, "outputs": [],
                   "source": ["import os\n", "flags = os.environ.get('XLA_FLAGS') or ''\n",
                              "assert 'xla_backend_optimization_level' not in flags, flags\n",
                              "assert 'xla_cpu_use_fusion_emitters' not in flags, flags\n",
                              f"assert os.environ.get('JAX_COMPILATION_CACHE_DIR') == {cache!r}, os.environ\n"]}],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5}))
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "DEQLAB_GIVEN_XLA_FLAGS",
                                                             "DEQLAB_TEST_XLA_DEFAULTS", "PYTEST_ADDOPTS")}
    env["JAX_COMPILATION_CACHE_DIR"] = cache
    # two xdist workers, as `make test` runs (the workers inherit the controller's environment)
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--rootdir", str(ROOT), "-c",
         str(ROOT / "pyproject.toml"), "--nbmake", str(probe),
         "tests/book/test_test_durations.py::test_stored_table_names_existing_tests",
         "tests/library/test_benchmarks_smoke.py::test_growth_exponent_recovers_a_power_law"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "3 passed" in res.stdout, res.stdout[-3000:] + res.stderr[-2000:]
