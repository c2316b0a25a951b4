"""Many training runs as one program: seeds and same-shaped variants step together under `jax.vmap`.

A reproduction trains one network per (variant, seed): RIVET and its ablations at every seed, and RIVET at every
other lambda. Those runs differ in values, not in shapes:

    seed                initialisation and shuffles       each run's TrainState, stacked on a leading run axis R
    loss.alpha, beta    the weights of Eq. 7 and 11       `LossWeights` of (R,) arrays
    loss.zero_response  RIVE's input scaled by 0 or 1     `LossWeights.response`
    reward.lam          rewards and returns (Eq. 1-2)     reward and mc_return columns (R, N)

so one jit'ed program runs an epoch of all of them (the purejaxrl recipe): one compile instead of R. On a GPU or
TPU the runs are vmapped into every step (R small updates become one); on a CPU, where one update is already
compute-bound (27 vmapped runs measured 0.8x one run's steps/s on 2 cores, `launch.benchmark`), the program runs
them one after another (`config.runs_vmapped`, `learner.runs_vmapped`). Every run keeps its own workdir, resume
point, checkpoints and metrics.jsonl through `train.StageRun`, exactly as a solo run (`train.train`) does; its
parameters equal the solo run's to float tolerance (vmapped matmuls may round differently). Runs whose other
settings differ (widths, epochs, batch size, ...) form separate groups. The online stage then adapts the runs in
lockstep (`online.run_online_group`: one batched rollout per trajectory, the updates of each step in chunks).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from rivet_jax import online, sharding, train
from rivet_jax.config_checks import check_config
from rivet_jax.corpus import PreparedData, TrainData, gather_batch, prepare_data
from rivet_jax.learner import (RunValues, TrainState, grouped, make_optimizer, make_update, run_values, runs_vmapped,
                               shape_signature, stack, unstack, with_run_rewards)
from rivet_jax.networks import RivetNet, make_network
from rivet_jax.workdir_lock import hold_workdirs

def make_group_epoch(net: RivetNet, tx, config, stage: str) -> Callable:
    """jit'ed (states (R, ...), data, values, epoch) -> (states, per-step metrics (R, S), batches (R, S, B)).

    Each run draws its epoch's shuffle from its own stage key, as `train.make_train_epoch` does, and reads the
    shared replay with its own rewards and loss weights. `runs_vmapped(config)` runs are vmapped into each step
    (`lax.map`'s batch size); the rest of the group runs after them inside the same program."""
    update = make_update(net, tx, config, stage)
    batch_size = config.optim.batch_size

    @functools.partial(jax.jit, donate_argnums=0)
    def group_epoch(states: TrainState, data: TrainData, values: RunValues, epoch: jax.Array):
        def run_epoch(run: tuple[TrainState, RunValues]):  # one run's whole epoch
            state, own = run
            batches = sharding.epoch_batches(jax.random.fold_in(state.key, epoch), data.num_transitions, batch_size)

            def step(s: TrainState, idx: jax.Array):
                return update(s, with_run_rewards(gather_batch(data, idx), own, idx), data.cards(), own.weights)

            state, metrics = jax.lax.scan(step, state, batches)
            return state, metrics, batches

        return jax.lax.map(run_epoch, (states, values), batch_size=runs_vmapped(config))

    return group_epoch


def train_together(runs: Sequence[train.StageRun], on_epoch_end: Callable | None = None) -> None:
    """Steps `runs` (one stage, one shape signature, one resume epoch) to the stage's end as one program."""
    config, stage = runs[0].config, runs[0].stage
    net, tx = make_network(config), make_optimizer(config)
    states = stack([run.start(net, tx) for run in runs])
    values = run_values([run.config for run in runs], [run.prepared.data.replay for run in runs])
    data = runs[0].prepared.data
    group_epoch = make_group_epoch(net, tx, config, stage)
    for epoch in range(runs[0].resume_epoch(), runs[0].epochs):
        started = time.perf_counter()
        states, metrics, batches = group_epoch(states, data, values, jnp.asarray(epoch, jnp.int32))
        metrics, batches = jax.device_get((metrics, batches))
        seconds = time.perf_counter() - started
        records = [run.end_epoch(unstack(states, r), {k: v[r] for k, v in metrics.items()}, batches[r],
                                 seconds, epoch, log=False) for r, run in enumerate(runs)]
        logging.info("%s epoch %d/%d of %d runs together: loss %.4f (%.4f-%.4f)  %.0f steps/s per run, "
                     "%.0f run-steps/s", stage, epoch + 1, runs[0].epochs, len(runs),
                     np.mean([r["loss"] for r in records]), min(r["loss"] for r in records),
                     max(r["loss"] for r in records), records[0]["steps_per_s"],
                     records[0]["steps_per_s"] * len(runs))
        if on_epoch_end is not None:
            on_epoch_end(stage, epoch + 1, records)


def offline_groups(runs: Sequence[train.StageRun]) -> list[list[train.StageRun]]:
    """`runs` of one stage split into what can step together: same shape signature and resume epoch (a kill
    between two runs' saves leaves them an epoch apart), finished runs left out."""
    pending = [run for run in runs if run.resume_epoch() < run.epochs]
    return grouped(pending, key=lambda run: (shape_signature(run.config), run.resume_epoch()))


def prepare_all(configs: Sequence, workdirs: Sequence[Path]) -> list[PreparedData]:
    """Each run's corpus, read once per distinct lambda (runs differ only in rewards and returns) with one c_ref."""
    by_lambda: dict[float, PreparedData] = {}
    prepared = []
    for config, workdir in zip(configs, workdirs):
        lam = float(config.reward.lam)
        if lam not in by_lambda:
            by_lambda[lam] = prepare_data(config, workdir, c_ref=train.stored_c_ref(workdir))
        prepared.append(by_lambda[lam])
    c_refs = {p.c_ref for p in by_lambda.values()}
    if len(c_refs) > 1:
        raise ValueError(f"runs of one group must share c_ref; their workdirs fixed {sorted(c_refs)}")
    return prepared


def train_group(configs: Sequence, workdirs: Sequence[str | Path], on_epoch_end: Callable | None = None) -> None:
    """Trains (or resumes) run i = (configs[i], workdirs[i]) through the stages of its `config.stage`, like
    `train.train` would one by one: the offline stages as vmapped groups, then the online stage in lockstep groups.

    `on_epoch_end(stage, epoch, records)` follows every offline group epoch (the online stage logs a line per
    validation round).
    """
    for config in configs:
        check_config(config)
    workdirs = [Path(w) for w in workdirs]
    stages = [train.stages_of(config) for config in configs]
    with hold_workdirs(workdirs):  # every run's workdir, for the whole group: a second job on any is refused
        prepared = prepare_all(configs, workdirs)
        for stage in train.OFFLINE_STAGES:
            runs = [train.StageRun.open(configs[i], workdirs[i], stage, prepared[i])
                    for i in range(len(configs)) if stage in stages[i]]
            for group in offline_groups(runs):
                train_together(group, on_epoch_end)
            for run in runs:
                run.close()
        adapting = [i for i in range(len(configs)) if "online" in stages[i]]
        for members in grouped(adapting, key=lambda i: shape_signature(configs[i])):
            online.run_online_group([configs[i] for i in members], [workdirs[i] for i in members],
                                    online.online_env(configs[members[0]]), [prepared[i] for i in members])
