"""Graders for the reader's code: run your function, compare it with ``deqlab``'s.

Each ``check_*`` function takes the function (or model) you wrote on a page, runs it on a few fixed,
seeded cases (ordinary ones and edge cases), compares what it returns with ``deqlab``'s reference
(its own implementation, a closed form, or a simulation with a tolerance set by its sample count),
and returns a :class:`Report`: one line per check, with the measured error, its tolerance and, when
the check fails, a hint aimed at the usual mistakes. The report prints well in a terminal, a
notebook and Colab; ``report.passed`` is a bool and ``report.raise_if_failed()`` raises
:class:`ExerciseFailed` listing the failed checks::

    from deqlab.lab import exercises
    exercises.check_solver(my_anderson, reference="anderson")      # chapter 0, page 2

The graders, by chapter (one module each; the calling conventions are those of the pages'
``reader-code`` cells, and each grader's docstring):

- chapter 0 (:mod:`.ch0`): :func:`check_layer`, :func:`check_weight_tied`, :func:`check_residual`,
  :func:`check_solver`, :func:`check_implicit_gradient`, :func:`check_classifier`,
  :func:`check_train_step`;
- chapter 1 (:mod:`.ch1`): :func:`check_length_trace` (page 3, ``my_length_trace(w0, V)``);
- chapter 2 (:mod:`.ch2`): :func:`check_stieltjes` (page 1, ``my_stieltjes(eigenvalues, z)``);
- chapter 3 (:mod:`.ch3`): :func:`check_mean_difference` (page 5, ``my_mean_difference(a, b)``),
  :func:`check_jacobian_penalty` (page 6, ``my_jacobian_penalty(f, z, key, n_probes)``);
- chapter 4 (:mod:`.ch4`): :func:`check_linear_deq` (page 2, ``my_linear_deq(K, Y, lam, depth)``);
- chapter 5 (:mod:`.ch5`): :func:`check_copy_memory` (page 2, ``my_copy_memory(key, batch_size,
  delay, memory, symbols)``), :func:`check_semi_orthogonal` (page 5, ``my_semi_orthogonal(key, rows,
  cols, scale)``), :func:`check_table1` (page 6, ``my_table1(rows)``).

A check never raises because your code does: an exception inside it is a failed check whose line
names the exception; a result of the wrong shape or dtype fails with a line that says what was
expected. A grader raises only for its own arguments (``TypeError`` when what you pass is not a
callable).

**Your own code, not deqlab's.** While a grader runs your function, the ``deqlab`` functions the
exercise asks you to reimplement (``freeprob.samples`` for :func:`check_stieltjes`,
``data.copy_memory`` for :func:`check_copy_memory`, ...; the list per grader is
``exercises._forbid.FORBIDDEN``) raise "you were asked to write this yourself": calling them fails
the checks. The graders' docstrings show how to call them, never an answer.

**Grading a class.** ``python -m deqlab.lab.exercises.grade SUBMISSION.ipynb ... --out results.csv``
executes student-edition notebooks in fresh kernels, scores every check cell against the grading
manifest that ``make student-edition`` writes (a deleted or edited check cell is a failure) and
exits non-zero when a check fails (:mod:`deqlab.lab.exercises.grade`).

**Time limit.** Every grader runs within a time limit (default :data:`TIME_LIMIT`, 300 s, or the
environment variable ``DEQLAB_GRADER_TIME_LIMIT``; per call ``check_solver(..., time_limit=60)``,
``time_limit=math.inf`` for none): code that never returns (a loop whose stopping test is never met)
makes the grader raise :class:`GraderTimeout`, naming the grader and the limit, instead of hanging
the notebook. The grader runs in a worker thread; at the limit a Python loop in it is interrupted,
while a compiled loop (``jax.lax.while_loop`` under ``jit``) cannot be and runs on in the background
until the kernel is restarted.
"""

from deqlab.lab.exercises._core import TIME_LIMIT, Check, ExerciseFailed, GraderTimeout, Report
from deqlab.lab.exercises.ch0 import (
    check_classifier,
    check_implicit_gradient,
    check_layer,
    check_residual,
    check_solver,
    check_train_step,
    check_weight_tied,
)
from deqlab.lab.exercises.ch1 import check_length_trace
from deqlab.lab.exercises.ch2 import check_stieltjes
from deqlab.lab.exercises.ch3 import check_jacobian_penalty, check_mean_difference
from deqlab.lab.exercises.ch4 import check_linear_deq
from deqlab.lab.exercises.ch5 import check_copy_memory, check_semi_orthogonal, check_table1

__all__ = [
    "Check",
    "Report",
    "ExerciseFailed",
    "GraderTimeout",
    "TIME_LIMIT",
    # chapter 0
    "check_layer",
    "check_weight_tied",
    "check_residual",
    "check_solver",
    "check_implicit_gradient",
    "check_classifier",
    "check_train_step",
    # chapters 1-5
    "check_length_trace",
    "check_stieltjes",
    "check_mean_difference",
    "check_jacobian_penalty",
    "check_linear_deq",
    "check_copy_memory",
    "check_semi_orthogonal",
    "check_table1",
]
