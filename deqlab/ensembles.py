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
bitwise (anti)symmetric, also under ``jit``. Argument validation raises
``ValueError``; checks on ``scale`` (sign, finiteness) only run when ``scale`` is concrete,
since a traced value cannot be inspected without breaking ``jit``.

Sampling is done in ``promote_types(dtype, float32)`` and the result is cast to ``dtype``, so
half-precision dtypes work (QR is not available in half precision on every backend). As
everywhere in JAX, ``float64`` silently becomes ``float32`` unless ``jax_enable_x64`` is set.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "ENSEMBLES",
    "sample",
    "critical_scale",
    "critical_variance",
    "spectral_radius_limit",
    "initializer",
]

ENSEMBLES: tuple[str, ...] = ("gaussian", "orthogonal", "goe", "antisymmetric")

# Large-n spectral radius of W0 (001 App. A.1): circular law / unit circle -> 1, semicircle -> 2.
_RADIUS_FACTOR = {"gaussian": 1.0, "orthogonal": 1.0, "goe": 2.0, "antisymmetric": 2.0}


# --------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------


def _check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or name not in ENSEMBLES:
        raise ValueError(f"{where}: name must be one of {ENSEMBLES}, got {name!r}")
    return name


def _check_n(n: Any, where: str) -> int:
    if isinstance(n, (bool, np.bool_)):
        raise ValueError(f"{where}: n must be a positive integer (n >= 1), got bool {n!r}")
    try:
        value = operator.index(n)
    except TypeError:
        raise ValueError(
            f"{where}: n must be a positive integer (n >= 1) given as a static Python int, "
            f"got {n!r} of type {type(n).__name__}"
        ) from None
    if value < 1:
        raise ValueError(f"{where}: n must be a positive integer (n >= 1), got {value}")
    return value


def _check_scale(scale: Any, where: str) -> Any:
    """Validate ``scale``: a real scalar, and when concrete, finite and ``>= 0``."""
    if isinstance(scale, jax.core.Tracer):
        if jnp.ndim(scale) != 0:
            raise ValueError(f"{where}: scale must be a scalar, got shape {jnp.shape(scale)}")
        if not jnp.issubdtype(scale.dtype, jnp.floating) and not jnp.issubdtype(
            scale.dtype, jnp.integer
        ):
            raise ValueError(f"{where}: scale must be a real number, got dtype {scale.dtype}")
        return scale  # traced: sign/finiteness cannot be checked without breaking jit
    if isinstance(scale, (bool, np.bool_)):
        raise ValueError(f"{where}: scale must be a finite real number >= 0, got {scale!r}")
    try:
        arr = np.asarray(scale)
    except Exception:  # noqa: BLE001 - anything that is not array-like is a bad scale
        raise ValueError(
            f"{where}: scale must be a finite real number >= 0, got {scale!r}"
        ) from None
    if arr.ndim != 0:
        raise ValueError(f"{where}: scale must be a scalar, got shape {arr.shape}")
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"{where}: scale must be a finite real number >= 0, got {scale!r}")
    value = float(arr)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: scale must be a finite real number >= 0, got {value}")
    return scale


def _check_dtype(dtype: Any, where: str) -> np.dtype:
    try:
        dt = jnp.dtype(dtype)
    except TypeError:
        raise ValueError(
            f"{where}: dtype must be a floating-point dtype (e.g. jnp.float32), got {dtype!r}"
        ) from None
    if not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(
            f"{where}: dtype must be a real floating-point dtype (e.g. jnp.float32), got {dt}"
        )
    return dt


def _check_shape(shape: Any, name: str, where: str) -> tuple[int, int]:
    bad = f"{where}: shape must be a 2-D tuple of positive ints, got {shape!r}"
    try:
        dims = tuple(shape)
    except TypeError:
        raise ValueError(bad) from None
    if len(dims) != 2:
        raise ValueError(
            f"{where}: shape must be 2-D (fan_in, fan_out), got {shape!r} with {len(dims)} dims"
        )
    try:
        if any(isinstance(d, (bool, np.bool_)) for d in dims):
            raise TypeError
        rows, cols = (operator.index(d) for d in dims)
    except TypeError:
        raise ValueError(bad) from None
    if rows < 1 or cols < 1:
        raise ValueError(f"{where}: shape must have positive dimensions, got {shape!r}")
    if name in ("goe", "antisymmetric") and rows != cols:
        raise ValueError(
            f"{where}: shape must be square for the {name!r} ensemble, got {shape!r}"
        )
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
    g = jax.random.normal(key, (big, small), dtype)
    q, r = jnp.linalg.qr(g)  # reduced: q is (big, small)
    signs = jnp.where(jnp.diagonal(r) < 0, -1, 1).astype(dtype)
    q = q * signs[None, :]
    return q if rows >= cols else q.T


def _w0(name: str, key: jax.Array, rows: int, cols: int, dtype: Any) -> jax.Array:
    if name == "gaussian":
        # Variance 1/fan_in; for rows == cols == n this is Ginibre N(0, 1/n).
        return jax.random.normal(key, (rows, cols), dtype) / jnp.sqrt(jnp.asarray(rows, dtype))
    if name == "orthogonal":
        return _haar(key, rows, cols, dtype)
    # goe / antisymmetric (square, checked by callers). The upper triangle of a standard
    # Gaussian G is mirrored *before* any arithmetic, and then every entry is multiplied by a
    # symmetric constant. Writing W0 = (G +- G^T) / sqrt(2n) instead is (anti)symmetric only in
    # exact arithmetic: under jit, XLA may reorder the sum and contract it into FMAs
    # differently for (i, j) and (j, i), breaking symmetry in the last bit. Here
    # W0_ij = W0_ji (or -W0_ji) holds bitwise, in eager mode and under jit/vmap.
    n = rows
    g = jax.random.normal(key, (n, n), dtype)
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
      key: a JAX PRNG key. Use ``jax.vmap`` over a batch of keys for many samples.
      n: matrix size, a positive Python int (static).
      scale: ``sqrt(V) >= 0``. May be a traced scalar (e.g. under ``jit``/``vmap``); it is
        checked to be finite and non-negative only when concrete.
      dtype: a real floating dtype (static), default ``float32``.

    Returns:
      An ``(n, n)`` array of dtype ``dtype``.

    Raises:
      ValueError: for an unknown ``name``, non-positive or non-integer ``n``, a negative,
        non-finite or non-scalar ``scale``, or a non-floating ``dtype``.
    """
    where = "ensembles.sample"
    name = _check_name(name, where)
    n = _check_n(n, where)
    scale = _check_scale(scale, where)
    dtype = _check_dtype(dtype, where)
    return _scaled(name, key, n, n, scale, dtype)


def critical_scale(name: str) -> float:
    """Critical ``scale = sqrt(V_c)``: the large-``n`` spectral radius of ``W`` reaches 1 here.

    ``1`` for ``"gaussian"`` and ``"orthogonal"``, ``1/2`` for ``"goe"`` and
    ``"antisymmetric"`` (001 §2.1.2, App. A.1).
    """
    name = _check_name(name, "ensembles.critical_scale")
    return 1.0 / _RADIUS_FACTOR[name]


def critical_variance(name: str) -> float:
    """Critical variance ``V_c = critical_scale(name) ** 2`` (001 §2.1.2, App. A.1).

    ``1`` for ``"gaussian"`` and ``"orthogonal"``, ``1/4`` for ``"goe"`` and
    ``"antisymmetric"``.
    """
    name = _check_name(name, "ensembles.critical_variance")
    return critical_scale(name) ** 2


def spectral_radius_limit(name: str, scale: float | jax.Array = 1.0) -> float | jax.Array:
    """``n -> inf`` limit of the spectral radius of ``W = scale * W0`` (001 App. A.1).

    ``scale`` for ``"gaussian"`` (circular law) and ``"orthogonal"`` (exact at every ``n``),
    ``2 * scale`` for ``"goe"`` and ``"antisymmetric"`` (semicircle edge). Finite-``n``
    corrections are ``O(sqrt(log n / n))`` for Ginibre and ``O(n^{-2/3})`` for GOE.
    """
    where = "ensembles.spectral_radius_limit"
    name = _check_name(name, where)
    scale = _check_scale(scale, where)
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
      ``init(key, shape, dtype=jnp.float32)``; raises ``ValueError`` for a ``shape`` that is
      not 2-D with positive dims (or not square for ``"goe"``/``"antisymmetric"``) or a
      non-floating ``dtype``.
    """
    where = "ensembles.initializer"
    name = _check_name(name, where)
    scale = critical_scale(name) if scale is None else _check_scale(scale, where)

    def init(key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> jax.Array:
        rows, cols = _check_shape(shape, name, where)
        dt = _check_dtype(dtype, where)
        return _scaled(name, key, rows, cols, scale, dt)

    init.__name__ = f"{name}_init"
    init.__qualname__ = init.__name__
    init.__doc__ = f"{name!r} initializer with scale={scale!r}; see ensembles.initializer."
    return init
