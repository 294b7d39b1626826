"""The feed-forward block of the DEQ-Transformer at initialisation: theory and measurement.

001 §4.2 initialises the dense layers of a DEQ-Transformer from the Gaussian, orthogonal and GOE
ensembles ("they have the same structure as the theoretical calculations"), at ``sqrt(V)`` in
``{0.1, 0.3, 1.0}`` with a feed-forward ``700 -> 2800 -> 700`` (GOE: ``700 -> 700 -> 700``, App. D).
:class:`deqlab.nn.TransformerCell` draws ``W1`` (width x hidden) and ``W2`` (hidden x width) as
``scale * W0`` with :func:`deqlab.ensembles.initializer`, ``scale = sqrt(V)``; its feed-forward
residual block is ``phi(a) = a + relu(a W1) W2`` on the LayerNorm output ``a`` (``|a|^2 = width``;
row vectors, as everywhere in this module).

This module predicts, for ``(ensemble, scale, width, hidden)``:

- :func:`predict`: the variance of the hidden pre-activations ``a W1``, of the block's output
  ``relu(a W1) W2``, the mean squared singular value (``gain``) of the product map ``M = W1 W2`` and
  the large-width spectral radius of ``M`` and of the block's Jacobian ``W1 D W2``,
  ``D = diag(relu'(a W1))``. The radii follow from the Haagerup-Larsen theorem: ``M`` is
  bi-orthogonally invariant in law for Gaussian and orthogonal weights (an R-diagonal element in
  the limit), and for GOE a product of two free even elements, also R-diagonal (Nica & Speicher
  2006, Lecture 15); the support of an R-diagonal element's eigenvalue law has outer radius
  ``sqrt(tr(M^T M))``.
- :func:`product_spectrum`: the limiting law of the squared singular values of ``M`` by free
  multiplicative convolution, ``S_{M^T M} = S_A S_B`` (002 Eq. 12), with
  ``A = W1^T W1``, ``B = W2 W2^T`` the ``hidden x hidden`` Gram matrices: free Poisson laws for
  Gaussian weights, projections (Bernoulli laws) for semi-orthogonal ones, Marchenko-Pastur laws
  (squared semicircles) for GOE.
- :func:`measure`: the same quantities on sampled matrices, and :func:`cell_at_init`: the spectral
  radius of a whole :class:`deqlab.nn.TransformerCell` at its equilibrium, next to that of its
  feed-forward Jacobian, where the linear theory stops: attention, LayerNorm and the residuals are
  outside it.

Conventions: row vectors as in Flax (``y = a @ K``); a kernel of shape ``(fan_in, fan_out)``; the
input ``a`` of the block has ``|a|^2 = width``; traces are normalised by ``width`` (``tr I = 1``).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from deqlab import checks, ensembles, stability
from deqlab.solvers import get_solver, solve
from deqlab.theory import freeprob as fp
from deqlab.theory.freeprob.transforms import Spectrum, complex_argument, sqrt_with_cut

__all__ = ["STUDY_ENSEMBLES", "FeedForwardInit", "FreePoisson", "feedforward_shape", "predict",
           "product_spectrum", "measure", "causal_diagonal_blocks", "block_radius", "cell_at_init"]

STUDY_ENSEMBLES: tuple[str, ...] = ("gaussian", "orthogonal", "goe")
"""The three families of 001 §4.3 (the theory here covers these)."""

_SQUARE = ("goe", "antisymmetric")


def _ensemble(name: Any, where: str) -> str:
    return checks.choice(name, "ensemble", STUDY_ENSEMBLES, where)


def feedforward_shape(ensemble: str, width: int, hidden: int | None = None) -> tuple[int, int]:
    """``(width, hidden)`` of the feed-forward as :class:`deqlab.nn.TransformerCell` builds it.

    ``hidden`` defaults to ``4 * width`` (001 App. D: 700 -> 2800) and to ``width`` for GOE, whose
    matrices exist only square (001 App. D keeps 700 throughout); a GOE ``hidden != width`` is
    refused.

    Args:
        ensemble: one of :data:`STUDY_ENSEMBLES`.
        width: the model width, an integer >= 1.
        hidden: the feed-forward width, an integer >= 1, or None for the default.

    Returns:
        ``(width, hidden)``.

    Raises:
        ValueError: an unknown ensemble, a size that is not an integer >= 1, or a GOE ``hidden``
            that differs from ``width``.

    Example:
        >>> from deqlab.lab.experiments.sequence.initialisation import feedforward_shape
        >>> feedforward_shape("gaussian", 700), feedforward_shape("goe", 700)
        ((700, 2800), (700, 700))
    """
    where = "initialisation.feedforward_shape"
    ensemble = _ensemble(ensemble, where)
    width = checks.positive_int(width, "width", where)
    square = ensemble in _SQUARE
    hidden = (width if square else 4 * width) if hidden is None else checks.positive_int(hidden, "hidden", where)
    if square and hidden != width:
        raise checks.fail("hidden", f"equal to width ({width}) for the square {ensemble!r} ensemble (001 App. D)",
                          hidden, where)
    return width, hidden


class FeedForwardInit(NamedTuple):
    """Predicted statistics of the feed-forward block ``a -> relu(a W1) W2`` at initialisation.

    Attributes:
        hidden_variance: ``E[(a W1)_j^2]`` averaged over the hidden units, for ``|a|^2 = width``
            (exact at every size).
        output_variance: ``E[(relu(a W1) W2)_i^2]`` averaged over the outputs (exact at every size:
            ``a W1`` is symmetric in law, so ``E relu(h)^2 = E h^2 / 2``, and ``W2`` is independent).
        gain: ``E tr(M^T M)`` of the linear product ``M = W1 W2`` (width-normalised; exact).
        radius: large-width spectral radius of ``M``, ``sqrt(gain)`` (Haagerup-Larsen).
        relu_gain: ``tr(J^T J)`` of the block's Jacobian ``J = W1 D W2`` in the large-width limit
            (``D`` free, half its entries 1); equals ``output_variance`` there.
        relu_radius: large-width spectral radius of ``J``, ``sqrt(relu_gain)``.
        critical_scale: :func:`deqlab.ensembles.critical_scale` of the ensemble: where a *square*
            linear DEQ ``z = W z + x`` of this family stops converging (001 §2.1.2).
    """

    hidden_variance: float
    output_variance: float
    gain: float
    radius: float
    relu_gain: float
    relu_radius: float
    critical_scale: float


def _scale(scale: Any, where: str) -> float:
    return checks.number(scale, "scale", where, lower=0.0)


def predict(ensemble: str, scale: float, width: int, hidden: int | None = None) -> FeedForwardInit:
    """Predicted initialisation statistics of the feed-forward block (module docstring).

    With ``V = scale**2``, ``r = min(width, hidden) / max(width, hidden)``:

    - Gaussian (entries ``N(0, V / fan_in)``): hidden variance ``V``, gain ``V^2``;
    - orthogonal (``sqrt(V)`` times Haar semi-orthogonal): hidden variance ``V min(1, width/hidden)``,
      gain ``V^2 r``: a semi-orthogonal expansion keeps ``|a|`` and spreads it over ``hidden``
      units, the contraction projects onto ``width`` of ``hidden`` directions;
    - GOE (square; off-diagonal variance ``V/n``, diagonal ``2V/n``, 001 §2.1.2): hidden variance
      ``V (1 + 1/n)``, gain ``V^2 (1 + 1/n)^2``.

    The output variance and the ReLU gain are ``1/2`` of ``gain`` (with the finite-size factors of
    the hidden variance), the radii the square roots of the gains (large width).

    Args:
        ensemble: one of :data:`STUDY_ENSEMBLES`.
        scale: ``sqrt(V) >= 0``, the ``scale`` of :class:`deqlab.nn.TransformerCell`.
        width, hidden: the feed-forward's sizes (:func:`feedforward_shape`).

    Returns:
        A :class:`FeedForwardInit`.

    Raises:
        ValueError: an unknown ensemble, a negative ``scale``, or sizes refused by
            :func:`feedforward_shape`.

    Example:
        >>> from deqlab.lab.experiments.sequence.initialisation import predict
        >>> p = predict("orthogonal", 0.5, 700)  # 700 -> 2800: a quarter of the Gaussian gain
        >>> p.gain, p.radius
        (0.015625, 0.125)
    """
    where = "initialisation.predict"
    width, hidden = feedforward_shape(_ensemble(ensemble, where), width, hidden)
    V = _scale(scale, where) ** 2
    if ensemble == "gaussian":
        q, out, gain = V, V * V / 2, V * V
    elif ensemble == "orthogonal":
        ratio = min(width, hidden) / max(width, hidden)
        q = V * min(1.0, width / hidden)
        gain = V * V * ratio
        out = gain / 2
    else:  # goe
        f = 1.0 + 1.0 / width
        q, out, gain = V * f, V * V * f * f / 2, V * V * f * f
    relu_gain = gain / 2
    return FeedForwardInit(hidden_variance=q, output_variance=out, gain=gain, radius=math.sqrt(gain),
                           relu_gain=relu_gain, relu_radius=math.sqrt(relu_gain),
                           critical_scale=ensembles.critical_scale(ensemble))


class FreePoisson(Spectrum):
    """Free Poisson (Marchenko-Pastur) law with rate ``lam`` and jump size ``alpha``.

    The limit of ``(alpha / n) G^T G`` for ``G`` a ``(lam n) x n`` standard Gaussian matrix, in the
    ``n``-normalised trace: an atom ``1 - lam`` at 0 when ``lam < 1``, and a continuous part on
    ``[alpha (1 - sqrt(lam))^2, alpha (1 + sqrt(lam))^2]``. ``S(w) = 1 / (alpha (w + lam))``
    (Nica & Speicher 2006, Lecture 18); ``FreePoisson(1, V)`` is
    :class:`~deqlab.theory.freeprob.spectra.MarchenkoPastur` ``(V)``.
    """

    def __init__(self, lam: float, alpha: float = 1.0):
        where = self._where("__init__")
        self.lam = checks.positive_number(lam, "lam", where)
        self.alpha = checks.positive_number(alpha, "alpha", where)
        self.lower = self.alpha * (1 - math.sqrt(self.lam)) ** 2
        self.upper = self.alpha * (1 + math.sqrt(self.lam)) ** 2
        self.atoms = ((0.0, 1.0 - self.lam),) if self.lam < 1 else ()

    def stieltjes(self, z):
        z = complex_argument(z, self._where("stieltjes"), support=(0.0, self.upper))
        a, lam = self.alpha, self.lam
        # the root ~ 1/z at infinity; at z -> 0 it has residue 1 - lam (the atom), since
        # sqrt_with_cut(0, lower, upper) = -alpha |1 - lam|
        return (z + a * (1 - lam) - sqrt_with_cut(z, self.lower, self.upper)) / (2 * a * z)

    def s_transform(self, w):
        w = np.asarray(w, dtype=np.complex128)
        return 1.0 / (self.alpha * (w + self.lam))

    def moment(self, k: int) -> float:
        if k == 1:
            return self.lam * self.alpha
        if k == 2:
            return self.alpha**2 * self.lam * (1 + self.lam)
        raise NotImplementedError("FreePoisson.moment: only k <= 2")


class _Compressed(Spectrum):
    """``V2 X`` seen in the ``width``-normalised trace, for ``X`` given in the ``hidden`` one.

    With ``c = width / hidden <= 1`` the ``hidden x hidden`` law is ``(1 - c) delta_0 + c mu``
    (``M^T M`` has ``width`` eigenvalues, the Gram product ``hidden``: the same non-zero ones).
    """

    def __init__(self, inner: Spectrum, c: float, V2: float):
        self.inner, self.c, self.V2 = inner, c, V2

    def stieltjes(self, z):
        z = np.asarray(z, dtype=np.complex128)
        g = self.inner.stieltjes(z / self.V2) / self.V2
        return (g - (1 - self.c) / z) / self.c

    def moment(self, k: int) -> float:
        return self.inner.moment(k) * self.V2**k / self.c


def product_spectrum(ensemble: str, scale: float, width: int, hidden: int | None = None) -> Spectrum:
    """Large-width law of the squared singular values of the product map ``M = W1 W2``.

    In the ``width``-normalised trace. The non-zero eigenvalues of ``M^T M`` are those of the
    ``hidden x hidden`` product ``A B`` (``A = W1^T W1``, ``B = W2 W2^T``), whose factors are free,
    so ``S_AB = S_A S_B`` (002 Eq. 12), evaluated by
    :class:`~deqlab.theory.freeprob.products.FreeProduct`.
    With ``c = width / hidden``:

    - Gaussian: ``A`` free Poisson (rate ``c``, jump ``1/c``), ``B`` free Poisson (rate ``c``);
    - orthogonal: ``A`` and ``B`` projections of rank ``width`` (Bernoulli ``c``); square: every
      singular value is ``V`` exactly;
    - GOE (``c = 1``): ``A`` and ``B`` squares of semicircles, Marchenko-Pastur laws, so that the
      law is the square Gaussian one (Fuss-Catalan).

    The ReLU between the layers is not included (a third factor ``D`` makes the root following of
    nested products slow and fragile on the real axis); :func:`predict` gives its mean-field gain.

    Args:
        ensemble: one of :data:`STUDY_ENSEMBLES`.
        scale: ``sqrt(V) > 0``.
        width, hidden: the feed-forward's sizes (:func:`feedforward_shape`), ``width <= hidden``.

    Returns:
        A :class:`~deqlab.theory.freeprob.transforms.Spectrum` (``stieltjes``, ``density``,
        ``moment``).

    Raises:
        ValueError: an unknown ensemble, ``scale <= 0``, ``hidden < width``, or sizes refused by
            :func:`feedforward_shape`.

    Example:
        >>> from deqlab.lab.experiments.sequence.initialisation import product_spectrum
        >>> round(float(product_spectrum("gaussian", 1.0, 8).moment(1)), 6)  # the gain, V^2
        1.0
    """
    where = "initialisation.product_spectrum"
    width, hidden = feedforward_shape(_ensemble(ensemble, where), width, hidden)
    if hidden < width:
        raise checks.fail("hidden", f">= width ({width}) (an expanding feed-forward)", hidden, where)
    V2 = _scale(scale, where) ** 4  # M = scale^2 W0_1 W0_2: its squared singular values scale as V^2
    if V2 == 0:
        raise checks.fail("scale", "> 0 (at scale 0 the law is a point mass at 0)", scale, where)
    c = width / hidden
    if ensemble == "orthogonal" and c == 1.0:  # V O1 O2 is V times an orthogonal matrix
        return fp.ScaledIdentity(V2)
    if ensemble == "gaussian":
        a, b = FreePoisson(c, 1.0 / c), FreePoisson(c, 1.0)
    elif ensemble == "orthogonal":
        a, b = fp.Bernoulli(c), fp.Bernoulli(c)
    else:
        a, b = fp.MarchenkoPastur(1.0), fp.MarchenkoPastur(1.0)
    return _Compressed(fp.FreeProduct(a, b), c, V2)


def _sample_block(ensemble, scale, width, hidden, key):
    init = ensembles.initializer(ensemble, scale)
    k1, k2, k3 = jax.random.split(key, 3)
    w1 = np.asarray(init(k1, (width, hidden), jnp.float64), dtype=np.float64)
    w2 = np.asarray(init(k2, (hidden, width), jnp.float64), dtype=np.float64)
    a = np.asarray(jax.random.normal(k3, (width,), jnp.float64), dtype=np.float64)
    return w1, w2, a * math.sqrt(width) / np.linalg.norm(a)


def measure(ensemble: str, scale: float, width: int, hidden: int | None = None, *, key: jax.Array,
            samples: int = 4, singular_values: bool = False) -> dict[str, np.ndarray]:
    """The quantities of :func:`predict`, measured on ``samples`` independent draws of ``W1, W2``.

    Each draw uses the initializer of :class:`deqlab.nn.TransformerCell` (float64) and a random
    input ``a`` with ``|a|^2 = width``; ``D = diag(relu'(a W1))``.

    Returns:
        ``{"hidden_variance", "output_variance", "gain", "radius", "relu_gain", "relu_radius"}``,
        each of shape ``(samples,)`` (the radii from all eigenvalues of the ``width x width`` maps),
        plus ``"eigenvalues"`` ``(samples, width)`` of ``M`` and, with ``singular_values``,
        ``"squared_singular_values"`` ``(samples, width)`` of ``M``.

    Raises:
        ValueError: an unknown ensemble, a negative ``scale``, sizes refused by
            :func:`feedforward_shape`, ``samples < 1`` or a ``key`` that is not a PRNG key.

    Example:
        ``measure("goe", 1.0, 64, key=jax.random.key(0), samples=4)["radius"]``: four radii near 1
        (run with ``jax_enable_x64`` for float64 draws).
    """
    where = "initialisation.measure"
    ensemble = _ensemble(ensemble, where)
    width, hidden = feedforward_shape(ensemble, width, hidden)
    scale = _scale(scale, where)
    samples = checks.positive_int(samples, "samples", where)
    key = checks.prng_key(key, "key", where)
    names = ("hidden_variance", "output_variance", "gain", "radius", "relu_gain", "relu_radius")
    out: dict[str, list] = {k: [] for k in names + ("eigenvalues",)}
    if singular_values:
        out["squared_singular_values"] = []
    for k in jax.random.split(key, samples):
        w1, w2, a = _sample_block(ensemble, scale, width, hidden, k)
        h = a @ w1
        m = w1 @ w2
        j = (w1 * (h > 0)) @ w2  # a W1 D W2: the Jacobian of a -> relu(a W1) W2
        eig = np.linalg.eigvals(m)
        out["hidden_variance"].append(np.mean(h**2))
        out["output_variance"].append(np.mean((np.maximum(h, 0) @ w2) ** 2))
        out["gain"].append(np.sum(m**2) / width)
        out["radius"].append(np.max(np.abs(eig)))
        out["relu_gain"].append(np.sum(j**2) / width)
        out["relu_radius"].append(np.max(np.abs(np.linalg.eigvals(j))))
        out["eigenvalues"].append(eig)
        if singular_values:
            out["squared_singular_values"].append(np.linalg.svd(m, compute_uv=False) ** 2)
    return {k: np.asarray(v) for k, v in out.items()}


def causal_diagonal_blocks(f: Callable[[jax.Array, jax.Array], jax.Array], z: jax.Array,
                           x: jax.Array) -> jax.Array:
    """The diagonal blocks ``d f_t / d z_t`` of a causal sequence map's Jacobian, per sequence.

    For a map ``f(z, x)`` on sequences (``z`` of shape ``(batch, length, width)``) whose output at
    position ``t`` does not depend on ``z_s`` for ``s > t`` (a causal transformer cell), the
    Jacobian of one sequence is block lower triangular over positions, so its eigenvalues are those
    of the ``length`` diagonal blocks: :func:`block_radius` of the result is the exact spectral
    radius. The blocks are laid out output by input, ``blocks[b, t, i, j] = d f(z, x)[b, t, i] / d z[b, t, j]``
    (the transpose of the row-vector block of ``df = dz J``, with the same eigenvalues), formed with ``jax.jacfwd`` (``length * width`` JVPs per sequence) for a general map, and with
    ``width`` JVPs per sequence when ``f`` is a :class:`deqlab.nn.TransformerCell` itself (each
    position's own key and value left free, the others held:
    :func:`deqlab.lab.experiments.sequence.language_model.diagonal_blocks`, the same blocks to
    float32 rounding, ``length`` times fewer JVPs). Traceable (``jit``, ``vmap``); the causality
    of a general map is not checked here (``tests/lab/test_sequence_tasks.py`` compares both paths
    with the dense Jacobian's blocks, ``tests/lab/test_sequence_initialisation.py`` the radii of
    :func:`cell_at_init` with the full Jacobian's eigenvalues).

    Args:
        f: the map, called on one sequence as ``f(z[None], x[None])[0]``, returning an array of the
            shape of ``z[None]``; or a :class:`deqlab.nn.TransformerCell`, called as ``f(z, x)``
            (without dropout masks).
        z: the point, ``(batch, length, width)``.
        x: the input, ``(batch, length, in_features)``.

    Returns:
        ``(batch, length, width, width)``.

    Raises:
        ValueError: ``z`` or ``x`` is not 3-D, or their batch or length differ.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.lab.experiments.sequence.initialisation import causal_diagonal_blocks, block_radius
        >>> f = lambda z, x: 0.5 * z + jnp.cumsum(z, axis=-2) * 0.1 + x  # causal: a prefix sum
        >>> blocks = causal_diagonal_blocks(f, jnp.zeros((1, 3, 2)), jnp.zeros((1, 3, 2)))
        >>> blocks.shape, round(float(block_radius(blocks)[0]), 6)
        ((1, 3, 2, 2), 0.6)
    """
    where = "initialisation.causal_diagonal_blocks"
    if jnp.ndim(z) != 3 or jnp.ndim(x) != 3 or jnp.shape(z)[:2] != jnp.shape(x)[:2]:
        raise checks.fail("z", "an array (batch, length, width) with x's (batch, length)",
                          (jnp.shape(z), jnp.shape(x)), where)
    from deqlab.nn import TransformerCell

    if isinstance(f, TransformerCell):
        from deqlab.lab.experiments.sequence.language_model import _blocks

        return _blocks(f, z, x)[1]
    length = z.shape[-2]

    def one(z1, x1):
        jac = jax.jacfwd(lambda zz: f(zz[None], x1[None])[0])(z1)  # (length, width, length, width)
        t = jnp.arange(length)
        return jac[t, :, t, :]

    return jax.vmap(one)(z, x)


def block_radius(blocks: Any) -> np.ndarray:
    """The largest eigenvalue modulus over the diagonal blocks, per sequence (on the host, float64).

    Args:
        blocks: :func:`causal_diagonal_blocks`' output, ``(..., length, width, width)``, finite.

    Returns:
        ``(...)``: for each sequence, ``max_t max |eig(blocks[..., t, :, :])|``, the exact spectral
        radius of a block-triangular Jacobian.

    Raises:
        ValueError: ``blocks`` has fewer than 3 dimensions, non-square blocks or non-finite entries.

    Example:
        >>> import numpy as np
        >>> from deqlab.lab.experiments.sequence.initialisation import block_radius
        >>> blocks = np.array([[[[0.0, 2.0], [-2.0, 0.0]], [[0.5, 0.0], [0.0, 0.1]]]])  # eigenvalues +-2i; 0.5, 0.1
        >>> np.round(block_radius(blocks), 6).tolist()
        [2.0]
    """
    where = "initialisation.block_radius"
    b = np.asarray(blocks, dtype=np.float64)
    if b.ndim < 3 or b.shape[-1] != b.shape[-2]:
        raise checks.fail("blocks", "an array (..., length, width, width)", np.shape(blocks), where)
    if not np.all(np.isfinite(b)):
        raise checks.fail("blocks", "finite entries", "a non-finite entry", where)
    return np.abs(np.linalg.eigvals(b)).max(axis=(-2, -1))


@functools.lru_cache(maxsize=8)
def _cell_program(graphdef: Any, config: Any, steps: int | None, seed: int) -> Callable[..., Any]:
    """The compiled measurement of :func:`cell_at_init` for cells of one structure (``graphdef``),
    vmapped over a leading axis of stacked parameter states; cached, so that ensembles of the same
    shapes (Gaussian and orthogonal) and repeated calls share one compilation."""

    def one(state, x):
        def f(z, x):
            return nnx.merge(graphdef, state)(z, x)

        cell = nnx.merge(graphdef, state)
        width = cell.width
        z0 = jnp.zeros(x.shape[:-1] + (width,), x.dtype)
        result = solve(f, z0, x, solver=config, batch_axis=0, on_failure="ignore")
        z = result.value
        a, pre = cell.feed_forward_hidden(z, x)
        w1, w2 = cell.expand.kernel[...], cell.contract.kernel[...]
        out = {"converged": result.converged, "residual": result.stats.best_residual,
               "residual_trace": result.stats.residual_trace.T, "solver_steps": result.stats.steps,
               "hidden_variance": jnp.mean(pre**2, axis=(-2, -1))}
        if steps is None:
            out["cell_blocks"] = causal_diagonal_blocks(cell, z, x)  # d f_t / d z_t, (batch, length, width, width)
            # row vectors: the block at position t maps da to da W1 D_t W2
            out["ff_blocks"] = jnp.einsum("ih,bth,hj->btij", w1, (pre > 0).astype(w1.dtype), w2)
        else:
            bias = cell.contract.bias[...]

            def ff(a):
                return cell.contract(jax.nn.relu(cell.expand(a))) - bias

            out["cell_radius"] = stability.spectral_radius(f, z, x, key=jax.random.key(seed + 1), steps=steps,
                                                           batch_axis=0)
            out["ff_radius"] = stability.spectral_radius(ff, a, key=jax.random.key(seed + 2), steps=steps,
                                                         batch_axis=0)
        return out

    return jax.jit(jax.vmap(one, in_axes=(0, None)))


def cell_at_init(ensemble: str, scales: Sequence[float], x: jax.Array, *, width: int,
                 hidden: int | None = None, heads: int = 4, attention_scale: float | None = None,
                 seed: int = 0, draws: int = 1, solver: Any = "broyden", tol: float = 1e-5,
                 max_steps: int = 500, steps: int | None = None) -> dict[str, np.ndarray]:
    """A :class:`deqlab.nn.TransformerCell` at initialisation, at its equilibrium, per ``scale``.

    For each ``scale`` and each of ``draws`` parameter draws (seeds ``seed, seed + 1, ...``; the
    same seeds at every scale, so that draw ``k`` has the same attention weights at every scale:
    they are drawn first from the same stream), a cell is built, its equilibrium ``z*`` sought by
    :func:`deqlab.solvers.solve` (Broyden's method by default, relative tolerance ``tol``, at most
    ``max_steps`` steps) for every sequence of ``x``, and two Jacobians measured at the point the
    solve returned:

    - ``"cell_radius"``: the spectral radius of the whole cell ``z -> f(z, x)``, the quantity that
      decides whether the plain iteration converges (001 §2.1);
    - ``"ff_radius"``: that of the feed-forward map ``a -> relu(a W1) W2`` at the feed-forward's
      input ``a = LN(z + Attention(...))`` (:meth:`~deqlab.nn.TransformerCell.feed_forward_hidden`),
      the quantity :func:`predict` calls ``relu_radius``.

    With ``steps=None`` both are exact: the cell is causal, so its Jacobian is block lower
    triangular over positions (output t does not depend on z_s, s > t) and its eigenvalues are
    those of the diagonal blocks ``d f_t / d z_t`` (formed by the cell's diagonal path,
    :func:`causal_diagonal_blocks` given the cell: ``width`` JVPs per sequence); the feed-forward
    acts position by position, with blocks ``W1 D_t W2``. This costs ``width`` JVPs and
    ``length * width**2`` numbers per sequence, and the blocks' eigenvalues: for large widths pass
    ``steps``, and both radii are estimated by power iteration
    (:func:`deqlab.stability.spectral_radius`) with that many steps, which converges slowly when
    many eigenvalues sit near the largest (200 steps match the exact value to about 1% at width 32;
    40 fall short by up to 3%).

    A radius is meaningful only where the solve converged (``"converged"``): elsewhere it is
    taken at the last iterate, not at an equilibrium. Near-critical cells (radius near 1, as the
    default cell with its attention residual is at initialisation) may need hundreds of steps.

    Args:
        ensemble: one of :data:`STUDY_ENSEMBLES`.
        scales: the values of ``sqrt(V)``, a non-empty sequence of numbers >= 0.
        x: inputs ``(batch, length, in_features)``.
        width, hidden, heads, attention_scale: as for :class:`deqlab.nn.TransformerCell`.
        seed: seed of the first draw (``nnx.Rngs(seed)``); draws: number of draws, >= 1.
        solver: a solver name or object (:func:`deqlab.solvers.get_solver`), e.g.
            ``deqlab.Broyden(divergence_factor=1e8)`` to let Broyden recover from a wild step
            instead of reporting the sample diverged.
        tol, max_steps: the solver's relative tolerance and iteration limit (they replace the
            solver's own).
        steps: None (default) for exact radii, or the number of power-iteration steps (>= 2).

    Returns:
        Arrays of shape ``(len(scales), draws, batch)``: ``"converged"`` (bool),
        ``"residual"`` (the solve's best relative residual), ``"solver_steps"`` (the step at which
        a converged solve met ``tol``), ``"cell_radius"``, ``"ff_radius"`` and
        ``"hidden_variance"`` (the mean square of the hidden pre-activation ``a W1 + b1`` over
        positions and units); ``"residual_trace"``, shape ``(len(scales), draws, batch,
        max_steps + 1)``, the relative residual after each step (entry 0 at ``z = 0``; a stopped
        solve repeats its last value); and ``"converged_fraction"``, shape ``(len(scales),)``.

    Raises:
        ValueError: an unknown ensemble, no scale or a negative one, ``x`` not 3-D, ``draws < 1``,
            ``max_steps < 1``, ``tol <= 0``, ``steps < 2`` or an unknown solver.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from deqlab.lab.experiments.sequence import initialisation as ffinit
        >>> x = jax.random.normal(jax.random.key(0), (2, 4, 8))
        >>> out = ffinit.cell_at_init("gaussian", [0.1, 1.0], x, width=8)
        >>> out["cell_radius"].shape, out["converged_fraction"].shape
        ((2, 1, 2), (2,))
    """
    from deqlab import nn  # deqlab.nn imports the experiments' config: import at call time

    where = "initialisation.cell_at_init"
    ensemble = _ensemble(ensemble, where)
    width, hidden = feedforward_shape(ensemble, width, hidden)
    if isinstance(scales, (str, bytes)) or not hasattr(scales, "__len__") or len(scales) == 0:
        raise checks.fail("scales", "a non-empty sequence of sqrt(V) >= 0", scales, where)
    scales = [_scale(s, where) for s in scales]
    if jnp.ndim(x) != 3:
        raise checks.fail("x", "an array (batch, length, in_features)", jnp.shape(x), where)
    draws = checks.positive_int(draws, "draws", where)
    max_steps = checks.positive_int(max_steps, "max_steps", where)
    tol = checks.positive_number(tol, "tol", where)
    if steps is not None:
        steps = checks.integer(steps, "steps", where, minimum=2)
    config = get_solver(solver, name="solver", tol=tol, max_steps=max_steps)
    seed = checks.integer(seed, "seed", where)
    seeds = [seed + k for k in range(draws)]
    cells = [nn.TransformerCell(width, x.shape[-1], heads=heads, hidden=hidden, ensemble=ensemble, scale=s,
                                attention_scale=attention_scale, rngs=nnx.Rngs(sd))
             for s in scales for sd in seeds]
    graphdef, _ = nnx.split(cells[0])
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *[nnx.split(c)[1] for c in cells])
    program = _cell_program(graphdef, config, steps, seed)
    raw = jax.device_get(program(stacked, x))
    shape = (len(scales), draws, x.shape[0])
    out = {k: np.asarray(v).reshape(shape + np.shape(v)[2:]) for k, v in raw.items()}
    for name in ("cell", "ff"):
        blocks = out.pop(f"{name}_blocks", None)
        if blocks is not None:  # the largest |eigenvalue| over the positions' blocks
            out[f"{name}_radius"] = np.abs(np.linalg.eigvals(blocks.astype(np.float64))).max(axis=(-2, -1))
    out["converged"] = out["converged"].astype(bool)
    out["converged_fraction"] = out["converged"].mean(axis=(1, 2))
    return out
