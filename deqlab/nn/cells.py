"""Equilibrium cells z, x -> z' whose recurrent weights come from a random-matrix ensemble.

Flax ``nnx.Linear`` computes ``z @ K``; for a square kernel K drawn from an ensemble the map is
z -> K^T z, and K^T has the same law as K for every ensemble in :mod:`deqlab.ensembles`, so the
theory of 001 (stated for z -> W z) applies unchanged.

Every cell takes the NNX pair ``dtype`` (of the computation; None: promoted from the inputs and
parameters) and ``param_dtype`` (of the parameters), and a ``precision`` for its matmuls
(None: the context's, which :class:`deqlab.nn.DEQ` sets to what the tolerance needs). Their
matmuls go through :func:`deqlab.precision.dot_general`, so
:func:`deqlab.precision.emulate_accelerator_matmuls` shows on a CPU what a TPU's bfloat16 passes
do to them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from deqlab import checks, ensembles
from deqlab import precision as precision_module
from deqlab.nn.dropout import WeightTiedDropout, check_rate

__all__ = ["TanhCell", "ResNetCell"]


def _linear(in_features, out_features, *, use_bias=True, kernel_init=None, dtype, param_dtype,
            precision, rngs):
    options = {} if kernel_init is None else {"kernel_init": kernel_init}
    return nnx.Linear(
        in_features, out_features, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
        precision=precision, dot_general=precision_module.dot_general, rngs=rngs, **options,
    )


def _check_cell(where, width, in_features, dtype, param_dtype, precision, ensemble, rngs):
    checks.positive_int(width, "width", where)
    checks.positive_int(in_features, "in_features", where)
    checks.choice(ensemble, "ensemble", ensembles.ENSEMBLES, where)
    if not isinstance(rngs, nnx.Rngs):
        raise checks.fail("rngs", "an nnx.Rngs such as nnx.Rngs(0)", rngs, where)
    if dtype is not None:
        checks.floating_dtype(dtype, "dtype", where)
    checks.floating_dtype(param_dtype, "param_dtype", where)
    return None if precision is None else precision_module.check_precision(precision, where)


def _dropout_module(rate, where, rngs, broadcast_axes=()):
    """The cell's :class:`WeightTiedDropout` for the rate given as ``dropout`` (None for 0, so that
    a cell without dropout has exactly the state it had before dropout existed)."""
    rate = check_rate(rate, "dropout", where)
    return WeightTiedDropout(rate, broadcast_axes=broadcast_axes, rngs=rngs) if rate > 0 else None


def _check_masks(masks, shapes, where):
    """``masks`` must be None or the dict of :meth:`dropout_masks`, each broadcastable to its array."""
    if masks is None:
        return None
    if not isinstance(masks, dict) or set(masks) != set(shapes):
        raise checks.fail("masks", f"None or a dict with keys {sorted(shapes)} (from cell.dropout_masks)",
                          type(masks).__name__ if not isinstance(masks, dict) else sorted(masks), where)
    for name, shape in shapes.items():
        try:
            jnp.broadcast_shapes(jnp.shape(masks[name]), shape)
        except ValueError:
            raise ValueError(f"{where}: `masks[{name!r}]` has shape {jnp.shape(masks[name])}, which does not "
                             f"broadcast to {shape}; draw masks with cell.dropout_masks(z.shape).") from None
    return masks


class TanhCell(nnx.Module):
    """The single-layer DEQ cell ``f(z, x) = tanh(W z + U x + b)`` (001 Eq. 21 with phi = tanh).

    Args:
        width: size N of the hidden state z.
        in_features: size of the input x.
        ensemble: family of W, one of ``deqlab.ensembles.ENSEMBLES``.
        scale: scale sqrt(V) of W; default 0.9 of the ensemble's critical scale.
        dtype: dtype of the computation (None: from inputs and parameters).
        param_dtype: dtype of the parameters (float32 for training, float64 for checks).
        precision: matmul precision (``"default"``, ``"high"``, ``"highest"``; None: the context's).
        dropout: rate p of weight-tied dropout on the hidden state, in [0, 1): with masks m from
            :meth:`dropout_masks` the map is ``tanh(W (m * z) + U x + b)``, the hidden-to-hidden
            variational dropout of Gal & Ghahramani (2016); one mask per sample, the same at every
            iteration (:mod:`deqlab.nn.dropout`). 0 (default): none.
        rngs: ``nnx.Rngs`` (the masks' stream is seeded from its ``dropout`` stream, or its
            ``default`` one when it has none).

    Attributes:
        width: size of z.
        in_features: size of x.
        recurrent: the ``nnx.Linear`` of W (no bias).
        inject: the ``nnx.Linear`` of U and b.
        dropout: the :class:`deqlab.nn.WeightTiedDropout`, or None without dropout.

    Raises:
        ValueError: ``width`` or ``in_features`` is not an integer >= 1, ``ensemble`` is unknown,
            ``rngs`` is not an ``nnx.Rngs``, ``dropout`` is not in [0, 1), or a dtype or the
            precision is not valid.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab.nn import TanhCell
        >>> cell = TanhCell(4, 2, rngs=nnx.Rngs(0))
        >>> cell(jnp.zeros((3, 4)), jnp.ones((3, 2))).shape
        (3, 4)
    """

    def __init__(self, width: int, in_features: int, *, ensemble: str = "orthogonal",
                 scale: float | None = None, dtype: Any = None, param_dtype: Any = jnp.float32,
                 precision: Any = None, dropout: float = 0.0, rngs: nnx.Rngs):
        precision = _check_cell("nn.TanhCell", width, in_features, dtype, param_dtype, precision, ensemble, rngs)
        check_rate(dropout, "dropout", "nn.TanhCell")
        if scale is None:
            scale = 0.9 * ensembles.critical_scale(ensemble)
        self.width = width
        self.in_features = in_features
        common = dict(dtype=dtype, param_dtype=param_dtype, precision=precision, rngs=rngs)
        self.recurrent = _linear(width, width, use_bias=False,
                                 kernel_init=ensembles.initializer(ensemble, scale), **common)
        self.inject = _linear(in_features, width, **common)
        # last, so that the parameters are drawn as without dropout
        self.dropout = _dropout_module(dropout, "nn.TanhCell", rngs)

    def dropout_masks(self, z_shape: tuple[int, ...], dtype: Any = jnp.float32) -> dict[str, jax.Array] | None:
        """Fresh weight-tied dropout masks for a state of shape ``z_shape``, or None when off.

        :class:`deqlab.nn.DEQ` calls this once per forward call and passes the result to every
        evaluation of the cell (:mod:`deqlab.nn.dropout`).

        Args:
            z_shape: the shape of z, ``(..., width)``.
            dtype: the masks' dtype.

        Returns:
            ``{"hidden": m}`` with m of ``z_shape`` (entries 0 or 1/(1-p)), or None without
            dropout or in evaluation mode (``cell.eval()``).
        """
        if self.dropout is None or not self.dropout.active:
            return None
        return {"hidden": self.dropout.mask(z_shape, dtype)}

    def __call__(self, z: jax.Array, x: jax.Array, masks: dict[str, jax.Array] | None = None) -> jax.Array:
        """One step of the cell.

        Args:
            z: hidden state, last axis ``width``.
            x: input, last axis ``in_features``.
            masks: weight-tied dropout masks from :meth:`dropout_masks`; None: no dropout.

        Returns:
            ``tanh(W (m * z) + U x + b)`` (m = 1 without masks), of z's shape.

        Raises:
            ValueError: ``masks`` is not None or a dict of masks that fit z.
        """
        masks = _check_masks(masks, {"hidden": jnp.shape(z)}, "nn.TanhCell")
        if masks is not None:
            z = z * masks["hidden"].astype(z.dtype)
        return jnp.tanh(self.recurrent(z) + self.inject(x))


class ResNetCell(nnx.Module):
    """A dense residual cell in the style of multiscale DEQs.

    ``f(z, x) = LayerNorm(relu(z + W2 relu(LayerNorm(W1 z)) + U x))``. The normalisations bound
    the map's output, which keeps the fixed point well defined during training (003 §3.2, "The
    choice of f").

    Args:
        width: size of z.
        in_features: size of x.
        hidden: width of the inner layer (default 2 * width; width for the square ``"goe"`` and
            ``"antisymmetric"`` ensembles, as in 001 App. D).
        ensemble: law of W1 and W2, one of ``deqlab.ensembles.ENSEMBLES``.
        scale: scale of W1 and W2; default 0.5 of the ensemble's critical scale.
        dtype: as for :class:`TanhCell`.
        param_dtype: as for :class:`TanhCell`.
        precision: as for :class:`TanhCell`.
        dropout: rate p of weight-tied dropout on the inner layer, in [0, 1): with masks m from
            :meth:`dropout_masks` the inner activation is ``m * relu(LayerNorm(W1 z))``, where the
            multiscale DEQ's residual block applies its variational dropout (Bai et al. 2020,
            ``VariationalHidDropout2d`` after the first convolution); one mask per sample, the same
            at every iteration. 0 (default): none.
        rngs: ``nnx.Rngs``.

    Attributes:
        width: size of z.
        in_features: size of x.
        hidden: width of the inner layer.
        dropout: the :class:`deqlab.nn.WeightTiedDropout`, or None without dropout.

    Raises:
        ValueError: as for :class:`TanhCell`, and when ``hidden`` is not an integer >= 1 or (for
            ``"goe"`` and ``"antisymmetric"``) differs from ``width``, or ``dropout`` is not in
            [0, 1).

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab.nn import ResNetCell
        >>> cell = ResNetCell(4, 2, rngs=nnx.Rngs(0))
        >>> cell(jnp.zeros((3, 4)), jnp.ones((3, 2))).shape
        (3, 4)
    """

    def __init__(self, width: int, in_features: int, *, hidden: int | None = None,
                 ensemble: str = "gaussian", scale: float | None = None, dtype: Any = None,
                 param_dtype: Any = jnp.float32, precision: Any = None, dropout: float = 0.0,
                 rngs: nnx.Rngs):
        where = "nn.ResNetCell"
        precision = _check_cell(where, width, in_features, dtype, param_dtype, precision, ensemble, rngs)
        check_rate(dropout, "dropout", where)
        square = ensemble in ("goe", "antisymmetric")  # symmetric laws exist only for square W
        hidden = (width if square else 2 * width) if hidden is None else hidden
        checks.positive_int(hidden, "hidden", where)
        if square and hidden != width:
            raise checks.fail("hidden", f"equal to width ({width}) for the square {ensemble!r} ensemble", hidden, where)
        if scale is None:
            scale = 0.5 * ensembles.critical_scale(ensemble)
        init = ensembles.initializer(ensemble, scale)
        self.width = width
        self.in_features = in_features
        common = dict(dtype=dtype, param_dtype=param_dtype, precision=precision, rngs=rngs)
        self.expand = _linear(width, hidden, use_bias=False, kernel_init=init, **common)
        self.contract = _linear(hidden, width, use_bias=False, kernel_init=init, **common)
        self.inject = _linear(in_features, width, **common)
        norms = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.inner_norm = nnx.LayerNorm(hidden, **norms)
        self.outer_norm = nnx.LayerNorm(width, **norms)
        self.hidden = hidden
        # last, so that the parameters are drawn as without dropout
        self.dropout = _dropout_module(dropout, where, rngs)

    def dropout_masks(self, z_shape: tuple[int, ...], dtype: Any = jnp.float32) -> dict[str, jax.Array] | None:
        """Fresh weight-tied dropout masks for a state of shape ``z_shape``, or None when off.

        Args:
            z_shape: the shape of z, ``(..., width)``.
            dtype: the masks' dtype.

        Returns:
            ``{"inner": m}`` with m of shape ``(..., hidden)`` (entries 0 or 1/(1-p)), or None
            without dropout or in evaluation mode.
        """
        if self.dropout is None or not self.dropout.active:
            return None
        return {"inner": self.dropout.mask(tuple(z_shape[:-1]) + (self.hidden,), dtype)}

    def __call__(self, z: jax.Array, x: jax.Array, masks: dict[str, jax.Array] | None = None) -> jax.Array:
        """One step of the cell.

        Args:
            z: hidden state, last axis ``width``.
            x: input, last axis ``in_features``.
            masks: weight-tied dropout masks from :meth:`dropout_masks`; None: no dropout.

        Returns:
            The next state, of z's shape.

        Raises:
            ValueError: ``masks`` is not None or a dict of masks that fit the inner layer.
        """
        masks = _check_masks(masks, {"inner": jnp.shape(z)[:-1] + (self.hidden,)}, "nn.ResNetCell")
        h = jax.nn.relu(self.inner_norm(self.expand(z)))
        if masks is not None:
            h = h * masks["inner"].astype(h.dtype)
        return self.outer_norm(jax.nn.relu(z + self.contract(h) + self.inject(x)))
