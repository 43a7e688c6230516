"""The interface every model backend implements: the toy pair (NumPy) and Hugging Face models (torch).

The round loop (`targetrows.decoding.loop`) and the row recorder only talk to models through this
interface, so one loop serves every decoder and every backend.

A model keeps a cache (a KV cache for real models, nothing for the toy) of a prefix of the
committed context plus the tree nodes it has been fed in the current round. The caller never
manages that cache: it asks for rows, and tells the model what was committed.

Rows are *backend-native* logits (``numpy.ndarray`` for the toy, ``torch.Tensor`` on the model's
device for Hugging Face models), shape ``[len(nodes), vocab_size]``. They never leave the device
in full on the hot path: the loop only asks the model for the few numbers it needs (draws,
top-k, gathered log-probs), which come back as small NumPy arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from targetrows.core.tree import Tree


@runtime_checkable
class Model(Protocol):
    """A causal language model seen as a source of rows."""

    vocab_size: int  # rows are compared over this many tokens (the tokenizer's vocabulary)
    device: Any  # where its rows live: None for NumPy, a torch.device otherwise

    def reset(self, seed: int | None = None) -> None:
        """Forget the cache and reseed the generator used by `draw` (a new sequence starts)."""

    def logits(self, context: Sequence[int], tree: Tree, nodes: Sequence[int]) -> Any:
        """Next-token logits at `nodes` of `tree`, in the order given.

        `tree`'s root token is ``context[-1]``; node ``i``'s row is the distribution at
        ``context + tokens on the path from the root to i``. The model feeds whatever it has not
        cached yet: the uncached tail of ``context``, then the requested nodes and any of their
        ancestors not fed yet in this round (tree attention: a node sees the committed past and
        its own ancestors only). Fed entries are matched by content: nodes of the new tree with
        the same index, token and parent as fed nodes of the previous call are reused (pool
        expansion passes a tree that grows by appending nodes, level by level, as new Tree
        objects); anything else drops the old tree's entries first.
        """

    def commit(self, context: Sequence[int]) -> None:
        """The committed context is now `context` (it extends or equals the last one).

        The model keeps the longest prefix of `context` its cache holds (the old prefix plus the
        fed tree nodes along the accepted path, compacted in place) and drops the rest.
        """

    def draw(self, logits: Any, temperature: float) -> np.ndarray:
        """One token per row: the argmax at temperature 0, else a sample from
        softmax(logits / temperature) using the model's own seeded generator. `logits` may be a
        tuple of row blocks: drawn as their rows in order, in one read (the same tokens as
        drawing block by block)."""

    def topk(self, logits: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens [rows, k], log-probs [rows, k]) of each row at temperature 1, best first,
        ties to the lower token id."""

    def topk_at(self, context: Sequence[int], tree: Tree, nodes: Sequence[int],
                k: int) -> tuple[np.ndarray, np.ndarray]:
        """``topk(logits(context, tree, nodes), k)`` in one call: what pool expansion asks a
        draft for each level. A backend may answer without full rows (an EAGLE-3 head ranks its
        draft vocabulary, never widened to the target's)."""

    def logprobs(self, logits: Any, tokens: np.ndarray, temperature: float) -> np.ndarray:
        """Log-probabilities [rows, m] of ``tokens[r, :]`` under row r at `temperature`
        (temperature 0 is read as 1: a greedy row is one-hot, which ranks nothing); `tokens`
        [1, m] is asked of every row. `logits` may be a tuple of row blocks, read as their rows
        in order, in one read."""

    def probs(self, logits: Any, temperature: float) -> np.ndarray:
        """Full rows as float64 NumPy distributions (for row logs and tests; not the hot path).
        At temperature 0 a row is one-hot at its argmax."""


def synchronize(model: Any) -> None:
    """Wait for `model`'s queued device work (a CUDA backend runs asynchronously), so that a
    timer read next measures the work itself; nothing to wait for on the CPU or the toy."""
    sync = getattr(model, "synchronize", None)
    if sync is not None:
        sync()


def overlaps(target: Any, draft: Any | None, asked: bool | None = None) -> bool:
    """Whether a root pass runs alongside drafting: as `asked` (`DecodeConfig.overlap`), or
    when that is None, when target and draft live on different devices."""
    if asked is not None:
        return bool(asked)
    return draft is not None and target.device is not None and target.device != draft.device


def draft_kind(draft: Any | None) -> str:
    """What drafts, as answers and tables name it: "none" (no draft model), "eagle3" (a head
    that reads the target's features: a backend says so with ``draft_kind = "eagle3"``) or
    "standalone" (a model of its own)."""
    if draft is None:
        return "none"
    return getattr(draft, "draft_kind", "standalone")


def side_stream(model: Any):
    """Where `model`'s root pass runs beside drafting: a stream of its own on a GPU backend
    (`targetrows.hf.streams.SideStream`), used as ``with stream: ...`` and then
    ``stream.join(rows)`` before anything else reads the pass's rows or cache; a context that
    does nothing for a backend without streams."""
    make = getattr(model, "side_stream", None)
    stream = make() if make is not None else None
    return stream if stream is not None else _NoStream()


class _NoStream:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def join(self, *handed_over) -> None:
        pass


def edge_probs(model: Any, rows: Any, row_nodes: np.ndarray, tree: Tree,
               temperature: float) -> np.ndarray:
    """`model`'s probability of each node's token at its parent's context (1 at the root),
    from its rows at `row_nodes` (sorted node ids, every parent among them) at `temperature`
    (0 read as 1: rows that rank). The children of each row are gathered in one call."""
    row_nodes = np.asarray(row_nodes)
    edge = np.ones(len(tree))
    if len(tree) == 1:
        return edge
    row = np.searchsorted(row_nodes, tree.parents[1:])
    counts = np.bincount(row, minlength=len(row_nodes))
    order = np.argsort(row, kind="stable")
    col = np.empty(len(row), dtype=np.int64)
    col[order] = np.arange(len(row)) - np.repeat(np.cumsum(counts) - counts, counts)
    children = np.zeros((len(row_nodes), counts.max()), dtype=np.int64)
    children[row, col] = tree.tokens[1:]
    edge[1:] = np.exp(model.logprobs(rows, children, temperature)[row, col])
    return edge
