"""Smoke test of the benchmark scripts at their tiny size: they run and their numbers are sane.

No timing is asserted (timings belong to the benchmarks' own output, not to tests). Running a
benchmark takes 10-40 s even at its tiny size: those tests are marked slow (`make unit` leaves them
out; `make test` and CI run them)."""

import jax
import numpy as np
import pytest

from benchmarks import (
    budget,
    common,
    default_solver,
    dropout,
    forward,
    gradient,
    memory,
    scaling,
    step_cost,
    stopping,
    unrolled_checkpoint,
    warm_start,
)
from benchmarks import compile as compile_bench


@pytest.mark.slow
def test_memory_benchmark_tiny():
    out = memory.main(["--size", "tiny", "--no-peers"])
    assert out["saving_at_50"] > 0.5
    assert all(ratio <= 1.05 for ratio in out["flatness"].values())
    # No backward path materialises a per-sample Jacobian (batch, N, N).
    assert set(out["largest"]) == {"picard", "anderson", "broyden", "gmres"}
    assert all(size < out["jacobian_size"] for size, _ in out["largest"].values())


@pytest.mark.slow
def test_unrolled_checkpoint_benchmark_tiny():
    out = unrolled_checkpoint.main(["--size", "tiny", "--repeats", "1"])
    at_100 = out["by_steps"][100]
    # Structural, not timing: blocks of 10 store ~20 of plain unrolling's 100 steps; the implicit
    # gradient stores none; the gradients agree to float32 rounding.
    assert at_100["ckpt/plain mem"] < 0.35 and at_100["implicit/plain mem"] < at_100["ckpt/plain mem"]
    assert all(row["grad rel diff"] < 1e-5 for row in out["rows"])


@pytest.mark.slow
def test_forward_benchmark_tiny_reaches_target_accuracy():
    x64 = jax.config.jax_enable_x64
    try:
        out = forward.main(["--size", "tiny", "--no-peers"])
    finally:
        jax.config.update("jax_enable_x64", x64)
    timed = [row for row in out["rows"] if "ms" in row]
    expected = {(problem, config) for problem, configs in forward.TINY_CONFIGS.items() for config in configs
                if config.startswith("deqlab")}
    assert {(row["problem"], row["config"]) for row in timed} == expected
    for row in timed:
        # The tuned tolerance reaches the target against the float64 reference, with a counted NFE.
        assert row["error"] <= forward.TARGET_ERROR
        assert row["NFE"] >= 1 and row["ms"] > 0


@pytest.mark.slow
def test_gradient_benchmark_tiny_matches_float64_gradient():
    x64 = jax.config.jax_enable_x64
    try:
        out = gradient.main(["--size", "tiny", "--no-peers"])
    finally:
        jax.config.update("jax_enable_x64", x64)
    timed = [row for row in out["rows"] if "ms" in row]
    expected = {(problem, f"{name} / bwd {backward}") for problem, pairs in gradient.TINY_PAIRS.items()
                for name, backward in pairs if name.startswith("deqlab")}
    assert {(row["problem"], row["config"]) for row in timed} == expected
    for row in timed:
        # Forward value and implicit gradients (W, U, b, x) agree with the float64 references; the
        # step evaluated f, and at least one vector-Jacobian product per adjoint iteration.
        assert row["error"] <= gradient.FORWARD_TARGET
        assert row["grad error"] <= gradient.GRADIENT_TARGET
        assert row["NFE"] > row["fwd reported"] >= 1 and row["ms"] > 0


@pytest.mark.slow
def test_scaling_benchmark_tiny():
    x64 = jax.config.jax_enable_x64
    try:
        out = scaling.main(["--size", "tiny"])
    finally:
        jax.config.update("jax_enable_x64", x64)
    sweeps = scaling.SWEEPS["tiny"]
    assert [row["N"] for row in out["rows"] if row["sweep"] == "width"] == sweeps["widths"]
    assert [row["batch"] for row in out["rows"] if row["sweep"] == "batch"] == sweeps["batches"]
    for row in out["rows"]:
        # Every size converges to within the forward benchmark's target of the float64 reference.
        assert row["converged"] and row["error"] <= 1e-5
        assert 1 <= row["NFE"] <= scaling.MAX_STEPS + 1 and row["ms"] > 0
    assert set(out["exponents"]) == {"time_N", "nfe_N", "time_B", "nfe_B"}


@pytest.mark.slow
def test_stopping_benchmark_tiny():
    out = stopping.main(["--size", "tiny", "--repeats", "1", "--no-peers"])
    rows = {row["config"]: row for row in out["rows"]}
    oracles = {f"deqlab {name}{label}" for name in stopping.ORACLE_SOLVERS
               for label in (stopping.ORACLE_EVERY, stopping.ORACLE_ONCE)}
    assert set(rows) == {stopping.LIMIT} | set(stopping.configs()) | oracles
    # An oracle row returns every sample within tol. Picard returns one step beyond its iterate, so
    # its oracle is one step before the limit's count (within one step: the programs are compiled
    # apart, and an iterate at the tolerance can round to either side of it).
    assert all(rows[label]["error"] <= stopping.TOL for label in oracles)
    assert abs(rows[f"deqlab picard{stopping.ORACLE_EVERY}"]["steps"] - (out["limit_steps"] - 1)) <= 1
    # The limit is the fewest plain steps within the target; every solver converges on this
    # contraction and reports finite errors and times (no timing is asserted).
    assert rows[stopping.LIMIT]["error"] <= stopping.TOL and rows[stopping.LIMIT]["steps"] == out["limit_steps"]
    assert all(row["converged"] == 1.0 and np.isfinite(row["error"]) and row["ms"] > 0
               for label, row in rows.items() if label not in oracles)


@pytest.mark.slow
def test_default_solver_benchmark_tiny():
    """The benchmark set's rows on its cheapest problem (the others differ only in the map): the
    default, an oracle row per solver (each within tol: the oracle's definition), optimistix absent
    (--no-peers); the default's steps and compile seconds are positive (no timing is asserted)."""
    out = default_solver.main(["--size", "tiny", "--repeats", "1", "--no-peers", "--problem", "linear GOE 0.48"])
    result = out["linear GOE 0.48"]
    rows = {row["config"]: row for row in result["rows"]}
    assert set(rows) == {"default"} | {f"{name} oracle" for name in default_solver.SOLVERS}
    assert all(rows[f"{name} oracle"]["error"] <= default_solver.TOL for name in default_solver.SOLVERS)
    assert rows["default"]["steps"] > 0 and np.isfinite(rows["default"]["error"])
    assert result["compile_solve_s"] > 0 and result["compile_grad_s"] > 0
    assert all(row["scaled_error"] <= row["error"] for row in rows.values())  # the scale is at least 1


def test_scaled_error_is_each_samples_error_over_its_own_scale_worst_sample():
    # the measure stop="error" bounds: sample 0's states reach 3 (3e-5 absolute is 1e-5 scaled),
    # sample 1's stay below 1 (scale 1: 2e-5 stays 2e-5), a NaN is infinitely wrong
    reference = np.array([[3.0, -1.0], [0.5, 0.2]])
    value = reference + np.array([[3e-5, 0.0], [0.0, -2e-5]])
    assert np.isclose(default_solver.scaled_error(value, reference), 2e-5, rtol=1e-9)
    assert np.isclose(default_solver.scaled_error(value[:1], reference[:1]), 1e-5, rtol=1e-9)
    assert default_solver.scaled_error(np.full_like(reference, np.nan), reference) == float("inf")


@pytest.mark.slow
def test_compile_benchmark_tiny():
    out = compile_bench.main(["--size", "tiny", "--no-peers", "--repeats", "1"])
    rows = out["rows"]
    assert set(rows) == {"deqlab Picard solve", "deqlab Anderson solve", "deqlab default solve",
                         "deqlab grad(fixed_point)", "deqlab grad, Anderson both ways", "deqlab grad, Picard both ways"}
    # the instruction counter reads real programs: a solve has a loop of several dozen instructions,
    # its gradient (forward and adjoint solves) more; times are positive (no timing is asserted)
    assert 30 < rows["deqlab Picard solve"][0] < rows["deqlab grad, Picard both ways"][0]
    assert rows["deqlab grad, Picard both ways"][0] < rows["deqlab grad(fixed_point)"][0]
    assert all(seconds > 0 for _, seconds in rows.values())
    assert set(out["calls"]) == {"default", "ignore", "callback"}


def test_hlo_instruction_counter_counts_each_instruction_once():
    text = """HloModule m

%body (p: f32[2]) -> f32[2] {
  %p = f32[2]{0} parameter(0)
  ROOT %t = f32[2]{0} tanh(f32[2]{0} %p)
}

ENTRY %main (a: f32[2]) -> f32[2] {
  %a = f32[2]{0} parameter(0), metadata={op_name="x = y"}
  ROOT %call = f32[2]{0} call(f32[2]{0} %a), to_apply=%body
}
"""

    class Compiled:
        def as_text(self):
            return text

    assert compile_bench.hlo_instructions(Compiled()) == 4


@pytest.mark.slow
def test_step_cost_benchmark_tiny():
    out = step_cost.main(["--size", "tiny", "--repeats", "1"])
    rows = {row["config"]: row for row in out["rows"]}
    assert set(rows) == {step_cost.PLAIN} | set(step_cost.configs(out["steps"]))
    # every configuration ran exactly the requested steps (the unreachable tolerance held them), and
    # the times are finite and positive (no timing is asserted)
    assert all(row["steps"] == out["steps"] for row in rows.values()), rows
    assert all(np.isfinite(row["x_plain"]) and row["ms_per_step"] > 0 for row in rows.values())


@pytest.mark.slow
def test_step_cost_benchmark_set_measures_the_three_solvers_on_the_three_problems():
    """--problem set: the measurement behind Adaptive's cost_ratio runs Picard, Anderson and
    Broyden for exactly the requested steps on each problem of default_solver, with each step
    also over Picard's (Picard's own ratio is 1 by construction)."""
    out = step_cost.main(["--size", "tiny", "--repeats", "1", "--steps", "5", "--problem", "set"])
    assert set(out["problems"]) == set(default_solver.cases(default_solver.SIZES["tiny"]))
    for rows in out["problems"].values():
        by_config = {row["config"]: row for row in rows}
        assert set(by_config) == {step_cost.PLAIN} | set(step_cost.set_configs(5))
        assert all(row["steps"] == 5 for row in rows), rows
        assert by_config["deqlab picard"]["x_picard"] == 1.0


@pytest.mark.slow
def test_dropout_benchmark_tiny():
    out = dropout.main(["--size", "tiny"])
    solves = {row["config"]: row for row in out["solves"]}
    # weight-tied and no dropout converge; ordinary (per-iteration) dropout does not
    assert solves["(a) weight-tied"]["converged"] == 1.0 and solves["(c) none"]["converged"] == 1.0
    assert solves["(b) per-iteration"]["converged"] < 0.5
    assert solves["(b) per-iteration"]["residual max"] > 10 * dropout.TOL
    iteration = {row["config"]: row for row in out["iteration"]}
    assert isinstance(iteration["(a) weight-tied"][f"steps to {dropout.TOL:g}"], int)
    assert str(iteration["(b) per-iteration"][f"steps to {dropout.TOL:g}"]).startswith(">")
    assert out["overhead"]["ratio"] > 0


def test_growth_exponent_recovers_a_power_law():
    sizes = [16, 64, 256]
    assert abs(scaling.growth_exponent(sizes, [3.0 * n**1.5 for n in sizes]) - 1.5) < 1e-12


def test_tolerance_search_finds_the_loosest_passing_tolerance():
    # A configuration that passes for tol <= 2.9e-5: the grid search stops at 1.78e-5 (the grid's
    # passing point), three refinements close in on the threshold to within 1.78 ** (1/8).
    from benchmarks import common

    threshold = 2.9e-5

    def attempt(tol):
        return dict(tol=tol, ok=tol <= threshold, error=tol)

    coarse = common.loosest_passing(forward.QUARTER_DECADES, attempt)
    assert coarse["tol"] == 1.78e-5
    refined = common.loosest_passing(forward.QUARTER_DECADES, attempt, refine=3)
    assert refined["tol"] <= threshold < refined["tol"] * 1.78 ** (1 / 8) * 1.0001
    assert refined["tried"] == coarse["tried"] + 3
    # Nothing passes: no tolerance, the smallest error seen.
    none = common.loosest_passing([1e-2, 1e-3], lambda tol: dict(tol=tol, ok=False, error=tol), refine=3)
    assert none["tol"] is None and none["error"] == 1e-3


def test_limit_steps_finds_the_fewest_plain_steps():
    """The limit row of `forward` (issue 17): the fewest plain steps that reach the target, and
    one step fewer does not."""
    case = common.linear_case("lin", width=16, batch=4, scale=0.3)
    steps, error = common.limit_steps(case, 200, 1e-5)
    assert error <= 1e-5 and steps >= 2
    z = common.limit_fn(case, steps - 1)(case.args)
    assert common.max_abs_error(z, case.reference) > 1e-5


@pytest.mark.slow
def test_warm_start_benchmark_tiny():
    out = warm_start.main(["--size", "tiny"])
    run = out["ch0"]["run"]
    # the first epoch has nothing cached: both copies solve the same problems from zeros
    assert run["train_steps"]["cold"][0] == run["train_steps"]["warm"][0]
    # a repeat with unchanged parameters starts at the equilibrium: no step
    assert out["ch0"]["inference"]["warm_steps"] == 0.0 and out["ch0"]["inference"]["warm_nfe"] == 1
    assert set(out["ch5"]) == {1e-2, 1e-3}


@pytest.mark.slow
def test_budget_benchmark_tiny():
    out = budget.main(["--size", "tiny"])
    for setting, values in (("max_steps", budget.STEPS["tiny"]), ("tol", budget.TOLS["tiny"])):
        assert out["ch0"][setting]["traced_compilations"] == 1
        assert out["ch0"][setting]["static_compilations"] == len(values)
    assert out["ch5"]["traced_compilations"] == 1
    assert out["ch5"]["static_compilations"] == len(budget.LM_STEPS["tiny"])
