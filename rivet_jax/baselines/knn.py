"""Weighted kNN single-turn router (the ORBIT baseline, Sec. 5.1): the most similar training tasks vote on each
model's success and episode cost."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rivet_jax.baselines.single_turn_base import (SingleTurnRouter, TaskModelTable, build_task_model_table,
                                                  task_embeddings, utility)
from rivet_jax.data.schema import Episode, ModelPool
from rivet_jax.encoders import EmbeddingStore

__all__ = ["KNNRouter"]


def _weighted_cell_means(weights: np.ndarray, rows: np.ndarray, values: np.ndarray, observed: np.ndarray,
                         fallback: np.ndarray) -> np.ndarray:
    """Per query and model, the weighted mean of `values` over the query's neighbour rows where observed.

    weights (B, K), rows (B, K) into values/observed (N, M), fallback (M,) -> (B, M). A model observed on no
    neighbour of positive weight gets its fallback (its mean over all training tasks).
    """
    w = weights[:, :, None] * observed[rows]                       # (B, K, M)
    total = w.sum(axis=1)                                          # (B, M)
    weighted = (w * np.nan_to_num(values[rows])).sum(axis=1)       # (B, M)
    return np.where(total > 0, weighted / np.where(total > 0, total, 1.0), fallback)


class KNNRouter(SingleTurnRouter):
    """Weighted kNN (the ORBIT baseline): the k training tasks most similar to the prompt (cosine similarity of
    task embeddings) vote with weight max(similarity, 0); per model, the weighted means of their observed success
    and episode cost give the utility. Clipping keeps dissimilar tasks from voting against their own outcomes; a
    prompt whose k neighbours all have similarity <= 0 weighs them equally."""

    name = "knn"

    def __init__(self, pool, store, lam, c_ref, *, table: TaskModelTable, train_h: np.ndarray, k: int):
        super().__init__(pool, store, lam, c_ref)
        self.table = table
        self.train_h = np.asarray(train_h, np.float64)  # (N, D)
        self.k = int(k)

    @classmethod
    def fit(cls, episodes: Sequence[Episode], pool: ModelPool, store: EmbeddingStore, lam: float, c_ref: float, *,
            k: int = 10) -> KNNRouter:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        table = build_task_model_table(episodes, pool)
        return cls(pool, store, lam, c_ref, table=table, train_h=task_embeddings(store, table.prompts), k=k)

    def neighbours(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(B, K) training-task rows, most similar first (ties: table order), and their (B, K) weights."""
        similarity = np.asarray(h, np.float64) @ self.train_h.T                       # (B, N)
        k = min(self.k, similarity.shape[1])
        rows = np.argsort(-similarity, axis=1, kind="stable")[:, :k]                 # (B, K)
        weights = np.maximum(np.take_along_axis(similarity, rows, axis=1), 0.0)      # (B, K)
        return rows, np.where(weights.sum(axis=1, keepdims=True) > 0, weights, 1.0)

    def _scores(self, h):
        rows, weights = self.neighbours(h)
        table = self.table
        success = _weighted_cell_means(weights, rows, table.success, table.observed, table.model_success)
        cost = _weighted_cell_means(weights, rows, table.cost, table.observed, table.model_cost)
        return utility(success, cost, self.lam, self.c_ref)                          # (B, M)
