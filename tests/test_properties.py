"""Property-based tests of the NumPy core: random trees, pools, rows and budgets never crash
verification, the selection rules or expected acceptance, and their invariants hold."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from targetrows import Tree, expected_accepted, expected_accepted_batch, verify
from targetrows.core import pool
from targetrows.core.acceptance import reach_probability
from targetrows.core.rules.after_t0 import first_token, pearl
from targetrows.core.rules.root_pool import draft_rank, target_rerank
from targetrows.core.rules.rule import draw_first_token, first_level_logp, tree_after_t0
from targetrows.core.toy import ToyPair


@st.composite
def trees(draw, max_nodes=25, vocab=6):
    n = draw(st.integers(1, max_nodes))
    tokens, parents, used = [draw(st.integers(0, vocab - 1))], [-1], {}
    for i in range(1, n):
        open_parents = [q for q in range(i) if len(used.get(q, ())) < vocab]
        p = draw(st.sampled_from(open_parents))
        free = [t for t in range(vocab) if t not in used.setdefault(p, set())]
        tok = draw(st.sampled_from(free))
        used[p].add(tok)
        parents.append(p)
        tokens.append(tok)
    return Tree(tokens, parents)


def rows_for(tree, vocab, seed, sharp):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(vocab, sharp), size=len(tree))


@settings(max_examples=200, deadline=None)
@given(trees(), st.integers(0, 2**32 - 1), st.floats(0.05, 5.0), st.booleans())
def test_verify_walks_a_real_path(tree, seed, sharp, greedy):
    rows = rows_for(tree, 6, seed, sharp)
    rng = None if greedy else np.random.default_rng(seed)
    path, bonus = verify(tree, rows, rng)
    node = 0
    for child in path:  # every accepted node is a child of the previous one
        assert tree.parents[child] == node
        node = int(child)
    assert tree.child_with_token(node, bonus) == -1  # the bonus is never a child there
    assert 0 <= bonus < 6
    if greedy:
        assert bonus == int(np.argmax(rows[node]))


@settings(max_examples=200, deadline=None)
@given(trees(), st.integers(0, 2**32 - 1), st.floats(0.05, 5.0))
def test_expectation_bounds(tree, seed, sharp):
    rows = rows_for(tree, 6, seed, sharp)
    edge = np.ones(len(tree))
    edge[1:] = rows[tree.parents[1:], tree.tokens[1:]]
    e = expected_accepted(tree, edge)
    reach = reach_probability(tree, edge)
    assert 0.0 <= e <= tree.depth.max() + 1e-9  # at most one node per level is accepted
    assert np.all(reach[1:] <= reach[tree.parents[1:]] + 1e-12)  # deeper is never likelier
    # the mass accepted at a node's children never exceeds 1
    for i in range(len(tree)):
        assert edge[tree.children(i)].sum() <= 1 + 1e-9
    got = expected_accepted_batch(tree.parents[None], edge[None])[0]
    assert np.isclose(got, e)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 10_000),
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(1, 80),
    st.floats(0.0, 1.0),
)
def test_rules_on_random_pools(seed, top_k, depth, budget, closeness):
    pair = ToyPair(8, seed, closeness)
    cand, logq = pool.expand(pair.draft_row, [seed % 8, 1], top_k, depth)
    assert len(cand) == 1 + min(top_k, 8) + (depth - 1) * min(top_k, 8) ** 2
    root_row = pair.target_row([seed % 8, 1])
    for chosen in (draft_rank.select(cand, logq, budget),
                   target_rerank.select(cand, logq, budget,
                                        root_logp=first_level_logp(cand, root_row))):
        assert chosen[0] == 0 and np.all(np.diff(chosen) > 0)
        assert len(chosen) - 1 == min(budget, len(cand) - 1)
        inside = set(chosen.tolist())
        assert all(int(cand.parents[i]) in inside for i in chosen[1:])
        sub = cand.subtree(chosen)  # a valid tree in its own right
        assert len(sub) == len(chosen)
    dr = draft_rank.select(cand, logq, budget)
    t0 = draw_first_token(root_row, np.random.default_rng(seed))
    kept = pearl.select(cand, logq, budget, t0=t0)
    tree = tree_after_t0(cand, kept, t0)
    assert tree.tokens[0] == t0 and len(tree) == max(len(kept), 1)
    # the pruned tree is no bigger than the budget and sits inside the selection
    assert set(kept.tolist()) <= set(dr.tolist()) and tree.budget <= budget


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 4), st.integers(1, 4), st.integers(1, 40),
       st.floats(0.0, 1.0), st.booleans())
def test_first_tokens_tree_contains_pearls(seed, top_k, depth, budget, closeness, greedy_t0):
    """At every context and budget, first_token's tree (the top-B below t0 in the root pool)
    contains pearl's (the global top-B pruned to t0), so it verifies at least as many nodes and
    accepts at least as many in expectation; both are empty exactly when t0 is not a
    first-level pool token (pearl's also when t0's node missed the global top-B)."""
    pair = ToyPair(8, seed, closeness)
    ctx = [seed % 8, 3]
    cand, logq = pool.expand(pair.draft_row, ctx, top_k, depth)
    root_row = pair.target_row(ctx)
    t0 = draw_first_token(root_row, None if greedy_t0 else np.random.default_rng(seed))
    pruned = pearl.select(cand, logq, budget, t0=t0)
    below = first_token.select(cand, logq, budget, t0=t0)
    assert set(pruned.tolist()) <= set(below.tolist())
    assert (len(below) == 0) == (cand.child_with_token(0, t0) < 0)
    trees = [tree_after_t0(cand, kept, t0) for kept in (pruned, below)]
    assert trees[0].budget <= trees[1].budget <= budget
    assert trees[1].subtree(np.arange(len(trees[1]))) == trees[1]  # a valid tree, rooted at t0
    edges = []
    for tree in trees:
        rows = [pair.target_row(ctx + [t0] + tree.path_tokens(i)) for i in range(len(tree))]
        edges.append(np.r_[1.0, [rows[p][t] for p, t in zip(tree.parents[1:], tree.tokens[1:],
                                                                strict=True)]])
    assert expected_accepted(trees[0], edges[0]) <= expected_accepted(trees[1], edges[1]) + 1e-12
