"""SHINE (Ramzi et al. 2022): the adjoint from the forward Broyden solve's inverse-Jacobian estimate."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from deqlab import checks
from deqlab.backward.rule import ImplicitRule
from deqlab.solvers.flatten import Flattener

__all__ = ["SHINE"]


class SHINE(ImplicitRule):
    """SHINE (Ramzi et al. 2022): the adjoint from the forward Broyden estimate.

    The forward solve must be :class:`deqlab.solvers.Broyden` (or any solver with an
    ``inverse_jacobian_transpose(state, x)`` method, :meth:`Broyden.inverse_jacobian_transpose`,
    and for forward mode ``inverse_jacobian(state, x)``);
    its final inverse-Jacobian estimate ``B ~ (J_f - I)^{-1}`` (of g = f - z, 003 Eq. 10) is
    kept, and the adjoint of 003 Eq. 11, ``u = (I - J_f^T)^{-1} g``, is approximated by
    ``-B^T g``: no adjoint solve. ``refine`` > 0 then takes that many steps ``u <- g + J_f^T u``
    from this estimate (one vector-Jacobian product each; SHINE's "refine" variant, which uses
    the estimate as the adjoint solve's start). The estimate is only as good as Broyden's secant
    updates along the forward path: Ramzi et al. add extra "outer-problem" updates (OPA) to
    improve it in the direction of ``g``; we do not. SHINE is a mode of the shared rule
    (:class:`ImplicitRule`): forward mode (``jvp``, ``jacfwd``) applies ``-B b``, with the same
    ``refine`` steps ``v <- b + J_f v``.

    Attributes:
        refine: adjoint fixed-point steps after the estimate (>= 0).

    Raises:
        ValueError: ``refine`` negative or not an integer; at the solve, a forward solver without
            ``inverse_jacobian_transpose``.

    Example:
        Broyden's estimate alone, then refined by two adjoint steps, against the implicit
        gradient (003 Eq. 8):

        >>> import jax, jax.numpy as jnp, deqlab
        >>> f = lambda z, w, x: jnp.tanh(w * z + x)
        >>> def grad(backward, solver=deqlab.Anderson()):
        ...     loss = lambda w: deqlab.fixed_point(f, jnp.zeros(3), w, jnp.ones(3), solver=solver,
        ...                                         backward=backward).value.sum()
        ...     return jax.grad(loss)(0.5)
        >>> from deqlab.backward import SHINE, Implicit
        >>> implicit = grad(Implicit())
        >>> shine = grad(SHINE(), solver=deqlab.Broyden(m=8))
        >>> refined = grad(SHINE(refine=2), solver=deqlab.Broyden(m=8))
        >>> bool(abs(shine - implicit) < 1e-2 * abs(implicit)), bool(abs(refined - implicit) < 1e-3 * abs(implicit))
        (True, True)
    """

    refine: int = 0
    name = "shine"

    def _check_settings(self):  # run by the constructor at every level of a subclass
        checks.integer(self.refine, "refine", "backward.SHINE", minimum=0)

    def solve(self, problem):
        if not callable(getattr(problem.solver, "inverse_jacobian_transpose", None)):
            raise checks.fail("solver", "'broyden' or a deqlab.solvers.Broyden (SHINE reuses its "
                              "inverse-Jacobian estimate; any solver with an "
                              "inverse_jacobian_transpose method works)", type(problem.solver).__name__,
                              "fixed_point")
        return super().solve(problem)

    def adjoint(self, problem, solution, g):
        """``-B^T g`` from the forward solve's final estimate (its state, frozen per sample when
        the sample stopped: each sample's pairs are its estimate at its own equilibrium), then
        ``refine`` steps ``u <- g + J_f^T u``."""
        flat = Flattener(solution.value, problem.batch_axis)
        u = flat.unflatten(-problem.solver.inverse_jacobian_transpose(solution.state.history, flat.flatten(g)))
        return _refine(problem.jacobian_transpose_at(solution.value), g, u, self.refine)

    def tangent(self, problem, solution, b):
        """``-B b`` (forward mode), then ``refine`` steps ``v <- b + J_f v``."""
        if not callable(getattr(problem.solver, "inverse_jacobian", None)):
            raise checks.fail("solver", "a solver with an inverse_jacobian method for SHINE's forward mode "
                              "(jvp, jacfwd), such as deqlab.solvers.Broyden", type(problem.solver).__name__,
                              "fixed_point")
        flat = Flattener(solution.value, problem.batch_axis)
        v = flat.unflatten(-problem.solver.inverse_jacobian(solution.state.history, flat.flatten(b)))
        return _refine(problem.jacobian_at(solution.value), b, v, self.refine)


def _refine(product, rhs, x, steps):
    """``steps`` fixed-point steps ``x <- rhs + product(x)`` (of u = g + J^T u or v = b + J v)."""
    for _ in range(steps):
        x = jax.tree_util.tree_map(jnp.add, rhs, product(x))
    return x
