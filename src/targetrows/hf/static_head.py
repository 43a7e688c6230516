"""Static-shape steps of an EAGLE-3 head (`targetrows.hf.eagle3`), which a CUDA graph can
capture: the head's one layer over a key/value buffer allocated once, its fed entries padded to
a bucket, as the target's static passes are (`targetrows.hf.static_pass`, whose module
docstring says why and how padding stays exact).

A head's lane keeps its cache as keys and values [kv_heads, S, head_dim] (`Eagle3Draft._k`,
`_v`). Here they are views of row r of one buffer per head [lanes, kv_heads, capacity + 1,
head_dim], and a step writes its new entries at S, S + 1, ... of that row: the entries a
batch-1 step appends, at the same indices, so the lane's own code (its tree slots, its mask,
its crops) is unchanged. The layer is the head's own two halves (`Eagle3Head.attention_inputs`
and `layer_output`, which training uses too) around one attention over the buffer, with the
same boolean mask a batch-1 step gives `scaled_dot_product_attention`.

On graphs, a pool level's ranking (the head's norm and vocabulary projection, the NaN flags,
the log-softmax and its sort) is replayed as a graph of its own, as `ranked` runs it on a GPU:
five launches a level (a copy in, the replay, three copies out) where there were sixteen
around a short step (`benchmarks/host_reads.py` counts them).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .graphs import BucketGraphs, GroupPerCount, HostInputs, PaddedSlots, StaticShape


class _Inputs:
    """One width's input buffers (`BucketGraphs`): the step's h and embeddings, positions,
    write slots and mask."""

    def __init__(self, rows: int, width: int, capacity: int, hidden: int, dtype, device):
        self.h = torch.zeros((rows, width, hidden), dtype=dtype, device=device)
        self.embeds = torch.zeros_like(self.h)
        self.host = HostInputs(device, positions=((rows, width), torch.int64),
                               at=((rows, width), torch.int64),
                               allowed=((rows, width, capacity + 1), torch.bool))
        self.positions, self.at, self.allowed = self.host.positions, self.host.at, self.host.allowed
        self.lanes = torch.arange(rows, device=device)


class _RankInputs:
    """One width's input buffer for the head's vocabulary step: g [width, H]."""

    def __init__(self, width: int, hidden: int, dtype, device):
        self.g = torch.zeros((width, hidden), dtype=dtype, device=device)


class StaticHeadSteps:
    """The static-shape step of one head's lanes (a group of `targetrows.core.passes`, as
    `OwnSteps` and `targetrows.hf.lanes.HeadSteps` are): takes each waiting lane's (h, embeds,
    positions, allowed) and gives each its (g, keys, values)."""

    def __init__(self, draft, rows: int, shape: StaticShape):
        head = draft.head
        s = head.shape
        self.head, self.shape, self.name = head, shape, draft.name
        device, dtype = draft.device, draft.dtype
        buffer = (rows, s.num_kv_heads, shape.capacity + 1, s.head_dim)
        self.keys = torch.zeros(buffer, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.graphs = BucketGraphs(
            device, shape.graphs,
            lambda width: _Inputs(rows, width, shape.capacity, s.hidden_size, dtype, device),
            self._compute)
        self.stats = self.graphs.stats
        if shape.graphs:  # a pool level's ranking, replayed as a graph of its own
            self.pool_topk = self._pool_topk
            self._ranking = BucketGraphs(
                device, True, lambda width: _RankInputs(width, s.hidden_size, dtype, device),
                lambda inputs: self._rank(draft, inputs))

    @torch.inference_mode()
    def run_batch(self, items):
        shape, cap = self.shape, self.shape.capacity
        rows = len(self.keys)
        q = [len(h) for _, h, _, _, _ in items]
        width = shape.bucket(max(q))
        past = [lane._k.shape[1] for lane, *_ in items]
        for s, n in zip(past, q, strict=True):
            shape.check_room(self.name, s + n)
        positions = np.zeros((rows, width), dtype=np.int64)
        slots = PaddedSlots(rows, width, cap)
        on_gpu = []  # masks made on the device (a pool grown there): written after the copy
        for (lane, _, _, pos, allowed), s, n in zip(items, past, q, strict=True):
            r = lane._row
            positions[r, :n] = pos
            sees = slots.place(r, n, s)  # new entries at s..s+n-1, as at batch 1
            if isinstance(allowed, np.ndarray):
                sees[:, : s + n] = allowed
            else:
                on_gpu.append((r, n, s, allowed))
        inputs = self.graphs.inputs(width)
        inputs.host.send(positions=positions, at=slots.at, allowed=slots.allowed)
        for r, n, s, allowed in on_gpu:
            inputs.allowed[r, :n, : s + n] = allowed
        for (lane, h, embeds, _, _), n in zip(items, q, strict=True):
            inputs.h[lane._row, :n] = h  # padding rows keep earlier, finite values
            inputs.embeds[lane._row, :n] = embeds
        g = self.graphs.run(inputs, width, width in shape.buckets)
        # g is copied out (the next replay overwrites it); keys and values are views of the
        # lane's row, which only its own steps write to before it reads them again
        return [(g[lane._row, :n].clone(), self.keys[lane._row, :, : s + n],
                 self.values[lane._row, :, : s + n])
                for (lane, *_), s, n in zip(items, past, q, strict=True)]

    def _compute(self, inputs: _Inputs) -> torch.Tensor:
        """g [rows, width, H] of the step the buffers hold: what a graph captures."""
        head, s = self.head, self.head.shape
        q, k, v, residual = head.attention_inputs(inputs.h, inputs.embeds, inputs.positions)
        lanes = inputs.lanes[:, None]
        self.keys[lanes, :, inputs.at] = k.transpose(1, 2)
        self.values[lanes, :, inputs.at] = v.transpose(1, 2)
        out = F.scaled_dot_product_attention(q, self.keys, self.values,
                                             attn_mask=inputs.allowed[:, None],
                                             enable_gqa=s.num_heads != s.num_kv_heads)
        return head.layer_output(residual, out)

    def _pool_topk(self, draft, g: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`Eagle3Draft._pool_topk` on graphs: the head's norm, vocabulary projection, NaN
        flags and ranking of a pool level are one replay, not a launch each; its k best
        are copied out (the next replay of the width overwrites its outputs)."""
        width = len(g)
        bucket = self.shape.bucket(width)
        inputs = self._ranking.inputs(bucket)
        inputs.g[:width] = g  # padding rows keep earlier, finite values
        ids, vals, clean = self._ranking.run(inputs, bucket, bucket in self.shape.buckets)
        draft._check_clean(clean[:width].clone())
        return (draft._target_cols[ids[:width, :k]],
                vals[:width, :k].to(torch.float64, copy=True))

    @staticmethod
    def _rank(draft, inputs: _RankInputs):
        """(draft-vocabulary ids, log-probs, each row's no-NaN flag) of every row of g, best
        first: `ranked` as a GPU runs it, every column kept, so that one graph serves any k."""
        small = draft.head.draft_logits(inputs.g)
        clean = ~torch.isnan(small).any(dim=-1)
        vals, ids = torch.sort(torch.log_softmax(draft._work(small[:, draft._draft_cols]), dim=-1),
                               dim=-1, descending=True, stable=True)
        return ids, vals, clean


def use_static_head(draft, shape: StaticShape) -> None:
    """Make `draft` (an `Eagle3Draft`, not a lane) take static-shape steps (as one lane of its
    own), and its lanes too."""
    if getattr(draft, "_is_lane", False):
        raise ValueError(f"{draft.name}: set up the head, not a lane, for static steps")
    draft.engine.lane_group = GroupPerCount(lambda head, n: StaticHeadSteps(head, n, shape))
    draft._row = 0
    draft._begin(draft.engine, draft.target, StaticHeadSteps(draft, 1, shape))
