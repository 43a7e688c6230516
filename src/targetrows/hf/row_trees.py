"""What a sequence's row of the cache holds, as both torch backends (a target or standalone
draft, an EAGLE-3 head) keep it: the committed prefix, then the entries of this round's tree
nodes fed so far, and what one pass of a target feeds and what each fed token sees.

Pool expansion asks a draft for one level more at a time, each time as a new `Tree` that
repeats the previous one's nodes and appends the next level's; a row keeps the entries of the
nodes it already fed when the new tree extends the old one under the same context
(`RowTree.extended_by`), and starts the tree afresh otherwise. A target's pass (`plan_feed`) feeds
the uncached tail of the context as a chain, then the nodes asked for and their unfed
ancestors, each once; a row asked for again is fed once more and left dead. A tail token sees
the prefix and the tail before it; a tree node sees the prefix, the tail, and the entries of
its ancestors and itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from targetrows.core.tree import Tree

from .pass_builder import Feed

_NONE = np.zeros(0, dtype=np.int64)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the longest common prefix of two token arrays."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


@dataclass
class RowTree:
    """One sequence's row: the committed tokens its first entries stand for (`prefix`), the
    round's tree (fed under a context of `tree_ctx` tokens) and each node's entry (`slot`,
    -1 if not fed)."""

    prefix: np.ndarray = field(default_factory=lambda: _NONE)
    tree: Tree | None = None
    tree_ctx: int = 0
    slot: np.ndarray = field(default_factory=lambda: _NONE)

    def drop_tree(self) -> None:
        self.tree, self.tree_ctx, self.slot = None, 0, _NONE

    def extended_by(self, tree: Tree, n_ctx: int) -> bool:
        """Whether `tree`, asked for under a context of `n_ctx` tokens, extends the current
        tree: the same context and the same first nodes."""
        old = self.tree
        return (old is not None and self.tree_ctx == n_ctx and len(tree) >= len(old)
                and (tree is old or (np.array_equal(tree.tokens[: len(old)], old.tokens)
                                     and np.array_equal(tree.parents[: len(old)],
                                                        old.parents))))

    def adopt(self, tree: Tree, n_ctx: int, kept: bool) -> None:
        """Make `tree` the current one, keeping the fed nodes' slots where it extends the old
        tree (`kept`: `extended_by`, whose caller drops their entries otherwise)."""
        if not kept:
            self.slot = np.full(len(tree), -1, dtype=np.int64)
        elif len(tree) > len(self.slot):
            self.slot = np.concatenate([self.slot,
                                        np.full(len(tree) - len(self.slot), -1, np.int64)])
        self.tree, self.tree_ctx = tree, n_ctx

    def path_slots(self, ctx: np.ndarray, start: int) -> list[int]:
        """The entries (at `start` or after) of the fed tree nodes along `ctx` past the tree's
        context, in order: what a commit keeps after the prefix (the root's first, where it
        was fed as a tree node)."""
        tree, n_t = self.tree, self.tree_ctx
        if tree is None or len(ctx) < n_t or ctx[n_t - 1] != tree.tokens[0]:
            return []
        kept = [int(self.slot[0])] if self.slot[0] >= start else []
        node = 0
        for tok in ctx[n_t:].tolist():  # the accepted path: a few steps
            node = tree.child_with_token(node, tok)
            if node < 0 or self.slot[node] < 0:
                break
            kept.append(int(self.slot[node]))
        return kept


def plan_feed(row: int, state: RowTree, base: int, ctx: np.ndarray, tree: Tree,
              nodes: np.ndarray) -> Feed:
    """A target's pass for rows at `nodes` of `tree` under `ctx`, its row holding `base`
    entries: the uncached tail, then the requested nodes and their unfed ancestors (their
    slots recorded in `state`), then rows asked for again."""
    start, n_ctx, slot = len(state.prefix), len(ctx), state.slot
    tail = ctx[start: n_ctx - 1]  # uncached committed tokens before the root
    anc = tree.ancestor_mask()
    fed = slot >= 0
    new = np.flatnonzero(anc[nodes].any(axis=0) & ~fed)  # requested + unfed ancestors
    again = np.unique(nodes[fed[nodes]])
    m = len(tail)
    slot[new] = base + m + np.arange(len(new))
    query = np.concatenate([new, again])
    row_of = np.full(len(tree), -1, dtype=np.int64)
    row_of[query] = m + np.arange(len(query))
    # what each fed token sees from the prefix's end on: tail rows causally; tree rows the
    # tail and the entries of the node and its ancestors (a committed root's is in the prefix)
    q = m + len(query)
    seen = np.zeros((q, base + q - start), dtype=bool)
    seen[:m, :m] = np.tri(m, dtype=bool)
    seen[m:, :m] = True
    in_row = slot >= start
    seen[m:, slot[in_row] - start] = anc[query][:, in_row]
    return Feed(row, start, base, ids=np.concatenate([tail, tree.tokens[query]]),
                positions=np.concatenate([start + np.arange(m), n_ctx - 1 + tree.depth[query]]),
                seen=seen, keep=row_of[nodes], tail=tail, query=query)


def seen_by(nodes: np.ndarray, start: int, entries: int, slot: np.ndarray,
            anc: np.ndarray) -> np.ndarray:
    """[len(nodes), entries]: the entries each fed node sees, itself included (a pool's level
    grown on the device: `targetrows.hf.device_pool`)."""
    seen = np.zeros((len(nodes), entries), dtype=bool)
    seen[:, :start] = True  # the committed prefix (a committed root's entry among them)
    in_row = slot >= start
    seen[:, slot[in_row]] = anc[nodes][:, in_row]
    return seen
