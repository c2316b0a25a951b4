"""The verdict: the deployed router against the best fixed model, the best fixed model per task family (where the
training tasks have more than one family) and random on the held-out test tasks.

Written by `rivet_jax.fit` (launch.train), `launch.calibrate` and `launch.evaluate_logs` to `verdict.md` and
`verdict.json`, and printed. Everything is paired by task (the same bootstrap resamples of the test tasks for every
policy), with the estimator of `rivet_jax.deploy` (rollouts, committed or FQE), and J is Eq. 2's discounted return.

Plain warnings, each with the number behind it:
  collapsed          one model takes at least `COLLAPSE_SHARE` of the first turns
  not better         the paired difference in J against the best fixed model (or the best per family) has an
                     interval reaching 0 or below
  identical          the router chose the same model as fixed model X at every test state
  too few tasks      fewer than `MIN_TASKS` held-out test tasks: the intervals are too wide to tell routers apart
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from rivet_jax import deploy, heldout
from rivet_jax.baselines.best_fixed import BEST_PER_FAMILY, BestFixedRouter, BestPerFamilyRouter
from rivet_jax.data.files import atomic_write_text
from rivet_jax.data.replay import Reward
from rivet_jax.baselines.single_turn_base import is_single_model
from rivet_jax.data.schema import Episode, ModelPool
from rivet_jax.deploy import BEST_FIXED, RANDOM
from rivet_jax.heldout import CHANNELS, Estimates
from rivet_jax.envs.base import Env, Policy, RandomPolicy

COLLAPSE_SHARE = 0.9
MIN_TASKS = 30
VERDICT_JSON, VERDICT_MD = "verdict.json", "verdict.md"


@dataclasses.dataclass(frozen=True)
class Routing:
    """What the router chose at the test states: per-model shares at first turns and at all turns, and the switch
    rate (turns after the first where it chose another model than the previous turn's)."""

    first_turn: dict[str, float]
    all_turns: dict[str, float]
    switch_rate: float
    states: int


def routing_of(names: Sequence[str], chosen: np.ndarray, first: np.ndarray, previous: np.ndarray) -> Routing:
    """From the chosen model (N,) at N states, which of them are first turns (N,) bool, and the model of the
    previous turn there (N,) int (-1 at first turns)."""
    share = lambda picks: {m: float(np.mean(picks == i)) if len(picks) else 0.0  # noqa: E731
                           for i, m in enumerate(names)}
    later = ~first
    switches = float(np.mean(chosen[later] != previous[later])) if later.any() else 0.0
    return Routing(share(chosen[first]), share(chosen), switches, int(len(chosen)))


def warnings_of(estimates: Estimates, deployed: str, routing: Routing, identical_to: str | None) -> list[str]:
    out = []
    top = max(routing.first_turn, key=routing.first_turn.get)
    if routing.first_turn[top] >= COLLAPSE_SHARE:
        out.append(f"collapsed to one model: {100 * routing.first_turn[top]:.0f}% of first turns go to {top}")
    for reference, what in ((BEST_FIXED, "the best fixed model"), (BEST_PER_FAMILY, "the best fixed model per family")):
        if deployed in (BEST_FIXED, reference) or reference not in estimates.names:
            continue
        gain, low, high = estimates.difference(estimates.index(deployed), estimates.index(reference))
        if low <= 0:
            out.append(f"not better than {what}: J difference {gain:+.4f}, 95% interval "
                       f"[{low:+.4f}, {high:+.4f}] reaches 0")
    if identical_to is not None:
        out.append(f"identical to fixed model {identical_to}: the same choice at every test state")
    if estimates.tasks < MIN_TASKS:
        out.append(f"too few held-out test tasks for a useful interval: n = {estimates.tasks} (< {MIN_TASKS}); "
                   f"hold out more tasks (config.data.holdout.test) or log more")
    return out


def verdict(estimates: Estimates, deployed: str, routing: Routing, fixed_model: str, identical_to: str | None,
            context: dict) -> dict:
    """The verdict as a JSON-ready dict: `estimates` holds the deployed router, BEST_FIXED, RANDOM and possibly
    BEST_PER_FAMILY."""
    references = [n for n in (BEST_FIXED, BEST_PER_FAMILY, RANDOM) if n in estimates.names]
    rows = {name: estimates.row(estimates.index(name)) for name in dict.fromkeys([deployed, *references])}
    paired = {}
    for reference in references:
        if reference == deployed:
            continue
        paired[reference] = {}
        for c, channel in enumerate(CHANNELS):
            diff, low, high = estimates.difference(estimates.index(deployed), estimates.index(reference), c)
            paired[reference][channel] = {"difference": diff, "lo": low, "hi": high}
    return {"deployed": deployed, "best_fixed_model": fixed_model, "estimator": estimates.estimator,
            "note": estimates.note, "tasks": estimates.tasks, "rows": rows, "paired": paired,
            "routing": dataclasses.asdict(routing), "warnings": warnings_of(estimates, deployed, routing, identical_to),
            **context}


def identical_fixed(names: Sequence[str], chosen: np.ndarray) -> str | None:
    """The model the router chose at every state, if it always chose one."""
    models = set(chosen.tolist())
    return names[models.pop()] if len(models) == 1 else None


def format_verdict(result: dict) -> str:
    rows, deployed = result["rows"], result["deployed"]
    lines = [f"# Verdict: {deployed} on the {result.get('split', 'held-out test')} tasks", "",
             f"{result['estimator']}: {result['note']}. J is Eq. 2's discounted return per episode at lambda "
             f"{result.get('lambda', '?')}; success and cost are per episode; 95% intervals over tasks.", "",
             "| router | J | 95% | success | 95% | cost ($) | 95% |", "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        label = name if name != BEST_FIXED else f"{BEST_FIXED}: {result['best_fixed_model']}"
        if name == deployed:
            label = f"**{label} (deployed)**"
        lines.append(f"| {label} | {r['return']:.4f} | [{r['return_lo']:.4f}, {r['return_hi']:.4f}] | "
                     f"{r['success']:.3f} | [{r['success_lo']:.3f}, {r['success_hi']:.3f}] | {r['cost']:.5f} | "
                     f"[{r['cost_lo']:.5f}, {r['cost_hi']:.5f}] |")
    lines.append("")
    for reference, diffs in result["paired"].items():
        d = diffs["return"]
        lines.append(f"- J against {reference}: {d['difference']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}] (paired by "
                     f"task); success {diffs['success']['difference']:+.3f}, cost "
                     f"{diffs['cost']['difference']:+.5f} $/episode")
    routing = result["routing"]
    top = lambda shares: ", ".join(f"{m} {100 * s:.0f}%" for m, s in  # noqa: E731
                                   sorted(shares.items(), key=lambda kv: -kv[1]) if s > 0)
    lines += [f"- routing at {routing['states']} test states: first turns {top(routing['first_turn'])}; all turns "
              f"{top(routing['all_turns'])}; switch rate {100 * routing['switch_rate']:.0f}%"]
    lines += ["", "Warnings:" if result["warnings"] else "No warnings."]
    lines += [f"- {w}" for w in result["warnings"]]
    return "\n".join(lines) + "\n"


def write_verdict(directory: Path, result: dict) -> str:
    """Writes verdict.json and verdict.md into `directory`; returns the markdown."""
    text = format_verdict(result)
    atomic_write_text(directory / VERDICT_JSON, json.dumps(result, indent=1, allow_nan=True) + "\n")
    atomic_write_text(directory / VERDICT_MD, text)
    return text



# ------------------------------------------------------------------------------------------------- judging


def per_family_of(train_episodes: Sequence[Episode], pool: ModelPool, reward: Reward) -> BestPerFamilyRouter | None:
    """The best fixed model per family of the training tasks, where the verdict compares with it: None unless the
    training tasks have two families with episodes that stayed with one model (an exploring proxy's draws alone log
    no model's return as a fixed model; one family is the best fixed model itself)."""
    if not any(is_single_model(e) for e in train_episodes):
        return None
    per_family = BestPerFamilyRouter.fit(train_episodes, pool, reward)
    return per_family if len(per_family.families) > 1 else None


def judge_on_logs(name: str, scores: np.ndarray, held: heldout.HeldOut, pool: ModelPool, floor: np.ndarray,
                  commit: bool, resamples: int, seed: int, reward: Reward, split: str = "held-out test",
                  per_family: BestPerFamilyRouter | None = None) -> dict:
    """The verdict of the router whose scores at the held-out logged states are `scores` (N, M) (only the rows
    `deploy.choices` reads matter: `deploy.held_scores`), against the best
    fixed model of the training tasks (the best `floor`, (M,)), the best per family (`per_family_of`; None: none)
    and random; committed routing (`commit`) is estimated exactly where the logs allow (`heldout.log_estimates`)."""
    picks = deploy.choices(scores, held, commit)
    fixed = deploy.choices(np.broadcast_to(floor, scores.shape), held, commit)
    targets = {name: deploy.one_hot(picks, len(pool)), BEST_FIXED: deploy.one_hot(fixed, len(pool)),
               RANDOM: deploy.uniform(held)}
    if per_family is not None:
        episodes = held.logs.episodes
        by_row = np.stack([per_family.scores(episodes[e].task.family, pool) for e in held.logs.episode])
        targets[BEST_PER_FAMILY] = deploy.one_hot(deploy.choices(by_row, held, commit), len(pool))
    estimates = heldout.log_estimates(held, {n: targets[n] for n in dict.fromkeys([name, *targets])},
                                     commit, resamples, seed)
    is_first = held.previous < 0
    if commit:  # a committed router keeps its first choice for the whole episode
        picks = picks[held.logs.first[held.logs.episode]]
    # the switch rate compares each choice with the router's own at the episode's previous logged state
    routing = routing_of(pool.names, picks, is_first, np.where(is_first, -1, np.roll(picks, 1)))
    return verdict(estimates, name, routing, pool.names[int(np.argmax(floor))], identical_fixed(pool.names, picks),
                   {"lambda": reward.lam, "gamma": reward.gamma, "c_ref": reward.c_ref, "split": split})


def judge_by_rollouts(env: Env, name: str, policy: Policy, pool: ModelPool, floor: np.ndarray, rollouts: int,
                      seed: int, reward: Reward, resamples: int, split: str = "test",
                      per_family: BestPerFamilyRouter | None = None) -> dict:
    """The verdict of `policy` rolled out in `env` on `split`'s tasks against the best fixed model of the training
    tasks, the best per family (`per_family_of`; None: none) and random, rolled out alike."""
    policies = {name: policy, BEST_FIXED: BestFixedRouter(dict(zip(pool.names, floor.tolist()))),
                RANDOM: RandomPolicy()}
    if per_family is not None:
        policies[BEST_PER_FAMILY] = per_family
    names = list(dict.fromkeys([name, *policies]))
    estimates, rolled = heldout.rollout_estimates(env, {n: policies[n] for n in names}, split, rollouts, seed, reward,
                                                 resamples)
    episodes = rolled[0]
    picks = np.array([pool.index(t.model) for e in episodes for t in e.turns])
    is_first = np.array([i == 0 for e in episodes for i in range(len(e.turns))])
    previous = np.array([pool.index(e.turns[i - 1].model) if i else -1 for e in episodes for i in range(len(e.turns))])
    routing = routing_of(pool.names, picks, is_first, previous)
    return verdict(estimates, name, routing, pool.names[int(np.argmax(floor))], identical_fixed(pool.names, picks),
                   {"lambda": reward.lam, "gamma": reward.gamma, "c_ref": reward.c_ref, "split": split})
