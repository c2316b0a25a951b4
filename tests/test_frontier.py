"""Budget frontiers (experiments/frontier.py): the envelope, APGR and the cost to a share of the gap, by hand."""

import math

import numpy as np
import pytest

from rivet_jax.experiments import frontier


def test_envelope_drops_dominated_points_and_points_below_a_chord():
    # (2.5, 0.6) costs more than (2, 0.6) for no more success; (2, 0.4) is dominated by (2, 0.6) at the same cost
    # (and lies below the chord (1.5, 0.3) -> (3, 0.7), 0.433 at cost 2); (2, 0.6) lies above that chord: kept.
    hull = frontier.envelope([(2, 0.6), (3, 0.7), (2.5, 0.6), (1.5, 0.3), (2, 0.4)])
    np.testing.assert_array_equal(hull, [[1.5, 0.3], [2, 0.6], [3, 0.7]])
    np.testing.assert_allclose(frontier.success_at(hull, np.array([1.0, 1.75, 2.5, 9.0])),
                               [np.nan, 0.45, 0.65, 0.7])  # nan below the cheapest point, flat beyond the dearest


def test_apgr_and_costs_worked_by_hand():
    """Cheapest model (cost 1, success 0.2), best (3, 0.6), a family at (2, 0.6) and (3, 0.7). S(c) rises from 0.2
    to 0.6 on [1, 2] (PGR 0 -> 1, mean 0.5) and from 0.6 to 0.7 on [2, 3] (PGR 1 -> 1.25, mean 1.125): APGR 0.8125.
    Half the gap (0.4) is reached at c = 1.5, 80% (0.52) at c = 1.8."""
    out = frontier.summary([(2, 0.6), (3, 0.7)], cheap=(1, 0.2), best=(3, 0.6))
    assert out == pytest.approx({"apgr": 0.8125, "cost_to_pgr_50": 1.5, "cost_to_pgr_80": 1.8})


def test_a_family_of_fixed_models_alone_recovers_what_mixing_them_does():
    """The family {cheapest, best}: S is the chord between them, PGR rises linearly from 0 to 1, APGR 1/2, and p of
    the gap costs cost_cheap + p (cost_best - cost_cheap)."""
    out = frontier.summary([(5, 0.9)], cheap=(1, 0.5), best=(5, 0.9))
    assert out == pytest.approx({"apgr": 0.5, "cost_to_pgr_50": 3.0, "cost_to_pgr_80": 4.2})


def test_levels_never_reached_and_an_empty_gap_are_nan():
    out = frontier.summary([(2, 0.3)], cheap=(1, 0.2), best=(3, 0.6))     # S tops out at 0.3: 25% of the gap
    assert math.isnan(out["cost_to_pgr_50"]) and math.isnan(out["cost_to_pgr_80"])
    assert out["apgr"] == pytest.approx((0.125 * 1 + 0.25 * 1) / 2)      # mean PGR: 0 -> .25 on [1, 2], .25 after
    flat = frontier.summary([(2, 0.9)], cheap=(1, 0.5), best=(3, 0.5))    # the cheapest is as accurate as the best
    assert all(math.isnan(v) for v in flat.values())


def test_lambda_conditioned_rows_pair_the_sweep_per_lambda():
    sweep = [{"router": name, "lambda": lam, "regret": regret, "return_sd": 0.01, "accuracy": 0.5, "cost_usd": 1.0}
             for lam, ours, theirs in ((0.0, 0.03, 0.02), (0.1, 0.05, 0.07))
             for name, regret in ((frontier.CONDITIONED, ours), (frontier.PER_LAMBDA, theirs))]
    sweep.append({"router": "oracle", "lambda": 0.0, "regret": 0.0, "return_sd": 0.0, "accuracy": 1, "cost_usd": 1})
    rows = frontier.lambda_conditioned(sweep)
    assert [(r["lambda"], r["conditioned_regret"], r["per_lambda_regret"]) for r in rows] == [
        (0.0, 0.03, 0.02), (0.1, 0.05, 0.07)]
    assert [r["difference"] for r in rows] == pytest.approx([0.01, -0.02])
