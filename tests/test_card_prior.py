"""The card prior on hand-built pools whose values are known functions of their cards."""

import math

import numpy as np
import pytest

from rivet_jax.card_prior import field_columns, field_errors, fit_card_prior, fit_return_prior, prior_floor
from rivet_jax.data.model_pool import ModelCard

PRICES = (0.2, 0.5, 1.0, 3.0, 10.0, 30.0)


def card(name: str, price: float | None, context: int = 8192, **fields) -> ModelCard:
    return ModelCard(name, f"model {name}", context_length=context, price_in_per_mtok=price,
                     price_out_per_mtok=price, **fields)


def linear_pool():
    """Six models whose value is exactly 0.3 + 0.1 log10(price), the last one never logged."""
    cards = [card(f"m{i}", p) for i, p in enumerate(PRICES)]
    values = np.array([[0.3 + 0.1 * math.log10(p)] for p in PRICES])
    values[-1] = np.nan
    return cards, values


def test_a_new_model_is_predicted_from_the_field_that_explains_the_known_ones():
    cards, values = linear_pool()
    prior = fit_card_prior(cards, values, ["all"], fields=("prices",))
    exact = 0.3 + 0.1 * math.log10(PRICES[-1])
    assert prior.prediction[-1, 0] == pytest.approx(exact, abs=0.01)
    assert prior.error[0] < 0.01  # the regression predicts every known model it did not see
    assert prior_floor(prior, "all")[-1] == pytest.approx(prior.prediction[-1, 0] - prior.error[0])


def test_without_fields_the_prior_is_the_other_models_mean_and_its_error_is_measured_by_hand():
    cards = [card(f"m{i}", 1.0) for i in range(4)]
    values = np.array([[0.1], [0.2], [0.6], [np.nan]])
    prior = fit_card_prior(cards, values, ["g"], fields=())
    # leave-one-out means: (0.2 + 0.6) / 2, (0.1 + 0.6) / 2, (0.1 + 0.2) / 2; the new model: the mean of all three
    np.testing.assert_allclose(prior.prediction[:, 0], [0.4, 0.35, 0.15, 0.3])
    assert prior.error[0] == pytest.approx(math.sqrt(((0.4 - 0.1) ** 2 + (0.35 - 0.2) ** 2 + (0.15 - 0.6) ** 2) / 3))


def test_a_models_own_value_never_shapes_its_prediction():
    cards, values = linear_pool()
    changed = values.copy()
    changed[2] = 5.0  # model 2's logs: its own leave-one-out prediction must not move, the others' do
    before = fit_card_prior(cards, values, ["all"], fields=("prices", "context"))
    after = fit_card_prior(cards, changed, ["all"], fields=("prices", "context"))
    assert after.prediction[2, 0] == pytest.approx(before.prediction[2, 0])
    assert not np.isclose(after.prediction[0, 0], before.prediction[0, 0])


def test_field_errors_single_out_the_informative_field():
    rng = np.random.default_rng(0)
    contexts = rng.permutation([4096, 8192, 16384, 32768, 100000, 200000])   # unrelated to the value
    cards = [card(f"m{i}", p, int(c)) for i, (p, c) in enumerate(zip(PRICES, contexts))]
    values = np.array([[0.3 + 0.1 * math.log10(p)] for p in PRICES])
    errors = field_errors(cards, values, np.zeros_like(values), ["all"])   # lambda 0: no cost part
    assert set(errors) == {"none", "prices", "context", "capabilities", "open_weights", "size", "family",
                           "provider", "all"}
    assert errors["prices"][0] < 0.01 < errors["none"][0]
    assert errors["context"][0] > errors["prices"][0]
    # fields no card fills are all constant: nothing to regress on, the other models' mean
    assert errors["size"][0] == pytest.approx(errors["none"][0])


def test_missing_fields_are_imputed_from_the_fitting_models_and_categories_unseen_there_are_ignored():
    cards = [card("a", 1.0, family="X"), card("b", 10.0, family="X"), card("c", None, family="Y"),
             card("d", 100.0, family="Z")]
    prices = field_columns(cards, "prices")
    assert np.isnan(prices[2]).all() and prices[1, 0] == pytest.approx(1.0)
    np.testing.assert_array_equal(field_columns(cards, "family"), [[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]])
    values = np.array([[0.2], [0.4], [0.3], [np.nan]])
    prior = fit_card_prior(cards, values, ["g"], fields=("prices", "family"))
    assert np.isfinite(prior.prediction).all()
    with pytest.raises(ValueError, match="unknown card field"):
        field_columns(cards, "colour")
    with pytest.raises(ValueError, match=r"\(models, groups\)"):
        fit_card_prior(cards, values[:3], ["g"])


def test_a_group_with_fewer_than_three_known_models_has_no_prior():
    cards = [card(f"m{i}", p) for i, p in enumerate(PRICES[:3])]
    values = np.array([[0.1, 0.2], [0.3, np.nan], [np.nan, 0.5]])
    prior = fit_card_prior(cards, values, ["g", "h"], fields=("prices",))
    assert np.isnan(prior.error).all() and np.isnan(prior.prediction).all()


def test_the_return_prior_predicts_success_from_the_card_and_cost_from_the_prices():
    """success 0.2 + 0.3 open_weights, cost part 0.01 x price: J of a new open model at price 30 is 0.5 - 0.3."""
    opens = (True, False, True, False, True, True)
    cards = [card(f"m{i}", p, open_weights=o) for i, (p, o) in enumerate(zip(PRICES, opens))]
    success = np.array([[0.2 + 0.3 * o] for o in opens])
    cost = np.array([[0.01 * p] for p in PRICES])
    success[-1] = cost[-1] = np.nan
    prior = fit_return_prior(cards, success, cost, ["all"], fields=("open_weights",))
    assert prior.prediction[-1, 0] == pytest.approx(0.5 - 0.3, abs=0.02)
    assert prior.error[0] < 0.02
    # J regressed directly on the same cards misses by more: price's effect on J is not linear in any field
    direct = fit_card_prior(cards, success - cost, ["all"], fields=("open_weights", "prices"))
    assert direct.error[0] > prior.error[0]
    # at lambda 0 the cost part is 0 and the prior is the success regression alone
    free = fit_return_prior(cards, success, np.where(np.isnan(cost), np.nan, 0.0), ["all"], fields=("open_weights",))
    np.testing.assert_allclose(free.prediction, fit_card_prior(cards, success, ["all"], ("open_weights",)).prediction)


def test_route_by_family_takes_a_new_model_only_where_its_card_clearly_beats_the_known_best(tmp_path):
    """Four known models solve 4, 5, 6, 7 of 10 training tasks of family x (0.1 log10(price) + 0.5 of them) and of
    y; "rich" (price 1000) predicts 0.8 there, "poor" (price 0.01) 0.3: route by family takes rich for both
    families, where its logs (never read to choose) then score it."""
    from rivet_jax.data.schema import Episode, ModelPool, Task, Turn
    from rivet_jax.experiments.mint_data import MintData, committed, family_choice, prior_family_choice

    prices = {"k0": 0.1, "k1": 1.0, "k2": 10.0, "k3": 100.0, "rich": 1000.0, "poor": 0.01}
    pool = ModelPool(tuple(card(m, p) for m, p in prices.items()))
    tasks = {f"{f}{i}": Task(f"{f}{i}", f"task {f}{i}", family=f) for f in "xy" for i in range(11)}
    solved = {m: round(10 * (0.1 * math.log10(p) + 0.5)) for m, p in prices.items()}   # of the 10 training tasks

    def episode(t, m):
        outcome = int(int(t[1:]) < solved[m]) if int(t[1:]) < 10 else int(m == "rich")   # task 10: the test task
        return Episode(f"{m}/{t}", tasks[t], (Turn(m, "r", "", 1, 1, 0.0),), outcome)
    logged = {(t, m): episode(t, m) for t in tasks for m in prices}
    data = MintData.__new__(MintData)
    data.__dict__.update(pool=pool, c_ref=1.0, tasks=tasks, logged=logged,
                         split={"train": [t for t in tasks if not t.endswith("10")], "validation": [],
                                "test": ["x10", "y10"]},
                         available={t: pool.names for t in tasks},
                         table={key: (e.outcome, 0.0) for key, e in logged.items()},
                         episodes={"train": [], "validation": [], "test": []})
    known = data.without(["rich", "poor"], tmp_path / "known")
    assert family_choice(known, 0.0, 1.0)("x10") == "k3"
    choose, prior = prior_family_choice(data, known, 0.0, 1.0)
    assert (choose("x10"), choose("y10")) == ("rich", "rich")
    rich = pool.index("rich")
    assert prior.prediction[rich] == pytest.approx([0.8, 0.8], abs=0.02) and (prior.error < 0.02).all()
    assert committed(data, choose, 1.0, 0.0, 1.0)["return"] == 1.0
    assert committed(data, family_choice(known, 0.0, 1.0), 1.0, 0.0, 1.0)["return"] == 0.0
