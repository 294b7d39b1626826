"""Backpropagation through the forward iterations: the reference gradient."""

from __future__ import annotations

from deqlab.backward.base import Backward

__all__ = ["Unrolled"]


class Unrolled(Backward):
    """Backpropagation through ``max_steps`` forward iterations (``lax.scan``).

    The forward solve runs exactly the solver's ``max_steps`` iterations (samples that stopped
    are masked), and reverse-mode autodiff goes through all of them: memory grows linearly with
    ``max_steps``. No settings: the gradient is the reference the other modes are checked
    against (:func:`check_gradients`).

    Example:
        >>> deqlab.fixed_point(f, z0, w, x, solver=deqlab.Anderson(max_steps=50), backward=Unrolled())
    """

    name = "unrolled"

    def solve(self, problem):
        return problem.forward(unrolled=True)

