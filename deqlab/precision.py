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
    """A tolerance below what the dtype (or the matmul precision) can reach."""


def _dtype_name(dtype: Any) -> str:
    return jnp.dtype(dtype).name


def default_tol(dtype: Any) -> float:
    """Default relative-residual tolerance of a solve whose iterate has this dtype."""
    dtype = checks.floating_dtype(dtype, "dtype", "precision.default_tol")
    return _DEFAULT_TOL.get(_dtype_name(dtype), 1e-5)


def attainable_tol(dtype: Any) -> float:
    """About the smallest relative residual a solve in this dtype reaches: 4 machine epsilons.

    Rounding f(z) to the dtype perturbs it by half an epsilon per entry; accumulated over a
    matmul and the residual's norm this leaves a floor of one to a few epsilons (measured on the
    solver page of the book: float32 solves settle at 1-3e-7).
    """
    return 4.0 * float(jnp.finfo(checks.floating_dtype(dtype, "dtype", "precision.attainable_tol")).eps)


def check_tol(tol: float, dtype: Any, where: str = "solve") -> None:
    """Warn once per (dtype, tol) when ``tol`` is below :func:`attainable_tol`."""
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
    """A matmul precision named by :data:`PRECISIONS` (or a ``jax.lax.Precision``), normalised."""
    if precision is None:
        raise checks.fail("precision", f"one of {', '.join(repr(p) for p in PRECISIONS)}", precision, where)
    return _normalise(precision, where)


def required_precision(tol: float, dtype: Any) -> str:
    """The cheapest matmul precision whose stall residual stays 10x below ``tol`` for this dtype:
    float32 ``"default"`` for ``tol >= 3e-3``, ``"high"`` for ``tol >= 4e-6`` (the float32
    default 1e-5 included), ``"highest"`` below.

    Only float32 has a choice: 16-bit iterates are rounded more coarsely than any matmul, and
    float64 matmuls are never demoted.
    """
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
    """Evaluate the enclosed traced code with this default matmul precision (None: unchanged)."""
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
    """
    if not isinstance(enabled, (bool, np.bool_)):
        raise checks.fail("enabled", "True or False", enabled, "precision.emulate_accelerator_matmuls")
    token = _emulation.set(bool(enabled))
    try:
        yield
    finally:
        _emulation.reset(token)


def emulating() -> bool:
    """True inside :func:`emulate_accelerator_matmuls`."""
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
    it is exactly ``jax.lax.dot_general``.
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
    """The dtype of a solver's reductions and small systems: at least float32 (``dtype`` a real
    floating-point dtype; None or an integer dtype is refused, not promoted)."""
    return jnp.promote_types(checks.floating_dtype(dtype, "dtype", "precision.working_dtype"), jnp.float32)
