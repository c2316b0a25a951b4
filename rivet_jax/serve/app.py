"""The routing proxy: an OpenAI-compatible HTTP server in front of the pool's endpoints (`launch.serve`).

    POST /v1/chat/completions              route, call, record (streamed or not; tool calls pass through)
    GET  /v1/models                        the router, as the one model clients name
    GET  /healthz                          backends up or down, open episodes
    POST /v1/episodes/{session}/outcome    {"outcome": y in [0, 1]} closes the session's episode

Per request: the conversation becomes the router's state (`conversation.read_request`, the training data's reading),
the session is the `session_header` header, else the `user` field, else a hash of the task; the candidates are the
served models that are not down, within the optional `x-rivet-candidates: a,b` header; Q_route ranks them
(`policy.choose`, epsilon-greedy); the first is called and, when it faults, the next (at most `max_attempts`). The
response goes back as the upstream sent it, with headers:

    x-rivet-model       the model that answered        x-rivet-scores   {"model": Q_route} of every candidate (JSON)
    x-rivet-margin      best minus runner-up Q_route   x-rivet-propensity  the answering model's probability
    x-rivet-session     the episode's session (URL-quoted)  x-rivet-turn  the turn's index in the conversation
    x-rivet-failed      the models that faulted first  x-rivet-routing-ms  request in -> first upstream call out

The served turn is recorded (`recorder.Recorder`) before the response is returned (streamed: when it ends).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import time
import urllib.parse
from collections.abc import AsyncIterator

import httpx
import ml_collections
import numpy as np
import uvicorn
from absl import logging
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rivet_jax.data.converters.common import tokens_and_cost
from rivet_jax.data.outcomes import check_outcome
from rivet_jax.data.schema import Turn
from rivet_jax.data.validation import DataError, Where
from rivet_jax.router import Router
from rivet_jax.serve.conversation import Conversation, RequestError, read_request, session_id
from rivet_jax.serve.policy import Choice, candidate_names, choose
from rivet_jax.serve.recorder import NoOpenEpisodeError, Recorder
from rivet_jax.serve.upstream import Backend, Health, Reply, UpstreamFault, complete, open_stream, response_text

__all__ = ["Proxy", "make_app", "serve"]

CANDIDATES_HEADER = "x-rivet-candidates"
_CHARS_PER_TOKEN = 4  # the usual rule of thumb, for a backend that reports no usage


@dataclasses.dataclass
class Proxy:
    """Everything a request needs; one per server."""

    router: Router
    backends: dict[str, Backend]     # pool order
    recorder: Recorder
    config: ml_collections.ConfigDict
    health: Health = dataclasses.field(init=False)
    rng: np.random.Generator = dataclasses.field(init=False)

    def __post_init__(self):
        self.health = Health(list(self.backends), self.config.cooloff_s)
        self.rng = np.random.default_rng(self.config.seed)
        self._pending: list[tuple[Conversation, list[str], asyncio.Future]] = []
        self._draining = False
        # The hashing encoder holds the GIL for its ~1 ms, so a thread would add a handoff (~1 ms measured) and
        # overlap nothing; a neural encoder's tens of ms would stall every other request's I/O on the event loop.
        mode = self.config.get("scoring", "auto")
        self._in_thread = mode == "thread" or (mode == "auto" and self.router.encoder.name != "hashing")

    async def scores(self, conversation: Conversation, candidates: list[str]) -> dict[str, float]:
        """Q_route of each candidate at this conversation's state.

        On the event loop (`config.scoring`), at once: nothing else runs meanwhile. In a thread, one scoring at a
        time (the neural encoders' tokenizers are not thread-safe, and on CPU concurrent scorings would only share
        the same cores), and the requests that arrive while one runs are scored together next, in one encoder pass
        and one network call."""
        if not self._in_thread:
            return self._score_batch([(conversation, candidates, None)])[0]
        future = asyncio.get_running_loop().create_future()
        self._pending.append((conversation, candidates, future))
        if not self._draining:
            self._draining = True
            asyncio.ensure_future(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    rows = await asyncio.to_thread(self._score_batch, batch)
                except Exception:  # noqa: BLE001 - one bad state must not fail the others: each alone
                    rows = [await asyncio.to_thread(self._score_one, item) for item in batch]
                for (_, _, future), row in zip(batch, rows):
                    if isinstance(row, BaseException):
                        future.set_exception(row)
                    else:
                        future.set_result(row)
        finally:
            self._draining = False

    def _score_batch(self, batch) -> list[dict[str, float]]:
        q = self.router.scores([(c.task, c.history) for c, _, _ in batch], [candidates for _, candidates, _ in batch])
        return [{name: float(row[self.router.pool.index(name)]) for name in candidates}
                for row, (_, candidates, _) in zip(q, batch)]

    def _score_one(self, item) -> dict[str, float] | BaseException:
        try:
            return self._score_batch([item])[0]
        except Exception as error:  # noqa: BLE001 - handed to the request it belongs to
            return error

    def warm_up(self, max_batch: int = 16) -> None:
        """Compiles the network, and a neural encoder at its longest inputs, for every padded batch size up to
        `max_batch` (rows are padded to powers of two), so that a burst of concurrent requests does not wait for
        XLA. Shorter inputs of a neural encoder still compile on first sight."""
        long_state = "warm up " * self.router.config.max_state_tokens
        size = 1
        while size <= max_batch:
            self.router.scores_from_embeddings(self.router.encoder.encode([long_state] * size))
            size *= 2

    def fault(self, name: str, why: str) -> None:
        """A backend failed a call: down for the cool-off."""
        logging.warning("backend %s faulted (%s); down for %g s", name, why, self.config.cooloff_s)
        self.health.mark_down(name, why)

    async def record(self, name: str, reply: Reply, conversation: Conversation, choice: Choice,
                     candidates: list[str], session: str, start: float) -> None:
        """Records the turn `name` served (its call began at perf_counter `start`), fsynced before returning."""
        turn = self.turn(name, reply, conversation, choice, candidates, time.perf_counter() - start)
        await asyncio.to_thread(self.recorder.record, session, conversation.task, len(conversation.history), turn)

    def turn(self, name: str, reply: Reply, conversation: Conversation, choice: Choice, candidates: list[str],
             latency_s: float) -> Turn:
        """The served turn as the trajectory schema records it (feedback arrives with the next request)."""
        try:
            text = response_text(reply.message)
        except DataError:  # e.g. a tool call streamed without an id: keep the content
            text = reply.message.get("content") or ""
        card = self.router.pool.cards[self.router.pool.index(name)]
        try:
            prompt_tokens, completion_tokens, cost = tokens_and_cost(reply.usage, card, Where(f"<{name}>", None),
                                                                     "usage")
        except DataError as error:
            logging.warning("%s; tokens estimated at %d characters per token", error, _CHARS_PER_TOKEN)
            prompt_chars = len(json.dumps(conversation.body.get("messages"), ensure_ascii=False))
            prompt_tokens, completion_tokens = prompt_chars // _CHARS_PER_TOKEN, len(text) // _CHARS_PER_TOKEN
            cost = ((card.price_in_per_mtok or 0.0) * prompt_tokens +
                    (card.price_out_per_mtok or 0.0) * completion_tokens) / 1e6
        served_as_drawn = name == choice.order[0]
        return Turn(model=name, response=text, feedback="", prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens, cost=cost,
                    propensity=choice.propensity if served_as_drawn else None, available=tuple(candidates),
                    latency_s=round(latency_s, 6))


def make_app(proxy: Proxy) -> Starlette:
    """The ASGI app (run it with uvicorn; `launch.serve` does)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        timeout = httpx.Timeout(proxy.config.timeout_s, connect=proxy.config.connect_timeout_s)
        app.state.client = httpx.AsyncClient(timeout=timeout)
        expiry = asyncio.create_task(_expire_forever(proxy))
        try:
            yield
        finally:
            expiry.cancel()
            await app.state.client.aclose()
            proxy.recorder.close_files()

    routes = [Route("/v1/chat/completions", _chat_completions, methods=["POST"]),
              Route("/v1/models", _models, methods=["GET"]),
              Route("/healthz", _healthz, methods=["GET"]),
              Route("/v1/episodes/{session:path}/outcome", _outcome, methods=["POST"])]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={Exception: _internal_error})
    app.state.proxy = proxy
    return app


def serve(proxy: Proxy) -> None:
    """Serves the proxy on `config.host:config.port` until interrupted (uvicorn, one process: the recorder is the one
    writer of its files)."""
    proxy.warm_up()
    uvicorn.run(make_app(proxy), host=proxy.config.host, port=proxy.config.port, log_level="warning")


async def _chat_completions(request: Request) -> Response:
    received = time.perf_counter()
    proxy: Proxy = request.app.state.proxy
    try:
        conversation = read_request(await _json(request))
        requested = _requested(request.headers.get(CANDIDATES_HEADER), proxy)
    except RequestError as error:
        return _error(400, str(error))
    session = session_id(conversation, request.headers.get(proxy.config.session_header))
    # The feedback this request carries is logged (an fsync) while the router scores: it only has to be on disk
    # before this request's own turn is recorded, which awaits it.
    observed = asyncio.ensure_future(asyncio.to_thread(proxy.recorder.observe, session, conversation.task,
                                                       conversation.history))
    try:
        return await _route_and_call(request, proxy, conversation, session, requested, received, observed)
    finally:
        await observed


async def _route_and_call(request: Request, proxy: Proxy, conversation: Conversation, session: str,
                          requested: list[str] | None, received: float, observed: asyncio.Future) -> Response:
    candidates = candidate_names(list(proxy.backends), proxy.health.down(), requested)
    if not candidates:
        return _error(503, f"no candidate model is up (of {requested or list(proxy.backends)}); down: "
                           f"{sorted(proxy.health.down())}", "service_unavailable")
    choice = choose(await proxy.scores(conversation, candidates), proxy.config.epsilon, proxy.rng)
    failed: list[str] = []
    for name in choice.order[:proxy.config.max_attempts]:
        routing_ms = (time.perf_counter() - received) * 1e3
        start = time.perf_counter()
        call = open_stream if conversation.stream else complete
        try:
            reply = await call(request.app.state.client, proxy.backends[name], conversation.body)
        except UpstreamFault as fault:
            proxy.fault(name, str(fault))
            failed.append(name)
            continue
        headers = _headers(choice, name, session, len(conversation.history), failed, routing_ms)
        if reply.status != 200:  # the request's own fault: passed on, not recorded
            return Response(reply.body, status_code=reply.status, headers=headers, media_type="application/json")
        await observed
        served = functools.partial(proxy.record, name, reply, conversation, choice, candidates, session, start)
        if conversation.stream:
            return StreamingResponse(_record_when_done(reply, name, proxy, served), headers=headers,
                                     media_type="text/event-stream")
        await served()
        return Response(reply.body, status_code=200, headers=headers, media_type="application/json")
    return _error(502, "every candidate tried failed: " + "; ".join(
        f"{name}: {proxy.health.last_fault.get(name)}" for name in failed), "upstream_error")


async def _record_when_done(reply: Reply, name: str, proxy: Proxy, record) -> AsyncIterator[bytes]:
    """The upstream's events, passed on; the last one held back until the turn is recorded (`record()`), so that a
    client that has read the whole stream finds its turn recorded, as with a plain response."""
    held = None
    try:
        async for event in reply.events:
            if held is not None:
                yield held
            held = event
    except httpx.HTTPError as error:  # broken mid-stream: the client saw part of a response; nothing is recorded
        proxy.fault(name, f"stream broken: {type(error).__name__} {error}")
        return
    await record()
    if held is not None:
        yield held


async def _models(request: Request) -> Response:
    proxy: Proxy = request.app.state.proxy
    return JSONResponse({"object": "list", "data": [
        {"id": proxy.config.model_id, "object": "model", "created": 0, "owned_by": "rivet",
         "candidates": list(proxy.backends)}]})


async def _healthz(request: Request) -> Response:
    proxy: Proxy = request.app.state.proxy
    report = proxy.health.report()
    up = any(state["up"] for state in report.values())
    return JSONResponse({"status": "ok" if up else "no backend up", "backends": report,
                         "open_episodes": len(proxy.recorder.open)}, status_code=200 if up else 503)


async def _outcome(request: Request) -> Response:
    proxy: Proxy = request.app.state.proxy
    session = request.path_params["session"]
    try:
        body = await _json(request)
        if not isinstance(body, dict) or "outcome" not in body:
            raise RequestError('the body must be {"outcome": <a number in [0, 1]>}')
        outcome = check_outcome(body["outcome"], Where("<request>", None))
    except RequestError as error:
        return _error(400, str(error))
    except DataError as error:
        return _error(400, f"outcome: {error.why}")
    try:
        episode = await asyncio.to_thread(proxy.recorder.close, session, outcome)
    except NoOpenEpisodeError:
        return _error(404, f"no open episode for session {session!r}", "not_found_error")
    if episode is None:
        return JSONResponse({"session": session, "outcome": outcome, "recorded_in": "unfinished.jsonl",
                             "why": "the episode began mid-conversation, on turns this proxy did not serve"})
    return JSONResponse({"session": session, "episode_id": episode.episode_id, "turns": len(episode.turns),
                         "outcome": outcome, "recorded_in": "episodes.jsonl"})


async def _expire_forever(proxy: Proxy) -> None:
    """Closes idle episodes (outcome unknown) every so often, for as long as the server runs."""
    timeout = proxy.config.episode_timeout_s
    while True:
        await asyncio.sleep(min(60.0, max(timeout / 4, 0.05)))
        expired = await asyncio.to_thread(proxy.recorder.expire, timeout)
        if expired:
            logging.info("closed %d idle episodes without an outcome", len(expired))


async def _json(request: Request):
    try:
        return json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RequestError(f"the request body is not JSON: {error}") from None


def _requested(header: str | None, proxy: Proxy) -> list[str] | None:
    if header is None:
        return None
    names = [name.strip() for name in header.split(",") if name.strip()]
    unknown = [name for name in names if name not in proxy.backends]
    if unknown or not names:
        raise RequestError(f"{CANDIDATES_HEADER}: {unknown or 'no model named'}; the served models are "
                           f"{list(proxy.backends)}")
    return names


def _headers(choice: Choice, name: str, session: str, turn: int, failed: list[str], routing_ms: float) -> dict:
    # The session is the client's own string (a `user` field may hold any text); headers carry latin-1 only.
    headers = {"x-rivet-model": name, "x-rivet-session": urllib.parse.quote(session, safe=""),
               "x-rivet-turn": str(turn),
               "x-rivet-scores": json.dumps({m: round(v, 6) for m, v in choice.scores.items()}),
               "x-rivet-margin": "" if choice.margin is None else f"{choice.margin:.6f}",
               "x-rivet-propensity": f"{choice.propensity:.6f}" if name == choice.order[0] else "fallback",
               "x-rivet-routing-ms": f"{routing_ms:.3f}"}
    if failed:
        headers["x-rivet-failed"] = ",".join(failed)
    return headers


async def _internal_error(request: Request, error: Exception) -> Response:
    logging.exception("request failed: %s", error)
    return _error(500, f"the proxy failed on this request: {type(error).__name__}: {error}", "server_error")


def _error(status: int, message: str, kind: str = "invalid_request_error") -> Response:
    """An error in OpenAI's shape, so that clients raise their usual exception with the message."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}},
                        status_code=status)
