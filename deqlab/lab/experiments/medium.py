"""The ``medium`` scale: experiments sized by the power analysis, run once, stored with provenance.

``quick`` runs in CI on every build and ``full`` is the papers' size; ``medium`` is sized by
:mod:`deqlab.lab.experiments.power` to resolve a page's claims on the 2-core CPU machine in about an
hour. A medium experiment runs the page's own driver (through :mod:`deqlab.lab.experiments.power_collect`)
with more seeds, and stores what the claims need in ``deqlab/lab/medium_results/<key>.json``: the per-seed
results, each claim's effect, interval and verdict (:func:`deqlab.lab.experiments.power.claims_from_raw`,
the book's one rule: an exact permutation test within seed, Holm over the page's claims),
and a provenance record (deqlab version and git commit, the settings and their hash, the machine,
the date, the wall time, the command).

One command re-runs any stored experiment::

    python -m deqlab.lab.experiments.medium ch3p6      # or: make medium EXPERIMENT=ch3p6

A page reads the stored result with :func:`load`, which flags it ``stale`` when the settings the
current code would run (:data:`EXPERIMENTS`) hash differently from the stored ones, recomputes its
claims from its stored per-seed data (refusing a file whose claims differ from them, and saying in
``verified`` which claims rest on numbers it does not store per seed), and names the file and the
field in every error (not valid JSON, a missing key, a wrong type).
"""

from __future__ import annotations

import copy
import datetime
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from deqlab import checks

__all__ = ["EXPERIMENTS", "FRESH_SEED", "RESIZED_SEED", "WITHDRAWN", "DEFAULT_DIRECTORY", "StoredResultError", "settings", "seed_list", "sizing", "POWER_ANALYSIS", "config_hash", "path_for", "run",
           "load", "short_commit", "show", "main"]

_WHERE = "experiments.medium"

DEFAULT_DIRECTORY = Path(__file__).resolve().parents[1] / "medium_results"
"""Where the stored medium results live: package data of ``deqlab.lab``, so that a page reads them
on Colab from the installed release as it does from a checkout."""


def _stabilisation(options: dict) -> dict:
    from deqlab.lab.experiments import power_collect

    return power_collect.collect_stabilisation(**options)


def _training(options: dict) -> dict:
    from deqlab.lab.experiments import power_collect

    return power_collect.collect_training(**options)


def _ensemble_study(options: dict) -> dict:
    from deqlab.lab.experiments import power_collect

    return power_collect.collect_ensemble_study(**options)


def _ensemble_study_sizing() -> list[dict[str, Any]]:
    from deqlab.lab.experiments.sequence import ensemble_study as es

    plan = es.means_sizing()
    basis = ("the means' smallest effect of interest: 001 Table 1's smallest ordering of means, the GOE's 68.3 "
             "against orthogonal's 112.1 at sqrt(V) = 1 (43.8 in perplexity)")
    return [{"claim": f"001 Table 1's mean claims, at the {which} spread Table 1 allows", "effect_used": plan["gap"],
             "effect_basis": basis, "sd_used": sd,
             "sd_basis": (f"orthogonal's standard deviation at sqrt(V) = 1 bounded by its minimum and mean over 10 "
                          f"seeds ({which}: {how}), taken as the per-seed difference's"),
             "seeds_needed": n, "alpha": plan["alpha"], "power": plan["power"], "family": plan["family"]}
            for which, how, sd, n in zip(("least", "greatest"),
                                         ("one seed at the minimum, nine equal", "nine at the minimum, one failed"),
                                         plan["sd_bounds"], plan["seeds_needed"])]


def _denoising(options: dict) -> dict:
    from deqlab.lab.experiments import power_collect

    return power_collect.collect_denoising(**options)


def _ensemble_study_config() -> dict:
    from deqlab.lab.experiments.sequence import ensemble_study as es

    return es.study_config("quick")


FRESH_SEED = 10_000
"""The first seed of the medium runs sized by the power analysis: past every seed that the quick pages,
the power analysis's quick runs (the pilots whose spread sized them), the earlier medium runs and the
full scale used (all below 10,000), so that a medium run's seeds are fresh and its verdicts do not rest
on the data that chose its size."""

RESIZED_SEED = 20_000
"""The first seed of the medium runs sized against a smallest effect of interest at the spread of an
earlier stored run (chapter 3 pages 5 and 6; :data:`deqlab.lab.experiments.power.SMALLEST_EFFECTS`):
past the 10,000-series runs whose spread sized them, so the two runs share no seed."""


EXPERIMENTS: dict[str, dict[str, Any]] = {
    "ch3p5": {
        "page": "book/ch3_nonlinear/05_training.ipynb",
        "what": "001 Fig. 5: orthogonal against Gaussian initial weights of the tanh DEQ classifier, test error "
                "at sqrt(V) = 1, 1.5 and 2, paired by seed",
        # sized for 80 % power: the largest `seeds_needed` over the page's three claims in
        # book/_data/power_analysis.json (power.seeds_for_power: the two-sided t-test of the per-seed
        # differences at the page's Bonferroni level 0.05/3) against the page's smallest effect of interest,
        # 2 points of test error (power.SMALLEST_EFFECTS, since 001 gives no number), at the spread of the
        # earlier stored run (65 seeds from 10,000: power.stored_spreads; its effects unused): 94, 41 and 65
        # seeds at sqrt(V) = 1, 1.5 and 2, so 94. Fresh seeds from RESIZED_SEED, past every seed the quick
        # page (0-4), the pilots, the earlier medium runs (0-207, 10,000-10,064) and the full scale (0-9) used
        "options": {"seeds": 94, "first_seed": RESIZED_SEED},
        "collect": _training,
    },
    "ch5p6": {
        "page": "book/ch5_transformers/06_ensemble_study.ipynb",
        "what": "001 Table 1: mean log test perplexity of the DEQ-Transformer language model by ensemble and "
                "sqrt(V), paired by seed",
        # sized for 80 % power by the page's own rule (ensemble_study.means_sizing, below), not by the power
        # analysis's rows, which take each Table 1 gap at the quick run's spread (3 seeds): the paired t-test
        # at the two-sided level 0.05/14 against the means' smallest effect of interest (001's smallest
        # ordering of means, 43.8 in perplexity) at the greatest sample standard deviation 001's Table 1 allows
        # (nine seeds at the minimum, one failed seed carrying the whole excess of the mean over it: the gap is
        # 0.25 of that deviation, taken as the per-seed difference's), 225 seeds; at
        # this scale's own spread 3 to 4 would do (the page). Fresh seeds from RESIZED_SEED, past every seed
        # the quick page and the power analysis's pilot (0-9), the withdrawn run (0-39) and the full scale
        # (0-9) used
        "options": {"seeds": 225, "first_seed": RESIZED_SEED},
        "sizing": _ensemble_study_sizing,
        "collect": _ensemble_study,
        # the collector runs the driver's quick configuration (es.QUICK), defined outside its source
        "driver_config": _ensemble_study_config,
    },
    "ch3p6": {
        "page": "book/ch3_nonlinear/06_stabilisation.ipynb",
        "what": "the remedy ranking of chapter 3 page 6: each remedy against no remedy at sqrt(V) = 2.5, "
                "last-epoch forward solver steps and monitored radius, paired by seed",
        # sized for 80 % power: the largest `seeds_needed` in book/_data/power_analysis.json
        # (power.seeds_for_power: the two-sided t-test of the per-seed differences at the page's Bonferroni
        # level 0.05/12) over the twelve claims, against the page's smallest effects of interest, 2 forward
        # solver steps and 0.1 in the monitored radius (power.SMALLEST_EFFECTS, since no paper ranks the
        # remedies), at the spreads of the earlier stored run (89 seeds from 10,000: power.stored_spreads; its
        # effects unused): 62 seeds (Jacobian regularisation's monitored radius). Fresh seeds from RESIZED_SEED, past every seed
        # the quick page (0-2), the pilots, the earlier medium runs (0-127, 10,000-10,088) and the full scale
        # (0-7) used
        "options": {"seeds": 62, "first_seed": RESIZED_SEED},
        "collect": _stabilisation,
    },
    "ch4p5": {
        "page": "book/ch4_kglm/05_denoising.ipynb",
        "what": "004 Fig. 6: the kGLM-initialised denoising DEQ against random initialisation, each at its best "
                "grid point (chosen on validation images, cross-fitted by seed), test MSE at epochs 0 to 5, "
                "paired by seed",
        # sized for 80 % power: the largest `seeds_needed` over the page's two claims in
        # book/_data/power_analysis.json (power.seeds_for_power: the two-sided t-test of the per-seed
        # differences at the page's Bonferroni level 0.05/2): 4 seeds at epoch 0 and 114 at epoch 5 (004's
        # effect, 0.07 in log MSE, a proxy from App. F's Table 1, at the quick spread), so 114. A first run from
        # the working tree took 633 s on the 2-core machine, shared with other jobs (the stored run, from a
        # clean clone of the commit, gave the same data; its provenance has its own time).
        # Fresh seeds: from FRESH_SEED, past every seed the quick page (0-4), the pilots, the earlier medium
        # run (0-55) and the full scale (0-99) used, so no pilot seed is included
        "options": {"seeds": 114, "first_seed": FRESH_SEED},
        "collect": _denoising,
    },
}
"""Medium experiments by page key: the page, what it settles, the driver's options at medium scale
(``seeds``: 80 % power by :func:`deqlab.lab.experiments.power.seeds_for_power`, from
``book/_data/power_analysis.json``, or by the page's own rule where ``sizing`` names it;
``first_seed``: :data:`FRESH_SEED` or :data:`RESIZED_SEED`, where the collector takes it), the
collector that runs it (a function of the options returning the power analysis's raw per-seed
record), ``sizing`` where the page sizes the run itself (a function returning the sizing's claims
in the fields :func:`sizing` gives) and, where the collector takes the driver's own configuration
rather than spelling it out, ``driver_config`` (a function returning that configuration, hashed by
:func:`config_hash`)."""


COLLECTORS = {"ch3p5": "collect_training", "ch3p6": "collect_stabilisation", "ch4p5": "collect_denoising",
              "ch5p6": "collect_ensemble_study"}
"""The :mod:`deqlab.lab.experiments.power_collect` function behind each experiment (hashed by
:func:`config_hash`)."""


WITHDRAWN: dict[str, str] = {}
"""Experiments with no stored result, and why (a page says so instead of showing one)."""


def _key(key: Any) -> str:
    return checks.choice(key, "key", tuple(EXPERIMENTS), _WHERE)


def settings(key: str) -> dict[str, Any]:
    """The options the current code runs experiment ``key`` with at medium scale.

    Raises:
        ValueError: ``key`` is not in :data:`EXPERIMENTS`.

    Example:
        >>> from deqlab.lab.experiments import medium
        >>> medium.settings("ch3p6")
        {'seeds': 62, 'first_seed': 20000}
    """
    return dict(EXPERIMENTS[_key(key)]["options"])


def seed_list(key: str) -> list[int]:
    """The seeds experiment ``key`` runs at medium scale: ``seeds`` consecutive seeds from its
    ``first_seed`` (0 where it has none). A page run with ``DEQLAB_SCALE=medium`` uses these, so that
    its grid, like the stored run, stays clear of the quick pages' and pilots' seeds.

    Raises:
        ValueError: ``key`` is not in :data:`EXPERIMENTS`.

    Example:
        >>> from deqlab.lab.experiments import medium
        >>> seeds = medium.seed_list("ch3p6")
        >>> len(seeds), seeds[0], seeds[-1]
        (62, 20000, 20061)
    """
    options = settings(key)
    first = options.get("first_seed", 0)
    return list(range(first, first + options["seeds"]))


def config_hash(key: str) -> str:
    """Hash of experiment ``key``'s medium settings: its options, the source of the collector
    that fixes everything else (widths, epochs, grids, data sizes) and, where the collector takes a
    driver's configuration (``driver_config`` in :data:`EXPERIMENTS`), that configuration, by
    :func:`deqlab.lab.experiments.sweep.config_key`. A change to a driver's code that leaves these
    unchanged is not covered.

    Raises:
        ValueError: ``key`` is not in :data:`EXPERIMENTS`.

    Example:
        >>> from deqlab.lab.experiments import medium
        >>> len(medium.config_hash("ch3p6"))
        20
    """
    import inspect

    from deqlab.lab.experiments import power_collect
    from deqlab.lab.experiments.sweep import config_key

    collector = getattr(power_collect, COLLECTORS[_key(key)])
    described = {"experiment": key, "options": settings(key), "collector": inspect.getsource(collector)}
    if "driver_config" in EXPERIMENTS[key]:
        described["driver_config"] = EXPERIMENTS[key]["driver_config"]()
    return config_key(described)


def path_for(key: str, directory: Any = None) -> Path:
    """The stored result of ``key``: ``<directory>/<key>.json`` (default :data:`DEFAULT_DIRECTORY`).

    Raises:
        ValueError: ``key`` is not in :data:`EXPERIMENTS`.

    Example:
        >>> from deqlab.lab.experiments import medium
        >>> medium.path_for("ch3p6", "results").as_posix()
        'results/ch3p6.json'
    """
    return Path(DEFAULT_DIRECTORY if directory is None else directory) / f"{_key(key)}.json"


POWER_ANALYSIS = Path(__file__).resolve().parents[3] / "book" / "_data" / "power_analysis.json"
"""The power analysis that sizes the medium runs (:mod:`deqlab.lab.experiments.power`), in a checkout."""

_SIZING_FIELDS = ("claim", "effect_used", "effect_basis", "sd_used", "sd_basis", "seeds_needed", "alpha", "power",
                  "family")


def sizing(key: str, analysis: Any = None) -> dict[str, Any] | None:
    """How experiment ``key``'s medium run was sized: its page's claims in the power analysis (the
    effect each was sized against and why, the spread and where it was measured, the seeds 80 %
    power needs), with the analysis's provenance. :func:`run` stores it with the result, so a page
    shows it from the installed package (on Colab, where ``book/_data`` is absent).

    Args:
        key: a key of :data:`EXPERIMENTS`.
        analysis: path of the power analysis's JSON; default :data:`POWER_ANALYSIS`.

    Returns:
        ``{"source": ..., "commit": ..., "date": ..., "claims": [...]}`` (each claim with
        ``claim``, ``effect_used``, ``effect_basis``, ``sd_used``, ``sd_basis``, ``seeds_needed``,
        ``alpha``, ``power``, ``family``), or None outside a checkout (no analysis file). An
        experiment with its own ``sizing`` rule (ch5p6: ``ensemble_study.means_sizing``) gives
        that rule's claims, its name as ``source``, and the commit and date of the call.

    Raises:
        ValueError: ``key`` is not in :data:`EXPERIMENTS`.

    Example:
        >>> from deqlab.lab.experiments import medium
        >>> s = medium.sizing("ch3p6")
        >>> s is None or max(c["seeds_needed"] for c in s["claims"]) == medium.settings("ch3p6")["seeds"]
        True
    """
    experiment = EXPERIMENTS[_key(key)]
    if "sizing" in experiment:  # sized by the page's own rule, which the experiment names (no analysis file needed)
        return {"source": f"{experiment['sizing'].__module__}.{experiment['sizing'].__name__}", "commit": _git_commit(),
                "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(), "claims": experiment["sizing"]()}
    page = experiment["page"]
    path = Path(analysis) if analysis is not None else POWER_ANALYSIS
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return {"source": "book/_data/power_analysis.json", "commit": data["provenance"].get("git_commit"),
            "date": data["provenance"].get("date"),
            "claims": [{k: c.get(k) for k in _SIZING_FIELDS} for c in data["claims"] if c["page"] == page]}


def _git_commit() -> str | None:
    # the commit, with "+dirty" when tracked files differ from it, the stored results aside (outputs: a
    # command that runs several experiments writes one before the next starts); None outside a git checkout
    from deqlab.lab.experiments import power

    return power._git_commit(str(Path(__file__).resolve().parent), outputs=("deqlab/lab/medium_results",))


def run(key: str, directory: Any = None, *, collect: Callable[[dict], dict] | None = None) -> dict[str, Any]:
    """Run experiment ``key`` at medium scale and store its result (overwriting an older one).

    Args:
        key: a key of :data:`EXPERIMENTS`.
        directory: where to write ``<key>.json``; default :data:`DEFAULT_DIRECTORY`.
        collect: the collector to call instead of the registered one (tests use a small one).

    Returns:
        The stored record: ``experiment``, ``page``, ``what``, ``command``, ``options``,
        ``config_hash``, ``provenance``, ``raw`` (per-seed results) and ``claims`` (each claim's
        effect, standard error, 95% studentised interval and verdict).

    Raises:
        ValueError: ``key`` is not in :data:`EXPERIMENTS`.

    Example:
        >>> from deqlab.lab.experiments import medium
        >>> # the stored run: minutes on a 2-core CPU
        >>> medium.run("ch3p6")  # doctest: +SKIP
    """
    import deqlab
    from deqlab.lab.experiments import power

    key = _key(key)
    experiment = EXPERIMENTS[key]
    options = settings(key)
    commit = _git_commit()  # the code the run starts from
    start = time.perf_counter()
    raw = (collect or experiment["collect"])(options)
    wall = time.perf_counter() - start
    claims = power.claims_from_raw({key: raw})  # the statistics load() recomputes (_verify)
    record = {
        "experiment": key,
        "page": experiment["page"],
        "what": experiment["what"],
        "command": f"OPENBLAS_NUM_THREADS=1 python -m deqlab.lab.experiments.medium {key}",
        "options": options,
        "config_hash": config_hash(key),
        "provenance": {
            "deqlab_version": deqlab.__version__,
            "git_commit": commit,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"platform": platform.platform(), "processor": platform.machine(), "cpus": os.cpu_count(),
                        "python": platform.python_version()},
            "wall_time_s": round(wall, 1),
            "environment": {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "XLA_FLAGS", "DEQLAB_SCALE")},
        },
        "raw": raw,
        "claims": _medium_claims(claims),
        "sizing": sizing(key),
    }
    target = path_for(key, directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=float) + "\n")
    tmp.replace(target)  # never a half-written result
    return record


def load(key: str, directory: Any = None) -> dict[str, Any]:
    """The stored medium result of ``key``, checked and verified against its own per-seed data,
    with ``stale``, ``verified`` and ``verification`` added.

    * ``stale``: True when the settings it was run with hash differently from those the current
      code would run (:func:`config_hash`); rerun it with the command in its ``command`` field.
    * Every claim (``claims``, and for ch5p6 the page's own tests in ``raw["page_claims"]``) is
      recomputed from the stored per-seed numbers (``raw``) with the statistics code that made it
      (:func:`deqlab.lab.experiments.power.claims_from_raw`;
      :func:`deqlab.lab.experiments.sequence.ensemble_study.check_claims` for the page's own
      tests): pure NumPy/SciPy, seconds (the resampling of the permutation tests and intervals), done
      once per distinct per-seed data in a process. A claim whose stored effect, interval,
      standard error, seeds or verdict differs from the recomputed one is **refused**
      (:class:`StoredResultError`): a page must never show a verdict its data does not give. The
      prose fields (``paper_source``, ``note``) are not compared.
    * ``verified``: True when every claim was recomputed from per-seed data (every stored
      experiment stores all it needs; ch5p6 its per-run curves and flags too). ``verification``
      says which claims were not, and why (``unverified``: ``{"claim", "reason"}`` per claim;
      ``reason``: a sentence), for a future experiment that stores less;
      ``verification["recomputed"]`` counts the claims recomputed from per-seed data.

    Raises:
        ValueError: ``key`` is not in :data:`EXPERIMENTS`.
        FileNotFoundError: nothing is stored for ``key`` (the message gives the command that runs it).
        StoredResultError: (a ``ValueError``) the file is not valid JSON (line and column given),
            lacks a field or has one of the wrong type (named, with the type expected), names
            another experiment, or a claim does not follow from its per-seed data (the first such
            claim, with its stored and recomputed values). The message names the file.

    Example:
        >>> from deqlab.lab.experiments import medium
        >>> record = medium.load("ch3p6")  # doctest: +SKIP
        >>> record["stale"], record["verified"], record["options"]  # doctest: +SKIP
        (False, True, {'seeds': 89, 'first_seed': 10000})
    """
    target = path_for(key, directory)
    if not target.exists():
        raise FileNotFoundError(f"{_WHERE}.load: no stored medium result for {key!r} at {target}; run "
                                f"`python -m deqlab.lab.experiments.medium {key}` to make it.")
    record = _read(key, target)
    record["verification"] = _verify(key, record, target)
    record["verified"] = not record["verification"]["unverified"]
    record["stale"] = record["config_hash"] != config_hash(key)
    return record


class StoredResultError(ValueError):
    """A stored medium result that cannot be shown: malformed, or claims its per-seed data does not give."""


def _medium_claims(claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # the power analysis names its fields after the quick scale; in a stored record they are the medium run's
    return [{k.replace("quick_", "").replace("_at_quick", ""): v for k, v in c.items()} for c in claims]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_KINDS: dict[str, Callable[[Any], bool]] = {
    "a string": lambda v: isinstance(v, str),
    "a string or null": lambda v: v is None or isinstance(v, str),
    "an integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "a number": _is_number,
    "an object": lambda v: isinstance(v, dict),
    "a list": lambda v: isinstance(v, list),
    "a list of integers": lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                                                for x in v),
    "a list of numbers": lambda v: isinstance(v, list) and all(_is_number(x) for x in v),
    "a list of strings": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "a list of objects": lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
}

_SCHEMA = {  # dotted path -> kind, parents before children; what load() and show() read
    "experiment": "a string", "page": "a string", "what": "a string", "command": "a string",
    "options": "an object", "options.seeds": "an integer", "config_hash": "a string",
    "provenance": "an object", "provenance.deqlab_version": "a string", "provenance.git_commit": "a string or null",
    "provenance.date": "a string", "provenance.machine": "an object", "provenance.machine.cpus": "an integer",
    "provenance.wall_time_s": "a number",
    "raw": "an object", "raw.page": "a string", "raw.settings": "an object", "raw.settings.seeds": "a list of integers",
    "claims": "a list of objects",
}
_RAW_SCHEMA = {  # what power.claims_from_raw reads of each experiment's raw record (its values are checked there)
    "ch3p5": {"raw.test_error": "an object", "raw.settings.scales": "a list of numbers"},
    "ch3p6": {"raw.cells": "an object", "raw.settings.scales": "a list of numbers",
              "raw.settings.remedies": "a list of strings"},
    "ch4p5": {"raw.best_cells": "a list of objects"},
    "ch5p6": {"raw.test_perplexity": "an object", "raw.runs": "an object", "raw.page_claims": "a list of objects"},
}
_CLAIM_SCHEMA = {"claim": "a string", "verdict": "a string"}


def _fail(target: Path, message: str) -> StoredResultError:
    return StoredResultError(f"{_WHERE}.load: {target}: {message}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_fields(record: dict, schema: dict[str, str], target: Path, what: str = "") -> None:
    for path, kind in schema.items():
        *parents, name = path.split(".")
        holder = record
        for part in parents:
            holder = holder[part]  # checked before (parents come first)
        if name not in holder:
            raise _fail(target, f"missing key {what}{path!r} (expected {kind}); the file is truncated or was "
                                "edited by hand: rerun its experiment")
        if not _KINDS[kind](holder[name]):
            raise _fail(target, f"{what}{path!r} has the wrong type: expected {kind}, got "
                                f"{type(holder[name]).__name__} {_shown(holder[name])}")


def _read(key: str, target: Path) -> dict[str, Any]:
    """The stored record of ``key`` at ``target``, its fields checked (:data:`_SCHEMA`)."""
    try:
        text = target.read_text()
    except UnicodeDecodeError as error:
        raise _fail(target, f"not UTF-8 text ({error})") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        raise _fail(target, f"not valid JSON at line {error.lineno} column {error.colno} ({error.msg}); expected a "
                            "stored medium result (a truncated file? rerun its experiment)") from None
    if not isinstance(record, dict):
        raise _fail(target, f"expected a JSON object (a stored medium result), got {type(record).__name__}")
    _check_fields(record, _SCHEMA, target)
    if record["experiment"] != key:
        raise _fail(target, f"'experiment' is {record['experiment']!r}, expected {key!r} (the file's name)")
    _check_fields(record, _RAW_SCHEMA[key], target)
    for i, claim in enumerate(record["claims"]):
        _check_fields(claim, _CLAIM_SCHEMA, target, what=f"claims[{i}].")
    n = len(record["raw"]["settings"]["seeds"])
    for path, values in _per_seed_lists(key, record["raw"], target).items():
        if not (_KINDS["a list of numbers"](values) and len(values) == n):
            got = (f"{len(values)} values" + ("" if _KINDS["a list of numbers"](values) else ", not all numbers")
                   if isinstance(values, list) else f"{type(values).__name__} {_shown(values)}")
            raise _fail(target, f"{path!r}: expected a list of {n} per-seed numbers (one per raw.settings.seeds), "
                                f"got {got}")
    return record


def _per_seed_lists(key: str, raw: dict[str, Any], target: Path) -> dict[str, Any]:
    # the per-seed lists the statistics read, by dotted path (their containers' types checked here)
    def objects(path: str, value: Any) -> dict:
        if not isinstance(value, dict):
            raise _fail(target, f"{path!r} has the wrong type: expected an object, got {type(value).__name__} "
                                f"{_shown(value)}")
        return value

    if key == "ch3p5":
        return {f"raw.test_error.{name}": v for name, v in raw["test_error"].items()}
    if key == "ch3p6":
        return {f"raw.cells.{cell}.{name}": v for cell, fields in raw["cells"].items()
                for name, v in objects(f"raw.cells.{cell}", fields).items()}
    if key == "ch4p5":
        for i, cell in enumerate(raw["best_cells"]):
            _check_fields(cell, {"epoch": "an integer", "random": "a list", "kglm": "a list"}, target,
                          what=f"raw.best_cells[{i}].")
        return {f"raw.best_cells[{i}].{name}": cell[name] for i, cell in enumerate(raw["best_cells"])
                for name in ("random", "kglm")}
    return {f"raw.test_perplexity.{name}": v for name, v in raw["test_perplexity"].items()}


_PROSE = ("paper_source", "note", "effect_basis", "sd_basis")
"""Claim fields not compared on load: words, not numbers (a rewording in the code changes no verdict)."""

_LATER_FIELDS = ("sd_used", "sd_basis")
"""Sizing fields the analysis gained after some runs were stored (issue 40): compared where stored."""


def _same(a: Any, b: Any) -> bool:
    # equal, numbers to 1e-9 relative (the same code on another BLAS or NumPy may differ in the last bits)
    if _is_number(a) and _is_number(b):
        return bool(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b)))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _compare(stored: list[dict], again: list[dict], where: str, target: Path, command: str,
             skip: Sequence[str] = _PROSE) -> None:
    """Refuse the first claim of ``stored`` that differs from ``again`` (recomputed), naming its fields."""
    advice = (f"the stored claims do not follow from the stored per-seed data (edited by hand, or the statistics "
              f"code changed since the run): rerun `{command}`")
    for i, (s, a) in enumerate(zip(stored, again)):
        if s.get("claim") != a.get("claim"):
            raise _fail(target, f"{where}[{i}] is {s.get('claim')!r}, recomputed {a.get('claim')!r}; {advice}")
        fields = [k for k in dict.fromkeys([*a, *s]) if k not in skip and not (k in _LATER_FIELDS and k not in s)]
        differ = [f"{k}: stored {_shown(s[k]) if k in s else '(missing)'}, recomputed "
                  f"{_shown(a[k]) if k in a else '(none)'}"
                  for k in fields if k not in s or k not in a or not _same(s[k], a[k])]
        if differ:
            raise _fail(target, f"{where}[{i}] ({s['claim']!r}) differs from its recomputation: "
                                f"{'; '.join(differ[:4])}{' ...' if len(differ) > 4 else ''}; {advice}")
    if len(stored) != len(again):
        raise _fail(target, f"{len(stored)} {where} stored, {len(again)} recomputed from its per-seed data; {advice}")


# What load() recomputes from a stored run's per-seed data (its claims: permutation tests and
# bootstraps, about a second a run), by that data's JSON text: the same data gives the same records.
_RECOMPUTED: dict[str, Any] = {}


def _recomputed(what: str, data: Any, compute: Callable[[], Any]) -> Any:
    """``compute()``, once per distinct ``(what, data)`` in a process (a deep copy of the record)."""
    try:
        text = json.dumps([what, data], sort_keys=True, default=lambda value: value.tolist())
    except (TypeError, AttributeError, ValueError):  # not JSON data (a caller's own objects): no memo
        return compute()
    if text not in _RECOMPUTED:
        if len(_RECOMPUTED) >= 16:
            _RECOMPUTED.clear()
        _RECOMPUTED[text] = compute()
    return copy.deepcopy(_RECOMPUTED[text])


def _verify(key: str, record: dict[str, Any], target: Path) -> dict[str, Any]:
    """Recompute ``record``'s claims from its per-seed data (:func:`load`); refuse one that differs."""
    from deqlab.lab.experiments import power

    raw, command = record["raw"], record["command"]
    seeds = raw["settings"]["seeds"]
    if record["options"]["seeds"] != len(seeds):
        raise _fail(target, f"options.seeds is {record['options']['seeds']}, but the per-seed data has "
                            f"{len(seeds)} seeds (raw.settings.seeds)")
    try:
        again = _medium_claims(_recomputed(key, raw, lambda: power.claims_from_raw({key: raw})))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
        # claims_from_raw names a malformed `raw` in a ValueError caused by the lookup that failed
        error = error.__cause__ if isinstance(error.__cause__, (KeyError, IndexError, TypeError)) else error
        missing = f"missing key {error}" if isinstance(error, KeyError) else f"{type(error).__name__}: {error}"
        raise _fail(target, f"its per-seed data (raw) is not what the statistics code reads ({missing})") from None
    unverified = []
    recomputed = len(again)
    if key == "ch5p6":  # first the page's own tests, which the power claims copy in part
        page_recomputed, page_unverified = _verify_page_claims(raw, target, command)
        recomputed += page_recomputed
        unverified += page_unverified
    for i, (s, a) in enumerate(zip(record["claims"], again)):
        if a.get("verdict") == "not analysed" and s.get("verdict") != "not analysed" and s["claim"] == a["claim"]:
            raise _fail(target, f"claims[{i}] ({s['claim']!r}): its per-seed data cannot be analysed "
                                f"({a.get('note')}); expected per-seed numbers in raw")
    _compare(record["claims"], again, "claims", target, command)
    reason = None
    if unverified:
        reason = (f"{len(unverified)} claim(s) rest on per-run flags (test-loss plateau reached, run diverged or "
                  "solver failed) that the file does not store, only their counts: each is checked against the "
                  "counts it states, which cannot be checked; the other claims were recomputed from per-seed data")
    return {"recomputed": recomputed, "unverified": unverified, "reason": reason}


def _verify_page_claims(raw: dict[str, Any], target: Path, command: str) -> tuple[int, list[dict[str, str]]]:
    """ch5p6's own tests of 001 (raw["page_claims"], shown by the page), every one recomputed by
    ensemble_study.check_claims from the stored per-run data (perplexities, test-loss curves, divergence
    and solver flags). Returns (claims recomputed, unverified claims: none)."""
    from deqlab.lab.experiments.sequence import ensemble_study as es

    stored = raw["page_claims"]
    for i, c in enumerate(stored):
        _check_fields(c, {"claim": "a string", "method": "a string", "verdict": "a string", "detail": "a string",
                          "n_seeds": "an integer", "estimate": "a number", "lo": "a number", "hi": "a number"},
                      target, what=f"raw.page_claims[{i}].")
    ppl, runs = raw["test_perplexity"], raw["runs"]
    seeds = raw["settings"]["seeds"]
    try:
        rows = [{"ensemble": e, "sqrt_v": v, "seed": s, "test_perplexity": ppl[f"{e}@{v:g}"][i],
                 "test_loss_curve": runs[f"{e}@{v:g}"]["test_loss_curve"][i],
                 "eval_steps": runs[f"{e}@{v:g}"]["eval_steps"], "diverged": runs[f"{e}@{v:g}"]["diverged"][i],
                 "solver_failed": runs[f"{e}@{v:g}"]["solver_failed"][i]}
                for e in es.ENSEMBLES for v in es.SQRT_V for i, s in enumerate(seeds)]
        low_loss = raw["settings"].get("low_loss")
        again = _recomputed("page claims", [rows, low_loss], lambda: es.check_claims(rows, low_loss=low_loss))
    except (KeyError, IndexError, TypeError, ValueError) as error:
        missing = f"missing key {error}" if isinstance(error, KeyError) else f"{type(error).__name__}: {error}"
        raise _fail(target, f"raw.test_perplexity / raw.runs are not what ensemble_study.check_claims reads "
                            f"({missing})") from None
    keys = [k for k in stored[0] if k not in ("source", "measure", "interval")] if stored else ["claim"]
    _compare([{k: c.get(k) for k in keys} for c in stored], [{k: c.get(k, math.nan) for k in keys} for c in again],
             "raw.page_claims", target, command, skip=())
    return len(stored), []


def short_commit(commit: str | None) -> str:
    """A stored run's commit as a page shows it: 10 hex digits, and ``+dirty`` kept where the
    run's tracked files differed from that commit (a reader must see that the commit alone does
    not reproduce it).

    Args:
        commit: the provenance's ``git_commit`` (40 hex digits, ``+dirty`` appended where the
            tree was dirty), or None (run outside a git checkout).

    Returns:
        ``"<10 digits>"``, ``"<10 digits>+dirty"`` or ``"no commit"``.

    Example:
        >>> from deqlab.lab.experiments.medium import short_commit
        >>> short_commit("8246044ffda018e4ec13b656cea55ca2e77e650e+dirty"), short_commit(None)
        ('8246044ffd+dirty', 'no commit')
    """
    if not commit:
        return "no commit"
    return commit[:10] + ("+dirty" if commit.endswith("+dirty") else "")


def show(key: str, prefix: str, directory: Any = None) -> tuple[dict[str, Any], Any]:
    """What a page shows of a stored medium result: its claims as a table, and its provenance glued.

    Glues ``<prefix>_medium_stale`` (a sentence: current or stale), ``_verified`` (a sentence: every
    claim recomputed from the stored per-seed data, or which were not and why), ``_seeds``, ``_wall`` (minutes),
    ``_version`` (deqlab version and commit), ``_date``, ``_cpus``, and, for each verdict
    (``holds``, ``contradicted``, ``not_resolved``), ``<prefix>_medium_<verdict>``: the number of
    claims with it.

    Args:
        key: a key of :data:`EXPERIMENTS`.
        prefix: the page's glue prefix, e.g. ``"ch3p5"``.
        directory: where the result is stored (default :data:`DEFAULT_DIRECTORY`).

    Returns:
        ``(record, claims_table)``: the stored record (:func:`load`) and the
        :class:`deqlab.lab.experiments.tables.Table` of its claims (make it the last expression of a cell
        to display it).

    Raises:
        ValueError: ``key`` is not in :data:`EXPERIMENTS`.
        FileNotFoundError: nothing is stored for ``key``.
        StoredResultError: the stored result is malformed or its claims do not follow from its
            per-seed data (:func:`load`).

    Example:
        >>> from deqlab.lab.experiments import medium
        >>> record, claims_table = medium.show("ch3p5", "ch3p5")  # doctest: +SKIP
    """
    from deqlab.lab.experiments import glue, table

    record = load(key, directory)
    prov = record["provenance"]
    glue(f"{prefix}_medium_stale", "**These results are stale**: the medium settings in "
         "`deqlab.lab.experiments.medium` have changed since this run; rerun its command." if record["stale"]
         else "The stored run's settings are those of the current code.", display=False)
    unverified = [u["claim"] for u in record["verification"]["unverified"]]
    verified = ("Every claim below was recomputed from the stored per-seed data when this page was built." if not
                unverified else f"Not every claim could be recomputed from the stored per-seed data: "
                f"{record['verification']['reason']} ({'; '.join(unverified)}).")
    glue(f"{prefix}_medium_verified", verified, display=False)
    glue(f"{prefix}_medium_seeds", record["options"]["seeds"], display=False)
    glue(f"{prefix}_medium_wall", prov["wall_time_s"] / 60, display=False)
    glue(f"{prefix}_medium_version", f"{prov['deqlab_version']} ({short_commit(prov['git_commit'])})", display=False)
    glue(f"{prefix}_medium_date", prov["date"][:10], display=False)
    glue(f"{prefix}_medium_cpus", prov["machine"]["cpus"], display=False)
    for verdict in ("holds", "contradicted", "not resolved"):
        glue(f"{prefix}_medium_{verdict.replace(' ', '_')}", sum(c["verdict"] == verdict for c in record["claims"]),
             display=False)
    def cell(value):  # the sign tests of 001 Fig. 6 have no standard error
        return "–" if value is None else value

    rows = [[c["claim"].split(": ", 1)[-1], c["measure"], cell(c.get("effect")), cell(c.get("lo")), cell(c.get("hi")),
             cell(c.get("se")), c["seeds_now"], c["verdict"]] for c in record["claims"]]
    counts = any(c.get("se") is None for c in record["claims"])
    claims_table = table(rows, columns=["claim", "measure (claim's direction positive)", "mean difference", "95% interval (low)",
                         "(high)", "standard error", "seeds", "verdict"],
          formats=[None, None, ".3g", ".3g", ".3g", ".3g", "d", None],
          caption=f"Medium scale, stored ({record['options']['seeds']} seeds): each claim's mean paired difference "
                  "over seeds, its 95% interval (studentised bootstrap over seeds) and the verdict: an exact "
                  "permutation test within seed, with Holm's procedure over the page's claims at 5% (holds: "
                  "resolved in the claim's direction; contradicted: against it; not resolved: neither)."
                  + (" A row without a standard error is a count: the net share of the seeds that do not tie "
                     "(the seeds column counts all of them), with the exact sign test's interval and verdict."
                     if counts else "")
                  + ("" if record["verified"] else " " + verified))
    return record, claims_table


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m deqlab.lab.experiments.medium KEY [KEY ...] [--directory DIR]``: run and store.

    Args:
        argv: the command-line arguments (default ``sys.argv[1:]``).

    Returns:
        0 once every experiment has run and been stored.

    Raises:
        SystemExit: an unknown ``KEY`` (argparse's message lists the valid ones).

    Example:
        >>> from deqlab.lab.experiments import medium
        >>> medium.main(["ch3p6", "--directory", "results"])  # doctest: +SKIP
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m deqlab.lab.experiments.medium", description=main.__doc__)
    parser.add_argument("keys", nargs="+", choices=sorted(EXPERIMENTS), metavar="KEY",
                        help=f"experiments to run: {', '.join(sorted(EXPERIMENTS))}")
    parser.add_argument("--directory", default=None, help=f"where to store the results (default {DEFAULT_DIRECTORY})")
    args = parser.parse_args(argv)
    for key in args.keys:
        record = run(key, args.directory)
        print(f"{key}: {record['provenance']['wall_time_s']:.0f} s -> {path_for(key, args.directory)}")
        for claim in record["claims"]:
            if "effect" not in claim:  # "not analysed": no spread to test
                print(f"  {claim['verdict']:>13}  {claim['claim']}")
                continue
            print(f"  {claim['verdict']:>13}  {claim['effect']:+.3g} [{claim['lo']:+.3g}, {claim['hi']:+.3g}]  "
                  f"{claim['claim']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
