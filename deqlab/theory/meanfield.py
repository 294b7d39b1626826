"""Mean-field theory of nonlinear deep equilibrium models (001 §3, App. B.1, App. C.1).

**The model (001 Eq. 21-23).** The nonlinear DEQ of 001 is ``z* = phi(W z*) + x`` (Eq. 21): the
input ``x`` is added *after* the nonlinearity. The pre-activation ``h* = W z*`` then obeys
``h* = W (phi(h*) + x)`` (Eq. 22), the limit of the iteration ``h_{t+1} = W phi(h_t) + W x``
(Eq. 23); equivalently ``z*`` is the limit of ``z_{t+1} = phi(W z_t) + x`` and ``h* = W z*``.
So ``x`` is not the pre-activation's input injection ``h = W z + x`` of other DEQ papers: it
enters ``h*`` only through ``W x``, and ``z* = phi(h*) + x``.

**The input.** As in 001 Eq. 25-26, the input enters through two empirical averages over its
``N`` entries: ``sigma_x2 = (1/N) x . x`` (the mean *square*, not the variance: for i.i.d.
entries of mean ``mu`` and variance ``s^2`` it is ``s^2 + mu^2``) and ``mean_x = (1/N) 1^T x``.
By Cauchy-Schwarz ``mean_x^2 <= sigma_x2``, which the functions check.

**Convention for V.** ``W = sqrt(V) W0`` with ``W0`` from :mod:`deqlab.ensembles`
(``sample(ensemble, key, n, sqrt(V))``), so ``V = E tr[W W^T]`` with the normalised trace
(001 Thm. 3.1): Ginibre entries of variance ``V/N``, ``sqrt(V)`` times a Haar orthogonal
matrix, or a GOE matrix of off-diagonal variance ``V/N`` (semicircle of radius ``2 sqrt(V)``).

**What is computed.**

- :func:`variance_fixed_points`, :func:`hidden_variance`: the solutions of the self-consistent
  equation ``sigma_h2 = V (E[phi(h)^2] + 2 mean_x E[phi(h)] + sigma_x2)``, ``h ~ N(0,
  sigma_h2)`` (001 Thm. 3.1, Eq. 24-26). ``h*`` has mean zero: every ensemble here has
  ``E W = 0``, so ``h* = W (phi(h*) + x)`` has mean-zero entries whatever the mean of ``x``.
  The Gaussian form of ``h*_i`` is the mean-field (Gaussian-process) assumption of 001 §3.1.
- :func:`spectral_radius`: the spectral radius of the Jacobian ``W diag(phi'(h*))`` of the
  ``h``-iteration (001 Eq. 29; ``diag(phi'(h*)) W``, the Jacobian of the ``z``-iteration, has the
  same eigenvalues). Ginibre and orthogonal ``W``: ``r^2 = V E[phi'(h)^2]`` (001 Thm. 3.2,
  Eq. 30). GOE ``W`` and a monotone ``phi``: the right edge of the spectrum of ``D^{1/2} W
  D^{1/2}``, ``D = diag(phi'(h))`` free from ``W`` (001 §3.2, App. C.1); for hard tanh (and ReLU,
  linear) ``2 sqrt(V p)``, ``p = P(phi'(h) = 1)`` (001 Eq. 124).
- :func:`critical_scale`: the ``sqrt(V)`` at which that radius reaches 1 (001 §3.2, Fig. 4).
- :func:`scale_for_rate`: the ``sqrt(V)`` at which it reaches a given rate, e.g. a step budget's
  ``tol^(1/T)`` (Picard within ``T`` steps to ``tol`` needs ``r < tol^(1/T)``).
- :func:`picard_rate`, :func:`picard_nfe`: the linear convergence rate of Picard iteration near
  ``h*`` and the number of steps to a tolerance, ``log(tol) / log(r)``, forward and adjoint.

**Where 001 is silent or loose** (the test module checks each against simulation):

1. Eq. 25-26 treat ``sigma_x^2 = (1/N) x . x`` as a second moment; the cross term
   ``C_{x, phi(h*)} = mean_x E[phi(h*_i)]`` vanishes for odd ``phi`` (hard tanh, tanh, erf,
   linear) and for mean-zero inputs; only ReLU with ``mean_x != 0`` needs it.
2. Thm. 3.1 only holds under free independence; for the GOE the measured ``(1/N) h* . h*`` is
   larger than Eq. 25 (001 Fig. 2). :func:`hidden_variance` returns the Eq. 25 value for the GOE
   too (the prediction 001 plots), and :func:`spectral_radius` for the GOE evaluates C.1 at that
   predicted variance unless ``sigma_h2`` is given.
3. 001 Eq. 108 rewrites ``M_W^{-1}(z) = sqrt((z + 1)^2 / z)`` (Eq. 107) as ``sqrt(z + 1/z)``;
   it is ``sqrt(z + 2 + 1/z)``. Eq. 109, 115 and 116 inherit the slip; Eq. 117 ("simplifies
   to") and the radius ``2 sqrt(p)`` of Eq. 124 follow from the correct Eq. 107
   (``S_W(z) = 1 / sqrt(z)``). For a general ``phi'`` the edge is found from the subordination
   equation of :class:`deqlab.theory.freeprob.products.DWSpectrum` (``s^2 = V M_D(z / s)``) on the real
   axis, and the tests check it against that class's density and against sampled matrices.
4. 001 §3.2 says the GOE radius equals the Ginibre / orthogonal one "up to a factor of 2"; that
   holds for ``phi'`` in ``{0, 1}`` (hard tanh, ReLU, linear), not for tanh or erf.

Numerics: NumPy float64. Gaussian averages use closed forms where they exist (linear, ReLU,
hard tanh, erf) and composite Gauss-Legendre quadrature in ``h`` for tanh (Gauss-Hermite in
``h / sqrt(q)`` converges too slowly once ``sqrt(q) >> 1``: the poles of ``tanh`` approach the
real axis in that variable). Arguments out of range raise ``ValueError`` naming the
argument and its valid range (:mod:`deqlab.checks`).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
import scipy.integrate
import scipy.optimize
from scipy import special

from deqlab import checks, nonlinearities

__all__ = [
    "PHIS",
    "ENSEMBLES",
    "nonlinearity",
    "gaussian_moments",
    "FixedPoint",
    "NoFixedPointError",
    "MultipleFixedPointsError",
    "variance_fixed_points",
    "hidden_variance",
    "spectral_radius",
    "critical_scale",
    "scale_for_rate",
    "picard_rate",
    "picard_nfe",
]

PHIS: tuple[str, ...] = ("linear", "relu", "hard_tanh", "tanh", "erf")
"""The nonlinearities of 001 §3 handled here. ``"tanh"`` is defined in this module (it is not in
:mod:`deqlab.nonlinearities`); the others are that registry's entries (erf is scaled to
``phi'(0) = 1``: ``erf(sqrt(pi) h / 2)``)."""

ENSEMBLES: tuple[str, ...] = ("gaussian", "orthogonal", "goe")
"""The weight ensembles of 001 §3 (names of :data:`deqlab.ensembles.ENSEMBLES`)."""

# tanh by composite Gauss-Legendre in h (panels of width <= 1/2 and <= sqrt(q)/2 on [0, 9 sqrt(q)],
# 20 nodes each; the Gaussian tail beyond 9 sqrt(q) weighs < 1e-18). Plain Gauss-Hermite in u = h / sqrt(q)
# fails for large q: tanh(sqrt(q) u) has poles at u = +-i pi / (2 sqrt(q)), and 180 nodes (about the
# most hermegauss gives finite weights for) still err by 1e-3 at q = 20.
_GL_NODES = 20
_TAIL = 9.0

_TANH = nonlinearities.Nonlinearity(
    "tanh",
    numpy=lambda h: np.tanh(np.asarray(h, dtype=np.float64)),
    derivative_numpy=lambda h: 1.0 / np.cosh(np.asarray(h, dtype=np.float64)) ** 2,
    jax=jnp.tanh,
    derivative_jax=lambda h: 1.0 / jnp.cosh(h) ** 2,
    reference="001 §3",
)


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


def nonlinearity(phi: str, where: str | None = None) -> nonlinearities.Nonlinearity:
    """The :class:`deqlab.nonlinearities.Nonlinearity` called ``phi`` (one of :data:`PHIS`).

    It holds NumPy and JAX forms of ``phi`` and ``phi'`` (tanh is defined in this module).

    Args:
        phi: one of :data:`PHIS`.
        where: the public function named in an error message.

    Returns:
        The :class:`~deqlab.nonlinearities.Nonlinearity`.

    Raises:
        ValueError: ``phi`` is not one of :data:`PHIS`.

    Example:
        >>> from deqlab.theory import meanfield
        >>> float(meanfield.nonlinearity("tanh").derivative_numpy(0.0))
        1.0
    """
    name = checks.choice(phi, "phi", PHIS, where)
    return _TANH if name == "tanh" else nonlinearities.get(name, where)


def _ensemble(ensemble: Any, where: str) -> str:
    return checks.choice(ensemble, "ensemble", ENSEMBLES, where)


def _V(V: Any, where: str) -> float:
    return checks.number(V, "V", where, lower=0.0, lower_open=True)


def _input(sigma_x2: Any, mean_x: Any, where: str) -> tuple[float, float]:
    s = checks.number(sigma_x2, "sigma_x2", where, lower=0.0)
    bound = math.sqrt(s)
    requirement = (f"a finite real number with mean_x^2 <= sigma_x2, i.e. in [-{bound:g}, {bound:g}] "
                   "(sigma_x2 = (1/N) x.x, mean_x = (1/N) 1^T x; Cauchy-Schwarz)")
    try:
        m = checks.number(mean_x, "mean_x", where)
    except ValueError:
        raise checks.fail("mean_x", requirement, mean_x, where) from None
    if m * m > s * (1 + 1e-12):
        raise checks.fail("mean_x", requirement, mean_x, where)
    return s, m


# --------------------------------------------------------------------------------------------
# Gaussian averages
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _legendre() -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.legendre.leggauss(_GL_NODES)
    return (x + 1) / 2, w / 2  # on [0, 1]


def _tanh_moments(q: np.ndarray, panel: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """``(E tanh(h)^2, E sech(h)^4)``, ``h ~ N(0, q)`` (``q > 0``, an array), by composite
    Gauss-Legendre on ``h in [0, 9 sqrt(q)]``: the same number of panels for every ``q``, enough
    for panels of width ``<= panel`` (tanh varies on the scale 1) and ``<= panel sqrt(q)`` (the
    Gaussian's scale)."""
    sq = np.sqrt(q)
    n_panels = max(1, math.ceil(_TAIL * max(1.0, float(np.max(sq, initial=0.0))) / panel))
    x, w = _legendre()
    width = _TAIL * sq[..., None, None] / n_panels
    h = (np.arange(n_panels)[:, None] + x) * width  # (..., panels, nodes)
    weights = (w * width) * 2 * np.exp(-h * h / (2 * q[..., None, None])) / np.sqrt(2 * np.pi * q[..., None, None])
    t2 = np.tanh(h) ** 2
    return np.sum(t2 * weights, axis=(-2, -1)), np.sum((1 - t2) ** 2 * weights, axis=(-2, -1))


def _moments(name: str, q: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(E phi, E phi^2, E phi'^2)`` for ``h ~ N(0, q)``, ``q >= 0`` (a float64 array)."""
    q = np.asarray(q, dtype=np.float64)
    sq = np.sqrt(q)
    if name == "linear":
        return np.zeros_like(q), q.copy(), np.ones_like(q)
    if name == "relu":
        return sq / math.sqrt(2 * math.pi), q / 2, np.full_like(q, 0.5)
    if name == "hard_tanh":
        # a = 1/sqrt(q): E[u^2 1(|u| < a)] = erf(a/sqrt2) - 2 a pdf(a); the rest sits at +-1.
        with np.errstate(divide="ignore", invalid="ignore"):
            a = np.where(q > 0, 1 / np.where(q > 0, sq, 1.0), np.inf)
            inside = special.erf(a / math.sqrt(2))
            pdf_term = np.where(np.isfinite(a), 2 * a * np.exp(-a * a / 2) / math.sqrt(2 * math.pi), 0.0)
        e2 = q * (inside - pdf_term) + special.erfc(a / math.sqrt(2))
        return np.zeros_like(q), e2, inside
    if name == "erf":
        # erf(c h), c^2 = pi/4: E[erf(c h)^2] = (2/pi) arcsin(2 c^2 q / (1 + 2 c^2 q)) (Williams 1997);
        # phi'(h)^2 = exp(-pi h^2 / 2): E = (1 + pi q)^(-1/2).
        return (np.zeros_like(q), (2 / math.pi) * np.arcsin(math.pi * q / (2 + math.pi * q)),
                1 / np.sqrt(1 + math.pi * q))
    positive = q > 0
    e2, ed = _tanh_moments(np.where(positive, q, 1.0))
    return np.zeros_like(q), np.where(positive, e2, 0.0), np.where(positive, ed, 1.0)


def gaussian_moments(phi: str, q: float) -> tuple[float, float, float]:
    """``(E[phi(h)], E[phi(h)^2], E[phi'(h)^2])`` for ``h ~ N(0, q)`` (001 Eq. 26, 30).

    Closed forms for linear, ReLU (``sqrt(q / 2 pi)``, ``q/2``, ``1/2``), hard tanh
    (``0``, ``q (erf(a/sqrt2) - 2 a pdf(a)) + erfc(a/sqrt2)``, ``erf(a/sqrt2)``, ``a = q^-1/2``)
    and erf (``0``, ``(2/pi) arcsin(pi q / (2 + pi q))``, ``(1 + pi q)^-1/2``); tanh (odd, so
    ``E phi = 0``) by composite Gauss-Legendre quadrature in ``h`` (relative error below 1e-12).

    Args:
        phi: one of :data:`PHIS`.
        q: the variance, ``>= 0``.

    Returns:
        Three Python floats.

    Raises:
        ValueError: ``phi`` is unknown, or ``q`` is negative or not finite.

    Example:
        >>> from deqlab.theory import meanfield
        >>> mean, second, slope = meanfield.gaussian_moments("relu", 2.0)
        >>> round(mean, 6), second, slope
        (0.56419, 1.0, 0.5)
    """
    where = "theory.meanfield.gaussian_moments"
    nl = nonlinearity(phi, where)
    q = checks.number(q, "q", where, lower=0.0)
    return tuple(float(m) for m in _moments(nl.name, np.asarray(q)))


# --------------------------------------------------------------------------------------------
# The variance map and its fixed points (001 Thm. 3.1)
# --------------------------------------------------------------------------------------------


class FixedPoint(NamedTuple):
    """One solution ``q`` of ``q = F(q)`` of the variance map (001 Thm. 3.1, Eq. 25).

    The fixed point of the variance iteration ``q <- F(q)`` is stable for ``slope < 1``.

    Attributes:
        q: the variance ``sigma_h2``.
        slope: ``F'(q)`` (inf where ``F`` has a vertical tangent).
        stable: ``slope < 1`` (a property).

    Example:
        >>> from deqlab.theory.meanfield import FixedPoint
        >>> FixedPoint(q=1.0, slope=0.5).stable
        True
    """

    q: float
    slope: float

    @property
    def stable(self) -> bool:
        """Whether the variance iteration converges to this fixed point (``slope < 1``)."""
        return self.slope < 1


class NoFixedPointError(ValueError):
    """The self-consistent equation of 001 Thm. 3.1 has no finite solution (e.g. ReLU with
    ``V >= 2``, linear with ``V >= 1``): ``(1/N) h* . h*`` grows without bound."""


class MultipleFixedPointsError(ValueError):
    """The self-consistent equation has several solutions.

    Args:
        message: the error message.
        roots: the solutions (:class:`FixedPoint`, ascending ``q``), or ``None`` when every ``q``
            solves it.

    Attributes:
        roots: the ``roots`` given.
    """

    def __init__(self, message: str, roots: tuple[FixedPoint, ...] | None):
        super().__init__(message)
        self.roots = roots


def _variance_map(name: str, V: float, s: float, m: float, q):
    e1, e2, _ = _moments(name, np.asarray(q, dtype=np.float64))
    return V * (e2 + 2 * m * e1 + s)


def _slope(name: str, V: float, s: float, m: float, q: float) -> float:
    """``F'(q)`` by a central difference (one-sided at ``q = 0``); closed forms for linear/ReLU."""
    if name == "linear":
        return V
    if name == "relu":
        # F'(q) = V (1/2 + m / sqrt(2 pi q)); at q = 0 (a root only when m = 0) it is V/2.
        return V / 2 + (V * m / math.sqrt(2 * math.pi * q) if q > 0 else 0.0)
    h = 1e-5 * max(q, 1e-3)
    lo = max(q - h, 0.0)
    f = _variance_map(name, V, s, m, np.array([lo, q + h]))
    return float((f[1] - f[0]) / (q + h - lo))


def _closed_form_roots(name: str, V: float, s: float, m: float) -> tuple[float, ...] | None:
    """Roots ``q >= 0`` for linear and ReLU: ``F`` is a quadratic in ``t = sqrt(q)``
    (``(1 - V c2) t^2 - V b t - V s = 0``); ``None`` if every ``q`` is a root."""
    c2, b = (1.0, 0.0) if name == "linear" else (0.5, 2 * m / math.sqrt(2 * math.pi))
    a2, a1, a0 = 1 - V * c2, -V * b, -V * s
    if a2 == 0 and a1 == 0:
        return None if a0 == 0 else ()
    if a2 == 0:
        ts = [-a0 / a1]
    else:
        disc = a1 * a1 - 4 * a2 * a0
        if disc < 0:
            return ()
        r = math.sqrt(disc)
        ts = [(-a1 - r) / (2 * a2), (-a1 + r) / (2 * a2)]
    return tuple(sorted({t * t for t in ts if t >= 0}))


def _bounded_roots(name: str, V: float, s: float, m: float, n_grid: int = 400) -> tuple[float, ...]:
    """Every root of ``G(q) = F(q) - q`` on ``[0, q_max]`` for bounded ``|phi| <= 1``: a scan on a
    grid (uniform in ``sqrt(q)``, dense near 0) and Brent's method on every sign change. A root
    where ``G`` touches zero without changing sign between grid points would be missed; for the
    odd ``phi`` here (``E phi = 0``) with ``sigma_x2 > 0`` the tests find exactly one root."""
    q_max = V * (1 + 2 * abs(m) + s) * (1 + 1e-9) + 1e-300  # F(q) <= q_max for |phi| <= 1
    t = np.linspace(0.0, math.sqrt(q_max), n_grid)
    q = t * t
    g = _variance_map(name, V, s, m, q) - q
    scale = V * (1 + s) + q_max
    roots = []
    if g[0] == 0:
        roots.append(0.0)
    fun = lambda x: float(_variance_map(name, V, s, m, x)) - x
    for i in range(n_grid - 1):
        if g[i] * g[i + 1] < 0 or (g[i + 1] == 0 and i + 1 < n_grid - 1):
            if g[i + 1] == 0:
                roots.append(float(q[i + 1]))
            else:
                roots.append(scipy.optimize.brentq(fun, q[i], q[i + 1], xtol=1e-15, rtol=1e-14))
    roots = sorted(roots)
    merged = [r for k, r in enumerate(roots) if k == 0 or r - roots[k - 1] > 1e-9 * scale]
    return tuple(merged)


def variance_fixed_points(phi: str, V: float, sigma_x2: float = 1.0, mean_x: float = 0.0
                          ) -> tuple[FixedPoint, ...] | None:
    """Every solution ``q = sigma_h2 >= 0`` of 001 Thm. 3.1, Eq. 25-26:
    ``q = F(q) = V (E[phi(h)^2] + 2 mean_x E[phi(h)] + sigma_x2)``, ``h ~ N(0, q)``.

    Linear and ReLU: ``F`` is a quadratic in ``sqrt(q)``, solved in closed form (ReLU with
    ``mean_x < 0`` and ``2 < V < 2 + ...`` has two roots; ReLU with ``V >= 2`` and ``mean_x >=
    0``, and linear with ``V >= 1``, none but ``q = 0`` when ``sigma_x2 = 0``). Bounded ``phi``
    (hard tanh, tanh, erf): ``F(q) <= V (1 + 2 |mean_x| + sigma_x2)``, so all roots lie below
    that bound; they are found by a scan (400 points, uniform in ``sqrt(q)``) with bracketing, so
    several solutions are all reported. ``q = 0`` is a root iff ``sigma_x2 = 0``.

    Returns:
      A tuple of :class:`FixedPoint` (ascending ``q``; empty if there is none), or ``None`` when
      every ``q >= 0`` is a solution (linear with ``V = 1``, ReLU with ``V = 2``, no input).

    Args:
        phi: one of :data:`PHIS`.
        V: ``E tr[W W^T] > 0``.
        sigma_x2: ``(1/N) x . x >= 0``.
        mean_x: ``(1/N) 1^T x``, with ``mean_x^2 <= sigma_x2``.

    Raises:
        ValueError: ``phi`` is unknown, ``V <= 0``, ``sigma_x2 < 0``, or ``mean_x^2 > sigma_x2``.

    Example:
        >>> from deqlab.theory import meanfield
        >>> meanfield.variance_fixed_points("linear", 0.5)  # q = V (q + 1)
        (FixedPoint(q=1.0, slope=0.5),)
    """
    where = "theory.meanfield.variance_fixed_points"
    nl = nonlinearity(phi, where)
    V = _V(V, where)
    s, m = _input(sigma_x2, mean_x, where)
    if nl.name in ("linear", "relu"):
        roots = _closed_form_roots(nl.name, V, s, m)
        if roots is None:
            return None
    else:
        roots = _bounded_roots(nl.name, V, s, m)
    return tuple(FixedPoint(float(q), _slope(nl.name, V, s, m, float(q))) for q in roots)


def hidden_variance(phi: str, ensemble: str, V: float, sigma_x2: float = 1.0, mean_x: float = 0.0) -> float:
    """``sigma_h2 = lim (1/N) h* . h*`` of the nonlinear DEQ ``z* = phi(W z*) + x``, ``h* = W z*``.

    The solution of 001 Thm. 3.1, Eq. 24-26:
    ``sigma_h2 = V (E[phi(h)^2] + 2 mean_x E[phi(h)] + sigma_x2)``, ``h ~ N(0, sigma_h2)``.
    Exact in the large-``N`` limit for ``"gaussian"`` and ``"orthogonal"`` ``W`` under 001's
    free-independence assumption; for ``"goe"`` this is the same Eq. 25 value, which the measured
    variance exceeds (001 Fig. 2; :func:`variance_fixed_points` has all solutions).

    Args:
        phi: one of :data:`PHIS`.
        ensemble: one of :data:`ENSEMBLES`.
        V: ``E tr[W W^T] > 0``.
        sigma_x2: ``(1/N) x . x >= 0``.
        mean_x: ``(1/N) 1^T x``, with ``mean_x^2 <= sigma_x2``.

    Returns:
        ``sigma_h2``, a Python float.

    Raises:
        NoFixedPointError: no finite solution (ReLU ``V >= 2``, linear ``V >= 1`` with an input).
        MultipleFixedPointsError: more than one solution (``.roots`` lists them).
        ValueError: arguments out of range.

    Example:
        >>> from deqlab.theory import meanfield
        >>> meanfield.hidden_variance("linear", "gaussian", 0.5)  # V / (1 - V)
        1.0
        >>> round(meanfield.hidden_variance("tanh", "gaussian", 0.5), 6)
        0.660167
    """
    where = "theory.meanfield.hidden_variance"
    nl = nonlinearity(phi, where)
    _ensemble(ensemble, where)
    V = _V(V, where)
    s, m = _input(sigma_x2, mean_x, where)
    roots = variance_fixed_points(nl.name, V, s, m)
    if roots is None:
        raise MultipleFixedPointsError(
            f"{where}: every sigma_h2 >= 0 solves 001 Eq. 25 for {nl.name!r} at V = {V:g} with no input "
            "(sigma_x2 = 0): the variance is not determined", None)
    if not roots:
        bound = {"linear": "V < 1", "relu": "V < 2 (or mean_x < 0 with a real root)"}.get(nl.name, "")
        raise NoFixedPointError(
            f"{where}: 001 Eq. 25 has no finite solution for {nl.name!r} at V = {V:g}, sigma_x2 = {s:g}, "
            f"mean_x = {m:g}: (1/N) h*.h* grows without bound" + (f"; `V` must be {bound}" if bound else ""))
    if len(roots) > 1:
        listed = ", ".join(f"{r.q:.6g} ({'stable' if r.stable else 'unstable'})" for r in roots)
        raise MultipleFixedPointsError(
            f"{where}: 001 Eq. 25 has {len(roots)} solutions for {nl.name!r} at V = {V:g}, sigma_x2 = {s:g}, "
            f"mean_x = {m:g}: sigma_h2 = {listed}; use variance_fixed_points to choose", roots)
    return roots[0].q


# --------------------------------------------------------------------------------------------
# Spectral radius of the Jacobian (001 Thm. 3.2, §3.2, App. C.1)
# --------------------------------------------------------------------------------------------


def _binary_p(name: str, q: float) -> float | None:
    """``p = P(phi'(h) = 1)`` where ``phi'`` takes only the values 0 and 1; None otherwise."""
    if name == "linear":
        return 1.0
    if name == "relu":
        return 0.5
    if name == "hard_tanh":
        return float(special.erf(1 / math.sqrt(2 * q))) if q > 0 else 1.0
    return None


def _slope_cauchy(nl: nonlinearities.Nonlinearity, q: float, y: float) -> float:
    """``g(y) = E[d / (y - d)]``, ``d = phi'(h)``, ``h ~ N(0, q)``, ``y > max d = 1``: adaptive
    quadrature on ``h >= 0`` (``phi'`` is even), split at the peak width ``sqrt(y - 1)``."""
    sq = math.sqrt(q)

    def integrand(u):
        d = float(nl.derivative_numpy(sq * u))
        return 2 * math.exp(-u * u / 2) / math.sqrt(2 * math.pi) * d / (y - d)

    width = min(math.sqrt(y - 1) / sq, 1.0)
    pts = [0.0, width, 10 * width, 40.0] if 10 * width < 40 else [0.0, width, 40.0]
    return float(sum(scipy.integrate.quad(integrand, a, b, limit=200, epsabs=0, epsrel=1e-12)[0]
                     for a, b in zip(pts[:-1], pts[1:])))


def _goe_edge(nl: nonlinearities.Nonlinearity, V: float, q: float) -> float:
    """Right edge of the spectrum of ``D^{1/2} W D^{1/2}``, GOE ``W`` of variance ``V``, free
    ``D = diag(phi'(h))`` with ``0 <= phi' <= phi'(0) = 1`` (001 App. C.1).

    On the real axis right of the spectrum, ``s = sqrt(V M_DW(x))`` solves ``s^2 = V M_D(x / s)``
    (the equation of :class:`~deqlab.theory.freeprob.products.DWSpectrum`), i.e. with ``y = x / s``:
    ``s^2 = V g(y)``, ``g(y) = E[d / (y - d)]``, and ``x(y) = y sqrt(V g(y))``. The physical branch
    is ``y -> inf``; the edge is where it ends, the minimum of ``x(y)`` over ``y > 1``
    (``x(y) -> inf`` at both ends for tanh and erf, where ``g(1+) = inf``). For Bernoulli ``d``
    this gives ``min_y y sqrt(V p / (y - 1)) = 2 sqrt(V p)`` at ``y = 2`` (001 Eq. 124).
    """
    def x_of(log_gap):
        y = 1 + math.exp(log_gap)
        return y * math.sqrt(V * _slope_cauchy(nl, q, y))

    res = scipy.optimize.minimize_scalar(x_of, bracket=(-6.0, 0.0, 4.0), method="brent",
                                         options={"xtol": 1e-10})
    return float(res.fun)


def spectral_radius(phi: str, ensemble: str, V: float, sigma_x2: float = 1.0, mean_x: float = 0.0,
                    sigma_h2: float | None = None) -> float:
    """Large-``N`` spectral radius ``r`` of the Jacobian ``W diag(phi'(h*))`` (001 Eq. 29).

    - ``"gaussian"``, ``"orthogonal"``: ``r^2 = V E[phi'(h)^2]`` (001 Thm. 3.2, Eq. 30;
      ``W phi'`` is R-diagonal, the outer radius of its Brown measure).
    - ``"goe"``: the eigenvalues are real (``D W = D^{1/2} (D^{1/2} W)`` and the symmetric
      ``D^{1/2} W D^{1/2}`` have the same characteristic polynomial, ``AB`` and ``BA``; for a
      singular ``D`` such as hard tanh's they are not similar); ``r`` is
      the edge of that spectrum for ``D`` free from ``W`` (001 §3.2, App. C.1). Hard tanh, ReLU,
      linear: ``2 sqrt(V p)``, ``p = P(phi' = 1)`` (001 Eq. 124; ``p = erf(1 / sqrt(2
      sigma_h2))`` for hard tanh); tanh, erf: numerically, the minimum over ``y > 1`` of
      ``y sqrt(V E[d / (y - d)])``, ``d = phi'(h)``. 001 Fig. 3 finds this accurate for small
      ``V`` only: ``h*`` is not free from a symmetric ``W``.

    ``h ~ N(0, sigma_h2)`` with ``sigma_h2`` from :func:`hidden_variance` (``sigma_x2``,
    ``mean_x``), or the value given (e.g. a measured ``(1/N) h* . h*``). For linear and ReLU,
    ``phi'^2`` does not depend on ``sigma_h2``: none is computed and ``sigma_h2`` is ignored.

    Args:
        phi: one of :data:`PHIS`.
        ensemble: one of :data:`ENSEMBLES`.
        V: ``E tr[W W^T] > 0``.
        sigma_x2: ``(1/N) x . x >= 0``.
        mean_x: ``(1/N) 1^T x``, with ``mean_x^2 <= sigma_x2``.
        sigma_h2: the variance of ``h*`` to use (> 0); None: :func:`hidden_variance`.

    Returns:
        ``r``, a Python float.

    Raises:
        ValueError: arguments out of range; the errors of :func:`hidden_variance`.

    Example:
        >>> from deqlab.theory import meanfield
        >>> meanfield.spectral_radius("relu", "gaussian", 0.5), meanfield.spectral_radius("relu", "goe", 0.5)
        (0.5, 1.0)
    """
    where = "theory.meanfield.spectral_radius"
    nl = nonlinearity(phi, where)
    ensemble = _ensemble(ensemble, where)
    V = _V(V, where)
    s, m = _input(sigma_x2, mean_x, where)
    if nl.name in ("linear", "relu"):
        q = 1.0  # phi'^2 is 1 or a Bernoulli(1/2): its law does not depend on the variance
    elif sigma_h2 is None:
        q = hidden_variance(nl.name, ensemble, V, s, m)
    else:
        q = checks.number(sigma_h2, "sigma_h2", where, lower=0.0, lower_open=True)
    if ensemble != "goe":
        return math.sqrt(V * float(_moments(nl.name, np.asarray(q))[2]))
    p = _binary_p(nl.name, q)
    if p is not None:
        return 2 * math.sqrt(V * p)
    return _goe_edge(nl, V, q)


def critical_scale(phi: str, ensemble: str, sigma_x2: float = 1.0, mean_x: float = 0.0,
                   scale_max: float = 20.0) -> float:
    """The ``sqrt(V)`` at which :func:`spectral_radius` reaches 1 (001 §3.2, Fig. 3-4).

    The predicted onset of instability of the fixed point. Linear: 1 (Ginibre, orthogonal) and
    1/2 (GOE); ReLU: ``sqrt(2)`` and ``1/sqrt(2)`` (``r^2 = V/2``, ``2 sqrt(V/2)``). Otherwise a
    geometric scan of ``sqrt(V)`` (steps of 1.25) up to ``scale_max`` and Brent's method on the
    first crossing of ``r = 1``: :func:`scale_for_rate` at ``rate = 1``.

    Args:
        phi: one of :data:`PHIS`.
        ensemble: one of :data:`ENSEMBLES`.
        sigma_x2: ``(1/N) x . x``; > 0 for the bounded nonlinearities.
        mean_x: ``(1/N) 1^T x``, with ``mean_x^2 <= sigma_x2``.
        scale_max: the largest ``sqrt(V)`` searched, > 0.

    Returns:
        The critical ``sqrt(V)``, a Python float.

    Raises:
        ValueError: arguments out of range, or no crossing below ``scale_max``.

    Example:
        >>> from deqlab.theory import meanfield
        >>> round(meanfield.critical_scale("relu", "goe"), 6)
        0.707107
    """
    return _scale_for_rate(phi, ensemble, 1.0, sigma_x2, mean_x, scale_max, "theory.meanfield.critical_scale")


def scale_for_rate(phi: str, ensemble: str, rate: float, sigma_x2: float = 1.0, mean_x: float = 0.0,
                   scale_max: float = 20.0) -> float:
    """The ``sqrt(V)`` at which :func:`spectral_radius`, Picard's asymptotic rate (001 Eq. 29),
    reaches ``rate``; :func:`critical_scale` is ``rate = 1``.

    A Picard solve within ``T`` steps to a tolerance ``tol`` needs ``r < tol^(1/T)``, so
    ``scale_for_rate(phi, ensemble, tol ** (1 / T))`` is the largest ``sqrt(V)`` such a budget
    allows. Linear: ``rate`` (Ginibre, orthogonal) and ``rate / 2`` (GOE); ReLU: ``sqrt(2) rate``
    and ``rate / sqrt(2)`` (closed forms, whatever ``scale_max``; at ``rate >= 1`` the scale is
    past Picard's stability edge, where Eq. 25 has no fixed point). Otherwise a geometric scan of
    ``sqrt(V)`` (steps of 1.25, from below ``rate / 2``, where ``r <= 2 sqrt(V)`` since
    ``0 <= phi' <= 1``) up to ``scale_max`` and Brent's method on the first crossing: a few dozen
    evaluations of the radius where a scan of a fine grid would take hundreds. The radius grows
    with ``sqrt(V)`` (checked on a grid in the tests for hard tanh, erf and, with Gaussian and
    orthogonal weights, tanh), so the first crossing is the only one.

    Args:
        phi: one of :data:`PHIS`.
        ensemble: one of :data:`ENSEMBLES`.
        rate: the rate ``r``, > 0.
        sigma_x2: ``(1/N) x . x``; > 0 for the bounded nonlinearities.
        mean_x: ``(1/N) 1^T x``, with ``mean_x^2 <= sigma_x2``.
        scale_max: the largest ``sqrt(V)`` searched (bounded ``phi``), > 0.

    Returns:
        The ``sqrt(V)``, a Python float.

    Raises:
        ValueError: arguments out of range (named), or, for a bounded ``phi``, no crossing below
            ``scale_max``.

    Example:
        >>> from deqlab.theory import meanfield
        >>> meanfield.scale_for_rate("linear", "goe", 0.5)
        0.25
        >>> scale = meanfield.scale_for_rate("tanh", "gaussian", 1e-8 ** (1 / 300))  # 300 steps to 1e-8
        >>> round(meanfield.picard_rate("tanh", "gaussian", scale**2), 6), round(1e-8 ** (1 / 300), 6)
        (0.940445, 0.940445)
    """
    where = "theory.meanfield.scale_for_rate"
    rate = checks.positive_number(rate, "rate", where)
    return _scale_for_rate(phi, ensemble, rate, sigma_x2, mean_x, scale_max, where)


def _scale_for_rate(phi, ensemble, rate, sigma_x2, mean_x, scale_max, where) -> float:
    nl = nonlinearity(phi, where)
    ensemble = _ensemble(ensemble, where)
    s, m = _input(sigma_x2, mean_x, where)
    if s == 0 and nl.name not in ("linear", "relu"):
        # without input q = 0 solves Eq. 25 at every V and a second root appears at V = 1: the
        # radius is not a function of V alone there
        raise checks.fail("sigma_x2", f"> 0 for {nl.name!r} (without input Eq. 25 has several "
                          "solutions above V = 1)", sigma_x2, where)
    scale_max = checks.positive_number(scale_max, "scale_max", where)
    goe = 2.0 if ensemble == "goe" else 1.0
    if nl.name == "linear":
        return rate / goe
    if nl.name == "relu":
        return math.sqrt(2) * rate / goe

    def excess(scale):
        return spectral_radius(nl.name, ensemble, scale * scale, s, m) - rate

    # r grows with sqrt(V) for these phi (checked on a grid in the tests): step up geometrically
    # from a scale where r < rate and refine the first bracket by Brent's method.
    # below rate / (2 goe) the radius is below the rate (r <= goe sqrt(V), as 0 <= phi' <= 1); at rate 1 the start
    # is critical_scale's, scale_max 2^-20, for every scale_max below 2^18
    low = min(scale_max * 2.0**-20, rate / (2 * goe))
    if excess(low) >= 0:
        raise ValueError(f"{where}: the predicted spectral radius is >= {rate:g} already at sqrt(V) = {low:g}")
    while low < scale_max:
        high = min(low * 1.25, scale_max)
        if excess(high) >= 0:
            return float(scipy.optimize.brentq(excess, low, high, xtol=1e-12, rtol=1e-12))
        low = high
    raise ValueError(f"{where}: the predicted spectral radius stays below {rate:g} for sqrt(V) <= {scale_max:g}; "
                     "`scale_max` must be larger")


# --------------------------------------------------------------------------------------------
# Picard iteration: rate and number of function evaluations
# --------------------------------------------------------------------------------------------


def picard_rate(phi: str, ensemble: str, V: float, sigma_x2: float = 1.0, mean_x: float = 0.0,
                sigma_h2: float | None = None) -> float:
    """Asymptotic linear rate of Picard iteration near ``h*`` (001 Eq. 29).

    The error shrinks by ``r`` per step, ``r`` = :func:`spectral_radius`. The same rate holds for
    the forward ``z``-iteration (Jacobian ``D W``), the ``h``-iteration (``W D``) and the adjoint
    (backward) iteration ``u <- J^T u + g`` (``J^T`` has the eigenvalues of ``J``).

    Args:
        phi: one of :data:`PHIS`.
        ensemble: one of :data:`ENSEMBLES`.
        V: ``E tr[W W^T] > 0``.
        sigma_x2: ``(1/N) x . x >= 0``.
        mean_x: ``(1/N) 1^T x``.
        sigma_h2: as for :func:`spectral_radius`.

    Returns:
        ``r``, a Python float.

    Raises:
        ValueError: the errors of :func:`spectral_radius`.

    Example:
        >>> from deqlab.theory import meanfield
        >>> meanfield.picard_rate("linear", "orthogonal", 0.25)
        0.5
    """
    return spectral_radius(phi, ensemble, V, sigma_x2, mean_x, sigma_h2)


def picard_nfe(phi: str, ensemble: str, V: float, tol: float, sigma_x2: float = 1.0, mean_x: float = 0.0,
               direction: str = "forward", sigma_h2: float | None = None) -> int:
    """Predicted number of Picard steps to shrink the error (and the relative residual) by ``tol``.

    ``ceil(log(tol) / log(r))``, ``r`` = :func:`picard_rate` (001 Eq. 29), counted as
    :func:`deqlab.solvers.solve` counts ``stats.steps`` from ``z0 = 0`` (``stats.nfe`` adds the
    evaluation at ``z0``). Both directions have the rate ``r``. This is the leading order in
    ``log(1/tol)``: the transient of the first steps (nonlinear, and for non-normal ``J`` a growth
    ``||J^t|| ~ sqrt(t) r^t`` for Ginibre ``W``) adds ``O(log(t) / log(1/r))`` steps.

    Args:
        phi: one of :data:`PHIS`.
        ensemble: one of :data:`ENSEMBLES`.
        V: ``E tr[W W^T] > 0``.
        tol: the error reduction, in (0, 1).
        sigma_x2: ``(1/N) x . x >= 0``.
        mean_x: ``(1/N) 1^T x``.
        direction: ``"forward"`` (the fixed point) or ``"backward"`` (the adjoint linear solve
            ``u = J^T u + g`` of the implicit gradient, whose solution gives 001 Eq. 93).
        sigma_h2: as for :func:`spectral_radius`.

    Returns:
        The number of steps, an int >= 1.

    Raises:
        ValueError: ``tol`` not in (0, 1), ``direction`` unknown, or ``r >= 1`` (``V`` at or above
            the critical value of :func:`critical_scale`: Picard iteration does not converge).

    Example:
        >>> from deqlab.theory import meanfield
        >>> meanfield.picard_nfe("linear", "orthogonal", 0.25, tol=1e-6)  # 0.5^20 < 1e-6
        20
    """
    where = "theory.meanfield.picard_nfe"
    tol = checks.number(tol, "tol", where, lower=0.0, upper=1.0, lower_open=True, upper_open=True)
    checks.choice(direction, "direction", ("forward", "backward"), where)
    r = picard_rate(phi, ensemble, V, sigma_x2, mean_x, sigma_h2)
    if r >= 1:
        raise checks.fail("V", f"below the critical variance of {phi!r} / {ensemble!r} (predicted spectral "
                          f"radius r = {r:.4g} >= 1: Picard iteration does not converge; see critical_scale)",
                          V, where)
    if r == 0:
        return 1
    return max(1, math.ceil(math.log(tol) / math.log(r)))
