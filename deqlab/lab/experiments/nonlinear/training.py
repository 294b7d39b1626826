"""The fully connected DEQ classifier of 001 §4.1 (Fig. 5), trained from three weight ensembles.

001 §4.1 trains "a flattening layer, followed by a ResNet DEQ layer with tanh non-linearity, and
finally a dense layer to project to 10 logits" on MNIST, with the DEQ's weight drawn from the
Gaussian (i.i.d.) and orthogonal ensembles at several scales sqrt(V), Adam (momentum 0.9) at the
tuned learning rate 1e-2, and 10 seeds per (family, scale); Fig. 5 plots the mean and median
test error against the scale. The paper gives neither the width, the scales, the solver nor the
number of epochs; the choices here are ours and are arguments.

**The layer.** We read "ResNet DEQ layer with tanh" as the model of the paper's own theory,
``z* = tanh(W z* + b) + U x`` (001 Eq. 21, with the input injected through a learned ``U``
*after* the nonlinearity, a skip connection): :class:`ResidualTanhCell`. Its recurrent weight
``W`` is ``sqrt(V) W0``, ``W0`` from :mod:`deqlab.ensembles` (``"gaussian"``, ``"orthogonal"``,
and ``"goe"``, which 001 §4.1 did not try). The layer is :class:`deqlab.nn.DEQ` (implicit
gradients, 003 §3.1).

**Seeds in one program.** :func:`train_seeds` builds one model per seed (``jax.vmap`` over the
keys of the initialisation), splits each into its graph and a flat list of arrays, and trains all
of them with one compiled, ``jax.vmap``-ped epoch (a ``lax.scan`` over the batches). Each seed has
its own initialisation and its own batch order. The per-seed results equal those of the seeds run
one at a time (the tests check it to float32 tolerance).

**Failure.** A run's forward solve "fails to converge during training" when, in some epoch, fewer
than ``1 - failure_tolerance`` of the training samples reached the solver's tolerance.

**Sweeps.** :func:`run_training_sweep` runs a grid of (family, scale) units through the resumable
runner :func:`deqlab.lab.experiments.sweep.run_sweep`, one stored result per unit; :func:`summarize`
reduces the per-seed rows to Fig. 5's mean and median test error and the failure fraction.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from deqlab import checks, ensembles
from deqlab.lab import data
from deqlab.nn import DEQ

__all__ = ["FAMILIES", "ResidualTanhCell", "EquilibriumClassifier", "train_seeds", "run_training_sweep",
           "summarize"]

FAMILIES = ("gaussian", "orthogonal", "goe")
"""Weight ensembles of the experiment (001 §4.1 used the first two)."""

_DEFAULTS = dict(width=64, epochs=5, batch_size=64, learning_rate=1e-2, solver="anderson", tol=1e-4,
                 max_steps=40, failure_tolerance=0.01)


class ResidualTanhCell(nnx.Module):
    """f(z, x) = tanh(W z + b) + U x: 001 Eq. 21 (``z* = phi(W z*) + x``) with phi = tanh and the
    input projected by a learned U; W is ``scale`` times a matrix of the ``ensemble`` (001 §4.1).

    Args:
        width: size N of z.
        in_features: size of x.
        ensemble: one of :data:`FAMILIES` (any of ``deqlab.ensembles.ENSEMBLES`` works).
        scale: sqrt(V) >= 0.
        rngs: ``nnx.Rngs``.
    """

    def __init__(self, width: int, in_features: int, *, ensemble: str, scale: float, rngs: nnx.Rngs):
        where = "nonlinear.training.ResidualTanhCell"
        self.width = checks.positive_int(width, "width", where)
        self.in_features = checks.positive_int(in_features, "in_features", where)
        checks.choice(ensemble, "ensemble", ensembles.ENSEMBLES, where)
        scale = checks.number(scale, "scale", where, lower=0.0)
        self.recurrent = nnx.Linear(width, width, kernel_init=ensembles.initializer(ensemble, scale),
                                    bias_init=nnx.initializers.zeros_init(), rngs=rngs)
        self.inject = nnx.Linear(in_features, width, use_bias=False, rngs=rngs)

    def __call__(self, z: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.tanh(self.recurrent(z)) + self.inject(x)


class EquilibriumClassifier(nnx.Module):
    """flatten -> DEQ(:class:`ResidualTanhCell`) -> dense to ``classes`` logits (001 §4.1).

    ``model(x)`` returns ``(logits, solution)``, the :class:`deqlab.solvers.Solution` of the
    forward solve (per-sample ``converged`` and ``stats.steps``). The backward pass is implicit
    and never warns: failed solves are counted from the solution instead.
    """

    def __init__(self, in_features: int, *, width: int, ensemble: str, scale: float, classes: int = 10,
                 solver: Any = "anderson", tol: float = 1e-4, max_steps: int = 40, rngs: nnx.Rngs):
        self.deq = DEQ(ResidualTanhCell(width, in_features, ensemble=ensemble, scale=scale, rngs=rngs),
                       solver=solver, tol=tol, max_steps=max_steps, on_failure="ignore")
        self.readout = nnx.Linear(width, classes, rngs=rngs)

    def __call__(self, x: jax.Array):
        z, sol = self.deq(x.reshape(x.shape[0], -1), return_solution=True)
        return self.readout(z), sol


def _check_options(where, family, scale, seeds, options):
    checks.choice(family, "family", ensembles.ENSEMBLES, where)
    scale = checks.number(scale, "scale", where, lower=0.0)
    seeds = checks.seed_list(seeds, "seeds", where)
    unknown = set(options) - set(_DEFAULTS)
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {sorted(unknown)}; valid options are {sorted(_DEFAULTS)}.")
    o = {**_DEFAULTS, **options}
    for name in ("width", "epochs", "batch_size", "max_steps"):
        o[name] = checks.positive_int(o[name], name, where)
    o["learning_rate"] = checks.positive_number(o["learning_rate"], "learning_rate", where)
    o["tol"] = checks.positive_number(o["tol"], "tol", where)
    o["failure_tolerance"] = checks.number(o["failure_tolerance"], "failure_tolerance", where, lower=0.0,
                                           upper=1.0, upper_open=True)
    return scale, seeds, o


@functools.lru_cache(maxsize=16)
def _program(in_features, width, solver, tol, max_steps, batch_size, n_batches):
    """The graph of the model and the compiled, seed-vmapped epoch, shared by every (family,
    scale, learning rate): they differ only in the initial parameters and in a traced argument, so
    one compilation serves the whole grid. The graph is taken from an abstract template model
    (``nnx.eval_shape``: no array is made and no initialiser compiled). Adam is
    ``optax.scale_by_adam`` times ``-learning_rate``, which is ``optax.adam(learning_rate)``."""
    template = nnx.eval_shape(lambda: EquilibriumClassifier(in_features, width=width, ensemble="gaussian", scale=1.0,
                                                            solver=solver, tol=tol, max_steps=max_steps,
                                                            rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(template)
    treedef = jax.tree_util.tree_structure(state)
    tx = optax.scale_by_adam(b1=0.9)  # 001 §4.1: Adam with momentum 0.9

    def forward(params, x):
        return nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, params))(x)

    def loss_fn(params, x, y):
        logits, sol = forward(params, x)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return loss, (jnp.mean(sol.converged.astype(jnp.float32)), jnp.mean(sol.stats.steps.astype(jnp.float32)))

    def epoch(params, opt_state, key_data, epoch_index, learning_rate, x_train, y_train, x_test, y_test):
        def step(carry, idx):
            params, opt_state = carry
            (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x_train[idx], y_train[idx])
            updates, opt_state = tx.update(grads, opt_state, params)
            updates = jax.tree_util.tree_map(lambda u: -learning_rate * u, updates)
            return (optax.apply_updates(params, updates), opt_state), (loss, *aux)

        key = jax.random.fold_in(jax.random.wrap_key_data(key_data), epoch_index)
        order = jax.random.permutation(key, x_train.shape[0])[: n_batches * batch_size]
        (params, opt_state), (loss, converged, steps) = jax.lax.scan(
            step, (params, opt_state), order.reshape(n_batches, batch_size))
        logits, _ = forward(params, x_test)
        error = 1.0 - jnp.mean(jnp.argmax(logits, -1) == y_test)
        return params, opt_state, jnp.stack([jnp.mean(loss), error, jnp.mean(converged), jnp.mean(steps)])

    run_epoch = jax.jit(jax.vmap(epoch, in_axes=(0, 0, 0, None, None, None, None, None, None)))
    return graphdef, treedef, run_epoch, tx


def train_seeds(family: str, scale: float, seeds: Sequence[int], *, dataset: str = "digits",
                data_path: str | os.PathLike | None = None, train_size: int | None = None,
                checkpoint_dir: str | os.PathLike | None = None, progress: bool = False,
                **options: Any) -> dict[str, Any]:
    """Train one :class:`EquilibriumClassifier` per seed, all seeds in one vmapped program.

    Args:
        family: ensemble of the DEQ weight (:data:`FAMILIES`).
        scale: sqrt(V) of the DEQ weight, >= 0.
        seeds: distinct integers >= 0; seed s sets the initialisation and the batch order.
        dataset: ``"digits"`` (offline) or ``"mnist"`` (:func:`deqlab.lab.data.load_dataset`).
        data_path: local data directory for ``"mnist"``.
        train_size: use only the first ``train_size`` training samples (None: all).
        checkpoint_dir: if given, the state after each epoch is saved there with orbax
            (:class:`deqlab.lab.experiments.sweep.Checkpoints`) and a rerun resumes from it.
        progress: tqdm bar over the epochs.
        **options: ``width`` (64), ``epochs`` (5), ``batch_size`` (64), ``learning_rate`` (1e-2,
            001 §4.1's tuned Adam rate), ``solver`` ("anderson"), ``tol`` (1e-4), ``max_steps``
            (40), ``failure_tolerance`` (0.01).

    Returns:
        A dict of lists, one entry per seed (JSON-able): ``test_error`` (final), ``best_test_error``,
        ``test_error_curve``, ``loss_curve`` (mean training loss per epoch), ``converged_curve``
        (fraction of training samples whose forward solve converged, per epoch), ``steps_curve``
        (mean solver steps), ``solver_failed`` (some epoch's converged fraction below
        ``1 - failure_tolerance``), ``diverged`` (final loss not finite); and ``seeds``.

    Raises:
        ValueError: for an argument out of range (named in the message).
    """
    where = "nonlinear.training.train_seeds"
    scale, seeds, o = _check_options(where, family, scale, seeds, options)
    checks.choice(dataset, "dataset", ("digits", "mnist"), where)
    x_train, y_train = data.load_dataset(dataset, split="train", path=data_path)
    x_test, y_test = data.load_dataset(dataset, split="test", path=data_path)
    if train_size is not None:
        train_size = checks.integer(train_size, "train_size", where, minimum=1, maximum=len(x_train))
        x_train, y_train = x_train[:train_size], y_train[:train_size]
    if o["batch_size"] > len(x_train):
        raise checks.fail("batch_size", f"at most the number of training samples ({len(x_train)})",
                          o["batch_size"], where)
    x_train, y_train, x_test, y_test = map(jnp.asarray, (x_train, y_train, x_test, y_test))
    n_batches = len(x_train) // o["batch_size"]

    _, treedef, run_epoch, tx = _program(
        int(x_train.shape[1]), o["width"], o["solver"], o["tol"], o["max_steps"], o["batch_size"], n_batches)
    keys = jnp.stack([jax.random.key_data(jax.random.key(s)) for s in seeds])

    def init(key_data):
        model = EquilibriumClassifier(x_train.shape[1], width=o["width"], ensemble=family, scale=scale,
                                      solver=o["solver"], tol=o["tol"], max_steps=o["max_steps"],
                                      rngs=nnx.Rngs(jax.random.wrap_key_data(key_data)))
        return jax.tree_util.tree_leaves(nnx.split(model)[1])

    params = jax.vmap(init)(keys)
    if jax.tree_util.tree_structure(params) != jax.tree_util.tree_structure(list(range(treedef.num_leaves))):
        raise AssertionError("the model's parameters do not match the compiled program's")
    opt_state = jax.vmap(tx.init)(params)
    data_args = (x_train, y_train, x_test, y_test)
    history = np.full((o["epochs"], len(seeds), 4), np.nan, np.float32)
    start = 0
    ckpt = None
    if checkpoint_dir is not None:
        from deqlab.lab.experiments.sweep import Checkpoints

        ckpt = Checkpoints(checkpoint_dir)
        restored, start = ckpt.resume({"params": params, "opt_state": opt_state, "history": history})
        params, opt_state, history = restored["params"], restored["opt_state"], np.asarray(restored["history"])
    from tqdm import tqdm

    try:
        for e in tqdm(range(start, o["epochs"]), desc=f"{family} {scale:g}", disable=not progress, leave=False):
            params, opt_state, metrics = run_epoch(params, opt_state, keys, e, jnp.float32(o["learning_rate"]), *data_args)
            history[e] = np.asarray(metrics)
            if ckpt is not None:
                ckpt.save(e, {"params": params, "opt_state": opt_state, "history": history})
    finally:
        if ckpt is not None:
            ckpt.close()
    loss, error, converged, steps = (history[..., i].T for i in range(4))  # each (seeds, epochs)
    threshold = 1.0 - o["failure_tolerance"]
    return {
        "seeds": list(seeds),
        "test_error": error[:, -1].tolist(),
        "best_test_error": np.nanmin(np.where(np.isfinite(error), error, np.nan), axis=1).tolist(),
        "test_error_curve": error.tolist(),
        "loss_curve": loss.tolist(),
        "converged_curve": converged.tolist(),
        "steps_curve": steps.tolist(),
        "solver_failed": np.any(converged < threshold, axis=1).tolist(),
        "diverged": (~np.isfinite(loss[:, -1])).tolist(),
    }


def run_training_sweep(directory: str | os.PathLike, *, families: Sequence[str] = FAMILIES,
                       scales: Sequence[float] = (0.25, 0.5, 1.0, 1.5, 2.0), seeds: Sequence[int] = range(5),
                       dataset: str = "digits", train_size: int | None = None, checkpoints: bool = False,
                       progress: bool = True, **options: Any) -> list[dict[str, Any]]:
    """The grid of 001 Fig. 5: :func:`train_seeds` for every (family, scale), through the
    resumable :func:`deqlab.lab.experiments.sweep.run_sweep` (one stored result per unit, keyed by
    the unit's family, scale, seeds, dataset and options; finished units are not rerun).

    Returns:
        One row per (family, scale, seed): ``family``, ``scale``, ``seed``, ``test_error``,
        ``best_test_error``, ``solver_failed``, ``diverged``, ``converged_curve``, ``test_error_curve``.
    """
    from deqlab.lab.experiments import sweep

    where = "nonlinear.training.run_training_sweep"
    seeds = list(seeds)
    for family in families:
        checks.choice(family, "families", ensembles.ENSEMBLES, where)
    scales = [checks.number(s, "scales", where, lower=0.0) for s in scales]
    _check_options(where, families[0] if families else "gaussian", 1.0, seeds, options)
    configs = [{"family": f, "scale": s, "seeds": seeds, "dataset": dataset, "train_size": train_size,
                "options": {**_DEFAULTS, **options}} for f in families for s in scales]

    def unit(config, checkpoint_dir=None):
        result = train_seeds(config["family"], config["scale"], config["seeds"], dataset=config["dataset"],
                             train_size=config["train_size"], checkpoint_dir=checkpoint_dir, **config["options"])
        return {"result": result}

    units = sweep.run_sweep(unit, configs, directory, checkpoints=checkpoints, progress=progress,
                            description="family x scale")
    rows = []
    per_seed = ("test_error", "best_test_error", "solver_failed", "diverged", "converged_curve", "test_error_curve")
    for u in units:
        r = u["result"]
        for i, seed in enumerate(r["seeds"]):
            rows.append({"family": u["family"], "scale": u["scale"], "seed": seed, **{k: r[k][i] for k in per_seed}})
    return rows


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (family, scale), in first-seen order: ``n`` seeds, ``mean_error`` and ``median_error``
    of the final test error (001 Fig. 5), ``failed_fraction`` (runs whose solver failed to
    converge in some epoch) and ``diverged_fraction``."""
    groups: dict[tuple, list] = {}
    for row in rows:
        groups.setdefault((row["family"], row["scale"]), []).append(row)
    out = []
    for (family, scale), group in groups.items():
        errors = np.array([r["test_error"] for r in group], float)
        out.append({"family": family, "scale": scale, "n": len(group),
                    "mean_error": float(np.mean(errors)), "median_error": float(np.median(errors)),
                    "failed_fraction": float(np.mean([r["solver_failed"] for r in group])),
                    "diverged_fraction": float(np.mean([r["diverged"] for r in group]))})
    return out

