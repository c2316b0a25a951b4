"""OpenAI chat-completions logs -> episodes: one logged conversation per JSONL line.

Input, one JSON object per line (blank lines skipped):

```json
{"id": "conv-1", "task_family": "weather", "outcome": 1, "messages": [
  {"role": "system", "content": "You are a helpful assistant."},
  {"role": "user", "content": "Weather in Paris?"},
  {"role": "assistant", "content": null, "model": "small", "usage": {"prompt_tokens": 100, "completion_tokens": 20},
   "tool_calls": [{"id": "call_1", "type": "function",
                   "function": {"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}}]},
  {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
  {"role": "assistant", "content": "It is 18C and sunny.", "model": "large",
   "usage": {"prompt_tokens": 150, "completion_tokens": 10, "cost": 0.002}},
  {"role": "user", "content": "Thanks!"}]}
```

- Record keys: `id` (unique non-empty string), `messages`, `outcome`, optional `task_family`; what SDK exports add
  at record level (`metadata`, `tools`, `tool_choice`, `parallel_tool_calls`, `created`) is read past. Message
  keys by role: system (or `developer`, its newer name) and user `role`, `content`; assistant also `tool_calls`
  (optional), `model` (a pool name), `usage` (`prompt_tokens`, `completion_tokens`, optional `cost` in USD and
  the prompt cache's counts, `prompt_tokens_details.cached_tokens` or Anthropic's; other usage keys such as
  `total_tokens` are ignored: `common.tokens_and_cost`) and an optional `propensity` (the logging router's probability
  of this model, in (0, 1]: what makes the importance-weighted estimators usable), its `content` may be null;
  tool `role`, `content`, `tool_call_id`. Every message may carry `name`, and an assistant message what the SDK
  writes (`refusal`: its text is the response when there is no content; `annotations`, `audio`; `function_call`
  only when null: legacy function calls are not read). Contents are strings, or lists of parts (text parts
  joined by line breaks, any other part written `[<type>]`). Any other key is an error naming the closest known
  one, since a typo'd `tool_call` would otherwise drop the calls unseen.
- Task: the first user message's content; its id `prompt-<first 16 hex digits of its sha256>`, so conversations on
  the same prompt are one task and a task-level split keeps them together; family `task_family`. System messages
  before the first assistant message are not part of the task: they are the application's fixed instructions, the
  same in every conversation, so in the routing state they would carry no information and use up its token budget,
  and the router is served `route(task, history)` with the user's task. A system message later on is feedback.
- Turns: each assistant message is one turn of its `model`. Its response is its content, then one line per tool call
  `[tool_call <id>] <name>(<arguments>)` (the arguments exactly as logged); its feedback the messages after it up to
  the next assistant message, one line each: `[user] <content>`, `[system] <content>`, `[tool <tool_call_id>]
  <content>` ("" if none). Tokens come from `usage`; the cost is `usage.cost`, else the card's prices:
  (price_in_per_mtok x prompt_tokens + price_out_per_mtok x completion_tokens) / 1e6, the prompt's cached tokens
  at price_cached_in_per_mtok where the card has it (`ModelCard.call_cost`); neither is a DataError.
- Outcome: a number in [0, 1] (0/1 success or a graded score), or with `outcome_scale=(low, high)` any number in
  [low, high], mapped linearly onto [0, 1].
- Refused as well: no user message before the first assistant message, or two; a tool message before any assistant
  message, or one whose `tool_call_id` names no tool call of the assistant message it follows; a conversation
  without an assistant message.

The example converts to one episode of two turns: `small` (response `[tool_call call_1] get_weather({"city":
"Paris"})`, feedback `[tool call_1] 18C, sunny`, cost from the card) and `large` (`It is 18C and sunny.`, feedback
`[user] Thanks!`, cost 0.002). `routing_state` gives a live conversation's task and history with the very same
texts, for `Router.route` at serving time. Errors are `DataError(file, line, field, why)`, the field being the
path in the record (`messages[2].usage.prompt_tokens`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping
from typing import Any

from rivet_jax.data.converters.common import pool_model, read_jsonl, tokens_and_cost
from rivet_jax.data.model_pool import ModelPool
from rivet_jax.data.outcomes import check_outcome, scale_outcome
from rivet_jax.data.schema import Episode, Task, Turn, check_enough_read
from rivet_jax.data.validation import (
    MISSING, DataError, Where, as_number, as_str, optional, reject_unknown_keys, require_field, require_object,
    wrong_type,
)

__all__ = ["convert_openai_chat", "routing_state", "prompt_task_id", "content_text"]

_RECORD_KEYS = ("id", "messages", "outcome", "task_family",
                "metadata", "tools", "tool_choice", "parallel_tool_calls", "created")  # the last five read past
_MESSAGE_KEYS = {
    "system": ("role", "content", "name"),
    "developer": ("role", "content", "name"),
    "user": ("role", "content", "name"),
    "assistant": ("role", "content", "tool_calls", "model", "usage", "propensity", "name", "refusal", "annotations",
                  "audio", "function_call"),
    "tool": ("role", "content", "tool_call_id", "name"),
}


@dataclasses.dataclass
class _Segment:
    """One assistant message (messages[index]) with the texts it becomes and the feedback gathered after it."""

    index: int
    response: str
    call_ids: frozenset[str]
    feedback: list[str] = dataclasses.field(default_factory=list)


def prompt_task_id(prompt: str) -> str:
    """The task id of a prompt: equal prompts, equal ids."""
    return "prompt-" + hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


def routing_state(messages: Any) -> tuple[str, list[dict[str, str]]]:
    """The task and the history of a conversation so far, as `Router.route(task, history)` takes them (each turn's
    "model" too where its assistant message names one).

    The texts are the converter's, so a router is served exactly what it was trained on: call it on the messages up
    to the next model call. Malformed messages are a DataError on '<messages>'.
    """
    task, segments = _segments(messages, Where("<messages>", None))
    history = [{"response": s.response, "feedback": "\n".join(s.feedback)} for s in segments]
    for turn, segment in zip(history, segments):  # the model that answered, where the message names it (a router
        model = messages[segment.index].get("model")  # that commits keeps calling it; routing never reads it)
        if isinstance(model, str):
            turn["model"] = model
    return task, history


def convert_openai_chat(path: str | os.PathLike, pool: ModelPool, outcome_scale: tuple[float, float] | None = None,
                        skipped: list[DataError] | None = None, max_skipped_fraction: float = 0.1) -> list[Episode]:
    """Every conversation of the JSONL file at `path`, in file order (see the module docstring). Given a `skipped`
    list, a bad record is appended to it instead of raised, up to `max_skipped_fraction` of the records (the
    reader's rule: more is a wrong file or a broken exporter, and is refused)."""
    episodes: list[Episode] = []
    first_line: dict[str, int] = {}
    path_str = os.fspath(path)
    for where, record in read_jsonl(path, skipped):
        try:
            episode = _episode(record, pool, outcome_scale, where)
            first = first_line.get(episode.episode_id)
            if first is not None:
                raise where.error("id", f"duplicate id '{episode.episode_id}' (first on line {first})")
        except DataError as error:
            if skipped is None:
                raise
            skipped.append(error)
            continue
        first_line[episode.episode_id] = where.line
        episodes.append(episode)
    if not episodes and not skipped:
        raise DataError(path_str, None, "<file>", "no conversations: the file is empty or blank")
    if skipped is not None:
        check_enough_read(path_str, len(episodes), skipped, max_skipped_fraction)
    return episodes


def _episode(record: Any, pool: ModelPool, outcome_scale: tuple[float, float] | None, where: Where) -> Episode:
    record = require_object(record, where, "<record>")
    reject_unknown_keys(record, _RECORD_KEYS, where, "")
    episode_id = as_str(require_field(record, "id", where, ""), where, "id", non_empty=True)
    family = optional(record.get("task_family", MISSING), as_str, where, "task_family")
    messages = require_field(record, "messages", where, "")
    prompt, segments = _segments(messages, where)
    if not segments:
        raise where.error("messages", "no assistant message: no model was called in this conversation")
    turns = tuple(_turn(messages[s.index], s, pool, where) for s in segments)
    outcome = require_field(record, "outcome", where, "")
    outcome = check_outcome(outcome, where) if outcome_scale is None else scale_outcome(
        outcome, *outcome_scale, where, "outcome")
    return Episode(episode_id=episode_id, task=Task(prompt_task_id(prompt), prompt, family), turns=turns,
                   outcome=outcome)


def _turn(message: Mapping[str, Any], segment: _Segment, pool: ModelPool, where: Where) -> Turn:
    field = f"messages[{segment.index}]"
    card = pool_model(require_field(message, "model", where, field + "."), pool, where, field + ".model")
    usage = require_field(message, "usage", where, field + ".")
    call = tokens_and_cost(usage, card, where, field + ".usage")
    propensity = optional(message.get("propensity", MISSING), as_number, where, field + ".propensity")
    if propensity is not None and not 0.0 < propensity <= 1.0:
        raise where.error(field + ".propensity", f"a probability in (0, 1] is expected, got {propensity}")
    return Turn(model=card.name, response=segment.response, feedback="\n".join(segment.feedback),
                propensity=propensity, **call.turn_fields())


def content_text(content: Any, where: Where, field: str) -> str | None:
    """A message's content as one string: a string as is, a list of parts joined by line breaks (a text part its
    `text`, any other `[<type>]`), null as None; anything else a DataError."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise wrong_type(where, field, "string or list of parts", content)
    parts = []
    for k, part in enumerate(content):
        if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
            raise where.error(f"{field}[{k}]", "a content part must be an object with a 'type'")
        if part["type"] == "text":
            parts.append(as_str(part.get("text", MISSING), where, f"{field}[{k}].text"))
        else:
            parts.append(f"[{part['type']}]")
    return "\n".join(parts)


def _segments(messages: Any, where: Where) -> tuple[str, list[_Segment]]:
    """(task prompt, one segment per assistant message): the one reading of a conversation, for training and serving."""
    if not isinstance(messages, list):
        raise wrong_type(where, "messages", "list", messages)
    task_at: int | None = None
    task = ""
    segments: list[_Segment] = []
    for i, message in enumerate(messages):
        field = f"messages[{i}]"
        message = _message(message, where, field)
        role = "system" if message["role"] == "developer" else message["role"]
        if role == "assistant":
            if task_at is None:
                raise where.error(field + ".role", "an assistant message before any user message: there is no task")
            if message.get("function_call") is not None:
                raise where.error(field + ".function_call", "a legacy function call: only tool_calls are read "
                                                            "(export the conversation with tools)")
            calls = optional(message.get("tool_calls", MISSING), _tool_calls, where, field + ".tool_calls") or []
            content = content_text(message.get("content"), where, field + ".content") or ""
            if not content and not calls and isinstance(message.get("refusal"), str):
                content = message["refusal"]
            lines = ([content] if content else []) + [f"[tool_call {id_}] {name}({args})" for id_, name, args in calls]
            segments.append(_Segment(i, "\n".join(lines), frozenset(id_ for id_, _, _ in calls)))
            continue
        content = content_text(require_field(message, "content", where, field + "."), where, field + ".content")
        if content is None:
            raise where.error(field + ".content", "expected a string, got null")
        if role == "tool":
            if not segments:
                raise where.error(field + ".role", "a tool message before any assistant message: no call to answer")
            call_id = as_str(require_field(message, "tool_call_id", where, field + "."), where, field + ".tool_call_id")
            if call_id not in segments[-1].call_ids:
                raise where.error(field + ".tool_call_id", f"'{call_id}' names no tool call of the assistant message "
                                                           f"it answers (messages[{segments[-1].index}])")
            segments[-1].feedback.append(f"[tool {call_id}] {content}")
        elif segments:
            segments[-1].feedback.append(f"[{role}] {content}")
        elif role == "user":
            if task_at is not None:
                raise where.error(field, f"a second user message before the first assistant message (the task is "
                                         f"messages[{task_at}]): the task must be one message")
            task_at, task = i, content
        # A system message before the first assistant message is not part of the task (module docstring).
    if task_at is None:
        raise where.error("messages", "no user message: the conversation has no task")
    return task, segments


def _message(message: Any, where: Where, field: str) -> Mapping[str, Any]:
    message = require_object(message, where, field)
    role = as_str(require_field(message, "role", where, field + "."), where, field + ".role")
    if role not in _MESSAGE_KEYS:
        raise where.error(field + ".role", f"expected one of {', '.join(_MESSAGE_KEYS)}, got '{role}'")
    reject_unknown_keys(message, _MESSAGE_KEYS[role], where, field + ".")
    return message


def _tool_calls(value: Any, where: Where, field: str) -> list[tuple[str, str, str]]:
    """(id, function name, arguments) of each tool call."""
    if not isinstance(value, list):
        raise wrong_type(where, field, "list", value)
    calls = []
    for i, call in enumerate(value):
        prefix = f"{field}[{i}]."
        call = require_object(call, where, prefix[:-1])
        reject_unknown_keys(call, ("id", "type", "function"), where, prefix)
        kind = call.get("type", "function")
        if kind != "function":
            raise where.error(prefix + "type", f"only 'function' tool calls can be read, got {kind!r}")
        function = require_object(require_field(call, "function", where, prefix), where, prefix + "function")
        reject_unknown_keys(function, ("name", "arguments"), where, prefix + "function.")
        calls.append((
            as_str(require_field(call, "id", where, prefix), where, prefix + "id", non_empty=True),
            as_str(require_field(function, "name", where, prefix + "function."), where, prefix + "function.name",
                   non_empty=True),
            as_str(require_field(function, "arguments", where, prefix + "function."), where,
                   prefix + "function.arguments"),
        ))
    return calls
