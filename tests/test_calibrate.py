"""launch.calibrate: the choice rule by hand, the intervals, and a tiny RouteSim run end to end."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode, Task, Turn
from rivet_jax import deploy, heldout
from rivet_jax.calibrate import best_checkpoints, episode_summary, pareto
from tests.common import RECORD_LAYOUTS, run_on_eight_devices

REPO = Path(__file__).resolve().parents[1]


def _row(lam, success, cost, cost_hi):
    return {"lambda": lam, "success": success, "cost": cost, "cost_hi": cost_hi}


def test_choose_the_most_successful_row_whose_cost_bound_fits():
    rows = [_row(0.0, 0.9, 0.05, 0.07), _row(0.1, 0.8, 0.02, 0.035), _row(0.5, 0.8, 0.01, 0.015),
            _row(1.0, 0.5, 0.005, 0.006)]
    # 0.1 and 0.5 tie on success within 0.04: the cheaper, 0.5
    assert deploy.within_budget(rows, budget=0.04) == (2, True)
    assert deploy.within_budget(rows, budget=0.06) == (2, True)  # lambda 0: its point cost fits, its upper bound not
    assert deploy.within_budget(rows, budget=0.07) == (0, True)
    assert deploy.within_budget(rows, budget=0.001) == (3, False)    # nothing fits: the cheapest, flagged
    assert pareto(rows) == [True, True, True, True]
    assert pareto(rows + [_row(2.0, 0.4, 0.02, 0.03)]) == [True, True, True, True, False]


def test_each_lambda_keeps_its_stage_with_the_best_validation_return():
    rows = [{"lambda": 0.0, "stage": "mc", "return": 0.5}, {"lambda": 0.0, "stage": "td", "return": 0.6},
            {"lambda": 0.1, "stage": "mc", "return": 0.4}, {"lambda": 0.1, "stage": "td", "return": 0.4}]
    assert best_checkpoints(rows) == [False, True, False, True]  # a tie keeps the later stage
    assert best_checkpoints(rows[:3]) == [False, True, True]


def test_the_one_task_bootstrap_resamples_tasks():
    """heldout.task_bootstrap (what calibrate, training's choice and the verdicts read): resample b's mean is the mean
    of the tasks drawn with replacement by the seeded generator, for every policy and channel alike."""
    per_task = np.array([[[0.0], [1.0], [0.0], [1.0]], [[0.3], [0.3], [0.3], [0.3]]])           # (P=2, T=4, C=1)
    draws = heldout.task_bootstrap(per_task, 2000, 0)                                          # (B, P, C)
    drawn = np.random.default_rng(0).integers(4, size=(2000, 4))                               # the tasks drawn
    np.testing.assert_allclose(draws[:, 0, 0], per_task[0, drawn, 0].mean(axis=1), atol=1e-12)
    np.testing.assert_allclose(draws[:, 1, 0], 0.3, atol=1e-12)  # a constant has no spread
    low, high = heldout.percentiles(draws[:, 0, 0])
    assert 0.0 <= low < 0.5 < high <= 1.0


def test_episode_summary_averages_rollouts_within_a_task_first():
    def episode(task, outcome, cost, r):
        turn = Turn(model="m", response="", feedback="", prompt_tokens=1, completion_tokens=1, cost=cost)
        return Episode(f"{task}/{r}", Task(task, task), (turn,), outcome)

    # task a: 3 rollouts (success 2/3, cost 0.03 each); task b: 1 rollout (fail, cost 0.01)
    episodes = [episode("a", 1, 0.03, 0), episode("a", 1, 0.03, 1), episode("a", 0, 0.03, 2), episode("b", 0, 0.01, 0)]
    summary = episode_summary(episodes, 200, 0, reward=Reward(0.5, 1.0, 0.01))
    assert summary["success"] == pytest.approx((2 / 3 + 0) / 2)
    assert summary["cost"] == pytest.approx((0.03 + 0.01) / 2)
    # J per episode: outcome - 0.5 x cost / 0.01: task a (1 - 1.5, 1 - 1.5, 0 - 1.5) -> -0.8333, task b -0.5
    assert summary["return"] == pytest.approx((-5 / 6 - 0.5) / 2)
    assert summary["cost_lo"] >= 0.01 - 1e-12 and summary["cost_hi"] <= 0.03 + 1e-12


class Preferring:
    """A router stand-in for `RouterPolicy`: the same scores at every state, preferring model `first` of the pool."""

    def __init__(self, pool, first: int):
        self.pool = pool
        self.q = -np.abs(np.arange(len(pool)) - first).astype(float)   # (M,)

    def scores(self, states, available, groups):
        return np.tile(self.q, (len(states), 1))


def test_early_rollouts_give_the_episodes_of_one_rollout_of_every_policy():
    """On RouteSim, calibrate rolls the first stage's routers and the fixed models out on validation while the later
    stages train (`_EarlyRollouts`): with the rest rolled out after training, every policy's episodes are those of
    one rollout of all of them."""
    from configs import routesim
    from rivet_jax import calibrate
    from rivet_jax.envs.routesim import make_routesim

    config = routesim.get_config("tiny")
    pool = make_routesim(config.sim).pool
    keys = [(0.0, "mc"), (0.0, "td"), (1.0, "mc"), (1.0, "td")]
    routers = {key: Preferring(pool, i) for i, key in enumerate(keys)}
    early = calibrate._EarlyRollouts(lambda stage: {k: r for k, r in routers.items() if k[1] == stage}, ("mc", "td"))
    early.stage_ended(config, "mc")
    early.stage_ended(config, "td")   # not the first stage: nothing more goes out early
    episodes = early.episodes(config, routers)
    assert episodes == calibrate._routesim_episodes(config, routers, fixed=True)
    assert set(episodes) == {*keys, *pool.names}
    assert {e.turns[0].model for e in episodes[0.0, "td"]} == {pool.names[1]}   # each router its own episodes


@pytest.fixture(scope="module")
def routesim_calibration(tmp_path_factory) -> Path:
    """launch.calibrate on tiny RouteSim (1 device), a router per lambda (the one-run default is
    tests/test_lambda_conditioned.py's and the own-logs test's), run once for this module's tests."""
    workdir = tmp_path_factory.mktemp("calibrate")
    result = subprocess.run([sys.executable, "-m", "launch.calibrate", "--config=configs/routesim.py:tiny",
                             f"--workdir={workdir}", "--budget_usd_per_episode=0.004",
                             "--config.calibrate.one_run=False"], cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (workdir / "stdout.txt").write_text(result.stdout)
    return workdir


@pytest.mark.slow
def test_tiny_routesim_calibration(routesim_calibration):
    from rivet_jax.router import Router

    tmp_path = routesim_calibration
    out = json.loads((tmp_path / "calibration.json").read_text())
    rows = out["rows"]
    assert [(r["lambda"], r["stage"]) for r in rows] == [(0.0, "mc"), (0.0, "td"), (2.0, "mc"), (2.0, "td")]
    assert all(r["success_lo"] <= r["success"] <= r["success_hi"] and r["cost_lo"] <= r["cost"] <= r["cost_hi"]
               for r in rows)
    assert [r["kept"] for r in rows] == best_checkpoints(rows)
    kept = [r for r in rows if r["kept"]]
    index, within = deploy.within_budget(kept, 0.004)
    assert (out["chosen"]["lambda"], out["chosen"]["stage"]) == (kept[index]["lambda"], kept[index]["stage"])
    assert out["chosen"]["within_budget"] == within and out["router_stage"] == kept[index]["stage"]
    assert {"success", "cost"} <= set(out["test"])  # the chosen router rolled out on the test tasks
    assert (tmp_path / "calibration.png").exists() and "Chosen: lambda" in (tmp_path / "calibration.md").read_text()
    # the fixed models are the reference points, and feasibility is decided on the unrounded upper bound
    assert [r["model"] for r in out["fixed"]] == list(Router.from_checkpoint(out["router_dir"]).pool.names)
    assert out["chosen"]["margin_usd"] == pytest.approx(0.004 - out["chosen"]["cost_hi"])
    assert (out["chosen"]["margin_usd"] >= 0) == out["chosen"]["within_budget"]
    # the verdict of the choice is printed and written; Router.from_checkpoint(W) loads the chosen router
    assert "# Verdict" in (tmp_path / "stdout.txt").read_text() and (tmp_path / "verdict.md").exists()
    assert out["verdict"]["deployed"] == "RIVET (ours)" and set(out["verdict"]["paired"]) == {
        "Best fixed (train)", "Best fixed per family (train)", "random"}   # RouteSim's tasks carry families
    chosen = Router.from_checkpoint(tmp_path)
    assert chosen.config.reward.lam == out["chosen"]["lambda"] and chosen.recentring is None


@pytest.mark.slow
def test_tiny_calibration_on_own_logs_estimates_off_policy(tmp_path):
    from rivet_jax.envs import collect

    collect.write_demo_corpus(tmp_path / "logs", 20, 0)  # stands in for one's own logs: 7 loggers x 20 tasks
    result = subprocess.run([sys.executable, "-m", "launch.calibrate", "--config=configs/default.py:tiny",
                             f"--workdir={tmp_path / 'w'}", "--budget_usd_per_episode=0.004",
                             f"--config.data.episodes={tmp_path / 'logs' / 'episodes.jsonl'}",
                             f"--config.data.cards={tmp_path / 'logs' / 'model_cards.json'}",
                             "--config.data.holdout.validation=0.3", "--config.data.holdout.test=0.2",
                             "--config.calibrate.resamples=50", f"--config.data.embedding_cache={tmp_path / 'cache'}"],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads((tmp_path / "w" / "calibration.json").read_text())
    # every vector (training, the estimates, the verdict) from the configured cache: none embedded a second time
    assert any((tmp_path / "cache").iterdir()) and not (tmp_path / "w" / "embeddings").exists()
    # fitted-Q evaluation on the held-out validation tasks
    assert not out["simulated"] and all(r["estimator"] == "FQE" for r in out["rows"])
    kept = [r for r in out["rows"] if r["kept"]]
    index, within = deploy.within_budget(kept, 0.004)
    assert out["chosen"]["lambda"] == kept[index]["lambda"] and "test" not in out
    # J is discounted at each router's own lambda, with an interval; the fixed models are estimated alike
    assert all(r["return_lo"] <= r["return"] <= r["return_hi"] for r in out["rows"] + out["fixed"])
    assert len(out["fixed"]) == 6 and out["verdict"]["estimator"] == "FQE" and "# Verdict" in result.stdout
    # one lambda-conditioned run for both lambdas (calibrate.one_run, the default)
    assert [p.name for p in (tmp_path / "w" / "runs").iterdir()] == ["lambda-conditioned"]
    splits = json.loads((tmp_path / "w" / "runs" / "lambda-conditioned" / "seed_42" / "splits.json").read_text())
    assert splits["validation"] and not set(splits["validation"]) & set(splits["train"])


CALIBRATE_SCRIPT = textwrap.dedent("""
    import json
    import sys
    import jax
    import numpy as np
    from configs import routesim
    from rivet_jax import calibrate
    from rivet_jax.settings import with_overrides
""") + RECORD_LAYOUTS + textwrap.dedent("""
    # launch.calibrate's run (a router per lambda: 2 runs, one group, measured on validation) on 8 devices; the
    # launcher's own run (1 device) is the reference.
    workdir, reference = sys.argv[1], sys.argv[2]
    calibrate.calibrate(with_overrides(routesim.get_config("tiny"), {"devices": 8, "calibrate.one_run": False}),
                        f"{workdir}/d8", 0.004)
    # 2 runs on 8 devices: a run per half of the devices, each run's batch split over its 4.
    assert [layout for layout in LAYOUTS if layout[1] == 8] == [(2, 8, ("runs",), 8)] * 2, LAYOUTS
    eight = json.loads(open(f"{workdir}/d8/calibration.json").read())
    one = json.loads(open(f"{reference}/calibration.json").read())
    assert [(r["lambda"], r["stage"], r["kept"]) for r in eight["rows"]] == [
        (r["lambda"], r["stage"], r["kept"]) for r in one["rows"]]
    for key in ("success", "cost", "return"):
        np.testing.assert_allclose([r[key] for r in eight["rows"]], [r[key] for r in one["rows"]], rtol=1e-6, atol=1e-9)
    assert (eight["chosen"]["lambda"], eight["router_stage"]) == (one["chosen"]["lambda"], one["router_stage"])
    print("ok")
""")



@pytest.mark.slow
def test_calibration_on_eight_devices_matches_one(routesim_calibration, tmp_path):
    run_on_eight_devices(CALIBRATE_SCRIPT, tmp_path, routesim_calibration)


@pytest.mark.slow
def test_calibration_on_ab_logs_deploys_a_committed_router_as_training_does(tmp_path):
    """A/B logs (one model per episode: the demo corpus without its random router) show nothing of switching, so
    calibrate deploys a router that keeps its first choice, by the same rule (`deploy.commits`) as training's."""
    from rivet_jax import calibrate
    from rivet_jax.data.schema import read_episodes, read_model_cards, write_episodes
    from rivet_jax.envs import collect
    from rivet_jax.router import Router
    from rivet_jax.settings import with_overrides
    from configs import default

    collect.write_demo_corpus(tmp_path / "logs", 20, 0)
    pool = read_model_cards(tmp_path / "logs" / "model_cards.json")
    episodes = read_episodes(tmp_path / "logs" / "episodes.jsonl", pool).episodes
    write_episodes(tmp_path / "ab.jsonl", [e for e in episodes if len({t.model for t in e.turns}) == 1
                                          and not e.episode_id.startswith("random")])
    config = with_overrides(default.get_config("tiny"), {
        "data.episodes": str(tmp_path / "ab.jsonl"), "data.cards": str(tmp_path / "logs" / "model_cards.json"),
        "data.holdout.validation": 0.3, "data.holdout.test": 0.0, "calibrate.resamples": 20,
        "calibrate.stage": "mc"})
    result = calibrate.calibrate(config, tmp_path / "w", 0.004)
    deployed = json.loads((tmp_path / "w" / "deploy.json").read_text())
    assert deployed["source"] == "launch.calibrate" and deployed["deploy"]["commit"] is True
    assert deployed["chosen"]["lambda"] == result["chosen"]["lambda"]
    assert Router.from_checkpoint(tmp_path / "w").commit
