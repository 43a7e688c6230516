"""What the static-shape passes of a target or draft (`targetrows.hf.static_pass`) and the steps
of an EAGLE-3 head (`targetrows.hf.static_head`) share: their shape settings, the padded
layout of one pass's cache slots and mask, and the replay of each (stream, bucket) as a CUDA
graph.

A graph replays fixed kernels on fixed addresses, so a pass reads its inputs from buffers made
once per (stream, width) (`BucketGraphs.inputs`) and leaves its outputs where its capture put
them: the next replay of that bucket overwrites them, so whatever a pass hands over is copied
out first (the callers do; a test replays passes in place on the CPU to check it). Each
(stream, bucket) is captured on its first use: a warm-up run on a stream of its own, then the
capture; the warm-up writes the cache entries the replay will, with the same values, so it
changes nothing. A model's graphs on one stream share one memory pool; graphs that may run at
once (a root pass on its side stream beside the main stream's) get pools of their own, as
graphs in one pool may share their intermediates' memory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .streams import device_module

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
DEFAULT_CAPACITY = 4096  # entries per sequence: prompt, answer and one round's tree


class CapacityError(ValueError):
    """A pass would write past a static cache's capacity."""


@dataclass(frozen=True)
class StaticShape:
    """How static passes are shaped: entries each sequence may hold, the buckets fed tokens are
    padded to, and whether each bucket is replayed as a CUDA graph."""

    capacity: int = DEFAULT_CAPACITY
    buckets: tuple[int, ...] = BUCKETS
    graphs: bool = False

    def __post_init__(self):
        if self.capacity < 2:
            raise ValueError(f"static capacity must be at least 2 entries, got {self.capacity}")
        if not self.buckets or list(self.buckets) != sorted(set(self.buckets)) or self.buckets[0] < 1:
            raise ValueError(f"buckets must be increasing positive sizes, got {self.buckets}")

    def bucket(self, width: int) -> int:
        """The bucket `width` fed tokens are padded to; `width` itself past the largest."""
        i = int(np.searchsorted(self.buckets, width))
        return self.buckets[i] if i < len(self.buckets) else width

    def check_room(self, name: str, entries: int) -> None:
        if entries > self.capacity:
            raise CapacityError(
                f"{name}: a pass would hold {entries} entries, past the static cache's "
                f"{self.capacity} (the prompt, the answer so far and one round's tree); raise "
                "--max-context (config: decode.max_context), or run with --graphs off")


class GroupPerCount:
    """A model's static lane group, made by `make(model, n)` and kept while its lanes are
    asked for at the same count: a group's graphs are captured on first use, so the next
    batch, bench run or job at that count replays them instead of capturing anew. A new count
    replaces the group (its caches and graphs go with the last lanes that hold them).
    Asking again hands the rows to the new lanes; the earlier ones are retired
    (`targetrows.hf.lanes`)."""

    def __init__(self, make):
        self._make, self._n, self._group = make, None, None

    def __call__(self, model, n: int):
        if self._n != n:
            self._group = None  # let go first: freed with its last lanes, not beside the new
            self._group, self._n = self._make(model, n), n
        return self._group


@dataclass
class GraphStats:
    """What a model's static passes ran: passes per width, graphs captured, the seconds and
    device bytes their capture took."""

    passes: dict[int, int] = field(default_factory=dict)
    captured: int = 0
    capture_s: float = 0.0
    graph_bytes: int = 0


class PaddedSlots:
    """The host's side of one padded pass over `rows` sequences, `width` queries each: the
    cache entry each query is written to (`at`) and the entries it sees (`allowed`, over
    capacity + 1 entries). Every query starts as padding: written to the scratch entry
    `capacity`, seeing only it. `place` makes a sequence's first n queries real."""

    def __init__(self, rows: int, width: int, capacity: int):
        self.capacity = capacity
        self.at = np.full((rows, width), capacity, dtype=np.int64)
        self.allowed = np.zeros((rows, width, capacity + 1), dtype=bool)
        self.allowed[:, :, capacity] = True

    def place(self, row: int, n: int, base: int) -> np.ndarray:
        """Row `row`'s first n queries are written at base, base + 1, ... and never see the
        scratch entry; returns their [n, capacity + 1] view of `allowed` to fill in."""
        self.at[row, :n] = base + np.arange(n)
        self.allowed[row, :n, self.capacity] = False
        return self.allowed[row, :n]


class HostInputs:
    """The inputs of a pass that the host fills (ids, positions, write slots, the mask), as
    views of one device buffer, so that they go over in one copy without waiting: on a GPU one
    launch a pass, where a copy per input would be four. `fields`: name -> (shape, dtype);
    each is an attribute, a tensor at a fixed address that a graph can read."""

    def __init__(self, device: torch.device, **fields: tuple[tuple[int, ...], torch.dtype]):
        self.device = torch.device(device)
        self._layout, size = {}, 0  # name -> (first byte, shape, NumPy dtype)
        for name, (shape, dtype) in fields.items():
            size = -(-size // 8) * 8  # each view starts 8-byte aligned
            self._layout[name] = (size, tuple(shape), torch.empty(0, dtype=dtype).numpy().dtype)
            size += int(np.prod(shape)) * dtype.itemsize
        self._bytes = torch.zeros(size, dtype=torch.uint8, device=self.device)
        for name, (shape, dtype) in fields.items():
            at = self._layout[name][0]
            part = self._bytes[at: at + int(np.prod(shape)) * dtype.itemsize]
            setattr(self, name, part.view(dtype).view(shape))

    def send(self, **arrays: np.ndarray) -> None:
        """Copy in one host array per field, each of the field's shape: through one block of
        host memory (pinned on a GPU, whose allocator keeps it until the copy has run)."""
        block = torch.empty(len(self._bytes), dtype=torch.uint8,
                            pin_memory=self.device.type == "cuda")
        host = block.numpy()
        for name, (at, shape, dtype) in self._layout.items():
            host[at: at + int(np.prod(shape)) * dtype.itemsize].view(dtype).reshape(shape)[
                ...] = arrays[name]
        self._bytes.copy_(block, non_blocking=True)


class BucketGraphs:
    """Input buffers and CUDA graphs per (stream, width) of one group of static passes.
    `make_inputs(width)` makes an object with the buffers a pass reads, and the `out` and
    `graph` attributes set here; `compute(inputs)` is the pass, returning its outputs."""

    def __init__(self, device: torch.device, graphs: bool, make_inputs, compute):
        self.device, self.graphs = torch.device(device), graphs
        self._make, self._compute = make_inputs, compute
        self.stats = GraphStats()
        self._inputs: dict[tuple[Any, int], Any] = {}
        self._pools: dict[Any, Any] = {}

    def inputs(self, width: int):
        """The buffers of this width on the current stream (a root pass beside drafting runs
        on its own stream, so it has buffers, and graphs, of its own)."""
        key = (self._stream(), width)
        if key not in self._inputs:
            inputs = self._make(width)
            inputs.out, inputs.graph = None, None
            self._inputs[key] = inputs
        return self._inputs[key]

    def run(self, inputs, width: int, bucketed: bool):
        """The pass the buffers hold: replayed where graphs are on and `width` is a bucket,
        else run eagerly; returns its outputs (`inputs.out`)."""
        self.stats.passes[width] = self.stats.passes.get(width, 0) + 1
        if self.graphs and bucketed:
            if inputs.graph is None:
                self._capture(inputs, self._stream())
            inputs.graph.replay()
        else:
            inputs.out = self._compute(inputs)
        return inputs.out

    def _stream(self):
        """The stream passes are queued on now (None off a GPU)."""
        if self.device.type != "cuda":
            return None
        return device_module(self.device).current_stream(self.device)

    def _capture(self, inputs, stream) -> None:
        """Capture the pass the buffers hold as a CUDA graph, after a warm-up run on a stream
        of its own (it writes the cache entries the replay will: the same values)."""
        device = self.device
        torch.cuda.synchronize(device)
        start, used = time.perf_counter(), torch.cuda.memory_allocated(device)
        warm = torch.cuda.Stream(device)
        warm.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(warm):
            self._compute(inputs)
        torch.cuda.current_stream(device).wait_stream(warm)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pools.get(stream)):
            inputs.out = self._compute(inputs)
        self._pools[stream] = graph.pool()
        inputs.graph = graph
        torch.cuda.synchronize(device)
        self.stats.captured += 1
        self.stats.capture_s += time.perf_counter() - start
        self.stats.graph_bytes += torch.cuda.memory_allocated(device) - used
