"""The floors every router must beat: the one model with the best mean return on the training logs, and the best
model of each task family.

From the logged episodes in which one model answered every turn (`single_turn_base.is_single_model`), each model's
mean discounted return (Eqs. 1-2 at the lambda, gamma and c_ref every other router uses) over its episodes; the
router calls the best available model at every turn. It reads nothing of the task or the history: a router that
does not beat it has learned nothing that one number per model could not. Per family (`task.family`; tasks without
one form a family of their own), the same on that family's training tasks: a router that does not beat it has
learned nothing that one number per model and family could not ("route by task family", the rule a team writes by
hand when its logs carry families).
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
BEST_PER_FAMILY = "Best fixed per family (train)"


class BestFixedRouter:
    """A `Policy`: the available model with the best training return, at every turn (propensity 1)."""

    name = "best-fixed"

    def __init__(self, returns: dict[str, float]):
        self.returns = dict(returns)   # model -> mean training return
        self.ranking = sorted(self.returns, key=lambda m: -self.returns[m])

    @classmethod
    def fit(cls, episodes: Sequence[Episode], pool: ModelPool, reward: Reward) -> "BestFixedRouter":
        by_model = returns_by_model(episodes, reward)
        if not by_model:
            raise DataError("<training logs>", None, "turns[].propensity",
                            "no logged episode committed to one model, so no model's return as a fixed model was "
                            "logged (logs an exploring proxy recorded are draws at every turn): value them with a "
                            "model of the logs instead, as launch.train does there (deploy.modelled_floor, FQE)")
        return cls.of_returns(by_model, pool)

    @classmethod
    def of_returns(cls, by_model: dict[str, list[float]], pool: ModelPool) -> "BestFixedRouter":
        """From each model's logged returns as a fixed model (`returns_by_model`), in pool order."""
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


class BestPerFamilyRouter:
    """A `Policy`: in the task's family, the available model with the best return on that family's training tasks;
    models never logged alone in the family rank after those that were, in the overall order (`BestFixedRouter`),
    and so does a family the training tasks do not have."""

    name = "best-per-family"

    def __init__(self, families: dict[str, BestFixedRouter], overall: BestFixedRouter):
        self.families = dict(families)   # family ("" for none) -> its best-fixed router
        self.overall = overall

    @classmethod
    def fit(cls, episodes: Sequence[Episode], pool: ModelPool, reward: Reward) -> "BestPerFamilyRouter":
        by_family = defaultdict(list)
        for episode in episodes:
            by_family[family_of(episode.task)].append(episode)
        families = {family: returns_by_model(members, reward) for family, members in sorted(by_family.items())}
        return cls({family: BestFixedRouter.of_returns(returns, pool)
                    for family, returns in families.items() if returns}, BestFixedRouter.fit(episodes, pool, reward))

    def ranking(self, family: str | None) -> list[str]:
        """Every model the training logs hold alone, best first, for a task of `family`."""
        own = self.families.get(family or "")     # `family_of`
        first = own.ranking if own is not None else []
        return first + [m for m in self.overall.ranking if m not in first]

    def scores(self, family: str | None, pool: ModelPool) -> np.ndarray:
        """(M,) scores in pool order whose argmax over any available subset is this router's choice."""
        ranking = self.ranking(family)
        return np.array([len(ranking) - ranking.index(m) if m in ranking else 0 for m in pool.names], np.float64)

    def act(self, task: Task, history, available: Sequence[str], rng: np.random.Generator) -> tuple[str, float]:
        for model in self.ranking(task.family):
            if model in available:
                return model, 1.0
        raise ValueError(f"{self.name}: none of the available models {list(available)} was logged as a fixed "
                         f"model (known: {self.overall.ranking})")


def family_of(task: Task) -> str:
    return task.family or ""


def returns_by_model(episodes: Sequence[Episode], reward: Reward) -> dict[str, list[float]]:
    """{model: the discounted returns of the episodes it answered alone}."""
    by_model = defaultdict(list)
    for episode in episodes:
        if is_single_model(episode):
            by_model[episode.turns[0].model].append(discounted_return(episode, reward))
    return by_model
