"""The one registry of selection rules and decoders: everything that differs between them.

A **rule** says which pool nodes a tree holds; the row-log scorer (`targetrows.rowlog.score`)
computes its expected acceptance on recorded rows. A **decoder** runs a rule online: its
planner (`targetrows.decoding.planners`) picks each round's tree, and the fields below tell the
rest of the project what it costs and needs, so the round loop, the cost model, `compare`,
`decode`, `bench`, the pipeline's GPU counts, its config schema, its tables and its figures
all read this file and nothing else names a decoder.

Adding a decoder: write its planner, add one `Decoder(...)` entry below (or call `register`
from your own code), and name it in the pipeline config (its schema lists the decoders; a test
checks that list against this registry).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from targetrows.core.pool import pool_depth

from . import planners

TREES = ("pool", "pruned", "below_t0", "redraft")


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    commits_t0: bool = False  # t0 from the root row is committed before the tree
    baseline: str | None = None  # the rule the tables compare it with (paired gains)
    paper: bool = True  # one of the paper's rules (an extension says False)
    # where the verified tree comes from (the cost model predicts acceptance from it):
    # "pool": the top nodes of the root pool; "pruned": a root-pool tree cut to t0's subtree;
    # "below_t0": the top nodes below t0's first-level node of the root pool; "redraft": a
    # pool drafted anew under t0
    tree: str = "pool"
    # the tree is the pool's top-B nodes by the draft's own scores (before any cut to t0), so
    # the pool needs only the nodes that can still enter it (`targetrows.core.pool.grow`)
    draft_ranked: bool = False

    def __post_init__(self):
        if self.tree not in TREES:
            raise ValueError(f"rule {self.name!r}: tree must be one of {TREES}, got {self.tree!r}")


@dataclass(frozen=True)
class Decoder:
    name: str
    description: str
    planner: Callable  # plan(Round) -> Plan
    rule: str | None  # the selection rule its trees follow; None for ar (no tree)
    root_pass: bool = False  # runs the separate root pass, alongside drafting
    guesses_pool: bool = False  # drafts pools under the draft's `guesses` likeliest first tokens
    # the decoder it is compared with online; a matched cap ({matched: X} in the config) is
    # the budget whose trees are as large as the baseline's at X
    baseline: str | None = None

    @property
    def drafts(self) -> bool:
        return self.rule is not None

    @property
    def commits_t0(self) -> bool:
        return self.rule is not None and get_rule(self.rule).commits_t0

    @property
    def gpus(self) -> int:
        """GPUs it can use: the root pass on the target's while the draft drafts on its own."""
        return 2 if self.root_pass else 1

    @property
    def verify_feeds(self) -> int:
        """Tokens the verify pass feeds besides the non-root nodes: the root when no root pass
        cached it (draft_rank), t0 for a decoder that commits it; none for rerank, whose root
        row the root pass already gave."""
        if not self.drafts:
            return 1
        return 1 if (self.commits_t0 or not self.root_pass) else 0

    @property
    def prunes_pool(self) -> bool:
        """Drafts a root pool cut to what its draft_rank tree of B nodes can use."""
        return self.drafts and get_rule(self.rule).draft_ranked and not self.guesses_pool

    def pool_depth(self, depth: int, budget: int) -> int:
        """Pool levels a round drafts (`targetrows.core.pool.pool_depth`)."""
        below = self.drafts and get_rule(self.rule).tree == "below_t0"
        return pool_depth(depth, budget, below_first=below)

    def draft_widths(self, top_k: int, depth: int, guesses: int = 2,
                     budget: int | None = None) -> list[int]:
        """New tokens per draft pass of one round's pool expansion: the root, then the top_k
        frontier nodes of each further level (at most B - 1 of them for a pool pruned to a
        B-node tree, `budget`); a guesses pool feeds the root, the guesses, then
        guesses * top_k frontier nodes per level."""
        if not self.drafts:
            return []
        if self.guesses_pool:
            return [1, guesses] + [guesses * top_k] * (depth - 1)
        frontier = top_k if budget is None or not self.prunes_pool else min(top_k, budget - 1)
        return [1] + [frontier] * (depth - 1)


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


def get_decoder(name: str) -> Decoder:
    if name not in DECODERS:
        raise ValueError(f"unknown decoder {name!r}: choose one of {', '.join(DECODERS)}")
    return DECODERS[name]


def get_rule(name: str) -> Rule:
    if name not in RULES:
        raise ValueError(f"unknown rule {name!r}: choose one of {', '.join(RULES)}")
    return RULES[name]


def decoder_names() -> tuple[str, ...]:
    return tuple(DECODERS)


def rule_names() -> tuple[str, ...]:
    return tuple(RULES)


for _rule in (
    Rule("draft_rank", "top-B pool nodes by cumulative draft log-prob (EAGLE-2)",
         draft_ranked=True),
    Rule("target_rerank", "draft_rank with first-level log-probs from the exact root row",
         baseline="draft_rank"),
    Rule("stale_rerank", "draft_rank with first-level log-probs from the previous context's "
         "row (inexact reuse; scoring only)", baseline="draft_rank"),
    Rule("pearl", "a B-node draft_rank tree drafted before t0, pruned to t0's subtree",
         commits_t0=True, tree="pruned", draft_ranked=True),
    Rule("first_token", "t0 from the exact root row, then the top-B nodes below t0 in the same "
         "root pool", commits_t0=True, baseline="pearl", tree="below_t0"),
    Rule("first_token_redraft", "t0 from the exact root row, then a B-node draft_rank tree from a "
         "pool drafted anew under t0 (an extension, not the paper's rule)", commits_t0=True,
         baseline="pearl", tree="redraft", paper=False),
):
    register(_rule)

for _decoder in (
    Decoder("ar", "the target alone, one token per pass", planners.plan_ar, None),
    Decoder("draft_rank", "EAGLE-2 dynamic tree", planners.plan_draft_rank, "draft_rank"),
    Decoder("rerank", "first-level branches re-scored by the root row", planners.plan_rerank,
            "target_rerank", root_pass=True),
    Decoder("fts", "first-token sampling: t0 from the root row, the budget below t0 in the "
            "root pool", planners.plan_fts, "first_token", root_pass=True, baseline="pearl"),
    Decoder("pearl", "PEARL-style: a predetermined tree pruned to t0's subtree",
            planners.plan_pearl, "pearl", root_pass=True),
    Decoder("fts_redraft", "first-token sampling with a pool drafted anew under t0 (an "
            "extension)", planners.plan_fts_redraft, "first_token_redraft", root_pass=True,
            guesses_pool=True, baseline="pearl"),
):
    register(_decoder)
