"""What the test files share: runs trained once per session, and the order the files are handed out in.

The full suite runs in parallel (pytest-xdist, `-n auto --dist loadfile` in pytest.ini: every file on one worker,
so its module fixtures are built once). The longest files, then the others holding a slow test, are handed out
first, so no long one starts last and leaves one worker running alone. `pytest -m "not slow"` is the
inner-loop subset (docs/testing.md).

The tiny configs compile the same programs in many tests and in the launchers' subprocesses: one JAX persistent
compilation cache per session (a fresh temporary directory, shared by the workers and every subprocess through the
environment; the launchers keep it, see launch.common.enable_compilation_cache) compiles each once. A directory
given in JAX_COMPILATION_CACHE_DIR is used as it is.

For the same reason the suite compiles with COMPILE_FAST (set here, before JAX starts, and so in every worker and
subprocess too; XLA_FLAGS that name an optimisation level are kept as they are): its programs are small and mostly
run a few steps, so compiling dominates. Backend optimisation level 0 compiles faster than it loses at run time
(the whole suite: 392 s against 442 s at the default level), and XLA:CPU's older loop emitters compile a training
epoch's program 2.5x faster than its fusion emitters at the same run time (1.2 against 3.3 s; the tiny
reproduction 104 against 125 s). A JAX that no longer knows a flag would refuse to start, so they are tried once
first. The numbers agree with the default build to float tolerance; where a test compares two runs exactly, both are
built alike.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

COMPILE_FAST = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def _with_compile_fast(flags: str) -> str:
    """`flags` and COMPILE_FAST, if this JAX starts with them (a worker inherits the controller's choice)."""
    if "xla_backend_optimization_level" in flags:
        return flags
    wanted = " ".join((flags, *COMPILE_FAST)).strip()
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env={**os.environ, "XLA_FLAGS": wanted},
                           capture_output=True)
    return wanted if probe.returncode == 0 else flags


os.environ["XLA_FLAGS"] = _with_compile_fast(os.environ.get("XLA_FLAGS", ""))

import jax  # noqa: E402  (after XLA_FLAGS)
import pytest

from configs import routesim as routesim_config
from rivet_jax import runs, train
from tests.common import tiny_config


CACHE = "JAX_COMPILATION_CACHE_DIR"


def pytest_configure(config):
    if CACHE not in os.environ:  # the first process of the session (the controller, or a run without workers)
        os.environ[CACHE] = tempfile.mkdtemp(prefix="rivet-jax-test-xla-cache-")
        config.made_compilation_cache = os.environ[CACHE]
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # the tiny programs compile fast, but often
    jax.config.update("jax_compilation_cache_dir", os.environ[CACHE])  # JAX is imported already in this process
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def pytest_unconfigure(config):
    made = getattr(config, "made_compilation_cache", None)
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
        del os.environ[CACHE]


# The files that take longest (each file's summed --durations at ad1b1bd, longest first, from test_reproduce.py's
# 99 s to test_benchmark.py's 20 s: their fixtures run whole experiments), handed out first of all.
LONGEST = ("test_reproduce.py", "test_deploy.py", "test_train_router.py", "test_live.py", "test_notebooks.py",
           "test_run_group.py", "test_mint_experiment.py", "test_routesim.py", "test_serve_redteam.py",
           "test_mint_large.py", "test_sharding.py", "test_calibrate.py", "test_serve.py", "test_online.py",
           "test_benchmark.py")


def pytest_collection_modifyitems(config, items):
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}

    def turn(item):  # stable sort: each file's own order is kept
        name = item.path.name
        return (LONGEST.index(name) if name in LONGEST else len(LONGEST), item.path not in slow_files)

    items.sort(key=turn)


@pytest.fixture(scope="session")
def routesim_tiny_run(tmp_path_factory) -> tuple:
    """(config, workdir, corpus): configs/routesim.py:tiny's corpus collected into `workdir` and one RIVET router
    trained offline on it into `workdir / "train"` (what `launch.evaluate` does). Read it; copy before changing."""
    workdir = tmp_path_factory.mktemp("routesim_tiny")
    config = routesim_config.get_config("tiny")
    corpus = runs.collected_corpus(config, workdir)
    train.train(runs.training_config(config, corpus), workdir / "train")
    return config, workdir, corpus


@pytest.fixture(scope="session")
def demo_router_dir(tmp_path_factory) -> Path:
    """A tiny router (configs/default.py:tiny, offline stages) trained on the RouteSim demo corpus. Read it; copy
    before changing."""
    workdir = tmp_path_factory.mktemp("demo_router")
    train.train(tiny_config(stage="offline"), workdir)
    return workdir
