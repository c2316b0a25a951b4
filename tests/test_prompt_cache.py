"""RouteSim with a prompt cache (issue 44, item 2): the environment bills what the same model was sent on the
previous turn at its cached price, and the exact DP, which carries who holds the cache, agrees with rollouts."""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import routesim as routesim_config
from rivet_jax import evaluation
from rivet_jax.data.prompt_cache import call_savings, episode_savings
from rivet_jax.data.replay import Reward, build_replay
from rivet_jax.data.schema import Episode, ModelCard, ModelPool, Task, Turn
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
    pro = sim.pool.cards[sim.pool.index("apex-pro")]
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


# ------------------------------------------------------------------------------- the cache-aware router's training

def cached_pool(write: float | None = None) -> ModelPool:
    return ModelPool((ModelCard("a", "Caches.", price_in_per_mtok=2.0, price_out_per_mtok=1.0,
                                price_cached_in_per_mtok=0.2, price_cache_write_per_mtok=write),
                      ModelCard("b", "No cache price.", price_in_per_mtok=1.0, price_out_per_mtok=1.0)))


def episode_of(calls) -> Episode:
    turns = tuple(Turn(model, f"r{i}", f"f{i}", prompt, 10, 0.001) for i, (model, prompt) in enumerate(calls))
    return Episode("e", Task("t", "p"), turns, 1)


def test_each_state_saves_on_the_previous_turns_model_its_prompt_at_the_cached_price_difference():
    episode = episode_of([("a", 100), ("a", 150), ("b", 200)])
    # s0: nothing cached; s1 after a's 100-token prompt: a saves (2 - 0.2) $/Mtok x 100 = 0.00018 $ = 0.18 c_ref;
    # s2: a saves 1.8e-6 x 150 = 0.27 c_ref; s3 after b: b has no cached price, nothing saved
    assert episode_savings(episode, cached_pool(), 0.001) == pytest.approx(
        np.array([[0, 0], [0.18, 0], [0.27, 0], [0, 0]]), abs=1e-6)
    # where a cache write costs 2.5 $/Mtok, a read saves that price less 0.2
    assert episode_savings(episode, cached_pool(2.5), 0.001)[1] == pytest.approx([0.23, 0.0], abs=1e-6)
    # a history as a proxy's mappings, without the prompt's tokens: nothing known, nothing saved
    assert not call_savings({"model": "a"}, cached_pool(), 0.001).any()
    replay = build_replay([episode], cached_pool(), count_tokens=len, max_tokens=1000,
                          reward=Reward(0.05, 0.99, 0.001), cache_aware=True)
    expected = episode_savings(episode, cached_pool(), 0.001)
    assert np.array_equal(replay.saving, expected[:-1]) and np.array_equal(replay.next_saving, expected[1:])
    blind = build_replay([episode], cached_pool(), count_tokens=len, max_tokens=1000,
                         reward=Reward(0.05, 0.99, 0.001))
    assert blind.saving is None and "saving" not in blind.arrays()


def test_a_cache_aware_loss_fits_the_network_to_the_returns_less_the_savings_the_router_adds_back():
    """MC: the target is G_t - lambda saving_t(m_t). TD: r_t - lambda saving_t(m_t) + gamma (Q_target(s', m*) +
    lambda saving'(m*)), m* the argmax of Q_online(s') + lambda saving'; CQL over Q + lambda saving."""
    from configs import default
    from rivet_jax import losses
    from rivet_jax.data.replay import Batch
    from rivet_jax.networks import RivetNet, init_params, make_network

    b, m, d, f, lam, gamma = 4, 3, 16, 2, 0.5, 0.9
    config = default.get_config("tiny")
    net = make_network(config)
    rng = np.random.default_rng(0)
    cards = (jnp.asarray(rng.normal(size=(m, d)), jnp.float32), jnp.asarray(rng.normal(size=(m, f)), jnp.float32),
             jnp.ones((m, f), jnp.float32))
    params, target_params = (init_params(net, jax.random.key(k), d, cards) for k in (0, 1))
    vec = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
    saving, next_saving = jnp.abs(vec(b, m)), jnp.abs(vec(b, m)) * 3
    action = jnp.array([0, 1, 2, 0])
    batch = Batch(h_t=vec(b, d), h_tp1=vec(b, d), e_o=vec(b, d), action=action, reward=vec(b), done=jnp.zeros(b),
                  mc_return=vec(b), cost=jnp.zeros(b), cost_return=jnp.zeros(b), lam=jnp.full(b, lam),
                  available=jnp.ones((b, m), bool), next_available=jnp.ones((b, m), bool), stochastic=jnp.ones(b),
                  saving=saving, next_saving=next_saving)
    weights = losses.LossWeights.of(config)

    def run(stage):
        return losses.rivet_loss(params, target_params, batch, cards, weights, net=net, gamma=gamma,
                                 huber_delta=1.0, stage=stage)[1]

    taken = np.asarray(saving)[np.arange(b), np.asarray(action)]
    assert float(run("mc")["target"]) == pytest.approx(float(np.mean(batch.mc_return - lam * taken)), rel=1e-5)
    q_online = np.asarray(net.apply({"params": params}, batch.h_tp1, cards, method=RivetNet.q_route))
    q_target = np.asarray(net.apply({"params": target_params}, batch.h_tp1, cards, method=RivetNet.q_route))
    best = np.argmax(q_online + lam * np.asarray(next_saving), axis=1)
    assert not np.array_equal(best, np.argmax(q_online, axis=1))   # the savings decide somewhere
    rows = np.arange(b)
    by_hand = (np.asarray(batch.reward) - lam * taken
               + gamma * (q_target[rows, best] + lam * np.asarray(next_saving)[rows, best]))
    td = run("td")
    assert float(td["target"]) == pytest.approx(float(by_hand.mean()), rel=1e-5)
    q = np.asarray(net.apply({"params": params}, batch.h_t, cards, method=RivetNet.q_route)) + lam * np.asarray(saving)
    cql = np.mean([losses.cql(jnp.asarray(q[i]), action[i], batch.available[i]) for i in range(b)])
    assert float(td["cql"]) == pytest.approx(float(cql), rel=1e-5)


def test_a_cache_aware_router_adds_lambda_times_the_previous_models_saving_to_its_scores(demo_router_dir, sim):
    """The same network read cache-blind and cache-aware: the scores differ by lambda x the saving, in the previous
    turn's model's column alone (and not at all on a first turn)."""
    from rivet_jax.router import Router

    blind = Router.from_checkpoint(demo_router_dir, pool=sim.pool)   # the cache variant's cards: cached prices
    config = blind.config.copy_and_resolve_references()
    config.model.cache_aware = True
    aware = Router(blind._params, blind.pool, blind.encoder, config, blind._card_embeddings, c_ref=blind.c_ref,
                   stacked=True)
    task = sim.sim_tasks("test")[3]
    history = play(sim, task.task.id, ["apex-flash", "apex-flash"], seed=2)[-1].history
    states = [(task.task.prompt, ()), (task.task.prompt, history[:1]), (task.task.prompt, history)]
    difference = aware.scores(states) - blind.scores(states)
    flash = sim.pool.index("apex-flash")
    per_token = (sim.pool.cards[flash].price_in_per_mtok - sim.pool.cards[flash].price_cached_in_per_mtok) / 1e6
    expected = np.zeros_like(difference)
    expected[1, flash] = blind.lam * per_token * history[0].prompt_tokens / blind.c_ref
    expected[2, flash] = blind.lam * per_token * history[1].prompt_tokens / blind.c_ref
    assert difference == pytest.approx(expected, rel=1e-5, abs=1e-6) and expected[2, flash] > 0


def test_a_config_from_before_caching_is_cache_blind():
    """A checkpoint's config saved before `model.cache_aware` existed has no such key: cache-blind, as it was."""
    from configs import default
    from rivet_jax.data.prompt_cache import cache_aware

    config = default.get_config("tiny")
    with config.unlocked():
        del config.model["cache_aware"]
    assert "cache_aware" not in config.model and not cache_aware(config)
