"""Operator-valued free probability: linear pencils (001 App. C.2).

The spectrum of ``A = (I - W)^-T (I - W)^-1``, whose moments are the fixed-point statistics of
chapter 1 (``tr A = tr[M^T M]``, ``tr A^2`` half the length variance), from the matrix-valued
Cauchy transform of a linear pencil. ``W = sample(ensemble, key, n, sqrt(V))`` of
:mod:`deqlab.ensembles`; every ``V`` here is that variance (the scale is ``sqrt(V)``), and the
spectrum is bounded only below the ensemble's critical variance
``V_c =`` :func:`deqlab.ensembles.critical_variance` (001 §2.1.2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from deqlab import checks, ensembles
from deqlab.theory.freeprob.transforms import ConvergenceError, complex_argument, sqrt_with_cut

__all__ = [
    "Pencil",
    "PencilResult",
    "pencil_cauchy",
    "pencil_moments",
    "length_pencil",
    "goe_resolvent_pencil",
    "goe_resolvent_mgf",
    "ginibre_length_cubic",
    "goe_length_m2",
    "ginibre_length_m2",
    "length_spectrum_edges",
]


def _subcritical_V(V, ensemble: str, where: str) -> float:
    """``V`` checked to lie in ``(0, V_c)`` of ``ensemble`` (``V_c`` from the ensemble registry)."""
    vc = ensembles.critical_variance(ensemble)
    requirement = (f"a finite real number in (0, V_c) = (0, {vc:g}) for the {ensemble!r} ensemble "
                   "(at and above V_c the spectral radius of W reaches 1 and (I - W)^-1 is unbounded)")
    try:
        return checks.number(V, "V", where, lower=0.0, upper=vc, lower_open=True, upper_open=True)
    except ValueError:
        raise checks.fail("V", requirement, V, where) from None


def _ensemble(ensemble, options: Sequence[str], where: str) -> str:
    checks.choice(ensemble, "ensemble", ensembles.ENSEMBLES, where)
    return checks.choice(ensemble, "ensemble", options, where)


@dataclass
class Pencil:
    """A linear pencil ``Lambda - P_hat = Z(z) - sum_a A_a ⊗ X_a`` (001 Eq. 125-132).

    ``X_a`` are self-adjoint, centred, asymptotically free semicircular elements with
    covariance ``tr(X_a X_b) = cov[a, b]``; ``Z(z) = Lambda(z) - M_hat`` is the constant part
    (``k x k``, ``Lambda = diag(z, 0, ...)``). The covariance map of Eq. 131-132 is then
    ``eta(G) = sum_ab cov[a, b] A_a G A_b``.

    Attributes:
        z_matrix: ``z -> Z(z)``, complex ``(..., k, k)``.
        coeffs: the ``k x k`` matrices ``A_a``.
        cov: the covariance matrix ``cov[a, b]``.

    Example:
        >>> import numpy as np
        >>> from deqlab.theory import freeprob as fp
        >>> pencil = fp.goe_resolvent_pencil(0.1)
        >>> pencil.eta(np.eye(2)).real.tolist()  # diag(0, V G_22)
        [[0.0, 0.0], [0.0, 0.1]]
    """

    z_matrix: Callable  # z -> (..., k, k) complex
    coeffs: Sequence[np.ndarray]
    cov: np.ndarray

    def eta(self, g):
        """The covariance map ``eta(G) = sum_ab cov[a, b] A_a G A_b`` (001 Eq. 131).

        Args:
            g: matrices ``G``, ``(..., k, k)``.

        Returns:
            ``eta(G)``, of ``g``'s shape.
        """
        out = np.zeros_like(g)
        for i, a in enumerate(self.coeffs):
            for j, b in enumerate(self.coeffs):
                if self.cov[i, j] != 0:
                    out = out + self.cov[i, j] * (a @ g @ b)
        return out


@dataclass
class PencilResult:
    """Operator-valued Cauchy transform ``G`` per point, with iteration diagnostics.

    Attributes:
        g: ``G`` per point, ``(points, k, k)``.
        iterations: the iterations done.
        residual: ``|Z G - 1 - eta(G) G|`` per point.
        converged: per point, whether the relative change fell below ``tol``.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> result = fp.pencil_cauchy(fp.goe_resolvent_pencil(0.1), [2j])
        >>> bool(result.converged[0]), result.g.shape
        (True, (1, 2, 2))
    """

    g: np.ndarray
    iterations: int
    residual: np.ndarray
    converged: np.ndarray


def pencil_cauchy(pencil: Pencil, z, damping: float = 0.5, tol: float = 1e-13,
                  max_iter: int = 20000, aux_eps: float = 0.0, check: bool = True) -> PencilResult:
    """Matrix-valued Cauchy transform ``G = E[(Lambda - P_hat)^-1]`` of a pencil (001 Eq. 130).

    Solves ``Z G = 1 + eta(G) G`` by the damped fixed point ``G <- (1 - d) G + d (Z -
    eta(G))^-1`` from ``G = Z^-1``. ``aux_eps`` adds ``i aux_eps`` to the auxiliary diagonal
    blocks (the usual regularisation; 0 is fine away from the spectrum). Convergence (relative
    change ``< tol``) is reported per point; ``check`` raises :class:`ConvergenceError`.
    ``z`` must be finite; real points are allowed (outside the spectrum the iteration converges).

    Args:
        pencil: the :class:`Pencil`.
        z: finite complex points.
        damping: the step fraction ``d``, in (0, 1].
        tol: the relative-change tolerance, > 0.
        max_iter: the most iterations, an integer >= 1.
        aux_eps: regularisation of the auxiliary blocks, >= 0.
        check: raise when a point did not converge.

    Returns:
        A :class:`PencilResult`.

    Raises:
        ValueError: an argument is out of range or ``z`` is not finite.
        ConvergenceError: with ``check``, a point did not converge.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> g11 = fp.pencil_cauchy(fp.goe_resolvent_pencil(0.1), [2j]).g[0, 0, 0]
        >>> exact = (fp.goe_resolvent_mgf(2j, 0.1) + 1) / 2j  # G = (1 + M) / z, 001 Eq. 141
        >>> bool(abs(g11 - exact) < 1e-10)
        True
    """
    where = "theory.freeprob.pencil_cauchy"
    damping = checks.unit_interval(damping, "damping", where)
    tol = checks.positive_number(tol, "tol", where)
    max_iter = checks.positive_int(max_iter, "max_iter", where)
    aux_eps = checks.number(aux_eps, "aux_eps", where, lower=0.0)
    z = np.atleast_1d(complex_argument(z, where, support=(math.inf, -math.inf)))
    zm = pencil.z_matrix(z)
    k = zm.shape[-1]
    if aux_eps:
        zm = zm + 1j * aux_eps * np.diag([0.0] + [1.0] * (k - 1))
    g = np.linalg.inv(zm)
    change = np.full(z.shape, np.inf)
    for it in range(1, max_iter + 1):
        new = (1 - damping) * g + damping * np.linalg.inv(zm - pencil.eta(g))
        change = np.max(np.abs(new - g), axis=(-2, -1)) / (1 + np.max(np.abs(new), axis=(-2, -1)))
        g = new
        if np.all(change < tol):
            break
    residual = np.max(np.abs(zm @ g - np.eye(k) - pencil.eta(g) @ g), axis=(-2, -1))
    converged = (change < tol) & np.isfinite(residual)
    if check and not np.all(converged):
        raise ConvergenceError(
            f"pencil_cauchy: {np.sum(~converged)} point(s) not converged after {it} iterations "
            f"(largest change {np.max(change):.3g})"
        )
    return PencilResult(g, it, residual, converged)


def pencil_moments(pencil: Pencil, kmax: int, radius: float, n_points: int = 256, **kw):
    """Moments ``m_1..m_kmax`` of the spectrum whose Stieltjes transform is ``G_11``.

    ``M(z) = z G_11(z) - 1 = sum_k m_k z^-k`` is sampled on the circle ``|z| = radius`` (which
    must enclose the spectrum, see :func:`length_spectrum_edges`) and
    ``m_k = radius^k mean(M e^{i k theta})`` (trapezoid rule, exponentially accurate). The
    points sit at half-steps of the angle, so none is on the real axis.

    Args:
      kmax: number of moments, an integer ``>= 1``.
      radius: radius of the contour, ``> 0``.
      n_points: points on the contour, an integer ``> kmax`` (the trapezoid rule resolves
        ``e^{i k theta}`` only for ``k < n_points``).

    Returns:
        A float64 array ``[m_1, ..., m_kmax]``.

    Raises:
        ValueError: ``kmax < 1``, ``radius <= 0`` or ``n_points <= kmax``; the errors of
            :func:`pencil_cauchy` (``**kw`` are its options).

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> lo, hi = fp.length_spectrum_edges("goe", 0.1)
        >>> m1, m2 = fp.pencil_moments(fp.length_pencil("goe", 0.1), 2, radius=1.5 * hi, n_points=64)
        >>> bool(abs(m2 - fp.goe_length_m2(0.1)) < 1e-8)  # 001 Eq. 148
        True
    """
    where = "theory.freeprob.pencil_moments"
    kmax = checks.positive_int(kmax, "kmax", where)
    radius = checks.positive_number(radius, "radius", where)
    n_points = checks.integer(n_points, "n_points", where, minimum=kmax + 1)
    theta = 2 * np.pi * (np.arange(n_points) + 0.5) / n_points
    z = radius * np.exp(1j * theta)
    res = pencil_cauchy(pencil, z, **kw)
    m = z * res.g[:, 0, 0] - 1
    return np.array([radius**k * np.mean(m * np.exp(1j * k * theta)).real for k in range(1, kmax + 1)])


def length_pencil(ensemble: str, V: float) -> Pencil:
    """3x3 pencil of ``(I - W)^-T (I - W)^-1`` (001 Eq. 151-158), ``W = X + iY`` (Eq. 149-150).

    ``Z = [[z, -1, 0], [-1, 1, 0], [0, 0, -1]]`` (Eq. 155), ``A_X = [[0,0,0],[0,2,-1],[0,-1,0]]``,
    ``A_Y = [[0,0,0],[0,0,-i],[0,i,0]]`` (Eq. 156), covariances ``tr X^2``, ``tr Y^2``:
    ``"gaussian"`` (Ginibre, entries ``V/N``) ``(V/2, V/2)``, reproducing Eq. 159-162 and the
    cubic Eq. 188; ``"goe"`` (off-diagonal ``V/N``) ``(V, 0)``, i.e. ``(I - W)^-2``;
    ``"antisymmetric"`` (entries ``V/N``) ``(0, V)``, i.e. ``(I + W W^T)^-1``.

    ``V`` must lie in ``(0, V_c)`` of the ensemble (:func:`deqlab.ensembles.critical_variance`:
    1 for Ginibre, 1/4 for GOE and antisymmetric).

    Args:
        ensemble: ``"gaussian"``, ``"goe"`` or ``"antisymmetric"``.
        V: the variance, in ``(0, V_c)``.

    Returns:
        A :class:`Pencil` with ``k = 3``.

    Raises:
        ValueError: ``ensemble`` is not one of the three, or ``V`` is not in ``(0, V_c)``.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> pencil = fp.length_pencil("gaussian", 0.5)
        >>> pencil.cov.real.diagonal().tolist()  # (tr X^2, tr Y^2)
        [0.25, 0.25]
    """
    where = "theory.freeprob.length_pencil"
    ensemble = _ensemble(ensemble, ("gaussian", "goe", "antisymmetric"), where)
    v = _subcritical_V(V, ensemble, where)
    covs = {"gaussian": (v / 2, v / 2), "goe": (v, 0.0), "antisymmetric": (0.0, v)}
    ax = np.array([[0, 0, 0], [0, 2, -1], [0, -1, 0]], dtype=np.complex128)
    ay = np.array([[0, 0, 0], [0, 0, -1j], [0, 1j, 0]], dtype=np.complex128)

    def zmat(z):
        out = np.zeros(z.shape + (3, 3), dtype=np.complex128)
        out[..., 0, 0] = z
        out[..., 0, 1] = out[..., 1, 0] = -1
        out[..., 1, 1] = 1
        out[..., 2, 2] = -1
        return out

    return Pencil(zmat, (ax, ay), np.diag(covs[ensemble]).astype(np.complex128))


def goe_resolvent_pencil(V: float) -> Pencil:
    """2x2 pencil of ``(I - W)^-1`` for GOE ``W`` of variance ``V`` (001 Eq. 129, 133-134).

    ``Z = [[z, -1], [-1, 1]]``, ``A = [[0, 0], [0, 1]]``, ``eta(G) = diag(0, V G_22)``.

    Args:
        V: the variance, in ``(0, 1/4)``.

    Returns:
        A :class:`Pencil` with ``k = 2``.

    Raises:
        ValueError: ``V`` is not in ``(0, 1/4)``.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> fp.goe_resolvent_pencil(0.1).cov.real.tolist()
        [[0.1]]
    """
    v = _subcritical_V(V, "goe", "theory.freeprob.goe_resolvent_pencil")

    def zmat(z):
        out = np.zeros(z.shape + (2, 2), dtype=np.complex128)
        out[..., 0, 0] = z
        out[..., 0, 1] = out[..., 1, 0] = -1
        out[..., 1, 1] = 1
        return out

    return Pencil(zmat, (np.array([[0, 0], [0, 1]], dtype=np.complex128),), np.array([[v]], dtype=np.complex128))


def goe_resolvent_mgf(z, V: float):
    """``M(z)`` of ``(I - W)^-1``, GOE ``W`` of variance ``V`` (001 Eq. 141).

    ``((z-1) - sqrt((z-1)^2 - 4 V z^2)) / (2 V z^2)``, the root of the quadratic Eq. 138 with
    ``M ~ 1/z``.

    Args:
        z: finite complex numbers off the real axis.
        V: the variance, in ``(0, 1/4)``.

    Returns:
        ``M(z)``, complex.

    Raises:
        ValueError: ``V`` is not in ``(0, 1/4)``, or ``z`` is not finite or is real.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> m = complex(fp.goe_resolvent_mgf(1e4j, 0.1))
        >>> round((m * 1e4j).real, 3)  # M ~ m_1 / z with m_1 = tr (I - W)^-1 = f_c(V)
        1.127
    """
    where = "theory.freeprob.goe_resolvent_mgf"
    v = _subcritical_V(V, "goe", where)
    z = complex_argument(z, where)
    r = 2 * math.sqrt(v)
    # (z-1)^2 - 4 V z^2 = (1 - 4V) (z - a)(z - b) with cut between the roots a, b
    a, b = 1 / (1 + r), 1 / (1 - r)
    s = math.sqrt(1 - 4 * v) * sqrt_with_cut(z, a, b)
    return 2.0 / ((z - 1) + s)  # = ((z - 1) - s) / (2 V z^2) without cancellation


def ginibre_length_cubic(m, z, V: float):
    """Left side of 001 Eq. 188: ``V^2 z^2 M^3 + 2 V z M^2 + ((V - 1) z + 1) M + 1``.

    For Ginibre ``W`` of variance ``V``; zero at ``M = M(z)`` of ``(I - W)^-T (I - W)^-1``.

    Args:
        m: values of ``M`` (complex).
        z: the spectral variable (complex).
        V: the variance (not checked: the cubic is a polynomial).

    Returns:
        The cubic's value, of the broadcast shape.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> fp.ginibre_length_cubic(0.0, 1.0, 0.5)
        1.0
    """
    v = V
    return v**2 * z**2 * m**3 + 2 * v * z * m**2 + ((v - 1) * z + 1) * m + 1


def goe_length_m2(V: float) -> float:
    """``tr[((I-W)^-T (I-W)^-1)^2]`` for GOE ``W`` of variance ``V`` (001 Eq. 148).

    Args:
        V: the variance, in ``(0, 1/4)``.

    Returns:
        The trace, a Python float (``= (1 - 4V)^{-5/2}``).

    Raises:
        ValueError: ``V`` is not in ``(0, 1/4)``.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> round(fp.goe_length_m2(0.2), 6)  # (1 - 4 V)^(-5/2)
        55.901699
    """
    v = _subcritical_V(V, "goe", "theory.freeprob.goe_length_m2")
    return (1 / (1 - 4 * v) ** 2.5 - 1 / (1 - 4 * v) ** 1.5) / (4 * v)


def ginibre_length_m2(V: float) -> float:
    """``tr[((I-W)^-T (I-W)^-1)^2]`` for Ginibre ``W`` of variance ``V`` (001 Eq. 191).

    Args:
        V: the variance, in ``(0, 1)``.

    Returns:
        The trace, a Python float (``= (1 - V)^{-4}``).

    Raises:
        ValueError: ``V`` is not in ``(0, 1)``.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> fp.ginibre_length_m2(0.5)
        16.0
    """
    v = _subcritical_V(V, "gaussian", "theory.freeprob.ginibre_length_m2")
    return v**2 / (1 - v) ** 4 + 2 * v / (1 - v) ** 3 + 1 / (1 - v) ** 2


def length_spectrum_edges(ensemble: str, V: float) -> tuple[float, float]:
    """Edges ``(lo, hi)`` of the ``N -> inf`` spectrum of ``A = (I - W)^-T (I - W)^-1``.

    - ``"goe"`` (off-diagonal variance ``V / N``, ``0 < V < 1/4``): ``A = (I - W)^-2`` maps the
      semicircle ``[-2 sqrt V, 2 sqrt V]`` monotonically onto ``[(1 + 2 sqrt V)^-2,
      (1 - 2 sqrt V)^-2]`` (001 App. C.2.1).
    - ``"gaussian"`` (Ginibre, entries ``V / N``, ``0 < V < 1``): the edges are the real points
      where the cubic of 001 Eq. 188, ``a M^3 + b M^2 + c M + 1`` with ``a = V^2 z^2``,
      ``b = 2 V z``, ``c = (V - 1) z + 1``, has a double root. Its discriminant in ``M`` is
      ``-V^2 z^2 q(z)`` with ``q = 27 V^2 z^2 - 36 V z c + 32 V z - 4 c^2 + 4 c^3``; ``q(0) = 0``,
      and the two roots of the quadratic ``q(z) / z`` are the edges.

    ``hi`` is the radius :func:`pencil_moments` needs to exceed: a contour that cuts the
    support gives wrong moments without any convergence failure.

    Args:
        ensemble: ``"goe"`` or ``"gaussian"``.
        V: the variance, in ``(0, V_c)``.

    Returns:
        ``(lo, hi)``, two Python floats.

    Raises:
        ValueError: ``ensemble`` is not one of the two, or ``V`` is not in ``(0, V_c)``.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> lo, hi = fp.length_spectrum_edges("goe", 0.1)  # (1 +- 2 sqrt(V))^-2
        >>> round(lo, 6), round(hi, 6)
        (0.375247, 7.402531)
    """
    where = "theory.freeprob.length_spectrum_edges"
    ensemble = _ensemble(ensemble, ("goe", "gaussian"), where)
    v = _subcritical_V(V, ensemble, where)
    if ensemble == "goe":
        r = 2 * math.sqrt(v)
        return 1 / (1 + r) ** 2, 1 / (1 - r) ** 2
    z = np.polynomial.Polynomial([0.0, 1.0])
    c = np.polynomial.Polynomial([1.0, v - 1.0])
    disc = 27 * v**2 * z**2 - 36 * v * z * c + 32 * v * z - 4 * c**2 + 4 * c**3
    quadratic = np.polynomial.Polynomial(disc.coef[1:])  # disc(0) = 0: divide by z
    roots = np.sort(quadratic.roots().real)
    return float(roots[0]), float(roots[1])
