"""The nonlinearities of the book, in one registry: NumPy and JAX forms side by side.

Each entry is a :class:`Nonlinearity` holding ``phi`` and its derivative ``phi'`` twice: a NumPy
float64 form (for quadrature in :mod:`deqlab.theory`) and a JAX form (for simulations, ``jit`` /
``vmap`` safe), plus the points where ``phi'`` jumps (``kinks``, where quadrature must split its
interval). The six nonlinearities of chapter 2 (002 Table 1 and §5):

========================  =======================================  ================================
name                      ``phi(h)``                               ``phi'(h)``
========================  =======================================  ================================
``"linear"``              ``h``                                    ``1``
``"relu"``                ``max(h, 0)``                            ``1[h > 0]``
``"hard_tanh"``           ``clip(h, -1, 1)``                       ``1[|h| < 1]``
``"erf"``                 ``erf(sqrt(pi) h / 2)``                  ``exp(-pi h^2 / 4)``
``"shifted_relu"``        ``max(h + 1/2, 0) - 1/2``                ``1[h > -1/2]``
``"silu"``                ``h sigmoid(h)``                         ``s (1 + h (1 - s))``, ``s = sigmoid(h)``
========================  =======================================  ================================

The erf is scaled so that ``phi'(0) = 1`` (002 §5). At a kink the derivative takes the value of
the open side written above (``relu'(0) = 0``); a set of measure zero for every Gaussian average.

Use::

    from deqlab import nonlinearities
    erf = nonlinearities.get("erf")
    erf.numpy(h), erf.derivative_numpy(h)   # float64 NumPy
    erf.jax(h), erf.derivative_jax(h)       # JAX, keeps the dtype of h

Inside ``jit`` with the nonlinearity as a traced integer (one compilation for all of them), use
:func:`index` and :func:`apply_jax` / :func:`derivative_apply_jax` (a ``lax.switch`` over the
registry, in the order of :data:`NONLINEARITIES`; a concrete code out of range is an error, a
traced one is clamped by ``lax.switch``).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

from deqlab import checks

__all__ = [
    "NONLINEARITIES",
    "Nonlinearity",
    "get",
    "index",
    "apply_jax",
    "derivative_apply_jax",
]

# erf(ERF_SCALE h) has slope 1 at h = 0 (002 §5).
_ERF_SCALE = math.sqrt(math.pi) / 2


@dataclass(frozen=True)
class Nonlinearity:
    """One nonlinearity ``phi`` with its derivative, in NumPy (float64) and JAX forms.

    Attributes:
      name: registry name.
      numpy: ``phi(h)`` on NumPy arrays, computed in float64.
      derivative_numpy: ``phi'(h)``, NumPy float64.
      jax: ``phi(h)`` on JAX arrays (keeps the dtype of ``h``; ``jit``/``vmap`` safe).
      derivative_jax: ``phi'(h)``, JAX.
      kinks: the points where ``phi'`` jumps (empty for smooth ``phi``).
      binary_slope: ``phi'`` takes only the values 0 and 1, so ``D^2 = diag(phi'(h)^2)`` is a
        Bernoulli spectrum (the Bernoulli universality class of 002 §5, Table 1).
      reference: where the book takes it from.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab import nonlinearities
        >>> relu = nonlinearities.get("relu")
        >>> relu.kinks, relu.binary_slope, relu.jax(jnp.array([-1.0, 2.0])).tolist()
        ((0.0,), True, [0.0, 2.0])
    """

    name: str
    numpy: Callable[[Any], np.ndarray]
    derivative_numpy: Callable[[Any], np.ndarray]
    jax: Callable[[jax.Array], jax.Array]
    derivative_jax: Callable[[jax.Array], jax.Array]
    kinks: tuple[float, ...] = ()
    binary_slope: bool = False
    reference: str = ""


def _f64(h) -> np.ndarray:
    return np.asarray(h, dtype=np.float64)


def _silu_derivative_numpy(h):
    s = special.expit(_f64(h))
    return s * (1 + _f64(h) * (1 - s))


def _silu_derivative_jax(h):
    s = jax.nn.sigmoid(h)
    return s * (1 + h * (1 - s))


_REGISTRY: dict[str, Nonlinearity] = {
    nl.name: nl
    for nl in (
        Nonlinearity(
            "linear",
            numpy=lambda h: _f64(h),
            derivative_numpy=lambda h: np.ones_like(_f64(h)),
            jax=lambda h: h,
            derivative_jax=lambda h: jnp.ones_like(h),
            binary_slope=True,
            reference="002 Table 1",
        ),
        Nonlinearity(
            "relu",
            numpy=lambda h: np.maximum(_f64(h), 0.0),
            derivative_numpy=lambda h: (_f64(h) > 0).astype(np.float64),
            jax=lambda h: jnp.maximum(h, 0),
            derivative_jax=lambda h: (h > 0).astype(h.dtype),
            kinks=(0.0,),
            binary_slope=True,
            reference="002 Table 1",
        ),
        Nonlinearity(
            "hard_tanh",
            numpy=lambda h: np.clip(_f64(h), -1.0, 1.0),
            derivative_numpy=lambda h: (np.abs(_f64(h)) < 1).astype(np.float64),
            jax=lambda h: jnp.clip(h, -1, 1),
            derivative_jax=lambda h: (jnp.abs(h) < 1).astype(h.dtype),
            kinks=(-1.0, 1.0),
            binary_slope=True,
            reference="002 Table 1",
        ),
        Nonlinearity(
            "erf",
            numpy=lambda h: special.erf(_ERF_SCALE * _f64(h)),
            derivative_numpy=lambda h: np.exp(-math.pi * _f64(h) ** 2 / 4),
            jax=lambda h: jax.scipy.special.erf(_ERF_SCALE * h),
            derivative_jax=lambda h: jnp.exp(-math.pi * h**2 / 4),
            reference="002 §5",
        ),
        Nonlinearity(
            "shifted_relu",
            numpy=lambda h: np.maximum(_f64(h) + 0.5, 0.0) - 0.5,
            derivative_numpy=lambda h: (_f64(h) > -0.5).astype(np.float64),
            jax=lambda h: jnp.maximum(h + 0.5, 0) - 0.5,
            derivative_jax=lambda h: (h > -0.5).astype(h.dtype),
            kinks=(-0.5,),
            binary_slope=True,
            reference="002 §5",
        ),
        Nonlinearity(
            "silu",
            numpy=lambda h: _f64(h) * special.expit(_f64(h)),
            derivative_numpy=_silu_derivative_numpy,
            jax=lambda h: h * jax.nn.sigmoid(h),
            derivative_jax=_silu_derivative_jax,
            reference="002 §5",
        ),
    )
}

NONLINEARITIES: tuple[str, ...] = tuple(_REGISTRY)
"""Names of the registered nonlinearities, in the order used by :func:`index`."""


def get(name: str, where: str | None = None) -> Nonlinearity:
    """The :class:`Nonlinearity` called ``name`` (one of :data:`NONLINEARITIES`).

    Args:
        name: one of :data:`NONLINEARITIES`.
        where: the public function that asks, for the error message.

    Returns:
        The registry entry.

    Raises:
        ValueError: ``name`` is not one of :data:`NONLINEARITIES`.

    Example:
        >>> from deqlab import nonlinearities
        >>> erf = nonlinearities.get("erf")
        >>> float(erf.derivative_numpy(0.0))  # scaled to slope 1 at 0 (002 §5)
        1.0
    """
    return _REGISTRY[checks.choice(name, "nonlinearity", NONLINEARITIES, where)]


def index(name: str, where: str | None = None) -> int:
    """Position of ``name`` in :data:`NONLINEARITIES`: the branch of :func:`apply_jax`.

    Args:
        name: one of :data:`NONLINEARITIES`.
        where: the public function that asks, for the error message.

    Returns:
        An int in ``[0, len(NONLINEARITIES))``.

    Raises:
        ValueError: ``name`` is not one of :data:`NONLINEARITIES`.

    Example:
        >>> from deqlab import nonlinearities
        >>> nonlinearities.NONLINEARITIES[nonlinearities.index("relu")]
        'relu'
    """
    return NONLINEARITIES.index(checks.choice(name, "nonlinearity", NONLINEARITIES, where))


_PHI_BRANCHES = tuple(_REGISTRY[name].jax for name in NONLINEARITIES)
_DPHI_BRANCHES = tuple(_REGISTRY[name].derivative_jax for name in NONLINEARITIES)


def _check_code(code, where: str):
    """A concrete ``code`` checked in ``[0, len(NONLINEARITIES))``; a traced one is returned as is
    (its value cannot be read inside ``jit``: ``lax.switch`` clamps it into that range)."""
    if checks.is_traced(code):
        return code
    n = len(NONLINEARITIES)
    requirement = (f"an integer in the range 0 <= code < {n} (a position in NONLINEARITIES; get it from "
                   "index(name))")
    if isinstance(code, (bool, np.bool_)):
        raise checks.fail("code", requirement, code, where)
    try:
        value = operator.index(code)
    except TypeError:
        raise checks.fail("code", requirement, code, where) from None
    if not 0 <= value < n:
        raise checks.fail("code", requirement, code, where)
    return value


def apply_jax(code, h: jax.Array) -> jax.Array:
    """``phi(h)`` for the nonlinearity ``NONLINEARITIES[code]``; ``code`` may be traced.

    A ``lax.switch`` over the registry, so that one compiled function serves every
    nonlinearity. Get ``code`` from :func:`index`.

    Args:
        code: position in :data:`NONLINEARITIES` (an int, or a traced integer scalar).
        h: pre-activations, a JAX array.

    Returns:
        ``phi(h)``, of the shape and dtype of ``h``.

    Raises:
        ValueError: a concrete ``code`` is not an integer in ``0 <= code < len(NONLINEARITIES)``
            (a traced ``code`` cannot be checked and is clamped into that range by
            ``lax.switch``).

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab import nonlinearities
        >>> code = nonlinearities.index("hard_tanh")
        >>> nonlinearities.apply_jax(code, jnp.array([-3.0, 0.5])).tolist()
        [-1.0, 0.5]
    """
    return jax.lax.switch(_check_code(code, "nonlinearities.apply_jax"), _PHI_BRANCHES, h)


def derivative_apply_jax(code, h: jax.Array) -> jax.Array:
    """``phi'(h)`` for the nonlinearity ``NONLINEARITIES[code]``; ``code`` may be traced.

    Args:
        code: position in :data:`NONLINEARITIES` (an int, or a traced integer scalar).
        h: pre-activations, a JAX array.

    Returns:
        ``phi'(h)``, of the shape and dtype of ``h``.

    Raises:
        ValueError: a concrete ``code`` is not an integer in ``0 <= code < len(NONLINEARITIES)``
            (a traced one is clamped by ``lax.switch``).

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab import nonlinearities
        >>> code = nonlinearities.index("relu")
        >>> nonlinearities.derivative_apply_jax(code, jnp.array([-1.0, 1.0])).tolist()
        [0.0, 1.0]
    """
    return jax.lax.switch(_check_code(code, "nonlinearities.derivative_apply_jax"), _DPHI_BRANCHES, h)
