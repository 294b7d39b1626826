"""The graders of deqlab.lab.exercises: a correct implementation passes, a wrong one fails on the
check that names its mistake, and bad arguments raise errors that name them."""

import ast
import functools
import inspect
import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import deqlab
from deqlab import ensembles
from deqlab.lab import exercises
from deqlab.lab.exercises import _forbid, _key
from deqlab.lab.experiments import practice

# ------------------------------------------------------------------------------------------------
# Reports


def test_report_passes_only_when_every_check_does_and_raises_naming_the_failed_line():
    good = exercises.Check("small error", 1e-9, 1e-6)
    bad = exercises.Check("large error", 1.0, 1e-6, hint="look here")
    nan = exercises.Check("nan error", float("nan"), 1.0)
    assert exercises.Report("t", (good,)).passed
    report = exercises.Report("t", (good, bad, nan))
    assert not report.passed and report.failed == (bad, nan)
    text = str(report)
    assert "FAIL  large error" in text and "hint: look here" in text and "PASS  small error" in text
    assert "<table>" in report._repr_html_() and "large error" in report._repr_html_()
    with pytest.raises(exercises.ExerciseFailed, match="large error"):
        report.raise_if_failed()
    assert exercises.Report("t", (good,)).raise_if_failed().passed


@pytest.mark.parametrize("grader", [exercises.check_layer, exercises.check_weight_tied, exercises.check_residual,
                                    exercises.check_solver, exercises.check_implicit_gradient])
def test_non_callable_raises_type_error_naming_the_argument(grader):
    with pytest.raises(TypeError, match="must be a callable"):
        grader(42)


def test_check_solver_validates_tol_and_reference():
    with pytest.raises(ValueError, match="`tol` must be a number in"):
        exercises.check_solver(lambda *a, **k: None, tol=1e-9)
    with pytest.raises(ValueError, match="reference"):
        exercises.check_solver(lambda *a, **k: None, reference="newton")


def _loops_forever(*args, **kwargs):
    while True:  # a stopping test that is never met
        try:
            pass
        except Exception:  # noqa: BLE001 - even code that swallows every Exception is stopped
            pass


def _sleeps_forever(*args, **kwargs):
    import time

    time.sleep(3600)


@pytest.mark.parametrize("student", [_loops_forever, _sleeps_forever])
def test_grader_of_code_that_never_returns_times_out_naming_the_grader_and_the_limit(student):
    import threading
    import time

    began = time.perf_counter()
    with pytest.raises(exercises.GraderTimeout, match=r"exercises.check_residual did not finish within its time "
                                                       r"limit of 0.5 s"):
        exercises.check_residual(student, time_limit=0.5)
    assert time.perf_counter() - began < 5
    if student is _loops_forever:  # a Python loop is interrupted: its thread ends
        time.sleep(0.2)
        assert not any(t.name == "exercises.check_residual" for t in threading.enumerate())


def test_grader_time_limit_is_configurable_and_checked(monkeypatch):
    residual = _key.my_residual  # deqlab.solvers.relative_residual itself is blocked while check_residual runs
    assert exercises.check_residual(residual, time_limit=float("inf")).passed
    assert exercises.check_residual(residual, time_limit=30).passed
    for bad in (0, -1.0, float("nan"), "10"):
        with pytest.raises(ValueError, match=r"exercises.check_residual: `time_limit` must be a finite real number > 0"):
            exercises.check_residual(residual, time_limit=bad)
    monkeypatch.setenv("DEQLAB_GRADER_TIME_LIMIT", "0.3")
    with pytest.raises(exercises.GraderTimeout, match=r"time limit of 0.3 s"):
        exercises.check_layer(_loops_forever)
    monkeypatch.setenv("DEQLAB_GRADER_TIME_LIMIT", "soon")
    with pytest.raises(ValueError, match=r"`DEQLAB_GRADER_TIME_LIMIT` must be a number of seconds"):
        exercises.check_layer(_loops_forever)


# ------------------------------------------------------------------------------------------------
# Page 1


@pytest.mark.float64
def test_check_layer():
    assert exercises.check_layer(lambda z, W, U, b, x: jnp.tanh(z @ W.T + x @ U.T + b)).passed
    wrong = exercises.check_layer(lambda z, W, U, b, x: jnp.tanh(z @ W + x @ U.T + b))
    assert not wrong.passed and "you used W, not W.T" in str(wrong)
    no_bias = exercises.check_layer(lambda z, W, U, b, x: jnp.tanh(z @ W.T + x @ U.T))
    assert [c.name for c in no_bias.failed] == ["layer, float64, saturated, non-zero z and b: max |yours - deqlab's|"]
    crash = exercises.check_layer(lambda z, W, U, b: z)
    assert not crash.passed and "TypeError" in str(crash)


def test_check_weight_tied_and_residual():
    def weight_tied(f, z0, args, depth):
        states = [z0]
        for _ in range(depth):
            states.append(f(states[-1], *args))
        return jnp.stack(states)

    assert exercises.check_weight_tied(weight_tied).passed
    missing_first = exercises.check_weight_tied(lambda f, z0, args, depth: weight_tied(f, z0, args, depth)[1:])
    assert not missing_first.passed and "expected" in str(missing_first)

    def residual(fz, z):
        eps = jnp.finfo(z.dtype).eps
        return jnp.linalg.norm(fz - z, axis=-1) / (jnp.linalg.norm(fz, axis=-1) + eps * np.sqrt(z.shape[-1]))

    assert exercises.check_residual(residual).passed
    no_eps = exercises.check_residual(lambda fz, z: jnp.linalg.norm(fz - z, axis=-1) / jnp.linalg.norm(fz, axis=-1))
    assert not no_eps.passed and "non-finite" in str(no_eps)
    absolute = exercises.check_residual(lambda fz, z: jnp.linalg.norm(fz - z, axis=-1))
    assert not absolute.passed


# ------------------------------------------------------------------------------------------------
# Forward solvers (pages 1 and 2)


def picard(f, z0, args, tol=1e-5, max_steps=500, stop_at=None):
    z = z0
    for step in range(max_steps):
        fz = f(z, *args)
        if bool(jnp.all(deqlab.solvers.relative_residual(fz, z) <= (stop_at or tol))):
            return fz, step
        z = fz
    raise RuntimeError("no convergence")


def test_check_solver_picard_passes_and_an_early_stop_fails():
    assert exercises.check_solver(picard, "picard").passed
    early = exercises.check_solver(functools.partial(picard, stop_at=1e-2), "picard")
    assert not early.passed
    assert any("worst relative residual" in c.name for c in early.failed), str(early)


def test_check_solver_silent_failure_fails():
    def silent(f, z0, args, tol=1e-5, max_steps=500):
        z = z0
        for step in range(max_steps):
            fz = f(z, *args)
            if bool(jnp.all(deqlab.solvers.relative_residual(fz, z) <= tol)):
                break
            z = fz
        return fz, step  # the last iterate, converged or not

    report = exercises.check_solver(silent, "picard")
    assert [c.name for c in report.failed] == ["expanding (scale 1.5, max_steps=30): raises or converges"], str(report)


def test_check_solver_anderson_passes_and_picard_posing_as_anderson_fails():
    assert _key.ANSWERS["ch0 p2 Anderson"].grade().passed  # the instructor's key
    slow = exercises.check_solver(picard, "anderson")
    assert len(slow.failed) == 1, str(slow)
    assert slow.failed[0].name.startswith("hard (non-normal Gaussian W, scale 0.95): your steps vs deqlab anderson's")


def test_check_solver_garbage_fails():
    report = exercises.check_solver(lambda f, z0, args, tol, max_steps: (f(z0, *args), 1), "picard")
    assert any("relative distance to the fixed point" in c.name for c in report.failed), str(report)


# ------------------------------------------------------------------------------------------------
# Page 3: implicit gradient (float64: marked, the grader compares against finite differences)


def _without_adjoint():
    """The key's forward solve (``_key.my_fixed_point``) with a backward pass that skips the adjoint
    system (u = g instead of u = g + J^T u): the mistake the grader must catch."""

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def fp(f, params, x):
        return _key.my_fixed_point(f, params, x)

    def fwd(f, params, x):
        z = fp(f, params, x)
        return z, (z, params, x)

    def bwd(f, saved, g):
        z, params, x = saved
        return jax.vjp(lambda p, x: f(z, *p, x), params, x)[1](g)

    fp.defvjp(fwd, bwd)
    return fp


@pytest.mark.float64
@pytest.mark.slow  # compiles deqlab's and the graded implicit solves: ~10 s on 2 cores
def test_check_implicit_gradient():
    assert _key.ANSWERS["ch0 p3 implicit gradient"].grade().passed  # the instructor's key
    no_adjoint = exercises.check_implicit_gradient(_without_adjoint())
    names = [c.name for c in no_adjoint.failed]
    assert "orthogonal W, scale 0.5: gradient (W, U, b, x) vs deqlab.fixed_point" in names
    assert "Gaussian W, scale 0.9: directional derivative vs central finite differences" in names
    assert not any("z* vs" in n for n in names), names


# ------------------------------------------------------------------------------------------------
# Page 5: model and training step


class _Cell(nnx.Module):
    def __init__(self, width, *, rngs):
        self.recurrent = nnx.Linear(width, width, use_bias=False, rngs=rngs,
                                    kernel_init=ensembles.initializer("orthogonal", 0.5))
        self.inject = nnx.Linear(64, width, rngs=rngs)

    def __call__(self, z, x):
        return jnp.tanh(self.recurrent(z) + self.inject(x))


class _Classifier(nnx.Module):
    def __init__(self, width, *, stop_gradient=False, rngs):
        self.cell = _Cell(width, rngs=rngs)
        self.readout = nnx.Linear(width, 10, rngs=rngs)
        self.stop_gradient = stop_gradient

    def __call__(self, x):
        graphdef, params = nnx.split(self.cell)
        z0 = jnp.zeros((x.shape[0], self.cell.recurrent.in_features), x.dtype)
        z = deqlab.fixed_point(lambda z, p, x: nnx.merge(graphdef, p)(z, x), z0, params, x, solver=deqlab.Anderson(tol=1e-3, max_steps=40), batch_axis=0).value
        return self.readout(jax.lax.stop_gradient(z) if self.stop_gradient else z)


@pytest.mark.slow  # compiles deqlab's and the graded implicit solves: ~10 s on 2 cores
def test_check_classifier():
    assert _key.ANSWERS["ch0 p5 classifier"].grade().passed  # the instructor's key
    frozen = exercises.check_classifier(_Classifier(16, stop_gradient=True, rngs=nnx.Rngs(0)))
    assert [c.name for c in frozen.failed] == ["gradient of the cross-entropy, worst parameter"], str(frozen)
    with pytest.raises(TypeError, match="`model` must be an nnx.Module"):
        exercises.check_classifier(lambda x: x)


@pytest.mark.slow  # compiles deqlab's and the graded implicit solves: ~10 s on 2 cores
def test_check_train_step():
    @nnx.jit
    def no_update(model, optimizer, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    model = practice.DigitsClassifier(width=16, scale=0.5, tol=1e-3, max_steps=40, rngs=nnx.Rngs(0))
    before = nnx.state(model, nnx.Param)
    assert exercises.check_train_step(_key.my_train_step, model).passed  # the instructor's key
    after = nnx.state(model, nnx.Param)
    assert all(bool(jnp.all(a == b)) for a, b in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after)))
    lazy = exercises.check_train_step(no_update, model)
    assert "parameter update of one step vs the reference step" in [c.name for c in lazy.failed], str(lazy)
    with pytest.raises(ValueError, match="`steps` must be an integer"):
        exercises.check_train_step(_key.my_train_step, model, steps=1)


# ------------------------------------------------------------------------------------------------
# Chapters 1-5: every grader passes a right answer, fails typical wrong ones with their hint, reports
# a crashing answer and a wrong signature as failed checks, and times out on an answer that hangs


def test_the_package_re_exports_every_grader_and_time_limit_applies_to_all(monkeypatch):
    from deqlab.lab.exercises import ch0, ch1, ch2, ch3, ch4, ch5

    for module in (ch0, ch1, ch2, ch3, ch4, ch5):
        for name in module.__all__:
            assert getattr(exercises, name) is getattr(module, name) and name in exercises.__all__
    monkeypatch.setattr(exercises, "TIME_LIMIT", 0.3)  # the package's TIME_LIMIT is the default of every grader
    with pytest.raises(exercises.GraderTimeout, match=r"check_length_trace did not finish within its time limit "
                                                       r"of 0.3 s"):
        exercises.check_length_trace(_loops_forever)


NEW_GRADERS = ["check_length_trace", "check_stieltjes", "check_mean_difference", "check_jacobian_penalty",
               "check_linear_deq", "check_copy_memory", "check_semi_orthogonal"]


@pytest.mark.parametrize("grader", NEW_GRADERS)
def test_new_graders_refuse_a_non_callable_and_time_out_on_a_hanging_answer(grader):
    with pytest.raises(TypeError, match="must be a callable"):
        getattr(exercises, grader)(42)
    with pytest.raises(exercises.GraderTimeout, match=rf"exercises.{grader} did not finish within its time limit"):
        # an interruptible hang (a Python loop), so the grader returns at its limit: that a sleep in C code
        # is left running in the background is test_grader_of_code_that_never_returns_...'s case
        getattr(exercises, grader)(_loops_forever, time_limit=0.2)


def _raises(*args):
    raise ZeroDivisionError("boom")


@pytest.mark.parametrize("grader", NEW_GRADERS)
def test_new_graders_report_a_crash_and_a_wrong_signature_as_failed_checks(grader):
    crash = getattr(exercises, grader)(_raises)
    assert not crash.passed and "ZeroDivisionError: boom" in str(crash)
    signature = getattr(exercises, grader)(lambda only_one: only_one)
    assert not signature.passed and "check the signature" in str(signature)


_length_trace = _key.my_length_trace  # the instructor's key (deqlab.lab.exercises._key)


def test_check_length_trace():
    assert exercises.check_length_trace(_length_trace).passed
    cases = {
        "the normalised trace": lambda w0, V: len(w0) * _length_trace(w0, V),
        "not V W0": lambda w0, V: _length_trace(w0, V**2),
        "that is tr[M^T M]": lambda w0, V: np.mean(np.linalg.svd(np.eye(len(w0)) - np.sqrt(V) * w0,
                                                                  compute_uv=False) ** -2.0),
    }
    for hint, wrong in cases.items():
        report = exercises.check_length_trace(wrong)
        assert not report.passed and hint in str(report), (hint, str(report))
    # the eigenvalue shortcut is right for a normal W0 and wrong for a Ginibre one
    shortcut = exercises.check_length_trace(
        lambda w0, V: np.mean(np.abs(1 - np.sqrt(V) * np.linalg.eigvals(w0)) ** -4.0))
    assert [c.name.split(":")[0] for c in shortcut.failed] == ["Ginibre (not normal), N = 48, V = 0.3"]
    assert "only for a normal W0" in str(shortcut)
    vector = exercises.check_length_trace(lambda w0, V: np.full(3, _length_trace(w0, V)))
    assert not vector.passed and "shape (3,), expected ()" in str(vector)


def test_check_stieltjes():
    right = _key.my_stieltjes
    assert exercises.check_stieltjes(right).passed
    sign = exercises.check_stieltjes(lambda lam, z: -right(lam, z))
    assert not sign.passed and "the sign" in str(sign)
    total = exercises.check_stieltjes(lambda lam, z: lam.size * right(lam, z))
    assert not total.passed and "off by the factor N" in str(total)
    real = exercises.check_stieltjes(lambda lam, z: right(lam, z).real)
    assert len(real.failed) == len(real.checks) and "keep the complex dtype" in str(real)
    # a loop over the points that flattens z fails the 2-D case only (a scalar may come back as one entry)
    flat = exercises.check_stieltjes(lambda lam, z: np.array([np.mean(1 / (p - lam)) for p in np.ravel(z)]))
    assert [c.name.split(":")[0] for c in flat.failed] == ["a 2-D grid of z"], str(flat)
    assert "shape (12,), expected (3, 4)" in str(flat)


_mean_difference = _key.my_mean_difference


def test_check_mean_difference():
    assert exercises.check_mean_difference(_mean_difference).passed
    cases = {
        "ddof=1": lambda a, b: (a.mean() - b.mean(), np.hypot(a.std() / np.sqrt(a.size), b.std() / np.sqrt(b.size))),
        "add in quadrature": lambda a, b: (a.mean() - b.mean(), a.std(ddof=1) / np.sqrt(a.size)
                                           + b.std(ddof=1) / np.sqrt(b.size)),
        "s / sqrt(n), not s": lambda a, b: (a.mean() - b.mean(), np.hypot(a.std(ddof=1), b.std(ddof=1))),
        "the sign": lambda a, b: (b.mean() - a.mean(), _mean_difference(a, b)[1]),
    }
    for hint, wrong in cases.items():
        report = exercises.check_mean_difference(wrong)
        assert not report.passed and hint in str(report), (hint, str(report))
    ddof0 = exercises.check_mean_difference(cases["ddof=1"])
    assert any(c.name.startswith("simulation") for c in ddof0.failed), str(ddof0)

    def zero_for_one_seed(a, b):
        d, se = _mean_difference(a, b)
        return d, 0.0 if not np.isfinite(se) else se

    one = exercises.check_mean_difference(zero_for_one_seed)
    assert [c.name for c in one.failed] == ["a group of one seed: raises, or returns a NaN standard error"]

    def raises_for_one_seed(a, b):
        if min(a.size, b.size) < 2:
            raise ValueError("each group needs two seeds")
        return _mean_difference(a, b)

    assert exercises.check_mean_difference(raises_for_one_seed).passed
    scalar = exercises.check_mean_difference(lambda a, b: a.mean() - b.mean())
    assert not scalar.passed and "expected (2,)" in str(scalar)


def _penalty(f, z, key, n_probes, *, probe=jax.random.rademacher):
    eps = probe(key, (n_probes,) + z.shape, dtype=z.dtype)
    products = jax.vmap(lambda e: jax.jvp(f, (z,), (e,))[1])(eps)
    return jnp.mean(jnp.sum(products**2, axis=-1))


@pytest.mark.slow  # about 200 eager Jacobian-vector products per grading: ~10 s per report on 2 cores
def test_check_jacobian_penalty():
    assert exercises.check_jacobian_penalty(_key.my_jacobian_penalty).passed
    gaussian = exercises.check_jacobian_penalty(functools.partial(_penalty, probe=jax.random.normal), repetitions=50)
    assert not gaussian.passed and "Rademacher probes make" not in str(gaussian)
    assert "draw Rademacher probes" in str(gaussian) and gaussian.failed[0].name.startswith("diagonal")
    per_n = exercises.check_jacobian_penalty(lambda f, z, key, n: _penalty(f, z, key, n) / z.shape[0], repetitions=50)
    assert not per_n.passed and "off by the factor N" in str(per_n)
    fixed_key = exercises.check_jacobian_penalty(lambda f, z, key, n: _penalty(f, z, jax.random.key(0), n),
                                                 repetitions=50)
    assert not fixed_key.passed and "draw the probes from `key`" in str(fixed_key)
    one_probe = exercises.check_jacobian_penalty(lambda f, z, key, n: _penalty(f, z, key, 1), repetitions=50)
    assert [c.name for c in one_probe.failed] == [
        "dense Jacobian (tanh(A z + c)), N = 12, n_probes = 8: |log(spread of the estimates / Rademacher formula)|"]
    assert "did not shrink by sqrt(n_probes)" in str(one_probe)
    with pytest.raises(ValueError, match=r"`repetitions` must be an integer in \[20, 1000\]"):
        exercises.check_jacobian_penalty(_penalty, repetitions=5)


_linear_deq = _key.my_linear_deq


def test_check_linear_deq():
    assert exercises.check_linear_deq(_linear_deq).passed
    def plus(K, Y, lam, depth):
        path = [np.zeros_like(Y)]
        for _ in range(depth):
            path.append(K @ (Y + path[-1]) / lam)
        return np.stack(path)

    report = exercises.check_linear_deq(plus)
    assert not report.passed and "the sign" in str(report)
    times = exercises.check_linear_deq(lambda K, Y, lam, depth: _linear_deq(K, Y, 1 / lam, depth))
    assert not times.passed and "divide by lam" in str(times)
    no_row_0 = exercises.check_linear_deq(lambda K, Y, lam, depth: _linear_deq(K, Y, lam, depth)[1:])
    assert not no_row_0.passed and "z_0 = 0 first" in str(no_row_0)
    # clipping the states is invisible on a contraction and wrong where the path grows
    clipped = exercises.check_linear_deq(lambda K, Y, lam, depth: np.clip(_linear_deq(K, Y, lam, depth), -5, 5))
    assert [c.name.split(":")[0] for c in clipped.failed] == ["C = 1.5 (not a contraction), depth 20"], str(clipped)


def test_check_copy_memory():
    from deqlab.lab import data

    right = _key.my_copy_memory
    assert exercises.check_copy_memory(right).passed
    # deqlab's own generator is blocked while the grader runs the reader's code
    library = exercises.check_copy_memory(lambda key, b, t, m, s: data.copy_memory(
        key, batch_size=b, delay=t, memory=m, symbols=s))
    assert not library.passed and "you were asked to write this yourself" in str(library)

    def numpy_stream(key, b, t, m, s):  # right, from another random stream (NumPy's, seeded by the key)
        seq = np.random.default_rng(int(jax.random.randint(key, (), 0, 2**30))).integers(1, s + 1, (b, m))
        x = np.concatenate([seq, np.zeros((b, t - 1), int), np.full((b, m + 1), 9)], axis=1)
        return x, np.concatenate([np.zeros((b, t + m), int), seq], axis=1)

    other = exercises.check_copy_memory(numpy_stream)
    assert other.passed, str(other)  # the task's properties, not one stream

    def from_zero(key, b, t, m, s):  # symbols 0..s-1: the blank is drawn as a symbol
        x, y = right(key, b, t, m, s)
        return x.at[:, :m].add(-1), y.at[:, t + m:].add(-1)

    report = exercises.check_copy_memory(from_zero)
    assert not report.passed and "must be symbols in 1..8: some are not (0 is the blank" in str(report)

    def one_marker_short(key, b, t, m, s):  # delay blanks and memory markers: the delimiter one step late
        x, y = right(key, b, t, m, s)
        return x.at[:, m + t - 1].set(0), y

    late = exercises.check_copy_memory(one_marker_short)
    assert [c.name.split(":")[1].strip() for c in late.failed] == ["layout, entries that break it"] * 3, str(late)

    def cycle(key, b, t, m, s):  # the right layout and counts, but a pattern, not random symbols
        seq = (jnp.arange(b * m).reshape(b, m) + int(jax.random.randint(key, (), 0, s))) % s + 1
        x = jnp.concatenate([seq, jnp.zeros((b, t - 1), seq.dtype), jnp.full((b, m + 1), 9, seq.dtype)], axis=1)
        return x, jnp.concatenate([jnp.zeros((b, t + m), seq.dtype), seq], axis=1)

    pattern = exercises.check_copy_memory(cycle)
    assert [c.name.split(":")[0] for c in pattern.failed] == ["3600 neighbouring pairs"], str(pattern)
    assert "independent draws, not a pattern" in str(pattern)

    fixed = exercises.check_copy_memory(lambda key, b, t, m, s: right(jax.random.key(0), b, t, m, s))
    assert [c.name for c in fixed.failed] == ["the key: another key gives another batch"], str(fixed)
    unseeded = exercises.check_copy_memory(lambda key, b, t, m, s: numpy_stream(
        jax.random.key(np.random.default_rng().integers(2**30)), b, t, m, s))
    assert [c.name.split("(")[0].strip() for c in unseeded.failed] == [
        "the key: the same key twice gives the same batch"], str(unseeded)
    long = exercises.check_copy_memory(lambda key, b, t, m, s: tuple(
        jnp.pad(a, ((0, 0), (0, 1))) for a in right(key, b, t, m, s)))
    assert not long.passed and "the length is delay + 2 * memory" in str(long)
    floats = exercises.check_copy_memory(lambda key, b, t, m, s: tuple(
        a.astype(jnp.float32) for a in right(key, b, t, m, s)))
    assert not floats.passed and "expected an integer dtype" in str(floats)


def test_check_semi_orthogonal_passes_both_branches_and_names_each_mistake():
    right = _key.my_semi_orthogonal
    assert exercises.check_semi_orthogonal(right).passed

    def other_stream(key, rows, cols, scale):  # right: rows or columns of a Haar orthogonal matrix
        big = max(rows, cols)
        o = np.asarray(jax.random.orthogonal(key, big))
        return scale * (o[:, :cols] if rows >= cols else o[:rows, :])

    assert exercises.check_semi_orthogonal(other_stream).passed
    library = exercises.check_semi_orthogonal(lambda key, rows, cols, scale: ensembles.initializer(
        "orthogonal", scale)(key, (rows, cols)))
    assert not library.passed and "you were asked to write this yourself" in str(library)

    def wide_only(key, rows, cols, scale):  # never transposes: a tall Q for a wide shape
        q, r = jnp.linalg.qr(jax.random.normal(key, (max(rows, cols), min(rows, cols))))
        return scale * q * jnp.where(jnp.diagonal(r) < 0, -1.0, 1.0)[None, :]

    shape = exercises.check_semi_orthogonal(wide_only)
    assert {c.name.split(" ")[0].rstrip(":,") for c in shape.failed} == {"wide"}, str(shape)
    assert "wrong shape" in str(shape)

    def tall_rows(key, rows, cols, scale):  # the wide construction everywhere: K K^T = I cannot hold when tall
        q, _ = jnp.linalg.qr(jax.random.normal(key, (max(rows, cols), max(rows, cols))))
        return scale * q[:rows, :cols] * jnp.sqrt(max(rows, cols) / min(rows, cols)) if rows > cols \
            else right(key, rows, cols, scale)

    tall = exercises.check_semi_orthogonal(tall_rows)
    assert "tall 12 x 5, scale 0.3: max |Gram / scale^2 - I|" in [c.name for c in tall.failed], str(tall)

    def plain_qr(key, rows, cols, scale):  # no sign correction: not Haar
        q, _ = jnp.linalg.qr(jax.random.normal(key, (max(rows, cols), min(rows, cols))))
        return scale * (q if rows >= cols else q.T)

    signs = exercises.check_semi_orthogonal(plain_qr)
    assert [c.name.split(",")[1].split(":")[0].strip() for c in signs.failed] == ["300 draws"] * 2, str(signs)
    assert "lean to one sign, so the draw is not Haar" in str(signs)

    def uniform(key, rows, cols, scale):  # orthonormal, but from uniform entries: the wrong law
        g = jax.random.uniform(key, (max(rows, cols), min(rows, cols)), minval=-1.0, maxval=1.0)
        q, r = jnp.linalg.qr(g)
        q = q * jnp.where(jnp.diagonal(r) < 0, -1.0, 1.0)[None, :]
        return scale * (q if rows >= cols else q.T)

    law = exercises.check_semi_orthogonal(uniform)
    assert [c.name.split(":")[0] for c in law.failed] == [
        "tall, 300 draws", "wide, 300 draws"] and "fourth moment" in str(law), str(law)
    squared = exercises.check_semi_orthogonal(lambda key, rows, cols, scale: right(key, rows, cols, scale**2))
    assert {c.name.split(":")[0] for c in squared.failed} == {
        "tall 12 x 5, scale 0.3", "wide 5 x 12, scale 0.7"}, str(squared)


def test_check_table1_leaves_out_non_finite_runs():
    import math

    right = _key.my_table1
    assert exercises.check_table1(right).passed

    def nan_for_empty(rows):  # a cell with no finite run as (nan, nan): also right
        table = right(rows)
        for r in rows:
            table.setdefault((r["ensemble"], r["sqrt_v"]), (math.nan, math.nan))
        return table

    assert exercises.check_table1(nan_for_empty).passed

    def unfiltered(rows):  # min and mean over every run, inf and nan included
        table = {}
        for r in rows:
            table.setdefault((r["ensemble"], r["sqrt_v"]), []).append(r["test_perplexity"])
        return {k: (min(v), sum(v) / len(v)) for k, v in table.items()}

    report = exercises.check_table1(unfiltered)
    assert [c.name.split(":")[0] for c in report.failed] == [
        "runs with inf and nan", "a cell where every run diverged"], str(report)
    assert "leave out the runs whose perplexity is not finite" in str(report)

    def inf_only(rows):  # filters inf but lets nan through
        table = {}
        for r in rows:
            if r["test_perplexity"] != math.inf:
                table.setdefault((r["ensemble"], r["sqrt_v"]), []).append(r["test_perplexity"])
        return {k: (min(v), sum(v) / len(v)) for k, v in table.items()}

    assert [c.name.split(":")[0] for c in exercises.check_table1(inf_only).failed] == ["runs with inf and nan"]

    def zero_for_empty(rows):  # a made-up value for a cell whose runs all diverged
        table = nan_for_empty(rows)
        return {k: (0.0, 0.0) if math.isnan(v[0]) else v for k, v in table.items()}

    made_up = exercises.check_table1(zero_for_empty)
    assert [c.name.split(":")[0] for c in made_up.failed] == ["a cell where every run diverged"], str(made_up)
    assert "whose runs all diverged" in str(made_up)
    by_seed = exercises.check_table1(lambda rows: {(r["ensemble"], r["seed"]): (1.0, 1.0) for r in rows})
    assert len(by_seed.failed) == 3 and "missing" in str(by_seed)
    listed = exercises.check_table1(lambda rows: rows)
    assert not listed.passed and "return a dict of (min, mean) pairs" in str(listed)
    crash = exercises.check_table1(_raises)
    assert not crash.passed and "ZeroDivisionError: boom" in str(crash)
    with pytest.raises(TypeError, match="must be a callable"):
        exercises.check_table1(42)
    with pytest.raises(exercises.GraderTimeout, match="exercises.check_table1 did not finish"):
        exercises.check_table1(_loops_forever, time_limit=0.2)



# ------------------------------------------------------------------------------------------------
# Answers kept from students (issue 41): a grader's docstring and messages say what is checked and what
# went wrong, never the answer


def _grader_texts(grader: str) -> list[str]:
    """Every string literal of ``grader``'s source, its docstring included: the hints, notes, usage lines and
    messages it can print (read with ``ast``: nothing is graded or compiled)."""
    function = inspect.unwrap(getattr(exercises, grader))
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]


# code that builds an exercise's answer: its random draws, linear algebra, stacking, optimizer step and
# matrix products (written into a hint or a docstring, it is a model answer to copy)
_ANSWER_CODE = (r"\bjax\.random\.\w+", r"\bn?p\.random\.\w+", r"\bj?np\.linalg\.\w+", r"\bj?np\.stack\b",
                r"\bnnx\.value_and_grad\b", r"\boptimizer\.update\(", r"\bmath\.isfinite\b", r"\w(\.T)?\s*@\s*\w")


@pytest.mark.parametrize("grader", [name for name in exercises.__all__ if name.startswith("check_")])
def test_grader_docstring_and_hints_call_no_library_reference_and_hold_no_answer_code(grader):
    """The grader's own record of what it blocks (``_forbid.FORBIDDEN``) names the library functions that
    compute its answer: none is called in its docstring or its messages (``data.copy_memory(...)``,
    ``freeprob.samples(e).stieltjes(z)``, ``deqlab.solve(...)``), and no message spells out the answer's
    code (``jax.random.randint(key, (batch_size, memory), 1, symbols + 1)``, ``z @ W.T``). Showing how the
    student's own function is called (``my_copy_memory(key, batch_size, ...)``) is allowed."""
    texts = _grader_texts(grader)
    doc = inspect.cleandoc(inspect.unwrap(getattr(exercises, grader)).__doc__)
    assert doc in [inspect.cleandoc(text) for text in texts]  # the docstring, as help() shows it, is read too
    patterns = list(_ANSWER_CODE)
    for target in _forbid.FORBIDDEN[grader]:
        *owners, name = target.partition(":")[2].split(".")
        name = owners[-1] if name == "__call__" else name  # calling a module: its class, DEQ(...)
        # a call by any path (deqlab.solve(, data.copy_memory(), not the student's my_solve( nor check_...(
        patterns.append(rf"(?<!\w){re.escape(name)}\(")
    for text in texts:
        for pattern in patterns:
            found = re.search(pattern, text)
            assert found is None, f"{grader} gives the answer away ({found.group(0)!r}) in: {text[:300]!r}"
