"""The offline engine: the MC and TD epochs of a run group, one compiled program per stage, on any device mesh.

    MC warm start   L_MC = L_fit(G_t)                                    (Eq. 7 with Z = G_t)
    TD refinement   L_TD = L_fit(Y_t) + alpha L_CQL                      (Eqs. 8-11, Double DQN + CQL)

A run group is the unit; one run is a group of one. The runs of a group differ in values, not in shapes:

    seed                initialisation and shuffles       each run's TrainState, stacked on a leading run axis R
    loss.alpha, beta    the weights of Eq. 7 and 11       `LossWeights` of (R,) arrays
    loss.zero_response  RIVE's input scaled by 0 or 1     `LossWeights.response`
    reward.lam          rewards and returns (Eq. 1-2)     reward and mc_return columns (R, N)

so one jit'ed program runs an epoch of all of them: one compile instead of R (on a CPU, where the runs step
separately, one program for a single run serves them all, as many at once as there are cores, and every group
size: `runs_in_turn`; compiled ahead, from the corpus's shapes while the corpus embeds: `ProgramsAhead`). A
whole epoch runs inside one `lax.scan` (no Python per step); each run's shuffle comes from `fold_in(its stage key,
epoch)`, so an epoch is a pure function of (states, data, epoch) and a run resumed from an epoch checkpoint ends
with exactly the parameters of an uninterrupted one.

Where the work goes (`sharding.py`): on a mesh of N devices the runs split over `runs_axis_size(R, N)` shards and
every run's batch over the remaining devices (one run: pure data parallelism). Within a shard, a CPU runs each
run's own program, one per core at a time (`learner.runs_vmapped`: 27 vmapped runs measured 0.8x one run's
steps/s on 2 cores; `in_threads`), and an accelerator vmaps them into every step. Two ways to feed the update,
chosen by where `TrainData` lives:

- device-resident: the replay and the embedding table are jax arrays (replicated over the mesh); an epoch is one
  jit call that shuffles, gathers and scans.
- host-fed (`config.data.embeddings_on_disk`, or any multi-process run): every process shuffles its own replay slice
  per run, gathers `config.data.host_chunk_steps` batches of every run with numpy (from a memory map that need not
  fit in memory) and passes them through `sharding.global_batches` into one jit'ed scan. The runs stay whole on
  every device there; the batch axis splits over all of them.

Every run keeps its own workdir, resume point, checkpoints and metrics.jsonl through `stage_run.StageRun`.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import time
from typing import Callable, Sequence, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from rivet_jax import checkpointing, sharding
from rivet_jax.corpus import TrainData, gather_batch
from rivet_jax.learner import (RunValues, TrainState, grouped, make_optimizer, make_update, run_values, runs_vmapped,
                               shape_signature, stack, template_state, unstack, with_run_rewards)
from rivet_jax.networks import RivetNet, make_network
from rivet_jax.progress import Progress
from rivet_jax.settings import LossWeights, Optim, UpdateRule
from rivet_jax.stage_run import StageRun

T = TypeVar("T")


def make_train_step(net: RivetNet, tx, config, stage: str, mesh=None) -> Callable:
    """One gradient update on the transitions `idx`: (state, data, idx[, values]) -> (state, metrics). Not jit'ed.

    `values` (one run's `RunValues`) give its rewards and loss weights; without them the replay's own rewards and
    `config.loss`'s weights. With a multi-device `mesh` the batch is split over its `data` axis."""
    update = make_update(net, tx, UpdateRule.of(config), stage)
    own_weights = LossWeights.of(config)
    split = mesh is not None and mesh.shape[sharding.DATA] > 1

    def train_step(state: TrainState, data: TrainData, idx: jax.Array, values: RunValues | None = None):
        batch = gather_batch(data, idx)
        if values is not None:
            batch = with_run_rewards(batch, values, idx)
        if split:
            batch = sharding.shard_batch(batch, mesh)
        return update(state, batch, data.cards(), own_weights if values is None else values.weights)

    return train_step


def runs_per_step(config) -> int | None:
    """`lax.map`'s batch size over a group's runs for `config.runs_vmapped` (`learner.runs_vmapped`)."""
    return runs_vmapped(config.get("runs_vmapped", -1))


def over_runs(config, mesh, run_fn: Callable, runs) -> tuple:
    """`run_fn` applied to every run of the stacked `runs`: vmapped with the run axis split over the mesh's `runs`
    shards, or within one shard as `lax.map` (`config.runs_vmapped` runs per step; a CPU one after another)."""
    if mesh is not None and mesh.shape[sharding.RUNS] > 1:
        return jax.vmap(run_fn, spmd_axis_name=sharding.RUNS)(*runs)
    return jax.lax.map(lambda r: run_fn(*r), runs, batch_size=runs_per_step(config))


def runs_in_turn(config, mesh=None) -> bool:
    """Whether a group's runs step one after another in one shard (`runs_vmapped` 1, a CPU's default)."""
    return runs_per_step(config) is None and (mesh is None or mesh.shape[sharding.RUNS] == 1)


def make_run_epoch(net: RivetNet, tx, config, stage: str, mesh=None) -> Callable:
    """(state, own values, data, epoch) -> (state, per-step metrics (S,), batches (S, B)): one run's epoch over
    device-resident data, shuffled by its own key. Not jit'ed."""
    train_step = make_train_step(net, tx, config, stage, mesh)
    batch_size = config.optim.batch_size

    def run_epoch(state: TrainState, own: RunValues, data: TrainData, epoch: jax.Array):
        batches = sharding.epoch_batches(jax.random.fold_in(state.key, epoch), data.num_transitions, batch_size)
        state, metrics = jax.lax.scan(lambda s, idx: train_step(s, data, idx, own), state, batches)
        return state, metrics, batches

    return run_epoch


def make_group_epoch(net: RivetNet, tx, config, stage: str, mesh=None) -> Callable:
    """(states (R, ...), data, values, epoch) -> (states, per-step metrics (R, S), batches (R, S, B)) over
    device-resident data, states donated: one jit'ed program for the group, or, where its runs step one after
    another (`runs_in_turn`), one program for a run called for each in turn. That is the same arithmetic as the
    group program's sequential `lax.map` (bit for bit, tests/test_run_group.py) and one compile for every group
    size: a job's groups of 2, 4 and 8 runs compiled three programs per stage."""
    run_epoch = make_run_epoch(net, tx, config, stage, mesh)
    if runs_in_turn(config, mesh):
        return _in_turn(jax.jit(run_epoch, donate_argnums=0), side_by_side(mesh))

    @functools.partial(jax.jit, donate_argnums=0)
    def group_epoch(states: TrainState, data: TrainData, values: RunValues, epoch: jax.Array):
        return over_runs(config, mesh, lambda s, v: run_epoch(s, v, data, epoch), (states, values))

    return group_epoch


def cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def side_by_side(mesh) -> bool:
    """Whether runs' programs may run at once (`in_threads`): on one device of one process. Programs over several
    devices meet in collectives, which programs interleaved across threads could leave waiting on each other."""
    return (mesh is None or mesh.size == 1) and jax.process_count() == 1


def in_threads(work: Callable[[int], T], count: int, threads: bool = True) -> list[T]:
    """[work(0), ..., work(count - 1)], as many at a time as there are cores (`work` blocks until its programs are
    done; `threads` False: one after another). One small run's program keeps about 1.35 of 2 cores busy (its ops
    are too small to split well); two at once fill them: 1.4x the steps per second on 2 cores (a RouteSim group of
    4 runs' MC and TD epochs). XLA's intra-op pool splits every op the same way whichever thread calls it, so each
    run's arithmetic, and its result, is bit for bit the same as one after another (tests/test_run_group.py)."""
    if count <= 1 or cores() == 1 or not threads:
        return [work(i) for i in range(count)]
    with concurrent.futures.ThreadPoolExecutor(min(count, cores())) as pool:
        return list(pool.map(work, range(count)))


def _in_turn(run_epoch: Callable, threads: bool) -> Callable:
    """A group epoch from a jit'ed one-run epoch (its `program`): each run's state and values taken from the
    stacked ones and stepped (`in_threads`: with `threads`, as many runs at once as there are cores), and stacked
    again; metrics and batches come back on the host."""
    def group_epoch(states: TrainState, data: TrainData, values: RunValues, epoch: jax.Array):
        num_runs = int(jax.tree.leaves(values)[0].shape[0])
        ended = in_threads(lambda r: jax.block_until_ready(run_epoch(unstack(states, r), unstack(values, r), data,
                                                                     epoch)), num_runs, threads)
        metrics = jax.tree.map(lambda *m: np.stack(m), *[e[1] for e in ended])
        return stack([e[0] for e in ended]), metrics, np.stack([e[2] for e in ended])

    group_epoch.program = run_epoch
    return group_epoch


def one_device(config) -> bool:
    """Whether `config`'s runs train on one device of one process: their states are then plain arrays there, as a
    checkpoint restores them."""
    return len(sharding.mesh_devices(config.devices)) == 1 and side_by_side(None)


def compiles_ahead(config) -> bool:
    """Whether a stage's program can be compiled before its group exists: where runs step in turn on one device
    of one process, it is one run's program (`make_group_epoch`), the same for every group of a shape signature."""
    return runs_in_turn(config) and one_device(config)


class ProgramsAhead:
    """Stages' one-run epoch programs, compiled in a background thread from their inputs' shapes while the main
    thread embeds the corpus and trains the earlier stages. On a CPU compiling a stage's program takes about as long
    as a small run's training (2 s for RouteSim's) and keeps about 1.4 of 2 cores busy; embedding keeps one.
    `train_together` waits for its stage's program here instead of compiling it; one whose compile failed here is
    compiled there as usual. A context manager: leaving it waits for the compile under way and drops the rest."""

    def __init__(self):
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="compile_ahead")
        self._programs: dict[tuple[str, str], concurrent.futures.Future] = {}

    def __enter__(self) -> "ProgramsAhead":
        return self

    def __exit__(self, *exc) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)

    def compile(self, config, stage: str, data: TrainData, pool) -> None:
        """Starts compiling `stage`'s program for `config`'s shape signature on `data` (shapes are enough:
        `corpus.train_data_shapes`), where `compiles_ahead(config)`; once per signature and stage."""
        key = (shape_signature(config), stage)
        if key not in self._programs and compiles_ahead(config):
            self._programs[key] = self._thread.submit(_compiled_epoch, config, stage, data, pool)

    def program(self, config, stage: str) -> Callable | None:
        """The group epoch of `stage` for `config`'s shape signature (`make_group_epoch`), once compiled; None where
        none was started or its compile failed (logged)."""
        future = self._programs.get((shape_signature(config), stage))
        if future is None:
            return None
        try:
            return future.result()
        except Exception as error:  # noqa: BLE001  (the caller compiles it, and any error shows there)
            logging.warning("compiling stage %s ahead failed, compiling it now: %r", stage, error)
            return None


def _compiled_epoch(config, stage: str, data: TrainData, pool) -> Callable:
    """`make_group_epoch` of one device, its one-run program compiled for `data`'s shapes. The state's start is
    made too (`template_state`, stacked and a run taken back): their small programs are then compiled as well."""
    net, tx = make_network(config), make_optimizer(Optim.of(config))
    group_epoch = make_group_epoch(net, tx, config, stage, group_mesh(config, 1, host_fed=False))
    state = unstack(stack([template_state(config.seed, net, tx, data.embeddings.shape[1], pool, stage)]), 0)
    own = jax.eval_shape(lambda replay: unstack(run_values([LossWeights.of(config)], [replay]), 0), data.replay)
    group_epoch.program.lower(shapes(state), own, shapes(data), jax.ShapeDtypeStruct((), jnp.int32)).compile()
    return group_epoch


def shapes(tree):
    """`tree` with every array as its jax.ShapeDtypeStruct."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def make_group_chunk(net: RivetNet, tx, config, stage: str) -> Callable:
    """jit'ed (states, batches (R, K, B, ...), cards, weights (R,)) -> (states, per-step metrics (R, K)): K
    host-gathered batches of every run in one scan."""
    update = make_update(net, tx, UpdateRule.of(config), stage)

    @functools.partial(jax.jit, donate_argnums=0)
    def group_chunk(states: TrainState, batches, cards, weights):
        run_chunk = lambda s, own, b: jax.lax.scan(lambda s_, batch: update(s_, batch, cards, own), s, b)
        return over_runs(config, None, run_chunk, (states, weights, batches))

    return group_chunk


def make_host_fed_group_epoch(net: RivetNet, tx, config, stage: str, mesh) -> Callable:
    """(states, data, values, epoch) -> (states, per-step metrics (R, S), this host's batches (R, S, b)) over
    host-resident data.

    Each process shuffles its own replay slice for every run (the indices `make_group_epoch` draws when there is
    one process), gathers `config.data.host_chunk_steps` batches at a time with numpy, each run's rows with its own
    rewards, and runs them as one jit'ed scan on the global batches its rows are part of. Dispatch is asynchronous,
    so the host gathers the next chunk while the devices run this one, and waits for the one before: at most two
    chunks are held (the 100,000-episode run's peak, where the host outran the devices). On one CPU device the runs
    go through a one-run program side by side (`in_threads`), each with its own chunks."""
    batch_size, chunk = config.optim.batch_size, config.data.host_chunk_steps
    num_slices, slice_index = jax.process_count(), jax.process_index()
    shuffle = jax.jit(sharding.epoch_batches, static_argnums=(1, 2, 3, 4))
    group_chunk = make_group_chunk(net, tx, config, stage)

    def group_epoch(states: TrainState, data: TrainData, values: RunValues, epoch: jax.Array):
        # Shuffled on this host alone, from the stage keys every process holds.
        keys = np.asarray(jax.random.key_data(states.key))
        batches = np.stack([np.asarray(shuffle(jax.random.fold_in(jax.random.wrap_key_data(k), epoch),
                                               data.num_transitions, batch_size, num_slices, slice_index))
                            for k in keys])                                          # (R, S, B / processes)
        states = sharding.replicate(states, mesh)  # the outputs are placed: a placed and an unplaced state would
        cards = sharding.replicate(tuple(np.asarray(c, np.float32) for c in data.cards()), mesh)  # compile twice
        weights = sharding.replicate(values.weights, mesh)
        reward, mc_return, lam = (np.asarray(v) for v in (values.reward, values.mc_return, values.lam))  # (R, N)
        # An epoch over a big corpus takes minutes (the 100,000-episode run's TD epochs: 97 s): a line every 15 s
        progress = Progress(f"{stage} epoch {int(epoch) + 1}, {len(keys)} run(s) (steps)", batches.shape[1],
                            last=False)

        def steps_of(first: int, stop: int) -> tuple[TrainState, dict]:
            """Runs first..stop - 1 through the epoch: their states and per-step metrics (stop - first, S)."""
            own, metrics = jax.tree.map(lambda x: x[first:stop], states), []
            runs = np.arange(first, stop)[:, None, None]
            for start in range(0, batches.shape[1], chunk):
                idx = batches[first:stop, start:start + chunk]                       # (R', K, b)
                local = gather_batch(data, idx)._replace(reward=reward[runs, idx], mc_return=mc_return[runs, idx],
                                                         lam=lam[runs, idx])
                own, chunk_metrics = group_chunk(own, sharding.global_batches(local, mesh, batch_axis=2), cards,
                                                 jax.tree.map(lambda w: w[first:stop], weights))
                metrics.append(chunk_metrics)
                if len(metrics) > 1:  # one chunk in flight: unbounded, dispatch runs ahead and holds every gathered one
                    jax.block_until_ready(metrics[-2])
                    if first == 0:
                        progress.step(chunk)  # the chunk before this one is done
            return own, jax.tree.map(lambda *m: np.concatenate([np.asarray(x) for x in m], axis=1), *metrics)

        if runs_in_turn(config, mesh) and side_by_side(mesh):   # each run alone, side by side
            ended = in_threads(lambda r: jax.block_until_ready(steps_of(r, r + 1)), len(keys))
            return (jax.tree.map(lambda *x: jnp.concatenate(x), *[e[0] for e in ended]),
                    jax.tree.map(lambda *m: np.concatenate(m), *[e[1] for e in ended]), batches)
        states, metrics = steps_of(0, len(keys))
        return states, metrics, batches

    return group_epoch


def group_mesh(config, num_runs: int, host_fed: bool):
    """The mesh a group trains on: its runs split over as many shards as fit (`sharding.runs_axis_size`; host-fed
    runs stay whole), the batch over the rest of `config.devices`."""
    devices = len(sharding.mesh_devices(config.devices))
    mesh = sharding.make_mesh(config.devices, 1 if host_fed else sharding.runs_axis_size(num_runs, devices))
    sharding.check_divisible(config.optim.batch_size, mesh)
    return mesh


def place(states: TrainState, data: TrainData, values: RunValues, mesh) -> tuple:
    """States and values split over the mesh's run shards (or replicated), device-resident data replicated.
    Host-fed: the values stay on this host, where each run's rewards are gathered with its rows."""
    if mesh.size == 1:
        return states, data, values
    if data.on_host:
        return sharding.replicate(states, mesh), data, values
    if mesh.shape[sharding.RUNS] > 1:
        return sharding.shard_runs(states, mesh), sharding.replicate(data, mesh), sharding.shard_runs(values, mesh)
    return sharding.replicate((states, data, values), mesh)


def train_together(runs: Sequence[StageRun], on_epoch_end: Callable | None = None,
                   ahead: ProgramsAhead | None = None) -> TrainState:
    """Steps `runs` (one stage, one shape signature, one resume epoch) to the stage's end as one program; returns
    their stacked final states. `on_epoch_end(stage, epoch, records)` follows every epoch (records: one per run;
    the epoch's checkpoints may still be landing); `ahead`: where the stage's program may have been compiled
    already."""
    config, stage, data = runs[0].config, runs[0].stage, runs[0].prepared.data
    net, tx = make_network(config), make_optimizer(Optim.of(config))
    mesh = group_mesh(config, len(runs), data.on_host)
    # Restored replicated on a data-only mesh (one run's layout); `place` then splits them over the run shards.
    restore_mesh = mesh if mesh.shape[sharding.RUNS] == 1 else None
    states = stack([run.start(net, tx, restore_mesh) for run in runs])
    values = run_values([LossWeights.of(run.config) for run in runs], [run.prepared.data.replay for run in runs])
    states, data, values = place(states, data, values, mesh)
    make_epoch = make_host_fed_group_epoch if data.on_host else make_group_epoch
    compiled = ahead.program(config, stage) if ahead is not None and not data.on_host else None
    group_epoch = compiled or make_epoch(net, tx, config, stage, mesh)
    # Each epoch's checkpoints land while the next epoch trains (one process: see BackgroundSaves); all have landed
    # when this returns or raises (an `on_epoch_end` that raises included).
    saves = checkpointing.BackgroundSaves() if jax.process_count() == 1 else None
    try:
        for epoch in range(runs[0].resume_epoch(), runs[0].epochs):
            started = time.perf_counter()
            states, metrics, batches = group_epoch(states, data, values, jnp.asarray(epoch, jnp.int32))
            metrics, batches = jax.device_get((metrics, batches))
            seconds = time.perf_counter() - started
            records = [run.end_epoch(unstack(states, r), {k: v[r] for k, v in metrics.items()}, batches[r],
                                     seconds, epoch, saves) for r, run in enumerate(runs)]
            _log_group_epoch(records)
            if on_epoch_end is not None:
                on_epoch_end(stage, epoch + 1, records)
    finally:
        if saves is not None:
            saves.close()
    return states


def _log_group_epoch(records: list[dict]) -> None:
    first, losses = records[0], [r["loss"] for r in records]
    if len(records) == 1:
        logging.info("%s epoch %d/%d  step %d  loss %.4f  fit %.4f  cql %.4f  Q %.3f  target %.3f  %.0f steps/s",
                     first["stage"], first["epoch"], first["epochs"], first["step"], first["loss"], first["fit"],
                     first["cql"], first["q_taken"], first["target"], first["steps_per_s"])
    else:
        logging.info("%s epoch %d/%d of %d runs together: loss %.4f (%.4f-%.4f)  %.0f steps/s per run, "
                     "%.0f run-steps/s", first["stage"], first["epoch"], first["epochs"], len(records),
                     np.mean(losses), min(losses), max(losses), first["steps_per_s"],
                     first["steps_per_s"] * len(records))


def offline_groups(runs: Sequence[StageRun]) -> list[list[StageRun]]:
    """`runs` of one stage split into what can step together: same shape signature and resume epoch (a kill
    between two runs' saves leaves them an epoch apart), finished runs left out."""
    pending = [run for run in runs if run.resume_epoch() < run.epochs]
    return grouped(pending, key=lambda run: (shape_signature(run.config), run.resume_epoch()))
