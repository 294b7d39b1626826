"""A small resumable sweep runner: one stored result per configuration.

:func:`run_sweep` calls ``fn(config)`` for each configuration (a dict of JSON-able parameters:
a family, a scale, a seed or a list of seeds run together) and stores the result in
``directory`` under a file named by a stable hash of the configuration (:func:`config_key`).
Results are written atomically (a temporary file in the same directory, then ``os.replace``), so
an interrupted sweep leaves either a complete result or none; on the next call the finished
configurations are read back and only the others are run. A result file that does not parse, or
whose stored configuration is not the one asked for, is not trusted: that configuration runs again.

Long runs can also resume *within* a configuration: with ``checkpoints=True`` the function is
called as ``fn(config, checkpoint_dir)``, a directory of its own that survives an interruption
and is removed once the result is stored. :class:`Checkpoints` wraps orbax-checkpoint's
``CheckpointManager`` for saving and restoring a pytree of arrays there (orbax is imported only
when a :class:`Checkpoints` is made, so the rest of this module works without it).

Used by the training experiment of chapter 3 (001 §4.1, Fig. 5:
:mod:`deqlab.lab.experiments.nonlinear.training`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from deqlab import checks

__all__ = ["config_key", "result_path", "load_result", "run_sweep", "Checkpoints", "CheckpointError"]

_FORMAT = 1  # version of the stored file layout; files of another version are not trusted


def _jsonable(value: Any) -> Any:
    """``value`` with NumPy / JAX scalars and arrays turned into Python numbers and lists."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if hasattr(value, "__array__"):
        array = np.asarray(value)
        return _jsonable(array.item() if array.ndim == 0 else array.tolist())
    raise TypeError(f"{type(value).__name__} is not JSON-able")


def _canonical(config: Mapping[str, Any], where: str, name: str = "config") -> str:
    if not isinstance(config, Mapping):
        raise checks.fail(name, "a dict of JSON-able parameters", type(config).__name__, where)
    try:
        return json.dumps(_jsonable(config), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise checks.fail(name, "a dict of JSON-able parameters (str, int, float, bool, None, lists, dicts; "
                          "no NaN)", f"{config!r} ({error})", where) from None


def config_key(config: Mapping[str, Any]) -> str:
    """Stable name of a configuration: the first 20 hex digits of the SHA-256 of its canonical
    JSON (keys sorted, no whitespace), so it does not depend on the dict's order or the process."""
    text = _canonical(config, "sweep.config_key")
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def result_path(directory: str | os.PathLike, config: Mapping[str, Any]) -> Path:
    """Where :func:`run_sweep` stores the result of ``config``."""
    return Path(directory) / f"{config_key(config)}.json"


def load_result(directory: str | os.PathLike, config: Mapping[str, Any]) -> dict | None:
    """The stored result of ``config``, or None if there is none or the file cannot be trusted
    (does not parse, is of another format, or holds another configuration)."""
    path = result_path(directory, config)
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if (not isinstance(stored, dict) or stored.get("format") != _FORMAT
            or stored.get("config") != json.loads(_canonical(config, "sweep.load_result"))
            or not isinstance(stored.get("result"), dict)):
        return None
    return stored["result"]


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _directory(directory: Any, name: str, where: str) -> Path:
    """``directory`` as a ``Path``, created if missing; not an existing file."""
    if not isinstance(directory, (str, os.PathLike)):
        raise checks.fail(name, "a path (str or os.PathLike)", type(directory).__name__, where)
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise checks.fail(name, "a directory (created if missing)", f"{str(path)!r}, an existing file", where)
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_sweep(fn: Callable[..., Mapping[str, Any]], configs: Iterable[Mapping[str, Any]],
              directory: str | os.PathLike, *, checkpoints: bool = False, progress: bool = True,
              description: str = "sweep") -> list[dict[str, Any]]:
    """Run ``fn`` on every configuration not already finished in ``directory``; return the table.

    Args:
        fn: ``fn(config) -> dict`` of JSON-able results (NumPy / JAX numbers and arrays are
            converted; NaN and inf are stored as JSON's ``NaN`` / ``Infinity``); with
            ``checkpoints=True``, ``fn(config, checkpoint_dir)``.
        configs: dicts of JSON-able parameters, all different.
        directory: where results are stored (created if missing).
        checkpoints: pass each call a checkpoint directory of its own
            (``directory/checkpoints/<key>``), kept across interruptions, removed after success.
        progress: show a tqdm bar over the configurations.
        description: the bar's label.

    Returns:
        One dict per configuration, in the order of ``configs``: the configuration's entries,
        then the result's (a result key equal to a configuration key raises ``ValueError``).

    Raises:
        ValueError: if a configuration is not a dict of JSON-able values, two configurations are
            equal, ``fn`` is not callable or returns something other than a dict.
    """
    where = "sweep.run_sweep"
    if not callable(fn):
        raise checks.fail("fn", "a callable fn(config) -> dict", type(fn).__name__, where)
    if not isinstance(checkpoints, (bool, np.bool_)):
        raise checks.fail("checkpoints", "True or False", checkpoints, where)
    if isinstance(configs, (Mapping, str)):
        raise checks.fail("configs", "a list of dicts (one per configuration)", type(configs).__name__, where)
    configs = list(configs)
    keys = []
    for i, config in enumerate(configs):
        _canonical(config, where, f"configs[{i}]")
        keys.append(config_key(config))
    if len(set(keys)) != len(keys):
        first = next(i for i, k in enumerate(keys) if keys.index(k) != i)
        raise checks.fail("configs", "configurations that are all different", f"a repeat of {configs[first]!r}",
                          where)
    directory = _directory(directory, "directory", where)

    from tqdm import tqdm

    rows = []
    bar = tqdm(total=len(configs), desc=description, disable=not progress)
    for config, key in zip(configs, keys):
        result = load_result(directory, config)
        if result is None:
            if checkpoints:
                ckpt = directory / "checkpoints" / key
                ckpt.mkdir(parents=True, exist_ok=True)
                result = fn(dict(config), ckpt)
            else:
                result = fn(dict(config))
            if not isinstance(result, Mapping):
                raise checks.fail("fn", "a function returning a dict", f"a {type(result).__name__} for {config!r}",
                                  where)
            try:
                result = _jsonable(result)
            except TypeError as error:
                raise checks.fail("fn", "a function returning a dict of JSON-able results (numbers, strings, "
                                  "lists, arrays)", f"{error} in the result for {config!r}", where) from None
            text = json.dumps({"format": _FORMAT, "config": json.loads(_canonical(config, where)),
                               "result": result}, sort_keys=True)
            _write_atomic(result_path(directory, config), text)
            if checkpoints:
                shutil.rmtree(directory / "checkpoints" / key, ignore_errors=True)
        clash = set(result) & set(config)
        if clash:
            raise checks.fail("fn", "results whose keys differ from the configuration's",
                              f"keys {sorted(clash)} in both", where)
        rows.append({**_jsonable(config), **result})
        bar.update(1)
    bar.close()
    return rows


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read back (corrupted, truncated, or not the state
    asked for); the message names the directory and the step, the orbax error is its ``__cause__``."""


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300] if text else ''}"


def _is_leaf_value(leaf: Any) -> bool:
    return (hasattr(leaf, "shape") and hasattr(leaf, "dtype")) or (
        isinstance(leaf, (int, float, np.number)) and not isinstance(leaf, (bool, np.bool_)))


def _committed_like(template: Any, restored: Any) -> Any:
    """``restored`` with each array whose ``template`` array is not committed to a device made
    uncommitted too (on the default device, the same values).

    orbax hands every restored array back committed to its device, while a freshly made array (a
    model's initial parameters) is not committed. ``jax.jit`` lowers committed arguments with their
    sharding, so a resumed run's state would reach another program than the fresh state's, the same
    computation compiled again and stored again in the persistent cache, for every jitted function
    it is passed to (chapter 5 page 4's resumed training: 4 programs, about 6 s of its run on the
    2-core machine). Arrays placed on purpose (on a mesh, or committed to a device) keep their place."""
    import jax

    def uncommitted(r):
        if jax.dtypes.issubdtype(r.dtype, jax.dtypes.prng_key):  # a typed key: through its key data
            return jax.random.wrap_key_data(uncommitted(jax.random.key_data(r)), impl=jax.random.key_impl(r))
        return jax.device_put(np.asarray(r))  # no device given: uncommitted

    def like(t, r):
        if isinstance(t, jax.Array) and isinstance(r, jax.Array) and not getattr(t, "committed", True):
            return uncommitted(r)
        return r

    return jax.tree_util.tree_map(like, template, restored)


class Checkpoints:
    """Checkpoints of a pytree of arrays in a directory, with orbax-checkpoint.

    ``CheckpointManager`` with ``StandardSave`` / ``StandardRestore``; saves are asynchronous and
    :meth:`save` waits for them to finish, so a checkpoint that :meth:`latest_step` reports is
    complete (orbax writes to a temporary directory and renames it when done).

    Steps only increase: :meth:`save` of a step that is not above :meth:`latest_step` raises
    ``ValueError`` (orbax would keep the first save and drop the second without a word); to
    replace a saved step, :meth:`delete` it first. A checkpoint that cannot be read back
    (corrupted, truncated, or of another structure than the template) raises
    :class:`CheckpointError` naming the directory and the step.

    Args:
        directory: where the checkpoints live (created if missing).
        max_to_keep: how many of the newest checkpoints to keep, >= 1.
    """

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 1):
        try:
            import orbax.checkpoint as ocp
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise ImportError("sweep.Checkpoints needs orbax-checkpoint: pip install orbax-checkpoint") from error
        max_to_keep = checks.positive_int(max_to_keep, "max_to_keep", "sweep.Checkpoints")
        self._ocp = ocp
        path = _directory(directory, "directory", "sweep.Checkpoints").absolute()
        self.directory = path
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
        self._manager = ocp.CheckpointManager(path, options=options)

    def latest_step(self) -> int | None:
        """The newest saved step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """The saved steps, oldest first."""
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: Any) -> None:
        """Save ``state`` (a non-empty pytree of arrays and numbers) as ``step``, an integer above
        every saved step, and wait until it is on disk."""
        where = "sweep.Checkpoints.save"
        step = checks.integer(step, "step", where, minimum=0)
        latest = self.latest_step()
        if latest is not None and step <= latest:
            raise checks.fail("step", f"an integer > {latest}, the newest step saved in {self.directory} "
                              "(a saved step is not overwritten: delete it first with Checkpoints.delete)",
                              step, where)
        import jax

        leaves = jax.tree_util.tree_leaves(state)
        bad = [type(leaf).__name__ for leaf in leaves if not _is_leaf_value(leaf)]
        if not leaves or bad:
            raise checks.fail("state", "a non-empty pytree of arrays and numbers",
                              f"leaves of type {sorted(set(bad))}" if bad else state, where)
        try:
            saved = self._manager.save(step, args=self._ocp.args.StandardSave(state))
            self._manager.wait_until_finished()
        except Exception as error:
            for tmp in self.directory.glob(f"{step}.orbax-checkpoint-tmp*"):  # a later save of the step can succeed
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"{where}: step {step} could not be written to {self.directory} "
                                  f"({_first_line(error)}).") from error
        if not saved:
            raise CheckpointError(f"{where}: orbax did not save step {step} in {self.directory} "
                                  f"(saved steps: {self.all_steps()}).")

    def delete(self, step: int) -> None:
        """Delete the saved ``step`` (then it can be saved again)."""
        where = "sweep.Checkpoints.delete"
        step = checks.integer(step, "step", where, minimum=0)
        if step not in self.all_steps():
            raise checks.fail("step", f"a saved step (one of {self.all_steps()} in {self.directory})", step, where)
        self._manager.delete(step)

    def resume(self, state: Any) -> tuple[Any, int]:
        """``(state, 0)`` when nothing is saved yet, else the newest saved state (structure and
        dtypes of ``state``) and the step after it: where an interrupted loop over steps goes on."""
        latest = self.latest_step()
        if latest is None:
            return state, 0
        return self.restore(state, latest), latest + 1

    def restore(self, template: Any, step: int | None = None) -> Any:
        """The state saved at ``step`` (default the newest), with the structure and dtypes of
        ``template``; an array comes back uncommitted where the template's is not committed to a
        device (a fresh array), so that jitted functions reuse the programs the fresh state compiled."""
        where = "sweep.Checkpoints.restore"
        steps = self.all_steps()
        if step is None:
            if not steps:
                raise ValueError(f"{where}: there is no checkpoint to restore in {self.directory}")
            step = steps[-1]
        step = checks.integer(step, "step", where, minimum=0)
        if step not in steps:
            raise checks.fail("step", f"a saved step (one of {steps} in {self.directory})", step, where)
        try:
            restored = self._manager.restore(step, args=self._ocp.args.StandardRestore(template))
        except Exception as error:
            raise CheckpointError(
                f"{where}: the checkpoint of step {step} in {self.directory} could not be restored: it is "
                f"corrupted or truncated, or `template` does not have the structure, shapes and dtypes of the "
                f"saved state ({_first_line(error)}).") from error
        return _committed_like(template, restored)

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> "Checkpoints":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

