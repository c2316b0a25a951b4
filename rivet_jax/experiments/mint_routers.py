"""RIVET's runs on the MINT logs as routers: training, first-state scores, choices, the validated commitment and the
value error (`rivet_jax.experiments.mint` and `mint_new_models` both evaluate runs this way)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from rivet_jax.data.replay import Reward, episode_rows
from rivet_jax.deploy import best
from rivet_jax.data.schema import Episode
from rivet_jax.encoders import EmbeddingStore, Encoder
from rivet_jax.runs import train_variants
from rivet_jax.experiments.mint_data import MintData, committed, shrunk, task_centres, task_floors
from rivet_jax.router import Router

__all__ = ["train_runs", "load_routers", "load_stages", "first_state_scores", "argmax_choice", "router_choice",
           "validated_commitment", "value_error"]


def train_runs(config, data: MintData, workdir: Path, variants: dict[str, dict], seeds: Sequence[int]
               ) -> dict[str, list[Path]]:
    """Offline (MC + TD) runs of every variant (name -> config overrides) at every seed on the training split, as
    one run group (one compiled program per stage, rivet_jax/engine.py); each variant's directories."""
    return train_variants(config, data.train_path, data.cards_path, workdir,
                          {name: (overrides, "offline") for name, overrides in variants.items()}, seeds)


def load_routers(run_dirs: Sequence[Path], stage: str = "td", encoder: Encoder | None = None) -> list[Router]:
    """The runs' routers at `stage`; `encoder` (the one they were trained with, checked) is shared instead of each
    loading its own copy of the weights."""
    return [Router.from_checkpoint(d, stage=stage, encoder=encoder) for d in run_dirs]


def load_stages(run_dirs: Sequence[Path], encoder: Encoder | None = None) -> dict[str, list[Router]]:
    """The runs' routers at both offline stages, the candidates of `validated_commitment`: {"td": ..., "mc": ...}."""
    return {stage: load_routers(run_dirs, stage, encoder) for stage in ("td", "mc")}


def first_state_scores(router: Router, data: MintData, store: EmbeddingStore, split: str) -> np.ndarray:
    """Q_route(s_0, m) (T, M) for the split's tasks, in one batch from cached embeddings; -inf where a model is
    unavailable on the task."""
    h = store.embed([router.state_text(data.tasks[t].prompt, []) for t in data.split[split]])   # (T, D)
    return router.scores_from_embeddings(h, data.mask(data.split[split], router.pool.names))


def argmax_choice(scores: np.ndarray, names: Sequence[str], task_ids: Sequence[str]) -> Callable[[str], str]:
    """task id -> the model with the highest score (T, M) on that task's row."""
    choices = {t: names[int(b)] for t, b in zip(task_ids, np.argmax(scores, axis=1))}
    return choices.__getitem__


def router_choice(router: Router, data: MintData, store: EmbeddingStore) -> Callable[[str], str]:
    """The router's first-state choice for every test task."""
    return argmax_choice(first_state_scores(router, data, store, "test"), router.pool.names, data.split["test"])


def validated_commitment(stages: dict[str, Sequence[Router]], data: MintData, store: EmbeddingStore, lam: float,
                         gamma: float, shrinkage: Sequence[float], floors: Sequence[str] = ("model",)
                         ) -> tuple[list[Callable[[str], str]], list[dict]]:
    """The stage, floor and shrinkage k with the best mean validation J over the runs; its test choices per run, and
    one row per (stage, floor, k) with its validation J. Ties go to the earlier stage, floor and k.

    A run's first-state scores become floor + k (Q - centre) (`shrunk`): with the "model" floor, each model's mean
    logged training return and the router's mean score (`recentred`); with the "family" floor, the same per task
    family (subset), so that k = 0 is the best fixed model per family and k > 0 adds the router's differences
    between tasks of a family."""
    names = next(iter(stages.values()))[0].pool.names  # every stage's runs share one pool
    floor_of = {kind: {split: task_floors(data, names, data.split[split], kind, lam, gamma)
                       for split in ("validation", "test")} for kind in floors}
    rows, chosen = [], []
    for stage, routers in stages.items():
        scores = [{split: first_state_scores(r, data, store, split) for split in ("train", "validation", "test")}
                  for r in routers]
        for kind in floors:
            floor = floor_of[kind]
            centres = [{split: task_centres(data, s["train"], data.split[split], kind)
                        for split in ("validation", "test")} for s in scores]
            for k in shrinkage:
                j = float(np.mean([committed(data, argmax_choice(
                    shrunk(s["validation"], floor["validation"], c["validation"], k), names, data.split["validation"]),
                    1.0, lam, gamma, split="validation")["return"] for s, c in zip(scores, centres)]))
                rows.append({"stage": stage, "floor": kind, "shrinkage_k": float(k), "validation_return": j,
                             "chosen": ""})
                chosen.append((scores, centres, floor, k))
    index = best([r["validation_return"] for r in rows], tolerance=1e-12)  # the one rule; ties to the earlier
    scores, centres, floor, k = chosen[index]
    rows[index]["chosen"] = "yes"
    return [argmax_choice(shrunk(s["test"], floor["test"], c["test"], k), names, data.split["test"])
            for s, c in zip(scores, centres)], rows


def value_error(router: Router, episodes: Sequence[Episode], gamma: float, store: EmbeddingStore | None = None
                ) -> float:
    """Mean squared error of Q_route(s_t, m_t) against the realised return G_t over every turn of `episodes`.

    `store` (for the router's encoder) embeds each distinct state once across every router evaluated.
    """
    texts, actions, returns = [], [], []
    for episode in episodes:
        rows = episode_rows(episode, router.pool, Reward(router.config.reward.lam, gamma, router.c_ref))
        returns.append(rows["mc_return"])
        actions.append(rows["action"])
        texts += [router.state_text(episode.task.prompt, episode.turns[:t]) for t in range(len(episode.turns))]
    h = store.embed(texts) if store is not None else router.encoder.encode(texts)    # (N, D)
    q = router.scores_from_embeddings(h)                                              # (N, M)
    actions = np.concatenate(actions)
    predicted = q[np.arange(len(actions)), actions]
    return float(np.mean((predicted - np.concatenate(returns)) ** 2))
