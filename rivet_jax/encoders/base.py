"""The text-encoder protocol and small helpers every encoder shares.

An encoder turns texts (serialised states, responses, model-card
descriptions) into fixed float32 vectors. Encoders are frozen: the same
text always maps to the same vector for a given `fingerprint`, which is
what lets `EmbeddingStore` cache vectors on disk keyed by that fingerprint.

Concrete encoders (hashing now; BERT/MiniLM and Qwen3 later) implement
`Encoder` structurally; nothing needs to subclass it. Extra knobs such as a
batch size belong to the concrete encoder's constructor, not the protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from rivet_jax.data.serialize import BLOCK_SEPARATOR


@runtime_checkable
class Encoder(Protocol):
    """A frozen text encoder giving L2-normalised float32 vectors."""

    name: str  # short family name, e.g. "hashing"
    dim: int  # length of every vector
    # Changes whenever the vectors could change: name, version, dim, every
    # setting, and a hash of the weights for neural encoders. Disk caches
    # are keyed by it, so a stale fingerprint would silently reuse wrong
    # vectors.
    fingerprint: str

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(N, dim) float32; row i encodes texts[i], rows L2-normalised."""
        ...

    def count_tokens(self, text: str) -> int:
        """The encoder's own token count for `text` (used for token budgets)."""
        ...


def as_text_list(texts: Sequence[str]) -> list[str]:
    """Check `texts` is a sequence of str and return it as a list.

    A bare str is refused because iterating it would silently encode each
    character as its own text.
    """
    if isinstance(texts, (str, bytes)):
        raise TypeError("expected a sequence of texts, got a single str/bytes; wrap it in a list")
    text_list = list(texts)
    for i, text in enumerate(text_list):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] is {type(text).__name__}, expected str")
    return text_list


def l2_normalise_rows(vectors: np.ndarray) -> np.ndarray:
    """Scale each row of (N, D) `vectors` to unit L2 norm; all-zero rows stay zero."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)  # (N, 1)
    # Dividing by 1 where the norm is 0 keeps empty-text rows at exactly zero
    # instead of turning them into NaN.
    return vectors / np.where(norms > 0, norms, 1)


def describe_encoder(encoder: Encoder) -> str:
    """Name and fingerprint of `encoder`, for error messages."""
    name = getattr(encoder, "name", type(encoder).__name__)
    fingerprint = getattr(encoder, "fingerprint", "?")
    return f"encoder {name!r} (fingerprint {fingerprint!r})"


def check_encoder_output(encoder: Encoder, vectors: object, num_texts: int) -> np.ndarray:
    """Return `vectors` if it is a finite (num_texts, encoder.dim) float32 array.

    Raises ValueError naming the encoder otherwise, so a broken encoder fails
    where it is called instead of poisoning a cache or a training run.
    """
    where = describe_encoder(encoder)
    if not isinstance(vectors, np.ndarray):
        raise ValueError(f"{where} returned {type(vectors).__name__}, expected a numpy array")
    if vectors.dtype != np.float32:
        raise ValueError(f"{where} returned dtype {vectors.dtype}, expected float32")
    expected_shape = (num_texts, encoder.dim)
    if vectors.shape != expected_shape:
        raise ValueError(f"{where} returned shape {vectors.shape}, expected {expected_shape}")
    if not np.all(np.isfinite(vectors)):
        bad_rows = np.flatnonzero(~np.all(np.isfinite(vectors), axis=1))
        raise ValueError(f"{where} returned non-finite values in rows {bad_rows[:10].tolist()}")
    return vectors


def encode_states(encoder: Encoder, states: Sequence[Sequence[str]]) -> np.ndarray:
    """(N, dim) vectors of states given as their blocks (`data.serialize.state_blocks`): the encoder's
    `encode_blocks` where it has one (the same vectors with less work: the hashing encoder reuses each block's
    tokens across the states of a conversation), else `encode` of the joined texts."""
    encode_blocks = getattr(encoder, "encode_blocks", None)
    if encode_blocks is not None:
        return encode_blocks(states)
    return encoder.encode([BLOCK_SEPARATOR.join(blocks) for blocks in states])
