"""What every launcher shares: the errors that describe the user's input, reported as one line."""

import sys
from typing import Callable

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
