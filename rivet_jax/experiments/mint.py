"""RIVET on the real MINT logs, offline, evaluated exactly (`python -m launch.mint`).

Every model ran every task it has logs for (the six-model pool: all of them; the large pool: all but a few subsets
for three models, which are unavailable there), so for a test task the outcome and cost of committing to any
available model are logged facts (`rivet_jax.experiments.mint_data`). The experiments:

  committed_routing   each router picks a model from the first state (the task alone); that model's logged episode
                      gives the outcome and cost. Fixed models, random (expectation), the per-task oracle (the
                      cheapest of the models with the task's best outcome), the best fixed model of the training
                      tasks and the best fixed model per task family (subset), kNN, the MTRouter-style
                      estimator, RIVET (its TD router's first choice), RIVET's committed value (the same runs' MC
                      stage), RIVET's validated commitment (below) and its ablations; cost relative to the reference
                      model (gpt-4-0613). See NOTES for what this protocol can and cannot show.
  commitment_selection  the validated commitment: each run's first-state scores recentred on every model's mean
                      logged return over the training tasks (or, with the "family" floor, over those of the task's
                      family), the task-specific part shrunk by k; the stage (TD or MC), floor and k with the best
                      mean validation J over seeds are the ones scored on test.
  value_prediction    held-out (test tasks) squared error of Q_route(s_t, m_t) against the realised return G_t over
                      every logged turn, for each beta and the zero-response ablation, mean and 95% interval over
                      seeds: Theorem 4.2 on real data, reported whichever way it comes out.
  lambda_sweep        committed routing of RIVET (TD, MC stage, validated commitment) trained at each lambda, against
                      the fixed models, the oracle and the baselines (the accuracy-cost plot, with the fixed models'
                      Pareto frontier).
  by_family, card_profile  where the routers win and lose: per task family, and where their choices go by card field.
  new_models          models routed to from their cards alone (rivet_jax/experiments/mint_new_models.py).

Layout: <workdir>/corpus/ (converted logs, train split, splits.json), <workdir>/runs/<variant>/seed_<s>/ (MC + TD),
report.md, results.json, results/.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, Sequence

import ml_collections
import numpy as np
from absl import logging
from matplotlib.figure import Figure

from rivet_jax import plots
from rivet_jax.baselines.best_fixed import BEST_FIXED
from rivet_jax.baselines.mtrouter import MTRouter
from rivet_jax.baselines.single_turn import KNNRouter
from rivet_jax.encoders import embedding_store, make_encoder
from rivet_jax.experiments import traces
from rivet_jax.experiments.mint_data import (MintData, by_family, card_groups, choice_profile, committed,
                                             expected_random, family_choice, fixed_choice, fixed_ranking,
                                             oracle_choice, paired_intervals)
from rivet_jax.experiments.mint_new_models import NOTES as NEW_MODEL_NOTES, TABLES as NEW_MODEL_TABLES, new_models
from rivet_jax.experiments.mint_routers import (load_routers, load_stages, router_choice, train_runs,
                                                validated_commitment, value_error)
from rivet_jax.experiments.report import (grouped_tables, plot_stage_preferences, post_error_section,
                                          stage_section, write_outputs)
from rivet_jax.progress import Phases

# Variants trained for every seed: name -> config overrides.
RIVET, NO_RIVE, NO_RESPONSE = "RIVET", "RIVET w/o RIVE", "RIVET w/o response"
# The same runs' MC-stage checkpoints: on logs of fixed-model episodes the MC target is the return of committing to
# the called model, the value committed routing scores (TD's Q_route values calling it first, then routing freely).
COMMITTED = "RIVET (committed value: MC stage)"
# Both stages' scores recentred on the per-model floor and shrunk toward it, stage and shrinkage chosen on validation.
VALIDATED = "RIVET (validated commitment)"
# The best fixed model of each task family (subset), chosen on the training tasks: a router must beat routing by
# task family, not only one model for every task.
BEST_PER_FAMILY = "Best fixed per family (train)"
# The baselines drawn beside the lambda sweep, at the configured lambda.
SWEEP_POINTS = (BEST_FIXED, BEST_PER_FAMILY, "Weighted kNN", "MTRouter-style")
# Whose choices the card-field diagnostics follow.
PROFILED = (VALIDATED, BEST_PER_FAMILY, "oracle (per task)")
# t quantiles (0.975) for 95% intervals over few seeds.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def _variants(betas: Sequence[float]) -> dict[str, dict]:
    variants = {f"beta={b:g}": {"loss.beta": float(b)} for b in betas}
    variants["zero response (beta=1)"] = {"loss.beta": 1.0, "loss.zero_response": True}
    return variants


def _interval(values: Sequence[float]) -> dict:
    values = np.asarray(values, np.float64)
    n = len(values)
    half = _T975.get(n - 1, 1.96) * values.std(ddof=1) / np.sqrt(n) if n > 1 else float("nan")
    return {"mse": float(values.mean()), "ci95_low": float(values.mean() - half),
            "ci95_high": float(values.mean() + half), "seeds": n, "per_seed": [float(v) for v in values]}


# -------------------------------------------------------------------------------------------------- report


def pareto_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (cost, accuracy) points no other point beats on both (cheaper or as cheap, and more accurate), by cost."""
    front, best = [], -np.inf
    for cost, accuracy in sorted(points, key=lambda p: (p[0], -p[1])):
        if accuracy > best:
            front.append((cost, accuracy))
            best = accuracy
    return front


def _plot_sweep(rows: list[dict], path: Path) -> None:
    """Accuracy against cost: every fixed model a grey point (names on their Pareto frontier, drawn as a line), each
    RIVET router's lambda sweep a curve (its frontier), the other routers at the configured lambda as points."""
    fig = Figure(figsize=(8, 5.5))
    ax = fig.subplots()
    fixed = [r for r in rows if r["router"].startswith("fixed:")]
    ax.scatter([r["cost_usd"] for r in fixed], [r["accuracy"] for r in fixed], s=12, color="0.6",
               label=f"fixed models ({len(fixed)})")
    front = pareto_front([(r["cost_usd"], r["accuracy"]) for r in fixed])
    ax.plot(*zip(*front), "-", color="0.6", linewidth=0.8, label="fixed models' frontier")
    for r in fixed:
        if (r["cost_usd"], r["accuracy"]) in front:
            ax.annotate(r["router"][len("fixed:"):], (r["cost_usd"], r["accuracy"]), fontsize=6, color="0.4",
                        xytext=(3, -8), textcoords="offset points")
    for name, style in ((RIVET, "o-"), (COMMITTED, "D--"), (VALIDATED, "s:")):
        swept = sorted((r for r in rows if r["router"] == name), key=lambda r: r["cost_usd"])
        ax.plot([r["cost_usd"] for r in swept], [r["accuracy"] for r in swept], style, label=f"{name} (lambda sweep)")
        for r in swept:
            ax.annotate(f"{r['lambda']:g}", (r["cost_usd"], r["accuracy"]), fontsize=7, xytext=(3, -9),
                        textcoords="offset points")
    for r in rows:
        if r["router"] not in (RIVET, COMMITTED, VALIDATED) and not r["router"].startswith("fixed:"):
            ax.scatter(r["cost_usd"], r["accuracy"], marker="*" if r["router"].startswith("oracle") else "x",
                       label=r["router"])
    ax.set_xscale("log")
    ax.set_xlabel("total test cost ($, log scale)")
    ax.set_ylabel("test accuracy (committed routing)")
    ax.legend(loc="lower right", fontsize=7)
    plots.save_figure(fig, path)


def _selection_table(rows: list[dict]) -> str:
    """One line per (lambda, stage, floor), one column per k; the chosen cell in bold. results.json keeps the long
    rows."""
    ks = list(dict.fromkeys(r["shrinkage_k"] for r in rows))
    lines = ["| lambda | stage | floor | runs | " + " | ".join(f"k = {k:g}" for k in ks) + " |",
             "|" + "---|" * (4 + len(ks))]
    for lam, stage, floor in dict.fromkeys((r["lambda"], r["stage"], r["floor"]) for r in rows):
        cells = {r["shrinkage_k"]: r for r in rows if (r["lambda"], r["stage"], r["floor"]) == (lam, stage, floor)}
        runs = next(iter(cells.values()))["seeds"]
        shown = {k: f"{r['validation_return']:.3f}" for k, r in cells.items()}
        shown = {k: f"**{v}**" if cells[k]["chosen"] else v for k, v in shown.items()}
        lines.append(f"| {lam:g} | {stage} | {floor} | {runs} | " + " | ".join(shown.get(k, "") for k in ks) + " |")
    return "\n".join(lines)


NOTES = {
    "committed_routing": (
        "What committed routing can show: which model a router would commit to for a whole episode from the task "
        "alone, scored exactly by that model's logged episode. What it cannot show: anything multi-turn. The logs "
        "hold fixed-model episodes only, so a switch has no logged outcome, and RIVET's per-turn benefit (Table 1 "
        "on RouteSim) is out of reach here. It also scores RIVET's deployed TD router on a question that router "
        "was not asked: its Q_route(s_0, m) is the value of calling m first and then routing optimally, which at "
        "small lambda is nearly the same for every first model (switching after a weak first turn costs little), so "
        "its first choice is close to arbitrary for commitment. The value of committing to m is what the MC stage "
        "regresses on from these fixed-model logs: `RIVET (committed value: MC stage)` is that estimate, from the "
        "same runs. Neither need beat always calling the strongest model when one model dominates and 140 training "
        "tasks leave per-task predictions noisier than its margin. `RIVET (validated commitment)` puts each "
        "model's scores at its mean logged return over the training tasks (the best-fixed floor's numbers) and "
        "shrinks the per-task differences toward it by k; the stage and k are chosen on the validation tasks "
        "(see the selection table), so where validation finds no per-task signal it commits to the best fixed "
        "model, and says so."),
}

TABLES = {
    "committed_routing": ("Committed routing on the MINT test tasks (cost relative to the reference model)",
                          [("router", "router", -1), ("encoder", "encoder", -1), ("accuracy", "accuracy", 3),
                           ("cost_usd", "cost ($)", 3), ("cost_rel", "cost rel.", 3), ("return", "J", 3)]),
    "commitment_selection": ("Validated commitment: mean validation J over the runs for each stage, floor and "
                             "shrinkage k (k = 0: the best fixed model, or per family with the family floor; the "
                             "chosen one, in bold, is scored on test)",
                             lambda rows: _selection_table(rows)),
    "paired_gains": ("RIVET's validated commitment against each router on the test tasks: J with a 95% bootstrap "
                     "interval over tasks, and the paired gain J(validated) - J(router) on the same resamples",
                     [("router", "router", -1), ("return", "J", 3), ("ci95_low", "95% low", 3),
                      ("ci95_high", "95% high", 3), ("gain", "gain", 3), ("gain_low", "gain low", 3),
                      ("gain_high", "gain high", 3), ("tasks", "tasks", -1)]),
    "by_family": ("Committed routing per task family (subset) on the test tasks (mean over runs)",
                  [("family", "family", -1), ("router", "router", -1), ("tasks", "tasks", -1),
                   ("accuracy", "accuracy", 3), ("cost_usd", "cost ($)", 3), ("return", "J", 3)]),
    "card_profile": ("Where the test choices go, by card field: each router's share of its first choices on models "
                     "with that value, and their accuracy there (RIVET's validated commitment, the best fixed model "
                     "per family, the per-task oracle)",
                     grouped_tables("grouping", [("value", "value", -1), ("models", "models", -1)] + [
                         (f"{name}: {what}", f"{short}: {what}", 3) for name, short in zip(
                             PROFILED, ("validated", "per family", "oracle")) for what in ("share", "accuracy")])),
    "value_prediction": ("Value-prediction error on held-out tasks: MSE of Q_route(s_t, m_t) vs G_t (95% interval "
                         "over seeds)",
                         [("variant", "variant", -1), ("encoder", "encoder", -1), ("mse", "MSE", 4),
                          ("ci95_low", "95% low", 4), ("ci95_high", "95% high", 4), ("seeds", "seeds", -1)]),
    "lambda_sweep": ("Committed routing across lambda (RIVET: TD, MC stage, validated commitment) with the fixed "
                     "models, the oracle and the baselines at the configured lambda",
                     [("router", "router", -1), ("lambda", "lambda", -1), ("accuracy", "accuracy", 3),
                      ("cost_usd", "cost ($)", 3), ("cost_rel", "cost rel.", 3)]),
}


# ---------------------------------------------------------------------------------------------------- main


def run_mint(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
    workdir = Path(workdir)
    phases = Phases()

    def log(message: str) -> None:
        logging.info("%s (%s)", message, phases.mark(message))

    log("[1/5] convert the MINT logs and split them by the manifest")
    data = MintData(config, workdir)
    log(f"  {sum(len(v) for v in data.episodes.values())} episodes; train {len(data.split['train'])}, validation "
        f"{len(data.split['validation'])}, test {len(data.split['test'])} tasks; c_ref {data.c_ref:.6f}")
    exp = config.experiment
    ref_model = exp.reference_model if exp.reference_model in data.pool else data.pool.names[0]
    lam, gamma = config.reward.lam, config.reward.gamma
    reference = committed(data, lambda t: ref_model, 1.0, lam, gamma)["cost_usd"]

    log("[2/5] train RIVET variants (MC + TD) for every seed")
    variants = _variants(exp.betas)
    run_dirs = train_runs(config, data, workdir, variants, exp.seeds)
    store = embedding_store(config, make_encoder(config.encoder), workdir)
    routers = {name: load_routers(dirs, encoder=store.encoder) for name, dirs in run_dirs.items()}
    encoder_name = config.encoder.name
    hashing_routers = []
    if config.compare_hashing:
        hashing = {"encoder.name": "hashing", "encoder.dim": 1024}
        hashing_runs = train_runs(config, data, workdir, {"hashing beta=1": {**hashing, "loss.beta": 1.0}}, exp.seeds)
        hashing_routers = load_routers(hashing_runs["hashing beta=1"])

    log("[3/5] fit the baselines and evaluate")
    train_eps = data.episodes["train"]
    knn = KNNRouter.fit(train_eps, data.pool, store, config.reward.lam, data.c_ref, k=exp.knn_k)
    mtrouter = MTRouter.fit(train_eps, data.pool, store, lam=config.reward.lam, max_tokens=config.max_state_tokens,
                            epochs=exp.mtrouter_epochs, seed=config.seed, c_ref=data.c_ref)
    ranking = fixed_ranking(data, lam, gamma)
    choosers: dict[str, list[Callable[[str], str]]] = {}  # router -> its choice per seed, for the trace analyses
    for m in data.pool.names:  # where m is unavailable: the best fixed model of the training tasks that is
        choosers[f"fixed:{m}"] = [fixed_choice(data, m, ranking)]
    committed_rows = [{"router": name, "encoder": "", **committed(data, choose, reference, lam, gamma)}
                      for name, (choose,) in choosers.items()]
    committed_rows.append({"router": "random (expected)", "encoder": "",
                           **expected_random(data, reference, lam, gamma)})
    # Each chosen once per task: the tables, paired intervals and traces below all ask again.
    choosers["oracle (per task)"] = [functools.cache(lambda t: oracle_choice(data, t))]
    choosers["Weighted kNN"] = [functools.cache(lambda t: knn.choose(data.tasks[t], data.available[t]))]
    choosers["MTRouter-style"] = [functools.cache(
        lambda t: mtrouter.act(data.tasks[t], (), data.available[t], None)[0])]
    choosers[BEST_FIXED] = [fixed_choice(data, ranking[0], ranking)]
    choosers[BEST_PER_FAMILY] = [family_choice(data, lam, gamma)]
    committed_rows += [{"router": name, "encoder": encoder_name if name in ("Weighted kNN", "MTRouter-style") else "",
                        **committed(data, choosers[name][0], reference, lam, gamma)}
                       for name in ("oracle (per task)", BEST_FIXED, BEST_PER_FAMILY, "Weighted kNN",
                                    "MTRouter-style")]
    named = {RIVET: routers["beta=1"], COMMITTED: load_routers(run_dirs["beta=1"], "mc", store.encoder),
             NO_RIVE: routers["beta=0"], NO_RESPONSE: routers["zero response (beta=1)"]}
    if hashing_routers:
        named["RIVET (hashing)"] = hashing_routers
    stores = {encoder_name: store}
    if hashing_routers:
        stores["hashing"] = embedding_store(config, hashing_routers[0].encoder, workdir)
    for name, seeds in named.items():
        encoder = "hashing" if "hashing" in name else encoder_name
        choosers[name] = [router_choice(r, data, stores[encoder]) for r in seeds]
    choosers[VALIDATED], selection_rows = validated_commitment(
        {"td": named[RIVET], "mc": named[COMMITTED]}, data, store, lam, gamma, exp.shrinkage, exp.floors)
    selection_rows = [{"lambda": float(lam), "seeds": len(named[RIVET]), **r} for r in selection_rows]
    for name in (*named, VALIDATED):
        per_seed = [committed(data, choose, reference, lam, gamma) for choose in choosers[name]]
        committed_rows.append({"router": name, "encoder": "hashing" if "hashing" in name else encoder_name,
                               **{k: float(np.mean([p[k] for p in per_seed])) for k in per_seed[0]},
                               "accuracy_sd": float(np.std([p["accuracy"] for p in per_seed])),
                               "seeds": len(per_seed)})
    test_eps = data.episodes["test"]
    value_rows = [{"variant": name, "encoder": encoder_name,
                   **_interval([value_error(r, test_eps, config.reward.gamma, store) for r in seeds])}
                  for name, seeds in routers.items()]
    if hashing_routers:
        value_rows.append({"variant": "beta=1", "encoder": "hashing", **_interval(
            [value_error(r, test_eps, config.reward.gamma, stores["hashing"]) for r in hashing_routers])})

    log("[4/5] lambda sweep of committed routing")
    sweep_rows = []
    swept = train_runs(config, data, workdir, {f"lambda={x:g}": {"reward.lam": float(x)} for x in exp.lambdas
                                           if float(x) != float(lam)}, exp.sweep_seeds)
    for sweep_lam in exp.lambdas:
        dirs = (run_dirs["beta=1"][:len(exp.sweep_seeds)] if float(sweep_lam) == float(lam)
                else swept[f"lambda={sweep_lam:g}"])
        stages = load_stages(dirs, store.encoder)
        validated, rows = validated_commitment(stages, data, store, float(sweep_lam), gamma, exp.shrinkage,
                                               exp.floors)
        if float(sweep_lam) != float(lam):
            selection_rows += [{"lambda": float(sweep_lam), "seeds": len(dirs), **r} for r in rows]
        for name, fns in ((RIVET, [router_choice(r, data, store) for r in stages["td"]]),
                          (COMMITTED, [router_choice(r, data, store) for r in stages["mc"]]), (VALIDATED, validated)):
            per_seed = [committed(data, choose, reference, float(sweep_lam), gamma) for choose in fns]
            sweep_rows.append({"router": name, "lambda": float(sweep_lam),
                               **{k: float(np.mean([p[k] for p in per_seed])) for k in per_seed[0]}})
    sweep_rows += [{**r, "lambda": ""} for r in committed_rows
                   if r["router"].startswith(("fixed:", "oracle")) or r["router"] in SWEEP_POINTS]

    card_experiments = new_models(config, data, workdir, store, reference, choosers[VALIDATED],
                                  {"td": named[RIVET], "mc": named[COMMITTED]},
                                  next(r for r in selection_rows if r["chosen"] and r["lambda"] == float(lam)), log)

    # A call that failed before any answer has no turns to trace.
    picks = {name: [(t, choose(t)) for choose in fns for t in data.split["test"]] for name, fns in choosers.items()}
    committed_traces = {name: [data.logged[key] for key in keys if key in data.logged] for name, keys in picks.items()}
    compared = {name: choosers[name] for name in (VALIDATED, BEST_PER_FAMILY, BEST_FIXED, "Weighted kNN",
                                                  "MTRouter-style", RIVET, COMMITTED, "oracle (per task)")}
    experiments = {"committed_routing": committed_rows, "commitment_selection": selection_rows,
                   "paired_gains": paired_intervals(data, compared, VALIDATED, lam, gamma, seed=config.seed),
                   "by_family": by_family(data, compared, lam, gamma),
                   "card_profile": choice_profile(data, {name: compared[name] for name in PROFILED}, card_groups(data),
                                                  lam, gamma),
                   "value_prediction": value_rows, "lambda_sweep": sweep_rows,
                   "post_error": [{"router": name, **{k: v for k, v in traces.post_error(eps).items()
                                                      if k != "by_class"}}
                                  for name, eps in committed_traces.items()],
                   "stage_preferences": [{"router": name, "stage": stage, **shares}
                                         for name, eps in committed_traces.items()
                                         for stage, shares in traces.stage_preferences(eps, data.pool.names).items()]}
    experiments.update(card_experiments)
    meta = {"seconds": phases.seconds(), "phases": phases.record, "c_ref": data.c_ref, "reference_model": ref_model,
            "seeds": list(exp.seeds), "notes": data.notes,
            "summary": (f"MINT logs ({len(data.pool)} models, {len(data.tasks)} tasks), split train "
                        f"{len(data.split['train'])} / validation {len(data.split['validation'])} / test "
                        f"{len(data.split['test'])}; encoder {encoder_name} (max state tokens "
                        f"{config.max_state_tokens}); lambda {config.reward.lam}; c_ref {data.c_ref:.6f}. RIVET rows: "
                        f"mean over seeds {list(exp.seeds)}. Offline only: committed routing is exact on these "
                        f"logs because every model ran every task.")}
    traced = ("the logged episodes each committed choice selects on the test tasks; a fixed model's are its logs as "
              "they are")
    tables = {**TABLES, **NEW_MODEL_TABLES, "post_error": post_error_section(traced),
              "stage_preferences": stage_section(traced, data.pool.names)}
    write_outputs(workdir, experiments, meta, "RIVET on the MINT logs", tables=tables,
                  plots={"lambda_sweep": _plot_sweep, "stage_preferences": plot_stage_preferences},
                  notes={**NOTES, **NEW_MODEL_NOTES})
    log(f"report written to {workdir / 'report.md'}")
    return {"experiments": experiments, "meta": meta}

