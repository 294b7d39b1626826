"""The medium scale's store: run, provenance, staleness, and the stored results' own consistency."""

import json
import re

import numpy as np
import pytest

from deqlab.lab.experiments import medium, power


def _fake_stabilisation(options):
    # the collector's record shape (power_collect.collect_stabilisation) with made-up per-seed numbers:
    # "spectral" lowers both measures by a margin far above the spread, "shine" changes nothing
    rng = np.random.default_rng(0)
    n = options["seeds"]
    base = {"steps_last": list(20 + rng.normal(0, 1, n)), "radius_last": list(0.9 + rng.normal(0, 0.01, n)),
            "test_error": list(rng.uniform(0.1, 0.2, n))}
    cells = {"none@1.5": base, "none@2.5": base,
             "spectral@2.5": {k: list(np.asarray(vs) - (5 if k == "steps_last" else 0.2) + rng.normal(0, 1e-3, n))
                              for k, vs in base.items()},
             "shine@2.5": {k: list(np.asarray(vs) + rng.normal(0, 1e-3, n)) for k, vs in base.items()}}
    return {"page": "p", "driver": "d", "seconds": 0.5, "cells": cells,
            "settings": {"scales": [1.5, 2.5], "remedies": ["none", "spectral", "shine"], "seeds": list(range(n))}}


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


@pytest.mark.parametrize("key", sorted(medium.EXPERIMENTS))
def test_stored_results_are_current_and_consistent(key):
    # what the pages show: the stored result exists, was run with the current settings, and its verdicts
    # are what the power analysis's rule gives on its own per-seed numbers
    record = medium.load(key)
    assert not record["stale"], f"{key}: rerun `{record['command']}`"
    assert record["raw"]["settings"]["seeds"] == list(range(record["options"]["seeds"]))
    again = power.claims_from_raw({key: record["raw"]})
    assert [c["verdict_at_quick"] for c in again] == [c["verdict"] for c in record["claims"]]
    assert [c["claim"] for c in again] == [c["claim"] for c in record["claims"]]
