"""Sphinx extension: pydata-sphinx-theme's version switcher, for the versions of the book's site.

The book workflow (.github/workflows/book.yml) publishes main at ``<baseurl>/dev/`` and each tag
``v<version>`` at ``<baseurl>/v<version>/``, with one ``<baseurl>/versions.json`` listing them
(.ci/versions.py writes it from the git tags) and a root ``index.html`` that redirects to the
latest release. This extension puts the theme's switcher (``version-switcher`` component,
pydata-sphinx-theme 0.17, which sphinx-book-theme 1.3 inherits) at the start of every page's
header, with

- ``json_url`` = ``deqlab_versions_json`` (default ``../versions.json``): a relative URL, which the
  theme resolves against the root of the version being read (``<baseurl>/dev/``), so that every
  version reads the one file at ``<baseurl>/versions.json``, and a local build served at ``/``
  reads ``/versions.json``; no network is needed at build time (``check_switcher`` off);
- ``version_match`` = ``deqlab_docs_version``, default the environment variable
  ``DEQLAB_DOCS_VERSION`` (the workflow sets ``v<version>`` for a tag), else ``dev``.

So that a local build (``make book``, the browser test) has a working switcher, the build writes
``versions.json`` at the root of its output, listing this version only, unless one is there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sphinx.application import Sphinx


def _configure(app: Sphinx, config) -> None:
    version = config.deqlab_docs_version or os.environ.get("DEQLAB_DOCS_VERSION", "") or "dev"
    config.deqlab_docs_version = version
    options = dict(config.html_theme_options or {})
    options["switcher"] = {"json_url": config.deqlab_versions_json, "version_match": version}
    options["check_switcher"] = False
    start = options.get("article_header_start", ["toggle-primary-sidebar.html"])
    if isinstance(start, str):
        start = [item.strip() for item in start.split(",") if item.strip()]
    if "version-switcher" not in start:
        start = [*start, "version-switcher"]
    options["article_header_start"] = start
    config.html_theme_options = options


def _local_versions_json(app: Sphinx, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    path = Path(app.outdir) / "versions.json"
    if not path.exists():
        version = app.config.deqlab_docs_version
        entry = {"name": f"{version} (this build)", "version": version, "url": "./"}
        path.write_text(json.dumps([entry], indent=1) + "\n", encoding="utf-8")


def setup(app: Sphinx) -> dict:
    app.add_config_value("deqlab_docs_version", "", "html", types=[str])
    app.add_config_value("deqlab_versions_json", "../versions.json", "html", types=[str])
    app.connect("config-inited", _configure, priority=900)
    app.connect("build-finished", _local_versions_json)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
