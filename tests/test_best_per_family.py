"""The best fixed model per task family: the "route by family" rule the verdict compares every router with."""

import numpy as np
import pytest

from rivet_jax import deploy, heldout, ope
from rivet_jax.baselines.best_fixed import BEST_PER_FAMILY, BestPerFamilyRouter
from rivet_jax.data.replay import Reward
from rivet_jax.verdict import format_verdict, judge_on_logs, per_family_of, warnings_of
from rivet_jax.data.schema import Episode, ModelCard, ModelPool
from rivet_jax.verdict import Routing
from tests.test_deploy import POOL, ab_episode, estimates_of, turn

REWARD = Reward(1.0, 0.5, 0.01)   # every turn costs c_ref: a one-turn episode's J is outcome - 1

# Family "code": ace solves every task, bee none; family "math": bee solves every task, ace none; cat solves half of
# each. Overall (more code tasks): ace 4 of 6, cat 3 of 6, bee 2 of 6.
TRAIN = ([ab_episode(f"c{i}", "ace", 1, turns=1, family="code") for i in range(4)]
         + [ab_episode(f"c{i}", "bee", 0, turns=1, family="code") for i in range(4)]
         + [ab_episode(f"c{i}", "cat", i % 2, turns=1, family="code") for i in range(4)]
         + [ab_episode(f"m{i}", "ace", 0, turns=1, family="math") for i in range(2)]
         + [ab_episode(f"m{i}", "bee", 1, turns=1, family="math") for i in range(2)]
         + [ab_episode(f"m{i}", "cat", i % 2, turns=1, family="math") for i in range(2)])


def test_each_family_ranks_its_own_best_model_first_and_an_unknown_family_falls_back_to_the_overall_order():
    router = BestPerFamilyRouter.fit(TRAIN, POOL, REWARD)
    # code: ace J 0, cat -0.5, bee -1; math: bee 0, cat -0.5, ace -1; overall: ace 4/6 solved, bee 2/6, cat 1/2
    assert router.ranking("code") == ["ace", "cat", "bee"]
    assert router.ranking("math") == ["bee", "cat", "ace"]
    assert router.ranking("poetry") == router.ranking(None) == ["ace", "cat", "bee"]
    rng = np.random.default_rng(0)
    math_task = ab_episode("m9", "bee", 1, family="math").task
    assert router.act(math_task, (), ["ace", "bee", "cat"], rng) == ("bee", 1.0)
    assert router.act(math_task, (), ["ace", "cat"], rng) == ("cat", 1.0)     # its best available
    scores = router.scores("math", POOL)                                     # (M,) in pool order
    assert [POOL.names[i] for i in np.argsort(-scores)] == ["bee", "cat", "ace"]


def test_the_verdict_on_logs_compares_with_the_best_fixed_model_per_family():
    """Test tasks of both families, every model logged on each (committed estimates: exact). A router that always
    calls ace equals the best fixed model and loses to the per-family rule on the math tasks by exactly their J."""
    test = [ab_episode(f"{f}t{i}", m, int((f == "c") == (m == "ace")) if m != "cat" else 0, turns=1,
                       family={"c": "code", "m": "math"}[f])
            for f in "cm" for i in range(3) for m in POOL.names]
    logs = ope.read_logs(test, POOL, REWARD)
    held = heldout.HeldOut(logs, np.zeros((len(logs.action), 4), np.float32), np.full(len(logs.action), -1))
    floor = np.array([0.0, -0.5, -0.8])                                    # the best fixed model: ace
    always_ace = np.tile([1.0, 0.0, 0.0], (len(logs.action), 1))
    result = judge_on_logs("router", always_ace, held, POOL, floor, True, 200, 0, REWARD,
                           per_family=per_family_of(TRAIN, POOL, REWARD))
    rows = result["rows"]
    # ace: J 0 on the 3 code tasks, -1 on the 3 math tasks; per family: ace on code (0), bee on math (0)
    assert rows["router"]["return"] == pytest.approx(-0.5)
    assert rows[BEST_PER_FAMILY]["return"] == pytest.approx(0.0)
    gain = result["paired"][BEST_PER_FAMILY]["return"]
    assert gain["difference"] == pytest.approx(-0.5) and gain["hi"] < 0
    assert any(w.startswith("not better than the best fixed model per family: J difference -0.5000")
               for w in result["warnings"])
    assert f"J against {BEST_PER_FAMILY}: -0.5000" in format_verdict(result)


def test_without_two_training_families_or_single_model_episodes_there_is_no_per_family_reference():
    one_family = [e for e in TRAIN if e.task.family == "code"]
    router = per_family_of(one_family, POOL, REWARD)
    test = [ab_episode(f"t{i}", m, 1, turns=1, family="code") for i in range(3) for m in POOL.names]
    logs = ope.read_logs(test, POOL, REWARD)
    held = heldout.HeldOut(logs, np.zeros((len(logs.action), 4), np.float32), np.full(len(logs.action), -1))
    result = judge_on_logs("router", np.tile([1.0, 0.0, 0.0], (len(logs.action), 1)), held, POOL,
                           np.array([0.0, -1.0, -1.0]), True, 50, 0, REWARD, per_family=router)
    assert BEST_PER_FAMILY not in result["rows"] and BEST_PER_FAMILY not in result["paired"]
    drawn = [Episode(f"x{i}", task, (turn("ace", propensity=0.5), turn("bee", propensity=0.5)), 1.0)
             for i, task in enumerate(e.task for e in TRAIN)]   # an exploring proxy's draws: no fixed model logged
    assert per_family_of(drawn, POOL, REWARD) is None


def test_a_router_below_the_per_family_rule_is_warned_even_when_it_beats_the_best_fixed_model():
    n = 40
    estimates = estimates_of({"router": [0.8] * n, deploy.BEST_FIXED: [0.5] * n, BEST_PER_FAMILY: [0.8, 0.9] * 20,
                              deploy.RANDOM: [0.3] * n})
    spread = Routing({"ace": 0.5, "bee": 0.5, "cat": 0.0}, {"ace": 0.5, "bee": 0.5, "cat": 0.0}, 0.1, 100)
    (warning,) = warnings_of(estimates, "router", spread, None)
    assert warning.startswith("not better than the best fixed model per family: J difference -0.0500")


def test_recentred_on_the_family_floors_at_k_0_the_router_is_exactly_the_best_fixed_model_per_family():
    """deploy.family_floors + Recentring(k = 0): the same choice as BestPerFamilyRouter on every family (an unknown
    one included) and every subset of available models, whatever Q_route says; a model the family never logged alone
    ranks after those it did, in the overall order."""
    from itertools import combinations

    from rivet_jax.router import Recentring

    # "poetry" logged ace alone only: bee and cat rank after it, in the overall order (ace, cat, bee)
    train = TRAIN + [ab_episode("p0", "ace", 0, turns=1, family="poetry")]
    per_family = BestPerFamilyRouter.fit(train, POOL, REWARD)
    floors = deploy.family_floors(per_family, POOL)
    assert sorted(floors) == ["code", "math", "poetry"]
    np.testing.assert_allclose(floors["math"][POOL.index("bee")], 0.0)    # bee solves every math task: J 1 - 1
    overall = deploy.floor_of(per_family.overall, POOL)
    rng = np.random.default_rng(0)
    q = rng.normal(size=(1, len(POOL)))                                      # k = 0: Q_route does not matter
    centre = rng.normal(size=len(POOL))
    recentring = Recentring(overall, centre, 0.0, {f: (floor, centre) for f, floor in floors.items()})
    for family in ("code", "math", "poetry", "haiku", None):
        task = ab_episode("x", "ace", 1, family=family).task
        for size in (1, 2, 3):
            for available in combinations(POOL.names, size):
                scores = np.where([m in available for m in POOL.names], recentring(q, [family])[0], -np.inf)
                assert POOL.names[int(np.argmax(scores))] == per_family.act(task, (), list(available), rng)[0]
    assert deploy.family_floors(None, POOL) == {}
    # a model no episode ever called alone ranks last in every family (route-by-family never calls it)
    with_dee = ModelPool(POOL.cards + (ModelCard("dee", "model dee: never logged alone"),))
    floors = deploy.family_floors(BestPerFamilyRouter.fit(train, with_dee, REWARD), with_dee)
    for floor in floors.values():
        assert floor[with_dee.index("dee")] < min(np.delete(floor, with_dee.index("dee")))


def test_the_candidates_add_the_family_floors_only_where_asked():
    runs = {"a": ("r/a",), "b": ("r/b",)}
    plain = deploy.candidates(runs, ["mc", "td"], [1.0, 0.5])
    grouped = deploy.candidates(runs, ["mc", "td"], [1.0, 0.5], by_family=True)
    assert not any(c.by_family for c in plain)
    assert grouped[1].name == BEST_PER_FAMILY and grouped[1].k == 0.0 and grouped[1].by_family
    extra = [c for c in grouped if c.by_family][1:]
    # every recentred candidate (k > 0) once more on the family floors: 2 stages x 3 groups x 2 k
    assert len(extra) == 12 and {c.name.rsplit(" k=", 1)[0] for c in extra} == {
        c.name.rsplit(" k=", 1)[0] for c in plain if c.k}
    assert all(c.name.endswith(" by family") and c.k in (1.0, 0.5) for c in extra)
    assert len(grouped) == len(plain) + 13
