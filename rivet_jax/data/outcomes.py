"""An episode's outcome: a number in [0, 1], the success term y of Eq. 1 generalised to graded success.

Binary logs keep writing the integer 0 or 1 (y = task solved); graded logs write a score in between (a partial
credit, a judge's grade). `check_outcome` is the schema's reader of the field; `scale_outcome` is for converters
whose source scores success on another scale (MTRouter's -100..100, a 1-10 rubric) and maps it linearly onto
[0, 1]. Both report a bad value as a DataError naming the file, line and field.
"""

from __future__ import annotations

import math
from typing import Any

from rivet_jax.data.validation import Where, as_number, shown, wrong_type

__all__ = ["check_outcome", "scale_outcome"]


def check_outcome(value: Any, where: Where, field: str = "outcome") -> int | float:
    """`value` as read, if it is a finite number in [0, 1]; otherwise a DataError.

    An int stays an int, so a 0/1 log round-trips exactly as written. A bool is refused although Python counts
    it as an int: JSON's true is a sign of a boolean 'success' exported unconverted, which should be explicit.
    """
    if isinstance(value, bool):
        raise wrong_type(where, field, "a number in [0, 1]", value)
    number = as_number(value, where, field)
    if not 0.0 <= number <= 1.0:
        raise where.error(field, f"must be a number in [0, 1], got {shown(value)}")
    return value


def scale_outcome(value: Any, low: float, high: float, where: Where, field: str) -> float:
    """A raw score in [low, high] mapped linearly onto [0, 1] (low -> 0, high -> 1); out of range: a DataError.

    The map is exact at both ends and, floating-point subtraction and division being monotonic, never leaves
    [0, 1] for a score inside the range, so the result always passes `check_outcome`.
    """
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"a score range needs finite low < high, got [{low}, {high}]")
    score = as_number(value, where, field)
    if not low <= score <= high:
        raise where.error(field, f"must be a score in [{low:g}, {high:g}], got {shown(value)}")
    return (score - low) / (high - low)
