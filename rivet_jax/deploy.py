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
  per task family                  where the training tasks have families with floors of their own
                                   (`config.deploy.by_family`, `family_floors`): the best fixed model per family
                                   (k = 0) and every recentred candidate again on the floor and centre of the
                                   task's family: "route by family", and the router's differences around it

and deploys the best one whose validation return J beats the `reference` rule's (the best fixed model, or route by
family where it validates higher) with a paired 95% interval above 0 (`config.deploy.require_gain`), or,
pre-registered, a bound that holds for all candidates at once (`config.deploy.simultaneous`,
`simultaneous_gain_bounds`: chosen among a hundred, the best estimate is the one noise flattered most), and among
those the simplest within one paired standard error of the best (`config.deploy.one_se`); none: the reference.
The choice is then never worse than the reference on validation, and is the reference itself unless validation
shows a gain.

The estimates: `rivet_jax.heldout` (rollouts, doubly robust, committed or fitted-Q, as the data allow).

Files: `<workdir>/deploy.json` (the choice, what `Router.from_checkpoint(W)` loads, and every candidate's estimate)
and `<workdir>/selection.md` (the table).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from rivet_jax import fqe, ope
from rivet_jax.baselines.best_fixed import BEST_FIXED, BEST_PER_FAMILY, BestFixedRouter, BestPerFamilyRouter
from rivet_jax.data.files import atomic_write_text
from rivet_jax.data.profile import LogsProfile
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode, ModelPool
from rivet_jax.deployment_file import DEPLOY_FILE
from rivet_jax.heldout import J, Estimates, HeldOut
from rivet_jax.router import Choice, Recentring, Router, keep_previous

SELECTION_FILE = "selection.md"
RANDOM = "random"


# ------------------------------------------------------------------------------------------------ candidates


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One deployable router: runs (directories relative to the workdir; several: an ensemble) at a stage, its
    Q_route as trained (k None) or recentred with shrinkage k (k = 0: the best fixed model), on the overall floor or
    (`by_family`) on the floor of the task's family (k = 0: the best fixed model per family)."""

    name: str
    runs: tuple[str, ...]
    stage: str
    k: float | None = None
    epoch: int | None = None  # a kept earlier checkpoint of the stage (None: its last)
    by_family: bool = False

    def spec(self, choice: Choice, names: Sequence[str]) -> dict:
        """What deploy.json records for `Router.deployed`: the runs' checkpoint and how it chooses."""
        return {"name": self.name, "runs": list(self.runs), "stage": self.stage, "epoch": self.epoch,
                **choice.spec(names)}


def candidates(runs: Mapping[str, Sequence[str]], stages: Sequence[str], shrinkage: Sequence[float],
               earlier: Mapping[str, Sequence[int]] = {}, by_family: bool = False) -> list[Candidate]:
    """Every candidate of the runs {setting name: its directories (one per seed)} at their trained `stages` (and
    the `earlier` kept epochs of a stage, {stage: epochs}): the best fixed model first (ties go to it), then per
    checkpoint each setting (its seeds averaged) and (several settings) the ensemble of every run, as trained and
    recentred at every k > 0 of `shrinkage`; `by_family` (the training tasks' families have floors of their own):
    the best fixed model per family second, and every recentred candidate on the family floors too."""
    first = next(iter(runs.values()))[0]
    out = [Candidate(BEST_FIXED, (first,), stages[-1], 0.0)]
    if by_family:
        out.append(Candidate(BEST_PER_FAMILY, (first,), stages[-1], 0.0, by_family=True))
    grounds = [(False, ""), (True, " by family")] if by_family else [(False, "")]
    for stage in stages:
        for epoch in [*earlier.get(stage, ()), None]:
            at = stage if epoch is None else f"{stage}@{epoch}"
            groups = [(f"{name} {at}", tuple(directories)) for name, directories in runs.items()]
            if len(runs) > 1:
                groups.append((f"ensemble {at}", tuple(d for directories in runs.values() for d in directories)))
            for name, dirs in groups:
                out.append(Candidate(name, dirs, stage, epoch=epoch))
                out += [Candidate(f"{name} k={k:g}{suffix}", dirs, stage, float(k), epoch, grouped)
                        for grouped, suffix in grounds for k in shrinkage if k > 0]
    return out


def load_router(workdir: Path, candidate: Candidate) -> Router:
    """The candidate's runs at its stage, as trained (recentring is applied by the caller)."""
    members = [Router.from_checkpoint(workdir / run, stage=candidate.stage, epoch=candidate.epoch)
               for run in candidate.runs]
    return members[0] if len(members) == 1 else Router.ensemble(members)


def choices(q: np.ndarray, held: HeldOut, commit: bool) -> np.ndarray:
    """(N,) the model chosen at every logged state from scores q (N, M) (unavailable: masked here)."""
    q = np.where(held.logs.available, q, -np.inf)
    return np.argmax(keep_previous(q, held.previous) if commit else q, axis=1)


def distinct_rows(h: np.ndarray, groups: Sequence | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(K,) the first index of each distinct (state embedding, group) among the rows of h (N, D), and (N,) each
    row's position among those K: a router's scores are computed once per distinct state. On A/B logs a task's
    first state recurs in the episode of every model (49 times on the large MINT pool)."""
    position: dict = {}
    first, inverse = [], np.empty(len(h), np.int64)
    for i, row in enumerate(np.ascontiguousarray(h)):
        key = (row.tobytes(), None if groups is None else groups[i])
        if key not in position:
            position[key] = len(first)
            first.append(i)
        inverse[i] = position[key]
    return np.asarray(first, np.int64), inverse


def read_rows(held: HeldOut, commit: bool) -> np.ndarray:
    """(R,) the held-out states whose choice reads the scores: all of them, or for a committed router only the
    first turns and those whose previous model is unavailable (`keep_previous`: elsewhere it keeps calling it)."""
    if not commit:
        return np.arange(len(held.h))
    previous = np.maximum(held.previous, 0)
    return np.flatnonzero((held.previous < 0) | ~held.logs.available[np.arange(len(held.h)), previous])


def one_hot(chosen: np.ndarray, num_models: int) -> np.ndarray:
    """(N,) -> (N, M) bool, a deterministic target: a byte per entry, since the choice among the large pool's 142
    candidates holds one per candidate (8 bytes each was 3 GB on 100k episodes); arithmetic reads it as 0/1."""
    return np.eye(num_models, dtype=bool)[chosen]


def uniform(held: HeldOut) -> np.ndarray:  # (N, M) the random router: uniform over the available models
    available = held.logs.available.astype(np.float64)
    return available / available.sum(axis=1, keepdims=True)


# ---------------------------------------------------------------------------------------------------- choice


def best(values: Sequence[float], tolerance: float = 0.0) -> int:
    """The index of the best value, the earliest of those within `tolerance` of it: how every validated choice
    picks among its candidates (`choose`; the reproduction's conservatism grid, the MINT commitment's stage, floor
    and shrinkage), so candidates listed simplest first win their ties."""
    values = np.asarray(values, np.float64)
    return int(np.flatnonzero(values >= values.max() - tolerance)[0])


def reference(estimates: Estimates) -> int:
    """The fixed rule every candidate must beat, and the one deployed when none does: the best fixed model, or the
    best fixed model per task family where it is a candidate and its estimate of J is higher (a tie: the best fixed
    model, the simpler). A router that routes must show a gain over the strongest rule that needs no router: on the
    49-model MINT pool route-by-family is 0.11 J above the best fixed model on validation, and a candidate that
    cleared only the best fixed model's bar was deployed below route-by-family."""
    rules = [estimates.index(name) for name in (BEST_FIXED, BEST_PER_FAMILY) if name in estimates.names]
    return max(rules, key=lambda p: (estimates.point[p, J], -rules.index(p)))


def choose(estimates: Estimates, require_gain: bool, simultaneous: bool = False, one_se: bool = False) -> int:
    """The deployed-choice rule: among the candidates that beat the `reference` rule (the best fixed model, or route
    by family where it validates higher; `require_gain`: with the lower end of a 95% bound on the paired gain above
    0; else by the point estimate; none: the reference itself), the one with the best J, or (`one_se`) the earliest
    listed (the simplest) whose J is within one standard error of the best's (of their paired difference).
    `simultaneous`: the bounds hold for every candidate at once (`simultaneous_gain_bounds`), so the bar rises with
    the number of candidates compared; else each candidate's own paired interval."""
    floor = reference(estimates)
    if not require_gain:
        low = estimates.point[:, J] - estimates.point[floor, J]
    elif simultaneous:
        low = simultaneous_gain_bounds(estimates, floor)
    else:
        low = np.array([estimates.difference(p, floor)[1] for p in range(len(estimates.names))])
    better = [p for p in range(len(estimates.names)) if p != floor and low[p] > 0]
    if not better:
        return floor
    top = better[best(estimates.point[better, J])]
    if not one_se:
        return top
    # the paired standard error: the tasks' difficulty, shared by both, is no difference between them
    return next(p for p in better if estimates.point[top, J] - estimates.point[p, J]
                <= np.std(estimates.draws[:, top, J] - estimates.draws[:, p, J]))


def simultaneous_gain_bounds(estimates: Estimates, floor: int, level: float = 0.975) -> np.ndarray:
    """(P,) lower bounds on every candidate's J gain over `floor` that hold for all of them at once with
    probability `level` (one-sided; 0.975 is the lower end of a two-sided 95% interval): the studentized
    max-statistic bootstrap (Romano & Wolf 2005). Each draw's largest studentized overestimate over the candidates,
    max_p (g*_p - g_p) / se_p, gives the quantile c every candidate's bound g_p - c se_p uses: with many candidates
    the largest of their noises is larger, and so is c. A candidate that was not resampled: -inf (never chosen); one
    whose draws do not vary (it chooses as the floor does): its point gain."""
    gains = estimates.draws[:, :, J] - estimates.draws[:, [floor], J]                               # (B, P)
    point = estimates.point[:, J] - estimates.point[floor, J]                                       # (P,)
    resampled = ~np.isnan(gains).any(axis=0)
    se = np.zeros(len(point))
    se[resampled] = gains[:, resampled].std(axis=0)
    varies = resampled & (se > 0)
    bounds = np.where(resampled, point, -np.inf)
    if varies.any():
        overestimate = np.max((gains[:, varies] - point[varies]) / se[varies], axis=1)              # (B,)
        bounds[varies] = point[varies] - np.quantile(overestimate, level) * se[varies]
    return bounds


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
    """What every candidate needs: the trained routers, the per-model floors (overall and per family) and each
    run's centres."""

    workdir: Path
    pool: ModelPool
    floor: np.ndarray                       # (M,) mean logged return of each model as a fixed model (train)
    train_h: np.ndarray                     # (S, D) the training states the centres are means over
    commit: bool
    family_floors: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)   # family -> (M,)
    train_families: Sequence[str] = ()      # (S,) the family of each training state ("" for none)
    _routers: dict = dataclasses.field(default_factory=dict)
    _centres: dict = dataclasses.field(default_factory=dict)
    _distinct_train: tuple | None = None    # distinct_rows(train_h), computed once

    @staticmethod
    def key(candidate: Candidate) -> tuple:
        """The checkpoint a candidate reads: candidates differing only in their recentring share it."""
        return candidate.runs, candidate.stage, candidate.epoch

    @property
    def by_family(self) -> bool:
        """Whether candidates on the family floors are built (the training tasks' families have floors)."""
        return bool(self.family_floors)

    def router(self, candidate: Candidate) -> Router:
        key = self.key(candidate)
        if key not in self._routers:
            self._routers[key] = load_router(self.workdir, candidate)
        return self._routers[key]

    def recentring(self, candidate: Candidate) -> Recentring | None:
        if candidate.k is None:
            return None
        key = self.key(candidate)  # one centre per checkpoint, whatever k
        if key not in self._centres:
            if self._distinct_train is None:
                self._distinct_train = distinct_rows(self.train_h)
            rows, inverse = self._distinct_train
            q = self.raw_scores(candidate, self.train_h[rows])[inverse]                                 # (S, M)
            families = np.asarray(self.train_families, dtype=object)
            self._centres[key] = (q.mean(axis=0), {f: q[families == f].mean(axis=0) for f in self.family_floors
                                                   if (families == f).any()})
        centre, family_centres = self._centres[key]
        groups = {f: (floor, family_centres.get(f, centre)) for f, floor in self.family_floors.items()}
        return Recentring(self.floor, centre, candidate.k, groups if candidate.by_family else {})

    def choice(self, candidate: Candidate) -> Choice:
        """How the candidate chooses: recentred with its k (or as trained), committed on A/B logs."""
        return Choice(recentring=self.recentring(candidate), commit=self.commit)

    def deployable(self, candidate: Candidate) -> Router:
        """The candidate as `Router.deployed` loads it."""
        return self.router(candidate).with_choice(self.choice(candidate))

    def raw_scores(self, candidate: Candidate, h: np.ndarray) -> np.ndarray:
        """(N, M) the candidate's checkpoint's Q_route at states h (N, D), as trained."""
        return self.router(candidate).scores_from_embeddings(h).astype(np.float64)

    def recentred(self, candidate: Candidate, q: np.ndarray, families: Sequence[str | None] | None) -> np.ndarray:
        """(N, M) the candidate's scores from its checkpoint's raw scores q (N, M) at states of `families`."""
        recentring = self.recentring(candidate)
        return q if recentring is None else recentring(q, families)

    def scores(self, candidate: Candidate, h: np.ndarray, families: Sequence[str | None] | None = None) -> np.ndarray:
        """(N, M) at states h (N, D) of tasks of `families` (one per state; None: unknown)."""
        return self.recentred(candidate, self.raw_scores(candidate, h), families)


def family_floors(per_family: BestPerFamilyRouter | None, pool: ModelPool) -> dict[str, np.ndarray]:
    """{family: (M,) each model's mean return as a fixed model on the family's training tasks}; a model never logged
    alone in the family sits below every model that was, in the overall order, so that k = 0 is exactly
    `BestPerFamilyRouter` (the best available model of the family first, then the overall ranking). None: {}."""
    if per_family is None:
        return {}
    overall = per_family.overall.returns
    out = {}
    for family, router in per_family.families.items():
        lowest = min(router.returns.values())
        # the models the family never logged alone, in the overall order, shifted to start just below its lowest
        others = [overall[m] for m in pool.names if m not in router.returns and m in overall]
        shift = max(others) - lowest + FAMILY_GAP if others else 0.0
        floor = {m: router.returns.get(m, overall[m] - shift) for m in pool.names if m in overall}
        bottom = min(floor.values()) - FAMILY_GAP                   # never logged alone anywhere: below them all
        out[family] = np.array([floor.get(m, bottom) for m in pool.names])
    return out


FAMILY_GAP = 1e-6   # how far below a family's lowest logged floor its unlogged models start


def fixed_floor(episodes: Sequence[Episode], pool: ModelPool, reward: Reward) -> np.ndarray:
    """(M,) each model's mean logged return as a fixed model on `episodes` (the training tasks'); a model never
    logged alone gets the lowest floor (never the best fixed model; recentred, it can still be chosen)."""
    return floor_of(BestFixedRouter.fit(episodes, pool, reward), pool)


def modelled_floor(fit: HeldOut, seed: int = 0) -> np.ndarray:
    """(M,) each model's value as a fixed model by FQE on `fit` (the training episodes): the mean over their first
    states of V(s) under "always m". For logs in which no episode stayed with one model by design (an exploring
    proxy's draws at every turn), where a mean of logged returns has nothing to average: the few episodes whose
    draws happened to stay with one model are mostly short, easy ones, and ranked a weak model first.

    FQE's value counts only for a model the logs followed throughout on `MIN_FOLLOWED_TASKS` training tasks or more
    (the most any model was followed on, if fewer); the others sit below every such model, in FQE's order (as
    `family_floors` places a family's unlogged models). Such logs show a model mostly where the router chose it, and
    "always m" is then FQE's extrapolation to the states m was rarely served in: on live8's 1,600 recorded episodes
    (docs/live.md) it put quill-9b first at 0.748 (exactly 0.293; followed on 6 of 187 training tasks) over
    apex-flash's 0.484 (0.419; followed on 115), and no router could clear that reference. SPIBB's rule (Laroche et
    al. 2019): where the logs hold too few samples, do not trust the model's estimate over the baseline's."""
    num_states, num_models = len(fit.h), fit.logs.available.shape[1]
    targets = np.broadcast_to(np.eye(num_models)[:, None, :], (num_models, num_states, num_models))  # (M, N, M)
    iterations = fit.logs.live.shape[1]
    ridge, _ = fqe.choose_ridge(fit.logs, fit.features, targets, iterations, seed=seed)
    fitted = fqe.fit_fqe(fit.logs, fit.features, targets, np.ones(num_states), ridge, iterations)
    value = fitted.value[fit.logs.first][:, :, J].mean(axis=0)                                     # (M,)
    tasks = followed_tasks(fit.logs)
    trusted = tasks >= min(MIN_FOLLOWED_TASKS, tasks.max())
    if trusted.all():
        return value
    shift = value[~trusted].max() - value[trusted].min() + FAMILY_GAP
    return np.where(trusted, value, value - shift)


MIN_FOLLOWED_TASKS = 10   # tasks with an episode that stayed with a model, for FQE's "always m" to count


def followed_tasks(logs: ope.Logs) -> np.ndarray:
    """(M,) on how many of the logs' tasks some episode called model m at every turn."""
    num_models = logs.available.shape[1]
    calls = np.zeros((len(logs.episodes), num_models))
    np.add.at(calls, logs.episode, np.eye(num_models)[logs.action])                             # (n, M)
    followed = calls == logs.live.sum(axis=1, keepdims=True)                                    # (n, M)
    tasks = ope.task_clusters(logs)                                                              # (n,)
    return np.array([len(np.unique(tasks[followed[:, m]])) for m in range(num_models)])


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


def selection_table(rows: list[dict], estimates: Estimates, chosen: str, heading: str,
                    folds: Sequence[Estimates] | None = None) -> str:
    """selection.md: every candidate's estimates and gain over the reference; with `folds` (cross-validation, the
    same candidates in each), its J in every fold too."""
    ref = estimates.names[reference(estimates)]
    per_fold = " | J per fold" if folds else ""
    lines = [f"# {heading}", "",
             f"Validation estimates ({estimates.estimator}: {estimates.note}). J is Eq. 2's discounted return per "
             f"episode; intervals are 95% over tasks; 'vs reference' is the paired difference in J from {ref} (the "
             f"fixed rule to beat: the best fixed model, or route by family where it validates higher; nan: not "
             f"resampled, its J is not above the best fixed model's); 'bound, all' the lower end of its 95% bound "
             f"that holds for all {len(rows)} candidates at once (config.deploy.simultaneous: the bar to clear).", "",
             f"| candidate | J | 95% | success | cost/episode ($) | vs reference | 95% | bound, all{per_fold} | |",
             "|---|---|---|---|---|---|---|---|---|" + ("---|" if folds else "")]
    for p, r in enumerate(rows):
        fold_j = " | " + " / ".join(f"{part.point[p, J]:.3f}" for part in folds) if folds else ""
        lines.append(f"| {r['policy']} | {r['return']:.4f} | [{r['return_lo']:.4f}, {r['return_hi']:.4f}] | "
                     f"{r['success']:.3f} | {r['cost']:.5f} | {r['gain']:+.4f} | [{r['gain_lo']:+.4f}, "
                     f"{r['gain_hi']:+.4f}] | {r['gain_bound']:+.4f}{fold_j} | "
                     f"{'**deployed**' if r['policy'] == chosen else ''} |")
    return "\n".join(lines) + "\n"


def candidate_rows(estimates: Estimates, floor_name: str | None = None) -> list[dict]:
    """Every candidate's estimates and its paired gain over `floor_name` (None: the `reference` rule), with its 95%
    interval and the lower end of the bound that holds for all candidates at once (`gain_bound`)."""
    floor = reference(estimates) if floor_name is None else estimates.index(floor_name)
    bounds = simultaneous_gain_bounds(estimates, floor)
    rows = []
    for p in range(len(estimates.names)):
        gain, low, high = estimates.difference(p, floor)
        rows.append({**estimates.row(p), "gain": gain, "gain_lo": low, "gain_hi": high,
                     "gain_bound": float(bounds[p])})
    return rows


def read_states(held: HeldOut, commit: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
    """The states a choice reads (`read_rows`), each distinct one once: (R,) their rows, (R,) each one's position
    among the K distinct, (K, D) the distinct embeddings and (K,) their families."""
    read = read_rows(held, commit)
    families = held.families
    rows, inverse = distinct_rows(held.h[read], [families[i] for i in read])
    return read, inverse, held.h[read[rows]], [families[read[i]] for i in rows]


def spread(held: HeldOut, read: np.ndarray, inverse: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(N, M) the scores q (K, M) of the distinct read states (`read_states`) at every held-out state; 0 where no
    choice reads them."""
    out = np.zeros((len(held.h), held.logs.available.shape[1]))                                    # (N, M)
    out[read] = np.asarray(q, np.float64)[inverse]
    return out


def scores_at(score: Callable[[np.ndarray, list], np.ndarray], held: HeldOut, commit: bool) -> np.ndarray:
    """(N, M) scores at the held-out logged states as `choices` reads them, from score(h (K, D), families (K,)) ->
    (K, M) called once, at the distinct states a choice reads (`read_states`); the rows no choice reads are 0. On
    the large MINT pool's committed A/B logs that is 58 states of 11,000."""
    read, inverse, at, at_families = read_states(held, commit)
    return spread(held, read, inverse, score(at, at_families))


def router_scores(router: Router, held: HeldOut) -> np.ndarray:
    """`scores_at` of a router (recentred and committed as it was deployed)."""
    return scores_at(lambda h, families: router.scores_from_embeddings(h, None, families), held, router.commit)


def held_scores(scorer: Scorer, candidates: Sequence[Candidate], held: HeldOut) -> Iterator[np.ndarray]:
    """(N, M) each candidate's `scores_at` the held-out logged states, in order: each checkpoint scored once, and
    every recentring of it reusing those scores (the choice among the large pool's 142 candidates takes seconds)."""
    read, inverse, at, at_families = read_states(held, scorer.commit)
    raw: dict[tuple, np.ndarray] = {}
    for candidate in candidates:
        key = scorer.key(candidate)
        if key not in raw:
            raw[key] = scorer.raw_scores(candidate, at)                                             # (K, M)
        yield spread(held, read, inverse, scorer.recentred(candidate, raw[key], at_families))


def targets_of(scorer: Scorer, chosen_candidates: Sequence[Candidate], held: HeldOut) -> dict[str, np.ndarray]:
    """{candidate name: (N, M) its deterministic choice at every held-out logged state}; candidates that choose
    alike (the conservatism grid's shared warm start, a recentring that changes no choice) share one array."""
    distinct: dict[bytes, np.ndarray] = {}
    targets = {}
    for candidate, q in zip(chosen_candidates, held_scores(scorer, chosen_candidates, held)):
        chosen = choices(q, held, scorer.commit)                                                   # (N,)
        key = chosen.tobytes()
        if key not in distinct:
            distinct[key] = one_hot(chosen, len(scorer.pool))
        targets[candidate.name] = distinct[key]
    return targets


