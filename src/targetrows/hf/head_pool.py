"""An EAGLE-3 head's candidate pool grown on the device: the host reads it once, at the end.

`targetrows.core.pool.grow` chooses each level's frontier on the host, so it reads the draft's
top-k back after every pass: one wait for the GPU per level, during which the card idles while
Python plans the next pass. Here the same pool is grown with every level's choices made by
device operations, as EAGLE's and SGLang's drafting loops do, and read back in one copy:

- the frontier of each root's last level, its top_k nodes by cumulative log-prob, ties to the
  lower pool index: a stable sort;
- with a budget, the frontier nodes that can no longer enter the draft_rank tree are marked
  dead rather than dropped (their rank among the pool's nodes, counted on the device): the
  shapes stay fixed, so nothing waits. Dead nodes are still fed (their entries are seen by
  nobody), their children are dead, and the host leaves them out when it reads the pool;
- each fed node's mask row is its parent's row plus its own entry, its h its parent's g, its
  token's embedding gathered on the device.

The pool the host builds from the read is `grow`'s, node for node (a test checks it at every
batch size, with static steps too). The difference is in the passes: a budget-pruned pool that
`grow` would end early is drafted to its full depth here (`grows_on_device` lets the round
count those passes).
"""

from __future__ import annotations

import numpy as np
import torch

from targetrows.core.passes import Passes
from targetrows.core.tree import Tree

from .torch_rows import host_to_device, topk_sorted


def grow_on_device(draft, context, tokens: list[int], parents: list[int], logq: list[float],
                   roots, top_k: int, depth: int, budget: int | None) -> Passes[None]:
    """`targetrows.core.pool.grow` for an `Eagle3Draft`, the levels chosen on the device: the
    same lists extended in place with the same nodes, after one read."""
    if budget is not None and len(roots) != 1:
        raise ValueError("a budget-pruned pool grows under one root")
    roots = np.asarray(roots, dtype=np.int64)
    tree = Tree(tokens, parents)
    device = draft.device
    # level 0: the roots, fed as any rows are (the head feeds the committed tokens first)
    g = yield from draft._node_g(context, tree, roots)
    n_roots, k = len(roots), top_k
    rows = _rows_seen(draft, roots)  # [roots, entries]: what each root's children will see too
    positions = max(len(context) - 2, 0) + tree.depth[roots]  # each root's children's, less 1
    node_logq = torch.tensor([logq[r] for r in roots], dtype=torch.float64, device=device)
    tok, lp = _topk(draft, g, k)
    levels = [_Level(select=torch.zeros((n_roots, 1), dtype=torch.int64, device=device),
                     kept=torch.ones((n_roots, 1), dtype=torch.bool, device=device),
                     tokens=tok.view(n_roots, 1, k),
                     logq=(node_logq[:, None] + lp).view(n_roots, 1, k))]
    front_g = g
    for level in range(1, depth):
        last = levels[-1]
        width = last.tokens.shape[1] * k  # each root's last level
        flat_logq = last.logq.reshape(n_roots, width)
        alive = last.kept.repeat_interleave(k, dim=1)
        order = torch.sort(-flat_logq, dim=1, stable=True).indices  # ties: lower index
        order = order.gather(1, torch.sort((~alive).gather(1, order).to(torch.int8), dim=1,
                                           stable=True).indices)  # dead ones last
        select = order[:, : min(k, width)]
        kept = alive.gather(1, select)
        if budget is not None:
            kept &= _rank(levels, select) < budget - 1
        n = select.numel()
        parent = (select // k + torch.arange(n_roots, device=device)[:, None]
                  * last.tokens.shape[1]).reshape(-1)  # rows of the last fed level
        ids = last.tokens.reshape(n_roots, width).gather(1, select).reshape(-1)
        cache_len = draft._k.shape[1]
        seen = torch.zeros((n, cache_len + n), dtype=torch.bool, device=device)
        seen[:, : rows.shape[1]] = rows[parent]
        seen[torch.arange(n, device=device), cache_len + torch.arange(n, device=device)] = True
        step_positions = np.repeat(positions + level, select.shape[1])
        front_g = yield from draft._feed(draft.head.fed_back(front_g[parent]), ids,
                                         step_positions, seen)
        rows = seen
        tok, lp = _topk(draft, front_g, k)
        chosen_logq = flat_logq.gather(1, select).reshape(-1)
        levels.append(_Level(select=select, kept=kept,
                             tokens=tok.view(n_roots, -1, k),
                             logq=(chosen_logq[:, None] + lp).view(n_roots, -1, k),
                             first_slot=cache_len, g=front_g))
    fed = _read_into(draft, levels, roots, tokens, parents, logq)
    _adopt_pool(draft, Tree(tokens, parents), len(context), levels, fed)


class _Level:
    """One level of children on the device: `tokens` and cumulative `logq` [roots, F, k] of
    the F frontier nodes each root fed (`select`: their places in the root's previous level,
    flattened; `kept`: alive, so their children enter the pool), fed at cache entries
    `first_slot`... with outputs `g` (none for the roots, which the head's own bookkeeping fed)."""

    def __init__(self, select, kept, tokens, logq, first_slot=None, g=None):
        self.select, self.kept, self.tokens, self.logq = select, kept, tokens, logq
        self.first_slot, self.g = first_slot, g


def _topk(draft, g: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(target ids, float64 log-probs) [rows, k] of the head's k best tokens after g, ranked
    over its draft vocabulary, ties to the lower id: `Eagle3Draft.topk_at`'s, left on the
    device."""
    small = draft._draft_logits(g)[:, draft._draft_cols]
    ids, vals = topk_sorted(torch.log_softmax(draft._work(small), dim=-1), k)
    return draft._target_cols[ids], vals.double()


def _rows_seen(draft, nodes: np.ndarray) -> torch.Tensor:
    """[len(nodes), cache entries]: the head's entries each fed node sees, itself included
    (what a child of it sees besides its own entry)."""
    seen = np.zeros((len(nodes), draft._k.shape[1]), dtype=bool)
    seen[:, : draft._n] = True  # every committed entry (a committed root's among them)
    in_tree = draft._slot >= draft._n
    seen[:, draft._slot[in_tree]] = draft._anc[nodes][:, in_tree]
    return host_to_device(seen, draft.device)


def _rank(levels: list[_Level], select: torch.Tensor) -> torch.Tensor:
    """Each selected node's place among the pool's live nodes in draft_rank's order (cumulative
    log-prob, ties to the lower pool index): one root, `select` [1, F] in the last level."""
    logq = torch.cat([lv.logq.reshape(-1) for lv in levels])
    alive = torch.cat([lv.kept.repeat_interleave(lv.tokens.shape[2], dim=1).reshape(-1)
                       for lv in levels])
    at = select[0] + (len(logq) - levels[-1].logq.numel())  # places in the whole pool
    mine = logq[at][:, None]
    index = torch.arange(len(logq), device=logq.device)
    above = (logq[None] > mine) | ((logq[None] == mine) & (index[None] < at[:, None]))
    return (above & alive[None]).sum(dim=1)[None]


def _read_into(draft, levels: list[_Level], roots: np.ndarray, tokens: list[int],
               parents: list[int], logq: list[float]) -> list[np.ndarray]:
    """Read every level in one copy and append the live nodes to the pool's lists, numbered
    as `grow` numbers them: level by level, each root's kept frontier nodes in order, each
    one's children best first. Returns, per level, the pool index of each fed frontier node
    (-1: dead)."""
    parts = [t for lv in levels for t in (lv.select, lv.kept, lv.tokens, lv.logq)]
    host = draft._fetch(*parts)
    last_ids = None  # each root's previous level: pool index of each node, -1 if not in it
    fed = []
    for i in range(len(levels)):
        select, kept, toks, lq = host[4 * i: 4 * i + 4]
        n_roots, width, k = toks.shape
        ids = np.full((n_roots, width, k), -1, dtype=np.int64)
        front = np.full((n_roots, width), -1, dtype=np.int64)
        for r in range(n_roots):
            for f in range(width):
                if not kept[r, f]:
                    continue
                node = int(roots[r]) if last_ids is None else int(last_ids[r][select[r, f]])
                front[r, f] = node
                ids[r, f] = len(tokens) + np.arange(k)
                tokens.extend(toks[r, f].tolist())
                parents.extend([node] * k)
                logq.extend(lq[r, f].tolist())
        fed.append(front.reshape(-1))
        last_ids = ids.reshape(n_roots, -1)
    return fed


def _adopt_pool(draft, pool: Tree, n_ctx: int, levels: list[_Level],
                fed: list[np.ndarray]) -> None:
    """The head's tree is now the pool, its live frontier nodes fed at the entries they were
    fed at (with their g), as if `grow` had asked for them level by level: rows asked for
    later at those nodes are not fed again."""
    draft._adopt_tree(pool, n_ctx)
    for level, nodes in zip(levels[1:], fed[1:], strict=True):
        live = np.flatnonzero(nodes >= 0)
        if len(live):
            draft._slot[nodes[live]] = level.first_slot + live
            draft._g[host_to_device(nodes[live], draft.device)] = level.g[
                host_to_device(live, draft.device)]
