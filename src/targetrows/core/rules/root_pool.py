"""The rules that verify the root pool's best nodes: EAGLE-2's draft ranking and its reranked
forms, which replace the draft's first-level log-probs by a target row's.

    draft_rank     the top-B nodes by cumulative draft log-prob (EAGLE-2).
    target_rerank  the same with each first-level log-prob from the target's exact root row
                   (the separate root pass): the draft ranks its own first guess worst.
    stale_rerank   the same with the target's row at the previous context, which the last
                   verify pass computed anyway (inexact reuse; no root pass). A pool without
                   that row (a one-token prompt at its first position) is ranked by the draft.
"""

from __future__ import annotations

import numpy as np

from .batch import PoolBatch
from .rule import Rule, draft_scores


def root_row_scores(batch: PoolBatch) -> np.ndarray:
    if batch.root_logp is None:
        raise ValueError("target_rerank reads the exact root row: the pools carry no root_logp")
    return batch.rescored_first(batch.root_logp)


def stale_row_scores(batch: PoolBatch) -> np.ndarray:
    if batch.stale_logp is None:
        return batch.logq
    score = batch.rescored_first(batch.stale_logp)
    none = np.isnan(score).any(axis=1)  # no previous row: rank by the draft alone
    score[none] = batch.logq[none]
    return score


draft_rank = Rule("draft_rank", "top-B pool nodes by cumulative draft log-prob (EAGLE-2)",
                  draft_scores)
target_rerank = Rule("target_rerank", "draft_rank with first-level log-probs from the exact "
                     "root row", root_row_scores, reads=("root_row",),
                     baselines=("draft_rank", "stale_rerank"))
stale_rerank = Rule("stale_rerank", "draft_rank with first-level log-probs from the previous "
                    "context's row (inexact reuse, no root pass)", stale_row_scores,
                    reads=("stale_row",), baselines=("draft_rank",))
