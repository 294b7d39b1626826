"""The graders of deqlab.lab.exercises: a correct implementation passes, a wrong one fails on the
check that names its mistake, and bad arguments raise errors that name them."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import deqlab
from deqlab import ensembles
from deqlab.lab import exercises
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
    residual = lambda fz, z: deqlab.solvers.relative_residual(fz, z)  # noqa: E731
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


def anderson(f, z0, args, m=5, ridge=1e-4, tol=1e-5, max_steps=500):
    z, fs, gs = z0, [], []
    for step in range(max_steps):
        fz = f(z, *args)
        if bool(jnp.all(deqlab.solvers.relative_residual(fz, z) <= tol)):
            return z, step
        fs, gs = (fs + [np.asarray(fz, np.float64)])[-m:], (gs + [np.asarray(fz - z, np.float64)])[-m:]
        G = np.stack(gs, axis=1)
        H = G @ G.transpose(0, 2, 1)
        s = 1 / np.sqrt(np.einsum("bii->bi", H))
        y = s * np.linalg.solve(H * s[:, :, None] * s[:, None, :] + ridge * np.eye(len(gs)), s[..., None])[..., 0]
        z = jnp.asarray(np.einsum("bk,bkd->bd", y / y.sum(axis=1, keepdims=True), np.stack(fs, axis=1)), z0.dtype)
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
    assert exercises.check_solver(anderson, "anderson").passed
    slow = exercises.check_solver(picard, "anderson")
    assert len(slow.failed) == 1, str(slow)
    assert slow.failed[0].name.startswith("hard (non-normal Gaussian W, scale 0.95): your steps vs deqlab anderson's")


def test_check_solver_garbage_fails():
    report = exercises.check_solver(lambda f, z0, args, tol, max_steps: (f(z0, *args), 1), "picard")
    assert any("relative distance to the fixed point" in c.name for c in report.failed), str(report)


# ------------------------------------------------------------------------------------------------
# Page 3: implicit gradient (float64: marked, the grader compares against finite differences)


def _iterate(step, x0, tol, max_steps):
    def cond(carry):
        x, fx, i = carry
        return (jnp.linalg.norm(fx - x) > tol * jnp.linalg.norm(fx)) & (i < max_steps)

    def body(carry):
        _, fx, i = carry
        return fx, step(fx), i + 1

    return jax.lax.while_loop(cond, body, (x0, step(x0), 0))[1]


def _make_fixed_point(adjoint: bool):
    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def fp(f, params, x):
        return _iterate(lambda z: f(z, *params, x), jnp.zeros((x.shape[0], params[0].shape[0]), x.dtype), 1e-13, 3000)

    def fwd(f, params, x):
        z = fp(f, params, x)
        return z, (z, params, x)

    def bwd(f, saved, g):
        z, params, x = saved
        _, vjp_z = jax.vjp(lambda z: f(z, *params, x), z)
        u = _iterate(lambda u: g + vjp_z(u)[0], g, 1e-13, 3000) if adjoint else g
        return jax.vjp(lambda p, x: f(z, *p, x), params, x)[1](u)

    fp.defvjp(fwd, bwd)
    return fp


@pytest.mark.float64
@pytest.mark.slow  # compiles deqlab's and the graded implicit solves: ~10 s on 2 cores
def test_check_implicit_gradient():
    assert exercises.check_implicit_gradient(_make_fixed_point(adjoint=True)).passed
    no_adjoint = exercises.check_implicit_gradient(_make_fixed_point(adjoint=False))
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
        z = deqlab.fixed_point(lambda z, p, x: nnx.merge(graphdef, p)(z, x), z0, params, x, tol=1e-3,
                               max_steps=40, batch_axis=0).value
        return self.readout(jax.lax.stop_gradient(z) if self.stop_gradient else z)


@pytest.mark.slow  # compiles deqlab's and the graded implicit solves: ~10 s on 2 cores
def test_check_classifier():
    assert exercises.check_classifier(_Classifier(16, rngs=nnx.Rngs(0))).passed
    frozen = exercises.check_classifier(_Classifier(16, stop_gradient=True, rngs=nnx.Rngs(0)))
    assert [c.name for c in frozen.failed] == ["gradient of the cross-entropy, worst parameter"], str(frozen)
    with pytest.raises(TypeError, match="`model` must be an nnx.Module"):
        exercises.check_classifier(lambda x: x)


@pytest.mark.slow  # compiles deqlab's and the graded implicit solves: ~10 s on 2 cores
def test_check_train_step():
    @nnx.jit
    def step(model, optimizer, x, y):
        def loss_fn(model):
            return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    @nnx.jit
    def no_update(model, optimizer, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    model = practice.DigitsClassifier(width=16, scale=0.5, tol=1e-3, max_steps=40, rngs=nnx.Rngs(0))
    before = nnx.state(model, nnx.Param)
    assert exercises.check_train_step(step, model).passed
    after = nnx.state(model, nnx.Param)
    assert all(bool(jnp.all(a == b)) for a, b in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after)))
    lazy = exercises.check_train_step(no_update, model)
    assert "parameter update of one step vs the reference step" in [c.name for c in lazy.failed], str(lazy)
    with pytest.raises(ValueError, match="`steps` must be an integer"):
        exercises.check_train_step(step, model, steps=1)
