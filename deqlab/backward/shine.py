"""SHINE (Ramzi et al. 2022): the adjoint from the forward Broyden solve's inverse-Jacobian estimate."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from deqlab import checks
from deqlab import precision as precision_module
from deqlab.backward.base import Backward, zero_cotangent
from deqlab.solvers.flatten import Flattener

__all__ = ["SHINE"]


class SHINE(Backward):
    """SHINE (Ramzi et al. 2022): the adjoint from the forward Broyden estimate.

    The forward solve must be :class:`deqlab.solvers.Broyden` (or any solver with an
    ``inverse_jacobian_transpose(state, x)`` method, :meth:`Broyden.inverse_jacobian_transpose`);
    its final inverse-Jacobian estimate ``B ~ (J_f - I)^{-1}`` (of g = f - z, 003 Eq. 10) is
    kept, and the adjoint of 003 Eq. 11, ``u = (I - J_f^T)^{-1} g``, is approximated by
    ``-B^T g``: no adjoint solve. ``refine`` > 0 then takes that many steps ``u <- g + J_f^T u``
    from this estimate (one vector-Jacobian product each; SHINE's "refine" variant, which uses
    the estimate as the adjoint solve's start). The estimate is only as good as Broyden's secant
    updates along the forward path: Ramzi et al. add extra "outer-problem" updates (OPA) to
    improve it in the direction of ``g``; we do not.

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

    def __post_init__(self):
        checks.integer(self.refine, "refine", "backward.SHINE", minimum=0)

    def solve(self, problem):
        if not callable(getattr(problem.solver, "inverse_jacobian_transpose", None)):
            raise checks.fail("solver", "'broyden' or a deqlab.solvers.Broyden (SHINE reuses its "
                              "inverse-Jacobian estimate; any solver with an "
                              "inverse_jacobian_transpose method works)", type(problem.solver).__name__,
                              "fixed_point")
        return _shine(problem, self)



def _shine(problem, mode):
    """The forward Broyden solve under ``jax.custom_vjp``; the backward pass applies ``-B^T`` of its
    final inverse-Jacobian estimate (:meth:`deqlab.solvers.Broyden.inverse_jacobian_transpose`) to
    the cotangent, then ``mode.refine`` adjoint steps."""
    config = problem.solver
    f = problem.f

    @jax.custom_vjp
    def equilibrium(z0, args, init_state, budget):
        return problem.forward(z0, args, init_state=init_state, budget=budget)

    def equilibrium_fwd(z0, args, init_state, budget):
        sol = problem.forward(z0, args, init_state=init_state, budget=budget)
        # The solver's state is frozen per sample when it stops (Solver.freeze_state): each
        # sample's pairs are its estimate at its own equilibrium.
        return sol, (sol.value, z0, args, init_state, budget, sol.state.history)

    def equilibrium_bwd(residuals, cotangent):
        z_star, z0, args, init_state, budget, history = residuals
        flattener = Flattener(z_star, problem.batch_axis)
        g_flat = flattener.flatten(cotangent.value)
        u = flattener.unflatten(-config.inverse_jacobian_transpose(history, g_flat))
        with precision_module.matmul_precision(problem.level):
            _, vjp_z = jax.vjp(lambda z: f(z, *args), z_star)
            for _ in range(mode.refine):
                u = jax.tree_util.tree_map(jnp.add, cotangent.value, vjp_z(u)[0])
            _, vjp_args = jax.vjp(lambda a: f(z_star, *a), args)
        (args_bar,) = vjp_args(u)
        return jax.tree_util.tree_map(jnp.zeros_like, z0), args_bar, zero_cotangent(init_state), zero_cotangent(budget)

    equilibrium.defvjp(equilibrium_fwd, equilibrium_bwd)
    return equilibrium(problem.z0, problem.args, problem.init_state, problem.budget)


