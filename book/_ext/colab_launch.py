"""Sphinx extension: the Colab launch buttons open the Colab edition, the edit buttons stay on main.

sphinx-book-theme builds every repository link from one branch, ``repository.branch`` of
_config.yml (``html_theme_options["repository_branch"]``): the edit and source buttons, and the
launch buttons, whose Colab URL is ``{colab_url}/github/{org}/{repo}/blob/{branch}/{path}``
(sphinx_book_theme/header_buttons/launch.py). The notebooks on main carry MyST that Colab shows as
literal text; their Colab edition (.ci/colab_edition.py, ``make colab-edition``) is published by
the book workflow on the branch ``deqlab_colab_branch`` (default ``colab``) at the same paths. This
handler runs after the theme's (priority 501) and rewrites the ``/blob/<branch>/`` part of every
Colab launch link to that branch; edit, source and issue links keep ``repository.branch`` (main).
Set ``deqlab_colab_branch`` to ``""`` to leave the links as the theme made them.
"""

from __future__ import annotations

from sphinx.application import Sphinx


def _rewrite(buttons, prefix: str, old: str, new: str) -> int:
    """Rewrite the Colab links in the (nested) header buttons; returns how many changed."""
    changed = 0
    if isinstance(buttons, dict):
        url = buttons.get("url")
        if isinstance(url, str) and url.startswith(prefix) and old in url:
            buttons["url"] = url.replace(old, new, 1)
            changed += 1
        for value in buttons.values():
            if isinstance(value, (list, dict)):
                changed += _rewrite(value, prefix, old, new)
    elif isinstance(buttons, list):
        for item in buttons:
            changed += _rewrite(item, prefix, old, new)
    return changed


def colab_launch_url(url: str, colab_url: str, branch: str, colab_branch: str) -> str:
    """``url`` with its branch replaced by ``colab_branch`` if it is a Colab launch URL."""
    buttons = {"url": url}
    _rewrite(buttons, colab_url.rstrip("/") + "/github/", f"/blob/{branch}/", f"/blob/{colab_branch}/")
    return buttons["url"]


def _page_context(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    colab_branch = app.config.deqlab_colab_branch
    options = app.config.html_theme_options or {}
    colab_url = (options.get("launch_buttons") or {}).get("colab_url", "")
    branch = options.get("repository_branch") or "master"  # the theme's own default
    if not colab_branch or not colab_url or "header_buttons" not in context:
        return
    _rewrite(context["header_buttons"], colab_url.rstrip("/") + "/github/", f"/blob/{branch}/",
             f"/blob/{colab_branch}/")


def setup(app: Sphinx) -> dict:
    app.add_config_value("deqlab_colab_branch", "colab", "html", types=[str])
    app.connect("html-page-context", _page_context, priority=502)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
