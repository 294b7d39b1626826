"""Sequence data of chapter 5: copy memory (003 §5.1, App. F) and text corpora (003 §5.2, 001 App. D)."""

import gzip
import hashlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqlab.lab import data as text

# ---------------------------------------------------------------- copy memory


@pytest.mark.parametrize("delay,memory,symbols", [(1, 1, 1), (5, 3, 8), (40, 10, 8), (400, 10, 8)])
def test_copy_memory_layout(delay, memory, symbols):
    x, y = text.copy_memory(jax.random.key(0), batch_size=64, delay=delay, memory=memory, symbols=symbols)
    x, y = np.asarray(x), np.asarray(y)
    length = delay + 2 * memory
    assert x.shape == y.shape == (64, length) and x.dtype == y.dtype == np.int32
    seq = x[:, :memory]
    assert seq.min() >= 1 and seq.max() <= symbols
    assert np.all(x[:, memory:memory + delay - 1] == text.COPY_BLANK)
    assert np.all(x[:, memory + delay - 1:] == text.COPY_MARKER)  # memory + 1 markers, the first one is the cue
    assert np.sum(x == text.COPY_MARKER, axis=1).tolist() == [memory + 1] * 64
    assert np.all(y[:, :delay + memory] == text.COPY_BLANK)
    np.testing.assert_array_equal(y[:, -memory:], seq)  # recall, in order, after T blanks


def test_copy_memory_keys_and_jit():
    a = text.copy_memory(jax.random.key(1), batch_size=8, delay=20)
    b = text.copy_memory(jax.random.key(1), batch_size=8, delay=20)
    c = text.copy_memory(jax.random.key(2), batch_size=8, delay=20)
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])
    jitted = jax.jit(lambda k: text.copy_memory(k, batch_size=8, delay=20))
    np.testing.assert_array_equal(jitted(jax.random.key(1))[0], a[0])
    vmapped = jax.vmap(lambda k: text.copy_memory(k, batch_size=2, delay=5)[0])(jax.random.split(jax.random.key(0), 3))
    assert vmapped.shape == (3, 2, 25)


def test_copy_memory_symbols_uniform():
    # 8 symbols, 4000 x 10 draws: each count is Binomial(40000, 1/8), sd = 66; 5 sd is 330
    x, _ = text.copy_memory(jax.random.key(3), batch_size=4000, delay=1)
    counts = np.bincount(np.asarray(x[:, :10]).ravel(), minlength=9)[1:]
    assert np.all(np.abs(counts - 5000) < 330), counts


def test_copy_memory_baseline_is_memoryless_cross_entropy():
    # The predictor that knows the layout but not the symbols: blank with certainty until the recall,
    # uniform over 1..8 there. Its mean cross-entropy over a batch is the formula, and the formula at
    # T = 400 is 003 Table 1's LSTM / GRU level (0.0501 / 0.0491).
    delay, memory = 30, 10
    x, y = text.copy_memory(jax.random.key(4), batch_size=16, delay=delay)
    probs = np.zeros((delay + 2 * memory, text.COPY_VOCAB))
    probs[: delay + memory, text.COPY_BLANK] = 1.0
    probs[delay + memory:, 1:9] = 1 / 8
    nll = -np.log(np.take_along_axis(np.broadcast_to(probs, (16,) + probs.shape), np.asarray(y)[..., None], -1))
    assert math.isclose(nll.mean(), text.copy_memory_baseline(delay), rel_tol=1e-12)
    assert math.isclose(text.copy_memory_baseline(400), 10 * math.log(8) / 420)
    assert abs(text.copy_memory_baseline(400) - 0.0501) < 1e-3 and abs(text.copy_memory_baseline(400) - 0.0491) < 1e-3


@pytest.mark.parametrize("kwargs,match", [
    (dict(batch_size=0, delay=5), "batch_size"),
    (dict(batch_size=2, delay=0), "delay"),
    (dict(batch_size=2, delay=5, memory=0), "memory"),
    (dict(batch_size=2, delay=5, symbols=9), "symbols"),
    (dict(batch_size=2.5, delay=5), "batch_size"),
])
def test_copy_memory_bad_args(kwargs, match):
    with pytest.raises(ValueError, match=match):
        text.copy_memory(jax.random.key(0), **kwargs)


def test_copy_memory_bad_key():
    with pytest.raises(ValueError, match="key"):
        text.copy_memory(0, batch_size=2, delay=5)
    with pytest.raises(ValueError, match="delay"):
        text.copy_memory_baseline(0)


# ---------------------------------------------------------------- the bundled corpus


def test_austen_file_is_the_documented_text():
    raw = gzip.decompress(text.AUSTEN_FILE.read_bytes())
    # the sha256 recorded in deqlab/lab/corpora/README.md (provenance)
    assert hashlib.sha256(raw).hexdigest() == "dfc684d4f857fa938268f9ab9c5567b64bd0691251eca959644adeabe6287a4d"
    assert len(raw.decode("utf-8")) == 684768


def test_austen_splits_partition_the_novel_in_order():
    parts = {s: text.load_text("austen", split=s) for s in text.TEXT_SPLITS}
    whole = text._paragraphs_of_austen()
    assert parts["train"] + parts["validation"] + parts["test"] == whole
    sizes = {s: len(p) for s, p in parts.items()}
    assert abs(sizes["train"] / len(whole) - 0.9) < 0.01 and min(sizes.values()) > 50, sizes
    assert any(p.startswith("It is a truth universally acknowledged") for p in parts["train"][:5])
    assert parts["test"][-1].endswith("the means of uniting them.")
    for p in whole:
        assert p and p == " ".join(p.split())  # single-spaced, no hard wraps left


@pytest.mark.parametrize("kwargs,match", [
    (dict(name="wikitext"), "name"),
    (dict(split="valid"), "split"),
    (dict(source="hub"), "source"),
    (dict(path="/tmp"), "path"),
    (dict(name="wikitext-103", source="bundled"), "source"),
])
def test_load_text_bad_args(kwargs, match):
    with pytest.raises(ValueError, match=match):
        text.load_text(**kwargs)


# ---------------------------------------------------------------- Wikitext-103 through datasets


def _write_wikitext(root, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = root / text.WIKITEXT_HUB[1]
    folder.mkdir(parents=True)
    for split, lines in rows.items():
        half = len(lines) // 2  # two shards, as the hub repository has for train
        pq.write_table(pa.table({"text": lines[:half]}), folder / f"{split}-00000-of-00002.parquet")
        pq.write_table(pa.table({"text": lines[half:]}), folder / f"{split}-00001-of-00002.parquet")


WIKI_ROWS = {
    "train": ["", " = Valkyria Chronicles III = \n", "", " Senjō no Valkyria 3 is a game . \n", " The game began . \n",
              "   \n"],
    "validation": ["", " = Homarus gammarus = \n"],
    "test": ["", " = Robert Boulter = \n", " Robert Boulter is an English actor . \n", ""],
}


def test_wikitext_from_local_parquet(tmp_path):
    _write_wikitext(tmp_path, WIKI_ROWS)
    for split, lines in WIKI_ROWS.items():
        got = text.load_text("wikitext-103", split=split, source="parquet", path=tmp_path)
        assert got == [line.strip() for line in lines if line.strip()]  # shards in order, blank rows dropped
    with pytest.raises(FileNotFoundError, match="train-"):
        text.load_text("wikitext-103", split="train", source="parquet", path=tmp_path / "elsewhere")


def test_wikitext_hub_call(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return datasets.Dataset.from_dict({"text": WIKI_ROWS["test"]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    got = text.load_text("wikitext-103", split="test")
    assert calls == [(("Salesforce/wikitext", "wikitext-103-raw-v1"), {"split": "test"})]
    assert got == ["= Robert Boulter =", "Robert Boulter is an English actor ."]


# ---------------------------------------------------------------- tokenizers


def test_char_tokenizer_roundtrip_and_cache(tmp_path):
    paragraphs = ["abc cab", "zzz!"]
    tok = text.text_tokenizer(paragraphs, "char", cache_dir=tmp_path)
    assert tok.vocab_size == 2 + len(set("abc z!"))
    ids = text.encode_text(tok, paragraphs)
    assert tok.decode(ids) == "abc cab\nzzz!\n"
    assert tok.encode("a?").tolist() == [tok.encode("a")[0], tok.unk_id]  # unseen character -> unknown
    files = list(tmp_path.iterdir())
    assert len(files) == 1
    again = text.text_tokenizer(paragraphs, "char", cache_dir=tmp_path)
    assert again.characters == tok.characters


def test_sentencepiece_trains_offline_and_is_cached(tmp_path, monkeypatch):
    train = text.load_text("austen", split="train")
    tok = text.text_tokenizer(train, "sentencepiece", vocab_size=500, cache_dir=tmp_path)
    assert tok.vocab_size == 500
    test = text.load_text("austen", split="test")
    for p in test[:20]:
        assert tok.decode(tok.encode(p)) == p  # plain ASCII prose survives the round trip
    ids = text.encode_text(tok, test)
    assert ids.dtype == np.int32 and ids.min() >= 0 and ids.max() < 500
    assert np.sum(ids == tok.eos_id) == len(test)
    # subwords: fewer tokens than characters
    assert len(ids) < 0.5 * sum(len(p) for p in test)
    # the second call loads the cached model instead of training
    monkeypatch.setattr(text.SentencePieceTokenizer, "train",
                        classmethod(lambda cls, *a: pytest.fail("trained again despite the cache")))
    cached = text.text_tokenizer(train, "sentencepiece", vocab_size=500, cache_dir=tmp_path)
    assert cached.encode(test[0]).tolist() == tok.encode(test[0]).tolist()
    # a corrupt cache file is rebuilt, not trusted
    monkeypatch.undo()
    (model,) = tmp_path.glob("sentencepiece-*.model")
    model.write_bytes(b"garbage")
    rebuilt = text.text_tokenizer(train, "sentencepiece", vocab_size=500, cache_dir=tmp_path)
    assert rebuilt.encode(test[0]).tolist() == tok.encode(test[0]).tolist()
    # another vocabulary size is another file
    text.text_tokenizer(train, "sentencepiece", vocab_size=300, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("sentencepiece-*.model"))) == 2


@pytest.mark.parametrize("args,kwargs,match", [
    (("abc",), {}, "paragraphs"),
    (([],), {}, "paragraphs"),
    ((["a", 1],), {}, "paragraphs"),
    ((["abc"], "bpe"), {}, "kind"),
    ((["abc"],), dict(vocab_size=8), "vocab_size"),
])
def test_tokenizer_bad_args(tmp_path, args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        text.text_tokenizer(*args, cache_dir=tmp_path, **kwargs)


def test_sentencepiece_too_large_vocabulary(tmp_path):
    with pytest.raises(ValueError, match="vocab_size"):
        text.text_tokenizer(["a tiny text"], "sentencepiece", vocab_size=5000, cache_dir=tmp_path)


# ---------------------------------------------------------------- language-model contexts


def test_lm_windows_and_batches():
    ids = np.arange(1000, dtype=np.int32)
    w = text.lm_windows(ids, 128)
    assert w.shape == (999 // 128, 129) and w.dtype == np.int32
    # inputs w[:, :-1], targets w[:, 1:]: the targets are the next tokens, each target once
    np.testing.assert_array_equal(w[:, 1:] - w[:, :-1], 1)
    np.testing.assert_array_equal(w[1:, 0], w[:-1, -1])
    targets = w[:, 1:].ravel()
    assert len(np.unique(targets)) == targets.size
    b = text.lm_batches(w, 2, jax.random.key(0))
    assert b.shape == (3, 2, 129)
    starts = b[:, :, 0].ravel()
    assert len(set(starts.tolist())) == 6 and set(starts.tolist()) <= set(w[:, 0].tolist())
    np.testing.assert_array_equal(b, text.lm_batches(w, 2, jax.random.key(0)))
    assert not np.array_equal(b, text.lm_batches(w, 2, jax.random.key(1)))
    assert text.LM_CONTEXT == 128  # 001 App. D


@pytest.mark.parametrize("call,match", [
    (lambda: text.lm_windows(np.arange(10), 0), "context"),
    (lambda: text.lm_windows(np.arange(10), 10), "ids"),
    (lambda: text.lm_windows(np.ones((4, 4), np.int32), 2), "ids"),
    (lambda: text.lm_windows(np.linspace(0, 1, 10), 2), "ids"),
    (lambda: text.lm_batches(np.zeros((3, 5), np.int32), 4, jax.random.key(0)), "batch_size"),
    (lambda: text.lm_batches(np.zeros((3, 5), np.int32), 1, 0), "key"),
    (lambda: text.lm_batches(np.zeros(5, np.int32), 1, jax.random.key(0)), "windows"),
])
def test_lm_bad_args(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_copy_memory_in_float_free_pipeline():
    # one-hot inputs of the copy task, as the models take them
    x, _ = text.copy_memory(jax.random.key(0), batch_size=2, delay=3)
    onehot = jax.nn.one_hot(x, text.COPY_VOCAB)
    assert onehot.shape == (2, 23, 10) and bool(jnp.all(onehot.sum(-1) == 1))
