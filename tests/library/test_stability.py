"""Tests for deqlab.stability: the Hutchinson Jacobian penalty against the exact Frobenius norm, and
the power-iteration spectral radius against numpy.linalg.eigvals, on small layers (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqlab import stability


def tanh_layer(z, W, x):
    return jnp.tanh(z @ W.T + x)


def exact_jacobian(z, W, x):
    """J = diag(1 - tanh^2(W z + x)) W for one sample z."""
    return (1 - jnp.tanh(W @ z + x) ** 2)[:, None] * W


def hutchinson_std(J, n_probes, probe):
    """Standard deviation of the n-probe estimate: Var ||J e||^2 = 2 sum_{i!=j} A_ij^2 (Rademacher) or
    2 ||A||_F^2 (Gaussian), A = J^T J."""
    A = np.asarray(J.T @ J)
    var = 2 * (np.sum(A**2) - (np.sum(np.diag(A) ** 2) if probe == "rademacher" else 0.0))
    return np.sqrt(var / n_probes)


@pytest.fixture
def layer():
    kW, kz, kx = jax.random.split(jax.random.PRNGKey(0), 3)
    n = 24
    W = 1.2 * jax.random.normal(kW, (n, n)) / np.sqrt(n)
    return W, jax.random.normal(kz, (n,)), jax.random.normal(kx, (n,))


@pytest.mark.parametrize("probe", stability.PROBES)
def test_penalty_matches_exact_frobenius(layer, probe):
    W, z, x = layer
    n_probes = 4000
    J = exact_jacobian(z, W, x)
    exact = float(jnp.sum(J**2))
    estimate = float(stability.jacobian_penalty(tanh_layer, z, W, x, key=jax.random.PRNGKey(1),
                                                n_probes=n_probes, probe=probe))
    # 5 standard deviations of the estimator (computed from the exact J): fails with probability < 1e-6
    assert abs(estimate - exact) <= 5 * hutchinson_std(J, n_probes, probe), (estimate, exact)


def test_penalty_is_exact_for_orthogonal_probes_in_expectation_and_not_trivially_constant(layer):
    """Different keys give different estimates (it is a random estimate), and each single-probe estimate
    is ||J e||^2 for its own probe e: checked by recomputing it from the dense Jacobian."""
    W, z, x = layer
    J = exact_jacobian(z, W, x)
    key = jax.random.PRNGKey(7)
    one = stability.jacobian_penalty(tanh_layer, z, W, x, key=key, n_probes=1)
    e = stability._probe(jax.random.split(key, 1)[0], z, "rademacher")
    # two float32 computations of one number (a JVP and a dense product): equal up to rounding, which
    # differs with the code XLA generates (tests/conftest.py); another probe's value is O(1) away
    np.testing.assert_allclose(one, jnp.sum((J @ e) ** 2), rtol=8 * np.finfo(np.float32).eps)
    other = stability.jacobian_penalty(tanh_layer, z, W, x, key=jax.random.PRNGKey(8), n_probes=1)
    assert float(one) != float(other)


def test_penalty_per_sample_when_batched(layer):
    W, _, _ = layer
    batch, n = 5, W.shape[0]
    kz, kx = jax.random.split(jax.random.PRNGKey(3))
    Z = 2.0 * jax.random.normal(kz, (batch, n))   # different samples, different saturations
    X = jax.random.normal(kx, (batch, n))
    n_probes = 3000
    estimates = stability.jacobian_penalty(tanh_layer, Z, W, X, key=jax.random.PRNGKey(4),
                                           n_probes=n_probes, batch_axis=0)
    assert estimates.shape == (batch,)
    for b in range(batch):
        J = exact_jacobian(Z[b], W, X[b])
        assert abs(estimates[b] - jnp.sum(J**2)) <= 5 * hutchinson_std(J, n_probes, "rademacher")
    # an axis that the state does not have is named in the error
    with pytest.raises(ValueError, match="batch_axis"):
        stability.jacobian_penalty(tanh_layer, Z, W, X, key=jax.random.PRNGKey(4), batch_axis=2)


@pytest.mark.float64
def test_penalty_gradient_matches_finite_differences(layer):
    W, z, x = layer
    key = jax.random.PRNGKey(5)

    @jax.jit  # compiled once, called three times (eager, ~50 small programs)
    def penalty(W):
        return stability.jacobian_penalty(tanh_layer, z, W, x, key=key, n_probes=3)

    grad = np.asarray(jax.jit(jax.grad(penalty))(W))
    direction = np.asarray(jax.random.normal(jax.random.PRNGKey(6), W.shape))
    h = 1e-6
    fd = (float(penalty(W + h * direction)) - float(penalty(W - h * direction))) / (2 * h)
    np.testing.assert_allclose(np.sum(grad * direction), fd, rtol=1e-6)


@pytest.mark.parametrize("steps", [80, 800])
def test_spectral_radius_complex_dominant_pair(steps):
    """A real, non-normal J = S D S^-1 whose dominant eigenvalues are 0.9 e^{+-i 0.7} (plain power
    iteration's last ratio oscillates there) and whose others have modulus <= 0.45. In the dominant
    plane the iterate is S_2 R^k c, so ||J^k v|| / 0.9^k stays within a factor kappa = cond(S_2) and
    the estimate over the last steps/2 factors is within log(kappa) / (steps / 2) of log 0.9; the other
    eigenvalues add (0.45 / 0.9)^(steps/2) < 1e-12."""
    n = 12
    rng = np.random.default_rng(0)
    block = 0.9 * np.array([[np.cos(0.7), -np.sin(0.7)], [np.sin(0.7), np.cos(0.7)]])
    D = np.zeros((n, n))
    D[:2, :2] = block
    D[2:, 2:] = np.diag(rng.uniform(-0.45, 0.45, n - 2))
    S = rng.normal(size=(n, n))
    J = jnp.asarray(S @ D @ np.linalg.inv(S))
    assert np.isclose(np.max(np.abs(np.linalg.eigvals(np.asarray(J)))), 0.9)
    rho = stability.spectral_radius(lambda z, A: A @ z, jnp.zeros(n), J, key=jax.random.PRNGKey(0), steps=steps)
    bound = np.log(np.linalg.cond(S[:, :2])) / (steps // 2) + 1e-12
    assert abs(np.log(float(rho) / 0.9)) <= bound, (float(rho), bound)


@pytest.mark.parametrize("scale", [0.5, 1.0, 1.6])
def test_spectral_radius_of_tanh_layer_against_eigvals(scale):
    """Ginibre-like W at three scales; J = diag(tanh') W is non-normal. 300 steps: the estimate lies
    between the moduli of the two largest eigenvalues (Gelfand's formula with a transient), so it is
    checked against the largest within 3% plus their gap."""
    n = 40
    kW, kz, kx = jax.random.split(jax.random.PRNGKey(int(scale * 10)), 3)
    W = scale * jax.random.normal(kW, (n, n)) / np.sqrt(n)
    z, x = jax.random.normal(kz, (n,)), jax.random.normal(kx, (n,))
    moduli = np.sort(np.abs(np.linalg.eigvals(np.asarray(exact_jacobian(z, W, x)))))[::-1]
    rho = float(stability.spectral_radius(tanh_layer, z, W, x, key=jax.random.PRNGKey(1), steps=300))
    assert abs(rho - moduli[0]) <= 0.03 * moduli[0] + (moduli[0] - moduli[1]), (rho, moduli[:3])


def test_spectral_radius_per_sample_and_jit():
    n, batch = 16, 3
    rng = np.random.default_rng(1)
    radii = np.array([0.3, 0.8, 1.4])
    mats = []
    for r in radii:   # symmetric, so the estimate converges at the rate of the eigenvalue gap
        Q, _ = np.linalg.qr(rng.normal(size=(n, n)))
        eig = np.concatenate([[r], r * rng.uniform(-0.5, 0.5, n - 1)])
        mats.append(Q @ np.diag(eig) @ Q.T)
    A = jnp.asarray(np.stack(mats))
    f = lambda z, A: jnp.einsum("bij,bj->bi", A, z)   # noqa: E731 (samples do not mix)
    estimate = jax.jit(lambda z, A, key: stability.spectral_radius(f, z, A, key=key, steps=60, batch_axis=0))(
        jnp.zeros((batch, n)), A, jax.random.PRNGKey(2))
    np.testing.assert_allclose(estimate, radii, rtol=1e-6)


def test_spectral_radius_zero_jacobian():
    rho = stability.spectral_radius(lambda z: 0.0 * z, jnp.ones(4), key=jax.random.PRNGKey(0))
    assert float(rho) == 0.0


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_probes=0), "n_probes"),
    (dict(probe="uniform"), "probe"),
    (dict(batch_axis=1), "batch_axis"),
    (dict(key=3), "key"),
])
def test_penalty_bad_arguments(layer, kwargs, match):
    W, z, x = layer
    args = dict(key=jax.random.PRNGKey(0))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        stability.jacobian_penalty(tanh_layer, z, W, x, **args)


def test_radius_bad_arguments(layer):
    W, z, x = layer
    with pytest.raises(ValueError, match="steps"):
        stability.spectral_radius(tanh_layer, z, W, x, key=jax.random.PRNGKey(0), steps=1)
    with pytest.raises(ValueError, match="floating"):
        stability.spectral_radius(lambda z: z, jnp.arange(3), key=jax.random.PRNGKey(0))
