"""Quantities that say whether a DEQ's forward solve will stay easy: the Jacobian's Frobenius norm
(a training penalty) and its spectral radius (a monitor), both at a point ``z`` and both without
forming the Jacobian ``J = df/dz``.

- :func:`jacobian_penalty`: Hutchinson's estimate of ``||J||_F^2`` (Bai, Koltun & Kolter 2021,
  "Stabilizing equilibrium models by Jacobian regularization", §3.2: ``||J||_F^2 = E ||J eps||^2``
  for probes with ``E[eps eps^T] = I``), differentiable in ``f``'s parameters so that it can be
  added to a loss.
- :func:`spectral_radius`: ``rho(J)`` by power iteration with Jacobian-vector products. ``rho(J) < 1``
  at the equilibrium is what makes the plain iteration converge locally (003 §3.1; for a nonlinear DEQ
  with random weights its large-width value follows from the weights' scale, 001 Eq. 30).

Both act per sample when ``batch_axis`` is given (as in :func:`deqlab.solvers.solve`: the map must
not mix samples, so ``J`` is block diagonal and each block is estimated on its own).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from deqlab import checks

__all__ = ["PROBES", "jacobian_penalty", "spectral_radius"]

PROBES = ("rademacher", "gaussian")
"""Probe distributions of :func:`jacobian_penalty`: both have ``E[eps eps^T] = I``."""


def _leaves(tree: Any, name: str, where: str) -> list:
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        raise checks.fail(name, "a non-empty pytree of floating arrays", tree, where)
    for leaf in leaves:
        if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            raise checks.fail(name, "a pytree of floating arrays (not Python numbers)", type(leaf).__name__, where)
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
            raise checks.fail(name, "a pytree of floating arrays", jnp.result_type(leaf), where)
    return leaves


def _batch(z: Any, batch_axis: int | None, name: str, where: str) -> int | None:
    """The batch size along ``batch_axis`` (None: one sample), after checking every leaf has it."""
    leaves = _leaves(z, name, where)
    if batch_axis is None:
        return None
    batch_axis = checks.integer(batch_axis, "batch_axis", where)
    sizes = set()
    for leaf in leaves:
        if not -leaf.ndim <= batch_axis < leaf.ndim:
            raise checks.fail("batch_axis", f"an axis of every leaf of `{name}` (ndim {leaf.ndim})",
                              batch_axis, where)
        sizes.add(leaf.shape[batch_axis])
    if len(sizes) != 1:
        raise checks.fail(name, f"leaves of one size along batch_axis={batch_axis}", sorted(sizes), where)
    return sizes.pop()


def _check_map(f: Any, z: Any, args: tuple, where: str, *, dtypes: bool) -> None:
    """``f(z, *args)`` must be a pytree of the structure and shapes (and with ``dtypes``, the
    dtypes) of ``z``: a map of z's space to itself, whose Jacobian is square."""
    if not callable(f):
        raise checks.fail("f", "a callable f(z, *args)", type(f).__name__, where)
    try:
        out = jax.eval_shape(lambda x: f(x, *args), z)
    except Exception as error:  # noqa: BLE001 - any failure of f is reported as f's
        raise ValueError(f"{where}: `f` could not be evaluated as f(z, *args): {type(error).__name__}: "
                         f"{error}") from error
    def signature(leaf):
        return (tuple(jnp.shape(leaf)), jnp.result_type(leaf)) if dtypes else tuple(jnp.shape(leaf))

    expected = jax.tree_util.tree_map(signature, z)
    got = jax.tree_util.tree_map(signature, out)
    if jax.tree_util.tree_structure(out) != jax.tree_util.tree_structure(z) or got != expected:
        def describe(tree):
            return jax.tree_util.tree_map(lambda leaf: f"{jnp.result_type(leaf)}{list(jnp.shape(leaf))}", tree)

        raise checks.fail("f", f"a map returning a pytree of the structure and shapes{' (and dtypes)' if dtypes else ''} of `z` "
                          f"(f(z, *args) ~ z, a square Jacobian; z is {describe(z)})",
                          f"a result {describe(out)}", where)


def _squared_norm(tree: Any, batch_axis: int | None) -> jax.Array:
    """Per-sample ``sum of squares`` over every leaf and every axis but ``batch_axis``."""
    total = 0.0
    for leaf in jax.tree_util.tree_leaves(tree):
        squares = jnp.abs(leaf) ** 2
        if batch_axis is None:
            total = total + jnp.sum(squares)
        else:
            axes = tuple(a for a in range(leaf.ndim) if a != batch_axis % leaf.ndim)
            total = total + jnp.sum(squares, axis=axes)
    return total


def _scale(tree: Any, factor: jax.Array, batch_axis: int | None) -> Any:
    """Each sample of ``tree`` multiplied by its entry of ``factor`` (a scalar when unbatched)."""
    def one(leaf):
        if batch_axis is None:
            return leaf * factor.astype(leaf.dtype)
        shape = [1] * leaf.ndim
        shape[batch_axis % leaf.ndim] = -1
        return leaf * factor.reshape(shape).astype(leaf.dtype)
    return jax.tree_util.tree_map(one, tree)


def _probe(key: jax.Array, z: Any, kind: str) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten(z)
    keys = jax.random.split(key, len(leaves))
    if kind == "rademacher":
        draws = [jax.random.rademacher(k, leaf.shape, dtype=leaf.dtype) for k, leaf in zip(keys, leaves)]
    else:
        draws = [jax.random.normal(k, leaf.shape, dtype=leaf.dtype) for k, leaf in zip(keys, leaves)]
    return jax.tree_util.tree_unflatten(treedef, draws)


def jacobian_penalty(f: Callable[..., Any], z: Any, *args: Any, key: jax.Array, n_probes: int = 1,
                     batch_axis: int | None = None, probe: str = "rademacher") -> jax.Array:
    """Hutchinson's estimate of ``||df/dz||_F^2`` at ``z`` (Bai, Koltun & Kolter 2021, §3.2).

    ``||J||_F^2 = E ||J eps||^2`` for any probe with ``E[eps eps^T] = I``; the estimate averages
    ``||J eps_i||^2`` over ``n_probes`` probes, each one Jacobian-vector product (``jax.jvp``). It is
    *not* divided by the dimension (Bai et al. divide by it in their loss; do so in yours if you
    want their ``gamma``). Its variance over the probes is ``2 sum_{i != j} (J^T J)_ij^2 / n_probes``
    for Rademacher probes (the default) and ``2 ||J^T J||_F^2 / n_probes`` for Gaussian ones, so
    Rademacher probes are never worse.

    The estimate is differentiable in ``args`` (and in ``z``), so ``gamma * penalty.mean()`` can be
    added to a training loss; evaluate it at ``jax.lax.stop_gradient(z_star)`` to penalise the map,
    not the equilibrium (as Bai et al. do).

    Args:
        f: the map ``f(z, *args)``, a pytree of the structure and shapes of ``z`` (a scalar or a tuple is
            refused: the penalty is of a square Jacobian).
        z: where the Jacobian is taken (pytree of floating arrays).
        *args: the other arguments of ``f``.
        key: PRNG key of the probes.
        n_probes: number of probes, >= 1.
        batch_axis: axis of every leaf of ``z`` that indexes independent samples (``f`` must not mix
            them); None: ``z`` is one sample.
        probe: ``"rademacher"`` (entries +-1) or ``"gaussian"``.

    Returns:
        A scalar, or one estimate per sample (shape ``(batch,)``) when ``batch_axis`` is given.

    Raises:
        ValueError: ``f`` is not callable or does not map ``z``'s structure and shapes to
            themselves, ``z`` is not a pytree of floating arrays, ``batch_axis`` is not an axis of
            every leaf (or the leaves differ in size along it), ``n_probes < 1``, ``probe`` is
            unknown, or ``key`` is not a PRNG key.

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> from deqlab.stability import jacobian_penalty
        >>> f = lambda z, d: d * z  # J = diag(d): every Rademacher probe gives ||J||_F^2 exactly
        >>> float(jacobian_penalty(f, jnp.zeros(2), jnp.array([1.0, 2.0]), key=jax.random.key(0)))
        5.0
    """
    where = "stability.jacobian_penalty"
    n_probes = checks.positive_int(n_probes, "n_probes", where)
    probe = checks.choice(probe, "probe", PROBES, where)
    key = checks.prng_key(key, "key", where)
    _batch(z, batch_axis, "z", where)
    _check_map(f, z, args, where, dtypes=False)

    def squared_product(k):
        _, tangent = jax.jvp(lambda x: f(x, *args), (z,), (_probe(k, z, probe),))
        return _squared_norm(tangent, batch_axis)

    return jnp.mean(jax.vmap(squared_product)(jax.random.split(key, n_probes)), axis=0)


def spectral_radius(f: Callable[..., Any], z: Any, *args: Any, key: jax.Array, steps: int = 30,
                    batch_axis: int | None = None) -> jax.Array:
    """Estimated spectral radius of ``J = df/dz`` at ``z`` by power iteration with ``jax.jvp``.

    From a random start ``v_0`` the iteration ``v_{t+1} = J v_t / ||J v_t||`` records the growth
    factors ``g_t = ||J v_t||``. The estimate is their geometric mean over the second half of the
    steps, ``(prod_{t >= steps/2} g_t)^(2/steps)``, i.e. Gelfand's ``||J^k v||^(1/k)`` with the first
    half discarded as transient. Unlike the last factor alone, this converges when the dominant
    eigenvalues are a complex pair or ``J`` is non-normal (the cases of chapter 3's GOE and trained
    weights), with a relative error of at most ``log(kappa) / (steps / 2)``, ``kappa`` the condition
    number of the dominant eigenvectors' basis; when two eigenvalues of nearly equal modulus compete
    it lands between their moduli, so its error is at most their gap. No Jacobian is formed:
    ``steps`` JVPs in all.

    The result is a monitor: it is computed under ``jax.lax.stop_gradient``.

    Args:
        f: the map ``f(z, *args)``, a pytree of the structure, shapes and dtypes of ``z``.
        z: where the Jacobian is taken, usually the equilibrium ``z*``.
        *args: the other arguments of ``f``.
        key: PRNG key of the start vector.
        steps: power-iteration steps, >= 2.
        batch_axis: axis of every leaf of ``z`` that indexes independent samples; None: one sample.

    Returns:
        A scalar, or one estimate per sample when ``batch_axis`` is given (0 where ``J v`` vanishes).

    Raises:
        ValueError: ``f`` is not callable or does not map ``z``'s structure, shapes and dtypes to
            themselves, ``z`` is not a pytree of floating arrays, ``batch_axis`` is not an axis of
            every leaf, ``steps < 2``, or ``key`` is not a PRNG key.

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> from deqlab.stability import spectral_radius
        >>> f = lambda z, d: d * z  # J = diag(d), spectral radius 0.9
        >>> rho = spectral_radius(f, jnp.zeros(3), jnp.array([0.5, -0.9, 0.2]), key=jax.random.key(0))
        >>> round(float(rho), 3)
        0.9
    """
    where = "stability.spectral_radius"
    steps = checks.integer(steps, "steps", where, minimum=2)
    key = checks.prng_key(key, "key", where)
    _batch(z, batch_axis, "z", where)
    _check_map(f, z, args, where, dtypes=True)
    z, args = jax.lax.stop_gradient((z, args))
    _, apply_jacobian = jax.linearize(lambda x: f(x, *args), z)

    def normalise(v):
        norm = jnp.sqrt(_squared_norm(v, batch_axis))
        safe = jnp.where(norm > 0, norm, 1.0)
        return _scale(v, 1.0 / safe, batch_axis), norm

    def step(v, _):
        v_next, growth = normalise(apply_jacobian(v))
        return v_next, growth

    v0, _ = normalise(_probe(key, z, "gaussian"))
    _, growth = jax.lax.scan(step, v0, None, length=steps)
    tail = growth[steps // 2:]
    # log(0) = -inf gives exp(-inf) = 0: a Jacobian that annihilates the iterate has radius 0 there
    return jnp.exp(jnp.mean(jnp.log(tail), axis=0))
