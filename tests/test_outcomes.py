"""Outcomes in [0, 1]: the schema's check of the field and the converters' linear rescaling of raw scores."""

import math

import pytest

from rivet_jax.data.outcomes import check_outcome, scale_outcome
from rivet_jax.data.validation import DataError, Where

WHERE = Where("logs.jsonl", 7)


@pytest.mark.parametrize("value", [0, 1, 0.0, 0.25, 1.0])
def test_numbers_in_the_unit_interval_are_kept_as_read(value):
    kept = check_outcome(value, WHERE)
    assert kept == value and type(kept) is type(value)


@pytest.mark.parametrize("value, why", [
    (True, "expected a number in [0, 1], got bool"),
    (2, "must be a number in [0, 1], got 2"),
    (-0.5, "must be a number in [0, 1], got -0.5"),
    (1.0000001, "must be a number in [0, 1], got 1.0000001"),
    (math.nan, "must be finite, got nan"),
    (-math.inf, "must be finite, got -inf"),
    ("0.5", "expected number, got str"),
])
def test_other_values_are_data_errors_of_the_field(value, why):
    with pytest.raises(DataError) as info:
        check_outcome(value, WHERE, "state.reward")
    assert str(info.value) == f"logs.jsonl:7: field 'state.reward': {why}"


@pytest.mark.parametrize("raw, expected", [
    (-100, 0.0), (100, 1.0), (0, 0.5), (50, 0.75), (-25.0, 0.375),  # MTRouter's -100..100: (x + 100) / 200
])
def test_scale_outcome_maps_the_range_linearly(raw, expected):
    assert scale_outcome(raw, -100, 100, WHERE, "score") == expected


def test_scale_outcome_on_a_rubric():
    # a 1-10 rubric: (x - 1) / 9, so 4 -> 1/3 and 10 -> 1
    assert scale_outcome(4, 1, 10, WHERE, "grade") == pytest.approx(1 / 3)
    assert check_outcome(scale_outcome(10, 1, 10, WHERE, "grade"), WHERE) == 1.0


@pytest.mark.parametrize("raw, why", [
    (100.5, "must be a score in [-100, 100], got 100.5"),
    (-101, "must be a score in [-100, 100], got -101"),
    (math.nan, "must be finite, got nan"),
    (False, "expected number, got bool"),
    (None, "expected number, got null"),
])
def test_scale_outcome_refuses_scores_outside_the_range(raw, why):
    with pytest.raises(DataError) as info:
        scale_outcome(raw, -100, 100, WHERE, "score")
    assert str(info.value) == f"logs.jsonl:7: field 'score': {why}"


@pytest.mark.parametrize("low, high", [(1, 1), (10, 1), (0, math.inf), (math.nan, 1)])
def test_scale_outcome_needs_a_proper_range(low, high):
    with pytest.raises(ValueError, match="finite low < high"):
        scale_outcome(0.5, low, high, WHERE, "score")
