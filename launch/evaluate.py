r"""RouteSim end to end: collect the logged corpus, train RIVET offline on it, evaluate against the exact oracle.

  python -m launch.evaluate --config=configs/routesim.py --workdir=/tmp/routesim

Every step resumes from what the workdir already holds. Writes <workdir>/evaluation.{md,json}.
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from rivet_jax import checkpointing, pipelines, train
from rivet_jax.data.schema import DataError

_CONFIG = config_flags.DEFINE_config_file("config", "configs/routesim.py", "RouteSim config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for corpus, checkpoints and results.")
flags.mark_flags_as_required(["workdir"])

_USER_ERRORS = (DataError, checkpointing.CheckpointMismatchError, train.NonFiniteLossError, FileNotFoundError)


def main(argv):
    del argv
    checkpointing.quiet_orbax_logs()
    try:
        result = pipelines.run_routesim(_CONFIG.value, _WORKDIR.value)
    except _USER_ERRORS as error:
        logging.error("%s: %s", type(error).__name__, error)
        sys.exit(1)
    print(open(f"{_WORKDIR.value}/evaluation.md", encoding="utf-8").read())
    del result


if __name__ == "__main__":
    app.run(main)
