"""The round loop: one loop for every decoder; a decoder only differs in how it picks the tree.

A round (design.md): the tree is chosen under the root context (every committed token), the target
scores every node in one verify pass, verification walks the tree and commits the accepted path
plus a bonus token. `fts` and `pearl` first commit t0, drawn from the row of a separate root
pass; `rerank` uses that row to re-score first-level branches. The root pass overlaps the
draft's work when target and draft live on different devices.

The loop talks to models only through `targetrows.model.Model`, so it runs the toy pair (NumPy)
and Hugging Face models (torch) alike.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from targetrows.core import select
from targetrows.core.pool import expand_model, expand_under_guesses, pool_depth, pool_under
from targetrows.core.rows import RowStore
from targetrows.core.tree import Tree
from targetrows.core.verify import walk

DECODERS = ("ar", "draft_rank", "rerank", "fts", "pearl")
USES_ROOT_PASS = ("rerank", "fts", "pearl")


@dataclass(frozen=True)
class DecodeConfig:
    decoder: str = "fts"
    budget: int = 59  # non-root nodes per verified tree
    temperature: float = 0.0
    max_new_tokens: int = 128
    top_k: int = 10  # candidate pool: top_k children per frontier node
    depth: int = 6  # candidate pool levels
    guesses: int = 2  # fts: pools pre-expanded under the draft's likeliest t0s
    seed: int = 0
    stop_ids: frozenset[int] = frozenset()
    overlap: bool | None = None  # root pass alongside drafting; None: when on two devices

    def __post_init__(self):
        if self.decoder not in DECODERS:
            raise ValueError(f"unknown decoder {self.decoder!r}: choose one of {', '.join(DECODERS)}")
        if isinstance(self.budget, bool) or int(self.budget) != self.budget or self.budget < 1:
            raise ValueError(f"budget must be an integer >= 1, got {self.budget!r}")
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.top_k < 1 or self.depth < 1 or self.guesses < 1:
            raise ValueError("top_k, depth and guesses must be >= 1")

    @property
    def pool_depth(self) -> int:
        """Pool levels the round loop drafts (`pool.pool_depth`)."""
        return pool_depth(self.depth, self.budget)


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


@dataclass
class _Plan:
    """What a decoder hands to verification: tokens committed before the tree, and the tree."""

    prefix: list[int]
    tree: Tree


def generate(
    target: Any, draft: Any | None, prompt_ids: Sequence[int], config: DecodeConfig
) -> DecodeResult:
    """Decode from `prompt_ids` with `config.decoder`; lossless for every decoder."""
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty: it needs at least one token")
    if config.decoder != "ar" and draft is None:
        raise ValueError(f"decoder {config.decoder!r} needs a draft model")
    overlap = config.overlap
    if overlap is None:
        overlap = draft is not None and target.device is not None and target.device != draft.device
    target.reset(config.seed)
    if draft is not None:
        draft.reset(config.seed)
    context = [int(t) for t in prompt_ids]
    new: list[int] = []
    store = RowStore(max_rows=8)  # root rows, by full context: only exact hits are reused
    result = DecodeResult(tokens=new)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=1) if overlap else _NoPool() as pool:
        while True:
            t0 = time.perf_counter()
            stats = RoundStats()
            plan = _PLANNERS[config.decoder](target, draft, context, store, config, stats, pool)
            tokens = plan.prefix + _verify(target, context + plan.prefix, plan.tree, store, config, stats)
            tokens, stop_reason = _truncate(tokens, config, len(new))
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
            stats: RoundStats) -> list[int]:
    """One target pass over the tree, then the lossless walk: accepted path tokens + bonus."""
    t = time.perf_counter()
    root_logits = store.get(ctx)
    if root_logits is None:  # the verify pass yields the root row too
        draws = target.draw(target.logits(ctx, tree, range(len(tree))), config.temperature)
        stats.target_passes += 1
    else:  # exact root row from this context's root pass: only the other nodes need a pass
        draws = target.draw(root_logits, config.temperature)
        if len(tree) > 1:
            rest = target.logits(ctx, tree, range(1, len(tree)))
            draws = np.concatenate([draws, target.draw(rest, config.temperature)])
            stats.target_passes += 1
    stats.t_verify = time.perf_counter() - t
    path, bonus = walk(tree, draws)
    stats.nodes = tree.budget
    stats.accepted = len(path)
    return tree.tokens[path].tolist() + [bonus]


# -- how each decoder picks its tree ---------------------------------------------------------


def _plan_ar(target, draft, context, store, config, stats, pool) -> _Plan:
    return _Plan([], Tree.root_only(context[-1]))


def _plan_draft_rank(target, draft, context, store, config, stats, pool) -> _Plan:
    t = time.perf_counter()
    cand, logq = expand_model(draft, context, config.top_k, config.pool_depth)
    stats.draft_passes += config.pool_depth
    stats.t_draft = stats.t_drafting = time.perf_counter() - t
    return _Plan([], cand.subtree(select.draft_rank(cand, logq, config.budget)))


def _plan_rerank(target, draft, context, store, config, stats, pool) -> _Plan:
    def draft_work():
        return expand_model(draft, context, config.top_k, config.pool_depth)

    root_logits, (cand, logq) = _root_pass_alongside(target, draft, context, store, draft_work,
                                                     stats, pool)
    stats.draft_passes += config.pool_depth
    first = cand.children(0)
    first_logp = target.logprobs(root_logits, cand.tokens[first][None], config.temperature)[0]
    return _Plan([], cand.subtree(select.target_rerank_logp(cand, logq, config.budget, first_logp)))


def _plan_fts(target, draft, context, store, config, stats, pool) -> _Plan:
    def draft_work():  # pools under the draft's likeliest first tokens, while the target works
        return expand_under_guesses(draft, context, config.guesses, config.top_k, config.pool_depth)

    root_logits, (guessed, logq) = _root_pass_alongside(target, draft, context, store, draft_work,
                                                        stats, pool)
    stats.draft_passes += config.pool_depth + 1
    t0 = int(target.draw(root_logits, config.temperature)[0])
    if t0 in config.stop_ids:  # nothing to draft after a stop token
        return _Plan([t0], Tree.root_only(t0))
    hit = pool_under(guessed, logq, t0)
    if hit is None:  # t0 was not among the guesses: draft under it now
        t = time.perf_counter()
        hit = expand_model(draft, context + [t0], config.top_k, config.pool_depth)
        stats.draft_passes += config.pool_depth
        stats.t_draft += time.perf_counter() - t
        stats.t_drafting += time.perf_counter() - t
    cand, cand_logq = hit
    return _Plan([t0], cand.subtree(select.draft_rank(cand, cand_logq, config.budget)))


def _plan_pearl(target, draft, context, store, config, stats, pool) -> _Plan:
    def draft_work():  # a predetermined draft_rank tree, drafted before t0 is known
        cand, logq = expand_model(draft, context, config.top_k, config.pool_depth)
        return cand, select.draft_rank(cand, logq, config.budget)

    root_logits, (cand, chosen) = _root_pass_alongside(target, draft, context, store, draft_work,
                                                       stats, pool)
    stats.draft_passes += config.pool_depth
    t0 = int(target.draw(root_logits, config.temperature)[0])
    if t0 in config.stop_ids:
        return _Plan([t0], Tree.root_only(t0))
    kept = select.prune_to_first(cand, chosen, t0)
    return _Plan([t0], select.pruned_tree(cand, kept, t0))


_PLANNERS = {
    "ar": _plan_ar,
    "draft_rank": _plan_draft_rank,
    "rerank": _plan_rerank,
    "fts": _plan_fts,
    "pearl": _plan_pearl,
}


def _root_pass_alongside(target, draft, context, store, draft_work, stats, pool):
    """The target's root pass at `context`, with `draft_work` alongside it (or after it on one
    device). Returns the root row's logits (also put in the store) and draft_work's result."""

    def root_pass():
        t = time.perf_counter()
        logits = store.get(context)
        if logits is None:
            logits = target.logits(context, Tree.root_only(context[-1]), [0])
            target.commit(context)  # the root is now committed cache, verify feeds only the tree
            stats.target_passes += 1
        _synchronize(target)
        stats.t_root = time.perf_counter() - t
        return logits

    def timed_draft():
        t = time.perf_counter()
        out = draft_work()
        _synchronize(draft)
        stats.t_draft = time.perf_counter() - t
        return out

    t = time.perf_counter()
    future = pool.submit(timed_draft)
    root_logits = root_pass()
    drafted = future.result()
    stats.t_drafting = time.perf_counter() - t
    store.put(context, root_logits)
    return root_logits, drafted


def _synchronize(model) -> None:
    sync = getattr(model, "synchronize", None)
    if sync is not None:
        sync()


class _NoPool:
    """Runs submitted work at once, in this thread: the one-device schedule."""

    class _Done:
        def __init__(self, value):
            self._value = value

        def result(self):
            return self._value

    def submit(self, fn):
        return self._Done(fn())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
