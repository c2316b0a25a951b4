"""A chat-completions request -> what the router reads: the task, the completed turns, the episode's session id.

The state is built by `data.converters.openai_chat.routing_state`, the very reading that converts logged
conversations for training, so the served router sees exactly the texts it was trained on. Requests as clients
send them carry more than logs do, and are first brought to that form (`converter_messages`):

- `content` given as a list of parts (`[{"type": "text", "text": ...}, {"type": "image_url", ...}]`): the text
  parts joined with a line break, any other part written as `[<type>]`;
- the `developer` role (OpenAI's newer name for system) is a system message;
- keys the routing state does not read (`name`, `refusal`, `annotations`, `audio`, ...) are dropped; a tool call
  keeps its `id`, `type` and `function` (`name`, `arguments`);
- several user messages before the first assistant message are one task, joined with a blank line.

Anything else malformed is a `RequestError` (HTTP 400) naming the message and field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rivet_jax.data.converters.openai_chat import content_text, routing_state
from rivet_jax.data.validation import DataError, Where, parse_json

__all__ = ["RequestError", "TooLarge", "NotJson", "Conversation", "read_body", "read_request", "session_id",
           "checked_text", "converter_messages", "session_key", "MAX_DEPTH", "MAX_SESSION_CHARS"]

MAX_DEPTH = 64          # JSON nesting of a request body (tool schemas nest a few levels; thousands is an attack)
MAX_SESSION_CHARS = 512

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
_KEPT_KEYS = {"system": ("role", "content"), "user": ("role", "content"),
              "assistant": ("role", "content", "tool_calls"), "tool": ("role", "content", "tool_call_id")}


class RequestError(ValueError):
    """A malformed request: answered with HTTP `status` (400 here) and this message, nothing routed or recorded."""

    status = 400


class TooLarge(RequestError):
    status = 413


class NotJson(RequestError):
    status = 415


def read_body(data: bytes) -> Any:
    """A request body's bytes as JSON: UTF-8, no NaN or Infinity, no repeated key or lone surrogate
    (`validation.parse_json`), nesting at most `MAX_DEPTH` deep; else a RequestError."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(f"the request body is not UTF-8: {error.reason} at byte {error.start}") from None
    try:
        body = parse_json(text, Where("<request body>", None), allow_non_finite=False)
    except DataError as error:
        raise RequestError(f"the request body is not JSON the proxy reads: {error.why}"
                           + (f" ({error.field})" if error.field != "<json>" else "")) from None
    if json_depth(body) > MAX_DEPTH:
        raise RequestError(f"the request body nests deeper than {MAX_DEPTH} levels")
    return body


def json_depth(value: Any) -> int:
    """How deeply a parsed JSON value nests (iterative: a deep value must not overflow the stack here)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def checked_text(text: str, what: str) -> str:
    """A session id or task family every route and file can carry back (the outcome URL, the response headers)."""
    if len(text) > MAX_SESSION_CHARS:
        raise RequestError(f"the {what} has {len(text)} characters, more than {MAX_SESSION_CHARS}")
    bad = next((c for c in text if unicodedata.category(c)[0] == "C"), None)
    if bad is not None:
        raise RequestError(f"the {what} holds the control character U+{ord(bad):04X}: give one of printable "
                           f"characters")
    return text


@dataclasses.dataclass(frozen=True)
class Conversation:
    """One chat-completions request as the router and the recorder read it."""

    body: dict                        # the request body as sent (forwarded upstream with only `model` replaced)
    task: str                         # the first user message(s): the task of the episode
    history: list[dict[str, str]]     # one {"response", "feedback"} per assistant message so far
    stream: bool
    user: str | None                  # the OpenAI `user` field, a session id when no session header is sent


def read_request(body: Any) -> Conversation:
    """The parsed request; a RequestError for what the endpoint cannot serve."""
    if not isinstance(body, Mapping):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    if "messages" not in body:
        raise RequestError("the request has no 'messages'")
    check_fields(body)
    stream = body.get("stream") or False
    if body.get("n") not in (1, None):
        raise RequestError(f"'n' must be 1: a routed turn is one call of one model, got {body.get('n')!r}")
    user = body.get("user")
    try:
        task, history = routing_state(converter_messages(body["messages"]))
    except DataError as error:
        raise RequestError(f"{error.field}: {error.why}") from None
    return Conversation(body=dict(body), task=task, history=history, stream=stream, user=user or None)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _strings(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))


# Every field of OpenAI's chat-completions request and what its value must be (null is always allowed): a field
# the proxy does not know, or one of the wrong type, is refused with 400 as OpenAI's API refuses it, rather than
# forwarded to an upstream that may read it otherwise (`n: true` would ask for one completion per... true).
_FIELDS: dict[str, tuple[str, Any]] = {
    "model": ("a string", lambda v: isinstance(v, str)), "messages": ("a list", lambda v: isinstance(v, list)),
    "stream": ("true or false", lambda v: isinstance(v, bool)),
    "stream_options": ("an object", lambda v: isinstance(v, dict)),
    "n": ("an integer", _integer), "user": ("a string", lambda v: isinstance(v, str)),
    **{k: ("a number", _number) for k in ("temperature", "top_p", "frequency_penalty", "presence_penalty")},
    **{k: ("an integer", _integer) for k in ("max_tokens", "max_completion_tokens", "seed", "top_logprobs")},
    "stop": ("a string or a list of strings", _strings),
    **{k: ("true or false", lambda v: isinstance(v, bool)) for k in ("logprobs", "parallel_tool_calls", "store")},
    **{k: ("a list", lambda v: isinstance(v, list)) for k in ("tools", "functions", "modalities")},
    **{k: ("a string or an object", lambda v: isinstance(v, (str, dict))) for k in ("tool_choice", "function_call")},
    **{k: ("an object", lambda v: isinstance(v, dict)) for k in ("response_format", "logit_bias", "metadata", "audio",
                                                                 "prediction", "web_search_options")},
    **{k: ("a string", lambda v: isinstance(v, str)) for k in ("service_tier", "reasoning_effort", "verbosity",
                                                               "prompt_cache_key", "safety_identifier")},
}


def check_fields(body: Mapping) -> None:
    """RequestError for a field the chat-completions API does not have, or a value of the wrong type (`_FIELDS`)."""
    for key, value in body.items():
        if key not in _FIELDS:
            raise RequestError(f"unknown field {key!r}: the chat-completions request has no such field")
        what, valid = _FIELDS[key]
        if value is not None and not valid(value):
            raise RequestError(f"{key!r} must be {what}, got {json.dumps(value)[:60]}")


def session_id(conversation: Conversation, header: str | None, key: bytes) -> str:
    """The episode's session: the session header, else the `user` field, else a keyed hash of the task (so a client
    that sends neither still has its turns of one conversation joined into one episode). The proxy's secret `key`
    makes that id one no other client can compute from the task text, so none can close or divert the episode of
    another; the response's x-rivet-session tells it to the client it belongs to."""
    if header:
        return header
    if conversation.user:
        return conversation.user
    return "task-" + hmac.new(key, conversation.task.encode("utf-8"), hashlib.sha256).hexdigest()[:24]


def session_key(directory: Path) -> bytes:
    """The proxy's secret for the keyed session ids: `<directory>/session.key`, made once (readable by its owner
    only) and kept, so that open episodes recovered after a restart keep their ids."""
    path = Path(directory) / "session.key"
    if not path.exists():
        partial = path.with_name("session.key.partial")
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(secrets.token_hex(32))
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)
    return bytes.fromhex(path.read_text(encoding="utf-8").strip())


def converter_messages(messages: Any) -> list[dict]:
    """Request messages in the form `routing_state` reads (module docstring); RequestError when malformed."""
    if not isinstance(messages, list):
        raise RequestError(f"'messages' must be a list, got {type(messages).__name__}")
    out: list[dict] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise RequestError(f"messages[{i}] must be an object, got {type(message).__name__}")
        role = _ROLES.get(message.get("role"))
        if role is None:
            raise RequestError(f"messages[{i}].role: expected one of {', '.join(_ROLES)}, got {message.get('role')!r}")
        kept = {key: message[key] for key in _KEPT_KEYS[role] if key in message}
        kept["role"] = role
        if "content" in kept:
            kept["content"] = _text(kept["content"], f"messages[{i}].content")
        if role == "assistant" and kept.get("tool_calls") is not None:
            kept["tool_calls"] = [_tool_call(call, f"messages[{i}].tool_calls[{k}]")
                                  for k, call in enumerate(_list(kept["tool_calls"], f"messages[{i}].tool_calls"))]
        if role == "user" and out and out[-1]["role"] == "user" and not any(m["role"] == "assistant" for m in out):
            out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n\n{kept.get('content') or ''}"}
            continue
        out.append(kept)
    return out


def _text(content: Any, field: str) -> str | None:
    """A message's content as one string, as the logs' converter reads it (`openai_chat.content_text`)."""
    try:
        return content_text(content, Where("<request>", None), field)
    except DataError as error:
        raise RequestError(f"{error.field}: {error.why}") from None


def _tool_call(call: Any, field: str) -> dict:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        raise RequestError(f"{field} must be an object with a 'function'")
    function = call["function"]
    return {"id": call.get("id"), "type": call.get("type", "function"),
            "function": {"name": function.get("name"), "arguments": function.get("arguments")}}


def _list(value: Any, field: str) -> list:
    if not isinstance(value, list):
        raise RequestError(f"{field} must be a list, got {type(value).__name__}")
    return value
