"""Equilibrium cells z, x -> z' whose recurrent weights come from a random-matrix ensemble.

Flax ``nnx.Linear`` computes ``z @ K``; for a square kernel K drawn from an ensemble the map is
z -> K^T z, and K^T has the same law as K for every ensemble in :mod:`deqlab.ensembles`, so the
theory of 001 (stated for z -> W z) applies unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from deqlab import ensembles

__all__ = ["TanhCell", "ResNetCell"]


def _check_width(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}.")


class TanhCell(nnx.Module):
    """The single-layer DEQ cell f(z, x) = tanh(W z + U x + b) (001 Eq. 21 with phi = tanh).

    Args:
        width: size N of the hidden state z.
        in_features: size of the input x.
        ensemble: family of W, one of ``deqlab.ensembles.ENSEMBLES``.
        scale: scale sqrt(V) of W; default 0.9 of the ensemble's critical scale.
        param_dtype: dtype of the parameters (float32 for training, float64 for checks).
        rngs: ``nnx.Rngs``.
    """

    def __init__(self, width: int, in_features: int, *, ensemble: str = "orthogonal",
                 scale: float | None = None, param_dtype=jnp.float32, rngs: nnx.Rngs):
        _check_width("width", width)
        _check_width("in_features", in_features)
        if scale is None:
            scale = 0.9 * ensembles.critical_scale(ensemble)
        self.width = width
        self.recurrent = nnx.Linear(
            width, width, use_bias=False, kernel_init=ensembles.initializer(ensemble, scale),
            param_dtype=param_dtype, rngs=rngs,
        )
        self.inject = nnx.Linear(in_features, width, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, z: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.tanh(self.recurrent(z) + self.inject(x))


class ResNetCell(nnx.Module):
    """A dense residual cell in the style of multiscale DEQs:
    f(z, x) = LayerNorm(relu(z + W2 relu(LayerNorm(W1 z)) + U x)).

    The normalisations bound the map's output, which keeps the fixed point well defined during
    training (003 §3.2, "The choice of f").

    Args:
        width: size of z.
        in_features: size of x.
        hidden: width of the inner layer (default 2 * width).
        ensemble, scale: law and scale of W1 and W2 (scale defaults to 0.5 of critical).
        param_dtype: dtype of the parameters.
        rngs: ``nnx.Rngs``.
    """

    def __init__(self, width: int, in_features: int, *, hidden: int | None = None,
                 ensemble: str = "gaussian", scale: float | None = None, param_dtype=jnp.float32,
                 rngs: nnx.Rngs):
        _check_width("width", width)
        _check_width("in_features", in_features)
        hidden = 2 * width if hidden is None else hidden
        _check_width("hidden", hidden)
        if scale is None:
            scale = 0.5 * ensembles.critical_scale(ensemble)
        init = ensembles.initializer(ensemble, scale)
        self.width = width
        dtypes = dict(param_dtype=param_dtype, rngs=rngs)
        self.expand = nnx.Linear(width, hidden, use_bias=False, kernel_init=init, **dtypes)
        self.contract = nnx.Linear(hidden, width, use_bias=False, kernel_init=init, **dtypes)
        self.inject = nnx.Linear(in_features, width, **dtypes)
        self.inner_norm = nnx.LayerNorm(hidden, **dtypes)
        self.outer_norm = nnx.LayerNorm(width, **dtypes)

    def __call__(self, z: jax.Array, x: jax.Array) -> jax.Array:
        h = jax.nn.relu(self.inner_norm(self.expand(z)))
        return self.outer_norm(jax.nn.relu(z + self.contract(h) + self.inject(x)))
