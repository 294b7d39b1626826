"""Free multiplicative convolutions: ``A ⊠ B`` (002 Eq. 12-14) and ``D W`` for GOE ``W``
(001 App. C.1), evaluated by root following (002 Algorithm 1)."""

from __future__ import annotations

import math

import numpy as np

from deqlab import checks
from deqlab.theory.freeprob.transforms import Spectrum, complex_argument, follow_roots

__all__ = ["FreeProduct", "DWSpectrum"]


def _check_spectrum(spectrum, name: str, where: str) -> None:
    if not isinstance(spectrum, Spectrum):
        raise checks.fail(name, "a Spectrum of deqlab.theory.freeprob (e.g. fp.Bernoulli(0.5))",
                          spectrum, where)


class FreeProduct(Spectrum):
    """Free multiplicative convolution ``A ⊠ B`` via ``S_AB = S_A S_B`` (002 Eq. 12).

    ``A`` needs only its :meth:`Spectrum.mgf`, ``B`` a closed-form :meth:`Spectrum.s_transform`.
    With ``x = M_AB(z)``: ``M_A^{-1}(x) = z S_B(x)``, i.e. ``x = M_A(z S_B(x))`` (002 Eq. 14 with
    ``L = 1``), solved by :func:`follow_roots`. Both spectra must lie on ``[0, inf)``.

    Args:
        a: the spectrum of ``A``.
        b: the spectrum of ``B`` (with a closed-form S-transform).
        ratio: the geometric step of the root following, > 1.

    Attributes:
        a: the spectrum of ``A``.
        b: the spectrum of ``B``.
        m1: the first moment ``m_1(A) m_1(B)``.
        atoms: the atom at 0 (the larger of the two factors' atoms at 0), if any.

    Raises:
        ValueError: ``a`` or ``b`` is not a :class:`Spectrum`, or ``ratio <= 1``.

    Example:
        >>> from deqlab.theory.freeprob import Bernoulli, FreeProduct, MarchenkoPastur
        >>> product = FreeProduct(Bernoulli(0.5), MarchenkoPastur(1.0))
        >>> product.moment(1), product.moment(2)
        (0.5, 0.75)
    """

    def __init__(self, a: Spectrum, b: Spectrum, ratio: float = 1.1):
        where = self._where("__init__")
        _check_spectrum(a, "a", where)
        _check_spectrum(b, "b", where)
        ratio = checks.number(ratio, "ratio", where, lower=1.0, lower_open=True)
        self.a, self.b, self.ratio = a, b, ratio
        self.m1 = a.moment(1) * b.moment(1)
        zero = dict(a.atoms).get(0.0, 0.0), dict(b.atoms).get(0.0, 0.0)
        self.atoms = ((0.0, max(zero)),) if max(zero) > 0 else ()

    def _f(self, x, z):
        return x - self.a.mgf(z * self.b.s_transform(x))

    def stieltjes(self, z):
        z = complex_argument(z, self._where("stieltjes"))
        flip = z.imag < 0
        zz = np.where(flip, np.conj(z), z)
        zk, x, _ = follow_roots(self._f, lambda z: self.m1 / z, zz.real.ravel(), zz.imag.ravel(), ratio=self.ratio)
        out = ((1 + x) / zk).reshape(zz.shape)
        return np.where(flip, np.conj(out), out)

    def moment(self, k: int) -> float:
        """Free moments: ``m_1 = a_1 b_1``, ``m_2 = a_2 b_1^2 + a_1^2 b_2 - a_1^2 b_1^2``.

        Args:
            k: 1 or 2.

        Returns:
            ``m_k``, a Python float.

        Raises:
            NotImplementedError: ``k > 2``.
        """
        a1, b1 = self.a.moment(1), self.b.moment(1)
        if k == 1:
            return self.m1
        if k == 2:
            a2, b2 = self.a.moment(2), self.b.moment(2)
            return a2 * b1**2 + a1**2 * b2 - a1**2 * b1**2
        raise NotImplementedError("FreeProduct.moment: only k <= 2")


class DWSpectrum(Spectrum):
    """Spectrum of ``D W`` for GOE ``W`` (variance ``V``) and a free diagonal ``D >= 0`` (001 App. C.1).

    With ``S_W(w) = 1 / sqrt(V w)`` (001 Eq. 109, corrected: ``M_W^{-1}(w) = sqrt((1 + w)^2 /
    w)``, 001 Eq. 107) and ``x = M_DW(z)``, put ``s = sqrt(V x)`` (the branch
    ``s ~ sqrt(V) m_1(D) / z``): ``s^2 = V M_D(z / s)``, solved by root following. For Bernoulli
    ``D`` this gives 001 Eq. 124: an atom ``1 - p`` at 0 plus a semicircle of radius
    ``2 sqrt(V p)``.

    Args:
        d: the spectrum of ``D`` (the slopes ``phi'(h)``, not their squares).
        V: the variance of ``W`` (``sample("goe", key, n, sqrt(V))``, scale ``sqrt(V)``), > 0.
        ratio: the geometric step of the root following, > 1.

    Attributes:
        d: the spectrum of ``D``.
        V: the variance of ``W``.
        atoms: the atom at 0 (that of ``D``), if any.

    Raises:
        ValueError: ``d`` is not a :class:`Spectrum`, ``V <= 0``, or ``ratio <= 1``.

    Example:
        >>> from deqlab.theory.freeprob import Bernoulli, DWSpectrum
        >>> dw = DWSpectrum(Bernoulli(0.5), V=0.25)  # semicircle of radius 2 sqrt(V p) ~ 0.707
        >>> dw.atoms, dw.moment(2)
        (((0.0, 0.5),), 0.0625)
        >>> # p times the semicircle of variance V p at 0: 0.5 sqrt(4 V p) / (2 pi V p) = 0.450
        >>> round(float(dw.continuous_density(0.0, eps=1e-6)), 3)
        0.45
    """

    def __init__(self, d: Spectrum, V: float, ratio: float = 1.1):
        where = self._where("__init__")
        _check_spectrum(d, "d", where)
        V = checks.positive_number(V, "V", where)
        ratio = checks.number(ratio, "ratio", where, lower=1.0, lower_open=True)
        self.d, self.V, self.ratio = d, V, ratio
        zero = dict(d.atoms).get(0.0, 0.0)
        self.atoms = ((0.0, zero),) if zero > 0 else ()

    def _f(self, s, z):
        return s**2 - self.V * self.d.mgf(z / s)

    def stieltjes(self, z):
        z = complex_argument(z, self._where("stieltjes"))
        flip = z.imag < 0
        zz = np.where(flip, np.conj(z), z)
        c = math.sqrt(self.V) * self.d.moment(1)
        zk, s, _ = follow_roots(self._f, lambda z: c / z, zz.real.ravel(), zz.imag.ravel(), ratio=self.ratio)
        out = ((1 + s**2 / self.V) / zk).reshape(zz.shape)
        return np.where(flip, np.conj(out), out)

    def moment(self, k: int) -> float:
        """``m_2 = V m_1(D)^2`` in closed form; odd moments vanish.

        Args:
            k: an odd integer, or 2.

        Returns:
            ``m_k``, a Python float.

        Raises:
            NotImplementedError: an even ``k > 2``.
        """
        if k % 2:
            return 0.0
        if k == 2:
            return self.V * self.d.moment(1) ** 2
        raise NotImplementedError("DWSpectrum.moment: only k <= 2")
