"""The decoder and rule registry is the one place decoders are defined: the config schema agrees
with it, unknown names fail naming the known ones, and a decoder registered in one place runs
through generate, the cost model, the online tables and the figures' ordering with no other edit."""

from pathlib import Path

import numpy as np
import pytest
import yaml
from needs import need_module

from targetrows.core.pool import PoolShape
from targetrows.core.rules.root_pool import draft_rank
from targetrows.core.toy import ToyPair
from targetrows.cost import parttimes, rounds
from targetrows.decoding import planners
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.decoding.registry import (
    DECODERS,
    RULES,
    Decoder,
    decoder_names,
    get_decoder,
    get_rule,
    register,
    unregister,
)
from targetrows.decoding.round import Plan, timed_draft_work

REPO = Path(__file__).resolve().parents[1]


def _schema():
    return yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())


def test_config_schema_enums_equal_the_registry():
    decode = _schema()["properties"]["decode"]["properties"]
    assert decode["decoders"]["items"]["enum"] == list(decoder_names())
    own = decode["decoder_budgets"]["propertyNames"]["enum"]
    assert own == [name for name, d in DECODERS.items() if d.drafts]


def test_every_decoder_names_a_registered_rule_and_baseline():
    for d in DECODERS.values():
        assert d.rule is None or d.rule in RULES
        assert all(b in DECODERS and b != d.name for b in d.baselines)
    for r in RULES.values():
        assert all(b in RULES for b in r.baselines)


def test_unknown_names_raise_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown decoder 'beam': choose one of ar, draft_rank"):
        get_decoder("beam")
    with pytest.raises(ValueError, match="unknown rule 'beam': choose one of draft_rank"):
        get_rule("beam")
    with pytest.raises(ValueError, match="unknown decoder 'beam'"):
        DecodeConfig("beam")
    with pytest.raises(ValueError, match="unknown decoder 'beam'"):
        rounds.round_seconds("beam", None, [1], [1], 0.0, PoolShape(4, 3))


def plan_shallow(r):
    """A new decoder for the test: draft_rank's rule on a pool of depth 1."""
    from targetrows.core.pool import pool_passes

    r.stats.draft_passes += 1
    cand, logq = yield from timed_draft_work(r, pool_passes(r.draft, r.context,
                                                            r.config.pool.top_k, 1))
    return Plan([], cand.subtree(draft_rank.select(cand, logq, r.config.budget)))


@pytest.fixture
def shallow():
    register(Decoder("shallow", "one pool level", "draft_rank", planner=plan_shallow))
    yield DECODERS["shallow"]
    unregister("shallow")
    assert "shallow" not in DECODERS


def test_a_registered_decoder_runs_everywhere(shallow, tmp_path):
    pair = ToyPair(vocab_size=24, seed=3, closeness=0.9)
    prompt = [1, 2, 3]
    # the round loop: lossless like every decoder
    ar = generate(pair.target, None, prompt, DecodeConfig("ar", max_new_tokens=24))
    new = generate(pair.target, pair.draft, prompt,
                   DecodeConfig("shallow", budget=4, max_new_tokens=24, pool=PoolShape(top_k=4)))
    assert new.tokens == ar.tokens
    assert all(r.draft_passes == 1 for r in new.rounds)
    # the cost model
    parts = parttimes.PartTimes(parttimes.PassCurve((1, 9), (0.01, 0.018)),
                                parttimes.PassCurve((1, 4), (0.002, 0.003)),
                                10)
    assert shallow.draft_widths(PoolShape(4, 3)) == [1, 4, 4]
    b = rounds.bound("shallow", parts, new.rounds, PoolShape(4, 3))
    assert b.tokens_per_s > 0
    # the online tables, with the conditions its decode job would record, and their ordering
    pd = need_module("pandas")
    from targetrows.analysis.frames import in_order
    from targetrows.analysis.online import conditions, online
    from targetrows.pipeline.conditions import resolve, write_conditions

    paths = []
    for name in ("ar", "shallow", "mystery"):
        path = tmp_path / "conditions" / "p" / "T0" / f"{name}.json"
        conds = resolve(name, [4], 3) if name != "mystery" else [{"condition": 0, "spec": 4,
                                                                   "budget": 4, "depth": 3}]
        write_conditions(str(path), "p", 0.0, name, conds)
        paths.append(str(path))
    with pytest.raises(ValueError, match="unknown decoder 'mystery'"):
        conditions(paths)  # a decoder nobody registered is an error, never a NaN row
    plan = conditions(paths[:2])
    summary = pd.DataFrame({
        "pair": "p", "task": "t", "temperature": 0.0, "prompt_id": ["1", "1"],
        "decoder": ["ar", "shallow"], "budget": [0, 4], "depth": [0, 3], "new_tokens": [24, 24],
        "wall_time": [1.0, 0.5], "rounds": [24, 10], "committed": [24, 24], "accepted": [0, 14],
        "nodes": [0, 40],
    })
    table = online(summary, plan)
    assert set(table["decoder"]) == {"ar", "shallow"} and table["condition"].notna().all()
    assert table.loc[table["decoder"] == "shallow", "speedup"].item() == pytest.approx(2.0)
    assert in_order(["mystery", "shallow", "ar"], DECODERS) == ["ar", "shallow", "mystery"]


def test_gpus_and_verify_feeds_follow_the_declared_fields():
    assert {n: d.gpus for n, d in DECODERS.items()} == {
        n: 2 if d.root_pass else 1 for n, d in DECODERS.items()}
    assert get_decoder("rerank").verify_feeds == 0  # the root pass gave the root row
    assert get_decoder("draft_rank").verify_feeds == 1  # the verify pass feeds the root
    assert get_decoder("pearl").verify_feeds == 1  # t0


def test_planners_are_the_registry_entries():
    for d in DECODERS.values():
        assert getattr(planners, d.plan.__name__) is d.plan
        if d.rule is not None:
            assert d.plan is planners.PLANNERS[get_rule(d.rule).tree]


def test_a_decoder_without_a_draft_model_reads_no_rule():
    """racer and recycle verify a budgeted tree (budget, conditions, pool logic) but draft
    without a model: every property that would read a rule answers for them without one."""
    for name in ("racer", "recycle"):
        d = get_decoder(name)
        assert d.rule is None and d.drafts and not d.needs_draft and d.prior_art
        assert not (d.commits_t0 or d.learned or d.root_pass or d.guesses_pool or d.prunes_pool
                    or d.ours)
        assert d.gpus == 1 and d.verify_feeds == 1
        assert d.draft_widths(PoolShape(4, 3), budget=8) == []
        assert d.pool_depth(6, 59) == 6
        assert DecodeConfig(name, budget=8).budget == 8  # a tree decoder: it has a budget
        with pytest.raises(ValueError, match="give it a budget"):
            DecodeConfig(name, budget=None)
    assert [n for n, d in DECODERS.items() if not d.needs_draft] == ["ar", "racer", "recycle"]
    assert [n for n, d in DECODERS.items() if d.prior_art] == ["sequoia", "racer", "recycle"]
    assert get_decoder("sequoia").learned and get_rule("sequoia").prior_art
    assert [n for n, d in DECODERS.items() if d.ours] == [
        "rerank", "fts", "fts_redraft", "lrerank", "lrerank_stale"]


def test_a_draft_free_decoder_runs_without_a_draft_and_is_costed_without_draft_passes():
    pair = ToyPair(vocab_size=24, seed=3, closeness=0.9)
    ar = generate(pair.target, None, [1, 2, 3, 1, 2], DecodeConfig("ar", max_new_tokens=24))
    for name in ("racer", "recycle"):
        result = generate(pair.target, None, [1, 2, 3, 1, 2],
                          DecodeConfig(name, budget=6, max_new_tokens=24))
        assert result.tokens == ar.tokens
        assert all(r.draft_passes == 0 for r in result.rounds)
        parts = parttimes.PartTimes(parttimes.PassCurve((1, 9), (0.01, 0.018)), None, 10)
        seconds = rounds.round_seconds(name, parts, [0, 6], [0, 0], 0.0, PoolShape(4, 3), 6)
        assert seconds.tolist() == pytest.approx([parts.target(1), parts.target(7)])


@pytest.mark.parametrize("decoder", ["draft_rank", "pearl", "rerank", "fts"])
def test_draft_passes_are_as_wide_as_the_registry_prices_them(decoder):
    """At B=2, top-k 3, depth 2: draft_rank and pearl feed the best first-level node alone to
    the second pass (pruned pools), the rules that re-score or cut by t0 all three; every pass
    is at most as wide as `draft_widths` says."""
    pair = ToyPair(vocab_size=16, seed=2, closeness=0.7)
    widths = []
    topk_at_passes = pair.draft.topk_at_passes

    def counted(context, tree, nodes, k):
        widths.append(len(nodes))
        return topk_at_passes(context, tree, nodes, k)

    pair.draft.topk_at_passes = counted
    config = DecodeConfig(decoder, budget=2, max_new_tokens=12, pool=PoolShape(top_k=3, depth=2))
    result = generate(pair.target, pair.draft, [1, 2, 3], config)
    planned = get_decoder(decoder).draft_widths(PoolShape(3, config.pool_depth),
                                                budget=config.budget)
    assert planned == ([1, 1] if decoder in ("draft_rank", "pearl") else [1, 3])
    assert len(widths) == sum(r.draft_passes for r in result.rounds)
    assert widths[:2] == planned
    start = 0
    for r in result.rounds:  # no round's pass is wider than priced
        taken, start = widths[start : start + r.draft_passes], start + r.draft_passes
        assert all(w <= p for w, p in zip(taken, planned, strict=False))


def test_a_jobs_pass_widths_come_from_its_decoders_and_fixed_budgets():
    """What `--graphs` adds to its buckets (`cli.common.pass_widths_from`): at the paper's pool,
    draft_rank at B=59 feeds its 60-node tree (the root besides), 10-wide levels and a root;
    fts adds its root pass's 1 and commits t0; fts_redraft's guesses pools are 20 wide; an auto
    budget adds nothing of its own, and a command without decoders prices every one."""
    import argparse

    from targetrows.cli.common import pass_widths_from
    from targetrows.decoding.budget import Auto, Fixed

    def widths(**options):
        return pass_widths_from(argparse.Namespace(top_k=10, depth=6, **options))

    assert widths(decoder="draft_rank", budgets=[Fixed(59)]) == (1, 10, 60)
    assert widths(decoder="fts", budgets=[Fixed(16), Auto()]) == (1, 10, 17)
    assert widths(decoders=["fts_redraft"], budget=Fixed(8)) == (1, 2, 9, 10, 20)
    assert widths(decoders=["ar"], budgets=[Fixed(8)]) == (1,)
    every = widths(decoders=None, budgets=[8, 16])
    assert {7, 9, 16, 17, 20} <= set(every) and max(every) == 20  # 7: draft_rank B=8 prunes


def deep_scores(batch):
    """A toy rule for the test: the draft's log-probs plus a small bonus per level, so that
    deeper nodes win ties of the draft (a bonus of 0.01 per level keeps a child at or below its
    parent wherever the draft's step costs more than that)."""
    depth = np.zeros(batch.shape)
    for _ in range(batch.shape[1]):  # depth from parents, one level at a time
        up = np.take_along_axis(depth, np.maximum(batch.parents, 0), 1) + 1
        depth = np.where(batch.parents >= 0, up, 0.0)
    return batch.logq + 0.01 * depth


@pytest.fixture
def toy_rule():
    from targetrows.core.rules.rule import Rule

    register(Rule("toy_deep", "draft_rank with a small bonus per level (a test's own rule)",
                  deep_scores, baselines=("draft_rank",), paper=False))
    register(Decoder("toy_deep_dec", "decodes with toy_deep", "toy_deep"))
    yield get_rule("toy_deep")
    unregister("toy_deep_dec")
    unregister("toy_deep")
    assert "toy_deep" not in RULES


def test_a_rule_registered_from_a_test_is_scored_costed_decoded_and_tabled(toy_rule, tmp_path):
    """One Rule and one Decoder entry, nothing else: the row-log scorer scores it as its
    definition says, the cost model predicts it, the round loop decodes with it losslessly, and
    the tables put it beside its baseline."""
    import brute_rules as brute
    from test_score import toy_log

    from targetrows import Tree, expected_accepted_greedy
    from targetrows.cost.calibration import acceptance_curve
    from targetrows.rowlog.score import score_log, write_table

    log = toy_log(0.0)
    table = score_log(log, [1, 3, 8], rules=("draft_rank", "toy_deep"))
    # scored: the top-B by its own score, pool by pool, accepted along the greedy trajectory
    segment = {(q, int(u)): k for k, (q, u) in enumerate(zip(log.seg_question, log.seg_turn,
                                                              strict=True))}
    for i in np.flatnonzero(table["rule"] == "toy_deep"):
        s = segment[table["prompt_id"][i], int(table["turn"][i])]
        t = int(table["position"][i])
        r = int(np.flatnonzero((log.rec_segment == s) & (log.rec_position == t))[0])
        tokens, parents, logq, _ = log.pool(r)
        pool = Tree(tokens, parents)
        score = {j: logq[j] + 0.01 * pool.depth[j] for j in range(1, len(pool))}
        chosen = [0] + brute.top(range(1, len(pool)), score, int(table["budget"][i]))
        want = expected_accepted_greedy(pool.subtree(chosen), log.trajectory(s)[t:].tolist())
        assert table["accepted"][i] == want and table["nodes"][i] == len(chosen) - 1
    # costed: the calibration scores it from its rule
    pair = ToyPair(vocab_size=24, seed=5, closeness=0.9)
    config = DecodeConfig("toy_deep_dec", budget=6, max_new_tokens=20, pool=PoolShape(4, 3))
    committed, nodes = acceptance_curve(pair.target, pair.draft, [4, 7, 1], [1, 4, 8], config, 2)
    assert np.all(committed >= 1) and list(nodes) == [1, 4, 8]
    # decoded: lossless like every decoder
    ar = generate(pair.target, None, [4, 7, 1], DecodeConfig("ar", max_new_tokens=20))
    assert generate(pair.target, pair.draft, [4, 7, 1], config).tokens == ar.tokens
    # tabled: its expected acceptance and its gain over its baseline
    need_module("pandas")
    from targetrows.analysis.tables import row_log_tables

    path = tmp_path / "scores" / "toy-target" / "toy" / "T0.csv"
    path.parent.mkdir(parents=True)
    write_table(table, str(path))
    acc, gains, _ = row_log_tables([str(path)], n_boot=50, seed=0)
    assert "toy_deep" in set(acc["rule"])
    assert set(gains.loc[gains["rule"] == "toy_deep", "baseline"]) == {"draft_rank"}
