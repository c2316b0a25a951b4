"""The stages: epoch engines that feed `learner.make_update`, stage resume and checkpoints, the stage registry.

    MC warm start   L_MC = L_fit(G_t)                                    (Eq. 7 with Z = G_t)
    TD refinement   L_TD = L_fit(Y_t) + alpha L_CQL                      (Eqs. 8-11, Double DQN + CQL)
    online          registered by `rivet_jax.online` (it acts in an environment)

A whole epoch runs inside one `lax.scan` (no Python per step); the epoch's shuffle comes from
`fold_in(stage key, epoch)`, so an epoch is a pure function of (state, data, epoch) and a run resumed from an
epoch checkpoint ends with exactly the parameters of an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from rivet_jax import checkpointing, run_identity, sharding
from rivet_jax.config_checks import ConfigError, check_config
from rivet_jax.corpus import PreparedData, TrainData, gather_batch, prepare_data
from rivet_jax.learner import (NonFiniteLossError, TrainState, from_saveable, init_train_state, make_optimizer,
                               make_update, saveable, template_state)
from rivet_jax.networks import RivetNet, make_network
from rivet_jax.workdir_lock import hold_workdir

OFFLINE_STAGES = ("mc", "td")                    # the stages of this module, in training order
ROUTER_STAGES = checkpointing.ROUTER_STAGES      # every stage whose checkpoint is a router: mc, td, online

# A stage runner: (config, workdir, stage, prepared data, on_epoch_end) -> the stage's final TrainState.
StageRunner = Callable[..., TrainState]
_RUNNERS: dict[str, StageRunner] = {}


def register_stage(name: str, runner: StageRunner) -> None:
    """Makes `name` a stage `train` can run; the online stage registers itself when `rivet_jax.online` is imported."""
    _RUNNERS[name] = runner


# ---------------------------------------------------------------------------------------------------- epochs


def make_train_step(net: RivetNet, tx, config, stage: str, mesh=None) -> Callable:
    """One gradient update on the transitions `idx`: (state, data, idx) -> (state, metrics). Not jit'ed here.

    With a multi-device `mesh` the gathered batch is split over its devices (data parallelism).
    """
    update = make_update(net, tx, config, stage)

    def train_step(state: TrainState, data: TrainData, idx: jax.Array):
        batch = gather_batch(data, idx)
        if mesh is not None and mesh.size > 1:
            batch = sharding.shard_batch(batch, mesh)
        return update(state, batch, data.cards())

    return train_step


def make_train_epoch(net: RivetNet, tx, config, stage: str, mesh=None) -> Callable:
    """jit'ed (state, data, epoch) -> (state, per-step metrics, batches) over device-resident data, state donated."""
    train_step = make_train_step(net, tx, config, stage, mesh)
    batch_size = config.optim.batch_size

    @functools.partial(jax.jit, donate_argnums=0)
    def train_epoch(state: TrainState, data: TrainData, epoch: jax.Array):
        batches = sharding.epoch_batches(jax.random.fold_in(state.key, epoch), data.num_transitions, batch_size)
        state, metrics = jax.lax.scan(lambda s, idx: train_step(s, data, idx), state, batches)
        return state, metrics, batches

    return train_epoch


def make_train_chunk(net: RivetNet, tx, config, stage: str) -> Callable:
    """jit'ed (state, batches (K, B, ...), cards) -> (state, per-step metrics): K gathered batches in one scan."""
    update = make_update(net, tx, config, stage)

    @functools.partial(jax.jit, donate_argnums=0)
    def train_chunk(state: TrainState, batches: dict, cards):
        return jax.lax.scan(lambda s, batch: update(s, batch, cards), state, batches)

    return train_chunk


def make_host_fed_epoch(net: RivetNet, tx, config, stage: str, mesh) -> Callable:
    """(state, data, epoch) -> (state, per-step metrics, this host's batches) over host-resident data.

    Each process shuffles its own replay slice (the same indices `make_train_epoch` draws when there is one
    process), gathers `config.data.host_chunk_steps` batches at a time with numpy (from a memory-mapped table that
    need not fit in memory), and runs them as one jit'ed `lax.scan` on the global batches its rows are part of.
    Dispatch is asynchronous, so the host gathers the next chunk while the devices run this one.
    """
    batch_size, chunk = config.optim.batch_size, config.data.host_chunk_steps
    num_slices, slice_index = jax.process_count(), jax.process_index()
    shuffle = jax.jit(sharding.epoch_batches, static_argnums=(1, 2, 3, 4))
    train_chunk = make_train_chunk(net, tx, config, stage)

    def train_epoch(state: TrainState, data: TrainData, epoch: jax.Array):
        # Shuffled on this host alone, from the stage key every process holds.
        key = jax.random.wrap_key_data(np.asarray(jax.random.key_data(state.key)))
        batches = np.asarray(shuffle(jax.random.fold_in(key, epoch), data.num_transitions, batch_size, num_slices,
                                     slice_index))                                   # (S, B / processes)
        state, metrics = run_host_batches(train_chunk, state, data, batches, mesh, chunk)
        return state, metrics, batches

    return train_epoch


def run_host_batches(train_chunk: Callable, state: TrainState, data: TrainData, batches: np.ndarray, mesh,
                     chunk: int) -> tuple[TrainState, dict]:
    """Runs the host batches (S, b) through `train_chunk`, `chunk` steps per call; per-step metrics as numpy."""
    # Placed on the mesh up front: the outputs are, and a placed and an unplaced state would compile twice.
    state = sharding.replicate(state, mesh)
    cards = sharding.replicate(tuple(np.asarray(c, np.float32) for c in data.cards()), mesh)
    metrics = []
    for start in range(0, len(batches), chunk):
        local = gather_batch(data, batches[start:start + chunk])                    # (K, b, ...)
        state, chunk_metrics = train_chunk(state, sharding.global_batches(local, mesh), cards)
        metrics.append(chunk_metrics)
    return state, jax.tree.map(lambda *m: np.concatenate([np.asarray(x) for x in m]), *metrics)


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


@dataclasses.dataclass
class StageRun:
    """One run's side of an offline stage: where it resumes from, checkpoints and logs. A solo run (`run_stage`)
    and every run of a vmapped group (`rivet_jax.run_group`) keep their books through it, so both write the same
    checkpoints and metrics."""

    config: ml_collections.ConfigDict
    workdir: Path
    stage: str
    prepared: PreparedData
    checkpoints: checkpointing.StageCheckpoints

    @classmethod
    def open(cls, config, workdir: str | Path, stage: str, prepared: PreparedData) -> "StageRun":
        if stage not in OFFLINE_STAGES:
            raise ValueError(f"unknown stage {stage!r}; known: {OFFLINE_STAGES}")
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        checkpoints = checkpointing.StageCheckpoints(workdir, stage, max_to_keep=config.checkpoints_to_keep,
                                                     repair=True)
        if checkpoints.latest_epoch() is not None:  # a resume, or a finished stage: either way the same run
            check_resume(checkpoints.restore_meta(), config, prepared, stage, str(checkpoints.directory))
        return cls(config, workdir, stage, prepared, checkpoints)

    @property
    def epochs(self) -> int:
        return {"mc": self.config.mc_epochs, "td": self.config.td_epochs}[self.stage]

    def resume_epoch(self) -> int:
        return self.checkpoints.latest_epoch() or 0

    def start(self, net: RivetNet, tx, mesh=None) -> TrainState:
        """The state after `resume_epoch()` epochs: restored from this stage's checkpoint, or a new stage's start
        (MC from initialisation; TD from the finished MC stage, fresh optimizer, target = online)."""
        resume = self.checkpoints.latest_epoch()
        if resume is not None:
            logging.info("Resuming stage %s from %s after epoch %d/%d", self.stage, self.checkpoints.directory,
                         resume, self.epochs)
            return self._restore(self.checkpoints, self.stage, resume, net, tx, mesh)
        template = self._template(net, tx, self.stage)
        if self.stage == "mc":
            return template
        previous = checkpointing.StageCheckpoints(self.workdir, "mc")
        done = previous.latest_epoch()
        if done is None or done < self.config.mc_epochs:
            raise FileNotFoundError(f"stage 'td' starts from a finished 'mc' stage, but {previous.directory} has "
                                    f"{'no checkpoint' if done is None else f'{done}/{self.config.mc_epochs} epochs'}"
                                    f": run --config.stage=mc first")
        check_resume(previous.restore_meta(done), self.config, self.prepared, self.stage, str(previous.directory))
        mc_state = self._restore(previous, "mc", done, net, tx, mesh)
        return init_train_state(net, tx, mc_state.params, template.key)

    def _template(self, net: RivetNet, tx, stage: str) -> TrainState:
        return template_state(self.config, net, tx, int(self.prepared.data.embeddings.shape[1]), self.prepared.pool,
                              stage)

    def _restore(self, checkpoints, stage: str, epoch: int, net, tx, mesh=None) -> TrainState:
        """The checkpoint of `epoch` (checked against this run by `check_resume`); with a multi-device `mesh`, orbax
        restores every leaf straight onto the mesh, replicated (whatever device count saved it)."""
        target = saveable(self._template(net, tx, stage))
        placed = mesh is not None and mesh.size > 1
        if placed:
            target = checkpointing.abstract_tree(target, sharding.replicated(mesh))
        restored, _ = checkpoints.restore(target, epoch=epoch)
        return from_saveable(restored, placed=placed)

    def end_epoch(self, state: TrainState, metrics: dict, batches: np.ndarray, seconds: float, epoch: int,
                  log: bool = True) -> dict:
        """After epoch `epoch` (0-based) of `metrics` (per step, numpy): the NaN checks (losses, then parameters),
        the checkpoint, the log line and metrics.jsonl record (written after the save: a logged epoch is never lost
        to a kill)."""
        first_step = int(state.step) - len(metrics["loss"])
        _check_finite(metrics, batches, self.prepared, self.config, self.stage, first_step)
        bad = checkpointing.non_finite_leaves(state.params)
        if bad:  # every loss finite, yet the last update overflowed: saved, it would route on NaN
            raise checkpointing.NonFiniteParamsError(
                f"stage {self.stage}: the parameters {bad[:3]}{' ...' if len(bad) > 3 else ''} hold NaN or inf after "
                f"epoch {epoch + 1} (step {int(state.step)}); nothing of the epoch was saved. Suspect the config: "
                f"{suspects(self.config, self.prepared)}")
        record = {"stage": self.stage, "epoch": epoch + 1, "epochs": self.epochs, "step": int(state.step),
                  **{k: float(np.mean(v)) for k, v in metrics.items()},
                  "steps_per_s": len(metrics["loss"]) / seconds, "seconds": seconds}
        if (epoch + 1) % self.config.checkpoint_every_epochs == 0 or epoch + 1 == self.epochs:
            self.checkpoints.save(epoch + 1, saveable(state), checkpoint_meta(self.config, self.prepared, self.stage))
        if jax.process_index() == 0:  # one record per epoch, not one per host
            _log_epoch(self.workdir, record, log)
        return record

    def close(self) -> None:
        self.checkpoints.close()


def _log_epoch(workdir: Path, record: dict, log: bool = True) -> None:
    if log:
        logging.info("%s epoch %d/%d  step %d  loss %.4f  fit %.4f  cql %.4f  Q %.3f  target %.3f  %.0f steps/s",
                     record["stage"], record["epoch"], record["epochs"], record["step"], record["loss"],
                     record["fit"], record["cql"], record["q_taken"], record["target"], record["steps_per_s"])
    with open(workdir / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def suspects(config, prepared: PreparedData) -> str:
    """The settings that scale a loss or a step, with their values: the usual causes of a divergence."""
    return (f"optim.lr={config.optim.lr}, reward.lam={config.reward.lam}, reward.gamma={config.reward.gamma}, "
            f"c_ref={prepared.c_ref}, loss.alpha={config.loss.alpha}, loss.beta={config.loss.beta}, "
            f"optim.clip_norm={config.optim.clip_norm}")


def _check_finite(metrics: dict, batches: np.ndarray, prepared: PreparedData, config, stage: str, first_step: int):
    loss = np.asarray(metrics["loss"])
    bad = np.flatnonzero(~np.isfinite(loss))
    if bad.size:
        i = int(bad[0])
        step = first_step + i + 1
        episodes = sorted({prepared.replay.episode_ids[e] for e in prepared.replay.episode[np.asarray(batches[i])]})
        # Diverged at once, before this stage's updates could drift: the settings are as suspect as the data.
        blame = f"; at the stage's first step: suspect the config ({suspects(config, prepared)})" if step == 1 else ""
        raise NonFiniteLossError(f"stage {stage}: non-finite loss {loss[i]} at step {step}; the batch held episodes "
                                 f"{episodes[:10]}{' ...' if len(episodes) > 10 else ''}{blame}")


def run_stage(config, workdir: str | Path, stage: str, prepared: PreparedData | None = None,
              on_epoch_end: Callable[[str, int, dict], None] | None = None) -> TrainState:
    """Runs (or resumes) one stage to `config.<stage>_epochs`, checkpointing every `checkpoint_every_epochs`.

    `on_epoch_end(stage, epoch, record)` is called after each epoch's checkpoint and log line (progress hooks).
    """
    if prepared is None:
        prepared = prepare_data(config, workdir, c_ref=stored_c_ref(workdir))
    run = StageRun.open(config, workdir, stage, prepared)
    net, tx = make_network(config), make_optimizer(config)
    mesh = sharding.make_mesh(config.devices)
    sharding.check_divisible(config.optim.batch_size, mesh)
    state = run.start(net, tx, mesh)
    data = prepared.data
    if data.on_host:  # batches gathered on each host and fed to the mesh (see make_host_fed_epoch)
        train_epoch = make_host_fed_epoch(net, tx, config, stage, mesh)
    else:  # data parallel on one host: replicate state and replay, shard each batch (see rivet_jax/sharding.py)
        train_epoch = make_train_epoch(net, tx, config, stage, mesh)
        if mesh.size > 1:
            data = sharding.replicate(data, mesh)
    if mesh.size > 1:
        state = sharding.replicate(state, mesh)
    for epoch in range(run.resume_epoch(), run.epochs):
        started = time.perf_counter()
        state, metrics, batches = train_epoch(state, data, jnp.asarray(epoch, jnp.int32))
        metrics = jax.device_get(metrics)
        record = run.end_epoch(state, metrics, batches, time.perf_counter() - started, epoch)
        if on_epoch_end is not None:
            on_epoch_end(stage, epoch + 1, record)
    run.close()
    return state


def stages_of(config) -> tuple[str, ...]:
    """The stages `config.stage` names, in training order: 'mc', 'td', 'online', 'offline' (mc, td) or 'all'."""
    stages = {"offline": OFFLINE_STAGES, "all": ROUTER_STAGES}.get(config.stage, (config.stage,))
    if any(s not in ROUTER_STAGES for s in stages):
        raise ConfigError(f"unknown stage {config.stage!r}; known: {ROUTER_STAGES + ('offline', 'all')}")
    return stages


def stage_runner(stage: str) -> StageRunner:
    if stage == "online" and stage not in _RUNNERS:
        importlib.import_module("rivet_jax.online")  # registers itself; it imports this module, so not at the top
    if stage not in _RUNNERS:
        raise ValueError(f"stage {stage!r} is not registered: `import rivet_jax.online` registers it")
    return _RUNNERS[stage]


def train(config, workdir: str | Path, on_epoch_end=None) -> TrainState:
    """The launcher's entry point: trains the stages of `config.stage` (see `stages_of`) in `workdir`.

    'online' needs an environment to act in (the RouteSim of `config.sim`, configs/routesim.py) and is run by
    `rivet_jax.online`, which registers it here when imported. Many same-shaped runs train faster together:
    `rivet_jax.run_group.train_group`. The workdir is held for the whole run (`workdir_lock`): a second run on it
    is refused at once.
    """
    check_config(config)
    runners = [(stage, stage_runner(stage)) for stage in stages_of(config)]
    workdir = Path(workdir)
    with hold_workdir(workdir):
        prepared = prepare_data(config, workdir, c_ref=stored_c_ref(workdir))
        state = None
        for stage, runner in runners:
            state = runner(config, workdir, stage, prepared, on_epoch_end)
    return state


register_stage("mc", run_stage)
register_stage("td", run_stage)
