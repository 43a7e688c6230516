"""The online runs: per-prompt totals read from the decoders' answer files, the budget
conditions each decoder ran (a `matched` budget resolved in one place), and the online tables.

`summarise` gives one row per pair x task x temperature x decoder x budget x prompt; columns:
pair, task, temperature, decoder, budget, prompt_id, new_tokens, wall_time (seconds, all turns),
rounds, committed, accepted (accepted draft tokens), nodes (non-root nodes verified),
target_passes, draft_passes.
"""

from __future__ import annotations

import json

import pandas as pd

from targetrows.decoding.registry import DECODERS, get_decoder

from . import stats
from .frames import tidy

ROUND_SUMS = ["committed", "accepted", "nodes", "target_passes", "draft_passes"]


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
                    "budget": int(rec["budget"]), "prompt_id": str(rec["question_id"]),
                    "new_tokens": int(sum(choice["new_tokens"])),
                    "wall_time": float(sum(choice["wall_time"])),
                    "rounds": len(rounds.get("committed", [])),
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


def mean_nodes(summary: pd.DataFrame, decoder: str, budget: int) -> float:
    """Mean non-root nodes verified per round by `decoder`'s runs at `budget` (all prompts and
    tasks of the summary, each round weighted once)."""
    runs = summary[(summary["decoder"] == decoder) & (summary["budget"] == budget)]
    rounds = runs["rounds"].sum()
    if rounds == 0:
        raise ValueError(f"no {decoder} rounds at budget {budget} "
                         f"({len(runs)} answers); cannot match a budget to its tree size")
    return float(runs["nodes"].sum() / rounds)


def matched_budget(mean: float) -> int:
    """The budget matched to a mean tree size: the nearest integer, at least 1."""
    return max(1, round(mean))


def resolve_budgets(decoder: str, budgets: list, base: list[int], summary: pd.DataFrame | None):
    """A decoder's budget conditions with each `matched` entry i resolved to the mean tree size
    of the decoder it is compared with (`Decoder.baseline`) at the base condition base[i]."""
    if "matched" not in budgets:
        return [int(b) for b in budgets]
    baseline = get_decoder(decoder).baseline
    if baseline is None:
        raise ValueError(f"decoder {decoder!r} has no decoder to match its budget to; give "
                         "numeric budgets")
    return [matched_budget(mean_nodes(summary, baseline, base[i])) if b == "matched" else int(b)
            for i, b in enumerate(budgets)]


def conditions(decoding: pd.DataFrame, budgets: list[int], budgets_of: dict) -> pd.DataFrame:
    """Which run is budget condition i of each decoder: budgets_of[decoder][i] where the config
    gives the decoder its own conditions (`matched` resolved by `resolve_budgets`), else
    budgets[i]; the single run of a decoder without a tree (ar). Columns: pair, temperature,
    decoder, budget, condition."""
    rows = []
    for (pair, temp), runs in decoding.groupby(["pair", "temperature"]):
        for decoder in runs["decoder"].unique():
            if not get_decoder(decoder).drafts:
                plan = [int(runs.loc[runs["decoder"] == decoder, "budget"].iloc[0])]
            else:
                plan = resolve_budgets(decoder, budgets_of.get(decoder, budgets), budgets, runs)
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


def online_gains(decoding: pd.DataFrame, plan: pd.DataFrame, n_boot: int, seed: int):
    """Each decoder over its baseline (`Decoder.baseline`), condition by condition: each
    prompt's accepted draft tokens per round, paired by prompt."""
    present = set(decoding["decoder"])
    pairs = [(d.name, d.baseline) for d in DECODERS.values()
             if d.baseline is not None and {d.name, d.baseline} <= present]
    parts = [online_gain(decoding, plan, name, base, n_boot, seed) for name, base in pairs]
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def online_gain(decoding: pd.DataFrame, plan: pd.DataFrame, decoder: str, baseline: str,
                n_boot: int, seed: int):
    """`decoder` over `baseline`, condition by condition (see `online_gains`)."""
    keys = ["pair", "temperature", "decoder", "budget"]
    runs = decoding.merge(plan, on=keys)
    runs = runs[runs["decoder"].isin([decoder, baseline]) & (runs["rounds"] > 0)]
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
    out = tidy(stats.paired_gain({k: rows[k].to_numpy() for k in rows}, decoder, baseline,
                                 by=("pair", "temperature", "budget"), n_boot=n_boot, seed=seed))
    out = out.rename(columns={"budget": "condition"}).drop(columns=["n_positions"])
    for column, name in (("budget", decoder), ("baseline_budget", baseline)):
        out[column] = [
            int(budgets[(p, t, c, name)])
            for p, t, c in zip(out["pair"], out["temperature"], out["condition"], strict=True)]
    return out


def consistency(acc: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """Each decoder's online accepted draft tokens per round against the row logs' expectation
    for its rule at the same budget."""
    rule_of = {d.name: d.rule for d in DECODERS.values() if d.rule is not None}
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
