"""Fast eager calls: the computation of :func:`deqlab.solvers.solve` and :func:`deqlab.backward.fixed_point` under
one internal ``jax.jit``, cached on the function and the static configuration.

Called outside ``jit``, a solve used to trace and compile its loop (``lax.while_loop``) on every
call: about a second even for a 4x8 problem. :func:`cached_call` runs the computation under a
``jax.jit`` whose static arguments are the function ``f`` (hashed by identity, as a Python function
is), the backward object and the other options (hashed by value), and the non-array leaves of the
inputs (the solver is an input: its Python-number settings are static leaves, its array settings
traced); the array leaves (jax and NumPy arrays and NumPy scalars, and tracers of outer
transformations) are its traced arguments. This is how equinox's ``filter_jit``
partitions its arguments (``equinox.is_array``), without depending on equinox: a Python ``int`` that
``f`` uses as a shape stays a Python ``int``, and a new value of it compiles again.

The second call with the same ``f`` object, configuration, non-array leaves and array shapes and
dtypes reuses the compiled computation; ``jax.grad``, ``jax.vmap`` and ``jax.jit`` from outside go
through the internal ``jit`` (JAX caches its derivatives and batched versions on the traced jaxpr,
so an eager ``jax.grad`` hits the cache too). A new ``f`` object (a ``lambda`` written in the call,
a ``functools.partial`` made each time) compiles again, as with ``jax.jit`` itself.

What ``f`` reads besides its arguments would be baked into the compiled computation, so it is
part of the key (:func:`_captured`): arrays read from ``f``'s closure or from the globals it names
by identity (``f = lambda z, x: jnp.tanh(W @ z + x)`` in a notebook, then ``W = ...`` again
compiles again), scalars and strings by value, the attributes ``f`` reads of a module or class of
one's own (``C.a``, ``config.scale``) the same way, and the functions ``f`` calls are followed in the
same way (inherited class attributes and code nested in ``f`` included). A change of any of them
compiles again; the programs compiled for the last :data:`PROGRAMS_PER_FUNCTION` values are kept
(a loop alternating between two values of ``W`` compiles each once), older ones are released
(each holds its values as constants), and so is everything compiled for a function that no
longer exists (a notebook cell that redefines ``f``). An ``f`` that reads state the key cannot follow, because its contents can change while
the object stays the same (a callable object such as an ``nnx.Module`` or a bound method, whose
parameters change in training; a list or dict), runs uncached: correct, and as slow as before the
cache. NumPy arrays changed in place are not seen: pass changing arrays as arguments of ``f``.

Inputs that cannot be cached (an unhashable non-array leaf) and functions that need concrete array
values (``float(arg)``, NumPy on an argument) run the uncached computation too.
"""

from __future__ import annotations

import collections
import functools
import types
import warnings
import weakref
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["cached_call", "is_array", "check_finite", "is_traced", "UncachedCallWarning"]


class UncachedCallWarning(UserWarning):
    """An eager :func:`deqlab.solvers.solve` / :func:`deqlab.backward.fixed_point` call that runs
    uncached (it traces and compiles again at every call), with the reason; issued once per
    function.

    Example:
        >>> import warnings, deqlab
        >>> warnings.simplefilter("ignore", deqlab.solvers.UncachedCallWarning)   # silence it
    """


_warned: set = set()  # (code location of f, reason) already warned about


def _warn_uncached(f, reason: str) -> None:
    """Warn once per function and reason that an eager call of it runs uncached."""
    target = f.func if isinstance(f, functools.partial) else f
    code = getattr(target, "__code__", None)
    where = (code.co_filename, code.co_firstlineno) if code is not None else type(target).__qualname__
    if (where, reason) in _warned:
        return
    _warned.add((where, reason))
    from deqlab.failures import user_stacklevel  # here: failures imports nothing of this module

    name = getattr(target, "__qualname__", type(target).__qualname__)
    warnings.warn(f"{name} runs uncached (traced and compiled at every call, about a second each): "
                  f"{reason}. Wrap the caller in jax.jit, or pass what changes as arguments of f.",
                  UncachedCallWarning, stacklevel=user_stacklevel())

# A function that needs concrete argument values cannot run under the internal jit: such calls
# fall back to the uncached computation (where the arguments are concrete, as before the cache).
_NEEDS_CONCRETE = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.TracerBoolConversionError,
)


def is_array(leaf: Any) -> bool:
    """A leaf traced by the internal jit: a jax array (or tracer), a NumPy array or scalar."""
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic))


def is_traced(tree: Any) -> bool:
    """True when any leaf of ``tree`` is a tracer of an outer transformation."""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(tree))


class _Static:
    """A pytree node with no children holding a non-array output leaf (in its aux data), so that
    it passes through ``jax.jit``'s outputs unchanged."""

    def __init__(self, value):
        self.value = value


jax.tree_util.register_pytree_node(_Static, lambda s: ((), s.value), lambda value, _: _Static(value))


def _partition(tree):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    arrays = tuple(is_array(leaf) for leaf in leaves)
    dynamic = [leaf for leaf, keep in zip(leaves, arrays) if keep]
    static = tuple(None if keep else leaf for leaf, keep in zip(leaves, arrays))
    return dynamic, (treedef, arrays, static)


def _combine(dynamic, static):
    treedef, arrays, leaves = static
    dynamic = iter(dynamic)
    return jax.tree_util.tree_unflatten(
        treedef, [next(dynamic) if keep else leaf for keep, leaf in zip(arrays, leaves)]
    )


def _traced_body(body, f_ref, static, options, dynamic):
    out = body(f_ref(), *_combine(dynamic, static), **dict(options))
    return jax.tree_util.tree_map(lambda leaf: leaf if is_array(leaf) else _Static(leaf), out)


#: The compiled programs of eager calls, per function ``f`` (held weakly: a function a notebook
#: redefines is dropped with its programs): for each (body, non-array inputs, options) and each
#: key of what ``f`` reads (:func:`_captured`), one ``jax.jit``. What f reads from its closure and
#: globals is baked into the program as constants, so the programs for values that changed are
#: released once more than :data:`PROGRAMS_PER_FUNCTION` are held for f (least recently used
#: first): a loop that alternates between a few values of ``W`` compiles each once, and a
#: notebook that rebinds a 36 MB ``W`` again and again no longer keeps every old one (0.9.0's first
#: build kept 144 MB of constants per rebinding).
_PROGRAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PROGRAMS_STRONG: dict = {}  # functions that take no weak reference (rare): held, bounded alike
PROGRAMS_PER_FUNCTION = 4


def _program(body, f, static, options, captured):
    try:
        table = _PROGRAMS.setdefault(f, collections.OrderedDict())
        f_ref = weakref.ref(f)
    except TypeError:  # no weak reference to f
        table = _PROGRAMS_STRONG.setdefault(id(f), collections.OrderedDict())
        f_ref = (lambda f: lambda: f)(f)
    key = (body, static, options, captured)
    jitted = table.get(key)
    if jitted is None:
        # the program refers to f weakly: only tracing calls it, and a strong reference here would
        # keep f (and so this table) alive for ever
        jitted = jax.jit(functools.partial(_traced_body, body, f_ref, static, options))
        table[key] = jitted
        while len(table) > PROGRAMS_PER_FUNCTION:
            table.popitem(last=False)
    table.move_to_end(key)
    return jitted


def _unwrap(out):
    return jax.tree_util.tree_map(
        lambda leaf: leaf.value if isinstance(leaf, _Static) else leaf, out,
        is_leaf=lambda leaf: isinstance(leaf, _Static),
    )


class _ByIdentity:
    """Hashes and compares an array by identity, through a weak reference: a cache entry neither
    keeps the array alive (a notebook that rebinds a large ``W`` does not accumulate old ones) nor
    matches another array that reuses its ``id`` after it is freed (the dead reference is ``None``)."""

    __slots__ = ("ref", "key")

    def __init__(self, obj):
        self.ref = weakref.ref(obj)
        self.key = id(obj)

    def __hash__(self):
        return self.key

    def __eq__(self, other):
        return isinstance(other, _ByIdentity) and self.key == other.key and self.ref() is not None \
            and self.ref() is other.ref()


class _Uncacheable(Exception):
    """``f`` reads state that the key cannot follow (a module's parameters, a list, an object)."""


#: Values ``f`` may read from its closure or globals without defeating the cache: immutable
#: scalars and strings (keyed by value), modules, classes and builtins (keyed by identity).
_PLAIN = (bool, int, float, complex, str, bytes, type(None), types.ModuleType, type,
          types.BuiltinFunctionType, types.BuiltinMethodType)


def _captured(f, seen: set | None = None, depth: int = 0) -> tuple:
    """The cache key of what ``f`` reads besides its arguments.

    Arrays read from ``f``'s closure cells and from the globals it names are keyed by identity;
    scalars and strings by value; modules, classes and builtins by identity, and the attributes
    ``f``'s code may read of a module or class that is not a library's as if ``f`` read them
    directly; functions it reads
    are followed (a helper reading a global ``W``), to a depth of 4. Anything else (an object with
    state, such as an ``nnx.Module`` whose parameters change in training, a list, a dict, a bound
    method) raises :class:`_Uncacheable`: its contents could change without the key changing, so
    the call runs uncached (correct, and as slow as before the cache).
    """
    seen = set() if seen is None else seen
    if id(f) in seen:
        return ()
    seen.add(id(f))
    while isinstance(f, functools.partial):
        for value in (*f.args, *f.keywords.values()):
            if not (is_array(value) or isinstance(value, _PLAIN)):
                raise _Uncacheable
        f = f.func
    if not isinstance(f, types.FunctionType):
        if isinstance(f, (types.BuiltinFunctionType, jax.custom_jvp, jax.custom_vjp)):
            return ()
        raise _Uncacheable  # a callable object (nnx.Module, bound method): state the key cannot see
    if depth > 4:
        raise _Uncacheable
    # The names f's code loads, its nested code included (a generator expression, a lambda or a
    # function defined inside f are code objects of their own).
    names = _loaded_names(f.__code__)
    values = [cell.cell_contents for cell in (f.__closure__ or ()) if _cell_filled(cell)]
    values += [f.__globals__[name] for name in names if name in f.__globals__]
    # A module or class f reads is keyed by identity, and the attributes f may read from it
    # (the names its code loads: `C.a` loads `a`) by value, as if f read them directly, inherited
    # ones included and following attributes that are themselves a module or class (`K.Inner.s`):
    # a class attribute or a module setting changed between calls compiles again, never a stale
    # result. (Names f's code loads that the object does not hold are nobody's attributes.)
    holders, seen_holders = [value for value in values if _user_holder(value)], set()
    while holders:
        holder = holders.pop()
        if id(holder) in seen_holders:
            continue
        seen_holders.add(id(holder))
        attributes = [getattr(holder, name) for name in names if _holds(holder, name)]
        values += attributes
        holders += [value for value in attributes if _user_holder(value)]
    key = []
    for value in values:
        if is_array(value):
            key.append(_ByIdentity(value))
        elif _plain_value(value):
            key.append((type(value), value))
        elif isinstance(value, (types.ModuleType, type, types.BuiltinFunctionType, types.BuiltinMethodType)):
            key.append(id(value))
        elif isinstance(value, (types.FunctionType, functools.partial)):
            key.append((id(value), _captured(value, seen, depth + 1)))
        elif isinstance(value, (jax.custom_jvp, jax.custom_vjp)) or getattr(value, "__module__", "") == "jax":
            key.append(id(value))
        else:
            raise _Uncacheable
    return tuple(key)


def _loaded_names(code) -> set:
    """The global and attribute names ``code`` loads, with those of the code objects nested in it."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _loaded_names(const)
    return names


def _user_holder(value) -> bool:
    return isinstance(value, (types.ModuleType, type)) and not _library(value)


def _holds(holder, name) -> bool:
    """Whether ``holder`` (a module, or a class through its MRO) defines ``name``."""
    if isinstance(holder, type):
        return any(name in vars(klass) for klass in holder.__mro__)
    return name in vars(holder)


def _plain_value(value) -> bool:
    """Immutable values keyed by value: scalars, strings, None, NumPy dtypes, and tuples and
    frozensets of them (``shape = (3, 4)``, ``layers = (64, 64)``)."""
    if isinstance(value, (bool, int, float, complex, str, bytes, type(None), np.dtype)):
        return True
    if isinstance(value, (tuple, frozenset)):
        return all(_plain_value(item) for item in value)
    return False


def _library(holder) -> bool:
    """Modules and classes of installed libraries (jax, numpy, flax, deqlab, the standard
    library): their attributes are functions and constants, not a user's changing state."""
    name = holder.__name__ if isinstance(holder, types.ModuleType) else getattr(holder, "__module__", "")
    return (name or "").split(".")[0] in _LIBRARIES


_LIBRARIES = {"jax", "jaxlib", "numpy", "flax", "optax", "deqlab", "math", "functools", "operator",
              "builtins", "scipy", "einops", "typing", "collections", "itertools", "dataclasses"}


def _cell_filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell (a variable not yet assigned)
        return False
    return True


def cached_call(body: Callable[..., Any], f: Callable[..., Any], inputs: tuple, options: dict) -> Any:
    """``body(f, *inputs, **options)`` under a ``jax.jit`` cached on ``(body, f, options, the
    non-array leaves of inputs)`` with the array leaves of ``inputs`` traced.

    ``body`` must be a module-level function (its identity is part of the key). Falls back to the
    uncached ``body(f, *inputs, **options)`` when the key is unhashable or when tracing ``f`` with
    traced arguments needs their concrete values.
    """
    dynamic, static = _partition(inputs)
    key = tuple(sorted(options.items()))
    # Under an outer transformation the caller's own trace compiles once: nothing to cache or warn.
    outer = is_traced(inputs)
    try:
        captured = _captured(f)
        hash((f, static, key, captured))
    except _Uncacheable:
        if not outer:
            _warn_uncached(f, "f reads state the cache cannot follow (a callable object such as an nnx.Module, "
                              "a bound method, a list or dict in its closure or globals)")
        return body(f, *inputs, **options)
    except TypeError:
        if not outer:
            _warn_uncached(f, "an argument, a setting or an option that is not an array is unhashable (a "
                              "list, a dict, an object without __hash__, an array inside a backward mode)")
        return body(f, *inputs, **options)
    try:
        return _unwrap(_program(body, f, static, key, captured)(dynamic))
    except _NEEDS_CONCRETE:
        if not outer:
            _warn_uncached(f, "f (or a hook of a solver or backward mode of your own) needs the concrete values of "
                              "its arguments (float(arg), NumPy on an argument), which a compiled call cannot give")
        return body(f, *inputs, **options)


@jax.jit
def _finite_flags(leaves):
    return jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in leaves])


def check_finite(named: list[tuple[str, Any]], where: str = "") -> None:
    """Raise ValueError naming the first input leaf that holds NaN or inf (concrete floating leaves
    only: tracers are skipped, and inside ``jit`` such inputs surface as ``Result.NONFINITE``).
    One compiled reduction for all the leaves. The leaf is named by its path in the input
    (``args[1]['w']``, or ``cell['recurrent']['kernel']`` for a module's state named ``cell``), and the
    message starts with ``where`` when given."""
    owners, leaves = [], []
    for name, tree in named:
        for index, leaf in enumerate(jax.tree_util.tree_leaves(tree)):
            if isinstance(leaf, jax.core.Tracer) or not hasattr(leaf, "dtype"):
                continue
            if jnp.issubdtype(leaf.dtype, jnp.inexact):
                owners.append((name, tree, index))
                leaves.append(leaf)
    if not leaves:
        return
    with jax.ensure_compile_time_eval():  # concrete constants under an outer jit: evaluate them
        flags = np.asarray(_finite_flags(leaves))
    for (name, tree, index), finite in zip(owners, flags):
        if not finite:  # the leaf's path is worked out here only, off the fast path
            path = jax.tree_util.tree_flatten_with_path(tree)[0][index][0]
            prefix = f"{where}: " if where else ""
            raise ValueError(f"{prefix}`{name}{_path_text(path)}` contains NaN or inf; inputs must be finite.")


def _path_text(path) -> str:
    """A leaf's path as the user wrote it: ``['w']`` / ``[0]`` for dicts and sequences, ``.name``
    for attributes; a Flax ``Variable``'s trailing ``.value`` is dropped (``cell['recurrent']['kernel']``)."""
    text = jax.tree_util.keystr(tuple(path))
    return text[: -len(".value")] if text.endswith(".value") else text
