"""Held-out episodes and the estimates of what each candidate router would get on them: the evidence every
validated choice (`rivet_jax.deploy`), verdict and round of the live loop rests on.

Estimates (J of Eq. 2, discounted, with success and dollar cost per episode; bootstrap over tasks):
  rollouts     with an environment (RouteSim): every candidate rolled out on its validation tasks, exactly
  DR           logs recorded with exact propensities (the exploring proxy: most held-out episodes carry them):
               doubly robust, FQE's values corrected by importance-weighted residuals (`rivet_jax.ope`), so the
               choice rests on what exploration actually tried, not only on a fitted model
  committed    A/B logs (one model per episode) where most validation tasks have an episode of every model: a
               candidate chooses at the first turn and keeps that model (the logs show nothing about switching), so
               its value on a task is the logged value of its first choice's episodes, exactly
  FQE          otherwise: fitted-Q evaluation on the held-out logs (`rivet_jax.ope`; on RouteSim's held-out logs
               the most accurate estimator), refitted on every resample
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

from rivet_jax import evaluation, ope
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode, ModelPool
from rivet_jax.data.serialize import serialize_state
from rivet_jax.encoders import EmbeddingStore
from rivet_jax.envs.base import Env, Policy

CHANNELS = ope.CHANNELS          # return J (Eq. 2, discounted), success, dollar cost per episode
J, SUCCESS, COST = range(3)


# ----------------------------------------------------------------------------------------- held-out states


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """Held-out episodes as the estimators and the candidates read them (N logged states, M models)."""

    logs: ope.Logs
    h: np.ndarray          # (N, D) the frozen encoder's embedding of each logged state
    previous: np.ndarray   # (N,) pool index of the model called at the previous logged turn; -1 at first turns

    @property
    def features(self) -> np.ndarray:  # (N, D + 1) FQE's features on the whole embedding
        return principal_features(self.h, 0)

    @property
    def families(self) -> list[str | None]:  # (N,) the task family of each logged state (None: none logged)
        return [e.task.family for e in self.logs.episodes for _ in e.turns]


def principal_features(h: np.ndarray, k: int) -> np.ndarray:
    """FQE's features with the state embedding h (N, D) on its own top-k principal directions, [(h - mean) V_k, 1]
    (N, k + 1); the plain [h, 1] when k >= D or k = 0 (`settings.FQE_FEATURES`: the commands' default). A fit costs
    about N D^2 + M D^3 (each model's system), so on big logs fewer dimensions are what makes a bootstrap of refits
    affordable: on the 49-model pool's test split (32,429 states, D = 1024) k = 512 fits in 2.6 s instead of 7.9 s
    and moves each policy's FQE J by 0.001 on average (at most 0.014; k = 256: 1.3 s, 0.005, at most 0.058). With
    the ridge's unpenalised intercept, directions the states do not vary along change nothing: such h give the same
    fit."""
    h = np.asarray(h, np.float64)
    if 0 < k < h.shape[1]:
        centred = h - h.mean(axis=0)
        _, vectors = np.linalg.eigh(centred.T @ centred)                                # ascending eigenvalues
        h = centred @ vectors[:, ::-1][:, :k]                                           # (N, k)
    return np.concatenate([h, np.ones((len(h), 1))], axis=1)


def held_out(episodes: Sequence[Episode], pool: ModelPool, store: EmbeddingStore, max_tokens: int,
             reward: Reward) -> HeldOut:
    logs = ope.read_logs(episodes, pool, reward)
    texts = [serialize_state(e.task.prompt, e.turns[:t], store.encoder.count_tokens, max_tokens)
             for e in logs.episodes for t in range(len(e.turns))]
    previous = np.array([pool.index(e.turns[t - 1].model) if t else -1
                         for e in logs.episodes for t in range(len(e.turns))])
    return HeldOut(logs, np.asarray(store.embed(texts), np.float32), previous)


# ------------------------------------------------------------------------------------------------ estimates


@dataclasses.dataclass(frozen=True)
class Estimates:
    """P policies' J, success and cost per episode (C = 3), their bootstrap draws (the same resamples for every
    policy: paired differences are read from them), and how they were estimated."""

    names: list[str]
    point: np.ndarray    # (P, C)
    draws: np.ndarray    # (B, P, C)
    estimator: str       # rollouts | committed | FQE | DR
    tasks: int           # the tasks estimated on (the bootstrap's unit)
    note: str = ""

    def index(self, name: str) -> int:
        return self.names.index(name)

    def interval(self, p: int, channel: int, level: float = 0.95) -> tuple[float, float]:
        """The percentile interval of policy p's channel (nan, nan where it was not resampled)."""
        return percentiles(self.draws[:, p, channel], level)

    def difference(self, p: int, q: int, channel: int = J, level: float = 0.95) -> tuple[float, float, float]:
        """Policy p minus policy q: the estimate and its paired interval."""
        low, high = percentiles(self.draws[:, p, channel] - self.draws[:, q, channel], level)
        return float(self.point[p, channel] - self.point[q, channel]), low, high

    def only(self, names: Sequence[str]) -> "Estimates":
        """These estimates of `names` alone, in that order."""
        rows = [self.index(name) for name in names]
        return dataclasses.replace(self, names=list(names), point=self.point[rows], draws=self.draws[:, rows])

    def row(self, p: int) -> dict:
        out = {"policy": self.names[p]}
        for c, channel in enumerate(CHANNELS):
            low, high = self.interval(p, c)
            out.update({channel: float(self.point[p, c]), f"{channel}_lo": low, f"{channel}_hi": high})
        return out


def pooled(parts: Sequence[Estimates], note: str) -> Estimates:
    """The estimates of disjoint sets of tasks (cross-validation's folds, the same policies in each) as one
    estimate over all of them: each part weighted by its tasks, point and bootstrap draws alike (a stratified
    bootstrap: every part resampled within itself, as it was)."""
    names = parts[0].names
    if any(part.names != names for part in parts):
        raise ValueError("pooled estimates need the same policies, in the same order, in every part")
    weights = np.array([part.tasks for part in parts], np.float64) / sum(part.tasks for part in parts)
    return Estimates(list(names), np.einsum("k,kpc->pc", weights, np.stack([part.point for part in parts])),
                     np.einsum("k,kbpc->bpc", weights, np.stack([part.draws for part in parts])),
                     parts[0].estimator, sum(part.tasks for part in parts), note)


def percentiles(draws: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The central `level` percentile interval of bootstrap draws (nan, nan where none was drawn)."""
    if np.isnan(draws).all():
        return math.nan, math.nan
    tail = 100 * (1 - level) / 2
    low, high = np.nanpercentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def task_bootstrap(per_task: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """Means of per-task values (P, T, C) over tasks drawn with replacement: (B, P, C)."""
    counts = ope.bootstrap_counts(np.arange(per_task.shape[1]), resamples, seed)                     # (B, T)
    return np.einsum("bt,ptc->bpc", counts, per_task) / per_task.shape[1]


def complete_tasks(held: HeldOut, num_models: int) -> list[str]:
    """The held-out tasks with a one-model episode of every pool model (exact committed evaluation)."""
    covered: dict[str, set[int]] = {}
    for e, first in zip(held.logs.episodes, held.logs.first):
        episode_models = set(held.logs.action[first:first + len(e.turns)].tolist())
        if len(episode_models) == 1:
            covered.setdefault(e.task.id, set()).update(episode_models)
    return sorted(t for t, models in covered.items() if len(models) == num_models)


def committed_estimates(held: HeldOut, targets: Mapping[str, np.ndarray], tasks: Sequence[str], resamples: int,
                        seed: int) -> Estimates:
    """Committed routing, exactly: on each task, the target's first-turn distribution over models times each
    model's logged values there (the mean over its one-model episodes of J, success and cost)."""
    logs = held.logs
    row_of_task, values = {t: i for i, t in enumerate(tasks)}, np.zeros((len(tasks), logs.available.shape[1], 3))
    counts, first_row = np.zeros(values.shape[:2]), {}
    discounted = ope.is_terms(logs, np.where(logs.live, 1.0, 0.0))                                  # (n, C)
    for i, (e, first) in enumerate(zip(logs.episodes, logs.first)):
        if e.task.id not in row_of_task:
            continue
        models = set(logs.action[first:first + len(e.turns)].tolist())
        if len(models) == 1:
            t, m = row_of_task[e.task.id], models.pop()
            values[t, m] += discounted[i]
            counts[t, m] += 1
            first_row.setdefault(e.task.id, first)
    values /= np.maximum(counts, 1)[:, :, None]
    rows = np.array([first_row[t] for t in tasks])
    per_task = np.stack([np.einsum("tm,tmc->tc", target[rows], values) for target in targets.values()])  # (P,T,C)
    return Estimates(list(targets), per_task.mean(axis=1), task_bootstrap(per_task, resamples, seed), "committed",
                     len(tasks), f"the logged value of each task's first choice, on the {len(tasks)} held-out tasks "
                             f"with an episode of every model")


def fqe_estimates(held: HeldOut, targets: Mapping[str, np.ndarray], resamples: int, seed: int,
                  screen_against: str | None = None, estimator: str = "FQE") -> Estimates:
    """FQE of every target (`estimator` "DR": doubly robust, FQE's values corrected by the importance-weighted
    residuals of the episodes logged with exact propensities); targets that choose alike at every state
    (candidates often do) are fitted once.

    `screen_against` (a target's name, the best fixed model): first one fit of every target, then the bootstrap
    only of that target and those whose point estimate of J beats it; the others (which `choose` cannot take)
    keep their point estimate and nan draws. Each refit costs in proportion to the targets it carries, so this
    spares most of the bootstrap when most candidates are no better than the floor."""
    first: dict[bytes, np.ndarray] = {}
    for target in targets.values():
        first.setdefault(target.tobytes(), target)
    index = {key: i for i, key in enumerate(first)}
    which = np.array([index[target.tobytes()] for target in targets.values()])                      # (P,)
    unique = list(first.values())
    screen = screen_against is not None and len(unique) > 2
    kept: list[int] = []

    def evaluate(rows: Sequence[int], count: int, ridge: float | None) -> dict:
        return ope.evaluate(held.logs, {str(i): unique[i] for i in rows}, held.features, resamples=count, seed=seed,
                            ridge=ridge, keep_draws=True)

    def fqe_points(result: dict) -> dict[int, list[float]]:
        return {int(r["policy"]): [r[c] for c in CHANNELS] for r in result["rows"] if r["estimator"] == estimator}

    result = evaluate(range(len(unique)), 1 if screen else resamples, None)
    point = np.array([fqe_points(result)[i] for i in range(len(unique))])                          # (U, C)
    if screen:
        floor = int(which[list(targets).index(screen_against)])
        kept = [floor] + [i for i in range(len(unique)) if i != floor and point[i, J] > point[floor, J]]
        result = evaluate(kept, resamples, result["ridge"])
        draws = np.full((resamples, len(unique), 3), np.nan)
        draws[:, kept] = result["draws"][estimator]
    else:
        draws = result["draws"][estimator]
    how = ("fitted-Q evaluation" if estimator == "FQE" else
           f"doubly robust (FQE + importance weights of the {result['supported']} episodes with exact propensities)")
    return Estimates(list(targets), point[which], draws[:, which], estimator, result["tasks"],
                     f"{how} on {result['episodes']} held-out episodes of {result['tasks']} tasks "
                     f"(ridge {result['ridge']:g}; {len(unique)} distinct policies among {len(targets)}"
                     f"{f', {len(kept)} of them resampled: the best fixed model and those above it' if screen else ''})")


def rollout_estimates(env: Env, policies: Mapping[str, Policy], split: str, rollouts: int, seed: int, reward: Reward,
                      resamples: int) -> tuple[Estimates, list[list[Episode]]]:
    """Every policy rolled out `rollouts` times per task of `split`, exactly; also the episodes."""
    rolled = evaluation.rollout_each(env, list(policies.values()), split, rollouts, seed)
    per_task = np.stack([per_task_values(episodes, reward) for episodes in rolled])       # (P, T, C)
    tasks = per_task.shape[1]
    estimates = Estimates(list(policies), per_task.mean(axis=1), task_bootstrap(per_task, resamples, seed),
                          "rollouts", tasks, f"{rollouts} rollout(s) of each of {tasks} {split} tasks")
    return estimates, rolled


def per_task_values(episodes: Sequence[Episode], reward: Reward) -> np.ndarray:
    """(T, C) each task's mean J (Eq. 2 at `reward`), success and dollar cost over its episodes, tasks sorted by id."""
    tasks = sorted({e.task.id for e in episodes})
    index = {t: i for i, t in enumerate(tasks)}
    totals, counts = np.zeros((len(tasks), 3)), np.zeros(len(tasks))
    for e in episodes:
        totals[index[e.task.id]] += (evaluation.discounted_return(e, reward), e.outcome,
                                     sum(t.cost for t in e.turns))
        counts[index[e.task.id]] += 1
    return totals / counts[:, None]


def crossfit_estimates(held: HeldOut, targets: Mapping[str, np.ndarray], fit: HeldOut,
                       fit_targets: Mapping[str, np.ndarray], resamples: int, seed: int,
                       max_weight: float = np.inf) -> Estimates:
    """Doubly robust estimates on the held-out episodes with FQE's Q fitted on other logs (`fit`: the training
    split; `ope.crossfit_dr`), every target paired on the same resamples."""
    return crossfit_parts(held, targets, fit, fit_targets, [np.ones(len(held.logs.episodes), bool)], resamples, seed,
                          max_weight)[0]


def crossfit_parts(held: HeldOut, targets: Mapping[str, np.ndarray], fit: HeldOut,
                   fit_targets: Mapping[str, np.ndarray], parts: Sequence[np.ndarray], resamples: int, seed: int,
                   max_weight: float = np.inf) -> list[Estimates]:
    """`crossfit_estimates` on each part of the held-out episodes (boolean (n,) masks) alone, with one fitted model.
    Targets that choose alike at every state of both are fitted once."""
    first: dict[bytes, int] = {}
    which = np.array([first.setdefault(targets[n].tobytes() + fit_targets[n].tobytes(), len(first)) for n in targets])
    unique = [list(targets)[list(which).index(u)] for u in range(len(first))]
    result = ope.crossfit_dr(held.logs, held.features, np.stack([targets[n] for n in unique]), fit.logs,
                             fit.features, np.stack([fit_targets[n] for n in unique]), resamples, seed,
                             max_weight, parts)
    return [Estimates(list(targets), part["point"][which], part["draws"][:, which], "DR", part["tasks"],
                      f"doubly robust on {part['episodes']} held-out episodes of {part['tasks']} tasks "
                      f"({part['supported']} with exact propensities), FQE's Q cross-fitted on the "
                      f"{len(fit.logs.episodes)} training episodes, weights over {max_weight:g} switched to the model "
                      f"(ridge {result['ridge']:g}; {len(unique)} distinct policies among {len(targets)})")
            for part in result["parts"]]


MIN_EXPLORED = 0.5  # the share of held-out episodes with exact propensities from which the choice uses DR


def explored_share(held: HeldOut) -> float:
    """The share of held-out episodes the importance-weighted estimators may use (`ope.logging_support`: logged with
    exact propensities, e.g. recorded by the exploring proxy)."""
    return float(ope.logging_support(held.logs).episodes.mean())


def log_estimates(held: HeldOut, targets: Mapping[str, np.ndarray], committed: bool, resamples: int, seed: int,
                  min_complete: float = 0.5, screen_against: str | None = None,
                  fit: tuple[HeldOut, Mapping[str, np.ndarray]] | None = None,
                  max_weight: float = np.inf) -> Estimates:
    """Doubly robust estimates where at least `MIN_EXPLORED` of the held-out episodes carry exact propensities
    (`explored_share`: logs the proxy recorded while exploring), cross-fitted on `fit` (the training split and the
    targets' choices there) where given; else committed estimates where the held-out tasks support them
    (`committed`, and at least `min_complete` of the tasks with an episode of every model); else FQE
    (`fqe_estimates`, screened against `screen_against`)."""
    if explored_share(held) >= MIN_EXPLORED:
        if fit is not None:
            return crossfit_estimates(held, targets, fit[0], fit[1], resamples, seed, max_weight)
        return fqe_estimates(held, targets, resamples, seed, screen_against, estimator="DR")
    if committed:
        tasks = complete_tasks(held, held.logs.available.shape[1])
        if len(tasks) >= max(2, min_complete * len({e.task.id for e in held.logs.episodes})):
            return committed_estimates(held, targets, tasks, resamples, seed)
    return fqe_estimates(held, targets, resamples, seed, screen_against)

