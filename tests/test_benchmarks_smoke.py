"""Smoke test of the benchmark scripts at their tiny size: they run and their numbers are sane.

No timing is asserted (timings belong to the benchmarks' own output, not to tests)."""

import jax

from benchmarks import forward, memory


def test_memory_benchmark_tiny():
    out = memory.main(["--size", "tiny", "--no-peers"])
    assert out["saving_at_50"] > 0.5
    assert all(ratio <= 1.05 for ratio in out["flatness"].values())
    # No backward path materialises a per-sample Jacobian (batch, N, N).
    assert set(out["largest"]) == {"picard", "anderson", "broyden", "gmres"}
    assert all(size < out["jacobian_size"] for size, _ in out["largest"].values())


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
