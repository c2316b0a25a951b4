"""Exact prefix reuse for a causal last-token encoder (Qwen3-Embedding): planning and packing its rows.

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
causal attention for the host, the rule above for the tails, and causal among padding slots only;
`scatter_members` puts each branch's end-token state back at its texts' input indices.

Pure numpy on token ids: the encoder (qwen3.py) imports this module, never the other way round. What reuse saves on
the MINT logs is measured by rivet_jax/bench/prefix_reuse_report.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

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


def pack_reuse_batch(rows: Sequence[ReuseRow], pad: int, num_rows: int, pad_id: int) -> tuple[np.ndarray, ...]:
    """pack_reuse_rows with the end-slot count S rounded up to a power of two, like the row count, so a batch of
    rows compiles to one of few (rows, pad, S) shapes."""
    num_slots = 1 << (max(len(row.branches) for row in rows) - 1).bit_length()
    return pack_reuse_rows(rows, pad, num_rows, num_slots, pad_id)


def scatter_members(out: np.ndarray, row: ReuseRow, states: np.ndarray) -> None:
    """Write branch k's end-token state states[k] (of (S, D)) into out[i] for every input index i it stands for."""
    for branch, state in zip(row.branches, states):
        out[list(branch.members)] = state
