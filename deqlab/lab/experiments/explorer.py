"""Interactive explorers for the book: precomputed frames behind a slider, no kernel needed.

An explorer draws one Matplotlib frame per value of a parameter (the scale $\\sqrt V$, the depth
$L$, ...) when the cell runs, and shows them as one self-contained HTML widget: an image, a slider
and play buttons that swap the precomputed frames in the browser. It is Matplotlib's own
JavaScript animation player (:meth:`matplotlib.animation.Animation.to_jshtml`), so it needs no
extra dependency and no running kernel: it works on the built site (myst-nb inserts ``text/html``
outputs as they are), in JupyterLab and in Colab (which run the scripts of HTML outputs). To see
other values, change the list of values and run the cell again.

::

    import numpy as np
    from deqlab.lab.experiments import explorer

    grid = np.linspace(0, 2 * np.pi, 200)
    explorer.slider(
        lambda fig, k: fig.subplots().plot(grid, np.sin(k * grid)),
        [1, 2, 3, 4],
        label="$k$",
        fmt="{:d}",
    )

Notebooks of the book define no functions, so they use the data-driven forms, which take arrays
computed in the notebook, one per value: :func:`cloud_slider` (points in the complex plane, e.g.
eigenvalues, with circles of given radii) and :func:`density_slider` (histograms of samples against
theory curves).

The widget is a ``<div class="deqlab-explorer">`` (the site's browser test finds explorers by this
class); its frames are PNG images, so its size grows with the number of frames, the figure size and
the resolution: a figure of 9 x 3.2 inches at 80 dpi and 10-15 frames is a few hundred kilobytes.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.animation import FuncAnimation
from matplotlib.figure import Figure

__all__ = ["Explorer", "cloud_slider", "density_slider", "slider"]

CSS_CLASS = "deqlab-explorer"
"""Class of the ``<div>`` that wraps every explorer (the site's browser test looks for it)."""

MAX_FRAMES = 60
"""Most frames one explorer may hold: each is an embedded image, and a page must stay light."""

_ICONS = {
    "fa-minus": "&minus;", "fa-plus": "+", "fa-pause": "&#10074;&#10074;",
    "fa-fast-backward": "|&#9664;", "fa-step-backward": "&lsaquo;", "fa-play fa-flip-horizontal": "&#9664;",
    "fa-play": "&#9654;", "fa-step-forward": "&rsaquo;", "fa-fast-forward": "&#9654;|",
}
"""Text glyphs for the player's buttons: Matplotlib's template draws them with the Font Awesome
web font from a CDN, which leaves blank buttons offline or behind a strict content policy."""

_ICON_TAG = re.compile(r'<i class="fa ((?:fa-[a-z-]+ ?)+)"></i>')
_FONT_LINK = re.compile(r'<link rel="stylesheet"\s+href="[^"]*font-awesome[^"]*">\s*')

_EMBED_LIMIT_MB = 64.0  # Matplotlib drops frames silently past animation.embed_limit; we never want that


class Explorer:
    """A precomputed slider widget (see :func:`slider`); displayed through its ``_repr_*_`` methods.

    Attributes:
        html: The self-contained HTML of the widget (``<div class="deqlab-explorer">...</div>``).
        values: The parameter values, one per frame, in slider order.
        label: The name of the parameter (may hold ``$...$`` mathematics).
        fmt: The format of a value in the frame titles.
    """

    def __init__(self, html_text: str, values: Sequence[Any], label: str, fmt: str, description: str):
        self.html = html_text
        self.values = list(values)
        self.label = label
        self.fmt = fmt
        self.description = description

    @property
    def n_frames(self) -> int:
        """Number of frames (one per value)."""
        return len(self.values)

    @property
    def size_bytes(self) -> int:
        """Size of the HTML in bytes (UTF-8)."""
        return len(self.html.encode("utf-8"))

    def _summary(self) -> str:
        shown = ", ".join(self.fmt.format(v) for v in self.values)
        text = (f"Interactive explorer: {self.n_frames} precomputed frames, one per {self.label} in "
                f"[{shown}], behind a slider (open the page in a browser, JupyterLab or Colab to use it).")
        return f"{text} {self.description}".strip()

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self._summary()


def _check_values(values: Any, fmt: str) -> list[Any]:
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise TypeError(f"values must be a sequence (list, tuple or 1-d array), got {type(values).__name__}")
    if isinstance(values, np.ndarray) and values.ndim != 1:
        raise ValueError(f"values must be one-dimensional, got shape {values.shape}")
    vals = [v.item() if isinstance(v, np.generic) else v for v in values]
    if not 1 <= len(vals) <= MAX_FRAMES:
        raise ValueError(f"values must hold between 1 and {MAX_FRAMES} values (one frame each), got {len(vals)}")
    for v in vals:
        try:
            fmt.format(v)
        except (ValueError, TypeError, IndexError, KeyError) as err:
            raise ValueError(f"fmt={fmt!r} cannot format the value {v!r} of values: {err}") from None
    return vals


def _check_positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")
    return float(value)


def slider(
    draw: Callable[[Figure, Any], Any],
    values: Sequence[Any],
    *,
    label: str,
    fmt: str = "{:.2f}",
    figsize: tuple[float, float] = (6.0, 3.5),
    dpi: float = 80,
    interval_ms: int = 600,
    description: str = "",
) -> Explorer:
    """Precompute one frame per value and return them as an HTML slider widget.

    For each value, the figure is cleared, ``draw(fig, value)`` draws it from scratch (making its
    own axes, e.g. ``fig.subplots(1, 3)``), and the figure's title is set to
    ``f"{label} = {fmt.format(value)}"``, so that the frame itself shows the value. The figure never
    enters pyplot, so no extra static image is shown under the cell.

    Args:
        draw: Callable ``draw(fig, value)`` that draws the frame for ``value`` on the empty
            :class:`matplotlib.figure.Figure` ``fig`` (its return value is ignored).
        values: The parameter values, one frame each, in slider order (1 to :data:`MAX_FRAMES`).
        label: Name of the parameter in the frame titles, e.g. ``r"$\\sqrt{V}$"``.
        fmt: :meth:`str.format` pattern of a value, e.g. ``"{:.2f}"`` or ``"{:d}"``.
        figsize: Figure size in inches, (width, height), both positive.
        dpi: Resolution of the frames, positive (80 keeps a 15-frame explorer well under 1 MB).
        interval_ms: Time between frames when playing, in milliseconds, positive.
        description: One sentence on what the frames show, appended to the plain-text form.

    Returns:
        An :class:`Explorer`; as the last expression of a cell it renders as the widget.

    Raises:
        TypeError: If ``draw`` is not callable, or ``values`` is not a sequence.
        ValueError: If ``values`` is empty, too long or not formattable with ``fmt``, or ``figsize``,
            ``dpi`` or ``interval_ms`` is not positive.
    """
    if not callable(draw):
        raise TypeError(f"draw must be a callable draw(fig, value), got {type(draw).__name__}")
    if not isinstance(label, str) or not label:
        raise ValueError(f"label must be a non-empty string, got {label!r}")
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a str.format pattern such as '{{:.2f}}', got {type(fmt).__name__}")
    vals = _check_values(values, fmt)
    if np.shape(figsize) != (2,):
        raise ValueError(f"figsize must be (width, height) in inches, got {figsize!r}")
    width, height = (_check_positive("figsize", s) for s in figsize)
    dpi = _check_positive("dpi", dpi)
    if isinstance(interval_ms, bool) or not isinstance(interval_ms, numbers.Integral) or interval_ms <= 0:
        raise ValueError(f"interval_ms must be a positive integer (milliseconds), got {interval_ms!r}")

    fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained")  # outside pyplot: no stray image

    def frame(i: int) -> list:
        fig.clear()
        draw(fig, vals[i])
        fig.suptitle(f"{label} = {fmt.format(vals[i])}")
        return []

    with matplotlib.rc_context({"animation.embed_limit": _EMBED_LIMIT_MB, "savefig.dpi": dpi}):
        anim = FuncAnimation(fig, frame, frames=len(vals), init_func=lambda: frame(0), blit=False,
                             interval=int(interval_ms), repeat=False)
        player = anim.to_jshtml(default_mode="once")
    anim.event_source = None  # rendered: nothing left to run
    player = _ICON_TAG.sub(lambda m: _ICONS.get(m.group(1).strip(), m.group(0)), _FONT_LINK.sub("", player))
    return Explorer(f'<div class="{CSS_CLASS}">\n{player}\n</div>', vals, label, fmt, description)


def _per_value(name: str, data: Mapping[str, Sequence[Any]], n: int) -> dict[str, list[Any]]:
    if not isinstance(data, Mapping) or not data:
        raise TypeError(f"{name} must be a non-empty mapping panel title -> one entry per value")
    out = {}
    for key, seq in data.items():
        if len(seq) != n:
            raise ValueError(f"{name}[{key!r}] must hold one entry per value ({n}), got {len(seq)}")
        out[str(key)] = list(seq)
    return out


def cloud_slider(
    clouds: Mapping[str, Sequence[np.ndarray]],
    values: Sequence[Any],
    *,
    label: str,
    radii: Mapping[str, Sequence[float]] | None = None,
    unit_circle: bool = True,
    extent: float | None = None,
    colors: Mapping[str, str] | None = None,
    fmt: str = "{:.2f}",
    panel_size: float = 3.0,
    dpi: float = 80,
    description: str = "",
) -> Explorer:
    """Explorer of point clouds in the complex plane (e.g. eigenvalues), one panel per cloud.

    Frame ``i`` shows, in panel ``name``, the points ``clouds[name][i]`` (complex; real arrays lie
    on the real axis), the unit circle (dotted, if ``unit_circle``; points outside it in red), and a
    dashed circle of radius ``radii[name][i]`` (e.g. the limiting spectral radius of the theory).
    The panel title gives the largest modulus of the points, so the reader sees when the cloud
    leaves the unit disc.

    Args:
        clouds: Panel title -> one array of points per value.
        values: The parameter values, one frame each (see :func:`slider`).
        label: Name of the parameter, e.g. ``r"$\\sqrt{V}$"``.
        radii: Panel title -> one radius per value, drawn as a dashed circle; optional.
        unit_circle: Draw the unit circle in every panel.
        extent: Half-width of every panel's axes; default: the largest modulus over all frames
            and radii, times 1.05, and at least 1.1 with the unit circle.
        colors: Panel title -> Matplotlib colour of its points; default the colour cycle.
        fmt, dpi, description: As in :func:`slider`.
        panel_size: Width and height of one panel in inches, positive.

    Returns:
        An :class:`Explorer`.

    Raises:
        TypeError, ValueError: As in :func:`slider`, and if a mapping does not hold one entry per
            value or ``extent`` is not positive.
    """
    vals = _check_values(values, fmt if isinstance(fmt, str) else "{}")
    points = {k: [np.asarray(p).ravel().astype(complex) for p in seq]
              for k, seq in _per_value("clouds", clouds, len(vals)).items()}
    circles = _per_value("radii", radii, len(vals)) if radii is not None else {}
    unknown = set(circles) - set(points)
    if unknown:
        raise ValueError(f"radii names panels that clouds does not have: {sorted(unknown)}")
    panel_size = _check_positive("panel_size", panel_size)
    if extent is None:
        biggest = max(max((float(np.max(np.abs(p))) for p in seq if p.size), default=0.0)
                      for seq in points.values())
        biggest = max([biggest] + [float(r) for seq in circles.values() for r in seq])
        extent = max(1.05 * biggest, 1.1 if unit_circle else 0.0) or 1.0
    extent = _check_positive("extent", extent)
    colors = dict(colors or {})
    ring = np.exp(1j * np.linspace(0.0, 2.0 * np.pi, 361))

    def draw(fig: Figure, value: Any) -> None:
        i = vals.index(value)
        axes = np.atleast_1d(fig.subplots(1, len(points)))
        for c, (ax, (name, seq)) in enumerate(zip(axes, points.items())):
            pts = seq[i]
            out = np.abs(pts) > 1.0 if unit_circle else np.zeros(pts.shape, bool)
            ax.plot(pts[~out].real, pts[~out].imag, ".", ms=2.5, color=colors.get(name, f"C{c}"))
            ax.plot(pts[out].real, pts[out].imag, ".", ms=3.0, color="red")
            if unit_circle:
                ax.plot(ring.real, ring.imag, "k:", lw=0.8)
            if name in circles:
                r = float(circles[name][i])
                ax.plot(r * ring.real, r * ring.imag, "--", color="0.35", lw=1.0)
            rho = float(np.max(np.abs(pts))) if pts.size else float("nan")
            ax.set_title(f"{name}: max $|\\lambda|$ = {rho:.2f}", fontsize=9)
            ax.set_xlim(-extent, extent)
            ax.set_ylim(-extent, extent)
            ax.set_aspect("equal")
            ax.tick_params(labelsize=7)

    return slider(draw, vals, label=label, fmt=fmt, figsize=(panel_size * len(points), panel_size + 0.4),
                  dpi=dpi, description=description)


def density_slider(
    samples: Mapping[str, Sequence[np.ndarray]],
    values: Sequence[Any],
    *,
    label: str,
    bins: Sequence[float] | np.ndarray,
    curves: Mapping[str, Sequence[tuple[np.ndarray, np.ndarray]]] | None = None,
    xlabel: str = "",
    ylabel: str = "density",
    ylim: tuple[float, float] | None = None,
    fmt: str = "{:.2f}",
    panel_size: tuple[float, float] = (3.6, 2.8),
    dpi: float = 80,
    description: str = "",
) -> Explorer:
    """Explorer of histograms against theory curves, one panel per name.

    Frame ``i`` shows, in panel ``name``, the normalised histogram of ``samples[name][i]`` over
    ``bins`` (solid steps, labelled "simulation") and the curve ``curves[name][i] = (x, y)``
    (dashed, labelled "theory"). The histogram is normalised by the number of samples given, so
    that samples outside the bins (e.g. an atom at zero) keep their share of the mass.

    Args:
        samples: Panel title -> one array of samples per value.
        values: The parameter values, one frame each (see :func:`slider`).
        label: Name of the parameter, e.g. ``"$L$"``.
        bins: Increasing bin edges shared by all panels (at least two).
        curves: Panel title -> one ``(x, y)`` pair per value; optional.
        xlabel, ylabel: Axis labels.
        ylim: Fixed y-range of every panel; default: the largest bar or curve over all frames.
        fmt, dpi, description: As in :func:`slider`.
        panel_size: (width, height) of one panel in inches, both positive.

    Returns:
        An :class:`Explorer`.

    Raises:
        TypeError, ValueError: As in :func:`slider`, and if a mapping does not hold one entry per
            value or ``bins`` is not increasing.
    """
    vals = _check_values(values, fmt if isinstance(fmt, str) else "{}")
    data = {k: [np.asarray(s, dtype=float).ravel() for s in seq]
            for k, seq in _per_value("samples", samples, len(vals)).items()}
    lines = _per_value("curves", curves, len(vals)) if curves is not None else {}
    unknown = set(lines) - set(data)
    if unknown:
        raise ValueError(f"curves names panels that samples does not have: {sorted(unknown)}")
    edges = np.asarray(bins, dtype=float)
    if edges.ndim != 1 or edges.size < 2 or not np.all(np.diff(edges) > 0):
        raise ValueError("bins must be at least two increasing bin edges")
    if np.shape(panel_size) != (2,):
        raise ValueError(f"panel_size must be (width, height) in inches, got {panel_size!r}")
    pw, ph = (_check_positive("panel_size", s) for s in panel_size)
    heights = {k: [np.histogram(s, bins=edges)[0] / max(s.size, 1) / np.diff(edges) for s in seq]
               for k, seq in data.items()}
    if ylim is None:
        top = max(float(np.max(h)) for seq in heights.values() for h in seq)
        top = max([top] + [float(np.nanmax(y)) for seq in lines.values() for _, y in seq])
        ylim = (0.0, 1.05 * top if top > 0 else 1.0)

    def draw(fig: Figure, value: Any) -> None:
        i = vals.index(value)
        axes = np.atleast_1d(fig.subplots(1, len(data), sharey=True))
        for c, (ax, name) in enumerate(zip(axes, data)):
            ax.stairs(heights[name][i], edges, color=f"C{c}", lw=1.3, label="simulation")
            if name in lines:
                x, y = lines[name][i]
                ax.plot(x, y, "k--", lw=1.0, label="theory")
            ax.set_title(name, fontsize=9)
            ax.set_xlim(edges[0], edges[-1])
            ax.set_ylim(*ylim)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.tick_params(labelsize=7)
        axes[0].set_ylabel(ylabel, fontsize=8)
        axes[0].legend(fontsize=7, loc="upper left")

    return slider(draw, vals, label=label, fmt=fmt, figsize=(pw * len(data), ph + 0.4), dpi=dpi,
                  description=description)
