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


def learned_features(pool, logq, root_logp, stale_logp, floor=-30.0):
    """{first-level node: {feature: value}} for the learned rules, node by node (root_logp and
    stale_logp: {token: log-prob}; stale_logp None where there is no previous row)."""
    first = [i for i in range(1, len(pool)) if pool.parents[i] == 0]
    depth = [0] * len(pool)
    for i in range(1, len(pool)):
        depth[i] = depth[int(pool.parents[i])] + 1
    deepest = max(depth)
    k = max(len(first) - 1, 1)

    def rank(value):
        order = sorted(first, key=lambda i: (-value[i], i))
        return {i: order.index(i) / k for i in first}

    def clip(x):
        return max(x, floor)

    draft = {i: clip(logq[i]) for i in first}
    stale = {i: (clip(stale_logp[int(pool.tokens[i])]) if stale_logp is not None else draft[i])
             for i in first}
    out = {i: {"draft_logp": draft[i], "stale_logp": stale[i],
               "stale_missing": float(stale_logp is None)} for i in first}
    ranks = {"draft_rank": rank(draft), "stale_rank": rank(stale)}
    if root_logp is not None:
        root = {i: clip(root_logp[int(pool.tokens[i])]) for i in first}
        ranks["root_rank"] = rank(root)
        for i in first:
            out[i]["root_logp"] = root[i]
    for i in first:
        for name, r in ranks.items():
            out[i][name] = r[i]
        children = [c for c in range(1, len(pool)) if pool.parents[c] == i]
        cond = [logq[c] - logq[i] for c in children]
        out[i]["child_best"] = clip(max(cond)) if cond else floor
        out[i]["child_mass"] = clip(np.log(sum(np.exp(cond)))) if cond else floor
        leaves = [n for n in below(pool, i) if depth[n] == deepest and depth[n] >= 2]
        out[i]["chain_best"] = (clip(max((logq[n] - logq[i]) / (depth[n] - 1) for n in leaves))
                                if leaves else floor)
    return out


def learned(pool, logq, budget, features: dict, weights: dict):
    """The learned rules' tree: each branch scored w . features, the draft below it."""
    branch = {f: sum(weights[k] * v for k, v in feats.items() if k in weights)
              for f, feats in features.items()}
    score = {}
    for i in range(1, len(pool)):
        f = first_level(pool, i)
        score[i] = branch[f] + (logq[i] - logq[f])
        if np.isnan(score[i]):
            score[i] = -np.inf
    return [0] + top(range(1, len(pool)), score, budget)
