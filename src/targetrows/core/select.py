"""Selection rules: which B nodes of the draft's candidate pool the target verifies.

Every rule returns sorted pool node indices and is ancestor-closed: a node's score never exceeds
its parent's (cumulative log-probs only go down), and ties go to the lower index, which a parent
always has. Rules at the root include the root (0); the rules after t0 (`prune_to_first`,
`first_token_subtree`) include t0's first-level node, the verified tree's root.
"""

from __future__ import annotations

import numpy as np

from .rows import check_rows
from .tree import Tree
from .verify import draw_rows


def draft_rank(pool: Tree, logq: np.ndarray, budget: int) -> np.ndarray:
    """EAGLE-2: the top-`budget` non-root nodes by cumulative draft log-prob."""
    return _top(pool, _check_logq(pool, logq), budget)


def target_rerank(pool: Tree, logq: np.ndarray, budget: int, root_row: np.ndarray) -> np.ndarray:
    """`draft_rank` with each first-level node's draft log-prob replaced by the target root row's.

    `root_row` is the target's distribution at the root (the row of the separate root pass).
    """
    root_row = check_rows(root_row, "root_row")
    if root_row.ndim != 1:
        raise ValueError(f"root_row must be one distribution [vocab], got shape {root_row.shape}")
    first = pool.children(0)
    with np.errstate(divide="ignore"):
        first_logp = np.log(root_row[pool.tokens[first]])
    return target_rerank_logp(pool, logq, budget, first_logp)


def target_rerank_logp(
    pool: Tree, logq: np.ndarray, budget: int, first_logp: np.ndarray
) -> np.ndarray:
    """`target_rerank` given the target's log-probs of the first-level tokens (in the order of
    ``pool.children(0)``): what a model backend hands over instead of a full row."""
    logq = _check_logq(pool, logq)
    first = pool.children(0)
    first_logp = np.asarray(first_logp, dtype=np.float64)
    if first_logp.shape != first.shape:
        raise ValueError(
            f"first_logp needs one value per first-level node ({len(first)}), got {first_logp.shape}"
        )
    anc = first_level_ancestor(pool)
    target_first = np.zeros(len(pool))
    target_first[first] = first_logp
    with np.errstate(invalid="ignore"):  # -inf - -inf under a first token the draft ruled out
        below_first = np.nan_to_num(logq - logq[anc], nan=-np.inf)
    return _top(pool, target_first[anc] + below_first, budget)


def first_token(root_row: np.ndarray, rng: np.random.Generator | None = None) -> int:
    """t0: the argmax of the root row (rng None, temperature 0) or a sample from it."""
    root_row = check_rows(root_row, "root_row")
    if root_row.ndim != 1:
        raise ValueError(f"root_row must be one distribution [vocab], got shape {root_row.shape}")
    return int(draw_rows(root_row[None], rng)[0])


def prune_to_first(pool: Tree, selected: np.ndarray, token: int) -> np.ndarray:
    """PEARL's step: the selected nodes under (and including) the first-level node carrying
    `token`, sorted; that node is the pruned tree's root. Empty if t0 was not selected."""
    selected = np.asarray(selected, dtype=np.int64)
    node = pool.child_with_token(0, token)
    if node < 0 or node not in selected:
        return np.zeros(0, dtype=np.int64)
    return np.intersect1d(pool.descendants(node), selected)


def first_token_subtree(pool: Tree, logq: np.ndarray, budget: int, token: int) -> np.ndarray:
    """First-token sampling's step: the first-level node carrying t0 (`token`) and the top
    `budget` nodes below it by cumulative draft log-prob, from the same pool, sorted; that node
    is the verified tree's root. Empty if t0 is not a first-level pool token.

    `prune_to_first` keeps the nodes below t0 that made the global top-B; this keeps the top-B
    below t0, in the same order (ties to the lower index), so it always contains pearl's tree."""
    logq = _check_logq(pool, logq)
    budget = _check_budget(budget)
    node = pool.child_with_token(0, token)
    if node < 0:
        return np.zeros(0, dtype=np.int64)
    below = pool.descendants(node)[1:]
    chosen = below[np.argsort(-logq[below], kind="stable")[:budget]]
    return np.sort(np.concatenate([[node], chosen]))


def pruned_tree(pool: Tree, nodes: np.ndarray, token: int) -> Tree:
    """The tree verified after t0: rooted at t0, holding `prune_to_first`'s or
    `first_token_subtree`'s nodes (just t0 when they are empty)."""
    if len(nodes) == 0:
        return Tree.root_only(token)
    local = np.concatenate([[0], nodes])
    return pool.subtree(local).reroot(1)[0]


def first_level_ancestor(pool: Tree) -> np.ndarray:
    """For every node, its ancestor at depth 1 (itself at depth 1; 0 for the root)."""
    anc = np.arange(len(pool))
    parents = pool.parents
    while True:  # one vectorised step per level
        up = parents[anc]
        move = up > 0
        if not move.any():
            return anc
        anc[move] = up[move]


def _top(pool: Tree, score: np.ndarray, budget: int) -> np.ndarray:
    budget = _check_budget(budget)
    k = min(budget, len(pool) - 1)
    # stable sort on -score: ties keep index order, so a tied parent comes before its child
    chosen = np.argsort(-score[1:], kind="stable")[:k] + 1
    chosen.sort()
    return np.concatenate([[0], chosen])


def _check_budget(budget: int) -> int:
    if isinstance(budget, bool) or int(budget) != budget or budget < 1:
        raise ValueError(f"budget must be a positive integer (non-root nodes), got {budget!r}")
    return int(budget)


def _check_logq(pool: Tree, logq: np.ndarray) -> np.ndarray:
    logq = np.asarray(logq, dtype=np.float64)
    if logq.shape != (len(pool),):
        raise ValueError(f"logq must have one value per pool node ({len(pool)}), got {logq.shape}")
    if np.any(np.isnan(logq)) or np.any(logq > 1e-9):
        raise ValueError("logq must be cumulative log-probabilities (<= 0, no NaN)")
    return logq
