import itertools

import brute_rules as brute
import numpy as np
import pytest

from targetrows import Tree
from targetrows.core import pool
from targetrows.core.passes import no_passes
from targetrows.core.rules.after_t0 import first_token, pearl
from targetrows.core.rules.root_pool import draft_rank, stale_rerank, target_rerank
from targetrows.core.rules.rule import draw_first_token, first_level_logp, tree_after_t0
from targetrows.core.toy import ToyPair


def _pool(seed=0, top_k=3, depth=3, vocab=12):
    pair = ToyPair(vocab, seed, closeness=0.6)
    cand, logq = pool.expand(pair.draft_row, [1, 2, 3], top_k, depth)
    return pair, cand, logq


def _ancestor_closed(tree, nodes):
    s = set(nodes.tolist())
    return 0 in s and all(int(tree.parents[i]) in s for i in s if i != 0)


def test_pool_shape_and_order():
    pair, cand, logq = _pool(top_k=10, depth=6, vocab=40)
    assert len(cand) == 1 + pool.pool_size(10, 6) == 511
    assert np.all(np.diff(cand.depth) >= 0)  # level by level
    assert logq[0] == 0 and np.all(logq[1:] <= 0)
    # level 1 = the draft's top_k at the root, best first
    root_row = pair.draft_row([1, 2, 3])
    assert cand.tokens[cand.children(0)].tolist() == np.argsort(-root_row, kind="stable")[:10].tolist()
    # every level after the first: top_k frontier nodes, each with top_k children
    for d in range(2, 7):
        parents = set(cand.parents[cand.depth == d].tolist())
        assert len(parents) == 10 and (cand.depth == d).sum() == 100
        prev = np.flatnonzero(cand.depth == d - 1)
        assert parents == set(prev[np.argsort(-logq[prev], kind="stable")[:10]].tolist())


def test_draft_rank_equals_brute_force():
    """Brute force: the ancestor-closed set of size B with the best (sum of logq, lowest indices)."""
    for seed in range(6):
        _, cand, logq = _pool(seed, top_k=2, depth=3, vocab=6)
        nodes = range(1, len(cand))
        for budget in (1, 2, 3, 5):
            best = None
            for combo in itertools.combinations(nodes, budget):
                chosen = np.array((0,) + combo)
                if not _ancestor_closed(cand, chosen):
                    continue
                key = (-logq[list(combo)].sum(), combo)
                if best is None or key < best[0]:
                    best = (key, chosen)
            got = draft_rank.select(cand, logq, budget)
            # same total score (the top-B set is unique up to ties)
            assert logq[got].sum() == pytest.approx(logq[best[1]].sum())
            assert sorted(logq[got[1:]])[::-1] == pytest.approx(sorted(logq[best[1][1:]])[::-1])


@pytest.mark.parametrize("budget", [1, 2, 7, 30, 59, 1000])
def test_every_rule_is_ancestor_closed_and_within_budget(budget):
    pair, cand, logq = _pool(3, top_k=4, depth=4, vocab=20)
    root_row = pair.target_row([1, 2, 3])
    for chosen in (
        draft_rank.select(cand, logq, budget),
        target_rerank.select(cand, logq, budget, root_logp=first_level_logp(cand, root_row)),
    ):
        assert chosen[0] == 0 and np.all(np.diff(chosen) > 0)
        assert len(chosen) - 1 == min(budget, len(cand) - 1)
        assert _ancestor_closed(cand, chosen)
    chosen = draft_rank.select(cand, logq, budget)
    for tok in cand.tokens[cand.children(0)]:
        kept = pearl.select(cand, logq, budget, t0=int(tok))
        if len(kept):
            assert cand.tokens[kept[0]] == tok and cand.depth[kept[0]] == 1
            assert set(kept.tolist()) <= set(chosen.tolist())
            tree = tree_after_t0(cand, kept, int(tok))
            assert len(tree) == len(kept) and tree.tokens[0] == tok


def test_target_rerank_reorders_first_level():
    # two first-level branches; the draft prefers token 1, the target token 2
    cand = Tree([0, 1, 2, 3, 4], [-1, 0, 0, 1, 2])
    logq = np.log([1, 0.9, 0.1, 0.9 * 0.5, 0.1 * 0.5])
    assert draft_rank.select(cand, logq, 2).tolist() == [0, 1, 3]
    root_row = np.array([0.0, 0.1, 0.9, 0.0, 0.0])
    assert target_rerank.select(cand, logq, 2,
                                root_logp=first_level_logp(cand, root_row)).tolist() == [0, 2, 4]


def test_first_token_and_pruning():
    assert draw_first_token(np.array([0.1, 0.7, 0.2])) == 1
    rng = np.random.default_rng(0)
    draws = [draw_first_token(np.array([0.1, 0.7, 0.2]), rng) for _ in range(4000)]
    assert abs(np.mean(np.array(draws) == 1) - 0.7) < 0.03
    cand = Tree([0, 1, 2, 3, 4], [-1, 0, 0, 1, 2])
    logq = np.log([1, 0.5, 0.4, 0.3, 0.1])  # the top 3 nodes: 1, 2, 3
    assert pearl.select(cand, logq, 3, t0=1).tolist() == [1, 3]
    assert pearl.select(cand, logq, 3, t0=2).tolist() == [2]
    assert pearl.select(cand, logq, 3, t0=9).tolist() == []
    assert first_token.select(cand, logq, 3, t0=2).tolist() == [2, 4]  # below t0, not global
    assert tree_after_t0(cand, np.zeros(0, np.int64), 9) == Tree.root_only(9)


@pytest.mark.parametrize("budget", [0, -1, 2.5, True])
def test_bad_budget(budget):
    _, cand, logq = _pool()
    with pytest.raises(ValueError, match="budget"):
        draft_rank.select(cand, logq, budget)


def test_bad_inputs_name_themselves():
    _, cand, logq = _pool()
    with pytest.raises(ValueError, match="logq"):
        draft_rank.select(cand, logq[:-1], 3)
    with pytest.raises(ValueError, match="root_row"):
        first_level_logp(cand, np.full(12, np.nan))
    with pytest.raises(ValueError, match="root_logp needs one value per first-level node"):
        target_rerank.select(cand, logq, 3, root_logp=[0.0])
    with pytest.raises(ValueError, match="reads the exact root row"):
        target_rerank.select(cand, logq, 3)
    with pytest.raises(ValueError, match="give t0"):
        pearl.select(cand, logq, 3)
    with pytest.raises(ValueError, match="root_row"):
        draw_first_token(np.array([0.5, 0.6]))
    with pytest.raises(ValueError, match="top_k"):
        pool.expand(lambda c: np.ones(4) / 4, [1], 0, 2)


@pytest.mark.parametrize("budget", [1, 2, 3, 4])
def test_a_pool_as_deep_as_the_budget_gives_the_same_tree(budget):
    """The round loop drafts only min(depth, budget) levels (DecodeConfig.pool_depth): the
    rules pick the very same nodes from that pool as from the deeper one (pearl and fts apply
    draft_rank, so these two rules cover every decoder)."""
    pair = ToyPair(vocab_size=12, seed=3, closeness=0.7)
    rng = np.random.default_rng(0)
    for _ in range(40):
        context = rng.integers(12, size=4).tolist()
        full, logq = pool.expand(pair.draft_row, context, top_k=3, depth=5)
        cut, logq_cut = pool.expand(pair.draft_row, context, top_k=3, depth=min(5, budget))
        np.testing.assert_array_equal(cut.tokens, full.tokens[: len(cut)])  # same indices
        root = pair.target_row(context)
        np.testing.assert_array_equal(draft_rank.select(cut, logq_cut, budget),
                                      draft_rank.select(full, logq, budget))
        np.testing.assert_array_equal(
            target_rerank.select(cut, logq_cut, budget, root_logp=first_level_logp(cut, root)),
            target_rerank.select(full, logq, budget, root_logp=first_level_logp(full, root)))


class _CoarseDraft:
    """A draft whose log-probs take a few values only, so that pools are full of ties."""

    def __init__(self, vocab: int, seed: int, levels: int):
        self.vocab, self.seed, self.levels = vocab, seed, levels

    def topk_at(self, context, tree, nodes, k):
        rows = []
        for node in nodes:
            path = tuple(context) + tuple(tree.path_tokens(int(node))[1:])
            rng = np.random.default_rng([self.seed, *path])
            logits = rng.integers(self.levels, size=self.vocab) * (4.0 / self.levels)
            rows.append(logits - np.log(np.exp(logits).sum()))
        return pool.topk_tokens(np.stack(rows), k)

    def topk_at_passes(self, context, tree, nodes, k):
        return no_passes(self.topk_at(context, tree, nodes, k))


def _paths(tree, nodes):
    return sorted(tuple(tree.path_tokens(int(v))) for v in nodes)


@pytest.mark.parametrize("levels", [2, 5, 1000])
def test_a_budget_pruned_pool_gives_the_same_draft_rank_tree(levels):
    """`expand_model(..., budget=B)` expands only nodes that can still enter the top-B tree: its
    draft_rank tree is the full pool's (same token paths), ties included, and it is part of it."""
    rng = np.random.default_rng(levels)
    for trial in range(60):
        draft = _CoarseDraft(vocab=6, seed=trial, levels=levels)
        context = rng.integers(6, size=3).tolist()
        top_k, depth = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        full, logq = pool.expand_model(draft, context, top_k, depth)
        for budget in range(1, 12):
            cut, logq_cut = pool.expand_model(draft, context, top_k, depth, budget=budget)
            assert set(_paths(cut, range(len(cut)))) <= set(_paths(full, range(len(full))))
            assert _paths(cut, draft_rank.select(cut, logq_cut, budget)) == _paths(
                full, draft_rank.select(full, logq, budget))
            if budget == 1:
                assert cut.depth.max() <= 1  # nothing below the first level can be chosen


@pytest.mark.parametrize("seed", range(8))
def test_each_rule_selects_what_its_definition_says(seed):
    """Every paper rule against its definition written out node by node (tests/brute_rules.py),
    on pools with ties and on pools where the draft rules out some first tokens."""
    pair = ToyPair(10, seed, closeness=0.6)
    rng = np.random.default_rng(seed)
    ctx = rng.integers(10, size=3).tolist()
    cand, logq = pool.expand(pair.draft_row, ctx, top_k=3, depth=3)
    if seed % 2:  # coarse log-probs (floor keeps a child at or below its parent): ties
        logq = np.floor(logq * 2) / 2
    root, stale = pair.target_row(ctx), pair.target_row(ctx[:-1])
    root[int(cand.tokens[cand.children(0)[-1]])] = 0.0  # a first token the row rules out
    root /= root.sum()
    first = cand.tokens[cand.children(0)]
    by_token = {int(t): v for t, v in zip(first, first_level_logp(cand, root), strict=True)}
    stale_by_token = {int(t): v for t, v in zip(first, first_level_logp(cand, stale),
                                                strict=True)}
    for budget in (1, 2, 4, 7, 40):
        assert draft_rank.select(cand, logq, budget).tolist() == brute.draft_rank(cand, logq,
                                                                                  budget)
        got = target_rerank.select(cand, logq, budget, root_logp=list(by_token.values()))
        assert got.tolist() == brute.rerank(cand, logq, budget, by_token)
        got = stale_rerank.select(cand, logq, budget, stale_logp=list(stale_by_token.values()))
        assert got.tolist() == brute.rerank(cand, logq, budget, stale_by_token)
        assert stale_rerank.select(cand, logq, budget).tolist() == brute.draft_rank(
            cand, logq, budget)  # no previous row: the draft's ranking
        for t0 in [*first.tolist(), 99]:
            assert pearl.select(cand, logq, budget, t0=t0).tolist() == brute.pearl(
                cand, logq, budget, t0)
            assert first_token.select(cand, logq, budget, t0=t0).tolist() == brute.first_token(
                cand, logq, budget, t0)


def test_a_rule_whose_child_outscores_its_parent_is_refused():
    from targetrows.core.rules.rule import Rule

    def rising(batch):
        return -batch.logq  # deeper (less likely) nodes score higher

    cand = Tree([0, 1, 2, 3], [-1, 0, 1, 2])
    logq = np.log([1, 0.5, 0.25, 0.1])
    with pytest.raises(ValueError, match="rule 'rising': a node scores above its parent"):
        Rule("rising", "a broken rule", rising).select(cand, logq, 2)
