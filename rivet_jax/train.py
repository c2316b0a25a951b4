"""Training: the TrainState, one jit'ed update per stage, and the offline stages (Sec. 4.2, App. B.2).

    MC warm start   L_MC = L_fit(G_t)                                    (Eq. 7 with Z = G_t)
    TD refinement   L_TD = L_fit(Y_t) + alpha L_CQL                      (Eqs. 8-11, Double DQN + CQL)

A whole epoch runs inside one `lax.scan` (no Python per step); the epoch's shuffle comes from
`fold_in(stage key, epoch)`, so an epoch is a pure function of (state, data, epoch) and a run resumed from an
epoch checkpoint ends with exactly the parameters of an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from pathlib import Path
from typing import Any, Callable

import chex
import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging

from rivet_jax import checkpointing, losses, sharding
from rivet_jax.data import demo
from rivet_jax.data.cards import card_features
from rivet_jax.data.replay import Replay, build_replay, reference_cost
from rivet_jax.data.schema import ModelPool, read_episodes, read_model_cards, write_episodes, write_model_cards
from rivet_jax.encoders import EmbeddingStore, Encoder, make_encoder
from rivet_jax.encoders.table import host_table
from rivet_jax.networks import RivetNet, init_params, make_network

STAGES = ("mc", "td")                  # the offline stages (this module)
ROUTER_STAGES = ("mc", "td", "online")  # every stage whose checkpoint is a router, in training order
_STAGE_IDS = {"mc": 0, "td": 1, "online": 2}


class NonFiniteLossError(FloatingPointError):
    """Training produced a NaN or inf loss; nothing from the offending epoch is saved."""


@flax.struct.dataclass
class TrainState:
    params: Any
    target_params: Any
    opt_state: Any
    step: jax.Array  # () int32, optimizer steps taken in this stage
    key: jax.Array   # typed PRNG key of this stage


@flax.struct.dataclass
class TrainData:
    """Everything an update reads. T texts of width D, M candidates, F card fields, N transitions.

    Device-resident (jax arrays; batches are gathered inside the jit'ed epoch) or host-resident (numpy arrays, the
    embedding table possibly a memory-mapped file; batches are gathered on the host and fed to the devices).
    """

    embeddings: Any  # (T, D) float32 frozen-encoder vectors of the text table
    card_text: Any   # (M,) int32 rows of the card descriptions
    card_x: Any      # (M, F) float32 structured card fields
    card_mask: Any   # (M, F) float32 1 = field known
    replay: dict     # per-transition arrays, see `Replay.arrays`

    @property
    def num_transitions(self) -> int:
        return int(self.replay["action"].shape[0])

    @property
    def on_host(self) -> bool:
        return isinstance(self.embeddings, np.ndarray)  # np.memmap included

    def cards(self):
        return self.embeddings[self.card_text], self.card_x, self.card_mask


def make_train_data(replay: Replay, embeddings: np.ndarray, pool: ModelPool, on_host: bool = False) -> TrainData:
    """The replay and its embedding table on the device, or (`on_host`) left where they are, e.g. on disk."""
    card_x, card_mask = card_features(pool)
    put = np.asarray if on_host else jnp.asarray
    return TrainData(embeddings=embeddings if on_host else jnp.asarray(embeddings, jnp.float32),
                     card_text=put(replay.card_text), card_x=put(card_x), card_mask=put(card_mask),
                     replay={k: put(v) for k, v in replay.arrays().items()})


def make_optimizer(config: ml_collections.ConfigDict, learning_rate: float | None = None):
    """AdamW with global-norm clipping (App. B.2).

    `optax.flatten` runs the update on one raveled parameter vector: the same arithmetic, but a handful of large
    fused kernels instead of a few per parameter leaf, which halves the optimizer's compile time on CPU.
    """
    return optax.flatten(optax.chain(
        optax.clip_by_global_norm(config.optim.clip_norm),
        optax.adamw(config.optim.lr if learning_rate is None else learning_rate,
                    weight_decay=config.optim.weight_decay)))


def stage_key(seed: int, stage: str) -> jax.Array:
    return jax.random.fold_in(jax.random.key(seed), _STAGE_IDS[stage])


def init_train_state(net: RivetNet, tx, params: Any, key: jax.Array) -> TrainState:
    # The target is a copy, not an alias: the update donates the state, and one buffer cannot be donated twice.
    return TrainState(params=params, target_params=jax.tree.map(jnp.copy, params), opt_state=jax.jit(tx.init)(params),
                      step=jnp.zeros((), jnp.int32), key=key)


# ----------------------------------------------------------------------------------------------------- losses


def gather_batch(data: TrainData, idx) -> dict:
    """The transitions `idx` (...,) as vectors: h_t, h_tp1, e_o (..., D) and the per-transition arrays.

    The same code gathers inside jit (device-resident data) and with numpy on the host (host-resident data)."""
    batch = jax.tree.map(lambda x: x[idx], data.replay)
    return {"h_t": data.embeddings[batch["state"]], "h_tp1": data.embeddings[batch["next_state"]],
            "e_o": data.embeddings[batch["response"]],
            **{k: batch[k] for k in ("action", "reward", "done", "mc_return", "available", "next_available")}}


def batch_loss(params, target_params, batch: dict, cards, *, net: RivetNet, config, stage: str):
    """The stage's loss (MC: fit(G); TD: fit(Y) + alpha CQL) on a gathered batch, and its metrics."""
    e_o = jnp.zeros_like(batch["e_o"]) if config.loss.zero_response else batch["e_o"]
    q_all, q_resp = net.apply({"params": params}, batch["h_t"], cards, batch["action"], e_o,
                              method=RivetNet.q_both)                                              # (B, M), (B,)
    if stage == "mc":
        target = batch["mc_return"]
    else:
        q_tp1_online = net.apply({"params": params}, batch["h_tp1"], cards, method=RivetNet.q_route)         # (B, M)
        q_tp1_target = net.apply({"params": target_params}, batch["h_tp1"], cards, method=RivetNet.q_route)  # (B, M)
        # stop_gradient: the online net only *selects* m*_{t+1}; the target is a constant of this update.
        target = losses.batched_double_dqn_target(batch["reward"], batch["done"], config.reward.gamma,
                                                  jax.lax.stop_gradient(q_tp1_online), q_tp1_target,
                                                  batch["next_available"])
    q_taken = jnp.take_along_axis(q_all, batch["action"][:, None], axis=1)[:, 0]  # (B,)
    fit = jnp.mean(losses.batched_fit(q_taken, q_resp, target, config.loss.beta, config.loss.huber_delta))
    if stage == "mc":
        cql = jnp.zeros(())
    else:
        cql = jnp.mean(losses.batched_cql(q_all, batch["action"], batch["available"]))
    loss = fit + config.loss.alpha * cql
    available_q = jnp.where(batch["available"], q_all, jnp.nan)
    metrics = {"loss": loss, "fit": fit, "cql": cql, "q_taken": jnp.mean(q_taken), "q_resp": jnp.mean(q_resp),
               "q_mean": jnp.nanmean(available_q), "q_max": jnp.mean(jnp.nanmax(available_q, axis=1)),
               "target": jnp.mean(target)}
    return loss, metrics


def apply_gradients(state: TrainState, tx, grads, sync_steps: int) -> TrainState:
    """One optimizer step, then the periodic target-network copy (every `sync_steps` steps)."""
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    step = state.step + 1
    target_params = optax.periodic_update(params, state.target_params, step, sync_steps)
    return state.replace(params=params, target_params=target_params, opt_state=opt_state, step=step)


# ---------------------------------------------------------------------------------------------------- updates


def make_update(net: RivetNet, tx, config, stage: str) -> Callable:
    """One gradient update on a gathered batch: (state, batch, cards) -> (state, metrics). Not jit'ed here."""
    loss_fn = functools.partial(batch_loss, net=net, config=config, stage=stage)

    def update(state: TrainState, batch: dict, cards):
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, state.target_params, batch,
                                                                         cards)
        metrics["grad_norm"] = optax.tree.norm(grads)
        return apply_gradients(state, tx, grads, config.target_sync_steps), metrics

    return update


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


def epoch_batches(key: jax.Array, num_transitions: int, batch_size: int, num_slices: int = 1,
                  slice_index: int = 0) -> jax.Array:
    """A fresh shuffle of one replay slice cut into full batches: (num_batches, batch_size // num_slices) indices.

    Slice `slice_index` of `num_slices` (one per host; see `sharding.replay_slice`) contributes its share of every
    global batch, drawn from its own transitions only. Every slice takes the same number of batches (that of the
    smallest slice); the remainder is dropped this epoch and lands elsewhere in the next shuffle; a slice smaller
    than its share of one batch is repeated to fill it.
    """
    rows = sharding.replay_slice(num_transitions, num_slices, slice_index)
    local_batch, smallest = batch_size // num_slices, num_transitions // num_slices
    perm = rows.start + jax.random.permutation(jax.random.fold_in(key, slice_index), rows.stop - rows.start)
    if perm.shape[0] < local_batch:
        perm = jnp.resize(perm, (local_batch,))
    num_batches = max(smallest // local_batch, 1)
    return perm[: num_batches * local_batch].reshape(num_batches, local_batch)


def make_train_epoch(net: RivetNet, tx, config, stage: str, mesh=None) -> Callable:
    """jit'ed (state, data, epoch) -> (state, per-step metrics, batches) over device-resident data, state donated."""
    train_step = make_train_step(net, tx, config, stage, mesh)
    batch_size = config.optim.batch_size

    @functools.partial(jax.jit, donate_argnums=0)
    def train_epoch(state: TrainState, data: TrainData, epoch: jax.Array):
        batches = epoch_batches(jax.random.fold_in(state.key, epoch), data.num_transitions, batch_size)
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
    shuffle = jax.jit(epoch_batches, static_argnums=(1, 2, 3, 4))
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


# ---------------------------------------------------------------------------------------------- data loading


@dataclasses.dataclass(frozen=True)
class PreparedData:
    pool: ModelPool
    encoder: Encoder
    replay: Replay
    data: TrainData
    c_ref: float
    skipped: int


def _corpus_paths(config, workdir: Path) -> tuple[Path, Path]:
    """The configured logs, or the demo corpus written once into the workdir."""
    if config.data.episodes:
        if not config.data.cards:
            raise ValueError("config.data.episodes is set but config.data.cards is not: "
                             "name the pool's model_cards.json")
        return Path(config.data.episodes), Path(config.data.cards)
    episodes_path, cards_path = workdir / "data" / "demo_episodes.jsonl", workdir / "data" / "demo_cards.json"
    if not episodes_path.exists():
        episodes_path.parent.mkdir(parents=True, exist_ok=True)
        logging.info("No episodes configured: writing the demo corpus (%d episodes) to %s",
                     config.data.demo_episodes, episodes_path)
        write_model_cards(cards_path, demo.demo_pool())
        write_episodes(episodes_path, demo.demo_episodes(config.data.demo_episodes, seed=config.data.demo_seed))
    return episodes_path, cards_path


def prepare_data(config, workdir: str | Path, c_ref: float | None = None) -> PreparedData:
    """Reads and validates the logs, serializes states, embeds every distinct text once (cached in the workdir)."""
    workdir = Path(workdir)
    episodes_path, cards_path = _corpus_paths(config, workdir)
    pool = read_model_cards(cards_path)
    episode_file = read_episodes(episodes_path, pool, skip_invalid=config.data.skip_invalid)
    for error in episode_file.skipped:
        logging.warning("skipped: %s", error)
    if c_ref is None:
        c_ref = config.reward.c_ref if config.reward.c_ref is not None else reference_cost(episode_file.episodes)
    encoder = make_encoder(config.encoder)
    replay = build_replay(episode_file.episodes, pool, count_tokens=encoder.count_tokens,
                          max_tokens=config.max_state_tokens, lam=config.reward.lam, gamma=config.reward.gamma,
                          c_ref=c_ref)
    started = time.perf_counter()
    cache_dir = Path(config.data.embedding_cache or workdir / "embeddings")
    host_fed = config.data.embeddings_on_disk or jax.process_count() > 1  # see make_host_fed_epoch
    if host_fed:
        embeddings, how = _host_embeddings(config, encoder, cache_dir, replay), "host-fed table"
    else:
        store = EmbeddingStore(encoder, cache_dir)
        embeddings = store.embed(replay.texts)
        how = store.stats
    logging.info("Corpus: %d episodes (%d skipped), %d transitions, %d distinct texts embedded in %.1fs (%s)",
                 len(episode_file.episodes), len(episode_file.skipped), len(replay), len(replay.texts),
                 time.perf_counter() - started, how)
    data = make_train_data(replay, embeddings, pool, on_host=host_fed)
    return PreparedData(pool=pool, encoder=encoder, replay=replay, data=data, c_ref=c_ref,
                        skipped=len(episode_file.skipped))


def slice_text_rows(replay: Replay, rows: slice) -> np.ndarray:
    """The text-table rows a replay slice reads (its states, next states, responses) and the cards, sorted."""
    return np.unique(np.concatenate([replay.state[rows], replay.next_state[rows], replay.response[rows],
                                     replay.card_text]))


def _host_embeddings(config, encoder: Encoder, cache_dir: Path, replay: Replay) -> np.ndarray:
    """The table of a host-fed run: this process's rows only (sharded encoder pass), memory-mapped from
    `<cache_dir>/tables/` when `config.data.embeddings_on_disk`."""
    rows = slice_text_rows(replay, sharding.replay_slice(len(replay)))

    def progress(done: int, total: int) -> None:
        logging.info("embedded %d/%d texts of this host's replay slice", done, total)

    return host_table(encoder, lambda: EmbeddingStore(encoder, cache_dir), replay.texts, rows,
                      cache_dir / "tables" if config.data.embeddings_on_disk else None, progress)


# -------------------------------------------------------------------------------------------- stage driver


def saveable(state: TrainState) -> dict:
    return {"params": state.params, "target_params": state.target_params, "opt_state": state.opt_state,
            "step": state.step, "key": jax.random.key_data(state.key)}


def from_saveable(tree: dict, placed: bool = False) -> TrainState:
    """The TrainState of a restored tree. Unless `placed` (restored onto a mesh's shardings), arrays are re-made
    as plain uncommitted ones: orbax restores committed arrays, jit outputs are uncommitted, and passing both
    kinds to one jit compiles it twice."""
    if not placed:
        tree = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), tree)
    return TrainState(params=tree["params"], target_params=tree["target_params"], opt_state=tree["opt_state"],
                      step=tree["step"], key=jax.random.wrap_key_data(tree["key"]))


def checkpoint_meta(config, prepared: PreparedData, stage: str) -> dict:
    return {"stage": stage, "config": json.loads(config.to_json()), "pool": prepared.pool.to_json(),
            "encoder": {"name": prepared.encoder.name, "dim": prepared.encoder.dim,
                        "fingerprint": prepared.encoder.fingerprint},
            "c_ref": prepared.c_ref, "state_dim": int(prepared.data.embeddings.shape[1])}


def _stage_epochs(config, stage: str) -> int:
    return {"mc": config.mc_epochs, "td": config.td_epochs}[stage]


def template_state(config, net: RivetNet, tx, state_dim: int, pool: ModelPool, stage: str) -> TrainState:
    """A freshly initialised state of `stage`: the starting point of MC, and the tree shape every restore fills."""
    key = stage_key(config.seed, stage)
    card_x, card_mask = card_features(pool)
    cards = (jnp.zeros((len(pool), state_dim), jnp.float32), jnp.asarray(card_x), jnp.asarray(card_mask))
    params = init_params(net, jax.random.fold_in(key, 1_000_003), state_dim, cards)
    return init_train_state(net, tx, params, key)


def _template_state(config, net, tx, prepared: PreparedData, stage: str) -> TrainState:
    return template_state(config, net, tx, int(prepared.data.embeddings.shape[1]), prepared.pool, stage)


def _restore(checkpoints: checkpointing.StageCheckpoints, like: TrainState, prepared: PreparedData, config,
             epoch: int, mesh=None) -> TrainState:
    """The checkpoint of `epoch`, checked against this run; with a multi-device `mesh`, orbax restores every leaf
    straight onto the mesh, replicated (whatever device count saved it)."""
    meta = checkpoints.restore_meta(epoch)
    checkpointing.check_compatible(meta, prepared.pool, prepared.encoder.fingerprint, config.model.to_dict(),
                                   source=str(checkpoints.directory))
    target = saveable(like)
    placed = mesh is not None and mesh.size > 1
    if placed:
        target = checkpointing.abstract_tree(target, sharding.replicated(mesh))
    restored, _ = checkpoints.restore(target, epoch=epoch)
    return from_saveable(restored, placed=placed)


def _initial_state(config, net: RivetNet, tx, prepared: PreparedData, workdir: Path, stage: str,
                   mesh=None) -> TrainState:
    """A new stage: MC from initialisation; TD from the finished MC stage (fresh optimizer, target = online)."""
    template = _template_state(config, net, tx, prepared, stage)
    if stage == "mc":
        return template
    previous = checkpointing.StageCheckpoints(workdir, "mc")
    done = previous.latest_epoch()
    if done is None or done < config.mc_epochs:
        raise FileNotFoundError(f"stage 'td' starts from a finished 'mc' stage, but {previous.directory} has "
                                f"{'no checkpoint' if done is None else f'{done}/{config.mc_epochs} epochs'}: "
                                f"run --config.stage=mc first")
    mc_state = _restore(previous, _template_state(config, net, tx, prepared, "mc"), prepared, config, done, mesh)
    return init_train_state(net, tx, mc_state.params, template.key)


def stored_c_ref(workdir: str | Path) -> float | None:
    """c_ref fixed by an earlier stage of this workdir, so every stage reads the same rewards."""
    for stage in STAGES:
        if checkpointing.stage_dir(workdir, stage).is_dir():
            checkpoints = checkpointing.StageCheckpoints(workdir, stage)
            if checkpoints.latest_epoch() is not None:
                return checkpoints.restore_meta()["c_ref"]
    return None


def _log_epoch(workdir: Path, record: dict) -> None:
    logging.info("%s epoch %d/%d  step %d  loss %.4f  fit %.4f  cql %.4f  Q %.3f  target %.3f  %.0f steps/s",
                 record["stage"], record["epoch"], record["epochs"], record["step"], record["loss"], record["fit"],
                 record["cql"], record["q_taken"], record["target"], record["steps_per_s"])
    with open(workdir / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def _check_finite(metrics: dict, batches: np.ndarray, prepared: PreparedData, stage: str, first_step: int):
    loss = np.asarray(metrics["loss"])
    bad = np.flatnonzero(~np.isfinite(loss))
    if bad.size:
        i = int(bad[0])
        episodes = sorted({prepared.replay.episode_ids[e] for e in prepared.replay.episode[np.asarray(batches[i])]})
        raise NonFiniteLossError(f"stage {stage}: non-finite loss {loss[i]} at step {first_step + i + 1}; "
                                 f"the batch held episodes {episodes[:10]}{' ...' if len(episodes) > 10 else ''}")


def run_stage(config, workdir: str | Path, stage: str, prepared: PreparedData | None = None,
              on_epoch_end: Callable[[str, int, dict], None] | None = None) -> TrainState:
    """Runs (or resumes) one stage to `config.<stage>_epochs`, checkpointing every `checkpoint_every_epochs`.

    `on_epoch_end(stage, epoch, record)` is called after each epoch's checkpoint and log line (progress hooks).
    """
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; known: {STAGES}")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if prepared is None:
        prepared = prepare_data(config, workdir, c_ref=stored_c_ref(workdir))
    net, tx = make_network(config), make_optimizer(config)
    epochs = _stage_epochs(config, stage)
    mesh = sharding.make_mesh(config.devices)
    sharding.check_divisible(config.optim.batch_size, mesh)
    checkpoints = checkpointing.StageCheckpoints(workdir, stage, max_to_keep=config.checkpoints_to_keep)
    resume_epoch = checkpoints.latest_epoch()
    if resume_epoch is None:
        state = _initial_state(config, net, tx, prepared, workdir, stage, mesh)
    else:
        state = _restore(checkpoints, _template_state(config, net, tx, prepared, stage), prepared, config,
                         resume_epoch, mesh)
        logging.info("Resuming stage %s from %s after epoch %d/%d", stage, checkpoints.directory, resume_epoch,
                     epochs)
    meta = checkpoint_meta(config, prepared, stage)
    data = prepared.data
    if data.on_host:  # batches gathered on each host and fed to the mesh (see make_host_fed_epoch)
        train_epoch = make_host_fed_epoch(net, tx, config, stage, mesh)
    else:  # data parallel on one host: replicate state and replay, shard each batch (see rivet_jax/sharding.py)
        train_epoch = make_train_epoch(net, tx, config, stage, mesh)
        if mesh.size > 1:
            data = sharding.replicate(data, mesh)
    if mesh.size > 1:
        state = sharding.replicate(state, mesh)
    for epoch in range(resume_epoch or 0, epochs):
        first_step = int(state.step)
        started = time.perf_counter()
        state, metrics, batches = train_epoch(state, data, jnp.asarray(epoch, jnp.int32))
        metrics = jax.device_get(metrics)
        seconds = time.perf_counter() - started
        _check_finite(metrics, batches, prepared, stage, first_step)
        record = {"stage": stage, "epoch": epoch + 1, "epochs": epochs, "step": int(state.step),
                  **{k: float(np.mean(v)) for k, v in metrics.items()},
                  "steps_per_s": len(metrics["loss"]) / seconds, "seconds": seconds}
        if (epoch + 1) % config.checkpoint_every_epochs == 0 or epoch + 1 == epochs:
            checkpoints.save(epoch + 1, saveable(state), meta)
        if jax.process_index() == 0:  # one log line and one metrics record per epoch, not one per host
            _log_epoch(workdir, record)  # after the save: a logged epoch is never lost to a kill
        if on_epoch_end is not None:
            on_epoch_end(stage, epoch + 1, record)
    checkpoints.close()
    return state


def train(config, workdir: str | Path, on_epoch_end=None) -> TrainState:
    """The launcher's entry point: `config.stage` is 'mc', 'td', 'online', 'offline' (mc then td) or 'all'.

    'online' needs an environment to act in: the RouteSim of `config.sim` (configs/routesim.py).
    """
    stages = {"offline": STAGES, "all": ROUTER_STAGES}.get(config.stage, (config.stage,))
    if any(s not in ROUTER_STAGES for s in stages):
        raise ValueError(f"unknown stage {config.stage!r}; known: {ROUTER_STAGES + ('offline', 'all')}")
    workdir = Path(workdir)
    prepared = prepare_data(config, workdir, c_ref=stored_c_ref(workdir))
    state = None
    for stage in stages:
        if stage == "online":
            from rivet_jax import online  # the online stage needs an environment; offline training does not
            from rivet_jax.envs.routesim import make_routesim

            if "sim" not in config:
                raise ValueError("online adaptation acts in an environment: use a config with `sim` "
                                 "(configs/routesim.py)")
            state = online.run_online(config, workdir, make_routesim(config.sim), prepared)
        else:
            state = run_stage(config, workdir, stage, prepared, on_epoch_end)
    return state
