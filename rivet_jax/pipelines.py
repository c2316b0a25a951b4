"""End-to-end jobs on RouteSim, each resumable inside one workdir:

  <workdir>/corpus/   the logged corpus (collect)
  <workdir>/train/    RIVET's offline stages on it (train.train, with checkpoints)
  <workdir>/evaluation.{md,json}   the router against the exact oracle, fixed models and the random router

Each step is skipped when its output is already there for the same configuration, so a killed job resumes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import ml_collections
from absl import logging

from rivet_jax import evaluation, train
from rivet_jax.envs import collect as collect_lib
from rivet_jax.envs import oracle
from rivet_jax.envs.base import RouterPolicy
from rivet_jax.envs.routesim import make_routesim
from rivet_jax.router import Router


def _check_same_config(path: Path, section: dict) -> None:
    """Refuses to mix outputs of different configurations in one workdir."""
    if path.exists():
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved != section:
            raise ValueError(f"{path.parent} was made with another configuration ({path}); use a new workdir")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(section, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def collect(config: ml_collections.ConfigDict, workdir: str | Path) -> Path:
    """Writes (or finds) the logged corpus; returns its directory."""
    corpus = Path(workdir) / "corpus"
    _check_same_config(corpus / "config.json", {"sim": config.sim.to_dict(), "collect": config.collect.to_dict()})
    if (corpus / collect_lib.EPISODES_FILE).exists():
        logging.info("Corpus already in %s", corpus)
        return corpus
    sim = make_routesim(config.sim)
    started = time.perf_counter()
    episodes = collect_lib.collect_corpus(sim, config.collect.split, config.collect.seed)
    collect_lib.write_corpus(corpus, sim, episodes)
    logging.info("Collected %d episodes (%d transitions) in %.2fs into %s", len(episodes),
                 sum(len(e.turns) for e in episodes), time.perf_counter() - started, corpus)
    return corpus


def with_overrides(config: ml_collections.ConfigDict, overrides: dict) -> ml_collections.ConfigDict:
    """A copy of `config` with dotted keys set: {"loss.beta": 0.0, "reward.lam": 0.1}."""
    config = ml_collections.ConfigDict(config.to_dict())
    for dotted, value in overrides.items():
        *path, leaf = dotted.split(".")
        node = config
        for part in path:
            node = node[part]
        node[leaf] = value
    return config


def training_config(config: ml_collections.ConfigDict, corpus: Path) -> ml_collections.ConfigDict:
    """`config` with its data pointed at the collected corpus."""
    config = ml_collections.ConfigDict(config.to_dict())
    config.data.episodes = str(corpus / collect_lib.EPISODES_FILE)
    config.data.cards = str(corpus / collect_lib.CARDS_FILE)
    return config


def evaluate(config: ml_collections.ConfigDict, workdir: str | Path, router_dir: str | Path) -> dict:
    """The trained router (rollouts) against the oracle, the fixed models and the random router (exact)."""
    sim = make_routesim(config.sim)
    router = Router.from_checkpoint(router_dir)
    lam, gamma, c_ref = router.config.reward.lam, router.config.reward.gamma, router.c_ref
    split = config.evaluate.split
    started = time.perf_counter()
    exact = oracle.policy_report(sim, split, lam, gamma, c_ref)
    episodes = evaluation.rollout(sim, RouterPolicy(router), split, config.evaluate.rollouts_per_task,
                                  config.evaluate.seed)
    learned = evaluation.episode_metrics(episodes, lam, gamma, c_ref, config.evaluate.rollouts_per_task)
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
    """Collect -> train (MC then TD) -> evaluate against the oracle."""
    corpus = collect(config, workdir)
    router_dir = Path(workdir) / "train"
    train.train(training_config(config, corpus), router_dir)
    return evaluate(config, workdir, router_dir)
