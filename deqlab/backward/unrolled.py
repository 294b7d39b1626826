"""Backpropagation through the forward iterations: the reference gradient, optionally
checkpointed (compute traded for memory)."""

from __future__ import annotations

from deqlab.backward.base import Backward
from deqlab.solvers.loop import check_checkpoint

__all__ = ["Unrolled"]


class Unrolled(Backward):
    """Backpropagation through ``max_steps`` forward iterations (``lax.scan``).

    The forward solve runs exactly the solver's ``max_steps`` iterations (samples that stopped
    are masked), and reverse-mode autodiff goes through all of them: the exact derivative of the
    computed iterate, the reference the other modes are checked against
    (:func:`check_gradients`; 003 Eq. 3-4, the weight-tied network the DEQ is the limit of).

    Plain unrolling stores every iteration, so its memory grows linearly with ``max_steps``.
    ``checkpoint`` trades compute for memory (gradient checkpointing with sqrt(n) memory, Chen
    et al. 2016, "Training deep nets with sublinear memory cost"; torchdeq's ``mem_gc``): the
    scan runs in blocks of k steps, each under ``jax.checkpoint``; reverse mode
    keeps the state at the max_steps / k block boundaries and recomputes one block at a time,
    storing its k iterations. Memory goes as max_steps / k + k, O(sqrt(max_steps)) at
    k = ceil(sqrt(max_steps)), for one more forward pass of f. The iterations are the same
    (value, per-sample ``result``, ``steps``, early-stopped samples all as without it) and
    the gradient equals plain unrolling's up to floating-point rounding.

    Attributes:
        checkpoint: None (default, every iteration stored), ``"sqrt"`` (blocks of
            ceil(sqrt(max_steps)) steps) or an integer >= 1, the block size in steps (capped at
            the solver's ``max_steps``; a block size that does not divide ``max_steps`` leaves a
            shorter last block).
        name: ``"unrolled"``, the mode's name in :data:`BACKWARDS` (a class attribute).

    Raises:
        ValueError: ``checkpoint`` outside its range (the message names it and the valid values).

    Example:
        >>> import jax, jax.numpy as jnp, deqlab
        >>> from deqlab.backward import Unrolled
        >>> f = lambda z, w, x: jnp.tanh(w * z + x)
        >>> def loss(w, backward):
        ...     sol = deqlab.fixed_point(f, jnp.zeros(4), w, jnp.ones(4), backward=backward,
        ...                              solver=deqlab.Picard(max_steps=100))
        ...     return jnp.sum(sol.value)
        >>> plain = jax.grad(loss)(0.5, Unrolled())
        >>> blocks = jax.grad(loss)(0.5, Unrolled(checkpoint="sqrt"))  # 10 blocks of 10 steps
        >>> bool(jnp.allclose(plain, blocks, rtol=1e-5))
        True
    """

    checkpoint: int | str | None = None
    name = "unrolled"

    def __post_init__(self):
        # frozen dataclass: normalise (numpy integers become int) through object.__setattr__
        object.__setattr__(self, "checkpoint", check_checkpoint(self.checkpoint, "backward.Unrolled"))

    def solve(self, problem):
        return problem.forward(unrolled=True, checkpoint=self.checkpoint)
