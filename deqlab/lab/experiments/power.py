"""Power analysis of the claims the experiment pages test (issue 26, item 2; issue 40, items 3-4).

For each claim a page tests against a paper: its verdict at the quick scale under the book's one
verdict rule, and how many seeds 80 % power needs, given the seed-to-seed spread the page measures.

- **The unit is the seed.** Both conditions run on the same seeds (a seed fixes shared
  parameters, data or batch order), so the test is on the per-seed differences ``d_i = a_i - b_i``
  (paired); two independent groups are the unpaired case.
- **Verdicts** (:func:`analyse_claim`, :func:`claims_from_raw`): the exact permutation test within
  seed (:func:`deqlab.lab.stats.paired_permutation_test`), then Holm's procedure over each page's
  claims at ``alpha = 0.05`` (:func:`deqlab.lab.stats.claims_verdicts`): "holds", "contradicted"
  or "not resolved"; the interval is the studentised bootstrap over seeds.
- **Sizing** (:func:`seeds_for_power`): the fewest seeds at which the two-sided t-test at the
  page's Bonferroni level ``alpha / m`` (Holm's first step: conservative) reaches 80 % power against
  the effect used: the paper's effect where it gives a number, otherwise the smallest effect of
  interest the page states (:data:`SMALLEST_EFFECTS`), otherwise the quick-scale estimate, which the
  record labels as a pilot's estimate rather than a smallest effect of interest. The spread is the
  stored medium run's where there is one (:func:`stored_spreads`), else the quick run's.
  :func:`seeds_to_resolve`, :func:`detectable_effect` and :func:`power_of_z_test` are the earlier
  "two standard errors" rule (about 50 % power), kept for comparison.

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

__all__ = ["standard_error", "seeds_to_resolve", "detectable_effect", "t_test_power", "seeds_for_power",
           "effect_for_power", "power_of_z_test", "sign_test_seeds", "analyse_claim",
           "PAPER_EFFECTS", "SMALLEST_EFFECTS", "EARLIER_CH3P6_RUN", "SCALING_ASSUMPTION", "claims_from_raw", "stored_spreads",
           "frozen_spreads", "main"]

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


def _paired(paired: Any, where: str) -> bool:
    """``paired`` as a bool: a string such as ``"no"`` (truthy) or None must not pick a design silently."""
    if not isinstance(paired, (bool, np.bool_)):
        raise checks.fail("paired", "True (the conditions share their seeds) or False (independent groups)", paired,
                          where)
    return bool(paired)


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
        ValueError: naming ``sd`` (not finite or <= 0), ``n`` (not an integer >= 2) or ``paired`` (not
            True or False).

    Example:
        >>> standard_error(1.0, 4, paired=True), standard_error(1.0, 4, paired=False)
        (0.5, 0.7071067811865476)
    """
    where = f"{_WHERE}.standard_error"
    sd, n, paired = _sd(sd, where), _n(n, where), _paired(paired, where)
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
        ValueError: naming ``effect`` (zero or not finite), ``sd`` or ``z`` (not finite or <= 0) or
            ``paired`` (not True or False).

    Example:
        >>> seeds_to_resolve(0.5, 1.0, paired=True), seeds_to_resolve(0.5, 1.0, paired=False)
        (16, 32)
    """
    where = f"{_WHERE}.seeds_to_resolve"
    effect, sd, z = _effect(effect, where), _sd(sd, where), _z(z, where)
    paired = _paired(paired, where)
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
        ValueError: naming ``sd``, ``n``, ``paired`` or ``z``.

    Example:
        >>> detectable_effect(1.0, 16, paired=True)
        0.5
    """
    where = f"{_WHERE}.detectable_effect"
    z, sd, n, paired = _z(z, where), _sd(sd, where), _n(n, where), _paired(paired, where)
    return z * standard_error(sd, n, paired=paired)


def t_test_power(effect: float, sd: float, n: int, *, paired: bool, alpha: float = 0.05) -> float:
    """Power of the two-sided t-test at level ``alpha`` against a true mean difference ``effect``.

    Paired: the one-sample t-test of ``n`` per-seed differences of standard deviation ``sd`` (``n -
    1`` degrees of freedom, noncentrality ``|effect| sqrt(n) / sd``); unpaired: the two-sample test
    with ``n`` seeds per group (``2n - 2`` degrees of freedom, noncentrality ``|effect| / (sd
    sqrt(2/n))``). ``scipy.stats.nct`` gives the probability that ``|T|`` exceeds the critical
    value. The permutation tests that decide the book's verdicts have about the t-test's power for
    such data (they are the exact version of the same comparison), so this sizes them.

    Args:
        effect: the true mean difference, finite (0 gives ``alpha``).
        sd: the spread (see :func:`standard_error`), finite and > 0.
        n: seeds (pairs, or per group), an integer >= 2.
        paired: see :func:`standard_error`.
        alpha: the two-sided level, in (0, 1) (a family's Bonferroni level ``alpha / m`` for sizing).

    Returns:
        The power, in [alpha, 1).

    Raises:
        ValueError: naming ``effect``, ``sd``, ``n``, ``paired`` (not True or False) or ``alpha``.

    Example:
        >>> round(t_test_power(0.5, 1.0, 34, paired=True), 2)   # the textbook 80 % at d = 0.5
        0.81
    """
    from scipy import stats as scipy_stats

    where = f"{_WHERE}.t_test_power"
    effect = checks.number(effect, "effect", where)
    sd, n, paired = _sd(sd, where), _n(n, where), _paired(paired, where)
    alpha = checks.number(alpha, "alpha", where, lower=0.0, upper=1.0, lower_open=True, upper_open=True)
    df = n - 1 if paired else 2 * n - 2
    shift = abs(effect) / standard_error(sd, n, paired=paired)
    critical = scipy_stats.t.isf(alpha / 2, df)  # isf, not ppf(1 - alpha / 2): exact for a small alpha
    if not (math.isfinite(critical) and critical > 0):  # scipy's isf fails below about 1e-300: ppf's inf, power 0
        critical = scipy_stats.t.ppf(1 - alpha / 2, df)
    if shift > critical + 8:  # power > 1 - 1e-15, where scipy's noncentral t can return NaN
        return 1.0
    value = float(scipy_stats.nct.sf(critical, df, shift) + scipy_stats.nct.cdf(-critical, df, shift))
    if not math.isfinite(value):  # the normal approximation, should scipy fail elsewhere
        value = float(scipy_stats.norm.sf(critical - shift) + scipy_stats.norm.cdf(-critical - shift))
    return value


def seeds_for_power(effect: float, sd: float, *, paired: bool, alpha: float = 0.05, power: float = 0.8,
                    max_seeds: int = 100_000) -> int | None:
    """Fewest seeds at which the two-sided t-test at level ``alpha`` reaches ``power`` against ``effect``.

    Args:
        effect: the smallest effect the study must detect, finite and non-zero.
        sd: the spread (see :func:`standard_error`), finite and > 0.
        paired: see :func:`standard_error`.
        alpha: the level, in (0, 1): for a claim in a family of ``m`` claims under Holm's procedure,
            ``alpha / m`` (Holm's first step, so the sizing is conservative).
        power: the wanted power, in (alpha, 1).
        max_seeds: search limit, an integer >= 2.

    Returns:
        The smallest ``n >= 2`` (pairs, or seeds per group), or None when more than ``max_seeds``.

    Raises:
        ValueError: naming ``effect``, ``sd``, ``paired`` (not True or False), ``alpha``, ``power`` or
            ``max_seeds``.

    Example:
        >>> seeds_for_power(0.5, 1.0, paired=True)   # Cohen's d = 0.5, 80 %, two-sided 5 %
        34
    """
    where = f"{_WHERE}.seeds_for_power"
    effect, sd, paired = _effect(effect, where), _sd(sd, where), _paired(paired, where)
    alpha = checks.number(alpha, "alpha", where, lower=0.0, upper=1.0, lower_open=True, upper_open=True)
    power = checks.number(power, "power", where, lower=alpha, upper=1.0, lower_open=True, upper_open=True)
    max_seeds = checks.integer(max_seeds, "max_seeds", where, minimum=2)
    if t_test_power(effect, sd, max_seeds, paired=paired, alpha=alpha) < power:
        return None
    lo, hi = 2, max_seeds  # power increases with n: bisect for the first n that reaches it
    while lo < hi:
        mid = (lo + hi) // 2
        if t_test_power(effect, sd, mid, paired=paired, alpha=alpha) >= power:
            hi = mid
        else:
            lo = mid + 1
    return lo


def effect_for_power(sd: float, n: int, *, paired: bool, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest effect the two-sided t-test at level ``alpha`` detects with ``power`` at ``n`` seeds.

    Args:
        sd, n, paired: as for :func:`t_test_power`.
        alpha: the level, in (0, 1).
        power: the wanted power, in (alpha, 1).

    Returns:
        The effect (in the units of ``sd``), > 0.

    Raises:
        ValueError: naming ``sd``, ``n``, ``paired`` (not True or False), ``alpha`` or ``power`` (also
            when no finite effect reaches ``power`` at level ``alpha``).

    Example:
        >>> round(effect_for_power(1.0, 34, paired=True), 3)
        0.495
    """
    from scipy import optimize as scipy_optimize

    where = f"{_WHERE}.effect_for_power"
    sd, n, paired = _sd(sd, where), _n(n, where), _paired(paired, where)
    alpha = checks.number(alpha, "alpha", where, lower=0.0, upper=1.0, lower_open=True, upper_open=True)
    power = checks.number(power, "power", where, lower=alpha, upper=1.0, lower_open=True, upper_open=True)
    scale = standard_error(sd, n, paired=paired)
    # solve for the effect in standard errors (the power depends on effect / scale only), so that a tiny or
    # huge sd neither underflows the bracket nor overflows it
    unit_sd = math.sqrt(n) if paired else math.sqrt(n / 2.0)  # the sd whose standard error is 1

    def power_at(shift):
        return t_test_power(shift, unit_sd, n, paired=paired, alpha=alpha)

    high = 1.0
    while power_at(high) < power:
        high *= 2
        if high > 1e150:
            raise checks.fail("power", f"reachable at level alpha = {alpha:g} with n = {n} (no finite effect is)",
                              power, where)
    shift = scipy_optimize.brentq(lambda e: power_at(e) - power, 0.0, high, xtol=1e-12 * high)
    return float(shift * scale)


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
        ValueError: naming ``effect``, ``sd``, ``n``, ``paired`` or ``z``.

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
    try:
        x = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise checks.fail(name, "a 1-d array of at least 2 per-seed numbers", values, where) from None
    if x.ndim != 1 or x.size < 2:
        raise checks.fail(name, "a 1-d array of at least 2 per-seed values", np.shape(x), where)
    if np.any(np.isnan(x)):
        raise checks.fail(name, "per-seed values without NaN (drop or resolve failed runs first)", values, where)
    if not np.all(np.isfinite(x)):
        raise checks.fail(name, "finite per-seed values", values, where)
    return x


def analyse_claim(claim: str, a: Sequence[float], b: Sequence[float], *, paper_effect: float | None,
                  paper_source: str, measure: str, paired: bool = True, alpha: float = 0.05, power: float = 0.8,
                  family: int = 1, paper_seeds: int | None = None, bootstrap_seed: int = 0,
                  smallest_effect: float | None = None, smallest_effect_basis: str = "",
                  spread: float | None = None, spread_basis: str = "") -> dict[str, Any]:
    """One claim's record from the per-seed results of its two conditions: the book's verdict rule
    (:func:`deqlab.lab.stats.claims_verdicts`) and the seeds 80 % power needs.

    The claim's effect is ``mean(a) - mean(b)``, oriented so that the paper's claim is a positive
    effect (``a`` the condition the paper finds worse when the measure is an error). The test is
    the exact permutation test within seed (:func:`deqlab.lab.stats.paired_permutation_test`: a
    seed's two values swap under the null; all ``2^n`` relabellings up to 9,999, else 9,999 random
    ones), or, unpaired, ``scipy.stats.permutation_test`` of the two groups; its one-sided p-values
    are ``p_for`` (the claim's direction) and ``p_against``. ``verdict_at_quick`` applies the rule to
    this claim alone; :func:`claims_from_raw` applies Holm's procedure over each page's claims and
    overwrites it. The interval is the studentised bootstrap over seeds
    (:func:`deqlab.lab.stats.studentized_interval`, at ``1 - alpha``; unpaired: the percentile
    bootstrap of the two groups).

    Sizing: ``seeds_needed`` is the fewest seeds at which the two-sided t-test at the family's
    Bonferroni level ``alpha / family`` has ``power`` against the effect used
    (:func:`seeds_for_power`). The effect used is the paper's when it gives one, else the smallest
    effect of interest the page states (``smallest_effect``, :data:`SMALLEST_EFFECTS`), else the
    quick-scale effect itself (then the record says so: a pilot's estimate, not a smallest effect of
    interest). The spread is ``spread`` where given (the standard deviation of the per-seed
    differences in an earlier, independent run with more seeds: a pilot may estimate the spread, a
    nuisance parameter, but not the effect), else the quick-scale standard deviation of the per-seed
    differences (paired) or the pooled one (unpaired). ``detectable_now`` is the smallest effect the
    current seeds detect with that power (:func:`effect_for_power`).

    Args:
        claim: what is claimed, in words.
        a, b: per-seed values (1-d, same length, seed ``i`` at index ``i`` in both when paired),
            at least 2 each, finite, no NaN.
        paper_effect: the paper's effect in the units of ``measure`` (positive: the paper's
            direction), or None when the paper gives no number.
        paper_source: where the paper's number is (or why there is none).
        measure: what ``a`` and ``b`` are (units).
        paired: whether ``a`` and ``b`` share their seeds.
        alpha: the family-wise level, in (0, 1).
        power: the power the sizing asks for, in (alpha, 1).
        family: the number of claims in the claim's family (its page), an integer >= 1.
        paper_seeds: the paper's number of seeds (an integer >= 2) or None; when given, the record
            adds ``detectable_at_paper_seeds`` (at the quick spread).
        bootstrap_seed: seed of the permutations and of the bootstrap, an integer >= 0.
        smallest_effect: the smallest effect of interest in the units of ``measure`` (positive, in
            the claim's direction), used for the sizing when the paper gives no number; or None.
        smallest_effect_basis: why that effect is the smallest of interest (a sentence).
        spread: the standard deviation of the per-seed differences to size with (> 0), or None
            for the quick-scale one.
        spread_basis: where ``spread`` was measured (a sentence).

    Returns:
        dict: ``claim``, ``measure``, ``paper_effect``, ``paper_source``, ``paired``, ``seeds_now``
        (= the independent units), ``quick_effect``, ``quick_sd``, ``quick_se``, ``quick_lo``,
        ``quick_hi``, ``p_for``, ``p_against``, ``detectable_now``, ``verdict_at_quick``,
        ``resolved_at_quick`` (verdict ``"holds"``), ``quick_agrees_with_paper`` (sign; None without
        a paper effect), ``effect_used``, ``effect_basis``, ``sd_used``, ``sd_basis``, ``seeds_needed`` (None when the effect
        used is 0 or needs more than 100,000 seeds), ``sd_unpaired`` and ``seeds_needed_unpaired``
        (the same sizing ignoring the pairing, for comparison), ``alpha``, ``power``, ``family``,
        ``note``; with ``paper_seeds`` also ``paper_seeds`` and ``detectable_at_paper_seeds``.

    Raises:
        ValueError: naming ``claim``, ``paper_source`` or ``measure`` (not a string), ``a``/``b`` (not
            1-d arrays of numbers, fewer than 2, NaN or infinite, lengths differ when paired),
            ``paper_effect`` (zero or not finite), ``paired`` (not True or False), ``alpha``,
            ``power``, ``family``, ``paper_seeds``, ``bootstrap_seed`` (not an integer >= 0),
            ``smallest_effect`` or ``spread`` (not a positive finite number), ``smallest_effect_basis``
            or ``spread_basis`` (not a string, or empty when its number is given), or ``a`` and ``b``
            when the spread is 0 (every seed identical: nothing to size).

    Example:
        >>> r = analyse_claim("B lower than A", [1.0, 2.0, 3.0], [0.5, 1.4, 2.6], paper_effect=0.2,
        ...                   paper_source="made up", measure="error")
        >>> r["seeds_now"], round(r["quick_effect"], 3), r["seeds_needed"]
        (3, 0.5, 5)
    """
    from scipy import stats as scipy_stats

    from deqlab.lab import stats

    where = f"{_WHERE}.analyse_claim"
    for name, value in (("claim", claim), ("paper_source", paper_source), ("measure", measure),
                        ("smallest_effect_basis", smallest_effect_basis), ("spread_basis", spread_basis)):
        if not isinstance(value, str):
            raise checks.fail(name, "a string", value, where)
    for name, value, basis_name, basis in (("smallest_effect", smallest_effect, "smallest_effect_basis",
                                            smallest_effect_basis), ("spread", spread, "spread_basis", spread_basis)):
        if value is not None:
            checks.number(value, name, where, lower=0.0, lower_open=True)
            if not basis.strip():
                raise checks.fail(basis_name, f"a sentence saying why, when `{name}` is given", basis, where)
    paired = _paired(paired, where)
    bootstrap_seed = checks.integer(bootstrap_seed, "bootstrap_seed", where, minimum=0)
    if paper_seeds is not None:
        paper_seeds = checks.integer(paper_seeds, "paper_seeds", where, minimum=2)
    a, b = _per_seed(a, "a", where), _per_seed(b, "b", where)
    if paired and a.size != b.size:
        raise checks.fail("b", f"as many per-seed values as `a` ({a.size}) for a paired claim", b.size, where)
    if paper_effect is not None:
        paper_effect = _effect(paper_effect, where)
    alpha = checks.number(alpha, "alpha", where, lower=0.0, upper=1.0, lower_open=True, upper_open=True)
    power = checks.number(power, "power", where, lower=alpha, upper=1.0, lower_open=True, upper_open=True)
    family = checks.positive_int(family, "family", where)
    level = alpha / family
    sd_unpaired = float(math.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2.0))
    difference = lambda t: t[..., 1].mean(-1) - t[..., 0].mean(-1)  # noqa: E731
    if paired:
        diff = a - b
        quick_effect, quick_se = (float(v) for v in stats.mean_se(diff))
        quick_sd = float(diff.std(ddof=1))
        n = int(a.size)
        if not quick_sd > 0:
            raise checks.fail("a", "per-seed values whose differences vary (spread 0: nothing to size)", a, where)
        table = np.stack([b, a], axis=1)
        test = stats.paired_permutation_test(table, difference, key_or_seed=bootstrap_seed)
        p_for, p_against = test["p_greater"], test["p_less"]
        if n >= 3:  # the bootstrap-t of a mean of per-seed differences, its error in closed form
            error = lambda t: (t[..., 1] - t[..., 0]).std(-1, ddof=1) / math.sqrt(n)  # noqa: E731
            lo, hi = stats.studentized_interval(table, difference, confidence=1 - alpha, key_or_seed=bootstrap_seed,
                                                standard_error=error)
        else:
            lo = hi = math.nan
    else:
        quick_effect = float(a.mean() - b.mean())
        quick_se = float(math.hypot(a.std(ddof=1) / math.sqrt(a.size), b.std(ddof=1) / math.sqrt(b.size)))
        quick_sd = sd_unpaired
        n = int(min(a.size, b.size))
        if not quick_sd > 0:
            raise checks.fail("a", "per-seed values whose differences vary (spread 0: nothing to size)", a, where)
        p = {side: float(scipy_stats.permutation_test((a, b), lambda x, y, axis: x.mean(axis) - y.mean(axis),
                                                      vectorized=True, alternative=side,
                                                      **stats._scipy_rng(np.random.default_rng(bootstrap_seed))).pvalue)
             for side in ("greater", "less")}
        p_for, p_against = p["greater"], p["less"]
        groups = np.full((max(a.size, b.size), 2), np.nan)
        groups[: b.size, 0], groups[: a.size, 1] = b, a
        boot = stats.paired_bootstrap(groups, lambda t: np.nanmean(t[..., 1], -1) - np.nanmean(t[..., 0], -1),
                                      paired=False, confidence=1 - alpha, key_or_seed=bootstrap_seed)
        lo, hi = float(boot["lo"]), float(boot["hi"])
    verdict = stats.claims_verdicts([{"p_for": p_for, "p_against": p_against}], alpha=alpha)[0]["verdict"]
    detectable = effect_for_power(quick_sd, n, paired=paired, alpha=level, power=power) if n >= 2 else math.nan
    notes = []
    if paper_effect is not None:
        effect_used, basis = paper_effect, "paper"
        agrees = bool(np.sign(quick_effect) == np.sign(paper_effect))
        if not agrees:
            notes.append("the quick effect has the opposite sign or is zero: sized with the paper's effect")
        if verdict != "holds" and abs(paper_effect) >= detectable:
            notes.append(f"the quick study has {100 * power:g} % power for the paper's effect ({abs(paper_effect):.3g} "
                         f">= {detectable:.3g} detectable) but measures {quick_effect:.3g}: the effect is absent at the "
                         "quick scale, which more seeds do not change")
    elif smallest_effect is not None:
        effect_used, agrees = float(smallest_effect), None
        basis = f"smallest effect of interest (no paper number): {smallest_effect_basis}"
    else:
        effect_used, agrees = quick_effect, None
        basis = ("quick (no paper number): a pilot's estimate, not a smallest effect of interest" if quick_effect > 0
                 else "quick, opposite to the claim (no paper number): seeds to resolve the quick effect's sign")
    sd_used, sd_basis = ((float(spread), spread_basis) if spread is not None
                         else (quick_sd, "this run's per-seed differences"))
    if effect_used == 0:
        needed = needed_unpaired = None
        notes.append("quick effect exactly 0 and no paper number: nothing to size")
    else:
        needed = seeds_for_power(effect_used, sd_used, paired=paired, alpha=level, power=power)
        needed_unpaired = (seeds_for_power(effect_used, sd_unpaired, paired=False, alpha=level, power=power)
                           if sd_unpaired > 0 else None)
    record = {"claim": claim, "measure": measure, "paper_effect": paper_effect, "paper_source": paper_source,
              "paired": bool(paired), "seeds_now": n, "quick_effect": quick_effect, "quick_sd": quick_sd,
              "quick_se": quick_se, "quick_lo": lo, "quick_hi": hi, "p_for": p_for, "p_against": p_against,
              "detectable_now": detectable, "verdict_at_quick": verdict, "resolved_at_quick": verdict == "holds",
              "quick_agrees_with_paper": agrees, "effect_used": float(effect_used), "effect_basis": basis,
              "sd_used": sd_used, "sd_basis": sd_basis,
              "seeds_needed": needed, "sd_unpaired": sd_unpaired, "seeds_needed_unpaired": needed_unpaired,
              "alpha": alpha, "power": power, "family": family, "note": "; ".join(notes)}
    if paper_seeds is not None:
        paper_seeds = checks.integer(paper_seeds, "paper_seeds", where, minimum=2)
        record["paper_seeds"] = paper_seeds
        record["detectable_at_paper_seeds"] = effect_for_power(quick_sd, paper_seeds, paired=paired, alpha=level,
                                                               power=power)
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
        "& Kolter 2021, not stored): sized with the page's smallest effects of interest (SMALLEST_EFFECTS)")},
}
"""Per claim: the paper's effect (in the record's measure, positive in the paper's direction, or
None), where it is, and the paper's seeds (runs) per condition (for the remedies, which no paper
tests: the page's ``full`` scale, 8)."""

SMALLEST_EFFECTS: dict[str, dict[str, Any]] = {
    # chapter 3 page 5 (001 Fig. 5): test error in percentage points on the digits test split (359 images)
    "001_fig5": {"effect": 2.0, "basis": (
        "2 percentage points of test error, a fifth of the page's 10 % (7 of the 359 digits test images): an "
        "initialisation that changed the classifier's error by less than a fifth would not be worth choosing "
        "over the default for a reader training it")},
    # chapter 3 page 6 (the remedies at sqrt(V) = 2.5, last epoch)
    "remedies_steps": {"effect": 2.0, "basis": (
        "2 forward solver steps per solve: about 15 % of the 13 steps the unremedied model takes at sqrt(V) = 2.5 "
        "(the earlier medium run), the forward pass's cost being proportional to its steps; a remedy that saves "
        "less than that buys less than its own overhead per training step (the Jacobian penalty's extra "
        "Jacobian-vector product, the spectral norm's power iteration)")},
    "remedies_radius": {"effect": 0.1, "basis": (
        "0.1 in the monitored spectral radius: the unremedied model sits at 0.685 (the earlier medium run's mean), 0.315 "
        "below the stability edge at 1; a remedy that moves the radius by less than 0.1 changes that margin by "
        "less than a third, too little to call the model more (or less) stable")},
}
"""Per claim family without a paper number: the smallest effect of interest the page states (in the
record's measure, positive in the claim's direction) and why; the sizing uses it instead of a
pilot's point estimate (issue 40, item 4). "The earlier medium run" in the reasons of chapter 3 page 6
is :data:`EARLIER_CH3P6_RUN`."""

EARLIER_CH3P6_RUN = "e41bb99:deqlab/lab/medium_results/ch3p6.json"
"""Where the reasons of ``remedies_steps`` and ``remedies_radius`` read their numbers (the unremedied
model's last-epoch forward steps and monitored radius at sqrt(V) = 2.5, means over its 89 seeds from
10,000): the stored ch3 p6 run that the current one replaced, in the repository's history
(``git show`` it); ``tests/lab/test_medium.py`` checks the numbers against it."""

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


def claims_from_raw(raw: dict[str, Any], alpha: float = 0.05, power: float = 0.8,
                    spreads: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every claim's record (:func:`analyse_claim`) from the collected per-seed results ``raw``
    (:func:`deqlab.lab.experiments.power_collect.collect_all`), with Holm's procedure at ``alpha``
    over each page's claims (its family: :func:`deqlab.lab.stats.claims_verdicts`) and the seeds
    ``power`` needs at the family's Bonferroni level. Claims whose pages were not collected are left
    out; a count claim copied from chapter 5 page 6 keeps the verdict of that page's own family.

    Args:
        raw: dict page key -> that page's collected results, the keys among
            :data:`deqlab.lab.experiments.power_collect.COLLECTORS` (``ch3p5``, ``ch5p6``, ``ch4p4``,
            ``ch4p5``, ``ch3p6``), each as its collector returns it.
        alpha: the family-wise level, in (0, 1).
        power: the power the sizing asks for, in (alpha, 1).
        spreads: dict claim -> ``{"sd": ..., "basis": ...}``, the spread to size that claim with
            (:func:`analyse_claim`'s ``spread``; :func:`stored_spreads` reads them from the stored
            medium runs) where it is sized by a smallest effect of interest
            (:data:`SMALLEST_EFFECTS`), or None: every claim sized at its own run's spread.

    Returns:
        The records of :func:`analyse_claim`, each with its ``page``, in the pages' order.

    Raises:
        ValueError: naming ``raw`` (not a dict, an unknown page key, or a page without the entries its
            collector writes), ``alpha``, ``power`` or ``spreads`` (not a dict of such entries).
    """
    from deqlab.lab import stats
    from deqlab.lab.experiments.power_collect import COLLECTORS

    where = f"{_WHERE}.claims_from_raw"
    alpha = checks.number(alpha, "alpha", where, lower=0.0, upper=1.0, lower_open=True, upper_open=True)
    power = checks.number(power, "power", where, lower=alpha, upper=1.0, lower_open=True, upper_open=True)
    if not isinstance(raw, dict):
        raise checks.fail("raw", "a dict page key -> collected results (power_collect.collect_all)", raw, where)
    unknown = sorted(map(str, set(raw) - set(COLLECTORS)))
    if unknown:
        raise checks.fail("raw", f"a dict whose keys are among {sorted(COLLECTORS)}", f"unknown {unknown}", where)
    spreads = {} if spreads is None else spreads
    if not (isinstance(spreads, dict) and all(isinstance(v, dict) and {"sd", "basis"} <= set(v)
                                              for v in spreads.values())):
        raise checks.fail("spreads", 'None or a dict claim -> {"sd": float, "basis": str}', spreads, where)
    try:
        return _claims_from_raw(raw, alpha, power, stats, spreads)
    except (KeyError, IndexError, TypeError, AttributeError) as error:
        raise checks.fail("raw", "the per-seed results of power_collect.collect_all, every page with the entries "
                          "its collector writes", f"{type(error).__name__}: {error}", where) from error


def _claims_from_raw(raw: dict[str, Any], alpha: float, power: float, stats: Any,
                     spreads: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:

    pending = []  # (page key, claim arguments) in order, or a finished record

    def add(page, key, claim, a, b, measure, paired=True, dropped=0, extra=None, smallest=None):
        pending.append((page, dict(key=key, claim=claim, a=a, b=b, measure=measure, paired=paired, dropped=dropped,
                                   extra=extra, smallest=smallest)))

    def analyse(page, key, claim, a, b, measure, paired, dropped, extra, family, smallest):
        paper = PAPER_EFFECTS[key]
        sesoi = SMALLEST_EFFECTS.get(smallest, {})
        # a stored run's spread sizes the claims sized by a smallest effect of interest (their pages' next
        # runs); a claim sized by a paper's effect keeps the quick spread its stored run was sized with
        spread = spreads.get(claim, {}) if sesoi and paper["effect"] is None else {}
        try:
            r = analyse_claim(claim, a, b, paper_effect=paper["effect"], paper_source=paper["source"],
                              measure=measure, paired=paired, alpha=alpha, power=power, family=family,
                              paper_seeds=paper["seeds"], smallest_effect=sesoi.get("effect"),
                              smallest_effect_basis=sesoi.get("basis", ""), spread=spread.get("sd"),
                              spread_basis=spread.get("basis", ""))
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
            r["seeds_needed_with_paper_sd_unpaired"] = seeds_for_power(paper["effect"], pooled, paired=False,
                                                                       alpha=alpha / family, power=power)
        return {**r, **(extra or {})}

    if "ch3p5" in raw:
        err = raw["ch3p5"]["test_error"]
        for v in raw["ch3p5"]["settings"]["scales"]:
            g, o = 100 * np.asarray(err[f"gaussian@{v:g}"]), 100 * np.asarray(err[f"orthogonal@{v:g}"])
            add("ch3p5", "001_fig5", f"001 Fig. 5: orthogonal test error below Gaussian at sqrt(V) = {v:g}",
                g, o, "test error, Gaussian minus orthogonal (percentage points)", smallest="001_fig5")
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
        pending.append({
            "claim": f"001 Fig. 6: {c['claim']}", "page": raw["ch5p6"]["page"], "measure": c["measure"],
            "paper_effect": None, "paper_source": PAPER_EFFECTS["001_fig6"]["source"], "paired": True,
            "seeds_now": int(c["n_seeds"]), "quick_effect": share, "quick_sd": None, "quick_lo": c["lo"],
            "quick_hi": c["hi"], "verdict_at_quick": c["verdict"], "resolved_at_quick": c["verdict"] == "holds",
            "effect_used": share, "effect_basis": "quick net share of seeds (exact sign test, the page's)",
            "seeds_needed": sign_test_seeds(share) if share > 0 else None, "paper_seeds": 10, "fixed": True,
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
                    f"{what}, no remedy minus {remedy}", smallest=f"remedies_{field.split('_')[0]}")
    family = {}
    for item in pending:
        if isinstance(item, tuple):
            family[item[0]] = family.get(item[0], 0) + 1
    records = [item if isinstance(item, dict) else analyse(item[0], **item[1], family=family[item[0]])
               for item in pending]
    for page in family:  # Holm over each page's analysed claims
        members = [i for i, (item, r) in enumerate(zip(pending, records))
                   if isinstance(item, tuple) and item[0] == page and "p_for" in r]
        decided = stats.claims_verdicts([{"p_for": records[i]["p_for"], "p_against": records[i]["p_against"]}
                                         for i in members], alpha=alpha)
        for i, d in zip(members, decided):
            records[i].update(verdict_at_quick=d["verdict"], resolved_at_quick=d["verdict"] == "holds",
                              p_adjusted=d["p_adjusted"])
    for r in records:
        r.pop("fixed", None)
    return records


def stored_spreads(directory: Any = None) -> dict[str, dict[str, Any]]:
    """The spread of every claim in the stored medium runs, to size the next run with
    (:func:`claims_from_raw`'s ``spreads``): a stored run has many more seeds than the quick pilot,
    so its standard deviation of the per-seed differences is the better estimate of that nuisance
    parameter, and the next run's fresh seeds keep the two independent. Its effects are not used.

    Args:
        directory: where the stored runs are; default
            :data:`deqlab.lab.experiments.medium.DEFAULT_DIRECTORY`.

    Returns:
        dict claim -> ``{"sd": float, "basis": str}`` (the run, its seeds and its commit), for the
        claims of every stored run with a spread; empty when none is stored.

    Example:
        >>> from deqlab.lab.experiments import power
        >>> spreads = power.stored_spreads()
        >>> all(v["sd"] > 0 for v in spreads.values())
        True
    """
    import json

    from deqlab.lab.experiments import medium

    out = {}
    for key in medium.EXPERIMENTS:
        path = medium.path_for(key, directory)
        if not path.exists():
            continue
        record = json.loads(path.read_text())
        seeds = record["raw"]["settings"]["seeds"]
        commit = medium.short_commit(record["provenance"]["git_commit"])
        for c in record["claims"]:
            if isinstance(c.get("sd"), (int, float)) and c["sd"] > 0:
                out[c["claim"]] = {"sd": float(c["sd"]), "basis": (
                    f"the stored medium run {key} ({len(seeds)} seeds, {seeds[0]}-{seeds[-1]}, commit {commit}, "
                    f"{record['provenance']['date'][:10]}): its sd of the per-seed differences")}
    return out


def frozen_spreads(path: Any) -> dict[str, dict[str, Any]]:
    """The spreads an existing power analysis was sized with (each claim's ``sd_used`` and
    ``sd_basis`` where they came from a stored run), so that rerunning the analysis reproduces the
    sizes the stored medium runs were run at: after a run is stored, :func:`stored_spreads` would
    return *its* spreads, which size the next run, not the one already made.

    Args:
        path: a JSON written by :func:`main` (``book/_data/power_analysis.json``).

    Returns:
        dict claim -> ``{"sd": float, "basis": str}``; empty when the file is missing or holds
        none.

    Example:
        >>> from deqlab.lab.experiments import medium, power
        >>> frozen = power.frozen_spreads(medium.POWER_ANALYSIS)
        >>> all(v["sd"] > 0 and v["basis"].startswith("the stored medium run") for v in frozen.values())
        True
    """
    import json
    from pathlib import Path

    path = Path(path)
    if not path.exists():
        return {}
    return {c["claim"]: {"sd": float(c["sd_used"]), "basis": c["sd_basis"]}
            for c in json.loads(path.read_text()).get("claims", [])
            if isinstance(c.get("sd_used"), (int, float)) and str(c.get("sd_basis", "")).startswith("the stored")}


# ---------------------------------------------------------------------------------------------
# The script
# ---------------------------------------------------------------------------------------------


def _git_commit(root: str, outputs: Sequence[str] = ()) -> str | None:
    # the commit, with "+dirty" when tracked files other than the run's `outputs` (paths relative to the
    # repository root, e.g. stored results an earlier run of the same command wrote) differ from it
    import subprocess

    try:
        out = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        excluded = [f":(top,exclude){path}" for path in outputs]
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", ":(top)"]
                               + excluded, capture_output=True, text=True, check=True).stdout.strip()
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
    parser.add_argument("--resize", action="store_true",
                        help="size with the spreads of the medium runs stored now (for the next runs); by default a "
                             "rerun keeps the spreads the existing --out was sized with, so it reproduces the sizes "
                             "the stored runs were run at")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    raw_path = args.raw or os.path.join(root, ".power_raw.json")
    raw = power_collect.collect_all(raw_path, args.only)
    spreads = stored_spreads() if args.resize else frozen_spreads(args.out)
    records = claims_from_raw(raw, spreads=spreads or stored_spreads())
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
        "method": {"verdicts": "exact permutation test within seed per claim (deqlab.lab.stats.paired_permutation_test), "
                               "Holm over each page's claims at alpha = 0.05 (deqlab.lab.stats.claims_verdicts); "
                               "studentised bootstrap intervals; units = seeds",
                   "sizing": "seeds for 80 % power of the two-sided t-test at the page's Bonferroni level alpha / m "
                             "(power.seeds_for_power); spread = the sd of the per-seed differences in the stored "
                             "medium run where there is one (more seeds than the quick pilot; its effects unused), "
                             "else the quick-scale sd; effect = the paper's where it gives one, else the page's "
                             "stated smallest effect of interest (SMALLEST_EFFECTS), else the quick estimate "
                             "(labelled a pilot's)",
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
