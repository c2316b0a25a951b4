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

from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from rivet_jax import plots
from rivet_jax.experiments import report

PGR_LEVELS = (0.5, 0.8)  # the gap shares whose cost is reported
CONDITIONED = "RIVET, one lambda-conditioned run"  # read at each lambda of the sweep (`Router.at_lambda`)
PER_LAMBDA = "RIVET, one run per lambda"           # trained at each lambda with the same config and seeds


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


# ------------------------------------------------------------------------------------- the main job's rows


def lambda_conditioned(sweep: Sequence[dict]) -> list[dict]:
    """`experiments.lambda_conditioned`: per lambda of the sweep's rows, the conditioned run's test regret beside
    the per-lambda runs' (mean and sd over seeds) and the difference of the means."""
    rows = []
    for lam in sorted({r["lambda"] for r in sweep}):
        at = {r["router"]: r for r in sweep if r["lambda"] == lam}
        ours, theirs = at[CONDITIONED], at[PER_LAMBDA]
        rows.append({"lambda": lam, "conditioned_regret": ours["regret"], "conditioned_regret_sd": ours["return_sd"],
                     "per_lambda_regret": theirs["regret"], "per_lambda_regret_sd": theirs["return_sd"],
                     "difference": ours["regret"] - theirs["regret"],
                     "conditioned_accuracy": ours["accuracy"], "per_lambda_accuracy": theirs["accuracy"],
                     "conditioned_cost_usd": ours["cost_usd"], "per_lambda_cost_usd": theirs["cost_usd"]})
    return rows


def budget_rows(points: Sequence[dict]) -> list[dict]:
    """`experiments.budget_frontier`: the (cost, accuracy) points of one split (`fixed:` models among them) followed
    by one summary row per family (the rows of CONDITIONED, PER_LAMBDA and the oracle frontier): its APGR and its
    cost to 50% and 80% of the gap between the cheapest and the most accurate fixed model."""
    fixed = [r for r in points if r["router"].startswith("fixed:")]
    cheap = min(fixed, key=lambda r: (r["cost_usd"], -r["accuracy"]))
    best = max(fixed, key=lambda r: (r["accuracy"], -r["cost_usd"]))
    ends = ((cheap["cost_usd"], cheap["accuracy"]), (best["cost_usd"], best["accuracy"]))
    summaries = []
    for family in (CONDITIONED, PER_LAMBDA, report.FRONTIER):
        members = [(r["cost_usd"], r["accuracy"]) for r in points if r["router"] == family]
        if members:
            summaries.append({"router": family, "summary": True, "points": len(members), "cheapest": cheap["router"],
                              "best": best["router"], **summary(members, *ends)})
    return [*points, *summaries]


def summary_table(rows: list[dict]) -> str:
    """The budget frontier's table: one line per family."""
    return report.markdown_table([r for r in rows if r.get("summary")], [
        ("router", "router family", -1), ("points", "points", -1), ("apgr", "APGR", 3),
        *((cost_key(p), f"cost to {round(100 * p)}% of the gap ($)", 3) for p in PGR_LEVELS)])


def plot(rows: list[dict], path: Path, colours: dict | None = None) -> Figure:
    """Accuracy against cost: each family's envelope (line) through its points, every other router a point; each
    family's APGR above."""
    points = [r for r in rows if not r.get("summary")]
    apgr = {r["router"]: r["apgr"] for r in rows if r.get("summary")}
    colours = report.completed_palette(points, colours)
    fig = Figure(figsize=(10, 5))
    ax = fig.subplots()
    for family in apgr:
        members = [(r["cost_usd"], r["accuracy"]) for r in points if r["router"] == family]
        hull = envelope(members)
        ax.plot(hull[:, 0], hull[:, 1], "-" if family != report.FRONTIER else "--", color=colours[family],
                linewidth=1.2, label=family, zorder=1)
        if family != report.FRONTIER:
            ax.scatter(*zip(*members), color=colours[family], marker=report.router_marker(family), s=30, zorder=3)
    for r in points:
        if r["router"] not in apgr:
            ax.scatter(r["cost_usd"], r["accuracy"], color=colours[r["router"]], marker=report.router_marker(r["router"]),
                       edgecolor="black", linewidth=0.5, s=50, label=r["router"], zorder=2)
    ax.set_title("APGR: " + ", ".join(f"{family} {value:.2f}" for family, value in apgr.items()), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("cost ($ per pass over the test manifest, log scale)")
    ax.set_ylabel("test accuracy")
    fig.legend(*ax.get_legend_handles_labels(), fontsize=7, loc="center right")
    fig.suptitle("Budget frontier on test: the two RIVET families over lambda, the fixed models and the baselines")
    return plots.save_figure(fig, path, rect=(0, 0, 0.68, 1))


def plot_regret(rows: list[dict], path: Path, colours: dict | None = None) -> Figure:
    """Test regret against lambda: the conditioned run and the per-lambda runs, ± sd over seeds."""
    colours = report.completed_palette([{"router": CONDITIONED}, {"router": PER_LAMBDA}], colours)
    fig = Figure(figsize=(6, 3.8))
    ax = fig.subplots()
    lams = [r["lambda"] for r in rows]
    for family, key in ((CONDITIONED, "conditioned_regret"), (PER_LAMBDA, "per_lambda_regret")):
        ax.errorbar(lams, [r[key] for r in rows], yerr=[r[f"{key}_sd"] for r in rows], fmt="o-",
                    color=colours[family], capsize=3, label=family)
    ax.set_xscale("symlog", linthresh=0.01)
    ax.set_xticks(lams, [f"{lam:g}" for lam in lams])
    ax.set_xlabel("lambda (cost coefficient)")
    ax.set_ylabel("test regret (oracle J - J)")
    ax.legend(fontsize=8)
    fig.suptitle("One lambda-conditioned run against one run per lambda (error bars: sd over seeds)")
    return plots.save_figure(fig, path)
