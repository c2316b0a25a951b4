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


class FixedModelPolicy:
    """Always the same model (deterministic: propensity 1)."""

    def __init__(self, model: str):
        self.model = model
        self.name = f"fixed:{model}"

    def act(self, task, history, available, rng):
        if self.model not in available:
            raise ValueError(f"{self.name}: model {self.model!r} is not available ({list(available)})")
        return self.model, 1.0


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
        return self.router.route(task.prompt, history, available=list(available)).model, 1.0


def run_episode(env: Env, task_id: str, policy: Policy, rng: np.random.Generator, episode_id: str,
                available: Sequence[str] | None = None) -> Episode:
    """One episode of `policy` on `task_id`; `available` restricts the candidates (default: the whole pool)."""
    restricted = available is not None and tuple(available) != env.pool.names
    available = tuple(available or env.pool.names)
    state = env.reset(task_id)
    while not state.done:
        model, propensity = policy.act(state.task, state.history, available, rng)
        state = env.step(state, model, rng, propensity=propensity, available=available if restricted else None)
    return Episode(episode_id=episode_id, task=state.task, turns=state.history, outcome=int(state.success))
