"""What a set of logs can teach a router, measured before training (`rivet_jax.fit` prints and saves it).

A router learns "which model, at which state" from differences between logged choices. Three numbers bound that:

  single_model_share    episodes in which one model answered every turn. Logs of an A/B test are all such: they
                        show what committing to a model gives on a task, never what switching mid-episode gives,
                        so a router trained on them can choose a model per task but its later turns are guesses.
  stochastic_share      decisions whose logged propensity is below 1 (the logger drew among several models). Only
                        those show the alternatives at the same state; CQL (Eq. 10) at a deterministic logged
                        choice pushes toward "call whoever wrote the history" (docs/own-logs.md).
  tasks_per_model       on how many distinct tasks each model was logged: a model seen on few tasks is a guess
                        elsewhere; tasks with every model logged allow exact committed evaluation.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Sequence

from rivet_jax.data.schema import Episode, ModelPool


@dataclasses.dataclass(frozen=True)
class LogsProfile:
    episodes: int
    tasks: int
    decisions: int
    single_model_share: float          # episodes with one model throughout
    stochastic_share: float            # decisions with a logged propensity < 1
    tasks_per_model: dict[str, int]    # distinct tasks each pool model answered a turn of
    complete_task_share: float         # tasks with a one-model episode of every pool model

    @property
    def ab_logs(self) -> bool:
        """Every episode by one model and no logged draw: what the logs support is a choice per task."""
        return self.single_model_share == 1.0 and self.stochastic_share == 0.0

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "ab_logs": self.ab_logs}

    def lines(self) -> list[str]:
        """The profile in plain words, with what follows from it."""
        pct = lambda x: f"{100 * x:.0f}%"  # noqa: E731
        seen = ", ".join(f"{m} {n}" for m, n in self.tasks_per_model.items())
        out = [f"{self.episodes} episodes on {self.tasks} tasks, {self.decisions} routing decisions",
               f"one model throughout: {pct(self.single_model_share)} of episodes; logged draws (propensity < 1): "
               f"{pct(self.stochastic_share)} of decisions",
               f"tasks per model: {seen}; tasks with every model logged: {pct(self.complete_task_share)}"]
        if self.ab_logs:
            out.append("A/B logs: they show what committing to one model per task gives, not what switching "
                       "mid-episode gives; the deployed router chooses a model per task and keeps it, and CQL "
                       "(which would teach 'call whoever wrote the history') is only used where validation "
                       "prefers it")
        elif self.stochastic_share == 0.0:
            out.append("no logged draws: CQL at deterministic logged choices pushes toward the model that wrote "
                       "the history; it is only used where validation prefers it")
        rare = [m for m, n in self.tasks_per_model.items() if n < max(1, self.tasks // 20)]
        if rare:
            out.append(f"rarely or never logged (under 5% of tasks): {', '.join(rare)}: the router's values for "
                       f"them are guesses")
        return out


def profile_logs(episodes: Sequence[Episode], pool: ModelPool) -> LogsProfile:
    if not episodes:
        raise ValueError("no episodes to profile")
    tasks_of: dict[str, set[str]] = defaultdict(set)
    single_by_task: dict[str, set[str]] = defaultdict(set)
    single = stochastic = decisions = 0
    for episode in episodes:
        models = {turn.model for turn in episode.turns}
        for model in models:
            tasks_of[model].add(episode.task.id)
        if len(models) == 1:
            single += 1
            single_by_task[episode.task.id] |= models
        decisions += len(episode.turns)
        stochastic += sum(turn.propensity is not None and turn.propensity < 1.0 for turn in episode.turns)
    tasks = {e.task.id for e in episodes}
    complete = sum(set(pool.names) <= single_by_task[task] for task in tasks)
    return LogsProfile(episodes=len(episodes), tasks=len(tasks), decisions=decisions,
                       single_model_share=single / len(episodes), stochastic_share=stochastic / decisions,
                       tasks_per_model={m: len(tasks_of[m]) for m in pool.names},
                       complete_task_share=complete / len(tasks))
