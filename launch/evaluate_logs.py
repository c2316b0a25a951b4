r"""Off-policy evaluation: a trained router's value on held-out logs (IS, WIS, FQE, DR with 95% intervals).

  python -m launch.evaluate_logs --workdir=W --episodes=HELDOUT.jsonl --cards=CARDS.json [--stage=td]

W is a trained router's workdir; the router (its deployed choice, or --stage), the baselines its training logs fit,
every fixed model and the random router are estimated on the held-out episodes; writes W/ope.{md,json} and the
router's verdict against the best fixed model and random, W/verdict.{md,json} (or into --out). The estimators and what each needs
are in rivet_jax/ope.py.

  python -m launch.evaluate_logs --validate_routesim --config=configs/routesim.py --workdir=W

checks the estimators against RouteSim's truth on the training corpus and on held-out logs (collecting the corpus
and training the router into W/train first where W lacks them); writes W/ope_validation.{md,json}.
"""

from pathlib import Path

from absl import flags
from ml_collections import config_flags

from launch.common import run_app, run_reporting_user_errors
from rivet_jax import offpolicy
from rivet_jax.settings import FQE_FEATURES
from rivet_jax.verdict import VERDICT_MD

_CONFIG = config_flags.DEFINE_config_file("config", "configs/routesim.py", "RouteSim config (--validate_routesim).")
_WORKDIR = flags.DEFINE_string("workdir", None, "A trained router's workdir (with --validate_routesim: RouteSim's).")
_EPISODES = flags.DEFINE_string("episodes", None, "Held-out trajectory JSONL.")
_CARDS = flags.DEFINE_string("cards", None, "model_cards.json of the router's pool.")
_STAGE = flags.DEFINE_string("stage", None, "The router's stage (mc, td, online); default: the last trained.")
_BASELINES = flags.DEFINE_bool("baselines", True, "Fit all six baselines on the router's training logs when its "
                                "config sets them (RouteSim); else, or with --nobaselines, Best fixed only.")
_RESAMPLES = flags.DEFINE_integer("resamples", 200, "Bootstrap resamples of every interval (FQE refitted on each).",
                                  lower_bound=1)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the bootstrap.")
_RIDGE = flags.DEFINE_float("ridge", None, "FQE's ridge penalty; default: chosen by cross-validation over episodes.",
                            lower_bound=0.0)
_MAX_FEATURES = flags.DEFINE_integer("max_features", FQE_FEATURES, "FQE reads the state embedding on its top K "
                                     "principal directions (the held-out states'): on big logs each refit is several "
                                     "times faster (docs/offpolicy.md); 0: the whole embedding.", lower_bound=0)
_OUT = flags.DEFINE_string("out", None, "Where ope.{md,json} go (default: the workdir).")
_SPLIT = flags.DEFINE_enum("split", None, ["validation", "test"], "Only the episodes of this split's tasks in the "
                           "workdir's splits.json (training with config.data.holdout); default: every episode given.")
_VALIDATE = flags.DEFINE_bool("validate_routesim", False, "Check the estimators against RouteSim's truth.")
flags.mark_flags_as_required(["workdir"])
flags.register_multi_flags_validator(
    ["validate_routesim", "episodes", "cards"], lambda f: f["validate_routesim"] or (f["episodes"] and f["cards"]),
    "--episodes and --cards name the held-out logs (or pass --validate_routesim)")


def main(argv):
    del argv
    if _VALIDATE.value:
        from rivet_jax.experiments import ope_validation  # deferred: the paper's check, not the product command

        run_reporting_user_errors(lambda: ope_validation.validate_routesim(_CONFIG.value, _WORKDIR.value),
                                  _CONFIG.value)
        print((Path(_WORKDIR.value) / "ope_validation.md").read_text(encoding="utf-8"))
        return
    run_reporting_user_errors(lambda: offpolicy.evaluate_logs(
        _WORKDIR.value, _EPISODES.value, _CARDS.value, stage=_STAGE.value, baselines=_BASELINES.value,
        resamples=_RESAMPLES.value, seed=_SEED.value, ridge=_RIDGE.value, out=_OUT.value, split=_SPLIT.value,
        max_features=_MAX_FEATURES.value))
    out = Path(_OUT.value or _WORKDIR.value)
    print((out / "ope.md").read_text(encoding="utf-8"))
    if (out / VERDICT_MD).exists():
        print((out / VERDICT_MD).read_text(encoding="utf-8"))


if __name__ == "__main__":
    run_app(main)
