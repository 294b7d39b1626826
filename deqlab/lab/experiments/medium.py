"""The ``medium`` scale: experiments sized by the power analysis, run once, stored with provenance.

``quick`` runs in CI on every build and ``full`` is the papers' size; ``medium`` is sized by
:mod:`deqlab.lab.experiments.power` to resolve a page's claims on the 2-core CPU machine in about an
hour. A medium experiment runs the page's own driver (through :mod:`deqlab.lab.experiments.power_collect`)
with more seeds, and stores what the claims need in ``deqlab/lab/medium_results/<key>.json``: the per-seed
results, each claim's effect, interval and verdict (:func:`deqlab.lab.experiments.power.claims_from_raw`,
the same rule as the power analysis: a paired mean difference that clears two standard errors),
and a provenance record (deqlab version and git commit, the settings and their hash, the machine,
the date, the wall time, the command).

One command re-runs any stored experiment::

    python -m deqlab.lab.experiments.medium ch3p6      # or: make medium EXPERIMENT=ch3p6

A page reads the stored result with :func:`load`, which flags it ``stale`` when the settings the
current code would run (:data:`EXPERIMENTS`) hash differently from the stored ones.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from deqlab import checks

__all__ = ["EXPERIMENTS", "DEFAULT_DIRECTORY", "settings", "config_hash", "path_for", "run", "load", "short_commit", "show", "main"]

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


def _denoising(options: dict) -> dict:
    from deqlab.lab.experiments import power_collect

    return power_collect.collect_denoising(**options)


def _ensemble_study_config() -> dict:
    from deqlab.lab.experiments.sequence import ensemble_study as es

    return es.study_config("quick")


EXPERIMENTS: dict[str, dict[str, Any]] = {
    "ch3p5": {
        "page": "book/ch3_nonlinear/05_training.ipynb",
        "what": "001 Fig. 5: orthogonal against Gaussian initial weights of the tanh DEQ classifier, test error "
                "at sqrt(V) = 1, 1.5 and 2, paired by seed",
        # the power analysis needs 25, 17 and 208 seeds at sqrt(V) = 1, 1.5 and 2 (the quick effects; 001
        # gives no number); a first run with 32 seeds (2 minutes) left sqrt(V) = 1 unresolved at half its
        # quick effect: 208 seeds cover all three, in about 11 minutes on the 2-core CPU
        "options": {"seeds": 208},
        "collect": _training,
    },
    "ch5p6": {
        "page": "book/ch5_transformers/06_ensemble_study.ipynb",
        "what": "001 Table 1: mean log test perplexity of the DEQ-Transformer language model by ensemble and "
                "sqrt(V), paired by seed",
        # the power analysis needs 2 seeds at 001's effects (0.50 to 1.46 in log perplexity), but the
        # quick run's effects are far smaller (0.001 to 0.03), and two of the four Table 1 claims are not
        # resolved with 10 seeds; 40 seeds halve the standard errors, in 2 to 5 minutes
        "options": {"seeds": 40},
        "collect": _ensemble_study,
        # the collector runs the driver's quick configuration (es.QUICK), defined outside its source
        "driver_config": _ensemble_study_config,
    },
    "ch3p6": {
        "page": "book/ch3_nonlinear/06_stabilisation.ipynb",
        "what": "the remedy ranking of chapter 3 page 6: each remedy against no remedy at sqrt(V) = 2.5, "
                "last-epoch forward solver steps and monitored radius, paired by seed",
        # the power analysis (book/_data/power_analysis.json) needs at most 14 seeds for these claims at
        # the quick effects and spread; a first run with 16 left the correction undecided (0.53 steps
        # against 0.66 at quick, per-seed spread 2.7 steps): 128 seeds, about 10 minutes on the 2-core
        # CPU, resolve 2 x sd / sqrt(128), 0.72 steps at the spread they measured (4.1)
        "options": {"seeds": 128},
        "collect": _stabilisation,
    },
    "ch4p5": {
        "page": "book/ch4_kglm/05_denoising.ipynb",
        "what": "004 Fig. 6: the kGLM-initialised denoising DEQ against random initialisation, each at its best "
                "grid point (chosen on validation images, cross-fitted by seed), test MSE at epochs 0 to 5, "
                "paired by seed",
        # the power analysis needs 47 seeds for the epoch-5 claim (004's effect, 0.07 in log MSE,
        # at the quick spread, cross-fitted); 56, a margin over it, take a few minutes on the 2-core CPU
        "options": {"seeds": 56},
        "collect": _denoising,
    },
}
"""Medium experiments by page key: the page, what it settles, the driver's options at medium scale,
the collector that runs it (a function of the options returning the power analysis's raw
per-seed record) and, where the collector takes the driver's own configuration rather than
spelling it out, ``driver_config`` (a function returning that configuration, hashed by
:func:`config_hash`)."""


COLLECTORS = {"ch3p5": "collect_training", "ch3p6": "collect_stabilisation", "ch4p5": "collect_denoising",
              "ch5p6": "collect_ensemble_study"}
"""The :mod:`deqlab.lab.experiments.power_collect` function behind each experiment (hashed by
:func:`config_hash`)."""


def _key(key: Any) -> str:
    return checks.choice(key, "key", tuple(EXPERIMENTS), _WHERE)


def settings(key: str) -> dict[str, Any]:
    """The options the current code runs experiment ``key`` with at medium scale.

    Raises:
        ValueError: ``key`` is not in :data:`EXPERIMENTS`.

    Example:
        >>> from deqlab.lab.experiments import medium
        >>> medium.settings("ch3p6")["seeds"]
        128
    """
    return dict(EXPERIMENTS[_key(key)]["options"])


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


def _git_commit() -> str | None:
    # the commit, with "+dirty" when tracked files differ from it; None outside a git checkout
    from deqlab.lab.experiments import power

    return power._git_commit(str(Path(__file__).resolve().parent))


def run(key: str, directory: Any = None, *, collect: Callable[[dict], dict] | None = None) -> dict[str, Any]:
    """Run experiment ``key`` at medium scale and store its result (overwriting an older one).

    Args:
        key: a key of :data:`EXPERIMENTS`.
        directory: where to write ``<key>.json``; default :data:`DEFAULT_DIRECTORY`.
        collect: the collector to call instead of the registered one (tests use a small one).

    Returns:
        The stored record: ``experiment``, ``page``, ``what``, ``command``, ``options``,
        ``config_hash``, ``provenance``, ``raw`` (per-seed results) and ``claims`` (each claim's
        effect, standard error, 95% bootstrap interval and verdict).

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
    claims = power.claims_from_raw({key: raw})
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
        # the power analysis names its fields after the quick scale; here they are the medium run's
        "claims": [{k.replace("quick_", "").replace("_at_quick", ""): v for k, v in c.items()} for c in claims],
    }
    target = path_for(key, directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=float) + "\n")
    tmp.replace(target)  # never a half-written result
    return record


def load(key: str, directory: Any = None) -> dict[str, Any]:
    """The stored medium result of ``key``, with ``stale`` added: True when the settings it was run
    with hash differently from those the current code would run (:func:`config_hash`); rerun it
    with the command in its ``command`` field.

    Raises:
        ValueError: ``key`` is not in :data:`EXPERIMENTS`.
        FileNotFoundError: nothing is stored for ``key`` (the message gives the command that runs it).

    Example:
        >>> from deqlab.lab.experiments import medium
        >>> record = medium.load("ch3p6")  # doctest: +SKIP
        >>> record["stale"], record["options"]  # doctest: +SKIP
        (False, {'seeds': 128})
    """
    target = path_for(key, directory)
    if not target.exists():
        raise FileNotFoundError(f"{_WHERE}.load: no stored medium result for {key!r} at {target}; run "
                                f"`python -m deqlab.lab.experiments.medium {key}` to make it.")
    record = json.loads(target.read_text())
    record["stale"] = record.get("config_hash") != config_hash(key)
    return record


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

    Glues ``<prefix>_medium_stale`` (a sentence: current or stale), ``_seeds``, ``_wall`` (minutes),
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
                  "over seeds, its 95% interval (paired bootstrap over seeds, 2000 resamples) and the verdict: the "
                  "difference clears two standard errors in the claim's direction (holds), against it "
                  "(contradicted), or neither (not resolved)."
                  + (" A row without a standard error is a count: the net share of the seeds that do not tie "
                     "(the seeds column counts all of them), with the exact sign test's interval and verdict."
                     if counts else ""))
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
