"""Task-level splits of one's own logs: by hand, kept in the workdir, and what training reads."""

import json

import pytest

from configs import default
from rivet_jax.config_checks import ConfigError, config_problems
from rivet_jax.corpus import prepare_data
from rivet_jax.data.schema import Episode, Task, Turn
from rivet_jax.data.splits import MANIFEST, hashed_split, manifest_for, split_tasks, task_folds
from rivet_jax.settings import with_overrides


def _episode(task_id: str, family: str | None, model: str = "m") -> Episode:
    turn = Turn(model=model, response="r", feedback="", prompt_tokens=1, completion_tokens=1, cost=0.1)
    return Episode(f"{task_id}/{model}", Task(task_id, f"prompt {task_id}", family), (turn,), 1)


def _logs() -> list[Episode]:
    """Family a: 10 tasks, b: 3, no family: 1; every task logged by two policies."""
    tasks = [(f"a{i}", "a") for i in range(10)] + [(f"b{i}", "b") for i in range(3)] + [("x", None)]
    return [_episode(t, f, m) for t, f in tasks for m in ("m1", "m2")]


def test_split_by_hand():
    splits = split_tasks(_logs(), validation=0.2, test=0.2, seed=0)
    # a: round(0.2 x 10) = 2 test, 2 validation, 6 train; b: round(0.6) = 1 and 1, 1 train; the lone
    # family-less task always trains (a split keeps at least one task of each family for training).
    count = {name: {f: sum(t.startswith(f) for t in ids) for f in "abx"} for name, ids in splits.items()}
    assert count == {"train": {"a": 6, "b": 1, "x": 1}, "validation": {"a": 2, "b": 1, "x": 0},
                     "test": {"a": 2, "b": 1, "x": 0}}
    every = [t for ids in splits.values() for t in ids]
    assert sorted(every) == sorted({e.task.id for e in _logs()})  # each task in exactly one split
    assert split_tasks(_logs(), 0.2, 0.2, seed=0) == splits
    assert split_tasks(_logs(), 0.2, 0.2, seed=1) != splits
    with pytest.raises(ValueError, match="sum below 1"):
        split_tasks(_logs(), 0.5, 0.5, seed=0)


def test_the_manifest_is_kept_and_guarded(tmp_path):
    first = manifest_for(tmp_path, _logs(), 0.2, 0.2, seed=0)
    assert json.loads((tmp_path / MANIFEST).read_text())["settings"] == {"validation": 0.2, "test": 0.2, "seed": 0}
    assert manifest_for(tmp_path, _logs()[:6], 0.2, 0.2, seed=0) == first  # fewer logs: the same split
    with pytest.raises(ConfigError, match="was drawn with"):
        manifest_for(tmp_path, _logs(), 0.3, 0.2, seed=0)
    with pytest.raises(ConfigError, match="does not cover 1 task"):
        manifest_for(tmp_path, _logs() + [_episode("new", "a")], 0.2, 0.2, seed=0)


def test_grown_logs_extend_an_earlier_split_without_moving_any_old_task(tmp_path):
    old = manifest_for(tmp_path / "old", _logs(), 0.2, 0.2, seed=0)
    # the served episodes: 200 new tasks without a family, and the old tasks again (they must not move, although
    # these new episodes would change every family's draw)
    grown = _logs() + [_episode(f"n{i}", None) for i in range(200)] + [_episode(t, None, "m3") for t in old["test"]]
    new = manifest_for(tmp_path / "new", grown, 0.2, 0.2, seed=0, extend=tmp_path / "old" / MANIFEST)
    for name in old:
        assert set(old[name]) <= set(new[name])
    for i in range(200):  # each new task where its hash draws it, whatever else arrived with it
        assert f"n{i}" in new[hashed_split(f"n{i}", 0.2, 0.2, 0)]
    shares = {name: sum(t.startswith("n") for t in new[name]) / 200 for name in new}
    assert abs(shares["test"] - 0.2) < 0.08 and abs(shares["validation"] - 0.2) < 0.08
    assert json.loads((tmp_path / "new" / MANIFEST).read_text())["extended_from"] == str(tmp_path / "old" / MANIFEST)
    assert manifest_for(tmp_path / "new", grown, 0.2, 0.2, seed=0) == new    # kept on resume
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="is not a task split"):
        manifest_for(tmp_path / "other", grown, 0.2, 0.2, seed=0, extend=tmp_path / "bad.json")


def test_training_reads_only_the_training_tasks(tmp_path):
    config = with_overrides(default.get_config("tiny"), {"data.demo": True, "data.demo_tasks": 30,
                                                         "data.holdout.validation": 0.2, "data.holdout.test": 0.2})
    prepared = prepare_data(config, tmp_path)
    splits = json.loads((tmp_path / MANIFEST).read_text())
    trained_tasks = {episode_id.split("/", 1)[1] for episode_id in prepared.replay.episode_ids}  # policy/task
    assert splits["validation"] and splits["test"]
    assert trained_tasks == set(splits["train"])


def test_folds_deal_every_training_task_to_one_fold_family_by_family():
    """Cross-validation's folds (`task_folds`): each fold holds out its own part of the training tasks (the parts
    partition them, sizes within one task), trains on the rest, and keeps the test tasks as they were; dealt round
    robin per family, so family a (10 tasks, 6 of them training) is in every one of 3 folds."""
    logs = _logs()
    splits = split_tasks(logs, validation=0.0, test=0.2, seed=0)
    train = set(splits["train"])   # a: 8, b: 2, x: 1
    folds = task_folds(splits, logs, 3, seed=0)
    held = [set(fold["validation"]) for fold in folds]
    assert sorted(t for part in held for t in part) == sorted(train)     # a partition of the training tasks
    assert sorted(len(part) for part in held) == [3, 4, 4]
    for fold, part in zip(folds, held):
        assert set(fold["train"]) == train - part and fold["test"] == splits["test"]
        assert any(t.startswith("a") for t in part)
    assert task_folds(splits, logs, 3, seed=0) == folds and task_folds(splits, logs, 3, seed=1) != folds
    with pytest.raises(ValueError, match="at least 2 folds"):
        task_folds(splits, logs, 1, seed=0)
    with pytest.raises(ValueError, match="cannot fill 12 folds"):
        task_folds(splits, logs, 12, seed=0)


def test_a_split_to_extend_is_read_even_with_nothing_more_held_out(tmp_path):
    """data.holdout.extend with both fractions 0 (a cross-validation fold's config): training reads that split's
    training tasks, not every task (extending used to apply only with a fraction above 0)."""
    config = with_overrides(default.get_config("tiny"), {"data.demo": True, "data.demo_tasks": 30,
                                                         "data.holdout.validation": 0.0, "data.holdout.test": 0.0})
    every = prepare_data(config, tmp_path / "all").replay.episode_ids
    tasks = sorted({episode_id.split("/", 1)[1] for episode_id in every})
    (tmp_path / "fold.json").write_text(json.dumps({"train": tasks[5:], "validation": tasks[:5], "test": []}))
    prepared = prepare_data(with_overrides(config, {"data.holdout.extend": str(tmp_path / "fold.json")}),
                            tmp_path / "fold")
    assert {episode_id.split("/", 1)[1] for episode_id in prepared.replay.episode_ids} == set(tasks[5:])
    assert json.loads((tmp_path / "fold" / MANIFEST).read_text())["validation"] == tasks[:5]


def test_holdout_fractions_are_checked():
    config = with_overrides(default.get_config(), {"data.holdout.validation": 0.6, "data.holdout.test": 0.5})
    assert "data.holdout: validation + test is 1.1, expected at most 0.9 (the rest of the tasks train)" in (
        config_problems(config))


def test_every_family_large_enough_gets_a_validation_and_a_test_task_and_the_rest_are_named(tmp_path, caplog):
    """At 10% / 10%, rounding alone held out nothing of a family under 5 tasks. Families of 1, 2, 3, 4 and 20 tasks:
    (test, validation) = (0, 0), (0, 1), (1, 1), (1, 1), (2, 2); a share of 0 forces nothing."""
    sizes = {"one": 1, "two": 2, "three": 3, "four": 4, "twenty": 20}
    logs = [_episode(f"{f}{i}", f) for f, n in sizes.items() for i in range(n)]
    splits = split_tasks(logs, validation=0.1, test=0.1, seed=0)
    count = {name: {f: sum(t.rstrip("0123456789") == f for t in ids) for f in sizes} for name, ids in splits.items()}
    assert count["test"] == {"one": 0, "two": 0, "three": 1, "four": 1, "twenty": 2}
    assert count["validation"] == {"one": 0, "two": 1, "three": 1, "four": 1, "twenty": 2}
    assert count["train"] == {"one": 1, "two": 1, "three": 1, "four": 2, "twenty": 16}
    no_test = split_tasks(logs, validation=0.1, test=0.0, seed=0)
    assert no_test["test"] == [] and len(no_test["validation"]) == 1 + 1 + 1 + 2
    with caplog.at_level("WARNING"):
        manifest_for(tmp_path, logs, 0.1, 0.1, 0)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(w.startswith("no validation task in 1 family too small to hold one out (e.g. 'one')") for w in warned)
    assert any(w.startswith("no test task in 2 families too small to hold one out (e.g. 'one', 'two')")
               for w in warned)
