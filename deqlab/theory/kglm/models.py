"""kGLMs and the DEQs that compute them (004 §3, Thm. 3, Prop. 4, Cor. 5-6, App. A, C, D).

**kGLM (the declarative node).** With ``K = k(X, X)``, the MAP of the regularised kGLM is
``f*(.) = k(., X) alpha*`` with (004 Eq. 5)

    alpha* = argmin_alpha  -alpha^T K T(Y) + 1^T A(K alpha) + sum_i Q((K alpha)_i) + lam alpha^T K alpha / 2.

Its stationarity condition is ``K g(alpha) = 0`` with ``g(alpha) = A'(K alpha) + Q'(K alpha) - T(Y) +
lam alpha`` (004 App. D, first display). :func:`kglm_predict` solves ``g(alpha) = 0``, which implies
it, by damped Newton / IRLS (004 App. A.2, C.1): the step ``(D K + lam I) delta = -g`` with
``D = diag(A'' + Q'')`` is Newton's step in ``f = K alpha`` and needs no inverse of ``K``; for the
Gaussian family with ``q`` constant (kernel ridge regression) it is the closed form
``alpha* = (v K + lam I)^{-1} Y``.

**DEQ.** ``z* = A'(K alpha*)`` is a fixed point of (004 Thm. 3, Eq. 7)

    z = sigma(W1 z + W2 T(Y) + W3 rho(z)),   sigma = A',  rho = Q' o (A')^{-1},
    W1 = W3 = -K / lam,  W2 = K / lam,

and the prediction at test points ``X~`` is (004 Eq. 8) ``f*(X~) = V1 (z* + rho(z*)) + V2 T(Y)`` with
``V1 = -k(X~, X) / lam``, ``V2 = k(X~, X) / lam``. At ``X~ = X`` the prediction is the pre-activation
itself, ``K alpha* = sigma^{-1}(z*) = W1 z* + W2 T(Y) + W3 rho(z*)`` (004 §3.2, last paragraph).

Notes checked in ``tests/theory/test_kglm.py`` (Chapter 4 of the book lists them as errata):

1. Eq. 8 needs no Assumption 1. For a positive semi-definite kernel, ``K v = 0`` implies
   ``sum_i v_i psi(x_i) = 0`` and hence ``k(X~, X) v = 0``; ``lam alpha* = T - z* - rho(z*)`` up to
   such a ``v``, so Eq. 8 holds for singular ``K`` too (e.g. repeated inputs).
2. The fixed point of Eq. 7 is unique for every ``lam > 0``, not only under Assumption 2: any fixed
   point ``z`` gives ``f = K (T - z - rho(z)) / lam`` with ``z = A'(f)``, so ``f`` solves the
   stationarity condition of the strictly convex problem (5) restricted to ``range(K)``, which has one
   solution. Assumption 2 (Prop. 4) is what makes the plain iteration ``z <- H(z)`` a contraction;
   when it fails the fixed point is still unique but the plain iteration may not find it.
3. In Assumption 2 the curvature ``A''`` is evaluated at the pre-activation
   ``u = W1 z + W2 T + W3 rho(z)`` (004 App. D, proof of Prop. 4), not at the state ``z``: the
   supremum must run over the pre-activations (the whole real line by default), not over ``Z``. The
   proof also writes the Jacobian's factors in the wrong order (it is
   ``diag sigma'(u) (W1 + W3 diag rho'(z))``) and drops ``W3 rho(z)`` from ``u``; the bound is the same.
4. 004 §3.3 ("Spectral normalisation"): ``||K/lam|| < 1`` needs ``lam`` *greater* than ``||K||``,
   not less. App. C.2's condition "the induced norm of K is <= 1" is missing the ``1/(t lam)``.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import checks, failures, solvers
from deqlab.theory.kglm import families as _families
from deqlab.theory.kglm.families import Family, get_family

__all__ = [
    "KGLMFit",
    "DEQParameters",
    "DEQFit",
    "Assumption2",
    "kglm_objective",
    "kglm_predict",
    "deq_parameters",
    "deq_map",
    "deq_predict",
    "assumption2",
    "lam_for_spectral_norm",
    "SCHEMES",
    "NAIVE_INTERVAL",
    "naive_coordinates",
    "initializer",
    "as_linear_kernel",
]


class KGLMFit(NamedTuple):
    """Result of :func:`kglm_predict` (see the module docstring).

    Attributes:
        prediction: ``f*(X~) = k(X~, X) alpha*``.
        alpha: the coefficients ``alpha*``.
        steps: the Newton steps taken.
        residual: the final ``||g(alpha*)||_2``.

    Example:
        >>> import numpy as np
        >>> from deqlab.theory import kglm
        >>> from deqlab.theory.kglm import models
        >>> X = np.linspace(-1.0, 1.0, 5)[:, None]
        >>> fit = models.kglm_predict(X, np.sin(3 * X[:, 0]), None, kglm.squared_exponential(), 1.0,
        ...                           "gaussian", tol=1e-5)
        >>> fit.prediction.shape, fit.alpha.shape
        ((5,), (5,))
    """

    prediction: np.ndarray
    alpha: np.ndarray
    steps: int
    residual: float


class DEQParameters(NamedTuple):
    """The DEQ weights of 004 Thm. 3 / Cor. 6.

    Attributes:
        W1: ``-K / lam``, acting on the state.
        W2: ``K / lam``, acting on ``T(Y)``.
        W3: ``-K / lam``, acting on ``rho(z)``.
        V1: ``-k(X~, X) / lam``, or None when no test points are given.
        V2: ``k(X~, X) / lam``, or None.

    Example:
        >>> import numpy as np
        >>> from deqlab.theory.kglm import models
        >>> params = models.deq_parameters(np.eye(2), None, lam=2.0)
        >>> float(params.W1[0, 0]), params.V1
        (-0.5, None)
    """

    W1: jax.Array
    W2: jax.Array
    W3: jax.Array
    V1: jax.Array | None
    V2: jax.Array | None


class DEQFit(NamedTuple):
    """Result of :func:`deq_predict`.

    Attributes:
        prediction: the predictions at ``X_test`` (Eq. 8).
        fitted: the fitted values at ``X`` (``sigma^{-1}(z*) = K alpha*``, no ``K^{-1}``).
        z: the fixed point ``z*``.
        solution: the solver's :class:`deqlab.solvers.Solution` (its ``result`` says whether the
            solve converged).

    Example:
        >>> import numpy as np
        >>> from deqlab.theory import kglm
        >>> from deqlab.theory.kglm import models
        >>> X = np.linspace(-1.0, 1.0, 5)[:, None]
        >>> fit = models.deq_predict(X, np.sin(3 * X[:, 0]), None, kglm.squared_exponential(), 1.0,
        ...                          "gaussian", tol=1e-5)
        >>> bool(fit.solution.converged), fit.z.shape
        (True, (5,))
    """

    prediction: jax.Array
    fitted: jax.Array
    z: jax.Array
    solution: solvers.Solution


class Assumption2(NamedTuple):
    """004 Assumption 2 in the spectral norm (:func:`assumption2`).

    ``quantity = ||K/lam||_2 * curvature_bound * (1 + rho_derivative_bound)``; ``holds`` when it
    is < 1 (then Prop. 4: the iteration of Eq. 7 is a contraction).

    Attributes:
        quantity: the left side of Assumption 2.
        holds: ``quantity < 1``.
        spectral_norm: ``||K/lam||_2``.
        curvature_bound: the bound on ``A''`` used.
        rho_derivative_bound: the bound on ``rho'`` used.

    Example:
        >>> import numpy as np
        >>> from deqlab.theory.kglm import models
        >>> models.assumption2(np.eye(3), lam=2.0, family="spin").holds
        True
    """

    quantity: float
    holds: bool
    spectral_norm: float
    curvature_bound: float
    rho_derivative_bound: float


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


def _coordinates(X: Any, name: str, where: str) -> np.ndarray:
    requirement = "a 1-D or 2-D array (rows are points) of finite real numbers"
    try:
        arr = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError):
        raise checks.fail(name, requirement, X, where) from None
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] == 0 or not np.all(np.isfinite(arr)):
        raise checks.fail(name, requirement, f"array of shape {arr.shape}", where)
    return arr


def _gram(kernel: Callable, A: np.ndarray, B: np.ndarray, name: str, where: str) -> np.ndarray:
    if not callable(kernel):
        raise checks.fail("kernel", "a callable k(A, B) returning the Gram matrix", kernel, where)
    G = np.asarray(kernel(A, B), dtype=np.float64)
    if G.shape != (A.shape[0], B.shape[0]) or not np.all(np.isfinite(G)):
        raise checks.fail("kernel", f"a callable returning a finite {(A.shape[0], B.shape[0])} Gram "
                          f"matrix for {name}", f"output of shape {G.shape}", where)
    return G


def _square_gram(K: Any, name: str, where: str) -> np.ndarray:
    requirement = "a finite symmetric positive semi-definite n x n Gram matrix"
    try:
        arr = np.asarray(K, dtype=np.float64)
    except (TypeError, ValueError):
        raise checks.fail(name, requirement, K, where) from None
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] == 0 or not np.all(np.isfinite(arr)):
        raise checks.fail(name, requirement, f"array of shape {arr.shape}", where)
    scale = max(np.abs(arr).max(), 1e-300)
    # Round-off of a kernel evaluated in float64 is ~1e-16 of the largest entry; 1e-10 leaves room.
    if not np.allclose(arr, arr.T, rtol=0, atol=1e-10 * scale):
        raise checks.fail(name, requirement + " (it is not symmetric)", "a non-symmetric matrix", where)
    return 0.5 * (arr + arr.T)


def _lam(lam: Any, where: str) -> float:
    return checks.positive_number(lam, "lam", where)


def _problem(X, Y, X_test, kernel, lam, family, where):
    family = get_family(family, where)
    X = _coordinates(X, "X", where)
    Y = family.check_observations(Y, "Y", where)
    if Y.shape[0] != X.shape[0]:
        raise checks.fail("Y", f"one observation per row of X ({X.shape[0]})", f"{Y.shape[0]} observations",
                          where)
    lam = _lam(lam, where)
    K = _gram(kernel, X, X, "k(X, X)", where)
    if X_test is None:
        K_test = None
    else:
        X_test = _coordinates(X_test, "X_test", where)
        if X_test.shape[1] != X.shape[1]:
            raise checks.fail("X_test", f"points of the same dimension as X ({X.shape[1]})",
                              f"dimension {X_test.shape[1]}", where)
        K_test = _gram(kernel, X_test, X, "k(X_test, X)", where)
    return family, Y, lam, K, K_test


# --------------------------------------------------------------------------------------------
# The kGLM solved directly (004 Eq. 5, App. A.2, C.1)
# --------------------------------------------------------------------------------------------


def kglm_objective(alpha: Any, K: Any, T: Any, lam: float, family: Family) -> float:
    """The objective of 004 Eq. 5 (without the constant ``-log h(y)``), for the line search.

    Args:
        alpha: coefficients ``(n,)``.
        K: the Gram matrix ``(n, n)``.
        T: the sufficient statistics ``T(Y)``, ``(n,)``.
        lam: the regularisation ``lam > 0``.
        family: the :class:`~deqlab.theory.kglm.families.Family`.

    Returns:
        The objective, a Python float.

    Example:
        >>> import numpy as np
        >>> from deqlab.theory import kglm
        >>> from deqlab.theory.kglm import models
        >>> models.kglm_objective(np.zeros(2), np.eye(2), np.ones(2), 1.0, kglm.gaussian())
        0.0
    """
    f = K @ alpha
    value = (np.sum(np.asarray(family.log_partition(jnp.asarray(f))))
             + np.sum(np.asarray(family.prior_value(jnp.asarray(f))))
             - alpha @ (K @ T) + 0.5 * lam * alpha @ f)
    return float(value)


def _newton(K, T, lam, family, tol, max_steps, where):
    n = K.shape[0]
    alpha = np.zeros(n)
    scale = max(1.0, float(np.linalg.norm(T)))

    def g_and_d(alpha):
        f = jnp.asarray(K @ alpha)
        g = np.asarray(family.mean(f) + family.prior_gradient(f)) - T + lam * alpha
        d = np.asarray(family.curvature(f) + family.prior_curvature(f))
        return g, d

    value = kglm_objective(alpha, K, T, lam, family)
    for step in range(max_steps + 1):
        g, d = g_and_d(alpha)
        residual = float(np.linalg.norm(g))
        if not math.isfinite(residual):
            break
        if residual <= tol * scale:
            return alpha, step, residual
        if step == max_steps:
            break
        # Newton / IRLS step in f = K alpha: (D K + lam I) delta = -g; K times it is the Newton
        # step of Eq. 5 in alpha, and the matrix is invertible for singular K too (D K is similar
        # to D^1/2 K D^1/2 >= 0).
        delta = np.linalg.solve(d[:, None] * K + lam * np.eye(n), -g)
        slope = float(g @ (K @ delta))  # directional derivative of Eq. 5: <K g, delta> <= 0
        t = 1.0
        # Backtracking (Armijo); the slack of a few ulps of the objective lets the last steps,
        # whose decrease is below round-off, through.
        while True:
            trial = alpha + t * delta
            new_value = kglm_objective(trial, K, T, lam, family)
            if math.isfinite(new_value) and new_value <= value + 1e-4 * t * slope + 64 * np.finfo(float).eps * (
                    abs(value) + 1.0):
                break
            t *= 0.5
            if t < 1e-12:
                raise solvers.SolverError(f"{where}: Newton's line search failed at step {step} "
                                          f"(||g|| = {residual:.3e}).")
        alpha, value = trial, new_value
    raise solvers.SolverError(f"{where}: Newton did not converge in {max_steps} steps "
                              f"(||g|| = {residual:.3e} > tol * max(1, ||T||) = {tol * scale:.3e}).")


def kglm_predict(X: Any, Y: Any, X_test: Any, kernel: Callable, lam: float, family: Any, *,
                 tol: float = 1e-12, max_steps: int = 100) -> KGLMFit:
    """The regularised kGLM MAP of 004 Eq. 5, solved directly, and its predictions at ``X_test``.

    Args:
        X: inner coordinates, shape ``(n, d)`` (or ``(n,)`` for ``d = 1``).
        Y: observations, shape ``(n,)``, in the family's support.
        X_test: outer coordinates ``X~`` (``(m, d)``), or None to predict at ``X``.
        kernel: a callable ``k(A, B)`` returning the Gram matrix ``k(A, B)`` of shape
            ``(len(A), len(B))`` (e.g. from :mod:`deqlab.theory.kglm.kernels`).
        lam: regularisation ``lam > 0`` (004 Eq. 4-5).
        family: a :class:`~deqlab.theory.kglm.families.Family` or its name.
        tol: Newton stops when ``||g(alpha)||_2 <= tol max(1, ||T(Y)||_2)``.
        max_steps: Newton step limit.

    Returns:
        :class:`KGLMFit` with ``prediction = k(X~, X) alpha*`` (004 Thm. 7 / App. A.2).

    Raises:
        deqlab.failures.SolverError: Newton did not reach ``tol`` (never returns an unconverged ``alpha``).

    Needs ``jax_enable_x64``: the kernel and the mean map are evaluated with ``jax.numpy``, and in
    float32 Newton's residual stalls near ``1e-7 ||T||``, above the default ``tol`` (a float32 page
    switches to float64 for this call, or passes a ``tol`` float32 can reach).

    Example:
        >>> import numpy as np
        >>> from deqlab.theory import kglm
        >>> from deqlab.theory.kglm import models
        >>> X = np.linspace(-1.0, 1.0, 5)[:, None]
        >>> fit = models.kglm_predict(X, np.sin(3 * X[:, 0]), None, kglm.squared_exponential(), 1.0,
        ...                           "gaussian", tol=1e-5)  # kernel ridge regression
        >>> (fit.prediction.round(3) + 0.0).tolist()   # + 0.0: the odd fit's middle value is 0 or -0
        [-0.298, -0.219, 0.0, 0.219, 0.298]
    """
    where = "kglm_predict"
    family, Y, lam, K, K_test = _problem(X, Y, X_test, kernel, lam, family, where)
    tol = checks.positive_number(tol, "tol", where)
    max_steps = checks.positive_int(max_steps, "max_steps", where)
    T = np.asarray(family.statistic(Y), dtype=np.float64)
    if family.name == "gaussian" and not family.has_prior:
        # Kernel ridge regression: g = v K alpha - Y + lam alpha = 0 (004 §3.3).
        v = float(family.curvature_bound)
        alpha = np.linalg.solve(v * K + lam * np.eye(K.shape[0]), T)
        steps = 0
        residual = float(np.linalg.norm(v * K @ alpha - T + lam * alpha))
    else:
        alpha, steps, residual = _newton(K, T, lam, family, tol, max_steps, where)
    prediction = (K if K_test is None else K_test) @ alpha
    return KGLMFit(prediction=prediction, alpha=alpha, steps=steps, residual=residual)


# --------------------------------------------------------------------------------------------
# The DEQ of 004 Thm. 3 / Cor. 6
# --------------------------------------------------------------------------------------------


def deq_parameters(K: Any, K_test: Any, lam: float) -> DEQParameters:
    """The DEQ weights of 004 Thm. 3 (Eq. 7-8) and Cor. 5-6.

    ``W1 = W3 = -K / lam``, ``W2 = K / lam``, ``V1 = -k(X~, X) / lam``, ``V2 = k(X~, X) / lam``.

    Args:
        K: the Gram matrix ``k(X, X)``, ``(n, n)``.
        K_test: ``k(X~, X)``, ``(m, n)``, or None (then ``V1 = V2 = None``).
        lam: regularisation ``lam > 0``.

    Returns:
        :class:`DEQParameters`.

    Raises:
        ValueError: ``lam`` is not > 0, or ``K`` / ``K_test`` have the wrong shapes.

    Example:
        >>> import numpy as np
        >>> from deqlab.theory.kglm import models
        >>> params = models.deq_parameters(np.eye(2), 2 * np.ones((1, 2)), lam=2.0)
        >>> params.V2.tolist()
        [[1.0, 1.0]]
    """
    where = "deq_parameters"
    K = _square_gram(K, "K", where)
    lam = _lam(lam, where)
    W2 = jnp.asarray(K / lam)
    V1 = V2 = None
    if K_test is not None:
        try:
            Kt = np.asarray(K_test, dtype=np.float64)
        except (TypeError, ValueError):
            raise checks.fail("K_test", f"a finite m x {K.shape[0]} matrix k(X_test, X)", K_test, where) from None
        if Kt.ndim != 2 or Kt.shape[1] != K.shape[0] or not np.all(np.isfinite(Kt)):
            raise checks.fail("K_test", f"a finite m x {K.shape[0]} matrix k(X_test, X)",
                              f"array of shape {Kt.shape}", where)
        V2 = jnp.asarray(Kt / lam)
        V1 = -V2
    return DEQParameters(W1=-W2, W2=W2, W3=-W2, V1=V1, V2=V2)


def deq_map(z: jax.Array, params: DEQParameters, T: jax.Array, family: Family) -> jax.Array:
    """``H(z) = sigma(W1 z + W2 T(Y) + W3 rho(z))`` with ``sigma = A'`` (004 Eq. 7 and 16).

    Args:
        z: the state ``(n,)``.
        params: :class:`DEQParameters`.
        T: the sufficient statistics ``T(Y)``, ``(n,)``.
        family: the :class:`~deqlab.theory.kglm.families.Family`.

    Returns:
        ``H(z)``, ``(n,)``.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.theory import kglm
        >>> from deqlab.theory.kglm import models
        >>> params = models.deq_parameters(jnp.eye(2), None, lam=2.0)
        >>> models.deq_map(jnp.zeros(2), params, jnp.ones(2), kglm.gaussian()).tolist()  # K T / lam
        [0.5, 0.5]
    """
    return family.mean(_preactivation(z, params, T, family))


def _preactivation(z, params, T, family):
    u = params.W1 @ z + params.W2 @ T
    if family.has_prior:
        u = u + params.W3 @ family.rho(z)
    return u


@functools.lru_cache(maxsize=64)
def _compiled_solve(family: Family, solver: Any, tol: float, max_steps: int) -> Callable:
    """``deqlab.solvers.solve`` of Eq. 7 under ``jit``, one per family and solver settings: an eager
    ``lax.while_loop`` is compiled anew at every call (about a second), a jitted one once per shape."""
    def H(z, params, T):
        return deq_map(z, params, T, family)

    config = solvers.get_solver(solver, tol=tol, max_steps=max_steps)
    return jax.jit(lambda z0, params, T: solvers.solve(H, z0, params, T, solver=config, on_failure="ignore"))


def _builtin_code(family: Family) -> tuple[int, float] | None:
    """``(branch, parameter)`` of :func:`_builtin_mean` when ``family`` is one of the cached built-in
    families without a prior (checked by identity, so a hand-made ``Family`` is never mistaken for
    one), else None."""
    if family.has_prior:
        return None
    # the factories are cached per call signature: gaussian() and gaussian(1.0) are two objects
    v = family.curvature_bound
    if family.name == "gaussian" and any(family is f for f in (
            _families.gaussian(), _families.gaussian(v), _families.gaussian(variance=v))):
        return 0, float(v)
    r = family.mean_range[1]
    if (family.name == "bernoulli" or family.name.startswith("binomial(")) and math.isfinite(r) and any(
            family is f for f in (_families.bernoulli(), _families.binomial(int(r)),
                                  _families.binomial(trials=int(r)))):
        return 1, float(r)
    if family is _families.poisson():
        return 2, 0.0
    if family is _families.spin() or family is _families.real_spin():
        return 3, 0.0
    return None


def _builtin_mean(u, branch, parameter):
    """The mean maps of the built-in families, selected by a traced ``branch`` (the same operations
    as :mod:`~deqlab.theory.kglm.families`)."""
    return jax.lax.switch(branch, (lambda u: parameter * u,                   # gaussian(v): v eta
                                   lambda u: parameter * jax.nn.sigmoid(u),   # binomial(r): r sigmoid
                                   jnp.exp,                                   # poisson
                                   jnp.tanh), u)                              # spin


@functools.lru_cache(maxsize=16)
def _compiled_builtin_solve(solver: Any, tol: float, max_steps: int) -> Callable:
    """One compiled solve of Eq. 7 for all built-in families (``rho = 0``): the family is a traced
    branch index, so a page that solves the DEQ of five families compiles once per shape, not five
    times (each compilation of the solver loop takes about a second on a CPU)."""
    def H(z, params, T, branch, parameter):
        return _builtin_mean(params.W1 @ z + params.W2 @ T, branch, parameter)

    return jax.jit(lambda z0, params, T, branch, parameter: solvers.solve(
        H, z0, params, T, branch, parameter, solver=solvers.get_solver(solver, tol=tol, max_steps=max_steps),
        on_failure="ignore"))


def deq_predict(X: Any, Y: Any, X_test: Any, kernel: Callable, lam: float, family: Any, *,
                solver: Any = "anderson", z0: Any = None, tol: float = 1e-12, max_steps: int = 500,
                on_failure: str = "raise") -> DEQFit:
    """The kGLM predictions of :func:`kglm_predict` computed as a DEQ (004 Thm. 3, Eq. 7-8).

    Solves ``z* = sigma(W1 z* + W2 T(Y) + W3 rho(z*))`` with :func:`deqlab.solvers.solve` and returns
    ``f*(X~) = V1 (z* + rho(z*)) + V2 T(Y)`` (Eq. 8); with ``X_test=None`` the prediction at ``X`` is
    the pre-activation ``W1 z* + W2 T + W3 rho(z*) = K alpha*`` (004 §3.2), which never uses ``K^{-1}``.

    Args:
        X, Y, X_test, kernel, lam, family: as for :func:`kglm_predict`.
        solver: a :func:`deqlab.solvers.solve` solver. Anderson (the default) converges also where
            Assumption 2 fails and plain Picard iteration does not (see :func:`assumption2`).
        z0: initial state; default ``A'(0)`` (the state of ``alpha = 0``).
        tol: relative-residual tolerance of the solve (1e-12: predictions to ~1e-10 of their size).
        max_steps: iteration limit.
        on_failure: what a failed solve does, as for :func:`deqlab.solvers.solve` (:mod:`deqlab.failures`):
            ``"raise"`` (default here: a prediction from a solve that failed is not the kGLM's)
            :class:`deqlab.failures.SolverError`; ``"warn"``; ``"nan"`` (NaN predictions);
            ``"ignore"``: the returned :attr:`DEQFit.solution` carries the failure in ``result``;
            ``"callback"`` (a warning from inside a compiled program).

    Returns:
        :class:`DEQFit`.

    Raises:
        ValueError: an argument is out of range or of the wrong shape, or ``Y`` is outside the
            family's support.
        deqlab.failures.SolverError: with ``on_failure="raise"``, the solve did not converge.

    Example:
        >>> import numpy as np
        >>> from deqlab.theory import kglm
        >>> from deqlab.theory.kglm import models
        >>> X = np.linspace(-1.0, 1.0, 5)[:, None]
        >>> Y, kernel = np.sin(3 * X[:, 0]), kglm.squared_exponential()
        >>> deq = models.deq_predict(X, Y, None, kernel, 1.0, "gaussian", tol=1e-5)
        >>> direct = models.kglm_predict(X, Y, None, kernel, 1.0, "gaussian", tol=1e-5)
        >>> bool(np.allclose(deq.prediction, direct.prediction, atol=1e-4))  # 004 Thm. 3
        True
    """
    where = "deq_predict"
    family, Y, lam, K, K_test = _problem(X, Y, X_test, kernel, lam, family, where)
    failures.check_policy(on_failure, where)
    params = deq_parameters(K, K_test, lam)
    T = jnp.asarray(family.statistic(Y))
    n = K.shape[0]
    if z0 is None:
        z0 = family.mean(jnp.zeros(n))
    else:
        z0 = np.asarray(z0, dtype=np.float64)
        lo, hi = family.mean_range
        if z0.shape != (n,) or not np.all((z0 > lo) & (z0 < hi)):
            raise checks.fail("z0", f"a vector of {n} numbers in the mean range ({lo:g}, {hi:g}) of "
                              f"{family.name!r}", z0, where)
        z0 = jnp.asarray(z0)

    tol = checks.positive_number(tol, "tol", where)
    max_steps = checks.positive_int(max_steps, "max_steps", where)
    solvers.get_solver(solver)  # a bad solver fails here with its ValueError, before the cache
    code = _builtin_code(family)
    if code is None:
        solution = _compiled_solve(family, solver, tol, max_steps)(z0, params, T)
    else:
        solution = _compiled_builtin_solve(solver, tol, max_steps)(z0, params, T, jnp.int32(code[0]),
                                                                   jnp.asarray(code[1], dtype=z0.dtype))
    failures.signal(f"{where} ({family.name}, lam={lam:g})", "", on_failure, solution.result,
                    solution.stats.best_residual)
    if on_failure == "nan":
        solution = solution._replace(value=failures.nan_where_failed(solution.value, solution.result, None))
    z = solution.value
    fitted = _preactivation(z, params, T, family)
    if K_test is None:
        prediction = fitted
    else:
        prediction = params.V1 @ (z + family.rho(z)) + params.V2 @ T
    return DEQFit(prediction=prediction, fitted=fitted, z=z, solution=solution)


# --------------------------------------------------------------------------------------------
# Assumption 2 / Proposition 4
# --------------------------------------------------------------------------------------------


def assumption2(K: Any, lam: float, family: Any, *, curvature_bound: float | None = None,
                rho_derivative_bound: float | None = None) -> Assumption2:
    """004 Assumption 2 in the spectral norm (the norm 004 §3.2 uses in its experiments).

    ``||K/lam||_2 sup_u A''(u) sup_z ||I + diag rho'(z)||_2 < 1`` makes the map ``H`` of Eq. 7 a
    contraction (Prop. 4, proof in App. D), so plain iteration converges from any start.

    Args:
        K: Gram matrix ``k(X, X)``.
        lam: regularisation ``lam > 0``.
        family: :class:`~deqlab.theory.kglm.families.Family` or name.
        curvature_bound: ``sup A''`` over the pre-activations ``u`` that can occur; default the
            family's bound over the whole line (1 Gaussian(v=1), 1/4 Bernoulli, r/4 Binomial,
            ``inf`` Poisson, 1 spin). Pass a tighter one, e.g. ``e^{u_max}`` for Poisson when
            ``|u| <= u_max`` is known.
        rho_derivative_bound: ``sup_z rho'(z) >= 0`` (``rho`` is non-decreasing); required when
            the family has a prior ``Q``, 0 otherwise.

    Returns:
        :class:`Assumption2`; ``holds`` is True when the quantity is < 1. When it is False nothing
        is guaranteed about plain iteration; the fixed point is still unique (module note 2).

    Raises:
        ValueError: ``lam`` is not > 0, ``family`` is unknown, a bound is negative, or
            ``rho_derivative_bound`` is missing for a family with a prior.

    Example:
        >>> import numpy as np
        >>> from deqlab.theory.kglm import models
        >>> check = models.assumption2(2 * np.eye(3), lam=1.0, family="bernoulli")  # 2 * 1/4
        >>> check.quantity, check.holds
        (0.5, True)
    """
    where = "assumption2"
    family = get_family(family, where)
    K = _square_gram(K, "K", where)
    lam = _lam(lam, where)
    if curvature_bound is None:
        curvature_bound = float(family.curvature_bound)
    else:
        curvature_bound = checks.number(curvature_bound, "curvature_bound", where, lower=0.0)
    if rho_derivative_bound is None:
        if family.has_prior:
            raise checks.fail("rho_derivative_bound", "a number >= 0 bounding rho' (the family has a prior Q)",
                              None, where)
        rho_derivative_bound = 0.0
    else:
        rho_derivative_bound = checks.number(rho_derivative_bound, "rho_derivative_bound", where, lower=0.0)
    norm = float(np.linalg.norm(K, 2)) / lam
    quantity = norm * curvature_bound * (1.0 + rho_derivative_bound) if norm > 0 else 0.0
    return Assumption2(quantity=quantity, holds=bool(quantity < 1.0), spectral_norm=norm,
                       curvature_bound=curvature_bound, rho_derivative_bound=rho_derivative_bound)


def lam_for_spectral_norm(K: Any, C: float) -> float:
    """``lam = ||K||_2 / C``, so that ``||W1||_2 = ||K / lam||_2 = C`` (004 §4, image denoising).

    Args:
        K: the Gram matrix.
        C: the target spectral norm of ``W1``, > 0.

    Returns:
        ``lam``, a Python float.

    Raises:
        ValueError: ``C`` is not > 0 or ``K`` is zero.

    Example:
        >>> import numpy as np
        >>> from deqlab.theory.kglm import models
        >>> models.lam_for_spectral_norm(2 * np.eye(3), C=0.5)
        4.0
    """
    K = _square_gram(K, "K", "lam_for_spectral_norm")
    C = checks.positive_number(C, "C", "lam_for_spectral_norm")
    norm = float(np.linalg.norm(K, 2))
    if norm == 0.0:
        raise checks.fail("K", "a non-zero Gram matrix", "the zero matrix", "lam_for_spectral_norm")
    return norm / C


# --------------------------------------------------------------------------------------------
# Initialisation of DEQ layers (004 §3.3 "Initialisation via optimisation warm-start", §4)
# --------------------------------------------------------------------------------------------

SCHEMES: tuple[str, ...] = ("naive", "informed")
"""kGLM initialisation schemes of 004 §4."""

NAIVE_INTERVAL: tuple[float, float] = (-2 * math.pi, 2 * math.pi)
"""Interval of the naive scheme's uniform coordinate grid (004 §4, sequence-to-sequence task)."""


def naive_coordinates(n: int, interval: tuple[float, float] = NAIVE_INTERVAL) -> np.ndarray:
    """The naive scheme's coordinates: ``n`` points on a uniform grid over ``interval``.

    004 §4: "choose X to be a uniform grid over [-2 pi, 2 pi]", used with the squared exponential
    kernel ``exp(-|x - x'|^2 / 2)``.

    Args:
        n: the number of points, an integer >= 1.
        interval: ``(lo, hi)``, finite with ``lo < hi``.

    Returns:
        A float64 array ``(n, 1)``.

    Raises:
        ValueError: ``n < 1`` or ``interval`` is not a finite increasing pair.

    Example:
        >>> from deqlab.theory.kglm import models
        >>> models.naive_coordinates(3).ravel().round(4).tolist()
        [-6.2832, 0.0, 6.2832]
    """
    n = checks.positive_int(n, "n", "naive_coordinates")
    try:
        lo, hi = (float(v) for v in interval)
    except (TypeError, ValueError):
        raise checks.fail("interval", "a pair (low, high) with low < high", interval, "naive_coordinates") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise checks.fail("interval", "a pair (low, high) of finite numbers with low < high", interval,
                          "naive_coordinates")
    return np.linspace(lo, hi, n)[:, None]


def initializer(scheme: str, K: Any, lam: float, K_test: Any = None) -> DEQParameters:
    """Initial weights of a DEQ layer ``z = sigma(W1 z + W2 Y)`` that make it solve a kGLM (004 Thm. 3).

    The two schemes of 004 §3.3 and §4 differ in what the Gram matrix is built from and in which
    weights they set:

    - ``"naive"``: a "reasonable" default kernel and coordinates for any task (004 §4: the squared
      exponential ``exp(-|x - x'|^2 / 2)`` on :func:`naive_coordinates`); only the hidden weights
      ``W1 = W3 = -K/lam``, ``W2 = K/lam`` are set, ``V1``, ``V2`` are None and keep the layer's
      random initialisation (004 §4: "initialise V1 and V2 according to the same rule as random
      initialisation").
    - ``"informed"``: the task's kernel and coordinates (004 §4: ``k_true`` and the true ``X``,
      ``X~``); all of ``W1, W2, W3`` and, given ``K_test = k(X~, X)``, ``V1, V2`` are set, so that
      the untrained DEQ already outputs the kGLM's predictions (Cor. 6).

    Choose ``lam`` with :func:`lam_for_spectral_norm` to fix ``||W1||_2`` (004 §4).

    Returns:
        :class:`DEQParameters` in the convention ``W z`` (columns act on the state); a Flax
        ``nnx.Linear`` computes ``z @ kernel``, so its kernel is ``W.T`` (:func:`as_linear_kernel`).

    Args:
        scheme: ``"naive"`` or ``"informed"``.
        K: the Gram matrix ``k(X, X)``.
        lam: the regularisation ``lam > 0``.
        K_test: ``k(X~, X)`` (``"informed"`` only); None: ``V1 = V2 = None``.

    Raises:
        ValueError: ``scheme`` is unknown, ``lam <= 0``, or ``K_test`` is given to ``"naive"``.

    Example:
        >>> import numpy as np
        >>> from deqlab.theory.kglm import models
        >>> params = models.initializer("naive", np.eye(3), lam=4.0)
        >>> float(params.W2[0, 0]), params.V1  # K / lam
        (0.25, None)
    """
    where = "initializer"
    scheme = checks.choice(scheme, "scheme", SCHEMES, where)
    if scheme == "naive":
        if K_test is not None:
            raise checks.fail("K_test", "None for the 'naive' scheme (V1, V2 keep their random "
                              "initialisation, 004 §4)", "a matrix", where)
        return deq_parameters(K, None, lam)
    return deq_parameters(K, K_test, lam)


def as_linear_kernel(W: Any, dtype: Any = jnp.float32) -> jax.Array:
    """``W.T`` in ``dtype``: the ``kernel`` of an ``nnx.Linear`` (``z @ kernel``) computing ``W z``.

    Args:
        W: a matrix acting on column vectors.
        dtype: the dtype of the result.

    Returns:
        ``W.T`` as a JAX array.

    Raises:
        ValueError: ``W`` is not 2-D or ``dtype`` is not floating.

    Example:
        >>> import numpy as np
        >>> from deqlab.theory.kglm import models
        >>> models.as_linear_kernel(np.array([[1.0, 2.0], [3.0, 4.0]])).tolist()
        [[1.0, 3.0], [2.0, 4.0]]
    """
    if W is None:
        raise checks.fail("W", "a 2-D weight matrix", W, "as_linear_kernel")
    dtype = checks.floating_dtype(dtype, "dtype", "as_linear_kernel")
    W = jnp.asarray(W)
    if W.ndim != 2:
        raise checks.fail("W", "a 2-D weight matrix", f"array of shape {W.shape}", "as_linear_kernel")
    return W.T.astype(dtype)
