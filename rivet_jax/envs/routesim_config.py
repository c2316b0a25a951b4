"""RouteSim's parameters: the simulator's constants here, its six candidate models and task families in
`routesim_params.json` beside this file (each with the reason it has, in a "why" field).

The library owns the benchmark's settings, so that configs (`configs/routesim.py`), the demo corpus
(`envs.collect.demo_corpus`) and notebooks build the same simulator. Every value was fixed, with its reason, before
any router was trained on it; none is to be retuned to favour a method. `tests/test_routesim.py` checks the
benchmark's properties on them.
"""

import functools
import importlib.resources
import json

import ml_collections

PARAMS_FILE = "routesim_params.json"


@functools.cache
def _params() -> dict:
    return json.loads(importlib.resources.files(__package__).joinpath(PARAMS_FILE).read_text(encoding="utf-8"))


def _without_reasons(entries: dict) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({name: {k: v for k, v in entry.items() if k != "why"}
                                      for name, entry in entries.items()})


def models() -> ml_collections.ConfigDict:
    """Six candidates. competence: per-skill ability on the difficulty scale (success = sigmoid(sharpness (c - d)));
    failures: relative weights of the failure modes when a step fails; verbosity scales every completion."""
    return _without_reasons(_params()["models"])


def families() -> ml_collections.ConfigDict:
    """Hidden step sequences per family: 'skill:low-high' difficulties; task counts per manifest split; `ood` names
    the out-of-distribution set a family belongs to (never in train)."""
    return _without_reasons(_params()["families"])


def prompt_cache() -> ml_collections.ConfigDict:
    """Cached-input prices (USD per million prompt tokens; `price_cache_write` where writes cost a premium) per model
    id, for `config.sim.prompt_cache` (configs/routesim.py:cache). A model without an entry has no cache discount."""
    return _without_reasons(_params()["prompt_cache"]["models"])


def sim_config() -> ml_collections.ConfigDict:
    """The RouteSim benchmark (`config.sim`): manifests train 200 / validation 35 / test 141 and three OOD sets."""
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
    sim.models = models()
    sim.families = families()
    return sim


def cap_tasks(sim: ml_collections.ConfigDict, most: int) -> None:
    """At most `most` tasks per family and split in `sim` (a `sim_config()`), in place: the tiny variants' manifests."""
    for family in sim.families.values():
        for split in ("train", "validation", "test"):
            if split in family:
                family[split] = min(family[split], most)
