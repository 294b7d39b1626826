"""The medium scale's store: run, provenance, staleness, and the stored results' own consistency."""

import functools
import json
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest

from deqlab.lab.experiments import medium, power


def _fake_stabilisation(options):
    # the collector's record shape (power_collect.collect_stabilisation) with made-up per-seed numbers:
    # "spectral" lowers both measures by a margin far above the spread, "shine" changes nothing
    rng = np.random.default_rng(0)
    n, first = options["seeds"], options.get("first_seed", 0)
    base = {"steps_last": list(20 + rng.normal(0, 1, n)), "radius_last": list(0.9 + rng.normal(0, 0.01, n)),
            "test_error": list(rng.uniform(0.1, 0.2, n))}
    cells = {"none@1.5": base, "none@2.5": base,
             "spectral@2.5": {k: list(np.asarray(vs) - (5 if k == "steps_last" else 0.2) + rng.normal(0, 1e-3, n))
                              for k, vs in base.items()},
             "shine@2.5": {k: list(np.asarray(vs) + rng.normal(0, 1e-3, n)) for k, vs in base.items()}}
    return {"page": "p", "driver": "d", "seconds": 0.5, "cells": cells,
            "settings": {"scales": [1.5, 2.5], "remedies": ["none", "spectral", "shine"],
                         "seeds": list(range(first, first + n))}}


def test_run_stores_provenance_and_verdicts(tmp_path):
    record = medium.run("ch3p6", tmp_path, collect=_fake_stabilisation)
    stored = json.loads((tmp_path / "ch3p6.json").read_text())
    assert stored == json.loads(json.dumps(record, default=float))
    prov = stored["provenance"]
    assert prov["deqlab_version"] and prov["date"] and prov["machine"]["cpus"] >= 1 and prov["wall_time_s"] >= 0
    assert stored["command"] == "OPENBLAS_NUM_THREADS=1 python -m deqlab.lab.experiments.medium ch3p6"
    assert stored["options"] == medium.settings("ch3p6") and stored["config_hash"] == medium.config_hash("ch3p6")
    verdicts = {c["claim"]: c["verdict"] for c in stored["claims"]}
    assert verdicts["ch3 p6 ranking: spectral lowers the forward solver steps, last epoch at sqrt(V) = 2.5"] == "holds"
    assert verdicts["ch3 p6 ranking: shine lowers the forward solver steps, last epoch at sqrt(V) = 2.5"] == "not resolved"
    # the power analysis's quick_* names are renamed for a medium run
    assert all("effect" in c and "lo" in c and "hi" in c and not any("quick" in k for k in c) for c in stored["claims"])


def test_load_flags_a_stale_result(tmp_path, monkeypatch):
    medium.run("ch3p6", tmp_path, collect=_fake_stabilisation)
    assert medium.load("ch3p6", tmp_path)["stale"] is False
    monkeypatch.setitem(medium.EXPERIMENTS["ch3p6"], "options", {"seeds": 17})
    assert medium.load("ch3p6", tmp_path)["stale"] is True


def test_a_change_to_the_drivers_configuration_changes_the_hash(monkeypatch):
    # ch5p6's collector runs the ensemble study's QUICK options, defined in the driver, not in its source
    from deqlab.lab.experiments.sequence import ensemble_study as es

    before = medium.config_hash("ch5p6")
    monkeypatch.setitem(es.QUICK, "embedding_std", 0.5)
    assert medium.config_hash("ch5p6") != before


def test_short_commit_keeps_dirty():
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert medium.short_commit(commit + "+dirty") == "0123456789+dirty"
    assert medium.short_commit(commit) == "0123456789"
    assert medium.short_commit(None) == medium.short_commit("") == "no commit"


def test_show_keeps_dirty_in_the_commit_it_glues(tmp_path, monkeypatch):
    # A run from a tree that differed from its commit says so on the page (the commit alone does
    # not reproduce it). The glued values are recorded (glue prints nothing in the book build).
    import deqlab.lab.experiments as experiments

    glued = {}
    monkeypatch.setattr(experiments, "glue", lambda name, value, display=True: glued.__setitem__(name, value))
    medium.run("ch3p6", tmp_path, collect=_fake_stabilisation)
    path = tmp_path / "ch3p6.json"
    for commit, shown in (("0123456789abcdef0123456789abcdef01234567+dirty", "(0123456789+dirty)"),
                          ("0123456789abcdef0123456789abcdef01234567", "(0123456789)"), (None, "(no commit)")):
        record = json.loads(path.read_text())
        record["provenance"]["git_commit"] = commit
        path.write_text(json.dumps(record))
        medium.show("ch3p6", "x", tmp_path)
        assert glued["x_medium_version"].endswith(shown), glued["x_medium_version"]


def test_pages_glue_the_stored_commit_with_short_commit():
    # Every page that glues a stored run's version does it through short_commit (directly or by
    # medium.show), so none drops "+dirty".
    import pathlib

    pages = sorted(pathlib.Path(__file__).resolve().parents[2].glob("book/*/*.ipynb"))
    gluing = [p for p in pages if "_medium_version" in p.read_text()]
    assert len(gluing) >= 3, gluing
    for page in gluing:
        text = page.read_text()
        assert not re.search(r"git_commit\\?[\"']\] or", text), page  # the hand-made label of before
        assert "short_commit(" in text or "medium.show(" in text, page


def test_bad_key_and_missing_result(tmp_path):
    with pytest.raises(ValueError, match="key"):
        medium.settings("ch9p9")
    with pytest.raises(FileNotFoundError, match="python -m deqlab.lab.experiments.medium ch3p6"):
        medium.load("ch3p6", tmp_path)
    with pytest.raises(SystemExit):
        medium.main(["ch9p9"])


STORED = sorted(set(medium.EXPERIMENTS) - set(medium.WITHDRAWN))
N_CH3P6 = medium.settings("ch3p6")["seeds"]  # the seeds of the fake ch3p6 runs below (the current settings)


@pytest.mark.parametrize("key", STORED)
def test_stored_results_are_current_and_consistent(key):
    # what the pages show: the stored result exists, was run with the current settings, and its verdicts
    # are what the power analysis's rule gives on its own per-seed numbers
    record = medium.load(key)
    assert not record["stale"], f"{key}: rerun `{record['command']}`"
    first = record["options"].get("first_seed", 0)
    assert record["raw"]["settings"]["seeds"] == list(range(first, first + record["options"]["seeds"]))
    # the recomputation load() made (memoised by the data: recomputing would double the test's time)
    again = medium._recomputed(key, record["raw"], lambda: power.claims_from_raw({key: record["raw"]}))
    assert [c["verdict_at_quick"] for c in again] == [c["verdict"] for c in record["claims"]]
    assert [c["claim"] for c in again] == [c["claim"] for c in record["claims"]]


RESOLVABLE_AT_MEDIUM = 1000
"""A claim needing this many seeds or more (thousands: its quick effect is nearly zero) is one the page
reports as not resolvable at medium scale; the run is sized for the others."""


@pytest.mark.parametrize("key", STORED)
def test_medium_sizes_are_the_power_analysis_sizes_on_fresh_seeds(key):
    # seeds: the largest seeds_needed (80 % power at the page's Bonferroni level, power.seeds_for_power) over the
    # page's claims resolvable at medium scale, as book/_data/power_analysis.json gives them; first_seed: past
    # every seed the power analysis's quick runs (the pilots that sized the runs) used
    import pathlib

    analysis = json.loads((pathlib.Path(__file__).resolve().parents[2] / "book" / "_data" /
                           "power_analysis.json").read_text())
    page = medium.EXPERIMENTS[key]["page"]
    own_rule = "sizing" in medium.EXPERIMENTS[key]  # sized by the page's own rule (ch5p6), not the analysis's rows
    claims = medium.sizing(key)["claims"] if own_rule else [c for c in analysis["claims"] if c["page"] == page]
    assert claims and all(c["power"] == 0.8 for c in claims), page
    needed = [c["seeds_needed"] for c in claims if c["seeds_needed"] is not None]
    resolvable = [n for n in needed if n < RESOLVABLE_AT_MEDIUM]
    options = medium.settings(key)
    assert options["seeds"] == max(resolvable), (key, options, needed)
    # a run sized against a smallest effect of interest at an earlier stored run's spread, or by the page's own
    # rule after its pilot, starts past the 10,000-series runs
    resized = own_rule or any(c["effect_basis"].startswith("smallest effect of interest") for c in claims)
    assert options["first_seed"] == (medium.RESIZED_SEED if resized else medium.FRESH_SEED)
    pilot = analysis["settings"][key]["settings"]["seeds"]
    assert medium.FRESH_SEED > max(pilot), pilot
    record = medium.load(key)  # the stored run: these settings, so its seeds are fresh too
    assert not record["stale"] and min(record["raw"]["settings"]["seeds"]) == options["first_seed"]


# ---------------------------------------------------------------------------------------------
# load() verifies a stored result against its own per-seed data, and names the file in every error
# ---------------------------------------------------------------------------------------------

_STEPS = "ch3 p6 ranking: spectral lowers the forward solver steps, last epoch at sqrt(V) = 2.5"


@functools.lru_cache(maxsize=1)
def _fake_ch3p6_text():
    # the fake ch3p6 run, made once per worker: it is deterministic, and the tests below differ only in what they
    # edit in it (each run recomputes every claim, ~0.25 s; test_run_stores_provenance_and_verdicts runs its own)
    with tempfile.TemporaryDirectory() as directory:
        medium.run("ch3p6", directory, collect=_fake_stabilisation)
        return (Path(directory) / "ch3p6.json").read_text()


def _stored(tmp_path, key="ch3p6"):
    # a stored result to edit: the fake ch3p6 run, or a copy of the real stored one of `key`
    if key == "ch3p6-fake":
        target = tmp_path / "ch3p6.json"
        target.write_text(_fake_ch3p6_text())
        return target
    target = tmp_path / f"{key}.json"
    target.write_text(medium.path_for(key).read_text())
    return target


def _edit(path, change):
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


@pytest.mark.parametrize("field, value, shown", [
    ("verdict", "not resolved", "verdict: stored 'not resolved', recomputed 'holds'"),
    ("effect", 9.0, "effect: stored 9.0, recomputed 5.00"),
    ("lo", -1.0, "lo: stored -1.0, recomputed"),
    ("hi", 1.0, "hi: stored 1.0, recomputed"),
    ("se", 3.0, "se: stored 3.0, recomputed"),
    ("seeds_now", 500, f"seeds_now: stored 500, recomputed {N_CH3P6}"),
])
def test_load_refuses_a_claim_edited_while_its_data_stayed(tmp_path, field, value, shown):
    path = _stored(tmp_path, "ch3p6-fake")
    assert medium.load("ch3p6", tmp_path)["verified"] is True

    def change(record):
        claim = next(c for c in record["claims"] if c["claim"] == _STEPS)
        claim[field] = value

    _edit(path, change)
    with pytest.raises(medium.StoredResultError) as error:
        medium.load("ch3p6", tmp_path)
    message = str(error.value)
    assert str(path) in message and _STEPS in message and shown in message, message
    assert "rerun `OPENBLAS_NUM_THREADS=1 python -m deqlab.lab.experiments.medium ch3p6`" in message
    with pytest.raises(medium.StoredResultError):  # what a page calls: nothing is glued or shown
        medium.show("ch3p6", "x", tmp_path)


def test_load_ignores_prose_and_refuses_added_or_dropped_claims(tmp_path):
    path = _stored(tmp_path, "ch3p6-fake")
    _edit(path, lambda r: r["claims"][0].update(paper_source="reworded", note="reworded"))
    assert medium.load("ch3p6", tmp_path)["verified"] is True  # words, not numbers: a rewording changes no verdict
    _edit(path, lambda r: r["claims"].pop())
    with pytest.raises(medium.StoredResultError, match=r"3 claims stored, 4 recomputed"):
        medium.load("ch3p6", tmp_path)
    _stored(tmp_path, "ch3p6-fake")
    _edit(path, lambda r: r["claims"].reverse())
    with pytest.raises(medium.StoredResultError, match=r"claims\[0\] is .*shine.*, recomputed .*spectral"):
        medium.load("ch3p6", tmp_path)


def test_load_refuses_edited_per_seed_data(tmp_path):
    # the data edited and the claims left: the claims no longer follow from it
    path = _stored(tmp_path, "ch3p6-fake")
    _edit(path, lambda r: r["raw"]["cells"]["spectral@2.5"]["steps_last"].__setitem__(0, 1e3))
    with pytest.raises(medium.StoredResultError, match=re.escape(_STEPS) + r".*effect: stored"):
        medium.load("ch3p6", tmp_path)


@pytest.mark.parametrize("key", STORED)
def test_load_refuses_an_edited_verdict_of_every_stored_result(tmp_path, key):
    # the real stored files, each claim's verdict flipped in a copy
    path = _stored(tmp_path, key)
    count = len(json.loads(path.read_text())["claims"])
    # each verdict kind once is enough (every load recomputes all claims: seconds for ~100 seeds)
    verdicts = [c["verdict"] for c in json.loads(path.read_text())["claims"]]
    for i in sorted({verdicts.index(v) for v in set(verdicts)} | {count - 1}):
        _stored(tmp_path, key)
        flip = {"holds": "contradicted", "contradicted": "holds", "not resolved": "holds",
                "not testable at this scale": "holds"}
        _edit(path, lambda r: r["claims"][i].update(verdict=flip[r["claims"][i]["verdict"]]))
        with pytest.raises(medium.StoredResultError, match=rf"{re.escape(str(path))}: claims\[{i}\] .*verdict: stored"):
            medium.load(key, tmp_path)


def _fake_ensemble_study(options):
    # ch5p6's record (power_collect.ensemble_study_record) from made-up runs: GOE 3 perplexity below the
    # others in every seed (seed effects shared by all nine configurations), random off its plateau in
    # every seed at sqrt(V) = 1, one random run diverged
    from deqlab.lab.experiments import power_collect
    from deqlab.lab.experiments.sequence import ensemble_study as es

    n = options["seeds"]
    rng = np.random.default_rng(3)
    base = rng.normal(60, 10, n)
    levelled, falling = [4.8, 4.0, 3.8, 3.7, 3.65, 3.62, 3.61, 3.60, 3.60], [4.8, 4.5, 4.3, 4.1, 3.95, 3.8, 3.7, 3.6, 3.5]
    rows = [{"ensemble": e, "sqrt_v": v, "seed": s, "eval_steps": [16 * i for i in range(9)],
             "test_perplexity": float(base[s] - (3.0 if e == "goe" else 0.0) + rng.normal(0, 0.3)),
             "test_loss_curve": falling if (e == "gaussian" and v == 1.0) else levelled,
             "diverged": (e, v, s) == ("gaussian", 1.0, 0), "solver_failed": False}
            for e in es.ENSEMBLES for v in es.SQRT_V for s in range(n)]
    return power_collect.ensemble_study_record(rows, es.study_config("quick"), 1.0)


@pytest.fixture
def ch5p6(tmp_path, monkeypatch):
    # no stored ch5p6 run (the earlier one was on the earlier transformer cell): a fake one, 6 seeds
    monkeypatch.setitem(medium.EXPERIMENTS["ch5p6"], "options", {"seeds": 6})
    medium.run("ch5p6", tmp_path, collect=_fake_ensemble_study)
    return tmp_path / "ch5p6.json"


def test_ch5p6_recomputes_every_page_claim_from_its_per_run_data(ch5p6, tmp_path):
    # the page's claims (counts of plateau and divergence flags among them) rest on per-run data the file
    # stores, so every one is recomputed on load, and an edit to any is refused
    record = medium.load("ch5p6", tmp_path)
    assert record["verified"] is True and record["verification"]["unverified"] == []
    claims = record["raw"]["page_claims"]
    assert record["verification"]["recomputed"] == len(record["claims"]) + len(claims)
    mean = next(i for i, c in enumerate(claims) if c["method"].startswith("permutation") and c["verdict"] == "holds")
    sign = next(i for i, c in enumerate(claims) if c["method"].startswith("exact one-sided sign"))
    for i, change, shown in ((mean, {"verdict": "contradicted"}, "verdict: stored 'contradicted', recomputed 'holds'"),
                             (mean, {"lo": -5.0}, "lo: stored -5.0"),
                             (sign, {"detail": "vs orthogonal: 1 seed"}, "detail: stored")):
        medium.run("ch5p6", tmp_path, collect=_fake_ensemble_study)
        _edit(ch5p6, lambda r: r["raw"]["page_claims"][i].update(change))
        with pytest.raises(medium.StoredResultError, match=re.escape(str(ch5p6))) as error:
            medium.load("ch5p6", tmp_path)
        assert claims[i]["claim"] in str(error.value) and shown in str(error.value), str(error.value)
    # a per-run flag edited: the claims no longer follow from the data
    medium.run("ch5p6", tmp_path, collect=_fake_ensemble_study)
    _edit(ch5p6, lambda r: r["raw"]["runs"]["gaussian@1"]["diverged"].__setitem__(0, False))
    with pytest.raises(medium.StoredResultError, match="differs from its recomputation"):
        medium.load("ch5p6", tmp_path)


def test_every_stored_result_verifies():
    for key in STORED:
        record = medium.load(key)
        assert record["verified"] is True and record["verification"]["unverified"] == [], key
        # ch5p6 stores the page's own tests too (raw.page_claims), recomputed with the power analysis's claims
        assert record["verification"]["recomputed"] == len(record["claims"]) + len(record["raw"].get("page_claims", [])), key
    for key, reason in medium.WITHDRAWN.items():  # a withdrawn result is not in the package, and says why
        assert not medium.path_for(key).exists() and reason, key


def test_show_glues_whether_the_claims_were_verified(monkeypatch, ch5p6, tmp_path):
    import deqlab.lab.experiments as experiments

    glued = {}
    monkeypatch.setattr(experiments, "glue", lambda name, value, display=True: glued.__setitem__(name, value))
    medium.show("ch3p6", "x")
    assert glued["x_medium_verified"].startswith("Every claim below was recomputed")
    _, shown = medium.show("ch5p6", "y", tmp_path)
    assert glued["y_medium_verified"].startswith("Every claim below was recomputed")


@pytest.mark.parametrize("write, message", [
    (lambda text: text[: len(text) // 2], r"not valid JSON at line \d+ column \d+"),
    (lambda text: "", r"not valid JSON at line 1 column 1"),
    (lambda text: "[1, 2]", r"expected a JSON object \(a stored medium result\), got list"),
    (lambda text: b"\xff\xfe".decode("latin-1"), r"not valid JSON|not UTF-8"),
])
def test_load_names_the_file_of_a_malformed_result(tmp_path, write, message):
    path = _stored(tmp_path, "ch3p6-fake")
    path.write_text(write(path.read_text()))
    with pytest.raises(medium.StoredResultError, match=re.escape(str(path)) + ": " + message):
        medium.load("ch3p6", tmp_path)


@pytest.mark.parametrize("change, message", [
    (lambda r: r.pop("claims"), "missing key 'claims' (expected a list of objects)"),
    (lambda r: r.pop("config_hash"), "missing key 'config_hash' (expected a string)"),
    (lambda r: r["provenance"]["machine"].pop("cpus"), "missing key 'provenance.machine.cpus' (expected an integer)"),
    (lambda r: r["raw"].pop("cells"), "missing key 'raw.cells' (expected an object)"),
    (lambda r: r["claims"][1].pop("verdict"), "missing key claims[1].'verdict' (expected a string)"),
    (lambda r: r["options"].update(seeds=str(N_CH3P6)),
     f"'options.seeds' has the wrong type: expected an integer, got str '{N_CH3P6}'"),
    (lambda r: r.update(provenance=[]), "'provenance' has the wrong type: expected an object, got list"),
    (lambda r: r["raw"]["settings"].update(seeds=[0, 1.5]), "'raw.settings.seeds' has the wrong type"),
    (lambda r: r.update(experiment="ch3p5"), "'experiment' is 'ch3p5', expected 'ch3p6'"),
    (lambda r: r["options"].update(seeds=17), f"options.seeds is 17, but the per-seed data has {N_CH3P6} seeds"),
    (lambda r: r["raw"]["cells"].pop("shine@2.5"), "per-seed data (raw) is not what the statistics code reads "
                                                   "(missing key 'shine@2.5')"),
    (lambda r: r["raw"]["cells"]["none@2.5"].update(steps_last="x"),
     f"'raw.cells.none@2.5.steps_last': expected a list of {N_CH3P6} per-seed numbers (one per raw.settings.seeds), "
     "got str 'x'"),
    (lambda r: r["raw"]["cells"]["none@2.5"]["steps_last"].__setitem__(3, "x"),
     f"'raw.cells.none@2.5.steps_last': expected a list of {N_CH3P6} per-seed numbers (one per raw.settings.seeds), "
     f"got {N_CH3P6} values, not all numbers"),
    (lambda r: r["raw"]["cells"]["none@2.5"]["radius_last"].pop(), "'raw.cells.none@2.5.radius_last': expected a "
                                                                   f"list of {N_CH3P6} per-seed numbers"),
    (lambda r: r["raw"]["cells"].update({"none@2.5": [1.0]}), "'raw.cells.none@2.5' has the wrong type: expected an object"),
])
def test_load_names_the_file_and_what_was_expected(tmp_path, change, message):
    path = _stored(tmp_path, "ch3p6-fake")
    _edit(path, change)
    with pytest.raises(medium.StoredResultError) as error:
        medium.load("ch3p6", tmp_path)
    assert str(error.value).startswith(f"experiments.medium.load: {path}: ") and message in str(error.value), error.value


def test_provenance_is_dirty_for_code_changes_not_for_stored_results(tmp_path):
    # a command that runs several experiments writes one result before the next starts: that output must not
    # mark the next run "+dirty", while any other change to a tracked file must
    import subprocess

    from deqlab.lab.experiments import power

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    (tmp_path / "results" / "a.json").write_text('{"new": 1}')
    assert not power._git_commit(str(tmp_path), outputs=("results",)).endswith("+dirty")
    assert power._git_commit(str(tmp_path)).endswith("+dirty")
    (tmp_path / "code.py").write_text("x = 2\n")
    assert power._git_commit(str(tmp_path), outputs=("results",)).endswith("+dirty")


def test_the_ch3p6_margins_quote_the_earlier_run_they_name():
    # the reasons of ch3 p6's smallest effects of interest quote the unremedied model of the earlier stored run (13
    # steps, radius 0.685); that run is in the repository's history only (power.EARLIER_CH3P6_RUN), so this reads it
    # with git, and is skipped where there is no history (an installed package, a shallow clone)
    import pathlib
    import subprocess

    root = pathlib.Path(__file__).resolve().parents[2]
    try:
        text = subprocess.run(["git", "show", power.EARLIER_CH3P6_RUN], cwd=root, capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"the earlier ch3p6 run is not in this checkout's history ({type(error).__name__})")
    earlier = json.loads(text)
    baseline = earlier["raw"]["cells"]["none@2.5"]
    assert earlier["raw"]["settings"]["seeds"] == list(range(medium.FRESH_SEED, medium.FRESH_SEED + 89))
    steps = re.search(r"of the (\d+) steps the unremedied model", power.SMALLEST_EFFECTS["remedies_steps"]["basis"])
    radius = re.search(r"unremedied model sits at ([0-9.]+)", power.SMALLEST_EFFECTS["remedies_radius"]["basis"])
    assert steps and radius
    assert int(steps.group(1)) == round(float(np.mean(baseline["steps_last"])))
    assert float(radius.group(1)) == round(float(np.mean(baseline["radius_last"])), 3)
