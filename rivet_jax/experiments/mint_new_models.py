"""New models routed to from their cards alone (`launch.mint`: `config.experiment.new_models`, `config.new_models_dir`).

RIVET's RVE reads a candidate only through its card (description embedding, prices, context, capability flags), so a
router can score a model it has never seen logged. Two ways to ask whether that helps, on committed routing:

  leave-k-models-out   for each of `draws` seeded draws, k models of the pool are held out; RIVET (beta = 1, the
                       configured seeds) trains on the other models' training episodes only, then routes over the
                       whole pool, the held-out models known by their cards and prices only.
  new_models_dir       models of another directory (the layout of ../shared/mint-large: cards and logs), never
                       trained on, added by their cards to the routers of the main runs.

Nothing is chosen with the new models' logs, which are read only to score the choices on the test tasks: the
stage and shrinkage k of the validated commitment are chosen on the validation tasks among the known models (that
is the router that ignores the new models), and a new model's floor, its level before the task-specific part, is
the router's own mean score for it over the training tasks, corrected by the router's mean error on the known
models' floors (their logged mean returns). Rows per draw: the router ignoring the new models, the same router with
their cards, RIVET trained with their logs (leave-k-out only: the main runs' validated commitment), the
MTRouter-style estimators (the baseline that also scores a model from its card) without and with the new cards,
and the best fixed model per family among the known models. For each router with new models: the share of first
choices that go to them, the success of those choices, and the J gained against ignoring them.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from rivet_jax.baselines.mtrouter import MTRouter
from rivet_jax.data.schema import ModelCard
from rivet_jax.encoders import EmbeddingStore
from rivet_jax.experiments.mint_data import (MintData, committed, family_choice, shrunk, task_centres,
                                             task_floors)
from rivet_jax.router import Router

__all__ = ["held_out_draws", "card_floor", "card_commitment", "new_model_rows"]

Chooser = Callable[[str], str]
Scores = Callable[[Router, MintData, EmbeddingStore, str], np.ndarray]  # Q_route(s_0, m) (T, M) on a split's tasks


def held_out_draws(names: Sequence[str], k: int, draws: int, seed: int) -> list[tuple[str, ...]]:
    """`draws` sets of k models each (pool order within a set), drawn uniformly without replacement per draw."""
    if not 0 < k < len(names):
        raise ValueError(f"new_models.k must be between 1 and the pool size - 1 ({len(names) - 1}), got {k}")
    rng = np.random.default_rng(seed)
    return [tuple(names[i] for i in sorted(rng.choice(len(names), size=k, replace=False))) for _ in range(draws)]


def card_floor(logged: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """(T, M) each model's floor on each task: its logged floor (`logged`, NaN for a model without training logs),
    else the router's own mean score (`centre`) plus the router's mean error on that task's logged floors."""
    known = np.isfinite(logged) & np.isfinite(centre)
    errors = np.where(known, logged - np.where(known, centre, 0.0), 0.0)
    offset = errors.sum(axis=1) / np.maximum(known.sum(axis=1), 1)                                   # (T,)
    return np.where(np.isnan(logged), centre + offset[:, None], logged)


def card_commitment(routers: Sequence[Router], cards: Sequence[ModelCard], data: MintData, known: MintData,
                    store: EmbeddingStore, kind: str, k: float, lam: float, gamma: float, scores: Scores
                    ) -> list[Chooser]:
    """Each router's test choices over its pool plus `cards` (`data`: the tables with the new models' logs, for
    availability and scoring), with the floor kind and shrinkage k chosen on the known models, the new models'
    floors from `card_floor`."""
    tasks = data.split["test"]
    choices = []
    for router in routers:
        wide = router.with_new_models(cards)
        names = wide.pool.names
        train, test = scores(wide, data, store, "train"), scores(wide, data, store, "test")
        centre = task_centres(data, train, tasks, kind)
        floor = card_floor(task_floors(known, names, tasks, kind, lam, gamma), centre)   # NaN -> from the card
        best = np.argmax(shrunk(test, floor, centre, k), axis=1)
        choices.append(dict(zip(tasks, (names[int(b)] for b in best))).__getitem__)
    return choices


def _with_cards(row: dict, choosers: Sequence[Chooser], ignoring: dict, new: set[str], data: MintData) -> dict:
    """A router with new models: its committed `row`, the share of its choices on new models, their success there,
    and its J gained against `ignoring` (the row of the same router without them)."""
    picks = [(t, choose(t)) for choose in choosers for t in data.split["test"]]
    on_new = [key for key in picks if key[1] in new]
    return {**row, "new_share": len(on_new) / len(picks),
            "new_success": float(np.mean([data.table[key][0] for key in on_new])) if on_new else float("nan"),
            "gain_vs_ignoring": row["return"] - ignoring["return"]}


def _row(name: str, choosers: Sequence[Chooser], data: MintData, reference: float, lam: float, gamma: float) -> dict:
    per_run = [committed(data, choose, reference, lam, gamma) for choose in choosers]
    return {"router": name, **{k: float(np.mean([p[k] for p in per_run])) for k in ("accuracy", "cost_usd",
                                                                                  "return")}}


def new_model_rows(draw: str, held: Sequence[str], data: MintData, known: MintData, routers: dict[str, list[Router]],
                   chosen: dict, store: EmbeddingStore, config, reference: float, scores: Scores,
                   ignoring: Sequence[Chooser], trained_with_logs: Sequence[Chooser] | None) -> list[dict]:
    """The rows of one draw (or of new_models_dir): see the module docstring. `routers`: stage -> the runs trained
    without the new models; `chosen`: the validated commitment's chosen row on the known models; `ignoring`: its
    test choices."""
    lam, gamma = config.reward.lam, config.reward.gamma
    cards = [data.pool.cards[data.pool.index(m)] for m in held]
    new = set(held)

    def row(name: str, choosers: Sequence[Chooser]) -> dict:
        return _row(name, choosers, data, reference, lam, gamma)

    def with_cards(name: str, choosers: Sequence[Chooser], base: dict) -> dict:
        return _with_cards(row(name, choosers), choosers, base, new, data)

    exp = config.experiment
    mtrouter = MTRouter.fit(known.episodes["train"], known.pool, store, lam=lam, max_tokens=config.max_state_tokens,
                            epochs=exp.mtrouter_epochs, seed=config.seed, c_ref=data.c_ref)
    wide = mtrouter.with_new_models(cards)
    # Each chosen once per task: the rows and the shares below ask again.
    mt_known = [functools.cache(lambda t: mtrouter.act(known.tasks[t], (), known.available[t], None)[0])]
    mt_cards = [functools.cache(lambda t: wide.act(data.tasks[t], (), data.available[t], None)[0])]
    rivet, mt = row("RIVET ignoring the new models", ignoring), row("MTRouter-style ignoring them", mt_known)
    found = [rivet, with_cards("RIVET with their cards", card_commitment(
        routers[chosen["stage"]], cards, data, known, store, chosen["floor"], chosen["shrinkage_k"], lam, gamma,
        scores), rivet)]
    if trained_with_logs is not None:
        found.append(with_cards("RIVET trained with their logs", trained_with_logs, rivet))
    found += [mt, with_cards("MTRouter-style with their cards", mt_cards, mt),
              row("Best fixed per family (train, known models)", [family_choice(known, lam, gamma)])]
    return [{"draw": draw, "new_models": ", ".join(held), **r} for r in found]


def mean_rows(rows: Sequence[dict]) -> list[dict]:
    """One row per router: the mean over the draws (each draw's rows as given)."""
    names = list(dict.fromkeys(r["router"] for r in rows))
    out = []
    for name in names:
        mine = [r for r in rows if r["router"] == name]
        keys = [k for k in mine[0] if isinstance(mine[0][k], float)]
        out.append({"draw": f"mean of {len(mine)}", "new_models": "", "router": name,
                    **{k: float(np.nanmean([r[k] for r in mine])) if any(np.isfinite(r[k]) for r in mine)
                       else float("nan") for k in keys}})
    return out


def draw_dir(workdir: Path, draw: int) -> Path:
    return workdir / "new_models" / f"draw_{draw}"
