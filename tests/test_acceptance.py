import numpy as np
import pytest

from targetrows import (
    Tree,
    expected_accepted,
    expected_accepted_batch,
    expected_accepted_greedy,
    verify,
)


def test_hand_computed():
    # chain 0 -> 1 -> 2 with edge probs .5 and .4: E = .5 + .5 * .4
    chain = Tree([0, 1, 2], [-1, 0, 1])
    assert expected_accepted(chain, [1, 0.5, 0.4]) == pytest.approx(0.7)
    # two branches at the root, .3 and .6, one grandchild under the second at .5
    t = Tree([0, 1, 2, 3], [-1, 0, 0, 2])
    assert expected_accepted(t, [1, 0.3, 0.6, 0.5]) == pytest.approx(0.3 + 0.6 + 0.3)
    assert expected_accepted(Tree.root_only(3), [1.0]) == 0.0


def _random_tree_and_rows(rng, n, vocab):
    """A random tree with a target row at every node and the edge probabilities it implies."""
    parents, tokens = [-1], [0]
    used = {}
    for i in range(1, n):
        open_parents = [q for q in range(i) if len(used.get(q, ())) < vocab]
        p = int(rng.choice(open_parents))
        free = [t for t in range(vocab) if t not in used.setdefault(p, set())]
        tok = int(rng.choice(free))
        used[p].add(tok)
        parents.append(p)
        tokens.append(tok)
    tree = Tree(tokens, parents)
    rows = rng.dirichlet(np.full(vocab, 0.3), size=n)
    edge = np.ones(n)
    edge[1:] = rows[tree.parents[1:], tree.tokens[1:]]
    return tree, rows, edge


def test_matches_monte_carlo_of_verify():
    rng = np.random.default_rng(1)
    for _ in range(5):
        tree, rows, edge = _random_tree_and_rows(rng, 12, 5)
        samples = np.array([len(verify(tree, rows, rng)[0]) for _ in range(20_000)])
        se = samples.std() / np.sqrt(len(samples))
        assert abs(samples.mean() - expected_accepted(tree, edge)) < 4 * se + 1e-12


def test_batch_equals_single_with_padding():
    rng = np.random.default_rng(2)
    trees = [_random_tree_and_rows(rng, int(rng.integers(1, 16)), 6) for _ in range(50)]
    n = 16
    parents = np.zeros((50, n), dtype=np.int64)
    edge = np.zeros((50, n))
    valid = np.zeros((50, n), dtype=bool)
    for i, (tree, _, e) in enumerate(trees):
        parents[i, : len(tree)] = tree.parents
        parents[i, 0] = -1
        edge[i, : len(tree)] = e
        valid[i, : len(tree)] = True
    got = expected_accepted_batch(parents, edge, valid, chunk=7)
    want = [expected_accepted(t, e) for t, _, e in trees]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_greedy_longest_matching_path():
    t = Tree([0, 1, 2, 3, 4], [-1, 0, 0, 2, 3])
    assert expected_accepted_greedy(t, [2, 3, 4, 9]) == 3
    assert expected_accepted_greedy(t, [2, 4]) == 1
    assert expected_accepted_greedy(t, [7]) == 0
    # verify at temperature 0 accepts the same path when rows are one-hot at the continuation
    rows = np.zeros((5, 10))
    rows[[0, 2, 3, 4], [2, 3, 4, 9]] = 1
    rows[1, 0] = 1
    path, bonus = verify(t, rows)
    assert path.tolist() == [2, 3, 4] and bonus == 9


@pytest.mark.parametrize(
    "edge, message",
    [([1, np.nan, 0.5], "NaN"), ([1, 1.5, 0.5], "out of range"), ([1, 0.5], "2 entries")],
)
def test_bad_edge_probs(edge, message):
    with pytest.raises(ValueError, match=message):
        expected_accepted(Tree([0, 1, 2], [-1, 0, 1]), edge)


def test_verify_rejects_bad_shapes():
    t = Tree([0, 1], [-1, 0])
    with pytest.raises(ValueError, match="rows must be \\[2, vocab\\]"):
        verify(t, np.full((3, 4), 0.25))
