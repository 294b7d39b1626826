"""Phantom gradients (Geng et al. 2021) and Jacobian-free backpropagation (Fung et al. 2022):
a few differentiable steps from the detached fixed point."""

from __future__ import annotations

import jax

from deqlab import checks
from deqlab import precision as precision_module
from deqlab.backward.base import Backward

__all__ = ["Phantom", "JacobianFree"]


class Phantom(Backward):
    """Phantom gradient (Geng et al. 2021): ``steps`` damped steps from z*, differentiated.

    Attributes:
        steps: number of steps k (>= 1).
        damping: step fraction in (0, 1].

    Raises:
        ValueError: a setting outside its range (the message names it and the valid range).

    Example:
        An approximation of the implicit gradient (003 Eq. 8), within a few percent here:

        >>> import jax, jax.numpy as jnp, deqlab
        >>> f = lambda z, w, x: jnp.tanh(w * z + x)
        >>> def grad(backward, solver=deqlab.Anderson()):
        ...     loss = lambda w: deqlab.fixed_point(f, jnp.zeros(3), w, jnp.ones(3), solver=solver,
        ...                                         backward=backward).value.sum()
        ...     return jax.grad(loss)(0.5)
        >>> from deqlab.backward import Implicit, Phantom
        >>> phantom, implicit = grad(Phantom(steps=5, damping=0.5)), grad(Implicit())
        >>> bool(abs(phantom - implicit) < 0.1 * abs(implicit))
        True
    """

    steps: int = 5
    damping: float = 0.5
    name = "phantom"

    def _check_settings(self):  # run by the constructor at every level of a subclass
        checks.positive_int(self.steps, "steps", "backward.Phantom")
        checks.unit_interval(self.damping, "damping", "backward.Phantom", allow_traced=True)

    def solve(self, problem):
        sol = problem.forward(jax.lax.stop_gradient(problem.z0), jax.lax.stop_gradient(problem.args),
                              init_state=jax.lax.stop_gradient(problem.init_state))
        z = jax.lax.stop_gradient(sol.value)
        d = self.damping
        with precision_module.matmul_precision(problem.level):
            for _ in range(self.steps):
                z = jax.tree_util.tree_map(lambda a, b: (1 - d) * a + d * b, z, problem.f(z, *problem.args))
        return sol._replace(value=z)


class JacobianFree(Phantom):
    """Jacobian-free backpropagation (Fung et al. 2022): ``dL/da ~ g^T df/da (z*, a)``.

    The phantom gradient with one undamped step (``steps=1``, ``damping=1``, fixed): the inverse
    ``(I - J_f^T)^{-1}`` of the implicit gradient (003 Eq. 11) is replaced by the identity. Its
    error against the implicit gradient is of the order of ``||J_f||`` (the first Neumann term
    dropped); Fung et al. show it is still a descent direction when f is a contraction.

    Attributes:
        steps: 1, fixed (inherited from :class:`Phantom`).
        damping: 1.0, fixed.

    Raises:
        ValueError: ``steps`` or ``damping`` given another value (use :class:`Phantom`).

    Example:
        Cruder than :class:`Phantom` (about 10% off the implicit gradient here, where
        ``||J_f(z*)||`` is about 0.1), but one vector-Jacobian product:

        >>> import jax, jax.numpy as jnp, deqlab
        >>> f = lambda z, w, x: jnp.tanh(w * z + x)
        >>> def grad(backward, solver=deqlab.Anderson()):
        ...     loss = lambda w: deqlab.fixed_point(f, jnp.zeros(3), w, jnp.ones(3), solver=solver,
        ...                                         backward=backward).value.sum()
        ...     return jax.grad(loss)(0.5)
        >>> from deqlab.backward import Implicit, JacobianFree
        >>> jfb, implicit = grad(JacobianFree()), grad(Implicit())
        >>> bool(abs(jfb - implicit) < 0.2 * abs(implicit))
        True
    """

    steps: int = 1
    damping: float = 1.0
    name = "jacobian_free"

    def _check_settings(self):
        if self.steps != 1 or self.damping != 1.0:
            raise ValueError("backward.JacobianFree: `steps` and `damping` are fixed at 1 (use "
                             f"deqlab.backward.Phantom for other values), got steps={self.steps!r}, "
                             f"damping={self.damping!r}.")

