"""Learning from live traffic end to end (issue 39): RouteSim played through the proxy over HTTP gives the
simulator's own episodes; the router as the proxy serves it is what the exact evaluation rolls out; a round of the
loop promotes only on a gain shown above 0, keeps the served router otherwise, and the experiment resumes."""

import dataclasses
import json
import shutil

import numpy as np
import pytest

from configs import routesim_live, serve
from rivet_jax import deploy, loop, ope
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode, Task, Turn, ModelPool, ModelCard, read_episodes
from rivet_jax.envs.base import FixedModelPolicy, run_episode, run_episodes
from rivet_jax.envs.collect import demo_corpus
from rivet_jax.evaluation import discounted_return
from rivet_jax.live import experiment
from rivet_jax.live.routesim import LiveEpisodes, ServedPolicy, play, upstream_app
from rivet_jax.router import Router
from rivet_jax.serve.app import make_app
from rivet_jax.serve.fake import ServerThread
from rivet_jax.serve.proxy import Proxy
from rivet_jax.serve.recorder import Recorder
from rivet_jax.serve.upstream import Backend
from tests.common import run_launcher
from tests.test_serve_swap import deploy_fixed

REWARD = Reward(0.05, 0.95, 1e-3)


def played(workdir, sim, logdir, tasks, seed, prefix):
    """`tasks` played through the proxy (greedy, serving `workdir`) in front of one RouteSim upstream, both in
    threads; episode i draws from rng((seed, i)) and is session f"{prefix}{i}". Returns (the episodes as the
    simulator saw them, the seeds, the proxy)."""
    episodes = LiveEpisodes(sim)
    seeds = [(seed, i) for i in range(len(tasks))]
    with ServerThread(upstream_app(episodes)) as upstream:
        router = Router.from_checkpoint(workdir)
        backends = {name: Backend(name, upstream.url + "/v1", name, "") for name in router.pool.names}
        proxy = Proxy(router, backends, Recorder(logdir, router.pool), serve.get_config(), workdir=workdir)
        with ServerThread(make_app(proxy)) as server:
            lived = play(server.url, episodes, tasks, seeds, [f"{prefix}{i}" for i in range(len(tasks))])
    return lived, seeds, proxy


def test_the_live_driver_reproduces_the_simulators_episodes_for_a_fixed_policy(demo_router_dir, tmp_path):
    sim, _ = demo_corpus(1)
    workdir = tmp_path / "w"
    shutil.copytree(demo_router_dir, workdir)
    deploy_fixed(workdir, sim.pool.names, "quill-plus")           # the deployed router always calls quill-plus
    tasks = [t.id for t in sim.tasks("train")[:6]]
    lived, seeds, proxy = played(workdir, sim, tmp_path / "log", tasks, 5, "s")
    recorded = {e.episode_id.rsplit("@", 1)[0]: e
                for e in read_episodes(proxy.recorder.episodes_path, sim.pool).episodes}
    for i, (task, live) in enumerate(zip(tasks, lived)):
        simulated = run_episode(sim, task, FixedModelPolicy("quill-plus"), np.random.default_rng(seeds[i]), "x")
        keys = ("model", "response", "feedback", "prompt_tokens", "completion_tokens", "cost")
        assert [[getattr(t, k) for k in keys] for t in live.turns] == [[getattr(t, k) for k in keys]
                                                                       for t in simulated.turns]
        assert live.outcome == simulated.outcome
        proxied = recorded[f"s{i}"]                               # what the proxy wrote, exactly the same values
        assert [(t.model, t.response, t.prompt_tokens, t.completion_tokens, t.cost) for t in proxied.turns] == [
            (t.model, t.response, t.prompt_tokens, t.completion_tokens, t.cost) for t in simulated.turns]
        assert [t.feedback for t in proxied.turns] == [f"[user] {t.feedback}" for t in simulated.turns[:-1]] + [""]
        assert proxied.outcome == simulated.outcome and proxied.task.prompt == simulated.task.prompt
        assert discounted_return(proxied, REWARD) == discounted_return(simulated, REWARD)
        assert all(t.propensity == 1.0 and t.router.startswith("deploy:") for t in proxied.turns)


def test_the_exact_evaluation_rolls_out_what_the_proxy_serves(demo_router_dir, tmp_path):
    sim, _ = demo_corpus(1)
    workdir = tmp_path / "w"
    shutil.copytree(demo_router_dir, workdir)                   # no deployment: the trained router as it is
    tasks = [t.id for t in sim.tasks("validation")[:5]]
    lived, seeds, _ = played(workdir, sim, tmp_path / "log", tasks, 9, "v")
    simulated = run_episodes(sim, tasks, ServedPolicy(Router.from_checkpoint(workdir)),
                             [np.random.default_rng(s) for s in seeds], [f"x{i}" for i in range(len(tasks))])
    assert [[t.model for t in e.turns] for e in lived] == [[t.model for t in e.turns] for e in simulated]
    assert [e.outcome for e in lived] == [e.outcome for e in simulated]


def test_turns_the_proxy_served_carry_exact_propensities_greedy_ones_included():
    pool = ModelPool((ModelCard("a", "model a"), ModelCard("b", "model b")))

    def episode(i, propensity, router):
        turns = (Turn("a", "r", "f", 1, 1, 0.1, propensity=propensity, router=router),
                 Turn("b", "r", "", 1, 1, 0.1, done=True, propensity=0.5, router=router))
        return Episode(f"e{i}", Task(f"t{i}", "p"), turns, 1)

    logs = ope.read_logs([episode(0, 1.0, "deploy:x"), episode(1, 1.0, None), episode(2, 0.3, None)], pool, REWARD)
    # a greedy turn the proxy served counts; propensity 1 from an unknown logger does not (a fixed-model logger)
    assert ope.logging_support(logs).episodes.tolist() == [True, False, True]


def test_the_served_router_stays_unless_a_gain_is_shown_above_zero():
    # Hand-built paired draws (B = 4 resamples, P = 3 policies, C = 3): "a" gains +0.1 with every resample above 0,
    # "b" gains more on average but one resample below 0.
    names = [loop.SERVED, "a", "b"]
    gains = {"a": [0.05, 0.1, 0.1, 0.15], "b": [-0.2, 0.3, 0.3, 0.2]}
    draws = np.zeros((4, 3, 3))
    draws[:, 1, 0], draws[:, 2, 0] = gains["a"], gains["b"]
    estimates = deploy.Estimates(names, np.array([[0.0] * 3, [0.1, 0, 0], [0.2, 0, 0]]), draws, "DR", 4)
    assert estimates.names[deploy.choose(estimates, True, loop.SERVED)] == "a"
    draws[:, 1, 0] = [-0.02, 0.1, 0.1, 0.15]
    assert estimates.names[deploy.choose(estimates, True, loop.SERVED)] == loop.SERVED


@pytest.mark.slow
def test_the_live_loop_runs_resumes_and_promotes_only_on_a_shown_gain(tmp_path, capfd):
    workdir = tmp_path / "live"
    first = run_launcher(capfd, "loop", "--config=configs/routesim_live.py:tiny", f"--workdir={workdir}",
                         "--config.live.rounds=1")
    assert first.returncode == 0, first.stderr
    one = loop.rounds_of(workdir)
    second = run_launcher(capfd, "loop", "--config=configs/routesim_live.py:tiny", f"--workdir={workdir}")
    assert second.returncode == 0, second.stderr
    rounds = loop.rounds_of(workdir)
    assert len(rounds) == 2 and rounds[0] == one[0]                 # round 1 not run again
    live = routesim_live.get_config("tiny").live
    for r in rounds:
        assert r["episodes"] == live.episodes and set(r["ope"]) >= {"estimate", "low", "high", "exact"}
        assert r["promoted"] == (r["ope"]["gain_low"] > 0)
        assert {"exact_test_regret", "exploration_cost"} <= set(r)
    for before, after in zip(rounds, rounds[1:] + [None]):
        if not before["promoted"] and after is not None:           # nothing changed: the same deployment served
            assert after["served_before"] == before["served_before"]
    recorded = read_episodes(workdir / "recorded.jsonl",
                             experiment.read_model_cards(workdir / "model_cards.json")).episodes
    assert len(recorded) == 2 * live.episodes
    assert all(t.router is not None and t.propensity is not None for e in recorded for t in e.turns)
    Router.from_checkpoint(workdir)                                 # the router served after the last round
    assert "| 2 |" in (workdir / experiment.REPORT).read_text()
    assert json.loads((workdir / "deploy.json").read_text())["deploy"]


def test_the_own_logs_choice_uses_doubly_robust_estimates_on_logs_with_exact_propensities():
    pool = ModelPool((ModelCard("a", "model a"), ModelCard("b", "model b")))
    rng = np.random.default_rng(0)

    def logs(served: bool):
        episodes = []
        for i in range(40):
            model = "a" if rng.random() < 0.7 else "b"
            turn = Turn(model, "r", "", 10, 5, 0.01, done=True, propensity=0.7 if model == "a" else 0.3,
                        router="deploy:x" if served else None, available=("a", "b"))
            episodes.append(Episode(f"e{i}", Task(f"t{i % 10}", f"p{i % 10}"), (turn,), int(rng.random() < 0.5)))
        parsed = ope.read_logs(episodes, pool, REWARD)
        return deploy.HeldOut(parsed, rng.normal(size=(len(episodes), 4)), -np.ones(len(episodes), int))

    targets = {"always a": deploy.one_hot(np.zeros(40, int), 2), "always b": deploy.one_hot(np.ones(40, int), 2)}
    recorded = logs(served=True)
    assert deploy.explored_share(recorded) == 1.0
    assert deploy.log_estimates(recorded, targets, True, 20, 0).estimator == "DR"
    unknown = logs(served=False)   # the same propensities from an unknown logger: below 1, so still usable
    assert deploy.log_estimates(unknown, targets, True, 20, 0).estimator == "DR"
    fixed = dataclasses.replace(unknown, logs=dataclasses.replace(unknown.logs,
                                                                   propensity=np.ones(40)))  # deterministic loggers
    assert deploy.explored_share(fixed) == 0.0
    assert deploy.log_estimates(fixed, targets, False, 20, 0).estimator == "FQE"


def test_crossfit_dr_is_importance_sampling_when_the_model_is_zero_and_switches_past_the_weight_limit():
    # Model fitted on logs whose rewards are all 0: Q = V = 0, so DR's terms are IS's (worked out: IS of a
    # one-turn target "always a" = mean of 1[a] / mu(a) * r). With max_weight below every weight, every episode
    # switches to the model at its first turn: the estimate is V = 0.
    pool = ModelPool((ModelCard("a", "model a"), ModelCard("b", "model b")))
    rng = np.random.default_rng(1)
    episodes = []
    for i in range(30):
        model = "a" if rng.random() < 0.6 else "b"
        turn = Turn(model, "r", "", 10, 5, 0.0, done=True, propensity=0.6 if model == "a" else 0.4,
                    router="deploy:x", available=("a", "b"))
        episodes.append(Episode(f"e{i}", Task(f"t{i % 6}", f"p{i % 6}"), (turn,), int(rng.random() < 0.5)))
    logs = ope.read_logs(episodes, pool, Reward(0.0, 1.0, 1.0))
    zero = dataclasses.replace(logs, reward=np.zeros_like(logs.reward))
    features = np.concatenate([rng.normal(size=(30, 3)), np.ones((30, 1))], axis=1)
    target = deploy.one_hot(np.zeros(30, int), 2)[None]                                 # (P = 1, N, M)
    result = ope.crossfit_dr(logs, features, target, zero, features, target, 50, 0)
    by_hand = np.mean([(e.turns[0].model == "a") / 0.6 * e.outcome for e in episodes])
    assert result["point"][0, 0] == pytest.approx(by_hand)
    assert ope.crossfit_dr(logs, features, target, zero, features, target, 50, 0, max_weight=1.0)["point"][0, 0] \
        == pytest.approx(0.0)
