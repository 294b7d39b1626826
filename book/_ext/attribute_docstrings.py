"""Sphinx extension: a constant's or attribute's docstring is read as prose, not as ``type: text``.

Napoleon reads the first line of the docstring of a module constant, a class attribute or a
property as ``type: description`` when it has a colon outside inline code: ``"004 §4: inputs
corrupted by ..."`` was shown as a field "Type: 004 §4". Two hooks around napoleon's note such a
first line and put it back whole, dropping the type field napoleon made of it (napoleon cannot be
told not to split: it skips leading blank lines). Type hints still come from annotations.
"""

from __future__ import annotations

import re
from typing import Any

from sphinx.application import Sphinx

# A colon napoleon would split on: single (not ::), outside ``code`` and :role:`...` spans.
_CODE_OR_ROLE = re.compile(r"(:\w[\w:+.-]*:`[^`]*`|``[^`]*``|`[^`]*`)")
_SINGLE_COLON = re.compile(r"(?<!:):(?!:)")


def has_field_colon(line: str) -> bool:
    """True when napoleon would split ``line`` into a type and a description."""
    return bool(_SINGLE_COLON.search(_CODE_OR_ROLE.sub("", line)))


_PENDING: dict[str, str] = {}


def remember_first_line(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """Before napoleon: note a first line that napoleon will split."""
    first = next((line for line in lines if line.strip()), None)
    if what in ("attribute", "data", "property") and first is not None and has_field_colon(first):
        _PENDING[name] = first.strip()


def keep_as_prose(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """After napoleon: undo the split (a trailing ``:type: X`` field that came from the first line)."""
    first = _PENDING.pop(name, None)
    if first is None or not lines or not lines[-1].startswith(":type: "):
        return
    if not first.startswith(lines[-1][len(":type: "):].strip()):
        return
    del lines[-1]
    while lines and not lines[-1].strip():
        del lines[-1]
    index = next((i for i, line in enumerate(lines) if line.strip()), None)
    if index is None:
        lines.append(first)
    else:
        lines[index] = first


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("autodoc-process-docstring", remember_first_line, priority=400)  # napoleon's is 500
    app.connect("autodoc-process-docstring", keep_as_prose, priority=600)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
