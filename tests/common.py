"""Helpers the test files share (fixtures that build something are in conftest.py)."""

from pathlib import Path

from configs import default
from rivet_jax import train
from rivet_jax.experiments.common import with_overrides

REPO = Path(__file__).resolve().parents[1]


class SimulatedKill(Exception):
    """Raised from a progress hook to stop a run the way a kill would, between two saves."""


def tiny_config(**overrides):
    """configs/default.py:tiny on the RouteSim demo corpus, with dotted-key overrides."""
    return with_overrides(default.get_config("tiny"), {"data.demo": True, **overrides})


def run_stage(config, workdir, stage, **kwargs):
    """One stage of `config`'s run in `workdir` (`train.train` with config.stage = stage)."""
    return train.train(with_overrides(config, {"stage": stage}), workdir, **kwargs)
