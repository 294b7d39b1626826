"""Answers kept from students: no grader's docstring (what ``help()`` and the API page show) holds an
answer that passes it, every docstring example runs, and calling the library's own function where an
exercise asks for one's own fails the grader with a message, the library restored afterwards."""

from __future__ import annotations

import ast
import doctest
import importlib
import re

import jax
import numpy as np
import pytest

from deqlab.lab import exercises
from deqlab.lab.exercises import _forbid, _key

GRADERS = [name for name in exercises.__all__ if name.startswith("check_")]
MODULES = [f"deqlab.lab.exercises.ch{i}" for i in range(6)]


def _examples(grader: str) -> str:
    doc = getattr(exercises, grader).__doc__ or ""
    return "\n".join(ex.source for ex in doctest.DocTestParser().get_examples(doc))


@pytest.mark.parametrize("grader", GRADERS)
def test_docstring_shows_the_call_and_defines_no_working_function(grader):
    source = _examples(grader)
    assert f"exercises.{grader}(" in source, f"{grader}: its example does not show the call"
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body[1:] if ast.get_docstring(node) else node.body
            assert len(body) == 1 and isinstance(body[0], ast.Raise), (
                f"{grader}: its example defines {node.name} with a body other than a stub's raise")
    assert "+SKIP" not in (getattr(exercises, grader).__doc__ or "")


def test_docstring_examples_run_and_no_example_passes_its_grader(monkeypatch):
    """Run every example (empty globals, float32, as tests/library/test_docstrings.py does), with each
    grader recording what it returned: no call passed, and every grader was called (or refused)."""
    calls: dict[str, list] = {name: [] for name in GRADERS}
    for name in GRADERS:
        original = getattr(exercises, name)

        def recording(*args, _original=original, _name=name, **kwargs):
            try:
                report = _original(*args, **kwargs)
            except Exception as error:  # refused (a TypeError, float64 needed): not a pass
                calls[_name].append(error)
                raise
            calls[_name].append(report)
            return report

        monkeypatch.setattr(exercises, name, recording)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    x64 = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    try:
        for module_name in MODULES:
            module = importlib.import_module(module_name)
            for test in doctest.DocTestFinder(exclude_empty=True).find(module, module_name, globs={}):
                runner.run(test)
    finally:
        jax.config.update("jax_enable_x64", x64)
    failed, attempted = runner.summarize(verbose=False)
    assert failed == 0 and attempted > 0, f"{failed} of {attempted} examples failed (output above)"
    for name, made in calls.items():
        assert made, f"{name}: its example does not call it"
        assert not any(getattr(result, "passed", False) for result in made), f"{name}: an example passes it"


@pytest.mark.slow  # runs ten graders on right answers: ~18 s on 2 cores
def test_the_key_passes_every_grader_it_answers():
    # slow ones that tests/lab/test_exercises.py grades with the same key answers: the Jacobian
    # penalty, chapter 0's implicit gradient (float64), classifier and training step
    covered = {"check_jacobian_penalty", "check_implicit_gradient", "check_classifier", "check_train_step"}
    for name, entry in _key.ANSWERS.items():
        if entry.grader in covered:
            continue
        report = entry.grade()
        assert report.passed, f"{name}: {report}"


def _library_answers():
    from deqlab import ensembles
    from deqlab.lab import data, stats
    from deqlab.lab.experiments import linear, practice
    from deqlab.lab.experiments.sequence import ensemble_study
    from deqlab.theory import freeprob, kglm

    def linear_deq(K, Y, lam, depth):  # deqlab's DEQ map (Gaussian family), iterated
        params = kglm.deq_parameters(K, None, lam)
        path = [np.zeros_like(Y)]
        for _ in range(depth):
            path.append(np.asarray(kglm.deq_map(path[-1], params, Y, kglm.gaussian())))
        return np.stack(path)

    def mean_difference(a, b):
        (ma, sa), (mb, sb) = stats.mean_se(a), stats.mean_se(b)
        return ma - mb, np.hypot(sa, sb)

    return {
        "check_layer": lambda z, W, U, b, x: practice.tanh_map(z, W, U, b, x),
        "check_residual": lambda fz, z: __import__("deqlab").solvers.relative_residual(fz, z),
        "check_length_trace": lambda w0, V: linear.trace_sweep("gaussian", w0, [V])[0],
        "check_stieltjes": lambda e, z: freeprob.samples(e).stieltjes(z),
        "check_mean_difference": mean_difference,
        "check_jacobian_penalty": lambda f, z, key, n: __import__("deqlab").stability.jacobian_penalty(
            f, z, key=key, n_probes=n),
        "check_linear_deq": linear_deq,
        "check_copy_memory": lambda key, b, t, m, s: data.copy_memory(key, batch_size=b, delay=t, memory=m,
                                                                      symbols=s),
        "check_semi_orthogonal": lambda key, rows, cols, scale: ensembles.initializer("orthogonal", scale)(
            key, (rows, cols)),
        "check_table1": lambda rows: {(s["ensemble"], s["sqrt_v"]): (s["min_perplexity"], s["mean_perplexity"])
                                      for s in ensemble_study.summarize(rows)},
    }


@pytest.mark.parametrize("grader", sorted(_library_answers()))
def test_calling_the_library_reference_fails_with_a_message_and_the_reference_is_restored(grader):
    answer = _library_answers()[grader]
    report = getattr(exercises, grader)(answer)
    assert not report.passed
    assert re.search(r"your code called deqlab\.\S+: you were asked to write this yourself", str(report)), str(report)
    # outside the grader the library works again
    for target in _forbid.FORBIDDEN[grader]:
        owner, attribute, value = _forbid._resolve(target)
        assert "ReferenceBlocked" not in value.__code__.co_names, target
    if grader == "check_stieltjes":
        from deqlab.theory import freeprob

        assert complex(freeprob.samples([1.0, 2.0]).stieltjes(1j)) == pytest.approx(-0.45 - 0.35j)


def test_every_grader_lists_its_forbidden_references_and_they_exist():
    assert sorted(_forbid.FORBIDDEN) == sorted(GRADERS)
    for targets in _forbid.FORBIDDEN.values():
        for target in targets:
            _forbid._resolve(target)  # raises if it names nothing


def test_an_alias_imported_before_grading_is_blocked_too():
    from deqlab.theory.freeprob import samples  # a name of the reader's own namespace

    report = exercises.check_stieltjes(lambda e, z: samples(e).stieltjes(z))
    assert not report.passed and "you were asked to write this yourself" in str(report)
    # G(z) = (1 + M(z)) / z through the moment generating function of the same class (an
    # instructor's dry run found this way around the block)
    from deqlab.theory.freeprob import PointMasses

    report = exercises.check_stieltjes(lambda e, z: (1 + PointMasses(e).mgf(z)) / np.asarray(z))
    assert not report.passed and "PointMasses.mgf" in str(report)


def test_a_call_that_outlives_its_time_limit_leaves_no_reference_blocked():
    import time

    from deqlab.theory import freeprob

    def hangs(e, z):
        time.sleep(30)

    with pytest.raises(exercises.GraderTimeout):
        exercises.check_stieltjes(hangs, time_limit=0.5)
    assert complex(freeprob.samples([1.0, 2.0]).stieltjes(1j)) == pytest.approx(-0.45 - 0.35j)
    assert exercises.check_stieltjes(_key.my_stieltjes).passed
