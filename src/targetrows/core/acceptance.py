"""Expected acceptance: how many draft nodes lossless verification accepts, on average.

At a node, verification moves on to a child with the target's probability of that child's token,
so node ``i`` is reached with probability ``prod(edge_prob)`` along its path, and the expected
number of accepted non-root nodes is the sum of those reach probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .tree import Tree


def reach_probability(tree: Tree, edge_prob: Sequence[float]) -> np.ndarray:
    """Probability that verification reaches each node (1 at the root)."""
    p = _check_edge_prob(edge_prob, len(tree))
    reach = np.empty(len(tree))
    reach[0] = 1.0
    parents = tree.parents
    for i in range(1, len(tree)):  # topological order: the parent is already done
        reach[i] = reach[parents[i]] * p[i]
    return reach


def expected_accepted(tree: Tree, edge_prob: Sequence[float]) -> float:
    """Expected accepted non-root nodes; ``edge_prob[i]`` is the target's probability of
    ``tokens[i]`` at the context of ``parents[i]`` (``edge_prob[0]`` is unused)."""
    return float(reach_probability(tree, edge_prob)[1:].sum())


def expected_accepted_batch(
    parents: np.ndarray,
    edge_prob: np.ndarray,
    valid: np.ndarray | None = None,
    chunk: int = 2048,
) -> np.ndarray:
    """`expected_accepted` of m trees at once: ``parents`` and ``edge_prob`` are ``[m, n]``.

    Trees smaller than n are padded: padded nodes have ``valid`` False (or edge_prob 0) and any
    parent index below their own. The loop runs over the n node slots, each step vectorised over
    a chunk of trees small enough for the cache, laid out node-major so each step reads
    contiguous memory.
    """
    parents = np.asarray(parents)
    p = np.asarray(edge_prob, dtype=np.float64)
    if parents.ndim != 2 or parents.shape != p.shape:
        raise ValueError(
            f"parents and edge_prob must both be [trees, nodes], got {parents.shape} and {p.shape}"
        )
    m, n = p.shape
    if valid is not None:
        valid = np.asarray(valid, dtype=bool)
        if valid.shape != p.shape:
            raise ValueError(f"valid must be {p.shape}, got {valid.shape}")
    index = np.arange(n)
    out = np.empty(m)
    for start in range(0, m, chunk):  # checks run per chunk too, while it is in the cache
        par = parents[start : start + chunk]
        ep = p[start : start + chunk]
        if valid is not None:
            ep = np.where(valid[start : start + chunk], ep, 0.0)
        _check_batch(par, ep, index, start)
        c = len(par)
        slot = par.T * c + np.arange(c)  # [n, c]: flat index of each node's parent in `reach`
        ep = ep.T
        reach = np.empty((n, c))
        reach[0] = 1.0
        flat = reach.reshape(-1)
        for i in range(1, n):
            np.multiply(flat.take(slot[i]), ep[i], out=reach[i])
        out[start : start + c] = reach[1:].sum(axis=0)
    return out


def _check_batch(par: np.ndarray, ep: np.ndarray, index: np.ndarray, start: int) -> None:
    bad_parent = (par[:, 1:] < 0) | (par[:, 1:] >= index[1:])
    if bad_parent.any():
        t, i = np.argwhere(bad_parent)[0]
        raise ValueError(
            f"tree {start + t} node {i + 1} has parent {par[t, i + 1]}: "
            "parents must satisfy 0 <= parents[i] < i"
        )
    q = ep[:, 1:]
    if not (np.all(q >= 0) and np.all(q <= 1 + 1e-9)):  # NaN fails both comparisons
        raise ValueError("edge_prob must be probabilities in [0, 1] (found NaN, inf or out of range)")


def expected_accepted_greedy(tree: Tree, continuation: Sequence[int]) -> int:
    """Accepted nodes at temperature 0: the longest root path matching the target's greedy
    continuation (the tokens the target itself would emit next)."""
    node, accepted = 0, 0
    for token in continuation:
        node = tree.child_with_token(node, token)
        if node < 0:
            break
        accepted += 1
    return accepted


def _check_edge_prob(edge_prob: Sequence[float], n: int) -> np.ndarray:
    p = np.asarray(edge_prob, dtype=np.float64).reshape(-1)
    if len(p) != n:
        raise ValueError(f"edge_prob has {len(p)} entries for a tree of {n} nodes")
    q = p[1:]
    if np.any(~np.isfinite(q)) or np.any(q < 0) or np.any(q > 1 + 1e-9):
        raise ValueError("edge_prob must be probabilities in [0, 1] (found NaN, inf or out of range)")
    return p
