"""`targetrows score`: every selection rule at every budget on a row log, NumPy only.

For each logged pool, the probability that verification reaches each node (the product of edge
probabilities along its path; at temperature 0, 1 if the path matches the trajectory's greedy
continuation, else 0) is computed once, for many pools at a time, looping over the pool's node
slots. Each rule then scores itself from its own definition (`Rule.expected`, the same scores
its decoder selects by online): one top-B ordering per rule and pool, and one cumulative sum
gives every budget at once. The rules that commit t0 take the trajectory's next token, an exact
draw from the root row; a rule that drafts anew under t0 (`first_token_redraft`) is scored on
the pool logged at the next position, which is drafted under that token.

The draft-free decoders (racer, recycle) draw no pool: their trees are rebuilt along the logged
path from the top ids the log holds there (`targetrows.rowlog.draft_free`, which says what that
approximates) and appear in the table under the decoder's name.

A learned rule scores with its reranker (`rerankers`), cross-fitted where the reranker holds
fold models: each prompt with the model that was trained without it.

The rows a rule may read come from the log: the exact root row is the first-level edge
probabilities, the stale row the target's row at the previous context (`stale_p`; a position
without one, a one-token prompt at its start, leaves its pool to the draft's own ranking).
Tokens committed per round: accepted + bonus, + t0 for the rules that commit it (a tree after
t0 without draft nodes is verified for its bonus, as the decoders do by default); just t0 when
t0 is the stop token that ended the trajectory. A stop token inside the accepted path is not
special-cased.
"""

from __future__ import annotations

import csv
import io
import os

import numpy as np

from targetrows.core.atomic import atomic_file
from targetrows.core.rows import greedy
from targetrows.core.rules.batch import PoolBatch, reach_batch, reach_batch_greedy
from targetrows.decoding.registry import RULES, draft_free_decoders, get_rule, rule_names
from targetrows.rowlog import format as rowlog
from targetrows.rowlog.draft_free import score_draft_free

COLUMNS = ("pair", "task", "temperature", "prompt_id", "turn", "position", "rule", "budget",
           "accepted", "nodes", "committed", "draft_kind")
_INT_COLUMNS = ("turn", "position", "budget", "nodes")
_FLOAT_COLUMNS = ("temperature", "accepted", "committed")


def score_log(log: rowlog.RowLog, budgets, rules=None, pair: str | None = None,
              chunk: int = 4096, rerankers=None) -> dict[str, np.ndarray]:
    """The tidy table: one row per scored position x rule x budget (columns `COLUMNS`);
    `rules`: registered rule names and draft-free decoders (`targetrows.rowlog.draft_free`;
    default: every rule that needs no reranker, the learned ones `rerankers` holds (a mapping
    rule -> Reranker), and the draft-free decoders where the log holds their rows)."""
    budgets = _check_budgets(budgets)
    rerankers = dict(rerankers or {})
    if rules is None:
        rules = tuple(r for r in rule_names() if not get_rule(r).learned or r in rerankers)
        rules += draft_free_decoders() if log.has_path_rows else ()
    rules = tuple(rules)
    known = rule_names() + draft_free_decoders()
    unknown = [r for r in rules if r not in known]
    if unknown or not rules:
        raise ValueError(f"unknown rules {unknown}: choose from {', '.join(known)}")
    draft_free = [r for r in rules if r not in rule_names()]
    rules = tuple(r for r in rules if r in rule_names())
    untrained = [r for r in rules if get_rule(r).learned and r not in rerankers]
    if untrained:
        raise ValueError(f"rules {untrained} score with a trained reranker: give one (--reranker)")
    pools = _Pools(log, rerankers)
    scored = np.flatnonzero(log.rec_scored)
    seg, pos = log.rec_segment[scored], log.rec_position[scored]
    traj_len = np.diff(log.traj_offsets)[seg]
    if np.any(pos >= traj_len):
        raise ValueError("row log has a scored position without its next trajectory token")
    stop_t0 = log.seg_stopped[seg] & (pos == traj_len - 1)
    nxt = log.record_index(seg, pos + 1)
    redraft = [r for r in rules if get_rule(r).tree == "redraft"]
    if redraft and np.any((nxt < 0) & ~stop_t0):
        bad = int(np.flatnonzero((nxt < 0) & ~stop_t0)[0])
        raise ValueError(f"row log has no pool at position {int(pos[bad]) + 1} of segment "
                         f"{int(seg[bad])}, which {redraft[0]} needs")
    need = scored  # every pool is scored once: at S = 1 the next position's pool is scored too
    if redraft:
        need = np.unique(np.concatenate([scored, nxt[nxt >= 0]]))
    got = _by_chunks(pools, need, budgets, rules, chunk)
    here, results = np.searchsorted(need, scored), {}
    have = np.flatnonzero(nxt >= 0)
    there = np.searchsorted(need, nxt[have])
    for rule in rules:
        acc, nodes = got[rule]
        if get_rule(rule).tree != "redraft":
            results[rule] = (acc[here], nodes[here])
        else:  # the pool drafted under t0 is the next position's
            a, b = np.zeros((len(scored), len(budgets))), np.zeros((len(scored), len(budgets)))
            a[have], b[have] = acc[there], nodes[there]
            results[rule] = (a, b)
    for name in draft_free:
        results[name] = score_draft_free(log, name, budgets, scored)
    return _table(log, scored, stop_t0, budgets, rules + tuple(draft_free), results, pair)


class _Pools:
    """The log's pools as [records, nodes] arrays (views when every pool has the same size)."""

    def __init__(self, log: rowlog.RowLog, rerankers=None):
        self.log = log
        self.rerankers = rerankers or {}
        seg = log.rec_segment
        self.key = np.array([f"{t}/{q}" for t, q in zip(log.seg_task, log.seg_question,
                                                         strict=True)], dtype=object)[seg]
        sizes = np.diff(log.pool_offsets)
        self.size = sizes
        n = int(sizes.max()) if len(sizes) else 1
        self.n = n
        missing = [k for k in ("temperature", "depth") if k not in log.header]
        if missing:
            raise ValueError(f"row log header lacks {missing}: it was not written by `record`")
        self.temperature = float(log.header["temperature"])
        self.depth = int(log.header["depth"])  # greedy continuations need this many tokens
        names = ("pool_tokens", "pool_parents", "pool_logq", "edge_p")
        if np.all(sizes == n):
            self.arr = {k: getattr(log, k).reshape(-1, n) for k in names}
        else:  # pad: parent 0, token -1, log-prob -inf, probability 0 (never reached)
            fill = {"pool_tokens": -1, "pool_parents": 0, "pool_logq": -np.inf, "edge_p": 0}
            local = np.arange(len(log.pool_tokens)) - np.repeat(log.pool_offsets[:-1], sizes)
            rec = np.repeat(np.arange(len(sizes)), sizes)
            self.arr = {}
            for k in names:
                a = np.full((len(sizes), n), fill[k], dtype=getattr(log, k).dtype)
                a[rec, local] = getattr(log, k)
                self.arr[k] = a

    def batch(self, idx: np.ndarray, reranker=None) -> tuple[PoolBatch, np.ndarray, np.ndarray]:
        """Pools `idx` as a `PoolBatch` carrying the root and stale rows (and `reranker`), each
        node's reach probability, and t0 (the trajectory's next token) as a one-hot over the
        nodes."""
        par = self.arr["pool_parents"][idx].astype(np.int64)
        tok = self.arr["pool_tokens"][idx].astype(np.int64)
        edge = self.arr["edge_p"][idx].astype(np.float64)
        first = (par == 0) & (tok >= 0)
        with np.errstate(divide="ignore"):
            root_logp = np.where(first, np.log(edge), 0.0)  # a first-level edge is the root row
        batch = PoolBatch(tok, par, self.arr["pool_logq"][idx].astype(np.float64),
                          self.size[idx], root_logp, self.stale_logp(idx, first), reranker)
        if greedy(self.temperature):
            reach = reach_batch_greedy(par, tok, self.continuation(idx))
        else:
            reach = reach_batch(par, edge)
        t0 = self.continuation(idx)[:, :1]
        return batch, reach, (first & (tok == t0)).astype(np.float64)

    def continuation(self, idx: np.ndarray) -> np.ndarray:
        """[len(idx), depth] trajectory tokens from each record's position on (-1 past the end)."""
        log = self.log
        seg = log.rec_segment[idx]
        start = log.traj_offsets[seg] + log.rec_position[idx]
        at = start[:, None] + np.arange(self.depth)
        ok = at < log.traj_offsets[seg + 1][:, None]
        return np.where(ok, log.traj_tokens[np.where(ok, at, 0)], -1)

    def stale_logp(self, idx: np.ndarray, first: np.ndarray) -> np.ndarray:
        """[len(idx), nodes]: log of stale_p at first-level nodes (mask `first`), else 0."""
        off = self.log.first_offsets
        counts = off[idx + 1] - off[idx]
        flat = np.repeat(off[idx] - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        out = np.zeros(first.shape)
        with np.errstate(divide="ignore"):
            out[first] = np.log(self.log.stale_p[flat].astype(np.float64))
        return out


def _learned(pools: _Pools, idx: np.ndarray, budgets: np.ndarray, rule: str):
    """A learned rule on pools `idx`, each prompt's pools with the model that never saw it."""
    model = pools.rerankers[rule]
    acc, nodes = np.zeros((len(idx), len(budgets))), np.zeros((len(idx), len(budgets)))
    keys = pools.key[idx]
    for key in dict.fromkeys(keys):
        rows = np.flatnonzero(keys == key)
        batch, reach, t0 = pools.batch(idx[rows], model.for_prompt(key))
        acc[rows], nodes[rows] = get_rule(rule).expected(batch, reach, budgets, t0)
    return acc, nodes


def _by_chunks(pools: _Pools, idx: np.ndarray, budgets: np.ndarray, rules, chunk: int):
    """{rule: (accepted, nodes)}, each [len(idx), len(budgets)], over the pools `idx`."""
    parts = []
    for s in range(0, len(idx), chunk):
        part = idx[s : s + chunk]
        batch, reach, t0 = pools.batch(part)
        parts.append({r: get_rule(r).expected(batch, reach, budgets, t0) for r in rules
                      if not get_rule(r).learned})
        for r in [r for r in rules if get_rule(r).learned]:
            parts[-1][r] = _learned(pools, part, budgets, r)
    empty = np.zeros((0, len(budgets)))
    return {r: (np.concatenate([p[r][0] for p in parts]) if parts else empty,
                np.concatenate([p[r][1] for p in parts]) if parts else empty) for r in rules}


def _table(log, scored, stop_t0, budgets, rules, results, pair):
    m, nr, nb = len(scored), len(rules), len(budgets)
    acc = np.empty((m, nr, nb))
    nodes = np.empty((m, nr, nb))
    committed = np.empty((m, nr, nb))
    for j, rule in enumerate(rules):
        a, b = results[rule]
        if rule in RULES and get_rule(rule).commits_t0:  # t0 too; a stop token t0 ends it
            a, b = np.where(stop_t0[:, None], 0.0, a), np.where(stop_t0[:, None], 0.0, b)
            committed[:, j] = np.where(stop_t0[:, None], 1.0, a + 2.0)
        else:
            committed[:, j] = a + 1.0
        acc[:, j], nodes[:, j] = a, b
    per = nr * nb
    seg = log.rec_segment[scored]
    if pair is None:
        pair = "+".join(os.path.basename(str(log.header.get(k, "?")).rstrip("/"))
                        for k in ("target", "draft"))
    return {
        "pair": np.full(m * per, pair, dtype=object),
        "task": np.repeat(log.seg_task.astype(object)[seg], per),
        "temperature": np.full(m * per, float(log.header.get("temperature", np.nan))),
        "prompt_id": np.repeat(log.seg_question.astype(object)[seg], per),
        "turn": np.repeat(log.seg_turn[seg].astype(np.int64), per),
        "position": np.repeat(log.rec_position[scored].astype(np.int64), per),
        "rule": np.tile(np.repeat(np.array(rules, dtype=object), nb), m),
        "budget": np.tile(budgets, m * nr),
        "accepted": acc.reshape(-1),
        "nodes": nodes.reshape(-1).astype(np.int64),
        "committed": committed.reshape(-1),
        # which draft made the pools (eagle3, standalone): the paper's claims 3-5 are about
        # EAGLE-3 heads; empty for a log recorded before it said. Last, so that the columns
        # before it keep their places
        "draft_kind": np.full(m * per, log.header.get("draft_kind", ""), dtype=object),
    }


def _check_budgets(budgets) -> np.ndarray:
    b = np.asarray(list(budgets))
    if b.size == 0 or b.dtype.kind not in "iu" or np.any(b < 1):
        raise ValueError(f"budgets must be integers >= 1 (non-root nodes), got {list(budgets)}")
    return b.astype(np.int64)


# -- tables -----------------------------------------------------------------------------------


def write_table(table: dict[str, np.ndarray], path: str) -> None:
    """CSV (or ``.npz`` when the name ends so), written atomically (temp file, then rename)."""
    with atomic_file(path) as f:
        if path.endswith(".npz"):  # fixed time stamps: the same table, the same bytes
            rowlog.savez(f, {k: v.astype(str) if v.dtype == object else v
                             for k, v in table.items()})
        else:
            text = io.TextIOWrapper(f, encoding="utf-8", newline="")
            writer = csv.writer(text, lineterminator="\n")
            writer.writerow(list(table))
            writer.writerows(zip(*(v.tolist() for v in table.values()), strict=True))
            text.flush()
            text.detach()  # leave the file to atomic_file


def read_table(path: str) -> dict[str, np.ndarray]:
    """A table written by `write_table` (CSV or .npz), with numeric columns as numbers."""
    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k].astype(object) if z[k].dtype.kind == "U" else z[k] for k in z.files}
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ValueError(f"table {path} is empty (no header line)")
    cols = list(zip(*rows[1:], strict=True)) if len(rows) > 1 else [()] * len(rows[0])
    out = {}
    for name, values in zip(rows[0], cols, strict=True):
        if name in _INT_COLUMNS:
            out[name] = np.array(values, dtype=np.int64)
        elif name in _FLOAT_COLUMNS:
            out[name] = np.array(values, dtype=np.float64)
        else:
            out[name] = np.array(values, dtype=object)
    return out


def concat_tables(tables: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([t[k] for t in tables]) for k in tables[0]}


