"""EmbedLLM-style matrix-factorisation single-turn router (Sec. 5.1): learned task projections against learned
model embeddings estimate each model's success and episode cost."""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rivet_jax.baselines.fitting import apply_network, check_training, fit_network, masked_mean
from rivet_jax.baselines.single_turn_base import (SingleTurnRouter, build_task_model_table, check_cost_terms,
                                                  task_embeddings, utility)
from rivet_jax.data.schema import Episode, ModelPool
from rivet_jax.encoders import EmbeddingStore

__all__ = ["FactorizationNet", "MatrixFactorizationRouter"]


class FactorizationNet(nn.Module):
    """Two rank-r factorisations of the task embedding against learned model embeddings.

    success logit(task, m)        = (W h) . v_m + b_m
    log(1 + cost(task, m) / c_ref) = (W_c h) . w_m + a_m
    """

    num_models: int
    rank: int

    @nn.compact
    def __call__(self, h):  # (B, D) -> (B, M) success logits, (B, M) predicted log(1 + C / c_ref)
        return self._factor("success", h), self._factor("cost", h)

    def _factor(self, name: str, h):
        # The embeddings are unit-norm, so N(0, 1) kernel entries give task factors of unit scale.
        u = nn.Dense(self.rank, use_bias=False, kernel_init=nn.initializers.normal(1.0), name=f"{name}_task")(h)
        v = self.param(f"{name}_model", nn.initializers.normal(0.1), (self.num_models, self.rank))  # (M, r)
        b = self.param(f"{name}_bias", nn.initializers.zeros, (self.num_models,))                  # (M,)
        return u @ v.T + b                                                                          # (B, M)


def _factorization_loss(params, net: FactorizationNet, data: dict) -> jax.Array:
    """Binary cross-entropy of the success head plus squared error of the cost head, over the observed cells.

    The success targets are mean outcomes in [0, 1], already soft where a cell holds several episodes or graded
    outcomes; the cross-entropy is minimal where sigmoid(logit) equals the target, so no thresholding is needed."""
    logits, log_cost = net.apply({"params": params}, data["h"])                    # (N, M) each
    bce = optax.sigmoid_binary_cross_entropy(logits, data["success"])
    squared = (log_cost - data["log_cost"]) ** 2
    return masked_mean(bce, data["observed"]) + masked_mean(squared, data["observed"])


class MatrixFactorizationRouter(SingleTurnRouter):
    """EmbedLLM style: a learned projection of the task embedding u = W h (D -> rank) against learned model
    embeddings v_m and biases b_m; sigmoid(u . v_m + b_m) estimates success, trained with binary cross-entropy on
    the observed (task, model) cells. A second factorisation of the same form (its own projection and model
    embeddings) regresses log(1 + episode cost / c_ref): the log makes a task's length and a model's price
    additive, and inverting it gives the cost estimate. Full-batch AdamW for `steps` steps, jit-compiled,
    deterministic given `seed`. The short default schedule is the regulariser: on ~200 tasks with sparse
    1024-wide embeddings the factorisation memorises the table within a few hundred steps (defaults picked on
    RouteSim's validation split).

    EmbedLLM learns model embeddings from a large query x model correctness matrix and reads the routing decision
    off predicted correctness alone; here the cost head and the utility make it cost-aware at the same lambda."""

    name = "embedllm"

    def __init__(self, pool, store, lam, c_ref, *, net: FactorizationNet, params: Any, losses: np.ndarray):
        super().__init__(pool, store, lam, c_ref)
        self.net = net
        self.params = params
        self.losses = np.asarray(losses)  # (steps,) training loss per step

    @classmethod
    def fit(cls, episodes: Sequence[Episode], pool: ModelPool, store: EmbeddingStore, lam: float, c_ref: float, *,
            rank: int = 16, steps: int = 200, lr: float = 3e-3, weight_decay: float = 1e-4,
            seed: int = 0) -> MatrixFactorizationRouter:
        check_training(steps, lr)
        lam, c_ref = check_cost_terms(lam, c_ref)
        table = build_task_model_table(episodes, pool)
        h = jnp.asarray(task_embeddings(store, table.prompts))                          # (N, D)
        observed = table.observed
        data = {"h": h, "observed": jnp.asarray(observed),
                "success": jnp.asarray(np.where(observed, table.success, 0.0), jnp.float32),
                "log_cost": jnp.asarray(np.where(observed, np.log1p(table.cost / c_ref), 0.0), jnp.float32)}
        net = FactorizationNet(num_models=len(pool), rank=int(rank))
        params, losses = fit_network(net, _factorization_loss, data, h, seed=seed, steps=steps, lr=lr,
                                     weight_decay=weight_decay, name=cls.name)
        return cls(pool, store, lam, c_ref, net=net, params=params, losses=losses)

    def estimates(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(B, M) estimated success probability and (B, M) estimated episode cost in USD."""
        logits, log_cost = apply_network(self.net, self.params, jnp.asarray(h, jnp.float32))
        success = np.asarray(jax.nn.sigmoid(logits), np.float64)
        cost = np.maximum(np.expm1(np.asarray(log_cost, np.float64)), 0.0) * self.c_ref
        return success, cost

    def _scores(self, h):
        success, cost = self.estimates(h)
        return utility(success, cost, self.lam, self.c_ref)                             # (B, M)
