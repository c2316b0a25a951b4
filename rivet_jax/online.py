"""Replay-anchored online adaptation (Sec. 4.2, App. B.2): the third stage, from the finished TD checkpoint.

    for each new trajectory (tasks of the training manifest, reshuffled every pass, at most `max_passes`):
        act epsilon-greedily with the current RVE (epsilon annealed by episode from 0.10 to 0.02)
        for each of its transitions: one TD+CQL update on a batch half logged replay, half new replay
        every `validate_every` trajectories: validate greedily on the validation manifest; keep the best
        after `early_stop_after` trajectories: stop once validation has not improved `patience` times in a row
    result: the best validation checkpoint (stage "online"), and a learning curve on the test manifest

The new replay lives on device in fixed-capacity arrays (embedding vectors, not text indices), so adding a
transition never changes a shape and nothing recompiles. Progress (state, new replay, counters) is checkpointed
at every validation under stage "online_progress", so a killed run resumes where it was.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from rivet_jax import checkpointing, evaluation, sharding, train
from rivet_jax.corpus import PreparedData, TrainData, gather_batch, prepare_data
from rivet_jax.data.replay import Batch, episode_rows, transition_batch
from rivet_jax.data.serialize import episode_state_texts
from rivet_jax.envs.base import RouterPolicy, run_episode
from rivet_jax.envs.routesim import make_routesim
from rivet_jax.learner import (TrainState, from_saveable, init_train_state, make_optimizer, make_update, saveable,
                               template_state)
from rivet_jax.networks import make_network
from rivet_jax.router import Router

STAGE, PROGRESS = "online", "online_progress"


# ------------------------------------------------------------------------------------------------ new replay


def empty_replay(capacity: int, dim: int, num_models: int) -> Batch:
    """Fixed-capacity new replay, on device: vectors instead of text indices."""
    return Batch(h_t=jnp.zeros((capacity, dim)), h_tp1=jnp.zeros((capacity, dim)), e_o=jnp.zeros((capacity, dim)),
                 action=jnp.zeros(capacity, jnp.int32), reward=jnp.zeros(capacity), done=jnp.zeros(capacity),
                 mc_return=jnp.zeros(capacity), available=jnp.ones((capacity, num_models), bool),
                 next_available=jnp.ones((capacity, num_models), bool))


@functools.partial(jax.jit, donate_argnums=0)
def _write_rows(replay: Batch, rows: Batch, start: jax.Array) -> Batch:
    return jax.tree.map(lambda buf, new: jax.lax.dynamic_update_slice_in_dim(buf, new, start, axis=0), replay, rows)


def embedded_episode(episode, router: Router, lam: float, gamma: float, c_ref: float) -> Batch:
    """One episode as replay rows (T transitions), embedded with the router's frozen encoder."""
    texts = episode_state_texts(episode.task.prompt, episode.turns, router.encoder.count_tokens,
                                router.config.max_state_tokens)
    states = router.encoder.encode(texts)                                       # (T + 1, D)
    responses = router.encoder.encode([t.response for t in episode.turns])      # (T, D)
    return transition_batch(episode_rows(episode, router.pool, lam, gamma, c_ref), states, responses)


# ---------------------------------------------------------------------------------------------------- update


def make_online_update(net, tx, config, mesh=None) -> Callable:
    """jit'ed (state, logged, new, num_new) -> (state, metrics): one TD+CQL step on a half-logged, half-new batch.

    With a multi-device `mesh` the batch is split over its devices (state and both replays replicated)."""
    half = config.optim.batch_size // 2
    step = make_update(net, tx, config, "td")

    @functools.partial(jax.jit, donate_argnums=0)
    def update(state: TrainState, logged: TrainData, new: Batch, num_new: jax.Array):
        key = jax.random.fold_in(state.key, state.step)
        key_logged, key_new = jax.random.split(key)
        logged_idx = jax.random.randint(key_logged, (config.optim.batch_size - half,), 0, logged.num_transitions)
        new_idx = jax.random.randint(key_new, (half,), 0, num_new)
        logged_batch = gather_batch(logged, logged_idx)
        batch = jax.tree.map(lambda old, fresh: jnp.concatenate([old, fresh[new_idx]]), logged_batch, new)
        if mesh is not None and mesh.size > 1:
            batch = sharding.shard_batch(batch, mesh)
        return step(state, batch, logged.cards())

    return update


# ------------------------------------------------------------------------------------------------- schedule


def epsilon(episode: int, config) -> float:
    """Episode-indexed linear anneal from epsilon_start to epsilon_end over epsilon_episodes, then constant."""
    frac = min(episode / max(config.online.epsilon_episodes, 1), 1.0)
    return config.online.epsilon_start + frac * (config.online.epsilon_end - config.online.epsilon_start)


class EpsilonGreedy:
    """The current router, or with probability epsilon a uniformly random available model."""

    def __init__(self, router: Router, eps: float):
        self.greedy, self.eps, self.name = RouterPolicy(router), eps, "rivet-online"

    def act(self, task, history, available, rng):
        greedy, _ = self.greedy.act(task, history, available, rng)
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
class Progress:
    trajectories: int = 0
    best_score: float = -np.inf
    best_at: int = 0
    since_best: int = 0
    validations: list = dataclasses.field(default_factory=list)
    curve: list = dataclasses.field(default_factory=list)
    finished: bool = False


def _router(params, prepared: PreparedData, config) -> Router:
    cards = np.asarray(prepared.data.embeddings[prepared.data.card_text])
    return Router(params, prepared.pool, prepared.encoder, config, cards, c_ref=prepared.c_ref)


def _score(env, router: Router, split: str, config, seed: int) -> dict:
    episodes = evaluation.rollout(env, RouterPolicy(router), split, config.online.eval_rollouts, seed)
    return evaluation.episode_metrics(episodes, config.reward.lam, config.reward.gamma, router.c_ref,
                                      config.online.eval_rollouts)


def run_online(config, workdir: str | Path, env, prepared: PreparedData | None = None,
               on_validation: Callable[[dict], None] | None = None) -> TrainState:
    """Runs (or resumes) online adaptation from the finished TD stage of `workdir`; returns the best state."""
    workdir = Path(workdir)
    if jax.process_count() > 1:
        raise ValueError("stage 'online' acts in one environment and runs in one process; run it without "
                         "--multihost, from the offline stages' workdir")
    prepared = prepared or prepare_data(config, workdir, c_ref=train.stored_c_ref(workdir))
    if prepared.data.on_host:  # one update per transition reads the logged replay on the device (it is small)
        prepared = dataclasses.replace(prepared, data=jax.tree.map(jnp.asarray, prepared.data))
    net, tx = make_network(config), make_optimizer(config, learning_rate=config.online.lr)
    dim, num_models = int(prepared.data.embeddings.shape[1]), len(prepared.pool)
    template = template_state(config, net, tx, dim, prepared.pool, "td")
    capacity = config.online.max_passes * len(env.tasks(config.online.split)) * env.max_turns
    progress_ckpt = checkpointing.StageCheckpoints(workdir, PROGRESS, max_to_keep=1)
    best_ckpt = checkpointing.StageCheckpoints(workdir, STAGE, max_to_keep=1)
    meta = train.checkpoint_meta(config, prepared, STAGE)
    if progress_ckpt.latest_epoch() is not None:
        like = {"state": saveable(template), "replay": empty_replay(capacity, dim, num_models),
                "num_new": jnp.zeros((), jnp.int32)}
        restored, saved_meta = progress_ckpt.restore(like)
        checkpointing.check_compatible(saved_meta, prepared.pool, prepared.encoder.fingerprint,
                                       config.model.to_dict(), source=str(progress_ckpt.directory))
        state = from_saveable(restored["state"])
        replay = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), restored["replay"])
        num_new = int(restored["num_new"])
        progress = Progress(**saved_meta["progress"])
        logging.info("Resuming online adaptation after %d trajectories", progress.trajectories)
    else:
        td = checkpointing.StageCheckpoints(workdir, "td")
        if td.latest_epoch() is None or td.latest_epoch() < config.td_epochs:
            raise FileNotFoundError(f"online adaptation starts from a finished 'td' stage; {td.directory} has "
                                    f"{td.latest_epoch() or 0}/{config.td_epochs} epochs: run --config.stage=td first")
        td_state, _ = td.restore(saveable(template))
        state = init_train_state(net, tx, from_saveable(td_state).params, jax.random.fold_in(template.key, 2))
        replay, num_new, progress = empty_replay(capacity, dim, num_models), 0, Progress()
    if progress.finished:
        best, _ = best_ckpt.restore(saveable(template))
        return from_saveable(best)

    mesh = sharding.make_mesh(config.devices)
    sharding.check_divisible(config.optim.batch_size, mesh)
    if mesh.size > 1:  # data parallel on this host's devices, as the offline stages
        state, replay = sharding.replicate(state, mesh), sharding.replicate(replay, mesh)
        prepared = dataclasses.replace(prepared, data=sharding.replicate(prepared.data, mesh))
    update = make_online_update(net, tx, config, mesh)
    order = task_order(env, config)
    lam, gamma = config.reward.lam, config.reward.gamma

    def checkpoint_progress():
        progress_ckpt.save(progress.trajectories, {"state": saveable(state), "replay": replay,
                                                  "num_new": jnp.asarray(num_new, jnp.int32)},
                           {**meta, "progress": dataclasses.asdict(progress)})

    def validate():
        router = _router(state.params, prepared, config)
        val = _score(env, router, config.online.validation_split, config, config.online.eval_seed)
        record = {"trajectories": progress.trajectories, **{f"val_{k}": v for k, v in val.items()}}
        if progress.trajectories in config.online.curve_points:
            test = _score(env, router, config.online.test_split, config, config.online.eval_seed)
            progress.curve.append({"trajectories": progress.trajectories, **test})
            record.update({f"test_{k}": v for k, v in test.items()})
        improved = val["return"] > progress.best_score
        if improved:
            progress.best_score, progress.best_at, progress.since_best = val["return"], progress.trajectories, 0
            best_ckpt.save(progress.trajectories, saveable(state), meta)
        else:
            progress.since_best += 1
        progress.validations.append(record)
        logging.info("online: %d trajectories, %d updates, validation J %.4f acc %.3f cost %.4f%s",
                     progress.trajectories, int(state.step), val["return"], val["accuracy"], val["cost"],
                     " (best)" if improved else f" (no improvement {progress.since_best}x)")
        if on_validation is not None:
            on_validation(record)

    if not progress.validations:
        validate()  # the offline router is the first candidate for "best"
    started = time.perf_counter()
    while progress.trajectories < len(order):
        router = _router(state.params, prepared, config)
        policy = EpsilonGreedy(router, epsilon(progress.trajectories, config))
        rng = np.random.default_rng([config.seed, 104_729, progress.trajectories])
        episode = run_episode(env, order[progress.trajectories], policy, rng, f"online/{progress.trajectories}")
        rows = embedded_episode(episode, router, lam, gamma, prepared.c_ref)
        replay = _write_rows(replay, rows, jnp.asarray(num_new, jnp.int32))
        for _ in range(len(episode.turns)):  # one gradient update per new transition
            num_new += 1
            state, metrics = update(state, prepared.data, replay, jnp.asarray(num_new, jnp.int32))
        progress.trajectories += 1
        if not np.isfinite(float(metrics["loss"])):
            raise FloatingPointError(f"online adaptation: non-finite loss after trajectory {progress.trajectories}")
        if progress.trajectories % config.online.validate_every == 0:
            validate()
            stop = (progress.trajectories >= config.online.early_stop_after
                    and progress.since_best >= config.online.patience)
            progress.finished = stop or progress.trajectories >= len(order)
            checkpoint_progress()
            if stop:
                logging.info("online: early stop after %d trajectories (best at %d)", progress.trajectories,
                             progress.best_at)
                break
    progress.finished = True
    if progress_ckpt.latest_epoch() != progress.trajectories:
        checkpoint_progress()
    logging.info("online adaptation: %d trajectories in %.1fs; best validation J %.4f at %d trajectories",
                 progress.trajectories, time.perf_counter() - started, progress.best_score, progress.best_at)
    (workdir / "online_curve.json").write_text(json.dumps(dataclasses.asdict(progress), indent=2) + "\n",
                                               encoding="utf-8")
    best, _ = best_ckpt.restore(saveable(template))
    progress_ckpt.close()
    best_ckpt.close()
    return from_saveable(best)


def run_online_stage(config, workdir: str | Path, stage: str, prepared: PreparedData,
                     on_epoch_end: Callable | None = None) -> TrainState:
    """The registered 'online' stage of `train.train`: adaptation in the RouteSim of `config.sim`."""
    del stage, on_epoch_end  # one stage, validated by trajectories rather than epochs
    if "sim" not in config:
        raise ValueError("online adaptation acts in an environment: use a config with `sim` (configs/routesim.py)")
    return run_online(config, workdir, make_routesim(config.sim), prepared)


train.register_stage(STAGE, run_online_stage)


def read_progress(workdir: str | Path) -> dict[str, Any]:
    """The online run's validations and learning curve, as written at its end."""
    return json.loads((Path(workdir) / "online_curve.json").read_text(encoding="utf-8"))
