"""What a switch really costs (issue 44): RIVET on RouteSim with a prompt cache (`configs/routesim.py:cache`).

The main job collects the same logging policies' corpus on the caching simulator, where a model called twice in a
row reads its previous prompt from its cache at its cached-input price, trains two RIVET routers on it with the
main runs' conservatism setting and seeds, one cache-aware (`model.cache_aware`: each candidate's known saving
added to Q_route) and one cache-blind (today's), fits the baselines on it, and compares them all billed with the
cached prices: exact regret against the caching oracle, cost, switch rate and the share of prompt tokens billed as
cached. Offline TD routers, one run per seed (the cache-aware router has no online stage yet).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import ml_collections
import numpy as np
from matplotlib.figure import Figure

from rivet_jax import plots
from rivet_jax.data.schema import Episode, read_episodes, read_model_cards
from rivet_jax.envs import oracle
from rivet_jax.envs.base import Policy, RouterPolicy
from rivet_jax.envs.routesim_config import prompt_cache
from rivet_jax.experiments.evaluator import Evaluator, row, seed_row
from rivet_jax.experiments.report import bars, completed_palette
from rivet_jax.router import Router
from rivet_jax.runs import collected_corpus, corpus_files, train_variants

CACHE_AWARE, CACHE_BLIND = "cache_aware", "cache_blind"
SUBDIR = "prompt_cache"   # the caching corpus and its runs, under the main job's workdir


def cache_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` on the caching simulator (what `configs/routesim.py:cache` sets)."""
    cached = config.copy_and_resolve_references()
    with cached.unlocked():   # a launcher's config is locked: the key is new there
        cached.sim.prompt_cache = prompt_cache()
    return cached


def collect(config: ml_collections.ConfigDict, workdir: str | Path) -> list[Episode]:
    """The caching corpus in <workdir>/prompt_cache/corpus, collected the first time; returns its episodes."""
    episodes_path, cards_path = corpus_files(collected_corpus(cache_config(config), Path(workdir) / SUBDIR))
    return read_episodes(episodes_path, read_model_cards(cards_path)).episodes


def train_routers(config: ml_collections.ConfigDict, workdir: str | Path, overrides: dict, seeds: Sequence[int]
                  ) -> dict[str, list[Path]]:
    """A cache-aware and a cache-blind run per seed (offline stages, `overrides` the main runs' setting) on the
    caching corpus (`collect`), under <workdir>/prompt_cache/; returns their run directories."""
    cached, root = cache_config(config), Path(workdir) / SUBDIR
    episodes_path, cards_path = corpus_files(collected_corpus(cached, root))
    return train_variants(cached, episodes_path, cards_path, root,
                          {CACHE_AWARE: ({**overrides, "model.cache_aware": True}, "offline"),
                           CACHE_BLIND: ({**overrides, "model.cache_aware": False}, "offline")}, seeds)


def rows(ev: Evaluator, baselines: dict[str, Policy], aware: Sequence[Router], blind: Sequence[Router],
         lam: float) -> list[dict]:
    """The test split's rows: the caching oracle, the fixed models and the random router (exact), the baselines and
    both RIVET routers (rolled out; mean over seeds), each with regret, cost, switch rate and cached share."""
    split = ev.config.evaluate.split
    exact = ev.exact(split, lam)
    reference = exact[oracle.most_accurate_fixed(exact, ev.sim.pool.names)]["cost"]
    top = exact["oracle"]["return"]

    def with_cache(r: dict, cached_share: float) -> dict:   # `cost`: dollars per pass over the split, as cost_usd
        return {**r, "cost": r["cost_usd"], "cached_share": cached_share}

    out = [with_cache(row(name, split, exact[policy], top, reference), exact[policy]["cached_share"])
           for name, policy in (("oracle", "oracle"), *((f"fixed:{n}", n) for n in ev.sim.pool.names),
                                ("random", "random"))]
    for name, policy in baselines.items():
        metrics = ev.rollouts(policy, split, lam)
        out.append(with_cache(row(name, split, metrics, top, reference), metrics["cached_share"]))
    for name, routers in ((CACHE_BLIND, blind), (CACHE_AWARE, aware)):
        per_seed = [ev.rollouts(RouterPolicy(r), split, lam) for r in routers]
        out.append(with_cache(seed_row(name, split, per_seed, top, reference),
                              float(np.mean([m["cached_share"] for m in per_seed]))))
    return out


def plot(rows: list[dict], path: Path, colours: dict | None = None) -> Figure:
    """Regret and the share of prompt tokens billed as cached, per router (the fixed models left out)."""
    shown = [r for r in rows if not r["router"].startswith("fixed:")]
    colours = completed_palette(shown, colours)
    fig = Figure(figsize=(10, 3.8))
    for ax, key, label in zip(fig.subplots(1, 2), ("regret", "cached_share"),
                              ("test regret (J)", "prompt tokens billed as cached")):
        bars(ax, shown, key, colours)
        ax.set_ylabel(label)
    fig.suptitle("RouteSim with a prompt cache: cache-aware against cache-blind RIVET and the baselines")
    return plots.save_figure(fig, path)
