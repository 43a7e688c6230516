"""What one pass of an `HFModel` feeds, and what each fed token may attend to.

The cache holds a committed prefix, then the entries of this round's tree nodes fed so far
(`targetrows.hf.fed_tree` keeps which: each node's slot, -1 if unfed, and its ancestors). A
pass feeds the uncached tail of the context as a chain, then the nodes asked for and their
unfed ancestors, each once; a row asked for again is fed once more and left dead. A tail token
sees the prefix and the tail before it; a tree node sees the prefix, the tail, and the entries
of its ancestors and itself. This module plans the feed (`plan_feed`), says what each token
sees past the prefix (`region`) and turns that into the pass's 4D additive mask (`tree_mask`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from targetrows.core.tree import Tree

from .torch_rows import on_device


@dataclass(frozen=True)
class Feed:
    """One pass's input: the committed tail and the tree nodes it feeds, where they go."""

    start: int  # the first cache entry that is not committed prefix
    base: int  # the cache's length before the pass
    tail: np.ndarray  # uncached committed tokens before the root, fed as a chain
    query: np.ndarray  # tree nodes fed, in order (new ones, then rows asked for again)
    ids: np.ndarray  # tokens fed: the tail, then the query nodes'
    positions: np.ndarray  # their sequence positions
    keep: np.ndarray  # the pass's row of each requested node
    # a level of a pool grown on the device (`targetrows.hf.device_pool`): `ids` is a tensor
    # there, and this is what `region` would say (`HFModel._region` reads it), made there too
    seen: torch.Tensor | None = None


def plan_feed(start: int, base: int, slot: np.ndarray, anc: np.ndarray, ctx: np.ndarray,
              tree: Tree, nodes: np.ndarray) -> Feed:
    """The pass for rows at `nodes` of `tree` under `ctx`, with `start` committed entries and
    `base` entries cached: the uncached tail, then the requested nodes and their unfed
    ancestors (their slots recorded in `slot`), then rows asked for again."""
    n_ctx = len(ctx)
    tail = ctx[start: n_ctx - 1]  # uncached committed tokens before the root
    fed = slot >= 0
    new = np.flatnonzero(anc[nodes].any(axis=0) & ~fed)  # requested + unfed ancestors
    again = np.unique(nodes[fed[nodes]])
    m = len(tail)
    slot[new] = base + m + np.arange(len(new))
    query = np.concatenate([new, again])
    row_of = np.full(len(tree), -1, dtype=np.int64)
    row_of[query] = m + np.arange(len(query))
    return Feed(start, base, tail, query,
                ids=np.concatenate([tail, tree.tokens[query]]),
                positions=np.concatenate([start + np.arange(m), n_ctx - 1 + tree.depth[query]]),
                keep=row_of[nodes])


def region(feed: Feed, slot: np.ndarray, anc: np.ndarray) -> np.ndarray:
    """Which cache entries from `feed.start` on each fed token sees [q, base + q - start]
    (everything before is committed prefix, which every query sees). Tail rows: causal. Tree
    rows: the tail and the entries of the node and its ancestors (the root's is in the prefix
    when it was committed). A feed that brings its own (`Feed.seen`) is not planned here."""
    start, base, m, query = feed.start, feed.base, len(feed.tail), feed.query
    q = m + len(query)
    out = np.zeros((q, base + q - start), dtype=bool)
    out[:m, :m] = np.tril(np.ones((m, m), dtype=bool))
    out[m:, :m] = True
    in_region = slot >= start
    out[m:, slot[in_region] - start] = anc[query][:, in_region]
    return out


def seen_by(nodes: np.ndarray, start: int, entries: int, slot: np.ndarray,
            anc: np.ndarray) -> np.ndarray:
    """[len(nodes), entries]: the cache entries each fed node sees, itself included."""
    seen = np.zeros((len(nodes), entries), dtype=bool)
    seen[:, :start] = True  # the committed prefix (a committed root's entry among them)
    in_region = slot >= start
    seen[:, slot[in_region]] = anc[nodes][:, in_region]
    return seen


def tree_mask(feed: Feed, seen: np.ndarray | torch.Tensor, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor | None:
    """The pass's 4D additive mask over the cache entries, from what each token sees past the
    prefix (`region`). None for a plain causal chain after the prefix (a prompt's first pass,
    ar's step): Hugging Face's own causal pass, the one its generate() runs (the same kernels
    and numbers; a one-token step without a mask is also a little faster)."""
    start, base, q = feed.start, feed.base, len(seen)
    if feed.seen is None and base == start and np.array_equal(seen, np.tri(q, dtype=bool)):
        return None
    mask = torch.zeros((1, 1, q, base + q), dtype=dtype, device=device)
    mask[0, 0, :, start:].masked_fill_(~on_device(seen, device), torch.finfo(dtype).min)
    return mask
