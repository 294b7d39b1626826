"""Free probability for deep and equilibrium networks (chapter 2 of the book).

Sources: 002 (Pennington, Schoenholz & Ganguli 2018, "The emergence of spectral universality in
deep networks") and Appendix C of 001 (Agarwala & Schoenholz 2022).

Sign convention (one for the whole module, 002 Eq. 7-8, 001 Eq. 96-97)
----------------------------------------------------------------------
- Stieltjes transform ``G(z) = int rho(t) / (z - t) dt``, so ``G(z) ~ 1/z`` for large ``|z|``
  and ``Im G(z) < 0`` for ``Im z > 0``; the density is ``rho(x) = -lim Im G(x + i eps) / pi``.
- Moment generating function ``M(z) = z G(z) - 1 = sum_k m_k z^-k`` (002 Eq. 9).
- S-transform ``S(w) = (1 + w) / (w M^{-1}(w))`` (002 Eq. 11); for freely independent ``A``,
  ``B``: ``S_AB = S_A S_B`` (002 Eq. 12).

Normalisations (papers against :mod:`deqlab.ensembles`)
-------------------------------------------------------
- 002 weights: ``"gaussian"`` entries ``N(0, sigma_w2 / N)``; ``"orthogonal"``
  ``W^T W = sigma_w2 I``. In :mod:`deqlab.ensembles` these are ``sample("gaussian" |
  "orthogonal", key, n, scale)`` with ``scale = sqrt(sigma_w2)`` (so ``sigma_w2 = V``).
- 001 App. C: a GOE ``W`` with off-diagonal variance ``V / N`` (semicircle of radius
  ``2 sqrt(V)``, ``V_c = 1/4``) is ``sample("goe", key, n, sqrt(V))``; a random (Ginibre)
  ``W`` with entries of variance ``V / N`` (``V_c = 1``) is ``sample("gaussian", key, n,
  sqrt(V))``; an antisymmetric one is ``sample("antisymmetric", key, n, sqrt(V))``.

Numerics are NumPy float64 / complex128 (root following is a host-side loop over small
vectorised arrays; compiling it would not pay). Every density can be validated by its mass
(atoms included), its first moments and a histogram of sampled eigenvalues (see the tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from scipy import integrate, optimize, special

__all__ = [
    "NONLINEARITIES",
    "WEIGHTS",
    "ConvergenceError",
    "Spectrum",
    "PointMasses",
    "Bernoulli",
    "Semicircle",
    "MarchenkoPastur",
    "ScaledIdentity",
    "FreeProduct",
    "DWSpectrum",
    "samples",
    "follow_roots",
    "weight_spectrum",
    "squared_slope_spectrum",
    "slope_spectrum",
    "slope_moments",
    "bernoulli_p",
    "critical_point",
    "jacobian_moments",
    "jacobian_atoms",
    "JacobianDensity",
    "jacobian_density",
    "double_scaling_q_star",
    "BernoulliLimit",
    "SmoothLimit",
    "mass_and_moments",
    "kolmogorov_distance",
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
]

NONLINEARITIES = ("linear", "relu", "hard_tanh", "erf", "shifted_relu", "silu")
WEIGHTS = ("orthogonal", "gaussian")
_BERNOULLI_CLASS = ("linear", "relu", "hard_tanh", "shifted_relu")


class ConvergenceError(RuntimeError):
    """A root following or fixed-point iteration did not reach its tolerance."""


# ---------------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------------


def _check_nonlinearity(name) -> str:
    if name not in NONLINEARITIES:
        raise ValueError(f"nonlinearity must be one of {NONLINEARITIES}, got {name!r}")
    return name


def _check_weights(name) -> str:
    if name not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {name!r}")
    return name


def _check_positive(value, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite real number > 0, got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite real number > 0, got {value!r}")
    return v


def _check_depth(depth) -> int:
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 1:
        raise ValueError(f"depth must be a positive integer, got {depth!r}")
    return int(depth)


def _check_off_axis(z) -> np.ndarray:
    z = np.asarray(z, dtype=np.complex128)
    if np.any(z.imag == 0):
        raise ValueError(
            "z must be off the real axis (Im z != 0); to get a density on the real axis use "
            "density(x, eps) with eps > 0"
        )
    return z


def _check_off_support(z, lo: float, hi: float) -> np.ndarray:
    """Real ``z`` is allowed only outside the support ``[lo, hi]`` (where ``G`` is analytic)."""
    z = np.asarray(z, dtype=np.complex128)
    if np.any((z.imag == 0) & (z.real >= lo) & (z.real <= hi)):
        raise ValueError(
            f"z must be off the support [{lo:.6g}, {hi:.6g}] on the real axis; to get a density "
            "there use density(x, eps) with eps > 0"
        )
    return z


def _sqrt_cut(z, a: float, b: float):
    """``sqrt((z - a)(z - b))`` with its cut on ``[a, b]`` and ``~ z`` at infinity."""
    return np.sqrt(z - a) * np.sqrt(z - b)


# ---------------------------------------------------------------------------------------------
# Root following (002 Algorithm 1)
# ---------------------------------------------------------------------------------------------


def _newton(f: Callable, x: np.ndarray, tol: float, max_iter: int):
    """Vectorised complex Newton with a central-difference derivative (f holomorphic)."""
    x = np.array(x, dtype=np.complex128)
    for _ in range(max_iter):
        fx = f(x)
        h = 1e-6 * np.abs(x) + 1e-30  # relative step: roots range from 1e-8 to 1e8
        d = (f(x + h) - f(x - h)) / (2 * h)
        step = np.where(np.abs(d) > 0, fx / np.where(d == 0, 1, d), 0)
        x = x - step
        if np.all(np.abs(step) <= tol * (1.0 + np.abs(x))):
            break
    res = np.abs(f(x))
    return x, res


def follow_roots(
    f: Callable,
    x_init: Callable,
    re_z,
    eps: float,
    im_start: float | None = None,
    ratio: float = 1.1,
    tol: float = 1e-12,
    max_newton: int = 50,
    check: bool = True,
):
    """002 Algorithm 1: root following from a large imaginary part down to ``Im z = eps``.

    For each ``Re z`` the point ``z_k = Re z + i im_start / ratio^k`` walks towards the real
    axis in geometric steps (``ratio > 1``, the ``b`` of Algorithm 1); at each step the root of
    ``f(x, z) = 0`` nearest to the previous one is taken (Newton started at the previous root).
    The walk starts at ``x_init(z_0)``, the root on the branch with ``G(z) ~ 1/z``.

    Args:
      f: ``f(x, z)`` holomorphic in ``x``, vectorised over arrays.
      x_init: ``x_init(z)``, the large-``|z|`` approximation of the wanted root.
      re_z: real parts (array).
      eps: final imaginary part(s), ``> 0`` (scalar or one per point).
      im_start: first imaginary part (default ``1e4 * max(1, max |Re z|)``).
    Returns:
      ``(z, x, residual)`` at ``Im z = eps``.
    Raises:
      ValueError: ``eps <= 0`` or ``ratio <= 1``.
      ConvergenceError: when ``check`` and the final residual exceeds ``sqrt(tol)``.
    """
    eps_arr = np.asarray(eps, dtype=np.float64)
    if eps_arr.ndim == 0:
        _check_positive(float(eps_arr), "eps")
    elif not np.all(np.isfinite(eps_arr) & (eps_arr > 0)):
        raise ValueError("eps must be finite and > 0")
    if not ratio > 1:
        raise ValueError(f"ratio must be > 1, got {ratio!r}")
    re_z = np.asarray(re_z, dtype=np.float64)
    eps_arr = np.broadcast_to(eps_arr, re_z.shape)
    if im_start is None:
        im_start = 1e4 * max(1.0, float(np.max(np.abs(re_z), initial=0.0)), float(np.max(eps_arr, initial=0)))
    span = np.log(im_start / eps_arr)  # per point; all points take the same number of steps
    n_steps = max(1, int(math.ceil(float(np.max(span, initial=0.0)) / math.log(ratio))))
    ims = [im_start * np.exp(-span * k / n_steps) for k in range(n_steps + 1)]
    z = re_z + 1j * ims[0]
    x = x_init(z)
    worst = np.zeros_like(re_z)
    for k, im in enumerate(ims):
        z = re_z + 1j * im
        last = k == len(ims) - 1  # intermediate steps only need to stay on the branch
        x, res = _newton(lambda x: f(x, z), x, tol if last else math.sqrt(tol), max_newton)
        bad = ~np.isfinite(res)
        worst = np.maximum(worst, np.where(bad, np.inf, res if last else 0.0))
    if check and not np.all(worst <= math.sqrt(tol)):
        bad = re_z[~(worst <= math.sqrt(tol))]
        raise ConvergenceError(
            f"root following did not converge at {bad.size} point(s), e.g. Re z = {bad[:3]}; "
            f"worst residual {np.max(worst):.3g} > {math.sqrt(tol):.1g}"
        )
    return z, x, worst


# ---------------------------------------------------------------------------------------------
# Spectra and their transforms (002 Eq. 7-11)
# ---------------------------------------------------------------------------------------------


class Spectrum:
    """A spectral measure with its transforms (002 Eq. 7-11; sign convention: module docstring).

    Subclasses implement :meth:`stieltjes`; the rest follows. ``atoms`` lists the point masses
    ``(location, mass)`` known in closed form, removed by :meth:`continuous_density`.
    """

    atoms: tuple = ()

    def stieltjes(self, z):
        """``G(z) = int rho(t) / (z - t) dt`` (002 Eq. 7), ``Im z != 0``."""
        raise NotImplementedError

    def mgf(self, z):
        """``M(z) = z G(z) - 1 = sum_k m_k z^-k`` (002 Eq. 9)."""
        z = np.asarray(z, dtype=np.complex128)
        return z * self.stieltjes(z) - 1.0

    def moment(self, k: int) -> float:
        """``m_k = int t^k rho(t) dt`` (002 Eq. 10)."""
        raise NotImplementedError

    def mgf_inverse(self, w, z0=None, tol: float = 1e-13, max_iter: int = 100):
        """Functional inverse ``M^{-1}(w)`` (002 Eq. 11) by Newton on ``M(z) = w``.

        Starts from ``z0`` or from the two-term inversion ``m1 / w + m2 / m1`` of the moment
        series, valid for small ``|w|`` (large ``|z|``). Raises :class:`ConvergenceError`.
        """
        w = np.asarray(w, dtype=np.complex128)
        if z0 is None:
            m1, m2 = self.moment(1), self.moment(2)
            z0 = m1 / w + m2 / m1
        z, res = _newton(lambda z: self.mgf(z) - w, z0, tol, max_iter)
        if not np.all(res <= 1e-8 * (1 + np.abs(w))):
            raise ConvergenceError(f"mgf_inverse: Newton did not converge (residual {np.max(res):.3g})")
        return z

    def s_transform(self, w):
        """``S(w) = (1 + w) / (w M^{-1}(w))`` (002 Eq. 11)."""
        w = np.asarray(w, dtype=np.complex128)
        return (1 + w) / (w * self.mgf_inverse(w))

    def density(self, x, eps: float):
        """``-Im G(x + i eps) / pi`` (002 Eq. 8 at finite ``eps > 0``), atoms smeared."""
        eps = _check_positive(eps, "eps")
        return -np.imag(self.stieltjes(np.asarray(x, dtype=np.float64) + 1j * eps)) / np.pi

    def continuous_density(self, x, eps: float):
        """Density of the continuous part: :meth:`density` with the closed-form atoms removed."""
        eps = _check_positive(eps, "eps")
        z = np.asarray(x, dtype=np.float64) + 1j * eps
        g = self.stieltjes(z)
        for loc, mass in self.atoms:
            g = g - mass / (z - loc)
        return -np.imag(g) / np.pi


class PointMasses(Spectrum):
    """A finite sum of point masses ``sum_i w_i delta(t - a_i)`` (e.g. an empirical spectrum)."""

    def __init__(self, locations, weights=None):
        a = np.asarray(locations, dtype=np.float64).ravel()
        if a.size == 0:
            raise ValueError("locations must be non-empty")
        w = np.full(a.size, 1.0 / a.size) if weights is None else np.asarray(weights, np.float64).ravel()
        if w.shape != a.shape or np.any(w < 0) or not math.isclose(w.sum(), 1.0, rel_tol=1e-9):
            raise ValueError("weights must be non-negative, one per location, summing to 1")
        self.locations, self.weights = a, w
        self.atoms = tuple(zip(a.tolist(), w.tolist()))

    def stieltjes(self, z):
        z = np.asarray(z, dtype=np.complex128)
        if np.any((z.imag == 0) & np.isin(z.real, self.locations)):
            raise ValueError("z must not be a point mass location (use density(x, eps))")
        return np.sum(self.weights / (z[..., None] - self.locations), axis=-1)

    def mgf(self, z):
        """``M(z) = sum_i w_i a_i / (z - a_i)`` (no cancellation in ``z G - 1`` at large ``z``)."""
        z = np.asarray(z, dtype=np.complex128)
        return np.sum((self.weights * self.locations) / (z[..., None] - self.locations), axis=-1)

    def moment(self, k: int) -> float:
        return float(np.sum(self.weights * self.locations**k))

    def continuous_density(self, x, eps: float):
        return np.zeros(np.shape(x))


def samples(eigenvalues) -> PointMasses:
    """The empirical spectral measure of sampled eigenvalues (002 Eq. 6)."""
    return PointMasses(eigenvalues)


class Bernoulli(PointMasses):
    """``p delta(t - 1) + (1 - p) delta(t)``: ``D^2`` for piecewise-linear nonlinearities.

    Closed forms (002 Table 1, 001 Eq. 111-114): ``M(z) = p / (z - 1)``,
    ``M^{-1}(w) = 1 + p / w``, ``S(w) = (1 + w) / (w + p)``.
    """

    def __init__(self, p: float):
        p = float(p)
        if not 0 < p <= 1:
            raise ValueError(f"p must be in (0, 1], got {p!r}")
        self.p = p
        super().__init__([0.0, 1.0], [1.0 - p, p])

    def mgf(self, z):
        return self.p / (np.asarray(z, dtype=np.complex128) - 1.0)

    def mgf_inverse(self, w, z0=None, **kw):
        return 1.0 + self.p / np.asarray(w, dtype=np.complex128)

    def s_transform(self, w):
        w = np.asarray(w, dtype=np.complex128)
        return (1 + w) / (w + self.p)


class ScaledIdentity(PointMasses):
    """``delta(t - s)``: ``W^T W`` for scaled orthogonal weights, ``s = sigma_w2`` (002 Table 2).

    ``S(w) = 1 / s``.
    """

    def __init__(self, s: float):
        s = _check_positive(s, "sigma_w2")
        self.s = s
        super().__init__([s], [1.0])

    def mgf_inverse(self, w, z0=None, **kw):
        w = np.asarray(w, dtype=np.complex128)
        return self.s * (1 + w) / w

    def s_transform(self, w):
        return np.full(np.shape(w), 1.0 / self.s, dtype=np.complex128)


class Semicircle(Spectrum):
    """Wigner semicircle of variance ``V`` (GOE, off-diagonal variance ``V/N``), radius ``2 sqrt(V)``.

    ``G(z) = (z - sqrt(z^2 - 4V)) / (2V)`` with the square root cut on ``[-2 sqrt V, 2 sqrt V]``
    (001 Eq. 101, scaled). Its ``M^{-1}(w) = sqrt(V) (1 + w) / sqrt(w)`` and
    ``S(w) = 1 / sqrt(V w)`` are two-valued (``m_1 = 0``, so the generic Newton start
    ``m1 / w + m2 / m1`` does not exist): :meth:`mgf_inverse` and :meth:`s_transform` return the
    branch with the principal ``sqrt(w)``, the one with ``M^{-1}(w) -> +inf`` as ``w -> 0+``;
    the other branch is its negative. See also :class:`DWSpectrum`.
    """

    def __init__(self, variance: float = 1.0):
        self.variance = _check_positive(variance, "variance")
        self.radius = 2 * math.sqrt(self.variance)

    def stieltjes(self, z):
        z = _check_off_support(z, -self.radius, self.radius)
        return 2.0 / (z + _sqrt_cut(z, -self.radius, self.radius))  # = (z - sqrt) / (2V), stable

    def density(self, x, eps: float = 0.0):
        """Exact density ``sqrt(4V - x^2) / (2 pi V)`` (``eps`` ignored)."""
        x = np.asarray(x, dtype=np.float64)
        return np.sqrt(np.clip(self.radius**2 - x**2, 0, None)) / (2 * np.pi * self.variance)

    continuous_density = density

    def mgf_inverse(self, w, z0=None, **kw):
        """``M^{-1}(w) = sqrt(V) (1 + w) / sqrt(w)``, principal ``sqrt`` (``V G^2 - z G + 1 = 0``
        with ``G = (1 + w) / z``); ``z0`` and Newton options are not needed and ignored."""
        w = np.asarray(w, dtype=np.complex128)
        return math.sqrt(self.variance) * (1 + w) / np.sqrt(w)

    def s_transform(self, w):
        """``S(w) = 1 / sqrt(V w)`` on the branch of :meth:`mgf_inverse`."""
        return 1.0 / np.sqrt(self.variance * np.asarray(w, dtype=np.complex128))

    def moment(self, k: int) -> float:
        if k % 2:
            return 0.0
        j = k // 2
        return float(special.comb(2 * j, j) / (j + 1) * self.variance**j)


class MarchenkoPastur(Spectrum):
    """Spectrum of ``W^T W`` for square Gaussian ``W`` with entries ``N(0, s/N)`` (002 Table 2).

    Density ``sqrt(t (4 s - t)) / (2 pi s t)`` on ``[0, 4 s]``;
    ``G(z) = (z - sqrt(z (z - 4 s))) / (2 s z)``; ``S(w) = 1 / (s (1 + w))``.
    """

    def __init__(self, s: float = 1.0):
        self.s = _check_positive(s, "sigma_w2")

    def stieltjes(self, z):
        z = _check_off_support(z, 0.0, 4 * self.s)
        return 2.0 / (z + _sqrt_cut(z, 0.0, 4 * self.s))  # = (z - sqrt) / (2 s z), stable

    def mgf_inverse(self, w, z0=None, **kw):
        w = np.asarray(w, dtype=np.complex128)
        return self.s * (1 + w) ** 2 / w

    def s_transform(self, w):
        return 1.0 / (self.s * (1 + np.asarray(w, dtype=np.complex128)))

    def density(self, x, eps: float = 0.0):
        """Exact density (``eps`` ignored)."""
        x = np.asarray(x, dtype=np.float64)
        inside = (x > 0) & (x < 4 * self.s)
        xs = np.where(inside, x, 1.0)
        return np.where(inside, np.sqrt(xs * (4 * self.s - xs)) / (2 * np.pi * self.s * xs), 0.0)

    continuous_density = density

    def moment(self, k: int) -> float:
        return float(special.comb(2 * k, k) / (k + 1) * self.s**k)  # Catalan numbers


class FreeProduct(Spectrum):
    """Free multiplicative convolution ``A ⊠ B`` via ``S_AB = S_A S_B`` (002 Eq. 12).

    ``A`` needs only its :meth:`Spectrum.mgf`, ``B`` a closed-form :meth:`Spectrum.s_transform`.
    With ``x = M_AB(z)``: ``M_A^{-1}(x) = z S_B(x)``, i.e. ``x = M_A(z S_B(x))`` (002 Eq. 14 with
    ``L = 1``), solved by :func:`follow_roots`. Both spectra must lie on ``[0, inf)``.
    """

    def __init__(self, a: Spectrum, b: Spectrum, ratio: float = 1.1):
        self.a, self.b, self.ratio = a, b, ratio
        self.m1 = a.moment(1) * b.moment(1)
        zero = dict(a.atoms).get(0.0, 0.0), dict(b.atoms).get(0.0, 0.0)
        self.atoms = ((0.0, max(zero)),) if max(zero) > 0 else ()

    def _f(self, x, z):
        return x - self.a.mgf(z * self.b.s_transform(x))

    def stieltjes(self, z):
        z = _check_off_axis(z)
        flip = z.imag < 0
        zz = np.where(flip, np.conj(z), z)
        zk, x, _ = follow_roots(self._f, lambda z: self.m1 / z, zz.real.ravel(), zz.imag.ravel(), ratio=self.ratio)
        out = ((1 + x) / zk).reshape(zz.shape)
        return np.where(flip, np.conj(out), out)

    def moment(self, k: int) -> float:
        """``m_1 = a_1 b_1``, ``m_2 = a_2 b_1^2 + a_1^2 b_2 - a_1^2 b_1^2`` (free moments)."""
        a1, b1 = self.a.moment(1), self.b.moment(1)
        if k == 1:
            return self.m1
        if k == 2:
            a2, b2 = self.a.moment(2), self.b.moment(2)
            return a2 * b1**2 + a1**2 * b2 - a1**2 * b1**2
        raise NotImplementedError("FreeProduct.moment: only k <= 2")


class DWSpectrum(Spectrum):
    """Spectrum of ``D W`` for GOE ``W`` (variance ``V``) and a free diagonal ``D >= 0`` (001 C.1).

    With ``S_W(w) = 1 / sqrt(V w)`` (001 Eq. 109, corrected: ``M_W^{-1}(w) = sqrt((1 + w)^2 /
    w)``) and ``x = M_DW(z)``, put ``s = sqrt(V x)`` (the branch ``s ~ sqrt(V) m_1(D) / z``):
    ``s^2 = V M_D(z / s)``, solved by root following. For Bernoulli ``D`` this gives 001 Eq. 124:
    an atom ``1 - p`` at 0 plus a semicircle of radius ``2 sqrt(V p)``.

    Args:
      d: the spectrum of ``D`` (the slopes ``phi'(h)``, not their squares).
      variance: ``V`` (``sample("goe", key, n, sqrt(V))``).
    """

    def __init__(self, d: Spectrum, variance: float, ratio: float = 1.1):
        self.d, self.variance, self.ratio = d, _check_positive(variance, "variance"), ratio
        zero = dict(d.atoms).get(0.0, 0.0)
        self.atoms = ((0.0, zero),) if zero > 0 else ()

    def _f(self, s, z):
        return s**2 - self.variance * self.d.mgf(z / s)

    def stieltjes(self, z):
        z = _check_off_axis(z)
        flip = z.imag < 0
        zz = np.where(flip, np.conj(z), z)
        c = math.sqrt(self.variance) * self.d.moment(1)
        zk, s, _ = follow_roots(self._f, lambda z: c / z, zz.real.ravel(), zz.imag.ravel(), ratio=self.ratio)
        out = ((1 + s**2 / self.variance) / zk).reshape(zz.shape)
        return np.where(flip, np.conj(out), out)

    def moment(self, k: int) -> float:
        """``m_2 = V m_1(D)^2`` in closed form; odd moments vanish."""
        if k % 2:
            return 0.0
        if k == 2:
            return self.variance * self.d.moment(1) ** 2
        raise NotImplementedError("DWSpectrum.moment: only k <= 2")


# ---------------------------------------------------------------------------------------------
# Nonlinearities (002 Table 1, Eq. 3-5, 20, 23)
# ---------------------------------------------------------------------------------------------


def _phi(name: str, h):
    h = np.asarray(h, dtype=np.float64)
    if name == "linear":
        return h
    if name == "relu":
        return np.maximum(h, 0.0)
    if name == "hard_tanh":
        return np.clip(h, -1.0, 1.0)
    if name == "erf":
        return special.erf(math.sqrt(math.pi) / 2 * h)
    if name == "shifted_relu":
        return np.maximum(h + 0.5, 0.0) - 0.5
    return h * special.expit(h)  # silu


def _dphi(name: str, h):
    h = np.asarray(h, dtype=np.float64)
    if name == "linear":
        return np.ones_like(h)
    if name == "relu":
        return (h > 0).astype(np.float64)
    if name == "hard_tanh":
        return (np.abs(h) < 1).astype(np.float64)
    if name == "erf":
        return np.exp(-math.pi * h**2 / 4)
    if name == "shifted_relu":
        return (h > -0.5).astype(np.float64)
    s = special.expit(h)  # silu
    return s * (1 + h * (1 - s))


_KINKS = {"relu": (0.0,), "hard_tanh": (-1.0, 1.0), "shifted_relu": (-0.5,)}


def _gauss_expect(fun: Callable, q: float, kinks=()) -> float:
    """``int Dh fun(sqrt(q) h)`` by adaptive quadrature split at the kinks."""
    sq = math.sqrt(q)
    pts = sorted({-40.0, 40.0, *[k / sq for k in kinks if abs(k / sq) < 40]})
    dens = lambda u: math.exp(-u * u / 2) / math.sqrt(2 * math.pi) * float(fun(sq * u))
    return float(sum(integrate.quad(dens, a, b, limit=200, epsabs=1e-14, epsrel=1e-12)[0]
                     for a, b in zip(pts[:-1], pts[1:])))


def bernoulli_p(nonlinearity: str, q_star: float) -> float:
    """``p(q*) = P(phi'(h)^2 = 1)`` for the piecewise-linear nonlinearities (002 Table 1, Eq. 24).

    linear 1, ReLU 1/2, hard tanh ``erf(1 / sqrt(2 q*))``, shifted ReLU ``Phi(1 / (2 sqrt q*))``.
    """
    _check_nonlinearity(nonlinearity)
    q = _check_positive(q_star, "q_star")
    if nonlinearity == "linear":
        return 1.0
    if nonlinearity == "relu":
        return 0.5
    if nonlinearity == "hard_tanh":
        return float(special.erf(1 / math.sqrt(2 * q)))
    if nonlinearity == "shifted_relu":
        return float(special.ndtr(0.5 / math.sqrt(q)))
    raise ValueError(f"nonlinearity {nonlinearity!r} is not piecewise linear")


def slope_moments(nonlinearity: str, q_star: float, kmax: int = 2) -> np.ndarray:
    """``mu_k = int Dh phi'(sqrt(q*) h)^(2k)``, ``k = 1..kmax`` (002 Eq. 20, Table 1).

    Closed forms for the Bernoulli class (``mu_k = p``) and erf (``(1 + pi k q*)^(-1/2)``);
    adaptive quadrature for SiLU.
    """
    _check_nonlinearity(nonlinearity)
    q = _check_positive(q_star, "q_star")
    ks = np.arange(1, kmax + 1)
    if nonlinearity in _BERNOULLI_CLASS:
        return np.full(kmax, bernoulli_p(nonlinearity, q))
    if nonlinearity == "erf":
        return 1 / np.sqrt(1 + np.pi * ks * q)
    return np.array([_gauss_expect(lambda h, k=k: _dphi("silu", h) ** (2 * k), q) for k in ks])


def _hermite(n_nodes: int):
    u, w = np.polynomial.hermite_e.hermegauss(n_nodes)
    return u, w / w.sum()


def squared_slope_spectrum(nonlinearity: str, q_star: float, n_nodes: int = 256) -> Spectrum:
    """Spectrum of ``D^2`` with ``D_ii = phi'(h_i)``, ``h_i ~ N(0, q*)`` (002 Eq. 23).

    Exactly :class:`Bernoulli` for linear, ReLU, hard tanh, shifted ReLU (002 Table 1); for erf
    and SiLU the Gaussian integral of Eq. 23 by ``n_nodes``-point Gauss-Hermite quadrature, i.e.
    point masses at ``phi'(sqrt(q*) u_i)^2`` (accurate for ``z`` away from ``[0, max phi'^2]``).
    """
    _check_nonlinearity(nonlinearity)
    q = _check_positive(q_star, "q_star")
    if nonlinearity in _BERNOULLI_CLASS:
        return Bernoulli(bernoulli_p(nonlinearity, q))
    u, w = _hermite(n_nodes)
    return PointMasses(_dphi(nonlinearity, math.sqrt(q) * u) ** 2, w)


def slope_spectrum(nonlinearity: str, q_star: float, n_nodes: int = 256) -> Spectrum:
    """Spectrum of ``D`` itself (slopes ``phi'(h)``, 001 C.1): as :func:`squared_slope_spectrum`."""
    _check_nonlinearity(nonlinearity)
    q = _check_positive(q_star, "q_star")
    if nonlinearity in _BERNOULLI_CLASS:
        return Bernoulli(bernoulli_p(nonlinearity, q))
    u, w = _hermite(n_nodes)
    return PointMasses(_dphi(nonlinearity, math.sqrt(q) * u), w)


def weight_spectrum(weights: str, sigma_w2: float) -> Spectrum:
    """Spectrum of ``W^T W`` (002 Table 2): ``"orthogonal"`` a point mass at ``sigma_w2``
    (``S = 1/sigma_w2``, ``s_1 = 0``), ``"gaussian"`` Marchenko-Pastur (``S = 1 / (sigma_w2
    (1 + w))``, ``s_1 = -1``)."""
    _check_weights(weights)
    return ScaledIdentity(sigma_w2) if weights == "orthogonal" else MarchenkoPastur(sigma_w2)


_S1 = {"orthogonal": 0.0, "gaussian": -1.0}


def critical_point(nonlinearity: str, q_star: float) -> tuple[float, float]:
    """``(sigma_w2, sigma_b2)`` on the critical line ``chi = sigma_w2 mu_1 = 1`` at ``q*``.

    ``sigma_w2 = 1 / mu_1(q*)`` (002 Eq. 5) and ``sigma_b2 = q* - sigma_w2 int Dh
    phi(sqrt(q*) h)^2`` from the fixed point of the variance map (002 Eq. 4); linear: ``(1,
    0)``, ReLU: ``(2, 0)`` for every ``q*`` (002 §4.3, Table 1).

    Raises:
      ValueError: unknown nonlinearity, ``q* <= 0``, or no real bias (``sigma_b2 < 0``).
    """
    _check_nonlinearity(nonlinearity)
    q = _check_positive(q_star, "q_star")
    mu1 = float(slope_moments(nonlinearity, q, 1)[0])
    sw2 = 1.0 / mu1
    e_phi2 = _gauss_expect(lambda h: _phi(nonlinearity, h) ** 2, q, _KINKS.get(nonlinearity, ()))
    sb2 = q - sw2 * e_phi2
    if nonlinearity in ("linear", "relu"):
        sb2 = 0.0  # exact: phi is homogeneous, the variance map is q = sigma_w2 mu_1 q
    if sb2 < -1e-12 * q:
        raise ValueError(
            f"critical_point: no real bias for {nonlinearity} at q_star={q}: sigma_b2 = {sb2:.3g} < 0"
        )
    return sw2, max(sb2, 0.0)


def _sigma_w2(nonlinearity, q, sigma_w2):
    if sigma_w2 is None:
        return 1.0 / float(slope_moments(nonlinearity, q, 1)[0])
    return _check_positive(sigma_w2, "sigma_w2")


def jacobian_moments(nonlinearity: str, weights: str, depth: int, q_star: float, sigma_w2=None):
    """``(m1, m2)`` of the spectrum of ``J J^T`` (002 Eq. 21).

    ``m1 = (sigma_w2 mu_1)^L``, ``m2 = (sigma_w2 mu_1)^(2L) L (mu_2 / mu_1^2 + 1/L - 1 - s_1)``,
    with ``s_1 = 0`` (orthogonal) or ``-1`` (Gaussian). ``sigma_w2=None`` puts the network on the
    critical line at ``q_star`` (``sigma_w2 mu_1 = 1``); then ``m2 - m1^2 = L (mu_2 / mu_1^2 - 1
    - s_1)`` (002 Eq. 22, Table 1). Weight names as in :mod:`deqlab.ensembles`.
    """
    _check_nonlinearity(nonlinearity)
    _check_weights(weights)
    L = _check_depth(depth)
    q = _check_positive(q_star, "q_star")
    sw2 = _sigma_w2(nonlinearity, q, sigma_w2)
    mu1, mu2 = slope_moments(nonlinearity, q, 2)
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
    """
    _check_nonlinearity(nonlinearity)
    _check_weights(weights)
    L = _check_depth(depth)
    q = _check_positive(q_star, "q_star")
    sw2 = _sigma_w2(nonlinearity, q, sigma_w2)
    atoms = []
    if nonlinearity in _BERNOULLI_CLASS:
        p = bernoulli_p(nonlinearity, q)
        if p < 1:
            atoms.append((0.0, 1.0 - p))
        if weights == "orthogonal" and 1 - L * (1 - p) > 0:
            atoms.append((sw2**L, 1.0 - L * (1 - p)))
    return tuple(atoms)


@dataclass
class JacobianDensity:
    """Result of :func:`jacobian_density`: continuous density on ``lam`` plus the atoms."""

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
      lam: points ``> 0`` at which to evaluate the density.
      sigma_w2: ``None`` for the critical line at ``q_star`` (Table 1).
      eps: final imaginary part (``> 0``; the bias is ``O(eps)`` in the bulk), a scalar or one
        per point (e.g. ``1e-7 * lam`` on a logarithmic grid).
    Raises:
      ValueError: bad arguments; ConvergenceError: root following failed.
    """
    _check_nonlinearity(nonlinearity)
    _check_weights(weights)
    L = _check_depth(depth)
    q = _check_positive(q_star, "q_star")
    lam = np.asarray(lam, dtype=np.float64)
    eps = np.asarray(eps, dtype=np.float64)
    if eps.ndim == 0:
        eps = np.full(lam.shape, _check_positive(float(eps), "eps"))
    elif eps.shape != lam.shape or not np.all(np.isfinite(eps) & (eps > 0)):
        raise ValueError("eps must be > 0, a scalar or one value per point of lam")
    sw2 = _sigma_w2(nonlinearity, q, sigma_w2)
    m1, m2 = jacobian_moments(nonlinearity, weights, L, q, sw2)
    atoms = jacobian_atoms(nonlinearity, weights, L, q, sw2)
    if nonlinearity == "linear" and weights == "orthogonal":
        return JacobianDensity(lam, np.zeros_like(lam), atoms, m1, m2, eps, np.zeros_like(lam))
    d2 = squared_slope_spectrum(nonlinearity, q, n_nodes)
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


def double_scaling_q_star(nonlinearity: str, depth: int, sigma0_2: float) -> float:
    """``q*(L)`` with ``sigma^2_{JJ^T} = sigma0_2`` for orthogonal weights (002 §5, Eq. 26).

    Solves ``L (mu_2 / mu_1^2 - 1) = sigma0_2`` (002 Eq. 22 with ``s_1 = 0``); closed form for
    hard tanh (``p = L / (L + sigma0_2)``, ``q* = 1 / (2 erfinv(p)^2)``), root finding otherwise.
    Raises ValueError for ReLU and linear (their ``mu_k`` do not depend on ``q*``).
    """
    _check_nonlinearity(nonlinearity)
    L = _check_depth(depth)
    s0 = _check_positive(sigma0_2, "sigma0_2")
    if nonlinearity in ("linear", "relu"):
        raise ValueError(f"nonlinearity {nonlinearity!r} has no double-scaling limit (mu_k independent of q*)")
    target = s0 / L
    if nonlinearity == "hard_tanh":
        p = L / (L + s0)
        return float(1.0 / (2.0 * special.erfinv(p) ** 2))

    def g(logq):
        mu1, mu2 = slope_moments(nonlinearity, math.exp(logq), 2)
        return mu2 / mu1**2 - 1.0 - target

    return float(math.exp(optimize.brentq(g, math.log(1e-8), math.log(50.0), xtol=1e-14)))


# ---------------------------------------------------------------------------------------------
# Universality limits (002 §5)
# ---------------------------------------------------------------------------------------------


class BernoulliLimit(Spectrum):
    """Bernoulli universality class, ``L -> inf`` at fixed ``sigma^2_{JJ^T} = sigma0_2`` (002 §5).

    ``S(w) = lim (1 + sigma0_2 w / (L (1 + w)))^(-L) = exp(-sigma0_2 w / (1 + w))`` (Eq. 28-29);
    ``G(z) = 1 / (z - exp(-W_0(-sigma0_2 / z)))`` (Eq. 30, principal Lambert W, Eq. 31). Bulk
    on ``[0, lambda_1]``, ``lambda_1 = e sigma0_2`` (Eq. 35), where ``-sigma0_2 / z`` meets the
    cut of ``W_0``; for ``sigma0_2 < 1`` an atom of mass ``1 - sigma0_2`` at
    ``lambda_2 = exp(sigma0_2)`` (Eq. 34; mass from the residue, equal to the limit of the
    free-projection count ``1 - L (1 - p)``). The density diverges like
    ``sigma0_2 / (lambda log^2 lambda)`` at 0 (a double pole of ``G'``, Eq. 34, but no atom).
    """

    def __init__(self, sigma0_2: float):
        self.sigma0_2 = _check_positive(sigma0_2, "sigma0_2")
        self.edge = math.e * self.sigma0_2
        self.atoms = ((math.exp(self.sigma0_2), 1.0 - self.sigma0_2),) if self.sigma0_2 < 1 else ()

    def s_transform(self, w):
        w = np.asarray(w, dtype=np.complex128)
        return np.exp(-self.sigma0_2 * w / (1 + w))

    def stieltjes(self, z):
        z = _check_off_axis(z)
        return 1.0 / (z - np.exp(-special.lambertw(-self.sigma0_2 / z, 0)))

    def density(self, x, eps: float = 0.0):
        """Exact bulk density on the real axis (the atom is excluded; ``eps`` ignored)."""
        x = np.asarray(x, dtype=np.float64)
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
        """Leading mass of the bulk on ``[0, delta]``: ``sigma0_2 / log(sigma0_2 / delta)``."""
        return sigma0_2 / math.log(sigma0_2 / delta)


class SmoothLimit(Spectrum):
    """Smooth universality class (erf, SiLU, ...): ``S(w) = exp(-sigma0_2 w)`` (002 Eq. 36).

    ``x = M(z)`` solves ``(1 + x) exp(sigma0_2 x) = x z`` (a generalised Lambert W), found by
    root following. The edges are the critical values of ``z(x) = (1 + x) e^{sigma0_2 x} / x``
    at ``x_± = (-1 ± sqrt(1 + 4 / sigma0_2)) / 2``: ``lambda_± = z(x_±)``, so that the
    singular-value edges are ``s_± = sqrt(lambda_±)`` (002 Eq. 37; ``0.57`` and ``1.56`` for
    ``sigma0_2 = 1/4``). No atoms.
    """

    def __init__(self, sigma0_2: float, ratio: float = 1.1):
        self.sigma0_2 = _check_positive(sigma0_2, "sigma0_2")
        self.ratio = ratio
        r = math.sqrt(1 + 4 / self.sigma0_2)
        xs = ((-1 - r) / 2, (-1 + r) / 2)
        self.edges = tuple(float((1 + x) * math.exp(self.sigma0_2 * x) / x) for x in xs)

    def s_transform(self, w):
        return np.exp(-self.sigma0_2 * np.asarray(w, dtype=np.complex128))

    def _f(self, x, z):
        return (1 + x) * np.exp(self.sigma0_2 * x) - x * z

    def stieltjes(self, z):
        z = _check_off_axis(z)
        flip = z.imag < 0
        zz = np.where(flip, np.conj(z), z)
        zk, x, _ = follow_roots(self._f, lambda z: 1 / z + (1 + self.sigma0_2) / z**2,
                                zz.real.ravel(), zz.imag.ravel(), ratio=self.ratio)
        out = ((1 + x) / zk).reshape(zz.shape)
        return np.where(flip, np.conj(out), out)

    def moment(self, k: int) -> float:
        return {1: 1.0, 2: 1.0 + self.sigma0_2}[k]


# ---------------------------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------------------------


def mass_and_moments(lam, density, atoms=()):
    """``(mass, m1, m2)`` of a density on a grid (trapezoid) plus its atoms."""
    lam = np.asarray(lam, dtype=np.float64)
    density = np.asarray(density, dtype=np.float64)
    out = [float(np.trapezoid(density * lam**k, lam)) if hasattr(np, "trapezoid")
           else float(np.trapz(density * lam**k, lam)) for k in range(3)]
    for loc, mass in atoms:
        out = [out[k] + mass * loc**k for k in range(3)]
    return tuple(out)


def kolmogorov_distance(samples_, lam, density, atoms=(), lower=None, atom_tol=1e-8) -> float:
    """Kolmogorov-Smirnov distance ``sup |F_emp - F|`` between sampled eigenvalues and a density.

    ``F(t) = 1 - (mass of the density above t) - (atoms above t)`` is built from the top of the
    grid down (so that a density singular at 0 loses nothing above ``lower``); the supremum is
    taken over ``t >= lower`` (default: the grid's first point). Samples within ``atom_tol``
    (relative) of an atom are put on it.
    """
    lam = np.asarray(lam, dtype=np.float64)
    rho = np.asarray(density, dtype=np.float64)
    seg = 0.5 * (rho[1:] + rho[:-1]) * np.diff(lam)
    above = np.concatenate([np.cumsum(seg[::-1])[::-1], [0.0]])
    lower = lam[0] if lower is None else lower
    s = np.asarray(samples_, dtype=np.float64).copy()
    for loc, _ in atoms:  # sampled copies of an atom differ from it by rounding only
        s[np.abs(s - loc) <= atom_tol * (1 + abs(loc))] = loc
    s = np.sort(s)
    t = s[s >= lower]
    if t.size == 0:
        return 0.0
    f_cont = np.interp(t, lam, above, left=above[0], right=0.0)
    f_atom_above = np.array([sum(m for loc, m in atoms if loc > ti) for ti in t])
    f_atom_above_eq = np.array([sum(m for loc, m in atoms if loc >= ti) for ti in t])
    n = s.size
    idx_hi = np.searchsorted(s, t, side="right") / n  # F_emp(t)
    idx_lo = np.searchsorted(s, t, side="left") / n  # F_emp(t-)
    f_hi = 1.0 - f_cont - f_atom_above
    f_lo = 1.0 - f_cont - f_atom_above_eq
    return float(max(np.max(np.abs(idx_hi - f_hi)), np.max(np.abs(idx_lo - f_lo))))


# ---------------------------------------------------------------------------------------------
# Operator-valued free probability: linear pencils (001 App. C.2)
# ---------------------------------------------------------------------------------------------


@dataclass
class Pencil:
    """A linear pencil ``Lambda - P_hat = Z(z) - sum_a A_a ⊗ X_a`` (001 Eq. 125-132).

    ``X_a`` are self-adjoint, centred, asymptotically free semicircular elements with
    covariance ``tr(X_a X_b) = cov[a, b]``; ``Z(z) = Lambda(z) - M_hat`` is the constant part
    (``k x k``, ``Lambda = diag(z, 0, ...)``). The covariance map of Eq. 131-132 is then
    ``eta(G) = sum_ab cov[a, b] A_a G A_b``.
    """

    z_matrix: Callable  # z -> (..., k, k) complex
    coeffs: Sequence[np.ndarray]
    cov: np.ndarray

    def eta(self, g):
        out = np.zeros_like(g)
        for i, a in enumerate(self.coeffs):
            for j, b in enumerate(self.coeffs):
                if self.cov[i, j] != 0:
                    out = out + self.cov[i, j] * (a @ g @ b)
        return out


@dataclass
class PencilResult:
    """Operator-valued Cauchy transform ``G`` per point, with iteration diagnostics."""

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
    """
    if not 0 < damping <= 1:
        raise ValueError(f"damping must be in (0, 1], got {damping!r}")
    z = np.atleast_1d(np.asarray(z, dtype=np.complex128))
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
    must enclose the spectrum) and ``m_k = radius^k mean(M e^{i k theta})`` (trapezoid rule,
    exponentially accurate). Points on the real axis are shifted by a tiny angle.
    """
    radius = _check_positive(radius, "radius")
    theta = 2 * np.pi * (np.arange(n_points) + 0.5) / n_points
    z = radius * np.exp(1j * theta)
    res = pencil_cauchy(pencil, z, **kw)
    m = z * res.g[:, 0, 0] - 1
    return np.array([radius**k * np.mean(m * np.exp(1j * k * theta)).real for k in range(1, kmax + 1)])


def length_pencil(ensemble: str, variance: float) -> Pencil:
    """3x3 pencil of ``(I - W)^-T (I - W)^-1`` (001 Eq. 151-158), ``W = X + iY`` (Eq. 149-150).

    ``Z = [[z, -1, 0], [-1, 1, 0], [0, 0, -1]]`` (Eq. 155), ``A_X = [[0,0,0],[0,2,-1],[0,-1,0]]``,
    ``A_Y = [[0,0,0],[0,0,-i],[0,i,0]]`` (Eq. 156), covariances ``tr X^2``, ``tr Y^2``:
    ``"gaussian"`` (Ginibre, entries ``V/N``) ``(V/2, V/2)``, reproducing Eq. 159-162 and the
    cubic Eq. 188; ``"goe"`` (off-diagonal ``V/N``) ``(V, 0)``, i.e. ``(I - W)^-2``;
    ``"antisymmetric"`` (entries ``V/N``) ``(0, V)``, i.e. ``(I + W W^T)^-1``.
    """
    v = _check_positive(variance, "variance")
    covs = {"gaussian": (v / 2, v / 2), "goe": (v, 0.0), "antisymmetric": (0.0, v)}
    if ensemble not in covs:
        raise ValueError(f"ensemble must be one of {tuple(covs)}, got {ensemble!r}")
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


def goe_resolvent_pencil(variance: float) -> Pencil:
    """2x2 pencil of ``(I - W)^-1`` for GOE ``W`` (001 Eq. 129, 133-134): ``Z = [[z, -1], [-1,
    1]]``, ``A = [[0, 0], [0, 1]]``, ``eta(G) = diag(0, V G_22)``."""
    v = _check_positive(variance, "variance")

    def zmat(z):
        out = np.zeros(z.shape + (2, 2), dtype=np.complex128)
        out[..., 0, 0] = z
        out[..., 0, 1] = out[..., 1, 0] = -1
        out[..., 1, 1] = 1
        return out

    return Pencil(zmat, (np.array([[0, 0], [0, 1]], dtype=np.complex128),), np.array([[v]], dtype=np.complex128))


def goe_resolvent_mgf(z, variance: float):
    """``M(z)`` of ``(I - W)^-1``, GOE ``W``: ``((z-1) - sqrt((z-1)^2 - 4 V z^2)) / (2 V z^2)``
    (001 Eq. 141), root of the quadratic Eq. 138 chosen with ``M ~ 1/z``."""
    v = _check_positive(variance, "variance")
    z = _check_off_axis(z)
    r = 2 * math.sqrt(v)
    # (z-1)^2 - 4 V z^2 = (1 - 4V) (z - a)(z - b) with cut between the roots a, b
    a, b = 1 / (1 + r), 1 / (1 - r)
    s = math.sqrt(1 - 4 * v) * _sqrt_cut(z, a, b)
    return 2.0 / ((z - 1) + s)  # = ((z - 1) - s) / (2 V z^2) without cancellation


def ginibre_length_cubic(m, z, variance: float):
    """Left side of 001 Eq. 188: ``V^2 z^2 M^3 + 2 V z M^2 + ((V - 1) z + 1) M + 1``."""
    v = variance
    return v**2 * z**2 * m**3 + 2 * v * z * m**2 + ((v - 1) * z + 1) * m + 1


def goe_length_m2(variance: float) -> float:
    """``tr[((I-W)^-T (I-W)^-1)^2]`` for GOE ``W`` (001 Eq. 148), ``0 < V < 1/4``."""
    v = _check_positive(variance, "variance")
    if v >= 0.25:
        raise ValueError(f"variance must be < 1/4 for GOE, got {v}")
    return (1 / (1 - 4 * v) ** 2.5 - 1 / (1 - 4 * v) ** 1.5) / (4 * v)


def ginibre_length_m2(variance: float) -> float:
    """``tr[((I-W)^-T (I-W)^-1)^2]`` for Ginibre ``W`` (001 Eq. 191), ``0 < V < 1``."""
    v = _check_positive(variance, "variance")
    if v >= 1:
        raise ValueError(f"variance must be < 1 for Ginibre, got {v}")
    return v**2 / (1 - v) ** 4 + 2 * v / (1 - v) ** 3 + 1 / (1 - v) ** 2


# ---------------------------------------------------------------------------------------------
# Measuring spectra computed on grids (002 §5: edges and atoms read off the densities)
# ---------------------------------------------------------------------------------------------

__all__ += ["support_edges", "locate_atom", "wasserstein_distance"]


def support_edges(lam, density, floor: float = 1e-6) -> tuple[float, float]:
    """Outermost edges of the support of a density sampled on a grid.

    Returns the first and last points of ``lam`` where ``density > floor``: the measured edges,
    accurate to one grid spacing plus the distance over which a square-root edge
    ``c sqrt(|lam - edge|)`` stays below ``floor`` (``(floor / c)^2``, negligible for a small
    ``floor``). Used to check 002 Eq. 35 and 37 on the computed densities.

    Raises:
      ValueError: ``floor < 0``, mismatched shapes, or no point above ``floor``.
    """
    lam = np.asarray(lam, dtype=np.float64)
    density = np.asarray(density, dtype=np.float64)
    if lam.shape != density.shape or lam.ndim != 1:
        raise ValueError("lam and density must be 1-d arrays of the same length")
    if not floor >= 0:
        raise ValueError(f"floor must be >= 0, got {floor!r}")
    inside = np.flatnonzero(density > floor)
    if inside.size == 0:
        raise ValueError(f"density never exceeds floor={floor!r} on the grid")
    return float(lam[inside[0]]), float(lam[inside[-1]])


def locate_atom(spectrum: Spectrum, lo: float, hi: float, eps: float = 1e-6,
                n_grid: int = 4001) -> tuple[float, float]:
    """Location and mass of a point mass of ``spectrum`` in ``[lo, hi]``, read off ``G``.

    Near an atom ``m delta(t - a)`` outside the bulk, ``G(x + i eps) ~ m / (x - a + i eps)``, so
    the smeared density ``-Im G / pi`` is a Lorentzian of height ``m / (pi eps)`` centred at
    ``a``. The location is the maximum of ``-Im G`` (grid search, then bounded refinement);
    the mass is ``eps * (-Im G)`` there, up to ``O(eps)`` from the rest of the spectrum. Used
    for the atom of the Bernoulli limit (002 Eq. 34).

    Raises:
      ValueError: ``lo >= hi``, ``eps <= 0`` or ``n_grid < 3``.
    """
    eps = _check_positive(eps, "eps")
    if not lo < hi:
        raise ValueError(f"need lo < hi, got lo={lo!r}, hi={hi!r}")
    if n_grid < 3:
        raise ValueError(f"n_grid must be >= 3, got {n_grid!r}")
    height = lambda x: -np.imag(spectrum.stieltjes(np.asarray(x, dtype=np.float64) + 1j * eps))
    x = np.linspace(lo, hi, n_grid)
    k = int(np.argmax(height(x)))
    a, b = x[max(k - 1, 0)], x[min(k + 1, n_grid - 1)]
    best = optimize.minimize_scalar(lambda t: -float(height(np.array([t]))[0]), bounds=(a, b),
                                    method="bounded", options={"xatol": 1e-3 * eps})
    loc = float(best.x)
    return loc, float(eps * height(np.array([loc]))[0])


def _mass_above(lam, density, atoms, t):
    """Mass of the density above ``t`` (trapezoid, from the top of the grid down) plus the atoms
    strictly above ``t``: ``1 - F(t)`` with ``F`` right-continuous."""
    seg = 0.5 * (density[1:] + density[:-1]) * np.diff(lam)
    above = np.concatenate([np.cumsum(seg[::-1])[::-1], [0.0]])
    out = np.interp(t, lam, above, left=above[0], right=0.0)
    for loc, mass in atoms:
        out = out + mass * (t < loc)
    return out


def wasserstein_distance(lam, density_a, density_b, atoms_a=(), atoms_b=()) -> float:
    """Wasserstein-1 distance ``int |F_a(t) - F_b(t)| dt`` between two spectra on one grid.

    Unlike the Kolmogorov distance it is small when an atom moves a little (the finite-depth
    atom at ``sigma_w^(2L)`` approaches the limit's ``exp(sigma0_2)`` from below, 002 Eq. 34),
    so it measures how fast finite-depth spectra approach their double-scaling limit (002 §5).
    Each ``F`` is built from the top of the grid down (no loss above the grid's first point);
    the integral is a left Riemann sum over the grid merged with the atoms (error of order the
    grid spacing times the density). Mass below ``lam[0]`` counts as sitting at ``lam[0]``.
    """
    lam = np.asarray(lam, dtype=np.float64)
    rho_a = np.asarray(density_a, dtype=np.float64)
    rho_b = np.asarray(density_b, dtype=np.float64)
    if not (lam.shape == rho_a.shape == rho_b.shape) or lam.ndim != 1:
        raise ValueError("lam, density_a and density_b must be 1-d arrays of the same length")
    t = np.unique(np.concatenate([lam, [loc for loc, _ in (*atoms_a, *atoms_b)]]))
    gap = np.abs(_mass_above(lam, rho_a, atoms_a, t) - _mass_above(lam, rho_b, atoms_b, t))
    return float(np.sum(gap[:-1] * np.diff(t)))


__all__ += ["activation"]


def activation(nonlinearity: str, h):
    """``phi(h)`` for a named nonlinearity (002 Table 1 and §5: hard tanh ``clip(h, -1, 1)``,
    erf ``erf(sqrt(pi) h / 2)``, shifted ReLU ``[h + 1/2]_+ - 1/2``, SiLU ``h sigmoid(h)``)."""
    return _phi(_check_nonlinearity(nonlinearity), h)


# ---------------------------------------------------------------------------------------------
# Support of the length spectrum (001 App. C.2; contour radius for pencil_moments)
# ---------------------------------------------------------------------------------------------

__all__ += ["length_spectrum_edges"]


def length_spectrum_edges(ensemble: str, variance: float) -> tuple[float, float]:
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
    """
    v = _check_positive(variance, "variance")
    if ensemble == "goe":
        if v >= 0.25:
            raise ValueError(f"variance must be < 1/4 for GOE, got {v}")
        r = 2 * math.sqrt(v)
        return 1 / (1 + r) ** 2, 1 / (1 - r) ** 2
    if ensemble != "gaussian":
        raise ValueError(f"ensemble must be 'goe' or 'gaussian', got {ensemble!r}")
    if v >= 1:
        raise ValueError(f"variance must be < 1 for Ginibre, got {v}")
    z = np.polynomial.Polynomial([0.0, 1.0])
    c = np.polynomial.Polynomial([1.0, v - 1.0])
    disc = 27 * v**2 * z**2 - 36 * v * z * c + 32 * v * z - 4 * c**2 + 4 * c**3
    quadratic = np.polynomial.Polynomial(disc.coef[1:])  # disc(0) = 0: divide by z
    roots = np.sort(quadratic.roots().real)
    return float(roots[0]), float(roots[1])
