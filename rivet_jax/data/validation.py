"""The error type and field checkers shared by this package's strict readers.

Every reader of logged data (episodes and model cards in `schema` / `model_pool`, other formats in `converters/`)
reports a malformed record as a `DataError` naming the file, the 1-based line and the field, so a typo'd key or a
cost stored as a string is caught where it is rather than quietly biasing what is trained on it. The checkers here
take the value, a `Where` (file and line) and the field's dotted name, and either return the value typed or raise.
`parse_json` turns text into a JSON value, reporting everything json.loads would raise, or silently accept (a
repeated key, half a surrogate pair), as a DataError too.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

__all__ = [
    "DataError",
    "Where",
    "MISSING",
    "json_type_name",
    "shown",
    "wrong_type",
    "require_object",
    "require_field",
    "reject_unknown_keys",
    "as_str",
    "as_bool",
    "as_int",
    "as_number",
    "optional",
    "parse_json",
]

T = TypeVar("T")
_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1


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


def shown(number: Any) -> str:
    """A number for an error message; a big integer by its size, so that one corrupt record can neither flood the
    message with hundreds of digits nor (past Python's int-to-string limit) crash while it is written."""
    if isinstance(number, int) and number.bit_length() > 64:
        return f"an integer of about {int(number.bit_length() * math.log10(2)) + 1} digits"
    return str(number)


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
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise where.error(_key_field(prefix, key), f"unknown key; {hint}expected only: {', '.join(allowed)}")


def _key_field(prefix: str, key: Any) -> str:
    """The field name of an object's key: `prefix + key`, with an empty key shown as '' so a field is never blank
    and a lone surrogate escaped so the message can be printed."""
    name = str(key).encode("utf-8", "backslashreplace").decode("utf-8")
    return prefix + (name or "''")


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
    if not _INT64_MIN <= value <= _INT64_MAX:  # counts go into int64 arrays downstream
        raise where.error(field, f"outside the 64-bit integer range, got {shown(value)}")
    if minimum is not None and value < minimum:
        raise where.error(field, f"must be >= {minimum}, got {shown(value)}")
    return value


def as_number(value: Any, where: Where, field: str, *, minimum: float | None = None) -> float:
    """A finite int/float (not bool) as float; json.loads accepts NaN/Infinity so check."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise wrong_type(where, field, "number", value)
    try:
        number = float(value)
    except OverflowError:  # an int of more than ~308 digits: JSON reads it exactly, float() cannot
        raise where.error(field, f"too large for a float, got {shown(value)}") from None
    if not math.isfinite(number):
        raise where.error(field, f"must be finite, got {value}")
    if minimum is not None and number < minimum:
        raise where.error(field, f"must be >= {minimum:g}, got {shown(value)}")
    return number


def optional(value: Any, parse: Callable[..., T], *args, **kwargs) -> T | None:
    """`parse(value, ...)` unless the value is absent (MISSING) or null."""
    if value is MISSING or value is None:
        return None
    return parse(value, *args, **kwargs)


class _RepeatedKey(dict):
    """A JSON object in which `key` appeared more than once (json.loads alone would keep its last value silently)."""

    def __init__(self, pairs: list[tuple[str, Any]], key: str):
        super().__init__(pairs)
        self.key = key


def _object_noting_repeated_keys(pairs: list[tuple[str, Any]]) -> dict:
    # Only noted here: `_first_problem` reports it, knowing where the object sits in the record, so the error
    # names the field rather than just the key.
    seen = set()
    for key, _ in pairs:
        if key in seen:
            return _RepeatedKey(pairs, key)
        seen.add(key)
    return dict(pairs)


def _lone_surrogate(text: str) -> str | None:
    """Why `text` is not Unicode text, or None. A JSON escape of half a surrogate pair ("\\ud800") reads as a str
    that cannot be encoded: it would pass every check and crash the encoder (UnicodeEncodeError) much later."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return (f"lone surrogate \\u{ord(text[err.start]):04x} at character {err.start} (half of a UTF-16 pair): "
                f"not Unicode text")
    return None


def _first_problem(value: Any) -> tuple[str, str] | None:
    """(field, why) of the first repeated key or lone surrogate (in a key or a string) in a parsed JSON value, in
    document order. Iterative, so nesting just under json's own limit cannot overflow the stack here."""
    stack = [("", value)]
    while stack:
        field, item = stack.pop()
        if isinstance(item, str) and (why := _lone_surrogate(item)):
            return field or "<record>", why
        prefix = field + "." if field else ""
        if isinstance(item, _RepeatedKey):
            name = _key_field(prefix, item.key)
            return name, f"duplicate key '{name.removeprefix(prefix)}' in a JSON object (only one value can be read)"
        if isinstance(item, dict):
            for key in item:
                if why := _lone_surrogate(key):
                    return _key_field(prefix, key), f"in the key: {why}"
            stack.extend((_key_field(prefix, key), child) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((f"{field}[{i}]", item[i]) for i in reversed(range(len(item))))
    return None


class _NonFinite(ValueError):
    pass


def _refuse_constant(name: str):
    raise _NonFinite(name)


def parse_json(text: str, where: Where, allow_non_finite: bool = True) -> Any:
    """One JSON value: a JSONL record, or (`where.line` None) a whole document such as the model cards.

    Whatever the text, the result is the value or a DataError: invalid JSON, an integer past Python's int-string
    conversion limit and nesting past the decoder's recursion limit on the '<json>' field (a whole document's
    syntax error at its own line); a repeated key or a lone surrogate on the field where it is. NaN and
    Infinity (which Python's json reads) are refused unless `allow_non_finite`.
    """
    try:
        value = json.loads(text, object_pairs_hook=_object_noting_repeated_keys,
                           **({} if allow_non_finite else {"parse_constant": _refuse_constant}))
    except _NonFinite as err:
        raise where.error("<json>", f"invalid JSON: {err} is not a JSON number") from None
    except json.JSONDecodeError as err:
        at = where if where.line is not None else Where(where.path, err.lineno)
        raise at.error("<json>", f"invalid JSON: {err.msg} at column {err.colno}") from None
    except RecursionError:
        raise where.error("<json>", "invalid JSON: nested too deeply to read") from None
    except ValueError:  # json.loads' one other ValueError: int("1" + 5000 zeros) exceeds the conversion limit
        raise where.error(
            "<json>", f"invalid JSON: an integer of more than {sys.get_int_max_str_digits()} digits"
        ) from None
    problem = _first_problem(value)
    if problem is not None:
        raise where.error(*problem)
    return value
