r"""Picks lambda for a budget: the most successful router whose cost per episode stays within it.

  python -m launch.calibrate --config=configs/routesim.py --workdir=/tmp/rivet_budget --budget_usd_per_episode=0.004
  python -m launch.calibrate --config=configs/default.py --workdir=/tmp/mine_budget --budget_usd_per_episode=0.02 \
      --config.data.episodes=episodes.jsonl --config.data.cards=model_cards.json

Trains (or reuses) a router at every `config.calibrate.lambdas`, measures (RouteSim) or estimates off-policy (one's
own logs, on the held-out validation tasks) its success and cost per episode with 95% intervals, and writes
<workdir>/calibration.{md,json,png}; see rivet_jax/calibrate.py.
"""

from pathlib import Path

from absl import flags
from ml_collections import config_flags

from launch.common import enable_compilation_cache, run_app, run_reporting_user_errors
from rivet_jax import calibrate

_CONFIG = config_flags.DEFINE_config_file("config", "configs/routesim.py", "Config file (configs/<name>.py[:variant]).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for the runs and the calibration report.")
_BUDGET = flags.DEFINE_float("budget_usd_per_episode", None, "The most a routed episode may cost on average (USD).")
flags.mark_flags_as_required(["workdir", "budget_usd_per_episode"])


def main(argv):
    del argv
    enable_compilation_cache(_WORKDIR.value)
    run_reporting_user_errors(lambda: calibrate.calibrate(_CONFIG.value, _WORKDIR.value, _BUDGET.value),
                              _CONFIG.value)
    print((Path(_WORKDIR.value) / "calibration.md").read_text(encoding="utf-8"), end="")


if __name__ == "__main__":
    run_app(main)
