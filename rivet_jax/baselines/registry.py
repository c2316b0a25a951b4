"""The baselines of the paper's Table 1 by name, each fitted on the same logged episodes: what the reproduction and
`launch.evaluate_logs` compare a router against. One place to add a baseline (ARCHITECTURE.md, "How to change X")."""

from __future__ import annotations

from typing import Sequence

from rivet_jax.baselines.best_fixed import BEST_FIXED, BestFixedRouter
from rivet_jax.baselines.mtrouter import MTRouter
from rivet_jax.baselines.single_turn import ClusterRouter, ContrastiveRouter, KNNRouter, MatrixFactorizationRouter
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode, ModelPool
from rivet_jax.encoders import EmbeddingStore
from rivet_jax.envs.base import Policy


def fit_baselines(config, episodes: Sequence[Episode], pool: ModelPool, store: EmbeddingStore, lam: float,
                  c_ref: float) -> dict[str, Policy]:
    """Every baseline fitted on `episodes` at `lam` (`config.baselines` sets their sizes, `config.seed` their draws;
    `config.reward.gamma`, `config.max_state_tokens` as the router's)."""
    b = config.baselines
    encoder = store.encoder
    return {
        BEST_FIXED: BestFixedRouter.fit(episodes, pool, Reward(lam, config.reward.gamma, c_ref)),
        "MTRouter": MTRouter.fit(episodes, pool, store, lam=lam, count_tokens=encoder.count_tokens,
                                 max_tokens=config.max_state_tokens, epochs=b.mtrouter_epochs, seed=config.seed,
                                 c_ref=c_ref),
        "Weighted kNN": KNNRouter.fit(episodes, pool, store, lam, c_ref, k=b.knn_k),
        "Avengers-Pro": ClusterRouter.fit(episodes, pool, store, lam, c_ref, clusters=b.clusters, seed=config.seed),
        "EmbedLLM": MatrixFactorizationRouter.fit(episodes, pool, store, lam, c_ref, seed=config.seed),
        "RouterDC": ContrastiveRouter.fit(episodes, pool, store, lam, c_ref, seed=config.seed),
    }
