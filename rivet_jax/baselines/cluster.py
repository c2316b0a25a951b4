"""Avengers-Pro-style cluster single-turn router (Sec. 5.1): k-means over the training tasks, and per cluster the
mean observed success and episode cost of each model."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rivet_jax.baselines.single_turn_base import (SingleTurnRouter, build_task_model_table, check_cost_terms,
                                                  task_embeddings, utility)
from rivet_jax.data.schema import Episode, ModelPool
from rivet_jax.encoders import EmbeddingStore

__all__ = ["kmeans", "ClusterRouter"]


def _squared_distances(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:  # (N, D), (C, D) -> (N, C)
    # |x|^2 - 2 x.c + |c|^2: one matmul rather than an (N, C, D) difference; rounding can dip below 0, hence the clip.
    return np.maximum((x**2).sum(1)[:, None] - 2.0 * x @ centroids.T + (centroids**2).sum(1)[None, :], 0.0)


def kmeans(x: np.ndarray, clusters: int, seed: int, max_iters: int = 100) -> np.ndarray:
    """Lloyd's k-means with k-means++ initialisation: (N, D) points -> (C, D) centroids, deterministic in `seed`.

    C = min(clusters, number of distinct points): k-means++ stops early when every point already is a centroid.
    A cluster that empties keeps its previous centroid.
    """
    x = np.asarray(x, np.float64)
    rng = np.random.default_rng(seed)
    centroids = [x[rng.integers(len(x))]]
    for _ in range(1, clusters):
        d2 = _squared_distances(x, np.stack(centroids)).min(axis=1)  # (N,)
        if d2.sum() <= 0:
            break
        centroids.append(x[rng.choice(len(x), p=d2 / d2.sum())])
    centroids = np.stack(centroids)                                  # (C, D)
    assign = None
    for _ in range(max_iters):
        new_assign = np.argmin(_squared_distances(x, centroids), axis=1)  # (N,)
        if assign is not None and np.array_equal(new_assign, assign):
            break
        assign = new_assign
        for c in range(len(centroids)):
            members = x[assign == c]
            if len(members):
                centroids[c] = members.mean(axis=0)
    return centroids


def _cluster_means(assign: np.ndarray, num_clusters: int, values: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """(C, M) per cluster and model: the mean of `values` (N, M) over the member tasks where observed (not NaN);
    a model never observed in a cluster gets its fallback (M,)."""
    means = np.empty((num_clusters, values.shape[1]))
    for c in range(num_clusters):
        members = values[assign == c]                                # (n_c, M)
        seen = ~np.isnan(members)
        total = seen.sum(axis=0)
        means[c] = np.where(total > 0, np.nansum(members, axis=0) / np.maximum(total, 1), fallback)
    return means


class ClusterRouter(SingleTurnRouter):
    """Avengers-Pro style: k-means over the L2-normalised training-task embeddings; per cluster and model, the mean
    observed success and episode cost; a prompt goes to its nearest centroid and takes that cluster's argmax.

    Avengers-Pro ranks a cluster's models by alpha * performance + (1 - alpha) * (1 - normalised cost) and sums
    the scores of the top-p nearest clusters; here the score is the project's utility (success - lam * cost /
    c_ref) of the single nearest cluster, so that lambda means the same for every router."""

    name = "cluster"

    def __init__(self, pool, store, lam, c_ref, *, centroids: np.ndarray, cluster_utility: np.ndarray):
        super().__init__(pool, store, lam, c_ref)
        self.centroids = np.asarray(centroids, np.float64)            # (C, D)
        self.cluster_utility = np.asarray(cluster_utility, np.float64)  # (C, M)

    @classmethod
    def fit(cls, episodes: Sequence[Episode], pool: ModelPool, store: EmbeddingStore, lam: float, c_ref: float, *,
            clusters: int = 8, seed: int = 0, max_iters: int = 100) -> ClusterRouter:
        if clusters < 1:
            raise ValueError(f"clusters must be >= 1, got {clusters}")
        lam, c_ref = check_cost_terms(lam, c_ref)
        table = build_task_model_table(episodes, pool)
        h = task_embeddings(store, table.prompts)                     # (N, D)
        centroids = kmeans(h, clusters, seed, max_iters)
        assign = np.argmin(_squared_distances(np.asarray(h, np.float64), centroids), axis=1)  # (N,)
        success = _cluster_means(assign, len(centroids), table.success, table.model_success)
        cost = _cluster_means(assign, len(centroids), table.cost, table.model_cost)
        return cls(pool, store, lam, c_ref, centroids=centroids, cluster_utility=utility(success, cost, lam, c_ref))

    def cluster_of(self, h: np.ndarray) -> np.ndarray:  # (B, D) -> (B,)
        return np.argmin(_squared_distances(np.asarray(h, np.float64), self.centroids), axis=1)

    def _scores(self, h):
        return self.cluster_utility[self.cluster_of(h)]              # (B, M)
