"""The browser test of the built site (.ci/check_site.py) finds each kind of defect it is meant to find.

It runs the checker's command line, in headless Chromium, on the fixture pages of
tests/book/site_fixtures/: one clean page (nothing may be reported) and one page per defect (each defect
must be reported, naming the page and the element). The pages load the MathJax the book vendors
(book/_static/mathjax), so the MathJax checks run against the same build as the site.

Needs chromium, chromedriver and selenium. Without them the browser tests are skipped with a one-line
reason, so that the README's `make test` passes on a machine with nothing but Python and make (a
laptop, a JupyterHub without root); under CI (`CI=true`) or with `DEQLAB_REQUIRE_BROWSER=1` a
missing browser is an error, with the command that installs it (.ci/run installs it and sets the
variable). `$CHROMIUM` / `$CHROMEDRIVER` name other binaries, as for .ci/check_site.py.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKER = ROOT / ".ci" / "check_site.py"
FIXTURES = Path(__file__).resolve().parent / "site_fixtures"
MATHJAX = ROOT / "book" / "_static" / "mathjax"

# (page, text the element part must contain, text the problem part must contain)
EXPECTED = [
    ("leaked_pipe_table.html", 'p in section #results "| n | error |', "pipe table rendered as text"),
    ("leaked_glue.html", 'p in section #rates "The measured rate is {glue:text}', "MyST role {glue:text}"),
    ("leaked_backtick.html", 'p in section #erratum "`"', "leaked Markdown: backtick"),
    ("leaked_fence.html", 'p in section #notes ":::{note}', "leaked Markdown: ::: fence"),
    ("broken_image.html", 'img[src="missing.png"] in section #figures', "image did not load"),
    ("broken_image.html", "console", "SITE/missing.png - Failed to load resource"),
    ("mathjax_error.html", 'formula "x^2^3"', "MathJax error: Double exponent"),
    ("mathjax_error.html", 'formula "\\\\notamacro x"', "MathJax: undefined macro \\notamacro"),
    # Unbalanced braces: MathJax does not even find the end of the formula.
    ("mathjax_error.html", 'span.math.notranslate in section #formulas "\\\\(\\\\frac{1}{n', "not typeset"),
    ("console_error.html", "console", "Uncaught Error: fixture: deliberate failure"),
    ("uncaptioned_figure.html", "figure#fig-uncaptioned in section #plots", "without a number and caption"),
    ("uncaptioned_figure.html", 'img[src="data:image/png', "notebook output image outside a numbered figure"),
    ("untypeset_math.html", 'span.math.notranslate in section #maths "\\\\(x^2', "formula not typeset"),
    ("untypeset_math.html", 'td in section #maths "\\\\(\\\\rho', 'raw TeX not typeset: "\\\\("'),
    ("wide_page.html", "p in section #layout", "in a 1400 px window (it scrolls sideways)"),
    ("wide_page.html", "p in section #layout", "in a 390 px window (it scrolls sideways)"),
    # A table that fits only in a scroll box, and its caption cut at the column's edge, at both widths.
    ("wide_table.html", "table#table-wide", "px text column (1400 px window): content wider than its box"),
    ("wide_table.html", 'span.caption-text in section #tables "A caption that does not wrap',
     "px text column (1400 px window): content wider than its box"),
    ("wide_table.html", "table#table-wide", "px text column (390 px window): content wider than its box"),
    ("wide_table.html", 'span.caption-text in section #tables "A caption that does not wrap',
     "px text column (390 px window): content wider than its box"),
    ("missing_buttons.html", "edit button", "no link to https://github.com/example/book/edit/<branch>/<page>"),
    ("search.html?q=absent", "#search-results", "no results for 'absent'"),
]

#: What a newcomer without a browser reads in pytest's summary (one line, for all the tests).
SKIP_REASON = "no chromium: the browser test of the built site is skipped; CI runs it"


def browser_required() -> bool:
    """CI, or a developer who asked for it, must not skip the browser test."""
    truthy = ("1", "true", "yes")
    return (os.environ.get("CI", "").lower() in truthy
            or os.environ.get("DEQLAB_REQUIRE_BROWSER", "").lower() in truthy)


def find_browser() -> tuple[str, str]:
    """The chromium and chromedriver binaries the checker will use; skips or fails without them."""
    chromium = shutil.which(os.environ.get("CHROMIUM", "chromium"))
    chromedriver = shutil.which(os.environ.get("CHROMEDRIVER", "chromedriver"))
    missing = [name for name, path in (("chromium", chromium), ("chromedriver", chromedriver)) if path is None]
    if importlib.util.find_spec("selenium") is None:
        missing.append("selenium (pip install -e '.[test]')")
    if missing and not browser_required():
        pytest.skip(SKIP_REASON)
    if missing:
        pytest.fail(
            "the browser test needs "
            + ", ".join(missing)
            + "; install the browser with: apt-get install chromium chromium-driver "
            "(CI or DEQLAB_REQUIRE_BROWSER=1: a missing browser is an error)",
            pytrace=False,
        )
    return chromium, chromedriver


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """Runs the checker once on a copy of the fixture pages; returns (exit code, output, problems)."""
    chromium, chromedriver = find_browser()
    site = tmp_path_factory.mktemp("site")
    for page in FIXTURES.iterdir():
        shutil.copy(page, site / page.name)
    shutil.copytree(MATHJAX, site / "_static" / "mathjax")
    screenshots = tmp_path_factory.mktemp("screenshots")
    run = subprocess.run(
        [sys.executable, str(CHECKER), str(site), "--screenshots", str(screenshots),
         "--search-terms", "fixture,absent", "--repository", "https://github.com/example/book",
         "--widths", "1400,390", "--chromium", chromium, "--chromedriver", chromedriver],
        capture_output=True, text=True, timeout=300,
    )
    problems = []
    for line in run.stdout.splitlines():
        # "  page: element: problem"; elements and problems may contain ": " themselves, so the
        # expectations below match the whole line.
        if line.startswith("  ") and ": " in line:
            problems.append(line.strip())
    return run.returncode, run.stdout + run.stderr, problems, screenshots


@pytest.mark.slow
def test_clean_page_passes(checked):
    returncode, output, problems, screenshots = checked
    assert "[site] clean.html: 0 problem(s)" in output, output
    assert not [p for p in problems if p.startswith("clean.html:")], output
    assert not [p for p in problems if p.startswith("search.html?q=fixture:")], output
    shot = screenshots / "clean.png"
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", output


@pytest.mark.slow
@pytest.mark.parametrize(("page", "element", "problem"), EXPECTED, ids=[f"{p}-{q}" for p, _, q in EXPECTED])
def test_defect_is_reported(checked, page, element, problem):
    returncode, output, problems, _ = checked
    assert returncode == 1, output
    matches = [p for p in problems if p.startswith(page + ": ") and element in p and problem in p]
    assert matches, f"expected {page}: ...{element}...: ...{problem}... in\n{output}"


@pytest.mark.slow
def test_nothing_else_is_reported(checked):
    """No false alarms: every problem reported is one of the expected defects."""
    _, output, problems, _ = checked
    unexpected = [
        p for p in problems
        if not any(p.startswith(page + ": ") and element in p and problem in p for page, element, problem in EXPECTED)
    ]
    assert not unexpected, "\n".join(unexpected)
    assert len(problems) == len(EXPECTED), output


def test_every_fixture_page_is_expected():
    """Each defect page of the fixtures is listed in EXPECTED (a new fixture needs an expectation)."""
    pages = {p.name for p in FIXTURES.glob("*.html")} - {"clean.html", "search.html"}
    assert pages == {page for page, _, _ in EXPECTED if page.endswith(".html")}
