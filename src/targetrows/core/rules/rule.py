"""A selection rule: which nodes of the draft's candidate pool the target verifies.

A rule is a score per pool node plus the kind of tree it builds from those scores (`tree`):

    pool      the top-B non-root nodes of the root pool by score;
    pruned    the top-B nodes of the root pool, then cut to the subtree of t0, the first token
              drawn from the target's exact root row and committed (PEARL);
    below_t0  the top-B nodes below t0's first-level node of the root pool (first-token
              sampling: t0's node becomes the verified tree's root);
    redraft   t0 as above, then the top-B nodes of a pool drafted anew under t0.

Scores never rise from a node to its child and ties go to the lower index (which a parent
always has), so every top-B selection is ancestor-closed. From the scores and the kind come
both what a decoder needs online, one pool at a time (`Rule.select`), and what the row-log
scorer and the cost model need, many pools at once (`Rule.expected`: expected accepted draft
tokens and nodes verified at every budget). Nothing else in the package knows what a rule
does; `targetrows.decoding.registry` names the rules and the decoders that run them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..checks import check_budget
from ..rows import check_rows
from ..tree import Tree
from ..verify import draw_rows
from .batch import PoolBatch, gather, top_order

TREES = ("pool", "pruned", "below_t0", "redraft")
ROWS = ("root_row", "stale_row")  # rows a rule's scores may read besides the draft's


def draft_scores(batch: PoolBatch) -> np.ndarray:
    """The draft's own cumulative log-probs: EAGLE-2's ranking."""
    return batch.logq


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    scores: Callable[[PoolBatch], np.ndarray]  # [P, N] per node, higher is better
    tree: str = "pool"  # see the module docstring
    reads: tuple[str, ...] = ()  # rows the scores read (ROWS); a pool without one still scores
    baselines: tuple[str, ...] = ()  # the rules the tables compare it with (paired gains)
    paper: bool = True  # one of the paper's rules (an extension says False)
    learned: bool = False  # scores with a trained model (`DecodeConfig.reranker`)
    prior_art: bool = False  # a published method the tables compare ours with
    # a rule whose tree is a fixed shape rather than the top B by score (Sequoia's):
    # shape(batch, budget) -> [P, N] bool, each pool's root included, ancestor-closed; a shape
    # node the pool lacks is simply absent, so the tree can be smaller than B, and the shapes
    # of two budgets need not be nested (so `expected` asks for each budget's)
    shape: Callable[[PoolBatch, int], np.ndarray] | None = None

    def __post_init__(self):
        if self.tree not in TREES:
            raise ValueError(f"rule {self.name!r}: tree must be one of {TREES}, got {self.tree!r}")
        unknown = set(self.reads) - set(ROWS)
        if unknown:
            raise ValueError(f"rule {self.name!r}: reads {sorted(unknown)}; rows are {ROWS}")
        if self.tree == "redraft" and self.reads:
            raise ValueError(f"rule {self.name!r}: a redraft's pool is drafted under t0, where "
                             "no target row is known yet; it can read none")
        if self.shape is not None and self.tree != "pool":
            raise ValueError(f"rule {self.name!r}: a shape rule builds a root-pool tree "
                             f"(tree 'pool'), not {self.tree!r}")

    @property
    def commits_t0(self) -> bool:
        """t0 is drawn from the exact root row and committed before the tree."""
        return self.tree != "pool"

    @property
    def needs_root_pass(self) -> bool:
        """The separate root pass must run: for t0, or for the exact root row the scores read."""
        return self.commits_t0 or "root_row" in self.reads

    @property
    def draft_ranked(self) -> bool:
        """The tree is the pool's top-B nodes by the draft's own scores (before any cut to t0),
        so the pool needs only the nodes that can still enter it
        (`targetrows.core.pool.grow`)."""
        return self.scores is draft_scores and self.tree in ("pool", "pruned")

    # -- one pool, online -----------------------------------------------------------------------

    def select(self, pool: Tree, logq: np.ndarray, budget: int, *, root_logp=None,
               stale_logp=None, t0: int | None = None, reranker=None) -> np.ndarray:
        """Sorted node indices of `pool` that the verified tree holds: the root and the top
        `budget` nodes for a root-pool tree (`pool`, or the pool drafted under t0 for
        `redraft`); t0's first-level node and the nodes kept below it after t0 (empty when t0
        is not a first-level pool token). `root_logp` / `stale_logp`: the rows' log-probs of
        the first-level tokens, in the order of ``pool.children(0)``; `reranker`: a learned
        rule's model."""
        budget = check_budget(budget)
        logq = _check_logq(pool, logq)
        batch = PoolBatch.of_pool(pool, logq, root_logp, stale_logp, reranker)
        if self.shape is not None:
            return np.flatnonzero(self._shape(batch, budget)[0])
        score = self._scores(batch)[0]
        if self.tree in ("pool", "redraft"):
            return _top_nodes(score, budget)
        if t0 is None:
            raise ValueError(f"rule {self.name!r} cuts its tree to t0: give t0")
        node = pool.child_with_token(0, t0)
        if node < 0:
            return np.zeros(0, dtype=np.int64)
        inside = pool.descendants(node)
        if self.tree == "pruned":  # the global top-B, cut to t0's subtree
            return np.intersect1d(inside, _top_nodes(score, budget))
        below = inside[1:]  # below_t0: the top-B of t0's subtree, in the same order
        chosen = below[np.argsort(-score[below], kind="stable")[:budget]]
        return np.sort(np.concatenate([[node], chosen]))

    # -- many pools, offline --------------------------------------------------------------------

    def expected(self, batch: PoolBatch, reach: np.ndarray, budgets: Sequence[int],
                 t0: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(expected accepted draft tokens, non-root nodes verified), each [P, len(budgets)].

        `reach` [P, N]: the probability that verification reaches each node of the pool. For a
        rule after t0, `t0` [P, N] is the probability that t0 is each first-level node's token
        (one-hot at a recorded draw, or the root row's own probabilities); a tree after t0
        counts what is accepted below it and averages over t0. A `redraft` rule is scored on
        the pools it is given as a root-pool rule: pass it the pools drafted under t0."""
        budgets = np.asarray(budgets, dtype=np.int64)
        if self.shape is not None:  # one shape per budget: they need not be nested
            masks = [self._shape(batch, int(b))[:, 1:] for b in budgets]
            return (np.stack([(reach[:, 1:] * m).sum(axis=1) for m in masks], axis=1),
                    np.stack([m.sum(axis=1) for m in masks], axis=1).astype(np.float64))
        _, n = batch.shape
        k = min(int(budgets.max()), n - 1)
        col = np.minimum(budgets, k) - 1
        score = self._scores(batch)
        if self.tree in ("pool", "redraft"):
            return pool_expected(score, reach, batch.size, budgets)
        if t0 is None:
            raise ValueError(f"rule {self.name!r} scores a tree after t0: give t0's "
                             "distribution over the first-level nodes")
        return self._after_t0(batch, score, reach, t0, k, col)

    def _scores(self, batch: PoolBatch) -> np.ndarray:
        """The rule's scores, checked: a child never above its parent, so that every top-B
        selection is ancestor-closed (a rule that breaks this is refused by name)."""
        score = np.asarray(self.scores(batch), dtype=np.float64)
        if score.shape != batch.shape:
            raise ValueError(f"rule {self.name!r}: scores have shape {score.shape}, the pools "
                             f"{batch.shape}")
        child = batch.parents > 0
        above = np.take_along_axis(score, np.maximum(batch.parents, 0), 1)
        if np.any(child & (score > above)):
            raise ValueError(f"rule {self.name!r}: a node scores above its parent, so a top-B "
                             "selection would not be ancestor-closed; scores must not rise "
                             "from a node to its children")
        return score

    def _shape(self, batch: PoolBatch, budget: int) -> np.ndarray:
        """The rule's shape at `budget`, checked: each pool's root, ancestor-closed, no
        padding, at most `budget` non-root nodes (a shape that breaks this is refused)."""
        mask = np.asarray(self.shape(batch, check_budget(budget)), dtype=bool)
        if mask.shape != batch.shape:
            raise ValueError(f"rule {self.name!r}: a shape of {mask.shape} for pools of "
                             f"{batch.shape}")
        kept_parent = np.take_along_axis(mask, np.maximum(batch.parents, 0), 1)
        if (not mask[:, 0].all() or np.any(mask & ~kept_parent) or np.any(mask & (batch.tokens < 0))
                or np.any(mask[:, 1:].sum(axis=1) > budget)):
            raise ValueError(f"rule {self.name!r}: a shape must hold each pool's root and at "
                             f"most {budget} pool nodes, every one with its parent")
        return mask

    def _after_t0(self, batch, score, reach, t0, k, col):
        p, n = batch.shape
        weight = np.where(batch.is_first, np.asarray(t0, dtype=np.float64), 0.0)
        branches = int((weight > 0).sum(axis=1).max(initial=0))
        by_weight = np.argsort(-weight, axis=1, kind="stable")[:, :branches]
        accepted, nodes = np.zeros((p, len(col))), np.zeros((p, len(col)))
        order = top_order(score[:, 1:], k) + 1 if self.tree == "pruned" else None
        rows = np.arange(p)
        for j in range(branches):  # the j-th likeliest t0 of every pool at once
            w = weight[rows, by_weight[:, j]]
            t0_node = np.where(w > 0, by_weight[:, j], -1)[:, None]
            below = (batch.first == t0_node) & (np.arange(n) != t0_node)
            # reached from t0's node: reach / reach(t0's node), which t0, a draw of the
            # target's own, reaches with probability > 0 (1 at temperature 0)
            from_t0 = np.take_along_axis(reach, np.maximum(t0_node, 0), 1)
            with np.errstate(divide="ignore", invalid="ignore"):
                gained = np.nan_to_num(np.where(below, reach / from_t0, 0.0))
            if self.tree == "below_t0":  # the top-B below t0: the same order, others last
                order = top_order(np.where(below, score, -np.inf)[:, 1:], k) + 1
            kept = gather(below, order)
            accepted += w[:, None] * np.cumsum(gather(gained, order), axis=1)[:, col]
            nodes += w[:, None] * np.cumsum(kept, axis=1)[:, col]
        return accepted, nodes


def pool_expected(score: np.ndarray, reach: np.ndarray, size: np.ndarray,
                  budgets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(expected accepted, nodes verified) [P, len(budgets)] of the top-B nodes of each pool
    by `score` (a root-pool tree): one ordering, one cumulative sum for every budget."""
    budgets = np.asarray(budgets, dtype=np.int64)
    k = min(int(budgets.max()), score.shape[1] - 1)
    col = np.minimum(budgets, k) - 1
    order = top_order(score[:, 1:], k) + 1
    accepted = np.cumsum(gather(reach, order), axis=1)[:, col]
    nodes = np.minimum(budgets[None, :], np.asarray(size)[:, None] - 1).astype(np.float64)
    return accepted, nodes


def draw_first_token(root_row: np.ndarray, rng: np.random.Generator | None = None) -> int:
    """t0: the argmax of the root row (rng None, temperature 0) or a sample from it."""
    root_row = check_rows(root_row, "root_row")
    if root_row.ndim != 1:
        raise ValueError(f"root_row must be one distribution [vocab], got shape {root_row.shape}")
    return int(draw_rows(root_row[None], rng)[0])


def first_level_logp(pool: Tree, row: np.ndarray, name: str = "root_row") -> np.ndarray:
    """Log-probs of the pool's first-level tokens under a full distribution `row`, in the order
    of ``pool.children(0)`` (what `Rule.select` takes as root_logp or stale_logp)."""
    row = check_rows(row, name)
    if row.ndim != 1:
        raise ValueError(f"{name} must be one distribution [vocab], got shape {row.shape}")
    with np.errstate(divide="ignore"):
        return np.log(row[pool.tokens[pool.children(0)]])


def tree_after_t0(pool: Tree, nodes: np.ndarray, t0: int) -> Tree:
    """The tree verified after t0: rooted at t0, holding a rule's nodes after t0 (just t0 when
    there are none)."""
    if len(nodes) == 0:
        return Tree.root_only(t0)
    local = np.concatenate([[0], nodes])
    return pool.subtree(local).reroot(1)[0]


def _top_nodes(score: np.ndarray, budget: int) -> np.ndarray:
    k = min(budget, len(score) - 1)
    # stable sort on -score: ties keep index order, so a tied parent comes before its child
    chosen = np.argsort(-score[1:], kind="stable")[:k] + 1
    chosen.sort()
    return np.concatenate([[0], chosen])


def _check_logq(pool: Tree, logq: np.ndarray) -> np.ndarray:
    logq = np.asarray(logq, dtype=np.float64)
    if logq.shape != (len(pool),):
        raise ValueError(f"logq must have one value per pool node ({len(pool)}), got {logq.shape}")
    if np.any(np.isnan(logq)) or np.any(logq > 1e-9):
        raise ValueError("logq must be cumulative log-probabilities (<= 0, no NaN)")
    return logq
