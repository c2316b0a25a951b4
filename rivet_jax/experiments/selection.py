"""Choosing the conservatism of the TD stage on the validation split, as the paper chooses its hyperparameters
(`config.select`, used by `launch.reproduce`).

A setting is a CQL weight alpha and where CQL applies (`loss.cql_on`: every logged transition as in Eq. 10, or only
those whose logged choice was a draw, see losses.py). Every setting of the grid trains through all stages at every
seed; each run's router (its best-validation online checkpoint) is rolled out `select.rollouts` times per
validation task, and the setting with the highest mean validation return J over the seeds becomes RIVET (ours):
its ablations and lambda sweep train at that setting. The test manifest is never read. The grid always holds
alpha = 0 (the "w/o CQL" ablation, so it is trained once) and the configured setting (the paper's, reported
beside the choice); `select.enabled = False` keeps the configured setting without looking at validation (the
paper's fixed settings).

The deployed RIVET (ours) averages `reproduce.ensemble` runs of the chosen setting per seed (`Router.ensemble`):
values fitted to noisy TD targets differ between runs by more than the real gaps between candidates (on this
benchmark the validation J of single alpha-0 runs spreads by ~0.03 across seeds), and the mean keeps what the runs
agree on. `ensemble_row` validates it exactly as the grid, beside the chosen setting's single runs.

How many rollouts: one rollout of the 35 validation tasks has a J standard deviation of about 0.06, and the
difference of two routers rolled out with the same seeds about as much (their episodes diverge after the first
different choice). With 16 rollouts per task and 3 seeds an alpha's mean J has a standard error of about
0.06 / sqrt(48) ~ 0.009, below the ~0.1 between alpha 0 and 0.1 measured on this benchmark (and the
validation seed is not the one the online stage chose its checkpoint with, so that choice's luck does not carry).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import ml_collections
import numpy as np
from matplotlib.figure import Figure

from rivet_jax import evaluation, plots
from rivet_jax.data.replay import Reward
from rivet_jax.deploy import best
from rivet_jax.envs.base import RouterPolicy
from rivet_jax.envs.routesim import RouteSim
from rivet_jax.experiments import report
from rivet_jax.experiments.common import ONE_RUN
from rivet_jax.runs import MAIN
from rivet_jax.router import Router


Setting = tuple[float, str]  # (loss.alpha, loss.cql_on): one conservatism setting of the grid


def grid(config: ml_collections.ConfigDict) -> list[Setting]:
    """The settings trained: alpha = 0 (w/o CQL), the configured setting (the paper's), and when selecting every
    alpha > 0 of `select.alphas` with every `select.cql_on`; ascending."""
    settings = {(0.0, "all"), paper(config)}
    if config.select.enabled:
        settings |= {(float(a), on) for a in config.select.alphas for on in config.select.cql_on if float(a) > 0}
    return sorted(settings)


def paper(config: ml_collections.ConfigDict) -> Setting:
    """The configured setting (`config.loss`: the paper's unless overridden)."""
    return float(config.loss.alpha), config.loss.cql_on


def overrides(setting: Setting) -> dict:
    alpha, cql_on = setting
    return {"loss.alpha": alpha, "loss.cql_on": cql_on}


def variant(setting: Setting) -> str:
    """A grid run's variant name (and so its directory under runs/): alpha_0.1, alpha_0.1_cql_stochastic."""
    alpha, cql_on = setting
    return f"alpha_{alpha:g}" + ("" if cql_on == "all" else f"_cql_{cql_on}")


def validation_returns(sim: RouteSim, routers: Sequence[Router], split: str, rollouts: int, seed: int) -> list[float]:
    """Each router's mean return J over `rollouts` rollouts of every task of `split` (all stepped together)."""
    episodes = evaluation.rollout_each(sim, [RouterPolicy(r) for r in routers], split, rollouts, seed)
    return [evaluation.episode_metrics(e, Reward.of(r.config, r.c_ref), rollouts)["return"]
            for r, e in zip(routers, episodes)]


def select(config: ml_collections.ConfigDict, sim: RouteSim,
           dirs: dict[Setting, Sequence[Path]]) -> tuple[Setting, list[dict]]:
    """(the chosen setting, a row per setting: mean and sd over seeds of the validation J, whether chosen, whether
    the paper's, and its router's name). `dirs`: each setting's run directories (one per seed), online finished."""
    s = config.select
    rows = []
    for setting, run_dirs in sorted(dirs.items()):
        routers = [Router.from_checkpoint(d, stage="online") for d in run_dirs]
        rows.append({"alpha": setting[0], "cql_on": setting[1], **_validated(config, sim, routers)})
    top = rows[best([r["val_return"] for r in rows])]  # the one rule of every validated choice
    chosen = (top["alpha"], top["cql_on"]) if s.enabled else paper(config)
    deployed = MAIN if config.reproduce.ensemble == 1 else ONE_RUN
    for r in rows:
        setting = (r["alpha"], r["cql_on"])
        r["chosen"], r["paper"] = setting == chosen, setting == paper(config)
        r["router"] = name(setting, config) if not r["chosen"] else deployed  # its name in Table 2 and the figures
    return chosen, rows


def ensemble_row(config: ml_collections.ConfigDict, sim: RouteSim, chosen: Setting,
                 ensembles: Sequence[Router]) -> dict:
    """RIVET (ours) when it averages runs: a `select` row of the chosen setting whose router per seed is that
    seed's `Router.ensemble` (online stage), validated with the grid's rollouts and seed."""
    return {"alpha": chosen[0], "cql_on": chosen[1], **_validated(config, sim, ensembles), "chosen": True,
            "paper": chosen == paper(config), "router": MAIN}


def _validated(config: ml_collections.ConfigDict, sim: RouteSim, routers: Sequence[Router]) -> dict:
    """A selection row's numbers: the runs averaged per router, and the validation J of each router (one per seed),
    their mean and sd."""
    s = config.select
    returns = validation_returns(sim, routers, s.split, s.rollouts, s.seed)
    return {"members": routers[0].members, "seeds": len(returns), "val_return": float(np.mean(returns)),
            "val_return_sd": float(np.std(returns)), "per_seed": returns}


def name(setting: Setting, config: ml_collections.ConfigDict) -> str:
    """A setting's router name where it is not RIVET (ours): w/o CQL, the paper's, or its alpha and CQL scope."""
    alpha, cql_on = setting
    if alpha == 0:
        return "w/o CQL"
    if setting == paper(config):
        return f"RIVET (paper, alpha={alpha:g})"
    return f"RIVET (alpha={alpha:g}" + (", CQL on draws)" if cql_on == "stochastic" else ")")


def label(setting: Setting) -> str:
    alpha, cql_on = setting
    return f"alpha={alpha:g}" + (", CQL on draws" if cql_on == "stochastic" else "")


def plot(rows: list[dict], path: Path, colours: dict | None = None) -> Figure:
    """Validation J per setting (and of the ensemble of the chosen one), ± sd over seeds, each bar in its router's
    colour."""
    colours = report.completed_palette(rows, colours)
    fig = Figure(figsize=(2 + 1.4 * len(rows), 3.8))
    ax = fig.subplots()
    report.bars(ax, rows, "val_return", colours)
    ax.set_xticks(range(len(rows)), [label((r["alpha"], r["cql_on"])).replace(", ", "\n")
                                     + (f"\nmean of {r['members']} runs" if r["members"] > 1 else "")
                                     + (f"\n= {r['router']}" if r["chosen"] else "") for r in rows], fontsize=8,
                  rotation=0)
    ax.set_ylabel("validation J (mean over seeds)")
    low = min(r["val_return"] - r["val_return_sd"] for r in rows)
    ax.set_ylim(bottom=max(0.0, low - 0.1) if low > 0 else None)
    fig.suptitle("The conservatism setting chosen on validation")
    return plots.save_figure(fig, path)
