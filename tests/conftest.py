"""Shared pytest set-up for the unit tests.

* **float32 by default, float64 where a test asks.** The tests run in JAX's default precision,
  float32, the precision users run (no global ``jax_enable_x64``). A test that needs float64 (a
  numerical check whose tolerance float32 cannot meet: closed forms of the theory, implicit
  gradients against finite differences, convergence to 1e-10, ...) says so with the marker
  ``@pytest.mark.float64``, or a whole module with ``pytestmark = pytest.mark.float64`` (the theory
  modules, by convention). The marker enables x64 around the test's whole run protocol (set-up,
  call and teardown, so module-scoped fixtures built for a marked test are float64 too) and
  restores the previous setting afterwards. JAX keys its jit caches on the x64 flag, so a function
  compiled in one mode is not reused in the other. Arrays built at import time (module
  constants) are float32 even in a marked module: build them inside the test or a fixture, or
  give them an explicit NumPy float64 dtype. A float32 test that could have passed only by
  accident in float64 states its tolerance from float32's precision (eps = 2**-23 ~ 1.2e-7).
  ``test_default_precision_is_float32`` and ``test_float64_marker_enables_x64`` check both ways.
  Do not call ``jax.config.update("jax_enable_x64", ...)`` at module level: it would leak into
  every later test of the worker. Notebooks run by nbmake execute in their own kernels, in float32.
* Matplotlib uses the non-interactive Agg backend in this process only: the variable
  MPLBACKEND is deliberately not set, because the notebook kernels that nbmake starts inherit the
  environment, and under Agg their figures would silently not be rendered.
* **Unit tests compile without LLVM's optimisations and with XLA's older fusion emitters.**
  Compiling is most of a unit test's time (``make test-profile``): thousands of small programs,
  many of them single operations run eagerly. This process appends two flags to ``XLA_FLAGS``
  before JAX starts its backend (the persistent cache keys programs by ``XLA_FLAGS``, so they never
  mix with programs compiled with the defaults): ``--xla_backend_optimization_level=0`` (LLVM's
  optimisation passes, which speed up the program's run, not its result's meaning; a unit test's
  run is shorter by about a quarter on the 2-core machine) and ``--xla_cpu_use_fusion_emitters=false``
  (XLA's CPU backend emits fused elementwise code with its older emitters, which compile a small
  program in about half the time). The generated code may round differently (no fused
  multiply-adds, other polynomial kernels): a test comparing two different programs states a
  tolerance for that, not bit equality. The notebooks are not unit tests: readers run them with
  JAX's defaults, so nbmake's kernels start with the ``XLA_FLAGS`` this process was given (a
  plugin registered below restores it while a notebook runs). ``DEQLAB_TEST_XLA_DEFAULTS=1`` keeps
  XLA's defaults everywhere (to check a rounding-level failure against what users run); a flag the
  run was given (``XLA_FLAGS=--xla_backend_optimization_level=2 make unit``) is kept. XLA aborts
  on a flag it does not know: should a jaxlib drop the emitters' flag, every test process stops at
  start with ``Unknown flag in XLA_FLAGS: --xla_cpu_use_fusion_emitters=false``; remove it from
  ``UNIT_TEST_XLA_FLAGS`` (or run with ``DEQLAB_TEST_XLA_DEFAULTS=1``). Measured
  (2026-12-01, 2-core machine, cold ``make unit``'s two passes): both flags 118.2 s idle (143.5 s
  with other work running) against 183.1 and 177.9 s with level 0 alone (1,994 + 493 tests passed
  in each; warm 88.6 against 98.1 s); 362
  single-operation programs compiled in 4.8-5.4 s against 11.5-11.9 s (and 8.6 against 12.8 s on
  the floors' jaxlib 0.7.2, which has the flag). Level 1 instead of 0 made the quick float32 pass slower (113 s
  against 101 s, one run each); level 1 for the notebooks cut their summed time by 7 % (632 s
  against 679 s, two at a time) but changed glued numbers other than timings on 7 of the 31 pages
  (in the 15th digit on two; a final training loss by 3.6x on chapter 5 page 2, where training
  amplifies a rounding difference), so they keep the defaults.
* Hypothesis: no per-example deadline (the first example of a jitted function pays the
  compilation); on CI (``CI`` set) examples are derandomised so runs are reproducible.
"""

import contextlib
import json
import os
import re

# XLA_FLAGS as the run was started with, kept in the environment: pytest-xdist's workers inherit
# the controller's environment, where this file has already added the unit tests' flags.
if "DEQLAB_GIVEN_XLA_FLAGS" not in os.environ:
    os.environ["DEQLAB_GIVEN_XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "<unset>")
#: XLA_FLAGS as the run was started with (None: unset), restored for the notebooks' kernels.
GIVEN_XLA_FLAGS = None if os.environ["DEQLAB_GIVEN_XLA_FLAGS"] == "<unset>" else os.environ["DEQLAB_GIVEN_XLA_FLAGS"]
#: What the unit tests add to XLA_FLAGS (see the docstring); a flag the run was given is not overridden.
UNIT_TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def unit_test_xla_flags(given):
    """``XLA_FLAGS`` for the unit tests: ``given`` (None: unset) with each of
    :data:`UNIT_TEST_XLA_FLAGS` whose flag ``given`` does not already set appended (flags are
    compared by name, whole tokens: ``--name=value``)."""
    names = {token.split("=", 1)[0] for token in (given or "").split()}
    return " ".join([given or "", *(flag for flag in UNIT_TEST_XLA_FLAGS if flag.split("=", 1)[0] not in names)]).strip()


if not os.environ.get("DEQLAB_TEST_XLA_DEFAULTS"):
    # before anything starts JAX's backend, which reads XLA_FLAGS once (see the docstring)
    os.environ["XLA_FLAGS"] = unit_test_xla_flags(GIVEN_XLA_FLAGS)

import matplotlib  # noqa: E402

matplotlib.use("Agg")

import jax  # noqa: E402
import pytest  # noqa: E402

# Programs compiled per test: JUnit properties, DEQLAB_COMPILE_REPORT lines, the compile_counter
# fixture (tests/compile_counter.py; `make test-profile`).
pytest_plugins = ["compile_counter"]

try:
    from hypothesis import settings
except ImportError:  # hypothesis is in the `test` extra; keep plain pytest usable without it
    pass
else:
    settings.register_profile("deqlab", deadline=None, print_blob=True)
    settings.register_profile("deqlab-ci", deadline=None, print_blob=True, derandomize=True)
    settings.load_profile("deqlab-ci" if os.environ.get("CI") else "deqlab")


# --- Collecting a test module leaves the environment as it was -------------------------------
# The notebooks' kernels and the tests' subprocesses inherit this process's environment. A
# benchmark module removed JAX_COMPILATION_CACHE_DIR on import, so in every run that collected it
# (`make test`, CI) each notebook ran without JAX's persistent cache: never a cache hit, not even
# on CI's kept cache. The environment is recorded here, before any test module is imported, and
# compared after collection (test_collecting_the_tests_leaves_the_environment_as_it_was).
ENVIRONMENT_BEFORE_COLLECTION = dict(os.environ)
#: Set by a library on import, as in any process that imports it: scikit-learn's OpenMP settings.
ENVIRONMENT_SET_BY_LIBRARIES = frozenset({"KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"})
#: Names whose value changed, appeared or disappeared while the test modules were collected (None
#: until collection has finished: a check that reads it before then, or without this hook, fails).
ENVIRONMENT_CHANGED_BY_COLLECTION: list | None = None


def pytest_collection_finish(session):
    before, now = ENVIRONMENT_BEFORE_COLLECTION, os.environ
    global ENVIRONMENT_CHANGED_BY_COLLECTION
    ENVIRONMENT_CHANGED_BY_COLLECTION = environment_changes(before, now)


def environment_changes(before, now) -> list:
    """Names whose value differs between two environments, apart from :data:`ENVIRONMENT_SET_BY_LIBRARIES`."""
    return sorted(name for name in (set(before) | set(now)) - ENVIRONMENT_SET_BY_LIBRARIES
                  if before.get(name) != now.get(name))


@contextlib.contextmanager
def float64_enabled():
    """JAX's x64 mode on inside the block, the previous setting restored after (works on every
    supported JAX: ``jax.experimental.enable_x64`` is gone from recent releases)."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


@contextlib.contextmanager
def given_xla_flags():
    """``XLA_FLAGS`` as this process was given it inside the block (a notebook's kernel starts with
    JAX's defaults, not the unit tests' flags), the unit tests' value restored after."""
    unit_tests = os.environ.get("XLA_FLAGS")
    _set_env("XLA_FLAGS", GIVEN_XLA_FLAGS)
    try:
        yield
    finally:
        _set_env("XLA_FLAGS", unit_tests)


def _set_env(name, value):
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


class NotebooksWithGivenXlaFlags:
    """A plugin, not a hook of this file: a conftest's item hooks only see the items under its
    folder (tests/), and the notebooks are collected from book/."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        if not _is_notebook(item):
            yield
            return
        with given_xla_flags():
            yield


def pytest_configure(config):
    config.pluginmanager.register(NotebooksWithGivenXlaFlags(), "deqlab-notebooks-with-given-xla-flags")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Tests marked ``float64`` run (set-up, call, teardown) with x64 enabled (the notebooks run
    with the ``XLA_FLAGS`` this process was given: :class:`NotebooksWithGivenXlaFlags`); see the
    docstring."""
    if item.get_closest_marker("float64") is None:
        yield
        return
    with float64_enabled():
        yield


# --- Notebooks first; slow by measurement --------------------------------------------------------
# `make test` runs ~2,500 items on two xdist workers with `--dist worksteal` (Makefile): each
# worker starts on a contiguous part of the collected order and an idle worker takes the end of the
# other's queue. The notebooks take 10-90 s each and were collected last, so the run ended with one
# worker finishing a long notebook while the other idled; they are moved to the front (in their
# collected order), so the run ends on short unit tests. No stored table of durations is needed
# for that (tests/durations.json, which ordered every file by its measured time, is retired).
# Unit tests that took at least 3 s in the last measured `make test TIER=all` (or a cold `make unit`), or
# at least 0.4 s in a warm `make unit`, are marked `slow`, so
# that `make unit` (the quick inner loop) and `make test` leave them out; `make test TIER=all`,
# `make unit-all` and CI run every test. Their node ids (tests/slow.json) are generated from the
# JUnit reports of a `make test TIER=all` on a cold compilation cache, never edited by hand:
# `python .ci/test_durations.py` (the script says why cold). Without the table only the tests marked in their files are slow.

HERE = os.path.dirname(__file__)


def _load(name: str, default):
    """A generated table, or ``default`` when it is missing, not JSON or of another type (a broken
    table must not stop the tests; tests/book/test_test_durations.py checks the stored one)."""
    try:
        with open(os.path.join(HERE, name), encoding="utf-8") as fh:
            table = json.load(fh)
    except (OSError, ValueError):
        return default
    return table if isinstance(table, type(default)) else default


def _is_notebook(item) -> bool:
    # by the file, not the node id (a notebook outside the root directory has none before "::")
    return str(getattr(item, "path", "")).endswith(".ipynb")


# --- The float64 pass imports only the files that hold float64 tests ----------------------------
# The second pass of `make unit` / `make test` (`-m "float64 ..."`, x64 on) selects about a fifth of
# the tests, from 30 of 80 files; collecting every file cost each worker the imports and the
# module-level set-up of all of them. A test is marked float64 only by writing `pytest.mark.float64`
# (on the test, a `pytest.param` or `pytestmark`), so a file without that text cannot hold one and is
# not imported. `pytest_collection_modifyitems` below checks this premise in the float32 pass, which
# collects every file: a float64 test in a file without the text is recorded in MISPLACED_FLOAT64,
# and tests/book/test_test_durations.py fails, naming it (a test's failure, not an error raised in
# the hook: under pytest-xdist that would end the run with an internal error that hides the message).
FLOAT64_TEXT = "mark.float64"
MISPLACED_FLOAT64: list = []


def _float64_pass(config) -> bool:
    """Whether ``-m`` selects float64 tests only: ``float64``, or ``float64 and ...`` without ``or``
    or parentheses (``float64 or slow`` selects tests of other files too, which must be collected)."""
    words = re.findall(r"\w+|[()]", config.getoption("markexpr") or "")
    return (words[:1] == ["float64"] and (len(words) == 1 or words[1] == "and")
            and "or" not in words and "(" not in words)


def pytest_ignore_collect(collection_path, config):
    if (collection_path.suffix == ".py" and collection_path.name.startswith("test_") and _float64_pass(config)
            and FLOAT64_TEXT not in collection_path.read_text(encoding="utf-8")):
        return True
    return None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the measured `slow` marks must be on the items
def pytest_collection_modifyitems(session, config, items):
    slow = {node for node in _load("slow.json", []) if isinstance(node, str)}
    texts: dict = {}
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)
        path = getattr(item, "path", None)
        if item.get_closest_marker("float64") is not None and path is not None and path.suffix == ".py":
            if path not in texts:
                texts[path] = FLOAT64_TEXT in path.read_text(encoding="utf-8")
            if not texts[path] and item.nodeid not in MISPLACED_FLOAT64:
                MISPLACED_FLOAT64.append(item.nodeid)
    # list.sort is stable: the notebooks keep their order, and so do the unit tests (a file's tests
    # stay together, so its module fixtures are built once per worker).
    items.sort(key=lambda item: not _is_notebook(item))
