"""The seeds the power analysis asks for, as the pages state them, are the stored ones.

The pages that show a medium-scale result say how many seeds the power analysis
(``book/_data/power_analysis.json``, :mod:`deqlab.lab.experiments.power`) needs for their claims, and
at which level and power it sizes them (80 % power of the two-sided t-test at the page's Bonferroni
level ``alpha / m``). On Colab the page runs without ``book/_data`` (only the installed package is
there), so the level and power are typed, and the seed counts are glued from the stored medium run's
own record of its sizing (``medium.sizing``, stored with the result) or its options. This test ties
the typed numbers and the stored sizing to the analysis, so that rerunning it (``make power-analysis``)
without rerunning the medium runs, or forgetting the prose, fails here.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANALYSIS = ROOT / "book" / "_data" / "power_analysis.json"
MEDIUM = ROOT / "deqlab" / "lab" / "medium_results"


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


def _sizing(page: str) -> None:
    """The prose's "80 % power ... at the Bonferroni level 0.05/m" is the analysis's power, alpha and family."""
    power, alpha, family = _typed(page, r"(\d+) % power (?:of|against that difference, for) the two-sided t-test of "
                                        r"the per-seed differences at the Bonferroni level ([0-9.]+)/(\d+)")
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


def _stored_sizing(page: str, key: str) -> dict:
    """The stored medium run's record of its sizing is the analysis's, and its seeds are the most it asks for."""
    record = json.loads((MEDIUM / f"{key}.json").read_text())
    sized = {c["claim"]: c for c in record["sizing"]["claims"]}
    analysed = {c["claim"]: c for c in _claims(page)}
    assert set(sized) == set(analysed), key
    for claim, c in analysed.items():
        for field in ("effect_used", "sd_used", "seeds_needed", "alpha", "power", "family"):
            assert sized[claim][field] == pytest.approx(c[field]), (claim, field)
    assert record["options"]["seeds"] == max(c["seeds_needed"] for c in analysed.values())
    return record


def test_chapter_3_page_5_glues_the_stored_sizing():
    _sizing(CH3P5)
    _stored_sizing(CH3P5, "ch3p5")
    # sized against the stated smallest effect of interest (001 gives no number), and the prose glues it
    assert all(c["effect_basis"].startswith("smallest effect of interest") for c in _claims(CH3P5))
    prose = _markdown(CH3P5)
    for name in ("ch3p5_sesoi_basis", "ch3p5_sizing_spread", "ch3p5_sizing_seeds", "ch3p5_medium_seeds"):
        assert f"{{glue:text}}`{name}" in prose, name


def test_chapter_3_page_6_glues_the_stored_sizing():
    _sizing(CH3P6)
    _stored_sizing(CH3P6, "ch3p6")
    assert all(c["effect_basis"].startswith("smallest effect of interest") for c in _claims(CH3P6))
    prose = _markdown(CH3P6)
    for name in ("ch3p6_sesoi_steps", "ch3p6_sesoi_radius", "ch3p6_sizing_spread", "ch3p6_sizing_min",
                 "ch3p6_sizing_max", "ch3p6_medium_seeds"):
        assert f"{{glue:text}}`{name}" in prose, name


def test_chapter_4_page_5_glues_the_stored_seed_count_and_effect():
    _sizing(CH4P5)
    (claim,) = [c for c in _claims(CH4P5) if "epoch 5" in c["claim"]]
    record = json.loads((MEDIUM / "ch4p5.json").read_text())
    assert record["options"]["seeds"] == int(claim["seeds_needed"]) and claim["effect_basis"] == "paper"
    (stored,) = [c for c in record["claims"] if "epoch 5" in c["claim"]]
    assert stored["effect_used"] == pytest.approx(claim["effect_used"])
    prose = re.sub(r"\s+", " ", _markdown(CH4P5))
    assert re.search(r"needs \{glue:text\}`ch4p5_medium_seeds` seeds to resolve\b.*?\ban epoch-5 effect of "
                     r"\{glue:text\}`ch4p5_medium_proxy", prose)


def test_a_rerun_of_the_analysis_keeps_the_spreads_the_stored_runs_were_sized_with():
    # power.main sizes with power.frozen_spreads(out) unless --resize: after the medium runs are stored,
    # stored_spreads() returns *their* spreads (for the next runs), and a plain rerun must still reproduce the
    # seeds the stored runs were run at. The frozen spread and stated effect give back every SESOI-sized claim's
    # seeds_needed at its Bonferroni level, and the stored runs' spreads would size them differently.
    from deqlab.lab.experiments import power

    frozen = power.frozen_spreads(ANALYSIS)
    sized = [c for c in json.loads(ANALYSIS.read_text())["claims"] if c["claim"] in frozen]
    assert {c["page"] for c in sized} == {CH3P5, CH3P6}, "the SESOI-sized pages' claims are frozen"
    for c in sized:
        assert frozen[c["claim"]]["sd"] == c["sd_used"]
        needed = power.seeds_for_power(c["effect_used"], frozen[c["claim"]]["sd"], paired=c["paired"],
                                       alpha=c["alpha"] / c["family"], power=c["power"])
        assert needed == c["seeds_needed"], c["claim"]
    now = power.stored_spreads()
    assert any(now[claim]["sd"] != frozen[claim]["sd"] for claim in frozen), "the stored runs have spreads of their own"
