"""Token recycling and RACER's retrieval (`targetrows.core.recycle`, `targetrows.core.ngram_trie`):
hand-worked examples, and brute forces written here with plain loops, following the published
code (RACER: racer/automaton/src/automaton.cpp; Token Recycling:
evaluation/inference_recycling.py) rather than ours."""

from collections import deque

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from targetrows.core.ngram_trie import Candidate, NgramTrie
from targetrows.core.recycle import (
    TOKEN_RECYCLING_BRANCHES,
    TOKEN_RECYCLING_TEMPLATE,
    Recycler,
    TokenTable,
    fill_template,
    racer_tree,
    table_tree,
    template_from_branches,
)
from targetrows.core.tree import Tree


def paths_of(tree: Tree) -> set[tuple[int, ...]]:
    """Every non-root node as the tuple of tokens from the root's child down to it."""
    return {tuple(tree.path_tokens(i)) for i in range(1, len(tree))}


def random_table(rng, vocab, k, seen=1.0) -> TokenTable:
    """A table whose rows are k distinct random ids; a share 1 - `seen` of tokens has none."""
    table = TokenTable(vocab, k)
    tokens = np.flatnonzero(rng.random(vocab) < seen)
    rows = np.stack([rng.permutation(vocab)[:k] for _ in tokens]) if len(tokens) else \
        np.zeros((0, k), dtype=np.int64)
    table.update(tokens, rows)
    return table


# -- the published breadth-first growth, written out from RACER's TokenBin::retrieve -----------

def published_token_bin(adj: dict, next_token: int, max_num_draft: int, top_k: int) -> list:
    """RACER's TokenBin::retrieve (automaton.cpp:78-121), with `adj` a dict token -> row and a
    token without a row treated like their `token >= adj_matrix.size()`: a leaf (their zero
    rows, which propose token 0, are a departure docs/prior-art.md records). Returns the
    candidates: root-to-leaf token lists, the root included."""
    if next_token not in adj:
        return [[next_token]]
    candidates = []
    q = [(next_token, -1, top_k, 0)]  # (token, pos_parent, breadth, depth)
    max_num_draft -= 1  # the root counts
    head = 0
    while head < len(q):
        token, _, breadth, depth = q[head]
        head += 1
        pos_u = head - 1
        if max_num_draft > 0 and breadth > 0 and token in adj:
            next_breadth = breadth if depth == 1 else breadth >> 1
            i = 0
            while i < breadth and max_num_draft > 0:
                q.append((adj[token][i], pos_u, max(1, next_breadth), depth + 1))
                next_breadth >>= 1
                max_num_draft -= 1
                i += 1
        else:
            candidate = []
            while pos_u >= 0:
                candidate.append(q[pos_u][0])
                pos_u = q[pos_u][1]
            candidates.append(candidate[::-1])
    return candidates


def trie_paths(candidates: list) -> set:
    """The non-root nodes of the trie the candidates (each starting with the root) merge into."""
    out = set()
    for c in candidates:
        for end in range(2, len(c) + 1):
            out.add(tuple(c[1:end]))
    return out


def as_dict(table: TokenTable) -> dict:
    return {t: table.ids[t].tolist() for t in range(table.vocab_size) if table.ids[t, 0] >= 0}


# -- the token table ------------------------------------------------------------------------------

def test_table_rows_by_hand():
    table = TokenTable(10, k=3)
    table.update([2, 5, 2], [[1, 2, 3, 9], [4, 5, 6, 9], [7, 8, 9, 1]])  # wider rows are cut to k
    assert table.ids[2].tolist() == [7, 8, 9]  # the last row for a token wins
    assert table.ids[5].tolist() == [4, 5, 6]
    assert table.ids[0].tolist() == [-1, -1, -1]
    assert table.seen([2, 5, 0]).tolist() == [True, True, False]
    assert np.isnan(table.logp[2]).all()
    table.update([5], [[0, 1, 2]], [[-0.1, -2.0, -3.0]])
    np.testing.assert_allclose(table.logp[5], [-0.1, -2.0, -3.0], rtol=1e-6)
    table.clear()
    assert (table.ids == -1).all()


@pytest.mark.parametrize("tokens, ids, message", [
    ([1], [[2, 2, 3]], "repeats"),
    ([1], [[2, 3]], "must be"),
    ([10], [[1, 2, 3]], "tokens must be"),
    ([1], [[1, 2, 11]], "topk_ids must be ids"),
])
def test_table_refuses_bad_rows(tokens, ids, message):
    with pytest.raises(ValueError, match=message):
        TokenTable(10, k=3).update(tokens, ids)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 7), min_size=0, max_size=30), st.integers(0, 2**31))
def test_table_update_is_the_loop(tokens, seed):
    """One vectorised update equals writing the rows one after another."""
    rng = np.random.default_rng(seed)
    rows = np.stack([rng.permutation(8)[:3] for _ in tokens]) if tokens else np.zeros((0, 3))
    table = TokenTable(8, k=3)
    table.update(tokens, rows)
    loop = {}
    for t, row in zip(tokens, rows, strict=True):
        loop[t] = row.tolist()
    for t in range(8):
        assert table.ids[t].tolist() == loop.get(t, [-1, -1, -1])


def test_verify_pass_rows_deepest_wins():
    """Token 4 sits at depth 2 (node 2) and at depth 1 (node 3): written shallowest first, as
    RACER's breadth-first tree order does, node 2's row wins though node 3 comes later."""
    tree = Tree([0, 1, 4, 4], [-1, 0, 1, 0])
    table = TokenTable(10, k=2)
    table.update_from_tree(tree, [[1, 2], [3, 4], [5, 6], [7, 8]])
    assert table.ids[4].tolist() == [5, 6]
    assert table.ids[0].tolist() == [1, 2] and table.ids[1].tolist() == [3, 4]
    table.clear()
    table.update_from_tree(tree, [[7, 8]], nodes=[3])  # only the nodes a pass computed
    assert table.ids[4].tolist() == [7, 8] and table.ids[0, 0] == -1


# -- the breadth-halving tree -------------------------------------------------------------------

def shifted_table(vocab=100, k=4) -> TokenTable:
    """ids[t] = t+1, ..., t+k: every node's path is readable from its tokens."""
    table = TokenTable(vocab, k)
    t = np.arange(vocab - k)
    table.update(t, t[:, None] + np.arange(1, k + 1))
    return table


def test_table_tree_by_hand():
    """k = 4, budget 10. The root (breadth 4) has 4 children, breadths 2, 1, 1, 1 (4 >> 1, then
    halving, at least 1). At depth 1 a node's first child keeps its breadth: token 1 (breadth
    2) gets children 2, 3 of breadths 2, 1; the others one child each. That is 9 nodes; the
    10th is the first child of node 1 -> 2 (breadth 2 at depth 2, so its first child has
    breadth 1): token 3."""
    tree = table_tree(shifted_table(), 0, budget=10)
    assert paths_of(tree) == {(1,), (2,), (3,), (4,), (1, 2), (1, 3), (2, 3), (3, 4), (4, 5),
                              (1, 2, 3)}
    assert tree.budget == 10


def test_table_tree_level_sizes_k8():
    """With k = 8 and every token seen, the levels of RACER's template hold 8, 12, 17, 18, ...
    nodes (breadths 4,2,1,1,1,1,1,1 under the root; 4,2,1,1 | 2,1 | 1 x 6 at depth 2; ...):
    budget 63 takes the first four levels (55 nodes) and 8 of the fifth."""
    table = random_table(np.random.default_rng(1), 400, 8)
    tree = table_tree(table, 3, budget=63)
    assert np.bincount(tree.depth).tolist() == [1, 8, 12, 17, 18, 8]


def test_table_tree_unseen_tokens_are_leaves():
    table = TokenTable(20, k=2)
    table.update([0, 1], [[1, 2], [3, 4]])  # 2, 3, 4 have no row
    tree = table_tree(table, 0, budget=10)
    assert paths_of(tree) == {(1,), (2,), (1, 3)}  # node 1 has breadth max(1, 2 >> 1 >> 0) = 1
    assert len(table_tree(table, 7, budget=10)) == 1  # no row at the root: nothing to draft


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 80), st.sampled_from([2, 4, 8]),
       st.sampled_from([1.0, 0.7]))
def test_table_tree_is_the_published_bfs(seed, budget, k, seen):
    rng = np.random.default_rng(seed)
    table = random_table(rng, 60, k, seen)
    root = int(rng.integers(60))
    tree = table_tree(table, root, budget)
    expected = trie_paths(published_token_bin(as_dict(table), root, budget + 1, k))
    assert paths_of(tree) == expected
    assert tree.budget <= budget
    if seen == 1.0:
        assert tree.budget == budget  # every node has breadth >= 1: only the budget stops it


# -- a fixed rank template (Token Recycling) ------------------------------------------------------

def test_template_from_branches_by_hand():
    parents, ranks = template_from_branches(((2,), (1, 2), (0, 1, 0), (0,)))
    assert parents.tolist() == [-1, 0, 0, 1, 2, 2, 4]
    assert ranks.tolist() == [0, 1, 2, 1, 1, 2, 1]
    with pytest.raises(ValueError, match="counts"):
        template_from_branches(((2,), (1,)))


def test_token_recycling_template_shape():
    parents, ranks = TOKEN_RECYCLING_TEMPLATE
    depth = np.zeros(len(parents), dtype=int)
    for j in range(1, len(parents)):
        depth[j] = depth[parents[j]] + 1
    assert np.bincount(depth).tolist() == [1, 8, 21, 25, 15, 8, 3]
    assert sum(map(sum, TOKEN_RECYCLING_BRANCHES)) == 80


def test_fill_template_by_hand():
    """Template: two children of the root, the second with children of ranks 1 and 2; token 2
    (the root's rank-2 child) has no row, so its children are dropped."""
    table = TokenTable(10, k=2)
    table.update([0, 1], [[1, 2], [5, 6]])
    parents, ranks = template_from_branches(((2,), (1, 2), (0, 0, 0)))
    tree = fill_template(table, 0, parents, ranks)
    assert paths_of(tree) == {(1,), (2,), (1, 5)}
    # a rank past k is dropped
    assert paths_of(fill_template(table, 0, [-1, 0, 0, 0], [0, 1, 2, 3])) == {(1,), (2,)}


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31))
def test_fill_template_is_token_recyclings_fill(seed):
    """Token Recycling fills its template level by level: the node at rank path (i1..id) gets
    adj[token of (i1..i(d-1))][id] (prepare_data_input_ids in inference_recycling.py)."""
    rng = np.random.default_rng(seed)
    table = random_table(rng, 50, 8)
    parents, ranks = TOKEN_RECYCLING_TEMPLATE
    rank_paths = [()]
    for j in range(1, len(parents)):
        rank_paths.append(rank_paths[parents[j]] + (int(ranks[j]) - 1,))
    adj, root = as_dict(table), int(rng.integers(50))
    token_of = {(): root}
    for path in sorted(rank_paths[1:], key=len):
        token_of[path] = adj[token_of[path[:-1]]][path[-1]]
    expected = {tuple(token_of[path[:d]] for d in range(1, len(path) + 1)) for path in rank_paths[1:]}
    tree = fill_template(table, root, parents, ranks)
    assert paths_of(tree) == expected and tree.budget == 80


# -- the n-gram trie --------------------------------------------------------------------------

def window_count(history, s, n):
    """Windows of n tokens of `history` that start with `s`."""
    return sum(1 for i in range(len(history) - n + 1) if tuple(history[i : i + len(s)]) == tuple(s))


def brute_candidates(history, tail, n, min_match, with_matches):
    """Every (match, continuation) pair from the definition, in the order `rank_key` documents:
    more windows, shorter continuation, longer match, then token ids."""
    out = []
    for m in range(min_match, min(n, len(tail)) + 1):
        suffix = tuple(tail[len(tail) - m :])
        count = window_count(history, suffix, n)
        if count == 0:
            continue
        if with_matches:
            out.append(Candidate(m, (), count))
        seen = set()
        for i in range(len(history) - n + 1):
            if tuple(history[i : i + m]) != suffix:
                continue
            for end in range(i + m + 1, i + n + 1):
                cont = tuple(history[i + m : end])
                if cont not in seen:
                    seen.add(cont)
                    out.append(Candidate(m, cont, window_count(history, suffix + cont, n)))
    return sorted(out, key=lambda c: (-c.count, len(c.tokens), -c.match, c.tokens))


sequences = st.lists(st.integers(0, 3), min_size=0, max_size=60)


@settings(max_examples=80, deadline=None)
@given(sequences, st.lists(st.integers(0, 3), min_size=1, max_size=6), st.integers(2, 6))
def test_trie_counts_are_window_counts(history, s, n):
    trie = NgramTrie(n)
    trie.extend(history)
    assert trie.count(s[:n]) == window_count(history, s[:n], n)
    assert trie.count([]) == max(len(history) - n + 1, 0)


@settings(max_examples=60, deadline=None)
@given(sequences, st.lists(st.integers(1, 20), max_size=5), st.integers(2, 6))
def test_trie_grows_like_one_shot(history, cuts, n):
    """Indexing a sequence as it grows equals indexing it at once."""
    grown = NgramTrie(n)
    for cut in sorted(cuts):
        grown.extend(history[:cut])
    grown.extend(history)
    once = NgramTrie(n)
    once.extend(history)
    tail = history[-n:] if history else [0]
    assert list(grown.ranked(tail, 1)) == list(once.ranked(tail, 1))
    assert len(grown) == len(once)


@settings(max_examples=120, deadline=None)
@given(sequences, st.lists(st.integers(0, 3), min_size=1, max_size=12), st.integers(2, 6),
       st.integers(1, 3), st.booleans())
def test_ranked_continuations_are_the_brute_force(history, tail, n, min_match, with_matches):
    trie = NgramTrie(n)
    trie.extend(history)
    got = list(trie.ranked(tail, min_match, with_matches))
    assert got == brute_candidates(history, tail, n, min_match, with_matches)
    assert trie.top(tail, 5, min_match, with_matches) == got[:5]


def test_trie_by_hand():
    """History a b c a b d a b c (n = 3): windows abc, bca, cab, abd, bda, dab, abc."""
    a, b, c, d = 0, 1, 2, 3
    trie = NgramTrie(3)
    trie.extend([a, b, c, a, b, d, a, b, c])
    assert trie.count([a, b]) == 3 and trie.count([a, b, c]) == 2 and trie.count([b, c]) == 1
    assert trie.matches([d, a, b]) == [(3, trie._node([d, a, b])), (2, trie._node([a, b]))]
    # after "... a b": continuations c (2 windows) and d (1) under the match "a b"; "d a b"
    # is a whole window, with nothing after it
    assert trie.top([d, a, b], 10, with_matches=False) == [Candidate(2, (c,), 2),
                                                           Candidate(2, (d,), 1)]
    # with the matches as candidates (RACER's accounting), "a b" itself first, then c
    assert trie.top([d, a, b], 2) == [Candidate(2, (), 3), Candidate(2, (c,), 2)]


def test_trie_new_sequence_forgets_unless_kept():
    trie = NgramTrie(2)
    trie.extend([1, 2, 1, 2])
    trie.extend([5, 6])  # not an extension: a new history
    assert trie.count([1, 2]) == 0 and trie.count([5, 6]) == 1
    kept = NgramTrie(2, keep_across_sequences=True)
    kept.extend([1, 2, 1, 2])
    kept.extend([2, 5])
    assert kept.count([1, 2]) == 2 and kept.count([2, 5]) == 1
    assert kept.count([2, 2]) == 0  # no window spans the two sequences


# -- RACER's budget split -------------------------------------------------------------------

def published_select(history, tail, n, max_num_draft, min_depth=2):
    """RACER's Automaton::retrieve selection (automaton.cpp:349-468) on the windows of `history`:
    the borders (suffixes of `tail` at least min_depth long that start some window), then a
    breadth-first search from all of them, keeping the max_num_draft most frequent
    (border, node) pairs in a heap that evicts the lowest count, deepest first, and stopping at
    the first layer that adds nothing. Returns the selected continuations (token tuples, the
    borders as ())."""
    borders = []
    for m in range(min(n, len(tail)), min_depth - 1, -1):
        suffix = tuple(tail[len(tail) - m :])
        if window_count(history, suffix, n):
            borders.append(suffix)

    def children(prefix):
        nxt = {tuple(history[i + len(prefix) : i + len(prefix) + 1])
               for i in range(len(history) - n + 1)
               if len(prefix) < n and tuple(history[i : i + len(prefix)]) == prefix}
        return [prefix + t for t in sorted(nxt) if t]

    heap = []  # (freq, absolute depth, border, continuation)
    q = deque((s, s) for s in borders)
    layer, current = [], 0

    def offer(items):
        updated = False
        for u, start in items:
            freq = window_count(history, u, n)
            if len(heap) < max_num_draft or freq > min(h[0] for h in heap):
                updated = True
                heap.append((freq, len(u), start, u))
                if len(heap) > max_num_draft:  # evict the least frequent, the deepest of them
                    heap.remove(min(heap, key=lambda h: (h[0], -h[1])))
        return updated

    while q:
        u, start = q.popleft()
        if len(u) - len(start) > current:
            if not offer(layer):
                layer = []
                break
            layer, current = [], len(u) - len(start)
        layer.append((u, start))
        q.extend((v, start) for v in children(u))
    offer(layer)
    return [h[3][len(h[2]):] for h in heap]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=0, max_size=50), st.integers(1, 40),
       st.integers(3, 6), st.integers(0, 2**31), st.sampled_from([1.0, 0.6]))
def test_racer_tree_is_the_published_retrieval(history, budget, n, seed, seen):
    """RACER's whole draft, brute force: the selection above, merged into a trie with the
    table's breadth-first growth under the budget left (max_num_draft - selected). Counts tied
    across the selection's boundary leave RACER's choice to pointer order, so only draws without
    such a tie are compared."""
    rng = np.random.default_rng(seed)
    table = random_table(rng, 5, 2, seen)
    context = history + [int(rng.integers(5))]
    trie = NgramTrie(n)
    trie.extend(history)
    ranked = list(trie.ranked(context))
    assume(len(ranked) <= budget + 1 or ranked[budget].count > ranked[budget + 1].count)
    chosen = published_select(history, context, n, budget + 1)
    candidates = [[context[-1], *c] for c in chosen]
    candidates += published_token_bin(as_dict(table), context[-1], budget + 1 - len(chosen), 2)
    tree = racer_tree(context, trie, table, budget)
    assert paths_of(tree) == trie_paths(candidates)
    assert tree.budget <= budget


def test_racer_tree_by_hand():
    """History x a b c a b c y a (n = 4; windows xabc abca bcab cabc abcy bcya), root b. The
    only match is "a b" (2 windows; "y a b" starts none). Under it: c (2), then "c a" (1) and
    "c y" (1). RACER's accounting: 1 slot for the match and 3 for the continuations, so a
    budget of 6 leaves 6 - 4 = 2 table nodes: after b the table proposes c (merged with the
    n-gram node, charged all the same) and z."""
    x, a, b, c, y, z = range(6)
    trie = NgramTrie(4)
    history = [x, a, b, c, a, b, c, y, a]
    trie.extend(history)
    table = TokenTable(6, k=2)
    table.update([b, c], [[c, z], [x, y]])
    context = history + [b]
    tree = racer_tree(context, trie, table, budget=6)
    assert paths_of(tree) == {(c,), (c, a), (c, y), (z,)}
    # distinct accounting charges only new nodes: c, ca, cy from the trie; the table's c
    # (merged, free), z, then under c (breadth 1) its first id x; z and x have no rows
    tree = racer_tree(context, trie, table, budget=6, accounting="distinct")
    assert paths_of(tree) == {(c,), (c, a), (c, y), (z,), (c, x)}
    assert tree.budget == 5  # the sources ran dry below the budget


def test_racer_tree_without_matches_is_the_table_tree():
    table = shifted_table()
    trie = NgramTrie(10)
    trie.extend([50, 51, 52])
    assert racer_tree([50, 51, 52, 0], trie, table, 10) == table_tree(table, 0, 10)
    with pytest.raises(ValueError, match="accounting"):
        racer_tree([0], trie, table, 3, accounting="other")


def test_recycler_state():
    rec = Recycler(100, k=4)
    rec.observe([0], [[1, 2, 3, 4]])
    tree = rec.tree([7, 8, 0], budget=3)
    assert paths_of(tree) == {(1,), (2,), (3,)}
    rec.observe_tree(tree, [[9, 10, 11, 12]] * 4)
    assert rec.table.ids[0].tolist() == [9, 10, 11, 12]
    # the trie indexes the history before the root: a 10-gram ending at the root is not in it
    history = list(range(20, 30))
    rec.tree(history, 3)
    assert rec.trie.count(history) == 0 and rec.trie.count(history[:-1]) == 0
    rec.tree(history + [5], 3)
    assert rec.trie.count(history) == 1
    rec.start()  # a new prompt: everything forgotten by default
    assert not rec.table.seen([0])[0] and rec.trie.count(history) == 0
    kept = Recycler(100, k=4, keep_across_prompts=True)
    kept.observe([0], [[1, 2, 3, 4]])
    kept.tree(history + [5], 3)
    kept.start()
    assert kept.table.seen([0])[0] and kept.trie.count(history) == 1
    plain = Recycler(100, k=4, ngrams=False)
    plain.observe([0], [[1, 2, 3, 4]])
    assert plain.tree([0], 2) == table_tree(plain.table, 0, 2)
