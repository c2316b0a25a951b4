"""The serving policy: which candidate to call first, with what probability, and in what order to fall back.

Greedy on Q_route (Eq. 5) among the candidates that are available now; with probability `epsilon` a uniformly
random candidate instead, so that logs recorded for retraining cover what the router would not choose. The chosen
model's propensity, (1 - epsilon) [it is the greedy choice] + epsilon / |candidates|, is recorded with the turn
for off-policy evaluation. A candidate that fails is followed by the best remaining one by Q_route; a turn served
by a fallback records no propensity, since no policy drew it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["Choice", "choose", "candidate_names"]


@dataclasses.dataclass(frozen=True)
class Choice:
    order: list[str]              # candidates to try, first the drawn one, then the rest best-first by Q_route
    propensity: float             # probability the policy drew order[0]
    scores: dict[str, float]      # Q_route of every candidate
    margin: float | None          # best minus runner-up Q_route (None: a single candidate)
    explored: bool                # order[0] came from the epsilon draw, not the argmax


def choose(scores: Mapping[str, float], epsilon: float, rng: np.random.Generator) -> Choice:
    """The order of `scores`' candidates to try (module docstring). Ties go to the earlier candidate."""
    if not scores:
        raise ValueError("no candidate to choose from")
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    names = list(scores)
    if any(not math.isfinite(scores[name]) for name in names):
        raise FloatingPointError(f"non-finite scores {dict(scores)}: the router cannot rank the candidates")
    ranked = sorted(names, key=lambda name: -scores[name])     # stable: equal scores keep the candidates' order
    greedy = ranked[0]
    drawn = names[int(rng.integers(len(names)))] if epsilon > 0 and rng.random() < epsilon else greedy
    propensity = (1.0 - epsilon) * (drawn == greedy) + epsilon / len(names)
    margin = scores[ranked[0]] - scores[ranked[1]] if len(ranked) > 1 else None
    return Choice(order=[drawn] + [name for name in ranked if name != drawn], propensity=propensity,
                  scores=dict(scores), margin=margin, explored=drawn != greedy)


def candidate_names(served: Sequence[str], down: set[str], requested: Sequence[str] | None) -> list[str]:
    """The candidates of one request, in pool order: the served models, minus those down, within `requested`."""
    return [name for name in served if name not in down and (requested is None or name in requested)]
