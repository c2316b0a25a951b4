"""RouterDC-style contrastive single-turn router (Sec. 5.1): a dual encoder trained with the sample-LLM contrastive
loss to rank each task's highest-utility models first."""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rivet_jax.baselines.fitting import apply_network, check_training, fit_network, masked_mean
from rivet_jax.baselines.single_turn_base import (SingleTurnRouter, build_task_model_table, check_cost_terms,
                                                  task_embeddings)
from rivet_jax.data.schema import Episode, ModelPool
from rivet_jax.encoders import EmbeddingStore

__all__ = ["DualEncoder", "sample_llm_contrastive", "positive_models", "ContrastiveRouter"]


class DualEncoder(nn.Module):
    """A query encoder over the frozen task embedding and learnable model embeddings, both L2-normalised."""

    num_models: int
    hidden: int
    dim: int

    @nn.compact
    def __call__(self, h):  # (B, D) -> (B, M) cosine similarities
        q = nn.Dense(self.dim, name="out")(nn.gelu(nn.Dense(self.hidden, name="in")(h)))    # (B, d)
        k = self.param("models", nn.initializers.normal(1.0), (self.num_models, self.dim))  # (M, d)
        return _unit(q) @ _unit(k).T


def _unit(x: jax.Array) -> jax.Array:
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def sample_llm_contrastive(similarity: jax.Array, positive: jax.Array, negative: jax.Array,
                           temperature: jax.Array) -> jax.Array:
    """RouterDC's sample-LLM contrastive loss for one batch: (N, M) similarities and masks -> scalar.

    Per task and positive model p: -log(e^{s_p / t} / (e^{s_p / t} + sum_{n negative} e^{s_n / t})), averaged over
    the task's positives, then over the tasks that have both a positive and a negative (the others carry no
    ranking signal).
    """
    logits = similarity / temperature                                                  # (N, M)
    # A finite floor instead of -inf keeps the gradient of an empty logsumexp at zero rather than NaN.
    negatives = jax.nn.logsumexp(jnp.where(negative, logits, -1e9), axis=1, keepdims=True)  # (N, 1)
    per_positive = jnp.logaddexp(logits, negatives) - logits                           # (N, M)
    per_task = _masked_row_mean(per_positive, positive)                               # (N,)
    informative = jnp.any(positive, axis=1) & jnp.any(negative, axis=1)               # (N,)
    return masked_mean(per_task, informative)


def _masked_row_mean(x: jax.Array, mask: jax.Array) -> jax.Array:  # (N, M), (N, M) -> (N,)
    return jnp.sum(jnp.where(mask, x, 0.0), axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1)


def _contrastive_loss(params, net: DualEncoder, data: dict) -> jax.Array:
    similarity = net.apply({"params": params}, data["h"])                              # (N, M)
    return sample_llm_contrastive(similarity, data["positive"], data["negative"], data["temperature"])


def positive_models(table_utility: np.ndarray, margin: float) -> tuple[np.ndarray, np.ndarray]:
    """(N, M) positives (observed, utility within `margin` of the task's best) and negatives (the other observed
    models) from the (N, M) observed utility, NaN where unobserved."""
    observed = ~np.isnan(table_utility)
    best = np.nanmax(np.where(observed, table_utility, -np.inf), axis=1, keepdims=True)  # (N, 1)
    positive = observed & (table_utility >= best - margin)
    return positive, observed & ~positive


class ContrastiveRouter(SingleTurnRouter):
    """RouterDC style dual encoder: a query encoder (an MLP over the frozen task embedding, L2-normalised) and
    learnable L2-normalised model embeddings, trained with RouterDC's sample-LLM contrastive loss at a
    temperature. A training task's positives are the observed models whose utility (success - lam * cost / c_ref)
    is within `margin` of its best, its negatives the other observed models; routing takes the argmax of cosine
    similarity over the available models (`scores` returns the similarities). `margin` is in utility units: the
    default 0.2 never ties a success with a failure (graded outcomes closer than 0.2 may tie), but at lam = 0.05
    treats two successes whose episode costs differ by less than 4 c_ref as equally good; more positives per task
    overfit less than one noisy argmax.
    Defaults (and the short schedule, which is the regulariser) picked on RouteSim's validation split.

    Simplified from RouterDC: the frozen encoder is not fine-tuned (only the MLP on top is trained); positives
    and negatives come from the observed utility rather than from top-K / bottom-K performance scores; and the
    sample-sample contrastive term over clustered queries is left out. Full-batch AdamW for `steps` steps,
    jit-compiled, deterministic given `seed`."""

    name = "routerdc"

    def __init__(self, pool, store, lam, c_ref, *, net: DualEncoder, params: Any, losses: np.ndarray):
        super().__init__(pool, store, lam, c_ref)
        self.net = net
        self.params = params
        self.losses = np.asarray(losses)  # (steps,)

    @classmethod
    def fit(cls, episodes: Sequence[Episode], pool: ModelPool, store: EmbeddingStore, lam: float, c_ref: float, *,
            hidden: int = 64, dim: int = 32, temperature: float = 0.1, margin: float = 0.2, steps: int = 100,
            lr: float = 1e-3, weight_decay: float = 1e-4, seed: int = 0) -> ContrastiveRouter:
        check_training(steps, lr)
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        lam, c_ref = check_cost_terms(lam, c_ref)
        table = build_task_model_table(episodes, pool)
        positive, negative = positive_models(table.utility(lam, c_ref), margin)
        if not np.any(positive.any(axis=1) & negative.any(axis=1)):
            raise ValueError(f"{cls.name}: on every training task the observed models are tied within margin "
                             f"{margin}; there is no ranking to learn")
        h = jnp.asarray(task_embeddings(store, table.prompts))                          # (N, D)
        data = {"h": h, "positive": jnp.asarray(positive), "negative": jnp.asarray(negative),
                "temperature": jnp.float32(temperature)}
        net = DualEncoder(num_models=len(pool), hidden=int(hidden), dim=int(dim))
        params, losses = fit_network(net, _contrastive_loss, data, h, seed=seed, steps=steps, lr=lr,
                                     weight_decay=weight_decay, name=cls.name)
        return cls(pool, store, lam, c_ref, net=net, params=params, losses=losses)

    def _scores(self, h):
        return np.asarray(apply_network(self.net, self.params, jnp.asarray(h, jnp.float32)), np.float64)  # (B, M)
