"""The draft-free decoders (racer, recycle) scored on a row log.

Their trees come from a table that the target's rows wrote along the way, not from a draft's
pool, so no logged pool holds them: each decoder's state (the registry's `new_state`: the token
table, and RACER's n-gram trie) is rebuilt along the logged path, as that decoder's own run
writes it along its accepted path:

- RACER's first writes are the prompt's rows (`prompt_topk`);
- before a round rooted at prompt + traj[:t], the rows at prompt + traj[:j] for every j < t
  (`traj_topk`; the row at the root itself comes from that round's verify pass), each under
  its context's last token, in order, so the latest wins as in the run.

At every scored position t each budget's tree is built under prompt + traj[:t] and scored by
the longest path of it that the logged continuation takes. At T=0 that is the number of draft
tokens verification accepts from that tree, exactly. At T>0 it is a one-sample estimate of the
expected number (the continuation is one sample of the target). It is counted as far as the
log's continuation reaches, at least the pool depth past the last scored position.

What the log cannot give is the rows at the nodes a run verified and rejected: they lie off the
path, and a run writes them into its table too. So the tree here is built from fewer rows than
the run's, and the offline figure approximates the decoder's acceptance. The online runs
(`targetrows decode`) measure it exactly.
"""

from __future__ import annotations

import numpy as np

from targetrows.core.tree import Tree
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.registry import get_decoder

from . import format as rowlog


def score_draft_free(log: rowlog.RowLog, decoder: str, budgets: np.ndarray,
                     scored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(accepted, nodes) [len(scored), len(budgets)] of draft-free `decoder` at the log's
    records `scored` (indices, sorted by segment and position), as the module says."""
    entry = get_decoder(decoder)
    if entry.new_state is None:
        raise ValueError(f"decoder {decoder!r} is not draft-free: score its rule instead")
    if not log.has_path_rows:
        raise ValueError(f"this row log holds no top ids along its paths, which {decoder} is "
                         "scored from: record it again with this version of targetrows record")
    # the decoders' own table width (8), or the log's where it kept fewer ids
    k = min(int(log.traj_topk.shape[1]), DecodeConfig(decoder).recycle_k)
    config = DecodeConfig(decoder, recycle_k=k)
    acc = np.zeros((len(scored), len(budgets)))
    nodes = np.zeros((len(scored), len(budgets)))
    segments = log.rec_segment[scored]
    for seg in np.unique(segments):
        rows = np.flatnonzero(segments == seg)
        positions = log.rec_position[scored[rows]]
        acc[rows], nodes[rows] = _segment(log, int(seg), positions, budgets, config)
    return acc, nodes


def _segment(log: rowlog.RowLog, seg: int, positions: np.ndarray, budgets: np.ndarray,
             config: DecodeConfig) -> tuple[np.ndarray, np.ndarray]:
    """One segment's scores at its scored positions (ascending), one state along its path."""
    prompt, traj = log.prompt(seg).tolist(), log.trajectory(seg).tolist()
    p0, t0 = log.prompt_offsets[seg], log.traj_offsets[seg]
    state = get_decoder(config.decoder).new_state(_vocab_size(log), config)
    state.start()
    if state.prompt_pending:
        state.observe_prompt(prompt, log.prompt_topk[p0 : p0 + len(prompt)])
    path = prompt + traj
    # the row at prompt + traj[:j] follows that context's last token
    keys = np.asarray(path[len(prompt) - 1 : len(path) - 1], dtype=np.int64)
    acc = np.zeros((len(positions), len(budgets)))
    nodes = np.zeros((len(positions), len(budgets)))
    written = 0
    for i, t in enumerate(int(p) for p in positions):
        state.observe(keys[written:t], log.traj_topk[t0 + written : t0 + t])
        written = t
        context = path[: len(prompt) + t]
        for j, budget in enumerate(budgets):
            tree = state.tree(context, int(budget))
            acc[i, j] = len(followed(tree, traj[t:]))
            nodes[i, j] = tree.budget
    return acc, nodes


def _vocab_size(log: rowlog.RowLog) -> int:
    """The header's vocabulary size; for a log without one, the largest id it holds, plus 1."""
    if "vocab_size" in log.header:
        return int(log.header["vocab_size"])
    held = [a.max() for a in (log.prompt_tokens, log.traj_tokens, log.traj_topk) if a.size]
    return 1 + int(max(held, default=0))


def followed(tree: Tree, continuation) -> list[int]:
    """The nodes of the longest root path of `tree` whose tokens begin `continuation`."""
    path, node = [], 0
    for token in continuation:
        node = tree.child_with_token(node, int(token))
        if node < 0:
            break
        path.append(node)
    return path
