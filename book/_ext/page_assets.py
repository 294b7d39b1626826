"""Sphinx extension: the scripts every page of the book loads, once each.

- **MathJax on every page.** Sphinx adds MathJax only to pages whose own content has maths, but
  the navigation sidebar and the previous / next links of *every* page show the titles of other
  pages, and some titles have maths ("... near $V_c$"). Without MathJax such a title stays raw
  TeX, `\\(V_c\\)`, on the pages without maths (found by the browser test, .ci/check_site.py).
  `set_html_assets_policy("always")` is Sphinx's switch for this.
- **No script twice.** sphinx-thebe (loaded by jupyter-book even with thebe off) registers its
  inline configuration, ``const THEBE_JS_URL = ...``, once per read phase, so a page carries it
  twice and the browser reports "Identifier 'THEBE_JS_URL' has already been declared" on every
  page. Identical script entries (same source or inline body, same attributes) are kept once.
- **An explicit colour mode.** pydata-sphinx-theme's page template reads ``default_mode`` from
  the page context; empty, its script logs "Got invalid theme mode: ." on a reader's first visit.
  It is set to ``light`` here (the figures are drawn for a white page).

The handler runs early (priority 100): ``html-page-context`` stops at the first handler that
returns a template name, so a late handler may never be called.
"""

from __future__ import annotations

from sphinx.application import Sphinx


def _script_key(script) -> tuple:
    attributes = getattr(script, "attributes", {}) or {}
    # an inline script is registered with filename None by some extensions and "" by others
    filename = getattr(script, "filename", str(script)) or ""
    return str(filename), tuple(sorted((k, str(v)) for k, v in attributes.items()))


def _page_context(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    context.setdefault("default_mode", "light")
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for script in scripts:
        key = _script_key(script)
        if key in seen:
            continue
        seen.add(key)
        kept.append(script)
    # in place: this is the builder's own list, shared by every page, to which handlers that run
    # later (sphinx.ext.mathjax) still add their scripts
    scripts[:] = kept


def setup(app: Sphinx) -> dict:
    app.set_html_assets_policy("always")
    app.connect("html-page-context", _page_context, priority=100)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
