"""The one-command reproduction, tiny variant: every experiment, every router, report and plots written."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BASELINES = {"MTRouter", "Weighted kNN", "Avengers-Pro", "EmbedLLM", "RouterDC"}
FIXED = {"fixed:apex-flash", "fixed:apex-pro", "fixed:llama-70b", "fixed:mini-4o", "fixed:quill-9b",
         "fixed:quill-plus"}


@pytest.mark.slow
def test_tiny_reproduction_has_every_experiment_and_router(tmp_path):
    workdir = tmp_path / "rep"
    result = subprocess.run([sys.executable, "-m", "launch.reproduce", "--config=configs/routesim.py:tiny",
                             f"--workdir={workdir}"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "[phase 7/7]" in result.stderr  # progress is shown per phase
    # ... and per unit of the long phases, counted exactly: the last line of each says n/n, never more.
    for what in ("training runs", r"evaluation \(rollout sets\)"):
        counts = re.findall(what + r": (\d+)/(\d+) done", result.stderr)
        assert counts and counts[-1][0] == counts[-1][1], (what, counts)
        assert all(int(done) <= int(total) for done, total in counts)
    experiments = json.loads((workdir / "results.json").read_text())["experiments"]
    assert set(experiments) == {"table1", "table2", "lambda_sweep", "online_curve", "unavailability",
                                "interventions", "scatter", "post_error", "stage_preferences"}

    table1 = experiments["table1"]["rows"]
    for split in ("test", "ood:musique", "ood:drop", "ood:mmlu_pro"):
        routers = {r["router"] for r in table1 if r["split"] == split}
        assert routers == {"oracle", "random", "RIVET Offline", "RIVET Online"} | BASELINES | FIXED, split
    for row in table1:
        assert {"router", "split", "accuracy", "cost_usd", "cost_rel", "regret"} <= set(row)
        assert 0 <= row["accuracy"] <= 1 and row["cost_usd"] > 0
        if row["router"].startswith("RIVET"):
            assert row["seeds"] == 2 and "accuracy_sd" in row  # mean and spread over the configured seeds
    assert {r["router"] for r in experiments["table2"]["rows"]} == {"RIVET (ours)", "w/o CQL", "w/o RIVE",
                                                                   "w/o response"}
    sweep = experiments["lambda_sweep"]["rows"]
    assert sorted({r["lambda"] for r in sweep}) == [0.0, 0.05, 0.5]
    assert {r["router"] for r in sweep} == {"oracle", "RIVET (ours)"}
    assert [r["trajectories"] for r in experiments["online_curve"]["rows"]] == [4, 8]
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
    report = (workdir / "report.md").read_text()
    for title in ("Table 1", "Table 2", "Figure 3", "Figure 4", "Table 5", "Table 3", "scatter", "Table 7",
                  "Figure 5"):
        assert title in report
    for plot in ("lambda_sweep", "online_curve", "scatter", "stage_preferences"):
        assert (workdir / "results" / f"{plot}.png").stat().st_size > 10_000
        assert f"results/{plot}.png" in report
    assert (workdir / "results" / "table1.csv").read_text().startswith("accuracy,")
