"""The claims table's verdicts on planted tables: each verdict kind reached, and for every row a
table on which its check fails (no verdict reachable by construction)."""

import numpy as np
import pytest
from needs import need_module

from targetrows.analysis import claims, verdicts
from targetrows.analysis.online_claims import closest_budget

pd = need_module("pandas")
V = verdicts


def gains(rule, baseline, cells, kind="eagle3", pair="p"):
    """relative_gains rows: cells are (temperature, budget, gain, lo, hi)."""
    return pd.DataFrame([{"pair": pair, "draft_kind": kind, "temperature": t, "budget": b,
                          "rule": rule, "baseline": baseline, "metric": "accepted", "gain": g,
                          "lo": lo, "hi": hi, "n_prompts": 14} for t, b, g, lo, hi in cells])


def online_gain(decoder, baseline, metric, cells, kind="standalone", overlap=True,
                devices=("cuda:0", "cuda:1")):
    """online_gain rows: cells are (budget, baseline_budget, matched, gain, lo, hi)."""
    return pd.DataFrame([{"pair": "p", "temperature": 0.0, "decoder": decoder, "condition": 0,
                          "budget": b, "depth": 6, "auto": False, "matched": m,
                          "baseline": baseline, "baseline_budget": bb, "baseline_depth": 6,
                          "draft_kind": kind, "overlap": overlap, "target_device": devices[0],
                          "draft_device": devices[1], "metric": metric,
                          "value": 10.0 * (1 + g), "baseline_value": 10.0, "gain": g, "lo": lo,
                          "hi": hi} for b, bb, m, g, lo, hi in cells])


def reuse(cells, row="same last token"):
    """reuse rows: cells are (source, temperature, hits, tv, tv_lo, tv_hi)."""
    return pd.DataFrame([{"source": s, "temperature": t, "row": row, "positions": 100,
                          "hits": h, "prompts": 14, "tv": tv, "tv_lo": lo, "tv_hi": hi,
                          "best_differs": 0.5, "best_differs_lo": 0.4, "best_differs_hi": 0.6,
                          "next_best_exact": 1.0, "next_best_other": 0.5}
                         for s, t, h, tv, lo, hi in cells])


def verdict_of(tables, claim):
    table = claims.claims_table(tables).set_index("claim")
    return table.loc[claim, "verdict"], table.loc[claim]


# -- the vocabulary: one planted table per verdict kind ----------------------------------------

def test_holds_only_where_every_interval_lies_above_zero():
    rel = gains("target_rerank", "draft_rank", [(0, 2, 0.4, 0.3, 0.5), (0, 32, 0.02, 0.01, 0.03)])
    got, row = verdict_of({"relative_gains": rel}, "3 rerank, T=0")
    assert got == V.HOLDS and "all 2 cells' intervals lie above 0" in row["why"]
    assert "p T=0 B=2 +40.0% [+30.0, +50.0]" in row["cells"]


def test_an_interval_below_zero_contradicts_and_is_named():
    rel = gains("first_token", "pearl", [(0, 2, -0.45, -0.64, -0.12), (0, 16, 0.1, 0.05, 0.2)])
    got, row = verdict_of({"relative_gains": rel}, "4 fts, equal cap")
    assert got == V.CONTRADICTED
    assert "1 of 2 cells' intervals lie below 0: p T=0 B=2" in row["why"]


def test_an_interval_across_zero_is_inconclusive_not_contradicted():
    # lo < 0 < hi: "below 0" must be read from the upper bound, the interval's whole
    rel = gains("first_token", "pearl", [(1, 2, -0.05, -0.3, 0.2), (1, 16, 0.1, 0.05, 0.2)])
    got, row = verdict_of({"relative_gains": rel}, "4 fts, equal cap")
    assert got == V.INCONCLUSIVE and "1 of 2 cells' intervals include 0: p T=1 B=2" in row["why"]
    # a cell without an interval (one prompt) cannot hold either
    rel = gains("first_token", "pearl", [(1, 16, 0.1, np.nan, np.nan)])
    assert verdict_of({"relative_gains": rel}, "4 fts, equal cap")[0] == V.INCONCLUSIVE


def test_a_cell_without_a_ratio_is_left_out_and_named():
    rel = gains("first_token", "pearl", [(0, 1, np.nan, np.nan, np.nan), (0, 16, 0.1, 0.05, 0.2)])
    got, row = verdict_of({"relative_gains": rel}, "4 fts, equal cap")
    assert got == V.HOLDS and "left out: 1 cells without a ratio" in row["why"]
    only = gains("first_token", "pearl", [(0, 1, np.nan, np.nan, np.nan)])
    assert verdict_of({"relative_gains": only}, "4 fts, equal cap")[0] == V.UNMEASURED


def test_no_tables_measure_nothing_and_the_files_say_so(tmp_path):
    table = claims.write_claims({}, str(tmp_path / "claims"))
    assert len(table) == len(claims.CLAIMS) and set(table["verdict"]) == {V.UNMEASURED}
    text = (tmp_path / "claims.md").read_text()
    n = len(table)
    assert (f"{n} rows: 0 holds, 0 contradicted, 0 inconclusive, 0 illustrated, "
            f"{n} not measured") in text
    back = pd.read_csv(tmp_path / "claims.csv")
    assert list(back.columns) == claims.COLUMNS and len(back) == n


# -- claim 1: illustrated, or not ---------------------------------------------------------------

def test_exact_reuse_is_illustrated_only_where_an_interval_clears_zero():
    shown = reuse([("toy pair", 0, 90, 0.78, 0.76, 0.80), ("p", 0, 40, 0.21, 0.15, 0.27),
                   ("p", 1, 30, 0.05, -0.01, 0.11)])
    got, row = verdict_of({"reuse": shown}, "1 exact reuse")
    assert got == V.ILLUSTRATED and "1 of 2 cells' intervals lie above 0: p T=0" in row["why"]
    assert "toy pair, by construction" in row["ours"]
    # the check fails where the rows differ on average but no interval excludes 0 ...
    vague = reuse([("p", 0, 40, 0.05, 0.0, 0.11)])
    assert verdict_of({"reuse": vague}, "1 exact reuse")[0] == V.INCONCLUSIVE
    # ... and the toy pair, which differs by construction, is no evidence
    toy = reuse([("toy pair", 0, 90, 0.78, 0.76, 0.80), ("p", 0, 0, np.nan, np.nan, np.nan)])
    got, row = verdict_of({"reuse": toy}, "1 exact reuse")
    assert got == V.UNMEASURED and "no logged position" in row["why"]
    # the row one token short never counts: it compares contexts of different lengths
    short = reuse([("p", 0, 40, 0.3, 0.25, 0.35)], row="one token short")
    assert verdict_of({"reuse": short}, "1 exact reuse")[0] == V.UNMEASURED


# -- claim 2: not what the stale-row gain measures ----------------------------------------------

def test_the_stale_row_gain_is_no_evidence_for_the_kept_row_claim():
    rel = gains("target_rerank", "stale_rerank", [(0, 8, 0.3, 0.2, 0.4), (1, 8, 0.5, 0.4, 0.6)])
    got, row = verdict_of({"relative_gains": rel}, "2 cost of a kept row")
    assert got == V.UNMEASURED and "no decoder here makes this trade" in row["why"]


# -- claims 3 and 4 ------------------------------------------------------------------------------

def test_offline_claims_read_only_eagle3_pairs():
    rel = pd.concat([
        gains("target_rerank", "draft_rank", [(0, 8, 0.2, 0.1, 0.3)]),
        gains("target_rerank", "draft_rank", [(0, 8, -0.2, -0.3, -0.1)], "standalone", "s"),
    ])
    assert verdict_of({"relative_gains": rel}, "3 rerank, T=0")[0] == V.HOLDS
    standalone = rel[rel["draft_kind"] == "standalone"]
    got, row = verdict_of({"relative_gains": standalone}, "3 rerank, T=0")
    assert got == V.UNMEASURED and "no EAGLE-3 pair's cells" in row["why"]
    unsaid = standalone.drop(columns="draft_kind")
    got, row = verdict_of({"relative_gains": unsaid}, "3 rerank, T=0")
    assert got == V.UNMEASURED and "do not say which draft" in row["why"]


def test_small_budget_gain_against_the_large_budget_interval():
    def judged(small, large):
        rel = gains("target_rerank", "draft_rank", [(0, 2, *small), (0, 32, *large)])
        return verdict_of({"relative_gains": rel}, "3 rerank, small budgets")[0]

    assert judged((0.4, 0.3, 0.5), (0.05, 0.01, 0.09)) == V.HOLDS
    assert judged((0.10, 0.02, 0.18), (0.05, 0.01, 0.09)) == V.INCONCLUSIVE
    assert judged((0.02, 0.01, 0.03), (0.3, 0.2, 0.4)) == V.CONTRADICTED


def test_equal_size_names_the_cells_at_the_papers_tree_sizes():
    equal = pd.DataFrame([{"pair": "p", "draft_kind": "eagle3", "temperature": 0.0,
                           "rule": "first_token", "baseline": "pearl", "budget": b, "nodes": n,
                           "gain": g, "lo": lo, "hi": hi, "n_prompts": 14}
                          for b, n, g, lo, hi in [(8, 3.0, 0.2, 0.1, 0.3),
                                                  (59, 31.5, -0.1, -0.15, -0.05)]])
    got, row = verdict_of({"equal_size": equal}, "4 fts, equal size")
    assert got == V.CONTRADICTED
    assert "at the paper's tree sizes (pearl 27-39 nodes): p T=0 B=59 (31.5 nodes)" in row["ours"]
    small = equal[equal["budget"] == 8]
    got, row = verdict_of({"equal_size": small}, "4 fts, equal size")
    assert got == V.HOLDS and "at pearl's largest trees here: p T=0 B=8 (3.0 nodes)" in row["ours"]


# -- claim 5 ---------------------------------------------------------------------------------------

def fts_pearl(cells, nodes_gain=0.5, kind="eagle3"):
    """fts over pearl online: accepted cells (budget, baseline_budget, gain, lo, hi), and a
    nodes cell at each budget with `nodes_gain`."""
    acc = online_gain("fts", "pearl", "accepted", [(b, bb, False, g, lo, hi)
                                                   for b, bb, g, lo, hi in cells], kind)
    nodes = online_gain("fts", "pearl", "nodes",
                        [(b, bb, False, nodes_gain, nodes_gain - 0.1, nodes_gain + 0.1)
                         for b, bb, *_ in cells], kind)
    return pd.concat([acc, nodes])


def test_fts_online_is_judged_at_the_budget_closest_to_59():
    rows = fts_pearl([(8, 8, -0.2, -0.3, -0.1), (16, 16, -0.1, -0.2, -0.05),
                      (59, 59, 0.05, 0.04, 0.06)])
    got, row = verdict_of({"online_gain": rows}, "5 fts online, direction")
    assert got == V.HOLDS and row["conditions"].startswith("online, EAGLE-3 drafts, B=59,")
    assert "mean non-root nodes per round fts vs pearl: 15.0 vs 10.0 (T=0)" in row["ours"]
    assert verdict_of({"online_gain": rows}, "5 fts online, magnitude")[0] == V.HOLDS
    # 80 lies closer to 59 than 32 does
    far = fts_pearl([(32, 32, 0.2, 0.1, 0.3), (80, 80, -0.2, -0.3, -0.1)])
    got, row = verdict_of({"online_gain": far}, "5 fts online, direction")
    assert got == V.CONTRADICTED and "B=80 (the paper: 59)" in row["conditions"]
    assert closest_budget([16, 32, 80]) == 80 and closest_budget([58, 60]) == 60


def test_fts_online_fails_on_smaller_trees_on_fewer_tokens_and_off_the_papers_range():
    smaller = fts_pearl([(59, 59, 0.05, 0.04, 0.06)], nodes_gain=-0.5)
    assert verdict_of({"online_gain": smaller}, "5 fts online, direction")[0] == V.CONTRADICTED
    fewer = fts_pearl([(59, 59, -0.05, -0.06, -0.04)])
    assert verdict_of({"online_gain": fewer}, "5 fts online, direction")[0] == V.CONTRADICTED
    above = fts_pearl([(59, 59, 0.35, 0.16, 0.62)])
    got, row = verdict_of({"online_gain": above}, "5 fts online, magnitude")
    assert got == V.CONTRADICTED and "1 of 1 cells' intervals lie above the paper's" in row["why"]
    assert verdict_of({"online_gain": above}, "5 fts online, direction")[0] == V.HOLDS
    wide = fts_pearl([(59, 59, 0.12, 0.01, 0.25)])
    assert verdict_of({"online_gain": wide}, "5 fts online, magnitude")[0] == V.INCONCLUSIVE


def test_fts_online_reads_eagle3_runs_at_one_fixed_budget_only():
    rows = fts_pearl([(59, 59, 0.05, 0.04, 0.06)])
    # a standalone pair's run and a run against another budget are other claims' cells
    standalone = fts_pearl([(59, 59, -0.3, -0.4, -0.2)], kind="standalone")
    other = fts_pearl([(59, 16, -0.3, -0.4, -0.2)])
    got, _ = verdict_of({"online_gain": pd.concat([rows, standalone, other])},
                        "5 fts online, direction")
    assert got == V.HOLDS
    got, row = verdict_of({"online_gain": standalone}, "5 fts online, direction")
    assert got == V.UNMEASURED and "with EAGLE-3 drafts (this run's: standalone)" in row["why"]


# -- claims 6 and 7 --------------------------------------------------------------------------------

def test_speed_claims_need_a_standalone_draft_overlapped_on_a_second_device():
    speed = online_gain("rerank", "draft_rank", "tokens_per_s", [(16, 16, False, 0.2, 0.1, 0.3)])
    got, row = verdict_of({"online_gain": speed}, "6 rerank faster")
    assert got == V.HOLDS
    assert "root pass overlapped (target on cuda:0, draft on cuda:1)" in row["conditions"]
    assert verdict_of({"online_gain": speed}, "6 fts faster")[0] == V.UNMEASURED
    for changed, reason in [(dict(overlap=False), "no run overlapped the root pass"),
                            (dict(draft_device="cuda:0"), "no run overlapped the root pass"),
                            (dict(draft_device=None), "no run overlapped the root pass"),
                            (dict(draft_kind="eagle3"), "no standalone draft")]:
        got, row = verdict_of({"online_gain": speed.assign(**changed)}, "6 rerank faster")
        assert got == V.UNMEASURED and reason in row["why"], changed
    devices_unsaid = speed.drop(columns=["target_device", "draft_device"])
    assert verdict_of({"online_gain": devices_unsaid}, "6 rerank faster")[0] == V.UNMEASURED


def test_caps_8_reads_only_both_capped_at_8():
    rows = online_gain("fts", "pearl", "tokens_per_s", [(8, 8, False, 0.1, 0.05, 0.2),
                                                        (8, 16, False, -0.3, -0.4, -0.2),
                                                        (16, 16, False, -0.3, -0.4, -0.2)])
    got, row = verdict_of({"online_gain": rows}, "7 fts vs pearl, caps 8")
    assert got == V.HOLDS and row["conditions"].endswith("budgets 8")
    slower = rows.assign(gain=-0.1, lo=-0.2, hi=-0.05)
    assert verdict_of({"online_gain": slower}, "7 fts vs pearl, caps 8")[0] == V.CONTRADICTED


def test_a_matched_cap_counts_only_where_the_measured_trees_matched():
    speed = online_gain("fts", "pearl", "tokens_per_s", [(41, 59, True, 0.1, 0.05, 0.2)])
    sizes = online_gain("fts", "pearl", "nodes", [(41, 59, True, 0.02, -0.05, 0.08)])
    got, row = verdict_of({"online_gain": pd.concat([speed, sizes])}, "7 fts vs pearl, matched")
    assert got == V.HOLDS and "matched caps 41 against pearl at 59" in row["conditions"]
    larger = online_gain("fts", "pearl", "nodes", [(41, 59, True, 0.34, 0.15, 0.79)])
    got, row = verdict_of({"online_gain": pd.concat([speed, larger])}, "7 fts vs pearl, matched")
    assert got == V.UNMEASURED and "no matched cap matched pearl's measured tree size" in row["why"]
    # a matched cap whose trees were not measured is not taken as matched
    assert verdict_of({"online_gain": speed}, "7 fts vs pearl, matched")[0] == V.UNMEASURED


def test_empty_and_missing_tables_read_as_empty(tmp_path):
    pd.DataFrame().to_csv(tmp_path / "equal_size.csv", index=False)  # what a run writes for none
    gains("target_rerank", "draft_rank", [(0, 2, 0.4, 0.3, 0.5)]).to_csv(
        tmp_path / "relative_gains.csv", index=False)
    tables = claims.read_tables(str(tmp_path))
    assert tables["equal_size"].empty and tables["online_gain"].empty
    assert verdict_of(tables, "3 rerank, T=0")[0] == V.HOLDS
    assert verdict_of(tables, "4 fts, equal size")[0] == V.UNMEASURED


@pytest.mark.parametrize("verdict", V.VERDICTS)
def test_every_verdict_is_reached_by_some_planted_table(verdict):
    planted = [
        {"relative_gains": gains("target_rerank", "draft_rank", [(0, 2, 0.4, 0.3, 0.5)])},
        {"relative_gains": gains("target_rerank", "draft_rank", [(0, 2, -0.4, -0.5, -0.3)])},
        {"relative_gains": gains("target_rerank", "draft_rank", [(0, 2, 0.1, -0.1, 0.3)])},
        {"reuse": reuse([("p", 0, 40, 0.21, 0.15, 0.27)])},
        {},
    ]
    reached = {v for tables in planted for v in claims.claims_table(tables)["verdict"]}
    assert verdict in reached
