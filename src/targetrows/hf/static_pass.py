"""Static-shape passes: every pass of a model's lanes at one of a few fixed shapes, over a KV
cache allocated once, so that on a GPU each shape can be captured once as a CUDA graph and
replayed (`--graphs`).

Why. On a GPU an eager pass of an 8B model costs 9-13x what streaming its weights does: the
time goes to Python and kernel launches, not to the card (benchmarks/results/gpu_20261204.md).
The engines users compare us with (SGLang, vLLM, gpt-fast) capture their passes as CUDA
graphs, which replay a whole pass as one launch. A graph replays fixed kernels on fixed
addresses, so everything a pass reads or writes must have a fixed shape and place:

- **the cache** (`StaticKV`): one buffer per layer [lanes, kv_heads, capacity + 1, head_dim],
  allocated when the model is set up, never grown. Entry `capacity` is a scratch entry that
  padding writes to and nothing real reads. A context past the capacity is an error that names
  the limit and the setting that raises it, never a silent reallocation;
- **the inputs** (ids, positions, cache write slots, the mask) are copied into buffers made
  once per shape, and the pass reads them there;
- **the shape**: every lane of the buffer takes part in every pass (a lane that asked for none
  gets padding queries), each with a number of fed tokens padded up to a **bucket** (1, 2, 4,
  ..., 128). A padding query is written to the scratch entry and sees only it, and a real
  query never sees the scratch entry, so each real query's row, KV entries and features equal
  those of the unpadded pass (attention adds only exact zeros for the masked entries; the
  tests check float64 and float32). Attention reads the whole capacity under the mask, as
  gpt-fast's does: at the default 4096 entries an 8B model's cache read is a few percent of its
  weights'. A pass wider than the largest bucket (a long prompt's prefill) runs at its own
  width, eagerly.

The pass is the lean forward (`targetrows.hf.lean_forward`), run on any device here, so only
Llama, Qwen2 and Qwen3 targets and drafts have it. On a CUDA card each (stream, bucket) is
captured on its first use (a warm-up run, then the capture; the warm-up writes the same cache
entries the replay writes, so it changes nothing) into one memory pool shared by the model's
graphs on that stream; capture time and memory are kept in `GraphStats`. Elsewhere the same code runs
eagerly, which is where the tests pin it.

What is not static yet: the EAGLE-3 head's steps (`targetrows.hf.lanes.HeadSteps`), the
target's feature buffer, and the mask, which the host builds and copies in once per pass (the
tree's ancestor matrix comes from the host's planner anyway).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .lanes import BatchedKV, BatchedPasses, LaneCache
from .lean_forward import lean_forward
from .streams import device_module
from .torch_rows import host_to_device

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
DEFAULT_CAPACITY = 4096  # entries per sequence: prompt, answer and one round's tree
GRAPH_MODES = ("auto", "on", "off")


class CapacityError(ValueError):
    """A pass would write past the static cache's capacity."""


@dataclass(frozen=True)
class StaticShape:
    """How a model's static passes are shaped: entries each sequence may hold, the buckets fed
    tokens are padded to, and whether each bucket is replayed as a CUDA graph."""

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


@dataclass
class GraphStats:
    """What a model's static passes ran: passes per bucket, graphs captured, the seconds and
    device bytes their capture took."""

    passes: dict[int, int] = field(default_factory=dict)
    captured: int = 0
    capture_s: float = 0.0
    graph_bytes: int = 0


class StaticKV(BatchedKV):
    """A `BatchedKV` allocated once: per layer [rows, kv_heads, capacity + 1, head_dim] on the
    layer's device, zeroed (a masked entry still enters attention's products with weight 0),
    entry `capacity` the scratch entry padding writes to."""

    def __init__(self, model, rows: int, capacity: int):
        decoder = model.model.get_decoder()
        super().__init__(len(decoder.layers), rows, capacity)
        config = model.model.config
        kv_heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        for i, layer in enumerate(decoder.layers):
            attn = layer.self_attn
            weight = attn.k_proj.weight
            shape = (rows, kv_heads, capacity + 1, int(attn.head_dim))
            self.keys[i] = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
            self.values[i] = torch.zeros_like(self.keys[i])

    def _reserve(self, layer: int, like: torch.Tensor, needed: int) -> None:
        raise CapacityError("a static cache does not grow")  # every write checks first


class _Inputs:
    """One shape's input buffers, its outputs (a graph's, or the last eager pass's), its graph."""

    def __init__(self, rows: int, width: int, capacity: int, device: torch.device):
        def new(*shape, dtype=torch.int64):
            return torch.zeros(shape, dtype=dtype, device=device)

        self.ids, self.positions, self.at = new(rows, width), new(rows, width), new(rows, width)
        self.allowed = new(rows, width, capacity + 1, dtype=torch.bool)
        self.lanes = torch.arange(rows, device=device)
        self.keep = torch.arange(width, device=device)
        self.logits: torch.Tensor | None = None
        self.capture: dict[int, torch.Tensor] | None = None
        self.graph = None


class _StaticCache:
    """The cache the lean forward reads and writes in a static pass: each layer writes the
    pass's keys and values at the input buffer's slots and reads the whole layer buffer."""

    def __init__(self, kv: StaticKV, inputs: _Inputs):
        self.layers = [_StaticLayer(kv, i, inputs) for i in range(len(kv.keys))]

    def get_seq_length(self) -> int:
        return 0  # the lean forward reads it only for a pass without a mask; ours have one


class _StaticLayer:
    def __init__(self, kv: StaticKV, layer: int, inputs: _Inputs):
        self._kv, self._layer, self._in = kv, layer, inputs

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys, values = self._kv.keys[self._layer], self._kv.values[self._layer]
        lanes, at = self._in.lanes[:, None], self._in.at
        keys[lanes, :, at] = key_states.transpose(1, 2)
        values[lanes, :, at] = value_states.transpose(1, 2)
        return keys, values


class StaticPasses(BatchedPasses):
    """The static-shape pass of one model's lanes (a group of `targetrows.core.passes`, like
    `BatchedPasses`, whose lanes and results it shares): see the module docstring."""

    def __init__(self, model, kv: StaticKV, shape: StaticShape):
        super().__init__(model, kv)
        self.shape = shape
        self.stats = GraphStats()
        self._inputs: dict[tuple[Any, int], _Inputs] = {}
        # the graphs' memory pool, one per stream: graphs in one pool may share the memory of
        # their intermediates, so two that can run at once (a root pass beside the main
        # stream's) must not
        self._pools: dict[Any, Any] = {}

    @torch.inference_mode()
    def _run(self, items: list[tuple[Any, Any, np.ndarray]]):
        m, kv, shape = self.model, self.kv, self.shape
        cap = kv.capacity
        rows = len(kv.lengths)
        q = np.array([len(feed.ids) for _, feed, _ in items])
        width = shape.bucket(int(q.max()))
        for _, feed, _ in items:
            if feed.base + len(feed.ids) > cap:
                raise CapacityError(
                    f"{m.name}: a pass would hold {feed.base + len(feed.ids)} entries, past the "
                    f"static cache's {cap} (its prompt, answer so far and tree); raise "
                    "--max-context (config: decode.max_context), or run with --graphs off")
        ids = np.zeros((rows, width), dtype=np.int64)
        positions = np.zeros((rows, width), dtype=np.int64)
        at = np.full((rows, width), cap, dtype=np.int64)  # padding: the scratch entry
        allowed = np.zeros((rows, width, cap + 1), dtype=bool)
        allowed[:, :, cap] = True  # a padding query sees the scratch entry only
        for (lane, feed, region), n in zip(items, q, strict=True):
            r = lane._row
            ids[r, :n], positions[r, :n] = feed.ids, feed.positions
            at[r, :n] = feed.base + np.arange(n)
            allowed[r, :n, cap] = False
            allowed[r, :n, : feed.start] = True  # the committed prefix
            allowed[r, :n, feed.start : feed.base + n] = region
        inputs = self._inputs_for(width)
        device = inputs.ids.device
        for buffer, host in ((inputs.ids, ids), (inputs.positions, positions), (inputs.at, at),
                             (inputs.allowed, allowed)):  # without waiting (pinned memory)
            buffer.copy_(host_to_device(host, device))
        self.stats.passes[width] = self.stats.passes.get(width, 0) + 1
        if shape.graphs and width in shape.buckets:
            if inputs.graph is None:
                self._capture(inputs, self._stream())
            inputs.graph.replay()
        else:
            inputs.logits, inputs.capture = self._compute(inputs)
        for (lane, feed, _), n in zip(items, q, strict=True):
            kv.lengths[lane._row] = feed.base + n
        out = []
        for lane, feed, _ in items:
            r = lane._row
            picked = host_to_device(feed.keep, inputs.logits.device)
            layer_inputs = None if not m.feature_layers else {
                layer: x[r : r + 1, : len(feed.ids)] for layer, x in inputs.capture.items()}
            out.append((inputs.logits[r : r + 1].index_select(1, picked), layer_inputs))
        return out

    def _inputs_for(self, width: int) -> _Inputs:
        """The input buffers of this width on the current stream (a root pass beside drafting
        runs on its own stream, so it has buffers, and graphs, of its own)."""
        key = (self._stream(), width)
        if key not in self._inputs:
            self._inputs[key] = _Inputs(len(self.kv.lengths), width, self.kv.capacity,
                                        self.model.input_device)
        return self._inputs[key]

    def _stream(self):
        """The stream passes are queued on now (None off a GPU)."""
        device = self.model.input_device
        return device_module(device).current_stream(device) if device.type == "cuda" else None

    def _compute(self, inputs: _Inputs):
        """(logits [rows, width, V], each layer's input [rows, width, H]) of the pass the
        buffers hold: what a graph captures."""
        m = self.model
        mask = torch.zeros(inputs.allowed.shape, dtype=m.dtype, device=inputs.allowed.device)
        mask.masked_fill_(~inputs.allowed, torch.finfo(m.dtype).min)
        capture = {} if m.feature_layers else None
        logits = m.engine.lean(inputs.ids, inputs.positions, mask[:, None],
                               _StaticCache(self.kv, inputs), inputs.keep, capture)
        return logits, capture

    def _capture(self, inputs: _Inputs, stream) -> None:
        """Capture the pass the buffers hold as a CUDA graph, after a warm-up run on a stream
        of its own (it writes the cache entries the replay will: the same values)."""
        device = self.model.input_device
        torch.cuda.synchronize(device)
        start, used = time.perf_counter(), torch.cuda.memory_allocated(device)
        warm = torch.cuda.Stream(device)
        warm.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(warm):
            self._compute(inputs)
        torch.cuda.current_stream(device).wait_stream(warm)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pools.get(stream)):
            inputs.logits, inputs.capture = self._compute(inputs)
        self._pools[stream] = graph.pool()
        inputs.graph = graph
        torch.cuda.synchronize(device)
        self.stats.captured += 1
        self.stats.capture_s += time.perf_counter() - start
        self.stats.graph_bytes += torch.cuda.memory_allocated(device) - used


def static_passes(model, rows: int, shape: StaticShape) -> StaticPasses:
    """The static passes of `rows` lanes of `model` (an `HFModel` set up by `use_static`)."""
    return StaticPasses(model, StaticKV(model, rows, shape.capacity), shape)


def graphs_supported(model) -> str | None:
    """Why `model` (an `HFModel`) cannot run static-shape passes on a CUDA graph, or None."""
    if not model.engine.one_device:
        return f"{model.name} is spread over several devices"
    if model.input_device.type != "cuda":
        return f"{model.name} runs on {model.input_device.type}, and CUDA graphs need a CUDA card"
    if lean_forward(model.model, anywhere=True) is None:
        arch = getattr(model.model.config, "model_type", "?")
        return f"{model.name} is a {arch!r} model; static passes cover Llama, Qwen2 and Qwen3"
    return None


def use_static(model, shape: StaticShape) -> None:
    """Make `model` (an `HFModel`, not a lane) run static-shape passes (as one lane of its
    own), and its lanes too. On a device without CUDA graphs give ``graphs=False``."""
    lean = model.engine.lean or lean_forward(model.model, anywhere=True)
    if lean is None:
        arch = getattr(model.model.config, "model_type", "?")
        raise ValueError(f"{model.name}: static-shape passes cover Llama, Qwen2 and Qwen3 models "
                         f"with sdpa attention, not {arch!r}; run it with --graphs off")
    if getattr(model, "_is_lane", False):
        raise ValueError(f"{model.name}: set up the model, not a lane, for static passes")
    model.engine.lean = lean
    model.engine.static = shape
    model._row = 0
    passes = static_passes(model, 1, shape)
    model._begin(model.engine, passes, lambda: LaneCache(passes.kv, 0))


def apply_graphs(models, mode: str, capacity: int = DEFAULT_CAPACITY) -> list[str]:
    """`--graphs` for `models` (`HFModel`s; anything else, such as an EAGLE-3 head, runs as it
    does): 'off' leaves them eager; 'auto' sets up graphs for each model that supports them;
    'on' does and fails, naming the reason, for one that does not. Returns the names of the
    models now on graphs."""
    from .model import HFModel

    if mode not in GRAPH_MODES:
        raise ValueError(f"--graphs {mode!r}: choose one of {', '.join(GRAPH_MODES)}")
    on = []
    for model in models:
        if mode == "off" or not isinstance(model, HFModel):
            continue
        why = graphs_supported(model)
        if why is not None:
            if mode == "on":
                raise ValueError(f"--graphs on: {why}; use --graphs auto (graphs where they "
                                 "run, eager elsewhere) or off")
            continue
        use_static(model, StaticShape(capacity=capacity, graphs=True))
        on.append(model.name)
    return on
