"""What a routing request carries, checked: the turns so far (`Turn`s, or mappings with a response and feedback, as
a proxy's conversation gives them) and the models it may call, as a mask over the router's pool."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, Sequence

import numpy as np

from rivet_jax.data.schema import ModelPool, Turn

HistoryTurn = Turn | Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class _HistoryItem:
    response: str
    feedback: str


def as_history(history: Sequence[HistoryTurn]) -> list[Turn | _HistoryItem]:
    """`history` as items with `.response` and `.feedback`: Turns as they are, mappings checked and converted."""
    items = []
    for i, turn in enumerate(history):
        if isinstance(turn, Turn):
            items.append(turn)
        elif isinstance(turn, Mapping) and "response" in turn:
            response, feedback = turn["response"], turn.get("feedback", "")
            for field, value in (("response", response), ("feedback", feedback)):
                if not isinstance(value, str):  # str(None) would route on the text "None"
                    raise TypeError(f"history[{i}]['{field}'] must be a string, got {type(value).__name__}")
            items.append(_HistoryItem(response, feedback))
        else:
            raise TypeError(f"history[{i}] must be a Turn or a mapping with 'response' (and 'feedback'), "
                            f"got {type(turn).__name__}")
    return items


def availability_masks(pool: ModelPool, available: Sequence[Iterable[str] | None]) -> np.ndarray:
    """(B, M) `availability_mask` of each state's names, each distinct list checked and made once (a rollout's
    states mostly share one)."""
    made: dict[tuple, np.ndarray] = {}

    def mask_of(names) -> np.ndarray:
        if names is None or isinstance(names, (str, bytes)):
            return availability_mask(pool, names)
        names = tuple(names)   # (a generator read once, here)
        try:
            if names not in made:
                made[names] = availability_mask(pool, names)
            return made[names]
        except TypeError:   # an unhashable name: availability_mask says what is wrong with it
            return availability_mask(pool, names)

    return np.stack([mask_of(names) for names in available])


def availability_mask(pool: ModelPool, available: Iterable[str] | None) -> np.ndarray:
    """(M,) bool over the pool; None = every model. Unknown names and an empty set are errors.

    `available` may be any iterable of names (a generator is read once, here), but not a single string."""
    if available is None:
        return np.ones(len(pool), bool)
    if isinstance(available, (str, bytes)):
        raise TypeError(f"available must be a collection of model names, not one string: {available!r}")
    available = list(available)
    unknown = [name for name in available if not isinstance(name, str) or name not in pool]
    if unknown:
        raise ValueError(f"unknown models {unknown}; this router's pool is {list(pool.names)}")
    if not available:
        raise ValueError("no available model to route to")
    mask = np.zeros(len(pool), bool)
    mask[[pool.index(name) for name in available]] = True
    return mask
