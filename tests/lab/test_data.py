import gzip
import http.server
import struct
import threading

import numpy as np
import pytest

from deqlab.lab.data import DATASETS, MNIST_FILES, SPLITS, load_dataset, load_digits, load_mnist, read_idx

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


def test_digits_read_from_the_bundled_csv_are_scikit_learns(monkeypatch):
    # _digits_sklearn reads the CSV scikit-learn ships instead of importing sklearn.datasets (0.57 s
    # a page); the arrays, in order, must be load_digits' own, and so must the fallback's (no file)
    from sklearn.datasets import load_digits as sk_load

    from deqlab.lab import data

    bunch = sk_load()
    expected = (np.asarray(bunch.data / 16.0, np.float32), np.asarray(bunch.target, np.int32))
    assert data._sklearn_data_file("data", "digits.csv.gz") is not None  # the fast path is the one taken here
    for fast in (True, False):
        data._digits_sklearn.cache_clear()
        if not fast:
            monkeypatch.setattr(data, "_sklearn_data_file", lambda *parts: None)
        x, y = data._digits_sklearn()
        np.testing.assert_array_equal(x, expected[0])
        np.testing.assert_array_equal(y, expected[1])
        assert x.dtype == np.float32 and y.dtype == np.int32 and not x.flags.writeable
    data._digits_sklearn.cache_clear()


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


# An unknown dataset name, test_fraction=0 and seed=1.5: tests/library/test_probe.py (data rows).


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


@pytest.mark.parametrize("fraction", [1.0, -0.1, 1.5])
def test_bad_test_fraction(fraction):
    with pytest.raises(ValueError, match=r"`test_fraction` must be a finite real number > 0 and < 1"):
        load_digits(test_fraction=fraction)


@pytest.mark.parametrize("seed", [-1, "0", None])
def test_bad_seed(seed):
    with pytest.raises(ValueError, match=r"load_digits: `seed` must be an integer >= 0"):
        load_digits(seed=seed)


def test_split_is_keyword_only():
    with pytest.raises(TypeError):
        load_dataset("digits", "train")  # type: ignore[misc]


# --- MNIST from IDX files (tiny files written by the tests themselves) ---------------------------

def _idx_bytes(array, type_code=0x08):
    array = np.asarray(array)
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def _write_mnist(folder, n_train=5, n_test=3, compress=False, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    expected = {}
    for split, n in (("train", n_train), ("test", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        images[0, 0, 0] = 255
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        for name, array in zip(MNIST_FILES[split], (images, labels)):
            raw = _idx_bytes(array)
            if compress:
                (folder / f"{name}.gz").write_bytes(gzip.compress(raw))
            else:
                (folder / name).write_bytes(raw)
        expected[split] = (images, labels)
    return expected


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("split", SPLITS)
def test_mnist_reads_idx_files(tmp_path, split, compress):
    expected = _write_mnist(tmp_path / "mnist", compress=compress)
    x, y = load_mnist(split=split, path=tmp_path)
    images, labels = expected[split]
    assert x.dtype == np.float32 and y.dtype == np.int32
    assert x.shape == (len(labels), 784)
    np.testing.assert_array_equal(x, images.reshape(len(labels), -1) / np.float32(255))
    np.testing.assert_array_equal(y, labels)
    assert x.max() == 1.0 and x.min() >= 0.0  # scaled by the largest possible pixel, like digits
    x2, y2 = load_dataset("mnist", split=split, path=tmp_path)
    np.testing.assert_array_equal(x2, x)
    np.testing.assert_array_equal(y2, y)


def test_mnist_directory_from_environment(tmp_path, monkeypatch):
    expected = _write_mnist(tmp_path, seed=4)  # the files directly in the directory, no mnist/
    monkeypatch.setenv("DEQLAB_DATA", str(tmp_path))
    _, y = load_dataset("mnist", split="test")
    np.testing.assert_array_equal(y, expected["test"][1])


def test_read_idx_other_types_and_shapes(tmp_path):
    for code, dtype in ((0x0B, ">i2"), (0x0C, ">i4"), (0x0D, ">f4"), (0x0E, ">f8"), (0x09, ">i1")):
        array = (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype)
        (tmp_path / "a.idx").write_bytes(_idx_bytes(array, code))
        out = read_idx(tmp_path / "a.idx")
        np.testing.assert_array_equal(out, array)
        assert out.dtype.isnative


def test_read_idx_rejects_bad_files(tmp_path):
    path = tmp_path / "bad"
    path.write_bytes(b"\x08\x03\x00\x00" + bytes(10))
    with pytest.raises(ValueError, match="not an IDX file: its magic number"):
        read_idx(path)
    path.write_bytes(bytes([0, 0, 0x07, 1]) + bytes(8))
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(path)
    path.write_bytes(_idx_bytes(np.zeros((4, 28, 28), np.uint8))[:-1])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        read_idx(path)
    path.write_bytes(bytes([0, 0, 0x08, 3]) + bytes(4))
    with pytest.raises(ValueError, match="truncated"):
        read_idx(path)
    path.write_bytes(b"\x1f\x8bnot really gzip")
    with pytest.raises(ValueError, match="does not decompress"):
        read_idx(path)


def test_mnist_rejects_wrong_contents(tmp_path):
    _write_mnist(tmp_path)
    (tmp_path / MNIST_FILES["train"][0]).write_bytes(_idx_bytes(np.zeros((5, 8, 8), np.uint8)))
    with pytest.raises(ValueError, match=r"must hold MNIST images.*\(n, 28, 28\)"):
        load_mnist(split="train", path=tmp_path)
    _write_mnist(tmp_path, n_train=5)
    (tmp_path / MNIST_FILES["train"][1]).write_bytes(_idx_bytes(np.zeros(4, np.uint8)))
    with pytest.raises(ValueError, match=r"images \(5\) and labels \(4\) differ"):
        load_mnist(split="train", path=tmp_path)


def test_mnist_missing_files_error_names_them(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("source='idx' must not touch the network")

    monkeypatch.setattr("urllib.request.urlopen", no_network)
    with pytest.raises(FileNotFoundError) as info:
        load_dataset("mnist", split="train", path=tmp_path)
    message = str(info.value)
    for name in MNIST_FILES["train"] + MNIST_FILES["test"]:
        assert name in message
    assert str(tmp_path) in message and "DEQLAB_DATA" in message and "source='download'" in message


def test_mnist_download_from_a_local_server(tmp_path):
    served = tmp_path / "served"
    expected = _write_mnist(served, compress=True, seed=2)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(served), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        x, y = load_mnist("download", split="test", path=tmp_path / "data", url=url)
        np.testing.assert_array_equal(y, expected["test"][1])
        assert sorted(p.name for p in (tmp_path / "data" / "mnist").iterdir()) == sorted(
            f"{n}.gz" for n in MNIST_FILES["test"])
        with pytest.raises(OSError, match="could not download"):
            load_mnist("download", split="test", path=tmp_path / "other", url=url + "missing/")
        assert not list((tmp_path / "other" / "mnist").iterdir())  # no partial files left
    finally:
        server.shutdown()
        server.server_close()


def test_mnist_argument_errors(tmp_path):
    with pytest.raises(ValueError, match=r"load_dataset: `source` must be one of 'idx', 'download'"):
        load_dataset("mnist", split="train", source="sklearn")
    with pytest.raises(ValueError, match=r"load_mnist: `split` must be one of 'train', 'test'"):
        load_mnist(split="validation", path=tmp_path)
    with pytest.raises(ValueError, match=r"load_dataset: `path` must be None for 'digits'"):
        load_dataset("digits", split="train", path=tmp_path)
