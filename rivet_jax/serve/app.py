"""The routing proxy: an OpenAI-compatible HTTP server in front of the pool's endpoints (`launch.serve`).

    POST /v1/chat/completions              route, call, record (streamed or not; tool calls pass through)
    GET  /v1/models                        the router, as the one model clients name
    GET  /healthz                          backends up or down, open episodes, the router's version, exploration
    POST /v1/episodes/{session}/outcome    {"outcome": y in [0, 1]} closes the session's episode
    POST /v1/admin/reload                  load the workdir's deployed router now (hot swap), if it changed

Per request: the conversation becomes the router's state (`conversation.read_request`, the training data's reading),
the session is the `session_header` header, else the `user` field, else a hash of the task keyed by the proxy's secret (then the open episode
whose served turns the history repeats, else a new one: two agents that start alike are two episodes, the
`x-rivet-session` header names each); the candidates are the
served models that are not down, within the optional `x-rivet-candidates: a,b` header; Q_route ranks them
(`policy.Budget.choose`: greedy, or exploring within the budget); the first is called and, when it faults, the next (at most `max_attempts`). The
response goes back as the upstream sent it, with headers:

    x-rivet-model       the model that answered        x-rivet-scores   {"model": Q_route} of every candidate (JSON)
    x-rivet-margin      best minus runner-up Q_route   x-rivet-propensity  the answering model's probability
    x-rivet-session     the episode's session (URL-quoted)  x-rivet-turn  the turn's index in the conversation
    x-rivet-failed      the models that faulted first  x-rivet-routing-ms  request in -> first upstream call out
    x-rivet-lambda      the cost weight it routed for: the request's own `x-rivet-lambda` header (a number >= 0; a
                        lambda-conditioned router takes any, a fixed-lambda one only its own: else a 400), else
                        `config.lam`, else the router's reward.lam

The served turn is recorded (`recorder.Recorder`) before the response is returned (streamed: when it ends), with
its propensity, the version of the router that chose it and the lambda it chose for. A session serves one request at a time (`Sessions`):
a second waits for the first (then, the same turn asked again, it replaces it: recorded once), an outcome waits for
the turn being served, and a wait longer than `deadline_s` is a 409.

Hot swap: serving a workdir's deployed choice (`router_stage` ''), the proxy checks `<workdir>/deploy.json` every
`reload_every_s` (and on `POST /v1/admin/reload`, authenticated as chat is); when its content changed it loads the
new router in a thread, warms it up and swaps it in between requests. A request is scored and recorded with the
router it started with, so an open episode carries on, its turns recording the version that chose each. A
deployment that fails to load (or lacks a served model) keeps the old router; the log and /healthz say why.

What is refused, and how (nothing is routed or recorded; the answer is OpenAI's error shape):

    401  `config.auth_token_env` names a variable holding a token, and the request lacks `Authorization: Bearer` it
         (chat, outcomes and models; /healthz stays open for load balancers and shows only redacted faults)
    403  a browser's cross-site request: an `Origin` header outside `config.allowed_origins`
    415  a body that is not `Content-Type: application/json` (a browser sends text/plain cross-site without asking)
    413  a body over `config.max_body_bytes`
    400  not JSON, NaN or Infinity, nesting deeper than `MAX_DEPTH`, a lone surrogate, a repeated key, a session id
         with control characters or over `MAX_SESSION_CHARS`, or anything `conversation.read_request` refuses
    503  the log cannot be written (a full disk): the turn is not served, nothing is lost, retry later
    502  every candidate tried faulted (errors redacted); a started stream that faults ends with an error event

An upstream reply that is not a servable chat completion, or that the recorder would not read back, is the
backend's fault: it is marked down and the next candidate is tried.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable

import httpx
import uvicorn
from absl import logging
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rivet_jax.data.outcomes import check_outcome
from rivet_jax.data.validation import DataError, Where
from rivet_jax.serve.conversation import (Conversation, NotJson, RequestError, TooLarge, checked_text, read_body,
                                          read_request, session_id)
from rivet_jax.serve.journal import StorageError
from rivet_jax.serve.policy import Choice, candidate_names
from rivet_jax.serve.proxy import Proxy, error_response
from rivet_jax.serve.recorder import NoOpenEpisodeError, UnrecordableTurn
from rivet_jax.serve.upstream import (Reply, StreamFault, UpstreamFault, complete, open_stream, read_at_most,
                                      redact)

__all__ = ["make_app", "serve"]

CANDIDATES_HEADER = "x-rivet-candidates"
LAMBDA_HEADER = "x-rivet-lambda"       # the cost weight this request routes for (else config.lam, else the router's)
FAMILY_HEADER = "x-rivet-task-family"   # the task family of the episode a request opens (else config.task_family)
INLINE_BYTES = 256 << 10   # bodies up to this are parsed and scored on the event loop; larger ones in a thread


def make_app(proxy: Proxy) -> Starlette:
    """The ASGI app (run it with uvicorn; `launch.serve` does)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        timeout = httpx.Timeout(proxy.config.timeout_s, connect=proxy.config.connect_timeout_s)
        app.state.client = httpx.AsyncClient(timeout=timeout)
        expiry = asyncio.create_task(_expire_forever(proxy))
        watch = asyncio.create_task(_watch_forever(proxy))
        try:
            yield
        finally:
            expiry.cancel()
            watch.cancel()
            await app.state.client.aclose()
            proxy.recorder.close_files()

    routes = [Route("/v1/chat/completions", _chat_completions, methods=["POST"]),
              Route("/v1/models", _models, methods=["GET"]),
              Route("/healthz", _healthz, methods=["GET"]),
              Route("/v1/episodes/{session:path}/outcome", _outcome, methods=["POST"]),
              Route("/v1/admin/reload", _reload, methods=["POST"])]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={StorageError: _storage_error, Exception: _internal_error})
    app.state.proxy = proxy
    return app


def serve(proxy: Proxy) -> None:
    """Serves the proxy on `config.host:config.port` until interrupted (uvicorn, one process: the recorder is the one
    writer of its files)."""
    proxy.warm_up()
    uvicorn.run(make_app(proxy), host=proxy.config.host, port=proxy.config.port, log_level="warning")


def _text_header(request: Request, name: str) -> str | None:
    """A header's value as text: HTTP carries bytes, which Starlette decodes as Latin-1; clients send UTF-8 (a
    session id 'café' arrives as 'cafÃ©' otherwise). Bytes that are not UTF-8 are a RequestError."""
    value = request.headers.get(name)
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise RequestError(f"the {name} header is not UTF-8") from None


async def _chat_completions(request: Request) -> Response:
    received = time.perf_counter()
    proxy: Proxy = request.app.state.proxy
    if (refused := proxy.refused(request)) is not None:
        return refused
    try:
        body, size = await _json(request, proxy)
        conversation = read_request(body) if size <= INLINE_BYTES else await asyncio.to_thread(read_request, body)
        requested = _requested(request.headers.get(CANDIDATES_HEADER), proxy)
        given = _text_header(request, proxy.config.session_header) or conversation.user
        session = checked_text(session_id(conversation, given, proxy.session_key), "session id")
        family = _text_header(request, FAMILY_HEADER) or proxy.config.get("task_family") or None
        if family is not None:
            family = checked_text(family, "task family")
        lam = _requested_lambda(request.headers.get(LAMBDA_HEADER), proxy)
    except RequestError as error:  # 400, or 413 / 415 for a body too large / not JSON
        return error_response(error.status, str(error))
    release = await proxy.sessions.hold(session, proxy.config.deadline_s)
    if release is None:
        return error_response(409, f"a turn of session {session!r} has been in flight for {proxy.config.deadline_s:g} s "
                           f"(config.deadline_s): try again once it ends", "conflict")
    streaming = False
    try:
        if not given:  # the session is the task's hash: the open episode this history continues, else a fresh one
            session = proxy.recorder.resolve(session, conversation.task, conversation.history)
        # The feedback this request carries is logged (an fsync) while the router scores: it only has to be on
        # disk before this request's own turn is recorded, which awaits it.
        observed = asyncio.ensure_future(asyncio.to_thread(proxy.recorder.observe, session, conversation.task,
                                                           conversation.history))
        try:
            response = await _route_and_call(request, proxy, conversation, session, family, requested, received,
                                             observed, release, lam)
            streaming = isinstance(response, _SessionStream)
            return response
        finally:
            await observed
    finally:
        if not streaming:   # a stream lets the session go once its turn is recorded (`_record_when_done`)
            release()


def _with_last_call(proxy: Proxy, conversation: Conversation, session: str) -> Conversation:
    """The conversation as a cache-aware router scores it: its last turn with the model this proxy served it with
    and that call's prompt tokens (whose prompt cache holds what; `data.prompt_cache`). A client's history has
    neither; the recorder does, for the turns it served."""
    if not conversation.history or not proxy.served.current[0].cache_aware:
        return conversation
    last = proxy.recorder.last_call(session, len(conversation.history))
    if last is None:
        return conversation
    model, prompt_tokens = last
    history = conversation.history[:-1] + [{**conversation.history[-1], "model": model, "prompt_tokens": prompt_tokens}]
    return dataclasses.replace(conversation, history=history)


async def _route_and_call(request: Request, proxy: Proxy, conversation: Conversation, session: str,
                          family: str | None, requested: list[str] | None, received: float,
                          observed: asyncio.Future, release: Callable[[], None], lam: float | None) -> Response:
    candidates = candidate_names(list(proxy.backends), proxy.health.down(), requested)
    if not candidates:
        return error_response(503, f"no candidate model is up (of {requested or list(proxy.backends)}); down: "
                           f"{sorted(proxy.health.down())}", "service_unavailable")
    if family is None and conversation.history:   # a later turn without the header: the family its episode opened with
        family = proxy.recorder.family(session)
    scores, version, lam = await proxy.scores(_with_last_call(proxy, conversation, session), candidates, family, lam)
    choice = proxy.budget.choose(scores, proxy.rng)
    failed: list[str] = []
    for name in choice.order[:proxy.config.max_attempts]:
        routing_ms = (time.perf_counter() - received) * 1e3
        start = time.perf_counter()
        call = open_stream if conversation.stream else complete
        try:
            reply = await call(request.app.state.client, proxy.backends[name], conversation.body,
                               proxy.config.deadline_s)
        except UpstreamFault as fault:
            proxy.fault(name, str(fault))
            failed.append(name)
            continue
        headers = _headers(choice, name, session, len(conversation.history), failed, routing_ms, lam)
        if reply.status != 200:  # the request's own fault: passed on, not recorded
            return Response(reply.body, status_code=reply.status, headers=headers, media_type="application/json")
        await observed
        served = functools.partial(proxy.record, name, reply, conversation, choice, version, candidates, session,
                                   family, start, lam)
        if conversation.stream:
            return _SessionStream(_record_when_done(reply, name, proxy, served, release), release, headers=headers,
                                  media_type="text/event-stream")
        try:
            await served()
        except UnrecordableTurn as error:
            proxy.fault(name, str(error))
            failed.append(name)
            continue
        return Response(reply.body, status_code=200, headers=headers, media_type="application/json")
    return error_response(502, "every candidate tried failed: " + "; ".join(
        f"{name}: {proxy.health.last_fault.get(name)}" for name in failed), "upstream_error")


class _SessionStream(StreamingResponse):
    """A streamed turn that lets its session go however the response ends: recorded, failed, or the client gone
    before its first byte (then the body's generator never runs, and only this `finally` would free the session)."""

    def __init__(self, content, release: Callable[[], None], **kwargs):
        super().__init__(content, **kwargs)
        self._release = release

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


async def _record_when_done(reply: Reply, name: str, proxy: Proxy, record,
                            release: Callable[[], None]) -> AsyncIterator[bytes]:
    """The upstream's events, passed on; the last one held back until the turn is recorded (`record()`), so that a
    client that has read the whole stream finds its turn recorded, as with a plain response. A stream that faults,
    or a turn that cannot be recorded, ends with an error event instead (the client's SDK raises it): a client
    never takes a cut-short or unrecorded response for a whole one. The session is let go (`release`) once the
    turn is recorded or has failed."""
    try:
        held = None
        try:
            async for event in reply.events:
                if held is not None:
                    yield held
                held = event
            await record()
        except (StreamFault, UnrecordableTurn) as error:
            proxy.fault(name, str(error))
            yield _error_event(f"the response of {name} failed mid-stream: {redact(str(error))}", "upstream_error")
            return
        except StorageError as error:
            logging.warning("a streamed turn could not be recorded: %s", error)
            yield _error_event(_STORAGE_MESSAGE.format(error=error), "service_unavailable")
            return
        release()
        if held is not None:
            yield held
    finally:
        release()


def _error_event(message: str, kind: str) -> bytes:
    """An SSE event with an error in OpenAI's shape (what its SDKs raise when a stream carries one)."""
    return ("data: " + json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})
            + "\n\n").encode("utf-8")


async def _models(request: Request) -> Response:
    proxy: Proxy = request.app.state.proxy
    if (refused := proxy.refused(request)) is not None:
        return refused
    return JSONResponse({"object": "list", "data": [
        {"id": proxy.config.model_id, "object": "model", "created": 0, "owned_by": "rivet",
         "candidates": list(proxy.backends)}]})


async def _healthz(request: Request) -> Response:
    proxy: Proxy = request.app.state.proxy
    report = proxy.health.report()
    up = any(state["up"] for state in report.values())
    router = proxy.served.report()
    return JSONResponse({"status": "ok" if up else "no backend up", "backends": report,
                         "open_episodes": len(proxy.recorder.open), "router": router,
                         "exploration": proxy.budget.report(), "background": proxy.background},
                        status_code=200 if up else 503)


async def _reload(request: Request) -> Response:
    proxy: Proxy = request.app.state.proxy
    if (refused := proxy.refused(request)) is not None:
        return refused
    result = await asyncio.to_thread(proxy.served.reload)
    return JSONResponse(result, status_code=200 if result["error"] is None else 409)


async def _outcome(request: Request) -> Response:
    proxy: Proxy = request.app.state.proxy
    if (refused := proxy.refused(request)) is not None:
        return refused
    session = request.path_params["session"]
    try:
        body, _ = await _json(request, proxy)
        if not isinstance(body, dict) or "outcome" not in body:
            raise RequestError('the body must be {"outcome": <a number in [0, 1]>}')
        outcome = check_outcome(body["outcome"], Where("<request>", None))
    except RequestError as error:
        return error_response(error.status, str(error))
    except DataError as error:
        return error_response(400, f"outcome: {error.why}")
    # A turn being served is recorded first. Without a session id the client's turns are served under the task's
    # key, and a second agent that started alike is `key~2` (`Recorder.resolve`): its outcome waits on both.
    release = await proxy.sessions.hold_each([session.split("~", 1)[0], session], proxy.config.deadline_s)
    if release is None:
        return error_response(409, f"a turn of session {session!r} is still in flight: post the outcome once it ends",
                      "conflict")
    try:
        episode = await asyncio.to_thread(proxy.recorder.close, session, outcome)
    except NoOpenEpisodeError:
        return error_response(404, f"no open episode for session {session!r}", "not_found_error")
    finally:
        release()
    if episode is None:
        return JSONResponse({"session": session, "outcome": outcome, "recorded_in": "unfinished.jsonl",
                             "why": "the episode began mid-conversation, on turns this proxy did not serve"})
    return JSONResponse({"session": session, "episode_id": episode.episode_id, "turns": len(episode.turns),
                         "outcome": outcome, "recorded_in": "episodes.jsonl"})


async def _watch_forever(proxy: Proxy) -> None:
    """Swaps in a changed deployment (`ServedRouter.reload`) every `reload_every_s` (0: only on /v1/admin/reload)."""
    every = float(proxy.config.get("reload_every_s", 2.0))
    if not proxy.served.hot_swap or every <= 0:
        return

    async def watch():
        if proxy.served.changed():
            await asyncio.to_thread(proxy.served.reload)
    await _forever(proxy, "hot_swap_watch", every, watch)


async def _expire_forever(proxy: Proxy) -> None:
    """Closes idle episodes (outcome unknown) every so often, for as long as the server runs."""
    timeout = proxy.config.episode_timeout_s

    async def expire():
        expired = await asyncio.to_thread(proxy.recorder.expire, timeout)
        if expired:
            logging.info("closed %d idle episodes without an outcome", len(expired))
    await _forever(proxy, "expiry", min(60.0, max(timeout / 4, 0.05)), expire)


async def _forever(proxy: Proxy, name: str, every: float, step) -> None:
    """`step()` every `every` seconds for as long as the server runs; a step that fails (a full disk, say) is
    logged and shown in /healthz (`background`), and the next is tried as usual: the task never dies of it."""
    while True:
        await asyncio.sleep(every)
        try:
            await step()
        except Exception as error:  # noqa: BLE001 - a background task outlives any one failure
            why = redact(f"{type(error).__name__}: {error}")
            state = proxy.background.setdefault(name, {"failures": 0})
            state.update(failures=state["failures"] + 1, last_error=why, at=time.time())
            logging.warning("background task %s failed (%s); it runs again in %g s", name, why, every)
        else:
            proxy.background.get(name, {}).pop("last_error", None)


async def _json(request: Request, proxy: Proxy):
    """The request's JSON body, read within the limits of the module docstring, and its size in bytes."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise NotJson(f"the body must be sent as Content-Type: application/json, got {kind or 'none'!r}")
    limit = int(proxy.config.get("max_body_bytes", 8 << 20))
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the body is {declared} bytes, over the limit of {limit} (config.max_body_bytes)")
    data = await read_at_most(request.stream(), limit, TooLarge(
        f"the body is over the limit of {limit} bytes (config.max_body_bytes)"))
    # A large body is parsed in a thread: the event loop (every other request, /healthz) never waits on it.
    return (read_body(data) if len(data) <= INLINE_BYTES else await asyncio.to_thread(read_body, data)), len(data)


def _requested(header: str | None, proxy: Proxy) -> list[str] | None:
    if header is None:
        return None
    names = [name.strip() for name in header.split(",") if name.strip()]
    unknown = [name for name in names if name not in proxy.backends]
    if unknown or not names:
        raise RequestError(f"{CANDIDATES_HEADER}: {unknown or 'no model named'}; the served models are "
                           f"{list(proxy.backends)}")
    return names


def _requested_lambda(header: str | None, proxy: Proxy) -> float | None:
    """The cost weight a request routes for: its x-rivet-lambda header, else `config.lam` (None: the router's
    own), checked against the router served now (a fixed-lambda one routes only at its own)."""
    value = proxy.config.get("lam") if header is None else header
    if value is None:
        return None
    try:
        lam = float(value)
    except ValueError:
        raise RequestError(f"{LAMBDA_HEADER}: {header!r} is not a number (a cost weight >= 0)") from None
    try:
        proxy.served.current[0].at_lambda(lam)
    except ValueError as error:
        raise RequestError(f"{LAMBDA_HEADER}: {error}") from None
    return lam


def _headers(choice: Choice, name: str, session: str, turn: int, failed: list[str], routing_ms: float,
             lam: float) -> dict:
    # The session is the client's own string (a `user` field may hold any text); headers carry latin-1 only.
    headers = {"x-rivet-model": name, "x-rivet-session": urllib.parse.quote(session, safe=""),
               "x-rivet-turn": str(turn),
               "x-rivet-scores": json.dumps({m: round(v, 6) for m, v in choice.scores.items()}),
               "x-rivet-margin": "" if choice.margin is None else f"{choice.margin:.6f}",
               "x-rivet-propensity": f"{choice.propensity:.6f}" if name == choice.order[0] else "fallback",
               "x-rivet-routing-ms": f"{routing_ms:.3f}", LAMBDA_HEADER: f"{lam:g}"}
    if failed:
        headers["x-rivet-failed"] = ",".join(failed)
    return headers


_STORAGE_MESSAGE = ("the proxy cannot write its log ({error}): nothing of this request was recorded or changed; retry "
                    "when it has room")


async def _storage_error(request: Request, error: Exception) -> Response:
    logging.error("%s", error)
    return error_response(503, _STORAGE_MESSAGE.format(error=error), "service_unavailable")


async def _internal_error(request: Request, error: Exception) -> Response:
    logging.exception("request failed: %s", error)
    return error_response(500, f"the proxy failed on this request: {type(error).__name__}: {error}", "server_error")
