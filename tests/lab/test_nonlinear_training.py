import numpy as np
import pytest

from deqlab.lab import data
from deqlab.lab.experiments.nonlinear import training

# One tiny configuration for every test, so that they share one compiled program per seed count.
TINY = dict(width=16, batch_size=32, train_size=256, max_steps=30)
N_TEST = len(data.load_dataset("digits", split="test")[1])  # test errors are multiples of 1 / N_TEST


@pytest.mark.slow
def test_tiny_configuration_trains():
    result = training.train_seeds("orthogonal", 0.5, [0], epochs=4, **TINY)
    loss = np.array(result["loss_curve"][0])
    assert np.all(np.isfinite(loss)) and loss[-1] < 0.6 * loss[0]  # Adam at 1e-2 on 256 digits
    # chance is 0.9; 4 epochs on 256 samples already do much better on the held-out test digits
    assert result["test_error"][0] < 0.5
    assert result["best_test_error"][0] == min(result["test_error_curve"][0])
    assert len(result["converged_curve"][0]) == 4
    assert result["solver_failed"] == [min(result["converged_curve"][0]) < 0.99]
    assert result["diverged"] == [False]


@pytest.mark.slow
def test_vmapped_seeds_equal_seeds_one_by_one():
    together = training.train_seeds("gaussian", 0.8, [3, 1, 2], epochs=2, **TINY)
    for i, seed in enumerate([3, 1, 2]):
        alone = training.train_seeds("gaussian", 0.8, [seed], epochs=2, **TINY)
        # float32: the vmapped and single programs may sum in different orders (rounding, ~1e-7).
        # Within the first epoch (8 Adam steps) that stays at rounding level; later a sample whose
        # residual sits at the tolerance can take one solver step more or less, a discrete change
        # that moves the mean loss by ~1e-4 (seen with jax 0.7.2), so the second epoch gets 2e-3.
        np.testing.assert_allclose(together["loss_curve"][i][0], alone["loss_curve"][0][0], rtol=1e-5)
        np.testing.assert_allclose(together["loss_curve"][i], alone["loss_curve"][0], rtol=2e-3)
        np.testing.assert_allclose(together["steps_curve"][i], alone["steps_curve"][0], rtol=1e-2)
        # After epoch 1 the models agree to rounding, so at most one borderline test digit may flip
        # (none did on jax 0.7.2 or 0.10.2). After epoch 2 they differ by ~1e-4 (above), and every
        # test digit that close to a decision boundary may flip: seed 1 flipped 2 of 359 on
        # jax 0.10.2 and none on 0.7.2, so the bound is 4 (about 1%). The seeds' own test errors
        # differ by 30 to 130 digits, so a mixed-up seed still fails.
        digit = 1.0 / N_TEST
        assert abs(together["test_error_curve"][i][0] - alone["test_error_curve"][0][0]) <= digit + 1e-6
        assert abs(together["test_error"][i] - alone["test_error"][0]) <= 4 * digit + 1e-6
    assert len(set(np.round(together["loss_curve"], 5)[:, -1])) == 3  # the seeds do differ


@pytest.mark.slow
def test_checkpoint_resume_equals_uninterrupted(tmp_path, monkeypatch):
    reference = training.train_seeds("goe", 0.3, [0, 1, 2], epochs=3, **TINY)
    program = training._program

    def interrupted(*args):
        graphdef, treedef, run_epoch, tx = program(*args)
        calls = []

        def run(*a):
            if len(calls) == 2:
                raise KeyboardInterrupt  # killed during the third epoch
            calls.append(1)
            return run_epoch(*a)

        return graphdef, treedef, run, tx

    monkeypatch.setattr(training, "_program", interrupted)
    with pytest.raises(KeyboardInterrupt):
        training.train_seeds("goe", 0.3, [0, 1, 2], epochs=3, checkpoint_dir=tmp_path, **TINY)
    monkeypatch.setattr(training, "_program", program)
    resumed = training.train_seeds("goe", 0.3, [0, 1, 2], epochs=3, checkpoint_dir=tmp_path, **TINY)
    np.testing.assert_allclose(resumed["loss_curve"], reference["loss_curve"], rtol=1e-6)
    np.testing.assert_allclose(resumed["test_error_curve"], reference["test_error_curve"], atol=1e-7)


@pytest.mark.slow
def test_sweep_rows_and_summary(tmp_path, monkeypatch):
    rows = training.run_training_sweep(tmp_path, families=("gaussian", "orthogonal"), scales=(0.5,), seeds=[0, 1, 2],
                                       epochs=1, progress=False, **TINY)
    assert [(r["family"], r["seed"]) for r in rows] == [(f, s) for f in ("gaussian", "orthogonal") for s in range(3)]
    summary = training.summarize(rows)
    assert [(s["family"], s["scale"], s["n"]) for s in summary] == [("gaussian", 0.5, 3), ("orthogonal", 0.5, 3)]
    for s in summary:
        errors = [r["test_error"] for r in rows if r["family"] == s["family"]]
        assert s["mean_error"] == pytest.approx(np.mean(errors))
        assert s["median_error"] == pytest.approx(np.median(errors))
        assert s["failed_fraction"] == np.mean([r["solver_failed"] for r in rows if r["family"] == s["family"]])
    # rerun: everything is read back, nothing trains
    monkeypatch.setattr(training, "train_seeds", lambda *a, **k: pytest.fail("a finished unit was retrained"))
    again = training.run_training_sweep(tmp_path, families=("gaussian", "orthogonal"), scales=(0.5,),
                                        seeds=[0, 1, 2], epochs=1, progress=False, **TINY)
    assert again == rows


def test_residual_tanh_cell_is_eq_21():
    import jax
    import jax.numpy as jnp
    from flax import nnx

    cell = training.ResidualTanhCell(8, 5, ensemble="orthogonal", scale=0.7, rngs=nnx.Rngs(0))
    w = cell.recurrent.kernel[...]
    np.testing.assert_allclose(np.asarray(w.T @ w), 0.49 * np.eye(8), atol=1e-5)  # sqrt(V) = 0.7 times Haar
    z, x = jax.random.normal(jax.random.key(1), (2, 8)), jax.random.normal(jax.random.key(2), (2, 5))
    expected = jnp.tanh(z @ w + cell.recurrent.bias[...]) + x @ cell.inject.kernel[...]
    np.testing.assert_allclose(cell(z, x), expected, rtol=1e-6)


@pytest.mark.parametrize("kwargs, name", [
    (dict(family="wishart"), "family"),
    (dict(scale=-0.5), "scale"),
    (dict(seeds=[]), "seeds"),
    (dict(seeds=3), "seeds"),
    (dict(seeds=[0, 0]), "seeds"),
    (dict(seeds=[-1]), "seeds"),
    (dict(epochs=0), "epochs"),
    (dict(learning_rate=0.0), "learning_rate"),
    (dict(failure_tolerance=1.0), "failure_tolerance"),
    (dict(dataset="cifar"), "dataset"),
    (dict(train_size=0), "train_size"),
    (dict(batch_size=10_000), "batch_size"),
    (dict(momentum=0.9), "momentum"),
])
def test_argument_errors(kwargs, name):
    args = {"family": "gaussian", "scale": 0.5, "seeds": [0], **kwargs}
    with pytest.raises(ValueError, match=name):
        training.train_seeds(args.pop("family"), args.pop("scale"), args.pop("seeds"), **args)
