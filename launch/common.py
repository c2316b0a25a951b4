"""What every launcher shares: the errors that describe the user's input, reported as one line."""

import sys
from pathlib import Path
from typing import Callable

import jax

from absl import logging

from rivet_jax import checkpointing, train
from rivet_jax.data.schema import DataError

# Errors about the user's data, workdir or checkpoints: one clear line and exit status 1, not a traceback.
USER_ERRORS = (DataError, checkpointing.CheckpointMismatchError, train.NonFiniteLossError, FileNotFoundError)


def run_reporting_user_errors(job: Callable[[], object]) -> object:
    """Runs `job` with orbax's INFO chatter hidden; a user error ends the process with its message."""
    checkpointing.quiet_orbax_logs()
    try:
        return job()
    except USER_ERRORS as error:
        logging.error("%s: %s", type(error).__name__, error)
        sys.exit(1)


def enable_compilation_cache(workdir: str) -> None:
    """JAX's persistent compilation cache under the workdir: jobs of dozens of runs share a handful of programs,
    so each compiles once, for this run and later ones."""
    jax.config.update("jax_compilation_cache_dir", str(Path(workdir) / "xla_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
