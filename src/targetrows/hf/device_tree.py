"""Root-pool trees chosen on the device, so the verify pass is queued before the pool is read.

On a GPU a round of `draft_rank` (EAGLE-2) or `rerank` would read from the device twice: the
drafted pool (with the root row's log-probs at its first level, for rerank), to choose the
tree, then the verify pass's draws. While the host reads the pool and plans the verify pass,
the card idles. Here the tree is chosen where the pool is (`targetrows.hf.device_pool`), the
target is fed from device tensors, and the pool comes to the host with the draws: one read a
round, as in SGLang's EAGLE worker, whose draft tree also never leaves the card.

The tree is the pool's top-B nodes by score, ties to the lower pool index
(`targetrows.core.rules.rule.Rule.select`): the draft's cumulative log-prob (draft_rank), or
that with each first-level log-prob replaced by the root row's (target_rerank). One stable sort
of the pool's keys, a live node's its score and a dead one's -inf (`LOWEST`), so live nodes
come first. The tree's size is known without a read: min(B, the pool's nodes on the device,
dead included). A node outside the top-B of the unpruned pool is the only kind draft_rank's
pruning kills (a rerank pool is not pruned), so that many live nodes always exist. Sorted by
pool index, the chosen nodes are in the order `Tree.subtree` gives them, so the verify pass
feeds them as it would have, and its rows, draws and samples are the two-read round's, row
for row.

After the read the host builds the tree from the pool as before, runs the rule's own selection
on it and checks that the device chose the same nodes (`TreeOnDevice.read`): the NumPy rule
stays the definition, and a disagreement is an error, never a different tree.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch

from targetrows.core.tree import Tree

from .pass_builder import Feed
from .torch_rows import host_to_device

# the lowest key of a live node: one whose log-prob is -inf still comes before every dead one
LOWEST = torch.finfo(torch.float64).min


class TreeOnDevice:
    """A tree chosen on the device and not read yet: `size` nodes, the root first, in the
    order `Tree.subtree` numbers them; `tokens`, `depth` [size] and `ancestors` [size, size]
    (row i: node i and its ancestors) on the device. `read()` gives it as a `Tree` once the
    pool's read has come (waiting for it if none has)."""

    def __init__(self, size: int, tokens: torch.Tensor, depth: torch.Tensor,
                 ancestors: torch.Tensor, read: Callable[[], Tree]):
        self.size, self.tokens, self.depth, self.ancestors = size, tokens, depth, ancestors
        self.read = read

    def feed(self, feed: Feed, root_position: int, device: torch.device) -> Feed:
        """`feed`, planned by `HFSequence` for a stand-in of `size` nodes fed after the uncached
        tail (all of them, or all but a committed root), with this tree's tokens, positions
        and what each fed token sees (the tail causally; a node, the tail and its ancestors,
        a committed root among the prefix) made on `device`."""
        m, q = len(feed.tail), len(feed.ids)
        first = self.size - len(feed.query)  # 1: the root is committed, not fed
        if feed.base != feed.start or not np.array_equal(feed.query,
                                                         np.arange(first, self.size)):
            raise RuntimeError("a tree chosen on the device is fed right after the committed "
                               "prefix, each node once: its caller planned otherwise (a bug)")
        ids, positions = (t[first:].to(device) for t in (self.tokens, self.depth))
        seen = self.ancestors[first:, first:].to(device)
        positions = positions + root_position
        if m:
            ids = torch.cat([host_to_device(feed.tail, device), ids])
            positions = torch.cat([host_to_device(feed.positions[:m], device), positions])
            rows, seen = seen, torch.zeros((q, q), dtype=torch.bool, device=device)
            seen[:m, :m] = torch.ones((m, m), dtype=torch.bool, device=device).tril_()
            seen[m:, :m].fill_(True)
            seen[m:, m:] = rows
        return replace(feed, ids=ids, positions=positions, seen=seen)


def choose_on_device(levels, root_token: int, budget: int, read_later,
                     pool_read: Callable[[], tuple[Tree, np.ndarray, np.ndarray]],
                     select: Callable[..., np.ndarray],
                     rescore: Callable[[torch.Tensor], torch.Tensor] | None = None
                     ) -> TreeOnDevice:
    """The tree of `budget` nodes a root-pool rule chooses, from a pool still on the device
    (one root): its `levels` (`device_pool._Level`: each level's fed frontier, its
    `select`ed places in the level before and whether `kept`, and its children's `tokens`
    and `logq` [1, F, k]). By the draft's log-probs (draft_rank), or with each first-level
    log-prob replaced by `rescore(tokens)` [1, k], a target row's at the first level's tokens
    (target_rerank). `read_later(tensors, use)` queues the read of the chosen places (and the
    rescored log-probs) with the pool's and returns a function that waits for it;
    `pool_read()` gives the read pool (tree, logq, and each device node's pool index, -1 for
    a dead one); ``select(tree, logq[, first_logp])`` is the rule's own selection, which the
    device's must equal.

    The pool is taken flat, the root at place 0 and each level's children after it; what
    depends only on its shape (each place's frontier node and depth, each frontier node's
    first place in the level before) comes in one copy from the host, with the root's token."""
    device = levels[0].tokens.device
    root, to_front, offset, depth_at = _structure([lv.tokens.shape[1:] for lv in levels],
                                                  root_token, device)
    tokens = torch.cat([root, *(lv.tokens.reshape(-1) for lv in levels)])
    front_place = torch.cat([lv.select.reshape(-1) for lv in levels]) + offset
    alive = torch.cat([lv.kept.reshape(-1) for lv in levels])[to_front[1:]]
    logq = torch.cat([lv.logq.reshape(-1) for lv in levels])
    reads = []
    if rescore is not None:
        first_logp = rescore(levels[0].tokens.reshape(1, -1))
        logq = _rescored(logq, first_logp.reshape(-1), front_place[to_front], depth_at,
                         len(levels))
        reads.append(first_logp)
    chosen, parent = _top_nodes(alive, logq, front_place[to_front], depth_at[:1], budget)
    size = len(chosen) - 1
    # a node's ancestor row is its own entry and its parent's row: one level a step
    eye = torch.eye(size + 1, dtype=torch.bool, device=device)
    ancestors = eye
    for _ in levels:
        ancestors = eye | ancestors[parent]
    got = []
    wait = read_later([chosen, *reads], got.extend)

    def read() -> Tree:
        pool, logq, places = pool_read()
        wait()
        nodes = np.concatenate([[0], places[got[0][1:] - 1]])
        want = select(pool, logq, *(values.reshape(-1) for values in got[1:]))
        if not np.array_equal(nodes, want):
            raise RuntimeError(
                f"the tree chosen on the device (pool nodes {nodes.tolist()}) is not the rule's "
                f"({want.tolist()}): a bug in targetrows.hf.device_tree; please report it with "
                "the decoder, its settings and the models")
        return pool.subtree(want)

    return TreeOnDevice(size + 1, tokens[chosen], depth_at[chosen], ancestors, read)


def _top_nodes(alive: torch.Tensor, logq: torch.Tensor, parent_place: torch.Tensor,
               root: torch.Tensor, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pool places of the root (`root`: [0]) and its top `budget` children in the rule's
    order (a dead node after every live one; ties to the lower place: a stable sort), in pool
    order; and each chosen node's parent among them (the root's: itself)."""
    size = min(budget, len(logq))
    keys = torch.where(alive, logq.clamp(min=LOWEST), -math.inf)
    top = torch.sort(keys, descending=True, stable=True).indices[:size] + 1
    chosen = torch.cat([root, torch.sort(top).values])
    node_of = torch.zeros(len(logq) + 1, dtype=torch.int64, device=logq.device)
    node_of[chosen] = torch.arange(size + 1, device=logq.device)
    return chosen, node_of[parent_place[chosen]]


def _rescored(logq: torch.Tensor, first_logp: torch.Tensor, parent_place: torch.Tensor,
              depth: torch.Tensor, n_levels: int) -> torch.Tensor:
    """Each child's cumulative log-prob with its first-level ancestor's replaced by
    `first_logp` (one per first-level place), as `targetrows.core.rules.batch.PoolBatch
    .rescored_first` computes it: the first level's value plus the draft's log-prob below it
    (-inf where that is -inf minus -inf)."""
    # each place's first-level ancestor (the root's: the root), by pointer doubling
    up = torch.where(depth <= 1, torch.arange(len(depth), device=depth.device), parent_place)
    for _ in range(n_levels.bit_length()):
        up = up[up]
    full = torch.cat([torch.zeros(1, dtype=logq.dtype, device=logq.device), logq])
    below = full - full[up]
    below = torch.where(below.isnan(), -math.inf, below)
    return (first_logp[(up - 1).clamp(min=0)] + below)[1:]


def _structure(shapes: list[tuple[int, int]], root_token: int, device
               ) -> tuple[torch.Tensor, ...]:
    """What a flat pool of levels shaped (F, k) holds where, sent to `device` in one copy with
    the root's token: (the token; `to_front`, the frontier node each place is a child of (the
    root's own: the root, frontier node 0); `offset`, the first place of the level each
    frontier node's `select` counts in (the root's: 0); `depth`, each place's)."""
    fronts = np.cumsum([0] + [f for f, _ in shapes])
    sizes = [f * k for f, k in shapes]
    starts = np.cumsum([1] + sizes)  # each level's first place
    to_front = np.concatenate([[0]] + [fronts[i] + np.arange(f * k) // k
                                       for i, (f, k) in enumerate(shapes)])
    offset = np.concatenate([np.full(f, 0 if i == 0 else starts[i - 1])
                             for i, (f, _) in enumerate(shapes)])
    depth = np.concatenate([[0]] + [np.full(n, i + 1) for i, n in enumerate(sizes)])
    block = host_to_device(np.concatenate([[root_token], to_front, offset, depth])
                           .astype(np.int64), device)
    n, f = len(to_front), len(offset)
    return block[:1], block[1: 1 + n], block[1 + n: 1 + n + f], block[1 + n + f:]
