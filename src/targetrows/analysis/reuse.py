"""Exact reuse on data: how far the row a store keyed by less than the whole context would return
lies from the exact row.

Rows are stored and looked up by the whole context (`targetrows.core.rows.RowStore`). The case
that key guards against is the paper's `caa` example: a store keyed by the last token alone
returns, at the root `caa`, the row it stored at `ca`, the same last token under another earlier
context. This module isolates that case (claim 1 of results/claims.md) and, as context only,
the row one token short:

same last token     at each root, the row of the latest earlier context of the same turn that
(same last 2        ends in the same token (the same 2 tokens): what a store keyed by them
tokens)             would return there. The case exists only where such a context's row was
                    stored; on a target whose rows depend on the last token alone that row is
                    the exact one, so the measurement could come out 0.
one token short     the row at the context less its last token (the stale row: the verify
                    pass's row at the last accepted node). Two contexts of different lengths:
                    their rows differ for any real model, so it shows nothing about the claim;
                    it is what the stale-row rule (`stale_rerank`) ranks by.

Two sources. The toy pair (`targetrows.core.toy.ToyPair`, whose rows hash the whole context, so
it shows the case by construction): decodes with `rerank`, a root at each round's end, every
earlier context of the decode stored (a prefill computes the prompt's rows too), rows compared
over the whole vocabulary. The row logs: the target's own rows at every logged position,
against the root row logged at the latest earlier position of the same turn that ends in the
same token(s), over the tokens the two sparse rows hold (a lower bound on the total variation;
each row holds its most likely tokens, so its first-ranked token is exact); and against the
stale row over the pool's first-level tokens, all the log keeps of it (a lower bound too).

Per source, temperature and compared row: the positions looked at, the hits (positions where
that row exists), the prompts with a hit, the mean total variation over the hits and the share
whose first-ranked token differs (95% intervals resampled by prompt), and how often the token
that came next is the first-ranked under the exact row and under the compared one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from targetrows.core.toy import ToyPair
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.rowlog.format import RowLog

from . import stats
from .frames import with_interval
from .output import write_table

TOY = "toy pair"
SHORT = "one token short"
SAME_LAST = {1: "same last token", 2: "same last 2 tokens"}  # tokens keyed -> the row's name
COMPARED = (*SAME_LAST.values(), SHORT)
FIELDS = ("prompt_id", "tv", "best_differs", "next_best_exact", "next_best_other")
COLUMNS = ("source", "temperature", "row", "positions", "hits", "prompts", "tv", "tv_lo", "tv_hi",
           "best_differs", "best_differs_lo", "best_differs_hi", "next_best_exact",
           "next_best_other")
LEVEL = 0.95  # the intervals' level, as the table's caption says


def _hits() -> dict[str, list]:
    return {k: [] for k in FIELDS}


def _as_arrays(hits: dict[str, list]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=object if k == "prompt_id" else None) for k, v in hits.items()}


# -- the toy pair --------------------------------------------------------------------------------

def toy_positions(temperature: float, prompts: int = 8, max_new_tokens: int = 64,
                  vocab_size: int = 32, budget: int = 8, seed: int = 0,
                  row: Callable[[list[int]], np.ndarray] | None = None) -> tuple[int, dict]:
    """(roots looked at, {compared row: per hit prompt_id, tv, best_differs, next_best_exact,
    next_best_other}) over `prompts` toy decodes with `rerank`. `row(context)` gives the rows
    compared (default: the toy target's own); the decodes are the toy pair's either way."""
    pair = ToyPair(vocab_size=vocab_size, seed=seed, closeness=0.8)
    row = pair.target_row if row is None else row
    config = DecodeConfig("rerank", budget=budget, temperature=temperature,
                          max_new_tokens=max_new_tokens, seed=seed)
    out, roots = {name: _hits() for name in COMPARED}, 0
    for p in range(prompts):
        prompt = [int(t) for t in np.random.default_rng([seed, p]).integers(vocab_size, size=4)]
        result = generate(pair.target, pair.draft, prompt, config)
        sequence = prompt + result.tokens
        ends = len(prompt) + np.cumsum([r.committed for r in result.rounds])
        for end in ends[ends < len(sequence)]:  # a round's end with a token after it
            roots += 1
            exact = row(sequence[:end])
            for name, at in _earlier(sequence, int(end)).items():
                _add(out[name], f"toy/{p}", exact, row(sequence[:at]), sequence[end])
    return roots, {k: _as_arrays(v) for k, v in out.items()}


def _earlier(sequence: list[int], end: int) -> dict[str, int]:
    """The lengths of the earlier contexts compared at the root `sequence[:end]`: one token
    short, and for each key the latest earlier one that ends in the same tokens."""
    found = {SHORT: end - 1}
    for k, name in SAME_LAST.items():
        tail = sequence[end - k:end]
        for at in range(end - 1, k - 1, -1):
            if sequence[at - k:at] == tail:
                found[name] = at
                break
    return found


def _add(hits: dict, prompt_id: str, exact: np.ndarray, other: np.ndarray, nxt: int) -> None:
    hits["prompt_id"].append(prompt_id)
    hits["tv"].append(0.5 * float(np.abs(exact - other).sum()))
    hits["best_differs"].append(int(np.argmax(exact)) != int(np.argmax(other)))
    hits["next_best_exact"].append(int(np.argmax(exact)) == nxt)
    hits["next_best_other"].append(int(np.argmax(other)) == nxt)


# -- row logs: the same last token(s) ------------------------------------------------------------

def log_same_last(log: RowLog, tokens: int = 1) -> tuple[int, dict[str, np.ndarray]]:
    """(positions looked at, per hit: prompt_id, tv, best_differs, next_best_exact,
    next_best_other): each logged position's root row against the root row logged at the
    latest earlier position of its turn whose context ends in the same `tokens` tokens, over
    the tokens the two rows hold (a lower bound on the total variation)."""
    latest: dict[tuple, int] = {}
    hits = _hits()
    floor = _floors(log)
    for r in range(log.n_records):  # sorted by (segment, position)
        s, t = int(log.rec_segment[r]), int(log.rec_position[r])
        context = np.concatenate([log.prompt(s), log.trajectory(s)[:t]])
        if len(context) < tokens:
            continue
        key = (s, *context[len(context) - tokens:].tolist())
        earlier, latest[key] = latest.get(key), r
        traj = log.trajectory(s)
        if earlier is None or t >= len(traj):
            continue
        (tok_a, p_a), (tok_b, p_b) = log.root_row(r), log.root_row(earlier)
        best_a, best_b = int(tok_a[np.argmax(p_a)]), int(tok_b[np.argmax(p_b)])
        hits["prompt_id"].append(f"{log.seg_task[s]}/{log.seg_question[s]}")
        hits["tv"].append(sparse_tv(tok_a, p_a, floor[r], tok_b, p_b, floor[earlier]))
        hits["best_differs"].append(best_a != best_b)
        hits["next_best_exact"].append(best_a == int(traj[t]))
        hits["next_best_other"].append(best_b == int(traj[t]))
    return log.n_records, _as_arrays(hits)


def _floors(log: RowLog) -> np.ndarray:
    """Per record, the least probability among its root row's most likely tokens (the first
    root_top entries): a token the row does not hold has at most that probability."""
    top = int(log.header["root_top"])
    out = np.zeros(log.n_records)
    for r in range(log.n_records):
        _, p = log.root_row(r)
        out[r] = float(p[:top].min()) if len(p) else 0.0
    return out


def sparse_tv(tokens_a: np.ndarray, p_a: np.ndarray, floor_a: float, tokens_b: np.ndarray,
              p_b: np.ndarray, floor_b: float) -> float:
    """A lower bound on the total variation between two rows each known at some tokens: where
    both hold a token, |p - q|; where one does not, its probability there is at most its
    `floor`, so the gap is at least the other's probability less that floor."""
    _, ia, ib = np.intersect1d(tokens_a, tokens_b, return_indices=True)
    gap = float(np.abs(p_a[ia].astype(np.float64) - p_b[ib]).sum())
    gap += float(np.clip(np.delete(p_a, ia) - floor_b, 0.0, None).sum())
    gap += float(np.clip(np.delete(p_b, ib) - floor_a, 0.0, None).sum())
    return 0.5 * gap


# -- row logs: one token short (the stale row) --------------------------------------------------

def log_positions(log: RowLog) -> dict[str, np.ndarray]:
    """Per scored position of a row log that has a previous row: prompt id (task/question),
    and over the pool's first-level tokens: the total variation between the previous context's
    row and the exact root row (a lower bound on the whole rows'), whether they rank a
    different token first, and whether the token that came next is each one's first. A
    position without a previous row (a one-token prompt at its start) is left out."""
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
    keep &= pos < np.diff(log.traj_offsets)[seg]
    prompt = np.char.add(np.char.add(log.seg_task[seg], "/"), log.seg_question[seg])
    return {"prompt_id": prompt[keep], "tv": tv[keep],
            "best_differs": (best_exact != best_stale)[keep],
            "next_best_exact": (best_exact == nxt)[keep],
            "next_best_other": (best_stale == nxt)[keep]}


def _first_ranked(record: np.ndarray, tokens: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Per record, the token of highest probability (ties: the earlier pool node); -1 for a
    record without first-level nodes or with NaN probabilities."""
    n = int(record.max()) + 1 if len(record) else 0
    out = np.full(n, -1, dtype=np.int64)
    order = np.lexsort((np.arange(len(p)), -np.nan_to_num(p, nan=-np.inf), record))
    head = np.r_[True, record[order][1:] != record[order][:-1]] if len(order) else order
    out[record[order][head]] = tokens[order][head]
    return out


# -- the table ------------------------------------------------------------------------------------

def summary(source: str, temperature: float, compared: str, positions: int,
            hits: dict[str, np.ndarray], n_boot: int = 2000, seed: int = 0) -> dict:
    """One table row: the hits' means, with `LEVEL` intervals resampled by prompt for the total
    variation and the share of first-ranked tokens that differ (NaN without two prompts)."""
    ids, prompt = np.unique(np.asarray(hits["prompt_id"], dtype=str), return_inverse=True)
    n = len(hits["tv"])
    row = {"source": source, "temperature": float(temperature), "row": compared,
           "positions": int(positions), "hits": n, "prompts": len(ids)}
    weights = stats.bootstrap_weights(np.random.default_rng(seed), max(len(ids), 1), n_boot)
    count = np.bincount(prompt, minlength=len(ids)).astype(np.float64)
    for name in ("tv", "best_differs", "next_best_exact", "next_best_other"):
        value = np.asarray(hits[name], dtype=np.float64)
        row[name] = float(value.mean()) if n else np.nan
        if name in ("tv", "best_differs"):
            row[f"{name}_lo"], row[f"{name}_hi"] = np.nan, np.nan
            if len(ids) >= 2:  # an interval by prompt needs two of them
                boot = weights @ np.bincount(prompt, value, len(ids)) / (weights @ count)
                row[f"{name}_lo"], row[f"{name}_hi"] = stats.interval(boot, LEVEL, len(ids))
    return {k: row[k] for k in COLUMNS}


def reuse_rows(logs: Sequence[tuple[str, RowLog]], temperatures: Sequence[float],
               n_boot: int = 2000, seed: int = 0) -> list[dict]:
    """The table: the toy pair at each temperature, then each pair x temperature of the row
    logs (`logs`: (pair, log) items; a pair's logs at one temperature are pooled)."""
    rows = []
    for t in temperatures:
        roots, found = toy_positions(t, seed=seed)
        rows += [summary(TOY, t, name, roots, found[name], n_boot, seed) for name in COMPARED]
    groups: dict[tuple[str, float], list[RowLog]] = {}
    for pair, log in logs:
        groups.setdefault((pair, float(log.header["temperature"])), []).append(log)
    for (pair, t), group in sorted(groups.items()):
        for k, name in SAME_LAST.items():
            parts = [log_same_last(log, k) for log in group]
            rows.append(summary(pair, t, name, sum(n for n, _ in parts),
                                _merged([h for _, h in parts]), n_boot, seed))
        stale = [log_positions(log) for log in group]
        rows.append(summary(pair, t, SHORT, sum(log.n_records for log in group),
                            _merged(stale), n_boot, seed))
    return rows


def _merged(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([np.asarray(p[k], dtype=object if k == "prompt_id" else None)
                               for p in parts]) for k in FIELDS}


def write_reuse(logs: Sequence[tuple[str, str]], temperatures: Sequence[float], stem: str,
                n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """`stem`.csv/.md/.tex: the table from the toy pair at `temperatures` and the row logs
    (`logs`: (pair, path) items)."""
    from targetrows.rowlog.format import read

    table = pd.DataFrame(reuse_rows([(pair, read(path)) for pair, path in logs], temperatures,
                                    n_boot, seed), columns=list(COLUMNS))
    shown = table.assign(
        tv=with_interval(table, "tv", "tv_lo", "tv_hi", "{:.3f}"),
        best_differs=with_interval(table, "best_differs", "best_differs_lo", "best_differs_hi",
                                   "{:.0%}"),
        next_best_exact=[_percent(v) for v in table["next_best_exact"]],
        next_best_other=[_percent(v) for v in table["next_best_other"]],
    )[list(COLUMNS[:6]) + ["tv", "best_differs", "next_best_exact", "next_best_other"]]
    write_table(table, shown, stem, CAPTION, floatfmt=".2f")
    return table


def _percent(value: float) -> str:
    return f"{value:.0%}" if np.isfinite(value) else ""


CAPTION = (
    "Exact reuse (claim 1): against the exact row at a root, the row a store keyed by less than "
    "the whole context would return there. row: 'same last token' (the paper's caa case) and "
    "'same last 2 tokens', the row of the latest earlier context of the same turn ending in "
    "those tokens; 'one token short', the stale row (context only: two contexts of different "
    "lengths). hits: positions where that row exists, of the positions looked at. tv: mean "
    "total variation from the exact row; best_differs: share of hits where it ranks another "
    f"token first ({LEVEL:.0%} CI by prompt). next_best_*: how often the token that came next "
    "is the first-ranked under the exact and the other row. Toy pair: whole rows, rows that "
    "hash the whole context (the case by construction); row logs: over the tokens both rows "
    "hold (first-level tokens for the stale row), a lower bound. What the stale row costs in "
    "accepted draft tokens: target_rerank / stale_rerank in relative_gains.")
