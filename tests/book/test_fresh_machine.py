"""`make test` on a machine with nothing but Python and make: tests that need a system package skip.

The README promises that its two commands need Python 3.11+ (with `venv`) and `make` only. The
browser test of the built site (tests/book/test_site_check.py) needs Chromium, which CI installs
(.ci/run) and a newcomer's laptop lacks: there it must be reported as skipped, with its reason,
never as an error. Under CI (`CI=true`) or with `DEQLAB_REQUIRE_BROWSER=1` the same missing
browser must be an error, so CI cannot skip the check it exists to run.

Each case runs the browser test module in a second pytest process whose `PATH` holds only the
Python interpreter's folder (no chromium, no chromedriver) and whose environment has no `CI`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE_TESTS = ROOT / "tests" / "book" / "test_site_check.py"

sys.path.insert(0, str(ROOT / "tests" / "book"))
from test_site_check import EXPECTED, SKIP_REASON  # noqa: E402

sys.path.pop(0)

#: The tests of test_site_check.py that drive the browser: test_clean_page_passes,
#: test_nothing_else_is_reported and one test_defect_is_reported per expected defect.
BROWSER_TESTS = len(EXPECTED) + 2


def _run_without_browser(tmp_path: Path, **extra_env: str) -> subprocess.CompletedProcess:
    bare = tmp_path / "bin"  # a PATH with nothing but a link to this interpreter
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    drop = ("CI", "DEQLAB_REQUIRE_BROWSER", "CHROMIUM", "CHROMEDRIVER", "PYTHONPATH", "PYTEST_ADDOPTS")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PYTEST_XDIST")}
    env.update(PATH=str(bare), **extra_env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist",
         str(SITE_TESTS)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )


def _counts(output: str) -> dict[str, int]:
    summary = [line for line in output.splitlines() if re.search(r"\d+ (passed|skipped|failed|error)", line)]
    assert summary, output[-3000:]
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|skipped|failed|errors?)", summary[-1])}


@pytest.mark.slow  # two pytest processes, each importing jax (about 5 s each)
def test_browser_tests_skip_cleanly_without_a_browser(tmp_path):
    run = _run_without_browser(tmp_path)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    counts = _counts(output)
    assert counts.get("skipped") == BROWSER_TESTS, output[-3000:]
    assert counts.get("passed") == 1, output[-3000:]  # the fixture list needs no browser
    assert not counts.get("failed") and not counts.get("error") and not counts.get("errors"), output[-3000:]
    # the reason a newcomer reads in pytest's short summary: one line per test function, each
    # giving the reason, together covering every browser test
    skipped = re.findall(r"^SKIPPED \[(\d+)\] tests/book/test_site_check\.py:\d+: (.*)$", output, re.MULTILINE)
    assert skipped and {reason for _, reason in skipped} == {SKIP_REASON}, output[-3000:]
    assert sum(int(n) for n, _ in skipped) == BROWSER_TESTS, output[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("variable", ["CI", "DEQLAB_REQUIRE_BROWSER"])
def test_a_missing_browser_is_an_error_where_required(tmp_path, variable):
    run = _run_without_browser(tmp_path, **{variable: "true" if variable == "CI" else "1"})
    output = run.stdout + run.stderr
    assert run.returncode != 0, output[-3000:]
    counts = _counts(output)
    assert counts.get("skipped", 0) == 0, output[-3000:]
    assert counts.get("errors", counts.get("error", 0)) == BROWSER_TESTS, output[-3000:]
    assert "apt-get install chromium chromium-driver" in output, output[-3000:]


@pytest.mark.slow
def test_site_check_without_a_browser_says_how_to_get_one(tmp_path):
    """`make site-check` runs .ci/check_site.py: without a browser it exits non-zero with the fix."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<html><body><p>page</p></body></html>")
    env = {k: v for k, v in os.environ.items() if k not in ("CHROMIUM", "CHROMEDRIVER")}
    run = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "check_site.py"), str(site),
         "--chromium", str(tmp_path / "no-chromium"), "--chromedriver", str(tmp_path / "no-chromedriver")],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode != 0
    assert "apt-get install chromium chromium-driver" in run.stdout + run.stderr, run.stdout + run.stderr
