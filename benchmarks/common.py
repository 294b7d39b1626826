"""Shared pieces of the benchmarks: sizes, timing, compiled memory, tables, optional peers."""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from typing import Any, Callable, Sequence

import jax

SIZES = ("tiny", "quick", "full")


def parse_args(description: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``--size tiny|quick|full``: tiny is a seconds-long correctness run (CI smoke test), quick
    the default (minutes on 2 CPU cores), full the sizes named in issue 3."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--size", choices=SIZES, default="quick")
    parser.add_argument("--no-peers", action="store_true", help="run the deqlab rows only")
    args = parser.parse_args(argv)
    global _PEERS_DISABLED
    _PEERS_DISABLED = args.no_peers
    return args


_PEERS_DISABLED = False


def median_time(fn: Callable[[], Any], *, repeats: int = 5) -> float:
    """Median wall time in seconds of ``fn()`` (already compiled: one warm-up call first)."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def temp_bytes(fn: Callable[..., Any], *args: Any) -> int:
    """Temporary memory XLA allocates for ``jit(fn)(*args)``, from the compiled program."""
    return int(jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes)


def optional(module: str):
    """Import an optional peer library, or return None (and say so)."""
    if _PEERS_DISABLED:
        return None
    try:
        return importlib.import_module(module)
    except ImportError:
        print(f"note: {module} is not installed; its rows are skipped (pip install jaxopt optimistix lineax)")
        return None


def table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    """A plain-text table with one line per row."""
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "" if value is None else str(value)
