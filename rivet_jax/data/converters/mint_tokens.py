"""Token counts for MINT's messages, and the exact integer split used to rescale them to logged totals.

MINT's logs only hold per-episode token totals, so the converter counts every message with a real tokenizer
(`default_token_counter`: the all-MiniLM-L6-v2 WordPiece tokenizer, no truncation, no special tokens) and, where
totals were recorded, rescales the counts with `apportion` so that they add up exactly to them. The manifest uses
`apportion` too, to spread the validation tasks over the subsets.

The tokenizer ships with the package (`minilm_tokenizer.json.xz`: all-MiniLM-L6-v2's tokenizer.json, Apache-2.0,
xz-compressed), read by the `tokenizers` library, so converting MINT needs neither the model's weights nor
transformers; its counts equal the checkpoint's own fast tokenizer's (tests/test_mint.py compares them).
"""

from __future__ import annotations

import functools
import importlib.resources
import lzma
import os
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["TokenCounter", "WordPieceCounter", "default_token_counter", "count_all", "apportion"]

TokenCounter = Callable[[str], int]
TOKENIZER_FILE = "minilm_tokenizer.json.xz"
ENCODED_PER_CALL = 2048  # texts per tokenizer call (WordPieceCounter.token_ids)


class WordPieceCounter:
    """Token counts from a Hugging Face `tokenizer.json` (a `tokenizers.Tokenizer`): no truncation, no padding, no
    special tokens.

    `count_many` encodes a whole list at once; the converter uses it when a counter has it, because one call per
    message is what would make converting the corpus slow.
    """

    def __init__(self, tokenizer_json: str):
        from tokenizers import Tokenizer  # deferred: only the MINT converter counts tokens

        self._tokenizer = Tokenizer.from_str(tokenizer_json)
        self._tokenizer.no_truncation()  # counting texts longer than the model's 512-token window is the point
        self._tokenizer.no_padding()

    @classmethod
    def from_directory(cls, model_dir: str | os.PathLike) -> "WordPieceCounter":
        """The tokenizer of a local Hugging Face checkpoint directory (its tokenizer.json)."""
        return cls((Path(model_dir) / "tokenizer.json").read_text(encoding="utf-8"))

    def __call__(self, text: str) -> int:
        return self.count_many([text])[0]

    def count_many(self, texts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self.token_ids(texts)]

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's WordPiece ids (no special tokens), encoded `ENCODED_PER_CALL` texts at a time: an encoding
        also holds every token's string, offsets and masks, so one call on the large pool's ~180,000 messages held
        about 3 GB at once for a result of a few hundred MB."""
        return [encoding.ids for start in range(0, len(texts), ENCODED_PER_CALL)
                for encoding in self._tokenizer.encode_batch(list(texts[start:start + ENCODED_PER_CALL]),
                                                             add_special_tokens=False)]


@functools.lru_cache(maxsize=1)
def default_token_counter() -> WordPieceCounter:
    """The all-MiniLM-L6-v2 WordPiece tokenizer shipped with the package (loaded once)."""
    packed = importlib.resources.files(__package__).joinpath(TOKENIZER_FILE).read_bytes()
    return WordPieceCounter(lzma.decompress(packed).decode("utf-8"))


def count_all(texts: Sequence[str], count_tokens: TokenCounter) -> list[int]:
    """The texts' token counts; one batched `count_many` call when the counter has it (see WordPieceCounter)."""
    count_many = getattr(count_tokens, "count_many", None)
    counts = list(count_many(texts)) if count_many is not None else [count_tokens(t) for t in texts]
    for text, n in zip(texts, counts):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"count_tokens returned {n!r} (expected an int >= 0) for {text[:60]!r}")
    return counts


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """Integers proportional to `weights` that add up exactly to `total` (largest remainder, ties to the first).

    Exact integer arithmetic, so the sum never drifts. All-zero weights share the total equally.
    """
    if not weights:
        if total:
            raise ValueError(f"cannot split {total} over no items")
        return []
    if sum(weights) == 0:
        weights = [1] * len(weights)
    denominator = sum(weights)
    shares = [total * w // denominator for w in weights]
    remainders = [total * w % denominator for w in weights]
    left = total - sum(shares)
    for i in sorted(range(len(weights)), key=lambda i: (-remainders[i], i))[:left]:
        shares[i] += 1
    return shares
