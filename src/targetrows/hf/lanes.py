"""A model's lanes: the sequences it decodes at once as rows of one cache, and the pass that
serves them, on every device and at every batch size (one row at batch 1).

`Lanes` holds the rows' `KVCache`, each row's bookkeeping (`RowTree`: what a sequence is), and
how many times it was handed out (`targetrows.hf.sequence.hand_out`); and it is a group of
`targetrows.core.passes`: the scheduler hands it the `Feed`s of the sequences waiting on it,
and it runs them as one pass laid out by `build_pass`, eagerly or replayed as a CUDA graph
(`--graphs`), through the model's own `compute` (a target's forward, a head's step), which
writes the cache and returns the kept queries' outputs. Each feed gets its own rows of them,
or its own error (a row past the cache's limit): its neighbours in the pass are served all the
same.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .graphs import BucketGraphs, HostInputs
from .kv_cache import KVCache
from .pass_builder import Feed, PassPlan, PassShape, build_pass
from .row_trees import RowTree
from .torch_rows import host_to_device


class PassInputs:
    """The buffers one pass reads: `rows` lo..hi of the cache, `width` queries each,
    attention over `span` entries; the host-filled ids, positions, write slots (`at`), mask
    (`allowed`) and kept queries (`keep`, None: every query), and per-query tensors `extra`
    (name -> [rows, width, ...]) that feeds bring on the device."""

    def __init__(self, device: torch.device, rows: tuple[int, int], width: int, span: int,
                 kept: int | None, extra: dict[str, tuple[tuple[int, ...], torch.dtype]]):
        n = rows[1] - rows[0]
        index = ((n, width), torch.int64)
        fields = dict(ids=index, positions=index, at=index,
                      allowed=((n, width, span), torch.bool))
        if kept is not None:
            fields["keep"] = ((kept,), torch.int64)
        self.host = HostInputs(device, **fields)
        self.ids, self.positions = self.host.ids, self.host.positions
        self.at, self.allowed = self.host.at, self.host.allowed
        self.keep = getattr(self.host, "keep", None)
        self.rows, self.width, self.span = rows, width, span
        self.extra = {name: torch.zeros((n, width, *shape), dtype=dtype, device=device)
                      for name, (shape, dtype) in extra.items()}

    def load(self, plan: PassPlan) -> None:
        """The plan's host arrays in one copy, then what its feeds bring on the device (a
        pool's level grown there, a head step's h) written in place."""
        self.host.send(**plan.arrays)
        lo = self.rows[0]
        for feed, _ in plan.live:
            r, n = feed.row - lo, len(feed.ids)
            if isinstance(feed.ids, torch.Tensor):
                self.ids[r, :n] = feed.ids
            if isinstance(feed.positions, torch.Tensor):
                self.positions[r, :n] = feed.positions
            if isinstance(feed.seen, torch.Tensor):
                self.allowed[r, :n, feed.start: feed.base + n] = feed.seen
            for name, values in feed.inputs.items():
                self.extra[name][r, :n] = values


class Lanes:
    """`cache.rows` sequences of one model and the passes that serve them (see the module
    docstring): the cache, each row's bookkeeping (`trees`), how many times they were handed
    out (`handed`; -1: replaced). `compute(inputs)` runs one pass over `PassInputs`, writing
    the cache, and returns the kept queries' outputs [kept, ...]; `extra`: the per-query
    tensors its feeds bring (name -> (shape, dtype)); `side_stream()`: the stream a root pass
    of these rows runs on beside drafting."""

    def __init__(self, name: str, cache: KVCache, shape: PassShape, device: torch.device,
                 compute: Callable[[PassInputs], torch.Tensor],
                 extra: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None,
                 side_stream: Callable[[], object] | None = None):
        self.name, self.cache, self.shape = name, cache, shape
        self.trees = [RowTree() for _ in range(cache.rows)]
        self.handed = 0
        self.device, self.compute, self.extra = torch.device(device), compute, extra or {}
        self._side_stream = side_stream
        self.graphs = BucketGraphs(device, self._graph_inputs, compute)
        self.stats = self.graphs.stats

    def side_stream(self):
        return None if self._side_stream is None else self._side_stream()

    @property
    def label(self) -> str:
        """What the scheduler's record calls these passes (`BatchStats.schedule`)."""
        return f"{self.name} passes"

    def run_batch(self, feeds: list[Feed]) -> list:
        """Each feed's outputs [len(feed.keep), ...], or its error, in order. Unpadded, feeds
        of very different widths (a prompt's prefill beside one-token steps) run as the passes
        that feed the fewest padded tokens plus `PASS_COST` each (`split_by_width`), and a pass
        is cut where the idle rows between two feeds would cost more than a pass
        (`split_by_rows`): an unpadded pass runs the rows from its first feed's to its last's."""
        results = [None] * len(feeds)
        parts = ([list(range(len(feeds)))] if self.shape.pad
                 else [cut for part in split_by_width([len(f.ids) for f in feeds], PASS_COST)
                       for cut in split_by_rows(part, feeds, PASS_COST)])
        for part in parts:
            for i, result in zip(part, self._serve([feeds[i] for i in part]), strict=True):
                results[i] = result
        return results

    def _serve(self, feeds: list[Feed]) -> list:
        plan = build_pass(feeds, self.cache, self.shape, self.name)
        out = self._run(plan) if plan.live else None
        results = []
        for feed, pick, error in zip(feeds, plan.picks, plan.errors, strict=True):
            if error is not None:
                results.append(error)
                continue
            self.cache.lengths[feed.row] = feed.base + len(feed.ids)
            results.append(self._take(out, pick))
        return results

    @torch.inference_mode()
    def _run(self, plan: PassPlan) -> torch.Tensor:
        """The pass's kept outputs: replayed where graphs are on and the width is a bucket
        (a long prompt's prefill is wider than any: it runs eagerly, padded all the same)."""
        replay = self.shape.graphs and plan.width in self.shape.buckets
        if replay:
            inputs = self.graphs.inputs(plan.width)
        else:
            self.stats.passes[plan.width] = self.stats.passes.get(plan.width, 0) + 1
            kept = None if self.shape.pad else len(plan.arrays["keep"])
            inputs = PassInputs(self.device, plan.rows, plan.width, plan.span, kept,
                                self.extra)
        inputs.load(plan)
        return self.graphs.run(inputs, plan.width) if replay else self.compute(inputs)

    def _graph_inputs(self, width: int) -> PassInputs:
        return PassInputs(self.device, (0, self.cache.rows), width,
                          self.cache.parts[0].shape[-2], None, self.extra)

    def _take(self, out: torch.Tensor, pick: np.ndarray) -> torch.Tensor:
        """A feed's rows of the outputs: in unpadded passes its kept queries come in a run
        (a view of outputs made for this pass); in padded ones a copy, read before the next
        replay of the width overwrites them."""
        if not len(pick):
            return out[:0]
        run = out[int(pick[0]): int(pick[0]) + len(pick)]
        if np.array_equal(pick, np.arange(pick[0], pick[0] + len(pick))):
            return run if not self.shape.pad else run.clone()  # one launch, nothing sent
        return out.index_select(0, host_to_device(pick, out.device))


# what a pass costs beyond the tokens it feeds, in fed tokens: on the embedded target on a
# 2-core CPU a one-token step costs about what 50 more tokens of a prefill do (24 ms against
# 0.5 ms a token). Padded passes (graphs) never split: every pass is [rows, bucket] anyway
PASS_COST = 64


def split_by_width(widths: list[int], pass_cost: int) -> list[list[int]]:
    """The items (by index) grouped into passes so that the padded tokens plus `pass_cost` per
    pass are fewest: a pass of items fed w_1 >= w_2 >= ... tokens feeds n x w_1. Groups are
    runs of the items sorted by width, longest first (ties by index), so a prompt's prefill
    does not pad the one-token steps beside it, while passes of like widths stay one."""
    order = sorted(range(len(widths)), key=lambda i: (-widths[i], i))
    n = len(order)
    best, cut = [0] + [None] * n, [0] * (n + 1)  # best[j]: the first j items' cost
    for j in range(1, n + 1):
        for i in range(j):  # items i..j-1 as one pass, padded to the widest, order[i]
            cost = best[i] + pass_cost + (j - i) * widths[order[i]]
            if best[j] is None or cost < best[j]:
                best[j], cut[j] = cost, i
    parts, j = [], n
    while j:
        parts.append(order[cut[j]: j])
        j = cut[j]
    return parts[::-1]


def split_by_rows(part: list[int], feeds: list[Feed], pass_cost: int) -> list[list[int]]:
    """`part` (feed indices) cut into runs of rows, where the idle rows between two feeds,
    each padded to the part's width, would feed more than `pass_cost` tokens."""
    order = sorted(part, key=lambda i: feeds[i].row)
    width = max(len(feeds[i].ids) for i in part)
    runs = [[order[0]]]
    for before, i in zip(order, order[1:], strict=False):
        if (feeds[i].row - feeds[before].row - 1) * width > pass_cost:
            runs.append([])
        runs[-1].append(i)
    return runs
