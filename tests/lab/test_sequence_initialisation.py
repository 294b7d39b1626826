"""deqlab.lab.experiments.sequence.initialisation: the feed-forward block at initialisation, theory
against sampled matrices (001 §4.2, App. D) and the TransformerCell at its equilibrium."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqlab
from deqlab.lab.experiments.sequence import initialisation as ffi

ENSEMBLES = ffi.STUDY_ENSEMBLES


def test_feedforward_shape_follows_the_cell():
    assert ffi.feedforward_shape("gaussian", 700) == (700, 2800)  # 001 App. D
    assert ffi.feedforward_shape("orthogonal", 700) == (700, 2800)
    assert ffi.feedforward_shape("goe", 700) == (700, 700)
    assert ffi.feedforward_shape("orthogonal", 8, 16) == (8, 16)
    with pytest.raises(ValueError, match="hidden"):
        ffi.feedforward_shape("goe", 8, 16)
    with pytest.raises(ValueError, match="ensemble"):
        ffi.feedforward_shape("ginibre", 8)
    with pytest.raises(ValueError, match="scale"):
        ffi.predict("gaussian", -0.1, 8)
    with pytest.raises(ValueError, match="width"):
        ffi.predict("gaussian", 0.1, 0)


def test_predict_closed_forms():
    p = ffi.predict("orthogonal", 0.5, 700)
    assert p.hidden_variance == pytest.approx(0.25 * 700 / 2800)
    assert p.gain == pytest.approx(0.25**2 / 4)
    assert p.radius == pytest.approx(0.25 / 2)
    assert p.relu_radius == pytest.approx(p.radius / math.sqrt(2))
    g = ffi.predict("goe", 1.0, 700)
    assert g.critical_scale == 0.5 and g.gain == pytest.approx((1 + 1 / 700) ** 2)


@pytest.mark.parametrize("ensemble", ENSEMBLES)
def test_exact_moments_against_samples(ensemble):
    # hidden variance, output variance and gain are exact expectations at every size: the mean of
    # S independent draws must sit within 4 standard errors (measured from the draws themselves).
    width, samples, scale = 48, 40, 0.7
    m = ffi.measure(ensemble, scale, width, key=jax.random.key(1), samples=samples)
    p = ffi.predict(ensemble, scale, width)
    for name in ("hidden_variance", "output_variance", "gain"):
        x = m[name]
        se = x.std(ddof=1) / math.sqrt(samples)
        z = abs(x.mean() - getattr(p, name)) / se if se > 0 else 0.0
        if ensemble == "orthogonal" and name == "hidden_variance":
            # |a W1|^2 = V |a|^2 exactly for orthonormal rows: no fluctuation at all, up to float32
            # rounding of a 48-term sum of squares (at worst 48 * eps = 5.8e-6 relative)
            np.testing.assert_allclose(x, p.hidden_variance, rtol=1e-5)
            continue
        assert z < 4, (ensemble, name, x.mean(), getattr(p, name), se)


@pytest.mark.parametrize("ensemble", ENSEMBLES)
def test_radius_large_width(ensemble):
    # Haagerup-Larsen: the outer radius of the eigenvalue law is sqrt(gain); the finite-n edge
    # correction is O(sqrt(log n / n)) (ensembles.spectral_radius_limit), 0.15 at n = 256.
    n, scale = 256, 0.8
    m = ffi.measure(ensemble, scale, n, key=jax.random.key(2), samples=2)
    p = ffi.predict(ensemble, scale, n)
    bound = 2 * math.sqrt(math.log(n) / n)
    for name in ("radius", "relu_radius"):
        rel = abs(m[name].mean() / getattr(p, name) - 1)
        assert rel < bound, (ensemble, name, m[name], getattr(p, name), bound)
    # the bulk lies inside the predicted disc: at most a few eigenvalues beyond it
    outside = np.mean(np.abs(m["eigenvalues"]) > p.radius * (1 + bound))
    assert outside == 0.0, outside


def test_goe_radius_approaches_theory_with_width():
    # GOE products converge slowest (edge excess 0.23 +- 0.11 over draws at n = 64, 0.075 +- 0.02
    # at n = 512): averaged over 12 draws at n = 32 and 2 at n = 384, the excess must fall with n
    excess = [ffi.measure("goe", 1.0, n, key=jax.random.key(3), samples=s)["radius"].mean() - 1
              for n, s in ((32, 12), (384, 2))]
    assert excess[0] > excess[1] > 0, excess


@pytest.mark.parametrize("ensemble", ENSEMBLES)
def test_product_spectrum_against_samples(ensemble):
    # the Stieltjes transform of the sampled squared singular values at Im z >= 0.1 V^2 is a smooth
    # linear statistic: fluctuations and finite-n bias O(1 / (n Im z)); 5% at n = 128.
    n, scale, samples = 128, 0.7, 4
    V2 = scale**4
    sp = ffi.product_spectrum(ensemble, scale, n)
    sv = ffi.measure(ensemble, scale, n, key=jax.random.key(4), samples=samples,
                     singular_values=True)["squared_singular_values"].ravel()
    z = V2 * np.array([0.3 + 0.1j, 1.0 + 0.2j, 2.0 + 0.3j])
    g_th = sp.stieltjes(z)
    g_emp = np.mean(1.0 / (z[:, None] - sv[None, :]), axis=1)
    np.testing.assert_allclose(g_emp, g_th, rtol=0.05)
    # total mass 1 and mean = gain, read off the expansion G(z) = 1/z + m1/z^2 + O(z^-3) far out
    big = 1e3 * V2 * (1 + 1e-3j)
    g = sp.stieltjes(np.array([big]))[0]
    assert abs(big * g - 1) < 1e-2, big * g
    m1 = (big * (big * g - 1)).real
    assert m1 == pytest.approx(ffi.predict(ensemble, scale, n).gain, rel=0.02)


def test_product_spectrum_square_orthogonal_is_a_point_mass():
    sp = ffi.product_spectrum("orthogonal", 0.5, 16, 16)
    assert sp.moment(1) == pytest.approx(0.5**4)
    with pytest.raises(ValueError, match="scale"):
        ffi.product_spectrum("gaussian", 0.0, 16)


def test_free_poisson_is_marchenko_pastur():
    from deqlab.theory import freeprob as fp
    z = np.array([0.5 + 0.3j, 3.0 + 0.1j, -1.0 + 1.0j])
    np.testing.assert_allclose(ffi.FreePoisson(1.0, 2.0).stieltjes(z), fp.MarchenkoPastur(2.0).stieltjes(z),
                               rtol=1e-12)
    fpz = ffi.FreePoisson(0.25, 4.0)
    x = np.linspace(1e-6, fpz.upper * 1.1, 20001)
    cont = np.sum(fpz.continuous_density(x, 1e-6)) * (x[1] - x[0])
    assert cont == pytest.approx(0.25, abs=5e-3)  # atom 0.75 at 0, rest continuous


def test_cell_at_init_feedforward_scales_with_V_and_the_cell_stays_near_one():
    width = 16
    x = jax.random.normal(jax.random.key(0), (2, 8, width), jnp.float32)
    out = ffi.cell_at_init("gaussian", [0.1, 1.0], x, width=width, draws=2, max_steps=300)
    assert out["cell_radius"].shape == out["converged"].shape == (2, 2, 2)
    assert out["residual_trace"].shape == (2, 2, 2, 301)
    assert out["converged"][0].all(), out["residual"]  # sqrt(V) = 0.1: every solve converges
    np.testing.assert_allclose(out["converged_fraction"], out["converged"].mean(axis=(1, 2)))
    conv = out["converged"]
    # the feed-forward Jacobian scale^2 W0_1 D W0_2 grows ~ 100x from sqrt(V) = 0.1 to 1
    ratio = np.median(out["ff_radius"][1][conv[1]]) / np.median(out["ff_radius"][0][conv[0]])
    assert 30 < ratio < 300, ratio
    # hidden variance at the equilibrium: the LayerNorm gives |a|^2 = width, so E (a W1)^2 = V
    hv = [out["hidden_variance"][i][conv[i]].mean() for i in range(2)]
    np.testing.assert_allclose(hv, [0.01, 1.0], rtol=0.35)
    # with the attention residual the cell's radius sits near 1 (LayerNorm's projection keeps the identity)
    assert np.all((out["cell_radius"][0] > 0.8) & (out["cell_radius"][0] < 1.0)), out["cell_radius"][0]
    # a converged solve met the tolerance at the step it reports, and its trace says so
    d, b = np.argwhere(conv[0])[0]
    k = out["solver_steps"][0, d, b]
    assert out["residual_trace"][0, d, b, k] <= 1e-5 < out["residual_trace"][0, d, b, 0]


@pytest.mark.slow  # three compiled programs (exact, power iteration, the full Jacobians): ~15 s on 2 cores
def test_cell_at_init_exact_radii_are_the_full_jacobians():
    # the causal cell's Jacobian is block lower triangular over positions: its spectral radius is the
    # largest over the diagonal blocks; check against all eigenvalues of the full Jacobian (float64,
    # at the point the solve returned) and against power iteration
    from flax import nnx

    from deqlab import nn

    width, length = 8, 5
    x = jax.random.normal(jax.random.key(1), (2, length, width), jnp.float32)
    out = ffi.cell_at_init("orthogonal", [0.7], x, width=width, seed=3, max_steps=200)
    power = ffi.cell_at_init("orthogonal", [0.7], x, width=width, seed=3, max_steps=200, steps=400)
    np.testing.assert_allclose(power["cell_radius"], out["cell_radius"], rtol=0.02)
    np.testing.assert_allclose(power["ff_radius"], out["ff_radius"], rtol=0.02)
    cell = nn.TransformerCell(width, width, heads=4, ensemble="orthogonal", scale=0.7, rngs=nnx.Rngs(3))
    graphdef, state = nnx.split(cell)

    @jax.jit
    def jacobians(state, x):
        cell = nnx.merge(graphdef, state)
        z = deqlab.solve(lambda z, x: nnx.merge(graphdef, state)(z, x), jnp.zeros(x.shape), x, batch_axis=0,
                         on_failure="ignore", solver=deqlab.Broyden(tol=1e-5, max_steps=200)).value
        a, _ = cell.feed_forward_hidden(z, x)
        full = jax.vmap(jax.jacfwd(lambda zz, xx: cell(zz[None], xx[None])[0]))(z, x)
        ff = jax.vmap(jax.jacfwd(lambda aa: jax.nn.relu(cell.expand(aa)) @ cell.contract.kernel[...]))(a)
        return full.reshape(2, length * width, -1), ff.reshape(2, length * width, -1)

    full, ff = (np.asarray(j, np.float64) for j in jacobians(state, x))
    for b in range(2):
        blocks = full[b].reshape(length, width, length, width).transpose(0, 2, 1, 3)  # [t, s]
        assert np.all(blocks[np.triu_indices(length, 1)] == 0)  # causal: no output depends on a later state
        rho = np.max(np.abs(np.linalg.eigvals(full[b])))
        diagonal = np.max(np.abs(np.linalg.eigvals(blocks[np.arange(length), np.arange(length)])))
        np.testing.assert_allclose(diagonal, rho, rtol=1e-10)  # the spectrum is the diagonal blocks'
        # cell_at_init solves the same problem in its own (vmapped) program: its point differs from this one
        # by about the tolerance, and the radius by a few 1e-3
        np.testing.assert_allclose(out["cell_radius"][0, 0, b], rho, rtol=5e-3)
        np.testing.assert_allclose(out["ff_radius"][0, 0, b], np.max(np.abs(np.linalg.eigvals(ff[b]))), rtol=5e-3)
    with pytest.raises(ValueError, match="draws"):
        ffi.cell_at_init("gaussian", [0.1], x, width=width, draws=0)
    with pytest.raises(ValueError, match="scales"):
        ffi.cell_at_init("gaussian", [], x, width=width)
    with pytest.raises(ValueError, match="steps"):
        ffi.cell_at_init("gaussian", [0.1], x, width=width, steps=1)
    with pytest.raises(ValueError, match="solver"):
        ffi.cell_at_init("gaussian", [0.1], x, width=width, solver="newton")
    with pytest.raises(ValueError, match="`x`"):
        ffi.cell_at_init("gaussian", [0.1], x[0], width=width)
