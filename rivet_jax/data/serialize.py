"""State serialization (Sec. 4.1, App. B.3): the text a frozen encoder turns into h_t.

A state s_t = (task, history before turn t). Its text keeps the task, the two latest complete turns, and earlier
turns while a token budget allows, dropping the earliest first. A turn is the response a model gave and the
environment's feedback to it; which model answered is never written (Assumption A.2 (iii): the continuation policy
must not read model identities, and the router must be able to judge a history it did not produce).

Serialization is a pure function of its arguments, so the same history always gives the same text and hence the
same cached embedding; the state after turn t of an episode is exactly the state before turn t+1.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

from rivet_jax.data.schema import Turn

TokenCounter = Callable[[str], int]

DEFAULT_MAX_TOKENS = 16_384
ALWAYS_KEPT_TURNS = 2  # the two latest complete turns are kept whatever their length
BLOCK_SEPARATOR = "\n\n"


# Memoised: a conversation's states repeat its blocks, and a block made once keeps its string hash for every
# lookup that follows (token counts, the encoder's block cache).
@functools.lru_cache(maxsize=4096)
def _task_block(prompt: str) -> str:
    return f"Task:\n{prompt}"


@functools.lru_cache(maxsize=65536)
def _turn_block(number: int, response: str, feedback: str) -> str:
    # 1-based turn numbers keep position information even when earlier turns are dropped.
    return f"Turn {number} response:\n{response}\nTurn {number} feedback:\n{feedback}"


def _omitted_block(count: int) -> str:
    return f"[{count} earlier turn{'s' if count != 1 else ''} omitted]"


def serialize_state(
    task_prompt: str,
    history: Sequence[Turn],
    count_tokens: TokenCounter,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> str:
    """Text of the state before the next call: task + history, newest turns kept first (`state_blocks` joined)."""
    return BLOCK_SEPARATOR.join(state_blocks(task_prompt, history, count_tokens, max_tokens))


def state_blocks(
    task_prompt: str,
    history: Sequence[Turn],
    count_tokens: TokenCounter,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> list[str]:
    """The blocks the state's text joins with BLOCK_SEPARATOR: the task, an omission note if earlier turns were
    dropped, then one block per kept turn. A growing conversation's states share most of their blocks, which an
    encoder may use (`HashingEncoder.encode_blocks`).

    Args:
        task_prompt: the task text.
        history: completed turns so far, oldest first (may be empty at the first turn).
        count_tokens: the encoder's token counter; the budget is measured with it.
        max_tokens: budget for the whole text. The task and the two latest turns are always kept, so a text can
            exceed it when those alone do; earlier turns are added newest-first while the total stays within it.
    """
    blocks = [_turn_block(i + 1, t.response, t.feedback) for i, t in enumerate(history)]
    kept_from = max(len(blocks) - ALWAYS_KEPT_TURNS, 0)
    used = count_tokens(_task_block(task_prompt)) + sum(count_tokens(b) for b in blocks[kept_from:])
    while kept_from > 0:
        cost = count_tokens(blocks[kept_from - 1])
        if used + cost > max_tokens:
            break
        used += cost
        kept_from -= 1
    parts = [_task_block(task_prompt)]
    if kept_from > 0:
        parts.append(_omitted_block(kept_from))
    parts.extend(blocks[kept_from:])
    return parts


def episode_state_texts(
    task_prompt: str,
    turns: Sequence[Turn],
    count_tokens: TokenCounter,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> list[str]:
    """States s_1 .. s_{T+1} of an episode with T turns: the state before each turn, then the final state."""
    return [serialize_state(task_prompt, turns[:t], count_tokens, max_tokens) for t in range(len(turns) + 1)]
