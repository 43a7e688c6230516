"""The online runs: per-prompt totals read from the decoders' answer files, the budget
conditions each decoder ran (a `matched` budget resolved in one place), and the online tables.

`summarise` gives one row per pair x task x temperature x decoder x budget x prompt; columns:
pair, task, temperature, decoder, budget, prompt_id, new_tokens, wall_time (seconds, all turns),
rounds, committed, accepted (accepted draft tokens), nodes (non-root nodes verified),
target_passes, draft_passes.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from targetrows.decoding.registry import DECODERS, get_decoder
from targetrows.pipeline.conditions import is_matched, read_conditions

from . import stats

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


def conditions(paths: list[str]) -> pd.DataFrame:
    """The decode jobs' condition files (`targetrows.pipeline.conditions`) as one table: pair,
    temperature, decoder, condition, budget, baseline, baseline_budget, matched (a matched cap;
    one row per condition: every task of a target and temperature runs the same conditions)."""
    rows = []
    for path in paths:
        parts = path.replace("\\", "/").split("/")
        pair, temperature = parts[-4], float(parts[-2].removeprefix("T"))
        decoder, conds = read_conditions(path)
        for c in conds:
            rows.append({"pair": pair, "temperature": temperature, "decoder": decoder,
                         "condition": c["condition"], "budget": c["budget"],
                         "baseline": c.get("baseline"),
                         "baseline_budget": c.get("baseline_budget"),
                         "matched": is_matched(c["spec"])})
    frame = pd.DataFrame(rows, columns=["pair", "temperature", "decoder", "condition", "budget",
                                        "baseline", "baseline_budget", "matched"])
    for name in frame["decoder"].unique():
        get_decoder(name)  # an unknown decoder is an error, never a silent NaN row
    return frame.drop_duplicates(["pair", "temperature", "decoder", "condition"],
                                 ignore_index=True)


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


METRICS = {"accepted": "accepted draft tokens per round",
           "nodes": "non-root nodes per round",
           "tokens_per_s": "tokens/s"}


def per_prompt(decoding: pd.DataFrame) -> pd.DataFrame:
    """Each run's per-prompt values of the compared metrics (a prompt: task and question)."""
    return decoding.assign(
        prompt=decoding["task"] + "/" + decoding["prompt_id"].astype(str),
        accepted_pr=decoding["accepted"] / decoding["rounds"],
        nodes_pr=decoding["nodes"] / decoding["rounds"],
        tokens_per_s=decoding["new_tokens"] / decoding["wall_time"],
    )


def online_gains(decoding: pd.DataFrame, plan: pd.DataFrame, n_boot: int, seed: int):
    """Each decoder over its baseline, condition by condition: a condition is compared with the
    baseline's run at its `baseline_budget` (the same budget, or the budget a matched cap was
    matched at). Per metric (`METRICS`), the ratio of per-prompt values summed over prompts
    minus 1, with a 95% bootstrap interval resampled by prompt; `n_undefined` counts the
    replicates whose baseline total was zero (dropped from the interval)."""
    runs = per_prompt(decoding[decoding["rounds"] > 0])
    values = {"accepted": "accepted_pr", "nodes": "nodes_pr", "tokens_per_s": "tokens_per_s"}
    out = []
    compared = plan[plan["baseline"].notna() & plan["baseline"].isin(runs["decoder"])]
    for row in compared.itertuples(index=False):
        mine = runs[(runs["pair"] == row.pair) & (runs["temperature"] == row.temperature)]
        a = mine[(mine["decoder"] == row.decoder) & (mine["budget"] == row.budget)]
        b = mine[(mine["decoder"] == row.baseline) & (mine["budget"] == row.baseline_budget)]
        both = a.merge(b, on="prompt", suffixes=("", "_base"))
        if both.empty:
            continue
        for metric, col in values.items():
            table = {
                "pair": np.full(2 * len(both), row.pair, dtype=object),
                "task": np.full(2 * len(both), "", dtype=object),
                "temperature": np.full(2 * len(both), row.temperature),
                "prompt_id": np.concatenate([both["prompt"], both["prompt"]]).astype(object),
                "turn": np.zeros(2 * len(both), dtype=np.int64),
                "position": np.zeros(2 * len(both), dtype=np.int64),
                "rule": np.repeat(np.array(["new", "base"], dtype=object), len(both)),
                "budget": np.zeros(2 * len(both), dtype=np.int64),
                metric: np.concatenate([both[col], both[col + "_base"]]).astype(float),
            }
            g = stats.paired_gain(table, "new", "base", metric=metric,
                                  by=("pair", "temperature"), n_boot=n_boot, seed=seed)
            out.append({
                "pair": row.pair, "temperature": row.temperature, "decoder": row.decoder,
                "condition": row.condition, "budget": row.budget, "baseline": row.baseline,
                "baseline_budget": int(row.baseline_budget), "metric": metric,
                "value": float(both[col].mean()), "baseline_value": float(both[col + "_base"].mean()),
                "gain": float(g["gain"][0]), "lo": float(g["lo"][0]), "hi": float(g["hi"][0]),
                "n_undefined": int(g["n_undefined"][0]), "n_prompts": int(g["n_prompts"][0]),
            })
    return pd.DataFrame(out)


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
