"""Frozen text encoders and the embedding store that caches their vectors.

`make_encoder(config)` builds an encoder from a config's `name`; new
encoders register one builder in `ENCODER_BUILDERS`. Builders of heavy
(JAX) encoders should import inside the builder, so importing this package
stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rivet_jax.encoders.base import Encoder
from rivet_jax.encoders.hashing import HashingEncoder
from rivet_jax.encoders.store import EmbeddingStore

__all__ = ["ENCODER_BUILDERS", "EmbeddingStore", "Encoder", "HashingEncoder", "make_encoder"]


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


# name -> builder taking the encoder config.
ENCODER_BUILDERS: dict[str, Callable[[Any], Encoder]] = {
    "hashing": build_hashing_encoder,
}


def make_encoder(config: Any) -> Encoder:
    """Build the encoder named by `config.name` (a mapping or ConfigDict-like)."""
    name = config_value(config, "name")
    builder = ENCODER_BUILDERS.get(name)
    if builder is None:
        raise ValueError(f"unknown encoder name {name!r}; known encoders: {sorted(ENCODER_BUILDERS)}")
    return builder(config)
