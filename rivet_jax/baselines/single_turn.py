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

The shared pieces (the table, the utility, the `SingleTurnRouter` base) live in single_turn_base.py, the training
loop of the two learned routers in fitting.py, and each router in its own module; this module re-exports them so
that `from rivet_jax.baselines.single_turn import KNNRouter` keeps working.
"""

from rivet_jax.baselines.cluster import ClusterRouter, kmeans
from rivet_jax.baselines.contrastive import ContrastiveRouter, DualEncoder, positive_models, sample_llm_contrastive
from rivet_jax.baselines.knn import KNNRouter
from rivet_jax.baselines.matrix_factorization import FactorizationNet, MatrixFactorizationRouter
from rivet_jax.baselines.single_turn_base import (SingleTurnRouter, TaskModelTable, build_task_model_table,
                                                  is_single_model, task_embeddings, utility)

__all__ = [
    "TaskModelTable",
    "is_single_model",
    "build_task_model_table",
    "utility",
    "task_embeddings",
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
