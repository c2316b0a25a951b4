"""Tests for rivet_jax.encoders: the hashing encoder, the store, make_encoder.

Expected hashing vectors are rebuilt here from the documented rule with
hashlib directly, not by calling the encoder's own helpers.
"""

from __future__ import annotations

import collections
import hashlib
import math
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from rivet_jax.encoders import EmbeddingStore, Encoder, HashingEncoder, make_encoder
from rivet_jax.encoders import store as store_module

REPO_ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- helpers


def expected_hashing_vector(feature_counts: dict[str, int], dim: int) -> np.ndarray:
    """(dim,) vector by the documented rule: blake2b-8 little-endian, bucket = h % dim,
    sign from the top bit, weight 1 + ln(count), then L2 norm."""
    vector = np.zeros(dim)
    for feature, count in feature_counts.items():
        h = int.from_bytes(hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest(), "little")
        sign = -1.0 if h >= 2**63 else 1.0
        vector[h % dim] += sign * (1.0 + math.log(count))
    return vector / np.linalg.norm(vector)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


class CountingEncoder:
    """A fake encoder recording every text it is asked to encode."""

    name = "counting"

    def __init__(self, dim: int = 4, version: str = "v1"):
        self.dim = dim
        self.fingerprint = f"counting-{version}:dim={dim}"
        self.calls: list[list[str]] = []

    @property
    def encoded_texts(self) -> list[str]:
        return [text for call in self.calls for text in call]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        # A deterministic vector per text, distinct across texts and versions.
        seeds = [int(hashlib.sha256(f"{self.fingerprint}|{t}".encode()).hexdigest()[:8], 16) for t in texts]
        vectors = np.zeros((len(texts), self.dim))  # (N, dim)
        for row, seed in enumerate(seeds):
            vectors[row] = np.random.default_rng(seed).normal(size=self.dim)
        return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)

    def count_tokens(self, text: str) -> int:
        return len(text.split())


class BrokenEncoder(CountingEncoder):
    """Returns whatever `make_output(n, dim)` gives, to test the store's checks."""

    name = "broken"

    def __init__(self, make_output):
        super().__init__()
        self.make_output = make_output

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return self.make_output(len(texts), self.dim)


# ---------------------------------------------------------------- hashing encoder


def test_tokenize_and_count_tokens_follow_documented_regex():
    encoder = HashingEncoder(dim=16)
    assert encoder.tokenize("Hello, World!  it's") == ["hello", ",", "world", "!", "it", "'", "s"]
    assert encoder.count_tokens("Hello, World!  it's") == 7
    assert encoder.count_tokens("") == 0
    assert HashingEncoder(dim=16, lowercase=False).tokenize("Hi there") == ["Hi", "there"]


def test_exact_vector_for_tiny_input_matches_hand_computation():
    encoder = HashingEncoder(dim=16)
    # "a a b": unigrams a x2, b x1; bigrams "a a" x1, "a b" x1.
    expected = expected_hashing_vector({"a": 2, "b": 1, "a a": 1, "a b": 1}, dim=16)
    np.testing.assert_allclose(encoder.encode(["a a b"])[0], expected, rtol=1e-6, atol=1e-7)
    # Lowercasing and punctuation tokens: "A a, B" -> a, a, ",", b.
    expected = expected_hashing_vector({"a": 2, ",": 1, "b": 1, "a a": 1, "a ,": 1, ", b": 1}, dim=16)
    np.testing.assert_allclose(encoder.encode(["A a, B"])[0], expected, rtol=1e-6, atol=1e-7)


def test_unigram_only_range_drops_bigrams():
    encoder = HashingEncoder(dim=32, ngram_range=(1, 1))
    expected = expected_hashing_vector({"x": 3, "y": 1}, dim=32)
    np.testing.assert_allclose(encoder.encode(["x y x x"])[0], expected, rtol=1e-6, atol=1e-7)


def test_deterministic_across_processes_bit_for_bit():
    texts = ["The quick brown fox.", "jumps over the lazy dog", "états-unis, naïve café!", ""]
    in_process = HashingEncoder(dim=256).encode(texts)
    script = (
        "import sys; from rivet_jax.encoders import HashingEncoder; "
        f"sys.stdout.write(HashingEncoder(dim=256).encode({texts!r}).tobytes().hex())"
    )
    # A fixed, different hash seed: Python's hash() would change the result.
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert bytes.fromhex(result.stdout) == in_process.tobytes()


def test_shape_dtype_and_unit_norm():
    encoder = HashingEncoder(dim=128)
    vectors = encoder.encode(["one text", "another, longer text with more words", "x"])
    assert vectors.shape == (3, 128) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)
    assert encoder.encode([]).shape == (0, 128)


def test_empty_and_whitespace_texts_give_zero_vectors():
    vectors = HashingEncoder(dim=64).encode(["", "   \n\t", "word"])
    assert not vectors[:2].any()
    assert np.isfinite(vectors).all()


def test_similar_texts_are_closer_than_unrelated_ones():
    encoder = HashingEncoder(dim=1024)
    base, similar, unrelated = encoder.encode(
        [
            "solve the integral of x squared from zero to one",
            "compute the integral of x squared from zero to two",
            "write a haiku about autumn leaves in the rain",
        ]
    )
    assert cosine(base, similar) > 0.5 > cosine(base, unrelated)


def test_encoder_refuses_a_bare_string():
    with pytest.raises(TypeError):
        HashingEncoder().encode("not a list")


def test_fingerprint_tracks_every_setting():
    fingerprints = {
        HashingEncoder().fingerprint,
        HashingEncoder(dim=512).fingerprint,
        HashingEncoder(ngram_range=(1, 1)).fingerprint,
        HashingEncoder(lowercase=False).fingerprint,
    }
    assert len(fingerprints) == 4
    assert HashingEncoder().fingerprint == HashingEncoder().fingerprint
    assert HashingEncoder().fingerprint.startswith("hashing-v1:dim=1024:ngrams=1-2:lower=1:re=")


def test_hashing_encoder_satisfies_protocol():
    assert isinstance(HashingEncoder(), Encoder)


@pytest.mark.parametrize("kwargs", [dict(dim=0), dict(ngram_range=(2, 1)), dict(ngram_range=(0, 2))])
def test_bad_hashing_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        HashingEncoder(**kwargs)


# ---------------------------------------------------------------- make_encoder


def test_make_encoder_from_dict_and_configdict():
    encoder = make_encoder({"name": "hashing", "dim": 64})
    assert isinstance(encoder, HashingEncoder) and encoder.dim == 64
    ml_collections = pytest.importorskip("ml_collections")
    encoder = make_encoder(ml_collections.ConfigDict({"name": "hashing", "dim": 32, "ngram_range": (1, 1)}))
    assert encoder.dim == 32 and encoder.ngram_range == (1, 1)


def test_make_encoder_unknown_name_lists_known_ones():
    with pytest.raises(ValueError, match="hashing"):
        make_encoder({"name": "word2vec"})


# ---------------------------------------------------------------- store


def test_store_encodes_each_distinct_text_once():
    encoder = CountingEncoder()
    store = EmbeddingStore(encoder)
    first = store.embed(["a", "b", "a", "c", "b"])
    second = store.embed(["c", "d", "a", "d"])
    assert encoder.calls == [["a", "b", "c"], ["d"]]  # misses only, one call each
    np.testing.assert_array_equal(first[0], first[2])
    np.testing.assert_array_equal(first[3], second[0])
    np.testing.assert_array_equal(second, encoder.encode(["c", "d", "a", "d"]))
    assert store.stats == dict(requested=9, distinct=6, memory_hits=2, disk_hits=0, encoded=4)


def test_embed_table_gives_distinct_rows_in_first_occurrence_order():
    store = EmbeddingStore(CountingEncoder())
    texts = ["x", "y", "x", "z", "y", "x"]
    table, index = store.embed_table(texts)
    assert table.shape == (3, 4) and table.dtype == np.float32
    assert index.dtype == np.int32
    np.testing.assert_array_equal(index, [0, 1, 0, 2, 1, 0])
    np.testing.assert_array_equal(table[index], store.embed(texts))
    np.testing.assert_array_equal(table, CountingEncoder().encode(["x", "y", "z"]))


def test_empty_request_gives_empty_arrays():
    encoder = CountingEncoder()
    table, index = EmbeddingStore(encoder).embed_table([])
    assert table.shape == (0, 4) and index.shape == (0,) and index.dtype == np.int32
    assert encoder.calls == []


def test_disk_cache_is_reused_by_a_new_store(tmp_path):
    texts = ["alpha", "beta", "alpha", "gamma"]
    first = EmbeddingStore(CountingEncoder(), tmp_path).embed(texts)
    encoder = CountingEncoder()
    store = EmbeddingStore(encoder, tmp_path)
    second = store.embed(texts)
    assert encoder.calls == []
    np.testing.assert_array_equal(first, second)
    assert store.stats == dict(requested=4, distinct=3, memory_hits=0, disk_hits=3, encoded=0)
    store.embed(["alpha", "delta"])
    assert encoder.calls == [["delta"]]
    assert store.stats["memory_hits"] == 1


def test_cache_layout_uses_fingerprint_dir_and_plain_npz(tmp_path):
    encoder = CountingEncoder()
    store = EmbeddingStore(encoder, tmp_path)
    store.embed(["hello"])
    cache_path = tmp_path / hashlib.sha256(encoder.fingerprint.encode()).hexdigest()[:16]
    assert store.cache_path == cache_path
    assert (cache_path / "fingerprint.txt").read_text().strip() == encoder.fingerprint
    (shard,) = cache_path.glob("shard-*.npz")
    with np.load(shard, allow_pickle=False) as data:
        assert data["keys"].dtype == np.dtype("S64")
        assert data["keys"][0].decode() == hashlib.sha256(b"hello").hexdigest()
        np.testing.assert_array_equal(data["vectors"], encoder.encode(["hello"]))


def test_fingerprint_mismatch_is_refused(tmp_path):
    store = EmbeddingStore(CountingEncoder(), tmp_path)
    store.embed(["a"])
    (store.cache_path / "fingerprint.txt").write_text("something-else\n")
    with pytest.raises(ValueError, match="fingerprint"):
        EmbeddingStore(CountingEncoder(), tmp_path)


def test_different_fingerprint_does_not_see_other_vectors(tmp_path):
    EmbeddingStore(CountingEncoder(version="v1"), tmp_path).embed(["a", "b"])
    other_encoder = CountingEncoder(version="v2")
    other = EmbeddingStore(other_encoder, tmp_path)
    vectors = other.embed(["a", "b"])
    assert other_encoder.calls == [["a", "b"]]
    np.testing.assert_array_equal(vectors, other_encoder.encode(["a", "b"]))
    assert len(list(tmp_path.iterdir())) == 2


def test_leftover_partial_tmp_file_does_not_break_loading(tmp_path):
    first = EmbeddingStore(CountingEncoder(), tmp_path)
    expected = first.embed(["a", "b"])
    # What a run killed mid-write leaves behind: a truncated hidden tmp file.
    (first.cache_path / ".shard-000001-deadbeef.npz.0123abcd.tmp").write_bytes(b"PK\x03\x04 truncated")
    encoder = CountingEncoder()
    np.testing.assert_array_equal(EmbeddingStore(encoder, tmp_path).embed(["a", "b"]), expected)
    assert encoder.calls == []


def test_failed_shard_write_leaves_no_shard_and_no_tmp(tmp_path, monkeypatch):
    def failing_replace(src, dst):
        raise OSError("disk full")

    store = EmbeddingStore(CountingEncoder(), tmp_path)
    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError):
        store.embed(["a"])
    monkeypatch.undo()
    assert sorted(p.name for p in store.cache_path.iterdir()) == ["fingerprint.txt"]
    encoder = CountingEncoder()
    EmbeddingStore(encoder, tmp_path).embed(["a"])
    assert encoder.calls == [["a"]]


def test_store_encodes_many_misses_a_bounded_number_at_a_time(monkeypatch, tmp_path):
    """An encoder's working memory grows with its input: misses go to it ENCODED_PER_CALL texts at a time, with the
    vectors (and the one shard written) those of one call on all of them."""
    monkeypatch.setattr(store_module, "ENCODED_PER_CALL", 3)
    encoder = CountingEncoder()
    texts = [f"text {i}" for i in range(8)]
    vectors = EmbeddingStore(encoder, tmp_path).embed(texts)
    assert [len(call) for call in encoder.calls] == [3, 3, 2] and encoder.encoded_texts == texts
    np.testing.assert_array_equal(vectors, CountingEncoder().encode(texts))
    assert len(list(tmp_path.rglob(store_module.SHARD_GLOB))) == 1


def test_store_reports_progress_only_where_it_takes_several_calls(monkeypatch, tmp_path):
    """A long embedding (the 49-model pool's: 46 s) logs progress lines; one call's worth logs none."""
    monkeypatch.setattr(store_module, "ENCODED_PER_CALL", 3)
    lines, progress = [], store_module.Progress
    monkeypatch.setattr(store_module, "Progress", lambda what, total: progress(
        what, total, every_s=0.0, log=lambda fmt, *args: lines.append(fmt % args)))
    store = EmbeddingStore(CountingEncoder(), tmp_path)
    store.embed(["a", "b", "c"])
    assert lines == []
    store.embed([f"text {i}" for i in range(8)])
    assert [line.split(",")[0] for line in lines] == ["embedding 8 texts: 3/8 done", "embedding 8 texts: 6/8 done",
                                                      "embedding 8 texts: 8/8 done"]


def test_store_with_hashing_encoder_matches_direct_encoding(tmp_path):
    encoder = HashingEncoder(dim=64)
    texts = ["state: turn 1", "state: turn 2", "state: turn 1"]
    np.testing.assert_array_equal(EmbeddingStore(encoder, tmp_path).embed(texts), encoder.encode(texts))
    reopened = EmbeddingStore(HashingEncoder(dim=64), tmp_path)
    np.testing.assert_array_equal(reopened.embed(texts), encoder.encode(texts))
    assert reopened.stats["encoded"] == 0


@pytest.mark.parametrize(
    "make_output, message",
    [
        (lambda n, dim: np.zeros((n, dim + 1), np.float32), "shape"),
        (lambda n, dim: np.zeros((n, dim), np.float64), "float32"),
        (lambda n, dim: np.full((n, dim), np.nan, np.float32), "non-finite"),
        (lambda n, dim: [[0.0] * dim] * n, "numpy array"),
    ],
)
def test_bad_encoder_output_is_refused_naming_the_encoder(make_output, message, tmp_path):
    store = EmbeddingStore(BrokenEncoder(make_output), tmp_path)
    with pytest.raises(ValueError, match=message) as error:
        store.embed(["a", "b"])
    assert "'broken'" in str(error.value)
    assert not list(store.cache_path.glob("shard-*.npz"))  # nothing bad reached the disk


def test_encoding_a_state_by_its_blocks_is_bit_for_bit_encoding_its_text():
    """encode_blocks reuses each block's cached tokens; the vectors must be the joined text's exactly, Greek final
    sigma at block edges, punctuation against the separator and empty blocks included."""
    from rivet_jax.data.serialize import BLOCK_SEPARATOR, state_blocks
    from rivet_jax.encoders.base import encode_states
    from rivet_jax.data.schema import Turn

    rng = np.random.default_rng(0)
    alphabet = list("abcΣσς ΟΔΟΣ.,!?-_0123 \t\n") + ["ΟΔΟΣ", "x\n", "\n", "Straße", "İ"]
    encoder = HashingEncoder(dim=256, ngram_range=(1, 3))
    states = [["".join(rng.choice(alphabet, size=rng.integers(0, 12))) for _ in range(rng.integers(1, 6))]
              for _ in range(300)]
    states += [["ΟΔΟΣ", "ΣΑ", ""], ["end.", "!start"], ["", ""]]
    joined = encoder.encode([BLOCK_SEPARATOR.join(blocks) for blocks in states])
    np.testing.assert_array_equal(encode_states(encoder, states), joined)
    np.testing.assert_array_equal(encode_states(encoder, states), joined)      # again, from the cache
    # and a conversation's states, as the router builds them
    turns = [Turn("m", f"response {k} ΟΔΟΣ", f"feedback {k}!", 1, 1, 0.0) for k in range(6)]
    blocks = [state_blocks("Task ΣΑΣ", turns[:t], encoder.count_tokens, 40) for t in range(7)]
    np.testing.assert_array_equal(encode_states(encoder, blocks),
                                  encoder.encode([BLOCK_SEPARATOR.join(b) for b in blocks]))


def reference_hashing_vectors(texts: list[str], dim: int, ngram_range: tuple[int, int]) -> np.ndarray:
    """The module docstring's rule computed the plain way, as the encoder did before it counted features as ids:
    the n-gram strings in a Counter, each feature's sign * (1 + ln count) added into its bucket in the order the
    features first occur (float64), rows normalised, then cast to float32."""
    from rivet_jax.encoders.base import l2_normalise_rows
    from rivet_jax.encoders.hashing import TOKEN_PATTERN

    low, high = ngram_range
    rows = np.zeros((len(texts), dim))
    for row, text in enumerate(texts):
        tokens = re.findall(TOKEN_PATTERN, text.lower())
        counts = collections.Counter(" ".join(tokens[i:i + n]) for n in range(low, high + 1)
                                     for i in range(len(tokens) - n + 1))
        hashes = [int.from_bytes(hashlib.blake2b(f.encode("utf-8"), digest_size=8).digest(), "little")
                  for f in counts]
        buckets = np.array([h % dim for h in hashes], np.int64)
        signs = np.array([-1.0 if h >> 63 else 1.0 for h in hashes])
        weights = signs * (1.0 + np.log(np.array(list(counts.values()), np.float64)))
        rows[row] = np.bincount(buckets, weights=weights, minlength=dim) if counts else 0.0
    return l2_normalise_rows(rows).astype(np.float32)


@pytest.mark.parametrize("ngram_range", [(1, 2), (1, 1), (1, 3), (2, 3)])
def test_vectors_are_bit_for_bit_the_rule_counted_as_strings(ngram_range, monkeypatch):
    """Counting features as ids (and making each block's once, and counting texts together) changes no bit of any
    vector: texts whose blocks repeat, n-grams across blocks, single-token and empty blocks, Greek final sigma, and
    a vocabulary that starts afresh midway (its cached blocks forgotten with it) while texts are counted a few
    features at a time."""
    from rivet_jax.data.serialize import BLOCK_SEPARATOR
    from rivet_jax.encoders import hashing

    rng = np.random.default_rng(1)
    words = ["a", "b", "Σ", "ΟΔΟΣ", "x.", ",", "the", "Straße", "İ", "7", "q!", "", "\n", "  "]
    blocks = ["".join(rng.choice(words, size=rng.integers(0, 8))) for _ in range(40)] + ["", "solo", "ΣΑ"]
    texts = [BLOCK_SEPARATOR.join(rng.choice(blocks, size=rng.integers(1, 6))) for _ in range(300)]
    texts += ["", "one", "a\n\n\nb", "end.\n\n!start", "a a a a b a a"]
    expected = reference_hashing_vectors(texts, 5, ngram_range)   # 5 buckets: each sums many features
    monkeypatch.setattr(hashing, "_SHARED", {})
    encoder = HashingEncoder(dim=5, ngram_range=ngram_range)
    np.testing.assert_array_equal(encoder.encode(texts), expected)
    np.testing.assert_array_equal(encoder.encode(texts[::-1]), expected[::-1])   # every block cached now
    monkeypatch.setattr(hashing, "MAX_MEMO_ENTRIES", 30)
    monkeypatch.setattr(hashing, "COUNTED_TOGETHER", 50)
    monkeypatch.setattr(hashing, "_STATE_VECTORS", hashing._StateVectors())
    another = HashingEncoder(dim=5, ngram_range=ngram_range)   # the first one's vocabulary and blocks
    np.testing.assert_array_equal(another.encode_blocks([t.split(BLOCK_SEPARATOR) for t in texts]), expected)
    assert len(another._shared.vocabulary) < 200   # started afresh on the way


@pytest.mark.parametrize("size, high", [(0, 1), (1, 1), (7, 2), (500, 40), (5000, 10**12)])
def test_distinct_values_come_in_the_order_first_met_with_their_counts(size, high):
    """What np.unique (stable sort, first indices) reordered by first index gives; by hand on a small case."""
    from rivet_jax.encoders.hashing import distinct_in_order_met

    distinct, counts = distinct_in_order_met(np.array([5, 3, 5, 9, 3, 5], np.int64))
    assert distinct.tolist() == [5, 3, 9] and counts.tolist() == [3, 2, 1]
    values = np.random.default_rng(size).integers(0, high, size).astype(np.int64)
    expected, first, expected_counts = np.unique(values, return_index=True, return_counts=True)
    distinct, counts = distinct_in_order_met(values)
    np.testing.assert_array_equal(distinct, expected[np.argsort(first)])
    np.testing.assert_array_equal(counts, expected_counts[np.argsort(first)])


def test_the_block_token_cache_is_bounded(monkeypatch):
    from rivet_jax.encoders import hashing

    monkeypatch.setattr(hashing, "BLOCK_CACHE_TOKENS", 10)
    monkeypatch.setattr(hashing, "_SHARED", {})
    encoder = HashingEncoder(dim=16)
    for k in range(20):
        assert encoder.count_tokens(f"a b c {k}") == 4
    assert encoder._shared.cached_tokens <= 10 and len(encoder._shared.blocks) == 2
    assert encoder.count_tokens("one two three four five six seven eight nine ten eleven") == 11   # too big: uncached
    assert "one two three four five six seven eight nine ten eleven" not in encoder._shared.blocks


def test_encoders_of_one_fingerprint_share_their_blocks_and_vocabulary(monkeypatch):
    """A block one encoder tokenized is found by every other encoder of its fingerprint (a job builds one per
    router it loads), never by another fingerprint's; its vectors are those of an encoder that met nothing before."""
    from rivet_jax.encoders import hashing

    monkeypatch.setattr(hashing, "_SHARED", {})
    monkeypatch.setattr(hashing, "_STATE_VECTORS", hashing._StateVectors())
    first, second, other = HashingEncoder(dim=16), HashingEncoder(dim=16), HashingEncoder(dim=16, lowercase=False)
    texts = ["Task:\nadd 2 and 3", "the answer is 5", "The Answer"]
    alone = first.encode(texts)
    assert set(second._shared.blocks) == set(texts) and second._shared is first._shared
    assert other._shared is not first._shared and not other._shared.blocks
    monkeypatch.setattr(hashing, "_SHARED", {})   # an encoder that met nothing, the other texts first
    np.testing.assert_array_equal(HashingEncoder(dim=16).encode(texts[::-1])[::-1], alone)


def test_the_state_vector_cache_is_bounded_shared_and_never_shared_out(monkeypatch):
    """encode_blocks keeps recent states' vectors: a state asked again (in the same call, later, or by another
    encoder of the same fingerprint) gets the vector its text gets, the caller's array is its own (writing to it
    changes nothing cached), another fingerprint never reads them, and the cache holds at most STATE_CACHE_BYTES,
    least recently used dropped first."""
    from rivet_jax.data.serialize import BLOCK_SEPARATOR
    from rivet_jax.encoders import hashing

    monkeypatch.setattr(hashing, "STATE_CACHE_BYTES", 3 * 4 * 16)   # three vectors of dim 16
    monkeypatch.setattr(hashing, "_STATE_VECTORS", hashing._StateVectors())
    encoder = HashingEncoder(dim=16)
    states = [["task one", f"turn {k}"] for k in range(5)]
    expected = encoder.encode([BLOCK_SEPARATOR.join(s) for s in states])
    first = encoder.encode_blocks(states[:2] + states[:1])                      # a repeat within one call
    np.testing.assert_array_equal(first, expected[[0, 1, 0]])
    first[:] = 7.0                                                              # the caller's own array
    np.testing.assert_array_equal(HashingEncoder(dim=16).encode_blocks(states[:1]), expected[:1])
    other = HashingEncoder(dim=16, ngram_range=(1, 1))                          # another fingerprint
    np.testing.assert_array_equal(other.encode_blocks(states[:1]),
                                  other.encode([BLOCK_SEPARATOR.join(states[0])]))
    np.testing.assert_array_equal(encoder.encode_blocks(states), expected)
    cache = hashing._STATE_VECTORS
    assert cache.bytes == 3 * 4 * 16 and len(cache.rows) == 3                  # the three most recent
    np.testing.assert_array_equal(np.stack(list(cache.rows.values())), expected[2:])
    assert encoder.encode_blocks([]).shape == (0, 16)
