"""One run's books in one stage: where it resumes from, what it starts from, its checks, checkpoints and logs.

Every stage of every run keeps its books here, whichever engine steps it (`engine.py` for MC and TD, `online.py`
for the online stage): a resume is checked against the run that made the checkpoint (`check_resume`), a stage
starts from the previous stage's finished parameters (`finished_params`), and nothing non-finite is ever saved
(`check_losses`, `check_params`: one `checkpointing.NonFiniteError` for every stage).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

from rivet_jax import checkpointing, run_identity, sharding
from rivet_jax.checkpointing import NonFiniteError
from rivet_jax.config_checks import ConfigError
from rivet_jax.corpus import PreparedData
from rivet_jax.learner import TrainState, from_saveable, init_train_state, saveable, template_state
from rivet_jax.networks import RivetNet
from rivet_jax.run_identity import flatten
from rivet_jax.settings import SUSPECTS, parse_warm_start

OFFLINE_STAGES = ("mc", "td")                # the epoch-trained stages, in training order
ROUTER_STAGES = checkpointing.ROUTER_STAGES  # every stage whose checkpoint is a router: mc, td, online
PREVIOUS = {"td": "mc", "online": "td"}      # the stage whose finished parameters a stage starts from


def checkpoint_meta(config, prepared: PreparedData, stage: str) -> dict:
    return {"stage": stage, "config": json.loads(config.to_json()), "pool": prepared.pool.to_json(),
            "encoder": {"name": prepared.encoder.name, "dim": prepared.encoder.dim,
                        "fingerprint": prepared.encoder.fingerprint},
            "c_ref": prepared.c_ref, "state_dim": int(prepared.data.embeddings.shape[1]), "corpus": prepared.digest}


def check_resume(meta: dict, config, prepared: PreparedData, stage: str, source: str) -> None:
    """Refuses to continue stage `stage` from a checkpoint (its `meta`) made with another pool, encoder, config or
    corpus (see `run_identity`), naming every difference in one error."""
    problems = checkpointing.compatibility_problems(meta, prepared.pool, prepared.encoder.fingerprint, source=source)
    changed = run_identity.resume_differences(meta, json.loads(config.to_json()), prepared.digest, stage)
    if changed:
        raise checkpointing.ConfigChangedError(
            f"{source} was made by another run than this one ({'; '.join(problems + changed)}): train in a new "
            f"workdir, or resume with the settings and logs it was made with")
    if problems:
        raise checkpointing.CheckpointMismatchError(f"{source} does not match this run: " + "; ".join(problems))


def stored_c_ref(workdir: str | Path) -> float | None:
    """c_ref fixed by an earlier stage of this workdir, so every stage reads the same rewards."""
    for stage in OFFLINE_STAGES:
        if checkpointing.stage_dir(workdir, stage).is_dir():
            checkpoints = checkpointing.StageCheckpoints(workdir, stage)
            if checkpoints.latest_epoch() is not None:
                return checkpoints.restore_meta()["c_ref"]
    return None


def stage_epochs(config, stage: str) -> int:
    """The length of an offline stage in epochs."""
    return {"mc": config.mc_epochs, "td": config.td_epochs}[stage]


def restore_state(checkpoints: checkpointing.StageCheckpoints, template: TrainState, epoch: int | None = None,
                  mesh=None) -> TrainState:
    """A TrainState checkpoint shaped like `template`; with a multi-device `mesh`, orbax restores every leaf straight
    onto it, replicated (whatever device count saved it)."""
    target = saveable(template)
    placed = mesh is not None and mesh.size > 1
    if placed:
        target = checkpointing.abstract_tree(target, sharding.replicated(mesh))
    restored, _ = checkpoints.restore(target, epoch=epoch)
    return from_saveable(restored, placed=placed)


def finished_params(config, workdir: Path, stage: str, prepared: PreparedData, template: TrainState,
                    mesh=None) -> Any:
    """The parameters `stage` starts from: those of the previous stage (`PREVIOUS`) once it ran all its epochs,
    checked to be this run's (`check_resume`). Not finished: FileNotFoundError naming what to run first."""
    previous = PREVIOUS[stage]
    checkpoints = checkpointing.StageCheckpoints(workdir, previous)
    done, needed = checkpoints.latest_epoch(), stage_epochs(config, previous)
    if done is None or done < needed:
        has = "no checkpoint" if done is None else f"{done}/{needed} epochs"
        raise FileNotFoundError(f"stage '{stage}' starts from a finished '{previous}' stage, but "
                                f"{checkpoints.directory} has {has}: run --config.stage={previous} first")
    check_resume(checkpoints.restore_meta(done), config, prepared, stage, str(checkpoints.directory))
    params = restore_state(checkpoints, template, done, mesh).params
    checkpoints.close()
    return params


def stages_of(config) -> tuple[str, ...]:
    """The stages `config.stage` names, in training order: 'mc', 'td', 'online', 'offline' (mc, td) or 'all'."""
    stages = {"offline": OFFLINE_STAGES, "all": ROUTER_STAGES}.get(config.stage, (config.stage,))
    if any(s not in ROUTER_STAGES for s in stages):
        raise ConfigError(f"unknown stage {config.stage!r}; known: {ROUTER_STAGES + ('offline', 'all')}")
    return stages


def warm_params(config, prepared: PreparedData, like_params: Any) -> Any:
    """The parameters `config.warm_start` names ('<run dir>:<stage>[@<epoch>]'), checked to be a router of this
    run's pool and encoder and shaped like `like_params`: where a warm-started run's first stage starts."""
    run, stage, epoch = parse_warm_start(config.warm_start)
    where = f"warm_start {config.warm_start!r}"
    if not checkpointing.stage_dir(run, stage).is_dir():   # not opened: opening would create it
        raise FileNotFoundError(f"{where}: no checkpoints of stage '{stage}' in {checkpointing.stage_dir(run, stage)}")
    checkpoints = checkpointing.StageCheckpoints(run, stage, max_to_keep=None)
    try:
        if checkpoints.latest_epoch() is None:
            raise FileNotFoundError(f"{where}: {checkpoints.directory} holds no intact checkpoint")
        epoch = checkpoints.latest_epoch() if epoch is None else epoch
        if epoch not in checkpoints.epochs():
            raise FileNotFoundError(f"{where}: {checkpoints.directory} kept no epoch {epoch} "
                                    f"(it has {checkpoints.epochs()})")
        checkpointing.check_compatible(checkpoints.restore_meta(epoch), prepared.pool, prepared.encoder.fingerprint,
                                       source=where)
        params, _ = checkpoints.restore_params(like_params, epoch)
    finally:
        checkpoints.close()
    logging.info("Starting from %s (epoch %d)", where, epoch)
    return params


# ---------------------------------------------------------------------------------------------- non-finite


def suspects(config, c_ref: float, stage: str) -> str:
    """The settings that scale a loss or a step (`settings.SUSPECTS`: the stage's own learning rate first), with
    their values and c_ref: the usual causes of a divergence."""
    values = flatten(config.to_dict())
    keys = ["online.lr" if stage == "online" else "optim.lr"] + [key for key in SUSPECTS if not key.endswith(".lr")]
    return ", ".join([f"{key}={values[key]}" for key in keys] + [f"c_ref={c_ref}"])


def check_losses(losses: np.ndarray, where: str, first_step: int, config, c_ref: float, stage: str,
                 batch_episodes=None) -> None:
    """Raises NonFiniteError at the first non-finite loss of `losses` (per step, steps first_step + 1, ...), naming
    the step, the episodes of its batch (`batch_episodes(i)`, when the batch is known) and, when it diverged at the
    stage's very first step, the settings: before any update could drift they are as suspect as the data."""
    bad = np.flatnonzero(~np.isfinite(np.asarray(losses)))
    if not bad.size:
        return
    i = int(bad[0])
    step = first_step + i + 1
    held = ""
    if batch_episodes is not None:
        episodes = batch_episodes(i)
        held = f"; the batch held episodes {episodes[:10]}{' ...' if len(episodes) > 10 else ''}"
    blame = f"; at the stage's first step: suspect the config ({suspects(config, c_ref, stage)})" if step == 1 else ""
    raise NonFiniteError(f"{where}: non-finite loss {losses[i]} at step {step}{held}{blame}")


def check_params(state: TrainState, where: str, when: str, config, c_ref: float, stage: str) -> None:
    """Raises NonFiniteError when `state`'s parameters hold NaN or inf (every loss finite, yet the last update
    overflowed): saved, they would route on NaN."""
    bad = checkpointing.non_finite_leaves(state.params)
    if bad:
        raise NonFiniteError(f"{where}: the parameters {bad[:3]}{' ...' if len(bad) > 3 else ''} hold NaN or inf "
                             f"{when}; nothing of it was saved. Suspect the config: {suspects(config, c_ref, stage)}")


# --------------------------------------------------------------------------------------------- offline books


def kept_period(config, stage: str) -> int | None:
    """TD checkpoints at multiples of `config.deploy.keep_td_every` epochs are kept for the validated choice."""
    every = config.get("deploy", {}).get("keep_td_every", 0) if stage == "td" else 0
    return int(every) or None


@dataclasses.dataclass
class StageRun:
    """One run's side of an offline stage (MC or TD): where it resumes from, its start, checkpoints and logs."""

    config: ml_collections.ConfigDict
    workdir: Path
    stage: str
    prepared: PreparedData
    checkpoints: checkpointing.StageCheckpoints
    # The previous stage's last parameters where this process has just trained them (its checkpoint holds the same
    # numbers): a new stage starts from them instead of reading them back (0.4 s for RouteSim's small router).
    handed: Any = None

    @classmethod
    def open(cls, config, workdir: str | Path, stage: str, prepared: PreparedData,
             handed: Any = None) -> "StageRun":
        if stage not in OFFLINE_STAGES:
            raise ValueError(f"unknown stage {stage!r}; known: {OFFLINE_STAGES}")
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        checkpoints = checkpointing.StageCheckpoints(workdir, stage, max_to_keep=config.checkpoints_to_keep,
                                                     repair=True, keep_period=kept_period(config, stage))
        if checkpoints.latest_epoch() is not None:  # a resume, or a finished stage: either way the same run
            check_resume(checkpoints.restore_meta(), config, prepared, stage, str(checkpoints.directory))
        return cls(config, workdir, stage, prepared, checkpoints, handed)

    @property
    def epochs(self) -> int:
        return stage_epochs(self.config, self.stage)

    def resume_epoch(self) -> int:
        return self.checkpoints.latest_epoch() or 0

    def start(self, net: RivetNet, tx, mesh=None) -> TrainState:
        """The state after `resume_epoch()` epochs: restored from this stage's checkpoint, or a new stage's start
        (MC from initialisation; TD from the finished MC stage, fresh optimizer, target = online)."""
        template = template_state(self.config.seed, net, tx, int(self.prepared.data.embeddings.shape[1]),
                                  self.prepared.pool, self.stage)
        resume = self.checkpoints.latest_epoch()
        if resume is not None:
            logging.info("Resuming stage %s from %s after epoch %d/%d", self.stage, self.checkpoints.directory,
                         resume, self.epochs)
            return restore_state(self.checkpoints, template, resume, mesh)
        if self.config.get("warm_start") and self.stage == stages_of(self.config)[0]:
            return init_train_state(net, tx, warm_params(self.config, self.prepared, template.params), template.key)
        if self.stage == "mc":
            return template
        params = self.handed if self.handed is not None else finished_params(self.config, self.workdir, self.stage,
                                                                             self.prepared, template, mesh)
        return init_train_state(net, tx, params, template.key)

    def end_epoch(self, state: TrainState, metrics: dict, batches: np.ndarray, seconds: float, epoch: int,
                  saves: checkpointing.BackgroundSaves | None = None) -> dict:
        """After epoch `epoch` (0-based) of `metrics` (per step, numpy): the non-finite checks (losses, then
        parameters), the checkpoint, and the metrics.jsonl record (written after the save: a logged epoch is never
        lost to a kill). With `saves` both land in its background thread (`state`: this run's own arrays, which no
        later update donates)."""
        first_step = int(state.step) - len(metrics["loss"])
        replay = self.prepared.replay
        where, c_ref = f"stage {self.stage}", self.prepared.c_ref
        check_losses(metrics["loss"], where, first_step, self.config, c_ref, self.stage,
                     lambda i: sorted({replay.episode_ids[e] for e in replay.episode[np.asarray(batches[i])]}))
        check_params(state, where, f"after epoch {epoch + 1} (step {int(state.step)})", self.config, c_ref,
                     self.stage)
        record = {"stage": self.stage, "epoch": epoch + 1, "epochs": self.epochs, "step": int(state.step),
                  **{k: float(np.mean(v)) for k, v in metrics.items()},
                  "steps_per_s": len(metrics["loss"]) / seconds, "seconds": seconds}
        checkpointed = (epoch + 1) % self.config.checkpoint_every_epochs == 0 or epoch + 1 == self.epochs
        meta = checkpoint_meta(self.config, self.prepared, self.stage) if checkpointed else None  # the config's JSON

        def save() -> None:
            if checkpointed:
                self.checkpoints.save(epoch + 1, saveable(state), meta)
            if jax.process_index() == 0:  # one record per epoch, not one per host
                with open(self.workdir / "metrics.jsonl", "a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")

        if saves is None:
            save()
        else:
            saves.submit(save)
        return record

    def close(self) -> None:
        self.checkpoints.close()
