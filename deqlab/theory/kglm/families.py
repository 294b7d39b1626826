"""Exponential families in canonical form for kernelised GLMs (004 §3.1, Eq. 10; §3.3; App. C).

A member of the regular, minimal exponential family in canonical form has the density
``p(y | eta) = h(y) exp(eta T(y) - A(eta))`` (004 Eq. 10) with log-partition ``A``, strictly
convex and smooth; its mean map ``A'(eta) = E[T(y)]`` is the DEQ activation ``sigma`` of 004
Theorem 3 and its curvature ``A''`` enters Assumption 2. The families here (004 §3.3, App. C.2,
App. G):

=============  ========================  ==========================  ==================  ==========
name           A(eta)                    A'(eta) (= sigma)           sup A''             T(y)
=============  ========================  ==========================  ==================  ==========
gaussian(v)    v eta^2 / 2               v eta (identity for v = 1)  v                   y (real)
bernoulli      log(1 + e^eta)            logistic sigmoid            1/4                 y in {0,1}
binomial(r)    r log(1 + e^eta)          r sigmoid                   r/4                 y in {0..r}
poisson        e^eta                     e^eta                       inf                 y in {0,1..}
spin           log(2 cosh eta)           tanh                        1                   y in {-1,1}
=============  ========================  ==========================  ==================  ==========

``gaussian(v)`` is the Gaussian of known variance ``v``: ``-(y - mu)^2 / 2v`` with ``eta = mu / v``
gives ``eta y - v eta^2 / 2``, so ``T(y) = y`` and ``A'(eta) = v eta`` is the mean ``mu``. ``spin``
is the Ising model of 004 App. C without interactions at temperature ``t = 1`` (a temperature is
a rescaling of the kernel, ``K = k / t``).

Factories are cached (``spin() is spin()``), so a family's DEQ solve is compiled once per shape.

**Prior.** 004 Eq. 4 multiplies the Gaussian-process prior by a log-concave ``q``; with
``Q = -log q`` acting entrywise (``-log q(f) = sum_i Q(f_i)``, convex), the DEQ's second activation
is ``rho = Q' o (A')^{-1}`` (004 Eq. 5, Thm. 3). The default is ``q`` constant: ``rho = 0``, the
Gaussian-process prior. :meth:`Family.with_prior` attaches a ``Q``; ``Q'``, ``Q''`` are taken with
:func:`jax.grad`, so ``Q`` must be written with ``jax.numpy``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from deqlab import checks

__all__ = [
    "Family",
    "gaussian",
    "bernoulli",
    "binomial",
    "poisson",
    "spin",
    "real_spin",
    "FAMILIES",
    "get_family",
    "log_cosh_prior",
]

Array = Any


def _elementwise_derivative(fn: Callable[[Array], Array]) -> Callable[[Array], Array]:
    """``u -> fn'(u)`` entrywise, for an entrywise ``fn`` (the gradient of ``sum fn(u)``)."""
    grad = jax.grad(lambda u: jnp.sum(fn(u)))
    return lambda u: grad(jnp.asarray(u, dtype=jnp.result_type(u, float)))


@dataclasses.dataclass(frozen=True)
class Family:
    """One exponential family in canonical form (004 Eq. 10), optionally with a prior ``Q``.

    Attributes:
        name: short name (``"gaussian"``, ``"bernoulli"``, ...).
        log_partition: ``A``, entrywise.
        mean: the mean map ``A'`` (the DEQ activation ``sigma`` of 004 Thm. 3), entrywise.
        curvature: ``A''``, entrywise.
        mean_inverse: ``(A')^{-1}``, defined on :attr:`mean_range`.
        statistic: the sufficient statistic ``T``.
        curvature_bound: ``sup_eta A''(eta)`` over the real line (``inf`` for Poisson); the factor
            of Assumption 2 (004 §3.2) when no tighter bound is known.
        mean_range: the open interval ``A'(R)`` where the DEQ state ``z`` lives.
        support: a description of the allowed observations ``y``.
        valid_observation: entrywise predicate on NumPy ``y``: is it in the support?
        neg_log_prior: ``Q = -log q`` (entrywise, convex) or None for ``q`` constant (004 Eq. 4).

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.theory import kglm
        >>> spin = kglm.spin()
        >>> round(float(spin.mean(0.5)), 6), spin.curvature_bound, spin.mean_range  # tanh, sech^2 <= 1
        (0.462117, 1.0, (-1.0, 1.0))
    """

    name: str
    log_partition: Callable[[Array], Array]
    mean: Callable[[Array], Array]
    curvature: Callable[[Array], Array]
    mean_inverse: Callable[[Array], Array]
    statistic: Callable[[Array], Array]
    curvature_bound: float
    mean_range: tuple[float, float]
    support: str
    valid_observation: Callable[[np.ndarray], np.ndarray]
    neg_log_prior: Callable[[Array], Array] | None = None

    # ---- the prior and rho (004 Eq. 4-5, Thm. 3) -------------------------------------------

    def with_prior(self, neg_log_prior: Callable[[Array], Array]) -> "Family":
        """This family with ``Q = -log q`` (entrywise, convex, twice differentiable in JAX).

        Args:
            neg_log_prior: ``Q(u)``, written with ``jax.numpy``.

        Returns:
            A new :class:`Family`.

        Raises:
            ValueError: ``neg_log_prior`` is not callable.
        """
        if not callable(neg_log_prior):
            raise checks.fail("neg_log_prior", "a callable Q(u) = -log q(u), entrywise", neg_log_prior,
                              "Family.with_prior")
        return dataclasses.replace(self, neg_log_prior=neg_log_prior)

    @property
    def has_prior(self) -> bool:
        """Whether a prior ``Q`` is attached."""
        return self.neg_log_prior is not None

    def prior_value(self, f: Array) -> Array:
        """``Q(f)`` entrywise (zeros when ``q`` is constant).

        Args:
            f: values of the function.

        Returns:
            ``Q(f)``, of ``f``'s shape.
        """
        return jnp.zeros_like(f) if self.neg_log_prior is None else self.neg_log_prior(f)

    def prior_gradient(self, f: Array) -> Array:
        """``Q'(f)`` entrywise (zeros when ``q`` is constant).

        Args:
            f: values of the function.

        Returns:
            ``Q'(f)``, of ``f``'s shape.
        """
        if self.neg_log_prior is None:
            return jnp.zeros_like(f)
        return _elementwise_derivative(self.neg_log_prior)(f)

    def prior_curvature(self, f: Array) -> Array:
        """``Q''(f)`` entrywise (zeros when ``q`` is constant).

        Args:
            f: values of the function.

        Returns:
            ``Q''(f)``, of ``f``'s shape.
        """
        if self.neg_log_prior is None:
            return jnp.zeros_like(f)
        return _elementwise_derivative(_elementwise_derivative(self.neg_log_prior))(f)

    def rho(self, z: Array) -> Array:
        """``rho(z) = Q'((A')^{-1}(z))`` (004 Thm. 3); zero for the Gaussian-process prior.

        Args:
            z: DEQ states in :attr:`mean_range`.

        Returns:
            ``rho(z)``, of ``z``'s shape.
        """
        if self.neg_log_prior is None:
            return jnp.zeros_like(z)
        return self.prior_gradient(self.mean_inverse(z))

    def rho_derivative(self, z: Array) -> Array:
        """``rho'(z) = Q''(eta) / A''(eta)`` at ``eta = (A')^{-1}(z)`` (chain rule).

        Args:
            z: DEQ states in :attr:`mean_range`.

        Returns:
            ``rho'(z)``, of ``z``'s shape.
        """
        if self.neg_log_prior is None:
            return jnp.zeros_like(z)
        eta = self.mean_inverse(z)
        return self.prior_curvature(eta) / self.curvature(eta)

    def check_observations(self, Y: Any, name: str = "Y", where: str | None = None) -> np.ndarray:
        """``Y`` as a float64 vector, checked to lie in the support of the family.

        Args:
            Y: observations.
            name: the argument's name, for the message.
            where: the public function, for the message.

        Returns:
            ``Y`` as a 1-D float64 array.

        Raises:
            ValueError: ``Y`` is not a non-empty 1-D array of finite values in the support.
        """
        requirement = f"a 1-D array of finite observations in the support of {self.name!r} ({self.support})"
        try:
            arr = np.asarray(Y, dtype=np.float64)
        except (TypeError, ValueError):
            raise checks.fail(name, requirement, Y, where) from None
        if arr.ndim != 1 or arr.size == 0:
            raise checks.fail(name, requirement, f"array of shape {arr.shape}", where)
        ok = np.isfinite(arr) & self.valid_observation(arr)
        if not np.all(ok):
            raise checks.fail(name, requirement, float(arr[~ok][0]), where)
        return arr


# --------------------------------------------------------------------------------------------
# The families (004 §3.3, App. C.2, App. G)
# --------------------------------------------------------------------------------------------


def _integers(lo: float, hi: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda y: (y == np.round(y)) & (y >= lo) & (y <= hi)


@functools.lru_cache(maxsize=None)
def gaussian(variance: float = 1.0) -> Family:
    """Gaussian with known variance ``v``: ``A = v eta^2 / 2``, ``A' = v eta``, ``A'' = v``.

    With ``v = 1`` the kGLM is kernel ridge regression and the DEQ is linear (004 §3.3).

    Args:
        variance: the known variance ``v > 0``.

    Returns:
        The :class:`Family` (cached per ``v``).

    Raises:
        ValueError: ``variance`` is not > 0.

    Example:
        >>> from deqlab.theory import kglm
        >>> float(kglm.gaussian(2.0).mean(3.0))  # v eta
        6.0
    """
    v = checks.positive_number(variance, "variance", "kglm.gaussian")
    return Family(
        name="gaussian",
        log_partition=lambda eta: 0.5 * v * eta**2,
        mean=lambda eta: v * eta,
        curvature=lambda eta: jnp.full_like(eta, v),
        mean_inverse=lambda mu: mu / v,
        statistic=lambda y: y,
        curvature_bound=v,
        mean_range=(-math.inf, math.inf),
        support="real numbers",
        valid_observation=lambda y: np.ones(y.shape, bool),
    )


@functools.lru_cache(maxsize=None)
def binomial(trials: int) -> Family:
    """Binomial with ``r`` trials: ``A = r log(1 + e^eta)``, ``A' = r sigmoid``, ``A'' <= r/4``.

    (004 §3.2, below Assumption 2.)

    Args:
        trials: ``r``, an integer >= 1.

    Returns:
        The :class:`Family` (cached per ``r``; named ``"bernoulli"`` for ``r = 1``).

    Raises:
        ValueError: ``trials`` is not an integer >= 1.

    Example:
        >>> from deqlab.theory import kglm
        >>> kglm.binomial(3).curvature_bound, kglm.binomial(3).mean_range
        (0.75, (0.0, 3.0))
    """
    r = checks.positive_int(trials, "trials", "kglm.binomial")
    return Family(
        name="bernoulli" if r == 1 else f"binomial({r})",
        log_partition=lambda eta: r * jnp.logaddexp(0.0, eta),
        mean=lambda eta: r * jax.nn.sigmoid(eta),
        curvature=lambda eta: r * jax.nn.sigmoid(eta) * jax.nn.sigmoid(-eta),
        mean_inverse=lambda mu: jnp.log(mu) - jnp.log(r - mu),
        statistic=lambda y: y,
        curvature_bound=r / 4.0,
        mean_range=(0.0, float(r)),
        support="0 or 1" if r == 1 else f"integers 0, ..., {r}",
        valid_observation=_integers(0, r),
    )


def bernoulli() -> Family:
    """Bernoulli (kernel logistic regression, 004 App. G): ``A' =`` logistic sigmoid, ``A'' <= 1/4``.

    Returns:
        ``binomial(1)``.

    Example:
        >>> from deqlab.theory import kglm
        >>> float(kglm.bernoulli().mean(0.0))
        0.5
    """
    return binomial(1)


@functools.lru_cache(maxsize=None)
def poisson() -> Family:
    """Poisson: ``A = A' = A'' = e^eta``; ``A''`` is unbounded, so Assumption 2 never holds on the
    whole line (only on a bounded set of pre-activations, see :func:`~deqlab.theory.kglm.models.assumption2`).

    Returns:
        The :class:`Family` (cached).

    Example:
        >>> from deqlab.theory import kglm
        >>> kglm.poisson().curvature_bound
        inf
    """
    return Family(
        name="poisson",
        log_partition=jnp.exp,
        mean=jnp.exp,
        curvature=jnp.exp,
        mean_inverse=jnp.log,
        statistic=lambda y: y,
        curvature_bound=math.inf,
        mean_range=(0.0, math.inf),
        support="integers >= 0",
        valid_observation=_integers(0, math.inf),
    )


@functools.lru_cache(maxsize=None)
def spin() -> Family:
    """The +-1 family of the interaction-free Ising model (004 App. C.1-C.2): ``A = log(2 cosh eta)``,
    ``A' = tanh`` (the tanh DEQ of 004 Eq. 14), ``A'' = sech^2 <= 1``.

    Returns:
        The :class:`Family` (cached).

    Example:
        >>> from deqlab.theory import kglm
        >>> kglm.spin().check_observations([1, -1]).tolist()
        [1.0, -1.0]
    """

    def log_partition(eta):
        a = jnp.abs(eta)  # log(2 cosh x) = |x| + log(1 + e^{-2|x|}), no overflow
        return a + jnp.log1p(jnp.exp(-2.0 * a))

    return Family(
        name="spin",
        log_partition=log_partition,
        mean=jnp.tanh,
        curvature=lambda eta: 1.0 - jnp.tanh(eta) ** 2,
        mean_inverse=jnp.arctanh,
        statistic=lambda y: y,
        curvature_bound=1.0,
        mean_range=(-1.0, 1.0),
        support="-1 or +1",
        valid_observation=lambda y: (y == 1.0) | (y == -1.0),
    )


@functools.lru_cache(maxsize=None)
def real_spin() -> Family:
    """:func:`spin` with real-valued observations: the tanh DEQ of 004 §4 (sequence-to-sequence task).

    004 §4 runs the layer ``z = tanh(W1 z + W2 Y)`` of Theorem 3 on real-valued sequences ``Y``.
    The objective of 004 Eq. 5 with ``A = log(2 cosh)`` and ``T(y) = y`` is strictly convex for any
    real ``Y``, so its MAP and Theorem 3 are unchanged; only the likelihood is no longer a
    normalised density for ``y`` other than ``+-1`` (a pseudo-likelihood). Same ``A``, ``A'``,
    ``A''`` as :func:`spin`; observations: any finite real number.

    Returns:
        The :class:`Family` (cached).

    Example:
        >>> from deqlab.theory import kglm
        >>> kglm.real_spin().check_observations([0.3]).tolist()
        [0.3]
    """
    base = spin()
    return dataclasses.replace(base, name="real_spin", support="real numbers",
                               valid_observation=lambda y: np.ones(y.shape, bool))


FAMILIES: dict[str, Callable[[], Family]] = {
    "gaussian": gaussian,
    "bernoulli": bernoulli,
    "poisson": poisson,
    "spin": spin,
}
"""Families by name, with default parameters (``binomial`` needs its number of trials).

:meta hide-value:
"""


def log_cosh_prior(scale: float) -> Callable[[Array], Array]:
    """``Q(u) = scale * log cosh(u)``: minus the log of a smoothed Laplace prior ``q`` (004 Eq. 4).

    Log-concave with ``Q' = scale * tanh`` and ``0 < Q'' <= scale``; pass it to
    :meth:`Family.with_prior`. It shrinks large ``|f|`` linearly rather than quadratically (the
    Gaussian-process prior's ``lam |f|^2 / 2`` still acts on top).

    Args:
        scale: > 0.

    Returns:
        ``Q``, a function of a JAX array, entrywise.

    Raises:
        ValueError: ``scale`` is not > 0.

    Example:
        >>> import jax.numpy as jnp
        >>> from deqlab.theory import kglm
        >>> family = kglm.spin().with_prior(kglm.log_cosh_prior(2.0))
        >>> family.has_prior, family.prior_curvature(jnp.array([0.0])).tolist()  # Q''(0) = scale
        (True, [2.0])
    """
    s = checks.positive_number(scale, "scale", "kglm.log_cosh_prior")

    def neg_log_prior(u):
        a = jnp.abs(u)  # log cosh x = |x| + log(1 + e^{-2|x|}) - log 2, no overflow
        return s * (a + jnp.log1p(jnp.exp(-2.0 * a)) - math.log(2.0))

    return neg_log_prior


def get_family(family: Any, where: str | None = None) -> Family:
    """A :class:`Family`, or the name of one in :data:`FAMILIES`.

    Args:
        family: a :class:`Family` (returned unchanged) or a name of :data:`FAMILIES`.
        where: the public function, for the message.

    Returns:
        The :class:`Family`.

    Raises:
        ValueError: ``family`` is neither.

    Example:
        >>> from deqlab.theory import kglm
        >>> kglm.get_family("bernoulli").name
        'bernoulli'
    """
    if isinstance(family, Family):
        return family
    if isinstance(family, str) and family in FAMILIES:
        return FAMILIES[family]()
    raise checks.fail("family", "a kglm.Family (e.g. kglm.binomial(3)) or one of "
                      + ", ".join(repr(n) for n in FAMILIES), family, where)
