"""A trained router's value on held-out logs, off-policy (`python -m launch.evaluate_logs`), beside the baselines
that the router's own training logs can fit, every fixed model and the random router; estimators in `rivet_jax.ope`.

Writes <out>/ope.md (one table: every policy x estimator, with 95% intervals) and <out>/ope.json.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from absl import logging

from rivet_jax import deploy, heldout, ope
from rivet_jax.config_checks import ConfigError
from rivet_jax.baselines.best_fixed import BEST_FIXED, BEST_PER_FAMILY, BestFixedRouter, BestPerFamilyRouter
from rivet_jax.baselines.registry import fit_baselines
from rivet_jax.corpus import NoCorpusError, corpus_paths, training_episodes
from rivet_jax.data.files import episode_paths
from rivet_jax.data.schema import DataError, Episode, ModelPool, read_episodes, read_model_cards
from rivet_jax.data.splits import MANIFEST, episodes_of
from rivet_jax.encoders import embedding_store
from rivet_jax.envs.base import FixedModelPolicy, Policy, RandomPolicy
from rivet_jax.progress import Phases
from rivet_jax.runs import MAIN
from rivet_jax.settings import FQE_FEATURES
from rivet_jax.router import Router
from rivet_jax.verdict import judge_on_logs, per_family_of, write_verdict

RANDOM = "random"


def targets_of(policies: dict[str, Policy], logs: ope.Logs, pool: ModelPool) -> dict[str, np.ndarray]:
    """Every policy's distribution (N, M) at the logged states (`ope.target_distribution`)."""
    requests = ope.state_requests(logs, pool)
    return {name: ope.target_distribution(policy, requests, pool) for name, policy in policies.items()}


def reference_policies(pool: ModelPool, available: np.ndarray | None = None,
                       fallback: Policy | None = None) -> dict[str, Policy]:
    """Every fixed model and the random router: the policies any log can be compared against. A model missing at
    some of the logged states (`available`, (N, M) bool) calls `fallback` there (the best fixed model of the
    training logs); with no fallback it is left out, and said so."""
    missing = missing_shares(pool, available)
    if missing and fallback is None:
        logging.warning("fixed models left out, not available at every held-out state (share missing): %s",
                        ", ".join(f"{m} {share:.0%}" for m, share in missing.items()))
    fixed = {f"fixed:{m}": FixedModelPolicy(m, fallback if m in missing else None) for m in pool.names
             if m not in missing or fallback is not None}
    return {**fixed, RANDOM: RandomPolicy()}


def missing_shares(pool: ModelPool, available: np.ndarray | None) -> dict[str, float]:
    """The share of the logged states at which each model that is missing somewhere is not available."""
    if available is None:
        return {}
    share = 1.0 - available.mean(axis=0)                                                              # (M,)
    return {m: float(s) for m, s in zip(pool.names, share) if s > 0}


def log_baselines(router: Router, workdir: Path, everything: bool) -> dict[str, Policy]:
    """The baselines fitted on the logs the router was trained on (the training tasks of its split, when it drew
    one): Best fixed (train) always, and with `everything` (and a config that sets them, as the RouteSim configs do)
    the five fitted routers of the reproduction. None when those logs are not where the router's config says."""
    config = router.config
    try:
        episode_files, cards_path = corpus_paths(config, workdir)
    except (NoCorpusError, DataError):  # no logs named, or a pattern that matches nothing here
        episode_files, cards_path = [], Path("")
    if not (episode_files and all(p.is_file() for p in episode_files) and cards_path.is_file()):
        logging.warning("the router's training logs (config.data.episodes=%r) are not here: no baseline fitted",
                        config.data.episodes)
        return {}
    episodes = training_episodes(config, workdir, read_episodes(episode_files, router.pool).episodes)
    lam = config.reward.lam
    per_family = per_family_of(episodes, router.pool, router.reward)
    families = {} if per_family is None else {BEST_PER_FAMILY: per_family}
    if not (everything and "baselines" in config):
        return {BEST_FIXED: BestFixedRouter.fit(episodes, router.pool, router.reward), **families}
    store = embedding_store(config, router.encoder, workdir)
    return {**fit_baselines(config, episodes, router.pool, store, lam, router.c_ref), **families}


def read_heldout(episodes_path: str | Path, cards_path: str | Path, router: Router) -> list[Episode]:
    """The held-out episodes (one file, several separated by commas, or a glob), against the router's pool (the
    same models, in the same order)."""
    pool = read_model_cards(cards_path)
    if pool.names != router.pool.names:
        raise DataError(str(cards_path), None, "<file>", f"names the models {list(pool.names)}; the router was trained "
                                                         f"on {list(router.pool.names)}: give the cards of its pool")
    return read_episodes(episode_paths(str(episodes_path)), router.pool).episodes


def held_out_split(episodes: list[Episode], workdir: Path, split: str | None) -> list[Episode]:
    """The episodes of `split`'s tasks in the workdir's task-level split (`data/splits.py`); with no split named,
    all of them, with a warning when some are of tasks the router trained on (FQE is optimistic there)."""
    manifest = workdir / MANIFEST
    if split is None:
        if manifest.exists():
            trained = set(json.loads(manifest.read_text(encoding="utf-8"))["train"])
            seen = sum(e.task.id in trained for e in episodes)
            if seen:
                logging.warning("%d of the %d episodes are of tasks %s trained on: estimates there are optimistic; "
                                "pass --split=test (or validation) to keep to held-out tasks", seen, len(episodes),
                                workdir)
        return episodes
    if not manifest.exists():
        raise ConfigError(f"--split={split}: {workdir} has no {MANIFEST} (train with config.data.holdout > 0)")
    return episodes_of(episodes, json.loads(manifest.read_text(encoding="utf-8"))[split])


def evaluate_logs(workdir: str | Path, episodes_path: str | Path, cards_path: str | Path, *, stage: str | None = None,
                  baselines: bool = True, resamples: int = 200, seed: int = 0, ridge: float | None = None,
                  out: str | Path | None = None, split: str | None = None, max_features: int = FQE_FEATURES) -> dict:
    """The router of `workdir` (its `stage`, default the last trained), the baselines, the fixed models and the
    random router, each estimated on the held-out logs (`split`: only that split's tasks of the workdir's
    `splits.json`) by IS, WIS, FQE, DR and WDR at the router's lambda, gamma and c_ref; writes ope.md and ope.json
    into `out` (default: the workdir). `max_features`: FQE reads the state embedding on its top principal directions
    (`heldout.principal_features`; 0: all of it)."""
    phases, workdir = Phases(), Path(workdir)
    router = Router.from_checkpoint(workdir, stage)
    episodes = held_out_split(read_heldout(episodes_path, cards_path, router), workdir, split)
    logging.info("evaluate_logs: %d held-out episodes read (%s)", len(episodes), phases.mark("read"))
    config = router.config
    held = heldout.held_out(episodes, router.pool, embedding_store(config, router.encoder, workdir),
                           config.max_state_tokens, router.reward)
    logs = held.logs
    logging.info("evaluate_logs: their %d states embedded (%s)", len(held.h), phases.mark("embedded"))
    fitted = log_baselines(router, workdir, baselines)
    logging.info("evaluate_logs: %d baselines fitted on the router's training logs (%s)", len(fitted),
                 phases.mark("baselines"))
    policies = {**fitted, **reference_policies(router.pool, logs.available, fitted.get(BEST_FIXED))}
    # the router's choices from the states' vectors already embedded (as its verdict reads them; 19 s -> 0.4 s on
    # the 49-model pool's test split, the same choices)
    chosen = deploy.choices(deploy.router_scores(router, held), held, router.commit)
    targets = {MAIN: deploy.one_hot(chosen, len(router.pool)), **targets_of(policies, logs, router.pool)}
    features = heldout.principal_features(held.h, max_features)
    logging.info("evaluate_logs: the choices of %d policies at every state; FQE on %d features (%s)", len(targets),
                 features.shape[1] - 1, phases.mark("targets"))
    result = ope.evaluate(logs, targets, features, resamples=resamples, seed=seed, ridge=ridge)
    result.update({"fixed_fallback": {m: share for m, share in missing_shares(router.pool, logs.available).items()
                                      if f"fixed:{m}" in policies},
                   "episodes_path": str(episodes_path), "router": str(workdir), "lambda": config.reward.lam,
                   "gamma": config.reward.gamma, "c_ref": router.c_ref, "fqe_features": features.shape[1] - 1,
                   "seconds": phases.seconds()})
    write_result(Path(out or workdir), "ope", result, estimates_table(result))
    if BEST_FIXED in policies:
        result["verdict"] = router_verdict(router, held, policies[BEST_FIXED], resamples, seed,
                                           f"held-out {split}" if split else "given held-out", Path(out or workdir),
                                           policies.get(BEST_PER_FAMILY))
    else:
        logging.warning("no verdict: the best fixed model of the router's training logs is unknown (its logs are "
                        "not where its config says)")
    return result


def router_verdict(router: Router, held: heldout.HeldOut, best_fixed: BestFixedRouter, resamples: int, seed: int,
                   split: str, out: Path, per_family: BestPerFamilyRouter | None = None) -> dict:
    """`verdict.judge_on_logs` of the router (recentred and committed as deployed) on the held-out episodes;
    written to <out>/verdict.{md,json}."""
    floor = deploy.floor_of(best_fixed, router.pool)
    result = judge_on_logs(MAIN, deploy.router_scores(router, held), held, router.pool, floor,
                           router.commit, resamples, seed, router.reward, split, per_family)
    write_verdict(out, result)
    return result


# ------------------------------------------------------------------------------------------------------ output


def interval(row: dict, channel: str, digits: int) -> str:
    """`estimate [lo, hi]`, or `undefined` (the IS family without supported episodes)."""
    value = row[channel]
    if math.isnan(value):
        return "undefined"
    return f"{value:.{digits}f} [{row[f'{channel}_lo']:.{digits}f}, {row[f'{channel}_hi']:.{digits}f}]"


def thin(row: dict) -> str:
    """A mark on IS and WIS rows that rest on fewer than 10 episodes followed to the end (`ope.support_stats`)."""
    return " (thin)" if row["estimator"] in ("IS", "WIS") and row.get("followed", 0) < 10 else ""


def estimates_table(result: dict) -> str:
    """The markdown report: what the IS family could use, FQE's penalty, then one row per policy and estimator."""
    lines = [f"Off-policy estimates on {result['episodes']} held-out episodes of {result['tasks']} tasks; 95% "
             f"percentile-bootstrap intervals over tasks ({result['resamples']} resamples).", "",
             f"Support: {result['support']}.", "",
             f"FQE: per-model ridge regression on the router's state embedding, penalty {result['ridge']:g}"
             f"{' (cross-validated, then / 10)' if 'ridge_errors' in result else ''}.", "",
             "J: expected discounted return (Eqs. 1-2); success: mean outcome; cost: dollars per episode. followed: "
             "supported episodes in which the policy chose the logged model at every turn; ESS: their effective "
             "number. (thin): fewer than 10 followed, so IS and WIS rest on a handful of episodes and their interval "
             "cannot show the weight of the trajectories no episode took; read FQE and DR there.", "",
             *fallback_note(result.get("fixed_fallback", {})),
             "| policy | estimator | J [95%] | success [95%] | cost $/episode [95%] | followed | ESS |",
             "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        support = (f"{row['followed']} | {row['ess']:.1f}" if "followed" in row else " | ")
        lines.append(f"| {row['policy']} | {row['estimator']}{thin(row)} | {interval(row, 'return', 3)} | "
                     f"{interval(row, 'success', 3)} | {interval(row, 'cost', 5)} | {support} |")
    return "\n".join(lines)


def fallback_note(fallback: dict[str, float]) -> list[str]:
    """A line naming the fixed models that were not available at every held-out state (and how often)."""
    if not fallback:
        return []
    shares = ", ".join(f"{m} {share:.0%}" for m, share in fallback.items())
    return [f"Not available at every held-out state, so {BEST_FIXED} decides there (the share of states): "
            f"{shares}.", ""]


def write_result(directory: Path, name: str, result: dict, table: str) -> None:
    """<directory>/<name>.md and <name>.json (NaN written as null)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.md").write_text(table + "\n", encoding="utf-8")
    (directory / f"{name}.json").write_text(json.dumps(nan_to_none(result), indent=2) + "\n", encoding="utf-8")
    logging.info("wrote %s", directory / f"{name}.md")


def nan_to_none(value):
    """JSON has no NaN: undefined estimates become null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [nan_to_none(v) for v in value]
    return value
