"""Experiment 1 of 004 (§4, Fig. 5): smooth sequence-to-sequence regression, random vs kGLM
initialisation of a fully connected tanh DEQ.

**Data (004 §4).** ``X`` is a uniform grid of ``n = 100`` points on ``[-2 pi, 2 pi]``, ``X~ = X - 2``
(the grid on ``[-2 pi - 2, 2 pi - 2]``). A pair ``(Y_s, Y~_s)`` is one joint draw of a Gaussian
process on ``(X, X~)`` with covariance :func:`deqlab.theory.kglm.kernels.k_true`
(``0.1 exp(-|x - x'|^2 / 2) exp(-sin^2 |x - x'|)``) and mean ``h(x) = e^{-x^2/10} sin x +
e^{-(x+9)^2}`` (:func:`mean_function`); the task is to predict ``Y~_s`` from ``Y_s``.
:func:`sample_sequences` draws them.

**Model (004 §4, Eq. 7-8 with Cor. 6).** ``z* = tanh(W1 z* + W2 Y + b)`` solved by
:class:`deqlab.nn.DEQ` (implicit gradients), read out as ``V1 z* + V2 Y + c`` (Eq. 8 with
``rho = 0``, plus a bias): :class:`Seq2SeqDEQ`. With ``W1 = -K/lam``, ``W2 = K/lam``,
``V1 = -k(X~, X)/lam``, ``V2 = k(X~, X)/lam`` and zero biases it is exactly the kGLM of the
``tanh`` family (``A = log 2 cosh``, 004 App. C.2) fitted to each sequence ``Y_s`` and evaluated
at ``X~`` (004 Thm. 3, Cor. 6): :data:`TANH_FAMILY`.

**Initialisations (004 §4).** ``"random"``: every weight from the symmetric uniform law
``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` (PyTorch's default, which 004 §4 names), times ``scale``
(1 in the paper). ``"naive"``: ``W1, W2`` from the squared exponential kernel
``exp(-|x - x'|^2 / 2)`` on a uniform grid over ``[-2 pi, 2 pi]``
(:func:`deqlab.theory.kglm.models.naive_coordinates`), ``V1, V2`` as in ``"random"``; only the readout
``(V1, V2, c)`` is trained in the first ``freeze_epochs = 10`` epochs. ``"informed"``: every weight
from ``k_true`` on the true ``X``, ``X~``, so that the untrained model (epoch 0) outputs the
kGLM's predictions. For the kGLM schemes ``scale`` is ``C = ||W1||_2 = ||K||_2 / lam``
(:func:`deqlab.theory.kglm.models.lam_for_spectral_norm`; ``C < 1`` is Assumption 2 for ``tanh``).

**Training (004 §4).** Mean squared error, Adam with its default hyperparameters (learning rate
``1e-3``, ``b1 = 0.9``, ``b2 = 0.999``, ``eps = 1e-8``), 400 epochs, ``N = 20000`` training and
``2000`` test sequences, seeds 0 to 99 at the paper's scale. :func:`train_seeds` trains all seeds
of one (scheme, scale) in one compiled, ``jax.vmap``-ped program (the approach of
:func:`deqlab.lab.experiments.nonlinear.training.train_seeds`); each seed draws its own data set (from
``fold_in(key(seed), 0)``) and its own random weights (``fold_in(key(seed), 1)``), so the three
schemes see the same data under the same seed and can be compared seed by seed.
:func:`run_seq2seq_sweep` runs (scheme, scale) units through the resumable
:func:`deqlab.lab.experiments.sweep.run_sweep`; :func:`summarize` gives the median and spread over
seeds per epoch (Fig. 5a) and :func:`compare` the paired comparison of two schemes.

**Choices 004 leaves open** (ours; every one is an argument):

1. ``lam`` of the kGLM schemes: not given for this task. We fix ``C = ||K||_2 / lam`` as for
   004's denoising task; default :data:`DEFAULT_C` ``= 0.5``. (The authors' public code,
   github.com/RussellTsuchida/deq-glm, uses ``lam = ||K||_F``, ``C ~ 0.46``, with a temperature
   that scales ``V1, V2`` by 5 relative to ``W1, W2``; we keep 004 Thm. 3's common ``lam``.)
2. Batch size: not given. Default ``batch_size=None``, one full-batch Adam step per epoch, as in
   the authors' code (400 epochs = 400 steps).
3. Normalisation: not mentioned. Default ``normalise=True``: inputs and targets are shifted and
   scaled by the mean and standard deviation of the seed's training inputs (one scalar each),
   as in the authors' code. The test error is the MSE on that scale.
4. Biases: ``b`` and ``c`` start at zero in every scheme (the authors' code); 004 §4 does not say.
   In the authors' code the random scheme's ``V2`` is zero and frozen and the naive scheme
   freezes for 20 epochs; we follow 004's text (``V2`` random and trained, 10 epochs).
5. Solver: Anderson (the authors' code: ``m = 5``, relative tolerance ``1e-2``, 25 steps); ours:
   deqlab's Anderson, ``tol = 1e-3`` in float32, at most 40 steps, implicit backward pass that never raises; the fraction of
   converged forward solves is recorded per epoch.
6. Test error: MSE over all test sequences and all ``n`` outputs, evaluated before training
   (epoch 0) and after every epoch.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from deqlab import checks
from deqlab.nn import DEQ
from deqlab.theory.kglm import kernels as kernels_module
from deqlab.theory.kglm.families import spin
from deqlab.theory.kglm.models import DEQParameters, initializer, lam_for_spectral_norm, naive_coordinates

__all__ = [
    "SCHEMES",
    "GRID_SIZE",
    "INTERVAL",
    "OFFSET",
    "DEFAULT_C",
    "TANH_FAMILY",
    "mean_function",
    "grids",
    "joint_covariance",
    "sample_sequences",
    "normalise",
    "kglm_weights",
    "seed_data",
    "init_model",
    "initial_test_error",
    "Seq2SeqCell",
    "Seq2SeqDEQ",
    "train_seeds",
    "run_seq2seq_sweep",
    "summarize",
    "compare",
]

SCHEMES: tuple[str, ...] = ("random", "naive", "informed")
"""Initialisation schemes of 004 §4 (Fig. 5a)."""

GRID_SIZE: int = 100
"""``n``: points per sequence (004 §4)."""

INTERVAL: tuple[float, float] = (-2 * math.pi, 2 * math.pi)
"""The input grid's interval (004 §4)."""

OFFSET: float = 2.0
"""``X~ = X - OFFSET`` (004 §4: the output grid on ``[-2 pi - 2, 2 pi - 2]``)."""

DEFAULT_C: float = 0.5
"""Default ``C = ||W1||_2`` of the kGLM schemes (our choice; 004 gives no ``lam`` for this task)."""

TANH_FAMILY = dataclasses.replace(
    spin(), name="tanh", support="real numbers",
    valid_observation=lambda y: np.ones(np.shape(y), bool))
"""The ``spin`` family (``A = log 2 cosh``, ``A' = tanh``, 004 App. C.2) with real-valued
observations, ``T(y) = y``: the kGLM whose DEQ is 004 §4's ``tanh(W1 z + W2 Y)``. Its objective
(004 Eq. 5) is strictly convex for any real ``Y``, so the MAP and Thm. 3 hold as for ``y = +-1``.

:meta hide-value:
"""

_DEFAULTS = dict(epochs=400, train_size=20000, test_size=2000, batch_size=None, learning_rate=1e-3,
                 freeze_epochs=10, normalise=True, solver="anderson", tol=1e-3, max_steps=40)

_WHERE = "kglm.seq2seq"


def _x64():
    """A context in which JAX computes in float64 (``jax.enable_x64`` from jax 0.8 on,
    ``jax.experimental.enable_x64`` before): the kernel matrices are built in float64."""
    context = getattr(jax, "enable_x64", None)
    if context is None:  # pragma: no cover - jax < 0.8
        from jax.experimental import enable_x64 as context
    return context(True)


# --------------------------------------------------------------------------------------------
# Data (004 §4)
# --------------------------------------------------------------------------------------------


def mean_function(x: Any) -> Any:
    """``h(x) = exp(-x^2 / 10) sin(x) + exp(-(x + 9)^2)``, the GP mean of 004 §4."""
    x = jnp.asarray(x)
    return jnp.exp(-(x**2) / 10.0) * jnp.sin(x) + jnp.exp(-((x + 9.0) ** 2))


def _grid_size(n: Any, where: str) -> int:
    return checks.integer(n, "n", where, minimum=2)


def grids(n: int = GRID_SIZE, offset: float = OFFSET) -> tuple[np.ndarray, np.ndarray]:
    """``(X, X~)``: ``n`` points uniform on :data:`INTERVAL` and the same grid shifted by
    ``-offset`` (004 §4), float64, shape ``(n,)`` each."""
    where = f"{_WHERE}.grids"
    n = _grid_size(n, where)
    offset = checks.number(offset, "offset", where)
    X = np.linspace(*INTERVAL, n)
    return X, X - offset


def joint_covariance(n: int = GRID_SIZE, offset: float = OFFSET) -> np.ndarray:
    """``k_true`` on the stacked grid ``(X, X~)``, ``(2n, 2n)`` float64: the covariance of one
    joint draw ``(Y_s, Y~_s)`` (004 §4)."""
    X, Xt = grids(n, offset)
    both = np.concatenate([X, Xt])[:, None]
    with _x64():
        return np.asarray(kernels_module.k_true()(both, both), dtype=np.float64)


@functools.lru_cache(maxsize=8)
def _factor(n: int, offset: float) -> np.ndarray:
    """``L`` with ``L L^T = joint_covariance`` up to round-off. ``k_true`` is smooth, so the Gram is
    numerically singular (eigenvalues down to ``-1e-16`` of the largest): a symmetric square root
    with the negative round-off clipped, not a Cholesky factor."""
    w, U = np.linalg.eigh(joint_covariance(n, offset))
    return U * np.sqrt(np.clip(w, 0.0, None))


def sample_sequences(key: Any, count: int, *, n: int = GRID_SIZE, offset: float = OFFSET,
                     dtype: Any = jnp.float32) -> tuple[jax.Array, jax.Array]:
    """``count`` pairs ``(Y_s, Y~_s)``: joint Gaussian-process draws on ``(X, X~)`` with covariance
    ``k_true`` and means ``h(X)``, ``h(X~)`` (004 §4).

    Args:
        key: a JAX PRNG key.
        count: number of sequences, >= 1.
        n: points per sequence (100 in 004).
        offset: ``X~ = X - offset`` (2 in 004).
        dtype: floating dtype of the result (float64 needs ``jax_enable_x64``).

    Returns:
        ``(Y, Y_target)``, each ``(count, n)``. Traceable in ``key`` (``jit`` / ``vmap``).
    """
    where = f"{_WHERE}.sample_sequences"
    key = checks.prng_key(key, "key", where)
    count = checks.positive_int(count, "count", where)
    n = _grid_size(n, where)
    offset = checks.number(offset, "offset", where)
    dtype = checks.floating_dtype(dtype, "dtype", where)
    X, Xt = grids(n, offset)
    L = jnp.asarray(_factor(n, offset), dtype)
    mean = jnp.asarray(np.concatenate([np.asarray(mean_function(X)), np.asarray(mean_function(Xt))]), dtype)
    draws = mean + jax.random.normal(key, (count, 2 * n), dtype) @ L.T
    return draws[:, :n], draws[:, n:]


def normalise(Y: Any, Y_target: Any, Y_test: Any, Y_test_target: Any):
    """Shift and scale all four arrays by the mean and standard deviation of ``Y`` (the training
    inputs; one scalar each), as in the authors' code (choice 3 of the module docstring)."""
    mu, sd = jnp.mean(Y), jnp.std(Y)
    return tuple((a - mu) / sd for a in (Y, Y_target, Y_test, Y_test_target))


# --------------------------------------------------------------------------------------------
# kGLM weights (004 Thm. 3, Cor. 6) and the model
# --------------------------------------------------------------------------------------------


def _scale(scheme: str, scale: Any, where: str) -> float:
    if scheme == "random":
        return checks.number(scale, "scale", where, lower=0.0)
    return checks.positive_number(scale, "scale", where)


@functools.lru_cache(maxsize=16)
def _kglm_weights(scheme: str, n: int, offset: float, scale: float) -> tuple:
    with _x64():
        if scheme == "informed":
            X, Xt = grids(n, offset)
            k = kernels_module.k_true()
            K, K_test = np.asarray(k(X, X)), np.asarray(k(Xt, X))
        else:
            K = np.asarray(kernels_module.squared_exponential(1.0)(naive_coordinates(n), naive_coordinates(n)))
            K_test = None
        lam = lam_for_spectral_norm(K, scale)
        p = initializer(scheme, K, lam, K_test)
        return tuple(None if w is None else np.asarray(w, np.float64) for w in p), lam


def kglm_weights(scheme: str, scale: float = DEFAULT_C, *, n: int = GRID_SIZE,
                 offset: float = OFFSET) -> tuple[DEQParameters, float]:
    """The kGLM weights of a scheme (004 §4 with Thm. 3 / Cor. 6) and their ``lam``.

    ``"informed"``: ``K = k_true(X, X)``, ``K_test = k_true(X~, X)``; ``"naive"``: ``K`` the squared
    exponential on :func:`deqlab.theory.kglm.models.naive_coordinates` and no ``V1, V2``. ``lam =
    ||K||_2 / scale`` (:func:`deqlab.theory.kglm.models.lam_for_spectral_norm`), so ``||W1||_2 = scale``.
    Returns ``(DEQParameters in float64 NumPy, lam)`` in the ``W z`` convention of
    :func:`deqlab.theory.kglm.models.initializer`.
    """
    where = f"{_WHERE}.kglm_weights"
    scheme = checks.choice(scheme, "scheme", ("naive", "informed"), where)
    scale = checks.positive_number(scale, "scale", where)
    n = _grid_size(n, where)
    offset = checks.number(offset, "offset", where)
    weights, lam = _kglm_weights(scheme, n, offset, scale)
    return DEQParameters(*weights), lam


def _constant(W: np.ndarray):
    """An initializer returning ``W.T`` (an ``nnx.Linear`` computes ``z @ kernel = W z``)."""
    def init(key, shape, dtype=jnp.float32):
        kernel = jnp.asarray(W.T, dtype)
        if kernel.shape != tuple(shape):
            raise ValueError(f"{_WHERE}: kGLM weight of shape {kernel.shape} for a kernel of shape {tuple(shape)}")
        return kernel
    return init


def _uniform(scale: float):
    """PyTorch's default ``nn.Linear`` weight law ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, times ``scale``
    (a variance-scaling uniform law of variance ``scale^2 / (3 fan_in)``)."""
    if scale == 0.0:
        return nnx.initializers.zeros_init()
    return nnx.initializers.variance_scaling(scale**2 / 3.0, "fan_in", "uniform")


class Seq2SeqCell(nnx.Module):
    """``g(z, Y) = tanh(W1 z + W2 Y + b)``, the layer of 004 §4 (004 Eq. 7 with ``sigma = tanh``,
    ``rho = 0``, plus a bias ``b``). ``hidden`` holds ``W1``, ``inject`` holds ``W2`` and ``b``."""

    def __init__(self, n: int, *, hidden_init, inject_init, param_dtype: Any = jnp.float32, rngs: nnx.Rngs):
        self.width = n
        self.in_features = n
        self.hidden = nnx.Linear(n, n, use_bias=False, kernel_init=hidden_init, param_dtype=param_dtype,
                                 rngs=rngs)
        self.inject = nnx.Linear(n, n, use_bias=True, kernel_init=inject_init,
                                 bias_init=nnx.initializers.zeros_init(), param_dtype=param_dtype, rngs=rngs)

    def __call__(self, z: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.tanh(self.hidden(z) + self.inject(y))


class Seq2SeqDEQ(nnx.Module):
    """The DEQ of 004 §4: ``z* = tanh(W1 z* + W2 Y + b)`` (:class:`deqlab.nn.DEQ`, implicit
    gradients), output ``V1 z* + V2 Y + c`` (004 Eq. 8, Cor. 6), with the weights of ``scheme``.

    Args:
        scheme: ``"random"``, ``"naive"`` or ``"informed"`` (:data:`SCHEMES`, module docstring).
        scale: ``"random"``: factor on PyTorch's uniform bound (>= 0, 1 in 004); kGLM schemes:
            ``C = ||W1||_2 > 0``.
        n, m: input and output lengths (``m = n`` for the kGLM schemes' grids).
        offset: ``X~ = X - offset`` (informed scheme).
        solver, tol, max_steps: of the forward solve (and of the adjoint solve).
        param_dtype: dtype of the weights (float32 for training; float64 for checks).
        rngs: ``nnx.Rngs`` for the random weights.

    ``model(Y)`` maps ``(batch, n)`` to ``(batch, m)``; ``model(Y, return_solution=True)`` also
    returns the forward :class:`deqlab.solvers.Solution`.
    """

    def __init__(self, scheme: str, scale: float, *, n: int = GRID_SIZE, m: int | None = None,
                 offset: float = OFFSET, solver: Any = "anderson", tol: float = 1e-3, max_steps: int = 40,
                 param_dtype: Any = jnp.float32, rngs: nnx.Rngs):
        where = f"{_WHERE}.Seq2SeqDEQ"
        scheme = checks.choice(scheme, "scheme", SCHEMES, where)
        scale = _scale(scheme, scale, where)
        n = _grid_size(n, where)
        m = n if m is None else checks.positive_int(m, "m", where)
        if scheme != "random" and m != n:
            raise checks.fail("m", f"n ({n}) for the kGLM schemes (X~ is X shifted)", m, where)
        random = _uniform(scale if scheme == "random" else 1.0)
        if scheme == "random":
            hidden_init = inject_init = readout_init = skip_init = random
        else:
            W, _ = kglm_weights(scheme, scale, n=n, offset=offset)
            hidden_init, inject_init = _constant(W.W1), _constant(W.W2)
            if scheme == "informed":
                readout_init, skip_init = _constant(W.V1), _constant(W.V2)
            else:
                readout_init = skip_init = random
        cell = Seq2SeqCell(n, hidden_init=hidden_init, inject_init=inject_init, param_dtype=param_dtype, rngs=rngs)
        self.deq = DEQ(cell, solver=solver, tol=tol, max_steps=max_steps, on_failure="ignore")
        self.readout = nnx.Linear(n, m, use_bias=True, kernel_init=readout_init,
                                  bias_init=nnx.initializers.zeros_init(), param_dtype=param_dtype, rngs=rngs)
        self.skip = nnx.Linear(n, m, use_bias=False, kernel_init=skip_init, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, y: jax.Array, *, return_solution: bool = False):
        z, sol = self.deq(y, return_solution=True)
        out = self.readout(z) + self.skip(y)
        return (out, sol) if return_solution else out


# --------------------------------------------------------------------------------------------
# Training all seeds in one program
# --------------------------------------------------------------------------------------------


def _check_options(where: str, options: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(options) - set(_DEFAULTS)
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {sorted(unknown)}; valid options are {sorted(_DEFAULTS)}.")
    o = {**_DEFAULTS, **options}
    for name in ("epochs", "train_size", "test_size", "max_steps"):
        o[name] = checks.positive_int(o[name], name, where)
    o["freeze_epochs"] = checks.integer(o["freeze_epochs"], "freeze_epochs", where, minimum=0)
    if o["batch_size"] is not None:
        o["batch_size"] = checks.integer(o["batch_size"], "batch_size", where, minimum=1, maximum=o["train_size"])
    o["learning_rate"] = checks.positive_number(o["learning_rate"], "learning_rate", where)
    o["tol"] = checks.positive_number(o["tol"], "tol", where)
    if not isinstance(o["normalise"], bool):
        raise checks.fail("normalise", "True or False", o["normalise"], where)
    return o


def _check_seeds(seeds: Any, where: str) -> list[int]:
    if isinstance(seeds, (int, np.integer)) or not isinstance(seeds, (Sequence, range)) or len(seeds) == 0:
        raise checks.fail("seeds", "a non-empty list of distinct integers >= 0", seeds, where)
    seeds = [checks.integer(s, "seeds", where, minimum=0) for s in seeds]
    if len(set(seeds)) != len(seeds):
        raise checks.fail("seeds", "distinct integers", seeds, where)
    return seeds


def _is_hidden(path) -> bool:
    return any(str(getattr(k, "key", getattr(k, "name", k))) == "deq" for k in path)


@functools.lru_cache(maxsize=8)
def _program(solver: Any, tol: float, max_steps: int, batch_size: int, n_batches: int):
    """The model's graph and the compiled, seed-vmapped epoch and evaluation. Every scheme and
    scale shares them (they differ only in the initial parameters), so one compilation serves a
    sweep. Two Adam states, hidden ``(W1, W2, b)`` and readout ``(V1, V2, c)``: while the hidden
    weights are frozen (naive scheme) their state does not advance, as for a PyTorch parameter
    without a gradient."""
    # the graph and the state's structure only: an abstract model (nnx.eval_shape) makes no array and
    # compiles no initialiser
    template = nnx.eval_shape(lambda: Seq2SeqDEQ("random", 1.0, solver=solver, tol=tol, max_steps=max_steps,
                                                 rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(template)
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(state)
    hidden = tuple(_is_hidden(path) for path, _ in with_paths)
    adam = optax.scale_by_adam()  # 004 §4: Adam with default hyperparameters

    def split(params):
        return ([p for p, h in zip(params, hidden) if h], [p for p, h in zip(params, hidden) if not h])

    def join(hid, read):
        hid, read = iter(hid), iter(read)
        return [next(hid) if h else next(read) for h in hidden]

    def forward(params, y):
        return nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, params))(y, return_solution=True)

    def loss_fn(params, y, t):
        out, sol = forward(params, y)
        return jnp.mean((out - t) ** 2), (jnp.mean(sol.converged.astype(jnp.float32)),
                                          jnp.mean(sol.stats.steps.astype(jnp.float32)))

    def evaluate(params, y, t):
        out, sol = forward(params, y)
        return jnp.stack([jnp.mean((out - t) ** 2), jnp.mean(sol.converged.astype(jnp.float32))])

    def epoch(params, opt_hidden, opt_readout, key_data, epoch_index, train_hidden, learning_rate,
              y_train, t_train, y_test, t_test):
        def step(carry, idx):
            params, opt_hidden, opt_readout = carry
            (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, y_train[idx], t_train[idx])
            g_hid, g_read = split(grads)
            p_hid, p_read = split(params)
            u_read, opt_readout = adam.update(g_read, opt_readout, p_read)
            u_hid, new_hidden = adam.update(g_hid, opt_hidden, p_hid)
            u_hid = [jnp.where(train_hidden, u, 0.0) for u in u_hid]
            opt_hidden = jax.tree_util.tree_map(lambda new, old: jnp.where(train_hidden, new, old),
                                                new_hidden, opt_hidden)
            updates = [-learning_rate * u for u in join(u_hid, u_read)]
            return (optax.apply_updates(params, updates), opt_hidden, opt_readout), (loss, *aux)

        if n_batches == 1:
            order = jnp.arange(batch_size)[None]
        else:
            key = jax.random.fold_in(jax.random.wrap_key_data(key_data), epoch_index)
            order = jax.random.permutation(key, y_train.shape[0])[: n_batches * batch_size]
            order = order.reshape(n_batches, batch_size)
        (params, opt_hidden, opt_readout), (loss, converged, steps) = jax.lax.scan(
            step, (params, opt_hidden, opt_readout), order)
        error = evaluate(params, y_test, t_test)[0]
        return params, opt_hidden, opt_readout, jnp.stack([jnp.mean(loss), error, jnp.mean(converged),
                                                           jnp.mean(steps)])

    run_epoch = jax.jit(jax.vmap(epoch, in_axes=(0, 0, 0, 0, None, None, None, 0, 0, 0, 0)))
    run_evaluate = jax.jit(jax.vmap(evaluate))
    return treedef, split, run_epoch, run_evaluate, adam


def _seed_data(key_data, o):
    key = jax.random.fold_in(jax.random.wrap_key_data(key_data), 0)
    k_train, k_test = jax.random.split(key)
    y, t = sample_sequences(k_train, o["train_size"])
    y_test, t_test = sample_sequences(k_test, o["test_size"])
    if o["normalise"]:
        y, t, y_test, t_test = normalise(y, t, y_test, t_test)
    return y, t, y_test, t_test


def seed_data(seed: int, **options: Any) -> tuple[jax.Array, ...]:
    """``(Y, Y~, Y_test, Y~_test)`` of one seed, float32, exactly as :func:`train_seeds` draws them
    (options ``train_size``, ``test_size``, ``normalise`` as there)."""
    where = f"{_WHERE}.seed_data"
    seed = checks.integer(seed, "seed", where, minimum=0)
    o = _check_options(where, options)
    return _seed_data(jax.random.key_data(jax.random.key(seed)), o)


def init_model(scheme: str, scale: float, seed: int, *, param_dtype: Any = jnp.float32,
               **options: Any) -> Seq2SeqDEQ:
    """The model :func:`train_seeds` starts from for ``seed`` (random weights from
    ``fold_in(key(seed), 1)``); options ``solver``, ``tol``, ``max_steps`` as there."""
    where = f"{_WHERE}.init_model"
    seed = checks.integer(seed, "seed", where, minimum=0)
    o = _check_options(where, options)
    key = jax.random.fold_in(jax.random.key(seed), 1)
    return Seq2SeqDEQ(scheme, scale, solver=o["solver"], tol=o["tol"], max_steps=o["max_steps"],
                      param_dtype=param_dtype, rngs=nnx.Rngs(key))


def _setup(where: str, scheme: str, scale: Any, seeds: Any, options: Mapping[str, Any]):
    """Checked arguments, the shared program, each seed's data and initial parameters (vmapped)."""
    scheme = checks.choice(scheme, "scheme", SCHEMES, where)
    scale = _scale(scheme, scale, where)
    seeds = _check_seeds(seeds, where)
    o = _check_options(where, options)
    batch_size = o["batch_size"] or o["train_size"]
    n_batches = o["train_size"] // batch_size
    program = _program(o["solver"], o["tol"], o["max_steps"], batch_size, n_batches)
    keys = jnp.stack([jax.random.key_data(jax.random.key(s)) for s in seeds])
    data = jax.vmap(lambda k: _seed_data(k, o))(keys)

    def init(key_data):
        key = jax.random.fold_in(jax.random.wrap_key_data(key_data), 1)
        model = Seq2SeqDEQ(scheme, scale, solver=o["solver"], tol=o["tol"], max_steps=o["max_steps"],
                           rngs=nnx.Rngs(key))
        return jax.tree_util.tree_leaves(nnx.split(model)[1])

    params = jax.vmap(init)(keys)
    treedef = program[0]
    if jax.tree_util.tree_structure(params) != jax.tree_util.tree_structure(list(range(treedef.num_leaves))):
        raise AssertionError("the model's parameters do not match the compiled program's")
    return scheme, scale, seeds, o, program, keys, data, params


def initial_test_error(scheme: str, scale: float, seeds: Sequence[int], **options: Any) -> dict[str, list]:
    """The untrained models (epoch 0 of :func:`train_seeds`), without training: per seed the test
    MSE (``test_error``; for ``"informed"`` the kGLM's test error, 004 Cor. 6, where the solves
    converge) and the fraction of test sequences whose forward solve converged (``converged``).
    Same arguments as :func:`train_seeds`."""
    _, _, _, _, program, _, data, params = _setup(f"{_WHERE}.initial_test_error", scheme, scale, seeds, options)
    result = np.asarray(program[3](params, data[2], data[3]))
    return {"test_error": result[:, 0].tolist(), "converged": result[:, 1].tolist()}


def train_seeds(scheme: str, scale: float, seeds: Sequence[int], *, progress: bool = False,
                **options: Any) -> dict[str, Any]:
    """Train one :class:`Seq2SeqDEQ` per seed, all seeds in one vmapped, compiled program (004 §4).

    Args:
        scheme: ``"random"``, ``"naive"`` or ``"informed"``.
        scale: see :class:`Seq2SeqDEQ` (1 for ``"random"`` and :data:`DEFAULT_C` for the kGLM
            schemes are the defaults of :func:`run_seq2seq_sweep`).
        seeds: distinct integers >= 0; seed s sets the data, the random weights and the batch order.
        progress: a tqdm bar over the epochs.
        **options: ``epochs`` (400), ``train_size`` (20000), ``test_size`` (2000), ``batch_size``
            (None: full batch), ``learning_rate`` (1e-3), ``freeze_epochs`` (10: the naive
            scheme trains only the readout in its first epochs; ignored by the other schemes),
            ``normalise`` (True), ``solver`` ("anderson"), ``tol`` (1e-3), ``max_steps`` (40).

    Returns:
        A JSON-able dict of per-seed lists: ``test_error_curve`` (``epochs + 1`` values; entry 0 is
        the untrained model), ``train_loss_curve``, ``converged_curve`` (fraction of converged
        forward solves in training), ``steps_curve`` (mean solver steps), each ``epochs`` long;
        ``test_error`` (final), and ``seeds``.

    Raises:
        ValueError: for an argument out of range (named in the message).
    """
    scheme, scale, seeds, o, program, keys, data, params = _setup(f"{_WHERE}.train_seeds", scheme, scale, seeds,
                                                                   options)
    _, split, run_epoch, run_evaluate, adam = program
    p_hid, p_read = split(params)
    opt_hidden, opt_readout = jax.vmap(adam.init)(p_hid), jax.vmap(adam.init)(p_read)
    error0 = np.asarray(run_evaluate(params, data[2], data[3]))[:, 0]
    history = np.full((o["epochs"], len(seeds), 4), np.nan, np.float32)
    lr = jnp.float32(o["learning_rate"])
    from tqdm import tqdm

    for e in tqdm(range(o["epochs"]), desc=f"{scheme} {scale:g}", disable=not progress, leave=False):
        train_hidden = jnp.asarray(not (scheme == "naive" and e < o["freeze_epochs"]))
        params, opt_hidden, opt_readout, metrics = run_epoch(params, opt_hidden, opt_readout, keys, e,
                                                             train_hidden, lr, *data)
        history[e] = np.asarray(metrics)
    loss, error, converged, steps = (history[..., i].T for i in range(4))  # each (seeds, epochs)
    curve = np.concatenate([error0[:, None], error], axis=1)
    return {
        "seeds": list(seeds),
        "test_error": curve[:, -1].tolist(),
        "test_error_curve": curve.tolist(),
        "train_loss_curve": loss.tolist(),
        "converged_curve": converged.tolist(),
        "steps_curve": steps.tolist(),
    }


# --------------------------------------------------------------------------------------------
# Sweep and summary
# --------------------------------------------------------------------------------------------

_PER_SEED = ("test_error", "test_error_curve", "train_loss_curve", "converged_curve", "steps_curve")


def run_seq2seq_sweep(directory: str | os.PathLike, units: Sequence[tuple[str, float]] | None = None, *,
                      seeds: Sequence[int] = range(100), chunk: int | None = None, progress: bool = True,
                      **options: Any) -> list[dict[str, Any]]:
    """004 Fig. 5a: :func:`train_seeds` for each (scheme, scale) unit, through the resumable
    :func:`deqlab.lab.experiments.sweep.run_sweep` (one stored result per unit and chunk of seeds,
    keyed by scheme, scale, seeds and options; a finished one is read back, not rerun).

    Args:
        directory: where the results are stored.
        units: ``(scheme, scale)`` pairs; default ``[("random", 1.0), ("naive", DEFAULT_C),
            ("informed", DEFAULT_C)]``.
        seeds: the seeds of every unit (0 to 99 in 004).
        chunk: seeds per vmapped program (and per stored result); None: all of them at once.
        progress: a tqdm bar over the units.
        **options: as for :func:`train_seeds`.

    Returns:
        One row per (unit, seed): ``scheme``, ``scale``, ``seed`` and the per-seed entries of
        :func:`train_seeds` (``test_error``, ``test_error_curve``, ``train_loss_curve``,
        ``converged_curve``, ``steps_curve``).
    """
    from deqlab.lab.experiments import sweep

    where = f"{_WHERE}.run_seq2seq_sweep"
    if units is None:
        units = [("random", 1.0), ("naive", DEFAULT_C), ("informed", DEFAULT_C)]
    if isinstance(units, (str, bytes)) or not isinstance(units, Sequence) or len(units) == 0:
        raise checks.fail("units", "a non-empty list of (scheme, scale) pairs", units, where)
    checked = []
    for unit in units:
        if not isinstance(unit, (tuple, list)) or len(unit) != 2:
            raise checks.fail("units", "a non-empty list of (scheme, scale) pairs", units, where)
        scheme = checks.choice(unit[0], "units", SCHEMES, where)
        checked.append((scheme, _scale(scheme, unit[1], where)))
    seeds = _check_seeds(seeds, where)
    o = _check_options(where, options)
    chunk = len(seeds) if chunk is None else checks.positive_int(chunk, "chunk", where)
    configs = [{"scheme": s, "scale": c, "seeds": seeds[i:i + chunk], "options": o}
               for s, c in checked for i in range(0, len(seeds), chunk)]

    def unit_fn(config):
        result = train_seeds(config["scheme"], config["scale"], config["seeds"], **config["options"])
        return {"result": result}

    stored = sweep.run_sweep(unit_fn, configs, directory, progress=progress, description="scheme x scale")
    rows = []
    for u in stored:
        r = u["result"]
        for i, seed in enumerate(r["seeds"]):
            rows.append({"scheme": u["scheme"], "scale": u["scale"], "seed": seed,
                         **{k: r[k][i] for k in _PER_SEED}})
    return rows


def _groups(rows: Sequence[Mapping[str, Any]], where: str) -> dict[tuple, list]:
    if isinstance(rows, Mapping) or not isinstance(rows, Sequence) or len(rows) == 0:
        raise checks.fail("rows", "a non-empty list of rows of run_seq2seq_sweep", rows, where)
    groups: dict[tuple, list] = {}
    for row in rows:
        if not isinstance(row, Mapping) or not {"scheme", "scale", "seed", "test_error_curve"} <= set(row):
            raise checks.fail("rows", "rows of run_seq2seq_sweep (scheme, scale, seed, test_error_curve)", row,
                              where)
        groups.setdefault((row["scheme"], row["scale"]), []).append(row)
    return groups


def summarize(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Fig. 5a's statistics per (scheme, scale), in first-seen order: ``n`` seeds, ``epoch``
    (0 to E), and per epoch over seeds the ``median``, the quartiles ``q25``, ``q75`` and the
    ``min`` and ``max`` of the test MSE; ``final_median`` and ``initial_median`` (epochs E and 0);
    ``converged_min``, the smallest fraction of converged training solves in any epoch of any seed."""
    groups = _groups(rows, "kglm.seq2seq.summarize")
    out = []
    for (scheme, scale), group in groups.items():
        curves = np.array([r["test_error_curve"] for r in group], float)  # (seeds, E + 1)
        q = np.nanquantile(curves, [0.0, 0.25, 0.5, 0.75, 1.0], axis=0)
        conv = [min(r["converged_curve"]) for r in group if r.get("converged_curve")]
        out.append({"scheme": scheme, "scale": scale, "n": len(group), "epoch": np.arange(curves.shape[1]),
                    "min": q[0], "q25": q[1], "median": q[2], "q75": q[3], "max": q[4],
                    "initial_median": float(q[2, 0]), "final_median": float(q[2, -1]),
                    "converged_min": float(min(conv)) if conv else float("nan")})
    return out


def compare(rows: Sequence[Mapping[str, Any]], better: tuple[str, float], worse: tuple[str, float], *,
            epoch: int = -1) -> dict[str, Any]:
    """Paired comparison of two units' test MSE at ``epoch`` (-1: the last), seed by seed (the same
    seed draws the same data for every scheme).

    Returns:
        ``n`` (seeds in both), ``wins`` (seeds where ``better``'s error is lower), ``win_fraction``,
        ``median_ratio`` (median over seeds of error(better) / error(worse)), and ``p_value``:
        the one-sided Wilcoxon signed-rank test of "``better``'s error is lower" (scipy); with no
        ties its smallest possible value is ``2^-n``.
    """
    from scipy import stats

    where = "kglm.seq2seq.compare"
    groups = _groups(rows, where)
    epoch = checks.integer(epoch, "epoch", where)
    units = []
    for name, unit in (("better", better), ("worse", worse)):
        if not isinstance(unit, (tuple, list)) or len(unit) != 2 or tuple(unit) not in groups:
            raise checks.fail(name, f"one of the (scheme, scale) units in rows {sorted(groups)}", unit, where)
        units.append({r["seed"]: r["test_error_curve"] for r in groups[tuple(unit)]})
    seeds = sorted(set(units[0]) & set(units[1]))
    if not seeds:
        raise checks.fail("rows", "the two units to share at least one seed", "no common seed", where)
    length = len(units[0][seeds[0]])
    if not -length <= epoch < length:
        raise checks.fail("epoch", f"an integer in [{-length}, {length - 1}]", epoch, where)
    a = np.array([units[0][s][epoch] for s in seeds], float)
    b = np.array([units[1][s][epoch] for s in seeds], float)
    p = float(stats.wilcoxon(a, b, alternative="less").pvalue) if len(seeds) > 1 else float("nan")
    return {"n": len(seeds), "wins": int(np.sum(a < b)), "win_fraction": float(np.mean(a < b)),
            "median_ratio": float(np.median(a / b)), "p_value": p}
