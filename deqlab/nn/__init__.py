"""Flax NNX layers: the :class:`DEQ` wrapper and equilibrium cells with ensemble initialisation."""

from deqlab.nn.cells import ResNetCell, TanhCell
from deqlab.nn.deq import DEQ, SOLVER_STATS, capture_solver_stats

__all__ = ["DEQ", "SOLVER_STATS", "capture_solver_stats", "TanhCell", "ResNetCell"]
