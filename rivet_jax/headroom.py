"""How much can a router gain on these logs? A cross-validated answer from A/B logs in seconds, before any training.

Where the logs hold an episode of several models on each task (A/B logs: MINT's, a team's bake-off), the committed
value of any rule that picks one model per task is read off the logs: the logged J of the model it picks. Over the
non-test tasks, dealt into folds per family (`data.splits.task_folds`, as `deploy.folds` deals them), each rule is
fitted on the other folds' tasks and scored on its own fold's, so every task is scored by a rule that never saw it:

- best fixed model: the model with the best mean J;
- best fixed per family: per task family, the model with the best mean J on that family's tasks;
- per-task learners of each model's deviation from its family mean, from the task's first state (its embedding by
  the configured encoder: what a committed router reads before the first call): ridge (penalty x shrinkage) and
  the k nearest tasks of the family (cosine).

`headroom` reports each rule's J and its paired gain over the better fixed rule (95% bootstrap over tasks). A
learner far above both shows what a router can find in the logs' tasks; learners at the fixed rules' level say
that, with these tasks and this encoder, what to call is decided by the family alone and a router trained here
should not be expected to beat route-by-family. The grid's best row is the best of several, so it is optimistic.
Every rule here commits to one model per task: what switching mid-episode adds, A/B logs cannot show (RouteSim's
demo logs, whose loggers switch, give their one-model episodes' committed headroom only).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Sequence

import numpy as np

from rivet_jax import corpus, encoders, evaluation, heldout
from rivet_jax.data.replay import Reward, reference_cost
from rivet_jax.data.schema import DataError, Episode
from rivet_jax.data.serialize import serialize_state
from rivet_jax.data.splits import episodes_of, task_folds
from rivet_jax.encoders import make_encoder

BEST_FIXED, BEST_PER_FAMILY = "best fixed", "best fixed per family"
RIDGE = tuple((penalty, shrink) for penalty in (1.0, 10.0, 100.0) for shrink in (0.5, 1.0))
NEIGHBOURS = (10, 20)


def value_matrix(episodes: Sequence[Episode], names: Sequence[str], reward: Reward
                 ) -> tuple[list[Episode], np.ndarray]:
    """(each task's first episode, in task order; (T, M) J of each model on each task, the mean of its one-model
    episodes there, nan where it has none). Only tasks logged with two models or more: a rule can choose there."""
    column = {name: m for m, name in enumerate(names)}
    returns: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    first: dict[str, Episode] = {}
    for episode in episodes:
        models = {turn.model for turn in episode.turns}
        if len(models) == 1:
            first.setdefault(episode.task.id, episode)
            returns[episode.task.id][column[models.pop()]].append(evaluation.discounted_return(episode, reward))
    tasks = sorted(t for t, by_model in returns.items() if len(by_model) >= 2)
    values = np.full((len(tasks), len(names)), np.nan)
    for i, task in enumerate(tasks):
        for m, logged in returns[task].items():
            values[i, m] = np.mean(logged)
    return [first[t] for t in tasks], values


def folds_of(tasks: Sequence[Episode], folds: int, seed: int) -> np.ndarray:
    """(T,) each task's fold, dealt per family as `deploy.folds` deals them."""
    ids = [e.task.id for e in tasks]
    parts = task_folds({"train": ids, "test": []}, tasks, folds, seed)
    fold_of = {task: j for j, part in enumerate(parts) for task in part["validation"]}
    return np.array([fold_of[t] for t in ids])


def _means(values: np.ndarray) -> np.ndarray:
    """(M,) each model's mean over the tasks that logged it; -inf for a model logged on none (never picked)."""
    logged = ~np.isnan(values)
    counts = logged.sum(axis=0)
    total = np.where(logged, values, 0.0).sum(axis=0)
    return np.where(counts > 0, total / np.maximum(counts, 1), -np.inf)


def _family_floors(values: np.ndarray, families: np.ndarray, fit: np.ndarray) -> dict[str, np.ndarray]:
    """{family: (M,) each model's mean on the fitted tasks of the family}; a model those tasks never logged ranks,
    in its overall order, below those they did; a family with no fitted task takes the overall means."""
    overall = _means(values[fit])
    top = overall[np.isfinite(overall)].max()
    floors = {}
    for family in np.unique(families):
        own = _means(values[fit[families[fit] == family]])
        known = np.isfinite(own)
        # the others below the lowest known, in their overall order (-inf stays -inf)
        floors[family] = np.where(known, own, own[known].min() - 1.0 + (overall - top)) if known.any() else overall
    return floors


def _ridge(x: np.ndarray, y: np.ndarray, penalty: float) -> np.ndarray:
    """(D, M) the ridge solution of y (N, M) on x (N, D), through the N x N system where N < D (the same solution)."""
    if len(x) < x.shape[1]:
        return x.T @ np.linalg.solve(x @ x.T + penalty * np.eye(len(x)), y)
    return np.linalg.solve(x.T @ x + penalty * np.eye(x.shape[1]), x.T @ y)


def _pick(scores: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(rows,) the value of each row's best-scored model among those logged on its task."""
    chosen = np.where(np.isnan(values), -np.inf, scores).argmax(axis=1)
    return values[np.arange(len(values)), chosen]


def crossvalidated_values(values: np.ndarray, families: np.ndarray, states: np.ndarray, fold: np.ndarray
                          ) -> dict[str, np.ndarray]:
    """{rule: (T,) the value on each task of the rule fitted on the other folds' tasks}. values (T, M) with nan
    where unlogged; families (T,); states (T, D) the first states' embeddings; fold (T,)."""
    out: dict[str, np.ndarray] = defaultdict(lambda: np.full(len(values), np.nan))
    states = np.asarray(states, np.float64)
    unit = states / np.maximum(np.linalg.norm(states, axis=1, keepdims=True), 1e-12)   # cosine for the neighbours
    for j in np.unique(fold):
        fit, held = np.flatnonzero(fold != j), np.flatnonzero(fold == j)
        out[BEST_FIXED][held] = _pick(np.broadcast_to(_means(values[fit]), (len(held), values.shape[1])),
                                      values[held])
        floors = _family_floors(values, families, fit)
        floor_held = np.stack([floors[f] for f in families[held]])                                  # (H, M)
        out[BEST_PER_FAMILY][held] = _pick(floor_held, values[held])
        # what the family mean misses on each fitted task (0 where unlogged: no evidence either way)
        residual = np.nan_to_num(values[fit] - np.stack([floors[f] for f in families[fit]]))      # (F, M)
        for penalty, shrink in RIDGE:
            weights = _ridge(states[fit], residual, penalty)                                        # (D, M)
            out[f"ridge penalty={penalty:g} k={shrink:g}"][held] = _pick(
                floor_held + shrink * states[held] @ weights, values[held])
        logged = ~np.isnan(values[fit])
        for k in NEIGHBOURS:
            deviation = _neighbour_deviation(unit, families, fit, held, residual, logged, k)
            out[f"{k} nearest tasks of the family"][held] = _pick(floor_held + deviation, values[held])
    return dict(out)


def _neighbour_deviation(unit: np.ndarray, families: np.ndarray, fit: np.ndarray, held: np.ndarray,
                         residual: np.ndarray, logged: np.ndarray, k: int) -> np.ndarray:
    """(H, M) each model's mean residual over the k fitted tasks of the held task's family nearest by cosine
    (`unit`: the states scaled to length 1; `logged` (F, M): where a fitted task logged the model)."""
    out = np.zeros((len(held), residual.shape[1]))
    for row, task in enumerate(held):
        same = np.flatnonzero(families[fit] == families[task])
        near = same[np.argsort(-(unit[fit[same]] @ unit[task]), kind="stable")[:k]]
        out[row] = (residual[near] * logged[near]).sum(axis=0) / np.maximum(logged[near].sum(axis=0), 1)
    return out


def headroom(per_task: dict[str, np.ndarray], resamples: int = 2000, seed: int = 0) -> list[dict]:
    """Rows {rule, J, gain, gain_low, gain_high}: each rule's mean J over the tasks and its paired gain over the
    better of the two fixed rules, with a 95% bootstrap interval over tasks (the same resamples for every rule)."""
    names = list(per_task)
    stacked = np.stack([per_task[n] for n in names])[:, :, None]                                  # (P, T, 1)
    draws = heldout.task_bootstrap(stacked, resamples, seed)[:, :, 0]                             # (B, P)
    point = stacked[:, :, 0].mean(axis=1)
    reference = max((names.index(BEST_FIXED), names.index(BEST_PER_FAMILY)), key=lambda p: point[p])
    rows = []
    for p, name in enumerate(names):
        low, high = heldout.percentiles(draws[:, p] - draws[:, reference])
        rows.append({"rule": name, "J": float(point[p]), "gain": float(point[p] - point[reference]),
                     "gain_low": low, "gain_high": high, "reference": p == reference})
    return rows


def format_headroom(rows: list[dict], tasks: int, folds: int, lam: float) -> str:
    lines = [f"# How much a router can gain: {folds}-fold cross-validation over {tasks} non-test tasks "
             f"(lambda {lam:g})", "",
             "| rule | J | gain over the better fixed rule [95%] |", "|---|---|---|"]
    for row in rows:
        gain = ("(the reference)" if row["reference"] else
                f"{row['gain']:+.4f} [{row['gain_low']:+.4f}, {row['gain_high']:+.4f}]")
        lines.append(f"| {row['rule']} | {row['J']:.4f} | {gain} |")
    return "\n".join(lines) + "\n"


def run_headroom(config, workdir: str | Path, folds: int, resamples: int = 2000) -> str:
    """`launch.headroom`: the configured logs' non-test tasks (the workdir's split, as `launch.train` draws or reads
    it), their first states embedded by the configured encoder (the workdir's cache), each rule cross-validated over
    `folds` folds at the configured lambda; writes <workdir>/headroom.{md,json} and returns the table."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    episode_files, cards_path = corpus.corpus_paths(config, workdir)
    pool, episode_file = corpus.read_logs(config, episode_files, cards_path)
    episodes = episode_file.episodes
    splits = corpus.task_split(config, workdir, episodes)      # launch.train's, drawn or read
    training = episodes if splits is None else episodes_of(episodes, splits["train"])
    c_ref = config.reward.c_ref if config.reward.c_ref is not None else reference_cost(training)
    test = set() if splits is None else set(splits["test"])
    tasks, values = value_matrix([e for e in episodes if e.task.id not in test], pool.names,
                                 Reward.of(config, c_ref))
    if len(tasks) < 2 * folds:
        raise DataError(",".join(map(str, episode_files)), None, "task",
                        f"{len(tasks)} non-test task(s) logged with two models or more: {folds}-fold cross-validation "
                        f"needs {2 * folds} (headroom reads A/B logs: several models per task)")
    store = encoders.embedding_store(config, make_encoder(config.encoder), workdir)
    states = store.embed([serialize_state(e.task.prompt, (), store.encoder.count_tokens, config.max_state_tokens)
                          for e in tasks])
    families = np.array([e.task.family or "" for e in tasks])
    per_task = crossvalidated_values(values, families, states, folds_of(tasks, folds, config.data.holdout.seed))
    rows = headroom(per_task, resamples, config.data.holdout.seed)
    table = format_headroom(rows, len(tasks), folds, float(config.reward.lam))
    (workdir / "headroom.md").write_text(table, encoding="utf-8")
    (workdir / "headroom.json").write_text(json.dumps({"tasks": len(tasks), "folds": folds, "lam": config.reward.lam,
                                                       "rows": rows}, indent=1), encoding="utf-8")
    return table
