"""The paper's experiments on RouteSim, end to end (`python -m launch.reproduce`).

Phases, each resumable inside one workdir:
  1. collect the logged corpus                                  <workdir>/corpus/
  2. train RIVET (MC -> TD -> online) for every seed             <workdir>/runs/rivet/seed_<s>/
     and its ablations (w/o CQL, w/o RIVE, w/o response)         <workdir>/runs/<ablation>/seed_<s>/
     and at every other lambda of the sweep                      <workdir>/runs/lambda_<lam>/seed_<s>/
     as one run group: the offline stages of every run step together under vmap (rivet_jax/engine.py)
  3. fit the baselines (MTRouter-style, kNN, cluster, EmbedLLM, RouterDC) on the same corpus and roll them out,
     beside the training, in the process of the oracle's DPs (`experiments/evaluator.exact_pool`)
  4. evaluate: Table 1 (test + three OOD sets), Table 2 (ablations), Figure 3 (lambda sweep + oracle), Figure 4
     (online learning curve), Table 5 (unavailable models), Table 3 (stay / switch), accuracy-cost scatter,
     Tables 6-7 (routing after execution errors), Table 8 / Figure 5 (model selection per turn stage) and the Q*
     diagnostics of RIVET and w/o CQL (experiments/diagnostics.py)
  5. write <workdir>/report.md (tables, embedded plots), results.json, results/<experiment>.{csv,json,png}

RIVET numbers are the mean and standard deviation over `config.reproduce.seeds`; fixed models, the random router
and the oracle are exact (RouteSim's DP); learned routers are rolled out (`config.evaluate.rollouts_per_task`
episodes per task, the same seeds for every router).
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from pathlib import Path
from typing import Sequence

import ml_collections
import numpy as np
from absl import logging

from rivet_jax import evaluation, online, train
from rivet_jax.data.replay import Reward, reference_cost
from rivet_jax.data.schema import read_episodes
from rivet_jax.envs import oracle
from rivet_jax.envs.base import Policy, RouterPolicy, run_episodes
from rivet_jax.envs.routesim import make_routesim
from rivet_jax.experiments import diagnostics, frontier, prompt_cache, report, routesim_report, selection, traces
from rivet_jax.experiments.common import ONE_RUN, pessimistic
from rivet_jax.online_curve import draw_curves
from rivet_jax.progress import Phases, Progress, result_of
from rivet_jax.runs import MAIN, collected_corpus, corpus_files, member_seeds, train_variants, training_config
from rivet_jax.experiments.evaluator import Evaluator, StayPolicy, SwitchAtTwoPolicy, exact_pool, row, seed_row
from rivet_jax.router import Router

CONDITIONED_RUNS = "lambda_conditioned"  # the variant trained on every lambda of the sweep at once
ABLATIONS = {"w/o CQL": {"loss.alpha": 0.0}, "w/o RIVE": {"loss.beta": 0.0},
             "w/o response": {"loss.zero_response": True}}


# ------------------------------------------------------------------------------------ corpus and one router


def evaluate(config: ml_collections.ConfigDict, workdir: str | Path, router_dir: str | Path) -> dict:
    """The trained router (rollouts) against the oracle, the fixed models and the random router (exact)."""
    sim = make_routesim(config.sim)
    router = Router.from_checkpoint(router_dir)
    reward = Reward.of(router.config, router.c_ref)
    lam, gamma, c_ref = reward
    split = config.evaluate.split
    started = time.perf_counter()
    exact = oracle.policy_report(sim, split, reward)
    episodes = evaluation.rollout(sim, RouterPolicy(router), split, config.evaluate.rollouts_per_task,
                                  config.evaluate.seed)
    learned = evaluation.episode_metrics(episodes, reward, config.evaluate.rollouts_per_task)
    reference = oracle.most_accurate_fixed(exact, sim.pool.names)
    rows = evaluation.compare_with_oracle({"rivet": learned, **exact}, exact["oracle"], reference)
    result = {"split": split, "lambda": lam, "gamma": gamma, "c_ref": c_ref, "reference": reference,
              "rollouts_per_task": config.evaluate.rollouts_per_task, "rows": rows,
              "seconds": time.perf_counter() - started}
    title = (f"RouteSim {split} ({len(sim.tasks(split))} tasks), lambda {lam}: cost vs {reference}; regret = "
             f"oracle J - J")
    table = evaluation.format_table(rows, title)
    Path(workdir).mkdir(parents=True, exist_ok=True)
    (Path(workdir) / "evaluation.md").write_text(table + "\n", encoding="utf-8")
    (Path(workdir) / "evaluation.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    logging.info("\n%s", table)
    return result


def run_routesim(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
    """`launch.evaluate`: collect -> train RIVET offline (MC then TD) into <workdir>/train/ -> evaluate."""
    router_dir = Path(workdir) / "train"
    train.train(training_config(config, collected_corpus(config, workdir)), router_dir)
    return evaluate(config, workdir, router_dir)


# --------------------------------------------------------------------------------------------- experiments


def table1(ev: Evaluator, routers: dict[str, Policy], rivet: dict[str, list[Router]], splits: Sequence[str],
           lam: float) -> list[dict]:
    """Every router on each split; cost relative to the split's most accurate fixed model."""
    rows = []
    for split in splits:
        exact = ev.exact(split, lam)
        reference = exact[oracle.most_accurate_fixed(exact, ev.sim.pool.names)]["cost"]
        top = exact["oracle"]["return"]
        rows.append(row("oracle", split, exact["oracle"], top, reference))
        rows += [row(f"fixed:{n}", split, exact[n], top, reference) for n in ev.sim.pool.names]
        rows.append(row("random", split, exact["random"], top, reference))
        rows += [row(name, split, ev.rollouts(policy, split, lam, record=name), top, reference)
                 for name, policy in routers.items()]
        for name, seeds in rivet.items():
            rows.append(seed_row(name, split, [ev.rollouts(RouterPolicy(r), split, lam, record=name, reuse=r)
                                               for r in seeds], top, reference))
    return rows


def post_error(ev: Evaluator, reference: str = "MTRouter") -> list[dict]:
    """Tables 6-7: routing after execution errors, on every learned router's Table 1 traces (test and OOD pooled,
    RIVET's seeds pooled); switch cost relative to `reference`'s."""
    stats = {name: traces.post_error(episodes) for name, episodes in ev.traces.items()}
    reference_cost = stats[reference]["switch_cost_usd"] if reference in stats else float("nan")
    return [{"router": name, **{k: v for k, v in s.items() if k != "by_class"},
             "switch_cost_rel": s["switch_cost_usd"] / reference_cost,
             **{f"events: {kind}": n for kind, n in s["by_class"].items()}} for name, s in stats.items()]


def stage_preferences(ev: Evaluator) -> list[dict]:
    """Table 8 / Figure 5: each learned router's model shares within Analyze, Solve and Submit turns (Table 1
    traces, test and OOD pooled)."""
    return [{"router": name, "stage": stage, **shares} for name, episodes in ev.traces.items()
            for stage, shares in traces.stage_preferences(episodes, ev.sim.pool.names).items()]


def table2(ev: Evaluator, variants: dict[str, list[Router]], lam: float) -> list[dict]:
    """The ablations on the test manifest; cost relative to RIVET (ours)."""
    split = ev.config.evaluate.split
    top = ev.exact(split, lam)["oracle"]["return"]
    metrics = {name: [ev.rollouts(RouterPolicy(r), split, lam, reuse=r if name == MAIN else None) for r in routers]
               for name, routers in variants.items()}   # (RIVET (ours): Table 1's RIVET Online episodes)
    reference = float(np.mean([m["cost"] for m in metrics[MAIN]]))
    return [seed_row(name, split, per_seed, top, reference) for name, per_seed in metrics.items()]


def lambda_sweep(ev: Evaluator, per_lambda: dict[float, list[Router]], conditioned: list[Router]) -> list[dict]:
    """Figure 3: at each lambda, the oracle, the runs trained at that lambda (one per seed) and the
    lambda-conditioned runs (one per seed) read at it. Accuracy and cost of a fixed model do not depend on lambda."""
    split, rows = ev.config.evaluate.split, []
    fixed = ev.exact(split, ev.config.reward.lam)
    reference = fixed[oracle.most_accurate_fixed(fixed, ev.sim.pool.names)]["cost"]
    for lam, routers in sorted(per_lambda.items()):
        best = ev.oracle(split, lam)
        top = best["return"]
        rows.append({**row("oracle", split, best, top, reference), "lambda": lam})
        for name, family in ((frontier.PER_LAMBDA, routers), (frontier.CONDITIONED,
                                                               [r.at_lambda(lam) for r in conditioned])):
            rows.append({**seed_row(name, split, [ev.rollouts(RouterPolicy(r), split, lam) for r in family], top,
                                    reference), "lambda": lam})
    return rows


def budget_frontier(ev: Evaluator, sweep: list[dict], scatter_rows: list[dict]) -> list[dict]:
    """The test split's points (Table 1's routers, fixed models and oracle frontier: the scatter's; the sweep's two
    RIVET families) and each family's APGR and cost to 50% / 80% of the cheapest-to-best gap (experiments/frontier.py)."""
    split = ev.config.evaluate.split
    keys = ("router", "split", "lambda", "accuracy", "cost_usd", "accuracy_sd", "cost_usd_sd")
    points = [{k: r[k] for k in keys if k in r} for r in (*scatter_rows, *sweep)
              if r["split"] == split and r["router"] not in ("oracle", "random")]
    return frontier.budget_rows(points)


def online_curve(run_dirs: Sequence[Path], split: str) -> list[dict]:
    """Figure 4: test accuracy and cost after each curve point, mean and spread over seeds."""
    curves = [online.read_progress(d)["curve"] for d in run_dirs]
    points = sorted({p["trajectories"] for c in curves for p in c})
    rows = []
    for point in points:
        at = [p for c in curves for p in c if p["trajectories"] == point]
        rows.append({"router": MAIN, "split": split, "trajectories": point, "seeds": len(at),
                     "accuracy": float(np.mean([p["accuracy"] for p in at])),
                     "accuracy_sd": float(np.std([p["accuracy"] for p in at])),
                     "cost_usd": float(np.mean([p["cost"] for p in at])),
                     "cost_usd_sd": float(np.std([p["cost"] for p in at]))})
    return rows


def unavailability(ev: Evaluator, routers: dict[str, Policy], rivet_online: list[Router], lam: float) -> list[dict]:
    """Table 5: the most expensive, then the cheapest model removed at test time; cost relative to RIVET."""
    split, names, rows = ev.config.evaluate.split, ev.sim.pool.names, []
    for removed in removed_models(ev.sim.pool):
        available = [n for n in names if n != removed]
        exact = ev.exact(split, lam, available)
        top = exact["oracle"]["return"]
        ours = [ev.rollouts(RouterPolicy(r), split, lam, available) for r in rivet_online]
        reference = float(np.mean([m["cost"] for m in ours]))
        pool = f"w/o {removed}"
        rows.append({**row("oracle", split, exact["oracle"], top, reference), "pool": pool})
        rows += [{**row(f"fixed:{n}", split, exact[n], top, reference), "pool": pool} for n in available]
        rows.append({**row("random", split, exact["random"], top, reference), "pool": pool})
        rows += [{**row(name, split, ev.rollouts(policy, split, lam, available), top, reference), "pool": pool}
                 for name, policy in routers.items()]
        rows.append({**seed_row("RIVET Online", split, ours, top, reference), "pool": pool})
    return rows


def removed_models(pool) -> tuple[str, str]:
    """Table 5's two pools' missing model: the most expensive, then the cheapest (input + output price)."""
    price = {c.name: c.price_in_per_mtok + c.price_out_per_mtok for c in pool.cards}
    return max(price, key=price.get), min(price, key=price.get)


def exact_requests(config: ml_collections.ConfigDict, pool) -> list[tuple]:
    """The exact reports the evaluation reads, in its order ((split, lambda, available models or None, oracle only),
    as `Evaluator.solve_ahead` takes them): Table 1's per split, the oracle at every lambda of the sweep (Figure 3),
    Table 5's without each removed model, and the oracle at every lambda of the frontier (the scatter)."""
    split, rp, lam = config.evaluate.split, config.reproduce, config.reward.lam
    return [*((s, lam, None, False) for s in (split, *rp.ood_splits)),
            *((split, x, None, True) for x in routesim_report.sweep_lambdas(config)),
            *((split, lam, [n for n in pool.names if n != removed], False) for removed in removed_models(pool)),
            *((split, x, None, True) for x in rp.frontier_lambdas)]


def baseline_requests(config: ml_collections.ConfigDict, pool) -> list[tuple]:
    """Where the evaluation rolls the baselines out ((split, models available or None), as
    `Evaluator.baselines_ahead` takes them): Table 1's splits, Table 5's test split without each removed model."""
    split, names = config.evaluate.split, pool.names
    return [*((s, None) for s in (split, *config.reproduce.ood_splits)),
            *((split, [n for n in names if n != removed]) for removed in removed_models(pool))]


def interventions(ev: Evaluator, rivet_online: list[Router], lam: float) -> list[dict]:
    """Table 3: on episodes where RIVET switches, keep the first model (Stay); on episodes where it keeps one model
    beyond the first turn, force its second choice at turn two (Switch). Same task and seed for both policies."""
    split, tasks = ev.config.evaluate.split, ev.sim.tasks(ev.config.evaluate.split)
    gamma, groups = ev.config.reward.gamma, {"switched": ([], []), "kept": ([], [])}
    runs = [(r, i, task) for r in range(ev.config.evaluate.rollouts_per_task) for i, task in enumerate(tasks)]

    def episodes(policy, chosen: list) -> list:  # every chosen (rollout, task) at once, each with its own seed
        return run_episodes(ev.sim, [task.id for _, _, task in chosen], policy,
                            [np.random.default_rng([ev.config.evaluate.seed, r, i]) for r, i, _ in chosen],
                            [f"{policy.name}/{task.id}/{r}" for r, _, task in chosen])

    for router in rivet_online:
        originals = ev.episodes(RouterPolicy(router), split, reuse=router)   # Table 1's, in the order of `runs`
        switched = [k for k, e in enumerate(originals) if len({t.model for t in e.turns}) > 1]
        kept = [k for k, e in enumerate(originals) if len({t.model for t in e.turns}) == 1 and len(e.turns) > 1]
        for group, chosen, policy in (("switched", switched, StayPolicy(router)),
                                      ("kept", kept, SwitchAtTwoPolicy(router))):
            groups[group][0].extend(originals[k] for k in chosen)
            groups[group][1].extend(episodes(policy, [runs[k] for k in chosen]))
        if ev.progress is not None:
            ev.progress.step()
    rows = []
    for group, intervention in (("switched", "Stay"), ("kept", "Switch")):
        originals, changed = groups[group]
        if not originals:
            continue
        base = evaluation.episode_metrics(originals, Reward(lam, gamma, ev.c_ref))
        for name, episodes in (("Original", originals), (intervention, changed)):
            m = evaluation.episode_metrics(episodes, Reward(lam, gamma, ev.c_ref))
            rows.append({"router": f"RIVET Online: {name}", "split": split, "episodes": len(episodes),
                         "group": group, "accuracy": m["accuracy"], "cost_usd": m["cost"],
                         "cost_rel": m["cost"] / base["cost"], "successes": int(round(m["accuracy"] * len(episodes))),
                         "switch_rate": m["switch_rate"], "turns": m["turns"]})
    return rows


def q_star_diagnostics(config: ml_collections.ConfigDict, sim, logged: Sequence,
                       dirs: dict[str, Sequence[Sequence[Path]]], pessimism: dict[str, float] | None = None
                       ) -> list[dict]:
    """Q_route of each named router (per seed, the runs it averages: one, or an ensemble's, scored as mean -
    pessimism[name] x sd where given) at its TD and online checkpoints against the exact Q*, on logged states and on
    its own rollouts on `config.diagnose.split`; mean ± sd over seeds (rivet_jax/experiments/diagnostics.py)."""
    pessimism = pessimism or {}
    routers = [({"router": name, "run": f"{runs[0].parent.name}/{runs[0].name}", "stage": stage},
                Router.ensemble([Router.from_checkpoint(d, stage=stage) for d in runs], pessimism.get(name, 0.0)))
               for name, per_seed in dirs.items() for runs in per_seed for stage in ("td", "online")]
    d = config.diagnose
    return diagnostics.over_seeds(diagnostics.diagnose(sim, routers, logged, d.split, d.rollouts, d.seed,
                                                       d.max_logged_states))


def scatter(ev: Evaluator, table1_rows: list[dict]) -> list[dict]:
    """Every router's (cost, accuracy) on each Table 1 split, RIVET's with its spread over seeds, and the oracle's
    frontier over lambda on the test manifest only (an exact DP per lambda: the expensive part)."""
    split = ev.config.evaluate.split
    keys = ("router", "split", "accuracy", "cost_usd", "accuracy_sd", "cost_usd_sd")
    points = [{k: r[k] for k in keys if k in r} for r in table1_rows]
    frontier = [{"router": report.FRONTIER, "split": split, "lambda": lam,
                 **{k: ev.oracle(split, lam)[m] for k, m in (("accuracy", "accuracy"), ("cost_usd", "cost"))}}
                for lam in ev.config.reproduce.frontier_lambdas]
    return points + frontier


# ---------------------------------------------------------------------------------------------------- main


def reproduce(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
    ahead = exact_pool()   # the oracle's DPs
    try:
        return _reproduce(config, Path(workdir), ahead)
    finally:   # (a failed job does not wait for the DPs still queued)
        ahead.shutdown(cancel_futures=True)


def _reproduce(config: ml_collections.ConfigDict, workdir: Path, ahead: concurrent.futures.Executor) -> dict:
    phases = Phases()

    def log(message: str, phase: int | None = None) -> None:
        prefix = f"[phase {phase}/6] " if phase else "  "
        logging.info("%s%s (%s)", prefix, message, phases.mark(message))

    lam, rp = config.reward.lam, config.reproduce
    log("collect the logged corpus", 1)
    corpus = collected_corpus(config, workdir)
    episodes_path, cards_path = corpus_files(corpus)
    sim = make_routesim(config.sim)
    episodes = read_episodes(episodes_path, sim.pool).episodes
    c_ref = reference_cost(episodes)
    ev = Evaluator(sim, config, c_ref)
    # The oracle's DPs and the baselines, from now on in a process of the lowest priority: on the cores training and
    # rollouts leave idle
    ev.solve_ahead(exact_requests(config, sim.pool), ahead)
    baselines_ahead = ev.baselines_ahead(episodes, lam, baseline_requests(config, sim.pool), ahead)
    # The same for the prompt-cache experiment's corpus (its collection takes a second), in its c_ref: the mean
    # per-turn cost, cached prices included
    cached, cache_episodes = prompt_cache.cache_config(config), prompt_cache.collect(config, workdir)
    cache_ev = Evaluator(make_routesim(cached.sim), cached, reference_cost(cache_episodes))
    cache_ev.solve_ahead([(config.evaluate.split, lam, None, False)], ahead)
    cache_baselines_ahead = cache_ev.baselines_ahead(cache_episodes, lam, [(config.evaluate.split, None)], ahead)

    settings = selection.grid(config)
    listed = "; ".join(map(selection.label, settings))
    log(f"train RIVET at every conservatism setting of `select` ({listed}; "
        f"alpha = 0 is the w/o CQL ablation): {len(settings)} x {len(rp.seeds)} seeds, the offline stages of all runs "
        f"together, then their online stages in lockstep", 2)
    # Figure 4 reads the chosen setting's curves alone: every run keeps its routers at the curve points, and only
    # the chosen runs' are rolled out on the test tasks
    by_setting = train_variants(config, episodes_path, cards_path, workdir,
                                {selection.variant(s): ({**selection.overrides(s), "online.defer_curve": True}, "all")
                                 for s in settings}, rp.seeds)
    chosen, selected = selection.select(config, sim, {s: by_setting[selection.variant(s)] for s in settings})
    main_dirs = by_setting[selection.variant(chosen)]
    draw_curves(main_dirs, sim)
    sweep = routesim_report.sweep_lambdas(config)
    other_lambdas = [x for x in sweep if x != float(lam)]
    at_chosen = {**selection.overrides(chosen), "online.curve_points": ()}  # Figure 4 is the main runs' alone
    # The sweep compares offline routers: one run per lambda (the main runs' TD checkpoint at lambda = lam) and one
    # run conditioned on every lambda of the sweep (`reward.lam_range`; offline only).
    variants = {**{name: ({**at_chosen, **overrides}, "all") for name, overrides in ABLATIONS.items()
                   if name != "w/o CQL"},
                **{f"lambda_{x}": ({**at_chosen, "reward.lam": x}, "offline") for x in other_lambdas},
                CONDITIONED_RUNS: ({**at_chosen, "reward.lam_range": (sweep[0], sweep[-1]),
                                    "td_epochs": rp.conditioned_td_epochs}, "offline")}
    # RIVET (ours) averages `ensemble` runs per seed: the grid's run and ensemble - 1 more at other seeds, trained
    # in the same run group (their online stages in lockstep with the ablations')
    extra = [s for seed in rp.seeds for s in member_seeds(seed, rp.ensemble)[1:]]
    members = f"{selection.variant(chosen)}_members"
    scores = "; ".join(f"{selection.label((r['alpha'], r['cql_on']))}: {r['val_return']:.4f}" for r in selected)
    why = f"validation J {scores}" if config.select.enabled else "fixed: select.enabled is off"
    more = f", and {len(extra)} more runs at it to average {rp.ensemble} per seed" if extra else ""
    log(f"{selection.label(chosen)} chosen on '{config.select.split}' ({why}); train its ablations and the lambda "
        f"sweep: {len(variants)} variants x {len(rp.seeds)} seeds{more}", 3)
    dirs = train_variants(config, episodes_path, cards_path, workdir,
                          {**variants, **({members: (at_chosen, "all")} if extra else {})}, rp.seeds,
                          seeds_of={members: extra})
    by_seed = dict(zip(extra, dirs[members] if extra else []))
    log(f"train on RouteSim with a prompt cache: a cache-aware and a cache-blind run at {selection.label(chosen)} "
        f"x {len(rp.seeds)} seeds (offline), on the same policies' corpus collected there")
    cache_dirs = prompt_cache.train_routers(config, workdir, at_chosen, rp.seeds)
    ensembles = [[d] + [by_seed[s] for s in member_seeds(seed, rp.ensemble)[1:]]
                 for seed, d in zip(rp.seeds, main_dirs)]
    offline, onlines = ([Router.ensemble([Router.from_checkpoint(d, stage=stage) for d in runs]) for runs in ensembles]
                        for stage in ("td", "online"))
    one_run = MAIN if rp.ensemble == 1 else ONE_RUN  # the chosen setting's single runs (Table 2, Figure 3)
    singles = {one_run: main_dirs} if one_run != MAIN else {}
    # The ensemble-pessimism alternative to Eq. 10: the same runs scored as mean - c x sd (Table 2, diagnostics).
    lower = {pessimistic(c): float(c) for c in rp.pessimism} if rp.ensemble > 1 else {}
    if singles:
        selected.append(selection.ensemble_row(config, sim, chosen, onlines))
    ablation_dirs = {name: by_setting[selection.variant((0.0, "all"))] if name == "w/o CQL" else dirs[name]
                     for name in ABLATIONS}
    sweep_dirs = {float(lam): main_dirs, **{x: dirs[f"lambda_{x}"] for x in other_lambdas}}
    # The grid's other settings (the paper's among them) are rows of Table 2 and of the diagnostics.
    other_settings = {r["router"]: by_setting[selection.variant((r["alpha"], r["cql_on"]))] for r in selected
                      if not r["chosen"] and r["alpha"] > 0}
    one_each = {**singles, **other_settings, "w/o CQL": ablation_dirs["w/o CQL"]}  # one run per seed
    diagnosed = ahead.submit(q_star_diagnostics, config, sim, episodes, {
        MAIN: ensembles, **{name: ensembles for name in lower},
        **{name: [[d] for d in dirs] for name, dirs in one_each.items()}}, pessimism=lower)
    log("the baselines, fitted and rolled out beside the training (in the DPs' process)", 4)
    baselines = result_of(baselines_ahead, "the baselines")
    cache_baselines = result_of(cache_baselines_ahead, "the prompt-cache experiment's baselines")

    log("evaluate", 5)
    splits, seeds, fitted = (config.evaluate.split, *rp.ood_splits), len(rp.seeds), len(baselines)
    rollout_sets = (len(splits) * (fitted + 2 * seeds)
                    + (1 + len(singles) + len(lower) + len(other_settings) + len(ABLATIONS)) * seeds
                    + 2 * len(sweep_dirs) * seeds
                    + 2 * (fitted + seeds) + seeds    # Tables 1, 2, Figure 3, Table 5, Table 3
                    + len(cache_baselines) + 2 * seeds)  # the prompt cache
    ev.progress = cache_ev.progress = Progress("evaluation (rollout sets)", rollout_sets)
    experiments: dict[str, list[dict]] = {}
    experiments["table1"] = table1(ev, baselines, {"RIVET Offline": offline, "RIVET Online": onlines}, splits, lam)
    log("Table 1 done")
    variants = {MAIN: onlines,
                **{name: [Router.ensemble([ours], c) for ours in onlines] for name, c in lower.items()},  # no reload
                **{name: [Router.from_checkpoint(d) for d in dirs]
                   for name, dirs in {**singles, **other_settings, **ablation_dirs}.items()}}
    experiments["table2"] = table2(ev, variants, lam)
    log("Table 2 done")
    experiments["lambda_sweep"] = lambda_sweep(ev, {
        sweep_lam: [Router.from_checkpoint(d, stage="td") for d in dirs] for sweep_lam, dirs in sweep_dirs.items()},
        [Router.from_checkpoint(d, stage="td") for d in dirs[CONDITIONED_RUNS]])
    experiments["lambda_conditioned"] = frontier.lambda_conditioned(experiments["lambda_sweep"])
    log("Figure 3 (one lambda-conditioned run against one run per lambda) done")
    experiments["online_curve"] = online_curve(main_dirs, config.online.test_split)
    experiments["unavailability"] = unavailability(ev, baselines, onlines, lam)
    log("Table 5 done")
    experiments["interventions"] = interventions(ev, onlines, lam)
    experiments["scatter"] = scatter(ev, experiments["table1"])
    experiments["budget_frontier"] = budget_frontier(ev, experiments["lambda_sweep"], experiments["scatter"])
    experiments["prompt_cache"] = prompt_cache.rows(
        cache_ev, cache_baselines,
        *([Router.from_checkpoint(d, stage="td") for d in cache_dirs[name]]
          for name in (prompt_cache.CACHE_AWARE, prompt_cache.CACHE_BLIND)), lam)
    log("the prompt cache (cache-aware against cache-blind) done")
    experiments["post_error"] = post_error(ev)
    experiments["stage_preferences"] = stage_preferences(ev)
    log("Table 3, the scatter and the trace analyses (Tables 7-8) done")
    experiments["selection"] = selected
    experiments["diagnostics"] = result_of(diagnosed, "the Q* diagnostics")   # (solved beside the evaluation)
    log("Q* diagnostics done")

    log("write the report", 6)
    ensemble_note = ("" if rp.ensemble == 1 else
                     f"; RIVET (ours), RIVET Offline and RIVET Online average Q_route over {rp.ensemble} runs per seed "
                     f"(seed s: s, s + 1000, ...; `Router.ensemble`), every other RIVET row is one run per seed")
    meta = {"seconds": phases.seconds(), "phases": phases.record,   # where the time and memory go
            "seeds": list(rp.seeds), "lambda": lam, "c_ref": c_ref,
            "rollouts_per_task": config.evaluate.rollouts_per_task,
            "summary": (f"RouteSim (`configs/routesim.py`), hashing encoder, lambda = {lam}, c_ref = {c_ref:.6f} "
                        f"(mean per-turn cost of the logged corpus). RIVET rows: mean ± standard deviation over "
                        f"seeds {list(rp.seeds)}{ensemble_note}. Oracle, fixed models and the random router are exact "
                        f"expectations; learned routers are rolled out {config.evaluate.rollouts_per_task} time(s) "
                        f"per task. Regret = the oracle's expected return J minus the router's. Lambda sweep: TD "
                        f"checkpoints, one run per lambda and seed against one lambda-conditioned run per seed.")}
    traced = "every learned router's Table 1 traces, test and OOD pooled"
    tables = {**routesim_report.TABLES,
              "post_error": report.post_error_section(f"{traced}; switch cost also relative to MTRouter's"),
              "stage_preferences": report.stage_section(traced, sim.pool.names)}
    colours = report.router_colours([r["router"] for rows in experiments.values() for r in rows if "router" in r]
                                    + [f"fixed:{m}" for m in sim.pool.names])
    notes = routesim_report.report_notes(config, [online.read_progress(d)["best_at"] for d in main_dirs],
                         len(sim.tasks(config.evaluate.split)))
    plots = report.with_colours(routesim_report.PLOTS, colours)
    report.write_outputs(workdir, {name: experiments[name] for name in routesim_report.REPORT_ORDER}, meta,
                         "RIVET on RouteSim: the paper's experiments", tables, plots, notes)
    log(f"report written to {workdir / 'report.md'}")
    return {"experiments": experiments, "meta": meta}
