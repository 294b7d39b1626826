"""deqlab: deep equilibrium models, their solvers, implicit gradients and random-matrix theory.

Companion package of the book *Equilibrium*. Paper references in docstrings use the numbering of
the book's sources: 001 (Agarwala & Schoenholz 2022), 002 (Pennington, Schoenholz & Ganguli 2018),
003 (Bai, Kolter & Koltun 2019), 004 (Tsuchida et al. 2022).
"""

from deqlab import ensembles, solvers
from deqlab.solvers import Result, Solution, solve
from deqlab.implicit import fixed_point, check_gradients

__version__ = "0.1.0"

__all__ = [
    "ensembles",
    "solvers",
    "solve",
    "fixed_point",
    "check_gradients",
    "Result",
    "Solution",
]
