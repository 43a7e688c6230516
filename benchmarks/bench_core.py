"""Speed of the NumPy core's hot paths (issue goals: >= 1,000,000 trees/s for batched
expected_accepted at B=59 on 2 cores; draft_rank selecting B=59 from a 510-node pool in
<= 200 microseconds).

    python benchmarks/bench_core.py
"""

from __future__ import annotations

import time

import numpy as np

from targetrows import expected_accepted_batch
from targetrows.core import pool
from targetrows.core.atomic import atomic_write_text
from targetrows.core.rules.root_pool import draft_rank, target_rerank
from targetrows.core.rules.rule import first_level_logp
from targetrows.core.toy import ToyPair


def best_of(fn, repeats=5):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def bench_expected_accepted(m=1_000_000, budget=59):
    rng = np.random.default_rng(0)
    n = budget + 1
    # random topological trees: parents[i] uniform below i
    parents = (rng.random((m, n)) * np.arange(n)).astype(np.int64)
    parents[:, 0] = -1
    edge = rng.random((m, n))
    seconds = best_of(lambda: expected_accepted_batch(parents, edge), repeats=3)
    return m / seconds


def bench_draft_rank(budget=59):
    pair = ToyPair(64, seed=0, closeness=0.7)
    cand, logq = pool.expand(pair.draft_row, [1, 2, 3], 10, 6)
    assert len(cand) == 511
    reps = 2000
    seconds = best_of(lambda: [draft_rank.select(cand, logq, budget) for _ in range(reps)])
    root_row = pair.target_row([1, 2, 3])
    seconds_rr = best_of(
        lambda: [target_rerank.select(cand, logq, budget, root_logp=first_level_logp(cand, root_row))
                 for _ in range(reps)]
    )
    return seconds / reps * 1e6, seconds_rr / reps * 1e6


def main():
    trees_per_s = bench_expected_accepted()
    dr_us, rr_us = bench_draft_rank()
    text = "\n".join([
        "| benchmark | measured | goal |",
        "|---|---|---|",
        f"| batched `expected_accepted`, B=59 | {trees_per_s:,.0f} trees/s | >= 1,000,000 |",
        f"| `draft_rank`, B=59 from a 510-node pool | {dr_us:.0f} us | <= 200 us |",
        f"| `target_rerank`, B=59 from a 510-node pool | {rr_us:.0f} us | - |",
    ]) + "\n"
    atomic_write_text("benchmarks/results/core.md", text)
    print(text)


if __name__ == "__main__":
    main()
