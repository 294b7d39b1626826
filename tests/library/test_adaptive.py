"""The default solver, :class:`deqlab.solvers.Adaptive`: its written rule on maps of known rate,
the cost measure that sends expensive maps to Broyden, and the accuracy its stopping rule
promises. The linear problems share one compiled program (the map's matrix, the starting point
and ``cost_ratio`` are its arguments)."""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import deqlab
from deqlab import _eager, nn
from deqlab._eager import UncachedCallWarning
from deqlab.backward import adjoint_solve
from deqlab.solvers import Adaptive, AdaptiveState, BroydenState, chosen, map_work

N, BATCH, TOL = 16, 4, 1e-5


def _linear(z, w, x):
    return z @ w.T + x


@jax.jit
def _solve_linear(w, x, z0, cost_ratio):
    """The default solve of z = W z + x at tol 1e-5 (cost_ratio traced: one program for all)."""
    solver = Adaptive(tol=TOL, max_steps=600, cost_ratio=cost_ratio)
    sol = deqlab.solve(_linear, z0, w, x, solver=solver, batch_axis=0, on_failure="ignore")
    return sol.value, sol.result, sol.stats.steps, sol.state.history


def _rotation(rate, seed=0):
    """rate * Q with Q Haar orthogonal: every eigenvalue has modulus ``rate`` (the spectrum circles
    the origin), so plain iteration's residual falls by exactly ``rate`` per step and a Krylov-type
    method cannot do better."""
    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(N, N)))
    return jnp.asarray(rate * q * np.sign(np.diag(r)), jnp.float32)


def _real_spectrum(top=0.97):
    """A symmetric map with eigenvalues spread over [0, top] on the real axis: plain iteration
    converges at ``top`` per step, Anderson at about the Chebyshev rate (sqrt(k)-1)/(sqrt(k)+1),
    k = 1 / (1 - top), 0.70 for top = 0.97."""
    q, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(N, N)))
    return jnp.asarray(q @ np.diag(np.linspace(0.0, top, N)) @ q.T, jnp.float32)


def _inputs(seed=2):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(BATCH, N)), jnp.float32)


def _exact(w, x):
    w64, x64 = np.asarray(w, np.float64), np.asarray(x, np.float64)
    return np.linalg.solve(np.eye(N) - w64, x64.T).T


def _scaled_error(value, exact):
    """What stop="error" bounds by tol: each sample's max-abs error over max(1, its max |z*|)."""
    error = np.max(np.abs(np.asarray(value, np.float64) - exact), axis=1)
    return error / np.maximum(1.0, np.max(np.abs(exact), axis=1))


def test_the_rule_accelerates_a_real_spectrum_and_not_a_circle_and_delivers_tol():
    """Step 2-4 of the rule on two maps of known spectrum: a real spectrum up to 0.97 (Anderson's
    rate about 0.70 per step against plain iteration's 0.97) is accelerated; rate 0.8 times an
    orthogonal matrix (Anderson cannot beat 0.8 there) is not. Both deliver tol in the error of
    the returned value (stop="error"), measured against the exact solution."""
    x = _inputs()
    for w, verdict in ((_real_spectrum(), "anderson"), (_rotation(0.8), "plain")):
        value, result, steps, history = _solve_linear(w, x, jnp.zeros_like(x), 1.3)
        assert isinstance(history, AdaptiveState)
        assert chosen(history) == verdict, (verdict, float(history.plain_rate))
        assert bool(jnp.all(result == deqlab.Result.SUCCESS)), np.asarray(steps)
        assert np.all(_scaled_error(value, _exact(w, x)) <= TOL), _scaled_error(value, _exact(w, x))
    # the plain rate on the circle: plain iteration cannot do better than 0.8 per step, and Anderson
    # needs far fewer steps on the real spectrum than plain iteration's log(1e-5) / log(0.97) = 378
    assert int(steps.max()) >= math.log(TOL) / math.log(0.8)
    _, _, real_steps, _ = _solve_linear(_real_spectrum(), x, jnp.zeros_like(x), 1.3)
    assert int(real_steps.max()) < 100


def test_the_rates_are_those_of_the_batch_s_slowest_sample_not_of_samples_already_stopped():
    """One slow sample among fast ones: three inputs in the span of the real spectrum's fast modes
    (eigenvalues <= 0.25) converge within the warm-up, and the loop stops them; the fourth has
    every mode up to 0.97. The batch waits for that sample, so the rule must read its rates (the
    largest residual), not the stopped samples' proposals, and accelerate: the slow sample then
    needs far fewer steps than plain iteration's log(1e-5) / log(0.97) = 378."""
    q, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(N, N)))
    rates = np.linspace(0.0, 0.97, N)
    x = np.random.default_rng(2).normal(size=(BATCH, N))
    x[:3] = (x[:3] @ q[:, rates <= 0.25]) @ q[:, rates <= 0.25].T  # fast modes only
    w = jnp.asarray(q @ np.diag(rates) @ q.T, jnp.float32)
    x = jnp.asarray(x, jnp.float32)
    value, result, steps, history = _solve_linear(w, x, jnp.zeros_like(x), 1.3)
    assert int(steps[:3].max()) <= 10 < int(steps[3]), np.asarray(steps)
    assert chosen(history) == "anderson" and int(steps[3]) < 100, (chosen(history), np.asarray(steps))
    assert np.all(_scaled_error(value, _exact(w, x)) <= TOL)


def test_the_warm_up_measures_a_known_plain_rate_and_the_verdict_follows_cost_ratio():
    """Started near z* (so that ||f(z)|| is constant to 1e-4 and the relative residual falls as
    the absolute one), the warm-up's plain rate on rate * Q is log10(1 / rate) decades per step
    to within 1e-3; and the verdict compares the two rates through cost_ratio: a cost ratio no
    trial can beat keeps plain iteration on the real spectrum that 1.3 accelerates."""
    x = _inputs()
    for rate in (0.8, 0.95):
        w = _rotation(rate, seed=3)
        exact = jnp.asarray(_exact(w, x), jnp.float32)
        _, _, _, history = _solve_linear(w, x, exact + 1e-2, 1.3)
        assert abs(float(history.plain_rate) - math.log10(1.0 / rate)) < 1e-3, (rate, float(history.plain_rate))
    _, _, _, history = _solve_linear(_real_spectrum(), x, jnp.zeros_like(x), 1e6)
    assert chosen(history) == "plain"


class _SecantNorms(Adaptive):
    """Adaptive without Solver.plain_step: the loop measures every step's secant quotient with two
    more norms, as it did before the hook."""

    def plain_step(self, state):
        return None


class _AlwaysPlain(Adaptive):
    """A wrong hook (a Python bool): it also claims the Anderson steps are plain."""

    def plain_step(self, state):
        return True


class _PerSampleFlags(Adaptive):
    def plain_step(self, state):
        return jnp.zeros(BATCH, bool)


@jax.jit
def _solve_with(solver, w, x):
    sol = deqlab.solve(_linear, jnp.zeros_like(x), w, x, solver=solver, batch_axis=0, on_failure="ignore")
    return sol.value, sol.stats.steps, sol.stats.error_estimate, sol.state.history


def test_a_plain_step_takes_its_secant_quotient_from_the_residuals_the_loop_has():
    """Solver.plain_step: in Adaptive's plain phases stop="error" reads each step's secant quotient
    ||f(z') - f(z)|| / ||z' - z|| as the ratio of two residual norms the loop already has (z' = f(z)
    exactly), instead of computing two more. On the rotation (plain to the end) and the real
    spectrum (plain warm-up, then Anderson) the solve takes the same steps to the same values and
    error estimates as with the two norms (to float32 rounding: the norms are the same sums, maybe
    reduced in another order). The loop does consult the hook (a hook that also calls the Anderson
    steps plain changes the real spectrum's estimates), but only at steps judged right after the
    previous one (with check_every=2 that wrong hook changes nothing). A plain_step returning
    per-sample flags is named."""
    x = _inputs()
    hook, norms = Adaptive(tol=TOL, max_steps=600), _SecantNorms(tol=TOL, max_steps=600)
    for w, verdict in ((_rotation(0.8), "plain"), (_real_spectrum(), "anderson")):
        (value, steps, error, history), (value_n, steps_n, error_n, _) = _solve_with(hook, w, x), _solve_with(norms, w, x)
        assert chosen(history) == verdict
        np.testing.assert_array_equal(np.asarray(steps), np.asarray(steps_n))
        np.testing.assert_allclose(np.asarray(value), np.asarray(value_n), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(np.asarray(error), np.asarray(error_n), rtol=1e-5)
    w = _real_spectrum()
    _, _, error_wrong, _ = _solve_with(_AlwaysPlain(tol=TOL, max_steps=600), w, x)
    assert not np.allclose(np.asarray(error_wrong), np.asarray(error_n), rtol=1e-3)
    every_other = dict(tol=TOL, max_steps=600, check_every=2)
    _, steps_w, error_w, _ = _solve_with(_AlwaysPlain(**every_other), w, x)
    _, steps_2, error_2, _ = _solve_with(_SecantNorms(**every_other), w, x)
    np.testing.assert_array_equal(np.asarray(steps_w), np.asarray(steps_2))
    np.testing.assert_array_equal(np.asarray(error_w), np.asarray(error_2))
    with pytest.raises(TypeError, match=r"_PerSampleFlags.plain_step\(state\) must return None or one boolean scalar"):
        deqlab.solve(_linear, jnp.zeros_like(x), _rotation(0.8), x, solver=_PerSampleFlags(tol=TOL), batch_axis=0)


def test_map_work_counts_written_numbers_and_sends_expensive_maps_to_broyden():
    """Rule step 1: map_work counts the numbers a map's operations write per number of z
    (only operations that depend on z; reshapes and broadcasts left out, a scan body times its
    length, a cond's costliest branch);
    a tanh layer is far below broyden_above (32) and a transformer cell far above, so the first
    is solved by the plain/Anderson rule and the second by Broyden; broyden_above=inf turns the
    step off."""
    w, x = jnp.eye(4), jnp.ones((2, 4))
    z = jnp.zeros((2, 4))
    assert map_work(lambda z: jnp.tanh(z @ w + x), z) == 3.0
    # work that does not depend on z (an input injection) is computed once, outside the loop: not counted
    assert map_work(lambda z: jnp.tanh(z @ w + jnp.exp(x) @ w), z) == 3.0
    assert map_work(lambda z: jnp.reshape(z, (4, 2)).T.reshape(2, 4), z) == 0.0
    assert map_work(lambda z: jax.lax.scan(lambda c, _: (jnp.sin(c), None), z, None, length=5)[0], z) == 5.0
    # the costlier branch (2 numbers per number of z) and the predicate's one comparison (1 / 8)
    assert map_work(lambda z: jax.lax.cond(z[0, 0] > 0, jnp.sin, lambda v: jnp.cos(jnp.exp(v)), z), z) == 2.125

    cell = nn.TransformerCell(16, 16, heads=2, rngs=nnx.Rngs(0))
    zc, xc = jnp.zeros((2, 4, 16)), 0.1 * jnp.ones((2, 4, 16))
    work = map_work(lambda z: cell(z, xc), zc)
    assert work > 32.0, work
    tanh_cell = nn.TanhCell(16, 16, rngs=nnx.Rngs(0))
    assert map_work(lambda z: tanh_cell(z, jnp.ones((2, 16))), jnp.zeros((2, 16))) < 8.0
    sol = deqlab.solve(cell, zc, xc, batch_axis=0, on_failure="ignore")
    assert isinstance(sol.state.history, BroydenState) and chosen(sol.state) == "broyden"
    kept = deqlab.solve(cell, zc, xc, solver=Adaptive(broyden_above=math.inf, max_steps=5), batch_axis=0,
                        on_failure="ignore")
    assert isinstance(kept.state.history, AdaptiveState)


def test_a_named_solver_is_the_solver_that_runs():
    """The default chooses; a solver named by the user (by name or object, in solve and in
    nn.DEQ) is used as it is."""
    f = lambda z, x: 0.5 * jnp.tanh(z) + x  # noqa: E731
    z0, x = jnp.zeros((2, 3)), jnp.ones((2, 3))
    assert isinstance(deqlab.solve(f, z0, x, batch_axis=0).state.history, AdaptiveState)
    anderson = deqlab.solve(f, z0, x, solver="anderson", batch_axis=0).state.history
    assert not isinstance(anderson, AdaptiveState) and len(anderson) == 4  # Anderson's (fs, gs, gram, count)
    assert deqlab.solve(f, z0, x, solver=deqlab.Picard(), batch_axis=0).state.history == ()
    layer = nn.DEQ(nn.TanhCell(3, 3, rngs=nnx.Rngs(0)), solver="picard")
    assert isinstance(layer.solver, deqlab.Picard)
    assert isinstance(nn.DEQ(nn.TanhCell(3, 3, rngs=nnx.Rngs(0))).solver, Adaptive)


def test_the_backward_pass_solves_its_linear_fixed_point_with_anderson_or_broyden_without_a_trial(monkeypatch):
    """The linear fixed points of the default's backward pass (for_linear_map) are solved by
    Anderson from the first step with the default's settings, or by Broyden where the map is
    expensive: the adjoint solve (reverse mode) and the tangent solve (forward mode, jax.jvp)
    run it, and deliver u = g + J^T u and dz*/dx against the closed form. Called eagerly,
    adjoint_solve runs under the eager cache (no UncachedCallWarning: its inner solve's map
    closes over a VJP)."""
    settings = dict(tol=1e-6, max_steps=77, divergence_factor=50.0, safety=2.0, check_every=3)
    resolved = Adaptive(m=4, ridge=1e-3, **settings).for_linear_map(lambda u: u @ (0.4 * jnp.eye(3)) + 1.0,
                                                                     jnp.zeros((2, 3)))
    assert resolved == deqlab.Anderson(m=4, ridge=1e-3, stop="error", **settings)
    cell = nn.TransformerCell(16, 16, heads=2, rngs=nnx.Rngs(0))
    cell_map, zc = (lambda z: cell(z, jnp.zeros((2, 4, 16)))), jnp.zeros((2, 4, 16))
    # Broyden with the stopping settings, judged where the slowest sample is predicted to stop
    # (broyden_check_every, "auto" by default) rather than at check_every
    assert Adaptive(**settings).for_linear_map(cell_map, zc) == deqlab.Broyden(
        stop="error", **dict(settings, check_every="auto"))
    assert Adaptive(broyden_check_every=2, **settings).for_map(cell_map, zc) == deqlab.Broyden(
        stop="error", **dict(settings, check_every=2))

    f = lambda z, x: 0.5 * jnp.tanh(z) + x  # noqa: E731
    x = jnp.asarray([[0.3, -0.2, 0.1], [1.0, 0.5, -0.4]])
    z_star = deqlab.solve(f, jnp.zeros((2, 3)), x, batch_axis=0).value
    # J = diag(0.5 (1 - tanh(z*)^2)): u = g / (1 - J) for g = 1, and dz*/dx along ones is the same
    exact = 1.0 / (1.0 - 0.5 * (1.0 - jnp.tanh(z_star) ** 2))
    monkeypatch.setattr(_eager, "_warned", set())  # the warning is issued once per place: a fresh record
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncachedCallWarning)
        sol = adjoint_solve(f, z_star, (x,), jnp.ones((2, 3)), batch_axis=0)
    assert not isinstance(sol.state.history, AdaptiveState) and len(sol.state.history) == 4  # Anderson's state
    assert bool(sol.converged.all()) and float(jnp.max(jnp.abs(sol.value - exact))) < 1e-4
    tangent = jax.jvp(lambda x: deqlab.fixed_point(f, jnp.zeros((2, 3)), x, batch_axis=0).value, (x,),
                      (jnp.ones((2, 3)),))[1]
    assert float(jnp.max(jnp.abs(tangent - exact))) < 1e-4


@pytest.mark.parametrize("setting, value, valid", [
    ("warm_up", 1, ">= 2"), ("trial", 0, ">= 2"), ("cost_ratio", 0.5, ">= 1"), ("broyden_above", 0.0, "> 0"),
    ("m", 0, ">= 1"), ("broyden_check_every", 0, ">= 1"), ("broyden_check_every", "often", "'auto' or an integer"),
])
def test_bad_settings_name_the_setting_and_its_range(setting, value, valid):
    """Each setting out of range raises at construction, naming it and the valid range."""
    with pytest.raises(ValueError, match=setting) as err:
        Adaptive(**{setting: value})
    assert valid.replace(" ", "") in str(err.value).replace(" ", ""), str(err.value)


def test_chosen_names_what_it_cannot_read():
    """chosen() on another solver's state raises, naming the type it got."""
    with pytest.raises(ValueError, match="tuple"):
        chosen(())
