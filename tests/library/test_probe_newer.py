"""Probe of the newer public surfaces with bad inputs (issue "[15/19]", item 6): nn (language model,
sequence cells, baselines, normalisation), stability, data, sweep and checkpoints, the CLI,
the graders and precision. Every bad call gives a clear error naming the argument, or reports the
failure; none is silent, none is unclear, none hangs.

Issue "[24/25] Every fault signalled" adds the surfaces added since: the claims machinery of
``deqlab.lab.stats`` (``holm``, ``paired_permutation_test``, ``studentized_interval``,
``claims_verdicts``), ``deqlab.lab.experiments.power``, ``ensemble_study.check_claims``, the chapter 5
graders (a bad submission is a failed check with a message, never a crash of the grader), the grading
command ``python -m deqlab.lab.exercises.grade`` (exit 2 naming the argument, before any notebook
runs) and ``nn.TransformerCell``'s newer arguments. Rows marked ``# was SILENT`` / ``# was UNCLEAR``
failed when written and were fixed in the library.

The table and its runner are those of ``tests/library/test_probe.py`` (one row: callable, bad input,
expected error type, message regexes naming the argument and the valid range); probes already
there or in the per-module tests are not repeated.
"""

from __future__ import annotations

import collections
import functools
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from deqlab import nn, precision, stability
from deqlab.lab import data, exercises, stats
from deqlab.lab.exercises import _manifest, grade
from deqlab.lab.experiments import power, sweep
from deqlab.lab.experiments.sequence import ensemble_study
from deqlab.nn import baselines, normalization, transformer, trellis
from tests.library.test_probe import INF, NAN, E, Probe, R, _run

MODULES = ("nn", "nn.normalization", "stability", "data", "sweep", "cli", "exercises", "precision", "solvers",
           "eager", "stats", "power", "ensemble_study", "grade", "nn.transformer")

KEY = jax.random.key(0)


def _rngs():
    return nnx.Rngs(0)


def _trellis():
    return nn.TrellisCell(4, 3, rngs=_rngs())


def _lm(depth=2):
    return nn.LanguageModel(5, _trellis(), depth=depth, rngs=_rngs())


def _tokens(*ids):
    return jnp.asarray([ids], jnp.int32)


def _traced_lm_logits(*ids):
    """The LanguageModel under jit, where ids cannot be read: an out-of-range id gives NaN logits."""
    return nnx.jit(lambda m, t: m(t)[0])(_lm(), _tokens(*ids))


def _closed_over_lm_logits(*ids):
    """The LanguageModel under jit with the ids closed over (concrete: they can be checked)."""
    tokens = _tokens(*ids)
    return nnx.jit(lambda m: m(tokens)[0])(_lm())


def _dense():
    return nnx.Linear(3, 3, rngs=_rngs())


def _tmp() -> Path:
    return Path(tempfile.mkdtemp(prefix="deqlab-probe-"))


def _checkpoints_with_step(step=1):
    ckpt = sweep.Checkpoints(_tmp(), max_to_keep=3)
    ckpt.save(step, {"a": jnp.ones(3)})
    return ckpt


def _cli(*argv):
    return ensemble_study.main(list(argv))


def _solve_with(solver, **options):
    import deqlab

    return deqlab.solve(lambda z: 0.5 * z + 1.0, jnp.zeros(3), solver=solver, **options)


def _solve_without_fixed_point(solver, **options):
    import deqlab

    return deqlab.solve(lambda z: z + 1.0, jnp.zeros(3), solver=solver, on_failure="ignore", **options)


def _hooked(propose=None, init=None):
    """A Solver of one's own whose ``propose`` / ``init`` make the given mistake."""
    import deqlab

    class Mistaken(deqlab.Solver):
        def init(self, z, fz):
            return init(z, fz) if init else ()

        def propose(self, z, fz, state):
            return propose(z, fz, state) if propose else (fz, state)

    return Mistaken()


class _Setting:
    scale = 0.5


def _class_attribute_read_twice():
    import deqlab

    f = lambda z: _Setting.scale * z + 1.0  # noqa: E731
    first = deqlab.solve(f, jnp.zeros(2), solver=deqlab.Picard(max_steps=500)).value
    _Setting.scale = 0.75
    try:
        return first, deqlab.solve(f, jnp.zeros(2), solver=deqlab.Picard(max_steps=500)).value
    finally:
        _Setting.scale = 0.5


def _cache_under_jit_with_index_minus_one():
    cache = nn.FixedPointCache.create(3, (2,)).update(jnp.array([2]), jnp.ones((1, 2)))
    looked = jax.jit(lambda c, i: c.lookup(i))(cache, jnp.array([-1]))
    updated = jax.jit(lambda c, i: c.update(i, 5.0 * jnp.ones((1, 2))))(cache, jnp.array([-1]))
    return looked, updated


def _deterministic_deq_twice():
    layer = nn.DEQ(nn.TanhCell(8, 3, dropout=0.5, rngs=_rngs()), deterministic=True)
    x = jnp.ones((2, 3))
    return layer(x), layer(x)


def _z():
    return jnp.ones(3)


# --------------------------------------------------------------------------------------------- claims (issue 24)


def _diff(x):
    """Condition 1's mean minus condition 0's, vectorised over a (b, units, conditions) batch."""
    return x[..., 1].mean(-1) - x[..., 0].mean(-1)


_TABLE = np.array([[0.1, 0.9], [-0.4, 0.7], [0.3, 0.2], [1.2, 1.9], [0.5, 0.8], [-0.2, 0.6]])


def _ppt(table=_TABLE, statistic=_diff, **kw):
    return stats.paired_permutation_test(table, statistic, **kw)


def _si(table=_TABLE, statistic=_diff, **kw):
    return stats.studentized_interval(table, statistic, **{"resamples": 99, **kw})


def _verdicts(*claims, **kw):
    return stats.claims_verdicts(list(claims), **kw)


def _claim(**kw):
    return power.analyse_claim(kw.pop("claim", "b below a"), kw.pop("a", [1.0, 2.0, 3.0]),
                               kw.pop("b", [0.5, 1.4, 2.6]),
                               **{"paper_effect": 0.2, "paper_source": "made up", "measure": "error", **kw})


_STEPS = [0, 16, 32, 48, 64, 80, 96, 112, 128]
_LEVELLED = [4.8, 4.0, 3.8, 3.7, 3.65, 3.62, 3.61, 3.60, 3.60]


def _study_rows(seeds=3, **override):
    """per_seed_rows of a tiny study: every ensemble and sqrt(V), ``seeds`` seeds, levelled curves."""
    return [{**dict(ensemble=e, sqrt_v=v, seed=s, test_perplexity=60.0 + s + 0.1 * len(e), eval_steps=_STEPS,
                    test_loss_curve=_LEVELLED, diverged=False, solver_failed=False, solver_stopped_step=None),
             **override} for e in ensemble_study.ENSEMBLES for v in ensemble_study.SQRT_V for s in range(seeds)]


def _check_claims(*rows, **kw):
    """check_claims on the given rows (the tiny study's when none are given), 99 resamples."""
    return ensemble_study.check_claims(rows[0] if rows else _study_rows(), **{"resamples": 99, **kw})


def _without(key):
    return [{k: v for k, v in r.items() if k != key} for r in _study_rows()]


def _page(claim):
    return claim["kind"] == "page"


# --------------------------------------------------------------------------------------------- graders (chapter 5)


def _failed_with_messages(report):
    """A bad submission: the grader returned a failed Report whose failed lines all say something."""
    return isinstance(report, exercises.Report) and not report.passed and all(c.hint or c.note for c in report.failed)


def _exit(*_):
    sys.exit(3)


def _overflowing(rows):
    return {(r["ensemble"], r["sqrt_v"]): (10**400, 1.0) for r in rows}


# --------------------------------------------------------------------------------------------- grading command


@functools.lru_cache(maxsize=None)
def _course() -> dict[str, str]:
    """A one-page course: a submission (its check cell calls check_table1), its manifest, and broken variants."""
    import nbformat

    folder = _tmp()
    nb = nbformat.v4.new_notebook()
    for i, source in enumerate(["def my_table1(rows):\n    raise NotImplementedError",
                                "from deqlab.lab import exercises\nexercises.check_table1(my_table1)"]):
        cell = nbformat.v4.new_code_cell(source)
        cell["id"] = f"cell-{i}"
        nb.cells.append(cell)
    nb.metadata["deqlab_student_edition"] = {"source": "book/chX/01_page.ipynb"}
    nbformat.write(nb, str(folder / "alice.ipynb"))
    manifest = _manifest.build({"chX/01_page.ipynb": nb})
    (folder / "manifest.json").write_text(json.dumps(manifest))
    no_checks = json.loads(json.dumps(manifest))
    del no_checks["pages"]["chX/01_page.ipynb"]["checks"]
    (folder / "no_checks.json").write_text(json.dumps(no_checks))
    one_string = json.loads(json.dumps(manifest))
    one_string["pages"]["chX/01_page.ipynb"]["checks"][0]["graders"] = "check_table1"
    (folder / "graders_string.json").write_text(json.dumps(one_string))
    (folder / "junk.ipynb").write_text("this is not JSON")
    (folder / "list.ipynb").write_text("[]")
    (folder / "a_file").write_text("x")
    (folder / "results.csv").mkdir()
    return {name: str(folder / name) for name in ("alice.ipynb", "manifest.json", "no_checks.json",
                                                   "graders_string.json", "junk.ipynb", "list.ipynb", "a_file",
                                                   "results.csv")} | {"folder": str(folder)}


def _grade(*argv, manifest="manifest.json"):
    """``grade.main`` on the course's submission (``{alice.ipynb}`` etc. name the course's files)."""
    course = _course()
    argv = [a.format(**{k.replace(".", "_"): v for k, v in course.items()}) for a in argv]
    return grade.main(argv + ["--manifest", course[manifest]])


def _grade_module(*argv):
    """``python -m deqlab.lab.exercises.grade`` in a subprocess; its stderr and exit status are passed on.

    Pass ``--manifest``: the default one (``_build/student/``) exists only after ``make student-edition``,
    which a clean clone has not run."""
    done = subprocess.run([sys.executable, "-m", "deqlab.lab.exercises.grade", *argv], capture_output=True, text=True,
                          timeout=120, cwd=str(Path(__file__).resolve().parents[2]))
    sys.stderr.write(done.stderr)
    raise SystemExit(done.returncode)


# --------------------------------------------------------------------------------------------- TransformerCell


def _transformer(**kw):
    return nn.TransformerCell(8, 3, heads=2, rngs=_rngs(), **kw)


def _seq(width, length=5):
    return jnp.zeros((1, length, width))


PROBES: list[Probe] = [
    # ----------------------------------------------------------------------------- nn (lm, cells, baselines)
    E("lm-token-negative", "nn", lambda: _lm()(_tokens(0, -1)), "tokens", valid=r"in \[0, vocab_size\) = \[0, 5\)"),
    E("lm-token-at-vocab-size", "nn", lambda: _lm()(_tokens(0, 5)), "tokens", valid=r"\[0, 5\)"),
    E("lm-token-closed-over-by-jit", "nn", lambda: _closed_over_lm_logits(0, 7), "tokens", valid=r"\[0, 5\)"),
    R("lm-token-out-of-range-under-jit", "nn", lambda: _traced_lm_logits(0, -1),
      check=lambda logits: bool(jnp.all(jnp.isnan(logits[0, 1]))) and bool(jnp.all(jnp.isfinite(logits[0, 0])))),
    E("lm-tokens-list-of-floats", "nn", lambda: _lm()([[0.5, 1.0]]), "tokens", valid=r"integer token ids"),
    E("lm-vocab-size-huge", "nn", lambda: nn.LanguageModel(10**12, _trellis(), rngs=_rngs()), "vocab_size",
      valid=r"<= 2147483647"),
    E("lm-vocab-size-string", "nn", lambda: nn.LanguageModel("10", _trellis(), rngs=_rngs()), "vocab_size"),
    E("lm-cell-none", "nn", lambda: nn.LanguageModel(5, None, rngs=_rngs()), "cell", valid=r"must be a sequence cell"),
    E("lm-embedding-std-zero", "nn", lambda: nn.LanguageModel(5, _trellis(), embedding_std=0.0, rngs=_rngs()),
      "embedding_std"),
    E("lm-loss-target-negative", "nn", lambda: nn.lm_loss(_lm(), _tokens(0, 1), _tokens(0, -1)), "targets",
      valid=r"\[0, 5\)"),
    E("lm-loss-target-shape", "nn", lambda: nn.lm_loss(_lm(), _tokens(0, 1), _tokens(0)), "targets",
      valid=r"shape of `tokens`"),
    E("solver-stats-nothing", "nn", lambda: nn.solver_stats(), "re:`solution`.*`trace`", valid=r"exactly one"),
    E("shard-batch-scalar", "nn", lambda: nn.shard_batch(nn.data_mesh(), np.float32(1)), "arrays",
      valid=r"leading batch axis"),
    E("alibi-slopes-zero-heads", "nn", lambda: transformer.alibi_slopes(0), "heads", valid=r">= 1"),
    E("causal-conv-dilation-zero", "nn", lambda: trellis.causal_conv(jnp.zeros((1, 5, 3)), jnp.zeros((2, 3, 4)), 0),
      "dilation", valid=r">= 1"),
    E("causal-conv-kernel-channels", "nn",
      lambda: trellis.causal_conv(jnp.zeros((1, 5, 3)), jnp.zeros((2, 5, 4)), 1), "kernel", valid=r"C_in = 3"),
    E("width-for-parameters-make-int", "nn", lambda: baselines.width_for_parameters(3, 100, [2, 4]), "make",
      valid=r"callable"),
    # ----------------------------------------------------------------------------- nn.normalization
    E("spectral-norm-power-steps-zero", "nn.normalization",
      lambda: normalization.SpectralNorm(_dense(), power_steps=0, rngs=_rngs()), "power_steps", valid=r">= 1"),
    E("spectral-norm-rngs-int", "nn.normalization", lambda: normalization.SpectralNorm(_dense(), rngs=0), "rngs",
      valid=r"nnx.Rngs"),
    E("spectral-norm-update-negative", "nn.normalization",
      lambda: normalization.SpectralNorm(_dense(), rngs=_rngs()).update(-1), "steps", valid=r">= 0"),
    E("spectral-norm-zero-padded-too-large", "nn.normalization",
      lambda: normalization.SpectralNorm(nnx.Conv(3, 4, kernel_size=(3, 3), rngs=_rngs()), exact=True,
                                         input_shape=(32, 32), rngs=_rngs()), "layer",
      valid=r"padding='CIRCULAR'.*MAX_DENSE_CONV_INPUT"),
    E("spectral-norm-input-shape-int", "nn.normalization",
      lambda: normalization.SpectralNorm(nnx.Conv(3, 4, kernel_size=(3, 3), padding="CIRCULAR", rngs=_rngs()),
                                         exact=True, input_shape=4, rngs=_rngs()), "input_shape",
      valid=r"\(h, w\)"),
    R("spectral-norm-zero-kernel-stays-zero", "nn.normalization",
      lambda: normalization.SpectralNorm(nnx.Linear(3, 3, kernel_init=nnx.initializers.zeros, rngs=_rngs()),
                                         exact=True, rngs=_rngs()).kernel(),
      check=lambda k: bool(jnp.all(k == 0))),
    # ----------------------------------------------------------------------------- stability
    E("jacobian-penalty-scalar-f", "stability", lambda: stability.jacobian_penalty(jnp.sum, _z(), key=KEY), "f",
      valid=r"must be a map returning a pytree of the structure and shapes of `z`"),
    E("jacobian-penalty-tuple-f", "stability", lambda: stability.jacobian_penalty(lambda z: (z, z), _z(), key=KEY),
      "f", valid=r"structure and shapes of `z`"),
    E("jacobian-penalty-f-none", "stability", lambda: stability.jacobian_penalty(None, _z(), key=KEY), "f",
      valid=r"callable"),
    E("jacobian-penalty-f-wrong-arity", "stability",
      lambda: stability.jacobian_penalty(lambda z: z, _z(), 1.0, key=KEY), "f",
      valid=r"could not be evaluated as f\(z, \*args\)"),
    E("jacobian-penalty-z-python-floats", "stability",
      lambda: stability.jacobian_penalty(lambda z: z, [1.0, 2.0], key=KEY), "z", valid=r"not Python numbers"),
    E("spectral-radius-shape-changing-f", "stability",
      lambda: stability.spectral_radius(lambda z: z[:2], _z(), key=KEY), "f", valid=r"shapes \(and dtypes\)"),
    E("spectral-radius-dtype-changing-f", "stability",
      lambda: stability.spectral_radius(lambda z: z.astype(jnp.float16), _z(), key=KEY), "f",
      valid=r"dtypes"),
    E("spectral-radius-int-key", "stability", lambda: stability.spectral_radius(lambda z: z, _z(), key=0), "key",
      valid=r"not an int seed"),
    # ----------------------------------------------------------------------------- data
    E("lm-windows-negative-ids", "data", lambda: data.lm_windows(np.arange(100) - 50, 10), "ids", valid=r">= 0"),
    E("encode-text-one-string", "data",
      lambda: data.encode_text(data.text_tokenizer(["abc"], kind="char"), "abc"), "paragraphs",
      valid=r"list of strings"),
    E("encode-text-no-tokenizer", "data", lambda: data.encode_text("char", ["abc"]), "tokenizer",
      valid=r"text_tokenizer"),
    E("char-decode-id-out-of-range", "data", lambda: data.text_tokenizer(["abc"], kind="char").decode([999]), "ids",
      valid=r"\[0, 5\)"),
    E("char-decode-negative-id", "data", lambda: data.text_tokenizer(["abc"], kind="char").decode([-1]), "ids",
      valid=r"\[0, 5\)"),
    E("lm-batches-1d-windows", "data", lambda: data.lm_batches(np.arange(10), 2, KEY), "windows", valid=r"2-d"),
    # ----------------------------------------------------------------------------- sweep and checkpoints
    E("checkpoints-second-save-of-a-step", "sweep", lambda: _checkpoints_with_step(1).save(1, {"a": jnp.zeros(3)}),
      "step", valid=r"> 1, the newest step saved"),
    E("checkpoints-save-step-float", "sweep", lambda: _checkpoints_with_step(1).save(2.5, {"a": jnp.zeros(3)}),
      "step", valid=r"integer >= 0"),
    E("checkpoints-save-state-strings", "sweep", lambda: _checkpoints_with_step(1).save(2, {"a": "x"}), "state",
      valid=r"pytree of arrays"),
    E("checkpoints-restore-missing-step", "sweep", lambda: _checkpoints_with_step(1).restore({"a": jnp.ones(3)}, 5),
      "step", valid=r"a saved step \(one of \[1\]"),
    R("checkpoints-restore-other-template", "sweep",
      lambda: _checkpoints_with_step(1).restore({"b": jnp.ones(4)}, 1), raises=sweep.CheckpointError,
      match=r"step 1 in .*`template` does not have the structure"),
    E("checkpoints-directory-is-a-file", "sweep", lambda: sweep.Checkpoints(__file__), "directory",
      valid=r"must be a directory"),
    E("run-sweep-directory-is-a-file", "sweep",
      lambda: sweep.run_sweep(lambda c: {"b": 1}, [{"a": 1}], __file__, progress=False), "directory",
      valid=r"must be a directory"),
    E("run-sweep-checkpoints-string", "sweep",
      lambda: sweep.run_sweep(lambda c: {"b": 1}, [{"a": 1}], _tmp(), checkpoints="yes", progress=False),
      "checkpoints", valid=r"True or False"),
    E("run-sweep-configs-one-dict", "sweep",
      lambda: sweep.run_sweep(lambda c: {"b": 1}, {"a": 1}, _tmp(), progress=False), "configs",
      valid=r"list of dicts"),
    E("run-sweep-result-not-json", "sweep",
      lambda: sweep.run_sweep(lambda c: {"b": object()}, [{"a": 1}], _tmp(), progress=False), "fn",
      valid=r"JSON-able results"),
    # ----------------------------------------------------------------------------- CLI (argparse: exit 2)
    E("cli-sqrt-v-negative", "cli", lambda: _cli("--out", str(_tmp()), "--sqrt-v", "-1", "--seeds", "1"),
      "re:--sqrt-v", valid=r"must be finite numbers >= 0", exc=SystemExit),
    E("cli-sqrt-v-nan", "cli", lambda: _cli("--out", str(_tmp()), "--sqrt-v", "nan", "--seeds", "1"),
      "re:--sqrt-v", valid=r">= 0", exc=SystemExit),
    E("cli-out-is-a-file", "cli", lambda: _cli("--out", __file__, "--seeds", "1"), "re:--out",
      valid=r"must be a directory", exc=SystemExit),
    E("cli-seeds-zero", "cli", lambda: _cli("--out", str(_tmp()), "--seeds", "0"), "re:--seeds", valid=r">= 1",
      exc=SystemExit),
    # ----------------------------------------------------------------------------- exercises (graders)
    E("grader-time-limit-zero", "exercises", lambda: exercises.check_residual(lambda fz, z: z, time_limit=0),
      "time_limit", valid=r"> 0"),
    E("grader-time-limit-nan", "exercises", lambda: exercises.check_layer(lambda *a: a, time_limit=NAN),
      "time_limit", valid=r"finite real number > 0"),
    R("grader-student-never-returns", "exercises",
      lambda: exercises.check_weight_tied(lambda *a: _forever(), time_limit=0.5), raises=exercises.GraderTimeout,
      match=r"exercises.check_weight_tied did not finish within its time limit of 0.5 s"),
    # ----------------------------------------------------------------------------- precision
    E("default-tol-none", "precision", lambda: precision.default_tol(None), "dtype",
      valid=r"real floating-point dtype.*None is not a dtype"),
    E("attainable-tol-none", "precision", lambda: precision.attainable_tol(None), "dtype", valid=r"floating-point"),
    E("working-dtype-none", "precision", lambda: precision.working_dtype(None), "dtype", valid=r"floating-point"),
    E("working-dtype-int", "precision", lambda: precision.working_dtype(jnp.int32), "dtype", valid=r"floating-point"),
    E("emulate-matmuls-string", "precision", lambda: precision.emulate_accelerator_matmuls("yes").__enter__(),
      "enabled", valid=r"True or False"),
    # ----------------------------------------------------------------------------- solvers (0.9: budgets, hooks)
    E("budget-max-steps-float", "solvers",
      lambda: _solve_with(_picard(50), budget=_budget(2.7, 1e-5)), "budget.max_steps", valid=r"an integer"),
    E("budget-tol-none", "solvers", lambda: _solve_with(_picard(50), budget=_budget(jnp.int32(5), None)),
      "budget.tol", valid=r"make_budget"),
    R("budget-max-steps-past-int32-is-clipped", "solvers",
      lambda: _solve_without_fixed_point(_picard(50), budget=_budget(np.int64(2**32 + 3), 1e-5)),
      check=lambda sol: int(sol.stats.steps) == 50),
    E("hook-propose-wrong-shape", "solvers", lambda: _solve_with(_hooked(propose=lambda z, fz, s: (fz[:1], s))),
      r"re:Mistaken\.propose\(z, fz, state\)", valid=r"z's shape \(3,\)", exc=TypeError),
    E("hook-propose-bare-array", "solvers", lambda: _solve_with(_hooked(propose=lambda z, fz, s: fz)),
      r"re:Mistaken\.propose", valid=r"a pair \(z_next, state\)", exc=TypeError),
    E("hook-propose-other-dtype", "solvers",
      lambda: _solve_with(_hooked(propose=lambda z, fz, s: (fz.astype(jnp.float16), s))),
      r"re:Mistaken\.propose", valid=r"dtype float32", exc=TypeError),
    E("hook-propose-state-dtype", "solvers",
      lambda: _solve_with(_hooked(init=lambda z, fz: jnp.zeros(3), propose=lambda z, fz, s: (fz, s.astype(jnp.int32)))),
      r"re:Mistaken\.propose", valid=r"structure, shapes and dtypes it was given", exc=TypeError),
    E("hook-init-string-leaf", "solvers", lambda: _solve_with(_hooked(init=lambda z, fz: "state")),
      r"re:Mistaken\.init", valid=r"pytree of arrays", exc=TypeError),
    # ----------------------------------------------------------------------------- eager cache, nn (0.9)
    R("eager-class-attribute-changed", "eager", _class_attribute_read_twice,
      check=lambda pair: abs(float(pair[0][0]) - 2.0) < 1e-3 and abs(float(pair[1][0]) - 4.0) < 1e-3),
    R("eager-module-attribute-is-keyed", "eager",
      lambda: deqlab_eager()._captured(lambda z: _Setting.scale * z),
      check=lambda key: any(item == (float, 0.5) for item in key)),
    R("eager-uncacheable-attribute-warns", "eager",
      lambda: _solve_with_list_attribute(), warns=UserWarning, match=r"runs uncached"),
    R("fixed-point-cache-index-minus-one-under-jit", "nn", _cache_under_jit_with_index_minus_one,
      check=lambda out: bool(jnp.all(out[0] == 0)) and bool(jnp.all(out[1].values[2] == 1.0))
      and not bool(out[1].filled[0])),
    R("deq-built-deterministic-draws-no-mask", "nn", _deterministic_deq_twice,
      check=lambda pair: bool(jnp.array_equal(pair[0], pair[1]))),
    R("resnet-cell-dropout-rate", "nn", lambda: nn.ResNetCell(8, 3, dropout=0.1, rngs=_rngs()),
      check=lambda cell: cell.dropout is not None and cell.dropout.rate == 0.1),
    # ----------------------------------------------------------------------------- stats: the claims machinery
    E("holm-string", "stats", lambda: stats.holm("0.01 0.04"), "p_values", valid=r"1-d array of numbers in \[0, 1\]"),  # was UNCLEAR
    E("holm-dict", "stats", lambda: stats.holm({"a": 0.01}), "p_values", valid=r"\[0, 1\]"),  # was UNCLEAR
    E("holm-ragged", "stats", lambda: stats.holm([0.01, [0.02, 0.03]]), "p_values", valid=r"1-d array"),  # was UNCLEAR
    E("holm-nan", "stats", lambda: stats.holm([0.01, NAN]), "p_values", valid=r"\[0, 1\]"),
    E("holm-above-one", "stats", lambda: stats.holm([0.5, 1.5]), "p_values", valid=r"\[0, 1\]"),
    E("permutation-table-strings", "stats", lambda: _ppt([["a", "b"], ["c", "d"]]), "table",
      valid=r"2-d array of numbers"),  # was UNCLEAR
    E("permutation-table-one-condition", "stats", lambda: _ppt(np.ones((5, 1))), "table", valid=r"2 conditions"),
    E("permutation-statistic-not-vectorised", "stats",
      lambda: _ppt(statistic=lambda x: float(x[0, :, 1].mean() - x[0, :, 0].mean())), "statistic",
      valid=r"vectorised function mapping a \(b, units, conditions\) batch to \(b,\)"),  # was UNCLEAR
    E("permutation-statistic-per-unit", "stats", lambda: _ppt(statistic=lambda x: x.mean(-1)), "statistic",
      valid=r"to \(b,\)"),  # was UNCLEAR
    E("permutation-statistic-none", "stats", lambda: _ppt(statistic=None), "statistic", valid=r"a function"),
    E("permutation-resamples-zero", "stats", lambda: _ppt(resamples=0), "resamples", valid=r">= 99"),
    E("permutation-seed-negative", "stats", lambda: _ppt(key_or_seed=-1), "key_or_seed",
      valid=r"an int seed >= 0"),  # was UNCLEAR
    E("permutation-seed-float", "stats", lambda: _ppt(key_or_seed=1.5), "key_or_seed", valid=r"JAX PRNG key"),
    E("permutation-groups-empty", "stats", lambda: _ppt(groups=[]), "groups", valid=r"non-empty list"),  # was SILENT
    E("permutation-groups-float-index", "stats", lambda: _ppt(groups=[[0.5, 1]]), "groups",
      valid=r"integer column indices"),  # was SILENT
    E("permutation-groups-bools", "stats", lambda: _ppt(groups=[[True, False]]), "groups",
      valid=r"integer column indices"),  # was SILENT
    E("permutation-groups-names", "stats", lambda: _ppt(groups=[["a", "b"]]), "groups",
      valid=r"integer column indices"),  # was UNCLEAR
    E("permutation-groups-flat", "stats", lambda: _ppt(groups=[0, 1]), "groups", valid=r"lists of at least 2"),
    E("permutation-groups-out-of-range", "stats", lambda: _ppt(groups=[[0, 2]]), "groups", valid=r"in \[0, 2\)"),
    E("permutation-groups-overlap", "stats", lambda: _ppt(np.ones((4, 3)), groups=[[0, 1], [1, 2]]), "groups",
      valid=r"disjoint"),
    R("permutation-all-nan-table-tests-nothing", "stats", lambda: _ppt(np.full((4, 2), NAN)),
      check=lambda r: np.isnan(r["estimate"]) and r["p_greater"] == r["p_less"] == 1.0),  # was SILENT (p = 0)
    R("permutation-inf-in-table-tests-nothing", "stats", lambda: _ppt([[1.0, INF], [2.0, 3.0], [3.0, 4.0]]),
      check=lambda r: r["p_greater"] == r["p_less"] == 1.0),  # was SILENT (p_greater = 0)
    R("permutation-nan-relabellings-count-as-extreme", "stats",
      lambda: _ppt([[NAN, 1.0], [0.0, 2.0], [0.5, 0.7]], lambda x: x[..., 1].mean(-1) - np.nanmean(x[..., 0], -1)),
      check=lambda r: (r["p_greater"], r["p_less"]) == (5 / 8, 1.0)),  # was SILENT (p_greater 1/8: NaN not extreme)
    E("studentized-two-units", "stats", lambda: _si(_TABLE[:2]), "table", valid=r"at least 3 units"),
    E("studentized-confidence-percent", "stats", lambda: _si(confidence=95), "confidence", valid=r"< 1"),
    E("studentized-statistic-scalar", "stats", lambda: _si(statistic=lambda x: 1.0), "statistic",
      valid=r"to \(b,\)"),  # was UNCLEAR
    E("studentized-standard-error-per-unit", "stats", lambda: _si(standard_error=lambda x: x.std(-1)),
      "standard_error", valid=r"to \(b,\) standard errors"),  # was UNCLEAR
    E("studentized-standard-error-negative", "stats",
      lambda: _si(standard_error=lambda x: -np.ones(x.shape[0])), "standard_error",
      valid=r"standard errors >= 0"),  # was SILENT (lo > hi)
    E("studentized-standard-error-name", "stats", lambda: _si(standard_error="jackknife"), "standard_error",
      valid=r"None or a function"),
    E("verdicts-claims-none", "stats", lambda: stats.claims_verdicts(None), "claims",
      valid=r"a sequence of dicts"),  # was UNCLEAR
    E("verdicts-claims-one-dict", "stats", lambda: stats.claims_verdicts({"p_for": 0.01, "p_against": 0.9}),
      "claims", valid=r"a sequence of dicts"),
    E("verdicts-p-string", "stats", lambda: _verdicts({"p_for": "0.01", "p_against": 0.9}), "claims",
      valid=r"numbers in \[0, 1\]"),  # was UNCLEAR
    E("verdicts-p-none", "stats", lambda: _verdicts({"p_for": None, "p_against": 0.9}), "claims",
      valid=r"numbers in \[0, 1\]"),  # was UNCLEAR
    E("verdicts-p-array", "stats", lambda: _verdicts({"p_for": np.array([0.01, 0.02]), "p_against": 0.9}),
      "claims", valid=r"numbers in \[0, 1\]"),  # was UNCLEAR
    E("verdicts-p-bool", "stats", lambda: _verdicts({"p_for": True, "p_against": False}), "claims",
      valid=r"numbers in \[0, 1\]"),  # was SILENT
    E("verdicts-p-nan", "stats", lambda: _verdicts({"p_for": NAN, "p_against": 0.9}), "claims",
      valid=r"\[0, 1\]"),
    E("verdicts-unknown-verdict", "stats", lambda: _verdicts({"verdict": "Holds"}), "claims",
      valid=r"one of \('holds'"),
    E("verdicts-testable-string", "stats", lambda: _verdicts({"testable": "no", "reason": "r"}), "claims",
      valid=r"True or False"),
    E("verdicts-alpha-one", "stats", lambda: _verdicts({"p_for": 0.01, "p_against": 0.9}, alpha=1.0), "alpha",
      valid=r"< 1"),
    R("verdicts-fixed-verdicts-kept", "stats", lambda: _verdicts(*({"verdict": v} for v in stats.VERDICTS)),
      check=lambda out: [c["verdict"] for c in out] == list(stats.VERDICTS) and out[0]["family_size"] == 0),
    # ----------------------------------------------------------------------------- experiments.power
    E("t-power-paired-string", "power", lambda: power.t_test_power(0.5, 1.0, 10, paired="no"), "paired",
      valid=r"True .* or False"),  # was SILENT ("no" is truthy: paired)
    E("t-power-paired-none", "power", lambda: power.t_test_power(0.5, 1.0, 10, paired=None), "paired",
      valid=r"True .* or False"),  # was SILENT (unpaired)
    E("t-power-sd-zero", "power", lambda: power.t_test_power(0.5, 0.0, 10, paired=True), "sd", valid=r"> 0"),
    E("t-power-one-seed", "power", lambda: power.t_test_power(0.5, 1.0, 1, paired=True), "n", valid=r">= 2"),
    E("t-power-alpha-percent", "power", lambda: power.t_test_power(0.5, 1.0, 10, paired=True, alpha=5), "alpha",
      valid=r"< 1"),
    E("t-power-effect-nan", "power", lambda: power.t_test_power(NAN, 1.0, 10, paired=True), "effect",
      valid=r"finite"),
    E("seeds-for-power-paired-string", "power", lambda: power.seeds_for_power(0.5, 1.0, paired="yes"), "paired",
      valid=r"True .* or False"),  # was SILENT
    E("seeds-for-power-percent", "power", lambda: power.seeds_for_power(0.5, 1.0, paired=True, power=80), "power",
      valid=r"< 1"),
    E("seeds-for-power-below-alpha", "power", lambda: power.seeds_for_power(0.5, 1.0, paired=True, power=0.01),
      "power", valid=r"> 0.05"),
    E("seeds-for-power-zero-effect", "power", lambda: power.seeds_for_power(0.0, 1.0, paired=True), "effect",
      valid=r"non-zero"),
    E("seeds-for-power-max-one", "power", lambda: power.seeds_for_power(0.5, 1.0, paired=True, max_seeds=1),
      "max_seeds", valid=r">= 2"),
    E("effect-for-power-paired-string", "power", lambda: power.effect_for_power(1.0, 10, paired="x"), "paired",
      valid=r"True .* or False"),  # was SILENT
    E("effect-for-power-unreachable", "power", lambda: power.effect_for_power(1.0, 2, paired=True, alpha=1e-300),
      "power", valid=r"reachable at level alpha"),  # was UNCLEAR (named `effect`, which was not passed)
    R("effect-for-power-subnormal-sd", "power", lambda: power.effect_for_power(1e-320, 10, paired=True),
      check=lambda e: abs(e / 1e-320 - power.effect_for_power(1.0, 10, paired=True)) < 1e-2),  # was UNCLEAR (xtol)
    E("effect-for-power-power-one", "power", lambda: power.effect_for_power(1.0, 10, paired=True, power=1.0),
      "power", valid=r"< 1"),
    E("analyse-claim-strings", "power", lambda: _claim(a=["a", "b"], b=["c", "d"]), "a",
      valid=r"1-d array of at least 2 per-seed numbers"),  # was UNCLEAR
    E("analyse-claim-lengths-differ", "power", lambda: _claim(b=[0.5, 1.4]), "b", valid=r"as many per-seed values"),
    E("analyse-claim-nan-seed", "power", lambda: _claim(a=[1.0, NAN, 3.0]), "a", valid=r"without NaN"),
    E("analyse-claim-claim-none", "power", lambda: _claim(claim=None), "claim", valid=r"a string"),  # was SILENT
    E("analyse-claim-paired-string", "power", lambda: _claim(paired="no"), "paired",
      valid=r"True .* or False"),  # was SILENT
    E("analyse-claim-bootstrap-seed-negative", "power", lambda: _claim(bootstrap_seed=-1), "bootstrap_seed",
      valid=r">= 0"),  # was UNCLEAR
    E("analyse-claim-bootstrap-seed-string", "power", lambda: _claim(bootstrap_seed="x"), "bootstrap_seed",
      valid=r">= 0"),  # was UNCLEAR (named stats' `key_or_seed`)
    E("analyse-claim-family-zero", "power", lambda: _claim(family=0), "family", valid=r">= 1"),
    E("analyse-claim-identical-seeds", "power", lambda: _claim(b=[1.0, 2.0, 3.0]), "a",
      valid=r"differences vary"),
    E("claims-from-raw-none", "power", lambda: power.claims_from_raw(None), "raw", valid=r"a dict"),  # was UNCLEAR
    E("claims-from-raw-list", "power", lambda: power.claims_from_raw([]), "raw", valid=r"a dict"),  # was UNCLEAR
    E("claims-from-raw-unknown-page", "power", lambda: power.claims_from_raw({"ch3p05": {}}), "raw",
      valid=r"keys are among \['ch3p5'"),  # was SILENT (no claims)
    E("claims-from-raw-page-without-entries", "power", lambda: power.claims_from_raw({"ch3p5": {}}), "raw",
      valid=r"entries its collector writes"),  # was UNCLEAR (KeyError)
    E("claims-from-raw-alpha-two", "power", lambda: power.claims_from_raw({}, alpha=2), "alpha",
      valid=r"< 1"),  # was SILENT
    # ----------------------------------------------------------------------------- ensemble_study.check_claims
    E("check-claims-rows-none", "ensemble_study", lambda: _check_claims(None), "rows",
      valid=r"a list of per_seed_rows dicts"),  # was UNCLEAR
    E("check-claims-rows-one-dict", "ensemble_study", lambda: _check_claims({"ensemble": "goe"}), "rows",
      valid=r"a list of per_seed_rows dicts"),  # was UNCLEAR
    E("check-claims-row-without-perplexity", "ensemble_study", lambda: _check_claims(_without("test_perplexity")),
      "rows", valid=r"with the keys \['ensemble'.*without \['test_perplexity'\]"),  # was UNCLEAR (KeyError)
    E("check-claims-row-without-diverged", "ensemble_study", lambda: _check_claims(_without("diverged")), "rows",
      valid=r"without \['diverged'\]"),  # was UNCLEAR (KeyError)
    E("check-claims-unknown-ensemble", "ensemble_study",
      lambda: _check_claims(_study_rows() + [dict(_study_rows()[0], ensemble="Gaussian")]), "rows",
      valid=r"ensemble is one of"),  # was UNCLEAR (said "at least 3 seeds")
    E("check-claims-perplexity-string", "ensemble_study", lambda: _check_claims(_study_rows(test_perplexity="60")),
      "rows", valid=r"test_perplexity is a real number"),  # was SILENT
    E("check-claims-sqrt-v-string", "ensemble_study", lambda: _check_claims(_study_rows(sqrt_v="big")), "rows",
      valid=r"sqrt_v is a real number"),  # was UNCLEAR
    E("check-claims-curve-too-short", "ensemble_study", lambda: _check_claims(_study_rows(test_loss_curve=[1.0])),
      "rows", valid=r"plateau\(\) accepts"),  # was UNCLEAR (named plateau's `test_loss_curve`)
    E("check-claims-two-seeds", "ensemble_study", lambda: _check_claims(_study_rows(seeds=2)), "rows",
      valid=r"at least 3 seeds"),
    E("check-claims-alpha-nan", "ensemble_study", lambda: _check_claims(alpha=NAN), "alpha", valid=r"finite"),
    E("check-claims-resamples-ten", "ensemble_study", lambda: _check_claims(resamples=10), "resamples",
      valid=r">= 99"),
    E("check-claims-seed-negative", "ensemble_study", lambda: _check_claims(key_or_seed=-3), "key_or_seed",
      valid=r">= 0"),  # was UNCLEAR
    E("check-claims-plateau-tolerance-negative", "ensemble_study", lambda: _check_claims(plateau_tolerance=-1),
      "plateau_tolerance", valid=r"> 0 and <= 1"),  # was UNCLEAR (named plateau's `tolerance`)
    E("check-claims-page-claims-none", "ensemble_study", lambda: _check_claims(page_claims=None), "page_claims",
      valid=r"a sequence of dicts"),  # was UNCLEAR
    E("check-claims-page-claims-one-dict", "ensemble_study",
      lambda: _check_claims(page_claims={"claim": "x", "p_for": 0.01, "p_against": 0.9}), "page_claims",
      valid=r"a sequence of dicts"),
    E("check-claims-page-claim-without-p-values", "ensemble_study",
      lambda: _check_claims(page_claims=[{"claim": "x"}]), "page_claims",
      valid=r"p_for and p_against, testable=False or a verdict"),  # was UNCLEAR (named stats' `claims`)
    E("check-claims-page-claim-p-string", "ensemble_study",
      lambda: _check_claims(page_claims=[{"claim": "x", "p_for": "0.01", "p_against": 0.9}]), "page_claims",
      valid=r"numbers in \[0, 1\]"),  # was UNCLEAR
    E("check-claims-page-claim-not-a-string", "ensemble_study",
      lambda: _check_claims(page_claims=[{"claim": None, "p_for": 0.01, "p_against": 0.9}]), "page_claims",
      valid=r"a 'claim' \(a string\)"),  # was SILENT
    R("check-claims-page-claims-generator-kept", "ensemble_study",
      lambda: _check_claims(page_claims=(c for c in [{"claim": "x", "p_for": 0.01, "p_against": 0.9}])),
      check=lambda out: [c["claim"] for c in out if _page(c)] == ["x"]),  # was SILENT (the claim was dropped)
    R("check-claims-all-perplexities-nan", "ensemble_study",
      lambda: _check_claims(_study_rows(test_perplexity=NAN)),
      check=lambda out: np.isnan(out[0]["estimate"]) and out[0]["verdict"] == "not resolved"),
    # ----------------------------------------------------------------------------- exercises: chapter 5 graders
    R("semi-orthogonal-returns-none", "exercises",
      lambda: exercises.check_semi_orthogonal(lambda *a: None), check=_failed_with_messages),
    R("semi-orthogonal-returns-complex", "exercises",
      lambda: exercises.check_semi_orthogonal(lambda k, r, c, s: np.eye(r, c) * (1 + 1j)),
      check=_failed_with_messages),
    R("semi-orthogonal-returns-nan", "exercises",
      lambda: exercises.check_semi_orthogonal(lambda k, r, c, s: np.full((r, c), NAN)),
      check=_failed_with_messages),
    R("semi-orthogonal-returns-a-pair", "exercises",
      lambda: exercises.check_semi_orthogonal(lambda k, r, c, s: (np.eye(r, c), s)), check=_failed_with_messages),
    R("semi-orthogonal-calls-sys-exit", "exercises", lambda: exercises.check_semi_orthogonal(_exit),
      check=lambda r: _failed_with_messages(r) and "SystemExit" in r.failed[0].hint),  # was UNCLEAR (SystemExit)
    E("semi-orthogonal-time-limit-negative", "exercises",
      lambda: exercises.check_semi_orthogonal(lambda *a: None, time_limit=-1), "time_limit", valid=r"> 0"),
    E("semi-orthogonal-time-limit-string", "exercises",
      lambda: exercises.check_semi_orthogonal(lambda *a: None, time_limit="60"), "time_limit", valid=r"> 0"),
    E("semi-orthogonal-not-callable", "exercises", lambda: exercises.check_semi_orthogonal(np.eye(3)),
      "my_semi_orthogonal", valid=r"a callable", exc=TypeError),
    R("table1-returns-none", "exercises", lambda: exercises.check_table1(lambda rows: None),
      check=_failed_with_messages),
    R("table1-scalar-values", "exercises",
      lambda: exercises.check_table1(lambda rows: {(r["ensemble"], r["sqrt_v"]): 60.0 for r in rows}),
      check=_failed_with_messages),
    R("table1-nan-values", "exercises",
      lambda: exercises.check_table1(lambda rows: {(r["ensemble"], r["sqrt_v"]): (NAN, NAN) for r in rows}),
      check=_failed_with_messages),
    R("table1-keys-of-mixed-types", "exercises",
      lambda: exercises.check_table1(lambda rows: {("goe", None): (1.0, 2.0), ("goe", "1.0"): (1.0, 2.0)}),
      check=_failed_with_messages),  # was UNCLEAR (the grader's own sorted() raised TypeError)
    R("table1-overflowing-integer", "exercises", lambda: exercises.check_table1(_overflowing),
      check=_failed_with_messages),  # was UNCLEAR (OverflowError out of the grader)
    E("table1-time-limit-bool", "exercises", lambda: exercises.check_table1(lambda rows: None, time_limit=True),
      "time_limit", valid=r"> 0"),
    R("copy-memory-returns-one-array", "exercises",
      lambda: exercises.check_copy_memory(lambda k, b, t, m, s: np.zeros((b, t + 2 * m), int)),
      check=_failed_with_messages),
    R("copy-memory-float-arrays", "exercises",
      lambda: exercises.check_copy_memory(lambda k, b, t, m, s: (np.zeros((b, t + 2 * m)),) * 2),
      check=_failed_with_messages),
    R("copy-memory-wrong-length", "exercises",
      lambda: exercises.check_copy_memory(lambda k, b, t, m, s: (np.zeros((b, t + m), int),) * 2),
      check=_failed_with_messages),
    R("copy-memory-returns-a-dict", "exercises",
      lambda: exercises.check_copy_memory(lambda k, b, t, m, s: {"x": 1, "y": 2}), check=_failed_with_messages),
    E("copy-memory-time-limit-minus-inf", "exercises",
      lambda: exercises.check_copy_memory(lambda *a: None, time_limit=-INF), "time_limit", valid=r"> 0"),
    E("copy-memory-time-limit-environment", "exercises", lambda: exercises.check_copy_memory(lambda *a: None),
      "DEQLAB_GRADER_TIME_LIMIT", valid=r"> 0", env={"DEQLAB_GRADER_TIME_LIMIT": "soon"}),
    # ----------------------------------------------------------------------------- grade (exit 2, before any notebook runs)
    E("grade-missing-file", "grade", lambda: _grade("{folder}/nowhere.ipynb"), "re:argument SUBMISSION",
      valid=r"not found", exc=SystemExit),
    E("grade-submission-is-a-directory", "grade", lambda: _grade("{folder}"), "re:argument SUBMISSION",
      valid=r"is a directory, not a notebook", exc=SystemExit),  # was UNCLEAR ("not found")
    E("grade-not-a-notebook", "grade", lambda: _grade("{junk_ipynb}"), "re:argument SUBMISSION",
      valid=r"is not a notebook", exc=SystemExit),
    E("grade-json-list-not-a-notebook", "grade", lambda: _grade("{list_ipynb}"), "re:argument SUBMISSION",
      valid=r"is not a notebook", exc=SystemExit),
    E("grade-out-extension", "grade", lambda: _grade("{alice_ipynb}", "--out", "results.txt"), "re:argument --out",
      valid=r"must end in \.csv or \.json", exc=SystemExit),
    E("grade-out-is-a-directory", "grade", lambda: _grade("{alice_ipynb}", "--out", "{results_csv}"),
      "re:argument --out", valid=r"is a directory", exc=SystemExit),  # was UNCLEAR (IsADirectoryError after grading)
    E("grade-out-under-a-file", "grade", lambda: _grade("{alice_ipynb}", "--out", "{a_file}/r.csv"),
      "re:argument --out", valid=r"is a file, not a directory", exc=SystemExit),  # was UNCLEAR (after grading)
    E("grade-executed-is-a-file", "grade", lambda: _grade("{alice_ipynb}", "--executed", "{a_file}"),
      "re:argument --executed", valid=r"must be a directory", exc=SystemExit),  # was UNCLEAR (after grading)
    E("grade-time-limit-negative", "grade", lambda: _grade("{alice_ipynb}", "--time-limit", "-5"),
      "re:argument --time-limit", valid=r"seconds > 0", exc=SystemExit),
    E("grade-time-limit-nan", "grade", lambda: _grade("{alice_ipynb}", "--time-limit", "nan"),
      "re:argument --time-limit", valid=r"finite number of seconds > 0", exc=SystemExit),
    E("grade-time-limit-word", "grade", lambda: _grade("{alice_ipynb}", "--time-limit", "1h"),
      "re:argument --time-limit", valid=r"a number of seconds > 0", exc=SystemExit),
    E("grade-unknown-kernel", "grade", lambda: _grade("{alice_ipynb}", "--kernel", "no-such-kernel"),
      "re:argument --kernel", valid=r"no Jupyter kernel named 'no-such-kernel'; installed",
      exc=SystemExit),  # was UNCLEAR (every exercise failed as the student's, exit 1)
    E("grade-manifest-without-checks", "grade", lambda: _grade("{alice_ipynb}", manifest="no_checks.json"),
      "re:argument --manifest", valid=r"not a valid grading manifest.*no list of check cells",
      exc=SystemExit),  # was UNCLEAR (KeyError)
    E("grade-manifest-graders-string", "grade", lambda: _grade("{alice_ipynb}", manifest="graders_string.json"),
      "re:argument --manifest", valid=r"'graders' is not a list of grader names",
      exc=SystemExit),  # was SILENT (graded 'c', 'h', ... as graders)
    E("grade-module-missing-file", "grade", lambda: _grade_module("nowhere.ipynb", "--manifest", _course()["manifest.json"]),
      "re:argument SUBMISSION",
      valid=r"nowhere.ipynb not found", exc=SystemExit),
    # ----------------------------------------------------------------------------- nn.TransformerCell (newer arguments)
    E("transformer-attention-residual-string", "nn.transformer", lambda: _transformer(attention_residual="False"),
      "attention_residual", valid=r"True or False"),
    E("transformer-attention-residual-none", "nn.transformer", lambda: _transformer(attention_residual=None),
      "attention_residual", valid=r"True or False"),
    E("transformer-max-distance-zero", "nn.transformer", lambda: _transformer(max_distance=0), "max_distance",
      valid=r">= 1"),
    E("transformer-max-distance-huge", "nn.transformer", lambda: _transformer(max_distance=10**12), "max_distance",
      valid=r"<= 1048576"),  # was a raw out-of-memory error
    E("transformer-max-distance-float", "nn.transformer", lambda: _transformer(max_distance=4.0), "max_distance",
      valid=r"integer"),
    E("transformer-heads-not-a-divisor", "nn.transformer", lambda: nn.TransformerCell(8, 3, heads=3, rngs=_rngs()),
      "heads", valid=r"a divisor of width \(8\)"),
    E("transformer-hidden-square-ensemble", "nn.transformer", lambda: _transformer(ensemble="goe", hidden=32),
      "hidden", valid=r"equal to width"),
    E("transformer-attention-ensemble-unknown", "nn.transformer", lambda: _transformer(attention_ensemble="GOE"),
      "attention_ensemble", valid=r"one of 'gaussian'"),
    E("transformer-attention-scale-negative", "nn.transformer", lambda: _transformer(attention_scale=-0.1),
      "attention_scale", valid=r">= 0"),
    E("transformer-attention-scale-inf", "nn.transformer", lambda: _transformer(attention_scale=INF),
      "attention_scale", valid=r"finite"),
    E("transformer-dropout-one", "nn.transformer", lambda: _transformer(dropout=1.0), "dropout", valid=r"< 1"),
    E("transformer-x-none", "nn.transformer", lambda: _transformer()(_seq(8), None), "x",
      valid=r"an array"),  # was UNCLEAR (AttributeError)
    E("transformer-attention-x-features", "nn.transformer", lambda: _transformer().attention(_seq(8), _seq(2)), "x",
      valid=r"must have shape \(1, 5\) \+ \(3,\)"),  # was UNCLEAR (dot_general TypeError)
    E("transformer-feed-forward-hidden-z-width", "nn.transformer",
      lambda: _transformer().feed_forward_hidden(_seq(4), _seq(3)), "z",
      valid=r"must have shape \(\.\.\., T, 8\)"),  # was UNCLEAR (dot_general TypeError)
    E("transformer-dropout-masks-other-width", "nn.transformer",
      lambda: _transformer(dropout=0.1).dropout_masks((1, 5, 7)), "z_shape",
      valid=r"a shape \(\.\.\., T, 8\)"),  # was SILENT (masks of width 7)
    E("transformer-dropout-masks-int", "nn.transformer", lambda: _transformer(dropout=0.1).dropout_masks(8),
      "z_shape", valid=r"integers >= 0"),  # was UNCLEAR
]


def _picard(max_steps):
    import deqlab

    return deqlab.Picard(max_steps=max_steps)


def _budget(max_steps, tol):
    from deqlab.solvers import Budget

    return Budget(max_steps, tol)


def deqlab_eager():
    from deqlab import _eager

    return _eager


class _Holder:
    items = [0.5]


def _solve_with_list_attribute():
    import deqlab

    return deqlab.solve(lambda z: _Holder.items[0] * z + 1.0, jnp.zeros(2), solver=deqlab.Picard(max_steps=500))


def _forever():
    while True:
        pass


@pytest.mark.parametrize("probe", [pytest.param(p, id=p.name) for p in PROBES])
def test_probe_newer(probe, capsys, monkeypatch):
    """As tests/library/test_probe.py's runner; the CLI's errors (argparse: ``SystemExit(2)``, the message on
    stderr) are read from stderr."""
    for name, value in (probe.env or {}).items():
        monkeypatch.setenv(name, value)
    if probe.exc is SystemExit:
        with pytest.raises(SystemExit) as info:
            probe.call()
        assert info.value.code == 2
        message = capsys.readouterr().err
        assert re.search(probe.arg, message), message
        assert re.search(probe.valid, message), message
        return
    _run(probe)


def test_probe_newer_table_covers_the_newer_modules():
    names = [p.name for p in PROBES]
    assert len(names) == len(set(names)), [n for n, c in collections.Counter(names).items() if c > 1]
    by_module = collections.Counter(p.module for p in PROBES)
    assert set(by_module) == set(MODULES), set(by_module) ^ set(MODULES)
    assert min(by_module.values()) >= 3, by_module
