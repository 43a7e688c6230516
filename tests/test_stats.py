"""Paired gains and their bootstrap intervals, on simulated tables with a known answer."""

import numpy as np
import pytest

from targetrows.analysis.stats import equal_size_gain, paired_gain, summarize


def make_table(prompt, position, rules: dict, budget=8, task="qa"):
    """A score table: `rules` maps rule -> (accepted, nodes) arrays over the same positions."""
    n = len(prompt)
    cols = {k: [] for k in ("pair", "task", "temperature", "prompt_id", "turn", "position",
                            "rule", "budget", "accepted", "nodes", "committed")}
    for name, (acc, nodes) in rules.items():
        cols["pair"] += ["p"] * n
        cols["task"] += [task] * n
        cols["temperature"] += [1.0] * n
        cols["prompt_id"] += [str(p) for p in prompt]
        cols["turn"] += [0] * n
        cols["position"] += list(position)
        cols["rule"] += [name] * n
        cols["budget"] += list(np.broadcast_to(budget, n))
        cols["accepted"] += list(acc)
        cols["nodes"] += list(np.broadcast_to(nodes, n))
        cols["committed"] += list(np.asarray(acc) + 1)
    return {k: np.array(v, dtype=object if k in ("pair", "task", "prompt_id", "rule") else None)
            for k, v in cols.items()}


def simulate(rng, gain, n_prompts=40):
    """Positions clustered in prompts: a prompt effect shared by both rules, so positions of a
    prompt are correlated; the true gain is E[rule] / E[baseline] - 1 = `gain`."""
    sizes = rng.integers(5, 40, n_prompts)
    prompt = np.repeat(np.arange(n_prompts), sizes)
    position = np.concatenate([np.arange(s) for s in sizes])
    effect = rng.gamma(2.0, 0.5, n_prompts)[prompt]
    base = effect * rng.gamma(16.0, 1 / 16, len(prompt))
    drift = rng.normal(0.0, 0.15, n_prompts)[prompt]  # the gain itself varies by prompt
    rule = (1 + gain + drift) * effect * rng.gamma(16.0, 1 / 16, len(prompt))
    return make_table(prompt, position, {"rule": (rule, 8), "base": (base, 8)})


def test_bootstrap_interval_covers_the_true_gain_about_95_percent():
    rng = np.random.default_rng(12345)
    reps, hits, widths = 400, 0, []
    for r in range(reps):
        g = paired_gain(simulate(rng, 0.10), "rule", "base", n_boot=500, seed=r)
        assert len(g["gain"]) == 1 and g["n_prompts"][0] == 40
        hits += g["lo"][0] <= 0.10 <= g["hi"][0]
        widths.append(g["hi"][0] - g["lo"][0])
    assert 0.91 <= hits / reps <= 0.98, hits / reps  # measured: 0.92 (0.935, 0.94 at seeds 1, 2)
    assert 0.05 < np.mean(widths) < 0.5  # a real interval, not a degenerate one


def test_point_estimate_is_the_ratio_of_totals_per_group():
    table = make_table([0, 0, 1, 1], [0, 1, 0, 1], {"a": ([1, 2, 3, 4], 4), "b": ([1, 1, 1, 2], 4)})
    other = make_table([0, 1], [0, 0], {"a": ([3, 3], 4), "b": ([1, 2], 4)}, task="code")
    both = {k: np.concatenate([table[k], other[k]]) for k in table}
    g = paired_gain(both, "a", "b", n_boot=200)
    assert list(g["task"]) == ["code", "qa"]
    assert g["gain"] == pytest.approx([6 / 3 - 1, 10 / 5 - 1])
    assert np.all(g["lo"] <= g["gain"]) and np.all(g["gain"] <= g["hi"])
    assert list(g["n_positions"]) == [2, 4]


def test_unpaired_or_unknown_rules_are_refused():
    table = make_table([0, 0, 1], [0, 1, 0], {"a": ([1, 2, 3], 4)})
    extra = make_table([0, 0], [0, 2], {"b": ([1, 1], 4)})
    both = {k: np.concatenate([table[k], extra[k]]) for k in table}
    with pytest.raises(ValueError, match="same positions"):
        paired_gain(both, "a", "b")
    with pytest.raises(ValueError, match="'c' is not in the table"):
        paired_gain(both, "a", "c")


def test_equal_size_gain_interpolates_the_rule_curve():
    """Rule: accepted = 0.5 x nodes at nodes = budget; baseline: trees of 0.6 x budget nodes
    accepting 0.4 x nodes. At the baseline's sizes the rule accepts 0.5 / 0.4 = 1.25 x."""
    rng = np.random.default_rng(0)
    parts = []
    for budget in (2, 4, 8, 16):
        prompt = np.repeat(np.arange(20), 10)
        position = np.tile(np.arange(10), 20)
        noise = rng.normal(0, 0.05, (2, 200))
        nodes_b = rng.choice([0.6 * budget - 0.4, 0.6 * budget + 0.4], 200)
        rules = {"rule": (0.5 * budget * (1 + noise[0]), budget),
                 "base": (0.4 * nodes_b * (1 + noise[1]), nodes_b)}
        parts.append(make_table(prompt, position, rules, budget=budget))
    table = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    table["nodes"] = table["nodes"].astype(float)
    e = equal_size_gain(table, "rule", "base", n_boot=500)
    assert list(e["budget"]) == [2, 4, 8, 16]
    assert e["nodes"] == pytest.approx([1.2, 2.4, 4.8, 9.6], abs=0.05)
    assert e["gain"] == pytest.approx(0.25, abs=0.01)
    assert np.all((e["lo"] <= 0.25) & (0.25 <= e["hi"]))
    # the other way round, the rule's largest trees (16 nodes) exceed the baseline's curve
    back = equal_size_gain(table, "base", "rule", n_boot=100)
    assert back["gain"][:2] == pytest.approx(-0.2, abs=0.01)
    assert np.isnan(back["gain"][-1]) and np.isnan(back["lo"][-1])


def test_summarize_means_per_rule_and_budget():
    table = make_table([0, 0, 1], [0, 1, 0], {"a": ([1, 2, 3], 4), "b": ([0, 0, 3], 2)})
    s = summarize(table)
    assert list(s["rule"]) == ["a", "b"]
    assert s["accepted"] == pytest.approx([2, 1])
    assert s["nodes"] == pytest.approx([4, 2])
    assert list(s["n_positions"]) == [3, 3]
