"""Sequoia's optimal tree shape on our pools (`targetrows.core.rules.sequoia`): the dynamic
program against exhaustive search over every tree and against Sequoia's own recurrence
(tree_search.py) written out here, the shape filled from hand-worked pools, and the acceptance
vector against plain loops."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from targetrows.core.pool import expand
from targetrows.core.rules.batch import PoolBatch, reach_batch
from targetrows.core.rules.sequoia import (
    Shape,
    acceptance_vector,
    best_values,
    fill_shape,
    optimal_shape,
    positional_logvalue,
    sequoia_rule,
    shape_mask,
    shape_value,
    sibling_ranks,
)
from targetrows.core.toy import ToyPair
from targetrows.core.tree import Tree

# -- every tree, exhaustively ---------------------------------------------------------------------


def all_trees(n, d, k):
    """Every tree of ranks with exactly n non-root nodes, at most d levels below its root, each
    node's children of ranks 1..b with b <= k: as nested tuples (a node = its children, in rank
    order)."""
    if n == 0:
        yield ()
    elif d > 0:
        yield from _forests(n, d, k, k)


def _forests(n, d, k, room):
    if n == 0:
        yield ()
        return
    if room == 0:
        return
    for size in range(1, n + 1):  # the first child and everything under it
        for first in all_trees(size - 1, d - 1, k):
            for rest in _forests(n - size, d, k, room - 1):
                yield (first, *rest)


def nested_value(node, p):
    return sum(p[i] * (1 + nested_value(child, p)) for i, child in enumerate(node))


def exhaustive_best(p, n, d):
    """The best value over every tree of exactly n nodes, or None when there is none."""
    values = [nested_value(t, p) for t in all_trees(n, d, len(p))]
    return max(values) if values else None


def check_valid(shape: Shape, budget, max_depth, k):
    """Parents first, at most `max_depth` deep, ranks 1..b under every node, in rank order."""
    assert shape.parents[0] == -1 and shape.ranks[0] == 0
    assert all(shape.parents[j] < j for j in range(1, len(shape.parents)))
    assert shape.budget <= budget and shape.depth() <= max_depth
    for node in range(len(shape.parents)):
        kids = np.flatnonzero(shape.parents == node)
        assert shape.ranks[kids].tolist() == list(range(1, len(kids) + 1))
        assert len(kids) <= k


probabilities = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=3)


@settings(max_examples=60, deadline=None)
@given(probabilities, st.integers(1, 6), st.integers(1, 3))
def test_optimal_shape_is_the_exhaustive_best(p, budget, max_depth):
    shape = optimal_shape(p, budget, max_depth)
    check_valid(shape, budget, max_depth, len(p))
    best = exhaustive_best(p, shape.budget, max_depth)
    assert shape.value == pytest.approx(best, abs=1e-12)
    assert shape_value(shape.parents, shape.ranks, p) == pytest.approx(shape.value, abs=1e-12)
    if shape.budget < budget:  # fewer nodes only when no tree holds the budget
        assert exhaustive_best(p, budget, max_depth) is None


@settings(max_examples=25, deadline=None)
@given(probabilities, st.integers(1, 5), st.integers(1, 3))
def test_best_values_every_size_and_depth(p, budget, max_depth):
    table = best_values(p, budget, max_depth)
    for d in range(max_depth + 1):
        for n in range(budget + 1):
            best = exhaustive_best(p, n, d)
            if best is None:
                assert table[d, n] == -np.inf
            else:
                assert table[d, n] == pytest.approx(best, abs=1e-12)


def first_argmax(values):
    return max(range(len(values)), key=lambda i: (values[i], -i))


def published_dp(p, max_budget, max_depth):
    """Sequoia's tree_search.py (lines 21-50) with plain lists: T[m][l][b], the best expected
    number of tokens (its root counted as 1) of a tree with m nodes, l levels and b children
    at the root; p[1..K] (p[0] unused); branch_map[(m, l, b)]: the states (m, l, b) of the
    root's children, in rank order. Returns max_b T[m][l] for every m, l, and branch_map."""
    pp = [0.0, *p]
    k = len(p)
    inf = float("inf")
    T = [[[-inf] * (k + 1) for _ in range(max_depth + 1)] for _ in range(max_budget + 1)]
    branch_map = {}
    for lv in range(1, max_depth + 1):  # their l: levels, the root's included
        T[1][lv][0] = 1.0
        branch_map[(1, lv, 0)] = []
    for m in range(2, max_budget + 1):
        for lv in range(2, max_depth + 1):
            T[m][lv][1] = 1 + pp[1] * max(T[m - 1][lv - 1])
            if T[m][lv][1] > 0:
                branch_map[(m, lv, 1)] = [(m - 1, lv - 1, first_argmax(T[m - 1][lv - 1]))]
            for b in range(2, k + 1):
                best, new_y = -inf, None
                for y in range(1, m):
                    value = T[y][lv][b - 1] + pp[b] * max(T[m - y][lv - 1])
                    if value > best:  # strictly: the first y that reaches the best
                        best, new_y = value, y
                T[m][lv][b] = best
                if best >= 0:
                    branch_map[(m, lv, b)] = [*branch_map[(new_y, lv, b - 1)],
                                              (m - new_y, lv - 1, first_argmax(T[m - new_y][lv - 1]))]
    table = [[max(T[m][lv]) for lv in range(max_depth + 1)] for m in range(max_budget + 1)]
    return table, T, branch_map


def published_shape(p, budget, max_depth):
    """Sequoia's grow map (tree_search.py lines 77-118) for m = budget + 1 nodes and
    l = max_depth + 1 levels: nodes breadth-first, each node's children in rank order."""
    _, T, branch_map = published_dp(p, budget + 1, max_depth + 1)
    m, lv = budget + 1, max_depth + 1
    states, parents, ranks = [(m, lv, first_argmax(T[m][lv]))], [-1], [0]
    i = 0
    while i < len(states):
        for rank, state in enumerate(branch_map[states[i]], start=1):
            states.append(state)
            parents.append(i)
            ranks.append(rank)
        i += 1
    return parents, ranks


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.01, 1.0), min_size=1, max_size=4), st.integers(1, 12),
       st.integers(1, 5))
def test_best_values_are_sequoias_recurrence(p, budget, max_depth):
    """Their table counts the root (m = n + 1 nodes, l = d + 1 levels, value + 1). p > 0: their
    code multiplies -inf by p, which is NaN at p = 0."""
    theirs = published_dp(p, budget + 1, max_depth + 1)[0]
    ours = best_values(p, budget, max_depth)
    for d in range(max_depth + 1):
        for n in range(budget + 1):
            expected = theirs[n + 1][d + 1]
            if expected == -np.inf:
                assert ours[d, n] == -np.inf
            else:
                assert ours[d, n] + 1 == pytest.approx(expected, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]), min_size=1,
                max_size=3), st.integers(1, 10), st.integers(1, 4))
def test_optimal_shape_is_sequoias_shape(p, budget, max_depth):
    """The same shape node for node, ties included: dyadic p keep every sum exact, so equal
    values tie in both codes and the tie-breaking is what is compared."""
    assume_feasible = best_values(p, budget, max_depth)[max_depth, budget] > -np.inf
    if not assume_feasible:  # Sequoia only builds shapes of exactly m nodes
        return
    shape = optimal_shape(p, budget, max_depth)
    parents, ranks = published_shape(p, budget, max_depth)
    assert shape.parents.tolist() == parents and shape.ranks.tolist() == ranks


def test_optimal_shape_by_hand():
    """p = (0.5, 0.3). Two nodes: both children of the root (0.8) beat a chain (0.75). Three
    nodes, depth 2: r1, r2 and r1's r1 (0.5 + 0.3 + 0.25) beat r1, r1r1, r1r2 (0.9) and r1,
    r2, r2r1 (0.95). At depth 1 only two ranks fit: three nodes give the two-node shape."""
    two = optimal_shape([0.5, 0.3], 2, 2)
    assert two.parents.tolist() == [-1, 0, 0] and two.value == pytest.approx(0.8)
    three = optimal_shape([0.5, 0.3], 3, 2)
    assert three.parents.tolist() == [-1, 0, 0, 1] and three.ranks.tolist() == [0, 1, 2, 1]
    assert three.value == pytest.approx(1.05)
    flat = optimal_shape([0.5, 0.3], 3, 1)
    assert flat.budget == 2 and flat.value == pytest.approx(0.8)
    chain = optimal_shape([0.9], 3, 5)
    assert chain.parents.tolist() == [-1, 0, 1, 2]
    assert chain.value == pytest.approx(0.9 + 0.81 + 0.729)


def test_ranks_stay_contiguous_even_when_p_rises():
    """Sequoia's shapes use ranks 1..b under every node: with p = (0.1, 0.5) and one node the
    shape takes rank 1 (0.1), though rank 2 alone would be worth 0.5."""
    shape = optimal_shape([0.1, 0.5], 1, 3)
    assert shape.ranks.tolist() == [0, 1] and shape.value == pytest.approx(0.1)


def full_rank_tree(k, d):
    """Every node of the complete k-ary tree of depth d, as rank paths."""
    return [path for depth in range(1, d + 1) for path in itertools.product(range(1, k + 1),
                                                                              repeat=depth)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=3), st.integers(1, 8),
       st.integers(1, 3))
def test_nonincreasing_p_optimum_is_the_top_nodes(p, budget, max_depth):
    """When p never rises with the rank, no node is worth more than its parent or a better
    ranked sibling, so the optimum is the sum of the `budget` best nodes of the complete tree,
    a second oracle that needs no search."""
    p = sorted(p, reverse=True)
    worth = sorted((np.prod([p[r - 1] for r in path]) for path in full_rank_tree(len(p), max_depth)),
                   reverse=True)
    shape = optimal_shape(p, budget, max_depth)
    assert shape.value == pytest.approx(sum(worth[:budget]), abs=1e-12)


# -- ranks and the shape filled from a pool ----------------------------------------------------

def hand_pool():
    """Root (token 9); first level: node 2 (rank 1, logq -0.5), node 1 (rank 2, -2.0), node 3
    (rank 3, -3.0); under node 2: node 4 (rank 1), node 5 (rank 2); under node 1: node 6. The
    pool expanded nodes 2 and 1 only."""
    pool = Tree([9, 5, 6, 7, 1, 2, 3], [-1, 0, 0, 0, 2, 2, 1])
    logq = np.array([0.0, -2.0, -0.5, -3.0, -0.7, -1.5, -2.1])
    return pool, logq


def test_sibling_ranks_by_hand():
    pool, logq = hand_pool()
    assert sibling_ranks(pool.parents, logq)[0].tolist() == [0, 2, 1, 3, 1, 2, 1]
    # ties go to the lower index; padding (invalid) gets 0 and does not rank among the root's
    parents = np.array([[-1, 0, 0, 0, 0], [-1, 0, 0, 0, 0]])
    logq2 = np.array([[0, -1, -1, -0.5, -np.inf], [0, -1, -2, -np.inf, -np.inf]])
    valid = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    assert sibling_ranks(parents, logq2, valid).tolist() == [[0, 2, 3, 1, 4], [0, 1, 2, 0, 0]]


def test_fill_shape_by_hand():
    """Shape: r1, r2 under the root; r1 under r1; r1, r2 under r2; r1 under (r1, r1). In the
    pool: r1 = node 2, r2 = node 1, (r1, r1) = node 4, (r2, r1) = node 6; (r2, r2) is missing
    (node 1 has one child) and node 4 was never expanded, so those two are dropped."""
    pool, logq = hand_pool()
    shape = Shape(np.array([-1, 0, 0, 1, 2, 2, 3]), np.array([0, 1, 2, 1, 1, 2, 1]), 0.0)
    nodes = fill_shape(pool, logq, shape)
    assert nodes.tolist() == [0, 1, 2, 4, 6]
    pool.subtree(nodes)  # ancestor-closed
    # a node under a dropped one is dropped too, even where the pool has that rank elsewhere
    shape = Shape(np.array([-1, 0, 0, 0, 0, 4]), np.array([0, 1, 2, 3, 4, 1]), 0.0)
    assert fill_shape(pool, logq, shape).tolist() == [0, 1, 2, 3]


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 20), st.integers(1, 4))
def test_shape_mask_is_fill_shape(seed, budget, max_depth):
    """The batch form agrees with the one-pool fill on EAGLE-2 pools of several sizes, padded."""
    rng = np.random.default_rng(seed)
    pair = ToyPair(vocab_size=16, seed=int(rng.integers(1000)), closeness=0.6)
    p = sorted(rng.random(4), reverse=True)
    shape = optimal_shape(p, budget, max_depth)
    pools, batch = padded_pools(rng, pair)
    mask = shape_mask(batch, shape)
    for row, (pool, logq) in enumerate(pools):
        assert np.flatnonzero(mask[row]).tolist() == fill_shape(pool, logq, shape).tolist()


def padded_pools(rng, pair) -> tuple[list, PoolBatch]:
    """Three EAGLE-2 pools of 1-3 levels, and the batch of them, padded."""
    pools = [expand(pair.draft_row, rng.integers(16, size=2).tolist(), top_k=3,
                    depth=int(rng.integers(1, 4))) for _ in range(3)]
    n = max(len(pool) for pool, _ in pools)
    batch = PoolBatch(np.stack([np.pad(pool.tokens, (0, n - len(pool)), constant_values=-1)
                                for pool, _ in pools]),
                      np.stack([np.pad(pool.parents, (0, n - len(pool))) for pool, _ in pools]),
                      np.stack([np.pad(lq, (0, n - len(lq)), constant_values=-np.inf)
                                for _, lq in pools]), np.array([len(pool) for pool, _ in pools]))
    return pools, batch


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31))
def test_depths_and_positional_values_are_a_sweep_over_the_nodes(seed):
    """The level-step sweeps (`PoolBatch.depth`, `from_parents`) give each pool node its tree
    depth and the sum of its path's log p[rank], bit for bit what a sweep over the nodes in
    order adds up; padding gets depth 0 and value -inf."""
    rng = np.random.default_rng(seed)
    pair = ToyPair(vocab_size=16, seed=int(rng.integers(1000)), closeness=0.6)
    pools, batch = padded_pools(rng, pair)
    p = sorted(rng.random(2), reverse=True)
    depth, value = batch.depth, positional_logvalue(batch, p)
    for row, (pool, logq) in enumerate(pools):
        ranks = sibling_ranks(pool.parents, logq)[0]
        swept = np.zeros(len(pool))
        for i in range(1, len(pool)):
            edge = np.log(p[ranks[i] - 1]) if ranks[i] <= len(p) else -np.inf
            swept[i] = swept[pool.parents[i]] + edge
        assert depth[row, : len(pool)].tolist() == pool.depth.tolist()
        assert value[row, : len(pool)].tolist() == swept.tolist()
        assert not depth[row, len(pool):].any() and np.all(value[row, len(pool):] == -np.inf)


def test_shape_mask_by_hand():
    pool, logq = hand_pool()
    shape = Shape(np.array([-1, 0, 0, 1, 2, 2, 3]), np.array([0, 1, 2, 1, 1, 2, 1]), 0.0)
    mask = shape_mask(PoolBatch.of_pool(pool, logq), shape)
    assert np.flatnonzero(mask[0]).tolist() == [0, 1, 2, 4, 6]


def test_positional_value_and_rule_by_hand():
    pool, logq = hand_pool()
    batch = PoolBatch.of_pool(pool, logq)
    value = np.exp(positional_logvalue(batch, [0.5, 0.3, 0.1], 2))[0]
    np.testing.assert_allclose(value, [1, 0.3, 0.5, 0.1, 0.25, 0.15, 0.15])
    assert np.exp(positional_logvalue(batch, [0.5, 0.3, 0.1], 1))[0, 4:].tolist() == [0, 0, 0]
    assert np.exp(positional_logvalue(batch, [0.5, 0.3], 2))[0, 3] == 0  # rank 3 past p
    rule = sequoia_rule([0.5, 0.3, 0.1], 2)
    assert rule.select(pool, logq, 3).tolist() == [0, 1, 2, 4]
    assert sequoia_rule([0.5, 0.3, 0.1], 1).select(pool, logq, 3).tolist() == [0, 1, 2, 3]


def complete_pool(k, d, seed):
    """A pool that expanded every node: the complete k-ary tree of depth d, random draft
    log-probs, rows of children in rank order of a shuffled index (ranks come from logq)."""
    rng = np.random.default_rng(seed)
    tokens, parents, logq, level = [0], [-1], [0.0], [0]
    for _ in range(d):
        nxt = []
        for node in level:
            lp = np.log(rng.dirichlet(np.ones(k + 1))[:k])
            for tok, lq in enumerate(rng.permutation(lp)):
                nxt.append(len(tokens))
                tokens.append(tok)
                parents.append(node)
                logq.append(logq[node] + lq)
        level = nxt
    return Tree(tokens, parents), np.array(logq)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0.05, 0.9), min_size=2, max_size=3, unique=True), st.integers(1, 12),
       st.integers(1, 3), st.integers(0, 2**31))
def test_rule_is_the_shape_on_a_complete_pool(p, budget, max_depth, seed):
    """With p falling with the rank and a pool holding every node, the rule's top-B tree and
    the filled optimal shape have the same value, and both the DP's."""
    p = sorted(p, reverse=True)
    pool, logq = complete_pool(len(p), max_depth, seed)
    shape = optimal_shape(p, budget, max_depth)
    filled = fill_shape(pool, logq, shape)
    assert len(filled) == len(shape.parents)  # nothing dropped
    chosen = sequoia_rule(p, max_depth).select(pool, logq, budget)
    value = np.exp(positional_logvalue(PoolBatch.of_pool(pool, logq), p, max_depth))[0]
    assert value[filled[1:]].sum() == pytest.approx(shape.value, abs=1e-12)
    assert value[chosen[1:]].sum() == pytest.approx(shape.value, abs=1e-12)


def test_rule_on_an_eagle_pool_scores_like_it_selects():
    """On a real EAGLE-2 pool the rule is an ordinary Rule: its scores pass the rule's checks,
    and Rule.expected at each budget is the reach summed over what select() picks."""
    pair = ToyPair(vocab_size=24, seed=3, closeness=0.7)
    pool, logq = expand(pair.draft_row, [1, 2, 3], top_k=4, depth=3)
    batch = PoolBatch.of_pool(pool, logq)
    edge = np.r_[1.0, [pair.target_row([1, 2, 3] + pool.path_tokens(int(i)))[t]
                      for i, t in zip(pool.parents[1:], pool.tokens[1:], strict=True)]]
    reach = reach_batch(batch.parents, edge[None])
    rule = sequoia_rule([0.5, 0.2, 0.1, 0.05], 2)
    budgets = [1, 3, 8, 15]
    accepted, nodes = rule.expected(batch, reach, budgets)
    for j, b in enumerate(budgets):
        chosen = rule.select(pool, logq, b)
        assert accepted[0, j] == pytest.approx(reach[0, chosen[1:]].sum())


# -- the acceptance vector -------------------------------------------------------------------

def two_pools(reach_a, reach_b):
    """Pool A: root, first level ranks 1, 2, 3 at nodes 1, 2, 3. Pool B: node 1 rank 2, node 2
    rank 1, padded to 4 nodes."""
    batch = PoolBatch(np.array([[0, 1, 2, 3], [0, 4, 5, -1]]), np.array([[-1, 0, 0, 0], [-1, 0, 0, 0]]),
                      np.array([[0, -0.1, -1, -2], [0, -2, -0.5, -np.inf]]), np.array([4, 3]))
    return batch, np.array([reach_a, reach_b], dtype=float)


def test_acceptance_vector_by_hand():
    # greedy: A's target took rank 2, B's rank 1
    batch, reach = two_pools([1, 0, 1, 0], [1, 0, 1, 0])
    np.testing.assert_allclose(acceptance_vector(batch, reach, 3), [0.5, 0.5, 0.0])
    # sampling: the reach of a first-level node is the target's probability of its token
    batch, reach = two_pools([1, 0.6, 0.3, 0.05], [1, 0.2, 0.7, 0])
    np.testing.assert_allclose(acceptance_vector(batch, reach, 3), [0.65, 0.25, 0.025])
    np.testing.assert_allclose(acceptance_vector(batch, reach, 2), [0.65, 0.25])
    with pytest.raises(ValueError, match="at must be"):
        acceptance_vector(batch, reach, 3, at="leaves")


def brute_acceptance(pools, reaches, max_rank, at):
    num, den = np.zeros(max_rank), 0.0
    for (pool, logq), reach in zip(pools, reaches, strict=True):
        for v in range(len(pool)):
            if at == "root" and v > 0:
                break
            kids = [int(c) for c in pool.children(v)]
            if not kids:
                continue
            den += reach[v]
            for rank, c in enumerate(sorted(kids, key=lambda c: (-logq[c], c)), start=1):
                if rank <= max_rank:
                    num[rank - 1] += reach[c]
    return num / den


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from(["root", "expanded"]), st.integers(1, 5))
def test_acceptance_vector_is_the_loop(seed, at, max_rank):
    rng = np.random.default_rng(seed)
    pair = ToyPair(vocab_size=16, seed=int(rng.integers(1000)), closeness=0.6)
    pools, reaches = [], []
    for _ in range(3):
        context = rng.integers(16, size=3).tolist()
        pool, logq = expand(pair.draft_row, context, top_k=3, depth=int(rng.integers(1, 4)))
        edge = np.r_[1.0, [pair.target_row(context + pool.path_tokens(int(i)))[t]
                          for i, t in zip(pool.parents[1:], pool.tokens[1:], strict=True)]]
        pools.append((pool, logq))
        reaches.append(reach_batch(pool.parents[None], edge[None])[0])
    n = max(len(p) for p, _ in pools)
    batch = PoolBatch(*[np.stack([np.pad(a, (0, n - len(a)), constant_values=fill) for a in arrays])
                        for arrays, fill in (([p.tokens for p, _ in pools], -1),
                                             ([p.parents for p, _ in pools], 0),
                                             ([lq for _, lq in pools], -np.inf))],
                      np.array([len(p) for p, _ in pools]))
    reach = np.stack([np.pad(r, (0, n - len(r))) for r in reaches])
    got = acceptance_vector(batch, reach, max_rank, at)
    np.testing.assert_allclose(got, brute_acceptance(pools, reaches, max_rank, at), atol=1e-12)


def test_acceptance_vector_refuses_bad_p():
    for bad in ([], [1.2], [-0.1], [np.nan]):
        with pytest.raises(ValueError, match="probabilities"):
            optimal_shape(bad, 3, 2)
