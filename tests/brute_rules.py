"""The paper's selection rules written out from their definitions, node by node, with nothing of
the library's rule code: the reference that `Rule.select` and the row-log scorer are checked
against. Every function returns sorted pool node indices."""

import numpy as np


def first_level(pool, i):
    while pool.parents[i] > 0:
        i = int(pool.parents[i])
    return i


def top(nodes, score, budget):
    """The `budget` best of `nodes` by score, ties to the lower index."""
    ranked = sorted(nodes, key=lambda i: (-score[i], i))
    return sorted(ranked[:budget])


def draft_rank(pool, logq, budget):
    return [0] + top(range(1, len(pool)), logq, budget)


def rerank(pool, logq, budget, first_logp):
    """`first_logp`: {first-level token: the row's log-prob}; a node's score is its first-level
    token's log-prob under the row plus the draft's log-prob below that node."""
    score = {}
    for i in range(1, len(pool)):
        f = first_level(pool, i)
        score[i] = first_logp[int(pool.tokens[f])] + (logq[i] - logq[f])
        if np.isnan(score[i]):  # below a first-level token the draft ruled out
            score[i] = -np.inf
    return [0] + top(range(1, len(pool)), score, budget)


def below(pool, node):
    return [i for i in range(node + 1, len(pool)) if first_level(pool, i) == node]


def t0_node(pool, t0):
    hits = [i for i in range(1, len(pool)) if pool.parents[i] == 0 and pool.tokens[i] == t0]
    return hits[0] if hits else -1


def pearl(pool, logq, budget, t0):
    node = t0_node(pool, t0)
    kept = set(draft_rank(pool, logq, budget))
    if node < 0 or node not in kept:
        return []
    return [node] + [i for i in below(pool, node) if i in kept]


def first_token(pool, logq, budget, t0):
    node = t0_node(pool, t0)
    if node < 0:
        return []
    return [node] + top(below(pool, node), logq, budget)


def tree_after(pool, kept, t0):
    """(tokens, parents, pool index of each node) of the tree rooted at t0's node holding
    `kept`, or just t0."""
    if not kept:
        return [t0], [-1], [-1]
    index = {old: new for new, old in enumerate(kept)}
    parents = [-1] + [index[int(pool.parents[i])] for i in kept[1:]]
    return [int(pool.tokens[i]) for i in kept], parents, list(kept)
