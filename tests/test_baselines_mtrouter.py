"""The MTRouter-style baseline on a corpus whose answers are known by construction, and one RouteSim rollout.

The synthetic corpus has two models, `cheap` (cost 1 per call) and `dear` (cost 3 per call), and two task families:

  easy tasks  first turn: either model answers outright in 6 of 10 episodes; in the other 4 it hits a SyntaxError,
              after which `dear` always recovers (success) and `cheap` never does (failure). The logged second
              models are half and half, so both first models succeed in 8 of 10 episodes (equal success), at
              different remaining costs.
  hard tasks  one turn: `cheap` succeeds in 4 of 10 episodes, `dear` in 8 of 10.

Expected per-group success rates and normalised remaining costs are recomputed from the corpus itself.
"""

from collections import defaultdict

import jax
import numpy as np
import pytest

from configs import routesim as routesim_config
from rivet_jax.baselines.mtrouter import MTRouter, mean_episode_cost, supervised_targets
from rivet_jax.data.replay import Reward, build_replay
from rivet_jax.data.schema import Episode, ModelCard, ModelPool, Task, Turn
from rivet_jax.encoders import EmbeddingStore, HashingEncoder
from rivet_jax.envs import collect
from rivet_jax.envs.base import run_episode
from rivet_jax.envs.routesim import make_routesim

POOL = ModelPool((
    ModelCard("cheap", "Small fast model, the cheapest in the pool; brittle with code.", context_length=8_000,
              price_in_per_mtok=0.1, price_out_per_mtok=0.3),
    ModelCard("dear", "Large careful model that fixes broken code; the most expensive.", context_length=128_000,
              price_in_per_mtok=3.0, price_out_per_mtok=9.0),
))
COST = {"cheap": 1.0, "dear": 3.0}
ERROR = ("<execute>print(total</execute>", "SyntaxError: '(' was never closed")
EASY = [f"Add the numbers {a} and {b} and report the sum." for a, b in ((3, 5), (12, 7), (40, 2), (9, 9))]
HARD = [f"Prove that every group of order {n} is abelian." for n in (4, 9, 25, 49)]
FIT = dict(epochs=60, batch_size=64, lr=3e-3, hidden=64, card_dim=32, head_hidden=32, seed=0)


def turn(model: str, response: str, feedback: str) -> Turn:
    return Turn(model=model, response=response, feedback=feedback, prompt_tokens=100, completion_tokens=20,
                cost=COST[model])


def synthetic_episodes() -> list[Episode]:
    episodes = []

    def add(prompt, turns, outcome):
        task = Task(id=f"t{(EASY + HARD).index(prompt)}", prompt=prompt)
        episodes.append(Episode(episode_id=f"e{len(episodes)}", task=task, turns=tuple(turns), outcome=outcome))

    for prompt in EASY:
        for first in ("cheap", "dear"):
            for _ in range(6):
                add(prompt, [turn(first, "<solution> 8 </solution>", "Your answer is correct.")], 1)
            for second, outcome in (("cheap", 0), ("cheap", 0), ("dear", 1), ("dear", 1)):
                feedback = "Your answer is correct." if outcome else "Your answer is wrong."
                add(prompt, [turn(first, *ERROR), turn(second, "<solution> 8 </solution>", feedback)], outcome)
    for prompt in HARD:
        for model, successes in (("cheap", 4), ("dear", 8)):
            for k in range(10):
                ok = k < successes
                add(prompt, [turn(model, "<solution> proof </solution>",
                                  "Your answer is correct." if ok else "Your answer is wrong.")], int(ok))
    return episodes


def store() -> EmbeddingStore:
    return EmbeddingStore(HashingEncoder(dim=64))


@pytest.fixture(scope="module")
def corpus():
    return synthetic_episodes()


@pytest.fixture(scope="module")
def router(corpus):
    return MTRouter.fit(corpus, POOL, store(), lam=0.5, **FIT)


def logged_groups(episodes):
    """{(group, model): (outcomes, normalised remaining costs)} over the logged turns."""
    scale = mean_episode_cost(episodes)
    acc = defaultdict(list)
    for episode in episodes:
        family = "easy" if episode.task.prompt in EASY else "hard"
        remaining = sum(t.cost for t in episode.turns)
        for t, tn in enumerate(episode.turns):
            group = f"{family}-first" if t == 0 else "error"
            acc[(group, tn.model)].append((episode.outcome, remaining / scale))
            remaining -= tn.cost
    return {k: np.array(v).T for k, v in acc.items()}


def expected_groups(episodes):
    """{(group, model): (success rate, mean normalised remaining cost)}: what the estimators should learn."""
    return {k: (y.mean(), c.mean()) for k, (y, c) in logged_groups(episodes).items()}


def loss_floor(episodes) -> float:
    """The smallest mean loss any estimator of the groups can reach: binary entropy + cost variance per group."""
    total, count = 0.0, 0
    for y, c in logged_groups(episodes).values():
        p = np.clip(y.mean(), 1e-12, 1 - 1e-12)
        total += len(y) * (-(p * np.log(p) + (1 - p) * np.log(1 - p)) + c.var())
        count += len(y)
    return total / count


def states():
    """One state per group: (group, (task, history))."""
    error_history = [{"response": ERROR[0], "feedback": ERROR[1]}]
    return ([("easy-first", (p, [])) for p in EASY] + [("hard-first", (p, [])) for p in HARD]
            + [("error", (p, error_history)) for p in EASY])


def test_targets_are_outcome_and_cost_to_go(corpus):
    encoder = HashingEncoder(dim=64)
    replay = build_replay(corpus, POOL, count_tokens=encoder.count_tokens, max_tokens=16_384,
                          reward=Reward(0.0, 1.0, 1.0))
    outcome, cost_to_go = supervised_targets(corpus, replay)
    assert outcome.shape == cost_to_go.shape == (len(replay),)
    # an error episode cheap -> dear: two transitions, outcome 1 each, remaining cost 1 + 3 then 3
    i = next(i for i, e in enumerate(corpus) if [t.model for t in e.turns] == ["cheap", "dear"])
    rows = np.flatnonzero(replay.episode == i)
    np.testing.assert_array_equal(outcome[rows], [1, 1])
    np.testing.assert_allclose(cost_to_go[rows], [4.0, 3.0])
    # easy: 6*1 + 6*3 + 2*2 + 2*4 + 2*4 + 2*6 = 56 over 20 episodes; hard: (10*1 + 10*3) / 20 = 2
    assert mean_episode_cost(corpus) == pytest.approx((56 * 4 + 40 * 4) / (20 * 4 + 20 * 4))


def test_estimates_match_empirical_rates_and_costs(router, corpus):
    expected = expected_groups(corpus)
    assert expected[("easy-first", "cheap")][0] == pytest.approx(0.8)
    assert expected[("easy-first", "dear")][0] == pytest.approx(0.8)
    assert expected[("error", "cheap")][0] == 0 and expected[("error", "dear")][0] == 1
    groups, pairs = zip(*states())
    prob, cost = router.predict(list(pairs))
    assert prob.shape == cost.shape == (len(pairs), 2)
    assert router.episode_cost == pytest.approx(mean_episode_cost(corpus))
    for b, group in enumerate(groups):
        for m, model in enumerate(POOL.names):
            success, remaining = expected[(group, model)]
            assert prob[b, m] == pytest.approx(success, abs=0.06), (group, model)
            assert cost[b, m] == pytest.approx(remaining, abs=0.06), (group, model)


def test_routing_trades_success_against_cost(router):
    groups, pairs = zip(*states())
    picks = {g: set() for g in groups}
    for group, (task, history) in zip(groups, pairs):
        model, propensity = router.act(Task("x", task), history, POOL.names, np.random.default_rng(0))
        assert propensity == 1.0
        picks[group].add(model)
    # Cost in Q is remaining dollars / c_ref = normalised cost_hat x 2.4 (mean episode cost) / 2.0 (mean per-turn
    # cost, 384 dollars over 192 turns). Equal success (0.8): the cheaper first model, Q 0.8 - 0.5 * 1.8 / 2 vs
    # 0.8 - 0.5 * 3.8 / 2.
    assert picks["easy-first"] == {"cheap"}
    # After the error only dear recovers, and it is worth its cost: Q 0 - 0.5 * 1 / 2 vs 1 - 0.5 * 3 / 2.
    assert picks["error"] == {"dear"}
    # Hard tasks (0.4 vs 0.8 success): dear at lam 0 (see below), cheap once cost weighs more, Q -0.6 vs -2.2.
    q = router.with_lam(2.0).scores([pair for group, pair in states() if group == "hard-first"])
    assert (np.argmax(q, axis=1) == POOL.index("cheap")).all()


def test_cost_is_priced_in_units_of_c_ref_like_every_other_router(router, corpus):
    """lambda buys the same thing for every router: Q = score_hat - lam x expected remaining dollars / c_ref, with
    c_ref the corpus' mean per-turn cost (RIVET's Eq. 1 and the single-turn routers' utility)."""
    assert router.c_ref == pytest.approx(384 / 192)
    _, pairs = zip(*states())
    prob, cost = router.predict(list(pairs))
    np.testing.assert_allclose(router.scores(list(pairs)), prob - 0.5 * cost * mean_episode_cost(corpus) / 2.0,
                               rtol=1e-6)
    assert MTRouter.fit(corpus, POOL, store(), lam=0.5, c_ref=7.0, **{**FIT, "epochs": 1}).c_ref == 7.0


def test_lam_zero_ignores_cost(router):
    groups, pairs = zip(*states())
    free = router.with_lam(0.0)
    prob, _ = router.predict(list(pairs))
    np.testing.assert_array_equal(free.scores(list(pairs)), prob)
    q = free.scores(list(pairs))
    hard = [b for b, g in enumerate(groups) if g in ("hard-first", "error")]
    assert (np.argmax(q[hard], axis=1) == POOL.index("dear")).all()
    assert router.lam == 0.5  # with_lam is a copy


def test_availability_masks(router):
    _, pairs = zip(*states())
    error_state = pairs[-1]
    q = router.scores([error_state, error_state], available=[None, ["cheap"]])
    assert np.isfinite(q[0]).all() and q[1, POOL.index("dear")] == -np.inf and np.isfinite(q[1, 0])
    assert router.act(Task("x", error_state[0]), error_state[1], ["cheap"], np.random.default_rng(0))[0] == "cheap"
    with pytest.raises(ValueError, match="unknown models"):
        router.scores([error_state], available=[["nope"]])
    with pytest.raises(ValueError, match="no available model"):
        router.scores([error_state], available=[[]])


def test_losses_decrease(router, corpus):
    losses = [record["loss"] for record in router.history]
    assert len(losses) == FIT["epochs"]
    floor = loss_floor(corpus)
    assert losses[0] > floor + 0.3 and losses[-1] < floor + 0.03, (floor, losses[0], losses[-1])
    assert router.history[-1]["score_bce"] < router.history[0]["score_bce"]
    assert router.history[-1]["cost_mse"] < router.history[0]["cost_mse"]


def test_deterministic_and_independent_of_lam(router, corpus):
    """Same seed -> the same parameters; lam is a routing-time coefficient, the fit never reads it."""
    again = MTRouter.fit(corpus, POOL, store(), lam=0.0, **FIT)
    for a, b in zip(jax.tree.leaves(router.params), jax.tree.leaves(again.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert again.history == router.history


def test_routesim_rollout():
    config = routesim_config.get_config("tiny")
    sim = make_routesim(config.sim)
    episodes = collect.collect_corpus(sim, "train", seed=0)
    router = MTRouter.fit(episodes, sim.pool, store(), lam=0.05, epochs=3, hidden=32, card_dim=32, head_hidden=16)
    assert len(router.history) == 3 and all(np.isfinite(r["loss"]) for r in router.history)
    task = sim.tasks("test")[0]
    episode = run_episode(sim, task.id, router, np.random.default_rng(0), episode_id="mtrouter/0")
    assert episode.turns and episode.outcome in (0, 1)
    assert all(t.model in sim.pool.names and t.propensity == 1.0 for t in episode.turns)
