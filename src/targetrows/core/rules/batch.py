"""Pools as arrays: one candidate pool, or thousands of them, in the form every rule reads.

A `PoolBatch` holds P pools padded to N node slots ([P, N] arrays; a pool's nodes are in pool
order, level by level, so its first nodes are its shallower levels). Padding: token -1, parent
0, draft log-prob -inf; a padded node is never chosen and never reached. Beside the draft's
scores a batch can carry the rows the rules re-score with, read at the first-level nodes'
tokens: the target's exact root row (`root_logp`, from the root pass) and its row at the
previous context (`stale_logp`, from the last verify pass; NaN where there is none).

The helpers below are the vectorised pieces every rule's selection and scoring share: the top
nodes of each pool by a score (ties to the lower index, which keeps a selection
ancestor-closed), a row-wise gather, and the probability that verification reaches each node.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..tree import Tree


@dataclass(frozen=True, eq=False)
class PoolBatch:
    tokens: np.ndarray  # [P, N] int64, -1 at padding
    parents: np.ndarray  # [P, N] int64, -1 at each root, 0 at padding
    logq: np.ndarray  # [P, N] float64 cumulative draft log-prob, 0 at the root, -inf at padding
    size: np.ndarray  # [P] nodes of each pool, its root included
    root_logp: np.ndarray | None = None  # [P, N] log root-row prob of each first-level token
    stale_logp: np.ndarray | None = None  # [P, N] the same under the previous context's row
    reranker: object | None = None  # a learned rule's model (`targetrows.core.rules.learned`)
    # [P] the levels each pool was drafted to, where it holds only some of its nodes (the
    # calibration's union of trees); None: each pool's deepest node says (a shape rule reads it)
    levels: np.ndarray | None = None

    @classmethod
    def of_pool(cls, pool: Tree, logq: np.ndarray, root_logp=None, stale_logp=None,
                reranker=None) -> PoolBatch:
        """One pool; `root_logp` / `stale_logp` give one value per first-level node, in the
        order of ``pool.children(0)`` (None: not known)."""
        n = len(pool)
        first = pool.children(0)

        def at_first(values, name):
            if values is None:
                return None
            values = np.asarray(values, dtype=np.float64).reshape(-1)
            if values.shape != first.shape:
                raise ValueError(f"{name} needs one value per first-level node ({len(first)}), "
                                 f"got {values.shape}")
            out = np.zeros((1, n))
            out[0, first] = values
            return out

        return cls(pool.tokens[None], pool.parents[None], np.asarray(logq, np.float64)[None],
                   np.array([n]), at_first(root_logp, "root_logp"),
                   at_first(stale_logp, "stale_logp"), reranker)

    @property
    def shape(self) -> tuple[int, int]:
        return self.tokens.shape

    @cached_property
    def is_first(self) -> np.ndarray:
        """[P, N] the first-level nodes (children of the root; padding excluded)."""
        return (self.parents == 0) & (self.tokens >= 0)

    @cached_property
    def first(self) -> np.ndarray:
        """[P, N] each node's first-level ancestor: itself at depth 1, 0 for the root; a padded
        node counts as its own (it hangs off the root)."""
        own = np.broadcast_to(np.arange(self.shape[1]), self.shape).copy()
        return from_parents(self, own, lambda up: up, self.parents > 0)

    @cached_property
    def depth(self) -> np.ndarray:
        """[P, N] each node's depth (0 at the root and at padding)."""
        return from_parents(self, np.zeros(self.shape, dtype=np.int64), lambda up: up + 1,
                            self.tokens >= 0)

    @cached_property
    def below_first(self) -> np.ndarray:
        """[P, N] the draft's log-prob of each node given its first-level ancestor (-inf under
        a first-level token the draft ruled out, and at padding)."""
        with np.errstate(invalid="ignore"):
            out = self.logq - np.take_along_axis(self.logq, self.first, 1)
        out[np.isnan(out)] = -np.inf
        return out

    def rescored_first(self, first_logp: np.ndarray) -> np.ndarray:
        """[P, N] scores with each first-level log-prob replaced by `first_logp` (read at the
        first-level nodes) and the draft's own below: what the reranking rules rank by."""
        at_first = np.where(self.is_first, first_logp, 0.0)
        return np.take_along_axis(at_first, self.first, 1) + self.below_first

    def truncated(self, nodes: int) -> PoolBatch:
        """Each pool's first `nodes` nodes (its shallower levels: pools are level-ordered)."""
        cut = slice(0, nodes)
        return PoolBatch(self.tokens[:, cut], self.parents[:, cut], self.logq[:, cut],
                         np.minimum(self.size, nodes),
                         None if self.root_logp is None else self.root_logp[:, cut],
                         None if self.stale_logp is None else self.stale_logp[:, cut],
                         self.reranker, self.levels)


def stack_pools(pools: list[PoolBatch]) -> PoolBatch:
    """Pools of one or more batches in one batch, padded to the widest."""
    n = max(p.shape[1] for p in pools)

    def pad(name, fill, dtype):
        parts = [getattr(p, name) for p in pools]
        if any(a is None for a in parts):
            return None
        out = np.full((sum(len(a) for a in parts), n), fill, dtype=dtype)
        row = 0
        for a in parts:
            out[row : row + len(a), : a.shape[1]] = a
            row += len(a)
        return out

    levels = None
    if all(p.levels is not None for p in pools):
        levels = np.concatenate([p.levels for p in pools])
    return PoolBatch(pad("tokens", -1, np.int64), pad("parents", 0, np.int64),
                     pad("logq", -np.inf, np.float64), np.concatenate([p.size for p in pools]),
                     pad("root_logp", 0.0, np.float64), pad("stale_logp", 0.0, np.float64),
                     pools[0].reranker, levels)


def top_order(score: np.ndarray, k: int) -> np.ndarray:
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
    return gather(cols, np.argsort(gather(neg, cols), axis=1, kind="stable"))


def from_parents(batch: PoolBatch, start: np.ndarray, step, moves: np.ndarray) -> np.ndarray:
    """[P, N] the values with ``value = step(value at the node's parent)`` at every non-root
    node where `moves`, `start` elsewhere. Found as a fixed point, one vectorised step per
    level (a node's value is final one step after its parent's): a pool of N nodes takes its
    depth + 2 steps rather than N - 1, and each value is computed from its parent's final
    value, as a sweep over the nodes would."""
    rows, n = batch.shape
    moves = moves & (np.arange(n) > 0)
    parent = np.maximum(batch.parents, 0) + (np.arange(rows) * n)[:, None]  # in the flat array
    value = start
    while True:
        stepped = np.where(moves, step(value.reshape(-1)[parent]), start)
        if np.array_equal(stepped, value):
            return value
        value = stepped


def gather(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``a[r, idx[r, j]]`` for a C-contiguous 2-D `a` (take_along_axis, without its overhead)."""
    return np.take(a.reshape(-1), idx + (np.arange(len(a)) * a.shape[1])[:, None])


def reach_batch(parents: np.ndarray, edge: np.ndarray) -> np.ndarray:
    """[P, N] probability that verification reaches each node: the product of the edge
    probabilities along its path (parents come first: one vectorised step per node slot)."""
    c, n = parents.shape
    slot = np.maximum(parents, 0).T.astype(np.intp, order="C") * c + np.arange(c)
    step = np.asarray(edge, dtype=np.float64).T.copy()
    reach = np.empty((n, c))
    reach[0] = 1.0
    flat = reach.reshape(-1)
    for i in range(1, n):
        np.multiply(flat[slot[i]], step[i], out=reach[i])
    return np.ascontiguousarray(reach.T)


def reach_batch_greedy(parents: np.ndarray, tokens: np.ndarray,
                       continuation: np.ndarray) -> np.ndarray:
    """`reach_batch` at temperature 0: 1 on the path that matches each pool's greedy
    continuation ([P, depth] tokens, -1 past its end), else 0 (sibling tokens are distinct, so
    at most one node per level matches)."""
    c, n = parents.shape
    cols = np.arange(c)
    slot = np.maximum(parents, 0).T.astype(np.intp, order="C") * c + cols
    tok = tokens.T.copy()
    d = continuation.shape[1]
    cont = np.concatenate([continuation.T.reshape(-1), np.full(c, -2)])  # -2: deeper than d
    reach, depth = np.empty((n, c)), np.zeros((n, c), dtype=np.intp)
    reach[0] = 1.0
    flat, depth_flat = reach.reshape(-1), depth.reshape(-1)
    for i in range(1, n):
        depth[i] = depth_flat[slot[i]] + 1
        match = tok[i] == cont[(np.minimum(depth[i], d + 1) - 1) * c + cols]
        np.multiply(flat[slot[i]], match, out=reach[i])
    return np.ascontiguousarray(reach.T)
