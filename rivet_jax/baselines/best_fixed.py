"""The floor every router must beat: the one model with the best mean return on the training logs.

From the logged episodes in which one model answered every turn (`single_turn_base.is_single_model`), each model's
mean discounted return (Eqs. 1-2 at the lambda, gamma and c_ref every other router uses) over its episodes; the
router calls the best available model at every turn. It reads nothing of the task or the history: a router that
does not beat it has learned nothing that one number per model could not.

Logs with no such episode, where every turn was drawn with a recorded propensity (the exploring proxy's traffic:
every turn a draw, none a commitment), give each model's return as a fixed model by weighted importance sampling
instead (`weighted_fixed_returns`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np

from rivet_jax.baselines.single_turn_base import is_single_model
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode, ModelPool, Task
from rivet_jax.evaluation import discounted_return

BEST_FIXED = "Best fixed (train)"  # its name in every table and figure


class BestFixedRouter:
    """A `Policy`: the available model with the best training return, at every turn (propensity 1)."""

    name = "best-fixed"

    def __init__(self, returns: dict[str, float]):
        self.returns = dict(returns)   # model -> mean training return
        self.ranking = sorted(self.returns, key=lambda m: -self.returns[m])

    @classmethod
    def fit(cls, episodes: Sequence[Episode], pool: ModelPool, reward: Reward) -> "BestFixedRouter":
        by_model = defaultdict(list)
        for episode in episodes:
            if is_single_model(episode):
                by_model[episode.turns[0].model].append(discounted_return(episode, reward))
        if not by_model:
            weighted = weighted_fixed_returns(episodes, reward)
            if not weighted:
                raise ValueError("no logged episode committed to one model, and none with a propensity at every "
                                 "turn: the best fixed model cannot be estimated")
            return cls({m: weighted[m] for m in pool.names if m in weighted})
        return cls({m: float(np.mean(by_model[m])) for m in pool.names if m in by_model})

    @property
    def model(self) -> str:
        return self.ranking[0]

    def act(self, task: Task, history, available: Sequence[str], rng: np.random.Generator) -> tuple[str, float]:
        for model in self.ranking:
            if model in available:
                return model, 1.0
        raise ValueError(f"{self.name}: none of the available models {list(available)} was logged as a fixed "
                         f"model (known: {self.ranking})")


def weighted_fixed_returns(episodes: Sequence[Episode], reward: Reward) -> dict[str, float]:
    """Each model m's return as a fixed model, by weighted importance sampling over the episodes with a propensity at
    every turn: sum_i w_i G_i / sum_i w_i, w_i = prod_t 1[m_it = m] / p_it (the episodes that happened to call m
    throughout, each standing for the others its draws make unlikely). Models no such episode followed: absent."""
    logged = [e for e in episodes if all(t.propensity is not None for t in e.turns)]
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for episode in logged:
        first = episode.turns[0].model
        if all(t.model == first for t in episode.turns):
            w = float(np.prod([1.0 / t.propensity for t in episode.turns]))
            totals[first][0] += w * discounted_return(episode, reward)
            totals[first][1] += w
    return {m: total / weight for m, (total, weight) in totals.items() if weight > 0}
