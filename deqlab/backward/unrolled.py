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

    Attributes:
        name: ``"unrolled"``, the mode's name in :data:`BACKWARDS` (a class attribute: the mode
            has no settings).

    Example:
        Through 50 iterations, the gradient is the implicit one (003 Eq. 8) to about the
        forward tolerance:

        >>> import jax, jax.numpy as jnp, deqlab
        >>> f = lambda z, w, x: jnp.tanh(w * z + x)
        >>> def grad(backward, solver=deqlab.Anderson()):
        ...     loss = lambda w: deqlab.fixed_point(f, jnp.zeros(3), w, jnp.ones(3), solver=solver,
        ...                                         backward=backward).value.sum()
        ...     return jax.grad(loss)(0.5)
        >>> from deqlab.backward import Implicit, Unrolled
        >>> unrolled = grad(Unrolled(), solver=deqlab.Anderson(max_steps=50))
        >>> bool(jnp.allclose(unrolled, grad(Implicit()), rtol=1e-2))
        True
    """

    name = "unrolled"

    def solve(self, problem):
        return problem.forward(unrolled=True)

