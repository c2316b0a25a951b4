r"""Writes RouteSim's logged corpus: six fixed-model policies and a random router on the training tasks.

  python -m launch.collect --config=configs/routesim.py --workdir=/tmp/routesim

Output: <workdir>/corpus/{episodes.jsonl, model_cards.json, summary.md, summary.json}.
"""

from absl import flags
from ml_collections import config_flags

from launch.common import run_app, run_reporting_user_errors
from rivet_jax.runs import collected_corpus

_CONFIG = config_flags.DEFINE_config_file("config", "configs/routesim.py", "RouteSim config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for the corpus.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
    del argv
    corpus = run_reporting_user_errors(lambda: collected_corpus(_CONFIG.value, _WORKDIR.value), _CONFIG.value)
    print((corpus / "summary.md").read_text(encoding="utf-8"), end="")


if __name__ == "__main__":
    run_app(main)
