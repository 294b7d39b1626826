"""Differentiable fixed points: implicit, unrolled and phantom backward passes.

The implicit function theorem gives the gradient of a loss through an equilibrium z* = f(z*, a)
without storing the forward iterations (003 Theorem 1, Eq. 8): with g = dL/dz*,

.. math:: \\frac{dL}{da} = u^\\top \\frac{\\partial f}{\\partial a}(z^*, a),
          \\qquad u = g + J_f(z^*)^\\top u ,

the adjoint fixed point u being the solution of the linear system of 003 Eq. 11 written for f
instead of g_theta = f - z. We solve it matrix-free, with vector-Jacobian products only: either by
the same fixed-point solvers as the forward pass or by GMRES (Saad & Schultz 1986). No Jacobian is
ever formed.

Backward modes of :func:`fixed_point` are objects, like the forward solvers (the strings
``"implicit"``, ``"unrolled"``, ``"phantom"`` are shortcuts for their defaults). Each is a
subclass of :class:`Backward` that defines ``solve(problem)``, and so can be a mode of your own;
the modes that approximate the implicit derivative's linear solves (:class:`Implicit`,
:class:`SHINE`, a truncated Neumann series of one's own) share one custom-derivative rule,
:class:`ImplicitRule`, and define only how they apply ``(I - J^T)^-1`` (and ``(I - J)^-1``);
the adjoint linear solver is an object too (:class:`GMRES`, a :class:`LinearSolver`; the string
``"gmres"`` is its alias). All are pytrees, their ``float`` settings leaves and the others static,
as solvers are:

- :class:`Implicit` ``(solver, tol, max_steps)``: the above (003 Theorem 1), through
  ``jax.custom_jvp``: the tangent solve (I - J) z_dot = (df/dargs) args_dot is a
  ``lax.custom_linear_solve`` given the adjoint solve as its transpose, so one rule serves reverse
  mode (``grad``) and forward mode (``jvp``, ``jacfwd``, ``hessian``). Memory does not depend on
  the number of forward iterations.
- :class:`Unrolled` ``(checkpoint)``: reverse-mode differentiation through ``max_steps`` forward
  iterations (``lax.scan``; memory grows linearly with ``max_steps``, or as sqrt(max_steps) with
  ``checkpoint="sqrt"``, which recomputes blocks of iterations in the backward pass). The
  reference the others are checked against.
- :class:`Phantom` ``(steps, damping)``: solve without gradient, then take ``steps``
  damped steps z <- (1 - d) z + d f(z, a) from z* with gradient (Geng et al. 2021), an inexpensive
  approximation.
- :class:`JacobianFree` ``()``: one undamped step ``f(z*, a)`` from the detached z*, i.e.
  the implicit gradient with ``(I - J^T)^{-1}`` replaced by the identity (Fung et al. 2022,
  "JFB: Jacobian-free backpropagation for implicit networks"); the phantom gradient with no
  Neumann terms. One vector-Jacobian product; Fung et al. prove it a descent direction when f is
  a contraction.
- :class:`SHINE` ``(refine)``: the adjoint solve replaced by the forward Broyden
  solve's own inverse-Jacobian estimate, ``u = -B^T g`` with ``B ~ (J_f - I)^{-1}`` (Ramzi et al.
  2022, "SHINE: SHaring the INverse Estimate from the forward pass for bi-level optimization and
  implicit models"), optionally followed by ``refine`` fixed-point steps of the adjoint
  iteration from there (their "refine" variant). Needs ``solver="broyden"``.

``fixed_point(..., on_failure=...)`` is one policy for both solves behind a gradient, the same
argument as :func:`deqlab.solvers.solve`'s and :class:`deqlab.nn.DEQ`'s (:mod:`deqlab.failures`):
a sample whose forward solve failed (its value, hence its gradient, is not the equilibrium's) and
a sample whose adjoint solve failed (its gradient is inexact). ``"warn"`` (default) issues a
:class:`BackwardWarning` for a forward solve called eagerly; inside ``jit`` or a gradient it adds
nothing to the program, and ``Solution.result`` records the forward solve only. **The adjoint
solve always runs inside a gradient's program**, so with ``"warn"`` its failures are reported
nowhere: train with ``"callback"`` (a warning from inside the program) or ``"nan"`` (a failed
adjoint makes the gradient NaN) where they matter, or watch the adjoint with
:func:`check_gradients` / :func:`adjoint_solve`. ``"nan"`` makes the failed samples' values NaN
with no gradient through them (a loss on the value masked by ``converged`` trains on the others);
``"raise"`` raises :class:`~deqlab.failures.SolverError` (from a host callback under ``jit``);
``"ignore"`` leaves the per-sample ``Solution.result`` of the forward solve as the only record (a
failed adjoint solve is recorded nowhere with it, though never replaced by a silent zero);
``"callback"`` warns from a host callback inside compiled programs.
"""

# Failures are reported rather than returned as a zero adjoint, which jaxopt's backward linear
# solve does when it fails (google/jaxopt issue 466).
#
# The package is one module per idea: base.py (Problem, Backward, failure reports), rule.py (the implicit family's shared rule), linear.py
# (adjoint linear solvers), adjoint.py (adjoint_solve), one module per backward mode (implicit.py,
# unrolled.py, phantom.py, shine.py), registry.py (modes by name), api.py (fixed_point) and
# check.py (check_gradients).

from deqlab.backward import linear as _linear
from deqlab.backward import registry as _registry
from deqlab.backward.adjoint import adjoint_solve
from deqlab.backward.api import fixed_point
from deqlab.backward.base import Backward, BackwardWarning, Problem, zero_cotangent
from deqlab.backward.check import check_gradients
from deqlab.backward.implicit import Implicit
from deqlab.backward.linear import GMRES, LinearSolver, get_adjoint_solver
from deqlab.backward.phantom import JacobianFree, Phantom
from deqlab.backward.registry import get_backward
from deqlab.backward.rule import ImplicitRule
from deqlab.backward.shine import SHINE
from deqlab.backward.unrolled import Unrolled
from deqlab.failures import FAILURE_POLICIES

#: The backward modes by name: ``"implicit"``, ``"unrolled"``, ``"phantom"``, ``"jacobian_free"``,
#: ``"shine"`` (each name is a shortcut for the mode with its defaults).
#:
#: :meta hide-value:
BACKWARDS = _registry.BACKWARDS
#: Adjoint linear solvers by name: ``"gmres"`` (a shortcut for ``GMRES()``).
LINEAR_SOLVERS = _linear.LINEAR_SOLVERS

__all__ = [
    "fixed_point",
    "adjoint_solve",
    "check_gradients",
    "Backward",
    "Problem",
    "LinearSolver",
    "GMRES",
    "LINEAR_SOLVERS",
    "get_adjoint_solver",
    "ImplicitRule",
    "Implicit",
    "Unrolled",
    "Phantom",
    "JacobianFree",
    "SHINE",
    "get_backward",
    "BACKWARDS",
    "FAILURE_POLICIES",
    "BackwardWarning",
    "zero_cotangent",
]
