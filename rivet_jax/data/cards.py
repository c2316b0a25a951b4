"""Structured model-card fields x_m and their missing-value mask (App. B.3).

Fixed, pool-independent transforms (log scales with constant offsets), so a card's features never depend on which
other models share the pool and a candidate subset at deployment sees exactly the features it was trained on.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from rivet_jax.data.schema import ModelCard, ModelPool

if TYPE_CHECKING:
    from rivet_jax.encoders.base import Encoder

# log10(context tokens): 4k -> -0.4, 100k -> 1.0 ; log10(USD per Mtok): $0.1 -> -0.5, $60 -> 0.9.
_CONTEXT_LOG10_CENTER = 4.0
_PRICE_LOG10_SCALE = 2.0


# What the card projector may read, by group: the description's embedding e_m and x_m's columns (context: 0,
# prices: 1-2, flags: the rest). `model.card_inputs` names the groups a network reads (an ablation leaves some out).
CARD_INPUTS = ("description", "context", "prices", "flags")
_COLUMNS = {"context": (0, 1), "prices": (1, 3), "flags": (3, None)}


def valid_card_inputs(value) -> bool:
    """Whether `value` names card input groups, each known and at most once."""
    return isinstance(value, (tuple, list)) and len(set(value)) == len(value) and set(value) <= set(CARD_INPUTS)


def input_columns(card_inputs: Sequence[str], num_features: int) -> np.ndarray:
    """(F,) float32: 1 on the x_m columns of the groups in `card_inputs`, 0 on the others (read as unknown)."""
    if not valid_card_inputs(card_inputs):
        raise ValueError(f"card inputs must be distinct groups among {', '.join(CARD_INPUTS)}; got {card_inputs!r}")
    keep = np.zeros(num_features, np.float32)
    for group in card_inputs:
        if group in _COLUMNS:
            keep[slice(*_COLUMNS[group])] = 1.0
    return keep


def feature_names(pool: ModelPool) -> tuple[str, ...]:
    return ("log_context_length", "log_price_in", "log_price_out",
            *(f"capability:{flag}" for flag in pool.capability_names))


def _log10_or_none(value: float | None, floor: float) -> float | None:
    return None if value is None else math.log10(max(value, floor))


def _card_row(card: ModelCard, capability_names: tuple[str, ...]) -> list[float | None]:
    context = _log10_or_none(card.context_length, 1.0)
    price_in = _log10_or_none(card.price_in_per_mtok, 1e-4)
    price_out = _log10_or_none(card.price_out_per_mtok, 1e-4)
    row = [None if context is None else context - _CONTEXT_LOG10_CENTER,
           None if price_in is None else price_in / _PRICE_LOG10_SCALE,
           None if price_out is None else price_out / _PRICE_LOG10_SCALE]
    for flag in capability_names:
        value = card.capability(flag)
        row.append(None if value is None else float(value))
    return row


def card_features(pool: ModelPool, capability_names: tuple[str, ...] | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Returns x (M, F) float32 with zeros where unknown, and mask (M, F) float32, 1 where the field is known.

    `capability_names`: the flags to read (default: the pool's own). A router scoring models it was not trained on
    reads their cards with the flags of the pool it was trained on, so F and each column's meaning stay its own."""
    flags = pool.capability_names if capability_names is None else capability_names
    rows = [_card_row(card, flags) for card in pool.cards]
    mask = np.array([[v is not None for v in row] for row in rows], np.float32)
    x = np.array([[0.0 if v is None else v for v in row] for row in rows], np.float32)
    return x, mask


def with_new_cards(pool: ModelPool, card_embeddings: np.ndarray, new_cards: Sequence[ModelCard],
                   encoder: Encoder) -> tuple[ModelPool, np.ndarray]:
    """(pool + new_cards, their card embeddings (M + K, D)) for a card-conditioned scorer trained on `pool`: the new
    models' descriptions embedded by its encoder. Read their fields with `card_features(extended, the trained
    pool's capability_names)`: models it was never trained on are then scored from their cards alone."""
    extended = ModelPool(pool.cards + tuple(new_cards))  # refuses a name the pool already has
    new = np.asarray(encoder.encode([card.description for card in new_cards]), np.float32)
    return extended, np.concatenate([np.asarray(card_embeddings, np.float32), new])


def placeholder_cards(pool: ModelPool, state_dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(e_m (M, D) zeros, x_m, mask): the cards' shapes and fields without their text embeddings, which is all
    parameter initialisation (and a shape-only restore target) needs."""
    card_x, card_mask = card_features(pool)
    return np.zeros((len(pool), state_dim), np.float32), card_x, card_mask
