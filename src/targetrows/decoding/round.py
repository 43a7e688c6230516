"""What one round hands around: the state a planner sees, its statistics, and the plan it returns.

A round: a planner chooses a tree under the root context (every committed token), the target
scores every node in one verify pass, verification walks the tree and commits the accepted path
plus a bonus token. Decoders that commit a first token t0 draw it from the exact row of a
separate **root pass**, which runs alongside drafting when target and draft live on different
devices (`root_pass_alongside`): on a thread of its own, and on a GPU on a stream of its own,
so that neither the host nor the card queues the drafting behind it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from targetrows.core.rows import RowStore
from targetrows.core.tree import Tree

from .model import side_stream, synchronize


@dataclass
class RoundStats:
    committed: int = 0  # tokens committed this round (t0 + accepted path + bonus)
    accepted: int = 0  # accepted non-root nodes of the verified tree
    nodes: int = 0  # non-root nodes verified
    target_passes: int = 0
    draft_passes: int = 0
    t_draft: float = 0.0  # seconds of draft work (inside the overlap when there is one)
    t_root: float = 0.0  # seconds of the separate root pass
    t_drafting: float = 0.0  # wall time until the tree is drafted (root pass alongside)
    t_verify: float = 0.0  # verify pass and its draws
    t_bookkeeping: float = 0.0  # selection, verification walk, commits: the rest of the round
    t_round: float = 0.0


@dataclass
class Round:
    """What a planner may use: both models, the committed context, the row store (rows by
    full context: the root pass's and the last verify pass's), the decode settings, the
    round's statistics (to fill in), the executor the root pass runs on alongside drafting,
    the decoder's selection rule, a draft-free decoder's state across rounds (what it
    learned from the target's past rows: `targetrows.core.recycle.Recycler`, made once per
    decode by `Decoder.new_state`), and whether this is the decode's first round."""

    target: Any
    draft: Any | None
    context: list[int]
    store: RowStore
    config: Any  # a DecodeConfig
    stats: RoundStats
    executor: Any  # a one-worker pool the drafting runs on beside the root pass; None: in turn
    rule: Any = None  # a targetrows.core.rules.rule.Rule; None for ar and the draft-free
    state: Any = None  # the draft-free decoders' Recycler; None for every other decoder
    opening: bool = False  # the decode's first round: the target has not seen the prompt yet


@dataclass
class Plan:
    """What a planner hands to verification: tokens committed before the tree (t0), and the
    tree, rooted at the last of context + prefix; None when there is nothing to verify (the
    round commits the prefix alone). `observe`, when given, is called after the verify pass
    as ``observe(tree, logits, nodes)`` with the target's rows at `nodes` of the tree (all of
    them, or all but the root when the root's row came from the store): how a draft-free
    decoder's state learns from every verified node, accepted or not."""

    prefix: list[int]
    tree: Tree | None
    observe: Callable[[Tree, Any, Sequence[int]], None] | None = None


def root_pass_alongside(r: Round, draft_work):
    """The target's root pass at the round's context, with `draft_work()` alongside it (or after
    it: on one device, and in a decode's first round). Returns the root row's logits (also put
    in the store, so the verify pass reuses it) and draft_work's result; fills t_root, t_draft
    and t_drafting."""
    target, context, stats = r.target, r.context, r.stats

    def root_pass():
        t = time.perf_counter()
        logits = r.store.get(context)
        if logits is None:
            logits = target.logits(context, Tree.root_only(context[-1]), [0])
            target.commit(context)  # the root is now committed cache, verify feeds only the tree
            stats.target_passes += 1
        synchronize(target)
        stats.t_root = time.perf_counter() - t
        return logits

    def timed_draft():
        t = time.perf_counter()
        out = draft_work()
        synchronize(r.draft)
        stats.t_draft = time.perf_counter() - t
        return out

    # The first round's root pass prefills the prompt before anything drafts: an EAGLE-3 head
    # reads the prompt's target features, and were it to prefill them itself, racing the root
    # pass, the passes' shapes (and in reduced precision their rows) would depend on which
    # thread came first. Later rounds, alongside: the root pass on a stream of its own, which
    # the target's own stream waits for (on the device) once the drafting is done.
    t = time.perf_counter()
    if r.opening or r.executor is None:
        root_logits = root_pass()
        drafted = timed_draft()
    else:
        future = r.executor.submit(timed_draft)
        with side_stream(target) as stream:
            root_logits = root_pass()
        drafted = future.result()
        stream.join(root_logits)
    stats.t_drafting = time.perf_counter() - t
    r.store.put(context, root_logits)
    return root_logits, drafted


def timed_draft_work(r: Round, work):
    """Draft work that runs on its own (no root pass beside it), timed into t_draft and
    t_drafting (added, so a second drafting step in a round adds to the first)."""
    t = time.perf_counter()
    out = work()
    synchronize(r.draft)
    elapsed = time.perf_counter() - t
    r.stats.t_draft += elapsed
    r.stats.t_drafting += elapsed
    return out
