"""pyproject.toml, environment.yml and the CI floor pins must describe the same environment; the
Makefile, .ci/run and README.md the same commands."""

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

yaml = pytest.importorskip("yaml")  # pyyaml is in the `test` extra

ROOT = Path(__file__).resolve().parents[2]

# Extras mirrored in environment.yml. `peers` is deliberately left out of it (benchmarks only;
# environment.yml says so in a comment).
MIRRORED_EXTRAS = ("lab", "book", "test")
UNMIRRORED_EXTRAS = ("peers",)
FLOORED = ("jax", "flax", "optax", "numpy")


def _norm(name: str) -> str:
    # lower-case, and '-', '_', '.' equivalent (PEP 503)
    return canonicalize_name(name)


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pyproject_requirements() -> dict[str, Requirement]:
    project = _pyproject()["project"]
    reqs = list(project["dependencies"])
    for extra in MIRRORED_EXTRAS:
        reqs += project["optional-dependencies"][extra]
    out: dict[str, Requirement] = {}
    for line in reqs:
        req = Requirement(line)
        if _norm(req.name) == "deqlab":
            continue  # an extra that includes another one (deqlab[lab])
        assert _norm(req.name) not in out, f"{req.name} declared twice in pyproject.toml"
        out[_norm(req.name)] = req
    return out


def _conda_spec_to_requirement(spec: str) -> Requirement:
    # conda match specs: "python=3.11", "numpy >=1.26", "pip"
    m = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*(.*)", spec)
    assert m, spec
    name, version = m.groups()
    version = version.strip()
    if version and version[0] not in "<>=!~":
        version = "==" + version
    elif version.startswith("=") and not version.startswith("=="):
        version = "=" + version
    return Requirement(name + version)


def _environment() -> tuple[dict, dict[str, Requirement], dict[str, Requirement]]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda: dict[str, Requirement] = {}
    pip: dict[str, Requirement] = {}
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            for line in dep["pip"]:
                line = line.strip()
                if line.startswith(("-e ", "--editable")):
                    continue  # deqlab itself
                req = Requirement(line)
                assert _norm(req.name) not in pip, f"{req.name} twice in environment.yml"
                pip[_norm(req.name)] = req
        else:
            req = _conda_spec_to_requirement(dep)
            conda[_norm(req.name)] = req
    return env, conda, pip


def _env_requirements() -> dict[str, Requirement]:
    _, conda, pip = _environment()
    both = set(conda) & set(pip)
    assert not both, f"declared both as conda and pip packages: {sorted(both)}"
    merged = {**conda, **pip}
    # the interpreter and installer are not package requirements of deqlab
    merged.pop("python", None)
    merged.pop("pip", None)
    return merged


def test_environment_yml_shape():
    env, conda, pip = _environment()
    assert env["channels"] == ["conda-forge"]
    assert str(conda["python"].specifier) == "==3.11"
    assert "pip" in conda
    assert pip, "environment.yml has no pip: section"


def test_environment_installs_deqlab_itself():
    env, _, _ = _environment()
    pip_lines = [d for d in env["dependencies"] if isinstance(d, dict)][0]["pip"]
    assert any(line.strip() in ("-e .", "--editable .") for line in pip_lines)


def test_same_package_names():
    py, env = _pyproject_requirements(), _env_requirements()
    assert sorted(py) == sorted(env), (
        f"only in pyproject.toml: {sorted(set(py) - set(env))}; "
        f"only in environment.yml: {sorted(set(env) - set(py))}"
    )


def test_same_version_specifiers():
    py, env = _pyproject_requirements(), _env_requirements()
    for name in sorted(set(py) & set(env)):
        assert py[name].specifier == env[name].specifier, (
            f"{name}: pyproject.toml says {py[name].specifier or '(any)'}, "
            f"environment.yml says {env[name].specifier or '(any)'}"
        )


def _floor(req: Requirement) -> str:
    floors = [s.version for s in req.specifier if s.operator == ">="]
    assert len(floors) == 1, f"{req.name} must declare exactly one '>=' floor, has {req.specifier}"
    return floors[0]


@pytest.mark.parametrize("name", FLOORED)
def test_floors_declared_and_equal(name):
    py, env = _pyproject_requirements(), _env_requirements()
    assert name in py, f"{name} missing from pyproject.toml dependencies"
    assert name in env, f"{name} missing from environment.yml"
    assert _floor(py[name]) == _floor(env[name])


def test_floor_values():
    # The floors are a project decision (what Colab preinstalls): change them deliberately.
    py = _pyproject_requirements()
    assert {n: _floor(py[n]) for n in FLOORED} == {
        "jax": "0.7.2",
        "flax": "0.11.2",
        "optax": "0.2.6",
        "numpy": "2.0.2",
    }


def test_ci_floor_pins_match_pyproject():
    pins = {}
    for line in (ROOT / ".ci" / "floor-constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[_norm(req.name)] = spec.version
    py = _pyproject_requirements()
    for name in FLOORED:
        assert pins.get(name) == _floor(py[name]), f"{name}: CI floor pin differs from pyproject"
    assert pins.get("jaxlib") == pins["jax"], "jaxlib must be pinned to the jax floor"


def test_unmirrored_extras_are_absent_from_environment():
    # Documented choice: the `peers` extra is not part of environment.yml.
    project = _pyproject()["project"]
    env = _env_requirements()
    for extra in UNMIRRORED_EXTRAS:
        names = {_norm(Requirement(r).name) for r in project["optional-dependencies"][extra]}
        assert not names & set(env), f"extra {extra!r} is partly mirrored: {sorted(names & set(env))}"
    assert set(project["optional-dependencies"]) == set(MIRRORED_EXTRAS) | set(UNMIRRORED_EXTRAS)


# --- Makefile, .ci/run and README.md describe the same commands ---------------------------------


def _makefile() -> str:
    return (ROOT / "Makefile").read_text()


def _make_recipes() -> dict[str, str]:
    """Rule name -> its recipe (the tab-indented lines after `name: prerequisites`)."""
    recipes: dict[str, list[str]] = {}
    current = None
    for line in _makefile().splitlines():
        if line.startswith("\t") and current is not None:
            recipes[current].append(line.strip())
            continue
        m = re.match(r"^([A-Za-z][\w-]*)\s*:(?!=)", line)
        current = m.group(1) if m else None
        if current is not None:
            recipes.setdefault(current, [])
    return {name: "\n".join(lines) for name, lines in recipes.items()}


def _make_dry_run(*arguments: str) -> list[str]:
    """The pytest command lines `make -n ARGUMENTS` prints, variables expanded. The environment of an
    enclosing make (CI runs these tests inside `make test TIER=all`, whose command-line variables
    reach sub-makes through MAKEFLAGS) is left out, so only ARGUMENTS choose."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "TIER")}
    out = subprocess.run(["make", "-n", *arguments], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if "python -m pytest" in line]


def _selections(lines: list[str]) -> list[list[str]]:
    return [re.findall(r" -m (\"[^\"]*\"|\S+)", line.replace("python -m pytest", "")) for line in lines]


def _make_variable(name: str) -> str:
    m = re.search(rf"^{name}\s*[?:]?=\s*(.*)$", _makefile(), re.MULTILINE)
    assert m, f"Makefile does not set {name}"
    return m.group(1).strip()


def _ci() -> str:
    return (ROOT / ".ci" / "run").read_text()


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def test_make_targets_in_readme_and_help_exist():
    recipes = _make_recipes()
    phony = set(re.search(r"^\.PHONY:(.*)$", _makefile(), re.MULTILINE).group(1).split())
    in_help = set(re.findall(r"\bmake ([a-z][\w-]*)", recipes["help"]))
    in_readme = set(re.findall(r"`make ([a-z][\w-]*)", _readme()))
    assert phony <= set(recipes), f".PHONY names missing rules: {sorted(phony - set(recipes))}"
    assert in_help | {"help"} == phony, f"`make help` and .PHONY differ: {sorted(in_help ^ (phony - {'help'}))}"
    assert in_readme <= phony, f"README.md names unknown make targets: {sorted(in_readme - phony)}"
    for target in ("test", "unit", "lint", "book"):
        assert target in in_readme, f"README.md does not document `make {target}`"


def test_ci_runs_the_readme_test_command_after_install_and_lint():
    ci = _ci()
    assert re.findall(r"^make (\w[\w-]*)", ci, re.MULTILINE) == ["install", "lint", "test", "book", "colab-edition", "pdf"]
    # CI's test phase is the README's command with every unit test (TIER=all), in one session
    assert re.search(r'^make test TIER=all PYTHON="\$PYTHON" JOBS="\$JOBS" ', ci, re.MULTILINE)
    assert re.search(r"^phase_site\(\) \{\n  make site-check ", ci, re.MULTILINE)  # run by `background`
    # the phases in the order they start: `begin PHASE` in the foreground, `background JOB PHASE...`
    # beside the others (each job awaited, with the same phases, before anything that needs them)
    phases = [p for begun, job in re.findall(r"^(?:begin (\S+)|background (.+))$", ci, re.MULTILINE)
              for p in ([begun] if begun else job.split()[1:])]
    assert phases == ["install", "browser", "tex", "lint", "core", "floor-install", "test", "book", "colab", "site",
                      "pdf", "floor-test"]
    jobs = re.findall(r"^background (.+)$", ci, re.MULTILINE)
    assert sorted(jobs) == sorted(re.findall(r"^await (.+)$", ci, re.MULTILINE)), jobs
    assert ci.index("await environments") < ci.index("begin floor-test")  # the floors' environment first
    assert ci.index("background environments") > ci.index("begin install")
    # the numbered list in the header comment of .ci/run names the same phases in the same order
    assert re.findall(r"^#\s+\d+\.\s+(\S+)", ci, re.MULTILINE) == phases
    # README.md's set-up says `make test` is `pytest -n 2 --dist worksteal tests book -m "not slow and not
    # float64" --nbmake --overwrite`, then the float64 pass, and what TIER=all (CI) selects instead
    readme = " ".join(_readme().split())
    assert '`pytest -n 2 --dist worksteal tests book -m "not slow and not float64" --nbmake --overwrite`' in readme
    assert '`JAX_ENABLE_X64=1 pytest -n 2 --dist worksteal -p no:nbmake tests -m "float64 and not slow"`' in readme
    assert "`make test TIER=all`" in readme and '`-m "not float64"` and `-m float64`' in readme
    assert _make_variable("JOBS") == "2" and _make_variable("TIER") == "quick"
    test = _make_dry_run("test", "TIER=quick")[0]
    assert re.search(r'-m pytest -n 2 --dist worksteal tests book -m "not slow and not float64" --nbmake\b', test), test
    assert "--overwrite" in test
    assert "make lint" in readme and "`.ci/run`" in readme


def test_slow_tests_are_left_out_of_make_unit_only():
    pytest_cfg = _pyproject()["tool"]["pytest"]["ini_options"]
    assert any(m.startswith("slow:") for m in pytest_cfg["markers"])
    recipes = _make_recipes()
    # `make unit` and `make unit-all` run the two passes of `make test` (no worker switches x64):
    # unit-all selects everything, unit everything but the slow tests.
    for target, expected in (("unit", [['"not slow and not float64"'], ['"float64 and not slow"']]),
                             ("unit-all", [['"not float64"'], ["float64"]])):
        runs = [line for line in recipes[target].splitlines() if "python -m pytest" in line]
        assert all(re.search(r"-m pytest -n \$\(JOBS\) --dist worksteal (-p no:nbmake )?tests\b", line) for line in runs), runs
        chosen = [re.findall(r" -m (\"[^\"]*\"|\S+)", line.replace("python -m pytest", "")) for line in runs]
        assert chosen == expected, (target, chosen)
        assert runs[1].lstrip().startswith("JAX_ENABLE_X64=1 "), runs
        # no notebook is collected: nbmake's plugin (1.7 s a worker) is not loaded
        assert all("-p no:nbmake" in run for run in runs), runs
        assert "$$status -eq 0" in recipes[target] and "$$status64 -eq 0" in recipes[target], target
    # `make test` (the README's command) runs the quick tier in two passes, `-m "not slow and not
    # float64"` (with the notebooks), then `-m "float64 and not slow"` with x64 on from the start;
    # `make test TIER=all` (CI's test phase) every test in the same two passes, which together select
    # everything (issue 39's decision); another TIER is an error naming the valid ones; `make test`
    # fails when either pass fails. The floor phase runs the quick tier (the selections of `make
    # unit`) and every notebook's blank student edition, written just before (issue 41): the slow
    # tests run once, in the main phase.
    for tier, expected in (("quick", [['"not slow and not float64"'], ['"float64 and not slow"']]),
                           ("all", [['"not float64"'], ['"float64"']])):
        passes = _make_dry_run("test", f"TIER={tier}")
        assert len(passes) == 2, passes
        assert _selections(passes) == expected, (tier, passes)
        assert "--nbmake" in passes[0] and "--nbmake" not in passes[1], passes
        assert passes[1].lstrip().startswith("JAX_ENABLE_X64=1 "), passes
    wrong = subprocess.run(["make", "-n", "test", "TIER=slow"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")})
    assert wrong.returncode != 0 and "TIER must be quick" in wrong.stderr and "got 'slow'" in wrong.stderr, wrong.stderr
    assert "$$status -eq 0" in recipes["test"] and "$$status64 -eq 0" in recipes["test"]
    block = _ci().split("begin floor-test", 1)[1].split("\nend", 1)[0].replace("\\\n", " ")
    floor = [line for line in block.splitlines() if ".venv-floor/bin/python -m pytest" in line]
    assert len(floor) == 2 and ' tests "$STUDENT_FLOOR" ' in floor[0] and " tests -m " in floor[1], floor
    assert re.search(r'\.ci/student_edition\.py --out "\$STUDENT_FLOOR"', block), block
    assert "_build" not in block.split("STUDENT_FLOOR=", 1)[1].split()[0]  # nbmake skips _build/
    selections = [re.findall(r" -m (\"[^\"]*\"|\S+)", line.replace("python -m pytest", "")) for line in floor]
    assert selections == [['"not float64 and not slow"'], ['"float64 and not slow"']], selections
    assert "--nbmake" in floor[0] and floor[1].startswith("JAX_ENABLE_X64=1 "), floor
    readme = " ".join(_readme().split())
    assert '`pytest -n 2 --dist worksteal -p no:nbmake tests -m "not slow and not float64"`' in readme
    assert '`JAX_ENABLE_X64=1 pytest -n 2 --dist worksteal -p no:nbmake tests -m "float64 and not slow"`' in readme


def test_lint_is_ruff_with_the_pyproject_configuration():
    project = _pyproject()
    assert "ruff" in {_norm(Requirement(r).name) for r in project["project"]["optional-dependencies"]["test"]}
    ruff = project["tool"]["ruff"]
    assert ruff["target-version"] == "py311"
    assert {"E4", "E7", "E9", "F"} <= set(ruff["lint"]["select"])
    assert _make_recipes()["lint"] == "$(BIN)/ruff check ."


@pytest.mark.slow  # a second pytest process, which imports jax (about 5 s)
def test_pytest_finds_benchmarks_from_any_directory(tmp_path):
    # pyproject.toml puts the root on sys.path (rootdir-relative), so tests/library/test_benchmarks_smoke.py
    # imports the `benchmarks` package whatever the working directory.
    assert "." in _pyproject()["tool"]["pytest"]["ini_options"]["pythonpath"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    target = ROOT / "tests" / "library" / "test_benchmarks_smoke.py"
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", str(target)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "test_memory_benchmark_tiny" in res.stdout


def test_licences_and_citation_describe_this_release():
    import deqlab

    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0"
    for name in project["license-files"]:
        assert (ROOT / name).is_file(), f"licence file {name} named in pyproject.toml is missing"
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert "CC BY 4.0" in (ROOT / "LICENSE-BOOK.md").read_text()
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0"
    assert citation["version"] == deqlab.__version__, "bump CITATION.cff with deqlab.__version__"
    assert citation["license"] == project["license"]
    assert citation["repository-code"] == project["urls"]["Repository"]


def test_changelog_has_an_entry_for_this_release():
    """A release says what changed: CHANGELOG.md's newest entry is the current version, and every
    entry has a body."""
    import deqlab

    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (\d+\.\d+\.\d+)\s*$", text, re.MULTILINE)
    assert versions, "CHANGELOG.md has no '## <version>' entries"
    assert versions[0] == deqlab.__version__, (
        f"CHANGELOG.md's newest entry is {versions[0]}, deqlab is {deqlab.__version__}: add an entry")
    assert len(versions) == len(set(versions)), "a version appears twice in CHANGELOG.md"
    for version, body in zip(versions, re.split(r"^## \d+\.\d+\.\d+\s*$", text, flags=re.MULTILINE)[1:]):
        assert len(body.strip()) > 40, f"CHANGELOG.md: the entry for {version} is empty"
