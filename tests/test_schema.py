"""Tests for rivet_jax.data.schema and the validate_data launcher.

Corpora are built in code: a 3-card pool and a few 2-turn episodes are written with
write_episodes, then single lines are corrupted by editing their JSON dicts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rivet_jax.data.schema import (
    DataError,
    Episode,
    EpisodeFile,
    ModelCard,
    ModelPool,
    Task,
    Turn,
    read_episodes,
    read_model_cards,
    summarize_episodes,
    write_episodes,
    write_model_cards,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_MINT = Path(__file__).resolve().parents[2] / "shared" / "mint"


# ------------------------------------------------------------------------- builders


def make_pool() -> ModelPool:
    return ModelPool(
        (
            ModelCard(
                "m-small", "Cheap and fast.", 4096, 0.5, 1.0,
                (("code", True), ("math", None)), "Acme",
            ),
            ModelCard(
                "m-medium", "Middle of the road.", 8192, 2.0, 4.0,
                (("code", True), ("tool_use", False)), "Acme",
            ),
            ModelCard("m-large", "Strong and expensive.", 32768, 10.0, 30.0, (("math", True),)),
        )
    )


def make_episode(i: int, *, outcome: float = 1) -> Episode:
    return Episode(
        episode_id=f"ep-{i}",
        task=Task(id=f"task-{i}", prompt=f"What is {i}+{i}?", family="arith" if i % 2 else None),
        turns=(
            Turn(
                model="m-small",
                response="<execute>print(2+2)</execute>",
                feedback="Observation: 4",
                prompt_tokens=812,
                completion_tokens=96,
                cost=0.00031,
                propensity=0.25,
                available=("m-small", "m-large"),
            ),
            Turn(
                model="m-large",
                response="The answer is <solution>4</solution>",
                feedback="",
                prompt_tokens=900,
                completion_tokens=12,
                cost=0.0126,
                done=True,
            ),
        ),
        outcome=outcome,
    )


@pytest.fixture
def pool() -> ModelPool:
    return make_pool()


@pytest.fixture
def good_file(tmp_path: Path) -> Path:
    path = tmp_path / "episodes.jsonl"
    write_episodes(path, [make_episode(i, outcome=i % 2) for i in range(1, 4)])
    return path


def corrupt_line(path: Path, line: int, edit: Callable[[dict], object]) -> None:
    """Replace 1-based `line` by edit(record): a dict/list is re-serialised, a str used as is."""
    lines = path.read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[line - 1])
    new = edit(record)
    new = record if new is None else new
    lines[line - 1] = new if isinstance(new, str) else json.dumps(new)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def setter(dotted: str, value: object) -> Callable[[dict], None]:
    """An edit that sets e.g. 'turns.0.cost' to value."""

    def edit(record: dict) -> None:
        *parents, last = dotted.split(".")
        target = record
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value

    return edit


def deleter(dotted: str) -> Callable[[dict], None]:
    def edit(record: dict) -> None:
        *parents, last = dotted.split(".")
        target = record
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        del target[last]

    return edit


# -------------------------------------------------------------------- bad inputs

# (case id, edit of line 2, expected field, fragment of `why`)
BAD_LINE_CASES = [
    ("invalid_json", lambda r: '{"episode_id": "ep-2", ', "<json>", "invalid JSON: Expecting"),
    ("duplicate_json_key", lambda r: '{"outcome": 1, "outcome": 0}', "outcome", "duplicate key 'outcome'"),
    ("not_an_object", lambda r: [r], "<record>", "expected a JSON object, got list"),
    ("missing_outcome", deleter("outcome"), "outcome", "missing"),
    ("missing_episode_id", deleter("episode_id"), "episode_id", "missing"),
    ("missing_task_prompt", deleter("task.prompt"), "task.prompt", "missing"),
    ("missing_turn_cost", deleter("turns.1.cost"), "turns[1].cost", "missing"),
    ("missing_turn_model", deleter("turns.0.model"), "turns[0].model", "missing"),
    ("episode_id_int", setter("episode_id", 5), "episode_id", "expected str, got int"),
    ("task_not_object", setter("task", "t-1"), "task", "expected a JSON object, got str"),
    ("task_family_int", setter("task.family", 3), "task.family", "expected str, got int"),
    ("turns_not_list", setter("turns", {}), "turns", "expected list, got object"),
    ("turn_not_object", setter("turns.1", "hi"), "turns[1]", "expected a JSON object, got str"),
    ("response_null", setter("turns.0.response", None), "turns[0].response", "expected str, got null"),
    ("feedback_int", setter("turns.0.feedback", 0), "turns[0].feedback", "expected str, got int"),
    ("tokens_bool", setter("turns.0.prompt_tokens", True), "turns[0].prompt_tokens", "expected int, got bool"),
    ("tokens_float", setter("turns.0.completion_tokens", 12.0), "turns[0].completion_tokens", "expected int, got float"),
    ("tokens_str", setter("turns.0.prompt_tokens", "812"), "turns[0].prompt_tokens", "expected int, got str"),
    ("tokens_negative", setter("turns.1.completion_tokens", -1), "turns[1].completion_tokens", ">= 0"),
    ("tokens_nan", setter("turns.0.prompt_tokens", math.nan), "turns[0].prompt_tokens", "expected int, got float"),
    ("tokens_inf", setter("turns.0.prompt_tokens", math.inf), "turns[0].prompt_tokens", "expected int, got float"),
    ("cost_str", setter("turns.0.cost", "0.1"), "turns[0].cost", "expected number, got str"),
    ("cost_bool", setter("turns.0.cost", True), "turns[0].cost", "expected number, got bool"),
    ("cost_negative", setter("turns.0.cost", -0.01), "turns[0].cost", ">= 0"),
    ("cost_nan", setter("turns.0.cost", math.nan), "turns[0].cost", "finite"),
    ("cost_inf", setter("turns.1.cost", math.inf), "turns[1].cost", "finite"),
    ("cost_neg_inf", setter("turns.1.cost", -math.inf), "turns[1].cost", "finite"),
    ("done_int", setter("turns.0.done", 0), "turns[0].done", "expected bool, got int"),
    ("unknown_model", setter("turns.1.model", "gpt-9"), "turns[1].model", "unknown model 'gpt-9'; the pool has: m-small, m-medium, m-large"),
    ("unknown_model_in_available", setter("turns.0.available", ["m-small", "gpt-9"]), "turns[0].available[1]", "unknown model 'gpt-9'"),
    ("available_not_list", setter("turns.0.available", "m-small"), "turns[0].available", "expected list, got str"),
    ("available_item_int", setter("turns.0.available", ["m-small", 3]), "turns[0].available[1]", "expected str, got int"),
    ("available_repeated", setter("turns.0.available", ["m-small", "m-small"]), "turns[0].available[1]", "listed twice"),
    ("model_not_available", setter("turns.0.available", ["m-medium", "m-large"]), "turns[0].available", "does not contain the turn's model 'm-small'"),
    ("empty_turns", setter("turns", []), "turns", "empty"),
    ("outcome_two", setter("outcome", 2), "outcome", "in [0, 1], got 2"),
    ("outcome_above_one", setter("outcome", 1.5), "outcome", "in [0, 1], got 1.5"),
    ("outcome_negative", setter("outcome", -0.25), "outcome", "in [0, 1], got -0.25"),
    ("outcome_bool", setter("outcome", True), "outcome", "expected a number in [0, 1], got bool"),
    ("outcome_false", setter("outcome", False), "outcome", "expected a number in [0, 1], got bool"),
    ("outcome_nan", setter("outcome", math.nan), "outcome", "finite"),
    ("outcome_inf", setter("outcome", math.inf), "outcome", "finite"),
    ("outcome_str", setter("outcome", "1"), "outcome", "got str"),
    ("outcome_null", setter("outcome", None), "outcome", "got null"),
    ("turn_after_terminal", setter("turns.0.done", True), "turns[1]", "turn after the terminal turn turns[0]"),
    ("propensity_zero", setter("turns.0.propensity", 0.0), "turns[0].propensity", "(0, 1]"),
    ("propensity_above_one", setter("turns.0.propensity", 1.5), "turns[0].propensity", "(0, 1]"),
    ("propensity_negative", setter("turns.0.propensity", -0.2), "turns[0].propensity", "(0, 1]"),
    ("propensity_nan", setter("turns.0.propensity", math.nan), "turns[0].propensity", "finite"),
    ("propensity_str", setter("turns.0.propensity", "0.5"), "turns[0].propensity", "expected number, got str"),
    ("empty_episode_id", setter("episode_id", ""), "episode_id", "non-empty"),
    ("blank_episode_id", setter("episode_id", "   "), "episode_id", "non-empty"),
    ("empty_task_id", setter("task.id", ""), "task.id", "non-empty"),
    ("unknown_top_key", setter("reward", 1.0), "reward", "unknown key"),
    ("unknown_task_key", setter("task.difficulty", "hard"), "task.difficulty", "unknown key"),
    ("unknown_turn_key", setter("turns.1.costt", 0.1), "turns[1].costt", "unknown key"),
]


@pytest.mark.parametrize(
    "edit, field, why", [c[1:] for c in BAD_LINE_CASES], ids=[c[0] for c in BAD_LINE_CASES]
)
def test_bad_line_raises_data_error_naming_path_line_field(good_file, pool, edit, field, why):
    corrupt_line(good_file, 2, edit)
    with pytest.raises(DataError) as info:
        read_episodes(good_file, pool)
    err = info.value
    assert (err.path, err.line, err.field) == (str(good_file), 2, field)
    assert why in err.why
    assert str(err) == f"{good_file}:2: field '{field}': {err.why}"


def test_duplicate_episode_id_names_first_line(good_file, pool):
    corrupt_line(good_file, 3, setter("episode_id", "ep-1"))
    with pytest.raises(DataError) as info:
        read_episodes(good_file, pool)
    err = info.value
    assert (err.path, err.line, err.field) == (str(good_file), 3, "episode_id")
    assert "duplicate episode_id 'ep-1'" in err.why and "line 1" in err.why


def test_missing_file_is_a_data_error_without_line(tmp_path, pool):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DataError) as info:
        read_episodes(missing, pool)
    err = info.value
    assert (err.path, err.line, err.field) == (str(missing), None, "<file>")
    assert "does not exist" in err.why
    assert str(err) == f"{missing}: field '<file>': file does not exist"


def test_invalid_utf8_line(good_file, pool):
    data = good_file.read_bytes().split(b"\n")
    data[1] = b'{"episode_id": "\xff"}'
    good_file.write_bytes(b"\n".join(data))
    with pytest.raises(DataError) as info:
        read_episodes(good_file, pool)
    assert (info.value.line, info.value.field) == (2, "<json>")
    assert "UTF-8" in info.value.why


def test_blank_lines_are_skipped_and_counted_in_line_numbers(good_file, pool):
    lines = good_file.read_text(encoding="utf-8").splitlines()
    good_file.write_text("\n" + lines[0] + "\n   \n" + "\n".join(lines[1:]) + "\n\n", encoding="utf-8")
    assert [ep.episode_id for ep in read_episodes(good_file, pool).episodes] == ["ep-1", "ep-2", "ep-3"]
    corrupt_line(good_file, 4, setter("outcome", 7))  # physical line 4 holds ep-2 now
    with pytest.raises(DataError) as info:
        read_episodes(good_file, pool)
    assert (info.value.line, info.value.field) == (4, "outcome")


# --------------------------------------------------------------------- skip_invalid


def test_skip_invalid_keeps_valid_records_around_bad_ones(tmp_path, pool):
    path = tmp_path / "mixed.jsonl"
    write_episodes(path, [make_episode(i) for i in range(1, 6)])
    corrupt_line(path, 2, lambda r: "{not json")
    corrupt_line(path, 4, setter("turns.0.model", "gpt-9"))
    corrupt_line(path, 5, setter("episode_id", "ep-1"))  # duplicate of line 1: skipped
    result = read_episodes(path, pool, skip_invalid=True, max_skipped_fraction=0.6)  # 3 of 5 lines skipped
    assert [ep.episode_id for ep in result.episodes] == ["ep-1", "ep-3"]
    assert result.episodes[0] == make_episode(1)  # first occurrence of the duplicate kept
    assert [(e.line, e.field) for e in result.skipped] == [
        (2, "<json>"), (4, "turns[0].model"), (5, "episode_id"),
    ]
    assert all(e.path == str(path) for e in result.skipped)
    with pytest.raises(DataError) as info:
        read_episodes(path, pool)
    assert info.value.line == 2


def test_skip_invalid_on_clean_file_skips_nothing(good_file, pool):
    result = read_episodes(good_file, pool, skip_invalid=True)
    assert len(result.episodes) == 3 and result.skipped == []


# ----------------------------------------------------------------------- round trip


def test_round_trip_gives_equal_episodes(good_file, pool):
    expected = [make_episode(i, outcome=i % 2) for i in range(1, 4)]
    assert read_episodes(good_file, pool).episodes == expected


def test_graded_outcomes_round_trip_as_written(tmp_path, pool):
    path = tmp_path / "graded.jsonl"
    write_episodes(path, [make_episode(1, outcome=0), make_episode(2, outcome=1), make_episode(3, outcome=0.25)])
    written = [json.loads(line)["outcome"] for line in path.read_text(encoding="utf-8").splitlines()]
    assert [(y, type(y)) for y in written] == [(0, int), (1, int), (0.25, float)]  # an int stays an int
    read = read_episodes(path, pool).episodes
    assert [(e.outcome, type(e.outcome)) for e in read] == [(0, int), (1, int), (0.25, float)]
    assert summarize_episodes(EpisodeFile(read, []), pool)["mean_outcome"] == pytest.approx(1.25 / 3)
    corrupt_line(path, 2, setter("outcome", 1.0))  # a float at either end is as valid as the int
    assert read_episodes(path, pool).episodes[1].outcome == 1.0


def test_round_trip_normalises_last_turn_done_and_minimal_optionals(tmp_path, pool):
    bare = Episode(
        "bare", Task("t", "p"),
        [Turn("m-medium", "r", "f", 0, 0, 0, available=["m-medium"])],  # lists, done=False
        0,
    )
    assert bare.turns[-1].done is True and bare.turns[0].available == ("m-medium",)
    path = tmp_path / "bare.jsonl"
    write_episodes(path, iter([bare]))
    record = json.loads(path.read_text(encoding="utf-8"))
    assert record["turns"][0]["done"] is True
    assert "family" not in record["task"] and "propensity" not in record["turns"][0]
    assert read_episodes(path, pool).episodes == [bare]


def test_to_json_writes_done_for_every_turn_and_omits_none(good_file):
    record = json.loads(good_file.read_text(encoding="utf-8").splitlines()[1])  # ep-2
    assert [t["done"] for t in record["turns"]] == [False, True]
    assert "family" not in record["task"]
    assert "propensity" not in record["turns"][1] and "available" not in record["turns"][1]


def test_write_is_utf8_and_atomic(tmp_path, pool):
    path = tmp_path / "u.jsonl"
    ep = Episode("ü-1", Task("t", "Größe? 日本"), (Turn("m-small", "é", "", 1, 1, 0.0),), 1)
    write_episodes(path, [ep])
    assert "日本" in path.read_text(encoding="utf-8")
    assert [p.name for p in tmp_path.iterdir()] == ["u.jsonl"]  # no temp file left behind
    bad = dataclasses.replace(ep, turns=(dataclasses.replace(ep.turns[0], cost=math.nan),))
    with pytest.raises(ValueError):
        write_episodes(path, [bad])
    assert read_episodes(path, pool).episodes == [ep]  # failed write left the old file intact
    assert [p.name for p in tmp_path.iterdir()] == ["u.jsonl"]


def test_episode_from_json_in_memory(pool):
    record = make_episode(1).to_json()
    assert Episode.from_json(record, pool) == make_episode(1)
    record["outcome"] = 3
    with pytest.raises(DataError) as info:
        Episode.from_json(record, pool)
    assert str(info.value) == "<memory>: field 'outcome': must be a number in [0, 1], got 3"


# --------------------------------------------------------------- model cards / pool


def test_model_card_capability_and_json_round_trip(pool):
    card = pool.cards[0]
    assert card.capability("code") is True
    assert card.capability("math") is None
    assert card.capability("vision") is None
    assert ModelCard.from_json(card.to_json()) == card
    unordered = ModelCard("x", "d", capabilities=(("z", True), ("a", False)))
    assert unordered.capabilities == (("a", False), ("z", True))


def test_model_card_reads_structured_fields_and_validates_fields():
    obj = {"name": "x", "description": "d", "family": "F", "open_weights": True, "capabilities": {"code": None}}
    card = ModelCard.from_json({**obj, "parameters_b": 13})
    assert card == ModelCard("x", "d", capabilities=(("code", None),), family="F", open_weights=True,
                             parameters_b=13.0)
    assert ModelCard.from_json(card.to_json()) == card
    # a card without them writes the JSON it always wrote (checkpoints' card files keep their digests)
    assert set(ModelCard("x", "d").to_json()) == {"name", "provider", "context_length", "price_in_per_mtok",
                                                  "price_out_per_mtok", "capabilities", "description"}
    for key, bad in (("open_weights", "yes"), ("parameters_b", -1), ("family", 3)):
        with pytest.raises(DataError) as info:
            ModelCard.from_json({**obj, key: bad})
        assert info.value.field == key
    with pytest.raises(DataError) as info:
        ModelCard.from_json({**obj, "price_in_per_mtok": "1.0"}, path="c.json", prefix="models[2].")
    assert (info.value.path, info.value.field) == ("c.json", "models[2].price_in_per_mtok")
    with pytest.raises(DataError) as info:
        ModelCard.from_json({**obj, "capabilities": {"code": "yes"}})
    assert info.value.field == "capabilities.code"
    with pytest.raises(DataError) as info:
        ModelCard.from_json({"description": "d"})
    assert info.value.field == "name" and "missing" in info.value.why


def test_cache_prices_price_cached_and_written_prompt_tokens_and_old_cards_cost_as_before():
    cached = ModelCard.from_json({"name": "x", "description": "d", "price_in_per_mtok": 2.0, "price_out_per_mtok": 8.0,
                                  "price_cached_in_per_mtok": 0.2, "price_cache_write_per_mtok": 2.5})
    assert ModelCard.from_json(cached.to_json()) == cached
    # 1000 prompt tokens: 600 read from the cache, 300 written to it, 100 fresh; 100 completion tokens
    assert cached.call_cost(1000, 100, 600, 300) == pytest.approx((2.0 * 100 + 0.2 * 600 + 2.5 * 300 + 8.0 * 100) / 1e6)
    assert cached.call_cost(1000, 100) == pytest.approx((2.0 * 1000 + 8.0 * 100) / 1e6)   # nothing cached
    plain = dataclasses.replace(cached, price_cached_in_per_mtok=None, price_cache_write_per_mtok=None)
    assert plain.call_cost(1000, 100, 600, 300) == pytest.approx((2.0 * 1000 + 8.0 * 100) / 1e6)   # as before caching
    assert ModelCard("x", "d").call_cost(10, 1) is None
    assert not set(plain.to_json()) & {"price_cached_in_per_mtok", "price_cache_write_per_mtok"}   # digests kept
    with pytest.raises(ValueError, match="parts of the 100 prompt tokens"):
        cached.call_cost(100, 1, 80, 30)
    with pytest.raises(DataError) as info:
        ModelCard.from_json({**cached.to_json(), "price_cached_in_per_mtok": -0.1})
    assert info.value.field == "price_cached_in_per_mtok"
    # the network never reads them: a checkpoint's pool without them is the same pool to it
    assert ModelPool((plain,)).differences(ModelPool((cached,))) == []


def test_a_turns_cached_and_cache_written_tokens_round_trip_and_are_parts_of_its_prompt(tmp_path):
    pool = ModelPool((ModelCard("m", "d"),))
    turn = {"model": "m", "response": "r", "feedback": "", "prompt_tokens": 100, "completion_tokens": 5,
            "cost": 0.001, "cached_tokens": 60, "cache_write_tokens": 40, "done": True}
    record = {"episode_id": "e", "task": {"id": "t", "prompt": "p"}, "turns": [turn], "outcome": 1}
    episode = Episode.from_json(record, pool)
    assert (episode.turns[0].cached_tokens, episode.turns[0].cache_write_tokens) == (60, 40)
    assert episode.to_json() == record
    bare = Episode.from_json({**record, "turns": [{k: v for k, v in turn.items() if "cache" not in k}]}, pool)
    assert bare.turns[0].cached_tokens is None and "cached_tokens" not in bare.turns[0].to_json()
    for edit, field in (({"cached_tokens": 61}, "turns[0].cache_write_tokens"),
                        ({"cached_tokens": 101, "cache_write_tokens": None}, "turns[0].cached_tokens"),
                        ({"cache_write_tokens": -1}, "turns[0].cache_write_tokens")):
        with pytest.raises(DataError) as info:
            Episode.from_json({**record, "turns": [{**turn, **edit}]}, pool, path="e.jsonl", line=3)
        assert (info.value.path, info.value.line, info.value.field) == ("e.jsonl", 3, field)


def test_model_pool_basics(pool):
    assert pool.names == ("m-small", "m-medium", "m-large")
    assert len(pool) == 3 and "m-large" in pool and "gpt-9" not in pool
    assert pool.index("m-medium") == 1
    with pytest.raises(KeyError, match="m-small, m-medium, m-large"):
        pool.index("gpt-9")
    assert pool.capability_names == ("code", "math", "tool_use")
    sub = pool.subset(["m-large", "m-small"])
    assert sub.names == ("m-large", "m-small") and sub.cards[0] is pool.cards[2]
    assert ModelPool.from_json(pool.to_json()) == pool


def test_model_pool_rejects_empty_and_duplicates(pool):
    with pytest.raises(DataError, match="at least one"):
        ModelPool(())
    with pytest.raises(DataError) as info:
        ModelPool((pool.cards[0], pool.cards[1], pool.cards[0]))
    assert info.value.field == "models[2].name" and "duplicate model name 'm-small'" in info.value.why
    with pytest.raises(DataError) as info:
        ModelPool.from_json({"models": [pool.cards[0].to_json()] * 2}, path="cards.json")
    assert (info.value.path, info.value.field) == ("cards.json", "models[1].name")


def test_model_pool_differences(pool):
    assert pool.differences(make_pool()) == []
    cheaper = dataclasses.replace(pool.cards[1], price_in_per_mtok=1.5, capabilities=(("code", True),))
    other = ModelPool((pool.cards[0], cheaper, ModelCard("m-new", "New.")))
    diffs = pool.differences(other)
    assert "model 'm-large' only in this pool" in diffs
    assert "model 'm-new' only in the other pool" in diffs
    assert "model 'm-medium': price_in_per_mtok 2.0 != 1.5" in diffs
    assert "model 'm-medium': capability 'tool_use' False != absent" in diffs
    assert len(diffs) == 4
    # what only the card prior reads is no difference to a checkpoint (one saved before it was read has nulls)
    described = ModelPool(tuple(dataclasses.replace(c, family="F", open_weights=True, parameters_b=7.0)
                                for c in pool.cards))
    assert pool.differences(described) == [] and described.differences(pool) == []
    assert pool.differences(pool.subset(["m-medium", "m-small", "m-large"])) == [
        "model order differs: ['m-small', 'm-medium', 'm-large'] != ['m-medium', 'm-small', 'm-large']"
    ]


def test_model_cards_file_round_trip_and_errors(tmp_path, pool):
    path = tmp_path / "cards.json"
    write_model_cards(path, pool)
    assert read_model_cards(path) == pool
    path.write_text('{"models": [', encoding="utf-8")
    with pytest.raises(DataError) as info:
        read_model_cards(path)
    assert (info.value.path, info.value.field) == (str(path), "<json>")
    with pytest.raises(DataError) as info:
        read_model_cards(tmp_path / "missing.json")
    assert (info.value.line, info.value.field) == (None, "<file>")


def test_read_real_model_cards():
    cards_path = SHARED_MINT / "model_cards.json"
    if not SHARED_MINT.is_dir():
        pytest.skip(f"shared MINT data not present at {SHARED_MINT}")
    pool = read_model_cards(cards_path)
    assert len(pool) == 6
    assert "gpt-4-0613" in pool and "Mixtral-8x7B-Instruct-v0.1" in pool
    gpt35 = pool.cards[pool.index("gpt-3.5-turbo-0613")]
    assert (gpt35.price_in_per_mtok, gpt35.price_out_per_mtok) == (1.5, 2.0)
    assert gpt35.capability("math") is None and gpt35.capability("tool_use") is True
    assert pool.capability_names == ("code", "math", "tool_use")


# ---------------------------------------------------------------- summary / launcher


def test_summarize_episodes(good_file, pool):
    summary = summarize_episodes(read_episodes(good_file, pool), pool)
    assert summary["episodes"] == 3 and summary["turns"] == 6
    assert summary["mean_outcome"] == pytest.approx(2 / 3)  # outcomes 1, 0, 1
    assert summary["mean_turns"] == 2.0
    assert summary["total_cost"] == pytest.approx(3 * (0.00031 + 0.0126))
    assert summary["turns_per_model"] == {"m-small": 3, "m-medium": 0, "m-large": 3}
    assert summary["skipped"] == 0
    empty = summarize_episodes(EpisodeFile([], []), pool)
    assert empty["mean_outcome"] is None and empty["total_cost"] == 0.0


def run_launcher(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launch.validate_data", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )


def test_launcher_exit_codes(tmp_path, good_file, pool):
    cards = tmp_path / "cards.json"
    write_model_cards(cards, pool)
    write_episodes(good_file, [make_episode(i, outcome=i % 2) for i in range(1, 11)])  # 1 bad of 10: skippable
    ok = run_launcher(f"--episodes={good_file}", f"--cards={cards}")
    assert ok.returncode == 0, ok.stderr
    assert "episodes:       10" in ok.stdout and "m-large" in ok.stdout
    assert "mean outcome:   0.500" in ok.stdout  # outcomes i % 2 for i = 1..10

    corrupt_line(good_file, 2, setter("turns.0.cost", -1))
    bad = run_launcher(f"--episodes={good_file}", f"--cards={cards}")
    assert bad.returncode == 1
    assert f"{good_file}:2: field 'turns[0].cost'" in bad.stdout + bad.stderr
    assert "Traceback" not in bad.stderr

    skipping = run_launcher(f"--episodes={good_file}", f"--cards={cards}", "--skip_invalid")
    assert skipping.returncode == 0, skipping.stderr
    assert "skipped lines:  1" in skipping.stdout
    assert f"{good_file}:2: field 'turns[0].cost'" in skipping.stdout


def test_several_episode_files_read_as_one_corpus_with_ids_unique_across_them(tmp_path):
    from rivet_jax.data.files import episode_paths

    pool = make_pool()
    write_episodes(tmp_path / "a.jsonl", [make_episode(0), make_episode(1)])
    write_episodes(tmp_path / "b.jsonl", [make_episode(2)])
    assert episode_paths(f"{tmp_path}/a.jsonl, {tmp_path}/b.jsonl") == [f"{tmp_path}/a.jsonl", f"{tmp_path}/b.jsonl"]
    assert episode_paths(f"{tmp_path}/*.jsonl") == [f"{tmp_path}/a.jsonl", f"{tmp_path}/b.jsonl"]
    both = read_episodes(episode_paths(f"{tmp_path}/*.jsonl"), pool)
    assert [e.episode_id for e in both.episodes] == ["ep-0", "ep-1", "ep-2"]
    with pytest.raises(DataError, match="no file matches"):
        episode_paths(f"{tmp_path}/none-*.jsonl")
    write_episodes(tmp_path / "c.jsonl", [make_episode(1), make_episode(3)])   # ep-1 again, in another file
    with pytest.raises(DataError) as raised:
        read_episodes([tmp_path / "a.jsonl", tmp_path / "c.jsonl"], pool)
    assert raised.value.path == str(tmp_path / "c.jsonl") and raised.value.line == 1
    assert f"first on {tmp_path / 'a.jsonl'}:2" in str(raised.value)
    skipped = read_episodes([tmp_path / "a.jsonl", tmp_path / "c.jsonl"], pool, skip_invalid=True,
                            max_skipped_fraction=1.0)
    assert [e.episode_id for e in skipped.episodes] == ["ep-0", "ep-1", "ep-3"] and len(skipped.skipped) == 1


def test_one_task_id_with_two_prompts_is_refused_naming_both_places(tmp_path):
    pool = make_pool()
    other = dataclasses.replace(make_episode(3), episode_id="ep-x",
                                task=dataclasses.replace(make_episode(1).task, prompt="Something else"))
    write_episodes(tmp_path / "a.jsonl", [make_episode(0), make_episode(1), other])
    with pytest.raises(DataError) as raised:
        read_episodes(tmp_path / "a.jsonl", pool)
    assert (raised.value.line, raised.value.field) == (3, "task.prompt") and "than on line 2" in str(raised.value)


def test_a_card_name_with_surrounding_white_space_is_refused(tmp_path):
    cards = json.loads(json.dumps({"models": [{"name": "gpt-4", "description": "a"},
                                              {"name": "gpt-4 ", "description": "b"}]}))
    (tmp_path / "cards.json").write_text(json.dumps(cards))
    with pytest.raises(DataError, match="white space"):
        read_model_cards(tmp_path / "cards.json")
