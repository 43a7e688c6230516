"""A draft's candidate pool grown on the device: the host reads it once, at the end.

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
- each fed node's mask row is its parent's row plus its own entry, gathered on the device with
  its token (and, for an EAGLE-3 head, its h: the parent's g).

The pool the host builds from the read is `grow`'s, node for node (tests check it at every
batch size, with padded passes and graphs too). What differs on a GPU is the passes: a budget-pruned pool
that `grow` would end early is drafted to its full depth (`core.pool.drafts_full_depth` lets
the round count those passes), and its dead nodes are fed; both cost little where a pass is
bound by its launches, not its width. On the CPU, where a read costs nothing and a pass costs
its width, it stops where `grow` does (still feeding the dead nodes of a level it drafts).

On a GPU the read may also wait (`later`): it is queued and comes with the device's next read,
so a pool drafted beside the root pass arrives with the draw of t0 from the root row, in one
wait (`targetrows.hf.torch_rows.TorchRows._read_later`).

Both torch backends grow pools this way (`grow_pool_passes` is their `grow_passes`), through
a few hooks of theirs, ``_pool_*``: the roots' outputs (rows for a model, g for a head, fed
through the backend's own bookkeeping), the top-k of an output, the cache entries a fed node
sees, the cache's length, one level's feed with everything on the device, and taking over the
fed nodes as the backend's tree afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from targetrows.core.passes import Passes
from targetrows.core.pool import grow_guesses, grow_on_host
from targetrows.core.tree import Tree

from . import torch_rows
from .device_tree import LOWEST, TreeOnDevice, choose_on_device
from .torch_rows import host_to_device


@torch.inference_mode()
def grow_pool_passes(model, context, tokens: list[int], parents: list[int], logq: list[float],
                     roots, top_k: int, depth: int, budget: int | None = None,
                     guesses: int = 0, later: bool = False) -> Passes[Callable[[], None]]:
    """`targetrows.core.pool.grow` for a torch backend (with `guesses`: `grow_guesses`), on
    the device (`grow_on_device`), or level by level where a level is wider than the
    vocabulary it ranks (all of it is taken). Returns a function to call before reading the
    lists (with `later`, on a GPU, they are filled by the device's next read)."""
    if max(top_k, guesses) > model._pool_width():
        if guesses:
            yield from grow_guesses(model, context, tokens, parents, logq, guesses, top_k, depth)
        else:
            yield from grow_on_host(model, context, tokens, parents, logq, roots, top_k, depth,
                                    budget)
        return _filled
    return (yield from grow_on_device(model, context, tokens, parents, logq, roots, top_k,
                                      depth, budget, guesses, later))


def grow_on_device(model, context, tokens: list[int], parents: list[int], logq: list[float],
                   roots, top_k: int, depth: int, budget: int | None, guesses: int = 0,
                   later: bool = False) -> Passes[Callable[[], None]]:
    """`targetrows.core.pool.grow` with the levels chosen on the device: the same lists
    extended in place with the same nodes, after one read. With `guesses` (one root), what
    `targetrows.core.pool.grow_guesses` grows: the root's `guesses` likeliest children, then
    a pool of `depth` levels under each. With `later`, the read is queued for the device's
    next read; returns a function that waits for it (fetching then if none has come)."""
    if (budget is not None or guesses) and len(roots) != 1:
        raise ValueError("a budget-pruned pool, or pools under guesses, grow under one root")
    roots = np.asarray(roots, dtype=np.int64)
    first, at = yield from _first_level(model, context, Tree(tokens, parents), roots, logq,
                                        top_k, guesses)
    levels, seen = [first], {"pool_key": None}  # `seen`: what later levels reuse
    for level in range(1, depth + (1 if guesses else 0)):
        chosen = _frontier(levels[-1], top_k, budget, seen, model.device)
        if chosen is None:
            break  # where `grow` stops, not a pass later
        levels.append((yield from _feed_level(model, levels[-1], chosen, top_k, budget, level,
                                              at, seen)))
    return _handed_over(model, len(context), levels, at["roots"], tokens, parents, logq,
                        later, guesses)


def _first_level(model, context, tree: Tree, roots: np.ndarray, logq: list[float], k: int,
                 guesses: int) -> Passes[tuple[_Level, dict]]:
    """Level 0: the roots, fed through the backend's own bookkeeping (a tail, committed
    tokens), and their children. Returns that level and where the roots are: `rows`, the
    entries they see ([roots, entries]: their children see them too), `out`, their outputs,
    `positions`, their children's less 1, `roots` (repeated per guess under guesses)."""
    device = model.device
    out = yield from model._pool_first(context, tree, roots)
    at = dict(rows=model._pool_seen(roots), out=out, roots=roots,
              positions=model._root_position(len(context)) + tree.depth[roots])
    node_logq = host_to_device(np.asarray(logq, dtype=np.float64)[roots], device)
    tok, lp = model._pool_topk(out, max(k, guesses))
    children = node_logq[:, None] + lp
    n_roots, first_k = len(roots), max(k, guesses)
    if guesses:  # each guess the root of its own pool: fed as the next level's frontier
        n_roots, first_k = guesses, 1
        tok, children = tok[0, :guesses, None], children[0, :guesses, None]
        at.update(rows=at["rows"].expand(guesses, -1), out=out.expand(guesses, -1),
                  positions=np.repeat(at["positions"], guesses),
                  roots=np.repeat(roots, guesses))
    level = _Level(select=torch.zeros((n_roots, 1), dtype=torch.int64, device=device),
                   kept=torch.ones((n_roots, 1), dtype=torch.bool, device=device),
                   tokens=tok.reshape(n_roots, 1, first_k),
                   logq=children.reshape(n_roots, 1, first_k))
    return level, at


def _frontier(last: _Level, k: int, budget: int | None, seen: dict, device):
    """The next frontier of each root: the top k of its last level by cumulative log-prob,
    ties to the lower index (a stable sort), and which of them stay alive (with a budget,
    those among the pool's top budget - 1 so far). (selected places, kept, the sort, the
    level's flat log-probs); None where nothing stays alive and a read costs nothing."""
    n_roots, n_front, last_k = last.tokens.shape
    width = n_front * last_k  # each root's last level
    flat_logq = last.logq.reshape(n_roots, width)
    if budget is None:  # nothing dies: every node is live, and its key its logq
        key = flat_logq
    else:  # the live ones first: a dead node's key (-inf) is below every live one's
        key = torch.where(last.kept[:, :, None], last.logq.clamp(min=LOWEST),
                          -math.inf).reshape(n_roots, width)
        pool_key = seen["pool_key"]
        seen["pool_key"] = key[0] if pool_key is None else torch.cat([pool_key, key[0]])
    ranked = torch.sort(key, dim=1, descending=True, stable=True)
    select = ranked.indices[:, : min(k, width)]
    if budget is None:  # every selected node is kept: made once per shape
        if select.shape not in seen:
            seen[select.shape] = torch.ones_like(select, dtype=torch.bool)
        kept = seen[select.shape]
    else:  # among the pool's top budget - 1 so far: never a dead node, which ranks after
        # every live one, and a node died only where budget - 1 live ones outranked it (or
        # its parent), which stay in the pool
        pool_key = seen["pool_key"]
        kept = (_rank(pool_key, select[0], len(pool_key) - width) < budget - 1)[None]
        if torch_rows.reads_are_free(device) and not bool(kept.any()):
            return None
    return select, kept, ranked, flat_logq


def _feed_level(model, last: _Level, chosen, k: int, budget: int | None, level: int,
                at: dict, seen: dict) -> Passes[_Level]:
    """Feed the frontier `chosen` (`_frontier`) under `last`, and rank its children."""
    select, kept, ranked, flat_logq = chosen
    n_roots, n_front, last_k = last.tokens.shape
    device, n = model.device, select.numel()
    parent = select.reshape(-1) // last_k  # rows of the last fed level
    if n_roots > 1:
        parent = parent + torch.arange(n_roots, device=device).repeat_interleave(
            select.shape[1]) * n_front
    ids = last.tokens.reshape(n_roots, -1).gather(1, select).reshape(-1)
    cache_len, rows = model._pool_entries(), at["rows"]
    if ("own", n) not in seen:  # each fed node sees its own entry: made once per width
        seen["own", n] = torch.eye(n, dtype=torch.bool, device=rows.device)
    own = seen["own", n]
    # the parent's entries, the parent's own too (rows live where the model's inputs do; they
    # span the cache, the last level's entries last), then its own
    at["rows"] = torch.cat([rows[parent.to(rows.device)], own], dim=1)
    positions = np.repeat(at["positions"] + level, select.shape[1])
    at["out"] = out = yield from model._pool_feed(at["out"], parent, ids, positions, at["rows"])
    tok, lp = model._pool_topk(out, k)
    # without a budget the sort's values are the chosen nodes' logq (with one, a dead node's
    # are -inf, and a node's logq of -inf is LOWEST)
    chosen_logq = (ranked.values[:, : select.shape[1]] if budget is None
                   else flat_logq.gather(1, select)).reshape(-1)
    return _Level(select=select, kept=kept, tokens=tok.view(n_roots, -1, k),
                  logq=(chosen_logq[:, None] + lp).view(n_roots, -1, k), first_slot=cache_len,
                  out=out)


def _handed_over(model, n_context: int, levels: list[_Level], roots: np.ndarray, tokens,
                 parents, logq, later: bool, guesses: int) -> _PoolWait:
    """The pool's read: at once, or queued for the device's next read (`later`), filling the
    lists and making the draft keep what it fed."""
    pool, device = _PoolWait(), model.device

    def take(host: list[np.ndarray]) -> None:  # the pool's lists; the draft keeps what it fed
        fed, pool.places = _read_into(levels, host, roots, tokens, parents, logq)
        pool.tree = Tree(tokens, parents)
        model._pool_adopt(pool.tree, n_context,
                          [(lv.first_slot, lv.out, nodes)
                           for lv, nodes in zip(levels[1:], fed[1:], strict=True)])

    parts = [t for lv in levels for t in (lv.select, lv.kept, lv.tokens, lv.logq)]
    if not later:
        take(model._fetch(*parts))
        return pool
    n_roots = len(roots)
    queued = not (guesses or n_roots > 1 or torch_rows.reads_are_free(device))
    pool.wait = model._read_later(parts, take)
    pool.first_level = levels[0].tokens.reshape(1, -1) if queued else None
    if n_roots == 1 and not guesses:  # a tree may be chosen from it on the device
        pool.on_device = (model, levels, tokens[roots[0]], logq)
    return pool


def _filled() -> None:
    """The pool's lists are filled: nothing to wait for."""


class _PoolWait:
    """Waits for a pool's queued read (`wait`; nothing to wait for where it was read at once).
    `first_level` [1, k]: the tokens of the root's children on the device, in pool order, for
    a read of the target's rows at them that comes with the pool's
    (`TorchRows.logprobs_read_later`); None under guesses or several roots, and where the pool
    was read at once (the CPU). `tree`: the pool's lists as a `Tree`, once read (the one the
    draft adopted, so a reader need not build it again); `places`: the pool index of each
    node on the device, level by level (-1: dead). `choose`: where the read was queued under
    one root, a root-pool rule's tree chosen on the device (`targetrows.hf.device_tree`)."""

    def __init__(self):
        self.wait: Callable[[], None] = _filled
        self.first_level: torch.Tensor | None = None
        self.tree: Tree | None = None
        self.places: np.ndarray | None = None
        self.on_device = None  # (the model, its levels, the root's token, the logq list)

    def __call__(self) -> None:
        self.wait()

    @property
    def choose(self) -> Callable[..., TreeOnDevice] | None:
        return None if self.on_device is None else self._choose

    def _choose(self, budget: int, select: Callable[..., np.ndarray],
                rescore=None) -> TreeOnDevice:
        """The top `budget` nodes, chosen on the device (`device_tree.choose_on_device`), their
        read queued with the pool's; `select`: the rule's own choice, which the device's is
        checked against."""
        model, levels, root_token, logq = self.on_device

        def pool_read() -> tuple[Tree, np.ndarray, np.ndarray]:
            self.wait()
            return self.tree, np.array(logq), self.places

        return choose_on_device(levels, root_token, budget, model._read_later, pool_read,
                                select, rescore)


class _Level:
    """One level of children on the device: `tokens` and cumulative `logq` [roots, F, k] of
    the F frontier nodes each root fed (`select`: their places in the root's previous level,
    flattened; `kept`: alive, so their children enter the pool), fed at cache entries
    `first_slot`... with outputs `out` (none kept for the roots: the backend fed them)."""

    def __init__(self, select, kept, tokens, logq, first_slot=None, out=None):
        self.select, self.kept, self.tokens, self.logq = select, kept, tokens, logq
        self.first_slot, self.out = first_slot, out


def _rank(pool_key: torch.Tensor, at: torch.Tensor, offset: int) -> torch.Tensor:
    """The place of each node at `offset` + `at` among the pool's live nodes in draft_rank's
    order (cumulative log-prob, ties to the lower pool index): its place in a stable sort of
    the pool's keys, where every dead node comes after the live ones."""
    order = torch.sort(pool_key, descending=True, stable=True).indices
    return order.argsort()[offset:][at]


def _read_into(levels: list[_Level], host: list[np.ndarray], roots: np.ndarray,
               tokens: list[int], parents: list[int], logq: list[float]
               ) -> tuple[list[np.ndarray], np.ndarray]:
    """Append the live nodes of every level, read (`host`: each level's select, kept, tokens
    and logq), to the pool's lists, numbered as `grow` numbers them: level by level, each
    root's kept frontier nodes in order, each one's children best first. Returns (per level,
    the pool index of each fed frontier node; the pool index of each node on the device,
    level by level), -1 for a dead node."""
    last_ids = None  # each root's previous level: pool index of each node, -1 if not in it
    fed, places = [], []
    for i in range(len(levels)):
        select, kept, toks, lq = host[4 * i: 4 * i + 4]
        n_roots, width, k = toks.shape
        ids = np.full((n_roots, width, k), -1, dtype=np.int64)
        front = np.full((n_roots, width), -1, dtype=np.int64)
        for r in range(n_roots):  # one root, or a few guesses: each level's nodes at once
            live = np.flatnonzero(kept[r])
            front[r, live] = roots[r] if last_ids is None else last_ids[r][select[r, live]]
            ids[r, live] = len(tokens) + np.arange(len(live) * k).reshape(-1, k)
            tokens.extend(toks[r, live].reshape(-1).tolist())
            parents.extend(np.repeat(front[r, live], k).tolist())
            logq.extend(lq[r, live].reshape(-1).tolist())
        fed.append(front.reshape(-1))
        places.append(ids.reshape(-1))
        last_ids = ids.reshape(n_roots, -1)
    return fed, np.concatenate(places)
