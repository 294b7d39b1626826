"""Keeping a DEQ stable in training: remedies for a forward solver that stops converging, measured.

The classifier is the one of :mod:`deqlab.lab.experiments.nonlinear.training` (001 §4.1: flatten, the
residual tanh DEQ ``z* = tanh(W z* + b) + U x``, a dense readout), trained with every seed of a
configuration vmapped into one compiled program, from a scale ``sqrt(V)`` of ``W`` where chapter
3's theory (:func:`deqlab.theory.meanfield.spectral_radius`, 001 Eq. 29-30) predicts the
equilibrium to be unstable at initialisation. Each run applies one remedy (:data:`REMEDIES`):

- ``"none"``: the baseline, implicit gradient (003 Eq. 11).
- ``"jacobian"``: the loss plus ``gamma * ||df/dz||_F^2 / N`` at the detached equilibrium, by
  Hutchinson's estimator with ``n_probes`` probes (Bai, Koltun & Kolter 2021;
  :func:`deqlab.stability.jacobian_penalty`).
- ``"spectral"``: ``W`` replaced by ``target * W / sigma(W)`` with a carried power iteration
  (Miyato et al. 2018; :class:`deqlab.nn.normalization.SpectralNorm`).
- ``"correction"``: the loss plus the losses of ``K`` intermediate solver iterates
  (Bai et al. 2022; :class:`deqlab.nn.DEQ` ``correction``).
- ``"jacobian_free"``, ``"phantom"``, ``"shine"``: the gradient methods of :mod:`deqlab.backward`
  (Fung et al. 2022; Geng et al. 2021; Ramzi et al. 2022, which needs the Broyden forward solver).

Per seed and epoch the runs record the training loss, test error, the fraction of training
samples whose forward solve converged, the mean solver steps (NFE per training step is that plus
one), and the **monitor**: the spectral radius of ``df/dz`` at ``z*`` for a fixed batch of test
images, by power iteration with Jacobian-vector products (:func:`deqlab.stability.spectral_radius`),
its median over the batch; a run warns (:class:`StabilityWarning`) when it exceeds
``warn_radius``. :func:`gradient_errors` compares the gradient methods with the exact implicit
gradient on one batch, with their memory and their number of function evaluations.
"""

from __future__ import annotations

import functools
import time
import warnings
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from deqlab import checks, ensembles, stability
from deqlab.backward import SHINE, Implicit, JacobianFree, Phantom, Unrolled
from deqlab.lab import data
from deqlab.lab.experiments.nonlinear.training import ResidualTanhCell
from deqlab.nn import DEQ
from deqlab.nn.normalization import SpectralNorm, update_estimates
from deqlab.solvers import Anderson, get_solver

__all__ = ["REMEDIES", "x64", "StabilityWarning", "StabilisedClassifier", "train_remedy", "run_stabilisation_sweep",
           "summarize", "gradient_errors", "predicted_radius"]

REMEDIES = {
    "none": "implicit gradient, no remedy (003 Eq. 11)",
    "jacobian": "Jacobian regularisation (Bai, Koltun & Kolter 2021)",
    "spectral": "spectral normalisation of W (Miyato et al. 2018)",
    "correction": "fixed-point correction (Bai et al. 2022)",
    "jacobian_free": "Jacobian-free backprop (Fung et al. 2022)",
    "phantom": "phantom gradient (Geng et al. 2021)",
    "shine": "SHINE, Broyden's inverse reused (Ramzi et al. 2022)",
}
"""The remedies of :func:`train_remedy`, with their sources."""

_DEFAULTS = dict(width=32, epochs=4, batch_size=64, learning_rate=1e-2, tol=1e-4, max_steps=40,
                 failure_tolerance=0.01, gamma=1.0, n_probes=1, target=0.9, correction=2, correction_stride=4,
                 correction_weight=0.5, phantom_steps=5, phantom_damping=0.5, monitor_size=128, monitor_steps=20,
                 warn_radius=0.95)


def x64():
    """Context manager: float64 inside the block (``jax.enable_x64(True)`` where jax has it,
    ``jax.experimental.enable_x64()`` before), float32 again after it."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64

    return enable_x64()


class StabilityWarning(RuntimeWarning):
    """The monitored spectral radius of ``df/dz`` at the equilibrium approached 1."""


def _backward(remedy, o):
    if remedy == "jacobian_free":
        return JacobianFree()
    if remedy == "phantom":
        return Phantom(steps=o["phantom_steps"], damping=o["phantom_damping"])
    if remedy == "shine":
        return SHINE()
    return Implicit()


class StabilisedClassifier(nnx.Module):
    """flatten -> DEQ(:class:`~deqlab.lab.experiments.nonlinear.training.ResidualTanhCell`) -> dense,
    with ``remedy``'s changes to the layer (spectral normalisation of ``W``, the backward method,
    the correction iterates). ``model(x)`` returns ``(logits, solution, iterates)``; ``iterates``
    is None unless ``remedy == "correction"``."""

    def __init__(self, in_features: int, *, remedy: str, ensemble: str, scale: float, classes: int = 10,
                 rngs: nnx.Rngs, **options: Any):
        o = {**_DEFAULTS, **options}
        width = o["width"]
        self.remedy = checks.choice(remedy, "remedy", tuple(REMEDIES), "StabilisedClassifier")
        cell = ResidualTanhCell(width, in_features, ensemble=ensemble, scale=scale, rngs=rngs)
        if remedy == "spectral":
            cell.recurrent = SpectralNorm(cell.recurrent, target=o["target"], rngs=rngs)
        self.deq = DEQ(cell, solver="broyden" if remedy == "shine" else "anderson", tol=o["tol"],
                       max_steps=o["max_steps"], backward=_backward(remedy, o),
                       on_failure="ignore",  # failures are counted from the solution instead
                       correction=o["correction"] if remedy == "correction" else 0,
                       correction_stride=o["correction_stride"])
        self.readout = nnx.Linear(width, classes, rngs=rngs)

    def __call__(self, x: jax.Array):
        x = x.reshape(x.shape[0], -1)
        if self.remedy == "correction":
            z, sol, iterates = self.deq(x, return_solution=True, return_iterates=True)
            return self.readout(z), sol, iterates
        z, sol = self.deq(x, return_solution=True)
        return self.readout(z), sol, None

    def equilibrium_map(self):
        """``(f, args)`` with ``f(z, *args)`` the layer's map, for the monitor."""
        graphdef, state = nnx.split(self.deq.cell)

        def f(z, state, x):
            return nnx.merge(graphdef, state)(z, x)

        return f, state


def _check(where, remedy, family, scale, seeds, options):
    checks.choice(remedy, "remedy", tuple(REMEDIES), where)
    checks.choice(family, "family", ensembles.ENSEMBLES, where)
    scale = checks.number(scale, "scale", where, lower=0.0)
    seeds = checks.seed_list(seeds, "seeds", where)
    unknown = set(options) - set(_DEFAULTS)
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {sorted(unknown)}; valid options are {sorted(_DEFAULTS)}.")
    o = {**_DEFAULTS, **options}
    for name in ("width", "epochs", "batch_size", "max_steps", "n_probes", "correction", "correction_stride",
                 "phantom_steps", "monitor_size", "monitor_steps"):
        o[name] = checks.positive_int(o[name], name, where)
    for name in ("learning_rate", "tol", "target", "warn_radius"):
        o[name] = checks.positive_number(o[name], name, where)
    for name in ("gamma", "correction_weight"):
        o[name] = checks.number(o[name], name, where, lower=0.0)
    o["phantom_damping"] = checks.unit_interval(o["phantom_damping"], "phantom_damping", where)
    o["failure_tolerance"] = checks.number(o["failure_tolerance"], "failure_tolerance", where, lower=0.0,
                                           upper=1.0, upper_open=True)
    return scale, seeds, o


def _frozen(o):
    return tuple(sorted(o.items()))


@functools.lru_cache(maxsize=16)
def _program(remedy, in_features, n_batches, frozen_options):
    """Graph, optimiser and the compiled, seed-vmapped epoch of one remedy (shared by every scale
    and family: they differ only in the initial arrays). Parameters (``nnx.Param``) are trained;
    the rest of the state (the spectral norm's power iterate) is advanced after each step."""
    o = dict(frozen_options)
    # the graph and the state's structure only: an abstract model (nnx.eval_shape) makes no array and
    # compiles no initialiser (the seeds' models are initialised in train_remedy)
    template = nnx.eval_shape(lambda: StabilisedClassifier(in_features, remedy=remedy, ensemble="gaussian", scale=1.0,
                                                           rngs=nnx.Rngs(0), **o))
    graphdef, params, rest = nnx.split(template, nnx.Param, ...)
    p_def = jax.tree_util.tree_structure(params)
    r_def = jax.tree_util.tree_structure(rest)
    tx = optax.scale_by_adam(b1=0.9)  # 001 §4.1: Adam with momentum 0.9

    def model_of(p, r):
        return nnx.merge(graphdef, jax.tree_util.tree_unflatten(p_def, p), jax.tree_util.tree_unflatten(r_def, r))

    def loss_fn(p, r, x, y, key):
        model = model_of(p, r)
        logits, sol, iterates = model(x)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        objective = loss
        if remedy == "jacobian":
            f, args = model.equilibrium_map()
            x_flat = x.reshape(x.shape[0], -1)
            # Bai et al. 2021: the penalty at the detached equilibrium, divided by the width
            penalty = stability.jacobian_penalty(f, jax.lax.stop_gradient(sol.value), args, x_flat, key=key,
                                                 n_probes=o["n_probes"], batch_axis=0)
            objective = objective + o["gamma"] * jnp.mean(penalty) / o["width"]
        if remedy == "correction":
            k = iterates.shape[0]
            for i in range(k):
                # Bai et al. 2022: weights gamma^(K - k), the last iterate closest to z*
                weight = o["correction_weight"] ** (k - i)
                logits_i = model.readout(iterates[i])
                objective = objective + weight * optax.softmax_cross_entropy_with_integer_labels(logits_i, y).mean()
        steps = jnp.mean(sol.stats.steps.astype(jnp.float32))
        return objective, (loss, jnp.mean(sol.converged.astype(jnp.float32)), steps)

    def train_step(p, r, opt_state, x, y, key, learning_rate):
        (_, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, r, x, y, key)
        updates, opt_state = tx.update(grads, opt_state, p)
        p = optax.apply_updates(p, jax.tree_util.tree_map(lambda u: -learning_rate * u, updates))
        if remedy == "spectral":
            model = model_of(p, r)
            update_estimates(model, 1)  # Miyato et al. 2018, Algorithm 1: one power step per update
            r = jax.tree_util.tree_leaves(nnx.split(model, nnx.Param, ...)[2])
        return p, r, opt_state, aux

    def epoch(p, r, opt_state, key_data, epoch_index, learning_rate, x_train, y_train):
        key = jax.random.fold_in(jax.random.wrap_key_data(key_data), epoch_index)
        key_order, key_probes = jax.random.split(key)
        order = jax.random.permutation(key_order, x_train.shape[0])[: n_batches * o["batch_size"]]

        def step(carry, inputs):
            p, r, opt_state = carry
            idx, k = inputs
            p, r, opt_state, aux = train_step(p, r, opt_state, x_train[idx], y_train[idx], k, learning_rate)
            return (p, r, opt_state), aux

        (p, r, opt_state), (loss, converged, steps) = jax.lax.scan(
            step, (p, r, opt_state), (order.reshape(n_batches, o["batch_size"]), jax.random.split(key_probes, n_batches)))
        return p, r, opt_state, jnp.stack([jnp.mean(loss), jnp.mean(converged), jnp.mean(steps)])

    run_epoch = jax.jit(jax.vmap(epoch, in_axes=(0, 0, 0, 0, None, None, None, None)))
    single_step = jax.jit(train_step)
    return graphdef, p_def, r_def, tx, run_epoch, _evaluator(_FORWARD.get(remedy, "none"), in_features,
                                                              frozen_options), single_step


_FORWARD = {"spectral": "spectral", "shine": "shine"}
"""The remedies whose forward pass differs from the baseline's (the others share its evaluation
program: a gradient method or an extra loss term changes nothing in the forward solve)."""


@functools.lru_cache(maxsize=16)
def _evaluator(forward, in_features, frozen_options):
    """The compiled, seed-vmapped evaluation (test error and monitor) of a forward pass."""
    o = dict(frozen_options)
    template = nnx.eval_shape(lambda: StabilisedClassifier(in_features, remedy=forward, ensemble="gaussian", scale=1.0,
                                                           rngs=nnx.Rngs(0), **o))  # abstract, as in _program
    graphdef, params, rest = nnx.split(template, nnx.Param, ...)
    p_def = jax.tree_util.tree_structure(params)
    r_def = jax.tree_util.tree_structure(rest)

    def model_of(p, r):
        return nnx.merge(graphdef, jax.tree_util.tree_unflatten(p_def, p), jax.tree_util.tree_unflatten(r_def, r))

    def evaluate(p, r, x_test, y_test, key_data):
        """Test error, and the monitor on the first ``monitor_size`` test images."""
        model = model_of(p, r)
        logits, sol, _ = model(x_test)
        error = 1.0 - jnp.mean(jnp.argmax(logits, -1) == y_test)
        f, args = model.equilibrium_map()
        m = o["monitor_size"]
        radius = stability.spectral_radius(f, sol.value[:m], args, x_test[:m].reshape(m, -1),
                                           key=jax.random.wrap_key_data(key_data), steps=o["monitor_steps"],
                                           batch_axis=0)
        return jnp.stack([error, jnp.median(radius)])

    return jax.jit(jax.vmap(evaluate, in_axes=(0, 0, None, None, 0)))


def predicted_radius(family: str, scale: float, sigma_x2: float, mean_x: float = 0.0) -> float:
    """Chapter 3's large-N spectral radius of ``df/dz`` at the equilibrium of ``tanh(W z) + x`` with
    ``W = scale * W0`` (001 Eq. 29-30, :func:`deqlab.theory.meanfield.spectral_radius`), for an
    input ``U x`` with entries of variance ``sigma_x2`` and mean ``mean_x``."""
    from deqlab.theory import meanfield

    return float(meanfield.spectral_radius("tanh", family, scale * scale, sigma_x2, mean_x))


def train_remedy(remedy: str, scale: float, seeds: Sequence[int], *, family: str = "gaussian",
                 dataset: str = "digits", train_size: int | None = None, **options: Any) -> dict[str, Any]:
    """Train one :class:`StabilisedClassifier` per seed with ``remedy``, all seeds in one program.

    Args:
        remedy: one of :data:`REMEDIES`.
        scale: sqrt(V) of the initial ``W``, >= 0.
        seeds: distinct integers >= 0 (initialisation, batch order, probes).
        family: ensemble of ``W`` (``deqlab.ensembles.ENSEMBLES``).
        dataset: ``"digits"`` or ``"mnist"``.
        train_size: use only the first ``train_size`` training samples (None: all).
        **options: ``width`` (32), ``epochs`` (4), ``batch_size`` (64), ``learning_rate`` (1e-2),
            ``tol`` (1e-4), ``max_steps`` (40), ``failure_tolerance`` (0.01); ``gamma`` (1.0) and
            ``n_probes`` (1) of the Jacobian penalty; ``target`` (0.9) of the spectral norm;
            ``correction`` (2), ``correction_stride`` (4), ``correction_weight`` (0.5);
            ``phantom_steps`` (5), ``phantom_damping`` (0.5); ``monitor_size`` (128 test images),
            ``monitor_steps`` (20 power steps), ``warn_radius`` (0.95).

    Returns:
        A JSON-able dict: per seed (lists) ``test_error`` (final), ``loss_curve``, ``test_error_curve``,
        ``converged_curve``, ``steps_curve`` (mean forward solver steps per training step),
        ``radius_curve`` (the monitor after each epoch), ``initial_radius``, ``solver_failed``,
        ``diverged``; and ``sigma_x2`` (the variance of the initial ``U x`` on the monitor batch,
        mean over seeds), ``predicted_radius`` (chapter 3's value for it), ``step_time`` (seconds
        per training step of all seeds together, in the fastest epoch after the first) and
        ``seeds``.

    Warns:
        StabilityWarning: when a seed's monitored radius exceeds ``warn_radius``.
    """
    where = "nonlinear.stabilisation.train_remedy"
    scale, seeds, o = _check(where, remedy, family, scale, seeds, options)
    checks.choice(dataset, "dataset", ("digits", "mnist"), where)
    x_train, y_train = data.load_dataset(dataset, split="train")
    x_test, y_test = data.load_dataset(dataset, split="test")
    if train_size is not None:
        train_size = checks.integer(train_size, "train_size", where, minimum=1, maximum=len(x_train))
        x_train, y_train = x_train[:train_size], y_train[:train_size]
    if o["batch_size"] > len(x_train):
        raise checks.fail("batch_size", f"at most the number of training samples ({len(x_train)})",
                          o["batch_size"], where)
    x_train, y_train, x_test, y_test = map(jnp.asarray, (x_train, y_train, x_test, y_test))
    if o["monitor_size"] > len(x_test):
        raise checks.fail("monitor_size", f"at most the number of test samples ({len(x_test)})",
                          o["monitor_size"], where)
    n_batches = len(x_train) // o["batch_size"]
    in_features = int(np.prod(x_train.shape[1:]))
    _, p_def, r_def, tx, run_epoch, run_evaluate, _ = _program(remedy, in_features, n_batches, _frozen(o))
    keys = jnp.stack([jax.random.key_data(jax.random.key(s)) for s in seeds])
    monitor_keys = jnp.stack([jax.random.key_data(jax.random.fold_in(jax.random.key(s), 2**31 - 1)) for s in seeds])

    def init(key_data):
        model = StabilisedClassifier(in_features, remedy=remedy, ensemble=family, scale=scale,
                                     rngs=nnx.Rngs(jax.random.wrap_key_data(key_data)), **o)
        _, params, rest = nnx.split(model, nnx.Param, ...)
        u_x = model.deq.cell.inject(x_test[: o["monitor_size"]].reshape(o["monitor_size"], -1))
        return jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(rest), jnp.var(u_x), jnp.mean(u_x)

    p, r, var_x, mean_x = jax.vmap(init)(keys)
    if jax.tree_util.tree_structure(p) != jax.tree_util.tree_structure(list(range(p_def.num_leaves))):
        raise AssertionError("the model's parameters do not match the compiled program's")
    opt_state = jax.vmap(tx.init)(p)
    initial = np.asarray(run_evaluate(p, r, x_test, y_test, monitor_keys))[:, 1]
    history = np.full((o["epochs"], len(seeds), 5), np.nan, np.float32)
    times = []
    for e in range(o["epochs"]):
        start = time.perf_counter()
        p, r, opt_state, metrics = run_epoch(p, r, opt_state, keys, e, jnp.float32(o["learning_rate"]), x_train,
                                             y_train)
        metrics = np.asarray(metrics)
        times.append(time.perf_counter() - start)
        evaluation = np.asarray(run_evaluate(p, r, x_test, y_test, monitor_keys))
        history[e] = np.concatenate([metrics[:, :1], evaluation[:, :1], metrics[:, 1:], evaluation[:, 1:]], axis=1)
    loss, error, converged, steps, radius = (history[..., i].T for i in range(5))  # each (seeds, epochs)
    worst = float(np.nanmax(np.concatenate([initial, radius.ravel()])))
    if worst > o["warn_radius"]:
        warnings.warn(f"{remedy}, sqrt(V) = {scale:g}: the spectral radius of df/dz at the equilibrium reached "
                      f"{worst:.3g} (> {o['warn_radius']:g}); the forward solve is near its stability limit.",
                      StabilityWarning, stacklevel=2)
    sigma_x2 = float(np.mean(var_x))
    # the fastest epoch after the first (which compiles): the least disturbed by other work on the machine
    step_time = float(np.min(times[1:]) / n_batches) if len(times) > 1 else float(times[0] / n_batches)
    return {
        "seeds": list(seeds),
        "test_error": error[:, -1].tolist(),
        "loss_curve": loss.tolist(),
        "test_error_curve": error.tolist(),
        "converged_curve": converged.tolist(),
        "steps_curve": steps.tolist(),
        "radius_curve": radius.tolist(),
        "initial_radius": initial.tolist(),
        "solver_failed": np.any(converged < 1.0 - o["failure_tolerance"], axis=1).tolist(),
        "diverged": (~np.isfinite(loss[:, -1])).tolist(),
        "sigma_x2": sigma_x2,
        "mean_x": float(np.mean(mean_x)),
        "predicted_radius": predicted_radius(family, scale, sigma_x2, float(np.mean(mean_x))),
        "step_time": step_time,
    }


def run_stabilisation_sweep(directory, *, remedies: Sequence[str] = tuple(REMEDIES),
                            scales: Sequence[float] = (1.5,), seeds: Sequence[int] = range(3),
                            family: str = "gaussian", dataset: str = "digits", train_size: int | None = None,
                            progress: bool = True, **options: Any) -> list[dict[str, Any]]:
    """:func:`train_remedy` for every (remedy, scale) through the resumable
    :func:`deqlab.lab.experiments.sweep.run_sweep` (one stored result per pair; finished pairs are
    read back). Returns one row per (remedy, scale): the configuration and the result."""
    from deqlab.lab.experiments import sweep

    where = "nonlinear.stabilisation.run_stabilisation_sweep"
    seeds = list(seeds)
    for remedy in remedies:
        checks.choice(remedy, "remedies", tuple(REMEDIES), where)
    scales = [checks.number(s, "scales", where, lower=0.0) for s in scales]
    _check(where, "none", family, 1.0, seeds, options)
    configs = [{"remedy": m, "scale": s, "family": family, "seeds": seeds, "dataset": dataset,
                "train_size": train_size, "options": {**_DEFAULTS, **options}} for s in scales for m in remedies]

    def unit(config):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", StabilityWarning)  # the rows carry the radii
            result = train_remedy(config["remedy"], config["scale"], config["seeds"], family=config["family"],
                                  dataset=config["dataset"], train_size=config["train_size"], **config["options"])
        return {"result": result}

    return sweep.run_sweep(unit, configs, directory, progress=progress, description="remedy x scale")


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (remedy, scale): ``n`` seeds, ``mean_error`` (final test error), ``failed_fraction``
    (runs whose solver failed in some epoch), ``diverged_fraction``, ``steps_first`` and
    ``steps_last`` (mean solver steps in the first and last epoch), ``radius_initial``,
    ``radius_final`` (mean over seeds of the monitor), ``predicted_radius``, ``step_time``."""
    out = []
    for row in rows:
        r = row["result"]
        steps = np.asarray(r["steps_curve"], float)
        radius = np.asarray(r["radius_curve"], float)
        out.append({"remedy": row["remedy"], "scale": row["scale"], "n": len(r["seeds"]),
                    "mean_error": float(np.mean(r["test_error"])),
                    "failed_fraction": float(np.mean(r["solver_failed"])),
                    "diverged_fraction": float(np.mean(r["diverged"])),
                    "steps_first": float(np.mean(steps[:, 0])), "steps_last": float(np.mean(steps[:, -1])),
                    "radius_initial": float(np.mean(r["initial_radius"])),
                    "radius_final": float(np.mean(radius[:, -1])),
                    "predicted_radius": r["predicted_radius"], "step_time": r["step_time"]})
    return out


def gradient_errors(scale: float, *, family: str = "gaussian", width: int = 32, batch: int = 64, seed: int = 0,
                    dataset: str = "digits", phantom_steps: int = 5, phantom_damping: float = 0.5,
                    max_steps: int = 200) -> dict[str, dict[str, float]]:
    """Each gradient method against the exact implicit gradient, on one batch, in float64.

    The model is an untrained :class:`StabilisedClassifier` (``remedy="none"``) at ``scale``, its
    parameters cast to float64; the loss is the cross-entropy of ``batch`` training images. The
    exact gradient is the implicit one with the forward and adjoint solves at ``tol = 1e-10``
    (run inside :func:`x64`; float32 is restored after). Methods: ``"implicit"``
    (Anderson, adjoint at the training tolerance 1e-4), ``"unrolled"`` (backprop through
    ``max_steps`` steps), ``"jacobian_free"``, ``"phantom"``, ``"shine"`` (Broyden forward).

    Returns:
        ``{method: {"error", "forward_converged", "memory", "backward_vjps"}}``: the relative error
        ``||g - g*|| / ||g*||`` of the gradient of every parameter; the fraction of the batch whose
        forward solve (the method's solver, at tol 1e-4) converged; ``memory``, the temporary bytes XLA allocates
        for the compiled gradient (``memory_analysis().temp_size_in_bytes``); ``backward_vjps``,
        every vector-Jacobian product with the layer in the backward pass, the one that maps the
        adjoint ``u`` to the parameter gradient included: implicit, the adjoint solve's evaluations
        (measured) + 1; unrolled, ``max_steps``; phantom, ``phantom_steps``; Jacobian-free, 1;
        SHINE, ``refine`` + 1 (its ``-B^T g`` needs none).
    """
    from deqlab.backward import adjoint_solve

    where = "nonlinear.stabilisation.gradient_errors"
    scale = checks.number(scale, "scale", where, lower=0.0)
    width = checks.positive_int(width, "width", where)
    batch = checks.positive_int(batch, "batch", where)
    x_all, y_all = data.load_dataset(dataset, split="train")
    if batch > len(x_all):
        raise checks.fail("batch", f"at most {len(x_all)}", batch, where)
    methods = {
        "implicit": (Implicit(), "anderson", 1e-4),
        "unrolled": (Unrolled(), "anderson", 1e-4),
        "jacobian_free": (JacobianFree(), "anderson", 1e-4),
        "phantom": (Phantom(steps=phantom_steps, damping=phantom_damping), "anderson", 1e-4),
        "shine": (SHINE(), "broyden", 1e-4),
    }
    out = {}
    with x64():
        x = jnp.asarray(x_all[:batch], jnp.float64)
        y = jnp.asarray(y_all[:batch])
        model = StabilisedClassifier(x.shape[1], remedy="none", width=width, ensemble=family, scale=scale,
                                     rngs=nnx.Rngs(seed))
        graphdef, params = nnx.split(model)
        params = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), params)

        def make_loss(backward, solver, tol):
            def loss(params):
                m = nnx.merge(graphdef, params)
                m.deq.backward = backward
                m.deq.solver = get_solver(solver, tol=tol, max_steps=max_steps)
                logits, _, _ = m(x)
                return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss

        def flat(tree):
            return jnp.concatenate([jnp.ravel(a) for a in jax.tree_util.tree_leaves(tree)])

        exact = flat(jax.jit(jax.grad(make_loss(Implicit(tol=1e-10), "anderson", 1e-10)))(params))

        @functools.lru_cache(maxsize=None)
        def converged_fraction(solver, tol):
            # the forward solve depends only on the solver, not on the backward method: one compile per solver
            def fraction(params):
                forward = nnx.merge(graphdef, params)
                forward.deq.solver = get_solver(solver, tol=tol, max_steps=max_steps)
                return jnp.mean(forward(x)[1].converged)
            return float(jax.jit(fraction)(params))

        for name, (backward, solver, tol) in methods.items():
            # the compiled executable both reports its memory and computes the gradient (one compile)
            grad_fn = jax.jit(jax.grad(make_loss(backward, solver, tol))).lower(params).compile()
            memory = grad_fn.memory_analysis()
            g = flat(grad_fn(params))
            converged = converged_fraction(solver, tol)
            out[name] = {"error": float(jnp.linalg.norm(g - exact) / jnp.linalg.norm(exact)),
                         "forward_converged": converged,
                         "memory": float(getattr(memory, "temp_size_in_bytes", np.nan)),
                         "backward_vjps": float({"unrolled": max_steps, "jacobian_free": 1,
                                                 "phantom": phantom_steps, "shine": backward.refine + 1
                                                 if name == "shine" else 0}.get(name, np.nan))}
        # the implicit method's adjoint evaluations, measured (one jitted program rather than eager solves)
        def adjoint_nfe(params):
            m = nnx.merge(graphdef, params)
            _, sol, _ = m(x)
            f, args = m.equilibrium_map()
            x_flat = x.reshape(x.shape[0], -1)

            def cotangent(z):
                return optax.softmax_cross_entropy_with_integer_labels(m.readout(z), y).mean()

            g = jax.grad(cotangent)(sol.value)
            adjoint = adjoint_solve(f, sol.value, (args, x_flat), g, solver=Anderson(tol=1e-4, max_steps=max_steps),
                                    batch_axis=0)
            return adjoint.stats.nfe

        # the adjoint solve's VJPs, plus the one that gives the parameter gradient
        out["implicit"]["backward_vjps"] = float(jax.jit(adjoint_nfe)(params)) + 1.0
    return out
