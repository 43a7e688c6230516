"""The online runs: per-prompt totals read from the decoders' answer files, the budget
conditions each decoder ran (a `matched` budget resolved in one place), and the online tables.

`summarise` gives one row per pair x task x temperature x decoder x condition x prompt (a
condition: a budget and pool depth); columns: pair, task, temperature, decoder, budget, depth,
prompt_id, new_tokens, wall_time (seconds, all turns), rounds, committed, accepted (accepted
draft tokens), nodes (non-root nodes verified), target_passes, draft_passes, and how the run
drafted: draft_kind (eagle3, standalone or none) and overlap (the root pass ran alongside
drafting); those two are empty for answers written before they were recorded.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from targetrows.decoding.budget import Auto, Matched, parse_budget
from targetrows.decoding.registry import DECODERS, get_decoder, prior_art_decoders
from targetrows.pipeline.conditions import read_conditions

from . import stats

ROUND_SUMS = ["committed", "accepted", "nodes", "target_passes", "draft_passes"]
DEVICES = {"target_device": "target", "draft_device": "draft"}  # plan column -> conditions key
RUN = ["pair", "temperature", "decoder", "budget", "depth"]  # what identifies one online run
SETUP = ["draft_kind", "overlap"]  # how a run drafted: the same for every answer of a run


def answer_rows(path: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            rec = json.loads(line)
            try:
                choice = rec["choices"][0]
                rounds = rec.get("rounds") or {}
                row = {
                    "pair": rec["model_id"], "task": rec["category"],
                    "temperature": float(rec["temperature"]), "decoder": rec["decoder"],
                    "budget": int(rec["budget"]), "depth": int(rec["depth"]),
                    "prompt_id": str(rec["question_id"]),
                    "new_tokens": int(sum(choice["new_tokens"])),
                    "wall_time": float(sum(choice["wall_time"])),
                    "rounds": len(rounds.get("committed", [])),
                    "draft_kind": rec.get("draft_kind"), "overlap": rec.get("overlap"),
                }
                row.update({k: float(sum(rounds.get(k, []))) for k in ROUND_SUMS})
            except (KeyError, TypeError, IndexError) as err:
                raise ValueError(f"{path}:{lineno}: not a targetrows answer record "
                                 f"({err!r})") from None
            rows.append(row)
    return rows


def summarise(paths: list[str]) -> pd.DataFrame:
    rows = [row for path in paths for row in answer_rows(path)]
    if not rows:
        raise ValueError("no answers to summarise")
    return pd.DataFrame(rows)


def conditions(paths: list[str]) -> pd.DataFrame:
    """The decode jobs' condition files (results/conditions/<target>/T<t>/<decoder>.json,
    `targetrows.pipeline.conditions`) as one table: pair, temperature, decoder, condition,
    budget, depth, baseline, baseline_budget, baseline_depth (the baseline run it is compared
    with), matched (a matched cap), auto (picked by the cost model), and the devices the job
    ran target and draft on (target_device, draft_device: empty where the file predates
    them)."""
    rows = []
    for path in paths:
        doc = read_conditions(path)
        devices = doc.get("devices") or {}  # absent from files written before they said
        for c in doc["conditions"]:
            budget = parse_budget(c["spec"])
            rows.append({"pair": doc["pair"], "temperature": doc["temperature"],
                         "decoder": doc["decoder"], "condition": c["condition"],
                         "budget": c["budget"], "depth": c["depth"],
                         "baseline": c.get("baseline"),
                         "baseline_budget": c.get("baseline_budget"),
                         "matched": isinstance(budget, Matched), "auto": isinstance(budget, Auto),
                         **{k: devices.get(role) for k, role in DEVICES.items()}})
    frame = pd.DataFrame(rows, columns=["pair", "temperature", "decoder", "condition", "budget",
                                        "depth", "baseline", "baseline_budget", "matched",
                                        "auto", *DEVICES])
    for name in frame["decoder"].unique():
        get_decoder(name)  # an unknown decoder is an error, never a silent NaN row
    return _baseline_runs(frame)


def _baseline_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """Each condition's baseline run as (baseline_budget, baseline_depth): the baseline's run
    at that budget and the pool's depth, or for an auto condition the baseline's own auto run
    (NaN where the baseline has none)."""
    frame = frame.copy()
    fixed = frame[~frame["auto"]].groupby(["pair", "temperature", "decoder"])["depth"].max()
    auto = frame[frame["auto"]].set_index(["pair", "temperature", "decoder"])
    budgets, depths = [], []
    for row in frame.itertuples(index=False):
        key = (row.pair, row.temperature, row.baseline)
        if row.baseline is None or pd.isna(row.baseline):
            budgets.append(np.nan)
            depths.append(np.nan)
        elif row.auto:
            found = key in auto.index
            budgets.append(auto.loc[key, "budget"] if found else np.nan)
            depths.append(auto.loc[key, "depth"] if found else np.nan)
        else:
            budgets.append(row.baseline_budget)
            depths.append(fixed.get(key, row.depth))
    frame["baseline_budget"] = pd.array(budgets, dtype="Int64")
    frame["baseline_depth"] = pd.array(depths, dtype="Int64")
    return frame


def _ratio_ci(num: np.ndarray, den: np.ndarray, n_boot: int, seed: int,
              base_num: np.ndarray | None = None, base_den: np.ndarray | None = None):
    """95% bootstrap interval (prompts resampled, `stats.interval`) of sum(num) / sum(den), or
    with a base, of that over sum(base_num) / sum(base_den) (the arrays aligned by prompt)."""
    if len(num) < 2:
        return np.nan, np.nan
    w = stats.bootstrap_weights(np.random.default_rng(seed), len(num), n_boot)
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = (w @ num) / (w @ den)
        if base_num is not None:
            boot = boot / ((w @ base_num) / (w @ base_den))
    return stats.interval(boot, 0.95, len(num))


def online(decoding: pd.DataFrame, plan: pd.DataFrame, n_boot: int = 2000,
           seed: int = 0) -> pd.DataFrame:
    """Per pair x temperature x decoder x condition (a run that serves two conditions, e.g.
    fts's matched cap equal to its other cap, appears under both), with 95% CIs by prompt on
    the speed-up (each prompt's time against ar's on the same prompt) and on accepted draft
    tokens per round."""
    g = decoding.groupby(RUN)
    s = g[["new_tokens", "wall_time", "rounds", "committed", "accepted", "nodes"]].sum()
    table = pd.DataFrame({
        "tokens_per_s": s["new_tokens"] / s["wall_time"],
        "accepted_per_round": s["accepted"] / s["rounds"],
        "nodes_per_round": s["nodes"] / s["rounds"],
        "committed_per_round": s["committed"] / s["rounds"],
        "new_tokens": s["new_tokens"],
        "prompts": g.size(),
    }).reset_index()
    setup = with_setup(decoding).groupby(RUN)[SETUP].first().reset_index()
    table = table.merge(setup, on=RUN, how="left")
    ar = table[table["decoder"] == "ar"].set_index(["pair", "temperature"])["tokens_per_s"]
    at = pd.MultiIndex.from_frame(table[["pair", "temperature"]])
    table["speedup"] = table["tokens_per_s"].to_numpy() / ar.reindex(at).to_numpy()
    prompts = per_prompt(decoding)
    ar = prompts[prompts["decoder"] == "ar"]
    cis = []
    for (pair, temperature, *_), mine in prompts.groupby(RUN, sort=True):
        both = mine.merge(ar[(ar["pair"] == pair) & (ar["temperature"] == temperature)],
                          on="prompt", suffixes=("", "_ar"))
        # speed-up: this run's tokens/s over ar's on the same prompts
        speedup = _ratio_ci(*(both[c].to_numpy(float) for c in (
            "new_tokens", "wall_time")), n_boot, seed, *(both[c].to_numpy(float) for c in (
                "new_tokens_ar", "wall_time_ar")))
        accepted = _ratio_ci(mine["accepted"].to_numpy(float), mine["rounds"].to_numpy(float),
                             n_boot, seed)
        cis.append((*speedup, *accepted))
    # groupby(RUN) orders the runs alike in both loops
    table[["speedup_lo", "speedup_hi", "accepted_lo", "accepted_hi"]] = np.array(cis, float)
    return table.merge(plan, on=RUN, how="left")


def condition_label(run) -> str:
    """How a run is named in tables and figures: 'ar', 'fts B=16', 'fts B=6 (= pearl 16)' for a
    matched cap, 'fts auto: B=24 d=3' for the cost model's pick (its budget and pool depth)."""
    if run.decoder in DECODERS and not DECODERS[run.decoder].drafts:
        return str(run.decoder)
    if _flag(run, "auto"):
        return f"{run.decoder} auto: B={int(run.budget)} d={int(run.depth)}"
    label = f"{run.decoder} B={int(run.budget)}"
    if _flag(run, "matched"):
        label += f" (= {run.baseline} {int(run.baseline_budget)})"
    return label


def _flag(run, name: str) -> bool:
    value = getattr(run, name, False)
    return bool(pd.notna(value) and value)


METRICS = {"accepted": "accepted draft tokens per round",
           "nodes": "non-root nodes per round",
           "tokens_per_s": "tokens/s"}


def with_setup(decoding: pd.DataFrame) -> pd.DataFrame:
    """`decoding` with the `SETUP` columns, empty where a summary lacks them."""
    return decoding.assign(**{k: None for k in SETUP if k not in decoding.columns})


def per_prompt(decoding: pd.DataFrame) -> pd.DataFrame:
    """Each run's per-prompt rows, named by prompt (task and question)."""
    decoding = with_setup(decoding)
    return decoding.assign(prompt=decoding["task"] + "/" + decoding["prompt_id"].astype(str))


# what each compared metric is a ratio of: a run's total over its total rounds (or seconds)
RATIOS = {"accepted": ("accepted", "rounds"), "nodes": ("nodes", "rounds"),
          "tokens_per_s": ("new_tokens", "wall_time")}


def online_gains(decoding: pd.DataFrame, plan: pd.DataFrame, n_boot: int, seed: int):
    """Each decoder over its baselines, condition by condition: over its first baseline at the
    condition's `baseline_budget` and `baseline_depth` (the same budget, the budget a matched cap
    was matched at, or the baseline's own auto choice), and over each further baseline and each
    prior-art decoder that ran at the same budget (`further_comparisons`). Per metric
    (`METRICS`), each run's value pooled over its prompts (`RATIOS`: total accepted draft
    tokens over total rounds, as `online` gives it) and the ratio of the two runs' values
    minus 1, on the prompts both ran, with a 95% bootstrap interval resampled by prompt;
    `n_undefined` counts the replicates whose baseline total was zero (dropped from the
    interval). Each row also says how the decoder's run drafted (`SETUP`: draft_kind, overlap)
    and on which devices (target_device, draft_device, from the conditions files)."""
    runs = per_prompt(decoding[decoding["rounds"] > 0])
    out = []
    plan = pd.concat([plan, further_comparisons(plan)], ignore_index=True)
    compared = plan[plan["baseline"].notna() & plan["baseline"].isin(runs["decoder"])
                    & plan["baseline_budget"].notna()]
    for row in compared.itertuples(index=False):
        mine = runs[(runs["pair"] == row.pair) & (runs["temperature"] == row.temperature)]
        a = mine[(mine["decoder"] == row.decoder) & (mine["budget"] == row.budget)
                 & (mine["depth"] == row.depth)]
        b = mine[(mine["decoder"] == row.baseline) & (mine["budget"] == row.baseline_budget)
                 & (mine["depth"] == row.baseline_depth)]
        both = a.merge(b, on="prompt", suffixes=("", "_base"))
        if both.empty:
            continue
        setup = {k: a[k].dropna().iloc[0] if a[k].notna().any() else None for k in SETUP}
        devices = {k: getattr(row, k, None) for k in DEVICES}
        for metric, (num, den) in RATIOS.items():
            value, base, gain = pooled_gain(both, num, den, n_boot, seed)
            out.append({
                "pair": row.pair, "temperature": row.temperature, "decoder": row.decoder,
                "condition": row.condition, "budget": row.budget, "depth": row.depth,
                "auto": row.auto, "matched": row.matched, "baseline": row.baseline,
                "baseline_budget": int(row.baseline_budget),
                "baseline_depth": int(row.baseline_depth), **setup, **devices,
                "metric": metric, "value": value, "baseline_value": base, **gain,
                "n_prompts": len(both),
            })
    return pd.DataFrame(out)


def pooled_gain(both: pd.DataFrame, num: str, den: str, n_boot: int, seed: int):
    """(run's value, baseline's value, {gain, lo, hi, n_undefined}) from prompts aligned in
    `both` (the baseline's columns suffixed _base): each run's sum(num) / sum(den), and the
    ratio of the two minus 1 with a 95% interval resampled by prompt."""
    a, a_den = both[num].to_numpy(float), both[den].to_numpy(float)
    b, b_den = both[num + "_base"].to_numpy(float), both[den + "_base"].to_numpy(float)
    w = stats.bootstrap_weights(np.random.default_rng(seed), len(both), n_boot)
    with np.errstate(divide="ignore", invalid="ignore"):
        value, base = a.sum() / a_den.sum(), b.sum() / b_den.sum()
        boot = ((w @ a) / (w @ a_den)) / ((w @ b) / (w @ b_den)) - 1.0
        gain = value / base - 1.0
    lo, hi = stats.interval(boot, 0.95, len(both))
    return float(value), float(base), {"gain": float(gain), "lo": lo, "hi": hi,
                                       "n_undefined": int((~np.isfinite(boot)).sum())}


def further_comparisons(plan: pd.DataFrame) -> pd.DataFrame:
    """The conditions once more for each further baseline of their decoder
    (`Decoder.baselines[1:]`), and our decoders' (`Decoder.ours`) for each prior-art decoder
    in the plan (`Decoder.prior_art`), as their baseline: its run at the same budget (a matched
    cap: the cap it ran at), or for an auto condition that decoder's own auto pick."""
    ran = set(plan["decoder"])
    prior = [d for d in prior_art_decoders() if d in ran]
    frames = []
    for name, rows in plan.groupby("decoder", sort=False):
        entry = DECODERS.get(name)
        if entry is None:
            continue
        others = [b for b in entry.baselines[1:] if b in ran]
        others += [p for p in prior if entry.ours and p not in entry.baselines]
        frames += [rows.assign(baseline=b, baseline_budget=rows["budget"]) for b in others]
    if not frames:
        return plan.iloc[:0]
    both = pd.concat(frames, ignore_index=True)
    baselines = plan[plan["decoder"].isin(set(both["baseline"]))]
    return _baseline_runs(pd.concat([baselines, both], ignore_index=True)).iloc[-len(both):]


def consistency(acc: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """Each decoder's online accepted draft tokens per round against the row logs' expectation
    for its rule at the same budget (a draft-free decoder's is scored under its own name)."""
    rule_of = {d.name: d.rule or d.name for d in DECODERS.values() if d.drafts}
    on = table[table["decoder"].isin(list(rule_of))][
        ["pair", "temperature", "decoder", "budget", "accepted_per_round", "prompts"]]
    on = on.assign(rule=on["decoder"].map(rule_of))
    scored = acc[["pair", "temperature", "rule", "budget", "accepted"]]
    both = on.merge(scored.astype({"temperature": float}),
                    on=["pair", "temperature", "rule", "budget"])
    both = both.rename(columns={"accepted_per_round": "online", "accepted": "scored"})
    both["relative_difference"] = both["online"] / both["scored"] - 1
    return both[["pair", "temperature", "decoder", "rule", "budget", "online", "scored",
                 "relative_difference", "prompts"]]
