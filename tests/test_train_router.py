"""Training stages, checkpoints (resume, refusal), the launcher and the deployable Router, on tiny configs."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rivet_jax import checkpointing, corpus, engine, stage_run, train
from rivet_jax.config_checks import ConfigError, check_config
from rivet_jax.learner import make_optimizer, template_state
from rivet_jax.settings import Optim
from rivet_jax.data.schema import ModelCard, ModelPool, write_model_cards
from rivet_jax.encoders import HashingEncoder
from rivet_jax.envs.base import RouterPolicy
from rivet_jax.envs.collect import demo_corpus
from rivet_jax.settings import with_overrides
from rivet_jax.networks import RivetNet, make_network
from rivet_jax.router import Router
from tests.common import REPO, SimulatedKill, run_launcher, run_stage, tiny_config


def demo_pool() -> ModelPool:
    return demo_corpus(0)[0].pool


def flat_params(state) -> dict:
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(state.params)}



def test_offline_training_writes_metrics_and_checkpoints(tmp_path):
    state = train.train(tiny_config(), tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    config = tiny_config()
    assert [r["stage"] for r in records] == ["mc"] * config.mc_epochs + ["td"] * config.td_epochs
    assert all(np.isfinite(r["loss"]) and r["steps_per_s"] > 0 for r in records)
    assert records[-1]["cql"] > 0 and records[0]["cql"] == 0  # CQL only in TD (logsumexp over >1 model > q_taken)
    assert checkpointing.StageCheckpoints(tmp_path, "td").latest_epoch() == config.td_epochs
    assert int(state.step) == records[-1]["step"]


@pytest.mark.slow
def test_resume_after_kill_matches_uninterrupted_run(tmp_path, monkeypatch):
    """Killed in MC, MC finished alone, TD killed, resumed: bit for bit the run done in one go. That run's TD starts
    from the MC parameters it holds (`StageRun.handed`), the interrupted run's from MC's checkpoint on disk."""
    config = tiny_config()
    read_back = stage_run.finished_params

    def not_read_back(*args, **kwargs):
        raise AssertionError("TD read back the MC parameters this process had just trained")

    monkeypatch.setattr(stage_run, "finished_params", not_read_back)
    reference = train.train(config, tmp_path / "straight")
    monkeypatch.setattr(stage_run, "finished_params", read_back)

    def kill_in_td(stage, epoch, record):
        if stage == "td" and epoch == 2:
            raise SimulatedKill

    def kill_in_mc(stage, epoch, record):
        if stage == "mc" and epoch == 1:
            raise SimulatedKill

    interrupted = tmp_path / "interrupted"
    with pytest.raises(SimulatedKill):
        train.train(config, interrupted, on_epoch_end=kill_in_mc)
    train.train(with_overrides(config, {"stage": "mc"}), interrupted)
    with pytest.raises(SimulatedKill):
        train.train(config, interrupted, on_epoch_end=kill_in_td)
    resumed = train.train(config, interrupted)
    expected, got = flat_params(reference), flat_params(resumed)
    assert expected.keys() == got.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    assert int(resumed.step) == int(reference.step)


def test_td_requires_finished_mc(tmp_path):
    with pytest.raises(FileNotFoundError, match="run --config.stage=mc first"):
        run_stage(tiny_config(), tmp_path, "td")


def test_non_finite_loss_stops_with_step_and_episodes(tmp_path):
    config = tiny_config()
    prepared = corpus.prepare_data(config, tmp_path)
    bad_return = prepared.data.replay["mc_return"].at[:].set(jnp.nan)
    broken = corpus.PreparedData(**{**prepared.__dict__, "data": prepared.data.replace(
        replay={**prepared.data.replay, "mc_return": bad_return})})
    with pytest.raises(checkpointing.NonFiniteError, match=r"step 1; the batch held episodes \['(fixed:|random/)"):
        run_stage(config, tmp_path, "mc", prepared=broken)
    assert checkpointing.StageCheckpoints(tmp_path, "mc").latest_epoch() is None  # nothing diverged was saved


def _cards_with_changed_price(tmp_path: Path) -> Path:
    cards = list(demo_pool().cards)
    cards[0] = ModelCard(**{**cards[0].__dict__, "price_in_per_mtok": cards[0].price_in_per_mtok * 2})
    path = tmp_path / "changed_cards.json"
    write_model_cards(path, ModelPool(tuple(cards)))
    return path


def test_checkpoint_refused_for_other_pool_or_encoder(tmp_path):
    config = tiny_config()
    run_stage(config, tmp_path, "mc")
    episodes = tmp_path / "data" / "episodes.jsonl"
    other_pool = tiny_config(**{"data.episodes": str(episodes), "data.cards": str(_cards_with_changed_price(tmp_path))})
    with pytest.raises(checkpointing.CheckpointMismatchError, match="price_in_per_mtok"):
        run_stage(other_pool, tmp_path, "td")
    with pytest.raises(checkpointing.CheckpointMismatchError, match="encoder"):
        Router.from_checkpoint(tmp_path, encoder=HashingEncoder(dim=32))
    fewer = ModelPool(demo_pool().cards[:3])
    with pytest.raises(checkpointing.CheckpointMismatchError, match=demo_pool().names[-1]):
        Router.from_checkpoint(tmp_path, pool=fewer)


@pytest.mark.slow
def test_launcher_stages_then_router(tmp_path):
    workdir = tmp_path / "run"
    for stage in ("mc", "td"):
        result = subprocess.run([sys.executable, "-m", "launch.train", "--config=configs/default.py:tiny",
                                 f"--workdir={workdir}", f"--config.stage={stage}", "--config.data.demo=True"],
                                cwd=REPO, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
    assert "Resuming" not in result.stderr
    router = Router.from_checkpoint(workdir)
    pool = demo_pool()
    assert router.pool.names == pool.names

    episode = demo_corpus(1, seed=11)[1][0]
    history = episode.turns[:1]
    decision = router.route(episode.task.prompt, history)
    assert decision.model in pool.names
    assert decision.model == max(decision.scores, key=decision.scores.get)
    assert all(np.isfinite(v) for v in decision.scores.values())

    # Availability: the choice is the best *available* model; the others score -inf.
    ranked = sorted(decision.scores, key=decision.scores.get, reverse=True)
    subset = ranked[1:3]
    limited = router.route(episode.task.prompt, history, available=subset)
    assert limited.model == ranked[1]
    assert {n for n, v in limited.scores.items() if v == -np.inf} == set(pool.names) - set(subset)
    for name in subset:
        assert limited.scores[name] == pytest.approx(decision.scores[name])

    # Batched scores agree with single decisions; history can be plain dicts.
    as_dicts = [{"response": t.response, "feedback": t.feedback} for t in history]
    batch = router.scores([(episode.task.prompt, history), (episode.task.prompt, []),
                           (episode.task.prompt, as_dicts)])
    assert batch.shape == (3, len(pool))
    np.testing.assert_allclose(batch[0], [decision.scores[n] for n in pool.names], rtol=1e-5)
    np.testing.assert_allclose(batch[2], batch[0], rtol=1e-6)

    # An ensemble scores with the mean Q_route of its members (here the MC and TD checkpoints of one run), and only
    # members that agree on everything but parameters combine.
    states = [(episode.task.prompt, history), (episode.task.prompt, [])]
    mc = Router.from_checkpoint(workdir, stage="mc")
    both = Router.ensemble([mc, router])
    np.testing.assert_allclose(both.scores(states), (mc.scores(states) + batch[:2]) / 2, rtol=1e-5, atol=1e-6)
    assert both.members == 2 and Router.ensemble([both, router]).members == 3
    # pessimism c: mean - c * sd over the members; with two members the sd is half their difference
    q_mc, q_td = mc.scores(states), batch[:2]
    np.testing.assert_allclose(Router.ensemble([mc, router], pessimism=2.0).scores(states),
                               (q_mc + q_td) / 2 - np.abs(q_mc - q_td), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="pessimism must be a finite number >= 0"):
        Router.ensemble([mc, router], pessimism=-1.0)
    other = copy.copy(mc)
    other.config = with_overrides(mc.config, {"reward.lam": 0.5})
    with pytest.raises(ValueError, match="member 1 does not match member 0: reward"):
        Router.ensemble([router, other])

    # The router is the trained RVE: same numbers as the network on the training state embedding.
    config = tiny_config()
    trained = run_stage(config, workdir, "td")  # already complete: restores, trains nothing
    h = router.encoder.encode([router.state_text(episode.task.prompt, history)])
    cards = (router.encoder.encode([c.description for c in pool.cards]), *router._cards[1:])
    direct = make_network(config).apply({"params": trained.params}, jnp.asarray(h), cards, method=RivetNet.q_route)
    np.testing.assert_allclose(batch[0], np.asarray(direct)[0], rtol=1e-5, atol=1e-6)

    with pytest.raises(ValueError, match="unknown models"):
        router.route(episode.task.prompt, history, available=["no-such-model"])

    # Batched rollouts: a batch of pending decisions (padded to a power of two rows inside) is decided exactly as
    # each decision alone.
    policy, rng = RouterPolicy(router), np.random.default_rng(0)
    requests = [(e.task, e.turns[:t], pool.names if t % 2 else pool.names[1:4], rng)
                for e in demo_corpus(2, seed=4)[1] for t in range(len(e.turns))]
    assert len(requests) & (len(requests) - 1)  # not a power of two: the padded rows are really cut off
    assert policy.act_batch(requests) == [policy.act(*request) for request in requests]


@pytest.mark.slow
def test_each_stage_compiles_its_epoch_once_even_when_resumed(tmp_path, monkeypatch):
    """Restored and freshly computed states must hit the same compiled epoch (no second compile per stage)."""
    made = []
    original = engine.make_group_epoch

    def recording(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(engine, "make_group_epoch", recording)
    config = tiny_config()
    run_stage(config, tmp_path, "mc")           # fresh
    run_stage(config, tmp_path, "td")           # starts from the restored MC parameters

    def kill(stage, epoch, record):
        if epoch == 1:
            raise SimulatedKill

    with pytest.raises(SimulatedKill):
        run_stage(config, tmp_path / "b", "mc", on_epoch_end=kill)
    run_stage(config, tmp_path / "b", "mc")     # resumed from a restored MC state
    assert [getattr(f, "program", f)._cache_size() for f in made] == [1, 1, 1, 1]   # a CPU's runs step in turn


@pytest.mark.slow
def test_launcher_killed_mid_stage_resumes_to_the_same_parameters(tmp_path, capfd, monkeypatch):
    """A real SIGKILL of the launcher's process, then the same command again: same final parameters as a straight
    run (the straight run and the resumed command run in this process; only the killed one needs its own)."""
    import signal
    import time

    epochs = 20   # each saves a checkpoint: the kill, three epochs in, lands with most of them to go
    args = ["--config=configs/default.py:tiny", "--config.stage=mc", f"--config.mc_epochs={epochs}",
            "--config.data.demo=True"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    config = tiny_config(mc_epochs=epochs)
    expected = flat_params(run_stage(config, straight, "mc"))
    process = subprocess.Popen([sys.executable, "-m", "launch.train", f"--workdir={killed}", *args], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = killed / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.02)
    assert process.poll() is None, "the run ended before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    done_before_kill = checkpointing.StageCheckpoints(killed, "mc").latest_epoch()
    assert done_before_kill is not None and done_before_kill < epochs
    monkeypatch.chdir(REPO)
    resumed = run_launcher(capfd, "train", f"--workdir={killed}", *args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming stage mc" in resumed.stderr

    got = flat_params(run_stage(config, killed, "mc"))  # complete: restores only
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_launcher_reports_bad_logs_as_one_clear_line(tmp_path, capfd, monkeypatch):
    episodes = demo_corpus(3, seed=1)[1][:3]
    good = [json.dumps(e.to_json()) for e in episodes]
    broken = json.loads(good[1])
    broken["turns"][0]["cost"] = -1.0
    path = tmp_path / "episodes.jsonl"
    path.write_text("\n".join([good[0], json.dumps(broken), good[2]]) + "\n")
    cards = tmp_path / "cards.json"
    write_model_cards(cards, demo_pool())
    monkeypatch.chdir(REPO)
    result = run_launcher(capfd, "train", "--config=configs/default.py:tiny", f"--workdir={tmp_path / 'w'}",
                          f"--config.data.episodes={path}", f"--config.data.cards={cards}")
    assert result.returncode == 1
    assert f"{path}:2: field 'turns[0].cost'" in result.stderr
    assert "Traceback" not in result.stderr


def test_launcher_without_logs_refuses_in_one_line(tmp_path, capfd, monkeypatch):
    """No --config.data.episodes and no demo asked for: never train on synthetic data silently."""
    monkeypatch.chdir(REPO)
    result = run_launcher(capfd, "train", "--config=configs/default.py:tiny", f"--workdir={tmp_path / 'w'}")
    assert result.returncode == 1
    assert "no logs to train on: pass --config.data.episodes" in result.stderr
    assert "--config.data.demo=True" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "w" / "data").exists()


def test_a_warm_started_run_starts_from_the_checkpoint_it_names_and_refuses_one_it_cannot_use(demo_router_dir,
                                                                                              tmp_path):
    config = tiny_config()
    prepared = corpus.prepare_data(config, tmp_path / "reference")
    like = template_state(config.seed, make_network(config), make_optimizer(Optim.of(config)),
                          prepared.data.embeddings.shape[1], prepared.pool, "td").params
    kept = checkpointing.StageCheckpoints(demo_router_dir, "td", max_to_keep=None)
    epochs = kept.epochs()
    expected = {epoch: kept.restore_params(like, epoch)[0] for epoch in epochs}
    kept.close()
    assert len(epochs) >= 2   # two different starting points to tell apart

    def start(stage, warm_start, workdir, **overrides):
        config = tiny_config(stage=stage, warm_start=warm_start, **overrides)
        prepared = corpus.prepare_data(config, workdir)
        first = {"offline": "mc"}.get(stage, stage)
        run = stage_run.StageRun.open(config, workdir, first, prepared)
        try:
            return run.start(make_network(config), make_optimizer(Optim.of(config))).params
        finally:
            run.close()

    def same(a, b):
        jax.tree.map(np.testing.assert_array_equal, a, b)

    same(start("td", f"{demo_router_dir}:td", tmp_path / "a"), expected[epochs[-1]])     # TD from it, not from MC
    same(start("td", f"{demo_router_dir}:td@{epochs[0]}", tmp_path / "b"), expected[epochs[0]])
    same(start("offline", f"{demo_router_dir}:td", tmp_path / "c"), expected[epochs[-1]])   # MC from it
    assert not jax.tree.all(jax.tree.map(np.array_equal, start("offline", "", tmp_path / "d"),
                                         expected[epochs[-1]]))                          # '' is initialisation
    with pytest.raises(FileNotFoundError, match="kept no epoch 99"):
        start("td", f"{demo_router_dir}:td@99", tmp_path / "e")
    with pytest.raises(FileNotFoundError, match="no checkpoints of stage 'td'"):
        start("td", f"{tmp_path / 'nowhere'}:td", tmp_path / "f")
    assert not (tmp_path / "nowhere").exists()                                         # nothing created there
    with pytest.raises(checkpointing.CheckpointMismatchError, match="encoder"):
        start("td", f"{demo_router_dir}:td", tmp_path / "g", **{"encoder.dim": 32})
    for bad in (str(demo_router_dir), f"{demo_router_dir}:rl", f"{demo_router_dir}:td@last"):
        with pytest.raises(ConfigError, match="warm_start"):
            check_config(tiny_config(warm_start=bad))
