"""report.md and its figures, on synthetic rows of every RouteSim experiment: Table 1 one table per split, a figure for
every section that has a plot, the notes between figure and table, and one colour per router in every figure."""

import json
import math

import pytest
from matplotlib.colors import to_rgba

from rivet_jax.experiments import frontier, report, routesim_report
from rivet_jax.experiments.common import ONE_RUN
from rivet_jax.runs import MAIN

MODELS = ["a-pro", "b-mini", "c-9b"]
FIXED = [f"fixed:{m}" for m in MODELS]
LEARNED = ["MTRouter", "Weighted kNN", "RIVET Offline", "RIVET Online"]
SPLITS = ("test", "ood:x", "ood:y")


def metric_row(router: str, split: str, i: int, **extra) -> dict:
    row = {"router": router, "split": split, "accuracy": 0.5 + 0.04 * i, "cost_usd": 0.01 * (i + 1),
           "cost_rel": 0.1 * (i + 1), "return": 0.3, "regret": 0.01 * i, "turns": 4.0, "switch_rate": 0.5}
    if report.router_kind(router) == "rivet":  # seed_row's spread over seeds
        row.update(seeds=2, accuracy_sd=0.05, cost_usd_sd=0.002, return_sd=0.01)
    return {**row, **extra}


def experiments() -> dict[str, list[dict]]:
    """Rows shaped as routesim's experiments write them (same keys), small and made up."""
    names = ["oracle", *FIXED, "random", *LEARNED]
    table1 = [metric_row(n, s, i, cost_rel=1.0 if n == FIXED[0] else 0.1 * (i + 1))
              for s in SPLITS for i, n in enumerate(names)]
    keys = ("router", "split", "accuracy", "cost_usd", "accuracy_sd", "cost_usd_sd")
    scatter = [{k: r[k] for k in keys if k in r} for r in table1] + [
        {"router": report.FRONTIER, "split": "test", "lambda": lam, "accuracy": 0.9 - lam, "cost_usd": 0.02 / (1 + lam)}
        for lam in (0.0, 0.05, 0.5)]
    unavailability = [{**metric_row(n, "test", i), "pool": f"w/o {m}"} for m in MODELS[:2]
                      for i, n in enumerate(names) if n != f"fixed:{m}"]
    interventions = [{"router": f"RIVET Online: {policy}", "split": "test", "group": group, "episodes": 8,
                      "successes": 6, "accuracy": 0.75, "cost_usd": 0.02, "cost_rel": rel, "switch_rate": 0.5,
                      "turns": 4.0}
                     for group, other in (("switched", "Stay"), ("kept", "Switch"))
                     for policy, rel in (("Original", 1.0), (other, 1.2))]
    post_error = [{"router": n, "turns": 100, "error_events": 10, "error_event_rate": 0.1,
                   "switch_rate": 0.0 if n == "MTRouter" else 0.3, "switch_cost_usd": math.nan if n == "MTRouter"
                   else 0.001, "switch_cost_rel": math.nan, "next_turn_recovery": math.nan if n == "MTRouter" else 0.5}
                  for n in LEARNED]
    sweep = [{**metric_row(n, "test", i), "lambda": lam} for lam in (0.0, 0.05)
             for i, n in enumerate(("oracle", frontier.PER_LAMBDA, frontier.CONDITIONED))]
    points = [r for r in scatter + sweep if r["split"] == "test" and r["router"] not in ("oracle", "random")]
    return {
        "table1": table1, "scatter": scatter,
        "table2": [metric_row(n, "test", i) for i, n in enumerate((MAIN, "w/o CQL", "w/o RIVE"))],
        "lambda_sweep": sweep, "lambda_conditioned": frontier.lambda_conditioned(sweep),
        "budget_frontier": frontier.budget_rows(points),
        "prompt_cache": [{**metric_row(n, "test", i), "cost": 0.02, "cached_share": 0.1 * i}
                         for i, n in enumerate(("oracle", FIXED[0], "random", "MTRouter", "cache_blind", "cache_aware"))],
        "online_curve": [{"router": MAIN, "split": "test", "trajectories": k, "seeds": seeds, "accuracy": 0.6,
                          "accuracy_sd": 0.1, "cost_usd": 0.02, "cost_usd_sd": 0.003}
                         for k, seeds in ((0, 2), (4, 2), (8, 1))],
        "unavailability": unavailability, "interventions": interventions, "post_error": post_error,
        "stage_preferences": [{"router": n, "stage": stage, "turns": 10, **{m: 1 / len(MODELS) for m in MODELS}}
                              for n in LEARNED for stage in ("Analyze", "Solve", "Submit")],
        "selection": [{"alpha": a, "cql_on": "all", "router": n, "members": k, "seeds": 2, "val_return": 0.6 + a,
                       "val_return_sd": 0.02, "per_seed": [0.58 + a, 0.62 + a], "chosen": a == 0.01,
                       "paper": a == 0.1}
                      for a, n, k in ((0.0, "w/o CQL", 1), (0.01, ONE_RUN, 1), (0.1, "RIVET (paper, alpha=0.1)", 1),
                                      (0.01, MAIN, 3))],
        "diagnostics": [{"router": n, "stage": stage, "states_of": where, "seeds": 2, "states": 50, "rmse": 0.2,
                         "bias": -0.1, "argmax_agreement": 0.5, "value_lost": 0.02, "q_spread": 0.3,
                         "q_star_spread": 0.2, "same_as_previous": 0.6, "same_as_previous_oracle": 0.3,
                         "value_lost_by_turn": [0.01, 0.02, float("nan")],
                         **({"same_as_logged": 0.4, "same_as_logged_oracle": 0.13} if where == "logged" else {})}
                        for n in (MAIN, "w/o CQL") for stage in ("td", "online") for where in ("logged", "visited")],
    }


def tables() -> dict:
    return {**routesim_report.TABLES, "post_error": report.post_error_section("synthetic traces"),
            "stage_preferences": report.stage_section("synthetic traces", MODELS)}


def palette(exps: dict) -> dict[str, str]:
    return report.router_colours([r["router"] for rows in exps.values() for r in rows if "router" in r] + FIXED)


def markdown_tables(text: str) -> list[tuple[str, list[list[str]]]]:
    """(the line above it, its body rows as cells) for every markdown table in `text`."""
    found, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|")):
            body = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                body.append([c.strip() for c in row.strip("|").split("|")])
            found.append((lines[i - 2] if i >= 2 else "", body))
    return found


def section(text: str, heading: str) -> str:
    start = text.index(f"## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("report")
    exps = experiments()
    notes = {name: f"NOTE({name})" for name in exps}
    text = report.write_outputs(workdir, {n: exps[n] for n in routesim_report.REPORT_ORDER}, {"summary": "synthetic"},
                                "Synthetic", tables(), report.with_colours(routesim_report.PLOTS, palette(exps)), notes)
    return workdir, exps, text


@pytest.mark.slow
def test_table1_is_one_table_per_split_test_first(written):
    workdir, exps, text = written
    found = markdown_tables(section(text, "Table 1"))
    assert [caption.split("**")[1] for caption, _ in found] == list(SPLITS)
    for (caption, body), split in zip(found, SPLITS):
        assert [cells[0] for cells in body] == [r["router"] for r in exps["table1"] if r["split"] == split]
        assert f"cost rel. to {FIXED[0]}" in caption and ("OOD" in caption) == split.startswith("ood")
    # results.json and the CSV keep one list of rows, each with its split
    saved = json.loads((workdir / "results.json").read_text())["experiments"]["table1"]["rows"]
    assert saved == exps["table1"]
    assert (workdir / "results" / "table1.csv").read_text().splitlines()[0].split(",").count("split") == 1


def test_every_plotted_section_has_its_figure_then_note_then_table(written):
    workdir, exps, text = written
    assert set(routesim_report.REPORT_ORDER) == set(exps)
    for name in exps:
        png = workdir / "results" / f"{name}.png"
        assert (name in routesim_report.PLOTS) == png.exists(), name
        heading = tables()[name][0]
        body = section(text, heading)
        note = body.index(f"NOTE({name})")
        assert note < body.index("\n|")  # the note reads before the table
        if name in routesim_report.PLOTS:
            assert png.stat().st_size > 10_000
            assert body.index(f"![{name}](results/{name}.png)") < note
    # only Table 1 lacks a figure of its own, and its figure (the scatter) is the next section
    assert [n for n in routesim_report.REPORT_ORDER if n not in routesim_report.PLOTS] == ["table1"]
    assert routesim_report.REPORT_ORDER[:2] == ("table1", "scatter")
    scatter = markdown_tables(section(text, tables()["scatter"][0]))
    assert [cells[0] for _, body in scatter for cells in body] == [report.FRONTIER] * 3  # points: Table 1's


def figure_colours(fig) -> dict[str, set]:
    """Every labelled bar, error-bar point or line of `fig`: label -> the colours it is drawn in."""
    found: dict[str, set] = {}
    for ax in fig.axes:
        for container in ax.containers:
            label = container.get_label()
            if hasattr(container, "patches"):
                found.setdefault(label, set()).add(tuple(container.patches[0].get_facecolor()))
            elif container.lines[0] is not None:  # not a bar's own error bars
                found.setdefault(label, set()).add(to_rgba(container.lines[0].get_color()))
        for line in ax.get_lines():
            if not line.get_label().startswith("_"):
                found.setdefault(line.get_label(), set()).add(to_rgba(line.get_color()))
    return found


@pytest.mark.slow
def test_one_colour_per_router_in_every_figure(tmp_path):
    exps = experiments()
    colours = palette(exps)
    seen: dict[str, set] = {}  # colour -> the routers drawn in it, over every figure
    for name, plot in report.with_colours(routesim_report.PLOTS, colours).items():
        fig = plot(exps[name], tmp_path / f"{name}.png")
        labels = figure_colours(fig)
        assert labels or name == "stage_preferences", name
        for label, drawn_in in labels.items():
            # Table 3 labels its policies ("Stay"), the diagnostics a router's stages ("RIVET (ours): td")
            router = label if label in colours else label.split(": ")[0] if label.split(": ")[0] in colours \
                else f"RIVET Online: {label}"
            assert drawn_in == {to_rgba(colours[router])}, (name, label)
            seen.setdefault(colours[router], set()).add(router.split(": ")[0])
    assert set().union(*seen.values()) == {r["router"].split(": ")[0] for rows in exps.values() for r in rows
                                           if "router" in r}
    shared = [{MAIN, "RIVET Online"}, {"oracle", report.FRONTIER}]  # the same routers; the oracle at every lambda
    assert all(len(routers) == 1 or routers in shared for routers in seen.values()), seen
    # the same colour for the same router, also where a figure lacks some routers, and for the models' donuts
    fig = report.plot_stage_preferences(exps["stage_preferences"], tmp_path / "stages.png", colours=colours)
    legend = {t.get_text(): h.get_facecolor() for t, h in zip(fig.legends[0].texts, fig.legends[0].legend_handles)}
    assert legend == {m: to_rgba(colours[f"fixed:{m}"]) for m in MODELS}


def test_router_colours_by_kind():
    names = ["oracle", "random", *FIXED, "MTRouter", "EmbedLLM", MAIN, "RIVET Online", "RIVET Offline", "w/o CQL"]
    colours = report.router_colours(names + ["RIVET Online: Stay"])
    assert colours["oracle"] == "black"
    assert colours[MAIN] == colours["RIVET Online"] == colours["RIVET Online: Stay"]  # the same routers
    assert len({colours[n] for n in names}) == len(names) - 1
    # pure: a fixed model's colour depends only on the fixed models given (build it once per report)
    assert report.router_colours(FIXED)[FIXED[1]] == colours[FIXED[1]]
    assert [report.router_marker(n) for n in ("oracle", FIXED[0], "MTRouter", MAIN)] == ["*", "s", "^", "o"]


def test_scatter_has_a_panel_per_split_with_error_bars_and_a_legend(tmp_path):
    exps = experiments()
    fig = report.plot_scatter(exps["scatter"], tmp_path / "scatter.png")
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == list(SPLITS)
    for ax in panels:
        with_bars = {c.get_label() for c in ax.containers if c.has_xerr and c.has_yerr}
        assert with_bars == {"RIVET Offline", "RIVET Online"}
        assert not ax.texts  # no text on the points: nothing to overlap
    assert [line.get_label() for line in panels[0].get_lines() if line.get_label() == report.FRONTIER]
    assert not any(line.get_label() == report.FRONTIER for ax in panels[1:] for line in ax.get_lines())
    labels = [t.get_text() for t in fig.legends[0].texts]
    assert labels[:2] == [report.FRONTIER, "oracle"] and set(labels) == {r["router"] for r in exps["scatter"]}


def test_online_curve_has_integer_ticks_from_zero(tmp_path):
    fig = report.plot_online_curve(experiments()["online_curve"], tmp_path / "curve.png")
    for ax in fig.axes:
        assert list(ax.get_xticks()) == [0, 4, 8]
    assert any("1 seed" in t.get_text() for t in fig.axes[0].texts)  # a point fewer seeds reached is marked
