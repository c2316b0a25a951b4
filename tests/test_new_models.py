"""New models routed to from their cards alone: the router over an extended pool, the card floor, the draws, and
the MINT tables with models taken out or added (rivet_jax/experiments/mint_new_models.py)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from rivet_jax.data.schema import Episode, ModelCard, ModelPool, Task, Turn
from rivet_jax.experiments.mint_data import MintData, committed
from rivet_jax.experiments.mint_new_models import card_floor, held_out_draws
from rivet_jax.router import Choice, Router

STATES = [("Find the capital of France.", []), ("Add 2 and 2.", [])]


def test_a_new_model_with_a_known_models_card_scores_like_it(demo_router_dir):
    router = Router.from_checkpoint(demo_router_dir, stage="td")
    known = router.scores(STATES)                                                     # (2, M)
    twin_of = router.pool.cards[1]
    twin = dataclasses.replace(twin_of, name="twin")
    other = dataclasses.replace(router.pool.cards[0], name="cheaper", price_in_per_mtok=0.01, price_out_per_mtok=0.01)
    wide = router.with_new_models([twin, other])
    assert wide.pool.names == (*router.pool.names, "twin", "cheaper")
    scores = wide.scores(STATES)                                                      # (2, M + 2)
    np.testing.assert_allclose(scores[:, :len(router.pool)], known, rtol=1e-6)        # the known models: unchanged
    np.testing.assert_allclose(scores[:, -2], known[:, 1], rtol=1e-6)                 # the card decides, not the name
    assert not np.allclose(scores[:, -1], known[:, 0])                                # prices are read
    # a name the pool has is refused; a recentred (deployed) router must be extended before recentring
    with pytest.raises(ValueError, match="duplicate model name"):
        router.with_new_models([twin_of])
    with pytest.raises(ValueError, match="recentred"):
        router.with_choice(Choice(recentring=object())).with_new_models([twin])


def test_new_cards_are_read_with_the_trained_flags(demo_router_dir):
    router = Router.from_checkpoint(demo_router_dir, stage="td")
    flagged = dataclasses.replace(router.pool.cards[0], name="flagged",
                                  capabilities=(("never_seen_flag", True), *router.pool.cards[0].capabilities))
    wide = router.with_new_models([flagged])  # a flag the network never read is left out, not a new input column
    np.testing.assert_allclose(wide.scores(STATES)[:, -1], router.scores(STATES)[:, 0], rtol=1e-6)


def test_card_floor_by_hand():
    nan = np.nan
    # task 1: known a, b logged 0.5 and 0.2 where the router's means are 0.4 and 0.3: mean error (0.1 - 0.1) / 2 = 0,
    # so the new model n keeps the router's 0.6. Task 2 (another family): the router overestimates both by 0.2,
    # so n's floor comes down as much: 0.6 - 0.2.
    logged = np.array([[0.5, 0.2, nan], [0.5, 0.2, nan]])
    centre = np.array([[0.4, 0.3, 0.6], [0.7, 0.4, 0.6]])
    np.testing.assert_allclose(card_floor(logged, centre), [[0.5, 0.2, 0.6], [0.5, 0.2, 0.4]])


def test_held_out_draws_are_seeded_distinct_and_checked():
    names = [f"m{i}" for i in range(10)]
    draws = held_out_draws(names, 3, 4, seed=7)
    assert draws == held_out_draws(names, 3, 4, seed=7) and draws != held_out_draws(names, 3, 4, seed=8)
    assert all(len(set(d)) == 3 and list(d) == sorted(d, key=names.index) for d in draws)
    with pytest.raises(ValueError, match="between 1 and the pool size - 1"):
        held_out_draws(names, 10, 1, seed=0)


def _data(tmp_path) -> MintData:
    """Two tasks, models a and b logged on both (a solves t1, b solves t2, b twice a's cost)."""
    pool = ModelPool((ModelCard("a", "A."), ModelCard("b", "B.")))
    tasks = {f"s/t{i}": Task(f"s/t{i}", f"task {i}", family="s") for i in (1, 2)}

    def episode(task, model, outcome, cost):
        return Episode(f"{model}/{task}", tasks[task], (Turn(model, "x", "y", 1, 1, cost),), outcome)

    logs = [episode("s/t1", "a", 1, 1.0), episode("s/t2", "a", 0, 1.0), episode("s/t1", "b", 0, 2.0),
            episode("s/t2", "b", 1, 2.0)]
    data = MintData.__new__(MintData)
    data.pool, data.tasks, data.c_ref = pool, tasks, 1.0
    data.split = {"train": ["s/t1"], "validation": [], "test": ["s/t2"]}
    data.episodes = {"train": [e for e in logs if e.task.id == "s/t1"], "validation": [],
                     "test": [e for e in logs if e.task.id == "s/t2"]}
    data.available = {t: ("a", "b") for t in tasks}
    data.table = {(e.task.id, e.turns[0].model): (e.outcome, e.turns[0].cost) for e in logs}
    data.logged = {(e.task.id, e.turns[0].model): e for e in logs}
    return data


def test_mint_data_without_and_with_models_by_hand(tmp_path):
    from rivet_jax.data.schema import read_episodes, read_model_cards

    data = _data(tmp_path)
    known = data.without(["b"], tmp_path / "draw")
    assert known.pool.names == ("a",) and known.available == {"s/t1": ["a"], "s/t2": ["a"]}
    # b's logs are not trained on
    assert [e.episode_id for e in read_episodes(known.train_path, known.pool).episodes] == ["a/s/t1"]
    assert read_model_cards(known.cards_path).names == ("a",)
    assert data.pool.names == ("a", "b") and data.available["s/t1"] == ("a", "b")  # the full tables are untouched
    # ... and b's logged outcome still scores a choice of b: t2 solved at cost 2
    assert committed(known, lambda t: "a", 1.0, 0.0, 1.0)["accuracy"] == 0.0
    assert committed(data, lambda t: "b", 1.0, 0.0, 1.0) == pytest.approx(
        {"accuracy": 1.0, "cost_usd": 2.0, "cost_rel": 2.0, "return": 1.0})

    new = ModelPool((ModelCard("n", "N."),))
    corpus = SimpleNamespace(episodes=[Episode("n/s/t2", data.tasks["s/t2"], (Turn("n", "x", "y", 1, 1, 0.5),), 1),
                                       Episode("n/o/t9", Task("o/t9", "elsewhere", family="o"),
                                               (Turn("n", "x", "y", 1, 1, 0.5),), 1)],
                             unanswered=(("s/t1", "n"),), available={"s": ("n",)})
    wider = known.with_models(new, corpus)
    assert wider.pool.names == ("a", "n") and wider.available["s/t2"] == ["a", "n"]
    assert wider.table[("s/t2", "n")] == (1, 0.5) and wider.table[("s/t1", "n")] == (0, 0.0)  # a failed call
    assert ("o/t9", "n") not in wider.table  # a task outside these logs is not read
    assert known.pool.names == ("a",) and ("s/t2", "n") not in known.table
    with pytest.raises(ValueError, match="already in the pool"):
        data.with_models(ModelPool((ModelCard("a", "again"),)), corpus)
