"""Experiment helpers shared by the book's notebooks and the benchmarks.

The size of every experiment is chosen by the environment variable ``DEQLAB_SCALE``
(see :mod:`deqlab.lab.experiments.config`): ``quick`` (the default, minutes on a laptop CPU, what CI
runs) or ``full`` (the sizes used for the figures quoted in the book).
"""

from deqlab.lab.experiments import explorer
from deqlab.lab.experiments.config import SCALE_ENV, SCALES, get_scale, glue, pick, plain_number
from deqlab.lab.experiments.tables import Table, table

__all__ = ["SCALE_ENV", "SCALES", "Table", "explorer", "get_scale", "glue", "pick", "plain_number", "table"]
