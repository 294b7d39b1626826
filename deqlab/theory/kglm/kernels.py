"""Kernels of the kGLM = DEQ correspondence (004 §3.3, §4, App. E, App. F) and the exact spectral
norm of a convolutional layer (Sedghi, Gupta & Long 2018, "The singular values of convolutional
layers", ICLR).

In 004 the DEQ weights are kernel matrices: ``W_1 = W_3 = -K / lambda``, ``W_2 = K / lambda``
with ``K = k(X, X)`` (004 Thm. 3, Eq. 7), and ``V_1 = -k(X~, X) / lambda``, ``V_2 = k(X~, X) /
lambda`` (Eq. 8). A kernel here is a callable ``k(A, B) -> Gram matrix`` whose arguments hold one
point per row (``(n, d)``; a 1-D array is ``n`` points of dimension 1). Parameters are checked
when the kernel is built (``ValueError`` naming the argument); the call itself is pure ``jax.numpy``
and may be traced (``jit``, ``vmap``). Float64 needs ``jax_enable_x64``.

**Kernels.**

- :func:`squared_exponential`: ``variance * exp(-|x - x'|^2 / (2 length_scale^2))``; 004 §4
  ("k_naive", length scale 1) and App. G (plus :func:`white_noise` of variance ``1e-8``).
- :func:`periodic`: ``variance * exp(-2 sum_i sin^2(pi (x_i - x'_i) / period) / length_scale^2)``
  (MacKay's periodic kernel; for ``d > 1`` the product over coordinates, which is PSD).
- :func:`k_true`: the covariance of the smooth sequence-to-sequence task, 004 §4:
  ``k_true(x, x') = 0.1 exp(-|x - x'|^2 / 2) exp(-sin^2 |x - x'|)``, i.e.
  ``squared_exponential(1, 0.1) * periodic(period=pi, length_scale=sqrt(2))`` (for ``d = 1``,
  the task's case, the two agree exactly).
- :func:`image_kernel`: the truncated stationary kernel of 004 App. E, Eq. 18,
  ``kappa(x, x') = h_1(x, x') h_2(x, x') kappa_0(x, x')`` on pixel-channel coordinates
  ``x = (i, j, c)`` (Eq. 17), under which ``K = kappa(X, X)`` applied to a flattened image *is* a
  multi-channel convolution with zero padding (004 Fig. 4, Def. 9-10, Corollary 11, Eq. 19).
  :meth:`ImageKernel.matrix` builds the dense ``K``, :meth:`ImageKernel.filter` the filter bank
  ``C`` of Corollary 11, :meth:`ImageKernel.apply` applies ``K`` as a convolution.

**Convolutions.** :func:`conv2d` is the convolution of convolutional networks (a
cross-correlation, filter centred at ``((kh - 1) // 2, (kw - 1) // 2)``, output the size of the
input) with ``padding="zero"`` (004 Def. 9) or ``"circular"``; :func:`conv_matrix` its dense
matrix; :func:`conv_spectral_norm` the exact largest singular value of the circular convolution
by the FFT method of Sedghi et al. 2018; :func:`zero_padded_conv_norm_bound` an
upper bound for zero padding.

**Where 004 is loose** (``tests/theory/test_kglm_kernels.py`` checks each claim):

1. App. E says the truncations ``h_1 = 1(|x_1 - x'_1| <= r_1)``, ``h_2`` "each define a PSD
   kernel". They do not: on the points 0, 1, 2 with ``r = 1`` the Gram matrix
   ``[[1,1,0],[1,1,1],[0,1,1]]`` has the eigenvalue ``1 - sqrt(2)`` (a box has a sinc, not a
   non-negative, Fourier transform). So ``kappa`` of Eq. 18 is not PSD in general: App. E's own
   example (``exp(-|d|^2 / 20)``, ``|d|_inf <= 5``) has Gram eigenvalues down to ``-2.2 %`` of
   the largest on a 12 x 12 image, and App. F's choice (``r = 3``, squared length scales
   ``~ U(0, 4)``) is indefinite there from a squared length scale of 2 on (``-0.6 %``; ``-3.4 %``
   at 4; PSD at 1). Then ``K`` is no kernel matrix, Assumption 1 fails and (5) need not be
   convex. ``truncation="triangular"`` replaces the box by the Bartlett taper
   ``(1 - |d| / (r + 1))_+`` (a box correlated with itself: PSD on the integers), with the same
   support ``|d| <= r``, so that the product (Schur) stays PSD.
2. Eq. 17 writes ``{1, ..., h} x {0, ..., w}`` (``w + 1`` columns); the images are ``h x w``.
3. Corollary 11 is stated "under Definition 9" (one channel) but Eq. 19 uses the multi-channel
   ``*`` of Def. 10; its items 1-2 refer to (7) where (19) is meant, and the left side of Eq. 20
   reads ``f_*(X; Y, X)`` for ``f_*(X~; X, Y)``.

Layout: images are ``(channels, height, width)``, flattened in C order (channel-major, as in
Def. 10 where ``Y_r`` is the ``r``-th channel block); coordinates rows are ``(i, j, c)`` with
0-based indices (only differences enter a stationary kernel).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import _draws as draws
from deqlab import checks

__all__ = [
    "Kernel",
    "squared_exponential",
    "periodic",
    "white_noise",
    "k_true",
    "K_TRUE",
    "ImageKernel",
    "image_kernel",
    "image_coordinates",
    "PADDINGS",
    "conv2d",
    "conv_matrix",
    "conv_spectral_norm",
    "zero_padded_conv_norm_bound",
    "conv_power_iteration",
]

K_TRUE: dict[str, float] = {
    "variance": 0.1,
    "se_length_scale": 1.0,
    "period": math.pi,
    "periodic_length_scale": math.sqrt(2.0),
}
"""Parameters of :func:`k_true` (004 §4): ``0.1 exp(-r^2 / 2) exp(-sin^2 r)`` is the periodic
kernel ``exp(-2 sin^2(pi r / p) / l^2)`` with ``p = pi``, ``l^2 = 2``, times a squared exponential
of length scale 1 and variance 0.1."""

PADDINGS: tuple[str, ...] = ("zero", "circular")
TRUNCATIONS: tuple[str, ...] = ("indicator", "triangular")


# --------------------------------------------------------------------------------------------
# Kernels on points
# --------------------------------------------------------------------------------------------


def _points(value: Any, name: str, where: str) -> jax.Array:
    """Points as a ``(n, d)`` floating array (a 1-D array is ``n`` points of dimension 1)."""
    try:
        array = jnp.asarray(value)
    except (TypeError, ValueError):
        raise checks.fail(name, "a real array of points, shape (n, d) or (n,)", value, where) from None
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2 or not (jnp.issubdtype(array.dtype, jnp.floating)
                               or jnp.issubdtype(array.dtype, jnp.integer)):
        raise checks.fail(name, "a real array of points, shape (n, d) or (n,)",
                          f"array of shape {array.shape} and dtype {array.dtype}", where)
    return array.astype(jnp.result_type(float))


def _differences(A: jax.Array, B: jax.Array) -> jax.Array:
    """``A_i - B_j`` as ``(n_A, n_B, d)`` (exact squares later: no ``|a|^2 + |b|^2 - 2ab`` round-off)."""
    return A[:, None, :] - B[None, :, :]


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A kernel ``k(A, B) -> (n_A, n_B)`` Gram matrix; rows of ``A`` and ``B`` are points.

    ``kernel_a * kernel_b`` is the pointwise product (a PSD kernel when both are, Schur product
    theorem). ``name`` records the parameters for ``repr``.

    Attributes:
        function: ``(A, B) -> Gram matrix``, traceable.
        name: the kernel and its parameters, for ``repr``.

    Example:
        >>> import numpy as np
        >>> from deqlab.theory import kglm
        >>> gram = kglm.squared_exponential(1.0)(np.array([[0.0], [1.0]]))
        >>> np.asarray(gram, dtype=float).round(4).tolist()  # exp(-1/2) off the diagonal
        [[1.0, 0.6065], [0.6065, 1.0]]
    """

    function: Callable[[jax.Array, jax.Array], jax.Array]
    name: str

    def __call__(self, A: Any, B: Any = None) -> jax.Array:
        """The Gram matrix ``k(A, B)``.

        Args:
            A: points, ``(n_A, d)`` (or ``(n_A,)`` for ``d = 1``).
            B: points, ``(n_B, d)``; None: ``A``.

        Returns:
            ``(n_A, n_B)``.
        """
        where = self.name
        A = _points(A, "A", where)
        B = A if B is None else _points(B, "B", where)
        if A.shape[1] != B.shape[1]:
            raise checks.fail("B", f"points of the dimension of A ({A.shape[1]})",
                              f"dimension {B.shape[1]}", where)
        return self.function(A, B)

    def __mul__(self, other: "Kernel") -> "Kernel":
        if not isinstance(other, Kernel):
            return NotImplemented
        return Kernel(lambda A, B: self.function(A, B) * other.function(A, B),
                      f"{self.name} * {other.name}")

    def __repr__(self) -> str:
        return f"Kernel({self.name})"


def squared_exponential(length_scale: float = 1.0, variance: float = 1.0) -> Kernel:
    """``variance * exp(-|x - x'|^2 / (2 length_scale^2))`` (004 §4 k_naive, App. E kappa_0, App. G).

    Args:
        length_scale: > 0.
        variance: > 0.

    Returns:
        A :class:`Kernel`.

    Raises:
        ValueError: ``length_scale`` or ``variance`` is not > 0.

    Example:
        >>> import numpy as np
        >>> from deqlab.theory import kglm
        >>> kglm.squared_exponential(2.0, variance=3.0)(np.array([[0.0]])).tolist()
        [[3.0]]
    """
    where = "kernels.squared_exponential"
    ell = checks.positive_number(length_scale, "length_scale", where)
    var = checks.positive_number(variance, "variance", where)

    def function(A, B):
        squared = jnp.sum(_differences(A, B) ** 2, axis=-1)
        return var * jnp.exp(-0.5 * squared / ell**2)

    return Kernel(function, f"squared_exponential(length_scale={ell:g}, variance={var:g})")


def periodic(period: float, length_scale: float = 1.0, variance: float = 1.0) -> Kernel:
    """MacKay's periodic kernel ``variance * exp(-2 sum_i sin^2(pi (x_i - x'_i) / period) / length_scale^2)``.

    For ``d = 1`` this is the usual ``exp(-2 sin^2(pi |x - x'| / p) / l^2)`` (the factor of
    004 §4's ``k_true``). For ``d > 1`` the sum over coordinates makes it a product of 1-D periodic
    kernels, hence PSD; ``sin^2`` of the Euclidean distance ``|x - x'|`` would not be (its Gram
    matrices in 2-D have negative eigenvalues).

    Args:
        period: > 0.
        length_scale: > 0.
        variance: > 0.

    Returns:
        A :class:`Kernel`.

    Raises:
        ValueError: an argument is not > 0.

    Example:
        >>> import math
        >>> import numpy as np
        >>> from deqlab.theory import kglm
        >>> float(kglm.periodic(math.pi)(np.array([[0.0]]), np.array([[math.pi]]))[0, 0])  # one period apart
        1.0
    """
    where = "kernels.periodic"
    p = checks.positive_number(period, "period", where)
    ell = checks.positive_number(length_scale, "length_scale", where)
    var = checks.positive_number(variance, "variance", where)

    def function(A, B):
        phase = jnp.sin(math.pi * _differences(A, B) / p)
        return var * jnp.exp(-2.0 * jnp.sum(phase**2, axis=-1) / ell**2)

    return Kernel(function, f"periodic(period={p:g}, length_scale={ell:g}, variance={var:g})")


def white_noise(variance: float) -> Kernel:
    """``variance * 1(x == x')`` (004 App. G adds it with variance ``1e-8`` to make K strictly PD).

    Args:
        variance: > 0.

    Returns:
        A :class:`Kernel`.

    Raises:
        ValueError: ``variance`` is not > 0.

    Example:
        >>> import numpy as np
        >>> from deqlab.theory import kglm
        >>> kglm.white_noise(2.0)(np.array([[0.0], [1.0]])).tolist()
        [[2.0, 0.0], [0.0, 2.0]]
    """
    where = "kernels.white_noise"
    var = checks.positive_number(variance, "variance", where)

    def function(A, B):
        return var * jnp.all(_differences(A, B) == 0, axis=-1).astype(A.dtype)

    return Kernel(function, f"white_noise(variance={var:g})")


def k_true() -> Kernel:
    """004 §4 (smooth sequence-to-sequence task): ``0.1 exp(-|x - x'|^2 / 2) exp(-sin^2 |x - x'|)``.

    Built as ``squared_exponential(1, 0.1) * periodic(pi, sqrt(2))`` (:data:`K_TRUE`):
    ``-2 sin^2(pi r / pi) / 2 = -sin^2 r``. The task's points are scalars (``d = 1``).

    Returns:
        A :class:`Kernel`.

    Example:
        >>> import math
        >>> import numpy as np
        >>> from deqlab.theory import kglm
        >>> value = float(kglm.k_true()(np.array([[0.0]]), np.array([[1.0]]))[0, 0])
        >>> round(value, 6) == round(0.1 * math.exp(-0.5) * math.exp(-math.sin(1.0) ** 2), 6)
        True
    """
    se = squared_exponential(K_TRUE["se_length_scale"], K_TRUE["variance"])
    per = periodic(K_TRUE["period"], K_TRUE["periodic_length_scale"])
    product = se * per
    return Kernel(product.function, "k_true (004 §4)")


# --------------------------------------------------------------------------------------------
# Convolutions (cross-correlation, as in convolutional networks; 004 Def. 9-10)
# --------------------------------------------------------------------------------------------


def _weights(kernel_weights: Any, where: str) -> jax.Array:
    weights = jnp.asarray(kernel_weights)
    if weights.ndim != 4 or min(weights.shape) < 1 or not jnp.issubdtype(weights.dtype, jnp.number):
        raise checks.fail("kernel_weights", "a real array of shape (c_out, c_in, kh, kw), all >= 1",
                          f"shape {weights.shape}", where)
    return weights.astype(jnp.result_type(float))


def _spatial_shape(input_shape: Any, c_in: int, where: str) -> tuple[int, int]:
    shape = tuple(input_shape) if isinstance(input_shape, (tuple, list)) else None
    if shape is None or len(shape) not in (2, 3):
        raise checks.fail("input_shape", "(height, width) or (c_in, height, width)", input_shape, where)
    if len(shape) == 3:
        if checks.positive_int(shape[0], "input_shape[0]", where) != c_in:
            raise checks.fail("input_shape[0]", f"the kernel's input channels c_in = {c_in}",
                              shape[0], where)
        shape = shape[1:]
    return (checks.positive_int(shape[0], "input_shape (height)", where),
            checks.positive_int(shape[1], "input_shape (width)", where))


def conv2d(kernel_weights: Any, image: Any, padding: str = "zero") -> jax.Array:
    """Multi-channel 2-D convolution of convolutional networks (004 Def. 9-10), same-size output.

    ``out[o, i, j] = sum_{c, p, q} W[o, c, p, q] x[c, i + p - ph, j + q - pw]`` with
    ``ph = (kh - 1) // 2``, ``pw = (kw - 1) // 2``; pixels outside the image are zero
    (``padding="zero"``, 004 Def. 9) or taken modulo the image size (``"circular"``).
    ``kernel_weights``: ``(c_out, c_in, kh, kw)``; ``image``: ``(c_in, h, w)``. Traceable
    (``jax.lax.conv_general_dilated``).

    Args:
        kernel_weights: ``(c_out, c_in, kh, kw)``.
        image: ``(c_in, h, w)``.
        padding: ``"zero"`` or ``"circular"``.

    Returns:
        ``(c_out, h, w)``.

    Raises:
        ValueError: the shapes do not fit or ``padding`` is unknown.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.theory import kglm
        >>> out = kglm.conv2d(jnp.ones((1, 1, 3, 3)), jnp.ones((1, 4, 4)))
        >>> out[0].tolist()[0]  # a corner sees 4 pixels, an edge 6
        [4.0, 6.0, 6.0, 4.0]
    """
    where = "kernels.conv2d"
    weights = _weights(kernel_weights, where)
    padding = checks.choice(padding, "padding", PADDINGS, where)
    x = jnp.asarray(image)
    c_out, c_in, kh, kw = weights.shape
    if x.ndim != 3 or x.shape[0] != c_in:
        raise checks.fail("image", f"an array of shape (c_in={c_in}, height, width)",
                          f"shape {x.shape}", where)
    return _conv2d(weights, x, padding)


@functools.partial(jax.jit, static_argnames=("padding",))
def _conv2d(weights: jax.Array, x: jax.Array, padding: str) -> jax.Array:
    # lax.conv_general_dilated is the cross-correlation of CNNs (no filter flip); circular padding
    # is an explicit wrap-around pad followed by a "VALID" convolution.
    kh, kw = weights.shape[2:]
    ph, pw = (kh - 1) // 2, (kw - 1) // 2
    pads = ((ph, kh - 1 - ph), (pw, kw - 1 - pw))
    dtype = jnp.result_type(weights.dtype, x.dtype)
    if padding == "circular":
        x = jnp.pad(x, ((0, 0), *pads), mode="wrap")
        pads = ((0, 0), (0, 0))
    out = jax.lax.conv_general_dilated(x[None].astype(dtype), weights.astype(dtype), (1, 1), pads,
                                       precision=jax.lax.Precision.HIGHEST)
    return out[0]


def conv_matrix(kernel_weights: Any, input_shape: Any, padding: str = "zero") -> jax.Array:
    """The dense ``(c_out h w, c_in h w)`` matrix of :func:`conv2d` (its action on basis images).

    Args:
        kernel_weights: ``(c_out, c_in, kh, kw)``.
        input_shape: ``(h, w)`` or ``(c_in, h, w)``.
        padding: ``"zero"`` or ``"circular"``.

    Returns:
        The matrix, rows and columns in flattened ``(c, h, w)`` order.

    Raises:
        ValueError: the shapes do not fit or ``padding`` is unknown.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.theory import kglm
        >>> kglm.conv_matrix(2.0 * jnp.ones((1, 1, 1, 1)), (2, 2)).diagonal().tolist()
        [2.0, 2.0, 2.0, 2.0]
    """
    where = "kernels.conv_matrix"
    weights = _weights(kernel_weights, where)
    c_out, c_in = weights.shape[:2]
    h, w = _spatial_shape(input_shape, c_in, where)
    padding = checks.choice(padding, "padding", PADDINGS, where)
    return _conv_matrix(weights, h, w, padding)


@functools.partial(jax.jit, static_argnames=("h", "w", "padding"))
def _conv_matrix(weights: jax.Array, h: int, w: int, padding: str) -> jax.Array:
    c_in = weights.shape[1]
    basis = jnp.eye(c_in * h * w, dtype=weights.dtype).reshape(-1, c_in, h, w)
    columns = jax.vmap(lambda e: _conv2d(weights, e, padding).reshape(-1))(basis)
    return columns.T


def conv_spectral_norm(kernel_weights: Any, input_shape: Any, return_all: bool = False):
    """Exact largest singular value of the circular 2-D convolution (Sedghi, Gupta & Long 2018).

    The circular convolution is block-diagonalised by the 2-D DFT (Sedghi et al. 2018):
    its singular values are those of the ``c_out x c_in`` matrices ``P(k) = sum_d W[:, :, d]
    exp(-2 pi i <k, d> / (h, w))``, one per frequency ``k`` of the ``h x w`` grid, i.e. of the
    filters' FFT at the input's spatial size (a filter larger than the image is first folded
    modulo the image, which is what circular padding does). Cost ``O(h w c^2 (c + log(h w)))``
    (004 App. F). 004 §3.3 and §4 use it to set ``lambda = ||K|| / C`` (Assumption 2).

    ``kernel_weights``: ``(c_out, c_in, kh, kw)``; ``input_shape``: ``(h, w)`` or
    ``(c_in, h, w)``. Returns the largest singular value, and with ``return_all=True`` also all
    ``h w min(c_out, c_in)`` singular values as ``(h, w, min(c_out, c_in))`` (descending per
    frequency), which are all the singular values of :func:`conv_matrix` with
    ``padding="circular"``.

    **Zero padding.** This is exact only for circular padding. For zero padding (004 Def. 9) the
    FFT at the input's size is neither exact nor a bound: it overestimates an all-positive filter
    (the circular layer has the eigenvalue ``sum W`` on constant images, the zero-padded one loses
    mass at the border) and underestimates e.g. the Laplacian ``[-1, 2, -1]`` on 3 pixels
    (``3`` versus the Dirichlet ``2 + sqrt(2)``). An upper bound is
    :func:`zero_padded_conv_norm_bound`.

    Args:
        kernel_weights: ``(c_out, c_in, kh, kw)``.
        input_shape: ``(h, w)`` or ``(c_in, h, w)``.
        return_all: also return every singular value.

    Returns:
        The norm (a scalar array), or ``(norm, singular_values)`` with ``return_all``.

    Raises:
        ValueError: the shapes do not fit.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.theory import kglm
        >>> float(kglm.conv_spectral_norm(jnp.ones((1, 1, 3, 3)), (4, 4)))  # sum of the filter
        9.0
    """
    where = "kernels.conv_spectral_norm"
    weights = _weights(kernel_weights, where)
    c_out, c_in, kh, kw = weights.shape
    h, w = _spatial_shape(input_shape, c_in, where)
    if not isinstance(return_all, (bool, np.bool_)):
        raise checks.fail("return_all", "True or False", return_all, where)
    singular = _conv_singular_values(weights, h, w)
    largest = jnp.max(singular)
    return (largest, singular) if return_all else largest


@functools.partial(jax.jit, static_argnames=("h", "w"))
def _conv_singular_values(weights: jax.Array, h: int, w: int) -> jax.Array:
    c_out, c_in, kh, kw = weights.shape
    # Fold the filter onto the h x w torus at its offsets d = (p - ph, q - pw); for the
    # cross-correlation the transfer matrices are the complex conjugates of these FFTs, which
    # have the same singular values.
    rows = (np.arange(kh) - (kh - 1) // 2) % h
    cols = (np.arange(kw) - (kw - 1) // 2) % w
    grid = jnp.zeros((c_out, c_in, h, w), dtype=weights.dtype)
    grid = grid.at[:, :, rows[:, None], cols[None, :]].add(weights)
    transfer = jnp.fft.fft2(grid, axes=(-2, -1))  # (c_out, c_in, h, w)
    return jnp.linalg.svd(jnp.moveaxis(transfer, (0, 1), (-2, -1)), compute_uv=False)


def zero_padded_conv_norm_bound(kernel_weights: Any, input_shape: Any) -> jax.Array:
    """An upper bound on the spectral norm of :func:`conv2d` with ``padding="zero"``.

    Embedding the ``h x w`` image in zeros on an ``(h + kh - 1) x (w + kw - 1)`` torus, no filter
    offset wraps a pixel onto another pixel, so the zero-padded operator is ``P^T C P`` with ``P``
    the (isometric) embedding and ``C`` the circular convolution on the larger torus:
    ``||P^T C P|| <= ||C||``, computed exactly by :func:`conv_spectral_norm`. The bound tends to
    the exact value as the image grows (both tend to the supremum of the filter's symbol).

    Args:
        kernel_weights: ``(c_out, c_in, kh, kw)``.
        input_shape: ``(h, w)`` or ``(c_in, h, w)``.

    Returns:
        The bound, a scalar array.

    Raises:
        ValueError: the shapes do not fit.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.theory import kglm
        >>> w = jnp.ones((1, 1, 3, 3))
        >>> low = kglm.conv_power_iteration(w, (4, 4), steps=100)
        >>> bool(low <= kglm.zero_padded_conv_norm_bound(w, (4, 4)))
        True
    """
    where = "kernels.zero_padded_conv_norm_bound"
    weights = _weights(kernel_weights, where)
    c_out, c_in, kh, kw = weights.shape
    h, w = _spatial_shape(input_shape, c_in, where)
    return conv_spectral_norm(weights, (h + kh - 1, w + kw - 1))


def conv_power_iteration(kernel_weights: Any, input_shape: Any, padding: str = "zero", *, steps: int = 500,
                         key: Any = None) -> jax.Array:
    """A lower bound on the spectral norm of :func:`conv2d` by power iteration on ``M^T M``.

    ``M`` is never formed: ``M^T`` is the transpose of :func:`conv2d` (``jax.linear_transpose``),
    so the cost per step is two convolutions, and any padding and image size work (004 App. F
    uses the exact FFT method, which is exact only for circular padding: see
    :func:`conv_spectral_norm`). Returns ``sqrt(v^T M^T M v)`` for the final unit vector ``v``,
    which never exceeds the norm and tends to it as ``steps`` grows, at a rate set by the gap
    between the two largest singular values. With :func:`zero_padded_conv_norm_bound` it brackets
    the zero-padded norm.

    Args:
        kernel_weights: ``(c_out, c_in, kh, kw)``.
        input_shape: ``(h, w)`` or ``(c_in, h, w)``.
        padding: ``"zero"`` or ``"circular"``.
        steps: number of power steps, an integer >= 1.
        key: a ``jax.random`` key for the random start (default ``PRNGKey(0)``).

    Returns:
        The lower bound, a scalar array.

    Raises:
        ValueError: the shapes do not fit, ``padding`` is unknown, or ``steps < 1``.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.theory import kglm
        >>> round(float(kglm.conv_power_iteration(jnp.ones((1, 1, 3, 3)), (4, 4), steps=100)), 3)
        6.854
    """
    where = "kernels.conv_power_iteration"
    weights = _weights(kernel_weights, where)
    c_out, c_in = weights.shape[:2]
    h, w = _spatial_shape(input_shape, c_in, where)
    padding = checks.choice(padding, "padding", PADDINGS, where)
    steps = checks.positive_int(steps, "steps", where)
    key = jax.random.PRNGKey(0) if key is None else checks.prng_key(key, "key", where)
    v0 = draws.normal(key, (c_in, h, w), weights.dtype)  # jax.random.normal's numbers, compiled faster
    return _power_iteration(weights, v0, steps, padding)


@functools.partial(jax.jit, static_argnames=("steps", "padding"))
def _power_iteration(weights, v0, steps, padding):
    forward = functools.partial(_conv2d, weights, padding=padding)
    transpose = jax.linear_transpose(forward, v0)

    def step(_, v):
        u = transpose(forward(v))[0]
        return u / jnp.linalg.norm(u)

    v = jax.lax.fori_loop(0, steps, step, v0 / jnp.linalg.norm(v0))
    return jnp.linalg.norm(forward(v))


# --------------------------------------------------------------------------------------------
# The image kernel of 004 App. E (Eq. 17-18, Corollary 11)
# --------------------------------------------------------------------------------------------


def image_coordinates(height: int, width: int, channels: int = 1) -> np.ndarray:
    """Rows ``(i, j, c)`` of 004 Eq. 17 in the order of a flattened ``(channels, height, width)`` image.

    Args:
        height: an integer >= 1.
        width: an integer >= 1.
        channels: an integer >= 1.

    Returns:
        A float64 array ``(channels height width, 3)``.

    Raises:
        ValueError: a size is not an integer >= 1.

    Example:
        >>> from deqlab.theory import kglm
        >>> kglm.image_coordinates(2, 2)[:3].tolist()
        [[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    """
    where = "kernels.image_coordinates"
    h = checks.positive_int(height, "height", where)
    w = checks.positive_int(width, "width", where)
    c = checks.positive_int(channels, "channels", where)
    cc, ii, jj = np.meshgrid(np.arange(c), np.arange(h), np.arange(w), indexing="ij")
    return np.stack([ii.ravel(), jj.ravel(), cc.ravel()], axis=1).astype(np.float64)


@dataclasses.dataclass(frozen=True)
class ImageKernel:
    """``kappa(x, x') = t_1(x_1 - x'_1) t_2(x_2 - x'_2) kappa_0(x, x')`` on ``x = (i, j, c)`` (004 Eq. 18).

    ``kappa_0(x, x') = variance * B[c, c'] * exp(-((i - i')^2 + (j - j')^2) / (2 l[c, c']^2))``:
    a squared exponential in the pixel offset (004 App. E) with a channel covariance ``B``
    (App. E's example is ``B = ones``: "the matrix is simply repeated ... c times") and an
    optional length scale per channel pair (App. F). ``t`` is App. E's box ``1(|d| <= r)``
    (``truncation="indicator"``) or the PSD Bartlett taper ``(1 - |d| / (r + 1))_+``
    (``"triangular"``). Build with :func:`image_kernel`.

    Attributes:
        radius: ``(r_1, r_2)``.
        length_scale: ``(c, c)`` length scales.
        channel_covariance: ``(c, c)`` channel covariance ``B``.
        variance: the variance.
        truncation: ``"indicator"`` or ``"triangular"``.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.theory import kglm
        >>> kernel = kglm.image_kernel(1)
        >>> kernel.filter().shape, kernel.matrix(3, 3).shape
        ((1, 1, 3, 3), (9, 9))
        >>> image = jnp.arange(9.0).reshape(1, 3, 3)
        >>> bool(jnp.allclose(kernel.apply(image).ravel(), kernel.matrix(3, 3) @ image.ravel(), atol=1e-5))
        True
    """

    radius: tuple[int, int]
    length_scale: np.ndarray  # (c, c)
    channel_covariance: np.ndarray  # (c, c)
    variance: float
    truncation: str

    @property
    def channels(self) -> int:
        """The number of channels ``c``."""
        return self.channel_covariance.shape[0]

    def _gram(self, A: jax.Array, B: jax.Array, period: tuple[int, int] | None = None) -> jax.Array:
        return _image_gram(A, B, jnp.asarray(self.length_scale), jnp.asarray(self.channel_covariance),
                           self.variance, radius=self.radius, truncation=self.truncation, period=period)

    def __call__(self, A: Any, B: Any = None) -> jax.Array:
        """Gram matrix ``kappa(A, B)`` of Eq. 18 (rows ``(i, j, c)``, integer-valued).

        Args:
            A: coordinates ``(n_A, 3)``.
            B: coordinates ``(n_B, 3)``; None: ``A``.

        Returns:
            ``(n_A, n_B)``.
        """
        where = "kernels.ImageKernel"
        A = _points(A, "A", where)
        B = A if B is None else _points(B, "B", where)
        for name, P in (("A", A), ("B", B)):
            if P.shape[1] != 3:
                raise checks.fail(name, "pixel-channel coordinates (i, j, c), shape (n, 3)",
                                  f"shape {P.shape}", where)
        return self._gram(A, B)

    def filter(self) -> jax.Array:
        """The filter bank ``C`` of 004 Corollary 11 (before the factor ``-+1/lambda``), ``(c, c, 2r_1+1, 2r_2+1)``.

        ``C[a, b, p, q] = kappa((i, j, a), (i + p - r_1, j + q - r_2, b))``: the kernel between a
        filter's centre and its offsets, so that ``conv2d(C, y)`` is ``kappa(X, X) @ y``.
        """
        r1, r2 = self.radius
        c = self.channels
        centres = np.stack([np.zeros(c), np.zeros(c), np.arange(c)], axis=1)
        offsets = image_coordinates(2 * r1 + 1, 2 * r2 + 1, c) - np.array([r1, r2, 0])
        gram = self._gram(jnp.asarray(centres), jnp.asarray(offsets))  # (c, c (2r1+1) (2r2+1))
        return gram.reshape(c, c, 2 * r1 + 1, 2 * r2 + 1)

    def apply(self, image: Any, padding: str = "zero") -> jax.Array:
        """``K y`` as a convolution (004 Eq. 19 with ``K = kappa(X, X)``): ``conv2d(filter(), y)``.

        Args:
            image: ``(c, h, w)``.
            padding: ``"zero"`` or ``"circular"``.

        Returns:
            ``K y``, ``(c, h, w)``.
        """
        return conv2d(self.filter(), image, padding)

    def matrix(self, height: int, width: int, padding: str = "zero") -> jax.Array:
        """Dense ``K = kappa(X, X)`` on the ``height x width`` image (rows in flattened ``(c, h, w)`` order).

        ``padding="zero"`` is Eq. 18 as written (the image has borders, 004 Def. 9);
        ``"circular"`` measures pixel offsets on the torus (minimum image), the kernel whose ``K``
        is the circular convolution; it needs ``2 r + 1`` at most the image size (no offset twice).

        Args:
            height: an integer >= 1.
            width: an integer >= 1.
            padding: ``"zero"`` or ``"circular"``.

        Returns:
            ``K``, ``(c height width, c height width)``.
        """
        where = "kernels.ImageKernel.matrix"
        padding = checks.choice(padding, "padding", PADDINGS, where)
        X = jnp.asarray(image_coordinates(height, width, self.channels))
        if padding == "zero":
            return self._gram(X, X)
        for name, size, r in (("height", height, self.radius[0]), ("width", width, self.radius[1])):
            if size < 2 * r + 1:
                raise checks.fail(name, f">= 2 r + 1 = {2 * r + 1} for circular padding", size, where)
        return self._gram(X, X, period=(height, width))


@functools.partial(jax.jit, static_argnames=("radius", "truncation", "period"))
def _image_gram(A, B, length_scale, channel_covariance, variance, *, radius, truncation, period):
    """Eq. 18 between coordinate rows; ``period=(h, w)`` wraps pixel offsets to the torus."""
    D = A[:, None, :] - B[None, :, :]
    di, dj = D[..., 0], D[..., 1]
    if period is not None:  # minimum image: offsets in [-size/2, size/2)
        di = (di + period[0] // 2) % period[0] - period[0] // 2
        dj = (dj + period[1] // 2) % period[1] - period[1] // 2
    ca = A[:, 2].astype(jnp.int32)[:, None]
    cb = B[:, 2].astype(jnp.int32)[None, :]
    ell = length_scale[ca, cb]
    se = jnp.exp(-(di**2 + dj**2) / (2.0 * ell**2))

    def taper(offset, r):
        inside = jnp.abs(offset) <= r
        if truncation == "indicator":
            return inside.astype(offset.dtype)
        return jnp.where(inside, 1.0 - jnp.abs(offset) / (r + 1), 0.0)

    return variance * channel_covariance[ca, cb] * se * taper(di, radius[0]) * taper(dj, radius[1])


def _channel_matrix(value: Any, channels: int, name: str, where: str, default: float) -> np.ndarray:
    requirement = f"a finite number or a symmetric ({channels}, {channels}) array of them"
    if value is None:
        return np.full((channels, channels), default)
    try:
        array = None if isinstance(value, (bool, np.bool_)) else np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        array = None
    if array is None or array.ndim not in (0, 2):
        raise checks.fail(name, requirement, value, where)
    if array.ndim == 0:
        array = np.full((channels, channels), float(array))
    if array.shape != (channels, channels) or not np.all(np.isfinite(array)) \
            or not np.array_equal(array, array.T):
        raise checks.fail(name, requirement, value, where)
    return array


def image_kernel(radius: Any, length_scale: Any = 1.0, variance: float = 1.0, channels: int = 1,
                 channel_covariance: Any = None, truncation: str = "indicator") -> ImageKernel:
    """The image kernel of 004 App. E, Eq. 18 (see :class:`ImageKernel`).

    ``radius``: ``r`` or ``(r_1, r_2)``, integers >= 0 (filter size ``2 r + 1``; App. E's example
    ``r = 5``, App. F ``r = 3``). ``length_scale``: > 0, a number or a symmetric ``(c, c)`` array
    (App. F: one per channel pair). ``channel_covariance``: a symmetric ``(c, c)`` array,
    default all ones (App. E). ``truncation``: ``"indicator"`` (004 Eq. 18, not PSD in general,
    see the module's notes) or ``"triangular"`` (PSD when ``channel_covariance`` is PSD and the
    length scale is a single number).

    Args:
        radius: ``r`` or ``(r_1, r_2)``.
        length_scale: a number > 0 or a symmetric ``(c, c)`` array.
        variance: > 0.
        channels: an integer >= 1.
        channel_covariance: a symmetric ``(c, c)`` array; None: ones.
        truncation: ``"indicator"`` or ``"triangular"``.

    Returns:
        An :class:`ImageKernel`.

    Raises:
        ValueError: an argument is out of range or of the wrong shape.

    Example:
        >>> from deqlab.theory import kglm
        >>> kglm.image_kernel((1, 2), channels=2).filter().shape
        (2, 2, 3, 5)
    """
    where = "kernels.image_kernel"
    radii = radius if isinstance(radius, (tuple, list)) else (radius, radius)
    if len(radii) != 2:
        raise checks.fail("radius", "an integer >= 0 or a pair of them", radius, where)
    r1 = checks.integer(radii[0], "radius", where, minimum=0)
    r2 = checks.integer(radii[1], "radius", where, minimum=0)
    c = checks.positive_int(channels, "channels", where)
    var = checks.positive_number(variance, "variance", where)
    ell = _channel_matrix(length_scale, c, "length_scale", where, 1.0)
    if np.any(ell <= 0):
        raise checks.fail("length_scale", "> 0 (every entry)", length_scale, where)
    cov = _channel_matrix(channel_covariance, c, "channel_covariance", where, 1.0)
    truncation = checks.choice(truncation, "truncation", TRUNCATIONS, where)
    return ImageKernel((r1, r2), ell, cov, var, truncation)
