"""Evaluation: roll any policy over a manifest, and compare it with RouteSim's exact oracle.

Metrics per policy: accuracy (the mean outcome: the success rate of 0/1 outcomes), total cost in dollars over the
manifest (the paper's Cost column before normalisation), mean discounted return J (Eq. 2 at the given lambda and
c_ref), mean turns, and the switch rate (share of episodes that call more than one model). On RouteSim the oracle,
fixed models and the random router are computed exactly; a learned router is rolled out (`rollouts` episodes per
task, deterministic given the seed).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode
from rivet_jax.envs.base import Env, Policy, run_episodes


def discounted_return(episode: Episode, reward: Reward) -> float:
    """G_1 of one episode (Eqs. 1-2)."""
    lam, gamma, c_ref = reward
    rewards = [-lam * t.cost / c_ref for t in episode.turns]
    rewards[-1] += episode.outcome
    return float(sum(gamma**i * r for i, r in enumerate(rewards)))


def rollout(env: Env, policy: Policy, split: str, rollouts: int, seed: int,
            available: Sequence[str] | None = None) -> list[Episode]:
    """`rollouts` episodes of `policy` on every task of `split`; episode r of task i draws from rng([seed, r, i]).

    All of them are stepped together (`run_episodes`): a policy with `act_batch` decides every live episode's turn
    in one call."""
    return rollout_each(env, [policy], split, rollouts, seed, available)[0]


def rollout_each(env: Env, policies: Sequence[Policy], split: str, rollouts: int, seed: int,
                 available: Sequence[str] | None = None) -> list[list[Episode]]:
    """`rollout` of every policy, all episodes stepped together (the runs of a `RouterGroup` score in one call);
    each policy's episodes equal its own `rollout`'s."""
    runs = [(r, i, task) for r in range(rollouts) for i, task in enumerate(env.tasks(split))]
    episodes = run_episodes(env, [task.id for _ in policies for _, _, task in runs],
                            [policy for policy in policies for _ in runs],
                            [np.random.default_rng([seed, r, i]) for _ in policies for r, i, _ in runs],
                            [f"{policy.name}/{task.id}/{r}" for policy in policies for r, _, task in runs],
                            available=available)
    return [episodes[p * len(runs):(p + 1) * len(runs)] for p in range(len(policies))]


def episode_metrics(episodes: Sequence[Episode], reward: Reward, rollouts: int = 1) -> dict:
    """Accuracy, total cost per pass over the manifest, mean return, mean turns and switch rate; where the turns
    record a prompt cache's reads, also the share of prompt tokens it billed as cached."""
    metrics = {"accuracy": float(np.mean([e.outcome for e in episodes])),
               "cost": float(sum(t.cost for e in episodes for t in e.turns) / rollouts),
               "return": float(np.mean([discounted_return(e, reward) for e in episodes])),
               "turns": float(np.mean([len(e.turns) for e in episodes])),
               "switch_rate": float(np.mean([len({t.model for t in e.turns}) > 1 for e in episodes]))}
    turns = [t for e in episodes for t in e.turns]
    if any(t.cached_tokens is not None for t in turns):
        metrics["cached_share"] = (sum(t.cached_tokens or 0 for t in turns)
                                   / max(sum(t.prompt_tokens for t in turns), 1))
    return metrics


def compare_with_oracle(rows: dict[str, dict], oracle_row: dict, reference: str) -> dict[str, dict]:
    """Adds regret (oracle return - return), accuracy gap to the oracle and cost relative to `reference`."""
    out = {}
    for name, row in rows.items():
        out[name] = {**row, "regret": oracle_row["return"] - row["return"],
                     "accuracy_gap": oracle_row["accuracy"] - row["accuracy"],
                     "relative_cost": row["cost"] / rows[reference]["cost"]}
    return out


def format_table(rows: dict[str, dict], title: str) -> str:
    lines = [f"### {title}", "",
             "| policy | accuracy | cost ($) | cost vs ref | return J | regret | turns | switch rate |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['accuracy']:.3f} | {r['cost']:.4f} | {r['relative_cost']:.3f} | "
                     f"{r['return']:.4f} | {r['regret']:.4f} | {r['turns']:.2f} | {r['switch_rate']:.2f} |")
    return "\n".join(lines)
