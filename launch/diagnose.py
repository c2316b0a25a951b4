r"""Learned Q_route against RouteSim's exact Q*, for every trained router (and stage) of an experiment's workdir.

  python -m launch.diagnose --config=configs/routesim.py --workdir=/tmp/rivet [--runs='rivet/*,no_cql/*']

Reads <workdir>/corpus/ and the runs of launch.reproduce (<workdir>/runs/<variant>/seed_<s>/) or launch.evaluate
(<workdir>/train/); writes <workdir>/diagnostics.{md,json}. What each column means:
rivet_jax/experiments/diagnostics.py.
"""

import json
from pathlib import Path

from absl import flags
from ml_collections import config_flags

from launch.common import run_app, run_reporting_user_errors
from rivet_jax.experiments import diagnostics

_CONFIG = config_flags.DEFINE_config_file("config", "configs/routesim.py", "RouteSim config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "An experiment's workdir (launch.reproduce or launch.evaluate).")
_RUNS = flags.DEFINE_list("runs", [], "Only these runs (fnmatch patterns such as 'rivet/*'); default: every run.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
    del argv
    rows = run_reporting_user_errors(lambda: diagnostics.diagnose_workdir(_CONFIG.value, _WORKDIR.value, _RUNS.value),
                                     _CONFIG.value)
    workdir = Path(_WORKDIR.value)
    (workdir / "diagnostics.json").write_text(json.dumps({"rows": rows}, indent=2) + "\n", encoding="utf-8")
    text = diagnostics.markdown(rows, _CONFIG.value.diagnose)
    (workdir / "diagnostics.md").write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    run_app(main)
