"""The tables put each of our rules and decoders beside each prior-art one (sequoia offline;
sequoia, racer and recycle online), paired by prompt, at the same condition."""

import numpy as np
import pytest
from needs import need_module

from targetrows.analysis.tables import comparisons
from targetrows.decoding.registry import DECODERS, RULES


def test_row_log_comparisons_add_each_of_ours_over_each_prior_art_rule():
    present = set(RULES)
    pairs = comparisons(present)
    ours = ["target_rerank", "stale_rerank", "first_token", "first_token_redraft",
            "learned_rerank", "learned_stale_rerank"]
    assert [(r, b) for r, b in pairs if b == "sequoia"] == [(r, "sequoia") for r in ours]
    assert ("sequoia", "draft_rank") in pairs  # its own baseline
    assert all(b != "sequoia" for _, b in comparisons(present - {"sequoia"}))
    assert len(pairs) == len(set(pairs))


def _runs(pd):
    """Online answers of four prompts: ar, fts and rerank (ours), racer and sequoia (prior
    art) at B=16, and fts, racer at their own auto picks."""
    rows = []
    for decoder, budget, depth, accepted in [
        ("ar", 0, 0, [0, 0, 0, 0]), ("fts", 16, 4, [30, 20, 40, 10]),
        ("rerank", 16, 4, [25, 25, 25, 25]), ("racer", 16, 4, [10, 10, 20, 10]),
        ("sequoia", 16, 4, [20, 10, 20, 20]), ("fts", 24, 3, [40, 40, 40, 40]),
        ("racer", 8, 4, [5, 10, 10, 5]),
    ]:
        for q, a in enumerate(accepted):
            rows.append({"pair": "p", "task": "t", "temperature": 0.0, "prompt_id": str(q),
                         "decoder": decoder, "budget": budget, "depth": depth,
                         "new_tokens": 40, "wall_time": 1.0 + q, "rounds": 10,
                         "committed": 40, "accepted": a, "nodes": 100})
    return pd.DataFrame(rows)


def _plan(pd):
    rows = [("ar", 0, 0, 0, None, False), ("fts", 0, 16, 4, "pearl", False),
            ("fts", 1, 24, 3, "pearl", True), ("rerank", 0, 16, 4, None, False),
            ("racer", 0, 16, 4, None, False), ("racer", 1, 8, 4, None, True),
            ("sequoia", 0, 16, 4, "draft_rank", False)]
    frame = pd.DataFrame([{"pair": "p", "temperature": 0.0, "decoder": d, "condition": c,
                           "budget": b, "depth": depth, "baseline": base,
                           "baseline_budget": b if base else None, "matched": False,
                           "auto": auto} for d, c, b, depth, base, auto in rows])
    from targetrows.analysis.online import _baseline_runs

    return _baseline_runs(frame)


def test_online_gains_pair_each_of_our_decoders_with_each_prior_art_run():
    pd = need_module("pandas")
    from targetrows.analysis.online import online_gains

    assert DECODERS["fts"].ours and DECODERS["racer"].prior_art
    gains = online_gains(_runs(pd), _plan(pd), n_boot=200, seed=0)
    accepted = gains[gains["metric"] == "accepted"].set_index(["decoder", "budget", "baseline"])
    # at B=16: fts and rerank over racer and sequoia, prompt by prompt
    assert accepted.loc[("fts", 16, "racer"), "gain"] == pytest.approx(100 / 50 - 1)
    assert accepted.loc[("fts", 16, "sequoia"), "gain"] == pytest.approx(100 / 70 - 1)
    assert accepted.loc[("rerank", 16, "racer"), "gain"] == pytest.approx(100 / 50 - 1)
    assert accepted.loc[("rerank", 16, "sequoia"), "baseline_budget"] == 16
    # fts's auto pick against racer's own auto pick (B=8), none against sequoia (no auto run)
    assert accepted.loc[("fts", 24, "racer"), "gain"] == pytest.approx(160 / 30 - 1)
    assert accepted.loc[("fts", 24, "racer"), "baseline_budget"] == 8
    assert ("fts", 24, "sequoia") not in accepted.index
    # sequoia is prior art: compared with its own baseline only (not run here), never with racer
    assert not {"racer", "sequoia", "ar"} & set(gains["decoder"])
    row = accepted.loc[("fts", 16, "racer")]
    assert row["lo"] <= row["gain"] <= row["hi"] and np.isfinite(row["lo"])
