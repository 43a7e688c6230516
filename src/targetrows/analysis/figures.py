"""The pipeline's figures under results/figures/ (PNG and PDF), drawn from the tables' tidy CSVs:

expected_accepted      expected accepted draft tokens per pass against the budget, one line per
                       rule; columns: pairs, rows: temperatures.
accepted_vs_tree_size  the same against the mean non-root nodes actually verified (pearl's and
                       first_token's trees are smaller than their budget).
relative_gains         gains with 95% CIs against the budget, one line per comparison.
online                 speedup over ar and accepted draft tokens per round with 95% CIs by
                       prompt, one bar per run labelled with its condition ("fts B=16",
                       "draft_rank auto: B=24 d=3"), per pair and temperature.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # no display on servers and in CI

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from targetrows.decoding.registry import DECODERS, RULES  # noqa: E402

from .frames import in_order  # noqa: E402
from .online import RUN as RUN_KEYS  # noqa: E402
from .online import condition_label  # noqa: E402
from .output import save_figure  # noqa: E402


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
    names = sorted(gains["comparison"].unique())
    # more comparisons than the default palette's 10 colours (the prior art's): evenly spaced
    palette = dict(zip(names, sns.color_palette(None if len(names) <= 10 else "husl",
                                                len(names)), strict=True))
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


ONLINE_BARS = {  # metric: (its label, the CI columns)
    "speedup": ("speedup over ar", "speedup_lo", "speedup_hi"),
    "accepted_per_round": ("accepted draft tokens / round", "accepted_lo", "accepted_hi"),
}


def online(table: pd.DataFrame):
    """Speed-up over ar and accepted draft tokens per round of every run, with 95% CIs by
    prompt: one row of panels per temperature, one panel per pair and metric; each panel has
    only the runs made at its temperature, each bar labelled with its condition (budget, or
    the auto pick's budget and depth)."""
    runs = table.drop_duplicates(RUN_KEYS).copy()
    runs["order"] = runs["decoder"].map(
        {d: i for i, d in enumerate(in_order(runs["decoder"], DECODERS))})
    runs = runs.sort_values(["order", "condition"])
    pairs, temps = list(dict.fromkeys(runs["pair"])), sorted(runs["temperature"].unique())
    ncols = len(pairs) * len(ONLINE_BARS)
    fig, axes = plt.subplots(len(temps), ncols, squeeze=False,
                             figsize=(3.6 * ncols, 2.9 * len(temps)))
    names = in_order(runs["decoder"], DECODERS)
    colors = dict(zip(names, sns.color_palette("deep", len(names)), strict=True))
    for i, temp in enumerate(temps):
        for j, (pair, (metric, (label, lo, hi))) in enumerate(
                (p, m) for p in pairs for m in ONLINE_BARS.items()):
            ax = axes[i, j]
            mine = runs[(runs["pair"] == pair) & (runs["temperature"] == temp)]
            x = np.arange(len(mine))
            value = mine[metric].to_numpy(float)
            err = np.abs(np.vstack([value - mine[lo].to_numpy(float),
                                    mine[hi].to_numpy(float) - value]))
            ax.bar(x, value, yerr=np.nan_to_num(err), capsize=2,
                   color=[colors[d] for d in mine["decoder"]])
            if metric == "speedup":
                ax.axhline(1.0, color="0.4", linewidth=0.8, linestyle="--")
            ax.set_xticks(x, [condition_label(r) for r in mine.itertuples(index=False)],
                          rotation=45, ha="right", rotation_mode="anchor", fontsize=7)
            ax.set_title(f"{label}, T={temp:g}" + (f"\n{pair}" if len(pairs) > 1 else ""),
                         fontsize=9)
    fig.tight_layout()
    return fig


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
