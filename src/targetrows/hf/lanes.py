"""Lanes of an `HFModel` for batched decoding: per-sequence caches in one batched buffer, and
one forward pass for every lane that is waiting on one.

A **lane** is an `HFModel` on the model's engine (`HFModel.engine`: weights, forward, hooks,
devices, side stream), for one sequence of a batch (`targetrows.decoding.batch`): its
committed prefix, its tree, its features, its generator and its checks are its own, and
everything `HFModel` does with them (what a pass feeds, the tree mask, the commit of an
accepted path) is the same code. Two things differ, both given when it is made (`hf_lanes`):

- its KV entries are row `r` of a `BatchedKV`, one buffer per layer [lanes, heads, capacity,
  head_dim] shared by the lanes, where row r holds exactly what a batch-1 cache would hold
  (the committed prefix, then the fed tree nodes);
- its passes are asked of `BatchedPasses` (`targetrows.core.passes`), which the scheduler
  runs for every waiting lane as one batched pass (`targetrows.decoding.batch`).

One batched pass: the lanes' fed tokens are padded to the longest [n, Q], each at its own
positions; lane i's new entries are written at its own length b_i onwards (its padding after
them, never seen, overwritten by its next pass); the 4D additive mask gives each lane's
queries its committed prefix and `HFModel._region` (its tail and tree ancestors) and hides
every other entry of the row. So each lane's rows, KV entries and features are those of its
own batch-1 pass, up to the rounding of a batched product (the tests check them in float64).
The pass runs through the lean forward where the model has one, else Hugging Face's forward.
A group whose feeds differ much in width (a prompt's prefill beside one-token steps) runs as
the passes that feed the fewest padded tokens plus a fixed cost each (`split_by_width`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicLayer

from .cache import cache_kwargs
from .streams import SideStream
from .torch_rows import host_to_device


class BatchedKV:
    """Keys and values of many sequences, one buffer per layer [rows, heads, capacity, dim];
    row r holds entries 0..lengths[r]-1 of sequence r. Buffers are made at the first pass
    (each layer on its own device) and double when a pass needs more room. They start zeroed:
    a masked entry still enters attention's products with weight 0, and 0 times an
    uninitialised NaN would be NaN."""

    def __init__(self, n_layers: int, rows: int, capacity: int = 256):
        self.lengths = np.zeros(rows, dtype=np.int64)
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers
        self.capacity = capacity

    def _reserve(self, layer: int, like: torch.Tensor, needed: int) -> None:
        k = self.keys[layer]
        if k is None:
            shape = (len(self.lengths), like.shape[1], max(self.capacity, needed), like.shape[3])
            self.keys[layer], self.values[layer] = like.new_zeros(shape), like.new_zeros(shape)
        elif k.shape[2] < needed:
            for buffers in (self.keys, self.values):
                old = buffers[layer]
                new = old.new_zeros((*old.shape[:2], max(needed, 2 * old.shape[2]), old.shape[3]))
                new[:, :, : old.shape[2]] = old
                buffers[layer] = new

    def write(self, layer: int, rows: torch.Tensor, at: torch.Tensor, first: int | None,
              width: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [n, heads, Q, dim] of rows `rows` [n] at entries `at` [n, Q] (both on the
        layer's device); return the keys and values attention reads, the first `width` entries
        of those rows: a view when the rows are `first`, `first` + 1, ..., else a copy."""
        self._reserve(layer, k, width)
        keys, values = self.keys[layer], self.values[layer]
        keys[rows[:, None], :, at] = k.transpose(1, 2)
        values[rows[:, None], :, at] = v.transpose(1, 2)
        if first is not None:
            n = len(rows)
            return keys[first : first + n, :, :width], values[first : first + n, :, :width]
        return keys[rows, :, :width], values[rows, :, :width]

    def keep_entries(self, row: int, index: torch.Tensor, start: int) -> None:
        """`GrowingLayer.keep_entries` for one row: entries `index` move to start, start+1, ...
        in every layer, and the row ends after them."""
        for buffers in (self.keys, self.values):
            for buf in buffers:
                if buf is not None:
                    idx = index.to(buf.device)
                    buf[row, :, start : start + len(idx)] = buf[row].index_select(1, idx)
        self.lengths[row] = start + len(index)


class _LaneLayer:
    """One layer of a lane's cache, as `HFModel._commit` uses it."""

    def __init__(self, kv: BatchedKV, layer: int, row: int):
        self._kv, self._layer, self._row = kv, layer, row

    @property
    def keys(self) -> torch.Tensor:
        buf = self._kv.keys[self._layer]
        return buf[self._row : self._row + 1, :, : self._kv.lengths[self._row]]

    @property
    def values(self) -> torch.Tensor:
        buf = self._kv.values[self._layer]
        return buf[self._row : self._row + 1, :, : self._kv.lengths[self._row]]

    def keep_entries(self, index: torch.Tensor, start: int) -> None:
        if self._layer == 0:  # one call moves the row in every layer
            self._kv.keep_entries(self._row, index, start)


class LaneCache:
    """A lane's view of its row of a `BatchedKV`: what `HFModel` asks of its cache."""

    def __init__(self, kv: BatchedKV, row: int):
        self._kv, self._row = kv, row
        kv.lengths[row] = 0
        self.layers = [_LaneLayer(kv, i, row) for i in range(len(kv.keys))]

    def get_seq_length(self) -> int:
        return int(self._kv.lengths[self._row])

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop({tokens_to_remove}): pass a negative count of entries to drop")
        length = self._kv.lengths
        length[self._row] = max(0, length[self._row] + tokens_to_remove)


class _PassLayer(DynamicLayer):
    """What a batched pass's attention layer reads and writes: the lanes' rows of a `BatchedKV`
    layer (Hugging Face's forward calls `update` once per layer with the pass's new keys).
    `placed` holds the rows and entry indices on each device that a layer sits on, copied
    there once per pass."""

    def __init__(self, kv: BatchedKV, layer: int, rows: np.ndarray, at: np.ndarray,
                 first: int | None, width: int, past: int, placed: dict):
        super().__init__()
        self._kv, self._layer, self._rows, self._at = kv, layer, rows, at
        self._first, self._width, self._past, self._placed = first, width, past, placed
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        device = key_states.device
        if device not in self._placed:
            self._placed[device] = (host_to_device(self._rows, device),
                                    host_to_device(self._at, device))
        rows, at = self._placed[device]
        return self._kv.write(self._layer, rows, at, self._first, self._width, key_states,
                              value_states)

    def get_seq_length(self) -> int:
        return self._past


# what a pass costs beyond the tokens it feeds, in fed tokens: on the embedded target on a
# 2-core CPU a one-token step costs about what 50 more tokens of a prefill do (24 ms against
# 0.5 ms a token). A GPU's eager pass is launch-bound, its fixed cost larger: there this splits
# more often than it should (static passes, `targetrows.hf.static_pass`, never split)
PASS_COST = 64


def split_by_width(widths: list[int], pass_cost: int) -> list[list[int]]:
    """The items (by index) grouped into passes so that the padded tokens plus `pass_cost` per
    pass are fewest: a pass of lanes fed w_1 >= w_2 >= ... tokens feeds n x w_1. Groups are
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
        parts.append(order[cut[j] : j])
        j = cut[j]
    return parts[::-1]


class BatchedPasses:
    """The batched pass of one model's lanes (a group of `targetrows.core.passes`): `run_batch`
    takes each waiting lane's feed, and gives each its (logits, layer inputs)."""

    def __init__(self, model, kv: BatchedKV):
        self.model, self.kv = model, kv

    def side_stream(self) -> SideStream | None:
        """The stream a root pass of the lanes runs on beside drafting: the model's own."""
        return self.model.side_stream()

    # a pass's cost beside the tokens it feeds, in fed tokens: where padding every lane to the
    # longest feed would cost more, the lanes run as several passes (`split_by_width`)
    pass_cost: int | None = PASS_COST

    def run_batch(self, items: list[tuple[Any, Any]]):
        answers = [None] * len(items)
        widths = [len(feed.ids) for _, feed in items]
        parts = ([list(range(len(items)))] if self.pass_cost is None
                 else split_by_width(widths, self.pass_cost))
        for part in parts:
            # lanes in row order: adjacent rows are read as a view of the buffer, not gathered;
            # what each lane's queries may see is read from its state now, as it asked
            order = sorted(part, key=lambda i: items[i][0]._row)
            out = self._run([(*items[i], items[i][0]._region(items[i][1])) for i in order])
            for at, i in enumerate(order):
                answers[i] = out[at]
        return answers

    @torch.inference_mode()
    def _run(self, items: list[tuple[Any, Any, np.ndarray]]):
        m = self.model
        n = len(items)
        q = np.array([len(feed.ids) for _, feed, _ in items])
        base = np.array([feed.base for _, feed, _ in items])
        width_q = int(q.max())
        width = int(base.max()) + width_q  # every lane's entries, its new ones included
        ids = np.zeros((n, width_q), dtype=np.int64)
        positions = np.zeros((n, width_q), dtype=np.int64)
        allowed = np.zeros((n, width_q, width), dtype=bool)
        allowed[:, :, 0] = True  # a padding query sees one entry (its row is never read)
        on_gpu = []  # feeds made on the device (a pool grown there): written after the copy
        for i, (_, feed, region) in enumerate(items):
            if isinstance(feed.positions, np.ndarray):  # else a tree chosen on the device
                positions[i, : q[i]] = feed.positions
            allowed[i, : q[i], : feed.start] = True  # the committed prefix
            if isinstance(region, np.ndarray):
                ids[i, : q[i]] = feed.ids
                allowed[i, : q[i], feed.start : base[i] + q[i]] = region
            else:
                on_gpu.append(i)
        at = base[:, None] + np.arange(width_q)[None]
        keep = np.unique(np.concatenate([feed.keep for _, feed, _ in items]))
        rows = np.array([lane._row for lane, _, _ in items], dtype=np.int64)
        mask = torch.zeros((n, 1, width_q, width), dtype=m.dtype, device=m.input_device)
        mask.masked_fill_(host_to_device(~allowed, m.input_device)[:, None],
                          torch.finfo(m.dtype).min)
        adjacent = np.array_equal(rows, np.arange(rows[0], rows[0] + n))  # sorted: run_batch
        first = int(rows[0]) if adjacent else None
        placed: dict = {}
        cache = Cache(layers=[_PassLayer(self.kv, i, rows, at, first, width, width - width_q,
                                         placed) for i in range(len(self.kv.keys))])
        ids_t = host_to_device(ids, m.input_device)
        for i in on_gpu:
            _, feed, region = items[i]
            ids_t[i, : q[i]] = feed.ids
            mask[i, 0, : q[i], feed.start : base[i] + q[i]].masked_fill_(region, 0.0)
        pos_t = host_to_device(positions, m.input_device)
        for i in on_gpu:
            feed = items[i][1]
            if isinstance(feed.positions, torch.Tensor):
                pos_t[i, : q[i]] = feed.positions
        engine = m.engine
        keep_t = host_to_device(keep, engine.keep_device)
        capture = {} if m.feature_layers else None
        engine.capture = capture
        try:
            if engine.lean is not None:
                logits = engine.lean(ids_t, pos_t, mask, cache, keep_t, capture)
            else:
                logits = m.model(input_ids=ids_t, position_ids=pos_t, attention_mask=mask,
                                 use_cache=True, **cache_kwargs(m.model, cache),
                                 logits_to_keep=keep_t).logits
        finally:
            engine.capture = None
        self.kv.lengths[rows] = base + q
        out = []
        for i, (_, feed, _) in enumerate(items):
            picked = host_to_device(np.searchsorted(keep, feed.keep), logits.device)
            layer_inputs = None if capture is None else {
                layer: x[i : i + 1, : q[i]] for layer, x in capture.items()}
            out.append((logits[i : i + 1].index_select(1, picked), layer_inputs))
        return out


def hf_lanes(model, n: int) -> list:
    """`n` lanes of `model` (an `HFModel`): models on its engine (weights, forward, hooks,
    devices), each a sequence of its own whose KV entries are its row of one `BatchedKV` and
    whose passes run as one `BatchedPasses`."""
    if getattr(model, "_is_lane", False):
        raise ValueError(f"{model.name}: a lane is one sequence of a batch; make lanes of the "
                         "model")
    if model.engine.lane_group is not None:  # the model's own kind of passes, over n rows
        passes = model.engine.lane_group(model, n)
    else:
        passes = BatchedPasses(model, BatchedKV(len(model.model.get_decoder().layers), n))
    lanes = []
    for row in range(n):
        lane = object.__new__(type(model))
        lane._row, lane._is_lane = row, True
        lane._begin(model.engine, passes, lambda row=row: LaneCache(passes.kv, row))
        lanes.append(lane)
    return _claim(passes, lanes, ("_passes", "_cache", "_new_cache"))


class _Replaced:
    """What a lane holds once a later `lanes(n)` call has handed its rows to new lanes: any use
    is an error, never a write over a new lane's row."""

    def __init__(self, name: str):
        self._why = (f"{name}: these lanes' rows were handed to the lanes of a later lanes() "
                     "call (a static group is kept per lane count); use those")

    def __getattr__(self, attr):
        raise RuntimeError(self._why)

    def __call__(self, *args, **kwargs):
        raise RuntimeError(self._why)


def _claim(group, lanes: list, state: tuple[str, ...]) -> list:
    """Make `lanes` the ones that use `group`'s rows: a group that is reused (static passes
    keep theirs, with their captured graphs, per lane count) retires the lanes it had, whose
    `state` (what reaches the rows) becomes `_Replaced`. Returns `lanes`."""
    for lane in getattr(group, "lanes_now", ()):
        for attr in state:
            setattr(lane, attr, _Replaced(lane.name))
    group.lanes_now = lanes
    return lanes


# -- EAGLE-3 heads -------------------------------------------------------------------------------


class HeadSteps:
    """The batched step of one head's lanes (a group of `targetrows.core.passes`). A head has
    one layer, so the lanes keep their own keys and values (as a batch-1 head does) and a
    batched step pads them to the longest [n, kv_heads, S, dim]; lane i's new entries go after
    the padding at S and its mask maps them back, so its step sees exactly its own entries."""

    def __init__(self, draft):
        self.head = draft.head

    @torch.inference_mode()
    def run_batch(self, items):
        n = len(items)
        q = [len(h) for _, h, _, _, _ in items]
        past = [lane._k.shape[1] for lane, *_ in items]
        width_q, width = max(q), max(past)
        first = items[0][0]
        kv = first._k
        past_k = kv.new_zeros((n, kv.shape[0], width, kv.shape[2]))
        past_v = torch.zeros_like(past_k)
        h = items[0][1].new_zeros((n, width_q, items[0][1].shape[1]))
        embeds = torch.zeros_like(h)
        positions = np.zeros((n, width_q), dtype=np.int64)
        allowed = np.zeros((n, 1, width_q, width + width_q), dtype=bool)
        allowed[:, 0, np.arange(width_q), width + np.arange(width_q)] = True  # padding: itself
        on_gpu = []  # masks made on the device (a pool grown there): written after the copy
        for i, (lane, h_i, e_i, pos_i, a_i) in enumerate(items):
            past_k[i, :, : past[i]], past_v[i, :, : past[i]] = lane._k, lane._v
            h[i, : q[i]], embeds[i, : q[i]] = h_i, e_i
            positions[i, : q[i]] = pos_i
            if isinstance(a_i, np.ndarray):
                _place_mask(allowed, i, q[i], past[i], width, a_i)
            else:
                on_gpu.append(i)
        device = first.device
        mask = host_to_device(allowed, device)
        for i in on_gpu:
            _place_mask(mask, i, q[i], past[i], width, items[i][4])
        g, keys, values = self.head.step_batch(h, embeds, host_to_device(positions, device),
                                               past_k, past_v, mask)
        return [(g[i, : q[i]],
                 torch.cat([lane._k, keys[i, :, width : width + q[i]]], dim=1),
                 torch.cat([lane._v, values[i, :, width : width + q[i]]], dim=1))
                for i, (lane, *_) in enumerate(items)]


def _place_mask(mask, i: int, q: int, past: int, width: int, seen) -> None:
    """Lane i's rows of a batched step's mask: what its q queries see of its `past` entries,
    then of its new ones, which sit after the padding, at `width`."""
    mask[i, 0, :q, :past] = seen[:, :past]
    mask[i, 0, :q, width : width + q] = seen[:, past:]


def head_lanes(draft, n: int, target_lanes) -> list:
    """`n` lanes of an EAGLE-3 head (`Eagle3Draft`): heads on its engine (weights, settings,
    vocabulary map), lane i reading the features of `target_lanes[i]`, their steps run as one
    `HeadSteps`."""
    if getattr(draft, "_is_lane", False):
        raise ValueError(f"{draft.name}: a lane is one sequence of a batch; make lanes of the "
                         "head")
    if target_lanes is None or len(target_lanes) != n:
        raise ValueError(f"{draft.name}: an EAGLE-3 head's lanes read their target lanes' "
                         f"features: give {n} target lanes")
    if draft.engine.lane_group is not None:  # the head's own kind of steps, over n rows
        steps = draft.engine.lane_group(draft, n)
    else:
        steps = HeadSteps(draft)
    lanes = []
    for row, target in enumerate(target_lanes):
        lane = object.__new__(type(draft))
        lane._row, lane._is_lane = row, True
        lane._begin(draft.engine, target, steps)
        lanes.append(lane)
    return _claim(steps, lanes, ("_steps",))
