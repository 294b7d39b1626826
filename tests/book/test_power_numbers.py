"""The seeds the power analysis asks for, where a page's prose types them in, are the stored ones.

The pages that show a medium-scale result say how many seeds the power analysis
(``book/_data/power_analysis.json``, :mod:`deqlab.lab.experiments.power`) needs for their claims, and
at which level and power it sizes them (80 % power of the two-sided t-test at the page's Bonferroni
level ``alpha / m``). Those numbers are typed into the prose rather than glued, because on Colab the
page runs without ``book/_data`` (only the installed package is there). This test ties each of them
to the stored analysis (and, where the prose compares them with a stored medium run's seeds, to
``deqlab/lab/medium_results``), so that rerunning it (``make power-analysis``) and forgetting the prose
fails here.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANALYSIS = ROOT / "book" / "_data" / "power_analysis.json"
MEDIUM = ROOT / "deqlab" / "lab" / "medium_results"
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
         "eleven": 11, "twelve": 12}


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


def _number(text: str) -> int:
    return WORDS[text] if text in WORDS else int(text)


def _sizing(page: str) -> None:
    """The prose's "80 % power ... at the Bonferroni level 0.05/m" is the analysis's power, alpha and family."""
    power, alpha, family = _typed(page, r"(\d+) % power of the two-sided t-test of the per-seed differences at the "
                                        r"Bonferroni level ([0-9.]+)/(\d+)")
    for c in _claims(page):
        assert (int(power), float(alpha), int(family)) == (round(100 * c["power"]), c["alpha"], c["family"]), c
    # every level the prose types ("at the level 0.05/3"), the medium run's included, is the page's family's
    key = {CH3P5: "ch3p5", CH3P6: "ch3p6", CH4P5: "ch4p5"}[page]
    medium = json.loads((MEDIUM / f"{key}.json").read_text())["claims"]
    levels = re.findall(r"\b(0\.\d+)/(\d+)\b", re.sub(r"\s+", " ", _markdown(page)))
    assert levels, page
    for level, m in levels:
        assert float(level) == 0.05 and {int(m)} == {c["family"] for c in _claims(page) + medium}, (level, m)


CH3P5 = "book/ch3_nonlinear/05_training.ipynb"
CH3P6 = "book/ch3_nonlinear/06_stabilisation.ipynb"
CH4P5 = "book/ch4_kglm/05_denoising.ipynb"


def test_chapter_3_page_5_quotes_the_stored_seed_counts():
    _sizing(CH3P5)
    (count,) = _typed(CH3P5, r"all (\w+) differences point against the claim")
    at_1, at_15, at_2 = _typed(CH3P5, r"needs (\d+) seeds at \$\\sqrt V = 1\$ and (\d+) at 1\.5 .*? and (\d+) at "
                                      r"\$\\sqrt V = 2\$")
    claims = _claims(CH3P5)
    assert _number(count) == len(claims) and all(c["effect_used"] < 0 and c["paper_effect"] is None for c in claims)
    stored = {c["claim"].rsplit("= ", 1)[1]: int(c["seeds_needed"]) for c in claims}
    assert (int(at_1), int(at_15), int(at_2)) == (stored["1"], stored["1.5"], stored["2"]), stored
    # "its ... seeds are the largest of the three sizes" (the medium run is sized by the analysis)
    assert "seeds are the largest of the three sizes" in re.sub(r"\s+", " ", _markdown(CH3P5))
    medium_seeds = json.loads((MEDIUM / "ch3p5.json").read_text())["options"]["seeds"]
    assert medium_seeds == max(stored.values()), (medium_seeds, stored)


def test_chapter_3_page_6_quotes_the_seed_counts_for_steps_and_radius():
    _sizing(CH3P6)
    n_for, at_most, n_against, low, high = _typed(
        CH3P6, r"For the (\w+) claims whose quick effect points the claimed way it asks for at most (\d+) seeds; "
               r"for the (\w+) whose quick effect points against the claim .*? from (\d+) to (\d+)")
    claims = [c for c in _claims(CH3P6) if "solver steps" in c["claim"] or "monitored radius" in c["claim"]]
    assert len(claims) == len(_claims(CH3P6))
    way = [int(c["seeds_needed"]) for c in claims if c["effect_used"] > 0]
    against = [int(c["seeds_needed"]) for c in claims if c["effect_used"] < 0]
    assert (_number(n_for), _number(n_against)) == (len(way), len(against))
    assert int(at_most) == max(way), way
    assert (int(low), int(high)) == (min(against), max(against)), against


def test_chapter_4_page_5_quotes_the_stored_seed_count_and_effect():
    _sizing(CH4P5)
    seeds, effect = _typed(CH4P5, r"needs (\d+) seeds to resolve\b.*?\ban epoch-5 effect of ([0-9.]+) in log test MSE")
    (claim,) = [c for c in _claims(CH4P5) if "epoch 5" in c["claim"]]
    assert int(seeds) == int(claim["seeds_needed"])
    assert float(effect) == pytest.approx(claim["effect_used"], abs=5e-3)
    assert claim["effect_basis"] == "paper"
