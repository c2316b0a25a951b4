"""Single-turn baseline routers (Sec. 5.1): weighted kNN, Avengers-Pro, EmbedLLM and RouterDC.

Each scores task-model compatibility from pre-call information only (the task prompt through the frozen encoder),
chooses ONE model before the first turn and keeps it for the whole episode; only if the kept model is no longer
available does it choose again, among the available ones. The choice is read back from the history (the model that
answered the last turn), so a router holds no per-episode state and one instance serves any number of episodes.

All four learn from one `TaskModelTable`: per (task, model), the outcome and episode cost of committing to that model,
observed in the logged episodes in which one model answered every turn (the fixed-model policies' episodes of
`rivet_jax/envs/collect.py`). Three of them rank models by the project's cost-aware utility, so that lambda means
what it means for RIVET (Eq. 1 summed over an episode, undiscounted):

    utility(task, m) = success_hat(task, m) - lam * episode_cost_hat(task, m) / c_ref

    KNNRouter                   "knn"       weighted mean of the k most similar training tasks' observations
    ClusterRouter               "cluster"   k-means over training tasks; the nearest cluster's mean observations
    MatrixFactorizationRouter   "embedllm"  task projection x model embeddings, trained on the observed cells
    ContrastiveRouter           "routerdc"  dual encoder trained to rank the highest-utility models first

`scores(prompts)` gives (B, M) utilities (cosine similarities for RouterDC) in pool order; `act` is the `Policy`
protocol of `rivet_jax/envs/base.py` and returns (model, 1.0): the routers are deterministic.
"""

from __future__ import annotations

import abc

import dataclasses
import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rivet_jax.data.schema import Episode, ModelPool, Task, Turn
from rivet_jax.encoders import EmbeddingStore
from rivet_jax.encoders.base import l2_normalise_rows

__all__ = [
    "TaskModelTable",
    "is_single_model",
    "build_task_model_table",
    "utility",
    "kmeans",
    "SingleTurnRouter",
    "KNNRouter",
    "ClusterRouter",
    "MatrixFactorizationRouter",
    "ContrastiveRouter",
    "FactorizationNet",
    "DualEncoder",
    "positive_models",
    "sample_llm_contrastive",
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


def _check_cost_terms(lam: float, c_ref: float) -> tuple[float, float]:
    lam, c_ref = float(lam), float(c_ref)
    if not (np.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam must be finite and >= 0, got {lam}")
    if not (np.isfinite(c_ref) and c_ref > 0):
        raise ValueError(f"c_ref must be finite and > 0, got {c_ref}")
    return lam, c_ref


def _task_embeddings(store: EmbeddingStore, prompts: Sequence[str]) -> np.ndarray:
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
        self.lam, self.c_ref = _check_cost_terms(lam, c_ref)
        self._task_scores: dict[str, np.ndarray] = {}  # task id -> (M,): a task's scores never change

    @abc.abstractmethod
    def _scores(self, h: np.ndarray) -> np.ndarray:
        """(B, D) L2-normalised task embeddings -> (B, M) scores, higher is better."""

    def scores(self, task_prompts: Sequence[str]) -> np.ndarray:
        """(B, M) float64 scores of the pool's models for each prompt."""
        if isinstance(task_prompts, str):
            raise TypeError("scores expects a sequence of prompts, got a single str; wrap it in a list")
        return np.asarray(self._scores(_task_embeddings(self.store, task_prompts)), np.float64)

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


# ------------------------------------------------------------------------------------------------ weighted kNN


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
        return cls(pool, store, lam, c_ref, table=table, train_h=_task_embeddings(store, table.prompts), k=k)

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


# ------------------------------------------------------------------------------------------ cluster (Avengers-Pro)


def _squared_distances(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:  # (N, D), (C, D) -> (N, C)
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
        lam, c_ref = _check_cost_terms(lam, c_ref)
        table = build_task_model_table(episodes, pool)
        h = _task_embeddings(store, table.prompts)                    # (N, D)
        centroids = kmeans(h, clusters, seed, max_iters)
        assign = np.argmin(_squared_distances(np.asarray(h, np.float64), centroids), axis=1)  # (N,)
        success = _cluster_means(assign, len(centroids), table.success, table.model_success)
        cost = _cluster_means(assign, len(centroids), table.cost, table.model_cost)
        return cls(pool, store, lam, c_ref, centroids=centroids, cluster_utility=utility(success, cost, lam, c_ref))

    def cluster_of(self, h: np.ndarray) -> np.ndarray:  # (B, D) -> (B,)
        return np.argmin(_squared_distances(np.asarray(h, np.float64), self.centroids), axis=1)

    def _scores(self, h):
        return self.cluster_utility[self.cluster_of(h)]              # (B, M)


# ----------------------------------------------------------------------------------------- shared training loop


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(jnp.sum(mask), 1)


@functools.partial(jax.jit, static_argnames=("net", "loss_fn", "steps", "lr", "weight_decay"))
def _train(params: Any, data: dict, *, net: nn.Module, loss_fn, steps: int, lr: float, weight_decay: float):
    """`steps` full-batch AdamW updates of loss_fn(params, net, data) in one `lax.scan`: (params, (steps,) losses).

    Module-level and keyed on static (net, loss_fn, hyperparameters), so refitting on data of the same shapes
    reuses the compiled loop."""
    tx = optax.adamw(lr, weight_decay=weight_decay)

    def step(carry, _):
        params, opt_state = carry
        loss, grads = jax.value_and_grad(loss_fn)(params, net, data)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    (params, _), losses = jax.lax.scan(step, (params, tx.init(params)), None, length=steps)
    return params, losses


@functools.partial(jax.jit, static_argnums=0)
def _init(net: nn.Module, key: jax.Array, h: jax.Array) -> Any:
    return net.init(key, h)["params"]


@functools.partial(jax.jit, static_argnums=0)
def _apply(net: nn.Module, params: Any, h: jax.Array):
    return net.apply({"params": params}, h)


def _check_training(steps: int, lr: float) -> None:
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")


def _check_finite(name: str, losses: np.ndarray) -> None:
    if not np.all(np.isfinite(losses)):
        first = int(np.argmin(np.isfinite(losses)))
        raise FloatingPointError(f"{name}: non-finite training loss (first at step {first})")


# ------------------------------------------------------------------------------------- matrix factorisation (EmbedLLM)


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
    """Binary cross-entropy of the success head plus squared error of the cost head, over the observed cells."""
    logits, log_cost = net.apply({"params": params}, data["h"])                    # (N, M) each
    bce = optax.sigmoid_binary_cross_entropy(logits, data["success"])
    squared = (log_cost - data["log_cost"]) ** 2
    return _masked_mean(bce, data["observed"]) + _masked_mean(squared, data["observed"])


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
        _check_training(steps, lr)
        lam, c_ref = _check_cost_terms(lam, c_ref)
        table = build_task_model_table(episodes, pool)
        h = jnp.asarray(_task_embeddings(store, table.prompts))                         # (N, D)
        observed = table.observed
        data = {"h": h, "observed": jnp.asarray(observed),
                "success": jnp.asarray(np.where(observed, table.success, 0.0), jnp.float32),
                "log_cost": jnp.asarray(np.where(observed, np.log1p(table.cost / c_ref), 0.0), jnp.float32)}
        net = FactorizationNet(num_models=len(pool), rank=int(rank))
        params = _init(net, jax.random.key(seed), h[:1])
        params, losses = _train(params, data, net=net, loss_fn=_factorization_loss, steps=int(steps), lr=float(lr),
                                weight_decay=float(weight_decay))
        losses = np.asarray(losses)
        _check_finite(cls.name, losses)
        return cls(pool, store, lam, c_ref, net=net, params=params, losses=losses)

    def estimates(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(B, M) estimated success probability and (B, M) estimated episode cost in USD."""
        logits, log_cost = _apply(self.net, self.params, jnp.asarray(h, jnp.float32))
        success = np.asarray(jax.nn.sigmoid(logits), np.float64)
        cost = np.maximum(np.expm1(np.asarray(log_cost, np.float64)), 0.0) * self.c_ref
        return success, cost

    def _scores(self, h):
        success, cost = self.estimates(h)
        return utility(success, cost, self.lam, self.c_ref)                             # (B, M)


# ------------------------------------------------------------------------------------ contrastive (RouterDC)


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
    return _masked_mean(per_task, informative)


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
    default 0.2 never ties a success with a failure, but at lam = 0.05 treats two successes whose episode costs
    differ by less than 4 c_ref as equally good; more positives per task overfit less than one noisy argmax.
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
        _check_training(steps, lr)
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        lam, c_ref = _check_cost_terms(lam, c_ref)
        table = build_task_model_table(episodes, pool)
        positive, negative = positive_models(table.utility(lam, c_ref), margin)
        if not np.any(positive.any(axis=1) & negative.any(axis=1)):
            raise ValueError(f"{cls.name}: on every training task the observed models are tied within margin "
                             f"{margin}; there is no ranking to learn")
        h = jnp.asarray(_task_embeddings(store, table.prompts))                         # (N, D)
        data = {"h": h, "positive": jnp.asarray(positive), "negative": jnp.asarray(negative),
                "temperature": jnp.float32(temperature)}
        net = DualEncoder(num_models=len(pool), hidden=int(hidden), dim=int(dim))
        params = _init(net, jax.random.key(seed), h[:1])
        params, losses = _train(params, data, net=net, loss_fn=_contrastive_loss, steps=int(steps), lr=float(lr),
                                weight_decay=float(weight_decay))
        losses = np.asarray(losses)
        _check_finite(cls.name, losses)
        return cls(pool, store, lam, c_ref, net=net, params=params, losses=losses)

    def _scores(self, h):
        return np.asarray(_apply(self.net, self.params, jnp.asarray(h, jnp.float32)), np.float64)  # (B, M)
