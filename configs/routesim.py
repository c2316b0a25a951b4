r"""RouteSim: the synthetic multi-turn routing benchmark (rivet_jax/envs/routesim.py) and its logged corpus.

Write the offline corpus (6 fixed-model policies + a random router on the 200 training tasks):

  python -m launch.collect --config=configs/routesim.py --workdir=/tmp/routesim

Collect, train RIVET offline on it (configs/default.py settings) and evaluate against the exact oracle:

  python -m launch.evaluate --config=configs/routesim.py --workdir=/tmp/routesim

The simulator's parameters below were fixed, each with its reason, before any router was trained on it; they are
not to be retuned to favour a method. `tests/test_routesim.py` checks the benchmark's properties on them.
"""

import ml_collections

from configs import default


def _models() -> ml_collections.ConfigDict:
    """Six candidates. competence: per-skill ability on the difficulty scale (success = sigmoid(sharpness (c - d)));
    failures: relative weights of the failure modes when a step fails; verbosity scales every completion."""
    models = ml_collections.ConfigDict()
    # The strongest and by far the dearest, yet not best at everything: over-deliberates and over-explains.
    models.apex_pro = dict(
        name="apex-pro", price_in=5.0, price_out=15.0, context=128_000, tool_use=True, code=True, math=True,
        description="Frontier reasoning model: strongest multi-step reasoning, planning and mathematics; slow, "
                    "verbose and the most expensive model in the pool.",
        competence="plan=0.85,retrieve=0.74,compute=0.86,code=0.80,recall=0.82,format=0.60",
        verbosity=1.6, over_explain=0.30, failures="malformed=1,drift=1,stall=4,constraint=1")
    # Its cheap sibling: nearly as good at computation and code, weaker at planning and recall.
    models.apex_flash = dict(
        name="apex-flash", price_in=0.5, price_out=1.5, context=128_000, tool_use=True, code=True, math=True,
        description="Fast distilled model of the same family: strong at computation and code through a Python "
                    "tool, weaker at planning and factual recall; moderately priced.",
        competence="plan=0.65,retrieve=0.60,compute=0.86,code=0.90,recall=0.60,format=0.82",
        verbosity=1.0, over_explain=0.05, failures="malformed=1,drift=1,stall=1,constraint=3")
    # The knowledge specialist: best at retrieval and recall, mediocre at code; drifts off the question.
    models.quill_plus = dict(
        name="quill-plus", price_in=1.2, price_out=4.0, context=256_000, tool_use=True, code=True, math=None,
        description="Large general model with broad world knowledge and strong retrieval and recall; long "
                    "context; less reliable with code.",
        competence="plan=0.78,retrieve=0.95,compute=0.65,code=0.55,recall=0.95,format=0.86",
        verbosity=1.2, over_explain=0.15, failures="malformed=1,drift=4,stall=1,constraint=1")
    # The cheapest: only formatting and easy recall are reliable; emits malformed actions.
    models.quill_9b = dict(
        name="quill-9b", price_in=0.08, price_out=0.2, context=32_000, tool_use=True, code=None, math=None,
        description="Small open-weights model, the cheapest in the pool: follows output formats well and "
                    "knows common facts; weak at long computation and code.",
        competence="plan=0.45,retrieve=0.60,compute=0.40,code=0.30,recall=0.70,format=0.92",
        verbosity=0.8, over_explain=0.02, failures="malformed=4,drift=2,stall=1,constraint=2")
    # Balanced open model at a flat price: mid ability everywhere, a little verbose.
    models.llama_70b = dict(
        name="llama-70b", price_in=0.6, price_out=0.6, context=128_000, tool_use=True, code=True, math=None,
        description="Open-weights 70B instruction model: balanced mid-level ability across tasks, tends to "
                    "over-explain; flat pricing for input and output.",
        competence="plan=0.68,retrieve=0.70,compute=0.66,code=0.68,recall=0.72,format=0.78",
        verbosity=1.3, over_explain=0.25, failures="malformed=2,drift=2,stall=1,constraint=2")
    # Small closed model: good planner and formatter for its price, weak retrieval; breaks constraints.
    models.mini = dict(
        name="mini-4o", price_in=0.15, price_out=0.6, context=128_000, tool_use=True, code=True, math=True,
        description="Small, low-cost closed model: good at planning short solutions and answer formatting, "
                    "limited retrieval; occasionally ignores a stated constraint.",
        competence="plan=0.78,retrieve=0.50,compute=0.62,code=0.60,recall=0.60,format=0.90",
        verbosity=0.9, over_explain=0.05, failures="malformed=1,drift=1,stall=1,constraint=4")
    return models


def _families() -> ml_collections.ConfigDict:
    """Hidden step sequences per family: 'skill:low-high' difficulties; counts per manifest split."""
    families = ml_collections.ConfigDict()
    # In-distribution mix mirrors MINT Reasoning (Table 4): test counts 21/19/45/34/22, train/val in proportion.
    families.gsm8k = dict(kind="arithmetic", steps="plan:0.3-0.6,compute:0.5-0.8,compute:0.5-0.9,format:0.3-0.6",
                          train=31, validation=5, test=21)
    families.hotpotqa = dict(kind="multihop", steps="retrieve:0.6-0.95,retrieve:0.6-0.95,recall:0.4-0.7,format:0.3-0.6",
                             train=27, validation=5, test=19)
    families.math = dict(kind="competition_math",
                         steps="plan:0.6-0.95,compute:0.7-1.0,code:0.6-0.95,format:0.4-0.7",
                         train=63, validation=11, test=45)
    families.mmlu = dict(kind="multiple_choice", steps="recall:0.6-0.95,format:0.4-0.7", train=48, validation=9,
                         test=34)
    families.theoremqa = dict(kind="theorem", steps="recall:0.6-0.9,plan:0.5-0.85,compute:0.6-0.95,format:0.4-0.7",
                              train=31, validation=5, test=22)
    # Out of distribution (never in train): MuSiQue 2/3/4-hop, DROP's four answer types, three MMLU-Pro subjects.
    families.musique_2hop = dict(kind="multihop", steps="retrieve:0.5-0.8,retrieve:0.5-0.8,format:0.2-0.4",
                                 ood="musique", test=60)
    families.musique_3hop = dict(kind="multihop",
                                 steps="retrieve:0.5-0.8,retrieve:0.5-0.8,retrieve:0.5-0.8,format:0.2-0.4",
                                 ood="musique", test=60)
    families.musique_4hop = dict(kind="multihop",
                                 steps="retrieve:0.5-0.8,retrieve:0.5-0.8,retrieve:0.5-0.8,retrieve:0.5-0.8,"
                                       "format:0.2-0.4", ood="musique", test=60)
    for name in ("date", "number", "single_span", "multi_span"):
        families[f"drop_{name}"] = dict(kind="discrete_reading",
                                        steps="retrieve:0.3-0.6,compute:0.2-0.6,format:0.3-0.6", ood="drop", test=40)
    for name in ("mathematics", "physics", "chemistry"):
        families[f"mmlu_pro_{name}"] = dict(kind="multiple_choice",
                                            steps="recall:0.5-0.9,plan:0.4-0.7,compute:0.4-0.8,format:0.1-0.3",
                                            ood="mmlu_pro", test=60)
    return families


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    config = default.get_config(arg)
    config.stage = "offline"
    sim = ml_collections.ConfigDict()
    sim.seed = 42                 # fixes manifests, task contents and hidden steps
    sim.max_turns = 10            # App. B.1: at most ten turns per episode
    sim.max_proposals = 2         # MINT: a solution may be proposed at most twice
    sim.sharpness = 8.0           # logistic slope of success in (competence - difficulty): a 0.1 gap ~ 20 points
    sim.system_tokens = 420       # the instruction + in-context example every prompt carries (MINT-like)
    sim.token_block = 10          # usage is counted in blocks of 10 tokens: keeps the exact DP's grid small
    # Completion tokens of each response kind before the model's verbosity factor (the feedback's tokens are
    # counted from its text). Stalls and explanations cost more, as the paper's failure modes do.
    sim.completion_tokens = "progress=110,over_explain=330,malformed=80,drift=120,stall=260,constraint=100"
    sim.models = _models()
    sim.families = _families()
    config.sim = sim

    config.collect = ml_collections.ConfigDict()
    config.collect.split = "train"
    config.collect.seed = 0       # behaviour randomness (responses, random router)

    config.evaluate = ml_collections.ConfigDict()
    config.evaluate.split = "test"
    config.evaluate.rollouts_per_task = 4  # Monte Carlo rollouts of a learned router per test task
    config.evaluate.seed = 1

    # launch.reproduce: the paper's experiments (rivet_jax/experiments.py).
    config.reproduce = ml_collections.ConfigDict()
    config.reproduce.seeds = (42, 43, 44)          # every RIVET number is a mean over these
    config.reproduce.lambdas = (0.0, 0.01, 0.05, 0.1, 0.2, 0.5)  # Figure 3
    config.reproduce.sweep_stage = "all"           # stages trained at each swept lambda ('offline' is faster)
    config.reproduce.ood_splits = ("ood:musique", "ood:drop", "ood:mmlu_pro")
    config.reproduce.frontier_lambdas = (0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)

    config.baselines = ml_collections.ConfigDict()
    config.baselines.mtrouter_epochs = 20
    config.baselines.knn_k = 10
    config.baselines.clusters = 8

    if arg == "tiny":
        config.reproduce.seeds = (0, 1)
        config.reproduce.lambdas = (0.0, 0.05, 0.5)
        config.reproduce.sweep_stage = "offline"
        config.reproduce.frontier_lambdas = (0.0, 0.05, 0.5)
        config.baselines.mtrouter_epochs = 2
        config.baselines.clusters = 3
        config.baselines.knn_k = 3
        for family in sim.families.values():
            for split in ("train", "validation", "test"):
                if split in family:
                    family[split] = min(family[split], 2)
        config.evaluate.rollouts_per_task = 1
    return config
