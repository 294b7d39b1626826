"""The library and the book's code are apart: dependencies flow one way.

The library (solvers, backward modes, precision, stability, ensembles, nn, theory) needs only the
core install (jax, flax, optax, numpy, scipy). The book's code (deqlab.lab: experiments, exercises,
data, stats) may import the library, never the reverse, and its dependencies (the
`lab` extra: matplotlib, tqdm, scikit-learn, pillow, sentencepiece, ...) are not loaded by
`import deqlab`. .ci/run also installs the core alone in a fresh environment and solves a DEQ there.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "deqlab"

#: The book's code, by module name (a package's submodules included).
BOOK_MODULES = ("deqlab.lab",)
#: Import names of the `lab` extra's packages and of the book's build tools.
BOOK_IMPORTS = ("matplotlib", "tqdm", "sklearn", "PIL", "sentencepiece", "datasets", "myst_nb", "jupyter_book")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_book(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in BOOK_MODULES)


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports, at any depth (function-level imports included)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return out


def test_the_library_imports_nothing_of_the_book():
    offences = []
    library = [p for p in PACKAGE.rglob("*.py") if not _is_book(_module_name(p))]
    assert len(library) > 20, "the library's modules were not found"
    for path in library:
        for line, name in _imports(path):
            if _is_book(name) or name.split(".")[0] in BOOK_IMPORTS:
                offences.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not offences, "the library imports the book's code or its dependencies:\n" + "\n".join(offences)


def test_import_deqlab_loads_nothing_of_the_book():
    script = (
        "import sys, json; import deqlab, deqlab.nn, deqlab.theory, deqlab.stability, deqlab.ensembles; "
        "print(json.dumps(sorted(sys.modules)))"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    loaded = json.loads(run.stdout.strip().splitlines()[-1])
    book = [m for m in loaded if _is_book(m) or m.split(".")[0] in BOOK_IMPORTS]
    assert not book, f"import deqlab loads the book's code or dependencies: {book}"
    assert not any(m.startswith("deqlab.lab") for m in loaded)
    assert "deqlab.solvers" in loaded and "deqlab.nn" in loaded  # the probe did import the library


def test_core_dependencies_are_the_library_s():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {Requirement(r).name for r in project["dependencies"]}
    assert core == {"jax", "flax", "optax", "numpy", "scipy"}, core
    extras = project["optional-dependencies"]
    lab = {Requirement(r).name for r in extras["lab"]}
    assert {"matplotlib", "tqdm", "scikit-learn", "pillow", "sentencepiece"} <= lab
    # the book's build and the tests include the book's code
    for extra in ("book", "test"):
        assert "deqlab[lab]" in extras[extra], f"extra {extra!r} must include deqlab[lab]"


def test_a_whole_solution_as_init_state_is_named_and_subpackages_load_on_access():
    """The shims of 0.5-0.7 (stub modules, removed keywords) are gone in 0.9 (CHANGELOG's migration
    table); an easy mistake still gets a message that says what to pass."""
    import jax.numpy as jnp
    import pytest

    import deqlab

    for module in ("experiments", "exercises", "data", "stats", "implicit"):
        with pytest.raises(ImportError):
            __import__(f"deqlab.{module}")
    with pytest.raises(ValueError, match=r"`init_state`.*got Solution \(pass its \.state\)"):
        previous = deqlab.solve(lambda z: 0.5 * z, jnp.ones(2))
        deqlab.solve(lambda z: 0.5 * z, jnp.ones(2), init_state=previous)
    # the library's subpackages are attributes of the package, loaded on first access
    assert deqlab.nn.DEQ is not None and deqlab.theory.linear is not None
