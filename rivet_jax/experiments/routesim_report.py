"""The RouteSim reproduction's report: each experiment's table columns, figure and note (`launch.reproduce`).

`TABLES[name]` = (heading, columns or a function of the rows), `PLOTS[name]` = its figure, `REPORT_ORDER` the
sections' order, `report_notes` the text that squares a section's numbers with the others'.
"""

from __future__ import annotations

from typing import Sequence

import ml_collections

from rivet_jax.experiments import diagnostics, frontier, prompt_cache, report, selection
from rivet_jax.experiments.common import ONE_RUN, pessimistic
from rivet_jax.runs import MAIN

_MAIN_COLUMNS = [("router", "router", -1), ("split", "split", -1), ("accuracy", "accuracy", 3),
                 ("cost_usd", "cost ($)", 3), ("cost_rel", "cost rel.", 3), ("regret", "regret (J)", 3),
                 ("turns", "turns", 2), ("switch_rate", "switch rate", 2)]


def _split_caption(split: str, rows: list[dict]) -> str:
    """Table 1's line above a split's table: in distribution or OOD, and the fixed model its cost is relative to."""
    reference = next((r["router"] for r in rows if r["router"].startswith("fixed:") and abs(r["cost_rel"] - 1) < 1e-9),
                     "its most accurate fixed model")
    return (f"**{split}** ({'OOD' if split.startswith('ood') else 'in distribution'}; cost rel. to {reference}, the "
            f"split's most accurate fixed model)")


def _frontier_table(rows: list[dict]) -> str:
    """The scatter's table: the oracle frontier only (its other points are Table 1's rows, tabled there)."""
    return report.markdown_table([r for r in rows if r["router"] == report.FRONTIER],
                                 [("router", "router", -1), ("lambda", "lambda", -1), ("accuracy", "accuracy", 3),
                                  ("cost_usd", "cost ($)", 3)])


TABLES = {
    "table1": ("Table 1: every router, in distribution and OOD (one table per split)",
               report.grouped_tables("split", _MAIN_COLUMNS[:1] + _MAIN_COLUMNS[2:], _split_caption)),
    "scatter": ("Accuracy-cost scatter: Table 1 per split, with the oracle frontier on test", _frontier_table),
    "selection": ("How RIVET (ours) was chosen: the conservatism setting on the validation split",
                  [("alpha", "alpha", -1), ("cql_on", "CQL on", -1), ("router", "router", -1),
                   ("members", "runs averaged", -1), ("seeds", "seeds", -1),
                   ("val_return", "validation J", 4), ("chosen", "chosen", -1), ("paper", "paper's alpha", -1)]),
    "table2": ("Table 2: ablations on the test manifest (cost relative to RIVET (ours), online stage)",
               [("router", "configuration", -1), ("accuracy", "accuracy", 3), ("cost_usd", "cost ($)", 3),
                ("cost_rel", "cost rel.", 3), ("regret", "regret (J)", 3)]),
    "lambda_sweep": ("Figure 3: cost-coefficient sweep (one run per lambda, one lambda-conditioned run)",
                     [("lambda", "lambda", -1)] + _MAIN_COLUMNS[:1] + _MAIN_COLUMNS[2:6]),
    "lambda_conditioned": ("One router for every budget: the lambda-conditioned run against one run per lambda",
                           [("lambda", "lambda", -1), ("conditioned_regret", "conditioned regret", 3),
                            ("conditioned_regret_sd", "sd", 3), ("per_lambda_regret", "per-lambda regret", 3),
                            ("per_lambda_regret_sd", "sd", 3), ("difference", "difference", 3),
                            ("conditioned_accuracy", "conditioned accuracy", 3),
                            ("per_lambda_accuracy", "per-lambda accuracy", 3)]),
    "budget_frontier": ("Budget frontier on test: APGR and the cost of reaching 50% / 80% of the best model's gain",
                        frontier.summary_table),
    "prompt_cache": ("What a switch really costs: RouteSim with a prompt cache, cache-aware against cache-blind",
                     [("router", "router", -1), ("accuracy", "accuracy", 3), ("cost", "cost ($)", 3),
                      ("regret", "regret (J)", 3), ("switch_rate", "switch rate", 2),
                      ("cached_share", "cached share", 3)]),
    "online_curve": ("Figure 4: online adaptation (test manifest)",
                     [("trajectories", "online trajectories", -1), ("seeds", "seeds", -1), ("accuracy", "accuracy", 3),
                      ("cost_usd", "cost ($)", 3)]),
    "unavailability": ("Table 5: candidate-model unavailability at test time (cost relative to RIVET Online)",
                       report.grouped_tables("pool", _MAIN_COLUMNS[:1] + _MAIN_COLUMNS[2:6],
                                             lambda pool, _: f"**{pool}** (cost rel. to RIVET Online in this pool)")),
    "interventions": ("Table 3: stay / switch interventions (cost relative to Original within each group)",
                      [("group", "episodes where RIVET", -1), ("router", "policy", -1), ("episodes", "episodes", -1),
                       ("successes", "successes", -1), ("accuracy", "accuracy", 3), ("cost_rel", "cost rel.", 3)]),
    "diagnostics": ("Q* diagnostics: learned Q_route against RouteSim's exact Q*",
                    [("router", "router", -1)] + diagnostics.COLUMNS[1:3] + diagnostics.COLUMNS[4:]),
}
PLOTS = {"table2": report.plot_ablations, "lambda_sweep": report.plot_lambda_sweep, "budget_frontier": frontier.plot,
         "lambda_conditioned": frontier.plot_regret, "prompt_cache": prompt_cache.plot,
         "online_curve": report.plot_online_curve, "unavailability": report.plot_unavailability,
         "interventions": report.plot_interventions, "scatter": report.plot_scatter,
         "post_error": report.plot_post_error, "stage_preferences": report.plot_stage_preferences,
         "diagnostics": diagnostics.plot, "selection": selection.plot}
# Each table's figure next to it (the scatter is Table 1's); how RIVET (ours) was chosen right before its ablations.
REPORT_ORDER = ("table1", "scatter", "selection", "table2", "lambda_sweep", "lambda_conditioned", "budget_frontier",
                "prompt_cache", "online_curve", "unavailability", "interventions", "post_error", "stage_preferences", "diagnostics")


def sweep_lambdas(config: ml_collections.ConfigDict) -> list[float]:
    """Figure 3's lambdas, ascending: `reproduce.lambdas` and the main runs' own; the conditioned run learns their
    range."""
    return sorted({float(x) for x in config.reproduce.lambdas} | {float(config.reward.lam)})


def report_notes(config: ml_collections.ConfigDict, best_at: Sequence[int], test_tasks: int) -> dict[str, str]:
    """The text under each section whose numbers can look inconsistent with another's: what each is measured on.
    Every claim follows from the function computing the rows; `best_at`: each seed's best-validation trajectory."""
    ev, on, rp, lam = config.evaluate, config.online, config.reproduce, config.reward.lam
    sweep = sweep_lambdas(config)
    averaged = ("" if rp.ensemble == 1 else
                f", each seed's Q_route averaged over {rp.ensemble} runs (`Router.ensemble`: the seed's own run and "
                f"{rp.ensemble - 1} at seeds + 1000, + 2000, ...)")
    seeds, rollouts = len(rp.seeds), f"{ev.rollouts_per_task} time(s) per task with seed {ev.seed}"
    if on.eval_seed == ev.seed and on.eval_rollouts == ev.rollouts_per_task:
        streams = "The random streams are Table 1's: a seed's point at its best checkpoint's k is its Table 1 row."
    else:
        streams = (f"Other seeds draw other episodes, and with {test_tasks} test tasks one episode moves a seed's "
                   f"accuracy by {1 / (test_tasks * on.eval_rollouts):.3f}: the curve need not match Table 1's RIVET "
                   f"Online even at the best checkpoint's k, nor its k = 0 point Table 1's RIVET Offline (the same "
                   f"router).")
    return {
        "table1": (f"Learned routers are rolled out {rollouts} (the same random streams for every router); RIVET "
                   f"Offline is each run's TD checkpoint, RIVET Online its best-validation online checkpoint"
                   f"{averaged}. `cost "
                   f"rel.` is relative to each split's own most accurate fixed model (named above its table): compare "
                   f"it within a table, not across splits. The scatter below is this table's figure."),
        "scatter": (f"The points are Table 1's rows, the same numbers; error bars: ± one standard deviation over "
                    f"seeds (RIVET only: each baseline is one fitted router; oracle, fixed models and random are "
                    f"exact). The frontier (test only) is the exact oracle at lambda in {list(rp.frontier_lambdas)}; "
                    f"its lambda = {lam} point is Table 1's test oracle."),
        "selection": (f"A setting is the CQL weight alpha and where CQL applies (`all` logged transitions, Eq. 10 as "
                      f"written, or only the `stochastic` ones, whose logged choice was a draw). Every setting trains "
                      f"through all stages at every seed; each run's best-validation online "
                      f"checkpoint is rolled out {config.select.rollouts} times per '{config.select.split}' task "
                      f"(seed {config.select.seed}, not the online stage's validation seed {on.eval_seed}, so the "
                      f"checkpoint choice does not also pick the setting) and the highest mean J over the seeds is "
                      + ("RIVET (ours) everywhere below. " if rp.ensemble == 1 else
                         f"the chosen setting. RIVET (ours) everywhere below averages Q_route over {rp.ensemble} runs "
                         f"of it per seed (`runs averaged`), validated the same way beside its single runs "
                         f"(`{ONE_RUN}`). ")
                      + "Test is never read. "
                      + ("" if config.select.enabled else "`select.enabled` is off: the configured setting is kept "
                         "whatever validation says (the paper's fixed settings).")),
        "table2": ("`RIVET (ours)` is Table 1's RIVET Online on test: the same checkpoints rolled out with the same "
                   "seeds, hence the same accuracy, cost and regret; only `cost rel.` differs (relative to it here)"
                   + (". " if rp.ensemble == 1 else f", and it averages {rp.ensemble} runs per seed: compare the "
                      f"ablations, one run each, with `{ONE_RUN}`, the first of them. ") +
                   f"`w/o CQL` is the alpha = 0 run of the selection grid: where validation chose alpha 0 it is "
                   f"`{MAIN if rp.ensemble == 1 else ONE_RUN}` itself, row for row; every other setting of the grid "
                   f"(the paper's among them) has a row of its own."
                   + ("" if rp.ensemble == 1 or not rp.pessimism else
                      f" {', '.join(f'`{pessimistic(c)}`' for c in rp.pessimism)}: RIVET (ours)'s runs scored "
                      f"as mean - c x sd over them instead of their mean (`Router.ensemble(..., pessimism=c)`, a "
                      f"lower confidence bound: conservatism that does not push toward the logged model).")),
        "lambda_sweep": (f"Both families are TD checkpoints, one run per seed ({seeds} seeds), rolled out with "
                         f"Table 1's seeds: `{frontier.PER_LAMBDA}` trains a run at each lambda (at lambda = {lam} "
                         f"the main runs' TD checkpoint"
                         f"{'' if rp.ensemble == 1 else ', the first of the runs RIVET (ours) averages'}); "
                         f"`{frontier.CONDITIONED}` trains one run ({rp.conditioned_td_epochs} TD epochs) with lambda "
                         f"drawn per transition from [{sweep[0]}, {sweep[-1]}] (`reward.lam_range`) and reads it at "
                         f"each lambda (`Router.at_lambda`). The oracle at each lambda is exact; `cost rel.` is "
                         f"relative to the test split's most accurate fixed model, as in Table 1."),
        "lambda_conditioned": ("Figure 3's rows side by side: regret (the oracle's J at that lambda minus the "
                               "router's), mean and sd over seeds; `difference` = conditioned - per-lambda (positive: "
                               "the one run for every lambda loses that much to the run trained at that lambda)."),
        "budget_frontier": ("S(c), the accuracy a budget c buys from a family, is the upper envelope of its points "
                            "(drawing one of two routers per episode reaches the segment between them), starting at "
                            "the cheapest fixed model. APGR = the mean over budgets from the cheapest to the most "
                            "accurate fixed model's cost of (S(c) - its accuracy) / (the most accurate one's - its "
                            "accuracy): RouteLLM's average performance gap recovered, for any number of models (above "
                            "1: more accurate than the best model at lower cost). The costs are the least budgets "
                            "whose S(c) closes 50% and 80% of that gap (nan: never). Points: Table 1's test rows and "
                            "the oracle frontier (the scatter's) and Figure 3's two families."),
        "prompt_cache": ("RouteSim with a prompt cache (`configs/routesim.py:cache`): a model called on two turns in "
                         "a row reads the first turn's prompt from its cache at its cached-input price "
                         "(`routesim_params.json`'s `prompt_cache`); everything here is billed so, c_ref is that "
                         "corpus' mean per-turn cost, and regret is against the caching oracle (exact, like the fixed "
                         "models and random). `cache_aware` and `cache_blind` are offline TD routers, one run per seed "
                         "at RIVET (ours)' conservatism setting, trained on the same logging policies' corpus there; "
                         "the cache-aware one adds each candidate's known saving to Q_route (`model.cache_aware`). "
                         "`cached share`: prompt tokens billed as cached / all prompt tokens; cost per pass over the "
                         "test split."),
        "online_curve": (f"Each point is the router while it adapts, after k online trajectories (k = 0: the offline "
                         f"TD router, before any update), rolled out on '{on.test_split}' {on.eval_rollouts} time(s) "
                         f"per task with seed {on.eval_seed}; mean ± sd over the seeds whose run reached k (`seeds`: "
                         f"a run that stops early has no later points). Table 1's RIVET Online is another "
                         f"measurement: each run's best-validation checkpoint (validated on '{on.validation_split}' "
                         f"every {on.validate_every} trajectories, {on.eval_rollouts} rollout(s) per task; here "
                         f"after {list(best_at)} trajectories for seeds {list(rp.seeds)}, not necessarily a curve "
                         f"point), rolled out {rollouts}. {streams}"),
        "unavailability": ("`cost rel.` is relative to RIVET Online's mean cost in the same pool (1.000 in each), "
                           "not to a fixed model as in Table 1. Learned routers are rolled out with Table 1's seeds, "
                           "so one that never called the removed model repeats its Table 1 test row; the oracle, "
                           "fixed models and random are exact in the reduced pool."),
        "interventions": (f"Original is RIVET Online's Table 1 test episodes (the same checkpoints and seeds), pooled "
                          f"over the {seeds} seeds and split by what RIVET did: `switched` = it called more than one "
                          f"model, `kept` = one model over more than one turn; one-turn episodes are in neither group. "
                          f"Stay / Switch replay each such task with its seed. Accuracy is over the pooled episodes; "
                          f"`cost rel.` is relative to Original in the same group."),
        "post_error": (f"Computed on the episodes Table 1 rolled out for each learned router, test and OOD splits "
                       f"pooled; RIVET's rows pool its {seeds} seeds (hence about {seeds}x a baseline's turns). The "
                       f"oracle, fixed models and random are exact expectations, with no traces. nan / n/a: nothing "
                       f"to measure (no switch after an error; `vs MTRouter` wherever MTRouter never switched after "
                       f"one)."),
        "stage_preferences": ("The same pooled traces as Table 7; each model in the colour of its fixed-model router "
                              "in the other figures."),
        "diagnostics": (f"Q_route of each run's TD and online checkpoints against the exact Q*(s, m) (RouteSim's DP at "
                        f"the run's lambda, gamma and c_ref), mean ± sd over the {seeds} seeds. `logged`: "
                        f"{config.diagnose.max_logged_states} states sampled from the logged corpus (what the loss "
                        f"saw); `visited`: the router's own rollouts on '{config.diagnose.split}' "
                        f"({config.diagnose.rollouts} per task). Value lost = V*(s) - Q*(s, the router's choice), the "
                        f"return a decision gives up; `= logged`: the share of choices that repeat the model logged "
                        f"at that state (the oracle's share beside it), `= previous`: that repeat the model of the "
                        f"previous turn. The figure plots value lost by turn (visited states) and `= logged`."),
    }


