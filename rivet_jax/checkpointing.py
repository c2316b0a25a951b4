"""The one place that talks to orbax.

Layout: `<workdir>/checkpoints/<stage>/<epoch>/{state,meta}`. `state` is the array pytree (params, target params,
optimizer state, step, PRNG key data); `meta` is JSON: the config, the candidate pool's cards, the encoder's
fingerprint, c_ref, the stage and the number of completed epochs. Nothing is pickled. A checkpoint is refused
against a different pool or encoder with a message naming what differs.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from rivet_jax.data.schema import ModelPool

FORMAT_VERSION = 1
ROUTER_STAGES = ("mc", "td", "online")  # every stage whose checkpoint is a router, in training order


class CheckpointMismatchError(ValueError):
    """A checkpoint was made for another candidate pool, encoder or network shape than the one in use."""


def stage_dir(workdir: str | os.PathLike, stage: str) -> Path:
    return Path(workdir).resolve() / "checkpoints" / stage


class StageCheckpoints:
    """Checkpoints of one training stage, numbered by completed epochs."""

    def __init__(self, workdir: str | os.PathLike, stage: str, max_to_keep: int | None = 2):
        self.directory = stage_dir(workdir, stage)
        # Synchronous saves: a save has landed on disk when `save` returns, so a kill right after loses nothing.
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                               enable_async_checkpointing=False)
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    def latest_epoch(self) -> int | None:
        return self._manager.latest_step()

    def save(self, epoch: int, state: Any, meta: dict) -> None:
        meta = {**meta, "epoch": epoch, "format_version": FORMAT_VERSION}
        self._manager.save(epoch, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                          meta=ocp.args.JsonSave(meta)))
        self._manager.wait_until_finished()

    def restore_meta(self, epoch: int | None = None) -> dict:
        epoch = self._existing(epoch)
        return self._manager.restore(epoch, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def restore(self, like_state: Any, epoch: int | None = None) -> tuple[Any, dict]:
        """The state (same tree structure as `like_state`) and meta of `epoch` (default: the latest)."""
        epoch = self._existing(epoch)
        restored = self._manager.restore(epoch, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(like_state), meta=ocp.args.JsonRestore()))
        return restored["state"], restored["meta"]

    def restore_params(self, like_params: Any, epoch: int | None = None) -> tuple[Any, dict]:
        """Only the network parameters of `epoch` (default: the latest), shaped like `like_params` (arrays or
        `jax.ShapeDtypeStruct`s), and the meta: what a router needs, without the optimizer that trained them."""
        epoch = self._existing(epoch)
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        target = {"params": abstract_tree(like_params, device)}
        restore_args = ocp.checkpoint_utils.construct_restore_args(target)  # onto one device, whoever saved it
        restored = self._manager.restore(epoch, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True),
            meta=ocp.args.JsonRestore()))
        return restored["state"]["params"], restored["meta"]

    def close(self) -> None:
        self._manager.close()

    def _existing(self, epoch: int | None) -> int:
        epoch = self.latest_epoch() if epoch is None else epoch
        if epoch is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        return epoch


def abstract_tree(tree: Any, sharding) -> Any:
    """`tree`'s shapes and dtypes with `sharding` on every leaf: a restore target that places each array there."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


class _DropOrbaxInfo(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or f"{os.sep}orbax{os.sep}" not in record.pathname


def quiet_orbax_logs() -> None:
    """Hides orbax's INFO chatter (dozens of lines per save) from absl logging; warnings still show.

    For launchers, which own the process's logging; the library itself never calls it.
    """
    logging.getLogger("absl").addFilter(_DropOrbaxInfo())


def latest_stage(workdir: str | os.PathLike, stages: tuple[str, ...]) -> str | None:
    """The last of `stages` that has a checkpoint in `workdir` (stages listed in training order)."""
    found = [s for s in stages if stage_dir(workdir, s).is_dir() and any(stage_dir(workdir, s).iterdir())]
    return found[-1] if found else None


def check_compatible(meta: dict, pool: ModelPool, encoder_fingerprint: str, model_config: dict | None = None,
                     source: str = "checkpoint") -> None:
    """Raises CheckpointMismatchError naming every difference between a checkpoint and what is in use."""
    problems = []
    saved_pool = ModelPool.from_json(meta["pool"], path=f"{source}/meta")
    problems += [f"pool: {d}" for d in saved_pool.differences(pool)]
    if meta["encoder"]["fingerprint"] != encoder_fingerprint:
        problems.append(f"encoder: checkpoint has {meta['encoder']['fingerprint']!r}, "
                        f"this run has {encoder_fingerprint!r}")
    if model_config is not None:
        saved_model = meta["config"]["model"]
        problems += [f"network: model.{k} is {saved_model.get(k)!r} in the checkpoint, {v!r} here"
                     for k, v in model_config.items() if saved_model.get(k) != v]
    if problems:
        raise CheckpointMismatchError(f"{source} does not match this run:\n  " + "\n  ".join(problems))
