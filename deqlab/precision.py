"""Floating-point precision of a solve: default tolerances per dtype and matmul precision.

Two facts decide how close to its fixed point a solve can get.

**The dtype of z.** A relative residual cannot fall much below the machine epsilon of the dtype it
is computed in. :func:`default_tol` gives each dtype a default tolerance that leaves room above
that floor (:func:`attainable_tol`): float64 ``1e-10`` (tight enough that implicit gradients agree
with central differences to about 1e-8), float32 ``1e-5``, float16 ``1e-2``, bfloat16 ``5e-2``.
A tolerance below the floor makes a solver run to ``max_steps``; :func:`check_tol` warns once.

**The precision of the matmuls inside f.** On TPUs, and on NVIDIA GPUs with TF32, a float32
matmul runs by default with bfloat16 operands (8 significant bits; JAX's ``Precision.DEFAULT``).
f is then only known to about 4e-3 relative, and a float32 solve stalls near a relative residual
of 1e-4 to 3e-4: a solve to ``tol = 1e-5`` never converges. ``"high"`` (three bfloat16 passes, about 16
bits; stalls near 4e-7) and ``"highest"`` (full float32, six passes on TPU) fix this at a cost.
:func:`required_precision` gives the cheapest precision that reaches a tolerance; the solvers
evaluate f, and the implicit backward its vector-Jacobian products, under it unless told
otherwise (``precision=`` of :func:`deqlab.solvers.solve`, :func:`deqlab.backward.fixed_point` and
:class:`deqlab.nn.DEQ`). Explicit ``precision=`` on a user's own ``jnp.dot`` always wins over
this context.

**What a TPU user should set.** Nothing, for a float32 solve at the default tolerance 1e-5: it
runs its matmuls at ``"high"``. For speed, loosen the tolerance (``tol >= 3e-3`` runs at the
hardware default, one pass); for ``tol < 4e-6`` it runs at ``"highest"``. float64 is emulated on
TPU and slow: use it for checks, not training.

**Emulation on CPU.** A CPU computes float32 matmuls exactly whatever the precision says, so the
TPU behaviour is invisible there. Inside ``with emulate_accelerator_matmuls():``, the matmuls of
deqlab's cells (which go through :func:`dot_general`) round their float32 operands the way a TPU
does: to bfloat16 at ``"default"`` (float32 accumulation), to a three-term bfloat16 split at
``"high"``, not at all at ``"highest"``. The book's solver page uses it to show the stall and
the fix.
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import checks

__all__ = [
    "PRECISIONS",
    "default_tol",
    "attainable_tol",
    "check_tol",
    "required_precision",
    "matmul_precision",
    "check_precision",
    "dot_general",
    "emulate_accelerator_matmuls",
    "emulating",
    "PrecisionWarning",
    "working_dtype",
]

PRECISIONS = ("default", "high", "highest")
"""Matmul precisions, as ``jax.default_matmul_precision`` names them (fastest first)."""

# Relative residual at which a float32 solve stalls when f's matmuls run at each precision,
# measured with emulate_accelerator_matmuls on tanh DEQ cells (width 256 at sqrt(V) = 0.9 and
# width 1024 at 0.95, batch 32; the worst of the two medians): bfloat16 operands leave ~3e-4,
# three bfloat16 passes ~4e-7, full float32 ~1.2e-7 (the dtype's own floor). A tolerance 10x above
# a floor is reached in as many steps as in exact arithmetic (measured on the book's solver page).
_STALL_RESIDUAL = {"default": 3e-4, "high": 4e-7, "highest": 1.2e-7}

_DEFAULT_TOL = {"float64": 1e-10, "float32": 1e-5, "float16": 1e-2, "bfloat16": 5e-2}

_emulation = contextvars.ContextVar("deqlab_emulate_accelerator_matmuls", default=False)
_warned_tols: set[tuple[str, float]] = set()


class PrecisionWarning(UserWarning):
    """A tolerance below what the dtype (or the matmul precision) can reach.

    Issued by :func:`check_tol`, once per (dtype, tolerance) pair.

    Example:
        >>> import warnings
        >>> import jax.numpy as jnp
        >>> from deqlab.precision import PrecisionWarning, check_tol
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     check_tol(1e-9, jnp.float32, where="example")
        >>> caught[0].category is PrecisionWarning
        True
    """


def _dtype_name(dtype: Any) -> str:
    return jnp.dtype(dtype).name


def default_tol(dtype: Any) -> float:
    """Default relative-residual tolerance of a solve whose iterate has this dtype.

    float64 ``1e-10``, float32 ``1e-5``, float16 ``1e-2``, bfloat16 ``5e-2`` (any other floating
    dtype: ``1e-5``), each well above the dtype's :func:`attainable_tol`.

    Args:
        dtype: a real floating-point dtype (``jnp.float32``, ``"float64"``, ...).

    Returns:
        The tolerance, a Python float.

    Raises:
        ValueError: ``dtype`` is None or not a real floating-point dtype.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.precision import default_tol
        >>> default_tol(jnp.float32), default_tol(jnp.float64), default_tol(jnp.bfloat16)
        (1e-05, 1e-10, 0.05)
    """
    dtype = checks.floating_dtype(dtype, "dtype", "precision.default_tol")
    return _DEFAULT_TOL.get(_dtype_name(dtype), 1e-5)


def attainable_tol(dtype: Any) -> float:
    """About the smallest relative residual a solve in this dtype reaches: 4 machine epsilons.

    Rounding f(z) to the dtype perturbs it by half an epsilon per entry; accumulated over a
    matmul and the residual's norm this leaves a floor of one to a few epsilons.

    Args:
        dtype: a real floating-point dtype.

    Returns:
        ``4 * jnp.finfo(dtype).eps``, a Python float.

    Raises:
        ValueError: ``dtype`` is None or not a real floating-point dtype.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.precision import attainable_tol
        >>> f"{attainable_tol(jnp.float32):.2e}"
        '4.77e-07'
    """
    return 4.0 * float(jnp.finfo(checks.floating_dtype(dtype, "dtype", "precision.attainable_tol")).eps)


def check_tol(tol: float, dtype: Any, where: str = "solve") -> None:
    """Warn once per (dtype, tol) when ``tol`` is below :func:`attainable_tol`.

    Args:
        tol: the tolerance asked for, a finite number > 0.
        dtype: the dtype of the iterate.
        where: the public function named in the warning.

    Raises:
        ValueError: ``tol`` is not a finite number > 0, or ``dtype`` is not a floating dtype.

    Warns:
        PrecisionWarning: ``tol < attainable_tol(dtype)`` (once per pair).

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.precision import check_tol
        >>> check_tol(1e-5, jnp.float32)  # reachable: silent
    """
    if checks.is_traced(tol):  # its value is not known here; the solve still honours it
        return
    tol = checks.positive_number(tol, "tol", where)
    floor = attainable_tol(dtype)
    name = _dtype_name(dtype)
    if tol >= floor or (name, tol) in _warned_tols:
        return
    _warned_tols.add((name, tol))
    warnings.warn(
        f"{where}: tol={tol:g} is below what {name} can reach in general (relative residuals of "
        f"maps with matmuls settle near {floor:.1e}); the solve may run to max_steps without "
        "converging. Use "
        f"tol >= {floor:.1e}, or a wider dtype (float64 needs jax.config.update('jax_enable_x64', "
        "True)).",
        PrecisionWarning,
        stacklevel=3,
    )


def _normalise(precision: Any, where: str | None = None) -> str | None:
    if precision is None:
        return None
    if isinstance(precision, jax.lax.Precision):
        return {jax.lax.Precision.DEFAULT: "default", jax.lax.Precision.HIGH: "high"}.get(precision, "highest")
    names = {"bfloat16": "default", "tensorfloat32": "high", "float32": "highest", "fastest": "default"}
    if isinstance(precision, str) and precision.lower() in names:
        return names[precision.lower()]
    return checks.choice(precision, "precision", PRECISIONS, where)


def check_precision(precision: Any, where: str | None = None) -> str:
    """A matmul precision named by :data:`PRECISIONS` (or a ``jax.lax.Precision``), normalised.

    Also accepts JAX's aliases ``"bfloat16"``/``"fastest"`` (``"default"``), ``"tensorfloat32"``
    (``"high"``) and ``"float32"`` (``"highest"``).

    Args:
        precision: a name of :data:`PRECISIONS`, one of the aliases, or a ``jax.lax.Precision``.
        where: the public function named in an error message.

    Returns:
        One of ``"default"``, ``"high"``, ``"highest"``.

    Raises:
        ValueError: ``precision`` is None or not a known precision.

    Example:
        >>> import jax
        >>> from deqlab.precision import check_precision
        >>> check_precision("float32"), check_precision(jax.lax.Precision.HIGH)
        ('highest', 'high')
    """
    if precision is None:
        raise checks.fail("precision", f"one of {', '.join(repr(p) for p in PRECISIONS)}", precision, where)
    return _normalise(precision, where)


def required_precision(tol: float, dtype: Any) -> str:
    """The cheapest matmul precision whose stall residual stays 10x below ``tol`` for this dtype.

    float32: ``"default"`` for ``tol >= 3e-3``, ``"high"`` for ``tol >= 4e-6`` (the float32
    default 1e-5 included), ``"highest"`` below. Only float32 has a choice: 16-bit iterates are
    rounded more coarsely than any matmul (``"default"``), and float64 matmuls are never demoted
    (``"highest"``).

    Args:
        tol: the solve's tolerance, a finite number > 0 (a traced tolerance, whose value cannot
            be read, gives ``"highest"``).
        dtype: the dtype of the iterate.

    Returns:
        One of :data:`PRECISIONS`.

    Raises:
        ValueError: ``tol`` is not a finite number > 0, or ``dtype`` is not a floating dtype.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.precision import required_precision
        >>> [required_precision(t, jnp.float32) for t in (1e-2, 1e-5, 1e-6)]
        ['default', 'high', 'highest']
    """
    if checks.is_traced(tol):  # a traced tolerance (a swept or differentiated setting): be safe
        return "highest"
    checks.positive_number(tol, "tol", "precision.required_precision")
    dtype = checks.floating_dtype(dtype, "dtype", "precision.required_precision")
    if _dtype_name(dtype) != "float32":
        return "highest" if _dtype_name(dtype) == "float64" else "default"
    for level in PRECISIONS:
        if 10.0 * _STALL_RESIDUAL[level] <= tol:
            return level
    return "highest"


@contextlib.contextmanager
def matmul_precision(precision: Any) -> Iterator[None]:
    """Evaluate the enclosed traced code with this default matmul precision (None: unchanged).

    A thin wrapper of ``jax.default_matmul_precision`` that also accepts None and the names of
    :func:`check_precision`. Like it, it affects code traced inside the context.

    Args:
        precision: None, a name of :data:`PRECISIONS` or an alias, or a ``jax.lax.Precision``.

    Returns:
        A context manager.

    Raises:
        ValueError: ``precision`` is not a known precision.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.precision import matmul_precision
        >>> with matmul_precision("highest"):
        ...     y = jnp.ones((2, 2)) @ jnp.ones(2)
        >>> y.tolist()
        [2.0, 2.0]
    """
    level = _normalise(precision, "matmul_precision")
    if level is None:
        yield
        return
    with jax.default_matmul_precision(level):
        yield


@contextlib.contextmanager
def emulate_accelerator_matmuls(enabled: bool = True) -> Iterator[None]:
    """Within this context, :func:`dot_general` rounds float32 operands as a TPU does.

    Applies to code traced inside the context (call ``jax.jit`` functions for the first time
    inside it, or clear their cache).

    Args:
        enabled: True to emulate, False to turn an enclosing emulation off.

    Returns:
        A context manager.

    Raises:
        ValueError: ``enabled`` is not a bool.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.precision import dot_general, emulate_accelerator_matmuls
        >>> x = jnp.array([[1.0 + 2.0**-12]])
        >>> dims = (((1,), (0,)), ((), ()))
        >>> with emulate_accelerator_matmuls():
        ...     rounded = dot_general(x, jnp.ones((1, 1)), dims, precision="default")
        >>> float(rounded[0, 0])  # the operand was rounded to bfloat16 (8 significant bits)
        1.0
    """
    if not isinstance(enabled, (bool, np.bool_)):
        raise checks.fail("enabled", "True or False", enabled, "precision.emulate_accelerator_matmuls")
    token = _emulation.set(bool(enabled))
    try:
        yield
    finally:
        _emulation.reset(token)


def emulating() -> bool:
    """True inside :func:`emulate_accelerator_matmuls`.

    Returns:
        Whether float32 matmuls of :func:`dot_general` are being emulated.

    Example:
        >>> from deqlab.precision import emulate_accelerator_matmuls, emulating
        >>> with emulate_accelerator_matmuls():
        ...     inside = emulating()
        >>> inside, emulating()
        (True, False)
    """
    return _emulation.get()


def _effective_level(precision: Any) -> str:
    if precision is not None:
        if isinstance(precision, (tuple, list)):
            precision = precision[0]
        level = _normalise(precision)
        if level is not None:
            return level
    configured = jax.config.jax_default_matmul_precision
    return _normalise(configured) or "default"


def _split_bf16(x):
    high = x.astype(jnp.bfloat16)
    low = (x - high.astype(x.dtype)).astype(jnp.bfloat16)
    return high, low


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kwargs):
    """``jax.lax.dot_general`` that honours :func:`emulate_accelerator_matmuls` on CPU.

    Pass it as ``dot_general=`` of ``flax.nnx.Linear`` (deqlab's cells do). Outside the emulation
    it is exactly ``jax.lax.dot_general``. Inside it, float32 operands are rounded as the
    precision says (to bfloat16 at ``"default"``, to a three-term bfloat16 split at ``"high"``,
    not at all at ``"highest"``) and the products accumulated in float32.

    Args:
        lhs: left operand.
        rhs: right operand.
        dimension_numbers: as for ``jax.lax.dot_general``.
        precision: as for ``jax.lax.dot_general``; None follows ``jax.default_matmul_precision``.
        preferred_element_type: as for ``jax.lax.dot_general``.
        **kwargs: passed to ``jax.lax.dot_general`` outside the emulation.

    Returns:
        The contraction, as ``jax.lax.dot_general`` returns it.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.precision import dot_general
        >>> dot_general(jnp.ones((2, 3)), jnp.ones((3,)), (((1,), (0,)), ((), ()))).tolist()
        [3.0, 3.0]
    """
    both_f32 = jnp.result_type(lhs) == jnp.float32 and jnp.result_type(rhs) == jnp.float32
    if not (emulating() and both_f32):
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                   preferred_element_type=preferred_element_type, **kwargs)
    level = _effective_level(precision)
    exact = jax.lax.Precision.HIGHEST

    def product(a, b):
        return jax.lax.dot_general(a, b, dimension_numbers, precision=exact,
                                   preferred_element_type=jnp.float32)

    if level == "highest":
        out = product(lhs, rhs)
    elif level == "high":
        a_hi, a_lo = _split_bf16(lhs)
        b_hi, b_lo = _split_bf16(rhs)
        out = product(a_hi, b_hi) + product(a_hi, b_lo) + product(a_lo, b_hi)
    else:
        out = product(lhs.astype(jnp.bfloat16), rhs.astype(jnp.bfloat16))
    return out.astype(preferred_element_type or jnp.float32)


def working_dtype(dtype: Any) -> np.dtype:
    """The dtype of a solver's reductions and small systems: at least float32.

    Args:
        dtype: a real floating-point dtype (None or an integer dtype is refused, not promoted).

    Returns:
        ``jnp.promote_types(dtype, float32)``.

    Raises:
        ValueError: ``dtype`` is None or not a real floating-point dtype.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.precision import working_dtype
        >>> working_dtype(jnp.bfloat16), working_dtype(jnp.float32)
        (dtype('float32'), dtype('float32'))
    """
    return jnp.promote_types(checks.floating_dtype(dtype, "dtype", "precision.working_dtype"), jnp.float32)
