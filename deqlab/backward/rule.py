"""The one custom-derivative rule of the implicit family: the modes that apply an approximation of
``(I - J_f(z*))^{-1}`` (or of its transpose) and differ only in how."""

from __future__ import annotations

import abc
import dataclasses

import jax
import jax.numpy as jnp

from deqlab import _eager
from deqlab import precision as precision_module
from deqlab.backward.base import Backward, zero_cotangent

__all__ = ["ImplicitRule"]


class ImplicitRule(Backward, abc.ABC):
    """Base class of the backward modes that share the implicit derivative's rule (003 Eq. 8 and
    11): :class:`Implicit`, :class:`SHINE`, and a mode of one's own.

    Differentiating z* = f(z*, a) gives dz* = (I - J) ^-1 (df/da) da, J = J_f(z*). The rule is
    written once, as ``jax.custom_jvp`` around the forward solve whose tangent is a
    ``lax.custom_linear_solve`` of (I - J) v = b: forward mode (``jvp``, ``jacfwd``) calls
    :meth:`tangent` for v, reverse mode (``grad``, ``vjp``) calls :meth:`adjoint`, the transposed
    solve u = (I - J^T)^-1 g of 003 Eq. 11, and their compositions (``hessian``) come with it. A
    subclass says only how it applies the two inverses:

    - :meth:`adjoint` (required): ``(I - J^T)^-1 g`` for a cotangent ``g`` shaped like z*;
    - :meth:`tangent` (optional): ``(I - J)^-1 b`` for a tangent ``b``; by default the transpose
      of :meth:`adjoint` (``jax.linear_transpose``), which exists when :meth:`adjoint` is linear
      in ``g`` and made of transposable operations: Python loops of products, not a
      ``while_loop`` (an iterative solve defines :meth:`tangent` itself, as :class:`Implicit`
      does).

    Both receive the :class:`Problem` (its ``f``, ``args`` and ``solver`` are the rule's own
    inputs, safe to use) and the forward :class:`~deqlab.solvers.Solution` (its ``value`` is z*,
    its ``state`` the solver's final state); :meth:`Problem.jacobian_at` and
    :meth:`Problem.jacobian_transpose_at` give J and J^T as functions. They must take every traced
    value from these arguments, never from a closure or from ``self``, and return a pytree
    shaped like their input (a mistake is reported naming the method). A truncated Neumann
    series, ``(I - J^T)^-1 g ~ sum_{k<K} (J^T)^k g``, is the smallest such mode (example below);
    ``Phantom(steps=K, damping=1)`` computes the same gradient by differentiating K steps from the
    detached z*.

    Attributes:
        name: the mode's short name, as for :class:`Backward`; a subclass's settings are its
            annotated class attributes (validated in ``_check_settings``).

    Raises:
        TypeError: a subclass without ``adjoint`` is instantiated, or ``adjoint`` or
            ``tangent`` returns a pytree of another structure (the message names the method).
        ValueError: ``adjoint`` or ``tangent`` returns a leaf of another shape (named likewise).

    Example:
        A mode of one's own in a few lines, under ``jit``, ``grad`` and ``jvp``: the Neumann
        series with 30 terms is close to the implicit gradient where J_f contracts (here by 0.5):

        >>> import jax, jax.numpy as jnp, deqlab
        >>> from deqlab.backward import ImplicitRule
        >>> class Neumann(ImplicitRule):
        ...     terms: int = 30
        ...     name = "neumann"
        ...     def adjoint(self, problem, solution, g):
        ...         jt = problem.jacobian_transpose_at(solution.value)
        ...         u = g
        ...         for _ in range(self.terms - 1):
        ...             u = jax.tree_util.tree_map(jnp.add, g, jt(u))
        ...         return u
        >>> f = lambda z, w: 0.5 * jnp.tanh(z) + w
        >>> def loss(w, backward):
        ...     return deqlab.fixed_point(f, jnp.zeros(3), w, backward=backward).value.sum()
        >>> w = jnp.array([0.1, 0.2, 0.3])
        >>> mine = jax.jit(jax.grad(loss), static_argnums=1)(w, Neumann())
        >>> exact = jax.grad(loss)(w, "implicit")
        >>> bool(jnp.allclose(mine, exact, rtol=1e-5))
        True
        >>> tangent = jax.jvp(lambda w: loss(w, Neumann()), (w,), (jnp.ones(3),))[1]
        >>> bool(jnp.allclose(tangent, exact.sum(), rtol=1e-5))
        True
    """

    @abc.abstractmethod
    def adjoint(self, problem, solution, g):
        """``(I - J_f(z*)^T)^{-1} g``, or this mode's approximation of it (003 Eq. 11).

        Args:
            problem: the :class:`Problem` (its inputs are the rule's own).
            solution: the forward :class:`~deqlab.solvers.Solution` (``value`` is z*).
            g: the cotangent of z*, a pytree shaped like z*.

        Returns:
            The adjoint u, a pytree shaped like ``g``.
        """

    def tangent(self, problem, solution, b):
        """``(I - J_f(z*))^{-1} b``, or this mode's approximation of it (forward mode).

        By default the transpose of :meth:`adjoint` in ``g`` (``jax.linear_transpose``).

        Args:
            problem, solution: as for :meth:`adjoint`.
            b: a tangent shaped like z* (``(df/da) a_dot``).

        Returns:
            The tangent of z*, a pytree shaped like ``b``.
        """
        def adjoint(g):
            return _checked(self, "adjoint", problem, solution, g)

        jax.eval_shape(adjoint, b)  # a mistake in adjoint is named as such, before transposing
        transposed = jax.linear_transpose(adjoint, b)
        try:
            (v,) = transposed(b)
        except (TypeError, ValueError, NotImplementedError) as err:
            err.add_note(f"deqlab: {type(self).__name__}.tangent was derived by transposing "
                         f"{type(self).__name__}.adjoint, which is possible only when adjoint is linear in g "
                         "and made of transposable operations (no while_loop); define tangent(self, "
                         "problem, solution, b) -> (I - J)^-1 b for forward mode.")
            raise
        return v

    def solve(self, problem):
        return _implicit_rule(problem, self)

    def _matmul_level(self, problem):
        """The matmul precision of the rule's own products with f (its right-hand side)."""
        return problem.level


def _checked(mode, method, problem, solution, vector):
    """``mode.<method>(problem, solution, vector)``, its mistakes named: a result not shaped like
    ``vector``, a traced value taken from a closure."""
    where = f"{type(mode).__name__}.{method}(problem, solution, {'g' if method == 'adjoint' else 'b'})"
    try:
        out = getattr(mode, method)(problem, solution, vector)
    except jax.errors.UnexpectedTracerError as err:
        err.add_note(f"deqlab: in {where}: take traced values from `problem` and `solution`, never from "
                     "a closure or from the mode's own attributes set at trace time.")
        raise
    want = jax.tree_util.tree_structure(vector)
    if out is None or jax.tree_util.tree_structure(out) != want:
        raise TypeError(f"{where} must return a pytree shaped like its input ({want}), got "
                        f"{type(out).__name__ if out is None or not hasattr(out, 'shape') else jax.tree_util.tree_structure(out)}.")
    bad = [(jnp.shape(a), jnp.shape(b)) for a, b in zip(jax.tree_util.tree_leaves(out),
                                                         jax.tree_util.tree_leaves(vector))
           if jnp.shape(a) != jnp.shape(b)]
    if bad:
        raise ValueError(f"{where} must return arrays shaped like its input, got shape {bad[0][0]} "
                         f"for shape {bad[0][1]}.")
    return jax.tree_util.tree_map(lambda a, b: jnp.asarray(a, jnp.result_type(b)), out, vector)


def _implicit_rule(problem, mode):
    """The forward solve under ``jax.custom_jvp``: its tangent solves (I - J) z_dot = (df/dargs)
    args_dot through ``lax.custom_linear_solve`` with ``mode.tangent``, given ``mode.adjoint`` as
    its ``transpose_solve``, which reverse mode runs (003 Eq. 8 and 11). One rule serves ``jvp``,
    ``jacfwd``, ``grad`` and their compositions (``hessian``)."""
    f = problem.f
    # The solver's array settings (a traced damping or tol) are inputs of the rule, never a
    # closure; its Python numbers stay Python numbers (custom_jvp would turn every input into a
    # tracer, and a Python tol chooses the matmul precision and warns where it is unreachable).
    traced_settings, static_settings = _eager._partition(problem.solver)

    @jax.custom_jvp
    def equilibrium(z0, args, init_state, budget, settings):
        solver = _eager._combine(settings, static_settings)
        return problem.forward(z0, args, init_state=init_state, budget=budget, solver=solver)

    @equilibrium.defjvp
    def equilibrium_jvp(primals, tangents):
        z0, args, init_state, budget, settings = primals
        solver = _eager._combine(settings, static_settings)
        # z0, init_state, budget and the solver's settings: the equilibrium does not depend on them
        args_dot = tangents[1]
        # the custom rule again, not the bare solve: a derivative of this rule (a hessian) is
        # implicit too
        sol = equilibrium(z0, args, init_state, budget, settings)
        # The problem as the mode sees it: the rule's own inputs, never the enclosing trace's
        # (JAX may run this rule after that trace has ended, linearising an outer jit).
        inner = dataclasses.replace(problem, z0=z0, args=args, init_state=init_state, budget=budget,
                                    solver=solver, tol=solver.tol)
        z_star = sol.value
        with precision_module.matmul_precision(mode._matmul_level(inner)):
            _, rhs = jax.jvp(lambda a: f(z_star, *a), (args,), (args_dot,))
        jacobian = inner.jacobian_at(z_star, level=mode._matmul_level(inner))

        def identity_minus_jacobian(v):
            # (I - J) v, linear in v: custom_linear_solve traces it (for its transpose) but never
            # evaluates it here, where the mode's tangent and adjoint solve
            return jax.tree_util.tree_map(jnp.subtract, v, jacobian(v))

        z_dot = jax.lax.custom_linear_solve(
            identity_minus_jacobian, rhs,
            lambda _, b: _checked(mode, "tangent", inner, sol, b),
            lambda _, g: _checked(mode, "adjoint", inner, sol, g))
        return sol, zero_cotangent(sol)._replace(value=z_dot)

    return equilibrium(problem.z0, problem.args, problem.init_state, problem.budget, traced_settings)

