"""The online tables: one definition of a run's mean per round (totals over all its rounds,
prompts pooled) in `online` and `online_gain` alike, and the devices each run used, read from
the conditions files into the comparisons the speed claims rest on."""

import pytest
from needs import need_module

from targetrows.analysis.online import conditions, online, online_gains
from targetrows.pipeline.conditions import resolve, write_conditions

pd = need_module("pandas")


def _runs():
    """Two prompts of very different lengths: per-prompt means and pooled means part."""
    rows = []
    for decoder, budget, per_prompt in [("ar", 0, [(0, 0, 4), (0, 0, 40)]),
                                        ("fts", 16, [(2, 20, 2), (90, 600, 30)]),
                                        ("pearl", 16, [(1, 10, 2), (30, 300, 30)])]:
        for q, (accepted, nodes, rounds) in enumerate(per_prompt):
            rows.append({"pair": "p", "task": "t", "temperature": 0.0, "prompt_id": str(q),
                         "decoder": decoder, "budget": budget, "depth": 4 if budget else 0,
                         "new_tokens": 40, "wall_time": 2.0, "rounds": rounds,
                         "committed": 40, "accepted": accepted, "nodes": nodes,
                         "draft_kind": "standalone" if budget else "none",
                         "overlap": bool(budget)})
    return pd.DataFrame(rows)


def _plan(tmp_path, devices):
    paths = []
    for decoder, specs in [("ar", [1]), ("fts", [16]), ("pearl", [16])]:
        path = tmp_path / f"{decoder}.json"
        write_conditions(str(path), "p", 0.0, decoder, resolve(decoder, specs, 4), devices)
        paths.append(str(path))
    return conditions(paths)


def test_a_runs_mean_tree_size_is_one_pooled_mean_in_both_tables(tmp_path):
    runs, plan = _runs(), _plan(tmp_path, {"target": "cuda:0", "draft": "cuda:1"})
    table = online(runs, plan, n_boot=200).set_index("decoder")
    gain = online_gains(runs, plan, n_boot=200, seed=0)
    nodes = gain[(gain["decoder"] == "fts") & (gain["metric"] == "nodes")].iloc[0]
    # total nodes over total rounds: 620 / 32 and 310 / 32, not the means of 10 and 20, 5 and 10
    assert nodes["value"] == pytest.approx(620 / 32) == table.loc["fts", "nodes_per_round"]
    assert nodes["baseline_value"] == pytest.approx(310 / 32)
    assert nodes["gain"] == pytest.approx(620 / 310 - 1)
    accepted = gain[(gain["decoder"] == "fts") & (gain["metric"] == "accepted")].iloc[0]
    assert accepted["value"] == pytest.approx(table.loc["fts", "accepted_per_round"])
    assert accepted["gain"] == pytest.approx(92 / 31 - 1)


def test_the_devices_of_each_run_reach_its_comparisons(tmp_path):
    runs = _runs()
    gain = online_gains(runs, _plan(tmp_path, {"target": "cuda:0", "draft": "cuda:1"}), 200, 0)
    assert set(gain["target_device"]) == {"cuda:0"} and set(gain["draft_device"]) == {"cuda:1"}
    # a conditions file written before it recorded the devices says nothing of them
    gain = online_gains(runs, _plan(tmp_path, None), 200, 0)
    assert gain["target_device"].isna().all() and gain["draft_device"].isna().all()
