"""Tests for rivet_jax.data.converters (OpenAI chat logs, MTRouter trajectories) and launch.convert.

Every input is written here: each converter's documented example, converted, written and read back, gives the
episodes worked out by hand (costs from the card prices below); every malformed case is a DataError naming the
file, the line and the field of the input.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rivet_jax.data.converters import convert, mtrouter, openai_chat
from rivet_jax.data.converters.common import tokens_and_cost
from rivet_jax.data.validation import Where
from rivet_jax.data.converters.mtrouter import convert_mtrouter
from rivet_jax.data.converters.openai_chat import convert_openai_chat, prompt_task_id, routing_state
from rivet_jax.data.schema import (
    DataError, Episode, ModelCard, ModelPool, Task, Turn, read_episodes, write_episodes, write_model_cards,
)

REPO_ROOT = Path(__file__).resolve().parents[1]

# USD per million tokens: small 1 in / 2 out, large 10 / 30; noprice has none.
POOL = ModelPool((ModelCard("small", "Cheap.", price_in_per_mtok=1.0, price_out_per_mtok=2.0),
                  ModelCard("large", "Strong.", price_in_per_mtok=10.0, price_out_per_mtok=30.0),
                  ModelCard("noprice", "Unpriced.")))


def round_trip(episodes: list[Episode], tmp_path: Path) -> list[Episode]:
    path = tmp_path / "out.jsonl"
    write_episodes(path, episodes)
    return read_episodes(path, POOL).episodes


def documented_example(module) -> dict:
    """The JSON example in a converter's module docstring, so the documentation is what is tested."""
    return json.loads(module.__doc__.split("```json\n", 1)[1].split("```", 1)[0])


def assert_data_error(call: Callable[[], object], path: Path, line: int | None, field: str, why: str) -> None:
    with pytest.raises(DataError) as info:
        call()
    assert (info.value.path, info.value.line, info.value.field) == (str(path), line, field), str(info.value)
    assert why in info.value.why, str(info.value)


# ------------------------------------------------------------------------------------------------ OpenAI chat logs

WEATHER = {  # the module docstring's example
    "id": "conv-1", "task_family": "weather", "outcome": 1, "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "model": "small",
         "usage": {"prompt_tokens": 100, "completion_tokens": 20},
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
        {"role": "assistant", "content": "It is 18C and sunny.", "model": "large",
         "usage": {"prompt_tokens": 150, "completion_tokens": 10, "cost": 0.002}},
        {"role": "user", "content": "Thanks!"},
    ]}
ADDITION = {  # content and a tool call in one message, a later system message, a graded outcome
    "id": "conv-2", "outcome": 0.5, "messages": [
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "Let me compute.", "model": "small",
         "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55},  # other usage keys: ignored
         "tool_calls": [{"id": "call_a", "type": "function",
                         "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "5"},
        {"role": "system", "content": "Answer briefly."},
        {"role": "assistant", "content": "5", "model": "small", "usage": {"prompt_tokens": 70, "completion_tokens": 1}},
    ]}

EXPECTED_CHAT = [
    Episode("conv-1", Task("prompt-" + hashlib.sha256(b"Weather in Paris?").hexdigest()[:16], "Weather in Paris?",
                           "weather"), (
        # (1 x 100 + 2 x 20) / 1e6; the second call's cost is the logged one.
        Turn("small", '[tool_call call_1] get_weather({"city": "Paris"})', "[tool call_1] 18C, sunny", 100, 20,
             0.00014),
        Turn("large", "It is 18C and sunny.", "[user] Thanks!", 150, 10, 0.002, done=True),
    ), outcome=1),
    Episode("conv-2", Task(prompt_task_id("Add 2 and 3."), "Add 2 and 3."), (
        Turn("small", 'Let me compute.\n[tool_call call_a] add({"a": 2, "b": 3})',
             "[tool call_a] 5\n[system] Answer briefly.", 50, 5, 6e-05),  # (50 + 2 x 5) / 1e6
        Turn("small", "5", "", 70, 1, 7.2e-05, done=True),  # (70 + 2 x 1) / 1e6
    ), outcome=0.5),
]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def test_prompt_task_id_is_a_hash_of_the_prompt():
    assert prompt_task_id("Weather in Paris?") == "prompt-" + hashlib.sha256(b"Weather in Paris?").hexdigest()[:16]
    assert prompt_task_id("a") != prompt_task_id("b")


def test_openai_chat_round_trips_its_example(tmp_path):
    assert documented_example(openai_chat) == WEATHER
    path = write_jsonl(tmp_path / "chats.jsonl", [WEATHER, "", ADDITION])  # a blank line is skipped
    episodes = convert_openai_chat(path, POOL)
    assert episodes == EXPECTED_CHAT
    assert round_trip(episodes, tmp_path) == EXPECTED_CHAT
    assert type(round_trip(episodes, tmp_path)[0].outcome) is int  # a 0/1 outcome stays the integer


def test_openai_chat_outcome_scale(tmp_path):
    path = write_jsonl(tmp_path / "chats.jsonl", [dict(WEATHER, outcome=7), dict(ADDITION, outcome=10)])
    assert [e.outcome for e in convert_openai_chat(path, POOL, outcome_scale=(0, 10))] == [0.7, 1.0]
    assert_data_error(lambda: convert_openai_chat(path, POOL), path, 1, "outcome", "[0, 1]")


def test_openai_chat_reads_what_sdk_exports_add_and_a_logged_propensity(tmp_path):
    """The same conversation as WEATHER, written the way the SDK's model_dump and newer exports write it: record
    metadata and tools, a developer message, content as parts, names, null function_call/refusal/audio and
    annotations; plus a propensity on each assistant message. It converts to WEATHER's episode, propensities added."""
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "You are a helpful assistant."}]},
        {"role": "user", "name": "alice", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {**WEATHER["messages"][2], "refusal": None, "function_call": None, "audio": None, "annotations": [],
         "propensity": 0.25},
        {**WEATHER["messages"][3], "name": "get_weather"},
        {**WEATHER["messages"][4], "refusal": None, "annotations": [], "propensity": 1.0},
        WEATHER["messages"][5],
    ]
    exported = {**WEATHER, "messages": messages, "metadata": {"user": "u1"}, "created": 1700000000,
                "tools": [{"type": "function", "function": {"name": "get_weather"}}], "parallel_tool_calls": True}
    [episode] = convert_openai_chat(write_jsonl(tmp_path / "sdk.jsonl", [exported]), POOL)
    expected = EXPECTED_CHAT[0]
    assert episode.task == expected.task and episode.outcome == expected.outcome
    assert [t.propensity for t in episode.turns] == [0.25, 1.0]
    assert [dataclasses.replace(t, propensity=None) for t in episode.turns] == list(expected.turns)
    # the served router reads the same texts from such a conversation
    assert routing_state(messages[:4]) == routing_state(WEATHER["messages"][:4])
    # a refusal without content is the response; image parts are written by type
    refused = {"id": "r", "outcome": 0, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Do it."}, {"type": "image_url", "image_url": {}}]},
        {"role": "assistant", "content": None, "refusal": "I can't help with that.", "model": "small",
         "usage": {"prompt_tokens": 5, "completion_tokens": 5}}]}
    [episode] = convert_openai_chat(write_jsonl(tmp_path / "refused.jsonl", [refused]), POOL)
    assert episode.task.prompt == "Do it.\n[image_url]" and episode.turns[0].response == "I can't help with that."
    for bad, field, why in [(0, "messages[2].propensity", "(0, 1]"), (1.5, "messages[2].propensity", "(0, 1]")]:
        broken = {**WEATHER, "messages": [*WEATHER["messages"][:2], {**WEATHER["messages"][2], "propensity": bad},
                                          *WEATHER["messages"][3:]]}
        path = write_jsonl(tmp_path / "bad.jsonl", [broken])
        assert_data_error(lambda: convert_openai_chat(path, POOL), path, 1, field, why)
    legacy = {**WEATHER, "messages": [*WEATHER["messages"][:2], {**WEATHER["messages"][2], "function_call": {
        "name": "get_weather", "arguments": "{}"}}, *WEATHER["messages"][3:]]}
    path = write_jsonl(tmp_path / "legacy.jsonl", [legacy])
    assert_data_error(lambda: convert_openai_chat(path, POOL), path, 1, "messages[2].function_call", "legacy")


def test_openai_chat_skip_mode_counts_bad_records_up_to_a_limit(tmp_path):
    path = write_jsonl(tmp_path / "mixed.jsonl", [WEATHER, dict(ADDITION, outcome=7), ADDITION])
    with open(path, "a", encoding="utf-8") as f:
        f.write("{not json\n")
    skipped = []
    episodes = convert_openai_chat(path, POOL, skipped=skipped, max_skipped_fraction=0.5)
    assert [e.episode_id for e in episodes] == ["conv-1", "conv-2"]
    assert [(e.line, e.field) for e in skipped] == [(2, "outcome"), (4, "<json>")]
    with pytest.raises(DataError, match="more than max_skipped_fraction=0.25"):
        convert_openai_chat(path, POOL, skipped=[], max_skipped_fraction=0.25)
    conversion = convert("openai", path, POOL, skip_invalid=True, max_skipped_fraction=0.5)
    assert conversion.notes[0] == "skipped 2 bad record(s)" and len(conversion.notes) == 3
    with pytest.raises(ValueError, match="openai"):
        convert("mtrouter", path, POOL, skip_invalid=True)


def test_routing_state_gives_the_converted_texts():
    # Before the second call: the task and the first turn, as the router is served them.
    task, history = routing_state(WEATHER["messages"][:4])
    assert task == "Weather in Paris?"
    assert history == [{"response": '[tool_call call_1] get_weather({"city": "Paris"})',
                        "feedback": "[tool call_1] 18C, sunny", "model": "small"}]  # the model, where named
    assert routing_state(WEATHER["messages"][:2]) == ("Weather in Paris?", [])
    _, history = routing_state(ADDITION["messages"])
    assert history == [{"response": t.response, "feedback": t.feedback, "model": t.model}
                       for t in EXPECTED_CHAT[1].turns]
    unnamed = [{k: v for k, v in m.items() if k != "model"} for m in ADDITION["messages"]]
    assert all("model" not in turn for turn in routing_state(unnamed)[1])


def drop(*keys) -> Callable[[dict], None]:
    def edit(record: dict) -> None:
        *parents, last = keys
        target = record
        for key in parents:
            target = target[key]
        del target[last]
    return edit


def put(value, *keys) -> Callable[[dict], None]:
    def edit(record: dict) -> None:
        *parents, last = keys
        target = record
        for key in parents:
            target = target[key]
        target[last] = value
    return edit


def messages(*items) -> Callable[[dict], None]:
    return put(list(items), "messages")


USER = {"role": "user", "content": "Hi"}
CALL = {"role": "assistant", "content": "Hello", "model": "small",
        "usage": {"prompt_tokens": 1, "completion_tokens": 1}}


@pytest.mark.parametrize("edit, field, why", [
    (drop("messages", 2, "model"), "messages[2].model", "missing required field"),
    (put("gpt-9", "messages", 2, "model"), "messages[2].model", "unknown model 'gpt-9'; the pool has: small, large"),
    (drop("messages", 2, "usage"), "messages[2].usage", "missing required field"),
    (put("noprice", "messages", 2, "model"), "messages[2].usage.cost", "lacks price_in_per_mtok"),
    (put(-1, "messages", 2, "usage", "prompt_tokens"), "messages[2].usage.prompt_tokens", "must be >= 0"),
    (put("1", "messages", 2, "usage", "completion_tokens"), "messages[2].usage.completion_tokens", "expected int"),
    (put(2, "outcome"), "outcome", "[0, 1]"),
    (put(True, "outcome"), "outcome", "got bool"),
    (drop("outcome"), "outcome", "missing required field"),
    (put("hello", "messages"), "messages", "expected list, got str"),
    (messages(USER, {"role": "tool", "tool_call_id": "c", "content": "x"}), "messages[1].role",
     "a tool message before any assistant message"),
    (put("call_9", "messages", 3, "tool_call_id"), "messages[3].tool_call_id", "'call_9' names no tool call"),
    (put([], "messages", 2, "tool_call"), "messages[2].tool_call", "did you mean 'tool_calls'?"),
    (put("x", "messages", 1, "model"), "messages[1].model", "unknown key"),
    (put("critic", "messages", 1, "role"), "messages[1].role",
     "expected one of system, developer, user, assistant, tool"),
    (put(["a"], "messages", 1, "content"), "messages[1].content[0]", "must be an object with a 'type'"),
    (put(5, "messages", 1, "content"), "messages[1].content", "expected string or list of parts, got int"),
    (put("web", "messages", 2, "tool_calls", 0, "type"), "messages[2].tool_calls[0].type", "only 'function'"),
    (drop("messages", 2, "tool_calls", 0, "function", "name"), "messages[2].tool_calls[0].function.name",
     "missing required field"),
    (messages(USER, USER, CALL), "messages[1]", "a second user message before the first assistant message"),
    (messages(CALL), "messages[0].role", "an assistant message before any user message"),
    (messages({"role": "system", "content": "s"}, USER), "messages", "no assistant message"),
    (put("conv-1", "id"), "id", "duplicate id 'conv-1' (first on line 1)"),
    (put("", "id"), "id", "must be a non-empty string"),
    (put("x", "task_familly"), "task_familly", "did you mean 'task_family'?"),
])
def test_openai_chat_malformed_input_names_file_line_and_field(tmp_path, edit, field, why):
    record = copy.deepcopy(dict(WEATHER, id="conv-2"))
    edit(record)
    path = write_jsonl(tmp_path / "chats.jsonl", [WEATHER, record])
    assert_data_error(lambda: convert_openai_chat(path, POOL), path, 2, field, why)


def test_openai_chat_unreadable_files(tmp_path):
    path = write_jsonl(tmp_path / "chats.jsonl", [WEATHER, '{"id": "conv-2",'])
    assert_data_error(lambda: convert_openai_chat(path, POOL), path, 2, "<json>", "invalid JSON")
    empty = write_jsonl(tmp_path / "empty.jsonl", [""])
    assert_data_error(lambda: convert_openai_chat(empty, POOL), empty, None, "<file>", "no conversations")
    missing = tmp_path / "missing.jsonl"
    assert_data_error(lambda: convert_openai_chat(missing, POOL), missing, None, "<file>", "does not exist")


# ------------------------------------------------------------------------------------------- MTRouter trajectories

def usage(prompt: int, completion: int, **more) -> dict:
    return {"response": {"model": "provider/model", "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                                              "total_tokens": prompt + completion, **more}}}


BOIL = {  # ScienceWorld through the propensity-logging roulette router (the module docstring's example, grown)
    "trajectory_format": "mini-agentic-router-1",
    "info": {"exit_status": "Submitted", "submission": "", "final_score": 50, "task_name": "boil", "variation_idx": 0,
             "task_id": "boil_var0_run0", "model_stats": {"instance_cost": 0.00346, "api_calls": 2},
             "config": {"model": {"model_name": "propensity_roulette"}}},
    "messages": [
        {"role": "system", "content": "You are an agent.", "timestamp": 1.0},
        {"role": "user", "content": "Boil water.", "timestamp": 1.0},
        {"role": "assistant", "content": "look around", "timestamp": 2.0, "extra": usage(200, 30),
         "model_name": "small", "router_type": "PropensityRouletteRouter", "propensity": 0.5,
         "selected_model": "small", "router_info": {"propensity": 0.5, "model_pool": ["small", "large"]}},
        {"role": "user", "content": "Observation: a stove.", "timestamp": 3.0},
        {"role": "assistant", "content": "activate stove", "timestamp": 4.0, "extra": usage(260, 20),
         "model_name": "large", "propensity": 0.5},
        {"role": "user", "content": "Submitted", "timestamp": 5.0},
    ]}
HLE = {  # a single-model HLE run (its model in info.config), judged correct, cost logged by OpenRouter
    "trajectory_format": "mini-agentic-router-1",
    "info": {"exit_status": "Submitted", "benchmark": "hle", "task_id": "q42", "run_id": 0,
             "benchmark_data": {"judge_result": {"correct": True}}, "config": {"model": {"model_name": "large"}}},
    "messages": [
        {"role": "system", "content": "Answer."},
        {"role": "user", "content": "What is 6 x 7?"},
        {"role": "assistant", "content": "42", "extra": usage(30, 2, cost=0.0005)},
        {"role": "user", "content": "Submitted: 42"},
    ]}
FAILED = copy.deepcopy(dict(BOIL, info=dict(BOIL["info"], exit_status="APIError", task_id="boil_var1_run0")))

EXPECTED_BOIL = Episode("roulette/boil_var0_run0/boil_var0_run0", Task("boil_var0", "Boil water.", "boil"), (
    Turn("small", "look around", "Observation: a stove.", 200, 30, 0.00026, propensity=0.5),  # (200 + 2 x 30) / 1e6
    Turn("large", "activate stove", "Submitted", 260, 20, 0.0032, propensity=0.5, done=True),  # (2600 + 600) / 1e6
), outcome=0.75)  # (50 - -100) / (100 - -100)
EXPECTED_HLE = Episode("hle/q42/q42", Task("q42", "What is 6 x 7?"), (
    Turn("large", "42", "Submitted: 42", 30, 2, 0.0005, done=True),
), outcome=1.0)


def write_json(path: Path, document) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(document if isinstance(document, str) else json.dumps(document, indent=2), encoding="utf-8")
    return path


def test_mtrouter_round_trips_its_example(tmp_path):
    path = write_json(tmp_path / "roulette/boil_var0_run0/boil_var0_run0.traj.json", documented_example(mtrouter))
    expected = Episode("roulette/boil_var0_run0/boil_var0_run0", Task("boil_var0", "Boil water.", "boil"), (
        Turn("small", "look around", "Observation: a stove.", 200, 30, 0.00026, propensity=0.5),  # (200 + 2 x 30) / 1e6
    ), outcome=0.75)  # (50 - -100) / (100 - -100)
    conversion = convert_mtrouter(tmp_path, POOL)
    assert (conversion.episodes, conversion.notes) == ([expected], [])
    assert round_trip(conversion.episodes, tmp_path) == [expected]
    assert convert_mtrouter(path, POOL).episodes == [dataclasses.replace(expected, episode_id="boil_var0_run0")]


def test_mtrouter_round_trips_a_directory(tmp_path):
    logs = tmp_path / "logs"
    write_json(logs / "roulette/boil_var0_run0/boil_var0_run0.traj.json", BOIL)
    failed = write_json(logs / "roulette/boil_var1_run0/boil_var1_run0.traj.json", FAILED)
    write_json(logs / "hle/q42/q42.traj.json", HLE)
    write_json(logs / "roulette/results.json", {"boil_var0_run0": {}})  # not a trajectory: not read
    conversion = convert_mtrouter(logs, POOL)
    assert conversion.episodes == [EXPECTED_HLE, EXPECTED_BOIL]  # in path order
    assert conversion.notes == [f"{failed}: left out: info.exit_status 'APIError': the run did not complete"]
    assert round_trip(conversion.episodes, tmp_path) == [EXPECTED_HLE, EXPECTED_BOIL]


def test_mtrouter_single_file_scale_and_fallback(tmp_path):
    document = copy.deepcopy(BOIL)
    document["messages"][4]["fallback_from"] = "small"  # drawn with 0.5, answered by the fallback: no propensity
    path = write_json(tmp_path / "boil_var0_run0.traj.json", document)
    (episode,) = convert_mtrouter(path, POOL, outcome_scale=(0, 100)).episodes
    assert episode.episode_id == "boil_var0_run0"
    assert episode.outcome == 0.5
    assert [t.propensity for t in episode.turns] == [0.5, None]


@pytest.mark.parametrize("edit, field, why", [
    (drop("messages", 2, "model_name"), "info.config.model.model_name", "unknown model 'propensity_roulette'"),
    (lambda d: (drop("messages", 2, "model_name")(d), drop("info", "config")(d)), "messages[2].model_name",
     "missing, and so is info.config.model.model_name"),
    (put("gpt-9", "messages", 2, "model_name"), "messages[2].model_name", "unknown model 'gpt-9'"),
    (drop("messages", 2, "extra", "response", "usage"), "messages[2].extra.response.usage", "missing required field"),
    (drop("messages", 2, "extra"), "messages[2].extra", "missing required field"),
    (put("noprice", "messages", 2, "model_name"), "messages[2].extra.response.usage.cost", "lacks price_in_per_mtok"),
    (put(150, "info", "final_score"), "info.final_score", "must be a score in [-100, 100], got 150"),
    (put("high", "info", "final_score"), "info.final_score", "expected number"),
    (drop("info", "final_score"), "info.final_score", "missing, and no judged"),
    (put("gaia", "info", "benchmark"), "info.benchmark", "no known score range for 'gaia'"),
    (put({"role": "user"}, "messages"), "messages", "expected list, got object"),
    (put("mini-swe-agent-1", "trajectory_format"), "trajectory_format", "expected 'mini-agentic-router-1'"),
    (drop("trajectory_format"), "trajectory_format", "missing required field"),
    (put(0, "messages", 2, "propensity"), "messages[2].propensity", "must be in (0, 1], got 0.0"),
    (put(None, "messages", 2, "content"), "messages[2].content", "expected str, got null"),
    (put("tool", "messages", 3, "role"), "messages[3].role", "expected 'user' or 'assistant' here, got 'tool'"),
    (put({"role": "user", "content": "again"}, "messages", 0), "messages[1]", "a second user message"),
    (drop("info", "variation_idx"), "info.variation_idx", "missing required field"),
])
def test_mtrouter_malformed_input_names_file_and_field(tmp_path, edit, field, why):
    document = copy.deepcopy(BOIL)
    edit(document)
    path = write_json(tmp_path / "logs" / "boil_var0_run0.traj.json", document)
    assert_data_error(lambda: convert_mtrouter(tmp_path / "logs", POOL), path, None, field, why)


def test_mtrouter_unreadable_inputs(tmp_path):
    path = write_json(tmp_path / "bad.traj.json", '{\n  "info": }\n')
    assert_data_error(lambda: convert_mtrouter(path, POOL), path, 2, "<json>", "invalid JSON")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_data_error(lambda: convert_mtrouter(empty, POOL), empty, None, "<file>", "no *.traj.json files")
    only_failed = tmp_path / "failed"
    write_json(only_failed / "x.traj.json", FAILED)
    assert_data_error(lambda: convert_mtrouter(only_failed, POOL), only_failed, None, "<file>",
                      "all 1 trajectories were left out")


# ---------------------------------------------------------------------------------------- dispatch and launcher

def test_convert_dispatches_and_refuses_a_scale_for_mint(tmp_path):
    path = write_jsonl(tmp_path / "chats.jsonl", [WEATHER, ADDITION])
    conversion = convert("openai", path, POOL)
    assert (conversion.episodes, conversion.notes) == (EXPECTED_CHAT, [])
    with pytest.raises(ValueError, match="does not apply"):
        convert("mint", tmp_path, POOL, (0.0, 1.0))


def run_convert(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launch.convert", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)


def test_launcher_converts_and_reports_bad_input_in_one_line(tmp_path):
    cards = tmp_path / "cards.json"
    write_model_cards(cards, POOL)
    chats = write_jsonl(tmp_path / "chats.jsonl", [WEATHER, ADDITION])
    out = tmp_path / "episodes.jsonl"
    done = run_convert("--format=openai", f"--input={chats}", f"--cards={cards}", f"--output={out}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"wrote 2 episodes (4 turns) to {out}", "mean outcome: 0.750",
                                        "total cost:   $0.002272"]  # 0.00014 + 0.002 + 0.00006 + 0.000072
    assert read_episodes(out, POOL).episodes == EXPECTED_CHAT

    unnamed = copy.deepcopy(dict(WEATHER, id="conv-2"))
    del unnamed["messages"][2]["model"]
    bad = write_jsonl(tmp_path / "bad.jsonl", [WEATHER, unnamed])
    failed = run_convert("--format=openai", f"--input={bad}", f"--cards={cards}", f"--output={tmp_path / 'x.jsonl'}")
    assert failed.returncode == 1
    assert failed.stderr.strip().splitlines() == [f"error: {bad}:2: field 'messages[2].model': missing required field"]
    assert not (tmp_path / "x.jsonl").exists()


def test_the_worked_example_converts_as_the_docs_say(tmp_path):
    """docs/own-logs.md, step 1: its OpenAI log line becomes the episode the text describes."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "own-logs.md").read_text(encoding="utf-8")
    section = page[page.index("# Your own agent"):]
    block = section[section.index("```json") + len("```json"):]
    record = json.loads(block[:block.index("```")])
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    pool = ModelPool((ModelCard("sage-s", "Small.", price_in_per_mtok=0.5, price_out_per_mtok=1.5),
                      ModelCard("coder-m", "Coder.", price_in_per_mtok=3.0, price_out_per_mtok=15.0)))
    (episode,) = convert_openai_chat(path, pool)
    assert episode.task.prompt == "What is 48 + 24?" and episode.outcome == 1
    first, second = episode.turns
    assert (first.model, first.feedback) == ("sage-s", "[user] Observation: 72")
    assert first.cost == pytest.approx((0.5 * 31 + 1.5 * 12) / 1e6)  # from the card's prices
    assert (second.model, second.cost) == ("coder-m", 0.00021)       # as logged


def test_cached_prompt_tokens_are_read_in_openais_and_anthropics_usage_shapes_and_billed_at_the_cached_price():
    card = ModelCard("c", "Cached.", price_in_per_mtok=3.0, price_out_per_mtok=15.0, price_cached_in_per_mtok=0.3,
                     price_cache_write_per_mtok=3.75)
    where = Where("logs.jsonl", 7)
    openai_usage = {"prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": 1050,
                    "prompt_tokens_details": {"cached_tokens": 800, "audio_tokens": 0}}
    call = tokens_and_cost(openai_usage, card, where, "usage")
    assert (call.prompt_tokens, call.completion_tokens, call.cached_tokens, call.cache_write_tokens) == (
        1000, 50, 800, None)
    assert call.cost == pytest.approx((3.0 * 200 + 0.3 * 800 + 15.0 * 50) / 1e6)
    # Anthropic's: input_tokens leaves out what was read from and written to the cache
    anthropic = {"input_tokens": 100, "cache_read_input_tokens": 800, "cache_creation_input_tokens": 300,
                 "output_tokens": 50}
    call = tokens_and_cost(anthropic, card, where, "usage")
    assert (call.prompt_tokens, call.cached_tokens, call.cache_write_tokens) == (1200, 800, 300)
    assert call.cost == pytest.approx((3.0 * 100 + 0.3 * 800 + 3.75 * 300 + 15.0 * 50) / 1e6)
    # a gateway's OpenAI shape with Anthropic's counts: parts of prompt_tokens
    gateway = {"prompt_tokens": 1200, "completion_tokens": 50, "cache_read_input_tokens": 800,
               "cache_creation_input_tokens": 300}
    assert tokens_and_cost(gateway, card, where, "usage").cost == pytest.approx(call.cost)
    # what was billed wins; no cache counts: every prompt token at the input price, as before caching
    assert tokens_and_cost({**openai_usage, "cost": 0.01}, card, where, "usage").cost == 0.01
    plain = tokens_and_cost({"prompt_tokens": 1000, "completion_tokens": 50}, card, where, "usage")
    assert plain.cached_tokens is None and plain.cost == pytest.approx((3.0 * 1000 + 15.0 * 50) / 1e6)
    for bad, field in (({**openai_usage, "prompt_tokens_details": {"cached_tokens": 1001}}, "usage.prompt_tokens"),
                       ({**openai_usage, "prompt_tokens_details": {"cached_tokens": -1}},
                        "usage.prompt_tokens_details.cached_tokens"),
                       ({**openai_usage, "prompt_tokens_details": 5}, "usage.prompt_tokens_details"),
                       ({"input_tokens": 1}, "usage.output_tokens")):
        with pytest.raises(DataError) as info:
            tokens_and_cost(bad, card, where, "usage")
        assert (info.value.path, info.value.line, info.value.field) == ("logs.jsonl", 7, field)


def test_an_openai_chat_log_with_cached_tokens_records_them_on_the_turn(tmp_path):
    pool = ModelPool((ModelCard("small", "Cheap.", price_in_per_mtok=1.0, price_out_per_mtok=2.0,
                                price_cached_in_per_mtok=0.1),))
    record = {"id": "c1", "outcome": 1, "messages": [
        {"role": "user", "content": "Add 2 and 2."},
        {"role": "assistant", "content": "4", "model": "small",
         "usage": {"prompt_tokens": 100, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 64}}}]}
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(record) + "\n")
    [episode] = convert_openai_chat(path, pool)
    [turn] = episode.turns
    assert (turn.prompt_tokens, turn.cached_tokens, turn.cache_write_tokens) == (100, 64, None)
    assert turn.cost == pytest.approx((1.0 * 36 + 0.1 * 64 + 2.0 * 2) / 1e6)
