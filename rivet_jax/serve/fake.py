"""A stand-in OpenAI-compatible upstream, and a thread serving any ASGI app on loopback: for the proxy's tests, its
benchmark and a dry run of `launch.serve` without API keys (`python -m rivet_jax.serve.fake NAME PORT`).

A fake upstream answers deterministically per model: `<model> answer <k>` on the k-th call of a conversation (k =
the assistant messages it already has), or, when the last message asks for a tool, one call of `lookup`. It
reports usage (prompt tokens 10 per message, completion 7) and can be told to fail (HTTP 500), hang, or take
`latency_s` seconds to answer (the `mode` dict, read per request). Like a provider's prompt cache, it reports as
cached (`usage.prompt_tokens_details.cached_tokens`) the longest run of leading messages it was already sent in one
earlier request, short of the last message: the same model's previous call in a conversation, never another's.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

COMPLETION_TOKENS = 7


def answer(model: str, messages: list[dict]) -> dict:
    """The assistant message the fake upstream `model` gives to `messages`."""
    k = sum(m["role"] == "assistant" for m in messages)
    last = messages[-1].get("content") or ""
    if "tool" in last:
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{k}", "type": "function", "function": {"name": "lookup", "arguments": '{"q": 1}'}}]}
    return {"role": "assistant", "content": f"{model} answer {k}"}


def usage(messages: list[dict], cached_messages: int = 0) -> dict:
    return {"prompt_tokens": 10 * len(messages), "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": 10 * len(messages) + COMPLETION_TOKENS,
            "prompt_tokens_details": {"cached_tokens": 10 * cached_messages}}


class PromptCache:
    """The prefixes of the message lists an upstream was sent; `cached(messages)`: how many leading messages of a new
    request one earlier request began with (at most all but the last), remembering the new one's prefixes."""

    def __init__(self):
        self.prefixes: set[int] = set()

    def cached(self, messages: list[dict]) -> int:
        running, prefixes = hashlib.sha256(), []
        for m in messages:
            running.update(json.dumps(m, sort_keys=True).encode() + b"\0")
            prefixes.append(running.copy().hexdigest())
        shared = max((k for k in range(1, len(messages)) if prefixes[k - 1] in self.prefixes), default=0)
        self.prefixes.update(prefixes)
        return shared


def fake_upstream(model: str, mode: dict) -> Starlette:
    """`mode`: {"fail": bool, "hang": bool}, read per request; `mode["calls"]` counts the requests."""
    cache = PromptCache()

    async def chat(request: Request):
        mode["calls"] = mode.get("calls", 0) + 1
        body = json.loads(await request.body())
        if mode.get("fail"):
            return JSONResponse({"error": {"message": "upstream down"}}, status_code=500)
        if mode.get("hang"):
            await asyncio.sleep(30)
        if mode.get("latency_s"):   # an LLM's time to answer
            await asyncio.sleep(mode["latency_s"])
        if body.get("model") != model:
            return JSONResponse({"error": {"message": f"this upstream serves {model!r}, not {body.get('model')!r}"}},
                                status_code=400)
        message = answer(model, body["messages"])
        billed = usage(body["messages"], cache.cached(body["messages"]))
        if not body.get("stream"):
            return JSONResponse({"id": "c1", "object": "chat.completion", "created": 1, "model": model,
                                 "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                                 "usage": billed})
        return StreamingResponse(_stream(model, message, body, billed), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


async def _stream(model: str, message: dict, body: dict, billed: dict):
    def event(delta: dict | None, usage_: dict | None = None) -> bytes:
        chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model,
                 "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": None}]}
        if usage_ is not None:
            chunk["usage"] = usage_
        return f"data: {json.dumps(chunk)}\n\n".encode()

    yield event({"role": "assistant", "content": ""})
    if message.get("tool_calls"):
        call = message["tool_calls"][0]
        yield event({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                                     "function": {"name": "lookup", "arguments": ""}}]})
        for piece in ('{"q"', ': 1}'):
            yield event({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
    else:
        words = message["content"].split(" ")
        for i, word in enumerate(words):
            yield event({"content": word + (" " if i + 1 < len(words) else "")})
    if (body.get("stream_options") or {}).get("include_usage"):
        yield event(None, billed)
    yield b"data: [DONE]\n\n"


def free_port() -> int:
    """A port free on 127.0.0.1 now (for a server started in another process)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerThread:
    """An ASGI app served by uvicorn on 127.0.0.1 (a free port) in a daemon thread; `url` once started."""

    def __init__(self, app):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                                    timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


if __name__ == "__main__":
    import sys

    name, port = sys.argv[1], int(sys.argv[2])
    print(f"fake upstream {name!r} on http://127.0.0.1:{port}/v1", flush=True)
    uvicorn.run(fake_upstream(name, {}), host="127.0.0.1", port=port, log_level="warning")
