"""Datasets for the book's experiments, with offline defaults.

Every dataset has a default *source* that needs no network access, so that the book builds and
the tests run on machines (and CI runners) without internet:

* ``"digits"``: scikit-learn's bundled handwritten digits (:func:`sklearn.datasets.load_digits`,
  1797 greyscale 8x8 images of the digits 0-9, shipped inside the scikit-learn wheel). It is the
  offline stand-in for MNIST in the quick versions of the experiments.

* ``"mnist"``: the 70000 greyscale 28x28 MNIST digits (LeCun et al. 1998; 60000 train, 10000
  test), read by :func:`load_mnist` from the four standard IDX files in a local directory
  (``path=``, else the environment variable ``DEQLAB_DATA``, else ``~/.cache/deqlab``; under
  ``<dir>/mnist`` or ``<dir>`` itself, gzipped or not). The default source, ``"idx"``, never
  touches the network: if the files are missing it raises an error naming them and where they
  were looked for. ``source="download"`` fetches the missing files first (from :data:`MNIST_URL`).
  Used at full scale by the training experiment of chapter 3 (001 §4.1, Fig. 5).

Later chapters add ``"wikitext"``, again with an offline default.

All loaders return NumPy arrays (``float32`` inputs, ``int32`` labels); convert with
:func:`jax.numpy.asarray` where needed. Train/test splits are deterministic functions of a seed.
"""

from __future__ import annotations

import functools
import gzip
import os
import tempfile
from pathlib import Path

import numpy as np

from deqlab import checks

DATASETS = ("digits", "mnist")
"""Names accepted by :func:`load_dataset`."""

SPLITS = ("train", "test")
"""Splits accepted by :func:`load_dataset` and :func:`load_digits`."""

DIGITS_SOURCES = ("sklearn",)
"""Sources accepted by :func:`load_digits`; the first is the (offline) default."""

_DIGITS_MAX_PIXEL = 16.0  # scikit-learn's digits have integer pixel values 0..16

MNIST_SOURCES = ("idx", "download")
"""Sources accepted by :func:`load_mnist`; the first is the (offline) default."""

MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
"""The standard IDX file names (images, labels) of each split; each may also end in ``.gz``."""

MNIST_URL = "https://storage.googleapis.com/cvdf-datasets/mnist/"
"""Where ``source="download"`` fetches ``<name>.gz`` from (a mirror of LeCun's original files)."""

DATA_ENV = "DEQLAB_DATA"
"""Environment variable naming the local data directory."""

_MNIST_MAX_PIXEL = 255.0  # MNIST pixels are unsigned bytes 0..255
_MNIST_SHAPES = {"images": (28, 28), "labels": ()}

# IDX type codes (the third byte of the magic number) and their big-endian NumPy dtypes.
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


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


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (the format of the MNIST files), gzipped or not.

    An IDX file is a 4-byte magic number ``0x00 0x00 <type> <ndim>``, then ``ndim`` big-endian
    uint32 dimensions, then the data in C order, big-endian. Gzip is detected from the content
    (its magic bytes ``1f 8b``), not from the file name.

    Returns:
        The array, of the file's shape and type (in native byte order).

    Raises:
        FileNotFoundError: if there is no such file.
        ValueError: if the file is not IDX (bad magic number, unknown type code) or its size does
            not match its header.
    """
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as error:
            raise ValueError(f"data.read_idx: {path} looks gzipped but does not decompress ({error}).") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"data.read_idx: {path} is not an IDX file: its magic number must be 0x00 0x00 "
                         f"<type in {sorted(hex(c) for c in _IDX_DTYPES)}> <ndim>, got {raw[:4].hex(' ')!r}.")
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"data.read_idx: {path} is truncated: {len(raw)} bytes, shorter than its "
                         f"{ndim}-dimensional header ({header} bytes).")
    shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise ValueError(f"data.read_idx: {path} has {len(raw)} bytes, but its header (shape {shape}, "
                         f"type {dtype.str}) says {expected}: the file is truncated or corrupt.")
    data = np.frombuffer(raw, dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def data_directory(path: str | os.PathLike | None = None) -> Path:
    """The local data directory: ``path`` if given, else ``$DEQLAB_DATA``, else ``~/.cache/deqlab``."""
    if path is not None:
        return Path(path).expanduser()
    env = os.environ.get(DATA_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "deqlab"


def _find_idx(base: Path, name: str) -> Path | None:
    for folder in (base / "mnist", base):
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    return None


def _download(url: str, target: Path) -> None:
    import urllib.request

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            while chunk := response.read(1 << 20):
                out.write(chunk)
        os.replace(tmp, target)  # atomic: an interrupted download leaves no half file behind
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_mnist(
    source: str = "idx",
    *,
    split: str = "train",
    path: str | os.PathLike | None = None,
    url: str = MNIST_URL,
) -> tuple[np.ndarray, np.ndarray]:
    """Load the standard MNIST train (60000) or test (10000) split from its IDX files.

    The files (:data:`MNIST_FILES`, each possibly ``.gz``) are looked for in ``<dir>/mnist`` and
    then ``<dir>``, where ``<dir>`` is :func:`data_directory` ``(path)``. With ``source="idx"``
    (the default) nothing is downloaded; with ``source="download"`` missing files are fetched
    from ``url + name + ".gz"`` into ``<dir>/mnist`` first (atomically).

    Returns:
        ``(x, y)``: ``x`` float32 of shape ``(n, 784)``, the flattened images scaled to [0, 1] by
        the largest possible pixel value 255 (as :func:`load_digits` scales by 16); ``y`` int32
        labels 0-9.

    Raises:
        ValueError: bad ``source`` or ``split``; files that are not MNIST IDX files (magic
            number, shape), or images and labels of different lengths.
        FileNotFoundError: ``source="idx"`` and a file is missing (the message names the files,
            the directories searched and how to get them).
        OSError: ``source="download"`` and the download failed (no network, bad URL).
    """
    where = "data.load_mnist"
    checks.choice(source, "source", MNIST_SOURCES, where)
    checks.choice(split, "split", SPLITS, where)
    base = data_directory(path)
    arrays = {}
    for kind, name in zip(("images", "labels"), MNIST_FILES[split]):
        found = _find_idx(base, name)
        if found is None and source == "download":
            found = base / "mnist" / f"{name}.gz"
            try:
                _download(f"{url}{name}.gz", found)
            except OSError as error:
                raise OSError(f"{where}: could not download {url}{name}.gz into {found.parent} ({error}). "
                              f"Without network access, put the files there by hand.") from error
        if found is None:
            names = ", ".join(MNIST_FILES["train"] + MNIST_FILES["test"])
            raise FileNotFoundError(
                f"{where}: MNIST file {name!r} (or {name}.gz) not found in {base / 'mnist'} or {base}. "
                f"Put the four IDX files ({names}; gzipped or not) in one of them (set path= or the "
                f"environment variable {DATA_ENV}), or call with source='download' to fetch them from {url}."
            )
        array = read_idx(found)
        if array.dtype != np.uint8 or array.shape[1:] != _MNIST_SHAPES[kind]:
            want = "(n, 28, 28)" if kind == "images" else "(n,)"
            raise ValueError(f"{where}: {found} must hold MNIST {kind}, unsigned bytes of shape {want}; "
                             f"got {array.dtype} of shape {array.shape}.")
        arrays[kind] = array
    images, labels = arrays["images"], arrays["labels"]
    if len(images) != len(labels):
        raise ValueError(f"{where}: the {split} images ({len(images)}) and labels ({len(labels)}) differ in number.")
    if labels.size and labels.max() > 9:
        raise ValueError(f"{where}: MNIST labels must be 0-9, got a {int(labels.max())}.")
    x = images.reshape(len(images), -1).astype(np.float32) / np.float32(_MNIST_MAX_PIXEL)
    return x, labels.astype(np.int32)


def load_dataset(
    name: str, *, split: str, source: str | None = None, path: str | os.PathLike | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Load one split of a named dataset, by default from its offline source.

    Args:
        name: Dataset name; one of :data:`DATASETS`.
        split: ``"train"`` or ``"test"``.
        source: Where the data come from; ``None`` means the dataset's offline default
            (for ``"digits"``: ``"sklearn"``; for ``"mnist"``: ``"idx"``, local files).
        path: the local data directory of file-based datasets (``"mnist"``; see
            :func:`load_mnist`); must be None for ``"digits"``.

    Returns:
        A pair ``(x, y)`` of NumPy arrays; see the dataset's own loader (e.g. :func:`load_digits`)
        for shapes and dtypes.

    Raises:
        ValueError: If ``name``, ``split``, ``source`` or ``path`` is not a valid value.
        FileNotFoundError, OSError: as :func:`load_mnist` for ``"mnist"``.
    """
    where = "data.load_dataset"
    checks.choice(name, "name", DATASETS, where)
    checks.choice(split, "split", SPLITS, where)
    if name == "mnist":
        source = MNIST_SOURCES[0] if source is None else checks.choice(source, "source", MNIST_SOURCES, where)
        return load_mnist(source, split=split, path=path)
    if path is not None:
        raise checks.fail("path", f"None for {name!r} (it has no local files)", path, where)
    if name == "digits":
        source = DIGITS_SOURCES[0] if source is None else checks.choice(source, "source", DIGITS_SOURCES, where)
        return load_digits(source, split=split)
    raise AssertionError(f"dataset {name!r} is listed in DATASETS but has no loader")
