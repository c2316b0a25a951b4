"""A static (word-embedding) sentence encoder: tokenize, look up, mean-pool, in JAX. Default: WordLlama.

    text -> token ids (a `tokenizers` JSON tokenizer, no special tokens)        (L,)
         -> rows of a frozen (V, D) table, mean over the tokens                 (D,)
         -> L2 normalisation

WordLlama (Miller 2024) distils an LLM's token embeddings into such a table, trained so that the mean of a text's
rows is a sentence embedding; its 256-d Llama-2 table (16 MB) and tokenizer ship inside the `wordllama` wheel, so
it needs no download and no torch. It reads meaning where the hashing encoder only matches words, at a small
fraction of a transformer's cost: one gather and one sum per token. The table is Matryoshka-trained, so its first
`dim` columns (64, 128, ...) are a smaller encoder of the same kind.

This reproduces `wordllama.WordLlamaInference.embed(texts, norm=True)` (no truncation, out-of-range ids clipped to
the last row) to float32 rounding; tests/test_static_encoder.py checks it against the package. The package is only
read for its two files, never imported (its import configures the root logger).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rivet_jax.encoders.base import as_text_list, l2_normalise_rows
from rivet_jax.encoders.runtime import bucket_lengths, checkpoint_digest, place_params, run_batches

# Bump whenever the computation changes in a way that could move vectors: it is in the fingerprint.
STATIC_VERSION = 1
WORDLLAMA_PACKAGE = "wordllama"
WORDLLAMA_WEIGHTS = "weights/l2_supercat_256.safetensors"
WORDLLAMA_TOKENIZER = "tokenizers/l2_supercat_tokenizer_config.json"
TABLE_KEY = "embedding.weight"   # the safetensors key WordLlama stores its table under
LONGEST = 1 << 20                # tokens: the padded lengths are drawn from bucket_lengths(LONGEST)
# Texts tokenized at once. The embedding store hands an encoder every text it misses in one call (116,000 states of
# up to 16,384 tokens on the large MINT pool): their token lists all at once held 10 GB.
CHUNK_TEXTS = 4096


def wordllama_files() -> tuple[Path, Path]:
    """(weights, tokenizer) of the installed wordllama package, found without importing it."""
    spec = importlib.util.find_spec(WORDLLAMA_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the wordllama encoder reads the table and tokenizer shipped in the `wordllama` "
                                "package: pip install wordllama (or pass path= and tokenizer=)")
    root = Path(next(iter(spec.submodule_search_locations)))
    return root / WORDLLAMA_WEIGHTS, root / WORDLLAMA_TOKENIZER


def read_table(path: Path, key: str = TABLE_KEY) -> np.ndarray:
    """The (V, D) float32 embedding table stored under `key` in the safetensors file `path`."""
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as file:
        keys = list(file.keys())
        if key not in keys:
            raise ValueError(f"{path}: no tensor {key!r} (it has {keys[:10]})")
        table = file.get_tensor(key)
    if table.ndim != 2:
        raise ValueError(f"{path}: {key!r} has shape {table.shape}, expected (vocabulary, dim)")
    return np.ascontiguousarray(table, dtype=np.float32)


def mean_of_rows(table: jax.Array, ids: jax.Array, mask: jax.Array) -> jax.Array:
    """(R, D) float32 means of the table rows of each row's unmasked ids; zero for a row with none.

    table (V, D) float32, ids (R, P) int32 (clipped to V - 1, as WordLlama does), mask (R, P) {0, 1}."""
    rows = table[jnp.minimum(ids, table.shape[0] - 1)]                     # (R, P, D)
    weights = mask.astype(jnp.float32)[..., None]                          # (R, P, 1)
    return jnp.sum(rows * weights, axis=1) / jnp.maximum(jnp.sum(weights, axis=1), 1.0)


class StaticEmbeddingEncoder:
    """A frozen static-embedding encoder: a (V, D) table read from safetensors and a `tokenizers` JSON file
    (default: WordLlama's, from the installed `wordllama` package).

    encode(texts) tokenizes without special tokens (truncated to max_length tokens when one is given; WordLlama
    itself never truncates), averages the table rows over each text's tokens in length-bucketed jit-compiled
    batches, keeps the first `dim` columns and L2-normalises. A text with no tokens maps to the zero vector.
    """

    def __init__(self, path: str | None = None, tokenizer: str | None = None, dim: int | None = None,
                 max_length: int | None = None, batch_size: int = 256, max_batch_tokens: int = 65_536,
                 name: str | None = None):
        if batch_size < 1 or max_batch_tokens < 1:
            raise ValueError(f"batch_size and max_batch_tokens must be positive, got {batch_size}, {max_batch_tokens}")
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be positive (or None: whole texts), got {max_length}")
        default_weights, default_tokenizer = wordllama_files() if path is None or tokenizer is None else (None, None)
        self.path = Path(path) if path is not None else default_weights
        self.tokenizer_path = Path(tokenizer) if tokenizer is not None else default_tokenizer
        for what, file in (("weights", self.path), ("tokenizer", self.tokenizer_path)):
            if not file.is_file():
                raise FileNotFoundError(f"static encoder {what} file {file} does not exist")
        self.name = name or ("wordllama" if path is None else self.path.stem.lower())
        table = read_table(self.path)
        if dim is not None and not 1 <= dim <= table.shape[1]:
            raise ValueError(f"dim must be between 1 and the table's {table.shape[1]} columns, got {dim}")
        self.dim = int(dim or table.shape[1])
        self.max_length = max_length
        self.batch_size, self.max_batch_tokens = int(batch_size), int(max_batch_tokens)
        # Mean of the first `dim` columns = the first `dim` columns of the mean: slice the table once.
        self.table = place_params(jnp.asarray(table[:, :self.dim]))        # (V, dim)

        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(self.tokenizer_path))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        # One digest over both files: the vectors change with either.
        digests = "".join(checkpoint_digest(file.parent, [file.name]) for file in (self.path, self.tokenizer_path))
        self.checkpoint_sha256 = hashlib.sha256(digests.encode()).hexdigest()
        self._buckets = bucket_lengths(max_length or LONGEST)
        self._pooled = jax.jit(mean_of_rows)

    @property
    def fingerprint(self) -> str:
        return (f"{self.name}-jax-static-v{STATIC_VERSION}:dim={self.dim}:max_len={self.max_length or 0}"
                f":checkpoint={self.checkpoint_sha256[:16]}")

    def tokenize(self, texts: Sequence[str]) -> list[np.ndarray]:
        """(L_i,) int32 token ids (no special tokens), truncated to max_length when one is set, for each text."""
        encoded = self.tokenizer.encode_batch(list(texts), add_special_tokens=False) if texts else []
        ids = [np.asarray(e.ids[:self.max_length] if self.max_length else e.ids, np.int32) for e in encoded]
        if (longest := max(map(len, ids), default=0)) > self._buckets[-1]:
            raise ValueError(f"a text of {longest} tokens is longer than the static encoder's {self._buckets[-1]}: "
                             f"set max_length")
        return ids

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(N, dim) float32; row i the L2-normalised mean embedding of texts[i]."""
        text_list = as_text_list(texts)
        forward = functools.partial(self._pooled, self.table)
        pooled = np.zeros((len(text_list), self.dim), np.float32)                                  # (N, dim)
        for start in range(0, len(text_list), CHUNK_TEXTS):
            chunk = self.tokenize(text_list[start:start + CHUNK_TEXTS])
            pooled[start:start + len(chunk)] = run_batches(
                chunk, forward, self.dim, buckets=self._buckets, batch_size=self.batch_size,
                max_batch_tokens=self.max_batch_tokens, pad_id=0, left_pad=False)
        return l2_normalise_rows(pooled).astype(np.float32)

    def __repr__(self) -> str:
        return f"StaticEmbeddingEncoder(path={str(self.path)!r}, dim={self.dim}, max_length={self.max_length})"
