"""From logs to a router you can trust: `fit(config, workdir)` (what `launch.train` runs).

    logs -> their profile (data/profile.py: what they can teach; printed, <workdir>/logs_profile.json)
         -> the runs: the config's own in <workdir>, one per other conservatism setting in <workdir>/candidates/
            (`config.deploy.alphas` x `cql_on`, deduplicated: on logs without draws CQL "on draws" is no CQL), each
            `config.deploy.seeds` times (the seeds after the first in <its run>/seeds/<seed>: a setting's
            candidates average them), as one run group (train.train_group; a killed fit resumes every run)
         -> the validated choice on the held-out validation tasks (deploy.py): deploy.json, selection.md; or, with
            `config.deploy.folds` = K > 1, cross-validated: the runs train on every task but the test tasks, the
            grid again in each of K folds (<workdir>/folds/<j>) with a K-th of them held out, and every candidate
            is estimated on each fold by the runs that never trained on it (`_fit_crossvalidated`)
         -> the verdict on the held-out test tasks (verdict.py): verdict.json, verdict.md, printed

Without validation tasks (config.data.holdout.validation = 0 and no environment) nothing can be chosen: the
config's own run is trained alone, no deploy.json is written, and the log says the router is unvalidated.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Callable

import jax
import numpy as np
from absl import logging

from rivet_jax import checkpointing, deploy, heldout, train
from rivet_jax.baselines.best_fixed import family_of
from rivet_jax.baselines.single_turn_base import is_single_model
from rivet_jax.config_checks import check_config
from rivet_jax.corpus import PreparedData, corpus_paths, prepare_data, read_logs
from rivet_jax.data.files import atomic_write_text
from rivet_jax.data.profile import LogsProfile, profile_logs
from rivet_jax.data.prompt_cache import cache_aware
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode
from rivet_jax.data.splits import MANIFEST, SPLITS, episodes_of, task_folds
from rivet_jax.encoders import EmbeddingStore, cache_dir, embedding_store
from rivet_jax.envs.base import Env, RouterPolicy
from rivet_jax.heldout import Estimates
from rivet_jax.progress import Phases
from rivet_jax.runs import member_seeds
from rivet_jax.settings import with_overrides
from rivet_jax.stage_run import stored_c_ref
from rivet_jax.workdir_lock import hold_workdir
from rivet_jax.verdict import MIN_TASKS, VERDICT_MD, judge_by_rollouts, judge_on_logs, per_family_of, write_verdict

PROFILE_FILE = "logs_profile.json"
FOLDS_DIR, FOLD_FILE = "folds", "fold.json"   # cross-validation: <workdir>/folds/<j>/fold.json, its split


def logged_splits(config, workdir: Path) -> dict[str, list[Episode]]:
    """The logs by the workdir's task split (all training when nothing is held out)."""
    episodes = read_logs(config, *corpus_paths(config, workdir))[1].episodes
    manifest = workdir / MANIFEST
    if not manifest.exists():
        return {"train": episodes, "validation": [], "test": []}
    saved = json.loads(manifest.read_text(encoding="utf-8"))
    return {name: episodes_of(episodes, saved[name]) for name in SPLITS}


def setting_name(alpha: float, cql_on: str) -> str:
    return "alpha=0" if alpha == 0 else f"alpha={alpha:g},cql_on={cql_on}"


def conservatism(config, profile: LogsProfile) -> dict[str, dict]:
    """{setting name: loss overrides}: the config's own first, then every distinct setting of the grid. CQL on
    draws where the logs hold none is no CQL, so that setting is alpha = 0."""
    def effective(alpha: float, cql_on: str) -> tuple[float, str]:
        if alpha == 0 or (cql_on == "stochastic" and profile.stochastic_share == 0):
            return 0.0, "all"
        return alpha, cql_on

    own = (float(config.loss.alpha), str(config.loss.cql_on))
    out: dict[tuple, dict] = {}
    for alpha, cql_on in [own, *itertools.product(config.deploy.alphas, config.deploy.cql_on)]:
        key = effective(float(alpha), cql_on)
        out.setdefault(key, {"loss.alpha": float(alpha), "loss.cql_on": cql_on})
    return {setting_name(*key): overrides for key, overrides in out.items()}


def fit(config, workdir: str | Path, env: Env | None = None, on_epoch_end: Callable | None = None) -> dict:
    """Trains the runs, chooses what to deploy on validation and judges it on test (module docstring). Returns
    {"profile", "deploy" (the chosen candidate; None when nothing could be validated), "verdict" (None without test
    tasks), "verdict_text"}. `env`: the environment of the online stage and of exact rollouts (default: RouteSim for
    a config with `sim`)."""
    workdir, phases = Path(workdir), Phases()

    def log(message: str) -> None:
        logging.info("%s (%s)", message, phases.mark(message))

    check_config(config)
    env = env if env is not None else (train.environment(config) if "sim" in config else None)
    with hold_workdir(workdir):  # the candidates' runs live under it
        return _fit(config, workdir, env, on_epoch_end, log)


@dataclasses.dataclass(frozen=True)
class Trained:
    """A workdir's trained runs and what they were trained on."""

    runs: dict[str, tuple[str, ...]]    # conservatism setting -> its runs' directories (one per seed), relative to
                                        # the workdir; the config's own run is the first, "."
    prepared: PreparedData
    splits: dict[str, list[Episode]]    # the logs by task split
    profile: LogsProfile
    validated: bool                     # validation tasks (or an environment) to choose on


def train_runs(config, workdir: Path, env: Env | None, on_epoch_end: Callable | None,
               log: Callable[[str], None], grid: bool = False) -> Trained:
    """The logs' profile (written and logged) and the runs trained: the config's own and, when there is something
    to validate on (or `grid`: cross-validation validates on folds of its own), one per other conservatism setting
    (module docstring). The caller holds the workdir."""
    trained, configs, dirs = planned_runs(config, workdir, env, log, grid)
    train.train_group(configs, dirs, first_run_hook(on_epoch_end), env, [trained.prepared] * len(configs), held=True)
    return trained


def first_run_hook(on_epoch_end: Callable | None) -> Callable | None:
    """`fit`'s `on_epoch_end(stage, epoch, record)` as a run group's epoch hook: the config's own run's record."""
    return None if on_epoch_end is None else lambda stage, epoch, records: on_epoch_end(stage, epoch, records[0])


def planned_runs(config, workdir: Path, env: Env | None, log: Callable[[str], None],
                 grid: bool = False) -> tuple[Trained, list, list[Path]]:
    """`train_runs` up to the training: (what they will be, each run's config, each run's directory)."""
    prepared = prepare_data(config, workdir, c_ref=stored_c_ref(workdir))
    splits = logged_splits(config, workdir)
    profile = profile_logs(splits["train"], prepared.pool)
    atomic_write_text(workdir / PROFILE_FILE, json.dumps(profile.to_json(), indent=1) + "\n")
    for line in profile.lines():
        logging.info("logs: %s", line)
    validated = config.deploy.enabled and (env is not None or bool(splits["validation"]) or grid)
    settings = conservatism(config, profile) if validated else {}
    seeds = member_seeds(int(config.seed), int(config.deploy.seeds)) if validated else [int(config.seed)]
    cache = str(cache_dir(config, workdir))
    runs: dict[str, tuple[str, ...]] = {}
    configs, dirs = [], []
    for i, (name, overrides) in enumerate((settings or {"": {}}).items()):
        first = "." if i == 0 else f"candidates/{name}"
        runs[name] = tuple(first if k == 0 else f"{first}/seeds/{seed}" for k, seed in enumerate(seeds))
        for k, (directory, seed) in enumerate(zip(runs[name], seeds)):
            configs.append(config if i == k == 0 else with_overrides(
                config, {**overrides, "seed": seed, "data.embedding_cache": cache}))
            dirs.append(workdir / directory)
    log(f"training {len(configs)} run(s) in {workdir}: {', '.join(settings) or 'the config as given'}"
        + (f", {len(seeds)} seeds each" if len(seeds) > 1 else ""))
    return Trained(runs, prepared, splits, profile, validated), configs, dirs


def _fit(config, workdir: Path, env: Env | None, on_epoch_end: Callable | None, log: Callable[[str], None]) -> dict:
    if crossvalidated(config, env):
        return _fit_crossvalidated(config, workdir, on_epoch_end, log)
    trained = train_runs(config, workdir, env, on_epoch_end, log)
    result = {"profile": trained.profile.to_json(), "deploy": None, "verdict": None, "verdict_text": ""}
    if not trained.validated:
        log("no held-out validation tasks (config.data.holdout.validation = 0): nothing was validated; "
            "Router.from_checkpoint loads the last stage as trained, unchecked against the best fixed model")
        return result
    if jax.process_index() != 0:  # one host chooses and writes
        return result
    result.update(choose_and_judge(config, workdir, trained, env, log))
    return result


def earlier_td_epochs(config, workdir: Path) -> list[int]:
    """The TD epochs before the last that the config's run kept (`config.deploy.keep_td_every`)."""
    if "td" not in train.stages_of(config) or not config.deploy.keep_td_every:
        return []
    checkpoints = checkpointing.StageCheckpoints(workdir, "td", max_to_keep=None)
    epochs = checkpoints.epochs()
    checkpoints.close()
    return [e for e in epochs if e % config.deploy.keep_td_every == 0 and e < config.td_epochs]


def scorer_of(config, workdir: Path, trained: Trained, env: Env | None) -> deploy.Scorer:
    """What every candidate of the trained runs needs (`deploy.Scorer`): the per-model floor on the training
    tasks, the training states the centres are means over, whether the deployed router commits."""
    prepared = trained.prepared
    commit = deploy.commits(trained.profile, env is not None)
    reward, train_episodes = Reward.of(config, prepared.c_ref), trained.splits["train"]
    if any(is_single_model(e) for e in train_episodes):
        floor = deploy.fixed_floor(train_episodes, prepared.pool, reward)
    else:   # only an exploring proxy's draws
        store = embedding_store(config, prepared.encoder, workdir)
        floor = deploy.modelled_floor(heldout.held_out(train_episodes, prepared.pool, store, config.max_state_tokens,
                                                      reward), int(config.deploy.seed))
    replay = prepared.replay
    first = np.concatenate([[True], replay.episode[1:] != replay.episode[:-1]])
    rows = replay.state[first] if commit else replay.state                                          # (S,)
    families = {}
    if config.deploy.by_family:   # floors per task family where the training tasks have two with fixed-model returns
        families = deploy.family_floors(per_family_of(train_episodes, prepared.pool, reward), prepared.pool)
    state_families = ()   # (S,) the family of each of those states, for the centres per family
    if families:
        by_id = {e.episode_id: family_of(e.task) for e in train_episodes}
        of_episode = np.array([by_id.get(i, "") for i in replay.episode_ids], dtype=object)
        state_families = of_episode[replay.episode[first] if commit else replay.episode].tolist()
    return deploy.Scorer(workdir, prepared.pool, floor, np.asarray(prepared.data.embeddings)[rows], commit,
                         families, state_families)


def candidates_of(config, workdir: Path, runs: dict[str, tuple[str, ...]],
                  by_family: bool = False) -> list[deploy.Candidate]:
    """Every candidate of the trained runs (`deploy.candidates`: stages, kept TD epochs, ensembles, shrinkage, on
    the overall floor and, `by_family` (`Scorer.by_family`), on the family floors)."""
    return deploy.candidates(runs, train.stages_of(config), config.deploy.shrinkage,
                             {"td": earlier_td_epochs(config, workdir)}, by_family)


def choose_and_judge(config, workdir: Path, trained: Trained, env: Env | None, log: Callable[[str], None]) -> dict:
    scorer = scorer_of(config, workdir, trained, env)
    candidates = candidates_of(config, workdir, trained.runs, scorer.by_family)
    log(f"choosing among {len(candidates)} candidates on the validation tasks"
        f"{' (committed routing: A/B logs)' if scorer.commit else ''}")
    tasks = len({e.task.id for e in trained.splits["validation"]}) if env is None else None
    if tasks is not None and tasks < MIN_TASKS:
        logging.warning("only %d validation tasks: a router is deployed only if its gain over the best fixed model "
                        "(or route by family) shows with an interval above 0, which few tasks rarely allow; hold out "
                        "more (config.data.holdout.validation) or cross-validate (config.deploy.folds)", tasks)
    store = embedding_store(config, trained.prepared.encoder, workdir)
    estimates = validation_estimates(config, trained, scorer, candidates, env, store)
    return deploy_and_judge(config, workdir, trained, env, scorer, candidates, estimates, store, log)


def validation_estimates(config, trained: Trained, scorer: deploy.Scorer, candidates: list[deploy.Candidate],
                         env: Env | None, store: EmbeddingStore, seed: int | None = None,
                         screen: bool = True) -> Estimates:
    """Every candidate's J on the validation tasks: by rollouts with an environment, else from the held-out logs
    (`heldout.log_estimates`; doubly robust, its model cross-fitted on the training logs, where they were explored;
    `screen`: the bootstrap only of the candidates whose J beats the best fixed model's)."""
    prepared, splits, dc = trained.prepared, trained.splits, config.deploy
    pool, reward = prepared.pool, Reward.of(config, prepared.c_ref)
    seed = int(dc.seed) if seed is None else seed
    if env is None and cache_aware(config):
        logging.warning("model.cache_aware: the held-out estimates score each candidate without its prompt-cache "
                        "savings (held-out states are read from their embeddings, which leave out who served the "
                        "last turn), so they judge a cache-blind reading of it; the deployed router adds them")
    if env is not None:
        policies = {c.name: RouterPolicy(scorer.deployable(c), name=c.name) for c in candidates}
        return heldout.rollout_estimates(env, policies, "validation", dc.rollouts, seed, reward, dc.resamples)[0]
    held = heldout.held_out(splits["validation"], pool, store, config.max_state_tokens, reward)
    fit = None
    if heldout.explored_share(held) >= heldout.MIN_EXPLORED:  # DR, its model cross-fitted on the training logs
        train_held = heldout.held_out(splits["train"], pool, store, config.max_state_tokens, reward)
        fit = (train_held, deploy.targets_of(scorer, candidates, train_held))
    return heldout.log_estimates(held, deploy.targets_of(scorer, candidates, held), scorer.commit, dc.resamples,
                                 seed, screen_against=deploy.BEST_FIXED if screen else None, fit=fit,
                                 max_weight=float(dc.max_weight))


def deploy_and_judge(config, workdir: Path, trained: Trained, env: Env | None, scorer: deploy.Scorer,
                     candidates: list[deploy.Candidate], estimates: Estimates, store: EmbeddingStore,
                     log: Callable[[str], None], folds: list[Estimates] | None = None) -> dict:
    """The deployed choice among `candidates` by `estimates` (deploy.json, selection.md, with each candidate's J in
    every fold of a cross-validation), then its verdict on the test tasks."""
    dc, pool = config.deploy, trained.prepared.pool
    lam, gamma, c_ref = Reward.of(config, trained.prepared.c_ref)
    chosen = candidates[deploy.choose(estimates, dc.require_gain, dc.simultaneous, dc.one_se)]
    table = deploy.candidate_rows(estimates)
    spec = chosen.spec(scorer.choice(chosen), pool.names)
    fixed_model = pool.names[int(np.argmax(scorer.floor))]
    deploy.write_deployment(workdir, spec, {
        "estimator": estimates.estimator, "note": estimates.note, "tasks": estimates.tasks, "candidates": table,
        "lambda": lam, "gamma": gamma, "c_ref": c_ref, "best_fixed_model": fixed_model,
        "require_gain": bool(dc.require_gain), "simultaneous": bool(dc.simultaneous), "one_se": bool(dc.one_se),
        "runs": trained.runs, **({"folds": [part.tasks for part in folds]} if folds else {})})
    atomic_write_text(workdir / deploy.SELECTION_FILE, deploy.selection_table(
        table, estimates, chosen.name, f"What {workdir} deploys: {chosen.name}", folds))
    log(f"deployed: {chosen.name} (validation J {estimates.point[estimates.index(chosen.name), 0]:.4f}; best fixed "
        f"model {fixed_model}: {estimates.point[estimates.index(deploy.BEST_FIXED), 0]:.4f}); "
        f"{workdir / deploy.SELECTION_FILE}")
    judged = judge(config, workdir, chosen, scorer, trained.splits, env, store, scorer.floor, log)
    return {"deploy": spec, **judged}


# ------------------------------------------------------------------------------------------- cross-validation


def crossvalidated(config, env: Env | None) -> bool:
    """Whether the choice is cross-validated over tasks (`config.deploy.folds` > 1, on logs: an environment's
    validation rollouts need none)."""
    return bool(config.deploy.enabled) and int(config.deploy.folds) > 1 and env is None


def fold_dirs(workdir: Path, folds: int) -> list[Path]:
    return [workdir / FOLDS_DIR / str(j) for j in range(folds)]


def _fit_crossvalidated(config, workdir: Path, on_epoch_end: Callable | None, log: Callable[[str], None]) -> dict:
    """`config.deploy.folds` = K > 1: the runs of the workdir train on every task but the test tasks (no validation
    split), and K more copies of the conservatism grid, each in <workdir>/folds/<j> with the j-th fold of those tasks
    held out (`splits.task_folds`), all of them as one run group; every candidate is estimated on each fold by the
    runs that did not train on it, the folds pooled (`heldout.pooled`), and the choice so made deploys the
    workdir's own runs of that candidate. The choice reads every training task instead of a validation split of a
    tenth of them."""
    folds, seed = int(config.deploy.folds), int(config.data.holdout.seed)
    if config.data.holdout.validation:
        log(f"cross-validating over {folds} folds of the tasks: config.data.holdout.validation "
            f"({config.data.holdout.validation:g}) is not held out, every fold is")
    main = with_overrides(config, {"data.holdout.validation": 0.0})
    trained, configs, dirs = planned_runs(main, workdir, None, log, grid=True)
    manifest = workdir / MANIFEST
    split = ({name: json.loads(manifest.read_text(encoding="utf-8"))[name] for name in SPLITS} if manifest.exists()
             else {"train": sorted({e.task.id for e in trained.splits["train"]}), "validation": [], "test": []})
    prepared = [trained.prepared] * len(configs)
    fold_configs, fold_plans = [], []
    for j, (directory, fold) in enumerate(zip(fold_dirs(workdir, folds),
                                              task_folds(split, trained.splits["train"], folds, seed))):
        directory.mkdir(parents=True, exist_ok=True)   # under the workdir `fit` holds
        path = directory / FOLD_FILE
        if not path.exists():
            atomic_write_text(path, json.dumps(fold, indent=1) + "\n")
        fold_configs.append(with_overrides(config, {
            "data.holdout.validation": 0.0, "data.holdout.test": 0.0, "data.holdout.extend": str(path),
            "deploy.folds": 1, "data.embedding_cache": str(cache_dir(config, workdir))}))
        log(f"fold {j + 1}/{folds}: {len(fold['validation'])} tasks held out, {len(fold['train'])} trained on")
        plan, fold_run_configs, fold_run_dirs = planned_runs(fold_configs[-1], directory, None, log)
        fold_plans.append(plan)
        configs, dirs = configs + fold_run_configs, dirs + fold_run_dirs
        prepared += [plan.prepared] * len(fold_run_configs)
    log(f"training the workdir's runs and {folds} folds' as one group of {len(configs)}")
    train.train_group(configs, dirs, first_run_hook(on_epoch_end), None, prepared, held=True)
    if jax.process_index() != 0:
        return {"profile": trained.profile.to_json(), "deploy": None, "verdict": None, "verdict_text": ""}
    scorer = scorer_of(main, workdir, trained, None)
    candidates = candidates_of(main, workdir, trained.runs, scorer.by_family)
    store = embedding_store(main, trained.prepared.encoder, workdir)   # the folds embed into the same cache
    parts: list[Estimates] = []
    for j, (directory, fold_config, plan) in enumerate(zip(fold_dirs(workdir, folds), fold_configs, fold_plans)):
        log(f"fold {j + 1}/{folds}: every candidate estimated on its "
            f"{len({e.task.id for e in plan.splits['validation']})} held-out tasks")  # splits hold episodes
        fold_scorer = dataclasses.replace(scorer_of(fold_config, directory, plan, None), commit=scorer.commit)
        parts.append(validation_estimates(fold_config, plan, fold_scorer,
                                          candidates_of(fold_config, directory, plan.runs, fold_scorer.by_family),
                                          None, store, int(config.deploy.seed) + j, screen=False))
    # a candidate every fold estimated (a family floor that a fold's training tasks lack is not), in this order
    candidates = [c for c in candidates if all(c.name in part.names for part in parts)]
    parts = [part.only([c.name for c in candidates]) for part in parts]
    estimates = heldout.pooled(parts,
                               f"cross-validated: each of {folds} folds of {sum(p.tasks for p in parts)} tasks "
                               f"estimated by the runs that did not train on it, pooled; fold 1: {parts[0].note}")
    log(f"choosing among {len(candidates)} candidates, cross-validated over {estimates.tasks} tasks in {folds} folds")
    return {"profile": trained.profile.to_json(), **deploy_and_judge(
        main, workdir, trained, None, scorer, candidates, estimates, store, log, parts)}


def judge(config, workdir: Path, chosen: deploy.Candidate, scorer: deploy.Scorer, splits: dict, env: Env | None,
          store: EmbeddingStore, floor: np.ndarray, log: Callable[[str], None]) -> dict:
    """The verdict of the deployed candidate on the test tasks (none held out: no verdict)."""
    pool, dc = scorer.pool, config.deploy
    reward = Reward.of(config, scorer.router(chosen).c_ref)
    per_family = per_family_of(splits["train"], pool, reward)
    if env is not None:
        result = judge_by_rollouts(env, chosen.name, RouterPolicy(scorer.deployable(chosen), name=chosen.name), pool,
                                   floor, dc.rollouts, dc.seed + 1, reward, dc.resamples, per_family=per_family)
    elif splits["test"]:
        held = heldout.held_out(splits["test"], pool, store, config.max_state_tokens, reward)
        scores = next(deploy.held_scores(scorer, [chosen], held))   # as `choices` reads them
        result = judge_on_logs(chosen.name, scores, held, pool, floor,
                               scorer.commit, dc.resamples, dc.seed + 1, reward, per_family=per_family)
    else:
        log("no held-out test tasks (config.data.holdout.test = 0): no verdict")
        return {"verdict": None, "verdict_text": ""}
    text = write_verdict(workdir, result)
    log(f"verdict written to {workdir / VERDICT_MD}")
    return {"verdict": result, "verdict_text": text}
