import numpy as np
import pytest

from deqlab.data import DATASETS, SPLITS, load_dataset, load_digits

N_DIGITS = 1797  # size of scikit-learn's bundled digits


@pytest.mark.parametrize("split", SPLITS)
def test_digits_shapes_dtypes_range(split):
    x, y = load_digits(split=split)
    assert x.ndim == 2 and x.shape[1] == 64
    assert y.shape == (x.shape[0],)
    assert x.dtype == np.float32
    assert y.dtype == np.int32
    assert 0.0 <= x.min() and x.max() <= 1.0
    assert x.max() == 1.0  # scaled by the true maximum pixel value, not by a sample maximum
    assert set(np.unique(y)) == set(range(10))


def test_split_sizes_and_stratification():
    x_tr, y_tr = load_digits(split="train")
    x_te, y_te = load_digits(split="test")
    assert len(y_tr) + len(y_te) == N_DIGITS
    assert abs(len(y_te) - 0.2 * N_DIGITS) <= 10
    # every class is represented in both splits in about the same proportion
    frac = np.bincount(y_te, minlength=10) / (
        np.bincount(y_te, minlength=10) + np.bincount(y_tr, minlength=10)
    )
    assert np.all(np.abs(frac - 0.2) < 0.02)


def _sorted_rows(x):
    return x[np.lexsort(x.T)]


def test_train_test_partition_the_dataset():
    from collections import Counter

    from sklearn.datasets import load_digits as sk_load

    x_all = (sk_load().data / 16.0).astype(np.float32)
    for seed in (0, 3):
        x_tr, _ = load_digits(split="train", seed=seed)
        x_te, _ = load_digits(split="test", seed=seed)
        # train + test is the whole dataset, as a multiset of images: nothing lost or repeated
        np.testing.assert_array_equal(_sorted_rows(np.concatenate([x_tr, x_te])), _sorted_rows(x_all))
        # an image may only be in both splits if it occurs more than once in the raw data
        counts = Counter(row.tobytes() for row in x_all)
        shared = {r.tobytes() for r in x_tr} & {r.tobytes() for r in x_te}
        assert all(counts[r] > 1 for r in shared)


def test_deterministic():
    a = load_digits(split="train", seed=7)
    b = load_digits(split="train", seed=7)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_seed_changes_split():
    a, _ = load_digits(split="test", seed=0)
    b, _ = load_digits(split="test", seed=1)
    assert a.shape == b.shape
    assert not np.array_equal(a, b)


def test_returned_arrays_are_independent_copies():
    x, y = load_digits(split="train")
    x[...] = -1.0
    y[...] = -1
    x2, y2 = load_digits(split="train")
    assert x2.min() >= 0.0 and y2.min() >= 0


@pytest.mark.parametrize("split", SPLITS)
def test_load_dataset_matches_load_digits(split):
    x, y = load_dataset("digits", split=split)
    x2, y2 = load_digits(split=split)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    x3, _ = load_dataset("digits", split=split, source="sklearn")
    np.testing.assert_array_equal(x, x3)


def test_datasets_listed():
    assert "digits" in DATASETS


def test_load_dataset_bad_name():
    with pytest.raises(ValueError, match=r"load_dataset: `name` must be one of 'digits', got 'cifar10'"):
        load_dataset("cifar10", split="train")


@pytest.mark.parametrize("split", ["val", "Train", "", None])
def test_bad_split(split):
    with pytest.raises(ValueError, match=r"load_dataset: `split` must be one of 'train', 'test'"):
        load_dataset("digits", split=split)
    with pytest.raises(ValueError, match=r"load_digits: `split` must be one of 'train', 'test'"):
        load_digits(split=split)


def test_bad_source():
    with pytest.raises(ValueError, match=r"load_dataset: `source` must be one of 'sklearn', got 'openml'"):
        load_dataset("digits", split="train", source="openml")
    with pytest.raises(ValueError, match=r"load_digits: `source` must be one of 'sklearn', got 'internet'"):
        load_digits("internet")


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_bad_test_fraction(fraction):
    with pytest.raises(ValueError, match=r"`test_fraction` must be a finite real number > 0 and < 1"):
        load_digits(test_fraction=fraction)


@pytest.mark.parametrize("seed", [-1, 1.5, "0", None])
def test_bad_seed(seed):
    with pytest.raises(ValueError, match=r"load_digits: `seed` must be an integer >= 0"):
        load_digits(seed=seed)


def test_split_is_keyword_only():
    with pytest.raises(TypeError):
        load_dataset("digits", "train")  # type: ignore[misc]
