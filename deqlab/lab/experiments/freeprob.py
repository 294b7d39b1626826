"""Chapter 2, "Free probability for deep and equilibrium networks": the simulations behind it.

- :func:`jacobian_eigs`: squared singular values of the input-output Jacobian of random deep
  networks at criticality (002 Eq. 1-2, Figures 2 and 4);
- :func:`slope_samples`: samples of ``phi'(h)`` for ``h ~ N(0, q*)`` (002 Figure 3);
- :func:`masked_wishart_eigs`: eigenvalues of ``D W^T W D`` (free product of ``D^2`` and a
  Marchenko-Pastur law, 002 Eq. 12);
- :func:`dw_eigs`: eigenvalues of ``D W`` for GOE ``W`` (001 App. C.1);
- :func:`length_traces`: ``tr A / N``, ``tr A^2 / N`` for ``A = (I - W)^-T (I - W)^-1`` and the
  spectral radius of ``W`` (001 App. C.2).

Random matrices come from :mod:`deqlab.ensembles` (``scale = sqrt(sigma_w2)`` or ``sqrt(V)``:
``V`` and 002's ``sigma_w2`` are variances, the scale their square root); nonlinearities from
:mod:`deqlab.nonlinearities`, by name. The arithmetic runs in float64 when ``jax_enable_x64`` is
set and in float32 otherwise, and eigenvalues are computed in float64 with NumPy.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import checks, ensembles, nonlinearities
from deqlab.theory import freeprob

__all__ = ["jacobian_eigs", "slope_samples", "masked_wishart_eigs", "dw_eigs", "length_traces"]


def _dtype():
    return jnp.float64 if jax.config.jax_enable_x64 else jnp.float32


def _depths(depths, where: str) -> list[int]:
    values = np.atleast_1d(depths).tolist()
    if not values:
        raise checks.fail("depths", "a non-empty sequence of integers >= 1", depths, where)
    return sorted({checks.positive_int(d, "depths", where) for d in values})


# The nonlinearity enters the jitted layers as a traced index into the registry
# (nonlinearities.index): one compilation serves all of them.


@partial(jax.jit, static_argnames=("weights", "n", "dtype"))
def _first_layer(key, nonlinearity, weights, n, q_star, sw2, dtype):
    k_h, k_w = jax.random.split(key)
    h = jnp.sqrt(q_star) * jax.random.normal(k_h, (n,), dtype)  # pre-activations of layer 1
    w = ensembles.sample(weights, k_w, n, jnp.sqrt(sw2), dtype)
    return h, nonlinearities.derivative_apply_jax(nonlinearity, h)[:, None] * w


@partial(jax.jit, static_argnames=("weights", "n", "dtype", "gaussian_h"))
def _next_layer(key, h, jac, nonlinearity, weights, n, q_star, sw2, sb2, dtype, gaussian_h):
    kw, kb = jax.random.split(key)
    w = ensembles.sample(weights, kw, n, jnp.sqrt(sw2), dtype)
    if gaussian_h:  # mean-field: fresh N(0, q*) pre-activations, independent of W (q^l = q*)
        h = jnp.sqrt(q_star) * jax.random.normal(kb, (n,), dtype)
    else:  # the network of 002 Eq. 1
        h = w @ nonlinearities.apply_jax(nonlinearity, h) + jnp.sqrt(sb2) * jax.random.normal(kb, (n,), dtype)
    return h, nonlinearities.derivative_apply_jax(nonlinearity, h)[:, None] * (w @ jac)


def jacobian_eigs(key, nonlinearity: str, weights: str, depths, q_star: float, n: int,
                  n_networks: int = 1, sigma_w2: float | None = None,
                  preactivations: str = "network"):
    """Eigenvalues of ``J J^T``, ``J = prod_l D_l W_l`` (002 Eq. 2), of random networks.

    The network of 002 Eq. 1 with width ``n``, weights ``sample(weights, key, n,
    sqrt(sigma_w2))`` and biases ``N(0, sigma_b2)``, at the critical point of
    :func:`deqlab.theory.freeprob.jacobians.critical_point` for ``q_star`` (``sigma_w2`` overrides the
    weight variance, the bias stays). The first layer's pre-activations are drawn ``N(0, q*)``
    (input at the fixed point, 002 §2.2). One network of depth ``max(depths)`` gives the
    Jacobians of all shallower depths (its first ``L`` layers form a depth-``L`` network).
    ``preactivations="gaussian"`` draws fresh ``N(0, q*)`` pre-activations in every layer
    instead (the assumption ``q^l = q*`` made exact), for nonlinearities whose ``q*`` is not a
    stable fixed point.

    Returns:
      ``(eigs, q_mean)``: a dict ``depth -> eigenvalues`` (all networks, float64) and the mean
      squared pre-activation over all layers and networks (``q*`` when at the fixed point).
    """
    where = "experiments.freeprob.jacobian_eigs"
    key = checks.prng_key(key, "key", where)
    code = nonlinearities.index(nonlinearity, where)
    weights = checks.choice(weights, "weights", freeprob.WEIGHTS, where)
    depths = _depths(depths, where)
    q_star = checks.positive_number(q_star, "q_star", where)
    n = checks.positive_int(n, "n", where)
    n_networks = checks.positive_int(n_networks, "n_networks", where)
    checks.choice(preactivations, "preactivations", ("network", "gaussian"), where)
    sw2_c, sb2 = freeprob.critical_point(nonlinearity, q_star)
    sw2 = sw2_c if sigma_w2 is None else checks.positive_number(sigma_w2, "sigma_w2", where)
    dtype = _dtype()
    eigs = {d: [] for d in depths}
    qs = []
    for k in jax.random.split(key, n_networks):
        keys = jax.random.split(k, depths[-1])
        h, jac = _first_layer(keys[0], code, weights, n, q_star, sw2, dtype)
        for layer in range(1, depths[-1] + 1):
            if layer > 1:
                h, jac = _next_layer(keys[layer - 1], h, jac, code, weights, n, q_star,
                                     sw2, sb2, dtype, preactivations == "gaussian")
            qs.append(float(jnp.mean(h**2)))
            if layer in eigs:
                s = np.linalg.svd(np.asarray(jac, dtype=np.float64), compute_uv=False)
                eigs[layer].append(s**2)
    return {d: np.concatenate(v) for d, v in eigs.items()}, float(np.mean(qs))


def slope_samples(key, nonlinearity: str, q_star: float, n: int):
    """``phi'(h)`` for ``n`` draws ``h ~ N(0, q*)`` (002 Figure 3)."""
    where = "experiments.freeprob.slope_samples"
    key = checks.prng_key(key, "key", where)
    nl = nonlinearities.get(nonlinearity, where)
    q_star = checks.positive_number(q_star, "q_star", where)
    n = checks.positive_int(n, "n", where)
    h = math.sqrt(q_star) * jax.random.normal(key, (n,), _dtype())
    return np.asarray(nl.derivative_jax(h), dtype=np.float64)


def masked_wishart_eigs(key, p: float, sigma_w2: float, n: int, n_samples: int = 1):
    """Eigenvalues of ``D W^T W D`` with ``D = diag(Bernoulli(p))`` and Gaussian ``W``
    (entries ``N(0, sigma_w2 / n)``): the free product ``Bernoulli(p) ⊠ MP(sigma_w2)``."""
    where = "experiments.freeprob.masked_wishart_eigs"
    key = checks.prng_key(key, "key", where)
    p = checks.number(p, "p", where, lower=0.0, upper=1.0)
    sigma_w2 = checks.number(sigma_w2, "sigma_w2", where, lower=0.0)
    n = checks.positive_int(n, "n", where)
    n_samples = checks.positive_int(n_samples, "n_samples", where)
    out = []
    for k in jax.random.split(key, n_samples):
        kw, kd = jax.random.split(k)
        w = np.asarray(ensembles.sample("gaussian", kw, n, math.sqrt(sigma_w2), _dtype()), np.float64)
        d = np.asarray(jax.random.bernoulli(kd, p, (n,)), np.float64)
        out.append(np.linalg.eigvalsh((d[:, None] * (w.T @ w)) * d[None, :]))
    return np.concatenate(out)


def dw_eigs(key, nonlinearity: str, q_star: float, V: float, n: int, n_samples: int = 1):
    """Eigenvalues of ``D W``, ``W = sample("goe", key, n, sqrt(V))`` (variance ``V``),
    ``D = diag(phi'(h))``, ``h ~ N(0, q*)`` independent of ``W`` (001 App. C.1). For
    ``phi' >= 0`` these are the (real) eigenvalues of ``D^(1/2) W D^(1/2)``."""
    where = "experiments.freeprob.dw_eigs"
    key = checks.prng_key(key, "key", where)
    V = checks.number(V, "V", where, lower=0.0)
    n_samples = checks.positive_int(n_samples, "n_samples", where)
    out = []
    for k in jax.random.split(key, n_samples):
        kw, kh = jax.random.split(k)
        w = np.asarray(ensembles.sample("goe", kw, n, math.sqrt(V), _dtype()), np.float64)
        d = slope_samples(kh, nonlinearity, q_star, n)
        if np.any(d < 0):
            raise checks.fail("nonlinearity", "monotone (phi' >= 0, so that D^(1/2) exists)",
                              nonlinearity, where)
        r = np.sqrt(d)
        out.append(np.linalg.eigvalsh(r[:, None] * w * r[None, :]))
    return np.concatenate(out)


def length_traces(key, ensemble: str, V: float, n: int, n_samples: int):
    """Per sample: ``tr A / n``, ``tr A^2 / n`` with ``A = (I - W)^-T (I - W)^-1`` and the
    spectral radius ``rho(W)`` (the Neumann series ``sum_k W^k`` diverges when ``rho >= 1``),
    for ``W = sample(ensemble, key, n, sqrt(V))``, ``V`` the variance (001 App. C.2).

    Returns a dict of float64 arrays ``tr1``, ``tr2``, ``radius``.
    """
    where = "experiments.freeprob.length_traces"
    key = checks.prng_key(key, "key", where)
    ensemble = checks.choice(ensemble, "ensemble", ensembles.ENSEMBLES, where)
    V = checks.number(V, "V", where, lower=0.0)
    n = checks.positive_int(n, "n", where)
    n_samples = checks.positive_int(n_samples, "n_samples", where)
    tr1, tr2, rad = [], [], []
    eye = np.eye(n)
    for k in jax.random.split(key, n_samples):
        w = np.asarray(ensembles.sample(ensemble, k, n, math.sqrt(V), _dtype()), np.float64)
        s = np.linalg.svd(eye - w, compute_uv=False)
        a = 1.0 / s**2  # eigenvalues of (I - W)^-T (I - W)^-1
        tr1.append(a.mean())
        tr2.append((a**2).mean())
        rad.append(np.max(np.abs(np.linalg.eigvals(w))))
    return {"tr1": np.array(tr1), "tr2": np.array(tr2), "radius": np.array(rad)}


__all__ += ["double_scaling_eigs"]


def double_scaling_eigs(key, nonlinearity: str, weights: str, depths, sigma0_2: float, n: int,
                        n_networks: int = 1):
    """Squared singular values of ``J`` in the double-scaling limit of 002 §5 (Figure 4).

    For each depth ``L`` the networks run at their own ``q*(L)``
    (:func:`deqlab.theory.freeprob.double_scaling.double_scaling_q_star`, which makes ``sigma^2_{JJ^T} =
    sigma0_2`` for orthogonal weights) on the critical line, so unlike :func:`jacobian_eigs` a
    deep network cannot supply the shallower depths: every depth gets fresh networks.

    Returns:
      ``(eigs, q_ratio)``: dicts ``depth -> eigenvalues`` and ``depth -> (measured mean squared
      pre-activation) / q*(L)`` (1 when the pre-activations stay at their fixed point).
    """
    where = "experiments.freeprob.double_scaling_eigs"
    key = checks.prng_key(key, "key", where)
    eigs, q_ratio = {}, {}
    depths = _depths(depths, where)
    for k, depth in zip(jax.random.split(key, len(depths)), depths):
        q = freeprob.double_scaling_q_star(nonlinearity, depth, sigma0_2)
        by_depth, q_mean = jacobian_eigs(k, nonlinearity, weights, [depth], q, n, n_networks)
        eigs[depth], q_ratio[depth] = by_depth[depth], q_mean / q
    return eigs, q_ratio
