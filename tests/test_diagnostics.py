"""Learned values against the exact Q* (rivet_jax/experiments/diagnostics.py, launch.diagnose)."""

import json

import numpy as np
import pytest

from rivet_jax.data.replay import Reward
from rivet_jax.envs import oracle
from rivet_jax.envs.routesim import make_routesim
from rivet_jax.experiments import diagnostics
from rivet_jax.router import Router
from tests.common import REPO, run_launcher


def test_compare_by_hand():
    q = np.array([[1.0, 0.0], [0.0, 2.0]])          # the router picks model 0, then model 1
    q_opt = np.array([[0.2, 0.5], [0.1, 0.3]])      # the oracle picks model 1 at both states
    out = diagnostics.compare(q, q_opt, np.array([0, 1]), called=[1, 1], previous=[-1, 0], max_turns=3)
    # q - q* = [[0.8, -0.5], [-0.1, 1.7]]
    assert out["rmse"] == pytest.approx(np.sqrt((0.64 + 0.25 + 0.01 + 2.89) / 4))
    assert out["bias"] == pytest.approx((0.8 - 0.5 - 0.1 + 1.7) / 4)
    assert out["argmax_agreement"] == 0.5
    assert out["value_lost"] == pytest.approx(0.15)            # 0.5 - 0.2 at turn 0, nothing at turn 1
    assert out["value_lost_by_turn"][:2] == pytest.approx([0.3, 0.0]) and np.isnan(out["value_lost_by_turn"][2])
    assert out["states_by_turn"] == [1, 1, 0]
    assert out["q_spread"] == pytest.approx(1.5) and out["q_star_spread"] == pytest.approx(0.25)
    assert out["q_star_gap"] == pytest.approx(0.25)
    assert (out["same_as_logged"], out["same_as_logged_oracle"]) == (0.5, 1.0)
    assert (out["same_as_previous"], out["same_as_previous_oracle"]) == (0.0, 0.0)  # turn 1 only: 1 vs previous 0


@pytest.fixture(scope="module")
def trained(routesim_tiny_run):
    config, workdir, _ = routesim_tiny_run
    return config, workdir


def test_q_star_at_first_states_is_the_exact_oracle_value(trained):
    """V*(s_0) = max_m Q*(s_0, m) at each task's first state, averaged, is the oracle DP's J on the split."""
    config, workdir = trained
    sim = make_routesim(config.sim)
    router = Router.from_checkpoint(workdir / "train")
    lam, gamma = config.reward.lam, config.reward.gamma
    split = config.diagnose.split
    tasks = sim.tasks(split)
    first = diagnostics.States([t.id for t in tasks], [t.prompt for t in tasks], [()] * len(tasks),
                               [sim.pool.names[0]] * len(tasks))
    q = diagnostics.q_star(oracle.OraclePolicy(sim, Reward(lam, gamma, router.c_ref)), first, sim.pool.names)
    exact = oracle.policy_report(sim, split, Reward(lam, gamma, router.c_ref), oracle_only=True)["oracle"]["return"]
    assert q.max(axis=1).mean() == pytest.approx(exact, rel=1e-9)


def test_launcher_diagnoses_every_stage_on_logged_and_visited_states(trained, capfd, monkeypatch):
    config, workdir = trained
    monkeypatch.chdir(REPO)
    done = run_launcher(capfd, "diagnose", "--config=configs/routesim.py:tiny", f"--workdir={workdir}")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((workdir / "diagnostics.json").read_text())["rows"]
    assert [(r["run"], r["stage"], r["states_of"]) for r in rows] == [
        ("train", stage, where) for stage in ("mc", "td") for where in ("logged", "visited")]
    logged = [r for r in rows if r["states_of"] == "logged"]
    assert all(r["states"] == config.diagnose.max_logged_states for r in logged)  # the same sample for each stage
    assert len({r["q_star_spread"] for r in logged}) == 1                        # ... hence the same Q*
    for r in rows:
        assert sum(r["states_by_turn"]) == r["states"]
        assert r["value_lost"] >= 0 and 0 <= r["argmax_agreement"] <= 1 and r["rmse"] >= abs(r["bias"])
        assert ("same_as_logged" in r) == (r["states_of"] == "logged")
    visited = [r for r in rows if r["states_of"] == "visited"]
    assert all(r["states_by_turn"][0] == len(make_routesim(config.sim).tasks(config.diagnose.split))
               for r in visited)  # one rollout per task: every episode has a first decision
    assert "| train | td | visited |" in done.stdout and (workdir / "diagnostics.md").exists()


def test_launcher_refuses_a_workdir_without_runs(tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(REPO)
    done = run_launcher(capfd, "diagnose", "--config=configs/routesim.py:tiny", f"--workdir={tmp_path}")
    assert done.returncode == 1 and "no logged corpus" in done.stderr and "Traceback" not in done.stderr
