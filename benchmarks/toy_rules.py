"""Mean expected acceptance of each selection rule on the toy pair, at budgets 2..32.

Every rule is scored on the same contexts (random prompts and the target's own continuation), with
the exact edge probabilities of the toy target, as the row-log scorer does for real models.
`pearl`, `first_token` and `first_token_redraft` draw t0 from the root row (one exact sample per
context) and commit it on top of the accepted draft tokens counted here; `pearl` and
`first_token` take their tree below t0 from the root pool, `first_token_redraft` from a pool
drafted anew under t0.

    python benchmarks/toy_rules.py [--contexts 2000] [--out benchmarks/results/toy_rules.md]
"""

from __future__ import annotations

import argparse

import numpy as np

from targetrows import Tree, expected_accepted
from targetrows.core import pool
from targetrows.core.atomic import atomic_write_text
from targetrows.core.rules.after_t0 import first_token, pearl
from targetrows.core.rules.root_pool import draft_rank, target_rerank
from targetrows.core.rules.rule import draw_first_token, first_level_logp, tree_after_t0
from targetrows.core.toy import ToyPair

BUDGETS = (2, 4, 8, 16, 32)
RULES = ("draft_rank", "target_rerank", "pearl", "first_token", "first_token_redraft")


def edge_probs(pair: ToyPair, context: list[int], tree: Tree) -> np.ndarray:
    rows = np.stack([pair.target_row(context + tree.path_tokens(i)) for i in range(len(tree))])
    edge = np.ones(len(tree))
    edge[1:] = rows[tree.parents[1:], tree.tokens[1:]]
    return edge


def score_context(pair, context, rng, top_k, depth):
    """{(rule, budget): expected accepted draft tokens} at one context."""
    cand, logq = pool.expand(pair.draft_row, context, top_k, depth)
    edge = edge_probs(pair, context, cand)
    root_row = pair.target_row(context)
    t0 = draw_first_token(root_row, rng)
    under, under_logq = pool.expand(pair.draft_row, context + [t0], top_k, depth)
    under_edge = edge_probs(pair, context + [t0], under)
    out = {}
    for b in BUDGETS:
        dr = draft_rank.select(cand, logq, b)
        rr = target_rerank.select(cand, logq, b, root_logp=first_level_logp(cand, root_row))
        redraft = draft_rank.select(under, under_logq, b)
        out["draft_rank", b] = expected_accepted(cand.subtree(dr), edge[dr])
        out["target_rerank", b] = expected_accepted(cand.subtree(rr), edge[rr])
        out["first_token_redraft", b] = expected_accepted(under.subtree(redraft),
                                                          under_edge[redraft])
        for rule, kept in (("pearl", pearl.select(cand, logq, b, t0=t0)),
                           ("first_token", first_token.select(cand, logq, b, t0=t0))):
            tree = tree_after_t0(cand, kept, t0)
            out[rule, b] = expected_accepted(tree, edge[kept]) if len(kept) else 0.0
            out[f"{rule}_nodes", b] = tree.budget
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, default=2000)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--closeness", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--depth", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/toy_rules.md")
    args = parser.parse_args()
    pair = ToyPair(args.vocab, args.seed, args.closeness)
    rng = np.random.default_rng(args.seed)
    scores = []
    for _ in range(args.contexts):
        context = rng.integers(0, args.vocab, size=int(rng.integers(2, 12))).tolist()
        scores.append(score_context(pair, context, rng, args.top_k, args.depth))
    mean = {k: np.mean([s[k] for s in scores]) for k in scores[0]}
    lines = [
        f"Toy pair: vocab {args.vocab}, closeness {args.closeness}, pool top_k {args.top_k} x "
        f"depth {args.depth}, {args.contexts} contexts, seed {args.seed} "
        f"(`python benchmarks/toy_rules.py`).",
        "Mean expected accepted draft tokens per round; the rules after t0 also commit t0. "
        "`pearl` and `first_token` verify fewer nodes than the budget (mean in brackets): "
        "`first_token`'s tree contains `pearl`'s.",
        "",
        "| rule | " + " | ".join(f"B={b}" for b in BUDGETS) + " |",
        "|---|" + "---|" * len(BUDGETS),
    ]
    for rule in RULES:
        cells = [f"{mean[rule, b]:.3f}" for b in BUDGETS]
        if (f"{rule}_nodes", BUDGETS[0]) in mean:
            cells = [f"{c} ({mean[f'{rule}_nodes', b]:.1f})"
                     for c, b in zip(cells, BUDGETS, strict=True)]
        lines.append(f"| {rule} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    atomic_write_text(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
