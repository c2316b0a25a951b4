r"""RIVET with the paper's settings (App. B.2), on your logged trajectories or, asked for, a RouteSim demo corpus.

On your own logs, both offline stages in one go (--config.stage=offline):

  python -m launch.train --config=configs/default.py --workdir=/tmp/rivet_mine \
      --config.data.episodes=my_episodes.jsonl --config.data.cards=my_cards.json --config.stage=offline

On the demo corpus (RouteSim's logging policies on its training tasks), each stage its own run (the second
resumes from the first's checkpoint):

  python -m launch.train --config=configs/default.py --workdir=/tmp/rivet --config.data.demo=True --config.stage=mc
  python -m launch.train --config=configs/default.py --workdir=/tmp/rivet --config.data.demo=True --config.stage=td

The `tiny` variant (configs/default.py:tiny) is a seconds-long run for tests and smoke checks.
"""

import ml_collections

from rivet_jax import settings


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    # Every key, its default and what it means are declared once, in rivet_jax/settings.py (SETTINGS): --help and
    # the checks read the same table.
    config = settings.config_of(settings.SETTINGS)

    if arg == "tiny":
        config.data.demo_tasks = 9  # 63 episodes
        config.data.holdout.validation = config.data.holdout.test = 0.0
        config.encoder.dim = 64
        config.max_state_tokens = 512
        config.model.hidden = 32
        config.model.card_dim = 16
        config.model.head_hidden = 16
        config.model.response_dim = 16
        config.optim.batch_size = 16
        config.mc_epochs = 2
        config.td_epochs = 3
        config.target_sync_steps = 10
        config.online.validate_every = 4
        config.online.early_stop_after = 8
        config.online.max_passes = 2
        config.online.curve_points = (0, 4, 8)
        config.online.eval_rollouts = 1
        config.calibrate.lambdas = (0.0, 2.0)
        config.calibrate.rollouts = 1
        config.calibrate.resamples = 200
    elif arg:
        raise ValueError(f"unknown config variant {arg!r}; known: '' (paper settings), 'tiny'")
    return config
