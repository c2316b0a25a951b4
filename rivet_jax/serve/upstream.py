"""The pool's OpenAI-compatible endpoints: configuration, health, and one call (plain or streamed) to one of them.

A call is a *fault of the backend* when it cannot be connected to, times out, answers 401, 403, 404, 408, 429 or
5xx, or answers 200 with a body that is not a chat completion: the backend is marked down for `cooloff_s` and the
request goes to the next candidate. Any other 4xx is the request's own fault (a prompt too long, a bad parameter),
returned to the client as the upstream sent it, and not retried elsewhere.

A streamed call counts as started only once its first event has arrived, so a backend that accepts the connection
and then hangs is passed over like one that refuses it. After that, a stream that breaks, stalls past the read
timeout, sends an event that is not a JSON chunk, or ends before its end (no `finish_reason`, no `[DONE]`) raises
`StreamFault` from its iteration: the client is told by an error event (app.py) and nothing is recorded.

A reply is a chat completion when its message is an object whose `content` is text or null and whose `tool_calls`
(if any) are objects with a `function`; anything else (content as a JSON object, an empty or non-JSON body, a body
over `max_bytes`) is the backend's fault. Error bodies are shown (logs, 502 answers, /healthz) only after
`redact`: the backend's own key and anything shaped like an API key or a bearer token are masked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import httpx

from rivet_jax.config_checks import ConfigError
from rivet_jax.data.converters.openai_chat import routing_state
from rivet_jax.data.model_pool import ModelPool

__all__ = ["Backend", "BackendConfigError", "backends_from_config", "Health", "UpstreamFault", "StreamFault", "Reply",
           "complete", "open_stream", "read_at_most", "response_text", "redact"]

_FAULT_STATUSES = {401, 403, 404, 408, 429}
MAX_REPLY_BYTES = 32 << 20   # a chat completion is far smaller; more is a faulty backend, not a reply to hold
# What an API key or a bearer token looks like in an error body that echoes it (OpenAI's sk-..., Anthropic's
# sk-ant-..., Google's AIza..., any "Bearer <token>" and long hex/base64 runs after "key").
_SECRET = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}|\b(sk|rk|pk)-[A-Za-z0-9_-]{8,}|\bAIza[0-9A-Za-z_-]{20,}"
                     r"|((?:api[_-]?key|key|token|secret)[\"']?\s*[:=]\s*[\"']?)[A-Za-z0-9._~+/=-]{12,}")


class BackendConfigError(ConfigError):
    """The configured backends cannot serve the router's pool (refused at start, one line, as any ConfigError)."""


class UpstreamFault(Exception):
    """A backend failed a call (module docstring): it is marked down and the next candidate is tried."""


class StreamFault(UpstreamFault):
    """A started stream failed (module docstring): the backend is marked down and the client gets an error event."""


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """`text` with each of `secrets` (the configured keys) and anything shaped like a key or token masked."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    return _SECRET.sub(lambda m: (m.group(1) or m.group(4) or "") + "[redacted]", text)


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str           # the pool model it serves
    base_url: str       # e.g. http://127.0.0.1:8001/v1 (the chat-completions URL is <base_url>/chat/completions)
    model: str          # the upstream model id sent in its requests
    api_key_env: str    # the environment variable holding its API key ("" for none); the key is never logged

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    def headers(self) -> dict[str, str]:
        key = self.key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def key(self) -> str:
        return os.environ.get(self.api_key_env, "") if self.api_key_env else ""


def backends_from_config(backends: Mapping[str, Mapping[str, Any]] | None, pool: ModelPool) -> dict[str, Backend]:
    """The configured backends ({pool model: {base_url, model, api_key_env}}), in pool order; BackendConfigError for
    a name outside the pool, a missing field or an API-key variable that is not set. Pool models without a backend
    are simply never candidates."""
    if not backends:
        raise BackendConfigError(f"no backends configured: give config.backends = {{<pool model>: {{base_url, model, "
                                 f"api_key_env}}}} for some of {list(pool.names)}")
    if not isinstance(backends, Mapping):
        raise BackendConfigError(f"config.backends must map pool models to {{base_url, model, api_key_env}}, got "
                                 f"{type(backends).__name__}")
    entries = [(str(name), dict(spec) if isinstance(spec, Mapping) else spec) for name, spec in backends.items()]
    names = [name for name, _ in entries]
    unknown = [name for name in names if name not in pool]
    if unknown:
        raise BackendConfigError(f"backends {unknown} are not models of the router's pool {list(pool.names)}")
    given = dict(entries)
    out = {}
    for name in pool.names:
        if name not in given:
            continue
        spec = given[name]
        if not isinstance(spec, dict):
            raise BackendConfigError(f"backend {name!r}: expected {{base_url, model, api_key_env}}, got {spec!r}")
        missing = [key for key in ("base_url", "model") if not spec.get(key)]
        extra = sorted(set(spec) - {"base_url", "model", "api_key_env"})
        if missing or extra:
            raise BackendConfigError(f"backend {name!r}: " + "; ".join(
                ([f"missing {', '.join(missing)}"] if missing else []) +
                ([f"unknown keys {extra} (expected base_url, model, api_key_env)"] if extra else [])))
        env = spec.get("api_key_env") or ""
        if env and env not in os.environ:
            raise BackendConfigError(f"backend {name!r}: the environment variable {env} (its API key) is not set")
        out[name] = Backend(name, str(spec["base_url"]), str(spec["model"]), env)
    return out


class Health:
    """Which backends are down, and until when: a backend that faulted sits out `cooloff_s` seconds."""

    def __init__(self, names: list[str], cooloff_s: float, clock: Callable[[], float] = time.monotonic):
        self.cooloff_s = cooloff_s
        self.clock = clock
        self._down_until = {name: float("-inf") for name in names}
        self.last_fault: dict[str, str] = {}

    def mark_down(self, name: str, why: str) -> None:
        self._down_until[name] = self.clock() + self.cooloff_s
        self.last_fault[name] = why

    def down(self) -> set[str]:
        now = self.clock()
        return {name for name, until in self._down_until.items() if until > now}

    def report(self) -> dict[str, dict]:
        now = self.clock()
        return {name: ({"up": True} if until <= now else
                       {"up": False, "seconds_left": round(until - now, 1), "fault": self.last_fault.get(name)})
                for name, until in self._down_until.items()}


@dataclasses.dataclass
class Reply:
    """An upstream answer on its way to the client. A plain one has `body`; a streamed one `events` (the SSE
    events to forward, each ending in a blank line), whose iteration fills `message` and `usage` as it goes."""

    status: int
    body: bytes | None = None
    events: AsyncIterator[bytes] | None = None
    message: dict | None = None           # the assistant message (role, content, tool_calls)
    usage: dict | None = None


async def complete(client: httpx.AsyncClient, backend: Backend, body: dict, deadline_s: float = math.inf) -> Reply:
    """One non-streamed call, whole within `deadline_s` (a reply trickled byte by byte resets the read timeout
    forever); UpstreamFault on a fault of the backend."""
    request = client.build_request("POST", backend.url, json={**body, "model": backend.model},
                                   headers=backend.headers())
    try:
        async with asyncio.timeout(None if math.isinf(deadline_s) else deadline_s):
            response = await client.send(request, stream=True)
            try:
                content = await read_at_most(response.aiter_bytes(), MAX_REPLY_BYTES, _reply_limit())
            finally:
                await response.aclose()
    except httpx.HTTPError as error:
        raise UpstreamFault(f"{type(error).__name__}: {error}") from None
    except TimeoutError:
        raise UpstreamFault(f"no whole reply within the call's deadline ({deadline_s:g} s)") from None
    _check_status(response.status_code, content, backend)
    if response.status_code != 200:
        return Reply(response.status_code, body=content)
    try:
        data = json.loads(content)
        message = data["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise UpstreamFault(f"HTTP 200 but not a chat completion: {_shown(content, backend)}") from None
    why = _not_a_message(message)
    if why:
        raise UpstreamFault(f"HTTP 200 but not a chat completion: {why}")
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
    return Reply(200, body=content, message=message, usage=usage)


async def read_at_most(chunks: AsyncIterator[bytes], max_bytes: int, too_large: Exception) -> bytes:
    """The bytes of `chunks` (a body as it arrives), raising `too_large` as soon as they pass `max_bytes`: a body
    is never held whole before its size is known."""
    parts, size = [], 0
    async for part in chunks:
        size += len(part)
        if size > max_bytes:
            raise too_large
        parts.append(part)
    return b"".join(parts)


def _reply_limit() -> UpstreamFault:
    return UpstreamFault(f"the reply is larger than {MAX_REPLY_BYTES} bytes")


def _not_a_message(message) -> str | None:
    """Why an assistant message is not one the proxy can serve and record, or None."""
    if not isinstance(message, dict):
        return f"the message is {type(message).__name__}, not an object"
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        return f"its content is {type(content).__name__}, not text"
    calls = message.get("tool_calls")
    if calls is not None and not (isinstance(calls, list) and all(
            isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls)):
        return "its tool_calls are not a list of calls with a function"
    if content is None and not calls and not isinstance(message.get("refusal"), str):
        return "it has no content, tool calls or refusal"
    return None


async def open_stream(client: httpx.AsyncClient, backend: Backend, body: dict, deadline_s: float = math.inf) -> Reply:
    """A streamed call, started (its first event received); UpstreamFault if it fails before that. The whole
    stream must end within `deadline_s` of the call (StreamFault after it started): an upstream sending keep-alive
    comments or a byte at a time never holds a turn open.

    The upstream is asked for usage (`stream_options.include_usage`) so that the turn's tokens are known; the
    usage-only chunk is passed on only when the client asked for it too."""
    deadline = asyncio.get_running_loop().time() + deadline_s
    client_wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    request = client.build_request("POST", backend.url, headers=backend.headers(), json={
        **body, "model": backend.model, "stream_options": {**(body.get("stream_options") or {}),
                                                           "include_usage": True}})
    try:
        response = await _before(deadline, client.send(request, stream=True))
    except httpx.HTTPError as error:
        raise UpstreamFault(f"{type(error).__name__}: {error}") from None
    except TimeoutError:
        raise UpstreamFault(f"no answer within the call's deadline ({deadline_s:g} s)") from None
    if response.status_code != 200:
        try:
            content = await read_at_most(response.aiter_bytes(), MAX_REPLY_BYTES, _reply_limit())
        except httpx.HTTPError as error:
            raise UpstreamFault(f"{type(error).__name__}: {error}") from None
        finally:
            await response.aclose()
        _check_status(response.status_code, content, backend)
        return Reply(response.status_code, body=content)
    reply = Reply(200, message={"role": "assistant", "content": None}, usage=None)
    events = _events(response)
    try:
        first = await _before(deadline, anext(events))
    except (httpx.HTTPError, StopAsyncIteration, TimeoutError) as error:
        await response.aclose()
        why = f"the call's deadline ({deadline_s:g} s) passed" if isinstance(error, TimeoutError) else \
            f"{type(error).__name__} {error}"
        raise UpstreamFault(f"the stream ended before its first event: {why}") from None
    if _chunk(first) is None:
        await response.aclose()
        raise UpstreamFault("the stream's first event is not a chat completion chunk: "
                            + ("an empty stream ([DONE] alone)" if _data(first) == "[DONE]" else repr(_data(first)[:200])))
    reply.events = _forward(first, events, reply, client_wants_usage, response, deadline, deadline_s)
    return reply


async def _before(deadline: float, awaitable):
    """`awaitable`'s result, or TimeoutError once the loop's clock passes `deadline`."""
    remaining = deadline - asyncio.get_running_loop().time()
    if remaining <= 0:
        raise TimeoutError
    return await asyncio.wait_for(awaitable, None if math.isinf(remaining) else remaining)


def response_text(message: Mapping[str, Any]) -> str:
    """An assistant message's response as the training data writes it (content, then one line per tool call)."""
    kept = {key: message[key] for key in ("content", "tool_calls") if message.get(key) is not None}
    return routing_state([{"role": "user", "content": ""}, {"role": "assistant", **kept}])[1][0]["response"]


def _check_status(status: int, content: bytes, backend: Backend) -> None:
    if status in _FAULT_STATUSES or status >= 500:
        raise UpstreamFault(f"HTTP {status}: {_shown(content, backend)}")


def _shown(content: bytes, backend: Backend) -> str:
    """The start of a body, as logs and answers may show it (redacted)."""
    return redact(content[:200].decode("utf-8", "replace"), (backend.key(),))


async def _events(response: httpx.Response) -> AsyncIterator[list[str]]:
    """The SSE events of a streamed response, each as its lines; comments (lines starting with ':', the keep-alive
    pings some gateways send, even before the first chunk) are dropped, as the SSE standard says."""
    lines: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith(":"):
            continue
        if line:
            lines.append(line)
        elif lines:
            yield lines
            lines = []
    if lines:
        yield lines


async def _forward(first: list[str], events: AsyncIterator[list[str]], reply: Reply, client_wants_usage: bool,
                   response: httpx.Response, deadline: float = math.inf,
                   deadline_s: float = math.inf) -> AsyncIterator[bytes]:
    """The events as bytes for the client, each read on the way into `reply` (the message and the usage);
    StreamFault when the stream breaks, carries a malformed event, ends before its end (module docstring), passes
    the call's `deadline`, or ends with nothing to serve (no content, tool call or refusal: a fault, as in a plain
    reply)."""
    calls: dict[int, dict] = {}
    finished = False

    async def all_events():
        yield first
        while True:
            try:
                event = await _before(deadline, anext(events))
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise StreamFault(f"the stream did not end within the call's deadline ({deadline_s:g} s)") from None
            yield event

    try:
        async for lines in all_events():
            data = _data(lines)
            if data == "[DONE]":
                finished = True
            elif data:
                chunk = _chunk(lines)
                if chunk is None:
                    raise StreamFault(f"a stream event is not a JSON chunk: {data[:200]!r}")
                if isinstance(chunk.get("usage"), dict):
                    reply.usage = chunk["usage"]
                finished |= _read_delta(chunk, reply.message, calls)
                if not chunk.get("choices") and chunk.get("usage") and not client_wants_usage:
                    continue
            yield ("\n".join(lines) + "\n\n").encode("utf-8")
        if not finished:
            raise StreamFault("the stream ended before its end (no finish_reason, no [DONE])")
        if calls:
            reply.message["tool_calls"] = [calls[i] for i in sorted(calls)]
        why = _not_a_message(reply.message)
        if why:
            raise StreamFault(f"the stream is not a chat completion: {why}")
    except httpx.HTTPError as error:
        raise StreamFault(f"the stream broke: {type(error).__name__} {error}") from None
    finally:
        await response.aclose()


def _data(lines: list[str]) -> str:
    return "\n".join(line[5:].lstrip() for line in lines if line.startswith("data:"))


def _chunk(lines: list[str]) -> dict | None:
    data = _data(lines)
    if not data or data == "[DONE]":
        return None
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        return None
    return chunk if isinstance(chunk, dict) else None


def _read_delta(chunk: dict, message: dict, calls: dict[int, dict]) -> bool:
    """Adds a chunk's delta (content pieces, tool-call pieces by index) to the message being assembled; whether a
    choice finished. StreamFault for a delta whose pieces are not text."""
    finished = False
    choices = chunk.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise StreamFault("a stream chunk's choices are not a list of objects")
    for choice in choices:
        finished |= bool(choice.get("finish_reason"))
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict) or not isinstance(delta.get("content") or "", str):
            raise StreamFault("a stream chunk's delta content is not text")
        if delta.get("content"):
            message["content"] = (message["content"] or "") + delta["content"]
        for piece in delta.get("tool_calls") or []:
            if not isinstance(piece, dict) or not isinstance(piece.get("function") or {}, dict):
                raise StreamFault("a stream chunk's tool call is not an object with a function")
            call = calls.setdefault(piece.get("index", 0), {"id": "", "type": "function",
                                                            "function": {"name": "", "arguments": ""}})
            call["id"] = piece.get("id") or call["id"]
            function = piece.get("function") or {}
            if not isinstance(function.get("name") or "", str) or not isinstance(function.get("arguments") or "", str):
                raise StreamFault("a stream chunk's tool call is not text")
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""
    return finished
