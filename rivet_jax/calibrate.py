"""A budget: the lambda whose router is most successful within a cost per episode (`python -m launch.calibrate`).

    one lambda-conditioned run (`reward.lam_range` over `config.calibrate.lambdas`, or as configured) read at each
    lambda (`Router.at_lambda`); or, with `calibrate.one_run` off or an online stage, a router trained (or reused)
    at every lambda, as one run group
      -> each router's success and cost per episode on the validation tasks, with 95% intervals
         RouteSim (a config with `sim`): measured, by rolling the router out in the simulator (exact environment);
         one's own logs: estimated off-policy on the held-out validation tasks by fitted-Q evaluation
         (`rivet_jax.ope`; on RouteSim's held-out logs FQE's intervals covered all 9 policies' exact values with a
         mean error of 0.022 in J, while DR, with the few stochastic episodes such logs hold, was off by up to 1)
      -> per lambda, the checkpoint (stage: mc, td) with the best validation J, the objective it was trained for
      -> the feasible lambdas: the interval's *upper* end of the cost within the budget, so the choice keeps to the
         budget unless the estimate is off by more than its own uncertainty
      -> the most successful feasible lambda (ties: the cheaper); none feasible: the cheapest, flagged
      -> calibration.md / calibration.json / calibration.png (success vs cost per episode, intervals, the budget)

The test tasks are not looked at to choose. On RouteSim the chosen router is then rolled out on the test tasks, and
that measured cost is reported next to the budget: the check of the choice, not an input to it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import os
import time
from pathlib import Path
from typing import Sequence

import ml_collections
import numpy as np
from absl import logging

from rivet_jax import deploy, evaluation, heldout, offpolicy, ope, plots, train
from rivet_jax.config_checks import ConfigError
from rivet_jax.data.profile import profile_logs
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode
from rivet_jax.data.splits import MANIFEST
from rivet_jax.encoders import embedding_store
from rivet_jax.envs.base import FixedModelPolicy, RouterPolicy
from rivet_jax.envs.routesim import make_routesim
from rivet_jax.networks import lambda_conditioned
from rivet_jax.pipeline import logged_splits
from rivet_jax.router import Choice, Router
from rivet_jax.runs import MAIN, collected_corpus, corpus_files, run_dir, train_variants
from rivet_jax.settings import with_overrides
from rivet_jax.verdict import format_verdict, judge_by_rollouts, judge_on_logs, per_family_of, write_verdict

CONDITIONED = "lambda-conditioned"  # the one run of a config with reward.lam_range


def episode_summary(episodes: Sequence[Episode], resamples: int, seed: int, reward: Reward) -> dict:
    """Success, dollar cost and return J (Eqs. 1-2 at `lam`) per episode of rolled-out episodes, each with a 95%
    interval over tasks."""
    per_task = heldout.per_task_values(episodes, reward)[None]                       # (1, T, C)
    draws = heldout.task_bootstrap(per_task, resamples, seed)                                    # (B, 1, C)
    out = {}
    for column, name in ((heldout.SUCCESS, "success"), (heldout.COST, "cost"), (heldout.J, "return")):
        low, high = heldout.percentiles(draws[:, 0, column])
        out.update({name: float(per_task[0, :, column].mean()), f"{name}_lo": low, f"{name}_hi": high})
    return out


def best_checkpoints(rows: Sequence[dict]) -> list[bool]:
    """Whether each row is its lambda's kept checkpoint: the stage with the best validation J at that lambda (the
    objective its router was trained for; ties: the later stage)."""
    best = {}
    for i, r in enumerate(rows):
        if r["lambda"] not in best or r["return"] >= rows[best[r["lambda"]]]["return"]:
            best[r["lambda"]] = i
    return [best[r["lambda"]] == i for i, r in enumerate(rows)]


def pareto(rows: Sequence[dict]) -> list[bool]:
    """Whether each row is on the success-cost front: no other row at most as costly and more successful."""
    return [not any(o["cost"] <= r["cost"] and o["success"] > r["success"] for o in rows) for r in rows]


# ------------------------------------------------------------------------------------------- estimates


def _routesim_episodes(config, routers: dict[tuple[float, str], Router], fixed: bool) -> dict:
    """The episodes of every router (keyed as in `routers`) and, with `fixed`, of every fixed model (keyed by its
    name) on `config.calibrate.split`, rolled out in RouteSim. Each policy's episodes are those of its own rollout
    (`evaluation.rollout_each`), whichever others go out with it."""
    sim, cal = make_routesim(config.sim), config.calibrate
    models = list(sim.pool.names) if fixed else []
    policies = [RouterPolicy(router) for router in routers.values()] + [FixedModelPolicy(m) for m in models]
    return dict(zip([*routers, *models], evaluation.rollout_each(sim, policies, cal.split, cal.rollouts, cal.seed)))


def _routesim_rows(config, routers: dict[tuple[float, str], Router], episodes: dict) -> tuple[list[dict], list[dict]]:
    """Every router's row from its `episodes` on validation, and every fixed model's alike (the reference points),
    J at the router's own lambda (a fixed model's at the config's)."""
    cal, first = config.calibrate, next(iter(routers.values()))
    rows = [{"lambda": lam, "stage": stage, **episode_summary(episodes[lam, stage], cal.resamples, cal.seed,
                                                               router.reward)}
            for (lam, stage), router in routers.items()]
    at_config = Reward.of(config, first.c_ref)
    fixed = [{"model": m, **episode_summary(episodes[m], cal.resamples, cal.seed, at_config)}
             for m in first.pool.names]
    return rows, fixed


class _EarlyRollouts:
    """On RouteSim, the first stage's routers and the fixed models go out on validation in a thread as soon as that
    stage has finished, while the later stages train: rollouts are Python on one core, and a small run's training
    programs keep about 1.35 of 2 cores busy (RouteSim's calibrate: 19.0 -> 18.0 s). `episodes` waits for them.
    Then the thread reads what the verdict will (`run`'s logs by split, where every lambda is that one run's) and
    imports the report's plotting library: 0.5 s fewer after the choice."""

    def __init__(self, routers_of, stages: Sequence[str], run: Path | None = None):
        self._routers_of, self._first = routers_of, stages[0] if len(stages) > 1 else None
        self._run = run
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="early_rollouts")
        self._rolled: concurrent.futures.Future | None = None
        self._splits: concurrent.futures.Future | None = None

    def stage_ended(self, config, stage: str) -> None:
        if stage == self._first and self._rolled is None:
            self._rolled = self._thread.submit(lambda: _routesim_episodes(config, self._routers_of(stage), True))
            self._splits = self._thread.submit(self._read_ahead, stage)

    def _read_ahead(self, stage: str) -> dict[str, list[Episode]] | None:
        plots.figure_class()   # imported now
        if self._run is None:
            return None
        return logged_splits(next(iter(self._routers_of(stage).values())).config, self._run)

    def episodes(self, config, routers: dict) -> dict:
        """Every router's and fixed model's validation episodes: the early ones and the rest's, rolled out now."""
        early = self._rolled.result() if self._rolled is not None else {}
        rest = {key: router for key, router in routers.items() if key not in early}
        return {**early, **_routesim_episodes(config, rest, fixed=not early)}

    def splits(self, run: Path) -> dict[str, list[Episode]] | None:
        """`run`'s logs by split, if read ahead (None: read them now)."""
        splits = self._splits.result() if self._splits is not None else None
        self._thread.shutdown()
        return splits if run == self._run else None


def _logged_rows(config, routers: dict[tuple[float, str], Router], validation: list[Episode], workdir: Path
                 ) -> tuple[list[dict], list[dict]]:
    """Fitted-Q estimates on the held-out validation logs (see the module docstring for why not DR), of every router
    and every fixed model. J is Eq. 2's discounted return at each router's own lambda: FQE is linear in the
    rewards, so the returns at lambda 0 (J = discounted success) and at lambda 1, fitted together as two channels
    of one fit (the same resamples), give J at any lambda exactly as (1 - lambda) J_0 + lambda J_1, resample by
    resample."""
    first = next(iter(routers.values()))
    gamma, c_ref, cal = first.config.reward.gamma, first.c_ref, config.calibrate
    store = embedding_store(config, first.encoder, workdir)  # the states' vectors, from the workdir's one cache
    held = heldout.held_out(validation, first.pool, store, first.config.max_state_tokens, Reward(0.0, gamma, c_ref))
    references = offpolicy.reference_policies(first.pool, held.logs.available)   # the models available throughout
    models = [m for m in first.pool.names if f"fixed:{m}" in references]
    names = [f"{lam:g}/{stage}" for lam, stage in routers] + [f"fixed:{m}" for m in models]
    at_one = ope.read_logs(validation, first.pool, Reward(1.0, gamma, c_ref))         # its return column: J_1
    logs = dataclasses.replace(held.logs, reward=np.concatenate([held.logs.reward, at_one.reward[:, :1]], axis=1),
                               discount=np.concatenate([held.logs.discount, at_one.discount[:1]]))
    requests = ope.state_requests(logs, first.pool)  # the states, the targets and the features: lambda-free
    targets = [deploy.one_hot(deploy.choices(deploy.router_scores(r, held), held, r.commit), len(first.pool))
               for r in routers.values()]  # each router's choice at every state, from the cached vectors
    targets += [ope.target_distribution(references[f"fixed:{m}"], requests, first.pool) for m in models]
    features = heldout.principal_features(held.h, cal.max_features)
    logging.info("calibrate: fitted-Q evaluation of %d policies at lambda 0 and 1 (%d resamples)", len(names),
                 cal.resamples)
    result = ope.evaluate(logs, dict(zip(names, targets)), features, resamples=cal.resamples, seed=cal.seed,
                          keep_draws=True, channels=(*ope.CHANNELS, "return_at_1"))
    point = {r["policy"]: r for r in result["rows"] if r["estimator"] == "FQE"}
    draws = result["draws"]["FQE"][..., [0, 3]]                                               # (B, P, 2) J_0, J_1
    keys = ("success", "success_lo", "success_hi", "cost", "cost_lo", "cost_hi")

    def at(p: int, lam: float) -> dict:
        name = names[p]
        j = (1 - lam) * point[name]["return"] + lam * point[name]["return_at_1"]
        low, high = heldout.percentiles((1 - lam) * draws[:, p, 0] + lam * draws[:, p, 1])
        return {"estimator": "FQE", **{k: point[name][k] for k in keys}, "return": float(j),
                "return_lo": low, "return_hi": high}

    rows = [{"lambda": lam, "stage": stage, **at(p, lam)} for p, (lam, stage) in enumerate(routers)]
    fixed = [{"model": m, **at(len(routers) + i, float(config.reward.lam))} for i, m in enumerate(models)]
    return rows, fixed


def _own_splits(config, run_dir: Path) -> dict[str, list[Episode]]:
    """One's own logs by the task split every run drew alike; calibrating needs held-out validation tasks."""
    if not (run_dir / MANIFEST).exists():
        raise ConfigError("calibrating on one's own logs needs held-out validation tasks: set "
                          "--config.data.holdout.validation (e.g. 0.1)")
    return logged_splits(config, run_dir)


# ----------------------------------------------------------------------------------------------- main


def with_one_run(config, lambdas: list[float]):
    """`config`, lambda-conditioned over the lambdas' range where `calibrate.one_run` asks for it: one run learns
    them all (timings and choices against a run per lambda: docs/own-logs.md). Left as is: a config already
    conditioned, one lambda only, or an online stage (which adapts at one lambda)."""
    online = "online" in train.stages_of(with_overrides(config, {"stage": config.calibrate.stage}))
    if not config.calibrate.one_run or lambda_conditioned(config) or len(set(lambdas)) < 2 or online:
        return config
    return with_overrides(config, {"reward.lam_range": (min(lambdas), max(lambdas))})


def _variants(config, lambdas: list[float], conditioned: bool) -> dict[str, tuple[dict, str]]:
    """The runs to train: one per lambda, or (a lambda-conditioned config) one run for them all."""
    if not conditioned:
        return {f"lambda={lam:g}": ({"reward.lam": lam}, config.calibrate.stage) for lam in lambdas}
    low, high = config.reward.lam_range
    outside = [lam for lam in lambdas if not low <= lam <= high]
    if outside:
        raise ConfigError(f"calibrate.lambdas {outside} lie outside reward.lam_range ({low:g}, {high:g}), the "
                          f"lambdas the run learns: widen the range or drop them")
    return {CONDITIONED: ({}, config.calibrate.stage)}


def calibrate(config: ml_collections.ConfigDict, workdir: str | Path, budget: float) -> dict:
    """Trains (or reuses) a router per lambda, estimates their success and cost per episode on validation and
    picks the best within `budget` dollars per episode; writes calibration.{md,json,png} in `workdir`."""
    if not budget > 0:
        raise ConfigError(f"the budget must be a cost per episode > 0 (USD), got {budget}")
    workdir, started = Path(workdir), time.perf_counter()
    simulated = "sim" in config
    if simulated:
        episodes_path, cards_path = corpus_files(collected_corpus(config, workdir))
    else:
        episodes_path, cards_path = config.data.episodes, config.data.cards  # the setting as given (a list, a glob)
    lambdas = [float(x) for x in config.calibrate.lambdas]
    config = with_one_run(config, lambdas)
    conditioned = lambda_conditioned(config)
    variants = _variants(config, lambdas, conditioned)
    run_of = {lam: run_dir(workdir, CONDITIONED if conditioned else f"lambda={lam:g}", config.seed) for lam in lambdas}
    stages = train.stages_of(with_overrides(config, {"stage": config.calibrate.stage}))

    @functools.cache   # the early rollouts' stage is loaded once
    def routers_of(stage: str) -> dict[tuple[float, str], Router]:
        loaded = {run: Router.from_checkpoint(run, stage) for run in set(run_of.values())}
        return {(lam, stage): loaded[run_of[lam]].at_lambda(lam) for lam in lambdas}

    def simulated_routers(stage: str) -> dict[tuple[float, str], Router]:   # as below: RouteSim rolls switching out
        return {key: r.with_choice(Choice(commit=deploy.commits(None, True))) for key, r in routers_of(stage).items()}

    one_run = run_of[lambdas[0]] if len(set(run_of.values())) == 1 else None
    early = _EarlyRollouts(simulated_routers, stages, one_run) if simulated else None
    train_variants(config, episodes_path, cards_path, workdir, variants, (config.seed,),
                   on_stage_end=None if early is None else functools.partial(early.stage_ended, config))
    by_stage = {stage: routers_of(stage) for stage in stages}
    trained = {(lam, stage): by_stage[stage][lam, stage] for lam in lambdas for stage in stages}
    pool = next(iter(trained.values())).pool
    splits = None if simulated else _own_splits(config, run_of[lambdas[0]])
    # as training's choice deploys on the same logs: A/B logs commit (RouteSim rolls switching out)
    commit = deploy.commits(None if simulated else profile_logs(splits["train"], pool), simulated)
    routers = {key: router.with_choice(Choice(commit=commit)) for key, router in trained.items()}
    logging.info("calibrate: %d checkpoints trained; estimating on validation (%.0fs elapsed)", len(routers),
                 time.perf_counter() - started)
    if simulated:
        rows, fixed = _routesim_rows(config, routers, early.episodes(config, routers))
    else:
        rows, fixed = _logged_rows(config, routers, splits["validation"], workdir)
    for row, kept in zip(rows, best_checkpoints(rows)):
        row["kept"] = kept
    kept_rows = [r for r in rows if r["kept"]]
    index, within = deploy.within_budget(kept_rows, budget)
    for row, front in zip(kept_rows, pareto(kept_rows)):
        row["pareto"] = front
    chosen = {**kept_rows[index], "within_budget": within, "margin_usd": budget - kept_rows[index]["cost_hi"]}
    router_dir = run_of[chosen["lambda"]]
    result = {"budget_usd_per_episode": budget, "chosen": chosen, "rows": rows, "fixed": fixed,
              "fixed_lambda": float(config.reward.lam),
              "simulated": simulated, "router_dir": str(router_dir), "router_stage": chosen["stage"]}
    key = (chosen["lambda"], chosen["stage"])
    logging.info("calibrate: chose lambda %g, stage %s; judging it on the test tasks (%.0fs elapsed)", *key,
                 time.perf_counter() - started)
    result["verdict"] = _verdict(config, routers[key], router_dir, workdir, simulated,
                                 early.splits(router_dir) if early is not None else None)
    if simulated:  # the check, after the choice: the chosen router's cost on the test tasks (the verdict's rollouts)
        result["test"] = {"lambda": chosen["lambda"], "stage": chosen["stage"],
                          **{k: v for k, v in result["verdict"]["rows"][MAIN].items() if k != "policy"}}
    result["seconds"] = time.perf_counter() - started
    name = f"lambda={chosen['lambda']:g} {chosen['stage']}"
    spec = deploy.Candidate(name, (os.path.relpath(router_dir, workdir),), chosen["stage"]).spec(
        routers[key].choice, routers[key].pool.names)
    if conditioned:   # one run for every lambda: the deployment names the one chosen
        spec["lam"] = chosen["lambda"]
    deploy.write_deployment(workdir, spec, {"source": "launch.calibrate", "chosen": chosen})
    write_report(workdir, result)
    return result


def _verdict(config, router: Router, router_dir: Path, workdir: Path, simulated: bool,
             splits: dict[str, list[Episode]] | None = None) -> dict | None:
    """The chosen router against the best fixed model (of its training logs) and random on the test tasks; written
    to verdict.{md,json} in `workdir`. None on one's own logs without held-out test tasks. `splits`: the logs the
    run trained on by split, if read already."""
    reward, cal = router.reward, config.calibrate
    if splits is None:
        splits = logged_splits(router.config, router_dir)  # the logs the run trained on (RouteSim: its corpus)
    floor = deploy.fixed_floor(splits["train"], router.pool, reward)
    per_family = per_family_of(splits["train"], router.pool, reward)
    if simulated:
        result = judge_by_rollouts(make_routesim(config.sim), MAIN, RouterPolicy(router), router.pool, floor,
                                   cal.rollouts, cal.seed + 1, reward, cal.resamples, per_family=per_family)
    else:
        test = splits["test"]
        if not test:
            logging.info("calibrate: no held-out test tasks (config.data.holdout.test = 0): no verdict")
            return None
        store = embedding_store(config, router.encoder, workdir)
        held = heldout.held_out(test, router.pool, store, router.config.max_state_tokens, reward)
        result = judge_on_logs(MAIN, deploy.router_scores(router, held), held, router.pool, floor,
                               router.commit, cal.resamples, cal.seed + 1, reward, per_family=per_family)
    write_verdict(workdir, result)
    return result


def write_report(workdir: Path, result: dict) -> None:
    budget, chosen = result["budget_usd_per_episode"], result["chosen"]

    def margin(row: dict) -> str:
        return f"{budget - row['cost_hi']:+.3g}"

    how = ("rolled out in RouteSim on its validation tasks" if result["simulated"]
           else f"estimated off-policy ({result['rows'][0].get('estimator', '')}) on the held-out validation logs")
    lines = [f"# Calibration: budget ${budget:g} per episode", "",
             f"Success, cost and J (Eq. 2's discounted return at the router's lambda) per episode of each stage's "
             f"router at each lambda, {how}, with 95% intervals. Each lambda keeps the stage with the best "
             f"validation J; a kept router is feasible when its cost interval's upper end is within the budget "
             f"(decided on the unrounded numbers: the margin is the budget minus that upper end).", "",
             "| lambda | stage | J | success | 95% | cost $/episode | 95% | kept | feasible | margin $ | Pareto |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        mark = "**" if (r["lambda"], r["stage"]) == (chosen["lambda"], chosen["stage"]) else ""
        lines.append(f"| {mark}{r['lambda']:g}{mark} | {r['stage']} | {r['return']:.4f} | {r['success']:.3f} | "
                     f"{r['success_lo']:.3f}-{r['success_hi']:.3f} | {r['cost']:.6g} | {r['cost_lo']:.6g}-"
                     f"{r['cost_hi']:.6g} | {'yes' if r['kept'] else ''} | "
                     f"{('yes' if r['cost_hi'] <= budget else 'no') if r['kept'] else ''} | "
                     f"{margin(r) if r['kept'] else ''} | "
                     f"{'yes' if r.get('pareto') else ''} |")
    lines += ["", f"The fixed models, the reference points ({how}; J at lambda {result['fixed_lambda']:g}):", "",
              "| model | J | success | 95% | cost $/episode | 95% | within the budget |", "|---|---|---|---|---|---|---|"]
    for r in result["fixed"]:
        lines.append(f"| {r['model']} | {r['return']:.4f} | {r['success']:.3f} | {r['success_lo']:.3f}-"
                     f"{r['success_hi']:.3f} | {r['cost']:.6g} | {r['cost_lo']:.6g}-{r['cost_hi']:.6g} | "
                     f"{'yes' if r['cost_hi'] <= budget else 'no'} |")
    verdict = "within the budget" if chosen["within_budget"] else "NOT within the budget: no lambda is; the cheapest"
    lines += ["", f"Chosen: lambda {chosen['lambda']:g}, stage {chosen['stage']} ({verdict}; cost upper bound "
                  f"{chosen['cost_hi']:.6g}, margin {chosen['margin_usd']:+.3g} $), router `{result['router_dir']}`; "
                  f"`Router.from_checkpoint(\"{workdir}\")` loads it (deploy.json)."]
    if "test" in result:
        test = result["test"]
        lines.append(f"On the test tasks (rolled out after the choice): success {test['success']:.3f}, cost "
                     f"${test['cost']:.4f} per episode ({test['cost_lo']:.4f}-{test['cost_hi']:.4f}), "
                     f"{'within' if test['cost'] <= budget else 'over'} the budget.")
    if result.get("verdict"):
        lines += ["", format_verdict(result["verdict"])]
    (workdir / "calibration.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (workdir / "calibration.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    plot(result, workdir / "calibration.png")


def plot(result: dict, path: Path) -> None:
    rows, budget = [r for r in result["rows"] if r["kept"]], result["budget_usd_per_episode"]
    fig = plots.figure(path, figsize=(6.5, 4.5))
    if fig is None:
        return
    ax = fig.subplots()
    cost = np.array([r["cost"] for r in rows])
    success = np.array([r["success"] for r in rows])
    xerr = np.array([[r["cost"] - r["cost_lo"], r["cost_hi"] - r["cost"]] for r in rows]).T
    yerr = np.array([[r["success"] - r["success_lo"], r["success_hi"] - r["success"]] for r in rows]).T
    ax.errorbar(cost, success, xerr=xerr, yerr=yerr, fmt="o", capsize=3, label="router at lambda (95% intervals)")
    front = sorted((r["cost"], r["success"]) for r in rows if r["pareto"])
    ax.plot(*zip(*front), "-", alpha=0.5, label="Pareto front")
    for r in rows:
        ax.annotate(f"{r['lambda']:g}", (r["cost"], r["success"]), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    ax.axvline(budget, linestyle="--", color="grey", label=f"budget ${budget:g}")
    chosen = result["chosen"]
    ax.scatter([chosen["cost"]], [chosen["success"]], s=120, facecolors="none", edgecolors="red", label="chosen")
    fixed = result.get("fixed", [])
    if fixed:
        ax.scatter([r["cost"] for r in fixed], [r["success"] for r in fixed], marker="s", color="grey",
                   label="fixed models")
        for r in fixed:
            ax.annotate(r["model"], (r["cost"], r["success"]), fontsize=6, color="grey", xytext=(4, -8),
                        textcoords="offset points")
    ax.set_xlabel("cost per episode ($)")
    ax.set_ylabel("success per episode")
    ax.legend(loc="lower right", fontsize=8)
    plots.save_figure(fig, path)
