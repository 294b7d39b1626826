"""Double-scaling limits of deep Jacobian spectra: depth ``L -> inf`` at fixed
``sigma^2_{JJ^T} = sigma0_2`` (002 §5), and their two universality classes."""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from deqlab import checks, nonlinearities
from deqlab.theory.freeprob.jacobians import slope_moments
from deqlab.theory.freeprob.transforms import (
    Spectrum,
    complex_argument,
    follow_roots,
    real_points,
    transform_argument,
)

__all__ = ["double_scaling_q_star", "BernoulliLimit", "SmoothLimit"]


def double_scaling_q_star(nonlinearity: str, depth: int, sigma0_2: float) -> float:
    """``q*(L)`` with ``sigma^2_{JJ^T} = sigma0_2`` for orthogonal weights (002 §5, Eq. 26).

    Solves ``L (mu_2 / mu_1^2 - 1) = sigma0_2`` (002 Eq. 22 with ``s_1 = 0``); closed form for
    hard tanh (``p = L / (L + sigma0_2)``, ``q* = 1 / (2 erfinv(p)^2)``), root finding otherwise.

    Args:
        nonlinearity: a name of :data:`deqlab.nonlinearities.NONLINEARITIES` other than
            ``"linear"`` and ``"relu"`` (their ``mu_k`` do not depend on ``q*``).
        depth: L, an integer >= 1.
        sigma0_2: the target variance of the spectrum of ``J J^T``, > 0.

    Returns:
        ``q*``, a Python float.

    Raises:
        ValueError: ``nonlinearity`` is unknown, linear or ReLU, ``depth < 1`` or
            ``sigma0_2 <= 0``.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> round(fp.double_scaling_q_star("hard_tanh", depth=16, sigma0_2=0.25), 6)
        0.170303
    """
    where = "theory.freeprob.double_scaling_q_star"
    nl = nonlinearities.get(nonlinearity, where)
    L = checks.positive_int(depth, "depth", where)
    s0 = checks.positive_number(sigma0_2, "sigma0_2", where)
    if nl.name in ("linear", "relu"):
        others = [n for n in nonlinearities.NONLINEARITIES if n not in ("linear", "relu")]
        raise checks.fail("nonlinearity", "one with a double-scaling limit (mu_k depending on "
                          "q*): " + ", ".join(repr(n) for n in others), nonlinearity, where)
    target = s0 / L
    if nl.name == "hard_tanh":
        p = L / (L + s0)
        return float(1.0 / (2.0 * special.erfinv(p) ** 2))

    def g(logq):
        mu1, mu2 = slope_moments(nl.name, math.exp(logq), 2)
        return mu2 / mu1**2 - 1.0 - target

    return float(math.exp(optimize.brentq(g, math.log(1e-8), math.log(50.0), xtol=1e-14)))


class BernoulliLimit(Spectrum):
    """Bernoulli universality class, ``L -> inf`` at fixed ``sigma^2_{JJ^T} = sigma0_2`` (002 §5).

    ``S(w) = lim (1 + sigma0_2 w / (L (1 + w)))^(-L) = exp(-sigma0_2 w / (1 + w))`` (Eq. 28-29);
    ``G(z) = 1 / (z - exp(-W_0(-sigma0_2 / z)))`` (Eq. 30, principal Lambert W, Eq. 31). Bulk
    on ``[0, lambda_1]``, ``lambda_1 = e sigma0_2`` (Eq. 35), where ``-sigma0_2 / z`` meets the
    cut of ``W_0``; for ``sigma0_2 < 1`` an atom of mass ``1 - sigma0_2`` at
    ``lambda_2 = exp(sigma0_2)`` (Eq. 34; mass from the residue, equal to the limit of the
    free-projection count ``1 - L (1 - p)``). The density diverges like
    ``sigma0_2 / (lambda log^2 lambda)`` at 0 (a double pole of ``G'``, Eq. 34, but no atom).

    Args:
        sigma0_2: the variance ``sigma0^2 > 0``.

    Attributes:
        sigma0_2: the variance.
        edge: the right edge of the bulk, ``e sigma0_2``.
        atoms: the atom at ``exp(sigma0_2)`` when ``sigma0_2 < 1``.

    Raises:
        ValueError: ``sigma0_2`` is not > 0.

    Example:
        >>> from deqlab.theory import freeprob as fp
        >>> limit = fp.BernoulliLimit(0.25)
        >>> round(limit.edge, 6), [(round(a, 6), m) for a, m in limit.atoms]
        (0.67957, [(1.284025, 0.75)])
    """

    def __init__(self, sigma0_2: float):
        self.sigma0_2 = checks.positive_number(sigma0_2, "sigma0_2", self._where("__init__"))
        self.edge = math.e * self.sigma0_2
        self.atoms = ((math.exp(self.sigma0_2), 1.0 - self.sigma0_2),) if self.sigma0_2 < 1 else ()

    def s_transform(self, w):
        """``S(w) = exp(-sigma0_2 w / (1 + w))`` (002 Eq. 29), finite ``w != -1``.

        Args:
            w: complex numbers, not -1.

        Returns:
            ``S(w)``, complex.
        """
        w = transform_argument(w, self._where("s_transform"), "w", (-1.0,),
                               "S(w) = exp(-sigma0_2 w / (1 + w))")
        return np.exp(-self.sigma0_2 * w / (1 + w))

    def stieltjes(self, z):
        z = complex_argument(z, self._where("stieltjes"))
        return 1.0 / (z - np.exp(-special.lambertw(-self.sigma0_2 / z, 0)))

    def density(self, x, eps: float = 0.0):
        """Exact bulk density on the real axis (the atom is excluded; ``eps`` ignored).

        Args:
            x: real points.
            eps: ignored.

        Returns:
            The density at ``x``, float64 (0 outside ``(0, edge)``).
        """
        x = real_points(x, self._where("density"))
        xs = np.where(x > 0, x, 1.0)
        # z = x + i0 maps to -sigma0_2 / z = -sigma0_2 / x + i0: just above the cut of W_0
        w = special.lambertw(-self.sigma0_2 / xs + 1e-300j, 0)
        g = 1.0 / (xs - np.exp(-w))
        inside = (x > 0) & (x < self.edge)
        return np.where(inside, np.clip(-np.imag(g) / np.pi, 0, None), 0.0)

    continuous_density = density

    def moment(self, k: int) -> float:
        return {1: 1.0, 2: 1.0 + self.sigma0_2}[k]

    @staticmethod
    def small_lambda_mass(sigma0_2: float, delta: float) -> float:
        """Leading mass of the bulk on ``[0, delta]``: ``sigma0_2 / log(sigma0_2 / delta)``.

        Args:
            sigma0_2: the variance, > 0.
            delta: the interval's end, in ``(0, sigma0_2)``.

        Returns:
            The mass, a Python float.

        Raises:
            ValueError: ``sigma0_2 <= 0`` or ``delta`` not in ``(0, sigma0_2)``.
        """
        where = "theory.freeprob.BernoulliLimit.small_lambda_mass"
        sigma0_2 = checks.positive_number(sigma0_2, "sigma0_2", where)
        delta = checks.number(delta, "delta", where, lower=0.0, upper=sigma0_2, lower_open=True,
                              upper_open=True)
        return sigma0_2 / math.log(sigma0_2 / delta)


class SmoothLimit(Spectrum):
    """Smooth universality class (erf, SiLU, ...): ``S(w) = exp(-sigma0_2 w)`` (002 Eq. 36).

    ``x = M(z)`` solves ``(1 + x) exp(sigma0_2 x) = x z`` (a generalised Lambert W), found by
    root following. The edges are the critical values of ``z(x) = (1 + x) e^{sigma0_2 x} / x``
    at ``x_± = (-1 ± sqrt(1 + 4 / sigma0_2)) / 2``: ``lambda_± = z(x_±)``, so that the
    singular-value edges are ``s_± = sqrt(lambda_±)`` (002 Eq. 37; ``0.57`` and ``1.56`` for
    ``sigma0_2 = 1/4``). No atoms.

    Args:
        sigma0_2: the variance ``sigma0^2 > 0``.
        ratio: the geometric step of the root following, > 1.

    Attributes:
        sigma0_2: the variance.
        edges: ``(lambda_-, lambda_+)``, the edges of the spectrum of ``J J^T``.

    Raises:
        ValueError: ``sigma0_2 <= 0`` or ``ratio <= 1``.

    Example:
        >>> import math
        >>> from deqlab.theory import freeprob as fp
        >>> [round(math.sqrt(edge), 2) for edge in fp.SmoothLimit(0.25).edges]  # 002 Eq. 37
        [0.57, 1.56]
    """

    def __init__(self, sigma0_2: float, ratio: float = 1.1):
        where = self._where("__init__")
        self.sigma0_2 = checks.positive_number(sigma0_2, "sigma0_2", where)
        self.ratio = checks.number(ratio, "ratio", where, lower=1.0, lower_open=True)
        r = math.sqrt(1 + 4 / self.sigma0_2)
        xs = ((-1 - r) / 2, (-1 + r) / 2)
        self.edges = tuple(float((1 + x) * math.exp(self.sigma0_2 * x) / x) for x in xs)

    def s_transform(self, w):
        """``S(w) = exp(-sigma0_2 w)`` (002 Eq. 36), finite ``w``.

        Args:
            w: complex numbers.

        Returns:
            ``S(w)``, complex.
        """
        return np.exp(-self.sigma0_2 * transform_argument(w, self._where("s_transform"), "w"))

    def _f(self, x, z):
        return (1 + x) * np.exp(self.sigma0_2 * x) - x * z

    def stieltjes(self, z):
        z = complex_argument(z, self._where("stieltjes"))
        flip = z.imag < 0
        zz = np.where(flip, np.conj(z), z)
        zk, x, _ = follow_roots(self._f, lambda z: 1 / z + (1 + self.sigma0_2) / z**2,
                                zz.real.ravel(), zz.imag.ravel(), ratio=self.ratio)
        out = ((1 + x) / zk).reshape(zz.shape)
        return np.where(flip, np.conj(out), out)

    def moment(self, k: int) -> float:
        return {1: 1.0, 2: 1.0 + self.sigma0_2}[k]
