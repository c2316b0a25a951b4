"""The embedding table training reads, built on the host: in memory, or as a memory-mapped `.npy` file on disk.

A host-resident table has one row per text of the replay's text table, (T, D) float32, but only the rows a process
reads are embedded: with several processes each one embeds the texts of its own replay slice (the sharded
encoder pass) and leaves the other rows zero (on disk, holes of a sparse file that take no space).

On disk the file is written under a temporary name and renamed when complete, and its name is a digest of the
encoder fingerprint, the texts and the rows, so a later run over the same corpus maps the finished file at once
(no encoder, no cache lookups) and a killed run never leaves a half-written table behind under the final name.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from rivet_jax.encoders.base import Encoder
from rivet_jax.encoders.store import EmbeddingStore

CHUNK_TEXTS = 4096  # texts embedded and written per step: bounds the memory the pass needs


def table_name(fingerprint: str, texts: Sequence[str], rows: np.ndarray) -> str:
    digest = hashlib.sha256(fingerprint.encode())
    for text in texts:
        digest.update(hashlib.sha256(text.encode()).digest())
    digest.update(np.ascontiguousarray(rows, np.int64).tobytes())
    return f"table-{digest.hexdigest()[:24]}.npy"


def fill_rows(store: EmbeddingStore, texts: Sequence[str], rows: np.ndarray, out: np.ndarray,
              progress: Callable[[int, int], None] | None = None) -> None:
    """out[rows] = the embeddings of texts[rows], CHUNK_TEXTS at a time; the store forgets each chunk once written
    (the replay's texts are distinct, so nothing it held would be asked for again)."""
    for start in range(0, len(rows), CHUNK_TEXTS):
        part = rows[start:start + CHUNK_TEXTS]
        out[part] = store.embed([texts[r] for r in part])
        store.forget()
        if progress is not None:
            progress(min(start + CHUNK_TEXTS, len(rows)), len(rows))


def host_table(encoder: Encoder, open_store: Callable[[], EmbeddingStore], texts: Sequence[str], rows: np.ndarray,
               directory: str | os.PathLike | None,
               progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """(T, D) float32 with the embeddings of texts[rows] (other rows zero): a read-only memory map of a file in
    `directory`, reused when it exists, or (directory None) an array in memory.

    `open_store()` (the encoder's embedding cache) is called only when rows must be embedded: opening a cache
    reads all its shards, which a finished table makes unnecessary."""
    shape = (len(texts), int(encoder.dim))
    if directory is None:
        table = np.zeros(shape, np.float32)  # untouched rows are never paged in
        fill_rows(open_store(), texts, rows, table, progress)
        return table
    path = Path(directory) / table_name(str(encoder.fingerprint), texts, rows)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            table = np.lib.format.open_memmap(partial, mode="w+", dtype=np.float32, shape=shape)
            fill_rows(open_store(), texts, rows, table, progress)
            table.flush()
            del table
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    table = np.load(path, mmap_mode="r")
    if table.shape != shape or table.dtype != np.float32:
        raise ValueError(f"embedding table {path} holds {table.dtype}{table.shape}, expected float32{shape}; "
                         f"delete it to rebuild")
    return table
