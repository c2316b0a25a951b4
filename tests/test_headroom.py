"""launch.headroom: the fixed rules and per-task learners cross-validated over tasks on A/B logs."""

import json

import numpy as np
import pytest

from configs import default
from rivet_jax import headroom
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import DataError, Episode, write_episodes
from tests.test_deploy import POOL, ab_episode, turn

REWARD = Reward(1.0, 0.5, 0.01)   # every turn costs c_ref: one turn is worth outcome - 1, two -1.5 + outcome / 2


def test_the_value_matrix_averages_one_model_episodes_and_keeps_tasks_with_two_models_or_more():
    mixed = Episode("t1/mixed", ab_episode("t1", "ace", 1).task, (turn("ace"), turn("bee")), 1)
    episodes = [ab_episode("t1", "ace", 1, turns=1), ab_episode("t1", "bee", 0, turns=1), mixed,
                ab_episode("t1", "bee", 1, turns=1), ab_episode("t2", "cat", 1, turns=1),
                ab_episode("t0", "ace", 1, turns=2), ab_episode("t0", "cat", 0, turns=1)]
    tasks, values = headroom.value_matrix(episodes, POOL.names, REWARD)
    assert [e.task.id for e in tasks] == ["t0", "t1"]                   # t2: one model only
    np.testing.assert_allclose(values, [[-1.0, np.nan, -1.0], [0.0, -0.5, np.nan]])


def test_the_fixed_rules_are_fitted_on_the_other_folds_and_pick_among_the_models_logged_on_the_task():
    # (T, M) over ace, bee, cat; t1 never logged bee. Fold 0 holds out t0, t2 (fitted on t1, t3: ace 0.6, bee 1.0
    # on t3 alone, cat 0.45 -> bee); fold 1 t1, t3 (fitted on t0, t2: ace 0.5, bee 0.55, cat 0.45 -> bee, on t1
    # unlogged -> ace). Per family: code's fitted task prefers ace, math's bee, on every fold.
    values = np.array([[1.0, 0.1, 0.5], [1.0, np.nan, 0.0], [0.0, 1.0, 0.4], [0.2, 1.0, 0.9]])
    families = np.array(["code", "code", "math", "math"])
    per_task = headroom.crossvalidated_values(values, families, np.eye(4)[:, :2], np.array([0, 1, 0, 1]))
    np.testing.assert_allclose(per_task[headroom.BEST_FIXED], [0.1, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(per_task[headroom.BEST_PER_FAMILY], [1.0, 1.0, 1.0, 1.0])
    rows = {row["rule"]: row for row in headroom.headroom(per_task, resamples=200)}
    assert rows[headroom.BEST_PER_FAMILY]["reference"] and rows[headroom.BEST_FIXED]["gain"] == pytest.approx(-0.225)


def _planted(signal: bool, tasks: int = 80, seed: int = 0):
    """Two families of tasks with 2-d states; with `signal`, ace is worth 1 where the state's first coordinate is
    positive and bee where it is not (cat 0.5 throughout); without, ace and bee are worth 0 or 1 at random."""
    rng = np.random.default_rng(seed)
    states = rng.normal(size=(tasks, 2))
    families = np.array(["code", "math"])[np.arange(tasks) % 2]
    ace = (states[:, 0] > 0).astype(float) if signal else rng.integers(0, 2, tasks).astype(float)
    bee = 1.0 - ace if signal else rng.integers(0, 2, tasks).astype(float)
    values = np.stack([ace, bee, np.full(tasks, 0.5)], axis=1)
    return values, families, states, np.arange(tasks) % 5


def test_a_learner_finds_a_planted_per_task_signal_the_fixed_rules_cannot_see():
    per_task = headroom.crossvalidated_values(*_planted(signal=True))
    rows = {row["rule"]: row for row in headroom.headroom(per_task, resamples=500)}
    assert max(rows[headroom.BEST_FIXED]["J"], rows[headroom.BEST_PER_FAMILY]["J"]) <= 0.6
    ridge = rows["ridge penalty=1 k=1"]
    assert ridge["J"] >= 0.9 and ridge["gain_low"] > 0.25
    assert rows["10 nearest tasks of the family"]["J"] >= 0.9


def test_on_outcomes_unrelated_to_the_state_no_learner_shows_a_gain():
    per_task = headroom.crossvalidated_values(*_planted(signal=False))
    for row in headroom.headroom(per_task, resamples=500):
        assert row["reference"] or row["gain_low"] <= 0, row   # a rule choosing as the reference: exactly 0


def test_launch_headroom_reads_the_non_test_tasks_of_the_workdirs_split_and_writes_its_table(tmp_path):
    # 20 tasks in two families, every model logged on each; ace solves the code tasks, bee the math ones
    episodes = [ab_episode(f"{f}{i}", m, int((f == "c") == (m == "ace")) if m != "cat" else i % 2, turns=1,
                           family={"c": "code", "m": "math"}[f])
                for f in "cm" for i in range(10) for m in POOL.names]
    write_episodes(tmp_path / "episodes.jsonl", episodes)
    (tmp_path / "cards.json").write_text(json.dumps(POOL.to_json()))
    config = default.get_config()
    config.data.episodes, config.data.cards = str(tmp_path / "episodes.jsonl"), str(tmp_path / "cards.json")
    config.data.holdout.validation, config.data.holdout.test = 0.0, 0.2
    table = headroom.run_headroom(config, tmp_path / "w", folds=2, resamples=100)
    result = json.loads((tmp_path / "w" / "headroom.json").read_text())
    split = json.loads((tmp_path / "w" / "splits.json").read_text())
    assert result["tasks"] == len(split["train"]) == 16 and (tmp_path / "w" / "headroom.md").read_text() == table
    rows = {row["rule"]: row for row in result["rows"]}
    # every turn costs the corpus' mean, c_ref: J = y - lambda (0.05), and route by family always solves
    assert rows[headroom.BEST_PER_FAMILY]["J"] == pytest.approx(0.95) and rows[headroom.BEST_PER_FAMILY]["reference"]

    one_model = [e for e in episodes if e.turns[0].model == "ace"]
    write_episodes(tmp_path / "episodes.jsonl", one_model)
    with pytest.raises(DataError, match="headroom reads A/B logs"):
        headroom.run_headroom(config, tmp_path / "w2", folds=2)
