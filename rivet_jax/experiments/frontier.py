"""Budget frontiers: what a family of routers buys at every cost, against the fixed models (issue 43).

A family is one lambda-conditioned router read at many lambdas, or one router trained per lambda; its members trace
points (cost per episode, success). Drawing one of two members per episode reaches every point of the segment
between them, and a router can always be run at a lower budget than it is given, so the success a budget c buys,
S(c), is the upper concave envelope of the members' points, flat beyond the most expensive; the cheapest fixed model
is always a member (any router can fall back on it).

RouteLLM (Ong et al. 2024) summarises a strong/weak router's curve by APGR, the average over budgets of the
performance gap recovered. Generalised to M models, with `cheap` the cheapest fixed model and `best` the most
accurate one:

    PGR(c) = (S(c) - success_cheap) / (success_best - success_cheap)
    APGR   = mean of PGR(c) over budgets c in [cost_cheap, cost_best]     (exact: S is piecewise linear)
    cost to p = the least budget with PGR(c) >= p (RouteLLM's call-performance threshold, in dollars), for p = 50%
                and 80%: the cost of reaching that share of the best model's gain over the cheapest

PGR above 1 means more success than the best model at that budget (routers can beat every fixed model).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

PGR_LEVELS = (0.5, 0.8)  # the gap shares whose cost is reported


def envelope(points: Sequence[tuple[float, float]]) -> np.ndarray:
    """(K, 2) the upper concave envelope of (cost, success) points, cheapest first, success increasing: the points a
    mix of members reaches, dominated ones (more cost, no more success) dropped."""
    pts = sorted({(float(c), float(s)) for c, s in points}, key=lambda p: (p[0], -p[1]))
    hull: list[tuple[float, float]] = []
    for cost, success in pts:
        if hull and success <= hull[-1][1]:
            continue  # no more success for more cost: never on the frontier
        # drop the last vertex while it lies on or below the segment from the one before it to this point
        while len(hull) >= 2 and _cross(hull[-2], hull[-1], (cost, success)) >= 0:
            hull.pop()
        hull.append((cost, success))
    return np.array(hull, np.float64)


def _cross(o: tuple, a: tuple, b: tuple) -> float:  # > 0: o -> a -> b turns left (a lies below the chord o -> b)
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def success_at(hull: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """S(c) at each budget (B,): the envelope's success, flat beyond its most expensive point, nan below its
    cheapest (a budget no member meets)."""
    return np.interp(budget, hull[:, 0], hull[:, 1], left=np.nan, right=hull[-1, 1])


def summary(points: Sequence[tuple[float, float]], cheap: tuple[float, float], best: tuple[float, float]) -> dict:
    """APGR and the cost to each of PGR_LEVELS of a family's (cost, success) points, given the cheapest and the most
    accurate fixed models' (cost, success); nan where the gap is empty or a level is never reached."""
    hull = envelope([*points, cheap])
    (cost_cheap, success_cheap), (cost_best, success_best) = cheap, best
    out = {"apgr": float("nan"), **{cost_key(p): float("nan") for p in PGR_LEVELS}}
    gap = success_best - success_cheap
    if gap <= 0:
        return out
    if cost_best > cost_cheap:
        # the envelope is linear between its vertices: the trapezoid rule on them and the two ends is exact
        budgets = np.unique(np.clip(np.concatenate([[cost_cheap, cost_best], hull[:, 0]]), cost_cheap, cost_best))
        pgr = (success_at(hull, budgets) - success_cheap) / gap
        out["apgr"] = float(np.trapezoid(pgr, budgets) / (cost_best - cost_cheap))
    for level in PGR_LEVELS:
        out[cost_key(level)] = cost_to_reach(hull, success_cheap + level * gap)
    return out


def cost_to_reach(hull: np.ndarray, success: float) -> float:
    """The least budget at which the envelope reaches `success` (nan: it never does)."""
    if success <= hull[0, 1]:
        return float(hull[0, 0])
    above = np.flatnonzero(hull[:, 1] >= success)
    if not len(above):
        return float("nan")
    (c0, s0), (c1, s1) = hull[above[0] - 1], hull[above[0]]
    return float(c0 + (success - s0) / (s1 - s0) * (c1 - c0))


def cost_key(level: float) -> str:
    return f"cost_to_pgr_{round(100 * level)}"
