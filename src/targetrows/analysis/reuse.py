"""Exact reuse, shown on data: the row a round needs is never among the rows the last verify pass
computed, and the row it did compute one token short of the new root is another distribution.

After a round at context ``c`` accepts the path ``a`` and emits the bonus ``b``, the next root
is ``c + a + b``. The verify pass computed rows at ``c`` and along the tree, so at best at
``c + a``: one token short, since the bonus is never a child of the last accepted node. Rows
are therefore looked up by the whole context (`targetrows.core.rows.RowStore`), and the rules
that read the exact root row run a separate root pass. This module measures both halves, from
two sources:

toy       a decode of the synthetic pair (`targetrows.core.toy.ToyPair`, whose rows hash the
          whole context) with `rerank`, whose rounds' ends give each next root: the rows along
          each accepted path go into a `RowStore` under their full contexts, and the next root
          is looked up there (`found`); the row one token short is compared with the exact row
          over the whole vocabulary.
row logs  the target's own rows (`targetrows.rowlog`): at each scored position, the exact root
          row against the row at the previous context (`stale_p`, the verify pass's row at the
          last accepted node when the round ended there), over the pool's first-level tokens,
          which is all the log keeps of the stale row: a lower bound on the total variation.

Per source and temperature: positions, the share whose next root was found among the stored
rows (toy only), the mean total variation between the stale and the exact row, the share of
positions where the two rows rank a different first-level token first, and how often the token
that came next is the first-ranked under each row, with 95% intervals resampled by prompt. What
the stale row costs in accepted draft tokens is `stale_rerank` against `target_rerank` in the
row-log tables (`relative_gains`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from targetrows.core.rows import RowStore
from targetrows.core.toy import ToyPair
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.rowlog.format import RowLog

from . import stats
from .frames import with_interval
from .output import write_table

TOY = "toy pair"
SHARES = ("tv", "best_differs", "next_best_exact", "next_best_stale")
COLUMNS = ("source", "temperature", "positions", "prompts", "found", "tv", "tv_lo", "tv_hi",
           "best_differs", "best_differs_lo", "best_differs_hi", "next_best_exact",
           "next_best_stale")


def toy_positions(temperature: float, prompts: int = 8, max_new_tokens: int = 64,
                  vocab_size: int = 32, budget: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    """Per round end of `prompts` toy decodes with `rerank`: prompt id, whether the next root's
    row was found among the rows stored along the accepted path, the total variation between
    the row one token short and the exact row, whether they rank a different token first, and
    whether the token that came next is each row's first."""
    pair = ToyPair(vocab_size=vocab_size, seed=seed, closeness=0.8)
    config = DecodeConfig("rerank", budget=budget, temperature=temperature,
                          max_new_tokens=max_new_tokens, seed=seed)
    out = {k: [] for k in ("prompt_id", "found", *SHARES)}
    for p in range(prompts):
        context = [int(t) for t in np.random.default_rng([seed, p]).integers(vocab_size, size=4)]
        result = generate(pair.target, pair.draft, context, config)
        new, done = result.tokens, 0
        for round_ in result.rounds:
            start, done = done, done + round_.committed
            if done >= len(new):  # the decode's last round: no next root to look up
                break
            store = RowStore()  # what the verify pass computed along the accepted path
            for j in range(round_.committed):  # the root, then each accepted node (no bonus)
                at = context + new[:start + j]
                store.put(at, pair.target_row(at))
            root = context + new[:done]
            exact, stale = pair.target_row(root), store.get(root[:-1])
            out["prompt_id"].append(f"toy/{p}")
            out["found"].append(root in store)
            out["tv"].append(0.5 * np.abs(exact - stale).sum())
            out["best_differs"].append(int(np.argmax(exact)) != int(np.argmax(stale)))
            out["next_best_exact"].append(int(np.argmax(exact)) == new[done])
            out["next_best_stale"].append(int(np.argmax(stale)) == new[done])
    return {k: np.asarray(v) for k, v in out.items()}


def log_positions(log: RowLog) -> dict[str, np.ndarray]:
    """Per scored position of a row log that has a previous row: prompt id (task/question),
    and over the pool's first-level tokens: the total variation between the previous context's
    row and the exact root row (a lower bound on the whole rows'), whether they rank a
    different token first, and whether the token that came next is each one's first."""
    first = log.pool_parents == 0  # local parents: the root's children, in pool order
    per_record = np.diff(log.first_offsets)
    if int(first.sum()) != len(log.stale_p):
        raise ValueError("row log: stale_p does not hold one entry per first-level pool node")
    record = np.repeat(np.arange(log.n_records), per_record)
    exact, stale = log.edge_p[first].astype(np.float64), log.stale_p.astype(np.float64)
    tokens = log.pool_tokens[first]
    has_stale = np.bincount(record, np.isnan(stale), log.n_records) == 0
    keep = log.rec_scored & has_stale & (per_record > 0)
    tv = 0.5 * np.bincount(record, np.nan_to_num(np.abs(exact - stale)), log.n_records)
    best_exact, best_stale = _first_ranked(record, tokens, exact), _first_ranked(record, tokens,
                                                                                 stale)
    seg, pos = log.rec_segment, log.rec_position
    nxt = log.traj_tokens[np.minimum(log.traj_offsets[seg] + pos, len(log.traj_tokens) - 1)]
    inside = pos < np.diff(log.traj_offsets)[seg]
    keep &= inside
    prompt = np.char.add(np.char.add(log.seg_task[seg], "/"), log.seg_question[seg])
    return {"prompt_id": prompt[keep], "found": np.full(int(keep.sum()), np.nan),
            "tv": tv[keep], "best_differs": (best_exact != best_stale)[keep],
            "next_best_exact": (best_exact == nxt)[keep],
            "next_best_stale": (best_stale == nxt)[keep]}


def _first_ranked(record: np.ndarray, tokens: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Per record, the token of highest probability (ties: the earlier pool node); -1 for a
    record without first-level nodes or with NaN probabilities."""
    n = int(record.max()) + 1 if len(record) else 0
    out = np.full(n, -1, dtype=np.int64)
    order = np.lexsort((np.arange(len(p)), -np.nan_to_num(p, nan=-np.inf), record))
    head = np.r_[True, record[order][1:] != record[order][:-1]] if len(order) else order
    out[record[order][head]] = tokens[order][head]
    return out


def summary(source: str, temperature: float, positions: dict[str, np.ndarray],
            n_boot: int = 2000, seed: int = 0) -> dict:
    """One table row: the positions' means, with 95% intervals resampled by prompt for the
    total variation and the share of first tokens that differ."""
    ids, prompt = np.unique(positions["prompt_id"], return_inverse=True)
    n = len(positions["tv"])
    row = {"source": source, "temperature": float(temperature), "positions": n,
           "prompts": len(ids), "found": float(np.mean(positions["found"])) if n else np.nan}
    weights = stats.bootstrap_weights(np.random.default_rng(seed), len(ids), n_boot)
    count = np.bincount(prompt, minlength=len(ids)).astype(np.float64)
    for name in SHARES:
        value = positions[name].astype(np.float64)
        row[name] = float(value.mean()) if n else np.nan
        if name in ("tv", "best_differs"):
            with np.errstate(invalid="ignore", divide="ignore"):
                boot = weights @ np.bincount(prompt, value, len(ids)) / (weights @ count)
            row[f"{name}_lo"], row[f"{name}_hi"] = stats.interval(boot, 0.95, len(ids))
    return {k: row[k] for k in COLUMNS}


def reuse_rows(logs: Sequence[tuple[str, RowLog]], temperatures: Sequence[float],
               n_boot: int = 2000, seed: int = 0) -> list[dict]:
    """The table: the toy pair at each temperature, then each pair x temperature of the row
    logs (`logs`: (pair, log) items; a pair's logs at one temperature are pooled)."""
    rows = [summary(TOY, t, toy_positions(t, seed=seed), n_boot, seed) for t in temperatures]
    groups: dict[tuple[str, float], list[dict]] = {}
    for pair, log in logs:
        groups.setdefault((pair, float(log.header["temperature"])), []).append(log_positions(log))
    for (pair, t), parts in sorted(groups.items()):
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        rows.append(summary(pair, t, merged, n_boot, seed))
    return rows


def write_reuse(logs: Sequence[tuple[str, str]], temperatures: Sequence[float], stem: str,
                n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """`stem`.csv/.md/.tex: the table from the toy pair at `temperatures` and the row logs
    (`logs`: (pair, path) items)."""
    from targetrows.rowlog.format import read

    table = pd.DataFrame(reuse_rows([(pair, read(path)) for pair, path in logs], temperatures,
                                    n_boot, seed), columns=list(COLUMNS))
    shown = table.assign(
        found=[f"{v:.0%}" if np.isfinite(v) else "" for v in table["found"]],
        tv=with_interval(table, "tv", "tv_lo", "tv_hi", "{:.2f}"),
        best_differs=with_interval(table, "best_differs", "best_differs_lo", "best_differs_hi",
                                   "{:.0%}"),
        next_best_exact=[f"{v:.0%}" for v in table["next_best_exact"]],
        next_best_stale=[f"{v:.0%}" for v in table["next_best_stale"]],
    )[["source", "temperature", "positions", "prompts", "found", "tv", "best_differs",
       "next_best_exact", "next_best_stale"]]
    write_table(table, shown, stem,
                "Exact reuse: each round's next root is its context plus the accepted path and "
                "the bonus token, and the verify pass computed rows one token short of it at "
                "best. found: the share of next roots whose row was among the rows the verify "
                "pass computed (toy pair: looked up by full context). Against the exact row, the "
                "row one token short has total variation tv and ranks another first-level "
                "token first at best_differs of the positions (row logs: over the pool's "
                "first-level tokens, a lower bound; 95% CI by prompt); next_best_*: how often "
                "the token that came next is the first-ranked under the exact and the stale "
                "row. What the stale row costs in accepted draft tokens: target_rerank / "
                "stale_rerank in relative_gains.", floatfmt=".2f")
    return table

