"""What every launcher shares: the errors that describe the user's input, reported as one line; joining a
multi-host run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import jax

from absl import logging

from rivet_jax import checkpointing
from rivet_jax.corpus import NoCorpusError
from rivet_jax.data.schema import DataError
from rivet_jax.learner import NonFiniteLossError

# Errors about the user's data, workdir or checkpoints: one clear line and exit status 1, not a traceback.
USER_ERRORS = (DataError, checkpointing.CheckpointMismatchError, NonFiniteLossError, NoCorpusError,
               FileNotFoundError)


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


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None) -> None:
    """Joins a multi-host run (`jax.distributed.initialize`), before any other JAX call.

    On Cloud TPU VMs, Slurm and Open MPI every argument is found automatically; elsewhere (e.g. GPU hosts
    started by hand) give all three. CPU hosts exchange gradients over gloo.
    """
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(coordinator_address=coordinator_address or None, num_processes=num_processes,
                                   process_id=process_id)
    except ValueError as error:  # no cluster found and not all of the three flags given
        logging.error("--multihost: %s Outside TPU VMs, Slurm and Open MPI give --coordinator_address=HOST:PORT "
                      "(process 0's), --num_processes and --process_id on every host.", error)
        sys.exit(1)
    logging.info("process %d of %d: %d local devices, %d in all (%s)", jax.process_index(), jax.process_count(),
                 jax.local_device_count(), jax.device_count(), jax.default_backend())
