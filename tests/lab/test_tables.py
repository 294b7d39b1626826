import re

import numpy as np
import pytest
from markdown_it import MarkdownIt

from deqlab.lab.experiments import Table, table


def _md_tokens(text):
    return [t.type for t in MarkdownIt("commonmark").enable("table").parse(text)]


def test_html_is_a_real_table_processed_by_mathjax():
    t = table([("relu", 0.5), ("erf", 0.25)], columns=["$\\phi$", "$\\chi$"], formats=[None, ".3f"])
    out = t._repr_html_()
    assert out.startswith("<table") and out.rstrip().endswith("</table>")
    assert 'class="mathjax_process' in out
    assert out.count("<tr>") == 3 and out.count("<th>") == 2 and out.count("<td>") == 4
    assert r"\(\phi\)" in out and "$" not in out  # MathJax 3 reads \( \) inline by default
    assert "<td>0.500</td>" in out and "<td>0.250</td>" in out


def test_markdown_is_a_valid_pipe_table():
    t = table([("a|b", 1.0), ("c", 2.0)], columns=["name", "$x$"], formats=".1e", caption="A caption.")
    md = t._repr_markdown_()
    types = _md_tokens(md)
    assert "table_open" in types and types.count("tr_open") == 3
    assert "\\|" in md and "1.0e+00" in md
    assert md.splitlines()[0] == "A caption."


def test_html_escapes_text_and_keeps_caption():
    out = table([("<b>", "x < 1 & $a<b$")], columns=["p", "q"], caption="Cap $q^*$")._repr_html_()
    assert "<b>" not in out.replace("<tbody>", "") and "&lt;b&gt;" in out and "&amp;" in out
    assert r"<caption>Cap \(q^*\)</caption>" in out
    assert r"\(a&lt;b\)" in out


def test_formats_forms():
    rows = [(1, 2.0, np.float64(3.0))]
    assert table(rows, ["a", "b", "c"], formats={"b": ".2f"}).cells == (("1", "2.00", "3.0"),)
    assert table(rows, ["a", "b", "c"], formats=[None, lambda v: f"<{v}>", ".0f"]).cells == (("1", "<2.0>", "3"),)
    assert table([("label", 1.5)], ["a", "b"], formats=".1f").cells == (("label", "1.5"),)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(rows=[(1, 2)], columns=["a"]), r"rows\[0\]"),
        (dict(rows=[(1,)], columns=[]), "columns"),
        (dict(rows=[(1,)], columns=["a"], formats=[".1f", ".2f"]), "formats"),
        (dict(rows=[(1,)], columns=["a"], formats={"z": ".1f"}), "formats"),
    ],
)
def test_errors_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        table(**kwargs)


def test_is_a_table_object_and_empty_rows():
    t = table([], ["a", "b"])
    assert isinstance(t, Table) and re.search(r"<tbody>\s*</tbody>", t._repr_html_())
    assert "table_open" in _md_tokens(t._repr_markdown_())


def test_markdown_keeps_norm_bars_and_absolute_values_inside_maths():
    # A pipe table unescapes \| before the maths is parsed: a norm written \| must reach the maths
    # as a norm, and the bars of an absolute value must not split the cell.
    t = table([(r"$\|K\|$", "$|z|$")], ["norm", "absolute value"])
    cells = [tok.content for tok in MarkdownIt("commonmark").enable("table").parse(t._repr_markdown_())
             if tok.type == "inline"]
    assert cells == ["norm", "absolute value", r"$\Vert K\Vert $", "$|z|$"]
