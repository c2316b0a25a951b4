r"""Trains a RIVET router: `--config.stage=mc`, then `td` (or `offline` for both; `online`/`all` with RouteSim).

  python -m launch.train --config=configs/default.py --workdir=/tmp/rivet --config.stage=mc
  python -m launch.train --config=configs/default.py --workdir=/tmp/rivet --config.stage=td

A killed run started again with the same command resumes from its last checkpoint.
"""

from absl import app, flags, logging
from ml_collections import config_flags

from launch.common import run_reporting_user_errors
from rivet_jax import train

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/<name>.py[:variant]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, embeddings cache and metrics.")
_MULTIHOST = flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize() first (multi-host runs).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    if _MULTIHOST.value:
        import jax
        jax.distributed.initialize()
    logging.info("Config:\n%s", _CONFIG.value)
    run_reporting_user_errors(lambda: train.train(_CONFIG.value, _WORKDIR.value))


if __name__ == "__main__":
    app.run(main)
