"""Choosing the conservatism setting on validation (rivet_jax/experiments/selection.py): the grid, the choice, the
names, the paper's switch."""

import numpy as np
import pytest

from configs import routesim as routesim_config
from rivet_jax.experiments import selection
from rivet_jax.experiments.common import ONE_RUN
from rivet_jax.runs import MAIN
from rivet_jax.settings import with_overrides


def test_grid_always_holds_alpha_zero_and_the_configured_setting():
    config = routesim_config.get_config()
    assert selection.grid(config) == [(0.0, "all"), (0.01, "all"), (0.01, "stochastic"), (0.1, "all"),
                                      (0.1, "stochastic")]
    assert selection.grid(with_overrides(config, {"select.alphas": (0.03,), "select.cql_on": ("all",),
                                                  "loss.alpha": 0.2})) == [(0.0, "all"), (0.03, "all"), (0.2, "all")]
    assert selection.grid(with_overrides(config, {"select.enabled": False})) == [(0.0, "all"), (0.1, "all")]
    assert [selection.variant(s) for s in ((0.0, "all"), (0.1, "stochastic"))] == ["alpha_0",
                                                                                   "alpha_0.1_cql_stochastic"]
    assert selection.overrides((0.1, "stochastic")) == {"loss.alpha": 0.1, "loss.cql_on": "stochastic"}


class _Run(float):
    """A fake router: its validation return; one run."""
    members = 1


class _Averaged(float):
    """A fake ensemble router: its validation return, and how many runs it averages."""
    members = 3


@pytest.fixture
def fake_validation(monkeypatch):
    """Each run "directory" is its validation return; routers are read back as those numbers."""
    monkeypatch.setattr(selection.Router, "from_checkpoint", staticmethod(lambda d, stage: _Run(d)))
    monkeypatch.setattr(selection, "validation_returns", lambda sim, routers, split, rollouts, seed: list(routers))


@pytest.mark.parametrize("enabled", [True, False])
def test_the_best_mean_over_seeds_wins_unless_selection_is_off(fake_validation, enabled):
    config = with_overrides(routesim_config.get_config(), {"select.enabled": enabled})
    # alpha 0 has the single best seed (0.9) but not the best mean (0.6 < 0.7)
    returns = {(0.0, "all"): [0.9, 0.3], (0.01, "stochastic"): [0.7, 0.7], (0.1, "all"): [0.5, 0.4]}
    chosen, rows = selection.select(config, None, returns)
    assert chosen == ((0.01, "stochastic") if enabled else (0.1, "all"))
    assert [(r["alpha"], r["cql_on"], r["val_return"], r["chosen"], r["paper"]) for r in rows] == [
        (0.0, "all", pytest.approx(0.6), False, False), (0.01, "stochastic", pytest.approx(0.7), enabled, False),
        (0.1, "all", pytest.approx(0.45), not enabled, True)]
    assert rows[0]["val_return_sd"] == pytest.approx(0.3) and rows[1]["per_seed"] == [0.7, 0.7]
    names = [r["router"] for r in rows]
    assert names == (["w/o CQL", ONE_RUN, "RIVET (paper, alpha=0.1)"] if enabled  # RIVET (ours) averages 3 runs
                     else ["w/o CQL", "RIVET (alpha=0.01, CQL on draws)", ONE_RUN])
    _, rows = selection.select(with_overrides(config, {"reproduce.ensemble": 1}), None, returns)
    assert [r["router"] for r in rows if r["chosen"]] == [MAIN]  # one run per seed: the chosen runs are ours


def test_the_ensemble_row_validates_each_seeds_runs_averaged(fake_validation):
    config = routesim_config.get_config()
    ensembles = [_Averaged(np.mean(runs)) for runs in ([0.7, 0.9, 0.8], [0.6, 0.6, 0.9])]
    row = selection.ensemble_row(config, None, (0.0, "all"), ensembles)
    assert row["per_seed"] == [pytest.approx(0.8), pytest.approx(0.7)] and row["val_return"] == pytest.approx(0.75)
    assert (row["members"], row["seeds"], row["chosen"], row["paper"], row["router"]) == (3, 2, True, False, MAIN)
