"""Config values are checked before any compute, one line per bad value; launcher config mistakes are one line."""

import pytest

from configs import default, mint, routesim
from rivet_jax import config_checks, run_identity, settings, train
from rivet_jax.config_checks import ConfigError, check_config, config_problems
from rivet_jax.settings import with_overrides
from rivet_jax.run_identity import flatten
from tests.common import REPO, run_launcher


@pytest.mark.parametrize("module,variant", [(default, ""), (default, "tiny"), (routesim, ""), (routesim, "tiny"),
                                            (mint, ""), (mint, "tiny")])
def test_shipped_configs_pass(module, variant):
    assert config_problems(module.get_config(variant)) == []


def test_every_bad_value_is_one_line():
    config = with_overrides(default.get_config("tiny"), {
        "optim.batch_size": 0, "reward.gamma": 1.5, "reward.lam": 1e30, "loss.alpha": -0.1, "loss.huber_delta": 0.0,
        "checkpoint_every_epochs": 0, "reward.c_ref": -2.0, "optim.lr": float("nan"), "stage": "bogus"})
    assert config_problems(config) == [
        "stage: got 'bogus', expected one of mc, td, online, offline, all",
        "reward.lam: got 1e+30, expected a number in [0, 1000] (the cost weight of Eq. 1)",
        "reward.gamma: got 1.5, expected a discount in (0, 1]",
        "reward.c_ref: got -2.0, expected None (from the corpus) or a cost > 0",
        "loss.alpha: got -0.1, expected a number in [0, 1000] (the CQL weight of Eq. 11)",
        "loss.huber_delta: got 0.0, expected a number > 0",
        "optim.lr: got nan, expected a learning rate in (0, 1]",
        "optim.batch_size: got 0, expected an integer >= 1",
        "checkpoint_every_epochs: got 0, expected an integer >= 1",
    ]


def test_missing_pieces_are_named():
    config = with_overrides(default.get_config("tiny"), {"data.episodes": "logs.jsonl", "stage": "online"})
    problems = config_problems(config)
    assert problems == ["data.cards: required with data.episodes (the pool's model_cards.json)",
                        "stage: 'online' acts in an environment, and this config has none (`sim`): use "
                        "configs/routesim.py, or stage 'offline'"]
    assert config_problems(with_overrides(routesim.get_config("tiny"), {"deploy.folds": 5})) == [
        "deploy.folds: 5 folds cross-validate a choice made on logs; with a simulator (`sim`) the validation tasks "
        "are rolled out exactly: use deploy.folds=1"]
    assert config_problems(with_overrides(default.get_config("tiny"), {"deploy.folds": 5})) == []


def test_training_refuses_before_any_compute(tmp_path):
    config = with_overrides(default.get_config("tiny"), {"data.demo": True, "optim.batch_size": 0})
    with pytest.raises(ConfigError, match="optim.batch_size: got 0"):
        train.train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing collected, embedded or written
    check_config(with_overrides(config, {"optim.batch_size": 16}))


def test_launcher_config_mistakes_are_one_line(tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(REPO)  # --config=configs/... is a path from the clone
    _launch = lambda *args: run_launcher(capfd, "train", "--config=configs/default.py:tiny", *args)
    typo = _launch(f"--workdir={tmp_path}", "--config.reward.lamda=0.1")
    assert typo.returncode == 1 and "Traceback" not in typo.stderr
    assert typo.stderr.strip().splitlines() == [
        "FATAL Flags parsing error: --config.reward.lamda: config.reward has no key 'lamda'; did you mean "
        "--config.reward.lam?"]
    bad = _launch(f"--workdir={tmp_path / 'w'}", "--config.optim.batch_size=0", "--config.stage=bogus")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "stage: got 'bogus'" in bad.stderr and "optim.batch_size: got 0" in bad.stderr
    assert not (tmp_path / "w").exists()
    helped = _launch("--help")
    assert helped.returncode == 0
    assert "--config.reward.lam=0.05" in helped.stdout and "--config.optim.batch_size=16" in helped.stdout
    assert "--config.reward.lam=0.05\n      lambda, the cost weight of Eq. 1\n" in helped.stdout  # what it means


def test_every_key_of_the_training_config_is_declared_once():
    """What a key means, its default, its check and whether a resume may change it come from one table
    (settings.SETTINGS; the proxy's: SERVE_SETTINGS): configs/default.py and configs/serve.py are built from them,
    and the checks and resume rules read them."""
    keys = set(flatten(default.get_config().to_dict()))
    assert keys == set(settings.SETTINGS)
    assert flatten(default.get_config().to_dict()) == {k: s.default for k, s in settings.SETTINGS.items()
                                                       if not isinstance(s.default, settings.Placeholder)} | {
        "reward.c_ref": None}
    from configs import serve
    assert set(flatten(serve.get_config().to_dict())) == set(settings.SERVE_SETTINGS)
    assert not set(settings.SERVE_SETTINGS) & (set(settings.SETTINGS) - {"seed"})  # serve keys in the serve table
    assert "port" in config_checks.RULES and settings.meaning("epsilon").startswith("per-turn exploration")
    assert {key for key, (test, _) in config_checks.RULES.items() if key in keys} == {
        key for key in keys if settings.SETTINGS[key].check is not settings.anything}
    assert run_identity.is_identity("loss.beta", "mc", resuming=True)            # RUN
    assert not run_identity.is_identity("loss.alpha", "mc", resuming=True)       # TD: the MC stage never reads it,
    assert not run_identity.is_identity("loss.alpha", "td", resuming=False)      # ... nor TD starting from MC's end,
    assert run_identity.is_identity("loss.alpha", "td", resuming=True)           # ... but TD's own checkpoints
    assert run_identity.is_identity("loss.alpha", "online", resuming=False)      # ... and the stages after do
    assert not run_identity.is_identity("mc_epochs", "mc", resuming=True)        # EPOCHS: its own stage's count
    assert run_identity.is_identity("mc_epochs", "td", resuming=False)           # ... fixed for the stages after
    assert run_identity.is_identity("online.lr", "online", resuming=True)        # ONLINE, resuming online
    assert not run_identity.is_identity("online.lr", "td", resuming=True)
    assert not run_identity.is_identity("data.episodes", "td", resuming=True)    # FREE: compared by content
    assert settings.resume_kind("loss.added_since") == settings.RUN              # undeclared: its section's kind
    assert settings.PER_RUN == {"seed", "stage", "warm_start", "runs_vmapped", "data.embedding_cache", "reward.lam",
                                "loss.alpha", "loss.beta", "loss.zero_response", "loss.cql_on", "online.curve_points",
                                "online.defer_curve"}
