"""Deduplicating, optionally disk-backed cache of text embeddings.

Training data repeats texts heavily (the same model-card description or
state prefix appears in many turns), so `EmbeddingStore` encodes each
distinct text once and hands training a (U, dim) table of distinct vectors
plus (N,) int32 indices into it.

On-disk layout, when `cache_dir` is given:

    cache_dir/<sha256(fingerprint)[:16]>/
        fingerprint.txt        the encoder's full fingerprint
        shard-<n>-<id>.npz     keys: (K,) 'S64' sha256 hex digests of the
                               texts' UTF-8 bytes; vectors: (K, dim) float32

Each directory belongs to exactly one encoder fingerprint, so vectors from
different encoders or settings never mix. Shards are append-only and
written to a hidden tmp file then `os.replace`d into place, so a killed run
leaves at most a stray tmp file (ignored on load), never a torn shard. The
random <id> in each shard's name keeps two processes sharing a directory
from overwriting each other's shards. Nothing is pickled.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np
from absl import logging

from rivet_jax.encoders.base import Encoder, as_text_list, check_encoder_output
from rivet_jax.progress import Progress

FINGERPRINT_FILE = "fingerprint.txt"
SHARD_GLOB = "shard-*.npz"
KEY_DTYPE = np.dtype("S64")  # sha256 hex digest, 64 ASCII bytes
# Texts per encoder call: an encoder's working memory grows with its input (the hashing encoder's float64 rows and
# their normalised copy: 1.6 GB for the large MINT pool's 97,000 texts in one call).
ENCODED_PER_CALL = 4096


def text_key(text: str) -> bytes:
    """Cache key of `text`: the sha256 hex digest of its UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest().encode("ascii")


def fingerprint_dir_name(fingerprint: str) -> str:
    """A short, filesystem-safe directory name derived from `fingerprint`."""
    return hashlib.sha256(fingerprint.encode("utf-8")).hexdigest()[:16]


def write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Call `write(file)` on a hidden tmp file beside `path`, then rename it to `path`.

    The rename is atomic, so readers see either no file or the whole file.
    """
    tmp_path = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp_path, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp_path, path)
    finally:
        # Only left over if something above failed; a kill -9 can still leave
        # one, which loading ignores.
        tmp_path.unlink(missing_ok=True)


def prepare_cache_dir(cache_dir: str | os.PathLike, fingerprint: str) -> Path:
    """Create (or reopen) the directory for `fingerprint`, refusing a mismatched one."""
    path = Path(cache_dir) / fingerprint_dir_name(fingerprint)
    path.mkdir(parents=True, exist_ok=True)
    fingerprint_path = path / FINGERPRINT_FILE
    if fingerprint_path.exists():
        stored = fingerprint_path.read_text(encoding="utf-8").strip()
        if stored != fingerprint:
            raise ValueError(
                f"embedding cache {path} holds vectors for encoder fingerprint {stored!r}, "
                f"not {fingerprint!r}; refusing to mix them. Use another cache_dir or delete {path}."
            )
    else:
        write_atomically(fingerprint_path, lambda file: file.write(f"{fingerprint}\n".encode("utf-8")))
    return path


def load_shard(path: Path, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(K,) 'S64' keys and (K, dim) float32 vectors of one shard, checked."""
    try:
        with np.load(path, allow_pickle=False) as shard:
            keys, vectors = shard["keys"], shard["vectors"]
    except Exception as error:  # a damaged file can fail in many ways inside np.load
        raise ValueError(
            f"cannot read embedding shard {path} ({error}); delete it to re-encode its texts"
        ) from error
    if keys.dtype != KEY_DTYPE or vectors.dtype != np.float32 or vectors.shape != (len(keys), dim):
        raise ValueError(
            f"embedding shard {path} has keys {keys.dtype}{keys.shape} and vectors "
            f"{vectors.dtype}{vectors.shape}, expected S64 (K,) and float32 (K, {dim}); "
            "delete it to re-encode its texts"
        )
    return keys, vectors


def shard_sort_key(path: Path) -> tuple[int, str]:
    """Order shards by their sequence number, then name (ids break ties)."""
    number = path.name.split("-")[1]
    return (int(number) if number.isdigit() else -1, path.name)


def save_shard(directory: Path, number: int, keys: np.ndarray, vectors: np.ndarray) -> Path:
    """Atomically write (K,) keys and (K, dim) vectors as a new shard; return its path."""
    path = directory / f"shard-{number:06d}-{uuid.uuid4().hex[:8]}.npz"
    write_atomically(path, lambda file: np.savez(file, keys=keys, vectors=vectors))
    return path


class EmbeddingStore:
    """Encode each distinct text once, in memory and optionally on disk.

    `stats` counts, over the store's lifetime:
      requested     texts passed in, duplicates included
      distinct      distinct texts per call, summed over calls
                    (= memory_hits + disk_hits + encoded)
      memory_hits   distinct texts already embedded earlier by this store
      disk_hits     distinct texts first found in the on-disk shards
      encoded       texts passed to encoder.encode
    """

    def __init__(self, encoder: Encoder, cache_dir: str | os.PathLike | None = None):
        self.encoder = encoder
        self.dim = int(encoder.dim)
        self.fingerprint = str(encoder.fingerprint)
        # key -> (dim,) float32 vector, for every text embedded or loaded.
        self._vectors: dict[bytes, np.ndarray] = {}
        # Keys loaded from disk and not requested yet, so the first request
        # counts as a disk hit and later ones as memory hits.
        self._unrequested_disk_keys: set[bytes] = set()
        self._stats = dict(requested=0, distinct=0, memory_hits=0, disk_hits=0, encoded=0)
        self.cache_path: Path | None = None
        self._num_shards = 0
        if cache_dir is not None:
            self.cache_path = prepare_cache_dir(cache_dir, self.fingerprint)
            self._load_shards()

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._stats)

    def __len__(self) -> int:
        """Number of distinct texts whose vectors the store holds."""
        return len(self._vectors)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(N, dim) float32; row i is the embedding of texts[i]."""
        table, index = self.embed_table(texts)
        return table if len(table) == len(index) else table[index]   # distinct texts: the table is in their order

    def forget(self) -> None:
        """Drop the vectors held in memory (those on disk stay there): for passes over more texts than fit."""
        self._vectors.clear()
        self._unrequested_disk_keys.clear()

    def embed_table(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(U, dim) float32 table of the distinct texts, first-occurrence order,
        and (N,) int32 index with table[index[i]] the embedding of texts[i]."""
        text_list = as_text_list(texts)
        # dict keeps first-occurrence order and gives each distinct text its row.
        row_of_text = {text: row for row, text in enumerate(dict.fromkeys(text_list))}
        index = np.fromiter(  # (N,)
            map(row_of_text.__getitem__, text_list), dtype=np.int32, count=len(text_list)
        )
        keys = [text_key(text) for text in row_of_text]  # (U,)
        self._stats["requested"] += len(text_list)
        self._stats["distinct"] += len(keys)
        self._fill_misses(list(row_of_text), keys)
        table = np.empty((len(keys), self.dim), dtype=np.float32)  # (U, dim)
        for row, key in enumerate(keys):
            table[row] = self._vectors[key]
        return table, index

    def _fill_misses(self, distinct_texts: list[str], keys: list[bytes]) -> None:
        """Count hits, encode the texts not held yet in one call, and store them."""
        miss_texts, miss_keys = [], []
        for text, key in zip(distinct_texts, keys):
            if key not in self._vectors:
                miss_texts.append(text)
                miss_keys.append(key)
            elif key in self._unrequested_disk_keys:
                self._unrequested_disk_keys.discard(key)
                self._stats["disk_hits"] += 1
            else:
                self._stats["memory_hits"] += 1
        if not miss_texts:
            return
        vectors = np.empty((len(miss_texts), self.dim), np.float32)  # (M, dim), owned: encoders may reuse buffers
        progress = None
        if len(miss_texts) > ENCODED_PER_CALL:  # a line as it starts, then every 15 s or so (the 49-model pool: 45 s)
            logging.info("embedding %d texts", len(miss_texts))
            progress = Progress(f"embedding {len(miss_texts)} texts", len(miss_texts))
        for start in range(0, len(miss_texts), ENCODED_PER_CALL):
            texts = miss_texts[start:start + ENCODED_PER_CALL]
            vectors[start:start + len(texts)] = check_encoder_output(self.encoder, self.encoder.encode(texts),
                                                                     len(texts))
            if progress is not None:
                progress.step(len(texts))
        self._stats["encoded"] += len(miss_texts)
        if self.cache_path is not None:
            # Write before remembering, so a failed write leaves memory and
            # disk agreeing (the texts are simply re-encoded next time).
            save_shard(self.cache_path, self._num_shards, np.array(miss_keys, dtype=KEY_DTYPE), vectors)
            self._num_shards += 1
        self._vectors.update(zip(miss_keys, vectors))

    def _load_shards(self) -> None:
        """Load every complete shard in cache_path (tmp files are not shards)."""
        shard_paths = sorted(self.cache_path.glob(SHARD_GLOB), key=shard_sort_key)
        for path in shard_paths:
            keys, vectors = load_shard(path, self.dim)
            self._vectors.update(zip(keys.tolist(), vectors))
        self._unrequested_disk_keys = set(self._vectors)
        # Continue the numbering so shard names stay in write order.
        self._num_shards = 1 + max((shard_sort_key(path)[0] for path in shard_paths), default=-1)

    def __repr__(self) -> str:
        return f"EmbeddingStore({self.encoder!r}, cache_path={self.cache_path}, held={len(self)})"
