"""Experiment outputs: report.md (a section per experiment, with its table and plot), results.json and
results/<experiment>.{json,csv,png}; and the figures of the RouteSim reproduction (Figures 1, 3 and 4)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Sequence

from matplotlib.figure import Figure  # figures straight to files: no pyplot state, no display backend
from matplotlib.patches import Patch

from rivet_jax.experiments.common import MAIN


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


def write_outputs(workdir: Path, experiments: dict[str, list[dict]], meta: dict, title: str,
                  tables: dict, plots: dict) -> str:
    """report.md (a section per experiment: `tables[name]` = (title, columns), plot if `plots[name]`),
    results.json ({"experiments": {name: {"rows": [...]}}, "meta": ...}) and results/<name>.{json,csv,png}."""
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
        heading, columns = tables[name]
        section = f"## {heading}\n\n{markdown_table(rows, columns)}\n"
        if name in plots:
            plots[name](rows, results / f"{name}.png")
            section += f"\n![{name}](results/{name}.png)\n"
        sections.append(section)
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


# --------------------------------------------------------------------------------------------------- plots


def save_figure(fig: Figure, path: Path) -> None:
    """Every report figure: laid out tight, 110 dpi PNG."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_lambda_sweep(rows: list[dict], path: Path) -> None:
    fig = Figure(figsize=(10, 3.8))
    axes = fig.subplots(1, 2)
    for router, style in ((MAIN, "o-"), ("oracle", "s--")):
        pts = [r for r in rows if r["router"] == router]
        lams = [r["lambda"] for r in pts]
        axes[0].errorbar(lams, [r["accuracy"] for r in pts], yerr=[r.get("accuracy_sd", 0) for r in pts],
                         fmt=style, label=router, capsize=3)
        axes[1].errorbar(lams, [r["cost_usd"] for r in pts], yerr=[r.get("cost_usd_sd", 0) for r in pts],
                         fmt=style, label=router, capsize=3)
    for ax, label in zip(axes, ("accuracy", "total test cost ($)")):
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set_xlabel("lambda")
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle("Cost-coefficient sweep (test manifest)")
    save_figure(fig, path)


def plot_online_curve(rows: list[dict], path: Path) -> None:
    fig = Figure(figsize=(6, 3.8))
    ax = fig.subplots()
    x = [r["trajectories"] for r in rows]
    ax.errorbar(x, [r["accuracy"] for r in rows], yerr=[r["accuracy_sd"] for r in rows], fmt="o-", color="C0",
                capsize=3, label="accuracy")
    ax.set_xlabel("online trajectories")
    ax.set_ylabel("test accuracy", color="C0")
    twin = ax.twinx()
    twin.errorbar(x, [r["cost_usd"] for r in rows], yerr=[r["cost_usd_sd"] for r in rows], fmt="s--", color="C1",
                  capsize=3, label="cost")
    twin.set_ylabel("total test cost ($)", color="C1")
    ax.set_title("Online adaptation")
    save_figure(fig, path)


def plot_scatter(rows: list[dict], path: Path) -> None:
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    frontier = sorted((r for r in rows if r["router"] == "oracle frontier"), key=lambda r: r["cost_usd"])
    ax.plot([r["cost_usd"] for r in frontier], [r["accuracy"] for r in frontier], "k--", label="oracle frontier")
    for r in rows:
        if r["router"] != "oracle frontier":
            ax.scatter(r["cost_usd"], r["accuracy"], s=30)
            ax.annotate(r["router"].replace("fixed:", ""), (r["cost_usd"], r["accuracy"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("total test cost ($, log scale)")
    ax.set_ylabel("test accuracy")
    ax.legend(loc="lower right")
    ax.set_title("Accuracy-cost of every router")
    save_figure(fig, path)


def plot_stage_preferences(rows: list[dict], path: Path) -> None:
    """Figure 5: one nested donut per router, Analyze outside, Solve in the middle, Submit inside; each ring is a
    stage's model shares (normalised on its own); one colour per model across every panel."""
    routers = list(dict.fromkeys(r["router"] for r in rows))
    stages = ("Analyze", "Solve", "Submit")
    models = [k for k in rows[0] if k not in ("router", "stage", "turns")]
    colours = {m: f"C{i}" for i, m in enumerate(models)}
    cols = min(len(routers), 4)
    fig = Figure(figsize=(3.2 * cols, 3.3 * -(-len(routers) // cols) + 0.6))
    axes = fig.subplots(-(-len(routers) // cols), cols, squeeze=False).ravel()
    for ax, router in zip(axes, routers):
        by_stage = {r["stage"]: r for r in rows if r["router"] == router}
        for ring, stage in enumerate(stages):
            row = by_stage.get(stage)
            if row and row["turns"]:
                shares = [row[m] for m in models]
                ax.pie(shares, radius=1.0 - 0.3 * ring, colors=[colours[m] for m in models], startangle=90,
                       counterclock=False, wedgeprops={"width": 0.28, "edgecolor": "white"})
        ax.set_title(router, fontsize=9)
        ax.set_aspect("equal")
    for ax in axes[len(routers):]:
        ax.axis("off")
    handles = [Patch(color=colours[m], label=m) for m in models]
    fig.legend(handles=handles, loc="lower center", ncol=len(models), fontsize=8, frameon=False)
    fig.suptitle("Model selection per turn stage: Analyze (outer), Solve (middle), Submit (inner)", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    fig.savefig(path, dpi=110)
