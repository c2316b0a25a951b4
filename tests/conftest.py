"""What the test files share: runs trained once per session, and the order the files are handed out in.

The full suite runs in parallel (pytest-xdist, `-n auto --dist loadfile` in pytest.ini: every file on one worker,
so its module fixtures are built once). Files holding a slow test are handed out first, so the long ones do not
start last and leave one worker running alone. `pytest -m "not slow"` is the inner-loop subset (README).
"""

from pathlib import Path

import pytest

from configs import routesim as routesim_config
from rivet_jax import train
from rivet_jax.experiments import routesim
from tests.common import tiny_config


def pytest_collection_modifyitems(config, items):
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: each file's own order is kept


@pytest.fixture(scope="session")
def routesim_tiny_run(tmp_path_factory) -> tuple:
    """(config, workdir, corpus): configs/routesim.py:tiny's corpus collected into `workdir` and one RIVET router
    trained offline on it into `workdir / "train"` (what `launch.evaluate` does). Read it; copy before changing."""
    workdir = tmp_path_factory.mktemp("routesim_tiny")
    config = routesim_config.get_config("tiny")
    corpus = routesim.collect(config, workdir)
    train.train(routesim.training_config(config, corpus), workdir / "train")
    return config, workdir, corpus


@pytest.fixture(scope="session")
def demo_router_dir(tmp_path_factory) -> Path:
    """A tiny router (configs/default.py:tiny, offline stages) trained on the RouteSim demo corpus. Read it; copy
    before changing."""
    workdir = tmp_path_factory.mktemp("demo_router")
    train.train(tiny_config(stage="offline"), workdir)
    return workdir
