"""The static (WordLlama) encoder: hand-worked means on a hand-built table, and WordLlama's own inference as the
reference for the shipped table."""

import numpy as np
import pytest
from safetensors.numpy import save_file
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from rivet_jax.encoders import Encoder, EmbeddingStore, make_encoder
from rivet_jax.encoders import static
from rivet_jax.encoders.static import StaticEmbeddingEncoder

# Rows: [UNK], a, b, c. "c" is id 3; the tokenizer below also knows "d" = 4, one past the table (clipped to c).
TABLE = np.array([[0, 0, 0], [1, 0, 0], [0, 2, 0], [0, 0, 4]], dtype=np.float32)


@pytest.fixture
def hand_built(tmp_path):
    """(weights path, tokenizer path) of a 4-row, 3-column table and a whitespace word tokenizer."""
    tokenizer = Tokenizer(WordLevel({"[UNK]": 0, "a": 1, "b": 2, "c": 3, "d": 4}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    save_file({"embedding.weight": TABLE}, str(tmp_path / "table.safetensors"))
    return str(tmp_path / "table.safetensors"), str(tmp_path / "tokenizer.json")


def unit(vector):
    vector = np.asarray(vector, dtype=np.float64)
    return vector / np.linalg.norm(vector)


def test_the_mean_of_the_rows_normalised_worked_by_hand(hand_built):
    encoder = StaticEmbeddingEncoder(*hand_built)
    vectors = encoder.encode(["a", "a b", "a a b c", "zzz", "", "d"])
    assert isinstance(encoder, Encoder) and vectors.shape == (6, 3) and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors[0], [1, 0, 0])
    np.testing.assert_allclose(vectors[1], unit([0.5, 1, 0]), rtol=1e-6)       # (a + b) / 2
    np.testing.assert_allclose(vectors[2], unit([2 / 4, 2 / 4, 4 / 4]), rtol=1e-6)   # (2a + b + c) / 4
    np.testing.assert_array_equal(vectors[3], [0, 0, 0])   # unknown word -> the [UNK] row, zero here
    np.testing.assert_array_equal(vectors[4], [0, 0, 0])   # no token: the zero vector, not NaN
    np.testing.assert_allclose(vectors[5], [0, 0, 1])      # id 4 is past the table: clipped to the last row


def test_truncation_and_matryoshka_columns(hand_built):
    truncated = StaticEmbeddingEncoder(*hand_built, max_length=2)
    np.testing.assert_allclose(truncated.encode(["a b c"])[0], unit([0.5, 1, 0]), rtol=1e-6)   # c dropped
    narrow = StaticEmbeddingEncoder(*hand_built, dim=2)
    assert narrow.dim == 2
    np.testing.assert_allclose(narrow.encode(["a b c"])[0], unit([1 / 3, 2 / 3]), rtol=1e-6)
    assert truncated.count_tokens("a b c") == 3   # counts ignore the truncation
    whole = StaticEmbeddingEncoder(*hand_built)
    assert len({whole.fingerprint, truncated.fingerprint, narrow.fingerprint}) == 3


def test_texts_are_encoded_in_chunks_with_the_same_vectors(hand_built, monkeypatch):
    texts = ["a", "a b", "", "c c a", "b", "d a"]
    whole = StaticEmbeddingEncoder(*hand_built).encode(texts)
    monkeypatch.setattr(static, "CHUNK_TEXTS", 4)   # two chunks, the second shorter
    np.testing.assert_array_equal(StaticEmbeddingEncoder(*hand_built).encode(texts), whole)


def test_the_fingerprint_follows_the_table(hand_built, tmp_path):
    weights, tokenizer = hand_built
    before = StaticEmbeddingEncoder(weights, tokenizer).fingerprint
    save_file({"embedding.weight": TABLE * 2}, weights)
    doubled = StaticEmbeddingEncoder(weights, tokenizer).fingerprint
    other = Tokenizer(WordLevel({"[UNK]": 0, "b": 1, "a": 2, "c": 3}, unk_token="[UNK]"))   # a and b swapped
    other.pre_tokenizer = Whitespace()
    other.save(str(tmp_path / "other.json"))
    assert len({before, doubled, StaticEmbeddingEncoder(weights, str(tmp_path / "other.json")).fingerprint}) == 3


def test_bad_files_and_settings_are_refused_clearly(hand_built, tmp_path):
    weights, tokenizer = hand_built
    with pytest.raises(FileNotFoundError, match="weights file .*missing"):
        StaticEmbeddingEncoder(str(tmp_path / "missing.safetensors"), tokenizer)
    save_file({"other": TABLE}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="no tensor 'embedding.weight'"):
        StaticEmbeddingEncoder(str(tmp_path / "other.safetensors"), tokenizer)
    with pytest.raises(ValueError, match="dim must be between 1 and the table's 3"):
        StaticEmbeddingEncoder(weights, tokenizer, dim=4)
    with pytest.raises(TypeError, match="single str"):
        StaticEmbeddingEncoder(weights, tokenizer).encode("a b")


def test_it_caches_like_any_encoder(hand_built, tmp_path):
    first = EmbeddingStore(StaticEmbeddingEncoder(*hand_built), tmp_path / "cache").embed(["a b", "c"])
    again = EmbeddingStore(StaticEmbeddingEncoder(*hand_built), tmp_path / "cache")
    np.testing.assert_array_equal(again.embed(["a b", "c"]), first)
    assert len(again) == 2 and again.stats.get("encoded", 0) == 0, again.stats   # read back, not re-encoded


def test_wordllama_matches_its_own_inference():
    pytest.importorskip("wordllama", reason="the wordllama package is not installed (pip install wordllama)")
    from safetensors import safe_open
    from wordllama.inference import WordLlamaInference   # the package's numpy inference: the reference

    encoder = make_encoder({"name": "wordllama"})
    with safe_open(str(encoder.path), framework="np") as file:
        reference = WordLlamaInference(file.get_tensor("embedding.weight"), Tokenizer.from_file(
            str(encoder.tokenizer_path)))
    texts = ["hello world", "Route the next turn to the cheapest model that can still fix the failing test.",
             "def f(x):\n    return x ** 2  # ünïcödé 😀", "tool " * 3000, "Ok."]
    assert encoder.dim == 256 and encoder.name == "wordllama"
    np.testing.assert_allclose(encoder.encode(texts), reference.embed(texts, norm=True), atol=1e-6)
    narrow = make_encoder({"name": "wordllama", "truncate_dim": 64, "dim": 1024})   # `dim` is the hashing width
    np.testing.assert_allclose(narrow.encode(texts[:2]),
                               reference.embed(texts[:2])[:, :64] / np.linalg.norm(
                                   reference.embed(texts[:2])[:, :64], axis=1, keepdims=True), atol=1e-6)
    # Two texts about one thing are closer than two about different things (what hashing cannot see here: no
    # word is shared).
    a, b, c = encoder.encode(["the unit tests fail after the refactor", "pytest reports broken assertions",
                              "a recipe for tomato soup"])
    assert a @ b > a @ c
