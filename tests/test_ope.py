"""Off-policy evaluation (rivet_jax/ope.py): the estimators' formulas by hand, their accuracy against RouteSim's exact
values on logs with stochastic loggers, what they refuse to estimate, and launch.evaluate_logs end to end."""

import dataclasses
import json

import numpy as np
import pytest

from configs import routesim as routesim_config
from rivet_jax import evaluation, fqe, offpolicy, ope
from rivet_jax.heldout import principal_features
from rivet_jax.settings import FQE_FEATURES
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode, ModelCard, ModelPool, Task, Turn
from rivet_jax.encoders import HashingEncoder
from rivet_jax.envs import collect
from rivet_jax.envs.base import FixedModelPolicy, RandomPolicy
from rivet_jax.envs.routesim import make_routesim
from rivet_jax.experiments import ope_validation
from tests.common import REPO, run_launcher
POOL = ModelPool((ModelCard("a", "model a"), ModelCard("b", "model b")))


def hand_episodes() -> list[Episode]:
    """Four episodes of a uniform logger over {a, b} (propensity 0.5): (model, cost) per turn, then the outcome."""
    def episode(name, turns, outcome):
        return Episode(name, Task("t", "task"), tuple(Turn(m, f"{name}{k}", "", 1, 1, cost, propensity=0.5)
                                                      for k, (m, cost) in enumerate(turns)), outcome)
    return [episode("e1", [("a", 0.1), ("a", 0.2)], 1), episode("e2", [("a", 0.1), ("b", 0.4)], 0),
            episode("e3", [("b", 0.3), ("a", 0.2)], 1), episode("e4", [("a", 0.3)], 0)]


def always_a(logs: ope.Logs) -> np.ndarray:
    return ope.target_distribution(FixedModelPolicy("a"), ope.state_requests(logs, POOL), POOL)


def test_per_decision_is_and_wis_by_hand():
    # lambda 1, c_ref 1, gamma 0.5: return rewards e1 (-0.1, 0.8), e2 (-0.1, -0.4), e3 (-0.3, 0.8), e4 (-0.3,).
    # Target: always a. Cumulative weights: e1 (2, 4), e2 (2, 0), e3 (0, 0), e4 (2, then kept at 2).
    logs = ope.read_logs(hand_episodes(), POOL, reward=Reward(1.0, 0.5, 1.0))
    weights = ope.cumulative_weights(logs, always_a(logs))
    assert weights.tolist() == [[2, 4], [2, 0], [0, 0], [2, 2]]
    ones = np.ones((1, 4))  # one "resample": every episode once
    # IS: (2(-0.1) + 0.5 * 4 * 0.8  +  2(-0.1)  +  0  +  2(-0.3)) / 4 = 0.6 / 4
    # success (gamma 1): 4 * 1 / 4; cost: (2 * 0.1 + 4 * 0.2 + 2 * 0.1 + 2 * 0.3) / 4
    assert (ones @ ope.is_terms(logs, weights) / 4)[0] == pytest.approx([0.15, 1.0, 0.45])
    # WIS: turn 0: (-0.2 - 0.2 - 0.6) / 6; turn 1: 4 * 0.8 / (4 + 2), discounted by 0.5
    # success: 0 + 4 / 6; cost: (0.2 + 0.2 + 0.6) / 6 + 4 * 0.2 / 6
    assert ope.wis(logs, weights, ones)[0] == pytest.approx([-1 / 6 + 0.5 * 3.2 / 6, 4 / 6, 1.8 / 6])


def test_doubly_robust_by_hand():
    """With Q = c everywhere: e1 1.4 - 2c, e2 -0.2, e3 c, e4 -0.6 - c, so DR = (0.6 - 2c) / 4; c = 0 is IS."""
    logs = ope.read_logs(hand_episodes(), POOL, reward=Reward(1.0, 0.5, 1.0))
    weights = ope.cumulative_weights(logs, always_a(logs))
    for c in (0.0, 0.3, -1.0):
        q = np.full((len(logs.action), 3), c)
        assert (np.ones(4) @ ope.dr_terms(logs, weights, q, q) / 4)[0] == pytest.approx((0.6 - 2 * c) / 4)


def test_fitted_q_evaluation_by_hand():
    """Features one-hot in the turn (a table), ridge ~0: Q(s1, a) = mean of the terminal rewards after a at turn 1
    (e1, e3: 0.8), Q(s0, a) = mean of r + 0.5 Q(s1, a) over e1, e2, e4: (0.3 + 0.3 - 0.3) / 3."""
    logs = ope.read_logs(hand_episodes(), POOL, reward=Reward(1.0, 0.5, 1.0))
    turn = np.concatenate([np.arange(len(e.turns)) for e in logs.episodes])
    features = np.eye(2)[turn]
    fitted = fqe.fit_fqe(logs, features, always_a(logs)[None], np.ones(len(turn)), ridge=1e-9, iterations=2)
    assert fitted.value[logs.first, 0, 0] == pytest.approx([0.1] * 4, abs=1e-6)
    # success: Q(s1, a) = 1, Q(s0, a) = (1 + 1 + 0) / 3; cost: Q(s1, a) = 0.2, Q(s0, a) = (0.3 + 0.3 + 0.3) / 3
    assert fitted.value[0, 0] == pytest.approx([0.1, 2 / 3, 0.3], abs=1e-6)
    assert fitted.value[1, 0] == pytest.approx([0.8, 1.0, 0.2], abs=1e-6)
    assert fitted.logged[3, 0, 0] == pytest.approx(-0.4, abs=1e-6)   # e2's b at turn 1: its one reward
    result = ope.evaluate(logs, {"a": always_a(logs)}, features, resamples=20, ridge=1e-9, iterations=2)
    rows = {r["estimator"]: r for r in result["rows"]}
    assert rows["IS"]["return"] == pytest.approx(0.15) and rows["FQE"]["return"] == pytest.approx(0.1, abs=1e-6)
    # e1 (weight 4) and e4 (weight 2) call a at every turn: ESS (4 + 2)^2 / (16 + 4)
    assert rows["IS"]["followed"] == 2 and rows["IS"]["ess"] == pytest.approx(1.8)
    for row in rows.values():
        assert row["return_lo"] <= row["return_hi"] and row["cost_lo"] <= row["cost_hi"]


def test_what_importance_sampling_refuses():
    episodes = hand_episodes()
    missing = [dataclasses.replace(e, turns=tuple(dataclasses.replace(t, propensity=None) for t in e.turns))
               for e in episodes]
    deterministic = [dataclasses.replace(e, turns=tuple(dataclasses.replace(t, propensity=1.0) for t in e.turns))
                     for e in episodes]
    for logs_of, said, defined in ((missing, "no propensities", False), (deterministic, "deterministically", False),
                                   (episodes[:2] + deterministic[2:], "the 2 of 4 episodes", True)):
        logs = ope.read_logs(logs_of, POOL, reward=Reward(1.0, 0.5, 1.0))
        result = ope.evaluate(logs, {"a": always_a(logs)}, np.ones((len(logs.action), 1)), resamples=5)
        assert said in result["support"]
        rows = {r["estimator"]: r for r in result["rows"]}
        assert not np.isnan(rows["FQE"]["return"])
        assert all(np.isnan(rows[name]["return"]) != defined for name in ("IS", "WIS", "DR"))


def test_a_stochastic_target_must_be_the_random_router():
    class Coin:
        name = "coin"

        def act(self, task, history, available, rng):
            return available[0], 0.5

    logs = ope.read_logs(hand_episodes(), POOL, reward=Reward(1.0, 0.5, 1.0))
    requests = ope.state_requests(logs, POOL)
    with pytest.raises(ValueError, match="deterministic"):
        ope.target_distribution(Coin(), requests, POOL)
    assert ope.target_distribution(RandomPolicy(), requests, POOL).tolist() == [[0.5, 0.5]] * 7


# A two-turn problem with known values: at each turn a model answers and solves the task with probability SOLVE
# (the episode ends with outcome 1), else the next turn comes (after the second, the episode ends with outcome 0).
PRICE, SOLVE = {"a": 0.0, "b": 0.2}, {"a": 0.1, "b": 0.8}
LOGGER = {"a": 0.7, "b": 0.3}  # the behaviour policy at both turns


def two_turn_episodes(count: int, seed: int) -> list[Episode]:
    rng = np.random.default_rng(seed)
    episodes = []
    for i in range(count):
        turns, outcome = [], 0
        for _ in range(2):
            model = "a" if rng.random() < LOGGER["a"] else "b"
            turns.append(Turn(model, "r", "f", 1, 1, PRICE[model], propensity=LOGGER[model]))
            if rng.random() < SOLVE[model]:
                outcome = 1
                break
        episodes.append(Episode(f"e{i}", Task(f"t{i}", "task"), tuple(turns), outcome))
    return episodes


def two_turn_truth(first: dict[str, float], second: dict[str, float], gamma: float) -> dict[str, float]:
    """J (lambda 1, c_ref 1), success and cost of the policy calling m with probability first[m], then second[m]."""
    def gain(m: str, channel: int) -> float:  # what one call of m pays: Eq. 1's reward, success, cost
        return (-PRICE[m] + SOLVE[m], SOLVE[m], PRICE[m])[channel]

    out = {}
    for c, (channel, g) in enumerate(zip(ope.CHANNELS, (gamma, 1.0, 1.0))):
        later = sum(p * gain(m, c) for m, p in second.items())
        out[channel] = sum(p * (gain(m, c) + (1 - SOLVE[m]) * g * later) for m, p in first.items())
    return out


class AThenB:
    name = "a-then-b"

    def act(self, task, history, available, rng):
        return ("a" if not history else "b"), 1.0


def test_estimators_converge_to_the_truth_of_a_two_turn_problem():
    """5,000 episodes of a logger calling a with 0.7: every estimator of three targets within 0.05 of the exact
    values on every channel (always b: J 0.708, a then b: 0.586, uniform: 0.523; the logger's own J is 0.405, so an
    estimator that ignored the weights would be off by up to 0.3), and most 95% intervals of J cover the truth (the
    estimators share the episodes, so their misses come together: other seeds miss up to 2 of the 15)."""
    gamma = 0.9
    logs = ope.read_logs(two_turn_episodes(5000, seed=3), POOL, reward=Reward(1.0, gamma, 1.0))
    requests = ope.state_requests(logs, POOL)
    policies = {"b": FixedModelPolicy("b"), "a-then-b": AThenB(), "uniform": RandomPolicy()}
    truths = {"b": two_turn_truth({"b": 1}, {"b": 1}, gamma), "a-then-b": two_turn_truth({"a": 1}, {"b": 1}, gamma),
              "uniform": two_turn_truth({"a": 0.5, "b": 0.5}, {"a": 0.5, "b": 0.5}, gamma)}
    assert truths["b"]["return"] == pytest.approx(0.708) and truths["a-then-b"]["success"] == pytest.approx(0.82)
    assert two_turn_truth(LOGGER, LOGGER, gamma)["return"] == pytest.approx(0.40525)
    turn = np.concatenate([np.arange(len(e.turns)) for e in logs.episodes])
    result = ope.evaluate(logs, {name: ope.target_distribution(p, requests, POOL) for name, p in policies.items()},
                          np.eye(2)[turn], resamples=100)
    for row in result["rows"]:
        truth = truths[row["policy"]]
        for channel in ope.CHANNELS:
            assert abs(row[channel] - truth[channel]) < 0.05, (row["policy"], row["estimator"], channel, row[channel])
    covered = [r["return_lo"] <= truths[r["policy"]]["return"] <= r["return_hi"] for r in result["rows"]]
    assert sum(covered) >= 12, covered


@pytest.fixture(scope="module")
def routesim_logs():
    """RouteSim's benchmark: the corpus of `launch.collect` (six fixed models and the random router) on 40 training
    tasks, every estimate for the fixed models and the random router, and their exact values on those tasks."""
    sim = make_routesim(routesim_config.get_config().sim)
    episodes = collect.collect_corpus(sim, "train", seed=0, num_tasks=40)
    lam, gamma, c_ref = 0.05, 0.99, 0.002
    truth = {f"fixed:{m}": ope_validation.exact_truth(sim, episodes, k, Reward(lam, gamma, c_ref))
             for k, m in enumerate(sim.pool.names)}
    truth["random"] = ope_validation.exact_truth(sim, episodes, "random", Reward(lam, gamma, c_ref))
    logs = ope.read_logs(episodes, sim.pool, Reward(lam, gamma, c_ref))
    targets = offpolicy.targets_of(offpolicy.reference_policies(sim.pool), logs, sim.pool)
    features = principal_features(ope.state_embeddings(logs, HashingEncoder(256), 16_384), 0)
    return episodes, truth, ope.evaluate(logs, targets, features, resamples=40, seed=0)


@pytest.mark.slow
def test_estimates_against_routesim_truth(routesim_logs):
    episodes, truth, result = routesim_logs
    assert (result["episodes"], result["supported"]) == (280, 40) and "mixture" in result["support"]
    rows = {(r["policy"], r["estimator"]): r for r in result["rows"]}
    # the random router's own episodes have weight 1 for it at every turn: IS and WIS are their mean return
    own = [evaluation.discounted_return(e, Reward(0.05, 0.99, 0.002)) for e in episodes
           if e.episode_id.startswith("random")]
    assert rows["random", "IS"]["return"] == pytest.approx(np.mean(own)) == rows["random", "WIS"]["return"]
    # a fixed model's IS rests on the random episodes that happened to call it at every turn: hardly any
    assert all(rows[p, "IS"]["followed"] <= 2 for p in truth if p != "random")
    # FQE uses every episode: within 0.15 of every truth (they span 1.1: apex-pro -0.65 .. apex-flash 0.52), and
    # most of its intervals cover it; DR and WDR of the random router likewise
    errors = np.array([rows[p, "FQE"]["return"] - truth[p]["return"] for p in truth])
    assert np.abs(errors).max() < 0.15, errors
    assert sum(rows[p, "FQE"]["return_lo"] <= truth[p]["return"] <= rows[p, "FQE"]["return_hi"] for p in truth) >= 5
    for estimator in ("DR", "WDR"):
        assert abs(rows["random", estimator]["return"] - truth["random"]["return"]) < 0.15
    for p in truth:  # success and cost are estimated the same way, channel by channel
        assert abs(rows[p, "FQE"]["success"] - truth[p]["success"]) < 0.15
        assert abs(rows[p, "FQE"]["cost"] - truth[p]["cost"]) < 0.3 * truth[p]["cost"]


@pytest.fixture(scope="module")
def tiny_router(routesim_tiny_run):
    return routesim_tiny_run


@pytest.mark.slow
def test_evaluate_logs_end_to_end(tiny_router):
    config, workdir, corpus = tiny_router
    sim = make_routesim(config.sim)
    heldout = workdir / "heldout"
    collect.write_corpus(heldout, sim, collect.collect_corpus(sim, "test", seed=5))
    result = offpolicy.evaluate_logs(workdir / "train", heldout / collect.EPISODES_FILE, heldout / collect.CARDS_FILE,
                                     baselines=False, resamples=10)
    policies = [r["policy"] for r in result["rows"]]
    # RouteSim's tasks carry families: the best fixed model per family is a reference too
    assert policies[::5] == ["RIVET (ours)", "Best fixed (train)", "Best fixed per family (train)",
                             *[f"fixed:{m}" for m in sim.pool.names], "random"]
    saved = json.loads((workdir / "train" / "ope.json").read_text())
    assert saved["episodes"] == 70 and saved["supported"] == 10 and "mixture" in saved["support"]
    table = (workdir / "train" / "ope.md").read_text()
    assert "| RIVET (ours) | DR |" in table and "| fixed:apex-pro | IS (thin) |" in table
    fewer = offpolicy.evaluate_logs(workdir / "train", heldout / collect.EPISODES_FILE, heldout / collect.CARDS_FILE,
                                    baselines=False, resamples=10, out=workdir / "fewer", max_features=16)
    assert fewer["fqe_features"] == 16        # by default the top FQE_FEATURES directions, or all of a narrower one
    assert saved["fqe_features"] == min(FQE_FEATURES, config.encoder.dim) > 16
    assert [r["policy"] for r in fewer["rows"]] == [r["policy"] for r in result["rows"]]


def test_a_fixed_model_missing_at_a_state_calls_the_fallback_there_or_is_left_out(caplog):
    logs = ope.read_logs(hand_episodes(), POOL, Reward(0.0, 1.0, 1.0))
    available = np.ones((7, 2), bool)                 # 7 logged states; model b is missing at the second
    available[1, 1] = False
    logs = dataclasses.replace(logs, available=available)
    assert offpolicy.missing_shares(POOL, available) == {"b": pytest.approx(1 / 7)}

    references = offpolicy.reference_policies(POOL, available, fallback=FixedModelPolicy("a"))
    assert set(references) == {"fixed:a", "fixed:b", "random"}
    target = ope.target_distribution(references["fixed:b"], ope.state_requests(logs, POOL), POOL)
    expected = np.tile([0.0, 1.0], (7, 1))
    expected[1] = [1.0, 0.0]                           # the fallback's model where b is missing
    np.testing.assert_array_equal(target, expected)

    with caplog.at_level("WARNING"):
        alone = offpolicy.reference_policies(POOL, available)
    assert set(alone) == {"fixed:a", "random"} and "b 14%" in caplog.text
    with pytest.raises(ValueError, match="'b' is not available"):
        ope.target_distribution(FixedModelPolicy("b"), ope.state_requests(logs, POOL), POOL)


@pytest.mark.slow
def test_evaluate_logs_on_logs_where_a_model_is_missing_on_some_tasks(tiny_router):
    """Logs of many models seldom hold every model on every task: the fixed model's row falls back to the best
    fixed model there, and the report says where."""
    config, workdir, corpus = tiny_router
    sim = make_routesim(config.sim)
    heldout = workdir / "heldout_missing"
    episodes = collect.collect_corpus(sim, "test", seed=5)
    missing, others = sim.pool.names[0], tuple(sim.pool.names[1:])
    first_task = episodes[0].task.id
    episodes = [e if e.task.id != first_task or e.turns[0].model == missing else
                dataclasses.replace(e, turns=tuple(dataclasses.replace(t, available=others) for t in e.turns))
                for e in episodes]
    collect.write_corpus(heldout, sim, episodes)
    out = workdir / "missing_out"
    result = offpolicy.evaluate_logs(workdir / "train", heldout / collect.EPISODES_FILE, heldout / collect.CARDS_FILE,
                                     baselines=False, resamples=10, out=out)
    assert set(result["fixed_fallback"]) == {missing} and 0 < result["fixed_fallback"][missing] < 0.2
    assert f"fixed:{missing}" in {r["policy"] for r in result["rows"]}
    assert f"so Best fixed (train) decides there (the share of states): {missing}" in (out / "ope.md").read_text()


def test_launcher_names_the_missing_logs(tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(REPO)
    done = run_launcher(capfd, "evaluate_logs", f"--workdir={tmp_path}")
    assert done.returncode == 1 and "--episodes and --cards" in done.stderr and "Traceback" not in done.stderr


def test_held_out_split_keeps_to_the_manifests_tasks(tmp_path, caplog):
    from rivet_jax.config_checks import ConfigError
    from rivet_jax.data.schema import Episode, Task, Turn

    def episode(task):
        turn = Turn(model="m", response="", feedback="", prompt_tokens=1, completion_tokens=1, cost=0.0)
        return Episode(f"p/{task}", Task(task, task), (turn,), 1)

    logs = [episode(t) for t in ("a", "b", "c", "a")]
    with pytest.raises(ConfigError, match="has no splits.json"):
        offpolicy.held_out_split(logs, tmp_path, "test")
    (tmp_path / "splits.json").write_text(json.dumps({"train": ["a"], "validation": ["b"], "test": ["c"]}))
    assert [e.task.id for e in offpolicy.held_out_split(logs, tmp_path, "test")] == ["c"]
    assert [e.task.id for e in offpolicy.held_out_split(logs, tmp_path, "validation")] == ["b"]
    assert offpolicy.held_out_split(logs, tmp_path, None) == logs
    assert "2 of the 4 episodes are of tasks" in caplog.text


def test_fqe_is_linear_in_lambda_so_two_fits_give_every_lambda():
    """launch.calibrate reads J at each router's lambda from fits at lambda 0 and 1: FQE (ridge fixed) is linear in
    the rewards, so J(0.3) = 0.7 J(0) + 0.3 J(1), point and every resample alike."""
    episodes = two_turn_episodes(300, seed=5)
    fits = {}
    for lam in (0.0, 1.0, 0.3):
        logs = ope.read_logs(episodes, POOL, reward=Reward(lam, 0.9, 1.0))
        turn = np.concatenate([np.arange(len(e.turns)) for e in logs.episodes])
        targets = {"b": ope.target_distribution(FixedModelPolicy("b"), ope.state_requests(logs, POOL), POOL)}
        fits[lam] = ope.evaluate(logs, targets, np.eye(2)[turn], resamples=20, ridge=0.1, keep_draws=True)
    point = {lam: next(r["return"] for r in fit["rows"] if r["estimator"] == "FQE") for lam, fit in fits.items()}
    assert point[0.3] == pytest.approx(0.7 * point[0.0] + 0.3 * point[1.0])
    draws = {lam: fit["draws"]["FQE"][:, 0, 0] for lam, fit in fits.items()}
    np.testing.assert_allclose(draws[0.3], 0.7 * draws[0.0] + 0.3 * draws[1.0], rtol=1e-6)  # float32 products


def test_policy_values_from_the_choosing_policies_alone_equal_the_dense_sum_over_every_model():
    """V read from each model's choosing policies only (a column read at most states everywhere, the others at their
    own states) equals the sum over every model of pi(m | s) Q(s, m), at all states and at a subset's."""
    rng = np.random.default_rng(0)
    num_states, dim, models, channels = 40, 6, 5, 3
    features = rng.normal(size=(num_states, dim)).astype(np.float32)
    coef = rng.normal(size=(dim, models, 5, channels))
    always = lambda m: np.eye(models)[np.full(num_states, m)]                              # (N, M) one-hot
    mixed = rng.dirichlet(np.ones(models), size=num_states) * (rng.random((num_states, models)) < 0.5)
    router = np.eye(models)[np.where(rng.random(num_states) < 0.2, 1, 4)]                 # model 1 at ~a fifth
    targets = np.stack([always(0), always(3), mixed / mixed.sum(1, keepdims=True).clip(1e-9), always(3), router])
    dense = np.einsum("nd,dmpc,pnm->npc", features.astype(np.float64), coef, targets)      # every model's Q, summed
    columns = fqe.Columns.of(targets)
    assert list(columns.policies[3]) == [1, 2, 3] and 0 not in columns.policies[1]         # model 3: only those
    sparse = {m: (list(policies), len(states)) for m, policies, states, _ in columns.sparse}
    assert 4 in sparse[1][0] and sparse[1][1] < num_states                                 # the router's rare model
    assert all(4 not in policies for m, policies in columns.dense if m == 1)
    np.testing.assert_allclose(fqe.policy_values(features, coef, columns), dense, rtol=1e-5, atol=1e-5)
    subset = np.flatnonzero(rng.random(num_states) < 0.6)
    np.testing.assert_allclose(fqe.policy_values(features[subset], coef, columns.at(subset)), dense[subset],
                               rtol=1e-5, atol=1e-5)
    action = rng.integers(models, size=num_states)
    np.testing.assert_allclose(fqe.logged_q(features, coef, action),
                               np.einsum("nd,dnpc->npc", features.astype(np.float64), coef[:, action]),
                               rtol=1e-5, atol=1e-5)


def test_principal_features_of_states_on_few_directions_give_the_fit_of_the_whole_embedding():
    """FQE on the embedding's top-k principal directions equals FQE on the whole embedding when the states vary
    along k directions only (the ridge penalty does not change under rotation, the unpenalised intercept takes the
    mean), and k >= D gives the whole embedding back."""
    logs = ope.read_logs(two_turn_episodes(200, seed=3), POOL, reward=Reward(0.3, 0.9, 1.0))
    n, rng = len(logs.action), np.random.default_rng(5)
    h = rng.normal(size=(n, 2)) @ rng.normal(size=(2, 6)) + rng.normal(size=6)          # (N, 6) on a 2-d plane
    requests = ope.state_requests(logs, POOL)
    targets = np.stack([ope.target_distribution(FixedModelPolicy(m), requests, POOL) for m in POOL.names]
                       + [np.full((n, len(POOL)), 1 / len(POOL))])
    plain = np.concatenate([h, np.ones((n, 1))], axis=1)
    whole = fqe.fit_fqe(logs, plain, targets, np.ones(n), 0.1, 3)
    projected = principal_features(h, 2)
    assert projected.shape == (n, 3)
    np.testing.assert_allclose(fqe.fit_fqe(logs, projected, targets, np.ones(n), 0.1, 3).value, whole.value,
                               atol=1e-4)
    np.testing.assert_array_equal(principal_features(h, 6), plain)
    one = fqe.fit_fqe(logs, principal_features(h, 1), targets, np.ones(n), 0.1, 3).value
    assert np.abs(one - whole.value).max() > 1e-3                      # a direction the states vary along: it counts


def test_a_fit_that_keeps_no_transition_of_a_model_values_it_at_zero():
    """A fold or resample can keep no episode that called some model (the 400 episodes of one live round, five
    folds): its Q is the ridge fit on nothing, 0, and the other models' Q are fitted as usual. Kept: e1 and e4, which
    call a only; by hand (as above) Q(s1, a) = 0.8 (e1's last turn), Q(s0, a) = (0.3 - 0.3) / 2."""
    logs = ope.read_logs(hand_episodes(), POOL, reward=Reward(1.0, 0.5, 1.0))
    turn = np.concatenate([np.arange(len(e.turns)) for e in logs.episodes])
    requests = ope.state_requests(logs, POOL)
    targets = np.stack([ope.target_distribution(FixedModelPolicy(m), requests, POOL) for m in ("a", "b")])
    kept = np.isin(logs.episode, [0, 3]).astype(float)                               # e1, e4
    fitted = fqe.fit_fqe(logs, np.eye(2)[turn], targets, kept, ridge=1e-9, iterations=2)
    assert fitted.value[[0, 1], 0, 0] == pytest.approx([0.0, 0.8], abs=1e-6)          # always a at e1's two states
    assert np.all(fitted.value[:, 1] == 0.0) and np.all(fitted.coef[:, 1] == 0.0)     # always b: nothing to fit


def test_a_fit_that_leaves_episodes_out_reads_at_the_others_what_a_fit_on_the_others_alone_does():
    """A bootstrap resample's or a fold's fit (weight 0 on some episodes) reads V only at the states of the episodes
    it keeps: there it equals the fit on the logs of those episodes alone, every state's value included."""
    episodes = two_turn_episodes(120, seed=5)
    rng = np.random.default_rng(6)
    multiplicity = rng.integers(0, 3, size=len(episodes)).astype(float)           # ~1/3 of the episodes left out
    kept = [e for e, w in zip(episodes, multiplicity) if w > 0]
    logs, alone = (ope.read_logs(e, POOL, reward=Reward(0.3, 0.9, 1.0)) for e in (episodes, kept))
    features = np.concatenate([rng.normal(size=(len(logs.action), 3)), np.ones((len(logs.action), 1))], axis=1)
    rows = np.repeat(multiplicity > 0, logs.live.sum(axis=1))                      # (N,) the kept episodes' states
    targets = np.stack([ope.target_distribution(p, ope.state_requests(logs, POOL), POOL)
                        for p in (FixedModelPolicy("a"), FixedModelPolicy("b"), RandomPolicy())])
    weights = multiplicity[logs.episode]
    fitted = fqe.fit_fqe(logs, features, targets, weights, 0.1, 2)
    reference = fqe.fit_fqe(alone, features[rows], targets[:, rows], weights[rows], 0.1, 2)
    np.testing.assert_allclose(fitted.value[rows], reference.value, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fitted.logged[rows], reference.logged, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fitted.coef, reference.coef, rtol=1e-5, atol=1e-6)


def test_fqe_fitting_each_models_choosing_policies_until_the_last_round_fits_what_fitting_all_does():
    """fit_fqe regresses Q(., m) only for the policies that choose m until its last round: the values it reads are
    those of the fit that regresses every policy every round (written out here), to float tolerance."""
    episodes = two_turn_episodes(200, seed=3)
    logs = ope.read_logs(episodes, POOL, reward=Reward(0.3, 0.9, 1.0))
    rng = np.random.default_rng(4)
    features = np.concatenate([rng.normal(size=(len(logs.action), 3)), np.ones((len(logs.action), 1))], axis=1)
    requests = ope.state_requests(logs, POOL)
    targets = np.stack([ope.target_distribution(FixedModelPolicy(m), requests, POOL) for m in POOL.names]
                       + [np.full((len(logs.action), len(POOL)), 1 / len(POOL))])                # (P, N, M)
    weights, ridge, iterations = rng.integers(0, 3, size=len(logs.action)).astype(float), 0.1, 3
    fitted = fqe.fit_fqe(logs, features, targets, weights, ridge, iterations)
    # Every policy regressed every round: the fit before this change, step by step
    varies = features.min(axis=0) != features.max(axis=0)
    penalty = np.diag(ridge * np.where(varies, 1.0, 1e-6))
    following = np.where(logs.terminal, 0, np.arange(len(features)) + 1)
    coef = np.zeros((features.shape[1], len(POOL), len(targets), logs.reward.shape[1]))
    for _ in range(iterations):
        value = np.einsum("nd,dmpc,pnm->npc", features, coef, targets)
        future = np.where(logs.terminal[:, None, None], 0.0, value[following])
        y = logs.reward[:, None, :] + logs.discount[None, None, :] * future                     # (N, P, C)
        for m in range(len(POOL)):
            rows = np.flatnonzero((logs.action == m) & (weights > 0))
            x = features[rows] * weights[rows, None]
            solved = np.linalg.solve(features[rows].T @ x + penalty, x.T @ y[rows].reshape(len(rows), -1))
            coef[:, m] = solved.reshape(coef.shape[0], *coef.shape[2:])
    np.testing.assert_allclose(fitted.coef, coef, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fitted.value, np.einsum("nd,dmpc,pnm->npc", features, coef, targets), atol=1e-5)
