"""Experiment scale: ``quick`` (default) or ``full``, chosen by the ``DEQLAB_SCALE`` variable.

Notebooks and benchmarks size their experiments with :func:`pick`::

    from deqlab.experiments import pick

    width = pick(quick=128, full=1024)
    steps = pick(quick=200, full=20_000)

so that ``DEQLAB_SCALE=full jupyter-book build .`` (or ``DEQLAB_SCALE=full make book``) reproduces
the book's figures at full size while CI and the default build stay fast.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

import numpy as np

_T = TypeVar("_T")

SCALE_ENV = "DEQLAB_SCALE"
"""Name of the environment variable that selects the experiment scale."""

SCALES = ("quick", "full")
"""The valid scales; the first is the default."""


def get_scale() -> str:
    """Return the current experiment scale.

    Reads the environment variable ``DEQLAB_SCALE`` each time it is called. An unset or empty
    variable means ``"quick"``; surrounding white space and letter case are ignored.

    Returns:
        ``"quick"`` or ``"full"``.

    Raises:
        ValueError: If ``DEQLAB_SCALE`` holds any other value.
    """
    raw = os.environ.get(SCALE_ENV, "")
    value = raw.strip().lower() or SCALES[0]
    if value not in SCALES:
        raise ValueError(
            f"environment variable {SCALE_ENV}={raw!r} is not a valid scale; "
            f"valid values are {', '.join(repr(s) for s in SCALES)} (unset means 'quick')"
        )
    return value


def pick(*, quick: _T, full: _T) -> _T:
    """Return ``quick`` or ``full`` according to the current scale (see :func:`get_scale`).

    Args:
        quick: Value used at the ``quick`` scale (the default).
        full: Value used at the ``full`` scale.

    Returns:
        One of the two arguments, unchanged.

    Raises:
        ValueError: If ``DEQLAB_SCALE`` holds an invalid value.
    """
    return quick if get_scale() == "quick" else full


def plain_number(value: Any) -> Any:
    """``value`` with NumPy / JAX scalars and 0-d arrays turned into Python ``int``/``float``/...

    Under NumPy 2 a NumPy scalar's text form is ``np.float64(0.25)``, which neither reads well in
    prose nor parses under a ``{glue:text}`` format spec such as ``:.3f``. Anything else is
    returned unchanged.
    """
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "ndim") and hasattr(value, "item") and value.ndim == 0:
        return plain_number(np.asarray(value)[()])
    return value


def glue(name: str, value: Any, display: bool = False) -> None:
    """:func:`myst_nb.glue` for the book's notebooks, storing :func:`plain_number` of ``value``.

    Notebooks glue every number quoted in their prose through this function (default
    ``display=False``: the value appears where the prose references it, not under the cell).
    """
    from myst_nb import glue as myst_glue  # the book extra; deqlab itself does not need myst-nb

    myst_glue(name, plain_number(value), display=display)
