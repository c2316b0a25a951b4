"""What the paper's experiments share beyond the run layout (`rivet_jax/runs.py`): the names of RIVET's rows and
the seeds of an ensemble."""

from __future__ import annotations

ONE_RUN = "RIVET (ours, one run)"  # one run of it, where RIVET (ours) averages several (`reproduce.ensemble`)


def pessimistic(c: float) -> str:
    """The row of RIVET (ours) scored as mean - c x sd over its runs (`Router.ensemble(..., pessimism=c)`)."""
    return f"RIVET (ours, pessimism {c:g})"


def member_seeds(seed: int, members: int) -> list[int]:
    """The training seeds of one ensemble: the seed's own run, then seed + 1000, seed + 2000, ... (distinct across
    an experiment's seeds while those are less than 1000 apart)."""
    return [seed + 1000 * m for m in range(members)]
