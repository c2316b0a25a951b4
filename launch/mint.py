r"""RIVET on the real MINT logs: convert, train offline (MC + TD), evaluate committed routing and value prediction.

  python -m launch.mint --config=configs/mint.py --workdir=/tmp/rivet_mint [--config.mint_dir=PATH]

Writes <workdir>/report.md, results.json and results/.
"""

from pathlib import Path

from absl import flags
from ml_collections import config_flags

from launch.common import enable_compilation_cache, run_app, run_reporting_user_errors
from rivet_jax.experiments import mint

_CONFIG = config_flags.DEFINE_config_file("config", "configs/mint.py", "MINT config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for everything the run makes.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
    del argv
    enable_compilation_cache(_WORKDIR.value)
    run_reporting_user_errors(lambda: mint.run_mint(_CONFIG.value, _WORKDIR.value), _CONFIG.value)
    print(f"report: {Path(_WORKDIR.value) / 'report.md'}")


if __name__ == "__main__":
    run_app(main)
