"""What the paper's experiments share beyond the run layout (`rivet_jax/runs.py`): the names of RIVET's rows."""

from __future__ import annotations

ONE_RUN = "RIVET (ours, one run)"  # one run of it, where RIVET (ours) averages several (`reproduce.ensemble`)


def pessimistic(c: float) -> str:
    """The row of RIVET (ours) scored as mean - c x sd over its runs (`Router.ensemble(..., pessimism=c)`)."""
    return f"RIVET (ours, pessimism {c:g})"
