"""The cost model: what the parts of a round cost on this machine, the speed each decoder could
reach with zero overhead, and the budget that maximises predicted tokens/s.

Parts (timed by `targetrows.parttimes`): a target pass over q new tokens (q = 1 is an
autoregressive step or a root pass; a verify pass feeds the tree's nodes, plus its root when
that is not cached yet) and a draft pass over w nodes (pool expansion runs one per level). A
round's zero-overhead time is its drafting (the draft passes, with the root pass alongside them
as far as the run achieved overlap) plus its verify pass; selection, the verification walk and
cache compaction count as zero. With a run's own acceptance (tokens committed, nodes verified,
draft passes per round) that gives the bound each decoder's measured speed is compared with.

`auto_budget` predicts tokens/s for each candidate budget and pool depth: part times from a short
timing of the verify pass against tree size on the machine at hand (on CPU a big tree costs much
more than on a GPU, and every pool level is one draft pass), and acceptance from a few rounds along
the target's own greedy path, where one target pass over the largest candidate trees scores every
smaller draft-ranked tree of every depth at once.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from targetrows.core.acceptance import reach_probability
from targetrows.core.pool import expand_model, pool_size
from targetrows.core.rules.batch import PoolBatch, stack_pools
from targetrows.core.rules.root_pool import draft_rank
from targetrows.core.tree import Tree
from targetrows.core.verify import walk

from .model import edge_probs
from .parttimes import (
    PartTimes,
    PassCurve,
    isotonic,
    mean_parts,
    measure_parts,
    target_sizes_for,
    time_passes,
    time_prompt_pass,
)
from .registry import get_decoder, get_rule

# the part times are measured in `parttimes`; they are part of this module's interface
__all__ = [
    "DEFAULT_BUDGETS",
    "Bound",
    "BudgetChoice",
    "PartTimes",
    "PassCurve",
    "acceptance_curve",
    "auto_budget",
    "best_budget",
    "best_depth_budget",
    "bound",
    "draft_pass_widths",
    "isotonic",
    "mean_parts",
    "measure_parts",
    "overlap_achieved",
    "pool_size",
    "predicted_tokens_per_s",
    "round_seconds",
    "target_sizes_for",
    "time_passes",
    "time_prompt_pass",
]

DEFAULT_BUDGETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)


# -- the zero-overhead round -------------------------------------------------------------------


def draft_pass_widths(decoder: str, top_k: int, depth: int, guesses: int = 2,
                      budget: int | None = None) -> list[int]:
    """New tokens per draft pass of one round's pool expansion (`Decoder.draft_widths`)."""
    return get_decoder(decoder).draft_widths(top_k, depth, guesses, budget)


def round_seconds(
    decoder: str,
    parts: PartTimes,
    nodes,
    draft_passes,
    overlap: float,
    top_k: int,
    depth: int,
    guesses: int = 2,
    verify_empty: bool = True,
    budget: int | None = None,
) -> np.ndarray:
    """Zero-overhead seconds of rounds that verified `nodes` non-root nodes with `draft_passes`
    draft passes each (arrays, one entry per round). `overlap` in [0, 1] is the share of the
    shorter of drafting and the root pass hidden behind the other (0 on one device).
    `verify_empty`: as `DecodeConfig.verify_empty` (an empty tree after t0 verified for its
    bonus token). `budget`: the rounds' budget, for a decoder whose pool is pruned to it (its
    passes are narrower, and a round may stop before the last level)."""
    entry = get_decoder(decoder)
    nodes = np.asarray(nodes, dtype=np.float64)
    if not entry.drafts:
        return np.full(nodes.shape, parts.target(1))
    if parts.draft is None:
        raise ValueError(f"decoder {decoder!r} needs draft pass times")
    widths = entry.draft_widths(top_k, depth, guesses, budget)
    pass_s = [parts.draft(w) for w in widths]
    if entry.prunes_pool:  # the passes each round took (it may stop early), at most as wide
        done = np.clip(np.asarray(draft_passes, dtype=np.int64), 0, len(widths))
        drafting = np.cumsum([0.0, *pass_s])[done]
    else:
        drafting = float(sum(pass_s))
    verify = parts.target(nodes + entry.verify_feeds)
    if entry.commits_t0 and not verify_empty:  # an empty tree after t0 is not verified
        verify = np.where(nodes > 0, verify, 0.0)
    if not entry.root_pass:
        return drafting + verify
    root = parts.target(1)
    before = drafting + root - overlap * np.minimum(drafting, root)
    # passes beyond the planned ones are a pool drafted under t0 after the root pass (a first
    # token the guesses missed), each level costing what a root pool's level does
    extra = np.maximum(np.asarray(draft_passes, float) - len(widths), 0.0) / depth
    if np.any(extra > 0):
        before = before + extra * sum(parts.draft(w) for w in [1] + [top_k] * (depth - 1))
    return before + verify


def overlap_achieved(rounds) -> float:
    """Share of min(draft, root pass) that ran alongside the other, over a run's rounds."""
    hidden = sum(r.t_draft + r.t_root - r.t_drafting for r in rounds)
    possible = sum(min(r.t_draft, r.t_root) for r in rounds)
    return float(np.clip(hidden / possible, 0.0, 1.0)) if possible > 0 else 0.0


@dataclass(frozen=True)
class Bound:
    tokens_per_s: float  # zero-overhead speed with the run's acceptance and overlap
    speedup: float  # over a zero-overhead autoregressive step (1 / target pass of 1 token)
    overlap: float
    round_seconds: float  # mean zero-overhead round


def bound(
    decoder: str,
    parts: PartTimes,
    rounds,
    top_k: int,
    depth: int,
    guesses: int = 2,
    prompt_s: float = 0.0,
    budget: int | None = None,
) -> Bound:
    """The speed `decoder` could reach with zero overhead, given its run's `rounds`
    (RoundStats: committed, nodes, draft_passes and the part times that show the overlap).
    `prompt_s`: seconds of the target's pass over the prompt beyond a one-token pass (the first
    round of every decoder feeds the whole prompt once; 0 leaves it out). `budget`: the run's
    (see `round_seconds`)."""
    if not rounds:
        raise ValueError("bound needs at least one round")
    overlap = overlap_achieved(rounds)
    seconds = round_seconds(
        decoder,
        parts,
        [r.nodes for r in rounds],
        [r.draft_passes for r in rounds],
        overlap,
        top_k,
        depth,
        guesses,
        budget=budget,
    )
    tps = sum(r.committed for r in rounds) / (prompt_s + float(np.sum(seconds)))
    return Bound(tps, tps * parts.target(1), overlap, float(np.mean(seconds)))


# -- picking the budget ------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetChoice:
    """`auto_budget`'s pick and its predictions: `tokens_per_s`, `committed` and `nodes` hold one
    tuple per candidate depth (in `depths` order), each with one value per candidate budget."""

    budget: int
    depth: int  # the pool depth to decode at (`DecodeConfig.depth`)
    budgets: tuple[int, ...]
    depths: tuple[int, ...]
    tokens_per_s: tuple[tuple[float, ...], ...]  # predicted, [depth][budget]
    committed: tuple[tuple[float, ...], ...]  # predicted tokens per round
    nodes: tuple[tuple[float, ...], ...]  # predicted non-root nodes verified per round
    parts: PartTimes

    def at_depth(self, depth: int) -> tuple[float, ...]:
        """Predicted tokens/s by budget at one candidate depth."""
        return self.tokens_per_s[self.depths.index(depth)]

    def describe(self) -> str:
        curve = ", ".join(
            f"{b}: {t:.1f}" for b, t in zip(self.budgets, self.at_depth(self.depth), strict=True)
        )
        best = ", ".join(
            f"{d}: {max(row):.1f}" for d, row in zip(self.depths, self.tokens_per_s, strict=True)
        )
        return (
            f"budget auto -> {self.budget} at depth {self.depth} (predicted tokens/s by budget at "
            f"depth {self.depth}: {curve}; best predicted tokens/s by depth: {best})"
        )


def predicted_tokens_per_s(
    decoder: str,
    committed,
    nodes,
    parts: PartTimes,
    overlap: float,
    top_k: int,
    depth: int,
    guesses: int = 2,
    budgets=None,
) -> np.ndarray:
    """Tokens per zero-overhead second at each candidate budget, from the tokens committed and
    nodes verified per round predicted there (fts is assumed to guess t0). With `budgets`, each
    budget's pool is `min(depth, budget)` levels deep, and pruned to the budget where the decoder
    prunes it, as the round loop drafts it."""
    nodes = np.asarray(nodes, dtype=np.float64)
    entry = get_decoder(decoder)
    depths = ([depth] * nodes.size if budgets is None
              else [entry.pool_depth(depth, b) for b in budgets])
    caps = [None] * nodes.size if budgets is None else list(budgets)
    seconds = np.array([
        round_seconds(decoder, parts, [n], [len(draft_pass_widths(decoder, top_k, d, guesses))],
                      overlap, top_k, d, guesses, budget=b)[0]
        for n, d, b in zip(nodes.ravel(), depths, caps, strict=True)
    ]).reshape(nodes.shape)
    return np.asarray(committed, dtype=np.float64) / seconds


def best_budget(budgets: Sequence[int], tokens_per_s: Sequence[float]) -> int:
    """The budget with the highest predicted tokens/s (ties: the smallest budget): one pool
    depth's `best_depth_budget`."""
    return best_depth_budget([0], budgets, [tokens_per_s])[1]


def best_depth_budget(
    depths: Sequence[int], budgets: Sequence[int], tokens_per_s
) -> tuple[int, int]:
    """(depth, budget) with the highest predicted tokens/s, `tokens_per_s` being [depth][budget]
    (ties: the smallest depth, then the smallest budget: the cheaper drafting)."""
    depths, budgets = np.asarray(depths), np.asarray(budgets)
    tps = np.asarray(tokens_per_s, dtype=np.float64)
    if len(depths) == 0 or len(budgets) == 0 or tps.shape != (len(depths), len(budgets)):
        raise ValueError(f"need predicted speeds [depths, budgets] = {len(depths), len(budgets)}, "
                         f"got shape {tps.shape}")
    rows, cols = np.argsort(depths, kind="stable"), np.argsort(budgets, kind="stable")
    # argmax takes the first maximum in row-major order: the smallest depth, then budget
    row, col = np.unravel_index(int(np.argmax(tps[np.ix_(rows, cols)])), tps.shape)
    return int(depths[rows[row]]), int(budgets[cols[col]])


def acceptance_curve(
    target,
    draft,
    prompt_ids: Sequence[int],
    budgets: Sequence[int],
    decoder: str,
    temperature: float,
    top_k: int,
    depth: int,
    contexts: int = 3,
    seed: int = 0,
    depths: Sequence[int] | None = None,
    gap: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens committed per round, nodes verified per round) predicted at each budget: arrays
    [len(budgets)] for a pool of `depth` levels, or with `depths` (candidate pool depths, each
    1..depth) arrays [len(depths), len(budgets)].

    A small recording scored by the decoder's own rule (`Rule.expected`, as the row-log scorer
    scores it): at each of `contexts` contexts along the target's greedy path (a draft_rank
    round of the largest budget at the deepest depth, then `gap` greedy target tokens, move to
    the next: a reply's first tokens are its easiest to guess), one target pass scores the
    largest trees of every depth together (their union): draft_rank's, and the rule's own (for
    a rule after t0, under the root row's likeliest t0). A pool of depth d is the first d
    levels of a deeper pool (expansion goes level by level) and the union's nodes of depth
    <= d hold depth d's largest trees, so one expansion at the deepest depth serves every
    depth. A tree after t0 is averaged over t0, which takes each first-level branch with the
    root row's probability (the branches of less likely t0s only as far as the union holds
    them); a redrafted tree is predicted as the rule's tree at the root, plus t0.
    """
    rule = get_rule(get_decoder(decoder).rule)
    budgets = np.asarray(budgets, dtype=np.int64)
    largest = int(budgets.max())
    candidates = [depth] if depths is None else _check_depths(depths, depth)
    deepest = max(candidates)
    ctx = [int(t) for t in prompt_ids]
    target.reset(seed)
    draft.reset(seed)
    committed = np.zeros((len(candidates), len(budgets)))
    nodes = np.zeros((len(candidates), len(budgets)))
    for _ in range(contexts):
        stale = _stale_row(target, ctx) if "stale_row" in rule.reads else None
        cand, logq = expand_model(draft, ctx, top_k, deepest)
        root = None
        if rule.needs_root_pass:  # the rule's own trees need its rows (and t0) first
            root = target.logits(ctx, Tree.root_only(ctx[-1]), [0])
        rows = _rows_read(target, rule, cand, root, stale, temperature)
        t0 = int(target.draw(root, 0.0)[0]) if rule.commits_t0 else None
        walked = _largest_tree(draft_rank, cand, logq, largest, deepest)
        union = functools.reduce(np.union1d, [
            tree for d in set(candidates) for tree in (
                _largest_tree(draft_rank, cand, logq, largest, d),
                _largest_tree(rule, cand, logq, largest, d, rows, t0))])
        tree, tlogq = cand.subtree(union), logq[union]
        everywhere = np.arange(len(tree))  # every node's row: the walk may end at a leaf
        logits = target.logits(ctx, tree, everywhere)
        draws = target.draw(logits, 0.0)
        if temperature == 0:  # greedy: an edge is taken when it is the target's argmax
            edge = np.ones(len(tree))
            edge[1:] = draws[tree.parents[1:]] == tree.tokens[1:]
        else:
            edge = edge_probs(target, logits, everywhere, tree, temperature)
        reach = reach_probability(tree, edge)
        pools = PoolBatch.of_pool(tree, tlogq,
                                  **_rows_read(target, rule, tree, root, stale, temperature))
        # depth d's pool: the union's nodes of depth <= d (level by level: a prefix)
        cuts = [int(np.searchsorted(tree.depth, d, side="right")) for d in candidates]
        batch = stack_pools([pools.truncated(c) for c in cuts])
        width = batch.shape[1]
        reach_at = np.stack([np.where(np.arange(width) < c, reach[:width], 0.0) for c in cuts])
        # t0 takes each first-level node with the root row's probability: that node's reach
        acc, verified = rule.expected(batch, reach_at, budgets,
                                      reach_at if rule.commits_t0 else None)
        committed += acc + (2 if rule.commits_t0 else 1)
        nodes += verified
        # the deepest draft_rank tree's round alone moves on
        walked_tree = cand.subtree(walked)
        path, bonus = walk(walked_tree, draws[np.searchsorted(union, walked)])
        ctx = ctx + walked_tree.tokens[path].tolist() + [int(bonus)]
        target.commit(ctx)
        for _ in range(gap):  # on along the greedy path, the target alone
            row = target.logits(ctx, Tree.root_only(ctx[-1]), [0])
            ctx = ctx + [int(target.draw(row, 0.0)[0])]
            target.commit(ctx)
        draft.commit(ctx)
    target.reset(seed)
    draft.reset(seed)
    committed, nodes = committed / contexts, nodes / contexts
    return (committed[0], nodes[0]) if depths is None else (committed, nodes)


def _rows_read(target, rule, pool: Tree, root, stale, temperature: float) -> dict:
    """The rows `rule` reads, at `pool`'s first-level tokens (`Rule.select`'s arguments)."""
    tokens = pool.tokens[pool.children(0)][None]
    rows = {}
    if "root_row" in rule.reads:
        rows["root_logp"] = target.logprobs(root, tokens, temperature)[0]
    if stale is not None:
        rows["stale_logp"] = target.logprobs(stale, tokens, temperature)[0]
    return rows


def _stale_row(target, ctx: list[int]):
    """The target's row at the context less its last token (a one-token context has none)."""
    if len(ctx) < 2:
        return None
    row = target.logits(ctx[:-1], Tree.root_only(ctx[-2]), [0])
    target.commit(ctx[:-1])
    return row


def _check_depths(depths: Sequence[int], depth: int) -> list[int]:
    candidates = [int(d) for d in depths]
    if not candidates or any(not 1 <= d <= depth for d in candidates):
        raise ValueError(f"candidate depths must be 1..{depth} (--depth), got {list(depths)}")
    return candidates


def _largest_tree(rule, pool: Tree, logq: np.ndarray, budget: int, depth: int,
                  rows: dict | None = None, t0: int | None = None) -> np.ndarray:
    """`rule`'s tree of `budget` nodes from the pool's first `depth` levels (the pool a round
    of that depth drafts, since nodes are numbered level by level), with the root: sorted pool
    node indices."""
    levels = int(np.searchsorted(pool.depth, depth, side="right"))
    nodes = rule.select(pool.subtree(np.arange(levels)), logq[:levels], budget, t0=t0,
                        **(rows or {}))
    return np.union1d([0], nodes)


def auto_budget(
    target,
    draft,
    prompt_ids: Sequence[int],
    decoder: str = "fts",
    temperature: float = 0.0,
    top_k: int = 10,
    depth: int = 6,
    guesses: int = 2,
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    contexts: int = 8,
    gap: int = 4,
    repeats: int = 5,
    overlap: float | None = None,
    parts: PartTimes | None = None,
    depths: Sequence[int] | None = None,
    calibration_prompts: Sequence[Sequence[int]] | None = None,
) -> BudgetChoice:
    """The budget and pool depth that maximise predicted tokens/s for `decoder` on this pair and
    machine. `depth` is the deepest pool tried; `depths` the candidates (default 1..depth): each
    level costs a draft pass, which a shallower pool saves when deep nodes are seldom accepted.

    Times target passes against tree size and the draft's passes at the prompt (unless `parts`
    is given), predicts acceptance per depth and budget (`acceptance_curve`, at `contexts`
    contexts `gap` greedy tokens apart), and takes the best. A reply's first tokens are its
    easiest to guess: on the embedded pair's EAGLE-3 head (`draft_rank`, B=4, depth 2), three
    contexts from the reply's start predicted 2.33, 1.67 and 3.00 tokens a round on three
    prompts that committed 1.64, 1.42 and 1.88; eight 4 tokens apart, 1.75, 1.38 and 2.12.
    `calibration_prompts` spreads the contexts over several prompts (ceil(contexts / n) along
    each, the curves averaged; default: `prompt_ids` alone): how much a draft gets right differs
    from task to task, most for a draft with prompt lookup mixed in, which gains where replies
    copy. `overlap` defaults to full overlap when target and draft sit on different devices,
    none otherwise (the round loop's schedule).
    """
    if not get_decoder(decoder).drafts:
        raise ValueError(f"decoder {decoder} verifies no tree: it has no budget to pick")
    if draft is None:
        raise ValueError(f"auto budget for {decoder!r} needs a draft model")
    if len(prompt_ids) == 0:
        raise ValueError("auto budget needs a non-empty prompt to time and calibrate on")
    cap = pool_size(top_k, depth)
    budgets = sorted({int(b) for b in budgets if 1 <= int(b) <= cap}) or [cap]
    depths = sorted(set(_check_depths(range(1, depth + 1) if depths is None else depths, depth)))
    if overlap is None:
        overlap = 1.0 if target.device != draft.device else 0.0
    if parts is None:  # the deepest pool's passes cover every shallower one's
        widths = draft_pass_widths(decoder, top_k, depth, guesses) + [1, top_k]
        parts = measure_parts(target, draft, prompt_ids, target_sizes_for(budgets), widths, repeats)
    prompts = [prompt_ids] if calibration_prompts is None else list(calibration_prompts)
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("calibration_prompts must hold at least one prompt, none of them empty")
    curves = [acceptance_curve(target, draft, p, budgets, decoder, temperature, top_k, depth,
                               -(-contexts // len(prompts)), depths=depths, gap=gap)
              for p in prompts]
    committed = np.mean([c for c, _ in curves], axis=0)
    nodes = np.mean([n for _, n in curves], axis=0)
    # each (depth, budget) drafts `Decoder.pool_depth(depth, budget)` levels
    tps = np.stack([
        predicted_tokens_per_s(decoder, c, n, parts, overlap, top_k, d, guesses, budgets)
        for d, c, n in zip(depths, committed, nodes, strict=True)
    ])
    best_depth, best = best_depth_budget(depths, budgets, tps)
    return BudgetChoice(
        best,
        best_depth,
        tuple(budgets),
        tuple(depths),
        _nested(tps),
        _nested(committed),
        _nested(nodes),
        parts,
    )


def _nested(table: np.ndarray) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(map(float, row)) for row in table)
