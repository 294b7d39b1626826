"""Equilibrium sequence models (003 §3-5): transformer and trellis cells, the block that solves or
unrolls them, the language model and its data-parallel training step."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from deqlab import nn

F64 = dict(param_dtype=jnp.float64)


def _transformer(seed=0, **kw):
    # 003's printed layer (no residual around the attention): these tests check the block's
    # mechanics (causality, unroll against solve, gradients) and need a map that contracts fast
    # (solves to 1e-11, a 12-layer unroll). The default cell, 003's code with the residual, has a
    # spectral radius near 1 at initialisation; test_transformer_cell_is_003s_code checks its layer.
    options = dict(heads=2, attention_scale=0.1, attention_residual=False, rngs=nnx.Rngs(seed))
    options.update(kw)
    return nn.TransformerCell(8, 6, **options)


def _trellis(seed=0, **kw):
    options = dict(kernel_size=2, dilation=2, rngs=nnx.Rngs(seed))
    options.update(kw)
    return nn.TrellisCell(4, 6, **options)


CELLS = {"transformer": _transformer, "trellis": _trellis}


@pytest.mark.float64
@pytest.mark.parametrize("name", CELLS)
@pytest.mark.parametrize("param_dtype", [jnp.float32, jnp.float64])
def test_cell_shapes_and_dtypes(name, param_dtype):
    cell = CELLS[name](param_dtype=param_dtype)
    x = jax.random.normal(jax.random.key(1), (3, 7, 6), param_dtype)
    z = jnp.zeros((3, 7, cell.width), param_dtype)
    # one compiled program (eager, a transformer cell's operations compile ~100 small ones)
    out, read, single = nnx.jit(lambda cell, z, x: (cell(z, x), cell.readout(cell(z, x)), cell(z[1], x[1])))(cell, z, x)
    assert out.shape == (3, 7, cell.width) and out.dtype == param_dtype
    assert read.shape == (3, 7, cell.features)
    # a single sequence (no batch axis) is the same computation as one row of a batch
    np.testing.assert_allclose(single, out[1], rtol=1e-6 if param_dtype == jnp.float32 else 1e-12)


def _perturbed(x, t0, key):
    return x.at[:, t0:].add(jax.random.normal(key, x[:, t0:].shape, x.dtype))


@pytest.mark.float64
@pytest.mark.parametrize("name", CELLS)
def test_causality(name):
    """The output at t does not depend on inputs after t: exactly for one application of f and for
    the unrolled network; for the DEQ up to the solve's tolerance, because the solvers' stopping
    test and their mixing coefficients are computed on the whole sequence (the exact fixed point
    is causal, the iterates only approximately)."""
    cell = CELLS[name](**F64)
    x = jax.random.normal(jax.random.key(2), (2, 9, 6))
    t0 = 5
    y = _perturbed(x, t0, jax.random.key(3))
    z = jax.random.normal(jax.random.key(4), (2, 9, cell.width))
    block = nn.EquilibriumBlock(cell, solver="broyden", tol=1e-11, max_steps=200)

    @nnx.jit  # one compiled program (eager, the cells' operations compile ~80 small ones)
    def outputs(block):
        return ([block.cell(z, u) for u in (x, y)], [block(u, depth=12)[0] for u in (x, y)],
                [block(u) for u in (x, y)])

    (f_x, f_y), (unrolled_x, unrolled_y), ((deq_x, stats_x), (deq_y, stats_y)) = outputs(block)
    assert np.max(np.abs(f_x[:, t0:] - f_y[:, t0:])) > 1e-3  # the perturbation matters
    np.testing.assert_array_equal(f_x[:, :t0], f_y[:, :t0])
    np.testing.assert_array_equal(unrolled_x[:, :t0], unrolled_y[:, :t0])
    assert float(stats_x["converged_fraction"]) == 1.0 and float(stats_y["converged_fraction"]) == 1.0
    # tol 1e-11 relative on a sequence of norm ~ sqrt(T d): the prefix moves by ~1e-10 at most
    np.testing.assert_allclose(deq_x[:, :t0], deq_y[:, :t0], atol=1e-8)
    assert np.max(np.abs(deq_x[:, t0:] - deq_y[:, t0:])) > 1e-3


def _layer_norm_003(u, axis):
    """``F.layer_norm(u, (d,))`` of 003's code: no gain, no bias, epsilon 1e-5, biased variance."""
    centred = u - u.mean(axis, keepdims=True)
    return centred / np.sqrt((centred**2).mean(axis, keepdims=True) + 1e-5)


def _reference_003(cell, z, x, residual):
    """One layer as 003's released code computes it (locuslab/deq, ``WeightShareSelfAttention`` and
    ``WeightSharePositionwiseFF``, post-norm, no memory, no dropout), in its channels-first layout
    ``(batch, d, T)`` with 1x1 convolutions as einsums. Written from that code, in float64 NumPy,
    reading the cell's parameters. Its positional term ``BD`` (sinusoid-projected relative
    embedding) is replaced by the cell's learned bias ``b_h[t - s]``, the one documented difference."""
    p = lambda module, name="kernel": np.asarray(getattr(module, name)[...], np.float64)  # noqa: E731
    conv = lambda w, u: np.einsum("io,bit->bot", w, u)  # noqa: E731  # Conv1d(kernel_size=1), w (in, out)
    zc, xc = np.swapaxes(np.asarray(z, np.float64), 1, 2), np.swapaxes(np.asarray(x, np.float64), 1, 2)
    bsz, d, qlen = zc.shape
    n_head = cell.heads
    d_head = d // n_head
    w_qkv = np.concatenate([p(cell.query), p(cell.key), p(cell.value)], axis=1)
    w_heads = conv(w_qkv, zc) + conv(p(cell.inject), xc) + p(cell.inject, "bias")[None, :, None]  # input injection
    q, k, v = (u.reshape(bsz, n_head, d_head, qlen) for u in np.split(w_heads, 3, axis=1))
    r_w_bias = np.asarray(cell.content_bias[...], np.float64)
    ac = np.einsum("bndi,bndj->bnij", q + r_w_bias[:, :, None], k)
    i, j = np.arange(qlen)[:, None], np.arange(qlen)[None, :]
    bd = np.asarray(cell.position_bias[...], np.float64)[:, np.clip(i - j, 0, cell.max_distance - 1)]
    score = ac / np.sqrt(d_head) + bd[None]
    score = np.where(j > i, -np.inf, score)  # torch.triu(ones, diagonal=1) masked with -inf
    prob = np.exp(score - score.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    attn_vec = np.einsum("bnij,bndj->bndi", prob, v).reshape(bsz, d, qlen)
    attn_out = conv(p(cell.out), attn_vec) + p(cell.out, "bias")[None, :, None]
    out = _layer_norm_003(attn_out + zc if residual else attn_out, axis=1)
    relu_out1 = np.maximum(conv(p(cell.expand), out) + p(cell.expand, "bias")[None, :, None], 0.0)
    out2 = conv(p(cell.contract), relu_out1) + p(cell.contract, "bias")[None, :, None]
    return np.swapaxes(_layer_norm_003(out2 + out, axis=1), 1, 2)


@pytest.mark.float64
def test_transformer_cell_is_003s_code():
    """The default cell is the layer of 003's released code (residual inside the first LayerNorm,
    non-affine LayerNorms, the content bias); ``attention_residual=False`` is the printed formula
    LN(phi(LN(Attention))). Float64 on both sides: agreement to 1e-10 (the reference sums in
    another order). The attention scale 1.0 makes attention matter (a zero attention would hide a
    wrong residual)."""
    x = jax.random.normal(jax.random.key(7), (2, 6, 5), jnp.float64)
    z = jax.random.normal(jax.random.key(8), (2, 6, 8), jnp.float64)
    apply = nnx.jit(lambda cell: cell(z, x))  # one program per layer (eager, ~50 small ones)
    for residual in (True, False):
        options = {} if residual else {"attention_residual": False}
        cell = nn.TransformerCell(8, 5, heads=2, attention_scale=1.0, max_distance=4, rngs=nnx.Rngs(3),
                                  **F64, **options)
        np.testing.assert_allclose(np.asarray(apply(cell)), _reference_003(cell, z, x, residual), rtol=0,
                                   atol=1e-10)
    # the two layers differ (so the comparison above can tell them apart)
    printed = nn.TransformerCell(8, 5, heads=2, attention_scale=1.0, max_distance=4, attention_residual=False,
                                 rngs=nnx.Rngs(3), **F64)
    assert np.max(np.abs(np.asarray(apply(printed)) - _reference_003(printed, z, x, True))) > 1e-2


def test_transformer_init_scales():
    """Feed-forward kernels come from the ensemble at sqrt(V); attention blocks at their scale."""
    width, hidden = 16, 64
    cell = nn.TransformerCell(width, 4, heads=4, hidden=hidden, ensemble="gaussian", scale=0.7,
                              attention_scale=0.3, rngs=nnx.Rngs(0))
    w1 = np.asarray(cell.expand.kernel[...])
    # i.i.d. N(0, V / fan_in): the sample std of 1024 entries is within ~3 / sqrt(2 * 1024) = 7% of it
    assert w1.shape == (width, hidden)
    assert abs(w1.std() / (0.7 / np.sqrt(width)) - 1) < 0.07
    wq = np.asarray(cell.query.kernel[...])
    assert abs(wq.std() / (0.3 / np.sqrt(width)) - 1) < 0.15  # 256 entries: 3 / sqrt(512) = 13%
    ortho = nn.TransformerCell(width, 4, heads=4, hidden=hidden, ensemble="orthogonal", scale=0.5,
                               rngs=nnx.Rngs(0))
    k = np.asarray(ortho.expand.kernel[...])  # fan_in < fan_out: orthonormal rows, times 0.5
    np.testing.assert_allclose(k @ k.T, 0.25 * np.eye(width), atol=1e-5)
    goe = nn.TransformerCell(width, 4, heads=4, ensemble="goe", scale=0.2, rngs=nnx.Rngs(0))
    assert goe.hidden == width  # square feed-forward (001 App. D)
    g = np.asarray(goe.expand.kernel[...])
    np.testing.assert_array_equal(g, g.T)


def test_trellis_init_scale():
    hidden, k = 32, 4
    cell = nn.TrellisCell(hidden, 3, kernel_size=k, ensemble="gaussian", scale=0.8, rngs=nnx.Rngs(0))
    kernel = np.asarray(cell.kernel[...])
    assert kernel.shape == (k, hidden, 4 * hidden)
    # each tap is drawn at scale / sqrt(k): 16384 entries, sample std within 3 / sqrt(2 * 16384) = 2%
    assert abs(kernel.std() / (0.8 / np.sqrt(k * hidden)) - 1) < 0.02
    goe = nn.TrellisCell(hidden, 3, kernel_size=1, ensemble="goe", scale=0.3, rngs=nnx.Rngs(0))
    block = np.asarray(goe.kernel[...])[0, :, :hidden]  # gate i's square block
    np.testing.assert_array_equal(block, block.T)


@pytest.mark.float64
@pytest.mark.parametrize("name", CELLS)
@pytest.mark.parametrize("solver", ["broyden", "anderson"])
def test_unrolled_and_deq_reach_the_same_equilibrium(name, solver):
    """With a contractive cell the deep weight-tied network converges to the DEQ's z*, using the
    same parameters (003 Eq. 4)."""
    cell = CELLS[name](**F64)
    x = jax.random.normal(jax.random.key(5), (3, 8, 6))
    block = nn.EquilibriumBlock(cell, solver=solver, tol=1e-12, max_steps=300)
    z_deq, stats = block(x)
    z_deep, deep_stats = block(x, depth=150)
    assert float(stats["converged_fraction"]) == 1.0
    assert float(deep_stats["residual_max"]) < 1e-12
    assert float(stats["steps_max"]) < 150  # the solver needs fewer evaluations than the deep net
    np.testing.assert_allclose(z_deq, z_deep, atol=1e-9)


def _tiny_lm(cell, depth=None, **kw):
    return nn.LanguageModel(11, cell, depth=depth, solver="broyden", tol=1e-12, max_steps=400,
                            rngs=nnx.Rngs(7), **kw)


@pytest.mark.float64
@pytest.mark.slow
@pytest.mark.parametrize("name", CELLS)
def test_implicit_gradient_matches_unrolled_and_finite_differences(name):
    """003 Theorem 1 on a small model in float64: the implicit gradient of the LM loss equals
    backprop through the deep network run to convergence, and central differences."""
    model = _tiny_lm(CELLS[name](**F64))
    tokens = jax.random.randint(jax.random.key(8), (2, 7), 0, 11)
    targets = jnp.roll(tokens, -1, axis=1)
    loss = lambda m, depth=None: nn.lm_loss(m, tokens, targets, depth=depth)[0]  # noqa: E731
    # each computation is one compiled program (eager, the transformer's gradients alone compile ~200)
    implicit, deep = nnx.jit(lambda m: (nnx.grad(loss)(m), nnx.grad(lambda m: loss(m, depth=200))(m)))(model)
    # host-side arithmetic in NumPy (each eager jnp operation on a new shape is a compiled program)
    flat_i = np.concatenate([np.ravel(g) for g in jax.tree_util.tree_leaves(implicit)])
    flat_d = np.concatenate([np.ravel(g) for g in jax.tree_util.tree_leaves(deep)])
    assert np.linalg.norm(flat_i - flat_d) / np.linalg.norm(flat_d) < 1e-7
    # a directional central difference along a random direction of the cell's parameters
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    leaves, treedef = jax.tree_util.tree_flatten(params)
    rng = np.random.default_rng(9)
    direction = [rng.standard_normal(p.shape).astype(p.dtype) for p in leaves]
    norm = np.sqrt(sum(np.sum(d**2) for d in direction))
    direction = [d / norm for d in direction]
    eps = 1e-4

    @jax.jit
    def loss_along(t):
        shifted = jax.tree_util.tree_unflatten(treedef, [p + t * d for p, d in zip(leaves, direction)])
        return loss(nnx.merge(graphdef, shifted, rest))

    at = lambda t: float(loss_along(t))  # noqa: E731

    # central differences at eps and eps / 2 combined by Richardson: the eps^2 term (measured 5.6e-7
    # at eps = 1e-5 on this curved loss) cancels, leaving O(eps^4), rounding 1e-16 / eps and the
    # solves' error tol |z| |dL/dz| / eps ~ 1e-12 * 7.5 * O(1) / 1e-4 ~ 1e-7 (|z| = sqrt(T d) ~ 7.5)
    central = lambda h: (at(h) - at(-h)) / (2 * h)  # noqa: E731
    fd = (4 * central(eps / 2) - central(eps)) / 3
    grad_leaves = jax.tree_util.tree_leaves(nnx.state(implicit, nnx.Param))
    analytic = float(sum(np.sum(np.asarray(g) * d) for g, d in zip(grad_leaves, direction)))
    assert abs(analytic - fd) < 3e-7 * max(1.0, abs(fd)), (analytic, fd)


def test_bad_arguments():
    rngs = nnx.Rngs(0)
    with pytest.raises(ValueError, match="heads"):
        nn.TransformerCell(10, 4, heads=3, rngs=rngs)
    with pytest.raises(ValueError, match="hidden"):
        nn.TransformerCell(8, 4, ensemble="goe", hidden=32, rngs=rngs)
    with pytest.raises(ValueError, match="attention_ensemble"):
        nn.TransformerCell(8, 4, attention_ensemble="cauchy", rngs=rngs)
    with pytest.raises(ValueError, match="scale"):
        nn.TransformerCell(8, 4, scale=-1.0, rngs=rngs)
    with pytest.raises(ValueError, match="kernel_size"):
        nn.TrellisCell(4, 4, kernel_size=0, rngs=rngs)
    with pytest.raises(ValueError, match="dilation"):
        nn.TrellisCell(4, 4, dilation=-2, rngs=rngs)
    cell = _transformer()
    with pytest.raises(ValueError, match="`x` must have shape"):
        cell(jnp.zeros((2, 5, 8)), jnp.zeros((2, 4, 6)))
    with pytest.raises(ValueError, match="`z` must have shape"):
        cell(jnp.zeros((5, 7)), jnp.zeros((5, 6)))
    with pytest.raises(ValueError, match="depth"):
        nn.EquilibriumBlock(cell, depth=0)
    with pytest.raises(ValueError, match="readout"):
        nn.EquilibriumBlock(nn.TanhCell(4, 4, rngs=rngs))
    model = nn.LanguageModel(5, cell, rngs=rngs)
    with pytest.raises(ValueError, match="tokens"):
        model(jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match="devices"):
        nn.data_mesh([])


_TWO_STEPS = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np, optax
    from flax import nnx
    from deqlab import nn

    def run(devices):
        # the printed layer: it contracts fast, so every solve converges (the test compares devices)
        cell = nn.TransformerCell(16, 8, heads=2, attention_scale=0.3, attention_residual=False, rngs=nnx.Rngs(0))
        model = nn.LanguageModel(13, cell, solver="broyden", tol=1e-5, max_steps=40, rngs=nnx.Rngs(1))
        optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
        tokens = np.asarray(jax.random.randint(jax.random.key(2), (3, 8, 12), 0, 13))
        batches = [(t[:, :-1], t[:, 1:]) for t in tokens]
        log = nn.train(model, optimizer, batches, mesh=nn.data_mesh(devices))
        return log

    n = int(sys.argv[1])
    try:  # a batch that does not split over the devices is refused with a clear message
        nn.shard_batch(nn.data_mesh(jax.devices()[:n]), np.zeros((n + 1, 4)))
        refused = "" if n == 1 else "accepted"
    except ValueError as error:
        refused = str(error)
    print(json.dumps({"devices": len(jax.devices()), "refused": refused, "log": run(jax.devices()[:n])}))
""")


def _two_steps(n_devices, simulated):
    env = dict(os.environ)
    # the unit tests' compile flags (tests/conftest.py) kept, the simulated devices added
    env["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={simulated}"
    env["JAX_PLATFORMS"] = "cpu"
    env["JAX_ENABLE_X64"] = "0"
    out = subprocess.run([sys.executable, "-c", _TWO_STEPS, str(n_devices)], env=env, capture_output=True,
                         text=True, timeout=600, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_training_on_8_simulated_devices_matches_one_device():
    """Three training steps with the batch sharded over 8 simulated CPU devices give the losses of
    one device. Tolerance: per-sequence solves are independent, so only the order of float32
    reductions (the loss mean, the gradient all-reduce, matmul blocking at batch 1 per device)
    differs, ~1e-7 relative per operation; a forward solve that stops one Broyden step earlier or
    later on one device moves z* within the tolerance 1e-5, so the losses agree to ~1e-5."""
    eight = _two_steps(8, 8)
    one = _two_steps(1, 1)
    assert eight["devices"] == 8 and one["devices"] == 1
    assert "multiple of the number of devices" in eight["refused"], eight["refused"]
    np.testing.assert_allclose(eight["log"]["loss"], one["log"]["loss"], rtol=1e-4)
    assert eight["log"]["loss"][-1] < eight["log"]["loss"][0]  # the steps trained
    for name in nn.STAT_NAMES:  # statistics logged every step
        assert len(eight["log"][name]) == 3
    assert min(eight["log"]["converged_fraction"]) == 1.0



def test_language_model_embedding_std_sets_the_embedding_scale():
    # 1000 x 6 entries: the sample standard deviation's relative standard error is
    # 1/sqrt(2 * 6000) = 0.9%, so 4% is over four standard errors
    cell = _trellis()
    default = nn.LanguageModel(1000, cell, rngs=nnx.Rngs(0))
    unit = nn.LanguageModel(1000, _trellis(), embedding_std=1.0, rngs=nnx.Rngs(0))
    assert unit.embed.embedding[...].size == 6000
    assert float(jnp.std(unit.embed.embedding[...])) == pytest.approx(1.0, rel=0.04)
    # the default is flax's nnx.Embed initialiser, 1/sqrt(in_features)
    assert float(jnp.std(default.embed.embedding[...])) == pytest.approx(cell.in_features**-0.5, rel=0.04)
