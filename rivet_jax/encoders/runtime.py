"""What the neural encoders (bert.py, qwen3.py) share: checkpoint files, param conversion, batching and devices.

Checkpoint files: a checkpoint directory holds `config.json`, `model.safetensors` (or a sharded
`model.safetensors.index.json`) and the tokenizer files. Weights are read with `safetensors.numpy` and tokenised with
transformers' tokenizer; torch is never needed. The content digest of the files that can change the vectors goes into
each encoder's fingerprint.

Param conversion: `convert_checkpoint` is the one pure safetensors-dict -> linen-params conversion, with key and shape
checks; an architecture supplies where each tensor goes (`KeySpec`s) and how its keys are named
(`CheckpointLayout`).

Batching: length buckets keep the number of compiled shapes small (texts sorted by token length, each batch padded
to one of a few lengths and a power-of-two row count, results put back in input order).

Devices: the weights are placed once (copied to every local device when there are several), and each jitted call
splits its batch's rows over the devices when they divide evenly (`call_jitted`); `JittedEncoder` holds the passes
over given token ids that both encoders expose through it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rivet_jax.encoders.base import l2_normalise_rows

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# Files whose content can change the vectors; hashed into the fingerprint when present.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json", "merges.txt",
)
ConfigT = TypeVar("ConfigT")


# ---------------------------------------------------------------- checkpoint files


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


def load_tokenizer(directory: Path) -> Any:
    """transformers' tokenizer from the checkpoint directory (imported here: transformers is slow to import)."""
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"no tokenizer files in {directory}: expected one of {list(TOKENIZER_FILES)}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


def load_params(
    directory: Path,
    files: Sequence[Path],
    convert: Callable[[dict[str, np.ndarray]], dict],
    config_files: Iterable[str],
) -> tuple[Any, str]:
    """(params on the local devices, sha256 checkpoint digest) for the weight `files` of a checkpoint directory.

    convert: the architecture's pure safetensors-dict -> linen-params conversion; the numpy tensors are dropped once
    converted. The digest covers the weights, the tokenizer files and the architecture's `config_files`.
    """
    params = place_params(convert(load_tensors(files)))
    names = [*TOKENIZER_FILES, *config_files, *(path.name for path in files)]
    return params, checkpoint_digest(directory, names)


# ---------------------------------------------------------------- config.json


def read_config(directory: Path, from_dict: Callable[[dict, str], ConfigT]) -> ConfigT:
    """The architecture config of a checkpoint: `from_dict` of its config.json object, given the file for errors."""
    path = directory / "config.json"
    return from_dict(read_json(path), str(path))


def check_model_type(config: Mapping[str, Any], model_type: str, reader: str, where: str) -> None:
    """Refuse a transformers config of another architecture than the `reader` class runs, naming the one it is."""
    found = config.get("model_type")
    if found != model_type:
        raise ValueError(
            f"{where}: unknown architecture model_type={found!r} "
            f"(architectures {config.get('architectures')}); {reader} reads model_type {model_type!r} only"
        )


@contextlib.contextmanager
def required_fields(where: str) -> Iterator[None]:
    """Turn the KeyError of a required config field read inside the block into a ValueError naming the file."""
    try:
        yield
    except KeyError as error:
        raise ValueError(f"{where}: missing field {error.args[0]!r}") from None


# ---------------------------------------------------------------- safetensors -> linen params


@dataclasses.dataclass(frozen=True)
class KeySpec:
    """Where one checkpoint tensor goes in the linen params, and the shape it must have in the checkpoint."""

    path: tuple[str, ...]
    shape: tuple[int, ...]
    transpose: bool = False  # a PyTorch Linear weight is (out, in); a linen Dense kernel is (in, out)


@dataclasses.dataclass(frozen=True)
class CheckpointLayout:
    """How an architecture names its checkpoint keys, apart from the KeySpecs that depend on its config.

    what: the architecture's name in errors.
    layer_prefix: layer i's keys are `{layer_prefix}{i}.{suffix}`.
    prefixes: optional key prefixes (e.g. "bert."); the first one the checkpoint's keys use is stripped.
    ignored: key prefixes or suffixes that are not part of the encoder (a pooler, an LM head, position_ids) and
        are dropped silently; any other unused key is an error, as is a missing key or a wrong shape.
    """

    what: str
    layer_prefix: str
    prefixes: tuple[str, ...]
    ignored: tuple[str, ...]


def _short_list(keys: Iterable[str], limit: int = 20) -> str:
    keys = sorted(keys)
    more = f" ... and {len(keys) - limit} more" if len(keys) > limit else ""
    return f"{len(keys)}: {keys[:limit]}{more}"


def convert_checkpoint(
    tensors: Mapping[str, np.ndarray],
    global_specs: Mapping[str, KeySpec],
    layer_specs: Mapping[str, KeySpec],
    num_layers: int,
    layout: CheckpointLayout,
    dtype: Any,
) -> dict:
    """The linen params pytree (numpy arrays of `dtype`) for a checkpoint's `tensors`. Pure: no I/O.

    global_specs: checkpoint key -> spec, for tensors outside the layers.
    layer_specs: key suffix -> spec, for each of the `num_layers` layers' `{layout.layer_prefix}{i}.{suffix}`;
        the N layers' tensors are stacked on a new leading axis under params["layers"] (the modules scan over the
        layers).
    """
    what, layer_prefix, prefixes, ignored = layout.what, layout.layer_prefix, layout.prefixes, layout.ignored
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


# ---------------------------------------------------------------- length-bucketed batches


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


# ---------------------------------------------------------------- devices


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


class JittedEncoder:
    """The passes over given token ids that BertEncoder and Qwen3Encoder share (no tokenizer, no bucketing).

    A subclass sets `params` (placed by place_params), `dtype`, `_pooled` (jitted (params, ids, mask) -> (B, D)
    float32 pooled states) and `_hidden` (the jitted model.apply).
    """

    params: Any
    dtype: Any
    _pooled: Callable[..., jax.Array]
    _hidden: Callable[..., jax.Array]

    def encode_ids(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """(B, dim) float32 L2-normalised embeddings of (B, L) token ids, as given (no bucketing); padded the way
        the encoder pads (right for BERT, left for Qwen3, whose ids should end with the end token)."""
        return l2_normalise_rows(np.asarray(self._forward(input_ids, attention_mask), dtype=np.float32))

    def hidden_states(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """(B, L, D) float32 last hidden states (Qwen3: final-normed) of (B, L) token ids; padded positions are
        meaningless."""
        hidden = call_jitted(self._hidden, {"params": self.params}, self.dtype, input_ids, attention_mask)
        return np.asarray(hidden, dtype=np.float32)

    def _forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> jax.Array:
        return call_jitted(self._pooled, self.params, self.dtype, input_ids, attention_mask)
