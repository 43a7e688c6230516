"""Property-based tests of the NumPy core: random trees, pools, rows and budgets never crash
verification, the selection rules or expected acceptance, and their invariants hold."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from targetrows import Tree, expected_accepted, expected_accepted_batch, pool, select, verify
from targetrows.core.acceptance import reach_probability
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
    for chosen in (select.draft_rank(cand, logq, budget),
                   select.target_rerank(cand, logq, budget, root_row)):
        assert chosen[0] == 0 and np.all(np.diff(chosen) > 0)
        assert len(chosen) - 1 == min(budget, len(cand) - 1)
        inside = set(chosen.tolist())
        assert all(int(cand.parents[i]) in inside for i in chosen[1:])
        sub = cand.subtree(chosen)  # a valid tree in its own right
        assert len(sub) == len(chosen)
    dr = select.draft_rank(cand, logq, budget)
    t0 = select.first_token(root_row, np.random.default_rng(seed))
    kept = select.prune_to_first(cand, dr, t0)
    tree = select.pruned_tree(cand, kept, t0)
    assert tree.tokens[0] == t0 and len(tree) == max(len(kept), 1)
    # the pruned tree is no bigger than the budget and sits inside the selection
    assert set(kept.tolist()) <= set(dr.tolist()) and tree.budget <= budget
