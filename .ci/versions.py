#!/usr/bin/env python3
"""Write the version list of the book's site (``versions.json``) and its root redirect from git tags.

Usage: python .ci/versions.py --out SITE [--base-url URL] [--repo .] [--dev dev]

The site publishes main at ``<base>/dev/`` and each release tag ``v<version>`` at
``<base>/v<version>/`` (.github/workflows/book.yml). This script writes into ``--out``:

- ``versions.json``, the list pydata-sphinx-theme's version switcher reads
  (book/_ext/version_switcher.py): ``dev`` first, then every release, newest first, each
  ``{"name", "version", "url"}``; the newest final release (no ``a``/``b``/``rc``/``dev`` part)
  is named ``v<version> (latest)`` and marked ``"preferred": true``;
- ``index.html``, which redirects the site's root to the latest release (to ``dev/`` before the
  first release).

Release tags are ``v`` followed by a PEP 440 release (``v0.7.0``, ``v1.0``, ``v1.1.0rc1``); other
tags are ignored and listed on stderr. ``--base-url`` defaults to ``html.baseurl`` of _config.yml.
Only the standard library is used (and git). Exit status 2 on bad usage.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELEASE_TAG = re.compile(r"^v(?P<release>\d+(?:\.\d+)*)(?:(?P<pre>a|b|rc)(?P<pre_n>\d+))?$")


def parse_tag(tag: str) -> tuple | None:
    """A sort key for a release tag (``v1.2.0rc1``), or None if ``tag`` is not one."""
    match = RELEASE_TAG.match(tag)
    if match is None:
        return None
    release = tuple(int(part) for part in match.group("release").split("."))
    release = release + (0,) * (4 - len(release)) if len(release) < 4 else release
    pre = match.group("pre")
    # a final release sorts after its pre-releases: a < b < rc < final
    stage = {"a": 0, "b": 1, "rc": 2, None: 3}[pre]
    return (release, stage, int(match.group("pre_n") or 0))


def is_final(tag: str) -> bool:
    key = parse_tag(tag)
    return key is not None and key[1] == 3


def build_versions(tags: list[str], base_url: str, dev: str = "dev") -> list[dict]:
    """The switcher's entries for ``tags`` (release tags only; the others are skipped).

    Args:
        tags: git tag names.
        base_url: the site's root URL (a trailing "/" is added if missing).
        dev: the folder of the main branch's build.

    Returns:
        ``dev`` first, then the releases newest first; the newest final release is "preferred".

    Raises:
        ValueError: if ``base_url`` is not an http(s) URL.
    """
    if not re.match(r"^https?://", base_url):
        raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
    base = base_url.rstrip("/") + "/"
    releases = sorted({t for t in tags if parse_tag(t) is not None}, key=parse_tag, reverse=True)
    latest = next((t for t in releases if is_final(t)), None)
    entries = [{"name": f"{dev} (main)", "version": dev, "url": f"{base}{dev}/"}]
    for tag in releases:
        entry = {"name": tag, "version": tag, "url": f"{base}{tag}/"}
        if tag == latest:
            entry["name"] = f"{tag} (latest)"
            entry["preferred"] = True
        entries.append(entry)
    return entries


def redirect_page(target: str) -> str:
    """An HTML page that sends the reader to ``target`` (a relative URL)."""
    url = html.escape(target, quote=True)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>Equilibrium</title>\n<meta http-equiv=\"refresh\" content=\"0; url={url}\">\n"
        f"<link rel=\"canonical\" href=\"{url}\">\n</head>\n<body>\n"
        f"<p>The book is at <a href=\"{url}\">{url}</a>.</p>\n</body>\n</html>\n"
    )


def git_tags(repo: Path) -> list[str]:
    """The tags of the git repository at ``repo``."""
    out = subprocess.run(["git", "-C", str(repo), "tag", "--list"], check=True, capture_output=True, text=True)
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def default_base_url(root: Path = ROOT) -> str | None:
    config = root / "_config.yml"
    if not config.exists():
        return None
    match = re.search(r"^\s+baseurl:\s*(\S+)\s*$", config.read_text(encoding="utf-8"), re.MULTILINE)
    return match.group(1).strip("\"'") if match else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the site's root folder")
    parser.add_argument("--base-url", default=None, help="the site's root URL (default: html.baseurl)")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the git repository (default: this one)")
    parser.add_argument("--dev", default="dev", help="the folder of main's build (default: dev)")
    args = parser.parse_args(argv)
    base_url = args.base_url or default_base_url()
    if not base_url:
        print("versions: no --base-url and no html.baseurl in _config.yml", file=sys.stderr)
        return 2
    try:
        tags = git_tags(args.repo)
        entries = build_versions(tags, base_url, args.dev)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        print(f"versions: cannot read the tags of {args.repo}: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"versions: {exc}", file=sys.stderr)
        return 2
    ignored = [t for t in tags if parse_tag(t) is None]
    if ignored:
        print(f"versions: not release tags (v<version>), ignored: {', '.join(ignored)}", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "versions.json").write_text(json.dumps(entries, indent=1) + "\n", encoding="utf-8")
    preferred = next((e for e in entries if e.get("preferred")), entries[0])
    (args.out / "index.html").write_text(redirect_page(f"{preferred['version']}/"), encoding="utf-8")
    print(f"[versions] {len(entries)} versions; the root redirects to {preferred['version']}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
