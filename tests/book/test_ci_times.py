"""`.ci/run` writes its phases' times to `_build/ci-logs/times.json` and warns past 45 minutes
(issue 39): its `write_times` function, run on its own with made-up phases, writes valid JSON."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _function(name: str) -> str:
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    match = re.search(rf"^{name}\(\) \{{.*?^\}}$", text, re.MULTILINE | re.DOTALL)
    assert match, f"{name} not found in .ci/run"
    return match.group(0)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash (what .ci/run runs in)")
@pytest.mark.parametrize("failed_in", ["", "book"])
def test_times_json_names_each_phase_and_the_total(tmp_path, failed_in):
    script = "\n".join([
        _function("write_times"),
        f"LOGS={tmp_path}", "WARN_TOTAL_SECS=2700", f"PHASE={failed_in!r}",
        "PHASE_NAMES=(install test)", "PHASE_SECS=(47 1802)",
        "write_times 1975 2",
    ])
    subprocess.run(["bash", "-c", script], check=True)
    times = json.loads((tmp_path / "times.json").read_text(encoding="utf-8"))
    assert times["phases"] == {"install": 47, "test": 1802}
    assert (times["total"], times["exit_code"], times["warn_above"]) == (1975, 2, 2700)
    assert times.get("failed_in") == (failed_in or None)


def test_the_report_warns_past_the_threshold():
    report = _function("report")
    assert "write_times" in report and "WARN_TOTAL_SECS" in report and "WARNING" in report
    assert re.search(r"^WARN_TOTAL_SECS=2700$", (ROOT / ".ci" / "run").read_text(encoding="utf-8"), re.MULTILINE)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash (what .ci/run runs in)")
def test_background_phases_are_awaited_timed_and_fail_the_run(tmp_path):
    """`background` runs phases beside the others and `await` records each phase's own seconds and
    prints its log; a phase that fails makes `await` fail (ending the run under `set -e`) without
    running the phases after it in the job."""
    script = "\n".join([
        "set -euo pipefail",
        f"LOGS={tmp_path}", "declare -a SUMMARY=() PHASE_NAMES=() PHASE_SECS=()", "declare -A BG_PIDS=()",
        "PHASE=''", "PHASE_START=0",
        _function("background"), _function("await"),
        "phase_one() { echo one-output; }",
        "phase_two() { echo two-output; false; }",
        "phase_three() { echo three-output; }",
        "background good one",
        "background bad two three",
        "await good one",
        'echo "names=${PHASE_NAMES[*]}"',
        "await bad two three || echo \"bad-failed PHASE=$PHASE\"",
    ])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    assert "one-output" in out and "[ci] one took 0s (in the background)" in out, out
    assert "names=one" in out, out
    assert "two-output" in out and "bad-failed PHASE=bad (background)" in out, out
    assert "three-output" not in out and not (tmp_path / "three.log").exists(), out
    assert not (tmp_path / "two.secs").exists()
