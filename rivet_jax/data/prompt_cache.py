"""What a prompt cache saves the next call, known before it is made (issue 44).

A provider bills the part of a prompt it has cached from the same model's previous call at the cached-input price
(`ModelCard.call_cost`). Before a turn the router knows which model served the previous turn and how long that
prompt was; the state text stays identity-blind (Assumption A.2 (iii)), so this enters as a per-candidate number
instead: `call_savings`, the dollars (in units of c_ref) that calling each candidate saves because its cache holds
the previous prompt. Only the previous turn's model holds it, and only where its card prices cached tokens.

A cache-aware router (`config.model.cache_aware`) uses it in the exact form RouteSim's dynamic programme has: the
saving is part of this turn's known reward, and nothing else about the cache changes what happens next (the model
called is what decides who holds the cache after the turn), so

    Q_route(s, m) = Q_net(s, m) + lambda x saving(s, m)

with the network learning Q_net on targets without the saving it knew (`losses.rivet_loss`) and the router adding
it back when it scores (`Router.scores`). A cache-blind router is today's: it cannot tell who holds the cache.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rivet_jax.data.schema import Episode, ModelPool, Turn

__all__ = ["cache_aware", "saving_per_token", "call_savings", "episode_savings"]


def cache_aware(config) -> bool:
    """Whether `config`'s runs add what a prompt cache saves to Q_route (`config.model.cache_aware`; older configs
    have no such setting: cache-blind)."""
    return bool(config.model.get("cache_aware", False))


def saving_per_token(pool: ModelPool) -> np.ndarray:
    """(M,) dollars a cached prompt token saves on each model: its price for a token sent past the cache (the
    cache-write price where it has one, else the input price) less its cached-input price; 0 without one."""
    saved = []
    for card in pool.cards:
        if card.price_cached_in_per_mtok is None or card.price_in_per_mtok is None:
            saved.append(0.0)
            continue
        saved.append(max(card.cache_write_price - card.cache_read_price, 0.0) / 1e6)
    return np.array(saved)


def call_savings(previous: Turn | Mapping | None, pool: ModelPool, c_ref: float,
                 per_token: np.ndarray | None = None) -> np.ndarray:
    """(M,) float32: what calling each model next saves, in units of c_ref, after the turn `previous` (a `Turn`,
    or a history's mapping; None: the first turn, nothing cached). A previous turn without its model or prompt tokens
    (a history that lacks them) saves nothing."""
    savings = np.zeros(len(pool), np.float32)
    read = previous.get if isinstance(previous, Mapping) else lambda key: getattr(previous, key, None)
    model, prompt_tokens = read("model"), read("prompt_tokens")
    if not isinstance(model, str) or model not in pool or not isinstance(prompt_tokens, int):
        return savings
    per_token = saving_per_token(pool) if per_token is None else per_token
    m = pool.index(model)
    savings[m] = per_token[m] * prompt_tokens / c_ref
    return savings


def episode_savings(episode: Episode, pool: ModelPool, c_ref: float, per_token: np.ndarray | None = None
                    ) -> np.ndarray:
    """(T + 1, M) float32 `call_savings` at each state s_0 .. s_T of an episode (s_T: after its last turn)."""
    per_token = saving_per_token(pool) if per_token is None else per_token
    previous: Sequence[Turn | None] = (None, *episode.turns)
    return np.stack([call_savings(turn, pool, c_ref, per_token) for turn in previous])
