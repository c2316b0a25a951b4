"""Variants of one config trained together, one directory per (variant, seed), as the product and the
experiments lay them out (`launch.calibrate`, `launch.reproduce`, `launch.mint`).

    <workdir>/runs/<slug(variant)>/seed_<s>/    one training run (its checkpoints, metrics.jsonl)
    <workdir>/embeddings/                        the frozen-encoder cache every run of the workdir shares
    <workdir>/corpus/                            RouteSim's logged corpus, collected once (`collected_corpus`)
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import ml_collections
from absl import logging

from rivet_jax import checkpointing, run_identity, train
from rivet_jax.encoders import cache_dir
from rivet_jax.envs import collect as collect_lib
from rivet_jax.envs.routesim import make_routesim
from rivet_jax.progress import Progress
from rivet_jax.settings import with_overrides

MAIN = "RIVET (ours)"  # the router's name in every table, figure and verdict


def member_seeds(seed: int, members: int) -> list[int]:
    """The training seeds of one ensemble: the seed's own run, then seed + 1000, seed + 2000, ... (distinct across
    an experiment's seeds while those are less than 1000 apart)."""
    return [seed + 1000 * m for m in range(members)]


def slug(name: str) -> str:
    """A variant's directory name: "w/o CQL" -> "no_cql", "zero response (beta=1)" -> "zero_response_beta1"."""
    return (name.lower().replace("w/o ", "no_").replace(" ", "_").replace("=", "").replace("(", "")
            .replace(")", ""))


def run_config(config: ml_collections.ConfigDict, episodes: Path, cards: Path, workdir: Path, seed: int,
               overrides: dict[str, Any], stage: str) -> ml_collections.ConfigDict:
    """The training config of one run: the logs, the experiment's shared embedding cache, seed, stage, overrides."""
    return with_overrides(config, {"data.episodes": str(episodes), "data.cards": str(cards),
                                   "data.embedding_cache": str(cache_dir(config, workdir)), "seed": seed,
                                   "stage": stage, **overrides})


def run_dir(workdir: Path, variant: str, seed: int) -> Path:
    return workdir / "runs" / slug(variant) / f"seed_{seed}"


def train_variants(config: ml_collections.ConfigDict, episodes: Path, cards: Path, workdir: Path,
                   variants: dict[str, tuple[dict[str, Any], str]], seeds: Sequence[int],
                   on_stage_end: Callable[[str], None] | None = None,
                   seeds_of: dict[str, Sequence[int]] | None = None) -> dict[str, list[Path]]:
    """Trains (or resumes) every variant (name -> (overrides, stage)) at every seed (`seeds_of[name]` where given),
    into <workdir>/runs/<slug>/seed_<s>/, as one run group (rivet_jax/train.py: the offline stages of all runs step
    together under vmap, then the online stages of runs alike in lockstep). Logs progress with an ETA; returns each
    variant's dirs, in the order of its seeds. `on_stage_end(stage)`: after each offline stage of every run
    (`train.train_group`)."""
    runs = [(name, seed) for name in variants for seed in (seeds_of or {}).get(name, seeds)]
    configs = [run_config(config, episodes, cards, workdir, seed, *variants[name]) for name, seed in runs]
    dirs = [run_dir(workdir, name, seed) for name, seed in runs]
    # (run dir, stage, its epochs): each run's own (a variant may override them)
    offline_stages = [(d, s, c.mc_epochs if s == "mc" else c.td_epochs)
                      for c, d in zip(configs, dirs) for s in train.stages_of(c) if s in ("mc", "td")]
    offline = Progress("offline training (run-epochs)", sum(epochs for _, _, epochs in offline_stages))
    offline.done = sum(min(checkpointing.StageCheckpoints(d, s).latest_epoch() or 0, epochs)
                       for d, s, epochs in offline_stages if checkpointing.stage_dir(d, s).is_dir())
    train.train_group(configs, dirs, on_epoch_end=lambda stage, epoch, records: offline.step(len(records)),
                      on_stage_end=on_stage_end)
    return {name: [d for (n, _), d in zip(runs, dirs) if n == name] for name in variants}


def check_same_config(path: Path, section: dict) -> None:
    """Refuses to mix outputs of different configurations in one workdir: `section` (JSON values) is written to
    `path` the first time and must equal it every later time; ConfigChangedError lists every difference."""
    if path.exists():
        changed = run_identity.differences(json.loads(path.read_text(encoding="utf-8")), section)
        if changed:
            raise checkpointing.ConfigChangedError(f"{path.parent} was made with another configuration ({path}: "
                                                   f"{'; '.join(changed)}): use a new workdir, or those settings")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(section, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def collected_corpus(config: ml_collections.ConfigDict, workdir: str | Path) -> Path:
    """RouteSim's logged corpus (`config.sim`, `config.collect`) in <workdir>/corpus/, collected the first time;
    returns the directory."""
    corpus = Path(workdir) / "corpus"
    check_same_config(corpus / "config.json", {"sim": config.sim.to_dict(), "collect": config.collect.to_dict()})
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


def corpus_files(corpus: Path) -> tuple[Path, Path]:
    """The episodes and model cards of a collected corpus directory."""
    return corpus / collect_lib.EPISODES_FILE, corpus / collect_lib.CARDS_FILE


def training_config(config: ml_collections.ConfigDict, corpus: Path) -> ml_collections.ConfigDict:
    """`config` with its data pointed at the collected corpus."""
    episodes, cards = corpus_files(corpus)
    return with_overrides(config, {"data.episodes": str(episodes), "data.cards": str(cards)})
