"""Checkpointed unrolled backprop, ``Unrolled(checkpoint=...)``: the same iterations as plain
unrolling (value, per-sample results and step counts identical), the same gradient up to rounding,
under jit, vmap and nn.DEQ, with compiled memory O(sqrt(max_steps)) instead of O(max_steps)."""

import contextlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from deqlab import ensembles
from deqlab.backward import Implicit, Unrolled, fixed_point, get_backward
from deqlab.failures import Result
from deqlab.nn import DEQ, TanhCell
from deqlab.precision import PrecisionWarning
from deqlab.solvers import Anderson, Picard, solve
from deqlab.solvers.loop import checkpoint_block

WIDTH, BATCH = 16, 6
# Per-sample gains of the map: the first samples contract fast and stop early (SUCCESS well before
# max_steps), 0.98 is too slow to meet tol in MAX_STEPS, and 1.6 (tanh keeps it bounded) has
# non-zero fixed points the iteration need not reach: a batch that mixes every way a sample ends.
GAINS = (0.2, 0.5, 0.7, 0.9, 0.98, 1.6)
MAX_STEPS = 40
# Block sizes: sqrt (7 for 40 steps: 5 blocks and a tail of 5), 1 (every step its own block), a
# divisor of 40, a non-divisor, and one larger than max_steps (capped: a single block).
CHECKPOINTS = ("sqrt", 1, 8, 13, 1000)


def gain_map(z, w, gain, x):
    return jnp.tanh(gain[:, None] * (z @ w.T) + x)


def make_problem(dtype):
    key_w, key_x = jax.random.split(jax.random.PRNGKey(0))
    w = ensembles.sample("orthogonal", key_w, WIDTH, 1.0, dtype)
    x = 0.3 * jax.random.normal(key_x, (BATCH, WIDTH), dtype)
    return w, jnp.asarray(GAINS, dtype), x


def solution_and_gradient(backward, solver, args):
    """The forward Solution and the gradient of a weighted sum of z* w.r.t. (w, gain, x)."""
    w, gain, x = args
    weights = jnp.linspace(-1.0, 1.0, WIDTH, dtype=x.dtype)

    def loss(args):
        sol = fixed_point(gain_map, jnp.zeros_like(x), *args, solver=solver, batch_axis=0,
                          backward=backward, on_failure="ignore")
        return jnp.sum(jnp.sin(sol.value) * weights), sol

    (_, sol), grad = jax.value_and_grad(loss, has_aux=True)(args)
    return sol, grad


def assert_same_solve(sol, reference):
    # The same iterations in the same order: bitwise the same value and bookkeeping.
    np.testing.assert_array_equal(sol.value, reference.value)
    np.testing.assert_array_equal(sol.result, reference.result)
    np.testing.assert_array_equal(sol.stats.steps, reference.stats.steps)
    np.testing.assert_array_equal(sol.stats.nfe, reference.stats.nfe)
    np.testing.assert_array_equal(sol.stats.residual_trace, reference.stats.residual_trace)


def relative_errors(grad, reference):
    """Per leaf: max |grad - reference| over max |reference|."""
    errors = []
    for got, want in zip(jax.tree_util.tree_leaves(grad), jax.tree_util.tree_leaves(reference)):
        scale = float(jnp.max(jnp.abs(want)))
        assert scale > 0
        errors.append(float(jnp.max(jnp.abs(jnp.asarray(got, want.dtype) - want))) / scale)
    return np.array(errors)


def assert_close_gradients(grad, reference, rtol):
    errors = relative_errors(grad, reference)
    assert np.all(errors <= rtol), (errors, rtol)


@contextlib.contextmanager
def float64_on():
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


@pytest.fixture(scope="module")
def problem32():
    return make_problem(jnp.float32)


SOLVERS = {"picard": Picard(tol=1e-5, max_steps=MAX_STEPS), "anderson": Anderson(tol=1e-5, max_steps=MAX_STEPS)}


@pytest.fixture(scope="module")
def plain32(problem32):
    """Per solver: plain Unrolled's float32 Solution and gradient, and that gradient's own rounding
    error per leaf (against the same iterations in float64)."""
    out = {}
    for name, solver in SOLVERS.items():
        sol, grad = solution_and_gradient(Unrolled(), solver, problem32)
        with float64_on():
            problem64 = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), problem32)
            sol64, grad64 = solution_and_gradient(Unrolled(), solver, problem64)
            # the float64 run takes the same path (same samples stop at the same steps), so the
            # difference is float32's rounding alone
            np.testing.assert_array_equal(sol64.result, sol.result)
            rounding = relative_errors(grad, grad64)
        out[name] = sol, grad, rounding
    return out


@pytest.mark.parametrize("solver", list(SOLVERS))
@pytest.mark.parametrize("checkpoint", CHECKPOINTS)
def test_checkpointed_matches_plain_unrolled_float32(problem32, plain32, solver, checkpoint):
    reference, grad_reference, rounding = plain32[solver]
    solver = SOLVERS[solver]
    # The batch mixes samples that stopped early, samples that ran out of steps and (Picard) a
    # sample that ended otherwise: the masking of stopped samples is exercised.
    results = set(np.asarray(reference.result).tolist())
    assert Result.SUCCESS in results and len(results) >= 2
    assert int(jnp.min(reference.stats.steps)) < MAX_STEPS // 2
    sol, grad = solution_and_gradient(Unrolled(checkpoint=checkpoint), solver, problem32)
    assert_same_solve(sol, reference)
    # Recomputing a block repeats its float32 operations, but XLA may fuse the rematerialised
    # backward differently, so the two gradients differ by rounding. Each is a float32 gradient
    # of the same iterations, so each is off the float64 gradient by about plain unrolling's own
    # float32 error (~3e-7 for Picard, ~1e-5 to 1e-4 for Anderson, whose small least-squares solves
    # amplify rounding), and by the triangle inequality they differ by at most twice that, with a
    # floor of 10 eps = 1.2e-6 (jax 0.7's CPU kernels round Anderson's solves differently from
    # jax 0.10's: measured up to 1.3x the plain error there). A wrong chain rule across a block
    # boundary gives O(1) errors.
    assert_close_gradients(grad, grad_reference, rtol=2 * np.maximum(rounding, 10 * 2.0**-23))


@pytest.mark.float64
@pytest.mark.parametrize("checkpoint", ["sqrt", 13])
def test_checkpointed_matches_plain_unrolled_float64(checkpoint):
    problem = make_problem(jnp.float64)
    solver = Anderson(tol=1e-10, max_steps=MAX_STEPS)
    reference, grad_reference = solution_and_gradient(Unrolled(), solver, problem)
    assert reference.value.dtype == jnp.float64
    assert Result.SUCCESS in set(np.asarray(reference.result).tolist())
    sol, grad = solution_and_gradient(Unrolled(checkpoint=checkpoint), solver, problem)
    assert_same_solve(sol, reference)
    # float64 eps = 2.2e-16: a few thousand ulps is 1e-12.
    assert_close_gradients(grad, grad_reference, rtol=1e-12)


def test_checkpointed_gradient_under_jit_and_vmap(problem32):
    w, gain, x = problem32
    # Three independent copies of the input batch, vmapped over a leading axis.
    xs = jnp.stack([x, 0.5 * x, -x])
    solver = Picard(tol=1e-5, max_steps=MAX_STEPS)

    def grads(backward):
        def loss(w, x):
            z = fixed_point(gain_map, jnp.zeros_like(x), w, gain, x, solver=solver, batch_axis=0,
                            backward=backward, on_failure="ignore").value
            return jnp.sum(z**3)

        return jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(None, 0)))(w, xs)

    reference = grads(Unrolled())
    assert reference[0].shape == (3, WIDTH, WIDTH)
    assert_close_gradients(grads(Unrolled(checkpoint="sqrt")), reference, rtol=1e-5)
    assert_close_gradients(grads(Unrolled(checkpoint=4)), reference, rtol=1e-5)


def test_checkpointed_unrolled_in_nn_deq():
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 3))

    def gradient(backward):
        layer = DEQ(TanhCell(8, 3, rngs=nnx.Rngs(0)), solver="picard", max_steps=30, backward=backward,
                    on_failure="ignore")
        z, sol = layer(x, return_solution=True)
        grads = nnx.grad(lambda model: jnp.sum(model(x) ** 2))(layer)
        return z, sol, grads

    z_ref, sol_ref, grads_ref = gradient(Unrolled())
    z, sol, grads = gradient(Unrolled(checkpoint="sqrt"))
    assert isinstance(get_backward(Unrolled(checkpoint="sqrt")), Unrolled)
    np.testing.assert_array_equal(z, z_ref)
    np.testing.assert_array_equal(sol.result, sol_ref.result)
    leaves, leaves_ref = jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(grads_ref)
    assert len(leaves) == len(leaves_ref) >= 2
    assert_close_gradients(leaves, leaves_ref, rtol=1e-5)


def temp_bytes(backward, max_steps, width=64, batch=16):
    """Compiled temporary memory of the gradient of sum(z*^2) w.r.t. W, forward run exactly
    ``max_steps`` Picard steps (tol 1e-30 is never met)."""
    key_w, key_x = jax.random.split(jax.random.PRNGKey(0))
    w = ensembles.sample("orthogonal", key_w, width, 0.9, jnp.float32)
    x = jax.random.normal(key_x, (batch, width), jnp.float32)
    gain = jnp.ones((batch,), jnp.float32)

    def loss(w, x):
        z = fixed_point(gain_map, jnp.zeros_like(x), w, gain, x, solver=Picard(tol=1e-30, max_steps=max_steps),
                        batch_axis=0, backward=backward, on_failure="ignore").value
        return jnp.sum(z**2)

    with warnings.catch_warnings():  # the unreachable tolerance is the point
        warnings.simplefilter("ignore", PrecisionWarning)
        compiled = jax.jit(jax.grad(loss)).lower(w, x).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


def test_checkpointed_memory_is_sublinear_in_steps():
    # Plain unrolling stores every step's iterate(s): at least 100 (batch x width) arrays at 100
    # steps. Blocks of 10 store 10 block-boundary carries plus one block's 10 steps, about 20 of
    # the 100 per-step stores, so a ratio near 0.2 plus a fixed part (W, the iterate, its
    # cotangent); 0.35 leaves room for that part and for XLA's buffer layout, while anything
    # still linear in the steps would be near 1.
    plain, checkpointed = temp_bytes(Unrolled(), 100), temp_bytes(Unrolled(checkpoint="sqrt"), 100)
    assert plain >= 100 * 16 * 64 * 4
    assert checkpointed / plain < 0.35, (checkpointed, plain)
    # 16x the steps: sqrt scaling grows the per-step part 4x; linear growth would be 16x. The
    # implicit gradient does not grow at all: it stays below both.
    long = temp_bytes(Unrolled(checkpoint="sqrt"), 1600)
    assert long / checkpointed < 6, (long, checkpointed)
    assert temp_bytes(Implicit(), 100) < checkpointed


def test_checkpoint_block_sizes():
    assert [checkpoint_block("sqrt", n) for n in (1, 2, 4, 5, 99, 100, 101, 400)] == [1, 2, 2, 3, 10, 10, 11, 20]
    assert checkpoint_block(7, 100) == 7
    assert checkpoint_block(1000, 100) == 100
    assert checkpoint_block(None, 100) is None


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "log", "SQRT", [4]])
def test_bad_checkpoint_is_rejected_naming_the_argument(bad, compile_counter):
    z0 = np.ones(3, np.float32)
    with compile_counter() as counted:  # refused before anything is traced or compiled
        with pytest.raises(ValueError, match=r"backward\.Unrolled: `checkpoint` must be None.*'sqrt'.*integer >= 1"):
            Unrolled(checkpoint=bad)
        with pytest.raises(ValueError, match=r"solve: `checkpoint` must be None"):
            solve(lambda z: 0.5 * z, z0, unrolled=True, checkpoint=bad)
    assert counted.programs == 0


def test_checkpoint_needs_unrolled_and_normalises_integers():
    with pytest.raises(ValueError, match=r"solve: `checkpoint` must be None unless unrolled=True"):
        solve(lambda z: 0.5 * z, jnp.ones(3), checkpoint="sqrt")
    mode = Unrolled(checkpoint=np.int64(5))
    assert mode.checkpoint == 5 and type(mode.checkpoint) is int
    assert mode == Unrolled(checkpoint=5) and hash(mode) == hash(Unrolled(checkpoint=5))
    assert Unrolled() != Unrolled(checkpoint="sqrt")
