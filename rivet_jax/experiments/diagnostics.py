"""Learned routing values against RouteSim's exact Q* (`python -m launch.diagnose`).

RouteSim's oracle knows Q*(s, m) at every state a router can reach (`envs.oracle.OraclePolicy.q_values`: the
hidden state is replayed from the observable history). That turns "the router is worse than a baseline" into
"where and why": is Q_route off in level (bias), in shape (spread), in ranking (argmax agreement), at which turns
is value lost, and does the router just repeat the model that wrote the history (what CQL on fixed-model logs
teaches)? Two sets of states:

  logged    every state of the logged corpus (capped and sampled with a fixed seed): what the loss saw
  visited   the states the router itself reaches, rolled out on a split: what deployment sees

Per set, with q = Q_route (N, M) and q* = Q* (N, M) over the available models:

  rmse, bias             sqrt(mean (q - q*)^2), mean (q - q*)
  argmax_agreement       share of states where argmax q = argmax q*
  value_lost             mean V*(s) - Q*(s, argmax q): the return given up by the decision itself (by turn, too)
  q_spread, q_star_spread  mean over states of max - min over the models (the learned values' scale vs the truth's)
  q_star_gap             median Q* gap between the best and the second-best model (how fine the decisions are)
  same_as_logged         share of decisions that pick the model logged at that state (logged states; `_oracle`:
                         the oracle's share, for comparison)
  same_as_previous       share of decisions (turn >= 1) that pick the model that answered the previous turn
"""

from __future__ import annotations

import dataclasses
from fnmatch import fnmatch
from pathlib import Path
from typing import Sequence

import ml_collections
import numpy as np
from matplotlib.figure import Figure

from rivet_jax import checkpointing, evaluation, plots
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode, Turn, read_episodes
from rivet_jax.envs import collect as collect_lib
from rivet_jax.envs.base import RouterPolicy
from rivet_jax.envs.oracle import OraclePolicy
from rivet_jax.envs.routesim import RouteSim, make_routesim
from rivet_jax.experiments import report
from rivet_jax.router import Router


@dataclasses.dataclass(frozen=True)
class States:
    """N decision points: the task, the completed turns before the decision, and the model called there."""

    task_ids: list[str]
    prompts: list[str]
    histories: list[tuple[Turn, ...]]
    called: list[str]    # the model the logger (logged states) or the router (visited states) called

    @property
    def turns(self) -> np.ndarray:
        return np.array([len(h) for h in self.histories])                                        # (N,)


def states_of(episodes: Sequence[Episode], limit: int | None = None, seed: int = 0) -> States:
    """Every decision point of `episodes`; at most `limit` of them, sampled without replacement with `seed`."""
    points = [(e, t) for e in episodes for t in range(len(e.turns))]
    if limit is not None and len(points) > limit:
        points = [points[i] for i in np.sort(np.random.default_rng(seed).choice(len(points), limit, replace=False))]
    return States([e.task.id for e, _ in points], [e.task.prompt for e, _ in points],
                  [e.turns[:t] for e, t in points], [e.turns[t].model for e, t in points])


def q_star(oracle: OraclePolicy, states: States, pool_names: Sequence[str]) -> np.ndarray:
    """Exact Q*(s, m) (N, M) at every state, every model available."""
    return np.stack([oracle.q_values(task_id, history, pool_names)
                     for task_id, history in zip(states.task_ids, states.histories)])


def q_route(router: Router, states: States, batch: int = 256) -> np.ndarray:
    """The router's Q_route (N, M), scored in batches."""
    pairs = list(zip(states.prompts, states.histories))
    return np.concatenate([router.scores(pairs[i:i + batch]) for i in range(0, len(pairs), batch)])


def compare(q: np.ndarray, q_opt: np.ndarray, turns: np.ndarray, called: Sequence[int] | None = None,
            previous: Sequence[int] | None = None, max_turns: int | None = None) -> dict:
    """The module docstring's statistics for learned values q (N, M) against exact q_opt (N, M) at states whose
    turn index is `turns` (N,). `called`: the logged model index per state (for `same_as_logged`); `previous`: the
    previous turn's model index (-1 at turn 0)."""
    n = len(q)
    chosen, best = np.argmax(q, axis=1), np.argmax(q_opt, axis=1)                                # (N,)
    lost = q_opt[np.arange(n), best] - q_opt[np.arange(n), chosen]                                # (N,) >= 0
    ranked = np.sort(q_opt, axis=1)
    max_turns = int(turns.max()) + 1 if max_turns is None else max_turns
    out = {"states": n,
           "rmse": float(np.sqrt(np.mean((q - q_opt) ** 2))),
           "bias": float(np.mean(q - q_opt)),
           "argmax_agreement": float(np.mean(chosen == best)),
           "value_lost": float(np.mean(lost)),
           "value_lost_by_turn": [float(lost[turns == t].mean()) if np.any(turns == t) else float("nan")
                                  for t in range(max_turns)],
           "states_by_turn": [int(np.sum(turns == t)) for t in range(max_turns)],
           "q_spread": float(np.mean(q.max(axis=1) - q.min(axis=1))),
           "q_star_spread": float(np.mean(q_opt.max(axis=1) - q_opt.min(axis=1))),
           "q_star_gap": float(np.median(ranked[:, -1] - ranked[:, -2]))}
    for key, models in (("same_as_logged", called), ("same_as_previous", previous)):
        if models is not None:
            models = np.asarray(models)
            at = models >= 0  # the previous model is -1 at turn 0: no such decision there
            for suffix, picks in (("", chosen), ("_oracle", best)):
                out[key + suffix] = float(np.mean(picks[at] == models[at])) if at.any() else float("nan")
    return out


def diagnose(sim: RouteSim, routers: Sequence[tuple[dict, Router]], logged: Sequence[Episode], split: str,
             rollouts: int = 1, seed: int = 0, max_logged_states: int | None = 2000) -> list[dict]:
    """A row of `compare` per (label, router) and state set, the label's fields leading the row: the logged states
    (`max_logged_states` sampled, the same for every router) and each router's own rollouts on `split`, against the
    exact Q* at the router's lambda, gamma and c_ref (solved once per such triple)."""
    names = list(sim.pool.names)
    sampled = states_of(logged, max_logged_states, seed)
    oracles: dict[tuple, tuple[OraclePolicy, np.ndarray]] = {}
    rows = []
    for label, router in routers:
        key = Reward.of(router.config, router.c_ref)
        if key not in oracles:
            oracle = OraclePolicy(sim, key)
            oracles[key] = oracle, q_star(oracle, sampled, names)
        oracle, logged_q_star = oracles[key]
        visited = states_of(evaluation.rollout(sim, RouterPolicy(router), split, rollouts, seed))
        for where, states, q_opt in (("logged", sampled, logged_q_star), ("visited", visited, None)):
            q_opt = q_star(oracle, states, names) if q_opt is None else q_opt
            previous = [names.index(h[-1].model) if h else -1 for h in states.histories]
            called = [names.index(m) for m in states.called] if where == "logged" else None
            rows.append({**label, "states_of": where, "split": "corpus" if where == "logged" else split,
                         **compare(q_route(router, states), q_opt, states.turns, called, previous, sim.max_turns)})
    return rows


def run_dirs(workdir: Path) -> dict[str, Path]:
    """The training runs under an experiment's workdir: <workdir>/runs/<variant>/seed_<s>/ (launch.reproduce) and
    <workdir>/train/ (launch.evaluate), by name ("rivet/seed_0", "train")."""
    found = {f"{d.parent.name}/{d.name}": d for d in sorted((workdir / "runs").glob("*/seed_*")) if d.is_dir()}
    if (workdir / "train").is_dir():
        found["train"] = workdir / "train"
    return found


def diagnose_workdir(config: ml_collections.ConfigDict, workdir: str | Path, only: Sequence[str] = ()) -> list[dict]:
    """`diagnose` every stage checkpoint of every run in `workdir` (or the runs named in `only`, fnmatch patterns
    such as "rivet/*") against the corpus collected there, with `config.diagnose`'s split, rollouts and sample."""
    workdir = Path(workdir)
    episodes_path = workdir / "corpus" / collect_lib.EPISODES_FILE
    if not episodes_path.exists():
        raise FileNotFoundError(f"no logged corpus at {episodes_path}: run launch.reproduce or launch.evaluate with "
                                f"this workdir first")
    runs = {name: d for name, d in run_dirs(workdir).items() if not only or any(fnmatch(name, p) for p in only)}
    if not runs:
        raise FileNotFoundError(f"no training runs under {workdir} (looked for runs/*/seed_*/ and train/)"
                                + (f" matching {list(only)}" if only else ""))
    sim = make_routesim(config.sim)
    logged = read_episodes(episodes_path, sim.pool).episodes
    routers = [({"run": name, "stage": stage}, Router.from_checkpoint(d, stage=stage))
               for name, d in runs.items() for stage in checkpointing.ROUTER_STAGES
               if checkpointing.StageCheckpoints(d, stage).latest_epoch() is not None]
    d = config.diagnose
    return diagnose(sim, routers, logged, d.split, d.rollouts, d.seed, d.max_logged_states)


COLUMNS = [("run", "run", -1), ("stage", "stage", -1), ("states_of", "states", -1), ("states", "n", -1),
           ("rmse", "RMSE", 3), ("bias", "bias", 3), ("argmax_agreement", "argmax = oracle", 2),
           ("value_lost", "value lost", 4), ("q_spread", "Q spread", 3), ("q_star_spread", "Q* spread", 3),
           ("same_as_logged", "= logged", 2), ("same_as_logged_oracle", "oracle = logged", 2),
           ("same_as_previous", "= previous", 2), ("same_as_previous_oracle", "oracle = previous", 2)]


def by_turn_table(rows: list[dict]) -> str:
    """Value lost per decision at each turn index (and how many states had it), a row per (run, stage, states)."""
    turns = max(len(r["value_lost_by_turn"]) for r in rows)
    flat = [{**{k: r[k] for k in ("run", "stage", "states_of")},
             **{f"t{t}": (f"{r['value_lost_by_turn'][t]:.4f} ({r['states_by_turn'][t]})"
                          if t < len(r["states_by_turn"]) and r["states_by_turn"][t] else "") for t in range(turns)}}
            for r in rows]
    return report.markdown_table(flat, COLUMNS[:3] + [(f"t{t}", f"turn {t}", -1) for t in range(turns)])


def markdown(rows: list[dict], settings: ml_collections.ConfigDict) -> str:
    """The launcher's diagnostics.md: what was measured, the summary table, the value lost by turn."""
    return (f"# Q_route against the exact Q*\n\nLogged states: {rows[0]['states']} sampled from the corpus (seed "
            f"{settings.seed}); visited states: each router's own rollouts on '{settings.split}' ({settings.rollouts} "
            f"per task). Value lost = V*(s) - Q*(s, the router's choice), per decision.\n\n"
            f"{report.markdown_table(rows, COLUMNS)}\n\n## Value lost per decision by turn (states)\n\n"
            f"{by_turn_table(rows)}")


SUMMARY_KEYS = ("rmse", "bias", "argmax_agreement", "value_lost", "q_spread", "q_star_spread", "same_as_logged",
                "same_as_logged_oracle", "same_as_previous", "same_as_previous_oracle")


def over_seeds(rows: list[dict]) -> list[dict]:
    """The report's rows: `diagnose` rows whose labels name their router (one run per seed) averaged over seeds per
    (router, stage, states), with each statistic's standard deviation as `<key>_sd`."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["router"], r["stage"], r["states_of"]), []).append(r)
    out = []
    for (router, stage, where), at in groups.items():
        keys = [k for k in SUMMARY_KEYS if k in at[0]]
        out.append({"router": router, "stage": stage, "states_of": where, "seeds": len(at),
                    "states": int(np.mean([r["states"] for r in at])),
                    **{k: float(np.mean([r[k] for r in at])) for k in keys},
                    **{f"{k}_sd": float(np.std([r[k] for r in at])) for k in keys},
                    "value_lost_by_turn": np.nanmean([r["value_lost_by_turn"] for r in at], axis=0).tolist()})
    return out


def plot(rows: list[dict], path: Path, colours: dict | None = None) -> Figure:
    """The report's figure of `over_seeds` rows, the deployed (online) routers only: value lost per decision by turn
    on the visited states, and on the logged states how often the router picks the model logged there against how
    often the oracle does (the table has the TD checkpoints too)."""
    rows = [r for r in rows if r["stage"] == "online"] or rows
    colours = report.completed_palette(rows, colours)
    fig = Figure(figsize=(12, 4.6))
    left, right = fig.subplots(1, 2)
    for r in (r for r in rows if r["states_of"] == "visited"):
        lost = np.asarray(r["value_lost_by_turn"], float)
        turns = np.flatnonzero(np.isfinite(lost))
        left.plot(turns, lost[turns], "o-", color=colours[r["router"]], label=f"{r['router']}: {r['stage']}")
    left.set_xlabel("turn")
    left.set_ylabel("value lost per decision, V* - Q*(s, choice)")
    left.set_title("visited states", fontsize=9)
    left.legend(fontsize=7, loc="upper left")
    logged = [{**r, "label": f"{r['router']}: {r['stage']}"} for r in rows if r["states_of"] == "logged"]
    report.bars(right, logged, "same_as_logged", colours,
                style=lambda r: {"color": colours[r["router"]], "label": r["label"]})
    right.set_xticks(range(len(logged)), [r["label"] for r in logged], fontsize=7, rotation=30, ha="right")
    if logged:
        oracle = right.axhline(logged[0]["same_as_logged_oracle"], color=colours.get("oracle", "black"),
                               linestyle=":", label="oracle")
        right.legend(handles=[oracle], fontsize=7)  # the oracle's share, for comparison
    right.set_ylabel("share of choices = the logged model")
    right.set_title("logged states", fontsize=9)
    fig.suptitle("Learned Q_route against the exact Q*")
    return plots.save_figure(fig, path)
