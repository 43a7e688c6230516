"""The pipeline's figures under results/figures/ (PNG and PDF), drawn from the tables' tidy CSVs:

expected_accepted      expected accepted draft tokens per pass against the budget, one line per
                       rule; columns: pairs, rows: temperatures.
accepted_vs_tree_size  the same against the mean non-root nodes actually verified (pearl's and
                       first_token's trees are smaller than their budget).
relative_gains         gains with 95% CIs against the budget, one line per comparison.
online                 tokens/s, speedup over ar, accepted draft tokens and non-root nodes per
                       round, by decoder and budget condition (each bar labelled "decoder B=b"),
                       per pair and temperature.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # no display on servers and in CI

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from targetrows.decoding.registry import DECODERS, RULES  # noqa: E402

from .frames import in_order  # noqa: E402
from .output import save_figure  # noqa: E402

ONLINE_METRICS = {
    "tokens_per_s": "tokens/s",
    "speedup": "speedup over ar",
    "accepted_per_round": "accepted draft tokens / round",
    "nodes_per_round": "non-root nodes / round",
}


def _facets(frame: pd.DataFrame, **kwargs):
    grid = sns.relplot(data=frame, col="pair", row="temperature", kind="line", marker="o",
                       height=3.0, aspect=1.2, facet_kws={"sharey": False}, **kwargs)
    grid.set_titles("{col_name}, T={row_name}", size=9)
    return grid


def expected_accepted(acc: pd.DataFrame):
    grid = _facets(acc, x="budget", y="accepted", hue="rule",
                   hue_order=in_order(acc["rule"], RULES))
    grid.set(xscale="log", xlabel="budget B (non-root nodes)", ylabel="expected accepted")
    for ax in grid.axes.flat:
        ticks = sorted(acc["budget"].unique())
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
    return grid.figure


def accepted_vs_tree_size(acc: pd.DataFrame):
    grid = _facets(acc, x="nodes", y="accepted", hue="rule", sort=True,
                   hue_order=in_order(acc["rule"], RULES))
    grid.set(xlabel="mean non-root nodes verified", ylabel="expected accepted")
    return grid.figure


def relative_gains(gains: pd.DataFrame):
    gains = gains.assign(comparison=gains["rule"] + " / " + gains["baseline"])
    pairs, temps = sorted(gains["pair"].unique()), sorted(gains["temperature"].unique())
    fig, axes = plt.subplots(len(temps), len(pairs), squeeze=False, sharex=True,
                             figsize=(3.6 * len(pairs), 2.8 * len(temps)))
    palette = dict(zip(sorted(gains["comparison"].unique()), sns.color_palette(), strict=False))
    for i, temp in enumerate(temps):
        for j, pair in enumerate(pairs):
            ax = axes[i, j]
            sub = gains[(gains["pair"] == pair) & (gains["temperature"] == temp)]
            for name, grp in sub.groupby("comparison"):
                grp = grp.sort_values("budget")
                y = 100 * grp["gain"]
                err = [y - 100 * grp["lo"], 100 * grp["hi"] - y]
                ax.errorbar(grp["budget"], y, yerr=err, marker="o", capsize=3, label=name,
                            color=palette[name])
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_xscale("log")
            ticks = sorted(gains["budget"].unique())
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.minorticks_off()
            ax.set_title(f"{pair}, T={temp:g}", fontsize=9)
            ax.set_xlabel("budget B")
            ax.set_ylabel("relative gain (%)")
    axes[0, -1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def condition_label(run) -> str:
    """'fts B=42', 'fts B=42 (= pearl 59)' for a matched cap, 'ar' for a decoder without a tree."""
    if run.decoder in DECODERS and not DECODERS[run.decoder].drafts:
        return run.decoder
    label = f"{run.decoder} B={int(run.budget)}"
    matched = getattr(run, "matched", False)
    if pd.notna(matched) and bool(matched):
        label += f" (= {run.baseline} {int(run.baseline_budget)})"
    return label


def online(table: pd.DataFrame):
    """Every decoder at every budget condition, each bar labelled with its budget."""
    runs = table.drop_duplicates(["pair", "temperature", "decoder", "budget"])
    runs = runs.sort_values(["decoder", "condition"])
    runs = runs.assign(run=[condition_label(r) for r in runs.itertuples(index=False)])
    order = [label for d in in_order(runs["decoder"], DECODERS)
             for label in dict.fromkeys(runs.loc[runs["decoder"] == d, "run"])]
    long = runs.melt(id_vars=["pair", "temperature", "run"],
                     value_vars=list(ONLINE_METRICS), var_name="metric")
    long["metric"] = long["metric"].map(ONLINE_METRICS)
    grid = sns.catplot(data=long, x="run", y="value", hue="pair", col="metric",
                       row="temperature", kind="bar", sharey=False, height=2.8, aspect=1.4,
                       order=order)
    grid.set_titles("{col_name}, T={row_name}")
    grid.set_axis_labels("", "")
    for ax in grid.axes.flat:
        for label in ax.get_xticklabels():
            label.set(rotation=45, ha="right", rotation_mode="anchor")
    return grid.figure


def draw_all(accepted_csv: str, gains_csv: str, online_csv: str, outputs: dict, log) -> None:
    """Every figure; `outputs` maps each name to its (png, pdf) paths."""
    sns.set_theme(style="whitegrid", context="paper")
    acc = pd.read_csv(accepted_csv)
    draw = {
        "expected_accepted": lambda: expected_accepted(acc),
        "accepted_vs_tree_size": lambda: accepted_vs_tree_size(acc),
        "relative_gains": lambda: relative_gains(pd.read_csv(gains_csv)),
        "online": lambda: online(pd.read_csv(online_csv)),
    }
    for name, make in draw.items():
        fig = make()
        save_figure(fig, *outputs[name])
        plt.close(fig)
        print(f"wrote {name}", file=log)
