"""Baselines of 003 Table 1 (LSTM, GRU, TCN): causality, receptive field, parameter counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from deqlab.nn import baselines


def _models():
    return {
        "lstm": baselines.RecurrentModel(10, 12, cell="lstm", rngs=nnx.Rngs(0)),
        "gru": baselines.RecurrentModel(10, 12, cell="gru", rngs=nnx.Rngs(0)),
        "tcn": baselines.TCN(10, 6, levels=2, kernel_size=3, rngs=nnx.Rngs(0)),
    }


@pytest.mark.parametrize("kind", ["lstm", "gru", "tcn"])
def test_causal(kind):
    model = _models()[kind]
    tokens = jax.random.randint(jax.random.key(0), (2, 20), 0, 10)
    base = np.asarray(model(tokens))
    assert base.shape == (2, 20, 10)
    for t in (0, 7, 19):
        changed = tokens.at[:, t].set((tokens[:, t] + 1) % 10)
        out = np.asarray(model(changed))
        np.testing.assert_array_equal(out[:, :t], base[:, :t])  # the past never sees the future
        assert np.abs(out[:, t] - base[:, t]).max() > 1e-6  # but the present sees itself


def test_tcn_receptive_field_is_exact():
    # levels 2, kernel 3: 1 + 2 * 2 * (1 + 2) = 13 steps
    model = baselines.TCN(10, 6, levels=2, kernel_size=3, rngs=nnx.Rngs(1))
    assert model.receptive_field == 13 == baselines.tcn_receptive_field(2, 3)
    tokens = jnp.zeros((1, 30), jnp.int32)
    base = np.asarray(model(tokens))
    out = np.asarray(model(tokens.at[0, 5].set(3)))
    reach = np.flatnonzero(np.abs(out - base).max(-1)[0] > 1e-7)
    assert reach.min() == 5 and reach.max() == 5 + 13 - 1  # sees exactly 12 steps back


def test_tcn_levels_minimal():
    for length in (1, 13, 14, 420):
        levels = baselines.tcn_levels(length, 8)
        assert baselines.tcn_receptive_field(levels, 8) >= length
        assert levels == 1 or baselines.tcn_receptive_field(levels - 1, 8) < length
    assert baselines.tcn_levels(420, 8) == 5  # T = 400 in 003 Table 1


@pytest.mark.parametrize("e,h,v", [(10, 53, 10), (7, 5, 3)])
def test_parameter_counts(e, h, v):
    lstm = baselines.RecurrentModel(e, h, cell="lstm", rngs=nnx.Rngs(0))
    # four gates: input kernel (no bias) + recurrent kernel with bias; readout h x v + v
    assert baselines.parameter_count(lstm) == 4 * (e * h + h * h + h) + h * e + e
    tcn = baselines.TCN(v, h, levels=2, kernel_size=3, rngs=nnx.Rngs(0))
    convs = (3 * v * h + h) + (3 * h * h + h) + (v * h + h) + 2 * (3 * h * h + h)
    assert baselines.parameter_count(tcn) == convs + h * v + v


def test_width_for_parameters_is_closest():
    make = lambda w: baselines.RecurrentModel(10, w, cell="gru", rngs=nnx.Rngs(0))  # noqa: E731
    w = baselines.width_for_parameters(make, 14_000, range(50, 70))
    counts = {u: baselines.parameter_count(make(u)) for u in (w - 1, w, w + 1)}
    assert abs(counts[w] - 14_000) <= min(abs(counts[w - 1] - 14_000), abs(counts[w + 1] - 14_000))


@pytest.mark.parametrize("call,match", [
    (lambda: baselines.RecurrentModel(10, 0, rngs=nnx.Rngs(0)), "hidden"),
    (lambda: baselines.RecurrentModel(10, 4, cell="rnn", rngs=nnx.Rngs(0)), "cell"),
    (lambda: baselines.TCN(10, 4, levels=0, rngs=nnx.Rngs(0)), "levels"),
    (lambda: baselines.TCN(10, 4, levels=2, kernel_size=1, rngs=nnx.Rngs(0)), "kernel_size"),
    (lambda: baselines.tcn_levels(0, 8), "length"),
    (lambda: baselines.width_for_parameters(lambda w: None, 0, [1]), "target"),
    (lambda: baselines.width_for_parameters(lambda w: None, 10, []), "widths"),
    (lambda: baselines.parameter_count("lstm"), "model"),
    (lambda: _models()["lstm"](jnp.zeros((2, 3))), "tokens"),
    (lambda: _models()["tcn"](jnp.zeros(3, jnp.int32)), "tokens"),
])
def test_bad_args(call, match):
    with pytest.raises(ValueError, match=match):
        call()
