"""The DEQ-Transformer ensemble study of 001 §4.2-4.3 (Table 1, Figure 6), resumable and sharded.

001 §4.2 trains a DEQ whose layer is a vanilla transformer layer on Wikitext-103, with the two
feed-forward ("dense") matrices drawn from the Gaussian (i.i.d., the paper's "random"), Haar
orthogonal and GOE ensembles at sqrt(V) in {0.1, 0.3, 1.0}, 10 seeds each; §4.3 reports the
minimum and average test perplexity over the seeds (Table 1) and the test-loss curves (Fig. 6).
App. D: hidden state 700, feed-forward 2800 (GOE: 700, its matrices being square), batch 512,
context 128, 20 Broyden steps, a learning rate of 1e-3 with 2e3 steps of linear warm-up then a
cosine decay over 5e4 steps, a pre-trained SentencePiece tokenizer. Adam with gradients clipped to
norm 1, a tokenizer trained on the corpus, unit-variance embeddings and the attention at
sqrt(V) = 0.3 are ours. The code 001 modified (Khan's deq-jax, ``src/model/train.py`` and
``src/model/model.py``) differs: ``optax.adam(b1=0.9, b2=0.99)`` after
``clip_by_global_norm(0.25)``, embeddings from ``TruncatedNormal(0.02)``, and the attention and
dense kernels from ``hk.initializers.VarianceScaling(2 / sqrt(num_layers))`` with ``num_layers = 1``
by default: variance 2 / fan_in, i.e. Gaussian at sqrt(V) = sqrt(2), about 1.41, for the attention,
which 001 App. D says it did not change (it replaced the dense kernels by its ensembles). Chapter 5
page 5 (exercise 3) measures that tripling the attention scale lowers the initial cell's spectral
radius at its equilibria, so this departure likely puts the quick study nearer the edge of
convergence than 001's model was (not measured here).

**What sqrt(V) is.** 001 §2 writes every weight as ``W = sqrt(V) W0`` with ``W0`` normalised
(Gaussian entries of variance 1/N, Haar orthogonal, GOE with off-diagonal variance 1/N; 001
App. A.1), so that ``V`` is the mean squared singular value and the linear DEQ loses its fixed
point at ``V_c = 1`` (Gaussian, orthogonal) or ``1/4`` (GOE, 001 Eq. 81 and §2.1.2). deqlab's
``scale`` argument *is* sqrt(V) in this sense (:mod:`deqlab.ensembles`: ``W = scale * W0``), and
:class:`deqlab.nn.TransformerCell` draws both feed-forward matrices ``W1`` (width x hidden) and
``W2`` (hidden x width) with it. So sqrt(V) = 1.0 is *at* the critical scale of the Gaussian and
orthogonal ensembles and at twice the GOE's (``critical_scale("goe") = 0.5``); 0.3 is 0.3 and 0.6
of them. For the rectangular matrices the paper does not say how ``W0`` is normalised; deqlab's
choice (:func:`deqlab.ensembles.initializer`) is variance ``1/fan_in`` for the Gaussian and
orthonormal rows or columns for the orthogonal ensemble, so ``|a W1|^2 = V |a|^2`` for the
orthogonal expansion but ``4 V |a|^2`` (in expectation) for the Gaussian one: the per-unit hidden
variance differs by the expansion factor 4. The study records it (``hidden_variance``).

**Seeds in one program.** :func:`train_seeds` initialises one model per seed (``jax.vmap`` over
the keys), splits it into its graph and its parameters, and trains all seeds with one compiled,
seed-``vmap``-ped program: a ``lax.scan`` over ``eval_every`` steps, then an evaluation on test
windows. The seeds share the batch sequence (set by ``data_seed``) and differ in their
initialisation. Seed s draws the same embedding, attention and head in every configuration (the
same key stream; only the two feed-forward matrices come from another law or scale), so
configurations are compared seed by seed (:func:`check_claims`). The batch is
sharded over a data mesh (:func:`deqlab.nn.data_mesh`, :func:`deqlab.nn.shard_batch`) when one
is given, the parameters replicated: the same program runs on one CPU, simulated CPU devices, a
GPU or a TPU slice. Gaussian and orthogonal configurations share one compiled program (same
shapes; the initialisation is an input); GOE, with its square feed-forward, compiles another.

**Staying at equilibrium.** 001 does not use a Jacobian penalty ("may be overcome even without
regularization", §4.3); the option ``jacobian_gamma`` adds Bai, Koltun & Kolter's (2021) penalty
``gamma ||J_f(z*)||_F^2 / (T d)`` (:func:`deqlab.stability.jacobian_penalty`, one Rademacher
probe) to the loss. We measured it at the quick size (Gaussian, sqrt(V) = 1, 10 seeds, 128 steps,
learning rate 1e-2). With flax's default embedding (std 1/sqrt(width)) the fraction of test
sequences whose Broyden solve met the tolerance 1e-3 within 20 steps was 0.27 at initialisation
(the lowest seed), and the fraction of training sequences 0.91 over the last quarter of training;
``gamma = 1`` brought the latter to 1.00 (3.1 Broyden steps on average), but the mean final test
loss rose from 3.85 to 3.97 nats. With unit-variance embeddings
(``embedding_std = 1.0``, the default of :data:`QUICK` and :data:`FULL`) no penalty is needed: the
lowest converged fraction of the test sequences at an evaluation after initialisation was 0.97
(1.00 with ``gamma = 1``) and the loss 3.87 nats (3.92 with ``gamma = 1``). These measurements
predate the current default cell (003's released layer, with the attention residual, which starts
near a spectral radius of 1) and do not describe it: on it the lowest converged fraction at an
evaluation after initialisation is far lower (measured 0.22 at the quick size, unit-variance
embeddings, no penalty; chapter 5 page 6 reports the fractions at every evaluation). The penalty
has not been remeasured on it.
The study's default is therefore the paper's setup, ``jacobian_gamma = 0``, with deqlab's
attention scale (0.3 of the critical scale), unit-variance embeddings and tolerance 1e-3, and the
solver's behaviour is
*recorded*, run by run, as data, and no run is dropped for it (001 Table 1 likewise averages over
runs whose training curves "don't converge at all", a statement about the test loss, not the solver).
Per run and per step the study records the mean number of Broyden steps, the worst relative
residual and the fraction of sequences whose solve met the tolerance; ``solver_stopped_step`` is
the first step after the warm-up at which that fraction fell below ``failure_threshold``, and
``solver_failed`` says it is below the threshold on average over the last tenth of training.

**At initialisation** each seed records, on the first batch of evaluation windows: the fraction of
its sequences whose ``max_steps`` solve converged (``init_converged_fraction``); the same cell solved
again from zero with :data:`INIT_BUDGET` Broyden steps to :data:`INIT_TOL`, and the fraction of
sequences that converged then (``init_equilibrium_fraction``); the spectral radius of the cell's
Jacobian at those equilibria (``init_spectral_radius``, the mean over the converged sequences, NaN if
none) and at the ``max_steps`` iterate (``init_iterate_radius``, the mean over all, which is not an
equilibrium where the solve did not converge), both exact at the quick size (the cell is causal: the
eigenvalues of the diagonal blocks ``d f_t / d z_t``,
:func:`deqlab.lab.experiments.sequence.initialisation.causal_diagonal_blocks`) and by power
iteration above :data:`EXACT_RADIUS_SIZE`; and the second moment of the feed-forward's hidden
pre-activations ``h = a W1 + b1`` at the probe's iterates (``hidden_variance``;
:meth:`deqlab.nn.TransformerCell.feed_forward_hidden`).

**Sweeps.** :func:`run_study` runs every (ensemble, sqrt(V)) through the resumable
:func:`deqlab.lab.experiments.sweep.run_sweep` (one stored file per configuration) with orbax
checkpoints after an evaluation once :data:`CHECKPOINT_SECONDS` have passed since the last one, so
an interrupted study resumes at the last checkpointed evaluation of the unfinished configuration (or
at its start, if none was written yet: at the quick scale a configuration trains in seconds). :func:`summarize` reduces the rows to 001 Table 1.

**Claims.** :func:`check_claims` tests each claim of 001 §4.3 over seeds, the independent units
(a seed's nine runs share everything but the feed-forward matrices): Monte Carlo permutation tests
within seed for the perplexity claims (with studentised intervals for the claims about means),
exact sign tests for counts, and Holm's family-wise control over the claims table
(:func:`deqlab.lab.stats.claims_verdicts`). Each claim about trajectories is tested at the sqrt(V)
where 001 makes it: "converge" at sqrt(V) = 0.1 is a test-loss curve reaching its plateau
(:func:`plateau`), "low test loss" at sqrt(V) = 1 a final test loss below a threshold fixed before
the runs (:func:`unigram_loss`); the Broyden solver's convergence is reported as a diagnostic.

The full study is one command::

    python -m deqlab.lab.experiments.sequence.ensemble_study --scale full --out DIR
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from deqlab import checks
from deqlab.lab import data

__all__ = ["ENSEMBLES", "SQRT_V", "QUICK", "FULL", "PAPER_TABLE", "study_config", "train_seeds", "run_study",
           "summarize", "per_seed_rows", "INIT_BUDGET", "INIT_TOL", "EXACT_RADIUS_SIZE", "RADIUS_STEPS",
           "unigram_loss", "PLATEAU_TOLERANCE", "plateau", "SCOPE", "check_claims", "TESTABLE_CLAIMS",
           "means_sizing", "main"]

ENSEMBLES = ("gaussian", "orthogonal", "goe")
"""001 §4.3's matrix families (its "random" is deqlab's ``"gaussian"``)."""

SQRT_V = (0.1, 0.3, 1.0)
"""001 §4.3's scales sqrt(V) of the feed-forward matrices (Table 1's rows)."""

PAPER_TABLE = {
    ("goe", 0.1): (68.1, 71.8), ("goe", 0.3): (66.1, 69.8), ("goe", 1.0): (66.3, 68.3),
    ("orthogonal", 0.1): (60.7, 162.7), ("orthogonal", 0.3): (60.5, 173.4), ("orthogonal", 1.0): (57.4, 112.1),
    ("gaussian", 0.1): (56.8, 153.9), ("gaussian", 0.3): (56.3, 224.9), ("gaussian", 1.0): (55.6, 481.5),
}
"""001 Table 1: (min, average) test perplexity on Wikitext-103 over 10 seeds, per (ensemble, sqrt(V))."""

QUICK = dict(corpus="austen", tokenizer="sentencepiece", vocab_size=128, context=16, width=16, heads=2,
             batch_size=8, steps=128, warmup=16, learning_rate=1e-2, max_steps=20, tol=1e-3,
             attention_scale=None, jacobian_gamma=0.0, embedding_std=1.0, eval_every=16, eval_batches=8,
             log_every=1, failure_threshold=0.9, data_seed=0)
"""The quick study: a small model on the bundled corpus, sized so that the 90 runs take about
a minute on two CPU cores, compilation included (measured at 0.9.0: 122 XLA compilations, about
19 s: the chunk, probe and evaluation programs twice each, the GOE's shapes being smaller, and
the eager random initialisations). The learning rate 1e-2 is ours: measured at 3e-3 over 96
steps, every run of three configurations ended at 4.02-4.14 nats of test loss, the models having
learned little beyond piece frequencies. ``embedding_std=1.0`` (unit-variance
embeddings, :class:`deqlab.nn.LanguageModel`) is ours too: on 003's released layer neither scale
brings the *initial* model to its equilibrium within the 20 Broyden steps (chapter 5 page 6 reports
the converged fractions at step 0), and training does at both; what the scale changes is what the
model learns: at flax's default scale no more than the pieces' frequencies (chapter 5 page 4
compares the two)."""

FULL = dict(corpus="wikitext-103", tokenizer="sentencepiece", vocab_size=32000, context=128, width=700, heads=10,
            batch_size=512, steps=52000, warmup=2000, learning_rate=1e-3, max_steps=20, tol=1e-3,
            attention_scale=None, jacobian_gamma=0.0, embedding_std=1.0, eval_every=2000, eval_batches=8,
            log_every=100, failure_threshold=0.9, data_seed=0)
"""001 App. D: width 700 (feed-forward 2800, GOE 700), batch 512, context 128, 20 Broyden steps,
lr 1e-3 with 2e3 warm-up steps then cosine decay over 5e4. The vocabulary (32000), the heads (10)
and the tolerance are not in the paper: ours."""

TESTABLE_CLAIMS = 14
"""The claims of 001 that :func:`check_claims` can test at some scale (all but the two universal
ones): four about means, six about best seeds, the ratio of mean to best seed, and three "more
often" counts. Holm's first step divides the level by this many (:func:`means_sizing`); chapter 5
page 6 checks the number against its own table of claims."""


def means_sizing(alpha: float = 0.05, power: float = 0.8, family: int = TESTABLE_CLAIMS) -> dict[str, Any]:
    """Seeds for 80 % power on 001's smallest ordering of means, at the spreads 001's Table 1 allows.

    The smallest effect of interest (SESOI) of the mean claims is the smallest gap between two means on
    which 001 rests an ordering of means (:data:`PAPER_TABLE`): the GOE's 68.3 against orthogonal's 112.1
    at sqrt(V) = 1. Table 1 gives only the minimum ``lo`` and mean ``mu`` of n = 10 seeds, which bound
    the seeds' standard deviation (ddof 1): least, ``(mu - lo) sqrt(n) / (n - 1)``, with one seed at
    ``lo`` and nine equal; greatest, ``(mu - lo) sqrt(n)``, with nine at ``lo`` and one failed seed
    carrying the rest (the variance is convex in the seeds, so its maximum is at a vertex). Taking
    orthogonal's standard deviation as that of the per-seed difference, the paired t-test at the
    two-sided level ``alpha / family`` (Holm's first step) needs the seeds returned here to reject in
    the claim's direction with probability ``power`` (noncentral t, ``scipy.stats.nct``). The design
    is scale free: it detects a mean difference of ``standardised_gap`` standard deviations of the
    per-seed difference, whatever that deviation is at the scale a study runs.

    Args:
        alpha: two-sided family-wise level, in (0, 1).
        power: the power wanted, in (0, 1).
        family: the claims Holm's first step divides ``alpha`` by (>= 1).

    Returns:
        ``gap`` (perplexity), ``sd_bounds`` (least, greatest), ``standardised_gap`` (least, greatest:
        gap / sd) and ``seeds_needed`` (at the least and at the greatest spread, the order of
        ``sd_bounds``), with ``alpha``, ``power`` and ``family``.

    Raises:
        ValueError: ``alpha`` or ``power`` outside (0, 1), or ``family`` not an integer >= 1 (named).

    Example:
        >>> from deqlab.lab.experiments.sequence import ensemble_study as es
        >>> plan = es.means_sizing()
        >>> round(plan["gap"], 1), plan["seeds_needed"]
        (43.8, [7, 225])
    """
    from scipy import stats

    where = "ensemble_study.means_sizing"
    alpha = checks.number(alpha, "alpha", where, lower=0.0, upper=1.0, lower_open=True, upper_open=True)
    power = checks.number(power, "power", where, lower=0.0, upper=1.0, lower_open=True, upper_open=True)
    family = checks.integer(family, "family", where, minimum=1)
    lo, mu = PAPER_TABLE["orthogonal", 1.0]
    gap = mu - PAPER_TABLE["goe", 1.0][1]
    n_paper = 10
    sd_bounds = ((mu - lo) * math.sqrt(n_paper) / (n_paper - 1), (mu - lo) * math.sqrt(n_paper))
    n_grid = np.arange(2, 20001)  # a paired t-test needs two seeds
    crit = stats.t.ppf(1 - alpha / (2 * family), n_grid - 1)
    needed = []
    for sd in sd_bounds:
        reached = stats.nct.sf(crit, n_grid - 1, gap / sd * np.sqrt(n_grid)) >= power
        if not reached.any():  # pragma: no cover - a tiny power would need more than the grid
            raise checks.fail("power", f"a power reached with at most {n_grid[-1]} seeds", power, where)
        needed.append(int(n_grid[np.argmax(reached)]))
    return {"gap": gap, "sd_bounds": sd_bounds, "standardised_gap": tuple(gap / sd for sd in sd_bounds),
            "seeds_needed": needed, "alpha": alpha, "power": power, "family": family}


_INT_KEYS = ("vocab_size", "context", "width", "heads", "batch_size", "steps", "max_steps", "eval_every",
             "eval_batches", "log_every")


def study_config(scale: str | None = None, **overrides: Any) -> dict:
    """The study's options: :data:`QUICK` or :data:`FULL` (``scale``, default from
    ``DEQLAB_SCALE`` via ``deqlab.lab.experiments.pick``) with ``overrides``, checked."""
    from deqlab.lab.experiments import pick

    where = "ensemble_study.study_config"
    if scale is None:
        base = pick(quick=QUICK, full=FULL)
    else:
        base = {"quick": QUICK, "full": FULL}[checks.choice(scale, "scale", ("quick", "full"), where)]
    unknown = set(overrides) - set(base)
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {sorted(unknown)}; valid options are {sorted(base)}.")
    return _check(dict(base, **overrides), where)


def _check(o: dict, where: str) -> dict:
    missing = set(QUICK) - set(o)
    if missing:
        raise checks.fail("config", f"a dict with the keys {sorted(QUICK)}", f"one missing {sorted(missing)}", where)
    o = dict(o)
    for k in _INT_KEYS:
        o[k] = checks.positive_int(o[k], k, where)
    o["warmup"] = checks.integer(o["warmup"], "warmup", where, minimum=0, maximum=o["steps"] - 1)
    o["data_seed"] = checks.integer(o["data_seed"], "data_seed", where, minimum=0)
    o["learning_rate"] = checks.positive_number(o["learning_rate"], "learning_rate", where)
    o["tol"] = checks.positive_number(o["tol"], "tol", where)
    o["jacobian_gamma"] = checks.number(o["jacobian_gamma"], "jacobian_gamma", where, lower=0.0)
    o["failure_threshold"] = checks.unit_interval(o["failure_threshold"], "failure_threshold", where)
    if o["attention_scale"] is not None:
        o["attention_scale"] = checks.number(o["attention_scale"], "attention_scale", where, lower=0.0)
    if o["embedding_std"] is not None:
        o["embedding_std"] = checks.positive_number(o["embedding_std"], "embedding_std", where)
    if o["width"] % o["heads"]:
        raise checks.fail("heads", f"a divisor of width ({o['width']})", o["heads"], where)
    if o["steps"] % o["eval_every"]:
        raise checks.fail("eval_every", f"a divisor of steps ({o['steps']})", o["eval_every"], where)
    if o["eval_every"] % o["log_every"]:
        raise checks.fail("log_every", f"a divisor of eval_every ({o['eval_every']})", o["log_every"], where)
    return o


def _make_model(o: dict, vocab: int, ensemble: str, sqrt_v: Any, rngs: nnx.Rngs):
    from deqlab.nn.lm import LanguageModel
    from deqlab.nn.transformer import TransformerCell

    cell = TransformerCell(o["width"], o["width"], heads=o["heads"], ensemble=ensemble, scale=sqrt_v,
                           attention_scale=o["attention_scale"], max_distance=o["context"], rngs=rngs)
    # a failed solve is data here (converged_fraction per step), not a warning
    return LanguageModel(vocab, cell, solver="broyden", tol=o["tol"], max_steps=o["max_steps"],
                         on_failure="ignore", embedding_std=o["embedding_std"], rngs=rngs)


def _optimizer(o: dict):
    # 001 App. D: linear warm-up, then cosine decay; optax's decay_steps counts the warm-up too
    schedule = optax.warmup_cosine_decay_schedule(0.0, o["learning_rate"], o["warmup"], o["steps"])
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule))


CHECKPOINT_SECONDS = 60.0
"""Seconds of wall time in :func:`train_seeds`'s training loop (evaluations included) between two
of its checkpoints (with a ``checkpoint_dir``): it saves after the first evaluation chunk that ends
this long after the last save (or after the loop began), and when ``stop_after`` ends the call.
An interruption loses the training since the last save, at most about this much plus one chunk
(where a chunk takes longer, as at the full scale, every chunk but the last is saved), and a short
run does not spend its time writing: at the quick scale, where a chunk takes
a fraction of a second, a save after every chunk (72 orbax saves, each waited for until on disk)
made the compiled study take 44.6 s and 42.4 s against 36.4 s (2-core machine, one process)."""

INIT_BUDGET = 300
"""Broyden steps of the at-initialisation probe's own solve (:func:`train_seeds`), to :data:`INIT_TOL`.
The study's budget (``max_steps``, 20 as 001 App. D) leaves most initial solves unconverged at the
quick size, and a spectral radius taken at an unconverged iterate is not the equilibrium's (chapter
5 pages 4 and 6 compare the two); 300 is chapter 5 page 5's budget."""

INIT_TOL = 1e-5
"""Relative tolerance of the probe's solve. Near a spectral radius of 1 a residual says little about
the distance to ``z*`` (to first order at most residual / sigma_min(I - J), and sigma_min(I - J) is at
most the smallest distance from 1 to an eigenvalue of J, small there: chapter 5 page 1): at the quick size, radii at points that met 1e-3
differed from those at 1e-5 by up to 0.14 (measured, Gaussian, sqrt(V) = 1), so the probe asks for
1e-5, as chapter 5 page 5 does."""

EXACT_RADIUS_SIZE = 4096
"""The probe forms the diagonal Jacobian blocks (exact radii,
:func:`deqlab.lab.experiments.sequence.initialisation.causal_diagonal_blocks` given the cell:
``width`` JVPs per sequence, and ``context * width**2`` numbers per sequence, their eigenvalues
taken on the host) when ``context * width`` is at most this; above it (the full scale) it estimates
them by power iteration with :data:`RADIUS_STEPS` steps."""

RADIUS_STEPS = 200
"""Power-iteration steps of the probe's radii above :data:`EXACT_RADIUS_SIZE`
(:func:`deqlab.stability.spectral_radius`; 200 steps matched the exact value to about 1% at width 32)."""


def _init_solver():
    from deqlab.solvers import Broyden

    # a wild Broyden step (residual x 1e4) may recover: counted as failed only when the budget is spent
    return Broyden(tol=INIT_TOL, max_steps=INIT_BUDGET, divergence_factor=1e8)


_PROGRAM_KEYS = ("context", "width", "heads", "max_steps", "tol", "attention_scale", "jacobian_gamma",
                 "embedding_std", "eval_every", "learning_rate", "warmup", "steps")


@functools.lru_cache(maxsize=8)
def _program(key_items: tuple, vocab: int, square: bool):
    """Graph and compiled seed-vmapped programs for one model shape: ``chunk`` (``eval_every``
    training steps), ``evaluate`` (loss and solver statistics on fixed windows) and ``probe``
    (the at-initialisation quantities). Shared by every (ensemble, sqrt(V)) of one shape."""
    from deqlab.lab.experiments.sequence.initialisation import causal_diagonal_blocks
    from deqlab.nn.lm import solver_stats
    from deqlab.solvers import solve
    from deqlab.stability import jacobian_penalty, spectral_radius

    o = dict(key_items)
    # the graph and the parameters' structure only: an abstract model (nnx.eval_shape) makes no array
    # and compiles no initialiser (the seeds' models are initialised in train_seeds)
    template = nnx.eval_shape(lambda: _make_model(o, vocab, "goe" if square else "gaussian", 0.1, nnx.Rngs(0)))
    graphdef, params = nnx.split(template, nnx.Param)
    treedef = jax.tree_util.tree_structure(params)
    tx = _optimizer(o)
    gamma = o["jacobian_gamma"]

    def model_of(leaves):
        return nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, leaves))

    def forward(leaves, tokens):
        model = model_of(leaves)
        x = model.embed(tokens)
        z, sol = model.block.deq(x, return_solution=True)
        logits = model.head(z).astype(jnp.float32)
        return model, x, z, logits, solver_stats(sol)

    def loss_fn(leaves, tokens, targets, key):
        model, x, z, logits, stats = forward(leaves, tokens)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
        total = loss
        if gamma > 0:  # Bai et al. 2021: penalise the map at the (fixed) equilibrium
            cg, cs = nnx.split(model.block.cell)
            penalty = jacobian_penalty(lambda z, s, x: nnx.merge(cg, s)(z, x), jax.lax.stop_gradient(z), cs, x,
                                       key=key, batch_axis=0)
            total = loss + gamma * jnp.mean(penalty) / (z.shape[-2] * z.shape[-1])
        return total, (loss, stats)

    def chunk(leaves, opt_state, key_data, start, batches):
        def step(carry, batch):
            leaves, opt_state, i = carry
            key = jax.random.fold_in(jax.random.wrap_key_data(key_data), i)
            (_, (loss, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                leaves, batch[:, :-1], batch[:, 1:], key)
            updates, opt_state = tx.update(grads, opt_state, leaves)
            leaves = optax.apply_updates(leaves, updates)
            record = jnp.stack([loss, stats["steps_mean"], stats["converged_fraction"], stats["residual_max"]])
            return (leaves, opt_state, i + 1), record

        (leaves, opt_state, _), records = jax.lax.scan(step, (leaves, opt_state, start), batches)
        return leaves, opt_state, records

    def evaluate(leaves, windows):
        def one(_, batch):
            _, _, _, logits, stats = forward(leaves, batch[:, :-1])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()
            return None, jnp.stack([loss, stats["steps_mean"], stats["converged_fraction"]])

        _, out = jax.lax.scan(one, None, windows)
        return jnp.mean(out, axis=0)

    exact = o["context"] * o["width"] <= EXACT_RADIUS_SIZE

    def probe(leaves, key_data, tokens):
        # z: the study's solve (max_steps); z_eq: the same cell solved with INIT_BUDGET steps to INIT_TOL
        model, x, z, _, stats = forward(leaves, tokens)
        cell = model.block.cell
        cg, cs = nnx.split(cell)

        def f(z, x):
            return nnx.merge(cg, cs)(z, x)

        sol = solve(f, jnp.zeros_like(z), x, solver=_init_solver(), batch_axis=0, on_failure="ignore")
        z_eq = sol.value
        _, h = cell.feed_forward_hidden(z_eq, x)
        out = {"budget_converged_fraction": stats["converged_fraction"], "converged": sol.converged,
               "hidden_variance": jnp.mean(jnp.square(h), axis=(-2, -1))}
        if exact:  # eigenvalues of the diagonal blocks, on the host (train_seeds)
            out["blocks"] = causal_diagonal_blocks(cell, z_eq, x)  # the cell itself: width JVPs per sequence
            out["iterate_blocks"] = causal_diagonal_blocks(cell, z, x)
        else:
            key = jax.random.wrap_key_data(key_data)
            out["radius"] = spectral_radius(f, z_eq, x, key=key, steps=RADIUS_STEPS, batch_axis=0)
            out["iterate_radius"] = spectral_radius(f, z, x, key=key, steps=RADIUS_STEPS, batch_axis=0)
        return out

    seeds_axis = (0, 0, 0, None, None)
    return dict(graphdef=graphdef, treedef=treedef, tx=tx,
                chunk=jax.jit(jax.vmap(chunk, in_axes=seeds_axis)),
                evaluate=jax.jit(jax.vmap(evaluate, in_axes=(0, None))),
                probe=jax.jit(jax.vmap(probe, in_axes=(0, 0, None))))


@functools.lru_cache(maxsize=4)
def _corpus(name: str, tokenizer: str, vocab_size: int, context: int) -> dict:
    from deqlab.lab.experiments.sequence.language_model import prepare_corpus

    return prepare_corpus(name, tokenizer=tokenizer, vocab_size=vocab_size, context=context)


def _train_batches(o: dict, windows: np.ndarray, start: int, count: int) -> np.ndarray:
    """Batches of steps ``start .. start + count - 1``; each epoch's order depends on
    (data_seed, epoch) only, so a resumed run sees the batches of an uninterrupted one."""
    per_epoch = len(windows) // o["batch_size"]
    key = jax.random.key(o["data_seed"])
    out, cached = [], {}
    for step in range(start, start + count):
        epoch, index = divmod(step, per_epoch)
        if epoch not in cached:
            cached.clear()
            cached[epoch] = data.lm_batches(windows, o["batch_size"], jax.random.fold_in(key, epoch))
        out.append(cached[epoch][index])
    return np.stack(out)


def _place(mesh, array, axis):
    """``array`` with axis ``axis`` (the batch) split over the mesh's ``"data"`` axis."""
    if mesh is None:
        return jnp.asarray(array)
    from deqlab.nn.lm import shard_batch

    moved = np.moveaxis(np.asarray(array), axis, 0)
    if moved.shape[0] % mesh.shape["data"]:
        return shard_batch(mesh, moved)  # raises the clear "multiple of the number of devices" error
    spec = [None] * np.ndim(array)
    spec[axis] = "data"
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
    return jax.device_put(np.asarray(array), sharding)


def _first_below(curve: np.ndarray, threshold: float) -> int | None:
    below = np.flatnonzero(~(curve >= threshold))  # NaN counts as below
    return int(below[0]) if below.size else None


def _probe_summary(raw: dict) -> dict[str, np.ndarray]:
    """Per seed, from the probe's per-sequence output (seeds, sequences): the radius at the
    equilibria (mean over the sequences the probe's solve converged for; NaN if none), the radius at
    the study's ``max_steps`` iterate (mean over all), the probe's converged fraction, the hidden
    variance at the probe's iterates and the study's converged fraction."""
    converged = np.asarray(raw["converged"], bool)
    if "blocks" in raw:
        def radii(blocks):  # the largest |eigenvalue| over a sequence's blocks; NaN where one is not finite
            b = np.asarray(blocks, np.float64)
            finite = np.all(np.isfinite(b), axis=(-3, -2, -1))
            out = np.full(b.shape[:-3], np.nan)
            if finite.any():
                out[finite] = np.abs(np.linalg.eigvals(b[finite])).max(axis=(-2, -1))
            return out

        radius, iterate = radii(raw["blocks"]), radii(raw["iterate_blocks"])
    else:
        radius, iterate = np.asarray(raw["radius"], np.float64), np.asarray(raw["iterate_radius"], np.float64)
    count = converged.sum(axis=1)
    at_eq = np.where(count > 0, np.sum(np.where(converged, radius, 0.0), axis=1) / np.maximum(count, 1), np.nan)
    return {"spectral_radius": at_eq, "iterate_radius": np.mean(iterate, axis=1),
            "equilibrium_fraction": converged.mean(axis=1),
            "hidden_variance": np.asarray(raw["hidden_variance"], np.float64).mean(axis=1),
            "converged_fraction": np.asarray(raw["budget_converged_fraction"], np.float64)}


def train_seeds(ensemble: str, sqrt_v: float, seeds: Sequence[int], config: dict | None = None, *,
                checkpoint_dir: Any = None, mesh: Any = None, stop_after: int | None = None,
                progress: bool = False) -> dict[str, Any] | None:
    """Train one DEQ-Transformer language model per seed, all seeds in one vmapped program (001 §4.2).

    Args:
        ensemble: law of the feed-forward matrices (:data:`ENSEMBLES`).
        sqrt_v: their scale sqrt(V) >= 0 (001 §4.3; deqlab's ``scale``, module docstring).
        seeds: distinct integers >= 0; seed s sets the initialisation (the batches are shared).
        config: the options (:func:`study_config`; default: the current scale's).
        checkpoint_dir: orbax checkpoints after an evaluation, once :data:`CHECKPOINT_SECONDS` have
            passed since the last one (or since the training loop began; never after the last
            chunk, whose result the caller stores); a rerun resumes from the newest.
        mesh: a :func:`deqlab.nn.data_mesh`; the batch is sharded over it, parameters replicated.
        stop_after: stop after this many evaluation chunks of this call, with a checkpoint and no
            result (returns None): a simulated interruption (when it falls before the last chunk;
            otherwise the call finishes normally).
        progress: tqdm bar over the chunks.

    Returns:
        Lists with one entry per seed: ``loss_curve``, ``steps_curve``, ``converged_curve``,
        ``residual_curve`` (per logged step; blocks of ``log_every`` steps averaged),
        ``test_loss_curve`` and ``test_converged_curve`` at ``eval_steps``, ``test_loss`` and
        ``test_perplexity`` (final, on the test split), ``diverged`` (non-finite final training or
        test loss), ``solver_stopped_step`` (first step after the warm-up whose converged fraction fell
        below ``failure_threshold``; None if never), ``solver_failed`` (below it on average over the last
        tenth of training), ``init_spectral_radius``, ``init_iterate_radius``,
        ``init_equilibrium_fraction``, ``init_hidden_variance``, ``init_converged_fraction`` (module
        docstring, "At initialisation"); and ``seeds``, ``eval_steps``, ``vocabulary``, ``seconds``
        (this call's wall time), ``resumed_from`` (the step a checkpoint gave, 0 if none).
    """
    from tqdm import tqdm

    where = "ensemble_study.train_seeds"
    checks.choice(ensemble, "ensemble", ENSEMBLES, where)
    sqrt_v = checks.number(sqrt_v, "sqrt_v", where, lower=0.0)
    seeds = checks.seed_list(seeds, "seeds", where)
    o = study_config() if config is None else _check(config, where)
    if stop_after is not None:
        stop_after = checks.positive_int(stop_after, "stop_after", where)
    corpus = _corpus(o["corpus"], o["tokenizer"], o["vocab_size"], o["context"])
    train_windows = corpus["train"]
    if len(train_windows) < o["batch_size"]:
        raise checks.fail("batch_size", f"at most the number of training windows ({len(train_windows)})",
                          o["batch_size"], where)
    n_eval = o["eval_batches"] * o["batch_size"]
    test = corpus["test"]
    if len(test) < n_eval:
        raise checks.fail("eval_batches", f"at most {len(test) // o['batch_size']} (test windows / batch_size)",
                          o["eval_batches"], where)
    test_windows = test[:n_eval].reshape(o["eval_batches"], o["batch_size"], -1)
    vocab = int(corpus["tokenizer"].vocab_size)
    program = _program(tuple((k, o[k]) for k in _PROGRAM_KEYS), vocab, ensemble == "goe")
    treedef, tx = program["treedef"], program["tx"]

    keys = jnp.stack([jax.random.key_data(jax.random.key(s)) for s in seeds])

    def init(key_data):
        model = _make_model(o, vocab, ensemble, sqrt_v, nnx.Rngs(jax.random.wrap_key_data(key_data)))
        return jax.tree_util.tree_leaves(nnx.split(model, nnx.Param)[1])

    leaves = jax.vmap(init)(keys)
    if len(leaves) != treedef.num_leaves:
        raise AssertionError("the model's parameters do not match the compiled program's")
    opt_state = jax.vmap(tx.init)(leaves)
    test_placed = _place(mesh, test_windows, 1)
    if mesh is not None:  # parameters and optimiser state replicated, batches sharded
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        leaves, opt_state = jax.device_put((leaves, opt_state), replicated)
    probe_keys = jax.vmap(lambda k: jax.random.key_data(jax.random.fold_in(jax.random.wrap_key_data(k), 7)))(keys)
    init = _probe_summary(jax.device_get(program["probe"](leaves, probe_keys, test_placed[0])))

    steps, every, n_log = o["steps"], o["eval_every"], o["steps"] // o["log_every"]
    n_chunks = steps // every
    history = {"train": np.full((len(seeds), n_log, 4), np.nan, np.float32),
               "test": np.full((len(seeds), n_chunks + 1, 3), np.nan, np.float32)}
    history["test"][:, 0] = np.asarray(program["evaluate"](leaves, test_placed))
    start_chunk, resumed_from = 0, 0
    ckpt = None
    if checkpoint_dir is not None:
        from deqlab.lab.experiments.sweep import Checkpoints

        ckpt = Checkpoints(checkpoint_dir)
        state = {"leaves": leaves, "opt_state": opt_state, "train": history["train"], "test": history["test"]}
        restored, start_chunk = ckpt.resume(state)
        if start_chunk:
            leaves, opt_state = restored["leaves"], restored["opt_state"]
            if mesh is not None:
                leaves, opt_state = jax.device_put((leaves, opt_state), replicated)
            history = {"train": np.asarray(restored["train"]), "test": np.asarray(restored["test"])}
            resumed_from = start_chunk * every
    began = time.perf_counter()
    saved_at = began
    done_here = 0
    try:
        for c in tqdm(range(start_chunk, n_chunks), desc=f"{ensemble} {sqrt_v:g}", disable=not progress,
                      leave=False):
            batches = _place(mesh, _train_batches(o, train_windows, c * every, every), 1)
            leaves, opt_state, records = program["chunk"](leaves, opt_state, keys, jnp.int32(c * every), batches)
            records = np.asarray(records)  # (seeds, every, 4)
            blocks = records.reshape(len(seeds), every // o["log_every"], o["log_every"], 4).mean(axis=2)
            first = c * every // o["log_every"]
            history["train"][:, first:first + blocks.shape[1]] = blocks
            history["test"][:, c + 1] = np.asarray(program["evaluate"](leaves, test_placed))
            done_here += 1
            interrupted = stop_after is not None and done_here >= stop_after and c + 1 < n_chunks
            due = time.perf_counter() - saved_at >= CHECKPOINT_SECONDS and c + 1 < n_chunks
            if ckpt is not None and (interrupted or due):
                ckpt.save(c, {"leaves": leaves, "opt_state": opt_state, **history})
                saved_at = time.perf_counter()
            if interrupted:
                return None
    finally:
        if ckpt is not None:
            ckpt.close()
    train, test_h = history["train"], history["test"]
    loss, solver_steps, converged, residual = (train[..., i] for i in range(4))
    final = test_h[:, -1, 0]
    tail = max(1, n_log // 10)
    threshold = o["failure_threshold"]
    # counted after the warm-up: at initialisation some solves need more than max_steps (that is
    # init_converged_fraction); "stops converging" is about training taking it there
    after = -(-o["warmup"] // o["log_every"])
    stopped = [_first_below(converged[s, after:], threshold) for s in range(len(seeds))]
    stopped = [None if s is None else s + after for s in stopped]
    return {
        "seeds": list(seeds),
        "eval_steps": [c * every for c in range(n_chunks + 1)],
        "loss_curve": loss.tolist(),
        "steps_curve": solver_steps.tolist(),
        "converged_curve": converged.tolist(),
        "residual_curve": residual.tolist(),
        "test_loss_curve": test_h[..., 0].tolist(),
        "test_converged_curve": test_h[..., 2].tolist(),
        "test_loss": final.tolist(),
        "test_perplexity": np.exp(final.astype(np.float64)).tolist(),
        "diverged": (~np.isfinite(final) | ~np.isfinite(loss[:, -1])).tolist(),
        "solver_stopped_step": [None if s is None else s * o["log_every"] for s in stopped],
        "solver_failed": (~(np.mean(converged[:, -tail:], axis=1) >= threshold)).tolist(),
        **{f"init_{k}": v.tolist() for k, v in init.items()},
        "vocabulary": vocab,
        "seconds": time.perf_counter() - began,
        "resumed_from": resumed_from,
    }


_PER_SEED = ("loss_curve", "steps_curve", "converged_curve", "residual_curve", "test_loss_curve",
             "test_converged_curve", "test_loss", "test_perplexity", "diverged", "solver_stopped_step",
             "solver_failed", "init_spectral_radius", "init_iterate_radius", "init_equilibrium_fraction",
             "init_hidden_variance", "init_converged_fraction")


def run_study(directory: Any, config: dict | None = None, *, ensembles: Sequence[str] = ENSEMBLES,
              sqrt_vs: Sequence[float] = SQRT_V, seeds: Sequence[int] = range(10), mesh: Any = None,
              progress: bool = True) -> list[dict[str, Any]]:
    """001 §4.3's grid through :func:`deqlab.lab.experiments.sweep.run_sweep`: one stored result per
    (ensemble, sqrt(V)) with all its seeds (:func:`train_seeds`), orbax checkpoints within a
    configuration; finished configurations are read back, not retrained.

    Returns:
        One row per configuration: ``ensemble``, ``sqrt_v``, ``seeds``, ``options`` and the
        :func:`train_seeds` result under ``result`` (:func:`per_seed_rows` flattens it).
    """
    from deqlab.lab.experiments.sweep import run_sweep

    where = "ensemble_study.run_study"
    o = study_config() if config is None else _check(config, where)
    ensembles = [checks.choice(e, "ensembles", ENSEMBLES, where) for e in ensembles]
    sqrt_vs = [checks.number(v, "sqrt_vs", where, lower=0.0) for v in sqrt_vs]
    seeds = checks.seed_list(list(seeds), "seeds", where)
    if not ensembles or not sqrt_vs:
        raise checks.fail("ensembles" if not ensembles else "sqrt_vs", "a non-empty list", [], where)
    configs = [{"ensemble": e, "sqrt_v": v, "seeds": seeds, "options": o} for e in ensembles for v in sqrt_vs]

    def unit(config, checkpoint_dir):
        return {"result": train_seeds(config["ensemble"], config["sqrt_v"], config["seeds"], config["options"],
                                      checkpoint_dir=checkpoint_dir, mesh=mesh)}

    return run_sweep(unit, configs, directory, checkpoints=True, progress=progress,
                     description="ensemble x sqrt(V)")


def per_seed_rows(units: Sequence[dict]) -> list[dict[str, Any]]:
    """The rows of :func:`run_study`, one per (ensemble, sqrt(V), seed), with the per-seed entries."""
    rows = []
    for u in units:
        r = u["result"]
        for i, seed in enumerate(r["seeds"]):
            rows.append({"ensemble": u["ensemble"], "sqrt_v": u["sqrt_v"], "seed": seed, "eval_steps": r["eval_steps"],
                         **{k: r[k][i] for k in _PER_SEED}})
    return rows


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """001 Table 1 from :func:`per_seed_rows`: per (ensemble, sqrt(V)), in first-seen order, ``n``
    runs, ``min_perplexity`` and ``mean_perplexity`` of the final test perplexity over the runs
    with a finite loss (the paper's Min and Ave), ``diverged_fraction``, ``solver_failed_fraction``,
    ``solver_stopped_fraction`` (runs whose converged fraction fell below the threshold at some
    step), and the paper's ``paper_min`` / ``paper_mean``."""
    groups: dict[tuple, list] = {}
    for row in rows:
        groups.setdefault((row["ensemble"], row["sqrt_v"]), []).append(row)
    out = []
    for (ensemble, sqrt_v), group in groups.items():
        ppl = np.array([r["test_perplexity"] for r in group], np.float64)
        finite = ppl[np.isfinite(ppl)]
        paper = PAPER_TABLE.get((ensemble, float(sqrt_v)), (math.nan, math.nan))
        out.append({
            "ensemble": ensemble, "sqrt_v": sqrt_v, "n": len(group),
            "min_perplexity": float(finite.min()) if finite.size else math.nan,
            "mean_perplexity": float(finite.mean()) if finite.size else math.nan,
            "diverged_fraction": float(np.mean([r["diverged"] for r in group])),
            "solver_failed_fraction": float(np.mean([r["solver_failed"] for r in group])),
            "solver_stopped_fraction": float(np.mean([r["solver_stopped_step"] is not None for r in group])),
            "paper_min": paper[0], "paper_mean": paper[1],
        })
    return out


def within_seed_spearman(x: Any, y: Any) -> list[float]:
    """Spearman's rank correlation of ``x`` and ``y`` within each seed (the seed is the unit of a
    test over seeds; chapter 5 page 6's radius claims), over the seeds where both vary.

    Args:
        x, y: arrays ``(seeds, configurations)`` of finite numbers, of the same shape.

    Returns:
        One correlation per seed in which neither ``x`` nor ``y`` is constant (a constant row has
        no ranks to correlate), in seed order.

    Raises:
        ValueError: ``x`` or ``y`` is not a 2-D array of finite numbers, or their shapes differ.

    Example:
        >>> within_seed_spearman([[1, 2, 3], [1, 1, 1]], [[3, 2, 1], [1, 2, 3]])  # the second seed is constant
        [-1.0]
    """
    from scipy import stats as scipy_stats

    where = "ensemble_study.within_seed_spearman"
    arrays = []
    for name, value in (("x", x), ("y", y)):
        try:
            a = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            raise checks.fail(name, "a 2-D array (seeds, configurations) of finite numbers", value, where) from None
        if a.ndim != 2 or not np.all(np.isfinite(a)):
            raise checks.fail(name, "a 2-D array (seeds, configurations) of finite numbers", a.shape, where)
        arrays.append(a)
    if arrays[0].shape != arrays[1].shape:
        raise checks.fail("y", f"the shape of x {arrays[0].shape}", arrays[1].shape, where)
    return [float(scipy_stats.spearmanr(a, b).statistic) for a, b in zip(*arrays)
            if np.ptp(a) > 0 and np.ptp(b) > 0]


def unigram_loss(config: dict | None = None) -> float:
    """The test loss of the unigram model on the study's test windows, in nats per token.

    The unigram model predicts every piece by its frequency in the training split (add-half
    smoothing) and ignores the context: the best context-free predictor the training data give.
    It is fixed by the corpus and the tokenizer before any run, so :func:`check_claims` can use it
    as the a-priori meaning of 001's "low test loss" (``low_loss``): a run that does not end below
    it has learned nothing the pieces' frequencies do not give. It is evaluated on the windows
    :func:`train_seeds` evaluates on (the first ``eval_batches * batch_size`` test windows).

    Args:
        config: the study's options (:func:`study_config`; default: the current scale's).

    Returns:
        The mean negative log-probability of the test targets under the unigram model.

    Raises:
        ValueError: a config :func:`study_config` rejects, or ``eval_batches`` asking for more test
            windows than the corpus has.

    Example:
        >>> loss = unigram_loss(study_config("quick"))  # doctest: +SKIP
        >>> loss < math.log(128)  # below the uniform guess over the 128 pieces    # doctest: +SKIP
        True
    """
    where = "ensemble_study.unigram_loss"
    o = study_config() if config is None else _check(config, where)
    corpus = _corpus(o["corpus"], o["tokenizer"], o["vocab_size"], o["context"])
    n_eval = o["eval_batches"] * o["batch_size"]
    test = corpus["test"]
    if len(test) < n_eval:
        raise checks.fail("eval_batches", f"at most {len(test) // o['batch_size']} (test windows / batch_size)",
                          o["eval_batches"], where)
    vocab = int(corpus["tokenizer"].vocab_size)
    counts = np.bincount(np.asarray(corpus["train"])[:, 1:].ravel(), minlength=vocab) + 0.5
    targets = np.asarray(test[:n_eval])[:, 1:].ravel()
    return float(-np.mean(np.log(counts[targets] / counts.sum())))


PLATEAU_TOLERANCE = 0.05
"""Default tolerance of :func:`plateau`: the last third of training may lower the test loss by at
most 5% of the run's total improvement, and the run may end at most 5% of it above its best."""


def plateau(test_loss_curve: Sequence[float], eval_steps: Sequence[int],
            tolerance: float = PLATEAU_TOLERANCE) -> dict[str, Any]:
    """Whether one run's test-loss curve reached its plateau: what 001 §4.3 calls "converge".

    001 §4.3 reads its Figure 6 (test loss against training step, 10 seeds per ensemble): for the
    random family "many trajectories converge slowly to the equilibrium value ... and some don't
    converge at all", the orthogonal family "has trajectories which don't converge", and "All
    families from the GOE ensemble converge". The trajectories are the test-loss curves, and
    converging is levelling off at the value they settle to, not the Broyden solve of the DEQ
    (which :func:`train_seeds` records separately). The criterion, on the curve ``L`` at the
    evaluation steps ``t_0 < ... < t_end``:

    - every value is finite, and the run learned: ``D = L(t_0) - min L > 0``;
    - it has levelled off: the least-squares slope of ``L`` over the evaluations in the last
      third of training (``t >= t_end - (t_end - t_0) / 3``), times the length of that third, is
      a decrease of at most ``tolerance * D``;
    - it ended on its plateau, not above it: ``L(t_end) - min L <= tolerance * D``.

    The tolerance is relative to the run's own improvement ``D`` so that it means the same at
    the quick and the full scale. It is a tolerance and not a significance test: the test
    windows are fixed, so the curve carries no evaluation noise to test a slope against, and at
    the quick scale the last third holds 3 evaluations (1 degree of freedom for a slope's error).

    Args:
        test_loss_curve: the test loss at ``eval_steps`` (:func:`train_seeds`' ``test_loss_curve``).
        eval_steps: increasing training steps, at least 2 of them in the last third.
        tolerance: the fraction of ``D`` allowed, in (0, 1].

    Returns:
        dict with ``reached`` (bool), ``total_drop`` (``D``), ``late_drop`` (the fitted decrease
        over the last third) and ``rise`` (``L(t_end) - min L``); NaN where the curve is not finite.

    Raises:
        ValueError: naming ``test_loss_curve`` / ``eval_steps`` (lengths differ, steps not
            increasing or fewer than 2 evaluations in the last third) or ``tolerance``.

    Example:
        >>> steps = [0, 16, 32, 48, 64, 80, 96, 112, 128]
        >>> plateau([4.8, 4.0, 3.8, 3.7, 3.65, 3.62, 3.61, 3.60, 3.60], steps)["reached"]
        True
        >>> plateau([4.8, 4.5, 4.3, 4.1, 3.95, 3.8, 3.7, 3.6, 3.5], steps)["reached"]  # still falling
        False
    """
    where = "ensemble_study.plateau"
    curve = np.asarray(test_loss_curve, np.float64)
    t = np.asarray(eval_steps, np.float64)
    tolerance = checks.unit_interval(tolerance, "tolerance", where)
    if curve.ndim != 1 or t.shape != curve.shape:
        raise checks.fail("test_loss_curve", f"a 1-d curve with one value per eval step ({t.size})",
                          np.shape(curve), where)
    if t.size < 2 or not np.all(np.diff(t) > 0):
        raise checks.fail("eval_steps", "increasing steps, at least 2", list(eval_steps), where)
    third = (t[-1] - t[0]) / 3
    late = t >= t[-1] - third
    if late.sum() < 2:
        raise checks.fail("eval_steps", "at least 2 evaluations in the last third of training", list(eval_steps), where)
    if not np.all(np.isfinite(curve)):
        return {"reached": False, "total_drop": math.nan, "late_drop": math.nan, "rise": math.nan}
    best = float(curve.min())
    total = float(curve[0] - best)
    slope = float(np.polyfit(t[late], curve[late], 1)[0])
    late_drop, rise = -slope * third, float(curve[-1] - best)
    reached = total > 0 and late_drop <= tolerance * total and rise <= tolerance * total
    return {"reached": bool(reached), "total_drop": total, "late_drop": late_drop, "rise": rise}


SCOPE = ("over seeds of the initialisation (the unit), conditional on the one batch order and the fixed test "
         "windows that every seed shares (data_seed), at the configuration's sizes (corpus, vocabulary, width, "
         "steps), on 003's released layer with 001's initialisations of the dense layers; configurations "
         "compared within seed")
"""What the claims' inference covers (:func:`check_claims`): what generalises is the draw of the
initialisation (the seed); a statement about other batch orders, test sets, sizes or layers would need
a study that varies them."""


_ROW_KEYS = ("ensemble", "sqrt_v", "seed", "test_perplexity", "test_loss_curve", "eval_steps", "diverged",
             "solver_failed")
"""The keys of :func:`per_seed_rows` that :func:`check_claims` reads."""


def _checked_rows(rows: Any, where: str) -> list[dict[str, Any]]:
    """``rows`` as a list of dicts with :data:`_ROW_KEYS`, known ensembles and real sqrt(V) and perplexities."""
    if rows is None or isinstance(rows, (str, bytes, dict)):
        raise checks.fail("rows", "a list of per_seed_rows dicts", rows, where)
    try:
        rows = list(rows)
    except TypeError:
        raise checks.fail("rows", "a list of per_seed_rows dicts", rows, where) from None
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise checks.fail("rows", "a list of per_seed_rows dicts", f"a {type(r).__name__} at index {i}", where)
        missing = [k for k in _ROW_KEYS if k not in r]
        if missing:
            raise checks.fail("rows", f"per_seed_rows dicts with the keys {list(_ROW_KEYS)}",
                              f"row {i} without {missing}", where)
        if r["ensemble"] not in ENSEMBLES:
            raise checks.fail("rows", f"rows whose ensemble is one of {ENSEMBLES}",
                              f"{r['ensemble']!r} at row {i}", where)
        for key in ("sqrt_v", "test_perplexity"):
            value = r[key]
            if isinstance(value, (str, bytes)) or np.ndim(value) != 0 or np.asarray(value).dtype.kind not in "iuf":
                raise checks.fail("rows", f"rows whose {key} is a real number", f"{value!r} at row {i}", where)
        if not math.isfinite(r["sqrt_v"]):
            raise checks.fail("rows", "rows whose sqrt_v is finite", f"{r['sqrt_v']!r} at row {i}", where)
    return rows


def check_claims(rows: Sequence[dict[str, Any]], *, alpha: float = 0.05, resamples: int = 4999,
                 key_or_seed: Any = 0, plateau_tolerance: float = PLATEAU_TOLERANCE,
                 low_loss: float | None = None,
                 page_claims: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """The claims of 001 §4.3 (with Table 1's and Fig. 6's captions), tested on :func:`per_seed_rows`
    with the book's verdict system (:func:`deqlab.lab.stats.claims_verdicts`).

    **The unit is the seed.** Seed s draws the same attention, embedding and head in every
    configuration and all seeds see the same batches and test windows (module docstring), so the 9
    runs of a seed are not independent: a study of 10 seeds has 10 independent units, not 90.
    Every test is over seeds and paired within seed, and the inference is conditional on the
    shared batch order and test windows (:data:`SCOPE`).

    **Perplexity claims** are tested by Monte Carlo permutation tests
    (:func:`deqlab.lab.stats.paired_permutation_test`, ``resamples`` random relabellings, valid
    p-values never below ``1 / (resamples + 1)``; not an enumeration): within each seed, the labels of the
    configurations a claim compares are exchanged (the ensembles at one sqrt(V); for the ratio
    claim, the ensembles within each sqrt(V)), under the sharp null that they make no difference.
    Means and minima are over the runs with a finite perplexity (as :func:`summarize`). A claim
    about means also gets a studentised bootstrap interval over seeds
    (:func:`deqlab.lab.stats.studentized_interval`, per claim at ``1 - alpha``); for "GOE has the
    best mean" the margin, the smaller of the two rival means minus GOE's, is not a smooth function
    of the data where the two rival means tie, and there the interval is not valid (its ``interval``
    says so). A claim about the best seed (a minimum over seeds) gets none, as no bootstrap interval
    of a minimum is valid, and its verdict rests on the permutation test alone.

    **Claims about trajectories**, each at the sqrt(V) where 001 makes it. 001's "converge" in its
    sqrt(V) = 0.1 paragraph is the test-loss curve reaching its plateau (:func:`plateau`), a
    criterion of levelling off, not of level: a run stuck at a high loss meets it. "All families
    from the GOE ensemble converge" is said of sqrt(V) = 0.1 (the smallest sqrt(V) of ``rows``
    here), and is universal: one counterexample contradicts it (no error probability: outside the
    family), and without one it is "not resolved" (``n`` seeds cannot confirm a universal claim;
    the exact Clopper-Pearson interval says how low a per-seed rate they cannot exclude). The same
    reading at every sqrt(V), stronger than 001's, is kept as a second universal claim. 001's
    sqrt(V) = 1 paragraph says that random "fails to converge to low test loss very often compared
    to the orthogonal and GOE ensembles": a statement about the *level*, tested at the largest
    sqrt(V) with a criterion fixed before the runs, a final test loss below ``low_loss`` (the
    caller's; the study's page passes the loss of the unigram model, :func:`unigram_loss`); without
    ``low_loss`` that claim is not testable. "Random misses its plateau more often" pooled over
    sqrt(V) (Table 1's caption, "less stable learning") and "random diverges (a non-finite loss)
    more often" (Fig. 6's caption, pooled too) complete the set. Each "more often" claim is two
    exact one-sided sign tests over seeds (:func:`deqlab.lab.stats.sign_test`) of a seed's count
    of such runs, random minus the other ensemble: the claim's p-value is the larger of the two
    (intersection-union), the opposite direction's the smaller doubled (Bonferroni over the two);
    a comparison in which every seed ties has p-value 1 both ways, and with ties in both the claim
    is "not testable at this scale".

    **Family-wise control.** Every tested claim of 001 forms one family, with Holm's procedure at
    ``alpha`` (:func:`deqlab.lab.stats.claims_verdicts`): "holds", "contradicted", "not resolved",
    or "not testable at this scale" (sign tests with no seed that differs). The Broyden
    diagnostics (not claims of 001) and the caller's ``page_claims`` form a second family, with the
    same rule: they ask what the solver and the study do on this layer, not whether 001 replicates,
    and the replication's verdicts should not depend on how many such questions are asked.

    Args:
        rows: :func:`per_seed_rows` (``ensemble``, ``sqrt_v``, ``seed``, ``test_perplexity``,
            ``test_loss_curve``, ``eval_steps``, ``diverged``, ``solver_failed``), runs of every
            ensemble at every sqrt(V); the seeds present in all configurations are used.
        alpha: family-wise level of the verdicts and 1 - level of the intervals, in (0, 1).
        resamples: permutation relabellings and bootstrap resamples, >= 99.
        key_or_seed: seed of the resampling (the verdicts are a deterministic function of it).
        plateau_tolerance: :func:`plateau`'s tolerance.
        low_loss: the final test loss (nats per token) below which a run counts as reaching a low
            test loss, fixed before looking at the runs (e.g. :func:`unigram_loss`); None: the
            sqrt(V) = 1 "low test loss" claim is not testable.
        page_claims: claims of the caller's own (not 001's), already tested over seeds: dicts with a
            ``claim`` and, as :func:`deqlab.lab.stats.claims_verdicts` takes them, ``p_for`` and
            ``p_against``, or ``testable=False`` with a ``reason``, or a fixed ``verdict``; other
            keys (``estimate``, ``lo``, ``hi``, ``measure``, ``method``, ``interval``, ``source``)
            are kept, missing ones filled (NaN or ""). They get ``kind`` ``"page"`` and join the
            second family, after the diagnostics.

    Returns:
        One dict per claim: ``claim`` (made checkable), ``source`` (001's words), ``kind``
        (``"001"``, ``"diagnostic"`` or ``"page"``), ``method``, ``measure`` (what ``estimate`` is; positive in
        the claim's direction, or, for the universal claim, a share of seeds to compare with 1),
        ``estimate``, ``lo`` and ``hi`` (the interval; NaN where none is valid), ``interval`` (what
        the interval is, or why there is none), ``p_for`` / ``p_against`` (one-sided, NaN for the
        universal claim), ``p_adjusted`` (Holm), ``family_size``, ``n_seeds``, ``detail`` (counts
        behind the exact tests), ``scope`` (:data:`SCOPE`), ``verdict`` and ``holds``.

    Raises:
        ValueError: naming ``rows`` when it is not a list of dicts, a row lacks a key (the list
            above), has an unknown ensemble, a sqrt(V) or a perplexity that is not a real number, or a
            curve :func:`plateau` rejects, when an ensemble or a sqrt(V) is missing, a seed repeats in
            a configuration or fewer than 3 seeds are common to all; naming ``alpha``, ``resamples``,
            ``key_or_seed``, ``plateau_tolerance`` or ``low_loss`` when out of range; naming ``page_claims`` when
            it is not a sequence of dicts each with a string ``claim`` and, as
            :func:`deqlab.lab.stats.claims_verdicts` takes them, p-values in [0, 1],
            ``testable=False`` or a known verdict.

    Example:
        >>> claims = check_claims(per_seed_rows(run_study(directory)))        # doctest: +SKIP
        >>> [(c["claim"], c["verdict"]) for c in claims if c["kind"] == "001"]  # doctest: +SKIP
    """
    from deqlab.lab import stats

    where = "ensemble_study.check_claims"
    alpha = checks.number(alpha, "alpha", where, lower=0.0, upper=1.0, lower_open=True, upper_open=True)
    resamples = checks.integer(resamples, "resamples", where, minimum=99)
    plateau_tolerance = checks.unit_interval(plateau_tolerance, "plateau_tolerance", where)
    if low_loss is not None:
        low_loss = checks.positive_number(low_loss, "low_loss", where)
    page_claims = stats._claims_list(page_claims, "page_claims", where)
    for i, c in enumerate(page_claims):
        stats._claim_checked(c, i, "page_claims", where)
        if not isinstance(c.get("claim"), str):
            raise checks.fail("page_claims", "a sequence of dicts, each with a 'claim' (a string)",
                              f"{c.get('claim')!r} at index {i}", where)
    rows = _checked_rows(rows, where)
    generator = stats._generator(key_or_seed, where)
    by_cell: dict[tuple, dict] = {}
    for r in rows:
        cell = by_cell.setdefault((r["ensemble"], float(r["sqrt_v"])), {})
        if r["seed"] in cell:
            raise checks.fail("rows", "one run per (ensemble, sqrt(V), seed)",
                              f"seed {r['seed']} twice at {r['ensemble']}, {r['sqrt_v']}", where)
        if "test_loss_curve" not in r or "eval_steps" not in r:
            raise checks.fail("rows", "per_seed_rows with test_loss_curve and eval_steps", sorted(r), where)
        cell[r["seed"]] = r
    scales = sorted({k[1] for k in by_cell})
    missing = {(e, v) for e in ENSEMBLES for v in scales} - set(by_cell)
    if missing or not scales:
        raise checks.fail("rows", f"runs of every ensemble {ENSEMBLES} at every sqrt(V)", sorted(missing), where)
    seeds = sorted(set.intersection(*(set(c) for c in by_cell.values())))
    if len(seeds) < 3:
        raise checks.fail("rows", "at least 3 seeds run in every configuration", seeds, where)
    configs = [(e, v) for e in ENSEMBLES for v in scales]
    col = {c: j for j, c in enumerate(configs)}
    n = len(seeds)
    table = np.array([[by_cell[c][s]["test_perplexity"] for c in configs] for s in seeds], np.float64)
    table[~np.isfinite(table)] = np.nan  # left out of means and minima, as in summarize
    def reached(c, s):
        try:
            return plateau(by_cell[c][s]["test_loss_curve"], by_cell[c][s]["eval_steps"], plateau_tolerance)["reached"]
        except ValueError as error:
            raise checks.fail("rows", "per_seed_rows whose test_loss_curve and eval_steps plateau() accepts",
                              f"at ({c[0]!r}, {c[1]:g}, seed {s!r}): {error}", where) from None

    flags = {
        "off_plateau": np.array([[not reached(c, s) for c in configs] for s in seeds]),
        "diverged": np.array([[bool(by_cell[c][s]["diverged"]) for c in configs] for s in seeds]),
        "unstable": np.array([[bool(by_cell[c][s]["diverged"] or by_cell[c][s]["solver_failed"]) for c in configs]
                              for s in seeds]),
    }
    if low_loss is not None:  # not below low_loss (a non-finite loss included): no low test loss
        flags["high_loss"] = ~(np.log(table) < low_loss)
    rng = np.random.default_rng(generator.integers(2**63))

    def mean(x, e, v):
        return np.nanmean(x[..., col[(e, v)]], axis=-1)

    def low(x, e, v):
        return np.nanmin(x[..., col[(e, v)]], axis=-1)

    def at_scale(v):  # the ensembles' columns at one sqrt(V): the labels a claim at v exchanges
        return [[col[(e, v)] for e in ENSEMBLES]]

    big = scales[-1]
    # (claim, source, measure, statistic of a (b, seeds, configs) batch, permutation groups, interval?)
    margins = []
    for v in scales:
        margins.append((f"GOE has the best mean perplexity at sqrt(V) = {v:g}",
                        '"the average test loss is best for the GOE across all sqrt(V)" (§4.3)',
                        "best other ensemble's mean perplexity minus GOE's",
                        lambda x, v=v: np.minimum(mean(x, "gaussian", v), mean(x, "orthogonal", v)) - mean(x, "goe", v),
                        at_scale(v), "; not valid near a tie of the two rival means (the margin is a minimum)"))
    margins.append((f"orthogonal has a better mean perplexity than random at sqrt(V) = {big:g}",
                    '"orthogonal is better than random at large sqrt(V)" (§4.3)',
                    "random's mean perplexity minus orthogonal's",
                    lambda x: mean(x, "gaussian", big) - mean(x, "orthogonal", big),
                    [[col[("gaussian", big)], col[("orthogonal", big)]]], ""))
    for v in scales:
        margins.append((f"GOE has the worst best seed at sqrt(V) = {v:g}",
                        '"comparing the best seeds from each family, the GOE performs worst" (§4.3)',
                        "GOE's minimum perplexity minus the larger of the other two minima",
                        lambda x, v=v: low(x, "goe", v) - np.maximum(low(x, "gaussian", v), low(x, "orthogonal", v)),
                        at_scale(v), None))
    for v in scales:
        margins.append((f"random has the best seed at sqrt(V) = {v:g}",
                        '"Random initialization has best performing models" (Table 1 caption)',
                        "the smaller of the other two minimum perplexities minus random's",
                        lambda x, v=v: np.minimum(low(x, "orthogonal", v), low(x, "goe", v)) - low(x, "gaussian", v),
                        at_scale(v), None))

    def ratio(x, e):
        return np.mean([mean(x, e, v) / low(x, e, v) for v in scales], axis=0)

    margins.append(("random has the largest ratio of mean to minimum perplexity",
                    '"The discrepancy between the average and minimum" read as unstable learning (§4.3)',
                    "random's mean-to-minimum ratio (averaged over sqrt(V)) minus the larger of the others'",
                    lambda x: ratio(x, "gaussian") - np.maximum(ratio(x, "orthogonal"), ratio(x, "goe")),
                    [g for v in scales for g in at_scale(v)], None))

    tested = []
    for claim, source, measure, statistic, groups, interval in margins:
        test = stats.paired_permutation_test(table, statistic, groups=groups, resamples=resamples, key_or_seed=rng)
        if interval is not None:
            # the statistic is a function of the configurations' means: its jackknife in O(seeds) per resample
            lo, hi = stats.studentized_interval(table, statistic, confidence=1 - alpha, resamples=resamples,
                                                key_or_seed=rng, standard_error=stats.jackknife_se_of_means(statistic))
            what = f"studentised bootstrap over seeds, {100 * (1 - alpha):g} % per claim{interval}"
        else:
            lo, hi = math.nan, math.nan
            what = "none: a bootstrap interval of a minimum over seeds is not valid"
        tested.append({"claim": claim, "source": source, "kind": "001", "measure": measure,
                       "method": f"permutation test within seed ({resamples} random relabellings, Monte Carlo)",
                       "estimate": test["estimate"], "lo": lo, "hi": hi, "interval": what,
                       "p_for": test["p_greater"], "p_against": test["p_less"], "n_seeds": n, "detail": ""})

    def every_goe_run(flag, claim, source, kind, what, at=scales):
        goe = flags[flag][:, [col[("goe", v)] for v in at]]
        good = int(np.sum(~goe.any(axis=1)))
        lo, hi = stats.clopper_pearson(good, n, 1 - alpha)
        return {"claim": claim, "source": source, "kind": kind, "measure": "share of seeds whose GOE runs all " + what,
                "method": "universal claim: a counterexample contradicts it", "estimate": good / n, "lo": lo, "hi": hi,
                "interval": f"exact (Clopper-Pearson) {100 * (1 - alpha):g} % for the per-seed rate",
                "p_for": math.nan, "p_against": math.nan, "n_seeds": n,
                "detail": f"{int(goe.sum())} of {goe.size} GOE runs do not; {n - good} of {n} seeds affected",
                "verdict": "contradicted" if good < n else "not resolved"}

    def random_more_often(flag, claim, source, kind, what, at=scales):
        count = {e: flags[flag][:, [col[(e, v)] for v in at]].sum(axis=1) for e in ENSEMBLES}
        tests = {e: stats.sign_test(count["gaussian"] - count[e], 1 - alpha) for e in ("orthogonal", "goe")}
        detail = "; ".join(f"vs {e}: random {what} in more runs in {tests[e]['positive']} seeds, fewer in "
                           f"{tests[e]['negative']}, as many in {tests[e]['ties']} (runs: {int(count['gaussian'].sum())}"
                           f" random, {int(count[e].sum())} {e})" for e in tests)
        binding = min(tests, key=lambda e: tests[e]["lo"])  # the comparison nearest to failing
        t = tests[binding]
        out = {"claim": claim, "source": source, "kind": kind,
               "method": "exact one-sided sign tests over seeds, both needed (intersection-union)",
               "measure": f"net share of seeds where random {what} in more runs (vs {binding}, the weaker comparison)",
               "estimate": t["estimate"], "lo": t["lo"], "hi": t["hi"],
               "interval": f"exact (Clopper-Pearson) {100 * (1 - alpha):g} % for the net share", "n_seeds": n,
               "detail": detail}
        if all(tests[e]["positive"] + tests[e]["negative"] == 0 for e in tests):
            out.update(testable=False, p_for=math.nan, p_against=math.nan,
                       reason="no seed has a different count from random's in either comparison: nothing to test")
            return out
        from scipy.stats import binomtest

        def one_sided(t, side):  # a comparison in which every seed ties carries no evidence: p = 1
            m = t["positive"] + t["negative"]
            return float(binomtest(t["positive"], m, 0.5, alternative=side).pvalue) if m else 1.0

        one_sided = {e: {side: one_sided(tests[e], side) for side in ("greater", "less")} for e in tests}
        out["p_for"] = max(one_sided[e]["greater"] for e in tests)
        out["p_against"] = min(1.0, 2 * min(one_sided[e]["less"] for e in tests))
        return out

    small = scales[0]
    low_loss_claim = (f"random runs fail to reach a low test loss more often than orthogonal and GOE at sqrt(V) = "
                      f"{big:g}")
    low_loss_source = ('"The random initialization fails to converge to low test loss very often compared to the '
                       'orthogonal and GOE ensembles" (§4.3, its sqrt(V) = 1 paragraph)')
    if low_loss is None:
        low_loss_row = {"claim": low_loss_claim, "source": low_loss_source, "kind": "001", "measure": "",
                        "method": "exact one-sided sign tests over seeds, both needed (intersection-union)",
                        "estimate": math.nan, "lo": math.nan, "hi": math.nan, "interval": "", "n_seeds": n,
                        "detail": "", "p_for": math.nan, "p_against": math.nan, "testable": False,
                        "reason": "no a-priori low-loss threshold given (low_loss=None)"}
    else:
        low_loss_row = random_more_often("high_loss", low_loss_claim, low_loss_source, "001",
                                         f"ends at a test loss of {low_loss:.3f} nats or more", at=[big])
    tested[4:4] = [
        every_goe_run("off_plateau", f"every GOE training trajectory at sqrt(V) = {small:g} reaches its test-loss "
                      "plateau", '"All families from the GOE ensemble converge" (§4.3, its sqrt(V) = 0.1 paragraph, '
                      'on Fig. 6)', "001", "reach their plateau", at=[small]),
        every_goe_run("off_plateau", "every GOE training trajectory reaches its test-loss plateau",
                      '"All families from the GOE ensemble converge", said of sqrt(V) = 0.1 (§4.3), read at every '
                      'sqrt(V): stronger than 001\'s claim', "001", "reach their plateau"),
        random_more_often("off_plateau", "random trajectories miss their test-loss plateau more often than orthogonal "
                          "and GOE", '"less stable learning than GOE and orthogonal" (Table 1 caption), pooled over '
                          'sqrt(V) as the caption is; the plateau is about levelling off, not level', "001",
                          "misses its plateau"),
        low_loss_row,
        random_more_often("diverged", "random runs diverge (a non-finite loss) more often than orthogonal and GOE",
                          '"random initializations ... have a higher chance of diverging" (Fig. 6 caption)', "001",
                          "diverges"),
    ]
    diagnostics = [
        every_goe_run("unstable", "Broyden diagnostic: no GOE run diverges or ends with a failing solver",
                      "not a claim of 001 (its 'converge' is about the training trajectories)", "diagnostic",
                      "keep a finite loss and a converging solver"),
        random_more_often("unstable", "Broyden diagnostic: random has more runs that diverge or end with a failing "
                          "solver than orthogonal and GOE", "not a claim of 001", "diagnostic",
                          "diverges or its solver fails"),
    ]
    for c in page_claims:
        diagnostics.append({"source": "not a claim of 001: the page's own", "measure": "", "method": "",
                            "estimate": math.nan, "lo": math.nan, "hi": math.nan, "interval": "", "n_seeds": n,
                            "detail": "", **c, "kind": "page"})
    out = stats.claims_verdicts(tested, alpha=alpha) + stats.claims_verdicts(diagnostics, alpha=alpha)
    for c in out:
        c["scope"] = SCOPE
        c["holds"] = c["verdict"] == "holds"
    return out


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line: ``python -m deqlab.lab.experiments.sequence.ensemble_study --scale full --out DIR``.

    Shards each batch over all devices of ``jax.devices()`` (after ``jax.distributed.initialize()``
    on several hosts, see ``deqlab.nn.lm``) and resumes after an interruption: run the same
    command again."""
    parser = argparse.ArgumentParser(prog="python -m deqlab.lab.experiments.sequence.ensemble_study",
                                     description="The DEQ-Transformer ensemble study of 001 §4.2-4.3.")
    parser.add_argument("--scale", choices=("quick", "full"), default="quick")
    parser.add_argument("--out", required=True, help="directory of the results (and checkpoints)")
    parser.add_argument("--ensembles", nargs="+", default=list(ENSEMBLES), choices=ENSEMBLES)
    parser.add_argument("--sqrt-v", nargs="+", type=float, default=list(SQRT_V))
    parser.add_argument("--seeds", type=int, default=10, help="number of seeds (0 .. seeds-1)")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds must be an integer >= 1, got {args.seeds}")
    bad = [v for v in args.sqrt_v if not math.isfinite(v) or v < 0]
    if bad:
        parser.error(f"--sqrt-v must be finite numbers >= 0, got {' '.join(map(str, bad))}")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        parser.error(f"--out must be a directory (created if missing), got {args.out!r}, an existing file")
    from deqlab.nn.lm import data_mesh

    config = study_config(args.scale)
    devices = jax.devices()
    mesh = data_mesh(devices) if len(devices) > 1 else None
    if mesh is not None and config["batch_size"] % len(devices):
        parser.error(f"the batch size {config['batch_size']} must be a multiple of the {len(devices)} devices")
    units = run_study(args.out, config, ensembles=args.ensembles, sqrt_vs=args.sqrt_v, seeds=range(args.seeds),
                      mesh=mesh)
    for row in summarize(per_seed_rows(units)):
        print(f"{row['ensemble']:>10} sqrt(V)={row['sqrt_v']:<4g} min ppl {row['min_perplexity']:9.2f}  "
              f"mean ppl {row['mean_perplexity']:9.2f}  diverged {row['diverged_fraction']:.1f}  "
              f"solver failed {row['solver_failed_fraction']:.1f}")
    return units


if __name__ == "__main__":  # pragma: no cover - the command line
    main()
