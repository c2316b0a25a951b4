"""The validated choice and the verdict (rivet_jax/deploy.py, verdict.py, pipeline.py): never worse than the best
fixed model on validation, loaded by default, and a verdict whose every warning fires on the case it names."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from rivet_jax.data.replay import Reward
import rivet_jax

from configs import default
from rivet_jax import deploy, heldout, ope
from rivet_jax.baselines.best_fixed import BEST_PER_FAMILY
from rivet_jax.data.model_pool import write_model_cards
from rivet_jax.data.profile import profile_logs
from rivet_jax.data.schema import Episode, ModelCard, ModelPool, Task, Turn, write_episodes
from rivet_jax.settings import with_overrides
from rivet_jax.pipeline import conservatism, fit
from rivet_jax.router import Choice, Recentring, Router, keep_previous
from rivet_jax.verdict import Routing, identical_fixed, routing_of, verdict, warnings_of

NAMES = ("ace", "bee", "cat")
POOL = ModelPool(tuple(ModelCard(name, f"model {name}: a general assistant", context_length=8_000,
                                 price_in_per_mtok=1.0, price_out_per_mtok=1.0) for name in NAMES))


def turn(model, cost=0.01, propensity=None):
    return Turn(model=model, response=f"{model} says hi", feedback="ok", prompt_tokens=10, completion_tokens=10,
                cost=cost, propensity=propensity)


def ab_episode(task_id, model, outcome, turns=2, family=None):
    """One A/B episode: `model` answers every turn."""
    task = Task(task_id, f"Task {task_id}: add the numbers of line {task_id}.", family=family)
    return Episode(f"{task_id}/{model}", task, tuple(turn(model) for _ in range(turns)), outcome)


# ------------------------------------------------------------------------------------------- the small parts


def test_recentring_at_k_0_always_calls_the_best_floor_and_at_k_1_keeps_the_differences():
    floor, centre = np.array([0.2, 0.5, 0.1]), np.array([1.0, 3.0, -1.0])
    q = np.array([[9.0, 3.0, -1.0], [1.0, 3.5, 4.0]])
    assert (np.argmax(Recentring(floor, centre, 0.0)(q), axis=1) == 1).all()
    np.testing.assert_allclose(Recentring(floor, centre, 1.0)(q), [[8.2, 0.5, 0.1], [0.2, 1.0, 5.1]])
    np.testing.assert_allclose(Recentring(floor, centre, 0.5)(q), [[4.2, 0.5, 0.1], [0.2, 0.75, 2.6]])


def test_recentring_per_group_scores_each_state_against_its_groups_floor_and_centre():
    floor, centre = np.array([0.2, 0.5, 0.1]), np.array([1.0, 3.0, -1.0])
    math_floor, math_centre = np.array([0.6, 0.1, 0.3]), np.array([0.0, 1.0, 2.0])
    q = np.array([[9.0, 3.0, -1.0], [9.0, 3.0, -1.0], [9.0, 3.0, -1.0]])
    grouped = Recentring(floor, centre, 0.5, {"math": (math_floor, math_centre)})
    # math: 0.6 + 0.5 * 9, 0.1 + 0.5 * 2, 0.3 + 0.5 * -3; a group it does not list and no group: the overall levels
    np.testing.assert_allclose(grouped(q, ["math", "code", None]), [[5.1, 1.1, -1.2], [4.2, 0.5, 0.1], [4.2, 0.5, 0.1]])
    np.testing.assert_allclose(grouped(q), Recentring(floor, centre, 0.5)(q))          # groups unknown: overall
    route_by_group = Recentring(floor, centre, 0.0, {"math": (math_floor, math_centre)})
    assert np.argmax(route_by_group(q, ["math", "code", "math"]), axis=1).tolist() == [0, 1, 0]   # its group's best
    with pytest.raises(ValueError, match="2 groups for 3 states"):
        grouped(q, ["math", None])


def test_a_committed_router_keeps_the_previous_model_while_it_is_available():
    q = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, -np.inf, 3.0]])
    kept = keep_previous(q, np.array([-1, 0, 1]))   # a first turn; previous ace; previous bee, now unavailable
    assert np.argmax(kept, axis=1).tolist() == [2, 0, 2]
    assert kept[1].tolist() == [1.0, -np.inf, -np.inf]


def test_the_bootstrap_draws_whole_tasks():
    counts = ope.bootstrap_counts(np.array(["t1", "t1", "t2", "t3", "t3", "t3"]), resamples=50, seed=0)
    assert counts.shape == (50, 6)
    assert (counts[:, 0] == counts[:, 1]).all() and (counts[:, 3] == counts[:, 4]).all()
    assert (counts[:, [0, 2, 3]].sum(axis=1) == 3).all()  # three tasks drawn per resample


def test_the_profile_and_the_conservatism_grid_follow_from_the_logs():
    ab = [ab_episode(f"t{i}", m, 1) for i in range(4) for m in NAMES]
    profile = profile_logs(ab, POOL)
    assert profile.ab_logs and profile.single_model_share == 1.0 and profile.stochastic_share == 0.0
    assert profile.tasks_per_model == {m: 4 for m in NAMES} and profile.complete_task_share == 1.0
    config = default.get_config()  # alpha 0.1 on every transition; grid alphas (0, 0.01, 0.1) x (stochastic, all)
    # no draws in A/B logs: "CQL on draws" is no CQL at all, so only three distinct settings remain
    assert list(conservatism(config, profile)) == ["alpha=0.1,cql_on=all", "alpha=0", "alpha=0.01,cql_on=all"]
    mixed = ab[:-1] + [Episode("r", ab[0].task, (turn("ace", propensity=1 / 3), turn("cat", propensity=1 / 3)), 1)]
    profile = profile_logs(mixed, POOL)
    assert not profile.ab_logs and profile.stochastic_share == pytest.approx(2 / 24)
    assert profile.single_model_share == pytest.approx(11 / 12) and profile.complete_task_share == 0.75
    assert len(conservatism(config, profile)) == 5


def test_committed_estimates_are_the_logged_values_of_each_tasks_first_choice():
    """Two tasks, every model logged once on each: J, success and cost of a router equal the hand-computed means of
    its first choices' episodes, and the random router's the mean over models."""
    outcomes = {("t1", "ace"): 1, ("t1", "bee"): 0, ("t1", "cat"): 1, ("t2", "ace"): 0, ("t2", "bee"): 1,
                ("t2", "cat"): 0}
    episodes = [ab_episode(t, m, y, turns=1 + (m == "cat")) for (t, m), y in outcomes.items()]
    lam, gamma, c_ref = 1.0, 0.5, 0.01
    logs = ope.read_logs(episodes, POOL, Reward(lam, gamma, c_ref))
    held = heldout.HeldOut(logs, np.zeros((len(logs.action), 4), np.float32),
                          np.array([-1 if t == 0 else logs.action[i - 1] for i, t in enumerate(
                              np.concatenate([np.arange(len(e.turns)) for e in episodes]))]))
    first_choice = {"t1": 2, "t2": 1}    # cat on t1 (two turns), bee on t2
    chosen = np.array([first_choice[e.task.id] for e in episodes for _ in e.turns])
    targets = {"router": deploy.one_hot(chosen, 3), "random": deploy.uniform(held)}
    est = heldout.committed_estimates(held, targets, ["t1", "t2"], resamples=20, seed=0)
    # cat on t1: rewards -1 (a turn's cost is c_ref) then 1 - 1 = 0: J = -1 + 0.5 * 0; bee on t2: 1 - 1 = 0
    np.testing.assert_allclose(est.point[0], [(-1.0 + 0.0) / 2, (1 + 1) / 2, (0.02 + 0.01) / 2])
    returns = {(t, m): (-1 + 0.5 * (y - 1)) if m == "cat" else (y - 1) for (t, m), y in outcomes.items()}
    assert est.point[1, 0] == pytest.approx(np.mean(list(returns.values())))
    assert est.estimator == "committed" and est.tasks == 2


class CountingScorer:
    """The part of deploy.Scorer that `held_scores` reads: scores a fixed function of the state (and, recentred,
    of its family), counting every state it is asked to score."""

    pool, commit = POOL, True

    def __init__(self, commit):
        self.commit, self.scored = commit, []

    key = staticmethod(deploy.Scorer.key)

    def raw_scores(self, candidate, h):
        self.scored.append(len(h))
        return np.stack([np.sin(h.sum(axis=1) * (m + 1) + len(candidate.runs)) for m in range(3)], axis=1)

    def scores(self, candidate, h, families):
        return self.recentred(candidate, self.raw_scores(candidate, h), families)

    def recentred(self, candidate, q, families):
        if candidate.k is None:
            return q
        return candidate.k * q + np.array([[f == "math", 0.0, 0.1] for f in families])


@pytest.mark.parametrize("commit", [True, False])
def test_held_scores_score_each_distinct_read_state_once_and_choose_as_full_scores_do(commit):
    """A/B logs (every task's first state logged once per model) plus one episode whose previous model is
    unavailable at its second turn: choices from `held_scores` equal those from scoring every state, and each
    checkpoint is scored once, at the distinct states a choice reads (committed: first turns and that turn)."""
    episodes = [ab_episode(t, m, 1, turns=3, family="math" if t == "t1" else "code")
                for t in ("t1", "t2") for m in NAMES]
    switch = Episode("t3/x", Task("t3", "Task t3", family="code"), (turn("ace"), turn("bee"), turn("bee")), 1)
    logs = ope.read_logs(episodes + [switch], POOL, Reward(0.1, 1.0, 0.01))
    available = logs.available.copy()
    available[-2, 0] = False      # t3's second turn: ace (its previous model) unavailable there
    logs = dataclasses.replace(logs, available=available)
    rng = np.random.default_rng(0)
    first_state = {"t1": rng.normal(size=4), "t2": rng.normal(size=4), "t3": rng.normal(size=4)}
    h = np.array([first_state[e.task.id] if t == 0 else rng.normal(size=4) for e in logs.episodes
                  for t in range(len(e.turns))], np.float32)
    previous = np.array([logs.action[i - 1] if t else -1 for i, t in enumerate(
        np.concatenate([np.arange(len(e.turns)) for e in logs.episodes]))])
    held = heldout.HeldOut(logs, h, previous)
    candidates = [deploy.Candidate("raw", ("r",), "td"), deploy.Candidate("k", ("r",), "td", 0.5),
                  deploy.Candidate("other", ("r", "s"), "td", 0.5, by_family=True),
                  deploy.Candidate("raw again", ("r",), "td")]
    scorer = CountingScorer(commit)
    fast = deploy.targets_of(scorer, candidates, held)
    # a byte per entry, and candidates that choose alike hold one array (142 of them on the large pool)
    assert fast["raw"].dtype == bool and fast["raw again"] is fast["raw"]
    np.testing.assert_array_equal(fast["other"].sum(axis=1), 1)
    full = {c.name: deploy.one_hot(deploy.choices(scorer.scores(c, held.h, held.families), held, commit), 3)
            for c in candidates}
    for name in full:
        np.testing.assert_array_equal(fast[name], full[name])
    # two checkpoints ("r" and "r","s"), each scored once; committed: 3 distinct first states + t3's second turn
    assert scorer.scored[:2] == ([4, 4] if commit else [len(h) - 4] * 2)
    rows, inverse = deploy.distinct_rows(h, held.families)
    np.testing.assert_array_equal(h[rows][inverse], h)
    assert len(rows) == len(h) - 4    # t1's and t2's first states recur in 3 episodes each: 2 + 2 repeats


@pytest.mark.slow
def test_deploy_json_loads_the_recentred_committed_router_it_names(demo_router_dir, tmp_path):
    """A deploy.json naming a run, its TD stage, a recentring and commitment: Router.from_checkpoint(W) scores
    floor + k (Q - centre) of that checkpoint, keeps the previous turn's model, and an explicit stage does not."""
    import shutil

    workdir = tmp_path / "W"
    shutil.copytree(demo_router_dir, workdir)
    raw = Router.from_checkpoint(workdir, stage="td")
    names = raw.pool.names
    floor, centre = np.linspace(0.1, 0.6, len(names)), np.linspace(1.0, -1.0, len(names))
    choice = Choice(recentring=Recentring(floor, centre, 0.5), commit=True)
    spec = deploy.Candidate("td k=0.5", (".",), "td", 0.5).spec(choice, names)
    (workdir / "deploy.json").write_text(json.dumps({"deploy": spec}))
    deployed = Router.from_checkpoint(workdir)
    assert Choice.from_spec(spec, names).spec(names) == {k: spec[k] for k in ("pessimism", "commit", "recentring")}
    task, history = "What is 2 + 3?", [{"response": "5", "feedback": "ok", "model": names[1]}]
    q = raw.scores([(task, [])])
    np.testing.assert_allclose(deployed.scores([(task, [])]), floor + 0.5 * (q - centre), rtol=1e-6)
    assert deployed.route(task, history).model == names[1]                      # committed: keeps the last model
    assert deployed.route(task, history, available=[names[0], names[2]]).model in (names[0], names[2])
    assert Router.from_checkpoint(workdir, stage="td").route(task, []).model == raw.route(task, []).model
    (workdir / "deploy.json").write_text("{not json")
    with pytest.raises(ValueError, match="deploy.json:1: field '<file>': not JSON"):
        Router.from_checkpoint(workdir)
    # recentred per task family: a task of a listed family against its family's floor and centre
    family_floor, family_centre = np.linspace(0.6, 0.1, len(names)), np.zeros(len(names))
    choice = Choice(recentring=Recentring(floor, centre, 0.0, {"math": (family_floor, family_centre)}))
    grouped = deploy.Candidate("td k=0 by family", (".",), "td", 0.0).spec(choice, names)
    (workdir / "deploy.json").write_text(json.dumps({"deploy": grouped}))
    by_family = Router.from_checkpoint(workdir)
    assert by_family.route(task, [], family="math").model == names[0]                # the family's best floor
    assert by_family.route(task, [], family="code").model == by_family.route(task, []).model == names[-1]
    del grouped["recentring"]["groups"]["math"]["centre"][names[1]]
    (workdir / "deploy.json").write_text(json.dumps({"deploy": grouped}))
    with pytest.raises(ValueError, match=f"field 'deploy.recentring.groups.math.centre': no value for the router's "
                                         f"models \\['{names[1]}'\\]"):
        Router.from_checkpoint(workdir)
    del spec["recentring"]["floor"][names[0]]                     # a recentring that misses one of the pool's models
    (workdir / "deploy.json").write_text(json.dumps({"deploy": spec}))
    with pytest.raises(ValueError, match=f"field 'deploy.recentring.floor': no value for the router's models "
                                         f"\\['{names[0]}'\\]"):
        Router.from_checkpoint(workdir)


# ----------------------------------------------------------------------------------------------- the verdict


def estimates_of(per_task: dict[str, list[float]], tasks: int | None = None) -> heldout.Estimates:
    """Estimates whose J per task is given (success and cost: 0); bootstrap over the tasks."""
    values = np.stack([np.stack([np.array(v), np.zeros(len(v)), np.zeros(len(v))], axis=1)
                       for v in per_task.values()])                                                 # (P, T, C)
    return heldout.Estimates(list(per_task), values.mean(axis=1), heldout.task_bootstrap(values, 200, 0), "committed",
                            tasks or values.shape[1])


def gains_of(point: dict[str, float], noise: dict[str, np.ndarray]) -> heldout.Estimates:
    """Estimates of J whose floor (the best fixed model, J 0, listed first) does not vary: each candidate's draws
    are its point J plus its `noise` (B,), so its paired gain's draws are exactly those."""
    names = [deploy.BEST_FIXED, *point]
    draws = np.zeros((len(next(iter(noise.values()))), len(names), 3))
    for p, name in enumerate(names[1:], start=1):
        draws[:, p, 0] = point[name] + noise[name]
    return heldout.Estimates(names, np.array([[0.0, 0, 0]] + [[point[n], 0, 0] for n in point]), draws, "DR", 50)


def test_the_simultaneous_gain_bar_rises_with_the_candidates_compared():
    rng = np.random.default_rng(0)
    symmetric = np.concatenate([z := rng.normal(0.0, 0.1, 500), -z])        # (1000,) draws symmetric about 0
    alone = gains_of({"a": 0.25}, {"a": symmetric})
    # one candidate, symmetric draws: the bound is the lower end of its paired 95% interval
    low = alone.difference(1, 0)[1]
    assert deploy.simultaneous_gain_bounds(alone, 0)[1] == pytest.approx(low, abs=1e-3)
    assert deploy.choose(alone, True, simultaneous=True) == deploy.choose(alone, True) == 1
    # 40 candidates of pure noise beside it: each is a draw of the same size, so the largest noise is larger and
    # a's bound falls below 0, while a's own interval still clears 0: the bar counts the candidates compared
    noise = {f"n{i}": np.concatenate([w := rng.normal(0.0, 0.1, 500), -w]) for i in range(40)}
    crowd = gains_of({"a": 0.25, **{n: 0.0 for n in noise}}, {"a": symmetric, **noise})
    assert crowd.difference(1, 0)[1] > 0 and deploy.simultaneous_gain_bounds(crowd, 0)[1] < 0
    assert deploy.choose(crowd, True, simultaneous=False) == 1 and deploy.choose(crowd, True, simultaneous=True) == 0
    row = deploy.candidate_rows(crowd)[1]                                   # what selection.md shows beside it
    assert row["gain_lo"] > 0 > row["gain_bound"] == deploy.simultaneous_gain_bounds(crowd, 0)[1]
    assert f"| {row['gain_bound']:+.4f} |" in deploy.selection_table(deploy.candidate_rows(crowd), crowd, "x", "h")
    # choosing as the floor does (draws that do not vary): the point gain; never resampled: never chosen
    same = gains_of({"same": 0.0, "unseen": 0.9}, {"same": np.zeros(4), "unseen": np.full(4, np.nan)})
    assert deploy.simultaneous_gain_bounds(same, 0)[1:].tolist() == [0.0, -np.inf]
    assert deploy.choose(same, True, simultaneous=True) == 0


def test_a_router_must_beat_route_by_family_where_it_validates_above_the_best_fixed_model():
    rng = np.random.default_rng(1)
    tasks = 60
    fixed = rng.normal(0.3, 0.2, tasks)
    family = fixed + 0.2                                   # route by family: 0.2 above the best fixed model on every task
    router = family + 0.02 + rng.normal(0.0, 0.2, tasks)   # a little above route by family, with much noise

    def estimates(**rows):
        return estimates_of({deploy.BEST_FIXED: fixed, **{name: list(v) for name, v in rows.items()}})

    est = estimates(**{deploy.BEST_PER_FAMILY: family, "router": router})
    assert est.difference(2, 0)[1] > 0 > est.difference(2, 1)[1]   # clears the best fixed model, not route by family
    assert deploy.reference(est) == 1 and deploy.choose(est, True) == 1
    rows = deploy.candidate_rows(est)
    assert rows[1]["gain"] == 0.0 and rows[2]["gain"] == pytest.approx(est.point[2, 0] - est.point[1, 0])
    assert f"from {deploy.BEST_PER_FAMILY}" in deploy.selection_table(rows, est, deploy.BEST_PER_FAMILY, "h")
    # without route by family, or where it validates below the best fixed model, the best fixed model is the bar
    assert deploy.choose(estimates(router=router), True) == 1
    below = estimates(**{deploy.BEST_PER_FAMILY: fixed - 0.1, "router": router})
    assert deploy.reference(below) == 0 and deploy.choose(below, True) == 2
    # a tie: the best fixed model, the simpler rule
    assert deploy.reference(estimates(**{deploy.BEST_PER_FAMILY: fixed, "router": router})) == 0


def test_one_standard_error_rule_deploys_the_simplest_candidate_close_to_the_best():
    simple = np.repeat([-0.1, 0.1], 500)                                     # (1000,) draws
    other = np.tile([-0.1, 0.1], 500)   # complex - simple: 0, 0.2, -0.2, 0 a quarter each: se sqrt(0.02) = 0.141
    noise = {"simple": simple, "complex": other}
    close = gains_of({"simple": 0.5, "complex": 0.6}, noise)
    assert deploy.choose(close, True) == 2                                    # the best J
    assert deploy.choose(close, True, one_se=True) == 1                       # 0.6 - 0.5 < 0.141: the earlier
    assert deploy.choose(gains_of({"simple": 0.5, "complex": 0.65}, noise), True, one_se=True) == 2   # 0.15 > 0.141
    same = {"simple": simple, "complex": simple}                             # paired: no noise between them
    assert deploy.choose(gains_of({"simple": 0.5, "complex": 0.55}, same), True, one_se=True) == 2


def test_folds_pool_into_one_estimate_weighted_by_their_tasks():
    """Cross-validation's folds pooled (`heldout.pooled`): J per task of two policies on a fold of 1 task and one
    of 3 tasks; the pooled point is the mean over the 4 tasks, and each bootstrap draw the fold draws weighted 1:3
    (each fold resampled within itself: a stratified bootstrap)."""
    small = estimates_of({"a": [0.8], "b": [0.4]})
    large = estimates_of({"a": [0.0, 0.2, 0.4], "b": [0.5, 0.5, 0.5]})
    both = heldout.pooled([small, large], "two folds")
    assert both.tasks == 4 and both.names == ["a", "b"] and both.note == "two folds"
    assert both.point[:, 0] == pytest.approx([(0.8 + 0.6) / 4, (0.4 + 1.5) / 4])
    assert both.draws == pytest.approx(0.25 * small.draws + 0.75 * large.draws)
    assert both.difference(0, 1)[0] == pytest.approx(0.35 - 0.475)
    flipped = large.only(["b", "a"])                       # a subset, reordered: the same numbers per policy
    assert flipped.names == ["b", "a"] and flipped.point[0, 0] == pytest.approx(0.5)
    assert flipped.draws[:, 1] == pytest.approx(large.draws[:, 0])
    with pytest.raises(ValueError, match="same policies"):
        heldout.pooled([small, flipped], "x")


@pytest.mark.slow
def test_a_cross_validated_choice_estimates_every_training_task_by_runs_that_never_saw_it(tmp_path):
    """deploy.folds = 3 on two families' A/B logs (ace solves the code tasks, bee the math ones): the workdir's runs
    train on every task but the test tasks, each fold's runs on the others, and each fold's held-out tasks are
    estimated by its own runs; the pooled choice (route by family, J 0.89 on every fold) is deployed from the
    workdir, and selection.md shows every candidate's J per fold, whose task-weighted mean is its pooled J."""
    episodes = [ab_episode(f"{f}{i:02d}", m, int((f, m) in (("c", "ace"), ("m", "bee"))),
                           family={"c": "code", "m": "math"}[f]) for f in "cm" for i in range(20) for m in NAMES]
    workdir = tmp_path / "W"
    result = fit(with_overrides(ab_config(tmp_path, episodes), {"deploy.folds": 3}), workdir)
    own = json.loads((workdir / "splits.json").read_text())
    assert not own["validation"] and len(own["test"]) == 10 and len(own["train"]) == 30
    held = []
    for j in range(3):
        fold = json.loads((workdir / "folds" / str(j) / "splits.json").read_text())
        assert fold["test"] == own["test"] and not set(fold["train"]) & set(fold["validation"])
        assert set(fold["train"]) | set(fold["validation"]) == set(own["train"])
        assert (workdir / "folds" / str(j) / "candidates").is_dir()     # the grid trained in every fold
        held += fold["validation"]
    assert sorted(held) == sorted(own["train"])                          # every training task estimated once
    document = json.loads((workdir / "deploy.json").read_text())
    assert document["deploy"]["name"] == BEST_PER_FAMILY == result["verdict"]["deployed"]
    assert sum(document["folds"]) == document["tasks"] == 30
    assert all(run.startswith(("candidates", ".")) for run in document["deploy"]["runs"])   # the workdir's own runs
    table = (workdir / "selection.md").read_text()
    assert "J per fold" in table and "cross-validated" in table
    for row in document["candidates"]:
        line = next(line for line in table.splitlines() if line.startswith(f"| {row['policy']} |"))
        per_fold = [float(x) for x in line.split(" | ")[8].split(" / ")]
        assert len(per_fold) == 3 and np.dot(per_fold, document["folds"]) / 30 == pytest.approx(row["return"],
                                                                                             abs=2e-3)


def test_each_warning_fires_on_its_own_case_and_not_otherwise():
    n = 40
    good = {"router": [0.8] * n, deploy.BEST_FIXED: [0.5] * n, deploy.RANDOM: [0.3] * n}
    spread = Routing({"ace": 0.5, "bee": 0.3, "cat": 0.2}, {"ace": 0.5, "bee": 0.3, "cat": 0.2}, 0.1, 100)
    assert warnings_of(estimates_of(good), "router", spread, None) == []
    collapsed = Routing({"ace": 0.95, "bee": 0.05, "cat": 0.0}, {"ace": 0.9, "bee": 0.1, "cat": 0.0}, 0.0, 100)
    (warning,) = warnings_of(estimates_of(good), "router", collapsed, None)
    assert warning.startswith("collapsed to one model: 95% of first turns go to ace")
    # better on some tasks, worse on others: the paired interval reaches 0
    noisy = {**good, "router": [0.9, 0.1] * (n // 2)}
    (warning,) = warnings_of(estimates_of(noisy), "router", spread, None)
    assert warning.startswith("not better than the best fixed model: J difference +0.0000")
    (warning,) = warnings_of(estimates_of(good), "router", spread, "bee")
    assert warning == "identical to fixed model bee: the same choice at every test state"
    # route by family deployed: compared with the best fixed model, never with itself
    by_family = {deploy.BEST_PER_FAMILY: [0.8] * n, deploy.BEST_FIXED: [0.5] * n, deploy.RANDOM: [0.3] * n}
    assert warnings_of(estimates_of(by_family), deploy.BEST_PER_FAMILY, spread, None) == []
    tied = {**by_family, deploy.BEST_PER_FAMILY: [0.9, 0.1] * (n // 2)}
    (warning,) = warnings_of(estimates_of(tied), deploy.BEST_PER_FAMILY, spread, None)
    assert warning.startswith("not better than the best fixed model: J difference +0.0000")
    few = {name: v[:12] for name, v in good.items()}
    (warning,) = warnings_of(estimates_of(few), "router", spread, None)
    assert warning.startswith("too few held-out test tasks for a useful interval: n = 12")


def test_routing_shares_and_the_switch_rate():
    chosen = np.array([0, 0, 1, 2, 2, 2])
    first = np.array([True, False, False, True, False, False])
    routing = routing_of(NAMES, chosen, first, np.where(first, -1, np.roll(chosen, 1)))
    assert routing.first_turn == {"ace": 0.5, "bee": 0.0, "cat": 0.5}
    assert routing.all_turns == pytest.approx({"ace": 2 / 6, "bee": 1 / 6, "cat": 3 / 6})
    assert routing.switch_rate == pytest.approx(1 / 4)   # of the four later turns, ace -> bee switched
    assert identical_fixed(NAMES, np.array([1, 1, 1])) == "bee" and identical_fixed(NAMES, chosen) is None
    result = verdict(estimates_of({"router": [0.8] * 40, deploy.BEST_FIXED: [0.5] * 40, deploy.RANDOM: [0.3] * 40}),
                     "router", routing, "ace", None, {"lambda": 0.05})
    assert result["paired"][deploy.BEST_FIXED]["return"]["difference"] == pytest.approx(0.3)
    assert set(result["rows"]) == {"router", deploy.BEST_FIXED, deploy.RANDOM}


# ------------------------------------------------------------------------------------------ end to end (fit)


def ab_config(tmp_path, episodes):
    """The tiny config on `episodes` (written under tmp_path with POOL's cards), a quarter of the tasks held out
    for validation and a quarter for the test."""
    write_episodes(tmp_path / "episodes.jsonl", episodes)
    write_model_cards(tmp_path / "cards.json", POOL)
    return with_overrides(default.get_config("tiny"), {
        "data.episodes": str(tmp_path / "episodes.jsonl"), "data.cards": str(tmp_path / "cards.json"),
        "data.holdout.validation": 0.25, "data.holdout.test": 0.25, "deploy.resamples": 50})


@pytest.mark.slow
def test_where_routing_cannot_help_the_deployed_choice_is_the_best_fixed_model(tmp_path, capfd):
    """A/B logs in which ace solves every task and the others none: no router can beat always-ace, so the choice
    is the best fixed model (no candidate beats it with an interval above 0), deploy.json says so, the router loaded
    by default calls ace and keeps it, and the verdict names it identical to ace."""
    episodes = [ab_episode(f"t{i:02d}", m, int(m == "ace"), family=f"f{i % 2}") for i in range(40) for m in NAMES]
    workdir = tmp_path / "W"
    result = rivet_jax.fit(ab_config(tmp_path, episodes), workdir)  # the package's own surface: fit, then Router
    assert rivet_jax.fit is fit and rivet_jax.Router is Router
    document = json.loads((workdir / "deploy.json").read_text())
    assert document["deploy"]["name"] == deploy.BEST_FIXED and document["best_fixed_model"] == "ace"
    assert document["estimator"] == "committed" and document["deploy"]["commit"] is True
    assert document["deploy"]["recentring"]["k"] == 0.0
    assert all(row["gain"] <= 1e-12 for row in document["candidates"])  # nothing beats always-ace
    assert (workdir / "selection.md").read_text().count("**deployed**") == 1
    router = Router.from_checkpoint(workdir)
    assert router.commit and router.route("Task t00: add the numbers of line 0.").model == "ace"
    verdict_ = result["verdict"]
    assert verdict_["deployed"] == deploy.BEST_FIXED and verdict_["rows"][deploy.BEST_FIXED]["success"] == 1.0
    assert "identical to fixed model ace: the same choice at every test state" in verdict_["warnings"]
    assert json.loads((workdir / "verdict.json").read_text())["deployed"] == deploy.BEST_FIXED
    # an explicit stage still loads the trained checkpoint as it is
    assert Router.from_checkpoint(workdir, stage="td").recentring is None


@pytest.mark.slow
def test_where_each_family_has_its_own_best_model_the_best_fixed_model_per_family_is_deployed(tmp_path):
    """A/B logs of two families: ace solves every code task, bee every math task, cat none. Always-ace solves half;
    route-by-family solves all, a gain no interval can miss: the choice is the best fixed model per family, the
    router loaded from the workdir routes each task by its family, and the verdict compares it with both floors."""
    episodes = [ab_episode(f"{f}{i:02d}", m, int((f, m) in (("c", "ace"), ("m", "bee"))),
                           family={"c": "code", "m": "math"}[f]) for f in "cm" for i in range(20) for m in NAMES]
    workdir = tmp_path / "W"
    result = fit(ab_config(tmp_path, episodes), workdir)
    document = json.loads((workdir / "deploy.json").read_text())
    assert document["deploy"]["name"] == BEST_PER_FAMILY and document["estimator"] == "committed"
    assert set(document["deploy"]["recentring"]["groups"]) == {"code", "math"}
    names = {row["policy"] for row in document["candidates"]}
    assert deploy.BEST_FIXED in names and any(name.endswith("k=0.5 by family") for name in names)
    router = Router.from_checkpoint(workdir)
    assert router.route("Task m03: add the numbers of line m03.", family="math").model == "bee"
    assert router.route("Task c03: add the numbers of line c03.", family="code").model == "ace"
    rows = result["verdict"]["rows"]
    assert rows[BEST_PER_FAMILY]["success"] == 1.0 and result["verdict"]["deployed"] == BEST_PER_FAMILY
    assert rows[deploy.BEST_FIXED]["success"] == pytest.approx(0.5, abs=0.2)


def test_candidates_average_a_settings_seeds_and_the_ensemble_takes_every_run():
    """Two settings of two seeds each: per checkpoint, each setting is one candidate over its two runs, the
    ensemble one over all four, each also recentred; the best fixed model is read from the config's own run."""
    runs = {"a": (".", "./seeds/1000"), "b": ("candidates/b", "candidates/b/seeds/1000")}
    out = deploy.candidates(runs, ["td"], (0.5,))
    assert [(c.name, c.runs, c.k) for c in out] == [
        (deploy.BEST_FIXED, (".",), 0.0),
        ("a td", runs["a"], None), ("a td k=0.5", runs["a"], 0.5),
        ("b td", runs["b"], None), ("b td k=0.5", runs["b"], 0.5),
        ("ensemble td", runs["a"] + runs["b"], None), ("ensemble td k=0.5", runs["a"] + runs["b"], 0.5)]


def test_seeded_runs_are_trained_per_setting_and_deployed_together(tmp_path):
    """deploy.seeds = 2: every conservatism setting is trained twice, from seeds s and s + 1000 (on the same data,
    their trained parameters differ), and a deployed setting loads both runs."""
    episodes = [ab_episode(f"t{i:02d}", m, int(m == "ace" or (m == "bee" and i % 2)), family=f"f{i % 2}")
                for i in range(40) for m in NAMES]
    write_episodes(tmp_path / "episodes.jsonl", episodes)
    write_model_cards(tmp_path / "cards.json", POOL)
    config = with_overrides(default.get_config("tiny"), {
        "data.episodes": str(tmp_path / "episodes.jsonl"), "data.cards": str(tmp_path / "cards.json"),
        "data.holdout.validation": 0.25, "data.holdout.test": 0.25, "deploy.resamples": 20,
        "deploy.alphas": (0.0,), "deploy.cql_on": ("all",), "loss.alpha": 0.01, "deploy.seeds": 2})
    workdir = tmp_path / "W"
    result = fit(config, workdir)
    document = json.loads((workdir / "deploy.json").read_text())
    names = [row["policy"] for row in document["candidates"]]
    assert "alpha=0.01,cql_on=all td" in names and "alpha=0 td" in names and "ensemble td" in names
    seed = int(config.seed) + 1000
    own, other = Router.from_checkpoint(workdir, stage="td"), Router.from_checkpoint(workdir / f"seeds/{seed}", stage="td")
    assert other.config.seed == seed and own.config.seed == config.seed
    assert Router.from_checkpoint(workdir / f"candidates/alpha=0/seeds/{seed}", stage="td").config.loss.alpha == 0.0
    first = lambda router: np.asarray(jax.tree_util.tree_leaves(router._params)[0])
    assert not np.allclose(first(own), first(other))
    if result["deploy"]["name"] != deploy.BEST_FIXED:
        assert len(result["deploy"]["runs"]) in (2, 4)


def test_on_an_exploring_proxys_logs_alone_the_best_fixed_model_is_valued_by_fqe(tmp_path):
    """One-turn episodes, the model drawn uniformly (propensity 1/3, none committed): ace solves every task, bee and
    cat none. Each fixed model's value by FQE is then its one-turn return whatever the state (the intercept fits a
    constant target exactly), so the floor is ace's, bee's and cat's return by hand and ace is the best fixed model."""
    from rivet_jax.encoders import embedding_store, make_encoder
    rng = np.random.default_rng(0)
    episodes = []
    for i in range(60):
        model = NAMES[int(rng.integers(3))]
        task = Task(f"t{i:02d}", f"Task t{i:02d}: add the numbers of line {i}.", family=f"f{i % 2}")
        episodes.append(Episode(f"t{i:02d}/{i}", task, (turn(model, cost=0.02, propensity=1 / 3),),
                                int(model == "ace")))
    config = default.get_config("tiny")
    reward = Reward(0.5, 0.9, 0.01)
    store = embedding_store(config, make_encoder(config.encoder), tmp_path)
    floor = deploy.modelled_floor(heldout.held_out(episodes, POOL, store, config.max_state_tokens, reward))
    by_hand = [1.0 - 0.5 * 0.02 / 0.01, 0.0 - 0.5 * 0.02 / 0.01, 0.0 - 0.5 * 0.02 / 0.01]   # outcome - lam cost/c_ref
    np.testing.assert_allclose(floor, by_hand, atol=1e-3)


def test_a_model_the_logs_rarely_followed_sits_below_the_modelled_floors_the_logs_vouch_for(tmp_path):
    """One-turn episodes: ace (solves, $0.02) and cat (fails, $0.02) drawn on 20 tasks each, bee (solves, $0.01) on
    3. FQE values each at its one-turn return: ace 1 - 0.5 x 2 = 0, bee 1 - 0.5 = 0.5, cat -1; bee, followed on 3
    tasks (< MIN_FOLLOWED_TASKS), moves to just below cat, the lowest of the models followed on 10 or more."""
    from rivet_jax.encoders import embedding_store, make_encoder
    plan = [("ace", 1, 0.02)] * 20 + [("bee", 1, 0.01)] * 3 + [("cat", 0, 0.02)] * 20
    episodes = [Episode(f"t{i:02d}/{i}", Task(f"t{i:02d}", f"Task t{i:02d}: add the numbers of line {i}."),
                        (turn(model, cost=cost, propensity=1 / 3),), outcome)
                for i, (model, outcome, cost) in enumerate(plan)]
    config = default.get_config("tiny")
    store = embedding_store(config, make_encoder(config.encoder), tmp_path)
    held = heldout.held_out(episodes, POOL, store, config.max_state_tokens, Reward(0.5, 0.9, 0.01))
    np.testing.assert_array_equal(deploy.followed_tasks(held.logs), [20, 3, 20])
    floor = deploy.modelled_floor(held)
    np.testing.assert_allclose(floor, [0.0, -1.0 - deploy.FAMILY_GAP, -1.0], atol=1e-3)
    assert floor[1] < floor[2] < floor[0]


def test_followed_tasks_counts_the_tasks_with_an_episode_that_called_one_model_at_every_turn():
    """t0: (ace, ace) follows ace; t1: (ace, bee) follows none; t2: (bee) and (bee, bee) follow bee, one task."""
    def episode(task, *models):
        turns = tuple(dataclasses.replace(turn(m, propensity=0.5), done=k == len(models) - 1)
                      for k, m in enumerate(models))
        return Episode(f"{task}/{len(models)}{models[0]}", Task(task, f"Task {task}."), turns, 1)
    logs = ope.read_logs([episode("t0", "ace", "ace"), episode("t1", "ace", "bee"), episode("t2", "bee"),
                          episode("t2", "bee", "bee")], POOL, Reward(0.5, 0.9, 0.01))
    np.testing.assert_array_equal(deploy.followed_tasks(logs), [1, 1, 0])


@pytest.mark.slow
def test_routesim_logs_through_the_own_logs_path_deploy_a_router_that_beats_the_best_fixed_model(tmp_path):
    """RouteSim's logged corpus trained as one's own logs (no simulator at train time: the default config, tiny
    sizes, 30% of the tasks held out to validate), then the deployed choice rolled out in RouteSim on its test
    tasks: it routes (several models at the first turn) and its exact return beats the best fixed model's (that of
    the training tasks, valued exactly on the test tasks)."""
    from configs import routesim as routesim_config
    from rivet_jax import evaluation
    from rivet_jax.envs import oracle
    from rivet_jax.envs.base import RouterPolicy
    from rivet_jax.envs.routesim import make_routesim

    config = with_overrides(default.get_config("tiny"), {
        "data.demo": True, "data.demo_tasks": 200, "mc_epochs": 5, "td_epochs": 5,
        "data.holdout.validation": 0.3, "data.holdout.test": 0.1, "deploy.resamples": 50,
        "deploy.alphas": (0.0, 0.01), "deploy.cql_on": ("stochastic",), "loss.alpha": 0.01,
        "loss.cql_on": "stochastic", "deploy.shrinkage": (1.0,)})
    assert "sim" not in config
    result = fit(config, tmp_path)
    assert result["deploy"]["name"] != deploy.BEST_FIXED and not result["deploy"]["commit"]  # logs with draws
    routing = result["verdict"]["routing"]
    assert sum(share > 0 for share in routing["first_turn"].values()) >= 2
    router = Router.from_checkpoint(tmp_path)
    sim = make_routesim(routesim_config.get_config().sim)
    lam, gamma, c_ref = router.config.reward.lam, router.config.reward.gamma, router.c_ref
    episodes = evaluation.rollout(sim, RouterPolicy(router), "test", 2, 1)
    routed = evaluation.episode_metrics(episodes, Reward(lam, gamma, c_ref), 2)["return"]
    best_fixed = sim.pool.index(json.loads((tmp_path / "deploy.json").read_text())["best_fixed_model"])
    fixed = np.mean([oracle.solve(sim, task, Reward(lam, gamma, c_ref), best_fixed).stats.value  # its exact return
                     for task in sim.sim_tasks("test")])
    assert routed > fixed + 0.05


def test_best_is_the_earliest_of_the_top_values():
    """The one rule of every validated choice: the best value, ties (within the tolerance) to the earliest."""
    assert deploy.best([0.1, 0.3, 0.2]) == 1
    assert deploy.best([0.3, 0.1, 0.3]) == 0                          # an exact tie: the earlier candidate
    assert deploy.best([0.3, 0.3 + 5e-13, 0.2], tolerance=1e-12) == 0  # within the tolerance: a tie
    assert deploy.best([0.3, 0.3 + 5e-13, 0.2]) == 1                  # without it, the larger
    assert deploy.best([-np.inf, -1.0]) == 1


@pytest.mark.slow
def test_a_cache_aware_run_on_logs_says_its_held_out_estimates_leave_out_the_prompt_cache_savings(tmp_path, caplog):
    """Held-out states are read from their embeddings, which leave out who served the last turn: the choice and the
    verdict judge a cache-blind reading of a cache-aware router, and the run says so (issue 44)."""
    episodes = [ab_episode(f"t{i:02d}", m, int(m == "ace")) for i in range(16) for m in NAMES]
    config = with_overrides(ab_config(tmp_path, episodes), {"model.cache_aware": True})
    with caplog.at_level("WARNING"):
        rivet_jax.fit(config, tmp_path / "W")
    assert any("model.cache_aware: the held-out estimates score each candidate without its prompt-cache savings"
               in r.getMessage() for r in caplog.records)
    assert Router.from_checkpoint(tmp_path / "W").cache_aware
