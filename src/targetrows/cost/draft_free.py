"""Calibration of the draft-free decoders (racer, recycle): how many tokens their trees commit
at every candidate budget, from one decode of the target's path per prompt.

Their trees come from what the target's rows taught them along the way (`core.recycle`), so no
draft pool can be scored for them as `calibration.acceptance_curve` scores a draft's. Decoding
every prompt once per budget would measure them, at a prompt pass and a decode per budget.
Instead each budget keeps its own state (table, n-gram trie) along one path, and each round:

1. every budget's tree is built from its own state at the same context;
2. one target pass verifies their union (`merge_trees`);
3. each budget is scored on its own tree: its nodes' reach probabilities (exact at T=0, the
   expected accepted count at T>0) and its size;
4. each budget's state learns the rows at its own tree's nodes, as its own round would write
   them;
5. the path moves on by the union's round (lossless: the target's tokens).

With one budget this is that budget's own decode, round for round. With several, a budget's
rounds start where the union's ended rather than where its own would have, so its table misses
the rows its own trees would have verified at those other contexts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from targetrows.core.acceptance import reach_probability
from targetrows.core.rows import greedy
from targetrows.core.tree import merge_trees
from targetrows.core.verify import walk
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import new_state
from targetrows.decoding.model import edge_probs
from targetrows.decoding.planners import prompt_rows


def draft_free_rounds(target, prompt_ids: Sequence[int], budgets: Sequence[int],
                      config: DecodeConfig, new_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens committed, nodes verified) [rounds, len(budgets)] of `config`'s draft-free
    decoder at each budget, round by round along the target's path from `prompt_ids` until
    `new_tokens` tokens are committed or a stop token is (see the module's steps)."""
    if config.decoder.new_state is None:
        raise ValueError(f"decoder {config.decoder.name!r} is not draft-free: it keeps no table")
    budgets = [int(b) for b in budgets]
    states = [new_state(target, replace(config, budget=b)) for b in budgets]
    target.reset(config.seed)
    for state in states:
        state.start()
    ctx = [int(t) for t in prompt_ids]
    k = states[0].table.k
    if states[0].prompt_pending:  # RACER's first writes: the prompt's rows, the same for all
        ids, logp, _, _ = prompt_rows(target, ctx, k)
        for state in states:
            state.observe_prompt(ctx, ids, logp)
    committed, nodes = [], []
    start = len(ctx)
    while len(ctx) - start < new_tokens:
        trees = [state.tree(ctx, b) for state, b in zip(states, budgets, strict=True)]
        union, where = merge_trees(trees)
        everywhere = np.arange(len(union))
        logits = target.logits(ctx, union, everywhere)
        draws = target.draw(logits, config.temperature)
        reach = reach_probability(union, _edges(target, logits, union, draws, config.temperature))
        committed.append([1.0 + reach[w[1:]].sum() for w in where])
        nodes.append([len(w) - 1 for w in where])
        ids, logp = target.topk(logits, k)
        for state, tree, w in zip(states, trees, where, strict=True):
            state.observe_tree(tree, ids[w], logp[w])
        path, bonus = walk(union, draws)
        ctx += union.tokens[path].tolist() + [int(bonus)]
        target.commit(ctx)
        if set(ctx[-len(path) - 1:]) & set(config.stop_ids):
            break
    target.reset(config.seed)
    return np.asarray(committed), np.asarray(nodes, dtype=np.float64)


def _edges(target, logits, tree, draws: np.ndarray, temperature: float) -> np.ndarray:
    """The probability that verification moves from each node's parent to it: at T=0 whether
    it is the target's argmax there, else the target's probability of its token."""
    if greedy(temperature):
        edge = np.ones(len(tree))
        edge[1:] = draws[tree.parents[1:]] == tree.tokens[1:]
        return edge
    return edge_probs(target, logits, np.arange(len(tree)), tree, temperature)


def draft_free_curves(target, prompts: Sequence[Sequence[int]],
                      configs: Sequence[DecodeConfig], budgets: Sequence[int],
                      new_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(committed, nodes) [1, len(budgets)] per round of a draft-free decoder, averaged over
    the rounds of every prompt (`draft_free_rounds`, each prompt with its own config)."""
    if len(configs) != len(prompts):
        raise ValueError(f"{len(configs)} prompt configs for {len(prompts)} prompts")
    runs = [draft_free_rounds(target, p, budgets, c, new_tokens)
            for p, c in zip(prompts, configs, strict=True)]
    committed = np.concatenate([c for c, _ in runs]).mean(axis=0)
    nodes = np.concatenate([n for _, n in runs]).mean(axis=0)
    return committed[None], nodes[None]
