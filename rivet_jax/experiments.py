"""The paper's experiments on RouteSim, end to end (`python -m launch.reproduce`).

Phases, each resumable inside one workdir:
  1. collect the logged corpus                                  <workdir>/corpus/
  2. train RIVET (MC -> TD -> online) for every seed             <workdir>/runs/rivet/seed_<s>/
  3. train the ablations (w/o CQL, w/o RIVE, w/o response)       <workdir>/runs/<ablation>/seed_<s>/
  4. train RIVET at every other lambda of the sweep              <workdir>/runs/lambda_<lam>/seed_<s>/
  5. fit the baselines (MTRouter-style, kNN, cluster, EmbedLLM, RouterDC) on the same corpus
  6. evaluate: Table 1 (test + three OOD sets), Table 2 (ablations), Figure 3 (lambda sweep + oracle), Figure 4
     (online learning curve), Table 5 (unavailable models), Table 3 (stay / switch), accuracy-cost scatter
  7. write <workdir>/report.md (tables, embedded plots), results.json, results/<experiment>.{csv,json,png}

RIVET numbers are the mean and standard deviation over `config.reproduce.seeds`; fixed models, the random router
and the oracle are exact (RouteSim's DP); learned routers are rolled out (`config.evaluate.rollouts_per_task`
episodes per task, the same seeds for every router).
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import ml_collections
import numpy as np
from absl import logging
from matplotlib.figure import Figure  # figures straight to files: no pyplot state, no display backend

from rivet_jax import evaluation, online, pipelines, train
from rivet_jax.baselines.mtrouter import MTRouter
from rivet_jax.baselines.single_turn import (ClusterRouter, ContrastiveRouter, KNNRouter,
                                             MatrixFactorizationRouter)
from rivet_jax.data.replay import reference_cost
from rivet_jax.data.schema import read_episodes
from rivet_jax.encoders import EmbeddingStore, make_encoder
from rivet_jax.envs import collect as collect_lib
from rivet_jax.envs import oracle
from rivet_jax.envs.base import Policy, RouterPolicy, run_episode
from rivet_jax.envs.routesim import RouteSim, make_routesim
from rivet_jax.router import Router

ABLATIONS = {"w/o CQL": {"loss.alpha": 0.0}, "w/o RIVE": {"loss.beta": 0.0},
             "w/o response": {"loss.zero_response": True}}
MAIN = "RIVET (ours)"


# ------------------------------------------------------------------------------------------------ training


def _slug(name: str) -> str:
    return name.lower().replace("w/o ", "no_").replace(" ", "_").replace("(", "").replace(")", "")


def run_config(config: ml_collections.ConfigDict, corpus: Path, workdir: Path, seed: int,
               overrides: dict[str, Any], stage: str) -> ml_collections.ConfigDict:
    """The training config of one run: the corpus, a shared embedding cache, the seed and the overrides."""
    return pipelines.with_overrides(pipelines.training_config(config, corpus), {
        "data.embedding_cache": str(workdir / "embeddings"), "seed": seed, "stage": stage, **overrides})


def train_runs(config, corpus: Path, workdir: Path, group: str, overrides: dict, stage: str,
               log: Callable[[str], None]) -> list[Path]:
    """Trains (or resumes) one run per seed; returns their directories."""
    dirs = []
    for seed in config.reproduce.seeds:
        run_dir = workdir / "runs" / group / f"seed_{seed}"
        started = time.perf_counter()
        train.train(run_config(config, corpus, workdir, seed, overrides, stage), run_dir)
        log(f"trained {group} seed {seed} ({stage}) in {time.perf_counter() - started:.1f}s")
        dirs.append(run_dir)
    return dirs


# ---------------------------------------------------------------------------------------------- evaluation


class StayPolicy:
    """Table 3 'Stay': the router's first-turn model, kept for the whole episode."""

    def __init__(self, router: Router):
        self.router, self.name = router, "stay"

    def act(self, task, history, available, rng):
        if history and history[0].model in available:
            return history[0].model, 1.0
        return self.router.route(task.prompt, history, available=list(available)).model, 1.0


class SwitchAtTwoPolicy:
    """Table 3 'Switch': at turn two the router's second-highest-scoring model, greedy elsewhere."""

    def __init__(self, router: Router):
        self.router, self.name = router, "switch"

    def act(self, task, history, available, rng):
        decision = self.router.route(task.prompt, history, available=list(available))
        if len(history) == 1 and len(available) > 1:
            ranked = sorted(decision.scores, key=decision.scores.get, reverse=True)
            return ranked[1], 1.0
        return decision.model, 1.0


class Evaluator:
    """Rollouts and exact reports on one simulator, with the corpus' c_ref and the configured rollouts."""

    def __init__(self, sim: RouteSim, config, c_ref: float):
        self.sim, self.config, self.c_ref = sim, config, c_ref
        self._exact: dict = {}

    def rollouts(self, policy: Policy, split: str, lam: float, available: Sequence[str] | None = None) -> dict:
        episodes = evaluation.rollout(self.sim, policy, split, self.config.evaluate.rollouts_per_task,
                                      self.config.evaluate.seed, available=available)
        return evaluation.episode_metrics(episodes, lam, self.config.reward.gamma, self.c_ref,
                                          self.config.evaluate.rollouts_per_task)

    def exact(self, split: str, lam: float, available: Sequence[str] | None = None) -> dict:
        mask = None if available is None else tuple(n in available for n in self.sim.pool.names)
        key = (split, lam, mask)
        if key not in self._exact:
            self._exact[key] = oracle.policy_report(self.sim, split, lam, self.config.reward.gamma, self.c_ref,
                                                    available=mask)
        return self._exact[key]


def _row(router: str, split: str, metrics: dict, oracle_return: float, reference_cost_usd: float,
         **extra) -> dict:
    return {"router": router, "split": split, "accuracy": metrics["accuracy"], "cost_usd": metrics["cost"],
            "cost_rel": metrics["cost"] / reference_cost_usd, "return": metrics["return"],
            "regret": oracle_return - metrics["return"], "turns": metrics["turns"],
            "switch_rate": metrics["switch_rate"], **extra}


def _seed_row(router: str, split: str, per_seed: list[dict], oracle_return: float, reference_cost_usd: float) -> dict:
    """Mean over seeds, with the standard deviation of accuracy, cost and return."""
    mean = {k: float(np.mean([m[k] for m in per_seed])) for k in per_seed[0]}
    sd = {f"{k}_sd": float(np.std([m[k] for m in per_seed])) for k in ("accuracy", "cost", "return")}
    return _row(router, split, mean, oracle_return, reference_cost_usd, seeds=len(per_seed),
                accuracy_sd=sd["accuracy_sd"], cost_usd_sd=sd["cost_sd"], return_sd=sd["return_sd"])


# --------------------------------------------------------------------------------------------- experiments


def table1(ev: Evaluator, routers: dict[str, Policy], rivet: dict[str, list[Router]], splits: Sequence[str],
           lam: float) -> list[dict]:
    """Every router on each split; cost relative to the split's most accurate fixed model."""
    rows = []
    for split in splits:
        exact = ev.exact(split, lam)
        reference = exact[oracle.most_accurate_fixed(exact, ev.sim.pool.names)]["cost"]
        top = exact["oracle"]["return"]
        rows.append(_row("oracle", split, exact["oracle"], top, reference))
        rows += [_row(f"fixed:{n}", split, exact[n], top, reference) for n in ev.sim.pool.names]
        rows.append(_row("random", split, exact["random"], top, reference))
        rows += [_row(name, split, ev.rollouts(policy, split, lam), top, reference) for name, policy in routers.items()]
        for name, seeds in rivet.items():
            rows.append(_seed_row(name, split, [ev.rollouts(RouterPolicy(r), split, lam) for r in seeds], top,
                                  reference))
    return rows


def table2(ev: Evaluator, variants: dict[str, list[Router]], lam: float) -> list[dict]:
    """The ablations on the test manifest; cost relative to RIVET (ours)."""
    split = ev.config.evaluate.split
    top = ev.exact(split, lam)["oracle"]["return"]
    metrics = {name: [ev.rollouts(RouterPolicy(r), split, lam) for r in routers] for name, routers in variants.items()}
    reference = float(np.mean([m["cost"] for m in metrics[MAIN]]))
    return [_seed_row(name, split, per_seed, top, reference) for name, per_seed in metrics.items()]


def lambda_sweep(ev: Evaluator, by_lambda: dict[float, list[Router]]) -> list[dict]:
    """RIVET and the oracle at each lambda (accuracy and cost do not depend on lambda's use in J)."""
    split, rows = ev.config.evaluate.split, []
    for lam, routers in sorted(by_lambda.items()):
        exact = ev.exact(split, lam)
        reference = exact[oracle.most_accurate_fixed(exact, ev.sim.pool.names)]["cost"]
        top = exact["oracle"]["return"]
        rows.append({**_row("oracle", split, exact["oracle"], top, reference), "lambda": lam})
        rows.append({**_seed_row(MAIN, split, [ev.rollouts(RouterPolicy(r), split, lam) for r in routers], top,
                                 reference), "lambda": lam})
    return rows


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
    price = {c.name: c.price_in_per_mtok + c.price_out_per_mtok for c in ev.sim.pool.cards}
    for removed in (max(price, key=price.get), min(price, key=price.get)):
        available = [n for n in names if n != removed]
        exact = ev.exact(split, lam, available)
        top = exact["oracle"]["return"]
        ours = [ev.rollouts(RouterPolicy(r), split, lam, available) for r in rivet_online]
        reference = float(np.mean([m["cost"] for m in ours]))
        pool = f"w/o {removed}"
        rows.append({**_row("oracle", split, exact["oracle"], top, reference), "pool": pool})
        rows += [{**_row(f"fixed:{n}", split, exact[n], top, reference), "pool": pool} for n in available]
        rows.append({**_row("random", split, exact["random"], top, reference), "pool": pool})
        rows += [{**_row(name, split, ev.rollouts(policy, split, lam, available), top, reference), "pool": pool}
                 for name, policy in routers.items()]
        rows.append({**_seed_row("RIVET Online", split, ours, top, reference), "pool": pool})
    return rows


def interventions(ev: Evaluator, rivet_online: list[Router], lam: float) -> list[dict]:
    """Table 3: on episodes where RIVET switches, keep the first model (Stay); on episodes where it keeps one model
    beyond the first turn, force its second choice at turn two (Switch). Same task and seed for both policies."""
    split, tasks = ev.config.evaluate.split, ev.sim.tasks(ev.config.evaluate.split)
    gamma, groups = ev.config.reward.gamma, {"switched": ([], []), "kept": ([], [])}
    for router in rivet_online:
        for r in range(ev.config.evaluate.rollouts_per_task):
            for i, task in enumerate(tasks):
                def episode(policy):
                    return run_episode(ev.sim, task.id, policy, np.random.default_rng([ev.config.evaluate.seed, r, i]),
                                       f"{policy.name}/{task.id}/{r}")

                original = episode(RouterPolicy(router))
                if len({t.model for t in original.turns}) > 1:
                    groups["switched"][0].append(original)
                    groups["switched"][1].append(episode(StayPolicy(router)))
                elif len(original.turns) > 1:
                    groups["kept"][0].append(original)
                    groups["kept"][1].append(episode(SwitchAtTwoPolicy(router)))
    rows = []
    for group, intervention in (("switched", "Stay"), ("kept", "Switch")):
        originals, changed = groups[group]
        if not originals:
            continue
        base = evaluation.episode_metrics(originals, lam, gamma, ev.c_ref)
        for name, episodes in (("Original", originals), (intervention, changed)):
            m = evaluation.episode_metrics(episodes, lam, gamma, ev.c_ref)
            rows.append({"router": f"RIVET Online: {name}", "split": split, "episodes": len(episodes),
                         "group": group, "accuracy": m["accuracy"], "cost_usd": m["cost"],
                         "cost_rel": m["cost"] / base["cost"], "successes": int(round(m["accuracy"] * len(episodes))),
                         "switch_rate": m["switch_rate"], "turns": m["turns"]})
    return rows


def scatter(ev: Evaluator, table1_rows: list[dict]) -> list[dict]:
    """Every router's (cost, accuracy) on the test manifest, and the oracle's frontier over lambda."""
    split = ev.config.evaluate.split
    points = [{k: r[k] for k in ("router", "split", "accuracy", "cost_usd")} for r in table1_rows
              if r["split"] == split]
    frontier = [{"router": "oracle frontier", "split": split, "lambda": lam,
                 "accuracy": ev.exact(split, lam)["oracle"]["accuracy"], "cost_usd": ev.exact(split, lam)["oracle"]["cost"]}
                for lam in ev.config.reproduce.frontier_lambdas]
    return points + frontier


# -------------------------------------------------------------------------------------------------- plots


def _plot_lambda(rows: list[dict], path: Path) -> None:
    fig = Figure(figsize=(10, 3.8))
    axes = fig.subplots(1, 2)
    for router, style in ((MAIN, "o-"), ("oracle", "s--")):
        pts = [r for r in rows if r["router"] == router]
        lams = [r["lambda"] for r in pts]
        axes[0].errorbar(lams, [r["accuracy"] for r in pts], yerr=[r.get("accuracy_sd", 0) for r in pts],
                         fmt=style, label=router, capsize=3)
        axes[1].errorbar(lams, [r["cost_usd"] for r in pts], yerr=[r.get("cost_usd_sd", 0) for r in pts],
                         fmt=style, label=router, capsize=3)
    for ax, label in zip(axes, ("accuracy", "total test cost ($)")):
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set_xlabel("lambda")
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle("Cost-coefficient sweep (test manifest)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _plot_curve(rows: list[dict], path: Path) -> None:
    fig = Figure(figsize=(6, 3.8))
    ax = fig.subplots()
    x = [r["trajectories"] for r in rows]
    ax.errorbar(x, [r["accuracy"] for r in rows], yerr=[r["accuracy_sd"] for r in rows], fmt="o-", color="C0",
                capsize=3, label="accuracy")
    ax.set_xlabel("online trajectories")
    ax.set_ylabel("test accuracy", color="C0")
    twin = ax.twinx()
    twin.errorbar(x, [r["cost_usd"] for r in rows], yerr=[r["cost_usd_sd"] for r in rows], fmt="s--", color="C1",
                  capsize=3, label="cost")
    twin.set_ylabel("total test cost ($)", color="C1")
    ax.set_title("Online adaptation")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _plot_scatter(rows: list[dict], path: Path) -> None:
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    frontier = sorted((r for r in rows if r["router"] == "oracle frontier"), key=lambda r: r["cost_usd"])
    ax.plot([r["cost_usd"] for r in frontier], [r["accuracy"] for r in frontier], "k--", label="oracle frontier")
    for r in rows:
        if r["router"] != "oracle frontier":
            ax.scatter(r["cost_usd"], r["accuracy"], s=30)
            ax.annotate(r["router"].replace("fixed:", ""), (r["cost_usd"], r["accuracy"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("total test cost ($, log scale)")
    ax.set_ylabel("test accuracy")
    ax.legend(loc="lower right")
    ax.set_title("Accuracy-cost of every router")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# -------------------------------------------------------------------------------------------------- report


def _cell(row: dict, key: str, digits: int) -> str:
    value = row.get(key)
    if value is None:
        return ""
    text = f"{value:.{digits}f}"
    sd = row.get(f"{key}_sd")
    return f"{text} ± {sd:.{digits}f}" if sd is not None else text


def markdown_table(rows: list[dict], columns: Sequence[tuple[str, str, int]]) -> str:
    """columns: (key, header, digits); digits < 0 for text."""
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(k, "")) if d < 0 else _cell(row, k, d) for k, _, d in columns)
                     + " |")
    return "\n".join(lines)


_MAIN_COLUMNS = [("router", "router", -1), ("split", "split", -1), ("accuracy", "accuracy", 3),
                 ("cost_usd", "cost ($)", 3), ("cost_rel", "cost rel.", 3), ("regret", "regret (J)", 3),
                 ("turns", "turns", 2), ("switch_rate", "switch rate", 2)]
TABLES = {
    "table1": ("Table 1: every router, in distribution and OOD (cost relative to the most accurate fixed model)",
               _MAIN_COLUMNS),
    "table2": ("Table 2: ablations on the test manifest (cost relative to RIVET (ours), online stage)",
               [("router", "configuration", -1), ("accuracy", "accuracy", 3), ("cost_usd", "cost ($)", 3),
                ("cost_rel", "cost rel.", 3), ("regret", "regret (J)", 3)]),
    "lambda_sweep": ("Figure 3: cost-coefficient sweep", [("lambda", "lambda", -1)] + _MAIN_COLUMNS[:1]
                     + _MAIN_COLUMNS[2:6]),
    "online_curve": ("Figure 4: online adaptation (test manifest)",
                     [("trajectories", "online trajectories", -1), ("accuracy", "accuracy", 3),
                      ("cost_usd", "cost ($)", 3)]),
    "unavailability": ("Table 5: candidate-model unavailability at test time (cost relative to RIVET Online)",
                       [("pool", "pool", -1)] + _MAIN_COLUMNS[:1] + _MAIN_COLUMNS[2:6]),
    "interventions": ("Table 3: stay / switch interventions (cost relative to Original within each group)",
                      [("group", "episodes where RIVET", -1), ("router", "policy", -1), ("episodes", "episodes", -1),
                       ("successes", "successes", -1), ("accuracy", "accuracy", 3), ("cost_rel", "cost rel.", 3)]),
    "scatter": ("Accuracy-cost scatter (test manifest) with the oracle frontier",
                [("router", "router", -1), ("lambda", "lambda", -1), ("accuracy", "accuracy", 3),
                 ("cost_usd", "cost ($)", 3)]),
}
PLOTS = {"lambda_sweep": _plot_lambda, "online_curve": _plot_curve, "scatter": _plot_scatter}


def write_outputs(workdir: Path, experiments: dict[str, list[dict]], meta: dict, title: str,
                  tables: dict = TABLES, plots: dict = PLOTS) -> str:
    """report.md (a section per experiment: `tables[name]` = (title, columns), plot if `plots[name]`),
    results.json ({"experiments": {name: {"rows": [...]}}, "meta": ...}) and results/<name>.{json,csv,png}."""
    results = workdir / "results"
    results.mkdir(parents=True, exist_ok=True)
    sections = [f"# {title}\n\n{meta['summary']}\n"]
    for name, rows in experiments.items():
        (results / f"{name}.json").write_text(json.dumps({"rows": rows}, indent=2) + "\n", encoding="utf-8")
        keys = sorted({k for r in rows for k in r})
        with open(results / f"{name}.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(rows)
        heading, columns = tables[name]
        section = f"## {heading}\n\n{markdown_table(rows, columns)}\n"
        if name in plots:
            plots[name](rows, results / f"{name}.png")
            section += f"\n![{name}](results/{name}.png)\n"
        sections.append(section)
    report = "\n".join(sections)
    (workdir / "report.md").write_text(report, encoding="utf-8")
    (workdir / "results.json").write_text(json.dumps({"experiments": {n: {"rows": r} for n, r in experiments.items()},
                                                      "meta": meta}, indent=2) + "\n", encoding="utf-8")
    return report


# ---------------------------------------------------------------------------------------------------- main


def fit_baselines(config, episodes, pool, store: EmbeddingStore, lam: float, c_ref: float) -> dict[str, Policy]:
    b = config.baselines
    encoder = store.encoder
    return {
        "MTRouter": MTRouter.fit(episodes, pool, store, lam=lam, count_tokens=encoder.count_tokens,
                                 max_tokens=config.max_state_tokens, epochs=b.mtrouter_epochs, seed=config.seed),
        "Weighted kNN": KNNRouter.fit(episodes, pool, store, lam, c_ref, k=b.knn_k),
        "Avengers-Pro": ClusterRouter.fit(episodes, pool, store, lam, c_ref, clusters=b.clusters, seed=config.seed),
        "EmbedLLM": MatrixFactorizationRouter.fit(episodes, pool, store, lam, c_ref, seed=config.seed),
        "RouterDC": ContrastiveRouter.fit(episodes, pool, store, lam, c_ref, seed=config.seed),
    }


def reproduce(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
    workdir = Path(workdir)
    started = time.perf_counter()
    phases = 7

    def log(message: str, phase: int | None = None) -> None:
        prefix = f"[phase {phase}/{phases}] " if phase else "  "
        logging.info("%s%s (%.0fs elapsed)", prefix, message, time.perf_counter() - started)

    lam, rp = config.reward.lam, config.reproduce
    log("collect the logged corpus", 1)
    corpus = pipelines.collect(config, workdir)
    log("train RIVET (MC -> TD -> online) for every seed", 2)
    main_dirs = train_runs(config, corpus, workdir, "rivet", {}, "all", log)
    log("train the ablations", 3)
    ablation_dirs = {name: train_runs(config, corpus, workdir, _slug(name), overrides, "all", log)
                     for name, overrides in ABLATIONS.items()}
    log("train RIVET at the other lambdas of the sweep", 4)
    sweep_dirs = {float(lam): main_dirs}
    for sweep_lam in rp.lambdas:
        if float(sweep_lam) != float(lam):
            sweep_dirs[float(sweep_lam)] = train_runs(config, corpus, workdir, f"lambda_{sweep_lam}",
                                                      {"reward.lam": float(sweep_lam)}, rp.sweep_stage, log)
    log("fit the baselines", 5)
    sim = make_routesim(config.sim)
    episodes = read_episodes(corpus / collect_lib.EPISODES_FILE, sim.pool).episodes
    c_ref = reference_cost(episodes)
    store = EmbeddingStore(make_encoder(config.encoder), workdir / "embeddings")
    baselines = fit_baselines(config, episodes, sim.pool, store, lam, c_ref)

    log("evaluate", 6)
    ev = Evaluator(sim, config, c_ref)
    offline = [Router.from_checkpoint(d, stage="td") for d in main_dirs]
    onlines = [Router.from_checkpoint(d, stage="online") for d in main_dirs]
    experiments: dict[str, list[dict]] = {}
    splits = (config.evaluate.split, *rp.ood_splits)
    experiments["table1"] = table1(ev, baselines, {"RIVET Offline": offline, "RIVET Online": onlines}, splits, lam)
    log("Table 1 done")
    variants = {MAIN: onlines, **{name: [Router.from_checkpoint(d) for d in dirs]
                                  for name, dirs in ablation_dirs.items()}}
    experiments["table2"] = table2(ev, variants, lam)
    log("Table 2 done")
    sweep_stage = "online" if rp.sweep_stage == "all" else "td"
    experiments["lambda_sweep"] = lambda_sweep(ev, {
        sweep_lam: [Router.from_checkpoint(d, stage=sweep_stage) for d in dirs] for sweep_lam, dirs in sweep_dirs.items()})
    log("Figure 3 done")
    experiments["online_curve"] = online_curve(main_dirs, config.online.test_split)
    experiments["unavailability"] = unavailability(ev, baselines, onlines, lam)
    log("Table 5 done")
    experiments["interventions"] = interventions(ev, onlines, lam)
    experiments["scatter"] = scatter(ev, experiments["table1"])
    log("Table 3 and the scatter done")

    log("write the report", 7)
    meta = {"seconds": time.perf_counter() - started, "seeds": list(rp.seeds), "lambda": lam, "c_ref": c_ref,
            "rollouts_per_task": config.evaluate.rollouts_per_task,
            "summary": (f"RouteSim (`configs/routesim.py`), hashing encoder, lambda = {lam}, c_ref = {c_ref:.6f} "
                        f"(mean per-turn cost of the logged corpus). RIVET rows: mean ± standard deviation over "
                        f"seeds {list(rp.seeds)}. Oracle, fixed models and the random router are exact "
                        f"expectations; learned routers are rolled out {config.evaluate.rollouts_per_task} time(s) "
                        f"per task. Regret = the oracle's expected return J minus the router's. Sweep runs: stage "
                        f"'{rp.sweep_stage}'.")}
    write_outputs(workdir, experiments, meta, "RIVET on RouteSim: the paper's experiments")
    log(f"report written to {workdir / 'report.md'}")
    return {"experiments": experiments, "meta": meta}
