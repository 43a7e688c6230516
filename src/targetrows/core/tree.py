"""A draft token tree: node 0 is the root (the last committed token), every other node a draft token.

Trees are small (at most a few hundred nodes) and immutable; everything derived from them is
computed once, vectorised, when the tree is built. Node indices are topological
(``parents[i] < i``), so one forward sweep over the nodes visits parents before children.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class Tree:
    """A token tree with ``tokens[i]`` at node ``i`` and ``parents[i]`` its parent (-1 for the root)."""

    __slots__ = ("tokens", "parents", "depth", "_child_index", "_ancestors")

    def __init__(self, tokens: Sequence[int], parents: Sequence[int]):
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        parents = np.asarray(parents, dtype=np.int64).reshape(-1)
        _check(tokens, parents)
        self.tokens = tokens
        self.parents = parents
        self.tokens.flags.writeable = False
        self.parents.flags.writeable = False
        # one sweep in Python ints (parents[i] < i): a tree is built on the host between a
        # read and the next pass, where NumPy's per-element indexing costs 10x as much
        up = parents.tolist()
        depth = [0] * len(up)
        for i in range(1, len(up)):
            depth[i] = depth[up[i]] + 1
        self.depth = np.array(depth, dtype=np.int64)
        self.depth.flags.writeable = False
        # (parent, token) -> child, verification's only lookup, keyed by one int (`_key`): a
        # dict of ints builds in half the time of one of tuples
        keys = _key(parents, tokens).tolist()
        self._child_index = dict(zip(keys, range(len(keys)), strict=True))
        if len(self._child_index) < len(keys):
            _duplicate_sibling(list(zip(up, tokens.tolist(), strict=True)))
        self._ancestors = None  # `ancestor_mask`, made on first use

    @classmethod
    def root_only(cls, token: int) -> Tree:
        """The empty tree (budget 0): what the target alone (`ar`) verifies."""
        return cls([token], [-1])

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return f"Tree(tokens={self.tokens.tolist()}, parents={self.parents.tolist()})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Tree)
            and np.array_equal(self.tokens, other.tokens)
            and np.array_equal(self.parents, other.parents)
        )

    __hash__ = object.__hash__  # identity: models key their fed entries by the tree object

    @property
    def budget(self) -> int:
        """Number of non-root nodes."""
        return len(self.tokens) - 1

    @property
    def positions(self) -> np.ndarray:
        """Position offset of each node from the root (the depth), for position ids."""
        return self.depth

    def children(self, node: int) -> np.ndarray:
        return np.flatnonzero(self.parents == node)

    def child_with_token(self, node: int, token: int) -> int:
        """Index of `node`'s child carrying `token`, or -1."""
        return self._child_index.get(_key(int(node), int(token)), -1)

    def path(self, node: int) -> np.ndarray:
        """Non-root nodes from the root's child down to `node` (empty for the root)."""
        out = []
        while node > 0:
            out.append(node)
            node = int(self.parents[node])
        return np.array(out[::-1], dtype=np.int64)

    def path_tokens(self, node: int) -> list[int]:
        return self.tokens[self.path(node)].tolist()

    def ancestor_mask(self) -> np.ndarray:
        """``mask[i, j]`` is True when j is i or an ancestor of i: who node i attends to. Made
        on first use and kept, read-only (a drafted pool seldom needs its own)."""
        if self._ancestors is None:
            self._ancestors = ancestor_rows(self.parents)
            self._ancestors.flags.writeable = False
        return self._ancestors

    def subtree(self, nodes: Sequence[int]) -> Tree:
        """The tree made of `nodes` (sorted, ancestor-closed, including 0), re-indexed in that order."""
        nodes = np.asarray(nodes, dtype=np.int64)
        if len(nodes) == 0 or nodes[0] != 0 or np.any(np.diff(nodes) <= 0):
            raise ValueError(f"subtree nodes must be sorted and start at the root 0, got {nodes}")
        new_index = np.full(len(self), -1, dtype=np.int64)
        new_index[nodes] = np.arange(len(nodes))
        parents = np.where(self.parents[nodes] >= 0, new_index[self.parents[nodes]], -1)
        parents[0] = -1
        missing = np.flatnonzero(parents[1:] < 0)
        if len(missing):
            bad = int(nodes[missing[0] + 1])
            raise ValueError(f"subtree nodes are not ancestor-closed: node {bad}'s parent is missing")
        return Tree(self.tokens[nodes], parents)

    def descendants(self, node: int) -> np.ndarray:
        """`node` and every node under it, sorted."""
        up = self.parents.tolist()  # one sweep in Python ints, as for the depth
        inside = [False] * len(up)
        inside[node] = True
        for i in range(node + 1, len(up)):
            inside[i] = inside[up[i]]
        return np.flatnonzero(inside)

    def reroot(self, node: int) -> tuple[Tree, np.ndarray]:
        """The subtree under `node` with `node` as its root, and ``index_map[new] = old``."""
        keep = self.descendants(node)
        new_index = np.full(len(self), -1, dtype=np.int64)
        new_index[keep] = np.arange(len(keep))
        parents = new_index[self.parents[keep]]
        parents[0] = -1
        return Tree(self.tokens[keep], parents), keep


class GrowingTree:
    """A tree under a root token that grows by (parent, token) children, merging a child that
    is already there: RACER's drafts are grown in one (`targetrows.core.recycle`), and
    `merge_trees` unites trees in one."""

    def __init__(self, root_token: int):
        self.tokens, self.parents, self.depth = [int(root_token)], [-1], [0]
        self._index: dict[tuple[int, int], int] = {}

    @property
    def budget(self) -> int:
        return len(self.tokens) - 1

    def child(self, parent: int, token: int) -> tuple[int, bool]:
        """The node for `token` under `parent`, and whether it is new."""
        key = (int(parent), int(token))
        node = self._index.get(key)
        if node is not None:
            return node, False
        node = len(self.tokens)
        self._index[key] = node
        self.tokens.append(key[1])
        self.parents.append(key[0])
        self.depth.append(self.depth[key[0]] + 1)
        return node, True

    def add_path(self, tokens: Sequence[int]) -> int:
        """Insert the path `tokens` under the root; the number of new nodes."""
        node, new = 0, 0
        for token in tokens:
            node, made = self.child(node, token)
            new += made
        return new

    def tree(self) -> Tree:
        return Tree(self.tokens, self.parents)


def merge_trees(trees: Sequence[Tree]) -> tuple[Tree, list[np.ndarray]]:
    """The union of trees under one root token: a node for every distinct token path, in the
    order first met (tree by tree, parents before children), and where each tree's nodes sit
    in it (``where[j][i]``: tree j's node i). One target pass over the union scores them all."""
    if not trees or len({int(t.tokens[0]) for t in trees}) != 1:
        raise ValueError("merge_trees needs at least one tree, all under the same root token")
    union = GrowingTree(int(trees[0].tokens[0]))
    where = []
    for tree in trees:
        at = np.zeros(len(tree), dtype=np.int64)
        for i in range(1, len(tree)):  # parents[i] < i: the parent is placed already
            at[i] = union.child(at[tree.parents[i]], tree.tokens[i])[0]
        where.append(at)
    return union.tree(), where


def ancestor_rows(parents: np.ndarray) -> np.ndarray:
    """[n, n] ``mask[i, j]``: j is i or an ancestor of i, in a tree of topological `parents`.
    Rows are filled a run of nodes at a time whose parents all come before the run: one step
    per level of a pool (numbered level by level), one per node of a chain."""
    n = len(parents)
    out = np.zeros((n, n), dtype=bool)
    out[0, 0] = True
    up, start = parents.tolist(), 1
    for end in range(2, n + 1):
        if end < n and up[end] < start:
            continue  # node `end` joins the run: its parent's row is final
        if end - start == 1:  # a run of one node (a chain's): plain row operations
            out[start] = out[up[start]]
            out[start, start] = True
        else:
            run = np.arange(start, end)
            out[run] = out[parents[run]]
            out[run, run] = True
        start = end
    return out


def _check(tokens: np.ndarray, parents: np.ndarray) -> None:
    """Reject a malformed tree with a message that names the offending node."""
    if len(tokens) == 0:
        raise ValueError("a tree needs at least the root node (tokens is empty)")
    if len(tokens) != len(parents):
        raise ValueError(
            f"tokens and parents differ in length ({len(tokens)} vs {len(parents)})"
        )
    if parents[0] != -1:
        raise ValueError(f"node 0 is the root: parents[0] must be -1, got {parents[0]}")
    # one test for each kind of fault (a tree is built every round); the node is found after
    if tokens.min() < 0:
        raise ValueError(f"node {int(np.flatnonzero(tokens < 0)[0])} has a negative token id")
    if tokens.max() >= 2**32:  # no vocabulary comes near; `_key` relies on it
        raise ValueError(f"node {int(np.flatnonzero(tokens >= 2**32)[0])} has a token id past "
                         "2**32")
    below = parents[1:] - np.arange(1, len(parents))  # < 0 where a parent comes before its node
    if len(below) and (parents[1:].min() < 0 or below.max() >= 0):
        i = int(np.flatnonzero((parents[1:] < 0) | (below >= 0))[0]) + 1
        raise ValueError(
            f"node {i} has parent {parents[i]}: parents must satisfy 0 <= parents[i] < i "
            "(node indices are topological, which also rules out cycles)"
        )


def _key(parent, token):
    """One int per (parent, token) pair, for ints or arrays: token ids are below 2**32."""
    return (parent << 32) | token


def _duplicate_sibling(pairs: list[tuple[int, int]]) -> None:
    """Name the first node whose (parent, token) repeats an earlier node's: sibling tokens must be
    distinct."""
    seen = set()
    for i, (parent, token) in enumerate(pairs):
        if (parent, token) in seen:
            raise ValueError(
                f"node {i} repeats token {token} among the children of node {parent}: sibling "
                "tokens must be distinct"
            )
        seen.add((parent, token))
