"""Weight and spectral normalisation of a layer's kernel, in Flax NNX, to keep a DEQ cell contractive.

A DEQ ``z* = f(z*, x)`` stays easy to solve while the Jacobian ``J = df/dz`` at ``z*`` has spectral
radius below 1 (003 §3.1; chapter 3 of the book predicts ``rho(J)`` from the weights' scale, 001
Eq. 29-30). For ``f = phi(W z + b) + U x`` with ``|phi'| <= 1``, ``rho(J) <= ||J||_2 <= ||W||_2``,
so bounding the largest singular value of ``W`` bounds the radius for every input, throughout
training.

- :class:`SpectralNorm` (Miyato, Kataoka, Koyama & Yoshida 2018, "Spectral normalization for
  generative adversarial networks", Eq. 8 and Algorithm 1): the layer computes with
  ``target * W / sigma(W)``. ``sigma`` is estimated by power iteration whose vector ``u`` is
  carried in the module's state (:class:`PowerIterate`, advanced by :func:`update_estimates`, once
  per training step as in Miyato et al.), or computed exactly: by an SVD for a dense kernel, by
  the FFT of the filters for a convolution with circular padding
  (:func:`deqlab.theory.kglm.kernels.conv_spectral_norm`, Sedghi et al. 2018), and by the SVD of
  the convolution's dense matrix on the input shape for any other convolution (zero padding,
  strides: the FFT formula is not its norm, neither exactly nor as a bound).
- :class:`WeightNorm` (Salimans & Kingma 2016, "Weight normalization", Eq. 2): each output unit's
  weight vector is ``g v / ||v||`` with a learned gain ``g``; it decouples the norm from the
  direction but bounds ``||W||_2`` only through ``g`` (``||W||_2 <= ||g||_2``).

Both wrap an existing ``nnx.Linear`` or ``nnx.Conv`` (any module whose parameter ``kernel`` has
the output features on its last axis) and are called like it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from deqlab import checks

__all__ = ["PowerIterate", "SpectralNorm", "WeightNorm", "update_estimates", "MAX_DENSE_CONV_INPUT"]

MAX_DENSE_CONV_INPUT = 2048
"""The largest input (``h * w * in_features`` entries) of a convolution that is not circular, of
stride 1, whose exact norm :class:`SpectralNorm` computes from its dense matrix (an SVD per call)."""


class PowerIterate(nnx.Variable):
    """The power-iteration vector of a :class:`SpectralNorm`: state, not a parameter (no gradient).

    Example:
        >>> from flax import nnx
        >>> from deqlab.nn.normalization import PowerIterate, SpectralNorm
        >>> layer = SpectralNorm(nnx.Linear(3, 2, rngs=nnx.Rngs(0)), rngs=nnx.Rngs(1))
        >>> isinstance(layer.u, PowerIterate), layer.u[...].shape
        (True, (2,))
    """


def _value(variable: nnx.Variable) -> jax.Array:
    return variable[...]


def _normalise(v: jax.Array) -> jax.Array:
    return v / jnp.maximum(jnp.linalg.norm(v), jnp.finfo(v.dtype).tiny)


def _matrix(kernel: jax.Array) -> jax.Array:
    """The kernel as ``(fan_in, out)``: exact for a dense layer; for a convolution it is the
    matrix of one output pixel, whose norm is *not* the operator's (see :class:`SpectralNorm`)."""
    return kernel.reshape(-1, kernel.shape[-1])


def _with_kernel(layer: nnx.Module, kernel: jax.Array) -> nnx.Module:
    """A functional copy of ``layer`` computing with ``kernel`` (the layer itself is untouched)."""
    graphdef, state = nnx.split(layer)
    state["kernel"] = state["kernel"].replace(kernel)
    return nnx.merge(graphdef, state)


def _is_circular(layer: nnx.Module) -> bool:
    """Whether the FFT formula is the norm of ``layer`` (an ``nnx.Conv``): circular padding,
    stride and dilations 1, one feature group."""
    def ones(value):
        return value is None or all(int(v) == 1 for v in (value if isinstance(value, (tuple, list)) else (value,)))

    padding = getattr(layer, "padding", None)
    return (isinstance(padding, str) and padding.upper() == "CIRCULAR"
            and all(ones(getattr(layer, a, 1)) for a in ("strides", "input_dilation", "kernel_dilation"))
            and getattr(layer, "feature_group_count", 1) == 1)


def _check_layer(layer: Any, where: str) -> None:
    if not isinstance(layer, nnx.Module) or not isinstance(getattr(layer, "kernel", None), nnx.Param):
        raise checks.fail("layer", "an nnx.Module with a `kernel` parameter (nnx.Linear, nnx.Conv)",
                          type(layer).__name__, where)
    if _value(layer.kernel).ndim < 2:
        raise checks.fail("layer", "a layer whose kernel has ndim >= 2", _value(layer.kernel).shape, where)


class SpectralNorm(nnx.Module):
    """``layer`` with its kernel scaled to spectral norm ``target`` (Miyato et al. 2018, Eq. 8).

    The kernel used is ``target * W / sigma``. With ``exact=False`` (default), ``sigma = v^T W u``
    with ``u`` the carried :class:`PowerIterate` and ``v = W u / ||W u||`` (Algorithm 1 of Miyato
    et al.; ``u`` and ``v`` are constants for the gradient, so ``d sigma / dW = v u^T``, the
    derivative of the top singular value once ``u`` has converged). ``sigma`` then never exceeds
    the true norm, so ``target * W / sigma`` can overshoot ``target`` while ``u`` lags behind a
    changing ``W``; :func:`update_estimates` advances ``u`` (call it after each optimiser step).
    With ``exact=True``, ``sigma`` is the exact norm: an SVD (dense); for a 2-D convolution with
    ``padding="CIRCULAR"``, stride and dilation 1, the FFT formula of
    :func:`deqlab.theory.kglm.kernels.conv_spectral_norm` at ``input_shape``; for any other 2-D
    convolution (zero padding ``"SAME"``, ``"VALID"``, strides, dilations) the largest singular
    value of the layer's dense matrix on an input of ``input_shape`` (built with ``jax.jacfwd``,
    an SVD per call), for inputs of at most :data:`MAX_DENSE_CONV_INPUT` entries; a larger
    input is refused (use circular padding, whose FFT norm is exact). The circular (FFT) norm of a
    zero-padded convolution is not its norm: it can leave the operator norm above ``target``.
    The norm is that of inputs of ``input_shape``: call the layer on images of that size.

    Args:
        layer: an ``nnx.Linear`` (kernel ``(in, out)``) or ``nnx.Conv`` (kernel ``(kh, kw, in,
            out)``, with ``exact=True`` and ``input_shape``).
        target: the spectral norm of the kernel used, > 0 (below 1 makes ``tanh(W z + b) + U x``
            a contraction).
        exact: exact ``sigma`` instead of the power iteration.
        input_shape: ``(h, w)`` of the images, for a convolution.
        power_steps: power-iteration steps done at construction (so that ``u`` starts converged),
            >= 1 (with none, ``u`` is a random vector and ``sigma`` can be far below the norm).
        rngs: ``nnx.Rngs`` for ``u``'s random start.

    Attributes:
        layer: the wrapped layer (its own kernel is never changed).
        target: the spectral norm of the kernel used.
        exact: whether ``sigma`` is exact.
        u: the :class:`PowerIterate` (right singular vector estimate).

    Raises:
        ValueError: ``layer`` has no 2-D or 4-D ``kernel`` parameter, ``rngs`` is not an
            ``nnx.Rngs``, ``target`` is not > 0, ``exact`` is not a bool (or False for a
            convolution), ``input_shape`` is missing for a convolution, a non-circular
            convolution's input exceeds :data:`MAX_DENSE_CONV_INPUT`, or ``power_steps < 1``.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab.nn.normalization import SpectralNorm
        >>> layer = SpectralNorm(nnx.Linear(4, 4, rngs=nnx.Rngs(0)), target=0.9, exact=True, rngs=nnx.Rngs(1))
        >>> round(float(jnp.linalg.norm(layer.kernel(), 2)), 4)
        0.9
        >>> layer(jnp.ones((2, 4))).shape
        (2, 4)
    """

    def __init__(self, layer: nnx.Module, *, rngs: nnx.Rngs, target: float = 1.0, exact: bool = False,
                 input_shape: Any = None, power_steps: int = 20):
        where = "nn.SpectralNorm"
        _check_layer(layer, where)
        if not isinstance(rngs, nnx.Rngs):
            raise checks.fail("rngs", "an nnx.Rngs such as nnx.Rngs(0)", rngs, where)
        self.layer = layer
        self.target = checks.positive_number(target, "target", where)
        if not isinstance(exact, bool):
            raise checks.fail("exact", "True or False", exact, where)
        kernel = _value(layer.kernel)
        self.convolutional = kernel.ndim == 4
        if self.convolutional:
            if not exact:
                raise checks.fail("exact", "True for a convolution (its power iteration would need the "
                                  "convolution operator; the FFT formula is exact)", exact, where)
            if input_shape is None or not hasattr(input_shape, "__len__") or len(tuple(input_shape)) != 2:
                raise checks.fail("input_shape", "(h, w) of the convolution's input", input_shape, where)
            self.input_shape = tuple(checks.positive_int(s, "input_shape", where) for s in input_shape)
            self.circular = _is_circular(layer)
            size = self.input_shape[0] * self.input_shape[1] * kernel.shape[-2] * getattr(layer, "feature_group_count", 1)
            if not self.circular and size > MAX_DENSE_CONV_INPUT:
                raise checks.fail(
                    "layer", f"a convolution with padding='CIRCULAR' and stride 1 (its FFT norm is exact) for an "
                    f"input of {size} > MAX_DENSE_CONV_INPUT = {MAX_DENSE_CONV_INPUT} entries; the exact norm "
                    "of a zero-padded or strided convolution needs its dense matrix",
                    f"padding={getattr(layer, 'padding', None)!r}, input_shape={self.input_shape}", where)
        elif kernel.ndim != 2:
            raise checks.fail("layer", "a dense (2-D kernel) or 2-D convolutional (4-D kernel) layer",
                              kernel.shape, where)
        self.exact = exact
        power_steps = checks.integer(power_steps, "power_steps", where, minimum=1)
        u = _normalise(jax.random.normal(rngs.params(), (kernel.shape[-1],), kernel.dtype))
        self.u = PowerIterate(u)
        if not exact:
            self.update(power_steps)

    def sigma(self) -> jax.Array:
        """The normaliser of the kernel (see the class docstring).

        Returns:
            A scalar: the power-iteration estimate ``v^T W u``, or the exact norm when ``exact``.
        """
        kernel = _value(self.layer.kernel)
        if self.convolutional and self.circular:
            from deqlab.theory.kglm.kernels import conv_spectral_norm

            # flax's (kh, kw, in, out) to the (out, in, kh, kw) of conv_spectral_norm
            return conv_spectral_norm(jnp.transpose(kernel, (3, 2, 0, 1)), self.input_shape)
        if self.convolutional:
            # the layer is affine in its input: its Jacobian at 0 is the convolution's matrix
            apply = _with_kernel(self.layer, kernel)
            x = jnp.zeros((1, *self.input_shape, self.layer.in_features), kernel.dtype)
            matrix = jax.jacfwd(apply)(x)
            return jnp.linalg.norm(matrix.reshape(-1, x.size), 2)
        if self.exact:
            return jnp.linalg.norm(kernel, 2)
        u = jax.lax.stop_gradient(_value(self.u))
        v = jax.lax.stop_gradient(_normalise(kernel @ u))
        return v @ kernel @ u

    def update(self, steps: int = 1) -> None:
        """Advance the power iteration ``u <- W^T W u / ||W^T W u||`` (not differentiated).

        A no-op when ``exact``.

        Args:
            steps: number of steps, an integer >= 0.

        Raises:
            ValueError: ``steps`` is not an integer >= 0.
        """
        steps = checks.integer(steps, "steps", "nn.SpectralNorm.update", minimum=0)
        if self.exact or steps == 0:
            return
        kernel = jax.lax.stop_gradient(_value(self.layer.kernel))

        def step(u, _):
            return _normalise(kernel.T @ (kernel @ u)), None

        u, _ = jax.lax.scan(step, _value(self.u), None, length=steps)
        self.u[...] = u

    def kernel(self) -> jax.Array:
        """The kernel the layer computes with, ``target * W / sigma`` (a zero kernel stays zero).

        Returns:
            An array of the wrapped kernel's shape.
        """
        kernel = _value(self.layer.kernel)
        return self.target * kernel / jnp.maximum(self.sigma(), jnp.finfo(kernel.dtype).tiny)

    def __call__(self, x: jax.Array) -> jax.Array:
        """The wrapped layer applied with :meth:`kernel`.

        Args:
            x: the layer's input.

        Returns:
            The layer's output.
        """
        return _with_kernel(self.layer, self.kernel())(x)


class WeightNorm(nnx.Module):
    """``layer`` with each output unit's weights ``g_j v_j / ||v_j||`` (Salimans & Kingma 2016, Eq. 2).

    ``v`` is the layer's kernel (norms over every axis but the last, the output features) and
    ``g`` a learned gain, initialised to the kernel's norms so that the wrapped layer starts as
    the original. ``||W||_2 <= ||g||_2`` (each column has norm ``|g_j|``).

    Args:
        layer: an ``nnx.Linear`` or ``nnx.Conv``.

    Attributes:
        layer: the wrapped layer (its kernel is ``v``).
        gain: the learned gains ``g``, one per output unit.

    Raises:
        ValueError: ``layer`` is not an ``nnx.Module`` with a ``kernel`` parameter of ndim >= 2.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab.nn.normalization import WeightNorm
        >>> dense = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
        >>> layer = WeightNorm(dense)
        >>> bool(jnp.allclose(layer(jnp.ones((1, 3))), dense(jnp.ones((1, 3)))))  # starts as the layer
        True
    """

    def __init__(self, layer: nnx.Module):
        _check_layer(layer, "nn.WeightNorm")
        self.layer = layer
        self.gain = nnx.Param(self._norms(_value(layer.kernel)))

    @staticmethod
    def _norms(kernel):
        return jnp.sqrt(jnp.sum(kernel**2, axis=tuple(range(kernel.ndim - 1))))

    def kernel(self) -> jax.Array:
        """The kernel the layer computes with, ``g_j v_j / ||v_j||`` per output unit ``j``.

        Returns:
            An array of the wrapped kernel's shape.
        """
        v = _value(self.layer.kernel)
        return v * (_value(self.gain) / jnp.maximum(self._norms(v), jnp.finfo(v.dtype).tiny))

    def __call__(self, x: jax.Array) -> jax.Array:
        """The wrapped layer applied with :meth:`kernel`.

        Args:
            x: the layer's input.

        Returns:
            The layer's output.
        """
        return _with_kernel(self.layer, self.kernel())(x)


def update_estimates(model: nnx.Module, steps: int = 1) -> None:
    """Advance the power iteration of every :class:`SpectralNorm` in ``model`` by ``steps``.

    Call it after each optimiser step (Miyato et al. 2018 advance ``u`` once per step).

    Args:
        model: an ``nnx.Module`` (searched recursively).
        steps: power-iteration steps, an integer >= 0.

    Raises:
        ValueError: ``steps`` is not an integer >= 0.

    Example:
        >>> from flax import nnx
        >>> from deqlab.nn.normalization import SpectralNorm, update_estimates
        >>> layer = SpectralNorm(nnx.Linear(3, 3, rngs=nnx.Rngs(0)), rngs=nnx.Rngs(1))
        >>> update_estimates(layer, steps=2)
        >>> float(layer.sigma()) > 0
        True
    """
    steps = checks.integer(steps, "steps", "nn.update_estimates", minimum=0)
    for _, node in nnx.iter_graph(model):
        if isinstance(node, SpectralNorm):
            node.update(steps)
