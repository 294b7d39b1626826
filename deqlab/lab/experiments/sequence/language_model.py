"""A small DEQ-Transformer language model (003 §5.2; the setup of 001 App. D), resumable.

001 App. D trains a DEQ transformer on Wikitext-103 with a pre-trained SentencePiece tokenizer,
batch 512 and context 128, for 20 Broyden steps per solve; 003 §5.2 trains DEQ-Transformers on
Wikitext-103 with sequences of 150 tokens. This module runs that pipeline at any size:

- :func:`prepare_corpus`: :func:`deqlab.lab.data.load_text` (the bundled *Pride and Prejudice* by
  default, or Wikitext-103), a tokenizer trained on the training split and cached on disk
  (:func:`deqlab.lab.data.text_tokenizer`), and the 128-token windows of each split
  (:func:`deqlab.lab.data.lm_windows`);
- :func:`train_language_model`: :class:`deqlab.nn.LanguageModel` over a
  :class:`deqlab.nn.TransformerCell`, trained with :func:`deqlab.nn.train_step`
  (which returns the forward solve's statistics each step) on shuffled batches
  (:func:`deqlab.lab.data.lm_batches`), with a tqdm bar, orbax checkpoints every
  ``checkpoint_every`` steps (:class:`deqlab.lab.experiments.sweep.Checkpoints`) and resumption from
  the newest one; then the validation loss;
- :func:`run_language_model`: configurations through :func:`deqlab.lab.experiments.sweep.run_sweep`
  with checkpoints, so that an interrupted run resumes within its configuration.

On several devices the batch is sharded over a data mesh (:func:`deqlab.nn.data_mesh`): the
same code runs on one CPU, a GPU or a TPU slice.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from deqlab import checks
from deqlab.lab import data
from deqlab.lab.experiments.sequence import initialisation as _initialisation

__all__ = ["prepare_corpus", "make_model", "learning_rate_schedule", "train_language_model", "evaluate",
           "equilibrium_statistics", "diagonal_blocks",
           "run_language_model", "LOGGED", "EVALUATED", "RADIUS_SEQUENCES", "RADIUS_STEPS", "EXACT_RADIUS_WIDTH"]

LOGGED = ("loss", "steps_mean", "converged_fraction", "residual_max")
"""Per-step quantities a run records: training loss and the forward solve's statistics."""

EVALUATED = ("loss", "converged_fraction", "steps_mean", "radius", "radius_converged")
"""What an evaluation on the validation batches records (:func:`evaluate`)."""

RADIUS_SEQUENCES = 8
"""Sequences of the first validation batch whose spectral radius :func:`evaluate` measures."""

EXACT_RADIUS_WIDTH = 128
"""Widths up to which :func:`evaluate` and :func:`equilibrium_statistics` give exact spectral radii,
from the eigenvalues of the diagonal blocks (:func:`diagonal_blocks`); wider cells are estimated by
power iteration (:data:`RADIUS_STEPS`), which at width 700 costs far less than ``T`` eigenvalue
problems of size 700 per sequence."""

RADIUS_STEPS = 40
"""Power-iteration steps of the estimate (:func:`deqlab.stability.spectral_radius`) used above
:data:`EXACT_RADIUS_WIDTH` and returned as ``radius_power`` by :func:`equilibrium_statistics`. Near
radius 1, where many eigenvalues sit close to the largest, 40 steps can fall short of the exact
value by several per cent."""

def prepare_corpus(name: str = "austen", *, tokenizer: str = "sentencepiece", vocab_size: int = 1000,
                   context: int = data.LM_CONTEXT, source: str | None = None, path: Any = None,
                   cache_dir: Any = None) -> dict:
    """Text, tokenizer and windows of a corpus.

    Returns:
        a dict with ``tokenizer``, and ``train`` / ``validation`` / ``test``: int32 windows
        ``(n, context + 1)`` of each split, and ``tokens``: the number of tokens of each split.
    """
    train = data.load_text(name, split="train", source=source, path=path)
    tok = data.text_tokenizer(train, tokenizer, vocab_size=vocab_size, cache_dir=cache_dir)
    out = {"tokenizer": tok, "tokens": {}}
    for split in data.TEXT_SPLITS:
        paragraphs = train if split == "train" else data.load_text(name, split=split, source=source, path=path)
        ids = data.encode_text(tok, paragraphs)
        out["tokens"][split] = int(len(ids))
        out[split] = data.lm_windows(ids, context)
    return out


def make_model(vocab_size: int, *, width: int, heads: int, seed: int, max_steps: int = 20,
               tol: float | None = None, depth: int | None = None,
               embedding_std: float | None = None) -> nnx.Module:
    """The DEQ-Transformer language model: :class:`deqlab.nn.LanguageModel` over a
    :class:`deqlab.nn.TransformerCell` with its defaults (003's released layer, with the residual
    around the attention; the spectral radius of its Jacobian at the initial equilibria is close
    to 1, often above it, so a short Broyden budget fails before training), Broyden, ``max_steps`` as 001 App. D's 20,
    ``embedding_std`` as :class:`deqlab.nn.LanguageModel`'s.

    Args:
        vocab_size: number of tokens.
        width: the cell's width d (a multiple of ``heads``).
        heads: attention heads.
        seed: seeds the cell (``seed``) and the embedding and head (``seed + 1``).
        max_steps: the forward solve's iteration limit.
        tol: its relative tolerance; None: the solver's default.
        depth: None: the DEQ; an int L: the same cell unrolled L times.
        embedding_std: None: flax's default, 1/sqrt(d); a number: that standard deviation.

    Returns:
        The model; a failed solve is recorded in the statistics (``converged_fraction``), not warned
        about.

    Raises:
        ValueError: an argument of the cell or the model is not valid (as they raise it).

    Example:
        >>> from deqlab.lab.experiments.sequence.language_model import make_model
        >>> model = make_model(16, width=8, heads=2, seed=0, embedding_std=1.0)
        >>> model.block.cell.attention_residual, model.block.depth
        (True, None)
    """
    from deqlab.nn.lm import LanguageModel
    from deqlab.nn.transformer import TransformerCell

    cell = TransformerCell(width, width, heads=heads, rngs=nnx.Rngs(seed))
    # a failed solve is recorded in the per-step statistics (converged_fraction), not warned about
    return LanguageModel(vocab_size, cell, depth=depth, solver="broyden", max_steps=max_steps, tol=tol,
                         on_failure="ignore", embedding_std=embedding_std, rngs=nnx.Rngs(seed + 1))


def _pure(state):
    # flax >= 0.11 deprecates State.to_pure_dict in favour of nnx.to_pure_dict
    return nnx.to_pure_dict(state) if hasattr(nnx, "to_pure_dict") else state.to_pure_dict()


def _load(module, pure, *filters):
    state = nnx.state(module, *filters)
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(module, state)


def learning_rate_schedule(learning_rate: float, steps: int, warmup: int = 0):
    """The schedule of :func:`train_language_model`: ``warmup`` steps of linear warm-up from 0 to
    ``learning_rate``, then a cosine decay to 0 at ``steps`` (optax's decay counts the warm-up
    too, as in 001 App. D: ``warmup=2000``, ``steps=52000`` is 2e3 warm-up then 5e4 of decay);
    with ``warmup=0`` a plain cosine decay from ``learning_rate``."""
    if warmup > 0:
        return optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup, steps)
    return optax.cosine_decay_schedule(learning_rate, steps)


@functools.lru_cache(maxsize=16)
def _transformation(learning_rate: float, steps: int, warmup: int):
    # One object per schedule: the optimiser's transformation is static in nnx.jit's cache key, so a
    # fresh chain per run (a resumed run, or a second model trained with the same schedule) retraced
    # and recompiled deqlab.nn.lm.train_step (3.3 s on the 2-core machine, chapter 5 page 4)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adam(learning_rate_schedule(learning_rate, steps, warmup)))


_REQUIRED = ("corpus", "tokenizer", "vocab_size", "context", "width", "heads", "steps", "batch_size",
             "learning_rate", "seed")


def train_language_model(config: dict, checkpoint_dir: Any = None, *, progress: bool = False,
                         stop_after: int | None = None, corpus: dict | None = None) -> dict:
    """Train one DEQ-Transformer language model; the function a sweep row runs.

    ``config`` keys: ``corpus`` (:data:`deqlab.lab.data.TEXT_DATASETS`), ``tokenizer``, ``vocab_size``,
    ``context``, ``width``, ``heads``, ``steps``, ``batch_size``, ``learning_rate`` (Adam with a
    cosine decay to 0 and gradients clipped to norm 1), ``seed``; optional ``warmup`` (steps of
    linear warm-up from 0 before the cosine decay, default 0; 001 App. D: 2000 of 52000, see
    :func:`learning_rate_schedule`), ``max_steps`` and
    ``tol`` (the Broyden solve), ``depth`` (None, the default: the DEQ; an int L: the same cell
    unrolled L times, the weight-tied network), ``embedding_std`` (:class:`deqlab.nn.LanguageModel`'s; default
    None), ``eval_batches`` (validation batches, default 8), ``eval_every`` (also evaluate on
    the validation batches before training and after every that many training steps; default 0:
    at the end only), ``radius_max_steps`` and ``radius_tol`` (both or neither, default None: at
    every evaluation the radius sequences are solved again from zero with that Broyden budget and
    relative tolerance, and the radius is taken at those solves, :func:`evaluate`),
    ``checkpoint_every`` (default ``steps // 4``), ``source`` and ``path`` (of the corpus).

    With a ``checkpoint_dir``, the model, the optimiser, the step and the log so far are saved
    every ``checkpoint_every`` steps and at the end, and a call that finds a checkpoint there
    resumes after its step (the batches are a function of the seed and the step, so a resumed run
    sees the batches the uninterrupted one would). ``stop_after`` ends the call after that many
    steps of the run, with a checkpoint and without a result (it simulates an interruption; the
    return value is then None). ``corpus`` reuses a :func:`prepare_corpus` result.

    Returns:
        ``loss``, ``steps_mean``, ``converged_fraction``, ``residual_max``: one entry per step;
        ``validation_loss`` (nats per token) and ``validation_perplexity``;
        ``validation_steps_mean`` and ``validation_converged_fraction`` (the solve at evaluation);
        ``validation_radius`` and ``validation_radius_converged`` (:func:`evaluate`'s ``radius`` and
        ``radius_converged``);
        ``evaluations``: with ``eval_every``, a dict of lists ``step`` and :data:`EVALUATED` (as
        :func:`evaluate` returns them), one entry per evaluation: before training (step 0) and
        after every ``eval_every`` steps (the evaluation at step k sees k updates);
        ``parameters``, ``vocabulary`` (the tokenizer's size), ``train_tokens``, ``seconds`` (this
        call's training time, the evaluations during training included),
        ``resumed_from`` (the step a checkpoint gave, 0 if none).
    """
    from tqdm import tqdm

    from deqlab.nn import lm
    from deqlab.nn.baselines import parameter_count

    where = "sequence.language_model.train_language_model"
    missing = [k for k in _REQUIRED if k not in config]
    if missing:
        raise checks.fail("config", f"a dict with the keys {', '.join(_REQUIRED)}", f"one missing {missing}", where)
    steps = checks.positive_int(config["steps"], "config['steps']", where)
    batch_size = checks.positive_int(config["batch_size"], "config['batch_size']", where)
    seed = checks.integer(config["seed"], "config['seed']", where, minimum=0)
    rate = checks.positive_number(config["learning_rate"], "config['learning_rate']", where)
    every = checks.positive_int(config.get("checkpoint_every", max(1, steps // 4)), "config['checkpoint_every']", where)
    eval_batches = checks.positive_int(config.get("eval_batches", 8), "config['eval_batches']", where)
    eval_every = checks.integer(config.get("eval_every", 0), "config['eval_every']", where, minimum=0, maximum=steps)
    radius_solve = _radius_solve(config.get("radius_max_steps"), config.get("radius_tol"), "config['radius_max_steps']",
                                 "config['radius_tol']", where)
    if stop_after is not None:
        stop_after = checks.positive_int(stop_after, "stop_after", where)
    if corpus is None:
        corpus = prepare_corpus(config["corpus"], tokenizer=config["tokenizer"], vocab_size=config["vocab_size"],
                                context=config["context"], source=config.get("source"), path=config.get("path"))
    train_windows = corpus["train"]
    per_epoch = len(train_windows) // batch_size
    if per_epoch < 1:
        raise checks.fail("config['batch_size']", f"at most the number of training windows ({len(train_windows)})",
                          batch_size, where)
    vocab = corpus["tokenizer"].vocab_size
    model = make_model(vocab, width=config["width"], heads=config["heads"], seed=seed,
                       max_steps=config.get("max_steps", 20), tol=config.get("tol"),
                       embedding_std=config.get("embedding_std"), depth=config.get("depth"))
    warmup = checks.integer(config.get("warmup", 0), "config['warmup']", where, minimum=0, maximum=steps - 1)
    optimizer = nnx.Optimizer(model, _transformation(rate, steps, warmup), wrt=nnx.Param)
    log = {k: np.full(steps, np.nan, np.float32) for k in LOGGED}
    # at step 0 (before training) and after every eval_every steps
    n_evaluations = steps // eval_every + 1 if eval_every else 0
    for k in EVALUATED:  # in the checkpointed log, so that a resumed run keeps the earlier evaluations
        log[f"eval_{k}"] = np.full(max(n_evaluations, 1), np.nan, np.float32)
    start_step = 0
    ckpt = None
    if checkpoint_dir is not None:
        from deqlab.lab.experiments.sweep import Checkpoints

        ckpt = Checkpoints(checkpoint_dir)
        if ckpt.latest_step() is not None:
            template = {"model": _pure(nnx.state(model, nnx.Param)), "optimizer": _pure(nnx.state(optimizer)),
                        "log": log}
            restored = ckpt.restore(template)
            _load(model, restored["model"], nnx.Param)
            _load(optimizer, restored["optimizer"])
            log = {k: np.asarray(v, np.float32) for k, v in restored["log"].items()}
            start_step = ckpt.latest_step()

    def save(step):
        if ckpt is not None:
            ckpt.save(step, {"model": _pure(nnx.state(model, nnx.Param)), "optimizer": _pure(nnx.state(optimizer)),
                             "log": log})

    latest = {}  # the evaluation after the last step, made in this call: the final one too (same model, batches)

    def record_evaluation(done):
        result = evaluate(model, corpus["validation"], batch_size, eval_batches, **radius_solve)
        for k, v in result.items():
            log[f"eval_{k}"][done // eval_every] = v
        if done == steps:
            latest.update(result)

    key = jax.random.key(seed)
    epoch_batches, epoch_of = None, None
    began = time.perf_counter()
    if eval_every and start_step == 0:
        record_evaluation(0)
    # a plain-text bar updated at most every 2 s: a stored notebook keeps a few lines, not one per step
    bar = tqdm(total=steps, initial=start_step, desc="DEQ-Transformer LM", disable=not progress, mininterval=2.0)
    try:
        for step in range(start_step, steps):
            epoch, index = divmod(step, per_epoch)
            if epoch != epoch_of:  # batches of an epoch depend on (seed, epoch) only: resumable
                epoch_batches = data.lm_batches(train_windows, batch_size, jax.random.fold_in(key, epoch))
                epoch_of = epoch
            batch = epoch_batches[index]
            metrics = jax.device_get(lm.train_step(model, optimizer, jnp.asarray(batch[:, :-1]),
                                                   jnp.asarray(batch[:, 1:])))
            for k in LOGGED:
                log[k][step] = metrics[k]
            if not math.isfinite(float(metrics["loss"])):
                raise FloatingPointError(f"{where}: the loss became {float(metrics['loss'])} at step {step}; lower "
                                         "the learning rate.")
            bar.update(1)
            bar.set_postfix(loss=f"{float(metrics['loss']):.3f}", solver_steps=f"{float(metrics['steps_mean']):.1f}",
                            refresh=False)
            done = step + 1
            if eval_every and done % eval_every == 0:
                record_evaluation(done)
            if done % every == 0 or done == steps:
                save(done)
            if stop_after is not None and done - start_step >= stop_after and done < steps:
                if done % every:
                    save(done)
                return None
    finally:
        bar.close()
        if ckpt is not None:
            ckpt.close()
    seconds = time.perf_counter() - began
    final = latest or evaluate(model, corpus["validation"], batch_size, eval_batches, **radius_solve)
    validation_loss = final["loss"]
    evaluations = {"step": [eval_every * i for i in range(n_evaluations)],
                   **{k: [float(v) for v in log[f"eval_{k}"][:n_evaluations]] for k in EVALUATED}}
    return {
        **{k: [float(v) for v in log[k]] for k in LOGGED},
        "validation_loss": validation_loss,
        "validation_perplexity": float(np.exp(validation_loss)),
        "validation_steps_mean": final["steps_mean"],
        "validation_converged_fraction": final["converged_fraction"],
        "validation_radius": final["radius"],
        "validation_radius_converged": final["radius_converged"],
        "evaluations": evaluations,
        "parameters": parameter_count(model),
        "vocabulary": int(vocab),
        "train_tokens": int(corpus["tokens"]["train"]),
        "seconds": seconds,
        "resumed_from": int(start_step),
    }


def _diagonal_path_cell(cell, z, x):
    """``cell(z, x)`` with every key and value held at ``z`` except each position's own: the same
    value, and a Jacobian in ``z`` that is block diagonal, with the blocks ``d f_t / d z_t`` of the
    cell's (module code of :class:`deqlab.nn.TransformerCell` ``attention`` and ``__call__``,
    without dropout masks)."""
    xq, xk, xv = jnp.split(cell.inject(x), 3, axis=-1)
    dh = cell.width // cell.heads

    def heads(u):  # (..., T, d) -> (..., H, T, dh)
        return jnp.swapaxes(u.reshape(u.shape[:-1] + (cell.heads, dh)), -2, -3)

    q, k, v = heads(cell.query(z) + xq), heads(cell.key(z) + xk), heads(cell.value(z) + xv)
    q = q + cell.content_bias[...][:, None, :].astype(q.dtype)
    k_held, v_held = jax.lax.stop_gradient(k), jax.lax.stop_gradient(v)
    root = jnp.sqrt(jnp.asarray(dh, q.dtype))
    length = z.shape[-2]
    t = jnp.arange(length)
    distance = t[:, None] - t[None, :]
    # query t against the held keys, plus (value 0) its own key's variation on the diagonal
    own = jnp.sum(q * (k - k_held), axis=-1) / root  # (..., H, T)
    logits = cell._batched(q, k_held, contract=(-1, -1)) / root + jnp.eye(length, dtype=q.dtype) * own[..., None]
    logits = logits + cell.position_bias[...][:, jnp.clip(distance, 0, cell.max_distance - 1)].astype(logits.dtype)
    logits = jnp.where(distance >= 0, logits, jnp.finfo(logits.dtype).min / 2)
    weights = jax.nn.softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), axis=-1).astype(v.dtype)
    # the held values, plus (value 0) the variation of position t's own value with its weight
    mixed = (cell._batched(weights, v_held, contract=(-1, -2))
             + jnp.diagonal(weights, axis1=-2, axis2=-1)[..., None] * (v - v_held))
    mixed = jnp.swapaxes(mixed, -2, -3)
    attended = cell.out(mixed.reshape(mixed.shape[:-2] + (cell.width,)))
    a = cell.attention_norm(z + attended if cell.attention_residual else attended)
    return cell.output_norm(a + cell.contract(jax.nn.relu(cell.expand(a))))


def diagonal_blocks(cell: nnx.Module, z: Any, x: Any) -> tuple[jax.Array, jax.Array]:
    """The diagonal blocks ``d f_t / d z_t`` of a :class:`deqlab.nn.TransformerCell`'s Jacobian,
    with ``width`` JVPs per sequence.

    The cell is causal, so ``J_f`` is block lower triangular over positions and its eigenvalues are
    those of the T diagonal blocks: their largest modulus is the spectral radius, exactly. Forming
    the whole Jacobian takes ``T * width`` JVPs (:func:`deqlab.lab.experiments.sequence.weight_tied.jacobian`);
    here each position's own key and value are the only ones left free (the others held at ``z``),
    which makes the Jacobian block diagonal without changing its diagonal blocks, and ``width``
    JVPs (one unit vector at every position at once) give them all. The result agrees with the
    dense Jacobian's blocks to float32 rounding (checked on chapter 5 page 4).

    Args:
        cell: a :class:`deqlab.nn.TransformerCell` (without active dropout).
        z: the state ``(B, T, width)``.
        x: the input ``(B, T, in_features)``.

    Returns:
        ``(f, blocks)``: ``f = cell(z, x)`` and ``blocks`` of shape ``(B, T, width, width)``,
        ``blocks[b, t, i, j] = d f(z)_{t, i} / d z_{t, j}``.

    Raises:
        ValueError: ``cell`` is not a transformer cell, or ``z`` or ``x`` has the wrong shape.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab import nn
        >>> from deqlab.lab.experiments.sequence import language_model as lm, weight_tied
        >>> cell = nn.TransformerCell(4, 4, heads=2, rngs=nnx.Rngs(0))
        >>> z, x = jax.random.normal(jax.random.key(1), (2, 1, 3, 4))
        >>> f, blocks = lm.diagonal_blocks(cell, z, x)
        >>> dense = weight_tied.jacobian(cell, z, x).reshape(1, 3, 4, 3, 4)
        >>> bool(jnp.allclose(blocks[0, 2], dense[0, 2, :, 2, :], atol=1e-5)), blocks.shape
        (True, (1, 3, 4, 4))
    """
    from deqlab.nn.transformer import TransformerCell

    where = "sequence.language_model.diagonal_blocks"
    if not isinstance(cell, TransformerCell):
        raise checks.fail("cell", "a deqlab.nn.TransformerCell", type(cell).__name__, where)
    z, x = cell._inputs(z, x, where)
    if z.ndim != 3:
        raise ValueError(f"{where}: `z` must have shape (B, T, {cell.width}), got {tuple(z.shape)}.")
    return _diagonal_blocks(cell, z, x)


def _blocks(cell, z, x):
    f, apply = jax.linearize(lambda u: _diagonal_path_cell(cell, u, x), z)
    columns = jax.vmap(lambda e: apply(jnp.broadcast_to(e, z.shape)))(jnp.eye(z.shape[-1], dtype=z.dtype))
    return f, jnp.moveaxis(columns, 0, -1)  # (width, B, T, width) -> (B, T, width_out, width_in)


_diagonal_blocks = nnx.jit(_blocks)


@nnx.jit
def _solve_radius_sequences(model, tokens):
    from deqlab.solvers import Result

    x = model.embed(tokens)
    z, sol = model.block.deq(x, return_solution=True)  # what model.block(x) solves, with its per-sequence result
    return z, x, sol.result == Result.SUCCESS


@nnx.jit
def _power_radius(cell, z, x):
    from deqlab import stability

    return stability.spectral_radius(lambda z, x: cell(z, x), z, x, key=jax.random.key(0), steps=RADIUS_STEPS,
                                     batch_axis=0)


def _radius(model, tokens) -> tuple[np.ndarray, np.ndarray]:
    """Per sequence, the spectral radius of ``J_f`` at the solver's last iterate (exact up to
    :data:`EXACT_RADIUS_WIDTH`, a :data:`RADIUS_STEPS`-step power-iteration estimate above) and
    whether that solve met its tolerance."""
    z, x, converged = _solve_radius_sequences(model, tokens)
    cell = model.block.cell
    if cell.width <= EXACT_RADIUS_WIDTH:
        radius = _initialisation.block_radius(jax.device_get(_diagonal_blocks(cell, z, x)[1]))
    else:
        radius = np.asarray(jax.device_get(_power_radius(cell, z, x)))
    return radius, np.asarray(jax.device_get(converged), bool)


def _radius_solve(max_steps, tol, steps_name, tol_name, where) -> dict:
    """The re-solve's settings, checked: both None (no re-solve) or a budget and a tolerance."""
    if (max_steps is None) != (tol is None):
        given, missing = (steps_name, tol_name) if tol is None else (tol_name, steps_name)
        raise checks.fail(missing, f"given together with {given} (the re-solve's budget and tolerance)", None, where)
    if max_steps is None:
        return {}
    return {"radius_max_steps": checks.positive_int(max_steps, steps_name, where),
            "radius_tol": checks.positive_number(tol, tol_name, where)}


def _resolver(model, max_steps, tol):
    """A copy of ``model`` (same parameters) whose forward solve, in either mode, is its Broyden
    solver with ``max_steps`` and ``tol``."""
    twin = nnx.clone(model)
    deq = twin.block.deq
    deq.solver = deq.solver.replace(max_steps=max_steps, tol=tol)
    deq.eval_max_steps, deq.eval_tol = None, None
    return twin


def equilibrium_statistics(model: nnx.Module, tokens: Any, *, max_steps: int | None = None,
                           tol: float | None = None) -> dict[str, Any]:
    """The forward solve of a :func:`make_model` model on ``tokens``, at its own settings or with a
    budget of this call's, and what the equilibrium looks like: one compiled program.

    Args:
        model: a :func:`make_model` language model in equilibrium mode (its cell a
            :class:`deqlab.nn.TransformerCell`).
        tokens: int ``(batch, T)``.
        max_steps, tol: this call's iteration limit and tolerance (the layer's budget per call,
            :class:`deqlab.nn.DEQ`): ``max_steps`` an integer (or integer scalar array) in ``[1,
            cap]``, the cap being the model's own limit in its current mode; ``tol`` a number > 0
            (one below what the dtype can reach warns, :mod:`deqlab.precision`). None: the model's
            own. They are traced, so calls that differ only in them share one compiled program (a
            model built with other solver settings compiles its own). The matmul precision follows
            the model's own tolerance: on a CPU the result is exactly that of a model built with
            this budget; on a TPU, or a GPU whose default precision is TF32, a looser ``tol`` than
            the model's still runs at the model's (higher) precision.

    Returns:
        ``converged_fraction`` and ``steps_mean`` of the solve; ``converged``: per sequence, whether
        its solve met the tolerance (bool); ``radius``: per sequence, the
        spectral radius of ``J_f`` at the solver's last iterate z (at z* only where the solve
        converged), exact from the diagonal blocks (:func:`diagonal_blocks`) up to width
        :data:`EXACT_RADIUS_WIDTH`, a power-iteration estimate above; ``radius_power``: the
        :data:`RADIUS_STEPS`-step power-iteration estimate (:func:`deqlab.stability.spectral_radius`)
        at the same point, for comparison;
        ``f_norm``: per sequence, ``||f(z)||`` (``sqrt(T d)`` for a LayerNorm output without gain);
        ``residual``: per sequence, the relative residual ``||f(z) - z|| / ||f(z)||`` at z (at most
        this call's tolerance where ``converged``);
        ``inject_std``: the standard deviation of the injection's entries ``x W_x`` and
        ``state_std`` that of the state's contribution to the queries ``z W_Q``.

    Raises:
        ValueError: the model is unrolled or its cell is not a transformer cell, ``tokens`` are
            not valid ids, or ``max_steps`` or ``tol`` is out of its range (named, with the range).

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from deqlab.lab.experiments.sequence import language_model as lm
        >>> model = lm.make_model(16, width=8, heads=2, seed=0, max_steps=30, tol=1e-2, embedding_std=1.0)
        >>> tokens = jnp.array([[1, 2, 3, 4], [5, 6, 7, 8]])
        >>> out = lm.equilibrium_statistics(model, tokens)
        >>> out["radius"].shape, out["converged"].shape, round(out["f_norm"][0] ** 2)
        ((2,), (2,), 32)
        >>> bool(np.all(out["residual"][out["converged"]] <= 1e-2))
        True
        >>> lm.equilibrium_statistics(model, tokens, max_steps=1)["steps_mean"]   # the same program
        1.0
    """
    from deqlab.nn.lm import _token_ids
    from deqlab.nn.transformer import TransformerCell
    from deqlab.solvers import make_budget

    where = "sequence.language_model.equilibrium_statistics"
    if model.block.depth is not None or not isinstance(model.block.cell, TransformerCell):
        raise checks.fail("model", "a make_model language model in equilibrium mode (a TransformerCell, depth None)",
                          type(model.block.cell).__name__, where)
    tokens = _token_ids(jnp.asarray(tokens), model.vocab_size, "tokens", where)
    deq = model.block.deq
    dtype = deq.dtype or nnx.eval_shape(lambda m, t: m.embed(t), model, tokens).dtype  # the solve's dtype
    # always the budget's arrays (the mode's own settings where none is given), checked here: a call
    # with and one without max_steps / tol run one compiled program
    budget = make_budget(deq.eval_solver if deq.deterministic else deq.solver, dtype, max_steps=max_steps, tol=tol,
                         where=where)
    (stats, converged, power, f_norm, residual, inject, state), z, x = _equilibrium_statistics(
        model, tokens, budget.max_steps, budget.tol)
    stats, converged, power, f_norm, residual, inject, state = jax.device_get(
        (stats, converged, power, f_norm, residual, inject, state))
    if model.block.cell.width <= EXACT_RADIUS_WIDTH:  # exact, at the same iterate z (one solve, not two)
        radius = _initialisation.block_radius(jax.device_get(_diagonal_blocks(model.block.cell, z, x)[1]))
    else:  # the power-iteration estimate, as _radius gives it
        radius = np.asarray(power)
    return {"converged_fraction": float(stats["converged_fraction"]), "steps_mean": float(stats["steps_mean"]),
            "converged": np.asarray(converged, bool),
            "radius": radius, "radius_power": np.asarray(power), "f_norm": np.asarray(f_norm),
            "residual": np.asarray(residual),
            "inject_std": float(inject), "state_std": float(state)}


@nnx.jit
def _equilibrium_statistics(model, tokens, max_steps, tol):
    from deqlab import stability
    from deqlab.nn.lm import solver_stats
    from deqlab.solvers import Result

    x = model.embed(tokens)
    # what model.block(x) solves (with this call's budget), with its per-sequence result
    z, sol = model.block.deq(x, return_solution=True, max_steps=max_steps, tol=tol)
    stats, converged = solver_stats(sol), sol.result == Result.SUCCESS
    cell = model.block.cell
    power = stability.spectral_radius(lambda z, x: cell(z, x), z, x, key=jax.random.key(0), steps=RADIUS_STEPS,
                                      batch_axis=0)
    fz = cell(z, x)
    f_norm = jnp.sqrt(jnp.sum(fz ** 2, axis=(-2, -1)))
    residual = jnp.sqrt(jnp.sum((fz - z) ** 2, axis=(-2, -1))) / f_norm
    return (stats, converged, power, f_norm, residual, jnp.std(cell.inject(x)), jnp.std(cell.query(z))), z, x


def evaluate(model: nnx.Module, windows: np.ndarray, batch_size: int, eval_batches: int, *,
             radius_max_steps: int | None = None, radius_tol: float | None = None) -> dict[str, float]:
    """Validation loss and solver statistics of ``model`` on the first ``eval_batches`` batches of
    ``windows``, in evaluation mode (the model is left in training mode).

    Args:
        model: a :func:`make_model` language model.
        windows: int windows ``(n, context + 1)`` (inputs ``[:, :-1]``, targets ``[:, 1:]``).
        batch_size: sequences per batch.
        eval_batches: number of batches (fewer if ``windows`` holds fewer).
        radius_max_steps, radius_tol: both None (default): the radius is taken where the model's
            own solve of the radius sequences stops; both given: those sequences are solved again
            from zero by a copy of the model whose Broyden solver has this budget and relative
            tolerance (chapter 5 page 4 uses 300 steps to 1e-5, as chapter 5 page 6's probe), and the
            radius is taken at those solves.

    Returns:
        ``loss`` (nats per token), ``converged_fraction`` and ``steps_mean`` of the forward solve,
        each the mean over the batches; ``radius``: over the first :data:`RADIUS_SEQUENCES`
        sequences, the median spectral radius of the cell's Jacobian at the solver's last iterate
        (exact from the diagonal blocks, :func:`diagonal_blocks`, up to width
        :data:`EXACT_RADIUS_WIDTH`; above, :func:`deqlab.stability.spectral_radius` with
        :data:`RADIUS_STEPS` steps): without the re-solve the median over all of them, at the
        model's own solve; with it, the median over the sequences whose re-solve converged (NaN if
        none did); NaN for an unrolled model; ``radius_converged``: the fraction of those
        sequences whose solve (the re-solve, if asked for) met its tolerance (NaN for an unrolled
        model). The radius is that of an equilibrium z* only at a converged solve, and only to that
        solve's tolerance: near a radius of 1 a loose residual leaves z far from z*. Above 1 at z*,
        the equilibrium repels the plain iteration z <- f(z), and only a root finder such as
        Broyden's method can find it.

    Raises:
        ValueError: only one of ``radius_max_steps`` and ``radius_tol`` is given, or one is not
            positive.

    Example:
        >>> import numpy as np
        >>> from deqlab.lab.experiments.sequence import language_model as lm
        >>> model = lm.make_model(16, width=8, heads=2, seed=0, max_steps=3, tol=1e-2, embedding_std=1.0)
        >>> windows = np.arange(2 * 9).reshape(2, 9) % 16
        >>> out = lm.evaluate(model, windows, 2, 1, radius_max_steps=300, radius_tol=1e-5)
        >>> sorted(out) == sorted(lm.EVALUATED), bool(np.isfinite(out["radius"])), out["radius_converged"]
        (True, True, 1.0)
    """
    from deqlab.nn import lm

    radius_solve = _radius_solve(radius_max_steps, radius_tol, "radius_max_steps", "radius_tol",
                                 "sequence.language_model.evaluate")
    n_eval = min(eval_batches, max(1, len(windows) // batch_size))
    eval_size = min(batch_size, len(windows))
    totals = {k: [] for k in EVALUATED if k not in ("radius", "radius_converged")}
    model.eval()
    try:
        for i in range(n_eval):
            batch = windows[i * eval_size:(i + 1) * eval_size]
            metrics = jax.device_get(lm.eval_step(model, jnp.asarray(batch[:, :-1]), jnp.asarray(batch[:, 1:])))
            for k in totals:
                totals[k].append(float(metrics[k]))
        radius = radius_converged = np.nan
        if model.block.depth is None:
            tokens = jnp.asarray(windows[:RADIUS_SEQUENCES, :-1])
            if radius_solve:
                radii, converged = _radius(_resolver(model, radius_max_steps, radius_tol), tokens)
                radius = float(np.median(radii[converged])) if converged.any() else np.nan
            else:
                radii, converged = _radius(model, tokens)
                radius = float(np.median(radii))
            radius_converged = float(np.mean(converged))
    finally:
        model.train()
    return {**{k: float(np.mean(v)) for k, v in totals.items()}, "radius": radius,
            "radius_converged": radius_converged}


def run_language_model(directory: Any, configs: Sequence[dict], *, progress: bool = False) -> list[dict]:
    """Each configuration of ``configs`` through the resumable sweep in ``directory``, with
    checkpoints: an interrupted sweep resumes at the newest checkpoint of the unfinished run."""
    from deqlab.lab.experiments.sweep import run_sweep

    return run_sweep(lambda config, ckpt: train_language_model(config, ckpt, progress=progress), list(configs),
                     directory, checkpoints=True, progress=False, description="language model")
