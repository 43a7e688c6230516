"""How a decoder picks its round's tree: one planner per kind of tree (`Rule.tree`),
`plan(round) -> Plan`, and one for the draft-free decoders (`plan_recycle`).

A planner drafts (through `targetrows.core.pool`), runs the root pass when its rule needs the
exact root row or a first token t0, hands its rule the rows it reads, and applies the rule's
selection (`Rule.select`). It is written as steps (a generator) that ask for their model passes
(`targetrows.core.passes`), so one code serves a sequence decoded alone and in a batch. A
draft-free planner grows its tree from the target's own past rows instead
(`targetrows.core.recycle`). It never verifies: the round loop does that, the same way for
every decoder, which is what keeps them all lossless. `targetrows.decoding.registry` maps each
decoder to its rule, and so to its planner.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from targetrows.core.passes import Passes, no_passes, run_now
from targetrows.core.pool import (
    PoolRead,
    drafts_full_depth,
    guessed_pools_read_later,
    pool_passes,
    pool_passes_read_later,
    pool_under,
)
from targetrows.core.recycle import TOKEN_RECYCLING_TEMPLATE, Recycler
from targetrows.core.rules.root_pool import root_row_scores
from targetrows.core.rules.rule import draft_scores, tree_after_t0
from targetrows.core.tree import Tree

from .round import Plan, Round, root_pass_alongside, timed_draft_work
from .timing import stamp


def plan_ar(r: Round) -> Passes[Plan]:
    """No draft: the target alone verifies the root, i.e. takes one step."""
    return no_passes(Plan([], Tree.root_only(r.context[-1])))


def _root_pool(r: Round) -> Passes:
    """The draft's candidate pool at the round's context (one draft pass per level); for a
    decoder whose tree is the pool's draft_rank tree, only what that tree can use
    (`DecodeConfig.pool_budget`). Returns a function that gives it (`_read_pool`): on a GPU
    it comes with the device's next read."""
    cfg = r.config
    return (yield from pool_passes_read_later(r.draft, r.context, cfg.pool.top_k,
                                              cfg.pool_depth, cfg.pool_budget))


def _read_pool(r: Round, read: PoolRead) -> tuple[Tree, np.ndarray]:
    """The root pool `_root_pool` drafted, its draft passes counted."""
    cand, logq = read()
    _count_pool_passes(r, cand)
    return cand, logq


def _count_pool_passes(r: Round, cand: Tree) -> None:
    # a pruned pool may stop early, except one grown on a GPU
    cfg = r.config
    r.stats.draft_passes += cfg.pool_depth if drafts_full_depth(r.draft) else int(cand.depth.max())


# the scores by which a device can choose a root-pool tree (`targetrows.hf.device_tree`): the
# draft's own (draft_rank), or with the first level's from the exact root row (target_rerank)
DEVICE_SCORES = (draft_scores, root_row_scores)


def _chosen_on_device(r: Round, read: PoolRead, root_logits):
    """The rule's tree chosen where the draft's pool is, not read yet
    (`targetrows.hf.device_tree`): the verify pass is fed from there, and the pool comes to
    the host with its draws, one read a round. None where the pool is read anyway (a draft
    that grows it on the host), or the rule or the target cannot."""
    rule, budget = r.rule, r.config.budget
    if (read.choose is None or rule.tree != "pool" or rule.shape is not None
            or rule.scores not in DEVICE_SCORES or budget < 1
            or getattr(r.target, "tree_on_device_passes", None) is None):
        return None
    rescore = None
    if rule.scores is root_row_scores:
        temperature = r.config.temperature

        def rescore(tokens):  # the root row's log-probs at the first level's tokens
            return r.target.logprobs_on_device(root_logits, tokens, temperature)

    def select(cand: Tree, logq: np.ndarray, root_logp: np.ndarray | None = None) -> np.ndarray:
        _count_pool_passes(r, cand)
        return rule.select(cand, logq, budget, root_logp=root_logp)

    return read.choose(budget, select, rescore)


def _rows_read(r: Round, read: PoolRead, root_logits) -> Callable[[Tree], dict]:
    """The rows the rule re-scores with, their log-probs (temperature 0 read as 1) at the
    pool's first-level tokens: the root pass's exact row, and the stale row, the target's row
    at the previous context that the last verify pass left in the store (none at a decoding's
    first round). Returns a function of the read pool that gives them ({} for a rule that
    reads none). Both rows in one read; where the pool is still on the device, that read is
    queued now, to come with the pool's."""
    rows = {}
    if "root_row" in r.rule.reads:
        rows["root_logp"] = root_logits
    if "stale_row" in r.rule.reads and len(r.context) >= 2:
        stale = r.store.get(r.context[:-1])
        if stale is not None:
            rows["stale_logp"] = stale
    if not rows:
        return lambda cand: {}
    temperature = r.config.temperature
    later = getattr(r.target, "logprobs_read_later", None)
    if read.first_level is not None and later is not None:
        value = later(tuple(rows.values()), read.first_level, temperature)
        return lambda cand: dict(zip(rows, value(), strict=True))

    def at(cand: Tree) -> dict:
        tokens = cand.tokens[cand.children(0)][None]
        logp = r.target.logprobs(tuple(rows.values()), tokens, temperature)
        return dict(zip(rows, logp, strict=True))
    return at


def plan_pool(r: Round) -> Passes[Plan]:
    """The root pool's top-B nodes by the rule's scores; the root pass runs alongside drafting
    when the rule reads the exact root row (rerank), not otherwise (EAGLE-2's draft_rank)."""
    root_logits = None
    if r.rule.needs_root_pass:
        root_logits, read = yield from root_pass_alongside(r, _root_pool(r))
    else:
        read = yield from timed_draft_work(r, _root_pool(r))
    chosen = _chosen_on_device(r, read, root_logits)
    if chosen is not None:
        return Plan([], None, on_device=chosen)
    rows = _rows_read(r, read, root_logits)
    cand, logq = _read_pool(r, read)  # on a GPU the rows come with it: one wait
    chosen = r.rule.select(cand, logq, r.config.budget, reranker=r.config.reranker,
                           **rows(cand))
    return Plan([], cand.subtree(chosen))


def _draw_t0(r: Round, root_logits) -> int:
    return int(r.target.draw(root_logits, r.config.temperature)[0])


def plan_after_t0(r: Round) -> Passes[Plan]:
    """First-token sampling and PEARL: the root pool is drafted while the root pass runs; t0 is
    drawn from the exact root row and committed, and the rule keeps the nodes it verifies
    after t0 (first_token: the top-B below t0; pearl: the top-B tree pruned to t0's subtree).
    A tree without draft nodes is verified only for its bonus token, unless the config leaves
    that row to the next round's root pass. On a GPU the pool is read with t0: one wait."""
    cfg = r.config
    root_logits, read = yield from root_pass_alongside(r, _root_pool(r))
    rows = _rows_read(r, read, root_logits)
    t0 = _draw_t0(r, root_logits)
    cand, logq = _read_pool(r, read)  # read before anything else: the draft adopts its nodes
    if t0 in cfg.stop_ids:  # nothing to draft after a stop token
        return Plan([t0], None)
    kept = r.rule.select(cand, logq, cfg.budget, t0=t0, **rows(cand))
    tree = tree_after_t0(cand, kept, t0)
    if tree.budget == 0 and not cfg.verify_empty:
        return Plan([t0], None)
    return Plan([t0], tree)


def plan_redraft(r: Round) -> Passes[Plan]:
    """First-token sampling with a pool drafted anew under t0 (an extension, not the paper's):
    while the root pass runs, the draft pre-expands pools under its likeliest first tokens; on
    a miss it drafts under t0 after. On a GPU the guesses' pools are read with t0: one wait."""
    cfg = r.config

    def draft_work():
        r.stats.draft_passes += cfg.pool_depth + 1
        return (yield from guessed_pools_read_later(r.draft, r.context, cfg.pool.guesses,
                                                    cfg.pool.top_k, cfg.pool_depth))

    root_logits, read = yield from root_pass_alongside(r, draft_work())
    t0 = _draw_t0(r, root_logits)
    guessed, logq = read()
    if t0 in cfg.stop_ids:  # nothing to draft after a stop token
        return Plan([t0], None)
    hit = pool_under(guessed, logq, t0)
    if hit is None:  # t0 was not among the guesses: draft under it now

        r.stats.draft_passes += cfg.pool_depth
        hit = yield from timed_draft_work(r, pool_passes(r.draft, r.context + [t0],
                                                         cfg.pool.top_k, cfg.pool_depth))
    cand, cand_logq = hit
    return Plan([t0], cand.subtree(r.rule.select(cand, cand_logq, cfg.budget)))


# -- draft-free: trees from the target's own past rows (RACER, Token Recycling) ----------------

# prompt positions whose rows one call asks for: a row is vocabulary-wide, so a long prompt's
# come in parts (each part a plain causal pass after the part before, then committed)
PROMPT_ROWS_AT_ONCE = 256


def racer_state(vocab_size: int, config) -> Recycler:
    """RACER's state: the table written from the prompt's rows and every verified node's, and
    the n-gram trie of the history; its trees take n-gram continuations first and grow the
    rest breadth-first through the table, charged as RACER charges them."""
    return Recycler(vocab_size, k=min(config.recycle_k, vocab_size), ngrams=True,
                    keep_across_prompts=config.keep_across_prompts, prompt_rows=True)


def recycle_state(vocab_size: int, config) -> Recycler:
    """Token Recycling's state: the table alone, written from every verified node's rows (not
    the prompt's), filled into its static 80-node tree (the first B nodes at budget B)."""
    return Recycler(vocab_size, k=min(config.recycle_k, vocab_size), ngrams=False,
                    keep_across_prompts=config.keep_across_prompts,
                    template=TOKEN_RECYCLING_TEMPLATE)


def _prompt_rows(r: Round) -> Passes[None]:
    """The target's rows along the prompt (the round's context: a decode's first round), their
    top-k ids written into the state's table (`prompt_rows`); the last row, the root's, goes
    into the store for the verify pass."""
    prompt = list(r.context)
    ids, logp, root_row, passes = yield from prompt_rows_passes(r.target, prompt,
                                                                r.state.table.k)
    r.stats.target_passes += passes
    r.store.put(prompt, root_row)
    r.state.observe_prompt(prompt, ids, logp)


def prompt_rows(target, prompt: list[int], k: int):
    """`prompt_rows_passes` run at once."""
    return run_now(prompt_rows_passes(target, prompt, k))


def prompt_rows_passes(target, prompt: list[int], k: int) -> Passes:
    """The target's top-k ids and log-probs at every position of `prompt`, from a chain tree of
    its tokens under its first token, in parts of PROMPT_ROWS_AT_ONCE whose entries become the
    committed cache (`Model.commit`), so nothing is computed twice. Returns (ids, logp, the
    last position's row [1, V], passes): what RACER's first round costs beyond a plain pass
    over the prompt is the rows at every position (`cost.parttimes.time_prompt_pass`)."""
    ids, logp, passes = [], [], 0
    for start in range(0, len(prompt), PROMPT_ROWS_AT_ONCE):
        end = min(start + PROMPT_ROWS_AT_ONCE, len(prompt))
        chain = Tree(prompt[start:end], np.arange(-1, end - start - 1))
        logits = yield from target.logits_passes(prompt[: start + 1], chain, range(end - start))
        top = target.topk(logits, k)
        ids.append(top[0])
        logp.append(top[1])
        target.commit(prompt[:end])
        passes += 1
    return np.concatenate(ids), np.concatenate(logp), logits[-1:], passes


def plan_recycle(r: Round) -> Passes[Plan]:
    """A draft-free decoder's round (racer, recycle): no draft model; the tree grows from the
    state's table (and RACER's n-grams) under the root. At a decode's first round a state that
    reads the prompt's rows gets them first (a target pass, timed as the root pass: it gives
    the root row too). The verify pass's rows at every node go back into the table
    (`Plan.observe`). A tree without nodes (nothing seen yet) is still verified: one token."""
    state = r.state
    if state.prompt_pending:
        start = stamp(r.target)
        yield from _prompt_rows(r)
        r.timings.add(("t_root", "t_drafting"), start, stamp(r.target))
    tree = yield from timed_draft_work(r, no_passes(state.tree(r.context, r.config.budget)))

    def observe(verified: Tree, logits, nodes) -> None:
        ids, logp = r.target.topk(logits, state.table.k)
        state.observe_tree(verified, ids, logp, nodes)

    return Plan([], tree, observe=observe)


PLANNERS = {"pool": plan_pool, "pruned": plan_after_t0, "below_t0": plan_after_t0,
            "redraft": plan_redraft}
