"""deqlab.lab.experiments.power: the seeds-needed formulas against simulation, paired against
unpaired, the claim records, and the errors on bad input."""

import math

import numpy as np
import pytest

from deqlab.lab.experiments import power

pytestmark = pytest.mark.float64

REPEATS = 20_000  # Monte Carlo repetitions: the binomial sd of a fraction near 1/2 is 0.0035


def _tolerance(p: float) -> float:
    # 4.5 binomial standard errors of a fraction estimated from REPEATS repetitions: a false alarm
    # has probability ~7e-6 per check
    return 4.5 * math.sqrt(p * (1 - p) / REPEATS)


@pytest.mark.parametrize("effect, sd", [(0.5, 1.0), (-0.3, 0.7), (2.0, 1.3)])
def test_paired_seeds_resolve_at_two_standard_errors_in_simulation(effect, sd):
    n = power.seeds_to_resolve(effect, sd, paired=True)
    # the smallest such n: one seed fewer leaves the effect below two standard errors
    assert abs(effect) >= 2 * sd / math.sqrt(n) * (1 - 1e-12)
    if n > 2:
        assert abs(effect) < 2 * sd / math.sqrt(n - 1)
    rng = np.random.default_rng(1)
    differences = rng.normal(effect, sd, size=(REPEATS, n))  # per-seed differences, one row per study
    se = sd / math.sqrt(n)  # known spread: the z-test the formula assumes
    fraction = float(np.mean(np.abs(differences.mean(1)) >= 2 * se))
    expected = power.power_of_z_test(effect, sd, n, paired=True)
    assert abs(fraction - expected) < _tolerance(expected), (fraction, expected, n)
    # at the threshold the power is one half, a little above it from the ceiling
    assert 0.5 <= expected < power.power_of_z_test(effect, sd, n + 40, paired=True)


def test_exactly_at_threshold_the_power_is_one_half():
    n = power.seeds_to_resolve(0.5, 1.0, paired=True)
    assert n == 16  # (2 * 1 / 0.5)^2 exactly: no rounding up
    rng = np.random.default_rng(2)
    means = rng.normal(0.5, 1.0, size=(REPEATS, n)).mean(1)
    fraction = float(np.mean(np.abs(means) >= 2 * 1.0 / math.sqrt(n)))
    assert abs(fraction - 0.5) < _tolerance(0.5), fraction


def test_unpaired_groups_in_simulation():
    effect, sd = 0.5, 1.0
    n = power.seeds_to_resolve(effect, sd, paired=False)
    assert n == 32  # 2 (2 sd / effect)^2 per group
    rng = np.random.default_rng(3)
    a = rng.normal(effect, sd, size=(REPEATS, n))
    b = rng.normal(0.0, sd, size=(REPEATS, n))
    se = power.standard_error(sd, n, paired=False)
    fraction = float(np.mean(np.abs(a.mean(1) - b.mean(1)) >= 2 * se))
    expected = power.power_of_z_test(effect, sd, n, paired=False)
    assert abs(fraction - expected) < _tolerance(expected), (fraction, expected)


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_pairing_divides_the_seeds_by_one_minus_the_correlation(rho):
    # two conditions of per-seed sd s and correlation rho: the differences have sd s sqrt(2 (1 - rho)),
    # so the paired study needs (1 - rho) times the seeds per group of the unpaired one
    effect, s = 0.2, 1.0
    paired = power.seeds_to_resolve(effect, s * math.sqrt(2 * (1 - rho)), paired=True)
    unpaired = power.seeds_to_resolve(effect, s, paired=False)
    assert abs(paired - (1 - rho) * unpaired) <= 1, (paired, unpaired)
    # and the same relation for the measured spreads of simulated correlated pairs
    rng = np.random.default_rng(4)
    shared = rng.normal(size=200_000)
    a = math.sqrt(rho) * shared + math.sqrt(1 - rho) * rng.normal(size=shared.size)
    b = math.sqrt(rho) * shared + math.sqrt(1 - rho) * rng.normal(size=shared.size)
    assert abs(np.std(a - b) - s * math.sqrt(2 * (1 - rho))) < 0.01


def test_detectable_effect_is_the_inverse_of_seeds_to_resolve():
    for n in (2, 5, 10, 100):
        effect = power.detectable_effect(0.8, n, paired=True)
        assert power.seeds_to_resolve(effect, 0.8, paired=True) == n
        effect = power.detectable_effect(0.8, n, paired=False)
        assert power.seeds_to_resolve(effect, 0.8, paired=False) == n


def test_claim_record_of_simulated_seeds():
    rng = np.random.default_rng(5)
    seed_effect = rng.normal(0.0, 5.0, 12)  # large shared seed effects, removed by the pairing
    b = seed_effect + rng.normal(0.0, 0.1, 12)
    a = b + 1.0 + rng.normal(0.0, 0.2, 12)
    r = power.analyse_claim("a above b", a, b, paper_effect=0.1, paper_source="test", measure="units",
                            paper_seeds=10)
    sd = float(np.std(a - b, ddof=1))
    assert r["seeds_now"] == 12 and r["paired"] and r["effect_basis"] == "paper"
    assert r["quick_sd"] == pytest.approx(sd)
    # 80 % power of the two-sided t-test at 5 %: the noncentral t's answer
    assert r["seeds_needed"] == power.seeds_for_power(0.1, sd, paired=True)
    assert power.t_test_power(0.1, sd, r["seeds_needed"], paired=True) >= 0.8
    assert power.t_test_power(0.1, sd, r["seeds_needed"] - 1, paired=True) < 0.8
    assert r["verdict_at_quick"] == "holds" and r["resolved_at_quick"] and r["quick_agrees_with_paper"]
    assert r["p_for"] == pytest.approx(1 / 4096) and r["p_against"] == 1.0  # all 2^12 relabellings: the extreme
    assert r["quick_lo"] < r["quick_effect"] < r["quick_hi"]
    assert r["sd_unpaired"] > 10 * sd and r["seeds_needed_unpaired"] > 100 * r["seeds_needed"]
    assert power.t_test_power(r["detectable_at_paper_seeds"], sd, 10, paired=True) == pytest.approx(0.8)
    # the quick effect against the paper's sign: sized with the paper's effect, said so
    r = power.analyse_claim("a below b", b, a, paper_effect=0.1, paper_source="test", measure="units")
    assert r["verdict_at_quick"] == "contradicted" and r["quick_agrees_with_paper"] is False
    assert r["effect_used"] == 0.1 and "paper's effect" in r["note"]
    # no paper number: sized with the quick effect and labelled
    r = power.analyse_claim("a above b", a, b, paper_effect=None, paper_source="none", measure="units")
    assert r["effect_basis"].startswith("quick") and r["effect_used"] == pytest.approx(r["quick_effect"])


def test_claims_from_raw_drops_failed_seeds_and_keeps_the_sources():
    curves = {"random": [[1.0, 0.5], [1.2, 0.6], [0.9, 0.4]], "informed": [[0.3, 0.2], [0.35, 0.21], [0.3, 0.25]],
              "naive": [[0.8, 0.45], [float("nan"), 0.5], [0.7, 0.39]]}
    raw = {"ch4p4": {"page": "p", "driver": "d", "settings": {"epochs": 1}, "seconds": 1.0,
                     "test_error_curve": curves}}
    records = power.claims_from_raw(raw)
    assert [r["seeds_now"] for r in records] == [3, 3, 3]
    assert all(r["paper_source"].startswith("004 Fig. 5a") for r in records)
    assert records[0]["quick_effect"] == pytest.approx(np.mean(np.log([1 / 0.3, 1.2 / 0.35, 0.9 / 0.3])))
    naive_epoch0 = power.claims_from_raw({"ch4p4": {**raw["ch4p4"], "settings": {"epochs": 0}}})[2]
    assert naive_epoch0["seeds_now"] == 2 and "1 seed(s) with a failed run left out" in naive_epoch0["note"]


@pytest.mark.parametrize("call, name", [
    (lambda: power.seeds_to_resolve(0.0, 1.0, paired=True), "effect"),
    (lambda: power.seeds_to_resolve(float("nan"), 1.0, paired=True), "effect"),
    (lambda: power.seeds_to_resolve(0.5, 0.0, paired=True), "sd"),
    (lambda: power.seeds_to_resolve(0.5, -1.0, paired=False), "sd"),
    (lambda: power.seeds_to_resolve(0.5, float("inf"), paired=True), "sd"),
    (lambda: power.seeds_to_resolve(0.5, 1.0, paired=True, z=0.0), "z"),
    (lambda: power.standard_error(1.0, 1, paired=True), "n"),
    (lambda: power.sign_test_seeds(0.0), "net_share"),
    (lambda: power.sign_test_seeds(1.5), "net_share"),
    (lambda: power.detectable_effect(1.0, 2.5, paired=True), "n"),
    (lambda: power.power_of_z_test(0.5, 1.0, 1, paired=True), "n"),
    (lambda: power.analyse_claim("c", [1.0], [2.0], paper_effect=None, paper_source="", measure=""), "a"),
    (lambda: power.analyse_claim("c", [1.0, np.nan], [2.0, 3.0], paper_effect=None, paper_source="",
                                 measure=""), "a"),
    (lambda: power.analyse_claim("c", [1.0, 2.0], [2.0, np.inf], paper_effect=None, paper_source="",
                                 measure=""), "b"),
    (lambda: power.analyse_claim("c", [1.0, 2.0, 3.0], [2.0, 3.0], paper_effect=None, paper_source="",
                                 measure=""), "b"),
    (lambda: power.analyse_claim("c", [1.0, 2.0], [0.0, 1.0], paper_effect=None, paper_source="",
                                 measure=""), "a"),
    (lambda: power.analyse_claim("c", [1.0, 2.0], [0.5, 1.0], paper_effect=0.0, paper_source="",
                                 measure=""), "effect"),
    (lambda: power.analyse_claim("c", [1.0, 2.0], [0.5, 1.0], paper_effect=None, paper_source="",
                                 measure="", paper_seeds=1), "paper_seeds"),
])
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=f"`{name}` must be"):
        call()


@pytest.mark.parametrize("collector", ["collect_training", "collect_stabilisation", "collect_denoising"])
@pytest.mark.parametrize("first_seed", [-1, 1.5, True, "10000", None])
def test_collectors_name_a_bad_first_seed(collector, first_seed):
    # the medium runs start their seeds past the pilots' (medium.FRESH_SEED); a bad start is refused before
    # anything is trained, by name
    from deqlab.lab.experiments import power_collect

    with pytest.raises(ValueError, match=rf"power_collect\.{collector}: `first_seed` must be an integer >= 0"):
        getattr(power_collect, collector)(seeds=2, first_seed=first_seed)


def test_sign_test_seeds_is_the_smallest_resolving_count():
    from scipy.stats import binomtest

    assert power.sign_test_seeds(1.0) == 6  # all positive: two-sided exact p = 2^(1-n) < 0.05 from n = 6
    for share in (1.0, 0.6, 0.3):
        n = power.sign_test_seeds(share)
        positive = math.ceil(n * (1 + share) / 2 - 1e-12)
        assert binomtest(positive, n, 0.5).pvalue < 0.05
    # and at share 1 one seed fewer does not reject: p = 2 * 2^-5 = 0.0625
    assert binomtest(5, 5, 0.5).pvalue >= 0.05


def test_claim_record_says_when_the_quick_scale_lacks_a_resolvable_paper_effect():
    rng = np.random.default_rng(6)
    b = rng.normal(0.0, 1.0, 10)
    a = b + rng.normal(0.0, 0.01, 10)  # no effect, tiny spread: a paper effect of 1 would be resolved
    r = power.analyse_claim("a above b", a, b, paper_effect=1.0, paper_source="test", measure="units")
    assert r["verdict_at_quick"] == "not resolved" and r["seeds_needed"] == power.seeds_for_power(1.0, r["quick_sd"],
                                                                                                  paired=True)
    assert "absent at the quick scale" in r["note"]


def test_t_test_power_matches_simulation_and_sizing_inverts_it():
    """The noncentral-t power of the paired t-test against 4,000 simulated studies of 12 seeds
    (d = 0.8): the rejection rate is within 3 binomial SE (0.02) of it; seeds_for_power is the
    first n whose power reaches 0.8 and effect_for_power its inverse in the effect. A family of m
    claims sizes at alpha / m, so it needs more seeds."""
    from scipy import stats as scipy_stats

    rng = np.random.default_rng(11)
    d = rng.normal(0.8, 1.0, (4000, 12))
    rejected = scipy_stats.ttest_1samp(d, 0.0, axis=1).pvalue < 0.05
    predicted = power.t_test_power(0.8, 1.0, 12, paired=True)
    assert abs(rejected.mean() - predicted) < 3 * math.sqrt(predicted * (1 - predicted) / 4000)
    n = power.seeds_for_power(0.8, 1.0, paired=True)
    assert power.t_test_power(0.8, 1.0, n, paired=True) >= 0.8 > power.t_test_power(0.8, 1.0, n - 1, paired=True)
    assert power.effect_for_power(1.0, n, paired=True) <= 0.8
    assert power.seeds_for_power(0.8, 1.0, paired=True, alpha=0.05 / 10) > n
    assert power.seeds_for_power(1e-6, 1.0, paired=True, max_seeds=1000) is None
    assert power.t_test_power(50.0, 1.0, 40, paired=True) == 1.0  # far tail: no NaN from scipy


def test_claims_from_raw_holds_each_page_to_holm():
    """Two claims of one page (ch3p6: a remedy against none, on two measures): one clear, one absent.
    The clear one's p-value (its 2^8 relabellings' extreme, 1/256 one-sided) survives Holm over the
    page's family of 2; every record of the page carries the family's size and its adjusted p."""
    rng = np.random.default_rng(12)
    base = {"steps_last": list(20 + rng.normal(0, 1, 8)), "radius_last": list(0.9 + rng.normal(0, 0.01, 8))}
    spectral = {"steps_last": list(np.asarray(base["steps_last"]) - 5 + rng.normal(0, 0.1, 8)),
                "radius_last": list(np.asarray(base["radius_last"]) + rng.normal(0, 0.01, 8))}
    raw = {"ch3p6": {"page": "p", "driver": "d", "seconds": 1.0, "cells": {"none@2.5": base, "spectral@2.5": spectral},
                     "settings": {"scales": [2.5], "remedies": ["none", "spectral"], "seeds": list(range(8))}}}
    steps, radius = power.claims_from_raw(raw)
    assert steps["verdict_at_quick"] == "holds" and steps["p_adjusted"] == pytest.approx(2 * 2 / 256)
    assert radius["verdict_at_quick"] == "not resolved"
    assert steps["family"] == radius["family"] == 2


def test_a_stated_smallest_effect_and_an_earlier_spread_size_a_claim_without_a_paper_number():
    # issue 40 item 4: without a paper number the sizing uses the page's smallest effect of interest, not the
    # pilot's estimate, at the spread of an earlier independent run where one is given; both are recorded
    a, b = np.array([1.0, 2.0, 3.5, 4.0]), np.array([0.9, 1.7, 3.4, 3.6])
    pilot = power.analyse_claim("a above b", a, b, paper_effect=None, paper_source="none", measure="units")
    stated = power.analyse_claim("a above b", a, b, paper_effect=None, paper_source="none", measure="units",
                                 smallest_effect=0.05, smallest_effect_basis="why", spread=0.2, spread_basis="run")
    assert pilot["effect_used"] == pytest.approx(pilot["quick_effect"]) and pilot["sd_used"] == pilot["quick_sd"]
    assert stated["effect_used"] == 0.05 and stated["effect_basis"].endswith("why")
    assert (stated["sd_used"], stated["sd_basis"]) == (0.2, "run")
    assert stated["seeds_needed"] == power.seeds_for_power(0.05, 0.2, paired=True)
    # a paper's number still wins over the stated effect
    paper = power.analyse_claim("a above b", a, b, paper_effect=0.3, paper_source="p", measure="units",
                                smallest_effect=0.05, smallest_effect_basis="why")
    assert (paper["effect_used"], paper["effect_basis"]) == (0.3, "paper")
    with pytest.raises(ValueError, match="smallest_effect_basis"):
        power.analyse_claim("c", a, b, paper_effect=None, paper_source="", measure="", smallest_effect=0.1)
    with pytest.raises(ValueError, match="spread"):
        power.analyse_claim("c", a, b, paper_effect=None, paper_source="", measure="", spread=-1.0, spread_basis="x")
