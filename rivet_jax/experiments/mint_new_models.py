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
from rivet_jax.data.cards import CARD_INPUTS, valid_card_inputs
from rivet_jax.data.converters.mint import convert_mint
from rivet_jax.data.schema import ModelCard, read_model_cards
from rivet_jax.encoders import EmbeddingStore
from rivet_jax.card_prior import field_errors
from rivet_jax.experiments.mint_data import (MintData, committed, family_choice, family_values, prior_family_choice,
                                             shrunk, task_centres, task_floors)
from rivet_jax.experiments.mint_routers import (first_state_scores, load_stages, train_runs, validated_commitment,
                                                value_error)
from rivet_jax.router import Router

__all__ = ["held_out_draws", "card_floor", "card_commitment", "new_model_rows", "ablation_variants",
           "card_ablation_rows", "new_models", "NOTES", "TABLES"]

Chooser = Callable[[str], str]
TRAINED = "RIVET"  # each draw's runs (beta = 1)
EVERY_INPUT = "every card input"  # the card ablation's reference: the draw's first run, reading the whole card
NO_CARD = "no card input"  # the ablation without any card input: every model looks the same to the projector


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
                    store: EmbeddingStore, kind: str, k: float, lam: float, gamma: float) -> list[Chooser]:
    """Each router's test choices over its pool plus `cards` (`data`: the tables with the new models' logs, for
    availability and scoring), with the floor kind and shrinkage k chosen on the known models, the new models'
    floors from `card_floor`."""
    tasks = data.split["test"]
    choices = []
    for router in routers:
        wide = router.with_new_models(cards)
        names = wide.pool.names
        train, test = first_state_scores(wide, data, store, "train"), first_state_scores(wide, data, store, "test")
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
                   chosen: dict, store: EmbeddingStore, config, reference: float, ignoring: Sequence[Chooser],
                   trained_with_logs: Sequence[Chooser] | None) -> list[dict]:
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
        routers[chosen["stage"]], cards, data, known, store, chosen["floor"], chosen["shrinkage_k"], lam, gamma),
        rivet)]
    if trained_with_logs is not None:
        found.append(with_cards("RIVET trained with their logs", trained_with_logs, rivet))
    by_family = row("Best fixed per family (train, known models)", [family_choice(known, lam, gamma)])
    prior_choice, _ = prior_family_choice(data, known, lam, gamma, card_embeddings(data.pool.cards, store))
    found += [mt, with_cards("MTRouter-style with their cards", mt_cards, mt), by_family,
              with_cards("Best fixed per family + card prior", [prior_choice], by_family)]
    return [{"draw": draw, "new_models": ", ".join(held), **r} for r in found]


def card_embeddings(cards: Sequence[ModelCard], store: EmbeddingStore) -> np.ndarray:
    """(M, D) the cards' description embeddings by the experiment's encoder (the card prior's description field)."""
    return np.asarray(store.encoder.encode([card.description for card in cards]), np.float64)


def card_prior_rows(data: MintData, store: EmbeddingStore, lam: float, gamma: float) -> list[dict]:
    """The card prior's leave-one-model-out error of J per card field (`card_prior.field_errors`: the success part
    on that field alone, the cost part on the prices), over every model of the pool, per task family and their
    mean."""
    families, success, cost = family_values(data, data, lam, gamma)
    errors = field_errors(data.pool.cards, success, cost, families, card_embeddings(data.pool.cards, store))
    return [{"field": field, "mean": float(np.nanmean(e)), **{f: float(v) for f, v in zip(families, e)}}
            for field, e in errors.items()]


def mean_rows(rows: Sequence[dict], key: str = "router") -> list[dict]:
    """One row per router (or other `key`): the mean over the draws (each draw's rows as given)."""
    names = list(dict.fromkeys(r[key] for r in rows))
    out = []
    for name in names:
        mine = [r for r in rows if r[key] == name]
        keys = [k for k in mine[0] if isinstance(mine[0][k], float)]
        out.append({"draw": f"mean of {len(mine)}", "new_models": "", key: name,
                    **{k: float(np.nanmean([r[k] for r in mine])) if any(np.isfinite(r[k]) for r in mine)
                       else float("nan") for k in keys}})
    return out


def draw_dir(workdir: Path, draw: int) -> Path:
    return workdir / "new_models" / f"draw_{draw}"


# ------------------------------------------------------------------------------------------- card ablation


def ablation_variants(dropped: Sequence[str]) -> dict[str, dict]:
    """name -> config overrides: for each card input group in `dropped`, the network without it ("w/o prices"), and
    the network without any card input (`NO_CARD`: only the floors tell models apart)."""
    if not valid_card_inputs(dropped):
        raise ValueError(f"experiment.new_models.card_ablation must name distinct groups among "
                         f"{', '.join(CARD_INPUTS)}; got {dropped!r}")
    variants = {f"w/o {group}": {"model.card_inputs": tuple(g for g in CARD_INPUTS if g != group)}
                for group in dropped}
    return {**variants, NO_CARD: {"model.card_inputs": ()}} if variants else {}


def card_ablation_rows(draw: str, held: Sequence[str], data: MintData, known: MintData,
                       variants: dict[str, dict[str, list[Router]]], store: EmbeddingStore, config, reference: float
                       ) -> list[dict]:
    """One row per variant (name -> its runs' routers per stage, trained without the `held` models): the held-out
    models' value error from their cards, the known models' value error, and committed routing with their cards.

    Value errors: MSE of the MC stage's Q_route(s_t, m_t) against the realised return G_t over every turn of the
    test tasks' logged episodes (the MC stage regresses exactly G_t on these fixed-model logs), of the held-out
    models (scored from their cards) and of the known ones. Routing: each variant's own validated commitment
    (stage, floor, k chosen on validation among the known models), then with the new cards (`card_commitment`)."""
    lam, gamma, exp = config.reward.lam, config.reward.gamma, config.experiment
    cards = [data.pool.cards[data.pool.index(m)] for m in held]
    new_test = [data.logged[(t, m)] for t in data.split["test"] for m in held if (t, m) in data.logged]
    rows = []
    for name, stages in variants.items():
        ignoring, selection = validated_commitment(stages, known, store, lam, gamma, exp.shrinkage, exp.floors)
        chosen = next(r for r in selection if r["chosen"])
        choosers = card_commitment(stages[chosen["stage"]], cards, data, known, store, chosen["floor"],
                                   chosen["shrinkage_k"], lam, gamma)
        base = _row(name, ignoring, data, reference, lam, gamma)
        found = _with_cards(_row(name, choosers, data, reference, lam, gamma), choosers, base, set(held), data)
        rows.append({"draw": draw, "new_models": ", ".join(held), "variant": name, "runs": len(stages["mc"]),
                     "chosen": f"{chosen['stage']}, {chosen['floor']}, k = {chosen['shrinkage_k']:g}",
                     "new_mse": float(np.mean([value_error(r.with_new_models(cards), new_test, gamma, store)
                                               for r in stages["mc"]])),
                     "known_mse": float(np.mean([value_error(r, known.episodes["test"], gamma, store)
                                                 for r in stages["mc"]])),
                     "return_ignoring": base["return"],
                     **{k: found[k] for k in ("accuracy", "cost_usd", "return", "new_share", "new_success",
                                              "gain_vs_ignoring")}})
    return rows


# ---------------------------------------------------------------------------------------------------- main


def new_models(config, data: MintData, workdir: Path, store: EmbeddingStore, reference: float,
               validated: Sequence[Chooser], stages: dict[str, list[Router]], chosen: dict,
               log: Callable[[str], None]) -> dict[str, list[dict]]:
    """Leave-k-models-out draws (with the card ablation where configured) and the models of
    `config.new_models_dir`, routed to from their cards: {"new_models": each draw's rows then their means,
    "card_ablation": the same}, the tables that have rows. `validated`, `stages`, `chosen`: the main runs'
    validated commitment (its test choices), their routers per stage and the chosen selection row."""
    exp, lam, gamma = config.experiment, config.reward.lam, config.reward.gamma
    plan = exp.new_models
    new_dir = config.get("new_models_dir") or ""
    ablated = ablation_variants(plan.get("card_ablation", ()))
    log(f"[5/5] new models from their cards: {plan.draws} leave-{plan.k}-models-out draw(s)"
        + (f" with {len(ablated)} card ablation(s)" if ablated and plan.draws else "")
        + (f", the models of {new_dir}" if new_dir else ""))
    rows, ablation = [], []
    for d, held in enumerate(held_out_draws(data.pool.names, plan.k, plan.draws, plan.seed)):
        log(f"  draw {d + 1}/{plan.draws}: trained without {', '.join(held)}")
        known = data.without(held, draw_dir(workdir, d) / "corpus")
        dirs = train_runs(config, known, draw_dir(workdir, d), {TRAINED: {"loss.beta": 1.0}}, exp.seeds)[TRAINED]
        own = load_stages(dirs, store.encoder)
        ignoring, selection = validated_commitment(own, known, store, lam, gamma, exp.shrinkage, exp.floors)
        rows += new_model_rows(str(d + 1), held, data, known, own, next(r for r in selection if r["chosen"]), store,
                               config, reference, ignoring, validated)
        if ablated:  # one seed each (the first), beside the same seed's run reading every input
            log(f"  draw {d + 1}: card ablation ({', '.join(ablated)}), seed {exp.seeds[0]}")
            runs = train_runs(config, known, draw_dir(workdir, d), ablated, exp.seeds[:1])
            variants = {EVERY_INPUT: {stage: routers[:1] for stage, routers in own.items()},
                        **{name: load_stages(run, store.encoder) for name, run in runs.items()}}
            ablation += card_ablation_rows(str(d + 1), held, data, known, variants, store, config, reference)
    if plan.draws > 1:
        rows += mean_rows(rows)
        ablation += mean_rows(ablation, key="variant")
    if new_dir:
        pool = read_model_cards(Path(new_dir) / "model_cards.json")
        wider = data.with_models(pool, convert_mint(Path(new_dir), pool))
        rows += new_model_rows(f"{new_dir}", pool.names, wider, data, stages, chosen, store, config, reference,
                               validated, None)
    prior = card_prior_rows(data, store, lam, gamma) if plan.draws or new_dir else []
    return {name: found for name, found in (("new_models", rows), ("card_ablation", ablation), ("card_prior", prior))
            if found}


NOTES = {
    "new_models": (
        "Nothing here is chosen with the new models' logs: each draw's runs train on the other models' episodes; "
        "the validated commitment's stage and k are chosen on validation among the known models (the row "
        "'ignoring the new models'); a new model's floor is the router's own mean score for it over the training "
        "tasks, corrected by its mean error on the known models' logged floors. Their logs only score the choices. "
        "'trained with their logs' is the main runs' validated commitment (the same test tasks). 'Best fixed per "
        "family + card prior': on each family, a new model replaces the family's best known model only where its "
        "card prior (rivet_jax/card_prior.py, fitted on the known models) minus the prior's leave-one-model-out "
        "error beats that model's training J."),
    "card_prior": (
        "The card prior's error: for every model of the pool, its J per family predicted from its card by a "
        "regression fitted on the other models (success part on the field named, cost part on the prices), "
        "against its training J; root mean squared over the models. 'none': the other models' mean success. A "
        "field informs the prior where its error is below 'none'; a new model is chosen from its card only where "
        "the prediction beats the known best by more than the 'all' error of its family."),
    "card_ablation": (
        "Each variant is trained on the same draw's known models with one card input group left out (it enters as "
        "zeros, read as unknown), one seed (the experiment's first; 'every card input' is that seed's run of the "
        "draw); 'no card input' reads no card at all, so its scores cannot tell models apart beyond the floors. "
        "A card input carries information where leaving it out raises the held-out models' value error or lowers "
        "the J gained with their cards. Size, family and open weights are not fields of the card's x_m: they reach "
        "the projector through the description's embedding only."),
}

TABLES = {
    "new_models": ("New models from their cards: each leave-k-models-out draw (then the mean over draws) and the "
                   "models of new_models_dir, routed to over the whole pool on the test tasks; `new share`: the "
                   "first choices that go to new models, `new success`: their accuracy there, `gain`: J against the "
                   "same router ignoring them",
                   [("draw", "draw", -1), ("new_models", "new models", -1), ("router", "router", -1),
                    ("accuracy", "accuracy", 3), ("cost_usd", "cost ($)", 3), ("return", "J", 3),
                    ("new_share", "new share", 3), ("new_success", "new success", 3),
                    ("gain_vs_ignoring", "gain", 3)]),
    "card_prior": ("The card prior's leave-one-model-out error of J (training tasks, per task family and their "
                   "mean), by the card field its success part reads",
                   [("field", "field", -1), ("mean", "mean", 3)]),
    "card_ablation": ("Card inputs by ablation on the leave-k-models-out draws (then the mean over draws): the "
                      "held-out models' value error from their cards (`new MSE`, MC stage, test episodes), the "
                      "known models' (`known MSE`), and committed routing with their cards at each variant's own "
                      "validated choice (`J ignoring`: without them; `gain`: J with them minus J ignoring them)",
                      [("draw", "draw", -1), ("variant", "variant", -1), ("chosen", "stage, floor, k", -1),
                       ("new_mse", "new MSE", 4), ("known_mse", "known MSE", 4), ("return_ignoring", "J ignoring", 3),
                       ("return", "J", 3), ("gain_vs_ignoring", "gain", 3), ("new_share", "new share", 3),
                       ("new_success", "new success", 3)]),
}
