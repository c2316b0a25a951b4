"""Replay-anchored online adaptation (Sec. 4.2, App. B.2): the third stage, from the finished TD checkpoint.

    for each new trajectory (tasks of the training manifest, reshuffled every pass, at most `max_passes`):
        act epsilon-greedily with the current RVE (epsilon annealed by episode from 0.10 to 0.02)
        for each of its transitions: one TD+CQL update on a batch half logged replay, half new replay
        every `validate_every` trajectories: validate greedily on the validation manifest; keep the best
        after `early_stop_after` trajectories: stop once validation has not improved `patience` times in a row
    result: the best validation checkpoint (stage "online"), and a learning curve on the test manifest

The environment is any `envs.base.Env` (RouteSim is one). The runs of a run group (a solo run is a group of one)
adapt in lockstep: trajectory k of every run is one batched rollout (each run's own router and exploration draws,
its states embedded in one encoder pass for all runs and scored by one network call per chunk of runs,
`router.RouterGroup`), the trajectory's updates are one call per chunk (vmapped over its runs, scanned over the
steps; a run whose episode was shorter sits the extra steps out; a CPU's chunks of one run step side by side, one
per core, `engine.in_threads`), and validations of all runs are one batched rollout. Each run keeps its own
checkpoints.

The new replay lives on device in arrays (R, capacity, ...) of embedding vectors; adding a transition changes no
shape, and a chunk's capacity doubles when it fills (one more compile each time, at most a few per run: most runs
stop early, and room for every pass held ~150 MB per run that they never filled). Progress (state, the new
replay's filled rows, counters) is checkpointed per run at every validation under stage "online_progress", so a
killed run resumes where it was; the saves land in a background thread (`checkpointing.BackgroundSaves`) while
the next trajectories run.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from rivet_jax import checkpointing, evaluation, heap, sharding
from rivet_jax.corpus import PreparedData, TrainData, gather_batch
from rivet_jax.data.replay import Batch, Reward, episode_rows, transition_batch
from rivet_jax.data.serialize import episode_state_texts
from rivet_jax.encoders import Encoder
from rivet_jax.engine import in_threads, runs_per_step, side_by_side
from rivet_jax.envs.base import Env, GroupMember, run_episodes
from rivet_jax.learner import (STAGE_IDS, RunValues, TrainState, from_saveable, grouped, init_train_state,
                               make_optimizer, make_update, run_values, saveable, shape_signature,
                               stack, template_state, unstack, with_run_rewards)
from rivet_jax.networks import make_network, rve_params
from rivet_jax.progress import Progress
from rivet_jax.router import RouterGroup
from rivet_jax.settings import LossWeights, Optim, UpdateRule
from rivet_jax.stage_run import check_losses, check_params, check_resume, checkpoint_meta, finished_params

STAGE, PROGRESS = "online", "online_progress"
CURVE_FILE = "online_curve.json"   # the validations and the learning curve, written when the stage ends
CURVE = "online_curve"  # the router at each curve point, where the curve is drawn later (`online_curve.draw_curves`)


# ------------------------------------------------------------------------------------------------ new replay


def empty_replay(capacity: int, dim: int, num_models: int) -> Batch:
    """Fixed-capacity new replay of one run, on device: vectors instead of text indices."""
    return Batch(h_t=jnp.zeros((capacity, dim)), h_tp1=jnp.zeros((capacity, dim)), e_o=jnp.zeros((capacity, dim)),
                 action=jnp.zeros(capacity, jnp.int32), reward=jnp.zeros(capacity), done=jnp.zeros(capacity),
                 mc_return=jnp.zeros(capacity), cost=jnp.zeros(capacity), cost_return=jnp.zeros(capacity),
                 lam=jnp.zeros(capacity), available=jnp.ones((capacity, num_models), bool),
                 next_available=jnp.ones((capacity, num_models), bool), stochastic=jnp.zeros(capacity))


@functools.partial(jax.jit, donate_argnums=0)
def _write_rows(replays: Batch, rows: Batch, run: jax.Array, start: jax.Array) -> Batch:
    """`rows` (K, ...) written at [run, start:start + K] of the stacked replays (R, capacity, ...)."""
    return jax.tree.map(lambda buf, new: jax.lax.dynamic_update_slice(
        buf, new[None].astype(buf.dtype), (run, start) + (0,) * (new.ndim - 1)), replays, rows)


def with_capacity(rows: Batch, capacity: int) -> Batch:
    """A run's replay rows (K, ...) followed by empty rows (`empty_replay`'s) up to `capacity`, on device."""
    empty = empty_replay(capacity - len(rows.action), rows.h_t.shape[1], rows.available.shape[1])
    return jax.tree.map(lambda x, e: jnp.concatenate([jnp.asarray(x, e.dtype), e]), rows, empty)


def pad_rows_to(rows: Batch, length: int) -> Batch:
    """An episode's T rows padded with zero rows to `length` (one write shape for every episode length)."""
    return jax.tree.map(lambda x: np.concatenate([x, np.zeros((length - len(x), *x.shape[1:]), x.dtype)]), rows)


def embedded_episode(episode, encoder: Encoder, max_tokens: int, pool, reward: Reward) -> Batch:
    """One episode as replay rows (T transitions), embedded with the frozen encoder."""
    texts = episode_state_texts(episode.task.prompt, episode.turns, encoder.count_tokens, max_tokens)
    states = encoder.encode(texts)                                       # (T + 1, D)
    responses = encoder.encode([t.response for t in episode.turns])      # (T, D)
    return transition_batch(episode_rows(episode, pool, reward), states, responses)


# ---------------------------------------------------------------------------------------------------- update


def make_group_update(net, tx, config, mesh=None) -> Callable:
    """jit'ed (states, logged, values, new, num_new (T, R), active (T, R)) -> (states, losses (T, R)): a
    trajectory's updates of a chunk's runs (stacked states and replays, see `RunChunks`), one program for all T
    steps: at step j every active run takes one TD+CQL step on a half-logged, half-new batch (the new half from its
    first num_new[j, r] rows), inactive runs keep their state (loss 0), and a step where no run of the chunk is
    active is skipped. One call per trajectory, not one per transition: fewer dispatches and host round trips, the
    same arithmetic bit for bit.

    With a multi-device `mesh` each batch is split over its devices (states and replays replicated)."""
    batch_size = config.optim.batch_size
    half = batch_size // 2
    step = make_update(net, tx, UpdateRule.of(config), "td")

    def run_update(state: TrainState, logged: TrainData, values: RunValues, new: Batch, run: jax.Array,
                   num_new: jax.Array, active: jax.Array):
        key_logged, key_new = jax.random.split(jax.random.fold_in(state.key, state.step))
        logged_idx = jax.random.randint(key_logged, (batch_size - half,), 0, logged.num_transitions)
        new_idx = jax.random.randint(key_new, (half,), 0, num_new)
        logged_batch = with_run_rewards(gather_batch(logged, logged_idx), values, logged_idx)
        # Gathered straight from the stacked replays: mapping over them would copy a run's whole buffer per step.
        batch = jax.tree.map(lambda old, fresh: jnp.concatenate([old, fresh[run, new_idx]]), logged_batch, new)
        if mesh is not None and mesh.size > 1:
            batch = sharding.shard_batch(batch, mesh)
        stepped = lambda s: step(s, batch, logged.cards(), values.weights)
        idle_metrics = jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), jax.eval_shape(stepped, state)[1])
        return jax.lax.cond(active, stepped, lambda s: (s, idle_metrics), state)  # a select under vmap

    per_step = runs_per_step(config)

    @functools.partial(jax.jit, donate_argnums=0)
    def group_update(states, logged, values, new, num_new, active):
        runs = jnp.arange(num_new.shape[1])

        def chunk_step(states, rows_active):
            # vmapped over a whole chunk (GPU/TPU); a chunk of one is a map of length one, where `lax.cond` really
            # skips an idle run's update (under vmap it would be a select computing both branches).
            rows, active = rows_active
            stepped = lambda s: jax.lax.map(lambda r: run_update(r[0], logged, r[1], new, *r[2:]),
                                            (s, values, runs, rows, active), batch_size=per_step)
            idle = lambda s: (s, jax.tree.map(jnp.zeros_like, jax.eval_shape(stepped, s)[1]))
            states, metrics = jax.lax.cond(active.any(), stepped, idle, states)
            return states, metrics["loss"]

        return jax.lax.scan(chunk_step, states, (num_new, active))

    return group_update


# ------------------------------------------------------------------------------------------------- schedule


def epsilon(episode: int, config) -> float:
    """Episode-indexed linear anneal from epsilon_start to epsilon_end over epsilon_episodes, then constant."""
    frac = min(episode / max(config.online.epsilon_episodes, 1), 1.0)
    return config.online.epsilon_start + frac * (config.online.epsilon_end - config.online.epsilon_start)


class Explorer(GroupMember):
    """Run `run`'s current router, or with probability epsilon a uniformly random available model."""

    def __init__(self, group: RouterGroup, run: int, eps: float):
        super().__init__(group, run, "rivet-online")
        self.eps = eps

    def pick(self, greedy, available, rng):
        model = available[int(rng.integers(len(available)))] if rng.random() < self.eps else greedy
        # The logged propensity: explored uniformly with probability eps, greedy otherwise.
        return model, self.eps / len(available) + (1.0 - self.eps) * (model == greedy)


def task_order(env, config) -> list[str]:
    """Training tasks for every pass, each pass in its own seeded shuffle."""
    ids = [t.id for t in env.tasks(config.online.split)]
    order = []
    for p in range(config.online.max_passes):
        order += [ids[i] for i in np.random.default_rng([config.seed, 7_919, p]).permutation(len(ids))]
    return order


# ---------------------------------------------------------------------------------------------------- driver


@dataclasses.dataclass
class OnlineProgress:
    trajectories: int = 0
    best_score: float = -np.inf
    best_at: int = 0
    since_best: int = 0
    validations: list = dataclasses.field(default_factory=list)
    curve: list = dataclasses.field(default_factory=list)
    finished: bool = False


@dataclasses.dataclass
class OnlineRun:
    """One run's side of the online stage: its corpus, schedule, counters and checkpoints."""

    config: Any
    workdir: Path
    prepared: PreparedData
    order: list[str]
    progress: OnlineProgress
    best: checkpointing.StageCheckpoints
    saved: checkpointing.StageCheckpoints  # the progress checkpoints
    meta: dict
    curve: checkpointing.StageCheckpoints | None = None  # the routers at the curve points (`online.defer_curve`)

    def metrics(self, episodes) -> dict:
        return evaluation.episode_metrics(episodes, Reward.of(self.config, self.prepared.c_ref),
                                          self.config.online.eval_rollouts)

    def save_progress(self, state: TrainState, filled: Batch, saves: checkpointing.BackgroundSaves) -> None:
        """The state and the filled rows of the new replay (`RunChunks.filled`), saved by `saves`. `state` must be
        this run's own arrays (`RunChunks.state`: no update donates them)."""
        self.check_finite(state)
        meta = {**self.meta, "progress": dataclasses.asdict(self.progress), "num_new": len(filled.action)}
        trajectories, state = self.progress.trajectories, saveable(state)

        def save():
            self.saved.save(trajectories, {"state": state, "replay": jax.tree.map(jnp.asarray, filled)}, meta)

        saves.submit(save)

    def save_best(self, state: TrainState, saves: checkpointing.BackgroundSaves) -> None:
        self.check_finite(state)
        saves.submit(functools.partial(self.best.save, self.progress.trajectories, saveable(state), self.meta))

    def save_curve_point(self, state: TrainState, cards: np.ndarray, saves: checkpointing.BackgroundSaves) -> None:
        """The router now (its RVE's parameters and the card embeddings (M, D)), for `online_curve.draw_curves`."""
        saves.submit(functools.partial(self.curve.save, self.progress.trajectories,
                                       {"params": rve_params(state.params), "cards": cards}, self.meta))

    def where(self) -> str:
        return f"stage online of {self.workdir}"

    def check_finite(self, state: TrainState) -> None:
        check_params(state, self.where(), f"after {self.progress.trajectories} trajectories", self.config,
                     self.prepared.c_ref, STAGE)

    def best_state(self, template: TrainState) -> TrainState:
        best, _ = self.best.restore(saveable(template))
        return from_saveable(best)

    def close(self) -> None:
        for checkpoints in (self.best, self.saved, self.curve):
            if checkpoints is not None:
                checkpoints.close()


def max_rows(env, config) -> int:
    """The new replay's largest capacity: every trajectory of every pass, plus one padded write past the last row."""
    return (config.online.max_passes * len(env.tasks(config.online.split)) + 1) * env.max_turns


def first_capacity(config, max_turns: int, filled: int, most: int) -> int:
    """A chunk's first capacity: the rows held so far and the trajectories up to the first possible early stop."""
    trajectories = max(config.online.early_stop_after, config.online.validate_every)
    return min(most, max(filled, 0) + (trajectories + 1) * max_turns)


def open_run(config, workdir: Path, env: Env, prepared: PreparedData, template: TrainState, net, tx):
    """(OnlineRun, state, new replay's filled rows (num_new, ...), num_new): resumed from its progress checkpoint, or
    started from the finished TD stage of `workdir` (no rows)."""
    dim, num_models = int(prepared.data.embeddings.shape[1]), len(prepared.pool)
    saved = checkpointing.StageCheckpoints(workdir, PROGRESS, max_to_keep=1, repair=True)
    best = checkpointing.StageCheckpoints(workdir, STAGE, max_to_keep=1, repair=True)
    curve = (checkpointing.StageCheckpoints(workdir, CURVE, max_to_keep=None, repair=True)
             if config.online.defer_curve else None)
    run = OnlineRun(config, workdir, prepared, task_order(env, config), OnlineProgress(), best, saved,
                    checkpoint_meta(config, prepared, STAGE), curve)
    if saved.latest_epoch() is not None:
        saved_meta = saved.restore_meta()
        check_resume(saved_meta, config, prepared, STAGE, str(saved.directory))
        num_new = int(saved_meta["num_new"])
        restored, _ = saved.restore({"state": saveable(template), "replay": empty_replay(num_new, dim, num_models)})
        run.progress = OnlineProgress(**saved_meta["progress"])
        logging.info("Resuming online adaptation of %s after %d trajectories", workdir, run.progress.trajectories)
        return run, from_saveable(restored["state"]), restored["replay"], num_new
    params = finished_params(config, workdir, STAGE, prepared, template)
    # The online stream: the TD template's key (online states have TD's shapes) folded with the online stage's id.
    state = init_train_state(net, tx, params, jax.random.fold_in(template.key, STAGE_IDS[STAGE]))
    return run, state, empty_replay(0, dim, num_models), 0


class RunChunks:
    """The runs' states, new replays and values, stacked in chunks of `learner.runs_vmapped` runs: every run in one
    chunk on a GPU/TPU (one vmapped update per step for all), one run per chunk on a CPU (copying a run's state in
    and out of a stacked step there costs more than the update itself; idle chunks are skipped). A chunk's replays
    grow (`reserve`) as they fill, up to `most` rows."""

    def __init__(self, runs: Sequence[OnlineRun], states: Sequence[TrainState], filled: Sequence[Batch], mesh,
                 capacity: int, most: int):
        vmapped = runs_per_step(runs[0].config)  # 0: all of them; None: one at a time
        size = len(runs) if vmapped == 0 else vmapped or 1
        self.members = [list(range(i, min(i + size, len(runs)))) for i in range(0, len(runs), size)]
        self.states = [stack([states[r] for r in m]) for m in self.members]
        self.replays = [stack([with_capacity(filled[r], capacity) for r in m]) for m in self.members]
        self.values = [run_values([LossWeights.of(runs[r].config) for r in m],
                                  [runs[r].prepared.data.replay for r in m])
                       for m in self.members]
        self.mesh, self.most = mesh, most
        if mesh.size > 1:  # data parallel on this host's devices, as the offline stages
            self.states, self.replays, self.values = sharding.replicate((self.states, self.replays, self.values),
                                                                        mesh)
        self.size = size

    def where(self, r: int) -> tuple[int, int]:
        """(chunk, index in the chunk) of run r."""
        return r // self.size, r % self.size

    def state(self, r: int) -> TrainState:
        c, i = self.where(r)
        return unstack(self.states[c], i)

    def filled(self, r: int, rows: int) -> Batch:
        """Run r's first `rows` rows of the new replay, copied to the host: what its progress checkpoint writes. A
        pending save then holds those rows alone, not the replay's capacity (with every run of a validation round
        saving at once, those copies were most of the stage's memory); sliced on the host, as a device slice would
        compile one program for every distinct `rows`."""
        c, i = self.where(r)
        return jax.tree.map(lambda x: np.array(np.asarray(x)[i, :rows]), self.replays[c])

    def reserve(self, c: int, rows: int) -> None:
        """Room for `rows` rows in chunk c's replays: its capacity doubled (at most `most`) when short."""
        capacity = self.replays[c].action.shape[1]
        if rows > capacity:
            grown = jax.vmap(functools.partial(with_capacity, capacity=min(max(rows, 2 * capacity), self.most)))
            self.replays[c] = grown(self.replays[c])
            if self.mesh.size > 1:
                self.replays[c] = sharding.replicate(self.replays[c], self.mesh)


def adapt_together(runs: Sequence[OnlineRun], states: Sequence[TrainState], filled: Sequence[Batch],
                   num_new: np.ndarray, env: Env, net, tx, saves: checkpointing.BackgroundSaves,
                   on_validation: Callable[[dict], None] | None = None) -> None:
    """Steps `runs` (same shape signature and trajectory count; `net` and `tx` their network and optimizer) to
    their ends; their checkpoints go through `saves`."""
    config, first = runs[0].config, runs[0].prepared
    mesh = sharding.make_mesh(config.devices)
    sharding.check_divisible(config.optim.batch_size, mesh)
    logged = first.data
    if logged.on_host:  # one update per transition reads the logged replay on the device (it is small)
        logged = jax.tree.map(jnp.asarray, logged)
    if mesh.size > 1:
        logged = sharding.replicate(logged, mesh)
    most = max_rows(env, config)
    chunks = RunChunks(runs, states, filled, mesh, first_capacity(config, env.max_turns, int(max(num_new)), most),
                       most)
    update = make_group_update(net, tx, config, mesh)
    cards = np.asarray(first.data.embeddings[first.data.card_text])
    max_turns = env.max_turns

    def members(make: Callable, rs: Sequence[int]) -> list:
        """A member policy per run of `rs`, all deciding through one `RouterGroup` whose parts are the chunks: one
        encoder pass a round for all, one network call per chunk."""
        group = RouterGroup([s.params for s in chunks.states], first.pool, first.encoder, config, cards)
        return [make(group, r) for r in rs]

    def validate(validating: list[int]) -> None:
        heap.trim()   # (the round before's checkpoint saves freed their buffers in the save thread's arena)
        point = runs[validating[0]].progress.trajectories
        policies = members(GroupMember, validating)
        val = evaluation.rollout_each(env, policies, config.online.validation_split, config.online.eval_rollouts,
                                      config.online.eval_seed)
        curving = [k for k, r in enumerate(validating) if point in runs[r].config.online.curve_points]
        drawn = [k for k in curving if not runs[validating[k]].config.online.defer_curve]
        tests = evaluation.rollout_each(env, [policies[k] for k in drawn], config.online.test_split,
                                        config.online.eval_rollouts, config.online.eval_seed) if drawn else []
        test = dict(zip(drawn, tests))  # only the runs that draw a learning curve now pay for its test rollouts
        for k, r in enumerate(validating):
            run, progress = runs[r], runs[r].progress
            scores = run.metrics(val[k])
            record = {"trajectories": point, **{f"val_{key}": v for key, v in scores.items()}}
            if k in test:
                curve = run.metrics(test[k])
                progress.curve.append({"trajectories": point, **curve})
                record.update({f"test_{key}": v for key, v in curve.items()})
            elif k in curving:
                run.save_curve_point(chunks.state(r), cards, saves)
            improved = scores["return"] > progress.best_score
            if improved:
                progress.best_score, progress.best_at, progress.since_best = scores["return"], point, 0
                run.save_best(chunks.state(r), saves)
            else:
                progress.since_best += 1
            progress.validations.append(record)
            if len(validating) == 1:
                logging.info("online: %d trajectories, validation J %.4f acc %.3f cost %.4f%s", point,
                             scores["return"], scores["accuracy"], scores["cost"],
                             " (best)" if improved else f" (no improvement {progress.since_best}x)")
            if on_validation is not None:
                on_validation(record)
        if len(validating) > 1:
            returns = [runs[r].progress.validations[-1]["val_return"] for r in validating]
            logging.info("online: %d trajectories, %d runs in lockstep: validation J %.4f (%.4f-%.4f), %d improved",
                         point, len(validating), np.mean(returns), min(returns), max(returns),
                         sum(runs[r].progress.since_best == 0 for r in validating))

    active = [r for r, run in enumerate(runs) if not run.progress.finished]
    if active and not runs[active[0]].progress.validations:
        validate(active)  # the offline router is the first candidate for "best"
    started = time.perf_counter()
    progress = Progress("online adaptation (lockstep trajectories, at most)", max(len(runs[r].order) for r in active)
                         if active else 0)
    while active:
        k = runs[active[0]].progress.trajectories
        episodes = run_episodes(env, [runs[r].order[k] for r in active],
                                members(lambda group, i: Explorer(group, i, epsilon(k, config)), active),
                                [np.random.default_rng([runs[r].config.seed, 104_729, k]) for r in active],
                                [f"online/{k}"] * len(active))
        lengths = np.zeros(len(runs), np.int32)
        for r, episode in zip(active, episodes):
            rows = embedded_episode(episode, first.encoder, config.max_state_tokens, first.pool,
                                    Reward.of(runs[r].config, first.c_ref))
            c, i = chunks.where(r)
            chunks.reserve(c, int(num_new[r]) + max_turns)
            chunks.replays[c] = _write_rows(chunks.replays[c], pad_rows_to(rows, max_turns), jnp.int32(i),
                                            jnp.int32(num_new[r]))
            lengths[r] = len(episode.turns)
        # (T, R) at step j < T = max_turns: which runs update, and how many new rows each samples from
        stepping = lengths[None, :] > np.arange(max_turns)[:, None]
        new_rows = (num_new[None, :] + np.minimum(lengths[None, :], np.arange(1, max_turns + 1)[:, None]))
        num_new = num_new + lengths

        def step_chunk(c: int) -> np.ndarray:
            """Chunk c's updates (T, R_c), one per new transition of its runs (those whose episode ended sit out);
            the chunks step side by side (`engine.in_threads`), each its own state."""
            rs = chunks.members[c]
            if not stepping[:, rs].any():   # every run of the chunk has finished
                return np.zeros((max_turns, len(rs)))
            # numpy arguments: jnp.asarray would convert their dtype on the device, one XLA call each
            chunks.states[c], losses = update(chunks.states[c], logged, chunks.values[c], chunks.replays[c],
                                              new_rows[:, rs].astype(np.int32), stepping[:, rs])
            return np.asarray(losses)

        losses = np.zeros((max_turns, len(runs)))                                           # (T, R)
        for c, chunk_losses in enumerate(in_threads(step_chunk, len(chunks.members), side_by_side(mesh))):
            losses[:, chunks.members[c]] = chunk_losses
        for r in active:
            runs[r].progress.trajectories += 1
            steps_before = int(num_new[r]) - int(lengths[r])  # one update per new transition: steps = rows
            check_losses(losses[:lengths[r], r], f"{runs[r].where()} (trajectory {k + 1})", steps_before,
                         runs[r].config, first.c_ref, STAGE)
        if (k + 1) % config.online.validate_every == 0:
            validate(active)
        for r in list(active):
            run, counters = runs[r], runs[r].progress
            stop = (counters.trajectories % config.online.validate_every == 0
                    and counters.trajectories >= config.online.early_stop_after
                    and counters.since_best >= config.online.patience)
            counters.finished = stop or counters.trajectories >= len(run.order)
            if counters.trajectories % config.online.validate_every == 0 or counters.finished:
                run.save_progress(chunks.state(r), chunks.filled(r, int(num_new[r])), saves)
            if stop:
                logging.info("online %s: early stop after %d trajectories (best at %d)", run.workdir,
                             counters.trajectories, counters.best_at)
            if counters.finished:
                active.remove(r)
        progress.step()
    logging.info("online adaptation of %d run(s): %.1fs", len(runs), time.perf_counter() - started)


def adapt_group(configs: Sequence, workdirs: Sequence[str | Path], env: Env, prepared: Sequence[PreparedData],
                on_validation: Callable[[dict], None] | None = None) -> list[TrainState]:
    """Runs (or resumes) online adaptation in `env` of every run (configs[i], workdirs[i], its corpus prepared[i])
    from its finished TD stage, runs of one shape signature and progress in lockstep; returns each run's best
    state."""
    if jax.process_count() > 1:
        raise ValueError("stage 'online' acts in one environment and runs in one process; run it without "
                         "--multihost, from the offline stages' workdir")
    workdirs = [Path(w) for w in workdirs]
    opened, learners = [], {}
    for config, workdir, data in zip(configs, workdirs, prepared):
        # One network and optimizer per shape signature: their jit'ed functions then compile once, not per run.
        net, tx = learners.setdefault(shape_signature(config), (make_network(config), make_optimizer(
            Optim.of(config, learning_rate=config.online.lr))))
        template = template_state(config.seed, net, tx, int(data.data.embeddings.shape[1]), data.pool, "td")
        opened.append((template, *open_run(config, workdir, env, data, template, net, tx)))
    pending = [i for i in range(len(opened)) if not opened[i][1].progress.finished]
    # every save has landed before the best states are read; the updates' temporaries reused, not fresh pages
    with checkpointing.BackgroundSaves() as saves, heap.xla_loop_phase():
        for members in grouped(pending, key=lambda i: (shape_signature(configs[i]),
                                                       opened[i][1].progress.trajectories)):
            adapt_together([opened[i][1] for i in members], [opened[i][2] for i in members],
                           [opened[i][3] for i in members], np.array([opened[i][4] for i in members]), env,
                           *learners[shape_signature(configs[members[0]])], saves, on_validation)
    for _, run, *_ in opened:
        (run.workdir / CURVE_FILE).write_text(json.dumps(dataclasses.asdict(run.progress), indent=2) + "\n",
                                              encoding="utf-8")
    best = [run.best_state(template) for template, run, *_ in opened]
    for _, run, *_ in opened:
        run.close()
    return best


def read_progress(workdir: str | Path) -> dict[str, Any]:
    """The online run's validations and learning curve, as written at its end."""
    return json.loads((Path(workdir) / CURVE_FILE).read_text(encoding="utf-8"))
