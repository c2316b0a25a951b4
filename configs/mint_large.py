r"""RIVET on MINT's large pool (49 models x 586 tasks in 8 subsets of three categories), offline, evaluated exactly.

  python -m launch.mint --config=configs/mint_large.py --workdir=/tmp/rivet_mint_large

`--config.mint_dir` points at the large pool's layout (default ../shared/mint-large). The tasks are split per
subset by `make_manifest` with the fractions and seed below (written to <workdir>/corpus/splits.json). Some models
have no logs on a subset: there they are unavailable, and no router may choose them. The `tiny` variant trains
briefly on two tasks per subset and split (tests).
"""

import ml_collections

from configs import mint


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    if arg not in ("", "tiny"):
        raise ValueError(f"unknown config variant {arg!r}; known: '', 'tiny'")
    config = mint.get_config(arg)
    config.mint_dir = "../shared/mint-large"
    # About 107,000 logged turns: the hashing encoder embeds them in seconds on a CPU. The MiniLM encoder
    # (--config.encoder.name=minilm) reads each state through a 256-token window: hours on two CPU cores.
    config.encoder = ml_collections.ConfigDict({"name": "hashing", "dim": 1024})
    config.compare_hashing = False

    # About 53,000 training transitions with 49 candidates each: larger batches and fewer TD epochs than the
    # six-model pool's (set before any result was seen: what fits a CPU session).
    config.optim.batch_size = 256
    config.td_epochs = 10

    exp = config.experiment
    exp.split_fractions = (0.15, 0.35)  # validation, test: per subset (test) and over all tasks (validation)
    exp.split_seed = 42
    exp.seeds = (42, 43)
    exp.betas = (0.0, 1.0)
    exp.lambdas = (0.0, 0.05, 0.1)
    exp.reference_model = "gpt-4-0613"
    exp.floors = ("model", "family")  # eight task families: routing by family is the bar (issue 28)
    exp.new_models.draws = 3  # 3 draws of 5 of the 49 models (seed 2028), set before any result
    exp.new_models.card_ablation = ("description", "context", "prices", "flags")  # item 4: each left out in turn
    if arg == "tiny":
        config.optim.batch_size = 16
        config.td_epochs = 3
        exp.seeds = (0, 1)
        exp.lambdas = (0.0, 0.05)
        exp.max_tasks_per_subset = 2
        exp.new_models.draws, exp.new_models.k = 1, 1
        exp.new_models.card_ablation = ("prices",)
    return config
