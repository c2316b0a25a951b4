"""Figures, drawn only where matplotlib is installed (`pip install "rivet_jax[plots]"`; a clone's
requirements.txt has it). The product commands call `figure`, which without matplotlib logs where the figure would
have gone and returns None, so every command runs without it; the paper's experiments need it."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from absl import logging

INSTALL = 'pip install "rivet_jax[plots]"'


def import_matplotlib() -> None:
    """Imports matplotlib's Figure, if installed: 0.3 s that a command can spend in a thread while it trains, so
    that its report's `figure` does not wait for it."""
    try:
        importlib.import_module("matplotlib.figure")  # deferred: an optional dependency
    except ImportError:
        pass


def figure(path: Path, **kwargs) -> Any | None:
    """A matplotlib Figure (straight to a file: no pyplot state, no display backend) for `path`, or None, with a
    log line naming `path`, when matplotlib is not installed."""
    try:
        from matplotlib.figure import Figure  # deferred: an optional dependency
    except ImportError:
        logging.warning("matplotlib is not installed (%s): %s not drawn", INSTALL, path)
        return None
    return Figure(**kwargs)


def save_figure(fig, path: Path, rect: tuple | None = None):
    """Every figure: laid out tight (inside `rect`, leaving room for a figure legend), 110 dpi PNG."""
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110)
    return fig
