"""Experiment outputs: report.md (a section per experiment: its figure, a note, its table), results.json and
results/<experiment>.{json,csv,png}; and the figures of the RouteSim reproduction, one colour per router in all."""

from __future__ import annotations

import csv
import functools
import json
import math
from pathlib import Path
from typing import Callable, Iterable, Sequence

from matplotlib.figure import Figure  # figures straight to files: no pyplot state, no display backend
from matplotlib.patches import Patch

from rivet_jax import plots
from rivet_jax.runs import MAIN

FRONTIER = "oracle frontier"


def _cell(row: dict, key: str, digits: int) -> str:
    value = row.get(key)
    if value is None:
        return ""
    text = f"{value:.{digits}f}"
    sd = row.get(f"{key}_sd")
    return f"{text} ± {sd:.{digits}f}" if sd is not None else text


def markdown_table(rows: list[dict], columns: Sequence[tuple[str, str, int]]) -> str:
    """columns: (key, header, digits); digits < 0 for text."""
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(k, "")) if d < 0 else _cell(row, k, d) for k, _, d in columns)
                     + " |")
    return "\n".join(lines)


def grouped_tables(key: str, columns: Sequence[tuple[str, str, int]],
                   caption: Callable[[str, list[dict]], str] | None = None) -> Callable[[list[dict]], str]:
    """A section body of one table per value of `key` (in order of first appearance), each under its caption line
    (default: the value in bold). Only the report splits them: results.json and the CSV keep one list of rows."""
    def render(rows: list[dict]) -> str:
        parts = []
        for value in dict.fromkeys(r[key] for r in rows):
            at = [r for r in rows if r[key] == value]
            parts.append(f"{caption(value, at) if caption else f'**{value}**'}\n\n{markdown_table(at, columns)}")
        return "\n\n".join(parts)
    return render


def write_outputs(workdir: Path, experiments: dict[str, list[dict]], meta: dict, title: str,
                  tables: dict, plots: dict, notes: dict[str, str] | None = None) -> str:
    """report.md, results.json ({"experiments": {name: {"rows": [...]}}, "meta": ...}), results/<name>.{json,csv,png}.

    A section per experiment, in the order of `experiments`: `tables[name]` = (heading, body), body a list of
    columns (one table of every row) or a function of the rows returning markdown (`grouped_tables`); first the
    figure `plots[name](rows, path)` if any, then `notes[name]` if any (what squares its numbers with other
    sections'), then the table: a reader looks before reading."""
    results = workdir / "results"
    results.mkdir(parents=True, exist_ok=True)
    sections = [f"# {title}\n\n{meta['summary']}\n"]
    for name, rows in experiments.items():
        (results / f"{name}.json").write_text(json.dumps({"rows": rows}, indent=2) + "\n", encoding="utf-8")
        keys = sorted({k for r in rows for k in r})
        with open(results / f"{name}.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(rows)
        heading, body = tables[name]
        parts = [f"## {heading}"]
        if name in plots:
            plots[name](rows, results / f"{name}.png")
            parts.append(f"![{name}](results/{name}.png)")
        if notes and notes.get(name):
            parts.append(notes[name])
        parts.append(body(rows) if callable(body) else markdown_table(rows, body))
        sections.append("\n\n".join(parts) + "\n")
    report = "\n".join(sections)
    (workdir / "report.md").write_text(report, encoding="utf-8")
    (workdir / "results.json").write_text(json.dumps({"experiments": {n: {"rows": r} for n, r in experiments.items()},
                                                      "meta": meta}, indent=2) + "\n", encoding="utf-8")
    return report


def post_error_section(where: str) -> tuple[str, list]:
    """Table 7's report section (App. B.5) for traces described by `where`."""
    return (f"Table 7: routing after execution errors ({where})",
            [("router", "router", -1), ("turns", "turns", -1), ("error_events", "error events", -1),
             ("error_event_rate", "error-event rate", 3), ("switch_rate", "switch rate", 3),
             ("switch_cost_usd", "switch cost ($)", 5), ("switch_cost_rel", "vs MTRouter", 3),
             ("next_turn_recovery", "next-turn recovery", 3)])


def stage_section(where: str, models) -> tuple[str, list]:
    """Table 8 / Figure 5's report section (App. B.6): one column per candidate model."""
    return (f"Table 8 / Figure 5: model selection per turn stage ({where}; each stage sums to 1)",
            [("router", "router", -1), ("stage", "stage", -1), ("turns", "turns", -1)] + [(m, m, 2) for m in models])


# ------------------------------------------------------------------------------------------------- colours

# Fixed models: a light grey and pastels, so the learned routers stand out (the first pastels avoid the hues of the
# first baselines); baselines: saturated tab10 colours other than RIVET's blue, its variants' cyan and random's grey.
_FIXED = ("#c7c7c7", "#dbdb8d", "#f7b6d2", "#c49c94", "#ffbb78", "#c5b0d5", "#98df8a", "#ff9896", "#9edae5")
_BASELINES = ("tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive")
_RIVET_MAIN, _RIVET_OFFLINE = "#1f77b4", "#6baed6"
_RIVET_OTHER = ("#08306b", "#17becf", "#4b6cb7", "#9ecae1", "#006d77", "#3f007d", "#83c5be", "#2b8cbe")
_MARKERS = {"oracle": "*", "fixed": "s", "random": "X", "baseline": "^", "rivet": "o"}  # also the legends' order


def router_kind(name: str) -> str:
    """oracle | random | fixed | rivet | baseline. "RIVET Online: Stay" (a policy built on a router) is its router's."""
    name = name.split(": ")[0]
    if name.startswith("oracle"):
        return "oracle"
    if name.startswith("random"):
        return "random"
    if name.startswith("fixed:"):
        return "fixed"
    # the prompt-cache experiment's cache_aware and cache_blind are RIVET runs too
    return "rivet" if name.startswith(("RIVET", "w/o ", "cache_")) else "baseline"


def router_marker(name: str) -> str:
    """The scatter's marker of a router's kind: shape tells the kinds apart where two colours are close."""
    return _MARKERS[router_kind(name)]


def router_colours(routers: Iterable[str]) -> dict[str, str]:
    """One colour per router, for every figure of a report: by kind (oracle black, random grey, fixed models
    pastels, baselines distinct tab10 colours, RIVET blues: the main variant and the online stage, which are the
    same routers, one blue, the offline stage a lighter one, other variants darker or cyan), then by sorted name
    within the kind. Build it once from every router of the report, so a router keeps its colour in a figure that
    lacks some others (Table 5 drops a fixed model); "X: policy" takes X's colour."""
    routers = list(routers)
    names = sorted({n.split(": ")[0] for n in routers})
    within = {kind: [n for n in names if router_kind(n) == kind] for kind in _MARKERS}
    others = [n for n in within["rivet"] if n not in ("RIVET", MAIN, "RIVET Online") and "Offline" not in n]
    colours = {}
    for n in names:
        kind = router_kind(n)
        if kind in ("oracle", "random"):
            colours[n] = "black" if kind == "oracle" else "#7f7f7f"
        elif kind == "fixed":
            colours[n] = _FIXED[within["fixed"].index(n) % len(_FIXED)]
        elif kind == "baseline":
            colours[n] = _BASELINES[within["baseline"].index(n) % len(_BASELINES)]
        elif n in others:
            colours[n] = _RIVET_OTHER[others.index(n) % len(_RIVET_OTHER)]
        else:
            colours[n] = _RIVET_OFFLINE if "Offline" in n else _RIVET_MAIN
    return {**colours, **{n: colours[n.split(": ")[0]] for n in routers}}


def with_colours(plots: dict[str, Callable], colours: dict[str, str]) -> dict[str, Callable]:
    """`plots` drawing with one shared colour map (`router_colours` of every router in the report)."""
    return {name: functools.partial(plot, colours=colours) for name, plot in plots.items()}


def completed_palette(rows: list[dict], colours: dict[str, str] | None) -> dict[str, str]:
    """`colours`, completed for any router of `rows` it lacks (a figure drawn on its own)."""
    return {**router_colours(r["router"] for r in rows), **(colours or {})}


# --------------------------------------------------------------------------------------------------- plots


def _legend(target, axes) -> None:
    """One legend (on `target`, an axis or the figure, then on the right) for the labels of `axes`: each label once
    (a router drawn in every cluster or panel is one entry), by kind, fixed models by name, others as they appear."""
    found = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            found.setdefault(label, handle)
    kinds = list(_MARKERS)
    order = sorted(enumerate(found), key=lambda il: (kinds.index(router_kind(il[1])),
                                                     il[1] if router_kind(il[1]) == "fixed" else "", il[0]))
    handles = {label: found[label] for _, label in order}
    where = {"loc": "center right"} if isinstance(target, Figure) else {}
    target.legend(list(handles.values()), list(handles), fontsize=8, **where)


def bars(ax, rows: list[dict], value: str, colours: dict[str, str], group: str | None = None,
         style: Callable[[dict], dict] | None = None) -> None:
    """One bar per row, ± `<value>_sd` (the spread over seeds) where the row has it, coloured by router (or
    `style(row)`: bar keywords with a label). With `group`, rows sharing its value side by side, one cluster per
    value labelled below, clusters in order of appearance; without, every bar labelled with its router. A missing
    value (nan: nothing to measure) reads "n/a" rather than a bar of 0."""
    style = style or (lambda r: {"color": colours[r["router"]], "label": r["router"]})
    x, ticks, labels = 0, [], []
    for cluster in (dict.fromkeys(r[group] for r in rows) if group else [None]):
        members = [r for r in rows if group is None or r[group] == cluster]
        for pos, r in enumerate(members, start=x):
            v = r.get(value)
            if v is None or not math.isfinite(v):
                ax.text(pos, 0, "n/a", ha="center", va="bottom", fontsize=7, rotation=90)
                continue
            ax.bar(pos, v, yerr=r.get(f"{value}_sd"), capsize=2, edgecolor="black", linewidth=0.4, **style(r))
        ticks += [x + (len(members) - 1) / 2] if group else list(range(x, x + len(members)))
        labels += [str(cluster)] if group else [r["router"] for r in members]
        x += len(members) + 1
    ax.set_xticks(ticks, labels, fontsize=8, rotation=0 if group else 30, ha="center" if group else "right")


def _with_rel_sd(rows: list[dict]) -> list[dict]:
    """Rows with `cost_rel_sd` where they have `cost_usd_sd`: cost rel. is cost over one reference, so its spread
    over seeds is the cost's, scaled alike."""
    return [{**r, "cost_rel_sd": r["cost_usd_sd"] * r["cost_rel"] / r["cost_usd"]} if "cost_usd_sd" in r else r
            for r in rows]


def plot_lambda_sweep(rows: list[dict], path: Path, colours: dict | None = None) -> Figure:
    colours = completed_palette(rows, colours)
    fig = Figure(figsize=(10, 3.8))
    axes = fig.subplots(1, 2)
    lams = sorted({r["lambda"] for r in rows})
    for router in dict.fromkeys(r["router"] for r in rows):
        pts = sorted((r for r in rows if r["router"] == router), key=lambda r: r["lambda"])
        for ax, key in zip(axes, ("accuracy", "cost_usd")):
            ax.errorbar([r["lambda"] for r in pts], [r[key] for r in pts], yerr=[r.get(f"{key}_sd", 0) for r in pts],
                        fmt=router_marker(router) + ("-" if router_kind(router) == "rivet" else "--"),
                        color=colours[router], capsize=3, label=router)
    for ax, label in zip(axes, ("test accuracy", "total test cost ($)")):
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set_xticks(lams, [f"{lam:g}" for lam in lams])
        ax.set_xlabel("lambda (cost coefficient)")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    fig.suptitle("Cost-coefficient sweep (test manifest; error bars: sd over seeds)")
    return plots.save_figure(fig, path)


def plot_online_curve(rows: list[dict], path: Path, colours: dict | None = None) -> Figure:
    """Accuracy and cost side by side (not on twin axes) against the integer trajectory counts; a point fewer seeds
    reached (runs that stopped early) is marked with its count."""
    colours = completed_palette(rows, colours)
    fig = Figure(figsize=(10, 3.8))
    axes = fig.subplots(1, 2)
    most = max((r.get("seeds", 1) for r in rows), default=1)
    for ax, key, label in zip(axes, ("accuracy", "cost_usd"), ("test accuracy", "total test cost ($)")):
        for router in dict.fromkeys(r["router"] for r in rows):
            pts = sorted((r for r in rows if r["router"] == router), key=lambda r: r["trajectories"])
            ax.errorbar([r["trajectories"] for r in pts], [r[key] for r in pts],
                        yerr=[r.get(f"{key}_sd", 0) for r in pts], fmt="o-", color=colours[router], capsize=3,
                        label=router)
            for r in pts:
                if r.get("seeds", most) < most:
                    ax.annotate(f"{r['seeds']} seed(s)", (r["trajectories"], r[key]), fontsize=7,
                                xytext=(4, 4), textcoords="offset points")
        ax.set_xticks(sorted({r["trajectories"] for r in rows}))
        ax.set_xlabel("online trajectories (0 = the offline router)")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.suptitle("Online adaptation: the in-progress router on the test manifest (error bars: sd over seeds)")
    return plots.save_figure(fig, path)


def plot_scatter(rows: list[dict], path: Path, colours: dict | None = None) -> Figure:
    """One panel per split (its points with error bars over seeds; the oracle frontier where the rows have one), one
    legend for all: no text on the points, so nothing overlaps however close two routers are."""
    colours = completed_palette(rows, colours)
    splits = list(dict.fromkeys(r["split"] for r in rows))
    cols = min(len(splits), 2)
    fig = Figure(figsize=(5 * cols + 2, 4 * -(-len(splits) // cols)))
    axes = fig.subplots(-(-len(splits) // cols), cols, squeeze=False).ravel()
    for ax, split in zip(axes, splits):
        at = [r for r in rows if r["split"] == split]
        frontier = sorted((r for r in at if r["router"] == FRONTIER), key=lambda r: r["cost_usd"])
        if frontier:
            ax.plot([r["cost_usd"] for r in frontier], [r["accuracy"] for r in frontier], "--",
                    color=colours[FRONTIER], linewidth=1, label=FRONTIER, zorder=1)
        for r in at:
            if r["router"] != FRONTIER:
                ax.errorbar(r["cost_usd"], r["accuracy"], xerr=r.get("cost_usd_sd"), yerr=r.get("accuracy_sd"),
                            fmt=router_marker(r["router"]), color=colours[r["router"]], markeredgecolor="black",
                            markeredgewidth=0.5, markersize=8, capsize=2, label=r["router"], zorder=2)
        ax.set_xscale("log")
        ax.set_xlabel("total cost ($, log scale)")
        ax.set_ylabel("accuracy")
        ax.set_title(split)
    for ax in axes[len(splits):]:
        ax.axis("off")
    _legend(fig, axes)
    fig.suptitle("Accuracy-cost of every router, per split (error bars: sd over seeds)")
    return plots.save_figure(fig, path, rect=(0, 0, 0.87, 1))


def plot_ablations(rows: list[dict], path: Path, colours: dict | None = None) -> Figure:
    """Table 2: accuracy and cost of each configuration, ± sd over seeds."""
    colours = completed_palette(rows, colours)
    fig = Figure(figsize=(9, 3.8))
    axes = fig.subplots(1, 2)
    for ax, key, label in zip(axes, ("accuracy", "cost_usd"), ("test accuracy", "total test cost ($)")):
        bars(ax, rows, key, colours)
        ax.set_ylabel(label)
    fig.suptitle("Ablations on the test manifest (error bars: sd over seeds)")
    return plots.save_figure(fig, path)


def plot_unavailability(rows: list[dict], path: Path, colours: dict | None = None) -> Figure:
    """Table 5: accuracy and cost relative to RIVET Online, a cluster of bars per reduced pool."""
    colours = completed_palette(rows, colours)
    fig = Figure(figsize=(12, 6.5))
    axes = fig.subplots(2, 1)
    for ax, key, label in zip(axes, ("accuracy", "cost_rel"), ("test accuracy", "cost rel. to RIVET Online (log)")):
        bars(ax, _with_rel_sd(rows), key, colours, group="pool")
        ax.set_ylabel(label)
    axes[1].set_yscale("log")
    axes[1].axhline(1.0, color=colours.get("RIVET Online", _RIVET_MAIN), linewidth=0.8, linestyle=":")
    _legend(fig, axes[:1])
    fig.suptitle("Candidate-model unavailability at test time (error bars: sd over seeds)")
    return plots.save_figure(fig, path, rect=(0, 0, 0.87, 1))


def plot_interventions(rows: list[dict], path: Path, colours: dict | None = None) -> Figure:
    """Table 3: per group, the original episodes (solid) beside the intervention (hatched), all RIVET Online's."""
    colours = completed_palette(rows, colours)
    fig = Figure(figsize=(9, 3.8))
    axes = fig.subplots(1, 2)

    def style(r: dict) -> dict:
        policy = r["router"].split(": ")[-1]
        return {"color": colours[r["router"]], "hatch": {"Original": "", "Stay": "//"}.get(policy, ".."),
                "label": policy}

    for ax, key, label in zip(axes, ("accuracy", "cost_rel"), ("accuracy", "cost rel. to Original")):
        bars(ax, rows, key, colours, group="group", style=style)
        ax.set_ylabel(label)
        ax.set_xlabel("episodes where RIVET Online")
    _legend(fig, axes[:1])
    fig.suptitle("Stay / switch interventions on RIVET Online's test episodes")
    return plots.save_figure(fig, path, rect=(0, 0, 0.9, 1))


def plot_post_error(rows: list[dict], path: Path, colours: dict | None = None) -> Figure:
    """Table 7: error-event rate, switch rate after an error and next-turn recovery, one bar per router."""
    colours = completed_palette(rows, colours)
    fig = Figure(figsize=(13, 3.8))
    axes = fig.subplots(1, 3)
    for ax, key, label in zip(axes, ("error_event_rate", "switch_rate", "next_turn_recovery"),
                              ("error-event rate", "switch rate after an error", "next-turn recovery")):
        bars(ax, rows, key, colours)
        ax.set_title(label, fontsize=10)
        ax.set_ylim(0, 1)
    fig.suptitle("Routing after execution errors (n/a: no event to measure)")
    return plots.save_figure(fig, path)


def plot_stage_preferences(rows: list[dict], path: Path, colours: dict | None = None) -> Figure:
    """Figure 5: one nested donut per router, Analyze outside, Solve in the middle, Submit inside; each ring is a
    stage's model shares (normalised on its own); each model in its fixed-model colour of the other figures."""
    routers = list(dict.fromkeys(r["router"] for r in rows))
    stages = ("Analyze", "Solve", "Submit")
    models = [k for k in rows[0] if k not in ("router", "stage", "turns")]
    fixed = {**router_colours(f"fixed:{m}" for m in models), **(colours or {})}
    model_colours = {m: fixed[f"fixed:{m}"] for m in models}
    cols = min(len(routers), 4)
    fig = Figure(figsize=(3.2 * cols, 3.3 * -(-len(routers) // cols) + 0.6))
    axes = fig.subplots(-(-len(routers) // cols), cols, squeeze=False).ravel()
    for ax, router in zip(axes, routers):
        by_stage = {r["stage"]: r for r in rows if r["router"] == router}
        for ring, stage in enumerate(stages):
            row = by_stage.get(stage)
            if row and row["turns"]:
                shares = [row[m] for m in models]
                ax.pie(shares, radius=1.0 - 0.3 * ring, colors=[model_colours[m] for m in models], startangle=90,
                       counterclock=False, wedgeprops={"width": 0.28, "edgecolor": "white"})
        ax.set_title(router, fontsize=9)
        ax.set_aspect("equal")
    for ax in axes[len(routers):]:
        ax.axis("off")
    handles = [Patch(color=model_colours[m], label=m) for m in models]
    fig.legend(handles=handles, loc="lower center", ncol=len(models), fontsize=8, frameon=False)
    fig.suptitle("Model selection per turn stage: Analyze (outer), Solve (middle), Submit (inner)", fontsize=10)
    return plots.save_figure(fig, path, rect=(0, 0.06, 1, 0.95))
