"""Config values checked before any compute: every bad value is one line of one `ConfigError`.

Without these checks a zero batch size failed after a whole epoch (ZeroDivisionError), a zero checkpoint interval
or Huber delta deep inside training, and lambda or alpha of 1e30 trained to the end with a loss of ~1e30 and exit
status 0. Only keys present in the config are checked, so a config without e.g. `online` or `sim` passes what it has.
"""

from __future__ import annotations

from typing import Any, Callable

from rivet_jax.settings import SERVE_SETTINGS, SETTINGS, anything, is_number

ONLINE_STAGES = ("online", "all")   # the stages that act in an environment (`config.sim`)


class ConfigError(ValueError):
    """A config value the run cannot use; the message lists every bad value, one per line."""


# key -> (test, what is expected), from the tables that declare every key (`settings.SETTINGS` for training,
# `settings.SERVE_SETTINGS` for the proxy). A key missing from the config is not checked.
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    key: (setting.check, setting.expected) for table in (SERVE_SETTINGS, SETTINGS) for key, setting in table.items()
    if setting.check is not anything}


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
    if holdout is not None and is_number(holdout.get("validation")) and is_number(holdout.get("test")) and (
            holdout.validation + holdout.test > 0.9):
        problems.append(f"data.holdout: validation + test is {holdout.validation + holdout.test:g}, expected at most "
                        f"0.9 (the rest of the tasks train)")
    reward = config.get("reward")
    if config.get("stage") in ONLINE_STAGES and reward is not None and reward.get("lam_range"):
        problems.append(f"stage: {config.stage!r} adapts online at one lambda, and reward.lam_range trains every "
                        f"lambda (the offline stages only, for now): use stage 'offline', or reward.lam_range=()")
    model = config.get("model")
    if config.get("stage") in ONLINE_STAGES and model is not None and model.get("cache_aware"):
        problems.append(f"stage: {config.stage!r} adapts online, and model.cache_aware trains offline only (for "
                        f"now): use stage 'offline', or model.cache_aware=False")
    if config.get("stage") in ONLINE_STAGES and "sim" not in config:
        problems.append(f"stage: {config.stage!r} acts in an environment, and this config has none (`sim`): use "
                        f"configs/routesim.py, or stage 'offline'")
    deploy = config.get("deploy")
    if "sim" in config and deploy is not None and is_number(deploy.get("folds")) and deploy.folds > 1:
        problems.append(f"deploy.folds: {deploy.folds} folds cross-validate a choice made on logs; with a simulator "
                        f"(`sim`) the validation tasks are rolled out exactly: use deploy.folds=1")
    return problems


def check_config(config) -> None:
    """Raises ConfigError listing every bad value of `config` (see `config_problems`)."""
    problems = config_problems(config)
    if problems:
        raise ConfigError("bad config values:\n  " + "\n  ".join(problems))
