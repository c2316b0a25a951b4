"""Evaluation helpers, the trivial baselines (fixed model, random router) by hand, and joint rollouts."""

import jax
import numpy as np
import pytest

from configs import routesim as routesim_config
from rivet_jax import evaluation
from rivet_jax.data.cards import card_features
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode, Task, Turn
from rivet_jax.encoders import make_encoder
from rivet_jax.envs.base import FixedModelPolicy, GroupMember, RandomPolicy, run_episode
from rivet_jax.envs.routesim import make_routesim
from rivet_jax.learner import stack
from rivet_jax.networks import init_params, make_network, rve_params
from rivet_jax.router import RouterGroup


@pytest.fixture(scope="module")
def sim():
    return make_routesim(routesim_config.get_config("tiny").sim)


def test_discounted_return_by_hand():
    episode = Episode("e", Task("t", "p"), (Turn("a", "r", "f", 1, 1, 0.2), Turn("b", "r", "", 1, 1, 0.4)), 1)
    # r = [-0.5 * 0.2 / 0.1, -0.5 * 0.4 / 0.1 + 1] = [-1, -1]; J = -1 + 0.9 * -1
    assert evaluation.discounted_return(episode, reward=Reward(0.5, 0.9, 0.1)) == pytest.approx(-1.9)


def test_metrics_by_hand():
    a = Episode("a", Task("t", "p"), (Turn("x", "r", "f", 1, 1, 1.0), Turn("y", "r", "", 1, 1, 2.0)), 1)
    b = Episode("b", Task("t", "p"), (Turn("x", "r", "", 1, 1, 3.0),), 0)
    m = evaluation.episode_metrics([a, b], reward=Reward(0.0, 1.0, 1.0), rollouts=2)
    assert m == {"accuracy": 0.5, "cost": 3.0, "return": 0.5, "turns": 1.5, "switch_rate": 0.5}


def test_fixed_and_random_policies(sim):
    names = sim.pool.names
    rng = np.random.default_rng(0)
    fixed = FixedModelPolicy(names[2])
    assert {fixed.act(None, (), names, rng) for _ in range(20)} == {(names[2], 1.0)}
    with pytest.raises(ValueError, match="not available"):
        fixed.act(None, (), names[:2], rng)
    picks = [RandomPolicy().act(None, (), names[:3], rng) for _ in range(3000)]
    counts = np.array([sum(p[0] == n for p in picks) for n in names[:3]])
    assert abs(counts / 3000 - 1 / 3).max() < 0.04 and {p[1] for p in picks} == {1 / 3}


def test_rollouts_are_deterministic_given_the_seed(sim):
    first = evaluation.rollout(sim, RandomPolicy(), "test", rollouts=2, seed=5)
    again = evaluation.rollout(sim, RandomPolicy(), "test", rollouts=2, seed=5)
    other = evaluation.rollout(sim, RandomPolicy(), "test", rollouts=2, seed=6)
    assert [e.to_json() for e in first] == [e.to_json() for e in again]
    assert [e.to_json() for e in first] != [e.to_json() for e in other]
    assert len(first) == 2 * len(sim.tasks("test"))


class BatchedRandom(RandomPolicy):
    """RandomPolicy deciding through `act_batch`, recording how many decisions each call held."""

    def __init__(self):
        self.batch_sizes = []

    def act_batch(self, requests):
        self.batch_sizes.append(len(requests))
        return [self.act(*request) for request in requests]


def test_batched_rollouts_equal_one_episode_at_a_time(sim):
    """Same seeds -> same episodes: each episode draws from its own generator in the order a lone episode would,
    however many others are stepped beside it."""
    split, rollouts, seed = "test", 2, 3
    tasks = sim.tasks(split)
    one_by_one = [run_episode(sim, task.id, RandomPolicy(), np.random.default_rng([seed, r, i]),
                              f"random/{task.id}/{r}") for r in range(rollouts) for i, task in enumerate(tasks)]
    policy = BatchedRandom()
    together = evaluation.rollout(sim, policy, split, rollouts, seed)
    assert [e.to_json() for e in together] == [e.to_json() for e in one_by_one]
    # One call per round, holding every episode still running: all of them first, fewer as they end.
    assert policy.batch_sizes[0] == rollouts * len(tasks) == len(together)
    assert policy.batch_sizes == sorted(policy.batch_sizes, reverse=True)
    assert len(policy.batch_sizes) == max(len(e.turns) for e in together)
    assert sum(policy.batch_sizes) == sum(len(e.turns) for e in together)


def test_a_router_group_of_parts_decides_as_one_group_per_part(sim):
    """Online adaptation on a CPU scores its runs as one `RouterGroup` whose parts are its chunks (one encoder pass a
    round for all): each run's rollouts equal those through a group of its part alone, and a part of two runs
    scores each as a stacked group of both does."""
    config = routesim_config.get_config("tiny")
    encoder, net = make_encoder(config.encoder), make_network(config)
    cards = np.random.default_rng(0).normal(size=(len(sim.pool), config.encoder.dim)).astype(np.float32)
    params = [rve_params(init_params(net, jax.random.key(seed), config.encoder.dim,
                                     (cards, *card_features(sim.pool)))) for seed in range(3)]
    parts = [stack(params[:1]), stack(params[1:])]                 # runs 0 | 1, 2
    joint = RouterGroup(parts, sim.pool, encoder, config, cards)
    apart = [RouterGroup(part, sim.pool, encoder, config, cards) for part in parts]
    split, rollouts, seed = "validation", 2, 5
    got = evaluation.rollout_each(sim, [GroupMember(joint, r) for r in range(3)], split, rollouts, seed)
    want = evaluation.rollout_each(sim, [GroupMember(apart[0], 0), GroupMember(apart[1], 0),
                                         GroupMember(apart[1], 1)], split, rollouts, seed)
    assert joint.size == 3
    assert [[e.to_json() for e in run] for run in got] == [[e.to_json() for e in run] for run in want]
    states = [[(task.prompt, ()) for task in sim.tasks(split)[:4]]] * 3
    available = [[list(sim.pool.names)] * 4] * 3
    for got_q, want_q in zip(joint.scores([0, 1, 2], states, available),
                             apart[0].scores([0], states[:1], available[:1])
                             + apart[1].scores([0, 1], states[1:], available[1:])):
        np.testing.assert_array_equal(got_q, want_q)
    assert not np.array_equal(*joint.scores([1, 2], states[1:], available[1:]))  # the runs differ
