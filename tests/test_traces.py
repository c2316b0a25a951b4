"""The trace analyses of App. B.5-B.6 on hand-written episodes, with the counts worked out by hand."""

import math

import pytest

from rivet_jax.data.schema import Episode, Task, Turn
from rivet_jax.experiments.traces import error_class, post_error, stage_preferences, turn_stage


def turn(model: str, response: str, feedback: str = "", cost: float = 1.0) -> Turn:
    return Turn(model=model, response=response, feedback=feedback, prompt_tokens=1, completion_tokens=1, cost=cost)


def test_error_classes_follow_table_6():
    assert error_class(turn("a", "x", "Observation: SyntaxError: '(' was never closed")) == "formatting error"
    assert error_class(turn("a", "x", "Observation: NameError: name 'y' is not defined")) == "tool failure"
    assert error_class(turn("a", "x", "Observation: I don't understand your input.")) == "non-executable action"
    assert error_class(turn("a", "x", "Invalid action: search is not allowed")) == "non-executable action"
    assert error_class(turn("a", "x", "Observation: 42")) is None


def test_turn_stages_follow_table_8():
    assert turn_stage(turn("a", "<thought> ok </thought> <solution> 7 </solution>")) == "Submit"
    assert turn_stage(turn("a", "<execute> print(3 + 4) </execute>")) == "Solve"
    assert turn_stage(turn("a", "So 3 + 4 = 7 and the result holds.")) == "Solve"
    assert turn_stage(turn("a", "<thought> First I should work out what is asked. </thought>")) == "Analyze"


def test_post_error_by_hand():
    error = "Observation: NameError: name 'x' is not defined"
    episodes = [
        # error at t0, next call switches a -> b and recovers (valid action, no error): one switched recovery
        Episode("e1", Task("t", "p"), (turn("a", "<execute>x</execute>", error), turn("b", "<execute>1</execute>",
                                       "Observation: 1", cost=2.0), turn("b", "<solution>1</solution>")), 1),
        # error at t0, same model again: followed, not switched; error at t1 is the last turn: not followed
        Episode("e2", Task("t", "p"), (turn("a", "<execute>(</execute>", "SyntaxError"),
                                       turn("a", "<execute>y</execute>", error)), 0),
        # error at t0, switch a -> c, but c stalls (no action): switched, not recovered
        Episode("e3", Task("t", "p"), (turn("a", "<execute>x</execute>", error), turn("c", "hmm", "", cost=4.0)), 0),
    ]
    stats = post_error(episodes)
    assert stats["turns"] == 7 and stats["error_events"] == 4
    assert stats["error_event_rate"] == pytest.approx(4 / 7)
    assert stats["switch_rate"] == pytest.approx(2 / 3)          # events with a next turn: e1 t0, e2 t0, e3 t0
    assert stats["switch_cost_usd"] == pytest.approx((2.0 + 4.0) / 2)
    assert stats["next_turn_recovery"] == pytest.approx(1 / 2)
    assert stats["by_class"] == {"non-executable action": 0, "formatting error": 1, "tool failure": 3}
    empty = post_error([Episode("e", Task("t", "p"), (turn("a", "<solution>1</solution>"),), 1)])
    assert empty["error_events"] == 0 and math.isnan(empty["switch_rate"]) and math.isnan(empty["switch_cost_usd"])


def test_stage_preferences_normalise_each_stage():
    episode = Episode("e", Task("t", "p"), (turn("a", "plan first"), turn("a", "<execute>1</execute>"),
                                            turn("b", "<execute>2</execute>"), turn("b", "<solution>3</solution>")), 1)
    prefs = stage_preferences([episode], ["a", "b", "c"])
    assert prefs["Analyze"] == {"turns": 1, "a": 1.0, "b": 0.0, "c": 0.0}
    assert prefs["Solve"] == {"turns": 2, "a": 0.5, "b": 0.5, "c": 0.0}
    assert prefs["Submit"] == {"turns": 1, "a": 0.0, "b": 1.0, "c": 0.0}
