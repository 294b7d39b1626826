"""Random-matrix ensembles for the weights of tied-weight (linear) DEQs.

The linear deep equilibrium model of 001 §2.1.2 is the fixed point ``z* = W z* + x`` of a
single layer whose weight matrix is drawn as ``W = sqrt(V) * W0`` with ``W0`` from a
normalised random-matrix ensemble (001 App. A.1). The fixed point exists and the naive
iteration converges iff the spectral radius ``rho(W) < 1``; in the large-``n`` limit this
happens below a critical variance ``V_c`` that depends only on the ensemble.

Throughout this module ``scale = sqrt(V)`` is the multiplier of ``W0`` (a standard deviation,
not a variance). The families, with the normalisation of ``W0`` (``n x n``):

- ``"gaussian"``: Ginibre, i.i.d. ``N(0, 1/n)`` entries; ``rho(W) -> scale``, ``V_c = 1``.
- ``"orthogonal"``: Haar orthogonal ``O`` (``O^T O = I``); ``rho(W) = scale``, ``V_c = 1``.
- ``"goe"``: symmetric, off-diagonal variance ``1/n``, diagonal variance ``2/n`` (Gaussian
  Orthogonal Ensemble, same law as ``(G + G^T)/sqrt(2n)``); ``rho(W) -> 2 scale``,
  ``V_c = 1/4``.
- ``"antisymmetric"``: ``W0^T = -W0`` with i.i.d. ``N(0, 1/n)`` entries above the diagonal
  and zero diagonal (same law as ``(G - G^T)/sqrt(2n)``, ``G`` i.i.d. ``N(0, 1)``);
  ``rho(W) -> 2 scale``, ``V_c = 1/4``.

``rho(W)`` is the ``n -> inf`` limit of the spectral radius: the circular law (radius
``scale``) for Ginibre, the unit circle times ``scale`` for Haar orthogonal (exact at every
``n``), and the semicircle law on ``[-2 scale, 2 scale]`` for GOE (001 App. A.1). The
antisymmetric ensemble is an addition of deqlab, not in 001: ``i W0`` is Hermitian with
off-diagonal entry variance ``1/n``, so its eigenvalues are purely imaginary and follow the
semicircle on ``i [-2, 2]``; hence the same critical scale ``1/2`` as GOE.

All samplers take an explicit PRNG key (raw ``uint32[2]`` or typed ``jax.random.key``), are
pure, and are ``jit``/``vmap`` safe: ``name``, ``n``/``shape`` and ``dtype`` must be static
Python values, while ``scale`` may be a traced scalar. GOE and antisymmetric samples are
bitwise (anti)symmetric, also under ``jit``. Argument validation (:mod:`deqlab.checks`) raises
``ValueError`` naming the argument and its valid range; checks on ``scale`` (sign, finiteness)
only run when ``scale`` is concrete, since a traced value cannot be inspected without breaking
``jit``. Matrices above :data:`MAX_ELEMENTS` entries are refused before XLA is reached.

Sampling is done in ``promote_types(dtype, float32)`` and the result is cast to ``dtype``, so
half-precision dtypes work (QR is not available in half precision on every backend). As
everywhere in JAX, ``float64`` silently becomes ``float32`` unless ``jax_enable_x64`` is set.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import _draws, checks

__all__ = [
    "ENSEMBLES",
    "sample",
    "critical_scale",
    "critical_variance",
    "spectral_radius_limit",
    "initializer",
    "MAX_ELEMENTS",
]

ENSEMBLES: tuple[str, ...] = ("gaussian", "orthogonal", "goe", "antisymmetric")
"""The registry of ensemble names: every module of deqlab validates an ensemble name against it
(the theory and experiment modules accept the subsets they have results for)."""

# Large-n spectral radius of W0 (001 App. A.1): circular law / unit circle -> 1, semicircle -> 2.
_RADIUS_FACTOR = {"gaussian": 1.0, "orthogonal": 1.0, "goe": 2.0, "antisymmetric": 2.0}


# --------------------------------------------------------------------------------------------
# Validation (deqlab.checks, plus the two checks specific to matrix shapes)
# --------------------------------------------------------------------------------------------

MAX_ELEMENTS: int = 2**31
"""Largest number of entries (``rows * cols``) of a sampled matrix: ``2**31`` elements (8 GiB in
float32, ``n = 46340`` for a square matrix). Beyond it XLA can abort the whole process while
allocating instead of raising an exception; larger matrices than any experiment of the book."""


def _name(name: Any, where: str) -> str:
    return checks.choice(name, "name", ENSEMBLES, where)


def _size(n: Any, where: str) -> int:
    n = checks.positive_int(n, "n", where)
    if n * n > MAX_ELEMENTS:
        raise checks.fail("n", f"an integer with n * n <= 2**31 elements (ensembles.MAX_ELEMENTS; "
                          f"n <= {math.isqrt(MAX_ELEMENTS)})", n, where)
    return n


class _Described(str):
    """A description shown without quotes where a message prints the received value."""

    def __repr__(self) -> str:
        return str(self)


def _scale(scale: Any, where: str) -> Any:
    """``scale``: a real scalar, and when concrete, finite and ``>= 0`` (traced: unchecked)."""
    requirement = "a real scalar sqrt(V) >= 0"
    if checks.is_traced(scale) and jnp.ndim(scale) != 0:
        raise checks.fail("scale", requirement,
                          _Described(f"a traced array of shape {jnp.shape(scale)}"), where)
    if not checks.is_traced(scale) and np.ndim(scale) != 0:
        raise checks.fail("scale", requirement,
                          _Described(f"an array of shape {np.shape(scale)}"), where)
    return checks.number(scale, "scale", where, lower=0.0, allow_traced=True)


def _shape(shape: Any, name: str, where: str) -> tuple[int, int]:
    requirement = "a 2-D tuple (fan_in, fan_out) of integers >= 1"
    try:
        dims = tuple(shape)
    except TypeError:
        raise checks.fail("shape", requirement, shape, where) from None
    if len(dims) != 2:
        raise checks.fail("shape", requirement, shape, where)
    try:
        rows, cols = (checks.integer(d, "shape", where, minimum=1) for d in dims)
    except ValueError:
        raise checks.fail("shape", requirement, shape, where) from None
    if rows * cols > MAX_ELEMENTS:
        raise checks.fail("shape", f"{requirement} with rows * cols <= 2**31 elements "
                          "(ensembles.MAX_ELEMENTS)", shape, where)
    if name in ("goe", "antisymmetric") and rows != cols:
        raise checks.fail("shape", f"square for the {name!r} ensemble", shape, where)
    return rows, cols


# --------------------------------------------------------------------------------------------
# Samplers of W0 (all in a working float dtype, shape (rows, cols))
# --------------------------------------------------------------------------------------------


def _haar(key: jax.Array, rows: int, cols: int, dtype: Any) -> jax.Array:
    """Haar (semi-)orthogonal matrix by QR of a Gaussian with sign correction (Mezzadri 2007).

    ``Q`` from a Householder QR is *not* Haar distributed (e.g. LAPACK makes ``Q[0, 0] < 0``
    always); multiplying column ``j`` by ``sign(R_jj)`` makes the factorisation unique with
    ``diag(R) > 0``, and then ``Q`` is exactly Haar. For ``rows != cols`` the QR of a tall
    ``max x min`` Gaussian gives orthonormal columns; it is transposed when ``rows < cols``,
    so that the rows are orthonormal instead.
    """
    big, small = max(rows, cols), min(rows, cols)
    g = _draws.normal(key, (big, small), dtype)
    q, r = jnp.linalg.qr(g)  # reduced: q is (big, small)
    signs = jnp.where(jnp.diagonal(r) < 0, -1, 1).astype(dtype)
    q = q * signs[None, :]
    return q if rows >= cols else q.T


def _w0(name: str, key: jax.Array, rows: int, cols: int, dtype: Any) -> jax.Array:
    if name == "gaussian":
        # Variance 1/fan_in; for rows == cols == n this is Ginibre N(0, 1/n).
        return _draws.normal(key, (rows, cols), dtype) / jnp.sqrt(jnp.asarray(rows, dtype))
    if name == "orthogonal":
        return _haar(key, rows, cols, dtype)
    # goe / antisymmetric (square, checked by callers). The upper triangle of a standard
    # Gaussian G is mirrored *before* any arithmetic, and then every entry is multiplied by a
    # symmetric constant. Writing W0 = (G +- G^T) / sqrt(2n) instead is (anti)symmetric only in
    # exact arithmetic: under jit, XLA may reorder the sum and contract it into FMAs
    # differently for (i, j) and (j, i), breaking symmetry in the last bit. Here
    # W0_ij = W0_ji (or -W0_ji) holds bitwise, in eager mode and under jit/vmap.
    n = rows
    g = _draws.normal(key, (n, n), dtype)
    i = jnp.arange(n)[:, None]
    j = jnp.arange(n)[None, :]
    off = 1.0 / math.sqrt(n)
    if name == "goe":
        # Off-diagonal g_ij / sqrt(n): var 1/n; diagonal g_ii * sqrt(2/n): var 2/n.
        mirrored = jnp.where(i <= j, g, g.T)
        return mirrored * jnp.where(i == j, math.sqrt(2.0) * off, off).astype(dtype)
    # antisymmetric: off-diagonal +-g_ij / sqrt(n): var 1/n; diagonal exactly 0.
    mirrored = jnp.where(i < j, g, jnp.where(i > j, -g.T, jnp.zeros((), dtype)))
    return mirrored * jnp.asarray(off, dtype)


def _scaled(name, key, rows, cols, scale, dtype) -> jax.Array:
    work = jnp.promote_types(dtype, jnp.float32)
    w0 = _w0(name, key, rows, cols, work)
    return (jnp.asarray(scale, work) * w0).astype(dtype)


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def sample(
    name: str,
    key: jax.Array,
    n: int,
    scale: float | jax.Array = 1.0,
    dtype: Any = jnp.float32,
) -> jax.Array:
    """Draw one ``n x n`` weight matrix ``W = scale * W0`` from ensemble ``name``.

    This is the tied weight of the linear DEQ ``z = W z + x`` of 001 §2.1.2, with
    ``scale = sqrt(V)`` (001 App. A.1). See the module docstring for the normalisation of
    ``W0`` in each family.

    Args:
      name: one of :data:`ENSEMBLES` (static).
      key: a JAX PRNG key (``jax.random.key(seed)`` or ``jax.random.PRNGKey(seed)``, not an
        int seed). Use ``jax.vmap`` over a batch of keys for many samples.
      n: matrix size, a positive Python int (static) with ``n * n <=`` :data:`MAX_ELEMENTS`.
      scale: ``sqrt(V) >= 0``. May be a traced scalar (e.g. under ``jit``/``vmap``); it is
        checked to be finite and non-negative only when concrete.
      dtype: a real floating dtype (static), default ``float32``.

    Returns:
      An ``(n, n)`` array of dtype ``dtype``.

    Raises:
      ValueError: for an unknown ``name``, an int seed or other non-key ``key``, a non-positive
        or non-integer ``n`` or one with ``n * n >`` :data:`MAX_ELEMENTS`, a negative,
        non-finite or non-scalar ``scale``, or a non-floating ``dtype`` (messages in the format
        of :mod:`deqlab.checks`, naming the argument and its valid range).

    Example:
        >>> import jax
        >>> from deqlab import ensembles
        >>> w = ensembles.sample("goe", jax.random.key(0), 4, scale=0.5)
        >>> w.shape, w.dtype, bool((w == w.T).all())
        ((4, 4), dtype('float32'), True)
    """
    where = "ensembles.sample"
    name = _name(name, where)
    key = checks.prng_key(key, "key", where)
    n = _size(n, where)
    scale = _scale(scale, where)
    dtype = checks.floating_dtype(dtype, "dtype", where)
    return _scaled(name, key, n, n, scale, dtype)


def critical_scale(name: str) -> float:
    """Critical ``scale = sqrt(V_c)``: the large-``n`` spectral radius of ``W`` reaches 1 here.

    ``1`` for ``"gaussian"`` and ``"orthogonal"``, ``1/2`` for ``"goe"`` and
    ``"antisymmetric"`` (001 §2.1.2, App. A.1).

    Args:
        name: one of :data:`ENSEMBLES`.

    Returns:
        The critical scale, a Python float.

    Raises:
        ValueError: ``name`` is not one of :data:`ENSEMBLES`.

    Example:
        >>> from deqlab.ensembles import critical_scale
        >>> critical_scale("gaussian"), critical_scale("goe")
        (1.0, 0.5)
    """
    name = _name(name, "ensembles.critical_scale")
    return 1.0 / _RADIUS_FACTOR[name]


def critical_variance(name: str) -> float:
    """Critical variance ``V_c = critical_scale(name) ** 2`` (001 §2.1.2, App. A.1).

    ``1`` for ``"gaussian"`` and ``"orthogonal"``, ``1/4`` for ``"goe"`` and
    ``"antisymmetric"``.

    Args:
        name: one of :data:`ENSEMBLES`.

    Returns:
        The critical variance, a Python float.

    Raises:
        ValueError: ``name`` is not one of :data:`ENSEMBLES`.

    Example:
        >>> from deqlab.ensembles import critical_variance
        >>> critical_variance("antisymmetric")
        0.25
    """
    name = _name(name, "ensembles.critical_variance")
    return critical_scale(name) ** 2


def spectral_radius_limit(name: str, scale: float | jax.Array = 1.0) -> float | jax.Array:
    """``n -> inf`` limit of the spectral radius of ``W = scale * W0`` (001 App. A.1).

    ``scale`` for ``"gaussian"`` (circular law) and ``"orthogonal"`` (exact at every ``n``),
    ``2 * scale`` for ``"goe"`` and ``"antisymmetric"`` (semicircle edge). Finite-``n``
    corrections are ``O(sqrt(log n / n))`` for Ginibre and ``O(n^{-2/3})`` for GOE.

    Args:
        name: one of :data:`ENSEMBLES`.
        scale: ``sqrt(V) >= 0``; may be traced.

    Returns:
        The limit, a float (an array when ``scale`` is one).

    Raises:
        ValueError: ``name`` is unknown, or a concrete ``scale`` is negative, not finite or not a
            scalar.

    Example:
        >>> from deqlab.ensembles import spectral_radius_limit
        >>> spectral_radius_limit("goe", 0.4)
        0.8
    """
    where = "ensembles.spectral_radius_limit"
    name = _name(name, where)
    scale = _scale(scale, where)
    return _RADIUS_FACTOR[name] * scale


def initializer(name: str, scale: float | None = None) -> Callable[..., jax.Array]:
    """Weight initializer ``init(key, shape, dtype=jnp.float32)`` drawing ``scale * W0``.

    Usable as a Flax ``kernel_init``, e.g.
    ``nnx.Linear(n, n, kernel_init=initializer("orthogonal", 0.9), rngs=nnx.Rngs(0))``.

    Conventions:

    * ``shape = (fan_in, fan_out)``, as for Flax ``Linear`` kernels ``K`` applied as
      ``y = x @ K``. The corresponding matrix acting on column vectors is ``W = K^T``; all
      four families are invariant in law under transposition, so for a square kernel this
      makes no distributional difference.
    * For a square ``(n, n)`` shape, ``init(key, (n, n), dtype)`` returns exactly
      ``sample(name, key, n, scale, dtype)`` (same key, same matrix).
    * ``"gaussian"``: i.i.d. ``N(0, scale**2 / fan_in)`` with ``fan_in = shape[0]``, so that
      ``E|x @ K|^2 = scale**2 * |x|^2 * fan_out / fan_in``.
    * ``"orthogonal"``: ``scale`` times a Haar semi-orthogonal matrix: orthonormal columns
      if ``fan_in >= fan_out``, orthonormal rows otherwise.
    * ``"goe"``, ``"antisymmetric"``: square shapes only.

    Args:
        name: one of :data:`ENSEMBLES`.
        scale: ``sqrt(V) >= 0``; ``None`` (default) means :func:`critical_scale` ``(name)``,
            the edge of stability of the linear DEQ (001 §2.1.2).

    Returns:
        ``init(key, shape, dtype=jnp.float32)``, which raises ``ValueError`` for a non-key
        ``key``, a ``shape`` that is not 2-D with positive dims (or not square for
        ``"goe"``/``"antisymmetric"``), or a non-floating ``dtype``.

    Raises:
        ValueError: ``name`` is unknown, or ``scale`` is negative, not finite or not a scalar.

    Example:
        >>> import jax
        >>> from deqlab.ensembles import initializer, sample
        >>> init = initializer("orthogonal", 0.9)
        >>> key = jax.random.key(1)
        >>> bool((init(key, (3, 3)) == sample("orthogonal", key, 3, 0.9)).all())
        True
    """
    where = "ensembles.initializer"
    name = _name(name, where)
    scale = critical_scale(name) if scale is None else _scale(scale, where)

    def init(key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> jax.Array:
        key = checks.prng_key(key, "key", where)
        rows, cols = _shape(shape, name, where)
        dt = checks.floating_dtype(dtype, "dtype", where)
        return _scaled(name, key, rows, cols, scale, dt)

    init.__name__ = f"{name}_init"
    init.__qualname__ = init.__name__
    init.__doc__ = f"{name!r} initializer with scale={scale!r}; see ensembles.initializer."
    return init
