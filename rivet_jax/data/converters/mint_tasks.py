"""Where MINT's files are, and its task files: the two directory layouts the converter reads.

Three directory layouts are read (detected from what is there):

- this project's copy (`../shared/mint`): `tasks/<subset>.jsonl`, `outputs/<model>/<subset>/results.jsonl`;
- upstream `data/` of xingyaoww/mint-bench: `processed/<subset>/test_prompts.json` (JSONL despite the name) and
  `outputs/<model>/F=None/max5_p2+tool+cd/reasoning/<subset>/results.jsonl` (other configurations are ignored);
- the large pool (`../shared/mint-large`): `outputs/<model>/<category>/<subset>/results.jsonl.xz` for the three
  task categories (reasoning, code_generation, decision_making), no task files: each record carries its task.

Malformed input raises `DataError(path, line, field, why)` like the schema readers.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rivet_jax.data.converters.common import read_jsonl
from rivet_jax.data.schema import Task
from rivet_jax.data.validation import DataError, Where

__all__ = [
    "UPSTREAM_RUN",
    "MintLayout",
    "detect_layout",
    "parse_task_id",
    "read_task_file",
    "model_dirs",
    "read_mint_tasks",
]

# Upstream keeps one directory per run configuration under each model; the logs this project uses are the
# reasoning runs without LLM feedback, 5 actions, 2 proposals, tool + code.
UPSTREAM_RUN = ("F=None", "max5_p2+tool+cd", "reasoning")


@dataclasses.dataclass(frozen=True)
class MintLayout:
    """Where one MINT directory keeps its task files and each model's results files."""

    name: str  # "shared" (this project's copy), "upstream" (mint-bench's data/) or "large" (../shared/mint-large)
    root: Path

    @property
    def has_task_files(self) -> bool:
        """False for the large layout, whose records carry their tasks."""
        return self.name != "large"

    def task_file(self, subset: str) -> Path:
        if self.name == "shared":
            return self.root / "tasks" / f"{subset}.jsonl"
        if self.name == "upstream":
            return self.root / "processed" / subset / "test_prompts.json"
        raise ValueError("the large layout has no task files: its records carry their tasks")

    def run_dir(self, model_dir: Path) -> Path:
        return model_dir.joinpath(*UPSTREAM_RUN) if self.name == "upstream" else model_dir

    def results_files(self, model_dir: Path) -> dict[str, Path]:
        """{subset: its results file} for one model, by subset name."""
        run = self.run_dir(model_dir)
        if self.name != "large":
            return {p.name: p / "results.jsonl" for p in sorted(run.iterdir()) if (p / "results.jsonl").is_file()}
        found: dict[str, Path] = {}
        for path in sorted(run.glob(f"*/*/{LARGE_RESULTS}")):
            subset = path.parent.name
            if subset in found:
                raise DataError(str(path), None, "<file>", f"subset '{subset}' appears under two categories "
                                                           f"(also {found[subset]})")
            found[subset] = path
        return found

    def category(self, results_file: Path) -> str:
        """The task category a results file belongs to ("reasoning" for the reasoning-only layouts)."""
        return results_file.parent.parent.name if self.name == "large" else UPSTREAM_RUN[-1]


LARGE_RESULTS = "results.jsonl.xz"


def detect_layout(mint_dir: str | os.PathLike) -> tuple[str, Path]:
    """("shared" | "upstream" | "large", the directory holding outputs/ (and tasks/ or processed/))."""
    root = Path(mint_dir)
    if (root / "tasks").is_dir():
        name = "shared"
    elif (root / "processed").is_dir():
        name = "upstream"
    elif (root / "data" / "processed").is_dir():  # the root of a mint-bench checkout
        name, root = "upstream", root / "data"
    elif next((root / "outputs").glob(f"*/*/*/{LARGE_RESULTS}"), None) is not None:
        name = "large"
    else:
        raise DataError(
            str(root), None, "<layout>",
            "not a MINT data directory: expected tasks/<subset>.jsonl (this project's copy), "
            "processed/<subset>/test_prompts.json (upstream data/) next to outputs/, or "
            f"outputs/<model>/<category>/<subset>/{LARGE_RESULTS} (the large pool)",
        )
    if not (root / "outputs").is_dir():
        raise DataError(str(root / "outputs"), None, "<file>", "directory does not exist")
    return name, root


def parse_task_id(value: Any, where: Where, field: str, slash: bool = False) -> str:
    # MINT ids are ints; strings are accepted so other copies work. A bool is never an id. Only the large layout
    # has ids with '/' (alfworld's game paths); its task ids are "<subset>/<id>", split at the first '/'.
    if isinstance(value, bool) or not isinstance(value, (int, str)) or str(value).strip() == "":
        raise where.error(field, f"expected an int or a non-empty str task id, got {value!r}")
    if isinstance(value, str) and "/" in value and not slash:
        raise where.error(field, f"a task id may not contain '/' (it separates subset and id): {value!r}")
    return str(value)


def read_task_file(path: Path, subset: str) -> dict[str, Task]:
    """{task id in the file (as str): Task with id "<subset>/<task id>"}, in file order."""
    tasks: dict[str, Task] = {}
    first_line: dict[str, int] = {}
    for where, obj in read_jsonl(path):
        if not isinstance(obj, Mapping):
            raise where.error("<record>", "expected a JSON object")
        if "id" not in obj:
            raise where.error("id", "missing required field")
        if "prompt" not in obj:
            raise where.error("prompt", "missing required field")
        key = parse_task_id(obj["id"], where, "id")
        if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
            raise where.error("prompt", "expected a non-empty str")
        if key in tasks:
            raise where.error("id", f"duplicate task id {key!r} (first on line {first_line[key]})")
        first_line[key] = where.line
        tasks[key] = Task(id=f"{subset}/{key}", prompt=obj["prompt"], family=subset)
    return tasks


def model_dirs(layout: MintLayout) -> list[Path]:
    """Directories under outputs/ that hold the logs this project reads (upstream: the UPSTREAM_RUN config)."""
    outputs = layout.root / "outputs"
    return sorted(p for p in outputs.iterdir() if p.is_dir() and layout.run_dir(p).is_dir())


def read_mint_tasks(mint_dir: str | os.PathLike, subsets: Iterable[str] | None = None) -> dict[str, dict[str, Task]]:
    """{subset: {task id in the file (as str): Task}} in file order, from the task files.

    Default subsets: every tasks/*.jsonl (this project's copy); upstream, those with logs under some model's
    reasoning run (processed/ also holds the non-reasoning MINT tasks). The large layout has no task files (its
    tasks are what `convert_mint` reads from the records).
    """
    name, root = detect_layout(mint_dir)
    layout = MintLayout(name, root)
    if not layout.has_task_files:
        raise DataError(str(root), None, "<layout>", "the large layout has no task files: convert_mint reads each "
                                                     "task from its records")
    if subsets is None:
        if name == "shared":
            subsets = sorted(p.stem for p in (root / "tasks").glob("*.jsonl"))
        else:
            subsets = sorted({s for d in model_dirs(layout) for s in layout.results_files(d)})
    return {subset: read_task_file(layout.task_file(subset), subset) for subset in subsets}
