import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from deqlab import checks
from deqlab.lab.experiments import sweep

CONFIGS = [{"family": f, "scale": s, "seed": 0} for f in ("gaussian", "orthogonal") for s in (0.5, 1.0, 1.5)]


def work(config):
    """A deterministic stand-in for a training run, with NumPy outputs to be converted."""
    rng = np.random.default_rng(int(1000 * config["scale"]) + len(config["family"]))
    return {"error": np.float32(rng.uniform()), "curve": rng.normal(size=3), "failed": config["scale"] > 1.2}


def test_config_key_is_stable_and_order_free():
    a = {"family": "goe", "scale": 0.5, "seeds": [0, 1]}
    b = {"seeds": [0, 1], "scale": 0.5, "family": "goe"}
    assert sweep.config_key(a) == sweep.config_key(b)
    assert sweep.config_key(a) != sweep.config_key({**a, "scale": 0.50001})
    # the hash of the canonical JSON, not of anything process-dependent
    code = "from deqlab.lab.experiments import sweep; print(sweep.config_key({'scale': 0.5, 'family': 'goe', 'seeds': [0, 1]}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == sweep.config_key(a)


def test_table_in_config_order_and_skips_finished(tmp_path):
    calls = []

    def fn(config):
        calls.append(config)
        return work(config)

    rows = sweep.run_sweep(fn, CONFIGS, tmp_path, progress=False)
    assert len(calls) == len(CONFIGS)
    assert [{k: r[k] for k in ("family", "scale", "seed")} for r in rows] == CONFIGS
    assert all(isinstance(r["error"], float) and len(r["curve"]) == 3 for r in rows)
    again = sweep.run_sweep(fn, CONFIGS[::-1], tmp_path, progress=False)
    assert len(calls) == len(CONFIGS)  # nothing recomputed
    assert again == rows[::-1]


def test_untrusted_files_are_recomputed(tmp_path):
    calls = []

    def fn(config):
        calls.append(config)
        return work(config)

    reference = sweep.run_sweep(fn, CONFIGS, tmp_path, progress=False)
    calls.clear()
    sweep.result_path(tmp_path, CONFIGS[0]).write_text('{"format": 1, "config": {"fam')  # truncated
    stored = json.loads(sweep.result_path(tmp_path, CONFIGS[1]).read_text())
    stored["config"]["scale"] = 99.0  # a file that holds another configuration
    sweep.result_path(tmp_path, CONFIGS[1]).write_text(json.dumps(stored))
    stored = json.loads(sweep.result_path(tmp_path, CONFIGS[2]).read_text())
    stored["format"] = 0  # an older layout
    sweep.result_path(tmp_path, CONFIGS[2]).write_text(json.dumps(stored))
    assert sweep.run_sweep(fn, CONFIGS, tmp_path, progress=False) == reference
    assert calls == CONFIGS[:3]


_KILLED = """
import os, sys, json
sys.path.insert(0, {tests!r})
from test_sweep import CONFIGS, work
from deqlab import checks
from deqlab.lab.experiments import sweep
done = []
def fn(config):
    if len(done) == {k}:
        os._exit(3)  # dies mid-sweep, as a killed job would: no cleanup, no exception handling
    done.append(config)
    with open({log!r}, "a") as log:
        log.write(json.dumps(config) + "\\n")
    return work(config)
sweep.run_sweep(fn, CONFIGS, {directory!r}, progress=False)
"""


def test_killed_sweep_resumes_without_recomputing(tmp_path):
    k = 4
    log = tmp_path / "calls.log"
    directory = tmp_path / "results"
    script = _KILLED.format(tests=os.path.dirname(__file__), k=k, log=str(log), directory=str(directory))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True)
    assert proc.returncode == 3, proc.stderr
    finished = [json.loads(line) for line in log.read_text().splitlines()]
    assert finished == CONFIGS[:k]
    assert len(list(directory.glob("*.json"))) == k
    assert not list(directory.glob(".*.tmp"))  # no partial files left behind

    calls = []

    def fn(config):
        calls.append(config)
        return work(config)

    resumed = sweep.run_sweep(fn, CONFIGS, directory, progress=False)
    assert calls == CONFIGS[k:]  # only the unfinished configurations ran
    uninterrupted = sweep.run_sweep(work, CONFIGS, tmp_path / "fresh", progress=False)
    assert resumed == uninterrupted


def test_failure_inside_fn_keeps_finished_results(tmp_path):
    def failing(config):
        if config["scale"] == 1.5:
            raise RuntimeError("boom")
        return work(config)

    with pytest.raises(RuntimeError, match="boom"):
        sweep.run_sweep(failing, CONFIGS, tmp_path, progress=False)
    assert len(list(tmp_path.glob("*.json"))) == 2
    calls = []
    sweep.run_sweep(lambda c: calls.append(c) or work(c), CONFIGS, tmp_path, progress=False)
    assert calls == CONFIGS[2:]


def test_nan_results_round_trip(tmp_path):
    rows = sweep.run_sweep(lambda c: {"loss": float("nan")}, [{"a": 1}], tmp_path, progress=False)
    again = sweep.run_sweep(lambda c: {"loss": 0.0}, [{"a": 1}], tmp_path, progress=False)
    assert np.isnan(rows[0]["loss"]) and np.isnan(again[0]["loss"])


def test_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="configs"):
        sweep.run_sweep(work, [CONFIGS[0], dict(CONFIGS[0])], tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"configs\[0\]"):
        sweep.run_sweep(work, [{"x": object()}], tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"configs\[0\]"):
        sweep.run_sweep(work, [["not", "a", "dict"]], tmp_path, progress=False)
    with pytest.raises(ValueError, match="fn"):
        sweep.run_sweep("work", CONFIGS, tmp_path, progress=False)
    with pytest.raises(ValueError, match="fn"):
        sweep.run_sweep(lambda c: [1.0], CONFIGS, tmp_path, progress=False)
    with pytest.raises(ValueError, match="fn"):
        sweep.run_sweep(lambda c: {"scale": 1.0}, CONFIGS, tmp_path, progress=False)


def test_checkpoints_resume_within_a_configuration(tmp_path):
    import jax.numpy as jnp

    calls = []

    def fn(config, checkpoint_dir, stop_at=None):
        """Counts to 5, checkpointing each step; resumes from the newest checkpoint."""
        with sweep.Checkpoints(checkpoint_dir) as ckpt:
            state, start = ckpt.resume({"total": jnp.zeros(3)})
            calls.append(start)
            for i in range(start, 5):
                if i == stop_at:
                    raise KeyboardInterrupt
                state = {"total": state["total"] + i}
                ckpt.save(i, state)
        return {"total": state["total"]}

    configs = [{"run": 0}]
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(lambda c, d: fn(c, d, stop_at=3), configs, tmp_path, checkpoints=True, progress=False)
    rows = sweep.run_sweep(fn, configs, tmp_path, checkpoints=True, progress=False)
    assert calls == [0, 3]  # the second call resumed after the last saved step (2)
    assert rows[0]["total"] == [10.0, 10.0, 10.0]  # 0 + 1 + 2 + 3 + 4, as without the interruption
    assert not (tmp_path / "checkpoints" / sweep.config_key(configs[0])).exists()  # removed after success


def test_checkpoints_refuse_a_second_save_of_a_step(tmp_path):
    """orbax keeps the first save of a step and drops a second without a word: Checkpoints raises,
    and a deleted step can be saved again."""
    import jax.numpy as jnp

    with sweep.Checkpoints(tmp_path, max_to_keep=3) as ckpt:
        ckpt.save(1, {"a": jnp.ones(3)})
        for step in (1, 0):
            with pytest.raises(ValueError, match=r"Checkpoints.save: `step` must be an integer > 1, the newest step"):
                ckpt.save(step, {"a": jnp.zeros(3)})
        assert ckpt.restore({"a": jnp.zeros(3)})["a"].tolist() == [1.0, 1.0, 1.0]
        ckpt.delete(1)
        ckpt.save(1, {"a": jnp.zeros(3)})
        assert ckpt.restore({"a": jnp.ones(3)}, 1)["a"].tolist() == [0.0, 0.0, 0.0]
        with pytest.raises(ValueError, match=r"`step` must be a saved step \(one of \[1\]"):
            ckpt.restore({"a": jnp.ones(3)}, 2)


def test_restored_arrays_are_committed_as_the_template_is(tmp_path, compile_counter):
    """orbax restores every array committed to its device; jit lowers committed arguments with their
    sharding, so a resumed state would compile every program it reaches a second time (chapter 5
    page 4). An uncommitted template array comes back uncommitted and the jitted function runs the
    program it already has; a committed one stays committed."""
    import jax
    import jax.numpy as jnp

    fresh = {"a": jnp.arange(3.0), "b": jax.device_put(jnp.ones(2), jax.devices()[0]), "log": np.zeros(2),
             "key": jax.random.key(7)}
    assert not fresh["a"].committed and fresh["b"].committed
    double = jax.jit(lambda state: (2 * state["a"], 2 * state["b"], jax.random.split(state["key"])))
    double(fresh)
    with sweep.Checkpoints(tmp_path) as ckpt:
        ckpt.save(0, fresh)
        restored = ckpt.restore(fresh)
    assert not restored["a"].committed and restored["b"].committed and isinstance(restored["log"], np.ndarray)
    assert restored["a"].tolist() == [0.0, 1.0, 2.0] and restored["a"].dtype == fresh["a"].dtype
    # a typed key too (it has no NumPy form): the same key, uncommitted
    assert not restored["key"].committed and jax.random.key_impl(restored["key"]) == jax.random.key_impl(fresh["key"])
    assert np.array_equal(jax.random.key_data(restored["key"]), jax.random.key_data(fresh["key"]))
    with compile_counter() as counted:
        double(restored)
    assert counted.programs == 0  # the program the fresh state compiled (committed arguments: a second one)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "remove"])
def test_checkpoints_corrupted_or_truncated_raise_a_checkpoint_error(tmp_path, damage):
    import shutil

    import jax.numpy as jnp

    with sweep.Checkpoints(tmp_path) as ckpt:
        ckpt.save(4, {"a": jnp.arange(100.0)})
    item = tmp_path / "4" / "default"
    files = [p for p in item.rglob("*") if p.is_file() and (p.parent.name == "d" or p.name == "manifest.ocdbt")]
    assert files
    if damage == "truncate":
        for p in files:
            with open(p, "r+b") as handle:
                handle.truncate(10)
    elif damage == "garbage":
        for p in files:
            p.write_bytes(b"garbage")
    else:
        shutil.rmtree(item)
    with sweep.Checkpoints(tmp_path) as ckpt:
        with pytest.raises(sweep.CheckpointError, match=rf"restore: the checkpoint of step 4 in {tmp_path}.*corrupted") as info:
            ckpt.restore({"a": jnp.zeros(100)})
    assert info.value.__cause__ is not None  # chained to orbax's error


def test_checkpoints_failed_save_leaves_the_step_free(tmp_path):
    import jax.numpy as jnp

    with sweep.Checkpoints(tmp_path) as ckpt:
        with pytest.raises(ValueError, match=r"`state` must be a non-empty pytree of arrays"):
            ckpt.save(0, {"a": "text"})
        ckpt.save(0, {"a": jnp.ones(2)})
        assert ckpt.all_steps() == [0]


@pytest.mark.parametrize("bad", [3, [], [0, 0], [-1], "01", [0.5]])
def test_seed_list_rejects_what_is_not_distinct_seeds(bad):
    with pytest.raises(ValueError, match="seeds"):
        checks.seed_list(bad, "seeds", "here")


def test_seed_list_accepts_ranges_and_numpy_integers():
    assert checks.seed_list(range(3)) == [0, 1, 2]
    assert checks.seed_list(np.arange(2, 4).tolist()) == [2, 3]
    assert checks.seed_list((np.int64(5), 7)) == [5, 7]
