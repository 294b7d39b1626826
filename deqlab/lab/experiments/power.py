"""Power analysis of the claims the experiment pages test (issue 26, item 2).

For each claim a page tests against a paper, how many seeds does it take to resolve the paper's
effect at two standard errors, given the seed-to-seed spread the page measures at ``quick`` scale?

The formulas (a z-test of a mean difference, the spread taken as known):

- **paired** (both conditions run on the same seeds: a seed fixes shared parameters, data or batch
  order, so the seed is the independent unit and the test is on the per-seed differences
  ``d_i = a_i - b_i``): ``se = sd_d / sqrt(n)``, with ``sd_d`` the standard deviation of the
  differences;
- **unpaired** (two independent groups of ``n`` seeds each, per-group standard deviation ``sd``):
  ``se = sd * sqrt(2 / n)``.

An effect ``delta`` is *resolved* at ``z`` standard errors when ``|delta| >= z * se``. The seeds
needed are the smallest ``n`` with ``z * se(n) <= |delta|``: ``n = ceil((z sd / delta)^2)`` paired,
``ceil(2 (z sd / delta)^2)`` per group unpaired. At that ``n`` a true effect ``delta`` gives a
measured mean that clears ``z`` standard errors in about half of the repetitions (the power of a
z-test whose effect sits exactly at the threshold is 1/2; :func:`power_of_z_test`); 80 % power would
need ``z + 0.84`` in place of ``z``.

The units are the seeds, never the runs: a study of 10 seeds in 9 configurations has 10
independent units (``check_claims`` of :mod:`~deqlab.lab.experiments.sequence.ensemble_study`).

Run ``python -m deqlab.lab.experiments.power`` to run the pages' quick experiments (their own
drivers, one at a time: :mod:`deqlab.lab.experiments.power_collect`), analyse every claim and write
``book/_data/power_analysis.json``.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from deqlab import checks

__all__ = ["standard_error", "seeds_to_resolve", "detectable_effect", "power_of_z_test", "sign_test_seeds",
           "analyse_claim",
           "PAPER_EFFECTS", "SCALING_ASSUMPTION", "claims_from_raw", "main"]

_WHERE = "experiments.power"


def _sd(sd: Any, where: str) -> float:
    return checks.number(sd, "sd", where, lower=0.0, lower_open=True)


def _z(z: Any, where: str) -> float:
    return checks.number(z, "z", where, lower=0.0, lower_open=True)


def _effect(effect: Any, where: str) -> float:
    value = checks.number(effect, "effect", where)
    if value == 0.0:
        raise checks.fail("effect", "a finite non-zero number (a zero effect is never resolved)", effect, where)
    return value


def _n(n: Any, where: str) -> int:
    return checks.integer(n, "n", where, minimum=2)


def standard_error(sd: float, n: int, *, paired: bool) -> float:
    """Standard error of a mean difference over ``n`` seeds.

    Args:
        sd: paired: the standard deviation of the per-seed differences; unpaired: the per-group
            standard deviation (both groups alike). A finite number > 0.
        n: seeds (paired: pairs; unpaired: seeds per group), an integer >= 2.
        paired: whether the two conditions share their seeds.

    Returns:
        ``sd / sqrt(n)`` paired, ``sd * sqrt(2 / n)`` unpaired.

    Raises:
        ValueError: naming ``sd`` (not finite or <= 0) or ``n`` (not an integer >= 2).

    Example:
        >>> standard_error(1.0, 4, paired=True), standard_error(1.0, 4, paired=False)
        (0.5, 0.7071067811865476)
    """
    where = f"{_WHERE}.standard_error"
    sd, n = _sd(sd, where), _n(n, where)
    return sd / math.sqrt(n) if paired else sd * math.sqrt(2.0 / n)


def seeds_to_resolve(effect: float, sd: float, *, paired: bool, z: float = 2.0) -> int:
    """Smallest number of seeds at which ``|effect| >= z * standard_error(sd, n)``.

    Args:
        effect: the effect to resolve (a mean difference, in the units of ``sd``); finite, non-zero.
        sd: the spread (see :func:`standard_error`), finite and > 0.
        paired: paired design (``n`` pairs) or two independent groups (``n`` seeds per group).
        z: the number of standard errors, finite and > 0 (2 by default).

    Returns:
        ``max(2, ceil((z sd / |effect|)^2))`` paired, ``max(2, ceil(2 (z sd / |effect|)^2))``
        unpaired: at least 2, the fewest seeds with which a spread can be measured.

    Raises:
        ValueError: naming ``effect`` (zero or not finite), ``sd`` or ``z`` (not finite or <= 0).

    Example:
        >>> seeds_to_resolve(0.5, 1.0, paired=True), seeds_to_resolve(0.5, 1.0, paired=False)
        (16, 32)
    """
    where = f"{_WHERE}.seeds_to_resolve"
    effect, sd, z = _effect(effect, where), _sd(sd, where), _z(z, where)
    ratio = (z * sd / abs(effect)) ** 2 * (1.0 if paired else 2.0)
    # guard the ceiling against rounding just above an integer (e.g. 16.000000000000004)
    return max(2, math.ceil(ratio - 1e-9 * max(1.0, ratio)))


def detectable_effect(sd: float, n: int, *, paired: bool, z: float = 2.0) -> float:
    """Smallest effect resolved at ``z`` standard errors with ``n`` seeds: ``z * standard_error``.

    Args:
        sd: the spread (see :func:`standard_error`), finite and > 0.
        n: seeds (pairs, or seeds per group), an integer >= 2.
        paired: see :func:`standard_error`.
        z: the number of standard errors, finite and > 0.

    Returns:
        ``z * standard_error(sd, n, paired=paired)``.

    Raises:
        ValueError: naming ``sd``, ``n`` or ``z``.

    Example:
        >>> detectable_effect(1.0, 16, paired=True)
        0.5
    """
    where = f"{_WHERE}.detectable_effect"
    return _z(z, where) * standard_error(sd, n, paired=paired)


def power_of_z_test(effect: float, sd: float, n: int, *, paired: bool, z: float = 2.0) -> float:
    """Probability that the measured mean difference clears ``z`` standard errors (either sign).

    With the spread known and the mean difference normal with mean ``effect`` and standard
    deviation ``se = standard_error(sd, n)``: ``Phi(|effect|/se - z) + Phi(-|effect|/se - z)``.
    At ``n = seeds_to_resolve(effect, sd)`` the first term is at least 1/2: resolving "at two
    standard errors" means a coin flip's chance of seeing the effect clear them, not 80 % power.

    Args:
        effect: the true mean difference, finite (zero gives the two-sided false-positive rate).
        sd, n, paired, z: as for :func:`standard_error` and :func:`seeds_to_resolve`.

    Returns:
        The power, in (0, 1).

    Raises:
        ValueError: naming ``effect``, ``sd``, ``n`` or ``z``.

    Example:
        >>> round(power_of_z_test(0.5, 1.0, 16, paired=True), 3)
        0.5
    """
    from scipy.special import ndtr

    where = f"{_WHERE}.power_of_z_test"
    effect = checks.number(effect, "effect", where)
    shift = abs(effect) / standard_error(sd, n, paired=paired)
    z = _z(z, where)
    return float(ndtr(shift - z) + ndtr(-shift - z))


def sign_test_seeds(net_share: float, *, confidence: float = 0.95, max_seeds: int = 10_000) -> int | None:
    """Fewest seeds at which the exact sign test resolves a given net share of positive seeds.

    For counts and other per-seed signs the pages use :func:`deqlab.lab.stats.sign_test` (an exact
    binomial test over the seeds). With ``n`` seeds, none tied, of which a share ``(1 + s) / 2`` are
    positive (``positive = ceil(n (1 + s) / 2)``), the test resolves the direction when the lower
    end of its interval of the net share is above 0. This returns the smallest such ``n``.

    Args:
        net_share: ``s = (positive - negative) / seeds``, in (0, 1].
        confidence: the level of the sign test's interval, in (0, 1).
        max_seeds: search limit, an integer >= 2.

    Returns:
        The smallest ``n`` (>= 1), or None if none up to ``max_seeds`` resolves it.

    Raises:
        ValueError: naming ``net_share`` (not in (0, 1]), ``confidence`` or ``max_seeds``.

    Example:
        >>> sign_test_seeds(1.0)     # every seed positive: 6 seeds (2 * 2**-6 < 0.05 < 2 * 2**-5)
        6
    """
    from deqlab.lab import stats

    where = f"{_WHERE}.sign_test_seeds"
    s = checks.number(net_share, "net_share", where, lower=0.0, upper=1.0, lower_open=True)
    max_seeds = checks.integer(max_seeds, "max_seeds", where, minimum=2)
    for n in range(1, max_seeds + 1):
        positive = min(n, math.ceil(n * (1.0 + s) / 2.0 - 1e-12))
        signs = np.r_[np.ones(positive), -np.ones(n - positive)]
        if stats.sign_test(signs, confidence)["lo"] > 0:
            return n
    return None


def _per_seed(values: Any, name: str, where: str) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size < 2:
        raise checks.fail(name, "a 1-d array of at least 2 per-seed values", np.shape(x), where)
    if np.any(np.isnan(x)):
        raise checks.fail(name, "per-seed values without NaN (drop or resolve failed runs first)", values, where)
    if not np.all(np.isfinite(x)):
        raise checks.fail(name, "finite per-seed values", values, where)
    return x


def analyse_claim(claim: str, a: Sequence[float], b: Sequence[float], *, paper_effect: float | None,
                  paper_source: str, measure: str, paired: bool = True, z: float = 2.0,
                  paper_seeds: int | None = None, bootstrap_seed: int = 0) -> dict[str, Any]:
    """One claim's power record from the per-seed quick-scale results of its two conditions.

    The claim's effect is ``mean(a) - mean(b)``, oriented so that the paper's claim is a positive
    effect (``a`` the condition the paper finds worse when the measure is an error). The quick-scale
    spread is the standard deviation of the per-seed differences (``paired``) or the root mean
    square of the two groups' standard deviations (unpaired). The effect used to size the study is
    the paper's when it gives one (``paper_effect``), otherwise the quick-scale effect itself (of
    either sign: then the seeds needed are those that resolve its sign), and the record says which
    (``effect_basis``). ``verdict_at_quick`` is the page's own question: does the quick effect clear
    ``z`` standard errors in the claim's direction (``"holds"``), against it (``"contradicted"``),
    or neither (``"not resolved"``)? The paired bootstrap interval
    of the quick effect (:func:`deqlab.lab.stats.paired_bootstrap`, 2000 resamples of the seeds)
    is reported beside it.

    Args:
        claim: what is claimed, in words.
        a, b: per-seed values (1-d, same length, seed ``i`` at index ``i`` in both when paired),
            at least 2 each, finite, no NaN.
        paper_effect: the paper's effect in the units of ``measure`` (positive: the paper's
            direction), or None when the paper gives no number.
        paper_source: where the paper's number is (or why there is none).
        measure: what ``a`` and ``b`` are (units).
        paired: whether ``a`` and ``b`` share their seeds.
        z: standard errors for "resolved", finite and > 0.
        paper_seeds: the paper's number of seeds (an integer >= 2) or None; when given, the record
            adds ``detectable_at_paper_seeds``, the smallest effect that many seeds resolve at the
            quick spread.
        bootstrap_seed: seed of the bootstrap interval.

    Returns:
        dict: ``claim``, ``measure``, ``paper_effect``, ``paper_source``, ``paired``, ``seeds_now``
        (= the independent units), ``quick_effect``, ``quick_sd``, ``quick_se``, ``quick_lo``,
        ``quick_hi`` (95 % bootstrap interval), ``detectable_now`` (``z`` se), ``verdict_at_quick``,
        ``resolved_at_quick`` (verdict ``"holds"``), ``quick_agrees_with_paper`` (sign; None without
        a paper effect), ``effect_used``, ``effect_basis``, ``seeds_needed`` (None when the effect
        used is 0), ``sd_unpaired`` and ``seeds_needed_unpaired`` (the same sizing ignoring the
        pairing, for comparison), ``z``, ``note``; with ``paper_seeds`` also ``paper_seeds`` and
        ``detectable_at_paper_seeds``.

    Raises:
        ValueError: naming ``a``/``b`` (not 1-d, fewer than 2, NaN or infinite, lengths differ when
            paired), ``paper_effect`` (zero or not finite), ``z``, or ``a`` and ``b`` when the
            spread is 0 (every seed identical: nothing to size).

    Example:
        >>> r = analyse_claim("B lower than A", [1.0, 2.0, 3.0], [0.5, 1.4, 2.6], paper_effect=0.2,
        ...                   paper_source="made up", measure="error")
        >>> r["seeds_now"], round(r["quick_effect"], 3), r["seeds_needed"]
        (3, 0.5, 2)
    """
    from deqlab.lab import stats

    where = f"{_WHERE}.analyse_claim"
    a, b = _per_seed(a, "a", where), _per_seed(b, "b", where)
    if paired and a.size != b.size:
        raise checks.fail("b", f"as many per-seed values as `a` ({a.size}) for a paired claim", b.size, where)
    if paper_effect is not None:
        paper_effect = _effect(paper_effect, where)
    z = _z(z, where)
    sd_unpaired = float(math.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2.0))
    if paired:
        diff = a - b
        quick_effect, quick_se = (float(v) for v in stats.mean_se(diff))
        quick_sd = float(diff.std(ddof=1))
        boot = stats.paired_bootstrap(np.stack([b, a], axis=1), lambda t: t[..., 1].mean(-1) - t[..., 0].mean(-1),
                                      key_or_seed=bootstrap_seed)
        n = int(a.size)
    else:
        quick_effect = float(a.mean() - b.mean())
        quick_se = float(math.hypot(a.std(ddof=1) / math.sqrt(a.size), b.std(ddof=1) / math.sqrt(b.size)))
        quick_sd = sd_unpaired
        table = np.full((max(a.size, b.size), 2), np.nan)
        table[: b.size, 0], table[: a.size, 1] = b, a
        boot = stats.paired_bootstrap(table, lambda t: np.nanmean(t[..., 1], -1) - np.nanmean(t[..., 0], -1),
                                      paired=False, key_or_seed=bootstrap_seed)
        n = int(min(a.size, b.size))
    if not quick_sd > 0:
        raise checks.fail("a", "per-seed values whose differences vary (spread 0: nothing to size)", a, where)
    notes = []
    if quick_effect >= z * quick_se:
        verdict = "holds"
    elif quick_effect <= -z * quick_se:
        verdict = "contradicted"
    else:
        verdict = "not resolved"
    if paper_effect is not None:
        effect_used, basis = paper_effect, "paper"
        agrees = bool(np.sign(quick_effect) == np.sign(paper_effect))
        if not agrees:
            notes.append("the quick effect has the opposite sign or is zero: sized with the paper's effect")
        if verdict != "holds" and abs(paper_effect) >= z * quick_se:
            notes.append(f"the quick study would resolve the paper's effect ({z:g} se = {z * quick_se:.3g} <= "
                         f"{abs(paper_effect):.3g}) but measures {quick_effect:.3g}: the effect is absent at the "
                         "quick scale, which more seeds do not change")
    else:
        effect_used, agrees = quick_effect, None
        basis = ("quick (no paper number)" if quick_effect > 0 else
                 "quick, opposite to the claim (no paper number): seeds to resolve the quick effect's sign")
    if effect_used == 0:
        needed = needed_unpaired = None
        notes.append("quick effect exactly 0 and no paper number: nothing to size")
    else:
        needed = seeds_to_resolve(effect_used, quick_sd, paired=paired, z=z)
        needed_unpaired = seeds_to_resolve(effect_used, sd_unpaired, paired=False, z=z) if sd_unpaired > 0 else None
    record = {"claim": claim, "measure": measure, "paper_effect": paper_effect, "paper_source": paper_source,
              "paired": bool(paired), "seeds_now": n, "quick_effect": quick_effect, "quick_sd": quick_sd,
              "quick_se": quick_se, "quick_lo": float(boot["lo"]), "quick_hi": float(boot["hi"]),
              "detectable_now": z * quick_se, "verdict_at_quick": verdict, "resolved_at_quick": verdict == "holds",
              "quick_agrees_with_paper": agrees, "effect_used": float(effect_used), "effect_basis": basis,
              "seeds_needed": needed, "sd_unpaired": sd_unpaired, "seeds_needed_unpaired": needed_unpaired, "z": z,
              "note": "; ".join(notes)}
    if paper_seeds is not None:
        paper_seeds = checks.integer(paper_seeds, "paper_seeds", where, minimum=2)
        record["paper_seeds"] = paper_seeds
        record["detectable_at_paper_seeds"] = detectable_effect(quick_sd, paper_seeds, paired=paired, z=z)
    return record


# ---------------------------------------------------------------------------------------------
# The papers' effects (numbers quoted from /work/shared/papers; where a figure is only a plot and
# the stored text has no image, there is no number, and the record says so)
# ---------------------------------------------------------------------------------------------

_TABLE1 = ("; 001 gives mean perplexities, not mean log perplexities: ln of the ratio of means stands for the "
           "difference of mean log perplexities, which diverging seeds inflate less than a mean perplexity "
           "(Jensen), so the effect on the log scale is likely smaller and the seeds needed a lower bound")

PAPER_EFFECTS: dict[str, dict[str, Any]] = {
    "001_fig5": {"effect": None, "seeds": 10, "source": (
        "001 Fig. 5 (§4.1) is a plot only; the stored text (001_*.txt) has the caption and §4.1's words "
        "('for larger scales, the orthogonal initialization obtains lower test error') but not the figure, "
        "so no value is read off here")},
    # 001 Table 1 (Wikitext-103, mean test perplexity over 10 seeds): GOE 71.8 / 69.8 / 68.3, orthogonal
    # 162.7 / 173.4 / 112.1, random 153.9 / 224.9 / 481.5 at sqrt(V) = 0.1 / 0.3 / 1.0
    "001_table1_goe_0.1": {"seeds": 10, "effect": math.log(153.9 / 71.8), "source": (
        "001 Table 1, sqrt(V) = 0.1: mean perplexity GOE 71.8, runner-up random 153.9; effect ln(153.9/71.8)" + _TABLE1)},
    "001_table1_goe_0.3": {"seeds": 10, "effect": math.log(173.4 / 69.8), "source": (
        "001 Table 1, sqrt(V) = 0.3: mean perplexity GOE 69.8, orthogonal 173.4 (random 224.9); "
        "effect against the nearer, orthogonal: ln(173.4/69.8)" + _TABLE1)},
    "001_table1_goe_1": {"seeds": 10, "effect": math.log(112.1 / 68.3), "source": (
        "001 Table 1, sqrt(V) = 1.0: mean perplexity GOE 68.3, runner-up orthogonal 112.1; effect ln(112.1/68.3)" + _TABLE1)},
    "001_table1_orth_1": {"seeds": 10, "effect": math.log(481.5 / 112.1), "source": (
        "001 Table 1, sqrt(V) = 1.0: mean perplexity orthogonal 112.1, random 481.5; effect ln(481.5/112.1)" + _TABLE1)},
    "004_fig5": {"effect": None, "seeds": 100, "source": (
        "004 Fig. 5a (§4) is a plot only; the stored text (004_*.txt) has the caption ('kGLM initialisation "
        "offers a better starting point and faster training') but not the figure: no value read off")},
    # 004 App. F Table 1 (hyperspectral denoising, the same model and grids as Fig. 6, 4 channel row, 70 runs):
    # mean +- sd of the log test MSE at the best spectral norm: epoch 0 kGLM -4.80 +- 0.55, random
    # -3.37 +- 0.17; epoch 5 kGLM -6.64 +- 0.02, random -6.57 +- 0.01
    "004_fig6_epoch0": {"effect": -3.37 - (-4.80), "paper_sd": (0.55, 0.17), "seeds": 70, "source": (
        "004 App. F Table 1, 4-channel hyperspectral row (Fig. 6's CIFAR-10 panels are plots only): mean log "
        "test MSE at the best spectral norm, epoch 0: kGLM -4.80 +- 0.55, random -3.37 +- 0.17 (70 runs); "
        "effect 1.43")},
    "004_fig6_epoch5": {"effect": -6.57 - (-6.64), "paper_sd": (0.02, 0.01), "seeds": 70, "source": (
        "004 App. F Table 1, 4-channel hyperspectral row: epoch 5: kGLM -6.64 +- 0.02, random -6.57 +- 0.01 "
        "(70 runs); effect 0.07")},
    "001_fig6": {"effect": None, "seeds": 10, "source": (
        "001 Fig. 6 is a plot only and the stored text gives no rate ('they have a higher chance of diverging, "
        "and generally converge more slowly'; Table 1 caption 'less stable learning than GOE and orthogonal'): "
        "sized with the quick net share of seeds")},
    "remedies": {"effect": None, "seeds": 8, "source": (
        "no paper of /work/shared/papers (000-004) ranks the remedies (Jacobian regularisation is Bai, Koltun "
        "& Kolter 2021, not stored): sized with the quick effect")},
}
"""Per claim: the paper's effect (in the record's measure, positive in the paper's direction, or
None), where it is, and the paper's seeds (runs) per condition (for the remedies, which no paper
tests: the page's ``full`` scale, 8)."""

SCALING_ASSUMPTION = (
    "Seeds needed are at the quick setting (the quick width, epochs, data and test-set sizes): the spread is "
    "measured at one setting only and is not extrapolated in width or epochs, so no width or epoch count is "
    "derived here. A medium scale with more data should re-measure the spread; if it falls like 1/sqrt(test-set "
    "size) (test sampling dominating), the seeds needed fall by the ratio of the test-set sizes. The papers' "
    "effects are transferred by their measure: differences of log perplexity / log MSE (scale-free ratios) are "
    "used as they are; a test-error difference in percentage points would be, but 001 gives none as a number.")
"""What the seeds-needed column assumes about width and epochs (written into the JSON)."""


def _log_pair(a, b):
    """Per-seed natural logs of two conditions, seeds where either is non-finite or <= 0 left out."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    keep = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
    return np.log(a[keep]), np.log(b[keep]), int(np.sum(~keep))


def claims_from_raw(raw: dict[str, Any], z: float = 2.0) -> list[dict[str, Any]]:
    """Every claim's record (:func:`analyse_claim`) from the collected per-seed results ``raw``
    (:func:`deqlab.lab.experiments.power_collect.collect_all`). Claims whose pages were not
    collected are left out."""
    records = []

    def add(page, key, claim, a, b, measure, paired=True, dropped=0, extra=None):
        paper = PAPER_EFFECTS[key]
        try:
            r = analyse_claim(claim, a, b, paper_effect=paper["effect"], paper_source=paper["source"],
                              measure=measure, paired=paired, z=z, paper_seeds=paper["seeds"])
        except ValueError as error:  # e.g. every seed of a condition failed: say so in the table
            r = {"claim": claim, "measure": measure, "paper_effect": paper["effect"], "paper_source": paper["source"],
                 "seeds_now": int(np.size(a)), "seeds_needed": None, "resolved_at_quick": False,
                 "verdict_at_quick": "not analysed", "note": f"not analysed: {error}"}
        r["page"] = raw[page]["page"]
        if dropped:
            r["note"] = "; ".join(s for s in (r.get("note", ""), f"{dropped} seed(s) with a failed run left out") if s)
        if "paper_sd" in paper:
            sd1, sd2 = paper["paper_sd"]
            pooled = math.sqrt((sd1**2 + sd2**2) / 2)
            r["paper_sd"] = list(paper["paper_sd"])
            r["seeds_needed_with_paper_sd_unpaired"] = seeds_to_resolve(paper["effect"], pooled, paired=False, z=z)
        records.append({**r, **(extra or {})})

    if "ch3p5" in raw:
        err = raw["ch3p5"]["test_error"]
        for v in raw["ch3p5"]["settings"]["scales"]:
            g, o = 100 * np.asarray(err[f"gaussian@{v:g}"]), 100 * np.asarray(err[f"orthogonal@{v:g}"])
            add("ch3p5", "001_fig5", f"001 Fig. 5: orthogonal test error below Gaussian at sqrt(V) = {v:g}",
                g, o, "test error, Gaussian minus orthogonal (percentage points)")
    if "ch5p6" in raw:
        ppl = raw["ch5p6"]["test_perplexity"]
        for key, worse, better, text in [
                ("001_table1_goe_0.1", "gaussian@0.1", "goe@0.1", "GOE mean below random at sqrt(V) = 0.1"),
                ("001_table1_goe_0.3", "orthogonal@0.3", "goe@0.3", "GOE mean below orthogonal at sqrt(V) = 0.3"),
                ("001_table1_goe_1", "orthogonal@1", "goe@1", "GOE mean below orthogonal at sqrt(V) = 1"),
                ("001_table1_orth_1", "gaussian@1", "orthogonal@1", "orthogonal mean below random at sqrt(V) = 1")]:
            a, b, dropped = _log_pair(ppl[worse], ppl[better])
            add("ch5p6", key, f"001 Table 1: {text}", a, b,
                f"log test perplexity (nats per token), {worse.split('@')[0]} minus {better.split('@')[0]}",
                dropped=dropped)
    for c in raw.get("ch5p6", {}).get("page_claims", []):
        if c["kind"] != "001" or not c["method"].startswith("exact one-sided sign tests"):
            continue
        share = float(c["estimate"])
        records.append({
            "claim": f"001 Fig. 6: {c['claim']}", "page": raw["ch5p6"]["page"], "measure": c["measure"],
            "paper_effect": None, "paper_source": PAPER_EFFECTS["001_fig6"]["source"], "paired": True,
            "seeds_now": int(c["n_seeds"]), "quick_effect": share, "quick_sd": None, "quick_lo": c["lo"],
            "quick_hi": c["hi"], "verdict_at_quick": c["verdict"], "resolved_at_quick": c["verdict"] == "holds",
            "effect_used": share, "effect_basis": "quick net share of seeds (exact sign test, the page's)",
            "seeds_needed": sign_test_seeds(share) if share > 0 else None, "paper_seeds": 10,
            "note": ("seeds for the exact sign test to resolve this net share with no ties (ties lower the "
                     "share; the page needs both comparisons, this is the weaker): " + c["detail"])
            if share > 0 else (f"net share <= 0 at quick scale: nothing to size (even with every seed agreeing the "
                               f"exact sign test needs {sign_test_seeds(1.0)} seeds); " + c["detail"])})
    if "ch4p4" in raw:
        curves = raw["ch4p4"]["test_error_curve"]
        last = raw["ch4p4"]["settings"]["epochs"]
        for scheme, epoch in [("informed", 0), ("informed", last), ("naive", last)]:
            a, b, dropped = _log_pair([c[epoch] for c in curves["random"]], [c[epoch] for c in curves[scheme]])
            add("ch4p4", "004_fig5", f"004 Fig. 5a: {scheme} kGLM test MSE below random at epoch {epoch}", a, b,
                f"log test MSE, random minus {scheme}", dropped=dropped)
    if "ch4p5" in raw:
        cells = {c["epoch"]: c for c in raw["ch4p5"]["best_cells"]}
        for epoch, key in [(0, "004_fig6_epoch0"), (max(cells), "004_fig6_epoch5")]:
            c = cells[epoch]
            a, b, dropped = _log_pair(c["random"], c["kglm"])
            add("ch4p5", key, f"004 Fig. 6: kGLM test MSE below random at epoch {epoch} (grid points chosen on validation, "
                f"cross-fitted by seed)",
                a, b, "log test MSE, random minus kGLM", dropped=dropped,
                extra={"grid_points": {"random": c["random_scale"], "kglm": c["kglm_scale"]}})
    if "ch3p6" in raw:
        cells = raw["ch3p6"]["cells"]
        high = max(raw["ch3p6"]["settings"]["scales"])
        for remedy in raw["ch3p6"]["settings"]["remedies"][1:]:
            for field, what in (("steps_last", "forward solver steps, last epoch"),
                                ("radius_last", "monitored radius, last epoch")):
                add("ch3p6", "remedies", f"ch3 p6 ranking: {remedy} lowers the {what} at sqrt(V) = {high:g}",
                    cells[f"none@{high:g}"][field], cells[f"{remedy}@{high:g}"][field],
                    f"{what}, no remedy minus {remedy}")
    return records


# ---------------------------------------------------------------------------------------------
# The script
# ---------------------------------------------------------------------------------------------


def _git_commit(root: str) -> str | None:
    import subprocess

    try:
        out = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def _format_table(records: Sequence[dict[str, Any]]) -> str:
    lines = [f"{'claim':<78} {'paper':>7} {'quick':>8} {'sd':>7} {'now':>4} {'need':>6} {'verdict at quick':>13}"]
    for r in records:
        def num(v, spec):
            return "-" if v is None else format(v, spec)
        lines.append(f"{r['claim'][:78]:<78} {num(r.get('paper_effect'), '7.3f')} {num(r.get('quick_effect'), '8.3f')} "
                     f"{num(r.get('quick_sd'), '7.3f')} {r['seeds_now']:>4} {num(r.get('seeds_needed'), '>6')} "
                     f"{r.get('verdict_at_quick', '-'):>13}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Collect the quick experiments (or read them from ``--raw``), analyse, write the JSON, print
    the table. ``--only KEY ...`` limits the pages (ch3p5 ch5p6 ch4p4 ch4p5 ch3p6)."""
    import argparse
    import datetime
    import json
    import os
    import platform
    import time

    import deqlab
    from deqlab.lab.experiments import power_collect

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    parser = argparse.ArgumentParser(prog="python -m deqlab.lab.experiments.power", description=main.__doc__)
    parser.add_argument("--raw", default=None, help="JSON of collected per-seed results: reused, extended")
    parser.add_argument("--out", default=os.path.join(root, "book", "_data", "power_analysis.json"))
    parser.add_argument("--only", nargs="*", default=None, choices=sorted(power_collect.COLLECTORS))
    args = parser.parse_args(argv)
    start = time.perf_counter()
    raw_path = args.raw or os.path.join(root, ".power_raw.json")
    raw = power_collect.collect_all(raw_path, args.only)
    records = claims_from_raw(raw)
    result = {
        "description": "Power analysis of the claims the experiment pages test (issue 26, item 2): "
                       "deqlab.lab.experiments.power",
        "provenance": {"deqlab_version": deqlab.__version__, "git_commit": _git_commit(root),
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "machine": {"platform": platform.platform(), "processor": platform.machine(),
                                   "cpus": os.cpu_count(), "python": platform.python_version()},
                       "wall_time_s": {k: round(v["seconds"], 1) for k, v in raw.items()},
                       # this invocation: the collection of the pages not read back from --raw, and the analysis
                       "script_wall_time_s": round(time.perf_counter() - start, 1),
                       "environment": {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "DEQLAB_SCALE")}},
        "method": {"z": 2.0, "rule": "resolved when |mean difference| >= z * se; paired: se = sd(d)/sqrt(n); "
                                     "unpaired: se = sd*sqrt(2/n); units = seeds",
                   "power_at_seeds_needed": "about 1/2 (z-test at exactly z standard errors); 80 % needs z + 0.84",
                   "scaling_assumption": SCALING_ASSUMPTION},
        "settings": {k: {"page": v["page"], "driver": v["driver"], "settings": v["settings"]} for k, v in raw.items()},
        "claims": records,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1, default=float)
        fh.write("\n")
    print(_format_table(records))
    print("wall time (s): " + ", ".join(f"{k} {v:.0f}" for k, v in result["provenance"]["wall_time_s"].items()))
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
