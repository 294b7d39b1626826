"""The compile counter of the tests (tests/compile_counter.py) and `make test-profile`'s report
(.ci/test_profile.py): what they count, and that they fail loudly on an empty report."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import jax
import jax.numpy as jnp
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _profile_module():
    spec = importlib.util.spec_from_file_location("test_profile_script", ROOT / ".ci" / "test_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_counter_sees_one_program_per_new_signature(compile_counter):
    double = jax.jit(lambda x: 2 * x + 1)
    three, other_three, four = jnp.ones(3), jnp.zeros(3), jnp.ones(4)  # (creating them compiles too)
    with compile_counter() as first:
        double(three).block_until_ready()
    with compile_counter() as again:  # the same shape: JAX's in-memory cache, nothing compiled
        double(other_three).block_until_ready()
    with compile_counter() as other:  # a new shape: a new program
        double(four).block_until_ready()
    assert (first.programs, again.programs, other.programs) == (1, 0, 1)
    assert first.seconds > 0 and again.seconds == 0


def test_the_profile_totals_and_ranks(tmp_path):
    report = tmp_path / "compiles.jsonl"
    rows = [dict(nodeid="tests/a.py::test_x", compiles=5, cache_hits=1, compile_seconds=2.0, seconds=3.0),
            dict(nodeid="tests/a.py::test_y", compiles=1, cache_hits=0, compile_seconds=0.5, seconds=1.0),
            dict(nodeid="tests/b.py::test_z", compiles=9, cache_hits=0, compile_seconds=1.0, seconds=4.0)]
    report.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n", encoding="utf-8")
    profile = _profile_module()
    text = profile.summary(profile.load(str(report)), top=2)
    assert text.splitlines()[0] == ("3 tests: 15 programs compiled (1 of them persistent-cache hits), "
                                    "4 s compiling, 8 worker-seconds in all")
    by_programs = text.split("top 2 tests by programs:")[1].splitlines()[1:3]
    assert "tests/b.py::test_z" in by_programs[0] and "tests/a.py::test_x" in by_programs[1]
    assert "tests/a.py\n" in text.split("top 2 files by compile seconds:")[1].splitlines()[1] + "\n"


def test_the_profile_refuses_an_empty_or_missing_report(tmp_path, capsys):
    profile = _profile_module()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    assert profile.main([str(empty)]) == 2
    assert profile.main([str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "holds no test line" in err and "cannot read" in err
    with pytest.raises(SystemExit):
        profile.main([str(empty), "--top", "0"])


def test_the_counts_reach_the_junit_report(tmp_path):
    """The properties are added before the teardown report is made, so `make test`'s JUnit XML
    holds them (appended after the run, they would reach no report)."""
    import subprocess
    import sys
    import xml.etree.ElementTree as ET

    (tmp_path / "test_tiny.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "def test_compiles_one():\n"
        "    x = jnp.ones(5)\n"
        "    jax.jit(lambda v: v * 3 + 1)(x).block_until_ready()\n", encoding="utf-8")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("PYTEST_ADDOPTS", "DEQLAB_COMPILE_REPORT")}
    env["PYTHONPATH"] = str(ROOT / "tests")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "compile_counter", "-p", "no:cacheprovider",
                          "--junitxml", str(tmp_path / "report.xml"), str(tmp_path / "test_tiny.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    properties = {p.get("name"): p.get("value") for p in ET.parse(tmp_path / "report.xml").iter("property")}
    assert int(properties["compiles"]) >= 2  # jnp.ones and the jitted lambda
    assert set(properties) == {"compiles", "cache_hits", "compile_seconds"}
