"""Every pass a torch backend runs, assembled in one place: `build_pass`.

A pass serves the sequences (rows of one `KVCache`) that asked for one at the same time: a
target's or a standalone draft's pass (a tail of committed tokens, tree nodes), an EAGLE-3
head's step. Each sequence hands over a `Feed`: the tokens it feeds, their positions, the
entries they are written to (its length onwards) and what each one sees (its committed prefix,
then `seen`: a causal tail, a node's ancestors). `build_pass` lays the feeds out as one
rectangle [rows, width] of queries over a span of the cache's entries, in the host arrays the
pass reads: token ids, positions, write slots, the mask, and the queries whose outputs come
back. Two switches, both set by `--graphs` (`PassShape`):

- `pad`: every row of the cache takes part in every pass, its fed tokens padded to a bucket
  (1, 2, 4, ..., 128, and a job's own widths): a few fixed shapes, each captured once as a
  CUDA graph and replayed (`targetrows.hf.graphs`). Off: the rows from the first that feeds to
  the last, at the widest feed's width.
- `full_span`: attention reads every entry of the cache (a graph's fixed shape); off, only the
  entries up to the longest row's new length, rounded up to `ALIGN`: on a CPU a one-token step
  over 4,096 entries costs as much attention as one over 128 does 30 times.

A padding query (a row that feeds less than the width, or nothing) is written to the scratch
entry and sees only entry 0 of its row; a real query never sees the scratch entry. So each
real query's output and the entries it writes equal those of its row's own unpadded pass
(attention adds only exact zeros for masked entries; the tests check float64). A feed whose
row would pass the cache's limit fails alone: its error comes back in its place, and the
others run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .kv_cache import ALIGN, KVCache, capacity_error

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
DEFAULT_CAPACITY = 4096  # entries per sequence on a GPU: prompt, answer and one round's tree
_NONE = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class PassShape:
    """How a model's passes are shaped: the most entries a sequence may hold (`capacity`,
    --max-context; None: the model's default, `targetrows.hf.model.Engine.max_entries`), the
    buckets a padded pass's width is rounded up to, the two switches (see
    the module docstring), and whether padded passes replay as CUDA graphs."""

    capacity: int | None = None
    buckets: tuple[int, ...] = BUCKETS
    pad: bool = False
    full_span: bool = False
    graphs: bool = False

    def __post_init__(self):
        if self.capacity is not None and self.capacity < 2:
            raise ValueError(f"--max-context must be at least 2 entries, got {self.capacity}")
        if not self.buckets or list(self.buckets) != sorted(set(self.buckets)) or self.buckets[0] < 1:
            raise ValueError(f"buckets must be increasing positive sizes, got {self.buckets}")
        if self.graphs and not (self.pad and self.full_span):
            raise ValueError("a CUDA graph replays fixed shapes: graphs need pad and full_span")

    def describe(self, limit: int, grows: bool) -> str:
        """These passes in words, as a decode job's log says them."""
        if self.graphs:
            how = "padded to buckets and replayed as CUDA graphs"
        elif self.pad:
            how = "padded to buckets, run eagerly"
        else:
            how = "unpadded, over the live entries"
        room = "growing" if grows else "allocated once"
        return f"one pass for every sequence: {how}; at most {limit} entries a sequence ({room})"

    def bucket(self, width: int) -> int:
        """The bucket `width` fed tokens are padded to; `width` itself past the largest."""
        i = int(np.searchsorted(self.buckets, width))
        return self.buckets[i] if i < len(self.buckets) else width


@dataclass(frozen=True)
class Feed:
    """One sequence's part of a pass (see the module docstring). `ids`, `positions` and
    `seen` are host arrays, or tensors made on the device (a pool's level grown there);
    `inputs`: per-query tensors [q, ...] the pass reads besides (a head step's h and token
    embeddings). `tail` and `query` are what the sequence planned (the committed tokens fed
    first, the tree nodes fed after them); the pass does not read them."""

    row: int
    start: int  # entries of the committed prefix: every query sees them
    base: int  # entries the row holds before the pass: its queries go to base, base + 1, ...
    ids: np.ndarray | torch.Tensor  # [q] tokens fed
    positions: np.ndarray | torch.Tensor  # [q] their sequence positions
    seen: np.ndarray | torch.Tensor  # [q, base + q - start]: what each sees from `start` on
    keep: np.ndarray  # which queries' outputs come back, in order
    tail: np.ndarray = field(default_factory=lambda: _NONE)
    query: np.ndarray = field(default_factory=lambda: _NONE)
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class PassPlan:
    """A pass laid out by `build_pass`: `rows` lo..hi of the cache, `width` queries each,
    attention over the first `span` entries; the host arrays (`arrays`), each live feed's
    place in the output (`picks`: indices into the kept queries), and each feed's error."""

    feeds: list[Feed]
    errors: list[Exception | None]
    rows: tuple[int, int] = (0, 0)
    width: int = 0
    span: int = 0
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    picks: list[np.ndarray | None] = field(default_factory=list)

    @property
    def live(self) -> list[tuple[Feed, np.ndarray]]:
        return [(f, p) for f, p, e in zip(self.feeds, self.picks, self.errors, strict=True)
                if e is None]


def build_pass(feeds: list[Feed], cache: KVCache, shape: PassShape, name: str) -> PassPlan:
    """The pass that serves `feeds` (at most one per row) over `cache`: the one function
    every pass of a target, a standalone draft or an EAGLE-3 head is assembled by."""
    plan = PassPlan(feeds, [None] * len(feeds), picks=[None] * len(feeds))
    for i, feed in enumerate(feeds):
        needed = feed.base + len(feed.ids)
        if needed > cache.limit:  # entry `limit` and past it: never a real entry
            plan.errors[i] = capacity_error(name, needed, cache.limit)
    live = [f for f, e in zip(feeds, plan.errors, strict=True) if e is None]
    if not live:
        return plan
    cache.make_room(max(f.base + len(f.ids) for f in live))
    widest = max(len(f.ids) for f in live)
    plan.width = shape.bucket(widest) if shape.pad else widest
    plan.rows = (0, cache.rows) if shape.pad else (min(f.row for f in live),
                                                   max(f.row for f in live) + 1)
    entries = cache.parts[0].shape[-2]
    longest = max(f.base + len(f.ids) for f in live)
    plan.span = entries if shape.full_span else min(-(-longest // ALIGN) * ALIGN, entries)
    plan.arrays = _host_arrays(plan, live, cache.capacity, shape.pad)
    return plan


def _host_arrays(plan: PassPlan, live: list[Feed], scratch: int, keep_all: bool
                 ) -> dict[str, np.ndarray]:
    """ids, positions, write slots (`at`) and the mask (`allowed`) of the pass's rectangle,
    every query padding until a feed makes it real, and the flat indices of the queries whose
    outputs come back (`keep`: a feed's own, in feed order; every query with `keep_all`)."""
    lo, hi = plan.rows
    rows, width = hi - lo, plan.width
    ids = np.zeros((rows, width), dtype=np.int64)
    positions = np.zeros((rows, width), dtype=np.int64)
    at = np.full((rows, width), scratch, dtype=np.int64)
    allowed = np.zeros((rows, width, plan.span), dtype=bool)
    allowed[:, :, 0] = True  # padding sees entry 0 only (finite: the cache starts zeroed)
    keep, kept = [], 0
    for i, feed in enumerate(plan.feeds):
        if plan.errors[i] is not None:
            continue
        r, n = feed.row - lo, len(feed.ids)
        at[r, :n] = feed.base + np.arange(n)
        allowed[r, :n, 0] = False
        allowed[r, :n, : feed.start] = True  # the committed prefix
        if isinstance(feed.ids, np.ndarray):  # else made on the device: written there
            ids[r, :n] = feed.ids
        if isinstance(feed.positions, np.ndarray):
            positions[r, :n] = feed.positions
        if isinstance(feed.seen, np.ndarray):
            allowed[r, :n, feed.start: feed.base + n] = feed.seen
        flat = r * width + feed.keep
        plan.picks[i] = flat if keep_all else kept + np.arange(len(flat))
        keep.append(flat)
        kept += len(flat)
    arrays = dict(ids=ids, positions=positions, at=at, allowed=allowed)
    if not keep_all:
        arrays["keep"] = np.concatenate(keep)
    return arrays
