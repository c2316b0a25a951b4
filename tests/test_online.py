"""Online adaptation (stage 'online') on tiny RouteSim: schedule, validation/early stopping, best checkpoint,
learning curve, and exact resume after a kill."""

import shutil

import jax
import numpy as np
import pytest

from configs import routesim as routesim_config
from rivet_jax import checkpointing, corpus, online, online_curve, runs, stage_run, train
from rivet_jax.envs.routesim import make_routesim
from rivet_jax.settings import with_overrides
from rivet_jax.router import Router


class SimulatedKill(Exception):
    pass


def tiny(workdir):
    config = routesim_config.get_config("tiny")
    corpus = runs.collected_corpus(config, workdir)
    config = runs.training_config(config, corpus)
    config.stage = "offline"
    return config


def adapt(config, workdir, sim, on_validation=None):
    """The online stage of one run, called directly (a group of one) to reach its validation hook."""
    prepared = corpus.prepare_data(config, workdir, c_ref=stage_run.stored_c_ref(workdir))
    return online.adapt_group([config], [workdir], sim, [prepared], on_validation)[0]


def leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def test_epsilon_is_annealed_by_episode():
    config = routesim_config.get_config()
    assert [online.epsilon(e, config) for e in (0, 70, 140, 500)] == pytest.approx([0.10, 0.06, 0.02, 0.02])


@pytest.mark.slow
def test_online_stage_validates_keeps_the_best_and_resumes_exactly(tmp_path):
    config = tiny(tmp_path)
    train.train(config, tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # the same offline router, twice
    sim = make_routesim(config.sim)

    straight = adapt(config, tmp_path / "a", sim)
    progress = online.read_progress(tmp_path / "a")
    validations = progress["validations"]
    every = config.online.validate_every
    assert [v["trajectories"] for v in validations] == list(range(0, progress["trajectories"] + 1, every))
    # the result is the best validation checkpoint, and the run stopped by the rule: patience after the minimum
    best = max(validations, key=lambda v: v["val_return"])
    assert progress["best_at"] == best["trajectories"]
    assert checkpointing.StageCheckpoints(tmp_path / "a", "online").latest_epoch() == best["trajectories"]
    stopped_early = progress["trajectories"] < config.online.max_passes * len(sim.tasks("train"))
    if stopped_early:
        assert progress["trajectories"] >= config.online.early_stop_after and progress["since_best"] >= 2
    assert [p["trajectories"] for p in progress["curve"]] == [p for p in config.online.curve_points
                                                              if p <= progress["trajectories"]]
    assert all({"accuracy", "cost", "return"} <= set(p) for p in progress["curve"])
    assert Router.from_checkpoint(tmp_path / "a").pool.names == sim.pool.names  # the online stage is the router

    def kill_at_second_validation(record):
        if record["trajectories"] == 2 * every:
            raise SimulatedKill

    with pytest.raises(SimulatedKill):
        adapt(config, tmp_path / "b", sim, on_validation=kill_at_second_validation)
    resumed = adapt(config, tmp_path / "b", sim)
    for got, expected in zip(leaves(resumed), leaves(straight)):
        np.testing.assert_array_equal(got, expected)
    assert online.read_progress(tmp_path / "b") == progress

    # The curve drawn after the stage from the routers kept at its points (killed and resumed on the way) is the
    # curve drawn in the stage, to the last digit; the stage itself is unchanged
    deferred = with_overrides(config, {"online.defer_curve": True})
    shutil.copytree(tmp_path / "a", tmp_path / "c", ignore=shutil.ignore_patterns("online*"))
    with pytest.raises(SimulatedKill):
        adapt(deferred, tmp_path / "c", sim, on_validation=kill_at_second_validation)
    adapt(deferred, tmp_path / "c", sim)
    kept = online.read_progress(tmp_path / "c")
    assert kept["curve"] == [] and online_curve.kept_points(tmp_path / "c") == [p["trajectories"]
                                                                                for p in progress["curve"]]
    without_curve = [{k: v for k, v in record.items() if not k.startswith("test_")}
                     for record in progress["validations"]]
    assert {**kept, "validations": kept["validations"]} == {**progress, "curve": [], "validations": without_curve}
    online_curve.draw_curves([tmp_path / "a", tmp_path / "c"], sim)   # "a" drew its own: left as it is
    assert online.read_progress(tmp_path / "c") == {**progress, "validations": without_curve}
    assert online.read_progress(tmp_path / "a") == progress


def test_online_needs_a_finished_td_stage(tmp_path):
    config = tiny(tmp_path)
    with pytest.raises(FileNotFoundError, match="run --config.stage=td first"):
        train.train(with_overrides(config, {"stage": "online"}), tmp_path / "empty")


@pytest.mark.slow
def test_a_non_finite_online_loss_is_the_one_non_finite_error(tmp_path):
    """Infinite logged rewards make the first online update's TD target infinite: the stage stops with the same
    NonFiniteError (a launcher's one-line user error) as the offline stages, naming its step and its settings."""
    config = tiny(tmp_path)
    train.train(config, tmp_path / "a")
    prepared = corpus.prepare_data(config, tmp_path / "a", c_ref=stage_run.stored_c_ref(tmp_path / "a"))
    replay = {**prepared.data.replay, "reward": prepared.data.replay["reward"] + np.inf}
    broken = corpus.PreparedData(**{**prepared.__dict__, "data": prepared.data.replace(replay=replay)})
    with pytest.raises(checkpointing.NonFiniteError, match=r"stage online of .*a \(trajectory 1\): non-finite loss "
                                                           r".* at step 1; at the stage's first step: suspect the "
                                                           r"config \(online.lr=3e-05, reward.lam="):
        online.adapt_group([config], [tmp_path / "a"], make_routesim(config.sim), [broken])
    assert checkpointing.StageCheckpoints(tmp_path / "a", "online").latest_epoch() == 0  # only the offline router


@pytest.mark.slow
def test_a_replay_that_grows_as_it_fills_adapts_exactly_as_one_with_room_for_every_pass(tmp_path, monkeypatch):
    """The new replay starts small and doubles when full: the updates read only filled rows, so the run equals one
    whose replay had room for every trajectory of every pass from the start."""
    config = tiny(tmp_path)
    train.train(config, tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    sim = make_routesim(config.sim)
    monkeypatch.setattr(online, "first_capacity", lambda config, max_turns, filled, most: most)
    roomy = adapt(config, tmp_path / "a", sim)
    capacities = []
    reserve = online.RunChunks.reserve

    def recording_reserve(chunks, c, rows):
        reserve(chunks, c, rows)
        capacities.append(chunks.replays[c].action.shape[1])

    monkeypatch.setattr(online.RunChunks, "reserve", recording_reserve)
    monkeypatch.setattr(online, "first_capacity", lambda config, max_turns, filled, most: max_turns)
    growing = adapt(config, tmp_path / "b", sim)
    most = online.max_rows(sim, config)
    grown = sorted(set(capacities))
    assert len(grown) >= 3 and grown[-1] <= most                          # it grew, doubling, never past the most
    assert all(b == min(2 * a, most) or b > 2 * a for a, b in zip(grown, grown[1:]))
    for got, expected in zip(leaves(growing), leaves(roomy)):
        np.testing.assert_array_equal(got, expected)
    assert online.read_progress(tmp_path / "b") == online.read_progress(tmp_path / "a")


def test_with_capacity_pads_a_runs_rows_with_empty_rows():
    rows = online.empty_replay(2, 3, 4)._replace(action=np.array([5, 6], np.int32), h_t=np.ones((2, 3), np.float32))
    padded = online.with_capacity(rows, 5)
    empty = online.empty_replay(5, 3, 4)
    assert padded.h_t.shape == (5, 3) and padded.available.shape == (5, 4)
    np.testing.assert_array_equal(padded.action, [5, 6, 0, 0, 0])
    np.testing.assert_array_equal(padded.h_t[:2], 1.0)
    np.testing.assert_array_equal(padded.h_t[2:], 0.0)
    np.testing.assert_array_equal(padded.available, empty.available)        # empty rows: every model available
