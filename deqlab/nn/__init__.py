"""Flax NNX layers: the :class:`DEQ` wrapper, equilibrium cells with ensemble initialisation, and
the equilibrium sequence models of 003 §4 (transformer and trellis cells, a language model and its
data-parallel training step)."""

from deqlab.nn.cache import FixedPointCache
from deqlab.nn.cells import ResNetCell, TanhCell
from deqlab.nn.deq import DEQ, SOLVER_STATS, capture_solver_stats
from deqlab.nn.dropout import WeightTiedDropout
from deqlab.nn.lm import (
    STAT_NAMES,
    EquilibriumBlock,
    LanguageModel,
    data_mesh,
    eval_step,
    lm_loss,
    replicate,
    shard_batch,
    solver_stats,
    train,
    train_step,
    unroll,
)
from deqlab.nn.transformer import TransformerCell
from deqlab.nn.trellis import TrellisCell

__all__ = [
    "DEQ", "SOLVER_STATS", "capture_solver_stats", "FixedPointCache", "TanhCell", "ResNetCell",
    "TransformerCell", "TrellisCell", "WeightTiedDropout", "EquilibriumBlock", "LanguageModel", "unroll", "solver_stats",
    "lm_loss", "train_step", "eval_step", "train", "data_mesh", "shard_batch", "replicate", "STAT_NAMES",
]
