r"""Trains a RIVET router: `--config.stage=mc`, then `td` (or `offline` for both; `online`/`all` with RouteSim), and
ends with the validated choice of what to deploy and its verdict on the test tasks (rivet_jax/pipeline.py).

  python -m launch.train --config=configs/default.py --workdir=/tmp/rivet --config.stage=mc
  python -m launch.train --config=configs/default.py --workdir=/tmp/rivet --config.stage=td

A killed run started again with the same command resumes from its last checkpoint. Data parallel over every
device of a host: --config.devices=0. Over several hosts: the same command on every host with --multihost (each
host embeds and reads its own slice of the replay; see docs/scale.md).
"""

from absl import flags, logging
from ml_collections import config_flags

from launch.common import initialize_distributed, run_app, run_reporting_user_errors
from rivet_jax.pipeline import fit

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/<name>.py[:variant]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, embeddings cache and metrics.")
_MULTIHOST = flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize() first (multi-host runs).")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0 (found "
                                   "automatically on TPU VMs, Slurm and Open MPI).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes (found automatically "
                                      "on TPU VMs, Slurm and Open MPI).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-host: this process's index (found automatically on "
                                   "TPU VMs, Slurm and Open MPI).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    if _MULTIHOST.value:
        initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    logging.info("Config:\n%s", _CONFIG.value)
    result = run_reporting_user_errors(lambda: fit(_CONFIG.value, _WORKDIR.value), _CONFIG.value)
    if result and result["verdict_text"]:
        print(result["verdict_text"])


if __name__ == "__main__":
    run_app(main)
