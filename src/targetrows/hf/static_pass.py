"""Static-shape passes: every pass of a model's lanes at one of a few fixed shapes, over a KV
cache allocated once, so that on a GPU each shape can be captured once as a CUDA graph and
replayed (`--graphs`).

Why. On a GPU an eager pass of an 8B model costs 9-13x what streaming its weights does: the
time goes to Python and kernel launches, not to the card (benchmarks/results/gpu_20261204.md).
The engines users compare us with (SGLang, vLLM, gpt-fast) capture their passes as CUDA
graphs, which replay a whole pass as one launch. A graph replays fixed kernels on fixed
addresses, so everything a pass reads or writes must have a fixed shape and place:

- **the cache** (`StaticKV`): [lanes, kv_heads, capacity + 1, head_dim] per layer, keys and
  values, all views of one buffer (a commit moves an accepted path in every layer at once),
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
entries the replay writes, so it changes nothing; `targetrows.hf.graphs`); capture time and
memory are kept in `GraphStats`. Elsewhere the same code runs eagerly, which is where the
tests pin it.

An EAGLE-3 head's steps are static the same way (`targetrows.hf.static_head`), and the
target's feature buffer (what the head drafts from) is allocated once at the capacity. The
mask is built by the host and copied in once per pass (a verify pass's tree comes from the
host's planner anyway): boolean fills of [lanes, width, capacity + 1], well under a
millisecond per pass on a CPU core. A level of a pool grown on the device
(`targetrows.hf.device_pool`) brings its tokens and mask rows made there; they are written
into the input buffers by device copies after the host's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .choices import GRAPH_MODES
from .eagle3 import Eagle3Draft
from .graphs import (
    BUCKETS,
    DEFAULT_CAPACITY,
    BucketGraphs,
    CapacityError,
    GroupPerCount,
    HostInputs,
    PaddedSlots,
    StaticShape,
)
from .lanes import BatchedKV, BatchedPasses, LaneCache
from .lean_forward import lean_forward
from .model import HFModel
from .static_head import use_static_head

__all__ = ["DEFAULT_CAPACITY", "GRAPH_MODES", "CapacityError", "StaticShape", "StaticKV",
           "StaticPasses", "apply_graphs", "use_static"]


class StaticKV(BatchedKV):
    """A `BatchedKV` allocated once and zeroed (a masked entry still enters attention's
    products with weight 0): each layer's keys and values [rows, kv_heads, capacity + 1,
    head_dim] are views of one buffer [2, layers, rows, ...] on the model's one device, entry
    `capacity` the scratch entry padding writes to. One buffer, so that a commit moves a
    sequence's accepted path in every layer at once: two launches, where a copy per layer,
    keys and values apart, took 4 x layers (144 for a 36-layer 8B, in every round that
    accepts a path of two nodes or more)."""

    def __init__(self, model, rows: int, capacity: int):
        decoder = model.model.get_decoder()
        super().__init__(len(decoder.layers), rows, capacity)
        config = model.model.config
        kv_heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        attn = decoder.layers[0].self_attn
        shape = (2, len(decoder.layers), rows, kv_heads, capacity + 1, int(attn.head_dim))
        weight = attn.k_proj.weight
        self.entries = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        self.keys, self.values = list(self.entries[0]), list(self.entries[1])

    def _reserve(self, layer: int, like: torch.Tensor, needed: int) -> None:
        raise CapacityError("a static cache does not grow")  # every write checks first

    def keep_entries(self, row: int, index: torch.Tensor, start: int) -> None:
        """`BatchedKV.keep_entries` in every layer at once."""
        entries = self.entries[:, :, row]  # [2, layers, kv_heads, capacity + 1, head_dim]
        index = index.to(entries.device)
        entries[:, :, :, start : start + len(index)] = entries.index_select(3, index)
        self.lengths[row] = start + len(index)


class _Inputs:
    """One width's input buffers (`BucketGraphs`)."""

    def __init__(self, rows: int, width: int, capacity: int, device: torch.device):
        index = ((rows, width), torch.int64)
        # `picked`: each row's queries whose rows the pass hands back (read after the pass)
        self.host = HostInputs(device, ids=index, positions=index, at=index, picked=index,
                               allowed=((rows, width, capacity + 1), torch.bool))
        h = self.host
        self.ids, self.positions, self.at, self.allowed = h.ids, h.positions, h.at, h.allowed
        self.picked = h.picked
        self.lanes = torch.arange(rows, device=device)
        self.keep = torch.arange(width, device=device)


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

    # every pass is [rows, bucket] whoever takes part: splitting a group only adds passes
    pass_cost = None

    def __init__(self, model, kv: StaticKV, shape: StaticShape):
        super().__init__(model, kv)
        self.shape = shape
        rows = len(kv.lengths)
        self.graphs = BucketGraphs(
            model.input_device, shape.graphs,
            lambda width: _Inputs(rows, width, kv.capacity, model.input_device), self._compute)
        self.stats = self.graphs.stats

    @torch.inference_mode()
    def _run(self, items: list[tuple[Any, Any, np.ndarray]]):
        m, kv, shape = self.model, self.kv, self.shape
        rows = len(kv.lengths)
        q = np.array([len(feed.ids) for _, feed, _ in items])
        width = shape.bucket(int(q.max()))
        for _, feed, _ in items:
            shape.check_room(m.name, feed.base + len(feed.ids))
        ids = np.zeros((rows, width), dtype=np.int64)
        positions = np.zeros((rows, width), dtype=np.int64)
        picked = np.zeros((rows, width), dtype=np.int64)
        slots = PaddedSlots(rows, width, kv.capacity)
        on_gpu = []  # feeds made on the device (a pool grown there): written after the copy
        for (lane, feed, region), n in zip(items, q, strict=True):
            r = lane._row
            if isinstance(feed.positions, np.ndarray):  # else a tree chosen on the device
                positions[r, :n] = feed.positions
            picked[r, : len(feed.keep)] = feed.keep
            sees = slots.place(r, n, feed.base)
            sees[:, : feed.start] = True  # the committed prefix
            if isinstance(region, np.ndarray):
                ids[r, :n] = feed.ids
                sees[:, feed.start : feed.base + n] = region
            else:
                on_gpu.append((r, n, feed, region))
        inputs = self.graphs.inputs(width)
        inputs.host.send(ids=ids, positions=positions, at=slots.at, picked=picked,
                         allowed=slots.allowed)
        for r, n, feed, region in on_gpu:
            inputs.ids[r, :n] = feed.ids
            inputs.allowed[r, :n, feed.start : feed.base + n] = region
            if isinstance(feed.positions, torch.Tensor):
                inputs.positions[r, :n] = feed.positions
        logits, capture = self.graphs.run(inputs, width, width in shape.buckets)
        out = []
        for (lane, feed, _), n in zip(items, q, strict=True):
            r = lane._row
            kv.lengths[r] = feed.base + n
            # copies: the next replay of this bucket overwrites the pass's outputs (and the
            # next send `picked`: it is copied in after these are taken, on the same stream)
            layer_inputs = None if not m.feature_layers else {
                layer: x[r : r + 1, :n] for layer, x in capture.items()}
            keep = inputs.picked[r, : len(feed.keep)]
            out.append((logits[r : r + 1].index_select(1, keep), layer_inputs))
        return out

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


def static_passes(model, rows: int, shape: StaticShape) -> StaticPasses:
    """The static passes of `rows` lanes of `model` (an `HFModel` set up by `use_static`)."""
    return StaticPasses(model, StaticKV(model, rows, shape.capacity), shape)


def graphs_supported(model) -> str | None:
    """Why `model` (an `HFModel` or an EAGLE-3 head) cannot run its passes on CUDA graphs, or
    None."""
    if model.device.type != "cuda":
        return f"{model.name} runs on {model.device.type}, and CUDA graphs need a CUDA card"
    if isinstance(model, Eagle3Draft):
        return None  # one layer, on one card
    if not model.engine.one_device:
        return f"{model.name} is spread over several devices"
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
    if not model.engine.one_device:
        raise ValueError(f"{model.name}: static-shape passes need the model on one device, "
                         "and it is spread over several; run it with --graphs off")
    model.engine.lean = lean
    model.engine.static_entries = shape.capacity  # the feature buffer, allocated once too
    model.engine.lane_group = GroupPerCount(lambda lead, n: static_passes(lead, n, shape))
    model._row = 0
    passes = static_passes(model, 1, shape)
    model._begin(model.engine, passes, lambda: LaneCache(passes.kv, 0))


def apply_graphs(models, mode: str, capacity: int = DEFAULT_CAPACITY,
                 widths: tuple[int, ...] = ()) -> list[str]:
    """`--graphs` for `models` (`HFModel`s and EAGLE-3 heads; anything else, such as prompt
    lookup, runs as it does): 'off' leaves them eager; 'auto' sets up graphs for each model
    that supports them; 'on' does, and fails naming the reason for one that does not. `widths`:
    the job's own pass widths (`targetrows.decoding.registry.pass_widths`), buckets besides
    the powers of two, so a pool's level of 10 or a verify pass of 17 is not padded to 16 or
    32. Returns the names of the models now on graphs."""
    if mode not in GRAPH_MODES:
        raise ValueError(f"--graphs {mode!r}: choose one of {', '.join(GRAPH_MODES)}")
    on = []
    shape = StaticShape(capacity=capacity, buckets=tuple(sorted({*BUCKETS, *widths})),
                        graphs=True)
    for model in models:
        if mode == "off" or not isinstance(model, (HFModel, Eagle3Draft)):
            continue
        why = graphs_supported(model)
        if why is not None:
            if mode == "on":
                raise ValueError(f"--graphs on: {why}; use --graphs auto (graphs where they "
                                 "run, eager elsewhere) or off")
            continue
        (use_static_head if isinstance(model, Eagle3Draft) else use_static)(model, shape)
        on.append(model.name)
    return on
