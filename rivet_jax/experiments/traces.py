"""The paper's trace analyses (App. B.5-B.6) on any episodes in the trajectory schema: routing after execution
errors (Tables 6-7) and stage-wise model selection (Table 8, Figure 5).

Both read only what a log holds: each turn's model, response, feedback and cost.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from rivet_jax.data.schema import Episode, Turn

# Table 6: error classes and the signatures matched in a turn's feedback (case-insensitive), first class first.
# MINT's environment answers an action it cannot parse with "I don't understand your input" (RouteSim copies the
# wording); that is the non-executable action of these logs, so it is matched beside the paper's names.
ERROR_SIGNATURES = {
    "non-executable action": ("UnsafeCodeError", "Invalid action", "Illegal action", "Unknown action",
                              "Action not allowed", "I don't understand your input"),
    "formatting error": ("SyntaxError", "JSONDecodeError", "Parse Error", "FormatError", "Malformed action"),
    "tool failure": ("TypeError", "NameError", "AttributeError", "TimeoutError"),
}
STAGES = ("Analyze", "Solve", "Submit")

_ACTION = re.compile(r"<(execute|solution)>", re.I)
_SUBMIT = re.compile(r"<solution>|\bfinal answer\b|\bsolution:", re.I)
# Solve: a tool call or code, or substantive work in the text (a calculation, a stated result, a check).
_SOLVE = re.compile(r"<execute>|\d\s*[-+*/=]\s*\d|\btherefore\b|\bthe result\b|\bverif", re.I)


def error_class(turn: Turn) -> str | None:
    """The Table 6 class of the error the turn's feedback reports, or None."""
    feedback = turn.feedback.lower()
    for name, signatures in ERROR_SIGNATURES.items():
        if any(s.lower() in feedback for s in signatures):
            return name
    return None


def turn_stage(turn: Turn) -> str:
    """Table 8: Submit (a solution action or final answer), Solve (tool use, computation, results), else Analyze
    (planning, interpretation, output with no substantive computation or result)."""
    if _SUBMIT.search(turn.response):
        return "Submit"
    return "Solve" if _SOLVE.search(turn.response) else "Analyze"


def _rate(numerator: int, denominator: int) -> float:
    return numerator / denominator if denominator else float("nan")


def post_error(episodes: Sequence[Episode]) -> dict:
    """App. B.5 on `episodes`. An event is a turn whose feedback reports a classified error.

    error_event_rate = events / all turns; switch_rate = events whose next turn calls another model / events with a
    next turn; switch_cost_usd = mean cost of those changed-model calls; next_turn_recovery = share of those calls
    that make a valid action (<execute> or <solution>) without another classified error.
    """
    turns = sum(len(e.turns) for e in episodes)
    events = [(e, t) for e in episodes for t, turn in enumerate(e.turns) if error_class(turn)]
    followed = [(e, t) for e, t in events if t + 1 < len(e.turns)]
    switched = [e.turns[t + 1] for e, t in followed if e.turns[t + 1].model != e.turns[t].model]
    recovered = [call for call in switched if _ACTION.search(call.response) and error_class(call) is None]
    return {"turns": turns, "error_events": len(events), "error_event_rate": _rate(len(events), turns),
            "switch_rate": _rate(len(switched), len(followed)),
            "switch_cost_usd": float(np.mean([c.cost for c in switched])) if switched else float("nan"),
            "next_turn_recovery": _rate(len(recovered), len(switched)),
            "by_class": {name: sum(error_class(e.turns[t]) == name for e, t in events) for name in ERROR_SIGNATURES}}


def stage_preferences(episodes: Sequence[Episode], models: Sequence[str]) -> dict[str, dict]:
    """App. B.6: per stage, the number of turns and the share of them that called each model (each stage sums
    to 1 on its own)."""
    counts = {stage: dict.fromkeys(models, 0) for stage in STAGES}
    for episode in episodes:
        for turn in episode.turns:
            counts[turn_stage(turn)][turn.model] += 1
    return {stage: {"turns": sum(c.values()), **{m: _rate(n, sum(c.values())) for m, n in c.items()}}
            for stage, c in counts.items()}
