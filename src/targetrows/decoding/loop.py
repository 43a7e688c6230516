"""The round loop: one loop for every decoder; a decoder only differs in how it picks the tree.

Each round a planner (`targetrows.decoding.planners`, chosen through the registry) picks the tree
under the root context (every committed token) and any first token t0 it commits; the target
scores every node in one verify pass, and verification walks the tree and commits the accepted
path plus a bonus token. Verification is the same for every decoder and uses only the target's
own draws, which is what makes every decoder lossless.

The loop talks to models only through `targetrows.decoding.model.Model`, so it runs the toy
pair (NumPy) and Hugging Face models (torch) alike. It is written as steps that ask for their
passes (`decode_passes`, `targetrows.core.passes`): `generate` runs one sequence's, and the
scheduler of `targetrows.decoding.batch` runs many sequences' together, their passes batched.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from targetrows.core.passes import Passes
from targetrows.core.rows import RowStore
from targetrows.core.tree import Tree
from targetrows.core.verify import walk

from .config import DecodeConfig
from .model import overlaps
from .registry import get_rule
from .round import Round, RoundStats
from .schedule import run_batched


@dataclass
class DecodeResult:
    tokens: list[int]  # the new tokens (prompt excluded)
    rounds: list[RoundStats] = field(default_factory=list)
    wall_time: float = 0.0
    stop_reason: str = "length"  # "stop" (a stop token was emitted) or "length"

    def summary(self) -> dict[str, float]:
        n = max(len(self.rounds), 1)
        total = {k: sum(getattr(r, k) for r in self.rounds) for k in asdict(RoundStats())}
        return {
            "new_tokens": len(self.tokens),
            "rounds": len(self.rounds),
            "tokens_per_s": len(self.tokens) / self.wall_time if self.wall_time else 0.0,
            **{f"mean_{k}": v / n for k, v in total.items()},
        }


def generate(
    target: Any, draft: Any | None, prompt_ids: Sequence[int], config: DecodeConfig,
    state: Any | None = None,
) -> DecodeResult:
    """Decode from `prompt_ids` with `config.decoder`; lossless for every decoder. `state`: a
    draft-free decoder's state from `new_state` to carry on with (what a caller keeps to keep
    what it learned across prompts, `DecodeConfig.keep_across_prompts`); by default a fresh
    one."""
    steps = decode_passes(target, draft, prompt_ids, config, state)
    return run_batched(target, draft, [lambda t, d: steps], 1)[0]  # the scheduler, one sequence


def decode_passes(
    target: Any, draft: Any | None, prompt_ids: Sequence[int], config: DecodeConfig,
    state: Any | None = None,
) -> Passes[DecodeResult]:
    """`generate` as steps that ask for their passes (`targetrows.core.passes`): the round loop
    of one sequence, which a scheduler runs alone or beside others."""
    decoder = config.decoder
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty: it needs at least one token")
    if decoder.needs_draft and draft is None:
        raise ValueError(f"decoder {decoder.name!r} needs a draft model")
    overlap = overlaps(target, draft, config.overlap)
    target.reset(config.seed)
    if draft is not None:
        draft.reset(config.seed)
    if decoder.new_state is not None:
        state = new_state(target, config) if state is None else state
        state.start()
    context = [int(t) for t in prompt_ids]
    new: list[int] = []
    rule = get_rule(decoder.rule) if decoder.rule is not None else None
    keep_last = rule is not None and "stale_row" in rule.reads
    store = RowStore(max_rows=8)  # rows by full context: only exact hits are reused
    result = DecodeResult(tokens=new)
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        stats = RoundStats()
        round_ = Round(target, draft, context, store, config, stats, overlap, rule, state,
                       opening=not result.rounds)
        plan = yield from decoder.plan(round_)
        verified = yield from _verified(target, context, plan, store, config, stats, keep_last)
        round_.timings.settle(stats)  # the reads above waited for the device's timed work
        tokens, stop_reason = _truncate(list(plan.prefix) + verified, config, len(new))
        new.extend(tokens)
        context.extend(tokens)
        target.commit(context)
        if draft is not None:
            draft.commit(context)
        stats.committed = len(tokens)
        stats.t_round = time.perf_counter() - t0
        stats.t_bookkeeping = max(stats.t_round - stats.t_drafting - stats.t_verify, 0.0)
        result.rounds.append(stats)
        if stop_reason:
            result.stop_reason = stop_reason
            break
    result.wall_time = time.perf_counter() - start
    return result


def new_state(target: Any, config: DecodeConfig) -> Any | None:
    """A draft-free decoder's state for `target` (`Decoder.new_state`), to pass to `generate`
    for every prompt a caller decodes; None for a decoder without one."""
    make = config.decoder.new_state
    return None if make is None else make(target.vocab_size, config)


def _verified(target, context: list[int], plan, store: RowStore, config: DecodeConfig,
              stats: RoundStats, keep_last: bool) -> Passes[list[int]]:
    """The plan's tree verified after its prefix (nothing without a tree), its rows handed to
    the plan's observer."""
    ctx = context + plan.prefix
    if plan.on_device is not None:
        return (yield from _verify_on_device(target, ctx, plan.on_device, store, config, stats))
    if plan.tree is None:
        return []
    tokens, rows, nodes = yield from _verify(target, ctx, plan.tree, store, config, stats,
                                             keep_last)
    if plan.observe is not None and len(nodes):
        plan.observe(plan.tree, rows, nodes)
    return tokens


def _truncate(tokens: list[int], config: DecodeConfig, emitted: int) -> tuple[list[int], str]:
    """Cut a round's tokens at the first stop token (kept) or at max_new_tokens."""
    for i, tok in enumerate(tokens):
        if tok in config.stop_ids:
            tokens = tokens[: i + 1]
            if emitted + len(tokens) <= config.max_new_tokens:
                return tokens, "stop"
            break
    room = config.max_new_tokens - emitted
    if len(tokens) >= room:
        return tokens[:room], "length"
    return tokens, ""


def _verify(target, ctx: list[int], tree: Tree, store: RowStore, config: DecodeConfig,
            stats: RoundStats, keep_last: bool = False) -> Passes[tuple[list[int], Any, range]]:
    """One target pass over the tree, then the lossless walk: (accepted path tokens + bonus,
    the pass's rows, the nodes they are at). With `keep_last`, the row at the last accepted
    node goes into the store under its full context: the next round's stale row (its context
    less the bonus token)."""
    t = time.perf_counter()
    root_logits = store.get(ctx)
    if root_logits is None:  # the verify pass yields the root row too
        nodes = range(len(tree))
        rows = yield from target.logits_passes(ctx, tree, nodes)
        draws = target.draw(rows, config.temperature)
        stats.target_passes += 1
    else:  # exact root row from this context's root pass: only the other nodes need a pass
        rows, nodes = None, range(0)
        if len(tree) > 1:
            nodes = range(1, len(tree))
            rows = yield from target.logits_passes(ctx, tree, nodes)
            stats.target_passes += 1
        # the root's and the nodes' draws in one read, once the pass is queued (a GPU's host
        # waits once, not before launching the pass too)
        draws = target.draw(root_logits if rows is None else (root_logits, rows),
                            config.temperature)
    stats.t_verify = time.perf_counter() - t
    path, bonus = _walked(tree, draws, stats)
    accepted = tree.tokens[path].tolist()
    if keep_last and (root_logits is None or len(path)):  # else the root row is stored already
        last = int(path[-1]) if len(path) else 0
        at = last if root_logits is None else last - 1
        store.put(ctx + accepted, rows[at : at + 1])
    return accepted + [bonus], rows, nodes


def _verify_on_device(target, ctx: list[int], tree, store: RowStore, config: DecodeConfig,
                      stats: RoundStats) -> Passes[list[int]]:
    """One target pass over a tree chosen on the device (`Plan.on_device`; the root's row
    from the store where the root pass gave it), then the walk: the accepted path's tokens +
    bonus. The pass's draws are the round's one read, and the draft's pool, so the tree,
    comes with them."""
    t = time.perf_counter()
    root_logits = store.get(ctx)
    rows = yield from target.tree_on_device_passes(ctx, tree, root=root_logits is None)
    draws = target.draw(rows if root_logits is None else (root_logits, rows),
                        config.temperature)
    stats.target_passes += 1
    stats.t_verify = time.perf_counter() - t
    read = target.settle_tree(tree)
    path, bonus = _walked(read, draws, stats)
    return read.tokens[path].tolist() + [bonus]


def _walked(tree: Tree, draws, stats: RoundStats) -> tuple[np.ndarray, int]:
    """The lossless walk of `tree` by the target's `draws` at its nodes (`core.verify.walk`:
    the accepted path's nodes, the bonus token), counted into `stats`."""
    path, bonus = walk(tree, draws)
    stats.nodes = tree.budget
    stats.accepted = len(path)
    return path, bonus
