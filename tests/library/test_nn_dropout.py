"""Weight-tied (variational) dropout for the DEQ cells (issue 27, item 4; deqlab.nn.dropout).

The claims checked: a fixed mask gives a fixed map, which has a fixed point that the solver finds
and whose Jacobian the implicit backward pass uses; the masks are drawn once per forward call
(the same at every solver iteration), differ between calls and between samples; the masks have
mean 1; evaluation mode is exactly the undropped map; and ordinary dropout, redrawn at every
iteration, has no fixed point to converge to.

Compile work: the cells are applied outside a solve through one module-level ``nnx.jit``
(:data:`_apply`: one program per cell structure, shared by the tests, instead of one small
program per operation run eagerly), and checks on results (residuals, norms, finite
differences' arithmetic) are done in NumPy, which compiles nothing.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from deqlab.nn import DEQ, ResNetCell, TanhCell, TransformerCell, TrellisCell, WeightTiedDropout, unroll
from deqlab.nn.dropout import iterate_with_dropout

# Fixed points checked to 1e-10 and gradients against finite differences: float64 (tests/conftest.py).
pytestmark = pytest.mark.float64

RATE = 0.2


def _tanh(rate=RATE, rngs=None, **kw):
    cell = TanhCell(24, 3, scale=0.5, dropout=rate, rngs=nnx.Rngs(0) if rngs is None else rngs, **kw)
    return cell, jnp.ones((4, 3)) * 0.7


def _transformer(rate=RATE, rngs=None, **kw):
    # the printed layer (no attention residual): the fixed-point tests below need solves that reach
    # 1e-10 quickly; the dropout masks sit in the same three places either way
    kw.setdefault("attention_residual", False)
    cell = TransformerCell(16, 5, heads=2, dropout=rate, rngs=nnx.Rngs(0) if rngs is None else rngs, **kw)
    return cell, jax.random.normal(jax.random.key(1), (3, 6, 5))


def _trellis(rate=RATE, rngs=None, **kw):
    cell = TrellisCell(8, 5, dropout=rate, rngs=nnx.Rngs(0) if rngs is None else rngs, **kw)
    return cell, jax.random.normal(jax.random.key(1), (3, 6, 5))


CELLS = {"tanh": _tanh, "transformer": _transformer, "trellis": _trellis}


# A cell applied outside a solve: one program per cell structure (the graph is static, the
# parameters and the stream are traced), shared by every test that applies a cell of that structure.
_apply = nnx.jit(lambda cell, z, x, masks: cell(z, x, masks))


def _relative_residual(fz, z):
    """Worst per-sample relative residual ||f(z) - z|| / ||f(z)|| (in NumPy: compiles nothing)."""
    fz, z = np.asarray(fz), np.asarray(z)
    diff = (fz - z).reshape(z.shape[0], -1)
    return float(np.max(np.linalg.norm(diff, axis=-1) / np.linalg.norm(fz.reshape(z.shape[0], -1), axis=-1)))


def _max_abs_difference(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


# --------------------------------------------------------------------------------------------
# arguments


@pytest.mark.parametrize("make", list(CELLS.values()), ids=list(CELLS))
@pytest.mark.parametrize("rate", [1.0, -0.1, 1.5, float("nan"), "0.1", None])
def test_bad_dropout_rate_is_named(make, rate, compile_counter):
    """A bad rate is refused by name, before any parameter is initialised (nothing compiles)."""
    rngs = nnx.Rngs(0)  # seeding the stream may compile: outside the counted block
    with compile_counter() as counted, pytest.raises(ValueError, match="dropout"):
        make(rate, rngs=rngs)
    assert counted.programs == 0


def test_weight_tied_dropout_arguments(compile_counter):
    """Each bad argument is refused by name, and compiles nothing."""
    rngs = nnx.Rngs(0)  # seeding the stream may compile: outside the counted block
    fine = WeightTiedDropout(0.1, broadcast_axes=(-3,), rngs=rngs)
    with compile_counter() as counted:
        with pytest.raises(ValueError, match="rate"):
            WeightTiedDropout(1.0, rngs=rngs)
        with pytest.raises(ValueError, match="rngs"):
            WeightTiedDropout(0.1)
        with pytest.raises(ValueError, match="broadcast_axes"):
            WeightTiedDropout(0.1, broadcast_axes=3, rngs=rngs)
        with pytest.raises(ValueError, match="deterministic"):
            WeightTiedDropout(0.1, deterministic="yes", rngs=rngs)
        with pytest.raises(ValueError, match="broadcast axis"):
            fine.mask((4, 5))
    assert counted.programs == 0
    assert WeightTiedDropout(0.0).rngs is None  # rate 0 needs no random stream


def test_masks_for_a_cell_without_dropout_are_refused():
    """A cell built without dropout draws no masks but applies given ones (all-zero masks: the
    map is constant, its value at 0 unmasked); a cell without mask support refuses them."""
    cell, x = _tanh(rate=0.0)
    assert cell.dropout is None and cell.dropout_masks((4, 24)) is None
    # a cell that supports masks applies given ones, whatever its own rate
    masks = {"hidden": jnp.zeros((4, 24))}
    # Picard: the solver is not what this checks (the masked map is constant: one step)
    assert np.allclose(DEQ(cell, solver="picard")(x, masks=masks), _apply(cell, jnp.zeros((4, 24)), x, None))
    with pytest.raises(ValueError, match="masks"):
        DEQ(ResNetCell(24, 3, rngs=nnx.Rngs(0)))(x, masks=masks)


def test_resnet_cell_dropout_and_a_layer_built_deterministic():
    """ResNetCell's rate (0.7's CHANGELOG listed it; 0.9.0 refused it) masks the inner layer, where
    the multiscale DEQ's block drops; DEQ(..., deterministic=True) starts the whole layer in
    evaluation mode, its cell's dropout included (0.9.0 kept drawing masks: calls differed by 1.7).
    Picard (converged in at most 110 of the 200 steps here): the solver is not what this checks,
    and its programs compile in about half the time of the default's."""
    x = jax.random.normal(jax.random.key(1), (2, 3))
    layer = DEQ(ResNetCell(16, 3, dropout=0.3, rngs=nnx.Rngs(0)), solver="picard", tol=1e-8, max_steps=200)
    assert layer.cell.dropout_masks((2, 16))["inner"].shape == (2, 32)  # hidden = 2 * width
    assert _max_abs_difference(layer(x), layer(x)) > 1e-3
    reference = DEQ(ResNetCell(16, 3, rngs=nnx.Rngs(0)), solver="picard", tol=1e-8, max_steps=200)(x)
    evaluated = DEQ(ResNetCell(16, 3, dropout=0.3, rngs=nnx.Rngs(0)), solver="picard", tol=1e-8,
                    max_steps=200, deterministic=True)
    assert np.array_equal(evaluated(x), reference) and np.array_equal(evaluated(x), reference)
    with pytest.raises(ValueError, match="dropout"):
        ResNetCell(16, 3, dropout=1.0, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("masks", [{"wrong": jnp.ones((4, 24))}, {"hidden": jnp.ones((4, 7))}, [1.0]])
def test_malformed_masks_are_named(masks, compile_counter):
    """Masks with a wrong key, shape or type are refused by name, before anything is computed."""
    cell, x = _tanh()
    z = jnp.zeros((4, 24))
    with compile_counter() as counted, pytest.raises(ValueError, match="masks"):
        cell(z, x, masks)
    assert counted.programs == 0


@pytest.mark.parametrize("name", list(CELLS))
def test_dropout_leaves_the_parameters_as_without_it(name):
    """The mask stream is created after the parameters: same seed, same parameters."""
    with_dropout, _ = CELLS[name]()
    without, _ = CELLS[name](0.0)
    params = jax.tree_util.tree_leaves(nnx.state(with_dropout, nnx.Param))
    reference = jax.tree_util.tree_leaves(nnx.state(without, nnx.Param))
    assert len(params) == len(reference)
    assert all(np.array_equal(a, b) for a, b in zip(params, reference))


# --------------------------------------------------------------------------------------------
# the masks


def test_mask_values_and_mean():
    """Entries are 0 or 1/(1-p), kept with probability 1-p, so E[m] = 1.

    n = 400 000 independent entries at p = 0.3: one entry has standard deviation
    sqrt(p / (1-p)) = 0.655, the mean's is 0.655 / sqrt(n) = 1.04e-3; the tolerance is 5 of them
    (a false failure has probability below 1e-6). Same for the kept fraction (sd sqrt(p(1-p)/n)).
    """
    rate, n = 0.3, 400_000
    mask = WeightTiedDropout(rate, rngs=nnx.Rngs(dropout=3)).mask((n,), jnp.float64)
    values = set(np.unique(np.asarray(mask)).tolist())
    assert values == {0.0, 1.0 / (1.0 - rate)}
    assert abs(float(mask.mean()) - 1.0) < 5 * math.sqrt(rate / (1 - rate) / n)
    kept = float((mask > 0).mean())
    assert abs(kept - (1 - rate)) < 5 * math.sqrt(rate * (1 - rate) / n)


def test_sequence_masks_are_shared_along_positions_and_differ_between_samples():
    cell, x = _transformer(rate=0.5)
    masks = cell.dropout_masks((8, 6, 16))
    assert masks["attention"].shape == (8, 1, 16) and masks["feed_forward"].shape == (8, 1, 16)
    assert masks["hidden"].shape == (8, 1, cell.hidden)
    # 8 samples x 16 channels at p = 0.5: two samples share a mask with probability 2^-16
    rows = {tuple(np.asarray(row).ravel().tolist()) for row in masks["attention"]}
    assert len(rows) == 8
    # the three places draw independent masks
    assert not np.array_equal(masks["attention"], masks["feed_forward"])
    trellis, _ = _trellis()
    assert trellis.dropout_masks((8, 6, 16))["hidden"].shape == (8, 1, 8)


@pytest.mark.parametrize("name", list(CELLS))
def test_two_forward_calls_draw_different_masks(name):
    cell, x = CELLS[name]()
    layer = DEQ(cell, solver="broyden", tol=1e-8, max_steps=200)
    first, second = layer(x), layer(x)
    assert _max_abs_difference(first, second) > 1e-3


@pytest.mark.parametrize("name", list(CELLS))
def test_evaluation_mode_is_exactly_the_undropped_map(name):
    cell, x = CELLS[name]()
    reference = DEQ(CELLS[name](0.0)[0], solver="broyden", tol=1e-8, max_steps=200)(x)
    layer = DEQ(cell, solver="broyden", tol=1e-8, max_steps=200)
    layer.eval()
    assert cell.dropout_masks(tuple(x.shape[:-1]) + (cell.width,)) is None
    assert np.array_equal(layer(x), reference)
    assert np.array_equal(layer(x), reference)  # and it draws nothing: the next call agrees
    layer.train()
    assert not np.array_equal(layer(x), reference)
    if hasattr(nnx, "view"):  # flax >= 0.12
        assert np.array_equal(nnx.view(layer, deterministic=True)(x), reference)


# --------------------------------------------------------------------------------------------
# the fixed point of the masked map


@pytest.mark.parametrize("name", list(CELLS))
def test_solve_finds_the_fixed_point_of_the_masked_map(name):
    """The layer's output is a fixed point of f(., x; m) for the masks it drew (reproduced from a
    copy of the mask stream taken before the call), not of the undropped map."""
    cell, x = CELLS[name]()
    tol = 1e-9
    layer = DEQ(cell, solver="broyden", tol=tol, max_steps=300)
    shape = tuple(x.shape[:-1]) + (cell.width,)
    masks = nnx.clone(cell).dropout_masks(shape, x.dtype)  # the draw the layer is about to make
    z, sol = layer(x, return_solution=True)
    assert bool(np.all(sol.converged))
    assert _relative_residual(_apply(cell, z, x, masks), z) < 10 * tol
    assert _relative_residual(_apply(cell, z, x, None), z) > 1e-3
    # given masks are used as they are
    assert np.allclose(layer(x, masks=masks), z, atol=1e-7)


def test_masks_are_constant_across_solver_iterations():
    """Every evaluation of the map inside one solve sees the same masks (recorded at run time)."""
    seen = []

    class RecordingCell(TanhCell):
        def __call__(self, z, x, masks=None):
            jax.debug.callback(lambda m: seen.append(np.asarray(m)), masks["hidden"])
            return super().__call__(z, x, masks)

    cell = RecordingCell(24, 3, scale=0.5, dropout=RATE, rngs=nnx.Rngs(0))
    x = jnp.ones((4, 3))
    layer = DEQ(cell, solver="picard", tol=1e-10, max_steps=200)
    _, sol = layer(x, return_solution=True)
    jax.effects_barrier()
    assert len(seen) >= 10 and int(sol.stats.nfe) <= len(seen)
    assert all(np.array_equal(m, seen[0]) for m in seen)
    # the next call draws new masks, again constant within its solve
    count = len(seen)
    layer(x)
    jax.effects_barrier()
    assert not np.array_equal(seen[count], seen[0])
    assert all(np.array_equal(m, seen[count]) for m in seen[count:])


def test_fixed_mask_keeps_a_contraction_with_margin():
    """With W at scale s (orthogonal) and keep probability 1-p, the masked map is Lipschitz with
    constant at most s / (1 - p) (tanh' <= 1, and W restricted to the kept units is no larger
    than W); at s = 0.5, p = 0.2 that is 0.625: still a contraction, checked on random pairs."""
    cell, x = _tanh()
    masks = cell.dropout_masks((4, 24), jnp.float64)
    bound = 0.5 / (1 - RATE)
    rng = np.random.default_rng(5)  # NumPy draws and norms: only the map itself is compiled
    a = rng.standard_normal((200, 4, 24))
    b = a + 0.1 * rng.standard_normal((200, 4, 24))
    fab = np.asarray(jax.jit(jax.vmap(lambda z: cell(z, x, masks)))(jnp.asarray(np.concatenate([a, b]))))
    fa, fb = fab[:200], fab[200:]
    ratios = np.linalg.norm(fa - fb, axis=-1) / np.linalg.norm(a - b, axis=-1)
    assert float(ratios.max()) <= bound + 1e-12


@pytest.mark.parametrize("name", list(CELLS))
def test_ordinary_dropout_has_no_fixed_point(name):
    """Plain iteration: with one mask the residual falls below 1e-6 in 80 steps; redrawing the
    masks every step (ordinary dropout) leaves every sample above 1e-3 (the floor at p = 0.2 is
    1e-2 to 1e-1 for these cells)."""
    cell, x = CELLS[name]()
    _, tied = iterate_with_dropout(cell, x, 80)
    _, fresh = iterate_with_dropout(cell, x, 80, redraw=True)
    tied, fresh = np.asarray(tied), np.asarray(fresh)
    assert float(tied[-1].max()) < 1e-6
    assert float(fresh[-20:].min()) > 1e-3


def test_iterate_with_dropout_arguments():
    cell, x = _tanh(rate=0.0)
    with pytest.raises(ValueError, match="cell"):
        iterate_with_dropout(cell, x, 5)
    cell, x = _tanh()
    with pytest.raises(ValueError, match="steps"):
        iterate_with_dropout(cell, x, 0)
    with pytest.raises(ValueError, match="redraw"):
        iterate_with_dropout(cell, x, 5, redraw=1)


def test_unrolled_network_shares_one_mask_across_layers():
    """80 unrolled layers with one mask drawn for all converge to that mask's fixed point."""
    cell, x = _tanh()
    masks = nnx.clone(cell).dropout_masks((4, 24), x.dtype)
    z, trace = unroll(cell, x, depth=80)
    assert _relative_residual(_apply(cell, z, x, masks), z) < 1e-10


# --------------------------------------------------------------------------------------------
# gradients


def test_implicit_gradient_with_a_fixed_mask_matches_unrolled_and_finite_differences():
    """float64: implicit (003 Eq. 11) against backprop through the iterations and against central
    differences along random directions, all through the same fixed masks. The directions, shifts
    and inner products are NumPy (no program of their own); the shifted losses are eager calls of
    the layer, which reuse one compiled solve."""
    cell = TanhCell(12, 3, scale=0.5, dropout=0.3, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(2), (4, 3), jnp.float64)
    masks = cell.dropout_masks((4, 12), jnp.float64)
    implicit = DEQ(cell, solver="anderson", tol=1e-13, max_steps=500)
    unrolled = DEQ(cell, solver="picard", tol=1e-13, max_steps=500, backward="unrolled")

    def loss(layer):
        return jnp.sum(layer(x, masks=masks) ** 2)

    def flat(grads):
        return np.concatenate([np.asarray(g).ravel() for g in jax.tree_util.tree_leaves(grads)])

    g_implicit = nnx.state(nnx.grad(loss)(implicit), nnx.Param)
    g_unrolled = nnx.state(nnx.grad(loss)(unrolled), nnx.Param)
    flat_i, flat_u = flat(g_implicit), flat(g_unrolled)
    assert float(np.linalg.norm(flat_i - flat_u) / np.linalg.norm(flat_u)) < 1e-8

    graphdef, params, rest = nnx.split(implicit, nnx.Param, ...)
    leaves, treedef = jax.tree_util.tree_flatten(params)
    leaves = [np.asarray(p) for p in leaves]

    def loss_at(direction, s):  # the loss at params + s * direction (the shift made in NumPy)
        shifted = treedef.unflatten([jnp.asarray(p + s * d) for p, d in zip(leaves, direction)])
        return float(loss(nnx.merge(graphdef, shifted, rest)))

    eps = 1e-6
    rng = np.random.default_rng(7)
    for _ in range(3):
        direction = [rng.standard_normal(p.shape).astype(p.dtype) for p in leaves]
        fd = (loss_at(direction, eps) - loss_at(direction, -eps)) / (2 * eps)
        analytic = float(np.dot(flat_i, np.concatenate([d.ravel() for d in direction])))
        assert abs(fd - analytic) <= 1e-6 * max(1.0, abs(analytic))
    # the masks matter: the gradient without them differs
    g_plain = nnx.state(nnx.grad(lambda layer: jnp.sum(layer(x) ** 2))(DEQ(TanhCell(
        12, 3, scale=0.5, param_dtype=jnp.float64, rngs=nnx.Rngs(0)), tol=1e-13)), nnx.Param)
    flat_p = flat(g_plain)
    assert float(np.linalg.norm(flat_i - flat_p) / np.linalg.norm(flat_p)) > 1e-2


# --------------------------------------------------------------------------------------------
# transformations


def test_jitted_training_step_draws_new_masks_each_step():
    """Under nnx.jit the mask stream is state carried between steps: each training step draws new
    masks (its output differs), and in evaluation mode steps agree exactly. The step returns the
    output of its loss's own forward solve (an aux value), so the program holds one solve, not two."""
    cell, x = _transformer()
    layer = DEQ(cell, solver="broyden", tol=1e-6, max_steps=100)
    optimizer = nnx.Optimizer(layer, optax.sgd(0.0), wrt=nnx.Param)  # lr 0: only the masks change

    def loss_and_output(model, x):
        out = model(x)
        return jnp.mean(out ** 2), out

    @nnx.jit
    def step(model, optimizer, x):
        (loss, out), grads = nnx.value_and_grad(loss_and_output, has_aux=True)(model, x)
        optimizer.update(model, grads)
        return loss, out

    _, first = step(layer, optimizer, x)
    _, second = step(layer, optimizer, x)
    assert _max_abs_difference(first, second) > 1e-3
    layer.eval()
    _, a = step(layer, optimizer, x)
    _, b = step(layer, optimizer, x)
    assert np.array_equal(a, b)


def test_vmap_over_masks_matches_separate_solves():
    cell, x = _tanh()
    layer = DEQ(cell, solver="anderson", tol=1e-10, max_steps=200)
    draws = [cell.dropout_masks((4, 24), x.dtype) for _ in range(3)]
    stacked = jax.tree_util.tree_map(lambda *m: jnp.asarray(np.stack(m)), *draws)
    batched = np.asarray(jax.vmap(lambda m: layer(x, masks=m))(stacked))
    for i, masks in enumerate(draws):
        assert np.allclose(batched[i], layer(x, masks=masks), atol=1e-9)
