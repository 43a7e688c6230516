"""What a sequence is to every torch backend (a target or standalone draft, an EAGLE-3 head):
a row of its model's cache, never a copy of the model.

A model's sequences live in `Lanes` (`targetrows.hf.lanes`): the rows of one `KVCache`, each
row's bookkeeping (`RowTree`), and the pass that serves them. A model keeps two: its own, one row for the
sequence the model itself is, and the last ones handed out by ``lanes(n)`` for batched
decoding, kept for the next call at the same count (their captured graphs with them). Handing
them out again, or replacing them, retires the sequences handed out before: a retired sequence
is refused with an error, never let write over a row another sequence holds now.

`RowSequence` is what both backends' sequences share: which row, of which lanes, and the row's
state; `hand_out` and `set_shape` are what both backends' models do with their lanes.
"""

from __future__ import annotations

import numpy as np
import torch

from .kv_cache import KVCache
from .lanes import Lanes
from .pass_builder import DEFAULT_CAPACITY, PassShape
from .row_trees import RowTree
from .torch_rows import TorchRows

INITIAL_ENTRIES = 256  # a growing cache's first size (a CPU's eager passes: it doubles)


def max_entries(shape: PassShape, window: int | None, grows: bool) -> int:
    """The most entries a sequence may hold: `--max-context`, else the model's context window
    where the cache grows (a CPU's), else `DEFAULT_CAPACITY` (never more than the window)."""
    if shape.capacity is not None:
        return shape.capacity
    window = window or DEFAULT_CAPACITY
    return window if grows else min(window, DEFAULT_CAPACITY)


def first_entries(limit: int, grows: bool) -> int:
    """A new cache's entries per row: a growing one starts small, any other at its limit."""
    return min(INITIAL_ENTRIES, limit) if grows else limit


def hand_out(engine, n: int) -> Lanes:
    """The lanes of `n` rows `engine` hands out (its last ones where they have `n` rows): the
    sequences it handed out before are retired."""
    if engine.lanes is None or engine.lanes.cache.rows != n:
        if engine.lanes is not None:
            engine.lanes.handed = -1
        engine.lanes = None  # let go first: freed before the new one is made
        engine.lanes = engine.make_lanes(n)
    engine.lanes.handed += 1
    return engine.lanes


def own_lanes(engine) -> Lanes:
    """The one-row lanes of the sequence a model itself is (made on first use)."""
    if engine.own is None:
        engine.own = engine.make_lanes(1)
    return engine.own


def set_shape(engine, shape: PassShape) -> None:
    """Every pass of `engine`'s model at `shape` from now on: its lanes are retired and made
    anew when next asked for (a cache of the shape's limit, graphs of its buckets)."""
    for lanes in (engine.own, engine.lanes):
        if lanes is not None:
            lanes.handed = -1
    engine.shape, engine.own, engine.lanes = shape, None, None


class RowSequence(TorchRows):
    """One sequence of a torch backend: row `row` of `lanes` (None: the model's own lanes,
    `own_lanes`), on `engine` (what the model's sequences share)."""

    def __init__(self, engine, lanes: Lanes | None, row: int):
        self.engine, self._lanes, self.row = engine, lanes, row
        self._handed = None if lanes is None else lanes.handed
        self._generator = torch.Generator(device=engine.device)
        self.reset(None)

    def graph_stats(self) -> list:
        """The `GraphStats` of every group of this model's passes there is now: its own
        sequence's, its lanes', and a head's pool rankings (for benchmarks)."""
        engine = self.engine
        groups = [lanes.stats for lanes in (engine.own, engine.lanes) if lanes is not None]
        ranking = getattr(engine, "ranking", None)
        return groups + ([] if ranking is None else [ranking.stats])

    @property
    def pass_group(self) -> Lanes:
        """The lanes this sequence's passes run in (their `stats`, `compute`: for benchmarks)."""
        return self._group()

    def _group(self) -> Lanes:
        """This sequence's lanes, while they are still its own."""
        if self._lanes is None:
            return own_lanes(self.engine)
        if self._lanes.handed != self._handed:
            raise RuntimeError(f"{self.name}: these lanes' rows were handed to the lanes of a "
                               "later lanes() call (a model keeps one set of lanes); use those")
        return self._lanes

    # what a model's sequences share, read through the engine
    name = property(lambda self: self.engine.name)
    dtype = property(lambda self: self.engine.dtype)
    device = property(lambda self: self.engine.device)
    # prompts are checked against these before decoding (`specbench.check_prompt`): an id past
    # the embedding table is an IndexError on the CPU and a device assert on a GPU
    context_window = property(lambda self: self.engine.context_window)
    max_entries = property(lambda self: self.engine.max_entries)
    n_embeddings = property(lambda self: self.engine.n_embeddings)
    feature_layers = property(lambda self: self.engine.feature_layers)

    def passes_described(self) -> str:
        """How this model's passes run, in words (`PassShape.describe`)."""
        return self.engine.shape.describe(self.engine.max_entries, self.engine.grows)

    def reset(self, seed: int | None = None) -> None:
        """A new sequence: the row emptied, the generator reseeded."""
        lanes = self._group()
        lanes.trees[self.row] = RowTree()
        lanes.cache.clear(self.row)
        self._new_sequence(seed)

    @property
    def _state(self) -> RowTree:
        return self._group().trees[self.row]

    @property
    def _cache(self) -> KVCache:
        return self._group().cache

    def _cache_len(self) -> int:
        return int(self._cache.lengths[self.row])

    @property
    def cached_tokens(self) -> np.ndarray:
        """The committed tokens the row's committed entries stand for (a copy)."""
        return self._state.prefix.copy()

    def kv_entries(self):
        """What the row holds (`KVCache.entries`: each layer's keys and values, the
        features): views to read, not to change."""
        return self._cache.entries(self.row)
