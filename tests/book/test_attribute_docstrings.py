"""book/_ext/attribute_docstrings.py: a constant's docstring whose first line has a colon is shown
as prose, not split by napoleon into a type and a description."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("sphinx", reason="the book's Sphinx toolchain is not installed (pip install -e '.[book]'); the floor environment of .ci/run, like Colab, has none, and CI's main test phase runs these checks")
_spec = importlib.util.spec_from_file_location("attribute_docstrings", ROOT / "book" / "_ext" / "attribute_docstrings.py")
ext = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ext)


@pytest.mark.parametrize("line, splits", [
    ("004 §4: inputs corrupted by noise", True),
    ("``X~ = X - OFFSET`` (004 §4: the output grid)", True),
    ("The grid of ``a: b`` values", False),
    ("See :func:`deqlab.solve` for the rule", False),
    ("A plain sentence.", False),
    ("A field list marker :: is not a single colon", False),
])
def test_which_first_lines_napoleon_would_split(line, splits):
    assert ext.has_field_colon(line) is splits


def test_napoleon_keeps_the_whole_text_after_the_hook():
    from sphinx.ext.napoleon import Config
    from sphinx.ext.napoleon.docstring import GoogleDocstring

    text = ["004 §4: inputs corrupted by i.i.d. noise;", "0.2 is the standard deviation."]
    config = Config(napoleon_use_ivar=True)
    split = GoogleDocstring(list(text), config, what="data", name="NOISE_STD").lines()
    assert any(line.startswith(":type: 004") for line in split)  # the defect the hook prevents
    lines = list(text)
    ext.remember_first_line(None, "data", "NOISE_STD", None, None, lines)
    lines[:] = GoogleDocstring(lines, config, what="data", name="NOISE_STD").lines()
    ext.keep_as_prose(None, "data", "NOISE_STD", None, None, lines)
    assert not any(line.startswith(":type:") for line in lines)
    assert lines[0] == "004 §4: inputs corrupted by i.i.d. noise;" and "0.2 is the standard deviation." in lines
    other = list(text)
    ext.remember_first_line(None, "function", "f", None, None, other)
    ext.keep_as_prose(None, "function", "f", None, None, other)
    assert other == text and ext._PENDING == {}  # functions and classes are left to napoleon
