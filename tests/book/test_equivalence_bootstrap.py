"""The equivalence verdicts of chapter 3's medium runs do not rest on the t approximation.

Pages 5 and 6 of chapter 3 (cells ``ch3p5-medium-b`` and ``ch3p6-medium-b``) run an equivalence
test on the stored per-seed differences of their medium runs (``deqlab/lab/medium_results/``):
:func:`deqlab.lab.stats.equivalence_test` (TOST: two one-sided t-tests) per row, Holm's procedure
over each page's rows at 5 %. The t-tests assume that the mean of the differences is close to
normal; with 62 or 94 seeds that is usually so, but the differences (test errors in steps of
1/359, solver steps, radii) can be skewed or heavy-tailed. This file adds two checks of the
pages' verdicts on the stored data, rebuilt from the same JSON fields, margins
(:data:`deqlab.lab.experiments.power.SMALLEST_EFFECTS`) and Holm families as the pages:

1. **Bootstrap verdicts** (:func:`test_bootstrap_verdicts_agree_with_the_pages_tost`): resampling
   seeds with replacement (``BOOTSTRAPS`` = 4000 resamples per row), the percentile interval of the
   mean replaces the t-interval. Holm's step-down procedure is run on intervals: rows in order of
   their bootstrap TOST p-value ``max(P*(mean <= -margin), P*(mean >= margin))``, the k-th of m
   (from 0) is equivalent when its ``1 - 2 alpha / (m - k)`` percentile interval, and those of
   every row before it, lie inside ``(-margin, margin)``. Each row's verdict must be the page's.
   With 4000 resamples the tail fraction at Holm's smallest level, 0.05/12 (about 17 resamples),
   has a Monte Carlo error of about 0.001 in level; every stored row's bootstrap p-value is at
   least 3 such errors from the level its verdict is made at (the closest: page 6's correction
   radius, 0.009 against 0.05/11 = 0.0045, standard error 0.0015).
2. **The level of the t-based TOST under the data's own shape**
   (:func:`test_tost_level_under_the_observed_shape`): each row's differences are shifted so
   that their mean sits on the nearer margin, ``d - mean(d) + sign(mean(d)) margin`` (a
   population on the boundary of the null), ``NULL_RESAMPLES`` = 2000 samples of n seeds are
   drawn from it, and the fraction that :func:`~deqlab.lab.stats.equivalence_test` declares
   equivalent at the unadjusted 5 % estimates the test's true size for that shape. The size is
   "inflated" when the exact binomial test rejects ``size <= 0.05`` at ``0.01 / rows`` (Bonferroni
   over the 15 rows of both pages, so that all rows with a true size of at most 5 % pass together
   with probability at least 99 %). With 2000 resamples that test detects a true size of 0.08
   with power about 0.99 (0.7 for 0.07), checked below with :mod:`scipy.stats`; 650 would give the
   80 % the check needs at the level 0.01 of a single row. The test is vectorised
   (one call of :func:`~deqlab.lab.stats.equivalence_test` takes about a millisecond, 60 000 calls
   would take a minute) and its p-values are checked against
   :func:`~deqlab.lab.stats.equivalence_test` on the first 20 samples of every row.

   Rows whose size is inflated are listed in :data:`LIBERAL` (the set must match exactly, so a
   rerun of a medium run that changes it fails here). For them, and for every other row, the
   verdict must survive calibration: the row's TOST p-value is replaced by its rank among the
   null samples' p-values, ``(1 + #{p* <= p}) / (R + 1)``, the larger over the two margins, and
   Holm's procedure on the calibrated p-values must give the page's verdicts.

Runs in about 1 s (NumPy and SciPy only; the resampling has fixed seeds).
"""

import json
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

from deqlab.lab import stats
from deqlab.lab.experiments import power

ROOT = Path(__file__).resolve().parents[2]
MEDIUM = ROOT / "deqlab" / "lab" / "medium_results"

ALPHA = 0.05  # the pages' level, after Holm
BOOTSTRAPS = 4000  # resamples of the seeds per row, for the percentile intervals
NULL_RESAMPLES = 2000  # samples per row drawn from the boundary-shifted differences
SIZE_CHECK_LEVEL = 0.01  # family-wise, over the rows of both pages
SEED = 20240611

# Rows whose t-based TOST rejects more often than 5 % at the margin under their own differences'
# shape. Page 5 at sqrt(V) = 1.5: the Gaussian-minus-orthogonal test errors are right-skewed
# (skewness 2.6, excess kurtosis 12: a few seeds where the Gaussian net ends 20-33 points worse),
# so at the upper margin a low sample mean comes with a low standard deviation and the one-sided
# t-test that the mean is below +2 rejects too often: measured size 0.091 (99 % Clopper-Pearson
# 0.075-0.109; the Edgeworth term gamma (2 z^2 + 1) phi(z) / (6 sqrt(n)) predicts about +0.03).
# Its verdict (Holm-adjusted t p-value 0.003; calibrated 0.023) survives calibration and the bootstrap.
LIBERAL = {("ch3p5", "sqrt(V) = 1.5")}


def _families() -> dict[str, list[tuple[str, np.ndarray, float]]]:
    """Each page's Holm family of equivalence tests: ``(label, per-seed differences, margin)`` per
    row, from the same fields, in the same order, with the same margins as the pages' cells."""
    families = {}
    # ch3p5-medium-b: 100 (gaussian@v - orthogonal@v) per seed, at the scales of the stored sizing
    record = json.loads((MEDIUM / "ch3p5.json").read_text())
    errors, margin = record["raw"]["test_error"], power.SMALLEST_EFFECTS["001_fig5"]["effect"]
    families["ch3p5"] = [
        (f"sqrt(V) = {v}", 100 * (np.asarray(errors[f"gaussian@{v}"]) - np.asarray(errors[f"orthogonal@{v}"])), margin)
        for v in (c["claim"].rsplit("= ", 1)[1] for c in record["sizing"]["claims"])]
    # ch3p6-medium-b: none@high - remedy@high of the last epoch's steps or radius, one row per stored claim
    record = json.loads((MEDIUM / "ch3p6.json").read_text())
    cells, high = record["raw"]["cells"], max(record["raw"]["settings"]["scales"])
    rows = []
    for c in record["claims"]:
        remedy = c["claim"].split(": ")[1].split(" lowers")[0]
        field, key = ("steps_last", "steps") if "steps" in c["claim"] else ("radius_last", "radius")
        d = np.asarray(cells[f"none@{high:g}"][field]) - np.asarray(cells[f"{remedy}@{high:g}"][field])
        rows.append((f"{remedy} {'forward steps' if key == 'steps' else 'radius'}", d,
                     power.SMALLEST_EFFECTS[f"remedies_{key}"]["effect"]))
    families["ch3p6"] = rows
    assert [len(rows) for rows in families.values()] == [3, 12]
    return families


def _page_verdicts(rows) -> tuple[list[dict], np.ndarray]:
    """The pages' TOST results and verdicts (Holm-adjusted p-value <= 0.05)."""
    tests = [stats.equivalence_test(d, margin) for _, d, margin in rows]
    return tests, stats.holm([t["p_value"] for t in tests]) <= ALPHA


def _tost_p(samples: np.ndarray, margin: float) -> np.ndarray:
    """:func:`deqlab.lab.stats.equivalence_test`'s p-value of each row of ``samples`` (vectorised)."""
    n = samples.shape[-1]
    mean, se = samples.mean(-1), samples.std(-1, ddof=1) / np.sqrt(n)
    assert np.all(se > 0)
    return np.maximum(scipy_stats.t.sf((mean + margin) / se, n - 1), scipy_stats.t.cdf((mean - margin) / se, n - 1))


def _resample(d: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` samples of ``d.size`` seeds drawn with replacement from ``d``: ``(count, d.size)``."""
    return d[rng.integers(0, d.size, size=(count, d.size))]


def test_bootstrap_verdicts_agree_with_the_pages_tost():
    for f, (page, rows) in enumerate(_families().items()):
        _, t_verdicts = _page_verdicts(rows)
        means = [_resample(d, BOOTSTRAPS, np.random.default_rng([SEED, f, r])).mean(-1)
                 for r, (_, d, _) in enumerate(rows)]
        p_boot = [max(np.mean(m <= -margin), np.mean(m >= margin)) for m, (_, _, margin) in zip(means, rows)]
        # Holm's step-down on percentile intervals, rows in order of their bootstrap TOST p-values
        verdicts, inside_so_far = np.zeros(len(rows), bool), True
        for k, r in enumerate(np.argsort(p_boot, kind="stable")):
            level, margin = ALPHA / (len(rows) - k), rows[r][2]
            lo, hi = np.quantile(means[r], [level, 1 - level])
            inside_so_far = inside_so_far and -margin < lo and hi < margin
            verdicts[r] = inside_so_far
        disagree = [(rows[r][0], bool(t_verdicts[r]), bool(verdicts[r]), p_boot[r])
                    for r in range(len(rows)) if verdicts[r] != t_verdicts[r]]
        assert not disagree, f"{page}: (row, t-based, bootstrap verdict, bootstrap p): {disagree}"


def test_tost_level_under_the_observed_shape():
    families = _families()
    n_rows = sum(len(rows) for rows in families.values())
    per_row = SIZE_CHECK_LEVEL / n_rows
    # the resample count detects a true size of 0.08 with >= 80 % power at the per-row level
    critical = int(scipy_stats.binom.isf(per_row, NULL_RESAMPLES, ALPHA)) + 1
    assert scipy_stats.binom.sf(critical - 1, NULL_RESAMPLES, ALPHA) <= per_row
    assert scipy_stats.binom.sf(critical - 1, NULL_RESAMPLES, 0.08) >= 0.8
    liberal = set()
    for f, (page, rows) in enumerate(families.items()):
        tests, t_verdicts = _page_verdicts(rows)
        calibrated = []
        for r, ((label, d, margin), t) in enumerate(zip(rows, tests)):
            nearer = 1.0 if d.mean() >= 0 else -1.0
            ranks = []
            for side in (nearer, -nearer):
                rng = np.random.default_rng([SEED + 1, f, r, int(side > 0)])
                null = _resample(d - d.mean() + side * margin, NULL_RESAMPLES, rng)
                p_null = _tost_p(null, margin)
                checked = [stats.equivalence_test(x, margin)["p_value"] for x in null[:20]]
                np.testing.assert_allclose(p_null[:20], checked, rtol=1e-9, atol=1e-15)
                if side == nearer:
                    rejected = int(np.sum(p_null <= ALPHA))
                    if scipy_stats.binomtest(rejected, NULL_RESAMPLES, ALPHA, alternative="greater").pvalue <= per_row:
                        liberal.add((page, label))
                ranks.append((1 + np.sum(p_null <= t["p_value"])) / (NULL_RESAMPLES + 1))
            calibrated.append(max(ranks))
        verdicts = stats.holm(calibrated) <= ALPHA
        assert np.array_equal(verdicts, t_verdicts), (page, [r[0] for r in rows], calibrated, t_verdicts.tolist())
    assert liberal == LIBERAL, f"rows whose t-based TOST is liberal under their own shape: {sorted(liberal)}"
