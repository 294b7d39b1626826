"""deqlab.lab.experiments.sequence.weight_tied: the linearisation, censored evaluation counts and the
shared programs behind chapter 5 page 1, checked against dense linear algebra and known answers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from deqlab import Broyden, nn
from deqlab.lab.experiments.sequence import weight_tied


class _CausalLinearCell(nnx.Module):
    """f(z, x)_t = z_t A + z_{t-1} B + x_t (z_{-1} = 0), or z_{t+1} B with ``ahead``: the Jacobian is
    block bidiagonal, lower (causal) or upper, with diagonal blocks A^T: its eigenvalues are A's."""

    def __init__(self, a, b, ahead=False):
        self.a = nnx.Param(a)
        self.b = nnx.Param(b)
        self.ahead = ahead
        self.width = a.shape[0]
        self.in_features = a.shape[0]

    def readout(self, z):
        return z

    def __call__(self, z, x):
        shifted = jnp.roll(z, -1 if self.ahead else 1, axis=-2)
        shifted = shifted.at[..., -1 if self.ahead else 0, :].set(0.0)
        return z @ self.a[...] + shifted @ self.b[...] + x


def _dense(j):
    eye = np.eye(j.shape[0])
    sigma = np.linalg.svd(eye - j, compute_uv=False)
    return np.linalg.eigvals(j), sigma[-1], np.linalg.norm(j, 2)


@pytest.fixture(scope="module")
def linear_cells():
    rng = np.random.default_rng(0)
    a = np.triu(rng.normal(size=(4, 4)) * 0.3, 1) + np.diag([0.5, -0.6, 0.7, 0.2])  # eigenvalues on the diagonal
    b = rng.normal(size=(4, 4)) * 2.0  # strong coupling between positions: non-normal
    return a, jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)


def test_linearisation_of_a_causal_linear_cell(linear_cells):
    a_np, a, b = linear_cells
    cell = _CausalLinearCell(a, b)
    x = jnp.zeros((2, 5, 4))
    z = jnp.ones((2, 5, 4))
    lin = weight_tied.linearisation(cell, z, x)
    j = weight_tied.jacobian(cell, z, x)
    assert j.shape == (2, 20, 20) and j.dtype == np.float64
    assert lin["causal"].all()
    np.testing.assert_allclose(np.sort(lin["eigenvalues"][0].real), np.sort(np.tile(np.diag(a_np), 5)), atol=1e-6)
    np.testing.assert_allclose(lin["radius"], 0.7, rtol=1e-6)
    np.testing.assert_allclose(lin["gap"], 0.3, rtol=1e-5)
    _, sigma_min, norm = _dense(j[0])
    np.testing.assert_allclose(lin["sigma_min"], sigma_min, rtol=1e-6)
    np.testing.assert_allclose(lin["norm"], norm, rtol=1e-6)
    # non-normality: the smallest singular value of I - J is well below the distance of the spectrum from 1
    assert np.all(lin["sigma_min"] < 0.5 * lin["gap"])


def test_linearisation_of_a_non_causal_cell_uses_the_whole_matrix(linear_cells):
    _, a, b = linear_cells
    cell = _CausalLinearCell(a, 0.1 * b, ahead=True)
    x = jnp.zeros((1, 3, 4))
    lin = weight_tied.linearisation(cell, x, x, singular_values=False)
    assert not lin["causal"].any()
    eigenvalues, _, _ = _dense(weight_tied.jacobian(cell, x, x)[0])
    np.testing.assert_allclose(lin["radius"], np.abs(eigenvalues).max(), rtol=1e-9)
    assert np.isnan(lin["sigma_min"]).all() and np.isnan(lin["norm"]).all()


def test_linearisation_of_the_transformer_cell_matches_dense_linear_algebra():
    """Both variants of 003's layer, at a normalised state (what the layer outputs): causal Jacobians
    whose block spectrum is the whole matrix's, and singular values from subspace iteration that
    agree with a dense SVD."""
    x = jax.random.normal(jax.random.key(0), (2, 5, 8))
    for residual in (True, False):
        cell = nn.TransformerCell(8, 8, heads=2, attention_residual=residual, rngs=nnx.Rngs(1))
        z = nnx.jit(lambda cell, u: cell(u, x))(cell, jax.random.normal(jax.random.key(2), x.shape))  # eager: ~40 programs
        lin = weight_tied.linearisation(cell, z, x)
        j = weight_tied.jacobian(cell, z, x)
        assert lin["causal"].all()
        for k in range(2):
            eigenvalues, sigma_min, norm = _dense(j[k])
            np.testing.assert_allclose(lin["radius"][k], np.abs(eigenvalues).max(), rtol=1e-6)
            np.testing.assert_allclose(lin["gap"][k], np.abs(1 - eigenvalues).min(), rtol=1e-5)
            np.testing.assert_allclose(lin["sigma_min"][k], sigma_min, rtol=1e-6)
            np.testing.assert_allclose(lin["norm"][k], norm, rtol=1e-6)
        assert np.all(lin["sigma_min"] <= lin["gap"] * (1 + 1e-9))


def test_evaluations_needed_counts_censored_solves_as_inf():
    trace = np.array([[1.0, 1.0, 1.0, 1.0], [1e-6, 0.5, 1e-3, 0.5], [1e-6, 0.2, 1e-6, 0.4]])
    needed = weight_tied.evaluations_needed(trace, 1e-5)
    np.testing.assert_array_equal(needed, [2.0, np.inf, 3.0, np.inf])
    assert np.isinf(np.median(needed))  # two of four censored: the median is not known
    assert np.median(weight_tied.evaluations_needed(trace[:, :3], 1e-5)) == 3.0
    with pytest.raises(ValueError, match="tol"):
        weight_tied.evaluations_needed(trace, 0.0)
    with pytest.raises(ValueError, match="trace"):
        weight_tied.evaluations_needed(trace[0], 1e-5)


def test_convergence_keys_and_equilibrium_share_programs(compile_counter):
    """Solver objects get their own key; the traces are what evaluations_needed reads; the
    equilibrium's program is reused across tolerances and parameters of the same structure."""
    x = jax.random.normal(jax.random.key(1), (2, 4, 8))
    cell = nn.TransformerCell(8, 8, heads=2, attention_residual=False, rngs=nnx.Rngs(0))
    traces = weight_tied.convergence(cell, x, evaluations=40, solvers=(Broyden(m=30),), tol=1e-5)
    assert sorted(traces) == ["broyden-m30", "unrolled"]
    assert all(t.shape == (40, 2) for t in traces.values())
    needed = weight_tied.evaluations_needed(traces["broyden-m30"], 1e-5)
    _, residual, evaluations = weight_tied.equilibrium(cell, x, Broyden(m=30, tol=1e-5, max_steps=39))
    np.testing.assert_array_equal(evaluations, needed)  # the same count, from the trace or the solve
    assert np.all(residual <= 1e-5)
    # other parameters, the same structure: a clone with its weights scaled (on flax 0.11, the floor's,
    # two separately constructed cells have graphdefs that compare unequal, so a fresh cell would be a
    # new program there whatever deqlab does)
    other = nnx.clone(cell)
    nnx.update(other, jax.tree.map(lambda p: 0.9 * p, nnx.state(other, nnx.Param)))
    with compile_counter() as counted:
        weight_tied.equilibrium(other, x, Broyden(m=30, tol=1e-4, max_steps=39))
    assert counted.programs == 0


def test_bad_arguments():
    cell = nn.TransformerCell(8, 8, heads=2, rngs=nnx.Rngs(0))
    x = jnp.zeros((1, 3, 8))
    with pytest.raises(ValueError, match="`z` must have shape"):
        weight_tied.jacobian(cell, jnp.zeros((3, 8)), x)
    with pytest.raises(ValueError, match="singular_values"):
        weight_tied.linearisation(cell, x, x, singular_values=1)
    with pytest.raises(ValueError, match="iterations"):
        weight_tied.linearisation(cell, x, x, iterations=0)
    with pytest.raises(ValueError, match="solver object"):
        weight_tied.equilibrium(cell, x, "broyden")
    with pytest.raises(ValueError, match="solvers"):
        weight_tied.convergence(cell, x, evaluations=5, solvers=("newton",))
