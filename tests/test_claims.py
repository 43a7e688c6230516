"""The claims table's verdicts on planted tables (holds, does not hold, not measured), and the
exact-reuse table against brute force on the toy pair's own rows."""

import numpy as np
import pytest
from needs import need_module
from test_rowlog import toy_record

from targetrows.analysis import claims
from targetrows.analysis.reuse import log_positions, toy_positions

pd = need_module("pandas")


def gains(rule, baseline, cells):
    """relative_gains rows: cells are (temperature, budget, gain, lo, hi)."""
    return pd.DataFrame([{"pair": "p", "temperature": t, "budget": b, "rule": rule,
                          "baseline": baseline, "metric": "accepted", "gain": g, "lo": lo,
                          "hi": hi, "n_prompts": 14} for t, b, g, lo, hi in cells])


def online_gain(decoder, baseline, metric, cells, kind="standalone", overlap=True):
    """online_gain rows: cells are (budget, baseline_budget, matched, gain, lo, hi)."""
    return pd.DataFrame([{"pair": "p", "temperature": 0.0, "decoder": decoder, "condition": 0,
                          "budget": b, "depth": 4, "auto": False, "matched": m,
                          "baseline": baseline, "baseline_budget": bb, "baseline_depth": 4,
                          "draft_kind": kind, "overlap": overlap, "metric": metric,
                          "value": 10.0 + g, "baseline_value": 10.0, "gain": g, "lo": lo,
                          "hi": hi} for b, bb, m, g, lo, hi in cells])


def verdicts(tables):
    table = claims.claims_table(tables)
    return dict(zip(table["claim"], table["verdict"], strict=True)), table.set_index("claim")


def test_rerank_holds_only_where_every_interval_lies_above_zero():
    rel = pd.concat([
        gains("target_rerank", "draft_rank", [(0, 2, 0.4, 0.3, 0.5), (0, 32, 0.02, 0.01, 0.03),
                                              (1, 2, 0.3, 0.2, 0.4), (1, 32, 0.01, -0.01, 0.03)]),
    ])
    got, table = verdicts({"relative_gains": rel})
    assert got["3 rerank, T=0"] == claims.HOLDS
    assert "+40.0% [+30.0, +50.0] (p T=0 B=2)" in table.loc["3 rerank, T=0", "ours"]
    assert got["3 rerank, T=1"] == claims.FAILS
    assert "1 of 2 cells' intervals include 0" in table.loc["3 rerank, T=1", "why"]
    # larger at small budgets: T=0's B=2 interval lies above B=32's, T=1's too
    assert got["3 rerank, small budgets"] == claims.HOLDS
    # nothing planted for these
    assert got["2 cost of a kept row"] == claims.UNMEASURED
    assert got["4 fts, equal size"] == claims.UNMEASURED


def test_a_gain_below_zero_is_named_with_its_cell():
    rel = gains("first_token", "pearl", [(0, 2, -0.45, -0.64, -0.12), (0, 16, 0.1, 0.05, 0.2)])
    got, table = verdicts({"relative_gains": rel})
    assert got["4 fts, equal cap"] == claims.FAILS
    assert "lowest: -45.0% [-64.0, -12.0] at p T=0 B=2" in table.loc["4 fts, equal cap", "why"]


def test_a_cell_without_a_ratio_is_left_out_and_named():
    # pearl at budget 1 accepts nothing: no ratio, no interval; it neither makes nor breaks it
    rel = gains("first_token", "pearl", [(0, 1, np.nan, np.nan, np.nan),
                                         (0, 16, 0.1, 0.05, 0.2)])
    got, table = verdicts({"relative_gains": rel})
    assert got["4 fts, equal cap"] == claims.HOLDS
    assert "left out: 1 cells without a ratio" in table.loc["4 fts, equal cap", "why"]
    assert "p T=0 B=1" in table.loc["4 fts, equal cap", "why"]
    only = gains("first_token", "pearl", [(0, 1, np.nan, np.nan, np.nan)])
    assert verdicts({"relative_gains": only})[0]["4 fts, equal cap"] == claims.UNMEASURED


def test_small_budget_gain_must_clear_the_large_budget_interval():
    rel = gains("target_rerank", "draft_rank", [(0, 2, 0.10, 0.02, 0.18),
                                                (0, 32, 0.05, 0.01, 0.09)])
    got, table = verdicts({"relative_gains": rel})
    assert got["3 rerank, small budgets"] == claims.FAILS
    assert "p T=0" in table.loc["3 rerank, small budgets", "why"]


def test_speed_claims_need_a_standalone_draft_and_an_overlapped_root_pass():
    speed = online_gain("rerank", "draft_rank", "tokens_per_s", [(16, 16, False, 0.2, 0.1, 0.3)])
    got, table = verdicts({"online_gain": speed})
    assert got["6 rerank faster"] == claims.HOLDS
    assert "root pass overlapped" in table.loc["6 rerank faster", "conditions"]
    assert got["6 fts faster"] == claims.UNMEASURED  # no fts run at all
    got, table = verdicts({"online_gain": speed.assign(overlap=False)})
    assert got["6 rerank faster"] == claims.UNMEASURED
    assert "no run overlapped the root pass" in table.loc["6 rerank faster", "why"]
    got, table = verdicts({"online_gain": speed.assign(draft_kind="eagle3")})
    assert got["6 rerank faster"] == claims.UNMEASURED
    assert "no standalone draft" in table.loc["6 rerank faster", "why"]


def test_fts_against_pearl_online_at_equal_and_matched_caps():
    rows = pd.concat([
        online_gain("fts", "pearl", "accepted", [(16, 16, False, 0.15, 0.05, 0.3),
                                                 (5, 16, True, -0.05, -0.2, 0.1)]),
        online_gain("fts", "pearl", "nodes", [(16, 16, False, 1.8, 1.5, 2.2)]),
        online_gain("fts", "pearl", "tokens_per_s", [(8, 8, False, -0.06, -0.09, -0.02),
                                                     (5, 16, True, 0.03, -0.01, 0.07)]),
    ])
    got, table = verdicts({"online_gain": rows})
    assert got["5 fts online"] == claims.HOLDS  # the matched run is not the equal-cap one
    assert "B=16 (the paper: 59)" in table.loc["5 fts online", "conditions"]
    assert "11.8 vs 10.0" in table.loc["5 fts online", "ours"]
    assert got["7 fts vs pearl, caps 8"] == claims.FAILS
    assert got["7 fts vs pearl, matched"] == claims.FAILS
    assert "matched caps 5 against pearl at 16" in table.loc["7 fts vs pearl, matched",
                                                             "conditions"]
    # smaller trees do not make the claim: it is a gain of larger trees
    shrunk = rows.assign(value=np.where(rows["metric"] == "nodes", 5.0, rows["value"]))
    assert verdicts({"online_gain": shrunk})[0]["5 fts online"] == claims.FAILS


def test_no_tables_measure_nothing_and_the_files_say_so(tmp_path):
    table = claims.write_claims({}, str(tmp_path / "claims"))
    assert len(table) >= 8 and set(table["verdict"]) == {claims.UNMEASURED}
    text = (tmp_path / "claims.md").read_text()
    assert f"{len(table)} rows: 0 holds, 0 does not hold, {len(table)} not measured" in text
    back = pd.read_csv(tmp_path / "claims.csv")
    assert list(back.columns) == claims.COLUMNS and len(back) == len(table)


def test_reuse_on_row_logs_equals_the_toy_pairs_own_rows(tmp_path):
    pair, log, _ = toy_record(tmp_path)
    got = log_positions(log)
    expected = []
    for r in np.flatnonzero(log.rec_scored):
        s, t = int(log.rec_segment[r]), int(log.rec_position[r])
        context = [*log.prompt(s), *log.trajectory(s)[:t]]
        tokens, parents, _, _ = log.pool(r)
        first = tokens[parents == 0]
        exact = pair.target_row(context)[first]
        stale = pair.target_row(context[:-1])[first]
        expected.append((0.5 * np.abs(exact - stale).sum(),
                         first[np.argmax(exact)] != first[np.argmax(stale)],
                         first[np.argmax(exact)] == log.trajectory(s)[t]))
    tv, differs, next_exact = map(np.array, zip(*expected, strict=True))
    assert got["tv"] == pytest.approx(tv, abs=1e-5)  # the log keeps float32
    assert np.array_equal(got["best_differs"], differs)
    assert np.array_equal(got["next_best_exact"], next_exact)


def test_the_next_root_is_never_among_the_verify_pass_rows():
    toy = toy_positions(0.0, prompts=3, max_new_tokens=24)
    assert len(toy["found"]) > 10 and not toy["found"].any()
    assert toy["next_best_exact"].all()  # greedy: the exact row's first token comes next
    assert (toy["tv"] > 0).all() and toy["best_differs"].mean() > 0.5


def test_fts_online_is_judged_on_eagle3_drafts_where_the_run_has_them():
    heads = pd.concat([online_gain("fts", "pearl", "accepted", [(59, 59, False, 0.05, 0.02, 0.08)],
                                   kind="eagle3"),
                       online_gain("fts", "pearl", "nodes", [(59, 59, False, 0.5, 0.4, 0.6)],
                                   kind="eagle3")])
    standalone = online_gain("fts", "pearl", "accepted", [(59, 59, False, -0.1, -0.2, -0.05)])
    got, table = verdicts({"online_gain": pd.concat([heads, standalone])})
    assert got["5 fts online"] == claims.HOLDS  # the standalone pair's cell is claim 7's
    assert table.loc["5 fts online", "conditions"] == "online, B=59, eagle3 drafts"
    got, table = verdicts({"online_gain": pd.concat([heads, standalone.assign(
        metric="tokens_per_s", budget=8, baseline_budget=8, overlap=False)])})
    assert got["7 fts vs pearl, caps 8"] == claims.FAILS
    assert "root pass in turn" in table.loc["7 fts vs pearl, caps 8", "conditions"]


def test_empty_and_missing_tables_read_as_empty(tmp_path):
    pd.DataFrame().to_csv(tmp_path / "equal_size.csv", index=False)  # what a run writes for none
    gains("target_rerank", "draft_rank", [(0, 2, 0.4, 0.3, 0.5)]).to_csv(
        tmp_path / "relative_gains.csv", index=False)
    tables = claims.read_tables(str(tmp_path))
    assert tables["equal_size"].empty and tables["online_gain"].empty
    got, _ = verdicts(tables)
    assert got["3 rerank, T=0"] == claims.HOLDS and got["4 fts, equal size"] == claims.UNMEASURED
