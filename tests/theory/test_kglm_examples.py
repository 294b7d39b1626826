"""004 Figure 2's six scalar layers (deqlab.theory.kglm.examples): fixed points, iteration, Prop. 2."""

import math

import numpy as np
import pytest

from deqlab.theory.kglm import examples as ex

# Theory checks: closed forms and limits to ~1e-10, float64 by convention (tests/conftest.py).
pytestmark = pytest.mark.float64

STARTS = np.linspace(-1.0, 1.0, 9)


def test_fixed_point_counts_match_figure2_caption():
    maps = ex.figure2_maps()
    for key, g in maps.items():
        found = ex.fixed_points(key)
        count = math.inf if found.intervals else len(found.points)
        assert count == g.fixed_point_count, key
        for z in found.points:  # each located root is a fixed point to round-off
            assert abs(float(g(z)) - z) < 1e-13, (key, z)
    a = ex.tanh_fixed_point(3.0)
    np.testing.assert_allclose(ex.fixed_points("d").points, [-a, 0.0, a], atol=1e-13)
    assert ex.fixed_points("f").intervals == [(0.0, 1.0)]
    # Fig. 2a: the fixed point of tanh(0.9 z + 2), found by bisection and by Newton
    np.testing.assert_allclose(ex.fixed_points("a").points, [ex.tanh_fixed_point(0.9, 2.0)], atol=1e-13)


def test_contraction_a_converges_within_banach_bound():
    z_star = ex.tanh_fixed_point(0.9, 2.0)
    q = 0.9  # 004 Fig. 2a: |g'| <= 0.9 on the whole line
    path = ex.iterate("a", STARTS, 40)
    err = np.abs(path - z_star)
    bound = q ** np.arange(41)[:, None] / (1 - q) * np.abs(path[1] - path[0])
    assert np.all(err <= bound + 1e-15)
    assert err[-1].max() < 1e-14


def test_tanh_is_not_a_prop2_contraction_on_0_1_and_converges_sublinearly():
    # Erratum to 004 Fig. 2b: sup of tanh' on (0, 1) is 1, not < 1.
    assert ex.derivative_bound("b", (0.0, 1.0)) > 1 - 1e-9
    z = np.array([1e-4, 1e-6])
    np.testing.assert_allclose(np.tanh(z) / z, 1.0, atol=1e-8)  # no q < 1 bounds |g(z) - g(0)| / |z|
    steps = 20000
    path = ex.iterate("b", [1.0, -0.5], steps)
    assert np.all(np.abs(path[-1]) < 0.01) and np.all(np.abs(path[-1]) > 0.005)
    # z_r^2 ~ 3 / (2 r) (1/z^2 grows by 2/3 per step); the log correction is below 1% at r = 2e4
    np.testing.assert_allclose(steps * path[-1] ** 2, 1.5, rtol=0.01)


def test_c_has_one_fixed_point_but_plain_iteration_cycles_and_damping_finds_it():
    a = ex.tanh_fixed_point(3.0)
    path = ex.iterate("c", [0.5, -0.1, 0.9], 200)
    np.testing.assert_allclose(np.abs(path[-1]), a, atol=1e-12)  # the 2-cycle +-a of tanh(3 z)
    np.testing.assert_allclose(path[-1], -path[-2], atol=1e-12)
    damped = ex.iterate("c", [0.5, -0.1, 0.9], 200, damping=0.2)  # damped slope 1 - 4 * 0.2 = 0.2
    assert np.abs(damped[-1]).max() < 1e-100


def test_d_e_f_iteration():
    a = ex.tanh_fixed_point(3.0)
    path = ex.iterate("d", STARTS, 60)
    np.testing.assert_allclose(path[-1], np.sign(STARTS) * a, atol=1e-12)  # 0 stays, others -> +-a
    path = ex.iterate("e", STARTS, 100)
    np.testing.assert_allclose(path[-1], np.maximum(STARTS + 0.2, 0) + 99 * 0.2, atol=1e-12)  # grows 0.2 a step
    path = ex.iterate("f", STARTS, 5)
    np.testing.assert_array_equal(path[1], np.maximum(STARTS, 0))
    np.testing.assert_array_equal(path[-1], path[1])  # stops after one step, at a start-dependent point


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="g"):
        ex.iterate("z", 0.0, 3)
    with pytest.raises(ValueError, match="steps"):
        ex.iterate("a", 0.0, 0)
    with pytest.raises(ValueError, match="damping"):
        ex.iterate("a", 0.0, 3, damping=1.5)
    with pytest.raises(ValueError, match="z0"):
        ex.iterate("a", [np.nan], 3)
    with pytest.raises(ValueError, match="interval"):
        ex.fixed_points("a", (1.0, -1.0))
    with pytest.raises(ValueError, match="interval"):
        ex.derivative_bound("a", (0.0, math.inf))
