"""A pytest plugin that counts the XLA programs each test compiles (issue 39).

JAX reports every backend compilation as a monitoring event
(``/jax/core/compile/backend_compile_duration``, persistent-cache hits included, which it reports
separately as ``/jax/compilation_cache/cache_hits``). This plugin adds their count and seconds
to each test's report:

* ``item.user_properties`` gets ``compiles``, ``cache_hits`` and ``compile_seconds`` (so they
  appear in the JUnit XML of ``make test``);
* with ``DEQLAB_COMPILE_REPORT=path`` set, one JSON line per test is appended to ``path``
  (``nodeid``, ``compiles``, ``cache_hits``, ``compile_seconds``, ``seconds``): every xdist worker
  appends to the same file; ``make test-profile`` prints the top 20 from it
  (``.ci/test_profile.py``);
* the ``compile_counter`` fixture lets a test assert how many programs a block compiles, e.g.
  that an argument error is raised before anything is traced::

      def test_bad_tol_compiles_nothing(compile_counter):
          with compile_counter() as counted, pytest.raises(ValueError):
              deqlab.Picard(tol=-1.0)
          assert counted.programs == 0

``tests/conftest.py`` loads it; it is a module of its own so that it can also be loaded with
``-p compile_counter`` on an older checkout, to measure before and after a change.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

import jax
import pytest

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


class CompileTally:
    """Running totals of this process: programs compiled (or loaded from the persistent cache),
    persistent-cache hits among them, seconds spent."""

    def __init__(self):
        self.programs = 0
        self.cache_hits = 0
        self.seconds = 0.0

    def snapshot(self) -> tuple[int, int, float]:
        return self.programs, self.cache_hits, self.seconds


TALLY = CompileTally()


def _on_duration(event, duration, *args, **kwargs):  # the signature grew keyword metadata in jax 0.4.3x
    if event == COMPILE_EVENT:
        TALLY.programs += 1
        TALLY.seconds += float(duration)


def _on_event(event, *args, **kwargs):
    if event == CACHE_HIT_EVENT:
        TALLY.cache_hits += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration)
jax.monitoring.register_event_listener(_on_event)


class Counted:
    """What a block compiled: ``programs`` (compilations, cache hits included), ``cache_hits``,
    ``seconds``; filled in when the block exits."""

    programs = 0
    cache_hits = 0
    seconds = 0.0


@pytest.fixture
def compile_counter():
    """A context manager factory: ``with compile_counter() as counted: ...`` then read
    ``counted.programs`` (see the module docstring)."""

    @contextlib.contextmanager
    def count():
        counted = Counted()
        before = TALLY.snapshot()
        try:
            yield counted
        finally:
            after = TALLY.snapshot()
            counted.programs = after[0] - before[0]
            counted.cache_hits = after[1] - before[1]
            counted.seconds = after[2] - before[2]

    return count


def _since_start(item) -> tuple[int, int, float]:
    before, after = item.stash[_START][0], TALLY.snapshot()
    return after[0] - before[0], after[1] - before[1], after[2] - before[2]


_START = pytest.StashKey[tuple]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # Before the teardown report is made, so that the properties are in it (and in the JUnit XML).
    if call.when == "teardown" and _START in item.stash:
        programs, hits, compile_seconds = _since_start(item)
        item.user_properties.extend([("compiles", programs), ("cache_hits", hits),
                                     ("compile_seconds", round(compile_seconds, 3))])
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[_START] = (TALLY.snapshot(), time.perf_counter())
    yield
    (programs, hits, compile_seconds), seconds = _since_start(item), time.perf_counter() - item.stash[_START][1]
    path = os.environ.get("DEQLAB_COMPILE_REPORT")
    if path:
        line = json.dumps(dict(nodeid=item.nodeid, compiles=programs, cache_hits=hits,
                               compile_seconds=round(compile_seconds, 4), seconds=round(seconds, 4)))
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
