r"""The paper's experiments on RouteSim in one command: collect, train (offline, online, ablations, lambda sweep),
fit the baselines, evaluate, and write <workdir>/report.md, results.json and results/.

  python -m launch.reproduce --config=configs/routesim.py --workdir=/tmp/rivet

Every phase resumes from what the workdir already holds. `configs/routesim.py:tiny` is a one-minute version.
"""

from pathlib import Path

from absl import flags
from ml_collections import config_flags

from launch.common import enable_compilation_cache, run_app, run_reporting_user_errors
from rivet_jax.experiments import routesim

_CONFIG = config_flags.DEFINE_config_file("config", "configs/routesim.py", "RouteSim config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for everything the run makes.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
    del argv
    enable_compilation_cache(_WORKDIR.value)
    run_reporting_user_errors(lambda: routesim.reproduce(_CONFIG.value, _WORKDIR.value), _CONFIG.value)
    print(f"report: {Path(_WORKDIR.value) / 'report.md'}")


if __name__ == "__main__":
    run_app(main)
