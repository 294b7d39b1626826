"""Memory and speed of equilibrium sequence models (003 §5: Tables 2-4, Figures 2 left and 3).

- :func:`markov_corpus`: a synthetic language with a known entropy rate (a random second-order
  Markov chain), so that a validation loss can be read against its floor without a download.
- :func:`make_lm`: a small DEQ-Transformer or DEQ-TrellisNet language model.
- :func:`training_memory`: compiled temporary memory of one training gradient, implicit DEQ against
  the weight-tied network unrolled to matched depth L (003 Tables 2-3, memory column), measured as
  chapter 0 and ``benchmarks/memory.py`` do (``compile().memory_analysis()``).
- :func:`profile`: memory of a training step, and wall times of training and inference, DEQ
  against the unrolled network (and a 1-layer one, to split the time), timed in interleaved
  rounds so that every ratio comes from one measurement, with distribution-free intervals
  (:func:`median_interval`) (003 Tables 2-4).
- :func:`solver_counts` and :func:`train_counting`: each sequence's Broyden iterations, counted on
  fixed validation sequences while the model trains (003 Figure 2, left).
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

__all__ = ["markov_corpus", "make_lm", "batches", "gradient_program", "training_memory", "median_interval",
           "interval_text", "PROGRAMS", "profile", "solver_counts", "train_counting", "equilibrium_tradeoff"]

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
            embedding_std: float | None = None, **cell_options: Any) -> LanguageModel:
    """A small equilibrium language model (float32 by default).

    ``kind``: ``"transformer"`` (:class:`deqlab.nn.TransformerCell` with its defaults, 003's
    released layer with the attention residual; width d, 4 heads, feed-forward 4d) or
    ``"trellis"`` (:class:`deqlab.nn.TrellisCell` with hidden d/2, so that z has width d as well;
    kernel 2, dilation 1). Broyden forward (003 §5; ``solver`` replaces it, e.g.
    ``Broyden(m=2)``), implicit backward whose failures are not warned about but logged
    (``converged_fraction`` of the statistics). ``embedding_std``: as for
    :class:`deqlab.nn.LanguageModel` (None: flax's default, 1/sqrt(d)). ``cell_options`` go to the
    cell.

    Raises:
        ValueError: ``kind`` is unknown, ``width`` is odd for the trellis cell, or an argument of
            the cell or the model is not valid (as they raise it).

    Example:
        >>> from deqlab.lab.experiments.sequence import costs
        >>> model = costs.make_lm("transformer", vocab=5, width=8, embedding_std=1.0)
        >>> model.block.cell.attention_residual
        True
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
                         on_failure="ignore", embedding_std=embedding_std, rngs=rngs)


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


def median_interval(samples: Sequence[float], confidence: float = 0.95) -> dict[str, float]:
    """The median of ``samples`` and a distribution-free confidence interval for the median of the
    law they were drawn from (independent draws of a continuous law; no other assumption).

    The interval is ``[x_(k), x_(n+1-k)]`` (order statistics, 1-based) with the largest k such that
    ``P(Binomial(n, 1/2) <= k - 1) <= (1 - confidence) / 2``: the population median lies below
    ``x_(k)`` only if at most k - 1 draws fall below it. Its actual coverage,
    ``1 - 2 P(Binomial(n, 1/2) <= k - 1)``, is at least ``confidence`` and is returned.

    Args:
        samples: n >= 1 finite numbers.
        confidence: in (0, 1).

    Returns:
        ``{"median", "low", "high", "coverage"}``; low and high are NaN (coverage 0) when n is too
        small for the confidence asked (n <= 5 at 0.95).

    Raises:
        ValueError: ``samples`` is empty or not finite, or ``confidence`` is not in (0, 1).

    Example:
        >>> from deqlab.lab.experiments.sequence.costs import median_interval
        >>> out = median_interval(range(1, 16))
        >>> out["median"], out["low"], out["high"], round(out["coverage"], 3)
        (8.0, 4.0, 12.0, 0.965)
    """
    from scipy import stats

    where = "sequence.median_interval"
    x = np.sort(np.asarray(samples, dtype=float).ravel())
    if x.size == 0 or not np.all(np.isfinite(x)):
        raise checks.fail("samples", "one or more finite numbers", samples, where)
    confidence = checks.number(confidence, "confidence", where, lower=0.0)
    if not 0.0 < confidence < 1.0:
        raise checks.fail("confidence", "a number in (0, 1)", confidence, where)
    n = x.size
    tail = stats.binom.cdf(np.arange(n), n, 0.5)  # tail[k - 1] = P(B <= k - 1)
    ok = np.flatnonzero(tail <= (1.0 - confidence) / 2)
    median = float(np.median(x))
    if ok.size == 0:
        return {"median": median, "low": float("nan"), "high": float("nan"), "coverage": 0.0}
    k = int(ok[-1]) + 1
    return {"median": median, "low": float(x[k - 1]), "high": float(x[n - k]),
            "coverage": float(1.0 - 2.0 * tail[k - 1])}


def interval_text(summary: dict[str, float], scale: float = 1.0) -> str:
    """``"median (low to high)"`` of a :func:`median_interval` result, printed to the precision the
    interval supports: the last digit shown is that of the interval's half-width (one significant
    digit of it), so that a wide interval is not printed with digits it cannot vouch for.

    Args:
        summary: a dict with ``median``, ``low`` and ``high`` (finite; low <= median <= high).
        scale: multiplies the three numbers (1e3 for seconds shown in ms).

    Returns:
        The text; with a zero-width interval, the median to 3 significant digits.

    Raises:
        ValueError: ``summary`` lacks a key or its numbers are not finite, or ``scale`` is not a
            positive number.

    Example:
        >>> from deqlab.lab.experiments.sequence.costs import interval_text
        >>> interval_text({"median": 3.1212, "low": 2.5568, "high": 3.5643})
        '3.1 (2.6 to 3.6)'
        >>> interval_text({"median": 0.0518, "low": 0.0318, "high": 0.0678}, scale=1e3)
        '52 (32 to 68)'
    """
    where = "sequence.interval_text"
    scale = checks.positive_number(scale, "scale", where)
    try:
        m, lo, hi = (float(summary[k]) * scale for k in ("median", "low", "high"))
    except (KeyError, TypeError):
        raise checks.fail("summary", "a dict with median, low and high (a median_interval result)", summary,
                          where) from None
    if not all(np.isfinite((m, lo, hi))):
        raise checks.fail("summary", "finite median, low and high", summary, where)
    half = (hi - lo) / 2
    if half <= 0:
        return f"{m:.3g}"
    decimals = max(0, -int(np.floor(np.log10(half))))
    m, lo, hi = (round(v, decimals) + 0.0 for v in (m, lo, hi))  # + 0.0: no "-0"
    return f"{m:.{decimals}f} ({lo:.{decimals}f} to {hi:.{decimals}f})"


PROGRAMS = ("train_deq", "train_unrolled", "infer_deq", "infer_unrolled", "infer_one")
"""The five compiled programs :func:`profile` times: a training gradient of the DEQ and of the
network unrolled to L layers, and inference of the DEQ, of the L-layer network and of a 1-layer one."""


def profile(model: LanguageModel, tokens: jax.Array, targets: jax.Array, *, depth: int,
            repeats: int = 15, timing: bool = True, confidence: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """Memory and speed of the model as a DEQ and unrolled to ``depth`` weight-tied layers with
    the same parameters (003 Tables 2-4), from one set of timed runs.

    The training gradient (forward and backward) is compiled as a DEQ (implicit backward) and
    unrolled (backpropagation through ``depth`` layers); its ``memory_analysis()`` gives the
    temporary memory ``mem_deq`` and ``mem_unrolled`` (bytes). With ``timing``, the five programs
    of :data:`PROGRAMS` are compiled and warmed up, then run in ``repeats`` rounds, each program
    once per round in a shuffled order (``seed``), so that a slow spell of a shared machine falls
    on all of a round's programs alike; each ratio is formed within a round, and every number
    returned comes from these same runs.

    Per round, with t the wall times, L = ``depth`` and NFE the DEQ's forward evaluations:

    - ``train_ratio = t_train_deq / t_train_unrolled`` and ``infer_ratio = t_infer_deq / t_infer_unrolled``
      (> 1: the DEQ is slower);
    - ``layer = (t_infer_unrolled - t_infer_one) / (L - 1)``: one more layer of the deep network (s);
      ``iteration = (t_infer_deq - t_infer_one) / NFE``: one iteration of the DEQ's solve, its
      evaluation of f and the solver's own work (s); ``overhead = iteration / layer``. Then
      ``t_infer_unrolled = t_infer_one + (L - 1) layer`` and ``t_infer_deq = t_infer_one + NFE
      iteration`` exactly;
    - ``backward_deq = (t_train_deq - t_infer_deq) / t_infer_deq`` and ``backward_unrolled``
      likewise: what training adds to inference, as a multiple of inference. Exactly
      ``train_ratio = infer_ratio (1 + backward_deq) / (1 + backward_unrolled)``, so training
      compares better than inference exactly when ``backward_deq < backward_unrolled``.

    Args:
        model: a :class:`deqlab.nn.LanguageModel` (its block in equilibrium mode).
        tokens, targets: int ``(batch, T)``.
        depth: L >= 2, the depth of the unrolled network.
        repeats: rounds, >= 6 (the least for a 95% interval).
        timing: False: memory only (nothing is run).
        confidence: of the intervals.
        seed: of the shuffled order.

    Returns:
        ``mem_deq``, ``mem_unrolled``, ``mem_ratio``; with ``timing`` also ``nfe``, ``times`` (a dict
        of arrays ``(repeats,)`` per program, s), ``rounds`` (a dict of arrays ``(repeats,)``: the
        per-round quantities above) and ``summary``: for each program and each per-round quantity,
        :func:`median_interval` of its values.

    Raises:
        ValueError: ``depth`` < 2 or ``repeats`` < 6 (with ``timing``).

    Example:
        >>> import jax
        >>> from deqlab.lab.experiments.sequence import costs
        >>> model = costs.make_lm("trellis", vocab=5, width=8)
        >>> tokens, _ = costs.markov_corpus(jax.random.key(0), vocab=5, sequences=2, length=6)
        >>> p = costs.profile(model, tokens[:, :-1], tokens[:, 1:], depth=4, timing=False)
        >>> sorted(p)
        ['mem_deq', 'mem_ratio', 'mem_unrolled']
    """
    where = "sequence.profile"
    depth = checks.integer(depth, "depth", where, minimum=2)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    out: dict[str, Any] = {}
    compiled = {}
    for mode, d in (("deq", None), ("unrolled", depth)):
        grad, args = _gradient_fn(model, d)
        program = jax.jit(grad).lower(*args, tokens, targets).compile()
        out[f"mem_{mode}"] = int(program.memory_analysis().temp_size_in_bytes)
        compiled[f"train_{mode}"] = (program, (*args, tokens, targets))
    out["mem_ratio"] = out["mem_deq"] / out["mem_unrolled"]
    if not timing:
        return out
    repeats = checks.integer(repeats, "repeats", where, minimum=6)

    for name, d in (("infer_deq", None), ("infer_unrolled", depth), ("infer_one", 1)):
        def infer(params, rest, tokens, d=d):
            return nnx.merge(graphdef, params, rest)(tokens, depth=d)

        compiled[name] = (jax.jit(infer).lower(params, rest, tokens).compile(), (params, rest, tokens))
    for program, args in compiled.values():  # warm up
        jax.block_until_ready(program(*args))
    out["nfe"] = float(compiled["infer_deq"][0](*compiled["infer_deq"][1])[1]["nfe"])
    times = {name: np.empty(repeats) for name in PROGRAMS}
    rng = np.random.default_rng(seed)
    for r in range(repeats):
        for name in rng.permutation(PROGRAMS):
            program, args = compiled[name]
            start = time.perf_counter()
            jax.block_until_ready(program(*args))
            times[name][r] = time.perf_counter() - start
    t = times
    layer = (t["infer_unrolled"] - t["infer_one"]) / (depth - 1)
    iteration = (t["infer_deq"] - t["infer_one"]) / out["nfe"]
    rounds = {
        "train_ratio": t["train_deq"] / t["train_unrolled"],
        "infer_ratio": t["infer_deq"] / t["infer_unrolled"],
        "layer": layer,
        "iteration": iteration,
        "overhead": iteration / layer,
        "backward_deq": (t["train_deq"] - t["infer_deq"]) / t["infer_deq"],
        "backward_unrolled": (t["train_unrolled"] - t["infer_unrolled"]) / t["infer_unrolled"],
    }
    out["times"] = times
    out["rounds"] = rounds
    out["summary"] = {name: median_interval(values, confidence) for name, values in {**times, **rounds}.items()}
    return out


def solver_counts(model: LanguageModel, tokens: jax.Array, *, radius_steps: int = 0,
                  exact_radius: bool = False) -> dict[str, np.ndarray]:
    """Broyden iterations and convergence of each sequence's forward solve, at the model's own
    solver settings (its tolerance and iteration limit), and optionally the spectral radius of the
    cell's Jacobian where the solve stopped.

    Args:
        model: a :class:`deqlab.nn.LanguageModel` in equilibrium mode.
        tokens: int ``(batch, T)``.
        radius_steps: 0 (default): no radius; n >= 2: also ``radius``, the spectral radius of
            ``J_f`` at each sequence's last iterate (:func:`deqlab.stability.spectral_radius`, n
            power-iteration steps). It is the radius at the equilibrium z* only where
            ``converged`` is True; elsewhere it is taken at a point that is not one. Power
            iteration approaches the radius from below, and slowly where several eigenvalues lie
            near it in modulus (chapter 5's transformer cell: a few per cent low after 30 steps).
        exact_radius: True: also ``radius_exact``, the exact spectral radius at the same last
            iterates, from the eigenvalues of the Jacobian's diagonal blocks (exact for a causal
            cell, whose Jacobian is block lower triangular): ``width`` Jacobian-vector products per
            sequence for a transformer cell
            (:func:`deqlab.lab.experiments.sequence.language_model.diagonal_blocks`),
            ``T * width`` for another cell, whose dense Jacobian is formed
            (:func:`deqlab.lab.experiments.sequence.weight_tied.linearisation`; seconds for 64
            sequences of 32 x 32 on a CPU).

    Returns:
        ``{"steps": (batch,) iterations, "converged": (batch,) bool}`` and, with ``radius_steps``,
        ``"radius": (batch,)``; with ``exact_radius``, ``"radius_exact": (batch,)``.

    Raises:
        ValueError: the model is unrolled (``depth`` set), ``tokens`` are not valid ids,
            ``radius_steps`` is 1 or negative, or ``exact_radius`` is not a bool.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.lab.experiments.sequence import costs
        >>> model = costs.make_lm("trellis", vocab=5, width=8, max_steps=10)
        >>> out = costs.solver_counts(model, jnp.array([[1, 2, 3], [4, 0, 1]]))
        >>> out["steps"].shape, out["converged"].dtype
        ((2,), dtype('bool'))
        >>> costs.solver_counts(model, jnp.array([[1, 2, 3]]), exact_radius=True)["radius_exact"].shape
        (1,)
    """
    where = "sequence.solver_counts"
    if model.block.depth is not None:
        raise checks.fail("model", "a LanguageModel in equilibrium mode (depth None)", f"depth={model.block.depth}",
                          where)
    radius_steps = checks.integer(radius_steps, "radius_steps", where, minimum=0)
    if radius_steps == 1:
        raise checks.fail("radius_steps", "0 (no radius) or an integer >= 2", radius_steps, where)
    if not isinstance(exact_radius, bool):
        raise checks.fail("exact_radius", "True or False", exact_radius, where)
    from deqlab.nn.lm import _token_ids

    tokens = jnp.asarray(tokens)

    _token_ids(tokens, model.vocab_size, "tokens", where)  # concrete ids, checked before compiling
    steps, converged, radius, z, x = _counts(model, tokens, radius_steps)
    out = {"steps": np.asarray(steps), "converged": np.asarray(converged)}
    if radius_steps:
        out["radius"] = np.asarray(radius)
    if exact_radius:
        from deqlab.lab.experiments.sequence import initialisation, language_model, weight_tied

        cell = model.block.cell
        if isinstance(cell, TransformerCell):
            blocks = language_model.diagonal_blocks(cell, z, x)[1]
            out["radius_exact"] = initialisation.block_radius(jax.device_get(blocks))
        else:
            out["radius_exact"] = weight_tied.linearisation(cell, z, x, singular_values=False)["radius"]
    return out


@nnx.jit(static_argnums=2)
def _counts(model, tokens, radius_steps):
    from deqlab import stability
    from deqlab.failures import Result

    x = model.embed(tokens)
    z, sol = model.block.deq(x, None, return_solution=True)
    radius = None
    if radius_steps:
        cell = model.block.cell
        radius = stability.spectral_radius(lambda z, x: cell(z, x), z, x, key=jax.random.key(0), steps=radius_steps,
                                           batch_axis=0)
    return sol.stats.steps, sol.result == Result.SUCCESS, radius, z, x


def train_counting(model: LanguageModel, optimizer: nnx.Optimizer, train_tokens: np.ndarray,
                   val_tokens: np.ndarray, *, batch: int, steps: int, every: int, seed: int = 0,
                   radius_steps: int = 0, snapshots: bool = False) -> dict[str, Any]:
    """Train with :func:`deqlab.nn.train` on :func:`batches` and, before training and after
    every ``every`` steps, count each validation sequence's Broyden iterations
    (:func:`solver_counts`), so that the solver's work is compared on the same sequences as the
    model changes (003 Figure 2, left, plots it on the training batches).

    Args:
        model, optimizer: as for :func:`deqlab.nn.train` (updated in place).
        train_tokens: int ``(n, T + 1)`` training sequences (inputs ``[:, :-1]``, targets ``[:, 1:]``).
        val_tokens: int ``(m, T + 1)`` validation sequences (their inputs are solved).
        batch: sequences per training step.
        steps: training steps.
        every: steps between counts, a divisor of ``steps``.
        seed: of the batches.
        radius_steps: as for :func:`solver_counts` (0: no radius).
        snapshots: True: also ``"models"``, a copy of the model (``nnx.clone``) at each count, so
            that a costlier measurement (``solver_counts(..., exact_radius=True)``) can be taken
            afterwards at the counts it needs.

    Returns:
        ``{"log": the per-step log of deqlab.nn.train, "at": (E,) training steps of the counts
        (0, every, ..., steps), "steps": (E, m) iterations, "converged": (E, m) bool}`` and, with
        ``radius_steps``, ``"radius": (E, m)``; with ``snapshots``, ``"models"``: a list of E models.

    Raises:
        ValueError: ``every`` does not divide ``steps``, a size is not an integer >= 1, or
            ``snapshots`` is not a bool.

    Example:
        >>> import jax, optax
        >>> from flax import nnx
        >>> from deqlab.lab.experiments.sequence import costs
        >>> tokens, _ = costs.markov_corpus(jax.random.key(0), vocab=5, sequences=8, length=6)
        >>> model = costs.make_lm("trellis", vocab=5, width=8, max_steps=10)
        >>> opt = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
        >>> out = costs.train_counting(model, opt, tokens[:6], tokens[6:], batch=2, steps=4, every=2)
        >>> out["at"].tolist(), out["steps"].shape, len(out["log"]["loss"])
        ([0, 2, 4], (3, 2), 4)
        >>> "models" in out
        False
    """
    from deqlab import nn

    where = "sequence.train_counting"
    steps = checks.positive_int(steps, "steps", where)
    every = checks.positive_int(every, "every", where)
    checks.positive_int(batch, "batch", where)
    if steps % every:
        raise checks.fail("every", f"a divisor of steps ({steps})", every, where)
    if not isinstance(snapshots, bool):
        raise checks.fail("snapshots", "True or False", snapshots, where)
    val_inputs = jnp.asarray(np.asarray(val_tokens)[:, :-1])
    stream = batches(train_tokens, batch=batch, steps=steps, seed=seed)
    log: dict[str, list[float]] = {}
    counts = [solver_counts(model, val_inputs, radius_steps=radius_steps)]
    models = [nnx.clone(model)] if snapshots else []
    for _ in range(steps // every):
        chunk = nn.train(model, optimizer, (next(stream) for _ in range(every)))
        for k, v in chunk.items():
            log.setdefault(k, []).extend(v)
        counts.append(solver_counts(model, val_inputs, radius_steps=radius_steps))
        if snapshots:
            models.append(nnx.clone(model))
    out = {"log": log, "at": np.arange(0, steps + 1, every),
           **{k: np.stack([c[k] for c in counts]) for k in counts[0]}}
    if snapshots:
        out["models"] = models
    return out


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
