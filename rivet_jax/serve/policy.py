"""The serving policy: which candidate to call first, with what probability, and in what order to fall back.

Greedy on Q_route (Eq. 5) among the candidates that are available now, or, to learn from the traffic, a draw from
an exploring distribution over them (`Exploration`, `config.exploration`):

  epsilon   (1 - epsilon) on the greedy candidate, epsilon spread uniformly over all of them
  softmax   p(m) proportional to exp((Q(m) - max Q) / temperature): near-ties are tried often, clear losers rarely
  margin    epsilon spread uniformly over the candidates whose Q_route is within `margin` of the best (the greedy one
            included): never tries what the router is sure is worse; alone within the margin, greedy

The drawn model's exact probability (its propensity) is recorded with the turn for off-policy evaluation. What
exploring gives up, by the router's own values, is each decision's expected shortfall sum_m p(m) (max Q - Q(m)) in
the reward's units (Eq. 1); the proxy holds it under a budget per episode (`Budget`): once the shortfall spent
reaches `budget x episodes opened`, it serves greedily (propensity 1, recorded as such) until the episodes catch
up. A candidate that fails is followed by the best remaining one by Q_route; a turn served by a fallback records no
propensity, since no policy drew it.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["Choice", "Exploration", "Budget", "choose", "distribution", "candidate_names", "KINDS"]

KINDS = ("epsilon", "softmax", "margin")


@dataclasses.dataclass(frozen=True)
class Exploration:
    """How the proxy explores (module docstring). `epsilon` 0 with kind epsilon or margin: greedy."""

    kind: str = "epsilon"
    epsilon: float = 0.0        # epsilon, margin: the probability moved off the greedy candidate
    temperature: float = 0.05   # softmax, in the units of Q_route (the reward's)
    margin: float = 0.05        # margin: how far below the best a candidate may score and still be tried

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"exploration kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {self.epsilon}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be a number > 0, got {self.temperature}")
        if not (math.isfinite(self.margin) and self.margin >= 0):
            raise ValueError(f"margin must be a number >= 0, got {self.margin}")

    @classmethod
    def of(cls, config) -> "Exploration":
        """From a serve config (`exploration`, `epsilon`, `temperature`, `margin`)."""
        return cls(str(config.get("exploration", "epsilon")), float(config.epsilon),
                   float(config.get("temperature", 0.05)), float(config.get("margin", 0.05)))

    @property
    def greedy(self) -> bool:
        return self.kind != "softmax" and self.epsilon == 0.0

    def spec(self) -> dict:
        return dataclasses.asdict(self)


GREEDY = Exploration()


@dataclasses.dataclass(frozen=True)
class Choice:
    order: list[str]                  # candidates to try, first the drawn one, then the rest best-first by Q_route
    propensity: float                 # probability the policy drew order[0]
    scores: dict[str, float]          # Q_route of every candidate
    margin: float | None              # best minus runner-up Q_route (None: a single candidate)
    explored: bool                    # order[0] is not the argmax
    probabilities: dict[str, float]   # the distribution order[0] was drawn from (sums to 1)
    shortfall: float                  # sum_m p(m) (max Q - Q(m)): expected Q_route given up by exploring (>= 0)


def distribution(scores: Mapping[str, float], exploration: Exploration) -> dict[str, float]:
    """The probability of drawing each candidate (module docstring); ties for the best go to the earlier one."""
    if not scores:
        raise ValueError("no candidate to choose from")
    names = list(scores)
    q = np.array([scores[name] for name in names], np.float64)
    if not np.isfinite(q).all():
        raise FloatingPointError(f"non-finite scores {dict(scores)}: the router cannot rank the candidates")
    greedy = int(np.argmax(q))  # the first of equal maxima
    if exploration.kind == "softmax":
        p = np.exp((q - q.max()) / exploration.temperature)
        p /= p.sum()
    else:
        tried = np.ones(len(q), bool) if exploration.kind == "epsilon" else q >= q.max() - exploration.margin
        p = exploration.epsilon * tried / tried.sum()
        p[greedy] += 1.0 - exploration.epsilon
    return dict(zip(names, p.tolist()))


def choose(scores: Mapping[str, float], exploration: Exploration, rng: np.random.Generator) -> Choice:
    """The order of `scores`' candidates to try (module docstring). A greedy exploration draws nothing from `rng`."""
    probabilities = distribution(scores, exploration)
    names = list(scores)
    ranked = sorted(names, key=lambda name: -scores[name])     # stable: equal scores keep the candidates' order
    greedy = ranked[0]
    if exploration.greedy:
        drawn = greedy
    else:
        p = np.array([probabilities[name] for name in names])
        drawn = names[min(int(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right")), len(names) - 1)]
    best = scores[greedy]
    margin = scores[ranked[0]] - scores[ranked[1]] if len(ranked) > 1 else None
    return Choice(order=[drawn] + [name for name in ranked if name != drawn], propensity=probabilities[drawn],
                  scores=dict(scores), margin=margin, explored=drawn != greedy, probabilities=probabilities,
                  shortfall=float(sum(p * (best - scores[name]) for name, p in probabilities.items())))


class Budget:
    """The exploration the proxy may still spend: `per_episode` expected shortfall (module docstring) per episode
    opened (None: unlimited). Thread-safe; `report()` is what /healthz shows."""

    def __init__(self, exploration: Exploration, per_episode: float | None):
        if per_episode is not None and not (math.isfinite(per_episode) and per_episode >= 0):
            raise ValueError(f"the exploration budget must be a number >= 0 per episode, got {per_episode}")
        self.exploration, self.per_episode = exploration, per_episode
        self.episodes = self.decisions = self.explored = self.held = 0
        self.spent = 0.0
        self._lock = threading.Lock()

    def opened(self) -> None:
        with self._lock:
            self.episodes += 1

    def choose(self, scores: Mapping[str, float], rng: np.random.Generator) -> Choice:
        """`choose` with the proxy's exploration while the budget lasts, greedily once it is spent."""
        with self._lock:
            allowed = self.per_episode is None or self.spent < self.per_episode * max(self.episodes, 1)
            choice = choose(scores, self.exploration if allowed else GREEDY, rng)
            self.decisions += 1
            self.explored += choice.explored
            self.held += not allowed and not self.exploration.greedy
            self.spent += choice.shortfall
            return choice

    def report(self) -> dict:
        with self._lock:
            return {**self.exploration.spec(), "budget_per_episode": self.per_episode, "episodes": self.episodes,
                    "decisions": self.decisions, "explored": self.explored, "greedy_for_budget": self.held,
                    "expected_shortfall": self.spent,
                    "expected_shortfall_per_episode": self.spent / self.episodes if self.episodes else 0.0}


def candidate_names(served: Sequence[str], down: set[str], requested: Sequence[str] | None) -> list[str]:
    """The candidates of one request, in pool order: the served models, minus those down, within `requested`."""
    return [name for name in served if name not in down and (requested is None or name in requested)]
