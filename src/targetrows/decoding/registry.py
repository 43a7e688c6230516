"""The one registry of selection rules and decoders: everything that differs between them.

A **rule** says which pool nodes a tree holds (`targetrows.core.rules`: a score per node and the
kind of tree built from it); the row-log scorer and the cost model score it from its
definition. A **decoder** runs a rule online: its planner (`targetrows.decoding.planners`, one
per kind of tree unless the entry names its own) picks each round's tree, and what the rule
needs tells the rest of the project what the decoder costs and needs. The round loop, the cost
model, `compare`, `decode`, `bench`, the pipeline's GPU counts, its config schema, its tables
and its figures all read this file, and nothing else names a decoder.

Adding a rule: write its scores in a module of `targetrows.core.rules` and add it below (or
call `register` from your own code). Adding a decoder: one `Decoder(...)` entry naming its
rule, or for a decoder without a draft model its planner and the state it keeps across rounds
(`new_state`; `racer` and `recycle`); name it in the pipeline config (its schema lists the
decoders; a test checks that list against this registry).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from targetrows.core.pool import PoolShape, pool_depth
from targetrows.core.rules import after_t0, learned, root_pool, sequoia_model
from targetrows.core.rules.rule import Rule

from . import planners


@dataclass(frozen=True)
class RoundShape:
    """The dearest round a decoder can run at one budget, pass by pass: what a bound on a
    decode job's time prices (`targetrows.cost.job_time`)."""

    verify_nodes: int  # tokens its verify pass feeds at most: the tree's nodes, the root or t0
    root_pass: bool  # a root pass besides
    draft_widths: tuple[int, ...]  # new tokens of each draft pass, in order (first: the root)
    committed: int  # tokens a round commits at most (what a draft that refeeds them feeds first)


@dataclass(frozen=True)
class Decoder:
    name: str
    description: str
    # the selection rule its trees follow; None for ar (no tree) and the draft-free decoders
    # (their trees come from their state, not from a draft's pool)
    rule: str | None
    # the decoders it is compared with online, condition by condition; a matched cap
    # ({matched: X} in the config) is the budget whose trees are as large as the first one's at X
    baselines: tuple[str, ...] = ()
    planner: Callable | None = None  # plan(Round) -> Passes[Plan]; None: its rule's kind of tree's
    # a draft-free decoder's state across rounds, made once per decode:
    # new_state(vocab_size, DecodeConfig) -> targetrows.core.recycle.Recycler
    new_state: Callable | None = None
    # a published method ours are compared with in the tables (docs/prior-art.md)
    prior_art: bool = False

    @property
    def baseline(self) -> str | None:
        """The baseline a matched cap matches its trees to (the first of `baselines`)."""
        return self.baselines[0] if self.baselines else None

    @property
    def plan(self) -> Callable:
        if self.planner is not None:
            return self.planner
        return planners.PLANNERS[get_rule(self.rule).tree]

    def _rule(self) -> Rule | None:
        return None if self.rule is None else get_rule(self.rule)

    @property
    def drafts(self) -> bool:
        """Verifies a tree of at most a budget's nodes each round (every decoder but ar): it
        has a budget, and its budget conditions."""
        return self.rule is not None or self.new_state is not None

    @property
    def needs_draft(self) -> bool:
        """Drafts with a draft model: every tree decoder but the draft-free ones, whose trees
        grow from the target's own past rows."""
        return self.rule is not None

    @property
    def commits_t0(self) -> bool:
        rule = self._rule()
        return rule is not None and rule.commits_t0

    @property
    def learned(self) -> bool:
        """Its rule scores with a trained model (`DecodeConfig.reranker`)."""
        rule = self._rule()
        return rule is not None and rule.learned

    @property
    def root_pass(self) -> bool:
        """Runs the separate root pass, alongside drafting (for t0 or the exact root row)."""
        rule = self._rule()
        return rule is not None and rule.needs_root_pass

    @property
    def guesses_pool(self) -> bool:
        """Drafts pools under the draft's `guesses` likeliest first tokens (a redraft)."""
        rule = self._rule()
        return rule is not None and rule.tree == "redraft"

    @property
    def ours(self) -> bool:
        """One of the rules this project proposes (a rule with baselines, not prior art): the
        tables compare it with every prior-art decoder and rule."""
        rule = self._rule()
        return rule is not None and bool(rule.baselines) and not self.prior_art

    @property
    def gpus(self) -> int:
        """GPUs it can use: the root pass on the target's while the draft drafts on its own."""
        return 2 if self.root_pass else 1

    @property
    def verify_feeds(self) -> int:
        """Tokens the verify pass feeds besides the non-root nodes: the root when no root pass
        cached it (draft_rank, the draft-free decoders), t0 for a decoder that commits it; none
        for rerank, whose root row the root pass already gave."""
        if not self.drafts:
            return 1
        return 1 if (self.commits_t0 or not self.root_pass) else 0

    @property
    def prunes_pool(self) -> bool:
        """Drafts a root pool cut to what its draft_rank tree of B nodes can use."""
        rule = self._rule()
        return rule is not None and rule.draft_ranked

    def pool_depth(self, depth: int, budget: int) -> int:
        """Pool levels a round drafts (`targetrows.core.pool.pool_depth`)."""
        rule = self._rule()
        below = rule is not None and rule.tree == "below_t0"
        return pool_depth(depth, budget, below_first=below)

    def draft_widths(self, pool: PoolShape, budget: int | None = None) -> list[int]:
        """New tokens per draft pass of one round's expansion of a pool of `pool.depth` levels:
        the root, then the top_k frontier nodes of each further level (at most B - 1 of them
        for a pool pruned to a B-node tree, `budget`); a guesses pool feeds the root, the
        guesses, then guesses * top_k frontier nodes per level; none without a draft model."""
        if not self.needs_draft:
            return []
        k, depth = pool.top_k, pool.depth
        if self.guesses_pool:
            return [1, pool.guesses] + [pool.guesses * k] * (depth - 1)
        frontier = k if budget is None or not self.prunes_pool else min(k, budget - 1)
        return [1] + [frontier] * (depth - 1)


    def worst_round(self, pool: PoolShape, budget: int | None) -> RoundShape:
        """Its dearest round at `budget` from a pool of `pool`'s shape: the largest tree with
        the root or t0, the root pass, every level of the pool it drafts at its widest
        (`draft_widths`) and, for a decoder drafting under guesses of t0, the pool it drafts
        under t0 after a miss; the most tokens a round commits (the path, the bonus, t0)."""
        if not self.drafts:
            return RoundShape(1, False, (), 1)
        levels = self.pool_depth(pool.depth, budget)
        widths = self.draft_widths(replace(pool, depth=levels), budget)
        if self.guesses_pool:  # the guesses missed t0: a pool drafted under it, level by level
            widths += [1] + [pool.top_k] * (levels - 1)
        path = min(budget, levels) if self.needs_draft else budget
        return RoundShape(budget + self.verify_feeds, self.root_pass, tuple(widths),
                          path + 1 + int(self.commits_t0))

    def pass_widths(self, pool: PoolShape, budget: int | None) -> set[int]:
        """The token counts its passes feed at their widest (`worst_round`): its verify
        pass's and each draft pass's; a root pass feeds one."""
        shape = self.worst_round(pool, budget)
        return {shape.verify_nodes, *shape.draft_widths} | ({1} if shape.root_pass else set())


RULES: dict[str, Rule] = {}
DECODERS: dict[str, Decoder] = {}


def register(entry: Rule | Decoder) -> None:
    """Add a rule or a decoder (a name already taken raises)."""
    table = RULES if isinstance(entry, Rule) else DECODERS
    if entry.name in table:
        raise ValueError(f"{type(entry).__name__.lower()} {entry.name!r} is already registered")
    if isinstance(entry, Decoder) and entry.rule is not None and entry.rule not in RULES:
        raise ValueError(f"decoder {entry.name!r} names rule {entry.rule!r}, which is not "
                         f"registered (rules: {', '.join(RULES)})")
    table[entry.name] = entry


def unregister(name: str) -> None:
    """Remove a decoder or rule added by `register` (tests use it to clean up)."""
    DECODERS.pop(name, None) or RULES.pop(name, None)


def get_decoder(name: str | Decoder) -> Decoder:
    """A decoder's entry by name (an entry is returned as it is)."""
    if isinstance(name, Decoder):
        return name
    if name not in DECODERS:
        raise ValueError(f"unknown decoder {name!r}: choose one of {', '.join(DECODERS)}")
    return DECODERS[name]


def get_rule(name: str) -> Rule:
    if name not in RULES:
        raise ValueError(f"unknown rule {name!r}: choose one of {', '.join(RULES)}")
    return RULES[name]


def decoder_names(learned: bool = True) -> tuple[str, ...]:
    """Every registered decoder; without the ones that need a trained reranker when `learned`
    is False (what runs by default when none is given)."""
    return tuple(n for n, d in DECODERS.items() if learned or not d.learned)


def rule_names(learned: bool = True) -> tuple[str, ...]:
    """Every registered rule; without the learned ones when `learned` is False."""
    return tuple(n for n, r in RULES.items() if learned or not r.learned)


def pass_widths(decoders, pool: PoolShape, budgets) -> tuple[int, ...]:
    """Every token count the passes of `decoders` at `budgets` feed at their widest, in
    order: the widths a static pass's buckets should hold (`targetrows.hf.graphs`)."""
    return tuple(sorted({w for name in decoders for budget in budgets
                         for w in get_decoder(name).pass_widths(pool, budget)}))


def draft_free_decoders() -> tuple[str, ...]:
    """The decoders whose trees grow from their own state, without a draft (`new_state`)."""
    return tuple(n for n, d in DECODERS.items() if d.new_state is not None)


def prior_art_decoders() -> tuple[str, ...]:
    """The decoders of published methods the tables compare ours with (`Decoder.prior_art`)."""
    return tuple(n for n, d in DECODERS.items() if d.prior_art)


for _rule in (root_pool.draft_rank, root_pool.target_rerank, root_pool.stale_rerank,
              after_t0.pearl, after_t0.first_token, after_t0.first_token_redraft,
              learned.learned_rerank, learned.learned_stale_rerank, sequoia_model.sequoia):
    register(_rule)

for _decoder in (
    Decoder("ar", "the target alone, one token per pass", None, planner=planners.plan_ar),
    Decoder("draft_rank", "EAGLE-2 dynamic tree", "draft_rank"),
    Decoder("rerank", "first-level branches re-scored by the root row", "target_rerank",
            baselines=("draft_rank",)),
    Decoder("fts", "first-token sampling: t0 from the root row, the budget below t0 in the "
            "root pool", "first_token", baselines=("pearl", "draft_rank")),
    Decoder("pearl", "PEARL-style: a predetermined tree pruned to t0's subtree", "pearl"),
    Decoder("fts_redraft", "first-token sampling with a pool drafted anew under t0 (an "
            "extension)", "first_token_redraft", baselines=("pearl",)),
    Decoder("lrerank", "first-level branches scored by a reranker trained on row logs, with the "
            "root row (an extension)", "learned_rerank", baselines=("rerank",)),
    Decoder("lrerank_stale", "first-level branches scored by a reranker trained on row logs, "
            "without a root pass (an extension)", "learned_stale_rerank",
            baselines=("draft_rank",)),
    Decoder("sequoia", "Sequoia's optimal tree shape for an acceptance vector fitted on row "
            "logs, filled from the draft's pool (prior art)", "sequoia",
            baselines=("draft_rank",), prior_art=True),
    Decoder("racer", "draft-free: n-gram continuations of the history, then the target's "
            "recycled top-k rows, breadth-first (RACER; prior art)", None,
            planner=planners.plan_recycle, new_state=planners.racer_state, prior_art=True),
    Decoder("recycle", "draft-free: the target's recycled top-k rows through a static tree "
            "(Token Recycling; prior art)", None, planner=planners.plan_recycle,
            new_state=planners.recycle_state, prior_art=True),
):
    register(_decoder)
