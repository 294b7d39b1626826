"""Experiment scale: ``quick`` (default), ``medium`` or ``full``, chosen by the ``DEQLAB_SCALE`` variable.

Notebooks and benchmarks size their experiments with :func:`pick`::

    from deqlab.lab.experiments import pick

    width = pick(quick=128, full=1024)
    steps = pick(quick=200, full=20_000)

so that ``DEQLAB_SCALE=full jupyter-book build .`` (or ``DEQLAB_SCALE=full make book``) reproduces
the book's figures at full size while CI and the default build stay fast. ``medium`` is sized by
the power analysis to resolve a page's claims on a 2-core CPU in about an hour: a page whose
experiment has a medium size passes it (``pick(quick=3, medium=16, full=8)``), every other value
stays at its quick size, and the stored medium results the pages show come from
:mod:`deqlab.lab.experiments.medium`.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

import numpy as np

_T = TypeVar("_T")

SCALE_ENV = "DEQLAB_SCALE"
"""Name of the environment variable that selects the experiment scale."""

SCALES = ("quick", "medium", "full")
"""The valid scales; the first is the default."""


def get_scale() -> str:
    """Return the current experiment scale.

    Reads the environment variable ``DEQLAB_SCALE`` each time it is called. An unset or empty
    variable means ``"quick"``; surrounding white space and letter case are ignored.

    Returns:
        ``"quick"``, ``"medium"`` or ``"full"``.

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


_QUICK = object()


def pick(*, quick: _T, full: _T, medium: _T = _QUICK) -> _T:
    """Return ``quick``, ``medium`` or ``full`` according to the current scale (see :func:`get_scale`).

    Args:
        quick: Value used at the ``quick`` scale (the default).
        full: Value used at the ``full`` scale.
        medium: Value used at the ``medium`` scale; omitted: ``quick`` (the experiments without a
            medium size keep their quick one).

    Returns:
        One of the arguments, unchanged.

    Raises:
        ValueError: If ``DEQLAB_SCALE`` holds an invalid value.

    Example:
        >>> pick(quick=3, medium=16, full=8)  # DEQLAB_SCALE unset: quick
        3
    """
    scale = get_scale()
    if scale == "quick":
        return quick
    if scale == "medium":
        return quick if medium is _QUICK else medium
    return full


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


BOOK_BUILD_ENV = "DEQLAB_BOOK_BUILD"
"""Environment variable set (to ``1``) while notebooks are executed for the book's site.

The Makefile exports it for ``make test`` / ``make book``, and the book's Sphinx extension
(``book/_ext/executed_notebooks.py``) sets it in the build process, whose notebook kernels inherit
it. It only switches off :func:`glue`'s printed echo, which the site does not need.
"""


def _echo_text(value: Any, limit: int = 120) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def glue(name: str, value: Any, display: bool = False) -> None:
    """Store ``value`` under ``name`` for the prose (``{glue:text}`name:.3f```), readable everywhere.

    On the book's site the prose shows the value where it references ``name``: the cell's output
    carries the record :func:`myst_nb.glue` writes (``display=False``: not under the cell), made
    by :func:`_glue_record`. Elsewhere the same notebook must read well too:

    - without ``myst_nb`` installed (Colab, a plain Jupyter or JupyterHub, Kaggle: myst-nb is only
      in deqlab's ``book`` extra) nothing is stored and no ImportError is raised;
    - outside the site build (no ``DEQLAB_BOOK_BUILD`` in the environment) the cell also prints
      ``name = value``, so that a reader who sees the literal ``{glue:text}`` role in the prose
      finds the number in the output just above it. The echo is plain text on stdout, which
      myst-nb never wraps in a figure (a figure cell may glue).

    Values are passed through :func:`plain_number` first, so NumPy and JAX scalars read as Python
    numbers.

    Args:
        name: Key referenced from the prose; prefixed by the page (``ch2p4_...``).
        value: A number, string or any object myst-nb can display.
        display: Also display the value under the cell on the site (myst-nb's ``display``).
    """
    value = plain_number(value)
    try:
        import myst_nb  # noqa: F401  the book extra (deqlab itself does not need myst-nb); a small module
        stored = True
    except ImportError:
        stored = False
    if stored:
        _glue_record(name, value, display=display)
    if not os.environ.get(BOOK_BUILD_ENV) and not (display and stored):
        print(f"{name} = {_echo_text(value)}")


_GLUE_PREFIX = "application/papermill.record/"
"""The MIME-type prefix of a value stored for the prose but not shown (myst-nb's ``GLUE_PREFIX``)."""


def _glue_record(name: str, value: Any, display: bool = False) -> None:
    """Display the record :func:`myst_nb.glue` displays, without importing ``myst_nb.ext.glue``.

    That module imports ``nbformat`` (for a type hint), whose validator loads jsonschema's format
    checkers, and with them ``rfc3987_syntax``, which builds a grammar when it is imported: the
    first ``myst_nb.glue`` of every notebook kernel took 1.9 s (2-core machine), once per page of
    the book. The record is myst-nb's glue format: ``value``'s MIME bundle, each type prefixed with
    ``_GLUE_PREFIX`` unless ``display``, and ``{"scrapbook": {"name", "mime_prefix"}}`` in the
    metadata; ``tests/lab/test_experiments_config.py`` checks it against the installed myst-nb's.

    Args:
        name: Key referenced from the prose.
        value: Any object IPython can format.
        display: Also show the value under the cell (no prefix).
    """
    from IPython.core.formatters import format_display_data
    from IPython.display import display as ipython_display

    bundle, metadata = format_display_data(value)
    prefix = "" if display else _GLUE_PREFIX
    metadata["scrapbook"] = {"name": name, "mime_prefix": prefix}
    ipython_display({prefix + kind: data for kind, data in bundle.items()}, raw=True, metadata=metadata)
