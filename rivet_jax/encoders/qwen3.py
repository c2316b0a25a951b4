"""A frozen Qwen3-Embedding text encoder (a Qwen3 decoder with last-token pooling), in flax.linen.

    ids (B, L), left-padded -> token embeddings                                          (B, L, D)
        -> num_layers x [x + o_proj(attention(RMSNorm(x)))                               grouped-query attention:
                         x + down(silu(gate(RMSNorm(x))) * up(RMSNorm(x)))]              q/k RMSNorm over head_dim,
        -> final RMSNorm                                                                 then RoPE; causal + padding
        -> the last position's hidden state (the EOS token)                               (B, D)
        -> L2 normalisation

Left padding puts every text's last token at position L - 1, so pooling is one slice. Positions are 0..L-1 for
every row, padded or not, as in the reference: RoPE makes attention depend only on position differences, and the
padding keys are masked, so a text's vectors do not depend on how much padding precedes it.

Prefix reuse (on by default, `prefix_reuse=False` turns it off): texts whose token ids start with most of
another text's ids (the states of one episode: strict token prefixes, or all but a few tokens where the tokenizer
merged across the boundary) are encoded inside that text's pass: the shared tokens once, then each member's few
remaining tokens and its end token at the member's own positions, seeing only the shared tokens before them and
each other (`Qwen3Model.prefix_tree`; the layout and planning are in prefix_reuse.py). The vectors equal separate
passes up to float rounding (tests: 1e-4), so the option is not part of the fingerprint.

The checkpoint directory holds `config.json`, `model.safetensors` (or a sharded index) with Qwen3's key names
(with or without a `model.` prefix) and, for `encode`, the tokenizer files. Shared machinery (checkpoint files,
param conversion, bucketed batching, device calls) lives in runtime.py.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rivet_jax.encoders.base import as_text_list, l2_normalise_rows
from rivet_jax.encoders.prefix_reuse import pack_reuse_batch, plan_reuse_rows, scatter_members
from rivet_jax.encoders.runtime import (
    TOKENIZER_FILES,
    CheckpointLayout,
    JittedEncoder,
    KeySpec,
    bucket_lengths,
    call_jitted,
    check_model_type,
    convert_checkpoint,
    dispatch_batches,
    load_params,
    load_tokenizer,
    read_config,
    required_fields,
    resolve_dtype,
    run_batches,
    weight_files,
)

# Bump whenever the computation changes in a way that could move vectors: it is in the fingerprint.
QWEN3_VERSION = 1
# Qwen3-Embedding ends every input with this token and pools its hidden state.
END_OF_TEXT = "<|endoftext|>"
# The serialization budget (16,384 tokens, App. B.3) plus room for an instruction and the end token: a default
# state is never truncated (truncation would drop its newest turns, which are at the end).
DEFAULT_MAX_LENGTH = 16_384 + 512
# Files besides the weights and the tokenizer whose content can change the vectors (in the fingerprint).
QWEN3_CONFIG_FILES = ("config.json", "generation_config.json", "config_sentence_transformers.json")
# transformers' Qwen3Model keys, with or without a "model." prefix. An LM head (tied to embed_tokens in
# Qwen3-Embedding) and RoPE buffers are not encoder weights.
QWEN3_LAYOUT = CheckpointLayout(
    what="Qwen3", layer_prefix="layers.", prefixes=("model.",), ignored=("lm_head.", "rotary_emb.inv_freq")
)


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # need not be hidden_size / num_heads (Qwen3-Embedding-0.6B: 128, not 1024 / 16)
    intermediate_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool  # whether the q, k, v and o projections have biases

    @classmethod
    def from_dict(cls, config: Mapping[str, Any], where: str = "config.json") -> Qwen3Config:
        """Read a transformers Qwen3Config dict; refuse other architectures and variants this module lacks."""
        check_model_type(config, "qwen3", "Qwen3Encoder", where)
        # transformers 5 nests RoPE settings in rope_parameters; older configs have rope_theta / rope_scaling.
        rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"{where}: rope_type {rope_type!r} is not supported (only 'default')")
        sliding = config.get("use_sliding_window", False) or any(
            kind != "full_attention" for kind in config.get("layer_types") or ()
        )
        if sliding:
            raise ValueError(f"{where}: sliding-window attention layers are not supported")
        hidden_act = config.get("hidden_act", "silu")
        if hidden_act != "silu":
            raise ValueError(f"{where}: hidden_act {hidden_act!r} is not supported (only 'silu')")
        with required_fields(where):
            hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
            result = cls(
                vocab_size=int(config["vocab_size"]),
                hidden_size=hidden,
                num_layers=int(config["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                intermediate_size=int(config["intermediate_size"]),
                max_position_embeddings=int(config.get("max_position_embeddings", 32_768)),
                rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10_000.0))),
                attention_bias=bool(config.get("attention_bias", False)),
            )
        if result.num_heads % result.num_kv_heads:
            raise ValueError(f"{where}: {result.num_heads} query heads not divisible by {result.num_kv_heads} KV heads")
        return result


class RMSNorm(nn.Module):
    """x / rms(x) * weight, the statistics in float32 whatever the compute dtype (as transformers does)."""

    eps: float  # rms_norm_eps, added to the mean square
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):  # (..., F) -> (..., F)
        weight = self.param("weight", nn.initializers.ones, (x.shape[-1],), self.dtype)
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
        return weight * normed.astype(self.dtype)


def rope_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """float32 cos and sin of shape positions.shape + (Dh,), in transformers' half-split (rotate_half) layout.

    positions: (L,) shared by every row, or (B, L) per row (prefix reuse places end tokens at their own positions).
    """
    inv_freq = 1.0 / theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)  # (Dh/2,)
    angles = jnp.asarray(positions, jnp.float32)[..., None] * inv_freq  # (..., L, Dh/2)
    angles = jnp.concatenate([angles, angles], axis=-1)  # (..., L, Dh)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x, cos, sin):  # (B, L, N, Dh), (L, Dh) or (B, L, Dh) x 2 -> (B, L, N, Dh)
    first, second = jnp.split(x, 2, axis=-1)
    rotated = jnp.concatenate([-second, first], axis=-1)
    # A head axis before Dh; a missing batch axis broadcasts.
    cos, sin = cos[..., None, :].astype(x.dtype), sin[..., None, :].astype(x.dtype)
    return x * cos + rotated * sin


class Qwen3Layer(nn.Module):
    """One pre-norm decoder layer; scanned over the layers, so it maps carry -> (carry, None)."""

    config: Qwen3Config
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, hidden, mask, cos, sin):  # (B, L, D), (B, 1, L, L) bool, (B?, L, Dh) x 2 -> ((B, L, D), None)
        config = self.config
        batch, length, _ = hidden.shape
        dense = functools.partial(nn.Dense, dtype=self.dtype, param_dtype=self.dtype)
        norm = functools.partial(RMSNorm, config.rms_norm_eps, self.dtype)
        projection = functools.partial(dense, use_bias=config.attention_bias)

        x = norm(name="input_layernorm")(hidden)
        query = projection(config.num_heads * config.head_dim, name="q_proj")(x)
        key = projection(config.num_kv_heads * config.head_dim, name="k_proj")(x)
        value = projection(config.num_kv_heads * config.head_dim, name="v_proj")(x)
        query = query.reshape(batch, length, config.num_heads, config.head_dim)  # (B, L, N, Dh)
        key = key.reshape(batch, length, config.num_kv_heads, config.head_dim)  # (B, L, K, Dh)
        value = value.reshape(batch, length, config.num_kv_heads, config.head_dim)
        # Qwen3 normalises each head's queries and keys before rotating them.
        query = apply_rope(norm(name="q_norm")(query), cos, sin)
        key = apply_rope(norm(name="k_norm")(key), cos, sin)
        # Grouped-query attention: each of the K key/value heads serves N / K query heads. Softmax is float32
        # inside, and masked logits are large but finite, so the all-padding query rows of left-padded texts
        # give finite (ignored) values instead of NaNs that would leak through later layers.
        context = jax.nn.dot_product_attention(query, key, value, mask=mask)  # (B, L, N, Dh)
        context = context.reshape(batch, length, config.num_heads * config.head_dim)
        hidden = hidden + projection(config.hidden_size, name="o_proj")(context)

        x = norm(name="post_attention_layernorm")(hidden)
        gate = dense(config.intermediate_size, use_bias=False, name="gate_proj")(x)
        up = dense(config.intermediate_size, use_bias=False, name="up_proj")(x)
        hidden = hidden + dense(config.hidden_size, use_bias=False, name="down_proj")(jax.nn.silu(gate) * up)
        return hidden, None


class Qwen3Model(nn.Module):
    """Qwen3's decoder stack: token ids -> final-normed last hidden states, under one of two masks.

    __call__: the plain causal pass with a padding mask, positions 0..L-1 for every row.
    prefix_tree: the prefix-reuse pass, each slot at its own RoPE position under a prefix-tree mask.
    Both run the same submodules (hence setup, not compact), so they share one params tree.
    """

    config: Qwen3Config
    dtype: Any = jnp.float32

    def setup(self):
        config = self.config
        self.embed_tokens = nn.Embed(config.vocab_size, config.hidden_size, dtype=self.dtype, param_dtype=self.dtype)
        self.layers = nn.scan(
            Qwen3Layer,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            in_axes=(nn.broadcast, nn.broadcast, nn.broadcast),
            length=config.num_layers,
        )(config, self.dtype)
        self.norm = RMSNorm(config.rms_norm_eps, self.dtype)

    def __call__(self, input_ids, attention_mask):  # (B, L) int, (B, L) {0, 1} -> (B, L, D)
        length = input_ids.shape[1]
        causal = jnp.tril(jnp.ones((length, length), dtype=bool))  # (L, L)
        mask = causal[None, None] & attention_mask.astype(bool)[:, None, None, :]  # (B, 1, L, L)
        return self._stack(input_ids, mask, jnp.arange(length))

    def prefix_tree(self, input_ids, positions, segments, starts):  # (B, L) int x 4 -> (B, L, D)
        """Slot s sits at RoPE position positions[s] and sees slot j iff j < starts[s], or j <= s and
        segments[j] == segments[s].

        With the layout of prefix_reuse.pack_reuse_rows (the shared prefix as segment 0 from slot 0 with start 0,
        then each branch's tail as its own segment, its start the number of prefix slots it shares, then padding
        as segment -1) that is causal attention over the prefix, the shared prefix plus its own earlier tokens for
        each tail token, and causal attention among padding slots only; every slot sees itself, so no row is
        all-masked.
        """
        slots = jnp.arange(input_ids.shape[1])  # (L,)
        shared = slots[None, None, :] < starts[:, :, None]  # (B, L, L): query slot, key slot
        own = (segments[:, :, None] == segments[:, None, :]) & (slots[None, :, None] >= slots[None, None, :])
        return self._stack(input_ids, (shared | own)[:, None], positions)  # mask (B, 1, L, L)

    def _stack(self, input_ids, mask, positions):  # (B, L), (B, 1, L, L) bool, (L,) or (B, L) -> (B, L, D)
        cos, sin = rope_tables(positions, self.config.head_dim, self.config.rope_theta)
        hidden, _ = self.layers(self.embed_tokens(input_ids), mask, cos, sin)  # (B, L, D)
        return self.norm(hidden)


def qwen3_key_specs(config: Qwen3Config) -> tuple[dict[str, KeySpec], dict[str, KeySpec]]:
    """(global, per-layer) checkpoint key -> KeySpec for a transformers Qwen3Model state dict."""
    width, inner, head_dim = config.hidden_size, config.intermediate_size, config.head_dim
    q_width, kv_width = config.num_heads * head_dim, config.num_kv_heads * head_dim

    def linear(name: str, out_dim: int, in_dim: int, bias: bool = False) -> dict[str, KeySpec]:
        specs = {f"{name}.weight": KeySpec((name.rsplit(".", 1)[-1], "kernel"), (out_dim, in_dim), transpose=True)}
        if bias:
            specs[f"{name}.bias"] = KeySpec((name.rsplit(".", 1)[-1], "bias"), (out_dim,))
        return specs

    def rms_norm(name: str, size: int) -> dict[str, KeySpec]:
        return {f"{name}.weight": KeySpec((name.rsplit(".", 1)[-1], "weight"), (size,))}

    bias = config.attention_bias
    global_specs = {
        "embed_tokens.weight": KeySpec(("embed_tokens", "embedding"), (config.vocab_size, width)),
        **rms_norm("norm", width),
    }
    layer_specs = {
        **rms_norm("input_layernorm", width),
        **linear("self_attn.q_proj", q_width, width, bias),
        **linear("self_attn.k_proj", kv_width, width, bias),
        **linear("self_attn.v_proj", kv_width, width, bias),
        **linear("self_attn.o_proj", width, q_width, bias),
        **rms_norm("self_attn.q_norm", head_dim),
        **rms_norm("self_attn.k_norm", head_dim),
        **rms_norm("post_attention_layernorm", width),
        **linear("mlp.gate_proj", inner, width),
        **linear("mlp.up_proj", inner, width),
        **linear("mlp.down_proj", width, inner),
    }
    return global_specs, layer_specs


def qwen3_params_from_tensors(tensors: Mapping[str, np.ndarray], config: Qwen3Config, dtype: Any = np.float32) -> dict:
    """Qwen3Model's linen params from a safetensors dict (with or without a 'model.' prefix). Pure."""
    return convert_checkpoint(tensors, *qwen3_key_specs(config), config.num_layers, QWEN3_LAYOUT, dtype)


def last_token_pool(hidden: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """(B, D) float32 hidden state of each row's last real token of (B, L, D) `hidden`.

    With left padding (what encode builds) that is position L - 1; the gather also serves right-padded rows.
    """
    length = attention_mask.shape[1]
    last = length - 1 - jnp.argmax(attention_mask[:, ::-1], axis=1)  # (B,) index of the last 1
    return jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0].astype(jnp.float32)


class Qwen3Encoder(JittedEncoder):
    """A frozen Qwen3-Embedding encoder: last-token pooling over a left-padded Qwen3 decoder, L2-normalised.

    encode(texts) strips each text, prefixes `Instruct: {instruction}\\nQuery:` when an instruction is given
    (Qwen3-Embedding's query format; documents are encoded without one), tokenises, truncates to
    max_length - 1 tokens and ends every text with <|endoftext|> (appended unless the tokenizer already does),
    then runs length-bucketed jit-compiled batches: with prefix_reuse (the default) one prefix-tree row per group
    of texts sharing a host text's leading ids (see the module docstring), else one left-padded row per text.
    encode_token_ids (what encode runs after tokenising), encode_ids and hidden_states (JittedEncoder; left-padded)
    take token ids directly, which is all a checkpoint without tokenizer files supports. count_tokens counts the
    text's tokens alone (no instruction, no end token, no truncation). dtype="bfloat16" keeps params and
    activations in bf16 (norm statistics, softmax, pooling and the output in float32).
    """

    name = "qwen3"

    def __init__(
        self,
        path: str,
        batch_size: int = 16,
        dtype: str = "float32",
        max_length: int = DEFAULT_MAX_LENGTH,
        instruction: str | None = None,
        max_batch_tokens: int = 16_384,
        prefix_reuse: bool = True,
    ):
        if batch_size < 1 or max_batch_tokens < 1 or max_length < 2:
            raise ValueError(
                f"batch_size and max_batch_tokens must be positive and max_length >= 2, "
                f"got {batch_size}, {max_batch_tokens}, {max_length}"
            )
        if path is None:
            raise ValueError("Qwen3Encoder needs path=<checkpoint directory> (e.g. a Qwen3-Embedding-0.6B download)")
        directory = Path(path)
        if not directory.is_dir():
            raise FileNotFoundError(f"Qwen3 checkpoint directory {directory} does not exist")
        self.path = directory
        self.batch_size = int(batch_size)
        self.max_batch_tokens = int(max_batch_tokens)
        self.dtype_name = dtype
        self.dtype = resolve_dtype(dtype)
        self.instruction = instruction
        self.prefix_reuse = bool(prefix_reuse)

        self.config = read_config(directory, Qwen3Config.from_dict)
        self.dim = self.config.hidden_size
        self.max_length = min(int(max_length), self.config.max_position_embeddings)
        files = weight_files(directory)
        has_tokenizer = any((directory / name).is_file() for name in TOKENIZER_FILES)
        self.tokenizer = load_tokenizer(directory) if has_tokenizer else None
        self._end_id, self._appends_end = self._end_token() if self.tokenizer is not None else (None, False)
        self.model = Qwen3Model(self.config, self.dtype)
        convert = functools.partial(qwen3_params_from_tensors, config=self.config, dtype=self.dtype)
        self.params, self.checkpoint_sha256 = load_params(directory, files, convert, QWEN3_CONFIG_FILES)
        self._buckets = bucket_lengths(self.max_length)
        self._pooled = jax.jit(functools.partial(_qwen3_pooled, self.model))
        self._tree_pooled = jax.jit(functools.partial(_qwen3_tree_pooled, self.model))
        self._hidden = jax.jit(self.model.apply)

    @property
    def fingerprint(self) -> str:
        # prefix_reuse is left out on purpose: both paths give the same vectors up to float rounding, as do
        # different batch companions (padding) in the plain path, so caches from either path are interchangeable.
        instruction = "none" if self.instruction is None else hashlib.sha256(self.instruction.encode()).hexdigest()[:8]
        return (
            f"{self.name}-jax-v{QWEN3_VERSION}:dim={self.dim}:max_len={self.max_length}:pool=last"
            f":instruction={instruction}:dtype={self.dtype_name}:checkpoint={self.checkpoint_sha256[:16]}"
        )

    def _end_token(self) -> tuple[int, bool]:
        """The id of <|endoftext|> (else the tokenizer's EOS) and whether the tokenizer appends it itself.

        Newer Qwen3-Embedding tokenizers append it in their post-processor; older ones need it added by hand.
        """
        end_id = self.tokenizer.convert_tokens_to_ids(END_OF_TEXT)
        if end_id is None or end_id == self.tokenizer.unk_token_id:
            end_id = self.tokenizer.eos_token_id
        if end_id is None:
            raise ValueError(f"the tokenizer in {self.path} has neither {END_OF_TEXT!r} nor an EOS token")
        probe = self.tokenizer("a", add_special_tokens=True)["input_ids"]
        return int(end_id), bool(probe) and probe[-1] == end_id

    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise FileNotFoundError(
                f"no tokenizer files in {self.path} (expected one of {list(TOKENIZER_FILES)}); "
                "only encode_ids / hidden_states work without them"
            )
        return self.tokenizer

    def _prepare(self, text: str) -> str:
        text = text.strip()  # as sentence-transformers does
        return text if self.instruction is None else f"Instruct: {self.instruction}\nQuery:{text}"

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, truncated to max_length - 1, then the end token: at most max_length ids."""
        tokenizer = self._require_tokenizer()
        if not texts:
            return []
        encoded = tokenizer([self._prepare(text) for text in texts], add_special_tokens=True, verbose=False)
        ids_lists = []
        for ids in encoded["input_ids"]:
            if self._appends_end and ids and ids[-1] == self._end_id:
                ids = ids[:-1]
            # Truncation keeps the end token, whose hidden state is the embedding.
            ids_lists.append(list(ids[: self.max_length - 1]) + [self._end_id])
        return ids_lists

    def count_tokens(self, text: str) -> int:
        tokenizer = self._require_tokenizer()
        return len(tokenizer(text.strip(), add_special_tokens=False, verbose=False)["input_ids"])

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(N, dim) float32; row i the L2-normalised embedding of texts[i]."""
        return self.encode_token_ids(self.tokenize(as_text_list(texts)))

    def encode_token_ids(self, token_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """(N, dim) float32 L2-normalised embeddings of id lists as `tokenize` makes them (each ends with its end
        token, at most max_length ids), in length-bucketed batches; with prefix reuse when the encoder has it on."""
        for index, ids in enumerate(token_ids):
            if not 1 <= len(ids) <= self.max_length:
                raise ValueError(f"token_ids[{index}] has {len(ids)} ids; expected 1..{self.max_length}")
        if self.prefix_reuse:
            pooled = self._pooled_with_prefix_reuse(token_ids)
        else:
            pooled = run_batches(
                token_ids, self._forward, self.dim, buckets=self._buckets, batch_size=self.batch_size,
                max_batch_tokens=self.max_batch_tokens, pad_id=self._pad_id(), left_pad=True,
            )
        return l2_normalise_rows(pooled).astype(np.float32)

    def _pooled_with_prefix_reuse(self, token_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """(N, dim) float32 unnormalised end-token states: prefix-tree rows (plan_reuse_rows), batched by length.

        pack_reuse_batch rounds a batch's end-slot count up to a power of two, like its row count, so the compiled
        shapes stay few (bucket x rows x slots).
        """
        rows = plan_reuse_rows(token_ids, self.max_length)

        def pack(indices: np.ndarray, pad: int, num_rows: int) -> tuple[np.ndarray, ...]:
            return pack_reuse_batch([rows[i] for i in indices], pad, num_rows, self._pad_id())

        out = np.zeros((len(token_ids), self.dim), dtype=np.float32)  # (N, dim)
        for indices, result in dispatch_batches(
            [row.length for row in rows], pack, self._forward_tree,
            buckets=self._buckets, batch_size=self.batch_size, max_batch_tokens=self.max_batch_tokens,
        ):
            for row_index, states in zip(indices, result):  # states (S, dim)
                scatter_members(out, rows[row_index], states)
        return out

    def _pad_id(self) -> int:
        """Padding never reaches a vector, so any id serves; the tokenizer's pad, else the end token, else 0."""
        if self.tokenizer is not None and self.tokenizer.pad_token_id is not None:
            return int(self.tokenizer.pad_token_id)
        return 0 if self._end_id is None else int(self._end_id)

    def _forward_tree(self, *arrays: np.ndarray) -> jax.Array:  # pack_reuse_rows' five arrays -> (R, S, D)
        return call_jitted(self._tree_pooled, self.params, self.dtype, *arrays)

    def __repr__(self) -> str:
        return (
            f"Qwen3Encoder(path={str(self.path)!r}, batch_size={self.batch_size}, dtype={self.dtype_name!r}, "
            f"max_length={self.max_length}, instruction={self.instruction!r}, prefix_reuse={self.prefix_reuse})"
        )


def _qwen3_pooled(model: Qwen3Model, params: dict, input_ids, attention_mask):  # -> (B, D) float32
    hidden = model.apply({"params": params}, input_ids, attention_mask)  # (B, L, D)
    return last_token_pool(hidden, attention_mask)


def _qwen3_tree_pooled(model: Qwen3Model, params: dict, input_ids, positions, segments, starts, end_slots):
    # (B, L) x 4, (B, S) -> (B, S, D) float32: only the end slots leave the device.
    hidden = model.apply(
        {"params": params}, input_ids, positions, segments, starts, method=Qwen3Model.prefix_tree
    )  # (B, L, D)
    return jnp.take_along_axis(hidden, end_slots[:, :, None], axis=1).astype(jnp.float32)
