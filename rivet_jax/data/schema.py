"""Typed records for model pools and logged multi-turn episodes, with strict readers.

Routers are trained on logged trajectories, so a silently mis-parsed record (a typo'd
key, a cost stored as a string, a model name that is not in the pool) quietly biases
everything downstream. The readers here therefore validate every field and report
problems as a `DataError` that names the file, the 1-based line and the field.

Model cards (`read_model_cards` / `write_model_cards`) are one JSON document::

    {"note": "...", "models": [{"name": "m-small", "provider": "Acme", "family": "...",
      "open_weights": true, "context_length": 8192, "price_in_per_mtok": 0.5,
      "price_out_per_mtok": 1.5, "capabilities": {"tool_use": true, "code": true,
      "math": null}, "description": "..."}, ...]}

Unknown card keys (e.g. "family", "open_weights") are accepted and ignored; `null`
means unknown.

Episodes (`read_episodes` / `write_episodes`) are JSONL, one episode per line:

```json
{"episode_id": "gsm8k-12-a", "task": {"id": "gsm8k-12", "prompt": "...", "family": "gsm8k"},
 "turns": [{"model": "m-small", "response": "<thought>...</thought><execute>print(2+2)</execute>",
            "feedback": "Observation: 4", "prompt_tokens": 812, "completion_tokens": 96, "cost": 0.00031,
            "propensity": 0.25, "available": ["m-small", "m-large"], "done": false}, ...],
 "outcome": 1}
```

`family`, `propensity`, `available`, `done` are optional. Blank lines are skipped (not
errors). Unknown keys in an episode record are rejected, because in a schema a typo'd
key would otherwise be read as "field absent".
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

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

PathLike = str | os.PathLike


# ----------------------------------------------------------------------------- errors


class DataError(ValueError):
    """A malformed record: names the file, the 1-based line, the field and what was expected."""

    def __init__(self, path: str, line: int | None, field: str, why: str):
        self.path = path
        self.line = line
        self.field = field
        self.why = why
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: field '{self.field}': {self.why}"

    def __reduce__(self):
        # ValueError's default reduce would call __init__ with the single message arg.
        return (DataError, (self.path, self.line, self.field, self.why))


@dataclasses.dataclass(frozen=True)
class _Where:
    """The location errors are reported against (file and line)."""

    path: str
    line: int | None

    def error(self, field: str, why: str) -> DataError:
        return DataError(self.path, self.line, field, why)


_MISSING = object()


def _json_type_name(value: Any) -> str:
    """The JSON-facing name of a value's type, for 'expected X, got Y' messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):  # before int: bool is a subclass of int
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _expected(where: _Where, field: str, expected: str, value: Any) -> DataError:
    return where.error(field, f"expected {expected}, got {_json_type_name(value)}")


def _require_object(value: Any, where: _Where, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _expected(where, field, "a JSON object", value)
    return value


def _get(obj: Mapping[str, Any], key: str, where: _Where, prefix: str) -> Any:
    """obj[key], or a 'missing field' DataError."""
    if key not in obj:
        raise where.error(prefix + key, "missing required field")
    return obj[key]


def _reject_unknown_keys(
    obj: Mapping[str, Any], allowed: Sequence[str], where: _Where, prefix: str
) -> None:
    for key in obj:
        if key not in allowed:
            raise where.error(
                prefix + str(key), f"unknown key; expected only: {', '.join(allowed)}"
            )


def _as_str(value: Any, where: _Where, field: str, *, non_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise _expected(where, field, "str", value)
    if non_empty and not value.strip():
        raise where.error(field, "must be a non-empty string")
    return value


def _as_bool(value: Any, where: _Where, field: str) -> bool:
    if not isinstance(value, bool):
        raise _expected(where, field, "bool", value)
    return value


def _as_int(value: Any, where: _Where, field: str, *, minimum: int | None = None) -> int:
    # bool is an int subclass in Python but never a count in the data.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _expected(where, field, "int", value)
    if minimum is not None and value < minimum:
        raise where.error(field, f"must be >= {minimum}, got {value}")
    return value


def _as_number(value: Any, where: _Where, field: str, *, minimum: float | None = None) -> float:
    """A finite int/float (not bool) as float; json.loads accepts NaN/Infinity so check."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _expected(where, field, "number", value)
    number = float(value)
    if not math.isfinite(number):
        raise where.error(field, f"must be finite, got {value}")
    if minimum is not None and number < minimum:
        raise where.error(field, f"must be >= {minimum:g}, got {value}")
    return number


def _optional(value: Any, parse, *args, **kwargs):
    """`parse(value, ...)` unless the value is absent or null."""
    if value is _MISSING or value is None:
        return None
    return parse(value, *args, **kwargs)


# ----------------------------------------------------------------------- model cards


@dataclasses.dataclass(frozen=True)
class ModelCard:
    """What the router may know about one candidate model (its 'card')."""

    name: str
    description: str
    context_length: int | None = None
    price_in_per_mtok: float | None = None  # USD per million prompt tokens
    price_out_per_mtok: float | None = None  # USD per million completion tokens
    capabilities: tuple[tuple[str, bool | None], ...] = ()  # sorted (flag, value); None = unknown
    provider: str | None = None

    def __post_init__(self):
        # Sorted pairs keep equality and hashing independent of the JSON key order.
        pairs = self.capabilities
        if isinstance(pairs, Mapping):
            pairs = pairs.items()
        ordered = sorted(((str(flag), value) for flag, value in pairs), key=lambda kv: kv[0])
        object.__setattr__(self, "capabilities", tuple(ordered))

    def capability(self, flag: str) -> bool | None:
        """The flag's value; None when it is unknown or not listed at all."""
        return dict(self.capabilities).get(flag)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "provider": self.provider,
            "context_length": self.context_length,
            "price_in_per_mtok": self.price_in_per_mtok,
            "price_out_per_mtok": self.price_out_per_mtok,
            "capabilities": dict(self.capabilities),
            "description": self.description,
        }

    @classmethod
    def from_json(
        cls, obj: Any, *, path: str = "<memory>", line: int | None = None, prefix: str = ""
    ) -> ModelCard:
        """Parse one card; unknown keys are ignored (cards carry free-form metadata)."""
        where = _Where(path, line)
        obj = _require_object(obj, where, prefix.rstrip(".") or "<record>")

        def field(key: str) -> Any:
            return obj.get(key, _MISSING)

        capabilities_obj = field("capabilities")
        capabilities: list[tuple[str, bool | None]] = []
        if capabilities_obj is not _MISSING and capabilities_obj is not None:
            capabilities_obj = _require_object(capabilities_obj, where, prefix + "capabilities")
            for flag, value in capabilities_obj.items():
                flag_field = f"{prefix}capabilities.{flag}"
                capabilities.append((flag, _optional(value, _as_bool, where, flag_field)))
        return cls(
            name=_as_str(_get(obj, "name", where, prefix), where, prefix + "name", non_empty=True),
            description=_as_str(
                _get(obj, "description", where, prefix), where, prefix + "description"
            ),
            context_length=_optional(
                field("context_length"), _as_int, where, prefix + "context_length", minimum=1
            ),
            price_in_per_mtok=_optional(
                field("price_in_per_mtok"), _as_number, where, prefix + "price_in_per_mtok",
                minimum=0.0,
            ),
            price_out_per_mtok=_optional(
                field("price_out_per_mtok"), _as_number, where, prefix + "price_out_per_mtok",
                minimum=0.0,
            ),
            capabilities=tuple(capabilities),
            provider=_optional(field("provider"), _as_str, where, prefix + "provider"),
        )


def _check_pool_cards(cards: Sequence[Any], where: _Where) -> None:
    """A pool needs at least one card and unique names (names are the routing targets)."""
    if not cards:
        raise where.error("models", "a model pool needs at least one model card")
    first_index: dict[str, int] = {}
    for i, card in enumerate(cards):
        if not isinstance(card, ModelCard):
            raise _expected(where, f"models[{i}]", "ModelCard", card)
        if card.name in first_index:
            raise where.error(
                f"models[{i}].name",
                f"duplicate model name '{card.name}' (also models[{first_index[card.name]}])",
            )
        first_index[card.name] = i


@dataclasses.dataclass(frozen=True)
class ModelPool:
    """The ordered set of candidate models; a model's index is its action id."""

    cards: tuple[ModelCard, ...]

    def __post_init__(self):
        object.__setattr__(self, "cards", tuple(self.cards))
        _check_pool_cards(self.cards, _Where("<memory>", None))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(card.name for card in self.cards)

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise KeyError(
                f"unknown model '{name}'; the pool has: {', '.join(self.names)}"
            ) from None

    def __len__(self) -> int:
        return len(self.cards)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    @property
    def capability_names(self) -> tuple[str, ...]:
        return tuple(sorted({flag for card in self.cards for flag, _ in card.capabilities}))

    def subset(self, names: Iterable[str]) -> ModelPool:
        """A pool of the named models, in the order given (KeyError for unknown names)."""
        return ModelPool(tuple(self.cards[self.index(name)] for name in names))

    def to_json(self) -> dict:
        return {"models": [card.to_json() for card in self.cards]}

    @classmethod
    def from_json(cls, obj: Any, *, path: str = "<memory>") -> ModelPool:
        where = _Where(path, None)
        obj = _require_object(obj, where, "<record>")
        models = _get(obj, "models", where, "")
        if not isinstance(models, list):
            raise _expected(where, "models", "list", models)
        cards = tuple(
            ModelCard.from_json(card, path=path, prefix=f"models[{i}].")
            for i, card in enumerate(models)
        )
        # Checked here too so the error names the file rather than "<memory>".
        _check_pool_cards(cards, where)
        return cls(cards)

    def differences(self, other: ModelPool) -> list[str]:
        """Human-readable differences (e.g. a checkpoint's pool vs. the current one)."""
        diffs: list[str] = []
        mine, theirs = set(self.names), set(other.names)
        diffs += [f"model '{n}' only in this pool" for n in self.names if n not in theirs]
        diffs += [f"model '{n}' only in the other pool" for n in other.names if n not in mine]
        shared_here = [n for n in self.names if n in theirs]
        shared_there = [n for n in other.names if n in mine]
        if shared_here != shared_there:
            # Order matters: a model's index is its action id.
            diffs.append(f"model order differs: {shared_here} != {shared_there}")
        for name in shared_here:
            diffs += _card_differences(self.cards[self.index(name)], other.cards[other.index(name)])
        return diffs


def _card_differences(mine: ModelCard, theirs: ModelCard) -> list[str]:
    diffs = []
    for f in dataclasses.fields(ModelCard):
        if f.name in ("name", "capabilities"):
            continue
        a, b = getattr(mine, f.name), getattr(theirs, f.name)
        if a == b:
            continue
        if f.name == "description":  # long text: just say it changed
            diffs.append(f"model '{mine.name}': description differs")
        else:
            diffs.append(f"model '{mine.name}': {f.name} {a!r} != {b!r}")
    caps_a, caps_b = dict(mine.capabilities), dict(theirs.capabilities)
    for flag in sorted(caps_a.keys() | caps_b.keys()):
        a, b = caps_a.get(flag, _MISSING), caps_b.get(flag, _MISSING)
        if a != b:
            show = lambda v: "absent" if v is _MISSING else repr(v)  # noqa: E731
            diffs.append(f"model '{mine.name}': capability '{flag}' {show(a)} != {show(b)}")
    return diffs


def _open_error(path: str, err: OSError) -> DataError:
    if isinstance(err, FileNotFoundError):
        return DataError(path, None, "<file>", "file does not exist")
    return DataError(path, None, "<file>", f"cannot read file: {err.strerror or err}")


def read_model_cards(path: PathLike) -> ModelPool:
    """Read a model-card JSON document (see the module docstring) into a ModelPool."""
    path_str = os.fspath(path)
    try:
        with open(path_str, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise _open_error(path_str, err) from None
    except UnicodeDecodeError as err:
        raise DataError(path_str, None, "<json>", f"not valid UTF-8: {err}") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(path_str, err.lineno, "<json>", f"invalid JSON: {err.msg}") from None
    return ModelPool.from_json(obj, path=path_str)


def _atomic_write_text(path: PathLike, text: str) -> None:
    """Write via a temp file in the same directory + os.replace, so readers never see half a file."""
    path_str = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path_str))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path_str)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path_str)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_model_cards(path: PathLike, pool: ModelPool) -> None:
    text = json.dumps(pool.to_json(), indent=1, ensure_ascii=False, allow_nan=False)
    _atomic_write_text(path, text + "\n")


# --------------------------------------------------------------------------- episodes


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
        obj["done"] = self.done
        return obj


_EPISODE_KEYS = ("episode_id", "task", "turns", "outcome")
_TASK_KEYS = ("id", "prompt", "family")
_TURN_KEYS = (
    "model", "response", "feedback", "prompt_tokens", "completion_tokens", "cost",
    "propensity", "available", "done",
)


@dataclasses.dataclass(frozen=True)
class Episode:
    """One logged multi-turn trajectory on one task, with its final 0/1 outcome."""

    episode_id: str
    task: Task
    turns: tuple[Turn, ...]  # non-empty
    outcome: int  # 0 or 1 (final task success)

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
        where = _Where(path, line)
        if not isinstance(obj, Mapping):
            raise _expected(where, "<record>", "a JSON object", obj)
        _reject_unknown_keys(obj, _EPISODE_KEYS, where, "")
        episode_id = _as_str(_get(obj, "episode_id", where, ""), where, "episode_id", non_empty=True)
        task = _task_from_json(_get(obj, "task", where, ""), where)
        turns = _turns_from_json(_get(obj, "turns", where, ""), pool, where)
        outcome = _get(obj, "outcome", where, "")
        if isinstance(outcome, bool) or not isinstance(outcome, int):
            raise _expected(where, "outcome", "the integer 0 or 1", outcome)
        if outcome not in (0, 1):
            raise where.error("outcome", f"must be the integer 0 or 1, got {outcome}")
        return cls(episode_id=episode_id, task=task, turns=turns, outcome=outcome)


def _task_from_json(obj: Any, where: _Where) -> Task:
    obj = _require_object(obj, where, "task")
    _reject_unknown_keys(obj, _TASK_KEYS, where, "task.")
    return Task(
        id=_as_str(_get(obj, "id", where, "task."), where, "task.id", non_empty=True),
        prompt=_as_str(_get(obj, "prompt", where, "task."), where, "task.prompt"),
        family=_optional(obj.get("family", _MISSING), _as_str, where, "task.family"),
    )


def _turns_from_json(obj: Any, pool: ModelPool, where: _Where) -> tuple[Turn, ...]:
    if not isinstance(obj, list):
        raise _expected(where, "turns", "list", obj)
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


def _pool_model(value: Any, pool: ModelPool, where: _Where, field: str) -> str:
    name = _as_str(value, where, field)
    if name not in pool:
        raise where.error(field, f"unknown model '{name}'; the pool has: {', '.join(pool.names)}")
    return name


def _available_from_json(value: Any, pool: ModelPool, where: _Where, field: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _expected(where, field, "list", value)
    names: list[str] = []
    for i, item in enumerate(value):
        name = _pool_model(item, pool, where, f"{field}[{i}]")
        if name in names:
            raise where.error(f"{field}[{i}]", f"model '{name}' listed twice")
        names.append(name)
    return tuple(names)


def _turn_from_json(obj: Any, pool: ModelPool, where: _Where, field: str) -> Turn:
    obj = _require_object(obj, where, field)
    prefix = field + "."
    _reject_unknown_keys(obj, _TURN_KEYS, where, prefix)

    def required(key: str) -> Any:
        return _get(obj, key, where, prefix)

    model = _pool_model(required("model"), pool, where, prefix + "model")
    available = _optional(
        obj.get("available", _MISSING), _available_from_json, pool, where, prefix + "available"
    )
    if available is not None and model not in available:
        raise where.error(
            prefix + "available",
            f"does not contain the turn's model '{model}' (a logged choice must have been available)",
        )
    propensity = _optional(obj.get("propensity", _MISSING), _as_number, where, prefix + "propensity")
    if propensity is not None and not 0.0 < propensity <= 1.0:
        raise where.error(prefix + "propensity", f"must be in (0, 1], got {propensity}")
    done = obj.get("done", _MISSING)
    return Turn(
        model=model,
        response=_as_str(required("response"), where, prefix + "response"),
        feedback=_as_str(required("feedback"), where, prefix + "feedback"),
        prompt_tokens=_as_int(required("prompt_tokens"), where, prefix + "prompt_tokens", minimum=0),
        completion_tokens=_as_int(
            required("completion_tokens"), where, prefix + "completion_tokens", minimum=0
        ),
        cost=_as_number(required("cost"), where, prefix + "cost", minimum=0.0),
        done=False if done is _MISSING else _as_bool(done, where, prefix + "done"),
        propensity=propensity,
        available=available,
    )


@dataclasses.dataclass(frozen=True)
class EpisodeFile:
    episodes: list[Episode]
    skipped: list[DataError]  # empty unless skip_invalid


class _DuplicateKey(Exception):
    pass


def _object_without_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    # json.loads keeps the last of repeated keys silently; a repeated key is a corrupt record.
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def _parse_json_line(text: str, where: _Where) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_object_without_duplicate_keys)
    except json.JSONDecodeError as err:
        raise where.error("<json>", f"invalid JSON: {err.msg} at column {err.colno}") from None
    except _DuplicateKey as err:
        raise where.error("<json>", f"duplicate key '{err.args[0]}' in a JSON object") from None


def read_episodes(path: PathLike, pool: ModelPool, *, skip_invalid: bool = False) -> EpisodeFile:
    """Read a JSONL episode file, validating every record against `pool`.

    By default the first bad record raises. With skip_invalid=True every bad line's
    DataError is collected in `skipped` and all valid records are kept; of duplicate
    episode_ids the first occurrence is kept.
    """
    path_str = os.fspath(path)
    episodes: list[Episode] = []
    skipped: list[DataError] = []
    first_line_of_id: dict[str, int] = {}
    try:
        f = open(path_str, "rb")  # bytes: line numbers count b"\n" only, like `wc -l`
    except OSError as err:
        raise _open_error(path_str, err) from None
    with f:
        for line_no, raw in enumerate(f, start=1):
            where = _Where(path_str, line_no)
            try:
                try:
                    text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
                except UnicodeDecodeError as err:
                    raise where.error("<json>", f"not valid UTF-8: {err.reason}") from None
                if not text.strip():
                    continue
                record = _parse_json_line(text, where)
                episode = Episode.from_json(record, pool, path=path_str, line=line_no)
                first = first_line_of_id.get(episode.episode_id)
                if first is not None:
                    raise where.error(
                        "episode_id",
                        f"duplicate episode_id '{episode.episode_id}' (first on line {first})",
                    )
            except DataError as err:
                if not skip_invalid:
                    raise
                skipped.append(err)
                continue
            first_line_of_id[episode.episode_id] = line_no
            episodes.append(episode)
    return EpisodeFile(episodes=episodes, skipped=skipped)


def write_episodes(path: PathLike, episodes: Iterable[Episode]) -> None:
    """Write one JSON object per line (UTF-8), atomically."""
    # allow_nan=False: a NaN cost would produce a file our own reader rejects.
    lines = [
        json.dumps(ep.to_json(), ensure_ascii=False, allow_nan=False) + "\n" for ep in episodes
    ]
    _atomic_write_text(path, "".join(lines))


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
        "success_rate": sum(ep.outcome for ep in episodes) / len(episodes) if episodes else None,
        "mean_turns": n_turns / len(episodes) if episodes else None,
        "total_cost": math.fsum(t.cost for ep in episodes for t in ep.turns),
        "turns_per_model": turns_per_model,
        "skipped": len(ep_file.skipped),
    }
