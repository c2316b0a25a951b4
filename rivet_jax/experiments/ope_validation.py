"""Off-policy evaluation against the truth, on RouteSim (`python -m launch.evaluate_logs --validate_routesim`).

IS, WIS, FQE and DR (`rivet_jax.ope`) estimate J, success and cost per episode of the six fixed models, the random
router, the oracle and a trained RIVET router from logs; RouteSim knows their true values: exact by dynamic
programming for the fixed models, the random router and the oracle (`envs/oracle.py`, on the tasks of the logs,
weighted as the logs weight them), by `config.ope.rollouts` rollouts per task for the learned router (its truth
then has a Monte Carlo standard error, reported beside it). Two sets of logs:

  training  the corpus the router was trained on (`launch.collect`: six fixed models and a random router on the
            training tasks): what the brief of an offline router evaluates on when nothing is held out
  held-out  the same seven loggers on `config.ope.heldout_split` with `config.ope.heldout_seed`: tasks and episodes the
            router never saw, which is what `launch.evaluate_logs` is for

For each: truth, every estimate with its 95% interval and whether the interval covers the truth; written as
<workdir>/ope_validation.md and .json. The router is <workdir>/train (trained there, as `launch.evaluate` does, when
it is not yet).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import ml_collections
import numpy as np
from absl import logging

from rivet_jax import evaluation, ope, train
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode, read_episodes
from rivet_jax.envs import collect as collect_lib
from rivet_jax.envs import oracle
from rivet_jax.envs.base import RouterPolicy, run_episodes
from rivet_jax.envs.routesim import RouteSim, make_routesim
from rivet_jax.heldout import principal_features
from rivet_jax.runs import check_same_config, collected_corpus, corpus_files, training_config
from rivet_jax.offpolicy import RANDOM, reference_policies, targets_of, write_result
from rivet_jax.router import Router

RIVET = "RIVET (one run)"
ORACLE = "oracle"
CHANNELS = {"return": "value", "success": "success", "cost": "cost"}  # ope channel -> oracle.PolicyStats field


def exact_truth(sim: RouteSim, episodes: list[Episode], policy: str | int, reward: Reward) -> dict:
    """The policy's exact J, success and cost from the first turn (DP), averaged over the logs' episodes' tasks."""
    tasks = Counter(e.task.id for e in episodes)
    stats = {task: oracle.solve(sim, sim.sim_task(task), reward, policy).stats for task in tasks}
    return {channel: sum(n * getattr(stats[t], field) for t, n in tasks.items()) / len(episodes)
            for channel, field in CHANNELS.items()}


def rollout_truth(sim: RouteSim, router: Router, episodes: list[Episode], rollouts: int, seed: int) -> dict:
    """The router's J, success and cost per episode from `rollouts` rollouts of each task of the logs (weighted as
    the logs weight the tasks), each with its standard error (`<channel>_se`)."""
    tasks = Counter(e.task.id for e in episodes)
    ids = list(tasks)
    runs = [(r, i) for r in range(rollouts) for i in range(len(ids))]
    rolled = run_episodes(sim, [ids[i] for _, i in runs], RouterPolicy(router),
                          [np.random.default_rng([seed, r, i]) for r, i in runs],
                          [f"rivet/{ids[i]}/{r}" for r, i in runs])
    reward = Reward.of(router.config, router.c_ref)
    values = {"return": [evaluation.discounted_return(e, reward) for e in rolled],
              "success": [float(e.outcome) for e in rolled], "cost": [sum(t.cost for t in e.turns) for e in rolled]}
    weight = np.array([tasks[ids[i]] for _, i in runs], float)
    weight /= weight.sum()
    out = {}
    for channel, x in values.items():
        x = np.asarray(x)
        mean = float(weight @ x)
        out[channel] = mean
        out[f"{channel}_se"] = float(np.sqrt(np.sum(weight**2 * (x - mean) ** 2)))
    return out


def heldout_corpus(config: ml_collections.ConfigDict, workdir: Path, sim: RouteSim) -> Path:
    """The seven loggers on `config.ope.heldout_split` with `config.ope.heldout_seed`, collected once."""
    directory = workdir / "ope_heldout"
    check_same_config(directory / "config.json", {"sim": config.sim.to_dict(), "split": config.ope.heldout_split,
                                                  "seed": config.ope.heldout_seed})
    if not (directory / collect_lib.EPISODES_FILE).exists():
        episodes = collect_lib.collect_corpus(sim, config.ope.heldout_split, config.ope.heldout_seed)
        collect_lib.write_corpus(directory, sim, episodes)
    return directory / collect_lib.EPISODES_FILE


def validate_logs(config: ml_collections.ConfigDict, sim: RouteSim, router: Router, episodes: list[Episode],
                  name: str) -> dict:
    """Every estimate of the nine policies on one set of logs, with the truth and coverage per channel."""
    started = time.perf_counter()
    reward, ope_config = Reward.of(router.config, router.c_ref), config.ope
    logs = ope.read_logs(episodes, sim.pool, reward)
    policies = {**reference_policies(sim.pool), ORACLE: oracle.OraclePolicy(sim, reward), RIVET: RouterPolicy(router)}
    truth = {f"fixed:{m}": exact_truth(sim, episodes, k, reward) for k, m in enumerate(sim.pool.names)}
    truth[RANDOM] = exact_truth(sim, episodes, "random", reward)
    truth[ORACLE] = exact_truth(sim, episodes, "oracle", reward)
    truth[RIVET] = rollout_truth(sim, router, episodes, ope_config.rollouts, ope_config.rollout_seed)
    logging.info("OPE validation (%s logs): truth in %.0fs", name, time.perf_counter() - started)
    features = principal_features(ope.state_embeddings(logs, router.encoder, router.config.max_state_tokens),
                                  ope_config.max_features)  # the same FQE as launch.evaluate_logs
    result = ope.evaluate(logs, targets_of(policies, logs, sim.pool), features, resamples=ope_config.resamples,
                          seed=ope_config.seed)
    for row in result["rows"]:
        true = truth[row["policy"]]
        for channel in CHANNELS:
            row[f"{channel}_truth"] = true[channel]
            if f"{channel}_se" in true:
                row[f"{channel}_truth_se"] = true[f"{channel}_se"]
            lo, hi = row[f"{channel}_lo"], row[f"{channel}_hi"]
            row[f"{channel}_covers"] = None if np.isnan(row[channel]) else bool(lo <= true[channel] <= hi)
    logging.info("OPE validation (%s logs): %d episodes in %.0fs", name, len(episodes), time.perf_counter() - started)
    return {"logs": name, **result, "seconds": time.perf_counter() - started}


def validate_routesim(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
    """Collects the corpus and trains the router where the workdir lacks them, collects the held-out logs, and
    checks every estimate against the truth on both; writes ope_validation.{md,json}."""
    started = time.perf_counter()
    workdir = Path(workdir)
    corpus = collected_corpus(config, workdir)
    router_dir = workdir / "train"
    train.train(training_config(config, corpus), router_dir)
    router = Router.from_checkpoint(router_dir)
    sim = make_routesim(config.sim)
    training = read_episodes(corpus_files(corpus)[0], sim.pool).episodes
    heldout = read_episodes(heldout_corpus(config, workdir, sim), sim.pool).episodes
    sets = [validate_logs(config, sim, router, training, f"training ({config.collect.split} tasks)"),
            validate_logs(config, sim, router, heldout, f"held-out ({config.ope.heldout_split} tasks)")]
    result = {"router": str(router_dir), "lambda": router.config.reward.lam, "gamma": router.config.reward.gamma,
              "c_ref": router.c_ref, "sets": sets, "seconds": time.perf_counter() - started}
    write_result(workdir, "ope_validation", result, validation_report(result))
    return result


# ------------------------------------------------------------------------------------------------------ output


def cell(row: dict, channel: str, digits: int) -> str:
    """`estimate [lo, hi] ok` (covers the truth) / `MISS`, or `undefined`."""
    if np.isnan(row[channel]):
        return "undefined"
    mark = "ok" if row[f"{channel}_covers"] else "MISS"
    return f"{row[channel]:.{digits}f} [{row[f'{channel}_lo']:.{digits}f}, {row[f'{channel}_hi']:.{digits}f}] {mark}"


def truth_cell(row: dict, channel: str, digits: int) -> str:
    se = row.get(f"{channel}_truth_se")
    return f"{row[f'{channel}_truth']:.{digits}f}" + (f" ± {se:.{digits}f}" if se is not None else "")


def coverage_summary(rows: list[dict]) -> str:
    """Per estimator: how many intervals cover the truth (of those defined), and the mean absolute error of J."""
    lines = ["| estimator | J covered | success covered | cost covered | mean abs. error of J |",
             "|---|---|---|---|---|"]
    for estimator in ope.ESTIMATORS:
        at = [r for r in rows if r["estimator"] == estimator]
        counts = []
        for channel in CHANNELS:
            defined = [r[f"{channel}_covers"] for r in at if r[f"{channel}_covers"] is not None]
            counts.append(f"{sum(defined)}/{len(defined)}")
        errors = [abs(r["return"] - r["return_truth"]) for r in at if not np.isnan(r["return"])]
        lines.append(f"| {estimator} | {' | '.join(counts)} | {np.mean(errors):.3f} |" if errors
                     else f"| {estimator} | {' | '.join(counts)} | |")
    return "\n".join(lines)


def validation_report(result: dict) -> str:
    lines = ["# Off-policy evaluation on RouteSim, against the truth", "",
             f"Router: {result['router']} (lambda {result['lambda']:g}, gamma {result['gamma']:g}, c_ref "
             f"{result['c_ref']:.6f}). Truth: exact (DP) for the fixed models, the random router and the oracle; "
             f"rollouts for RIVET (± its standard error). Each estimate: value [95% bootstrap interval] and ok when "
             f"the interval covers the truth, MISS when not. IS and WIS of a deterministic policy rest on the "
             f"supported episodes it follows (`followed`); with few, their interval is too narrow by construction.",
             ""]
    for logs in result["sets"]:
        rows = logs["rows"]
        lines += [f"## {logs['logs']}: {logs['episodes']} episodes", "", f"Support: {logs['support']}. FQE's ridge "
                  f"penalty (cross-validated, then / 10): {logs['ridge']:g}.", "",
                  coverage_summary(rows), "", "| policy | estimator | truth J | J [95%] | truth success | "
                  "success [95%] | truth cost $ | cost $ [95%] | followed |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['policy']} | {r['estimator']} | {truth_cell(r, 'return', 3)} | "
                         f"{cell(r, 'return', 3)} | {truth_cell(r, 'success', 3)} | {cell(r, 'success', 3)} | "
                         f"{truth_cell(r, 'cost', 5)} | {cell(r, 'cost', 5)} | {r.get('followed', '')} |")
        lines.append("")
    return "\n".join(lines)
