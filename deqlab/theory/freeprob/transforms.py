"""Transforms of spectral measures and the root following that evaluates them (002 §2-3).

Sign convention (one for the whole package, 002 Eq. 7-8, 001 Eq. 96-97):

- Stieltjes transform ``G(z) = int rho(t) / (z - t) dt``, so ``G(z) ~ 1/z`` for large ``|z|``
  and ``Im G(z) < 0`` for ``Im z > 0``; the density is ``rho(x) = -lim Im G(x + i eps) / pi``.
- Moment generating function ``M(z) = z G(z) - 1 = sum_k m_k z^-k`` (002 Eq. 9).
- S-transform ``S(w) = (1 + w) / (w M^{-1}(w))`` (002 Eq. 11); for freely independent ``A``,
  ``B``: ``S_AB = S_A S_B`` (002 Eq. 12).

:class:`Spectrum` is the base class of every spectral measure of the package;
:func:`follow_roots` is 002 Algorithm 1. The argument checks of spectral variables
(:func:`complex_argument`, :func:`transform_argument`, :func:`real_points`) live here, next to the transforms they guard.
"""

from __future__ import annotations

import contextvars
import math
from typing import Any, Callable

import numpy as np

from deqlab import checks

__all__ = [
    "ConvergenceError",
    "Spectrum",
    "follow_roots",
    "newton",
    "sqrt_with_cut",
    "complex_argument",
    "transform_argument",
    "real_points",
]


class ConvergenceError(RuntimeError):
    """A root following or fixed-point iteration did not reach its tolerance."""


# ---------------------------------------------------------------------------------------------
# Checks of spectral variables
# ---------------------------------------------------------------------------------------------

_CHECKING = contextvars.ContextVar("deqlab_freeprob_checking", default=True)
# False while follow_roots iterates: its f evaluates transforms at Newton's iterates, points the
# walk made (Im z = eps > 0, iterates frozen before they leave the finite numbers), not a caller's
# arguments, three times per step: 130,000 checks on chapter 2 page 3, which ran in 23.3 s instead
# of 28.9 s without them (a pair, 2-core machine). The arithmetic is the same either way (the
# checks only convert to complex128; tests/theory/test_theory_freeprob.py compares the densities).


def complex_argument(z: Any, where: str, name: str = "z",
                     support: tuple[float, float] | None = None) -> np.ndarray:
    """``z`` as complex128, checked finite and off the real axis where ``G`` has its cut.

    Args:
        z: complex numbers (a scalar or an array).
        where: the public function named in an error message.
        name: the argument's name, for the message.
        support: None: every real point is refused (``Im z != 0``); ``(lo, hi)``: real points
            are allowed outside ``[lo, hi]``, where ``G`` is analytic.

    Returns:
        ``z`` as a complex128 array.

    Raises:
        ValueError: ``z`` is not complex, not finite, or on the cut.

    Example:
        >>> from deqlab.theory.freeprob.transforms import complex_argument
        >>> complex_argument(3.0, "example", support=(-2.0, 2.0))
        array(3.+0.j)
    """
    if not _CHECKING.get():
        return np.asarray(z, dtype=np.complex128)
    try:
        z = np.asarray(z, dtype=np.complex128)
    except (TypeError, ValueError):
        raise checks.fail(name, "complex numbers", z, where) from None
    if not np.all(np.isfinite(z)):
        bad = z[~np.isfinite(z)].ravel()[0]
        raise checks.fail(name, "finite complex numbers (no NaN or inf)", complex(bad), where)
    if support is None:
        if np.any(z.imag == 0):
            raise checks.fail(
                name, "off the real axis (Im z != 0); for a density on the real axis use "
                "density(x, eps) with eps > 0", complex(z[z.imag == 0].ravel()[0]), where)
        return z
    lo, hi = support
    on_cut = (z.imag == 0) & (z.real >= lo) & (z.real <= hi)
    if np.any(on_cut):
        raise checks.fail(
            name, f"off the support [{lo:.6g}, {hi:.6g}] on the real axis; for a density there "
            "use density(x, eps) with eps > 0", complex(z[on_cut].ravel()[0]), where)
    return z


def transform_argument(w: Any, where: str, name: str = "w", poles: tuple[complex, ...] = (),
                       formula: str = "") -> np.ndarray:
    """``w`` as complex128, checked finite and different from each of ``poles``.

    For the closed forms of ``M``, ``M^{-1}`` and ``S`` (analytic off a few points, where
    ``formula`` is singular); every other finite complex number is allowed.

    Args:
        w: complex numbers.
        where: the public function named in an error message.
        name: the argument's name, for the message.
        poles: the points refused.
        formula: the formula named in the message.

    Returns:
        ``w`` as a complex128 array.

    Raises:
        ValueError: ``w`` is not finite or hits a pole.

    Example:
        >>> from deqlab.theory.freeprob.transforms import transform_argument
        >>> transform_argument(0.5, "example", poles=(0.0,), formula="1 / w")
        array(0.5+0.j)
    """
    w = complex_argument(w, where, name, support=(math.inf, -math.inf))  # empty support: no cut
    if not _CHECKING.get():
        return w
    for pole in poles:
        hit = w == pole
        if np.any(hit):
            raise checks.fail(name, f"finite complex numbers != {pole:g} (where {formula} is singular)",
                              complex(w[hit].ravel()[0]), where)
    return w


def real_points(x: Any, where: str, name: str = "x", positive: bool = False) -> np.ndarray:
    """``x`` as float64, checked finite (and ``> 0`` when ``positive``).

    Args:
        x: real numbers.
        where: the public function named in an error message.
        name: the argument's name, for the message.
        positive: also require ``x > 0``.

    Returns:
        ``x`` as a float64 array.

    Raises:
        ValueError: ``x`` is not real, not finite, or (with ``positive``) not > 0.

    Example:
        >>> from deqlab.theory.freeprob.transforms import real_points
        >>> real_points([1, 2], "example")
        array([1., 2.])
    """
    requirement = "finite real numbers" + (" > 0" if positive else "")
    try:
        x = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise checks.fail(name, requirement, x, where) from None
    bad = ~np.isfinite(x) | ((x <= 0) if positive else False)
    if np.any(bad):
        raise checks.fail(name, requirement, float(x[bad].ravel()[0]), where)
    return x


def sqrt_with_cut(z, a: float, b: float):
    """``sqrt((z - a)(z - b))`` with its cut on ``[a, b]`` and ``~ z`` at infinity.

    The principal ``sqrt((z - a)(z - b))`` has its cut where the product is negative real,
    which includes ``Re z < a`` far from the axis; the product of two principal roots does not.

    Args:
        z: complex numbers.
        a: left end of the cut.
        b: right end of the cut.

    Returns:
        The root, complex, of ``z``'s shape.

    Example:
        >>> from deqlab.theory.freeprob.transforms import sqrt_with_cut
        >>> complex(sqrt_with_cut(-3 + 0j, -1.0, 1.0))  # ~ z left of the cut: negative
        (-2.8284271247461903+0j)
    """
    return np.sqrt(z - a) * np.sqrt(z - b)


# ---------------------------------------------------------------------------------------------
# Root following (002 Algorithm 1)
# ---------------------------------------------------------------------------------------------


def newton(f: Callable, x: Any, tol: float, max_iter: int) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised complex Newton with a central-difference derivative (``f`` holomorphic).

    A point whose iterate leaves the finite numbers is frozen at its start and reported with
    residual ``inf`` (``f`` is never evaluated at NaN).

    Args:
        f: ``f(x)``, holomorphic, vectorised over arrays.
        x: starting points.
        tol: stop when every step is below ``tol (1 + |x|)``.
        max_iter: the most Newton steps.

    Returns:
        ``(x, |f(x)|)``, complex128 and float64 arrays.

    Example:
        >>> import numpy as np
        >>> from deqlab.theory.freeprob.transforms import newton
        >>> root, residual = newton(lambda x: x**2 - 2, np.array([1.0]), 1e-12, 50)
        >>> round(float(root[0].real), 12)
        1.414213562373
    """
    x = np.array(x, dtype=np.complex128)
    start = x.copy()
    dead = ~np.isfinite(x)
    x = np.where(dead, 0, x)
    for _ in range(max_iter):
        fx = f(x)
        h = 1e-6 * np.abs(x) + 1e-30  # relative step: roots range from 1e-8 to 1e8
        d = (f(x + h) - f(x - h)) / (2 * h)
        step = np.where(np.abs(d) > 0, fx / np.where(d == 0, 1, d), 0)
        step = np.where(dead, 0, step)
        x = x - step
        diverged = ~np.isfinite(x)
        if np.any(diverged):
            dead |= diverged
            x = np.where(dead, np.where(np.isfinite(start), start, 0), x)
            step = np.where(dead, 0, step)
        if np.all(np.abs(step) <= tol * (1.0 + np.abs(x))):
            break
    res = np.where(dead, np.inf, np.abs(f(x)))
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
    The walk starts at ``x_init(z_0)``, the root on the branch with ``G(z) ~ 1/z``. While it walks,
    the argument checks of spectral variables (:func:`complex_argument`, :func:`transform_argument`)
    are off: ``f`` is evaluated at the walk's own points, not at a caller's arguments.

    Args:
      f: ``f(x, z)`` holomorphic in ``x``, vectorised over arrays.
      x_init: ``x_init(z)``, the large-``|z|`` approximation of the wanted root.
      re_z: real parts (array of finite numbers).
      eps: final imaginary part(s), ``> 0`` (scalar or one per point).
      im_start: first imaginary part (default ``1e4 * max(1, max |Re z|)``).
    Returns:
      ``(z, x, residual)`` at ``Im z = eps``.
    Raises:
      ValueError: ``eps <= 0``, ``ratio <= 1`` or non-finite ``re_z``.
      ConvergenceError: when ``check`` and the final residual exceeds ``sqrt(tol)``.

    Example:
        >>> import numpy as np
        >>> from deqlab.theory.freeprob.transforms import follow_roots
        >>> f = lambda g, z: g * g - z * g + 1  # the semicircle's G (V = 1)
        >>> z, g, residual = follow_roots(f, lambda z: 1 / z, np.array([0.0]), eps=1e-9)
        >>> round(float(-g.imag[0] / np.pi), 6)  # density at 0: 1 / pi
        0.31831
    """
    where = "theory.freeprob.follow_roots"
    eps_arr = real_points(eps, where, "eps", positive=True)
    ratio = checks.number(ratio, "ratio", where, lower=1.0, lower_open=True)
    max_newton = checks.positive_int(max_newton, "max_newton", where)
    re_z = real_points(re_z, where, "re_z")
    eps_arr = np.broadcast_to(eps_arr, re_z.shape)
    if im_start is None:
        im_start = 1e4 * max(1.0, float(np.max(np.abs(re_z), initial=0.0)), float(np.max(eps_arr, initial=0)))
    span = np.log(im_start / eps_arr)  # per point; all points take the same number of steps
    n_steps = max(1, int(math.ceil(float(np.max(span, initial=0.0)) / math.log(ratio))))
    ims = [im_start * np.exp(-span * k / n_steps) for k in range(n_steps + 1)]
    z = re_z + 1j * ims[0]
    worst = np.zeros_like(re_z)
    unchecked = _CHECKING.set(False)  # the spectral variables below are the walk's own points
    try:
        x = x_init(z)
        for k, im in enumerate(ims):
            z = re_z + 1j * im
            last = k == len(ims) - 1  # intermediate steps only need to stay on the branch
            x, res = newton(lambda x: f(x, z), x, tol if last else math.sqrt(tol), max_newton)
            bad = ~np.isfinite(res)
            worst = np.maximum(worst, np.where(bad, np.inf, res if last else 0.0))
    finally:
        _CHECKING.reset(unchecked)
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

    Subclasses implement :meth:`stieltjes` (and :meth:`moment`); the rest follows. ``atoms`` lists
    the point masses ``(location, mass)`` known in closed form, removed by
    :meth:`continuous_density`.

    Attributes:
        atoms: the closed-form point masses, ``((location, mass), ...)``.

    Example:
        >>> from deqlab.theory.freeprob import Semicircle
        >>> s = Semicircle(1.0)
        >>> complex(s.stieltjes(1j))  # G(i) = (i - sqrt(-5)) / 2
        -0.6180339887498948j
        >>> round(float(s.density(0.0, eps=1e-9)), 6)  # 1 / pi
        0.31831
    """

    atoms: tuple = ()

    def _where(self, method: str) -> str:
        return f"theory.freeprob.{type(self).__name__}.{method}"

    def stieltjes(self, z):
        """``G(z) = int rho(t) / (z - t) dt`` (002 Eq. 7), ``Im z != 0``.

        Args:
            z: complex numbers off the support on the real axis.

        Returns:
            ``G(z)``, complex, of ``z``'s shape.

        Raises:
            ValueError: ``z`` is not finite or lies on the cut.
        """
        raise NotImplementedError

    def mgf(self, z):
        """``M(z) = z G(z) - 1 = sum_k m_k z^-k`` (002 Eq. 9).

        Args:
            z: complex numbers off the support.

        Returns:
            ``M(z)``, complex.
        """
        z = np.asarray(z, dtype=np.complex128)
        return z * self.stieltjes(z) - 1.0

    def moment(self, k: int) -> float:
        """``m_k = int t^k rho(t) dt`` (002 Eq. 10).

        Args:
            k: the order, an integer >= 0.

        Returns:
            ``m_k``, a Python float.
        """
        raise NotImplementedError

    def mgf_inverse(self, w, z0=None, tol: float = 1e-13, max_iter: int = 100):
        """Functional inverse ``M^{-1}(w)`` (002 Eq. 11) by Newton on ``M(z) = w``.

        Starts from ``z0`` or from the two-term inversion ``m1 / w + m2 / m1`` of the moment series,
        valid for small ``|w|`` (large ``|z|``).

        Args:
            w: complex numbers, not 0.
            z0: the Newton start; None: the moment-series inversion.
            tol: Newton's step tolerance.
            max_iter: the most Newton steps.

        Returns:
            ``M^{-1}(w)``, complex.

        Raises:
            ValueError: ``w`` is not finite or is 0.
            ConvergenceError: Newton did not converge.
        """
        w = complex_argument(w, self._where("mgf_inverse"), "w", support=(0.0, 0.0))
        if z0 is None:
            m1, m2 = self.moment(1), self.moment(2)
            z0 = m1 / w + m2 / m1
        z, res = newton(lambda z: self.mgf(z) - w, z0, tol, max_iter)
        if not np.all(res <= 1e-8 * (1 + np.abs(w))):
            raise ConvergenceError(f"mgf_inverse: Newton did not converge (residual {np.max(res):.3g})")
        return z

    def s_transform(self, w):
        """``S(w) = (1 + w) / (w M^{-1}(w))`` (002 Eq. 11).

        Args:
            w: complex numbers, not 0.

        Returns:
            ``S(w)``, complex.

        Raises:
            ValueError: ``w`` is not finite or is 0.
            ConvergenceError: :meth:`mgf_inverse` did not converge.
        """
        w = complex_argument(w, self._where("s_transform"), "w", support=(0.0, 0.0))
        return (1 + w) / (w * self.mgf_inverse(w))

    def density(self, x, eps: float):
        """``-Im G(x + i eps) / pi`` (002 Eq. 8 at finite ``eps > 0``), atoms smeared.

        Args:
            x: real points.
            eps: the imaginary part, > 0.

        Returns:
            The density at ``x``, float64.

        Raises:
            ValueError: ``eps <= 0`` or ``x`` not finite.
        """
        where = self._where("density")
        eps = checks.positive_number(eps, "eps", where)
        return -np.imag(self.stieltjes(real_points(x, where) + 1j * eps)) / np.pi

    def continuous_density(self, x, eps: float):
        """Density of the continuous part: :meth:`density` with the closed-form atoms removed.

        Args:
            x: real points.
            eps: the imaginary part, > 0.

        Returns:
            The density at ``x``, float64.

        Raises:
            ValueError: ``eps <= 0`` or ``x`` not finite.
        """
        where = self._where("continuous_density")
        eps = checks.positive_number(eps, "eps", where)
        z = real_points(x, where) + 1j * eps
        g = self.stieltjes(z)
        for loc, mass in self.atoms:
            g = g - mass / (z - loc)
        return -np.imag(g) / np.pi
