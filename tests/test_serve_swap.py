"""Learning from live traffic at the proxy (issue 39): exploration recorded with its exact propensities and shown in
/healthz, and the hot swap of a newly deployed router between requests, mid-episode, without losing a turn."""

import json
import shutil

import httpx
import numpy as np
import openai
import pytest

from configs import serve
from rivet_jax import deploy
from rivet_jax.data.schema import read_episodes
from rivet_jax.router import Router
from rivet_jax.serve.app import make_app
from rivet_jax.serve.fake import ServerThread, fake_upstream
from rivet_jax.serve.policy import GREEDY, Budget
from rivet_jax.serve.proxy import Proxy
from rivet_jax.serve.recorder import Recorder
from rivet_jax.serve.upstream import Backend
from tests.common import upstream_servers

SERVED = ("apex-flash", "llama-70b", "quill-9b")


def deploy_fixed(workdir, pool_names, model: str) -> None:
    """A deployment that always calls `model`: the workdir's offline run recentred with k = 0 on floors that rank
    `model` first (what `rivet_jax.fit` writes for the best fixed model)."""
    floor = {name: (1.0 if name == model else 0.0) for name in pool_names}
    deploy.write_deployment(workdir, {"name": f"fixed {model}", "runs": ["."], "stage": "td", "epoch": None,
                                      "pessimism": 0.0, "commit": False,
                                      "recentring": {"k": 0.0, "floor": floor,
                                                     "centre": {name: 0.0 for name in pool_names}}}, {})


@pytest.fixture
def served(demo_router_dir, tmp_path):
    """A proxy in a thread serving a copy of the demo router's workdir, deployed to call apex-flash; yields (url,
    proxy, workdir)."""
    workdir = tmp_path / "w"
    shutil.copytree(demo_router_dir, workdir)
    pool = Router.from_checkpoint(workdir, stage="td").pool
    deploy_fixed(workdir, pool.names, "apex-flash")
    config = serve.get_config()
    config.update(timeout_s=5.0, reload_every_s=0.0, exploration="softmax", temperature=0.5, seed=3)
    with upstream_servers(fake_upstream, SERVED) as (servers, _):
        backends = {name: Backend(name, servers[name].url + "/v1", name, "") for name in SERVED}
        proxy = Proxy(Router.from_checkpoint(workdir), backends, Recorder(tmp_path / "log", pool), config,
                      workdir=workdir)
        with ServerThread(make_app(proxy)) as server:
            yield server.url, proxy, workdir


def call(url: str, messages: list[dict], session: str):
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    return client.chat.completions.with_raw_response.create(model="rivet", messages=messages,
                                                            extra_headers={"x-rivet-session": session})


def test_a_hot_swap_mid_episode_loses_nothing_and_the_episode_records_both_versions(served):
    url, proxy, workdir = served
    proxy.budget = Budget(GREEDY, None)  # greedy: each turn calls the deployment's fixed model
    messages = [{"role": "user", "content": "Add 2 and 3."}]
    first = call(url, messages, "s")
    assert first.headers["x-rivet-model"] == "apex-flash"
    before = httpx.get(url + "/healthz").json()["router"]["version"]
    messages += [{"role": "assistant", "content": first.parse().choices[0].message.content},
                 {"role": "user", "content": "Observation: 5"}]

    deploy_fixed(workdir, proxy.served.current[0].pool.names, "quill-9b")     # a new deployment lands on disk
    swapped = httpx.post(url + "/v1/admin/reload").json()
    assert swapped["swapped"] and swapped["version"] != before
    second = call(url, messages, "s")                                  # the same open episode goes on
    assert second.headers["x-rivet-model"] == "quill-9b"

    (workdir / "deploy.json").write_text('{"deploy": {"runs": ["missing"], "stage": "td"}}')   # a broken one
    refused = httpx.post(url + "/v1/admin/reload")
    assert refused.status_code == 409 and "missing" in refused.json()["error"]
    health = httpx.get(url + "/healthz").json()["router"]
    assert health["version"] == swapped["version"] and health["swaps"] == 1 and health["last_swap_error"]
    messages += [{"role": "assistant", "content": second.parse().choices[0].message.content},
                 {"role": "user", "content": "Observation: 8"}]
    assert call(url, messages, "s").headers["x-rivet-model"] == "quill-9b"   # still the last good router

    assert httpx.post(url + "/v1/episodes/s/outcome", json={"outcome": 1}).status_code == 200
    episode, = read_episodes(proxy.recorder.episodes_path, proxy.served.current[0].pool).episodes
    assert [t.model for t in episode.turns] == ["apex-flash", "quill-9b", "quill-9b"]
    assert [t.router for t in episode.turns] == [before, swapped["version"], swapped["version"]]
    assert [t.feedback for t in episode.turns[:2]] == ["[user] Observation: 5", "[user] Observation: 8"]


def test_the_proxy_explores_with_exact_recorded_propensities_and_reports_the_cost(served):
    url, proxy, _ = served
    scores = None
    for k in range(40):
        response = call(url, [{"role": "user", "content": "Add 2 and 3."}], f"e{k}")
        scores = json.loads(response.headers["x-rivet-scores"])
        assert httpx.post(url + f"/v1/episodes/e{k}/outcome", json={"outcome": 0}).status_code == 200
    # the deployment scores apex-flash 1, the others 0; softmax at temperature 0.5 over three candidates
    expected = np.exp(np.array([scores[name] for name in SERVED]) / 0.5)
    expected = dict(zip(SERVED, expected / expected.sum()))
    episodes = read_episodes(proxy.recorder.episodes_path, proxy.served.current[0].pool).episodes
    for episode in episodes:
        turn, = episode.turns
        assert turn.propensity == pytest.approx(expected[turn.model], abs=1e-6)
    assert len({e.turns[0].model for e in episodes}) > 1          # it explored
    report = httpx.get(url + "/healthz").json()["exploration"]
    assert report["kind"] == "softmax" and report["episodes"] == 40 and report["decisions"] == 40
    shortfall = sum(p * (max(scores.values()) - scores[m]) for m, p in expected.items())
    assert report["expected_shortfall_per_episode"] == pytest.approx(shortfall, abs=1e-5)


def test_a_deployment_recentred_per_family_routes_each_episode_by_its_family(served):
    url, proxy, workdir = served
    proxy.budget = Budget(GREEDY, None)
    names = proxy.served.current[0].pool.names
    floor = {name: (1.0 if name == "apex-flash" else 0.0) for name in names}
    zero = {name: 0.0 for name in names}
    deploy.write_deployment(workdir, {"name": "k=0 by family", "runs": ["."], "stage": "td", "epoch": None,
                                      "pessimism": 0.0, "commit": False, "recentring": {
                                          "k": 0.0, "floor": floor, "centre": zero,
                                          "groups": {"math": {"floor": {**zero, "quill-9b": 1.0}, "centre": zero}}}},
                            {})
    assert httpx.post(url + "/v1/admin/reload").json()["swapped"]
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

    def turn(messages, session, family=None):
        headers = {"x-rivet-session": session, **({"x-rivet-task-family": family} if family else {})}
        return client.chat.completions.with_raw_response.create(model="rivet", messages=messages,
                                                                extra_headers=headers)

    messages = [{"role": "user", "content": "Add 2 and 3."}]
    first = turn(messages, "m", "math")
    assert first.headers["x-rivet-model"] == "quill-9b"                     # the math family's best floor
    messages += [{"role": "assistant", "content": first.parse().choices[0].message.content},
                 {"role": "user", "content": "Observation: 5"}]
    assert turn(messages, "m").headers["x-rivet-model"] == "quill-9b"       # no header: the family it opened with
    assert turn([{"role": "user", "content": "Write a poem."}], "p", "poetry").headers["x-rivet-model"] == "apex-flash"
    assert turn([{"role": "user", "content": "Sort a list."}], "n").headers["x-rivet-model"] == "apex-flash"
