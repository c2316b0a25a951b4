"""Training: the stages of every run, in order, MC -> TD -> online, each run group through one engine.

    MC, TD     `engine.train_together`: a group's epochs as one compiled program on the device mesh
    online     `online.adapt_group`: the group's trajectories in lockstep in an environment (`envs.base.Env`)

A run group is the unit: `train_group` trains runs (configs[i], workdirs[i]) together wherever their shapes agree
(`learner.shape_signature`: seeds, loss weights, the response ablation and lambda may differ), and `train` is a
group of one. Each run keeps its own workdir, resume point, checkpoints and metrics.jsonl (`stage_run.StageRun`), so
a group's run ends where its solo run ends, and a killed job resumes where it stopped. Every run's workdir is held
for the whole job (`workdir_lock`): a second job on any of them is refused at once.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
from pathlib import Path
from typing import Callable, Sequence

from absl import logging

from rivet_jax import checkpointing, engine, online
from rivet_jax.config_checks import ConfigError, check_config
from rivet_jax.corpus import PreparedData, prepare_data
from rivet_jax.data.prompt_cache import cache_aware
from rivet_jax.envs.base import Env
from rivet_jax.envs.routesim import make_routesim
from rivet_jax.learner import TrainState, grouped, make_optimizer, shape_signature, unstack
from rivet_jax.networks import make_network
from rivet_jax.run_identity import flatten, is_identity
from rivet_jax.settings import Optim
from rivet_jax.stage_run import OFFLINE_STAGES, StageRun, stage_epochs, stages_of, stored_c_ref
from rivet_jax.workdir_lock import hold_workdirs


def environment(config) -> Env:
    """The environment the online stage acts in: the RouteSim of `config.sim` (configs/routesim.py)."""
    if "sim" not in config:
        raise ConfigError("online adaptation acts in an environment: use a config with `sim` (configs/routesim.py), "
                          "or pass one to train_group(env=...)")
    return make_routesim(config.sim)


def prepare_all(configs: Sequence, workdirs: Sequence[Path], on_shapes: Callable | None = None
                ) -> list[PreparedData]:
    """Each run's corpus, read once per distinct lambda and cache awareness (runs differ only in rewards and
    returns, and a cache-aware run's replay has its prompt-cache savings) with one c_ref and one embedding table.
    `on_shapes(runs, shapes, pool)`: a corpus's data shapes before it is embedded (`prepare_data`), with the runs
    (indices) that read it."""
    keys = [(float(config.reward.lam), cache_aware(config)) for config in configs]
    by_lambda: dict[tuple[float, bool], PreparedData] = {}
    for key, config, workdir in zip(keys, configs, workdirs):
        if key not in by_lambda:
            first = next(iter(by_lambda.values()), None)
            runs = [i for i, k in enumerate(keys) if k == key]
            told = None if on_shapes is None else functools.partial(on_shapes, runs)
            by_lambda[key] = prepare_data(config, workdir, c_ref=stored_c_ref(workdir), sharing=first, on_shapes=told)
    c_refs = {p.c_ref for p in by_lambda.values()}
    if len(c_refs) > 1:
        raise ValueError(f"runs of one group must share c_ref; their workdirs fixed {sorted(c_refs)}")
    return [by_lambda[key] for key in keys]


def pending_offline(config, workdir: Path) -> list[str]:
    """The offline stages of `config` whose checkpoints in `workdir` stop short of the stage's last epoch (read from
    the directory names, intact or not: this decides only what `engine.ProgramsAhead` compiles)."""
    def last_epoch(stage: str) -> int:
        return max((int(p.name) for p in checkpointing.stage_dir(workdir, stage).glob("*") if p.name.isdigit()),
                   default=0)
    return [stage for stage in stages_of(config)
            if stage in OFFLINE_STAGES and last_epoch(stage) < stage_epochs(config, stage)]


def train_group(configs: Sequence, workdirs: Sequence[str | Path], on_epoch_end: Callable | None = None,
                env: Env | None = None, prepared: Sequence[PreparedData] | None = None,
                held: bool = False, on_stage_end: Callable[[str], None] | None = None) -> list[TrainState | None]:
    """Trains (or resumes) run i = (configs[i], workdirs[i]) through the stages of its `config.stage`, the runs of
    each stage in groups of one shape, and returns each run's state after its last stage (online: the best one; a
    stage that had finished before this call: None for that run; `train` restores it).

    `on_epoch_end(stage, epoch, records)` follows every offline group epoch (records: one per run of the group; the
    online stage logs a line per validation round). `env`: the environment of the online stage (default
    `environment(config)`); `prepared`: each run's corpus, if already read (default `prepare_all`); `held`: the
    caller already holds every workdir (`workdir_lock`; pipeline.fit holds them from reading the logs to the verdict).
    `on_stage_end(stage)` follows each offline stage, once every run has its checkpoints (finished before or now).
    """
    for config in configs:
        check_config(config)
    workdirs = [Path(w) for w in workdirs]
    stages = [stages_of(config) for config in configs]
    final: list[TrainState | None] = [None] * len(configs)
    with contextlib.nullcontext() if held else hold_workdirs(workdirs), engine.ProgramsAhead() as ahead:
        # (one process only: a multi-process run's checkpoint managers meet in barriers, and none compiles ahead)
        pending = [pending_offline(config, workdir) if engine.compiles_ahead(config) else ()
                   for config, workdir in zip(configs, workdirs)]

        def compile_ahead(runs: Sequence[int], shapes, pool) -> None:  # while the corpus embeds, or trains
            for stage in OFFLINE_STAGES:
                for i in runs:
                    if stage in pending[i]:
                        ahead.compile(configs[i], stage, shapes, pool)

        if prepared is None:
            prepared = prepare_all(configs, workdirs, compile_ahead)
        else:
            prepared = list(prepared)
            for i, corpus in enumerate(prepared):
                if not corpus.data.on_host:
                    compile_ahead([i], engine.shapes(corpus.data), corpus.pool)
        def handed(i: int):   # the previous stage's parameters, trained just now on the device they start on
            return final[i].params if final[i] is not None and engine.one_device(configs[i]) else None

        for stage in OFFLINE_STAGES:
            members = [i for i in range(len(configs)) if stage in stages[i]]
            leaders = mc_leaders(configs, workdirs, prepared, members) if stage == "mc" else {}
            trained = [i for i in members if i not in leaders]
            runs = [StageRun.open(configs[i], workdirs[i], stage, prepared[i], handed=handed(i)) for i in trained]
            index = {id(run): i for i, run in zip(trained, runs)}
            for group in engine.offline_groups(runs):
                states = engine.train_together(group, on_epoch_end, ahead)
                for r, run in enumerate(group):
                    final[index[id(run)]] = unstack(states, r)
            for run in runs:
                run.close()
            for i, leader in leaders.items():
                take_stage(workdirs[leader], workdirs[i], stage)
            if on_stage_end is not None and members:
                on_stage_end(stage)
        adapting = [i for i in range(len(configs)) if "online" in stages[i]]
        for i in adapting:   # (its TD state is on disk, where the online stage starts from: not held beside it)
            final[i] = None
        for members in grouped(adapting, key=lambda i: shape_signature(configs[i])):
            best = online.adapt_group([configs[i] for i in members], [workdirs[i] for i in members],
                                      env or environment(configs[members[0]]), [prepared[i] for i in members])
            for i, state in zip(members, best):
                final[i] = state
    return final


def mc_leaders(configs: Sequence, workdirs: Sequence[Path], prepared: Sequence[PreparedData],
               members: Sequence[int]) -> dict[int, int]:
    """{run i: the run whose MC stage it takes}: runs whose MC stage is one and the same run (every setting it reads
    equal, `run_identity.is_identity`, and the same corpus: a conservatism grid's runs of one seed) train it once,
    in the first of them, and the others take a copy. A run that has begun its own MC stage trains it on."""
    first: dict[str, int] = {}
    leaders = {}
    for i in members:
        values = flatten(configs[i].to_dict())
        reads = sorted((k, v) for k, v in values.items() if is_identity(k, "mc", resuming=True) or k == "mc_epochs")
        key = json.dumps([reads, id(prepared[i])], default=str)
        if key in first and checkpointing.latest_stage(workdirs[i], ("mc",)) is None:   # none of its own begun
            leaders[i] = first[key]
        first.setdefault(key, i)
    return leaders


def take_stage(source: Path, workdir: Path, stage: str) -> None:
    """Copies `source`'s finished checkpoints of `stage` (and its metrics records) into `workdir`, whose own are
    empty: whole, then renamed into place, so a kill leaves none or all of them."""
    target = checkpointing.stage_dir(workdir, stage)
    partial = target.with_name(f".{stage}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(checkpointing.stage_dir(source, stage), partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    kept = [line for line in (source / "metrics.jsonl").read_text().splitlines() if json.loads(line)["stage"] == stage]
    with open(workdir / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.writelines(json.dumps({**json.loads(line), "taken_from": str(source)}) + "\n" for line in kept)
    logging.info("Stage %s of %s: taken from %s (the same run: only the TD settings differ)", stage, workdir, source)


def train(config, workdir: str | Path, on_epoch_end: Callable | None = None, env: Env | None = None,
          prepared: PreparedData | None = None) -> TrainState:
    """The launcher's entry point: trains the stages of `config.stage` (see `stages_of`) in `workdir`, a run group
    of one, and returns the state after the last stage (restored from its checkpoint if it had already finished).
    `on_epoch_end(stage, epoch, record)` follows every offline epoch with the run's metrics record."""
    workdir = Path(workdir)
    check_config(config)
    prepared = prepared or prepare_data(config, workdir, c_ref=stored_c_ref(workdir))
    hook = None if on_epoch_end is None else lambda stage, epoch, records: on_epoch_end(stage, epoch, records[0])
    state = train_group([config], [workdir], hook, env, [prepared])[0]
    if state is None:  # the last stage had finished before this call: an offline one (online returns its best)
        run = StageRun.open(config, workdir, stages_of(config)[-1], prepared)
        state = run.start(make_network(config), make_optimizer(Optim.of(config)))
        run.close()
    return state
