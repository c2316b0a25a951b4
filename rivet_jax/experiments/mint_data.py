"""The MINT logs as a committed-routing table: the converted episodes split into train / validation / test tasks,
what each (task, model) commitment logged, which models each task has available, and the fixed-model policies
scored on it (every model, the best fixed model of the training tasks, the best fixed model per task family,
random in expectation, the per-task oracle). `rivet_jax.experiments.mint` trains and scores the routers on it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from rivet_jax.card_prior import CardPrior, fit_return_prior, prior_floor
from rivet_jax.data.converters.mint import MintCorpus, convert_mint
from rivet_jax.data.replay import Reward, reference_cost
from rivet_jax.data.schema import Episode, ModelPool, read_model_cards, write_episodes, write_model_cards
from rivet_jax.heldout import task_bootstrap
from rivet_jax.evaluation import discounted_return
from rivet_jax.experiments.mint_manifest import load_manifest, make_manifest

__all__ = ["MintData", "committed", "expected_random", "oracle_choice", "fixed_choice", "training_returns",
           "fixed_ranking", "family_choice", "family_values", "prior_family_choice", "centre_of", "shrunk",
           "recentred", "task_floors", "task_centres",
           "per_task_returns", "paired_intervals", "by_family", "card_metadata", "card_groups", "choice_profile"]


class MintData:
    """The converted logs split into train / validation / test tasks, and the logged (task, model) outcome/cost
    table.

    The split: the shipped manifest (the six-model pool's 316 tasks), or, where `config.experiment.split_fractions`
    is set (the large pool), `make_manifest` over the converted tasks with those validation and test fractions per
    subset and `config.experiment.split_seed`: configured and seeded, never chosen by results; written to
    `<workdir>/corpus/splits.json`. A model without logs on a task's subset is unavailable on it
    (`available[task]`); a logged call that failed before any answer (`MintCorpus.unanswered`) is a failure at
    no cost, which is what committing to that model got.
    """

    def __init__(self, config, workdir: Path):
        mint_dir = Path(config.mint_dir)
        if not mint_dir.is_dir():
            raise FileNotFoundError(f"MINT data not found at {mint_dir}: pass --config.mint_dir=<your copy of MINT's "
                                    f"data folder>")
        cards_path = config.cards or mint_dir / "model_cards.json"
        self.pool = read_model_cards(cards_path)
        self.card_meta = card_metadata(cards_path)
        corpus = convert_mint(mint_dir, self.pool)
        self.tasks = corpus.tasks
        manifest = _manifest(config.experiment, self.tasks)
        limit = config.experiment.get("max_tasks_per_subset")
        self.split = {name: _first_per_subset(manifest[name], limit) if limit else list(manifest[name])
                      for name in ("train", "validation", "test")}
        by_split = {name: set(ids) for name, ids in self.split.items()}
        self.episodes = {name: [e for e in corpus.episodes if e.task.id in ids] for name, ids in by_split.items()}
        self.available = {t: corpus.available[task.family] for t, task in self.tasks.items()}
        self.table = {(e.task.id, e.turns[0].model): (e.outcome, sum(t.cost for t in e.turns))
                      for e in corpus.episodes}
        self.table.update({key: (0, 0.0) for key in corpus.unanswered})
        self.logged = {(e.task.id, e.turns[0].model): e for e in corpus.episodes}  # (task, model) -> its episode
        self.notes = corpus.notes
        directory = workdir / "corpus"
        directory.mkdir(parents=True, exist_ok=True)
        self.train_path, self.cards_path = directory / "train_episodes.jsonl", directory / "model_cards.json"
        write_episodes(self.train_path, self.episodes["train"])
        write_model_cards(self.cards_path, self.pool)
        (directory / "splits.json").write_text(json.dumps(self.split, indent=1) + "\n", encoding="utf-8")
        self.c_ref = reference_cost(self.episodes["train"])

    def without(self, held_out: Sequence[str], directory: Path) -> "MintData":
        """These logs with the `held_out` models taken out of the pool, of every task's available models and of the
        training episodes (written to `directory`, with the reduced pool's cards, for training there). Their
        logged outcomes stay in the table: a router that routes to them from their cards is scored with them."""
        known = [m for m in self.pool.names if m not in set(held_out)]
        data = copy.copy(self)
        data.pool = self.pool.subset(known)
        data.available = {t: [m for m in models if m in known] for t, models in self.available.items()}
        data.episodes = {name: [_within(e, known) for e in eps if e.turns[0].model in known]
                         for name, eps in self.episodes.items()}
        directory.mkdir(parents=True, exist_ok=True)
        data.train_path, data.cards_path = directory / "train_episodes.jsonl", directory / "model_cards.json"
        write_episodes(data.train_path, data.episodes["train"])
        write_model_cards(data.cards_path, data.pool)
        return data

    def with_models(self, pool: ModelPool, corpus: MintCorpus) -> "MintData":
        """These logs with models from elsewhere added (`pool`, their converted logs `corpus` on the same tasks):
        available where they have logs, scored by them, never trained on (the training files stay these)."""
        clash = sorted(set(pool.names) & set(self.pool.names))
        if clash:
            raise ValueError(f"new models already in the pool: {clash}; a new model needs a name of its own")
        data = copy.copy(self)
        data.pool = ModelPool(self.pool.cards + pool.cards)
        data.available = {t: [*models, *corpus.available.get(self.tasks[t].family, [])]
                          for t, models in self.available.items()}
        ours = [e for e in corpus.episodes if e.task.id in self.tasks]
        data.table = {**self.table, **{(e.task.id, e.turns[0].model): (e.outcome, sum(t.cost for t in e.turns))
                                       for e in ours},
                      **{key: (0, 0.0) for key in corpus.unanswered if key[0] in self.tasks}}
        data.logged = {**self.logged, **{(e.task.id, e.turns[0].model): e for e in ours}}
        return data

    def episode_return(self, task_id: str, model: str, lam: float, gamma: float) -> float:
        """J (Eq. 2) of committing to `model` on the task: its logged episode's, 0 for a call that failed."""
        episode = self.logged.get((task_id, model))
        return 0.0 if episode is None else discounted_return(episode, Reward(lam, gamma, self.c_ref))

    def mask(self, task_ids: Sequence[str], names: Sequence[str]) -> np.ndarray:
        """(T, M) bool: which of `names` are available on each task."""
        return np.array([[m in self.available[t] for m in names] for t in task_ids])


def card_metadata(path) -> dict[str, dict]:
    """Each model's card fields the router does not read (family, open_weights), for the diagnostics."""
    models = json.loads(Path(path).read_text(encoding="utf-8")).get("models", [])
    return {card["name"]: {k: card.get(k) for k in ("family", "open_weights")} for card in models}


def card_groups(data: MintData) -> dict[str, Callable[[str], str]]:
    """How the diagnostics group models (grouping -> model -> value): the card's family, open weights or not, price
    tier (output price per million tokens) and the code and math flags."""
    def field(key: str) -> Callable[[str], str]:
        return lambda m: str(data.card_meta.get(m, {}).get(key))

    def price(m: str) -> str:
        value = data.pool.cards[data.pool.index(m)].price_out_per_mtok
        return "unknown" if value is None else "< $1" if value < 1 else "$1-10" if value < 10 else ">= $10"

    def flag(name: str) -> Callable[[str], str]:
        return lambda m: str(data.pool.cards[data.pool.index(m)].capability(name))

    return {"model family": field("family"), "open weights": field("open_weights"), "price out / Mtok": price,
            "capability: code": flag("code"), "capability: math": flag("math")}


def choice_profile(data: MintData, routers: dict[str, Sequence[Callable[[str], str]]],
                   groups: dict[str, Callable[[str], str]], lam: float, gamma: float) -> list[dict]:
    """Where each router's test choices go, by card field: per (grouping, value), every router's share of its first
    choices on such models and their accuracy there (blank where it chose none)."""
    picks = {name: [(t, choose(t)) for choose in fns for t in data.split["test"]] for name, fns in routers.items()}
    rows = []
    for grouping, value_of in groups.items():
        for value in sorted({value_of(m) for m in data.pool.names}):
            row = {"grouping": grouping, "value": value,
                   "models": sum(value_of(m) == value for m in data.pool.names)}
            for name, keys in picks.items():
                here = [key for key in keys if value_of(key[1]) == value]
                row[f"{name}: share"] = len(here) / len(keys)
                row[f"{name}: accuracy"] = float(np.mean([data.table[k][0] for k in here])) if here else None
            rows.append(row)
    return rows


def _within(episode: Episode, names: Sequence[str]) -> Episode:
    """The episode with each turn's available models cut down to `names` (a turn listing none keeps None)."""
    turns = tuple(t if t.available is None else dataclasses.replace(t, available=tuple(m for m in t.available
                                                                                      if m in names))
                  for t in episode.turns)
    return dataclasses.replace(episode, turns=turns)


def _manifest(experiment, tasks: dict) -> dict:
    """The shipped manifest, or one made over `tasks` with the configured fractions (see MintData)."""
    fractions = experiment.get("split_fractions")
    if not fractions:
        return load_manifest()
    validation, test = fractions
    by_subset: dict[str, list[str]] = {}
    for task in tasks.values():
        by_subset.setdefault(task.family, []).append(task.id.split("/", 1)[1])
    return make_manifest(by_subset, experiment.split_seed,
                         test_counts={s: round(test * len(ids)) for s, ids in by_subset.items()},
                         n_validation=round(validation * len(tasks)))


def _first_per_subset(task_ids: Sequence[str], count: int) -> list[str]:
    """The first `count` task ids of each subset (the tiny variant), in manifest order."""
    seen: dict[str, int] = {}
    kept = []
    for task_id in task_ids:
        subset = task_id.split("/")[0]
        if seen.get(subset, 0) < count:
            seen[subset] = seen.get(subset, 0) + 1
            kept.append(task_id)
    return kept


def committed(data: MintData, choose: Callable[[str], str], reference: float, lam: float, gamma: float,
               split: str = "test") -> dict:
    """Accuracy, total cost and mean return J (Eq. 2 of the committed model's logged episode, at `lam` and c_ref) on
    the split's tasks when `choose(task_id)` commits to a model (one the task has available)."""
    chosen = [(t, choose(t)) for t in data.split[split]]
    unavailable = [(t, m) for t, m in chosen if m not in data.available[t]]
    if unavailable:
        raise ValueError(f"a router committed to a model unavailable on the task: {unavailable[:3]}")
    picks = [data.table[key] for key in chosen]
    cost = float(sum(c for _, c in picks))
    return {"accuracy": float(np.mean([y for y, _ in picks])), "cost_usd": cost, "cost_rel": cost / reference,
            "return": float(np.mean([data.episode_return(t, m, lam, gamma) for t, m in chosen]))}


def expected_random(data: MintData, reference: float, lam: float, gamma: float) -> dict:
    """The random router's committed routing in expectation: every available model equally likely per task."""
    tasks = data.split["test"]
    per_task = [[(*data.table[(t, m)], data.episode_return(t, m, lam, gamma)) for m in data.available[t]]
                for t in tasks]
    cost = float(sum(np.mean([c for _, c, _ in rows]) for rows in per_task))
    return {"accuracy": float(np.mean([np.mean([y for y, _, _ in rows]) for rows in per_task])), "cost_usd": cost,
            "cost_rel": cost / reference, "return": float(np.mean([np.mean([j for _, _, j in rows])
                                                                   for rows in per_task]))}


def oracle_choice(data: MintData, task_id: str) -> str:
    """The cheapest of the available models with the task's best outcome: on 0/1 outcomes the cheapest model that
    succeeded, and if none did, the cheapest model."""
    logged = {m: data.table[(task_id, m)] for m in data.available[task_id]}
    best = max(y for y, _ in logged.values())
    return min((m for m, (y, _) in logged.items() if y == best), key=lambda m: logged[m][1])


def fixed_choice(data: MintData, model: str, fallback: Sequence[str]) -> Callable[[str], str]:
    """task id -> `model` where it is available, else the first available model of `fallback` (a ranking)."""
    def choose(task_id: str) -> str:
        return next(m for m in (model, *fallback) if m in data.available[task_id])
    return choose


def training_returns(data: MintData, lam: float, gamma: float) -> dict[str, float]:
    """Each model's mean J over the training tasks it is available on (failed calls count, at J 0)."""
    returns = {}
    for m in data.pool.names:
        values = [data.episode_return(t, m, lam, gamma) for t in data.split["train"] if m in data.available[t]]
        if values:
            returns[m] = float(np.mean(values))
    return returns


def fixed_ranking(data: MintData, lam: float, gamma: float) -> list[str]:
    """The models by mean training J, best first; those available on every training task before the others (a
    model missing a hard subset would otherwise rank on the easier tasks alone)."""
    returns = training_returns(data, lam, gamma)
    everywhere = {m for m in returns if all(m in data.available[t] for t in data.split["train"])}
    return sorted(returns, key=lambda m: (m not in everywhere, -returns[m]))


def family_choice(data: MintData, lam: float, gamma: float) -> Callable[[str], str]:
    """The best fixed model per task family: on each family (subset), the model with the best mean J over that
    family's training tasks among those available on it."""
    best = {}
    for family in {data.tasks[t].family for t in data.tasks}:
        train = [t for t in data.split["train"] if data.tasks[t].family == family]
        candidates = [m for m in data.pool.names if train and all(m in data.available[t] for t in train)]
        if candidates:
            best[family] = max(candidates, key=lambda m: np.mean([data.episode_return(t, m, lam, gamma)
                                                                  for t in train]))
    fallback = fixed_ranking(data, lam, gamma)
    return lambda t: next(m for m in (best.get(data.tasks[t].family), *fallback) if m in data.available[t])


def family_values(data: MintData, known: MintData, lam: float, gamma: float
                  ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(families, success (M, G), cost (M, G)): each model of `data.pool` as a fixed model on each family's training
    tasks, where it is one of `known`'s models and available on all of them (what `family_choice` compares), else
    NaN; its mean J = success - cost, success its mean J at lambda 0: the card prior's targets."""
    families = sorted({data.tasks[t].family for t in data.tasks})
    success, cost = np.full((2, len(data.pool), len(families)), np.nan)
    for g, family in enumerate(families):
        train = [t for t in data.split["train"] if data.tasks[t].family == family]
        for i, m in enumerate(data.pool.names):
            if train and m in known.pool and all(m in known.available[t] for t in train):
                success[i, g] = np.mean([data.episode_return(t, m, 0.0, gamma) for t in train])
                cost[i, g] = success[i, g] - np.mean([data.episode_return(t, m, lam, gamma) for t in train])
    return families, success, cost


def prior_family_choice(data: MintData, known: MintData, lam: float, gamma: float,
                        embeddings: np.ndarray | None = None) -> tuple[Callable[[str], str], CardPrior]:
    """`family_choice` over the known models, but on each family a model without logs (in `data.pool`, not in
    `known`'s) is chosen instead where its card prior's conservative level (`card_prior.prior_floor`: prediction
    minus the leave-one-model-out error of `card_prior.fit_return_prior`, fitted on the known models' family values)
    beats the family's best known model; the highest such level wins. `embeddings` (M, D): the cards' description
    embeddings (None: the prior reads the structured fields alone)."""
    families, success, cost = family_values(data, known, lam, gamma)
    values = success - cost
    prior = fit_return_prior(data.pool.cards, success, cost, families, embeddings=embeddings)
    choose_known = family_choice(known, lam, gamma)
    new = [i for i, m in enumerate(data.pool.names) if m not in known.pool]
    pick = {}
    for g, family in enumerate(families):
        level = prior_floor(prior, family)
        best_known = np.nanmax(values[:, g]) if np.isfinite(values[:, g]).any() else -np.inf
        better = [i for i in new if np.isfinite(level[i]) and level[i] > best_known]
        if better:
            pick[family] = data.pool.names[max(better, key=lambda i: level[i])]

    def choose(task_id: str) -> str:
        model = pick.get(data.tasks[task_id].family)
        return model if model is not None and model in data.available[task_id] else choose_known(task_id)
    return choose, prior


def _masked_mean(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """The mean of the finite entries along `axis`; NaN where there are none (quietly, unlike np.nanmean)."""
    finite = np.isfinite(values)
    count = finite.sum(axis=axis)
    total = np.where(finite, values, 0.0).sum(axis=axis)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def centre_of(q_train: np.ndarray) -> np.ndarray:
    """(M,) each model's mean score over the training tasks it is available on (its other scores are -inf)."""
    return _masked_mean(q_train)


def shrunk(q: np.ndarray, floor: np.ndarray, centre: np.ndarray, k: float) -> np.ndarray:
    """(T, M) floor + k (q - centre) where a model is available (q finite), -inf where it is not; `floor` and
    `centre` broadcast against q ((M,) or (T, M))."""
    available = np.isfinite(q)
    return np.where(available, floor + k * np.where(available, q - centre, 0.0), -np.inf)


def recentred(q: np.ndarray, q_train: np.ndarray, floor: np.ndarray, k: float) -> np.ndarray:
    """Committed-value scores (T, M): each model's mean logged return over the training tasks (`floor`, (M,)) plus k
    times the router's task-specific deviation from its own training mean (`q_train`, (N, M)).

    k = 0 commits to the best fixed model; k = 1 keeps the router's differences between tasks at the logged level of
    each model. The level matters for the TD stage, whose Q(s_0, m) values calling m first and routing on; the
    shrinkage matters when 140 training tasks leave per-task differences noisier than the models' margins.
    """
    return shrunk(q, floor[None, :], centre_of(q_train)[None, :], k)


def _by_family(data: MintData, tasks: Sequence[str], values: dict, fallback: np.ndarray) -> np.ndarray:
    """(T, M) the row of each task's family in `values` (family -> (M,)), `fallback` (M,) where that is NaN."""
    rows = np.array([values.get(data.tasks[t].family, fallback) for t in tasks], np.float64).reshape(len(tasks), -1)
    return np.where(np.isnan(rows), fallback[None, :], rows)


def task_floors(data: MintData, names: Sequence[str], tasks: Sequence[str], kind: str, lam: float, gamma: float
                ) -> np.ndarray:
    """(T, M) each model's logged floor on each task: its mean J over the training tasks it is available on
    ("model"), or over those of the task's family ("family": at k = 0 the best fixed model per family; the model's
    overall floor where it has no training task of that family). NaN for a model without training logs."""
    if kind not in ("model", "family"):
        raise ValueError(f"unknown floor {kind!r}; known: 'model', 'family'")
    train = data.split["train"]
    returns = np.array([[data.episode_return(t, m, lam, gamma) if m in data.available[t] else np.nan for m in names]
                        for t in train]).reshape(len(train), len(names))                     # (N, M), NaN: unavailable
    floor = _masked_mean(returns)                                          # (M,): `training_returns`, as an array
    if kind == "model":
        return np.broadcast_to(floor, (len(tasks), len(names))).copy()
    families = np.array([data.tasks[t].family for t in train])
    per_family = {f: _masked_mean(returns[families == f]) for f in set(families.tolist())}
    return _by_family(data, tasks, per_family, floor)


def task_centres(data: MintData, q_train: np.ndarray, tasks: Sequence[str], kind: str) -> np.ndarray:
    """(T, M) the router's mean score of each model, over the training tasks ("model") or those of each task's
    family ("family"; the overall mean where the family has none): what `shrunk` measures deviations from."""
    overall = centre_of(q_train)
    if kind == "model":
        return np.broadcast_to(overall, (len(tasks), len(overall))).copy()
    families = np.array([data.tasks[t].family for t in data.split["train"]])
    per_family = {f: _masked_mean(q_train[families == f]) for f in set(families.tolist())}
    return _by_family(data, tasks, per_family, overall)


def per_task_returns(data: MintData, choices: Sequence[Callable[[str], str]], lam: float, gamma: float,
                     split: str = "test") -> np.ndarray:
    """(T,) each task's J under a router, averaged over its runs (one choice function per run)."""
    return np.mean([[data.episode_return(t, choose(t), lam, gamma) for t in data.split[split]] for choose in choices],
                   axis=0)


def paired_intervals(data: MintData, routers: dict[str, Sequence[Callable[[str], str]]], against: str, lam: float,
                     gamma: float, resamples: int = 2000, seed: int = 0) -> list[dict]:
    """Each router's test J with a 95% bootstrap interval over tasks (the clusters: a task's difficulty moves
    every router), and the paired difference J(against) - J(router) on the same resamples, with its interval."""
    values = {name: per_task_returns(data, fns, lam, gamma) for name, fns in routers.items()}   # name -> (T,)
    tasks = len(data.split["test"])
    resampled = task_bootstrap(np.stack(list(values.values()))[:, :, None], resamples, seed)[:, :, 0]  # (B, P)
    draws = dict(zip(values, resampled.T))                                                      # name -> (B,)
    rows = []
    for name, v in values.items():
        low, high = np.percentile(draws[name], [2.5, 97.5])
        d_low, d_high = np.percentile(draws[against] - draws[name], [2.5, 97.5])
        rows.append({"router": name, "return": float(v.mean()), "ci95_low": float(low), "ci95_high": float(high),
                     "gain": float(values[against].mean() - v.mean()), "gain_low": float(d_low),
                     "gain_high": float(d_high), "tasks": tasks})
    return rows


def by_family(data: MintData, routers: dict[str, Sequence[Callable[[str], str]]], lam: float, gamma: float
              ) -> list[dict]:
    """Accuracy, cost and J of each router on each task family's test tasks (mean over its runs)."""
    rows = []
    for family in sorted({data.tasks[t].family for t in data.split["test"]}):
        tasks = [t for t in data.split["test"] if data.tasks[t].family == family]
        for name, fns in routers.items():
            picks = [(t, choose(t)) for choose in fns for t in tasks]
            rows.append({"family": family, "router": name, "tasks": len(tasks),
                         "accuracy": float(np.mean([data.table[k][0] for k in picks])),
                         "cost_usd": float(sum(data.table[k][1] for k in picks)) / len(fns),
                         "return": float(np.mean([data.episode_return(*k, lam, gamma) for k in picks]))})
    return rows
