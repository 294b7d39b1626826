"""Experiment 2 of 004 (§4, Fig. 6): image denoising with a convolutional DEQ, random versus
kGLM initialisation, as a function of the layers' spectral norm.

**The model** (004 §4, App. E Corollary 11, Eq. 19-20, with ``sigma = ReLU``, ``T`` the identity,
``rho = 0``). A noisy image ``y`` (``(3, h, w)``) is denoised by

    ``z* = ReLU(W1 * z* + W2 * y)``,    ``y_hat = V1 * z* + V2 * y``,

four convolutional layers ``W1, W2, V1, V2`` of shape ``(3, 3, 7, 7)`` (App. F: radius
``r_1 = r_2 = 3``), no biases (the kGLM has none), trained on the mean squared error between
``y_hat`` and the clean image. The equilibrium is :func:`deqlab.backward.fixed_point` (Anderson,
implicit backward pass).

**Initialisations.** *Random* (004 §4): every filter weight i.i.d. ``N(0, Var)``, ``Var`` on a
grid (the paper's ``logspace(1e-3, 1, 25)``, which its code uses as standard deviations, note 1),
so that the layers' spectral norms are random.
*kGLM* (004 §4, Cor. 11): ``W1 = V1 = -K / lam``, ``W2 = V2 = K / lam`` with ``K`` the image kernel
of App. E / App. F (:func:`deqlab.theory.kglm.kernels.image_kernel`: box truncation ``r = 3``,
a squared-exponential ``kappa_0`` with one squared length scale per channel pair drawn from
``U(0, 4)``) and ``lam = ||K|| / C`` (:func:`deqlab.theory.kglm.models.lam_for_spectral_norm`),
so that every layer's spectral norm *is* ``C`` (the paper's ``logspace(1e-2, 10, 25)``).
Fig. 6's horizontal axis is "the average spectral norm of each layer": the mean of the four
layers' norms, computed exactly (:func:`deqlab.theory.kglm.kernels.conv_spectral_norm`).

**Data** (:mod:`deqlab.lab.data`): CIFAR-10 at full scale (004 §4), offline patches of
scikit-learn's sample photographs at quick scale. Noisy inputs: ``clip(x + e, 0, 1)`` with
``e ~ N(0, 0.2)`` i.i.d. per pixel and channel (004 §4), ``0.2`` the standard deviation.

**Where 004 leaves a choice open, and ours** (each is an argument):

1. ``N(0, 0.2)`` and ``N(0, Var)``: the text does not say whether the second argument is a
   variance or a standard deviation. The authors' public code (github.com/RussellTsuchida/deq-glm,
   ``code/scripts/denoise_test.py`` and ``code/lib/deq.py``, class ``DEQGLMConv``) adds
   ``NOISE_STD * randn`` with ``NOISE_STD = 0.2`` and draws the random filters with PyTorch's
   ``normal_(0, init_scale)``, whose second argument is the standard deviation. We follow the
   code: :data:`NOISE_STD` ``= 0.2`` (``noise_std`` changes it), and the full-scale random grid is
   :data:`PAPER_CODE_VARIANCES`, the squares of the printed grid. Only this reading makes the two
   grids cover "roughly the same space" of spectral norms, as 004 §4 says they do; with the
   printed grid read as variances the random norms start near 0.8.
2. Padding. App. E's convolution has zero padding (Def. 9), but the Sedghi et al. (2018) norm
   that 004 calls "fast and exact" is exact for *circular* convolutions only. We use circular
   padding (the layers are then exactly the periodic version of Eq. 18's ``K``), so that the
   kGLM layers' spectral norm equals ``C`` exactly, as the paper intends (004 §4: "the scale C is
   *equal to* the spectral norm"). The convolutions are computed by FFT.
3. The readout: 004 §4 lists ``V1, V2`` among the initialised parameters, and with ``X~ = X``
   Eq. 20 gives ``V1 = -K / lam``, ``V2 = K / lam``; with ``sigma`` the identity the untrained
   kGLM-initialised model is then exactly kernel ridge smoothing, ``y_hat = K (K + lam)^-1 y``.
4. Optimiser, batch size, solver: not given in the text. We use Adam at ``1e-3`` (the code adds
   a cosine decay and batches of 100), Anderson (``m = 5``) with relative tolerance ``1e-3`` and a
   step cap (the code iterates forward to ``1e-2``, at most 50 steps), and fresh training noise for
   every batch (test noise fixed and the same for every model).
5. Random initialisation reuses one standard normal draw per seed across the variance grid
   (``sqrt(Var)`` times it, as re-seeding a framework's initialiser does); kGLM initialisation
   one set of length scales per seed across the ``C`` grid.
6. Where the public code differs from the text, we follow the text: the code uses 3 x 3 filters,
   a Matérn kernel with random length scales and smoothness instead of App. F's squared
   exponential, and a ReLU on the output as well.

**Choosing grid points.** 004 Table 1 reports test losses "taken at the best performing spectral
norm" and names no separate set to choose that norm on. Here :func:`best_by_epoch` and :func:`compare_schemes` choose on
validation images by default: the last ``validation_size`` images of the training split, never
trained on, with their own fixed noise (:func:`load_images`), so the test images take no part in
the choice (``select_on="test"`` gives the paper's reading); and :func:`compare_schemes` judges
each seed at the grid point the *other* seeds choose, so its own models take no part either.

**Seeds in one program.** As chapter 3's :mod:`deqlab.lab.experiments.nonlinear.training`: each seed
has its own initialisation, batch order and training noise; one compiled epoch (a ``lax.scan``
over batches) is ``jax.vmap``-ped over the seeds; the per-seed results equal those of the seeds
run one at a time (tested). :func:`run_denoising_sweep` runs the (scheme, scale) grid through the
resumable :func:`deqlab.lab.experiments.sweep.run_sweep`.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from deqlab import _draws as draws
from deqlab import checks
from deqlab.backward import fixed_point
from deqlab.lab import data
from deqlab.solvers import Anderson
from deqlab.theory.kglm import kernels

__all__ = [
    "SCHEMES",
    "LAYERS",
    "NOISE_STD",
    "PAPER_CODE_VARIANCES",
    "PAPER_VARIANCES",
    "PAPER_CS",
    "RADIUS",
    "corrupt",
    "circular_conv",
    "sample_length_scales",
    "kglm_filter",
    "init_weights",
    "layer_norms",
    "conv_eigenvalues",
    "denoise",
    "train_seeds",
    "run_denoising_sweep",
    "summarize",
    "SELECT_ON",
    "best_by_epoch",
    "compare_schemes",
]

SCHEMES = ("random", "kglm")
"""Initialisation schemes of 004 §4 (image denoising)."""

LAYERS = ("W1", "W2", "V1", "V2")
"""The four convolutional layers of the model (004 Eq. 19-20 with ``rho = 0``)."""

NOISE_STD = 0.2
"""004 §4: inputs corrupted by i.i.d. ``N(0, 0.2)`` noise; 0.2 is the standard deviation in the
authors' code (module notes)."""

PAPER_VARIANCES = tuple(float(v) for v in np.logspace(-3, 0, 25))
"""004 §4 as printed: random initialisation, filter-weight "variances" ``logspace(1e-3, 1, 25)``.

:meta hide-value:
"""

PAPER_CODE_VARIANCES = tuple(float(s) ** 2 for s in np.logspace(-3, 0, 25))
"""The same grid as the authors' code uses it, as standard deviations: variances ``1e-6 ... 1``
(25 values, ``logspace(-3, 0, 25) ** 2``).

:meta hide-value:
"""

PAPER_CS = tuple(float(c) for c in np.logspace(-2, 1, 25))
"""004 §4: kGLM initialisation, ``C = ||K|| / lam`` in ``logspace(1e-2, 10, 25)``.

:meta hide-value:
"""

RADIUS = 3
"""004 App. F: truncation radius ``r_1 = r_2 = 3`` (7 x 7 filters)."""

_SQUARED_LENGTH_MAX = 4.0  # 004 App. F: squared length scales ~ U(0, 4)
_CHANNELS = 3

_DEFAULTS = dict(epochs=5, batch_size=32, learning_rate=1e-3, tol=1e-3, max_steps=20, anderson_m=5,
                 noise_std=NOISE_STD)


# --------------------------------------------------------------------------------------------
# Noise, convolution, initialisation
# --------------------------------------------------------------------------------------------


def corrupt(key: jax.Array, images: jax.Array, noise_std: float = NOISE_STD) -> jax.Array:
    """``clip(images + noise_std * e, 0, 1)`` with ``e`` i.i.d. standard normal (004 §4).

    The default ``noise_std = 0.2`` is 004's ``N(0, 0.2)`` as the authors' code reads it (module notes).
    Traceable; ``key`` a JAX PRNG key.

    Args:
        key: a single JAX PRNG key (``jax.random.key(seed)`` or a raw ``uint32[2]`` key), not an
            int seed; it draws the noise of every pixel and channel.
        images: clean images, any shape (here ``(..., 3, h, w)``), values in [0, 1]; a float
            array (the noise has its dtype).
        noise_std: the noise's standard deviation, a finite number >= 0 (0: only the clipping);
            under ``jit`` a traced scalar is accepted unchecked.

    Returns:
        The noisy images, the shape and dtype of ``images``, every value in [0, 1].

    Raises:
        ValueError: ``key`` is not a single PRNG key, or ``noise_std`` is negative, not finite or
            not a real scalar.

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> from deqlab.lab.experiments.kglm.denoising import corrupt
        >>> clean = jnp.full((2, 3, 8, 8), 0.5)
        >>> noisy = corrupt(jax.random.key(0), clean)
        >>> noisy.shape, bool(((noisy >= 0) & (noisy <= 1)).all()), round(float(jnp.std(noisy - clean)), 1)
        ((2, 3, 8, 8), True, 0.2)
        >>> bool(jnp.array_equal(corrupt(jax.random.key(0), clean, noise_std=0.0), clean))
        True
    """
    where = "denoising.corrupt"
    checks.prng_key(key, "key", where)
    noise_std = checks.number(noise_std, "noise_std", where, lower=0.0, allow_traced=True)
    images = jnp.asarray(images)
    noise = draws.normal(key, images.shape, images.dtype)  # jax.random.normal's numbers, compiled faster
    return jnp.clip(images + noise_std * noise, 0.0, 1.0)


def _transfer(weights: jax.Array, h: int, w: int) -> jax.Array:
    """Half-spectrum transfer matrices ``(c_out, c_in, h, w // 2 + 1)`` of the circular
    cross-correlation with ``weights`` (the folding of :func:`kernels.conv_spectral_norm`)."""
    kh, kw = weights.shape[-2:]
    rows = (np.arange(kh) - (kh - 1) // 2) % h
    cols = (np.arange(kw) - (kw - 1) // 2) % w
    grid = jnp.zeros(weights.shape[:2] + (h, w), weights.dtype)
    grid = grid.at[:, :, rows[:, None], cols[None, :]].add(weights)
    # cross-correlation = convolution with the flipped filter: the conjugate transfer function
    return jnp.conj(jnp.fft.rfft2(grid))


def _apply_transfer(transfer: jax.Array, x: jax.Array) -> jax.Array:
    h, w = x.shape[-2:]
    spectrum = jnp.einsum("oiuv,...iuv->...ouv", transfer, jnp.fft.rfft2(x))
    return jnp.fft.irfft2(spectrum, s=(h, w)).astype(x.dtype)


def circular_conv(weights: Any, images: Any) -> jax.Array:
    """Circular multi-channel convolution of CNNs (cross-correlation), computed by FFT.

    Equals :func:`deqlab.theory.kglm.kernels.conv2d` with ``padding="circular"`` for each image.
    ``weights``: ``(c_out, c_in, kh, kw)``; ``images``: ``(..., c_in, h, w)``. Traceable. An FFT is
    used because ``vmap`` over the weights of a direct convolution is slow on CPUs (a grouped
    convolution); per image it costs ``O(c h w (c + log(h w)))``.

    This is 004 App. E Def. 10 (the multi-channel convolution of CNNs) with the image wrapped
    around instead of zero-padded (Def. 9 pads with zeros; module notes, item 2): the layers are
    then circulant, so the DFT block-diagonalises them (Sedghi et al. 2018, the spectral norm 004
    §3.3 and §4 use).

    Args:
        weights: the filter bank, ``(c_out, c_in, kh, kw)``; the filter's centre is at index
            ``((kh - 1) // 2, (kw - 1) // 2)`` (odd sizes, as ``2 r + 1``, are the usual case).
        images: ``(..., c_in, h, w)``, any number of leading batch axes.

    Returns:
        ``out[..., o, i, j] = sum_{c, p, q} weights[o, c, p, q] images[..., c, (i + p - ph) % h,
        (j + q - pw) % w]`` with ``ph = (kh - 1) // 2``, ``pw = (kw - 1) // 2``: shape
        ``(..., c_out, h, w)``, the dtype of ``images``.

    Raises:
        ValueError: ``weights`` is not 4-D, ``images`` has fewer than 3 axes, or the channel axis
            of ``images`` (``images.shape[-3]``) differs from ``weights.shape[1]`` (``c_in``).

    Example:
        A filter bank whose only non-zero entry is one pixel to the right of the centre, on the
        diagonal (channel ``c`` to channel ``c``), shifts every channel one pixel to the left, the
        first column wrapping around to the last:

        >>> import jax
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from deqlab.lab.experiments.kglm.denoising import circular_conv
        >>> shift = np.zeros((3, 3, 3, 3), np.float32)
        >>> shift[[0, 1, 2], [0, 1, 2], 1, 2] = 1.0
        >>> images = jax.random.uniform(jax.random.key(1), (2, 3, 8, 8))
        >>> out = circular_conv(shift, images)
        >>> out.shape, bool(jnp.allclose(out, jnp.roll(images, -1, axis=-1), atol=1e-6))
        ((2, 3, 8, 8), True)
    """
    weights = jnp.asarray(weights)
    images = jnp.asarray(images)
    if weights.ndim != 4 or images.ndim < 3 or images.shape[-3] != weights.shape[1]:
        raise checks.fail("images", f"an array of shape (..., c_in={weights.shape[1] if weights.ndim == 4 else '?'}, "
                          "h, w) for weights of shape (c_out, c_in, kh, kw)",
                          f"images of shape {images.shape}, weights of shape {weights.shape}", "denoising.circular_conv")
    return _apply_transfer(_transfer(weights, *images.shape[-2:]), images)


def sample_length_scales(key: jax.Array, channels: int = _CHANNELS) -> np.ndarray:
    """004 App. F: one length scale per channel pair, squared length scale ``~ U(0, 4)``.

    Returns a symmetric ``(channels, channels)`` float64 array of length scales (square roots);
    ``U(0, 4)`` is drawn as ``4 (1 - u)``, ``u ~ U[0, 1)``, so that no length scale is 0.

    004 App. F's ``kappa_0`` sums ``c (c + 1) / 2`` squared exponentials, the ``r``-th acting on
    the channel pair ``{a_r, b_r}`` with length scale ``l_r``; entry ``[a, b]`` (and ``[b, a]``)
    of the result is ``l_r`` of the pair ``{a, b}``, diagonal included. The draws fill the upper
    triangle row by row (``numpy.triu_indices``).

    Args:
        key: a single JAX PRNG key (``jax.random.key(seed)`` or a raw ``uint32[2]`` key), not an
            int seed.
        channels: the number of channels ``c``, an integer >= 1 (default 3, RGB).

    Returns:
        The length scales ``l``, a symmetric ``(channels, channels)`` float64 array with entries
        in ``(0, 2]`` (``l^2`` in ``(0, 4]``).

    Raises:
        ValueError: ``key`` is not a single PRNG key, or ``channels`` is not an integer >= 1.

    Example:
        >>> import jax
        >>> import numpy as np
        >>> from deqlab.lab.experiments.kglm.denoising import sample_length_scales
        >>> ell = sample_length_scales(jax.random.key(0))
        >>> ell.shape, ell.dtype, bool(np.array_equal(ell, ell.T)), bool(((ell > 0) & (ell <= 2)).all())
        ((3, 3), dtype('float64'), True, True)
    """
    where = "denoising.sample_length_scales"
    checks.prng_key(key, "key", where)
    c = checks.positive_int(channels, "channels", where)
    u = np.asarray(jax.random.uniform(key, (c * (c + 1) // 2,), jnp.float32), np.float64)
    upper = np.zeros((c, c))
    upper[np.triu_indices(c)] = np.sqrt(_SQUARED_LENGTH_MAX * (1.0 - u))
    return upper + np.triu(upper, 1).T


def kglm_filter(length_scale: Any, radius: int = RADIUS) -> np.ndarray:
    """The filter bank ``C`` of 004 Cor. 11 for App. F's kernel (box truncation of radius
    ``radius``, ``kappa_0`` a squared exponential with the given per-channel-pair length scales),
    ``(c, c, 2 r + 1, 2 r + 1)`` float64, before the factor ``-+1 / lam``.

    Entry ``[a, b, p, q]`` is ``kappa((i, j, a), (i + p - r, j + q - r, b)) = exp(-((p - r)^2 +
    (q - r)^2) / (2 l[a, b]^2))``: the kernel of 004 Eq. 18 between a filter's centre and its
    offsets (:meth:`deqlab.theory.kglm.kernels.ImageKernel.filter`), so that the convolution
    with it is ``K = kappa(X, X)`` (with zero padding, 004 Def. 9; this module's circular
    convolution gives the periodic ``K`` of images wrapped around). Every such bank is symmetric,
    ``C[a, b, p, q] = C[b, a, -p, -q]``. Computed in JAX's default precision (float32 unless
    ``jax_enable_x64`` is on) and returned as float64.

    Args:
        length_scale: the length scales ``l``: a number > 0 (one channel) or a symmetric
            ``(c, c)`` array of them, one per channel pair (:func:`sample_length_scales`).
        radius: the box truncation radius ``r = r_1 = r_2`` of Eq. 18, an integer >= 0
            (default :data:`RADIUS` ``= 3``, App. F: 7 x 7 filters).

    Returns:
        The filter bank, ``(c, c, 2 radius + 1, 2 radius + 1)`` float64 (``c = 1`` for a number).

    Raises:
        ValueError: ``radius`` is not an integer >= 0, or ``length_scale`` is not a number or a
            symmetric square array of finite numbers > 0 (raised by
            :func:`deqlab.theory.kglm.kernels.image_kernel`).

    Example:
        One channel, length scale 1, radius 1: ``exp(-d^2 / 2)`` at squared offset ``d^2``:

        >>> import jax
        >>> import numpy as np
        >>> from deqlab.lab.experiments.kglm.denoising import kglm_filter, sample_length_scales
        >>> np.round(kglm_filter(1.0, radius=1)[0, 0], 3).tolist()
        [[0.368, 0.607, 0.368], [0.607, 1.0, 0.607], [0.368, 0.607, 0.368]]
        >>> f = kglm_filter(sample_length_scales(jax.random.key(0)))
        >>> f.shape, bool(np.allclose(f, np.swapaxes(f, 0, 1)[:, :, ::-1, ::-1]))
        ((3, 3, 7, 7), True)
    """
    length_scale = np.asarray(length_scale, np.float64)
    channels = length_scale.shape[0] if length_scale.ndim == 2 else 1
    kernel = kernels.image_kernel(radius, length_scale=length_scale, channels=channels)
    return np.asarray(kernel.filter(), np.float64)


def init_weights(scheme: str, scale: float, key: jax.Array, image_shape: Sequence[int] = (32, 32),
                 radius: int = RADIUS) -> dict[str, np.ndarray]:
    """Initial filters ``{"W1", "W2", "V1", "V2"}`` (each ``(3, 3, 2r+1, 2r+1)``, float32) of one seed.

    - ``"random"``: i.i.d. ``N(0, scale)`` entries, ``scale`` the *variance* ``Var`` (004 §4);
      the four layers from one standard normal draw of ``key``, times ``sqrt(scale)``.
    - ``"kglm"``: ``W1 = V1 = -K / lam``, ``W2 = V2 = K / lam``, ``lam = ||K|| / C``, ``C = scale``
      (004 §4, Cor. 11), ``K`` the circular convolution with :func:`kglm_filter` of length scales
      :func:`sample_length_scales` ``(key)``; ``||K||`` its exact spectral norm on ``image_shape``
      (Sedghi et al. 2018), so each layer's spectral norm is ``C`` (up to float32 rounding).

    The kGLM layers are 004 Eq. 19-20 (Cor. 11) with ``T`` the identity and ``X~ = X``; ``lam =
    ||K|| / C`` is 004 §4's choice; with ``rho = 0`` and the ReLU's slope at most 1, Assumption 2
    asks ``||K / lam|| < 1``, i.e. ``C < 1``.

    Args:
        scheme: ``"random"`` or ``"kglm"`` (:data:`SCHEMES`).
        scale: a finite number > 0: the variance ``Var`` of every weight (``"random"``, the
            grids :data:`PAPER_CODE_VARIANCES` / :data:`PAPER_VARIANCES`) or the spectral norm ``C``
            of every layer (``"kglm"``, the grid :data:`PAPER_CS`).
        key: a single JAX PRNG key (not an int seed): the normal draw (``"random"``) or the
            length scales (``"kglm"``).
        image_shape: ``(h, w)``, integers >= ``2 radius + 1``, the images the layers act on;
            ``||K||`` is the norm on this size (read by ``"kglm"`` only, checked for both).
        radius: the filters' radius ``r``, an integer >= 0 (default :data:`RADIUS` ``= 3``, 004
            App. F).

    Returns:
        ``{"W1", "W2", "V1", "V2"}``, each a ``(3, 3, 2 radius + 1, 2 radius + 1)`` float32 NumPy
        array (``(c_out, c_in, kh, kw)``, as :func:`circular_conv` takes).

    Raises:
        ValueError: ``scheme`` is not in :data:`SCHEMES`; ``scale`` is not a finite number > 0;
            ``key`` is not a single PRNG key; ``radius`` is not an integer >= 0; or
            ``image_shape`` is not a pair of integers >= ``2 radius + 1``.

    Example:
        kGLM: ``W1 = V1 = -W2 = -V2``, every layer of spectral norm ``C = 0.5`` on 8 x 8 images;
        random: weights of standard deviation ``sqrt(Var) = 0.1``:

        >>> import jax
        >>> import numpy as np
        >>> from deqlab.lab.experiments.kglm.denoising import init_weights
        >>> from deqlab.theory.kglm.kernels import conv_spectral_norm
        >>> w = init_weights("kglm", 0.5, jax.random.key(0), image_shape=(8, 8))
        >>> sorted(w), w["W1"].shape, w["W1"].dtype
        (['V1', 'V2', 'W1', 'W2'], (3, 3, 7, 7), dtype('float32'))
        >>> bool(np.array_equal(w["W1"], -w["W2"])), bool(np.array_equal(w["V1"], w["W1"]))
        (True, True)
        >>> round(float(conv_spectral_norm(w["W2"], (8, 8))), 4)
        0.5
        >>> r = init_weights("random", 1e-2, jax.random.key(0))
        >>> round(float(np.std(np.stack([r[name] for name in sorted(r)]))), 2)
        0.1
    """
    where = "denoising.init_weights"
    scheme = checks.choice(scheme, "scheme", SCHEMES, where)
    scale = checks.positive_number(scale, "scale", where)
    checks.prng_key(key, "key", where)
    radius = checks.integer(radius, "radius", where, minimum=0)
    h, w = _image_shape(image_shape, radius, where)
    size = 2 * radius + 1
    if scheme == "random":
        draw = np.asarray(draws.normal(key, (len(LAYERS), _CHANNELS, _CHANNELS, size, size), jnp.float32))
        return {name: (math.sqrt(scale) * draw[i]).astype(np.float32) for i, name in enumerate(LAYERS)}
    F = kglm_filter(sample_length_scales(key), radius)
    norm = float(kernels.conv_spectral_norm(F, (h, w)))
    # lam = ||K|| / C, so K / lam = C K / ||K||  (004 §4; models.lam_for_spectral_norm for dense K)
    positive = (scale / norm * F).astype(np.float32)
    return {"W1": -positive, "W2": positive, "V1": -positive, "V2": positive}


def _image_shape(image_shape, radius, where):
    shape = tuple(image_shape) if isinstance(image_shape, (tuple, list)) else None
    if shape is None or len(shape) != 2:
        raise checks.fail("image_shape", "a pair (height, width)", image_shape, where)
    return tuple(checks.integer(s, "image_shape", where, minimum=2 * radius + 1) for s in shape)


def layer_norms(weights: dict[str, Any], image_shape: Sequence[int]) -> dict[str, float]:
    """Exact spectral norm of each circular convolutional layer on ``image_shape`` (Sedghi et al.
    2018, :func:`deqlab.theory.kglm.kernels.conv_spectral_norm`), and their ``"mean"`` (the
    horizontal axis of 004 Fig. 6).

    004 §4 computes these norms "using the fast and exact method described by Sedghi et al.
    (2018)" (also 004 §3.3, "Spectral normalisation"); the layers being circular convolutions
    (module notes, item 2), here they are exact. Computed in JAX's default precision (float32
    unless ``jax_enable_x64`` is on).

    Args:
        weights: a dict with (at least) the keys :data:`LAYERS` ``("W1", "W2", "V1", "V2")``, each
            a real ``(c_out, c_in, kh, kw)`` filter bank (:func:`init_weights`).
        image_shape: ``(h, w)`` (or ``(c_in, h, w)``), positive integers: the images the layers
            act on.

    Returns:
        ``{"W1", "W2", "V1", "V2", "mean"}``: each layer's spectral norm and their mean, Python
        floats.

    Raises:
        KeyError: a layer of :data:`LAYERS` missing from ``weights``.
        ValueError: a filter bank that is not 4-D, or an ``image_shape`` that is not ``(h, w)``
            or ``(c_in, h, w)`` of positive integers (raised by
            :func:`deqlab.theory.kglm.kernels.conv_spectral_norm`).

    Example:
        A kGLM initialisation at ``C = 2`` has every layer's norm (and so the mean) equal to 2; a
        random one has layers of different norms:

        >>> import jax
        >>> from deqlab.lab.experiments.kglm.denoising import init_weights, layer_norms
        >>> kglm = init_weights("kglm", 2.0, jax.random.key(1), (8, 8))
        >>> {name: round(norm, 3) for name, norm in layer_norms(kglm, (8, 8)).items()}
        {'W1': 2.0, 'W2': 2.0, 'V1': 2.0, 'V2': 2.0, 'mean': 2.0}
        >>> norms = layer_norms(init_weights("random", 1e-2, jax.random.key(0)), (8, 8))
        >>> len({round(norms[name], 3) for name in ("W1", "W2", "V1", "V2")}), round(norms["mean"], 1)
        (4, 2.5)
    """
    norms = {name: float(kernels.conv_spectral_norm(np.asarray(weights[name], np.float64), tuple(image_shape)))
             for name in LAYERS}
    norms["mean"] = float(np.mean([norms[name] for name in LAYERS]))
    return norms


def conv_eigenvalues(filters: Any, image_shape: Sequence[int]) -> np.ndarray:
    """All ``c h w`` eigenvalues (ascending, float64) of the circular convolution with a *symmetric*
    filter bank (``filters[a, b, p, q] = filters[b, a, -p, -q]``, as every Gram-matrix filter of
    004 Cor. 11 is) on ``image_shape``: the DFT block-diagonalises it into one Hermitian
    ``c x c`` matrix per frequency (Sedghi et al. 2018), whose eigenvalues these are.

    The kGLM layers ``K / lam`` are kernel ridge regression only if all of them are ``>= 0``;
    with App. F's per-channel-pair length scales they are not (erratum 20 of the book).

    A negative eigenvalue means 004 Assumption 1 (``K`` strictly positive definite) fails;
    004 App. I, Prop. 13, bounds how far such a layer's fixed point can be from that of the
    nearest PSD matrix by a multiple of the size of its most negative eigenvalue (for a
    contracting layer, ``C < 1``).

    Args:
        filters: a real symmetric filter bank ``(c, c, kh, kw)``, ``filters[a, b, p, q] =
            filters[b, a, -p, -q]`` (offsets from the centre ``((kh - 1) // 2, (kw - 1) // 2)``,
            up to ``rtol = 1e-6`` and ``atol = 1e-7 max(1, max |filters|)``), e.g.
            :func:`kglm_filter` or a kGLM layer of :func:`init_weights`.
        image_shape: ``(h, w)``, integers >= ``2 ((kw - 1) // 2) + 1`` (``kw`` for odd ``kw``).

    Returns:
        All ``c h w`` eigenvalues of the ``(c h w, c h w)`` layer, ascending, float64 ``(c h w,)``.

    Raises:
        ValueError: ``filters`` is not of shape ``(c, c, kh, kw)``; ``filters`` is not symmetric
            (as above); or ``image_shape`` is not a pair of integers >= ``2 ((kw - 1) // 2) + 1``.

    Example:
        The 3 x 3 box filter on 4 x 4 images: eigenvalues ``(1 + 2 cos(pi u / 2)) (1 + 2 cos(pi v
        / 2))``, from -3 to 9; a kGLM layer at ``C = 0.5`` has largest eigenvalue ``C`` but a
        negative one too (erratum 20):

        >>> import jax
        >>> import numpy as np
        >>> from deqlab.lab.experiments.kglm.denoising import conv_eigenvalues, init_weights
        >>> box = conv_eigenvalues(np.ones((1, 1, 3, 3)), (4, 4))
        >>> box.shape, np.round(box[[0, -1]], 6).tolist()
        ((16,), [-3.0, 9.0])
        >>> ev = conv_eigenvalues(init_weights("kglm", 0.5, jax.random.key(0), (8, 8))["W2"], (8, 8))
        >>> ev.shape, round(float(ev[-1]), 4), bool(ev[0] < 0)
        ((192,), 0.5, True)
    """
    where = "denoising.conv_eigenvalues"
    f = np.asarray(filters, np.float64)
    if f.ndim != 4 or f.shape[0] != f.shape[1]:
        raise checks.fail("filters", "an array of shape (c, c, kh, kw)", f.shape, where)
    flipped = np.swapaxes(f, 0, 1)[:, :, ::-1, ::-1]
    if not np.allclose(f, flipped, rtol=1e-6, atol=1e-7 * max(1.0, float(np.abs(f).max()))):
        raise checks.fail("filters", "a symmetric filter bank (f[a, b, p, q] = f[b, a, -p, -q])",
                          "an asymmetric one", where)
    h, w = _image_shape(image_shape, (f.shape[-1] - 1) // 2, where)
    kh, kw = f.shape[-2:]
    grid = np.zeros(f.shape[:2] + (h, w))
    rows = (np.arange(kh) - (kh - 1) // 2) % h
    cols = (np.arange(kw) - (kw - 1) // 2) % w
    np.add.at(grid, (slice(None), slice(None), rows[:, None], cols[None, :]), f)
    P = np.moveaxis(np.fft.fft2(grid), (0, 1), (-2, -1))  # (h, w, c, c), Hermitian for a symmetric bank
    P = 0.5 * (P + np.conj(np.swapaxes(P, -1, -2)))
    return np.sort(np.linalg.eigvalsh(P).ravel())


# --------------------------------------------------------------------------------------------
# Model and training
# --------------------------------------------------------------------------------------------


def denoise(weights: dict[str, jax.Array], noisy: jax.Array, *, tol: float = 1e-3, max_steps: int = 20,
            anderson_m: int = 5):
    """The denoising DEQ (004 Eq. 19-20): ``z* = ReLU(W1 * z* + W2 * y)``, ``y_hat = V1 * z* + V2 * y``.

    ``noisy``: ``(batch, 3, h, w)``. Returns ``(y_hat, solution)``, the solution of the forward solve
    (per-image ``converged``). Differentiable (implicit backward pass; failed solves are
    counted by the caller, not warned about). Traceable.

    This is 004 Cor. 11 (App. E), Eq. 19 with ``sigma = ReLU``, ``T`` the identity and ``rho = 0``
    (004 §4, "Image denoising"), and Eq. 20 as the readout; ``*`` is :func:`circular_conv`, the
    fixed point is found from ``z = 0`` by :class:`deqlab.solvers.Anderson` in
    :func:`deqlab.backward.fixed_point` (``on_failure="ignore"``: a failed solve, whose value is
    not the equilibrium, is recorded only in ``solution.converged``). With the kGLM weights of
    :func:`init_weights` (``W1 = V1 = -K / lam``, ``W2 = V2 = K / lam``), ``y_hat`` is the
    pre-activation at ``z*``, which equals ``z*`` where ``z* > 0``; if ``z* > 0`` everywhere, ``(I +
    K / lam) y_hat = (K / lam) y``, kernel ridge smoothing ``y_hat = K (K + lam)^-1 y``.

    Args:
        weights: the filter banks :data:`LAYERS` ``{"W1", "W2", "V1", "V2"}``, real
            ``(c_out, c_in, kh, kw)`` arrays that compose (``W1``: hidden to hidden, ``W2``: input
            to hidden, ``V1``: hidden to output, ``V2``: input to output; all ``(3, 3, 7, 7)``
            from :func:`init_weights`).
        noisy: the noisy images ``y``, a float array ``(batch, 3, h, w)`` (:func:`corrupt`).
        tol: the Anderson solver's relative tolerance, a number > 0.
        max_steps: the solver's step cap, an integer >= 1.
        anderson_m: the Anderson history size ``m``, an integer >= 1.

    Returns:
        ``(y_hat, solution)``: the denoised images ``(batch, 3, h, w)`` (dtype of ``noisy``), and
        the forward solve's :class:`deqlab.solvers.solution.Solution`, whose ``value`` is ``z*``
        ``(batch, 3, h, w)`` and ``converged`` a ``(batch,)`` bool array.

    Raises:
        KeyError: a layer of :data:`LAYERS` missing from ``weights``.
        ValueError: ``tol`` not a number > 0, or ``max_steps`` or ``anderson_m`` not an integer
            >= 1 (raised by :class:`deqlab.solvers.Anderson`).

    Example:
        The untrained kGLM model at ``C = 0.5`` (a contraction) on two noisy grey 8 x 8 images;
        ``z* > 0``, so the output solves the kernel ridge equation ``(I + K / lam) y_hat = (K /
        lam) y`` (``K / lam`` is ``W2``):

        >>> import jax
        >>> import jax.numpy as jnp
        >>> from deqlab.lab.experiments.kglm.denoising import circular_conv, corrupt, denoise, init_weights
        >>> weights = init_weights("kglm", 0.5, jax.random.key(0), (8, 8))
        >>> noisy = corrupt(jax.random.key(1), jnp.full((2, 3, 8, 8), 0.5))
        >>> y_hat, solution = denoise(weights, noisy, tol=1e-5)
        >>> y_hat.shape, solution.converged.tolist(), bool((solution.value > 0).all())
        ((2, 3, 8, 8), [True, True], True)
        >>> ridge = y_hat + circular_conv(weights["W2"], y_hat) - circular_conv(weights["W2"], noisy)
        >>> bool(jnp.abs(ridge).max() < 1e-4)
        True
    """
    h, w = noisy.shape[-2:]
    t = {name: _transfer(weights[name], h, w) for name in LAYERS}
    injection = _apply_transfer(t["W2"], noisy)

    def cell(z, t1, b):
        return jax.nn.relu(_apply_transfer(t1, z) + b)

    sol = fixed_point(cell, jnp.zeros_like(noisy), t["W1"], injection, solver=Anderson(m=anderson_m, tol=tol, max_steps=max_steps),
                      batch_axis=0, on_failure="ignore")
    return _apply_transfer(t["V1"], sol.value) + _apply_transfer(t["V2"], noisy), sol


@functools.lru_cache(maxsize=16)
def _program(tol, max_steps, anderson_m, batch_size, n_batches):
    """The compiled, seed-vmapped epoch and test evaluation (shared by every scheme and scale:
    they differ only in the initial weights)."""
    # Adam's direction times a traced -learning_rate (= optax.adam(learning_rate)): one
    # compilation serves every rate.
    tx = optax.scale_by_adam()
    solve = functools.partial(denoise, tol=tol, max_steps=max_steps, anderson_m=anderson_m)

    def loss_fn(weights, noisy, clean):
        out, sol = solve(weights, noisy)
        return jnp.mean((out - clean) ** 2), jnp.mean(sol.converged.astype(jnp.float32))

    def evaluate(weights, noisy, clean):
        def one(_, batch):
            out, sol = solve(weights, batch[0])
            return None, (jnp.mean((out - batch[1]) ** 2), jnp.mean(sol.converged.astype(jnp.float32)))

        shape = (-1, batch_size) + noisy.shape[1:]
        _, (mse, conv) = jax.lax.scan(one, None, (noisy.reshape(shape), clean.reshape(shape)))
        return jnp.mean(mse), jnp.mean(conv)

    def epoch(weights, opt_state, key_data, epoch_index, learning_rate, noise_std, x_train):
        key = jax.random.fold_in(jax.random.wrap_key_data(key_data), epoch_index)
        order_key, noise_key = jax.random.split(key)
        order = jax.random.permutation(order_key, x_train.shape[0])[: n_batches * batch_size]

        def step(carry, inputs):
            weights, opt_state = carry
            idx, k = inputs
            clean = x_train[idx]
            noisy = corrupt(k, clean, noise_std)
            (loss, conv), grads = jax.value_and_grad(loss_fn, has_aux=True)(weights, noisy, clean)
            updates, opt_state = tx.update(grads, opt_state, weights)
            updates = jax.tree_util.tree_map(lambda u: learning_rate * u, updates)
            return (optax.apply_updates(weights, updates), opt_state), (loss, conv)

        keys = jax.random.split(noise_key, n_batches)
        (weights, opt_state), (loss, conv) = jax.lax.scan(
            step, (weights, opt_state), (order.reshape(n_batches, batch_size), keys))
        return weights, opt_state, jnp.mean(loss), jnp.mean(conv)

    run_epoch = jax.jit(jax.vmap(epoch, in_axes=(0, 0, 0, None, None, None, None)))
    run_eval = jax.jit(jax.vmap(evaluate, in_axes=(0, None, None)))
    return tx, run_epoch, run_eval


def _check_seeds(seeds, where):
    if isinstance(seeds, (int, np.integer)) or not isinstance(seeds, Sequence) or len(seeds) == 0:
        raise checks.fail("seeds", "a non-empty list of distinct integers >= 0", seeds, where)
    seeds = [checks.integer(s, "seeds", where, minimum=0) for s in seeds]
    if len(set(seeds)) != len(seeds):
        raise checks.fail("seeds", "a non-empty list of distinct integers >= 0", seeds, where)
    return seeds


def _check_options(options, where):
    unknown = set(options) - set(_DEFAULTS)
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {sorted(unknown)}; valid options are {sorted(_DEFAULTS)}.")
    o = {**_DEFAULTS, **options}
    for name in ("batch_size", "max_steps", "anderson_m"):
        o[name] = checks.positive_int(o[name], name, where)
    o["epochs"] = checks.integer(o["epochs"], "epochs", where, minimum=0)
    o["learning_rate"] = checks.positive_number(o["learning_rate"], "learning_rate", where)
    o["tol"] = checks.positive_number(o["tol"], "tol", where)
    o["noise_std"] = checks.number(o["noise_std"], "noise_std", where, lower=0.0)
    return o


def load_images(dataset: str = "image_patches", *, train_size: int | None = None, validation_size: int = 0,
                test_size: int | None = None, image_size: int | None = None,
                data_path: str | os.PathLike | None = None):
    """Clean training, validation and test images ``(n, 3, h, w)`` in [0, 1].

    Args:
        dataset: ``"image_patches"`` (offline, :func:`deqlab.lab.data.load_image_patches`,
            ``image_size`` x ``image_size`` patches, default 32) or ``"cifar10"``
            (:func:`deqlab.lab.data.load_cifar10`; ``image_size`` must be None or 32).
        train_size: the first ``train_size`` images of the training split (None: all of it but
            the validation images).
        validation_size: the *last* ``validation_size`` images of the training split, >= 0, held
            out: never trained on, disjoint from the training images whatever ``train_size``. A
            grid point chosen on them leaves the test images unselected-on (:func:`best_by_epoch`).
        test_size: the first ``test_size`` images of the test split (None: all).
        image_size, data_path: as above; ``data_path`` is CIFAR-10's local directory.

    Returns:
        ``(x_train, x_validation, x_test)``; ``x_validation`` has 0 images when ``validation_size``
        is 0.

    Raises:
        ValueError: an argument out of range, named in the message (``train_size`` at most the
            training split less ``validation_size``).
        FileNotFoundError: CIFAR-10 not found under ``data_path``.

    Example:
        >>> from deqlab.lab.experiments.kglm.denoising import load_images
        >>> x_train, x_val, x_test = load_images(train_size=96, validation_size=64, test_size=64,
        ...                                      image_size=16)
        >>> x_train.shape, x_val.shape, x_test.shape
        ((96, 3, 16, 16), (64, 3, 16, 16), (64, 3, 16, 16))
    """
    where = "denoising.load_images"
    checks.choice(dataset, "dataset", ("image_patches", "cifar10"), where)
    if dataset == "image_patches":
        if data_path is not None:
            raise checks.fail("data_path", "None for 'image_patches' (bundled data)", data_path, where)
        size = 32 if image_size is None else checks.integer(image_size, "image_size", where, minimum=2 * RADIUS + 1,
                                                            maximum=427)
        x_train, _ = data.load_image_patches(split="train", size=size)
        x_test, _ = data.load_image_patches(split="test", size=size)
    else:
        if image_size not in (None, 32):
            raise checks.fail("image_size", "None or 32 for 'cifar10'", image_size, where)
        x_train, _ = data.load_cifar10(split="train", path=data_path)
        x_test, _ = data.load_cifar10(split="test", path=data_path)
    validation_size = checks.integer(validation_size, "validation_size", where, minimum=0,
                                     maximum=len(x_train) - 1)
    x_validation = x_train[len(x_train) - validation_size:]
    x_train = x_train[:len(x_train) - validation_size]
    for name, n, x in (("train_size", train_size, x_train), ("test_size", test_size, x_test)):
        if n is not None:
            checks.integer(n, name, where, minimum=1, maximum=len(x))
    return x_train[:train_size], x_validation, x_test[:test_size]


def train_seeds(scheme: str, scale: float, seeds: Sequence[int], *, dataset: str = "image_patches",
                train_size: int | None = None, validation_size: int = 0, test_size: int | None = None,
                image_size: int | None = None, data_path: str | os.PathLike | None = None, test_seed: int = 0,
                checkpoint_dir: str | os.PathLike | None = None, **options: Any) -> dict[str, Any]:
    """Train one denoising DEQ per seed from ``scheme`` at ``scale``, all seeds in one vmapped program.

    Args:
        scheme: ``"random"`` (``scale`` = the weights' variance) or ``"kglm"`` (``scale`` = C).
        scale: > 0.
        seeds: distinct integers >= 0; seed s sets the initialisation, batch order and training noise.
        dataset, train_size, validation_size, test_size, image_size, data_path: the images
            (:func:`load_images`); ``validation_size`` and ``test_size`` multiples of ``batch_size``.
        test_seed: seed of the test noise, shared by every model (a fair comparison); the
            validation images get their own noise from it (``fold_in(key(test_seed), 2)``).
        checkpoint_dir: if given, the state after each epoch is saved there (orbax) and a rerun
            resumes from it.
        **options: ``epochs`` (5, 004 Fig. 6), ``batch_size`` (32), ``learning_rate`` (1e-3),
            ``tol`` (1e-3), ``max_steps`` (20), ``anderson_m`` (5), ``noise_std`` (0.2).

    Returns:
        A dict of per-seed lists (JSON-able): ``test_mse_curve`` (``epochs + 1`` values, after
        0..epochs epochs; NaN or inf where training blew up), ``validation_mse_curve`` (the same
        on the validation images; present only when ``validation_size > 0``), ``norms`` (mean spectral norm of
        the four initial layers, the horizontal axis of Fig. 6), ``layer_norms``,
        ``converged_curve`` (fraction of test images whose solve converged, per evaluation),
        ``train_loss_curve``; and ``seeds``.

    Raises:
        ValueError: an argument out of range, named in the message (``checkpoint_dir`` holding
            runs on other validation or test sets).
        FileNotFoundError: CIFAR-10 not found under ``data_path``.

    Example:
        >>> r = train_seeds("kglm", 0.5, [0, 1], epochs=1, train_size=32, validation_size=16,
        ...                 test_size=16, image_size=8, batch_size=16, max_steps=10)  # doctest: +SKIP
        >>> len(r["test_mse_curve"][0]), len(r["validation_mse_curve"][0])   # doctest: +SKIP
        (2, 2)
    """
    where = "denoising.train_seeds"
    scheme = checks.choice(scheme, "scheme", SCHEMES, where)
    scale = checks.positive_number(scale, "scale", where)
    seeds = _check_seeds(seeds, where)
    test_seed = checks.integer(test_seed, "test_seed", where, minimum=0)
    o = _check_options(options, where)
    x_train, x_validation, x_test = load_images(dataset, train_size=train_size, validation_size=validation_size,
                                                test_size=test_size, image_size=image_size, data_path=data_path)
    if o["batch_size"] > len(x_train):
        raise checks.fail("batch_size", f"at most the number of training images ({len(x_train)})", o["batch_size"],
                          where)
    for name, x in (("validation_size", x_validation), ("test_size", x_test)):
        if len(x) % o["batch_size"]:
            raise checks.fail(name, f"a multiple of batch_size = {o['batch_size']} (it is evaluated in "
                              "batches)", len(x), where)
    image_shape = tuple(x_train.shape[-2:])
    x_train, x_validation, x_test = jnp.asarray(x_train), jnp.asarray(x_validation), jnp.asarray(x_test)
    noisy_test = corrupt(jax.random.key(test_seed), x_test, o["noise_std"])
    # fold_in 2: a key no seed's initialisation (fold_in 0) or training (fold_in 1) uses
    noisy_validation = corrupt(jax.random.fold_in(jax.random.key(test_seed), 2), x_validation, o["noise_std"])
    validating = len(x_validation) > 0
    n_batches = len(x_train) // o["batch_size"]
    tx, run_epoch, run_eval = _program(o["tol"], o["max_steps"], o["anderson_m"], o["batch_size"], n_batches)

    keys = [jax.random.key(s) for s in seeds]
    inits = [init_weights(scheme, scale, jax.random.fold_in(k, 0), image_shape) for k in keys]
    norms = [layer_norms(w, image_shape) for w in inits]
    weights = {name: jnp.stack([jnp.asarray(w[name]) for w in inits]) for name in LAYERS}
    opt_state = jax.vmap(tx.init)(weights)
    train_keys = jnp.stack([jax.random.key_data(jax.random.fold_in(k, 1)) for k in keys])
    # per epoch and seed: test mse, converged, train loss, validation mse
    history = np.full((o["epochs"] + 1, len(seeds), 4), np.nan, np.float32)

    def evaluate(weights):
        mse, conv = run_eval(weights, noisy_test, x_test)
        val = run_eval(weights, noisy_validation, x_validation)[0] if validating else jnp.full(len(seeds), jnp.nan)
        return np.asarray(mse), np.asarray(conv), np.asarray(val)

    mse, conv, val = evaluate(weights)
    history[0, :, 0], history[0, :, 1], history[0, :, 3] = mse, conv, val
    start = 0
    ckpt = None
    if checkpoint_dir is not None:
        from deqlab.lab.experiments.sweep import Checkpoints

        ckpt = Checkpoints(checkpoint_dir)
        # the evaluation sets travel with the state: a directory of runs on other sets is refused
        split = np.asarray([len(x_validation), len(x_test), test_seed], np.int32)
        restored, start = ckpt.resume({"weights": weights, "opt_state": opt_state, "history": history,
                                       "split": split})
        weights, opt_state, history = restored["weights"], restored["opt_state"], np.asarray(restored["history"])
        if not np.array_equal(np.asarray(restored["split"]), split):
            ckpt.close()
            raise checks.fail("checkpoint_dir", f"a directory of runs with validation_size = {len(x_validation)}, "
                              f"test_size = {len(x_test)} and test_seed = {test_seed} (its runs have "
                              f"{np.asarray(restored['split']).tolist()})", str(checkpoint_dir), where)
    try:
        for e in range(start, o["epochs"]):
            weights, opt_state, loss, conv_train = run_epoch(
                weights, opt_state, train_keys, e, jnp.float32(-o["learning_rate"]), jnp.float32(o["noise_std"]),
                x_train)
            mse, conv, val = evaluate(weights)
            history[e + 1] = np.stack([mse, conv, np.asarray(loss), val], axis=-1)
            if ckpt is not None:
                ckpt.save(e, {"weights": weights, "opt_state": opt_state, "history": history, "split": split})
    finally:
        if ckpt is not None:
            ckpt.close()
    result = {
        "seeds": list(seeds),
        "norms": [n["mean"] for n in norms],
        "layer_norms": [[n[name] for name in LAYERS] for n in norms],
        "test_mse_curve": history[:, :, 0].T.astype(np.float64).tolist(),
        "converged_curve": history[:, :, 1].T.astype(np.float64).tolist(),
        "train_loss_curve": history[1:, :, 2].T.astype(np.float64).tolist(),
    }
    if validating:
        result["validation_mse_curve"] = history[:, :, 3].T.astype(np.float64).tolist()
    return result


def run_denoising_sweep(directory: str | os.PathLike, *, variances: Sequence[float] = PAPER_CODE_VARIANCES,
                        cs: Sequence[float] = PAPER_CS, seeds: Sequence[int] = range(100),
                        dataset: str = "image_patches", train_size: int | None = None,
                        validation_size: int = 0, test_size: int | None = None, image_size: int | None = None,
                        data_path: str | os.PathLike | None = None, checkpoints: bool = False,
                        progress: bool = True, **options: Any) -> list[dict[str, Any]]:
    """004 Fig. 6's grid: :func:`train_seeds` for every random variance and every kGLM ``C``,
    through the resumable :func:`deqlab.lab.experiments.sweep.run_sweep` (one stored result per
    (scheme, scale); finished units are not rerun). Defaults are the paper's grids (the variances
    as its code reads them, :data:`PAPER_CODE_VARIANCES`) and seeds.

    Args:
        directory: where each (scheme, scale) unit's result (and, with ``checkpoints``, its
            per-epoch state) is stored; a rerun reads finished units back instead of training.
        variances: random initialisation's grid (weight variances > 0).
        cs: kGLM initialisation's grid (spectral norms C > 0).
        seeds: distinct integers >= 0, trained at every grid point.
        dataset, train_size, validation_size, test_size, image_size, data_path: the images
            (:func:`load_images`); pass ``validation_size`` to choose grid points on held-out
            training images (:func:`best_by_epoch`, :func:`compare_schemes`).
        checkpoints: save each unit's state after every epoch, so an interrupted unit resumes.
        progress: a progress bar over the units.
        **options: :func:`train_seeds`'s options.

    Returns:
        One row per (scheme, scale, seed): ``scheme``, ``scale``, ``seed``, ``norm`` (mean
        spectral norm of the initial layers), ``test_mse_curve``, ``converged_curve``, and
        ``validation_mse_curve`` when ``validation_size > 0``.

    Raises:
        ValueError: an argument out of range, named in the message.
        FileNotFoundError: CIFAR-10 not found under ``data_path``.

    Example:
        >>> rows = run_denoising_sweep("/tmp/sweep", variances=[1e-4], cs=[0.5], seeds=[0, 1],
        ...                            train_size=32, validation_size=16, test_size=16, image_size=8,
        ...                            epochs=1, batch_size=16, progress=False)  # doctest: +SKIP
        >>> len(rows), sorted(rows[0])                                        # doctest: +SKIP
        (4, ['converged_curve', 'norm', 'scale', 'scheme', 'seed', 'test_mse_curve', 'validation_mse_curve'])
    """
    from deqlab.lab.experiments import sweep

    where = "denoising.run_denoising_sweep"
    seeds = _check_seeds(list(seeds), where)
    grids = {}
    for scheme, name, values in (("random", "variances", variances), ("kglm", "cs", cs)):
        if isinstance(values, (int, float, np.number)) or not isinstance(values, Sequence):
            raise checks.fail(name, "a list of numbers > 0", values, where)
        grids[scheme] = [checks.positive_number(v, name, where) for v in values]
    if not grids["random"] and not grids["kglm"]:
        raise checks.fail("variances", "a non-empty list (or cs non-empty)", variances, where)
    o = _check_options(options, where)
    load_images(dataset, train_size=train_size, validation_size=validation_size, test_size=test_size,
                image_size=image_size, data_path=data_path)
    configs = [{"scheme": scheme, "scale": s, "seeds": seeds, "dataset": dataset, "train_size": train_size,
                "test_size": test_size, "image_size": image_size, "options": o}
               for scheme in SCHEMES for s in grids[scheme]]
    if validation_size:  # only when used, so that the stored units of earlier sweeps keep their keys
        for config in configs:
            config["validation_size"] = validation_size

    def unit(config, checkpoint_dir=None):
        result = train_seeds(config["scheme"], config["scale"], config["seeds"], dataset=config["dataset"],
                             train_size=config["train_size"], validation_size=config.get("validation_size", 0),
                             test_size=config["test_size"],
                             image_size=config["image_size"], data_path=data_path,
                             checkpoint_dir=checkpoint_dir, **config["options"])
        return {"result": result}

    units = sweep.run_sweep(unit, configs, directory, checkpoints=checkpoints, progress=progress,
                            description="scheme x scale")
    rows = []
    for u in units:
        r = u["result"]
        for i, seed in enumerate(r["seeds"]):
            rows.append({"scheme": u["scheme"], "scale": u["scale"], "seed": seed, "norm": r["norms"][i],
                         "test_mse_curve": r["test_mse_curve"][i], "converged_curve": r["converged_curve"][i]})
            if "validation_mse_curve" in r:
                rows[-1]["validation_mse_curve"] = r["validation_mse_curve"][i]
    return rows


# --------------------------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------------------------


def _finite_or_inf(values) -> np.ndarray:
    """NaN / inf (a run that blew up) become +inf: worse than every finite error, so that medians
    and ranks treat them as failures (004 Table 1 replaces them by the maximum instead)."""
    v = np.asarray(values, np.float64)
    return np.where(np.isfinite(v), v, np.inf)


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (scheme, scale, epoch): ``n`` seeds, ``norm`` (median over seeds of the mean layer
    norm), ``median``, lower and upper quartiles ``q25``, ``q75`` (order statistics) of the test MSE
    (NaN/inf counted as +inf), ``failed`` (seeds with a non-finite test MSE), and
    ``validation_median`` (the median validation MSE; None where the rows have no
    ``validation_mse_curve``). Rows in first-seen (scheme, scale) order, epochs ascending.

    Args:
        rows: per-seed rows of :func:`run_denoising_sweep`.

    Returns:
        One dict per (scheme, scale, epoch) with the keys above and ``scheme``, ``scale``, ``epoch``.

    Example:
        >>> from deqlab.lab.experiments.kglm.denoising import summarize
        >>> rows = [{"scheme": "kglm", "scale": 1.0, "seed": s, "norm": 1.0, "test_mse_curve": [v]}
        ...         for s, v in enumerate([0.2, float("nan"), 0.1])]
        >>> t = summarize(rows)[0]
        >>> t["median"], t["failed"], t["validation_median"]
        (0.2, 1, None)
    """
    groups: dict[tuple, list] = {}
    for row in rows:
        groups.setdefault((row["scheme"], row["scale"]), []).append(row)
    out = []
    for (scheme, scale), group in groups.items():
        curves = _finite_or_inf([r["test_mse_curve"] for r in group])  # (seeds, epochs + 1)
        validation = (_finite_or_inf([r["validation_mse_curve"] for r in group])
                      if all("validation_mse_curve" in r for r in group) else None)
        norm = float(np.median([r["norm"] for r in group]))
        for epoch in range(curves.shape[1]):
            v = curves[:, epoch]
            # order statistics (no interpolation, which is undefined next to an inf)
            q25, q75 = np.quantile(v, 0.25, method="lower"), np.quantile(v, 0.75, method="higher")
            median = np.median(v)
            out.append({"scheme": scheme, "scale": scale, "epoch": epoch, "n": len(group), "norm": norm,
                        "median": float(median), "q25": float(q25), "q75": float(q75),
                        "failed": int(np.sum(~np.isfinite(v))),
                        "validation_median": None if validation is None else float(np.median(validation[:, epoch]))})
    return out


SELECT_ON = ("validation", "test")
"""Where :func:`best_by_epoch` and :func:`compare_schemes` choose each scheme's grid point."""


def best_by_epoch(rows: Sequence[dict[str, Any]], select_on: str = "validation") -> list[dict[str, Any]]:
    """Per (scheme, epoch): the grid point with the lowest median MSE on ``select_on``'s images
    (ties: the smaller scale), and the *test* MSE there.

    Choosing on the validation images (held-out training images with their own noise,
    :func:`load_images`) keeps the test images out of the choice (but not the seeds, whose
    validation and test MSEs rank them alike: :func:`compare_schemes` cross-fits); choosing on
    the test images (``"test"``, the reading of 004 Table 1's "taken at the best performing
    spectral norm", which names no other set) flatters each scheme by the best of its grid.

    Args:
        rows: per-seed rows of :func:`run_denoising_sweep` (keys ``scheme``, ``scale``, ``seed``,
            ``norm``, ``test_mse_curve``, and ``validation_mse_curve`` for ``"validation"``).
        select_on: one of :data:`SELECT_ON`.

    Returns:
        One dict per (scheme, epoch), schemes in :data:`SCHEMES` order: ``scheme``, ``epoch``,
        ``scale``, ``norm`` there,
        the test MSE's ``median``, ``q25``, ``q75`` there, ``validation_median`` there (None
        without validation curves), ``selected_on``, and ``failed`` (non-finite test runs over the
        whole grid at that epoch, as 004 Table 1's "# failed").

    Raises:
        ValueError: ``select_on`` not in :data:`SELECT_ON`, or ``"validation"`` with rows that
            have no ``validation_mse_curve``.

    Example:
        Two grid points per scheme, two seeds, one epoch; the validation images prefer
        scale 1.0 for kGLM although its test MSE is lower at 0.5 (the choice does not look at it):

        >>> from deqlab.lab.experiments.kglm.denoising import best_by_epoch
        >>> def row(scheme, scale, seed, test, validation):
        ...     return {"scheme": scheme, "scale": scale, "seed": seed, "norm": scale,
        ...             "test_mse_curve": [test], "validation_mse_curve": [validation]}
        >>> rows = [row("kglm", 0.5, 0, 0.10, 0.30), row("kglm", 0.5, 1, 0.12, 0.32),
        ...         row("kglm", 1.0, 0, 0.20, 0.25), row("kglm", 1.0, 1, 0.22, 0.27),
        ...         row("random", 0.5, 0, 0.40, 0.40), row("random", 0.5, 1, 0.42, 0.42),
        ...         row("random", 1.0, 0, 0.50, 0.50), row("random", 1.0, 1, 0.52, 0.52)]
        >>> [(b["scheme"], b["scale"], round(b["median"], 2)) for b in best_by_epoch(rows)]
        [('random', 0.5, 0.41), ('kglm', 1.0, 0.21)]
        >>> [(b["scheme"], b["scale"]) for b in best_by_epoch(rows, select_on="test")]
        [('random', 0.5), ('kglm', 0.5)]
    """
    where = "denoising.best_by_epoch"
    select_on = checks.choice(select_on, "select_on", SELECT_ON, where)
    if select_on == "validation" and not all("validation_mse_curve" in r for r in rows):
        raise checks.fail("select_on", "'test' for rows without validation_mse_curve (or train with "
                          "validation_size > 0)", select_on, where)
    table = summarize(rows)
    key = "validation_median" if select_on == "validation" else "median"
    out = []
    for scheme in SCHEMES:
        epochs = sorted({r["epoch"] for r in table if r["scheme"] == scheme})
        for epoch in epochs:
            cells = [r for r in table if r["scheme"] == scheme and r["epoch"] == epoch]
            best = min(cells, key=lambda r: (r[key], r["scale"]))
            out.append({"scheme": scheme, "epoch": epoch, "scale": best["scale"], "norm": best["norm"],
                        "median": best["median"], "q25": best["q25"], "q75": best["q75"],
                        "validation_median": best["validation_median"], "selected_on": select_on,
                        "failed": int(sum(r["failed"] for r in cells))})
    return out


def _signed_rank_p_values(k: np.ndarray, r: np.ndarray) -> tuple[float, float, int]:
    """One-sided p-values of the Wilcoxon signed-rank test of the paired differences ``k - r``
    (alternatives: ``k`` smaller, ``k`` larger), and the number of non-zero differences.

    ``+inf`` (a failed run) is worse than any finite value: a pair with one failure gets a
    difference larger in size than every finite one (the largest rank), a pair of failures a zero
    difference (dropped, as Wilcoxon's zero method does). Up to 16 non-zero differences the
    p-values are exact, by enumerating all ``2^n`` sign patterns of the (mid-)ranks, so ties are
    handled exactly; above, scipy's normal approximation with tie correction.
    """
    from scipy import stats

    both_failed = np.isinf(k) & np.isinf(r)
    d = np.where(both_failed, 0.0, k) - np.where(both_failed, 0.0, r)
    finite = np.isfinite(d)
    big = 2.0 * (np.max(np.abs(d[finite])) if finite.any() else 1.0) + 1.0
    d = np.where(finite, d, np.sign(d) * big)
    d = d[d != 0]
    n = len(d)
    if n == 0:
        return 1.0, 1.0, 0
    if n <= 16:
        ranks = stats.rankdata(np.abs(d))
        observed = float(np.sum(ranks[d > 0]))  # W+: large when k tends to exceed r
        signs = (np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1
        null = signs @ ranks
        eps = 1e-9 * float(ranks.sum())
        return float(np.mean(null <= observed + eps)), float(np.mean(null >= observed - eps)), n
    less = stats.wilcoxon(d, alternative="less", method="approx").pvalue
    greater = stats.wilcoxon(d, alternative="greater", method="approx").pvalue
    return float(less), float(greater), n


def compare_schemes(rows: Sequence[dict[str, Any]], epoch: int, select_on: str = "validation",
                    cross_fit: bool = True) -> dict[str, Any]:
    """Does kGLM initialisation beat random at ``epoch``, each at its own best grid point?

    Compares the per-seed test MSEs of the two schemes, each at its best scale (lowest median on
    ``select_on``'s images, :func:`best_by_epoch`; with ``cross_fit``, the best scale of the other
    seeds' runs, those of seeds run under one scheme only included), *paired by seed*: seed ``s`` fixes the batch
    order and the training noise of both schemes (:func:`train_seeds`), and every model sees the
    same noisy test set, so the two runs of one seed are not independent and the seed, not the
    model, is the independent unit. The test is the one-sided Wilcoxon signed-rank test of the
    per-seed differences (alternative: kGLM's MSEs are smaller; failures count as +inf, see
    :func:`_signed_rank_p_values`). With few seeds the p-value is coarse (its smallest possible
    value is ``2^-n`` for ``n`` seeds).

    Where the grid point is chosen matters. ``select_on="validation"`` keeps the test images out
    of the choice, but the validation MSEs come from the same trained models as the test MSEs
    (they rank the seeds almost alike), so a choice made on all seeds still favours the seeds it
    is judged on. ``cross_fit=True`` removes that too, leaving one seed out at a time: each seed is
    judged at the grid point the *other* seeds choose, so no seed's own models take part in the
    choice it is judged at. The p-values then treat the seeds as independent given those choices,
    which holds only approximately, since every seed takes part in the other seeds' choices.

    Args:
        rows: per-seed rows of :func:`run_denoising_sweep` (keys ``scheme``, ``scale``, ``seed``,
            ``test_mse_curve``, and ``validation_mse_curve`` for ``"validation"``).
        epoch: the evaluation (0 = untrained).
        select_on: one of :data:`SELECT_ON` (:func:`best_by_epoch`).
        cross_fit: judge each seed at the choice of the other seeds (needs 2 common seeds);
            False judges every seed at the choice of all of them.

    Returns:
        ``epoch``; ``kglm_median``, ``random_median`` (of the per-seed test MSEs compared),
        ``ratio`` (random / kGLM medians), ``p_value``, ``p_value_reverse`` (the same test with
        the alternative "random's are smaller"), ``p_floor`` (the smallest attainable p-value,
        ``2^-n_seeds``), ``n_seeds`` (seeds compared), ``kglm_wins`` (fraction of those seeds where
        kGLM's MSE is the lower, ties counting one half); ``kglm_scale``, ``random_scale`` (the
        choice of all the seeds, :func:`best_by_epoch`); and per compared seed, in ``seeds``
        order: ``kglm_mse``, ``random_mse``, ``kglm_scale_per_seed``, ``random_scale_per_seed``
        (the grid point each seed was judged at); ``select_on`` and ``cross_fit`` as given.

    Raises:
        ValueError: ``epoch`` not evaluated for both schemes, no seed run under both (two for
            ``cross_fit``), no such seed with runs at the grid points it is judged at,
            ``cross_fit`` not a bool, or ``select_on`` as in :func:`best_by_epoch`.

    Example:
        Three seeds, one grid point per scheme (so every choice is the same), kGLM lower on
        every seed; the one-sided p-value is then the floor for three seeds, 1/8:

        >>> from deqlab.lab.experiments.kglm.denoising import compare_schemes
        >>> rows = [{"scheme": scheme, "scale": 1.0, "seed": seed, "norm": 1.0,
        ...          "test_mse_curve": [mse + 0.01 * seed], "validation_mse_curve": [mse]}
        ...         for scheme, mse in (("kglm", 0.2), ("random", 0.3)) for seed in range(3)]
        >>> c = compare_schemes(rows, epoch=0)
        >>> c["n_seeds"], c["kglm_wins"], c["p_value"], c["p_floor"], round(c["ratio"], 3)
        (3, 1.0, 0.125, 0.125, 1.476)
    """
    where = "denoising.compare_schemes"
    epoch = checks.integer(epoch, "epoch", where, minimum=0)
    if not isinstance(cross_fit, (bool, np.bool_)):
        raise checks.fail("cross_fit", "True or False", cross_fit, where)
    best = {r["scheme"]: r for r in best_by_epoch(rows, select_on) if r["epoch"] == epoch}
    if set(best) != set(SCHEMES):
        raise checks.fail("epoch", "an epoch evaluated for both schemes", epoch, where)
    common = sorted(set.intersection(*({r["seed"] for r in rows if r["scheme"] == scheme} for scheme in SCHEMES)))
    if len(common) < (2 if cross_fit else 1):
        raise checks.fail("rows", "runs of both schemes with at least "
                          + ("two common seeds (for cross_fit)" if cross_fit else "one common seed"),
                          f"{len(common)} common seed(s)", where)
    if cross_fit:  # each seed judged at the grid point the other seeds choose
        judged_at = {}
        for seed in common:
            others = [r for r in rows if r["seed"] != seed]
            judged_at[seed] = {b["scheme"]: b["scale"] for b in best_by_epoch(others, select_on) if b["epoch"] == epoch}
    else:
        judged_at = {s: {scheme: best[scheme]["scale"] for scheme in SCHEMES} for s in common}
    value = {(r["scheme"], r["scale"], r["seed"]): r["test_mse_curve"][epoch] for r in rows}
    # a seed without a run at the grid point it is judged at is left out
    seeds = [s for s in common if all((scheme, judged_at[s][scheme], s) in value for scheme in SCHEMES)]
    if not seeds:
        raise checks.fail("rows", "runs of both schemes with at least one common seed at the chosen grid points",
                          "no such seed", where)
    k = _finite_or_inf([value["kglm", judged_at[s]["kglm"], s] for s in seeds])
    r = _finite_or_inf([value["random", judged_at[s]["random"], s] for s in seeds])
    p_less, p_greater, _ = _signed_rank_p_values(k, r)
    wins = float(np.mean(k < r) + 0.5 * np.mean(k == r))
    return {"epoch": epoch, "kglm_median": float(np.median(k)), "random_median": float(np.median(r)),
            "ratio": float(np.median(r) / np.median(k)), "p_value": p_less, "p_value_reverse": p_greater,
            "p_floor": 2.0 ** -len(seeds), "n_seeds": len(seeds),
            "kglm_scale": best["kglm"]["scale"], "random_scale": best["random"]["scale"], "kglm_wins": wins,
            "seeds": seeds, "kglm_mse": k.tolist(), "random_mse": r.tolist(),
            "kglm_scale_per_seed": [judged_at[s]["kglm"] for s in seeds],
            "random_scale_per_seed": [judged_at[s]["random"] for s in seeds],
            "select_on": select_on, "cross_fit": bool(cross_fit)}
