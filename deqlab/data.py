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

* ``"image_patches"``: colour patches of the paper's CIFAR-10 size (3 x 32 x 32), cut by
  :func:`load_image_patches` from the two photographs scikit-learn ships
  (:func:`sklearn.datasets.load_sample_images`: ``china.jpg`` and ``flower.jpg``, 427 x 640 RGB
  each, released on Flickr under the Creative Commons Attribution 2.0 licence, CC BY 2.0, by
  their photographers as credited in scikit-learn's ``DESCR``; reading the JPEGs needs Pillow). It
  is the offline stand-in for CIFAR-10 in the quick version of the denoising experiment of
  chapter 4 (004 §4, Fig. 6).

* ``"cifar10"``: the 60000 colour 32 x 32 CIFAR-10 images (Krizhevsky 2009; 50000 train, 10000
  test, 10 classes), read by :func:`load_cifar10` from the standard "python version" pickle
  batches (``data_batch_1`` ... ``data_batch_5``, ``test_batch``) in a local directory, found as
  MNIST's files are; ``source="download"`` fetches and unpacks :data:`CIFAR10_URL` first.

Later chapters add ``"wikitext"``, again with an offline default.

All loaders return NumPy arrays (``float32`` inputs, ``int32`` labels); convert with
:func:`jax.numpy.asarray` where needed. Train/test splits are deterministic functions of a seed.
Images of the colour datasets are ``(n, 3, 32, 32)``, channel first: the layout of CIFAR-10's own
rows and of :mod:`deqlab.theory.kglm.kernels`.
"""

from __future__ import annotations

import functools
import gzip
import io
import os
import pickle
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from deqlab import checks

DATASETS = ("digits", "mnist", "image_patches", "cifar10")
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


PATCH_SOURCES = ("sklearn",)
"""Sources accepted by :func:`load_image_patches`; the first is the (offline) default."""

IMAGE_SHAPE = (3, 32, 32)
"""Shape ``(channels, height, width)`` of one CIFAR-10 image and of one patch."""

CIFAR10_SOURCES = ("pickle", "download")
"""Sources accepted by :func:`load_cifar10`; the first is the (offline) default."""

CIFAR10_FILES = {
    "train": tuple(f"data_batch_{i}" for i in range(1, 6)),
    "test": ("test_batch",),
}
"""The standard pickle batch names of each split (the "CIFAR-10 python version")."""

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
"""Where ``source="download"`` fetches the archive from (the dataset's home page)."""

_CIFAR10_FOLDERS = ("cifar-10-batches-py", "cifar10")  # the archive's folder, then a plain name
_PIXEL_MAX = 255.0  # 8-bit images: both the sample JPEGs and CIFAR-10


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


@functools.lru_cache(maxsize=None)
def _sample_image_patches(size: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_sample_images  # bundled JPEGs (Pillow decodes them)

    patches, labels = [], []
    for label, image in enumerate(load_sample_images().images):
        h, w = image.shape[0] // size, image.shape[1] // size
        # A non-overlapping grid of tiles: no pixel is in two patches, so a train/test split of
        # the patches is a split of the pixels (no test pixel was seen in training).
        tiles = image[: h * size, : w * size].reshape(h, size, w, size, 3).transpose(0, 2, 4, 1, 3)
        patches.append(tiles.reshape(h * w, 3, size, size))
        labels.append(np.full(h * w, label, np.int32))
    x = np.concatenate(patches).astype(np.float32) / np.float32(_PIXEL_MAX)
    y = np.concatenate(labels)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def load_image_patches(
    source: str = "sklearn",
    *,
    split: str = "train",
    size: int = 32,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Colour patches of scikit-learn's two sample photographs, split into train and test sets.

    The images are those of :func:`sklearn.datasets.load_sample_images` (``china.jpg``, a temple,
    and ``flower.jpg``; 427 x 640 RGB each; Creative Commons Attribution 2.0, photographers
    credited in scikit-learn's ``DESCR``; shipped inside the scikit-learn wheel, decoded with
    Pillow). Each is cut into a grid of non-overlapping ``size x size`` tiles (the right and bottom
    remainders dropped): with the default ``size=32``, CIFAR-10's image size (004 §4), that is
    13 x 20 = 260 tiles per photograph, 520 in all. The split is stratified by photograph and a
    deterministic function of ``(seed, test_fraction)``, as :func:`load_digits`'s.

    Natural-image statistics on CIFAR-10's scale, offline; not a substitute for CIFAR-10's
    variety (two scenes), which is why the book's full scale reads CIFAR-10 itself.

    Args:
        source: Where the data come from; one of :data:`PATCH_SOURCES`.
        split: ``"train"`` or ``"test"``.
        size: Side of the square patches in pixels, an integer in [4, 427].
        test_fraction: Fraction of each photograph's patches put in the test set, in (0, 1).
        seed: Seed of the split, an integer >= 0 (NumPy's ``default_rng``; not a JAX key).

    Returns:
        ``(x, y)``: ``x`` float32 of shape ``(n, 3, size, size)`` (channel first), pixels scaled
        to [0, 1] by 255; ``y`` int32, the photograph each patch comes from (0 china, 1 flower).

    Raises:
        ValueError: bad ``source``, ``split``, ``size``, ``test_fraction`` or ``seed``.
    """
    where = "data.load_image_patches"
    checks.choice(source, "source", PATCH_SOURCES, where)
    checks.choice(split, "split", SPLITS, where)
    size = checks.integer(size, "size", where, minimum=4, maximum=427)
    test_fraction = checks.number(test_fraction, "test_fraction", where, lower=0.0, upper=1.0,
                                  lower_open=True, upper_open=True)
    seed = checks.integer(seed, "seed", where, minimum=0)
    x, y = _sample_image_patches(size)
    train_idx, test_idx = _stratified_split(y, test_fraction, seed)
    idx = train_idx if split == "train" else test_idx
    return x[idx], y[idx]


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, bytes and NumPy arrays only: a pickle can run arbitrary code, and
    these files come from the network or a user's directory, so every other global is refused."""

    _RECONSTRUCT = np.ndarray.__reduce__(np.zeros(1))[0]  # numpy(._)core.multiarray._reconstruct

    def find_class(self, module: str, name: str):
        if module in ("numpy.core.multiarray", "numpy._core.multiarray") and name == "_reconstruct":
            return self._RECONSTRUCT
        if module == "numpy" and name in ("ndarray", "dtype"):
            return getattr(np, name)
        if module == "_codecs" and name == "encode":  # bytes in Python 3 pickles of protocol < 3
            import _codecs

            return _codecs.encode
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR-10 batch")


def read_cifar10_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 "python version" batch file (e.g. ``data_batch_1``).

    A batch is a pickled dict (written by Python 2, hence read with ``encoding="bytes"``) whose
    ``b"data"`` is a uint8 array ``(n, 3072)``, each row a 32 x 32 image stored channel-major
    (1024 red, 1024 green, 1024 blue values, each row by row), and whose ``b"labels"`` lists
    ``n`` integers 0-9. The file is unpickled by a restricted unpickler that accepts NumPy arrays
    and Python containers only.

    Returns:
        ``(images, labels)``: uint8 ``(n, 3, 32, 32)`` and int32 ``(n,)``.

    Raises:
        FileNotFoundError: if there is no such file.
        ValueError: if the file is not a CIFAR-10 batch (not a pickle, a refused global, missing
            keys, wrong shapes or dtype, labels outside 0-9).
    """
    where = "data.read_cifar10_batch"
    path = Path(path)
    raw = path.read_bytes()
    try:
        batch = _ArrayUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except Exception as error:  # noqa: BLE001 - any unpickling failure means "not a batch"
        raise ValueError(f"{where}: {path} is not a CIFAR-10 python batch (pickle) file: {error}") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(f"{where}: {path} must hold a dict with keys b'data' and b'labels', got {keys}.")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != int(np.prod(IMAGE_SHAPE)):
        raise ValueError(f"{where}: {path}: b'data' must be uint8 of shape (n, 3072), "
                         f"got {data.dtype} of shape {data.shape}.")
    if labels.shape != (data.shape[0],) or labels.dtype.kind not in "iu":
        raise ValueError(f"{where}: {path}: b'labels' must be {data.shape[0]} integers (one per image), "
                         f"got {labels.dtype} of shape {labels.shape}.")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise ValueError(f"{where}: {path}: CIFAR-10 labels must be 0-9, got {int(labels.min())}..{int(labels.max())}.")
    return data.reshape((-1,) + IMAGE_SHAPE), labels.astype(np.int32)


def _find_cifar10(base: Path, name: str) -> Path | None:
    for folder in [base / f for f in _CIFAR10_FOLDERS] + [base]:
        if (folder / name).is_file():
            return folder / name
    return None


def _download_cifar10(url: str, base: Path) -> None:
    """Fetch the archive into ``base`` and unpack only the six batch files (no other member)."""
    archive = base / Path(url).name
    if not archive.is_file():
        _download(url, archive)
    wanted = {f"{_CIFAR10_FOLDERS[0]}/{n}" for n in CIFAR10_FILES["train"] + CIFAR10_FILES["test"]}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            if member.name in wanted and member.isfile():
                target = base / member.name  # a name from `wanted`: no path traversal possible
                target.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, open(target, "wb") as out:
                    out.write(src.read())


def load_cifar10(
    source: str = "pickle",
    *,
    split: str = "train",
    path: str | os.PathLike | None = None,
    url: str = CIFAR10_URL,
) -> tuple[np.ndarray, np.ndarray]:
    """Load CIFAR-10's train (50000) or test (10000) split from its python pickle batches.

    The batches (:data:`CIFAR10_FILES`) are looked for in ``<dir>/cifar-10-batches-py`` (the
    folder the official archive unpacks to), ``<dir>/cifar10`` and ``<dir>``, where ``<dir>`` is
    :func:`data_directory` ``(path)`` (``path``, else ``$DEQLAB_DATA``, else ``~/.cache/deqlab``).
    With ``source="pickle"`` (the default) nothing is downloaded; with ``source="download"`` and a
    batch missing, the archive at ``url`` is fetched into ``<dir>`` and its six batches unpacked
    into ``<dir>/cifar-10-batches-py``. Each batch is read by :func:`read_cifar10_batch`.

    Returns:
        ``(x, y)``: ``x`` float32 ``(n, 3, 32, 32)`` (channel first), pixels scaled to [0, 1] by
        255; ``y`` int32 labels 0-9.

    Raises:
        ValueError: bad ``source`` or ``split``; a file that is not a CIFAR-10 batch.
        FileNotFoundError: ``source="pickle"`` and a batch is missing (the message names the
            files, the directories searched and how to get them).
        OSError: ``source="download"`` and the download failed (no network, bad URL).
    """
    where = "data.load_cifar10"
    checks.choice(source, "source", CIFAR10_SOURCES, where)
    checks.choice(split, "split", SPLITS, where)
    base = data_directory(path)
    names = CIFAR10_FILES[split]
    if source == "download" and any(_find_cifar10(base, n) is None for n in names):
        try:
            _download_cifar10(url, base)
        except (OSError, tarfile.TarError) as error:
            raise OSError(f"{where}: could not download and unpack {url} into {base} ({error}). "
                          f"Without network access, put the batches there by hand.") from error
    images, labels = [], []
    for name in names:
        found = _find_cifar10(base, name)
        if found is None:
            folders = ", ".join(str(base / f) for f in _CIFAR10_FOLDERS)
            every = ", ".join(CIFAR10_FILES["train"] + CIFAR10_FILES["test"])
            raise FileNotFoundError(
                f"{where}: CIFAR-10 batch {name!r} not found in {folders} or {base}. Unpack the python "
                f"version of CIFAR-10 ({url}; files {every}) into one of them (set path= or the "
                f"environment variable {DATA_ENV}), or call with source='download' to fetch it."
            )
        x, y = read_cifar10_batch(found)
        images.append(x)
        labels.append(y)
    x = np.concatenate(images).astype(np.float32) / np.float32(_PIXEL_MAX)
    return x, np.concatenate(labels)


def load_dataset(
    name: str, *, split: str, source: str | None = None, path: str | os.PathLike | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Load one split of a named dataset, by default from its offline source.

    Args:
        name: Dataset name; one of :data:`DATASETS`.
        split: ``"train"`` or ``"test"``.
        source: Where the data come from; ``None`` means the dataset's offline default
            (``"sklearn"`` for ``"digits"`` and ``"image_patches"``; local files for
            ``"mnist"``, ``"idx"``, and ``"cifar10"``, ``"pickle"``).
        path: the local data directory of file-based datasets (``"mnist"``, ``"cifar10"``; see
            :func:`load_mnist`, :func:`load_cifar10`); must be None for the others.

    Returns:
        A pair ``(x, y)`` of NumPy arrays; see the dataset's own loader (e.g. :func:`load_digits`)
        for shapes and dtypes.

    Raises:
        ValueError: If ``name``, ``split``, ``source`` or ``path`` is not a valid value.
        FileNotFoundError, OSError: as :func:`load_mnist` for ``"mnist"`` and
            :func:`load_cifar10` for ``"cifar10"``.
    """
    where = "data.load_dataset"
    checks.choice(name, "name", DATASETS, where)
    checks.choice(split, "split", SPLITS, where)
    if name == "mnist":
        source = MNIST_SOURCES[0] if source is None else checks.choice(source, "source", MNIST_SOURCES, where)
        return load_mnist(source, split=split, path=path)
    if name == "cifar10":
        source = CIFAR10_SOURCES[0] if source is None else checks.choice(source, "source", CIFAR10_SOURCES, where)
        return load_cifar10(source, split=split, path=path)
    if path is not None:
        raise checks.fail("path", f"None for {name!r} (it has no local files)", path, where)
    if name == "digits":
        source = DIGITS_SOURCES[0] if source is None else checks.choice(source, "source", DIGITS_SOURCES, where)
        return load_digits(source, split=split)
    if name == "image_patches":
        source = PATCH_SOURCES[0] if source is None else checks.choice(source, "source", PATCH_SOURCES, where)
        return load_image_patches(source, split=split)
    raise AssertionError(f"dataset {name!r} is listed in DATASETS but has no loader")
