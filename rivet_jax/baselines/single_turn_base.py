"""What the single-turn baselines share (Sec. 5.1): the task-model training table, the cost-aware utility, and the
`SingleTurnRouter` base that turns per-model scores into a commit-once `Policy`.

The routers themselves live in knn.py, cluster.py, matrix_factorization.py and contrastive.py; single_turn.py
re-exports all of them. This module imports none of them, so there is no cycle.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Sequence

import numpy as np

from rivet_jax.data.schema import Episode, ModelPool, Task, Turn
from rivet_jax.encoders import EmbeddingStore
from rivet_jax.encoders.base import l2_normalise_rows

__all__ = [
    "TaskModelTable",
    "is_single_model",
    "build_task_model_table",
    "utility",
    "check_cost_terms",
    "task_embeddings",
    "SingleTurnRouter",
]


# ------------------------------------------------------------------------------------------ the training table


@dataclasses.dataclass(frozen=True)
class TaskModelTable:
    """Observed outcome and episode cost of committing to each model on each training task.

    N tasks (first-occurrence order in the episodes) x M models (pool order). A cell seen in several episodes holds
    their mean; an unobserved cell holds NaN and `count` 0.
    """

    task_ids: tuple[str, ...]  # (N,)
    prompts: tuple[str, ...]   # (N,)
    models: tuple[str, ...]    # (M,)
    success: np.ndarray        # (N, M) float64 mean outcome in [0, 1]
    cost: np.ndarray           # (N, M) float64 mean episode cost in USD
    count: np.ndarray          # (N, M) int64 episodes per cell

    @property
    def observed(self) -> np.ndarray:  # (N, M) bool
        return self.count > 0

    @property
    def model_success(self) -> np.ndarray:  # (M,)
        """Each model's mean success over the tasks it was observed on (every task weighs the same)."""
        return np.nanmean(self.success, axis=0)

    @property
    def model_cost(self) -> np.ndarray:  # (M,)
        return np.nanmean(self.cost, axis=0)

    def utility(self, lam: float, c_ref: float) -> np.ndarray:  # (N, M), NaN where unobserved
        return utility(self.success, self.cost, lam, c_ref)


def is_single_model(episode: Episode) -> bool:
    """Whether the episode committed to one model: one model answered every turn, and no turn is logged as a
    stochastic choice (propensity < 1). The second condition drops a random router's episode that happened to draw
    the same model every turn: such episodes are a length-biased sample (short episodes repeat a model more often,
    and short episodes are more often successes), not the outcome of committing to that model."""
    first = episode.turns[0].model
    return all(turn.model == first and (turn.propensity is None or turn.propensity >= 1.0) for turn in episode.turns)


def build_task_model_table(episodes: Sequence[Episode], pool: ModelPool) -> TaskModelTable:
    """The per (task, model) outcome and episode cost of every single-model episode (`is_single_model`).

    Raises ValueError if no episode qualifies, if a pool model is never observed (naming it), or if one task id
    comes with two different prompts.
    """
    rows: dict[str, int] = {}
    prompts: list[str] = []
    num_models = len(pool)
    success_sum, cost_sum, count = [], [], []  # per task: (M,) each
    for episode in episodes:
        if not is_single_model(episode):
            continue
        task = episode.task
        row = rows.setdefault(task.id, len(rows))
        if row == len(prompts):
            prompts.append(task.prompt)
            success_sum.append(np.zeros(num_models))
            cost_sum.append(np.zeros(num_models))
            count.append(np.zeros(num_models, np.int64))
        elif prompts[row] != task.prompt:
            raise ValueError(f"task {task.id!r} appears with two different prompts (episode {episode.episode_id!r})")
        column = pool.index(episode.turns[0].model)
        success_sum[row][column] += episode.outcome
        cost_sum[row][column] += sum(turn.cost for turn in episode.turns)
        count[row][column] += 1
    if not rows:
        raise ValueError(
            f"no single-model episode among {len(episodes)} episodes: the single-turn baselines learn from episodes "
            "in which one model answered every turn (the fixed-model policies' episodes of the logged corpus)")
    count = np.stack(count)  # (N, M)
    never = [name for name, seen in zip(pool.names, count.sum(axis=0)) if seen == 0]
    if never:
        raise ValueError(f"pool model(s) {never} never observed in a single-model episode ({len(rows)} tasks); "
                         "a single-turn baseline cannot estimate them: log a fixed-model run of each or drop them "
                         "from the pool")
    with np.errstate(invalid="ignore", divide="ignore"):  # 0/0 -> NaN marks the unobserved cells
        success = np.stack(success_sum) / count
        cost = np.stack(cost_sum) / count
    return TaskModelTable(task_ids=tuple(rows), prompts=tuple(prompts), models=pool.names, success=success,
                          cost=cost, count=count)


def utility(success, cost, lam: float, c_ref: float):
    """success - lam * cost / c_ref, elementwise: the undiscounted Eq. 1 return of one committed episode."""
    return success - lam * cost / c_ref


def check_cost_terms(lam: float, c_ref: float) -> tuple[float, float]:
    """(lam, c_ref) as floats, or ValueError: checked at fit time too, before any table or training work."""
    lam, c_ref = float(lam), float(c_ref)
    if not (np.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam must be finite and >= 0, got {lam}")
    if not (np.isfinite(c_ref) and c_ref > 0):
        raise ValueError(f"c_ref must be finite and > 0, got {c_ref}")
    return lam, c_ref


def task_embeddings(store: EmbeddingStore, prompts: Sequence[str]) -> np.ndarray:
    """(N, D) float32 L2-normalised frozen-encoder vectors: cosine similarity becomes a dot product."""
    return l2_normalise_rows(store.embed(list(prompts)))


# ------------------------------------------------------------------------------------------------ the policy


class SingleTurnRouter(abc.ABC):
    """What the four routers share: scoring prompts, the per-task cache, and the commit-once `Policy`.

    Subclasses set `name` and implement `_scores(h)`: (B, D) L2-normalised task embeddings -> (B, M) scores in pool
    order, higher is better.
    """

    name = "single-turn"

    def __init__(self, pool: ModelPool, store: EmbeddingStore, lam: float, c_ref: float):
        self.pool = pool
        self.store = store
        self.lam, self.c_ref = check_cost_terms(lam, c_ref)
        self._task_scores: dict[str, np.ndarray] = {}  # task id -> (M,): a task's scores never change

    @abc.abstractmethod
    def _scores(self, h: np.ndarray) -> np.ndarray:
        """(B, D) L2-normalised task embeddings -> (B, M) scores, higher is better."""

    def scores(self, task_prompts: Sequence[str]) -> np.ndarray:
        """(B, M) float64 scores of the pool's models for each prompt."""
        if isinstance(task_prompts, str):
            raise TypeError("scores expects a sequence of prompts, got a single str; wrap it in a list")
        return np.asarray(self._scores(task_embeddings(self.store, task_prompts)), np.float64)

    def task_scores(self, task: Task) -> np.ndarray:
        """(M,) scores of `task`, computed once per task id."""
        row = self._task_scores.get(task.id)
        if row is None:
            row = self._task_scores[task.id] = self.scores([task.prompt])[0]
        return row

    def choose(self, task: Task, available: Sequence[str]) -> str:
        """The best-scoring available model (ties: the first in pool order)."""
        unknown = [name for name in available if name not in self.pool]
        if unknown:
            raise ValueError(f"{self.name}: available model(s) {unknown} are not in the pool {list(self.pool.names)}")
        if not available:
            raise ValueError(f"{self.name}: no model is available")
        mask = np.isin(np.array(self.pool.names), list(available))  # (M,)
        return self.pool.names[int(np.argmax(np.where(mask, self.task_scores(task), -np.inf)))]

    def act(self, task: Task, history: Sequence[Turn], available: Sequence[str],
            rng: np.random.Generator) -> tuple[str, float]:
        """Keep the model that answered the last turn while it is available; otherwise (first turn, or it was
        withdrawn) choose among the available models."""
        if history and history[-1].model in available:
            return history[-1].model, 1.0
        return self.choose(task, available), 1.0

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, models={list(self.pool.names)}, lam={self.lam})"
