"""Choosing the CQL weight on the validation split, as the paper chooses its hyperparameters
(`config.select`, used by `launch.reproduce`).

Every alpha of the grid trains through all stages at every seed; each run's router (its best-validation online
checkpoint) is rolled out `select.rollouts` times per validation task, and the alpha with the highest mean
validation return J over the seeds becomes RIVET (ours): its ablations and lambda sweep train at that alpha. The
test manifest is never read. The grid always holds alpha = 0 (the "w/o CQL" ablation, so it is trained once) and
the configured `loss.alpha` (the paper's setting, reported beside the choice); `select.enabled = False` keeps the
configured alpha without looking at validation (the paper's fixed settings).

How many rollouts: one rollout of the 35 validation tasks has a J standard deviation of about 0.06, and the
difference of two routers rolled out with the same seeds about as much (their episodes diverge after the first
different choice). With 16 rollouts per task and 3 seeds an alpha's mean J has a standard error of about
0.06 / sqrt(48) ~ 0.009, below the ~0.1 between alpha 0 and 0.1 measured on this benchmark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import ml_collections
import numpy as np
from matplotlib.figure import Figure

from rivet_jax import evaluation
from rivet_jax.envs.base import RouterPolicy
from rivet_jax.envs.routesim import RouteSim
from rivet_jax.experiments import report
from rivet_jax.experiments.common import MAIN
from rivet_jax.router import Router


def alpha_grid(config: ml_collections.ConfigDict) -> list[float]:
    """The alphas trained: `select.alphas` (when selecting) with 0 and the configured alpha, ascending."""
    alphas = {0.0, float(config.loss.alpha)}
    if config.select.enabled:
        alphas |= {float(a) for a in config.select.alphas}
    return sorted(alphas)


def alpha_variant(alpha: float) -> str:
    """A grid run's variant name (and so its directory under runs/)."""
    return f"alpha_{alpha:g}"


def validation_returns(sim: RouteSim, routers: Sequence[Router], split: str, rollouts: int, seed: int) -> list[float]:
    """Each router's mean return J over `rollouts` rollouts of every task of `split` (all stepped together)."""
    episodes = evaluation.rollout_each(sim, [RouterPolicy(r) for r in routers], split, rollouts, seed)
    return [evaluation.episode_metrics(e, r.config.reward.lam, r.config.reward.gamma, r.c_ref, rollouts)["return"]
            for r, e in zip(routers, episodes)]


def select_alpha(config: ml_collections.ConfigDict, sim: RouteSim,
                 dirs: dict[float, Sequence[Path]]) -> tuple[float, list[dict]]:
    """(the chosen alpha, a row per alpha: mean and sd over seeds of the validation J, and whether chosen).
    `dirs`: each alpha's run directories (one per seed), their online stage finished."""
    s = config.select
    rows = []
    for alpha, run_dirs in sorted(dirs.items()):
        returns = validation_returns(sim, [Router.from_checkpoint(d, stage="online") for d in run_dirs], s.split,
                                     s.rollouts, s.seed)
        rows.append({"alpha": alpha, "seeds": len(returns), "val_return": float(np.mean(returns)),
                     "val_return_sd": float(np.std(returns)), "per_seed": returns})
    if s.enabled:
        chosen = max(rows, key=lambda r: r["val_return"])["alpha"]
    else:
        chosen = float(config.loss.alpha)
    for r in rows:
        r["chosen"] = r["alpha"] == chosen
        r["paper"] = r["alpha"] == float(config.loss.alpha)
        r["router"] = (MAIN if r["chosen"] else "w/o CQL" if r["alpha"] == 0 else paper_row(config) if r["paper"]
                       else f"RIVET (alpha={r['alpha']:g})")  # each run's name in Table 2 and the figures
    return chosen, rows


def paper_row(config: ml_collections.ConfigDict) -> str:
    """Table 2's row of RIVET at the configured (paper's) alpha, when validation chose another."""
    return f"RIVET (paper: alpha={config.loss.alpha:g})"


def plot(rows: list[dict], path: Path, colours: dict | None = None) -> Figure:
    """Validation J per alpha, ± sd over seeds, each bar in its router's colour."""
    colours = report.completed_palette(rows, colours)
    fig = Figure(figsize=(6, 3.6))
    ax = fig.subplots()
    report.bars(ax, rows, "val_return", colours)
    ax.set_xticks(range(len(rows)), [f"alpha={r['alpha']:g}\n{r['router']}" for r in rows], fontsize=7,
                  rotation=0)
    ax.set_ylabel("validation J (mean over seeds)")
    low = min(r["val_return"] - r["val_return_sd"] for r in rows)
    ax.set_ylim(bottom=max(0.0, low - 0.1) if low > 0 else None)
    fig.suptitle("The CQL weight chosen on validation")
    return report.save_figure(fig, path)
