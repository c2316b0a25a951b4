"""State serialization (Sec. 4.1, App. B.3) and replay construction (Eqs. 1-2)."""

import numpy as np
import pytest

from rivet_jax.data.replay import Reward, at_lambda, build_replay, episode_rows, reference_cost, transition_batch
from rivet_jax.data.schema import Episode, ModelCard, ModelPool, Task, Turn
from rivet_jax.data.serialize import episode_state_texts, serialize_state
from rivet_jax.envs.collect import demo_corpus


def words(text: str) -> int:
    return len(text.split())


def turn(i: int, model: str = "m-a", n_words: int = 10) -> Turn:
    return Turn(model=model, response=f"response{i} " + "w " * (n_words - 1), feedback=f"feedback{i}",
                prompt_tokens=1, completion_tokens=1, cost=0.1)


def test_keeps_task_and_two_latest_turns_even_over_budget():
    history = [turn(i, n_words=50) for i in range(4)]
    text = serialize_state("solve x", history, words, max_tokens=1)
    assert text.startswith("Task:\nsolve x")
    assert "response2" in text and "response3" in text
    assert "response0" not in text and "response1" not in text
    assert "[2 earlier turns omitted]" in text


def test_budget_drops_earliest_turns_first():
    history = [turn(i, n_words=10) for i in range(5)]
    full = serialize_state("t", history, words, max_tokens=10_000)
    assert all(f"response{i}" in full for i in range(5)) and "omitted" not in full
    # each turn block is 10 response words + "Turn i response:" (3) + "Turn i feedback:" (3) + feedback (1) = 17
    # task block 2 words; two latest turns 34; budget 2 + 34 + 17 = 53 admits exactly one earlier turn (turn 2)
    text = serialize_state("t", history, words, max_tokens=53)
    assert [f"response{i}" in text for i in range(5)] == [False, False, True, True, True]
    assert "[2 earlier turns omitted]" in text


def test_deterministic_and_blind_to_model_identity():
    a = [turn(0, model="big-expensive-model"), turn(1, model="tiny-model")]
    b = [turn(0, model="other"), turn(1, model="other")]
    assert serialize_state("t", a, words) == serialize_state("t", b, words)
    assert "big-expensive-model" not in serialize_state("t", a, words)


def test_episode_states_chain():
    turns = [turn(i) for i in range(3)]
    states = episode_state_texts("t", turns, words)
    assert len(states) == 4
    assert states[0] == "Task:\nt"
    for t in range(3):
        assert states[t + 1] == serialize_state("t", turns[: t + 1], words)


def test_build_replay_rewards_returns_and_indices():
    sim, episodes = demo_corpus(3, seed=3)
    pool = sim.pool
    c_ref = reference_cost(episodes)
    assert c_ref == pytest.approx(np.mean([t.cost for e in episodes for t in e.turns]))
    replay = build_replay(episodes, pool, count_tokens=words, max_tokens=16_384, reward=Reward(0.05, 0.99, c_ref))
    assert len(replay) == sum(len(e.turns) for e in episodes)
    row = 0
    for e_idx, episode in enumerate(episodes):
        states = episode_state_texts(episode.task.prompt, episode.turns, words)
        for t, logged in enumerate(episode.turns):
            assert replay.texts[replay.state[row]] == states[t]
            assert replay.texts[replay.next_state[row]] == states[t + 1]
            assert replay.texts[replay.response[row]] == logged.response
            assert pool.names[replay.action[row]] == logged.model
            last = t == len(episode.turns) - 1
            expected_r = -0.05 * logged.cost / c_ref + (episode.outcome if last else 0)
            assert replay.reward[row] == pytest.approx(expected_r, rel=1e-5)
            assert replay.done[row] == float(last)
            # G_t = r_t + gamma G_{t+1}
            if not last:
                assert replay.mc_return[row] == pytest.approx(replay.reward[row] + 0.99 * replay.mc_return[row + 1],
                                                             rel=1e-5, abs=1e-6)
            else:
                assert replay.mc_return[row] == pytest.approx(replay.reward[row])
            assert replay.episode[row] == e_idx
            row += 1
    # states shared across turns: the next state of a turn is the state of the following turn, one table row
    assert len(replay.texts) < 2 * len(replay) + len(pool)
    assert [replay.texts[i] for i in replay.card_text] == [c.description for c in pool.cards]


def test_graded_outcome_is_paid_on_the_last_turn():
    """Eq. 1 with y = 0.25: costs 0.1, 0.3, 0.2, c_ref 0.2, lambda 0.5 -> r = [-0.25, -0.75, -0.5 + 0.25];
    gamma 0.5: G_3 = -0.25, G_2 = -0.75 + 0.5 (-0.25) = -0.875, G_1 = -0.25 + 0.5 (-0.875) = -0.6875."""
    pool = ModelPool((ModelCard(name="m-a", description="model a"),))
    costs = (0.1, 0.3, 0.2)
    turns = tuple(Turn("m-a", f"r{i}", f"f{i}", 1, 1, cost) for i, cost in enumerate(costs))
    replay = build_replay([Episode("e", Task("t", "p"), turns, 0.25)], pool, count_tokens=words, max_tokens=100,
                          reward=Reward(0.5, 0.5, 0.2))
    np.testing.assert_allclose(replay.reward, [-0.25, -0.75, -0.25], rtol=1e-6)
    np.testing.assert_allclose(replay.mc_return, [-0.6875, -0.875, -0.25], rtol=1e-6)
    np.testing.assert_array_equal(replay.done, [0, 0, 1])
    # lambda 0 by hand: r = [0, 0, 0.25], G = [0.0625, 0.125, 0.25]; the same from lambda 0.5's rows
    np.testing.assert_allclose(replay.cost, [0.5, 1.5, 1.0], rtol=1e-6)
    np.testing.assert_allclose(replay.cost_return, [0.5 + 0.5 * (1.5 + 0.5 * 1.0), 2.0, 1.0], rtol=1e-6)
    at_zero = at_lambda(transition_batch(episode_rows(Episode("e", Task("t", "p"), turns, 0.25), pool,
                                                      Reward(0.5, 0.5, 0.2)), np.zeros((4, 1)), np.zeros((3, 1))), 0.0)
    np.testing.assert_allclose(at_zero.reward, [0, 0, 0.25], atol=1e-7)
    np.testing.assert_allclose(at_zero.mc_return, [0.0625, 0.125, 0.25], atol=1e-7)
    np.testing.assert_array_equal(at_zero.lam, [0, 0, 0])


@pytest.mark.parametrize("lam", [0.0, 0.02, 0.37, 2.0])
def test_rewards_and_returns_at_any_lambda_equal_the_episode_read_at_that_lambda(lam):
    """Eq. 1 is linear in lambda: a batch read at 0.05 and moved to `lam` (per transition) holds the rewards and
    returns of the episodes read at `lam` (one lambda-conditioned run learns every trade-off from one replay)."""
    sim, episodes = demo_corpus(3, seed=4)
    c_ref, dim = reference_cost(episodes), 1
    for episode in episodes:
        read = lambda x: transition_batch(episode_rows(episode, sim.pool, Reward(x, 0.97, c_ref)),
                                          np.zeros((len(episode.turns) + 1, dim)), np.zeros((len(episode.turns), dim)))
        moved, direct = at_lambda(read(0.05), np.full(len(episode.turns), lam, np.float32)), read(lam)
        for name in ("reward", "mc_return", "lam"):
            np.testing.assert_allclose(getattr(moved, name), getattr(direct, name), rtol=1e-5, atol=1e-5,
                                       err_msg=name)


def test_availability_masks():
    pool = ModelPool(tuple(ModelCard(name=name, description=f"model {name}")
                           for name in ("atlas-xl", "coder-m", "sage-s", "flash-xs")))
    episode = Episode("e", Task("t", "p"), (
        Turn("coder-m", "r", "f", 1, 1, 0.1, available=("coder-m", "sage-s")),
        Turn("sage-s", "r2", "", 1, 1, 0.1)), 1)
    replay = build_replay([episode], pool, count_tokens=words, max_tokens=100, reward=Reward(0.05, 0.99, 0.1))
    np.testing.assert_array_equal(replay.available[0], [n in ("coder-m", "sage-s") for n in pool.names])
    np.testing.assert_array_equal(replay.next_available[0], [True] * len(pool))
    np.testing.assert_array_equal(replay.available[1], [True] * len(pool))


def test_reference_cost_refuses_zero_cost_corpus():
    episode = Episode("e", Task("t", "p"), (Turn("coder-m", "r", "f", 1, 1, 0.0),), 1)
    with pytest.raises(ValueError, match="c_ref"):
        reference_cost([episode])


def test_reference_cost_is_the_mean_turn_cost_without_outliers_and_leaves_outliers_out(caplog):
    _, episodes = demo_corpus(3, seed=3)
    costs = [t.cost for e in episodes for t in e.turns]
    assert reference_cost(episodes) == float(np.mean(costs))  # bit for bit: nothing is left out of a normal corpus
    assert "c_ref" not in caplog.text
    broken = Episode("broken", Task("t", "p"), (Turn("m", "r", "f", 1, 1, 1e308), Turn("m", "r", "f", 1, 1, 1e300)), 1)
    assert reference_cost([*episodes, broken]) == float(np.mean(costs))  # not ~5e305: a cost-blind router
    assert "2 of" in caplog.text and "left out of the mean" in caplog.text


def test_one_episode_to_rows_path_feeds_the_replay_and_fresh_batches_alike():
    """`episode_rows` is the one place rewards and returns are made: the offline replay (text indices) and the
    online stage's freshly embedded batches (`transition_batch`) hold the same transitions."""
    from rivet_jax.encoders import HashingEncoder

    sim, episodes = demo_corpus(2, seed=5)
    lam, gamma, c_ref = 0.05, 0.99, 0.01
    replay = build_replay(episodes, sim.pool, count_tokens=words, max_tokens=16_384, reward=Reward(lam, gamma, c_ref))
    encoder = HashingEncoder(dim=16)
    table = encoder.encode(list(replay.texts))
    start = 0
    for episode in episodes:
        rows = episode_rows(episode, sim.pool, Reward(lam, gamma, c_ref))
        states = encoder.encode(episode_state_texts(episode.task.prompt, episode.turns, words))   # (T + 1, D)
        batch = transition_batch(rows, states, encoder.encode([t.response for t in episode.turns]))
        span = slice(start, start + len(episode.turns))
        np.testing.assert_array_equal(batch.h_t, table[replay.state[span]])
        np.testing.assert_array_equal(batch.h_tp1, table[replay.next_state[span]])
        np.testing.assert_array_equal(batch.e_o, table[replay.response[span]])
        for name in ("action", "reward", "done", "mc_return", "available", "next_available", "stochastic"):
            np.testing.assert_array_equal(getattr(batch, name), getattr(replay, name)[span], err_msg=name)
        # a draw of the random router (propensity 1/6) is stochastic; a fixed model's call (propensity 1) is not
        np.testing.assert_array_equal(replay.stochastic[span], [t.propensity < 1 for t in episode.turns])
        # G_0 by hand: every turn's -lambda c_t / c_ref discounted, plus the outcome at the last turn.
        costs = [t.cost for t in episode.turns]
        by_hand = sum(gamma ** k * (-lam * c / c_ref) for k, c in enumerate(costs))
        by_hand += gamma ** (len(costs) - 1) * episode.outcome
        assert rows["mc_return"][0] == pytest.approx(by_hand, rel=1e-12)
        start = span.stop
    assert start == len(replay)
    assert 0 < replay.stochastic.sum() < len(replay)  # the demo corpus has both kinds of logged choice
