r"""The paper's experiments on RouteSim in one command: collect, train (offline, online, ablations, lambda sweep),
fit the baselines, evaluate, and write <workdir>/report.md, results.json and results/.

  python -m launch.reproduce --config=configs/routesim.py --workdir=/tmp/rivet

Every phase resumes from what the workdir already holds. `configs/routesim.py:tiny` is a two-minute version.
"""

import sys
from pathlib import Path

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from rivet_jax import checkpointing, experiments, train
from rivet_jax.data.schema import DataError

_CONFIG = config_flags.DEFINE_config_file("config", "configs/routesim.py", "RouteSim config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for everything the run makes.")
flags.mark_flags_as_required(["workdir"])

_USER_ERRORS = (DataError, checkpointing.CheckpointMismatchError, train.NonFiniteLossError, FileNotFoundError)


def main(argv):
    del argv
    checkpointing.quiet_orbax_logs()
    # Dozens of runs share a handful of programs: compile each once, on disk, for this and later runs.
    jax.config.update("jax_compilation_cache_dir", str(Path(_WORKDIR.value) / "xla_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    try:
        experiments.reproduce(_CONFIG.value, _WORKDIR.value)
    except _USER_ERRORS as error:
        logging.error("%s: %s", type(error).__name__, error)
        sys.exit(1)
    print(f"report: {Path(_WORKDIR.value) / 'report.md'}")


if __name__ == "__main__":
    app.run(main)
