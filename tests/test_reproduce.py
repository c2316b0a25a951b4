"""The one-command reproduction, tiny variant: every experiment, every router, report and plots written."""

import json
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rivet_jax import online, online_curve
from rivet_jax.experiments import frontier
from rivet_jax.experiments.common import ONE_RUN, pessimistic
from rivet_jax.runs import MAIN
from tests.common import RECORD_LAYOUTS, run_on_eight_devices

REPO = Path(__file__).resolve().parents[1]
SPLITS = ("test", "ood:musique", "ood:drop", "ood:mmlu_pro")
PLOTTED = ("table2", "lambda_sweep", "lambda_conditioned", "budget_frontier", "online_curve", "unavailability", "interventions", "scatter", "post_error",
           "stage_preferences", "diagnostics", "selection")  # every section but Table 1, whose figure is the scatter
BASELINES = {"Best fixed (train)", "MTRouter", "Weighted kNN", "Avengers-Pro", "EmbedLLM", "RouterDC"}
FIXED = {"fixed:apex-flash", "fixed:apex-pro", "fixed:llama-70b", "fixed:mini-4o", "fixed:quill-9b",
         "fixed:quill-plus"}


@pytest.fixture(scope="module")
def reproduction(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The tiny reproduction, run once for every test of this module."""
    workdir = tmp_path_factory.mktemp("reproduce") / "rep"
    result = subprocess.run([sys.executable, "-m", "launch.reproduce", "--config=configs/routesim.py:tiny",
                             f"--workdir={workdir}"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    return workdir, result


@pytest.mark.slow
def test_tiny_reproduction_has_every_experiment_and_router(reproduction):
    workdir, result = reproduction
    assert re.search(r"\[phase (\d+)/\1\]", result.stderr)  # progress is shown per phase, up to the last
    # ... and per unit of the long phases, counted exactly: the last line of each says n/n, never more.
    for what in (r"offline training \(run-epochs\)", r"evaluation \(rollout sets\)"):
        counts = re.findall(what + r": (\d+)/(\d+) done", result.stderr)
        assert counts and counts[-1][0] == counts[-1][1], (what, counts)
        assert all(int(done) <= int(total) for done, total in counts)
    experiments = json.loads((workdir / "results.json").read_text())["experiments"]
    assert set(experiments) == {"table1", "table2", "lambda_sweep", "online_curve", "unavailability",
                                "interventions", "scatter", "post_error", "stage_preferences", "diagnostics",
                                "selection", "lambda_conditioned", "budget_frontier", "prompt_cache"}

    table1 = experiments["table1"]["rows"]
    for split in ("test", "ood:musique", "ood:drop", "ood:mmlu_pro"):
        routers = {r["router"] for r in table1 if r["split"] == split}
        assert routers == {"oracle", "random", "RIVET Offline", "RIVET Online"} | BASELINES | FIXED, split
    for row in table1:
        assert {"router", "split", "accuracy", "cost_usd", "cost_rel", "regret"} <= set(row)
        assert 0 <= row["accuracy"] <= 1 and row["cost_usd"] > 0
        if row["router"].startswith("RIVET"):
            assert row["seeds"] == 2 and "accuracy_sd" in row  # mean and spread over the configured seeds
    # alpha chosen on validation among the tiny grid {0, 0.1}: the highest mean validation J over the seeds
    # ... and RIVET (ours) averages 2 runs of the chosen setting per seed, validated beside them
    selected = experiments["selection"]["rows"]
    grid, averaged = selected[:-1], selected[-1]
    assert [r["alpha"] for r in grid] == [0.0, 0.1] and all(r["seeds"] == 2 for r in selected)
    chosen = max(grid, key=lambda r: r["val_return"])
    assert [r["chosen"] for r in grid] == [r is chosen for r in grid]
    assert chosen["router"] == ONE_RUN and [r["members"] for r in selected] == [1, 1, 2]
    assert (averaged["router"], averaged["alpha"], averaged["chosen"]) == (MAIN, chosen["alpha"], True)
    assert len({p.name for p in (workdir / "runs").glob("*_members/seed_*")}) == 2  # seeds 1000 + each seed
    # every grid run kept its routers at the curve points; only the chosen runs' curves were rolled out (Figure 4)
    for alpha in (0.0, 0.1):
        for run in (workdir / "runs" / f"alpha_{alpha:g}").glob("seed_*"):
            assert online_curve.kept_points(run) == [0, 4, 8]
            curve = [p["trajectories"] for p in online.read_progress(run)["curve"]]
            assert curve == ([0, 4, 8] if alpha == chosen["alpha"] else []), (run, curve)
    ablations = {MAIN, ONE_RUN, pessimistic(1.0), "w/o CQL", "w/o RIVE", "w/o response"}
    paper = set() if chosen["alpha"] == 0.1 else {"RIVET (paper, alpha=0.1)"}  # the paper's alpha beside the choice
    assert {r["router"] for r in experiments["table2"]["rows"]} == ablations | paper
    sweep = experiments["lambda_sweep"]["rows"]
    assert sorted({r["lambda"] for r in sweep}) == [0.0, 0.05, 0.5]
    # one run per seed and lambda, and one lambda-conditioned run per seed read at each lambda
    assert {r["router"] for r in sweep} == {"oracle", frontier.PER_LAMBDA, frontier.CONDITIONED}
    assert all(r["seeds"] == 2 for r in sweep if r["router"] != "oracle")
    assert len(list((workdir / "runs" / "lambda_conditioned").glob("seed_*/checkpoints/td"))) == 2
    by_lambda = {(r["router"], r["lambda"]): r for r in sweep}
    conditioned = experiments["lambda_conditioned"]["rows"]
    assert [r["lambda"] for r in conditioned] == [0.0, 0.05, 0.5]
    for r in conditioned:  # the sweep's regrets side by side, the difference theirs
        ours, theirs = by_lambda[(frontier.CONDITIONED, r["lambda"])], by_lambda[(frontier.PER_LAMBDA, r["lambda"])]
        assert (r["conditioned_regret"], r["per_lambda_regret"]) == (ours["regret"], theirs["regret"])
        assert r["difference"] == pytest.approx(ours["regret"] - theirs["regret"])
    summaries = {r["router"]: r for r in experiments["budget_frontier"]["rows"] if r.get("summary")}
    assert set(summaries) == {frontier.CONDITIONED, frontier.PER_LAMBDA, "oracle frontier"}
    assert summaries[frontier.CONDITIONED]["points"] == 3 and summaries["oracle frontier"]["points"] == 3
    assert all(math.isfinite(r["apgr"]) for r in summaries.values())
    cache = {r["router"]: r for r in experiments["prompt_cache"]["rows"]}   # RouteSim with a prompt cache
    assert set(cache) == {"oracle", "random", "cache_aware", "cache_blind"} | BASELINES | FIXED
    assert all({"regret", "cost", "switch_rate", "cached_share"} <= set(r) and 0 <= r["cached_share"] <= 1
               for r in cache.values())
    assert cache["oracle"]["regret"] == 0 and cache["fixed:apex-flash"]["switch_rate"] == pytest.approx(0, abs=1e-12)
    # the open-weights models have no cached price (nothing billed as cached); the others read their cache
    assert cache["fixed:llama-70b"]["cached_share"] == cache["fixed:quill-9b"]["cached_share"] == 0
    assert cache["fixed:apex-pro"]["cached_share"] > 0.5 and cache["fixed:mini-4o"]["cached_share"] > 0.5
    for name in ("cache_aware", "cache_blind"):
        assert len(list((workdir / "prompt_cache" / "runs" / name).glob("seed_*/checkpoints/td"))) == 2
    assert [r["trajectories"] for r in experiments["online_curve"]["rows"]] == [0, 4, 8]  # 0: the offline router
    unavailable = experiments["unavailability"]["rows"]
    assert {r["pool"] for r in unavailable} == {"w/o apex-pro", "w/o quill-9b"}
    for pool in ("w/o apex-pro", "w/o quill-9b"):
        routers = {r["router"] for r in unavailable if r["pool"] == pool}
        assert {"oracle", "random", "RIVET Online"} | BASELINES <= routers
        assert f"fixed:{pool[4:]}" not in routers
    assert {r["router"] for r in experiments["interventions"]["rows"]} <= {
        "RIVET Online: Original", "RIVET Online: Stay", "RIVET Online: Switch"}
    assert any(r["router"] == "oracle frontier" for r in experiments["scatter"]["rows"])

    learned = BASELINES | {"RIVET Offline", "RIVET Online"}
    post = {r["router"]: r for r in experiments["post_error"]["rows"]}
    assert set(post) == learned
    mtrouter = post["MTRouter"]  # the reference of the switch cost, wherever it switched after an error at all
    assert math.isnan(mtrouter["switch_cost_usd"]) or mtrouter["switch_cost_rel"] == pytest.approx(1.0)
    for row in post.values():
        assert row["turns"] > 0 and 0 <= row["error_events"] <= row["turns"]
        assert sum(row[f"events: {kind}"] for kind in ("non-executable action", "formatting error",
                                                       "tool failure")) == row["error_events"]
    stages = experiments["stage_preferences"]["rows"]
    assert {(r["router"], r["stage"]) for r in stages} == {(n, s) for n in learned for s in ("Analyze", "Solve",
                                                                                              "Submit")}
    for r in stages:  # each stage's shares sum to 1 wherever the router has turns of that stage
        shares = [v for k, v in r.items() if k.startswith(tuple(m[len("fixed:"):] for m in FIXED))]
        assert len(shares) == len(FIXED) and (r["turns"] == 0 or abs(sum(shares) - 1) < 1e-9)
    diagnosed = experiments["diagnostics"]["rows"]
    paper = {"RIVET (paper, alpha=0.1)"} if any(r["chosen"] and r["alpha"] == 0 for r in
                                               experiments["selection"]["rows"]) else set()
    assert {(r["router"], r["stage"], r["states_of"]) for r in diagnosed} == {
        (router, stage, where) for router in {MAIN, ONE_RUN, pessimistic(1.0), "w/o CQL"} | paper
        for stage in ("td", "online")
        for where in ("logged", "visited")}
    assert all(r["seeds"] == 2 and r["value_lost"] >= 0 for r in diagnosed)
    by = {(r["router"], r["stage"], r["states_of"]): r for r in diagnosed}
    for stage in ("td", "online"):  # mean - sd over the same runs lies below their mean at every logged (s, m)
        assert by[(pessimistic(1.0), stage, "logged")]["bias"] < by[(MAIN, stage, "logged")]["bias"]
    report = (workdir / "report.md").read_text()
    for title in ("Table 1", "Table 2", "Figure 3", "One router for every budget", "Budget frontier", "Figure 4", "Table 5", "Table 3", "scatter", "Table 7",
                  "Figure 5", "Q* diagnostics"):
        assert title in report
    assert re.search(r"alpha=[\d.]+ chosen on 'validation' \(validation J alpha=0: -?[\d.]+; alpha=0\.1: -?[\d.]+\)",
                     result.stderr)
    for plot in PLOTTED:
        assert (workdir / "results" / f"{plot}.png").stat().st_size > 10_000
        assert f"results/{plot}.png" in report
    assert (workdir / "results" / "table1.csv").read_text().startswith("accuracy,")


def _section(report: str, start: str) -> str:
    begin = report.index(f"## {start}")
    end = report.find("\n## ", begin + 1)
    return report[begin:end if end >= 0 else None]


def _first_cells(text: str) -> list[list[str]]:
    """The first column of each markdown table in `text`, header and separator left out."""
    tables, current = [], None
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current = [] if current is None else current + [line.strip("|").split("|")[0].strip()]
        elif current is not None:
            tables.append(current[1:])  # drop the separator row
            current = None
    return tables


@pytest.mark.slow
def test_tiny_report_reads_table1_per_split_each_section_with_its_figure(reproduction):
    workdir, _ = reproduction
    experiments = json.loads((workdir / "results.json").read_text())["experiments"]
    report = (workdir / "report.md").read_text()
    table1 = _section(report, "Table 1")
    assert [table1.index(f"**{s}**") for s in SPLITS] == sorted(table1.index(f"**{s}**") for s in SPLITS)
    assert _first_cells(table1) == [[r["router"] for r in experiments["table1"]["rows"] if r["split"] == s]
                                    for s in SPLITS]
    sections = report.split("\n## ")[1:]
    assert len(sections) == len(experiments)
    assert sections[1].startswith("Accuracy-cost scatter")  # Table 1's figure, right below it
    assert all("![" in body for body in sections[1:])  # every other section opens with its figure
    # the scatter has every Table 1 split (RIVET with its spread over seeds) and the frontier on test only
    scatter = experiments["scatter"]["rows"]
    assert {r["split"] for r in scatter} == set(SPLITS)
    assert {r["split"] for r in scatter if r["router"] == "oracle frontier"} == {"test"}
    assert all("accuracy_sd" in r for r in scatter if r["router"].startswith("RIVET"))


def _same(a: dict, b: dict) -> bool:
    return all(a[k] == pytest.approx(b[k]) for k in ("accuracy", "cost_usd", "regret", "accuracy_sd", "cost_usd_sd"))


@pytest.mark.slow
def test_tiny_report_explains_numbers_that_repeat_or_differ(reproduction):
    """The notes' claims hold on the numbers: Table 2's RIVET (ours) is Table 1's row; Figure 3 says which runs it
    compares; Table 5's cost is relative to RIVET Online in each pool."""
    workdir, _ = reproduction
    experiments = json.loads((workdir / "results.json").read_text())["experiments"]
    rows = {name: e["rows"] for name, e in experiments.items()}
    test = {r["router"]: r for r in rows["table1"] if r["split"] == "test"}
    assert _same(next(r for r in rows["table2"] if r["router"] == MAIN), test["RIVET Online"])
    assert all(r["cost_rel"] == pytest.approx(1.0) for r in rows["unavailability"] if r["router"] == "RIVET Online")
    report = (workdir / "report.md").read_text()
    curve = _section(report, "Figure 4")
    assert "with seed 0" in curve and "best-validation checkpoint" in curve and "with seed 1" in curve
    assert "at lambda = 0.05 the main runs' TD checkpoint, the first of the runs RIVET (ours) averages" in _section(
        report, "Figure 3")
    assert "Table 1's RIVET Online on test" in _section(report, "Table 2")


GROUP_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    import jax
    import numpy as np
    from configs import routesim
    from rivet_jax import checkpointing, online
    from rivet_jax.experiments import routesim as experiment, selection
    from rivet_jax.runs import corpus_files, run_dir, train_variants
    from rivet_jax.settings import with_overrides
""") + RECORD_LAYOUTS + textwrap.dedent("""
    # The tiny reproduction's first groups (its conservatism grid x seeds) on 8 devices, on the reproduction's
    # corpus; the reproduction's own runs (1 device) are the reference. Every run's offline stages, and the first
    # setting's online stage too (data parallel on the 8 devices; the others' would repeat it).
    workdir, reference = sys.argv[1], Path(sys.argv[2])
    config = routesim.get_config("tiny")
    episodes, cards = corpus_files(reference / "corpus")
    settings = selection.grid(config)
    variants = {selection.variant(s): (selection.overrides(s), "all" if k == 0 else "offline")
                for k, s in enumerate(settings)}
    eight = train_variants(with_overrides(config, {"devices": 8}), episodes, cards, Path(workdir), variants,
                           config.reproduce.seeds)
    runs = len(settings) * len(config.reproduce.seeds)
    assert runs == 4, runs
    # MC: the grid's two settings share each seed's warm start (train.mc_leaders), 2 runs on 8 devices; TD: 4 runs,
    # one run per pair of devices (runs axis 4), each run's batch split over its pair.
    assert [layout for layout in LAYOUTS if layout[1] == 8] == [(2, 8, ("runs",), 8), (4, 8, ("runs",), 8)], LAYOUTS
    for variant in variants:
        for seed, got_dir in zip(config.reproduce.seeds, eight[variant]):
            one = run_dir(reference, variant, seed)
            adapted = variants[variant][1] == "all"
            for stage in ("mc", "td", "online") if adapted else ("mc", "td"):
                like = checkpointing.StageCheckpoints(one, stage).restore(None)[0]["params"]
                got = checkpointing.StageCheckpoints(got_dir, stage).restore(None)[0]["params"]
                print(variant, stage, "max abs difference", worst(got, like))
                assert worst(got, like) < 1e-4, (variant, stage)
            if adapted:
                assert online.read_progress(got_dir)["best_at"] == online.read_progress(one)["best_at"]
    print("ok")
""")


@pytest.mark.slow
def test_reproduction_groups_shard_their_runs_over_eight_devices_and_match_one(reproduction, tmp_path):
    workdir, _ = reproduction
    run_on_eight_devices(GROUP_SCRIPT, tmp_path, workdir)
