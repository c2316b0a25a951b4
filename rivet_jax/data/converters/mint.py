"""MINT's logged trajectories -> this project's episodes.

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

Three directory layouts are read (this project's `../shared/mint` copy, upstream mint-bench's `data/` and the large
pool `../shared/mint-large`; see `mint_tasks`). Malformed input raises `DataError(path, line, field, why)` like the
schema readers.

The large pool (49 models, 586 tasks in 8 subsets of three categories, xz-compressed) differs in what its records
hold, and the conversion says so in its notes:
- no task files: a task's prompt is the one most of its logs carry (ties: the earliest model in pool order); logs
  with another wording are counted as prompt variants. Task ids may contain '/' (alfworld's game paths).
- `token_counter` comes in three forms: prompt and completion totals (rescaled as above), a single total
  `token_count` (the counted prompt and completion tokens rescaled together to it, so their split is estimated)
  and `{}` (not recorded: counted values kept).
- a model without logs on a subset is unavailable there: every turn of that subset's episodes lists the models
  that have logs for it in `available` (left out when all do).
- a log without any assistant message (the first call failed) is not an episode, but it is a logged fact about
  committing to that model on that task: `MintCorpus.unanswered` lists these (task id, model) pairs.

Task files and layouts are `rivet_jax.data.converters.mint_tasks` and token counting is
`rivet_jax.data.converters.mint_tokens`; their public names are re-exported here, so this module stays the one
import for converting MINT. The fixed 140 / 35 / 141 task manifest belongs to the experiment
(`rivet_jax.experiments.mint_manifest`): it splits MINT's tasks for the paper's tables, which converting does not need.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from absl import logging

from rivet_jax.data.converters.common import read_jsonl
from rivet_jax.data.converters.mint_tasks import (
    UPSTREAM_RUN, MintLayout, detect_layout, model_dirs, parse_task_id, read_mint_tasks, read_task_file,
)
from rivet_jax.data.converters.mint_tokens import (
    TokenCounter, WordPieceCounter, apportion, count_all, default_token_counter,
)
from rivet_jax.data.model_pool import ModelPool
from rivet_jax.data.schema import Episode, Task, Turn
from rivet_jax.data.validation import DataError, Where, require_field

__all__ = [
    # The converter's own names.
    "MintCorpus", "convert_mint",
    # Re-exported, so that this module stays the one import for converting MINT.
    "UPSTREAM_RUN", "detect_layout", "read_mint_tasks", "TokenCounter", "WordPieceCounter", "default_token_counter",
    "apportion",
]


@dataclasses.dataclass(frozen=True)
class MintCorpus:
    """The converted logs with what the conversion had to decide."""

    episodes: list[Episode]  # models in pool order, then subsets, then results-file order
    tasks: dict[str, Task]  # "<subset>/<task_id>" -> Task, for every task of the converted subsets
    stats: dict[str, dict]  # per model (pool order): counts, tokens, cost, how tokens were obtained
    notes: list[str]  # human-readable: zero token counters, skipped episodes, API errors, ...
    zero_token_models: tuple[str, ...]  # models whose token_counter totals are all zero / absent
    skipped: tuple[str, ...]  # episode ids left out (no assistant message)
    layout: str  # "shared", "upstream" or "large"
    unanswered: tuple[tuple[str, str], ...] = ()  # (task id, model) of the skipped logs: calls that failed
    available: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # subset -> models with logs
    categories: dict[str, str] = dataclasses.field(default_factory=dict)  # subset -> task category

    @property
    def n_transitions(self) -> int:
        return sum(len(episode.turns) for episode in self.episodes)


@dataclasses.dataclass(frozen=True)
class _Log:
    """One parsed results.jsonl record, before token counting."""

    model: str
    subset: str
    task_key: str
    where: Where
    messages: tuple[tuple[str, str], ...]  # (role, content), history[0] included
    success: bool
    # (prompt, completion) totals; an int: only the total was recorded; None when not recorded (zero / absent)
    recorded: tuple[int, int] | int | None
    api_error: bool
    prompt_variant: bool  # the logged prompt words the task differently from the task file (layouts with one)
    logged_prompt: str = ""  # the record's task.prompt (the large layout takes its tasks from these)


def _object(value: Any, where: Where, field: str) -> Mapping[str, Any]:
    # Not validation.require_object: this converter's messages name the Python type ("NoneType", not "null").
    if not isinstance(value, Mapping):
        raise where.error(field, f"expected a JSON object, got {type(value).__name__}")
    return value


def _parse_log(obj: Any, where: Where, model: str, subset: str, tasks: Mapping[str, Task] | None,
               task_file: Path | None) -> _Log:
    """One record; `tasks` (None: the large layout, whose records carry their tasks) is what its task must be in."""
    record = _object(obj, where, "<record>")
    task = _object(require_field(record, "task", where, ""), where, "task")
    key = parse_task_id(require_field(task, "task_id", where, "task."), where, "task.task_id", slash=tasks is None)
    variant = False
    if tasks is not None:
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
    else:
        prompt = require_field(task, "prompt", where, "task.")
        if not isinstance(prompt, str) or not prompt.strip():
            raise where.error("task.prompt", f"expected a non-empty str, got {prompt!r}")
    state = _object(require_field(record, "state", where, ""), where, "state")
    history = require_field(state, "history", where, "state.")
    if not isinstance(history, list) or not history:
        raise where.error("state.history", "expected a non-empty list of messages")
    messages = []
    for i, message in enumerate(history):
        field = f"state.history[{i}]"
        message = _object(message, where, field)
        role = require_field(message, "role", where, field + ".")
        content = require_field(message, "content", where, field + ".")
        if role not in ("user", "assistant"):
            raise where.error(field + ".role", f"expected 'user' or 'assistant', got {role!r}")
        if not isinstance(content, str):
            raise where.error(field + ".content", f"expected str, got {type(content).__name__}")
        messages.append((role, content))
    if messages[0][0] != "user":
        raise where.error("state.history[0].role", "the first message must be the user prompt")
    success = require_field(state, "success", where, "state.")
    if not isinstance(success, bool) and success not in (0, 1):
        raise where.error("state.success", f"expected a bool, got {success!r}")
    return _Log(model, subset, key, where, tuple(messages), bool(success),
                _recorded_tokens(state.get("token_counter"), where), state.get("error") is not None, variant,
                task["prompt"] if tasks is None else "")


_PROMPT_HEAD = 60  # characters of the (whitespace-normalised) task prompt a logged prompt must contain


def _squash(text: Any) -> str:
    return " ".join(text.split()) if isinstance(text, str) else ""


def _recorded_tokens(counter: Any, where: Where) -> tuple[int, int] | int | None:
    # Anthropic logs have {} here; others zeros when nothing was recorded: both mean "unknown". PaLM's logs (the
    # large pool) hold one `token_count` total.
    if counter is None:
        return None
    counter = _object(counter, where, "state.token_counter")
    keys = ("token_count",) if "token_count" in counter and "prompt_tokens" not in counter else (
        "prompt_tokens", "completion_tokens")
    values = []
    for key in keys:
        value = counter.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise where.error(f"state.token_counter.{key}", f"expected an int >= 0, got {value!r}")
        values.append(value)
    if not any(values):
        return None
    return values[0] if len(values) == 1 else (values[0], values[1])


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
    layout = MintLayout(name, root)
    found = {p.name: p for p in model_dirs(layout)}
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

    files_of = {model: layout.results_files(found[model]) for model in selected}  # model -> {subset: file}
    subsets = sorted({s for model in selected for s in files_of[model]})
    task_files = {s: layout.task_file(s) for s in subsets} if layout.has_task_files else {}
    tasks_by_subset = {s: read_task_file(path, s) for s, path in task_files.items()}
    categories = {s: layout.category(files_of[m][s]) for m in selected for s in files_of[m]}

    logs: list[_Log] = []
    for number, model in enumerate(selected, start=1):
        if len(selected) > 10:  # the large pool: a line per model while its files are read
            logging.info("reading MINT logs: model %d/%d (%s)", number, len(selected), model)
        for subset, path in files_of[model].items():
            first_line: dict[str, int] = {}
            for where, obj in read_jsonl(path):
                log = _parse_log(obj, where, model, subset, tasks_by_subset.get(subset), task_files.get(subset))
                if log.task_key in first_line:
                    raise where.error("task.task_id",
                                      f"duplicate task {log.task_key!r} (first on line {first_line[log.task_key]})")
                first_line[log.task_key] = where.line
                logs.append(log)
    if not layout.has_task_files:
        tasks_by_subset = _tasks_from_logs(logs, subsets)
    # Models without logs on a subset are unavailable on its tasks (None: every converted model is available).
    available = {s: tuple(m for m in selected if s in files_of[m]) for s in subsets}
    turn_available = {s: None if len(models) == len(selected) else models for s, models in available.items()}

    # Count every distinct message once, in one batch: tokenizer calls are the conversion's cost.
    texts = list(dict.fromkeys(content for log in logs for _, content in log.messages))
    counts = dict(zip(texts, count_all(texts, default_token_counter() if count_tokens is None else count_tokens)))

    episodes: list[Episode] = []
    skipped: list[str] = []
    variants: list[str] = []
    stats = {model: _empty_stats(len(files_of[model])) for model in selected}
    unanswered: list[tuple[str, str]] = []
    for log in logs:
        episode_id = f"{log.model}/{log.subset}/{log.task_key}"
        s = stats[log.model]
        s["api_errors"] += log.api_error
        task = tasks_by_subset[log.subset][log.task_key]
        # With task files the parser compared the logged prompt with the file's; else with the one most logs carry.
        if log.prompt_variant if layout.has_task_files else log.logged_prompt != task.prompt:
            variants.append(episode_id)
            s["prompt_variants"] += 1
        episode = _episode(log, episode_id, task, cards, counts, s, turn_available[log.subset])
        if episode is None:
            skipped.append(episode_id)
            unanswered.append((task.id, log.model))
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
        s["missing_tasks"] = sum(len(tasks_by_subset[x]) for x in files_of[model]) - logged
    tasks = {task.id: task for s in subsets for task in tasks_by_subset[s].values()}
    notes = _notes(name, selected, stats, zero, skipped, variants, subsets, available)
    return MintCorpus(episodes=episodes, tasks=tasks, stats=stats, notes=notes, zero_token_models=zero,
                      skipped=tuple(skipped), layout=name, unanswered=tuple(unanswered), available=available,
                      categories=categories)


def _tasks_from_logs(logs: Sequence[_Log], subsets: Sequence[str]) -> dict[str, dict[str, Task]]:
    """{subset: {task key: Task}} of the large layout: each task's prompt is the one most of its logs carry (ties:
    the first log's, logs being in pool order), in order of first appearance."""
    prompts: dict[tuple[str, str], Counter] = {}
    for log in logs:
        prompts.setdefault((log.subset, log.task_key), Counter())[log.logged_prompt] += 1
    tasks: dict[str, dict[str, Task]] = {s: {} for s in subsets}
    for (subset, key), counts in prompts.items():
        tasks[subset][key] = Task(id=f"{subset}/{key}", prompt=counts.most_common(1)[0][0], family=subset)
    return tasks


def _empty_stats(n_subsets: int) -> dict:
    return {"subsets": n_subsets, "episodes": 0, "turns": 0, "successes": 0, "skipped_no_response": 0,
            "api_errors": 0, "prompt_variants": 0, "recorded_episodes": 0, "prompt_tokens": 0, "completion_tokens": 0,
            "counted_prompt_tokens": 0, "counted_completion_tokens": 0, "_costs": []}


def _episode(log: _Log, episode_id: str, task: Task, pool: ModelPool, counts: Mapping[str, int],
             stats: dict, available: tuple[str, ...] | None = None) -> Episode | None:
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
    if isinstance(log.recorded, int):  # only the total: prompt and completion counts rescaled together to it
        both = apportion(log.recorded, prompt + completion)
        prompt, completion = both[:len(calls)], both[len(calls):]
        stats["recorded_episodes"] += 1
    elif log.recorded is not None:
        prompt, completion = apportion(log.recorded[0], prompt), apportion(log.recorded[1], completion)
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
            available=available,
        ))
        stats["_costs"].append(cost)
    stats["episodes"] += 1
    stats["turns"] += len(turns)
    stats["successes"] += log.success
    stats["prompt_tokens"] += sum(prompt)
    stats["completion_tokens"] += sum(completion)
    return Episode(episode_id=episode_id, task=task, turns=tuple(turns), outcome=int(log.success))


def _notes(layout: str, models: Sequence[str], stats: Mapping[str, dict], zero: Sequence[str],
           skipped: Sequence[str], variants: Sequence[str], subsets: Sequence[str],
           available: Mapping[str, Sequence[str]]) -> list[str]:
    notes = [f"layout: {layout}; models: {', '.join(models)}; subsets: {', '.join(subsets)}"]
    for subset, have in available.items():
        if len(have) < len(models):
            notes.append(f"no logs on {subset} for {', '.join(m for m in models if m not in have)}: unavailable on "
                         "its tasks")
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
        source = "the task file's prompt" if layout != "large" else "the prompt most of the task's logs carry"
        shown = ", ".join(variants[:10]) + (" ..." if len(variants) > 10 else "")
        notes.append(f"{len(variants)} log(s) word the task differently ({source} is used): {shown}")
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
