r"""RouteSim end to end: collect the logged corpus, train RIVET offline on it, evaluate against the exact oracle.

  python -m launch.evaluate --config=configs/routesim.py --workdir=/tmp/routesim

Every step resumes from what the workdir already holds. Writes <workdir>/evaluation.{md,json}.
"""

from pathlib import Path

from absl import flags
from ml_collections import config_flags

from launch.common import run_app, run_reporting_user_errors
from rivet_jax.experiments import routesim

_CONFIG = config_flags.DEFINE_config_file("config", "configs/routesim.py", "RouteSim config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for corpus, checkpoints and results.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
    del argv
    run_reporting_user_errors(lambda: routesim.run_routesim(_CONFIG.value, _WORKDIR.value), _CONFIG.value)
    print((Path(_WORKDIR.value) / "evaluation.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    run_app(main)
