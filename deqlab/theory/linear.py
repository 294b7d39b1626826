"""Closed forms for linear deep equilibrium models (001 §2, App. A, App. B.1, App. C.2).

The linear DEQ is ``z* = W z* + x``, i.e. ``z* = M x`` with ``M = (I - W)^{-1}`` (001 Eq. 2, 4),
found by the tied iteration ``z_{t+1} = W z_t + x`` (001 Eq. 3). The *untied* comparison model
draws a fresh ``W_t`` at every step, ``z_{t+1} = W_t z_t + x`` (001 Eq. 6), and ``M`` is then
``sum_k W_{t-1} ... W_{t-k}`` in the limit of many steps.

**Convention for V.** ``W = sqrt(V) W0`` with ``W0`` normalised exactly as in
:mod:`deqlab.ensembles` (``scale = sqrt(V)``), which is also the normalisation of 001 §2.1.2 and
App. A.1:

- ``"gaussian"`` (Ginibre): i.i.d. entries of variance ``V/N``; ``V_c = 1``.
- ``"orthogonal"``: ``sqrt(V)`` times a Haar orthogonal matrix; ``V_c = 1``.
- ``"goe"``: symmetric, off-diagonal variance ``V/N``, diagonal ``2V/N``; semicircle of radius
  ``2 sqrt(V)``; ``V_c = 1/4``.

``V`` is always the variance (the ``scale`` of :mod:`deqlab.ensembles` is ``sqrt(V)``).
``V_c`` is the variance at which the large-``N`` spectral radius of ``W`` reaches 1
(:func:`critical_variance`; for tied weights :func:`deqlab.ensembles.critical_variance`). All
closed forms are ``N -> inf`` limits; they exist for ``0 <= V < V_c`` and raise ``ValueError``
outside that range, naming ``V`` and the range.

**Normalised traces.** ``tr`` is the normalised trace ``(1/N) Tr`` (001 §2.1.1). With the input
``x`` of i.i.d. unit-variance entries, the quantities here are (expectations over ``W`` and ``x``)

- :func:`first_moment`: ``lim E[z*_i] / x_i = lim E tr[M]``,
- :func:`second_moment`: ``lim (1/N) E[z* . z*] = lim E tr[M^T M]`` (001 Eq. 10, 58-60, 63-66),
- :func:`variance`: ``lim Var_W[z*_i] / ((1/N) x . x) = second_moment - first_moment**2``
  (001 Eq. 8, 9, 11, 57),
- :func:`gram_trace` with ``power=2``: ``lim E tr[(M^T M)^2]``, the quantity plotted in 001
  Fig. 1,
- :func:`length_variance`: ``lim (1/N) E_W Var_x[z . z] = 2 lim E tr[(M^T M)^2]`` (001
  Definition 2.1 and Lemma 2.2 with ``sigma_x = 1``; Eq. 14-20).

**Finite N.** :func:`tracy_widom_cdf`, :func:`edge_scaling`, :func:`edge_failure_probability`
and :func:`reliable_delta` give the large-``N`` laws of the spectral radius at the edge (Tracy-Widom
for the GOE, Gumbel for real Ginibre) and with them the probability that the tied iteration
diverges below ``V_c`` (001 §2.2.3, App. A.3).

Where 001 prints something else, the functions implement what the derivation and the simulations
in ``tests/theory/test_theory_linear.py`` agree on; Chapter 1 of the book ("Linear DEQs and random matrix
ensembles") lists each discrepancy:

1. 001 Eq. 65-66 and 11 (GOE second moment) drop a factor 2 in the derivative of the Catalan
   generating function (Eq. 64 itself is right): the second moment is
   ``2/sqrt(1-4V) - (1-sqrt(1-4V))/(2V)``, not ``1/sqrt(1-4V) - ...``.
2. 001 App. A.3 states ``E[z*] = x`` for every rotation-invariant ensemble; for the GOE
   ``E[z*] = f_c(V) x`` with the Catalan generating function ``f_c(V) = (1-sqrt(1-4V))/(2V)``
   (001 Eq. 62), so the variance of ``z*_i`` is ``second_moment - f_c(V)**2``.
3. 001 Eq. 14 / 76 (untied weights, Gaussian and GOE) assume that the terms of Eq. 74 with
   ``j != l`` factorise; the nested products ``W_1 ... W_j`` and ``W_1 ... W_l`` do not, and the
   GOE has further pairings. The correct limits diverge as ``delta^-3``, not ``delta^-2``.
4. 001 Eq. 86: the GOE asymptote is ``(1/32) delta'^{-5/2}`` for ``sqrt(V) = 1/2 - delta'``
   (the integral of Eq. 85 is ``pi/16``), i.e. exactly ``(1-4V)^{-5/2}``; not ``1/8``.
5. Normalisation: Definition 2.1 and Lemma 2.2 give ``sigma^2 = 2 tr[(M^T M)^2]`` of order one
   (with the normalised trace); the paper writes this same quantity as ``lim N sigma^2``
   (Eq. 19, 20) and prints the orthogonal case (Eq. 18) without the factor 2 of Eq. 79.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import scipy.integrate
import scipy.optimize
import scipy.special

from deqlab import checks, ensembles

__all__ = [
    "ENSEMBLES",
    "critical_variance",
    "delta",
    "first_moment",
    "second_moment",
    "variance",
    "gram_trace",
    "length_variance",
    "goe_length_variance_integral",
    "divergence",
    "asymptote",
    "power_series",
    "ntk",
    "ntk_fluctuation",
    "tracy_widom_cdf",
    "GINIBRE_MIN_N",
    "MAX_N",
    "edge_scaling",
    "edge_failure_probability",
    "reliable_delta",
]

ENSEMBLES: tuple[str, ...] = tuple(e for e in ensembles.ENSEMBLES if e != "antisymmetric")
"""The weight ensembles of 001 §2, the ones with closed forms here: the names of
:data:`deqlab.ensembles.ENSEMBLES` except ``"antisymmetric"`` (not in 001)."""


# --------------------------------------------------------------------------------------------
# Validation (deqlab.checks; V against the critical variance of the ensemble registry)
# --------------------------------------------------------------------------------------------


def _check_ensemble(ensemble: Any, where: str, options: tuple[str, ...] = ENSEMBLES) -> str:
    checks.choice(ensemble, "ensemble", ensembles.ENSEMBLES, where)
    return checks.choice(ensemble, "ensemble", options, where)


def _check_tied(tied: Any, where: str) -> bool:
    if not isinstance(tied, (bool, np.bool_)):
        raise checks.fail("tied", "True or False", tied, where)
    return bool(tied)


def _check_V(V: Any, ensemble: str, where: str, tied: bool = True) -> tuple[np.ndarray, bool]:
    """``V`` as a float64 array, checked to lie in ``[0, V_c)``; also whether it was a scalar."""
    vc = critical_variance(ensemble, tied)
    requirement = (f"real numbers with 0 <= V < V_c = {vc:g} for {ensemble!r} "
                   f"({'tied' if tied else 'untied'} weights; the N -> inf limit does not exist "
                   "at or above V_c)")
    if isinstance(V, (bool, np.bool_)):
        raise checks.fail("V", requirement, V, where)
    try:
        arr = np.asarray(V, dtype=np.float64)
    except (TypeError, ValueError):
        raise checks.fail("V", requirement, V, where) from None
    if arr.size == 0:
        raise checks.fail("V", requirement, V, where)
    if not np.all(np.isfinite(arr)) or np.any(arr < 0) or np.any(arr >= vc):
        bad = arr[~(np.isfinite(arr) & (arr >= 0) & (arr < vc))].ravel()[0]
        raise checks.fail("V", requirement, float(bad), where)
    return arr, arr.ndim == 0


def _out(values: np.ndarray, scalar: bool):
    return float(values) if scalar else values


# --------------------------------------------------------------------------------------------
# Critical variance and distance to it
# --------------------------------------------------------------------------------------------


def critical_variance(ensemble: str, tied: bool = True) -> float:
    """Critical variance ``V_c``: 1 for ``"gaussian"`` and ``"orthogonal"``, 1/4 for ``"goe"``.

    Above ``V_c`` the large-``N`` spectral radius of ``W = sqrt(V) W0`` exceeds 1 and the tied
    iteration (001 Eq. 3) diverges (001 §2.1.2: ``V_c = 1`` for i.i.d. and orthogonal weights,
    ``1/4`` for the GOE, "the spectral radius of ``2 sqrt(V)`` of the semi-circular law").
    For tied weights this is :func:`deqlab.ensembles.critical_variance` (the registry's value).

    With ``tied=False`` (independent ``W_t`` at every step, 001 Eq. 6) the statistics only see
    ``tr[W_t^T W_t] = V`` (001 Eq. 56), so ``V_c = 1`` for every ensemble, the GOE included.

    Args:
        ensemble: one of :data:`ENSEMBLES`.
        tied: tied weights (one ``W``) or untied (a fresh ``W_t`` per step).

    Returns:
        ``V_c``, a Python float.

    Raises:
        ValueError: ``ensemble`` is not one of :data:`ENSEMBLES`, or ``tied`` is not a bool.

    Example:
        >>> from deqlab.theory import linear
        >>> linear.critical_variance("goe"), linear.critical_variance("goe", tied=False)
        (0.25, 1.0)
    """
    where = "theory.linear.critical_variance"
    ensemble = _check_ensemble(ensemble, where)
    tied = _check_tied(tied, where)
    return float(ensembles.critical_variance(ensemble)) if tied else 1.0


def delta(ensemble: str, V, tied: bool = True):
    """Distance to the transition ``delta = 1 - V / V_c`` (001 §2.2.3, Fig. 1).

    Args:
        ensemble: one of :data:`ENSEMBLES`.
        V: the variance, a number or an array with ``0 <= V < V_c``.
        tied: tied or untied weights (:func:`critical_variance`).

    Returns:
        ``1 - V / V_c``: a float for a scalar ``V``, else an array.

    Raises:
        ValueError: ``ensemble`` is unknown, ``tied`` is not a bool, or some ``V`` is outside
            ``[0, V_c)``.

    Example:
        >>> from deqlab.theory import linear
        >>> round(linear.delta("goe", 0.2), 12)
        0.2
    """
    where = "theory.linear.delta"
    ensemble = _check_ensemble(ensemble, where)
    tied = _check_tied(tied, where)
    arr, scalar = _check_V(V, ensemble, where, tied)
    return _out(1.0 - arr / critical_variance(ensemble, tied), scalar)


def _catalan_gf(V: np.ndarray) -> np.ndarray:
    """``f_c(V) = sum_k C_k V^k = (1 - sqrt(1-4V)) / (2V) = 2 / (1 + sqrt(1-4V))`` (001 Eq. 62)."""
    return 2.0 / (1.0 + np.sqrt(1.0 - 4.0 * V))


# --------------------------------------------------------------------------------------------
# First and second moments
# --------------------------------------------------------------------------------------------


def first_moment(ensemble: str, V, tied: bool = True):
    """``lim_{N->inf} E[z*_i] / x_i = lim E tr[(I - W)^{-1}]``.

    For every orthogonally invariant ensemble ``E[(I - W)^{-1}] = g I`` with
    ``g = E tr[(I - W)^{-1}] = sum_k tr[W^k]`` (001 Eq. 59 with one factor). ``tr[W^k] -> 0``
    (``k >= 1``) for Gaussian and orthogonal ``W``, so ``g = 1``; for the GOE
    ``tr[W^{2k}] = C_k V^k`` (001 Eq. 61), so ``g = f_c(V) = (1 - sqrt(1-4V)) / (2V)``, the
    Catalan generating function of 001 Eq. 62, not 1 as stated in 001 App. A.3. Untied weights:
    ``E[z_t] = x`` (each ``W_t`` has mean zero), so 1.

    Args:
        ensemble: one of :data:`ENSEMBLES`.
        V: the variance, a number or an array with ``0 <= V < V_c``.
        tied: tied or untied weights.

    Returns:
        ``lim E[z*_i] / x_i``: a float for a scalar ``V``, else an array.

    Raises:
        ValueError: ``ensemble`` is unknown, ``tied`` is not a bool, or some ``V`` is outside
            ``[0, V_c)``.

    Example:
        >>> from deqlab.theory import linear
        >>> linear.first_moment("gaussian", 0.5), round(linear.first_moment("goe", 0.2), 6)
        (1.0, 1.381966)
    """
    where = "theory.linear.first_moment"
    ensemble = _check_ensemble(ensemble, where)
    tied = _check_tied(tied, where)
    arr, scalar = _check_V(V, ensemble, where, tied)
    if tied and ensemble == "goe":
        return _out(_catalan_gf(arr), scalar)
    return _out(np.ones_like(arr), scalar)


def second_moment(ensemble: str, V, tied: bool = True):
    """``lim_{N->inf} (1/N) E[z* . z*]`` for unit-variance ``x``: ``lim E tr[M^T M]``.

    - Tied, ``"gaussian"`` and ``"orthogonal"``: ``1 / (1 - V)`` (001 Eq. 60, Eq. 8 plus the
      squared mean).
    - Tied, ``"goe"``: ``sum_i (2i+1) C_i V^i = 2 V f_c'(V) + f_c(V)`` (001 Eq. 63-64)
      ``= 2 / sqrt(1-4V) - (1 - sqrt(1-4V)) / (2V)``. 001 Eq. 65-66 print ``1/sqrt(1-4V)`` for
      the first term (a factor 2 lost in ``f_c'``); the value here is the one checked against
      simulation.
    - Untied (any of the three): ``1 / (1 - V)`` from the recursion of 001 Eq. 56.

    Diverges as ``delta^-1`` (``delta^-1/2`` for the tied GOE), see :func:`divergence`.

    Args:
        ensemble: one of :data:`ENSEMBLES`.
        V: the variance, a number or an array with ``0 <= V < V_c``.
        tied: tied or untied weights.

    Returns:
        ``lim E tr[M^T M]``: a float for a scalar ``V``, else an array.

    Raises:
        ValueError: ``ensemble`` is unknown, ``tied`` is not a bool, or some ``V`` is outside
            ``[0, V_c)``.

    Example:
        >>> from deqlab.theory import linear
        >>> linear.second_moment("gaussian", 0.5), round(linear.second_moment("goe", 0.2), 6)
        (2.0, 3.09017)
    """
    return _gram_trace(ensemble, V, 1, tied, "theory.linear.second_moment")


def variance(ensemble: str, V, tied: bool = True):
    """``lim_{N->inf} Var_W[z*_i]`` in units of ``(1/N) x . x``: ``second_moment - first_moment**2``.

    Gaussian and orthogonal (tied), and all untied cases: ``V / (1 - V)`` (001 Eq. 8, 57).
    Tied GOE: ``2/sqrt(1-4V) - f_c(V) - f_c(V)^2`` with ``f_c`` the Catalan generating function
    (001 Eq. 62): the mean of ``z*_i`` is ``f_c(V) x_i``, not ``x_i``, which 001 Eq. 9 and 11
    overlook (Eq. 11 also carries the factor-2 slip of Eq. 65).

    By 001 Theorem A.2 (Gaussian weights) ``z*_i`` is asymptotically Gaussian with this variance
    around its mean.

    Args:
        ensemble: one of :data:`ENSEMBLES`.
        V: the variance of the weights, a number or an array with ``0 <= V < V_c``.
        tied: tied or untied weights.

    Returns:
        ``lim Var_W[z*_i] / ((1/N) x . x)``: a float for a scalar ``V``, else an array.

    Raises:
        ValueError: ``ensemble`` is unknown, ``tied`` is not a bool, or some ``V`` is outside
            ``[0, V_c)``.

    Example:
        >>> from deqlab.theory import linear
        >>> linear.variance("orthogonal", 0.5)  # V / (1 - V), 001 Eq. 8
        1.0
    """
    where = "theory.linear.variance"
    m2 = np.asarray(_gram_trace(ensemble, V, 1, tied, where))
    m1 = np.asarray(first_moment(ensemble, V, tied=tied))
    return _out(m2 - m1**2, np.ndim(V) == 0)


# --------------------------------------------------------------------------------------------
# Fourth moment: tr[(M^T M)^2] and the length variance
# --------------------------------------------------------------------------------------------


def gram_trace(ensemble: str, V, power: int = 2, tied: bool = True):
    """``lim_{N->inf} E tr[(M^T M)^power]`` for ``power`` 1 or 2 (normalised trace).

    ``M = (I - W)^{-1}`` (tied) or ``M = sum_k W_1 ... W_k`` (untied, infinite depth).

    ``power = 1`` is :func:`second_moment`. ``power = 2``, ``tr[((I - W)^{-T} (I - W)^{-1})^2]``,
    is the quantity of 001 Fig. 1:

    - tied ``"gaussian"``: ``m_2 = V^2/(1-V)^4 + 2V/(1-V)^3 + 1/(1-V)^2 = 1/(1-V)^4``
      (001 Eq. 191; Eq. 19 is twice this);
    - tied ``"orthogonal"``: ``sum_i (i+1)^2 V^i = 2/(1-V)^3 - 1/(1-V)^2 = (1+V)/(1-V)^3``
      (001 Eq. 79, Eq. 18);
    - tied ``"goe"``: ``(1/(4V)) [(1-4V)^{-5/2} - (1-4V)^{-3/2}] = (1-4V)^{-5/2}``
      (001 Eq. 148; Eq. 20 is twice this; equal to the semicircle integral of Eq. 81,
      :func:`goe_length_variance_integral`);
    - untied ``"orthogonal"``: ``2/(1-V)^2 - 1/(1-V^2) = (1+3V)/((1-V)^2 (1+V))`` (001 Eq. 77,
      15);
    - untied ``"gaussian"``: ``(1 + 2V - 2V^2) / ((1-V)^2 (1-V^2))``;
    - untied ``"goe"``: the Gaussian value plus ``2V / (1-V^2)``.

    The untied Gaussian and GOE forms replace 001 Eq. 76 / 14 (``1/(1-V^2)^2 + 2/(1-V)^2 -
    2/(1-V^2)``), which disagrees with simulation. Derivation (free probability, ``N -> inf``):
    with ``M' = I + s M``, ``s = sqrt(V) W0`` free from ``M``, ``A = M M^T``, ``q = tr A``,
    ``r = tr A^2`` and ``tr M = 1``, expanding ``tr[(M' M'^T)^2]`` gives
    ``r' = 1 + 4Vq + V^2 (q^2 + r)`` for a circular ``s`` (Ginibre), the extra ``2V tr[M]^2``
    from ``tr[s M s M]`` for a semicircular ``s`` (GOE), and ``r' = 1 + 4Vq + V^2 r`` for a Haar
    ``s`` (``s^T s = V I``); the fixed point with ``q = 1/(1-V)`` is the formula above.

    Args:
        ensemble: one of :data:`ENSEMBLES`.
        V: the variance, a number or an array with ``0 <= V < V_c``.
        power: 1 or 2.
        tied: tied or untied weights.

    Returns:
        ``lim E tr[(M^T M)^power]``: a float for a scalar ``V``, else an array.

    Raises:
        ValueError: ``ensemble`` is unknown, ``tied`` is not a bool, ``power`` is not 1 or 2, or
            some ``V`` is outside ``[0, V_c)``.

    Example:
        >>> from deqlab.theory import linear
        >>> linear.gram_trace("gaussian", 0.5), linear.gram_trace("orthogonal", 0.5)  # 001 Eq. 191, 79
        (16.0, 12.0)
    """
    return _gram_trace(ensemble, V, power, tied, "theory.linear.gram_trace")


def _gram_trace(ensemble, V, power, tied, where: str):
    """:func:`gram_trace`, with error messages naming the public function ``where``."""
    ensemble = _check_ensemble(ensemble, where)
    tied = _check_tied(tied, where)
    power = checks.integer(power, "power", where, minimum=1, maximum=2)
    arr, scalar = _check_V(V, ensemble, where, tied)
    v = arr
    if power == 1:
        if tied and ensemble == "goe":
            s = np.sqrt(1.0 - 4.0 * v)
            out = _catalan_gf(v) / s  # = 2/s - f_c(V)
        else:
            out = 1.0 / (1.0 - v)
        return _out(out, scalar)
    if tied:
        if ensemble == "gaussian":
            out = 1.0 / (1.0 - v) ** 4
        elif ensemble == "orthogonal":
            out = (1.0 + v) / (1.0 - v) ** 3
        else:
            out = (1.0 - 4.0 * v) ** -2.5
        return _out(out, scalar)
    if ensemble == "orthogonal":
        out = (1.0 + 3.0 * v) / ((1.0 - v) ** 2 * (1.0 + v))
    else:
        out = (1.0 + 2.0 * v - 2.0 * v**2) / ((1.0 - v) ** 2 * (1.0 - v**2))
        if ensemble == "goe":
            out = out + 2.0 * v / (1.0 - v**2)
    return _out(out, scalar)


def length_variance(ensemble: str, V, tied: bool = True):
    """Length variance ``lim_{N->inf} (1/N) E_W Var_x[z . z] = 2 gram_trace(ensemble, V, 2)``.

    001 Definition 2.1 and Lemma 2.2 with ``sigma_x = 1``: for ``z = M x`` with ``x`` i.i.d.
    ``N(0, 1)``, ``Var_x[z . z] = 2 Tr[(M^T M)^2]`` exactly, so ``(1/N) E Var_x[z . z] =
    2 E tr[(M^T M)^2]`` with the normalised trace. 001 writes the same number as
    ``lim N sigma^2``: Eq. 19 (Gaussian, ``2/(1-V)^4``), Eq. 20 (GOE, ``2 (1-4V)^{-5/2}``), Eq. 18
    (orthogonal, printed without the factor 2 of Eq. 79: ``2 (1+V)/(1-V)^3`` here), and for untied
    weights Eq. 15/77 (orthogonal) and a corrected Eq. 14/76 (Gaussian, GOE); see
    :func:`gram_trace`.

    Divergence at ``V -> V_c`` (:func:`divergence`): tied ``delta^-4`` (Gaussian), ``delta^-3``
    (orthogonal), ``delta^-5/2`` (GOE); untied ``delta^-2`` (orthogonal), ``delta^-3``
    (Gaussian, GOE).

    Args:
        ensemble: one of :data:`ENSEMBLES`.
        V: the variance, a number or an array with ``0 <= V < V_c``.
        tied: tied or untied weights.

    Returns:
        The length variance: a float for a scalar ``V``, else an array.

    Raises:
        ValueError: ``ensemble`` is unknown, ``tied`` is not a bool, or some ``V`` is outside
            ``[0, V_c)``.

    Example:
        >>> from deqlab.theory import linear
        >>> linear.length_variance("gaussian", 0.5)  # 2 / (1 - V)^4
        32.0
    """
    out = _gram_trace(ensemble, V, 2, tied, "theory.linear.length_variance")
    return 2.0 * out if np.ndim(out) else 2.0 * float(out)


def goe_length_variance_integral(V, nodes: int | None = None):
    """``(2/pi) int_{-1}^{1} sqrt(1 - x^2) / (1 - 2 sqrt(V) x)^4 dx`` (001 Eq. 81).

    The semicircle average of ``(1 - lambda)^{-4}``: the ``N -> inf`` value of
    ``tr[(I - W)^{-4}]`` for GOE ``W``, also the switched-limit series of 001 Eq. 80. It equals
    :func:`gram_trace` ``("goe", V, 2)`` = ``(1-4V)^{-5/2}`` (001 Eq. 148), which is how the two
    derivations of 001 are checked against each other. (001 calls this ``sigma^2(inf)``; it is
    half the length variance in the normalisation of :func:`length_variance`.)

    Evaluated by Gauss-Chebyshev quadrature of the second kind with ``nodes`` points (default:
    enough for relative error below ``1e-12``: the integrand's pole at ``1/(2 sqrt(V))`` sets
    the geometric convergence rate).

    Args:
        V: the variance, a number or an array with ``0 <= V < 1/4``.
        nodes: quadrature points, an integer >= 1; None: automatic.

    Returns:
        The integral: a float for a scalar ``V``, else an array.

    Raises:
        ValueError: some ``V`` is outside ``[0, 1/4)``, or ``nodes`` is not an integer >= 1.

    Example:
        >>> from deqlab.theory import linear
        >>> round(linear.goe_length_variance_integral(0.2), 9), round(linear.gram_trace("goe", 0.2), 9)
        (55.901699437, 55.901699437)
    """
    where = "theory.linear.goe_length_variance_integral"
    arr, scalar = _check_V(V, "goe", where)
    if nodes is None:
        # Convergence factor rho = a + sqrt(a^2 - 1) with a = 1/(2 sqrt(V)) (Bernstein ellipse).
        a = 1.0 / (2.0 * np.sqrt(np.maximum(arr.max(), 1e-300)))
        rho = a + math.sqrt(max(a * a - 1.0, 0.0))
        nodes = int(min(max(64, math.ceil(40.0 / math.log(rho)) + 64), 2_000_000))
    else:
        nodes = checks.positive_int(nodes, "nodes", where)
    k = np.arange(1, nodes + 1)
    theta = k * np.pi / (nodes + 1)
    x = np.cos(theta)
    w = np.pi / (nodes + 1) * np.sin(theta) ** 2
    sv = np.sqrt(arr)[..., None]
    vals = (2.0 / np.pi) * np.sum(w / (1.0 - 2.0 * sv * x) ** 4, axis=-1)
    return _out(vals, scalar)


# --------------------------------------------------------------------------------------------
# Divergence near V_c
# --------------------------------------------------------------------------------------------

# (amplitude A, exponent p) with quantity ~ A * delta^{-p}, delta = 1 - V/V_c.
_DIVERGENCE = {
    ("second", True, "gaussian"): (1.0, 1.0),
    ("second", True, "orthogonal"): (1.0, 1.0),
    ("second", True, "goe"): (2.0, 0.5),
    ("second", False, "gaussian"): (1.0, 1.0),
    ("second", False, "orthogonal"): (1.0, 1.0),
    ("second", False, "goe"): (1.0, 1.0),
    ("length", True, "gaussian"): (2.0, 4.0),
    ("length", True, "orthogonal"): (4.0, 3.0),
    ("length", True, "goe"): (2.0, 2.5),
    ("length", False, "gaussian"): (1.0, 3.0),
    ("length", False, "orthogonal"): (4.0, 2.0),
    ("length", False, "goe"): (1.0, 3.0),
}


def divergence(ensemble: str, quantity: str = "length", tied: bool = True) -> tuple[float, float]:
    """``(A, p)`` with ``quantity ~ A delta^{-p}`` as ``delta = 1 - V/V_c -> 0``.

    ``quantity`` is ``"second"`` (:func:`second_moment`) or ``"length"``
    (:func:`length_variance`). Exponents: second moment 1 (``1/2`` for the tied GOE, 001 §2.1.2,
    App. A.3); length variance, tied: 4 (Gaussian, 001 Eq. 19), 3 (orthogonal, Eq. 18),
    5/2 (GOE, Eq. 20, 86); untied: 2 (orthogonal, Eq. 15) and 3 (Gaussian and GOE; 001 §2.2.1
    states 2 for every ensemble, which holds only for the orthogonal one, see
    :func:`gram_trace`). The amplitudes follow from the closed forms, e.g. the tied GOE
    length variance is exactly ``2 delta^{-5/2}``.

    ``delta`` is relative to :func:`critical_variance` ``(ensemble, tied)``: for untied weights
    ``V_c = 1`` for every ensemble, the GOE included.

    Args:
        ensemble: one of :data:`ENSEMBLES`.
        quantity: ``"second"`` or ``"length"``.
        tied: tied or untied weights.

    Returns:
        ``(A, p)``, two Python floats.

    Raises:
        ValueError: ``ensemble`` or ``quantity`` is unknown, or ``tied`` is not a bool.

    Example:
        >>> from deqlab.theory import linear
        >>> linear.divergence("goe", "length")
        (2.0, 2.5)
    """
    where = "theory.linear.divergence"
    ensemble = _check_ensemble(ensemble, where)
    tied = _check_tied(tied, where)
    checks.choice(quantity, "quantity", ("second", "length"), where)
    return _DIVERGENCE[(quantity, tied, ensemble)]


def asymptote(ensemble: str, V, quantity: str = "length", tied: bool = True):
    """Leading term ``A delta^{-p}`` of :func:`divergence` at ``V`` (``delta = 1 - V/V_c``).

    For the tied GOE length variance this is 001 Eq. 86 in the variable ``delta = 1 - 4V``:
    ``2 delta^{-5/2}``, exact for all ``V``. In the paper's variable ``sqrt(V) = 1/2 - delta'``
    the leading term of ``tr[(I-W)^{-4}]`` (half the length variance) is ``delta'^{-5/2} / 32``
    (001 Eq. 85 with ``int_0^inf sqrt(y) (1+y)^{-4} dy = pi/16``), where 001 Eq. 86 prints 1/8.

    Args:
        ensemble: one of :data:`ENSEMBLES`.
        V: the variance, a number or an array with ``0 <= V < V_c``.
        quantity: ``"second"`` or ``"length"``.
        tied: tied or untied weights.

    Returns:
        ``A delta^{-p}``: a float for a scalar ``V``, else an array.

    Raises:
        ValueError: ``ensemble`` or ``quantity`` is unknown, ``tied`` is not a bool, or some ``V``
            is outside ``[0, V_c)``.

    Example:
        >>> from deqlab.theory import linear
        >>> round(linear.asymptote("goe", 0.2), 6) == round(linear.length_variance("goe", 0.2), 6)
        True
    """
    where = "theory.linear.asymptote"
    ensemble = _check_ensemble(ensemble, where)
    tied = _check_tied(tied, where)
    amp, p = divergence(ensemble, quantity, tied)
    vc = critical_variance(ensemble, tied)
    arr, scalar = _check_V(V, ensemble, where, tied)
    return _out(amp * (1.0 - arr / vc) ** (-p), scalar)


# --------------------------------------------------------------------------------------------
# Power series (tied weights) and NTK
# --------------------------------------------------------------------------------------------


def _catalan(k: np.ndarray) -> np.ndarray:
    # C_k = binom(2k, k) / (k + 1), via log-gamma to stay finite for large k.
    from math import lgamma

    return np.array([math.exp(lgamma(2 * i + 1) - 2 * lgamma(i + 1)) / (i + 1) for i in k])


def power_series(ensemble: str, V: float, quantity: str = "second", terms: int = 50) -> np.ndarray:
    """Partial sums ``S_0, ..., S_{terms-1}`` of the tied-weight power series in ``V``.

    These are the series that 001 App. A.3-A.4 sum to obtain the closed forms (``i`` indexes
    the total degree ``V^i``):

    - ``"second"``, Gaussian/orthogonal: ``sum_i V^i`` (001 Eq. 60); GOE:
      ``sum_i (2i+1) C_i V^i`` (001 Eq. 63).
    - ``"fourth"`` (``tr[(M^T M)^2]``), orthogonal: ``sum_i (i+1)^2 V^i`` (001 Eq. 79); GOE:
      ``sum_i binom(2i+3, 3) C_i V^i`` (001 Eq. 80: ``tr[W^{2i}] = C_i V^i`` times the number of
      ``(j,k,l,m)`` with ``j+k+l+m = 2i``), the Taylor series of Eq. 81; Gaussian:
      ``sum_i binom(i+3, 3) V^i``, the Taylor series of ``1/(1-V)^4`` (001 Eq. 191).

    For ``V < V_c`` they converge to :func:`second_moment` and :func:`gram_trace`; at finite
    ``N`` the matrix series itself diverges with non-zero probability (001 §2.2.2), which is why
    the closed forms are ``N -> inf`` limits.

    Args:
        ensemble: one of :data:`ENSEMBLES`.
        V: the variance, a scalar with ``0 <= V < V_c``.
        quantity: ``"second"`` or ``"fourth"``.
        terms: number of partial sums, an integer >= 1.

    Returns:
        A float64 array of the ``terms`` partial sums.

    Raises:
        ValueError: ``ensemble`` or ``quantity`` is unknown, ``V`` is not a scalar in
            ``[0, V_c)``, or ``terms < 1``.

    Example:
        >>> from deqlab.theory import linear
        >>> linear.power_series("gaussian", 0.5, "second", terms=4).tolist()  # -> 1 / (1 - V) = 2
        [1.0, 1.5, 1.75, 1.875]
    """
    where = "theory.linear.power_series"
    ensemble = _check_ensemble(ensemble, where)
    arr, scalar = _check_V(V, ensemble, where)
    if not scalar:
        raise checks.fail("V", "a scalar", V, where)
    checks.choice(quantity, "quantity", ("second", "fourth"), where)
    terms = checks.positive_int(terms, "terms", where)
    v = float(arr)
    i = np.arange(terms)
    powers = v ** i.astype(np.float64)
    if ensemble == "goe":
        c = _catalan(i)
        coef = (2 * i + 1) * c if quantity == "second" else (
            (2 * i + 3) * (2 * i + 2) * (2 * i + 1) / 6.0 * c
        )
    elif quantity == "second":
        coef = np.ones(terms)
    elif ensemble == "orthogonal":
        coef = (i + 1.0) ** 2
    else:
        coef = (i + 3.0) * (i + 2.0) * (i + 1.0) / 6.0
    return np.cumsum(coef * powers)


def ntk(ensemble: str, V, tied: bool = True):
    """Infinite-width NTK of the linear DEQ ``f(x) = v^T z*(x)`` w.r.t. ``W``, per ``x . x'``.

    001 §2.1.2 and App. B.1 (Eq. 93-95 with ``phi`` the identity):
    ``df/dW = (I - W)^{-T} v z*^T``, so
    ``Theta(x, x') = (v^T M M^T v) (z*(x) . z*(x'))``. With ``v`` i.i.d. ``N(0, 1/N)`` both factors
    concentrate, on ``tr[M M^T]`` and on ``tr[M^T M] x . x'``, giving
    ``Theta(x, x') -> second_moment(ensemble, V)^2 x . x'`` (001: ``(1/N^2) E[z* . z*]^2 x . x'``
    for unit-variance inputs). Returns ``second_moment(ensemble, V, tied) ** 2``.

    Args:
        ensemble: one of :data:`ENSEMBLES`.
        V: the variance, a number or an array with ``0 <= V < V_c``.
        tied: tied or untied weights.

    Returns:
        ``second_moment(ensemble, V, tied) ** 2``: a float for a scalar ``V``, else an array.

    Raises:
        ValueError: ``ensemble`` is unknown, ``tied`` is not a bool, or some ``V`` is outside
            ``[0, V_c)``.

    Example:
        >>> from deqlab.theory import linear
        >>> linear.ntk("gaussian", 0.5)
        4.0
    """
    m2 = _gram_trace(ensemble, V, 1, tied, "theory.linear.ntk")
    return m2**2 if np.ndim(m2) else float(m2) ** 2


def ntk_fluctuation(ensemble: str, V, tied: bool = True):
    """Finite-width fluctuation of the linear-DEQ NTK: ``lim N Var[Theta] / E[Theta]^2``.

    ``Theta = Theta(x, x) / x . x`` with ``Theta(x, x) = (v^T M M^T v)(z* . z*)`` as in :func:`ntk`
    (001 App. B.1, Eq. 93-95 with ``phi`` the identity). The variance is not in 001; it follows
    from the two factors being, for a fixed ``W``, independent Gaussian quadratic forms in ``v``
    (``N(0, I/N)``) and ``x`` (``N(0, I)``): with ``m2 = tr[M^T M]`` and ``r = tr[(M^T M)^2]``
    (both self-averaging in ``W``, so ``W`` only contributes at order ``1/N^2``),
    ``N Var[v^T M M^T v] / m2^2 -> 2 r / m2^2`` and, for the ratio ``x^T M^T M x / x . x``,
    ``2 r / m2^2 - 2`` (the covariance with ``x . x`` removes ``4/N``, its variance adds ``2/N``).
    Relative variances of independent factors add to first order, so the limit is
    ``4 gram_trace(power=2) / gram_trace(power=1)**2 - 2``: 2 for ``V = 0`` (only the readout
    ``v . v`` fluctuates), diverging
    near ``V_c`` with the exponent of :func:`length_variance` minus twice that of
    :func:`second_moment`.

    Args:
        ensemble: one of :data:`ENSEMBLES`.
        V: the variance, a number or an array with ``0 <= V < V_c``.
        tied: tied or untied weights.

    Returns:
        ``lim N Var[Theta] / E[Theta]^2``: a float for a scalar ``V``, else an array.

    Raises:
        ValueError: ``ensemble`` is unknown, ``tied`` is not a bool, or some ``V`` is outside
            ``[0, V_c)``.

    Example:
        >>> from deqlab.theory import linear
        >>> linear.ntk_fluctuation("gaussian", 0.0)  # only the readout fluctuates
        2.0
    """
    where = "theory.linear.ntk_fluctuation"
    quartic = _gram_trace(ensemble, V, 2, tied, where)
    m2 = _gram_trace(ensemble, V, 1, tied, where)
    out = 4.0 * np.asarray(quartic) / np.asarray(m2) ** 2 - 2.0
    return out if np.ndim(out) else float(out)


# --------------------------------------------------------------------------------------------
# Finite N: edge fluctuations of the spectral radius (Tracy-Widom, Gumbel)
# --------------------------------------------------------------------------------------------

# The Hastings-McLeod solution is integrated once, from _TW_RIGHT (where q = Ai to float64
# precision, since q - Ai = O(Ai^3)) down to _TW_LEFT (where F_1 < 1e-34 and F_2 < 1e-61).
_TW_RIGHT = 8.0
_TW_LEFT = -12.0


@functools.lru_cache(maxsize=1)
def _hastings_mcleod():
    """Dense solution of ``y = (q, q', u, v, w)`` on ``[_TW_LEFT, _TW_RIGHT]``.

    ``q'' = s q + 2 q^3`` with ``q ~ Ai(s)`` as ``s -> inf`` (Painleve II, Hastings-McLeod), and
    the tail integrals ``u = int_s^inf q^2``, ``v = int_s^inf (x - s) q^2 = int_s^inf u``,
    ``w = int_s^inf q``, so that ``u' = -q^2``, ``v' = -u``, ``w' = -q``.
    """
    s0 = _TW_RIGHT
    ai, aip, _, _ = scipy.special.airy(s0)
    y0 = [ai, aip, *_airy_tails(s0, exact=True)]
    sol = scipy.integrate.solve_ivp(
        lambda s, y: [y[1], s * y[0] + 2.0 * y[0] ** 3, -y[0] ** 2, -y[2], -y[0]],
        (s0, _TW_LEFT), y0, method="DOP853", rtol=1e-13, atol=1e-300, dense_output=True,
    )
    if not sol.success:  # pragma: no cover - a fixed, well-conditioned problem
        raise RuntimeError(f"theory.linear: Painleve II integration failed: {sol.message}")
    return sol.sol


def _airy_tails(s: np.ndarray, exact: bool = False):
    """``(u, v, w)`` of :func:`_hastings_mcleod` with ``q = Ai``, for ``s >= _TW_RIGHT``.

    ``int_s^inf Ai^2 = Ai'^2 - s Ai^2`` and ``int_s^inf (x-s) Ai^2 = (2 s^2 Ai^2 - 2 s Ai'^2 -
    Ai Ai') / 3`` exactly. ``w = int_s^inf Ai`` by quadrature when ``exact`` (the initial value
    of the integration), otherwise by its leading asymptotic ``Ai(s) / sqrt(s)`` (relative error
    ``O(s^{-3/2})`` on a quantity below ``1e-9``, so below ``1e-9`` in ``F_beta``).
    """
    ai, aip, _, _ = scipy.special.airy(s)
    u = aip**2 - s * ai**2
    v = (2.0 * s**2 * ai**2 - 2.0 * s * aip**2 - ai * aip) / 3.0
    if exact:
        w = scipy.integrate.quad(lambda x: scipy.special.airy(x)[0], float(s), np.inf,
                                 epsabs=0.0, epsrel=1e-13)[0]
    else:
        w = ai / np.sqrt(s)
    return u, v, w


def tracy_widom_cdf(s, beta: int = 1):
    """Tracy-Widom distribution function ``F_beta(s)`` for ``beta = 1`` (GOE) or 2 (GUE).

    ``F_2(s) = exp(-int_s^inf (x - s) q(x)^2 dx)`` and
    ``F_1(s) = exp(-(1/2) int_s^inf q(x) dx) F_2(s)^{1/2}`` with ``q`` the Hastings-McLeod
    solution of Painleve II, ``q'' = s q + 2 q^3``, ``q(s) ~ Ai(s)`` as ``s -> inf`` (Tracy and
    Widom 1994, 1996; the reference cited by 001 §2.2.3 for the edge fluctuations). ``q`` is
    integrated once from ``s = 8`` (where ``q = Ai`` to float64 precision) down to ``s = -12``
    with an 8th-order Runge-Kutta method at relative tolerance ``1e-13``; beyond ``s = 8`` the
    Airy tails are used in closed form, below ``s = -12`` the result is 0 (``F_1(-12) < 1e-34``).
    For the GOE normalised as in :mod:`deqlab.ensembles` (off-diagonal variance ``1/N``),
    ``N^{2/3} (lambda_max - 2)`` converges in law to ``F_1``.

    Checked in ``tests/theory/test_theory_linear_edge.py`` against the known moments (``F_1``: mean
    ``-1.2065``, standard deviation ``1.2680``; ``F_2``: mean ``-1.7711``) and against sampled GOE
    largest eigenvalues.

    Args:
        s: real numbers (a scalar or an array; +-inf allowed).
        beta: 1 (GOE) or 2 (GUE).

    Returns:
        ``F_beta(s)``: a float for a scalar ``s``, else an array of its shape.

    Raises:
        ValueError: ``beta`` is not 1 or 2, or ``s`` is not real or holds NaN.

    Example:
        >>> from deqlab.theory import linear
        >>> round(linear.tracy_widom_cdf(-1.2065), 4)  # F_1 at its own mean
        0.5197
    """
    where = "theory.linear.tracy_widom_cdf"
    beta = checks.integer(beta, "beta", where, minimum=1, maximum=2)
    try:
        arr = np.asarray(s, dtype=np.float64)
    except (TypeError, ValueError):
        raise checks.fail("s", "real numbers (not NaN; +-inf allowed)", s, where) from None
    if np.any(np.isnan(arr)):
        raise checks.fail("s", "real numbers (not NaN; +-inf allowed)", float("nan"), where)
    scalar = arr.ndim == 0
    flat = np.atleast_1d(arr).ravel()
    out = np.zeros_like(flat)
    mid = (flat >= _TW_LEFT) & (flat <= _TW_RIGHT)
    right = flat > _TW_RIGHT
    if np.any(mid):
        _, _, _, v, w = _hastings_mcleod()(flat[mid])
        out[mid] = np.exp(-v) if beta == 2 else np.exp(-0.5 * v - 0.5 * w)
    if np.any(right):
        x = np.minimum(flat[right], 1e3)  # the tails underflow long before; keeps Ai finite
        _, v, w = _airy_tails(x)
        out[right] = np.exp(-v) if beta == 2 else np.exp(-0.5 * v - 0.5 * w)
    out = out.reshape(np.shape(arr))
    return float(out) if scalar else out


MAX_N = 2**53
"""Largest width ``N`` accepted by :func:`edge_scaling`, :func:`edge_failure_probability` and
:func:`reliable_delta` (every integer up to it is exact in float64)."""


def _check_width(N, where: str) -> int:
    """``2 <= N <= MAX_N``."""
    N = checks.integer(N, "N", where, minimum=2)
    if N > MAX_N:
        shown = N if N.bit_length() <= 64 else f"an integer >= 2**{N.bit_length() - 1}"
        raise checks.fail("N", "an integer >= 2 and <= 2**53 (theory.linear.MAX_N)", shown, where)
    return N


def _ginibre_gamma(N: int) -> float:
    # gamma_{N/2} with gamma_n = log(n / (2 pi)) - 2 log log n (Rider 2003; Rider-Sinclair 2014).
    n = N / 2.0
    return math.log(n / (2.0 * math.pi)) - 2.0 * math.log(math.log(n))


GINIBRE_MIN_N = next(n for n in range(5, 10**4) if _ginibre_gamma(n) > 0)
"""Smallest ``N`` at which the real-Ginibre Gumbel centring of :func:`edge_scaling` exists
(``gamma_{N/2} > 0``)."""


def edge_scaling(ensemble: str, N: int) -> tuple[float, float]:
    """``(centre, width)`` of the spectral radius ``rho(W0)`` of one ``N x N`` draw (``V = 1``).

    ``(rho - centre) / width`` converges in law as ``N -> inf`` to

    - ``"goe"``: ``centre = 2``, ``width = N^{-2/3}``; the law is ``F_1(x)^2``
      (:func:`tracy_widom_cdf`), because ``rho = max(lambda_max, -lambda_min)`` and the two
      edges are asymptotically independent, each Tracy-Widom ``beta = 1``.
    - ``"gaussian"`` (real Ginibre): ``centre = 1 + sqrt(gamma / (4N))``,
      ``width = 1 / sqrt(4 N gamma)`` with ``gamma = gamma_{N/2}``,
      ``gamma_n = log(n / (2 pi)) - 2 log log n``; the law is Gumbel, ``exp(-e^{-t})``. This
      is Rider (2003) for complex Ginibre (with ``gamma_N``) as extended by Rider and Sinclair
      (2014) to real Ginibre, where the ``N/2`` conjugate pairs replace the ``N`` independent
      moduli (``gamma_{N/2}``). It needs ``gamma_{N/2} > 0``, i.e. ``N >=``
      :data:`GINIBRE_MIN_N`, and converges slowly: the Kolmogorov distance to the limit decays
      like ``log log N / log N`` (Ma and Meng 2025, complex case).

    The orthogonal ensemble has ``rho = 1`` exactly and no edge law (ValueError). ``N`` is an
    integer with ``2 <= N <=`` :data:`MAX_N` (``2**53``).

    Args:
        ensemble: ``"gaussian"`` or ``"goe"``.
        N: the width, an integer with ``2 <= N <=`` :data:`MAX_N` (``>=`` :data:`GINIBRE_MIN_N`
            for ``"gaussian"``).

    Returns:
        ``(centre, width)``, two Python floats.

    Raises:
        ValueError: ``ensemble`` is ``"orthogonal"`` or unknown, or ``N`` is out of range.

    Example:
        >>> from deqlab.theory import linear
        >>> centre, width = linear.edge_scaling("goe", 1000)
        >>> centre, round(width, 6)
        (2.0, 0.01)
    """
    where = "theory.linear.edge_scaling"
    ensemble = _check_ensemble(ensemble, where)
    if ensemble == "orthogonal":
        raise checks.fail("ensemble", "'gaussian' or 'goe' (the orthogonal spectral radius is "
                          "exactly 1: no edge law)", ensemble, where)
    N = _check_width(N, where)
    if ensemble == "goe":
        return 2.0, float(N) ** (-2.0 / 3.0)
    if N < GINIBRE_MIN_N:
        raise checks.fail("N", f"an integer >= {GINIBRE_MIN_N} for the Gumbel centring of the "
                          "real Ginibre radius (gamma_(N/2) > 0)", N, where)
    g = _ginibre_gamma(N)
    return 1.0 + math.sqrt(g / (4.0 * N)), 1.0 / math.sqrt(4.0 * N * g)


def _check_delta(delta, where: str) -> tuple[np.ndarray, bool]:
    requirement = "real numbers in (0, 1] (V = V_c (1 - delta) below V_c)"
    try:
        arr = np.asarray(delta, dtype=np.float64)
    except (TypeError, ValueError):
        raise checks.fail("delta", requirement, delta, where) from None
    if arr.size == 0 or not np.all((arr > 0) & (arr <= 1)):
        raise checks.fail("delta", requirement, delta, where)
    return arr, arr.ndim == 0


def edge_failure_probability(ensemble: str, N: int, delta):
    """Large-``N`` probability that the tied iteration diverges at ``V = V_c (1 - delta)``.

    The iteration ``z_{t+1} = sqrt(V) W0 z_t + x`` (001 Eq. 3) diverges for some ``x`` iff
    ``sqrt(V) rho(W0) >= 1`` (001 Eq. 5, App. A.3: "non-zero probability that the spectral
    edge is greater than 1"), i.e. iff ``rho >= r = 1 / sqrt(V_c (1 - delta))``. With
    :func:`edge_scaling`: ``1 - F_1(x)^2`` with ``x = N^{2/3} (r - 2)`` for the GOE
    (``x ~ delta N^{2/3}`` for small ``delta``), ``1 - exp(-e^{-t})`` with
    ``t = (r - centre) / width`` for real Ginibre; 0 for the orthogonal ensemble.
    ``2 <= N <=`` :data:`MAX_N`.

    Args:
        ensemble: one of :data:`ENSEMBLES`.
        N: the width, an integer with ``2 <= N <=`` :data:`MAX_N`.
        delta: distance to the transition, numbers in ``(0, 1]``.

    Returns:
        The probability: a float for a scalar ``delta``, else an array.

    Raises:
        ValueError: ``ensemble`` is unknown, ``N`` is out of range (or too small for the Gumbel
            law of ``"gaussian"``), or some ``delta`` is outside ``(0, 1]``.

    Example:
        >>> from deqlab.theory import linear
        >>> linear.edge_failure_probability("orthogonal", 100, 0.1)
        0.0
        >>> linear.edge_failure_probability("goe", 1000, 0.1) < 1e-10
        True
    """
    where = "theory.linear.edge_failure_probability"
    ensemble = _check_ensemble(ensemble, where)
    N = _check_width(N, where)
    d, scalar = _check_delta(delta, where)
    if ensemble == "orthogonal":
        return _out(np.zeros_like(d), scalar)
    centre, width = edge_scaling(ensemble, N)
    with np.errstate(divide="ignore"):  # delta = 1 is V = 0: r = inf, never diverges
        r = 1.0 / np.sqrt(critical_variance(ensemble) * (1.0 - d))
    scaled = (r - centre) / width
    if ensemble == "goe":
        p = 1.0 - tracy_widom_cdf(scaled, beta=1) ** 2
    else:
        p = -np.expm1(-np.exp(-scaled))
    return _out(np.asarray(p, dtype=np.float64), scalar)


def reliable_delta(ensemble: str, N: int, risk: float = 0.05) -> float:
    """Smallest ``delta`` at which :func:`edge_failure_probability` is at most ``risk``.

    Closer to the transition than this, a fraction above ``risk`` of width-``N`` draws has
    ``sqrt(V) rho(W0) >= 1`` and the ``N -> inf`` closed forms of this module describe no finite
    sample. GOE: ``x`` solves ``F_1(x)^2 = 1 - risk``, then ``delta = 1 - 4 / (2 + x N^{-2/3})^2
    ~ x N^{-2/3}``. Real Ginibre: ``t = -log(-log(1 - risk))`` and
    ``delta = 1 - (centre + t width)^{-2} ~ sqrt(log N / N)``. Orthogonal: 0.
    ``2 <= N <=`` :data:`MAX_N`.

    Args:
        ensemble: one of :data:`ENSEMBLES`.
        N: the width, an integer with ``2 <= N <=`` :data:`MAX_N`.
        risk: the accepted probability of divergence, in ``(0, 1)``.

    Returns:
        ``delta``, a Python float in ``[0, 1)``.

    Raises:
        ValueError: ``ensemble`` is unknown, ``N`` is out of range, or ``risk`` is not in
            ``(0, 1)``.

    Example:
        >>> from deqlab.theory import linear
        >>> round(linear.reliable_delta("goe", 1000), 4)
        0.0143
    """
    where = "theory.linear.reliable_delta"
    ensemble = _check_ensemble(ensemble, where)
    N = _check_width(N, where)
    r = checks.number(risk, "risk", where, lower=0.0, upper=1.0, lower_open=True, upper_open=True)
    if ensemble == "orthogonal":
        return 0.0
    centre, width = edge_scaling(ensemble, N)
    if ensemble == "goe":
        x = scipy.optimize.brentq(lambda s: tracy_widom_cdf(s, 1) ** 2 - (1.0 - r),
                                  _TW_LEFT + 1.0, 50.0, xtol=1e-12)
    else:
        x = -math.log(-math.log1p(-r))
    radius = centre + x * width
    return float(max(0.0, 1.0 - 1.0 / (critical_variance(ensemble) * radius**2)))
