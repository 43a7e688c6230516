"""`targetrows score`: every selection rule at every budget on a row log, NumPy only.

For each logged pool, the probability that verification reaches each node (the product of edge
probabilities along its path; at temperature 0, 1 if the path matches the trajectory's greedy
continuation, else 0) is computed once, for all pools at a time, looping over the pool's node
slots. Every rule's selection is ancestor-closed, so its expected accepted draft tokens is the sum
of reach over the selected nodes: one top-B ordering per rule and pool, and one cumulative sum
gives every budget at once.

Rules (the numbers equal `targetrows.select` + `expected_accepted` on each pool):
    draft_rank     top-B by cumulative draft log-prob.
    target_rerank  the same with first-level log-probs from the target's exact root row.
    stale_rerank   the same with the target's row at the previous context (the inexact reuse
                   that needs no extra pass); with no previous row (a one-token prompt at its
                   first position) it is draft_rank.
    pearl          t0 = the trajectory's next token (an exact draw from the root row),
                   committed; the draft_rank tree of B nodes pruned to the subtree under t0.
    first_token    t0 as for pearl; the top-B nodes below t0's first-level node of the same
                   pool (nothing when t0 is not a first-level token). Contains pearl's tree.
    first_token_redraft  t0 as for pearl; a draft_rank tree of B nodes from the pool logged
                   under t0 at position t + 1 (a pool drafted anew under t0: an extension).
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
from targetrows.decoding.registry import get_rule, rule_names
from targetrows.rowlog import format as rowlog

RULES = rule_names()  # every registered rule; each has its scorer below
# rules scored on the position's own pool (first_token_redraft reads the next position's)
_SAME_POOL = ("draft_rank", "target_rerank", "stale_rerank", "pearl", "first_token")
COLUMNS = ("pair", "task", "temperature", "prompt_id", "turn", "position", "rule", "budget",
           "accepted", "nodes", "committed")
_INT_COLUMNS = ("turn", "position", "budget", "nodes")
_FLOAT_COLUMNS = ("temperature", "accepted", "committed")


def score_log(log: rowlog.RowLog, budgets, rules=RULES, pair: str | None = None,
              chunk: int = 4096) -> dict[str, np.ndarray]:
    """The tidy table: one row per scored position x rule x budget (columns `COLUMNS`)."""
    budgets = _check_budgets(budgets)
    unknown = [r for r in rules if r not in RULES]
    if unknown or not rules:
        raise ValueError(f"unknown rules {unknown}: choose from {', '.join(RULES)}")
    pools = _Pools(log)
    scored = np.flatnonzero(log.rec_scored)
    seg, pos = log.rec_segment[scored], log.rec_position[scored]
    traj_len = np.diff(log.traj_offsets)[seg]
    if np.any(pos >= traj_len):
        raise ValueError("row log has a scored position without its next trajectory token")
    stop_t0 = log.seg_stopped[seg] & (pos == traj_len - 1)
    nxt = log.record_index(seg, pos + 1)
    redraft = "first_token_redraft" in rules
    if redraft and np.any((nxt < 0) & ~stop_t0):
        bad = int(np.flatnonzero((nxt < 0) & ~stop_t0)[0])
        raise ValueError(f"row log has no pool at position {int(pos[bad]) + 1} of segment "
                         f"{int(seg[bad])}, which first_token_redraft needs")
    need = scored  # every pool is scored once: at S = 1 the next position's pool is scored too
    if redraft:
        need = np.unique(np.concatenate([scored, nxt[nxt >= 0]]))
    inner = [r for r in _SAME_POOL if r in rules]
    if redraft and "draft_rank" not in inner:
        inner.insert(0, "draft_rank")  # first_token_redraft is draft_rank on the next pool
    got = _by_chunks(pools, need, budgets, inner, chunk)
    here = np.searchsorted(need, scored)
    results = {r: (a[here], b[here]) for r, (a, b) in got.items()}
    if redraft:
        have = np.flatnonzero(nxt >= 0)
        acc, nodes = np.zeros((len(scored), len(budgets))), np.zeros((len(scored), len(budgets)))
        there = np.searchsorted(need, nxt[have])
        acc[have], nodes[have] = got["draft_rank"][0][there], got["draft_rank"][1][there]
        results["first_token_redraft"] = (acc, nodes)
    return _table(log, scored, stop_t0, budgets, rules, results, pair)


class _Pools:
    """The log's pools as [records, nodes] arrays (views when every pool has the same size)."""

    def __init__(self, log: rowlog.RowLog):
        self.log = log
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


def _by_chunks(pools: _Pools, idx: np.ndarray, budgets: np.ndarray, rules, chunk: int):
    parts = [_score_chunk(pools, idx[s : s + chunk], budgets, rules)
             for s in range(0, len(idx), chunk)]
    names = [r for r in _SAME_POOL if r in rules]
    empty = np.zeros((0, len(budgets)))
    return {r: (np.concatenate([p[r][0] for p in parts]) if parts else empty,
                np.concatenate([p[r][1] for p in parts]) if parts else empty) for r in names}


def _score_chunk(pools: _Pools, idx: np.ndarray, budgets: np.ndarray, rules):
    """(accepted, nodes), each [len(idx), len(budgets)], for each rule on pools `idx`."""
    par = pools.arr["pool_parents"][idx]
    tok = pools.arr["pool_tokens"][idx]
    logq = pools.arr["pool_logq"][idx].astype(np.float64)
    edge = pools.arr["edge_p"][idx].astype(np.float64)
    c, n = par.shape
    greedy = pools.temperature == 0
    reach, anc1 = _reach(par, tok, edge, pools.continuation(idx) if greedy else None)
    anc_at = anc1 + (np.arange(c) * n)[:, None]  # flat index of each node's first-level ancestor
    k = min(int(budgets.max()), n - 1)
    col = np.minimum(budgets, k) - 1
    nodes = np.minimum(budgets[None, :], pools.size[idx][:, None] - 1).astype(np.float64)
    out = {}

    def take(order):
        return np.cumsum(_gather(reach, order), axis=1)[:, col], nodes

    draft = _top_order(logq[:, 1:], k) + 1
    if "draft_rank" in rules:
        out["draft_rank"] = take(draft)
    if "target_rerank" in rules or "stale_rerank" in rules:
        # select.target_rerank_logp's score, operation for operation (same ties)
        first = (par == 0) & (tok >= 0)  # padded nodes (token -1) hang off the root too
        with np.errstate(invalid="ignore"):
            below_first = logq - logq.reshape(-1)[anc_at]
        below_first[np.isnan(below_first)] = -np.inf  # under a first token the draft ruled out
        if "target_rerank" in rules:
            with np.errstate(divide="ignore"):
                first_logp = np.where(first, np.log(edge), 0.0)
            score = first_logp.reshape(-1)[anc_at] + below_first
            out["target_rerank"] = take(_top_order(score[:, 1:], k) + 1)
        if "stale_rerank" in rules:
            score = pools.stale_logp(idx, first).reshape(-1)[anc_at] + below_first
            none = np.isnan(score).any(axis=1)  # no previous row: rank by the draft alone
            score[none] = logq[none]
            out["stale_rerank"] = take(_top_order(score[:, 1:], k) + 1)
    if "pearl" in rules or "first_token" in rules:
        log = pools.log
        seg, pos = log.rec_segment[idx], log.rec_position[idx]
        inside = pos < log.traj_offsets[seg + 1] - log.traj_offsets[seg]
        at = np.minimum(log.traj_offsets[seg] + pos, len(log.traj_tokens) - 1)
        t0 = np.where(inside, log.traj_tokens[at], -1)
        hit = (par == 0) & (tok == t0[:, None])
        t0_node = np.where(hit.any(axis=1), hit.argmax(axis=1), -1)[:, None]
        below = (anc1 == t0_node) & (np.arange(n) != t0_node)  # [pools, nodes]
        # reached from t0's node: reach / reach(t0's node), which t0, a draw of the target's
        # own, reaches with probability > 0 (1 at temperature 0)
        from_t0 = np.take_along_axis(reach, np.maximum(t0_node, 0), 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            gained = np.nan_to_num(np.where(below, reach / from_t0, 0.0))

        def after_t0(order):  # accepted and nodes of the kept nodes below t0, by budget
            kept = _gather(below, order)
            acc = np.cumsum(_gather(gained, order), axis=1)
            return acc[:, col], np.cumsum(kept, axis=1)[:, col].astype(np.float64)

        if "pearl" in rules:  # the global top-B, pruned: nodes below t0 in draft_rank's order
            out["pearl"] = after_t0(draft)
        if "first_token" in rules:  # the top-B below t0: the same order, others pushed last
            only_below = np.where(below, logq, -np.inf)
            out["first_token"] = after_t0(_top_order(only_below[:, 1:], k) + 1)
    return out


def _reach(par, tok, edge, cont):
    """Per node [pools, nodes]: the probability that verification reaches it, and its
    first-level ancestor (itself at depth 1, 0 for the root).

    At temperature 0 (`cont` given), reach is 1 on the path matching the continuation, else 0
    (sibling tokens are distinct, so at most one node per level matches).
    """
    c, n = par.shape
    cols = np.arange(c)
    parent = par.T.astype(np.intp, order="C") * c + cols  # flat index of each node's parent
    reach, anc1 = np.empty((n, c)), np.empty((n, c), dtype=np.intp)
    reach[0], anc1[0] = 1.0, 0
    reach_flat, anc_flat = reach.reshape(-1), anc1.reshape(-1)
    if cont is None:
        step = edge.T.copy()
    else:
        depth = np.zeros((n, c), dtype=np.intp)
        depth_flat, tok_t, d = depth.reshape(-1), tok.T.copy(), cont.shape[1]
        cont_flat = np.concatenate([cont.T.reshape(-1), np.full(c, -2)])  # -2: deeper than d
    for i in range(1, n):  # parents come first: one vectorised step per node slot
        g = parent[i]
        a = anc_flat[g]
        anc1[i] = np.where(a == 0, i, a)
        if cont is None:
            np.multiply(reach_flat[g], step[i], out=reach[i])
        else:
            depth[i] = depth_flat[g] + 1
            match = tok_t[i] == cont_flat[(np.minimum(depth[i], d + 1) - 1) * c + cols]
            np.multiply(reach_flat[g], match, out=reach[i])
    return np.ascontiguousarray(reach.T), np.ascontiguousarray(anc1.T)


def _top_order(score: np.ndarray, k: int) -> np.ndarray:
    """Column indices of each row's k highest scores, best first, ties to the lower index
    (what a stable argsort of -score gives), via a partition rather than a full sort."""
    neg = -score
    if k >= score.shape[1]:
        return np.argsort(neg, axis=1, kind="stable")
    kth = np.partition(neg, k - 1, axis=1)[:, k - 1 : k]
    take = neg <= kth
    crowded = np.flatnonzero(take.sum(axis=1) > k)  # ties at the k-th score: lower index first
    if len(crowded):
        sub, cut = neg[crowded], kth[crowded]
        tied = sub == cut
        need = k - (sub < cut).sum(axis=1, keepdims=True)
        take[crowded] = (sub < cut) | (tied & (np.cumsum(tied, axis=1) <= need))
    cols = np.nonzero(take)[1].reshape(len(score), k)  # ascending within each row
    return _gather(cols, np.argsort(_gather(neg, cols), axis=1, kind="stable"))


def _gather(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``a[r, idx[r, j]]`` for a C-contiguous 2-D `a` (take_along_axis, without its overhead)."""
    return np.take(a.reshape(-1), idx + (np.arange(len(a)) * a.shape[1])[:, None])


def _table(log, scored, stop_t0, budgets, rules, results, pair):
    m, nr, nb = len(scored), len(rules), len(budgets)
    acc = np.empty((m, nr, nb))
    nodes = np.empty((m, nr, nb))
    committed = np.empty((m, nr, nb))
    for j, rule in enumerate(rules):
        a, b = results[rule]
        if get_rule(rule).commits_t0:  # t0 is committed too; a stop token t0 ends the turn
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


