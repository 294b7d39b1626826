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
  and, for the DEQ, the solver statistics. Three options of 003's released code (locuslab/deq,
  ``DEQTransformerLM``) are available for the DEQ: ``pretrain_steps``, the first steps training
  the weight-tied network unrolled a few layers from z = 0 (003 Eq. 3) before the DEQ takes over,
  ``backward_max_steps``, the adjoint solve's own iteration limit (the WikiText-103 command of
  003's README: 30 Broyden steps forward, ``f_thres``, and 40 backward, ``b_thres``, also the
  defaults of ``DEQTransformerLM.forward``; ``train_transformer.py``'s argparse defaults are 50
  and 80), and ``weight_norm``, weight
  normalisation of the cell's layers (its ``wnorm``). ``reference_max_steps`` /
  ``reference_tol`` solve the trained model's test set again, tightly, to tell whether it recalls
  at its equilibrium or only at the iterate its training budget reaches.

**Tolerances.** deqlab's ``tol`` is a relative residual per sequence, ``||f(z) - z|| / ||f(z)||``
over the sequence's (T + 20) x d entries. The cell ends in a LayerNorm without gain, so every
position of f(z) has norm sqrt(d) and ``||f(z)|| = sqrt((T + 20) d)``: ``tol`` is a bound on the
root-mean-square entry of ``f(z) - z``. 003's code stops Broyden's method when the norm of
``f(z) - z`` over the whole batch falls below ``1e-6 sqrt(B L d)`` forward and ``2e-10 sqrt(B L
d)`` backward (locuslab/deq, ``modules/deq.py``), a root-mean-square entry of 1e-6 (2e-10) over
the batch, in training and evaluation alike: this module's ``tol=1e-6``, per sequence instead of
per batch. 003's text (§5, "Setting") gives ``sqrt(T) 1e-5`` forward and ``sqrt(T) 1e-8`` backward
in training and ``sqrt(T) 1e-2`` at inference, on the norm of g; on one sequence of length T
and width d that is a relative residual of ``1e-5 / sqrt(d)`` (training) and ``1e-2 / sqrt(d)``
(inference).
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


_WEIGHT_NORMED = ("query", "key", "value", "out", "expand", "contract")
"""The cell's layers that 003's code weight-normalises (``wnorm``: ``qkv_net``, ``o_net``, ``ff1_net``,
``ff2_net``; its ``r_net``, the positional projection, has no counterpart here, and its input
injection ``inject_conv`` lies outside the cell and is not normalised)."""


def _deq_transformer(width, length, seed, max_steps, tol, embedding_std=None, *, backward_max_steps=None,
                     eval_max_steps=None, eval_tol=None, weight_norm=False):
    from deqlab.backward import Implicit
    from deqlab.nn.lm import LanguageModel
    from deqlab.nn.normalization import WeightNorm
    from deqlab.nn.transformer import TransformerCell

    cell = TransformerCell(width, width, heads=_HEADS, hidden=2 * width, max_distance=length,
                           rngs=nnx.Rngs(seed))
    if weight_norm:  # each starts as the layer it wraps: the same function at initialisation
        for name in _WEIGHT_NORMED:
            setattr(cell, name, WeightNorm(getattr(cell, name)))
    backward = "implicit" if backward_max_steps is None else Implicit(max_steps=backward_max_steps)
    # failures are counted in the solver statistics each step, not warned about
    return LanguageModel(data.COPY_VOCAB, cell, solver="broyden", max_steps=max_steps, tol=tol,
                         backward=backward, on_failure="ignore", embedding_std=embedding_std,
                         eval_max_steps=eval_max_steps, eval_tol=eval_tol, rngs=nnx.Rngs(seed + 1))


def make_model(kind: str, *, parameters: int, delay: int, seed: int = 0, max_steps: int = 30,
               tol: float | None = None, embedding_std: float | None = None,
               backward_max_steps: int | None = None, eval_max_steps: int | None = None,
               eval_tol: float | None = None, weight_norm: bool = False) -> nnx.Module:
    """A model of ``kind`` (:data:`MODELS`) with about ``parameters`` parameters for copy memory
    with delay ``delay`` (sequence length ``delay + 20``).

    The width is the one whose count is closest to ``parameters`` (:func:`deqlab.nn.baselines.width_for_parameters`):
    the DEQ-Transformer's in multiples of its 4 heads (feed-forward width 2 x width), the TCN's with
    kernel 8 and the fewest blocks that see the whole sequence (:func:`deqlab.nn.baselines.tcn_levels`).

    Args:
        kind: one of :data:`MODELS`.
        parameters: the budget, an integer >= 100.
        delay: T, an integer >= 1.
        seed: the initialisation's seed, an integer >= 0.
        max_steps: the DEQ's Broyden iteration limit (``f_thres`` in 003's README command: 30;
            003 §5 finds a limit of 30 on sequences of 75 sufficient).
        tol: the DEQ's tolerance, a relative residual per sequence (module docstring,
            "Tolerances"); None: the solver's default for the dtype.
        embedding_std: the DEQ's :class:`deqlab.nn.LanguageModel` argument (None: flax's default).
        backward_max_steps: the iteration limit of the DEQ's implicit adjoint solve (003's code,
            ``b_thres`` in its README command: 40); None: ``max_steps``.
        eval_max_steps, eval_tol: the DEQ's solve in evaluation mode (``model.eval()``); None:
            the training settings.
        weight_norm: wrap the DEQ cell's attention and feed-forward layers in
            :class:`deqlab.nn.normalization.WeightNorm` (Salimans & Kingma 2016), as 003's code does with
            ``wnorm``; their gains count as parameters (as PyTorch's ``weight_g`` do), so the width that
            meets ``parameters`` may be smaller.

    The DEQ-only arguments are ignored for the other models.

    Returns:
        The model, an ``nnx.Module``: ``model(tokens)`` gives logits (and, for the DEQ, solver
        statistics).

    Raises:
        ValueError: ``kind`` is not in :data:`MODELS`, or a number is out of its range (named).

    Example:
        >>> from deqlab.lab.experiments.sequence import copy_memory as cm
        >>> from deqlab.nn import baselines
        >>> model = cm.make_model("lstm", parameters=3000, delay=5)
        >>> abs(baselines.parameter_count(model) - 3000) < 300
        True
    """
    where = "sequence.copy_memory.make_model"
    checks.choice(kind, "kind", MODELS, where)
    parameters = checks.integer(parameters, "parameters", where, minimum=100)
    delay = checks.positive_int(delay, "delay", where)
    seed = checks.integer(seed, "seed", where, minimum=0)
    max_steps = checks.positive_int(max_steps, "max_steps", where)
    if backward_max_steps is not None:
        backward_max_steps = checks.positive_int(backward_max_steps, "backward_max_steps", where)
    if eval_max_steps is not None:
        eval_max_steps = checks.positive_int(eval_max_steps, "eval_max_steps", where)
    if eval_tol is not None:
        eval_tol = checks.positive_number(eval_tol, "eval_tol", where)
    if not isinstance(weight_norm, bool):
        raise checks.fail("weight_norm", "True or False", weight_norm, where)
    length = delay + 20
    if kind == "deq-transformer":
        make = lambda w: _deq_transformer(w, length, seed, max_steps, tol, embedding_std,  # noqa: E731
                                          backward_max_steps=backward_max_steps, eval_max_steps=eval_max_steps,
                                          eval_tol=eval_tol, weight_norm=weight_norm)
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


def _window_mean(values, a, b):
    """Mean of ``values[a:b]`` over its finite entries (the DEQ's steps), None when there are none."""
    w = values[a:b]
    w = w[np.isfinite(w)]
    return float(w.mean()) if w.size else None


def train_copy_memory(config: dict, checkpoint_dir: Any = None) -> dict:
    """Train one model on copy memory; the function a sweep row runs.

    Args:
        config: a dict with ``model`` (:data:`MODELS`), ``delay`` (T), ``steps``, ``batch_size``,
            ``learning_rate`` (Adam, gradients clipped to global norm 1), ``budget`` (parameters),
            ``seed``, ``test_size``; optional ``log_every`` (the window of the curves; default
            steps / 20) and the DEQ-Transformer's settings, which the other models ignore:

            - ``max_steps``, ``tol``, ``embedding_std``, ``backward_max_steps``, ``weight_norm``:
              :func:`make_model`;
            - ``pretrain_steps`` (default 0) and ``pretrain_depth`` (default 2): the first
              ``pretrain_steps`` steps train the weight-tied network unrolled ``pretrain_depth``
              layers from z = 0 (003 Eq. 3, the same parameters), the remaining steps the DEQ, as
              003's code does (``DEQTransformerLM``, ``pretrain_steps``; its WikiText-103 script
              pretrains 16000 of 300000 steps with 2 layers);
            - ``reference_max_steps`` and ``reference_tol`` (both or neither): after training, the
              test set is solved again with this budget (Broyden, the model's evaluation mode);
            - ``jacobian_gamma`` (default 0): Bai, Koltun & Kolter's (2021) Jacobian penalty,
              divided by the size of z* (sequence length x width), as theirs, in the DEQ steps.

            Only a DEQ-Transformer may have ``jacobian_gamma > 0``.
        checkpoint_dir: unused (the sweep's signature).

    Returns:
        A dict: ``test_loss`` (mean cross-entropy per step over the test set, 003 Table 1's
        metric), ``recall_accuracy`` (fraction of the test set's recalled symbols right),
        ``baseline`` (:func:`deqlab.lab.data.copy_memory_baseline`), ``parameters`` (the model's
        count), ``width``, ``loss_steps`` and ``train_loss`` (the training loss, averaged over each
        window of ``log_every`` steps), ``seconds`` (training wall time, compilation included)
        and, for the DEQ, per window ``solver_steps``, ``converged_fraction`` and
        ``residual_max`` (the mean over the window's DEQ steps of the step's mean Broyden steps,
        fraction of sequences at tolerance and worst relative residual; None for a window of
        pretraining steps only), ``test_converged_fraction`` and
        ``test_residual_max``, and with a reference budget ``reference_test_loss``,
        ``reference_recall_accuracy``, ``reference_converged_fraction``,
        ``reference_residual_max`` and ``reference_solver_steps`` (mean Broyden steps).

    Raises:
        ValueError: a key is missing or out of its range (named), ``jacobian_gamma > 0`` for a
            model without an equilibrium, ``pretrain_steps >= steps``, or only one of
            ``reference_max_steps`` and ``reference_tol`` is given.
        FloatingPointError: the training loss becomes non-finite.

    Example:
        >>> from deqlab.lab.experiments.sequence import copy_memory as cm
        >>> r = cm.train_copy_memory(dict(model="deq-transformer", delay=3, steps=4, batch_size=4,
        ...                               learning_rate=1e-3, budget=3000, seed=0, test_size=8, max_steps=4,
        ...                               pretrain_steps=2, log_every=2))
        >>> r["converged_fraction"][0] is None, len(r["solver_steps"])   # a window of pretraining, then the DEQ
        (True, 2)
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
    pretrain = checks.integer(config.get("pretrain_steps", 0), "config['pretrain_steps']", where, minimum=0,
                              maximum=steps - 1)
    depth = checks.positive_int(config.get("pretrain_depth", 2), "config['pretrain_depth']", where)
    reference = (config.get("reference_max_steps"), config.get("reference_tol"))
    if (reference[0] is None) != (reference[1] is None):
        raise checks.fail("config['reference_max_steps']", "given together with config['reference_tol'] (or "
                          "neither)", f"max_steps {reference[0]}, tol {reference[1]}", where)
    deq = config["model"] == "deq-transformer"
    pretrain = pretrain if deq else 0
    model = make_model(config["model"], parameters=config["budget"], delay=delay, seed=seed,
                       max_steps=config.get("max_steps", 30), tol=config.get("tol"),
                       embedding_std=config.get("embedding_std"),
                       backward_max_steps=config.get("backward_max_steps"),
                       weight_norm=config.get("weight_norm", False) if deq else False,
                       eval_max_steps=reference[0], eval_tol=reference[1])
    optimizer = nnx.Optimizer(model, optax.chain(optax.clip_by_global_norm(1.0), optax.adam(rate)), wrt=nnx.Param)

    def make_step(unrolled):
        @nnx.jit
        def step(model, optimizer, key):
            x, y = data.copy_memory(key, batch_size=batch_size, delay=delay)

            def objective(m):
                if unrolled:  # the weight-tied network of 003 Eq. 3, `depth` layers from z = 0
                    logits, stats = m(x, depth=depth)
                    loss = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y).mean()
                    return loss, (loss, stats)
                if gamma > 0:  # the probe's key: another branch than the batch's
                    return _penalised_loss(m, x, y, jax.random.fold_in(key, 1), gamma)
                loss, stats = _loss(m, x, y)
                return loss, (loss, stats)

            (_, (loss, stats)), grads = nnx.value_and_grad(objective, has_aux=True)(model)
            optimizer.update(model, grads)
            return loss, stats

        return step

    deq_step = make_step(False)
    pretrain_step = make_step(True) if pretrain else None
    key = jax.random.key(seed)
    start = time.perf_counter()
    losses, solver_steps, converged, residual = [], [], [], []
    nan = jnp.asarray(jnp.nan, jnp.float32)
    for i in range(steps):
        pretraining = i < pretrain
        loss, stats = (pretrain_step if pretraining else deq_step)(model, optimizer, jax.random.fold_in(key, i))
        losses.append(loss)
        if stats:  # the unrolled steps are recorded as NaN: no solve, no tolerance
            solver_steps.append(nan if pretraining else stats["steps_mean"])
            converged.append(nan if pretraining else stats["converged_fraction"])
            residual.append(nan if pretraining else stats["residual_max"])
    losses = np.asarray(jax.device_get(losses), np.float64)
    if not np.all(np.isfinite(losses)):
        raise FloatingPointError(f"{where}: the training loss of {config['model']} became non-finite at step "
                                 f"{int(np.argmin(np.isfinite(losses)))}; lower the learning rate.")
    x_test, y_test = test_set(delay, test_size, seed)
    evaluate = nnx.jit(_evaluate)
    test_loss, recalled, test_stats = evaluate(model, x_test, y_test)
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
        s, c, r = (np.asarray(jax.device_get(v), np.float64) for v in (solver_steps, converged, residual))
        result["solver_steps"] = [_window_mean(s, a, b) for a, b in windows]
        result["converged_fraction"] = [_window_mean(c, a, b) for a, b in windows]
        result["residual_max"] = [_window_mean(r, a, b) for a, b in windows]
        result["test_converged_fraction"] = float(test_stats["converged_fraction"])
        result["test_residual_max"] = float(test_stats["residual_max"])
        if reference[0] is not None:
            model.eval()  # the evaluation-mode solve: reference_max_steps, reference_tol
            ref_loss, ref_recalled, ref_stats = evaluate(model, x_test, y_test)
            model.train()
            result.update(reference_test_loss=float(ref_loss), reference_recall_accuracy=float(ref_recalled),
                          reference_converged_fraction=float(ref_stats["converged_fraction"]),
                          reference_residual_max=float(ref_stats["residual_max"]),
                          reference_solver_steps=float(ref_stats["steps_mean"]))
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
