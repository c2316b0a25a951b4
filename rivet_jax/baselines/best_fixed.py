"""The floor every router must beat: the one model with the best mean return on the training logs.

From the logged episodes in which one model answered every turn (`single_turn_base.is_single_model`), each model's
mean discounted return (Eqs. 1-2 at the lambda, gamma and c_ref every other router uses) over its episodes; the
router calls the best available model at every turn. It reads nothing of the task or the history: a router that
does not beat it has learned nothing that one number per model could not.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np

from rivet_jax.baselines.single_turn_base import is_single_model
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode, ModelPool, Task
from rivet_jax.data.validation import DataError
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
            raise DataError("<training logs>", None, "turns[].propensity",
                            "no logged episode committed to one model, so no model's return as a fixed model was "
                            "logged (logs an exploring proxy recorded are draws at every turn): value them with a "
                            "model of the logs instead, as launch.train does there (deploy.modelled_floor, FQE)")
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
