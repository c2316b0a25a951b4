"""One round of learning from live traffic: retrain on what was served, prove the gain off-policy, promote
(`launch.loop`).

A served workdir W is one `launch.train` wrote; `launch.serve --workdir=W` serves what `W/deploy.json` names and
swaps in whatever it names next. A round:

  1. the data: the logs W was trained on (the config's `data.episodes`) and every episode the proxy recorded
     (`config.loop.recorded`, default W/serve/episodes.jsonl), read once into W/rounds/<r>/recorded.jsonl: the
     round's data stay fixed (and a resumed round the same) while the proxy records on
  2. retrain: the runs of `pipeline.train_runs` (every conservatism setting) in W/rounds/<r>, on a split that
     extends W's (W's tasks keep their split; each new task is hashed into validation with probability
     `config.loop.holdout`, else train), rewards at the served router's c_ref: every round in the same units;
     and, when the served router routes, its runs trained on from the parameters it serves (`warm_configs`: TD at
     `config.loop.warm_lr` for `config.loop.warm_epochs`, in W/rounds/<r>/warm/<i>). A fine-tuned router departs
     from the served one at few states, so its paired gain over it is estimated on few disagreements
  3. the candidates: every stage, kept epoch, ensemble and shrinkage of those runs (`pipeline.candidates_of`), the
     warm runs' (named `warm ...`), and the served router (`SERVED`), each choosing as the proxy serves it: every
     turn afresh (the proxy's conversations carry no model names, so no router commits behind it)
  4. their value on the held-out recorded episodes (validation tasks, exact propensities): doubly robust with
     FQE's model cross-fitted on the round's training episodes, every candidate paired with the served router on
     the same task-clustered bootstrap resamples, on each half of the held-out tasks alone (`task_halves`)
  5. the decision: the candidate with the best estimate on one half is promoted only when its paired gain over the
     served router, on the other half, has a 95% interval above 0; otherwise the served router stays, and the
     record says why. Chosen and proved on the same episodes, the best of a hundred noisy estimates would be the one
     the noise flattered most, and its interval would not cover it
  6. W/rounds.jsonl gets the round's line (data, every candidate's estimate and interval, decision, why); then,
     promoted, W/deploy.json names the candidate (its runs under rounds/<r>) and a proxy serving W swaps it in.

Safe by construction: a round that cannot show a gain changes nothing but rounds.jsonl. A killed round resumes: the
runs resume from their checkpoints; a round on record is not run again, and a promotion on record whose deploy.json
was not written yet is written (`settle`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable

import numpy as np
from absl import logging

from rivet_jax import deploy, heldout, pipeline, train
from rivet_jax.checkpointing import StageCheckpoints
from rivet_jax.data.files import atomic_write_text
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode, read_episodes, read_model_cards, write_episodes
from rivet_jax.data.splits import MANIFEST
from rivet_jax.deployment_file import read_deployment_spec
from rivet_jax.encoders import cache_dir, embedding_store
from rivet_jax.router import Router
from rivet_jax.serve.served import deployment_version
from rivet_jax.settings import with_overrides
from rivet_jax.workdir_lock import hold_workdir

SERVED = "served"
WARM = "warm"   # the warm candidates' runs: W/rounds/<r>/warm/<i>
ROUNDS_FILE = "rounds.jsonl"

__all__ = ["SERVED", "ROUNDS_FILE", "Round", "decide", "task_halves", "learn", "finish", "rounds_of", "append_round",
           "settle", "recorded_path"]


def task_halves(held: heldout.HeldOut, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two boolean (n,) masks of the held-out episodes splitting their tasks in halves at random (`seed`): one to
    choose a candidate on, the other to prove its gain on. Chosen and proved on the same episodes, the best of many
    noisy estimates is the one noise flattered most, and its interval no longer covers it (the winner's curse;
    Thomas, Theocharous & Ghavamzadeh 2015's high-confidence policy improvement splits its data for this reason)."""
    tasks = sorted({e.task.id for e in held.logs.episodes})
    if len(tasks) < 2:
        raise ValueError(f"the held-out episodes cover {len(tasks)} task: choosing a candidate and proving its gain "
                         f"need at least 2 (record more traffic or raise config.loop.holdout)")
    order = np.random.default_rng(seed).permutation(len(tasks))
    choosing = {tasks[i] for i in order[:len(tasks) // 2]}
    mask = np.array([e.task.id in choosing for e in held.logs.episodes])
    return mask, ~mask


def recorded_path(config, workdir: Path) -> Path:
    return Path(config.loop.recorded) if config.loop.get("recorded") else workdir / "serve" / "episodes.jsonl"


def rounds_of(workdir: str | Path) -> list[dict]:
    """The rounds on record in W/rounds.jsonl, in order."""
    path = Path(workdir) / ROUNDS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def append_round(workdir: Path, record: dict) -> None:
    """One more line of W/rounds.jsonl (the file rewritten atomically: a kill leaves it whole)."""
    lines = [json.dumps(r, allow_nan=True) for r in rounds_of(workdir)] + [json.dumps(record, allow_nan=True)]
    atomic_write_text(workdir / ROUNDS_FILE, "\n".join(lines) + "\n")


def settle(workdir: Path) -> None:
    """Writes the last round's promotion to W/deploy.json if a kill came between the record and the write."""
    rounds = rounds_of(workdir)
    if not rounds or not rounds[-1]["promoted"]:
        return
    spec = rounds[-1]["deploy"]
    current = read_deployment_spec(workdir)
    if current != spec:
        logging.info("round %d's promotion was on record but not deployed: deploying it now", rounds[-1]["round"])
        deploy.write_deployment(workdir, spec, {"promoted_by": "launch.loop", "round": rounds[-1]["round"]})


def warm_dirs(count: int) -> tuple[str, ...]:
    """The warm runs' directories in a round's directory."""
    return tuple(f"{WARM}/{i}" for i in range(count))


def warm_configs(config, workdir: Path, served: dict) -> list:
    """Step 2's warm runs: one per run of the served router (`served`, W/deploy.json's deploy section), TD from the
    checkpoint it serves (`warm_start`) for `config.loop.warm_epochs` at `config.loop.warm_lr`, with the run's own
    seed and loss (its conservatism). None when the served router is a fixed model (scores that read no Q_route:
    nothing learned to start from) or warm_epochs is 0."""
    recentring = served.get("recentring")
    if not int(config.loop.warm_epochs) or (recentring is not None and float(recentring["k"]) == 0):
        return []
    at = served["stage"] + ("" if served.get("epoch") is None else f"@{served['epoch']}")
    out = []
    for run in served["runs"]:
        checkpoints = StageCheckpoints(workdir / run, served["stage"], max_to_keep=None)
        trained_with = checkpoints.restore_meta(served.get("epoch"))["config"]
        checkpoints.close()
        out.append(with_overrides(config, {
            "stage": "td", "warm_start": f"{(workdir / run).resolve()}:{at}", "seed": trained_with["seed"],
            "td_epochs": int(config.loop.warm_epochs), "optim.lr": float(config.loop.warm_lr),
            **{f"loss.{key}": value for key, value in trained_with["loss"].items() if key in config.loss}}))
    return out


@dataclasses.dataclass
class Round:
    """A round's decision (not yet recorded or deployed): the record for rounds.jsonl and, promoted, the
    deployment; `router` the promoted (or rejected) candidate as it would be served, `held` the held-out
    episodes its gain was proved on."""

    record: dict
    router: Router
    held: list[Episode]
    routers: Callable[[], dict[str, Router]]   # every candidate (and the served router) as it would be served


def decide(selection: heldout.Estimates, proof: heldout.Estimates) -> tuple[int, bool]:
    """Step 5 (module docstring): (the candidate, whether it is promoted). The candidate is the policy other than
    `SERVED` with the best J on the choosing half (`selection`; the earliest of ties); it is promoted only if its
    paired gain over `SERVED` on the other half (`proof`: the same policies) has a 95% interval above 0."""
    others = np.where(np.array(selection.names) == SERVED, -np.inf, selection.point[:, heldout.J])
    shown = deploy.best(others)
    return shown, proof.difference(shown, proof.index(SERVED))[1] > 0


def learn(config, workdir: str | Path, log: Callable[[str], None] = logging.info) -> Round:
    """Steps 1-5 of a round (module docstring) on the served workdir; W/rounds/<r> holds its runs."""
    workdir = Path(workdir)
    settle(workdir)
    earlier_rounds = rounds_of(workdir)
    number = len(earlier_rounds) + 1
    served = Router.from_checkpoint(workdir)
    recorded = recorded_path(config, workdir)
    if not recorded.exists():
        raise FileNotFoundError(f"{recorded}: no recorded episodes to learn from (serve W with launch.serve and post "
                                f"outcomes, or name them with --config.loop.recorded)")
    round_dir = workdir / "rounds" / str(number)
    round_dir.mkdir(parents=True, exist_ok=True)
    snapshot = round_dir / "recorded.jsonl"   # the round's data stays fixed while the proxy records on
    if not snapshot.exists():
        write_episodes(snapshot, read_episodes(recorded, read_model_cards(config.data.cards)).episodes)
    round_config = with_overrides(config, {
        "data.episodes": ",".join(p for p in (config.data.episodes, str(snapshot)) if p),
        "data.holdout.extend": str(workdir / MANIFEST), "data.holdout.validation": float(config.loop.holdout),
        "data.holdout.test": 0.0, "reward.c_ref": float(served.c_ref),
        "data.embedding_cache": str(cache_dir(config, workdir))})
    log(f"round {number}: retraining on {round_config.data.episodes} into {round_dir}")
    warm = warm_configs(round_config, workdir, read_deployment_spec(workdir))
    with hold_workdir(round_dir):
        trained = pipeline.train_runs(round_config, round_dir, None, None, log)
        if warm:
            log(f"round {number}: the served router's {len(warm)} run(s) trained on for "
                f"{round_config.loop.warm_epochs} TD epochs at lr {round_config.loop.warm_lr:g} (warm candidates)")
            train.train_group(warm, [round_dir / d for d in warm_dirs(len(warm))], None, None,
                              [trained.prepared] * len(warm), held=True)
    pool = trained.prepared.pool
    held_episodes = [e for e in trained.splits["validation"] if all(t.router is not None for t in e.turns)]
    recorded_total = sum(1 for split in trained.splits.values() for e in split
                         if all(t.router is not None for t in e.turns))
    earlier = earlier_rounds[-1]["recorded_total"] if earlier_rounds else 0
    if not held_episodes:
        raise ValueError(f"none of the {recorded_total} recorded episodes is on a held-out task: record more traffic "
                         f"or raise config.loop.holdout")
    scorer = dataclasses.replace(pipeline.scorer_of(round_config, round_dir, trained, None), commit=False)
    dc = round_config.deploy
    candidates = pipeline.candidates_of(round_config, round_dir, trained.runs, scorer.by_family)
    if warm:   # beside the fixed models already there: the warm runs at their kept and last epochs
        kept = {"td": pipeline.earlier_td_epochs(warm[0], round_dir / warm_dirs(1)[0])}
        candidates += [c for c in deploy.candidates({WARM: warm_dirs(len(warm))}, ("td",), dc.shrinkage, kept,
                                                    scorer.by_family)
                       if c.name not in (deploy.BEST_FIXED, deploy.BEST_PER_FAMILY)]
    reward = Reward.of(round_config, trained.prepared.c_ref)
    store = embedding_store(round_config, trained.prepared.encoder, round_dir)
    held = heldout.held_out(held_episodes, pool, store, round_config.max_state_tokens, reward)
    fit = heldout.held_out(trained.splits["train"], pool, store, round_config.max_state_tokens, reward)
    as_served = served.with_choice(dataclasses.replace(served.choice, commit=False))

    def targets(at: heldout.HeldOut) -> dict[str, np.ndarray]:
        chosen = deploy.choices(deploy.router_scores(as_served, at), at, False)
        return {SERVED: deploy.one_hot(chosen, len(pool)), **deploy.targets_of(scorer, candidates, at)}

    log(f"round {number}: {len(candidates)} candidates against the served router on {len(held_episodes)} held-out "
        f"recorded episodes ({heldout.explored_share(held):.0%} with exact propensities), the model cross-fitted on "
        f"{len(fit.logs.episodes)} training episodes")
    choosing, proving = task_halves(held, dc.seed)
    selection, proof = heldout.crossfit_parts(held, targets(held), fit, targets(fit), [choosing, proving],
                                             dc.resamples, dc.seed, float(dc.max_weight))
    shown, promoted = decide(selection, proof)
    name = selection.names[shown]
    gain, low, high = proof.difference(shown, proof.index(SERVED))
    j_low, j_high = proof.interval(shown, heldout.J)
    candidate = next((c for c in candidates if c.name == name), None)
    router = as_served if candidate is None else scorer.deployable(candidate)
    spec = None
    if promoted:
        spec = candidate.spec(scorer.choice(candidate), pool.names)
        spec["runs"] = [str(Path("rounds") / str(number) / run) for run in candidate.runs]
    why = (f"{name} (the best of {len(candidates)} on {selection.tasks} tasks): paired gain over the served router "
           f"{gain:+.4f} [{low:+.4f}, {high:+.4f}] (95%, {proof.estimator} on {proof.tasks} other tasks)"
           + (": above 0, promoted" if promoted else ": not shown above 0, the served router stays"))
    log(f"round {number}: {why}")
    record = {"round": number, "episodes": recorded_total - earlier, "recorded_total": recorded_total,
              "held_out_episodes": len(held_episodes), "held_out_tasks": selection.tasks + proof.tasks,
              "served_before": deployment_version(workdir), "candidates": deploy.candidate_rows(selection, SERVED),
              "candidate": name, "promoted": promoted, "why": why, "deploy": spec,
              "ope": {"estimator": proof.estimator, "estimate": float(proof.point[shown, heldout.J]),
                      "low": j_low, "high": j_high, "gain": gain, "gain_low": low, "gain_high": high,
                      "served_estimate": float(proof.point[proof.index(SERVED), heldout.J]),
                      "chosen_on": float(selection.point[shown, heldout.J])},
              "note": f"chosen on {selection.note}; proved on {proof.note}"}
    proved_on = [e for e, keep in zip(held.logs.episodes, proving) if keep]
    return Round(record, router, proved_on,
                 lambda: {SERVED: as_served, **{c.name: scorer.deployable(c) for c in candidates}})


def finish(workdir: str | Path, result: Round) -> None:
    """Step 6: the round on record, then its promotion deployed (in that order: `settle` completes a kill between)."""
    workdir = Path(workdir)
    append_round(workdir, result.record)
    if result.record["promoted"]:
        deploy.write_deployment(workdir, result.record["deploy"],
                                {"promoted_by": "launch.loop", "round": result.record["round"],
                                 "why": result.record["why"]})
