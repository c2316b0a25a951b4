"""What the converters share: reading JSON files as `DataError`s, pool names, and a turn's tokens and cost.

Every converter reports a malformed input as `DataError(file, line, field, why)`, the field being the path in the
*input* (`messages[3].usage.prompt_tokens`), so that the error points at what to fix in the source logs rather than
at the schema record it would have become.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

from rivet_jax.data.files import decode_line, numbered_lines
from rivet_jax.data.model_pool import ModelCard, ModelPool
from rivet_jax.data.schema import Episode
from rivet_jax.data.validation import (
    MISSING, DataError, Where, as_int, as_number, as_str, parse_json, require_field, require_object,
)

__all__ = ["Conversion", "read_jsonl", "pool_model", "tokens_and_cost"]


@dataclasses.dataclass(frozen=True)
class Conversion:
    """A converter's episodes, with what it had to decide or leave out (one line each, for the launcher)."""

    episodes: list[Episode]
    notes: list[str]


def read_jsonl(path: str | os.PathLike, skipped: list[DataError] | None = None) -> Iterator[tuple[Where, Any]]:
    """(where, parsed object) per non-blank line; DataError for unreadable files and invalid JSON (a line that is
    not JSON or not UTF-8 appended to `skipped` instead, when a list is given: skip mode)."""
    for where, raw in numbered_lines(os.fspath(path)):
        try:
            text = decode_line(raw, where)
            if not text.strip():
                continue
            record = parse_json(text, where)
        except DataError as error:
            if skipped is None:
                raise
            skipped.append(error)
            continue
        yield where, record


def pool_model(value: Any, pool: ModelPool, where: Where, field: str) -> ModelCard:
    """The card of the model named by `value`; a name outside the pool is a DataError listing the pool."""
    name = as_str(value, where, field, non_empty=True)
    if name not in pool:
        raise where.error(field, f"unknown model '{name}'; the pool has: {', '.join(pool.names)}")
    return pool.cards[pool.index(name)]


def tokens_and_cost(usage: Any, card: ModelCard, where: Where, field: str) -> tuple[int, int, float]:
    """(prompt_tokens, completion_tokens, cost in USD) of one call from its `usage` object.

    The cost is `usage.cost` where the provider logged it (what was billed), else computed from the card's prices
    per million tokens. Neither: a DataError, since a turn priced at 0 would teach the router that the model is free.
    """
    usage = require_object(usage, where, field)
    prefix = field + "."
    prompt = as_int(require_field(usage, "prompt_tokens", where, prefix), where, prefix + "prompt_tokens", minimum=0)
    completion = as_int(require_field(usage, "completion_tokens", where, prefix), where, prefix + "completion_tokens",
                        minimum=0)
    logged = usage.get("cost", MISSING)
    if logged is not MISSING and logged is not None:
        return prompt, completion, as_number(logged, where, prefix + "cost", minimum=0.0)
    if card.price_in_per_mtok is None or card.price_out_per_mtok is None:
        raise where.error(prefix + "cost", f"no cost logged, and the card of '{card.name}' lacks price_in_per_mtok "
                                           "or price_out_per_mtok to compute it from the tokens")
    return prompt, completion, (card.price_in_per_mtok * prompt + card.price_out_per_mtok * completion) / 1e6
