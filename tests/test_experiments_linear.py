"""Tests for deqlab.experiments.linear helpers that the chapter 1 pages call."""

import numpy as np
import pytest

from deqlab.experiments import linear as ex


def test_quantile_interval_matches_the_order_statistics_and_covers():
    x = np.arange(1000.0)
    q, lo, hi = ex.quantile_interval(x, 0.95)
    assert q == np.quantile(x, 0.95)
    # S q = 950, z sqrt(S q (1 - q)) = 1.96 * 6.89 = 13.5: order statistics 936 and 964
    assert (lo, hi) == (936.0, 964.0)
    # coverage of the true 0.9 quantile of U(0, 1) over 400 samples of size 200
    rng = np.random.default_rng(5)
    hits = sum(lo <= 0.9 <= hi for _, lo, hi in (ex.quantile_interval(rng.random(200), 0.9) for _ in range(400)))
    assert abs(hits / 400 - 0.95) < 0.05


@pytest.mark.parametrize("args, pattern", [
    (([1.0], 0.5), "`values`"),
    (([1.0, np.nan], 0.5), "`values`"),
    (([1.0, 2.0], 1.0), "`q`"),
    (([1.0, 2.0], 0.5, 0.0), "`confidence`"),
])
def test_quantile_interval_bad_inputs_name_the_argument(args, pattern):
    with pytest.raises(ValueError, match=pattern):
        ex.quantile_interval(*args)
