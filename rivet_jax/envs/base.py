"""The environment and policy protocols, and the one rollout loop every policy and environment share.

An environment owns the tasks and the candidate models' behaviour; a policy picks a model before every turn from
what a router may see: the task, the completed turns and the models available now. `run_episode` produces an
`Episode` in the project's trajectory schema, so rollouts, logged corpora and evaluations are the same records.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from rivet_jax.data.schema import Episode, ModelPool, Task, Turn


class EnvState(Protocol):
    task: Task
    history: tuple[Turn, ...]
    done: bool
    success: bool


class Env(Protocol):
    pool: ModelPool
    max_turns: int  # an episode's turns at most (online adaptation sizes its replay by it)

    def tasks(self, split: str) -> Sequence[Task]: ...

    def reset(self, task_id: str) -> EnvState: ...

    def step(self, state: EnvState, model: str, rng: np.random.Generator, propensity: float | None = None,
             available: Sequence[str] | None = None) -> EnvState:
        """One turn by `model`; `propensity` and `available` are recorded in the logged turn."""


class Policy(Protocol):
    name: str

    def act(self, task: Task, history: Sequence[Turn], available: Sequence[str],
            rng: np.random.Generator) -> tuple[str, float | None]:
        """The model to call next and the probability with which it was chosen (None if not known)."""


# One pending decision: what `Policy.act` reads. A policy may also define `act_batch(requests)` -> [(model,
# propensity)], deciding many at once (e.g. one batched network call); it must equal `act` on each request.
Request = tuple[Task, Sequence[Turn], Sequence[str], np.random.Generator]


def decide(policy: Policy, requests: Sequence[Request]) -> list[tuple[str, float | None]]:
    """`policy`'s choice for every request: one `act_batch` call where the policy has it, else `act` on each."""
    if hasattr(policy, "act_batch"):
        return list(policy.act_batch(requests))
    return [policy.act(*request) for request in requests]


class FixedModelPolicy:
    """Always the same model (deterministic: propensity 1); where it is not available, `fallback`'s choice (logs of
    many models rarely hold every model on every task), or without one an error."""

    def __init__(self, model: str, fallback: "Policy | None" = None):
        self.model, self.fallback = model, fallback
        self.name = f"fixed:{model}"

    def act(self, task, history, available, rng):
        if self.model in available:
            return self.model, 1.0
        if self.fallback is not None:
            return self.fallback.act(task, history, available, rng)
        raise ValueError(f"{self.name}: model {self.model!r} is not available ({list(available)})")


class RandomPolicy:
    """Uniform over the available models at every turn."""

    name = "random"

    def act(self, task, history, available, rng):
        return available[int(rng.integers(len(available)))], 1.0 / len(available)


class RouterPolicy:
    """A trained `Router` as a policy: argmax of Q_route over the available models."""

    def __init__(self, router, name: str = "rivet"):
        self.router = router
        self.name = name

    def act(self, task, history, available, rng):
        return self.router.route(task.prompt, history, available=list(available), family=task.family).model, 1.0

    def act_batch(self, requests: Sequence[Request]) -> list[tuple[str, float]]:
        """Every pending decision scored in one encoder pass and one network call."""
        q = self.router.scores([(task.prompt, history) for task, history, _, _ in requests],
                               [list(available) for _, _, available, _ in requests],
                               [task.family for task, _, _, _ in requests])               # (B, M)
        return [(self.router.pool.names[int(np.argmax(row))], 1.0) for row in q]


class GroupMember:
    """Run `run` of a `router.RouterGroup` as a policy, greedy on its Q_route. Its decisions are taken together
    with the other members' of the same group (`decide_each` calls `joint.decide_members` once per round)."""

    def __init__(self, group, run: int, name: str = "rivet"):
        self.joint, self.run, self.name = group, run, name

    def act(self, task, history, available, rng):
        return self.joint.decide_members([(self, [(task, history, available, rng)])])[0][0]

    def pick(self, greedy: str, available: Sequence[str], rng: np.random.Generator) -> tuple[str, float]:
        """The decision given the run's greedy choice (subclasses explore here, drawing from `rng`)."""
        return greedy, 1.0


def run_episode(env: Env, task_id: str, policy: Policy, rng: np.random.Generator, episode_id: str,
                available: Sequence[str] | None = None) -> Episode:
    """One episode of `policy` on `task_id`; `available` restricts the candidates (default: the whole pool)."""
    return run_episodes(env, [task_id], policy, [rng], [episode_id], available)[0]


def decide_each(policies: Sequence[Policy], requests: Sequence[Request]) -> list[tuple[str, float | None]]:
    """Request k decided by `policies[k]`: each policy's requests in one `decide` call, and the member policies of
    one joint decider (`policy.joint`, e.g. the runs of a `router.RouterGroup`) in one `joint.decide_members` call."""
    choices: list = [None] * len(requests)
    owners: dict[int, tuple[object, dict[int, tuple[Policy, list[int]]]]] = {}
    for k, policy in enumerate(policies):
        owner = getattr(policy, "joint", policy)
        owners.setdefault(id(owner), (owner, {}))[1].setdefault(id(policy), (policy, []))[1].append(k)
    for owner, members in owners.values():
        if hasattr(owner, "decide_members"):
            decided = owner.decide_members([(policy, [requests[k] for k in ks]) for policy, ks in members.values()])
        else:
            decided = [decide(policy, [requests[k] for k in ks]) for policy, ks in members.values()]
        for (_, ks), member_choices in zip(members.values(), decided):
            for k, choice in zip(ks, member_choices):
                choices[k] = choice
    return choices


def run_episodes(env: Env, task_ids: Sequence[str], policy: Policy | Sequence[Policy],
                 rngs: Sequence[np.random.Generator], episode_ids: Sequence[str],
                 available: Sequence[str] | None = None) -> list[Episode]:
    """Episodes stepped together, episode k on `task_ids[k]` with its own `rngs[k]`, of `policy` or (a sequence)
    of `policy[k]`.

    Every round, the pending decisions of all live episodes go to the policies at once (`decide_each`), then each
    live episode takes its turn. Each episode draws from its own generator in the order a lone episode would (the
    policy's draw, then the environment's), so the episodes equal one-at-a-time rollouts with the same generators.
    """
    policies = list(policy) if isinstance(policy, (list, tuple)) else [policy] * len(task_ids)
    restricted = available is not None and tuple(available) != env.pool.names
    available = tuple(available or env.pool.names)
    states = [env.reset(task_id) for task_id in task_ids]
    live = [k for k, state in enumerate(states) if not state.done]
    while live:
        choices = decide_each([policies[k] for k in live],
                              [(states[k].task, states[k].history, available, rngs[k]) for k in live])
        for k, (model, propensity) in zip(live, choices):
            states[k] = env.step(states[k], model, rngs[k], propensity=propensity,
                                 available=available if restricted else None)
        live = [k for k in live if not states[k].done]
    return [Episode(episode_id=episode_id, task=state.task, turns=state.history, outcome=int(state.success))
            for episode_id, state in zip(episode_ids, states)]
