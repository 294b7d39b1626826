"""Sphinx extension: load MathJax on every page of the book, not only on pages with equations.

Sphinx adds MathJax only to pages whose own content has maths, but the navigation sidebar and the
previous / next links of *every* page show the titles of other pages, and some titles have maths
(e.g. "Length variance and the divergence near $V_c$"). Without MathJax such a title stays raw
TeX, `\\(V_c\\)`, on the pages without maths (found by the browser test, .ci/check_site.py).
`set_html_assets_policy("always")` is Sphinx's switch for this (it also applies to any other
per-page asset, of which the book has none).
"""

from sphinx.application import Sphinx


def setup(app: Sphinx) -> dict:
    app.set_html_assets_policy("always")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
