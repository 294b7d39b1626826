"""Weight-tied (variational) dropout: one mask per sequence, reused at every fixed-point iteration.

Ordinary dropout draws a new mask every time a layer runs. Inside a DEQ the "layer" is the map
``f(z, x)`` that the solver evaluates tens of times per forward pass, so ordinary dropout makes it
a different map at every evaluation: ``z = f(z, x; m_k)`` with fresh ``m_k`` has no fixed point,
the iteration settles into a noise floor and never meets a tolerance, and the implicit backward
pass (003 Eq. 11) differentiates a map the forward pass never solved.

Weight-tied dropout draws the masks once per forward call of the DEQ, before the solver starts,
and passes them into the map as an argument. For the solver the map ``z -> f(z, x; m)`` is then
one fixed (deterministic) function, whose equilibrium ``z*(m)`` the forward pass finds and whose
Jacobian at ``z*(m)`` the backward pass uses. This is variational dropout (Gal & Ghahramani 2016:
one mask per sequence, shared by every time step of a recurrent network) carried from the time
steps of an RNN to the iterations of an equilibrium model; the code of 003 (locuslab/deq,
``VariationalHidDropout``) resets its masks once per training step and shares each mask over the
positions of the sequence, and torchdeq ships it as ``VariationalDropout``.

A fixed mask keeps a fixed point but changes the map's Lipschitz constant. A mask ``m`` with
entries in ``{0, 1/(1-p)}`` has operator norm at most ``1/(1-p)``, so a map whose *input* is masked,
``z -> f(m * z)`` (``TanhCell``: ``tanh(W (m * z) + U x + b)``), has ``Lip <= Lip(f) / (1-p)``: a
map that contracts with margin, ``Lip(f) < 1 - p``, still contracts with every mask. A mask
*inside* the map gives no such bound from ``Lip(f)`` alone: for ``f = g2(m * g1(z))`` only the
product bound ``Lip(g2) Lip(g1) / (1-p)`` follows, one factor ``1/(1-p)`` per mask on a path
(``TransformerCell`` has three, the first in front of a LayerNorm, whose Lipschitz constant
depends on the scale of its input). Near the edge of stability dropout can push a cell over;
check the converged fraction (``deqlab.nn.DEQ`` reports it).

Train / evaluation follows the NNX convention: :class:`WeightTiedDropout` has a ``deterministic``
attribute, so ``model.eval()`` switches it off (masks of ones, the undropped map exactly) and
``model.train()`` on; ``nnx.view(model, deterministic=True)`` works too where flax has it.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from deqlab import checks

__all__ = ["WeightTiedDropout", "check_rate"]


def check_rate(rate: Any, name: str, where: str) -> float:
    """A dropout rate: a real number in [0, 1).

    Args:
        rate: the probability of dropping a unit.
        name: the argument's name, for the message.
        where: the public function, for the message.

    Returns:
        ``rate`` as a float.

    Raises:
        ValueError: ``rate`` is not a finite real number in [0, 1) (1 would drop everything and
            the rescaling ``1/(1-rate)`` is undefined).

    Example:
        >>> from deqlab.nn.dropout import check_rate
        >>> check_rate(0.1, "dropout", "nn.TanhCell")
        0.1
    """
    return checks.number(rate, name, where, lower=0.0, upper=1.0, upper_open=True)


class WeightTiedDropout(nnx.Module):
    """Masks for weight-tied (variational) dropout, drawn once per forward call of a DEQ.

    :meth:`mask` returns a scaled Bernoulli mask ``m = b / (1 - rate)``, ``b ~ Bernoulli(1 -
    rate)`` independently per entry, so that ``E[m] = 1`` and ``z * m`` has the mean of z
    ("inverted" dropout, as ``nnx.Dropout``). Axes listed in ``broadcast_axes`` get size 1: the
    mask is shared along them (for a sequence ``(batch, T, d)`` and ``broadcast_axes=(-2,)``,
    one mask per sequence and channel, shared by all T positions, as 003's code does). The
    cell multiplies by the mask; the :class:`deqlab.nn.DEQ` draws it before the solve and passes
    it into the map, so every solver iteration (and the implicit backward pass) sees the same m.

    Args:
        rate: probability of dropping a unit, in [0, 1). 0: :meth:`mask` is all ones.
        broadcast_axes: axes of the masked array along which one mask is shared (negative counts
            from the end, as usual).
        deterministic: start switched off (evaluation mode); ``model.train()`` / ``model.eval()``
            set it, as for ``nnx.Dropout``.
        rng_collection: the ``nnx.Rngs`` stream the masks come from (default ``"dropout"``; an
            ``nnx.Rngs`` without it falls back to its ``default`` stream).
        rngs: ``nnx.Rngs``; one key is taken from its ``rng_collection`` stream to seed this
            module's own stream. Required when ``rate > 0``.

    Attributes:
        rate: the dropout rate.
        broadcast_axes: the shared axes.
        deterministic: True: masks are all ones.
        rngs: this module's own ``nnx.Rngs`` (None when ``rate == 0``); each :meth:`mask` call
            advances it, so two calls give independent masks.

    Raises:
        ValueError: ``rate`` is not in [0, 1), ``broadcast_axes`` is not a sequence of integers,
            ``deterministic`` is not a bool, or ``rngs`` is not an ``nnx.Rngs`` while
            ``rate > 0``.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab.nn import WeightTiedDropout
        >>> drop = WeightTiedDropout(0.5, broadcast_axes=(-2,), rngs=nnx.Rngs(dropout=0))
        >>> m = drop.mask((2, 5, 4))
        >>> m.shape, sorted(set(m.ravel().tolist()))
        ((2, 1, 4), [0.0, 2.0])
        >>> drop.eval()
        >>> bool((drop.mask((2, 5, 4)) == 1).all())
        True
    """

    def __init__(self, rate: float, *, broadcast_axes: Sequence[int] = (), deterministic: bool = False,
                 rng_collection: str = "dropout", rngs: nnx.Rngs | None = None):
        where = "nn.WeightTiedDropout"
        self.rate = check_rate(rate, "rate", where)
        try:
            axes = tuple(broadcast_axes)
        except TypeError:
            raise checks.fail("broadcast_axes", "a sequence of integers", broadcast_axes, where) from None
        self.broadcast_axes = tuple(checks.integer(a, "broadcast_axes", where) for a in axes)
        if not isinstance(deterministic, bool):
            raise checks.fail("deterministic", "True or False", deterministic, where)
        if not isinstance(rng_collection, str) or not rng_collection:
            raise checks.fail("rng_collection", "the name of an nnx.Rngs stream", rng_collection, where)
        self.deterministic = deterministic
        self.rng_collection = rng_collection
        if self.rate > 0.0:
            if not isinstance(rngs, nnx.Rngs):
                raise checks.fail("rngs", "an nnx.Rngs such as nnx.Rngs(dropout=0) (needed when rate > 0)",
                                  rngs, where)
            # A stream of our own, seeded by one key of the caller's: the cell's parameters and
            # its masks never compete for the same counter.
            self.rngs = nnx.Rngs(**{rng_collection: getattr(rngs, rng_collection)()})
        else:
            self.rngs = None

    @property
    def active(self) -> bool:
        """Whether :meth:`mask` draws random masks (rate > 0 and not deterministic)."""
        return self.rate > 0.0 and not self.deterministic

    def mask_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """The shape of the mask for an array of ``shape``: 1 on the broadcast axes.

        Args:
            shape: shape of the array the mask multiplies.

        Returns:
            The mask's shape.

        Raises:
            ValueError: a broadcast axis is out of range for ``shape``.
        """
        shape = list(shape)
        for axis in self.broadcast_axes:
            if not -len(shape) <= axis < len(shape):
                raise ValueError(f"nn.WeightTiedDropout: broadcast axis {axis} is out of range for an array "
                                 f"of shape {tuple(shape)}.")
            shape[axis] = 1
        return tuple(shape)

    def mask(self, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
        """A fresh mask for an array of ``shape`` (ones when switched off).

        Args:
            shape: shape of the array the mask multiplies.
            dtype: the mask's dtype.

        Returns:
            An array of :meth:`mask_shape` ``(shape)``: entries ``0`` or ``1/(1 - rate)``, each kept
            with probability ``1 - rate`` independently; all ones when not :attr:`active`.

        Raises:
            ValueError: a broadcast axis is out of range for ``shape``.
        """
        mask_shape = self.mask_shape(shape)
        if not self.active:
            return jnp.ones(mask_shape, dtype)
        keep = 1.0 - self.rate
        kept = jax.random.bernoulli(getattr(self.rngs, self.rng_collection)(), keep, mask_shape)
        return jnp.where(kept, jnp.asarray(1.0 / keep, dtype), jnp.asarray(0.0, dtype))

    def set_view(self, deterministic: bool | None = None):
        """Used by ``nnx.view(model, deterministic=...)`` (flax >= 0.12), as ``nnx.Dropout``.

        Args:
            deterministic: True switches the masks off.
        """
        if deterministic is not None:
            self.deterministic = deterministic


def iterate_with_dropout(cell: nnx.Module, x: jax.Array, steps: int, *, redraw: bool = False,
                         z0: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Plain iteration ``z[k+1] = f(z[k], x; m[k])`` with weight-tied or with ordinary dropout.

    With ``redraw=False`` every step uses one set of masks (weight-tied dropout: a fixed map,
    whose fixed point the iteration approaches when it contracts); with ``redraw=True`` each step
    draws new ones, what ordinary dropout does inside a fixed-point map. The residual of step k is
    measured against the map that step used, ``||f(z[k]; m[k]) - z[k]|| / ||f(z[k]; m[k])||`` per
    sample (over all axes but the first), the quantity the solvers of :mod:`deqlab.solvers` stop
    on: with fresh masks it stalls at a noise floor set by the rate, since each step moves z
    towards a different map's fixed point.

    Args:
        cell: a cell with weight-tied dropout (``dropout_masks``), in training mode; the masks
            come from its stream, which this advances.
        x: the input, with a leading batch axis.
        steps: number of iterations, an integer >= 1.
        redraw: draw new masks at every step (ordinary dropout) instead of once.
        z0: the starting state, ``x.shape[:-1] + (cell.width,)``; None: zeros.

    Returns:
        ``(z[steps], residuals)``, residuals of shape ``(steps, batch)``.

    Raises:
        ValueError: ``steps`` is not an integer >= 1, ``redraw`` is not a bool, or the cell has
            no weight-tied dropout or is in evaluation mode.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab.nn import TanhCell
        >>> from deqlab.nn.dropout import iterate_with_dropout
        >>> cell = TanhCell(32, 4, scale=0.5, dropout=0.2, rngs=nnx.Rngs(0))
        >>> x = jnp.ones((3, 4))
        >>> _, tied = iterate_with_dropout(cell, x, 60)
        >>> _, fresh = iterate_with_dropout(cell, x, 60, redraw=True)
        >>> bool(tied[-1].max() < 1e-5), bool(fresh[-1].min() > 1e-2)
        (True, True)
    """
    where = "nn.iterate_with_dropout"
    steps = checks.positive_int(steps, "steps", where)
    if not isinstance(redraw, bool):
        raise checks.fail("redraw", "True or False", redraw, where)
    draw = getattr(cell, "dropout_masks", None)
    z = jnp.zeros(x.shape[:-1] + (cell.width,), x.dtype) if z0 is None else jnp.asarray(z0, x.dtype)
    first = None if draw is None else draw(z.shape, z.dtype)
    if first is None:
        raise checks.fail("cell", "a cell built with dropout > 0, in training mode (cell.train())",
                          type(cell).__name__, where)
    # masks drawn up front (the stream is module state), then scanned over
    draws = [first] + [draw(z.shape, z.dtype) if redraw else first for _ in range(steps - 1)]
    stacked = jax.tree_util.tree_map(lambda *m: jnp.stack(m), *draws)
    graphdef, state = nnx.split(cell)

    def step(z, masks):
        fz = nnx.merge(graphdef, state)(z, x, masks)
        diff = (fz - z).reshape(z.shape[0], -1)
        scale = fz.reshape(z.shape[0], -1)
        residual = jnp.linalg.norm(diff, axis=-1) / jnp.maximum(jnp.linalg.norm(scale, axis=-1),
                                                                jnp.finfo(z.dtype).tiny)
        return fz, residual

    return jax.lax.scan(step, z, stacked)
