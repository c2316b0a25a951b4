"""Typed records for model pools and logged multi-turn episodes, with strict readers.

Routers are trained on logged trajectories, so a silently mis-parsed record (a typo'd
key, a cost stored as a string, a model name that is not in the pool) quietly biases
everything downstream. The readers here therefore validate every field and report
problems as a `DataError` that names the file, the 1-based line and the field.

The model cards and pool (`ModelCard`, `ModelPool`, `read_model_cards`, `write_model_cards`) are defined in
`rivet_jax.data.model_pool` and `DataError` in `rivet_jax.data.validation`; all are re-exported here, so this
module stays the one import for the data types.

Episodes (`read_episodes` / `write_episodes`) are JSONL, one episode per line:

```json
{"episode_id": "gsm8k-12-a", "task": {"id": "gsm8k-12", "prompt": "...", "family": "gsm8k"},
 "turns": [{"model": "m-small", "response": "<thought>...</thought><execute>print(2+2)</execute>",
            "feedback": "Observation: 4", "prompt_tokens": 812, "completion_tokens": 96, "cost": 0.00031,
            "propensity": 0.25, "available": ["m-small", "m-large"], "done": false}, ...],
 "outcome": 1}
```

`outcome` is a number in [0, 1] (`outcomes.check_outcome`): 0 or 1 for task success, or a graded score.
`family`, `propensity`, `available`, `latency_s` (seconds the call took), `done` are optional, and so are
`cached_tokens` and `cache_write_tokens`: the parts of `prompt_tokens` the provider read from its prompt cache and
wrote to it (what `cost` was billed for; `ModelCard.call_cost`), where the logs say. Blank lines are
skipped (not errors); a line ends at LF, CR LF or a lone CR. Unknown and repeated keys in an episode record are
rejected, because in a schema a typo'd key would otherwise be read as "field absent" and of a
repeated one only the last value would be; so is half a UTF-16 surrogate pair in any string
(it would crash the text encoder later), and a file without a single episode.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rivet_jax.data.files import PathLike, atomic_write_text, decode_line, numbered_lines
from rivet_jax.data.model_pool import ModelCard, ModelPool, read_model_cards, write_model_cards
from rivet_jax.data.outcomes import check_outcome
from rivet_jax.data.validation import (
    MISSING, DataError, Where, as_bool, as_int, as_number, as_str, optional, parse_json, reject_unknown_keys,
    require_field, require_object, wrong_type,
)

__all__ = [
    "DataError",
    "ModelCard",
    "ModelPool",
    "read_model_cards",
    "write_model_cards",
    "Task",
    "Turn",
    "Episode",
    "EpisodeFile",
    "read_episodes",
    "write_episodes",
    "summarize_episodes",
]


@dataclasses.dataclass(frozen=True)
class Task:
    id: str
    prompt: str
    family: str | None = None

    def to_json(self) -> dict:
        obj = {"id": self.id, "prompt": self.prompt}
        if self.family is not None:
            obj["family"] = self.family
        return obj


@dataclasses.dataclass(frozen=True)
class Turn:
    """One routing decision: which model answered, what it cost and what came back."""

    model: str  # must be a pool model name
    response: str  # the model's response text
    feedback: str  # the environment's answer to it ("" allowed, e.g. after the final turn)
    prompt_tokens: int  # >= 0
    completion_tokens: int  # >= 0
    cost: float  # USD, finite, >= 0
    done: bool = False  # terminal turn; the last turn of an Episode is always done
    propensity: float | None = None  # behaviour-policy probability of `model`, in (0, 1]
    available: tuple[str, ...] | None = None  # choosable models (None = whole pool)
    latency_s: float | None = None  # wall time of the call in seconds, where it was measured (launch.serve)
    router: str | None = None  # the version of the router that chose the turn (launch.serve: its deployment's digest)
    lam: float | None = None  # the cost weight (Eq. 1's lambda) the router chose it for (launch.serve)
    cached_tokens: int | None = None  # of prompt_tokens, read from the provider's prompt cache (None: not logged)
    cache_write_tokens: int | None = None  # of prompt_tokens, written to the prompt cache (None: not logged)

    def __post_init__(self):
        # Lists would make the record unhashable and unequal to what the reader produces.
        if self.available is not None:
            object.__setattr__(self, "available", tuple(self.available))

    def to_json(self) -> dict:
        obj: dict[str, Any] = {
            "model": self.model,
            "response": self.response,
            "feedback": self.feedback,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost": self.cost,
        }
        if self.propensity is not None:
            obj["propensity"] = self.propensity
        if self.available is not None:
            obj["available"] = list(self.available)
        if self.latency_s is not None:
            obj["latency_s"] = self.latency_s
        if self.router is not None:
            obj["router"] = self.router
        if self.lam is not None:
            obj["lam"] = self.lam
        if self.cached_tokens is not None:
            obj["cached_tokens"] = self.cached_tokens
        if self.cache_write_tokens is not None:
            obj["cache_write_tokens"] = self.cache_write_tokens
        obj["done"] = self.done
        return obj


_EPISODE_KEYS = ("episode_id", "task", "turns", "outcome")
_TASK_KEYS = ("id", "prompt", "family")
_TURN_KEYS = (
    "model", "response", "feedback", "prompt_tokens", "completion_tokens", "cost",
    "propensity", "available", "latency_s", "router", "lam", "cached_tokens", "cache_write_tokens", "done",
)


@dataclasses.dataclass(frozen=True)
class Episode:
    """One logged multi-turn trajectory on one task, with its final outcome."""

    episode_id: str
    task: Task
    turns: tuple[Turn, ...]  # non-empty
    outcome: float  # in [0, 1]: y of Eq. 1, task success (0 or 1, kept an int when read as one) or a graded score

    def __post_init__(self):
        # The last turn ends the episode by definition; normalising here keeps
        # Episodes built in code equal to what the reader returns after a round trip.
        turns = tuple(self.turns)
        if turns and not turns[-1].done:
            turns = turns[:-1] + (dataclasses.replace(turns[-1], done=True),)
        object.__setattr__(self, "turns", turns)

    def to_json(self) -> dict:
        return {
            "episode_id": self.episode_id,
            "task": self.task.to_json(),
            "turns": [turn.to_json() for turn in self.turns],
            "outcome": self.outcome,
        }

    @classmethod
    def from_json(
        cls, obj: Any, pool: ModelPool, *, path: str = "<memory>", line: int | None = None
    ) -> Episode:
        """Validate and parse one record; raises DataError on the first problem found."""
        where = Where(path, line)
        if not isinstance(obj, Mapping):
            raise wrong_type(where, "<record>", "a JSON object", obj)
        reject_unknown_keys(obj, _EPISODE_KEYS, where, "")
        episode_id = as_str(require_field(obj, "episode_id", where, ""), where, "episode_id", non_empty=True)
        task = _task_from_json(require_field(obj, "task", where, ""), where)
        turns = _turns_from_json(require_field(obj, "turns", where, ""), pool, where)
        outcome = check_outcome(require_field(obj, "outcome", where, ""), where)
        return cls(episode_id=episode_id, task=task, turns=turns, outcome=outcome)


def _task_from_json(obj: Any, where: Where) -> Task:
    obj = require_object(obj, where, "task")
    reject_unknown_keys(obj, _TASK_KEYS, where, "task.")
    return Task(
        id=as_str(require_field(obj, "id", where, "task."), where, "task.id", non_empty=True),
        prompt=as_str(require_field(obj, "prompt", where, "task."), where, "task.prompt"),
        family=optional(obj.get("family", MISSING), as_str, where, "task.family"),
    )


def _turns_from_json(obj: Any, pool: ModelPool, where: Where) -> tuple[Turn, ...]:
    if not isinstance(obj, list):
        raise wrong_type(where, "turns", "list", obj)
    if not obj:
        raise where.error("turns", "an episode needs at least one turn; the list is empty")
    turns = []
    for k, turn_obj in enumerate(obj):
        turn = _turn_from_json(turn_obj, pool, where, f"turns[{k}]")
        if turn.done and k + 1 < len(obj):
            raise where.error(
                f"turns[{k + 1}]", f"turn after the terminal turn turns[{k}] (done=true)"
            )
        turns.append(turn)
    return tuple(turns)


def _pool_model(value: Any, pool: ModelPool, where: Where, field: str) -> str:
    name = as_str(value, where, field)
    if name not in pool:
        raise where.error(field, f"unknown model '{name}'; the pool has: {', '.join(pool.names)}")
    return name


def _available_from_json(value: Any, pool: ModelPool, where: Where, field: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise wrong_type(where, field, "list", value)
    names: list[str] = []
    for i, item in enumerate(value):
        name = _pool_model(item, pool, where, f"{field}[{i}]")
        if name in names:
            raise where.error(f"{field}[{i}]", f"model '{name}' listed twice")
        names.append(name)
    return tuple(names)


def _turn_from_json(obj: Any, pool: ModelPool, where: Where, field: str) -> Turn:
    obj = require_object(obj, where, field)
    prefix = field + "."
    reject_unknown_keys(obj, _TURN_KEYS, where, prefix)

    def required(key: str) -> Any:
        return require_field(obj, key, where, prefix)

    model = _pool_model(required("model"), pool, where, prefix + "model")
    available = optional(
        obj.get("available", MISSING), _available_from_json, pool, where, prefix + "available"
    )
    if available is not None and model not in available:
        raise where.error(
            prefix + "available",
            f"does not contain the turn's model '{model}' (a logged choice must have been available)",
        )
    propensity = optional(obj.get("propensity", MISSING), as_number, where, prefix + "propensity")
    if propensity is not None and not 0.0 < propensity <= 1.0:
        raise where.error(prefix + "propensity", f"must be in (0, 1], got {propensity}")
    done = obj.get("done", MISSING)
    prompt_tokens = as_int(required("prompt_tokens"), where, prefix + "prompt_tokens", minimum=0)
    cache = {key: optional(obj.get(key, MISSING), as_int, where, prefix + key, minimum=0)
             for key in ("cached_tokens", "cache_write_tokens")}
    if sum(v or 0 for v in cache.values()) > prompt_tokens:
        raise where.error(prefix + ("cache_write_tokens" if cache["cache_write_tokens"] else "cached_tokens"),
                          f"cached ({cache['cached_tokens']}) and cache-written ({cache['cache_write_tokens']}) "
                          f"tokens are parts of the prompt's {prompt_tokens} tokens, and exceed them")
    return Turn(
        model=model,
        response=as_str(required("response"), where, prefix + "response"),
        feedback=as_str(required("feedback"), where, prefix + "feedback"),
        prompt_tokens=prompt_tokens,
        completion_tokens=as_int(
            required("completion_tokens"), where, prefix + "completion_tokens", minimum=0
        ),
        cost=as_number(required("cost"), where, prefix + "cost", minimum=0.0),
        done=False if done is MISSING else as_bool(done, where, prefix + "done"),
        propensity=propensity,
        available=available,
        latency_s=optional(obj.get("latency_s", MISSING), as_number, where, prefix + "latency_s", minimum=0.0),
        router=optional(obj.get("router", MISSING), as_str, where, prefix + "router"),
        lam=optional(obj.get("lam", MISSING), as_number, where, prefix + "lam", minimum=0.0),
        **cache,
    )


@dataclasses.dataclass(frozen=True)
class EpisodeFile:
    episodes: list[Episode]
    skipped: list[DataError]  # empty unless skip_invalid


def read_episodes(
    path: PathLike | Sequence[PathLike], pool: ModelPool, *, skip_invalid: bool = False,
    max_skipped_fraction: float = 0.1,
) -> EpisodeFile:
    """Read a JSONL episode file, or several in order as one corpus (`data.files.episode_paths` reads a list or a
    glob), validating every record against `pool`.

    By default the first bad record raises. With skip_invalid=True every bad line's DataError is collected in
    `skipped` and all valid records are kept; of duplicate episode_ids the first occurrence is kept (ids are unique
    across the files too: served episodes added to older logs must not repeat one). Skipping has a limit, per file:
    when more than `max_skipped_fraction` of a file's records (non-blank lines) are bad the file is refused, since
    a corpus that mostly fails to parse is a wrong file or a broken exporter, not a few corrupt lines. A file
    without a single episode is refused either way.
    """
    if not 0.0 <= max_skipped_fraction <= 1.0:
        raise ValueError(f"max_skipped_fraction must be in [0, 1], got {max_skipped_fraction}")
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if not paths:
        raise DataError("<episodes>", None, "<file>", "no episode files given")
    episodes: list[Episode] = []
    skipped: list[DataError] = []
    first_of_id: dict[str, str] = {}  # episode id -> "file:line" where it first appeared
    prompts: dict[str, tuple[str, str]] = {}  # task id -> (its prompt, "file:line" where it first appeared)
    for one in paths:
        path_str = os.fspath(one)
        kept, dropped = len(episodes), len(skipped)
        for where, raw in numbered_lines(path_str):
            try:
                text = decode_line(raw, where)
                if not text.strip():
                    continue
                record = parse_json(text, where)
                episode = Episode.from_json(record, pool, path=path_str, line=where.line)
                first = first_of_id.get(episode.episode_id)
                if first is not None:
                    raise where.error("episode_id", f"duplicate episode_id '{episode.episode_id}' (first on "
                                                    f"{_place(first, path_str)})")
                prompt, at = prompts.get(episode.task.id, (episode.task.prompt, ""))
                if prompt != episode.task.prompt:
                    raise where.error("task.prompt", f"task '{episode.task.id}' has another prompt than on "
                                                     f"{_place(at, path_str)}: one task id, one prompt (the split "
                                                     f"and the router read tasks by id)")
            except DataError as err:
                if not skip_invalid:
                    raise
                skipped.append(err)
                continue
            first_of_id[episode.episode_id] = f"{path_str}:{where.line}"
            episodes.append(episode)
            prompts.setdefault(episode.task.id, (episode.task.prompt, f"{path_str}:{where.line}"))
        check_enough_read(path_str, len(episodes) - kept, skipped[dropped:], max_skipped_fraction)
    return EpisodeFile(episodes=episodes, skipped=skipped)


def _place(at: str, path: str) -> str:
    """An earlier record's "file:line" as an error names it: "line N" in the same file."""
    return f"line {at.removeprefix(path + ':')}" if at.startswith(path + ":") else at


def check_enough_read(path: str, kept: int, skipped: list[DataError], max_skipped_fraction: float) -> None:
    """A file-level DataError when nothing was read, or when skip mode dropped more than the allowed share."""
    records = kept + len(skipped)
    if records == 0:
        raise DataError(path, None, "<file>", "no episodes: the file has no records (it is empty or blank)")
    if kept == 0:
        raise DataError(path, None, "<file>", f"no episodes: all {records} records are invalid; the first: "
                                              f"{skipped[0]}")
    if len(skipped) / records > max_skipped_fraction:
        raise DataError(path, None, "<file>",
                        f"{len(skipped)} of {records} records are invalid ({len(skipped) / records:.0%}), more than "
                        f"max_skipped_fraction={max_skipped_fraction:g} allows; the first: {skipped[0]}")


def write_episodes(path: PathLike, episodes: Iterable[Episode]) -> None:
    """Write one JSON object per line (UTF-8), atomically."""
    # allow_nan=False: a NaN cost would produce a file our own reader rejects.
    lines = [
        json.dumps(ep.to_json(), ensure_ascii=False, allow_nan=False) + "\n" for ep in episodes
    ]
    atomic_write_text(path, "".join(lines))


def summarize_episodes(ep_file: EpisodeFile, pool: ModelPool) -> dict:
    """Headline statistics of a read episode file (for the validate_data launcher)."""
    episodes = ep_file.episodes
    n_turns = sum(len(ep.turns) for ep in episodes)
    turns_per_model = {name: 0 for name in pool.names}  # pool order, zeros included
    for ep in episodes:
        for turn in ep.turns:
            turns_per_model[turn.model] = turns_per_model.get(turn.model, 0) + 1
    return {
        "episodes": len(episodes),
        "turns": n_turns,
        # The success rate on 0/1 outcomes; fsum: graded outcomes are floats
        "mean_outcome": math.fsum(ep.outcome for ep in episodes) / len(episodes) if episodes else None,
        "mean_turns": n_turns / len(episodes) if episodes else None,
        "total_cost": math.fsum(t.cost for ep in episodes for t in ep.turns),
        "turns_per_model": turns_per_model,
        "skipped": len(ep_file.skipped),
    }
