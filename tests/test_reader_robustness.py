"""Issue 14, the reader: no input file makes the episode or card reader fail with anything but a `DataError` naming
the file, the line and the field, and skip mode keeps every valid line around a bad one.

Each test writes its own small files under tmp_path; records are JSON text built here (`dumps` writes objects from
(key, value) pairs, so a test can repeat a key, and `Raw` pastes text no Python value serialises to: a 5,001-digit
integer, 100k-deep nesting)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from rivet_jax.data.schema import DataError, ModelCard, ModelPool, read_episodes, read_model_cards, write_model_cards

POOL = ModelPool((ModelCard("m-a", "Cheap.", 4096, 0.5, 1.0, (("code", True),), "Acme"),
                  ModelCard("m-b", "Dear.", 8192, 10.0, 30.0)))


class Raw(str):
    """JSON text pasted as is."""


class Pairs(list):
    """A JSON object as (key, value) pairs, so a key may repeat."""


def dumps(value) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        value = Pairs(value.items())
    if isinstance(value, Pairs):
        return "{" + ", ".join(f"{json.dumps(k)}: {dumps(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(dumps(v) for v in value) + "]"
    return json.dumps(value)  # a lone surrogate in a str comes out as the escape \udXXX


def record(episode_id: str) -> dict:
    turn = {"model": "m-a", "response": "print(4)", "feedback": "Observation: 4", "prompt_tokens": 10,
            "completion_tokens": 5, "cost": 0.001, "propensity": 0.5, "available": ["m-a", "m-b"], "done": False}
    last = {**turn, "model": "m-b", "feedback": "", "cost": 0.01, "done": True}
    return {"episode_id": episode_id, "task": {"id": f"t-{episode_id}", "prompt": "2+2?", "family": "arith"},
            "turns": [turn, last], "outcome": 1}


def set_at(obj, path: tuple, value) -> None:
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


def write_lines(path: Path, lines: list[str], newline: str = "\n") -> Path:
    path.write_bytes(newline.join(lines).encode("utf-8") + newline.encode())
    return path


def with_bad_line(tmp_path: Path, bad: str, n: int = 5) -> Path:
    """n valid records with `bad` as line 2."""
    lines = [dumps(record(f"ep-{i}")) for i in range(n)]
    return write_lines(tmp_path / "episodes.jsonl", lines[:1] + [bad] + lines[1:])


def bad_record(path: tuple, value) -> str:
    obj = record("bad")
    set_at(obj, path, value)
    return dumps(obj)


def read_both_ways(path: Path, line: int, field: str, n: int = 5) -> DataError:
    """The strict reader's DataError at (line, field); skip mode skips that line only and keeps the n valid ones."""
    with pytest.raises(DataError) as info:
        read_episodes(path, POOL)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), line, field), str(err)
    str(err).encode("utf-8")  # printable: a message never carries a lone surrogate
    kept = read_episodes(path, POOL, skip_invalid=True, max_skipped_fraction=0.5)
    assert [e.episode_id for e in kept.episodes] == [f"ep-{i}" for i in range(n)]
    assert [(e.line, e.field) for e in kept.skipped] == [(line, field)]
    return err


# ------------------------------------------------------------- 1. numbers and nesting the JSON module cannot hold

HUGE_401 = Raw("1" + "0" * 400)      # an int Python holds; float() of it overflows
HUGE_5001 = Raw("1" + "0" * 5000)    # past Python's int-string conversion limit (4300 digits)
DEEP = Raw("[" * 200_000 + "]" * 200_000)  # past the recursion limit of json's decoder

HUGE_CASES = [
    ("cost_401_digits", ("turns", 0, "cost"), HUGE_401, "turns[0].cost", "too large"),
    ("propensity_401_digits", ("turns", 1, "propensity"), HUGE_401, "turns[1].propensity", "too large"),
    ("tokens_401_digits", ("turns", 0, "prompt_tokens"), HUGE_401, "turns[0].prompt_tokens", "64-bit"),
    ("outcome_401_digits", ("outcome",), HUGE_401, "outcome", "integer of about 401 digits"),
    ("cost_5001_digits", ("turns", 0, "cost"), HUGE_5001, "<json>", "4300 digits"),
    ("deep_nesting", ("outcome",), DEEP, "<json>", "nested too deeply"),
]


@pytest.mark.parametrize("where, value, field, why", [c[1:] for c in HUGE_CASES], ids=[c[0] for c in HUGE_CASES])
def test_huge_numbers_and_deep_nesting_are_data_errors_of_their_line(tmp_path, where, value, field, why):
    err = read_both_ways(with_bad_line(tmp_path, bad_record(where, value)), 2, field)
    assert why in err.why and len(err.why) < 300


def cards_text(edit=None) -> str:
    obj = POOL.to_json()
    if edit is not None:
        edit(obj)
    return dumps(obj)


CARD_CASES = [
    ("price_401_digits", ("models", 0, "price_in_per_mtok"), HUGE_401, "models[0].price_in_per_mtok"),
    ("context_401_digits", ("models", 1, "context_length"), HUGE_401, "models[1].context_length"),
    ("price_5001_digits", ("models", 0, "price_in_per_mtok"), HUGE_5001, "<json>"),
    ("deep_nesting", ("models", 0, "capabilities"), DEEP, "<json>"),
    ("surrogate_description", ("models", 1, "description"), "Dear \ud800", "models[1].description"),
    ("surrogate_name", ("models", 1, "name"), "m-\udfff", "models[1].name"),
    ("surrogate_capability", ("models", 0, "capabilities"), {"c\ud800de": True}, "models[0].capabilities.c\\ud800de"),
    ("typo_price", ("models", 0, "pirce_in_per_mtok"), 0.5, "models[0].pirce_in_per_mtok"),
    ("unknown_top_key", ("modles",), [], "modles"),
]


@pytest.mark.parametrize("where, value, field", [c[1:] for c in CARD_CASES], ids=[c[0] for c in CARD_CASES])
def test_bad_model_cards_are_data_errors_of_the_file(tmp_path, where, value, field):
    path = tmp_path / "cards.json"
    path.write_text(cards_text(lambda obj: set_at(obj, where, value)), encoding="utf-8")
    with pytest.raises(DataError) as info:
        read_model_cards(path)
    assert (info.value.path, info.value.field) == (str(path), field), str(info.value)
    str(info.value).encode("utf-8")


def test_unknown_card_key_suggests_the_closest_known_key(tmp_path):
    path = tmp_path / "cards.json"
    path.write_text(cards_text(lambda obj: obj["models"][0].update(pirce_in_per_mtok=0.5)), encoding="utf-8")
    with pytest.raises(DataError, match="did you mean 'price_in_per_mtok'"):
        read_model_cards(path)
    metadata = cards_text(lambda obj: obj["models"][0].update(family="F", open_weights=False))
    path.write_text(metadata.replace('{"models"', '{"note": "free text", "models"'), encoding="utf-8")
    read = read_model_cards(path)  # the documented structured keys are accepted, and read
    assert (read.cards[0].family, read.cards[0].open_weights) == ("F", False)
    assert read.cards[1:] == POOL.cards[1:]


def repeat_in_card(key: str, value) -> Callable[[dict], dict]:
    def edit(obj: dict) -> dict:
        obj["models"][0] = Pairs([*obj["models"][0].items(), (key, value)])
        return obj
    return edit


def repeat_capability(obj: dict) -> dict:
    obj["models"][0]["capabilities"] = Pairs([("code", True), ("code", False)])
    return obj


DUPLICATE_CARD_CASES = [
    ("top_level", lambda obj: Pairs([("models", obj["models"]), ("models", [])]), "models"),
    ("card_price", repeat_in_card("price_in_per_mtok", 99.0), "models[0].price_in_per_mtok"),
    ("card_name", repeat_in_card("name", "m-c"), "models[0].name"),
    ("capability", repeat_capability, "models[0].capabilities.code"),
]


@pytest.mark.parametrize("edit, field", [c[1:] for c in DUPLICATE_CARD_CASES], ids=[c[0] for c in DUPLICATE_CARD_CASES])
def test_duplicate_keys_in_cards_are_data_errors_naming_the_key(tmp_path, edit, field):
    path = tmp_path / "cards.json"
    path.write_text(dumps(edit(POOL.to_json())), encoding="utf-8")
    with pytest.raises(DataError) as info:
        read_model_cards(path)
    assert (info.value.path, info.value.field) == (str(path), field)
    assert f"duplicate key '{field.split('.')[-1]}'" in info.value.why


def test_duplicate_keys_in_an_episode_name_the_key(tmp_path):
    obj = record("bad")
    obj["turns"][0] = Pairs([*obj["turns"][0].items(), ("cost", 5.0)])
    err = read_both_ways(with_bad_line(tmp_path, dumps(obj)), 2, "turns[0].cost")
    assert "duplicate key 'cost'" in err.why


# ---------------------------------------------------------------------------------------- 2. lone surrogates

SURROGATE_CASES = [
    ("prompt", ("task", "prompt"), "task.prompt"),
    ("task_id", ("task", "id"), "task.id"),
    ("family", ("task", "family"), "task.family"),
    ("episode_id", ("episode_id",), "episode_id"),
    ("response", ("turns", 0, "response"), "turns[0].response"),
    ("feedback", ("turns", 1, "feedback"), "turns[1].feedback"),
    ("model", ("turns", 1, "model"), "turns[1].model"),
]


@pytest.mark.parametrize("where, field", [c[1:] for c in SURROGATE_CASES], ids=[c[0] for c in SURROGATE_CASES])
@pytest.mark.parametrize("surrogate", ["\ud800", "\udc00"])
def test_lone_surrogates_are_rejected_naming_the_field(tmp_path, where, field, surrogate):
    err = read_both_ways(with_bad_line(tmp_path, bad_record(where, f"text {surrogate} more")), 2, field)
    assert "lone surrogate" in err.why


def test_surrogate_in_a_key_and_paired_surrogates(tmp_path):
    obj = record("bad")
    obj["task"]["x\ud800"] = "y"
    read_both_ways(with_bad_line(tmp_path, dumps(obj)), 2, "task.x\\ud800")
    paired = with_bad_line(tmp_path, bad_record(("task", "prompt"), "emoji \U0001f600"))  # "\ud83d\ude00": valid
    assert read_episodes(paired, POOL).episodes[1].task.prompt == "emoji \U0001f600"


# ------------------------------------------------------------------------ 3. empty files and the skip limit


@pytest.mark.parametrize("content", ["", "\n\n  \n"], ids=["empty", "blank_lines"])
@pytest.mark.parametrize("skip", [False, True])
def test_a_file_without_records_is_an_error(tmp_path, content, skip):
    path = tmp_path / "episodes.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError) as info:
        read_episodes(path, POOL, skip_invalid=skip)
    assert (info.value.path, info.value.line, info.value.field) == (str(path), None, "<file>")
    assert "no episodes" in info.value.why


def test_a_file_whose_every_line_is_skipped_is_an_error(tmp_path):
    path = write_lines(tmp_path / "episodes.jsonl", ["{", "[]", dumps(record("x")).replace("m-a", "gpt-9")])
    with pytest.raises(DataError) as info:
        read_episodes(path, POOL, skip_invalid=True, max_skipped_fraction=1.0)
    assert info.value.field == "<file>" and "no episodes" in info.value.why and "all 3" in info.value.why


def test_skip_mode_fails_past_max_skipped_fraction(tmp_path):
    lines = [dumps(record(f"ep-{i}")) for i in range(10)]
    one_bad = write_lines(tmp_path / "one.jsonl", ["{"] + lines[1:])  # 1 of 10: at the default limit, allowed
    assert len(read_episodes(one_bad, POOL, skip_invalid=True).episodes) == 9
    two_bad = write_lines(tmp_path / "two.jsonl", ["{", "{"] + lines[2:])  # 2 of 10
    with pytest.raises(DataError) as info:
        read_episodes(two_bad, POOL, skip_invalid=True)
    assert info.value.field == "<file>" and "2 of 10" in info.value.why and "max_skipped_fraction" in info.value.why
    assert len(read_episodes(two_bad, POOL, skip_invalid=True, max_skipped_fraction=0.2).episodes) == 8
    with pytest.raises(ValueError, match="max_skipped_fraction"):
        read_episodes(one_bad, POOL, skip_invalid=True, max_skipped_fraction=1.5)


# ------------------------------------------------------------------------------------------- 4. line breaks


@pytest.mark.parametrize("newline", ["\r", "\r\n", "\n"], ids=["cr", "crlf", "lf"])
def test_every_line_break_style_is_read_with_the_right_line_numbers(tmp_path, newline):
    lines = [dumps(record(f"ep-{i}")) for i in range(60)]
    path = write_lines(tmp_path / "episodes.jsonl", lines, newline)
    assert len(read_episodes(path, POOL, skip_invalid=True).episodes) == 60
    lines[41] = "{"
    path = write_lines(tmp_path / "episodes.jsonl", lines, newline)
    result = read_episodes(path, POOL, skip_invalid=True)
    assert len(result.episodes) == 59 and [e.line for e in result.skipped] == [42]


def test_mixed_line_breaks_count_each_one_line(tmp_path):
    lines = [dumps(record(f"ep-{i}")).encode() for i in range(4)]
    path = tmp_path / "episodes.jsonl"
    path.write_bytes(lines[0] + b"\r\n" + lines[1] + b"\r" + b"{\n" + lines[2] + b"\r\r\n" + lines[3])
    result = read_episodes(path, POOL, skip_invalid=True, max_skipped_fraction=0.5)
    assert [e.episode_id for e in result.episodes] == ["ep-0", "ep-1", "ep-2", "ep-3"]
    assert [e.line for e in result.skipped] == [3]


# ---------------------------------------------------------------------------------------------------- 7. fuzz

NEIGHBOURS = 4
ODD_VALUES = [None, True, 0, -1, 1.5, "", "x", [], {}, HUGE_401, HUGE_5001, Raw("1e400"), Raw("NaN"), Raw("-Infinity"),
              Raw("[" * 100_000 + "]" * 100_000), "\ud800", "a\udfffb", "gpt-9", 2 ** 70]


def paths_of(obj, prefix=()):
    """Every (key or index) path into a JSON value."""
    found = []
    if isinstance(obj, Pairs):  # an object with a repeated key is left as it is
        return found
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, child in items:
        found.append(prefix + (key,))
        found += paths_of(child, prefix + (key,))
    return found


def mutate_object(obj, rng: random.Random):
    """One structural mutation of a parsed record: delete / duplicate a key, or put an odd value somewhere."""
    paths = paths_of(obj)
    path = rng.choice(paths) if paths else ()
    kind = rng.choice(["delete", "duplicate", "replace", "replace", "add_key"])
    if not path:
        return rng.choice(ODD_VALUES)
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    if kind == "delete":
        del parent[path[-1]]
    elif kind == "duplicate" and isinstance(parent, dict):
        doubled = Pairs([*parent.items(), (path[-1], rng.choice(ODD_VALUES))])
        if not path[:-1]:
            return doubled
        set_at(obj, path[:-1], doubled)
    elif kind == "add_key" and isinstance(parent, dict):
        parent[rng.choice(["costt", "\ud800", "", "pirce_in_per_mtok", "note"])] = rng.choice(ODD_VALUES)
    else:
        parent[path[-1]] = rng.choice(ODD_VALUES)
    return obj


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """One byte-level mutation: truncate, overwrite or insert random bytes (line breaks and bad UTF-8 included)."""
    kind = rng.choice(["truncate", "overwrite", "insert"])
    at = rng.randrange(len(data) + 1)
    if kind == "truncate":
        return data[:at]
    noise = bytes(rng.choice(b"\n\r\x00\xff\xc3\x80\"\\{}[],:0123456789aeu ") for _ in range(rng.randint(1, 4)))
    return data[:at] + noise + data[at + (len(noise) if kind == "overwrite" else 0):]


def mutant(rng: random.Random, make) -> bytes:
    """A valid document from `make`, mutated 1-3 times at the object level, then maybe at the byte level."""
    obj = make()
    for _ in range(rng.randint(1, 3)):
        obj = mutate_object(obj, rng) if isinstance(obj, (dict, list)) else obj
    data = dumps(obj).encode("utf-8")
    return mutate_bytes(data, rng) if rng.random() < 0.4 else data


def check_error(err: DataError, path: Path, with_line: bool) -> None:
    assert err.path == str(path) and err.field, str(err)
    assert not with_line or (isinstance(err.line, int) and err.line >= 1), str(err)
    str(err).encode("utf-8")


def test_fuzzed_episode_files_give_episodes_or_data_errors(tmp_path):
    rng = random.Random(14)
    path = tmp_path / "episodes.jsonl"
    for case in range(300):
        neighbours = [dumps(record(f"ep-{i}")).encode() for i in range(NEIGHBOURS)]
        bad = mutant(rng, lambda: record("victim"))
        newline = rng.choice([b"\n", b"\r\n", b"\r"])
        lines = neighbours[:2] + [bad] + neighbours[2:] + ([bad] if rng.random() < 0.1 else [])
        path.write_bytes(newline.join(lines) + newline)
        try:
            strict = read_episodes(path, POOL)
            assert [e.episode_id for e in strict.episodes][:2] == ["ep-0", "ep-1"], case
        except DataError as err:
            check_error(err, path, with_line=True)
        kept = read_episodes(path, POOL, skip_invalid=True, max_skipped_fraction=1.0)
        ids = [e.episode_id for e in kept.episodes]
        assert [i for i in ids if i.startswith("ep-")] == [f"ep-{i}" for i in range(NEIGHBOURS)], (case, bad)
        for err in kept.skipped:
            check_error(err, path, with_line=True)


def test_fuzzed_card_files_give_pools_or_data_errors(tmp_path):
    rng = random.Random(41)
    path = tmp_path / "cards.json"
    write_model_cards(path, POOL)
    assert read_model_cards(path) == POOL
    for _ in range(200):
        path.write_bytes(mutant(rng, POOL.to_json))
        try:
            assert isinstance(read_model_cards(path), ModelPool)
        except DataError as err:
            check_error(err, path, with_line=False)
