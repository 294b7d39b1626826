"""Tests of deqlab.lab.experiments.practice: the experiments behind chapter 0."""

import math
import warnings

import numpy as np
import pytest

from deqlab.lab.experiments import practice


@pytest.mark.slow
def test_linear_baseline_learns_the_digits():
    history = practice.train_linear_digits(epochs=150)
    assert set(history) == {"loss", "train_accuracy", "test_accuracy"}
    assert all(len(v) == 150 for v in history.values())
    # convex problem, full-batch Adam at a modest rate: the loss falls and the model is good
    assert history["loss"][-1] < 0.5 * history["loss"][0]
    assert history["loss"][0] <= math.log(10) + 1e-6  # first step starts from zero weights
    assert history["test_accuracy"][-1] > 0.9
    assert history["train_accuracy"][-1] >= history["test_accuracy"][-1] - 0.02


def test_linear_baseline_is_deterministic():
    a = practice.train_linear_digits(epochs=20)
    b = practice.train_linear_digits(epochs=20)
    np.testing.assert_array_equal(a["loss"], b["loss"])


@pytest.mark.slow
def test_train_digits_history_counts_backward_warnings():
    _, history = practice.train_digits(epochs=1, width=16, max_steps=3, tol=1e-6, progress=False)
    assert set(history) == {"loss", "train_accuracy", "test_accuracy", "solver_steps", "converged",
                            "backward_warnings"}
    assert all(len(v) == 1 for v in history.values())
    # three steps never reach 1e-6: every training step reports its failed solves, and the
    # warnings are counted, not shown
    assert history["converged"][0] < 0.5
    assert history["backward_warnings"][0] >= 1
    assert history["solver_steps"][0] == pytest.approx(3.0)


@pytest.mark.slow
def test_train_digits_converged_run_has_no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing leaks out of a healthy run either
        _, history = practice.train_digits(epochs=1, width=16, scale=0.3, max_steps=100, tol=1e-4,
                                           progress=False)
    assert history["converged"][0] == 1.0
    assert history["backward_warnings"] == [0.0]
    assert 0.0 <= history["test_accuracy"][0] <= 1.0


def test_exact_fixed_point_is_newtons_float64_solution_and_names_bad_input():
    """The float64 reference of chapter 0's delivered-error measurements: a residual below 1e-13
    on a slowly contracting problem (scale 0.98, where float32 solvers stop near 1e-5), Newton's
    quadratic convergence in a handful of steps, and clear errors for bad input."""
    import jax

    problem = practice.tanh_problem(jax.random.PRNGKey(1), width=32, batch=4, scale=0.98, input_scale=0.1)
    z = practice.exact_fixed_point(problem)
    w, u, b, x = (np.asarray(a, np.float64) for a in problem.args)
    assert z.dtype == np.float64 and z.shape == (4, 32)
    assert np.max(np.abs(np.tanh(z @ w.T + x @ u.T + b) - z)) < 1e-13
    with pytest.raises(RuntimeError, match="did not converge in 2 steps"):
        practice.exact_fixed_point(problem, max_steps=2)
    with pytest.raises(ValueError, match="`max_steps` must be an integer >= 1"):
        practice.exact_fixed_point(problem, max_steps=0)
    with pytest.raises(ValueError, match="`problem` must be a practice.tanh_problem"):
        practice.exact_fixed_point(practice.Problem(lambda z: z, problem.z0, ()))


def test_error_over_tol_is_the_worst_samples_scaled_error_and_names_bad_input():
    """The measure stop="error" bounds: each sample's max-abs error over max(1, its max |z*|), the
    worst sample's, in units of tol (a sample of size 4 is allowed four times the absolute error)."""
    exact = np.array([[0.5, 0.2], [4.0, 1.0]])
    assert practice.error_over_tol(exact + np.array([[0.0, 3e-5], [4e-5, 0.0]]), exact, 1e-5) == pytest.approx(3.0)
    assert practice.error_over_tol(exact, exact, 1e-5) == 0.0
    with pytest.raises(ValueError, match="`tol` must be a number > 0"):
        practice.error_over_tol(exact, exact, 0.0)
    with pytest.raises(ValueError, match="shape"):
        practice.error_over_tol(exact[:1], exact, 1e-5)
