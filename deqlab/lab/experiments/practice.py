"""Chapter 0, "Equilibrium models in practice": the experiments behind its pages.

- :func:`tanh_problem`: the single-layer tanh DEQ z = tanh(W z + U x + b) (001 Eq. 21) as an
  ``(f, z0, args)`` triple, the common test problem of the chapter;
- :func:`weight_tied_depth`: the same layer as a weight-tied network unrolled to depth L (003
  Eq. 3), converging to the equilibrium (003 Eq. 4);
- :func:`solver_race`: Picard, Anderson and Broyden on one problem, residual against NFE;
- :func:`memory_curve`: compiled memory of one gradient step, implicit against unrolled backward;
- :func:`train_digits`: a small DEQ classifier trained end to end with optax on the offline digits;
- :func:`train_linear_digits`: the baseline it has to beat, logistic regression on the same data.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from deqlab import ensembles
from deqlab.backward import Implicit, Phantom, Unrolled, fixed_point
from deqlab.lab import data
from deqlab.nn import DEQ, TanhCell, capture_solver_stats
from deqlab.precision import PrecisionWarning
from deqlab.solvers import Anderson, Solution, get_solver, solve

__all__ = [
    "Problem",
    "tanh_map",
    "tanh_problem",
    "exact_fixed_point",
    "error_over_tol",
    "weight_tied_depth",
    "depth_to_reach",
    "solver_race",
    "memory_curve",
    "parameter_gradient",
    "phantom_gradient_errors",
    "DigitsClassifier",
    "train_digits",
    "train_linear_digits",
    "warm_start_training",
    "accuracy_against_budget",
]


def tanh_map(z, w, u, b, x):
    """f(z; W, U, b, x) = tanh(z W^T + x U^T + b) on a batch of rows (001 Eq. 21, phi = tanh)."""
    return jnp.tanh(z @ w.T + x @ u.T + b)


class Problem(NamedTuple):
    """A fixed-point problem ``f(z, *args)`` with its initial guess."""

    f: Callable[..., Any]
    z0: jax.Array
    args: tuple


def tanh_problem(key: jax.Array, *, width: int = 64, batch: int = 16, in_features: int = 16,
                 ensemble: str = "orthogonal", scale: float = 0.9, input_scale: float = 1.0,
                 dtype=jnp.float32) -> Problem:
    """A batch of tanh-DEQ equilibria: W from ``ensemble`` at ``scale`` = sqrt(V), U Gaussian with
    variance input_scale^2 / in_features, b = 0, x standard normal; z0 = 0.

    A small ``input_scale`` keeps tanh in its linear regime, where the Jacobian at the fixed point
    is close to W and the iteration is as slow as the spectral radius of W says.
    """
    k_w, k_u, k_x = jax.random.split(key, 3)
    w = ensembles.sample(ensemble, k_w, width, scale, dtype)
    u = input_scale * jax.random.normal(k_u, (width, in_features), dtype) / math.sqrt(in_features)
    b = jnp.zeros((width,), dtype)
    x = jax.random.normal(k_x, (batch, in_features), dtype)
    return Problem(tanh_map, jnp.zeros((batch, width), dtype), (w, u, b, x))


def exact_fixed_point(problem: Problem, *, max_steps: int = 50) -> np.ndarray:
    """The fixed points of a :func:`tanh_problem` in float64, by Newton's method: the reference
    against which a solve's delivered error is measured.

    Newton's step on g(z) = f(z) - z solves (J - I) dz = -g with J = diag(1 - f(z)^2) W, per
    sample; it stops when every sample's max-abs residual is below 1e-13.

    Args:
        problem: a :func:`tanh_problem` (its args are (W, U, b, x)).
        max_steps: Newton steps allowed (>= 1).

    Returns:
        z*, float64, shape ``(batch, width)``.

    Raises:
        ValueError: ``max_steps`` < 1, or ``problem`` is not a tanh problem.
        RuntimeError: Newton's method did not converge within ``max_steps`` (the message gives the
            worst residual).

    Example:
        >>> import jax
        >>> from deqlab.lab.experiments import practice
        >>> problem = practice.tanh_problem(jax.random.PRNGKey(0), width=8, batch=2, scale=0.5)
        >>> z = practice.exact_fixed_point(problem)
        >>> bool(abs(np.tanh(z @ np.asarray(problem.args[0], np.float64).T
        ...                  + np.asarray(problem.args[3], np.float64) @ np.asarray(problem.args[1], np.float64).T)
        ...          - z).max() < 1e-12)
        True
    """
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"exact_fixed_point: `max_steps` must be an integer >= 1, got {max_steps!r}.")
    if problem.f is not tanh_map or len(problem.args) != 4:
        raise ValueError("exact_fixed_point: `problem` must be a practice.tanh_problem (f = tanh_map, "
                         f"args (W, U, b, x)), got f={getattr(problem.f, '__name__', problem.f)!r} "
                         f"with {len(problem.args)} args.")
    w, u, b, x = (np.asarray(a, np.float64) for a in problem.args)
    drive = x @ u.T + b
    z = np.zeros((x.shape[0], w.shape[0]))
    eye = np.eye(w.shape[0])
    for _ in range(max_steps):
        fz = np.tanh(z @ w.T + drive)
        g = fz - z
        if np.max(np.abs(g)) < 1e-13:
            return z
        jacobian = (1.0 - fz**2)[:, :, None] * w[None]
        z = z - np.linalg.solve(jacobian - eye, g[..., None])[..., 0]
    worst = float(np.max(np.abs(np.tanh(z @ w.T + drive) - z)))
    raise RuntimeError(f"exact_fixed_point: Newton's method did not converge in {max_steps} steps "
                       f"(worst max-abs residual {worst:.1e}).")


def error_over_tol(value: Any, exact: np.ndarray, tol: float) -> float:
    """The worst sample's delivered error in units of ``tol``, in the measure that
    ``stop="error"`` bounds: each sample's max-abs error over max(1, the largest magnitude of its
    entries of z*).

    Args:
        value: the solve's value, shape ``(batch, width)``.
        exact: the reference fixed points (:func:`exact_fixed_point`), the same shape.
        tol: the tolerance (> 0).

    Returns:
        max over samples of ``max|value - exact| / max(1, max|exact|) / tol``, a Python float.

    Raises:
        ValueError: ``tol`` not > 0, or shapes that differ.

    Example:
        >>> import numpy as np
        >>> from deqlab.lab.experiments import practice
        >>> exact = np.array([[0.5, 0.2], [4.0, 1.0]])
        >>> round(practice.error_over_tol(exact + np.array([[1e-5, 0.0], [2e-5, 0.0]]), exact, 1e-5), 6)  # 1e-5 / 1, 2e-5 / 4
        1.0
    """
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol > 0:
        raise ValueError(f"error_over_tol: `tol` must be a number > 0, got {tol!r}.")
    value, exact = np.asarray(value, np.float64), np.asarray(exact, np.float64)
    if value.shape != exact.shape:
        raise ValueError(f"error_over_tol: `value` has shape {value.shape} and `exact` {exact.shape}; they must match.")
    error = np.max(np.abs(value - exact), axis=1) / np.maximum(1.0, np.max(np.abs(exact), axis=1))
    return float(np.max(error)) / tol


def weight_tied_depth(problem: Problem, depth: int) -> jax.Array:
    """Distance ||z^[i] - z*|| / ||z*|| (mean over the batch) of the weight-tied network
    z^[i+1] = f(z^[i]) at every depth i = 0..depth (003 Eq. 3-4), z* from a tight Anderson solve.
    """
    f, z0, args = problem
    reference = solve(f, z0, *args, solver=Anderson(tol=10 * float(jnp.finfo(z0.dtype).eps), max_steps=10 * depth),
                      batch_axis=0).value

    def layer(z, _):
        return f(z, *args), z

    last, states = jax.lax.scan(layer, z0, None, length=depth)
    states = jnp.concatenate([states, last[None]], axis=0)
    distance = jnp.linalg.norm(states - reference, axis=-1) / jnp.linalg.norm(reference, axis=-1)
    return jnp.mean(distance, axis=1)


def depth_to_reach(distance: jax.Array, threshold: float) -> int | None:
    """First depth at which ``distance`` (from :func:`weight_tied_depth`) is below ``threshold``,
    or None if it never is."""
    below = np.flatnonzero(np.asarray(distance) < threshold)
    return int(below[0]) if below.size else None


def solver_race(problem: Problem, solvers: Sequence[Any] = ("picard", "anderson", "broyden"), *,
                tol: float = 1e-5, max_steps: int = 300) -> dict[str, Solution]:
    """Solve ``problem`` with each solver; every solver spends one f-evaluation per step, so each
    Solution's ``stats.residual_trace`` (mean over the batch) is the residual-vs-NFE curve.
    """
    results = {}
    for solver in solvers:
        config = get_solver(solver, tol=tol, max_steps=max_steps)
        run = jax.jit(lambda args, config=config: solve(problem.f, problem.z0, *args, solver=config, batch_axis=0,
                                                        on_failure="ignore"))  # results compared
        results[config.name if isinstance(solver, str) else repr(solver)] = run(problem.args)
    return results


def memory_curve(problem: Problem, steps: Sequence[int] = (10, 25, 50, 100), *,
                 backwards: Sequence[str] = ("implicit", "unrolled"),
                 solver: Any = "picard") -> dict[str, list[int]]:
    """Compiled temporary memory (bytes) of the gradient of sum(z*^2) w.r.t. (W, U, b), for each
    backward mode and forward iteration limit.

    ``backwards``: ``"implicit"``, ``"unrolled"`` or ``"checkpointed"`` (unrolled with
    ``checkpoint="sqrt"``: blocks of ceil(sqrt(steps)) iterations recomputed in the backward pass).

    ``jit(...).lower(...).compile().memory_analysis()`` reports what XLA will allocate; it works
    on every backend (on CPU, ``device.memory_stats()`` is None). The forward solve is run for exactly
    ``steps`` iterations (tolerance 0 is not allowed, so a tiny one is used and never met): the
    unrolled mode has to keep every iterate, the implicit mode only z*.
    """
    f, z0, args = problem
    modes = {"implicit": Implicit(), "unrolled": Unrolled(), "checkpointed": Unrolled(checkpoint="sqrt")}
    curves: dict[str, list[int]] = {}
    for backward in backwards:
        curves[backward] = []
        for max_steps in steps:
            config = get_solver(solver, tol=1e-30, max_steps=int(max_steps))

            def loss(params, x, config=config, mode=modes[backward]):
                z = fixed_point(f, z0, *params, x, solver=config, backward=mode, batch_axis=0,
                                on_failure="ignore").value
                return jnp.sum(z**2)

            with warnings.catch_warnings():  # the unreachable tolerance is the point here
                warnings.simplefilter("ignore", PrecisionWarning)
                compiled = jax.jit(jax.grad(loss)).lower(args[:3], args[3]).compile()
            curves[backward].append(int(compiled.memory_analysis().temp_size_in_bytes))
    return curves


def parameter_gradient(problem: Problem, *, backward: Any = "implicit", **options: Any):
    """Gradient of sum(z*^2) w.r.t. the parameters (W, U, b) of a :func:`tanh_problem`."""
    f, z0, args = problem
    return _parameter_gradient(tuple(args[:3]), z0, args[3], f=f, backward=backward,
                               options=tuple(sorted(options.items())))


@functools.partial(jax.jit, static_argnames=("f", "backward", "options"))
def _parameter_gradient(params, z0, x, *, f, backward, options):
    # the problem's arrays are arguments, not constants: problems of equal shapes share one compile
    def loss(params):
        z = fixed_point(f, z0, *params, x, backward=backward, batch_axis=0, **dict(options)).value
        return jnp.sum(z**2)

    return jax.grad(loss)(params)


def phantom_gradient_errors(problem: Problem, steps: Sequence[int], *, damping: float = 0.5,
                            tol: float = 1e-10, max_steps: int = 500) -> list[float]:
    """Relative error of the phantom gradient with k damped steps (Geng et al. 2021), for each k in
    ``steps``, against the implicit gradient of 003 Theorem 1."""
    options = dict(solver=Anderson(tol=tol, max_steps=max_steps))
    exact = parameter_gradient(problem, backward="implicit", **options)
    norm = jnp.sqrt(sum(jnp.sum(g**2) for g in exact))
    errors = []
    for k in steps:
        approx = parameter_gradient(problem, backward=Phantom(steps=int(k), damping=damping), **options)
        errors.append(float(jnp.sqrt(sum(jnp.sum((a - e) ** 2) for a, e in zip(approx, exact))) / norm))
    return errors


class DigitsClassifier(nnx.Module):
    """x -> DEQ(tanh cell) -> linear readout, for the 8x8 digits (64 inputs, 10 classes)."""

    def __init__(self, *, width: int = 64, ensemble: str = "orthogonal", scale: float | None = None,
                 solver: Any = "anderson", tol: float | None = None, max_steps: int = 50,
                 backward: Any = "implicit", rngs: nnx.Rngs):
        self.deq = DEQ(TanhCell(width, 64, ensemble=ensemble, scale=scale, rngs=rngs),
                       solver=solver, tol=tol, max_steps=max_steps, backward=backward)
        self.readout = nnx.Linear(width, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.readout(self.deq(x))


def _digits():
    x_train, y_train = data.load_dataset("digits", split="train")
    x_test, y_test = data.load_dataset("digits", split="test")
    return jnp.asarray(x_train), jnp.asarray(y_train), jnp.asarray(x_test), jnp.asarray(y_test)


def train_digits(*, epochs: int = 10, batch_size: int = 64, learning_rate: float = 3e-3,
                 cosine_decay: bool = False, clip_norm: float | None = None,
                 seed: int = 0, progress: bool = True, **model_options: Any):
    """Train :class:`DigitsClassifier` with Adam on the offline digits (float32).

    ``cosine_decay``: decay the learning rate to zero over the run (``optax.cosine_decay_schedule``);
    ``clip_norm``: clip each gradient to this global norm first (``optax.clip_by_global_norm``).

    Returns:
        ``(model, history)``; ``history`` holds per-epoch lists ``loss``, ``train_accuracy``,
        ``test_accuracy``, ``solver_steps`` (mean forward iterations), ``converged`` (fraction
        of training samples whose forward solve converged) and ``backward_warnings`` (how many
        :class:`~deqlab.backward.BackwardWarning` the epoch's training steps emitted: failed
        forward or adjoint solves).
    """
    from tqdm import tqdm

    from deqlab.backward import BackwardWarning

    x_train, y_train, x_test, y_test = _digits()
    model = DigitsClassifier(rngs=nnx.Rngs(seed), **model_options)
    n_batches = len(x_train) // batch_size
    rate = optax.cosine_decay_schedule(learning_rate, epochs * n_batches) if cosine_decay else learning_rate
    tx = optax.adam(rate)
    if clip_norm is not None:
        tx = optax.chain(optax.clip_by_global_norm(clip_norm), tx)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    # The warnings counted below are raised from inside the jitted step: under jit the default
    # "warn" puts nothing in the program (deqlab.failures), so the training steps opt into
    # "callback"; the returned model has its own policy back.
    policy = model.deq.on_failure

    @nnx.jit
    def train_step(model, optimizer, x, y):
        @capture_solver_stats
        def logits_and_stats(model):
            return model(x)

        def loss_fn(model):
            logits, stats = logits_and_stats(model)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), (logits, stats)

        (loss, (logits, stats)), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        (call,) = stats["deq"]
        return loss, jnp.mean(jnp.argmax(logits, -1) == y), (call["steps_mean"], call["converged_fraction"])

    @nnx.jit
    def accuracy(model, x, y):
        return jnp.mean(jnp.argmax(model(x), -1) == y)

    rng = np.random.default_rng(seed)
    keys = ("loss", "train_accuracy", "test_accuracy", "solver_steps", "converged", "backward_warnings")
    history: dict[str, list[float]] = {k: [] for k in keys}
    bar = tqdm(range(epochs), desc="epochs", disable=not progress)
    try:
        for _ in bar:
            order = rng.permutation(len(x_train))
            sums = np.zeros(4)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", BackwardWarning)
                model.deq.on_failure = "callback" if policy == "warn" else policy
                for i in range(n_batches):
                    idx = order[i * batch_size:(i + 1) * batch_size]
                    loss, acc, (steps, converged) = train_step(model, optimizer, x_train[idx], y_train[idx])
                    sums += [float(loss), float(acc), float(steps), float(converged)]
                model.deq.on_failure = policy
                test_acc = float(accuracy(model, x_test, y_test))
                jax.effects_barrier()  # the warnings come from host callbacks (on_failure="callback")
            n_warnings = sum(issubclass(w.category, BackwardWarning) for w in caught)
            for w in caught:  # other warnings are not ours to swallow
                if not issubclass(w.category, BackwardWarning):
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            loss, train_acc, steps, converged = sums / n_batches
            for k, v in zip(keys, (loss, train_acc, test_acc, steps, converged, n_warnings)):
                history[k].append(float(v))
            bar.set_postfix(loss=f"{loss:.3f}", test_acc=f"{test_acc:.3f}", steps=f"{steps:.1f}")
    finally:
        model.deq.on_failure = policy
    return model, history


def train_linear_digits(*, epochs: int = 200, learning_rate: float = 0.05,
                        weight_decay: float = 1e-4) -> dict[str, list[float]]:
    """Multinomial logistic regression on the same digits split as :func:`train_digits`: the
    baseline a DEQ classifier has to beat.

    Full-batch Adam on the cross-entropy plus ``weight_decay * ||W||^2`` (the 64x10 weights;
    the bias is not decayed), from zero weights: the problem is convex and the start fixed, so
    there is no seed. One step per epoch; the whole run is one compiled ``lax.scan``.

    Returns:
        per-epoch lists ``loss`` (training cross-entropy, without the penalty),
        ``train_accuracy`` and ``test_accuracy``.
    """
    x_train, y_train, x_test, y_test = _digits()
    params = {"w": jnp.zeros((x_train.shape[1], 10)), "b": jnp.zeros((10,))}
    tx = optax.adam(learning_rate)
    opt_state = tx.init(params)

    def logits(params, x):
        return x @ params["w"] + params["b"]

    def loss_fn(params):
        ce = optax.softmax_cross_entropy_with_integer_labels(logits(params, x_train), y_train).mean()
        return ce + weight_decay * jnp.sum(params["w"] ** 2), ce

    def accuracy(params, x, y):
        return jnp.mean(jnp.argmax(logits(params, x), -1) == y)

    @jax.jit
    def epoch(carry, _):
        params, opt_state = carry
        (_, ce), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return (params, opt_state), (ce, accuracy(params, x_train, y_train), accuracy(params, x_test, y_test))

    _, (loss, train_acc, test_acc) = jax.lax.scan(epoch, (params, opt_state), None, length=epochs)
    return {"loss": [float(v) for v in loss], "train_accuracy": [float(v) for v in train_acc],
            "test_accuracy": [float(v) for v in test_acc]}


def warm_start_training(*, epochs: int = 2, batch_size: int = 32, learning_rate: float = 3e-3,
                        clip_norm: float | None = 1.0, seed: int = 0, timed: bool = False,
                        **model_options: Any) -> dict[str, Any]:
    """Train two copies of :class:`DigitsClassifier` in lockstep, one cold-started, one warm-started.

    Both start from the same parameters and see the same batches in the same order. The cold copy
    solves every batch from ``z0 = 0``; the warm copy starts each sample at its equilibrium of the
    previous epoch, kept in a :class:`deqlab.nn.FixedPointCache` by sample index (looked up and
    updated inside its jitted step). After each epoch both evaluate the test set: the cold copy
    from zeros, the warm copy from its previous evaluation's equilibria (the test samples' own
    cache), and, once more, from the equilibria it has just computed (a repeat with the same
    parameters, the limit of a warm start).

    Args:
        epochs, batch_size, learning_rate, clip_norm, seed: of the run (Adam, constant rate).
        timed: also record the wall time of every training step and evaluation (the two copies'
            calls alternate, so load from other processes hits both alike).
        **model_options: of :class:`DigitsClassifier` (``width``, ``scale``, ``solver``, ``tol``,
            ``max_steps``, ...).

    Returns:
        A dict with, per epoch, the mean forward solver steps per sample of the training steps
        (``train_steps``: ``{"cold": [...], "warm": [...]}``) and of the test evaluations
        (``eval_steps``, with ``"repeat"``), the forward evaluations of f per epoch
        (``train_nfe``), the test accuracies (``test_accuracy``), the two trained models
        (``models``) and, with ``timed``, the step times in seconds (``train_times``,
        ``eval_times``).
    """
    from deqlab.nn import FixedPointCache

    x_train, y_train, x_test, y_test = _digits()
    models = {name: DigitsClassifier(rngs=nnx.Rngs(seed), **model_options) for name in ("cold", "warm")}
    tx = optax.adam(learning_rate)
    if clip_norm is not None:
        tx = optax.chain(optax.clip_by_global_norm(clip_norm), tx)
    optimizers = {name: nnx.Optimizer(m, tx, wrt=nnx.Param) for name, m in models.items()}
    width = models["cold"].deq.cell.width

    def update(model, optimizer, x, y, z0):
        def loss_fn(model):
            z, sol = model.deq(x, z0, return_solution=True)
            loss = optax.softmax_cross_entropy_with_integer_labels(model.readout(z), y).mean()
            return loss, (z, sol.stats.steps, sol.stats.nfe)

        (_, (z, steps, nfe)), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        return z, jnp.mean(steps), nfe

    @nnx.jit
    def cold_step(model, optimizer, x, y):
        return update(model, optimizer, x, y, None)[1:]

    @nnx.jit
    def warm_step(model, optimizer, cache, indices, x, y):
        z, steps, nfe = update(model, optimizer, x, y, cache.lookup(indices))
        return steps, nfe, cache.update(indices, z)

    @nnx.jit
    def evaluate(model, x, y, z0):
        z, sol = model.deq(x, z0, return_solution=True)
        return jnp.mean(jnp.argmax(model.readout(z), -1) == y), z, jnp.mean(sol.stats.steps)

    def clock(fn, *args):
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        return out, time.perf_counter() - start

    cache = FixedPointCache.create(len(x_train), (width,))
    z_test_zero = jnp.zeros((len(x_test), width), jnp.float32)
    z_test_warm = z_test_zero
    rng = np.random.default_rng(seed)
    n_batches = len(x_train) // batch_size
    names = ("cold", "warm")
    out = {"train_steps": {n: [] for n in names}, "train_nfe": {n: [] for n in names},
           "eval_steps": {n: [] for n in names + ("repeat",)}, "test_accuracy": {n: [] for n in names},
           "train_times": {n: [] for n in names}, "eval_times": {n: [] for n in names + ("repeat",)}}
    for _ in range(epochs):
        order = rng.permutation(len(x_train))
        sums = {n: np.zeros(2) for n in names}
        for i in range(n_batches):
            idx = order[i * batch_size:(i + 1) * batch_size]
            x, y = x_train[idx], y_train[idx]
            (steps, nfe), t_cold = clock(cold_step, models["cold"], optimizers["cold"], x, y)
            sums["cold"] += [float(steps), int(nfe)]
            (steps, nfe, cache), t_warm = clock(warm_step, models["warm"], optimizers["warm"], cache,
                                                jnp.asarray(idx), x, y)
            sums["warm"] += [float(steps), int(nfe)]
            if timed:
                out["train_times"]["cold"].append(t_cold)
                out["train_times"]["warm"].append(t_warm)
        for n in names:
            out["train_steps"][n].append(sums[n][0] / n_batches)
            out["train_nfe"][n].append(int(sums[n][1]))
        (acc, _, steps), t_cold = clock(evaluate, models["cold"], x_test, y_test, z_test_zero)
        out["test_accuracy"]["cold"].append(float(acc))
        out["eval_steps"]["cold"].append(float(steps))
        (acc, z_test_warm, steps), t_warm = clock(evaluate, models["warm"], x_test, y_test, z_test_warm)
        out["test_accuracy"]["warm"].append(float(acc))
        out["eval_steps"]["warm"].append(float(steps))
        (_, _, steps), t_repeat = clock(evaluate, models["warm"], x_test, y_test, z_test_warm)
        out["eval_steps"]["repeat"].append(float(steps))
        if timed:
            for n, t in zip(names + ("repeat",), (t_cold, t_warm, t_repeat)):
                out["eval_times"][n].append(t)
    if not timed:
        del out["train_times"], out["eval_times"]
    out["models"] = models
    return out


def accuracy_against_budget(model: DigitsClassifier, budgets: Sequence[int]) -> dict[str, list]:
    """Test accuracy and mean solver steps of a trained :class:`DigitsClassifier` at each forward
    iteration limit of ``budgets``, from one compiled function (the limit is a traced argument of
    ``model.deq``, :class:`deqlab.solvers.Budget`).

    Returns:
        ``{"budget", "accuracy", "steps", "compilations"}``: lists over ``budgets``, and how many
        times the evaluation was traced (1).
    """
    _, _, x_test, y_test = _digits()
    model = nnx.clone(model)
    model.deq.on_failure = "ignore"  # small budgets stop short of the tolerance: that is the point
    traces = []

    @nnx.jit
    def evaluate(model, x, y, max_steps):
        traces.append(1)  # once per trace
        z, sol = model.deq(x, max_steps=max_steps, return_solution=True)
        return jnp.mean(jnp.argmax(model.readout(z), -1) == y), jnp.mean(sol.stats.steps)

    out = {"budget": list(budgets), "accuracy": [], "steps": []}
    for k in budgets:
        acc, steps = evaluate(model, x_test, y_test, k)
        out["accuracy"].append(float(acc))
        out["steps"].append(float(steps))
    out["compilations"] = len(traces)
    return out
