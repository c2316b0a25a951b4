"""Learning from live traffic end to end (issue 39): RouteSim played through the proxy over HTTP gives the
simulator's own episodes; the router as the proxy serves it is what the exact evaluation rolls out; a round of the
loop promotes only on a gain shown above 0, keeps the served router otherwise, and the experiment resumes."""

import dataclasses
import json
import platform
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from configs import routesim_live, serve
from rivet_jax import deploy, heldout, loop, ope
from rivet_jax.checkpointing import StageCheckpoints
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode, Task, Turn, ModelPool, ModelCard, read_episodes
from rivet_jax.envs.base import FixedModelPolicy, run_episode, run_episodes
from rivet_jax.envs.collect import demo_corpus
from rivet_jax.evaluation import discounted_return
from rivet_jax.live import experiment
from rivet_jax.live.routesim import LiveEpisodes, ServedPolicy, play, upstream_app
from rivet_jax.deployment_file import read_deployment_spec
from rivet_jax.router import Router
from rivet_jax.serve.served import deployment_version
from rivet_jax.serve.app import make_app
from rivet_jax.serve.fake import ServerThread
from rivet_jax.serve.policy import Exploration
from rivet_jax.serve.proxy import Proxy
from rivet_jax.serve.recorder import Recorder
from rivet_jax.serve.upstream import Backend
from tests.common import run_launcher
from tests.test_serve_swap import deploy_fixed

REWARD = Reward(0.05, 0.95, 1e-3)


def played(workdir, sim, logdir, tasks, seed, prefix, config=None):
    """`tasks` played through the proxy (serving `workdir`, greedy or as `config` says) in front of one RouteSim
    upstream, both in threads; episode i draws from rng((seed, i)) and is session f"{prefix}{i}". Returns (the
    episodes as the simulator saw them, the seeds, the proxy)."""
    episodes = LiveEpisodes(sim)
    seeds = [(seed, i) for i in range(len(tasks))]
    with ServerThread(upstream_app(episodes)) as upstream:
        router = Router.from_checkpoint(workdir)
        backends = {name: Backend(name, upstream.url + "/v1", name, "") for name in router.pool.names}
        proxy = Proxy(router, backends, Recorder(logdir, router.pool), config or serve.get_config(), workdir=workdir)
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


def test_the_exact_exploring_policy_draws_what_the_proxy_draws_under_its_budget(demo_router_dir, tmp_path):
    sim, _ = demo_corpus(1)
    workdir = tmp_path / "w"
    shutil.copytree(demo_router_dir, workdir)
    tasks = [t.id for t in sim.tasks("validation")[:6]]
    config = serve.get_config()
    config.update(exploration="softmax", temperature=1.0, exploration_budget=0.01, seed=4)
    lived, seeds, proxy = played(workdir, sim, tmp_path / "log", tasks, 9, "b", config)
    report = proxy.budget.report()
    assert report["explored"] > 0 and report["greedy_for_budget"] > 0            # it explored, then the budget held it
    served = ServedPolicy(Router.from_checkpoint(workdir), Exploration("softmax", temperature=1.0), seed=4,
                          budget=0.01)
    assert served.sequential
    # one after another, as the proxy served them: the same models with the same propensities
    simulated = [run_episode(sim, task, served, np.random.default_rng(s), "x") for task, s in zip(tasks, seeds)]
    assert [[(t.model, t.propensity) for t in e.turns] for e in lived] == [
        [(t.model, pytest.approx(t.propensity, rel=1e-5)) for t in e.turns] for e in simulated]
    assert served.budget.report()["explored"] == report["explored"]
    # exact_value rolls a budgeted policy out in that order too (stepped together, its budget would be spent on the
    # first turns of every episode before any second turn)
    def budgeted():
        return ServedPolicy(Router.from_checkpoint(workdir), Exploration("softmax", temperature=1.0), seed=4,
                            budget=0.01)

    value = experiment.exact_value(sim, budgeted(), tasks, 1, 9, REWARD)
    in_turn = budgeted()
    one_by_one = [run_episode(sim, task, in_turn, np.random.default_rng([9, 0, i]), "y") for i, task in enumerate(tasks)]
    assert value == pytest.approx(np.mean([discounted_return(e, REWARD) for e in one_by_one]), abs=1e-12)


def test_turns_the_proxy_served_carry_exact_propensities_greedy_ones_included():
    pool = ModelPool((ModelCard("a", "model a"), ModelCard("b", "model b")))

    def episode(i, propensity, router):
        turns = (Turn("a", "r", "f", 1, 1, 0.1, propensity=propensity, router=router),
                 Turn("b", "r", "", 1, 1, 0.1, done=True, propensity=0.5, router=router))
        return Episode(f"e{i}", Task(f"t{i}", "p"), turns, 1)

    logs = ope.read_logs([episode(0, 1.0, "deploy:x"), episode(1, 1.0, None), episode(2, 0.3, None)], pool, REWARD)
    # a greedy turn the proxy served counts; propensity 1 from an unknown logger does not (a fixed-model logger)
    assert ope.logging_support(logs).episodes.tolist() == [True, False, True]


def paired(names, point, gains):
    """Estimates of `names` (the served router first, J 0) with J point estimates `point` and B = 4 bootstrap
    draws of J: each policy's listed paired gains over the served router (0 if not listed)."""
    draws = np.zeros((4, len(names), 3))
    for p, name in enumerate(names):
        draws[:, p, 0] = gains.get(name, 0.0)
    return heldout.Estimates(names, np.array([[x, 0, 0] for x in point]), draws, "DR", 4)


def test_a_round_promotes_the_candidate_chosen_on_one_half_only_on_a_gain_shown_on_the_other():
    names = [loop.SERVED, "a", "b"]
    selection = paired(names, [0.0, 0.1, 0.2], {"a": [0.1] * 4, "b": [0.2] * 4})      # b: the best estimate
    shown_by_b = paired(names, [0.0, 0.1, 0.15], {"a": [0.05, 0.1, 0.1, 0.15], "b": [0.1, 0.15, 0.2, 0.15]})
    assert loop.decide(selection, shown_by_b) == (2, True)
    # b's gain not shown on the proving half: the served router stays, though a's would have been (choosing a
    # there would be choosing on the proving half)
    not_shown = paired(names, [0.0, 0.1, 0.15], {"a": [0.05, 0.1, 0.1, 0.15], "b": [-0.2, 0.3, 0.3, 0.2]})
    assert loop.decide(selection, not_shown) == (2, False)
    # the served router is never the candidate, whatever its estimate
    assert loop.decide(paired(names, [0.5, 0.1, 0.2], {}), shown_by_b)[0] == 2


def test_proving_on_the_other_half_keeps_the_false_promotions_rare_that_the_same_half_makes_routine():
    # 100 candidates exactly as good as the served router; per task, every policy's estimate is noise. Chosen and
    # proved on the same tasks, the best-looking candidate's interval is above 0 in about half the trials (the
    # winner's curse: the largest of 100 draws sits ~2.5 SD out, the served router's noise is shared); proved on
    # the other half, as often as a 95% interval's lower end misses: ~2.5%.
    rng = np.random.default_rng(0)
    names = [loop.SERVED] + [f"c{i}" for i in range(100)]
    same = halves = 0
    for trial in range(40):
        per_task = rng.normal(size=(len(names), 60, 3))                                        # (P, T, C)
        first, second = per_task[:, :30], per_task[:, 30:]

        def estimates(values):
            return heldout.Estimates(names, values.mean(axis=1), heldout.task_bootstrap(values, 200, trial), "DR",
                                    values.shape[1])

        same += loop.decide(estimates(per_task), estimates(per_task))[1]
        halves += loop.decide(estimates(first), estimates(second))[1]
    assert same >= 12 and halves <= 4, (same, halves)


def test_task_halves_split_whole_tasks_at_random_and_need_two():
    pool = ModelPool((ModelCard("a", "model a"), ModelCard("b", "model b")))

    def held(tasks):
        turn = Turn("a", "r", "", 1, 1, 0.0, done=True, propensity=0.5, router="deploy:x", available=("a", "b"))
        episodes = [Episode(f"e{i}", Task(t, f"p{t}"), (turn,), 1) for i, t in enumerate(tasks)]
        return heldout.HeldOut(ope.read_logs(episodes, pool, REWARD), np.zeros((len(tasks), 2)),
                              -np.ones(len(tasks), int))

    tasks = [f"t{i % 7}" for i in range(30)]
    first, second = loop.task_halves(held(tasks), 3)
    assert (first ^ second).all()                                               # every episode in exactly one half
    in_first = {t for t, keep in zip(tasks, first) if keep}
    assert in_first.isdisjoint({t for t, keep in zip(tasks, second) if keep}) and len(in_first) == 3
    assert (loop.task_halves(held(tasks), 3)[0] == first).all()              # the seed fixes the halves
    assert any((loop.task_halves(held(tasks), s)[0] != first).any() for s in range(4, 10))
    with pytest.raises(ValueError, match="at least 2"):
        loop.task_halves(held(["t0"] * 5), 0)


@pytest.mark.slow
def test_the_live_loop_runs_resumes_and_promotes_only_on_a_shown_gain(tmp_path, capfd, caplog):
    workdir = tmp_path / "live"
    first = run_launcher(capfd, "loop", "--config=configs/routesim_live.py:tiny", f"--workdir={workdir}",
                         "--config.live.rounds=1")
    assert first.returncode == 0, first.stderr
    played = [r.getMessage() for r in caplog.records if "episodes played through the proxy" in r.getMessage()]
    # the rounds' progress, no line per call: httpx (proxy -> upstreams) and httpx2 (the openai SDK's, driver -> proxy)
    assert played and not any(r.name.startswith("httpx") for r in caplog.records)
    one = loop.rounds_of(workdir)
    # Round 2 serves a router that routes (tiny's round 1 shows no gain: deployed here by hand, as an operator would),
    # so it trains warm candidates from it
    routing = {"name": "round 1's own run", "runs": ["rounds/1"], "stage": "td", "epoch": None, "pessimism": 0.0,
               "commit": False, "recentring": None}
    deploy.write_deployment(workdir, routing, {"deployed_by": "tests/test_live.py"})
    hand_deployed = deployment_version(workdir)
    second = run_launcher(capfd, "loop", "--config=configs/routesim_live.py:tiny", f"--workdir={workdir}")
    assert second.returncode == 0, second.stderr
    rounds = loop.rounds_of(workdir)
    assert len(rounds) == 2 and rounds[0] == one[0]                 # round 1 not run again
    live = routesim_live.get_config("tiny").live
    for r in rounds:
        assert r["episodes"] == live.episodes and set(r["ope"]) >= {"estimate", "low", "high", "exact"}
        assert r["promoted"] == (r["ope"]["gain_low"] > 0)
        assert {"exact_test_regret", "exploration_cost"} <= set(r)
        exact = {row["policy"]: row["exact"] for row in r["candidates"]}   # every candidate's, beside its estimate
        assert all(np.isfinite(v) for v in exact.values())
        best = r["best_candidate"]
        assert exact[best["name"]] == best["exact"] == max(exact.values())
        assert exact[best["name"]] - exact[r["candidate"]] == best["shortfall_of_candidate"]
    assert rounds[1]["served_before"] == hand_deployed
    # round 1 served the cold start's fixed model (its floors decide), round 2 a router that reads Q_route
    assert [r["exploration_budget"] for r in rounds] == [live.fixed_budget, live.budget]
    if rounds[1]["promoted"]:
        assert Path(read_deployment_spec(workdir)["runs"][0]).parts[:2] == ("rounds", "2")   # a run of round 2's
    else:                                                           # nothing shown: the same deployment served
        assert deployment_version(workdir) == hand_deployed
    warm = [row["policy"] for row in rounds[1]["candidates"] if row["policy"].startswith(loop.WARM)]
    assert "warm td" in warm and not any(row["policy"].startswith(loop.WARM) for row in rounds[0]["candidates"])
    warm_epochs = routesim_live.get_config("tiny").loop.warm_epochs
    assert StageCheckpoints(workdir / "rounds" / "2" / "warm" / "0", "td").latest_epoch() == warm_epochs
    recorded = read_episodes(workdir / "recorded.jsonl",
                             experiment.read_model_cards(workdir / "model_cards.json")).episodes
    assert len(recorded) == 2 * live.episodes
    assert all(t.router is not None and t.propensity is not None for e in recorded for t in e.turns)
    Router.from_checkpoint(workdir)                                 # the router served after the last round
    report = (workdir / experiment.REPORT).read_text()
    assert "| 2 |" in report
    # each round names the versions it ran under (a rerun under others gives other numbers: docs/live.md, live12)
    assert all(r["environment"]["jax"] == jax.__version__ and r["environment"]["numpy"] == np.__version__
               for r in rounds)
    assert f"Rounds 1, 2 ran under python {platform.python_version()}, jax {jax.__version__}," in report
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
        return heldout.HeldOut(parsed, rng.normal(size=(len(episodes), 4)), -np.ones(len(episodes), int))

    targets = {"always a": deploy.one_hot(np.zeros(40, int), 2), "always b": deploy.one_hot(np.ones(40, int), 2)}
    recorded = logs(served=True)
    assert heldout.explored_share(recorded) == 1.0
    assert heldout.log_estimates(recorded, targets, True, 20, 0).estimator == "DR"
    unknown = logs(served=False)   # the same propensities from an unknown logger: below 1, so still usable
    assert heldout.log_estimates(unknown, targets, True, 20, 0).estimator == "DR"
    fixed = dataclasses.replace(unknown, logs=dataclasses.replace(unknown.logs,
                                                                   propensity=np.ones(40)))  # deterministic loggers
    assert heldout.explored_share(fixed) == 0.0
    assert heldout.log_estimates(fixed, targets, False, 20, 0).estimator == "FQE"


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


def test_crossfit_parts_are_the_estimates_on_each_parts_episodes_alone():
    # One model fitted on `fit`, so a part's estimates (point and resamples) are those of the part's episodes as
    # held-out logs of their own.
    pool = ModelPool((ModelCard("a", "model a"), ModelCard("b", "model b")))
    rng = np.random.default_rng(2)

    def logs(n, prefix):
        episodes = []
        for i in range(n):
            model = "a" if rng.random() < 0.6 else "b"
            turn = Turn(model, "r", "", 10, 5, 0.01, done=True, propensity=0.6 if model == "a" else 0.4,
                        router="deploy:x", available=("a", "b"))
            episodes.append(Episode(f"{prefix}{i}", Task(f"{prefix}t{i % 8}", "p"), (turn,), int(rng.random() < 0.5)))
        return episodes

    def held(episodes):
        h = np.concatenate([rng.normal(size=(len(episodes), 3)), np.ones((len(episodes), 1))], axis=1)
        return heldout.HeldOut(ope.read_logs(episodes, pool, REWARD), h[:, :3], -np.ones(len(episodes), int))

    held_episodes, fit = logs(40, "h"), held(logs(60, "f"))
    whole = held(held_episodes)
    targets = {"always a": deploy.one_hot(np.zeros(40, int), 2), "always b": deploy.one_hot(np.ones(40, int), 2)}
    fit_targets = {"always a": deploy.one_hot(np.zeros(60, int), 2), "always b": deploy.one_hot(np.ones(60, int), 2)}
    first, second = loop.task_halves(whole, 0)
    parts = heldout.crossfit_parts(whole, targets, fit, fit_targets, [first, second], 30, 0)
    for mask, part in zip((first, second), parts):
        alone = heldout.HeldOut(ope.read_logs([e for e, k in zip(held_episodes, mask) if k], pool, REWARD),
                               whole.h[mask], whole.previous[mask])
        expected = heldout.crossfit_estimates(alone, {n: t[mask] for n, t in targets.items()}, fit, fit_targets, 30, 0)
        np.testing.assert_allclose(part.point, expected.point)
        np.testing.assert_allclose(part.draws, expected.draws)
        assert part.tasks == expected.tasks == 4


def test_warm_candidates_train_on_each_run_of_a_routing_served_router_and_none_of_a_fixed_model(demo_router_dir,
                                                                                                tmp_path):
    workdir = tmp_path / "served"
    shutil.copytree(demo_router_dir, workdir)
    config = routesim_live.get_config("tiny")
    config.loss.alpha, config.seed = 7.5, 1234                  # the round's own: the warm runs keep the served run's
    checkpoints = StageCheckpoints(workdir, "td", max_to_keep=None)
    epoch = checkpoints.epochs()[0]
    trained_with = checkpoints.restore_meta(epoch)["config"]
    checkpoints.close()
    served = {"runs": [".", "."], "stage": "td", "epoch": epoch, "recentring": None}
    warm = loop.warm_configs(config, workdir, served)
    assert len(warm) == 2                                        # one per served run
    for c in warm:
        assert c.stage == "td" and c.warm_start == f"{workdir.resolve()}:td@{epoch}"
        assert c.td_epochs == config.loop.warm_epochs and c.optim.lr == config.loop.warm_lr
        assert c.seed == trained_with["seed"] and c.loss.alpha == trained_with["loss"]["alpha"] != 7.5
    assert loop.warm_configs(config, workdir, {**served, "epoch": None})[0].warm_start.endswith(":td")
    fixed = {**served, "recentring": {"k": 0.0, "floor": {}, "centre": {}}}   # a fixed model: nothing to start from
    assert loop.warm_configs(config, workdir, fixed) == []
    config.loop.warm_epochs = 0
    assert loop.warm_configs(config, workdir, served) == []
