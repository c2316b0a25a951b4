"""RouteSim: the benchmark's five properties on the default configuration, and the DP's agreement with the
environment it solves."""

import dataclasses

import numpy as np
import pytest

from configs import routesim as routesim_config
from rivet_jax import evaluation
from rivet_jax.data.replay import Reward, reference_cost
from rivet_jax.data.schema import read_episodes
from rivet_jax.envs import collect, oracle
from rivet_jax.envs.base import FixedModelPolicy, RandomPolicy, run_episode
from rivet_jax.envs.routesim import OUTCOMES, SKILLS, VARIANTS, RouteSim, make_routesim, render_response, respond

LAM, GAMMA = 0.05, 0.99


@pytest.fixture(scope="module")
def sim() -> RouteSim:
    return make_routesim(routesim_config.get_config().sim)


@pytest.fixture(scope="module")
def corpus(sim):
    return collect.collect_corpus(sim, "train", seed=0)


@pytest.fixture(scope="module")
def c_ref(corpus):
    return reference_cost(corpus)


@pytest.fixture(scope="module")
def report(sim, c_ref):
    return oracle.policy_report(sim, "test", Reward(LAM, GAMMA, c_ref))


def test_manifests_match_the_paper(sim):
    assert {s: len(sim.tasks(s)) for s in ("train", "validation", "test")} == {"train": 200, "validation": 35,
                                                                                "test": 141}
    test_families = [t.family for t in sim.tasks("test")]
    assert [test_families.count(f) for f in ("gsm8k", "hotpotqa", "math", "mmlu", "theoremqa")] == [21, 19, 45, 34,
                                                                                                   22]
    assert {s: len(sim.tasks(s)) for s in ("ood:musique", "ood:drop", "ood:mmlu_pro")} == {
        "ood:musique": 180, "ood:drop": 160, "ood:mmlu_pro": 180}
    ids = [t.id for s in sim.splits for t in sim.tasks(s)]
    assert len(ids) == len(set(ids))
    # the same seed gives the same tasks, a new simulator included
    again = RouteSim(routesim_config.get_config().sim)
    assert again.sim_tasks("test") == sim.sim_tasks("test")


@pytest.mark.slow
def test_property_1_no_model_dominates(sim, report):
    fixed = {n: (report[n]["accuracy"], report[n]["cost"]) for n in sim.pool.names}
    best = oracle.most_accurate_fixed(report, sim.pool.names)
    cheapest = min(fixed, key=lambda n: fixed[n][1])
    assert best != cheapest
    assert len(oracle.pareto_front(fixed)) >= 3


@pytest.mark.slow
def test_property_2_switching_pays(sim, report):
    best = report[oracle.most_accurate_fixed(report, sim.pool.names)]
    ours = report["oracle"]
    more_accurate = ours["accuracy"] >= best["accuracy"] + 0.05
    as_accurate_for_half = ours["accuracy"] >= best["accuracy"] - 0.005 and ours["cost"] <= 0.5 * best["cost"]
    assert more_accurate or as_accurate_for_half
    assert ours["switch_rate"] >= 0.3
    # the oracle is optimal: no fixed model or the random router has a higher expected return
    assert all(ours["return"] >= row["return"] - 1e-9 for row in report.values())


@pytest.mark.slow
def test_property_3_responses_resolve_return_variance(sim, corpus, c_ref):
    share = oracle.response_resolved_share(sim, corpus, Reward(LAM, GAMMA, c_ref))
    assert share["share"] >= 0.2
    assert 0 < share["var_delta"] < share["var_y"]


def test_property_4_identity_blind(sim):
    """The same response text from two different models: same feedback, progress, termination and grading."""
    rng = np.random.default_rng(0)
    task = sim.sim_tasks("test")[3]
    state = sim.reset(task.task.id)
    names = sim.pool.names
    for outcome in OUTCOMES:
        for final in (False, True):
            text = render_response(outcome, SKILLS[task.skills[0]], 0, task.answers[0], final, rng)
            a = sim.apply_response(state, names[0], text, 100)
            b = sim.apply_response(state, names[-1], text, 100)
            for field in ("step", "wrong_proposals", "done", "success", "context_tokens"):
                assert getattr(a, field) == getattr(b, field), (outcome, field)
            assert a.history[-1].feedback == b.history[-1].feedback
            assert a.history[-1].cost != b.history[-1].cost  # prices differ: only the cost knows the model
            assert names[0] not in a.history[-1].feedback and names[-1] not in a.task.prompt


def test_property_5_same_seed_same_bytes(sim, tmp_path):
    first, second, other = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    collect.write_corpus(first, sim, collect.collect_corpus(sim, "validation", seed=3))
    collect.write_corpus(second, sim, collect.collect_corpus(sim, "validation", seed=3))
    collect.write_corpus(other, sim, collect.collect_corpus(sim, "validation", seed=4))
    for name in (collect.EPISODES_FILE, collect.CARDS_FILE, "summary.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes()
    assert (first / collect.EPISODES_FILE).read_bytes() != (other / collect.EPISODES_FILE).read_bytes()
    # and the corpus is valid under the project's schema, with propensities
    episodes = read_episodes(first / collect.EPISODES_FILE, sim.pool).episodes
    assert len(episodes) == 7 * 35
    assert {t.propensity for e in episodes for t in e.turns} == {1.0, 1.0 / 6}


def test_generate_draws_as_choice_does(sim):
    """The cached CDF draws each outcome exactly as `rng.choice(O, p=outcome_probs)` did, and leaves the generator
    where it left it: episodes, corpora and the benchmark's numbers are those of the plain draw."""
    for task in sim.sim_tasks("validation")[:20]:
        for step in range(task.num_steps):
            state = dataclasses.replace(sim.reset(task.task.id), step=step)
            for m, model in enumerate(sim.pool.names):
                for seed in range(5):
                    ours, plain = np.random.default_rng([seed, step, m]), np.random.default_rng([seed, step, m])
                    text, tokens = sim.generate(state, model, ours)
                    outcome = int(plain.choice(len(OUTCOMES), p=sim.outcome_probs(task, step)[m]))
                    variant = int(plain.integers(VARIANTS.get(OUTCOMES[outcome], 1)))
                    assert text == render_response(OUTCOMES[outcome], SKILLS[task.skills[step]], step,
                                                   task.answers[step], step == task.num_steps - 1, plain, variant)
                    assert tokens == sim.completion[m, outcome]
                    assert ours.random() == plain.random()


def test_responses_carry_information(sim):
    """Same model, same state, different responses with different futures, and the text shows which."""
    task = sim.sim_tasks("test")[0]
    state = sim.reset(task.task.id)
    model = sim.pool.names[4]
    seen = {}
    for seed in range(200):
        next_state = sim.step(state, model, np.random.default_rng(seed))
        seen.setdefault(next_state.step, next_state.history[-1].response)
    assert set(seen) == {0, 1}                                  # progress and no progress both happen
    assert seen[0] != seen[1]
    assert f"print({task.answers[0]})" in seen[1] and f"print({task.answers[0]})" not in seen[0]


def test_environment_grades_text_alone():
    answers = (11, 22, 33)
    assert respond("<execute> print(11) </execute>", answers, 0, 2).progress
    assert not respond("<execute> print(12) </execute>", answers, 0, 2).progress
    assert "SyntaxError" in respond("<execute> print(x </execute>", answers, 0, 2).feedback
    assert "NameError" in respond("<execute> print(x) </execute>", answers, 0, 2).feedback
    assert "don't understand" in respond("<thought> hmm </thought>", answers, 0, 2).feedback
    right, wrong = respond("<solution> 33 </solution>", answers, 2, 2), respond("<solution> 3 </solution>",
                                                                                  answers, 2, 2)
    assert right.correct and right.proposal and not wrong.correct and wrong.proposal
    assert "1 chance" in wrong.feedback
    # the right number proposed before the last step is not a solution of the task
    assert not respond("<solution> 33 </solution>", answers, 1, 2).correct


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["oracle", 2, "random"])
def test_dp_matches_rollouts_in_the_environment(sim, policy):
    """The DP's exact expectations agree with Monte Carlo rollouts of the same policy in the environment."""
    c_ref = 0.002
    task = sim.sim_tasks("test")[50]
    exact = oracle.solve(sim, task, Reward(LAM, GAMMA, c_ref), policy).stats
    runner = {"oracle": oracle.OraclePolicy(sim, Reward(LAM, GAMMA, c_ref)), "random": RandomPolicy()}.get(
        policy) or FixedModelPolicy(sim.pool.names[policy])
    n = 1500
    episodes = [run_episode(sim, task.task.id, runner, np.random.default_rng([11, i]), f"e{i}") for i in range(n)]
    returns = np.array([evaluation.discounted_return(e, Reward(LAM, GAMMA, c_ref)) for e in episodes])
    success = np.array([e.outcome for e in episodes])
    turns = np.array([len(e.turns) for e in episodes])
    switched = np.array([len({t.model for t in e.turns}) > 1 for e in episodes])
    for sample, expected in ((returns, exact.value), (success, exact.success), (turns, exact.turns),
                             (switched, exact.switch)):
        se = max(sample.std() / np.sqrt(n), 1e-3)
        assert abs(sample.mean() - expected) < 4.5 * se, (policy, sample.mean(), expected)


def test_oracle_respects_availability(sim):
    task = sim.sim_tasks("test")[10]
    names = sim.pool.names
    policy = oracle.OraclePolicy(sim, Reward(LAM, GAMMA, 0.002))
    available = names[2:4]
    q = policy.q_values(task.task.id, (), available)
    assert np.isneginf(q[[0, 1, 4, 5]]).all() and np.isfinite(q[[2, 3]]).all()
    episode = run_episode(sim, task.task.id, policy, np.random.default_rng(0), "e", available=available)
    assert {t.model for t in episode.turns} <= set(available)
    assert all(t.available == tuple(available) for t in episode.turns)


def test_evaluator_rolls_a_reused_policy_out_once_per_split_and_models_available(monkeypatch):
    """`Evaluator.episodes(..., reuse=key)`: Tables 1, 2 and 3 read one router's test episodes; rolled out once,
    and equal to a rollout of the same policy made afresh. Another split or another set of models is rolled out."""
    from rivet_jax.experiments.evaluator import Evaluator

    config = routesim_config.get_config("tiny")
    tiny = make_routesim(config.sim)
    rolled, roll = [], evaluation.rollout
    monkeypatch.setattr(evaluation, "rollout", lambda env, policy, split, *args, **kwargs:
                        rolled.append(split) or roll(env, policy, split, *args, **kwargs))
    ev, router = Evaluator(tiny, config, 0.002), object()   # (any object names what is reused)
    first = ev.episodes(RandomPolicy(), "test", reuse=router)
    assert ev.episodes(RandomPolicy(), "test", reuse=router) is first and rolled == ["test"]
    assert ev.episodes(RandomPolicy(), "test") == first and rolled == ["test"] * 2
    ev.episodes(RandomPolicy(), "validation", reuse=router)
    fewer = ev.episodes(RandomPolicy(), "test", available=tiny.pool.names[1:], reuse=router)
    assert rolled == ["test", "test", "validation", "test"]
    assert {t.model for e in fewer for t in e.turns} <= set(tiny.pool.names[1:])
    metrics = ev.rollouts(RandomPolicy(), "test", 0.05, reuse=router)
    assert metrics == evaluation.episode_metrics(first, Reward(0.05, config.reward.gamma, 0.002),
                                                 config.evaluate.rollouts_per_task) and len(rolled) == 4


def test_exact_reports_solved_in_the_lowest_priority_process_equal_those_solved_here():
    """`exact_pool`: the main job's DPs run in a spawned process at the lowest CPU priority (the cores training
    leaves idle) and give the same reports, bit for bit; an oracle-only request whose full report is asked for too
    is not solved a second time."""
    import os
    from rivet_jax.experiments.evaluator import Evaluator, exact_pool

    config = routesim_config.get_config("tiny")
    tiny = make_routesim(config.sim)
    ahead, here = Evaluator(tiny, config, 0.002), Evaluator(tiny, config, 0.002)
    with exact_pool() as pool:
        assert pool.submit(os.getpid).result() != os.getpid()
        if hasattr(os, "SCHED_IDLE"):
            assert pool.submit(os.sched_getscheduler, 0).result() == os.SCHED_IDLE
        else:
            assert pool.submit(os.nice, 0).result() == min(os.nice(0) + 19, 19)
        ahead.solve_ahead([("test", 0.05, None, True), ("test", 0.05, None, False), ("test", 0.1, None, True)], pool)
        assert sorted(ahead._ahead) == [(("test", 0.05, None), False), (("test", 0.1, None), True)]
        got = [ahead.exact("test", 0.05), ahead.oracle("test", 0.05), ahead.oracle("test", 0.1)]
    assert got == [here.exact("test", 0.05), here.oracle("test", 0.05), here.oracle("test", 0.1)]


def test_baselines_fitted_and_rolled_out_in_the_lowest_priority_process_equal_those_fitted_here(tmp_path):
    """`Evaluator.baselines_ahead`: the baselines fitted on the corpus and rolled out in `exact_pool`'s process (a
    store in memory there) give the episodes, bit for bit, that fitting them here on the job's on-disk store and
    rolling them out here gives, per split and models available; the tables read those through `Evaluator`."""
    from rivet_jax.baselines.registry import fit_baselines
    from rivet_jax.encoders import embedding_store, make_encoder
    from rivet_jax.experiments.evaluator import Evaluator, RolledOut, exact_pool

    config = routesim_config.get_config("tiny")
    tiny = make_routesim(config.sim)
    logged = collect.collect_corpus(tiny, config.collect.split, config.collect.seed)
    c_ref, without_first = reference_cost(logged), tiny.pool.names[1:]
    ev = Evaluator(tiny, config, c_ref)
    with exact_pool() as pool:
        ahead = ev.baselines_ahead(logged, LAM, [("test", None), ("test", without_first)], pool).result()
    store = embedding_store(config, make_encoder(config.encoder), tmp_path)
    here = fit_baselines(config, logged, tiny.pool, store, LAM, c_ref)
    assert sorted(ahead) == sorted(here) and all(isinstance(p, RolledOut) for p in ahead.values())
    for name, policy in here.items():
        for available in (None, without_first):
            episodes = evaluation.rollout(tiny, policy, "test", config.evaluate.rollouts_per_task,
                                          config.evaluate.seed, available=available)
            assert ev.episodes(ahead[name], "test", available) == episodes, name
    called = {t.model for e in ev.episodes(ahead["MTRouter"], "test", without_first) for t in e.turns}
    assert called <= set(without_first)


def test_exact_reports_solved_ahead_in_a_thread_are_those_solved_on_request(monkeypatch):
    """The main job starts the exact reports its evaluation reads while its routers train (`Evaluator.solve_ahead`):
    the same reports as solved on request, each solved once in the pool's thread (a full report serving the
    oracle's row too); what was not asked ahead is solved on request."""
    from concurrent.futures import ThreadPoolExecutor
    import threading
    from rivet_jax.experiments.evaluator import Evaluator

    config = routesim_config.get_config("tiny")
    tiny = make_routesim(config.sim)
    solved, solve = [], oracle.policy_report
    monkeypatch.setattr(oracle, "policy_report",
                        lambda *args, **kwargs: solved.append(threading.current_thread().name) or solve(*args, **kwargs))
    without_first = tiny.pool.names[1:]
    asks = [("exact", 0.05, None), ("oracle", 0.1, None), ("exact", 0.05, without_first), ("oracle", 0.05, None)]
    ahead = Evaluator(tiny, config, 0.002)
    with ThreadPoolExecutor(1, thread_name_prefix="ahead") as pool:
        ahead.solve_ahead([("test", 0.05, None, False), ("test", 0.1, None, True), ("test", 0.05, without_first, False)],
                          pool)
        got = [getattr(ahead, how)("test", lam, available) for how, lam, available in asks]
    assert solved == ["ahead_0"] * 3
    now = Evaluator(tiny, config, 0.002)
    assert got == [getattr(now, how)("test", lam, available) for how, lam, available in asks]
    assert ahead.oracle("test", 0.2) == now.oracle("test", 0.2)
    assert solved == ["ahead_0"] * 3 + ["MainThread"] * 5
