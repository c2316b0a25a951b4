"""The proxy under faults and hostile input, over real HTTP on loopback (issue 27): hostile upstream replies and
streams, texts that break naive line framing, torn and corrupted files, a second proxy on one log directory, a
full disk, hostile session ids and request bodies, and cross-site or unauthenticated callers.

Every case asserts the three promises: a clear answer (the status and a message that says what happened), nothing
lost (what was served is recorded once, what was not is not, and the files read back), and no traceback in the
proxy's log (`no_tracebacks`, applied to every test here). The SIGKILL restart of a real `launch.serve` process is
tests/test_serve.py's `test_a_killed_proxy_restarts_with_every_recorded_turn`."""

import asyncio
import errno
import json
import logging
import os
from urllib.parse import quote, unquote

import httpx
import openai
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from configs import serve
from rivet_jax.data.converters.openai_chat import routing_state
from rivet_jax.data.schema import read_episodes
from rivet_jax.router import Router
from rivet_jax.serve import journal, upstream
from rivet_jax.serve.app import make_app
from rivet_jax.serve.conversation import MAX_DEPTH
from rivet_jax.serve.conversation import converter_messages
from rivet_jax.serve.fake import ServerThread, fake_upstream
from rivet_jax.serve.journal import LogDirBusyError
from rivet_jax.serve.proxy import Proxy
from rivet_jax.serve.recorder import Recorder
from rivet_jax.serve.upstream import Backend
from tests.common import upstream_servers

SERVED = ("apex-flash", "llama-70b", "quill-9b")
TASK = "Find the capital of the country with the largest population in South America."
KEY = "sk-test-9f8e7d6c5b4a3210fedcba"     # what the backends' key variable holds; must never be shown
TOKEN = "proxy-token-0123456789"


# ------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def no_tracebacks(caplog):
    """The proxy's log (every logger, the server's included) holds no traceback and no 'request failed'."""
    caplog.set_level(logging.INFO)
    yield
    bad = [r for r in caplog.records if r.exc_info or "request failed" in r.getMessage()
           or "Traceback" in r.getMessage()]
    assert not bad, [r.getMessage() for r in bad]
    assert not any(KEY in r.getMessage() for r in caplog.records)  # the key is never logged either


@pytest.fixture(scope="module")
def router(demo_router_dir) -> Router:
    return Router.from_checkpoint(demo_router_dir)


def hostile(model: str, mode: dict):
    """The fake upstream of `model`, misbehaving as `mode["kind"]` says (read per request; None: behaves)."""
    normal = fake_upstream(model, {})

    async def app(scope, receive, send):
        if scope["type"] != "http" or not mode.get("kind"):
            return await normal(scope, receive, send)
        request = Request(scope, receive)
        body = json.loads(await request.body())
        mode["calls"] = mode.get("calls", 0) + 1
        await misbehave(mode["kind"], model, body, request)(scope, receive, send)

    return app


def completion(message) -> dict:
    return {"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}}


def sse(chunk) -> bytes:
    return f"data: {chunk if isinstance(chunk, str) else json.dumps(chunk)}\n\n".encode()


def delta(content: str, finish: str | None = None) -> dict:
    return {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}


class Died(Exception):
    """Raised inside a streaming body: the server drops the connection mid-stream."""


def misbehave(kind: str, model: str, body: dict, request: Request) -> Response:
    async def trickle():
        for byte in json.dumps(completion({"role": "assistant", "content": "x" * 10_000})).encode():
            await asyncio.sleep(0.2)
            yield bytes([byte])

    plain = {
        "trickle": lambda: StreamingResponse(trickle(), media_type="application/json"),
        "object_content": lambda: JSONResponse(completion({"role": "assistant", "content": {"text": "hi"}})),
        "list_content": lambda: JSONResponse(completion({"role": "assistant", "content": [1, 2]})),
        "invalid_json": lambda: Response(b'{"choices": [', media_type="application/json"),
        "empty": lambda: Response(b"", media_type="application/json"),
        "huge": lambda: JSONResponse(completion({"role": "assistant", "content": "x" * 5000})),
        "html": lambda: Response(b"<html>busy</html>", media_type="text/html"),
        "no_choices": lambda: JSONResponse({"choices": []}),
        "null_message": lambda: JSONResponse({"choices": [{"index": 0, "message": None}]}),
        "bad_tool_calls": lambda: JSONResponse(completion({"role": "assistant", "content": None,
                                                           "tool_calls": "lookup"})),
        "no_content": lambda: JSONResponse(completion({"role": "assistant", "content": None})),
        "lone_surrogate": lambda: Response(json.dumps(completion({"role": "assistant", "content": "bad "})).replace(
            "bad ", "bad \\ud800"), media_type="application/json"),
        "echo_key_401": lambda: JSONResponse({"error": {"message": "Incorrect API key provided: "
                                                        + request.headers.get("authorization", "")}}, 401),
        "echo_key_500": lambda: JSONResponse({"error": {"message": "internal; key="
                                                        + request.headers.get("authorization", "")[7:]}}, 500),
        "separators": lambda: JSONResponse(completion({"role": "assistant",
                                                       "content": f"{model} line\u2028para\u2029end"})),
    }
    if kind in plain:
        return plain[kind]()

    async def stream():
        if kind == "stream_bad_first":
            yield sse("not json at all")
            return
        if kind == "stream_done_only":
            yield b"data: [DONE]\n\n"
            return
        if kind == "stream_empty":       # chunks and an end, but nothing in them
            yield sse(delta("", finish="stop"))
            yield b"data: [DONE]\n\n"
            return
        if kind in ("stream_comment_first", "stream_pings"):
            yield b": keep-alive\n\n"   # an SSE comment (some gateways send one before the first chunk)
        if kind == "stream_pings":       # comments forever, every 0.2 s: the read timeout never fires
            while True:
                await asyncio.sleep(0.2)
                yield b": ping\n\n"
        yield sse(delta(""))
        yield sse(delta(f"{model} "))
        if kind == "stream_die":
            raise Died("connection lost")
        if kind == "stream_stall":
            await asyncio.sleep(5)
        if kind == "stream_slow":        # a healthy but slow answer
            await asyncio.sleep(0.8)
        if kind == "stream_trickle":     # a byte every 0.2 s, forever: each read arrives within the read timeout
            for byte in sse(delta("x" * 10_000)):
                await asyncio.sleep(0.2)
                yield bytes([byte])
        if kind == "stream_malformed":
            yield sse("{not json")
        yield sse(delta("answer 0", finish=None if kind == "stream_no_end" else "stop"))
        if kind != "stream_no_end":
            yield b"data: [DONE]\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def upstreams():
    with upstream_servers(hostile, SERVED) as (servers, modes):
        yield servers, modes


@pytest.fixture
def start(router, upstreams, tmp_path, monkeypatch):
    """start(**config overrides) -> (base URL, Proxy): the proxy in a thread, recording into tmp_path/log, every
    backend's key in RIVET_TEST_KEY. Stopped at the end of the test."""
    servers, modes = upstreams
    for mode in modes.values():
        mode.clear()
    monkeypatch.setenv("RIVET_TEST_KEY", KEY)
    monkeypatch.setenv("RIVET_PROXY_TOKEN", TOKEN)
    started = []

    def start(logdir=None, **overrides):
        config = serve.get_config()
        config.timeout_s, config.cooloff_s = 1.0, 600.0
        config.update(overrides)
        backends = {name: Backend(name, servers[name].url + "/v1", name, "RIVET_TEST_KEY") for name in SERVED}
        proxy = Proxy(router, backends, Recorder(logdir or tmp_path / "log", router.pool), config)
        server = ServerThread(make_app(proxy)).__enter__()
        started.append(server)
        return server.url, proxy

    yield start
    for server in started:
        server.__exit__()


def first_choice(router: Router, messages: list[dict]) -> tuple[str, str]:
    """The router's first and second choice among the served models for these messages."""
    task, history = routing_state(converter_messages(messages))
    decision = router.route(task, history, available=SERVED)
    ranked = sorted(SERVED, key=lambda name: -decision.scores[name])
    return ranked[0], ranked[1]


def post(url: str, body, session: str | None = "s", headers: dict | None = None, **kwargs) -> httpx.Response:
    headers = {**({"x-rivet-session": session} if session else {}), **(headers or {})}
    if isinstance(body, (bytes, str)):
        return httpx.post(f"{url}/v1/chat/completions", content=body, timeout=30,
                          headers={"content-type": "application/json", **headers}, **kwargs)
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30, **kwargs)


def close(url: str, session: str, outcome=1.0, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{url}/v1/episodes/{quote(session, safe='')}/outcome", json={"outcome": outcome},
                      headers=headers or {}, timeout=30)


def episodes(proxy: Proxy):
    return read_episodes(proxy.recorder.episodes_path, proxy.recorder.pool).episodes


def error_message(response: httpx.Response) -> str:
    return response.json()["error"]["message"]


MESSAGES = [{"role": "user", "content": TASK}]


# ------------------------------------------------------------------- 1. upstream replies that break the schema


BROKEN_REPLIES = ["object_content", "list_content", "invalid_json", "empty", "huge", "html", "no_choices",
                  "null_message", "bad_tool_calls", "no_content", "lone_surrogate"]


@pytest.mark.parametrize("kind", BROKEN_REPLIES)
def test_a_reply_that_breaks_the_schema_is_a_fault_and_the_next_model_serves(start, router, upstreams, kind,
                                                                              monkeypatch):
    monkeypatch.setattr(upstream, "MAX_REPLY_BYTES", 4000)   # "huge": 5 kB over a 4 kB limit
    url, proxy = start()
    first, second = first_choice(router, MESSAGES)
    upstreams[1][first]["kind"] = kind
    reply = post(url, {"model": "rivet", "messages": MESSAGES})
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-rivet-failed"] == first and reply.headers["x-rivet-model"] == second
    fault = proxy.health.last_fault[first]
    assert proxy.health.report()[first]["up"] is False
    assert any(why in fault for why in ("not a chat completion", "larger than", "cannot be recorded")), fault
    assert close(url, "s").status_code == 200
    [episode] = episodes(proxy)
    assert [t.model for t in episode.turns] == [second] and episode.turns[0].response == f"{second} answer 0"


def test_every_backend_returning_broken_replies_is_one_502_and_nothing_recorded(start, upstreams):
    url, proxy = start()
    for name in SERVED:
        upstreams[1][name]["kind"] = "object_content"
    reply = post(url, {"model": "rivet", "messages": MESSAGES})
    assert reply.status_code == 502 and "content is dict, not text" in error_message(reply)
    assert proxy.recorder.open == {} and not proxy.recorder.wal_path.read_text()


@pytest.mark.parametrize("kind", ["echo_key_401", "echo_key_500"])
def test_an_upstream_error_that_echoes_the_key_is_redacted_everywhere(start, upstreams, kind):
    url, proxy = start()
    for name in SERVED:
        upstreams[1][name]["kind"] = kind
    reply = post(url, {"model": "rivet", "messages": MESSAGES})
    assert reply.status_code == 502 and "[redacted]" in error_message(reply) and KEY not in reply.text
    health = httpx.get(f"{url}/healthz")
    assert health.status_code == 503 and KEY not in health.text and "[redacted]" in health.text
    assert KEY not in proxy.recorder.wal_path.read_text()


def test_line_and_paragraph_separators_in_a_response_are_served_recorded_and_read_back(start, router, upstreams):
    url, proxy = start()
    first, _ = first_choice(router, MESSAGES)
    upstreams[1][first]["kind"] = "separators"
    reply = post(url, {"model": "rivet", "messages": MESSAGES})
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"].count("\u2028") == 1
    proxy.recorder._directory.release()   # a crash: the files as they are, a new recorder reads them
    again = Recorder(proxy.recorder.logdir, proxy.recorder.pool)
    assert again.open["s"].turns[0].response == f"{first} line\u2028para\u2029end"


# ------------------------------------------------------------------------------- 2. framing and recovery


def restarted(proxy: Proxy) -> Recorder:
    """A new recorder on the proxy's directory, as after a crash (the files as they are)."""
    proxy.recorder._directory.release()
    return Recorder(proxy.recorder.logdir, proxy.recorder.pool)


def test_a_task_with_unicode_separators_keeps_its_open_episode_across_a_restart(start):
    url, proxy = start()
    task = "Line one\u2028line two\u2029and three: find the capital."
    assert post(url, {"model": "rivet", "messages": [{"role": "user", "content": task}]}).status_code == 200
    again = restarted(proxy)
    assert again.open["s"].task.prompt == task and len(again.open["s"].turns) == 1


def test_feedback_with_a_separator_survives_a_restart(start):
    url, proxy = start()
    first = post(url, {"model": "rivet", "messages": MESSAGES}).json()["choices"][0]["message"]
    messages = MESSAGES + [first, {"role": "user", "content": "tool says:\u2028Brasilia"}]
    assert post(url, {"model": "rivet", "messages": messages}).status_code == 200
    again = restarted(proxy)
    assert again.open["s"].turns[0].feedback == "[user] tool says:\u2028Brasilia"


def test_a_torn_wal_tail_that_cuts_a_character_is_dropped_and_the_rest_recovers(start):
    url, proxy = start()
    assert post(url, {"model": "rivet", "messages": MESSAGES}).status_code == 200
    torn = json.dumps({"event": "turn", "episode": "x", "text": "caf\u00e9"}, ensure_ascii=False).encode()
    with open(proxy.recorder.wal_path, "ab") as f:
        f.write(torn[:torn.index("\u00e9".encode()) + 1])   # half of the two-byte é, no line feed
    again = restarted(proxy)
    assert len(again.open["s"].turns) == 1
    [quarantined] = [json.loads(line) for line in again.quarantine_path.read_text().splitlines()]
    assert quarantined["why"].startswith("torn") and quarantined["line"] == 3


def test_a_bad_line_in_the_middle_of_the_wal_is_quarantined_with_its_line_number(start):
    url, proxy = start()
    assert post(url, {"model": "rivet", "messages": MESSAGES}).status_code == 200
    lines = proxy.recorder.wal_path.read_bytes().split(b"\n")
    proxy.recorder.wal_path.write_bytes(b"\n".join([lines[0], b"garbage {", *lines[1:]]))
    again = restarted(proxy)
    assert len(again.open["s"].turns) == 1
    [quarantined] = [json.loads(line) for line in again.quarantine_path.read_text().splitlines()]
    assert quarantined["line"] == 2 and "invalid JSON" in quarantined["why"] and quarantined["raw"] == "garbage {"


def test_a_wal_turn_the_schema_refuses_is_quarantined_not_a_refusal_to_start(start):
    url, proxy = start()
    assert post(url, {"model": "rivet", "messages": MESSAGES}).status_code == 200
    lines = proxy.recorder.wal_path.read_text().splitlines()
    event = json.loads(lines[1])
    event["turn"]["response"] = {"not": "text"}
    proxy.recorder.wal_path.write_text("\n".join([lines[0], lines[1], json.dumps(event)]) + "\n")
    again = restarted(proxy)
    assert len(again.open["s"].turns) == 1
    [quarantined] = [json.loads(line) for line in again.quarantine_path.read_text().splitlines()]
    assert quarantined["line"] == 3 and "response" in quarantined["why"]


@pytest.mark.parametrize("name", ["episodes.jsonl", "unfinished.jsonl"])
def test_a_torn_last_line_of_an_output_file_is_cut_off_and_kept(start, name):
    url, proxy = start()
    assert post(url, {"model": "rivet", "messages": MESSAGES}).status_code == 200
    assert close(url, "s").status_code == 200
    path = proxy.recorder.logdir / name
    with open(path, "ab") as f:
        f.write(b'{"episode_id": "half')
    again = restarted(proxy)
    whole = path.read_bytes()
    assert (whole == b"" or whole.endswith(b"\n")) and b"half" not in whole
    assert (path.parent / (name + ".torn")).read_bytes() == b'{"episode_id": "half\n'
    assert len(read_episodes(again.episodes_path, again.pool).episodes) == 1


# ------------------------------------------------------------------------------------- 3. one writer per directory


def test_a_second_proxy_on_the_same_log_directory_is_refused_naming_the_first(start, tmp_path, router):
    start()
    with pytest.raises(LogDirBusyError, match=f"pid {os.getpid()}"):
        Recorder(tmp_path / "log", router.pool)


def test_the_directory_is_free_again_once_the_first_proxy_closes(tmp_path, router):
    first = Recorder(tmp_path / "log", router.pool)
    first.close_files()
    Recorder(tmp_path / "log", router.pool).close_files()


# ------------------------------------------------------------------------------------------------ 4. disk full


@pytest.fixture
def disk(monkeypatch):
    """disk["full"] = True: every fsync fails with ENOSPC (as a full disk reports a write it could not place)."""
    state = {"full": False}
    real = os.fsync

    def fsync(fd):
        if state["full"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(journal.os, "fsync", fsync)
    return state


def test_a_turn_on_a_full_disk_is_503_and_recorded_once_when_retried(start, disk):
    url, proxy = start()
    disk["full"] = True
    reply = post(url, {"model": "rivet", "messages": MESSAGES})
    assert reply.status_code == 503 and "No space left" in error_message(reply)
    assert proxy.recorder.open == {} and proxy.recorder.wal_path.read_bytes() == b""   # nothing half-written
    disk["full"] = False
    assert post(url, {"model": "rivet", "messages": MESSAGES}).status_code == 200   # no lingering session
    assert len(proxy.recorder.open["s"].turns) == 1
    assert close(url, "s").status_code == 200 and len(episodes(proxy)) == 1


def test_an_outcome_on_a_full_disk_is_503_and_the_episode_stays_open(start, disk):
    url, proxy = start()
    assert post(url, {"model": "rivet", "messages": MESSAGES}).status_code == 200
    disk["full"] = True
    reply = close(url, "s")
    assert reply.status_code == 503 and "nothing of this request was recorded" in error_message(reply)
    assert "s" in proxy.recorder.open and proxy.recorder.episodes_path.read_bytes() == b""
    disk["full"] = False
    assert close(url, "s").status_code == 200 and len(episodes(proxy)) == 1


def test_the_expiry_task_outlives_a_full_disk_and_says_so(start, disk):
    """Idle episodes expire in a background task; on a full disk its write fails. It died there, and no episode
    expired again until a restart; now it is logged, shown in /healthz, and the next pass expires the episode."""
    import time

    url, proxy = start(episode_timeout_s=0.2)
    assert post(url, {"model": "rivet", "messages": MESSAGES}).status_code == 200
    disk["full"] = True
    time.sleep(0.6)
    background = httpx.get(f"{url}/healthz").json()["background"]["expiry"]
    assert background["failures"] >= 1 and "No space left" in background["last_error"]
    assert "s" in proxy.recorder.open
    disk["full"] = False
    time.sleep(0.6)
    assert "s" not in proxy.recorder.open and unfinished(proxy)[0]["reason"].startswith("expired")
    assert "last_error" not in httpx.get(f"{url}/healthz").json()["background"]["expiry"]


def test_feedback_on_a_full_disk_is_503_and_the_turn_keeps_its_old_feedback(start, disk):
    url, proxy = start()
    first = post(url, {"model": "rivet", "messages": MESSAGES}).json()["choices"][0]["message"]
    disk["full"] = True
    reply = post(url, {"model": "rivet", "messages": MESSAGES + [first, {"role": "user", "content": "more"}]})
    assert reply.status_code == 503
    assert proxy.recorder.open["s"].turns[0].feedback == "" and len(proxy.recorder.open["s"].turns) == 1
    disk["full"] = False
    assert post(url, {"model": "rivet", "messages": MESSAGES + [first, {"role": "user", "content": "more"}]}
                ).status_code == 200
    assert proxy.recorder.open["s"].turns[0].feedback == "[user] more"


def test_a_streamed_turn_on_a_full_disk_ends_in_an_error_event_and_is_not_recorded(start, disk):
    url, proxy = start()
    disk["full"] = True
    with pytest.raises(openai.APIError, match="cannot write its log"):
        list(openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0).chat.completions.create(
            model="rivet", messages=MESSAGES, stream=True))
    assert proxy.recorder.open == {}


# ---------------------------------------------------------------------------- 5. streams that break or stall


@pytest.mark.parametrize("kind, why", [
    ("stream_die", "failed mid-stream"), ("stream_stall", "failed mid-stream"),
    ("stream_malformed", "failed mid-stream"), ("stream_no_end", "failed mid-stream"),
    # empty, or past the call's total deadline (a byte every 0.2 s never trips the read timeout)
    ("stream_empty", "failed mid-stream: .*(no content|deadline)"),
    ("stream_trickle", "failed mid-stream: .*(no content|deadline)")])
def test_a_stream_that_faults_after_it_started_reaches_the_client_as_an_error(start, router, upstreams, kind, why):
    url, proxy = start(deadline_s=2.0)
    first, _ = first_choice(router, MESSAGES)
    upstreams[1][first]["kind"] = kind
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)
    with pytest.raises(openai.APIError, match=why):
        list(client.chat.completions.create(model="rivet", messages=MESSAGES, stream=True))
    assert proxy.recorder.open == {} and proxy.health.report()[first]["up"] is False


@pytest.mark.parametrize("kind", ["stream_done_only", "stream_pings"])
def test_a_stream_with_nothing_before_its_end_or_deadline_falls_back_to_the_next_model(start, router, upstreams,
                                                                                        kind):
    """A stream of [DONE] alone (served, it was recorded as an empty turn) and one of keep-alive comments forever
    (never cut off: each comment resets the read timeout) both fail before their first chunk: the next model
    serves, the first is marked down."""
    url, proxy = start(deadline_s=2.0)
    first, second = first_choice(router, MESSAGES)
    upstreams[1][first]["kind"] = kind
    with openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0).chat.completions.with_streaming_response \
            .create(model="rivet", messages=MESSAGES, stream=True, extra_headers={"x-rivet-session": "s"}) as raw:
        assert raw.headers["x-rivet-model"] == second and raw.headers["x-rivet-failed"] == first
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert text == f"{second} answer 0" and proxy.recorder.open["s"].turns[0].model == second
    assert proxy.health.report()[first]["up"] is False


def test_a_comment_before_the_first_chunk_is_not_a_fault(start, router, upstreams):
    url, proxy = start()
    first, _ = first_choice(router, MESSAGES)
    upstreams[1][first]["kind"] = "stream_comment_first"
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)
    chunks = list(client.chat.completions.create(model="rivet", messages=MESSAGES, stream=True, user="s"))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == f"{first} answer 0"
    assert proxy.health.report()[first]["up"] is True and proxy.recorder.open["s"].turns[0].model == first


def test_a_reply_trickled_past_the_deadline_is_a_fault_and_the_next_model_serves(start, router, upstreams):
    url, proxy = start(deadline_s=2.0)
    first, second = first_choice(router, MESSAGES)
    upstreams[1][first]["kind"] = "trickle"
    reply = post(url, {"model": "rivet", "messages": MESSAGES})
    assert reply.status_code == 200 and reply.headers["x-rivet-model"] == second
    assert "deadline" in proxy.health.report()[first]["fault"]


def test_a_stream_whose_first_event_is_malformed_falls_back_to_the_next_model(start, router, upstreams):
    url, proxy = start()
    first, second = first_choice(router, MESSAGES)
    upstreams[1][first]["kind"] = "stream_bad_first"
    with openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0).chat.completions.with_streaming_response \
            .create(model="rivet", messages=MESSAGES, stream=True, extra_headers={"x-rivet-session": "s"}) as raw:
        assert raw.headers["x-rivet-model"] == second and raw.headers["x-rivet-failed"] == first
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert text == f"{second} answer 0" and proxy.recorder.open["s"].turns[0].model == second


# ------------------------------------------------------------------------------------------------- 6. sessions


def unfinished(proxy: Proxy) -> list[dict]:
    return [json.loads(line) for line in proxy.recorder.unfinished_path.read_text().splitlines()]


@pytest.mark.parametrize("edit", ["response", "feedback"])
def test_a_history_that_rewrites_an_earlier_turn_is_a_new_episode_and_the_old_kept_apart(start, edit):
    url, proxy = start()
    first = post(url, {"model": "rivet", "messages": MESSAGES}).json()["choices"][0]["message"]
    messages = MESSAGES + [first, {"role": "user", "content": "go on"}]
    second = post(url, {"model": "rivet", "messages": messages}).json()["choices"][0]["message"]
    if edit == "response":   # the same number of turns, an earlier served response rewritten
        messages[1] = {"role": "assistant", "content": "something the model never said"}
    else:
        messages[2] = {"role": "user", "content": "a different tool result"}
    assert post(url, {"model": "rivet", "messages": messages + [second, {"role": "user", "content": "and?"}]}
                ).status_code == 200
    [kept] = unfinished(proxy)
    assert kept["reason"].startswith("diverged") and edit in kept["reason"] and len(kept["turns"]) == 2
    assert proxy.recorder.open["s"].offset == 2   # the new episode begins mid-conversation: kept apart too


def test_a_retried_turn_is_recorded_once_as_the_answer_the_client_got(start, router):
    """A client that timed out and sent the same turn again on its session (the OpenAI SDKs retry twice by
    default): the episode goes on, its turn is the retry's answer (the one the conversation continues from),
    recorded once, and a restart replays it so. It was a divergence: the whole episode went to unfinished.jsonl,
    none of it trainable. (Without a session id an identical request is another agent starting alike.)"""
    url, proxy = start()
    session = "s"
    first, second = first_choice(router, MESSAGES)
    assert post(url, {"model": "rivet", "messages": MESSAGES}, session=session).headers["x-rivet-model"] == first
    retry = post(url, {"model": "rivet", "messages": MESSAGES}, session=session,
                 headers={"x-rivet-candidates": second})       # answered by another model, to tell them apart
    assert retry.status_code == 200 and retry.headers["x-rivet-model"] == second
    key = unquote(retry.headers["x-rivet-session"])
    assert [t.model for t in proxy.recorder.open[key].turns] == [second]
    messages = MESSAGES + [retry.json()["choices"][0]["message"], {"role": "user", "content": "go on"}]
    assert post(url, {"model": "rivet", "messages": messages}, session=session).status_code == 200
    assert not proxy.recorder.unfinished_path.read_text()
    assert [t.model for t in restarted(proxy).open[key].turns][0] == second
    assert len(restarted(proxy).open[key].turns) == 2


def test_parallel_requests_on_one_session_are_served_in_turn_and_recorded_as_one(start):
    """Three identical requests sent at once on one session (a client retrying while the first is in flight): they
    are served one after another, each asking the same turn again, so the episode holds one turn. They were
    recorded as three consecutive turns, with made-up feedback between them."""
    url, proxy = start()

    async def three():
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*[client.post(f"{url}/v1/chat/completions", headers={"x-rivet-session": "p"},
                                                      json={"model": "rivet", "messages": MESSAGES})
                                          for _ in range(3)])
    replies = asyncio.run(three())
    assert [r.status_code for r in replies] == [200, 200, 200]
    assert len(proxy.recorder.open["p"].turns) == 1 and not proxy.recorder.unfinished_path.read_text()


def test_an_outcome_posted_while_a_turn_streams_waits_for_it(start, router, upstreams):
    """The outcome arrives while the episode's turn is still streaming: it is applied once the turn is recorded, so
    the episode closes with that turn (it closed before it, or found no episode)."""
    url, proxy = start(timeout_s=5.0)
    first, _ = first_choice(router, MESSAGES)
    upstreams[1][first]["kind"] = "stream_slow"

    async def stream_and_close():
        async with httpx.AsyncClient(timeout=30) as client:
            async with client.stream("POST", f"{url}/v1/chat/completions", headers={"x-rivet-session": "o"},
                                     json={"model": "rivet", "messages": MESSAGES, "stream": True}) as streamed:
                outcome = asyncio.ensure_future(client.post(f"{url}/v1/episodes/o/outcome", json={"outcome": 1}))
                body = b"".join([part async for part in streamed.aiter_bytes()])
            return body, await outcome
    body, outcome = asyncio.run(stream_and_close())
    assert b"[DONE]" in body and outcome.status_code == 200 and outcome.json()["turns"] == 1
    assert [len(e.turns) for e in episodes(proxy)] == [1]


def test_an_outcome_for_a_second_agent_without_a_session_id_waits_for_its_streaming_turn(start, router, upstreams):
    """Two agents start alike without session ids: the second is `key~2`, but its turns are served under the
    task's key. Its outcome, posted while its second turn streams, waits for that turn (it waited on `key~2`
    alone, found no turn in flight there, and closed the episode without it)."""
    url, proxy = start(timeout_s=5.0)
    _, second = first_choice(router, MESSAGES)     # the first agent answered by another model: the two differ
    post(url, {"model": "rivet", "messages": MESSAGES}, session=None, headers={"x-rivet-candidates": second})
    b = post(url, {"model": "rivet", "messages": MESSAGES}, session=None)
    key = unquote(b.headers["x-rivet-session"])
    assert key.endswith("~2")
    for settings in upstreams[1].values():
        settings["kind"] = "stream_slow"
    messages = MESSAGES + [b.json()["choices"][0]["message"], {"role": "user", "content": "go on"}]

    async def stream_and_close():
        async with httpx.AsyncClient(timeout=30) as client:
            async with client.stream("POST", f"{url}/v1/chat/completions",
                                     json={"model": "rivet", "messages": messages, "stream": True}) as streamed:
                outcome = asyncio.ensure_future(client.post(f"{url}/v1/episodes/{quote(key, safe='')}/outcome",
                                                            json={"outcome": 1}))
                body = b"".join([part async for part in streamed.aiter_bytes()])
            return body, await outcome
    body, outcome = asyncio.run(stream_and_close())
    assert b"[DONE]" in body and outcome.status_code == 200 and outcome.json()["turns"] == 2
    assert [len(e.turns) for e in episodes(proxy)] == [2]


@pytest.mark.parametrize("raw", [b'{"outcome": NaN}', b'{"outcome": 1e400}', b'{"outcome": "1"}',
                                 b'{"outcome": true}', b'{"outcome": 1, "outcome": 0}', b'[1]', b'{"outcome": null}',
                                 b'{"outcome": 2}', b'{"outcome": -0.5}'])
def test_an_outcome_that_is_not_a_number_in_0_1_is_400_and_leaves_the_episode_open(start, raw):
    url, proxy = start()
    assert post(url, {"model": "rivet", "messages": MESSAGES}).status_code == 200
    reply = httpx.post(f"{url}/v1/episodes/s/outcome", content=raw, headers={"content-type": "application/json"},
                       timeout=30)
    assert reply.status_code == 400 and "s" in proxy.recorder.open
    assert proxy.recorder.episodes_path.read_bytes() == b""
    assert close(url, "s", 0.5).status_code == 200 and [e.outcome for e in episodes(proxy)] == [0.5]


def test_two_agents_that_start_alike_without_session_ids_are_two_episodes(start):
    url, proxy = start()
    a = post(url, {"model": "rivet", "messages": MESSAGES}, session=None)
    assert post(url, {"model": "rivet", "messages": MESSAGES + [{"role": "assistant", "content": "elsewhere"},
                                                                {"role": "user", "content": "b"}]},
                session=None).status_code == 200   # a third agent, on turns this proxy did not serve
    b = post(url, {"model": "rivet", "messages": MESSAGES}, session=None)
    sessions = [unquote(r.headers["x-rivet-session"]) for r in (a, b)]
    assert len(set(sessions)) == 2 and sessions[1].startswith(sessions[0])
    for reply, turn in ((a, "a"), (b, "b")):
        message = reply.json()["choices"][0]["message"]
        again = post(url, {"model": "rivet", "messages": MESSAGES + [message, {"role": "user", "content": turn}]},
                     session=None)
        assert again.headers["x-rivet-session"] == reply.headers["x-rivet-session"]
    for reply in (a, b):
        assert close(url, unquote(reply.headers["x-rivet-session"])).status_code == 200
    assert [len(e.turns) for e in episodes(proxy)] == [2, 2]
    assert [t.feedback for e in episodes(proxy) for t in e.turns][::2] == ["[user] a", "[user] b"]


@pytest.mark.parametrize("session", ["two\nlines", "nul\x00byte", "tab\there", "x" * 600])
def test_a_session_id_no_route_could_carry_back_is_400(start, session):
    url, proxy = start()
    reply = post(url, {"model": "rivet", "messages": MESSAGES, "user": session}, session=None)
    assert reply.status_code == 400 and "session id" in error_message(reply) and proxy.recorder.open == {}


@pytest.mark.parametrize("session", ["user/42", "ünïcode sëssion", "a?b#c%20d"])
def test_a_session_id_with_slashes_or_unicode_is_closed_by_its_outcome(start, session):
    url, proxy = start()
    reply = post(url, {"model": "rivet", "messages": MESSAGES, "user": session}, session=None)
    assert reply.status_code == 200
    assert close(url, session).status_code == 200 and episodes(proxy)[0].episode_id.startswith(session)


def test_a_utf8_session_header_is_the_session_it_names(start):
    """HTTP headers are bytes; a client sending the session 'café' in UTF-8 must find it under that name (Starlette
    reads headers as Latin-1: it was recorded as 'cafÃ©'), and bytes that are not UTF-8 are a 400."""
    url, proxy = start()
    reply = post(url, {"model": "rivet", "messages": MESSAGES}, session=None,
                 headers={"x-rivet-session": "café".encode("utf-8")})
    assert reply.status_code == 200 and unquote(reply.headers["x-rivet-session"]) == "café"
    assert close(url, "café").status_code == 200 and episodes(proxy)[0].episode_id.startswith("café")
    reply = post(url, {"model": "rivet", "messages": MESSAGES}, session=None, headers={"x-rivet-session": b"\xff"})
    assert reply.status_code == 400 and "not UTF-8" in error_message(reply)


# ------------------------------------------------------------------------------------------ 7. client input


@pytest.mark.parametrize("body, why", [
    ('{"model": "rivet", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}', "NaN"),
    ('{"model": "rivet", "messages": [{"role": "user", "content": "x"}], "temperature": Infinity}', "Infinity"),
    ('{"model": "rivet", "messages": [{"role": "user", "content": "x"}], "top_p": -Infinity}', "-Infinity"),
    ('{"model": "rivet", "messages": [{"role": "user", "content": "x"}], "x": ' + "[" * 5000 + "]" * 5000 + "}",
     "nested"),
    ('{"model": "rivet", "messages": [{"role": "user", "content": "x"}], "x": ' + "[" * (MAX_DEPTH + 1)
     + "]" * (MAX_DEPTH + 1) + "}", "deeper than"),
    ('{"model": "rivet", "messages": [{"role": "user", "content": "bad \\ud800"}]}', "lone surrogate"),
    ('{"model": "rivet", "model": "other", "messages": []}', "duplicate key"),
    ('{"model": "rivet", "messages": [', "invalid JSON"),
    ('[1, 2]', "must be a JSON object"),
    # fields the chat-completions API does not have, or of the wrong type (issue 40): refused, never forwarded
    ('{"model": "rivet", "messages": [{"role": "user", "content": "x"}], "n": true}', "'n' must be an integer"),
    ('{"model": "rivet", "messages": [{"role": "user", "content": "x"}], "stream_options": "yes"}',
     "'stream_options' must be an object"),
    ('{"model": "rivet", "messages": [{"role": "user", "content": "x"}], "stream": "true"}',
     "'stream' must be true or false"),
    ('{"model": "rivet", "messages": [{"role": "user", "content": "x"}], "temperature": "0.5"}',
     "'temperature' must be a number"),
    ('{"model": "rivet", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}',
     "'max_tokens' must be an integer"),
    ('{"model": "rivet", "messages": [{"role": "user", "content": "x"}], "stop": [1]}',
     "'stop' must be a string or a list of strings"),
    ('{"model": 7, "messages": [{"role": "user", "content": "x"}]}', "'model' must be a string"),
    ('{"model": "rivet", "messages": [{"role": "user", "content": "x"}], "tempreature": 0.5}',
     "unknown field 'tempreature'"),
])
def test_a_hostile_body_is_400_with_why(start, body, why):
    url, proxy = start()
    reply = post(url, body)
    assert reply.status_code == 400 and why in error_message(reply) and proxy.recorder.open == {}


def test_a_huge_request_is_parsed_and_scored_off_the_event_loop(start, monkeypatch):
    """A 7.5 MB message stalled the event loop (every other request and /healthz) for seconds while it was parsed
    and scored inline. Large bodies are now read, parsed and scored in a thread; small ones stay inline."""
    from rivet_jax.serve import app as app_module, proxy as proxy_module

    on_loop = {}

    def running_loop() -> bool:
        try:
            asyncio.get_running_loop()
            return True
        except RuntimeError:
            return False

    def spy(name, real):
        def wrapped(*args, **kwargs):
            on_loop.setdefault(name, []).append(running_loop())
            return real(*args, **kwargs)
        return wrapped
    monkeypatch.setattr(app_module, "read_body", spy("read_body", app_module.read_body))
    monkeypatch.setattr(app_module, "read_request", spy("read_request", app_module.read_request))
    monkeypatch.setattr(proxy_module.Proxy, "_score_batch", spy("score", proxy_module.Proxy._score_batch))
    url, proxy = start(max_body_bytes=16 << 20)
    assert post(url, {"model": "rivet", "messages": MESSAGES}, session="small").status_code == 200
    huge = [{"role": "user", "content": TASK + " " + "x" * 7_500_000}]
    assert post(url, {"model": "rivet", "messages": huge}, session="huge").status_code == 200
    assert on_loop == {"read_body": [True, False], "read_request": [True, False], "score": [True, False]}


def test_a_body_that_is_not_utf8_is_400(start):
    url, _ = start()
    reply = post(url, b'{"model": "rivet", "messages": [{"role": "user", "content": "\xff\xfe"}]}')
    assert reply.status_code == 400 and "not UTF-8" in error_message(reply)


def test_a_body_over_the_limit_is_413_whether_declared_or_streamed(start):
    url, proxy = start(max_body_bytes=10_000)
    big = {"model": "rivet", "messages": [{"role": "user", "content": "x" * 20_000}]}
    declared = post(url, big)
    assert declared.status_code == 413 and "max_body_bytes" in error_message(declared)

    def chunks():
        yield json.dumps(big).encode()
    streamed = httpx.post(f"{url}/v1/chat/completions", content=chunks(),  # chunked: no Content-Length to check
                          headers={"content-type": "application/json"})
    assert streamed.status_code == 413 and proxy.recorder.open == {}


@pytest.mark.parametrize("body, why", [('{"outcome": 1, "outcome": 0}', "duplicate key"),
                                       ('{"outcome": NaN}', "NaN"), ('{"outcome": 2}', "outcome")])
def test_a_hostile_outcome_is_400_and_the_episode_stays_open(start, body, why):
    url, proxy = start()
    assert post(url, {"model": "rivet", "messages": MESSAGES}).status_code == 200
    reply = httpx.post(f"{url}/v1/episodes/s/outcome", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 400 and why in error_message(reply) and "s" in proxy.recorder.open


# -------------------------------------------------------------------------------------------- 8. security


def test_with_a_token_configured_chat_outcomes_and_models_need_it(start):
    url, proxy = start(auth_token_env="RIVET_PROXY_TOKEN")
    right = {"authorization": f"Bearer {TOKEN}"}
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": TOKEN}):
        reply = post(url, {"model": "rivet", "messages": MESSAGES}, headers=headers)
        assert reply.status_code == 401 and "bearer token" in error_message(reply)
        assert httpx.get(f"{url}/v1/models", headers=headers).status_code == 401
    assert proxy.recorder.open == {}
    assert post(url, {"model": "rivet", "messages": MESSAGES}, headers=right).status_code == 200
    assert close(url, "s").status_code == 401 and "s" in proxy.recorder.open
    assert close(url, "s", headers=right).status_code == 200
    assert httpx.get(f"{url}/v1/models", headers=right).status_code == 200
    assert httpx.get(f"{url}/healthz").status_code == 200   # open, and it shows no secrets


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          None])
def test_a_body_not_sent_as_json_is_415(start, content_type):
    url, proxy = start()
    headers = {"x-rivet-session": "s"} | ({"content-type": content_type} if content_type else {})
    reply = httpx.post(f"{url}/v1/chat/completions", headers=headers,
                       content=json.dumps({"model": "rivet", "messages": MESSAGES}))
    assert reply.status_code == 415 and "application/json" in error_message(reply) and proxy.recorder.open == {}
    outcome = httpx.post(f"{url}/v1/episodes/s/outcome", content='{"outcome": 1}', headers=headers)
    assert outcome.status_code == 415


def test_a_cross_site_origin_is_refused_and_a_listed_one_served(start):
    url, proxy = start(allowed_origins=("https://app.example",))
    foreign = post(url, {"model": "rivet", "messages": MESSAGES}, headers={"origin": "https://evil.example"})
    assert foreign.status_code == 403 and "evil.example" in error_message(foreign) and proxy.recorder.open == {}
    assert close(url, "s", headers={"origin": "https://evil.example"}).status_code == 403
    listed = post(url, {"model": "rivet", "messages": MESSAGES}, headers={"origin": "https://app.example"})
    assert listed.status_code == 200
