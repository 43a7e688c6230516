import numpy as np
import pytest

from targetrows import Tree


def test_derived_fields():
    #        0
    #      /   \
    #     1(5)  2(6)
    #     |
    #     3(7)
    t = Tree([9, 5, 6, 7], [-1, 0, 0, 1])
    assert t.depth.tolist() == [0, 1, 1, 2]
    assert t.children(0).tolist() == [1, 2]
    assert t.path(3).tolist() == [1, 3]
    assert t.path(0).tolist() == []
    assert t.child_with_token(1, 7) == 3
    assert t.child_with_token(2, 7) == -1
    mask = t.ancestor_mask()
    assert mask.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, False, True, False],
        [True, True, False, True],
    ]
    assert t.budget == 3


def test_subtree_and_reroot():
    t = Tree([9, 5, 6, 7, 8], [-1, 0, 0, 1, 1])
    s = t.subtree([0, 1, 4])
    assert s.tokens.tolist() == [9, 5, 8] and s.parents.tolist() == [-1, 0, 1]
    r, index_map = t.reroot(1)
    assert r.tokens.tolist() == [5, 7, 8] and r.parents.tolist() == [-1, 0, 0]
    assert index_map.tolist() == [1, 3, 4]
    with pytest.raises(ValueError, match="ancestor-closed"):
        t.subtree([0, 3])


@pytest.mark.parametrize(
    "tokens, parents, message",
    [
        ([1, 2], [-1], "differ in length"),
        ([1, 2], [0, 0], "parents\\[0\\] must be -1"),
        ([1, 2, 3], [-1, 0, 2], "node 2 has parent 2"),  # a self-loop
        ([1, 2, 3], [-1, 2, 1], "node 1 has parent 2"),  # a cycle 1 -> 2 -> 1
        ([1, 2, 3], [-1, 0, 5], "node 2 has parent 5"),
        ([1, 4, 4], [-1, 0, 0], "node 2 repeats token 4 among the children of node 0"),
        ([], [], "at least the root"),
        ([1, 2**32], [-1, 0], "node 1 has a token id past 2\\*\\*32"),
    ],
)
def test_malformed_trees_name_the_node(tokens, parents, message):
    with pytest.raises(ValueError, match=message):
        Tree(tokens, parents)


def test_same_token_under_different_parents_is_fine():
    Tree([1, 4, 5, 4], [-1, 0, 0, 2])


@pytest.mark.parametrize("shape", ["random", "levels", "chain"])
def test_depths_ancestors_and_descendants_match_walks_up_the_tree(shape):
    """Depth, ancestor rows and descendants, each against a walk up from every node by
    `parents` alone: on a random tree, a pool numbered level by level, and a chain (a run of
    one node at a time)."""
    rng = np.random.default_rng(0)
    if shape == "random":
        parents = [-1] + [int(rng.integers(0, i)) for i in range(1, 40)]
    elif shape == "levels":  # 3 levels of 4 children under the best 2 of the level above
        parents, level = [-1], [0]
        for _ in range(3):
            start = len(parents)
            parents += [p for p in level[:2] for _ in range(4)]
            level = list(range(start, len(parents)))
    else:
        parents = list(range(-1, 39))
    t = Tree(np.arange(len(parents)), parents)

    def up(i):  # i and its ancestors
        return {i} | (up(parents[i]) if i else set())

    brute = np.array([[j in up(i) for j in range(len(t))] for i in range(len(t))])
    assert t.depth.tolist() == [len(up(i)) - 1 for i in range(len(t))]
    assert np.array_equal(t.ancestor_mask(), brute)
    assert t.ancestor_mask() is t.ancestor_mask() and not t.ancestor_mask().flags.writeable
    for node in range(len(t)):
        assert t.descendants(node).tolist() == np.flatnonzero(brute[:, node]).tolist()


def test_merge_trees_holds_every_path_once_and_maps_each_node_to_its_path():
    from targetrows.core.tree import merge_trees

    rng = np.random.default_rng(0)
    trees = []
    for _ in range(6):  # random trees over 4 tokens: many shared paths
        paths = {()}
        for _ in range(int(rng.integers(0, 12))):
            parent = sorted(paths)[int(rng.integers(len(paths)))]
            if len(parent) < 4:
                paths.add(parent + (int(rng.integers(4)),))
        order = sorted(paths, key=lambda p: (len(p), p))
        index = {p: i for i, p in enumerate(order)}
        trees.append(Tree([7] + [p[-1] for p in order[1:]],
                          [-1] + [index[p[:-1]] for p in order[1:]]))
    union, where = merge_trees(trees)
    path_of = {i: tuple(union.path_tokens(i)) for i in range(len(union))}
    assert len(set(path_of.values())) == len(union)  # each path once
    assert set(path_of.values()) == {tuple(t.path_tokens(i)) for t in trees for i in range(len(t))}
    for tree, at in zip(trees, where, strict=True):
        assert [path_of[int(j)] for j in at] == [tuple(tree.path_tokens(i)) for i in range(len(tree))]
    with pytest.raises(ValueError, match="same root token"):
        merge_trees([Tree([1], [-1]), Tree([2], [-1])])
