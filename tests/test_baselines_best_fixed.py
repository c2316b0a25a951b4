"""The best-fixed-model floor: the model with the best mean training return, at every turn."""

import numpy as np
import pytest

from rivet_jax.baselines.best_fixed import BestFixedRouter
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode, ModelCard, ModelPool, Task, Turn

POOL = ModelPool(tuple(ModelCard(name, f"model {name}", context_length=8_000, price_in_per_mtok=1.0,
                                 price_out_per_mtok=1.0) for name in ("a", "b", "c")))
TASK = Task(id="t", prompt="p")


def episode(models, costs, outcome, propensity=1.0):
    turns = tuple(Turn(model=m, response="r", feedback="f", prompt_tokens=1, completion_tokens=1, cost=c,
                       propensity=propensity) for m, c in zip(models, costs))
    return Episode(episode_id=f"e{id(turns)}", task=TASK, turns=turns, outcome=outcome)


def test_ranks_models_by_mean_training_return():
    episodes = [episode(["a"], [1.0], 1), episode(["a", "a"], [1.0, 1.0], 0),           # a: (0.5 + -0.75) / 2
                episode(["b"], [0.2], 1), episode(["b"], [0.2], 0),                     # b: (0.9 + -0.1) / 2
                episode(["c", "c"], [0.1, 0.1], 1, propensity=1 / 3)]                   # random: not a commitment
    # lam 0.5, c_ref 1, gamma 0.5: a single turn of cost 1 that succeeds returns 1 - 0.5; two turns of cost 1 that
    # fail return -0.5 - 0.5 * 0.5.
    router = BestFixedRouter.fit(episodes, POOL, reward=Reward(0.5, 0.5, 1.0))
    assert router.returns == pytest.approx({"a": (0.5 - 0.75) / 2, "b": (0.9 - 0.1) / 2})
    assert router.model == "b" and router.ranking == ["b", "a"]
    rng = np.random.default_rng(0)
    assert router.act(TASK, (), ["a", "b", "c"], rng) == ("b", 1.0)
    assert router.act(TASK, (), ["a", "c"], rng) == ("a", 1.0)     # b unavailable: the next best
    with pytest.raises(ValueError, match="none of the available models"):
        router.act(TASK, (), ["c"], rng)


def test_needs_a_committed_episode():
    with pytest.raises(ValueError, match="no logged episode committed to one model"):
        BestFixedRouter.fit([episode(["a", "b"], [1.0, 1.0], 1, propensity=1 / 3)], POOL, Reward(0.5, 1.0, 1.0))


def test_graded_outcomes_rank_by_mean_return():
    # lam 0.5, c_ref 1, gamma 0.5. a: 0.75 - 0.5 = 0.25 and 0.25 - 0.5 = -0.25, mean 0. b: one turn of cost 0.2
    # graded 0.4 returns 0.4 - 0.1 = 0.3; two turns of cost 0.2 graded 0.6 return -0.1 + 0.5 (-0.1 + 0.6) = 0.15;
    # mean 0.225.
    episodes = [episode(["a"], [1.0], 0.75), episode(["a"], [1.0], 0.25),
                episode(["b"], [0.2], 0.4), episode(["b", "b"], [0.2, 0.2], 0.6)]
    router = BestFixedRouter.fit(episodes, POOL, reward=Reward(0.5, 0.5, 1.0))
    assert router.returns == pytest.approx({"a": 0.0, "b": 0.225})
    assert router.ranking == ["b", "a"]


def test_on_explored_traffic_the_fixed_returns_are_weighted_by_the_recorded_propensities():
    # No episode is a commitment (every turn drawn, propensity < 1): WIS over the episodes that called one model
    # throughout. Worked by hand: "a" followed twice, weights 1/(0.5*0.5) = 4 (return 1) and 1/0.8 = 1.25 (return 0),
    # so a's return is (4 * 1 + 1.25 * 0) / 5.25; "b" once, its return 1; the mixed episode counts for neither.
    from rivet_jax.baselines.best_fixed import weighted_fixed_returns
    from rivet_jax.data.replay import Reward
    from rivet_jax.data.schema import Episode, ModelCard, ModelPool, Task, Turn

    def episode(i, models, propensities, outcome):
        turns = tuple(Turn(m, "r", "", 1, 1, 0.0, propensity=p, done=k == len(models) - 1)
                      for k, (m, p) in enumerate(zip(models, propensities)))
        return Episode(f"e{i}", Task(f"t{i}", "p"), turns, outcome)

    reward = Reward(0.0, 1.0, 1.0)
    episodes = [episode(0, "aa", (0.5, 0.5), 1), episode(1, "a", (0.8,), 0), episode(2, "b", (0.2,), 1),
                episode(3, "ab", (0.5, 0.5), 1)]
    returns = weighted_fixed_returns(episodes, reward)
    assert returns == pytest.approx({"a": 4.0 / 5.25, "b": 1.0})
    pool = ModelPool((ModelCard("a", "model a"), ModelCard("b", "model b")))
    assert BestFixedRouter.fit(episodes, pool, reward).model == "b"
