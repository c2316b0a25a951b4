r"""RouteSim: the synthetic multi-turn routing benchmark (rivet_jax/envs/routesim.py) and its logged corpus.

Write the offline corpus (6 fixed-model policies + a random router on the 200 training tasks):

  python -m launch.collect --config=configs/routesim.py --workdir=/tmp/routesim

Collect, train RIVET offline on it (configs/default.py settings) and evaluate against the exact oracle:

  python -m launch.evaluate --config=configs/routesim.py --workdir=/tmp/routesim

Variants (after a colon, joined by commas): `tiny` (seconds-long schedules, two tasks per family and split: the
tests'), `cache` (RouteSim with a prompt cache: a model's previous-turn prompt billed at its cached-input price,
`sim.prompt_cache`; rivet_jax/envs/routesim_params.json gives the prices and their reasons).

The simulator's parameters, each with its reason, are in rivet_jax/envs/routesim_config.py (the library owns them, so
the demo corpus and notebooks build the same benchmark); they are not to be retuned to favour a method.
"""

import ml_collections

from configs import default
from rivet_jax import settings
from rivet_jax.envs import routesim_config


VARIANTS = ("tiny", "cache")


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    variants = [v for v in arg.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown config variant {','.join(unknown)!r}; known: {', '.join(VARIANTS)} (comma-joined)")
    tiny = "tiny" in variants
    config = default.get_config("tiny" if tiny else "")
    config.stage = "offline"
    # RouteSim draws its own validation and test tasks (config.sim): the logged corpus is all training tasks.
    config.data.holdout.validation = config.data.holdout.test = 0.0
    # The reproduction trains 27 runs: a checkpoint every 5 epochs (and after the last) instead of every epoch
    # saves ~1 minute of orbax writes; a killed run loses at most 4 epochs.
    config.checkpoint_every_epochs = 5
    # TD epochs, chosen on the validation split (alpha 0, 3 seeds x 3 runs, 16 rollouts of the 35 tasks, validation
    # seed 2): the TD fit overfits its noisy bootstrapped targets, and validation J of the final (online) router
    # averaged over 3 runs was 0.814 after 5 epochs, 0.813 after 10, 0.801 after 15 (single runs 0.787, 0.768,
    # 0.764); the paper's 20 (configs/default.py) gave TD routers of 0.764 against 0.795 after 5. Five is the cheapest.
    if not tiny:  # the tiny variant keeps default.py's seconds-long schedule
        config.td_epochs = 5
    config.sim = sim = routesim_config.sim_config()
    if "cache" in variants:
        sim.prompt_cache = routesim_config.prompt_cache()

    config.collect = ml_collections.ConfigDict()
    config.collect.split = "train"
    config.collect.seed = 0       # behaviour randomness (responses, random router)

    config.evaluate = ml_collections.ConfigDict()
    config.evaluate.split = "test"
    config.evaluate.rollouts_per_task = 4  # Monte Carlo rollouts of a learned router per test task
    config.evaluate.seed = 1

    # launch.reproduce chooses alpha and where CQL applies on validation (rivet_jax/experiments/selection.py, which
    # says why 16 rollouts); enabled = False keeps config.loss (the paper's fixed settings), always trained too, as
    # is alpha = 0 (w/o CQL).
    config.select = ml_collections.ConfigDict()
    config.select.enabled = True
    config.select.alphas = (0.01, 0.1)
    config.select.cql_on = ("all", "stochastic")
    config.select.split = "validation"
    config.select.rollouts = 16
    config.select.seed = 2

    # launch.diagnose: learned Q_route against the exact Q* (rivet_jax/experiments/diagnostics.py)
    config.diagnose = ml_collections.ConfigDict()
    config.diagnose.split = "validation"     # where the router's own states are visited (never test: choices use it)
    config.diagnose.rollouts = 1
    config.diagnose.seed = 0
    config.diagnose.max_logged_states = 2000  # logged states sampled from the corpus (the same for every router)

    # launch.reproduce: the paper's experiments (rivet_jax/experiments.py).
    config.reproduce = ml_collections.ConfigDict()
    config.reproduce.seeds = (42, 43, 44)          # every RIVET number is a mean over these
    # RIVET (ours) averages Q_route over this many runs per seed (Router.ensemble; 1 = one run). Chosen on
    # validation (alpha-0 online runs, 16 rollouts; measured with 20 TD epochs and 1-rollout online validations):
    # J 0.773 for one run, 0.783 for 3, 0.800 for 5, 0.811 for 9; 5 costs 4 more runs per seed
    config.reproduce.ensemble = 5
    # Table 2 and the diagnostics also score those runs as mean - c x sd for each c here (ensemble pessimism, the
    # alternative to Eq. 10 that does not push toward the logged model; `Router.ensemble(..., pessimism=c)`)
    config.reproduce.pessimism = (1.0,)
    # Figure 3: one offline run per lambda, and one lambda-conditioned run (reward.lam_range = the sweep's range)
    config.reproduce.lambdas = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
    # The conditioned run's TD epochs (it learns every lambda at once), chosen on the validation split (3 seeds, 4
    # rollouts per task, regret averaged over the 7 lambdas): 0.098 after 5 epochs, 0.084 after 10, 0.102
    # after 20 (the per-lambda runs' 5 epochs: 0.107)
    # (tiny: one more than the other runs', so its progress line counts each run's own epochs)
    config.reproduce.conditioned_td_epochs = 10 if not tiny else config.td_epochs + 1
    config.reproduce.ood_splits = ("ood:musique", "ood:drop", "ood:mmlu_pro")
    config.reproduce.frontier_lambdas = (0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)

    # launch.evaluate_logs --validate_routesim: off-policy estimates against the truth
    # (rivet_jax/experiments/ope_validation.py), on the training corpus and on held-out logs
    config.ope = ml_collections.ConfigDict()
    config.ope.heldout_split = "test"  # the same seven loggers on these tasks: logs the router never saw
    config.ope.heldout_seed = 1
    config.ope.rollouts = 8            # per task, for the learned router's truth
    config.ope.rollout_seed = 7
    config.ope.resamples = 200         # bootstrap resamples of every 95% interval (FQE refitted on each)
    config.ope.seed = 0                # of the bootstrap and of FQE's cross-validation folds
    config.ope.max_features = settings.FQE_FEATURES  # FQE on the embedding's top K principal directions (0: all)

    config.baselines = ml_collections.ConfigDict()
    config.baselines.mtrouter_epochs = 20
    config.baselines.knn_k = 10
    config.baselines.clusters = 8

    if tiny:
        config.reproduce.seeds = (0, 1)
        config.reproduce.lambdas = (0.0, 0.05, 0.5)
        config.reproduce.ensemble = 2
        config.reproduce.frontier_lambdas = (0.0, 0.05, 0.5)
        config.baselines.mtrouter_epochs = 2
        config.baselines.clusters = 3
        config.baselines.knn_k = 3
        routesim_config.cap_tasks(sim, 2)
        config.evaluate.rollouts_per_task = 1
        config.diagnose.max_logged_states = 200
        config.select.alphas = (0.1,)
        config.select.cql_on = ("all",)
        config.select.rollouts = 2
        config.ope.rollouts = 2
        config.ope.resamples = 50
    return config
