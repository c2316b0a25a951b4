"""Losses and returns against numbers worked out by hand (in the comments), jit'ed and not."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rivet_jax import losses
from rivet_jax.data.replay import discounted_returns, turn_rewards

VARIANTS = [pytest.param(lambda f: f, id="eager"), pytest.param(jax.jit, id="jit")]


@pytest.mark.parametrize("variant", VARIANTS)
def test_huber(variant):
    huber = variant(losses.huber)
    assert float(huber(jnp.float32(0.5))) == pytest.approx(0.125)      # 0.5^2 / 2
    assert float(huber(jnp.float32(3.0))) == pytest.approx(2.5)        # 1/2 + 1 * (3 - 1)
    assert float(huber(jnp.float32(-2.0))) == pytest.approx(1.5)       # symmetric: 1/2 + (2 - 1)
    assert float(losses.huber(jnp.float32(3.0), 2.0)) == pytest.approx(4.0)  # 2^2/2 + 2 * (3 - 2)


@pytest.mark.parametrize("variant", VARIANTS)
def test_fit_weights_rive_by_beta(variant):
    fit = variant(losses.fit)
    q_route, q_resp, target = jnp.float32(1.0), jnp.float32(0.2), jnp.float32(0.5)
    # huber(0.5) = 0.125, huber(-0.3) = 0.045
    assert float(fit(q_route, q_resp, target, 1.0)) == pytest.approx(0.17)
    assert float(fit(q_route, q_resp, target, 2.0)) == pytest.approx(0.215)
    assert float(fit(q_route, q_resp, target, 0.0)) == pytest.approx(0.125)


@pytest.mark.parametrize("variant", VARIANTS)
def test_double_dqn_target_online_selects_target_evaluates(variant):
    target_fn = variant(losses.double_dqn_target)
    q_online = jnp.array([1.0, 3.0, 2.0])
    q_target = jnp.array([10.0, 20.0, 30.0])
    everyone = jnp.array([True, True, True])
    # online argmax is model 1; the target network's value of it is 20: 0.1 + 0.9 * 20
    assert float(target_fn(0.1, 0.0, 0.9, q_online, q_target, everyone)) == pytest.approx(18.1)
    # model 1 unavailable: the online argmax among {0, 2} is model 2: 0.1 + 0.9 * 30
    no_1 = jnp.array([True, False, True])
    assert float(target_fn(0.1, 0.0, 0.9, q_online, q_target, no_1)) == pytest.approx(27.1)
    # the target net values the online choice (5), not its own maximum (50): 0.1 + 0.9 * 5
    assert float(target_fn(0.1, 0.0, 0.9, q_online, jnp.array([50.0, 20.0, 5.0]), no_1)) == pytest.approx(4.6)
    # terminal: no bootstrap
    assert float(target_fn(0.1, 1.0, 0.9, q_online, q_target, everyone)) == pytest.approx(0.1)


def test_double_dqn_target_has_no_gradient():
    def f(q_target):
        return losses.double_dqn_target(0.0, 0.0, 0.9, jnp.array([0.0, 1.0]), q_target, jnp.array([True, True]))

    np.testing.assert_array_equal(jax.grad(f)(jnp.array([1.0, 2.0])), [0.0, 0.0])


@pytest.mark.parametrize("variant", VARIANTS)
def test_cql_logsumexp_over_available_minus_logged(variant):
    cql = variant(losses.cql)
    q = jnp.array([1.0, 2.0, 3.0])
    expected_all = math.log(math.e + math.e**2 + math.e**3) - 1.0          # 2.4076059644
    expected_no_middle = math.log(math.e + math.e**3) - 1.0                # 2.1269280110
    assert float(cql(q, 0, jnp.array([True, True, True]))) == pytest.approx(expected_all, rel=1e-6)
    assert float(cql(q, 0, jnp.array([True, False, True]))) == pytest.approx(expected_no_middle, rel=1e-6)
    # logged action is the only available one: log(exp(q)) - q = 0
    assert float(cql(q, 2, jnp.array([False, False, True]))) == pytest.approx(0.0, abs=1e-6)


def test_batched_forms_match_per_example():
    rng = np.random.default_rng(0)
    q, q_next_online, q_next_target = (jnp.asarray(rng.normal(size=(5, 4)), jnp.float32) for _ in range(3))
    available = jnp.asarray(rng.random((5, 4)) < 0.7).at[:, 0].set(True)
    actions = jnp.zeros(5, jnp.int32)
    r, done = jnp.asarray(rng.normal(size=5), jnp.float32), jnp.array([0.0, 1.0, 0.0, 0.0, 1.0])
    batched = losses.batched_cql(q, actions, available)
    targets = losses.batched_double_dqn_target(r, done, 0.99, q_next_online, q_next_target, available)
    for i in range(5):
        assert float(batched[i]) == pytest.approx(float(losses.cql(q[i], actions[i], available[i])), rel=1e-6)
        single = losses.double_dqn_target(r[i], done[i], 0.99, q_next_online[i], q_next_target[i], available[i])
        assert float(targets[i]) == pytest.approx(float(single), rel=1e-6)


def test_rewards_and_returns_by_hand():
    # costs 2 and 1, c_ref 2, lambda 0.5, success: r = [-0.5, -0.25 + 1]
    rewards = turn_rewards(np.array([2.0, 1.0]), outcome=1, lam=0.5, c_ref=2.0)
    np.testing.assert_allclose(rewards, [-0.5, 0.75])
    # G_2 = 0.75, G_1 = -0.5 + 0.9 * 0.75 = 0.175
    np.testing.assert_allclose(discounted_returns(rewards, 0.9), [0.175, 0.75])
    np.testing.assert_allclose(turn_rewards(np.array([2.0, 1.0]), 0, 0.5, 2.0), [-0.5, -0.25])


@pytest.mark.slow
def test_cql_on_stochastic_choices_only_averages_over_those_transitions():
    """`loss.cql_on = "stochastic"`: Eq. 10 only where the logged choice was a draw, averaged over those rows;
    "all" is Eq. 10 on every row. Checked against `cql` per row on the network's own Q_route."""
    from configs import default
    from rivet_jax.data.replay import Batch
    from rivet_jax.settings import with_overrides
    from rivet_jax.networks import RivetNet, init_params, make_network

    b, m, d, f = 4, 3, 16, 2
    config = default.get_config("tiny")
    net = make_network(config)
    rng = np.random.default_rng(0)
    cards = (jnp.asarray(rng.normal(size=(m, d)), jnp.float32), jnp.asarray(rng.normal(size=(m, f)), jnp.float32),
             jnp.ones((m, f), jnp.float32))
    params = init_params(net, jax.random.key(0), d, cards)
    vec = lambda: jnp.asarray(rng.normal(size=(b, d)), jnp.float32)
    batch = Batch(h_t=vec(), h_tp1=vec(), e_o=vec(), action=jnp.array([0, 1, 2, 0]), reward=jnp.zeros(b),
                  done=jnp.ones(b), mc_return=jnp.zeros(b), cost=jnp.zeros(b), cost_return=jnp.zeros(b),
                  lam=jnp.zeros(b), available=jnp.ones((b, m), bool),
                  next_available=jnp.ones((b, m), bool), stochastic=jnp.array([1.0, 0.0, 1.0, 0.0]))
    q = net.apply({"params": params}, batch.h_t, cards, method=RivetNet.q_route)                  # (B, M)
    per_row = np.array([losses.cql(q[i], batch.action[i], batch.available[i]) for i in range(b)])
    for cql_on, expected in (("all", per_row.mean()), ("stochastic", per_row[[0, 2]].mean())):
        cfg = with_overrides(config, {"loss.cql_on": cql_on})
        loss, metrics = losses.rivet_loss(params, params, batch, cards, losses.LossWeights.of(cfg), net=net,
                                          gamma=cfg.reward.gamma, huber_delta=cfg.loss.huber_delta, stage="td")
        assert float(metrics["cql"]) == pytest.approx(expected, rel=1e-5)
        assert float(loss) == pytest.approx(float(metrics["fit"]) + cfg.loss.alpha * expected, rel=1e-5)
    with pytest.raises(ValueError, match="cql_on must be one of"):
        losses.LossWeights.of(with_overrides(config, {"loss.cql_on": "logged"}))
