"""One router for every budget (issue 43): lambda an input of the shared representation, drawn per transition in
training (`reward.lam_range`), chosen per request at routing time."""

import httpx
import jax
import numpy as np
import pytest

from rivet_jax import config_checks
from rivet_jax.data.schema import (Episode, ModelCard, ModelPool, Task, Turn, read_episodes, write_episodes,
                                   write_model_cards)
from rivet_jax.learner import draw_lambdas
from rivet_jax.router import Router
from tests.common import run_stage, tiny_config


def two_model_logs(tmp_path):
    """One-turn episodes of one task text (so that the values are means, not per-task memories), one model each:
    'strong' always succeeds at $0.010, 'cheap' succeeds every other time at
    $0.001. c_ref is the mean turn cost, $0.0055, so committing to each is worth (Eq. 1, by hand)
    J(strong) = 1 - lambda 0.010 / 0.0055 and J(cheap) = 0.5 - lambda 0.001 / 0.0055: strong is the better call up
    to lambda = 0.5 / (0.009 / 0.0055) = 0.306, cheap above it."""
    pool = ModelPool((ModelCard("strong", "a strong and dear model"), ModelCard("cheap", "a cheap and weaker model")))
    episodes = []
    for i in range(160):
        model = ("strong", "cheap")[i % 2]
        outcome = 1 if model == "strong" else (i // 2) % 2
        turn = Turn(model, "the answer", "", 10, 10, 0.010 if model == "strong" else 0.001, done=True)
        episodes.append(Episode(f"e{i}", Task(f"t{i}", "add two numbers"), (turn,), outcome))
    write_episodes(tmp_path / "episodes.jsonl", episodes)
    write_model_cards(tmp_path / "cards.json", pool)
    return tmp_path / "episodes.jsonl", tmp_path / "cards.json"


def expected_j(model: str, lam: float) -> float:
    return 1 - lam * 0.010 / 0.0055 if model == "strong" else 0.5 - lam * 0.001 / 0.0055


def two_model_run(root, stage: str, **overrides):
    """The workdir of a run trained on `two_model_logs` (written under `root`) through `stage`."""
    episodes, cards = two_model_logs(root)
    run_stage(tiny_config(**{"data.demo": False, "data.episodes": str(episodes), "data.cards": str(cards),
                             **overrides}), root / "run", stage)
    return root / "run"


@pytest.fixture(scope="module")
def conditioned(tmp_path_factory):
    """A run trained on the two-model logs with lambda drawn from [0, 1]: its workdir (MC, then TD)."""
    return two_model_run(tmp_path_factory.mktemp("conditioned"), "offline", **{
        "reward.lam_range": (0.0, 1.0), "mc_epochs": 80, "optim.batch_size": 16})


@pytest.fixture(scope="module")
def fixed_lambda(tmp_path_factory) -> Router:
    """A router trained at the one lambda 0.05 (no lam_range), one MC epoch."""
    return Router.from_checkpoint(two_model_run(tmp_path_factory.mktemp("fixed"), "mc", mc_epochs=1), stage="mc")


@pytest.mark.slow
def test_one_conditioned_run_values_every_lambda_and_routes_by_it(conditioned):
    router = Router.from_checkpoint(conditioned, stage="mc")
    assert router.lambda_conditioned and router.lam == router.config.reward.lam
    for lam in (0.0, 0.1, 0.5, 1.0):
        q = router.at_lambda(lam).scores([("add two numbers", [])])[0]
        np.testing.assert_allclose(q, [expected_j(m, lam) for m in router.pool.names], atol=0.1,
                                   err_msg=f"lambda {lam}")
        assert router.at_lambda(lam).reward.lam == lam
    assert router.route("add two numbers", lam=0.0).model == "strong"
    assert router.route("add two numbers", lam=1.0).model == "cheap"
    # TD (Double DQN + CQL at each transition's own lambda) refines it without losing the trade-off
    refined = Router.from_checkpoint(conditioned, stage="td")
    assert [refined.route("add two numbers", lam=lam).model for lam in (0.0, 1.0)] == ["strong", "cheap"]


@pytest.mark.slow
def test_the_proxy_routes_each_request_at_its_lambda_and_records_it(conditioned, tmp_path):
    """Two requests of one task with x-rivet-lambda 0 and 1 go to the strong and the cheap model, each turn recorded
    with its lambda and the lambda returned in a header; a request without the header routes at config.lam."""
    from configs import serve
    from rivet_jax.serve.app import make_app
    from rivet_jax.serve.fake import ServerThread, fake_upstream
    from rivet_jax.serve.proxy import Proxy
    from rivet_jax.serve.recorder import Recorder
    from rivet_jax.serve.upstream import Backend
    from tests.common import upstream_servers

    router = Router.from_checkpoint(conditioned, stage="mc")
    config = serve.get_config()
    config.lam = 1.0
    with upstream_servers(fake_upstream, router.pool.names) as (servers, _):
        backends = {name: Backend(name, servers[name].url + "/v1", name, "") for name in router.pool.names}
        proxy = Proxy(router, backends, Recorder(tmp_path / "log", router.pool), config)
        with ServerThread(make_app(proxy)) as server:
            def ask(session: str, lam: str | None) -> httpx.Response:
                headers = {"x-rivet-session": session, **({"x-rivet-lambda": lam} if lam is not None else {})}
                return httpx.post(server.url + "/v1/chat/completions", headers=headers, timeout=30, json={
                    "model": "rivet", "messages": [{"role": "user", "content": "add two numbers"}]})

            answers = {session: ask(session, lam) for session, lam in (("a", "0"), ("b", "1"), ("c", None))}
            refused = ask("d", "-1")
            for session in answers:
                httpx.post(f"{server.url}/v1/episodes/{session}/outcome", json={"outcome": 1}).raise_for_status()
    assert [answers[s].headers["x-rivet-model"] for s in "abc"] == ["strong", "cheap", "cheap"]
    assert [answers[s].headers["x-rivet-lambda"] for s in "abc"] == ["0", "1", "1"]
    assert refused.status_code == 400 and "x-rivet-lambda" in refused.json()["error"]["message"]
    recorded = read_episodes(proxy.recorder.episodes_path, router.pool).episodes
    assert sorted(t.lam for e in recorded for t in e.turns) == [0.0, 1.0, 1.0]


def test_a_fixed_lambda_router_is_served_at_its_own_lambda_only(fixed_lambda):
    from configs import serve
    from rivet_jax.serve.app import _requested_lambda
    from rivet_jax.serve.conversation import RequestError
    from types import SimpleNamespace

    proxy = SimpleNamespace(config=serve.get_config(), served=SimpleNamespace(current=(fixed_lambda, "v")))
    assert _requested_lambda(None, proxy) is None and _requested_lambda("0.05", proxy) == 0.05
    for header, message in (("0.2", "trained for lambda 0.05 only"), ("cheap", "not a number"),
                            ("nan", "must be a number")):
        with pytest.raises(RequestError, match=message):
            _requested_lambda(header, proxy)


def test_a_fixed_lambda_router_routes_only_at_its_lambda(fixed_lambda):
    router = fixed_lambda
    assert not router.lambda_conditioned
    assert router.at_lambda(router.config.reward.lam).lam == router.config.reward.lam
    with pytest.raises(ValueError, match="trained for lambda 0.05 only.*reward.lam_range"):
        router.route("add two numbers", lam=0.2)
    with pytest.raises(ValueError, match="lambda must be a number"):
        router.at_lambda(float("nan"))


def test_lambda_draws_stay_in_range_and_favour_its_low_end():
    lams = np.asarray(draw_lambdas(jax.random.key(0), (20_000,), (0.02, 0.2)))
    assert lams.min() >= 0.02 and lams.max() <= 0.2
    # P(lambda <= low + (high - low) / 4) = P(u^2 <= 1/4) = 1/2
    assert abs(np.mean(lams <= 0.02 + 0.18 / 4) - 0.5) < 0.02


@pytest.mark.parametrize("lam_range, problem", [((0.2, 0.1), "reward.lam_range"), ((0.0,), "reward.lam_range"),
                                                ((0.0, 0.2), "adapts online at one lambda")])
def test_bad_lambda_ranges_and_online_conditioning_are_refused(lam_range, problem):
    config = tiny_config(**{"reward.lam_range": lam_range, "stage": "all" if len(lam_range) == 2 and
                            lam_range[0] <= lam_range[1] else "offline"})
    with pytest.raises(config_checks.ConfigError, match=problem):
        config_checks.check_config(config)


@pytest.mark.slow
def test_calibration_reads_one_conditioned_run_at_every_lambda(tmp_path):
    """launch.calibrate with reward.lam_range trains one run (not one per lambda), estimates it at each lambda of
    calibrate.lambdas, and deploys it at the chosen one (deploy.json's `lam`)."""
    from configs import default
    from rivet_jax import calibrate
    from rivet_jax.envs import collect
    from rivet_jax.settings import with_overrides

    collect.write_demo_corpus(tmp_path / "logs", 20, 0)
    config = with_overrides(default.get_config("tiny"), {
        "data.episodes": str(tmp_path / "logs" / "episodes.jsonl"),
        "data.cards": str(tmp_path / "logs" / "model_cards.json"), "data.holdout.validation": 0.3,
        "data.holdout.test": 0.2, "calibrate.resamples": 50, "reward.lam_range": (0.0, 2.0)})
    out = calibrate.calibrate(config, tmp_path / "w", 0.004)
    assert [p.name for p in (tmp_path / "w" / "runs").iterdir()] == ["lambda-conditioned"]
    assert sorted({r["lambda"] for r in out["rows"]}) == [0.0, 2.0]
    by_lambda = {r["lambda"]: r["return"] for r in out["rows"] if r["stage"] == "mc"}
    assert by_lambda[0.0] != by_lambda[2.0]   # one run, read at two trade-offs
    deployed = Router.from_checkpoint(tmp_path / "w")
    assert deployed.lambda_conditioned and deployed.lam == out["chosen"]["lambda"]
    with pytest.raises(config_checks.ConfigError, match=r"calibrate.lambdas \[2.0\] lie outside"):
        calibrate.calibrate(with_overrides(config, {"reward.lam_range": (0.0, 1.0)}), tmp_path / "w2", 0.004)
