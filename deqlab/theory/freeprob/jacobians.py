"""Spectra of the input-output Jacobians of deep random networks at criticality (002 §2-4).

The network of 002 Eq. 1 has weights ``W_l`` (``"orthogonal"`` or ``"gaussian"``, i.e.
``sample(weights, key, n, sqrt(sigma_w2))`` of :mod:`deqlab.ensembles`: ``sigma_w2`` is the
variance ``V`` in 002's notation), biases ``N(0, sigma_b2)`` and a nonlinearity ``phi`` of
:mod:`deqlab.nonlinearities`. Its Jacobian is ``J = prod_l D_l W_l`` with
``D_l = diag(phi'(h_l))`` and pre-activations ``h ~ N(0, q*)`` (002 Eq. 2).

- slopes: :func:`bernoulli_p`, :func:`slope_moments` (002 Eq. 20, Table 1),
  :func:`squared_slope_spectrum`, :func:`slope_spectrum` (002 Eq. 23, 001 C.1);
- weights: :func:`weight_spectrum` (002 Table 2);
- the critical line: :func:`critical_point` (002 Eq. 4-5);
- the Jacobian: :func:`jacobian_moments` (002 Eq. 21-22), :func:`jacobian_atoms` (002 §3.3),
  :func:`jacobian_density` (002 Eq. 14-16 by Algorithm 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from scipy import integrate, special

from deqlab import checks, ensembles, nonlinearities
from deqlab.theory.freeprob.spectra import Bernoulli, MarchenkoPastur, PointMasses, ScaledIdentity
from deqlab.theory.freeprob.transforms import Spectrum, follow_roots, real_points

__all__ = [
    "NONLINEARITIES",
    "WEIGHTS",
    "activation",
    "gaussian_expectation",
    "bernoulli_p",
    "slope_moments",
    "squared_slope_spectrum",
    "slope_spectrum",
    "weight_spectrum",
    "critical_point",
    "jacobian_moments",
    "jacobian_atoms",
    "JacobianDensity",
    "jacobian_density",
]

NONLINEARITIES = nonlinearities.NONLINEARITIES
"""The nonlinearities of chapter 2 (:data:`deqlab.nonlinearities.NONLINEARITIES`)."""

# First free cumulant s_1 of the S-transform of W^T W (002 Table 2, Eq. 21).
_S1 = {"orthogonal": 0.0, "gaussian": -1.0}

WEIGHTS: tuple[str, ...] = tuple(name for name in ensembles.ENSEMBLES if name in _S1)
"""The weight ensembles of 002 (names of :data:`deqlab.ensembles.ENSEMBLES`) whose ``W^T W``
has a closed-form S-transform (002 Table 2)."""


def _nonlinearity(name, where: str) -> nonlinearities.Nonlinearity:
    return nonlinearities.get(name, where)


def _weights(name, where: str) -> str:
    return checks.choice(name, "weights", WEIGHTS, where)


def _q_star(q_star, where: str) -> float:
    return checks.positive_number(q_star, "q_star", where)


def activation(nonlinearity: str, h):
    """``phi(h)`` (NumPy, float64) for a named nonlinearity of :mod:`deqlab.nonlinearities`.

    (002 Table 1 and §5: hard tanh ``clip(h, -1, 1)``, erf ``erf(sqrt(pi) h / 2)``, shifted ReLU
    ``[h + 1/2]_+ - 1/2``, SiLU ``h sigmoid(h)``.)

    Args:
        nonlinearity: one of :data:`NONLINEARITIES`.
        h: pre-activations.

    Returns:
        ``phi(h)``, float64.

    Raises:
        ValueError: ``nonlinearity`` is unknown.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> fp.activation("hard_tanh", [-2.0, 0.5]).tolist()
        [-1.0, 0.5]
    """
    return _nonlinearity(nonlinearity, "theory.freeprob.activation").numpy(h)


def gaussian_expectation(fun: Callable, q: float, kinks=()) -> float:
    """``int Dh fun(sqrt(q) h)`` (``Dh`` the standard Gaussian measure); 002 Eq. 4, 20.

    By adaptive quadrature, split at the ``kinks`` of ``fun`` (in the variable ``sqrt(q) h``).

    Args:
        fun: a scalar function of one float.
        q: the variance, > 0.
        kinks: points where ``fun`` or its derivative jumps.

    Returns:
        The expectation, a Python float.

    Raises:
        ValueError: ``q`` is not > 0.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> round(fp.gaussian_expectation(lambda h: h**2, 2.0), 10)
        2.0
    """
    q = checks.positive_number(q, "q", "theory.freeprob.gaussian_expectation")
    sq = math.sqrt(q)
    pts = sorted({-40.0, 40.0, *[k / sq for k in kinks if abs(k / sq) < 40]})
    dens = lambda u: math.exp(-u * u / 2) / math.sqrt(2 * math.pi) * float(fun(sq * u))
    return float(sum(integrate.quad(dens, a, b, limit=200, epsabs=1e-14, epsrel=1e-12)[0]
                     for a, b in zip(pts[:-1], pts[1:])))


def bernoulli_p(nonlinearity: str, q_star: float) -> float:
    """``p(q*) = P(phi'(h)^2 = 1)`` for the piecewise-linear nonlinearities (002 Table 1, Eq. 24).

    linear 1, ReLU 1/2, hard tanh ``erf(1 / sqrt(2 q*))``, shifted ReLU ``Phi(1 / (2 sqrt q*))``.

    Args:
        nonlinearity: a piecewise-linear name of :data:`NONLINEARITIES`.
        q_star: the pre-activation variance ``q* > 0``.

    Returns:
        ``p``, a Python float.

    Raises:
        ValueError: ``nonlinearity`` is unknown or not piecewise linear, or ``q_star <= 0``.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> round(fp.bernoulli_p("hard_tanh", 1.0), 6)  # erf(1 / sqrt(2))
        0.682689
    """
    where = "theory.freeprob.bernoulli_p"
    nl = _nonlinearity(nonlinearity, where)
    q = _q_star(q_star, where)
    if nl.name == "linear":
        return 1.0
    if nl.name == "relu":
        return 0.5
    if nl.name == "hard_tanh":
        return float(special.erf(1 / math.sqrt(2 * q)))
    if nl.name == "shifted_relu":
        return float(special.ndtr(0.5 / math.sqrt(q)))
    piecewise = [n for n in NONLINEARITIES if nonlinearities.get(n).binary_slope]
    raise checks.fail("nonlinearity", "piecewise linear, one of "
                      + ", ".join(repr(n) for n in piecewise), nonlinearity, where)


def slope_moments(nonlinearity: str, q_star: float, kmax: int = 2) -> np.ndarray:
    """``mu_k = int Dh phi'(sqrt(q*) h)^(2k)``, ``k = 1..kmax`` (002 Eq. 20, Table 1).

    Closed forms for the Bernoulli class (``mu_k = p``) and erf (``(1 + pi k q*)^(-1/2)``);
    adaptive quadrature otherwise (SiLU).

    Args:
        nonlinearity: one of :data:`NONLINEARITIES`.
        q_star: ``q* > 0``.
        kmax: the number of moments, an integer >= 1.

    Returns:
        A float64 array ``[mu_1, ..., mu_kmax]``.

    Raises:
        ValueError: ``nonlinearity`` is unknown, ``q_star <= 0`` or ``kmax < 1``.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> fp.slope_moments("erf", 1.0, 2).round(6).tolist()
        [0.491379, 0.370544]
    """
    where = "theory.freeprob.slope_moments"
    nl = _nonlinearity(nonlinearity, where)
    q = _q_star(q_star, where)
    kmax = checks.positive_int(kmax, "kmax", where)
    ks = np.arange(1, kmax + 1)
    if nl.binary_slope:
        return np.full(kmax, bernoulli_p(nl.name, q))
    if nl.name == "erf":
        return 1 / np.sqrt(1 + np.pi * ks * q)
    return np.array([gaussian_expectation(lambda h, k=k: nl.derivative_numpy(h) ** (2 * k), q, nl.kinks)
                     for k in ks])


def _hermite(n_nodes: int):
    u, w = np.polynomial.hermite_e.hermegauss(n_nodes)
    return u, w / w.sum()


def _slope_points(nonlinearity, q_star, n_nodes, power: int, where: str) -> Spectrum:
    nl = _nonlinearity(nonlinearity, where)
    q = _q_star(q_star, where)
    n_nodes = checks.positive_int(n_nodes, "n_nodes", where)
    if nl.binary_slope:
        return Bernoulli(bernoulli_p(nl.name, q))
    u, w = _hermite(n_nodes)
    return PointMasses(nl.derivative_numpy(math.sqrt(q) * u) ** power, w)


def squared_slope_spectrum(nonlinearity: str, q_star: float, n_nodes: int = 256) -> Spectrum:
    """Spectrum of ``D^2`` with ``D_ii = phi'(h_i)``, ``h_i ~ N(0, q*)`` (002 Eq. 23).

    Exactly :class:`Bernoulli` for linear, ReLU, hard tanh, shifted ReLU (002 Table 1); for erf
    and SiLU the Gaussian integral of Eq. 23 by ``n_nodes``-point Gauss-Hermite quadrature, i.e.
    point masses at ``phi'(sqrt(q*) u_i)^2`` (accurate for ``z`` away from ``[0, max phi'^2]``).

    Args:
        nonlinearity: one of :data:`NONLINEARITIES`.
        q_star: ``q* > 0``.
        n_nodes: Gauss-Hermite nodes, an integer >= 1.

    Returns:
        A :class:`Bernoulli` or :class:`PointMasses`.

    Raises:
        ValueError: ``nonlinearity`` is unknown, ``q_star <= 0`` or ``n_nodes < 1``.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> fp.squared_slope_spectrum("relu", 1.0).p
        0.5
    """
    return _slope_points(nonlinearity, q_star, n_nodes, 2, "theory.freeprob.squared_slope_spectrum")


def slope_spectrum(nonlinearity: str, q_star: float, n_nodes: int = 256) -> Spectrum:
    """Spectrum of ``D`` itself (slopes ``phi'(h)``, 001 App. C.1): as :func:`squared_slope_spectrum`.

    Args:
        nonlinearity: one of :data:`NONLINEARITIES`.
        q_star: ``q* > 0``.
        n_nodes: Gauss-Hermite nodes, an integer >= 1.

    Returns:
        A :class:`Bernoulli` or :class:`PointMasses`.

    Raises:
        ValueError: ``nonlinearity`` is unknown, ``q_star <= 0`` or ``n_nodes < 1``.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> round(fp.slope_spectrum("erf", 1.0, n_nodes=16).moment(1), 6)  # E exp(-pi h^2 / 4)
        0.623684
    """
    return _slope_points(nonlinearity, q_star, n_nodes, 1, "theory.freeprob.slope_spectrum")


def weight_spectrum(weights: str, sigma_w2: float) -> Spectrum:
    """Spectrum of ``W^T W`` (002 Table 2) for ``W = sample(weights, key, n, sqrt(sigma_w2))``.

    ``"orthogonal"``: a point mass at ``sigma_w2`` (``S = 1/sigma_w2``, ``s_1 = 0``);
    ``"gaussian"``: Marchenko-Pastur (``S = 1 / (sigma_w2 (1 + w))``, ``s_1 = -1``).

    Args:
        weights: one of :data:`WEIGHTS`.
        sigma_w2: the weight variance, > 0.

    Returns:
        A :class:`ScaledIdentity` or :class:`MarchenkoPastur`.

    Raises:
        ValueError: ``weights`` is unknown or ``sigma_w2 <= 0``.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> type(fp.weight_spectrum("gaussian", 2.0)).__name__
        'MarchenkoPastur'
    """
    where = "theory.freeprob.weight_spectrum"
    weights = _weights(weights, where)
    sigma_w2 = checks.positive_number(sigma_w2, "sigma_w2", where)
    return ScaledIdentity(sigma_w2) if weights == "orthogonal" else MarchenkoPastur(sigma_w2)


def critical_point(nonlinearity: str, q_star: float) -> tuple[float, float]:
    """``(sigma_w2, sigma_b2)`` on the critical line ``chi = sigma_w2 mu_1 = 1`` at ``q*``.

    ``sigma_w2 = 1 / mu_1(q*)`` (002 Eq. 5) and ``sigma_b2 = q* - sigma_w2 int Dh
    phi(sqrt(q*) h)^2`` from the fixed point of the variance map (002 Eq. 4); linear: ``(1,
    0)``, ReLU: ``(2, 0)`` for every ``q*`` (002 §4.3, Table 1).

    Raises:
      ValueError: unknown nonlinearity, ``q* <= 0``, or no real bias (``sigma_b2 < 0``).

    Args:
        nonlinearity: one of :data:`NONLINEARITIES`.
        q_star: ``q* > 0``.

    Returns:
        ``(sigma_w2, sigma_b2)``, two Python floats.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> fp.critical_point("relu", 1.0)
        (2.0, 0.0)
    """
    where = "theory.freeprob.critical_point"
    nl = _nonlinearity(nonlinearity, where)
    q = _q_star(q_star, where)
    mu1 = float(slope_moments(nl.name, q, 1)[0])
    sw2 = 1.0 / mu1
    e_phi2 = gaussian_expectation(lambda h: nl.numpy(h) ** 2, q, nl.kinks)
    sb2 = q - sw2 * e_phi2
    if nl.name in ("linear", "relu"):
        sb2 = 0.0  # exact: phi is homogeneous, the variance map is q = sigma_w2 mu_1 q
    if sb2 < -1e-12 * q:
        raise ValueError(
            f"{where}: `q_star` = {q} gives no real bias for {nl.name!r} (sigma_b2 = {sb2:.3g} < 0); "
            "choose a q_star at which q* >= sigma_w2 E[phi(h)^2]"
        )
    return sw2, max(sb2, 0.0)


def _sigma_w2(nonlinearity, q, sigma_w2, where):
    if sigma_w2 is None:
        return 1.0 / float(slope_moments(nonlinearity, q, 1)[0])
    return checks.positive_number(sigma_w2, "sigma_w2", where)


def _network(nonlinearity, weights, depth, q_star, sigma_w2, where):
    """The checked arguments of a deep network at ``q_star``: (nonlinearity, weights, L, q, sigma_w2),
    ``sigma_w2=None`` meaning the critical line (``sigma_w2 mu_1 = 1``)."""
    nl = _nonlinearity(nonlinearity, where)
    weights = _weights(weights, where)
    L = checks.positive_int(depth, "depth", where)
    q = _q_star(q_star, where)
    return nl, weights, L, q, _sigma_w2(nl.name, q, sigma_w2, where)


def jacobian_moments(nonlinearity: str, weights: str, depth: int, q_star: float, sigma_w2=None):
    """``(m1, m2)`` of the spectrum of ``J J^T`` (002 Eq. 21).

    ``m1 = (sigma_w2 mu_1)^L``, ``m2 = (sigma_w2 mu_1)^(2L) L (mu_2 / mu_1^2 + 1/L - 1 - s_1)``,
    with ``s_1 = 0`` (orthogonal) or ``-1`` (Gaussian). ``sigma_w2=None`` puts the network on the
    critical line at ``q_star`` (``sigma_w2 mu_1 = 1``); then ``m2 - m1^2 = L (mu_2 / mu_1^2 - 1
    - s_1)`` (002 Eq. 22, Table 1). Weight names as in :mod:`deqlab.ensembles`.

    Args:
        nonlinearity: one of :data:`NONLINEARITIES`.
        weights: one of :data:`WEIGHTS`.
        depth: L, an integer >= 1.
        q_star: ``q* > 0``.
        sigma_w2: the weight variance (> 0); None: the critical line.

    Returns:
        ``(m1, m2)``, two Python floats.

    Raises:
        ValueError: an argument is unknown or out of range.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> fp.jacobian_moments("relu", "orthogonal", depth=4, q_star=1.0)  # m2 - m1^2 = L (1/p - 1)
        (1.0, 5.0)
    """
    where = "theory.freeprob.jacobian_moments"
    nl, weights, L, q, sw2 = _network(nonlinearity, weights, depth, q_star, sigma_w2, where)
    mu1, mu2 = slope_moments(nl.name, q, 2)
    chi = sw2 * mu1
    m1 = chi**L
    m2 = chi ** (2 * L) * L * (mu2 / mu1**2 + 1.0 / L - 1.0 - _S1[weights])
    return float(m1), float(m2)


def jacobian_atoms(nonlinearity: str, weights: str, depth: int, q_star: float, sigma_w2=None):
    """Point masses of the spectrum of ``J J^T`` (002 §3.3; free-probability atom counting).

    Bernoulli class with ``p < 1``: ``1 - p`` at 0 (the kernel of any ``D_l``). Orthogonal
    weights: ``max(0, 1 - L (1 - p))`` at ``sigma_w2^L``, the directions that every ``D_l``
    passes (dimension ``N - L (1 - p) N``); for linear orthogonal networks this is the whole
    spectrum (``delta(lambda - sigma_w2^L)``, 002 §4.3.1). Smooth nonlinearities: none.

    Args:
        nonlinearity: one of :data:`NONLINEARITIES`.
        weights: one of :data:`WEIGHTS`.
        depth: L, an integer >= 1.
        q_star: ``q* > 0``.
        sigma_w2: the weight variance (> 0); None: the critical line.

    Returns:
        ``((location, mass), ...)``.

    Raises:
        ValueError: an argument is unknown or out of range.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> fp.jacobian_atoms("relu", "orthogonal", depth=1, q_star=1.0)
        ((0.0, 0.5), (2.0, 0.5))
    """
    where = "theory.freeprob.jacobian_atoms"
    nl, weights, L, q, sw2 = _network(nonlinearity, weights, depth, q_star, sigma_w2, where)
    atoms = []
    if nl.binary_slope:
        p = bernoulli_p(nl.name, q)
        if p < 1:
            atoms.append((0.0, 1.0 - p))
        if weights == "orthogonal" and 1 - L * (1 - p) > 0:
            atoms.append((sw2**L, 1.0 - L * (1 - p)))
    return tuple(atoms)


@dataclass
class JacobianDensity:
    """Result of :func:`jacobian_density`: continuous density on ``lam`` plus the atoms.

    Attributes:
        lam: the points.
        density: the continuous density at ``lam`` (atoms removed).
        atoms: the point masses, ``((location, mass), ...)`` (:func:`jacobian_atoms`).
        m1: the first moment (:func:`jacobian_moments`).
        m2: the second moment.
        eps: the final imaginary part per point.
        residual: the root-following residual per point.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> result = fp.jacobian_density("relu", "gaussian", depth=2, q_star=1.0, lam=[0.5, 1.0])
        >>> result.atoms, result.density.round(4).tolist()
        (((0.0, 0.5),), [0.1602, 0.0965])
    """

    lam: np.ndarray
    density: np.ndarray
    atoms: tuple
    m1: float
    m2: float
    eps: float
    residual: np.ndarray = field(repr=False)


def jacobian_density(
    nonlinearity: str,
    weights: str,
    depth: int,
    q_star: float,
    lam,
    sigma_w2=None,
    eps: float = 1e-9,
    n_nodes: int = 256,
    ratio: float = 1.1,
) -> JacobianDensity:
    """Spectral density of ``J J^T`` from the master equation (002 Eq. 14-16) by Algorithm 1.

    With ``x = M_{JJ^T}(z) = z G(z) - 1`` the master equation reads
    ``x = M_{D^2}(z^(1/L) F(x))``, ``F(x) = S_{W^T W}(x) ((1 + x) / x)^(1 - 1/L)`` (Eq. 14, 16),
    principal branches (valid since ``Im x < 0`` for ``Im z > 0``). Each ``lam`` is approached
    along ``lam + i t``, ``t`` from ``1e4 max(1, lam)`` down to ``eps`` (Algorithm 1, nearest
    root by Newton continuation), and ``rho = -Im[G - sum_a m_a / (z - a)] / pi`` with the atoms
    of :func:`jacobian_atoms` removed explicitly.

    Args:
      lam: points ``> 0`` (finite) at which to evaluate the density; the spectrum of ``J J^T``
        lies on ``[0, inf)`` and the branch ``z^(1/L)`` is cut along the negative axis.
      sigma_w2: ``None`` for the critical line at ``q_star`` (Table 1).
      eps: final imaginary part (``> 0``; the bias is ``O(eps)`` in the bulk), a scalar or one
        per point (e.g. ``1e-7 * lam`` on a logarithmic grid).
      n_nodes: Gauss-Hermite nodes of :func:`squared_slope_spectrum` (an integer ``>= 1``).
    Raises:
      ValueError: bad arguments; ConvergenceError: root following failed.

    Returns:
        A :class:`JacobianDensity`.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> result = fp.jacobian_density("linear", "gaussian", depth=1, q_star=1.0, lam=[1.0])
        >>> round(float(result.density[0]), 4)  # Marchenko-Pastur at 1: sqrt(3) / (2 pi)
        0.2757
    """
    where = "theory.freeprob.jacobian_density"
    nl, weights, L, q, sw2 = _network(nonlinearity, weights, depth, q_star, sigma_w2, where)
    lam = real_points(lam, where, "lam", positive=True)
    n_nodes = checks.positive_int(n_nodes, "n_nodes", where)
    eps = np.asarray(eps, dtype=np.float64)
    if eps.ndim == 0:
        eps = np.full(lam.shape, checks.positive_number(float(eps), "eps", where))
    elif eps.shape != lam.shape or not np.all(np.isfinite(eps) & (eps > 0)):
        raise checks.fail("eps", f"> 0 and finite, a scalar or one value per point of `lam` "
                          f"(shape {lam.shape})", eps, where)
    m1, m2 = jacobian_moments(nl.name, weights, L, q, sw2)
    atoms = jacobian_atoms(nl.name, weights, L, q, sw2)
    if nl.name == "linear" and weights == "orthogonal":
        return JacobianDensity(lam, np.zeros_like(lam), atoms, m1, m2, eps, np.zeros_like(lam))
    d2 = squared_slope_spectrum(nl.name, q, n_nodes)
    w = weight_spectrum(weights, sw2)
    a = 1.0 - 1.0 / L

    def f(x, z):
        y = z ** (1.0 / L) * w.s_transform(x) * ((1 + x) / x) ** a
        return x - d2.mgf(y)

    def x_init(z):
        return m1 / z + m2 / z**2

    z, x, res = follow_roots(f, x_init, lam, eps, ratio=ratio)
    g = (1 + x) / z
    for loc, mass in atoms:
        g = g - mass / (z - loc)
    return JacobianDensity(lam, -np.imag(g) / np.pi, atoms, m1, m2, eps, res)
