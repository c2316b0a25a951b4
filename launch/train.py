r"""Trains a RIVET router offline: `--config.stage=mc`, then `--config.stage=td` (or `offline` for both).

  python -m launch.train --config=configs/default.py --workdir=/tmp/rivet --config.stage=mc
  python -m launch.train --config=configs/default.py --workdir=/tmp/rivet --config.stage=td

A killed run started again with the same command resumes from its last checkpoint.
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from rivet_jax import checkpointing, train
from rivet_jax.data.schema import DataError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/<name>.py[:variant]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, embeddings cache and metrics.")
_MULTIHOST = flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize() first (multi-host runs).")
flags.mark_flags_as_required(["config", "workdir"])

# Errors that describe the user's input or workdir: reported as one clear line, not a traceback.
_USER_ERRORS = (DataError, checkpointing.CheckpointMismatchError, train.NonFiniteLossError, FileNotFoundError)


def main(argv):
    del argv
    if _MULTIHOST.value:
        import jax
        jax.distributed.initialize()
    checkpointing.quiet_orbax_logs()
    logging.info("Config:\n%s", _CONFIG.value)
    try:
        train.train(_CONFIG.value, _WORKDIR.value)
    except _USER_ERRORS as error:
        logging.error("%s: %s", type(error).__name__, error)
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
