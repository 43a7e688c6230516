"""Lossless verification of a draft tree against the target's rows.

At the current node take the target's draw (argmax at temperature 0, a sample otherwise); if a
child carries that token move to it and repeat, else that token is the bonus and the round ends.
Every committed token is then a draw from the target's own row at its context, so the output
distribution is the target's for any tree chosen without looking at these draws.
"""

from __future__ import annotations

import numpy as np

from .rows import check_rows
from .tree import Tree


def walk(tree: Tree, draws: np.ndarray) -> tuple[np.ndarray, int]:
    """Follow the target's per-node draws (``draws[i]`` = the token drawn at node i) from the root.

    Returns the accepted non-root nodes in order and the bonus token. Draws at nodes off the
    path are never read, so drawing at every node at once (vectorised) is as lossless as
    drawing lazily along the path: each node's draw is independent of the others.
    """
    path = []
    node = 0
    while True:
        token = int(draws[node])
        child = tree.child_with_token(node, token)
        if child < 0:
            return np.array(path, dtype=np.int64), token
        path.append(child)
        node = child


def draw_rows(rows: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
    """One token per row: the argmax (ties to the lower id) when rng is None, else a sample."""
    if rng is None:
        return rows.argmax(axis=-1)
    cdf = np.cumsum(rows, axis=-1)
    u = rng.random(len(rows)) * cdf[:, -1]
    draws = (cdf <= u[:, None]).sum(axis=-1)
    return np.minimum(draws, rows.shape[-1] - 1)


def verify(
    tree: Tree, rows: np.ndarray, rng: np.random.Generator | None = None
) -> tuple[np.ndarray, int]:
    """Verify `tree` with ``rows[i]``, the target distribution at node i's context.

    Greedy (argmax) with ``rng=None``; with a ``numpy.random.Generator``, the lossless sampling
    rule. Returns ``(path, bonus)``: the accepted non-root nodes in order and the bonus token.
    """
    rows = check_rows(rows, "rows")
    if rows.ndim != 2 or len(rows) != len(tree):
        raise ValueError(f"rows must be [{len(tree)}, vocab] for this tree, got {rows.shape}")
    return walk(tree, draw_rows(rows, rng))
