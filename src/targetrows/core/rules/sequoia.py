"""Sequoia's tree shape (arXiv 2402.12374, github.com/Infini-AI-Lab/Sequoia) on our pools.

Sequoia assumes *positional acceptance*: verification moves from a reached node to its k-th
child by draft rank with a probability p[k] that depends on k alone. A tree of ranks then
accepts on average the sum, over its non-root nodes, of the product of p[rank] along the path
(`shape_value`), and Sequoia finds the shape with B non-root nodes, at most D levels below the
root and children of ranks 1..b under every node, that maximises it, by dynamic programming
over (nodes, depth, children) (`optimal_shape`). The draft then fills the shape with its own
ranked tokens.

Here the shape is filled from the EAGLE-2 pool every rule picks from (`fill_shape`): a node's
rank is its place among its parent's pool children by draft log-prob, and a shape node that the
pool lacks (its parent was not expanded, or it ranks past the pool's top_k) is dropped with its
subtree, so the verified tree can be smaller than B. `acceptance_vector` estimates p from
logged pools: the share of the root's reach that goes to its rank-k child (greedy: how often the
target's argmax is the rank-k token; sampling: the target's expected probability of it, which
is what our verification accepts it with).

The rule (`sequoia_rule`) is that shape, budget by budget, filled from the pool: a `Rule` with
a `shape` (`targetrows.core.rules.rule`), so the tree can be smaller than B and the shapes of
two budgets need not be nested. Its depth limit is each pool's own depth (a shape deeper than
the pool only loses nodes). Its scores, the log positional value of each pool node
(`positional_logvalue`), rank the pool as the shape would when p never rises with the rank: then
the optimal shape is the top-B nodes by that value. p is fixed, or read from a model fitted on
row logs (`targetrows.core.rules.sequoia_model`, the registered `sequoia` rule). Where this
departs from Sequoia's code: docs/prior-art.md.
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..checks import check_budget, check_count
from ..tree import Tree
from .batch import PoolBatch, from_parents
from .rule import Rule


def check_acceptance(p) -> np.ndarray:
    """The acceptance vector as floats, ``p[k - 1]`` for rank k, each in [0, 1]."""
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 1 or len(p) == 0 or not np.all((p >= 0) & (p <= 1)):  # NaN fails too
        raise ValueError(f"the acceptance vector must be probabilities, one per rank, got {p}")
    return p


@dataclass(frozen=True)
class Shape:
    """A tree of ranks: node j is the ``ranks[j]``-th child (from 1) of ``parents[j]``; node 0
    is the root (parent -1, rank 0); parents come before children, siblings in rank order.
    `value`: its expected accepted non-root nodes under the acceptance vector it was built for."""

    parents: np.ndarray
    ranks: np.ndarray
    value: float

    @property
    def budget(self) -> int:
        return len(self.parents) - 1

    def depth(self) -> int:
        depth = np.zeros(len(self.parents), dtype=np.int64)
        for j in range(1, len(self.parents)):
            depth[j] = depth[self.parents[j]] + 1
        return int(depth.max())


def shape_value(parents, ranks, p) -> float:
    """Expected accepted non-root nodes of a rank tree under positional acceptance."""
    p = check_acceptance(p)
    reach = np.ones(len(parents))
    for j in range(1, len(parents)):
        reach[j] = reach[parents[j]] * (p[ranks[j] - 1] if ranks[j] <= len(p) else 0.0)
    return float(reach[1:].sum())


def _tables(p: np.ndarray, budget: int, max_depth: int):
    """The dynamic program. ``best[d, n]``: the most a node can expect below it with exactly n
    nodes under it, at most d levels deep (-inf where impossible); ``width[d, n]``: its number
    of children then; ``share[d, b, n]``: the nodes (child included) under the b-th child when
    the first b children hold n nodes.

    For one d: with[b][n], the best of the first b children holding n nodes, is the best over s
    of with[b - 1][n - s] + p[b] (1 + best[d - 1, s - 1]): the b-th child reached with p[b],
    then worth itself and what lies below it (Sequoia's tree_search.py, written as a max-plus
    product over s for all n at once)."""
    k = len(p)
    n_all = np.arange(budget + 1)
    s_all = np.arange(1, budget + 1)
    best = np.full((max_depth + 1, budget + 1), -np.inf)
    best[:, 0] = 0.0
    width = np.zeros((max_depth + 1, budget + 1), dtype=np.int64)
    share = np.zeros((max_depth + 1, k + 1, budget + 1), dtype=np.int64)
    for d in range(1, max_depth + 1):
        below = best[d - 1, s_all - 1]
        fits = np.isfinite(below)
        below = np.where(fits, below, 0.0)  # p = 0 times -inf would be NaN
        with_b = np.full(budget + 1, -np.inf)
        with_b[0] = 0.0  # no children, no nodes
        for b in range(1, k + 1):
            child = np.where(fits, p[b - 1] * (1.0 + below), -np.inf)  # [s]
            rest = n_all[:, None] - s_all[None, :]  # [n, s]: nodes left to the first b - 1
            total = np.where(rest >= 0, with_b[np.maximum(rest, 0)] + child[None, :], -np.inf)
            # among equals the largest s, as Sequoia's loop keeps its first (smallest) y
            pick = budget - 1 - np.argmax(total[:, ::-1], axis=1)
            with_b = total[n_all, pick]
            share[d, b] = np.where(np.isfinite(with_b), pick + 1, 0)
            better = with_b > best[d]  # strictly: the fewest children among equals
            best[d] = np.where(better, with_b, best[d])
            width[d] = np.where(better, b, width[d])
    return best, width, share


def best_values(p, budget: int, max_depth: int) -> np.ndarray:
    """``[d, n]``: the optimal shape's expected accepted non-root nodes with exactly n non-root
    nodes at most d levels deep (-inf where no such shape exists), for every n <= budget and
    d <= max_depth: what a cost model weighs against the verify pass's cost, as Sequoia picks
    its (budget, depth) for the hardware."""
    p = check_acceptance(p)
    return _tables(p, check_count(budget, "budget"), check_count(max_depth, "max_depth"))[0]


def optimal_shape(p, budget: int, max_depth: int) -> Shape:
    """The rank tree of `budget` non-root nodes, at most `max_depth` levels below the root and
    ranks at most len(p), that accepts most on average under positional acceptance p; fewer
    nodes when no shape holds `budget` (every node adds p >= 0, so more never hurts). Ties are
    broken as Sequoia's tree_search.py breaks them: the fewest children, then the largest
    subtree under the last child."""
    p = check_acceptance(p)
    budget, max_depth = check_budget(budget), check_count(max_depth, "max_depth")
    best, width, share = _tables(p, budget, max_depth)
    size = int(np.flatnonzero(np.isfinite(best[max_depth]))[-1])  # budget, or all that fit
    parents, ranks = [-1], [0]
    todo = deque([(0, size, max_depth)])  # (node, nodes under it, levels left): breadth-first
    while todo:
        node, n, d = todo.popleft()
        sizes, left = [], n
        for b in range(int(width[d, n]), 0, -1):  # unwind the last child first
            sizes.append(int(share[d, b, left]))
            left -= sizes[-1]
        for rank, nodes in enumerate(reversed(sizes), start=1):
            todo.append((len(parents), nodes - 1, d - 1))
            parents.append(node)
            ranks.append(rank)
    return Shape(np.array(parents), np.array(ranks), float(best[max_depth, size]))


def sibling_ranks(parents, logq, valid=None) -> np.ndarray:
    """Each node's rank among its parent's children by draft log-prob, from 1, ties to the
    lower index (the order pool expansion adds them in); 0 at roots and invalid nodes. Takes
    one pool ([N]) or a batch ([P, N], `valid` False at padding)."""
    parents = np.atleast_2d(np.asarray(parents, dtype=np.int64))
    logq = np.atleast_2d(np.asarray(logq, dtype=np.float64))
    p, n = parents.shape
    valid = np.ones((p, n), bool) if valid is None else np.atleast_2d(np.asarray(valid, bool))
    group = np.where(valid & (parents >= 0), parents, -1).ravel()
    pool = np.repeat(np.arange(p), n)
    index = np.tile(np.arange(n), p)
    order = np.lexsort((index, -logq.ravel(), group, pool))
    key = pool[order] * (n + 1) + group[order]
    starts = np.r_[0, np.flatnonzero(np.diff(key)) + 1]
    position = np.arange(p * n) - np.repeat(starts, np.diff(np.r_[starts, p * n]))
    ranks = np.empty(p * n, dtype=np.int64)
    ranks[order] = position + 1
    ranks[group < 0] = 0
    return ranks.reshape(p, n)


def fill_shape(pool: Tree, logq, shape: Shape) -> np.ndarray:
    """Sorted node indices of `pool` (the root first) that `shape` maps to: shape node j is the
    pool child of rank ``shape.ranks[j]`` of the pool node its parent maps to. A shape node the
    pool lacks is dropped with its subtree; what is left is ancestor-closed."""
    ranks = sibling_ranks(pool.parents, logq)[0]
    child = {(int(a), int(r)): i for i, (a, r) in enumerate(zip(pool.parents, ranks, strict=True))
             if i > 0}
    where = np.full(len(shape.parents), -1, dtype=np.int64)
    where[0] = 0
    for j in range(1, len(shape.parents)):
        at = where[shape.parents[j]]
        if at >= 0:
            where[j] = child.get((int(at), int(shape.ranks[j])), -1)
    return np.sort(where[where >= 0])


def shape_mask(batch: PoolBatch, shape: Shape) -> np.ndarray:
    """[P, N] `fill_shape` for many pools at once: True at the nodes of each pool the shape
    maps to (the root included)."""
    valid = batch.tokens >= 0
    ranks = sibling_ranks(batch.parents, batch.logq, valid)
    size, widest = len(shape.parents), int(shape.ranks.max(initial=0))
    kid = np.full((size + 1, widest + 2), size, dtype=np.int64)  # row `size`: absent
    kid[shape.parents[1:], shape.ranks[1:]] = np.arange(1, size)
    rank = np.minimum(ranks, widest + 1)
    start = np.full(batch.shape, size, dtype=np.int64)  # the shape node each pool node maps to
    start[:, 0] = 0
    at = from_parents(batch, start, lambda up: kid[up, rank], valid)
    return at < size


def positional_logvalue(batch: PoolBatch, p, max_depth: int | None = None) -> np.ndarray:
    """[P, N] log of each pool node's positional value, the product of p[rank] along its path
    (0 at the root; -inf below max_depth, past rank len(p) and at padding): it never rises from
    a node to its child, and ranks siblings by draft rank when p never rises with the rank."""
    p = check_acceptance(p)
    valid = batch.tokens >= 0
    ranks = sibling_ranks(batch.parents, batch.logq, valid)
    with np.errstate(divide="ignore"):
        edge = np.log(np.r_[p, 0.0])[np.where(ranks > 0, np.minimum(ranks, len(p) + 1), 1) - 1]
    edge = np.where(valid, edge, -np.inf)
    value = from_parents(batch, np.zeros(batch.shape), lambda up: up + edge,
                         np.ones(batch.shape, dtype=bool))
    if max_depth is None:
        return value
    return np.where(batch.depth > max_depth, -np.inf, value)


@functools.lru_cache(maxsize=4096)
def _cached_shape(p: tuple[float, ...], budget: int, max_depth: int) -> Shape:
    return optimal_shape(np.array(p), budget, max_depth)


def shape_of_pools(batch: PoolBatch, p, budget: int, max_depth: int | None = None) -> np.ndarray:
    """[P, N] the optimal shape for `budget` nodes filled from each pool (`shape_mask`), at
    most each pool's own depth (its deepest node, or `batch.levels`; and `max_depth`) deep:
    pools of one depth share one shape, and a shape is computed once per (p, budget, depth)."""
    p = tuple(float(x) for x in check_acceptance(p))
    deepest = batch.depth.max(axis=1) if batch.levels is None else np.asarray(batch.levels)
    if max_depth is not None:
        deepest = np.minimum(deepest, max_depth)
    mask = np.zeros(batch.shape, dtype=bool)
    mask[:, 0] = True  # a pool of its root alone keeps the root
    for d in np.unique(deepest[deepest > 0]).tolist():
        rows = np.flatnonzero(deepest == d)
        part = PoolBatch(batch.tokens[rows], batch.parents[rows], batch.logq[rows],
                         batch.size[rows])
        mask[rows] = shape_mask(part, _cached_shape(p, int(budget), int(d)))
    return mask


def fitted_p(batch: PoolBatch) -> np.ndarray:
    """The acceptance vector of the model the pools carry (`batch.reranker`, an
    `AcceptanceVector`)."""
    model = batch.reranker
    if getattr(model, "p", None) is None:
        raise ValueError("sequoia shapes its tree with an acceptance vector fitted on row logs: "
                         "none was given (targetrows train-reranker --rules sequoia; "
                         "--reranker FILE)")
    return np.asarray(model.p, dtype=np.float64)


def sequoia_rule(p=None, max_depth: int | None = None, name: str = "sequoia") -> Rule:
    """Sequoia's optimal shape filled from the pool, as a shape `Rule`, at most `max_depth`
    levels below the root (None: the pool's depth). `p`: a fixed acceptance vector; None: the
    rule reads p from the fitted model the pools carry (`fitted_p`: a learned rule)."""
    fixed = None if p is None else check_acceptance(p).copy()
    if max_depth is not None:
        max_depth = check_count(max_depth, "max_depth")

    def p_of(batch: PoolBatch) -> np.ndarray:
        return fitted_p(batch) if fixed is None else fixed

    def scores(batch: PoolBatch) -> np.ndarray:
        return positional_logvalue(batch, p_of(batch), max_depth)

    def shape(batch: PoolBatch, budget: int) -> np.ndarray:
        return shape_of_pools(batch, p_of(batch), budget, max_depth)

    source = "a fixed acceptance vector" if fixed is not None else "an acceptance vector " \
        "fitted on row logs"
    return Rule(name, f"Sequoia's optimal tree shape for {source}, filled from the pool "
                "(prior art)", scores, baselines=("draft_rank",), paper=False,
                learned=fixed is None, prior_art=True, shape=shape)


def acceptance_vector(batch: PoolBatch, reach, max_rank: int, at: str = "root") -> np.ndarray:
    """p[k - 1], k = 1..max_rank, from logged pools and each node's reach probability (the row
    scorer's: greedy, 1 on the path the target's own continuation takes; sampling, the product
    of the target's edge probabilities). ``at="root"`` (Sequoia's estimate, measured on one
    level below the root): the mean over pools of the reach of the root's rank-k child.
    ``"expanded"``: every pool node with children counts, weighted by its reach (more data, but
    only the nodes EAGLE-2 chose to expand)."""
    max_rank = check_count(max_rank, "max_rank")
    reach = np.asarray(reach, dtype=np.float64)
    valid = batch.tokens >= 0
    ranks = sibling_ranks(batch.parents, batch.logq, valid)
    child = valid & (batch.parents >= 0) & (ranks <= max_rank)
    if at == "root":
        child &= batch.parents == 0
        total = float(len(reach))
    elif at == "expanded":
        below = valid & (batch.parents >= 0)
        rows = np.broadcast_to(np.arange(len(reach))[:, None], reach.shape)
        has_children = np.zeros(reach.shape, dtype=bool)
        has_children[rows[below], batch.parents[below]] = True
        total = float(reach[has_children].sum())
    else:
        raise ValueError(f"at must be 'root' or 'expanded', got {at!r}")
    counts = np.bincount(ranks[child] - 1, weights=reach[child], minlength=max_rank)
    return counts / total if total > 0 else np.zeros(max_rank)
