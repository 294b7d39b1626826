"""Image loaders of deqlab.lab.data: sample-image patches (offline) and CIFAR-10's pickle batches."""

import http.server
import io
import pickle
import tarfile
import threading

import numpy as np
import pytest

from deqlab.lab.data import (
    CIFAR10_FILES,
    DATASETS,
    IMAGE_SHAPE,
    load_cifar10,
    load_dataset,
    load_image_patches,
    read_cifar10_batch,
)

N_PATCHES_32 = 2 * (427 // 32) * (640 // 32)  # two 427x640 photographs, a 13x20 grid each


@pytest.mark.parametrize("split", ["train", "test"])
def test_patches_shape_dtype_range(split):
    x, y = load_image_patches(split=split)
    assert x.shape[1:] == IMAGE_SHAPE == (3, 32, 32)
    assert x.dtype == np.float32 and y.dtype == np.int32 and y.shape == (len(x),)
    assert x.min() >= 0.0 and x.max() <= 1.0
    assert set(np.unique(y)) == {0, 1}
    # 8-bit photographs scaled by 255: the values are multiples of 1/255, and many of them occur
    np.testing.assert_allclose(x * 255, np.round(x * 255), atol=1e-4)
    assert np.unique(x).size > 200


def test_patches_are_the_tiles_of_the_sample_images():
    from sklearn.datasets import load_sample_images

    x_tr, y_tr = load_image_patches(split="train")
    x_te, y_te = load_image_patches(split="test")
    assert len(x_tr) + len(x_te) == N_PATCHES_32
    assert len(x_te) == round(0.2 * N_PATCHES_32 / 2) * 2  # 20% of each photograph
    images = load_sample_images().images
    # every tile (i, j) of every photograph is found exactly once among train + test
    every = np.concatenate([x_tr, x_te])
    labels = np.concatenate([y_tr, y_te])
    keys = {(int(lab), p.tobytes()) for lab, p in zip(labels, every)}
    assert len(keys) == N_PATCHES_32
    for label, image in enumerate(images):
        for i, j in [(0, 0), (12, 19), (5, 7)]:
            tile = image[32 * i: 32 * i + 32, 32 * j: 32 * j + 32].transpose(2, 0, 1)
            assert (label, (tile.astype(np.float32) / np.float32(255)).tobytes()) in keys


def test_sample_images_read_from_the_bundled_jpegs_are_scikit_learns(monkeypatch):
    # the patches' photographs are decoded from the JPEGs scikit-learn ships, without importing
    # sklearn.datasets; they must be load_sample_images' arrays, in its order, and so must the
    # fallback's (no file found: scikit-learn's loader)
    from sklearn.datasets import load_sample_images

    from deqlab.lab import data

    expected = load_sample_images().images
    assert data._sklearn_data_file("images", "china.jpg") is not None  # the fast path is the one taken here
    for fast in (True, False):
        if not fast:
            monkeypatch.setattr(data, "_sklearn_data_file", lambda *parts: None)
        images = data._sample_images_sklearn()
        assert len(images) == len(expected) == 2
        for mine, theirs in zip(images, expected):
            assert mine.dtype == theirs.dtype == np.uint8
            np.testing.assert_array_equal(mine, theirs)


def test_patches_deterministic_and_seeded():
    a = load_image_patches(split="test", seed=3)
    b = load_image_patches(split="test", seed=3)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    c = load_image_patches(split="test", seed=4)
    assert c[0].shape == a[0].shape and not np.array_equal(c[0], a[0])


def test_patches_size_and_copies():
    x, _ = load_image_patches(split="train", size=16, test_fraction=0.5)
    assert x.shape[1:] == (3, 16, 16) and len(x) == (427 // 16) * (640 // 16)  # half of both
    x[...] = -1.0  # the cached arrays are not handed out
    assert load_image_patches(split="train", size=16, test_fraction=0.5)[0].min() >= 0.0


def test_load_dataset_image_patches():
    x, y = load_dataset("image_patches", split="train")
    x2, y2 = load_image_patches(split="train")
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    assert {"image_patches", "cifar10"} <= set(DATASETS)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"source": "flickr"}, r"load_image_patches: `source` must be one of 'sklearn', got 'flickr'"),
    ({"split": "val"}, r"load_image_patches: `split` must be one of 'train', 'test', got 'val'"),
    ({"size": 3}, r"load_image_patches: `size` must be an integer >= 4 and <= 427, got 3"),
    ({"size": 428}, r"`size` must be an integer >= 4 and <= 427, got 428"),
    ({"size": 32.0}, r"`size` must be an integer"),
    ({"test_fraction": 1.0}, r"`test_fraction` must be a finite real number > 0 and < 1, got 1.0"),
    ({"seed": -1}, r"load_image_patches: `seed` must be an integer >= 0, got -1"),
])
def test_patches_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_image_patches(**kwargs)


def test_load_dataset_patches_has_no_path(tmp_path):
    with pytest.raises(ValueError, match=r"load_dataset: `path` must be None for 'image_patches'"):
        load_dataset("image_patches", split="train", path=tmp_path)


# --- CIFAR-10 from pickle batches written by the tests in the official format --------------------

def _batch(n, seed, protocol=2):
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    labels = [int(v) for v in rng.integers(0, 10, size=n)]
    batch = {b"batch_label": b"testing batch", b"labels": labels, b"data": data,
             b"filenames": [f"img_{i}.png".encode() for i in range(n)]}
    return pickle.dumps(batch, protocol=protocol), data, labels


def _write_cifar(folder, n=(2, 3, 1, 2, 4), n_test=3, protocol=2):
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for seed, (name, k) in enumerate(zip(CIFAR10_FILES["train"] + CIFAR10_FILES["test"], n + (n_test,))):
        raw, data, labels = _batch(k, seed, protocol)
        (folder / name).write_bytes(raw)
        written[name] = (data, labels)
    return written


@pytest.mark.parametrize("protocol", [2, 4])
def test_read_batch_layout(tmp_path, protocol):
    raw, data, labels = _batch(5, 0, protocol)
    (tmp_path / "b").write_bytes(raw)
    images, y = read_cifar10_batch(tmp_path / "b")
    assert images.shape == (5, 3, 32, 32) and images.dtype == np.uint8
    np.testing.assert_array_equal(y, labels)
    assert y.dtype == np.int32
    # row = 1024 red values (row by row), then green, then blue
    for i in range(5):
        assert images[i, 0, 0, 1] == data[i, 1]
        assert images[i, 0, 1, 0] == data[i, 32]
        assert images[i, 1, 0, 0] == data[i, 1024]
        assert images[i, 2, 31, 31] == data[i, 3071]


@pytest.mark.parametrize("layout", ["cifar-10-batches-py", "cifar10", "."])
def test_load_cifar10_splits(tmp_path, layout, monkeypatch):
    written = _write_cifar(tmp_path / layout)
    x, y = load_cifar10(split="train", path=tmp_path)
    assert x.shape == (12, 3, 32, 32) and x.dtype == np.float32 and y.dtype == np.int32
    expected = np.concatenate([written[n][0] for n in CIFAR10_FILES["train"]])
    np.testing.assert_array_equal(x, expected.reshape(-1, 3, 32, 32).astype(np.float32) / np.float32(255))
    np.testing.assert_array_equal(y, sum((written[n][1] for n in CIFAR10_FILES["train"]), []))
    monkeypatch.setenv("DEQLAB_DATA", str(tmp_path))  # the directory also comes from the environment
    x_te, y_te = load_dataset("cifar10", split="test")
    assert x_te.shape == (3, 3, 32, 32) and 0.0 <= x_te.min() and x_te.max() <= 1.0
    np.testing.assert_array_equal(y_te, written["test_batch"][1])


def test_cifar10_missing_files_message(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        load_cifar10(split="test", path=tmp_path)
    message = str(info.value)
    assert "'test_batch'" in message and str(tmp_path) in message
    assert "DEQLAB_DATA" in message and "source='download'" in message
    _write_cifar(tmp_path, n=(1, 1, 1, 1, 1))
    (tmp_path / "data_batch_4").unlink()
    with pytest.raises(FileNotFoundError, match="'data_batch_4'"):
        load_cifar10(split="train", path=tmp_path)


def test_cifar10_refuses_foreign_pickles(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("this must never run",))

    (tmp_path / "code").write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(ValueError, match=r"not a CIFAR-10 python batch.*builtins.print is not allowed"):
        read_cifar10_batch(tmp_path / "code")
    (tmp_path / "text").write_text("not a pickle")
    with pytest.raises(ValueError, match="not a CIFAR-10 python batch"):
        read_cifar10_batch(tmp_path / "text")


@pytest.mark.parametrize(("batch", "message"), [
    ({b"data": np.zeros((2, 3072), np.uint8)}, r"keys b'data' and b'labels'"),
    ({b"data": np.zeros((2, 3000), np.uint8), b"labels": [0, 1]}, r"uint8 of shape \(n, 3072\)"),
    ({b"data": np.zeros((2, 3072), np.float32), b"labels": [0, 1]}, r"uint8 of shape \(n, 3072\)"),
    ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, r"must be 2 integers"),
    ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, r"labels must be 0-9, got 0..10"),
    ([1, 2], r"dict with keys b'data' and b'labels', got list"),
])
def test_cifar10_bad_batches(tmp_path, batch, message):
    (tmp_path / "b").write_bytes(pickle.dumps(batch, protocol=2))
    with pytest.raises(ValueError, match=message):
        read_cifar10_batch(tmp_path / "b")


def test_cifar10_download_from_a_local_server(tmp_path):
    served = tmp_path / "served"
    written = _write_cifar(tmp_path / "build" / "cifar-10-batches-py")
    served.mkdir()
    with tarfile.open(served / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "build" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
        extra = b"not a batch"  # members other than the six batches are not unpacked
        info = tarfile.TarInfo("cifar-10-batches-py/readme.html")
        info.size = len(extra)
        tar.addfile(info, io.BytesIO(extra))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(served), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/cifar-10-python.tar.gz"
        x, y = load_cifar10("download", split="test", path=tmp_path / "data", url=url)
        np.testing.assert_array_equal(y, written["test_batch"][1])
        assert (tmp_path / "data" / "cifar-10-batches-py" / "data_batch_5").is_file()
        assert not (tmp_path / "data" / "cifar-10-batches-py" / "readme.html").exists()
        with pytest.raises(OSError, match="could not download"):
            load_cifar10("download", split="test", path=tmp_path / "other", url=url + ".missing")
    finally:
        server.shutdown()
        thread.join()


@pytest.mark.parametrize(("call", "message"), [
    (lambda: load_cifar10("http"), r"load_cifar10: `source` must be one of 'pickle', 'download', got 'http'"),
    (lambda: load_cifar10(split="valid"), r"load_cifar10: `split` must be one of 'train', 'test'"),
    (lambda: load_dataset("cifar10", split="train", source="sklearn"),
     r"load_dataset: `source` must be one of 'pickle', 'download', got 'sklearn'"),
    (lambda: load_dataset("cifar100", split="train"), r"load_dataset: `name` must be one of .*'cifar10'"),
])
def test_cifar10_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()
