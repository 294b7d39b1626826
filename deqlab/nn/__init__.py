"""Flax NNX layers: the :class:`DEQ` wrapper and equilibrium cells with ensemble initialisation."""

from deqlab.nn.cells import ResNetCell, TanhCell
from deqlab.nn.deq import DEQ, SolveSummary

__all__ = ["DEQ", "SolveSummary", "TanhCell", "ResNetCell"]
