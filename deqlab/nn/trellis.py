"""The TrellisNet cell of DEQ-TrellisNet (003 §4, "Trellis networks"; Bai et al. 2019, TrellisNet).

A trellis network is a temporal convolutional network whose kernel is shared by every layer and
whose input is injected at every layer. In DEQ form (003 §4):

.. math:: f_\\theta(z_{1:T}; x_{1:T}) = \\psi(\\mathrm{Conv1D}([u_{-(k-1)s:}, z_{1:T}]; W_z)
          + \\tilde x_{1:T}), \\qquad \\tilde x_{1:T} = \\mathrm{Conv1D}(x_{1:T}; W_x),

a causal convolution of kernel size k and dilation s over z with its (k - 1) s steps of left
padding u, and psi the LSTM-style gated activation of TrellisNet. The hidden state of each time
step is a pair (h_t, c_t), so ``z = [h, c]`` has width 2 x hidden. The convolution of h (plus the
injection) gives four gate pre-activations (i, f, o, g) per step, and

.. math:: c'_t = \\sigma(f_t) \\odot c_{t-1} + \\sigma(i_t) \\odot \\tanh(g_t), \\qquad
          h'_t = \\sigma(o_t) \\odot \\tanh(c'_t),

with c_{t-1} the previous step's cell state of the same iterate (TrellisNet's "mixed group
convolution": the cell state travels one step in time per layer). The gates bound the output,
the property 003 §3.2 credits for a stable equilibrium.

**Padding.** u is zeros (003's option 2). History padding (option 1, the last (k - 1) s states of
the previous segment) is for streaming a corpus across segments; the book trains on independent
segments, where it has nothing to carry.

**Weight-tied dropout** (``dropout=p``): a mask on h where it enters the recurrent convolution
(hidden-to-hidden variational dropout, as TrellisNet's ``dropouth``), one mask per sequence and
channel, shared by all positions and all solver iterations of a forward call
(:mod:`deqlab.nn.dropout`).

Shapes: ``z`` is ``(..., T, 2 hidden)``, ``x`` is ``(..., T, in_features)``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from deqlab import checks, ensembles
from deqlab import precision as precision_module
from deqlab.nn.cells import _check_cell, _check_masks, _dropout_module
from deqlab.nn.dropout import check_rate

__all__ = ["TrellisCell", "causal_conv"]


def causal_conv(u: jax.Array, kernel: jax.Array, dilation: int, precision: Any = None) -> jax.Array:
    """Causal dilated 1-D convolution over the time axis -2.

    ``out_t = sum_j u_{t - j s} K_j``, with zero for ``t - j s < 0``.

    Args:
        u: input ``(..., T, C_in)``.
        kernel: ``(k, C_in, C_out)``.
        dilation: s, an integer >= 1.
        precision: matmul precision (None: the context's).

    Returns:
        ``(..., T, C_out)``.

    Raises:
        ValueError: ``dilation`` is not an integer >= 1, or the shapes of ``u`` and ``kernel`` do
            not fit.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.nn.trellis import causal_conv
        >>> u = jnp.arange(4.0).reshape(4, 1)
        >>> causal_conv(u, jnp.ones((2, 1, 1)), dilation=1)[:, 0].tolist()  # u_t + u_{t-1}
        [0.0, 1.0, 3.0, 5.0]
    """
    where = "nn.causal_conv"
    dilation = checks.positive_int(dilation, "dilation", where)
    if jnp.ndim(u) < 2:
        raise checks.fail("u", "an array (..., T, C_in)", f"shape {jnp.shape(u)}", where)
    if jnp.ndim(kernel) != 3 or jnp.shape(kernel)[1] != jnp.shape(u)[-1]:
        raise checks.fail("kernel", f"an array (k, C_in, C_out) with C_in = {jnp.shape(u)[-1]} (the last axis of `u`)",
                          f"shape {jnp.shape(kernel)}", where)
    k = kernel.shape[0]
    length = u.shape[-2]
    out = 0.0
    for j in range(k):
        shift = j * dilation
        if shift >= length:
            break
        shifted = u if shift == 0 else jnp.concatenate(
            [jnp.zeros(u.shape[:-2] + (shift, u.shape[-1]), u.dtype), u[..., : length - shift, :]], axis=-2)
        out = out + precision_module.dot_general(
            shifted, kernel[j].astype(u.dtype), (((u.ndim - 1,), (0,)), ((), ())), precision=precision)
    return out


class TrellisCell(nnx.Module):
    """Weight-tied temporal convolution with input injection and gated activation (003 §4).

    ``features`` (what :meth:`readout` returns) is ``hidden``: a head reads h, not c.

    Args:
        hidden: size of h (and of c); the state z has width 2 x hidden.
        in_features: size of the input x.
        kernel_size: k >= 1, taps of both convolutions.
        dilation: s >= 1.
        ensemble: law of the recurrent kernel W_z. Each of its k taps and each of the four gates
            is a square hidden x hidden block from the ensemble.
        scale: scale sqrt(V) of W_z; the blocks are drawn at ``scale / sqrt(k)`` so that the whole
            convolution (fan-in k x hidden) has scale ``scale``; default half the ensemble's
            critical scale.
        dtype: as for :class:`deqlab.nn.TanhCell`.
        param_dtype: as for :class:`deqlab.nn.TanhCell`.
        precision: as for :class:`deqlab.nn.TanhCell`.
        dropout: rate p of weight-tied dropout on h in [0, 1) (module docstring;
            :meth:`dropout_masks`); 0 (default): none.
        rngs: ``nnx.Rngs`` (the dropout masks' stream is seeded from its ``dropout`` stream, or
            ``default``).

    Attributes:
        hidden: size of h.
        width: 2 x hidden, the size of z.
        features: hidden, the size of :meth:`readout`'s output.
        in_features: size of x.
        dropout: the :class:`deqlab.nn.WeightTiedDropout`, or None without dropout.

    Raises:
        ValueError: a size is not an integer >= 1, the ensemble is unknown, ``scale`` is negative,
            ``dropout`` is not in [0, 1), or a dtype or the precision is not valid.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab.nn import TrellisCell
        >>> cell = TrellisCell(4, 3, rngs=nnx.Rngs(0))
        >>> cell(jnp.zeros((2, 5, 8)), jnp.ones((2, 5, 3))).shape
        (2, 5, 8)
    """

    def __init__(self, hidden: int, in_features: int, *, kernel_size: int = 2, dilation: int = 1,
                 ensemble: str = "gaussian", scale: float | None = None, dtype: Any = None,
                 param_dtype: Any = jnp.float32, precision: Any = None, dropout: float = 0.0, rngs: nnx.Rngs):
        where = "nn.TrellisCell"
        precision = _check_cell(where, hidden, in_features, dtype, param_dtype, precision, ensemble, rngs)
        check_rate(dropout, "dropout", where)
        checks.positive_int(kernel_size, "kernel_size", where)
        checks.positive_int(dilation, "dilation", where)
        scale = 0.5 * ensembles.critical_scale(ensemble) if scale is None else scale
        checks.number(scale, "scale", where, lower=0.0)
        self.hidden = hidden
        self.width = 2 * hidden
        self.features = hidden
        self.in_features = in_features
        self.kernel_size = kernel_size
        self.dilation = dilation
        self.dtype = dtype
        self.precision = precision
        init = ensembles.initializer(ensemble, scale / kernel_size**0.5)
        keys = jax.random.split(rngs.params(), kernel_size * 4)
        blocks = jnp.stack([init(key, (hidden, hidden), param_dtype) for key in keys])
        # (k, 4, hidden_in, hidden_out) -> (k, hidden_in, 4 hidden_out): gate blocks side by side
        blocks = blocks.reshape(kernel_size, 4, hidden, hidden).transpose(0, 2, 1, 3)
        self.kernel = nnx.Param(blocks.reshape(kernel_size, hidden, 4 * hidden))
        lecun = nnx.initializers.lecun_normal()
        inject = lecun(rngs.params(), (kernel_size * in_features, 4 * hidden), param_dtype)
        self.inject_kernel = nnx.Param(inject.reshape(kernel_size, in_features, 4 * hidden))
        self.bias = nnx.Param(jnp.zeros((4 * hidden,), param_dtype))
        # last, so that the parameters are drawn as without dropout; one mask per sequence (axis -2)
        self.dropout = _dropout_module(dropout, where, rngs, broadcast_axes=(-2,))

    def dropout_masks(self, z_shape: tuple[int, ...], dtype: Any = jnp.float32) -> dict[str, jax.Array] | None:
        """Fresh weight-tied dropout masks for a state of shape ``z_shape``, or None when off.

        :class:`deqlab.nn.DEQ` calls this once per forward call and passes the result to every
        evaluation of the cell (:mod:`deqlab.nn.dropout`).

        Args:
            z_shape: the shape of z, ``(..., T, 2 hidden)``.
            dtype: the masks' dtype.

        Returns:
            ``{"hidden": (..., 1, hidden)}`` (entries 0 or 1/(1-p), shared by the T positions), or
            None without dropout or in evaluation mode (``cell.eval()``).
        """
        if self.dropout is None or not self.dropout.active:
            return None
        return {"hidden": self.dropout.mask(tuple(z_shape[:-1]) + (self.hidden,), dtype)}

    def readout(self, z: jax.Array) -> jax.Array:
        """The h half of the state, what TrellisNet's decoder reads.

        Args:
            z: the state ``(..., T, 2 hidden)``.

        Returns:
            ``z[..., :hidden]``.
        """
        return z[..., : self.hidden]

    def __call__(self, z: jax.Array, x: jax.Array, masks: dict[str, jax.Array] | None = None) -> jax.Array:
        """One layer of the trellis network: gated convolution of h plus the injection.

        Args:
            z: the state ``[h, c]``, ``(..., T, 2 hidden)``.
            x: the input ``(..., T, in_features)``.
            masks: weight-tied dropout masks from :meth:`dropout_masks` (on h before the
                convolution); None: no dropout.

        Returns:
            The next ``[h', c']``, of z's shape.

        Raises:
            ValueError: ``z`` or ``x`` has the wrong shape, or ``masks`` is not None or a dict of
                masks that fit h.
        """
        where = "nn.TrellisCell"
        if z.ndim < 2 or z.shape[-1] != self.width:
            raise ValueError(f"{where}: `z` must have shape (..., T, {self.width}) ([h, c]), got {tuple(z.shape)}.")
        if x.shape[:-1] != z.shape[:-1] or x.shape[-1] != self.in_features:
            raise ValueError(f"{where}: `x` must have shape {tuple(z.shape[:-1])} + ({self.in_features},) "
                             f"to match z, got {tuple(x.shape)}.")
        dtype = self.dtype or jnp.result_type(z, x, self.kernel[...])
        z, x = z.astype(dtype), x.astype(dtype)
        h, c = z[..., : self.hidden], z[..., self.hidden:]
        masks = _check_masks(masks, {"hidden": h.shape}, where)
        if masks is not None:
            h = h * masks["hidden"].astype(dtype)
        pre = (causal_conv(h, self.kernel[...], self.dilation, self.precision)
               + causal_conv(x, self.inject_kernel[...], self.dilation, self.precision)
               + self.bias[...].astype(dtype))
        i, f, o, g = jnp.split(pre, 4, axis=-1)
        c_prev = jnp.concatenate([jnp.zeros_like(c[..., :1, :]), c[..., :-1, :]], axis=-2)
        c_new = jax.nn.sigmoid(f) * c_prev + jax.nn.sigmoid(i) * jnp.tanh(g)
        h_new = jax.nn.sigmoid(o) * jnp.tanh(c_new)
        return jnp.concatenate([h_new, c_new], axis=-1)
