"""The draft's candidate pool (EAGLE-2 style), from which every selection rule picks its tree.

Level 1 holds the draft's top_k tokens at the root. Then, ``depth - 1`` times, the top_k nodes
of the last level by cumulative draft log-prob each propose their own top_k children, and all
top_k**2 children enter the pool: ``top_k + (depth - 1) * top_k**2`` nodes in all (510 for 10, 6).
Nodes are numbered level by level, so a pool is a valid `Tree` and grows by appending.

A pool drafted for a draft_rank tree of B nodes (`budget`) expands only the frontier nodes that
can still have a descendant in it: a child ranks below its parent (its cumulative log-prob is no
higher and its index is larger), so a node with B - 1 or more nodes ranked above it cannot. The
draft_rank tree of such a pool is the full pool's (a test checks it against brute force); on
the embedded pair at B=2 the second level's pass feeds one node instead of top_k.

`grow` picks each level's frontier on the host, so it reads the draft's top-k back once per
level. A torch draft grows the same pool on the device instead and reads it once
(`grows_on_device`; `targetrows.hf.device_pool`), where the pruned nodes are fed anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .checks import check_count
from .passes import Passes, no_passes, run_now
from .tree import Tree

# propose(tokens, parents, nodes) -> (child tokens [len(nodes), k], child log-probs [len(nodes), k]),
# as steps that may ask for a draft pass (`targetrows.core.passes`)
Propose = Callable[[np.ndarray, np.ndarray, np.ndarray], Passes[tuple[np.ndarray, np.ndarray]]]


@dataclass(frozen=True)
class PoolShape:
    """The candidate pool every decoder and recording drafts: `top_k` children per frontier
    node, `depth` levels; `guesses`: the likeliest first tokens a redrafting decoder
    pre-expands pools under while the root pass runs."""

    top_k: int = 10
    depth: int = 6
    guesses: int = 2

    def __post_init__(self):
        for name in ("top_k", "depth", "guesses"):
            check_count(getattr(self, name), name)

    @property
    def size(self) -> int:
        """Non-root nodes of the full pool."""
        return pool_size(self.top_k, self.depth)


def pool_size(top_k: int, depth: int) -> int:
    return top_k + (depth - 1) * top_k * top_k


def pool_depth(depth: int, budget: int, below_first: bool = False) -> int:
    """Pool levels worth drafting for a tree of `budget` non-root nodes: every rule picks an
    ancestor-closed set, at most `budget` deep, so deeper levels could never be chosen; a tree
    hanging from a first-level node (`below_first`: first-token sampling's) reaches one deeper."""
    return min(depth, budget + 1 if below_first else budget)


def topk_tokens(logp: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k tokens of each row, best first, ties to the lower token id."""
    logp = np.atleast_2d(logp)
    k = min(k, logp.shape[-1])
    if logp.shape[-1] > 4 * k:  # large vocabularies: partition first, then order the few
        part = np.argpartition(-logp, k - 1, axis=-1)[:, :k]
        part.sort(axis=-1)  # lower ids first, so the stable sort breaks ties towards them
        order = np.argsort(-np.take_along_axis(logp, part, -1), axis=-1, kind="stable")
        tokens = np.take_along_axis(part, order, -1)
    else:
        tokens = np.argsort(-logp, axis=-1, kind="stable")[:, :k]
    return tokens, np.take_along_axis(logp, tokens, -1)


def grow(
    propose: Propose,
    tokens: list[int],
    parents: list[int],
    logq: list[float],
    roots: Sequence[int],
    top_k: int,
    depth: int,
    budget: int | None = None,
) -> Passes[None]:
    """Expand a pool of `depth` levels under each of `roots`, in place, every level of every root
    in one `propose` call (one draft pass per level). With `budget` (one root only), expand only
    the nodes that can still enter the pool's draft_rank tree of that many nodes; the pool may
    then stop early (no node can)."""
    if budget is not None and len(roots) != 1:
        raise ValueError("a budget-pruned pool grows under one root")
    levels = [[r] for r in roots]  # each root's last level
    for level in range(depth):
        # each root's frontier: its last level's top_k by cumulative log-prob (ties: lower index)
        frontier = []
        for last in levels:
            if level == 0:
                frontier.append(np.array(last))
            else:
                lq = np.array([logq[i] for i in last])
                best = np.array(last)[np.argsort(-lq, kind="stable")[:top_k]]
                if budget is not None:
                    best = best[_rank(logq)[best] < budget - 1]
                frontier.append(best)
        nodes = np.concatenate(frontier)
        if len(nodes) == 0:
            return
        child_tok, child_lp = yield from propose(np.array(tokens), np.array(parents), nodes)
        levels = []
        row = 0
        for f in frontier:
            new = []
            for node in f:
                for tok, lp in zip(child_tok[row].tolist(), child_lp[row].tolist(), strict=True):
                    new.append(len(tokens))
                    tokens.append(tok)
                    parents.append(int(node))
                    logq.append(logq[node] + lp)
                row += 1
            levels.append(new)


def expand(
    draft_row_fn: Callable[[list[int]], np.ndarray],
    root_context: Sequence[int],
    top_k: int,
    depth: int,
) -> tuple[Tree, np.ndarray]:
    """The candidate pool from a draft given as ``draft_row_fn(context) -> probabilities``.

    Returns the pool as a `Tree` (root token ``root_context[-1]``) and each node's cumulative
    draft log-prob ``logq`` (0 at the root).
    """
    _check_shape(top_k, depth)
    root_context = [int(t) for t in root_context]
    if not root_context:
        raise ValueError("root_context is empty: the root needs at least one committed token")

    def propose(tokens, parents, nodes):
        rows = []
        for node in nodes.tolist():
            path = []
            while node > 0:
                path.append(int(tokens[node]))
                node = int(parents[node])
            with np.errstate(divide="ignore"):
                rows.append(np.log(np.asarray(draft_row_fn(root_context + path[::-1]), float)))
        return no_passes(topk_tokens(np.stack(rows), top_k))

    tokens, parents, logq = [root_context[-1]], [-1], [0.0]
    run_now(grow(propose, tokens, parents, logq, [0], top_k, depth))
    return Tree(tokens, parents), np.array(logq)


def expand_model(model: Any, context: Sequence[int], top_k: int, depth: int,
                 budget: int | None = None) -> tuple[Tree, np.ndarray]:
    """The candidate pool from a `targetrows.decoding.model.Model`: one draft pass per level. With
    `budget`, only as much of it as a draft_rank tree of `budget` nodes can use (`grow`)."""
    return run_now(pool_passes(model, context, top_k, depth, budget))


def pool_passes(model: Any, context: Sequence[int], top_k: int, depth: int,
                budget: int | None = None) -> Passes[tuple[Tree, np.ndarray]]:
    """`expand_model` as steps that ask for the draft's passes (`targetrows.core.passes`)."""
    read = yield from pool_passes_read_later(model, context, top_k, depth, budget)
    return read()


def pool_passes_read_later(model: Any, context: Sequence[int], top_k: int, depth: int,
                           budget: int | None = None) -> Passes[PoolRead]:
    """`pool_passes`, returning a function that gives the pool (`PoolRead`): a pool grown on
    a GPU is read with the device's next read, whichever model makes it (the draw of t0 from
    the root pass: one wait for both), or when the function is called, whichever comes
    first."""
    _check_shape(top_k, depth)
    tokens, parents, logq = [int(context[-1])], [-1], [0.0]
    wait = yield from grow_model(model, context, tokens, parents, logq, [0], top_k, depth,
                                 budget, later=True)
    return PoolRead(wait, tokens, parents, logq)


class PoolRead:
    """A drafted pool that calling gives, as (tree, logq): read then, if no read on its device
    has brought it yet. `first_level`: for a pool still on a device, the tokens of the root's
    children there [1, k], in pool order (what a read that should come with the pool's needs:
    `targetrows.hf.torch_rows.TorchRows.logprobs_read_later`); None otherwise. A device's
    pool comes with its `tree` built already (`targetrows.hf.device_pool`). `choose`: for a
    pool still on a device under one root, ``choose(budget, select, rescore)`` chooses a
    root-pool rule's tree there (`targetrows.hf.device_tree`); None otherwise."""

    def __init__(self, wait: Callable[[], None], tokens: list[int], parents: list[int],
                 logq: list[float]):
        self._wait, self._lists = wait, (tokens, parents, logq)
        self.first_level = getattr(wait, "first_level", None)
        self.choose = getattr(wait, "choose", None)

    def __call__(self) -> tuple[Tree, np.ndarray]:
        self._wait()  # the lists are filled once the read that carries them is done
        tokens, parents, logq = self._lists
        tree = getattr(self._wait, "tree", None)
        if tree is None or len(tree) != len(tokens):
            tree = Tree(tokens, parents)
        return tree, np.array(logq)


def grow_model(model: Any, context: Sequence[int], tokens: list[int], parents: list[int],
               logq: list[float], roots: Sequence[int], top_k: int, depth: int,
               budget: int | None = None, later: bool = False) -> Passes[Callable[[], None]]:
    """`grow` with `model`'s proposals: on the device, read once, where the model grows pools
    there (``model.grow_passes``, a torch backend's: `grows_on_device`), else level by level
    (`grow_on_host`). The same pool either way. Returns a function to call before reading
    the lists: with `later` a device's read may wait for the device's next read."""
    if grows_on_device(model):
        return (yield from model.grow_passes(context, tokens, parents, logq, roots, top_k, depth,
                                             budget, later=later))
    yield from grow_on_host(model, context, tokens, parents, logq, roots, top_k, depth, budget)
    return _filled


def _filled() -> None:
    """Lists filled already: nothing to wait for."""


def grow_on_host(model: Any, context: Sequence[int], tokens: list[int], parents: list[int],
                 logq: list[float], roots: Sequence[int], top_k: int, depth: int,
                 budget: int | None = None) -> Passes[None]:
    """`grow` with `model`'s top-k at each level's frontier (`Model.topk_at`): one read per
    level."""
    return (yield from grow(_model_propose(model, context, top_k), tokens, parents, logq, roots,
                            top_k, depth, budget))


def grows_on_device(model: Any) -> bool:
    """Whether `model` grows its pools on the device (`targetrows.hf.device_pool`)."""
    return getattr(model, "grow_passes", None) is not None


def drafts_full_depth(model: Any) -> bool:
    """Whether `model` drafts every pool to its full depth: one grown on a GPU, where nothing
    is read to tell it to stop, runs the passes a budget-pruned pool that `grow` ends early (no
    frontier node can enter the tree) would skip. On the CPU it stops as `grow` does."""
    return grows_on_device(model) and getattr(model.device, "type", "cpu") != "cpu"


def expand_under_guesses(
    model: Any, context: Sequence[int], guesses: int, top_k: int, depth: int
) -> tuple[Tree, np.ndarray]:
    """`guessed_pools_passes` run at once."""
    return run_now(guessed_pools_passes(model, context, guesses, top_k, depth))


def guessed_pools_passes(
    model: Any, context: Sequence[int], guesses: int, top_k: int, depth: int
) -> Passes[tuple[Tree, np.ndarray]]:
    """Pools under the draft's `guesses` most likely next tokens, expanded together.

    First-token sampling commits t0 before drafting; while the target's root pass runs, the
    draft pre-expands a pool under each likely t0 (one pass per level for all of them), so a hit
    costs no extra draft time. The result is one tree: root, the guesses, each guess's pool.
    Use `pool_under(tree, logq, token)` to take the pool under the t0 actually sampled.
    """
    read = yield from guessed_pools_read_later(model, context, guesses, top_k, depth)
    return read()


def guessed_pools_read_later(
    model: Any, context: Sequence[int], guesses: int, top_k: int, depth: int
) -> Passes[PoolRead]:
    """`guessed_pools_passes`, returning a function that gives the pools, read as
    `pool_passes_read_later` reads them."""
    _check_shape(top_k, depth)
    tokens, parents, logq = [int(context[-1])], [-1], [0.0]
    wait = _filled
    if grows_on_device(model):
        wait = yield from model.grow_passes(context, tokens, parents, logq, [0], top_k, depth,
                                            guesses=guesses, later=True)
    else:
        yield from grow_guesses(model, context, tokens, parents, logq, guesses, top_k, depth)
    return PoolRead(wait, tokens, parents, logq)


def grow_guesses(model: Any, context: Sequence[int], tokens: list[int], parents: list[int],
                 logq: list[float], guesses: int, top_k: int, depth: int) -> Passes[None]:
    """Under the root (node 0, the only one), its `guesses` likeliest children, then a pool of
    `depth` levels under each of them, level by level on the host (`grow_on_host`)."""
    propose = _model_propose(model, context, max(top_k, guesses))
    g_tok, g_lp = yield from propose(np.array(tokens), np.array(parents), np.array([0]))
    tokens += g_tok[0, :guesses].tolist()
    parents += [0] * guesses
    logq += (logq[0] + g_lp[0, :guesses]).tolist()
    yield from grow_on_host(model, context, tokens, parents, logq, list(range(1, guesses + 1)),
                            top_k, depth)


def pool_under(tree: Tree, logq: np.ndarray, token: int) -> tuple[Tree, np.ndarray] | None:
    """The pool under the first-level node carrying `token`, re-rooted there, or None."""
    node = tree.child_with_token(0, token)
    if node < 0:
        return None
    sub, index_map = tree.reroot(node)
    return sub, logq[index_map] - logq[node]


def _rank(logq: list[float]) -> np.ndarray:
    """Each node's place among the non-root nodes in draft_rank's order (cumulative log-prob,
    ties to the lower index; the root comes first)."""
    order = np.argsort(-np.asarray(logq[1:]), kind="stable") + 1
    rank = np.empty(len(logq), dtype=np.int64)
    rank[0] = -1
    rank[order] = np.arange(len(order))
    return rank


def _model_propose(model: Any, context: Sequence[int], k: int) -> Propose:
    def propose(tokens, parents, nodes):
        return model.topk_at_passes(context, Tree(tokens, parents), nodes, k)

    return propose


def _check_shape(top_k: int, depth: int) -> None:
    check_count(top_k, "top_k")
    check_count(depth, "depth")
