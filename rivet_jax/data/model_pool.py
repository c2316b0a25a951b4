"""Model cards and the ordered model pool they form, with the strict card-file reader and writer.

Model cards (`read_model_cards` / `write_model_cards`) are one JSON document::

    {"note": "...", "models": [{"name": "m-small", "provider": "Acme", "family": "...",
      "open_weights": true, "context_length": 8192, "price_in_per_mtok": 0.5,
      "price_out_per_mtok": 1.5, "price_cached_in_per_mtok": 0.05, "capabilities": {"tool_use": true,
      "code": true, "math": null}, "parameters_b": 13, "description": "..."}, ...]}

"family" (the model family, e.g. "Llama-2"), "open_weights" and "parameters_b" (billions of parameters) are
structured fields the card prior reads (`rivet_jax.card_prior`), never the router's network.
"price_cached_in_per_mtok" (USD per million prompt tokens read from the provider's prompt cache, OpenAI's "cached
input", Anthropic's "cache hits") and "price_cache_write_per_mtok" (per million prompt tokens written to the cache,
where the provider charges a premium for it) price a call's cached tokens (`ModelCard.call_cost`); without them a
cached token costs the input price, as before caching was known. A top-level "note" is accepted and ignored;
`null` (or a missing key) means unknown. Any other key, and a key given twice, is a DataError: a typo'd
"pirce_in_per_mtok" would otherwise be read as an unknown price, and of a repeated key only the last value would
be. Importers usually take these names
from `rivet_jax.data.schema`, which re-exports them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rivet_jax.data.files import PathLike, atomic_write_text, read_json_document
from rivet_jax.data.validation import (
    MISSING, Where, as_bool, as_int, as_number, as_str, optional, reject_unknown_keys,
    require_field, require_object, wrong_type,
)

__all__ = ["ModelCard", "ModelPool", "read_model_cards", "write_model_cards"]

_CARD_KEYS = ("name", "description", "provider", "context_length", "price_in_per_mtok", "price_out_per_mtok",
              "price_cached_in_per_mtok", "price_cache_write_per_mtok", "capabilities", "family", "open_weights",
              "parameters_b")
_POOL_KEYS = ("models", "note")
# What the card prior alone reads, never the network: a checkpoint saved before they were read (null there) or with
# other values still scores every model exactly as it was trained to.
PRIOR_ONLY_FIELDS = ("family", "open_weights", "parameters_b")
# What only prices a call's cached prompt tokens, never the network's input: cards gaining them keep their checkpoints.
CACHE_PRICE_FIELDS = ("price_cached_in_per_mtok", "price_cache_write_per_mtok")


@dataclasses.dataclass(frozen=True)
class ModelCard:
    """What the router may know about one candidate model (its 'card')."""

    name: str
    description: str
    context_length: int | None = None
    price_in_per_mtok: float | None = None  # USD per million prompt tokens
    price_out_per_mtok: float | None = None  # USD per million completion tokens
    capabilities: tuple[tuple[str, bool | None], ...] = ()  # sorted (flag, value); None = unknown
    provider: str | None = None
    family: str | None = None        # the model family ("Llama-2"): the card prior's, not the network's input
    open_weights: bool | None = None
    parameters_b: float | None = None  # billions of parameters (total, for a mixture of experts)
    price_cached_in_per_mtok: float | None = None   # USD per million prompt tokens read from the prompt cache
    price_cache_write_per_mtok: float | None = None  # USD per million prompt tokens written to it

    def call_cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
                  cache_write_tokens: int = 0) -> float | None:
        """USD of one call: the prompt's uncached tokens at the input price, its cached (read) and cache-written
        tokens at their prices (the input price where the card has none), the completion at the output price.
        `cached_tokens` and `cache_write_tokens` are parts of `prompt_tokens`. None when the card lacks the input
        or the output price."""
        if self.price_in_per_mtok is None or self.price_out_per_mtok is None:
            return None
        if cached_tokens < 0 or cache_write_tokens < 0 or cached_tokens + cache_write_tokens > prompt_tokens:
            raise ValueError(f"cached ({cached_tokens}) and cache-written ({cache_write_tokens}) tokens must be "
                             f"parts of the {prompt_tokens} prompt tokens")
        fresh = prompt_tokens - cached_tokens - cache_write_tokens
        return (self.price_in_per_mtok * fresh + self.cache_read_price * cached_tokens
                + self.cache_write_price * cache_write_tokens + self.price_out_per_mtok * completion_tokens) / 1e6

    @property
    def cache_read_price(self) -> float | None:
        """USD per million prompt tokens read from the cache: the cached-input price, else the input price."""
        return self.price_in_per_mtok if self.price_cached_in_per_mtok is None else self.price_cached_in_per_mtok

    @property
    def cache_write_price(self) -> float | None:
        """USD per million prompt tokens written to the cache: the cache-write price, else the input price."""
        return self.price_in_per_mtok if self.price_cache_write_per_mtok is None else self.price_cache_write_per_mtok

    def __post_init__(self):
        # Sorted pairs keep equality and hashing independent of the JSON key order.
        pairs = self.capabilities
        if isinstance(pairs, Mapping):
            pairs = pairs.items()
        ordered = sorted(((str(flag), value) for flag, value in pairs), key=lambda kv: kv[0])
        object.__setattr__(self, "capabilities", tuple(ordered))

    def capability(self, flag: str) -> bool | None:
        """The flag's value; None when it is unknown or not listed at all."""
        return dict(self.capabilities).get(flag)

    def to_json(self) -> dict:
        structured = {key: getattr(self, key) for key in (*PRIOR_ONLY_FIELDS, *CACHE_PRICE_FIELDS)}
        return {
            "name": self.name,
            "provider": self.provider,
            "context_length": self.context_length,
            "price_in_per_mtok": self.price_in_per_mtok,
            "price_out_per_mtok": self.price_out_per_mtok,
            "capabilities": dict(self.capabilities),
            # written only where known: a card without them keeps the JSON (and file digest) it always had
            **{key: value for key, value in structured.items() if value is not None},
            "description": self.description,
        }

    @classmethod
    def from_json(
        cls, obj: Any, *, path: str = "<memory>", line: int | None = None, prefix: str = ""
    ) -> ModelCard:
        """Parse one card; a key outside `_CARD_KEYS` is a DataError that suggests the closest known key."""
        where = Where(path, line)
        obj = require_object(obj, where, prefix.rstrip(".") or "<record>")
        reject_unknown_keys(obj, _CARD_KEYS, where, prefix)

        def field(key: str) -> Any:
            return obj.get(key, MISSING)

        capabilities_obj = field("capabilities")
        capabilities: list[tuple[str, bool | None]] = []
        if capabilities_obj is not MISSING and capabilities_obj is not None:
            capabilities_obj = require_object(capabilities_obj, where, prefix + "capabilities")
            for flag, value in capabilities_obj.items():
                flag_field = f"{prefix}capabilities.{flag}"
                capabilities.append((flag, optional(value, as_bool, where, flag_field)))
        return cls(
            name=as_str(require_field(obj, "name", where, prefix), where, prefix + "name", non_empty=True),
            description=as_str(
                require_field(obj, "description", where, prefix), where, prefix + "description"
            ),
            context_length=optional(
                field("context_length"), as_int, where, prefix + "context_length", minimum=1
            ),
            price_in_per_mtok=optional(
                field("price_in_per_mtok"), as_number, where, prefix + "price_in_per_mtok",
                minimum=0.0,
            ),
            price_out_per_mtok=optional(
                field("price_out_per_mtok"), as_number, where, prefix + "price_out_per_mtok",
                minimum=0.0,
            ),
            capabilities=tuple(capabilities),
            provider=optional(field("provider"), as_str, where, prefix + "provider"),
            family=optional(field("family"), as_str, where, prefix + "family"),
            open_weights=optional(field("open_weights"), as_bool, where, prefix + "open_weights"),
            parameters_b=optional(field("parameters_b"), as_number, where, prefix + "parameters_b", minimum=0.0),
            **{key: optional(field(key), as_number, where, prefix + key, minimum=0.0) for key in CACHE_PRICE_FIELDS},
        )


def _check_pool_cards(cards: Sequence[Any], where: Where) -> None:
    """A pool needs at least one card and unique names (names are the routing targets)."""
    if not cards:
        raise where.error("models", "a model pool needs at least one model card")
    first_index: dict[str, int] = {}
    for i, card in enumerate(cards):
        if not isinstance(card, ModelCard):
            raise wrong_type(where, f"models[{i}]", "ModelCard", card)
        if card.name != card.name.strip():
            raise where.error(f"models[{i}].name", f"'{card.name}' begins or ends with white space: a name that "
                                                   f"looks like another is a second model; remove it")
        if card.name in first_index:
            raise where.error(
                f"models[{i}].name",
                f"duplicate model name '{card.name}' (also models[{first_index[card.name]}])",
            )
        first_index[card.name] = i


@dataclasses.dataclass(frozen=True)
class ModelPool:
    """The ordered set of candidate models; a model's index is its action id."""

    cards: tuple[ModelCard, ...]

    def __post_init__(self):
        object.__setattr__(self, "cards", tuple(self.cards))
        _check_pool_cards(self.cards, Where("<memory>", None))

    # Computed once: scoring or estimating at 10^4-10^5 logged states asks for them millions of times (building the
    # tuple on every call took 58 of launch.evaluate_logs' 92 profiled seconds of policy choices on the 49-model pool).
    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(card.name for card in self.cards)

    @functools.cached_property
    def _positions(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.names)}

    def index(self, name: str) -> int:
        position = self._positions.get(name) if isinstance(name, str) else None
        if position is None:
            raise KeyError(f"unknown model '{name}'; the pool has: {', '.join(self.names)}")
        return position

    def __len__(self) -> int:
        return len(self.cards)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._positions

    @property
    def capability_names(self) -> tuple[str, ...]:
        return tuple(sorted({flag for card in self.cards for flag, _ in card.capabilities}))

    def subset(self, names: Iterable[str]) -> ModelPool:
        """A pool of the named models, in the order given (KeyError for unknown names)."""
        return ModelPool(tuple(self.cards[self.index(name)] for name in names))

    def to_json(self) -> dict:
        return {"models": [card.to_json() for card in self.cards]}

    @classmethod
    def from_json(cls, obj: Any, *, path: str = "<memory>") -> ModelPool:
        where = Where(path, None)
        obj = require_object(obj, where, "<record>")
        reject_unknown_keys(obj, _POOL_KEYS, where, "")
        models = require_field(obj, "models", where, "")
        if not isinstance(models, list):
            raise wrong_type(where, "models", "list", models)
        cards = tuple(
            ModelCard.from_json(card, path=path, prefix=f"models[{i}].")
            for i, card in enumerate(models)
        )
        # Checked here too so the error names the file rather than "<memory>".
        _check_pool_cards(cards, where)
        return cls(cards)

    def differences(self, other: ModelPool) -> list[str]:
        """Human-readable differences (e.g. a checkpoint's pool vs. the current one)."""
        diffs: list[str] = []
        mine, theirs = set(self.names), set(other.names)
        diffs += [f"model '{n}' only in this pool" for n in self.names if n not in theirs]
        diffs += [f"model '{n}' only in the other pool" for n in other.names if n not in mine]
        shared_here = [n for n in self.names if n in theirs]
        shared_there = [n for n in other.names if n in mine]
        if shared_here != shared_there:
            # Order matters: a model's index is its action id.
            diffs.append(f"model order differs: {shared_here} != {shared_there}")
        for name in shared_here:
            diffs += _card_differences(self.cards[self.index(name)], other.cards[other.index(name)])
        return diffs


def _card_differences(mine: ModelCard, theirs: ModelCard) -> list[str]:
    diffs = []
    for f in dataclasses.fields(ModelCard):
        if f.name in ("name", "capabilities", *PRIOR_ONLY_FIELDS, *CACHE_PRICE_FIELDS):
            continue
        a, b = getattr(mine, f.name), getattr(theirs, f.name)
        if a == b:
            continue
        if f.name == "description":  # long text: just say it changed
            diffs.append(f"model '{mine.name}': description differs")
        else:
            diffs.append(f"model '{mine.name}': {f.name} {a!r} != {b!r}")
    caps_a, caps_b = dict(mine.capabilities), dict(theirs.capabilities)
    for flag in sorted(caps_a.keys() | caps_b.keys()):
        a, b = caps_a.get(flag, MISSING), caps_b.get(flag, MISSING)
        if a != b:
            show = lambda v: "absent" if v is MISSING else repr(v)  # noqa: E731
            diffs.append(f"model '{mine.name}': capability '{flag}' {show(a)} != {show(b)}")
    return diffs


def read_model_cards(path: PathLike) -> ModelPool:
    """Read a model-card JSON document (see the module docstring) into a ModelPool."""
    return ModelPool.from_json(read_json_document(path), path=os.fspath(path))


def write_model_cards(path: PathLike, pool: ModelPool) -> None:
    text = json.dumps(pool.to_json(), indent=1, ensure_ascii=False, allow_nan=False)
    atomic_write_text(path, text + "\n")
