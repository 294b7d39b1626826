"""The seeds the power analysis asks for, where a page's prose types them in, are the stored ones.

The pages that show a medium-scale result say how many seeds the power analysis
(``book/_data/power_analysis.json``, :mod:`deqlab.lab.experiments.power`) needs for their claims.
Those numbers are typed into the prose rather than glued, because on Colab the page runs without
``book/_data`` (only the installed package is there). This test ties each of them to the stored
analysis, so that rerunning it (``make power-analysis``) and forgetting the prose fails here.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANALYSIS = ROOT / "book" / "_data" / "power_analysis.json"


def _markdown(page: str) -> str:
    notebook = json.loads((ROOT / page).read_text())
    return " ".join(" ".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown")


def _claims(page: str) -> list[dict]:
    claims = [c for c in json.loads(ANALYSIS.read_text())["claims"] if c.get("page") == page]
    assert claims, f"no claim of {page} in {ANALYSIS.name}"
    return claims


def _typed(page: str, pattern: str) -> tuple[str, ...]:
    match = re.search(pattern, re.sub(r"\s+", " ", _markdown(page)))
    assert match, f"{page}: the prose no longer matches {pattern!r}: update this test with it"
    return match.groups()


CH3P5 = "book/ch3_nonlinear/05_training.ipynb"
CH3P6 = "book/ch3_nonlinear/06_stabilisation.ipynb"
CH4P5 = "book/ch4_kglm/05_denoising.ipynb"


def test_chapter_3_page_5_quotes_the_stored_seed_counts():
    at_1, at_15, at_2 = _typed(CH3P5, r"needs (\d+) seeds at \$\\sqrt V = 1\$ and (\d+) at 1\.5 .*? and (\d+) at "
                                      r"\$\\sqrt V = 2\$")
    stored = {c["claim"].rsplit("= ", 1)[1]: int(c["seeds_needed"]) for c in _claims(CH3P5)}
    assert (int(at_1), int(at_15), int(at_2)) == (stored["1"], stored["1.5"], stored["2"]), stored


def test_chapter_3_page_6_quotes_the_largest_seed_count_for_steps_and_radius():
    (at_most,) = _typed(CH3P6, r"for the solver steps and the monitored radius it is at most (\d+)")
    stored = [int(c["seeds_needed"]) for c in _claims(CH3P6)
              if "solver steps" in c["claim"] or "monitored radius" in c["claim"]]
    assert int(at_most) == max(stored), stored


def test_chapter_4_page_5_quotes_the_stored_seed_count_and_effect():
    seeds, effect = _typed(CH4P5, r"needs (\d+) seeds to resolve .*? an epoch-5 effect of ([0-9.]+) in log test MSE")
    (claim,) = [c for c in _claims(CH4P5) if "epoch 5" in c["claim"]]
    assert int(seeds) == int(claim["seeds_needed"])
    assert float(effect) == pytest.approx(claim["effect_used"], abs=5e-3)
