"""Memory and speed of equilibrium sequence models (003 §5: Tables 2-4, Figures 2 left and 3).

- :func:`markov_corpus`: a synthetic language with a known entropy rate (a random second-order
  Markov chain), so that a validation loss can be read against its floor without a download.
- :func:`make_lm`: a small DEQ-Transformer or DEQ-TrellisNet language model.
- :func:`training_memory`: compiled temporary memory of one training gradient, implicit DEQ against
  the weight-tied network unrolled to matched depth L (003 Tables 2-3, memory column), measured as
  chapter 0 and ``benchmarks/memory.py`` do (``compile().memory_analysis()``).
- :func:`profile`: memory and wall time of a training step (forward and backward) and of
  inference, DEQ against the unrolled network, from one compilation each (003 Tables 2-4).
- :func:`equilibrium_tradeoff`: validation loss when the forward solve is stopped at a looser
  tolerance or an earlier iteration limit (003 Figure 3).
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from deqlab import checks
from deqlab.nn import LanguageModel, TransformerCell, TrellisCell, eval_step, lm_loss
from deqlab.precision import PrecisionWarning
from deqlab.solvers import Broyden, solve

__all__ = ["markov_corpus", "make_lm", "batches", "gradient_program", "training_memory", "profile",
           "inference_times", "equilibrium_tradeoff"]

KINDS = ("transformer", "trellis")


def markov_corpus(key: jax.Array, *, vocab: int = 8, sequences: int = 256, length: int = 32,
                  concentration: float = 0.2) -> tuple[np.ndarray, float]:
    """Sequences of a random second-order Markov chain and its entropy rate (nats per token).

    The transition law P(c | a, b) of each context (a, b) is a Dirichlet(concentration) draw, so
    each context has a few likely successors. Each sequence starts after a burn-in of 4 x vocab
    tokens from a uniform context, close to the stationary law; a model's cross-entropy on the
    predictions with two tokens of context is then bounded below by the entropy rate
    ``H = sum_(a,b) pi(a,b) H(P(. | a, b))`` (pi the stationary law of the context chain).

    Returns:
        ``(tokens, H)``: int32 tokens of shape ``(sequences, length + 1)`` (inputs ``[:, :-1]``,
        targets ``[:, 1:]``) and the entropy rate.
    """
    where = "sequence.markov_corpus"
    key = checks.prng_key(key, "key", where)
    for value, name in ((vocab, "vocab"), (sequences, "sequences"), (length, "length")):
        checks.positive_int(value, name, where)
    checks.positive_number(concentration, "concentration", where)
    # NumPy draws from a generator seeded by the key: deterministic, and no compilation
    rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel())
    law = rng.dirichlet(np.full(vocab, concentration), size=(vocab, vocab))
    law = law / law.sum(-1, keepdims=True)
    burn = 4 * vocab
    total = burn + length + 1
    out = np.empty((sequences, total + 2), np.int32)
    out[:, :2] = rng.integers(0, vocab, size=(sequences, 2))
    cumulative = np.cumsum(law, axis=-1)
    for t in range(2, total + 2):
        u = rng.random(sequences)[:, None]
        out[:, t] = np.minimum((u > cumulative[out[:, t - 2], out[:, t - 1]]).sum(-1), vocab - 1)
    # stationary law of the context chain (a, b) -> (b, c)
    pair = np.zeros((vocab * vocab, vocab * vocab))
    for a in range(vocab):
        for b in range(vocab):
            pair[a * vocab + b, b * vocab: (b + 1) * vocab] = law[a, b]
    pi = np.full(vocab * vocab, 1.0 / vocab**2)
    for _ in range(2000):
        pi = pi @ pair
    entropy = -np.sum(np.where(law > 0, law * np.log(np.where(law > 0, law, 1.0)), 0.0), axis=-1).ravel()
    return out[:, -(length + 1):], float(pi @ entropy)


def make_lm(kind: str, *, vocab: int, width: int, seed: int = 0, depth: int | None = None,
            tol: float = 1e-4, max_steps: int = 30, scale: float | None = None,
            attention_scale: float = 0.3, param_dtype: Any = jnp.float32, solver: Any = "broyden",
            **cell_options: Any) -> LanguageModel:
    """A small equilibrium language model (float32 by default).

    ``kind``: ``"transformer"`` (:class:`deqlab.nn.TransformerCell`, width d, 4 heads,
    feed-forward 4d) or ``"trellis"`` (:class:`deqlab.nn.TrellisCell` with hidden d/2, so that z
    has width d as well; kernel 2, dilation 1). Broyden forward (003 §5; ``solver`` replaces it,
    e.g. ``Broyden(m=2)``), implicit backward whose failures are not warned about but logged
    (``converged_fraction`` of the statistics). ``cell_options`` go to the cell.
    """
    where = "sequence.make_lm"
    checks.choice(kind, "kind", KINDS, where)
    rngs = nnx.Rngs(seed)
    if kind == "transformer":
        cell = TransformerCell(width, width, heads=4, scale=scale, attention_scale=attention_scale,
                               param_dtype=param_dtype, rngs=rngs, **cell_options)
    else:
        if width % 2:
            raise checks.fail("width", "even for the trellis cell (z = [h, c])", width, where)
        cell = TrellisCell(width // 2, width, scale=scale, param_dtype=param_dtype, rngs=rngs, **cell_options)
    return LanguageModel(vocab, cell, depth=depth, solver=solver, tol=tol, max_steps=max_steps,
                         on_failure="ignore", rngs=rngs)


def batches(tokens: np.ndarray, *, batch: int, steps: int, seed: int = 0):
    """``steps`` random minibatches ``(inputs, targets)`` of ``batch`` sequences from ``tokens``."""
    rng = np.random.default_rng(seed)
    for _ in range(checks.positive_int(steps, "steps", "sequence.batches")):
        rows = tokens[rng.choice(len(tokens), size=batch, replace=False)]
        yield rows[:, :-1], rows[:, 1:]


def gradient_program(model: LanguageModel, *, depth: int | None = None):
    """``(grad, args)``: ``grad(*args, tokens, targets)`` is the gradient of the mean next-token loss
    with respect to the model's parameters (the block's own mode, or ``depth`` unrolled layers),
    as a pure function of the split model; ``jax.jit(grad).lower(*args, tokens, targets)`` compiles
    one training step's backward pass."""
    return _gradient_fn(model, depth)


def _gradient_fn(model: LanguageModel, depth):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params, rest, tokens, targets):
        return lm_loss(nnx.merge(graphdef, params, rest), tokens, targets, depth=depth)[0]

    return jax.grad(loss), (params, rest)


def training_memory(kind: str, depths: Sequence[int], *, vocab: int = 64, width: int = 64,
                    length: int = 64, batch: int = 8, seed: int = 0,
                    deq_depths: Sequence[int] | None = None) -> dict[str, Any]:
    """Compiled temporary memory (bytes) of one training gradient of a :func:`make_lm` model.

    The DEQ (implicit backward, 003 Theorem 1) is compiled with its forward iteration limit set to
    each L of ``depths``; the weight-tied network is unrolled to the same L and differentiated by
    backpropagation. 003 benchmarks whole models without their word embeddings; here the
    embedding and head are small (``vocab`` rows) and included.

    ``deq_depths``: the iteration limits at which the DEQ is compiled (default: ``depths``; its
    memory does not depend on them, which a subset is enough to show).

    Returns:
        ``{"depths": [...], "unrolled": [bytes per L], "deq_depths": [...], "deq": [bytes per L]}``.
    """
    where = "sequence.training_memory"
    checks.choice(kind, "kind", KINDS, where)
    tokens = jnp.zeros((batch, length), jnp.int32)
    deq_depths = list(depths) if deq_depths is None else list(deq_depths)
    out: dict[str, Any] = {"depths": list(depths), "unrolled": [], "deq_depths": deq_depths, "deq": []}
    for mode, values in (("unrolled", depths), ("deq", deq_depths)):
        for depth in values:
            checks.positive_int(depth, "depths", where)
            model = make_lm(kind, vocab=vocab, width=width, seed=seed, max_steps=depth,
                            depth=depth if mode == "unrolled" else None)
            grad, args = _gradient_fn(model, None)
            compiled = jax.jit(grad).lower(*args, tokens, tokens).compile()
            out[mode].append(int(compiled.memory_analysis().temp_size_in_bytes))
    return out


def _median_time(compiled, args, repeats):
    jax.block_until_ready(compiled(*args))  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def profile(model: LanguageModel, tokens: jax.Array, targets: jax.Array, *, depth: int,
            repeats: int = 5, timing: bool = True) -> dict[str, float]:
    """Memory and speed of the model as a DEQ and unrolled to ``depth`` weight-tied layers with
    the same parameters (003 Tables 2-4).

    Each program is compiled once: its ``memory_analysis()`` gives the temporary memory of a
    training gradient (``mem_*``, bytes), and the compiled program is timed (median of
    ``repeats`` runs after a warm-up): ``train_*`` the gradient (forward and backward),
    ``infer_*`` the forward pass, in seconds. ``train_ratio``, ``infer_ratio`` and
    ``mem_ratio`` are DEQ / unrolled (> 1: the DEQ costs more), and ``nfe`` the DEQ's forward
    evaluations on this batch. ``timing=False``: memory only (no inference programs, no runs).
    """
    checks.positive_int(depth, "depth", "sequence.profile")
    checks.positive_int(repeats, "repeats", "sequence.profile")
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    out = {}
    for mode, d in (("deq", None), ("unrolled", depth)):
        grad, args = _gradient_fn(model, d)
        compiled = jax.jit(grad).lower(*args, tokens, targets).compile()
        out[f"mem_{mode}"] = int(compiled.memory_analysis().temp_size_in_bytes)
        if not timing:
            continue
        out[f"train_{mode}"] = _median_time(compiled, (*args, tokens, targets), repeats)

        def infer(params, rest, tokens, d=d):
            return nnx.merge(graphdef, params, rest)(tokens, depth=d)

        compiled = jax.jit(infer).lower(params, rest, tokens).compile()
        out[f"infer_{mode}"] = _median_time(compiled, (params, rest, tokens), repeats)
        if mode == "deq":
            out["nfe"] = float(compiled(params, rest, tokens)[1]["nfe"])
    for what in ("train", "infer", "mem") if timing else ("mem",):
        out[f"{what}_ratio"] = out[f"{what}_deq"] / out[f"{what}_unrolled"]
    return out


def inference_times(model: LanguageModel, tokens: jax.Array, *, depth: int | None = None,
                    repeats: int = 7) -> dict[str, Any]:
    """Wall times of one compiled inference program, to split a DEQ / unrolled time ratio into
    evaluations and per-evaluation cost.

    ``depth=None``: the DEQ (its solver); an integer: the weight-tied network of that depth.
    Returns ``{"median", "times", "nfe"}``: the median of ``repeats`` runs after a warm-up (s),
    all the runs, and the evaluations of ``f`` (the DEQ's forward NFE; ``depth`` when unrolled).
    Timing a depth-1 network too gives the cost outside the layer (embedding, head, dispatch), so
    that ``(t_L - t_1) / (L - 1)`` is the time of one layer evaluation and
    ``(t_DEQ - t_1) / nfe`` that of one solver iteration (an evaluation plus the solver's work).
    """
    where = "sequence.inference_times"
    if depth is not None:
        checks.positive_int(depth, "depth", where)
    checks.positive_int(repeats, "repeats", where)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def infer(params, rest, tokens):
        return nnx.merge(graphdef, params, rest)(tokens, depth=depth)

    compiled = jax.jit(infer).lower(params, rest, tokens).compile()
    jax.block_until_ready(compiled(params, rest, tokens))  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(params, rest, tokens))
        times.append(time.perf_counter() - start)
    nfe = float(compiled(params, rest, tokens)[1]["nfe"]) if depth is None else float(depth)
    return {"median": float(np.median(times)), "times": times, "nfe": nfe}


def equilibrium_tradeoff(model: LanguageModel, tokens: jax.Array, targets: jax.Array, *,
                         max_steps: int = 30, tolerances: Sequence[float] = (1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 1e-4),
                         reference: bool = True) -> dict[str, Any]:
    """Validation loss of a trained DEQ when its Broyden solve stops early (003 Figure 3).

    One Broyden iteration is run at a time, continuing the same iteration (``init_state``), so one
    compiled step gives every iteration limit k = 1 .. ``max_steps``: the loss of the k-th iterate
    is what the model gives with iteration limit k. For a tolerance eps each sequence stops at its
    first iterate whose relative residual is at most eps (at ``max_steps`` if none), as the solver
    does, and the loss is averaged over sequences.

    Returns:
        ``{"steps": k, "loss_at_step": mean loss of iterate k, "residual_at_step": median
        residual, "tolerances": eps, "loss_at_tol": loss, "steps_at_tol": mean stopping step}``
        and, with ``reference``, ``"converged_loss"``: the model's own loss
        (:func:`deqlab.nn.eval_step`, its own solver settings), which ``loss_at_tol`` at the
        model's tolerance reproduces.
    """
    checks.positive_int(max_steps, "max_steps", "sequence.equilibrium_tradeoff")
    graphdef, state = nnx.split(model)
    x = model.embed(tokens)
    cell = model.block.cell
    z0 = jnp.zeros(x.shape[:-1] + (cell.width,), x.dtype)
    solver = Broyden(tol=1e-30, max_steps=1)  # never met: exactly one step per call

    @jax.jit
    def advance(state, x, init):
        m = nnx.merge(graphdef, state)
        f = lambda z, x: m.block.cell(z, x)  # noqa: E731
        sol = solve(f, z0, x, solver=solver, batch_axis=0, init_state=init, on_failure="ignore")  # residual recorded
        z = sol.state.z.reshape(z0.shape)
        fz = f(z, x)
        axes = tuple(range(1, z.ndim))
        residual = jnp.sqrt(jnp.sum((fz - z) ** 2, axes)) / jnp.sqrt(jnp.sum(fz**2, axes))
        logits = m.head(m.block.cell.readout(z)).astype(jnp.float32)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean(-1)
        return sol.state, loss, residual

    losses, residuals = [], []
    init = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrecisionWarning)  # the unreachable tolerance is the point
        for _ in range(max_steps):
            init, loss, residual = advance(state, x, init)
            losses.append(np.asarray(loss))
            residuals.append(np.asarray(residual))
    losses, residuals = np.stack(losses), np.stack(residuals)  # (k, B)
    at_tol, steps_at_tol = [], []
    for eps in tolerances:
        met = residuals <= eps
        stop = np.where(met.any(0), met.argmax(0), max_steps - 1)
        at_tol.append(float(losses[stop, np.arange(losses.shape[1])].mean()))
        steps_at_tol.append(float(np.mean(stop + 1)))
    out = {"steps": np.arange(1, max_steps + 1), "loss_at_step": losses.mean(1),
           "residual_at_step": np.median(residuals, 1), "tolerances": np.asarray(tolerances),
           "loss_at_tol": np.asarray(at_tol), "steps_at_tol": np.asarray(steps_at_tol)}
    if reference:
        out["converged_loss"] = float(eval_step(model, tokens, targets)["loss"])
    return out
