"""Logged episodes -> transitions: rewards (Eq. 1), returns (Eq. 2) and Double-DQN bookkeeping, in one place.

`episode_rows` is the one episode -> rows path: offline training (`build_replay`), the online stage's new replay
(`transition_batch`) and the value-error evaluation all read an episode through it. `Batch` is what the losses read.

Every text the networks read (states, next states, responses, model-card descriptions) is interned into one text
table, and the arrays hold indices into it; the encoder embeds each distinct text once. Because serialization is
deterministic, the next state of turn t *is* the state of turn t+1, so the two share a row of the table.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple, Sequence

import numpy as np
from absl import logging

from rivet_jax.config_checks import ConfigError
from rivet_jax.data.prompt_cache import episode_savings, saving_per_token
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
    cost: np.ndarray            # (N,) float32 c_t / c_ref, the turn's cost in the reward's units
    cost_return: np.ndarray     # (N,) float32 sum_k gamma^(k-t) c_k / c_ref (G_t moves by -(lambda' - lambda) this)
    lam: np.ndarray             # (N,) float32 the lambda of `reward` and `mc_return`
    available: np.ndarray       # (N, M) bool, models that could be chosen at s_t
    next_available: np.ndarray  # (N, M) bool, models that could be chosen at s_{t+1} (all for terminal turns)
    stochastic: np.ndarray      # (N,) float32 1 where the logged choice was stochastic (propensity < 1), else 0
    episode: np.ndarray         # (N,) int32 index into episode_ids
    episode_ids: tuple[str, ...]
    texts: tuple[str, ...]      # the text table: states, responses, card descriptions
    card_text: np.ndarray       # (M,) int32 text index of each card's description
    # A cache-aware run's (`model.cache_aware`) per-candidate prompt-cache savings in units of c_ref
    # (`data.prompt_cache.call_savings`); None otherwise
    saving: np.ndarray | None = None       # (N, M) float32 at s_t
    next_saving: np.ndarray | None = None  # (N, M) float32 at s_{t+1}

    def __len__(self) -> int:
        return int(self.state.shape[0])

    def arrays(self) -> dict[str, np.ndarray]:
        """The per-transition arrays, as a dict pytree (what training puts on device)."""
        names = ("state", "next_state", "response", "action", "reward", "done", "mc_return", "cost", "cost_return",
                 "lam", "available", "next_available", "stochastic", "saving", "next_saving")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


# A turn dearer than this many median turns is not a price difference between models: per-token API prices span
# about three decades and a turn's tokens rarely exceed the median turn's tenfold (the dearest turn of RouteSim's
# training corpus costs 46 median turns, of MINT's 125). Such a cost is a logging or unit error: micro-dollars,
# tokens logged as cost, 1e308.
_OUTLIER_MEDIANS = 1e4


def reference_cost(episodes: Sequence[Episode]) -> float:
    """c_ref derived from a corpus: the mean per-turn cost, so that normalised costs are of order one.

    The mean leaves out turns costing more than `_OUTLIER_MEDIANS` (10^4) times the median of the positive per-turn
    costs, with a warning: one logged cost of 1e308 among normal ones would otherwise make c_ref ~1e305 and every
    normalised cost ~0, a cost-blind router. Leaving such turns out (rather than clipping them at the bound) keeps
    c_ref the mean of the plausible costs however few turns the corpus has; the median sets the bound because it
    holds with up to half the costs corrupt. On a corpus without such turns this is the plain mean, bit for bit.
    """
    costs = np.array([turn.cost for episode in episodes for turn in episode.turns], np.float64)
    positive = costs[costs > 0]
    with np.errstate(over="ignore"):  # costs near float64's limit: an inf median or mean, refused below
        bound = _OUTLIER_MEDIANS * float(np.median(positive)) if positive.size else math.inf
        outliers = costs > bound
        c_ref = float(np.mean(costs[~outliers])) if costs.size else 0.0
    if outliers.any():
        logging.warning("c_ref: %d of %d turn costs exceed %.3g (10^4 x the median turn cost) and are left out of "
                        "the mean, the largest %.3g; check the logs' cost units, or set config reward.c_ref",
                        int(outliers.sum()), costs.size, bound, float(costs.max()))
    if not (c_ref > 0 and math.isfinite(c_ref)):
        largest = float(costs.max()) if costs.size else 0.0
        raise ConfigError(f"cannot derive c_ref from this corpus: the mean per-turn cost is {c_ref} (costs up to "
                          f"{largest:.3g}): check the logs' cost units, or set --config.reward.c_ref")
    return c_ref


def turn_rewards(costs: np.ndarray, outcome: float, lam: float, c_ref: float) -> np.ndarray:
    """Eq. 1 for one episode: r_t = -lambda c_t / c_ref + d_t y, the outcome y in [0, 1] (0/1 success or a graded
    score) paid on the terminal (last) turn."""
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


def availability(names: Sequence[str] | None, pool: ModelPool) -> np.ndarray:
    """(M,) bool over the pool: the models that could be chosen; None = every model."""
    mask = np.zeros(len(pool), bool)
    if names is None:
        mask[:] = True
    else:
        mask[[pool.index(n) for n in names]] = True
    return mask


class Reward(NamedTuple):
    """The constants of Eqs. 1-2, passed as one value: r_t = -lam c_t / c_ref + d_t y, G_t = sum_k gamma^k r_{t+k}."""

    lam: float     # lambda, the cost weight
    gamma: float   # the discount
    c_ref: float   # the cost unit (the training corpus' mean per-turn cost unless configured)

    @classmethod
    def of(cls, config, c_ref: float) -> "Reward":
        """A run's reward: its config's lambda and gamma (`config.reward`) with its c_ref."""
        return cls(float(config.reward.lam), float(config.reward.gamma), c_ref)


def episode_rows(episode: Episode, pool: ModelPool, reward: Reward) -> dict[str, np.ndarray]:
    """One validated episode's T transitions: the numeric columns of the replay, rewards and returns in float64.

    action (T,) int32 · reward (T,) Eq. 1 · done (T,) 1 on the last turn · mc_return (T,) G_t · cost (T,)
    c_t / c_ref and cost_return (T,) its discounted sum from t on (the rewards and returns at any other lambda,
    `at_lambda`) ·
    lam (T,) the lambda of reward and mc_return ·
    available (T, M) at s_t · next_available (T, M) at s_{t+1} (every model after the terminal turn) ·
    stochastic (T,) 1 where the logged choice was a draw (propensity < 1: a random router, an exploring policy).
    """
    lam, gamma, c_ref = reward
    turns = episode.turns
    costs = np.array([t.cost for t in turns], np.float64)
    rewards = turn_rewards(costs, episode.outcome, lam, c_ref)
    masks = np.stack([availability(t.available, pool) for t in turns] + [availability(None, pool)])  # (T + 1, M)
    return {"action": np.array([pool.index(t.model) for t in turns], np.int32), "reward": rewards,
            "done": (np.arange(len(turns)) == len(turns) - 1).astype(np.float64),
            "mc_return": discounted_returns(rewards, gamma), "cost": costs / c_ref,
            "cost_return": discounted_returns(costs / c_ref, gamma), "lam": np.full(len(turns), float(lam)),
            "available": masks[:-1], "next_available": masks[1:],
            "stochastic": np.array([t.propensity is not None and t.propensity < 1.0 for t in turns], np.float64)}


class Batch(NamedTuple):
    """Transitions as the losses read them: embeddings looked up, one row per transition (leading shape B).

    Built by gathering a `Replay` through its text table (`corpus.gather_batch`) or from freshly embedded episodes
    (`transition_batch`, the online stage). A pytree: jit, scan, vmap and sharding see ten arrays.
    """

    h_t: Any             # (B, D) float32 frozen-encoder vector of s_t
    h_tp1: Any           # (B, D) float32 of s_{t+1}
    e_o: Any             # (B, D) float32 of the response o_t
    action: Any          # (B,) int32 pool index of m_t
    reward: Any          # (B,) float32 r_t
    done: Any            # (B,) float32 d_t
    mc_return: Any       # (B,) float32 G_t
    cost: Any            # (B,) float32 c_t / c_ref
    cost_return: Any     # (B,) float32 sum_k gamma^(k-t) c_k / c_ref
    lam: Any             # (B,) float32 the lambda of reward and mc_return (a lambda-conditioned network's input)
    available: Any       # (B, M) bool at s_t
    next_available: Any  # (B, M) bool at s_{t+1}
    stochastic: Any      # (B,) float32 1 where the logged choice was stochastic (`loss.cql_on = "stochastic"`)
    saving: Any = None       # (B, M) float32 prompt-cache savings at s_t in units of c_ref (a cache-aware run's)
    next_saving: Any = None  # (B, M) float32 at s_{t+1}


def transition_batch(rows: dict[str, np.ndarray], states: np.ndarray, responses: np.ndarray) -> Batch:
    """An episode's `episode_rows` with its vectors: states (T + 1, D) s_0..s_T, responses (T, D)."""
    return Batch(h_t=states[:-1], h_tp1=states[1:], e_o=responses, action=rows["action"],
                 reward=rows["reward"].astype(np.float32), done=rows["done"].astype(np.float32),
                 mc_return=rows["mc_return"].astype(np.float32), cost=rows["cost"].astype(np.float32),
                 cost_return=rows["cost_return"].astype(np.float32), lam=rows["lam"].astype(np.float32),
                 available=rows["available"],
                 next_available=rows["next_available"], stochastic=rows["stochastic"].astype(np.float32))


_ROW_COLUMNS = ("action", "reward", "done", "mc_return", "cost", "cost_return", "lam", "available", "next_available",
                "stochastic")


def at_lambda(batch: Batch, lam) -> Batch:
    """`batch` with its rewards and returns at `lam` ((B,) or a scalar) instead of `batch.lam`: Eq. 1 is linear in
    lambda, r_t(lambda') = r_t(lambda) - (lambda' - lambda) c_t / c_ref, and so is every discounted return."""
    shift = lam - batch.lam
    return batch._replace(reward=batch.reward - shift * batch.cost, lam=batch.lam + shift,
                          mc_return=batch.mc_return - shift * batch.cost_return)


def build_replay(
    episodes: Sequence[Episode],
    pool: ModelPool,
    *,
    count_tokens: TokenCounter,
    max_tokens: int,
    reward: Reward,
    cache_aware: bool = False,
) -> Replay:
    """Flattens episodes into transitions. Episodes must already be validated against `pool`. `cache_aware`: with
    each state's prompt-cache savings per candidate (`Replay.saving`, `next_saving`)."""
    if not episodes:
        raise ValueError("no episodes: the corpus is empty")
    table = _TextTable()
    card_text = np.array([table.add(card.description) for card in pool.cards], np.int32)
    columns: dict[str, list] = {k: [] for k in ("state", "next_state", "response", "episode", *_ROW_COLUMNS)}
    savings: list[np.ndarray] = []
    per_token = saving_per_token(pool) if cache_aware else None
    for e_idx, episode in enumerate(episodes):
        states = [table.add(text) for text in
                  episode_state_texts(episode.task.prompt, episode.turns, count_tokens, max_tokens)]
        columns["state"].append(states[:-1])
        columns["next_state"].append(states[1:])
        columns["response"].append([table.add(turn.response) for turn in episode.turns])
        columns["episode"].append([e_idx] * len(episode.turns))
        rows = episode_rows(episode, pool, reward)
        for k in _ROW_COLUMNS:
            columns[k].append(rows[k])
        if cache_aware:
            savings.append(episode_savings(episode, pool, reward.c_ref, per_token))
    arrays = {k: np.concatenate([np.asarray(c) for c in v]) for k, v in columns.items()}
    for k in ("state", "next_state", "response", "episode"):
        arrays[k] = arrays[k].astype(np.int32)
    for k in ("reward", "done", "mc_return", "cost", "cost_return", "lam", "stochastic"):
        arrays[k] = arrays[k].astype(np.float32)
    if cache_aware:
        arrays["saving"] = np.concatenate([e[:-1] for e in savings])
        arrays["next_saving"] = np.concatenate([e[1:] for e in savings])
    return Replay(**arrays, episode_ids=tuple(e.episode_id for e in episodes), texts=table.texts(),
                  card_text=card_text)
