"""Backpropagation through the forward iterations: the reference gradient."""

from __future__ import annotations

from deqlab.backward.base import Backward

__all__ = ["Unrolled"]


class Unrolled(Backward):
    """Backpropagation through ``max_steps`` forward iterations (``lax.scan``).

    Args:
    """

    name = "unrolled"

    def solve(self, problem):
        return problem.forward(unrolled=True)

