"""CUDA graphs of padded passes (`--graphs`): each (stream, width) captured once and replayed.

Why. On a GPU an eager pass of an 8B model costs 9-13x what streaming its weights does: the
time goes to Python and kernel launches, not to the card (benchmarks/results/gpu_20261204.md).
The engines users compare us with (SGLang, vLLM, gpt-fast) capture their passes as CUDA
graphs, which replay a whole pass as one launch.

A graph replays fixed kernels on fixed addresses, so a pass reads its inputs from buffers made
once per (stream, width) (`BucketGraphs.inputs`), whose host-filled part goes over in one copy
(`HostInputs`), and leaves its outputs where its capture put them: the next replay of that
width overwrites them, so whatever a pass hands over is copied out first (a test replays
passes in place on the CPU to check it). Each (stream, width) is captured on its first use: a
warm-up run, then the capture, both on a capture stream of its own for that stream (cuBLAS
keys its workspace by stream, so graphs that may replay at once, a root pass on its side
stream beside the draft's on the main one, must not share one); the warm-up writes the cache
entries the replay will, with the same values, so it changes nothing. A group's graphs on one
stream share one memory pool; graphs on another stream get a pool of their own, as graphs in
one pool may share their intermediates' memory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .choices import GRAPH_MODES
from .pass_builder import BUCKETS, PassShape
from .streams import device_module


@dataclass
class GraphStats:
    """What a group's passes ran: passes per width, graphs captured, the seconds and device
    bytes their capture took."""

    passes: dict[int, int] = field(default_factory=dict)
    captured: int = 0
    capture_s: float = 0.0
    graph_bytes: int = 0


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
    """Input buffers and CUDA graphs per (stream, width) of one group's padded passes.
    `make_inputs(width)` makes an object with the buffers a pass reads, and the `out` and
    `graph` attributes set here; `compute(inputs)` is the pass, returning its outputs."""

    def __init__(self, device: torch.device, make_inputs, compute):
        self.device = torch.device(device)
        self._make, self._compute = make_inputs, compute
        self.stats = GraphStats()
        self._inputs: dict[tuple[Any, int], Any] = {}
        self._pools: dict[Any, Any] = {}
        self._streams: dict[Any, Any] = {}  # a capture stream for each stream passes run on

    def inputs(self, width: int):
        """The buffers of this width on the current stream (a root pass beside drafting runs
        on its own stream, so it has buffers, and graphs, of its own)."""
        key = (self._stream(), width)
        if key not in self._inputs:
            inputs = self._make(width)
            inputs.out, inputs.graph = None, None
            self._inputs[key] = inputs
        return self._inputs[key]

    def run(self, inputs, width: int):
        """The pass the buffers hold, replayed (captured first on the width's first use);
        returns its outputs (`inputs.out`)."""
        self.stats.passes[width] = self.stats.passes.get(width, 0) + 1
        if inputs.graph is None:
            self._capture(inputs, self._stream())
        inputs.graph.replay()
        return inputs.out

    def _stream(self):
        """The stream passes are queued on now (None off a GPU)."""
        if self.device.type != "cuda":
            return None
        return device_module(self.device).current_stream(self.device)

    def _capture(self, inputs, stream) -> None:
        """Capture the pass the buffers hold as a CUDA graph, after a warm-up run, both on the
        capture stream of `stream` (the warm-up writes the cache entries the replay will: the
        same values)."""
        device = self.device
        torch.cuda.synchronize(device)
        start, used = time.perf_counter(), torch.cuda.memory_allocated(device)
        if stream not in self._streams:
            self._streams[stream] = torch.cuda.Stream(device)
        capture = self._streams[stream]
        capture.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(capture):
            self._compute(inputs)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pools.get(stream), stream=capture):
            inputs.out = self._compute(inputs)
        torch.cuda.current_stream(device).wait_stream(capture)
        self._pools[stream] = graph.pool()
        inputs.graph = graph
        torch.cuda.synchronize(device)
        self.stats.captured += 1
        self.stats.capture_s += time.perf_counter() - start
        self.stats.graph_bytes += torch.cuda.memory_allocated(device) - used


def pass_shape(mode: str, capacity: int | None = None,
               widths: tuple[int, ...] = ()) -> PassShape:
    """The passes `--graphs` asks for: padded, over the whole cache, replayed as graphs; else
    eager passes over the live entries. `widths`: the job's own pass widths
    (`targetrows.decoding.registry.pass_widths`), buckets besides the powers of two, so a
    pool's level of 10 or a verify pass of 17 is not padded to 16 or 32."""
    if mode not in GRAPH_MODES:
        raise ValueError(f"--graphs {mode!r}: choose one of {', '.join(GRAPH_MODES)}")
    buckets = tuple(sorted({*BUCKETS, *widths}))
    on = mode != "off"
    return PassShape(capacity=capacity, buckets=buckets, pad=on, full_span=on, graphs=on)


def apply_graphs(models, mode: str, capacity: int | None = None,
                 widths: tuple[int, ...] = ()) -> list[str]:
    """`--graphs` and `--max-context` for `models` (`HFModel`s and EAGLE-3 heads; anything
    else, such as prompt lookup, runs as it does): 'off' keeps them eager; 'auto' replays
    graphs for each model that can, 'on' does, and fails naming the reason for one that
    cannot. Each holds at most `capacity` entries a sequence (None: each model's default).
    Returns the names of the models on graphs."""
    on = []
    graphed, eager = pass_shape(mode, capacity, widths), pass_shape("off", capacity, widths)
    for model in models:
        if not hasattr(model, "set_pass_shape"):
            continue
        why = model.graphs_unsupported() if mode != "off" else "off"
        if why is not None and mode == "on":
            raise ValueError(f"--graphs on: {why}; use --graphs auto (graphs where they run, "
                             "eager elsewhere) or off")
        model.set_pass_shape(eager if why is not None else graphed)
        if why is None:
            on.append(model.name)
    return on
