"""Full scale checked without running it: a dry run of each training experiment's ``full`` configuration.

For every experiment of the book with a ``full`` configuration that trains a model, a dry run

1. builds the model and its optimiser state at the full configuration's shapes with
   ``nnx.eval_shape`` / ``jax.eval_shape`` (no array of the full size is ever allocated: the
   parameters, the optimiser state and the batch are ``jax.ShapeDtypeStruct``),
2. traces one training step (loss, gradient, optimiser update; all seeds at once where the
   experiment trains them in one vmapped program) and lowers and compiles it for the local CPU
   (``jax.jit(step).lower(*abstract).compile()``), or only lowers it when asked to
   (``compile=False``: FLOPs from the lowered HLO, no memory figures),
3. reads the compiled program's memory (``compiled.memory_analysis()``) and FLOP
   (``compiled.cost_analysis()``) estimates, and turns them into what a full run needs: steps x
   FLOPs per step at an assumed device throughput, and the number of devices by memory.

XLA's cost analysis counts the body of each loop once: a solver's ``while_loop`` with
``max_steps`` iterations is counted as one iteration. The report therefore also lowers one
evaluation of the fixed-point map f(z, x) (the forward solver's work per iteration) and of its
vector-Jacobian product (the adjoint solve's work per iteration), and budgets the step as the
compiled count plus ``max_steps - 1`` further iterations of each: an upper bound at the
iteration limit, which the solves reach only when they do not converge (the solvers' own
bookkeeping, Anderson's small least-squares problem or Broyden's low-rank update, is left out).

Command line::

    python -m deqlab.lab.experiments.dry_run                       # every experiment, a table
    python -m deqlab.lab.experiments.dry_run --experiment language_model --json
    python -m deqlab.lab.experiments.dry_run --write book/_data/dry_runs.json

``--write`` stores the table with its provenance (jax version, git commit, date, the assumed
throughput), which the book's pages include.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import subprocess
import sys
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import optax
from flax import nnx

__all__ = ["DryRunReport", "DEVICE", "EXPERIMENTS", "dry_run", "dry_run_all", "cost_flops", "memory_bytes",
           "table", "page_summary", "write", "main"]

DEVICE = {
    "name": "NVIDIA H100 SXM (80 GB)",
    "memory_bytes": 80e9,
    "usable_fraction": 0.9,
    "peak_flops": {"float32": 67e12, "bfloat16": 989e12},
    "utilisation": 0.3,
}
"""The device a full run is costed on: an H100 at 30% of its peak (67 TFLOP/s float32 without
tensor cores, 989 TFLOP/s dense bfloat16, matching the experiment's dtype), 90% of its 80 GB
usable for one program."""


# --------------------------------------------------------------------------------------------
# jax version differences
# --------------------------------------------------------------------------------------------


def cost_flops(stage: Any) -> float | None:
    """FLOPs of a lowered or compiled jax program, or None where the backend gives none.

    ``cost_analysis()`` returns a dict in current jax, a list with one dict per program in some
    older versions, and None (or raises) on backends without a cost model; every form is handled.

    Args:
        stage: ``jax.jit(f).lower(...)`` or its ``.compile()``.

    Returns:
        The ``"flops"`` entry as a float (summed over the list's programs), or None.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> s = jax.ShapeDtypeStruct((8, 8), jnp.float32)
        >>> cost_flops(jax.jit(jnp.matmul).lower(s, s).compile())
        1024.0
    """
    try:
        analysis = stage.cost_analysis()
    except Exception:  # some backends raise instead of returning None
        return None
    if analysis is None:
        return None
    if isinstance(analysis, dict):
        analysis = [analysis]
    values = [a.get("flops") for a in analysis if isinstance(a, dict) and a.get("flops") is not None]
    return float(sum(values)) if values else None


def memory_bytes(compiled: Any) -> dict[str, int] | None:
    """Argument, output, temporary, alias and code bytes of a compiled program, or None.

    ``compiled.memory_analysis()`` returns an object with ``*_size_in_bytes`` attributes, or None
    on some backends (and older jax can raise where it is not implemented).

    Args:
        compiled: ``jax.jit(f).lower(...).compile()``.

    Returns:
        ``{"argument", "output", "temp", "alias", "code", "peak"}`` in bytes, where ``peak`` is
        argument + output + temp - alias (the buffers alive together at worst), or None.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> s = jax.ShapeDtypeStruct((8, 8), jnp.float32)
        >>> memory_bytes(jax.jit(jnp.matmul).lower(s, s).compile())["argument"]
        512
    """
    try:
        m = compiled.memory_analysis()
    except Exception:
        return None
    if m is None:
        return None
    get = lambda name: int(getattr(m, f"{name}_size_in_bytes", 0) or 0)  # noqa: E731
    out = {"argument": get("argument"), "output": get("output"), "temp": get("temp"), "alias": get("alias"),
           "code": get("generated_code")}
    out["peak"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    return out


# --------------------------------------------------------------------------------------------
# Programs
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Program:
    """What a dry run lowers: a training step, its abstract arguments, and the cell it iterates."""

    step: Callable
    args: tuple
    parameters: int
    cell: Callable
    cell_args: tuple
    cell_vjp: Callable
    cell_vjp_args: tuple
    forward_budget: int
    backward_budget: int
    batch: int
    models_per_step: int = 1


def _sds(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(tuple(int(s) for s in shape), jnp.dtype(dtype))


def _stack(tree, n):
    """The abstract tree with a leading axis of n (seeds trained in one vmapped program)."""
    return jax.tree_util.tree_map(lambda s: _sds((n, *s.shape), s.dtype), tree)


def _count(params) -> int:
    return int(sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(params)))


def _training_program(make_model, tx, loss, batch, *, cell_of, cell_shapes, budgets, seeds=None):
    """One training step of ``make_model()``: ``loss(model, *batch)``, its gradient, ``tx``'s update.

    The model is built abstractly (``nnx.eval_shape``); with ``seeds`` the step is vmapped over
    that many copies of the parameters, optimiser state and batch, as the experiments that train
    all seeds in one program do."""
    abstract = nnx.eval_shape(make_model)
    graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
    opt_state = jax.eval_shape(tx.init, params)

    def step(params, opt_state, rest, *batch):
        def objective(p):
            return loss(nnx.merge(graphdef, p, rest), *batch)

        value, grads = jax.value_and_grad(objective)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    cell = cell_of(abstract)
    cell_graph, cell_state = nnx.split(cell)
    z, x = (_sds(s) for s in cell_shapes)

    def f(state, z, x):
        return nnx.merge(cell_graph, state)(z, x)

    def f_vjp(state, z, x, v):
        _, pullback = jax.vjp(lambda z: f(state, z, x), z)
        return pullback(v)[0]

    args, cell_args, vjp_args = (params, opt_state, rest, *batch), (cell_state, z, x), (cell_state, z, x, z)
    cell_fn, vjp_fn = f, f_vjp
    n = 1
    if seeds:
        n = seeds
        step = jax.vmap(step, in_axes=(0, 0, None) + (0,) * len(batch))
        args = (_stack(params, n), _stack(opt_state, n), rest, *(_stack(b, n) for b in batch))
        cell_fn, vjp_fn = jax.vmap(f), jax.vmap(f_vjp)
        cell_args, vjp_args = _stack(cell_args, n), _stack(vjp_args, n)
    return _Program(step, args, _count(params), cell_fn, cell_args, vjp_fn, vjp_args, budgets[0], budgets[1],
                    batch=int(batch[0].shape[0]), models_per_step=n)


def _cross_entropy(model, x, y):
    out = model(x)
    logits = out[0] if isinstance(out, tuple) else out
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y).mean()


def _digits_size():
    from deqlab.lab import data

    return len(data.load_dataset("digits", split="train")[0])


# ch0_practice/05_training: practice.train_digits at width pick(quick=64, full=256), batch 32, 40 epochs
def _practice_training(batch=None, width=None):
    from deqlab.lab.experiments import practice

    batch, width = batch or 32, width or 256
    max_steps = 50
    program = _training_program(
        lambda: practice.DigitsClassifier(width=width, scale=0.9, max_steps=max_steps, rngs=nnx.Rngs(0)),
        optax.chain(optax.clip_by_global_norm(1.0), optax.adam(3e-3)), _cross_entropy,
        (_sds((batch, 64)), _sds((batch,), jnp.int32)),
        cell_of=lambda m: m.deq.cell, cell_shapes=((batch, width), (batch, 64)), budgets=(max_steps, max_steps))
    return program


def _practice_steps():
    return 40 * (_digits_size() // 32), "40 epochs x (digits training split // batch 32), one model per run"


# ch3_nonlinear/05_training: nonlinear.training on MNIST, width 128, batch 128, 20 epochs, 10 seeds vmapped
_MNIST_TRAIN = 60_000


def _nonlinear_training(batch=None, width=None):
    from deqlab.lab.experiments.nonlinear import training

    batch, width = batch or 128, width or 128
    max_steps = training._DEFAULTS["max_steps"]
    return _training_program(
        lambda: training.EquilibriumClassifier(784, width=width, ensemble="gaussian", scale=1.0,
                                               max_steps=max_steps, rngs=nnx.Rngs(0)),
        optax.adam(1e-2), _cross_entropy, (_sds((batch, 784)), _sds((batch,), jnp.int32)),
        cell_of=lambda m: m.deq.cell, cell_shapes=((batch, width), (batch, 784)),
        budgets=(max_steps, max_steps), seeds=10)


def _nonlinear_steps():
    sweeps = 3 * 9 + 2 * 4  # the grid (3 families x 9 scales) and the rate tuning (2 families x 4 rates)
    return sweeps * 20 * (_MNIST_TRAIN // 128), ("(3 families x 9 scales + 2 families x 4 rates) sweeps x 20 epochs x "
                                                 "(60000 // 128) batches; each step trains the 10 seeds at once")


# ch4_kglm/04_seq2seq: kglm.seq2seq, full-batch (20000 sequences of 100 points), 400 epochs, seeds 10 per program
def _seq2seq(batch=None, width=None):
    from deqlab.lab.experiments.kglm import seq2seq

    batch = batch or 20_000
    n = width or seq2seq.GRID_SIZE
    max_steps = 40

    def mse(model, y, t):
        return jnp.mean((model(y) - t) ** 2)

    return _training_program(
        lambda: seq2seq.Seq2SeqDEQ("random", 1.0, n=n, max_steps=max_steps, rngs=nnx.Rngs(0)),
        optax.adam(1e-3), mse, (_sds((batch, n)), _sds((batch, n))),
        cell_of=lambda m: m.deq.cell, cell_shapes=((batch, n), (batch, n)), budgets=(max_steps, max_steps),
        seeds=10)


def _seq2seq_steps():
    return 3 * 10 * 400, ("3 schemes x 100 seeds in programs of 10 seeds x 400 epochs of one full-batch step "
                          "(train_size 20000)")


# ch4_kglm/05_denoising: kglm.denoising on CIFAR-10 (3 x 32 x 32), batch 50, Anderson(m=5) to at most 30
# steps, the 100 seeds of one scale in one vmapped program (the page's full configuration)
_CIFAR_TRAIN = 50_000
_DENOISING_VALIDATION = 5_000  # the page's full validation_size, held out of the training split
_DENOISING_SEEDS = 100


def _denoising(batch=None, width=None):
    from deqlab.lab.experiments.kglm import denoising as dn

    batch = batch or 50
    side = width or 32  # the image side (CIFAR-10: 32)
    max_steps, memory = 30, 5
    size = 2 * dn.RADIUS + 1
    weights = {name: _sds((3, 3, size, size)) for name in dn.LAYERS}
    tx = optax.scale_by_adam()
    opt_state = jax.eval_shape(tx.init, weights)
    images = _sds((batch, 3, side, side))

    def step(weights, opt_state, noisy, clean):
        # one step of denoising._program's epoch: the loss through the implicit solve, Adam's update
        def loss(w):
            out, _ = dn.denoise(w, noisy, tol=1e-3, max_steps=max_steps, anderson_m=memory)
            return jnp.mean((out - clean) ** 2)

        value, grads = jax.value_and_grad(loss)(weights)
        updates, opt_state = tx.update(grads, opt_state, weights)
        updates = jax.tree_util.tree_map(lambda u: -1e-3 * u, updates)
        return optax.apply_updates(weights, updates), opt_state, value

    transfer = jax.eval_shape(lambda w: dn._transfer(w, side, side), weights["W1"])
    state = _sds(images.shape)

    def cell(t1, z, b):
        return jax.nn.relu(dn._apply_transfer(t1, z) + b)

    def cell_vjp(t1, z, b, v):
        _, pullback = jax.vjp(lambda z: cell(t1, z, b), z)
        return pullback(v)[0]

    n = _DENOISING_SEEDS
    return _Program(
        jax.vmap(step), (_stack(weights, n), _stack(opt_state, n), _stack(images, n), _stack(images, n)),
        _count(weights), jax.vmap(cell), _stack((transfer, state, state), n), jax.vmap(cell_vjp),
        _stack((transfer, state, state, state), n), max_steps, max_steps, batch=batch, models_per_step=n)


def _denoising_steps():
    from deqlab.lab.experiments.kglm import denoising as dn

    points = len(dn.PAPER_CODE_VARIANCES) + len(dn.PAPER_CS)
    train = _CIFAR_TRAIN - _DENOISING_VALIDATION
    return points * 5 * (train // 50), (
        f"{points} scales ({len(dn.PAPER_CODE_VARIANCES)} variances, {len(dn.PAPER_CS)} values of C) x 5 epochs x "
        f"({train} // 50) batches ({_DENOISING_VALIDATION} of CIFAR-10's {_CIFAR_TRAIN} training images held out "
        f"for validation); each step trains the {_DENOISING_SEEDS} seeds of a scale at once (validation- and "
        "test-set evaluations not counted)")


# ch5_transformers/02_copy_memory: the DEQ-Transformer of 003 Table 1 (14K parameters), T = 400, batch 64
def _copy_memory(batch=None, width=None):
    from deqlab.lab.experiments.sequence import copy_memory as cm
    from deqlab.nn import baselines

    batch = batch or 64
    length = cm.PAPER_DELAY + 20
    # page 2's iteration limits, 003's code's: 30 Broyden steps forward, 40 for the adjoint solve
    max_steps, backward_max_steps = 30, 40
    make = lambda w: cm._deq_transformer(w, length, 0, max_steps, 1e-2,  # noqa: E731
                                         backward_max_steps=backward_max_steps)
    width = width or baselines.width_for_parameters(make, 14_000, range(cm._HEADS, 257, cm._HEADS))

    def loss(model, x, y):
        return cm._loss(model, x, y)[0]

    return _training_program(
        lambda: make(width), optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3)), loss,
        (_sds((batch, length), jnp.int32), _sds((batch, length), jnp.int32)),
        cell_of=lambda m: m.block.cell, cell_shapes=((batch, length, width), (batch, length, width)),
        budgets=(max_steps, backward_max_steps))


def _copy_memory_steps():
    del_ = "20000 steps of batch 64 (the DEQ-Transformer; the TCN, LSTM and GRU baselines are not costed)"
    return 20_000, del_


# ch5_transformers/04_language_model: 001 App. D, Wikitext-103, vocabulary 32000, width 700, 10 heads
def _language_model(batch=None, width=None):
    from deqlab.lab import data
    from deqlab.lab.experiments.sequence import language_model as lm_exp
    from deqlab.nn import lm

    batch = batch or 512
    width = width or 700
    heads = 10 if width % 10 == 0 else 1
    context = data.LM_CONTEXT
    max_steps = 20

    def loss(model, tokens, targets):
        return lm.lm_loss(model, tokens, targets)[0]

    schedule = lm_exp.learning_rate_schedule(1e-3, 52_000, 2_000)
    return _training_program(
        lambda: lm_exp.make_model(32_000, width=width, heads=heads, seed=0, max_steps=max_steps, tol=1e-2),
        optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule)), loss,
        (_sds((batch, context), jnp.int32), _sds((batch, context), jnp.int32)),
        cell_of=lambda m: m.block.cell, cell_shapes=((batch, context, width), (batch, context, width)),
        budgets=(max_steps, max_steps))


def _language_model_steps():
    return 52_000, "52000 steps of batch 512 x 128 tokens (001 App. D)"


# ch5_transformers/06_ensemble_study: 001 §4.3, the language model of 001 App. D with the feed-forward matrices drawn
# from an ensemble, 10 seeds per program (ensemble_study.FULL); the Gaussian shapes (the orthogonal ones are the same,
# the GOE's feed-forward is a quarter as wide)
def _ensemble_study(batch=None, width=None):
    from deqlab.lab.experiments.sequence import ensemble_study as es
    from deqlab.nn import lm

    o = es.study_config("full")
    width = width or o["width"]
    o = dict(o, batch_size=batch or o["batch_size"], width=width, heads=o["heads"] if width % o["heads"] == 0 else 1)
    batch, context = o["batch_size"], o["context"]

    def loss(model, tokens, targets):
        return lm.lm_loss(model, tokens, targets)[0]

    return _training_program(
        lambda: es._make_model(o, o["vocab_size"], "gaussian", 1.0, nnx.Rngs(0)), es._optimizer(o), loss,
        (_sds((batch, context), jnp.int32), _sds((batch, context), jnp.int32)),
        cell_of=lambda m: m.block.cell, cell_shapes=((batch, context, width), (batch, context, width)),
        budgets=(o["max_steps"], o["max_steps"]), seeds=10)


def _ensemble_study_steps():
    from deqlab.lab.experiments.sequence import ensemble_study as es

    configurations = len(es.ENSEMBLES) * len(es.SQRT_V)
    return configurations * es.FULL["steps"], (
        f"{configurations} configurations (3 ensembles x 3 scales) x {es.FULL['steps']} steps of batch "
        f"{es.FULL['batch_size']} x {es.FULL['context']} tokens; each step trains the 10 seeds of a configuration "
        "at once, all at the Gaussian shapes (the GOE's are smaller)")


@dataclasses.dataclass(frozen=True)
class _Experiment:
    page: str
    description: str
    build: Callable[..., _Program]
    steps: Callable[[], tuple[int, str]]
    dtype: str = "float32"


EXPERIMENTS: dict[str, _Experiment] = {
    "practice_training": _Experiment(
        "book/ch0_practice/05_training.ipynb", "DEQ classifier of the 8x8 digits, width 256 (tanh cell, Anderson)",
        _practice_training, _practice_steps),
    "nonlinear_training": _Experiment(
        "book/ch3_nonlinear/05_training.ipynb", "DEQ classifier of MNIST, width 128, 10 seeds per program (001 §4.1)",
        _nonlinear_training, _nonlinear_steps),
    "seq2seq": _Experiment(
        "book/ch4_kglm/04_seq2seq.ipynb", "kGLM sequence-to-sequence DEQ, n = 100, full batch 20000, 10 seeds (004 §4)",
        _seq2seq, _seq2seq_steps),
    "denoising": _Experiment(
        "book/ch4_kglm/05_denoising.ipynb", "denoising DEQ with circular convolutions, CIFAR-10, batch 50, "
        "100 seeds per program (004 §4, Fig. 6)", _denoising, _denoising_steps),
    "copy_memory": _Experiment(
        "book/ch5_transformers/02_copy_memory.ipynb", "DEQ-Transformer on copy memory, T = 400, 14K parameters "
        "(003 Table 1)", _copy_memory, _copy_memory_steps),
    "language_model": _Experiment(
        "book/ch5_transformers/04_language_model.ipynb", "DEQ-Transformer language model, Wikitext-103, width 700, "
        "vocabulary 32000, batch 512 x 128 (001 App. D)", _language_model, _language_model_steps),
    "ensemble_study": _Experiment(
        "book/ch5_transformers/06_ensemble_study.ipynb", "the 90-run ensemble study: DEQ-Transformer language models, "
        "width 700, Gaussian feed-forward 2800, 10 seeds per program (001 §4.3, App. D)", _ensemble_study,
        _ensemble_study_steps),
}
"""The experiments with a ``full`` configuration that train a model, by name."""


# --------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DryRunReport:
    """What one experiment's full run needs, from its compiled training step.

    Attributes:
        name, page, description: the experiment.
        dtype: of the parameters and activations.
        batch: samples per step (per model); models_per_step: models trained at once (vmapped seeds).
        parameters: parameters of one model.
        compiled: whether the step was compiled (else only lowered: no memory figures).
        flops_compiled: XLA's FLOPs of the step, each loop body counted once.
        flops_cell, flops_cell_vjp: one evaluation of f(z, x), and of its vector-Jacobian product in z,
            at the step's shapes (all models).
        forward_budget, backward_budget: iteration limits of the forward and adjoint solves.
        flops_step: the step at the iteration limits: ``flops_compiled + (forward_budget - 1) *
            flops_cell + (backward_budget - 1) * flops_cell_vjp``.
        steps: training steps of the full run; steps_note: how they are counted.
        flops_run: ``steps * flops_step``.
        device_hours: ``flops_run`` at :data:`DEVICE`'s assumed throughput for ``dtype``.
        memory: bytes from :func:`memory_bytes` (None when not compiled or not reported).
        devices: H100s needed by memory: ``ceil(peak / usable memory)`` (1 when it fits).
        seconds: wall time of the dry run.
    """

    name: str
    page: str
    description: str
    dtype: str
    batch: int
    models_per_step: int
    parameters: int
    compiled: bool
    flops_compiled: float
    flops_cell: float
    flops_cell_vjp: float
    forward_budget: int
    backward_budget: int
    flops_step: float
    steps: int
    steps_note: str
    flops_run: float
    device_hours: float
    memory: dict | None
    devices: int | None
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        """The report as a JSON-able dict."""
        return dataclasses.asdict(self)


def _check_name(name: str) -> str:
    if name not in EXPERIMENTS:
        raise ValueError(f"dry_run: unknown experiment {name!r}; valid names are {', '.join(sorted(EXPERIMENTS))}")
    return name


def dry_run(name: str, *, compile: bool = True, batch: int | None = None, width: int | None = None) -> DryRunReport:
    """Lower (and compile) one training step of experiment ``name`` at its full shapes on the CPU.

    Args:
        name: a key of :data:`EXPERIMENTS`.
        compile: compile the step (memory and FLOP estimates); False lowers only (FLOPs from the
            HLO, ``memory`` and ``devices`` None), for a program too costly to compile.
        batch: samples per step instead of the full configuration's (to check how costs scale).
        width: the model's width instead of the full configuration's (likewise).

    Returns:
        A :class:`DryRunReport`.

    Raises:
        ValueError: an unknown ``name`` (the message lists the valid ones), or ``batch`` /
            ``width`` not a positive integer.
        RuntimeError: the backend reports no FLOPs for the step.

    Example:
        >>> report = dry_run("practice_training")  # doctest: +SKIP
        >>> report.parameters > 0  # doctest: +SKIP
        True
    """
    import time

    _check_name(name)
    for label, value in (("batch", batch), ("width", width)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"dry_run: `{label}` must be a positive integer or None, got {value!r}")
    began = time.perf_counter()
    experiment = EXPERIMENTS[name]
    program = experiment.build(batch=batch, width=width)
    lowered = jax.jit(program.step).lower(*program.args)
    stage = lowered.compile() if compile else lowered
    flops = cost_flops(stage)
    memory = memory_bytes(stage) if compile else None
    cell = cost_flops(jax.jit(program.cell).lower(*program.cell_args))
    cell_vjp = cost_flops(jax.jit(program.cell_vjp).lower(*program.cell_vjp_args))
    if flops is None or cell is None or cell_vjp is None:
        raise RuntimeError(f"dry_run({name!r}): the {jax.default_backend()} backend gave no FLOP count")
    flops_step = flops + (program.forward_budget - 1) * cell + (program.backward_budget - 1) * cell_vjp
    steps, note = experiment.steps()
    flops_run = steps * flops_step
    throughput = DEVICE["peak_flops"][experiment.dtype] * DEVICE["utilisation"]
    devices = None
    if memory is not None:
        devices = max(1, math.ceil(memory["peak"] / (DEVICE["memory_bytes"] * DEVICE["usable_fraction"])))
    return DryRunReport(
        name=name, page=experiment.page, description=experiment.description, dtype=experiment.dtype,
        batch=program.batch, models_per_step=program.models_per_step, parameters=program.parameters,
        compiled=compile, flops_compiled=flops, flops_cell=cell, flops_cell_vjp=cell_vjp,
        forward_budget=program.forward_budget, backward_budget=program.backward_budget, flops_step=flops_step,
        steps=int(steps), steps_note=note, flops_run=flops_run, device_hours=flops_run / throughput / 3600.0,
        memory=memory, devices=devices, seconds=time.perf_counter() - began)


def dry_run_all(names: Sequence[str] | None = None, **options: Any) -> list[DryRunReport]:
    """:func:`dry_run` of each of ``names`` (default: every experiment), in order."""
    return [dry_run(n, **options) for n in (list(EXPERIMENTS) if names is None else names)]


def _si(value: float, unit: str = "") -> str:
    for factor, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".strip()


def table(reports: Sequence[DryRunReport]) -> str:
    """A Markdown table of the reports: parameters, FLOPs per step and per run, memory, devices, hours."""
    rows = ["| experiment | parameters | FLOP/step (XLA, loops once) | FLOP/step (at max_steps) | steps | "
            "FLOP/run | peak memory | H100s by memory | H100-hours |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        peak = "not compiled" if r.memory is None else _si(r.memory["peak"], "B")
        rows.append(f"| {r.name} | {r.parameters:,} | {_si(r.flops_compiled)} | {_si(r.flops_step)} | {r.steps:,} | "
                    f"{_si(r.flops_run)} | {peak} | {r.devices if r.devices is not None else '-'} | "
                    f"{r.device_hours:.3g} |")
    return "\n".join(rows)


def _commit() -> str | None:
    try:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except Exception:
        return None


def page_summary(report: dict[str, Any], provenance: dict[str, Any], device: dict[str, Any] = DEVICE) -> str:
    """The Markdown a page includes: what a full run of one experiment needs, with its provenance.

    Args:
        report: :meth:`DryRunReport.as_dict` (as stored by :func:`write`).
        provenance: the ``provenance`` entry :func:`write` stores.
        device: the device the run is costed on (:data:`DEVICE`).

    Returns:
        A few lines of Markdown: a table and the sentence that says where the numbers come from.
    """
    r, m = report, report["memory"]
    throughput = device["peak_flops"][r["dtype"]] * device["utilisation"]
    peak = "not compiled" if m is None else _si(m["peak"], "B")
    state = "" if m is None else f" (arguments {_si(m['argument'], 'B')}, temporaries {_si(m['temp'], 'B')})"
    models = f", {r['models_per_step']} models at once (vmapped seeds)" if r["models_per_step"] > 1 else ""
    rows = [
        "| quantity | full configuration |",
        "|---|---|",
        f"| parameters (one model) | {r['parameters']:,} |",
        f"| batch | {r['batch']:,}{models} |",
        f"| FLOPs of one training step, XLA's count (each loop once) | {_si(r['flops_compiled'])} |",
        f"| FLOPs of one step at the solvers' limits ({r['forward_budget']} forward, {r['backward_budget']} adjoint "
        f"iterations) | {_si(r['flops_step'])} |",
        f"| training steps | {r['steps']:,} ({r['steps_note']}) |",
        f"| FLOPs of the run (at the limits: an upper bound) | {_si(r['flops_run'])} |",
        f"| memory of one step{state} | {peak} |",
        f"| devices needed by memory | {r['devices'] if r['devices'] is not None else 'not compiled'} |",
        f"| H100-hours at {device['utilisation']:.0%} of {_si(throughput / device['utilisation'], 'FLOP/s')} "
        f"{r['dtype']} (from the upper bound) | {r['device_hours']:.3g} |",
    ]
    note = (f"From `python -m deqlab.lab.experiments.dry_run --experiment {r['name']}`: the training step at the full "
            f"configuration's shapes, lowered and compiled on the CPU with jax {provenance['jax']} "
            f"(commit {str(provenance.get('commit') or 'unknown')[:10]}, {provenance['date']}); nothing was run. "
            "The step at the solvers' limits adds `max_steps - 1` evaluations of the cell and of its "
            "vector-Jacobian product to XLA's count: an upper bound, reached only when no solve converges. "
            "The hours are FLOPs over an assumed throughput, not a measurement.")
    return "\n".join(rows) + "\n\n" + note + "\n"


def write(path: str | os.PathLike, reports: Sequence[DryRunReport]) -> dict[str, Any]:
    """Write the reports with their provenance to the JSON file ``path``, and next to it, in the
    folder ``<path without .json>/``, one Markdown summary per experiment (:func:`page_summary`)
    for the pages to include. Experiments already in the file and not in ``reports`` are kept.

    Each experiment's entry carries the ``provenance`` (jax version, backend, git commit, date,
    command) of the run that wrote it; the top-level ``provenance`` is the latest write's.

    Returns:
        What was written to ``path``.
    """
    path = os.fspath(path)
    kept = {}
    if os.path.exists(path):
        with open(path) as fh:
            kept = json.load(fh).get("experiments", {})
    provenance = {"jax": jax.__version__, "backend": jax.default_backend(), "commit": _commit(),
                  "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
                  "command": "python -m deqlab.lab.experiments.dry_run --write " + path}
    payload = {
        "provenance": provenance,
        "device": DEVICE,
        "experiments": {**kept, **{r.name: {**r.as_dict(), "provenance": provenance} for r in reports}},
    }
    with open(path, "w") as fh:
        json.dump(payload, fh, indent=1, sort_keys=True)
        fh.write("\n")
    folder = os.path.splitext(path)[0]
    os.makedirs(folder, exist_ok=True)
    for r in reports:
        with open(os.path.join(folder, f"{r.name}.md"), "w") as fh:
            fh.write(f"<!-- generated by {payload['provenance']['command']}: do not edit -->\n\n")
            fh.write(page_summary(r.as_dict(), payload["provenance"]))
    return payload


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m deqlab.lab.experiments.dry_run", description=__doc__.split("\n")[0])
    parser.add_argument("--experiment", action="append", help=f"one of {', '.join(EXPERIMENTS)} (repeatable; default all)")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON instead of a table")
    parser.add_argument("--lower-only", action="store_true", help="lower without compiling (no memory figures)")
    parser.add_argument("--write", metavar="PATH", help="also write the reports with provenance to PATH (JSON)")
    args = parser.parse_args(argv)
    try:
        names = [_check_name(n) for n in args.experiment] if args.experiment else None
    except ValueError as error:
        parser.error(str(error))
    reports = dry_run_all(names, compile=not args.lower_only)
    if args.json:
        print(json.dumps([r.as_dict() for r in reports], indent=1))
    else:
        print(table(reports))
        print(f"\nDevice: {DEVICE['name']} at {DEVICE['utilisation']:.0%} of peak; jax {jax.__version__}")
    if args.write:
        write(args.write, reports)
    return 0


if __name__ == "__main__":
    sys.exit(main())
