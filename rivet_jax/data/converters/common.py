"""What the converters share: reading JSON files as `DataError`s, pool names, and a turn's tokens and cost.

Every converter reports a malformed input as `DataError(file, line, field, why)`, the field being the path in the
*input* (`messages[3].usage.prompt_tokens`), so that the error points at what to fix in the source logs rather than
at the schema record it would have become.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from typing import Any

from rivet_jax.data.files import decode_line, numbered_lines
from rivet_jax.data.model_pool import ModelCard, ModelPool
from rivet_jax.data.schema import Episode
from rivet_jax.data.validation import (
    MISSING, DataError, Where, as_int, as_number, as_str, optional, parse_json, require_field, require_object,
)

__all__ = ["CallUsage", "Conversion", "read_jsonl", "pool_model", "tokens_and_cost"]


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


@dataclasses.dataclass(frozen=True)
class CallUsage:
    """One call's tokens and what it cost; the cache counts are parts of `prompt_tokens` (None: not reported)."""

    prompt_tokens: int
    completion_tokens: int
    cost: float  # USD
    cached_tokens: int | None = None       # read from the provider's prompt cache
    cache_write_tokens: int | None = None  # written to it

    def turn_fields(self) -> dict[str, Any]:
        """The `Turn` fields it fills."""
        return dataclasses.asdict(self)


def _count(usage: Mapping, key: str, where: Where, field: str) -> int | None:
    return optional(usage.get(key, MISSING), as_int, where, field + key, minimum=0)


def tokens_and_cost(usage: Any, card: ModelCard, where: Where, field: str) -> CallUsage:
    """The tokens and cost of one call from its `usage` object, in OpenAI's shape (`prompt_tokens`,
    `completion_tokens`, the cached part in `prompt_tokens_details.cached_tokens`; gateways that pass Anthropic's
    counts on add `cache_read_input_tokens` and `cache_creation_input_tokens`, parts of `prompt_tokens`) or in
    Anthropic's (`input_tokens` without the cache's tokens, `cache_read_input_tokens`, `cache_creation_input_tokens`,
    `output_tokens`).

    The cost is `usage.cost` where the provider logged it (what was billed), else the card's prices per million
    tokens, the cached tokens at its cached prices (`ModelCard.call_cost`). Neither: a DataError, since a turn priced
    at 0 would teach the router that the model is free.
    """
    usage = require_object(usage, where, field)
    prefix = field + "."
    read, written = (_count(usage, key, where, prefix) for key in ("cache_read_input_tokens",
                                                                   "cache_creation_input_tokens"))
    if "prompt_tokens" not in usage and "input_tokens" in usage:  # Anthropic's: the input excludes the cache's
        fresh = as_int(usage["input_tokens"], where, prefix + "input_tokens", minimum=0)
        prompt = fresh + (read or 0) + (written or 0)
        completion = as_int(require_field(usage, "output_tokens", where, prefix), where, prefix + "output_tokens",
                            minimum=0)
    else:
        prompt = as_int(require_field(usage, "prompt_tokens", where, prefix), where, prefix + "prompt_tokens",
                        minimum=0)
        completion = as_int(require_field(usage, "completion_tokens", where, prefix),
                            where, prefix + "completion_tokens", minimum=0)
        details = optional(usage.get("prompt_tokens_details", MISSING), require_object, where,
                           prefix + "prompt_tokens_details")
        cached = None if details is None else _count(details, "cached_tokens", where, prefix + "prompt_tokens_details.")
        read = read if cached is None else cached
        if (read or 0) + (written or 0) > prompt:
            raise where.error(prefix + "prompt_tokens", f"{prompt} tokens, fewer than the {read or 0} cached and "
                                                        f"{written or 0} cache-written tokens they include")
    logged = usage.get("cost", MISSING)
    if logged is not MISSING and logged is not None:
        return CallUsage(prompt, completion, as_number(logged, where, prefix + "cost", minimum=0.0), read, written)
    cost = card.call_cost(prompt, completion, read or 0, written or 0)
    if cost is None:
        raise where.error(prefix + "cost", f"no cost logged, and the card of '{card.name}' lacks price_in_per_mtok "
                                           "or price_out_per_mtok to compute it from the tokens")
    return CallUsage(prompt, completion, cost, read, written)
