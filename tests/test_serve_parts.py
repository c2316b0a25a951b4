"""The proxy's parts without HTTP: the request reading, the epsilon-greedy choice and the recorder's files."""

import json

import numpy as np
import pytest

from rivet_jax.data.schema import ModelCard, ModelPool, Turn, read_episodes
from rivet_jax.serve.conversation import RequestError, read_request, session_id, session_key
from rivet_jax.serve.policy import GREEDY, Budget, Exploration, candidate_names, choose, distribution
from rivet_jax.serve.recorder import NoOpenEpisodeError, Recorder

POOL = ModelPool((ModelCard("small", "a small model", price_in_per_mtok=1.0, price_out_per_mtok=2.0),
                  ModelCard("large", "a large model", price_in_per_mtok=10.0, price_out_per_mtok=20.0)))


# --------------------------------------------------------------------------------------------- conversation

def test_a_request_reads_as_the_converter_reads_a_log():
    conversation = read_request({"model": "rivet", "user": "u", "messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "name": "ann", "content": [{"type": "text", "text": "Look at"},
                                                    {"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "user", "content": "and say what it is."},
        {"role": "assistant", "content": "A cat.", "refusal": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "zoom", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "zoomed"},
        {"role": "user", "content": "Sure?"}]})
    assert conversation.task == "Look at\n[image_url]\n\nand say what it is."   # leading user messages: one task
    assert conversation.history == [{"response": "A cat.\n[tool_call c1] zoom({})",
                                     "feedback": "[tool c1] zoomed\n[user] Sure?"}]
    assert not conversation.stream and conversation.user == "u"


def test_the_session_is_the_header_then_the_user_then_the_task_keyed(tmp_path):
    """Without a header or `user`, the session is the task's hash keyed by the proxy's secret: the same task gives
    the same id under one key (kept across restarts in session.key, owner-only), another id under another key, so
    a client that knows the task text cannot compute another client's session (issue 40)."""
    import hashlib
    import stat

    key = session_key(tmp_path)
    assert session_key(tmp_path) == key and len(key) == 32
    assert stat.S_IMODE((tmp_path / "session.key").stat().st_mode) == 0o600
    with_user = read_request({"messages": [{"role": "user", "content": "t"}], "user": "u"})
    anonymous = read_request({"messages": [{"role": "user", "content": "t"}]})
    assert session_id(with_user, "h", key) == "h" and session_id(with_user, None, key) == "u"
    same = read_request({"messages": [{"role": "user", "content": "t"}]})
    assert session_id(anonymous, None, key) == session_id(same, None, key)
    other = read_request({"messages": [{"role": "user", "content": "u"}]})
    assert session_id(anonymous, None, key) != session_id(other, None, key)
    assert session_id(anonymous, None, key) != session_id(anonymous, None, b"another proxy's key")
    unkeyed = "task-" + hashlib.sha256(b"t").hexdigest()[:16]       # the old, guessable id
    assert not session_id(anonymous, None, key).startswith(unkeyed)


@pytest.mark.parametrize("body, words", [
    ({"messages": []}, "no user message"),
    ({"messages": [{"role": "assistant", "content": "hi"}]}, "before any user message"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "'stream' must be true or false"),
    ({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}, "messages[0].content[0]"),
    ({"messages": "hello"}, "'messages' must be a list"),
])
def test_malformed_requests_name_the_problem(body, words):
    with pytest.raises(RequestError, match=None) as raised:
        read_request(body)
    assert words in str(raised.value)


# --------------------------------------------------------------------------------------------------- policy

def test_the_greedy_choice_and_the_fallback_order():
    choice = choose({"a": 0.2, "b": 0.9, "c": 0.5}, GREEDY, np.random.default_rng(0))
    assert choice.order == ["b", "c", "a"] and choice.propensity == 1.0 and not choice.explored
    assert choice.margin == pytest.approx(0.4) and choice.shortfall == 0.0
    assert choose({"a": 0.5, "b": 0.5}, GREEDY, np.random.default_rng(0)).order == ["a", "b"]   # ties: the first
    assert choose({"a": 0.5}, GREEDY, np.random.default_rng(0)).margin is None
    with pytest.raises(FloatingPointError):
        choose({"a": float("nan"), "b": 0.1}, GREEDY, np.random.default_rng(0))


SCORES = {"a": 0.2, "b": 0.9, "c": 0.85}
# Worked by hand. epsilon 0.3 over 3: the greedy b 0.7 + 0.1, the others 0.1 each. margin 0.1 with epsilon 0.3: only
# b and c are within 0.1 of 0.9, so b 0.7 + 0.15, c 0.15, a never. softmax at temperature 0.1: exp(-7), 1, exp(-0.5)
# normalised.
_SOFT = np.exp(np.array([-7.0, 0.0, -0.5]))
EXPECTED = [(Exploration("epsilon", epsilon=0.3), {"a": 0.1, "b": 0.8, "c": 0.1}),
            (Exploration("margin", epsilon=0.3, margin=0.1), {"a": 0.0, "b": 0.85, "c": 0.15}),
            (Exploration("softmax", temperature=0.1), dict(zip("abc", (_SOFT / _SOFT.sum()).tolist())))]


@pytest.mark.parametrize("exploration,expected", EXPECTED, ids=lambda x: getattr(x, "kind", ""))
def test_exploration_draws_with_its_exact_recorded_propensity(exploration, expected):
    probabilities = distribution(SCORES, exploration)
    assert probabilities == pytest.approx(expected) and sum(probabilities.values()) == pytest.approx(1.0)
    rng = np.random.default_rng(1)
    draws = [choose(SCORES, exploration, rng) for _ in range(8000)]
    for name, p in expected.items():
        drawn = [d for d in draws if d.order[0] == name]
        assert all(d.propensity == pytest.approx(p) for d in drawn)
        assert len(drawn) / len(draws) == pytest.approx(p, abs=0.015)          # empirical frequencies
    assert all(sorted(d.order) == ["a", "b", "c"] for d in draws)
    # what exploring gives up by the router's values: sum_m p(m) (0.9 - Q(m))
    assert draws[0].shortfall == pytest.approx(sum(p * (0.9 - SCORES[m]) for m, p in expected.items()))


def test_the_budget_holds_the_expected_shortfall_per_episode():
    # epsilon 0.3: each decision gives up 0.1 * 0.7 + 0.1 * 0.05 = 0.075 by Q; a budget of 0.1 per episode
    budget = Budget(Exploration("epsilon", epsilon=0.3), 0.1)
    rng = np.random.default_rng(0)
    for episode in range(50):
        budget.opened()
        for _ in range(4):
            budget.choose(SCORES, rng)
    report = budget.report()
    assert report["expected_shortfall"] <= 0.1 * 50 + 0.075          # spent at most one decision past the budget
    assert report["expected_shortfall"] >= 0.1 * 50 - 0.075
    assert report["greedy_for_budget"] > 0 and report["decisions"] == 200
    unlimited = Budget(Exploration("epsilon", epsilon=0.3), None)
    unlimited.opened()
    for _ in range(10):
        unlimited.choose(SCORES, rng)
    assert unlimited.report()["expected_shortfall"] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="kind"):
        Exploration("boltzmann")


def test_candidates_are_the_served_models_up_and_requested():
    served = ["a", "b", "c"]
    assert candidate_names(served, set(), None) == served
    assert candidate_names(served, {"b"}, None) == ["a", "c"]
    assert candidate_names(served, {"b"}, ["c", "b"]) == ["c"]


# ------------------------------------------------------------------------------------------------- recorder

class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def turn(model="small", response="r") -> Turn:
    return Turn(model=model, response=response, feedback="", prompt_tokens=3, completion_tokens=4, cost=0.5,
                propensity=1.0, available=("small", "large"), latency_s=0.01)


def test_recording_survives_a_torn_log_and_a_restart(tmp_path):
    recorder = Recorder(tmp_path, POOL, Clock())
    recorder.record("s", "task", 0, turn(response="one"))
    recorder.observe("s", "task", [{"response": "one", "feedback": "fb"}])
    recorder.record("s", "task", 1, turn("large", "two"))
    recorder.record("other", "task 2", 0, turn())
    recorder.close("other", 1)
    recorder.close_files()
    with open(recorder.wal_path, "a", encoding="utf-8") as wal:
        wal.write('{"event": "turn", "episode": "s@1000.0000')   # a crash mid-write
    again = Recorder(tmp_path, POOL, Clock())
    assert list(again.open) == ["s"]
    assert [(t.model, t.response, t.feedback) for t in again.open["s"].turns] == [("small", "one", "fb"),
                                                                                   ("large", "two", "")]
    events = [json.loads(line) for line in again.wal_path.read_text().splitlines()]
    assert {e["episode"] for e in events} == {again.open["s"].episode_id}   # compacted to the open episode
    episode = again.close("s", 0.5)
    again.close_files()
    read = read_episodes(again.episodes_path, POOL).episodes
    assert [e.episode_id for e in read] == [read[0].episode_id, episode.episode_id] and read[1] == episode
    assert [t.done for t in read[1].turns] == [False, True]


def test_a_close_cut_short_after_writing_is_not_reopened(tmp_path):
    recorder = Recorder(tmp_path, POOL, Clock())
    recorder.record("s", "task", 0, turn())
    recorder.close("s", 1)
    recorder.close_files()
    lines = recorder.wal_path.read_text().splitlines()
    recorder.wal_path.write_text("\n".join(lines[:-1]) + "\n")   # the close event never reached the log
    again = Recorder(tmp_path, POOL, Clock())
    assert not again.open
    assert len(read_episodes(again.episodes_path, POOL).episodes) == 1


def test_diverged_expired_and_mid_conversation_episodes_are_kept_apart(tmp_path):
    clock = Clock()
    recorder = Recorder(tmp_path, POOL, clock)
    recorder.record("edit", "task", 0, turn())
    recorder.record("edit", "task", 1, turn())
    recorder.observe("edit", "task", [])   # no turn where two were served (one less would ask the last again)
    recorder.record("idle", "task", 0, turn())
    recorder.record("late", "task", 3, turn())        # three earlier turns this proxy did not serve
    with pytest.raises(NoOpenEpisodeError):
        recorder.close("edit", 1)
    assert recorder.close("late", 1) is None
    clock.now += 61
    recorder.record("fresh", "task", 0, turn())
    assert recorder.expire(60) == ["idle"]
    recorder.close_files()
    apart = {line["reason"].split(":")[0]: line for line in map(json.loads, recorder.unfinished_path.open())}
    assert set(apart) == {"diverged", "began mid-conversation", "expired"}
    assert apart["began mid-conversation"]["outcome"] == 1 and apart["expired"]["outcome"] is None
    assert len(apart["diverged"]["turns"]) == 2
    assert list(recorder.open) == ["fresh"] and recorder.episodes_path.read_bytes() == b""


def test_a_serve_config_takes_model_names_with_dots(tmp_path):
    """Real model names (`gpt-3.5-turbo-0613`, `Qwen1.5-72B-Chat`) in a serve config file: ml_collections refuses
    dots in nested config keys, so `backends` is a plain dict (a placeholder), read as it is."""
    import importlib.util

    from rivet_jax.serve.upstream import BackendConfigError, backends_from_config

    pool = ModelPool((ModelCard("gpt-3.5-turbo-0613", "a"), ModelCard("Qwen1.5-72B-Chat", "b")))
    path = tmp_path / "serve_config.py"
    path.write_text("from configs import serve\n\n\ndef get_config():\n    config = serve.get_config()\n"
                    "    config.backends = {'gpt-3.5-turbo-0613': {'base_url': 'http://127.0.0.1:9/v1', "
                    "'model': 'gpt-3.5-turbo-0613', 'api_key_env': ''},\n"
                    "                       'Qwen1.5-72B-Chat': {'base_url': 'http://127.0.0.1:8/v1', "
                    "'model': 'qwen', 'api_key_env': ''}}\n    return config\n")
    spec = importlib.util.spec_from_file_location("serve_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    backends = backends_from_config(config.backends, pool)
    assert list(backends) == ["gpt-3.5-turbo-0613", "Qwen1.5-72B-Chat"]
    assert backends["Qwen1.5-72B-Chat"].url == "http://127.0.0.1:8/v1/chat/completions"
    with pytest.raises(BackendConfigError, match="no backends configured"):
        backends_from_config(None, pool)   # the placeholder left unset
