"""The bookkeeping every cached torch backend (a target `HFModel`, an EAGLE-3 head) keeps about
the round's tree: which of its nodes were fed, and where their cache entries are (which nodes
each one may attend to is the tree's own `Tree.ancestor_mask`).

Pool expansion asks a draft for one level more at a time, each time as a new `Tree` that
repeats the previous one's nodes and appends the next level's; a model keeps the entries of the
nodes it already fed when the new tree extends the old one under the same context, and starts
afresh otherwise. These are the functions both backends do that with.
"""

from __future__ import annotations

import numpy as np

from targetrows.core.tree import Tree


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the longest common prefix of two token arrays."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def extends(old: Tree | None, old_ctx_len: int, tree: Tree, n_ctx: int) -> bool:
    """Whether `tree`, asked for under a context of `n_ctx` tokens, extends `old` (fed under
    `old_ctx_len`): the same context and the same first nodes."""
    return (old is not None and old_ctx_len == n_ctx and len(tree) >= len(old)
            and (tree is old or (np.array_equal(tree.tokens[: len(old)], old.tokens)
                                 and np.array_equal(tree.parents[: len(old)], old.parents))))


def adopt(slot: np.ndarray, old: Tree | None, tree: Tree, kept: bool) -> np.ndarray:
    """Each node's cache slot (-1: not fed yet) once `tree` becomes the current tree: the old
    slots kept when the tree extends the old one (`kept`). Who a node attends to is the tree's
    own `ancestor_mask`, made when a pass first needs it."""
    if not kept:
        return np.full(len(tree), -1, dtype=np.int64)
    if len(tree) > len(old):
        return np.concatenate([slot, np.full(len(tree) - len(old), -1, np.int64)])
    return slot
