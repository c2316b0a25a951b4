"""The error type and field checkers shared by this package's strict readers.

Every reader of logged data (episodes and model cards in `schema` / `model_pool`, MINT's logs in `mint`) reports a
malformed record as a `DataError` naming the file, the 1-based line and the field, so a typo'd key or a cost stored
as a string is caught where it is rather than quietly biasing what is trained on it. The checkers here take the
value, a `Where` (file and line) and the field's dotted name, and either return the value typed or raise.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

__all__ = [
    "DataError",
    "Where",
    "MISSING",
    "json_type_name",
    "wrong_type",
    "require_object",
    "require_field",
    "reject_unknown_keys",
    "as_str",
    "as_bool",
    "as_int",
    "as_number",
    "optional",
    "parse_json_line",
]

T = TypeVar("T")


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
class Where:
    """The location errors are reported against (file and line)."""

    path: str
    line: int | None

    def error(self, field: str, why: str) -> DataError:
        return DataError(self.path, self.line, field, why)


# "Absent" as distinct from JSON null, for `obj.get(key, MISSING)`.
MISSING = object()


def json_type_name(value: Any) -> str:
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


def wrong_type(where: Where, field: str, expected: str, value: Any) -> DataError:
    """The 'expected X, got Y' error for a value of the wrong JSON type."""
    return where.error(field, f"expected {expected}, got {json_type_name(value)}")


def require_object(value: Any, where: Where, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise wrong_type(where, field, "a JSON object", value)
    return value


def require_field(obj: Mapping[str, Any], key: str, where: Where, prefix: str) -> Any:
    """obj[key], or a 'missing field' DataError."""
    if key not in obj:
        raise where.error(prefix + key, "missing required field")
    return obj[key]


def reject_unknown_keys(
    obj: Mapping[str, Any], allowed: Sequence[str], where: Where, prefix: str
) -> None:
    # In a schema a typo'd key would otherwise be read as "field absent".
    for key in obj:
        if key not in allowed:
            raise where.error(
                prefix + str(key), f"unknown key; expected only: {', '.join(allowed)}"
            )


def as_str(value: Any, where: Where, field: str, *, non_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise wrong_type(where, field, "str", value)
    if non_empty and not value.strip():
        raise where.error(field, "must be a non-empty string")
    return value


def as_bool(value: Any, where: Where, field: str) -> bool:
    if not isinstance(value, bool):
        raise wrong_type(where, field, "bool", value)
    return value


def as_int(value: Any, where: Where, field: str, *, minimum: int | None = None) -> int:
    # bool is an int subclass in Python but never a count in the data.
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong_type(where, field, "int", value)
    if minimum is not None and value < minimum:
        raise where.error(field, f"must be >= {minimum}, got {value}")
    return value


def as_number(value: Any, where: Where, field: str, *, minimum: float | None = None) -> float:
    """A finite int/float (not bool) as float; json.loads accepts NaN/Infinity so check."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise wrong_type(where, field, "number", value)
    number = float(value)
    if not math.isfinite(number):
        raise where.error(field, f"must be finite, got {value}")
    if minimum is not None and number < minimum:
        raise where.error(field, f"must be >= {minimum:g}, got {value}")
    return number


def optional(value: Any, parse: Callable[..., T], *args, **kwargs) -> T | None:
    """`parse(value, ...)` unless the value is absent (MISSING) or null."""
    if value is MISSING or value is None:
        return None
    return parse(value, *args, **kwargs)


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


def parse_json_line(text: str, where: Where) -> Any:
    """One JSONL record; invalid JSON and repeated keys are DataErrors on the '<json>' field."""
    try:
        return json.loads(text, object_pairs_hook=_object_without_duplicate_keys)
    except json.JSONDecodeError as err:
        raise where.error("<json>", f"invalid JSON: {err.msg} at column {err.colno}") from None
    except _DuplicateKey as err:
        raise where.error("<json>", f"duplicate key '{err.args[0]}' in a JSON object") from None
