"""The copy-memory task of 003 §5.1 (Table 1): a DEQ-Transformer against an LSTM, a GRU and a TCN.

003 Table 1 reports, at T = 400 (input length T + 20), the final test loss (cross-entropy per step,
averaged over all T + 20 steps) of a DEQ-Transformer of 14K parameters (3.5e-6), a TCN of 16K
(2.7e-5), an LSTM of 14K (0.0501) and a GRU of 14K (0.0491): :data:`PAPER_TABLE1`. The LSTM and
GRU sit at the loss of a model that remembers nothing, 10 ln 8 / 420 = 0.0495
(:func:`deqlab.lab.data.copy_memory_baseline`). The paper gives no training details for the task; the
choices here (Adam with gradient clipping, batch, steps) are ours and are arguments.

- :func:`make_model`: one of :data:`MODELS` at a parameter budget. The DEQ-Transformer is
  :class:`deqlab.nn.LanguageModel` (embedding, :class:`deqlab.nn.TransformerCell`
  solved by Broyden's method, readout) with ``max_distance`` = the sequence length, so that the
  learned relative-position bias can point from each recall step to its symbol, always T + 10
  steps back; the baselines come from :mod:`deqlab.nn.baselines`, each at the width whose
  parameter count is closest to the budget.
- :func:`train_copy_memory`: train one model on fresh batches (a new key each step, pure JAX) and
  report the test loss on a fixed test set, the fraction of recalled symbols, the training curve
  and, for the DEQ, the solver statistics.
- :func:`run_copy_memory`: all models through the resumable :func:`deqlab.lab.experiments.sweep.run_sweep`.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from deqlab import checks
from deqlab.lab import data
from deqlab.nn import baselines

__all__ = ["MODELS", "PAPER_TABLE1", "PAPER_DELAY", "make_model", "train_copy_memory", "run_copy_memory",
           "test_set"]

MODELS = ("deq-transformer", "tcn", "lstm", "gru")
"""Models of 003 Table 1, in its column order."""

PAPER_DELAY = 400
"""T of 003 Table 1."""

PAPER_TABLE1 = {
    "deq-transformer": {"test_loss": 3.5e-6, "parameters": 14_000},
    "tcn": {"test_loss": 2.7e-5, "parameters": 16_000},
    "lstm": {"test_loss": 0.0501, "parameters": 14_000},
    "gru": {"test_loss": 0.0491, "parameters": 14_000},
}
"""003 Table 1: copy memory at T = 400, final test loss and model size (as printed: "14K", "16K")."""

_HEADS = 4
_TCN_KERNEL = 8  # Bai et al. (2018) use kernel size 8 on copy memory


def _deq_transformer(width, length, seed, max_steps, tol, embedding_std=None):
    from deqlab.nn.lm import LanguageModel
    from deqlab.nn.transformer import TransformerCell

    cell = TransformerCell(width, width, heads=_HEADS, hidden=2 * width, max_distance=length,
                           rngs=nnx.Rngs(seed))
    # failures are counted in the solver statistics each step, not warned about
    return LanguageModel(data.COPY_VOCAB, cell, solver="broyden", max_steps=max_steps, tol=tol,
                         on_failure="ignore", embedding_std=embedding_std, rngs=nnx.Rngs(seed + 1))


def make_model(kind: str, *, parameters: int, delay: int, seed: int = 0, max_steps: int = 30,
               tol: float | None = None, embedding_std: float | None = None) -> nnx.Module:
    """A model of ``kind`` (:data:`MODELS`) with about ``parameters`` parameters for copy memory
    with delay ``delay`` (sequence length ``delay + 20``).

    The width is the one whose count is closest to ``parameters`` (:func:`deqlab.nn.baselines.width_for_parameters`):
    the DEQ-Transformer's in multiples of its 4 heads (feed-forward width 2 x width), the TCN's with
    kernel 8 and the fewest blocks that see the whole sequence (:func:`deqlab.nn.baselines.tcn_levels`).
    ``max_steps`` and ``tol`` are the DEQ's Broyden solve (003 §5: an iteration limit of 30);
    ``embedding_std`` is the DEQ's :class:`deqlab.nn.LanguageModel` argument (None: flax's default).
    """
    where = "sequence.copy_memory.make_model"
    checks.choice(kind, "kind", MODELS, where)
    parameters = checks.integer(parameters, "parameters", where, minimum=100)
    delay = checks.positive_int(delay, "delay", where)
    seed = checks.integer(seed, "seed", where, minimum=0)
    max_steps = checks.positive_int(max_steps, "max_steps", where)
    length = delay + 20
    if kind == "deq-transformer":
        make = lambda w: _deq_transformer(w, length, seed, max_steps, tol, embedding_std)  # noqa: E731
        widths = range(_HEADS, 257, _HEADS)
    elif kind == "tcn":
        levels = baselines.tcn_levels(length, _TCN_KERNEL)
        make = lambda w: baselines.TCN(data.COPY_VOCAB, w, levels=levels, kernel_size=_TCN_KERNEL,  # noqa: E731
                                       rngs=nnx.Rngs(seed))
        widths = range(1, 257)
    else:
        make = lambda w: baselines.RecurrentModel(data.COPY_VOCAB, w, cell=kind, rngs=nnx.Rngs(seed))  # noqa: E731
        widths = range(1, 257)
    width = baselines.width_for_parameters(make, parameters, widths)
    # one compiled initialiser instead of dozens of op-by-op ones (issue 17: eager construction cost
    # ~30 s of the page); the same keys give the same parameters
    return nnx.jit(lambda: make(width))()


def _width(model) -> int:
    if hasattr(model, "block"):
        return int(model.block.cell.width)
    return int(model.hidden if hasattr(model, "hidden") else model.channels)


def _logits(model, x):
    out = model(x)
    return out if isinstance(out, tuple) else (out, {})


def _loss(model, x, y):
    logits, stats = _logits(model, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y).mean(), stats


def _penalised_loss(model, x, y, key, gamma):
    """The DEQ's loss plus Bai, Koltun & Kolter's (2021) Jacobian penalty gamma ||J_f(z*)||_F^2 / (L d), with L d
    the size of z* (sequence length T + 20 times width),
    taken at the equilibrium with its gradient stopped (the map is penalised, not z*), one
    Rademacher probe (:func:`deqlab.stability.jacobian_penalty`). Returns the objective and
    ``(loss, stats)``: the curves record the loss without the penalty."""
    from deqlab.stability import jacobian_penalty

    logits, stats, z = model(x, return_state=True)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y).mean()
    cell_graph, cell_state = nnx.split(model.block.cell)
    penalty = jacobian_penalty(lambda z, state, e: nnx.merge(cell_graph, state)(z, e), jax.lax.stop_gradient(z),
                               cell_state, model.embed(x), key=key, batch_axis=0)
    return loss + gamma * jnp.mean(penalty) / (z.shape[-2] * z.shape[-1]), (loss, stats)


def test_set(delay: int, size: int, seed: int = 0) -> tuple[jax.Array, jax.Array]:
    """The fixed test sequences of a run: ``size`` sequences from a key no training step uses."""
    # training steps use fold_in(key(seed), step) with step < 2**31 - 1; the test key is another branch
    return data.copy_memory(jax.random.fold_in(jax.random.key(seed), 2**31 - 1), batch_size=size, delay=delay)


def _evaluate(model, x, y, memory=10):
    logits, stats = _logits(model, x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y).mean()
    recalled = jnp.mean(jnp.argmax(logits[:, -memory:], -1) == y[:, -memory:])
    return loss, recalled, stats


def train_copy_memory(config: dict, checkpoint_dir: Any = None) -> dict:
    """Train one model on copy memory; the function a sweep row runs.

    ``config``: ``model`` (:data:`MODELS`), ``delay`` (T), ``steps``, ``batch_size``,
    ``learning_rate`` (Adam, gradients clipped to global norm 1), ``budget`` (parameters),
    ``seed``, ``test_size``; optional ``max_steps``, ``tol`` (the DEQ's solve), ``embedding_std``
    (the DEQ's embedding scale, :func:`make_model`), ``jacobian_gamma`` (the DEQ's Jacobian
    penalty, Bai, Koltun & Kolter 2021, divided by the size of z*, sequence length x width, as
    theirs; default 0) and ``log_every``.

    Returns a dict: ``test_loss`` (mean cross-entropy per step over the test set, 003 Table 1's
    metric), ``recall_accuracy`` (fraction of the test set's recalled symbols right), ``baseline``
    (:func:`deqlab.lab.data.copy_memory_baseline`), ``parameters`` (the model's count), ``width``,
    ``loss_steps`` and ``train_loss`` (the training loss, averaged over each window of
    ``log_every`` steps), ``seconds`` (training wall time, compilation included) and, for the DEQ,
    ``solver_steps`` and ``converged_fraction`` per window and ``test_converged_fraction``.
    """
    where = "sequence.copy_memory.train_copy_memory"
    required = ("model", "delay", "steps", "batch_size", "learning_rate", "budget", "seed", "test_size")
    missing = [k for k in required if k not in config]
    if missing:
        raise checks.fail("config", f"a dict with the keys {', '.join(required)}", f"one missing {missing}", where)
    steps = checks.positive_int(config["steps"], "config['steps']", where)
    batch_size = checks.positive_int(config["batch_size"], "config['batch_size']", where)
    delay = checks.positive_int(config["delay"], "config['delay']", where)
    rate = checks.positive_number(config["learning_rate"], "config['learning_rate']", where)
    test_size = checks.positive_int(config["test_size"], "config['test_size']", where)
    log_every = checks.positive_int(config.get("log_every", max(1, steps // 20)), "config['log_every']", where)
    seed = checks.integer(config["seed"], "config['seed']", where, minimum=0)
    gamma = checks.number(config.get("jacobian_gamma", 0.0), "config['jacobian_gamma']", where, lower=0.0)
    if gamma > 0 and config["model"] != "deq-transformer":
        raise checks.fail("config['jacobian_gamma']", "0 for a model without an equilibrium (only the "
                          "deq-transformer has one)", gamma, where)
    model = make_model(config["model"], parameters=config["budget"], delay=delay, seed=seed,
                       max_steps=config.get("max_steps", 30), tol=config.get("tol"),
                       embedding_std=config.get("embedding_std"))
    optimizer = nnx.Optimizer(model, optax.chain(optax.clip_by_global_norm(1.0), optax.adam(rate)), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, key):
        x, y = data.copy_memory(key, batch_size=batch_size, delay=delay)

        def objective(m):
            if gamma > 0:  # the probe's key: another branch than the batch's
                return _penalised_loss(m, x, y, jax.random.fold_in(key, 1), gamma)
            loss, stats = _loss(m, x, y)
            return loss, (loss, stats)

        (_, (loss, stats)), grads = nnx.value_and_grad(objective, has_aux=True)(model)
        optimizer.update(model, grads)
        return loss, stats

    key = jax.random.key(seed)
    start = time.perf_counter()
    losses, solver_steps, converged = [], [], []
    for i in range(steps):
        loss, stats = step(model, optimizer, jax.random.fold_in(key, i))
        losses.append(loss)
        if stats:
            solver_steps.append(stats["steps_mean"])
            converged.append(stats["converged_fraction"])
    losses = np.asarray(jax.device_get(losses), np.float64)
    if not np.all(np.isfinite(losses)):
        raise FloatingPointError(f"{where}: the training loss of {config['model']} became non-finite at step "
                                 f"{int(np.argmin(np.isfinite(losses)))}; lower the learning rate.")
    x_test, y_test = test_set(delay, test_size, seed)
    test_loss, recalled, test_stats = nnx.jit(_evaluate)(model, x_test, y_test)
    seconds = time.perf_counter() - start
    windows = [(i, min(i + log_every, steps)) for i in range(0, steps, log_every)]
    result = {
        "test_loss": float(test_loss),
        "recall_accuracy": float(recalled),
        "baseline": data.copy_memory_baseline(delay),
        "parameters": baselines.parameter_count(model),
        "width": _width(model),
        "loss_steps": [b for _, b in windows],
        "train_loss": [float(losses[a:b].mean()) for a, b in windows],
        "seconds": seconds,
    }
    if solver_steps:
        s = np.asarray(jax.device_get(solver_steps), np.float64)
        c = np.asarray(jax.device_get(converged), np.float64)
        result["solver_steps"] = [float(s[a:b].mean()) for a, b in windows]
        result["converged_fraction"] = [float(c[a:b].mean()) for a, b in windows]
        result["test_converged_fraction"] = float(test_stats["converged_fraction"])
    return result


def run_copy_memory(directory, models: Sequence[str] = MODELS, *, progress: bool = False, **common) -> list[dict]:
    """Train every model of ``models`` with the settings ``common`` (the keys of
    :func:`train_copy_memory`'s config, except ``model``) through the resumable sweep in
    ``directory``; one row per model, in order."""
    from deqlab.lab.experiments.sweep import run_sweep

    where = "sequence.copy_memory.run_copy_memory"
    models = list(models)
    for m in models:
        checks.choice(m, "models", MODELS, where)
    return run_sweep(train_copy_memory, [{"model": m, **common} for m in models], directory, progress=progress,
                     description="copy memory")
