"""The routing proxy over real HTTP on loopback (issue 16): fake upstreams, the official `openai` client, a trained
tiny router. The proxy must choose what `Router.route` chooses on the same history, pass responses (streamed and
not, tool calls included) through unchanged, fall back when a backend fails or hangs, and record every served turn
in a file that validates and trains."""

import concurrent.futures
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import httpx
import openai
import pytest

from configs import default, serve
from rivet_jax import train
from rivet_jax.data.converters.openai_chat import routing_state
from rivet_jax.data.schema import ModelPool, read_episodes, write_model_cards
from rivet_jax.data.splits import hashed_split
from rivet_jax.router import Router
from rivet_jax.serve.app import make_app
from rivet_jax.serve.conversation import converter_messages
from rivet_jax.serve.recorder import Recorder
from rivet_jax.serve.upstream import Backend
from rivet_jax.serve.fake import COMPLETION_TOKENS, ServerThread, answer, fake_upstream, free_port
from rivet_jax.serve.proxy import Proxy
from tests.common import tiny_config, upstream_servers

REPO = Path(__file__).resolve().parents[1]
SERVED = ("apex-flash", "llama-70b", "quill-9b")   # three of the demo pool's six models have a backend
TASK = "Find the capital of the country with the largest population in South America."


@pytest.fixture(scope="module")
def workdir(demo_router_dir) -> Path:
    """A tiny router trained on the RouteSim demo corpus (its pool: six models, three of them served here)."""
    return demo_router_dir


@pytest.fixture(scope="module")
def router(workdir) -> Router:
    return Router.from_checkpoint(workdir)


@pytest.fixture(scope="module")
def upstreams():
    """One fake upstream per served model; `modes[name]` switches it to failing or hanging."""
    with upstream_servers(fake_upstream, SERVED) as (servers, modes):
        yield servers, modes


def serve_config(**overrides):
    config = serve.get_config()
    config.timeout_s = 1.0
    config.cooloff_s = 600.0
    config.update(overrides)
    return config


@pytest.fixture(params=["inline"])
def proxy(request, router, upstreams, tmp_path):
    """The proxy in a thread, recording into tmp_path/log; yields (base URL, Proxy). Parametrised by where it
    scores (`config.scoring`): a test may ask for "thread" too (indirect parametrisation)."""
    servers, modes = upstreams
    for mode in modes.values():
        mode.clear()
    backends = {name: Backend(name, servers[name].url + "/v1", name, "") for name in SERVED}
    proxy = Proxy(router, backends, Recorder(tmp_path / "log", router.pool), serve_config(scoring=request.param))
    with ServerThread(make_app(proxy)) as server:
        yield server.url, proxy


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def expected(router: Router, messages: list[dict], available=SERVED):
    task, history = routing_state(converter_messages(messages))
    return router.route(task, history, available=available)


def test_a_multi_turn_conversation_is_routed_as_the_router_routes_it_and_recorded(proxy, router):
    url, live = proxy
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TASK + " Use a tool."}]
    session = {"x-rivet-session": "s-1"}
    chosen = []
    for turn in range(3):
        raw = client(url).chat.completions.with_raw_response.create(model="rivet", messages=messages,
                                                                    extra_headers=session)
        decision = expected(router, messages)
        model = raw.headers["x-rivet-model"]
        assert model == decision.model
        scores = json.loads(raw.headers["x-rivet-scores"])
        assert set(scores) == set(SERVED)
        for name, score in scores.items():
            assert score == pytest.approx(decision.scores[name], abs=1e-5)
        ranked = sorted(scores.values(), reverse=True)
        assert float(raw.headers["x-rivet-margin"]) == pytest.approx(ranked[0] - ranked[1], abs=1e-5)
        assert raw.headers["x-rivet-turn"] == str(turn) and raw.headers["x-rivet-propensity"] == "1.000000"
        message = raw.parse().choices[0].message
        assert message.model_dump(exclude_none=True, exclude={"refusal", "annotations"}) == {
            key: value for key, value in answer(model, messages).items() if value is not None}  # passed unchanged
        chosen.append(model)
        if turn == 0:   # a tool call, answered by a tool message
            assert message.tool_calls[0].function.name == "lookup"
            messages += [message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "Brasilia"}]
        else:
            messages += [message.model_dump(exclude_none=True), {"role": "user", "content": f"next {turn}"}]
    done = httpx.post(f"{url}/v1/episodes/s-1/outcome", json={"outcome": 0.75})
    assert done.status_code == 200 and done.json()["turns"] == 3

    [episode] = read_episodes(live.recorder.episodes_path, router.pool).episodes
    assert [t.model for t in episode.turns] == chosen and episode.outcome == 0.75
    assert episode.task.prompt == TASK + " Use a tool."
    assert episode.turns[0].response == "[tool_call call_0] lookup({\"q\": 1})"
    assert episode.turns[0].feedback == "[tool call_0] Brasilia"
    assert episode.turns[1].feedback == "[user] next 1" and episode.turns[2].feedback == ""
    card = router.pool.cards[router.pool.index(chosen[1])]
    assert episode.turns[1].prompt_tokens == 10 * 4                          # the 4 messages of the second call
    assert episode.turns[1].cost == pytest.approx(
        (card.price_in_per_mtok * 40 + card.price_out_per_mtok * COMPLETION_TOKENS) / 1e6)
    assert all(t.propensity == 1.0 and set(t.available) == set(SERVED) and t.latency_s > 0 for t in episode.turns)


def test_cached_prompt_tokens_are_billed_at_the_cards_cached_price_and_a_switch_pays_full_price(
        workdir, upstreams, tmp_path):
    """The fake upstreams cache prompts as providers do (the same model's previous call in the conversation); the
    cards price a cached token at a tenth of the input price (issue 44)."""
    plain = Router.from_checkpoint(workdir)
    pool = ModelPool(tuple(dataclasses.replace(c, price_cached_in_per_mtok=c.price_in_per_mtok / 10)
                           for c in plain.pool.cards))
    router = Router.from_checkpoint(workdir, pool=pool)   # cache prices are not the network's: the checkpoint loads
    servers, _ = upstreams
    backends = {name: Backend(name, servers[name].url + "/v1", name, "") for name in SERVED}
    live = Proxy(router, backends, Recorder(tmp_path / "log", router.pool), serve_config())
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TASK + " cached"}]
    with ServerThread(make_app(live)) as server:
        for turn, model in enumerate(("apex-flash", "apex-flash", "llama-70b")):
            headers = {"x-rivet-session": "cache-1", "x-rivet-candidates": model}
            if turn == 1:   # streamed: the usage comes in the last chunk
                stream = client(server.url).chat.completions.create(model="rivet", messages=messages, stream=True,
                                                                    extra_headers=headers)
                content = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
            else:
                content = client(server.url).chat.completions.create(
                    model="rivet", messages=messages, extra_headers=headers).choices[0].message.content
            messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"next {turn}"}]
        assert httpx.post(f"{server.url}/v1/episodes/cache-1/outcome", json={"outcome": 1}).status_code == 200
    [episode] = read_episodes(live.recorder.episodes_path, router.pool).episodes
    assert [t.model for t in episode.turns] == ["apex-flash", "apex-flash", "llama-70b"]
    assert [t.prompt_tokens for t in episode.turns] == [20, 40, 60]   # 10 per message
    assert [t.cached_tokens for t in episode.turns] == [0, 20, 0]     # the switch to llama-70b: nothing cached
    flash, llama = (pool.cards[pool.index(name)] for name in ("apex-flash", "llama-70b"))
    by_hand = [(flash.price_in_per_mtok * 20 + flash.price_out_per_mtok * COMPLETION_TOKENS) / 1e6,
               (flash.price_in_per_mtok * 20 + flash.price_in_per_mtok / 10 * 20
                + flash.price_out_per_mtok * COMPLETION_TOKENS) / 1e6,
               (llama.price_in_per_mtok * 60 + llama.price_out_per_mtok * COMPLETION_TOKENS) / 1e6]
    assert [t.cost for t in episode.turns] == pytest.approx(by_hand, rel=1e-12)


def test_a_cache_aware_router_is_told_which_model_served_the_previous_turn_and_its_prompt(workdir, upstreams,
                                                                                          tmp_path):
    """A client's history has no models: the proxy fills in the last turn's from what it recorded, so a cache-aware
    router adds that model's prompt-cache saving (issue 44)."""
    plain = Router.from_checkpoint(workdir)
    pool = ModelPool(tuple(dataclasses.replace(c, price_cached_in_per_mtok=c.price_in_per_mtok / 10)
                           for c in plain.pool.cards))
    blind = Router.from_checkpoint(workdir, pool=pool)
    config = blind.config.copy_and_resolve_references()
    config.model.cache_aware = True
    aware = Router(blind._params, pool, blind.encoder, config, blind._card_embeddings, c_ref=blind.c_ref, stacked=True)
    servers, _ = upstreams
    backends = {name: Backend(name, servers[name].url + "/v1", name, "") for name in SERVED}
    live = Proxy(aware, backends, Recorder(tmp_path / "log", pool), serve_config())
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TASK + " aware"}]
    headers = {"x-rivet-session": "aware-1"}
    with ServerThread(make_app(live)) as server:
        first = client(server.url).chat.completions.create(
            model="rivet", messages=messages, extra_headers={**headers, "x-rivet-candidates": "apex-flash"})
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "next"}]
        raw = client(server.url).chat.completions.with_raw_response.create(model="rivet", messages=messages,
                                                                           extra_headers=headers)
    scores = json.loads(raw.headers["x-rivet-scores"])
    task, history = routing_state(converter_messages(messages))
    told = [{**history[-1], "model": "apex-flash", "prompt_tokens": 20}]   # 10 tokens per message of the first call
    expected = aware.route(task, told, available=SERVED).scores
    unaware = blind.route(task, history, available=SERVED).scores
    for name in SERVED:
        assert scores[name] == pytest.approx(expected[name], abs=1e-5)
    assert scores["apex-flash"] > unaware["apex-flash"] + 1e-4
    assert scores["llama-70b"] == pytest.approx(unaware["llama-70b"], abs=1e-5)


@pytest.mark.parametrize("proxy", ["inline", "thread"], indirect=True)
def test_concurrent_requests_are_each_routed_as_the_router_routes_them(proxy, router):
    """Sixteen requests at once: in a thread they are scored in batches; every answer must still be its own."""
    url, live = proxy
    conversations = [[{"role": "user", "content": f"{TASK} Variant {k}: " + "step " * (5 * k)}] for k in range(16)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda m: httpx.post(f"{url}/v1/chat/completions", timeout=60,
                                                     json={"model": "rivet", "messages": m}), conversations))
    for messages, reply in zip(conversations, replies):
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-rivet-model"] == expected(router, messages).model
        assert reply.json()["choices"][0]["message"]["content"] == f"{reply.headers['x-rivet-model']} answer 0"
    assert len(live.recorder.open) == 16


def test_streaming_passes_the_stream_through_and_records_the_turn(proxy, router):
    url, live = proxy
    messages = [{"role": "user", "content": TASK}]
    with client(url).chat.completions.with_streaming_response.create(
            model="rivet", messages=messages, stream=True, extra_headers={"x-rivet-session": "s-stream"}) as raw:
        model = raw.headers["x-rivet-model"]
        chunks = list(raw.parse())
    assert model == expected(router, messages).model
    assert all(chunk.choices for chunk in chunks)   # the usage-only chunk the proxy asked for is not passed on
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == f"{model} answer 0"
    [(_, episode)] = live.recorder.open.items()
    assert episode.turns[0].response == f"{model} answer 0"
    assert (episode.turns[0].prompt_tokens, episode.turns[0].completion_tokens) == (10, COMPLETION_TOKENS)

    # a streamed tool call arrives in pieces; the client sees them as sent, the record joins them
    messages += [{"role": "assistant", "content": f"{model} answer 0"}, {"role": "user", "content": "a tool now"}]
    stream = client(url).chat.completions.create(model="rivet", messages=messages, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_headers={"x-rivet-session": "s-stream"})
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == COMPLETION_TOKENS and not chunks[-1].choices  # asked for: kept
    assert "".join(c.choices[0].delta.tool_calls[0].function.arguments or ""
                   for c in chunks if c.choices and c.choices[0].delta.tool_calls) == '{"q": 1}'
    assert live.recorder.open["s-stream"].turns[1].response == '[tool_call call_1] lookup({"q": 1})'
    assert live.recorder.open["s-stream"].turns[0].feedback == "[user] a tool now"


@pytest.mark.parametrize("fault", ["fail", "hang"])
def test_a_failing_or_hanging_backend_is_passed_over_for_the_next_best(proxy, router, upstreams, fault):
    url, live = proxy
    _, modes = upstreams
    messages = [{"role": "user", "content": TASK}]
    decision = expected(router, messages)
    modes[decision.model][fault] = True
    runner_up = sorted(SERVED, key=lambda name: -decision.scores[name])[1]
    raw = client(url).chat.completions.with_raw_response.create(model="rivet", messages=messages,
                                                                extra_headers={"x-rivet-session": "s-fault"})
    assert raw.headers["x-rivet-failed"] == decision.model and raw.headers["x-rivet-model"] == runner_up
    assert raw.headers["x-rivet-propensity"] == "fallback"
    assert raw.parse().choices[0].message.content == f"{runner_up} answer 0"
    turn = live.recorder.open["s-fault"].turns[0]
    assert turn.model == runner_up and turn.propensity is None and decision.model in turn.available
    # down for the cool-off: the next request does not try it, and its availability no longer lists it
    calls = modes[decision.model]["calls"]
    messages += [{"role": "assistant", "content": f"{runner_up} answer 0"}, {"role": "user", "content": "more"}]
    raw = client(url).chat.completions.with_raw_response.create(model="rivet", messages=messages,
                                                                extra_headers={"x-rivet-session": "s-fault"})
    assert modes[decision.model]["calls"] == calls and "x-rivet-failed" not in raw.headers
    assert decision.model not in live.recorder.open["s-fault"].turns[1].available
    assert raw.headers["x-rivet-model"] == expected(router, messages,
                                                    [m for m in SERVED if m != decision.model]).model
    assert httpx.get(f"{url}/healthz").json()["backends"][decision.model]["up"] is False


def test_no_backend_left_is_a_clear_openai_error(proxy, upstreams):
    url, live = proxy
    _, modes = upstreams
    for mode in modes.values():
        mode["fail"] = True
    with pytest.raises(openai.APIStatusError) as raised:
        client(url).chat.completions.create(model="rivet", messages=[{"role": "user", "content": TASK}])
    assert raised.value.status_code == 502 and "every candidate tried failed" in raised.value.message
    assert not live.recorder.open
    with pytest.raises(openai.APIStatusError) as raised:   # all three are down now
        client(url).chat.completions.create(model="rivet", messages=[{"role": "user", "content": TASK}])
    assert raised.value.status_code == 503 and "no candidate model is up" in raised.value.message
    assert httpx.get(f"{url}/healthz").status_code == 503


@pytest.mark.parametrize("body, headers, words", [
    (b"{not json", {}, "not JSON"),
    (b"[1, 2]", {}, "must be a JSON object"),
    (json.dumps({"model": "rivet"}).encode(), {}, "no 'messages'"),
    (json.dumps({"messages": [{"role": "tool", "content": "x", "tool_call_id": "a"}]}).encode(), {}, "no call"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2}).encode(), {}, "'n' must be 1"),
    (json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(), {}, "messages[0].role"),
    (json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(), {}, "messages[0].content"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(), {"x-rivet-candidates": "gpt-9"},
     "gpt-9"),
])
def test_malformed_requests_get_400_with_a_message(proxy, body, headers, words):
    url, live = proxy
    response = httpx.post(f"{url}/v1/chat/completions", content=body,
                          headers={"content-type": "application/json", **headers})
    assert response.status_code == 400, response.text
    assert words in response.json()["error"]["message"]
    assert not live.recorder.open


def test_the_candidates_header_narrows_the_choice(proxy, router):
    url, _ = proxy
    messages = [{"role": "user", "content": TASK}]
    raw = client(url).chat.completions.with_raw_response.create(
        model="rivet", messages=messages, extra_headers={"x-rivet-candidates": "quill-9b, llama-70b"})
    assert set(json.loads(raw.headers["x-rivet-scores"])) == {"quill-9b", "llama-70b"}
    assert raw.headers["x-rivet-model"] == expected(router, messages, ["quill-9b", "llama-70b"]).model


def test_outcomes_are_checked(proxy):
    url, _ = proxy
    session = "u-9 ü/用户"     # any text: quoted in the header and in the outcome's path
    raw = client(url).chat.completions.with_raw_response.create(
        model="rivet", messages=[{"role": "user", "content": TASK}], user=session)
    assert urllib.parse.unquote(raw.headers["x-rivet-session"]) == session
    path = f"{url}/v1/episodes/{urllib.parse.quote(session, safe='')}/outcome"
    assert httpx.post(path, json={"outcome": 1.5}).status_code == 400
    assert httpx.post(path, json={"score": 1}).status_code == 400
    assert httpx.post(f"{url}/v1/episodes/nobody/outcome", json={"outcome": 1}).status_code == 404
    assert httpx.post(path, json={"outcome": 1}).json()["recorded_in"] == "episodes.jsonl"
    assert httpx.post(path, json={"outcome": 1}).status_code == 404  # closed already


@pytest.mark.slow
def test_the_recorded_file_validates_and_trains(proxy, router, tmp_path):
    url, live = proxy
    for k in range(3):
        messages = [{"role": "user", "content": f"{TASK} (variant {k})"}]
        for turn in range(2):
            reply = client(url).chat.completions.create(model="rivet", messages=messages, user=f"user-{k}")
            messages += [reply.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": f"feedback {turn}"}]
        httpx.post(f"{url}/v1/episodes/user-{k}/outcome", json={"outcome": k / 2}).raise_for_status()
    cards = tmp_path / "cards.json"
    write_model_cards(cards, router.pool)
    validated = subprocess.run([sys.executable, "-m", "launch.validate_data",
                                f"--episodes={live.recorder.episodes_path}", f"--cards={cards}"],
                               cwd=REPO, capture_output=True, text=True, timeout=300)
    assert validated.returncode == 0, validated.stderr[-2000:]
    config = default.get_config("tiny")
    config.data.episodes, config.data.cards = str(live.recorder.episodes_path), str(cards)
    config.optim.batch_size, config.mc_epochs, config.td_epochs = 4, 1, 1
    state = train.train(config, tmp_path / "retrained")
    assert int(state.step) > 0
    assert Router.from_checkpoint(tmp_path / "retrained").pool.names == router.pool.names


@pytest.mark.slow
def test_serve_record_retrain_serve_on_old_and_new_logs_keeps_the_old_test_tasks_in_test(upstreams, tmp_path):
    """serve -> record -> outcome -> retrain -> serve: the retrained run reads the old logs and the served episodes
    together (two files) and extends the old run's split, so every old task keeps its split (the old test tasks
    stay in test) and each served task joins the split its hash draws; served episodes carry their task family."""
    servers, modes = upstreams
    for mode in modes.values():
        mode.clear()
    old = tmp_path / "old"
    holdout = {"data.holdout.validation": 0.3, "data.holdout.test": 0.3, "stage": "offline", "mc_epochs": 1,
               "td_epochs": 1}
    train.train(tiny_config(**holdout, **{"data.demo_tasks": 20}), old)
    old_split = json.loads((old / "splits.json").read_text())
    assert old_split["test"] and old_split["validation"]

    def serve_some(workdir, logdir, tasks):
        router = Router.from_checkpoint(workdir)
        backends = {name: Backend(name, servers[name].url + "/v1", name, "") for name in SERVED}
        proxy = Proxy(router, backends, Recorder(logdir, router.pool), serve_config())
        with ServerThread(make_app(proxy)) as server:
            for k, task in enumerate(tasks):
                headers = {"x-rivet-session": f"new-{k}", **({"x-rivet-task-family": "served"} if k % 2 else {})}
                messages = [{"role": "user", "content": task}]
                for turn in range(2):
                    reply = client(server.url).chat.completions.create(model="rivet", messages=messages,
                                                                       extra_headers=headers)
                    messages += [reply.choices[0].message.model_dump(exclude_none=True),
                                 {"role": "user", "content": f"result {turn}"}]
                closed = httpx.post(f"{server.url}/v1/episodes/new-{k}/outcome", json={"outcome": k % 2})
                assert closed.status_code == 200, closed.text
        proxy.recorder.close_files()
        return proxy.recorder.episodes_path

    tasks = [f"New task {k}: find the population of city number {k}." for k in range(8)]
    served = serve_some(old, tmp_path / "log", tasks)
    recorded = read_episodes(served, Router.from_checkpoint(old).pool).episodes
    assert [e.task.family for e in recorded] == [None, "served"] * 4 and all(len(e.turns) == 2 for e in recorded)

    old_logs, cards = old / "data" / "episodes.jsonl", old / "data" / "model_cards.json"
    config = default.get_config("tiny")
    config.update_from_flattened_dict({**holdout, "data.episodes": f"{old_logs},{served}", "data.cards": str(cards),
                                       "data.holdout.extend": str(old / "splits.json")})
    new = tmp_path / "new"
    train.train(config, new)
    new_split = json.loads((new / "splits.json").read_text())
    assert new_split["extended_from"] == str(old / "splits.json")
    for name in ("train", "validation", "test"):
        assert set(old_split[name]) <= set(new_split[name]), name        # no old task moved
    for episode in recorded:
        drawn = hashed_split(episode.task.id, 0.3, 0.3, config.data.holdout.seed)
        assert [name for name in ("train", "validation", "test") if episode.task.id in new_split[name]] == [drawn]
    # and the retrained router serves
    assert serve_some(new, tmp_path / "log2", tasks[:1]).exists()


@pytest.mark.slow
def test_a_killed_proxy_restarts_with_every_recorded_turn(workdir, upstreams, tmp_path):
    servers, modes = upstreams
    for mode in modes.values():
        mode.clear()
    port = free_port()
    config = tmp_path / "serve_config.py"
    backends = {name: {"base_url": servers[name].url + "/v1", "model": name, "api_key_env": ""} for name in SERVED}
    config.write_text("from configs import serve\n\n\ndef get_config():\n    config = serve.get_config()\n"
                      f"    config.backends = {backends!r}\n    config.port = {port}\n"
                      f"    config.logdir = {str(tmp_path / 'log')!r}\n    return config\n")
    url = f"http://127.0.0.1:{port}"

    def start() -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-m", "launch.serve", f"--workdir={workdir}",
                                    f"--config={config}"], cwd=REPO, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert process.poll() is None, process.stdout.read()[-3000:]
            try:
                httpx.get(f"{url}/healthz")
                return process
            except httpx.TransportError:
                time.sleep(0.2)
        process.kill()
        raise AssertionError("launch.serve did not start")

    messages = [{"role": "user", "content": TASK}]
    process = start()
    try:
        for turn in range(2):
            reply = client(url).chat.completions.create(model="rivet", messages=messages, user="killed")
            messages += [reply.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": f"feedback {turn}"}]
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    process = start()
    try:
        assert httpx.get(f"{url}/healthz").json()["open_episodes"] == 1
        client(url).chat.completions.create(model="rivet", messages=messages, user="killed")
        closed = httpx.post(f"{url}/v1/episodes/killed/outcome", json={"outcome": 1})
        assert closed.status_code == 200 and closed.json()["turns"] == 3
    finally:
        process.terminate()
        process.wait(timeout=30)
    [episode] = read_episodes(tmp_path / "log" / "episodes.jsonl", Router.from_checkpoint(workdir).pool).episodes
    assert [t.feedback for t in episode.turns] == ["[user] feedback 0", "[user] feedback 1", ""]
    assert [t.response for t in episode.turns[:2]] == [m["content"] for m in messages[1::2]]


@pytest.mark.slow
def test_the_serve_config_refuses_unknown_backends_at_start(workdir, tmp_path):
    config = tmp_path / "bad.py"
    config.write_text("from configs import serve\n\n\ndef get_config():\n    config = serve.get_config()\n"
                      "    config.backends = {'gpt-9': {'base_url': 'http://127.0.0.1:9/v1', 'model': 'x'}}\n"
                      "    return config\n")
    result = subprocess.run([sys.executable, "-m", "launch.serve", f"--workdir={workdir}", f"--config={config}"],
                            cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ})
    assert result.returncode == 1
    assert "backends ['gpt-9'] are not models of the router's pool" in result.stderr
    assert "Traceback" not in result.stderr
