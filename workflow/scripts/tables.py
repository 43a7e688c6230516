"""Tables under results/tables/ (CSV tidy; Markdown and LaTeX pivoted for reading).

From the row-log score tables, one target x temperature at a time (tasks pooled; a prompt is
identified by task and prompt id, the bootstrap's resampling unit):

expected_accepted  expected accepted draft tokens per verify pass by pair, temperature, rule and
                   budget, with mean non-root nodes and tokens committed per pass.
relative_gains     paired gains with 95% bootstrap CIs (targetrows.stats.paired_gain):
                   first_token over pearl, target_rerank over draft_rank, stale_rerank over
                   draft_rank (what inexact row reuse keeps).
equal_size         first_token over pearl at pearl's mean tree size (equal_size_gain).

From the online runs (results/summary/online.csv):

online             tokens/s, speedup over ar, accepted draft tokens, non-root nodes and tokens
                   committed per round, by decoder and budget condition.
online_gain        fts over pearl in accepted draft tokens per round (each prompt's mean over
                   its rounds; paired by prompt), condition by condition (fts's i-th budget
                   against pearl's i-th), with 95% CIs.
consistency        online draft_rank against the scored draft_rank expectation, same budget.
"""

import re
import sys
from collections import defaultdict

import numpy as np
import pandas as pd
from decode import matched
from outputs import write_table

from targetrows.analysis import stats

RULES = ["draft_rank", "target_rerank", "stale_rerank", "pearl", "first_token"]
DECODERS = ["ar", "draft_rank", "rerank", "fts", "pearl"]
COMPARISONS = [("first_token", "pearl"), ("target_rerank", "draft_rank"),
               ("stale_rerank", "draft_rank")]
SCORE_PATH = re.compile(r"(?P<target>[^/]+)/(?P<task>[^/]+)/T(?P<temperature>[^/]+)\.csv$")
STRINGS = ("pair", "task", "prompt_id", "rule")


def score_groups(paths: list[str]) -> dict[tuple[str, str], list[str]]:
    """Score tables grouped by (target, temperature), from their paths."""
    groups = defaultdict(list)
    for path in paths:
        m = SCORE_PATH.search(path)
        if m is None:
            raise ValueError(f"{path}: not a results/scores/<target>/<task>/T<t>.csv path")
        groups[m["target"], m["temperature"]].append(path)
    return dict(groups)


def read_scores(paths: list[str]) -> dict[str, np.ndarray]:
    """One group's score tables as stats' table (a dict of columns), prompt ids made unique
    across tasks."""
    frame = pd.concat([pd.read_csv(p, dtype={k: str for k in STRINGS}) for p in paths],
                      ignore_index=True)
    frame["prompt_id"] = frame["task"] + "/" + frame["prompt_id"]
    return {k: frame[k].to_numpy(dtype=str if k in STRINGS else None) for k in frame.columns}


def tidy(columns: dict) -> pd.DataFrame:
    return pd.DataFrame({k: np.asarray(v) for k, v in columns.items()})


def row_log_tables(paths: list[str], n_boot: int, seed: int):
    """(expected_accepted, relative_gains, equal_size) over every target x temperature."""
    acc, gains, equal = [], [], []
    for _, files in sorted(score_groups(paths).items()):
        table = read_scores(files)
        acc.append(tidy(stats.summarize(table, by=("pair", "temperature", "rule", "budget"))))
        present = set(table["rule"])
        for rule, baseline in COMPARISONS:
            if {rule, baseline} <= present:
                gains.append(tidy(stats.paired_gain(
                    table, rule, baseline, by=("pair", "temperature", "budget"),
                    n_boot=n_boot, seed=seed)))
        if {"first_token", "pearl"} <= present:
            equal.append(tidy(stats.equal_size_gain(
                table, "first_token", "pearl", by=("pair", "temperature"), n_boot=n_boot,
                seed=seed)))
    return (pd.concat(acc, ignore_index=True), pd.concat(gains, ignore_index=True),
            pd.concat(equal, ignore_index=True) if equal else pd.DataFrame())


def conditions(decoding: pd.DataFrame, budgets: list[int], fts_budgets: list) -> pd.DataFrame:
    """Which run is budget condition i of each decoder: budgets[i] for the tree decoders,
    fts_budgets[i] for fts ('matched' resolved from pearl's runs as decode.py resolves it),
    the single run for ar. Columns: pair, temperature, decoder, budget, condition."""
    rows = []
    for (pair, temp), runs in decoding.groupby(["pair", "temperature"]):
        pearl = runs[runs["decoder"] == "pearl"]
        for decoder in runs["decoder"].unique():
            if decoder == "ar":
                plan = [int(runs.loc[runs["decoder"] == "ar", "budget"].iloc[0])]
            elif decoder == "fts":
                plan = []
                for i, b in enumerate(fts_budgets):
                    if b == "matched":
                        at = pearl[pearl["budget"] == budgets[i]]
                        b = matched(at["nodes"].sum() / at["rounds"].sum())
                    plan.append(int(b))
            else:
                plan = list(budgets)
            rows += [(pair, temp, decoder, b, i) for i, b in enumerate(plan)]
    return pd.DataFrame(rows, columns=["pair", "temperature", "decoder", "budget", "condition"])


def online(decoding: pd.DataFrame, plan: pd.DataFrame) -> pd.DataFrame:
    """Per pair x temperature x decoder x budget condition (a run that serves two conditions,
    e.g. fts's matched cap equal to its other cap, appears under both)."""
    keys = ["pair", "temperature", "decoder", "budget"]
    g = decoding.groupby(keys)
    s = g[["new_tokens", "wall_time", "rounds", "committed", "accepted", "nodes"]].sum()
    table = pd.DataFrame({
        "tokens_per_s": s["new_tokens"] / s["wall_time"],
        "accepted_per_round": s["accepted"] / s["rounds"],
        "nodes_per_round": s["nodes"] / s["rounds"],
        "committed_per_round": s["committed"] / s["rounds"],
        "new_tokens": s["new_tokens"],
        "prompts": g.size(),
    }).reset_index()
    ar = table[table["decoder"] == "ar"].set_index(["pair", "temperature"])["tokens_per_s"]
    at = pd.MultiIndex.from_frame(table[["pair", "temperature"]])
    table["speedup"] = table["tokens_per_s"].to_numpy() / ar.reindex(at).to_numpy()
    return table.merge(plan, on=keys, how="left")


def online_gain(decoding: pd.DataFrame, plan: pd.DataFrame, n_boot: int, seed: int):
    """fts over pearl, condition by condition: each prompt's accepted draft tokens per round,
    paired by prompt."""
    keys = ["pair", "temperature", "decoder", "budget"]
    runs = decoding.merge(plan, on=keys)
    runs = runs[runs["decoder"].isin(["fts", "pearl"]) & (runs["rounds"] > 0)]
    if runs["decoder"].nunique() < 2:
        return pd.DataFrame()
    budgets = runs.groupby(["pair", "temperature", "condition", "decoder"])["budget"].first()
    rows = pd.DataFrame({
        "pair": runs["pair"].to_numpy(str), "task": runs["task"].to_numpy(str),
        "temperature": runs["temperature"].to_numpy(float),
        "prompt_id": (runs["task"] + "/" + runs["prompt_id"].astype(str)).to_numpy(str),
        "turn": 0, "position": 0, "rule": runs["decoder"].to_numpy(str),
        "budget": runs["condition"].to_numpy(int),
        "accepted": (runs["accepted"] / runs["rounds"]).to_numpy(float),
    })
    out = tidy(stats.paired_gain({k: rows[k].to_numpy() for k in rows}, "fts", "pearl",
                                 by=("pair", "temperature", "budget"), n_boot=n_boot, seed=seed))
    out = out.rename(columns={"budget": "condition"}).drop(columns=["n_positions"])
    for decoder in ("fts", "pearl"):
        out[f"{decoder}_budget"] = [
            int(budgets[(p, t, c, decoder)])
            for p, t, c in zip(out["pair"], out["temperature"], out["condition"], strict=True)]
    return out


def consistency(acc: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """Online draft_rank accepted draft tokens per round against the row logs' expectation."""
    on = table[table["decoder"] == "draft_rank"][
        ["pair", "temperature", "budget", "accepted_per_round", "prompts"]]
    scored = acc[acc["rule"] == "draft_rank"][["pair", "temperature", "budget", "accepted"]]
    both = on.merge(scored.astype({"temperature": float}), on=["pair", "temperature", "budget"])
    both = both.rename(columns={"accepted_per_round": "online", "accepted": "scored"})
    both["relative_difference"] = both["online"] / both["scored"] - 1
    return both[["pair", "temperature", "budget", "online", "scored", "relative_difference",
                 "prompts"]]


def with_ci(frame: pd.DataFrame) -> pd.Series:
    """'+5.1% [+2.6, +7.4]' per row (gain and its interval, in percent); 'n/a' where the
    baseline accepted nothing, so that no ratio exists."""
    def fmt(g, lo, hi):
        if not np.isfinite(g):
            return "n/a"
        ci = f"[{100 * lo:+.1f}, {100 * hi:+.1f}]" if np.isfinite(lo) and np.isfinite(hi) else ""
        return f"{100 * g:+.1f}% {ci}".strip()

    return pd.Series([fmt(g, lo, hi) for g, lo, hi in
                      zip(frame["gain"], frame["lo"], frame["hi"], strict=True)],
                     index=frame.index, dtype=object)


def rule_order(frame: pd.DataFrame, column: str, order: list[str]) -> pd.DataFrame:
    present = [x for x in order if x in set(frame[column])]
    return frame.assign(**{column: pd.Categorical(frame[column], categories=present,
                                                  ordered=True)})


def write_all(score_paths: list[str], decoding: pd.DataFrame, folder: str, budgets: list[int],
              fts_budgets: list, n_boot: int, seed: int) -> None:
    acc, gains, equal = row_log_tables(score_paths, n_boot, seed)
    shown = rule_order(acc, "rule", RULES).pivot_table(
        index=["pair", "temperature", "budget"], columns="rule", values="accepted",
        observed=True)
    write_table(acc, shown, f"{folder}/expected_accepted",
                "Expected accepted draft tokens per verify pass (row logs; tasks pooled).")

    shown = gains.assign(comparison=gains["rule"] + " / " + gains["baseline"],
                         gain_ci=with_ci(gains))
    shown = shown.pivot_table(index=["pair", "temperature", "budget"], columns="comparison",
                              values="gain_ci", aggfunc="first")
    write_table(gains, shown, f"{folder}/relative_gains",
                "Relative gain in expected accepted draft tokens (95% CI, prompts resampled).")

    shown = equal.assign(gain_ci=with_ci(equal))[
        ["pair", "temperature", "budget", "nodes", "gain_ci", "n_prompts"]] if len(equal) else equal
    write_table(equal, shown, f"{folder}/equal_size",
                "first_token over pearl at pearl's mean non-root nodes (interpolated; 95% CI).")

    plan = conditions(decoding, budgets, fts_budgets)
    table = online(decoding, plan)
    shown = rule_order(table, "decoder", DECODERS).sort_values(
        ["pair", "temperature", "decoder", "condition"])[
        ["pair", "temperature", "decoder", "budget", "tokens_per_s", "speedup",
         "accepted_per_round", "nodes_per_round", "committed_per_round"]]
    write_table(table, shown, f"{folder}/online",
                "Online decoding per decoder and budget: tokens/s, speedup over ar, and per "
                "round accepted draft tokens, non-root nodes and committed tokens.")

    gain = online_gain(decoding, plan, n_boot, seed)
    shown = gain.assign(gain_ci=with_ci(gain))[
        ["pair", "temperature", "fts_budget", "pearl_budget", "gain_ci", "n_prompts"]
    ] if len(gain) else gain
    write_table(gain, shown, f"{folder}/online_gain",
                "Online fts over pearl: accepted draft tokens per round (95% CI by prompt).")

    cons = consistency(acc, table)
    write_table(cons, cons, f"{folder}/consistency",
                "Online draft_rank vs the scored draft_rank expectation (accepted per round).")


def main(smk) -> None:
    with open(smk.log[0], "w") as log:
        sys.stderr = log
        decoding = pd.read_csv(smk.input.online, dtype={"prompt_id": str, "task": str})
        folder = smk.output[0].rsplit("/", 1)[0]
        write_all(list(smk.input.scores), decoding, folder, smk.params.budgets,
                  smk.params.fts_budgets, smk.params.bootstrap, smk.params.seed)
        print(f"wrote tables to {folder}", file=log)


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
