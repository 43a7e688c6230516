"""The cost model: what a round costs on this machine given its parts, the speed each decoder
could reach with zero overhead, and the budget and pool depth with the best predicted speed.

Parts (timed by `targetrows.cost.parttimes`): a target pass over q new tokens (q = 1 is an
autoregressive step or a root pass; a verify pass feeds the tree's nodes, plus its root when
that is not cached yet) and a draft pass over w nodes (pool expansion runs one per level). A
round's zero-overhead time is its drafting (the draft passes, with the root pass alongside them
as far as the run achieved overlap) plus its verify pass; selection, the verification walk and
cache compaction count as zero. With a run's own acceptance (tokens committed, nodes verified,
draft passes per round) that gives the bound each decoder's measured speed is compared with;
with predicted acceptance (`targetrows.cost.calibration`) it gives the budget to run at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from targetrows.core.pool import PoolShape
from targetrows.decoding.registry import Decoder, get_decoder

from .parttimes import PartTimes

DEFAULT_BUDGETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def round_seconds(
    decoder: str | Decoder,
    parts: PartTimes,
    nodes,
    draft_passes,
    overlap: float,
    pool: PoolShape,
    budget: int | None = None,
    verify_empty: bool = True,
    fed_back=1,
) -> np.ndarray:
    """Zero-overhead seconds of rounds that verified `nodes` non-root nodes with `draft_passes`
    draft passes each (arrays, one entry per round), drafting pools of `pool.depth` levels.
    `overlap` in [0, 1] is the share of the shorter of drafting and the root pass hidden behind
    the other (0 on one device). `budget`: the rounds' budget, for a decoder whose pool is
    pruned to it (its passes are narrower, and a round may stop before the last level).
    `verify_empty`: as `DecodeConfig.verify_empty` (an empty tree after t0 verified for its
    bonus token). `fed_back`: tokens the previous round committed (per round, or one number),
    which the first draft pass feeds again where the draft does so (`PartTimes.draft_refeeds`:
    an EAGLE-3 head); other drafts' first pass feeds the bonus token alone."""
    entry = get_decoder(decoder)
    nodes = np.asarray(nodes, dtype=np.float64)
    if not entry.drafts:
        return np.full(nodes.shape, parts.target(1))
    if not entry.needs_draft:  # draft-free: its tree is built on the host, then verified
        return parts.target(nodes + entry.verify_feeds)
    if parts.draft is None:
        raise ValueError(f"decoder {entry.name!r} needs draft pass times")
    widths = entry.draft_widths(pool, budget)
    first = np.asarray(fed_back, dtype=np.float64) if parts.draft_refeeds else np.array(1.0)
    first = np.broadcast_to(parts.draft(np.maximum(first, 1.0)), nodes.shape)
    later = np.cumsum([0.0, *(parts.draft(w) for w in widths[1:])])
    if entry.prunes_pool:  # the passes each round took (it may stop early), at most as wide
        done = np.clip(np.asarray(draft_passes, dtype=np.int64), 0, len(widths))
        drafting = np.where(done > 0, first + later[np.maximum(done - 1, 0)], 0.0)
    else:
        drafting = first + later[-1]
    verify = parts.target(nodes + entry.verify_feeds)
    if entry.commits_t0 and not verify_empty:  # an empty tree after t0 is not verified
        verify = np.where(nodes > 0, verify, 0.0)
    if not entry.root_pass:
        return drafting + verify
    root = parts.target(1)
    before = drafting + root - overlap * np.minimum(drafting, root)
    # passes beyond the planned ones are a pool drafted under t0 after the root pass (a first
    # token the guesses missed), each level costing what a root pool's level does
    extra = np.maximum(np.asarray(draft_passes, float) - len(widths), 0.0) / pool.depth
    if np.any(extra > 0):
        level_s = sum(parts.draft(w) for w in [1] + [pool.top_k] * (pool.depth - 1))
        before = before + extra * level_s
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
    decoder: str | Decoder,
    parts: PartTimes,
    rounds,
    pool: PoolShape,
    prompt_s: float = 0.0,
    budget: int | None = None,
) -> Bound:
    """The speed `decoder` could reach with zero overhead, given its run's `rounds`
    (RoundStats: committed, nodes, draft_passes and the part times that show the overlap) on
    pools of `pool.depth` levels. `prompt_s`: seconds of the target's pass over the prompt
    beyond a one-token pass (the first round of every decoder feeds the whole prompt once; 0
    leaves it out). `budget`: the run's (see `round_seconds`)."""
    if not rounds:
        raise ValueError("bound needs at least one round")
    overlap = overlap_achieved(rounds)
    # each round's first draft pass feeds what the round before committed (the first round's
    # draft pass over the prompt is left out, as the target's is unless `prompt_s` says)
    fed_back = [1] + [r.committed for r in rounds[:-1]]
    seconds = round_seconds(decoder, parts, [r.nodes for r in rounds],
                            [r.draft_passes for r in rounds], overlap, pool, budget,
                            fed_back=fed_back)
    tps = sum(r.committed for r in rounds) / (prompt_s + float(np.sum(seconds)))
    return Bound(tps, tps * parts.target(1), overlap, float(np.mean(seconds)))


def predicted_tokens_per_s(
    decoder: str | Decoder,
    committed,
    nodes,
    parts: PartTimes,
    overlap: float,
    pool: PoolShape,
    budgets=None,
) -> np.ndarray:
    """Tokens per zero-overhead second at each candidate budget, from the tokens committed and
    nodes verified per round predicted there (a decoder that redrafts is assumed to guess t0).
    With `budgets`, each budget's pool is as deep as the round loop drafts it
    (`Decoder.pool_depth`: at most the budget), and pruned to the budget where the decoder
    prunes it."""
    nodes = np.asarray(nodes, dtype=np.float64)
    entry = get_decoder(decoder)
    caps = [None] * nodes.size if budgets is None else list(budgets)
    seconds = []
    committed = np.broadcast_to(np.asarray(committed, dtype=np.float64), nodes.shape)
    for n, c, b in zip(nodes.ravel(), committed.ravel(), caps, strict=True):
        drafted = pool if b is None else replace(pool, depth=entry.pool_depth(pool.depth, b))
        passes = len(entry.draft_widths(drafted))
        seconds.append(round_seconds(decoder, parts, [n], [passes], overlap, drafted, b,
                                     fed_back=c)[0])
    return committed / np.array(seconds).reshape(nodes.shape)


def ar_tokens_per_s(parts: PartTimes) -> float:
    """Zero-overhead tokens/s of decoding with no tree (`ar`): one target pass of one node per
    committed token, at the context and batch size `parts` were timed (or interpolated) at.
    What `auto` weighs every tree against."""
    step = float(round_seconds("ar", parts, [0], [0], 0.0, PoolShape())[0])
    if step <= 0:
        raise ValueError(f"a one-token target pass timed at {step} s: the part times are "
                         "broken; time them again")
    return 1.0 / step


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
