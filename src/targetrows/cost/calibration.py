"""Calibration: what the decoders would accept on this pair and machine, measured on a few
contexts of the target's own greedy path, and the budget and pool depth it makes fastest.

`acceptance_curve` is a small recording scored by the decoder's own rule (`Rule.expected`, as
the row-log scorer scores a row log); `auto_budget` times the target's and the draft's passes
on this machine (`targetrows.cost.parttimes`), predicts tokens/s for every candidate budget and
depth (`targetrows.cost.rounds`) and for no tree at all (`ar`, one target pass per token), and
takes the best.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from targetrows.core.acceptance import reach_probability
from targetrows.core.pool import PoolShape, expand_model
from targetrows.core.rows import greedy
from targetrows.core.rules.batch import PoolBatch, stack_pools
from targetrows.core.rules.root_pool import draft_rank
from targetrows.core.tree import Tree
from targetrows.core.verify import walk
from targetrows.decoding.budget import NO_TREE, NO_TREE_TEXT, condition_text
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.model import edge_probs, overlaps
from targetrows.decoding.registry import get_rule

from .draft_free import draft_free_curves
from .parttimes import (
    PartTimes,
    draft_sizes_for,
    mean_context_len,
    measure_parts,
    target_sizes_for,
    timing_context,
)
from .rounds import DEFAULT_BUDGETS, ar_tokens_per_s, best_depth_budget, predicted_tokens_per_s


@dataclass(frozen=True)
class BudgetSearch:
    """What `auto_budget` tries, and how it calibrates."""

    budgets: tuple[int, ...] = DEFAULT_BUDGETS  # candidates (those above the pool's size drop)
    depths: tuple[int, ...] | None = None  # candidate pool depths; None: 1..pool.depth
    contexts: int = 8  # calibration contexts in all, spread over the calibration prompts
    gap: int = 4  # greedy target tokens from one context to the next along a prompt's path
    repeats: int = 5  # timings per pass size


@dataclass(frozen=True)
class BudgetChoice:
    """`auto_budget`'s pick and its predictions: `tokens_per_s`, `committed` and `nodes` hold one
    tuple per candidate depth (in `depths` order), each with one value per candidate budget.
    `budget` and `depth` are the best tree's; `condition()` is the pick, which is no tree when
    `ar_tokens_per_s` is at least the best tree's."""

    budget: int  # the best tree's budget
    depth: int  # the best tree's pool depth (`PoolShape.depth`)
    budgets: tuple[int, ...]
    depths: tuple[int, ...]
    tokens_per_s: tuple[tuple[float, ...], ...]  # predicted, [depth][budget]
    committed: tuple[tuple[float, ...], ...]  # predicted tokens per round
    nodes: tuple[tuple[float, ...], ...]  # predicted non-root nodes verified per round
    parts: PartTimes  # as timed (`PartTimes.at` gives them at any context)
    context_len: int  # the mean context the predictions are for
    overlap: float  # share of the root pass hidden behind drafting, as predicted
    batch_size: int = 1  # sequences decoded at once, as timed (tokens/s are per sequence)
    # no tree (ar: one target pass of one node per token) from the same part times; None: not
    # weighed (a tree is picked)
    ar_tokens_per_s: float | None = None

    @property
    def tree_tokens_per_s(self) -> float:
        """Predicted tokens/s of the best tree."""
        return self.at_depth(self.depth)[self.budgets.index(self.budget)]

    @property
    def no_tree(self) -> bool:
        """Whether no tree is the pick: no (budget, depth) is predicted faster than ar (a tie
        goes to ar, which drafts nothing)."""
        return self.ar_tokens_per_s is not None and self.ar_tokens_per_s >= self.tree_tokens_per_s

    @property
    def predicted_tokens_per_s(self) -> float:
        """Predicted tokens/s of the pick: never below ar's."""
        return self.ar_tokens_per_s if self.no_tree else self.tree_tokens_per_s

    def condition(self) -> tuple[int, int]:
        """(budget, depth) to decode at: the best tree's, or (NO_TREE, NO_TREE) as ar's answers
        record it."""
        return (NO_TREE, NO_TREE) if self.no_tree else (self.budget, self.depth)

    def picked(self) -> tuple[float, float]:
        """(tokens committed, nodes verified) per round predicted at the best tree."""
        at = self.depths.index(self.depth), self.budgets.index(self.budget)
        return self.committed[at[0]][at[1]], self.nodes[at[0]][at[1]]

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
        batch = "" if self.batch_size == 1 else f" per sequence at batch size {self.batch_size}"
        ar = "" if self.ar_tokens_per_s is None else f"; ar (no tree): {self.ar_tokens_per_s:.1f}"
        tree = condition_text(self.budget, self.depth)
        pick = f"{NO_TREE_TEXT} (best tree: {tree})" if self.no_tree else tree
        return (
            f"budget auto -> {pick} (predicted tokens/s{batch} by budget at depth {self.depth}: "
            f"{curve}; best predicted tokens/s by depth: {best}{ar})"
        )


def acceptance_curve(
    target,
    draft,
    prompt_ids: Sequence[int],
    budgets: Sequence[int],
    config: DecodeConfig,
    contexts: int = 3,
    depths: Sequence[int] | None = None,
    gap: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens committed per round, nodes verified per round) predicted at each budget for
    `config`'s decoder, temperature and pool (seeded by `config.seed`): arrays [len(budgets)]
    for a pool of `config.pool.depth` levels, or with `depths` (candidate pool depths, each
    1..that) arrays [len(depths), len(budgets)].

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
    them); a redrafted tree is predicted as the rule's tree at the root, plus t0. A shape
    rule's trees (Sequoia's) are not nested from budget to budget: the union holds each
    budget's, and each is shaped again on it, where every node keeps its rank among its
    siblings (every tree in the union holds a node's better-ranked siblings with it).
    """
    rule = get_rule(config.decoder.rule)
    budgets = np.asarray(budgets, dtype=np.int64)
    depth = config.pool.depth
    candidates = [depth] if depths is None else _check_depths(depths, depth)
    ctx = [int(t) for t in prompt_ids]
    target.reset(config.seed)
    draft.reset(config.seed)
    committed = np.zeros((len(candidates), len(budgets)))
    nodes = np.zeros((len(candidates), len(budgets)))
    for _ in range(contexts):
        acc, verified, ctx = _at_context(target, draft, rule, ctx, budgets, candidates, config)
        committed += acc
        nodes += verified
        for _ in range(gap):  # on along the greedy path, the target alone
            row = target.logits(ctx, Tree.root_only(ctx[-1]), [0])
            ctx = ctx + [int(target.draw(row, 0.0)[0])]
            target.commit(ctx)
        draft.commit(ctx)
    target.reset(config.seed)
    draft.reset(config.seed)
    committed, nodes = committed / contexts, nodes / contexts
    return (committed[0], nodes[0]) if depths is None else (committed, nodes)


def _at_context(target, draft, rule, ctx: list[int], budgets: np.ndarray,
                candidates: list[int], config: DecodeConfig):
    """(tokens committed, nodes verified) [len(candidates), len(budgets)] predicted at one
    context from one pass over the union of the largest trees (see `acceptance_curve`), and the
    context the deepest draft_rank tree's round moves on to."""
    largest, deepest, temperature = int(budgets.max()), max(candidates), config.temperature
    stale = _stale_row(target, ctx) if "stale_row" in rule.reads else None
    cand, logq = expand_model(draft, ctx, config.pool.top_k, deepest)
    root = None
    if rule.needs_root_pass:  # the rule's own trees need its rows (and t0) first
        root = target.logits(ctx, Tree.root_only(ctx[-1]), [0])
    rows = _rows_read(target, rule, cand, root, stale, temperature)
    t0 = int(target.draw(root, 0.0)[0]) if rule.commits_t0 else None
    walked = _largest_tree(draft_rank, cand, logq, largest, deepest)
    # a shape rule's trees need not be nested: every budget's, else the largest holds them all
    sizes = budgets.tolist() if rule.shape is not None else [largest]
    union = functools.reduce(np.union1d, [
        tree for d in set(candidates) for tree in (
            _largest_tree(draft_rank, cand, logq, largest, d),
            *(_largest_tree(rule, cand, logq, b, d, rows, t0, config.reranker) for b in sizes))])
    tree, tlogq = cand.subtree(union), logq[union]
    everywhere = np.arange(len(tree))  # every node's row: the walk may end at a leaf
    logits = target.logits(ctx, tree, everywhere)
    draws = target.draw(logits, 0.0)
    if greedy(temperature):  # an edge is taken when it is the target's argmax
        edge = np.ones(len(tree))
        edge[1:] = draws[tree.parents[1:]] == tree.tokens[1:]
    else:
        edge = edge_probs(target, logits, everywhere, tree, temperature)
    reach = reach_probability(tree, edge)
    pools = PoolBatch.of_pool(tree, tlogq, reranker=config.reranker,
                              **_rows_read(target, rule, tree, root, stale, temperature))
    # depth d's pool: the union's nodes of depth <= d (level by level: a prefix)
    cuts = [int(np.searchsorted(tree.depth, d, side="right")) for d in candidates]
    batch = stack_pools([pools.truncated(c) for c in cuts])
    # the union holds only some of each depth's pool: a shape rule reads the depth from here
    batch = dataclasses.replace(batch, levels=np.asarray(candidates))
    width = batch.shape[1]
    reach_at = np.stack([np.where(np.arange(width) < c, reach[:width], 0.0) for c in cuts])
    # t0 takes each first-level node with the root row's probability: that node's reach
    acc, verified = rule.expected(batch, reach_at, budgets, reach_at if rule.commits_t0 else None)
    # the deepest draft_rank tree's round alone moves on
    walked_tree = cand.subtree(walked)
    path, bonus = walk(walked_tree, draws[np.searchsorted(union, walked)])
    ctx = ctx + walked_tree.tokens[path].tolist() + [int(bonus)]
    target.commit(ctx)
    return acc + (2 if rule.commits_t0 else 1), verified, ctx


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
                  rows: dict | None = None, t0: int | None = None,
                  reranker=None) -> np.ndarray:
    """`rule`'s tree of `budget` nodes from the pool's first `depth` levels (the pool a round
    of that depth drafts, since nodes are numbered level by level), with the root: sorted pool
    node indices."""
    levels = int(np.searchsorted(pool.depth, depth, side="right"))
    nodes = rule.select(pool.subtree(np.arange(levels)), logq[:levels], budget, t0=t0,
                        reranker=reranker, **(rows or {}))
    return np.union1d([0], nodes)


def _curves(target, draft, config: DecodeConfig, prompts: list[list[int]],
            configs: Sequence[DecodeConfig], budgets, depths, search: BudgetSearch):
    """(committed, nodes) per depth and budget, predicted along the prompts: by the draft's
    acceptance (`_mean_curves`), or for a draft-free decoder by its runs
    (`draft_free_curves`), whose trees grow with what the run has seen: along each prompt as
    far as runs go."""
    if config.decoder.needs_draft:
        return _mean_curves(target, draft, prompts, configs, budgets, depths, search)
    tokens = max(config.max_new_tokens, -(-search.contexts // len(prompts)) * (search.gap + 1))
    return draft_free_curves(target, prompts, configs, budgets, tokens)


def _check_auto(entry, draft, prompts: list[list[int]]) -> None:
    """`auto_budget`'s arguments: a decoder with a tree, its draft, prompts to calibrate on."""
    if not entry.drafts:
        raise ValueError(f"decoder {entry.name} verifies no tree: it has no budget to pick")
    if entry.needs_draft and draft is None:
        raise ValueError(f"auto budget for {entry.name!r} needs a draft model")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("auto budget needs prompts to time and calibrate on, none of them empty")


def auto_budget(
    target,
    draft,
    config: DecodeConfig,
    prompts: Sequence[Sequence[int]],
    search: BudgetSearch = BudgetSearch(),
    parts: PartTimes | None = None,
    prompt_configs: Sequence[DecodeConfig] | None = None,
    context_len: int | None = None,
) -> BudgetChoice:
    """The budget and pool depth that maximise predicted tokens/s for `config`'s decoder and
    temperature on this pair and machine; `config.pool.depth` is the deepest pool tried. Each
    level costs a draft pass, which a shallower pool saves when deep nodes are seldom accepted.
    No tree (`ar`) is predicted from the same part times (`rounds.ar_tokens_per_s`): where no
    tree beats it, the pick is no tree (`BudgetChoice.condition`), as at large batch sizes,
    where a verify pass of N x n nodes costs much more than one of N nodes.

    At `config.batch_size` N above 1 the passes are timed batched (`measure_parts`), and the
    pick is the best predicted tokens/s per sequence at that batch size (so the best
    throughput: N times that).

    Times target passes against tree size and the draft's passes at `context_len` cached tokens
    (default: the prompts' mean length plus half `config.max_new_tokens`, the mean context of
    runs like them; `parts` given: those times, at that context), predicts acceptance per
    depth and budget (`acceptance_curve`, at `search.contexts` contexts in all,
    ceil(contexts / len(prompts)) along each prompt,
    `search.gap` greedy tokens apart; the prompts' curves averaged; a draft-free decoder's by
    `draft_free_curves`, along each prompt as far as its runs go), and takes the best. How
    much a draft gets right differs from prompt to prompt and task to task (most for a draft
    with prompt lookup mixed in, which gains where replies copy), hence several prompts. The
    root pass overlaps drafting as `config.overlap` says (None: when target and draft sit on
    different devices, the round loop's schedule). `prompt_configs`: each prompt's own config
    (a learned rule's fold model that never saw that prompt), `config` otherwise.
    """
    entry, prompts = config.decoder, [list(p) for p in prompts]
    _check_auto(entry, draft, prompts)
    pool = config.pool
    budgets, depths = _candidates(entry, pool, search)
    overlap = overlaps(target, draft, config.overlap)
    if context_len is None:
        context_len = mean_context_len([len(p) for p in prompts], config.max_new_tokens)
    if parts is None:
        parts = _time_parts(target, draft, entry, pool, prompts, context_len, budgets, search,
                            config.batch_size)
    timed, parts = parts, parts.at(context_len)
    committed, nodes = _curves(target, draft, config, prompts,
                               prompt_configs or [config] * len(prompts), budgets, depths, search)
    # each (depth, budget) drafts `Decoder.pool_depth(depth, budget)` levels
    tps = np.stack([
        predicted_tokens_per_s(entry, c, n, parts, float(overlap),
                               replace(pool, depth=d), budgets)
        for d, c, n in zip(depths, committed, nodes, strict=True)
    ])
    best_depth, best = best_depth_budget(depths, budgets,
                                         np.where(_fits(entry, pool, depths, budgets), tps, -np.inf))
    return BudgetChoice(best, best_depth, tuple(budgets), tuple(depths), _nested(tps),
                        _nested(committed), _nested(nodes), timed, context_len, float(overlap),
                        config.batch_size, ar_tokens_per_s(parts))


def _time_parts(target, draft, entry, pool, prompts, context_len: int, budgets, search,
                batch_size: int):
    """Part times for every candidate: target passes of each budget's tree sizes and the
    deepest pool's draft passes (which cover every shallower one's), at `context_len`, batched
    at `batch_size` sequences."""
    widths = draft_sizes_for(entry.draft_widths(pool) + [pool.top_k],
                             pool.depth + 1 + entry.commits_t0)
    return measure_parts(target, draft if entry.needs_draft else None,
                         timing_context(prompts, context_len), target_sizes_for(budgets),
                         widths, search.repeats, batch_size=batch_size)


def _fits(entry, pool, depths, budgets) -> np.ndarray:
    """(depth, budget) -> whether the budget fits that depth's pool. A budget above a shallow
    pool's size caps nothing: it is that pool at a smaller budget, so it is not a candidate.
    The smallest budget stays, in case none fits."""
    sizes = np.array([replace(pool, depth=d).size if entry.needs_draft else max(budgets)
                      for d in depths])
    fits = np.asarray(budgets)[None, :] <= sizes[:, None]
    fits[:, 0] = True
    return fits


def candidate_budgets(pool: PoolShape, budgets=DEFAULT_BUDGETS) -> tuple[int, ...]:
    """The budgets `auto` tries: those of `budgets` that fit the pool (else the pool's size)."""
    return tuple(sorted({int(b) for b in budgets if 1 <= int(b) <= pool.size})) or (pool.size,)


def _candidates(entry, pool, search: BudgetSearch) -> tuple[list[int], list[int]]:
    """The budgets and pool depths tried: those of the search that fit the pool. A draft-free
    decoder drafts no pool, but tries the same budgets, so that `auto` compares it with the
    pool decoders at budgets they could pick too, and one depth, the setting's (recorded, not
    used)."""
    budgets = list(candidate_budgets(pool, search.budgets))
    if not entry.needs_draft:
        return budgets, [pool.depth]
    depths = sorted(set(_check_depths(search.depths or range(1, pool.depth + 1), pool.depth)))
    return budgets, depths


def _mean_curves(target, draft, prompts, configs, budgets, depths, search: BudgetSearch):
    """(committed, nodes) [depths, budgets] predicted along each prompt with its own config
    (`acceptance_curve`, the search's contexts shared out among them), averaged."""
    if len(configs) != len(prompts):
        raise ValueError(f"{len(configs)} prompt configs for {len(prompts)} prompts")
    curves = [acceptance_curve(target, draft, p, budgets, c,
                               -(-search.contexts // len(prompts)), depths, search.gap)
              for p, c in zip(prompts, configs, strict=True)]
    return np.mean([c for c, _ in curves], axis=0), np.mean([n for _, n in curves], axis=0)


def _nested(table: np.ndarray) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(map(float, row)) for row in table)
