"""Argument checks shared by every public function of deqlab: one place, one message format.

Every check raises ``ValueError`` with a message of the form::

    solvers.Anderson: `m` must be an integer >= 1, got 0.

naming the argument as the user wrote it, the valid range, and the value received. ``where`` (the
public function or class the user called) is optional. Checks return the value normalised
(a Python ``int`` / ``float`` / ``str`` / dtype) so callers can use it directly.

Checks of numbers only run on concrete values: a traced value (inside ``jit``) cannot be
inspected without breaking the trace, and is returned unchanged where a check allows it.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "fail",
    "integer",
    "positive_int",
    "number",
    "positive_number",
    "unit_interval",
    "choice",
    "floating_dtype",
    "prng_key",
    "seed_list",
    "is_traced",
]


def _prefix(where: str | None) -> str:
    return f"{where}: " if where else ""


def fail(name: str, requirement: str, value: Any, where: str | None = None) -> ValueError:
    """The ``ValueError`` of this module's format (returned, so that callers ``raise`` it).

    Args:
        name: the argument, as the user wrote it.
        requirement: what it must be (``"an integer >= 1"``).
        value: the value received (shown with ``repr``).
        where: the public function or class the user called; None: no prefix.

    Returns:
        A ``ValueError`` (not raised).

    Example:
        >>> from deqlab.checks import fail
        >>> print(fail("m", "an integer >= 1", 0, "solvers.Anderson"))
        solvers.Anderson: `m` must be an integer >= 1, got 0.
    """
    return ValueError(f"{_prefix(where)}`{name}` must be {requirement}, got {value!r}.")


def is_traced(value: Any) -> bool:
    """True when any leaf of ``value`` is a JAX tracer (its number cannot be read).

    Args:
        value: any pytree.

    Returns:
        A bool.

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> from deqlab.checks import is_traced
        >>> is_traced(jnp.ones(2)), bool(jax.jit(lambda x: is_traced(x))(1.0))
        (False, True)
    """
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(value))


def integer(value: Any, name: str, where: str | None = None, *, minimum: int | None = None,
            maximum: int | None = None) -> int:
    """A static Python / NumPy integer (never a bool) in ``[minimum, maximum]``.

    Args:
        value: the value to check.
        name: the argument's name, for the message.
        where: the public function, for the message.
        minimum: smallest allowed value (None: unbounded).
        maximum: largest allowed value (None: unbounded).

    Returns:
        ``value`` as a Python int.

    Raises:
        ValueError: ``value`` is a bool, not an integer (a traced value included), or out of range.

    Example:
        >>> import numpy as np
        >>> from deqlab.checks import integer
        >>> integer(np.int64(3), "steps", minimum=1)
        3
        >>> integer(0, "steps", "solve", minimum=1)
        Traceback (most recent call last):
        ...
        ValueError: solve: `steps` must be an integer >= 1, got 0.
    """
    lo = "" if minimum is None else f" >= {minimum}"
    hi = "" if maximum is None else f" <= {maximum}"
    requirement = f"an integer{lo}{' and' if lo and hi else ''}{hi}"
    if isinstance(value, (bool, np.bool_)):
        raise fail(name, requirement, value, where)
    try:
        result = operator.index(value)
    except TypeError:
        raise fail(name, requirement + " (a static Python int)", value, where) from None
    if (minimum is not None and result < minimum) or (maximum is not None and result > maximum):
        raise fail(name, requirement, value, where)
    return result


def positive_int(value: Any, name: str, where: str | None = None) -> int:
    """An integer >= 1.

    Args:
        value: the value to check.
        name: the argument's name, for the message.
        where: the public function, for the message.

    Returns:
        ``value`` as a Python int.

    Raises:
        ValueError: ``value`` is not an integer >= 1.

    Example:
        >>> from deqlab.checks import positive_int
        >>> positive_int(4, "n")
        4
    """
    return integer(value, name, where, minimum=1)


def number(value: Any, name: str, where: str | None = None, *, lower: float | None = None,
           upper: float | None = None, lower_open: bool = False, upper_open: bool = False,
           allow_traced: bool = False) -> Any:
    """A finite real scalar in the given interval (ends open or closed).

    With ``allow_traced=True`` a traced scalar passes unchecked (its range cannot be read inside
    ``jit``); otherwise a tracer is an error naming the argument.

    Args:
        value: the value to check (Python or NumPy scalar, 0-d array).
        name: the argument's name, for the message.
        where: the public function, for the message.
        lower: lower bound (None: unbounded).
        upper: upper bound (None: unbounded).
        lower_open: exclude ``lower`` itself.
        upper_open: exclude ``upper`` itself.
        allow_traced: let a traced real scalar through unchecked.

    Returns:
        ``value`` as a Python float (a traced scalar unchanged).

    Raises:
        ValueError: ``value`` is None, a bool, not a real scalar, not finite, out of the interval,
            or traced without ``allow_traced``.

    Example:
        >>> from deqlab.checks import number
        >>> number(0.5, "damping", lower=0.0, upper=1.0, lower_open=True)
        0.5
    """
    left = "" if lower is None else ("> " if lower_open else ">= ") + f"{lower:g}"
    right = "" if upper is None else ("< " if upper_open else "<= ") + f"{upper:g}"
    bounds = " and ".join(b for b in (left, right) if b)
    requirement = "a finite real number" + (f" {bounds}" if bounds else "")
    if isinstance(value, jax.core.Tracer):
        if allow_traced and jnp.ndim(value) == 0 and jnp.issubdtype(value.dtype, jnp.number):
            return value
        raise fail(name, requirement + " known outside jit (a static value)", value, where)
    if isinstance(value, (bool, np.bool_)) or value is None:
        raise fail(name, requirement, value, where)
    try:
        array = np.asarray(value)
    except Exception:  # noqa: BLE001 - anything that is not array-like is a bad number
        raise fail(name, requirement, value, where) from None
    if array.ndim != 0 or array.dtype.kind not in "iuf":
        raise fail(name, requirement, value, where)
    x = float(array)
    bad = not math.isfinite(x)
    if lower is not None:
        bad |= x <= lower if lower_open else x < lower
    if upper is not None:
        bad |= x >= upper if upper_open else x > upper
    if bad:
        raise fail(name, requirement, value, where)
    return x


def positive_number(value: Any, name: str, where: str | None = None, *, allow_traced: bool = False) -> float:
    """A finite real number > 0.

    Args:
        value: the value to check.
        name: the argument's name, for the message.
        where: the public function, for the message.
        allow_traced: let a traced real scalar through unchecked.

    Returns:
        ``value`` as a Python float (a traced scalar unchanged).

    Raises:
        ValueError: ``value`` is not a finite real number > 0.

    Example:
        >>> from deqlab.checks import positive_number
        >>> positive_number(1e-5, "tol")
        1e-05
    """
    return number(value, name, where, lower=0.0, lower_open=True, allow_traced=allow_traced)


def unit_interval(value: Any, name: str, where: str | None = None, *, allow_traced: bool = False) -> float:
    """A number in (0, 1] (damping factors, step lengths).

    Args:
        value: the value to check.
        name: the argument's name, for the message.
        where: the public function, for the message.
        allow_traced: let a traced real scalar through unchecked.

    Returns:
        ``value`` as a Python float (a traced scalar unchanged).

    Raises:
        ValueError: ``value`` is not a finite real number in (0, 1].

    Example:
        >>> from deqlab.checks import unit_interval
        >>> unit_interval(1, "damping")
        1.0
    """
    return number(value, name, where, lower=0.0, upper=1.0, lower_open=True, allow_traced=allow_traced)


def choice(value: Any, name: str, options: Iterable[str], where: str | None = None) -> str:
    """One of ``options`` (strings).

    Args:
        value: the value to check.
        name: the argument's name, for the message.
        options: the allowed strings.
        where: the public function, for the message.

    Returns:
        ``value``.

    Raises:
        ValueError: ``value`` is not one of ``options``.

    Example:
        >>> from deqlab.checks import choice
        >>> choice("relu", "phi", ("tanh", "relu"))
        'relu'
    """
    options = tuple(options)
    if not isinstance(value, str) or value not in options:
        raise fail(name, f"one of {', '.join(repr(o) for o in options)}", value, where)
    return value


def floating_dtype(dtype: Any, name: str = "dtype", where: str | None = None) -> np.dtype:
    """A real floating-point dtype (float16, bfloat16, float32, float64).

    ``None`` is refused: ``jnp.dtype(None)`` would silently answer the default float.

    Args:
        dtype: anything ``jnp.dtype`` accepts.
        name: the argument's name, for the message.
        where: the public function, for the message.

    Returns:
        The dtype, a ``numpy.dtype``.

    Raises:
        ValueError: ``dtype`` is None, not a dtype, or not a real floating-point dtype.

    Example:
        >>> from deqlab.checks import floating_dtype
        >>> floating_dtype("bfloat16")
        dtype(bfloat16)
    """
    requirement = "a real floating-point dtype such as jnp.float32"
    if dtype is None:  # jnp.dtype(None) is the default float (float64 under x64): not what was meant
        raise fail(name, requirement + " (None is not a dtype here)", dtype, where)
    try:
        result = jnp.dtype(dtype)
    except TypeError:
        raise fail(name, requirement, dtype, where) from None
    if not jnp.issubdtype(result, jnp.floating):
        raise fail(name, requirement, result, where)
    return result


def prng_key(key: Any, name: str = "key", where: str | None = None) -> jax.Array:
    """A JAX PRNG key: ``jax.random.key(seed)`` or a raw ``uint32[2]`` from ``PRNGKey``.

    Args:
        key: the value to check.
        name: the argument's name, for the message.
        where: the public function, for the message.

    Returns:
        ``key`` unchanged.

    Raises:
        ValueError: ``key`` is an int seed, an array of several keys, or any other non-key.

    Example:
        >>> import jax
        >>> from deqlab.checks import prng_key
        >>> prng_key(jax.random.key(0)).shape
        ()
    """
    requirement = "a JAX PRNG key such as jax.random.key(0) (not an int seed)"
    if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
        raise fail(name, requirement, key, where)
    if not hasattr(key, "dtype") or not hasattr(key, "shape"):
        raise fail(name, requirement, key, where)
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise fail(name, "a single PRNG key (shape ())", f"an array of keys of shape {key.shape}", where)
        return key
    if key.dtype != jnp.uint32 or tuple(key.shape) != (2,):
        raise fail(name, requirement, f"an array of dtype {key.dtype} and shape {tuple(key.shape)}", where)
    return key


def seed_list(value: Any, name: str = "seeds", where: str | None = None) -> list[int]:
    """A non-empty sequence of distinct integers >= 0, as a list of Python ``int``.

    (The seeds that one sweep configuration trains together.)

    Args:
        value: the value to check.
        name: the argument's name, for the message.
        where: the public function, for the message.

    Returns:
        The seeds, a list of Python ints.

    Raises:
        ValueError: ``value`` is not a non-empty sequence, holds a non-integer or negative
            entry, or repeats a seed.

    Example:
        >>> from deqlab.checks import seed_list
        >>> seed_list((0, 1, 2))
        [0, 1, 2]
    """
    from collections.abc import Sequence

    if isinstance(value, (int, np.integer, str)) or not isinstance(value, Sequence) or len(value) == 0:
        raise fail(name, "a non-empty list of integers >= 0", value, where)
    seeds = [integer(s, name, where, minimum=0) for s in value]
    if len(set(seeds)) != len(seeds):
        raise fail(name, "distinct integers", value, where)
    return seeds


def missing_methods(cls: type, base: str, signatures: dict[str, str]) -> TypeError | None:
    """The ``TypeError`` for instantiating ``cls`` while it leaves abstract methods undefined
    (``abc``), naming them with their signatures; None when it defines them all.

    The one check behind :class:`deqlab.Solver`, :class:`deqlab.backward.Backward` and
    :class:`deqlab.backward.LinearSolver` (their ``__new__``), whose required methods are
    ``abc.abstractmethod``: the message says what to write, where Python's says only what is
    missing.

    Args:
        cls: the class being instantiated.
        base: the base class's public name, for the message.
        signatures: each abstract method's signature as the message shows it.

    Returns:
        The error (raise it), or None.

    Example:
        >>> import abc
        >>> from deqlab.checks import missing_methods
        >>> class Base(abc.ABC):
        ...     @abc.abstractmethod
        ...     def step(self, x): ...
        >>> print(missing_methods(Base, "Base", {"step": "step(self, x) -> y"}))
        Base cannot be instantiated: a Base subclass must define step(self, x) -> y; Base does not define `step`.
    """
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if not missing:
        return None
    return TypeError(
        f"{cls.__name__} cannot be instantiated: a {base} subclass must define "
        + " and ".join(signatures.get(name, name) for name in missing)
        + f"; {cls.__name__} does not define " + " or ".join(f"`{name}`" for name in missing) + "."
    )
