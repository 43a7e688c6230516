"""`targetrows train-reranker --rules sequoia`: Sequoia's acceptance vector fitted on row logs,
cross-fitted by prompt like the learned rerankers (NumPy only, seconds).

p[k - 1] is the mean, over the scored positions of the training prompts, of the probability
that verification reaches the root's rank-k first-level pool node (ranks by the draft's
log-prob, `targetrows.core.rules.sequoia.sibling_ranks`): at temperature 0 whether the
target's next token is that node's (the share of positions whose argmax is the rank-k token),
above it the target's probability of it, which is the probability our verification accepts it
with. This is Sequoia's own estimate (tests/test_accept.py in their code measures one level
below the root); it differs in that our verification accepts a node with the target's
probability of its token, where Sequoia's sampling verification draws the children without
replacement (docs/prior-art.md).

Each position's vector is a sum over its pool's first level, so the vectors of a set of prompts
are sums of per-prompt sums: one pass over the logs gives every fold's p. Prompts are dealt
into folds by the rerankers' seeded shuffle (`targetrows.core.rules.learned.prompt_folds`), and
fold k's p is fitted without fold k's prompts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from targetrows.core.rules.learned import prompt_folds
from targetrows.core.rules.sequoia import sibling_ranks
from targetrows.core.rules.sequoia_model import SEQUOIA, AcceptanceVector
from targetrows.rowlog import format as rowlog
from targetrows.rowlog.score import _Pools

CHUNK = 4096  # pools read at a time


def first_level_reach(logs: Sequence[rowlog.RowLog], max_rank: int) -> dict[str, np.ndarray]:
    """{prompt key: [max_rank + 1]}: per prompt, the reach of the root's rank-k child summed
    over its scored positions (entries 0..max_rank - 1), and the number of positions (last)."""
    sums: dict[str, np.ndarray] = {}
    for log in logs:
        pools = _Pools(log)
        scored = np.flatnonzero(log.rec_scored)
        for s in range(0, len(scored), CHUNK):
            idx = scored[s : s + CHUNK]
            batch, reach, _ = pools.batch(idx)
            valid = batch.tokens >= 0
            ranks = sibling_ranks(batch.parents, batch.logq, valid)
            first = valid & (batch.parents == 0) & (ranks <= max_rank)
            per_pool = np.zeros((len(idx), max_rank + 1))
            rows = np.broadcast_to(np.arange(len(idx))[:, None], ranks.shape)
            np.add.at(per_pool, (rows[first], ranks[first] - 1), reach[first])
            per_pool[:, -1] = 1.0
            keys = pools.key[idx]
            for key in dict.fromkeys(keys):
                total = per_pool[keys == key].sum(axis=0)
                sums[key] = sums[key] + total if key in sums else total
    return sums


def _p(sums: dict[str, np.ndarray], keys) -> tuple[float, ...]:
    total = np.sum([sums[k] for k in keys], axis=0)
    return tuple(float(v) for v in np.clip(total[:-1] / max(total[-1], 1.0), 0.0, 1.0))


def fit_acceptance(logs: Sequence[rowlog.RowLog], folds: int = 2,
                   seed: int = 0) -> tuple[AcceptanceVector, dict]:
    """Sequoia's acceptance vector over the logs' pools (one temperature), cross-fitted by
    prompt, and its training summary (the keys `targetrows.train.reranker.write_report`
    reads)."""

    temps = {float(log.header.get("temperature", np.nan)) for log in logs}
    if len(temps) != 1:
        raise ValueError(f"row logs at several temperatures {sorted(temps)}: fit one acceptance "
                         "vector per temperature")
    max_rank = max(int(log.header.get("top_k", 0)) for log in logs)
    if max_rank < 1:
        raise ValueError("row log header lacks the pool's top_k: it was not written by `record`")
    start = time.perf_counter()
    sums = first_level_reach(logs, max_rank)
    keys = sorted(sums)
    if len(keys) < 2:
        raise ValueError(f"{len(keys)} prompt cannot be cross-fitted (each prompt is scored by a "
                         "vector fitted on others): record at least two")
    folds = min(folds, len(keys))
    fold_of = prompt_folds(keys, folds, seed)
    fold_p = tuple(_p(sums, [k for k in keys if fold_of[k] != j]) for j in range(folds))
    meta = dict(temperature=temps.pop(), folds=folds, seed=seed, prompts=len(keys),
                positions=int(sum(v[-1] for v in sums.values())), max_rank=max_rank,
                pair=sorted({f"{log.header.get('target')}+{log.header.get('draft')}"
                             for log in logs}),
                objective="mean reach of the root's rank-k child (Sequoia's estimate)",
                train_seconds=round(time.perf_counter() - start, 2))
    return AcceptanceVector(SEQUOIA, _p(sums, keys), fold_p, fold_of, meta), meta
