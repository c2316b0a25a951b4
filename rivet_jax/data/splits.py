"""Task-level train / validation / test splits of one's own logs, written to the workdir as a manifest of ids.

Splitting by episode would put episodes of one task on both sides (every logging policy ran the same tasks), and a
router that memorised a task's text would look better on "held-out" logs than it is. So whole tasks go to one split,
drawn per `task.family` (tasks without a family form one stratum) so that a rare family is not left out of a split
by chance (every family of 3 tasks or more has one in validation and one in test; a smaller one is named in the
log), and seeded. The manifest (`<workdir>/splits.json`) fixes the split for every later run and stage of that
workdir, and tells `launch.evaluate_logs` which episodes were held out.

Logs grow (serve -> record -> retrain): a new workdir trained on old and new logs together extends the old split
(`config.data.holdout.extend` = the old workdir's splits.json). Every old task keeps its split, whatever families the
new episodes carry, so the old test tasks stay in test; each new task is drawn by its own hash (`hashed_split`), so
its split depends on nothing but its id and the seed, and never moves when yet more logs arrive.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Sequence

import numpy as np
from absl import logging

from rivet_jax.config_checks import ConfigError
from rivet_jax.data.files import atomic_write_text
from rivet_jax.data.schema import Episode

SPLITS = ("train", "validation", "test")
MANIFEST = "splits.json"


def split_tasks(episodes: Sequence[Episode], validation: float, test: float, seed: int) -> dict[str, list[str]]:
    """{split: sorted task ids}: in each family, a seeded permutation of its tasks; the first `held_counts` go to
    test, then to validation, the rest (at least one task) to training."""
    if not (0 <= validation and 0 <= test and validation + test < 1):
        raise ValueError(f"holdout fractions must be >= 0 and sum below 1, got validation {validation}, test {test}")
    families = tasks_by_family(episodes)
    out: dict[str, list[str]] = {name: [] for name in SPLITS}
    for index, family in enumerate(sorted(families)):
        ids = sorted(families[family])
        order = np.random.default_rng([seed, index]).permutation(len(ids))
        n_test, n_validation = held_counts(len(ids), validation, test)
        shuffled = [ids[i] for i in order]
        out["test"] += shuffled[:n_test]
        out["validation"] += shuffled[n_test:n_test + n_validation]
        out["train"] += shuffled[n_test + n_validation:]
    return {name: sorted(ids) for name, ids in out.items()}


def task_folds(splits: dict[str, list[str]], episodes: Sequence[Episode], folds: int,
               seed: int) -> list[dict[str, list[str]]]:
    """Cross-validation over tasks: `folds` manifests of the same tasks, fold j holding out the j-th part of the
    training tasks as validation (test stays test). Per family, a seeded permutation of its training tasks is dealt
    round robin, starting where the last family stopped, so every fold gets a share of every family of `folds`
    tasks or more and the folds differ in size by at most one task."""
    if folds < 2:
        raise ValueError(f"cross-validation needs at least 2 folds, got {folds}")
    train = set(splits["train"])
    families = {name: ids & train for name, ids in tasks_by_family(episodes).items()}
    dealt: list[list[str]] = [[] for _ in range(folds)]
    turn = 0
    for index, family in enumerate(sorted(families)):
        ids = sorted(families[family])
        for i in np.random.default_rng([seed, index, folds]).permutation(len(ids)):
            dealt[turn % folds].append(ids[i])
            turn += 1
    if any(not part for part in dealt):
        raise ValueError(f"{len(train)} training task(s) cannot fill {folds} folds")
    return [{"train": sorted(train - set(part)), "validation": sorted(part), "test": sorted(splits["test"])}
            for part in dealt]


def held_counts(n: int, validation: float, test: float) -> tuple[int, int]:
    """(test, validation) task counts of a family of n tasks: round(share x n) each, and at least one for a share
    above 0 while the family keeps a training task (validation first: with 2 tasks, one is held out to choose on).
    Rounded alone, 10% of a family of 4 is 0: the choice and the verdict never saw the family."""
    n_test = min(round(test * n), n - 1)
    n_validation = min(round(validation * n), n - 1 - n_test)
    if validation > 0 and n_validation == 0 and n - n_test >= 2:
        n_validation = 1
    if test > 0 and n_test == 0 and n - n_validation >= 2:
        n_test = 1
    return n_test, n_validation


def tasks_by_family(episodes: Sequence[Episode]) -> dict[str, set[str]]:
    """{family ("" for none): its task ids}."""
    families: dict[str, set[str]] = defaultdict(set)
    for episode in episodes:
        families[episode.task.family or ""].add(episode.task.id)
    return families


def unheld_families(episodes: Sequence[Episode], splits: dict[str, list[str]]) -> dict[str, list[str]]:
    """{split: the families (by name, "" for none) with no task in it}, for validation and test."""
    families = tasks_by_family(episodes)
    return {name: sorted(f for f, ids in families.items() if not ids & set(splits[name]))
            for name in ("validation", "test")}


def hashed_split(task_id: str, validation: float, test: float, seed: int) -> str:
    """The split of one new task: a uniform draw in [0, 1) from its id's hash (test below `test`, validation below
    `test + validation`, else train)."""
    u = int(hashlib.sha256(f"{seed}:{task_id}".encode("utf-8")).hexdigest()[:15], 16) / 16 ** 15
    return "test" if u < test else "validation" if u < test + validation else "train"


def extend_split(saved: dict[str, list[str]], episodes: Sequence[Episode], validation: float, test: float,
                 seed: int) -> dict[str, list[str]]:
    """`saved` with these episodes' new tasks added, each by `hashed_split`; every saved task stays where it was."""
    out = {name: list(saved[name]) for name in SPLITS}
    known = {task for name in SPLITS for task in saved[name]}
    for task in sorted({e.task.id for e in episodes} - known):
        out[hashed_split(task, validation, test, seed)].append(task)
    return {name: sorted(ids) for name, ids in out.items()}


def read_manifest(path: str | os.PathLike) -> dict:
    """A splits.json as written here; ConfigError when it is not one."""
    try:
        saved = json.loads(Path(path).read_text(encoding="utf-8"))
        if not all(isinstance(saved[name], list) for name in SPLITS):
            raise KeyError
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"{path} is not a task split (a splits.json with {', '.join(SPLITS)} lists)") from None
    return saved


def manifest_for(workdir: str | os.PathLike, episodes: Sequence[Episode], validation: float, test: float,
                 seed: int, extend: str | os.PathLike = "") -> dict[str, list[str]]:
    """The workdir's split: read from its manifest when one exists (it must be for the same fractions and seed,
    and cover these episodes' tasks); else `extend`'s split (an earlier workdir's splits.json) with the new tasks
    added (`extend_split`), or a fresh draw by `split_tasks`; written there."""
    path = Path(workdir) / MANIFEST
    settings = {"validation": validation, "test": test, "seed": seed}
    if path.exists():
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved["settings"] != settings:
            raise ConfigError(f"{path} was drawn with {saved['settings']}, this run asks for {settings}: use a new "
                             f"workdir, or the settings it was drawn with")
        known = {task for name in SPLITS for task in saved[name]}
        new = sorted({e.task.id for e in episodes} - known)
        if new:
            raise ConfigError(f"{path} does not cover {len(new)} task(s) of these logs (e.g. {new[:3]}): the logs "
                             f"changed since it was drawn; train a new workdir with "
                             f"--config.data.holdout.extend={path} (old tasks keep their split)")
        return {name: saved[name] for name in SPLITS}
    origin = {}
    if extend:
        splits = extend_split(read_manifest(extend), episodes, validation, test, seed)
        origin = {"extended_from": os.fspath(extend)}
    else:
        splits = split_tasks(episodes, validation, test, seed)
        unheld = unheld_families(episodes, splits)
        for name, share in (("validation", validation), ("test", test)):
            if share > 0 and (missing := unheld[name]):
                logging.warning("no %s task in %d famil%s too small to hold one out (e.g. %s): the %s cannot "
                                "see them; log more tasks of them", name, len(missing),
                                "y" if len(missing) == 1 else "ies", ", ".join(repr(f) for f in missing[:3]),
                                "choice" if name == "validation" else "verdict")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"settings": settings, **origin, **splits}, indent=1) + "\n")
    return splits


def episodes_of(episodes: Sequence[Episode], task_ids: Sequence[str]) -> list[Episode]:
    """The episodes whose task is one of `task_ids`, in their logged order."""
    wanted = set(task_ids)
    return [e for e in episodes if e.task.id in wanted]
