"""What one round hands around: the state a planner sees, its statistics, and the plan it returns.

A round: a planner chooses a tree under the root context (every committed token), the target
scores every node in one verify pass, verification walks the tree and commits the accepted path
plus a bonus token. Decoders that commit a first token t0 draw it from the exact row of a
separate **root pass**, which runs alongside drafting when target and draft live on different
devices (`root_pass_alongside`). A planner asks for its passes as requests
(`targetrows.core.passes`), so alongside needs no thread: the root pass is queued on a stream
of its own (a GPU runs it while the host goes on to queue the draft's passes on the default
stream), and the target's stream waits for it, on the device, once the drafting is done. On a
CPU, where a pass runs as it is asked for, the two run in turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from targetrows.core.passes import Passes
from targetrows.core.rows import RowStore
from targetrows.core.tree import Tree

from .model import side_stream
from .timing import Timings, stamp


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
    round's statistics (to fill in), whether the root pass runs alongside drafting, the
    decoder's selection rule, a draft-free decoder's state across rounds (what it
    learned from the target's past rows: `targetrows.core.recycle.Recycler`, made once per
    decode by `Decoder.new_state`), and whether this is the decode's first round."""

    target: Any
    draft: Any | None
    context: list[int]
    store: RowStore
    config: Any  # a DecodeConfig
    stats: RoundStats
    overlap: bool  # the root pass alongside drafting (on a stream of its own); False: in turn
    rule: Any = None  # a targetrows.core.rules.rule.Rule; None for ar and the draft-free
    state: Any = None  # the draft-free decoders' Recycler; None for every other decoder
    opening: bool = False  # the decode's first round: the target has not seen the prompt yet
    # part times still on the device, settled into `stats` at the round's end
    timings: Timings = field(default_factory=Timings)


@dataclass
class Plan:
    """What a planner hands to verification: tokens committed before the tree (t0), and the
    tree, rooted at the last of context + prefix; None when there is nothing to verify (the
    round commits the prefix alone). `observe`, when given, is called after the verify pass
    as ``observe(tree, logits, nodes)`` with the target's rows at `nodes` of the tree (all of
    them, or all but the root when the root's row came from the store): how a draft-free
    decoder's state learns from every verified node, accepted or not. `on_device`: a tree
    chosen where the draft's pool is and not read yet (`targetrows.hf.device_tree`), in
    place of `tree`: the verify pass is fed from the device, and the tree comes to the host
    with the pass's draws."""

    prefix: list[int]
    tree: Tree | None
    observe: Callable[[Tree, Any, Sequence[int]], None] | None = None
    on_device: Any = None


def root_pass_alongside(r: Round, draft_work: Passes) -> Passes:
    """The target's root pass at the round's context, with the steps `draft_work` alongside it
    (or after it: without overlap, and in a decode's first round). Returns the root row's
    logits (also put in the store, so the verify pass reuses it) and draft_work's result;
    fills t_root, t_draft and t_drafting."""
    # The first round's root pass prefills the prompt before anything drafts: an EAGLE-3 head
    # reads the prompt's target features, so it must not draft before they exist. Later
    # rounds, alongside: the root pass on a stream of its own, which the target's own stream
    # waits for (on the device) once the drafting is done.
    start = stamp(r.target, r.draft)
    if r.opening or not r.overlap:
        root_logits = yield from _root_pass(r)
        drafted = yield from _timed(r, draft_work, ("t_draft",))
    else:
        stream, root_logits = yield from on_side_stream(r.target, _root_pass(r))
        drafted = yield from _timed(r, draft_work, ("t_draft",))
        stream.join(root_logits)
    r.timings.add(("t_drafting",), start, stamp(r.target, r.draft))
    r.store.put(r.context, root_logits)
    return root_logits, drafted


def _root_pass(r: Round) -> Passes:
    """The root row at the round's context: the store's, or one target pass, after which the
    root is committed cache (verify feeds only the tree). Timed into t_root on the stream it
    runs on (its own, beside drafting)."""
    start = stamp(r.target)
    logits = r.store.get(r.context)
    if logits is None:
        logits = yield from r.target.logits_passes(r.context, Tree.root_only(r.context[-1]), [0])
        r.target.commit(r.context)
        r.stats.target_passes += 1
    r.timings.add(("t_root",), start, stamp(r.target))
    return logits


def _timed(r: Round, work: Passes, fields: tuple[str, ...]) -> Passes:
    """`work`'s steps, timed on the draft's device into `fields` of the round's statistics."""
    start = stamp(r.draft)
    out = yield from work
    r.timings.add(fields, start, stamp(r.draft))
    return out


def on_side_stream(model: Any, steps: Passes) -> Passes:
    """Run `steps` with all its device work on `model`'s side stream: its passes are asked for
    as side passes (the scheduler runs them there), and its own work between them (a pass's
    features and checks) is queued there too. Returns (the stream, to `join` before anything
    on the caller's stream reads the result, and what `steps` returned)."""
    stream = side_stream(model)
    advance, value = steps.send, None
    while True:
        try:
            with stream:
                request = advance(value)
        except StopIteration as done:
            return stream, done.value
        try:
            value, advance = (yield replace(request, side=True)), steps.send
        except Exception as err:  # the pass failed: the steps clean up and raise it
            value, advance = err, steps.throw


def timed_draft_work(r: Round, work: Passes) -> Passes:
    """Draft work that runs on its own (no root pass beside it), timed into t_draft and
    t_drafting (added, so a second drafting step in a round adds to the first)."""
    return (yield from _timed(r, work, ("t_draft", "t_drafting")))
