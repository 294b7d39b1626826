"""Baseline sequence models of 003 Table 1: LSTM, GRU and a temporal convolutional network.

003 §5.1 compares its DEQ-Transformer (14K parameters) on the copy-memory task with a TCN (16K),
an LSTM (14K) and a GRU (14K), the baselines of Bai et al. (2018, "An empirical evaluation of
generic convolutional and recurrent networks for sequence modeling"). Each model here maps int
tokens ``(batch, T)`` to logits ``(batch, T, vocab_size)``, causally (the output at t sees inputs
up to t only), reading the tokens one-hot (no embedding parameters).

- :class:`RecurrentModel`: ``nnx.RNN`` over ``nnx.LSTMCell`` or ``nnx.GRUCell`` (both in flax
  0.11 and 0.12), then a linear readout.
- :class:`TCN`: Bai et al.'s residual blocks of two dilated causal convolutions (dilation 2^i in
  block i) with ReLU, a 1x1 convolution on the skip path where the width changes; without their
  weight normalisation and dropout (the copy task needs neither at this size).

:func:`parameter_count` counts a model's parameters and :func:`width_for_parameters` picks the
width that brings a model closest to a parameter budget, so that the baselines are compared at
the size of the DEQ, as 003 Table 1 does.
"""

from __future__ import annotations

from typing import Callable, Iterable

import jax
import jax.numpy as jnp
from flax import nnx

from deqlab import checks

__all__ = ["RecurrentModel", "TCN", "RECURRENT_CELLS", "parameter_count", "width_for_parameters",
           "tcn_receptive_field", "tcn_levels"]

RECURRENT_CELLS = ("lstm", "gru")
"""Cells accepted by :class:`RecurrentModel`."""


def _check_tokens(tokens, vocab_size, where):
    tokens = jnp.asarray(tokens)
    if not jnp.issubdtype(tokens.dtype, jnp.integer) or tokens.ndim != 2:
        raise ValueError(f"{where}: `tokens` must be integer token ids of shape (batch, T), got {tokens.dtype} "
                         f"of shape {tuple(tokens.shape)}.")
    return jax.nn.one_hot(tokens, vocab_size, dtype=jnp.float32)  # the parameters are float32, x64 or not


class RecurrentModel(nnx.Module):
    """An LSTM or GRU over one-hot tokens with a linear readout (003 Table 1's LSTM and GRU).

    Args:
        vocab_size: number of input and output tokens (10 for copy memory).
        hidden: the state width, an integer >= 1.
        cell: ``"lstm"`` (Hochreiter & Schmidhuber 1997) or ``"gru"`` (Cho et al. 2014).
        rngs: ``nnx.Rngs``.

    Attributes:
        vocab_size: number of tokens.
        hidden: the state width.
        cell_kind: ``"lstm"`` or ``"gru"``.

    Raises:
        ValueError: ``vocab_size`` or ``hidden`` is not an integer >= 1, or ``cell`` is not one of
            :data:`RECURRENT_CELLS`.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab.nn.baselines import RecurrentModel
        >>> model = RecurrentModel(10, 8, cell="gru", rngs=nnx.Rngs(0))
        >>> model(jnp.zeros((2, 5), int)).shape
        (2, 5, 10)
    """

    def __init__(self, vocab_size: int, hidden: int, *, cell: str = "lstm", rngs: nnx.Rngs):
        where = "nn.baselines.RecurrentModel"
        self.vocab_size = checks.positive_int(vocab_size, "vocab_size", where)
        self.hidden = checks.positive_int(hidden, "hidden", where)
        self.cell_kind = checks.choice(cell, "cell", RECURRENT_CELLS, where)
        make = nnx.LSTMCell if cell == "lstm" else nnx.GRUCell
        self.rnn = nnx.RNN(make(vocab_size, hidden, rngs=rngs))
        self.head = nnx.Linear(hidden, vocab_size, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Logits of every position, causally.

        Args:
            tokens: integer ids ``(batch, T)``.

        Returns:
            Logits ``(batch, T, vocab_size)``.

        Raises:
            ValueError: ``tokens`` is not an integer array of shape (batch, T).
        """
        x = _check_tokens(tokens, self.vocab_size, "nn.baselines.RecurrentModel")
        return self.head(self.rnn(x))


def tcn_receptive_field(levels: int, kernel_size: int) -> int:
    """Steps of the past a :class:`TCN` sees: ``1 + 2 (k - 1)(2^levels - 1)``.

    (Two convolutions of dilation 2^i per block i.)

    Args:
        levels: number of blocks, an integer >= 1.
        kernel_size: k, an integer >= 1.

    Returns:
        The receptive field, an int.

    Raises:
        ValueError: ``levels`` or ``kernel_size`` is not an integer >= 1.

    Example:
        >>> from deqlab.nn.baselines import tcn_receptive_field
        >>> tcn_receptive_field(3, 8)
        99
    """
    levels = checks.positive_int(levels, "levels", "nn.baselines.tcn_receptive_field")
    kernel_size = checks.positive_int(kernel_size, "kernel_size", "nn.baselines.tcn_receptive_field")
    return 1 + 2 * (kernel_size - 1) * (2 ** levels - 1)


def tcn_levels(length: int, kernel_size: int) -> int:
    """The fewest blocks whose receptive field covers ``length`` steps.

    Bai et al. 2018 size the TCN so that the last output sees the first input.

    Args:
        length: the sequence length, an integer >= 1.
        kernel_size: k, an integer >= 2.

    Returns:
        The number of levels, an int >= 1.

    Raises:
        ValueError: ``length < 1`` or ``kernel_size < 2`` (or not integers).

    Example:
        >>> from deqlab.nn.baselines import tcn_levels
        >>> tcn_levels(100, 8)
        4
    """
    where = "nn.baselines.tcn_levels"
    length = checks.positive_int(length, "length", where)
    kernel_size = checks.integer(kernel_size, "kernel_size", where, minimum=2)
    levels = 1
    while tcn_receptive_field(levels, kernel_size) < length:
        levels += 1
    return levels


class _TemporalBlock(nnx.Module):
    def __init__(self, in_channels, channels, kernel_size, dilation, rngs):
        conv = dict(kernel_size=(kernel_size,), kernel_dilation=(dilation,), padding="CAUSAL", rngs=rngs)
        self.conv1 = nnx.Conv(in_channels, channels, **conv)
        self.conv2 = nnx.Conv(channels, channels, **conv)
        self.skip = nnx.Conv(in_channels, channels, kernel_size=(1,), rngs=rngs) if in_channels != channels else None

    def __call__(self, x):
        h = jax.nn.relu(self.conv2(jax.nn.relu(self.conv1(x))))
        return jax.nn.relu(h + (x if self.skip is None else self.skip(x)))


class TCN(nnx.Module):
    """A temporal convolutional network (Bai et al. 2018; 003 Table 1's TCN) with a linear readout.

    Args:
        vocab_size: number of input and output tokens.
        channels: width of every block, an integer >= 1.
        levels: number of residual blocks (dilations 1, 2, ..., 2^(levels-1)); see :func:`tcn_levels`.
        kernel_size: length of the causal convolutions, >= 2.
        rngs: ``nnx.Rngs``.

    Attributes:
        vocab_size: number of tokens.
        channels: width of every block.
        levels: number of blocks.
        kernel_size: length of the convolutions.
        receptive_field: :func:`tcn_receptive_field` of the model (a property).

    Raises:
        ValueError: ``vocab_size``, ``channels`` or ``levels`` is not an integer >= 1, or
            ``kernel_size < 2``.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab.nn.baselines import TCN
        >>> model = TCN(10, 6, levels=2, kernel_size=2, rngs=nnx.Rngs(0))
        >>> model(jnp.zeros((1, 7), int)).shape, model.receptive_field
        ((1, 7, 10), 7)
    """

    def __init__(self, vocab_size: int, channels: int, *, levels: int, kernel_size: int = 8, rngs: nnx.Rngs):
        where = "nn.baselines.TCN"
        self.vocab_size = checks.positive_int(vocab_size, "vocab_size", where)
        self.channels = checks.positive_int(channels, "channels", where)
        self.levels = checks.positive_int(levels, "levels", where)
        self.kernel_size = checks.integer(kernel_size, "kernel_size", where, minimum=2)
        blocks = []
        for i in range(levels):
            blocks.append(_TemporalBlock(vocab_size if i == 0 else channels, channels, kernel_size, 2 ** i, rngs))
        self.blocks = nnx.List(blocks) if hasattr(nnx, "List") else blocks
        self.head = nnx.Linear(channels, vocab_size, rngs=rngs)

    @property
    def receptive_field(self) -> int:
        """Steps of the past the model sees (:func:`tcn_receptive_field`)."""
        return tcn_receptive_field(self.levels, self.kernel_size)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Logits of every position, causally.

        Args:
            tokens: integer ids ``(batch, T)``.

        Returns:
            Logits ``(batch, T, vocab_size)``.

        Raises:
            ValueError: ``tokens`` is not an integer array of shape (batch, T).
        """
        h = _check_tokens(tokens, self.vocab_size, "nn.baselines.TCN")
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def parameter_count(model: nnx.Module) -> int:
    """Number of scalar parameters (``nnx.Param`` entries) of ``model``.

    Args:
        model: an ``nnx.Module``.

    Returns:
        The count, an int.

    Raises:
        ValueError: ``model`` is not an ``nnx.Module``.

    Example:
        >>> from flax import nnx
        >>> from deqlab.nn.baselines import parameter_count
        >>> parameter_count(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))  # 3 x 2 kernel + 2 biases
        8
    """
    if not isinstance(model, nnx.Module):
        raise checks.fail("model", "an nnx.Module", type(model).__name__, "nn.baselines.parameter_count")
    return int(sum(p.size for p in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))))


def width_for_parameters(make: Callable[[int], nnx.Module], target: int, widths: Iterable[int]) -> int:
    """The width among ``widths`` whose model has a parameter count closest to ``target``.

    Ties go to the smaller width. The count must grow with the width (it does for every model
    here), so a bisection over the sorted ``widths`` traces about log2(len(widths)) models
    (``nnx.eval_shape``: no arrays are made).

    Args:
        make: ``make(width) -> nnx.Module``.
        target: the parameter budget, an integer >= 1.
        widths: candidate widths, integers >= 1.

    Returns:
        The chosen width, an int.

    Raises:
        ValueError: ``make`` is not callable, ``target < 1``, or ``widths`` is empty or holds a
            non-positive entry.

    Example:
        >>> from flax import nnx
        >>> from deqlab.nn.baselines import width_for_parameters
        >>> make = lambda w: nnx.Linear(10, w, rngs=nnx.Rngs(0))  # 11 w parameters
        >>> width_for_parameters(make, 50, range(1, 20))
        5
    """
    where = "nn.baselines.width_for_parameters"
    if not callable(make):
        raise checks.fail("make", "a callable make(width) -> nnx.Module", type(make).__name__, where)
    target = checks.positive_int(target, "target", where)
    widths = sorted({checks.positive_int(w, "widths", where) for w in widths})
    if not widths:
        raise checks.fail("widths", "a non-empty list of integers >= 1", widths, where)
    cache: dict[int, int] = {}

    def count(i):
        if i not in cache:
            cache[i] = parameter_count(nnx.eval_shape(lambda: make(widths[i])))
        return cache[i]

    lo, hi = 0, len(widths) - 1  # the first index whose count reaches the target, or the last
    while lo < hi:
        mid = (lo + hi) // 2
        if count(mid) >= target:
            hi = mid
        else:
            lo = mid + 1
    best = min((i for i in (lo - 1, lo) if 0 <= i < len(widths)), key=lambda i: (abs(count(i) - target), i))
    return widths[best]
