"""Choosing alpha on validation (rivet_jax/experiments/selection.py): the grid, the choice, the paper's switch."""

import pytest

from configs import routesim as routesim_config
from rivet_jax.experiments import selection
from rivet_jax.experiments.common import MAIN, with_overrides


def test_grid_always_holds_zero_and_the_configured_alpha():
    config = routesim_config.get_config()
    assert selection.alpha_grid(config) == [0.0, 0.01, 0.1]
    assert selection.alpha_grid(with_overrides(config, {"select.alphas": (0.03,), "loss.alpha": 0.2})) == [
        0.0, 0.03, 0.2]
    assert selection.alpha_grid(with_overrides(config, {"select.enabled": False})) == [0.0, 0.1]


@pytest.fixture
def fake_validation(monkeypatch):
    """Each run "directory" is its validation return; routers are read back as those numbers."""
    monkeypatch.setattr(selection.Router, "from_checkpoint", staticmethod(lambda d, stage: d))
    monkeypatch.setattr(selection, "validation_returns", lambda sim, routers, split, rollouts, seed: list(routers))


@pytest.mark.parametrize("enabled, chosen", [(True, 0.01), (False, 0.1)])
def test_the_best_mean_over_seeds_wins_unless_selection_is_off(fake_validation, enabled, chosen):
    config = with_overrides(routesim_config.get_config(), {"select.enabled": enabled})
    # alpha 0 has the single best seed (0.9) but not the best mean (0.6 < 0.7)
    alpha, rows = selection.select_alpha(config, None, {0.0: [0.9, 0.3], 0.01: [0.7, 0.7], 0.1: [0.5, 0.4]})
    assert alpha == chosen
    assert [(r["alpha"], r["val_return"], r["chosen"], r["paper"]) for r in rows] == [
        (0.0, pytest.approx(0.6), False, False), (0.01, pytest.approx(0.7), enabled, False),
        (0.1, pytest.approx(0.45), not enabled, True)]
    assert rows[0]["val_return_sd"] == pytest.approx(0.3) and rows[1]["per_seed"] == [0.7, 0.7]
    names = {r["alpha"]: r["router"] for r in rows}
    assert names == ({0.0: "w/o CQL", 0.01: MAIN, 0.1: "RIVET (paper: alpha=0.1)"} if enabled
                     else {0.0: "w/o CQL", 0.01: "RIVET (alpha=0.01)", 0.1: MAIN})
