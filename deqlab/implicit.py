"""Former home of the backward modes, kept so that ``from deqlab.implicit import ...`` still works.

The backward modes, :func:`~deqlab.backward.fixed_point`, :func:`~deqlab.backward.adjoint_solve`
and :func:`~deqlab.backward.check_gradients` live in :mod:`deqlab.backward` (one module per
mode) since deqlab 0.7; this module re-exports its public names. New code imports
:mod:`deqlab.backward` (or the top-level names, ``deqlab.fixed_point``, ``deqlab.Implicit``).
"""

from deqlab.backward import *  # noqa: F403
from deqlab.backward import __all__ as __all__  # noqa: F401
