"""The fixed MINT task manifest: which of the 316 tasks are train, validation and test.

The manifest (`mint_manifest.json` beside this module, task ids only) splits the 316 tasks into 140 train /
35 validation / 141 test, stratified by subset: the test counts per subset are the paper's Table 4; the
validation tasks are spread over the subsets in proportion to the subsets' sizes (largest remainder, ties to the
alphabetically first subset): gsm8k 5, hotpotqa 5, math 11, mmlu 8, theoremqa 6. Within a subset the order is a
seeded hash of the task id (blake2b of "<seed>/<subset>/<id>"), so it depends on no RNG implementation.
Regenerate it with `write_manifest("../shared/mint")`.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rivet_jax.data.converters.mint_tasks import read_mint_tasks
from rivet_jax.data.converters.mint_tokens import apportion
from rivet_jax.data.schema import Episode

__all__ = [
    "MINT_SUBSETS", "TABLE4_TEST_COUNTS", "N_VALIDATION", "MANIFEST_SEED", "MANIFEST_FILE", "SPLITS",
    "make_manifest", "write_manifest", "load_manifest", "split_tasks",
]

MINT_SUBSETS = ("gsm8k", "hotpotqa", "math", "mmlu", "theoremqa")
# Test tasks per subset: the paper's Table 4 ("MINT Test", sample / source size).
TABLE4_TEST_COUNTS = {"gsm8k": 21, "hotpotqa": 19, "math": 45, "mmlu": 34, "theoremqa": 22}
N_VALIDATION = 35
MANIFEST_SEED = 42
MANIFEST_FILE = "mint_manifest.json"
SPLITS = ("train", "validation", "test")


def _natural_key(task_id: str) -> tuple:
    # Digit runs compare as numbers, so "math/9" sorts before "math/10" in the shipped file.
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", task_id))


def make_manifest(
    task_ids_by_subset: Mapping[str, Iterable[str | int]],
    seed: int = MANIFEST_SEED,
    *,
    test_counts: Mapping[str, int] = TABLE4_TEST_COUNTS,
    n_validation: int = N_VALIDATION,
) -> dict:
    """{"seed", "train", "validation", "test"} over ids "<subset>/<task_id>", stratified by subset.

    Each subset gives `test_counts[subset]` tasks to test; `n_validation` tasks are spread over the subsets in
    proportion to their sizes (largest remainder, ties to the alphabetically first); the rest is train. Which
    tasks go where follows a seeded hash of each id, so the result depends only on the ids and the seed.
    """
    subsets = sorted(task_ids_by_subset)
    ids = {s: [str(i) for i in task_ids_by_subset[s]] for s in subsets}
    for s in subsets:
        if len(set(ids[s])) != len(ids[s]):
            raise ValueError(f"subset {s!r} lists a task id twice")
        if s not in test_counts:
            raise ValueError(f"no test count for subset {s!r} (known: {', '.join(sorted(test_counts))})")
        if test_counts[s] > len(ids[s]):
            raise ValueError(f"subset {s!r} has {len(ids[s])} tasks, fewer than its {test_counts[s]} test tasks")
    validation_counts = dict(zip(subsets, apportion(n_validation, [len(ids[s]) for s in subsets])))
    splits: dict[str, list[str]] = {name: [] for name in SPLITS}
    for s in subsets:
        n_test, n_val = test_counts[s], validation_counts[s]
        if n_test + n_val > len(ids[s]):
            raise ValueError(f"subset {s!r}: {n_test} test + {n_val} validation > {len(ids[s])} tasks")
        order = sorted(ids[s], key=lambda i: hashlib.blake2b(f"{seed}/{s}/{i}".encode(), digest_size=16).digest())
        splits["test"] += [f"{s}/{i}" for i in order[:n_test]]
        splits["validation"] += [f"{s}/{i}" for i in order[n_test:n_test + n_val]]
        splits["train"] += [f"{s}/{i}" for i in order[n_test + n_val:]]
    return {"seed": seed, **{name: sorted(splits[name], key=_natural_key) for name in SPLITS}}


def write_manifest(mint_dir: str | os.PathLike, path: str | os.PathLike | None = None,
                   seed: int = MANIFEST_SEED) -> dict:
    """Make the manifest from the task files under `mint_dir` and write it (default: the shipped file)."""
    tasks = read_mint_tasks(mint_dir)
    manifest = make_manifest({s: list(t) for s, t in tasks.items()}, seed)
    target = Path(path) if path is not None else Path(__file__).with_name(MANIFEST_FILE)
    target.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def load_manifest() -> dict:
    """The shipped MINT manifest: {"seed": 42, "train": [...], "validation": [...], "test": [...]}."""
    text = importlib.resources.files(__package__).joinpath(MANIFEST_FILE).read_text(encoding="utf-8")
    manifest = json.loads(text)
    if set(manifest) != {"seed", *SPLITS}:
        raise ValueError(f"{MANIFEST_FILE}: expected keys seed, {', '.join(SPLITS)}; got {sorted(manifest)}")
    return manifest


def split_tasks(items: Iterable[Any], manifest: Mapping[str, Any] | None = None) -> dict[str, list]:
    """{"train", "validation", "test"} -> the items (Episodes, Tasks or task id strings) whose task is there.

    Input order is kept within each split. An item whose task is in no split is an error: silently dropping it
    would shrink a split without anyone noticing.
    """
    manifest = load_manifest() if manifest is None else manifest
    split_of = {task_id: name for name in SPLITS for task_id in manifest[name]}
    out: dict[str, list] = {name: [] for name in SPLITS}
    unknown = []
    for item in items:
        task_id = item if isinstance(item, str) else item.task.id if isinstance(item, Episode) else item.id
        name = split_of.get(task_id)
        if name is None:
            unknown.append(task_id)
        else:
            out[name].append(item)
    if unknown:
        raise ValueError(f"{len(unknown)} item(s) with tasks in no split of the manifest, e.g. {unknown[:5]}")
    return out
