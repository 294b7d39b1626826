"""The feed-forward block of the DEQ-Transformer at initialisation: theory and measurement.

001 §4.2 initialises the dense layers of a DEQ-Transformer from the Gaussian, orthogonal and GOE
ensembles ("they have the same structure as the theoretical calculations"), at ``sqrt(V)`` in
``{0.1, 0.3, 1.0}`` with a feed-forward ``700 -> 2800 -> 700`` (GOE: ``700 -> 700 -> 700``, App. D).
:class:`deqlab.nn.TransformerCell` draws ``W1`` (width x hidden) and ``W2`` (hidden x width) as
``scale * W0`` with :func:`deqlab.ensembles.initializer`, ``scale = sqrt(V)``; its feed-forward
residual block is ``phi(a) = a + W2 relu(W1 a)`` on the LayerNorm output ``a`` (``|a|^2 = width``).

This module predicts, for ``(ensemble, scale, width, hidden)``:

- :func:`predict`: the variance of the hidden pre-activations ``W1 a``, of the block's output
  ``W2 relu(W1 a)``, the mean squared singular value (``gain``) of the product map ``M = W2 W1`` and
  the large-width spectral radius of ``M`` and of the block's Jacobian ``W2 D W1``,
  ``D = diag(relu'(W1 a))``. The radii follow from the Haagerup-Larsen theorem: ``M`` is
  bi-orthogonally invariant in law for Gaussian and orthogonal weights (an R-diagonal element in
  the limit), and for GOE a product of two free even elements, also R-diagonal (Nica & Speicher
  2006, Lecture 15); the support of an R-diagonal element's eigenvalue law has outer radius
  ``sqrt(tr(M^T M))``.
- :func:`product_spectrum`: the limiting law of the squared singular values of ``M`` by free
  multiplicative convolution, ``S_M = S_A S_B`` (002 Eq. 12), with
  ``A = W1^T W1``, ``B = W2 W2^T`` the ``hidden x hidden`` Gram matrices: free Poisson laws for
  Gaussian weights, projections (Bernoulli laws) for semi-orthogonal ones, Marchenko-Pastur laws
  (squared semicircles) for GOE.
- :func:`measure`: the same quantities on sampled matrices, and :func:`cell_at_init`: the spectral
  radius of a whole :class:`deqlab.nn.TransformerCell` at its equilibrium, next to that of its
  feed-forward Jacobian, where the linear theory stops: attention and LayerNorm are outside it.

Conventions: row vectors as in Flax (``y = a @ K``); a kernel of shape ``(fan_in, fan_out)``; the
input ``a`` of the block has ``|a|^2 = width``; traces are normalised by ``width`` (``tr I = 1``).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from deqlab import checks, ensembles, stability
from deqlab.solvers import get_solver, solve
from deqlab.theory import freeprob as fp
from deqlab.theory.freeprob.transforms import Spectrum, complex_argument, sqrt_with_cut

__all__ = ["STUDY_ENSEMBLES", "FeedForwardInit", "FreePoisson", "feedforward_shape", "predict",
           "product_spectrum", "measure", "cell_at_init"]

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
    """Predicted statistics of the feed-forward block ``a -> W2 relu(W1 a)`` at initialisation.

    Attributes:
        hidden_variance: ``E[(W1 a)_j^2]`` averaged over the hidden units, for ``|a|^2 = width``
            (exact at every size).
        output_variance: ``E[(W2 relu(W1 a))_i^2]`` averaged over the outputs (exact at every size:
            ``W1 a`` is symmetric in law, so ``E relu(h)^2 = E h^2 / 2``, and ``W2`` is independent).
        gain: ``E tr(M^T M)`` of the linear product ``M = W2 W1`` (width-normalised; exact).
        radius: large-width spectral radius of ``M``, ``sqrt(gain)`` (Haagerup-Larsen).
        relu_gain: ``tr(J^T J)`` of the block's Jacobian ``J = W2 D W1`` in the large-width limit
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
    """Large-width law of the squared singular values of the product map ``M = W2 W1``.

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
    Requires ``width <= hidden`` and ``scale > 0``.
    """
    where = "initialisation.product_spectrum"
    width, hidden = feedforward_shape(_ensemble(ensemble, where), width, hidden)
    if hidden < width:
        raise checks.fail("hidden", f">= width ({width}) (an expanding feed-forward)", hidden, where)
    V2 = _scale(scale, where) ** 4  # M = scale^2 W0_2 W0_1: its squared singular values scale as V^2
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


def cell_at_init(ensemble: str, scales: Sequence[float], x: jax.Array, *, width: int,
                 hidden: int | None = None, heads: int = 4, attention_scale: float | None = None,
                 seed: int = 0, tol: float = 1e-5, max_steps: int = 60, steps: int = 60
                 ) -> dict[str, np.ndarray]:
    """A :class:`deqlab.nn.TransformerCell` at initialisation, at its equilibrium, per ``scale``.

    For each ``scale`` a cell is built with ``nnx.Rngs(seed)`` (the same attention weights for
    every scale: they are drawn first from the same stream), its equilibrium ``z*`` found by
    Broyden's method (:func:`deqlab.solvers.solve`), and two Jacobians measured by
    :func:`deqlab.stability.spectral_radius` (power iteration, one estimate per sequence):

    - ``"cell_radius"``: of the whole cell ``z -> f(z, x)`` at ``z*``, the quantity that decides
      whether the forward iteration converges (001 §2.1);
    - ``"ff_radius"``: of the feed-forward map ``a -> W2 relu(W1 a)`` at the LayerNorm output ``a``
      of ``z*`` (block diagonal over positions: the largest over the positions), the quantity
      :func:`predict` calls ``relu_radius``.

    Args:
        ensemble: one of :data:`STUDY_ENSEMBLES`; scales: the values of ``sqrt(V)``.
        x: inputs ``(batch, length, in_features)``.
        width, hidden, heads, attention_scale: as for :class:`deqlab.nn.TransformerCell`.
        seed, tol, max_steps: parameters' seed, Broyden's tolerance and iteration limit.
        steps: power-iteration steps.

    Returns:
        ``{"cell_radius", "ff_radius"}`` of shape ``(len(scales), batch)``, ``"hidden_variance"``
        (mean square of ``W1 a`` over all positions) and ``"converged_fraction"`` of shape
        ``(len(scales),)``.
    """
    from deqlab import nn  # deqlab.nn imports the experiments' config: import at call time

    where = "initialisation.cell_at_init"
    ensemble = _ensemble(ensemble, where)
    width, hidden = feedforward_shape(ensemble, width, hidden)
    scales = [_scale(s, where) for s in scales]
    if not scales:
        raise checks.fail("scales", "a non-empty sequence of sqrt(V) >= 0", scales, where)
    if jnp.ndim(x) != 3:
        raise checks.fail("x", "an array (batch, length, in_features)", jnp.shape(x), where)
    steps = checks.integer(steps, "steps", where, minimum=2)
    cells = [nn.TransformerCell(width, x.shape[-1], heads=heads, hidden=hidden, ensemble=ensemble, scale=s,
                                attention_scale=attention_scale, rngs=nnx.Rngs(seed)) for s in scales]
    graphdef, _ = nnx.split(cells[0])
    config = get_solver("broyden", tol=tol, max_steps=max_steps)

    @jax.jit
    def run(state, x):
        def f(z, x):
            return nnx.merge(graphdef, state)(z, x)

        cell = nnx.merge(graphdef, state)
        z0 = jnp.zeros(x.shape[:-1] + (width,), x.dtype)
        result = solve(f, z0, x, solver=config, batch_axis=0)
        z = result.value
        r_cell = stability.spectral_radius(f, z, x, key=jax.random.key(seed + 1), steps=steps, batch_axis=0)
        a, pre = cell.feed_forward_hidden(z, x)
        bias = cell.contract.bias[...]

        def ff(a):
            return cell.contract(jax.nn.relu(cell.expand(a))) - bias

        r_ff = stability.spectral_radius(ff, a, key=jax.random.key(seed + 2), steps=steps, batch_axis=0)
        return r_cell, r_ff, jnp.mean(pre**2), jnp.mean(result.converged)

    out = [run(nnx.split(c)[1], x) for c in cells]
    return {"cell_radius": np.asarray([o[0] for o in out]), "ff_radius": np.asarray([o[1] for o in out]),
            "hidden_variance": np.asarray([float(o[2]) for o in out]),
            "converged_fraction": np.asarray([float(o[3]) for o in out])}
