"""A weight-free, deterministic bag-of-n-grams encoder (signed feature hashing).

The rule, exactly (tests rebuild vectors from it by hand):

1. Tokens: `text.lower()` (when `lowercase`), then `re.findall(TOKEN_PATTERN)`
   with TOKEN_PATTERN = r"\\w+|[^\\w\\s]": runs of word characters, and every
   other non-space character as a token of its own ("Hi, you!" ->
   ["hi", ",", "you", "!"]). `count_tokens` is the number of these tokens.
2. Features: for each n in ngram_range (inclusive), every run of n
   consecutive tokens joined with one space ("a b" for a bigram).
3. Hash: h = int.from_bytes(blake2b(feature.encode("utf-8"),
   digest_size=8).digest(), "little"); bucket = h % dim; sign = -1 if the top
   bit (h >> 63) is set else +1. blake2b is stable across processes and
   machines, unlike Python's per-process salted hash().
4. Weight: a feature seen c times in the text adds sign * (1 + ln c) to its
   bucket (sublinear tf; signs make collisions cancel on average).
5. The vector is L2-normalised. A text with no tokens gives the zero vector
   (norm 0, not NaN), as does the rare text whose features cancel exactly.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterator, Sequence
from itertools import filterfalse

import numpy as np

from rivet_jax.data.serialize import BLOCK_SEPARATOR
from rivet_jax.encoders.base import as_text_list, l2_normalise_rows

TOKEN_PATTERN = r"\w+|[^\w\s]"
# Bump whenever the rule in the module docstring changes: the version is in
# the fingerprint, so on-disk caches of old vectors stop being reused.
HASHING_VERSION = 1
# The memo is cleared when it reaches this many features, bounding memory on
# huge corpora while keeping the common (repeating) features hot.
MAX_MEMO_ENTRIES = 2**21
# Tokens of recently seen state blocks, up to this many tokens in all (least recently used dropped first):
# serialization counts the tokens of every block of a state, and the states of a growing conversation repeat
# their blocks, so each is tokenized once (`count_tokens`, `encode_blocks`).
BLOCK_CACHE_TOKENS = 2**20
# Vectors of recently encoded states (`encode_blocks`), up to this many bytes in all, shared by every encoder of one
# fingerprint (least recently used dropped first): batched rollouts score the same state many times (every policy's
# first turn of a task, and later turns wherever policies chose alike: they draw the same responses), and n-grams
# span blocks, so a state's vector is not a sum of its blocks' and is worth keeping whole. One cache for the process,
# not one per encoder: a job holds dozens of routers, each with its own encoder (64 MB each took the main job from
# 3.0 to 4.2 GB).
STATE_CACHE_BYTES = 2**25


class _StateVectors:
    """(fingerprint, digest of the state's text) -> its (dim,) float32 vector, least recently used dropped past the
    byte bound. Keyed by the joined text's digest, not the blocks: the keys stay small, and blocks that join alike
    have one vector (`encode_blocks` equals `encode` of the joined text)."""

    def __init__(self):
        self.rows: OrderedDict[tuple[str, bytes], np.ndarray] = OrderedDict()
        self.bytes = 0
        self.lock = threading.Lock()

    def get(self, keys: Sequence[tuple]) -> dict:
        with self.lock:
            found = {key: self.rows[key] for key in dict.fromkeys(keys) if key in self.rows}
            for key in found:
                self.rows.move_to_end(key)
        return found

    def put(self, items: Sequence[tuple[tuple, np.ndarray]]) -> None:
        with self.lock:
            for key, row in items:
                if key not in self.rows:
                    self.rows[key] = row.copy()   # its own buffer: a view would keep its whole batch alive
                    self.bytes += row.nbytes
            while self.bytes > STATE_CACHE_BYTES:
                self.bytes -= self.rows.popitem(last=False)[1].nbytes


_STATE_VECTORS = _StateVectors()


def feature_bucket_and_sign(feature: str, dim: int) -> tuple[int, int]:
    """Bucket in [0, dim) and sign (+1/-1) of `feature`, from a stable hash."""
    digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
    h = int.from_bytes(digest, "little")
    return h % dim, (-1 if h >> 63 else 1)


def pack_bucket_and_sign(bucket: int, sign: int) -> int:
    """Pack a bucket and a sign into one int (bucket * 2, plus 1 if negative) for the memo."""
    return bucket * 2 + (sign < 0)


def unpack_bucket_and_sign(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack (F,) codes from pack_bucket_and_sign into (F,) buckets and (F,) float signs."""
    return codes >> 1, 1.0 - 2.0 * (codes & 1)


def ngrams(tokens: Sequence[str], n: int) -> Iterator[str]:
    """Every run of `n` consecutive tokens, joined with a single space."""
    return map(" ".join, zip(*(tokens[i:] for i in range(n))))


class HashingEncoder:
    """Signed feature hashing of word n-grams with sublinear tf, L2-normalised.

    See the module docstring for the exact rule.
    """

    name = "hashing"

    def __init__(self, dim: int = 1024, ngram_range: Sequence[int] = (1, 2), lowercase: bool = True):
        if int(dim) != dim or dim < 1:
            raise ValueError(f"HashingEncoder dim must be a positive integer, got {dim!r}")
        low, high = (int(n) for n in ngram_range)
        if not 1 <= low <= high:
            raise ValueError(
                f"HashingEncoder ngram_range must satisfy 1 <= low <= high, got {tuple(ngram_range)!r}"
            )
        self.dim = int(dim)
        self.ngram_range = (low, high)
        self.lowercase = bool(lowercase)
        self._token_regex = re.compile(TOKEN_PATTERN)
        # feature -> packed (bucket, sign); texts repeat features a lot, and
        # the hash is the costliest step per feature.
        self._memo: dict[str, int] = {}
        self._blocks: OrderedDict[str, tuple[str, ...]] = OrderedDict()   # block text -> its tokens (LRU)
        self._cached_tokens = 0
        self._blocks_lock = threading.Lock()

    @property
    def fingerprint(self) -> str:
        pattern_hash = hashlib.sha256(TOKEN_PATTERN.encode("utf-8")).hexdigest()[:8]
        low, high = self.ngram_range
        return (
            f"hashing-v{HASHING_VERSION}:dim={self.dim}:ngrams={low}-{high}"
            f":lower={int(self.lowercase)}:re={pattern_hash}"
        )

    def tokenize(self, text: str) -> list[str]:
        """Tokens of `text` by TOKEN_PATTERN (lowercased first when configured)."""
        if self.lowercase:
            text = text.lower()
        return self._token_regex.findall(text)

    def count_tokens(self, text: str) -> int:
        return len(self._block_tokens(text))

    def features(self, text: str) -> list[str]:
        """All n-gram features of `text` for n in ngram_range, with repeats."""
        return self._features_of(self.tokenize(text))

    def _features_of(self, tokens: Sequence[str]) -> list[str]:
        low, high = self.ngram_range
        return [feature for n in range(low, high + 1) for feature in ngrams(tokens, n)]

    def encode_blocks(self, states: Sequence[Sequence[str]]) -> np.ndarray:
        """`encode` of each state's blocks joined by BLOCK_SEPARATOR (`data.serialize.state_blocks`), the same vectors
        bit for bit, with each block's tokens reused from the cache: no token spans the whitespace separator, and
        lowercasing a block alone equals lowercasing it inside the joined text (the separator ends every case
        context), so the joined text's tokens are the blocks' tokens in order. A state encoded lately (by any encoder
        of this fingerprint) is read from the process's state cache (`STATE_CACHE_BYTES`)."""
        fingerprint = self.fingerprint
        states = [as_text_list(blocks) for blocks in states]
        keys = [(fingerprint, hashlib.blake2b(BLOCK_SEPARATOR.join(blocks).encode("utf-8"), digest_size=16).digest())
                for blocks in states]
        found = _STATE_VECTORS.get(keys)
        misses = {key: blocks for key, blocks in zip(keys, states) if key not in found}
        vectors = np.zeros((len(misses), self.dim), dtype=np.float64)  # (U, dim)
        for row, blocks in enumerate(misses.values()):
            tokens = [token for block in blocks for token in self._block_tokens(block)]
            vectors[row] = self._vector_of(self._features_of(tokens))
        fresh = list(zip(misses, l2_normalise_rows(vectors).astype(np.float32)))
        found.update(fresh)
        _STATE_VECTORS.put(fresh)
        return np.array([found[key] for key in keys], np.float32).reshape(len(keys), self.dim)  # (N, dim), owned

    def _block_tokens(self, block: str) -> tuple[str, ...]:
        """The tokens of `block`, from the LRU cache or tokenized now (and cached while the budget allows)."""
        with self._blocks_lock:
            tokens = self._blocks.get(block)
            if tokens is not None:
                self._blocks.move_to_end(block)
                return tokens
        tokens = tuple(self.tokenize(block))
        with self._blocks_lock:
            if block not in self._blocks and len(tokens) <= BLOCK_CACHE_TOKENS:
                self._blocks[block] = tokens
                self._cached_tokens += len(tokens)
                while self._cached_tokens > BLOCK_CACHE_TOKENS:
                    _, dropped = self._blocks.popitem(last=False)
                    self._cached_tokens -= len(dropped)
        return tokens

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(N, dim) float32, row i the L2-normalised hashed features of texts[i]."""
        text_list = as_text_list(texts)
        vectors = np.zeros((len(text_list), self.dim), dtype=np.float64)  # (N, dim)
        for row, text in enumerate(text_list):
            vectors[row] = self._unnormalised_vector(text)
        # Normalise in float64 and cast once, so rounding does not depend on
        # how many features a text has.
        return l2_normalise_rows(vectors).astype(np.float32)

    def _unnormalised_vector(self, text: str) -> np.ndarray:
        """(dim,) float64 sum of sign * (1 + ln count) over the features of `text`."""
        return self._vector_of(self.features(text))

    def _vector_of(self, features: list[str]) -> np.ndarray:
        counts = Counter(features)
        num_features = len(counts)
        if num_features == 0:
            return np.zeros(self.dim)
        memo = self._memo
        # filterfalse over the builtin lookup finds unseen features in C.
        # (Not `counts.keys() - memo.keys()`: that walks the whole memo.)
        unseen = list(filterfalse(memo.__contains__, counts))
        if unseen:
            self._remember(unseen)
        # map() over the builtin lookup keeps this per-feature loop in C; it
        # is the hot path when encoding thousands of long texts.
        codes = np.fromiter(map(memo.__getitem__, counts), dtype=np.int64, count=num_features)  # (F,)
        tf_weights = 1.0 + np.log(np.fromiter(counts.values(), dtype=np.float64, count=num_features))  # (F,)
        buckets, signs = unpack_bucket_and_sign(codes)
        return np.bincount(buckets, weights=signs * tf_weights, minlength=self.dim)

    def _remember(self, features: list[str]) -> None:
        """Hash `features` into the memo, clearing it first if it would overflow."""
        # Clear before adding, never midway, so every feature of the text
        # being encoded is in the memo when it is read back.
        if len(self._memo) + len(features) > MAX_MEMO_ENTRIES:
            self._memo.clear()
        for feature in features:
            self._memo[feature] = pack_bucket_and_sign(*feature_bucket_and_sign(feature, self.dim))

    def __repr__(self) -> str:
        return f"HashingEncoder(dim={self.dim}, ngram_range={self.ngram_range}, lowercase={self.lowercase})"
