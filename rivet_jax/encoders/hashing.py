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
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

from rivet_jax.data.serialize import BLOCK_SEPARATOR
from rivet_jax.encoders.base import as_text_list, l2_normalise_rows

TOKEN_PATTERN = r"\w+|[^\w\s]"
# Bump whenever the rule in the module docstring changes: the version is in
# the fingerprint, so on-disk caches of old vectors stop being reused.
HASHING_VERSION = 1
# The vocabulary (every feature met, with its hash) starts afresh past this many features, bounding memory on huge
# corpora while keeping the common (repeating) features hot.
MAX_MEMO_ENTRIES = 2**21
# Texts' features counted in one numpy pass, up to about this many (with repeats): few calls, and still in cache.
COUNTED_TOGETHER = 2**15
# Features of recently seen blocks, up to this many tokens in all (least recently used dropped first):
# serialization counts the tokens of every block of a state, and the states of a growing conversation repeat
# their blocks, so each is tokenized once (`count_tokens`, `encode`, `encode_blocks`).
BLOCK_CACHE_TOKENS = 2**20
# Vectors of recently encoded states (`encode_blocks`), up to this many bytes in all, shared by every encoder of one
# fingerprint (least recently used dropped first): batched rollouts score the same state many times (every policy's
# first turn of a task, and later turns wherever policies chose alike: they draw the same responses), and n-grams
# span blocks, so a state's vector is not a sum of its blocks' and is worth keeping whole. One cache for the process,
# not one per encoder: a job holds dozens of routers, each with its own encoder (64 MB each took the main job from
# 3.0 to 4.2 GB). 128 MB, not 32: a 15-run online validation's states (about 30 MB) stay from one validation to the
# next (the selection grid's validations 18.3 -> 15.4 s in one bench run, the machine drifting ~10% between runs).
STATE_CACHE_BYTES = 2**27


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


def distinct_in_order_met(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of `values` (N,) in the order they first occur, and how often each occurs. What
    `np.unique(..., return_index=True, return_counts=True)` reordered by first index gives, at half its time: an
    unstable sort, each run's first index its smallest position (np.unique sorts stably to read it off)."""
    if not len(values):
        return values, np.zeros(0, np.intp)
    perm = np.argsort(values, kind="quicksort")
    ordered = values[perm]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    first = np.minimum.reduceat(perm, starts)
    counts = np.diff(np.append(starts, len(values)))
    met = np.argsort(first)
    return ordered[starts][met], counts[met]


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


class _Vocabulary:
    """Integer ids for the features (tokens and n-grams) met so far, and each one's packed (bucket, sign) code: a
    text's features are then counted as ids with numpy, and every distinct feature is hashed once. An n-gram's id
    is keyed by its first n - 1 tokens' id and its last token's id (no token holds a space, so that pair and the
    n-gram's text determine each other)."""

    def __init__(self, dim: int):
        self.dim = dim
        self.ids: dict[str | int, int] = {}   # token -> id; (prefix id << 32) | last token's id -> n-gram id
        self.texts: list[str] = []             # id -> the feature as hashed
        self.codes = np.zeros(4096, np.int64)  # id -> pack_bucket_and_sign of its text

    def __len__(self) -> int:
        return len(self.texts)

    def _add(self, key: str | int, text: str) -> int:
        new = len(self.texts)
        if new == len(self.codes):
            self.codes = np.concatenate([self.codes, np.zeros_like(self.codes)])
        self.codes[new] = pack_bucket_and_sign(*feature_bucket_and_sign(text, self.dim))
        self.ids[key] = new
        self.texts.append(text)
        return new

    def token_ids(self, tokens: Sequence[str]) -> np.ndarray:
        """(T,) int64 ids of `tokens`."""
        return self._ids(tokens, lambda token: token)

    def extended(self, prefixes: np.ndarray, last: np.ndarray) -> np.ndarray:
        """(K,) int64 ids of the n-grams made of the (n - 1)-grams `prefixes` (K,) followed by the tokens `last`."""
        return self._ids(((prefixes << 32) | last).tolist(),
                         lambda key: f"{self.texts[key >> 32]} {self.texts[key & 0xFFFFFFFF]}")

    def _ids(self, keys: list, text_of: Callable[[str | int], str]) -> np.ndarray:
        found = list(map(self.ids.get, keys))
        try:   # the new features, found by C scans (one may repeat: added at its first place only)
            new = found.index(None)
            while True:
                key = keys[new]
                found[new] = self.ids[key] if key in self.ids else self._add(key, text_of(key))
                new = found.index(None, new + 1)
        except ValueError:   # none left
            pass
        return np.array(found, np.int64).reshape(len(keys))


class _Block:
    """One block's features: its tokens' ids (T,) and, for n = 2 .. the encoder's largest n, the ids of its own
    n-grams (T - n + 1,), those within the block (a state's n-grams across its blocks are made per state)."""

    def __init__(self, tokens: np.ndarray, vocabulary: _Vocabulary, largest: int):
        self.ngrams = [tokens]   # ngrams[n - 1]: the block's n-grams
        for n in range(2, largest + 1):   # an n-gram: an (n - 1)-gram, then the token after it
            self.ngrams.append(vocabulary.extended(self.ngrams[-1][:-1], tokens[n - 1:]))

    def __len__(self) -> int:
        return len(self.ngrams[0])


class _SharedFeatures:
    """The vocabulary and the recently seen blocks' features (LRU, up to BLOCK_CACHE_TOKENS) of one fingerprint,
    shared by every encoder of it under one lock, as the state vectors are (`_STATE_VECTORS`): a job loads a router,
    and so builds an encoder, for every checkpoint it scores, and each encoder tokenizing every block again was most
    of a rollout's serialization. Ids are the vocabulary's own: vectors do not depend on which encoder met a
    feature first (`_forget` starts a fresh one midway through a job, bit for bit the same vectors)."""

    def __init__(self, dim: int):
        self.vocabulary = _Vocabulary(dim)
        self.blocks: OrderedDict[str, _Block] = OrderedDict()   # block text -> its features (LRU)
        self.cached_tokens = 0
        self.lock = threading.Lock()   # the vocabulary and the block cache are shared by every caller


_SHARED: dict[str, _SharedFeatures] = {}
_SHARED_LOCK = threading.Lock()


def _shared_features(fingerprint: str, dim: int) -> _SharedFeatures:
    with _SHARED_LOCK:
        if fingerprint not in _SHARED:
            _SHARED[fingerprint] = _SharedFeatures(dim)
        return _SHARED[fingerprint]


class HashingEncoder:
    """Signed feature hashing of word n-grams with sublinear tf, L2-normalised.

    See the module docstring for the exact rule. The features are counted as integer ids (`_Vocabulary`), each
    block's tokens and n-grams made once (`_Block`, cached): the same vectors, bit for bit, as counting the joined
    n-gram strings (tests/test_encoders.py keeps that reference).
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
        self._shared = _shared_features(self.fingerprint, self.dim)   # every encoder of this fingerprint's

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
        with self._shared.lock:
            return len(self._block(text))

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(N, dim) float32, row i the L2-normalised hashed features of texts[i]. Each text is read as its blocks
        (split at BLOCK_SEPARATOR, see `encode_blocks`): blocks that repeat across texts (a conversation's states)
        are tokenized once."""
        return self._vectors([text.split(BLOCK_SEPARATOR) for text in as_text_list(texts)])

    def encode_blocks(self, states: Sequence[Sequence[str]]) -> np.ndarray:
        """`encode` of each state's blocks joined by BLOCK_SEPARATOR (`data.serialize.state_blocks`), the same vectors
        bit for bit, with each block's features reused from the cache: no token spans the whitespace separator, and
        lowercasing a block alone equals lowercasing it inside the joined text (the separator ends every case
        context), so the joined text's tokens are the blocks' tokens in order. A state encoded lately (by any encoder
        of this fingerprint) is read from the process's state cache (`STATE_CACHE_BYTES`)."""
        fingerprint = self.fingerprint
        states = [as_text_list(blocks) for blocks in states]
        keys = [(fingerprint, hashlib.blake2b(BLOCK_SEPARATOR.join(blocks).encode("utf-8"), digest_size=16).digest())
                for blocks in states]
        found = _STATE_VECTORS.get(keys)
        misses = {key: blocks for key, blocks in zip(keys, states) if key not in found}
        fresh = list(zip(misses, self._vectors(list(misses.values()))))
        found.update(fresh)
        _STATE_VECTORS.put(fresh)
        return np.array([found[key] for key in keys], np.float32).reshape(len(keys), self.dim)  # (N, dim), owned

    def _vectors(self, states: Sequence[Sequence[str]]) -> np.ndarray:
        """(N, dim) float32 vectors of states given as their blocks."""
        vectors = np.empty((len(states), self.dim), dtype=np.float32)  # (N, dim)
        with self._shared.lock:
            first, features, size = 0, [], 0
            for row, blocks in enumerate(states):
                forget = len(self._shared.vocabulary) > MAX_MEMO_ENTRIES   # bounded; never midway through a state
                if forget or size > COUNTED_TOGETHER:   # (counted with the ids' codes, before they are forgotten)
                    vectors[first:row] = self._normalised_vectors(features)
                    first, features, size = row, [], 0
                if forget:
                    self._forget()
                features.append(self._features([self._block(block) for block in blocks]))
                size += len(features[-1])
            vectors[first:] = self._normalised_vectors(features)
        return vectors

    def _normalised_vectors(self, features: Sequence[np.ndarray]) -> np.ndarray:
        """(K, dim) float32 vectors of K texts' features: normalised in float64 and cast once, so rounding does not
        depend on how many features a text has; a few texts at a time, so the float64 rows stay in the cache."""
        return l2_normalise_rows(self._unnormalised_vectors(features)).astype(np.float32)

    def _features(self, blocks: Sequence[_Block]) -> np.ndarray:
        """(F,) ids of the features of the blocks' joined text, with repeats: n-grams by n, then by position (the
        order the rule's Counter meets them in)."""
        low, high = self.ngram_range
        lengths = [len(block) for block in blocks]
        starts = np.cumsum([0] + lengths[:-1])
        ngrams = [np.concatenate([np.zeros(0, np.int64)] + [block.ngrams[0] for block in blocks])]  # [n - 1]: (T-n+1,)
        for n in range(2, high + 1):
            count = max(len(ngrams[0]) - n + 1, 0)
            ids, within = np.zeros(count, np.int64), np.zeros(count, bool)
            for start, block in zip(starts, blocks):
                own = block.ngrams[n - 1]
                ids[start:start + len(own)], within[start:start + len(own)] = own, True
            across = np.flatnonzero(~within)   # the n-grams that span a block boundary
            if across.size:
                ids[across] = self._shared.vocabulary.extended(ngrams[-1][across], ngrams[0][across + n - 1])
            ngrams.append(ids)
        return np.concatenate(ngrams[low - 1:high])

    def _unnormalised_vectors(self, features: Sequence[np.ndarray]) -> np.ndarray:
        """(K, dim) float64: per text (its (F_k,) feature ids), the sum of sign * (1 + ln count) over its distinct
        features, added in the order they first occur. The K texts are counted at once, as (text, feature) pairs in
        text order: every bucket of a text gets the same additions in the same order as counting the text alone."""
        width = len(self._shared.vocabulary)
        text = np.repeat(np.arange(len(features)), [len(f) for f in features])                      # (F,)
        pairs = text * width + np.concatenate([np.zeros(0, np.int64), *features])                   # (F,)
        distinct, counts = distinct_in_order_met(pairs)                                             # (U,), (U,)
        rows, ids = np.divmod(distinct, width)
        buckets, signs = unpack_bucket_and_sign(self._shared.vocabulary.codes[ids])
        tf_weights = 1.0 + np.log(counts.astype(np.float64))                                        # (U,)
        return np.bincount(rows * self.dim + buckets, weights=signs * tf_weights,
                           minlength=len(features) * self.dim).reshape(len(features), self.dim)

    def _block(self, block: str) -> _Block:
        """The features of `block`, from the LRU cache or made now (and cached while the budget allows). The caller
        holds the lock."""
        shared = self._shared
        found = shared.blocks.get(block)
        if found is not None:
            shared.blocks.move_to_end(block)
            return found
        made = _Block(shared.vocabulary.token_ids(self.tokenize(block)), shared.vocabulary, self.ngram_range[1])
        if len(made) <= BLOCK_CACHE_TOKENS:
            shared.blocks[block] = made
            shared.cached_tokens += len(made)
            while shared.cached_tokens > BLOCK_CACHE_TOKENS:
                _, dropped = shared.blocks.popitem(last=False)
                shared.cached_tokens -= len(dropped)
        return made

    def _forget(self) -> None:
        """A fresh vocabulary, and no cached block (their ids were the old vocabulary's)."""
        self._shared.vocabulary = _Vocabulary(self.dim)
        self._shared.blocks.clear()
        self._shared.cached_tokens = 0

    def __repr__(self) -> str:
        return f"HashingEncoder(dim={self.dim}, ngram_range={self.ngram_range}, lowercase={self.lowercase})"
