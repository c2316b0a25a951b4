r"""Learns from live traffic: one round of retrain -> off-policy proof -> promote on a served workdir, or (a config
with a `live` section) the whole RouteSim live experiment.

  python -m launch.loop --config=configs/default.py --workdir=W [--config.data.episodes=... --config.data.cards=...]
  python -m launch.loop --config=configs/routesim_live.py --workdir=/tmp/rivet_live

W is a served workdir (`launch.train`'s, served by `launch.serve --workdir=W`, recording into W/serve). A round
retrains on the config's logs and everything the proxy recorded, estimates every candidate against the served
router on held-out recorded episodes (doubly robust, paired, task-clustered bootstrap) and promotes one only when its
gain's 95% interval is above 0: W/deploy.json changes and the proxy swaps it in. W/rounds.jsonl records every round
(docs/live.md).
"""

from absl import flags
from ml_collections import config_flags

from launch.common import quiet_http_clients, run_app, run_reporting_user_errors

_CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py", "Training config (with `live`: the "
                                          "RouteSim live experiment).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "The served workdir.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
    del argv
    config = _CONFIG.value

    def one_round():
        from rivet_jax import loop

        result = loop.learn(config, _WORKDIR.value)
        loop.finish(_WORKDIR.value, result)
        return result.record

    def live():
        from rivet_jax.live import experiment

        quiet_http_clients()
        return experiment.run(config, _WORKDIR.value)

    result = run_reporting_user_errors(live if "live" in config else one_round, config)
    if "live" in config:
        print(open(f"{_WORKDIR.value}/live_report.md", encoding="utf-8").read(), end="")
    else:
        print(result["why"])


if __name__ == "__main__":
    run_app(main)
