"""Datasets for the book's experiments, with offline defaults.

Every dataset has a default *source* that needs no network access, so that the book builds and
the tests run on machines (and CI runners) without internet:

* ``"digits"``: scikit-learn's bundled handwritten digits (:func:`sklearn.datasets.load_digits`,
  1797 greyscale 8x8 images of the digits 0-9, shipped inside the scikit-learn wheel). It is the
  offline stand-in for MNIST in the quick versions of the experiments.

Later chapters add ``"mnist"`` and ``"wikitext"``, each again with an offline default.

All loaders return NumPy arrays (``float32`` inputs, ``int32`` labels); convert with
:func:`jax.numpy.asarray` where needed. Train/test splits are deterministic functions of a seed.
"""

from __future__ import annotations

import functools

import numpy as np

from deqlab import checks

DATASETS = ("digits",)
"""Names accepted by :func:`load_dataset`."""

SPLITS = ("train", "test")
"""Splits accepted by :func:`load_dataset` and :func:`load_digits`."""

DIGITS_SOURCES = ("sklearn",)
"""Sources accepted by :func:`load_digits`; the first is the (offline) default."""

_DIGITS_MAX_PIXEL = 16.0  # scikit-learn's digits have integer pixel values 0..16


@functools.lru_cache(maxsize=None)
def _digits_sklearn() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits as _sk_load_digits  # bundled data, no download

    bunch = _sk_load_digits()
    x = np.asarray(bunch.data, dtype=np.float32) / np.float32(_DIGITS_MAX_PIXEL)
    y = np.asarray(bunch.target, dtype=np.int32)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def _stratified_split(
    y: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Indices of a deterministic, class-stratified train/test split."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in np.unique(y):
        idx = np.flatnonzero(y == label)
        idx = idx[rng.permutation(idx.size)]
        n_test = int(round(test_fraction * idx.size))
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    train_idx = np.concatenate(train)
    test_idx = np.concatenate(test)
    # Shuffle across classes so that batches taken in order are class-balanced.
    return train_idx[rng.permutation(train_idx.size)], test_idx[rng.permutation(test_idx.size)]


def load_digits(
    source: str = "sklearn",
    *,
    split: str = "train",
    test_fraction: float = 0.2,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Load the 8x8 handwritten digits, split into train and test sets.

    The default (and currently only) source, ``"sklearn"``, is the copy of the UCI digits data
    bundled with scikit-learn: 1797 images, no network access needed.

    The split is stratified by class and is a deterministic function of ``seed`` and
    ``test_fraction``: the same arguments always give the same arrays, and the train and test
    sets of one ``(seed, test_fraction)`` pair are disjoint and together cover the whole dataset.

    Args:
        source: Where the data come from; one of :data:`DIGITS_SOURCES`.
        split: ``"train"`` or ``"test"``.
        test_fraction: Fraction of each class put in the test set, strictly between 0 and 1.
        seed: Seed of the split, an integer >= 0 (NumPy's ``default_rng``; not a JAX key).

    Returns:
        A pair ``(x, y)``: ``x`` is a ``float32`` array of shape ``(n, 64)`` with the flattened
        images scaled to ``[0, 1]``; ``y`` is an ``int32`` array of shape ``(n,)`` with the
        labels 0-9.

    Raises:
        ValueError: If ``source`` or ``split`` is not a valid value, ``test_fraction`` is not
            strictly between 0 and 1, or ``seed`` is not an integer >= 0.
    """
    where = "data.load_digits"
    checks.choice(source, "source", DIGITS_SOURCES, where)
    checks.choice(split, "split", SPLITS, where)
    test_fraction = checks.number(test_fraction, "test_fraction", where, lower=0.0, upper=1.0,
                                  lower_open=True, upper_open=True)
    seed = checks.integer(seed, "seed", where, minimum=0)
    x, y = _digits_sklearn()
    train_idx, test_idx = _stratified_split(y, test_fraction, seed)
    idx = train_idx if split == "train" else test_idx
    return x[idx], y[idx]  # fancy indexing returns fresh, writable copies


def load_dataset(
    name: str, *, split: str, source: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Load one split of a named dataset from its offline default source.

    Args:
        name: Dataset name; one of :data:`DATASETS`.
        split: ``"train"`` or ``"test"``.
        source: Where the data come from; ``None`` means the dataset's offline default
            (for ``"digits"``: ``"sklearn"``).

    Returns:
        A pair ``(x, y)`` of NumPy arrays; see the dataset's own loader (e.g. :func:`load_digits`)
        for shapes and dtypes.

    Raises:
        ValueError: If ``name``, ``split`` or ``source`` is not a valid value.
    """
    where = "data.load_dataset"
    checks.choice(name, "name", DATASETS, where)
    checks.choice(split, "split", SPLITS, where)
    if name == "digits":
        source = DIGITS_SOURCES[0] if source is None else checks.choice(source, "source", DIGITS_SOURCES, where)
        return load_digits(source, split=split)
    raise AssertionError(f"dataset {name!r} is listed in DATASETS but has no loader")
