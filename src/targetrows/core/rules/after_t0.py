"""The rules that commit a first token t0, drawn from the target's exact root row, before their
tree: the tree hangs from t0, so every accepted node comes on top of it.

    pearl                a B-node draft_rank tree drafted before t0 is known, pruned to the
                         subtree under t0 (PEARL-style).
    first_token          the paper's first-token sampling: the top-B nodes below t0's
                         first-level node of the same root pool (nothing when t0 is not a
                         first-level pool token). Ranked by the same draft scores, it always
                         contains pearl's tree at the same B.
    first_token_redraft  a draft_rank tree of B nodes from a pool drafted anew under t0 (an
                         extension, not the paper's rule).
"""

from __future__ import annotations

from .rule import Rule, draft_scores

pearl = Rule("pearl", "a B-node draft_rank tree drafted before t0, pruned to t0's subtree",
             draft_scores, tree="pruned")
first_token = Rule("first_token", "t0 from the exact root row, then the top-B nodes below t0 in "
                   "the same root pool", draft_scores, tree="below_t0", baselines=("pearl",))
first_token_redraft = Rule("first_token_redraft", "t0 from the exact root row, then a B-node "
                           "draft_rank tree from a pool drafted anew under t0 (an extension, not "
                           "the paper's rule)", draft_scores, tree="redraft", baselines=("pearl",),
                           paper=False)
