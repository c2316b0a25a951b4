"""Online adaptation (stage 'online') on tiny RouteSim: schedule, validation/early stopping, best checkpoint,
learning curve, and exact resume after a kill."""

import shutil

import jax
import numpy as np
import pytest

from configs import routesim as routesim_config
from rivet_jax import checkpointing, online, train
from rivet_jax.envs.routesim import make_routesim
from rivet_jax.experiments import routesim
from rivet_jax.router import Router


class SimulatedKill(Exception):
    pass


def tiny(workdir):
    config = routesim_config.get_config("tiny")
    corpus = routesim.collect(config, workdir)
    config = routesim.training_config(config, corpus)
    config.stage = "offline"
    return config


def leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def test_epsilon_is_annealed_by_episode():
    config = routesim_config.get_config()
    assert [online.epsilon(e, config) for e in (0, 70, 140, 500)] == pytest.approx([0.10, 0.06, 0.02, 0.02])


def test_online_stage_validates_keeps_the_best_and_resumes_exactly(tmp_path):
    config = tiny(tmp_path)
    train.train(config, tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # the same offline router, twice
    sim = make_routesim(config.sim)

    straight = online.run_online(config, tmp_path / "a", sim)
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
        online.run_online(config, tmp_path / "b", sim, on_validation=kill_at_second_validation)
    resumed = online.run_online(config, tmp_path / "b", sim)
    for got, expected in zip(leaves(resumed), leaves(straight)):
        np.testing.assert_array_equal(got, expected)
    assert online.read_progress(tmp_path / "b") == progress


def test_online_needs_a_finished_td_stage(tmp_path):
    config = tiny(tmp_path)
    with pytest.raises(FileNotFoundError, match="run --config.stage=td first"):
        online.run_online(config, tmp_path / "empty", make_routesim(config.sim))
