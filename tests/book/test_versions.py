"""The site's version list (.ci/versions.py): versions.json from git tags and the root redirect."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE = "https://deqlab.github.io/equilibrium/"


def _load_script():
    spec = importlib.util.spec_from_file_location("versions", ROOT / ".ci" / "versions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


versions = _load_script()


def test_releases_newest_first_and_the_latest_final_release_preferred():
    tags = ["v0.6.0", "v0.10.0", "v0.7.0", "v1.0.0rc1", "v0.9", "nightly", "v0.7.0-fix"]
    entries = versions.build_versions(tags, BASE)
    assert [e["version"] for e in entries] == ["dev", "v1.0.0rc1", "v0.10.0", "v0.9", "v0.7.0", "v0.6.0"]
    # numeric, not lexical order (v0.10.0 after v0.9), a pre-release is never "latest"
    preferred = [e for e in entries if e.get("preferred")]
    assert [e["version"] for e in preferred] == ["v0.10.0"]
    assert preferred[0]["name"] == "v0.10.0 (latest)"
    assert entries[0] == {"name": "dev (main)", "version": "dev", "url": BASE + "dev/"}
    assert all(e["url"] == f"{BASE}{e['version']}/" for e in entries)


def test_no_release_yet_has_dev_only():
    entries = versions.build_versions(["nightly"], BASE.rstrip("/"))
    assert entries == [{"name": "dev (main)", "version": "dev", "url": BASE + "dev/"}]


@pytest.mark.parametrize("tag", ["v1.0.0rc1", "v1.0.0", "v1.0.0b2", "v1"])
def test_tag_order_within_a_release(tag):
    order = ["v1.0.0b2", "v1.0.0rc1", "v1"]
    keys = [versions.parse_tag(t) for t in order]
    assert keys == sorted(keys)
    assert versions.parse_tag(tag) is not None
    assert versions.parse_tag("v1") == versions.parse_tag("v1.0.0")


def test_bad_base_url_is_refused():
    with pytest.raises(ValueError, match="base_url must be an http"):
        versions.build_versions(["v1.0"], "deqlab.github.io/equilibrium")


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"})


def test_script_writes_versions_json_and_redirect_from_git_tags(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "f").write_text("x")
    _git(repo, "add", "f")
    _git(repo, "commit", "-qm", "c")
    for tag in ("v0.6.0", "v0.7.0", "v0.8.0rc1", "not-a-release"):
        _git(repo, "tag", tag)
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, str(ROOT / ".ci" / "versions.py"), "--out", str(site),
                             "--base-url", BASE, "--repo", str(repo)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "not-a-release" in result.stderr
    entries = json.loads((site / "versions.json").read_text())
    assert [e["version"] for e in entries] == ["dev", "v0.8.0rc1", "v0.7.0", "v0.6.0"]
    index = (site / "index.html").read_text()
    assert 'url=v0.7.0/"' in index and 'href="v0.7.0/"' in index


def test_script_without_releases_redirects_to_dev(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, str(ROOT / ".ci" / "versions.py"), "--out", str(site),
                             "--repo", str(repo)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert 'url=dev/"' in (site / "index.html").read_text()
    # the default base URL is the site's, from _config.yml
    assert json.loads((site / "versions.json").read_text())[0]["url"] == BASE + "dev/"


def test_script_on_a_folder_that_is_no_repository_fails_with_a_message(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / ".ci" / "versions.py"), "--out", str(tmp_path / "s"),
                             "--base-url", BASE, "--repo", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 2 and "cannot read the tags" in result.stderr
