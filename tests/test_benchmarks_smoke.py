"""Smoke test of the benchmark scripts at their tiny size: they run and their numbers are sane.

No timing is asserted (timings belong to the benchmarks' own output, not to tests)."""

import jax

from benchmarks import forward, memory


def test_memory_benchmark_tiny():
    out = memory.main(["--size", "tiny", "--no-peers"])
    assert out["saving_at_50"] > 0.5
    assert all(ratio <= 1.05 for ratio in out["flatness"].values())


def test_forward_benchmark_tiny_reaches_target_accuracy():
    x64 = jax.config.jax_enable_x64
    try:
        out = forward.main(["--size", "tiny", "--no-peers"])
    finally:
        jax.config.update("jax_enable_x64", x64)
    timed = [row for row in out["rows"] if "ms" in row]
    assert {row["problem"] for row in timed} == {"tanh orthogonal 0.9", "tanh orthogonal 0.99", "linear GOE 0.49"}
    assert all(row["max error"] <= forward.TARGET_ERROR for row in timed)
