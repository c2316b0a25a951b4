"""The logged corpus (App. B.1): six fixed-model policies and a random router, each on every training task.

Deterministic: episode i of policy j draws from `default_rng([seed, j, i])`, so the same seed gives byte-identical
files. The corpus is written in the project's trajectory schema with the pool's model cards beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rivet_jax.data.schema import Episode, write_episodes, write_model_cards
from rivet_jax.envs.base import Env, FixedModelPolicy, Policy, RandomPolicy, run_episode
from rivet_jax.envs.routesim import make_routesim
from rivet_jax.envs.routesim_config import sim_config

EPISODES_FILE = "episodes.jsonl"
CARDS_FILE = "model_cards.json"


def behaviour_policies(env: Env) -> list[Policy]:
    return [FixedModelPolicy(name) for name in env.pool.names] + [RandomPolicy()]


def collect_corpus(env: Env, split: str, seed: int, num_tasks: int | None = None) -> list[Episode]:
    """Every behaviour policy on the tasks of `split`, or on `num_tasks` of them spread evenly over its manifest
    (which lists the task families one after another, so a small corpus still holds every family)."""
    episodes = []
    tasks = env.tasks(split)
    if num_tasks is not None and num_tasks < len(tasks):
        tasks = [tasks[i] for i in np.linspace(0, len(tasks) - 1, num_tasks).round().astype(int)]
    for j, policy in enumerate(behaviour_policies(env)):
        for i, task in enumerate(tasks):
            episodes.append(run_episode(env, task.id, policy, np.random.default_rng([seed, j, i]),
                                        episode_id=f"{policy.name}/{task.id}"))
    return episodes


def summarize(episodes: list[Episode]) -> dict[str, dict[str, float]]:
    """Per logged policy (the episode id's prefix): episodes, accuracy, mean cost, mean turns."""
    groups: dict[str, list[Episode]] = {}
    for episode in episodes:
        groups.setdefault(episode.episode_id.split("/")[0], []).append(episode)
    return {name: {"episodes": len(group),
                   "accuracy": float(np.mean([e.outcome for e in group])),
                   "mean_cost": float(np.mean([sum(t.cost for t in e.turns) for e in group])),
                   "mean_turns": float(np.mean([len(e.turns) for e in group]))}
            for name, group in groups.items()}


def format_summary(summary: dict[str, dict[str, float]]) -> str:
    lines = ["| policy | episodes | accuracy | mean cost ($) | mean turns |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {row['episodes']} | {row['accuracy']:.3f} | {row['mean_cost']:.5f} | "
              f"{row['mean_turns']:.2f} |" for name, row in summary.items()]
    return "\n".join(lines)


def write_corpus(directory: str | Path, env: Env, episodes: list[Episode]) -> dict:
    """episodes.jsonl, model_cards.json, summary.md and summary.json under `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_episodes(directory / EPISODES_FILE, episodes)
    write_model_cards(directory / CARDS_FILE, env.pool)
    summary = summarize(episodes)
    (directory / "summary.md").write_text(format_summary(summary) + "\n", encoding="utf-8")
    (directory / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def demo_corpus(num_tasks: int, seed: int = 0) -> tuple[Env, list[Episode]]:
    """A small logged corpus from RouteSim: every behaviour policy on the first `num_tasks` training tasks.

    The data a fresh machine trains on when asked for a demo (`config.data.demo`), and the tests' corpus: the same
    simulator as the benchmark, so it has an exact oracle.
    """
    sim = make_routesim(sim_config())
    return sim, collect_corpus(sim, "train", seed, num_tasks)


def write_demo_corpus(directory: str | Path, num_tasks: int, seed: int = 0) -> dict:
    """`demo_corpus` written as a corpus directory (episodes.jsonl, model_cards.json, summaries)."""
    sim, episodes = demo_corpus(num_tasks, seed)
    return write_corpus(directory, sim, episodes)
