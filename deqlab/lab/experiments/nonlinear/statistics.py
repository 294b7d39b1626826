"""Simulated statistics of the nonlinear DEQ ``z* = phi(W z*) + x`` (001 §3, Fig. 2-4).

The pre-activation ``h* = W z*`` solves ``h* = W phi(h*) + W x`` (001 Eq. 22) and is the limit of
the iteration ``h_{t+1} = W phi(h_t) + W x`` (001 Eq. 23), started here from ``h_0 = 0``. One
*sample* is one weight matrix ``W = sqrt(V) W0`` (``W0`` from :func:`deqlab.ensembles.sample`)
and one input ``x`` with i.i.d. ``N(0, sigma_x2)`` entries. The functions measure, per sample
and per scale ``sqrt(V)``:

- ``(1/N) h_T . h_T`` at the last iterate, the empirical side of 001 Thm. 3.1 (Eq. 25; 001 Fig. 2),
  compared with :func:`deqlab.theory.meanfield.hidden_variance`;
- the spectral radius of the Jacobian ``diag(phi'(h_T)) W`` of the ``z``-iteration (the same
  eigenvalues as ``W diag(phi'(h_T))``, 001 Eq. 29), compared with
  :func:`deqlab.theory.meanfield.spectral_radius` (001 Eq. 30, 124; 001 Fig. 3);
- the residual ``||h_T - h_{T-1}||`` after ``T`` steps (001 Fig. 4), whose jump from round-off to
  ``O(sqrt(N))`` marks the loss of a stable fixed point near
  :func:`deqlab.theory.meanfield.critical_scale`.

**Common random numbers.** Sample ``j`` uses the same ``W0`` and ``x`` at every scale (only
``sqrt(V)`` changes), so curves across scales are smooth; different samples are independent.

Computation: the iteration is jitted and vmapped over a batch of samples (a ``while_loop`` that
stops when every sample of the batch has converged, or after ``steps``), in float64 when
``jax_enable_x64`` is on (float32 otherwise); the scale is a traced argument, so one compilation
serves all scales. The spectral radius is computed on the host with LAPACK (``numpy.linalg``):
the Jacobian is not normal, and power iteration converges slowly near ``r = 1``.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import checks, ensembles
from deqlab.theory import meanfield

__all__ = ["EquilibriumStatistics", "picard_h", "jacobian_radius", "equilibrium_statistics", "residual_after"]

_MAX_BATCH_BYTES = 2**27  # weight matrices held at once per batch (128 MiB)


class EquilibriumStatistics(NamedTuple):
    """Per scale and sample (arrays of shape ``(len(scales), samples)``, NumPy float64).

    Attributes:
      scales: the ``sqrt(V)`` values, shape ``(S,)``.
      variance: ``(1/N) h_T . h_T`` at the last iterate (001 Eq. 24-25).
      sigma_x2: ``(1/N) x . x`` of the sample's input (001 Eq. 25).
      residual: ``||h_T - h_{T-1}||`` (Euclidean norm, not normalised; 001 Fig. 4).
      steps: the number ``T`` of steps taken.
      converged: ``residual <= tol ||h_T||`` within ``steps`` steps.
      radius: the largest ``|eigenvalue|`` of ``diag(phi'(h_T)) W`` (001 Eq. 29), or ``None`` when
        not requested.
    """

    scales: np.ndarray
    variance: np.ndarray
    sigma_x2: np.ndarray
    residual: np.ndarray
    steps: np.ndarray
    converged: np.ndarray
    radius: np.ndarray | None


def picard_h(phi: str, W: jax.Array, x: jax.Array, steps: int, tol: float = 0.0):
    """Iterate ``h_{t+1} = W phi(h_t) + W x`` from ``h_0 = 0`` (001 Eq. 23) for one sample.

    Stops after ``steps`` steps or when ``||h_{t+1} - h_t|| <= tol ||h_{t+1}||`` (``tol = 0``:
    always ``steps`` steps, unless the residual is exactly zero). Jit- and vmap-safe (``phi``,
    ``steps`` static; ``tol`` may be traced).

    Returns:
      ``(h_T, residual, T)``: the last iterate, ``||h_T - h_{T-1}||`` and the number of steps.
    """
    act = meanfield.nonlinearity(phi, "experiments.nonlinear.statistics.picard_h").jax
    b = W @ x

    def cond(carry):
        _, res, norm, t = carry
        return (t < steps) & (res > tol * norm)

    def body(carry):
        h, _, _, t = carry
        new = W @ act(h) + b
        return new, jnp.linalg.norm(new - h), jnp.linalg.norm(new), t + 1

    inf = jnp.asarray(jnp.inf, x.dtype)
    h, res, _, t = jax.lax.while_loop(cond, body, (jnp.zeros_like(x), inf, jnp.zeros((), x.dtype), 0))
    return h, res, t


@functools.partial(jax.jit, static_argnames=("phi", "ensemble", "n", "steps", "dtype", "keep_w"))
def _batch(keys, scale, sigma_x, tol, *, phi, ensemble, n, steps, dtype, keep_w):
    def one(key):
        k_w, k_x = jax.random.split(key)
        W = ensembles.sample(ensemble, k_w, n, scale, dtype)
        x = sigma_x * jax.random.normal(k_x, (n,), dtype)
        h, res, t = picard_h(phi, W, x, steps, tol)
        out = (h @ h / n, x @ x / n, res, t, res <= tol * jnp.linalg.norm(h))
        return out + ((W, h) if keep_w else ())

    return jax.vmap(one)(keys)


def jacobian_radius(phi: str, W: Any, h: Any) -> float:
    """Largest ``|eigenvalue|`` of ``diag(phi'(h)) W`` (001 Eq. 29; the same spectrum as
    ``W diag(phi'(h))``), by LAPACK in float64 on the host.

    Args:
      phi: one of :data:`deqlab.theory.meanfield.PHIS`. W: an ``(N, N)`` matrix. h: an ``(N,)``
        pre-activation.
    """
    where = "experiments.nonlinear.statistics.jacobian_radius"
    nl = meanfield.nonlinearity(phi, where)
    W = np.asarray(W, dtype=np.float64)
    h = np.asarray(h, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] != W.shape[1]:
        raise checks.fail("W", "a square 2-D matrix", f"an array of shape {W.shape}", where)
    if h.shape != (W.shape[0],):
        raise checks.fail("h", f"a vector of shape ({W.shape[0]},)", f"an array of shape {h.shape}", where)
    d = np.asarray(nl.derivative_numpy(h), dtype=np.float64)
    return float(np.max(np.abs(np.linalg.eigvals(d[:, None] * W))))


def _scales(scales: Any, where: str) -> np.ndarray:
    requirement = "a non-empty 1-D sequence of finite numbers sqrt(V) > 0"
    try:
        arr = np.asarray(scales, dtype=np.float64)
    except (TypeError, ValueError):
        raise checks.fail("scales", requirement, scales, where) from None
    if arr.ndim == 0:
        arr = arr[None]
    if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise checks.fail("scales", requirement, scales, where)
    return arr


def equilibrium_statistics(phi: str, ensemble: str, key: Any, n: int, scales: Any, samples: int, *,
                           steps: int = 2000, tol: float = 1e-10, sigma_x2: float = 1.0,
                           radius: bool = True, batch: int | None = None) -> EquilibriumStatistics:
    """Solve ``h* = W phi(h*) + W x`` (001 Eq. 22) by the iteration of 001 Eq. 23 for ``samples``
    draws of ``(W, x)`` at each scale, and measure ``(1/N) h* . h*`` (001 Eq. 25, Fig. 2), the
    convergence, and the Jacobian's spectral radius (001 Eq. 29-30, Fig. 3).

    Args:
      phi: one of :data:`deqlab.theory.meanfield.PHIS`.
      ensemble: one of :data:`deqlab.theory.meanfield.ENSEMBLES` (``"gaussian"``,
        ``"orthogonal"``, ``"goe"``).
      key: a JAX PRNG key; sample ``j`` uses the same ``W0``, ``x`` at every scale.
      n: the width ``N >= 1``. scales: the values of ``sqrt(V) > 0``. samples: draws per scale.
      steps: the most iterations ``>= 1``. tol: stop a sample when ``||h_{t+1} - h_t|| <= tol
        ||h_{t+1}||``, ``tol >= 0`` (``0``: always ``steps`` steps). sigma_x2: the variance of
        the input's entries, ``>= 0``. radius: also compute the Jacobian's spectral radius
        (host LAPACK, ``O(N^3)`` per sample). batch: samples per compiled call (default: as many
        weight matrices as fit in 128 MiB).

    Returns:
      :class:`EquilibriumStatistics`.
    """
    where = "experiments.nonlinear.statistics.equilibrium_statistics"
    phi = meanfield.nonlinearity(phi, where).name
    ensemble = checks.choice(ensemble, "ensemble", meanfield.ENSEMBLES, where)
    key = checks.prng_key(key, "key", where)
    n = checks.positive_int(n, "n", where)
    scales = _scales(scales, where)
    samples = checks.positive_int(samples, "samples", where)
    steps = checks.positive_int(steps, "steps", where)
    tol = checks.number(tol, "tol", where, lower=0.0)
    sigma_x2 = checks.number(sigma_x2, "sigma_x2", where, lower=0.0)
    if not isinstance(radius, (bool, np.bool_)):
        raise checks.fail("radius", "True or False", radius, where)
    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    if batch is None:
        batch = max(1, min(samples, _MAX_BATCH_BYTES // (8 * n * n)))
    batch = checks.positive_int(batch, "batch", where)
    keys = jax.random.split(key, samples)
    sigma_x = math.sqrt(sigma_x2)
    fields = [np.zeros((scales.size, samples)) for _ in range(5)]
    rad = np.zeros((scales.size, samples)) if radius else None
    for i, scale in enumerate(scales):
        for start in range(0, samples, batch):
            chunk = keys[start:start + batch]
            out = _batch(chunk, jnp.asarray(scale, dtype), jnp.asarray(sigma_x, dtype), jnp.asarray(tol, dtype),
                         phi=phi, ensemble=ensemble, n=n, steps=steps, dtype=dtype, keep_w=radius)
            stop = start + len(chunk)
            for field, value in zip(fields, out[:5]):
                field[i, start:stop] = np.asarray(value)
            if radius:
                W, h = np.asarray(out[5]), np.asarray(out[6])
                rad[i, start:stop] = [jacobian_radius(phi, W[j], h[j]) for j in range(len(chunk))]
    variance, sx2, residual, taken, converged = fields
    return EquilibriumStatistics(scales, variance, sx2, residual, taken.astype(int), converged.astype(bool), rad)


def residual_after(phi: str, ensemble: str, key: Any, n: int, scales: Any, samples: int, steps: int, *,
                   sigma_x2: float = 1.0, batch: int | None = None) -> np.ndarray:
    """``||h_T - h_{T-1}||`` after exactly ``T = steps`` iterations of 001 Eq. 23 from ``h_0 = 0``,
    shape ``(len(scales), samples)`` (001 Fig. 4 plots its mean over samples against
    ``sqrt(V)``). Below the critical scale (:func:`deqlab.theory.meanfield.critical_scale`,
    spectral radius 1 by 001 Eq. 30) it falls like ``r^T`` to round-off; above it stays of order
    ``sqrt(N)``. Arguments as for :func:`equilibrium_statistics`."""
    return equilibrium_statistics(phi, ensemble, key, n, scales, samples, steps=steps, tol=0.0,
                                  sigma_x2=sigma_x2, radius=False, batch=batch).residual
