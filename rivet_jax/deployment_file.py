"""`<workdir>/deploy.json`, read through one validated schema: what `Router.deployed`, the proxy's hot swap and
`launch.loop` load.

The file is written by `deploy.write_deployment` alone, but people copy, edit and share workdirs, and a proxy
reloads whatever lands on disk. So every field is checked before anything is loaded, and whatever is wrong is one
`DataError` naming the file and the field (safetensors' rule: refuse a malformed file, never half-load it):

  deploy.runs        a non-empty list of directories relative to the workdir, each inside it once symlinks are
                     resolved (a deployment never loads another workdir's router)
  deploy.stage       a router stage: mc, td or online
  deploy.epoch       absent, null or an integer >= 0
  deploy.pessimism   absent or a finite number >= 0
  deploy.commit      absent or true / false (a JSON boolean: the string "false" is refused, not read as true)
  deploy.lam         absent, null or a finite number >= 0: the lambda a lambda-conditioned router routes at
  deploy.recentring  absent, null, or {"k": finite >= 0, "floor": {model: finite}, "centre": {model: finite}},
                     optionally "groups": {group: {"floor": {model: finite}, "centre": {model: finite}}}

A UTF-8 byte-order mark is accepted (editors on Windows write one); a symlinked deploy.json must resolve to a file.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

from rivet_jax.checkpointing import ROUTER_STAGES
from rivet_jax.data.validation import DataError

DEPLOY_FILE = "deploy.json"  # a workdir's validated choice (rivet_jax/deploy.py)

__all__ = ["DEPLOY_FILE", "has_deployment", "read_deployment", "read_deployment_spec", "check_models"]


def has_deployment(workdir: str | os.PathLike) -> bool:
    """Whether the workdir names a deployment: a deploy.json there, even a broken one or a dangling symlink (which
    `read_deployment` then refuses: never silently the last trained stage instead)."""
    return os.path.lexists(Path(workdir) / DEPLOY_FILE)


def read_deployment(workdir: str | os.PathLike) -> dict:
    """The whole deploy.json document, its `deploy` section validated (module docstring); DataError otherwise."""
    path = Path(workdir) / DEPLOY_FILE
    where = str(path)
    if path.is_symlink() and not path.exists():
        raise DataError(where, None, "<file>", f"a symlink to {os.readlink(path)}, which does not exist")
    if path.is_dir():
        raise DataError(where, None, "<file>", "a directory, not a deployment file")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(where, None, "<file>", "no such file: train with launch.train to write one") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise DataError(where, None, "<file>", f"not UTF-8 (byte {error.start}): rewrite it, or refit") from None
    if not text.strip():
        raise DataError(where, None, "<file>", "empty: a save was cut short? refit, or restore the file")
    try:
        document = json.loads(text)
    except ValueError as error:
        line = getattr(error, "lineno", None)
        raise DataError(where, line, "<file>", f"not JSON ({getattr(error, 'msg', error)})") from None
    if not isinstance(document, dict) or not isinstance(document.get("deploy"), dict):
        raise DataError(where, None, "deploy", "expected an object {\"deploy\": {...}} as launch.train writes, got "
                        f"{_kind(document if not isinstance(document, dict) else document.get('deploy'))}")
    _check_spec(document["deploy"], Path(workdir), where)
    return document


def read_deployment_spec(workdir: str | os.PathLike) -> dict:
    """deploy.json's validated `deploy` section: what `Router.deployed` loads."""
    return read_deployment(workdir)["deploy"]


def _check_spec(spec: Mapping[str, Any], workdir: Path, where: str) -> None:
    runs = spec.get("runs")
    if not isinstance(runs, list) or not runs or not all(isinstance(r, str) and r for r in runs):
        raise DataError(where, None, "deploy.runs", f"expected a non-empty list of run directories, got {runs!r}")
    root = workdir.resolve()
    for run in runs:
        resolved = (workdir / run).resolve()
        if Path(run).is_absolute() or not resolved.is_relative_to(root):
            raise DataError(where, None, "deploy.runs", f"{run!r} resolves to {resolved}, outside the workdir {root}: "
                            f"a deployment loads only the workdir's own runs")
    if spec.get("stage") not in ROUTER_STAGES:
        raise DataError(where, None, "deploy.stage", f"expected one of {', '.join(ROUTER_STAGES)}, got "
                        f"{spec.get('stage')!r}")
    epoch = spec.get("epoch")
    if epoch is not None and (not _is_int(epoch) or epoch < 0):
        raise DataError(where, None, "deploy.epoch", f"expected null or an integer >= 0, got {epoch!r}")
    pessimism = spec.get("pessimism", 0.0)
    if not _is_number(pessimism) or pessimism < 0:
        raise DataError(where, None, "deploy.pessimism", f"expected a finite number >= 0, got {pessimism!r}")
    lam = spec.get("lam")
    if lam is not None and (not _is_number(lam) or lam < 0):
        raise DataError(where, None, "deploy.lam", f"expected null or a finite number >= 0, got {lam!r}")
    if not isinstance(spec.get("commit", False), bool):
        raise DataError(where, None, "deploy.commit", f"expected true or false, got {spec.get('commit')!r}")
    recentring = spec.get("recentring")
    if recentring is None:
        return
    if not isinstance(recentring, dict):
        raise DataError(where, None, "deploy.recentring", f"expected null or an object, got {_kind(recentring)}")
    if not _is_number(recentring.get("k")) or recentring["k"] < 0:
        raise DataError(where, None, "deploy.recentring.k", f"expected a finite number >= 0, got "
                        f"{recentring.get('k')!r}")
    _check_levels(where, recentring, "deploy.recentring")
    groups = recentring.get("groups", {})
    if not isinstance(groups, dict):
        raise DataError(where, None, "deploy.recentring.groups", f"expected an object {{group: {{floor, centre}}}}, "
                        f"got {_kind(groups)}")
    for group, levels in groups.items():
        if not isinstance(levels, dict):
            raise DataError(where, None, f"deploy.recentring.groups.{group}", f"expected an object with floor and "
                            f"centre, got {_kind(levels)}")
        _check_levels(where, levels, f"deploy.recentring.groups.{group}")


def _check_levels(where: str, levels: Mapping[str, Any], field: str) -> None:
    """`levels` has a "floor" and a "centre", each {model: finite number}."""
    for part in ("floor", "centre"):
        values = levels.get(part)
        if not isinstance(values, dict) or not values:
            raise DataError(where, None, f"{field}.{part}", f"expected an object {{model: number}}, got "
                            f"{_kind(values)}")
        bad = {m: v for m, v in values.items() if not _is_number(v)}
        if bad:
            raise DataError(where, None, f"{field}.{part}", f"expected a finite number per model, got {bad}")


def check_models(spec: Mapping[str, Any], names, workdir: str | os.PathLike) -> None:
    """The recentring covers every model of the router's pool `names` (DataError naming the missing ones)."""
    recentring = spec.get("recentring")
    if recentring is None:
        return
    levels = {"deploy.recentring": recentring, **{f"deploy.recentring.groups.{group}": part
                                                  for group, part in recentring.get("groups", {}).items()}}
    for field, level in levels.items():
        for part in ("floor", "centre"):
            missing = [m for m in names if m not in level[part]]
            if missing:
                raise DataError(str(Path(workdir) / DEPLOY_FILE), None, f"{field}.{part}",
                                f"no value for the router's models {missing}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _kind(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r}"[:80]
