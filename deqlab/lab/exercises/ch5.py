"""Graders of chapter 5 (DEQ transformers).

- page 2: :func:`check_copy_memory` (``my_copy_memory(key, batch_size, delay, memory, symbols)``),
  the copy-memory task of 003 §5.1 / Table 1.
- page 5: :func:`check_semi_orthogonal` (``my_semi_orthogonal(key, rows, cols, scale)``), a Haar
  semi-orthogonal kernel, tall or wide (001 App. D's rectangular feed-forward).
- page 6: :func:`check_table1` (``my_table1(rows)``), 001 Table 1's minimum and mean test perplexity
  per (ensemble, sqrt(V)) over the runs whose value is finite.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import numpy as np

from deqlab.lab.exercises._core import Check, Report, _array, _call, _require_callable, _time_limited

__all__ = ["check_copy_memory", "check_semi_orthogonal", "check_table1"]


@_time_limited
def check_copy_memory(my_copy_memory: Callable[..., Any]) -> Report:
    """Grade ``my_copy_memory(key, batch_size, delay, memory, symbols)``: a batch ``(x, y)`` of the
    copy-memory task (chapter 5, page 2; 003 §5.1): ``x`` is ``memory`` symbols uniform on
    ``1..symbols``, ``delay - 1`` blanks (0) and ``memory + 1`` markers (9); ``y`` is blank for
    ``delay + memory`` steps, then the symbols. Both are integer arrays (batch_size, delay + 2 memory).

    The task is checked by its defining properties, not against one random stream, so that any
    right generator passes, whatever random numbers it draws:

    - per configuration (T = 10, m = 10, s = 8, the page's; T = 1, no blanks; T = 6, m = 3, s = 4):
      the shapes and an integer dtype, and the layout: symbols in 1..s (the vocabulary: 0 is the
      blank, 9 the marker), ``delay - 1`` blanks, ``memory + 1`` markers, the target's
      ``delay + memory`` blanks and its copy of the input's symbols;
    - the key: the same key twice gives the same batch, two keys give different ones;
    - the law, on 4000 symbols from one call (T = 5, m = 10, s = 8): each symbol's count within 5
      binomial standard deviations of 500, and the 3600 pairs of neighbouring symbols spread over
      the 64 possible pairs as independent uniform draws would spread them (a chi-square statistic
      below its 1 - 1e-6 quantile). A right generator fails one of these with probability below
      1e-5.

    Args:
        my_copy_memory: your function, called as ``my_copy_memory(key, batch_size, delay, memory, symbols)``
            (positional) with a JAX PRNG key and ints; it must return ``(x, y)``.

    Returns:
        A :class:`Report` with one line per check.

    Raises:
        TypeError: ``my_copy_memory`` is not callable.

    Example:
        Grade your function; here one not written yet, as the student edition hands it out (every
        check fails, with the hint "not written yet"):

        >>> from deqlab.lab import exercises
        >>> def my_copy_memory(key, batch_size, delay, memory=10, symbols=8):
        ...     raise NotImplementedError("your code here")
        >>> report = exercises.check_copy_memory(my_copy_memory)
        >>> report.passed, len(report.failed) == len(report.checks)
        (False, True)
        >>> print(report.failed[0].hint)
        your code raised NotImplementedError: your code here. not written yet: ...
    """
    from scipy import stats  # imported here: every page imports the graders, few need scipy.stats (0.6 s)

    _require_callable(my_copy_memory, "my_copy_memory", "check_copy_memory")
    usage = ("my_copy_memory(key, batch_size, delay, memory, symbols) -> (x, y), integer arrays "
             "(batch_size, delay + 2 * memory)")
    checks = []

    def batch(key, b, t, m, s, name):
        value, failed = _call(my_copy_memory, (key, b, t, m, s), name, usage)
        if failed is None:
            try:
                x, y = value
            except (TypeError, ValueError):
                return None, Check(name, math.inf, 0.0, hint=f"return a pair (x, y): {usage}",
                                   note=f"got {type(value).__name__}")
            x, failed = _array(x, name, (b, t + 2 * m), "integer", usage)
            if failed is None:
                y, failed = _array(y, name, (b, t + 2 * m), "integer", usage)
        if failed is not None:
            if failed.note.startswith("shape"):
                failed = Check(failed.name, failed.error, failed.tolerance, note=failed.note,
                               hint=f"the length is delay + 2 * memory = {t} + {2 * m}: memory symbols, delay - 1 "
                                    "blanks, memory + 1 markers")
            return None, failed
        return (x, y), None

    for label, b, t, m, s, seed in (("T = 10, m = 10, s = 8", 4, 10, 10, 8, 7), ("T = 1 (no blanks)", 3, 1, 10, 8, 8),
                                    ("T = 6, m = 3, s = 4", 5, 6, 3, 4, 9)):
        name = f"{label}: layout, entries that break it"
        mine, failed = batch(jax.random.key(seed), b, t, m, s, name)
        if failed is not None:
            checks.append(failed)
            continue
        x, y = mine
        parts = {  # each part of the layout (docstring; page 2, "The task"): entries that break it, and why
            "symbols": (int(np.sum((x[:, :m] < 1) | (x[:, :m] > s))),
                        f"x's first memory = {m} entries must be symbols in 1..{s}: some are not (0 is the blank, "
                        "9 the marker; check both ends of the range you draw from)"),
            "blanks": (int(np.sum(x[:, m:m + t - 1] != 0)), f"x must have delay - 1 = {t - 1} blanks (0) after the "
                                                              "symbols"),
            "markers": (int(np.sum(x[:, m + t - 1:] != 9)), f"x must end with memory + 1 = {m + 1} markers (9), the "
                                                             "first one the cue"),
            "target blanks": (int(np.sum(y[:, :t + m] != 0)), f"y must be blank (0) for its first delay + memory = "
                                                              f"{t + m} steps"),
            "target copy": (int(np.sum(y[:, t + m:] != x[:, :m])), f"y's last memory = {m} steps must be x's "
                                                                   "symbols, in order"),
        }
        broken = [(part, count, why) for part, (count, why) in parts.items() if count]
        checks.append(Check(name, sum(count for _, count, _ in broken), 0,
                            note=", ".join(f"{part}: {count}" for part, count, _ in broken),
                            hint="; ".join(why for _, _, why in broken)))

    name = "the key: the same key twice gives the same batch (entries that differ)"
    first, failed = batch(jax.random.key(11), 4, 10, 10, 8, name)
    if failed is None:
        again, failed = batch(jax.random.key(11), 4, 10, 10, 8, name)
    if failed is not None:
        checks.append(failed)
    else:
        differ = int(np.sum(first[0] != again[0])) + int(np.sum(first[1] != again[1]))
        checks.append(Check(name, differ, 0, hint="draw every random number from the key you are given (no global "
                                                  "random state), so that a key reproduces its batch"))
        name = "the key: another key gives another batch"
        other, failed = batch(jax.random.key(12), 4, 10, 10, 8, name)
        if failed is not None:
            checks.append(failed)
        else:
            same = bool(np.array_equal(first[0], other[0]))
            checks.append(Check(name, 1.0 if same else 0.0, 0.0, note="identical batches" if same else "",
                                hint="the symbols must be random and drawn from the key: two keys give two batches"))

    name = "4000 symbols: the largest |count - 500| / binomial standard deviation over 1..8"
    mine, failed = batch(jax.random.key(3), 400, 5, 10, 8, name)
    if failed is not None:
        checks.append(failed)
    else:
        seq = mine[0][:, :10]
        symbols = seq.ravel()
        counts = np.array([np.sum(symbols == v) for v in range(1, 9)])
        outside = symbols.size - counts.sum()
        sd = math.sqrt(symbols.size * (1 / 8) * (7 / 8))
        worst = math.inf if outside else float(np.max(np.abs(counts - symbols.size / 8)) / sd)
        checks.append(Check(name, worst, 5.0, note=f"{outside} symbols outside 1..8" if outside else "",
                            hint="the symbols are not uniform on 1..symbols: some symbol's count is more than 5 "
                                 "binomial standard deviations from 500 (the worst is the error)"))
        # neighbours (j, j + 1) of a row: 3600 pairs; independent uniform symbols spread them evenly over the
        # 64 pairs. The chi-square statistic is then approximately chi2(63): its 1 - 1e-6 quantile is the bar.
        name = "3600 neighbouring pairs: chi-square statistic against independent uniform symbols"
        if outside:
            checks.append(Check(name, math.inf, 0.0, note=f"{outside} symbols outside 1..8"))
        else:
            pairs = ((seq[:, :-1] - 1) * 8 + (seq[:, 1:] - 1)).ravel()
            observed = np.bincount(pairs, minlength=64)
            expected = pairs.size / 64
            statistic = float(np.sum((observed - expected) ** 2 / expected))
            checks.append(Check(name, statistic, float(stats.chi2.isf(1e-6, 63)), hint=(
                "the symbols of a sequence must be independent draws, not a pattern (a cycle, a repeated block): "
                "neighbouring pairs are spread over the 64 possible pairs far less evenly than independent "
                "uniform symbols spread them")))
    return Report("check_copy_memory(my_copy_memory)", tuple(checks))


@_time_limited
def check_semi_orthogonal(my_semi_orthogonal: Callable[..., Any]) -> Report:
    """Grade ``my_semi_orthogonal(key, rows, cols, scale)``: ``scale`` times a Haar semi-orthogonal
    ``rows x cols`` matrix, with orthonormal columns when ``rows >= cols`` (tall) and orthonormal
    rows otherwise (wide): the kernels of a rectangular feed-forward (chapter 5, page 5; 001 App. D).

    The draw is checked by the properties that define it, not against one random stream, so that
    any right construction passes:

    - shapes tall (12 x 5, scale 0.3), wide (5 x 12, scale 0.7) and square (6 x 6, scale 1): the
      shape, a real dtype, and ``K^T K = scale^2 I`` (tall, square) or ``K K^T = scale^2 I`` (wide),
      to 1e-5 relative (float32 rounding passes);
    - two keys give two different matrices (tall and wide);
    - the Haar law, over 300 draws of each of the tall and the wide shape, each draw divided by its
      root mean square entry times sqrt(12) (that is ``scale`` for a right draw, so that a wrong
      scale fails the first check only): the diagonal entries are symmetric about 0 (their sum
      times sqrt(12) is a sum of 1500 terms of mean 0 and variance 1: within 5 standard
      deviations), and the fourth moment of the entries is that of the coordinates of a uniformly
      random unit vector, ``3 / (n (n + 2))`` for ``n = 12`` (within 5 standard errors, measured
      from the draws). A right draw fails one of these with probability below 1e-5.

    Args:
        my_semi_orthogonal: your function, called as ``my_semi_orthogonal(key, rows, cols, scale)``
            (positional) with a JAX PRNG key, two ints and a float; it must return the matrix.

    Returns:
        A :class:`Report` with one line per check.

    Raises:
        TypeError: ``my_semi_orthogonal`` is not callable.

    Example:
        Grade your function; here one not written yet, as the student edition hands it out (every
        check fails, with the hint "not written yet"):

        >>> from deqlab.lab import exercises
        >>> def my_semi_orthogonal(key, rows, cols, scale):
        ...     raise NotImplementedError("your code here")
        >>> report = exercises.check_semi_orthogonal(my_semi_orthogonal)
        >>> report.passed, len(report.failed) == len(report.checks)
        (False, True)
        >>> print(report.failed[0].hint)
        your code raised NotImplementedError: your code here. not written yet: ...
    """
    _require_callable(my_semi_orthogonal, "my_semi_orthogonal", "check_semi_orthogonal")
    usage = "my_semi_orthogonal(key, rows, cols, scale) -> array (rows, cols)"
    checks = []

    def draw(key, rows, cols, scale, name):
        value, failed = _call(my_semi_orthogonal, (key, rows, cols, scale), name, usage)
        if failed is not None:
            return None, failed
        matrix, failed = _array(value, name, (rows, cols), "real", usage)
        if failed is not None:
            return None, failed
        return matrix.astype(np.float64), None

    shapes = {"tall": (12, 5, 0.3), "wide": (5, 12, 0.7), "square": (6, 6, 1.0)}
    for label, (rows, cols, scale) in shapes.items():
        name = f"{label} {rows} x {cols}, scale {scale}: max |Gram / scale^2 - I|"
        k, failed = draw(jax.random.key(rows * 100 + cols), rows, cols, scale, name)
        if failed is not None:
            checks.append(failed)
            continue
        gram = k.T @ k if rows >= cols else k @ k.T
        error = float(np.max(np.abs(gram / scale**2 - np.eye(min(rows, cols)))))
        side = "K^T K (orthonormal columns)" if rows >= cols else "K K^T (orthonormal rows)"
        if scale != 1 and np.allclose(gram, scale**4 * np.eye(min(rows, cols)), rtol=1e-4, atol=1e-6):
            hint = f"{side} is scale^4 I, not scale^2 I: your matrix is multiplied by scale twice"
        elif scale != 1 and np.allclose(gram, np.eye(min(rows, cols)), rtol=1e-4, atol=1e-6):
            hint = f"{side} is I, not scale^2 I: your matrix is not multiplied by scale"
        else:
            hint = (f"for a {label} shape {side} must be scale^2 I (page 5; 001 App. D): yours is not, by the "
                    "error above")
        checks.append(Check(name, error, 1e-5, hint=hint))
        if label == "square":
            continue
        name = f"{label}: another key gives another matrix"
        other, failed = draw(jax.random.key(rows * 100 + cols + 1), rows, cols, scale, name)
        if failed is not None:
            checks.append(failed)
            continue
        same = bool(np.allclose(k, other))
        checks.append(Check(name, 1.0 if same else 0.0, 0.0, note="the same matrix" if same else "",
                            hint="two keys gave the same matrix: draw it from the key you are given"))

    draws, n = 300, 12
    for label in ("tall", "wide"):
        rows, cols, scale = shapes[label]
        name = f"{label}, {draws} draws: |sum of the diagonal entries| / its standard deviation under Haar"
        fourth = f"{label}, {draws} draws: |mean fourth moment of the entries / Haar's - 1| / standard error"
        samples = []
        for i, key in enumerate(jax.random.split(jax.random.key(2024 + rows), draws)):
            k, failed = draw(key, rows, cols, scale, name)
            if failed is not None:
                break
            rms = math.sqrt(float(np.mean(k**2)) * n)  # scale for a semi-orthogonal draw
            samples.append(k / rms if rms > 0 else k)
        if failed is not None:
            checks.extend([failed, Check(fourth, math.inf, 5.0, note="no draws")])
            continue
        k = np.stack(samples)  # (draws, rows, cols)
        small = min(rows, cols)
        diagonal = k[:, np.arange(small), np.arange(small)] * math.sqrt(n)  # mean 0, variance 1 each
        z = abs(float(diagonal.sum())) / math.sqrt(diagonal.size)
        checks.append(Check(name, z, 5.0, hint=(
            "the diagonal entries lean to one sign, so the draw is not Haar: a QR factor as LAPACK returns it is "
            "not uniformly distributed (see page 5 on the signs of R's diagonal)")))
        m4 = np.mean(k**4, axis=(1, 2)) * n * (n + 2) / 3  # per draw; mean 1 under Haar
        se = float(np.std(m4, ddof=1) / math.sqrt(draws))
        error = abs(float(m4.mean()) - 1.0) / se if se > 0 else (0.0 if m4.mean() == 1.0 else math.inf)
        checks.append(Check(fourth, error, 5.0, hint=(
            "the entries' fourth moment is not that of a uniformly random orthonormal frame, 3 / (n (n + 2)): "
            "the law of the matrix you orthonormalise is not rotation invariant (page 5)")))
    return Report("check_semi_orthogonal(my_semi_orthogonal)", tuple(checks))


def _table1_rows() -> dict[str, list[dict[str, Any]]]:
    """The graders' per-seed rows (the keys of ``ensemble_study.per_seed_rows`` that Table 1 reads),
    in interleaved order: the groups are not contiguous."""
    rng = np.random.default_rng(5)
    finite = []
    for seed in range(3):
        for ensemble in ("gaussian", "orthogonal", "goe"):
            for sqrt_v in (0.1, 1.0):
                ppl = float(rng.uniform(60.0, 90.0))
                finite.append({"ensemble": ensemble, "sqrt_v": sqrt_v, "seed": seed, "test_perplexity": ppl,
                               "diverged": False})
    diverged = [dict(r) for r in finite]
    # gaussian at 1.0: one run at inf, one at nan; orthogonal at 0.1: one at inf
    hits = {("gaussian", 1.0, 0): math.inf, ("gaussian", 1.0, 2): math.nan, ("orthogonal", 0.1, 1): math.inf}
    for r in diverged:
        value = hits.get((r["ensemble"], r["sqrt_v"], r["seed"]))
        if value is not None:
            r["test_perplexity"], r["diverged"] = value, True
    every = [dict(r) for r in finite]
    for r in every:  # every GOE run at 1.0 diverged: the cell has no finite value at all
        if (r["ensemble"], r["sqrt_v"]) == ("goe", 1.0):
            r["test_perplexity"], r["diverged"] = math.inf, True
    return {"all runs finite": finite, "runs with inf and nan": diverged, "a cell where every run diverged": every}


def _table1_reference(rows: list[dict[str, Any]]) -> dict[tuple, tuple[float, float]]:
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault((r["ensemble"], r["sqrt_v"]), [])
        if math.isfinite(r["test_perplexity"]):
            groups[(r["ensemble"], r["sqrt_v"])].append(r["test_perplexity"])
    return {k: (min(v), sum(v) / len(v)) if v else (math.nan, math.nan) for k, v in groups.items()}


@_time_limited
def check_table1(my_table1: Callable[..., Any]) -> Report:
    """Grade ``my_table1(rows)``: 001 Table 1 from the per-seed rows of the ensemble study (chapter 5,
    page 6): a dict ``{(ensemble, sqrt_v): (min, mean)}`` of the final test perplexity over the runs
    of each (ensemble, sqrt(V)) whose value is finite, as the page's Table 1 reports it.

    ``rows`` is a list of dicts with at least ``"ensemble"``, ``"sqrt_v"``, ``"seed"`` and
    ``"test_perplexity"`` (``float``; ``inf`` or ``nan`` for a run whose loss diverged), in no
    particular order. Three tables of 18 runs (three ensembles, sqrt(V) in {0.1, 1}, three seeds),
    rows interleaved: every run finite; a run at ``inf`` and one at ``nan`` in one cell and a run at
    ``inf`` in another (each cell's minimum and mean over its finite runs only); and a cell whose
    every run diverged (that cell has no value: leaving it out or giving ``(nan, nan)`` both pass).
    Each table: the keys (one per cell) and the values, to 1e-12 relative.

    Args:
        my_table1: your function, called as ``my_table1(rows)``; it must return the dict.

    Returns:
        A :class:`Report` with one line per check.

    Raises:
        TypeError: ``my_table1`` is not callable.

    Example:
        Grade your function; here one not written yet, as the student edition hands it out (every
        check fails, with the hint "not written yet"):

        >>> from deqlab.lab import exercises
        >>> def my_table1(rows):
        ...     raise NotImplementedError("your code here")
        >>> report = exercises.check_table1(my_table1)
        >>> report.passed, len(report.failed) == len(report.checks)
        (False, True)
        >>> print(report.failed[0].hint)
        your code raised NotImplementedError: your code here. not written yet: ...
    """
    _require_callable(my_table1, "my_table1", "check_table1")
    usage = "my_table1(rows) -> {(ensemble, sqrt_v): (min, mean)}"
    checks = []
    for label, rows in _table1_rows().items():
        name = f"{label}: largest relative error of (min, mean) over the cells"
        value, failed = _call(my_table1, ([dict(r) for r in rows],), name, usage)
        if failed is not None:
            checks.append(failed)
            continue
        reference = _table1_reference(rows)
        expected = {k for k, v in reference.items() if math.isfinite(v[0])}
        empty = set(reference) - expected
        try:
            mine = {tuple(k): tuple(float(x) for x in v) for k, v in dict(value).items()}
        except Exception as error:  # noqa: BLE001 - any value that is not a dict of number pairs fails the check
            checks.append(Check(name, math.inf, 0.0, note=f"{type(error).__name__}: {error}"[:200],
                                hint=f"return a dict of (min, mean) pairs: {usage}"))
            continue
        missing, extra = expected - set(mine), set(mine) - set(reference)
        bad_empty = [k for k in empty & set(mine) if not all(math.isnan(x) for x in mine[k])]
        if missing or extra or bad_empty or any(len(mine[k]) != 2 for k in expected):
            note = "; ".join(part for part in (
                f"missing {sorted(missing)}" if missing else "", f"unexpected {sorted(extra, key=repr)}" if extra else "",
                f"a value for {sorted(bad_empty)}, whose runs all diverged" if bad_empty else "") if part)
            checks.append(Check(name, math.inf, 0.0, note=note or "a value is not a (min, mean) pair", hint=(
                "one key (ensemble, sqrt_v) per cell, as the rows spell them; a cell whose every run diverged has "
                "no finite run: leave it out (or give (nan, nan))")))
            continue
        error = max(abs(mine[k][j] - reference[k][j]) / abs(reference[k][j]) if math.isfinite(mine[k][j])
                    else math.inf for k in expected for j in range(2))
        hint = "a cell's (min, mean) differ from those of its runs with a finite test perplexity"
        if label != "all runs finite":
            hint = ("leave out the runs whose perplexity is not finite before taking min and mean: a diverged run "
                    "has inf or nan, and min or mean over it gives inf or nan (and min over a nan depends on where "
                    "it stands)")
        checks.append(Check(name, error, 1e-12, hint=hint))
    return Report("check_table1(my_table1)", tuple(checks))
