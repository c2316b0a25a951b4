"""Figures, drawn only where matplotlib is installed (`pip install "rivet_jax[plots]"`; a clone's
requirements.txt has it). The product commands call `figure`, which without matplotlib logs where the figure would
have gone and returns None, so every command runs without it; the paper's experiments need it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from absl import logging

INSTALL = 'pip install "rivet_jax[plots]"'


def figure_class() -> type | None:
    """matplotlib's Figure, or None where matplotlib is not installed. Its first import takes 0.3 s, which a command
    can spend in a thread while it trains (calibrate's early rollouts do)."""
    try:
        from matplotlib.figure import Figure  # deferred: an optional dependency
    except ImportError:
        return None
    return Figure


def figure(path: Path, **kwargs) -> Any | None:
    """A matplotlib Figure (straight to a file: no pyplot state, no display backend) for `path`, or None, with a
    log line naming `path`, when matplotlib is not installed."""
    figure_type = figure_class()
    if figure_type is None:
        logging.warning("matplotlib is not installed (%s): %s not drawn", INSTALL, path)
        return None
    return figure_type(**kwargs)


def save_figure(fig, path: Path, rect: tuple | None = None):
    """Every figure: laid out tight (inside `rect`, leaving room for a figure legend), 110 dpi PNG."""
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110)
    return fig
