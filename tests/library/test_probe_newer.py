"""Probe of the newer public surfaces with bad inputs (issue "[15/19]", item 6): nn (language model,
sequence cells, baselines, normalisation), stability, data, sweep and checkpoints, the CLI,
the graders and precision. Every bad call gives a clear error naming the argument, or reports the
failure; none is silent, none is unclear, none hangs.

The table and its runner are those of ``tests/library/test_probe.py`` (one row: callable, bad input,
expected error type, message regexes naming the argument and the valid range); probes already
there or in the per-module tests are not repeated.
"""

from __future__ import annotations

import collections
import re
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from deqlab import nn, precision, stability
from deqlab.lab import data, exercises
from deqlab.lab.experiments import sweep
from deqlab.lab.experiments.sequence import ensemble_study
from deqlab.nn import baselines, normalization, transformer, trellis
from tests.library.test_probe import NAN, E, Probe, R, _run

MODULES = ("nn", "nn.normalization", "stability", "data", "sweep", "cli", "exercises", "precision", "solvers",
           "eager")

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
def test_probe_newer(probe, capsys):
    """As tests/library/test_probe.py's runner; the CLI's errors (argparse: ``SystemExit(2)``, the message on
    stderr) are read from stderr."""
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
