r"""How much can a router gain on these logs? Cross-validated in seconds, before training (rivet_jax/headroom.py).

  python -m launch.headroom --config=configs/default.py --workdir=W \
      --config.data.episodes=my_episodes.jsonl --config.data.cards=my_cards.json [--folds=5]

Reads the logs' non-test tasks (W's split, the one `launch.train` with the same config draws or reads) that hold
episodes of two models or more (A/B logs), and scores by cross-validation over tasks the best fixed model, the best
fixed model per task family and per-task learners on the task's first state; writes W/headroom.{md,json}.
"""

from absl import flags
from ml_collections import config_flags

from launch.common import run_app, run_reporting_user_errors
from rivet_jax import headroom

_CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py", "The training config (data, reward, "
                                          "encoder) whose logs to read.")
_WORKDIR = flags.DEFINE_string("workdir", None, "The split and the embedding cache (a launch.train workdir).")
_FOLDS = flags.DEFINE_integer("folds", 5, "Folds of the cross-validation over tasks.", lower_bound=2)
flags.mark_flags_as_required(["workdir"])


def main(argv):
    del argv
    print(run_reporting_user_errors(lambda: headroom.run_headroom(_CONFIG.value, _WORKDIR.value, _FOLDS.value),
                                    _CONFIG.value))


if __name__ == "__main__":
    run_app(main)
