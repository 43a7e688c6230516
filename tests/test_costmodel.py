"""The cost model: pass curves, the zero-overhead bound on hand-computed part times, the budget
picked from a predicted-throughput curve, and acceptance predictions that match real rounds."""

import numpy as np
import pytest

from targetrows.core.passes import no_passes
from targetrows.core.pool import PoolShape
from targetrows.core.toy import ToyPair
from targetrows.cost import calibration, parttimes, rounds
from targetrows.cost.calibration import BudgetSearch
from targetrows.decoding.budget import NO_TREE
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.decoding.registry import get_decoder
from targetrows.decoding.round import RoundStats

# target pass: 9 ms + 1 ms per new token; draft pass: 2 ms + 0.1 ms per new token
TARGET = parttimes.PassCurve((1, 9, 17), (0.010, 0.018, 0.026))
DRAFT = parttimes.PassCurve((1, 41), (0.0021, 0.0061))
PARTS = parttimes.PartTimes(TARGET, DRAFT, context_len=100)


def test_pass_curve_interpolates_extends_and_is_zero_for_nothing():
    assert TARGET(5) == pytest.approx(0.014)
    assert TARGET(33) == pytest.approx(0.042)  # beyond 17: the last segment's slope
    assert TARGET(0) == 0.0
    np.testing.assert_allclose(TARGET(np.array([1, 9])), [0.010, 0.018])
    with pytest.raises(ValueError):
        parttimes.PassCurve((4, 2), (0.1, 0.2))


def test_isotonic_pools_a_dip():
    assert parttimes.isotonic([1, 3, 2, 4, 0.5, 6]) == pytest.approx([1, 2.375, 2.375, 2.375, 2.375, 6])
    assert parttimes.isotonic([1, 2, 3]) == [1, 2, 3]


def test_round_seconds_by_hand():
    # draft_rank, top_k 4, depth 3: draft passes of 1, 4, 4 tokens = 2.1 + 2.4 + 2.4 ms;
    # verify feeds root + 8 nodes = 18 ms
    got = rounds.round_seconds("draft_rank", PARTS, [8], [3], 0.0, PoolShape(4, 3))
    assert got[0] == pytest.approx(0.0069 + 0.018)
    # rerank on one device: drafting 6.9 ms then a 10 ms root pass; verify feeds 8 nodes, 17 ms
    assert rounds.round_seconds("rerank", PARTS, [8], [3], 0.0, PoolShape(4, 3))[0] == pytest.approx(0.0339)
    # ... with half the shorter part hidden: 6.9 + 10 - 3.45
    assert rounds.round_seconds("rerank", PARTS, [8], [3], 0.5, PoolShape(4, 3))[0] == pytest.approx(0.03045)
    # fts_redraft, 2 guesses: passes of 1, 2, 8, 8 tokens = 2.1 + 2.2 + 2.8 + 2.8 = 9.9 ms; a missed
    # guess (7 passes = 4 + one expansion of 3) adds 6.9 ms; verify feeds t0 + 8 nodes
    fts = rounds.round_seconds("fts_redraft", PARTS, [8, 8], [4, 7], 0.0,
                               PoolShape(4, 3, guesses=2))
    np.testing.assert_allclose(fts, [0.0099 + 0.010 + 0.018, 0.0099 + 0.010 + 0.0069 + 0.018])
    ar = rounds.round_seconds("ar", PARTS, [0, 0], [0, 0], 0.0, PoolShape(4, 3))
    assert ar == pytest.approx([0.01, 0.01])


def test_pruned_pools_cost_their_narrower_passes():
    # draft_rank at B=2, top_k 4, depth 2: only the best first-level node can have a child in
    # the tree, so the second pass feeds 1 token: 2.1 + 2.1 ms; verify feeds root + 2 nodes
    assert get_decoder("draft_rank").draft_widths(PoolShape(4, 2), budget=2) == [1, 1]
    assert get_decoder("draft_rank").draft_widths(PoolShape(4, 3), budget=3) == [1, 2, 2]
    assert get_decoder("rerank").draft_widths(PoolShape(4, 2), budget=2) == [1, 4]  # any branch may be taken
    got = rounds.round_seconds("draft_rank", PARTS, [2], [2], 0.0, PoolShape(4, 2), budget=2)
    assert got[0] == pytest.approx(0.0042 + 0.012)
    # a round whose pruned pool stopped after its first level pays that pass only
    got = rounds.round_seconds("draft_rank", PARTS, [2, 3], [1, 3], 0.0, PoolShape(4, 3), budget=3)
    np.testing.assert_allclose(got, [0.0021 + 0.012, 0.0021 + 2 * 0.0022 + 0.013])


def test_bound_by_hand():
    stats = [
        RoundStats(
            committed=4, nodes=8, draft_passes=3, t_draft=0.01, t_root=0.02, t_drafting=0.025
        ),
        RoundStats(
            committed=2, nodes=16, draft_passes=3, t_draft=0.01, t_root=0.02, t_drafting=0.025
        ),
    ]
    assert rounds.overlap_achieved(stats) == pytest.approx(0.5)  # 5 ms of 10 hidden
    b = rounds.bound("pearl", PARTS, stats, PoolShape(4, 3))
    before = 0.0069 + 0.010 - 0.5 * 0.0069
    seconds = [before + 0.018, before + 0.026]  # verify: t0 + 8 and t0 + 16 nodes
    assert b.overlap == pytest.approx(0.5)
    assert b.tokens_per_s == pytest.approx(6 / sum(seconds))
    assert b.speedup == pytest.approx(6 / sum(seconds) * 0.010)
    assert b.round_seconds == pytest.approx(np.mean(seconds))
    ar = rounds.bound("ar", PARTS, [RoundStats(committed=1)] * 3, PoolShape(4, 3))
    assert ar.tokens_per_s == pytest.approx(100.0) and ar.speedup == pytest.approx(1.0)
    # the prompt's pass beyond a one-token pass, paid once: 3 tokens in 30 + 20 ms
    ar = rounds.bound("ar", PARTS, [RoundStats(committed=1)] * 3, PoolShape(4, 3), prompt_s=0.02)
    assert ar.tokens_per_s == pytest.approx(60.0) and ar.round_seconds == pytest.approx(0.01)


def test_best_budget_maximises_a_synthetic_curve():
    budgets = [1, 2, 4, 8, 16, 32, 64]
    committed = np.array([1.6, 2.0, 2.5, 3.0, 3.4, 3.6, 3.7])  # diminishing returns
    nodes = np.array(budgets, dtype=float)
    tps = rounds.predicted_tokens_per_s("draft_rank", committed, nodes, PARTS, 0.0, PoolShape(4, 3))
    by_hand = committed / (0.0069 + 0.009 + 0.001 * (nodes + 1))
    np.testing.assert_allclose(tps, by_hand)
    # by hand: 1.6/.0179=89.4, 2/.0189=105.8, 2.5/.0209=119.6, 3/.0249=120.5, 3.4/.0329=103.3
    assert rounds.best_budget(budgets, tps) == 8
    assert rounds.best_budget([8, 2, 4], [5.0, 5.0, 4.0]) == 2  # ties: the smallest budget
    with pytest.raises(ValueError):
        rounds.best_budget([1, 2], [1.0])


def test_auto_budget_follows_the_verify_cost():
    pair = ToyPair(vocab_size=24, seed=3, closeness=0.9)
    budgets = (1, 2, 4, 8, 16, 32)
    prompt = [1, 2, 3]
    flat = parttimes.PartTimes(parttimes.PassCurve((1,), (0.01,)), DRAFT, 3)  # a tree costs what a token does
    steep = parttimes.PartTimes(parttimes.PassCurve((1, 100), (0.01, 1.0)), DRAFT, 3)
    config = DecodeConfig("draft_rank", pool=PoolShape(4, 3))
    free = calibration.auto_budget(pair.target, pair.draft, config, [prompt],
                                   BudgetSearch(budgets=budgets), flat)
    committed = np.array(free.committed[free.depths.index(free.depth)])
    assert np.all(np.diff(committed) >= 0)
    assert free.budget == budgets[int(np.argmax(committed))]  # the most accepted tokens
    dear = calibration.auto_budget(pair.target, pair.draft, config, [prompt],
                                   BudgetSearch(budgets=budgets), steep)
    assert dear.budget < free.budget
    assert "budget auto ->" in dear.describe()
    with pytest.raises(ValueError, match="ar"):
        calibration.auto_budget(pair.target, pair.draft, DecodeConfig("ar"), [prompt])


def test_best_depth_budget_ties_go_to_cheaper_drafting():
    tps = [[5.0, 6.0], [6.0, 6.0], [4.0, 1.0]]  # [depth][budget]
    assert rounds.best_depth_budget([3, 2, 1], [8, 4], tps) == (2, 4)  # not (3, 4), nor (2, 8)
    with pytest.raises(ValueError, match="depths, budgets"):
        rounds.best_depth_budget([1, 2], [4], [[1.0, 2.0]])


@pytest.mark.parametrize("decoder", ["draft_rank", "fts", "pearl", "fts_redraft"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_acceptance_by_depth_matches_one_depth_at_a_time(decoder, temperature):
    """One expansion at the deepest depth and one target pass predict every shallower pool as
    exactly as a prediction at that depth alone (whose pool is the first levels of the deepest)."""
    pair = ToyPair(vocab_size=24, seed=5, closeness=0.9)
    prompt, budgets = [4, 7, 1], [1, 2, 5, 8, 20, 36, 200]
    args = (pair.target, pair.draft, prompt, budgets)

    def config(depth):
        return DecodeConfig(decoder, temperature=temperature, pool=PoolShape(4, depth))

    committed, nodes = calibration.acceptance_curve(*args, config(3), 1, depths=[1, 2, 3])
    assert committed.shape == nodes.shape == (3, len(budgets))
    for row, depth in enumerate([1, 2, 3]):
        alone = calibration.acceptance_curve(*args, config(depth), 1)
        np.testing.assert_array_equal(committed[row], alone[0])
        np.testing.assert_array_equal(nodes[row], alone[1])
    # over several contexts (moved on by the deepest depth's rounds) the deepest row is still
    # the prediction at that depth alone
    committed, nodes = calibration.acceptance_curve(*args, config(3), 3, depths=[2, 3])
    alone = calibration.acceptance_curve(*args, config(3), 3)
    np.testing.assert_array_equal(committed[1], alone[0])
    np.testing.assert_array_equal(nodes[1], alone[1])
    with pytest.raises(ValueError, match="depths must be 1..3"):
        calibration.acceptance_curve(*args, config(3), depths=[4])


def test_auto_depth_follows_the_draft_cost():
    pair = ToyPair(vocab_size=24, seed=3, closeness=0.9)
    budgets = (1, 2, 4, 8, 16, 32)
    target = parttimes.PassCurve((1,), (0.01,))  # a tree costs what a token does
    free = parttimes.PartTimes(target, parttimes.PassCurve((1,), (0.0,)), 3)
    dear = parttimes.PartTimes(target, parttimes.PassCurve((1,), (0.05,)), 3)  # a level costs 5 target passes
    args = (pair.target, pair.draft, DecodeConfig("draft_rank", pool=PoolShape(4, 3)), [[1, 2, 3]])
    deep = calibration.auto_budget(*args, BudgetSearch(budgets=budgets), free)
    best = [max(row) for row in deep.committed]
    assert best[0] < best[1] < best[2]  # deeper pools accept more
    assert deep.depth == 3 and deep.depths == (1, 2, 3)
    shallow = calibration.auto_budget(*args, BudgetSearch(budgets=budgets), dear)
    assert shallow.depth < 3
    # a budget above the chosen pool's size would cap nothing, and would mislabel the run
    assert shallow.budget <= PoolShape(4, shallow.depth).size
    # each depth's predictions are those of its own pool (a budget below the depth drafts less)
    for row, depth in enumerate(shallow.depths):
        np.testing.assert_allclose(shallow.tokens_per_s[row], rounds.predicted_tokens_per_s(
            "draft_rank", shallow.committed[row], shallow.nodes[row], dear, 0.0,
            PoolShape(4, depth), budgets=budgets))
    # only the given depths are tried
    assert calibration.auto_budget(*args, BudgetSearch(budgets=budgets, depths=(3,)),
                                   dear).depth == 3
    text = deep.describe()
    assert text.startswith(f"budget auto -> {deep.budget} at depth 3 (")
    assert "best predicted tokens/s by depth: 1: " in text and "\n" not in text


@pytest.mark.parametrize("decoder", ["draft_rank", "pearl", "rerank", "fts"])
@pytest.mark.parametrize("budget", [1, 5, 20])
def test_acceptance_prediction_matches_the_first_round(decoder, budget):
    """At temperature 0 with one context, the prediction is exactly the first real round."""
    pair = ToyPair(vocab_size=24, seed=5, closeness=0.9)
    prompt = [4, 7, 1]
    config = DecodeConfig(decoder, budget=budget, max_new_tokens=50, pool=PoolShape(4, 3))
    committed, nodes = calibration.acceptance_curve(pair.target, pair.draft, prompt, [budget],
                                                    config, 1)
    result = generate(pair.target, pair.draft, prompt, config)
    assert committed[0] == result.rounds[0].committed
    assert nodes[0] == result.rounds[0].nodes


def test_contexts_a_gap_apart_are_scored_as_each_alone():
    """With `gap`, the next context is the walked round's tokens plus `gap` greedy target tokens
    further on; the prediction is the mean of each context's own."""
    pair = ToyPair(vocab_size=24, seed=5, closeness=0.9)
    prompt, budgets = [4, 7, 1], [1, 5, 12]

    def curve(ctx, temperature, **kw):
        config = DecodeConfig("draft_rank", temperature=temperature, pool=PoolShape(4, 3))
        return calibration.acceptance_curve(pair.target, pair.draft, ctx, budgets, config, **kw)

    walked = int(curve(prompt, 0.0, contexts=1)[0][-1])  # T=0: the largest tree's real round
    greedy = generate(pair.target, None, prompt, DecodeConfig("ar", max_new_tokens=30)).tokens
    first = curve(prompt, 1.0, contexts=1)
    second = curve(prompt + greedy[: walked + 6], 1.0, contexts=1)
    both = curve(prompt, 1.0, contexts=2, gap=6)
    for got, a, b in zip(both, first, second, strict=True):
        np.testing.assert_allclose(got, (a + b) / 2)
    assert not np.allclose(curve(prompt, 1.0, contexts=2)[0], both[0])  # the gap moved it


def test_acceptance_at_temperature_one_is_a_probability_sum():
    pair = ToyPair(vocab_size=24, seed=5, closeness=0.9)
    committed, nodes = calibration.acceptance_curve(
        pair.target, pair.draft, [4, 7, 1], [1, 4, 16, 36],
        DecodeConfig("draft_rank", temperature=1.0, pool=PoolShape(4, 3)))
    assert np.all(committed >= 1) and np.all(np.diff(committed) >= 0)
    assert committed[-1] < 1 + 3  # at most one accepted node per level
    np.testing.assert_array_equal(nodes, [1, 4, 16, 36])


def test_time_passes_on_the_toy_pair():
    pair = ToyPair(vocab_size=24, seed=0)
    curve = parttimes.time_passes(pair.target, [1, 2, 3], [8, 1, 4], repeats=2)
    assert curve.sizes == (1, 4, 8)
    assert all(t >= 0 for t in curve.seconds) and list(curve.seconds) == sorted(curve.seconds)


def test_a_slow_spell_does_not_price_one_pass_size(monkeypatch):
    """Sizes are timed in turn within each repeat: three slow passes in a row (another job on a
    shared machine) slow one sample of three sizes, and the medians drop them."""
    calls = []

    def fake_pass(model, ctx, tree):  # steps, as `_timed_pass`: no pass asked for
        calls.append(len(tree) - 1)
        slow = 4 <= len(calls) <= 6  # the 4th to 6th timed passes (the 1st is the warm-up)
        return no_passes(0.010 * (len(tree) - 1) + (0.050 if slow else 0.0))

    monkeypatch.setattr(parttimes, "_timed_pass", fake_pass)
    pair = ToyPair(vocab_size=24, seed=0)
    curve = parttimes.time_passes(pair.target, [1, 2, 3], [1, 2, 3], repeats=3)
    assert curve.seconds == pytest.approx((0.010, 0.020, 0.030))


def test_a_budget_is_parsed_once_from_every_place_it_is_written():
    """The config, the command line and the conditions files write a budget one way
    (`parse_budget`), and `budget_spec` writes it back the same way."""
    import argparse

    from targetrows.cli.common import budget_type
    from targetrows.decoding.budget import Auto, Fixed, Matched, budget_spec, parse_budget

    for written, budget in ((8, Fixed(8)), ("8", Fixed(8)), ("auto", Auto()),
                            ({"matched": 59}, Matched(59))):
        assert parse_budget(written) == budget
        assert parse_budget(budget) is budget
        assert parse_budget(budget_spec(budget)) == budget
    assert [str(b) for b in (Fixed(8), Auto(), Matched(59))] == ["8", "auto", "matched 59"]
    for bad in ("x", "2.5", "", 0, -3, True, 2.5, {"matched": 0}, {"matched": 3, "x": 1}, None):
        with pytest.raises(ValueError):
            parse_budget(bad)
    parse = budget_type("--budgets")  # the command line: a number or auto, named by its option
    assert parse("5") == Fixed(5) and parse("auto") == Auto()
    with pytest.raises(argparse.ArgumentTypeError, match="--budgets must be a positive integer"):
        parse("0")


def test_mean_parts_averages_two_timings():
    later = parttimes.PartTimes(parttimes.PassCurve((1, 9, 17), (0.012, 0.016, 0.030)), None, 100)
    both = parttimes.mean_parts(PARTS, later)
    # 0.011, 0.017, 0.028 (already non-decreasing); the draft curve of the one timing that has it
    assert both.target.seconds == pytest.approx((0.011, 0.017, 0.028))
    assert both.draft is DRAFT
    with pytest.raises(ValueError, match="sizes"):
        parttimes.mean_parts(PARTS, parttimes.PartTimes(parttimes.PassCurve((1, 2), (0.1, 0.2)),
                                                        None, 100))
    with pytest.raises(ValueError, match="different contexts"):
        parttimes.mean_parts(PARTS, parttimes.PartTimes(TARGET, None, 101))


def test_part_times_at_a_context_are_linear_between_the_two_timed():
    """Attention reads the whole context: a pass at 500 cached tokens costs more than at 100,
    and a run's mean context in between is priced on the line through the two timings."""
    far = parttimes.PartTimes(parttimes.PassCurve((1, 9, 17), (0.030, 0.050, 0.070)),
                              parttimes.PassCurve((1, 41), (0.0041, 0.0101)), 500)
    both = parttimes.PartTimes(TARGET, DRAFT, 100, longer=far)
    mid = both.at(300)
    assert mid.context_len == 300 and mid.longer is None
    assert mid.target.seconds == pytest.approx((0.020, 0.034, 0.048))
    assert mid.draft.seconds == pytest.approx((0.0031, 0.0081))
    assert both.at(40).target.seconds == pytest.approx(TARGET.seconds)  # held below the shorter
    assert both.at(900).target.seconds == pytest.approx((0.050, 0.082, 0.114))  # on along the line
    assert PARTS.at(900) is PARTS  # timed at one context: those times
    halves = parttimes.mean_parts(both, both)
    assert halves.longer.target.seconds == pytest.approx(far.target.seconds)
    with pytest.raises(ValueError, match="longer context"):
        parttimes.PartTimes(TARGET, DRAFT, 100, longer=parttimes.PartTimes(TARGET, DRAFT, 100))


def test_a_draft_that_refeeds_pays_for_the_tokens_the_last_round_committed():
    """An EAGLE-3 head feeds the previous round's committed tokens again (from the target's
    features) in its first pass: that pass is as wide as they are; a standalone draft's first
    pass feeds the bonus token alone, whatever was committed."""
    head = parttimes.PartTimes(TARGET, DRAFT, 100, draft_refeeds=True)
    pool = PoolShape(4, 3)
    # draft_rank: passes of widths [fed back, 4, 4], verify feeds root + 8 nodes = 18 ms
    by_hand = (0.0021 + 0.0024 + 0.0024) + 0.018
    got = rounds.round_seconds("draft_rank", head, [8], [3], 0.0, pool, fed_back=[2])
    assert got[0] == pytest.approx(by_hand + 0.0001)  # the first pass: 2 tokens, not 1
    assert rounds.round_seconds("draft_rank", PARTS, [8], [3], 0.0, pool, fed_back=[2])[0] == \
        pytest.approx(by_hand)
    # the bound feeds each round what the round before it committed (the first: one token)
    stats = [RoundStats(committed=c, nodes=8, draft_passes=3) for c in (3, 1, 4)]
    b = rounds.bound("draft_rank", head, stats, pool)
    firsts = [0.0021, 0.0023, 0.0021]  # widths 1, 3, 1
    seconds = [f + 0.0048 + 0.018 for f in firsts]
    assert b.round_seconds == pytest.approx(np.mean(seconds))
    assert b.tokens_per_s == pytest.approx(8 / sum(seconds))
    # and the prediction feeds back what it predicts a round commits
    tps = rounds.predicted_tokens_per_s("draft_rank", [3.0], [8], head, 0.0, pool)
    assert tps[0] == pytest.approx(3.0 / (0.0023 + 0.0048 + 0.018))


def test_auto_budget_times_at_the_runs_mean_context():
    """By default the passes are timed at the prompts' mean length plus half the new tokens,
    the mean context of the runs the budget is for."""
    pair = ToyPair(vocab_size=24, seed=3, closeness=0.8)
    seen = []
    real = parttimes.time_passes_steps

    def spy(model, context, sizes, repeats=3, seed=0):
        seen.append(len(context))
        return real(model, context, sizes, 1, seed)

    prompts = [[1, 2, 3], [7, 7, 7, 7], [5]]  # mean length 8/3
    config = DecodeConfig("draft_rank", pool=PoolShape(3, 2), max_new_tokens=10)
    search = BudgetSearch(budgets=(1, 2), contexts=1)
    import unittest.mock as mock
    with mock.patch.object(parttimes, "time_passes_steps", spy):
        choice = calibration.auto_budget(pair.target, pair.draft, config, prompts, search)
        assert seen == [8, 8]  # round(8/3 + 10/2): the target's passes, then the draft's
        assert choice.context_len == 8
        seen.clear()
        calibration.auto_budget(pair.target, pair.draft, config, prompts, search,
                                context_len=30)
        assert seen == [30, 30]
    assert parttimes.timing_context(prompts, 10) == [1, 2, 3, 7, 7, 7, 7, 5, 1, 2]


def test_calibration_prompts_average_each_prompts_curve():
    """Several calibration prompts: ceil(contexts / n) contexts along each, curves averaged."""
    pair = ToyPair(vocab_size=24, seed=3, closeness=0.8)
    parts = parttimes.PartTimes(parttimes.PassCurve((1,), (0.01,)),
                                parttimes.PassCurve((1,), (0.002,)), 3)
    prompts = [[1, 2, 3], [7, 7, 7, 7], [5]]
    budgets = (1, 2, 4, 8)
    config = DecodeConfig("draft_rank", pool=PoolShape(3, 2))
    choice = calibration.auto_budget(pair.target, pair.draft, config, prompts,
                                     BudgetSearch(budgets=budgets, contexts=5, gap=2), parts)
    curves = [calibration.acceptance_curve(pair.target, pair.draft, p, budgets, config, 2,
                                           depths=[1, 2], gap=2) for p in prompts]
    np.testing.assert_allclose(choice.committed, np.mean([c for c, _ in curves], axis=0))
    np.testing.assert_allclose(choice.nodes, np.mean([n for _, n in curves], axis=0))
    with pytest.raises(ValueError, match="none of them empty"):
        calibration.auto_budget(pair.target, pair.draft, config, [[1], []],
                                BudgetSearch(budgets=budgets), parts)


# a verify pass of n nodes: 10 ms + 40 ms per node beyond the first (batched, the passes of
# many sequences: one node each is cheap, n each is not); a tree costs what a token does
DEAR_TREES = parttimes.PartTimes(parttimes.PassCurve((1, 2, 200), (0.01, 0.05, 7.97)), DRAFT, 3)
CHEAP_TREES = parttimes.PartTimes(parttimes.PassCurve((1,), (0.01,)), DRAFT, 3)


@pytest.mark.parametrize("decoder", ["draft_rank", "fts"])
def test_auto_weighs_no_tree_against_every_tree(decoder):
    pair = ToyPair(vocab_size=24, seed=3, closeness=0.9)
    args = (pair.target, pair.draft, DecodeConfig(decoder, pool=PoolShape(4, 3)), [[1, 2, 3]],
            BudgetSearch(budgets=(1, 2, 4, 8, 16)))
    dear = calibration.auto_budget(*args, DEAR_TREES)
    assert dear.ar_tokens_per_s == pytest.approx(100.0)  # one 10 ms pass per token
    assert dear.no_tree and dear.condition() == (NO_TREE, NO_TREE)
    assert dear.predicted_tokens_per_s == pytest.approx(100.0)
    assert dear.describe().startswith("budget auto -> no tree, ar (best tree: ")
    assert "ar (no tree): 100.0)" in dear.describe()
    cheap = calibration.auto_budget(*args, CHEAP_TREES)
    assert not cheap.no_tree and cheap.condition() == (cheap.budget, cheap.depth)
    assert cheap.predicted_tokens_per_s > cheap.ar_tokens_per_s == pytest.approx(100.0)
    assert cheap.describe().startswith(f"budget auto -> {cheap.budget} at depth {cheap.depth} (")


def test_auto_is_never_predicted_slower_than_ar():
    """Whatever trees and drafting cost, auto's pick is predicted at least as fast as ar, and
    is the fastest of ar and every tree that fits."""
    pair = ToyPair(vocab_size=24, seed=5, closeness=0.7)
    budgets = (1, 2, 4, 8, 16)
    args = (pair.target, pair.draft, DecodeConfig("fts", pool=PoolShape(3, 3)), [[4, 5, 6]],
            BudgetSearch(budgets=budgets))
    picks = set()
    for per_node in (0.0, 0.002, 0.01, 0.05):  # seconds per verified node beyond the first
        for level in (0.0, 0.002, 0.02):  # seconds per draft pass
            parts = parttimes.PartTimes(
                parttimes.PassCurve((1, 2, 100), (0.01, 0.01 + per_node, 0.01 + 99 * per_node)),
                parttimes.PassCurve((1,), (level,)), 3)
            choice = calibration.auto_budget(*args, parts)
            fitting = [t for d, row in zip(choice.depths, choice.tokens_per_s, strict=True)
                       for b, t in zip(budgets, row, strict=True) if b <= PoolShape(3, d).size]
            assert choice.predicted_tokens_per_s >= choice.ar_tokens_per_s
            assert choice.predicted_tokens_per_s == pytest.approx(
                max(choice.ar_tokens_per_s, *fitting))
            picks.add(choice.no_tree)
    assert picks == {True, False}  # both sides of the line were crossed


def test_auto_times_and_picks_at_the_configs_batch_size(monkeypatch):
    """The batch size has one home, `DecodeConfig.batch_size`: `auto_budget` times its passes
    batched at it and its pick is per sequence at it (`BudgetSearch` holds none)."""
    import dataclasses

    assert "batch_size" not in {f.name for f in dataclasses.fields(BudgetSearch)}
    seen = []
    monkeypatch.setattr(calibration, "measure_parts",
                        lambda *a, **k: seen.append(k.get("batch_size")) or DEAR_TREES)
    pair = ToyPair(vocab_size=24, seed=3, closeness=0.9)
    config = DecodeConfig("fts", pool=PoolShape(4, 3), batch_size=4)
    choice = calibration.auto_budget(pair.target, pair.draft, config, [[1, 2, 3]],
                                     BudgetSearch(budgets=(1, 2), contexts=1))
    assert seen == [4] and choice.batch_size == 4
    assert "predicted tokens/s per sequence at batch size 4" in choice.describe()


def test_a_condition_of_no_tree_runs_a_tree_decoder_as_ar():
    """`condition_config`, what decode, bench and compare all run a condition with: a tree
    decoder at (NO_TREE, NO_TREE) takes ar's config (no budget, no draft, no reranker), at any
    other condition its budget and depth; ar keeps its own."""
    from targetrows.decoding.budget import condition_text
    from targetrows.decoding.config import condition_config

    fts = DecodeConfig("fts", budget=8, pool=PoolShape(4, 3), temperature=1.0, seed=7,
                       batch_size=2)
    ar = condition_config(fts, NO_TREE, NO_TREE)
    assert ar.name == "ar" and ar.budget is None and not ar.decoder.needs_draft
    assert (ar.temperature, ar.seed, ar.batch_size) == (1.0, 7, 2)
    tree = condition_config(fts, 5, 2)
    assert (tree.name, tree.budget, tree.pool) == ("fts", 5, PoolShape(4, 2))
    assert condition_config(fts, 5, 0).pool == PoolShape(4, 3)  # depth 0: the pool's own
    assert condition_config(DecodeConfig("ar"), NO_TREE, NO_TREE) == DecodeConfig("ar")
    assert condition_text(NO_TREE, NO_TREE) == "no tree, ar"
    assert condition_text(5, 2) == "5 at depth 2"
    # a no-tree config decodes as ar: the target's greedy tokens, no tree verified
    pair = ToyPair(vocab_size=24, seed=3, closeness=0.9)
    want = generate(pair.target, None, [1, 2, 3], DecodeConfig("ar", max_new_tokens=8))
    got = generate(pair.target, None, [1, 2, 3], condition_config(
        DecodeConfig("fts", max_new_tokens=8), NO_TREE, NO_TREE))
    assert got.tokens == want.tokens and max(r.nodes for r in got.rounds) == 0
