"""The weight-tied transformer cell of the DEQ-Transformer (003 §4, "Weight-tied transformers").

003 writes one layer of a weight-tied (universal) transformer in DEQ form as

.. math:: f_\\theta(z_{1:T}; x_{1:T}) = \\mathrm{LN}(\\phi(\\mathrm{LN}(
          \\mathrm{SelfAttention}(z_{1:T} W_{QKV} + \\tilde x_{1:T}; \\mathrm{PE}_{1:T})))),
          \\qquad \\tilde x_{1:T} = x_{1:T} W_x ,

with the input injection added to the queries, keys and values, and phi a 2-layer position-wise
feed-forward residual block (003 §4, "Weight-tied transformers", an unnumbered display). :class:`TransformerCell`
implements it as 003's released code runs it, with these choices:

- **A residual around the attention (by default), as 003's code has it.** 003 prints the layer
  as ``LN(phi(LN(Attention(...))))``, but its released code (locuslab/deq,
  ``WeightShareSelfAttention.forward``) normalises ``attn_out + z``: the post-norm layer of
  Transformer-XL (Dai et al. 2019), which it builds on. (001 §4.2's "vanilla transformer layer"
  is Khan's (2020) Haiku DEQ transformer, a *pre*-LayerNorm block ``h + Attn(LN(h))``,
  ``h + MLP(LN(h))``: a residual around the attention too, in another place.)
  :class:`TransformerCell` follows the code:
  ``a = LN(z + Attention(...))``, then ``LN(a + W2 relu(W1 a + b1) + b2)``. ``attention_residual=False``
  gives the printed formula, ``a = LN(Attention(...))`` (book errata). The skip puts the identity
  into the Jacobian: without attention, f(z) = LN(phi(LN(z))) nearly fixes every normalised z,
  and with it ``J_f`` keeps eigenvalues near 1 (a spectral radius of 0.95-1.0 at initialisation
  is typical, chapter 5 page 1), so plain iteration barely contracts, Broyden's method is needed,
  and the equilibrium is pinned only by what attention and the feed-forward add. Without the
  skip the radius at initialisation is about 0.5.
- **LayerNorm without learned gain or bias**, epsilon 1e-5, as 003's code calls it
  (``F.layer_norm(x, (d,))``).
- **Positions: a learned relative bias.** Each head adds ``b_h[t - s]`` to the logit of query t
  and key s (``t - s >= 0``; distances at or beyond ``max_distance`` share the last entry). It is
  relative, as 003's relative positional embedding (§4-5, after Dai et al. 2019): f then commutes
  with a shift of the sequence, and one set of parameters serves every length, which a learned
  absolute embedding does not. It is a bias on the logits (Shaw et al. 2018; Raffel et al. 2020)
  rather than Transformer-XL's sinusoid-projected embedding, for the cost: H x max_distance
  numbers. The bias starts as ALiBi's linear recency penalty ``-m_h (t - s)`` with head slopes
  ``m_h = 2^(-8h/H)`` (Press et al. 2022), so that positions are told apart from the first step.
  Transformer-XL's global content bias ``u`` is kept (003's ``r_w_bias``, drawn from
  U(-0.05, 0.05)): every query gains a learned per-head vector, so key s also gets the logit
  ``u_h . k_s``.
- **Causal.** Query t attends to keys s <= t only; masked logits are a large finite negative, so
  their weights are exactly 0 and the output at t never depends on the inputs after t (tested).
- **Initialisation from an ensemble.** The feed-forward matrices W1 (width x hidden) and W2
  (hidden x width) are drawn by :func:`deqlab.ensembles.initializer` ``(ensemble, scale)``: the
  dense layers 001 App. D varies. GOE and antisymmetric matrices exist only square, so for them
  ``hidden`` stays ``width`` (001 App. D keeps 700 for GOE, where the others expand to 4 x 700).
  The attention matrices W_Q, W_K, W_V, W_O are square blocks drawn from
  ``attention_ensemble`` at ``attention_scale`` (any ensemble works for them, being square).
- **Weight-tied dropout** (``dropout=p``): masks on the attention output (after W_O), the
  feed-forward hidden layer (after the ReLU) and the feed-forward output (after W2), before
  each residual sum: the three places of the DEQ-Transformer's code (locuslab/deq,
  ``VariationalHidDropout``), one mask per sequence and channel, shared by all positions and
  all solver iterations of a forward call (:mod:`deqlab.nn.dropout`).

Shapes: ``z`` is ``(..., T, width)``, ``x`` is ``(..., T, in_features)``; the leading axes are
batch axes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from deqlab import checks, ensembles
from deqlab import precision as precision_module
from deqlab.nn.cells import _check_cell, _check_masks, _dropout_module, _linear
from deqlab.nn.dropout import check_rate

__all__ = ["TransformerCell", "alibi_slopes"]

SQUARE_ENSEMBLES = ("goe", "antisymmetric")
"""Ensembles with square matrices only: their feed-forward keeps ``hidden == width``."""


def alibi_slopes(heads: int) -> jax.Array:
    """ALiBi head slopes ``m_h = 2^(-8 h / H)``, h = 1..H (Press et al. 2022).

    Args:
        heads: number of heads H, an integer >= 1.

    Returns:
        An array of shape ``(heads,)``.

    Raises:
        ValueError: ``heads`` is not an integer >= 1.

    Example:
        >>> from deqlab.nn.transformer import alibi_slopes
        >>> alibi_slopes(2).tolist()
        [0.0625, 0.00390625]
    """
    heads = checks.positive_int(heads, "heads", "nn.alibi_slopes")
    return 2.0 ** (-8.0 * jnp.arange(1, heads + 1) / heads)


#: The largest ``max_distance`` accepted (2**20 biases per head, 4 MiB in float32).
MAX_DISTANCE_LIMIT = 2**20

class TransformerCell(nnx.Module):
    """One weight-tied causal transformer layer with input injection, as a DEQ cell (003 §4).

    ``width`` and ``features`` (what a readout sees) are both d; :meth:`readout` is the
    identity.

    Args:
        width: model width d (size of z's last axis); a multiple of ``heads``.
        in_features: size of the input x (its injection ``x W_x`` has 3 x width outputs: Q, K, V).
        heads: number of attention heads.
        hidden: width of the feed-forward layer; default 4 x width (001 App. D: 700 -> 2800), and
            width itself for the square ``"goe"`` / ``"antisymmetric"`` ensembles (required).
        ensemble: law of the feed-forward matrices W1, W2 (``deqlab.ensembles.ENSEMBLES``).
        scale: scale sqrt(V) of W1, W2; default half the ensemble's critical scale, the middle of
            001's range sqrt(V) in [0.1, 1] for Gaussian weights.
        attention_ensemble: law of W_Q, W_K, W_V, W_O.
        attention_scale: their scale; default 0.3 of the ensemble's critical scale. How it moves the
            contraction of f depends on the layer. With ``attention_residual=False`` small attention
            weights make f contractive at initialisation (spectral radius about 0.5 at the default),
            as 003 §5's advice of "a small operator norm in the weight matrices" expects, and larger
            ones raise the radius. With the residual (the default) the identity term holds the
            radius near 1 at small attention weights, so the plain iteration barely converges and
            Broyden's method is needed; larger attention weights dilute that term and lower the
            radius (chapter 5 page 1, Exercise 2).
        max_distance: number of learned relative-position biases per head (distances beyond
            share the last one), in ``[1, 2**20]``; the longest sequence length is enough.
        attention_residual: True (default): normalise ``z + Attention(...)``, as 003's released
            code does; False: ``Attention(...)`` alone, 003's printed
            formula (module docstring).
        dtype: as for :class:`deqlab.nn.TanhCell`.
        param_dtype: as for :class:`deqlab.nn.TanhCell`.
        precision: as for :class:`deqlab.nn.TanhCell`.
        dropout: rate p of weight-tied dropout in [0, 1) (module docstring; :meth:`dropout_masks`);
            0 (default): none.
        rngs: ``nnx.Rngs`` (the dropout masks' stream is seeded from its ``dropout`` stream, or
            ``default``).

    Attributes:
        width: d, the size of z's last axis.
        features: d, the size of :meth:`readout`'s output.
        in_features: size of x.
        heads: number of heads.
        hidden: feed-forward width.
        dropout: the :class:`deqlab.nn.WeightTiedDropout` (masks shared along the sequence
            axis), or None without dropout.

    Raises:
        ValueError: a size is not an integer >= 1, ``heads`` does not divide ``width``, ``hidden``
            differs from ``width`` for a square ensemble, an ensemble is unknown, a scale is
            negative, ``dropout`` is not in [0, 1), or a dtype, the precision or
            ``attention_residual`` is not valid.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab.nn import TransformerCell
        >>> cell = TransformerCell(8, 3, heads=2, rngs=nnx.Rngs(0))
        >>> cell(jnp.zeros((1, 5, 8)), jnp.ones((1, 5, 3))).shape
        (1, 5, 8)
    """

    def __init__(self, width: int, in_features: int, *, heads: int = 4, hidden: int | None = None,
                 ensemble: str = "gaussian", scale: float | None = None,
                 attention_ensemble: str = "gaussian", attention_scale: float | None = None,
                 max_distance: int = 64, attention_residual: bool = True, dtype: Any = None, param_dtype: Any = jnp.float32,
                 precision: Any = None, dropout: float = 0.0, rngs: nnx.Rngs):
        where = "nn.TransformerCell"
        precision = _check_cell(where, width, in_features, dtype, param_dtype, precision, ensemble, rngs)
        check_rate(dropout, "dropout", where)
        checks.choice(attention_ensemble, "attention_ensemble", ensembles.ENSEMBLES, where)
        checks.positive_int(heads, "heads", where)
        # The table holds heads x max_distance biases; distances past the longest sequence are
        # never read, so a larger table only costs memory (a typo of 10**12 would exhaust it).
        checks.integer(max_distance, "max_distance", where, minimum=1, maximum=MAX_DISTANCE_LIMIT)
        if width % heads:
            raise checks.fail("heads", f"a divisor of width ({width})", heads, where)
        square = ensemble in SQUARE_ENSEMBLES
        hidden = (width if square else 4 * width) if hidden is None else hidden
        checks.positive_int(hidden, "hidden", where)
        if square and hidden != width:
            raise checks.fail("hidden", f"equal to width ({width}) for the square {ensemble!r} ensemble "
                              "(001 App. D)", hidden, where)
        scale = 0.5 * ensembles.critical_scale(ensemble) if scale is None else scale
        if attention_scale is None:
            attention_scale = 0.3 * ensembles.critical_scale(attention_ensemble)
        checks.number(scale, "scale", where, lower=0.0)
        checks.number(attention_scale, "attention_scale", where, lower=0.0)
        if not isinstance(attention_residual, (bool, np.bool_)):
            raise checks.fail("attention_residual", "True or False", attention_residual, where)
        self.attention_residual = bool(attention_residual)
        self.width = width
        self.features = width
        self.in_features = in_features
        self.heads = heads
        self.hidden = hidden
        self.max_distance = max_distance
        self.dtype = dtype
        self.precision = precision
        common = dict(dtype=dtype, param_dtype=param_dtype, precision=precision, rngs=rngs)
        attn = ensembles.initializer(attention_ensemble, attention_scale)
        self.query = _linear(width, width, use_bias=False, kernel_init=attn, **common)
        self.key = _linear(width, width, use_bias=False, kernel_init=attn, **common)
        self.value = _linear(width, width, use_bias=False, kernel_init=attn, **common)
        self.out = _linear(width, width, kernel_init=attn, **common)
        # x~ = x W_x, one block for each of Q, K, V (003 §4: "we add input injection to Q, K, V")
        self.inject = _linear(in_features, 3 * width, **common)
        ff = ensembles.initializer(ensemble, scale)
        self.expand = _linear(width, hidden, kernel_init=ff, **common)
        self.contract = _linear(hidden, width, kernel_init=ff, **common)
        # 003's code normalises with F.layer_norm(x, (d,)): no learned gain or bias, epsilon 1e-5
        norms = dict(dtype=dtype, param_dtype=param_dtype, use_scale=False, use_bias=False, epsilon=1e-5,
                     rngs=rngs)
        self.attention_norm = nnx.LayerNorm(width, **norms)
        self.output_norm = nnx.LayerNorm(width, **norms)
        distances = jnp.arange(max_distance, dtype=param_dtype)
        self.position_bias = nnx.Param(-alibi_slopes(heads).astype(param_dtype)[:, None] * distances)
        # Transformer-XL's global content bias u (003's code: r_w_bias, drawn from U(-0.05, 0.05)):
        # the logit of query t and key s gains u_h . k_s
        self.content_bias = nnx.Param(jax.random.uniform(rngs.params(), (heads, width // heads), param_dtype,
                                                         -0.05, 0.05))
        # last, so that the parameters are drawn as without dropout; one mask per sequence (axis -2)
        self.dropout = _dropout_module(dropout, where, rngs, broadcast_axes=(-2,))

    def dropout_masks(self, z_shape: tuple[int, ...], dtype: Any = jnp.float32) -> dict[str, jax.Array] | None:
        """Fresh weight-tied dropout masks for a state of shape ``z_shape``, or None when off.

        :class:`deqlab.nn.DEQ` calls this once per forward call and passes the result to every
        evaluation of the cell (:mod:`deqlab.nn.dropout`).

        Args:
            z_shape: the shape of z, ``(..., T, width)``.
            dtype: the masks' dtype.

        Returns:
            ``{"attention": (..., 1, width), "hidden": (..., 1, hidden), "feed_forward": (..., 1,
            width)}`` (entries 0 or 1/(1-p), shared by the T positions), or None without dropout
            or in evaluation mode (``cell.eval()``).

        Raises:
            ValueError: ``z_shape`` is not a shape ``(..., T, width)`` of integers >= 0.
        """
        z_shape = self._checked_z_shape(z_shape)
        if self.dropout is None or not self.dropout.active:
            return None
        hidden_shape = tuple(z_shape[:-1]) + (self.hidden,)
        return {"attention": self.dropout.mask(z_shape, dtype), "hidden": self.dropout.mask(hidden_shape, dtype),
                "feed_forward": self.dropout.mask(z_shape, dtype)}

    def _checked_z_shape(self, z_shape: Any) -> tuple[int, ...]:
        import operator

        where, requirement = "nn.TransformerCell.dropout_masks", f"a shape (..., T, {self.width}) of integers >= 0"
        try:
            shape = tuple(operator.index(n) for n in z_shape)
        except TypeError:
            raise checks.fail("z_shape", requirement, z_shape, where) from None
        if len(shape) < 2 or shape[-1] != self.width or any(n < 0 for n in shape):
            raise checks.fail("z_shape", requirement, z_shape, where)
        return shape

    def _inputs(self, z: Any, x: Any, where: str) -> tuple[jax.Array, jax.Array]:
        """``z`` and ``x`` as arrays of shapes ``(..., T, width)`` and ``(..., T, in_features)``."""
        arrays = []
        for name, value in (("z", z), ("x", x)):
            if not hasattr(value, "shape"):
                try:
                    value = jnp.asarray(value)
                except (TypeError, ValueError):
                    raise checks.fail(name, "an array", value, where) from None
            arrays.append(value)
        z, x = arrays
        if z.ndim < 2 or z.shape[-1] != self.width:
            raise ValueError(f"{where}: `z` must have shape (..., T, {self.width}), got {tuple(z.shape)}.")
        if x.shape[:-1] != z.shape[:-1] or x.shape[-1] != self.in_features:
            raise ValueError(f"{where}: `x` must have shape {tuple(z.shape[:-1])} + ({self.in_features},) to match "
                             f"z, got {tuple(x.shape)}.")
        return z, x

    def _mask_shapes(self, z):
        return {"attention": z.shape, "hidden": z.shape[:-1] + (self.hidden,), "feed_forward": z.shape}

    def readout(self, z: jax.Array) -> jax.Array:
        """What a head reads from the equilibrium: all of z.

        Args:
            z: the state ``(..., T, width)``.

        Returns:
            ``z``.
        """
        return z

    def attention(self, z: jax.Array, x: jax.Array) -> jax.Array:
        """Causal multi-head self-attention on ``z W_QKV + x W_x`` (before the residual).

        Args:
            z: the state ``(..., T, width)``.
            x: the input ``(..., T, in_features)``.

        Returns:
            The attention output ``(..., T, width)``, after ``W_O``.

        Raises:
            ValueError: ``z`` or ``x`` has the wrong shape.
        """
        z, x = self._inputs(z, x, "nn.TransformerCell.attention")
        length = z.shape[-2]
        xq, xk, xv = jnp.split(self.inject(x), 3, axis=-1)
        dh = self.width // self.heads

        def heads(u):  # (..., T, d) -> (..., H, T, dh)
            return jnp.swapaxes(u.reshape(u.shape[:-1] + (self.heads, dh)), -2, -3)

        q, k, v = heads(self.query(z) + xq), heads(self.key(z) + xk), heads(self.value(z) + xv)
        q = q + self.content_bias[...][:, None, :].astype(q.dtype)  # (H, 1, dh) against (..., H, T, dh)
        logits = self._batched(q, k, contract=(-1, -1)) / jnp.sqrt(jnp.asarray(dh, q.dtype))
        t = jnp.arange(length)
        distance = t[:, None] - t[None, :]
        bias = self.position_bias[...][:, jnp.clip(distance, 0, self.max_distance - 1)]
        logits = logits + bias.astype(logits.dtype)
        # finite, not -inf: a fully masked row cannot occur (s = t is always allowed), and a finite
        # value keeps gradients NaN-free; exp underflows to exactly 0, so the masked keys get 0
        logits = jnp.where(distance >= 0, logits, jnp.finfo(logits.dtype).min / 2)
        weights = jax.nn.softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), axis=-1)
        mixed = self._batched(weights.astype(v.dtype), v, contract=(-1, -2))
        mixed = jnp.swapaxes(mixed, -2, -3)
        return self.out(mixed.reshape(mixed.shape[:-2] + (self.width,)))

    def _batched(self, a, b, contract):
        """Batched matmul over all leading axes, through :func:`deqlab.precision.dot_general` so
        that the attention products honour the solve's precision (and its CPU emulation)."""
        batch = tuple(range(a.ndim - 2))
        ca, cb = (c % a.ndim for c in contract)
        return precision_module.dot_general(a, b, (((ca,), (cb,)), (batch, batch)), precision=self.precision)

    def feed_forward_hidden(self, z: jax.Array, x: jax.Array,
                            masks: dict[str, jax.Array] | None = None) -> tuple[jax.Array, jax.Array]:
        """The feed-forward's input and hidden pre-activation at state z.

        The statistics of ``h`` at initialisation are what the ensemble and ``scale`` set; z itself
        leaves through a LayerNorm and has unit variance whatever they are.

        Args:
            z: the state ``(..., T, width)``.
            x: the input ``(..., T, in_features)``.
            masks: weight-tied dropout masks from :meth:`dropout_masks` (only ``"attention"`` acts
                here); None: no dropout.

        Returns:
            ``(a, h)``: ``a`` after the first LayerNorm, and ``h = a W1 + b1``, the layer whose
            matrices come from the ensemble (001 App. D).

        Raises:
            ValueError: ``z`` or ``x`` has the wrong shape, or ``masks`` is not None or a dict of
                masks that fit z.
        """
        z, x = self._inputs(z, x, "nn.TransformerCell.feed_forward_hidden")
        masks = _check_masks(masks, self._mask_shapes(z), "nn.TransformerCell")
        a = self._attention_block(z, x, masks)
        return a, self.expand(a)

    def _attention_block(self, z, x, masks):
        attended = self.attention(z, x)
        if masks is not None:
            attended = attended * masks["attention"].astype(attended.dtype)
        return self.attention_norm(z + attended if self.attention_residual else attended)

    def __call__(self, z: jax.Array, x: jax.Array, masks: dict[str, jax.Array] | None = None) -> jax.Array:
        """One layer of 003 §4's weight-tied transformer.

        Args:
            z: the state ``(..., T, width)``.
            x: the input ``(..., T, in_features)``.
            masks: weight-tied dropout masks from :meth:`dropout_masks`; None: no dropout.

        Returns:
            ``LN(phi(LN(z + Attention(...))))`` (``LN(phi(LN(Attention(...))))`` with
            ``attention_residual=False``), of z's shape.

        Raises:
            ValueError: ``z`` or ``x`` has the wrong shape, or ``masks`` is not None or a dict of
                masks that fit z.
        """
        z, x = self._inputs(z, x, "nn.TransformerCell")
        masks = _check_masks(masks, self._mask_shapes(z), "nn.TransformerCell")
        a = self._attention_block(z, x, masks)
        hidden = jax.nn.relu(self.expand(a))
        if masks is not None:
            hidden = hidden * masks["hidden"].astype(hidden.dtype)
        update = self.contract(hidden)
        if masks is not None:
            update = update * masks["feed_forward"].astype(update.dtype)
        phi = a + update  # 2-layer position-wise residual block
        return self.output_norm(phi)
