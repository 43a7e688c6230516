"""A decode job's wall-time request (`targetrows.cost.job_time`): the bound of one token per
round, each round as dear as its decoder's can be, worked out here pass by pass."""

from __future__ import annotations

import json
import math

import pytest

from targetrows.core.pool import PoolShape
from targetrows.cost.job_time import (
    DecodeWork,
    MeasuredPair,
    decode_minutes,
    decode_seconds,
    decode_work,
)
from targetrows.cost.parttimes import PartTimes, PassCurve
from targetrows.cost.rounds import DEFAULT_BUDGETS
from targetrows.decoding.budget import Auto, Fixed, Matched
from targetrows.decoding.registry import get_decoder

# a target pass costs 10 ms + 1 ms per fed token, a draft pass 2 ms + 0.5 ms per token
TARGET = PassCurve((1, 2, 200), (0.011, 0.012, 0.210))
DRAFT = PassCurve((1, 2, 20), (0.0025, 0.003, 0.012))
OVER = 0.0015  # a round's own work besides its passes
PAIR = MeasuredPair(PartTimes(TARGET, DRAFT, 100, draft_refeeds=True), prefill_s=0.5,
                    longest_turn=300, turns=14, load_s=30.0, round_overhead_s=OVER)
POOL = PoolShape(top_k=10, depth=6)


def target_s(n):
    return 0.010 + 0.001 * n


def draft_s(n):
    return 0.002 + 0.0005 * n


def test_each_decoder_is_bounded_by_its_dearest_rounds_pass_by_pass():
    new = 32
    # ar: a one-token step per token
    ar = decode_work(get_decoder("ar"), [Fixed(1)], new, POOL)
    assert decode_seconds(PAIR, ar) == pytest.approx(14 * (0.5 + new * (OVER + target_s(1))))
    # fts at 16 and auto: three conditions (auto's calibration one more), every round at
    # auto's largest candidate: verify of the tree and t0, root pass, 6 levels of the pool
    # (the root, then 10 nodes each), the head's first pass feeding the last round's tokens
    # again (t0, a path of at most 6, the bonus)
    fts = decode_work(get_decoder("fts"), [Fixed(16), Auto()], new, POOL)
    assert fts.conditions == 3
    largest = max(DEFAULT_BUDGETS)
    round_s = OVER + target_s(largest + 1) + target_s(1) + draft_s(8) + 5 * draft_s(10)
    assert decode_seconds(PAIR, fts) == pytest.approx(3 * 14 * (0.5 + new * round_s))
    # draft_rank verifies the root with its tree and has no root pass; its pool is pruned to
    # what a tree of 8 can use (7 frontier nodes a level)
    rank = decode_work(get_decoder("draft_rank"), [Fixed(8)], new, POOL)
    assert decode_seconds(PAIR, rank) == pytest.approx(
        14 * (0.5 + new * (OVER + target_s(9) + 6 * draft_s(7))))
    # racer drafts nothing: its tree comes from the target's rows
    racer = decode_work(get_decoder("racer"), [Fixed(8)], new, POOL)
    assert decode_seconds(PAIR, racer) == pytest.approx(14 * (0.5 + new * (OVER + target_s(9))))


def test_a_redraft_is_bounded_with_its_second_pool_and_draft_free_calibration_by_its_union():
    new = 32
    # fts_redraft: the root and its 2 guesses, then 5 levels of 2 x 10; when the guesses miss
    # t0, a pool under t0 after the root pass (the root, then 5 levels of 10)
    redraft = decode_work(get_decoder("fts_redraft"), [Fixed(16)], new, POOL)
    drafting = draft_s(8) + draft_s(2) + 5 * draft_s(20) + draft_s(1) + 5 * draft_s(10)
    round_s = OVER + target_s(17) + target_s(1) + drafting
    assert decode_seconds(PAIR, redraft) == pytest.approx(14 * (0.5 + new * round_s))
    # racer under auto calibrates along whole runs, verifying the union of every candidate
    # budget's tree: at most their sizes summed, plus the root
    racer = decode_work(get_decoder("racer"), [Auto()], new, POOL)
    union = 1 + sum(DEFAULT_BUDGETS)
    decoding = OVER + target_s(max(DEFAULT_BUDGETS) + 1)
    assert decode_seconds(PAIR, racer) == pytest.approx(
        14 * (0.5 + new * decoding) + 14 * (0.5 + new * (OVER + target_s(union))))
    # auto's candidates are the budgets that fit the pool: a pool of 5 + 3 x 25 = 80 nodes
    small = decode_work(get_decoder("racer"), [Auto()], new, PoolShape(5, 4))
    assert small.candidates == tuple(b for b in DEFAULT_BUDGETS if b <= 80)


def test_the_worst_round_bounds_every_round_the_loop_runs():
    """Each decoder's `worst_round` against the rounds it runs on the toy pair: no round feeds
    its verify pass more tokens, drafts more passes, commits more tokens or runs more target
    passes than it says (a draft that rarely guesses t0, so fts_redraft redrafts)."""
    from targetrows.core.toy import ToyPair
    from targetrows.decoding.config import DecodeConfig
    from targetrows.decoding.loop import generate
    from targetrows.decoding.registry import decoder_names

    pair = ToyPair(vocab_size=24, seed=3, closeness=0.3)
    pool = PoolShape(top_k=3, depth=3)
    redrafted = 0
    for name in decoder_names(learned=False):
        decoder = get_decoder(name)
        for budget in (1, 4, 12):
            config = DecodeConfig(name, budget=budget, pool=pool, temperature=1.0,
                                  max_new_tokens=24)
            shape = decoder.worst_round(pool, config.budget)
            for r in generate(pair.target, pair.draft, [1, 2, 3], config).rounds[1:]:
                assert r.nodes + decoder.verify_feeds <= shape.verify_nodes, (name, budget)
                assert r.draft_passes <= len(shape.draft_widths), (name, budget)
                assert r.committed <= shape.committed, (name, budget)
                assert r.target_passes <= 1 + shape.root_pass, (name, budget)
                redrafted += decoder.guesses_pool and r.draft_passes == len(shape.draft_widths)
    assert redrafted > 0  # the guesses missed t0, and a second pool was drafted under it


def test_conditions_come_from_the_budgets_a_job_runs():
    fts = get_decoder("fts")
    work = decode_work(fts, [Fixed(16), Matched(59), Auto()], 8, POOL)
    assert (work.budgets, work.auto, work.conditions) == ((16, 59), True, 4)
    assert decode_work(get_decoder("ar"), [Fixed(1)], 8, POOL).budgets == ()
    assert DecodeWork(fts, 8, (3,)).largest_budget == 3


def test_the_request_is_the_margin_times_bound_and_load_in_whole_minutes():
    work = decode_work(get_decoder("pearl"), [Fixed(59), Fixed(8)], 512, POOL)
    seconds = decode_seconds(PAIR, work) + PAIR.load_s
    assert seconds > 1000  # above the floor
    assert decode_minutes(PAIR, work, margin=1.5) == math.ceil(1.5 * seconds / 60)
    assert decode_minutes(PAIR, work, margin=1.0) == math.ceil(seconds / 60)
    assert decode_minutes(PAIR, work, margin=1.0, least=10_000) == 10_000
    with pytest.raises(ValueError, match="margin of 0.5"):
        decode_minutes(PAIR, work, margin=0.5)


def test_measured_part_times_read_back_as_written():
    longer = PartTimes(TARGET, None, 400)
    pair = MeasuredPair(PartTimes(TARGET, DRAFT, 100, True, longer), 0.25, 90, 3, 4.0, 0.002)
    assert MeasuredPair.from_json(json.loads(json.dumps(pair.to_json()))) == pair


def test_part_times_command_times_a_pair_and_counts_the_turns(tmp_path):
    pytest.importorskip("torch")
    from tiny_models import save_tiny_pair

    from targetrows.cli import main

    target, draft = save_tiny_pair(tmp_path, "llama")
    prompts = tmp_path / "q.jsonl"
    prompts.write_text("".join(json.dumps(q) + "\n" for q in [
        {"question_id": 1, "category": "mt_bench", "turns": ["hi there", "and then?"]},
        {"question_id": 2, "category": "mt_bench", "turns": ["count to ten"]}]))
    out = tmp_path / "parts.json"
    assert main(["part-times", "--target", target, "--draft", draft, "--dtype", "float32",
                 "--prompts", str(prompts), "--max-new-tokens", "20", "--budgets", "6",
                 "--top-k", "4", "--repeats", "1", "--out", str(out)]) == 0
    pair = MeasuredPair.from_json(json.loads(out.read_text()))
    assert pair.turns == 3
    assert pair.longest_turn > 20  # the second turn's prompt holds a 20-token answer
    assert pair.parts.target.sizes[-1] == max(DEFAULT_BUDGETS) + 1 and 7 in pair.parts.target.sizes
    assert 4 in pair.parts.draft.sizes and pair.parts.draft_refeeds is False
    assert pair.prefill_s > 0 and pair.load_s > 0 and pair.round_overhead_s >= 0
    assert main(["part-times", "--target", target, "--prompts", str(prompts), "--budgets", "0",
                 "--out", str(out)]) == 2


def test_a_batch_bounds_each_lanes_passes_padded_and_its_prefills():
    """At batch size N each pass is priced padded to its round's widest of its model (the root
    pass to the verify pass's width, every draft pass to the widest) and each turn's prefill N
    times (it may pad the other lanes' passes): never less than at batch 1."""
    new = 32
    fts = decode_work(get_decoder("fts"), [Fixed(16)], new, POOL, batch_size=4)
    padded = OVER + 2 * target_s(17) + 6 * draft_s(10)  # the head's first pass (8) padded to 10
    assert decode_seconds(PAIR, fts) == pytest.approx(14 * (4 * 0.5 + new * padded))
    ar = decode_work(get_decoder("ar"), [Fixed(1)], new, POOL, batch_size=4)
    assert decode_seconds(PAIR, ar) == pytest.approx(14 * (4 * 0.5 + new * (OVER + target_s(1))))
    for name in ("ar", "draft_rank", "fts", "fts_redraft", "racer", "pearl"):
        for budgets in ([Fixed(8)], [Fixed(59), Auto()]):
            one, four = (decode_work(get_decoder(name), budgets, new, POOL, batch_size=n)
                         for n in (1, 4))
            assert decode_seconds(PAIR, four) >= decode_seconds(PAIR, one), name
            assert decode_minutes(PAIR, four) >= decode_minutes(PAIR, one), name
    with pytest.raises(ValueError, match="decode.batch_size"):
        decode_work(get_decoder("fts"), [Fixed(16)], new, POOL, batch_size=0)


# a Llama-style target: 32 layers, 8 key/value heads of 128; an EAGLE-3 head of one layer
TARGET_SPEC = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "hidden_size": 4096, "max_position_embeddings": 8192}
HEAD_SPEC = {"num_hidden_layers": 1, "num_attention_heads": 32, "num_key_value_heads": 8,
             "hidden_size": 4096}


def test_a_batch_asks_for_its_sequences_caches():
    """A decode job's memory grows with decode.batch_size: each sequence's KV cache in every
    model (and an EAGLE-3 head's target features), room for the buffer's doubling."""
    from targetrows.pipeline.memory import (
        batch_mb,
        kv_bytes_per_position,
        sequence_mb,
        sequence_positions,
    )

    assert kv_bytes_per_position(TARGET_SPEC, "bfloat16") == 2 * 32 * 8 * 128 * 2  # 128 KiB
    positions = sequence_positions(longest_turn=900, max_new_tokens=512, largest_tree=128)
    assert positions == 900 + 512 + 128 + 2
    per_position = 2 * 32 * 8 * 128 * 2 + 2 * 1 * 8 * 128 * 2 + 3 * 4096 * 2
    one = sequence_mb(TARGET_SPEC, [HEAD_SPEC], positions, "bfloat16", eagle3=True)
    assert one == pytest.approx(2 * positions * per_position / 2**20)
    four = batch_mb(TARGET_SPEC, [HEAD_SPEC], positions, "bfloat16", 4, eagle3=True)
    assert four == pytest.approx(4 * one) and four > batch_mb(
        TARGET_SPEC, [HEAD_SPEC], positions, "bfloat16", 1, eagle3=True)
    # float32 doubles it; a model not downloaded yet (no config.json) adds nothing yet
    assert batch_mb(TARGET_SPEC, [], positions, "float32", 4) == pytest.approx(
        2 * batch_mb(TARGET_SPEC, [], positions, "bfloat16", 4))
    assert batch_mb(None, [], positions, "bfloat16", 4) == 0.0
    with pytest.raises(ValueError, match="num_attention_heads"):
        kv_bytes_per_position({"hidden_size": 8}, "bfloat16")
    with pytest.raises(ValueError, match="decode.batch_size"):
        batch_mb(TARGET_SPEC, [], positions, "bfloat16", 0)
