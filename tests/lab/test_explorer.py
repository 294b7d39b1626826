"""deqlab.lab.experiments.explorer: precomputed slider widgets for the book (no kernel needed)."""

from __future__ import annotations

import base64
import re

import matplotlib.pyplot as plt
import numpy as np
import pytest

from deqlab.lab.experiments import explorer

FRAME = re.compile(r'frames\[(\d+)\] = "data:image/png;base64,([^"]*)"', re.S)


def _frames(html: str) -> dict[int, bytes]:
    """The embedded PNG frames of an explorer's HTML, by index."""
    return {int(i): base64.b64decode(b64.replace("\\\n", "").replace("\n", "")) for i, b64 in FRAME.findall(html)}


GRID = np.linspace(0.0, 2.0 * np.pi, 100)


def _sine(fig, k):
    fig.subplots().plot(GRID, np.sin(k * GRID))


@pytest.fixture(scope="module")
def sines():
    return explorer.slider(_sine, [1, 2, 3], label="$k$", fmt="{:d}", figsize=(3, 2), dpi=50)


def test_one_frame_per_value_slider_and_class(sines):
    frames = _frames(sines.html)
    assert sorted(frames) == [0, 1, 2]
    assert all(f.startswith(b"\x89PNG") for f in frames.values())
    assert sines.html.startswith(f'<div class="{explorer.CSS_CLASS}">')
    assert sines.html.rstrip().endswith("</div>")
    assert re.search(r'<input[^>]*type="range"', sines.html), "a slider"  # its range is set from the frames
    assert sines._repr_html_() == sines.html
    assert sines.n_frames == 3 and sines.values == [1, 2, 3]


def test_frames_differ_between_values(sines):
    frames = _frames(sines.html)
    assert len(set(frames.values())) == 3, "each value must draw its own frame"


def test_same_value_draws_the_same_frame():
    # the converse of the test above: frames differ because the values do, not by accident
    ex = explorer.slider(_sine, [2, 2], label="$k$", fmt="{:d}", figsize=(3, 2), dpi=50)
    frames = _frames(ex.html)
    assert len(frames) == 2 and frames[0] == frames[1]


def test_self_contained_no_icon_font(sines):
    assert "font-awesome" not in sines.html and 'class="fa ' not in sines.html
    assert "&#9654;" in sines.html  # the play button as a text glyph


def test_title_shows_value():
    titles = []

    def draw(fig, v):
        fig.subplots().plot([0, 1], [0, v])
        titles.append(fig)

    explorer.slider(draw, [0.5, 0.75], label=r"$\sqrt{V}$", figsize=(2, 2), dpi=40)
    assert titles[-1]._suptitle.get_text() == r"$\sqrt{V}$ = 0.75"


def test_no_figure_left_open():
    before = plt.get_fignums()
    explorer.slider(_sine, [1, 2], label="k", fmt="{:d}", figsize=(2, 2), dpi=40)
    assert plt.get_fignums() == before


def test_text_fallback(sines):
    text = repr(sines)
    assert "3 precomputed frames" in text and "[1, 2, 3]" in text and "$k$" in text


def test_small_html():
    # 15 frames of a 9 x 3.2 inch figure at 80 dpi, the book's explorer size, stay under 1 MB
    rng = np.random.default_rng(0)
    ev = np.linalg.eigvals(rng.standard_normal((200, 200)) / np.sqrt(200))
    scales = np.linspace(0.4, 1.3, 15)
    ex = explorer.cloud_slider({"a": [s * ev for s in scales], "b": [s * ev.conj() for s in scales],
                                "c": [s * ev.real for s in scales]}, scales, label="s", radii={"a": scales})
    assert len(_frames(ex.html)) == 15
    assert ex.size_bytes < 1_000_000, ex.size_bytes


def test_density_slider_frames():
    rng = np.random.default_rng(1)
    widths = [0.5, 1.0, 2.0]
    x = np.linspace(-5, 5, 101)
    ex = explorer.density_slider(
        {"normal": [w * rng.standard_normal(500) for w in widths]}, widths, label=r"$\sigma$",
        bins=np.linspace(-5, 5, 30),
        curves={"normal": [(x, np.exp(-x**2 / (2 * w**2)) / np.sqrt(2 * np.pi) / w) for w in widths]})
    frames = _frames(ex.html)
    assert len(frames) == 3 and len(set(frames.values())) == 3


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"draw": "not a function"}, TypeError, "draw"),
        ({"values": []}, ValueError, "values"),
        ({"values": 3}, TypeError, "values"),
        ({"values": np.zeros((2, 2))}, ValueError, "values"),
        ({"values": list(range(explorer.MAX_FRAMES + 1))}, ValueError, "values"),
        ({"dpi": 0}, ValueError, "dpi"),
        ({"dpi": float("nan")}, ValueError, "dpi"),
        ({"dpi": "80"}, ValueError, "dpi"),
        ({"figsize": (3, -1)}, ValueError, "figsize"),
        ({"figsize": 3}, ValueError, "figsize"),
        ({"label": ""}, ValueError, "label"),
        ({"fmt": "{:d}", "values": [0.5]}, ValueError, "fmt"),
        ({"interval_ms": 0}, ValueError, "interval_ms"),
    ],
)
def test_bad_arguments(kwargs, error, name):
    args = {"draw": _sine, "values": [1, 2], "label": "k", "fmt": "{}"} | kwargs
    with pytest.raises(error, match=name):
        explorer.slider(args.pop("draw"), args.pop("values"), **args)


def test_bad_data_arguments():
    with pytest.raises(ValueError, match=r"clouds\['a'\]"):
        explorer.cloud_slider({"a": [np.ones(3)]}, [1, 2], label="s")
    with pytest.raises(ValueError, match="radii"):
        explorer.cloud_slider({"a": [np.ones(3)] * 2}, [1, 2], label="s", radii={"b": [1, 1]})
    with pytest.raises(TypeError, match="samples"):
        explorer.density_slider({}, [1], label="L", bins=[0, 1])
    with pytest.raises(ValueError, match="bins"):
        explorer.density_slider({"a": [np.ones(3)]}, [1], label="L", bins=[1, 0])
