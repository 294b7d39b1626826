"""Elementary spectra with closed-form transforms (002 Tables 1-2, 001 App. C).

Normalisations against :mod:`deqlab.ensembles` (``W = scale * W0``, ``scale = sqrt(V)``):

- :class:`Semicircle` ``(V)``: a GOE ``W`` with off-diagonal variance ``V / N``, i.e.
  ``sample("goe", key, n, sqrt(V))`` (001 App. C; radius ``2 sqrt(V)``).
- :class:`MarchenkoPastur` ``(V)``: ``W^T W`` for ``W = sample("gaussian", key, n, sqrt(V))``,
  entries ``N(0, V / N)`` (002 Table 2 with ``sigma_w^2 = V``).
- :class:`ScaledIdentity` ``(V)``: ``W^T W = V I`` for ``W = sample("orthogonal", key, n,
  sqrt(V))`` (002 Table 2).
- :class:`Bernoulli` ``(p)``: ``D^2`` for the piecewise-linear nonlinearities (002 Table 1).
- :class:`PointMasses`, :func:`samples`: a finite (e.g. empirical) spectrum.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from deqlab import checks
from deqlab.theory.freeprob.transforms import (
    _CHECKING,
    Spectrum,
    complex_argument,
    real_points,
    sqrt_with_cut,
    transform_argument,
)

__all__ = [
    "PointMasses",
    "samples",
    "Bernoulli",
    "ScaledIdentity",
    "Semicircle",
    "MarchenkoPastur",
]


class PointMasses(Spectrum):
    """A finite sum of point masses ``sum_i w_i delta(t - a_i)`` (e.g. an empirical spectrum).

    Args:
        locations: the points ``a_i``, finite real numbers (at least one).
        weights: the masses ``w_i``, non-negative and summing to 1; None: uniform.

    Attributes:
        locations: the points, float64.
        weights: the masses, float64.
        atoms: ``((a_i, w_i), ...)``.

    Raises:
        ValueError: ``locations`` is empty or not finite, or ``weights`` does not match it, has a
            negative entry or does not sum to 1.

    Example:
        >>> from deqlab.theory.freeprob import PointMasses
        >>> spectrum = PointMasses([1.0, 3.0], [0.25, 0.75])
        >>> spectrum.moment(1), complex(spectrum.mgf(5.0))
        (2.5, (1.1875+0j))
    """

    def __init__(self, locations, weights=None):
        where = self._where("__init__")
        a = real_points(locations, where, "locations").ravel()
        if a.size == 0:
            raise checks.fail("locations", "a non-empty array of finite numbers", locations, where)
        w = np.full(a.size, 1.0 / a.size) if weights is None else np.asarray(weights, np.float64).ravel()
        if w.shape != a.shape or np.any(w < 0) or not math.isclose(w.sum(), 1.0, rel_tol=1e-9):
            raise checks.fail("weights", f"{a.size} non-negative numbers (one per location) "
                              "summing to 1", weights, where)
        self.locations, self.weights = a, w
        self.atoms = tuple(zip(a.tolist(), w.tolist()))

    def stieltjes(self, z):
        # real z is fine except at the locations themselves: an empty "support" admits it
        z = complex_argument(z, self._where("stieltjes"), support=(math.inf, -math.inf))
        if np.any((z.imag == 0) & np.isin(z.real, self.locations)):
            raise checks.fail("z", "different from every point mass location (for a density use "
                              "density(x, eps))", z[(z.imag == 0) & np.isin(z.real, self.locations)][0],
                              self._where("stieltjes"))
        return np.sum(self.weights / (z[..., None] - self.locations), axis=-1)

    def _mgf_argument(self, z):
        """``z`` of :meth:`mgf`: finite, and off the nonzero locations (the poles of ``M``)."""
        where = self._where("mgf")
        z = transform_argument(z, where, "z")
        if not _CHECKING.get():  # inside follow_roots (transforms._CHECKING)
            return z
        on_axis = z.imag == 0
        if np.any(on_axis):
            poles = self.locations[(self.locations != 0) & (self.weights > 0)]
            hit = on_axis & np.isin(z.real, poles)
            if np.any(hit):
                raise checks.fail("z", "finite complex numbers off the nonzero point mass locations "
                                  "(the poles of M(z))", complex(z[hit].ravel()[0]), where)
        return z

    def mgf(self, z):
        """``M(z) = sum_i w_i a_i / (z - a_i)``; ``z`` finite and not a nonzero location.

        Computed without the cancellation of ``z G - 1`` at large ``z``.

        Args:
            z: complex numbers.

        Returns:
            ``M(z)``, complex.

        Raises:
            ValueError: ``z`` is not finite or is a nonzero location.
        """
        z = self._mgf_argument(z)
        a = self.locations[self.locations != 0]  # a mass at 0 adds nothing (no 0 / 0 at z = 0)
        w = self.weights[self.locations != 0]
        return np.sum((w * a) / (z[..., None] - a), axis=-1)

    def moment(self, k: int) -> float:
        return float(np.sum(self.weights * self.locations**k))

    def continuous_density(self, x, eps: float):
        return np.zeros(np.shape(x))


def samples(eigenvalues) -> PointMasses:
    """The empirical spectral measure of sampled eigenvalues (002 Eq. 6).

    Args:
        eigenvalues: real eigenvalues (any shape; flattened).

    Returns:
        A :class:`PointMasses` of equal weights.

    Raises:
        ValueError: ``eigenvalues`` is empty or not finite.

    Example:
        >>> import numpy as np
        >>> from deqlab.theory.freeprob import samples
        >>> round(samples(np.array([1.0, 2.0, 3.0])).moment(2), 6)
        4.666667
    """
    return PointMasses(eigenvalues)


class Bernoulli(PointMasses):
    """``p delta(t - 1) + (1 - p) delta(t)``: ``D^2`` for piecewise-linear nonlinearities.

    Closed forms (002 Table 1, 001 Eq. 111-114): ``M(z) = p / (z - 1)``,
    ``M^{-1}(w) = 1 + p / w``, ``S(w) = (1 + w) / (w + p)``; each refuses (``ValueError``) a
    non-finite argument and its pole (``z = 1``, ``w = 0``, ``w = -p``).

    Args:
        p: the mass at 1, in (0, 1].

    Attributes:
        p: the mass at 1.

    Raises:
        ValueError: ``p`` is not in (0, 1].

    Example:
        >>> from deqlab.theory.freeprob import Bernoulli
        >>> b = Bernoulli(0.5)
        >>> complex(b.mgf(3.0)), complex(b.s_transform(0.5))
        ((0.25+0j), (1.5+0j))
    """

    def __init__(self, p: float):
        p = checks.number(p, "p", self._where("__init__"), lower=0.0, upper=1.0, lower_open=True)
        self.p = p
        super().__init__([0.0, 1.0], [1.0 - p, p])

    def mgf(self, z):
        return self.p / (self._mgf_argument(z) - 1.0)

    def mgf_inverse(self, w, z0=None, **kw):
        """``M^{-1}(w) = 1 + p / w`` (``w != 0``); ``z0`` and Newton options are ignored.

        Args:
            w: complex numbers, not 0.
            z0: ignored.
            **kw: ignored.

        Returns:
            ``M^{-1}(w)``, complex.
        """
        w = transform_argument(w, self._where("mgf_inverse"), "w", (0.0,), "M^{-1}(w) = 1 + p / w")
        return 1.0 + self.p / w

    def s_transform(self, w):
        """``S(w) = (1 + w) / (w + p)`` (``w != -p``)."""
        w = transform_argument(w, self._where("s_transform"), "w", (-self.p,), "S(w) = (1 + w) / (w + p)")
        return (1 + w) / (w + self.p)


class ScaledIdentity(PointMasses):
    """``delta(t - V)``: ``W^T W = V I`` for ``W = sqrt(V)`` times a Haar orthogonal matrix.

    (``sigma_w^2 = V`` in 002 Table 2.) ``M^{-1}(w) = V (1 + w) / w`` (``w != 0``),
    ``S(w) = 1 / V`` (any finite ``w``).

    Args:
        V: the variance, > 0.

    Attributes:
        V: the variance.

    Raises:
        ValueError: ``V`` is not > 0.

    Example:
        >>> from deqlab.theory.freeprob import ScaledIdentity
        >>> complex(ScaledIdentity(2.0).s_transform(0.3))
        (0.5+0j)
    """

    def __init__(self, V: float):
        V = checks.positive_number(V, "V", self._where("__init__"))
        self.V = V
        super().__init__([V], [1.0])

    def mgf_inverse(self, w, z0=None, **kw):
        w = transform_argument(w, self._where("mgf_inverse"), "w", (0.0,), "M^{-1}(w) = V (1 + w) / w")
        return self.V * (1 + w) / w

    def s_transform(self, w):
        w = transform_argument(w, self._where("s_transform"), "w")
        return np.full(np.shape(w), 1.0 / self.V, dtype=np.complex128)


class Semicircle(Spectrum):
    """Wigner semicircle of variance ``V`` (GOE, off-diagonal variance ``V/N``), radius ``2 sqrt(V)``.

    ``G(z) = (z - sqrt(z^2 - 4V)) / (2V)`` with the square root cut on ``[-2 sqrt V, 2 sqrt V]``
    (001 Eq. 101, scaled). Its ``M^{-1}(w) = sqrt(V) (1 + w) / sqrt(w)`` and
    ``S(w) = 1 / sqrt(V w)`` are two-valued (``m_1 = 0``, so the generic Newton start
    ``m1 / w + m2 / m1`` does not exist): :meth:`mgf_inverse` and :meth:`s_transform` return the
    branch with the principal ``sqrt(w)``, the one with ``M^{-1}(w) -> +inf`` as ``w -> 0+``;
    the other branch is its negative. See also :class:`~deqlab.theory.freeprob.products.DWSpectrum`.

    Args:
        V: the variance, > 0.

    Attributes:
        V: the variance.
        radius: ``2 sqrt(V)``.

    Raises:
        ValueError: ``V`` is not > 0.

    Example:
        >>> from deqlab.theory.freeprob import Semicircle
        >>> s = Semicircle(1.0)
        >>> s.radius, s.moment(2), s.moment(4), complex(s.s_transform(0.25))
        (2.0, 1.0, 2.0, (2+0j))
    """

    def __init__(self, V: float = 1.0):
        self.V = checks.positive_number(V, "V", self._where("__init__"))
        self.radius = 2 * math.sqrt(self.V)

    def stieltjes(self, z):
        z = complex_argument(z, self._where("stieltjes"), support=(-self.radius, self.radius))
        return 2.0 / (z + sqrt_with_cut(z, -self.radius, self.radius))  # = (z - sqrt) / (2V), stable

    def density(self, x, eps: float = 0.0):
        """Exact density ``sqrt(4V - x^2) / (2 pi V)`` (``eps`` ignored).

        Args:
            x: real points.
            eps: ignored (the density is exact).

        Returns:
            The density at ``x``, float64.
        """
        x = real_points(x, self._where("density"))
        return np.sqrt(np.clip(self.radius**2 - x**2, 0, None)) / (2 * np.pi * self.V)

    continuous_density = density

    def mgf_inverse(self, w, z0=None, **kw):
        """``M^{-1}(w) = sqrt(V) (1 + w) / sqrt(w)``, principal ``sqrt``.

        From ``V G^2 - z G + 1 = 0`` with ``G = (1 + w) / z``, for finite ``w != 0``; ``z0`` and
        Newton options are not needed and ignored.

        Args:
            w: complex numbers, not 0.
            z0: ignored.
            **kw: ignored.

        Returns:
            ``M^{-1}(w)``, complex.
        """
        w = transform_argument(w, self._where("mgf_inverse"), "w", (0.0,),
                               "M^{-1}(w) = sqrt(V) (1 + w) / sqrt(w)")
        return math.sqrt(self.V) * (1 + w) / np.sqrt(w)

    def s_transform(self, w):
        """``S(w) = 1 / sqrt(V w)`` on the branch of :meth:`mgf_inverse`, finite ``w != 0``."""
        w = transform_argument(w, self._where("s_transform"), "w", (0.0,), "S(w) = 1 / sqrt(V w)")
        return 1.0 / np.sqrt(self.V * w)

    def moment(self, k: int) -> float:
        if k % 2:
            return 0.0
        j = k // 2
        return float(special.comb(2 * j, j) / (j + 1) * self.V**j)


class MarchenkoPastur(Spectrum):
    """Spectrum of ``W^T W`` for square Gaussian ``W`` with entries ``N(0, V/N)`` (002 Table 2).

    (``sigma_w^2 = V``.) Density ``sqrt(t (4 V - t)) / (2 pi V t)`` on ``[0, 4 V]``;
    ``G(z) = (z - sqrt(z (z - 4 V))) / (2 V z)``; ``M^{-1}(w) = V (1 + w)^2 / w`` (``w != 0``),
    ``S(w) = 1 / (V (1 + w))`` (``w != -1``).

    Args:
        V: the variance of the entries of ``W`` times ``N``, > 0.

    Attributes:
        V: the variance.

    Raises:
        ValueError: ``V`` is not > 0.

    Example:
        >>> from deqlab.theory.freeprob import MarchenkoPastur
        >>> mp = MarchenkoPastur(1.0)
        >>> mp.moment(2), complex(mp.s_transform(1.0))
        (2.0, (0.5+0j))
    """

    def __init__(self, V: float = 1.0):
        self.V = checks.positive_number(V, "V", self._where("__init__"))

    def stieltjes(self, z):
        z = complex_argument(z, self._where("stieltjes"), support=(0.0, 4 * self.V))
        return 2.0 / (z + sqrt_with_cut(z, 0.0, 4 * self.V))  # = (z - sqrt) / (2 V z), stable

    def mgf_inverse(self, w, z0=None, **kw):
        w = transform_argument(w, self._where("mgf_inverse"), "w", (0.0,), "M^{-1}(w) = V (1 + w)^2 / w")
        return self.V * (1 + w) ** 2 / w

    def s_transform(self, w):
        w = transform_argument(w, self._where("s_transform"), "w", (-1.0,), "S(w) = 1 / (V (1 + w))")
        return 1.0 / (self.V * (1 + w))

    def density(self, x, eps: float = 0.0):
        """Exact density (``eps`` ignored).

        Args:
            x: real points.
            eps: ignored.

        Returns:
            The density at ``x``, float64 (0 outside ``(0, 4V)``).
        """
        x = real_points(x, self._where("density"))
        inside = (x > 0) & (x < 4 * self.V)
        xs = np.where(inside, x, 1.0)
        return np.where(inside, np.sqrt(xs * (4 * self.V - xs)) / (2 * np.pi * self.V * xs), 0.0)

    continuous_density = density

    def moment(self, k: int) -> float:
        return float(special.comb(2 * k, k) / (k + 1) * self.V**k)  # Catalan numbers
