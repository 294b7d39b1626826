"""Per-seed quick-scale numbers for :mod:`deqlab.lab.experiments.power`, from the pages' own drivers.

Each ``collect_*`` function calls the experiment driver that its page calls, with the page's quick
settings (copied from the notebook's settings cell, named in the docstring), and returns a JSON-able
dict: ``settings``, ``seconds`` (wall time) and the per-seed arrays the power analysis needs.
Where a page's grid holds cells that the claim does not compare, only the claim's cells are run
(the drivers run every cell independently, so the numbers are those the page gets).
"""

from __future__ import annotations

import math
import tempfile
import time
from typing import Any

import numpy as np

__all__ = ["collect_training", "collect_ensemble_study", "ensemble_study_record", "collect_seq2seq", "collect_denoising",
           "collect_stabilisation", "collect_all", "COLLECTORS"]


def _floats(values) -> list[float]:
    return [float(v) for v in np.asarray(values, dtype=np.float64).ravel()]


def collect_training(seeds: int = 5, first_seed: int = 0) -> dict[str, Any]:
    """ch3 p5 (book/ch3_nonlinear/05_training.ipynb, grid cell): 001 Fig. 5's ensembles at the quick
    scale, the cells of the claim (Gaussian and orthogonal at sqrt(V) >= 1 of the quick grid), with
    ``seeds`` seeds (the page's 5 by default, more at :mod:`deqlab.lab.experiments.medium`), numbered
    ``first_seed``, ``first_seed + 1``, ... (0 by default, the page's; the medium run starts past every
    seed an earlier run used, so that its seeds are fresh).

    Raises:
        ValueError: ``seeds`` is not an integer >= 2, or ``first_seed`` not an integer >= 0 (named).
    """
    from deqlab import checks
    from deqlab.lab.experiments.nonlinear import training

    n_seeds = checks.integer(seeds, "seeds", "power_collect.collect_training", minimum=2)
    first = checks.integer(first_seed, "first_seed", "power_collect.collect_training", minimum=0)

    settings = dict(dataset="digits", width=32, epochs=5, batch_size=64, tol=1e-4, max_steps=40,
                    solver="anderson", learning_rate=1e-2)
    seeds, scales, families = list(range(first, first + n_seeds)), [1.0, 1.5, 2.0], ("gaussian", "orthogonal")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="deqlab-power-ch3p5-") as d:
        rows = training.run_training_sweep(f"{d}/grid", families=families, scales=scales, seeds=seeds,
                                           progress=False, **settings)
    seconds = time.perf_counter() - start
    errors = {f"{f}@{v:g}": _floats([next(r["test_error"] for r in rows if (r["family"], r["scale"], r["seed"])
                                          == (f, v, s)) for s in seeds]) for f in families for v in scales}
    return {"page": "book/ch3_nonlinear/05_training.ipynb", "driver": "nonlinear.training.run_training_sweep",
            "settings": {**settings, "seeds": seeds, "scales": scales, "families": list(families)},
            "seconds": seconds, "test_error": errors}


def collect_ensemble_study(seeds: int = 10, first_seed: int = 0) -> dict[str, Any]:
    """ch5 p6 (book/ch5_transformers/06_ensemble_study.ipynb): the quick study, ``seeds`` seeds (the
    page's 10 by default, more at :mod:`deqlab.lab.experiments.medium`; numbered from ``first_seed``,
    0 by default, the page's) x 9 configurations, with the page's own tests of 001 (its "low test
    loss" at the unigram model's loss, as the page).

    Raises:
        ValueError: ``seeds`` is not an integer >= 3, or ``first_seed`` not an integer >= 0 (named).
    """
    from deqlab import checks
    from deqlab.lab.experiments.sequence import ensemble_study as es

    where = "power_collect.collect_ensemble_study"
    config = es.study_config("quick")
    count = checks.integer(seeds, "seeds", where, minimum=3)  # check_claims needs three seeds
    first = checks.integer(first_seed, "first_seed", where, minimum=0)
    seeds = list(range(first, first + count))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="deqlab-power-ch5p6-") as d:
        units = es.run_study(d, config, seeds=seeds, progress=False)
    return ensemble_study_record(es.per_seed_rows(units), config, time.perf_counter() - start,
                                 low_loss=es.unigram_loss(config))


def ensemble_study_record(rows: list[dict[str, Any]], config: dict, seconds: float,
                          low_loss: float | None = None) -> dict[str, Any]:
    """The raw record of ch5 p6 (:func:`collect_ensemble_study`) from a study's per-seed rows
    (:func:`deqlab.lab.experiments.sequence.ensemble_study.per_seed_rows`), so that the page can
    analyse its own run the way the power analysis does (:func:`deqlab.lab.experiments.power.claims_from_raw`).
    ``low_loss`` (stored in ``settings``) is passed to
    :func:`~deqlab.lab.experiments.sequence.ensemble_study.check_claims`, as the page does."""
    from deqlab.lab.experiments.sequence import ensemble_study as es

    seeds = sorted({r["seed"] for r in rows})
    run = {(r["ensemble"], float(r["sqrt_v"]), r["seed"]): r for r in rows}
    configs = [(e, float(v)) for e in es.ENSEMBLES for v in es.SQRT_V]
    ppl = {f"{e}@{v:g}": _floats([run[(e, v, s)]["test_perplexity"] for s in seeds]) for e, v in configs}
    # what the page's claims read per run besides the perplexity, so that load() recomputes every claim
    runs = {f"{e}@{v:g}": {"eval_steps": [int(t) for t in run[(e, v, seeds[0])]["eval_steps"]],
                           "test_loss_curve": [_floats(run[(e, v, s)]["test_loss_curve"]) for s in seeds],
                           "diverged": [bool(run[(e, v, s)]["diverged"]) for s in seeds],
                           "solver_failed": [bool(run[(e, v, s)]["solver_failed"]) for s in seeds]}
            for e, v in configs}
    # the page's own tests of 001 §4.3 (count claims on Fig. 6's trajectories among them)
    keys = ("claim", "source", "kind", "method", "measure", "estimate", "lo", "hi", "interval", "p_for", "p_against",
            "p_adjusted", "family_size", "n_seeds", "detail", "verdict")
    claims = [{k: c.get(k, math.nan) for k in keys} for c in es.check_claims(rows, low_loss=low_loss)]
    return {"page": "book/ch5_transformers/06_ensemble_study.ipynb", "driver": "sequence.ensemble_study.run_study",
            "settings": {**{k: v for k, v in config.items()}, "seeds": seeds, "low_loss": low_loss},
            "seconds": seconds,
            "test_perplexity": ppl, "runs": runs, "page_claims": claims}


def collect_seq2seq() -> dict[str, Any]:
    """ch4 p4 (book/ch4_kglm/04_seq2seq.ipynb, sweep cell): 004 Fig. 5a's three units, 8 seeds."""
    from deqlab.lab.experiments.kglm import seq2seq as s2s

    settings = dict(epochs=30, train_size=400, test_size=200, max_steps=40)
    seeds = list(range(8))
    C = s2s.DEFAULT_C
    units = [("random", 1.0), ("naive", C), ("informed", C)]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="deqlab-power-ch4p4-") as d:
        rows = s2s.run_seq2seq_sweep(f"{d}/sweep", units, seeds=seeds, chunk=None, progress=False, **settings)
    seconds = time.perf_counter() - start
    curves = {scheme: [_floats(next(r["test_error_curve"] for r in rows if (r["scheme"], r["seed"]) == (scheme, s)))
                       for s in seeds] for scheme, _ in units}
    return {"page": "book/ch4_kglm/04_seq2seq.ipynb", "driver": "kglm.seq2seq.run_seq2seq_sweep",
            "settings": {**settings, "seeds": seeds, "C": C}, "seconds": seconds, "test_error_curve": curves}


def collect_denoising(seeds: int = 5, first_seed: int = 0) -> dict[str, Any]:
    """ch4 p5 (book/ch4_kglm/05_denoising.ipynb, sweep cell): 004 Fig. 6's grid at the quick scale
    (5 variances, 5 C, ``seeds`` seeds: the page's 5 by default, more at
    :mod:`deqlab.lab.experiments.medium`; numbered from ``first_seed``, 0 by default, the page's), and
    :func:`~deqlab.lab.experiments.kglm.denoising.compare_schemes`'s per-seed test MSEs: each seed
    at the grid point the other seeds choose on the page's 64 validation images.

    Raises:
        ValueError: ``seeds`` is not an integer >= 2, or ``first_seed`` not an integer >= 0 (named).
    """
    from deqlab import checks
    from deqlab.lab.experiments.kglm import denoising as dn

    seeds = checks.integer(seeds, "seeds", "power_collect.collect_denoising", minimum=2)
    first = checks.integer(first_seed, "first_seed", "power_collect.collect_denoising", minimum=0)
    sizes = dict(image_size=16, train_size=96, validation_size=64, test_size=64)
    options = dict(epochs=5, batch_size=16, max_steps=15, tol=1e-3, learning_rate=1e-3)
    seeds = list(range(first, first + seeds))
    variances = (np.logspace(-3, 0, 5) ** 2).tolist()
    cs = np.logspace(-2, 1, 5).tolist()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="deqlab-power-ch4p5-") as d:
        rows = dn.run_denoising_sweep(f"{d}/grid", variances=variances, cs=cs, seeds=seeds, dataset="image_patches",
                                      progress=False, **sizes, **options)
    seconds = time.perf_counter() - start
    per_epoch = []
    for epoch in range(options["epochs"] + 1):
        c = dn.compare_schemes(rows, epoch)  # grid points chosen on validation images, cross-fitted by seed
        assert c["seeds"] == seeds, (epoch, c["seeds"])  # every seed compared: the claims count them all
        per_epoch.append({"epoch": epoch, "kglm_scale": c["kglm_scale"], "random_scale": c["random_scale"],
                          "selected_on": c["select_on"], "cross_fit": c["cross_fit"],
                          "kglm_scale_per_seed": c["kglm_scale_per_seed"],
                          "random_scale_per_seed": c["random_scale_per_seed"],
                          "ratio_of_medians": c["ratio"], "p_value": c["p_value"],
                          "kglm": _floats(c["kglm_mse"]), "random": _floats(c["random_mse"])})
    return {"page": "book/ch4_kglm/05_denoising.ipynb", "driver": "kglm.denoising.run_denoising_sweep",
            "settings": {**sizes, **options, "seeds": seeds, "variances": variances, "cs": cs,
                         "dataset": "image_patches"}, "seconds": seconds, "best_cells": per_epoch}


def collect_stabilisation(seeds: int = 3, first_seed: int = 0) -> dict[str, Any]:
    """ch3 p6 (book/ch3_nonlinear/06_stabilisation.ipynb, sweep cell): every remedy at the quick scales
    (1.5, 2.5), ``seeds`` seeds (the page's 3 by default; :mod:`deqlab.lab.experiments.medium` runs
    more) numbered from ``first_seed`` (0 by default, the page's), Gaussian W0; the per-seed last-epoch
    solver steps, radius and test error.

    Raises:
        ValueError: ``seeds`` is not an integer >= 2, or ``first_seed`` not an integer >= 0 (named).
    """
    from deqlab import checks
    from deqlab.lab.experiments.nonlinear import stabilisation

    seeds = checks.integer(seeds, "seeds", "power_collect.collect_stabilisation", minimum=2)
    first = checks.integer(first_seed, "first_seed", "power_collect.collect_stabilisation", minimum=0)
    options = dict(width=32, epochs=4, batch_size=64, tol=1e-4, max_steps=40)
    seeds, scales = list(range(first, first + seeds)), [1.5, 2.5]
    remedies = list(stabilisation.REMEDIES)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="deqlab-power-ch3p6-") as d:
        rows = stabilisation.run_stabilisation_sweep(f"{d}/sweep", remedies=remedies, scales=scales, seeds=seeds,
                                                     family="gaussian", dataset="digits", progress=False, **options)
    seconds = time.perf_counter() - start
    out = {}
    for r in rows:
        res = r["result"]
        out[f"{r['remedy']}@{r['scale']:g}"] = {
            "steps_last": _floats(np.asarray(res["steps_curve"], float)[:, -1]),
            "radius_last": _floats(np.asarray(res["radius_curve"], float)[:, -1]),
            "test_error": _floats(res["test_error"])}
    return {"page": "book/ch3_nonlinear/06_stabilisation.ipynb",
            "driver": "nonlinear.stabilisation.run_stabilisation_sweep",
            "settings": {**options, "seeds": seeds, "scales": scales, "remedies": remedies, "family": "gaussian",
                         "dataset": "digits"}, "seconds": seconds, "cells": out}


COLLECTORS = {"ch3p5": collect_training, "ch5p6": collect_ensemble_study, "ch4p4": collect_seq2seq,
              "ch4p5": collect_denoising, "ch3p6": collect_stabilisation}
"""Page key -> collector, run one at a time by :func:`deqlab.lab.experiments.power.main`."""


def collect_all(path: str, keys=None) -> dict[str, Any]:
    """Run the collectors one at a time, writing ``path`` (JSON) after each, so an interrupted run
    resumes where it stopped.

    Args:
        path: The JSON file of raw per-seed results; entries already in it are reused.
        keys: Names from :data:`COLLECTORS` to run (default: all of them).

    Returns:
        The raw results by collector name, as written to ``path``.

    Raises:
        ValueError: A name in ``keys`` is not a collector.

    Example:
        >>> sorted(COLLECTORS)[:2]
        ['ch3p5', 'ch3p6']
    """
    import json
    import os

    unknown = sorted(set(keys or ()) - set(COLLECTORS))
    if unknown:
        raise ValueError(f"collect_all: keys must be among {sorted(COLLECTORS)}, got {unknown}")

    raw = {}
    if os.path.exists(path):
        with open(path) as fh:
            raw = json.load(fh)
    for key in keys or COLLECTORS:
        if key in raw:
            continue
        print(f"[power] collecting {key} ...", flush=True)
        raw[key] = COLLECTORS[key]()
        print(f"[power] {key}: {raw[key]['seconds']:.0f} s", flush=True)
        with open(path, "w") as fh:
            json.dump(raw, fh)
    return raw


if __name__ == "__main__":
    import sys

    collect_all(sys.argv[1], sys.argv[2:] or None)
