"""The pool's OpenAI-compatible endpoints: configuration, health, and one call (plain or streamed) to one of them.

A call is a *fault of the backend* when it cannot be connected to, times out, answers 401, 403, 404, 408, 429 or
5xx, or answers 200 with a body that is not a chat completion: the backend is marked down for `cooloff_s` and the
request goes to the next candidate. Any other 4xx is the request's own fault (a prompt too long, a bad parameter),
returned to the client as the upstream sent it, and not retried elsewhere.

A streamed call counts as started only once its first event has arrived, so a backend that accepts the connection
and then hangs is passed over like one that refuses it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import httpx

from rivet_jax.config_checks import ConfigError
from rivet_jax.data.converters.openai_chat import routing_state
from rivet_jax.data.model_pool import ModelPool

__all__ = ["Backend", "BackendConfigError", "backends_from_config", "Health", "UpstreamFault", "Reply",
           "complete", "open_stream", "response_text"]

_FAULT_STATUSES = {401, 403, 404, 408, 429}


class BackendConfigError(ConfigError):
    """The configured backends cannot serve the router's pool (refused at start, one line, as any ConfigError)."""


class UpstreamFault(Exception):
    """A backend failed a call (module docstring): it is marked down and the next candidate is tried."""


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
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        return {"Authorization": f"Bearer {key}"} if key else {}


def backends_from_config(backends: Mapping[str, Mapping[str, Any]], pool: ModelPool) -> dict[str, Backend]:
    """The configured backends, in pool order; BackendConfigError for a name outside the pool, a missing field or
    an API-key variable that is not set. Pool models without a backend are simply never candidates."""
    if not backends:
        raise BackendConfigError(f"no backends configured: give config.backends.<pool model> = {{base_url, model, "
                                 f"api_key_env}} for some of {list(pool.names)}")
    unknown = [name for name in backends if name not in pool]
    if unknown:
        raise BackendConfigError(f"backends {unknown} are not models of the router's pool {list(pool.names)}")
    out = {}
    for name in pool.names:
        if name not in backends:
            continue
        spec = dict(backends[name])
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


async def complete(client: httpx.AsyncClient, backend: Backend, body: dict) -> Reply:
    """One non-streamed call; UpstreamFault on a fault of the backend."""
    try:
        response = await client.post(backend.url, json={**body, "model": backend.model}, headers=backend.headers())
    except httpx.HTTPError as error:
        raise UpstreamFault(f"{type(error).__name__}: {error}") from None
    _check_status(response.status_code, response.content)
    if response.status_code != 200:
        return Reply(response.status_code, body=response.content)
    try:
        data = response.json()
        message = data["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise UpstreamFault(f"HTTP 200 but not a chat completion: {response.content[:200]!r}") from None
    return Reply(200, body=response.content, message=message, usage=data.get("usage"))


async def open_stream(client: httpx.AsyncClient, backend: Backend, body: dict) -> Reply:
    """A streamed call, started (its first event received); UpstreamFault if it fails before that.

    The upstream is asked for usage (`stream_options.include_usage`) so that the turn's tokens are known; the
    usage-only chunk is passed on only when the client asked for it too."""
    client_wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    request = client.build_request("POST", backend.url, headers=backend.headers(), json={
        **body, "model": backend.model, "stream_options": {**(body.get("stream_options") or {}),
                                                           "include_usage": True}})
    try:
        response = await client.send(request, stream=True)
    except httpx.HTTPError as error:
        raise UpstreamFault(f"{type(error).__name__}: {error}") from None
    if response.status_code != 200:
        content = await response.aread()
        await response.aclose()
        _check_status(response.status_code, content)
        return Reply(response.status_code, body=content)
    reply = Reply(200, message={"role": "assistant", "content": None}, usage=None)
    events = _events(response)
    try:
        first = await anext(events)
    except (httpx.HTTPError, StopAsyncIteration) as error:
        await response.aclose()
        raise UpstreamFault(f"the stream ended before its first event: {type(error).__name__} {error}") from None
    reply.events = _forward(first, events, reply, client_wants_usage, response)
    return reply


def response_text(message: Mapping[str, Any]) -> str:
    """An assistant message's response as the training data writes it (content, then one line per tool call)."""
    kept = {key: message[key] for key in ("content", "tool_calls") if message.get(key) is not None}
    return routing_state([{"role": "user", "content": ""}, {"role": "assistant", **kept}])[1][0]["response"]


def _check_status(status: int, content: bytes) -> None:
    if status in _FAULT_STATUSES or status >= 500:
        raise UpstreamFault(f"HTTP {status}: {content[:200].decode('utf-8', 'replace')}")


async def _events(response: httpx.Response) -> AsyncIterator[list[str]]:
    """The SSE events of a streamed response, each as its lines."""
    lines: list[str] = []
    async for line in response.aiter_lines():
        if line:
            lines.append(line)
        elif lines:
            yield lines
            lines = []
    if lines:
        yield lines


async def _forward(first: list[str], events: AsyncIterator[list[str]], reply: Reply, client_wants_usage: bool,
                   response: httpx.Response) -> AsyncIterator[bytes]:
    """The events as bytes for the client, each read on the way into `reply` (the message and the usage)."""
    calls: dict[int, dict] = {}

    async def all_events():
        yield first
        async for event in events:
            yield event

    try:
        async for lines in all_events():
            chunk = _chunk(lines)
            if chunk is not None:
                if chunk.get("usage"):
                    reply.usage = chunk["usage"]
                _read_delta(chunk, reply.message, calls)
                if not chunk.get("choices") and chunk.get("usage") and not client_wants_usage:
                    continue
            yield ("\n".join(lines) + "\n\n").encode("utf-8")
    finally:
        await response.aclose()
        if calls:
            reply.message["tool_calls"] = [calls[i] for i in sorted(calls)]


def _chunk(lines: list[str]) -> dict | None:
    data = "\n".join(line[5:].lstrip() for line in lines if line.startswith("data:"))
    if not data or data == "[DONE]":
        return None
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        return None
    return chunk if isinstance(chunk, dict) else None


def _read_delta(chunk: dict, message: dict, calls: dict[int, dict]) -> None:
    """Adds a chunk's delta (content pieces, tool-call pieces by index) to the message being assembled."""
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content"):
            message["content"] = (message["content"] or "") + delta["content"]
        for piece in delta.get("tool_calls") or []:
            call = calls.setdefault(piece.get("index", 0), {"id": "", "type": "function",
                                                            "function": {"name": "", "arguments": ""}})
            call["id"] = piece.get("id") or call["id"]
            function = piece.get("function") or {}
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""
