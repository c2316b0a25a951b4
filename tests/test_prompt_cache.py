"""RouteSim with a prompt cache (issue 44, item 2): the environment bills what the same model was sent on the
previous turn at its cached price, and the exact DP, which carries who holds the cache, agrees with rollouts."""

import copy

import numpy as np
import pytest

from configs import routesim as routesim_config
from rivet_jax import evaluation
from rivet_jax.data.replay import Reward
from rivet_jax.envs import oracle
from rivet_jax.envs.base import FixedModelPolicy, RandomPolicy, run_episode
from rivet_jax.envs.routesim import RouteSim, make_routesim

LAM, GAMMA, C_REF = 0.05, 0.99, 0.002
REWARD = Reward(LAM, GAMMA, C_REF)


@pytest.fixture(scope="module")
def sim() -> RouteSim:
    return make_routesim(routesim_config.get_config("cache").sim)


@pytest.fixture(scope="module")
def plain() -> RouteSim:
    return make_routesim(routesim_config.get_config().sim)


def play(sim, task_id, models, seed=0):
    """The states and turns of `models` called in this order (the episode may end sooner)."""
    state, rng = sim.reset(task_id), np.random.default_rng(seed)
    states = [state]
    for model in models:
        if state.done:
            break
        state = sim.step(state, model, rng)
        states.append(state)
    return states


def test_the_same_model_reads_its_previous_prompt_from_the_cache_and_a_switch_pays_full_price(sim, plain):
    pro, flash = sim.pool.cards[sim.pool.index("apex-pro")], sim.pool.cards[sim.pool.index("apex-flash")]
    assert pro.price_cached_in_per_mtok == pro.price_in_per_mtok / 10   # routesim_params.json's prompt_cache
    # a task that the weak first turns do not end: the same seeds on both simulators give the same texts and tokens
    task = next(t for t in sim.sim_tasks("train")
                if len(play(sim, t.task.id, ["quill-9b", "quill-9b", "quill-9b"])) == 4)
    calls = ["apex-pro", "apex-pro", "apex-flash"]
    states = play(sim, task.task.id, calls, seed=3)
    states_plain = play(plain, task.task.id, calls, seed=3)
    turns, turns_plain = states[-1].history, states_plain[-1].history
    assert len(turns) == 3 and [t.response for t in turns] == [t.response for t in turns_plain]
    first, second, third = turns
    assert (first.cached_tokens, second.cached_tokens, third.cached_tokens) == (0, first.prompt_tokens, 0)
    assert first.cache_write_tokens is None   # apex-pro pays no premium to write its cache
    assert second.cost == pytest.approx((pro.price_cached_in_per_mtok * first.prompt_tokens
                                         + pro.price_in_per_mtok * (second.prompt_tokens - first.prompt_tokens)
                                         + pro.price_out_per_mtok * second.completion_tokens) / 1e6, rel=1e-12)
    # what the proxy would bill for the same usage; the turns without a cache read cost what they always did
    for turn in turns:
        card = sim.pool.cards[sim.pool.index(turn.model)]
        assert turn.cost == pytest.approx(card.call_cost(turn.prompt_tokens, turn.completion_tokens,
                                                         turn.cached_tokens, turn.cache_write_tokens or 0), rel=1e-12)
    assert first.cost == turns_plain[0].cost and third.cost == turns_plain[2].cost
    assert second.cost < turns_plain[1].cost
    assert all(t.cached_tokens is None and t.cache_write_tokens is None for t in turns_plain)


def test_a_model_that_pays_to_write_its_cache_pays_it_on_every_prompt_token_it_does_not_read(sim):
    quill = sim.pool.cards[sim.pool.index("quill-plus")]
    task = sim.sim_tasks("train")[0]
    first = play(sim, task.task.id, ["quill-plus"])[-1].history[0]
    assert (first.cached_tokens, first.cache_write_tokens) == (0, first.prompt_tokens)
    assert first.cost == pytest.approx((quill.price_cache_write_per_mtok * first.prompt_tokens
                                        + quill.price_out_per_mtok * first.completion_tokens) / 1e6, rel=1e-12)
    # a model without a cache entry reads nothing, even after itself
    turns = play(sim, task.task.id, ["llama-70b", "llama-70b"], seed=1)[-1].history
    assert [t.cached_tokens for t in turns] == [0] * len(turns)


def test_a_cache_that_saves_nothing_leaves_every_exact_statistic_as_without_one(sim, plain):
    """Cached prices equal to the input prices: the DP's extra cache states must change nothing."""
    free = copy.copy(sim)
    free.price_read = free.price_write = plain.price_in
    for task in sim.sim_tasks("test")[:3]:
        for policy in ("oracle", "random", 1):
            a = oracle.solve(plain, task, REWARD, policy).stats
            b = oracle.solve(free, task, REWARD, policy).stats
            for field in ("value", "success", "cost", "turns", "switch"):
                assert getattr(b, field) == pytest.approx(getattr(a, field), rel=1e-9, abs=1e-12), (policy, field)


def test_with_a_cache_the_oracle_is_at_least_as_good_and_sticks_to_a_model_more_often(sim, plain):
    tasks = sim.sim_tasks("test")[:6]
    with_cache = [oracle.solve(sim, t, REWARD, "oracle").stats for t in tasks]
    without = [oracle.solve(plain, t, REWARD, "oracle").stats for t in tasks]
    assert all(a.value >= b.value - 1e-12 for a, b in zip(with_cache, without))   # costs only go down
    assert np.mean([s.switch for s in with_cache]) <= np.mean([s.switch for s in without])
    assert all(0.0 <= s.cached_tokens <= s.prompt_tokens for s in with_cache)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["oracle", 0, "random"])
def test_dp_with_a_prompt_cache_matches_rollouts_in_the_environment(sim, policy):
    """The DP's exact expectations, cost and cached tokens included, agree with Monte Carlo rollouts."""
    task = sim.sim_tasks("test")[50]
    exact = oracle.solve(sim, task, REWARD, policy).stats
    runner = {"oracle": oracle.OraclePolicy(sim, REWARD), "random": RandomPolicy()}.get(
        policy) or FixedModelPolicy(sim.pool.names[policy])
    n = 1500
    episodes = [run_episode(sim, task.task.id, runner, np.random.default_rng([12, i]), f"e{i}") for i in range(n)]
    samples = {"value": np.array([evaluation.discounted_return(e, REWARD) for e in episodes]),
               "success": np.array([e.outcome for e in episodes]),
               "cost": np.array([sum(t.cost for t in e.turns) for e in episodes]),
               "turns": np.array([len(e.turns) for e in episodes]),
               "switch": np.array([len({t.model for t in e.turns}) > 1 for e in episodes]),
               "prompt_tokens": np.array([sum(t.prompt_tokens for t in e.turns) for e in episodes]),
               "cached_tokens": np.array([sum(t.cached_tokens for t in e.turns) for e in episodes])}
    assert samples["cached_tokens"].sum() > 0 or policy == "random"
    for field, sample in samples.items():
        expected = getattr(exact, field)
        se = max(sample.std() / np.sqrt(n), 1e-3 * max(1.0, abs(expected)))
        assert abs(sample.mean() - expected) < 4.5 * se, (policy, field, sample.mean(), expected)
