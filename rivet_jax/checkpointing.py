"""The one place that talks to orbax.

Layout: `<workdir>/checkpoints/<stage>/<epoch>/{state,meta,checksums.json}`. `state` is the array pytree (params,
target params, optimizer state, step, PRNG key data); `meta` is JSON: the config, the candidate pool's cards, the
encoder's fingerprint, the corpus digest, c_ref, the stage and the number of completed epochs; `checksums.json`
holds the sha256 of every file of the two, written once the save has landed. Nothing is pickled. Older checkpoints
are deleted only after that (`max_to_keep`, `keep_period`): a kill at any point of a save leaves an intact one.

A checkpoint whose files no longer match their checksums (a truncated or overwritten file, a missing item, a save
cut short) is damaged: the newest intact one is used instead, with a warning naming the damaged one, and a
training run (`repair=True`) moves the damaged one aside to `<epoch>.damaged` so it can save that epoch again.
A checkpoint is refused against a different pool or encoder with a message naming what differs.

Checksums catch a damaged file, not an edited or mixed-up one: every meta is read through `checked_meta`, one
`DataError` naming the meta file and the field (types, finite numbers, the network's widths by the config's own
rules) before anything it describes is built or loaded.
"""

from __future__ import annotations

import concurrent.futures
import errno
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging as absl_logging

from rivet_jax.data.schema import ModelPool
from rivet_jax.config_checks import RULES
from rivet_jax.data.validation import Where, as_int, as_number, as_str, require_field, require_object, wrong_type
from rivet_jax.run_identity import file_digest

FORMAT_VERSION = 2  # 2: checksums.json and the corpus digest; format 1 checkpoints load unverified
ROUTER_STAGES = ("mc", "td", "online")  # every stage whose checkpoint is a router, in training order
CHECKSUMS = "checksums.json"
ITEMS = ("state", "meta")


class CheckpointMismatchError(ValueError):
    """A checkpoint was made for another candidate pool, encoder or network shape than the one in use."""


class ConfigChangedError(CheckpointMismatchError):
    """A workdir holds checkpoints (or other outputs) made with another configuration or corpus than this run's."""


class DamagedCheckpointError(ValueError):
    """A stage has checkpoints, but none of them is intact."""


class NonFiniteError(FloatingPointError):
    """A loss or parameters hold NaN or inf, at any stage (MC, TD, online) or in a router's checkpoint: training
    saves nothing of the epoch (or trajectory) that produced them, and a router never loads them."""


class BackgroundSaves:
    """Saves (any callables, e.g. `StageCheckpoints.save`) run in one background thread, in the order submitted: a
    save waits on the disk (orbax's writes, fsyncs and renames: about 0.1 s each), and training need not wait with
    it. `wait` returns once every save has landed and raises the first that failed; a failed save also stops the
    next `submit`. Each save is atomic, so a kill loses at most the saves not yet landed, and a run resumes from
    the one before. One process only: a multi-process save meets the other processes in barriers."""

    def __init__(self):
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint-saves")
        self._pending: list[concurrent.futures.Future] = []

    def submit(self, save: Callable[[], None]) -> None:
        for landed in [f for f in self._pending if f.done()]:
            landed.result()
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._pool.submit(save))

    def wait(self) -> None:
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown()

    def __enter__(self) -> "BackgroundSaves":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def stage_dir(workdir: str | os.PathLike, stage: str) -> Path:
    return Path(workdir).resolve() / "checkpoints" / stage


SAVE_HEADROOM = 1 << 20   # bytes a save writes beyond its arrays' (orbax's metadata, the meta JSON, the checksums)


class StageCheckpoints:
    """Checkpoints of one training stage, numbered by completed epochs; only intact ones count.

    `repair`: for the run that trains the stage (holding the workdir's lock) - damaged checkpoints newer than the
    newest intact one are moved aside, so the run can save their epochs again. Readers leave them in place.
    """

    def __init__(self, workdir: str | os.PathLike, stage: str, max_to_keep: int | None = 2, repair: bool = False,
                 keep_period: int | None = None):
        self.directory = stage_dir(workdir, stage)
        self._latest = newest_intact(self.directory, repair)
        self._verified = set() if self._latest is None else {self._latest}   # epochs this reader found intact
        self.max_to_keep, self.keep_period = max_to_keep, keep_period
        # Synchronous saves: a save has landed on disk when `save` returns, so a kill right after loses nothing.
        # Orbax keeps every step: older ones are deleted here (`_prune`), only once the new one is verified. Orbax's
        # own max_to_keep deletes them inside its save, before our checksums land: a kill between the two left one
        # unverified step and nothing to resume from at max_to_keep = 1.
        options = ocp.CheckpointManagerOptions(max_to_keep=None, create=True, enable_async_checkpointing=False)
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

    def latest_epoch(self) -> int | None:
        """The newest intact checkpoint's epoch; None if the stage has none."""
        return self._latest

    def save(self, epoch: int, state: Any, meta: dict) -> None:
        meta = {**meta, "epoch": epoch, "format_version": FORMAT_VERSION}
        need = sum(getattr(leaf, "nbytes", 0) for leaf in jax.tree.leaves(state)) + SAVE_HEADROOM
        if shutil.disk_usage(self.directory).free < need:   # refused before orbax writes: one line, not its threads'
            raise self._no_room(epoch, need)
        self._verified.discard(epoch)
        try:
            self._manager.save(epoch, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                              meta=ocp.args.JsonSave(meta)))
            self._manager.wait_until_finished()
        except Exception as error:   # tensorstore reports a full disk as RESOURCE_EXHAUSTED, not as OSError(ENOSPC)
            if "No space left on device" not in str(error):
                raise
            raise self._no_room(epoch, None) from error
        if jax.process_index() == 0:
            write_checksums(self.directory / str(epoch))
        self._latest = epoch
        self._prune()

    def _no_room(self, epoch: int, need: int | None) -> OSError:
        """A full disk as the launchers report it (one line: `launch.common`), saying what a rerun resumes from: the
        failed save left at most an unfinished `<epoch>.orbax-checkpoint-tmp`, which counts for nothing."""
        free = shutil.disk_usage(self.directory).free
        resumes = "the stage starts again" if self._latest is None else f"it resumes after epoch {self._latest}"
        return OSError(errno.ENOSPC, f"no space left on the device to save {self.directory.name} epoch {epoch} "
                       f"({free / 1e6:.1f} MB free{'' if need is None else f', about {need / 1e6:.1f} MB needed'}): "
                       f"make room and run the same command again; {resumes}", str(self.directory))

    def _prune(self) -> None:
        """Deletes the steps older than the newest `max_to_keep` (those at multiples of `keep_period` stay: the
        validated choice's candidates); called once the newest is verified, so an intact one always remains."""
        if self.max_to_keep is None:
            return
        older = sorted((s for s in self._manager.all_steps() if s < self._latest), reverse=True)
        for step in older[self.max_to_keep - 1:]:
            if not (self.keep_period and step % self.keep_period == 0):
                self._manager.delete(step)
                self._verified.discard(step)

    def restore_meta(self, epoch: int | None = None) -> dict:
        epoch = self._existing(epoch)
        return self._checked(epoch, self._manager.restore(
            epoch, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])

    def restore(self, like_state: Any, epoch: int | None = None) -> tuple[Any, dict]:
        """The state (same tree structure as `like_state`) and meta of `epoch` (default: the latest)."""
        epoch = self._existing(epoch)
        meta = self.restore_meta(epoch)
        restored = self._manager.restore(epoch, args=ocp.args.Composite(state=ocp.args.StandardRestore(like_state)))
        return restored["state"], meta

    def _checked(self, epoch: int, meta: Any) -> dict:
        return checked_meta(meta, str(self.directory / str(epoch) / "meta" / "metadata"))

    def restore_params(self, like_params: Any, epoch: int | None = None) -> tuple[Any, dict]:
        """Only the network parameters of `epoch` (default: the latest), shaped like `like_params` (arrays or
        `jax.ShapeDtypeStruct`s), and the meta: what a router needs, without the optimizer that trained them."""
        epoch = self._existing(epoch)
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        target = {"params": abstract_tree(like_params, device)}
        restore_args = ocp.checkpoint_utils.construct_restore_args(target)  # onto one device, whoever saved it
        try:
            restored = self._manager.restore(epoch, args=ocp.args.Composite(
                state=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True),
                meta=ocp.args.JsonRestore()))
        except Exception:
            self._check_shapes(epoch, like_params)   # other shapes: named; else orbax's own error
            raise
        params = restored["state"]["params"]
        if jax.tree.map(_shape_text, params) != jax.tree.map(_shape_text, like_params):
            self._check_shapes(epoch, like_params)
        return params, self._checked(epoch, restored["meta"])

    def _check_shapes(self, epoch: int, like_params: Any) -> None:
        """CheckpointMismatchError listing the stored parameters whose shapes differ from `like_params`' (what the
        checkpoint's own config and meta imply): an edited or mixed-up checkpoint, named instead of orbax's trace."""
        step_metadata = ocp.PyTreeCheckpointer().metadata(self.directory / str(epoch) / "state")   # no array read
        stored = step_metadata.item_metadata.tree.get("params", {})
        stored_shapes = dict(jax.tree_util.tree_leaves_with_path(jax.tree.map(_shape_text, stored,
                                                                              is_leaf=_is_array_metadata)))
        expected = dict(jax.tree_util.tree_leaves_with_path(jax.tree.map(_shape_text, like_params)))
        differ = [f"{jax.tree_util.keystr(path)} {stored_shapes.get(path, 'missing')} stored, {shape} expected"
                  for path, shape in expected.items() if stored_shapes.get(path) != shape]
        if differ:
            raise CheckpointMismatchError(
                f"{self.directory / str(epoch)}: its parameters do not have the shapes its config and meta give "
                f"({'; '.join(differ[:4])}{'; ...' if len(differ) > 4 else ''}): the checkpoint was changed or "
                f"mixed up with another run's")

    def close(self) -> None:
        self._manager.close()

    def epochs(self) -> list[int]:
        """Every epoch with a checkpoint on disk, oldest first."""
        return sorted(int(step) for step in self._manager.all_steps())

    def _existing(self, epoch: int | None) -> int:
        """`epoch` (default: the newest intact) if its checkpoint is on disk and intact; else a clear error. An
        epoch is verified once by this reader (a router's meta and parameters are two reads of one step)."""
        if epoch is None:
            if self.latest_epoch() is None:
                raise FileNotFoundError(f"no checkpoint in {self.directory}")
            return self.latest_epoch()
        if epoch in self._verified:
            return epoch
        if epoch not in (kept := self.epochs()):
            raise FileNotFoundError(f"no checkpoint of epoch {epoch} in {self.directory} (kept: "
                                    f"{', '.join(map(str, kept)) or 'none'})")
        if (why := damage(self.directory / str(epoch))) is not None:
            raise DamagedCheckpointError(f"{self.directory / str(epoch)} is damaged: {why}")
        self._verified.add(epoch)
        return epoch


# ------------------------------------------------------------------------------------------------ integrity


NETWORK_KEYS = ("model.hidden", "model.card_dim", "model.head_hidden", "model.response_dim", "model.card_inputs",
                "encoder.dim")   # the config keys a router's network is built from, checked by their own rules


def checked_meta(meta: Any, path: str) -> dict:
    """A checkpoint's meta (the JSON `StageCheckpoints.save` wrote) with every field a reader uses checked; DataError
    naming `path` and the field otherwise. Format 1 metas (no corpus digest) are accepted as they were."""
    where = Where(path, None)
    meta = require_object(meta, where, "<meta>")
    version = as_int(meta.get("format_version", 1), where, "format_version", minimum=1)
    if version > FORMAT_VERSION:
        raise where.error("format_version", f"{version} is newer than this rivet_jax reads ({FORMAT_VERSION}): "
                          f"upgrade rivet_jax")
    if as_str(require_field(meta, "stage", where, ""), where, "stage") not in ROUTER_STAGES:
        raise where.error("stage", f"expected one of {', '.join(ROUTER_STAGES)}, got {meta['stage']!r}")
    as_int(require_field(meta, "epoch", where, ""), where, "epoch", minimum=0)
    config = require_object(require_field(meta, "config", where, ""), where, "config")
    for key in NETWORK_KEYS:
        node: Any = config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        valid, expected = RULES[key]   # (settings.SETTINGS' test, what it expects)
        if node is not None and not valid(node):
            raise where.error(f"config.{key}", f"expected {expected}, got {node!r}"[:200])
    ModelPool.from_json(require_field(meta, "pool", where, ""), path=f"{path} (pool)")
    encoder = require_object(require_field(meta, "encoder", where, ""), where, "encoder")
    as_str(require_field(encoder, "fingerprint", where, "encoder."), where, "encoder.fingerprint", non_empty=True)
    if as_number(require_field(meta, "c_ref", where, ""), where, "c_ref") <= 0:
        raise where.error("c_ref", f"expected a cost scale > 0, got {meta['c_ref']!r}")
    as_int(require_field(meta, "state_dim", where, ""), where, "state_dim", minimum=1)
    if version >= 2:
        corpus = require_object(require_field(meta, "corpus", where, ""), where, "corpus")
        for name, digest in corpus.items():
            if not isinstance(digest, str):
                raise wrong_type(where, f"corpus.{name}", "a digest string", digest)
    if "num_new" in meta:   # the online stage's progress
        as_int(meta["num_new"], where, "num_new", minimum=0)
        require_object(require_field(meta, "progress", where, ""), where, "progress")
    return meta


def item_files(step: Path) -> list[str]:
    """The files of a checkpoint's items, as paths relative to its directory."""
    return sorted(p.relative_to(step).as_posix() for item in ITEMS for p in (step / item).rglob("*") if p.is_file())


def write_checksums(step: Path) -> None:
    """Records the sha256 of every item file of a landed save (atomically: a cut-short write leaves none)."""
    sums = {name: file_digest(step / name) for name in item_files(step)}
    partial = step / f"{CHECKSUMS}.partial"
    partial.write_text(json.dumps(sums, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(partial, step / CHECKSUMS)


def damage(step: Path) -> str | None:
    """Why the checkpoint in `step` cannot be trusted, or None when it is intact. A step that resolves outside its
    stage directory (a symlink to another run's checkpoint) is never loaded as this run's."""
    resolved = step.resolve()
    if not resolved.is_relative_to(step.parent.resolve()):
        return f"it resolves to {resolved}, outside its stage directory (a symlink to another run's checkpoint)"
    if not (step / CHECKSUMS).is_file():
        try:
            meta = json.loads((step / "meta" / "metadata").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return "its meta is missing or unreadable"
        if meta.get("format_version", 1) >= 2:
            return f"it has no {CHECKSUMS}: its save did not finish"
        return None if (step / "state").is_dir() else "its state is missing"  # format 1: nothing to verify against
    try:
        sums = json.loads((step / CHECKSUMS).read_text(encoding="utf-8"))
    except ValueError:
        return f"its {CHECKSUMS} is unreadable"
    for item in ITEMS:
        if not any(name.startswith(f"{item}/") for name in sums):
            return f"its {CHECKSUMS} lists no {item} file"
    for name, digest in sorted(sums.items()):
        if not (step / name).resolve().is_relative_to(resolved):
            return f"its {CHECKSUMS} names {name!r}, outside the step"
        if not (step / name).is_file():
            return f"{name} is missing"
        if file_digest(step / name) != digest:
            return f"{name} does not match its checksum"
    return None


def newest_intact(directory: Path, repair: bool = False) -> int | None:
    """The newest intact checkpoint's epoch in a stage directory (None: no checkpoint at all), warning about every
    damaged newer one (and with `repair` moving it aside); DamagedCheckpointError when none is intact."""
    epochs = sorted((int(p.name) for p in directory.glob("*") if p.name.isdigit() and p.is_dir()), reverse=True)
    damaged = []
    for epoch in epochs:
        why = damage(directory / str(epoch))
        if why is None:
            for bad, reason in damaged:
                moved = f"; moved to {_move_aside(directory / str(bad))}" if repair else ""
                absl_logging.warning("checkpoint %s is damaged (%s): using epoch %d instead%s",
                                     directory / str(bad), reason, epoch, moved)
            return epoch
        damaged.append((epoch, why))
    if damaged:
        listed = "; ".join(f"{directory / str(e)}: {why}" for e, why in damaged)
        raise DamagedCheckpointError(f"no intact checkpoint in {directory} ({listed}); delete the directory to "
                                     f"train the stage afresh")
    return None


def _move_aside(step: Path) -> Path:
    """Renames a damaged checkpoint out of orbax's sight (`<epoch>.damaged`, `.damaged.1`, ...), for inspection."""
    target, n = step.with_name(f"{step.name}.damaged"), 0
    while target.exists():
        n += 1
        target = step.with_name(f"{step.name}.damaged.{n}")
    if jax.process_index() == 0:
        step.rename(target)
    return target


def _shape_text(x: Any) -> str:  # a string: a shape tuple would be a pytree node, not a leaf
    return str(tuple(x.shape))


def _is_array_metadata(x: Any) -> bool:
    return hasattr(x, "shape") and not isinstance(x, (dict, list, tuple))


def non_finite_leaves(tree: Any) -> list[str]:
    """The paths of the leaves of `tree` that hold a NaN or an inf, checked on the host: one transfer for the whole
    tree (a router's parameters are a few MB), and no program to compile (a jitted check cost 0.3 s per tree
    structure, more than the check)."""
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    host = jax.device_get([x for _, x in leaves])
    return [jax.tree_util.keystr(path) for (path, _), x in zip(leaves, host) if not np.isfinite(x).all()]


def abstract_tree(tree: Any, sharding) -> Any:
    """`tree`'s shapes and dtypes with `sharding` on every leaf: a restore target that places each array there."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


class _DropOrbaxInfo(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if f"{os.sep}orbax{os.sep}" not in record.pathname:
            return True
        return record.levelno >= logging.WARNING and not _is_item_metadata_warning(record)


def _is_item_metadata_warning(record: logging.LogRecord) -> bool:
    """Orbax's warning, on every restore of one item of a composite checkpoint, that the item's directory has no
    _CHECKPOINT_METADATA: only the step directory has one, as orbax itself saves it. A live run logged 1,578 of
    them; a missing step-level metadata file still warns."""
    path = str(record.args[0]) if isinstance(record.args, tuple) and record.args else ""
    return (str(record.msg).startswith("Metadata file does not exist")
            and Path(path).name == "_CHECKPOINT_METADATA" and Path(path).parent.name in ITEMS)


def quiet_orbax_logs() -> None:
    """Hides orbax's INFO chatter (dozens of lines per save) from absl logging, and its warning that a composite
    checkpoint's items have no metadata of their own (`_is_item_metadata_warning`); other warnings still show.

    For launchers, which own the process's logging; the library itself never calls it.
    """
    logging.getLogger("absl").addFilter(_DropOrbaxInfo())


def latest_stage(workdir: str | os.PathLike, stages: tuple[str, ...]) -> str | None:
    """The last of `stages` that has a checkpoint in `workdir` (stages listed in training order)."""
    found = [s for s in stages if stage_dir(workdir, s).is_dir() and any(stage_dir(workdir, s).iterdir())]
    return found[-1] if found else None


def compatibility_problems(meta: dict, pool: ModelPool, encoder_fingerprint: str, source: str = "checkpoint"
                           ) -> list[str]:
    """Every difference between a checkpoint's pool and encoder and those in use."""
    problems = []
    saved_pool = ModelPool.from_json(meta["pool"], path=f"{source}/meta")
    problems += [f"pool: {d}" for d in saved_pool.differences(pool)]
    if meta["encoder"]["fingerprint"] != encoder_fingerprint:
        problems.append(f"encoder: checkpoint has {meta['encoder']['fingerprint']!r}, "
                        f"this run has {encoder_fingerprint!r}")
    return problems


def check_compatible(meta: dict, pool: ModelPool, encoder_fingerprint: str, source: str = "checkpoint") -> None:
    """Raises CheckpointMismatchError naming every difference between a checkpoint and what is in use."""
    problems = compatibility_problems(meta, pool, encoder_fingerprint, source)
    if problems:
        raise CheckpointMismatchError(f"{source} does not match this run: " + "; ".join(problems))
