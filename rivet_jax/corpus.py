"""The training corpus: finding the logs, reading and embedding them, and gathering batches from the result.

    logs (config.data.episodes + cards, or the RouteSim demo asked for with config.data.demo)
      -> validated episodes -> `Replay` (text-indexed transitions, data/replay.py)
      -> every distinct text embedded once by the frozen encoder (cached in the workdir)
      -> `TrainData` (the embedding table + replay arrays, on the device or on the host)
      -> `gather_batch` -> `Batch`, what the losses read
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from rivet_jax import encoders, sharding
from rivet_jax.config_checks import ConfigError
from rivet_jax.data.cards import card_features
from rivet_jax.data.files import episode_paths
from rivet_jax.data.prompt_cache import cache_aware
from rivet_jax.data.replay import Batch, Replay, Reward, build_replay, reference_cost
from rivet_jax.data.schema import Episode, EpisodeFile, ModelPool, read_episodes, read_model_cards
from rivet_jax.data.splits import MANIFEST, SPLITS, episodes_of, manifest_for
from rivet_jax.encoders import EmbeddingStore, Encoder, make_encoder
from rivet_jax.encoders.table import host_table
from rivet_jax.envs import collect
from rivet_jax.run_identity import corpus_digest


class NoCorpusError(ValueError):
    """No logs were configured and the demo corpus was not asked for."""


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
    put = np.asarray if on_host else sharding.on_device
    return _train_data(replay, embeddings if on_host else sharding.on_device(embeddings, np.float32), pool, put)


def train_data_shapes(replay: Replay, dim: int, pool: ModelPool) -> TrainData:
    """The shapes and dtypes of `make_train_data`'s device-resident data (jax.ShapeDtypeStruct leaves), known
    before the table's `dim`-wide vectors are: what a program needs to compile (`engine.ProgramsAhead`)."""
    put = lambda x: jax.ShapeDtypeStruct(np.shape(x), jax.dtypes.canonicalize_dtype(np.asarray(x).dtype))
    return _train_data(replay, jax.ShapeDtypeStruct((len(replay.texts), dim), jnp.float32), pool, put)


def _train_data(replay: Replay, embeddings, pool: ModelPool, put: Callable) -> TrainData:
    card_x, card_mask = card_features(pool)
    return TrainData(embeddings=embeddings, card_text=put(replay.card_text), card_x=put(card_x),
                     card_mask=put(card_mask), replay={k: put(v) for k, v in replay.arrays().items()})


def gather_batch(data: TrainData, idx) -> Batch:
    """The transitions `idx` (...,) with their vectors looked up in the text table.

    The same code gathers inside jit (device-resident data) and with numpy on the host (host-resident data)."""
    rows = jax.tree.map(lambda x: x[idx], data.replay)
    return Batch(h_t=data.embeddings[rows["state"]], h_tp1=data.embeddings[rows["next_state"]],
                 e_o=data.embeddings[rows["response"]], action=rows["action"], reward=rows["reward"],
                 done=rows["done"], mc_return=rows["mc_return"], cost=rows["cost"], cost_return=rows["cost_return"],
                 lam=rows["lam"], available=rows["available"],
                 next_available=rows["next_available"], stochastic=rows["stochastic"],
                 saving=rows.get("saving"), next_saving=rows.get("next_saving"))


# ------------------------------------------------------------------------------------------------- loading


@dataclasses.dataclass(frozen=True)
class PreparedData:
    pool: ModelPool
    encoder: Encoder
    replay: Replay
    data: TrainData
    c_ref: float
    skipped: int
    digest: dict[str, str] | None = None  # sha256 of the episodes and cards files (`run_identity.corpus_digest`)


def corpus_paths(config, workdir: Path) -> tuple[list[Path], Path]:
    """The configured logs (`config.data.episodes`: one file, several separated by commas, or a glob), or
    (`config.data.demo`) the RouteSim demo corpus collected once into the workdir."""
    if config.data.episodes:
        if not config.data.cards:
            raise ConfigError("config.data.episodes is set but config.data.cards is not: "
                              "name the pool's model_cards.json")
        return [Path(p) for p in episode_paths(config.data.episodes)], Path(config.data.cards)
    if not config.data.demo:
        raise NoCorpusError("no logs to train on: pass --config.data.episodes=FILE.jsonl --config.data.cards="
                            "CARDS.json, or --config.data.demo=True for a small RouteSim demo corpus")
    directory = workdir / "data"
    if not (directory / collect.EPISODES_FILE).exists():
        logging.info("Collecting the RouteSim demo corpus (%d training tasks x 7 logging policies) into %s",
                     config.data.demo_tasks, directory)
        collect.write_demo_corpus(directory, config.data.demo_tasks, config.data.demo_seed)
    return [directory / collect.EPISODES_FILE], directory / collect.CARDS_FILE


def prepare_data(config, workdir: str | Path, c_ref: float | None = None, sharing: PreparedData | None = None,
                 on_shapes: Callable[[TrainData, ModelPool], None] | None = None) -> PreparedData:
    """Reads and validates the logs, serializes states, embeds every distinct text once (cached in the workdir).

    `sharing`: a corpus already prepared from the same logs (another lambda of one run group); where the text table
    comes out the same, this one holds its embeddings and texts instead of a copy of each (the large MINT pool's
    table is 400 MB). `on_shapes(shapes, pool)`: told the device-resident data's shapes (`train_data_shapes`)
    before the texts are embedded (a host-fed corpus: never)."""
    workdir = Path(workdir)
    episode_files, cards_path = corpus_paths(config, workdir)
    pool, episode_file = read_logs(config, episode_files, cards_path)
    for error in episode_file.skipped:
        logging.warning("skipped: %s", error)
    episodes = training_episodes(config, workdir, episode_file.episodes)
    if c_ref is None:
        c_ref = config.reward.c_ref if config.reward.c_ref is not None else reference_cost(episodes)
    encoder = make_encoder(config.encoder)
    replay = build_replay(episodes, pool, count_tokens=encoder.count_tokens,
                          max_tokens=config.max_state_tokens, reward=Reward.of(config, c_ref),
                          cache_aware=cache_aware(config))
    started = time.perf_counter()
    cache_dir = encoders.cache_dir(config, workdir)
    host_fed = config.data.embeddings_on_disk or jax.process_count() > 1  # see engine.make_host_fed_group_epoch
    if on_shapes is not None and not host_fed:
        on_shapes(train_data_shapes(replay, encoder.dim, pool), pool)
    if _same_table(sharing, replay, encoder, host_fed):
        replay = dataclasses.replace(replay, texts=sharing.replay.texts)
        embeddings, how = sharing.data.embeddings, "the table of the run group's first corpus"
    elif host_fed:
        embeddings, how = host_embeddings(config, encoder, cache_dir, replay), "host-fed table"
    else:
        store = EmbeddingStore(encoder, cache_dir)
        embeddings = store.embed(replay.texts)
        how = store.stats
    logging.info("Corpus: %d episodes (%d skipped), %d transitions, %d distinct texts embedded in %.1fs (%s)",
                 len(episodes), len(episode_file.skipped), len(replay), len(replay.texts),
                 time.perf_counter() - started, how)
    data = make_train_data(replay, embeddings, pool, on_host=host_fed)
    return PreparedData(pool=pool, encoder=encoder, replay=replay, data=data, c_ref=c_ref,
                        skipped=len(episode_file.skipped), digest=corpus_digest(episode_files, cards_path))


def _same_table(sharing: PreparedData | None, replay: Replay, encoder: Encoder, host_fed: bool) -> bool:
    return (sharing is not None and sharing.encoder.fingerprint == encoder.fingerprint
            and isinstance(sharing.data.embeddings, np.ndarray) == host_fed and sharing.replay.texts == replay.texts)


def read_logs(config, episode_files: list[Path], cards_path: Path) -> tuple[ModelPool, EpisodeFile]:
    """The pool's cards and the logs read against them, bad records skipped (`EpisodeFile.skipped`) or refused as
    `config.data.skip_invalid` and `max_skipped_fraction` say."""
    pool = read_model_cards(cards_path)
    return pool, read_episodes(episode_files, pool, skip_invalid=config.data.skip_invalid,
                               max_skipped_fraction=config.data.max_skipped_fraction)


def task_split(config, workdir: Path, episodes: list[Episode]) -> dict[str, list[str]] | None:
    """The workdir's task-level split (`data/splits.py`, `<workdir>/splits.json`, drawn or read) with
    `config.data.holdout` fractions or a split to extend; None where nothing is held out."""
    holdout = config.data.holdout
    if not (holdout.validation or holdout.test or holdout.get("extend", "")):   # extend: that split
        return None
    return manifest_for(workdir, episodes, holdout.validation, holdout.test, holdout.seed, holdout.get("extend", ""))


def training_episodes(config, workdir: Path, episodes: list[Episode]) -> list[Episode]:
    """The episodes to train on: all of them, or those of the training tasks of the workdir's `task_split`."""
    splits = task_split(config, workdir, episodes)
    if splits is None:
        return episodes
    logging.info("Task-level split (%s): %s tasks; training on the first", workdir / MANIFEST,
                 " / ".join(f"{len(splits[name])} {name}" for name in SPLITS))
    return episodes_of(episodes, splits["train"])


def slice_text_rows(replay: Replay, rows: slice) -> np.ndarray:
    """The text-table rows a replay slice reads (its states, next states, responses) and the cards, sorted."""
    return np.unique(np.concatenate([replay.state[rows], replay.next_state[rows], replay.response[rows],
                                     replay.card_text]))


def host_embeddings(config, encoder: Encoder, cache_dir: Path, replay: Replay) -> np.ndarray:
    """The table of a host-fed run: this process's rows only (sharded encoder pass), memory-mapped from
    `<cache_dir>/tables/` when `config.data.embeddings_on_disk`."""
    rows = slice_text_rows(replay, sharding.replay_slice(len(replay)))

    def progress(done: int, total: int) -> None:
        logging.info("embedded %d/%d texts of this host's replay slice", done, total)

    return host_table(encoder, lambda: EmbeddingStore(encoder, cache_dir), replay.texts, rows,
                      cache_dir / "tables" if config.data.embeddings_on_disk else None, progress)
