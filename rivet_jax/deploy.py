"""The validated choice: what a training workdir deploys, chosen on its held-out validation tasks.

A trained router can be worse than always calling one model and say nothing (docs/own-logs.md). So
training ends (`rivet_jax.fit`) by estimating, on the validation tasks, every candidate it could deploy:

  each run's stage checkpoints     MC, TD (its last epoch and the kept earlier ones, `config.deploy.keep_td_every`),
                                   online (with an environment), one run per conservatism setting
  an ensemble                      per stage, the mean Q_route of those runs (Router.ensemble)
  recentred and shrunk             each of the above as floor(m) + k (Q_route(s, m) - centre(m)) (router.Recentring):
                                   the per-model floor is each model's mean logged return as a fixed model on the
                                   training tasks, centre its mean Q_route over the training states; k in
                                   `config.deploy.shrinkage`. Q_route's level can be far off (the TD stage values
                                   calling m and then routing on; CQL pushes down what was not logged) while its
                                   differences between states still carry the routing; with few training tasks
                                   those differences are noisier than the models' margins, and shrinking them helps.
  the best fixed model             k = 0: floor(m) alone, always the best fixed model of the training tasks

and deploys the best one whose validation return J beats the best fixed model's with a paired 95% interval above 0
(`config.deploy.require_gain`); none does: the best fixed model. The choice is then never worse than the best fixed
model on validation, and is the best fixed model itself unless validation shows a gain.

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

Files: `<workdir>/deploy.json` (the choice, what `Router.from_checkpoint(W)` loads, and every candidate's estimate)
and `<workdir>/selection.md` (the table).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from rivet_jax import evaluation, ope
from rivet_jax.baselines.best_fixed import BEST_FIXED, BestFixedRouter
from rivet_jax.data.files import atomic_write_text
from rivet_jax.data.profile import LogsProfile
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode, ModelPool
from rivet_jax.data.serialize import serialize_state
from rivet_jax.deployment_file import DEPLOY_FILE
from rivet_jax.encoders import EmbeddingStore
from rivet_jax.envs.base import Env, Policy
from rivet_jax.router import Choice, Recentring, Router, keep_previous

SELECTION_FILE = "selection.md"
CHANNELS = ope.CHANNELS          # return J (Eq. 2, discounted), success, dollar cost per episode
J, SUCCESS, COST = range(3)
RANDOM = "random"


# ------------------------------------------------------------------------------------------------ candidates


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One deployable router: runs (directories relative to the workdir; several: an ensemble) at a stage, its
    Q_route as trained (k None) or recentred with shrinkage k (k = 0: the best fixed model)."""

    name: str
    runs: tuple[str, ...]
    stage: str
    k: float | None = None
    epoch: int | None = None  # a kept earlier checkpoint of the stage (None: its last)

    def spec(self, choice: Choice, names: Sequence[str]) -> dict:
        """What deploy.json records for `Router.deployed`: the runs' checkpoint and how it chooses."""
        return {"name": self.name, "runs": list(self.runs), "stage": self.stage, "epoch": self.epoch,
                **choice.spec(names)}


def candidates(runs: Mapping[str, Sequence[str]], stages: Sequence[str], shrinkage: Sequence[float],
               earlier: Mapping[str, Sequence[int]] = {}) -> list[Candidate]:
    """Every candidate of the runs {setting name: its directories (one per seed)} at their trained `stages` (and
    the `earlier` kept epochs of a stage, {stage: epochs}): the best fixed model first (ties go to it), then per
    checkpoint each setting (its seeds averaged) and (several settings) the ensemble of every run, as trained and
    recentred at every k > 0 of `shrinkage`."""
    first = next(iter(runs.values()))[0]
    out = [Candidate(BEST_FIXED, (first,), stages[-1], 0.0)]
    for stage in stages:
        for epoch in [*earlier.get(stage, ()), None]:
            at = stage if epoch is None else f"{stage}@{epoch}"
            groups = [(f"{name} {at}", tuple(directories)) for name, directories in runs.items()]
            if len(runs) > 1:
                groups.append((f"ensemble {at}", tuple(d for directories in runs.values() for d in directories)))
            for name, dirs in groups:
                out.append(Candidate(name, dirs, stage, epoch=epoch))
                out += [Candidate(f"{name} k={k:g}", dirs, stage, float(k), epoch) for k in shrinkage if k > 0]
    return out


def load_router(workdir: Path, candidate: Candidate) -> Router:
    """The candidate's runs at its stage, as trained (recentring is applied by the caller)."""
    members = [Router.from_checkpoint(workdir / run, stage=candidate.stage, epoch=candidate.epoch)
               for run in candidate.runs]
    return members[0] if len(members) == 1 else Router.ensemble(members)


# ----------------------------------------------------------------------------------------- held-out states


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """Held-out episodes as the estimators and the candidates read them (N logged states, M models)."""

    logs: ope.Logs
    h: np.ndarray          # (N, D) the frozen encoder's embedding of each logged state
    previous: np.ndarray   # (N,) pool index of the model called at the previous logged turn; -1 at first turns

    @property
    def features(self) -> np.ndarray:  # (N, D + 1) FQE's features
        return np.concatenate([np.asarray(self.h, np.float64), np.ones((len(self.h), 1))], axis=1)


def held_out(episodes: Sequence[Episode], pool: ModelPool, store: EmbeddingStore, max_tokens: int,
             reward: Reward) -> HeldOut:
    logs = ope.read_logs(episodes, pool, reward)
    texts = [serialize_state(e.task.prompt, e.turns[:t], store.encoder.count_tokens, max_tokens)
             for e in logs.episodes for t in range(len(e.turns))]
    previous = np.array([pool.index(e.turns[t - 1].model) if t else -1
                         for e in logs.episodes for t in range(len(e.turns))])
    return HeldOut(logs, np.asarray(store.embed(texts), np.float32), previous)


def choices(q: np.ndarray, held: HeldOut, commit: bool) -> np.ndarray:
    """(N,) the model chosen at every logged state from scores q (N, M) (unavailable: masked here)."""
    q = np.where(held.logs.available, q, -np.inf)
    return np.argmax(keep_previous(q, held.previous) if commit else q, axis=1)


def one_hot(chosen: np.ndarray, num_models: int) -> np.ndarray:  # (N,) -> (N, M) a deterministic target
    return np.eye(num_models)[chosen]


def uniform(held: HeldOut) -> np.ndarray:  # (N, M) the random router: uniform over the available models
    available = held.logs.available.astype(np.float64)
    return available / available.sum(axis=1, keepdims=True)


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

    def row(self, p: int) -> dict:
        out = {"policy": self.names[p]}
        for c, channel in enumerate(CHANNELS):
            low, high = self.interval(p, c)
            out.update({channel: float(self.point[p, c]), f"{channel}_lo": low, f"{channel}_hi": high})
        return out


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


# ---------------------------------------------------------------------------------------------------- choice


def best(values: Sequence[float], tolerance: float = 0.0) -> int:
    """The index of the best value, the earliest of those within `tolerance` of it: how every validated choice
    picks among its candidates (`choose`; the reproduction's conservatism grid, the MINT commitment's stage, floor
    and shrinkage), so candidates listed simplest first win their ties."""
    values = np.asarray(values, np.float64)
    return int(np.flatnonzero(values >= values.max() - tolerance)[0])


def choose(estimates: Estimates, require_gain: bool) -> int:
    """The deployed-choice rule: the candidate with the best J among those that beat the best fixed model
    (`require_gain`: with a paired interval above 0; else by the point estimate); none: the best fixed model."""
    floor = estimates.index(BEST_FIXED)
    better = [p for p in range(len(estimates.names))
              if p != floor and estimates.difference(p, floor)[1 if require_gain else 0] > 0]
    return better[best(estimates.point[better, J])] if better else floor


def within_budget(rows: Sequence[Mapping], budget: float) -> tuple[int, bool]:
    """The budget rule (`launch.calibrate`): (index of the chosen row, whether it is within the budget), the most
    successful row whose cost interval's upper end (`cost_hi`, $ per episode) is within `budget` (ties: the
    cheaper); none: the cheapest row, not within the budget."""
    by_cost = sorted(range(len(rows)), key=lambda i: rows[i]["cost"])  # the cheaper first: it wins a tie
    feasible = [i for i in by_cost if rows[i]["cost_hi"] <= budget]
    if not feasible:
        return by_cost[0], False
    return feasible[best([rows[i]["success"] for i in feasible])], True  # the one rule, on success


@dataclasses.dataclass
class Scorer:
    """What every candidate needs: the trained routers, the per-model floor and each run's centre."""

    workdir: Path
    pool: ModelPool
    floor: np.ndarray                       # (M,) mean logged return of each model as a fixed model (train)
    train_h: np.ndarray                     # (S, D) the training states the centres are means over
    commit: bool
    _routers: dict = dataclasses.field(default_factory=dict)
    _centres: dict = dataclasses.field(default_factory=dict)

    def router(self, candidate: Candidate) -> Router:
        key = (candidate.runs, candidate.stage, candidate.epoch)
        if key not in self._routers:
            self._routers[key] = load_router(self.workdir, candidate)
        return self._routers[key]

    def recentring(self, candidate: Candidate) -> Recentring | None:
        if candidate.k is None:
            return None
        key = (candidate.runs, candidate.stage, candidate.epoch)  # one centre per checkpoint, whatever k
        if key not in self._centres:
            self._centres[key] = self.router(candidate).scores_from_embeddings(self.train_h).mean(axis=0)  # (M,)
        return Recentring(self.floor, self._centres[key].astype(np.float64), candidate.k)

    def choice(self, candidate: Candidate) -> Choice:
        """How the candidate chooses: recentred with its k (or as trained), committed on A/B logs."""
        return Choice(recentring=self.recentring(candidate), commit=self.commit)

    def deployable(self, candidate: Candidate) -> Router:
        """The candidate as `Router.deployed` loads it."""
        return self.router(candidate).with_choice(self.choice(candidate))

    def scores(self, candidate: Candidate, h: np.ndarray) -> np.ndarray:  # (N, M) at states h (N, D)
        q = self.router(candidate).scores_from_embeddings(h).astype(np.float64)
        recentring = self.recentring(candidate)
        return q if recentring is None else recentring(q)


def fixed_floor(episodes: Sequence[Episode], pool: ModelPool, reward: Reward) -> np.ndarray:
    """(M,) each model's mean logged return as a fixed model on `episodes` (the training tasks'); a model never
    logged alone gets the lowest floor (never the best fixed model; recentred, it can still be chosen)."""
    return floor_of(BestFixedRouter.fit(episodes, pool, reward), pool)


def modelled_floor(fit: HeldOut, seed: int = 0) -> np.ndarray:
    """(M,) each model's value as a fixed model by FQE on `fit` (the training episodes): the mean over their first
    states of V(s) under "always m". For logs in which no episode stayed with one model by design (an exploring
    proxy's draws at every turn), where a mean of logged returns has nothing to average: the few episodes whose
    draws happened to stay with one model are mostly short, easy ones, and ranked a weak model first."""
    num_states, num_models = len(fit.h), fit.logs.available.shape[1]
    targets = np.broadcast_to(np.eye(num_models)[:, None, :], (num_models, num_states, num_models))  # (M, N, M)
    iterations = fit.logs.live.shape[1]
    ridge, _ = ope.choose_ridge(fit.logs, fit.features, targets, iterations, seed=seed)
    fitted = ope.fit_fqe(fit.logs, fit.features, targets, np.ones(num_states), ridge, iterations)
    return fitted.value[fit.logs.first][:, :, J].mean(axis=0)


def floor_of(best_fixed: BestFixedRouter, pool: ModelPool) -> np.ndarray:
    """(M,) a fitted best-fixed router's training returns in pool order, the lowest where a model has none."""
    lowest = min(best_fixed.returns.values())
    return np.array([best_fixed.returns.get(m, lowest) for m in pool.names])


def commits(profile: LogsProfile | None, simulated: bool) -> bool:
    """Whether the deployed router commits (keeps the first turn's model): on A/B logs (one model per episode),
    which show what committing gives and nothing of switching, unless an environment can roll switching out.
    Every command that deploys (training's choice, calibrate) asks this; `profile` may be None when simulated."""
    return not simulated and profile.ab_logs


def write_deployment(workdir: Path, deployed: dict, fields: dict) -> None:
    """<workdir>/deploy.json, the one writer: `deployed` (a `Candidate.spec`: what `Router.from_checkpoint(workdir)`
    loads) and `fields` (how it was chosen: estimates, candidates, settings; the command that chose)."""
    document = {"deploy": deployed, **fields}
    atomic_write_text(workdir / DEPLOY_FILE, json.dumps(document, indent=1, allow_nan=True) + "\n")


def selection_table(rows: list[dict], estimates: Estimates, chosen: str, heading: str) -> str:
    lines = [f"# {heading}", "",
             f"Validation estimates ({estimates.estimator}: {estimates.note}). J is Eq. 2's discounted return per "
             f"episode; intervals are 95% over tasks; 'vs best fixed' is the paired difference in J (nan: not "
             f"resampled, its J is not above the best fixed model's).", "",
             "| candidate | J | 95% | success | cost/episode ($) | vs best fixed | 95% | |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['return']:.4f} | [{r['return_lo']:.4f}, {r['return_hi']:.4f}] | "
                     f"{r['success']:.3f} | {r['cost']:.5f} | {r['gain']:+.4f} | [{r['gain_lo']:+.4f}, "
                     f"{r['gain_hi']:+.4f}] | {'**deployed**' if r['policy'] == chosen else ''} |")
    return "\n".join(lines) + "\n"


def candidate_rows(estimates: Estimates, floor_name: str = BEST_FIXED) -> list[dict]:
    """Every candidate's estimates and its paired gain over `floor_name` (the best fixed model)."""
    floor = estimates.index(floor_name)
    rows = []
    for p in range(len(estimates.names)):
        gain, low, high = estimates.difference(p, floor)
        rows.append({**estimates.row(p), "gain": gain, "gain_lo": low, "gain_hi": high})
    return rows


def targets_of(scorer: Scorer, chosen_candidates: Sequence[Candidate], held: HeldOut) -> dict[str, np.ndarray]:
    """{candidate name: (N, M) its deterministic choice at every held-out logged state}."""
    return {c.name: one_hot(choices(scorer.scores(c, held.h), held, scorer.commit), len(scorer.pool))
            for c in chosen_candidates}


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

