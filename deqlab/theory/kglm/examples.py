"""The six scalar DEQ layers of 004 Figure 2 and what their fixed points do (004 §2, Thm. 1, Prop. 2).

004 Figure 2 plots six layers ``z -> g(z; Y)`` of Eq. 1 with ``Y = 0`` and ``d_z = 1`` on the
interval ``[-1, 1]`` against the identity:

====  ===================  =============================================================
key   layer                004's caption
====  ===================  =============================================================
a     tanh(0.9 z + 2)      derivative <= 0.9: a contraction, one fixed point
b     tanh(z)              derivative <= 1; "satisfies Prop. 2 on (-1, 0) and (0, 1)"
c     tanh(-3 z)           not a contraction, yet one fixed point
d     tanh(3 z)            not a contraction, three fixed points
e     relu(z + 0.2)        not a contraction, no fixed point
f     relu(z)              not a contraction, uncountably many fixed points ([0, inf))
====  ===================  =============================================================

Erratum (checked in ``tests/theory/test_kglm_examples.py``): (b) does *not* satisfy Proposition 2 on
``(0, 1)``: ``sup_{(0, 1)} |tanh'| = 1`` (approached at 0), so no ``lambda < 1`` bounds the
derivative, and ``tanh`` is not a contraction on ``[0, 1]`` (``tanh(z) / z -> 1``). Its fixed point
0 is unique for another reason (``|tanh z| < |z|`` for ``z != 0``), and plain iteration reaches it
only sublinearly, ``z_r^2 ~ 3 / (2 r)``.

:func:`figure2_maps` returns the maps; :func:`iterate` runs plain (Picard) iteration from many
starts at once; :func:`fixed_points` locates the fixed points on an interval from a grid;
:func:`derivative_bound` is the supremum of ``|g'|`` of Prop. 2 on an open interval.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import checks

__all__ = [
    "ScalarMap",
    "FIGURE2_KEYS",
    "figure2_maps",
    "iterate",
    "FixedPoints",
    "fixed_points",
    "derivative_bound",
    "tanh_fixed_point",
]

FIGURE2_KEYS: tuple[str, ...] = ("a", "b", "c", "d", "e", "f")
"""Panel labels of 004 Figure 2, in the paper's order."""


@dataclasses.dataclass(frozen=True)
class ScalarMap:
    r"""One layer ``g(z)`` of 004 Figure 2 (Eq. 1 with ``Y = 0``, ``d_z = 1``).

    Attributes:
        key: the panel, ``"a"`` ... ``"f"``.
        label: the layer as 004 writes it, in TeX (``r"\tanh(0.9z+2)"``).
        function: ``g``, elementwise and traceable (``jax.numpy``).
        slope: ``a`` in ``g(z) = phi(a z + b)``.
        shift: ``b`` in ``g(z) = phi(a z + b)``.
        activation: ``"tanh"`` or ``"relu"``.
        fixed_point_count: 004's count on the real line (``math.inf`` for uncountably many).

    Example:
        >>> from deqlab.theory.kglm import examples
        >>> layer = examples.figure2_maps()["a"]  # tanh(0.9 z + 2)
        >>> round(float(layer(0.0)), 6), layer.fixed_point_count
        (0.964028, 1)
    """

    key: str
    label: str
    function: Callable[[Any], Any]
    slope: float
    shift: float
    activation: str
    fixed_point_count: float

    def __call__(self, z: Any) -> jax.Array:
        """``g(z)`` elementwise.

        Args:
            z: a number or an array.

        Returns:
            ``g(z)``, a JAX array.
        """
        return self.function(jnp.asarray(z))

    def derivative(self, z: Any) -> jax.Array:
        """``g'(z)`` elementwise (for ReLU the right derivative at the kink, as ``jax.grad`` gives).

        Args:
            z: a number or an array.

        Returns:
            ``g'(z)``, a JAX array.
        """
        return jax.vmap(jax.grad(self.function))(jnp.ravel(jnp.asarray(z, dtype=jnp.result_type(float))))


def _layer(activation: str, slope: float, shift: float) -> Callable[[Any], Any]:
    if activation == "tanh":
        return lambda z: jnp.tanh(slope * z + shift)
    return lambda z: jax.nn.relu(slope * z + shift)


@functools.lru_cache(maxsize=1)
def figure2_maps() -> dict[str, ScalarMap]:
    """The six layers of 004 Figure 2, keyed ``"a"`` ... ``"f"`` (see the module docstring).

    Returns:
        A dict of :class:`ScalarMap` (cached: the same dict every call).

    Example:
        >>> from deqlab.theory.kglm import examples
        >>> maps = examples.figure2_maps()
        >>> list(maps), maps["d"].fixed_point_count
        (['a', 'b', 'c', 'd', 'e', 'f'], 3)
    """
    spec = {
        "a": ("tanh", 0.9, 2.0, r"\tanh(0.9z+2)", 1),
        "b": ("tanh", 1.0, 0.0, r"\tanh(z)", 1),
        "c": ("tanh", -3.0, 0.0, r"\tanh(-3z)", 1),
        "d": ("tanh", 3.0, 0.0, r"\tanh(3z)", 3),
        "e": ("relu", 1.0, 0.2, r"\mathrm{ReLU}(z+0.2)", 0),
        "f": ("relu", 1.0, 0.0, r"\mathrm{ReLU}(z)", math.inf),
    }
    return {key: ScalarMap(key, label, _layer(act, a, b), a, b, act, count)
            for key, (act, a, b, label, count) in spec.items()}


def _get_map(g: Any, where: str) -> ScalarMap:
    if isinstance(g, ScalarMap):
        return g
    key = checks.choice(g, "g", FIGURE2_KEYS, where)
    return figure2_maps()[key]


def iterate(g: Any, z0: Any, steps: int, damping: float = 1.0) -> np.ndarray:
    """Plain (``damping = 1``) or damped Picard iteration ``z <- (1 - damping) z + damping g(z)``
    (004 §2: "update the current estimate z_r to be H(z_{r-1})") from every start in ``z0``.

    Args:
        g: a :class:`ScalarMap` or its key ``"a"`` ... ``"f"``.
        z0: starts, a number or a 1-D array.
        steps: number of steps ``r``, an integer >= 1.
        damping: in (0, 1].

    Returns:
        ``(steps + 1, len(z0))`` float array, row ``r`` the iterates ``z_r`` (row 0 the starts).

    Raises:
        ValueError: ``g`` is not a :class:`ScalarMap` or a key, ``z0`` is not finite, ``steps < 1``
            or ``damping`` is not in (0, 1].

    Example:
        >>> from deqlab.theory.kglm import examples
        >>> examples.iterate("a", 0.0, steps=2).astype(float).round(4).ravel().tolist()
        [0.0, 0.964, 0.9936]
    """
    where = "examples.iterate"
    g = _get_map(g, where)
    steps = checks.positive_int(steps, "steps", where)
    damping = checks.unit_interval(damping, "damping", where)
    z0 = np.atleast_1d(np.asarray(z0, dtype=np.float64))
    if z0.ndim != 1 or not np.all(np.isfinite(z0)):
        raise checks.fail("z0", "a finite number or 1-D array of starts", z0, where)
    return np.asarray(_run(g.function, jnp.asarray(z0), steps, damping))


@functools.partial(jax.jit, static_argnums=(0, 2))
def _run(function, z0, steps, damping):
    def step(z, _):
        z = (1.0 - damping) * z + damping * function(z)
        return z, z

    _, path = jax.lax.scan(step, z0, None, length=steps)
    return jnp.concatenate([z0[None], path])


class FixedPoints(NamedTuple):
    """Result of :func:`fixed_points`.

    Attributes:
        points: the isolated fixed points, refined by bisection.
        intervals: the ``(lo, hi)`` sub-intervals of the grid on which ``g(z) = z`` holds
            identically.

    Example:
        >>> from deqlab.theory.kglm import examples
        >>> result = examples.fixed_points("a")  # tanh(0.9 z + 2): one fixed point
        >>> result.points.round(3).tolist(), result.intervals
        ([0.994], [])
    """

    points: np.ndarray
    intervals: list


def fixed_points(g: Any, interval: tuple[float, float] = (-1.0, 1.0), grid: int = 20001) -> FixedPoints:
    """The fixed points of a scalar map on a closed ``interval``, from the sign of ``g(z) - z``.

    Isolated roots are located between grid points of opposite sign (or at a grid point where
    the difference is exactly 0 with a sign change across it) and refined by bisection to
    ``1e-14``; runs of grid points with ``g(z) = z`` exactly are reported as intervals (004 Fig. 2f).
    Only roots where ``g - z`` changes sign, or vanishes on a grid point, are found: a tangency
    between grid points would be missed (none of 004's six maps has one).

    Args:
        g: a :class:`ScalarMap` or its key ``"a"`` ... ``"f"``.
        interval: ``(lo, hi)``, finite with ``lo < hi``.
        grid: the number of grid points, an integer >= 3.

    Returns:
        :class:`FixedPoints`.

    Raises:
        ValueError: ``g`` is not a map or key, ``interval`` is not increasing and finite, or
            ``grid`` is too small.

    Example:
        >>> from deqlab.theory.kglm import examples
        >>> examples.fixed_points("d").points.round(4).tolist()  # tanh(3 z): three fixed points
        [-0.9949, 0.0, 0.9949]
    """
    where = "examples.fixed_points"
    g = _get_map(g, where)
    grid = checks.integer(grid, "grid", where, minimum=3)
    try:
        lo, hi = (float(v) for v in interval)
    except (TypeError, ValueError):
        raise checks.fail("interval", "a pair (low, high) with low < high", interval, where) from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise checks.fail("interval", "a pair (low, high) of finite numbers with low < high", interval, where)
    z = np.linspace(lo, hi, grid)
    d = np.asarray(g(z)) - z
    zero = d == 0.0
    points, intervals = [], []
    # runs of exact zeros: a single zero is an isolated root, two or more an interval of fixed points
    i = 0
    while i < grid:
        if zero[i]:
            j = i
            while j + 1 < grid and zero[j + 1]:
                j += 1
            if j > i:
                intervals.append((float(z[i]), float(z[j])))
            else:
                points.append(float(z[i]))
            i = j + 1
        else:
            i += 1
    for i in np.flatnonzero((d[:-1] * d[1:]) < 0):
        a, b = z[i], z[i + 1]
        da = d[i]
        while b - a > 1e-14:
            m = 0.5 * (a + b)
            dm = float(g(m)) - m
            if dm == 0.0:
                a = b = m
                break
            if (dm < 0) == (da < 0):
                a, da = m, dm
            else:
                b = m
        points.append(0.5 * (a + b))
    return FixedPoints(points=np.sort(np.asarray(points, dtype=np.float64)), intervals=intervals)


def derivative_bound(g: Any, interval: tuple[float, float], grid: int = 100001) -> float:
    """``sup |g'|`` over the open ``interval`` (the ``lambda`` of 004 Prop. 2).

    On a grid that excludes the end points and is refined towards them (a supremum approached at
    an end point, like ``tanh'`` at 0 on ``(0, 1)``, is found to ``~1e-12``).

    Args:
        g: a :class:`ScalarMap` or its key.
        interval: ``(lo, hi)``, finite with ``lo < hi``.
        grid: the number of grid points, an integer >= 3.

    Returns:
        The supremum, a Python float.

    Raises:
        ValueError: ``g`` is not a map or key, ``interval`` is not increasing and finite, or
            ``grid`` is too small.

    Example:
        >>> from deqlab.theory.kglm import examples
        >>> round(examples.derivative_bound("b", (0.0, 1.0)), 9)  # tanh' -> 1 at 0: not < 1
        1.0
    """
    where = "examples.derivative_bound"
    g = _get_map(g, where)
    grid = checks.integer(grid, "grid", where, minimum=3)
    try:
        lo, hi = (float(v) for v in interval)
    except (TypeError, ValueError):
        raise checks.fail("interval", "a pair (low, high) with low < high", interval, where) from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise checks.fail("interval", "a pair (low, high) of finite numbers with low < high", interval, where)
    width = hi - lo
    # uniform interior points plus points 1e-6 ... 1e-12 of the width from either end
    inner = np.linspace(lo, hi, grid)[1:-1]
    near = width * np.logspace(-12, -6, 13)
    z = np.concatenate([inner, lo + near, hi - near])
    return float(np.max(np.abs(np.asarray(g.derivative(z)))))


def tanh_fixed_point(slope: float, shift: float = 0.0, start: float = 1.0) -> float:
    """The fixed point of ``tanh(slope z + shift)`` reached by Newton's method from ``start``.

    Newton on ``tanh(slope z + shift) - z``; for ``slope = 3``, ``shift = 0``, ``start = 1``: the
    positive fixed point ``a = tanh(3 a)`` of 004 Fig. 2d.

    Args:
        slope: a finite number.
        shift: a finite number.
        start: the Newton start, a finite number.

    Returns:
        The fixed point, a Python float.

    Raises:
        ValueError: an argument is not finite, or Newton does not converge.

    Example:
        >>> from deqlab.theory.kglm import examples
        >>> round(examples.tanh_fixed_point(3.0), 5)
        0.9949
    """
    where = "examples.tanh_fixed_point"
    a = checks.number(slope, "slope", where)
    b = checks.number(shift, "shift", where)
    z = checks.number(start, "start", where)
    for _ in range(100):
        t = math.tanh(a * z + b)
        step = (t - z) / (a * (1.0 - t * t) - 1.0)
        z -= step
        if abs(step) < 1e-16 * max(1.0, abs(z)):
            break
    if abs(math.tanh(a * z + b) - z) > 1e-14:
        raise ValueError(f"{where}: Newton did not converge from start={start} (slope={slope}, shift={shift})")
    return z
