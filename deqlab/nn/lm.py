"""Equilibrium language models and their data-parallel training step (003 §3-5).

- :class:`EquilibriumBlock`: a sequence cell (:class:`deqlab.nn.TransformerCell`,
  :class:`deqlab.nn.TrellisCell`) solved to its equilibrium by :class:`deqlab.nn.DEQ`, or,
  with ``depth=L``, the same cell unrolled L times (the weight-tied deep network of 003 Eq. 3,
  z[0] = 0). One flag, the same parameters: ``block(x, depth=12)`` runs the deep network of the
  DEQ it holds.
- :class:`LanguageModel`: token embedding, equilibrium block, projection to the vocabulary.
- :func:`train_step`: one optax step on a batch, with the solver statistics of the step.

**Devices.** The step is written once for one CPU, simulated CPU devices, a GPU or a TPU: a 1-D
mesh (:func:`data_mesh`, ``jax.make_mesh`` with a ``"data"`` axis) shards the batch
(:func:`shard_batch`, ``NamedSharding(mesh, P("data"))``) and replicates the parameters and
optimiser state (:func:`replicate`, ``P()``); ``jax.jit`` then partitions the step and inserts the
gradient all-reduce. Each sequence is solved on the device that holds it: the solvers treat samples
independently, and only the loop's stopping test ("is any sample still running?") is a
cross-device reduction. No ``pmap``.

**Several hosts.** Call ``jax.distributed.initialize()`` (coordinator address, process count and
id from the cluster's environment, or as arguments) first on every host; then ``jax.devices()`` is
the global device list and :func:`data_mesh` spans all hosts. Each host passes its own slice of
the global batch to :func:`shard_batch`, which assembles the global array with
``jax.make_array_from_process_local_data``. This path cannot be tested on one machine.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from deqlab import _draws, checks
from deqlab.nn.deq import DEQ
from deqlab.solvers import Result, relative_residual

__all__ = [
    "EquilibriumBlock",
    "LanguageModel",
    "unroll",
    "solver_stats",
    "lm_loss",
    "train_step",
    "eval_step",
    "train",
    "data_mesh",
    "shard_batch",
    "replicate",
    "STAT_NAMES",
]

MAX_VOCAB_SIZE = 2**31 - 1
"""The largest ``vocab_size`` of a :class:`LanguageModel`: token ids are int32 by default in JAX."""

STAT_NAMES = ("steps_mean", "steps_max", "residual_max", "converged_fraction", "nfe")
"""Solver statistics of one forward pass, as returned by :func:`solver_stats`."""


def _per_sample_residual(fz, z, batch_axis):
    if batch_axis is None:
        return relative_residual(fz.reshape(1, -1), z.reshape(1, -1))[0]
    fz, z = jnp.moveaxis(fz, batch_axis, 0), jnp.moveaxis(z, batch_axis, 0)
    return relative_residual(fz.reshape(fz.shape[0], -1), z.reshape(z.shape[0], -1))


def unroll(cell: nnx.Module, x: jax.Array, depth: int, *, z0: jax.Array | None = None,
           batch_axis: int | None = 0) -> tuple[jax.Array, jax.Array]:
    """The weight-tied deep network ``z[i+1] = f(z[i]; x)``, ``i < depth``, ``z[0] = z0`` or 0 (003 Eq. 3).

    Runs as one ``lax.scan`` over the split parameters, so reverse-mode differentiation stores one
    set of activations per layer: the O(L) memory that 003 §3.2 contrasts with the DEQ.

    A cell with weight-tied dropout (``dropout_masks``, :mod:`deqlab.nn.dropout`) in training
    mode draws one set of masks per call, shared by all L layers (the weight-tied network's
    counterpart of the DEQ's fixed masks).

    Args:
        cell: a cell ``f(z, x)`` with a ``width`` attribute.
        x: the input, last axis the cell's ``in_features``.
        depth: number of layers L, an integer >= 1.
        z0: the starting state, of shape ``x.shape[:-1] + (cell.width,)``; None: zeros.
        batch_axis: axis of independent samples (for the per-sample residuals); None: one sample.

    Returns:
        ``(z[depth], trace)``; ``trace[i]`` is the relative residual
        ``||f(z[i]) - z[i]|| / ||f(z[i])||`` of each sample at layer i, the quantity the
        solvers stop on (:mod:`deqlab.solvers`), so that layer i is comparable with solver
        evaluation i.

    Raises:
        ValueError: ``depth`` is not an integer >= 1.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab.nn import TanhCell, unroll
        >>> z, trace = unroll(TanhCell(4, 2, rngs=nnx.Rngs(0)), jnp.ones((3, 2)), depth=5)
        >>> z.shape, trace.shape
        ((3, 4), (5, 3))
    """
    checks.positive_int(depth, "depth", "nn.unroll")
    z = jnp.zeros(x.shape[:-1] + (cell.width,), x.dtype) if z0 is None else z0
    # weight-tied dropout: one set of masks for all layers, as for the DEQ's iterations
    draw_masks = getattr(cell, "dropout_masks", None)
    masks = None if draw_masks is None else draw_masks(z.shape, z.dtype)
    extra = () if masks is None else (masks,)
    graphdef, state = nnx.split(cell)

    def layer(z, _):
        fz = nnx.merge(graphdef, state)(z, x, *extra)
        return fz, _per_sample_residual(fz, z, batch_axis)

    return jax.lax.scan(layer, z, None, length=depth)


def solver_stats(solution=None, *, trace=None) -> dict[str, jax.Array]:
    """The statistics logged per training step (:data:`STAT_NAMES`).

    From a DEQ's :class:`~deqlab.solvers.Solution` or from the residual trace of :func:`unroll`
    (exactly one of the two). ``steps_*`` are iterations per sequence (for the unrolled network,
    its depth); ``residual_max`` the worst final relative residual; ``converged_fraction`` the
    fraction of sequences whose solve met its tolerance (unrolled: NaN, it has none); ``nfe``
    evaluations of f.

    Args:
        solution: a :class:`~deqlab.solvers.Solution`.
        trace: the residual trace of :func:`unroll`, shape ``(depth, batch)``.

    Returns:
        A dict of float32 scalars keyed by :data:`STAT_NAMES`.

    Raises:
        ValueError: neither or both of ``solution`` and ``trace`` are given.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.nn import solver_stats
        >>> stats = solver_stats(trace=jnp.array([[0.5, 0.4], [0.1, 0.2]]))
        >>> float(stats["steps_max"]), round(float(stats["residual_max"]), 6)
        (2.0, 0.2)
    """
    if (solution is None) == (trace is None):
        raise ValueError("nn.solver_stats: give exactly one of `solution` (a DEQ's Solution) and `trace` "
                         "(the residual trace of nn.unroll), got "
                         f"{'neither' if solution is None else 'both'}.")
    if solution is not None:
        steps = jax.lax.stop_gradient(solution.stats.steps).astype(jnp.float32)
        return {
            "steps_mean": jnp.mean(steps),
            "steps_max": jnp.max(steps),
            "residual_max": jnp.max(jax.lax.stop_gradient(solution.stats.best_residual)).astype(jnp.float32),
            "converged_fraction": jnp.mean((solution.result == Result.SUCCESS).astype(jnp.float32)),
            "nfe": jnp.asarray(solution.stats.nfe, jnp.float32),
        }
    depth = float(trace.shape[0])
    return {
        "steps_mean": jnp.asarray(depth, jnp.float32),
        "steps_max": jnp.asarray(depth, jnp.float32),
        "residual_max": jnp.max(trace[-1]).astype(jnp.float32),
        "converged_fraction": jnp.asarray(jnp.nan, jnp.float32),
        "nfe": jnp.asarray(depth, jnp.float32),
    }


#: The iteration limit of 003 §5 ("iteration limit of 30"): :class:`EquilibriumBlock`'s default for
#: a solver given by name.
PAPER_MAX_STEPS = 30


class EquilibriumBlock(nnx.Module):
    """A sequence cell as a DEQ (003 §3.1) or as its weight-tied deep network (003 Eq. 3).

    Call ``block(x, depth=...)`` to override the mode for one call (``depth=None`` there keeps the
    block's own). ``block.cell`` is the cell, whatever the mode: the parameters are the same.

    Args:
        cell: a cell ``f(z, x)`` with ``width`` and ``readout`` (:class:`deqlab.nn.TransformerCell`,
            :class:`deqlab.nn.TrellisCell`).
        depth: None: solve for the equilibrium; an int L: unroll L weight-tied layers from z = 0.
        solver: of the :class:`deqlab.nn.DEQ`; default ``"broyden"``, as 003 §5 uses.
        tol: of the :class:`deqlab.nn.DEQ`.
        max_steps: of the :class:`deqlab.nn.DEQ`; None: 30 for a solver given by name (003 §5's
            "iteration limit of 30"), the object's own for a solver object.
        backward: of the :class:`deqlab.nn.DEQ` (any of its backward modes).
        on_failure: of the :class:`deqlab.nn.DEQ`.
        batch_axis: the axis of independent sequences (0), or None for one sequence.
        precision: of the :class:`deqlab.nn.DEQ`.
        eval_max_steps, eval_tol: of the :class:`deqlab.nn.DEQ`: its settings in evaluation mode
            (``model.eval()``); None: the training ones.

    Attributes:
        deq: the :class:`deqlab.nn.DEQ` holding the cell.
        depth: the block's own mode (None or L).
        cell: the cell (a property: ``deq.cell``).

    Raises:
        ValueError: ``depth`` is not None or an integer >= 1, ``cell`` has no ``readout``, or a
            :class:`deqlab.nn.DEQ` argument is not valid.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab.nn import EquilibriumBlock, TrellisCell
        >>> block = EquilibriumBlock(TrellisCell(4, 3, rngs=nnx.Rngs(0)), depth=3)
        >>> features, stats = block(jnp.ones((2, 5, 3)))
        >>> features.shape, float(stats["steps_mean"])
        ((2, 5, 4), 3.0)
    """

    def __init__(self, cell: nnx.Module, *, depth: int | None = None, solver: Any = "broyden",
                 tol: float | None = None, max_steps: int | None = None, backward: Any = "implicit",
                 on_failure: str = "warn", batch_axis: int | None = 0, precision: Any = None,
                 eval_max_steps: int | None = None, eval_tol: float | None = None):
        if depth is not None:
            checks.positive_int(depth, "depth", "nn.EquilibriumBlock")
        if not hasattr(cell, "readout"):
            raise ValueError("nn.EquilibriumBlock: `cell` must have a `readout(z)` method (what the head "
                             "reads from z), as TransformerCell and TrellisCell do.")
        if max_steps is None and isinstance(solver, str):
            max_steps = PAPER_MAX_STEPS
        self.deq = DEQ(cell, solver=solver, tol=tol, max_steps=max_steps, backward=backward,
                       on_failure=on_failure, batch_axis=batch_axis, precision=precision,
                       eval_max_steps=eval_max_steps, eval_tol=eval_tol)
        self.depth = depth
        self.batch_axis = batch_axis

    @property
    def cell(self) -> nnx.Module:
        """The cell, whatever the mode (the parameters are the same)."""
        return self.deq.cell

    def __call__(self, x: jax.Array, *, depth: int | None = None, z0: jax.Array | None = None,
                 max_steps: Any = None, tol: Any = None, return_state: bool = False):
        """The cell's readout of z* (or of z[L]) and the solver statistics.

        Args:
            x: the injected sequence, ``(batch, T, in_features)``.
            depth: None: the block's own mode; an int L: unroll L layers for this call.
            z0: the starting state (a warm start, e.g. an earlier ``return_state`` output), of
                shape ``(batch, T, cell.width)``; None: zeros.
            max_steps, tol: this call's budget in equilibrium mode, traced values that do not
                recompile (:class:`deqlab.nn.DEQ`); None: the block's settings.
            return_state: also return the state z (z* or z[L]), to warm-start a later call.

        Returns:
            ``(features, stats)``: ``cell.readout(z)`` and :func:`solver_stats`; with
            ``return_state`` also ``z``.

        Raises:
            ValueError: ``max_steps`` or ``tol`` given in unrolled mode (``depth`` set), or out of
                range (as :class:`deqlab.nn.DEQ` raises it).
        """
        depth = self.depth if depth is None else depth
        if depth is None:
            z, sol = self.deq(x, z0, max_steps=max_steps, tol=tol, return_solution=True)
            out = (self.cell.readout(z), solver_stats(sol))
        else:
            if max_steps is not None or tol is not None:
                raise ValueError(f"nn.EquilibriumBlock: `max_steps` and `tol` are the solver's budget, "
                                 f"for the equilibrium mode (depth=None); this call unrolls depth={depth} "
                                 "layers, which take neither.")
            z, trace = unroll(self.cell, x, depth, z0=z0, batch_axis=self.batch_axis)
            out = (self.cell.readout(z), solver_stats(trace=trace))
        return out + (z,) if return_state else out


class LanguageModel(nnx.Module):
    """Token embedding, equilibrium block, projection to the vocabulary (003 §5).

    ``model(tokens)`` with int tokens (B, T) returns ``(logits (B, T, vocab), stats)``. Concrete
    token ids outside ``[0, vocab_size)`` raise ``ValueError``; under ``jit`` (where they cannot be
    read) such a position embeds as NaN: its logits are NaN (so is the loss) and its sequence's
    solve reports ``Result.NONFINITE``; never a silently wrapped-around embedding.

    Args:
        vocab_size: number of tokens (1 to ``2**31 - 1``: ids are int32).
        cell: the sequence cell; the embedding has its ``in_features``, the head reads its
            ``features``.
        depth: of the :class:`EquilibriumBlock` (None: the DEQ).
        solver: of the :class:`EquilibriumBlock`.
        tol: of the :class:`EquilibriumBlock`.
        max_steps: of the :class:`EquilibriumBlock`.
        backward: of the :class:`EquilibriumBlock`.
        on_failure: of the :class:`EquilibriumBlock`.
        precision: of the :class:`EquilibriumBlock`.
        eval_max_steps, eval_tol: of the :class:`EquilibriumBlock` (the solver's settings in
            evaluation mode, ``model.eval()``).
        embedding_std: standard deviation of the embedding's entries at initialisation; None
            (default): flax's ``nnx.Embed`` initialiser, 1/sqrt(in_features). The embedding is the
            input x whose injection x W_x pins the equilibrium, so its scale against the state's
            contribution (z W_QKV in a transformer cell, z a LayerNorm output) decides how
            contractive the cell is (1.0 is what Vaswani et al.'s multiplication of the embedding
            by sqrt(d) gives on flax's default). On the chapter 5 language-model page both scales
            reach their equilibrium after the first training steps; with 1.0 the model learns
            (validation loss 4.89 nats) while with the default it stays at the unigram loss
            (5.22) over the page's short run.
        rngs: ``nnx.Rngs`` of the embedding and head.

    Attributes:
        vocab_size: number of tokens.
        embed: the ``nnx.Embed``.
        block: the :class:`EquilibriumBlock`.
        head: the ``nnx.Linear`` to the vocabulary.

    Raises:
        ValueError: ``vocab_size`` is out of range, ``embedding_std`` is not a positive number,
            ``rngs`` is not an ``nnx.Rngs``, or ``cell`` is not a sequence cell with parameters,
            ``in_features`` and ``features``.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab.nn import LanguageModel, TrellisCell
        >>> model = LanguageModel(7, TrellisCell(4, 6, rngs=nnx.Rngs(0)), depth=2, rngs=nnx.Rngs(1))
        >>> logits, stats = model(jnp.array([[1, 2, 3]]))
        >>> logits.shape
        (1, 3, 7)
    """

    def __init__(self, vocab_size: int, cell: nnx.Module, *, depth: int | None = None,
                 solver: Any = "broyden", tol: float | None = None, max_steps: int | None = None,
                 backward: Any = "implicit", on_failure: str = "warn", precision: Any = None,
                 eval_max_steps: int | None = None, eval_tol: float | None = None,
                 embedding_std: float | None = None, rngs: nnx.Rngs):
        where = "nn.LanguageModel"
        # token ids are int32 under JAX's default configuration: a larger vocabulary cannot be indexed
        vocab_size = checks.integer(vocab_size, "vocab_size", where, minimum=1, maximum=MAX_VOCAB_SIZE)
        if not isinstance(rngs, nnx.Rngs):
            raise checks.fail("rngs", "an nnx.Rngs such as nnx.Rngs(0)", rngs, where)
        params = jax.tree_util.tree_leaves(nnx.state(cell, nnx.Param)) if isinstance(cell, nnx.Module) else []
        if not params or not hasattr(cell, "in_features") or not hasattr(cell, "features"):
            raise checks.fail("cell", "a sequence cell with parameters and `in_features`, `features` "
                              "(nn.TransformerCell, nn.TrellisCell)", type(cell).__name__, where)
        param_dtype = params[0].dtype
        self.vocab_size = vocab_size
        embed_options = {}
        if embedding_std is not None:
            embedding_std = checks.positive_number(embedding_std, "embedding_std", where)
            embed_options["embedding_init"] = _draws.normal_initializer(embedding_std)  # flax's normal, drawn flat
        self.embed = nnx.Embed(vocab_size, cell.in_features, param_dtype=param_dtype, rngs=rngs, **embed_options)
        self.block = EquilibriumBlock(cell, depth=depth, solver=solver, tol=tol, max_steps=max_steps,
                                      backward=backward, on_failure=on_failure, precision=precision,
                                      eval_max_steps=eval_max_steps, eval_tol=eval_tol)
        self.head = nnx.Linear(cell.features, vocab_size, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, tokens: jax.Array, *, depth: int | None = None, z0: jax.Array | None = None,
                 max_steps: Any = None, tol: Any = None, return_state: bool = False):
        """Logits of the next token at every position, and the solver statistics.

        Args:
            tokens: integer token ids, shape ``(batch, T)``.
            depth: None: the block's own mode; an int L: unroll L layers for this call.
            z0: a warm start of the block's state, ``(batch, T, cell.width)`` (e.g. an earlier
                call's ``return_state`` output); None: zeros.
            max_steps, tol: this call's solver budget, traced values that do not recompile
                (:class:`deqlab.nn.DEQ`); None: the model's settings.
            return_state: also return the block's state z, to warm-start a later call.

        Returns:
            ``(logits, stats)``: logits ``(batch, T, vocab_size)`` and :func:`solver_stats`; with
            ``return_state`` also ``z``.

        Raises:
            ValueError: ``tokens`` is not an integer array of shape (batch, T), a concrete id is
                outside ``[0, vocab_size)``, or the budget is invalid (:class:`EquilibriumBlock`).
        """
        tokens = _token_ids(tokens, self.vocab_size, "tokens", "nn.LanguageModel")
        # Traced ids cannot be checked: an id outside [0, vocab_size) embeds as NaN (not as a
        # wrapped-around row, as a negative index would), so its sequence's solve reports
        # Result.NONFINITE, and the logits at that position are NaN.
        valid = (tokens >= 0) & (tokens < self.vocab_size)
        embedded = self.embed(jnp.clip(tokens, 0, self.vocab_size - 1))
        embedded = jnp.where(valid[..., None], embedded, jnp.asarray(jnp.nan, embedded.dtype))
        features, stats, z = self.block(embedded, depth=depth, z0=z0, max_steps=max_steps, tol=tol,
                                        return_state=True)
        logits = self.head(features)
        logits = jnp.where(valid[..., None], logits, jnp.asarray(jnp.nan, logits.dtype))
        return (logits, stats, z) if return_state else (logits, stats)


def _token_ids(tokens: Any, vocab_size: int, name: str, where: str) -> jax.Array:
    """``tokens`` as an integer array of shape (batch, T); concrete ids must lie in [0, vocab_size)."""
    if not isinstance(tokens, jax.Array):
        try:
            tokens = jnp.asarray(tokens)
        except (TypeError, ValueError):
            raise checks.fail(name, "integer token ids of shape (batch, T)", type(tokens).__name__, where) from None
    if not jnp.issubdtype(tokens.dtype, jnp.integer) or tokens.ndim != 2:
        raise checks.fail(name, "integer token ids of shape (batch, T)",
                          f"{tokens.dtype} of shape {tuple(tokens.shape)}", where)
    if not checks.is_traced(tokens) and tokens.size:
        # NumPy on the concrete ids: jnp.min would be staged (a tracer) when a jitted function
        # closes over them, and would compile two programs per eager call.
        ids = np.asarray(tokens)
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise checks.fail(name, f"token ids in [0, vocab_size) = [0, {vocab_size})", f"an id {bad}", where)
    return tokens


def lm_loss(model: LanguageModel, tokens: jax.Array, targets: jax.Array, *, depth: int | None = None):
    """Mean next-token cross-entropy (nats per token) and the forward pass's solver statistics.

    Args:
        model: a :class:`LanguageModel`.
        tokens: integer ids, shape ``(batch, T)``.
        targets: ids in ``[0, vocab_size)`` of the shape of ``tokens`` (checked when concrete;
            under ``jit`` a target outside the range makes the loss NaN, never a silent number).
        depth: None: the model's own mode; an int L: unroll L layers.

    Returns:
        ``(loss, stats)``: a scalar and :func:`solver_stats`.

    Raises:
        ValueError: ``targets`` (or ``tokens``) is not an integer array of the right shape, or a
            concrete id is out of range.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab.nn import LanguageModel, TrellisCell, lm_loss
        >>> model = LanguageModel(7, TrellisCell(4, 6, rngs=nnx.Rngs(0)), depth=2, rngs=nnx.Rngs(1))
        >>> loss, _ = lm_loss(model, jnp.array([[1, 2, 3]]), jnp.array([[2, 3, 4]]))
        >>> bool(loss > 0)
        True
    """
    where = "nn.lm_loss"
    targets = _token_ids(targets, model.vocab_size, "targets", where)
    if tuple(targets.shape) != tuple(jnp.shape(tokens)):
        raise checks.fail("targets", f"ids of the shape of `tokens` {tuple(jnp.shape(tokens))}",
                          f"shape {tuple(targets.shape)}", where)
    logits, stats = model(tokens, depth=depth)
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.clip(targets, 0, model.vocab_size - 1))
    loss = jnp.where((targets >= 0) & (targets < model.vocab_size), losses, jnp.nan).mean()
    return loss, stats


@nnx.jit(static_argnames=("depth",))
def train_step(model: LanguageModel, optimizer: nnx.Optimizer, tokens: jax.Array, targets: jax.Array,
               *, depth: int | None = None) -> dict[str, jax.Array]:
    """One optimiser step on the batch ``(tokens, targets)``; updates ``model`` and ``optimizer`` in place.

    Runs unchanged on one device or a data mesh: place the batch with :func:`shard_batch` and the
    model and optimiser with :func:`replicate` first. Compiled with ``nnx.jit`` (``depth``
    static).

    Args:
        model: a :class:`LanguageModel`.
        optimizer: an ``nnx.Optimizer`` of ``model``.
        tokens: integer ids ``(batch, T)``.
        targets: integer ids ``(batch, T)``.
        depth: None: the model's own mode; an int L: unroll L layers.

    Returns:
        A dict: the step's ``loss`` (before the update) and the forward solve's statistics
        (:data:`STAT_NAMES`).

    Example:
        >>> import jax.numpy as jnp
        >>> import optax
        >>> from flax import nnx
        >>> from deqlab.nn import LanguageModel, TrellisCell, train_step
        >>> model = LanguageModel(7, TrellisCell(4, 6, rngs=nnx.Rngs(0)), depth=2, rngs=nnx.Rngs(1))
        >>> optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
        >>> metrics = train_step(model, optimizer, jnp.array([[1, 2, 3]]), jnp.array([[2, 3, 4]]))
        >>> sorted(metrics)
        ['converged_fraction', 'loss', 'nfe', 'residual_max', 'steps_max', 'steps_mean']
    """
    (loss, stats), grads = nnx.value_and_grad(lambda m: lm_loss(m, tokens, targets, depth=depth),
                                              has_aux=True)(model)
    optimizer.update(model, grads)
    return {"loss": loss, **stats}


@nnx.jit(static_argnames=("depth",))
def eval_step(model: LanguageModel, tokens: jax.Array, targets: jax.Array, *,
              depth: int | None = None) -> dict[str, jax.Array]:
    """Loss and solver statistics on a batch, without updating anything (``nnx.jit``, ``depth`` static).

    Args:
        model: a :class:`LanguageModel`.
        tokens: integer ids ``(batch, T)``.
        targets: integer ids ``(batch, T)``.
        depth: None: the model's own mode; an int L: unroll L layers.

    Returns:
        A dict: ``loss`` and the statistics of :data:`STAT_NAMES`.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from deqlab.nn import LanguageModel, TrellisCell, eval_step
        >>> model = LanguageModel(7, TrellisCell(4, 6, rngs=nnx.Rngs(0)), depth=2, rngs=nnx.Rngs(1))
        >>> float(eval_step(model, jnp.array([[1, 2]]), jnp.array([[2, 3]]))["steps_max"])
        2.0
    """
    loss, stats = lm_loss(model, tokens, targets, depth=depth)
    return {"loss": loss, **stats}


def data_mesh(devices: Any = None) -> jax.sharding.Mesh:
    """A 1-D mesh with axis ``"data"`` over ``devices``.

    Args:
        devices: the devices; None: all of ``jax.devices()`` (every host's, after
            ``jax.distributed.initialize()``).

    Returns:
        A ``jax.sharding.Mesh`` with the single axis ``"data"``.

    Raises:
        ValueError: ``devices`` is empty.

    Example:
        >>> from deqlab.nn import data_mesh
        >>> data_mesh().axis_names
        ('data',)
    """
    devices = jax.devices() if devices is None else list(devices)
    if not devices:
        raise ValueError("data_mesh: `devices` must be a non-empty list of devices.")
    options = {}
    if hasattr(jax.sharding, "AxisType"):  # pin the default across JAX versions
        options["axis_types"] = (jax.sharding.AxisType.Auto,)
    return jax.make_mesh((len(devices),), ("data",), devices=devices, **options)


def shard_batch(mesh: jax.sharding.Mesh, *arrays: Any):
    """Place arrays with their leading (batch) axis split over the mesh's ``"data"`` axis.

    On several hosts each passes its local slice of the batch; the global array is assembled with
    ``jax.make_array_from_process_local_data``.

    Args:
        mesh: a mesh with a ``"data"`` axis (:func:`data_mesh`).
        *arrays: arrays with a leading batch axis; the global batch must divide by the mesh size.

    Returns:
        The placed array, or a tuple of them for several.

    Raises:
        ValueError: an array has no leading axis, or its batch does not divide by the mesh size.

    Example:
        >>> import numpy as np
        >>> from deqlab.nn import data_mesh, shard_batch
        >>> tokens, targets = shard_batch(data_mesh(), np.zeros((4, 3), int), np.ones((4, 3), int))
        >>> tokens.shape, tuple(targets.sharding.spec)
        ((4, 3), ('data',))
    """
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    size = mesh.shape["data"]
    out = []
    for a in arrays:
        a = np.asarray(a) if not isinstance(a, jax.Array) else a
        if a.ndim < 1:
            raise checks.fail("arrays", "arrays with a leading batch axis", f"an array of shape {a.shape}",
                              "nn.shard_batch")
        if jax.process_count() > 1:
            out.append(jax.make_array_from_process_local_data(sharding, np.asarray(a)))
            continue
        if a.shape[0] % size:
            raise ValueError(f"shard_batch: the batch size {a.shape[0]} must be a multiple of the number "
                             f"of devices on the 'data' axis ({size}).")
        out.append(jax.device_put(a, sharding))
    return out[0] if len(out) == 1 else tuple(out)


def replicate(mesh: jax.sharding.Mesh, *modules: Any) -> None:
    """Replicate every array of the given NNX objects (model, optimiser) over ``mesh``, in place.

    Args:
        mesh: the mesh.
        *modules: NNX objects (``nnx.Module``, ``nnx.Optimizer``).

    Example:
        >>> from flax import nnx
        >>> from deqlab.nn import data_mesh, replicate
        >>> layer = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
        >>> replicate(data_mesh(), layer)
        >>> tuple(layer.kernel[...].sharding.spec)  # replicated: no axis split
        ()
    """
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    for module in modules:
        state = nnx.state(module)
        nnx.update(module, jax.device_put(state, sharding))


def train(model: LanguageModel, optimizer: nnx.Optimizer, batches: Iterable[tuple[Any, Any]], *,
          depth: int | None = None, mesh: jax.sharding.Mesh | None = None) -> dict[str, list[float]]:
    """Run :func:`train_step` over ``batches``; return the per-step log.

    With a ``mesh``, the model and optimiser are replicated on it and each batch is sharded.

    Args:
        model: a :class:`LanguageModel`.
        optimizer: an ``nnx.Optimizer`` of ``model``.
        batches: an iterable of ``(tokens, targets)``, integer arrays ``(batch, T)``.
        depth: None: the model's own mode; an int L: unroll L layers.
        mesh: a mesh from :func:`data_mesh`; None: no placement.

    Returns:
        A dict of lists, one entry per step: ``loss`` and every statistic of :data:`STAT_NAMES`.

    Raises:
        FloatingPointError: the loss becomes NaN or infinite.

    Example:
        >>> import numpy as np
        >>> import optax
        >>> from flax import nnx
        >>> from deqlab.nn import LanguageModel, TrellisCell, train
        >>> model = LanguageModel(7, TrellisCell(4, 6, rngs=nnx.Rngs(0)), depth=2, rngs=nnx.Rngs(1))
        >>> optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
        >>> batch = (np.array([[1, 2, 3]]), np.array([[2, 3, 4]]))
        >>> log = train(model, optimizer, [batch, batch])
        >>> len(log["loss"]), log["steps_mean"]
        (2, [2.0, 2.0])
    """
    if mesh is not None:
        replicate(mesh, model, optimizer)
    log: dict[str, list[float]] = {k: [] for k in ("loss",) + STAT_NAMES}
    for tokens, targets in batches:
        if mesh is not None:
            tokens, targets = shard_batch(mesh, tokens, targets)
        metrics = train_step(model, optimizer, jnp.asarray(tokens), jnp.asarray(targets), depth=depth)
        for k, v in jax.device_get(metrics).items():
            log[k].append(float(v))
        if not math.isfinite(log["loss"][-1]):
            raise FloatingPointError(f"train: the loss is {log['loss'][-1]} at step {len(log['loss'])}; "
                                     "lower the learning rate or the initial scale of the cell.")
    return log
