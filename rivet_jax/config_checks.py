"""Config values checked before any compute: every bad value is one line of one `ConfigError`.

Without these checks a zero batch size failed after a whole epoch (ZeroDivisionError), a zero checkpoint interval
or Huber delta deep inside training, and lambda or alpha of 1e30 trained to the end with a loss of ~1e30 and exit
status 0. Only keys present in the config are checked, so a config without e.g. `online` or `sim` passes what it has.
"""

from __future__ import annotations

import math
from typing import Any, Callable

STAGES = ("mc", "td", "online", "offline", "all")
ONLINE_STAGES = ("online", "all")   # the stages that act in an environment (`config.sim`)
# Weights of Eq. 1 and Eq. 11 far above this make every reward the cost term alone, or the CQL term alone: a run
# that trains to the end on numbers of 1e30 says nothing. Success is worth 1 and c_ref is a typical turn's cost.
MAX_WEIGHT = 1e3


class ConfigError(ValueError):
    """A config value the run cannot use; the message lists every bad value, one per line."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _in(low: float, high: float, low_open: bool = False) -> Callable[[Any], bool]:
    return lambda v: _number(v) and (v > low if low_open else v >= low) and v <= high


def _at_least(low: int) -> Callable[[Any], bool]:
    return lambda v: _integer(v) and v >= low


# key -> (test, what is expected). A key missing from the config is not checked.
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "stage": (lambda v: v in STAGES, f"one of {', '.join(STAGES)}"),
    "seed": (_integer, "an integer"),
    "devices": (_at_least(0), "an integer >= 0 (0 = every visible device)"),
    "runs_vmapped": (_at_least(-1), "an integer >= -1 (-1: by platform, 0: all)"),
    "max_state_tokens": (_at_least(1), "an integer >= 1"),
    "data.demo_tasks": (_at_least(1), "an integer >= 1"),
    "data.host_chunk_steps": (_at_least(1), "an integer >= 1"),
    "data.max_skipped_fraction": (_in(0.0, 1.0), "a fraction in [0, 1]"),
    "data.holdout.validation": (_in(0.0, 0.9), "a fraction of the tasks in [0, 0.9]"),
    "data.holdout.test": (_in(0.0, 0.9), "a fraction of the tasks in [0, 0.9]"),
    "data.holdout.seed": (_integer, "an integer"),
    "encoder.dim": (_at_least(1), "an integer >= 1"),
    "reward.lam": (_in(0.0, MAX_WEIGHT), f"a number in [0, {MAX_WEIGHT:g}] (the cost weight of Eq. 1)"),
    "reward.gamma": (_in(0.0, 1.0, low_open=True), "a discount in (0, 1]"),
    "reward.c_ref": (lambda v: v is None or (_number(v) and v > 0), "None (from the corpus) or a cost > 0"),
    "model.hidden": (_at_least(1), "an integer >= 1"),
    "model.card_dim": (_at_least(1), "an integer >= 1"),
    "model.head_hidden": (_at_least(1), "an integer >= 1"),
    "model.response_dim": (_at_least(1), "an integer >= 1"),
    "loss.beta": (_in(0.0, MAX_WEIGHT), f"a number in [0, {MAX_WEIGHT:g}] (the RIVE weight of Eq. 7)"),
    "loss.alpha": (_in(0.0, MAX_WEIGHT), f"a number in [0, {MAX_WEIGHT:g}] (the CQL weight of Eq. 11)"),
    "loss.huber_delta": (_in(0.0, math.inf, low_open=True), "a number > 0"),
    "loss.cql_on": (lambda v: v in ("all", "stochastic"), "'all' or 'stochastic'"),
    "optim.lr": (_in(0.0, 1.0, low_open=True), "a learning rate in (0, 1]"),
    "optim.weight_decay": (_in(0.0, math.inf), "a number >= 0"),
    "optim.clip_norm": (_in(0.0, math.inf, low_open=True), "a number > 0"),
    "optim.batch_size": (_at_least(1), "an integer >= 1"),
    "mc_epochs": (_at_least(0), "an integer >= 0"),
    "td_epochs": (_at_least(0), "an integer >= 0"),
    "target_sync_steps": (_at_least(1), "an integer >= 1"),
    "checkpoint_every_epochs": (_at_least(1), "an integer >= 1"),
    "checkpoints_to_keep": (lambda v: v is None or _at_least(1)(v), "None (keep all) or an integer >= 1"),
    "online.lr": (_in(0.0, 1.0, low_open=True), "a learning rate in (0, 1]"),
    "online.epsilon_start": (_in(0.0, 1.0), "a probability in [0, 1]"),
    "online.epsilon_end": (_in(0.0, 1.0), "a probability in [0, 1]"),
    "online.epsilon_episodes": (_at_least(1), "an integer >= 1"),
    "online.validate_every": (_at_least(1), "an integer >= 1"),
    "online.early_stop_after": (_at_least(0), "an integer >= 0"),
    "online.patience": (_at_least(1), "an integer >= 1"),
    "online.max_passes": (_at_least(1), "an integer >= 1"),
    "online.eval_rollouts": (_at_least(1), "an integer >= 1"),
    "calibrate.lambdas": (lambda v: isinstance(v, (tuple, list)) and len(v) > 0 and all(_in(0.0, MAX_WEIGHT)(x)
                                                                                     for x in v),
                          f"a non-empty list of lambdas in [0, {MAX_WEIGHT:g}]"),
    "calibrate.stage": (lambda v: v in STAGES, f"one of {', '.join(STAGES)}"),
    "calibrate.rollouts": (_at_least(1), "an integer >= 1"),
    "calibrate.resamples": (_at_least(1), "an integer >= 1"),
    # launch.serve (configs/serve.py)
    "router_stage": (lambda v: v in ("", "mc", "td", "online"), "'' (the last trained), 'mc', 'td' or 'online'"),
    "port": (lambda v: _integer(v) and 0 <= v <= 65535, "a TCP port in [0, 65535]"),
    "epsilon": (_in(0.0, 1.0), "a probability in [0, 1]"),
    "max_attempts": (_at_least(1), "an integer >= 1"),
    "scoring": (lambda v: v in ("auto", "inline", "thread"), "'auto', 'inline' or 'thread'"),
    "timeout_s": (_in(0.0, math.inf, low_open=True), "seconds > 0"),
    "connect_timeout_s": (_in(0.0, math.inf, low_open=True), "seconds > 0"),
    "cooloff_s": (_in(0.0, math.inf), "seconds >= 0"),
    "episode_timeout_s": (_in(0.0, math.inf, low_open=True), "seconds > 0"),
}


def _lookup(config, key: str) -> tuple[bool, Any]:
    """(present, value) of a dotted key."""
    node = config
    for part in key.split("."):
        if not hasattr(node, "keys") or part not in node:
            return False, None
        node = node[part]
    return True, node


def config_problems(config) -> list[str]:
    """One line per value `config` cannot train with: `key: got X, expected Y`, then what is missing together."""
    problems = []
    for key, (valid, expected) in RULES.items():
        present, value = _lookup(config, key)
        if present and not valid(value):
            problems.append(f"{key}: got {value!r}, expected {expected}")
    data = config.get("data")
    if data is not None and data.get("episodes") and not data.get("cards"):
        problems.append("data.cards: required with data.episodes (the pool's model_cards.json)")
    holdout = data.get("holdout") if data is not None else None
    if holdout is not None and _number(holdout.get("validation")) and _number(holdout.get("test")) and (
            holdout.validation + holdout.test > 0.9):
        problems.append(f"data.holdout: validation + test is {holdout.validation + holdout.test:g}, expected at most "
                        f"0.9 (the rest of the tasks train)")
    if config.get("stage") in ONLINE_STAGES and "sim" not in config:
        problems.append(f"stage: {config.stage!r} acts in an environment, and this config has none (`sim`): use "
                        f"configs/routesim.py, or stage 'offline'")
    return problems


def check_config(config) -> None:
    """Raises ConfigError listing every bad value of `config` (see `config_problems`)."""
    problems = config_problems(config)
    if problems:
        raise ConfigError("bad config values:\n  " + "\n  ".join(problems))
