"""How each decoder picks its round's tree: one planner per decoder, `plan(round) -> Plan`.

A planner drafts (through `targetrows.core.pool`), runs the root pass when its decoder needs the
exact root row, and applies its selection rule (`targetrows.core.select`). It never verifies:
the round loop does that, the same way for every decoder, which is what keeps them all lossless.
`targetrows.decoding.registry` maps each decoder name to its planner.
"""

from __future__ import annotations

from targetrows.core import select
from targetrows.core.pool import expand_model, expand_under_guesses, pool_under
from targetrows.core.tree import Tree

from .round import Plan, Round, root_pass_alongside, timed_draft_work


def plan_ar(r: Round) -> Plan:
    """No draft: the target alone verifies the root, i.e. takes one step."""
    return Plan([], Tree.root_only(r.context[-1]))


def _root_pool(r: Round):
    """The draft's candidate pool at the round's context (one draft pass per level); for a
    decoder whose tree is the pool's draft_rank tree, only what that tree can use
    (`DecodeConfig.pool_budget`)."""
    cfg = r.config
    cand, logq = expand_model(r.draft, r.context, cfg.top_k, cfg.pool_depth, cfg.pool_budget)
    r.stats.draft_passes += int(cand.depth.max())  # a pruned pool may stop early
    return cand, logq


def plan_draft_rank(r: Round) -> Plan:
    """EAGLE-2: the top-B pool nodes by cumulative draft log-prob; no root pass."""
    cand, logq = timed_draft_work(r, lambda: _root_pool(r))
    return Plan([], cand.subtree(select.draft_rank(cand, logq, r.config.budget)))


def plan_rerank(r: Round) -> Plan:
    """draft_rank with the first-level branches re-scored by the exact root row."""
    root_logits, (cand, logq) = root_pass_alongside(r, lambda: _root_pool(r))
    first = cand.children(0)
    first_logp = r.target.logprobs(root_logits, cand.tokens[first][None], r.config.temperature)[0]
    chosen = select.target_rerank_logp(cand, logq, r.config.budget, first_logp)
    return Plan([], cand.subtree(chosen))


def _draw_t0(r: Round, root_logits) -> int:
    return int(r.target.draw(root_logits, r.config.temperature)[0])


def _after_t0(r: Round, t0: int, tree: Tree) -> Plan:
    """Commit t0, then verify `tree` (rooted at t0); a tree without draft nodes only for its
    bonus token, unless the config leaves that row to the next round's root pass."""
    if tree.budget == 0 and not r.config.verify_empty:
        return Plan([t0], None)
    return Plan([t0], tree)


def plan_fts(r: Round) -> Plan:
    """First-token sampling (the paper's): the root pool is drafted while the root pass runs;
    t0 is drawn from the exact root row, and the tree is the top-B nodes below t0's first-level
    node of that same pool (empty when t0 is not a first-level token)."""
    cfg = r.config
    root_logits, (cand, logq) = root_pass_alongside(r, lambda: _root_pool(r))
    t0 = _draw_t0(r, root_logits)
    if t0 in cfg.stop_ids:  # nothing to draft after a stop token
        return Plan([t0], None)
    kept = select.first_token_subtree(cand, logq, cfg.budget, t0)
    return _after_t0(r, t0, select.pruned_tree(cand, kept, t0))


def plan_fts_redraft(r: Round) -> Plan:
    """First-token sampling with a pool drafted anew under t0 (an extension, not the paper's):
    while the root pass runs, the draft pre-expands pools under its likeliest first tokens; on
    a miss it drafts under t0 after."""
    cfg = r.config

    def draft_work():
        r.stats.draft_passes += cfg.pool_depth + 1
        return expand_under_guesses(r.draft, r.context, cfg.guesses, cfg.top_k, cfg.pool_depth)

    root_logits, (guessed, logq) = root_pass_alongside(r, draft_work)
    t0 = _draw_t0(r, root_logits)
    if t0 in cfg.stop_ids:  # nothing to draft after a stop token
        return Plan([t0], None)
    hit = pool_under(guessed, logq, t0)
    if hit is None:  # t0 was not among the guesses: draft under it now

        def redraft():
            r.stats.draft_passes += cfg.pool_depth
            return expand_model(r.draft, r.context + [t0], cfg.top_k, cfg.pool_depth)

        hit = timed_draft_work(r, redraft)
    cand, cand_logq = hit
    return Plan([t0], cand.subtree(select.draft_rank(cand, cand_logq, cfg.budget)))


def plan_pearl(r: Round) -> Plan:
    """PEARL: a draft_rank tree of B nodes drafted before t0 is known, pruned to t0's subtree."""
    cfg = r.config

    def draft_work():
        cand, logq = _root_pool(r)
        return cand, select.draft_rank(cand, logq, cfg.budget)

    root_logits, (cand, chosen) = root_pass_alongside(r, draft_work)
    t0 = _draw_t0(r, root_logits)
    if t0 in cfg.stop_ids:
        return Plan([t0], None)
    kept = select.prune_to_first(cand, chosen, t0)
    return _after_t0(r, t0, select.pruned_tree(cand, kept, t0))
