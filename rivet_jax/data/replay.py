"""Logged episodes -> flat replay arrays (rewards Eq. 1, returns Eq. 2, Double-DQN bookkeeping).

Every text the networks read (states, next states, responses, model-card descriptions) is interned into one text
table, and the arrays hold indices into it; the encoder embeds each distinct text once. Because serialization is
deterministic, the next state of turn t *is* the state of turn t+1, so the two share a row of the table.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from rivet_jax.data.schema import Episode, ModelPool
from rivet_jax.data.serialize import TokenCounter, episode_state_texts


@dataclasses.dataclass(frozen=True)
class Replay:
    """One row per logged turn. N transitions, M pool models; text indices point into `texts`."""

    state: np.ndarray           # (N,) int32 text index of s_t
    next_state: np.ndarray      # (N,) int32 text index of s_{t+1} (the final state after a terminal turn)
    response: np.ndarray        # (N,) int32 text index of o_t
    action: np.ndarray          # (N,) int32 pool index of m_t
    reward: np.ndarray          # (N,) float32 r_t = -lambda c_t / c_ref + d_t y
    done: np.ndarray            # (N,) float32 d_t
    mc_return: np.ndarray       # (N,) float32 G_t = sum_k gamma^(k-t) r_k
    available: np.ndarray       # (N, M) bool, models that could be chosen at s_t
    next_available: np.ndarray  # (N, M) bool, models that could be chosen at s_{t+1} (all for terminal turns)
    episode: np.ndarray         # (N,) int32 index into episode_ids
    episode_ids: tuple[str, ...]
    texts: tuple[str, ...]      # the text table: states, responses, card descriptions
    card_text: np.ndarray       # (M,) int32 text index of each card's description

    def __len__(self) -> int:
        return int(self.state.shape[0])

    def arrays(self) -> dict[str, np.ndarray]:
        """The per-transition arrays, as a dict pytree (what training puts on device)."""
        names = ("state", "next_state", "response", "action", "reward", "done", "mc_return", "available",
                 "next_available")
        return {name: getattr(self, name) for name in names}


def reference_cost(episodes: Sequence[Episode]) -> float:
    """c_ref derived from a corpus: the mean per-turn cost, so that normalised costs are of order one."""
    costs = [turn.cost for episode in episodes for turn in episode.turns]
    c_ref = float(np.mean(costs)) if costs else 0.0
    if not (c_ref > 0 and math.isfinite(c_ref)):
        raise ValueError(f"cannot derive c_ref from this corpus: mean per-turn cost is {c_ref}; set config c_ref")
    return c_ref


def turn_rewards(costs: np.ndarray, outcome: int, lam: float, c_ref: float) -> np.ndarray:
    """Eq. 1 for one episode: r_t = -lambda c_t / c_ref + d_t y, the success paid on the terminal (last) turn."""
    rewards = -lam * np.asarray(costs, np.float64) / c_ref
    rewards[-1] += outcome
    return rewards


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """G_t = sum_{k >= t} gamma^(k-t) r_k for one episode (Eq. 2 read from turn t on)."""
    returns = np.zeros(len(rewards), np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        returns[t] = running
    return returns


class _TextTable:
    """Interns texts: the same string always gets the same index."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def add(self, text: str) -> int:
        return self.index.setdefault(text, len(self.index))

    def texts(self) -> tuple[str, ...]:
        return tuple(self.index)


def _availability(names: tuple[str, ...] | None, pool: ModelPool) -> np.ndarray:
    mask = np.zeros(len(pool), bool)
    if names is None:
        mask[:] = True
    else:
        mask[[pool.index(n) for n in names]] = True
    return mask


def build_replay(
    episodes: Sequence[Episode],
    pool: ModelPool,
    *,
    count_tokens: TokenCounter,
    max_tokens: int,
    lam: float,
    gamma: float,
    c_ref: float,
) -> Replay:
    """Flattens episodes into transitions. Episodes must already be validated against `pool`."""
    if not episodes:
        raise ValueError("no episodes: the corpus is empty")
    table = _TextTable()
    card_text = np.array([table.add(card.description) for card in pool.cards], np.int32)
    columns: dict[str, list] = {k: [] for k in ("state", "next_state", "response", "action", "reward", "done",
                                                 "mc_return", "available", "next_available", "episode")}
    for e_idx, episode in enumerate(episodes):
        states = [table.add(text) for text in
                  episode_state_texts(episode.task.prompt, episode.turns, count_tokens, max_tokens)]
        rewards = turn_rewards(np.array([t.cost for t in episode.turns]), episode.outcome, lam, c_ref)
        returns = discounted_returns(rewards, gamma)
        masks = [_availability(t.available, pool) for t in episode.turns] + [_availability(None, pool)]
        last = len(episode.turns) - 1
        for t, turn in enumerate(episode.turns):
            columns["state"].append(states[t])
            columns["next_state"].append(states[t + 1])
            columns["response"].append(table.add(turn.response))
            columns["action"].append(pool.index(turn.model))
            columns["reward"].append(rewards[t])
            columns["done"].append(float(t == last))
            columns["mc_return"].append(returns[t])
            columns["available"].append(masks[t])
            columns["next_available"].append(masks[t + 1])
            columns["episode"].append(e_idx)
    int_cols = ("state", "next_state", "response", "action", "episode")
    arrays = {k: np.asarray(v, np.int32 if k in int_cols else None) for k, v in columns.items()}
    for k in ("reward", "done", "mc_return"):
        arrays[k] = arrays[k].astype(np.float32)
    return Replay(**arrays, episode_ids=tuple(e.episode_id for e in episodes), texts=table.texts(),
                  card_text=card_text)
